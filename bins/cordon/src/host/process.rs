//! A process the host seam started ([`Host::spawn`](super::Host::spawn)) or took on
//! ([`Host::adopt`](super::Host::adopt): a container's init, reparented to this subreaper), and
//! its one supervisor: wait with a deadline, kill, status.
//!
//! The rule every supervisor keeps: a process is waited for without being reaped (`WNOWAIT`)
//! until its caller reaps it in [`Process::wait`], after the watchdog has been stopped. Until
//! then its pid is its own, so neither the watchdog's SIGKILL nor a caller's [`Process::kill`]
//! can reach a process that reused the pid; after it, a kill is refused.
//!
//! [`Supervise`] is the part a host implements: [`Waiter`] for the real one (a thread blocked in
//! `waitid`, a condition variable for everyone who waits on it), scripted processes in
//! [`fake`](super::fake). Everything above it — the deadline watchdog, the order of stop, join
//! and reap — is here once, for the host's own tool runs, a container's `runtime create` and
//! init, and the confined parser child alike.

use std::io::{self, PipeReader, PipeWriter};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

/// The host's side of one process.
pub trait Supervise: Send + Sync + std::fmt::Debug {
    /// Its pid in this process's pid namespace.
    fn pid(&self) -> i32;

    /// Block until it has exited (left unreaped) or `deadline` passes; whether it exited.
    ///
    /// # Errors
    /// It cannot be waited for.
    fn exited(&self, deadline: Option<Instant>) -> io::Result<bool>;

    /// SIGKILL it; a no-op once it is reaped (its pid may be another's then).
    ///
    /// # Errors
    /// The kernel refused the signal.
    fn kill(&self) -> io::Result<()>;

    /// Reap it once it has exited: its status, and the whole seconds of CPU it used (read just
    /// before, while its `/proc` entry still exists).
    ///
    /// # Errors
    /// It has not exited, was reaped already, or cannot be waited for.
    fn reap(&self) -> io::Result<(ExitStatus, Option<u64>)>;
}

/// How a waited-for process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Its status.
    pub status: ExitStatus,
    /// Whole seconds of CPU (user and system) it used, when they could be read.
    pub cpu_seconds: Option<u64>,
    /// Whether the watchdog sent it SIGKILL at its deadline (it may have exited just before).
    pub killed_at_deadline: bool,
}

/// A handle to SIGKILL a process from another thread ([`Process::killer`]); its reaping stays
/// with the process's owner.
#[derive(Clone)]
pub struct Killer(Arc<dyn Supervise>);

impl std::fmt::Debug for Killer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Killer({})", self.0.pid())
    }
}

impl Killer {
    /// SIGKILL it now.
    ///
    /// # Errors
    /// The kernel refused the signal.
    pub fn kill(&self) -> io::Result<()> {
        self.0.kill()
    }
}

/// A started process: the pipes asked for, and its supervisor.
#[derive(Debug)]
pub struct Process {
    /// Its stdin, when piped.
    pub stdin: Option<PipeWriter>,
    /// Its stdout, when piped.
    pub stdout: Option<PipeReader>,
    /// Its stderr, when piped.
    pub stderr: Option<PipeReader>,
    supervisor: Arc<dyn Supervise>,
    watchdog: Option<JoinHandle<io::Result<bool>>>,
    interrupt: Option<crate::interrupt::Registered>,
}

impl Process {
    /// A process under `supervisor`, with these pipes (for host implementations).
    #[must_use]
    pub fn new(
        supervisor: Arc<dyn Supervise>,
        stdin: Option<PipeWriter>,
        stdout: Option<PipeReader>,
        stderr: Option<PipeReader>,
    ) -> Self {
        Self {
            stdin,
            stdout,
            stderr,
            supervisor,
            watchdog: None,
            interrupt: None,
        }
    }

    /// Its pid.
    #[must_use]
    pub fn pid(&self) -> i32 {
        self.supervisor.pid()
    }

    /// SIGKILL it now.
    ///
    /// # Errors
    /// The kernel refused the signal.
    pub fn kill(&self) -> io::Result<()> {
        self.supervisor.kill()
    }

    /// A handle another thread can SIGKILL it through while this one waits on its pipes.
    #[must_use]
    pub fn killer(&self) -> Killer {
        Killer(Arc::clone(&self.supervisor))
    }

    /// Kill it when SIGINT, SIGTERM or SIGHUP reaches this process (at once if one already
    /// has): a candidate's process — a container's init, a confined parser child — never the
    /// host's own tools, which a release needs to finish ([`crate::interrupt`]).
    pub fn stop_on_interrupt(&mut self) {
        self.interrupt = Some(crate::interrupt::stop_on_signal(Arc::clone(
            &self.supervisor,
        )));
    }

    /// Kill it at `deadline` unless it exits first: a watchdog that runs beside whatever the
    /// caller does with its pipes meanwhile. [`Process::wait`] says whether it fired.
    pub fn kill_at(&mut self, deadline: Instant) {
        let supervisor = Arc::clone(&self.supervisor);
        self.watchdog = Some(std::thread::spawn(move || {
            if supervisor.exited(Some(deadline))? {
                return Ok(false);
            }
            supervisor.kill().map(|()| true)
        }));
    }

    /// Whether it has exited by `deadline` (it stays unreaped: call [`Process::wait`]).
    ///
    /// # Errors
    /// It cannot be waited for.
    pub fn exited_by(&self, deadline: Instant) -> io::Result<bool> {
        self.supervisor.exited(Some(deadline))
    }

    /// Wait for it to exit, stop the watchdog, then reap it.
    ///
    /// # Errors
    /// It cannot be waited for or reaped, or the watchdog could not kill it at its deadline.
    pub fn wait(mut self) -> io::Result<Exit> {
        self.supervisor.exited(None)?;
        // The watchdog returns as soon as the exit is seen; only then is the pid let go.
        let killed_at_deadline = match self.watchdog.take() {
            Some(watchdog) => watchdog
                .join()
                .map_err(|_| io::Error::other("the watchdog panicked"))??,
            None => false,
        };
        let (status, cpu_seconds) = self.supervisor.reap()?;
        Ok(Exit {
            status,
            cpu_seconds,
            killed_at_deadline,
        })
    }
}

/// Wait on `changed` (holding `guard`) until `settled` reads an answer from the guarded state,
/// or until `deadline` passes (`None`; no deadline waits for ever): the one wait of every
/// supervisor, real or scripted.
pub fn wait_until<T, R>(
    changed: &Condvar,
    mut guard: MutexGuard<'_, T>,
    deadline: Option<Instant>,
    settled: impl Fn(&T) -> Option<R>,
) -> Option<R> {
    loop {
        if let Some(answer) = settled(&guard) {
            return Some(answer);
        }
        guard = match deadline {
            None => changed.wait(guard).unwrap_or_else(PoisonError::into_inner),
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                changed
                    .wait_timeout(guard, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
    }
}

/// Where a real child stands.
#[derive(Debug)]
enum Stand {
    Running,
    Exited,
    Unwaitable(Errno),
    Reaped,
}

/// The real supervisor of one child of this process (spawned, or an orphan reparented to this
/// subreaper): a thread blocked in `waitid(WNOWAIT)` says when it exits.
#[derive(Debug)]
pub struct Waiter {
    pid: Pid,
    stand: Mutex<Stand>,
    changed: Condvar,
}

impl Waiter {
    /// Supervise child `pid`.
    #[must_use]
    pub fn watch(pid: i32) -> Arc<Self> {
        let waiter = Arc::new(Self {
            pid: Pid::from_raw(pid),
            stand: Mutex::new(Stand::Running),
            changed: Condvar::new(),
        });
        let watched = Arc::clone(&waiter);
        std::thread::spawn(move || {
            let waited = loop {
                match waitid(
                    Id::Pid(watched.pid),
                    WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
                ) {
                    Err(Errno::EINTR) => {}
                    other => break other,
                }
            };
            *watched.lock() = match waited {
                Ok(_) => Stand::Exited,
                Err(e) => Stand::Unwaitable(e),
            };
            watched.changed.notify_all();
        });
        waiter
    }

    fn lock(&self) -> MutexGuard<'_, Stand> {
        // A panic while holding it changed no stand half-way: every write is one assignment.
        self.stand.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Supervise for Waiter {
    fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    fn exited(&self, deadline: Option<Instant>) -> io::Result<bool> {
        let settled = wait_until(&self.changed, self.lock(), deadline, |stand| match stand {
            Stand::Exited | Stand::Reaped => Some(Ok(())),
            Stand::Unwaitable(e) => Some(Err(*e)),
            Stand::Running => None,
        });
        match settled {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(io::Error::from(e)),
            None => Ok(false),
        }
    }

    fn kill(&self) -> io::Result<()> {
        // Held across the signal: `reap` cannot free the pid between the check and the kill.
        let stand = self.lock();
        if matches!(*stand, Stand::Reaped) {
            return Ok(());
        }
        kill(self.pid, Signal::SIGKILL).map_err(io::Error::from)
    }

    fn reap(&self) -> io::Result<(ExitStatus, Option<u64>)> {
        let mut stand = self.lock();
        match *stand {
            Stand::Exited => {}
            Stand::Running => return Err(io::Error::other("the process has not exited")),
            Stand::Reaped => return Err(io::Error::other("the process was reaped already")),
            Stand::Unwaitable(e) => return Err(io::Error::from(e)),
        }
        let cpu = cpu_seconds(self.pid.as_raw());
        let status = match waitpid(self.pid, None).map_err(io::Error::from)? {
            WaitStatus::Exited(_, code) => ExitStatus::from_raw(code << 8),
            WaitStatus::Signaled(_, signal, core) => {
                ExitStatus::from_raw(signal as i32 | if core { 0x80 } else { 0 })
            }
            other => {
                return Err(io::Error::other(format!(
                    "unexpected wait status {other:?}"
                )));
            }
        };
        *stand = Stand::Reaped;
        Ok((status, cpu))
    }
}

/// The whole seconds of CPU (user and system) process `pid` has used, from `/proc/<pid>/stat`
/// (an unreaped child's stays readable).
fn cpu_seconds(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces and parentheses): utime is the 14th
    // field of the line, the 12th after the closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    Some(ticks / u64::try_from(hz).ok()?.max(1))
}
