//! A container lease's watchdog: the deadline that outlives its supervisor.
//!
//! A supervisor's own timers end a run at its deadline, and `cordon-reap` ends the run of a
//! supervisor that is gone — but only if someone runs it. So every container lease gets, before
//! its record is published, a watchdog: the supervisor's own binary started again with
//! [`WATCHDOG_ARG`] (`/proc/self/exe` in production, so the very code that wrote the record),
//! in a process group of its own (a terminal's Ctrl-C does not reach it) and deaf to SIGINT,
//! SIGTERM and SIGHUP. It holds the read end of a pipe whose write end only the supervisor
//! holds, and a timer on `CLOCK_BOOTTIME` set to the lease's deadline plus
//! [`EXPIRY_GRACE`](super::EXPIRY_GRACE) (a clock NTP steps cannot move, and that counts a
//! suspend). It reports itself armed with one byte, and then:
//!
//! - **the pipe ends** — the supervisor exited, however (a SIGKILL included): if the lease's
//!   record is still there the lease was never released, so it marks the run directory
//!   ([`ENDED_BY_REAP`](super::ENDED_BY_REAP)) and runs the runtime's `kill --all` of the
//!   container at once, then exits. The rest of the lease (mounts, account, run directory,
//!   record) holds no process and is released by the next recovery (`cordon-reap`, or the next
//!   stage on the executor).
//! - **the timer fires** while the supervisor lives (hung, or stopped): the same mark and kill,
//!   once; the supervisor then sees its run end from outside and releases it (a no-decision),
//!   and the watchdog goes on waiting for the pipe to end.
//!
//! A released lease's record is gone by the time the supervisor closes the pipe, so the
//! watchdog exits 0 and the supervisor reaps it; a watchdog that does not start, or ends any
//! other way, is the lease's residue — a run is never left unwatched without a no-decision.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

use super::BootTime;
use crate::host::{Host, Process, Tool};
use crate::runtime::ALREADY_ENDED;

/// The first argument that turns a stage binary into a lease's watchdog.
pub const WATCHDOG_ARG: &str = "--cordon-lease-watchdog";

/// What a watchdog writes on stdout once its timer is armed.
const ARMED: u8 = b'W';

/// How long a watchdog may take to arm itself before the lease gives up on it.
const ARM_WAIT: Duration = Duration::from_secs(10);

/// How long a watchdog may take to exit once its lease is released and its pipe closed.
const END_WAIT: Duration = Duration::from_secs(5);

/// What one watchdog guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    /// The program to start as the watchdog (a cordon stage binary).
    pub exe: PathBuf,
    /// The lease record: while it exists, the lease is not released.
    pub record: PathBuf,
    /// The marker written in the run directory before the kill.
    pub marker: PathBuf,
    /// The lease id (the marker's content).
    pub lease: String,
    /// When to end the container if the supervisor has not: the deadline plus the grace.
    pub until: BootTime,
    /// The runtime's command that kills everything in the container.
    pub kill: Tool,
}

impl Watch {
    /// The watch of one run: its record, the marker in its run directory, and the kill due at
    /// its deadline plus [`EXPIRY_GRACE`](super::EXPIRY_GRACE).
    #[must_use]
    pub fn for_run(
        exe: &std::path::Path,
        record: &std::path::Path,
        run_dir: &std::path::Path,
        lease: &str,
        deadline: &BootTime,
        kill: Tool,
    ) -> Self {
        Self {
            exe: exe.to_path_buf(),
            record: record.to_path_buf(),
            marker: run_dir.join(super::ENDED_BY_REAP),
            lease: lease.to_owned(),
            until: deadline.after(super::EXPIRY_GRACE),
            kill,
        }
    }

    /// The watchdog's command line.
    #[must_use]
    pub fn tool(&self) -> Tool {
        let mut tool = Tool::new(&self.exe, &[WATCHDOG_ARG]);
        tool.tool_path = false;
        tool.args.extend([
            self.record.clone().into_os_string(),
            self.marker.clone().into_os_string(),
            OsString::from(&self.lease),
            OsString::from(&self.until.boot_id),
            OsString::from(self.until.ms.to_string()),
            OsString::from("--"),
            self.kill.program.clone().into_os_string(),
        ]);
        tool.args.extend(self.kill.args.iter().cloned());
        tool
    }

    /// The watch a watchdog's arguments (after [`WATCHDOG_ARG`]) describe.
    fn from_args(args: &[OsString]) -> Result<Self, String> {
        let [
            record,
            marker,
            lease,
            boot_id,
            ms,
            dashes,
            program,
            kill @ ..,
        ] = args
        else {
            return Err(format!("{} arguments is not a watch", args.len()));
        };
        if dashes != "--" {
            return Err("the kill command does not follow `--`".into());
        }
        let text = |a: &OsString| {
            a.to_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("{a:?} is not text"))
        };
        let mut tool = Tool::new(program, &[]);
        tool.args = kill.to_vec();
        Ok(Self {
            exe: PathBuf::from("/proc/self/exe"),
            record: record.into(),
            marker: marker.into(),
            lease: text(lease)?,
            until: BootTime {
                boot_id: text(boot_id)?,
                ms: text(ms)?
                    .parse()
                    .map_err(|e| format!("deadline {ms:?}: {e}"))?,
            },
            kill: tool,
        })
    }
}

/// Start the watchdog of `watch` through the host seam and wait until it is armed: the process,
/// whose stdin is the pipe only this process holds.
///
/// # Errors
/// It could not be started, or did not report itself armed in time (it is then killed, and its
/// stderr is the message).
pub fn start(host: &dyn Host, watch: &Watch) -> io::Result<Process> {
    let mut process = host.spawn(&watch.tool(), crate::host::Stdin::Pipe)?;
    let armed = match process.stdout.take() {
        Some(out) => armed(out),
        None => Err(io::Error::other("it has no stdout")),
    };
    match armed {
        Ok(()) => {
            // Nothing more is read from it; a write of its own later fails, harmlessly.
            process.stderr = None;
            Ok(process)
        }
        Err(e) => {
            let _ = process.kill();
            let mut said = Vec::new();
            if let Some(err) = process.stderr.take() {
                let _ = err.take(4096).read_to_end(&mut said);
            }
            let _ = process.wait();
            Err(io::Error::other(format!(
                "the lease's watchdog ({}) did not arm itself: {e}{}",
                watch.exe.display(),
                if said.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; it said: {}",
                        crate::text::printable(String::from_utf8_lossy(&said).trim())
                    )
                }
            )))
        }
    }
}

/// Whether the watchdog's first byte, within [`ARM_WAIT`], is [`ARMED`].
fn armed(mut out: io::PipeReader) -> io::Result<()> {
    let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
    let wait = PollTimeout::try_from(ARM_WAIT).map_err(io::Error::other)?;
    if poll(&mut fds, wait)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("nothing within {ARM_WAIT:?}"),
        ));
    }
    let mut byte = [0u8];
    match out.read(&mut byte)? {
        1 if byte[0] == ARMED => Ok(()),
        0 => Err(io::Error::other("it exited")),
        _ => Err(io::Error::other(format!("it wrote {byte:?}"))),
    }
}

/// End the watchdog of a released lease (its record gone): close its pipe and reap it.
///
/// # Errors
/// It did not exit in time (it is killed), cannot be waited for, or ended other than with 0:
/// the lease was not watched as it should have been.
pub fn end(mut process: Process) -> Result<(), String> {
    process.stdin = None;
    let exited = process
        .exited_by(Instant::now() + END_WAIT)
        .map_err(|e| format!("the lease's watchdog cannot be waited for: {e}"))?;
    if !exited {
        let _ = process.kill();
    }
    let exit = process
        .wait()
        .map_err(|e| format!("the lease's watchdog cannot be reaped: {e}"))?;
    match exit.status.code() {
        Some(0) if exited => Ok(()),
        _ if !exited => Err(format!(
            "the lease's watchdog did not exit within {END_WAIT:?} of its release: killed"
        )),
        _ => Err(format!("the lease's watchdog ended with {}", exit.status)),
    }
}

/// The `main` of a stage binary that supervises container leases: a watchdog when started as
/// one, else `run`.
pub fn or_main(run: impl FnOnce() -> crate::ExitCode) -> std::process::ExitCode {
    match requested() {
        Some(code) => std::process::ExitCode::from(code),
        None => crate::exit::main(run),
    }
}

/// When this process was started as a watchdog ([`WATCHDOG_ARG`] first): be one, and return
/// its exit status. Called first thing in a stage binary's `main`.
#[must_use]
pub fn requested() -> Option<u8> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_none_or(|a| a != WATCHDOG_ARG) {
        return None;
    }
    match Watch::from_args(&args[1..]).and_then(|w| guard(&w)) {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("cordon lease watchdog: {}", crate::text::printable(&e));
            Some(1)
        }
    }
}

/// The watchdog itself: arm, report, wait for the pipe's end or the timer.
fn guard(watch: &Watch) -> Result<(), String> {
    let fail = |what: &'static str| move |e: nix::Error| format!("{what}: {e}");
    // Only SIGKILL or its lease's end stop a watchdog: a terminal's or a service manager's
    // signal to the supervisor's group must not leave its container unwatched.
    let deaf = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, std::sync::Arc::clone(&deaf))
            .map_err(|e| format!("cannot take signal {signal}: {e}"))?;
    }
    let now = BootTime::now(&crate::host::Linux).map_err(|e| e.to_string())?;
    if now.boot_id != watch.until.boot_id {
        return Err(format!(
            "the deadline is of boot {}, this is boot {}",
            watch.until.boot_id, now.boot_id
        ));
    }
    let timer =
        TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC).map_err(fail("timerfd"))?;
    timer
        .set(
            Expiration::OneShot(TimeSpec::from_duration(Duration::from_millis(
                watch.until.ms,
            ))),
            TimerSetTimeFlags::TFD_TIMER_ABSTIME,
        )
        .map_err(fail("arm the timer"))?;
    let mut out = io::stdout().lock();
    out.write_all(&[ARMED])
        .and_then(|()| out.flush())
        .map_err(|e| format!("report armed: {e}"))?;
    drop(out);
    let stdin = io::stdin();
    // A kill at the deadline that failed is reported when the watchdog ends, not by ending it:
    // the supervisor's end still has to be watched.
    let (mut fired, mut trouble) = (false, Ok(()));
    loop {
        let mut fds = [
            PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
            PollFd::new(timer.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("poll: {e}")),
            Ok(_) => {}
        }
        let ready = |fd: &PollFd| !fd.revents().unwrap_or(PollFlags::empty()).is_empty();
        let (pipe, late) = (ready(&fds[0]), ready(&fds[1]));
        if late && !fired {
            fired = true;
            timer.unset().map_err(fail("disarm the timer"))?;
            trouble = end_container(watch);
        }
        if pipe {
            let mut buf = [0u8; 64];
            match nix::unistd::read(stdin.as_fd(), &mut buf) {
                // The supervisor is gone: a lease it never released still has its container.
                Ok(0) | Err(Errno::EPIPE | Errno::EBADF) => {
                    return end_container(watch).and(trouble);
                }
                Ok(_) | Err(Errno::EINTR | Errno::EAGAIN) => {}
                Err(e) => return Err(format!("read the supervisor's pipe: {e}")),
            }
        }
    }
}

/// If the lease's record is still there, mark its run directory and kill its container.
fn end_container(watch: &Watch) -> Result<(), String> {
    match std::fs::symlink_metadata(&watch.record) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        _ => {}
    }
    // The marker first: a kill the supervisor cannot attribute would be the candidate's. Its
    // failure does not spare the container.
    let marked = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&watch.marker)
        .and_then(|mut f| f.write_all(watch.lease.as_bytes()));
    // Through the host seam: the runtime's kill with its timeout, an empty environment.
    let killed = crate::host::Linux
        .run(&watch.kill)
        .map_err(|e| format!("run {}: {e}", watch.kill.display()))
        .and_then(|out| {
            let said = String::from_utf8_lossy(&out.stderr);
            if out.success() || ALREADY_ENDED.iter().any(|w| said.contains(w)) {
                Ok(())
            } else {
                Err(format!(
                    "{} failed ({:?}): {}",
                    watch.kill.display(),
                    out.code,
                    crate::text::printable(said.trim())
                ))
            }
        });
    match (marked, killed) {
        // No run directory: none was made yet, or the release removed it after the container.
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        (Err(e), _) => Err(format!("mark {}: {e}", watch.marker.display())),
        (_, Err(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> Watch {
        Watch {
            exe: "/proc/self/exe".into(),
            record: "/store/leases/ab.json".into(),
            marker: "/run/cordon/ab/ended-by-reap".into(),
            lease: "ab".into(),
            until: BootTime {
                boot_id: "0f0e0d0c-0b0a-0908-0706-050403020100".into(),
                ms: 12_345,
            },
            kill: Tool::new(
                "/usr/sbin/runc",
                &["--root", "/run/cordon-runc/x", "kill", "--all", "c", "KILL"],
            ),
        }
    }

    #[test]
    fn a_watch_survives_its_command_line() {
        let w = watch();
        let tool = w.tool();
        assert_eq!(tool.args[0], WATCHDOG_ARG);
        assert!(!tool.tool_path, "a watchdog's environment is empty");
        assert_eq!(Watch::from_args(&tool.args[1..]).unwrap(), w);
        for cut in 1..7 {
            assert!(Watch::from_args(&tool.args[1..cut]).is_err(), "{cut}");
        }
        let mut bad = tool.args.clone();
        bad[6] = "-".into();
        let e = Watch::from_args(&bad[1..]).unwrap_err().to_string();
        assert!(e.contains("the kill command does not follow `--`"), "{e}");
        bad.clone_from(&tool.args);
        bad[5] = "soon".into();
        let e = Watch::from_args(&bad[1..]).unwrap_err().to_string();
        assert!(e.contains("deadline \"soon\": invalid digit"), "{e}");
    }
}
