//! The confined parser child (REQ-117): hostile bytes are decoded by a child process that has
//! given up everything before it reads them, never by the root process that owns the store.
//!
//! It owns both ends of that split — this module the parent's side and what both share, `child`
//! the child's own steps, `wire` the framing:
//! - the parent's [`spawn`]: the same executable, started through the host seam with
//!   [`CHILD_ARG`], no environment, the working directory `/`, its input on stdin, its facts on
//!   stdout, its stderr captured, and [`Supervised`]: its deadline watched, its end classified,
//!   by the seam's one process supervisor (so the fake host drives every failure path);
//! - the child's [`enter`], which runs before any candidate byte is read and in this order:
//!   die with the parent, new network and IPC namespaces, `chroot` into an empty root-owned
//!   directory, every capability dropped from the bounding set, no supplementary groups, the
//!   run account's uid and gid (real, effective, saved), no new privileges, not dumpable,
//!   resource limits (address space, CPU time, threads, file size 0, no core, few descriptors),
//!   then a seccomp filter it installs on itself (`seccompiler`) that admits only what decoding
//!   needs: reading its input, writing its output, memory, threads, exiting. Opening a file by
//!   name answers `EACCES` (the C library's allocator tries, and copes); anything else kills
//!   it. A step that fails exits [`UNCONFINED_EXIT`] before any input is read;
//! - the framing both speak ([`write_frame`], [`FrameReader`]): a tag byte, a little-endian u32
//!   length, the payload, each frame and the whole stream bounded by the reader;
//! - the classification of how a child ended ([`Ended`]): a crash, a limit or a broken frame on
//!   candidate input is the candidate's (a rejection), a child that could not confine itself or
//!   was killed by someone else is a no-decision.
//!
//! It does not know what is parsed: the stage that owns the facts validates every one of them
//! (paths, sizes, digests) itself. It does not create the account or the jail directory: the
//! lease that owns them does, and removes them.

use std::ffi::OsString;
use std::io::{self, PipeReader, PipeWriter, Read};
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::host::{Host, HostRef, Process, Stdin, Tool};

mod child;
mod wire;

pub use child::{ConfineError, answer, enter, requested, run_child};
pub use wire::{Frame, FrameError, FrameReader, write_frame};

/// The first argument that turns a stage binary into its own confined parser child.
pub const CHILD_ARG: &str = "--cordon-confined-child";

/// The exit status of a child that could not confine itself (it read no input).
pub const UNCONFINED_EXIT: i32 = 125;

/// The tag of the frame a child writes once it has confined itself, before it reads input.
pub const CONFINED: u8 = b'C';

/// The exit status of a child that decoded its input and found it breaks a rule (it said why
/// in a frame).
pub const REJECTED_EXIT: i32 = 1;

/// The threads a child may have (`RLIMIT_NPROC` of its fresh account): its main thread and
/// the parsers' workers.
pub const THREADS: u64 = 4;

/// The resource limits a child sets on itself before it reads its input (policy
/// `intake { parser { … } }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `RLIMIT_AS`, bytes.
    pub address_space: u64,
    /// `RLIMIT_CPU`, seconds (SIGXCPU at this, SIGKILL one second later).
    pub cpu_seconds: u64,
}

/// What the parent tells a child to become.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// What the child parses (the stage binary's own dispatch key).
    pub kind: String,
    /// The run account's uid.
    pub uid: u32,
    /// The run account's gid.
    pub gid: u32,
    /// An empty root-owned directory that becomes the child's root.
    pub jail: PathBuf,
    /// The limits.
    pub limits: Limits,
    /// A short request on its command line, for a child whose stdin is not the parent's pipe
    /// (a transfer child's stdin is the connection the parent made).
    pub argument: Option<String>,
}

impl Spec {
    fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec![CHILD_ARG.into(), self.kind.clone().into()];
        out.extend(
            [
                self.uid.to_string(),
                self.gid.to_string(),
                std::process::id().to_string(),
                self.limits.address_space.to_string(),
                self.limits.cpu_seconds.to_string(),
            ]
            .map(OsString::from),
        );
        out.push(self.jail.clone().into_os_string());
        out.extend(self.argument.clone().map(OsString::from));
        out
    }

    /// The spec and the parent's pid from a child's arguments (everything after the program
    /// name), or `None` when they are not a child's.
    fn from_args(args: &[OsString]) -> Option<(Self, u32)> {
        let (fixed, argument) = match args {
            [fixed @ .., argument] if args.len() == 9 => {
                (fixed, Some(argument.to_str()?.to_owned()))
            }
            fixed => (fixed, None),
        };
        let [flag, kind, uid, gid, parent, asz, cpu, jail] = fixed else {
            return None;
        };
        if flag != CHILD_ARG {
            return None;
        }
        let num = |s: &OsString| s.to_str()?.parse::<u64>().ok();
        let id = |s: &OsString| num(s).and_then(|n| u32::try_from(n).ok());
        Some((
            Self {
                kind: kind.to_str()?.to_owned(),
                uid: id(uid)?,
                gid: id(gid)?,
                jail: PathBuf::from(jail),
                limits: Limits {
                    address_space: num(asz)?,
                    cpu_seconds: num(cpu)?,
                },
                argument,
            },
            id(parent)?,
        ))
    }
}

/// The command line of a confined child for `spec`: `exe` itself with [`CHILD_ARG`], no
/// environment at all, the working directory `/`.
#[must_use]
pub fn tool(exe: &Path, spec: &Spec) -> Tool {
    let mut tool = Tool::new(exe, &[]);
    tool.args = spec.to_args();
    tool.dir = Some(PathBuf::from("/"));
    tool.tool_path = false;
    tool
}

/// Start `exe` through `host` as a confined child for `spec`, its stdin as `stdin` says. Its
/// stdout (the facts) and stderr are pipes the caller drains.
///
/// # Errors
/// The process cannot be started.
pub fn spawn(host: &dyn Host, exe: &Path, spec: &Spec, stdin: Stdin) -> io::Result<Process> {
    let mut child = host.spawn(&tool(exe, spec), stdin)?;
    // It parses candidate bytes: a signal to this process stops it.
    child.stop_on_interrupt();
    Ok(child)
}

/// How a parent starts a child.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The host seam it is started and supervised through.
    pub host: HostRef,
    /// The stage binary itself (`/proc/self/exe` in production).
    pub exe: PathBuf,
    /// The account, jail and limits.
    pub spec: Spec,
    /// How long the child may run, counted from its start: past it the parent kills it.
    pub budget: Duration,
}

/// The size of the pipes facts cross (the unprivileged maximum by default).
const PIPE_BYTES: i32 = 1 << 20;

/// Bytes of a child's stderr kept for the message.
const STDERR_CAP: u64 = 4096;

/// A running child: its stderr drained (the first [`STDERR_CAP`] bytes kept) by a thread of
/// the parent and its deadline watched by its supervisor, its stdin and stdout the caller's.
pub struct Supervised {
    process: Process,
    cpu_limit: u64,
    stderr: std::thread::JoinHandle<String>,
    /// The host's count of OOM kills when it started (`None`: unreadable).
    oom_kills: Option<u64>,
    host: HostRef,
}

/// How a supervised child ended.
#[derive(Debug)]
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Whether the watchdog killed it at the deadline.
    pub deadline_kill: bool,
    /// Whether the parent ended it because it refused its output.
    pub parent_kill: bool,
    /// Whether it confirmed its confinement (after which it reads its input).
    pub confined: bool,
    /// Whether it used its whole CPU limit (a SIGKILL then is the hard limit's).
    pub at_cpu_limit: bool,
    /// Whether the kernel's OOM killer ran while it lived and it ended by SIGKILL.
    pub oom_killed: bool,
    /// The start of its stderr.
    pub stderr: String,
}

impl Finished {
    /// How it ended, unless the parent ended it for its output (then its exit is the
    /// parent's doing, not evidence, and the output decides).
    #[must_use]
    pub fn ended(&self) -> Option<Ended> {
        if self.parent_kill && !self.deadline_kill {
            return None;
        }
        Some(match classify(self.status, self.deadline_kill) {
            // After the marker, input has been read: an "unconfined" exit or a SIGKILL at the
            // CPU hard limit is the input's doing, not an outside one.
            Ended::Infrastructure(_)
                if self.confined && self.status.code() == Some(UNCONFINED_EXIT) =>
            {
                Ended::Broke("the parser exited as if unconfined after confining itself".into())
            }
            Ended::Infrastructure(_) if self.at_cpu_limit => {
                Ended::Broke("the parser was killed at its CPU hard limit".into())
            }
            // Its memory is bounded by its address-space limit, which ends it with an abort:
            // an OOM kill is the host's memory running out, not the candidate's doing.
            Ended::Infrastructure(_) if self.oom_killed => Ended::Infrastructure(
                "the parser was killed by the kernel's OOM killer: the host ran out of memory"
                    .into(),
            ),
            // After the marker the child can signal itself only through a fault (its filter
            // admits SIGABRT alone), and only root can signal the run account: any signal but
            // the ones an operator or the kernel sends to end a process is its own doing.
            Ended::Infrastructure(why)
                if self.confined
                    && self.status.signal().is_some_and(|s| {
                        ![
                            Signal::SIGKILL,
                            Signal::SIGTERM,
                            Signal::SIGINT,
                            Signal::SIGHUP,
                        ]
                        .iter()
                        .any(|x| *x as i32 == s)
                    }) =>
            {
                Ended::Broke(format!("{why}, after confining itself"))
            }
            other => other,
        })
    }

    /// `why`, with the start of the child's stderr escaped after it.
    #[must_use]
    pub fn with_tail(&self, why: &str) -> String {
        let tail = self.stderr.trim();
        if tail.is_empty() {
            why.to_owned()
        } else {
            format!("{why}; its stderr ends: {}", crate::text::printable(tail))
        }
    }
}

impl Supervised {
    /// Start the child `launch` names; its stdin and stdout.
    ///
    /// # Errors
    /// It cannot be started (a no-decision for the caller).
    pub fn start(launch: &Launch) -> io::Result<(Self, PipeWriter, PipeReader)> {
        let (child, stdin, stdout) = Self::start_with(launch, Stdin::Pipe)?;
        let stdin = stdin.ok_or_else(|| io::Error::other("the child's stdin pipe is missing"))?;
        Ok((child, stdin, stdout))
    }

    /// Start the child `launch` names with `fd` as its stdin (a connection the parent made);
    /// its stdout.
    ///
    /// # Errors
    /// It cannot be started (a no-decision for the caller).
    pub fn start_on(launch: &Launch, fd: std::os::fd::OwnedFd) -> io::Result<(Self, PipeReader)> {
        let (child, _, stdout) = Self::start_with(launch, Stdin::Fd(fd))?;
        Ok((child, stdout))
    }

    fn start_with(
        launch: &Launch,
        given: Stdin,
    ) -> io::Result<(Self, Option<PipeWriter>, PipeReader)> {
        let piped = matches!(given, Stdin::Pipe);
        // Before it exists: an OOM kill counted later happened while it lived.
        let oom_before = oom_kills(&*launch.host);
        let mut process = spawn(&*launch.host, &launch.exe, &launch.spec, given)?;
        let stdin = process.stdin.take();
        let (Some(stdout), Some(stderr), true) = (
            process.stdout.take(),
            process.stderr.take(),
            stdin.is_some() == piped,
        ) else {
            let _ = process.kill();
            let _ = process.wait();
            return Err(io::Error::other("the child's pipes are missing"));
        };
        // Bulk facts cross these pipes: a larger buffer means fewer switches between parent
        // and child. Best effort: the default size is only slower, never wrong.
        for fd in stdin.iter().map(AsFd::as_fd).chain([stdout.as_fd()]) {
            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
        }
        let stderr = std::thread::spawn(move || {
            let mut text = Vec::new();
            let mut capped = stderr.take(STDERR_CAP);
            let _ = capped.read_to_end(&mut text);
            // Drain the rest so the child never blocks on a full pipe.
            let _ = io::copy(&mut capped.into_inner(), &mut io::sink());
            String::from_utf8_lossy(&text).into_owned()
        });
        process.kill_at(Instant::now() + launch.budget);
        Ok((
            Self {
                process,
                cpu_limit: launch.spec.limits.cpu_seconds,
                stderr,
                oom_kills: oom_before,
                host: launch.host.clone(),
            },
            stdin,
            stdout,
        ))
    }

    /// A handle that kills the child from another thread.
    #[must_use]
    pub fn killer(&self) -> crate::host::Killer {
        self.process.killer()
    }

    /// End the child (`kill`: the parent refused its output) or wait for it to end, within
    /// the deadline.
    ///
    /// # Errors
    /// It cannot be waited for.
    pub fn finish(self, kill: bool, confined: bool) -> io::Result<Finished> {
        if kill {
            let _ = self.process.kill();
        }
        let exit = self.process.wait()?;
        let at_cpu_limit = exit.cpu_seconds.is_some_and(|s| s >= self.cpu_limit);
        // A watchdog that signalled a child which had already exited did not end it.
        let deadline_kill =
            exit.killed_at_deadline && exit.status.signal() == Some(Signal::SIGKILL as i32);
        let stderr = self.stderr.join().unwrap_or_default();
        // The counter is the host's: a kill from outside while another process was OOM-killed
        // reads as an OOM kill. Both are no-decisions; only the message differs.
        let oom_killed = exit.status.signal() == Some(Signal::SIGKILL as i32)
            && matches!(
                (self.oom_kills, oom_kills(&*self.host)),
                (Some(before), Some(after)) if after > before
            );
        Ok(Finished {
            status: exit.status,
            deadline_kill,
            parent_kill: kill,
            confined,
            at_cpu_limit,
            oom_killed,
            stderr,
        })
    }
}

/// The host's count of OOM kills since boot (`oom_kill` in `/proc/vmstat`), when readable.
fn oom_kills(host: &dyn Host) -> Option<u64> {
    let text = host.read(Path::new("/proc/vmstat")).ok()?;
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Read the child's first frame: whether it is the [`CONFINED`] marker.
///
/// # Errors
/// The pipe failed.
pub fn confirmed(frames: &mut FrameReader<impl Read>) -> io::Result<bool> {
    match frames.frame() {
        Ok(Some((CONFINED, payload))) => Ok(payload.is_empty()),
        Ok(_) | Err(FrameError::Broken(_) | FrameError::Truncated) => Ok(false),
        Err(FrameError::Pipe(e)) => Err(e),
    }
}

impl Supervised {
    /// End a child that never confirmed its confinement: it read no input, so whatever
    /// happened is not the candidate's. The message for the no-decision.
    #[must_use]
    pub fn unconfined(self) -> String {
        match self.finish(true, false) {
            Ok(f) => f.with_tail("the parser child did not confine itself"),
            Err(e) => {
                format!("the parser child did not confine itself, and cannot be waited for: {e}")
            }
        }
    }
}

/// What a request/response child did wrong, or could not do.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// It crashed, hit a limit or broke its answer on candidate input: the candidate's.
    #[error("{0}")]
    Broke(String),
    /// It could not be started or confined, or was killed from outside: a no-decision.
    #[error("{0}")]
    Infrastructure(String),
}

/// Send one request frame to the child `launch` names and read its one answer frame (at most
/// `max_answer` bytes): for parsers whose input is a few documents rather than a stream.
///
/// # Errors
/// See [`ExchangeError`].
pub fn exchange(
    launch: &Launch,
    request: &[u8],
    max_answer: u32,
) -> Result<Vec<u8>, ExchangeError> {
    let (child, mut stdin, stdout) = Supervised::start(launch).map_err(|e| {
        ExchangeError::Infrastructure(format!("cannot start {}: {e}", launch.exe.display()))
    })?;
    let writer = std::thread::spawn({
        let request = request.to_vec();
        move || {
            // A child that stops reading is judged by how it ended, not by this write.
            let _ = write_frame(&mut stdin, b'Q', &request);
        }
    });
    let mut frames = FrameReader::new(stdout, max_answer, u64::from(max_answer) + 10);
    match confirmed(&mut frames) {
        Ok(true) => {}
        other => {
            drop(frames);
            let why = child.unconfined();
            let _ = writer.join();
            return Err(ExchangeError::Infrastructure(match other {
                Err(e) => format!("cannot read the child's output: {e}; {why}"),
                Ok(_) => why,
            }));
        }
    }
    let answer = match frames.frame() {
        Ok(Some((b'A', payload))) => match frames.frame() {
            Ok(None) => Ok(payload),
            _ => Err(Some("output follows the answer".to_owned())),
        },
        Ok(Some((tag, _))) => Err(Some(format!("unknown frame tag {tag}"))),
        Ok(None) | Err(FrameError::Truncated) => Err(None),
        Err(FrameError::Broken(why)) => Err(Some(why)),
        Err(FrameError::Pipe(e)) => {
            drop(frames);
            let why = child.unconfined();
            let _ = writer.join();
            return Err(ExchangeError::Infrastructure(format!(
                "cannot read the child's answer: {e}; {why}"
            )));
        }
    };
    // Refused output: the parent ends the child. Output that just stopped: its end decides.
    let refused = matches!(answer, Err(Some(_)));
    drop(frames);
    let finished = child
        .finish(refused, true)
        .map_err(|e| ExchangeError::Infrastructure(format!("cannot wait for the child: {e}")))?;
    let _ = writer.join();
    match (finished.ended(), answer) {
        (Some(Ended::Infrastructure(why)), _) => {
            Err(ExchangeError::Infrastructure(finished.with_tail(&why)))
        }
        (Some(Ended::Done), Ok(payload)) => Ok(payload),
        (Some(Ended::Broke(why)), _) => Err(ExchangeError::Broke(finished.with_tail(&why))),
        (_, Err(Some(why))) => Err(ExchangeError::Broke(format!(
            "the child broke its framing: {why}"
        ))),
        (ended, _) => Err(ExchangeError::Broke(finished.with_tail(&format!(
            "the child's exit ({ended:?}) contradicts its output"
        )))),
    }
}

/// How a child ended, as the parent classifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Exit 0: it decoded its input.
    Done,
    /// Exit [`REJECTED_EXIT`]: it says why in its frames.
    Rejected,
    /// It crashed, hit a resource limit, tripped its seccomp filter, ran past the parent's
    /// deadline or exited with a status it never uses, on candidate input: the candidate's.
    Broke(String),
    /// It could not confine itself, or something other than the parent killed it: not the
    /// candidate's, a no-decision.
    Infrastructure(String),
}

/// Classify a child's exit status; `deadline_kill` says whether the parent itself killed it
/// for running past its deadline.
#[must_use]
pub fn classify(status: ExitStatus, deadline_kill: bool) -> Ended {
    if deadline_kill {
        return Ended::Broke("the parser ran past its deadline and was killed".into());
    }
    match (status.code(), status.signal()) {
        (Some(0), _) => Ended::Done,
        (Some(REJECTED_EXIT), _) => Ended::Rejected,
        (Some(UNCONFINED_EXIT), _) => {
            Ended::Infrastructure("the parser child could not confine itself".into())
        }
        (Some(code), _) => Ended::Broke(format!("the parser exited with status {code}")),
        (None, Some(sig)) => {
            let name = Signal::try_from(sig)
                .map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_owned());
            match Signal::try_from(sig) {
                // Its own faults and limits: a crash, an abort (allocation failure under
                // RLIMIT_AS), the CPU limit, the seccomp filter.
                Ok(
                    Signal::SIGSEGV
                    | Signal::SIGBUS
                    | Signal::SIGILL
                    | Signal::SIGFPE
                    | Signal::SIGABRT
                    | Signal::SIGXCPU
                    | Signal::SIGXFSZ
                    | Signal::SIGSYS
                    | Signal::SIGPIPE,
                ) => Ended::Broke(format!(
                    "the parser was killed by {name} (a crash or a limit)"
                )),
                // SIGKILL from the kernel's CPU hard limit is indistinguishable from an outside
                // kill, so the hard limit sits a second past the soft one that sends SIGXCPU.
                _ => Ended::Infrastructure(format!("the parser was killed from outside by {name}")),
            }
        }
        (None, None) => Ended::Infrastructure("the parser ended without a status".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::fake::{Call, End, Fake, Script};

    /// A launch of a child the fake host runs as `script` says, its CPU limit 2 s.
    fn scripted(script: Script, budget: Duration) -> (Arc<Fake>, Launch) {
        crate::host::fake::scripted_launch(script, "k", budget)
    }

    fn frames(list: &[(u8, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (tag, payload) in list {
            write_frame(&mut out, *tag, payload).unwrap();
        }
        out
    }

    fn answering(stdout: Vec<u8>, end: End) -> Script {
        Script {
            stdout,
            end,
            ..Script::default()
        }
    }

    fn exits(code: i32) -> End {
        End::Exits(ExitStatus::from_raw(code << 8))
    }

    fn signalled(signal: Signal) -> End {
        End::Exits(ExitStatus::from_raw(signal as i32))
    }

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn the_parent_spawns_through_the_seam_with_nothing_of_its_own() {
        let answer = frames(&[(CONFINED, b""), (b'A', b"facts")]);
        let (fake, launch) = scripted(answering(answer, exits(0)), LONG);
        assert_eq!(exchange(&launch, b"q", 100).unwrap(), b"facts");
        let line = tool(&launch.exe, &launch.spec);
        assert_eq!(line.dir.as_deref(), Some(Path::new("/")));
        assert!(!line.tool_path, "the child's environment is empty");
        // The host's OOM count is read before the child exists; nothing else is touched.
        assert_eq!(
            fake.calls(),
            vec![
                Call::Read(PathBuf::from("/proc/vmstat")),
                Call::Spawn(line.display())
            ]
        );
    }

    #[test]
    fn a_child_that_cannot_be_started_waited_for_or_confined_is_a_no_decision() {
        let infrastructure = |r: Result<Vec<u8>, ExchangeError>| match r {
            Err(ExchangeError::Infrastructure(why)) => why,
            other => panic!("expected a no-decision, got {other:?}"),
        };
        // No such process.
        let (_, mut launch) = scripted(Script::default(), LONG);
        launch.exe = "/other".into();
        launch.spec.kind = "other".into();
        let fake = Arc::new(Fake::new());
        launch.host = fake;
        assert!(infrastructure(exchange(&launch, b"q", 100)).contains("cannot start"));
        // It confirms and answers, but cannot be waited for.
        let answer = frames(&[(CONFINED, b""), (b'A', b"x")]);
        let (_, launch) = scripted(answering(answer, End::Unwaitable), LONG);
        assert!(infrastructure(exchange(&launch, b"q", 100)).contains("cannot wait"));
        // It never confirms its confinement: it is ended, and whatever it did is not the
        // candidate's.
        let (fake, launch) = scripted(
            Script {
                stderr: b"chroot: \x1b[31m".to_vec(),
                ..answering(Vec::new(), exits(UNCONFINED_EXIT))
            },
            LONG,
        );
        let why = infrastructure(exchange(&launch, b"q", 100));
        assert!(why.contains("did not confine itself"), "{why}");
        assert!(why.contains("\\u{1b}"), "its stderr is escaped: {why}");
        assert!(fake.calls().iter().any(|c| matches!(c, Call::Kill(_))));
        // It confirms, then something other than its parent kills it.
        let answer = frames(&[(CONFINED, b"")]);
        let (_, launch) = scripted(answering(answer, signalled(Signal::SIGKILL)), LONG);
        assert!(infrastructure(exchange(&launch, b"q", 100)).contains("from outside"));
    }

    #[test]
    fn a_child_that_confirmed_and_then_failed_is_the_candidates_fault() {
        let broke = |r: Result<Vec<u8>, ExchangeError>| match r {
            Err(ExchangeError::Broke(why)) => why,
            other => panic!("expected the child's fault, got {other:?}"),
        };
        let confirmed = || frames(&[(CONFINED, b"")]);
        // Past its deadline: the watchdog kills it, and says so.
        let (fake, launch) = scripted(
            answering(confirmed(), End::Hangs),
            Duration::from_millis(50),
        );
        let why = broke(exchange(&launch, b"q", 100));
        assert!(why.contains("past its deadline"), "{why}");
        assert!(fake.calls().iter().any(|c| matches!(c, Call::Kill(_))));
        // Killed at its CPU hard limit.
        let (_, launch) = scripted(
            Script {
                cpu_seconds: Some(2),
                ..answering(confirmed(), signalled(Signal::SIGKILL))
            },
            LONG,
        );
        assert!(broke(exchange(&launch, b"q", 100)).contains("CPU hard limit"));
        // A filter kill.
        let (_, launch) = scripted(answering(confirmed(), signalled(Signal::SIGSYS)), LONG);
        assert!(broke(exchange(&launch, b"q", 100)).contains("SIGSYS"));
        // Output after its answer: the parent refuses it and ends the child.
        let answer = frames(&[(CONFINED, b""), (b'A', b"x"), (b'A', b"y")]);
        let (fake, launch) = scripted(answering(answer, End::Hangs), LONG);
        assert!(broke(exchange(&launch, b"q", 100)).contains("framing"));
        assert!(fake.calls().iter().any(|c| matches!(c, Call::Kill(_))));
        // An answer over its bound.
        let answer = frames(&[(CONFINED, b""), (b'A', &[0u8; 200])]);
        let (_, launch) = scripted(answering(answer, End::Hangs), LONG);
        assert!(broke(exchange(&launch, b"q", 100)).contains("framing"));
    }

    #[test]
    fn a_spec_round_trips_through_its_arguments_and_nothing_else_parses() {
        let spec = Spec {
            kind: "archive".into(),
            uid: 3_100_001,
            gid: 3_100_002,
            jail: PathBuf::from("/run/x/jail"),
            limits: Limits {
                address_space: 1 << 30,
                cpu_seconds: 60,
            },
            argument: None,
        };
        let args = spec.to_args();
        let (back, parent) = Spec::from_args(&args).unwrap();
        assert_eq!(back, spec);
        assert_eq!(parent, std::process::id());
        assert!(Spec::from_args(&args[..args.len() - 1]).is_none());
        let mut bad = args.clone();
        bad[2] = "-1".into();
        assert!(Spec::from_args(&bad).is_none());
        // A request on the command line travels as the last argument.
        let asked = Spec {
            argument: Some("{\"host\":\"example.org\"}".into()),
            ..spec
        };
        let (back, _) = Spec::from_args(&asked.to_args()).unwrap();
        assert_eq!(back, asked);
    }

    #[test]
    fn frames_are_bounded_each_and_in_total() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b'F', b"hello").unwrap();
        write_frame(&mut buf, b'E', b"").unwrap();
        let mut r = FrameReader::new(&buf[..], 16, 1024);
        assert_eq!(r.frame().unwrap(), Some((b'F', b"hello".to_vec())));
        assert_eq!(r.frame().unwrap(), Some((b'E', Vec::new())));
        assert_eq!(r.frame().unwrap(), None);
        for (max_frame, max_total, upto) in
            [(4, 1024, 15), (16, 8, 15), (16, 1024, 3), (16, 1024, 7)]
        {
            let e = FrameReader::new(&buf[..upto], max_frame, max_total).frame();
            let got = match e {
                Err(FrameError::Truncated) => "truncated",
                Err(FrameError::Broken(_)) => "broken",
                _ => "other",
            };
            let want = if upto < 15 { "truncated" } else { "broken" };
            assert_eq!(got, want, "{max_frame} {max_total} {upto}");
        }
    }

    #[test]
    fn after_its_marker_a_childs_own_signals_and_unconfined_exit_are_its_fault() {
        let end = |status: ExitStatus, confined: bool, at_cpu_limit: bool| {
            Finished {
                status,
                deadline_kill: false,
                parent_kill: false,
                confined,
                at_cpu_limit,
                oom_killed: false,
                stderr: String::new(),
            }
            .ended()
        };
        let killed = |s: Signal| ExitStatus::from_raw(s as i32);
        let broke = |e: Option<Ended>| matches!(e, Some(Ended::Broke(_)));
        // A trap (int3 needs no system call) after the marker is the child's; before, not.
        assert!(broke(end(killed(Signal::SIGTRAP), true, false)));
        assert!(!broke(end(killed(Signal::SIGTRAP), false, false)));
        // Exit 125 after the marker is the input's doing.
        assert!(broke(end(ExitStatus::from_raw(125 << 8), true, false)));
        assert!(!broke(end(ExitStatus::from_raw(125 << 8), false, false)));
        // SIGKILL is an outside kill unless the CPU limit was used up.
        assert!(!broke(end(killed(Signal::SIGKILL), true, false)));
        assert!(broke(end(killed(Signal::SIGKILL), true, true)));
        // The parent's own kill leaves the verdict to the output.
        let parent = Finished {
            status: killed(Signal::SIGKILL),
            deadline_kill: false,
            parent_kill: true,
            confined: true,
            at_cpu_limit: false,
            oom_killed: false,
            stderr: String::new(),
        };
        assert_eq!(parent.ended(), None);
    }

    /// A SIGKILL while the host's OOM kill count rose is told apart from an outside kill: both
    /// are no-decisions (the child's memory is bounded by its own limit, which aborts it), and
    /// the message says which. The host's count read through the seam, before and after.
    #[test]
    fn an_oom_kill_is_told_apart_from_an_outside_kill() {
        let marker = frames(&[(CONFINED, b"")]);
        let (fake, launch) = scripted(answering(marker, End::Hangs), LONG);
        let ended = |before: &str, after: &str| {
            fake.file("/proc/vmstat", before);
            let (child, _stdin, _stdout) = Supervised::start(&launch).unwrap();
            fake.file("/proc/vmstat", after);
            child.process.kill().unwrap();
            let finished = child.finish(false, true).unwrap();
            (finished.oom_killed, finished.ended())
        };
        let (oom, end) = ended("pgfault 9\noom_kill 3\n", "pgfault 9\noom_kill 4\n");
        assert!(oom);
        assert!(
            matches!(&end, Some(Ended::Infrastructure(why)) if why.contains("OOM killer")),
            "{end:?}"
        );
        for (before, after) in [("oom_kill 3\n", "oom_kill 3\n"), ("", "oom_kill 4\n")] {
            let (oom, end) = ended(before, after);
            assert!(!oom, "{before:?} {after:?}");
            assert!(
                matches!(&end, Some(Ended::Infrastructure(why)) if why.contains("from outside")),
                "{end:?}"
            );
        }
    }

    #[test]
    fn how_a_child_ended_decides_whose_fault_it_is() {
        let exited = |c: i32| ExitStatus::from_raw(c << 8);
        let killed = |s: Signal| ExitStatus::from_raw(s as i32);
        assert_eq!(classify(exited(0), false), Ended::Done);
        assert_eq!(classify(exited(1), false), Ended::Rejected);
        assert!(matches!(
            classify(exited(125), false),
            Ended::Infrastructure(_)
        ));
        assert!(matches!(classify(exited(7), false), Ended::Broke(_)));
        for s in [
            Signal::SIGSEGV,
            Signal::SIGABRT,
            Signal::SIGXCPU,
            Signal::SIGSYS,
        ] {
            assert!(matches!(classify(killed(s), false), Ended::Broke(_)), "{s}");
        }
        for s in [Signal::SIGKILL, Signal::SIGTERM] {
            assert!(
                matches!(classify(killed(s), false), Ended::Infrastructure(_)),
                "{s}"
            );
        }
        assert!(matches!(
            classify(killed(Signal::SIGKILL), true),
            Ended::Broke(_)
        ));
    }
}
