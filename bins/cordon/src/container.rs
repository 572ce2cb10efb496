//! One container's lifecycle, step by step, as a typestate: [`Runtime::create`] gives a
//! [`Created`] container, [`Created::start`] a [`Running`] one whose stdin and stdout a caller
//! may hold live (to exchange frames with a worker), [`Running::wait`] an [`Exited`] one under an
//! absolute deadline (killing everything in it when the deadline passes), and [`Exited::delete`]
//! the [`Finished`] record. [`Runtime::run`] is the four steps in a row.
//!
//! How the exit status is obtained: this process makes itself a child subreaper, so the
//! container's init, orphaned when `runtime create` exits, is reparented here, taken on through
//! the host seam ([`Host::adopt`](crate::host::Host::adopt)) and waited for directly by its
//! supervisor, with no shim in between. Output not held live is captured with byte caps; what is
//! over the cap is read and dropped, so the supervisor's memory stays flat under a flood.
//!
//! Crash story: a value dropped before `delete` (a supervisor error, a panic) leaves the
//! container behind; it carries its lease's labels, and the lease's release or `cordon-reap`
//! removes it and proves it absent. Nothing here decides cleanup.
//!
//! It does not write bundles (the planner does) or hold leases (the lease does). Every spawn,
//! wait, kill, runtime call and file read goes through the host seam, so the fake host drives
//! each failure path of the lifecycle (see the tests below).

use std::io::{PipeReader, PipeWriter, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::host::{Process, Tool};
use crate::runtime::{CgroupProbe, Finished, Meta, OutputCaps, Runtime, RuntimeError};

type Capture = std::thread::JoinHandle<(Vec<u8>, u64)>;

/// How long an init killed at its deadline has to die before the supervisor gives up on it.
const KILL_GRACE: Duration = Duration::from_secs(30);

fn join(h: Capture) -> (Vec<u8>, u64) {
    h.join().unwrap_or_default()
}

/// What the container's init reads on stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Nothing (`/dev/null`).
    Null,
    /// These bytes, then end of file (a declared secret).
    Bytes(Vec<u8>),
    /// A live pipe the caller takes with [`Running::take_stdin`].
    Live,
}

/// How the container's stdout or stderr is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Captured on a thread, at most this many bytes kept.
    Captured(u64),
    /// A live pipe the caller takes with [`Running::take_stdout`] or
    /// [`Running::take_stderr`].
    Live,
}

/// The container's stdio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stdio3 {
    /// stdin.
    pub stdin: Input,
    /// stdout.
    pub stdout: Output,
    /// stderr.
    pub stderr: Output,
}

impl Stdio3 {
    /// stdin as given, stdout and stderr captured under `caps`.
    #[must_use]
    pub fn captured(stdin: Option<Vec<u8>>, caps: OutputCaps) -> Self {
        Self {
            stdin: stdin.map_or(Input::Null, Input::Bytes),
            stdout: Output::Captured(caps.stdout),
            stderr: Output::Captured(caps.stderr),
        }
    }
}

/// One output stream: captured on a thread under a cap, or a live pipe for the caller.
enum Stream<R> {
    Captured(Capture, u64),
    Live(Option<R>),
}

impl<R: std::io::Read + Send + 'static> Stream<R> {
    fn new(mode: Output, pipe: Option<R>) -> Option<Self> {
        match (mode, pipe) {
            (Output::Captured(cap), Some(r)) => {
                Some(Self::Captured(crate::host::capped(r, cap), cap))
            }
            (Output::Live, r) => Some(Self::Live(r)),
            (Output::Captured(_), None) => None,
        }
    }

    /// What was kept, how much was written in all, and the cap (a live stream's bytes are the
    /// caller's to count).
    fn finish(self) -> (Vec<u8>, u64, u64) {
        match self {
            Self::Captured(h, cap) => {
                let (kept, total) = join(h);
                (kept, total, cap)
            }
            Self::Live(_) => (Vec::new(), 0, u64::MAX),
        }
    }

    /// Read what is left of a live pipe that was never handed out, at most `cap` bytes (the
    /// runtime's own error text, when create failed).
    fn drain(self, cap: u64) -> Vec<u8> {
        match self {
            Self::Live(Some(r)) => join(crate::host::capped(r, cap)).0,
            other => other.finish().0,
        }
    }
}

/// A created container: its init exists and waits for `start`.
pub struct Created {
    runtime: Runtime,
    id: String,
    pid: i32,
    init: Process,
    stdin: Option<PipeWriter>,
    stdout: Stream<PipeReader>,
    stderr: Stream<PipeReader>,
}

impl std::fmt::Debug for Created {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Created")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// A running container.
#[derive(Debug)]
pub struct Running {
    created: Created,
    started: Instant,
}

/// A container whose init has exited (or was killed at the deadline), not yet deleted.
#[derive(Debug)]
pub struct Exited {
    runtime: Runtime,
    id: String,
    finished: Finished,
}

impl Runtime {
    /// `runtime create` the bundle at `bundle` as container `id`, with `stdio`.
    ///
    /// # Errors
    /// The runtime could not be spawned, create failed, or no init pid was reported.
    pub fn create(&self, id: &str, bundle: &Path, stdio: Stdio3) -> Result<Created, RuntimeError> {
        let sup = |why: String| RuntimeError::Supervise {
            id: id.to_owned(),
            why,
        };
        // Orphans of `runtime create` (the container's init) are reparented to us, so we can
        // wait for the init itself. The stage prologue already did this before any thread
        // started; it is repeated (idempotently) for library callers without a prologue.
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| sup(format!("subreaper: {e}")))?;
        let pid_file = bundle.join("init.pid");
        let mut create = Tool::new(&self.binary, &["--root"]);
        create.args.extend([
            self.state_root.clone().into_os_string(),
            "create".into(),
            "--bundle".into(),
            bundle.as_os_str().to_owned(),
            "--pid-file".into(),
            pid_file.clone().into_os_string(),
            id.into(),
        ]);
        let piped_stdin = match stdio.stdin {
            Input::Null => crate::host::Stdin::Null,
            Input::Bytes(_) | Input::Live => crate::host::Stdin::Pipe,
        };
        let mut child =
            self.host
                .spawn(&create, piped_stdin)
                .map_err(|source| RuntimeError::Spawn {
                    binary: self.binary.clone(),
                    source,
                })?;
        let stdout = Stream::new(stdio.stdout, child.stdout.take())
            .ok_or_else(|| sup("no stdout pipe".into()))?;
        let stderr = Stream::new(stdio.stderr, child.stderr.take())
            .ok_or_else(|| sup("no stderr pipe".into()))?;
        let stdin = match (stdio.stdin, child.stdin.take()) {
            (Input::Bytes(bytes), Some(mut pipe)) => {
                // The bytes go to the init's stdin and the pipe is closed; a workload that does
                // not read them gets EPIPE on our side, which is not its failure.
                std::thread::spawn(move || {
                    let _ = pipe.write_all(&bytes);
                });
                None
            }
            (Input::Live, Some(pipe)) => Some(pipe),
            (Input::Live | Input::Bytes(_), None) => return Err(sup("no stdin pipe".into())),
            (Input::Null, _) => None,
        };
        let status = child.wait().map_err(|e| sup(format!("create: {e}")))?;
        if !status.status.success() {
            let err = stderr.drain(64 * 1024);
            return Err(RuntimeError::Command {
                command: format!("{} create {id}", self.binary.display()),
                stderr: String::from_utf8_lossy(&err).trim().to_owned(),
            });
        }
        let pid: i32 = self
            .host
            .read(&pid_file)
            .ok()
            .and_then(|t| String::from_utf8_lossy(&t).trim().parse().ok())
            .ok_or_else(|| sup("no init pid from the runtime's create".into()))?;
        // Supervised from here on, and stopped by a signal to this process: a created container
        // is the candidate's as much as a running one.
        let mut init = self
            .host
            .adopt(pid)
            .map_err(|e| sup(format!("cannot supervise the init: {e}")))?;
        init.stop_on_interrupt();
        Ok(Created {
            runtime: self.clone(),
            id: id.to_owned(),
            pid,
            init,
            stdin,
            stdout,
            stderr,
        })
    }

    /// Run the bundle at `bundle` as container `id` to its end or its deadline, then delete it:
    /// create → start → wait → delete.
    ///
    /// # Errors
    /// The runtime could not create, start, wait for or delete the container.
    pub fn run(
        &self,
        id: &str,
        bundle: &Path,
        deadline: Instant,
        caps: OutputCaps,
        cgroup: &CgroupProbe,
        stdin: Option<Vec<u8>>,
    ) -> Result<Finished, RuntimeError> {
        self.create(id, bundle, Stdio3::captured(stdin, caps))?
            .start()?
            .wait(deadline, cgroup)?
            .delete()
    }
}

impl Created {
    /// The container's init, as this host's pid namespace sees it.
    #[must_use]
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The container id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Kill the init of a container that will never start, and reap it, so its caller's
    /// release finds nothing of it: dropped instead, the init would stay a zombie of this
    /// subreaper — in the container's pid namespace — until this process exits.
    ///
    /// # Errors
    /// The init could not be killed or reaped.
    pub fn abandon(self) -> Result<(), RuntimeError> {
        let sup = |e: std::io::Error| RuntimeError::Supervise {
            id: self.id.clone(),
            why: format!("abandoning the init: {e}"),
        };
        self.init.kill().map_err(sup)?;
        self.init.wait().map(|_| ()).map_err(sup)
    }

    /// `runtime start`: the init execs the workload.
    ///
    /// # Errors
    /// The runtime refused.
    pub fn start(self) -> Result<Running, RuntimeError> {
        let started = Instant::now();
        self.runtime.call(&["start", &self.id])?;
        Ok(Running {
            created: self,
            started,
        })
    }
}

impl Running {
    /// The container's init, as this host's pid namespace sees it.
    #[must_use]
    pub fn pid(&self) -> i32 {
        self.created.pid
    }

    /// The live stdin, when it was asked for (once).
    pub fn take_stdin(&mut self) -> Option<PipeWriter> {
        self.created.stdin.take()
    }

    /// The live stdout, when it was asked for (once).
    pub fn take_stdout(&mut self) -> Option<PipeReader> {
        match &mut self.created.stdout {
            Stream::Live(out) => out.take(),
            Stream::Captured(..) => None,
        }
    }

    /// The live stderr, when it was asked for (once).
    pub fn take_stderr(&mut self) -> Option<PipeReader> {
        match &mut self.created.stderr {
            Stream::Live(err) => err.take(),
            Stream::Captured(..) => None,
        }
    }

    /// Whether the init has exited by `deadline` (it stays unreaped for [`Running::wait`]).
    ///
    /// # Errors
    /// It cannot be waited for.
    pub fn exited_by(&self, deadline: Instant) -> std::io::Result<bool> {
        self.created.init.exited_by(deadline)
    }

    /// Kill the init of a container whose workload never began (it waits at its start gate),
    /// and reap it: [`Created::abandon`], once started.
    ///
    /// # Errors
    /// The init could not be killed or reaped.
    pub fn abandon(self) -> Result<(), RuntimeError> {
        self.created.abandon()
    }

    /// Kill everything in the container.
    ///
    /// # Errors
    /// The runtime refused.
    pub fn kill(&self) -> Result<(), RuntimeError> {
        self.created
            .runtime
            .call(&["kill", "--all", &self.created.id, "KILL"])
            .map(|_| ())
    }

    /// Wait for the init under the absolute `deadline`; past it, kill everything and reap.
    /// Reads the cgroup's accounting before anything is deleted.
    ///
    /// # Errors
    /// The init could not be waited for, or did not die after SIGKILL.
    pub fn wait(self, deadline: Instant, cgroup: &CgroupProbe) -> Result<Exited, RuntimeError> {
        self.wait_accounted(deadline, Some(cgroup))
    }

    /// [`Running::wait`] for a container with no cgroup of cordon's (a rootless runtime the host
    /// delegates none to): nothing is read from a cgroup, so the meta record has no CPU time or
    /// peak memory, and `oom_killed` is false because there is no cgroup whose OOM killer could
    /// act (a kernel-wide OOM kill shows as the signal).
    ///
    /// # Errors
    /// The init could not be waited for, or did not die after SIGKILL.
    pub fn wait_without_cgroup(self, deadline: Instant) -> Result<Exited, RuntimeError> {
        self.wait_accounted(deadline, None)
    }

    fn wait_accounted(
        self,
        deadline: Instant,
        cgroup: Option<&CgroupProbe>,
    ) -> Result<Exited, RuntimeError> {
        let id = self.created.id.clone();
        let sup = |why: String| RuntimeError::Supervise {
            id: id.clone(),
            why,
        };
        let exited = self
            .created
            .init
            .exited_by(deadline)
            .map_err(|e| sup(format!("cannot wait for the init: {e}")))?;
        let killed_by_deadline = !exited;
        if killed_by_deadline {
            // The deadline is absolute: kill everything in the container, then reap.
            // Without a cgroup the runtime cannot enumerate the container's processes;
            // SIGKILL to its init ends its pid namespace and with it every process in it.
            // The init is unreaped until its supervisor reaps it, so its pid is its own.
            match cgroup {
                // Everything in its cgroup; should the runtime fail, its init at least (its
                // pid namespace ends with it).
                Some(_) => {
                    if self.kill().is_err() {
                        let _ = self.created.init.kill();
                    }
                }
                None => {
                    let _ = self.created.init.kill();
                }
            }
            let died = self
                .created
                .init
                .exited_by(Instant::now() + KILL_GRACE)
                .map_err(|e| sup(format!("cannot wait for the init: {e}")))?;
            if !died {
                return Err(sup("the init did not die after SIGKILL".into()));
            }
        }
        let status = self
            .created
            .init
            .wait()
            .map_err(|e| sup(format!("cannot reap the init: {e}")))?
            .status;
        let wall_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (exit_code, signal) = match (status.code(), status.signal()) {
            (Some(code), _) => (Some(code), None),
            (None, Some(sig)) => (None, Some(sig)),
            (None, None) => return Err(sup(format!("unexpected wait status {status:?}"))),
        };
        let (oom, peak, cpu) = match cgroup {
            Some(cgroup) => {
                let (oom, peak, cpu) = cgroup.accounting();
                // An OOM kill is the candidate's failure only when the kernel's count says so;
                // a count that cannot be read decides nothing.
                let oom =
                    oom.ok_or_else(|| sup("cannot read the cgroup's OOM-kill count".into()))?;
                (oom, peak, cpu)
            }
            None => (0, None, None),
        };
        let Created {
            runtime,
            stdout,
            stderr,
            ..
        } = self.created;
        // Processes the init left behind die with its pid namespace: the pipes close.
        let (stdout, stdout_bytes, stdout_cap) = stdout.finish();
        let (stderr_kept, stderr_bytes, stderr_cap) = stderr.finish();
        Ok(Exited {
            runtime,
            id,
            finished: Finished {
                meta: Meta {
                    exit_code,
                    signal,
                    killed_by_deadline,
                    oom_killed: oom > 0,
                    wall_ms,
                    cpu_ms: cpu,
                    peak_memory_bytes: peak,
                    stdout_bytes,
                    stderr_bytes,
                    stdout_truncated: stdout_bytes > stdout_cap,
                    stderr_truncated: stderr_bytes > stderr_cap,
                },
                stdout,
                stderr: stderr_kept,
            },
        })
    }
}

impl Exited {
    /// What the run left: its meta record and kept output.
    #[must_use]
    pub fn finished(&self) -> &Finished {
        &self.finished
    }

    /// `runtime delete --force` ([`Runtime::delete`]: no separate kill, the init has exited).
    ///
    /// # Errors
    /// The runtime failed on a container that exists.
    pub fn delete(self) -> Result<Finished, RuntimeError> {
        self.runtime.delete(&self.id)?;
        Ok(self.finished)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::ToolOutput;
    use crate::host::fake::{Call, End, Fake, Script};
    use crate::runtime::CgroupProbe;

    const INIT: i32 = 4242;

    /// A runtime on the fake host whose `create` reports init [`INIT`] and writes `out`.
    fn runtime(fake: &Arc<Fake>, out: &[u8]) -> Runtime {
        fake.process(" create ", Script::exits(0, out))
            .file("/b/init.pid", &INIT.to_string());
        Runtime {
            binary: "/usr/sbin/runc".into(),
            state_root: "/run/cordon-runc/x".into(),
            host: fake.clone(),
        }
    }

    fn caps() -> OutputCaps {
        OutputCaps {
            stdout: 10,
            stderr: 10,
        }
    }

    fn probe(fake: &Arc<Fake>) -> CgroupProbe {
        CgroupProbe {
            host: fake.clone(),
            root: "/cg".into(),
            path: "/cordon/l1".into(),
        }
    }

    fn running(rt: &Runtime) -> Running {
        rt.create("c1", Path::new("/b"), Stdio3::captured(None, caps()))
            .unwrap()
            .start()
            .unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[test]
    fn create_spawns_through_the_seam_and_a_failed_spawn_is_an_error() {
        let fake = Arc::new(Fake::new());
        let rt = Runtime {
            binary: "/usr/sbin/runc".into(),
            state_root: "/run/cordon-runc/x".into(),
            host: fake.clone(),
        };
        let stdio = Stdio3::captured(Some(b"secret".to_vec()), caps());
        let e = rt.create("c1", Path::new("/b"), stdio).unwrap_err();
        assert!(matches!(e, RuntimeError::Spawn { .. }), "{e}");
        assert_eq!(
            fake.calls(),
            vec![Call::Spawn(
                "/usr/sbin/runc --root /run/cordon-runc/x create --bundle /b --pid-file /b/init.pid c1"
                    .into()
            )]
        );
    }

    #[test]
    fn a_run_to_its_end_is_reaped_with_its_status_and_capped_output_then_deleted() {
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"0123456789abcdef");
        fake.process(&format!("pid {INIT}"), Script::exits(3, b""));
        let finished = rt
            .create("c1", Path::new("/b"), Stdio3::captured(None, caps()))
            .unwrap()
            .start()
            .unwrap()
            .wait_without_cgroup(Instant::now() + Duration::from_secs(60))
            .unwrap()
            .delete()
            .unwrap();
        assert_eq!(finished.meta.exit_code, Some(3));
        assert!(!finished.meta.killed_by_deadline);
        assert_eq!(finished.stdout, b"0123456789");
        assert!(finished.meta.stdout_truncated && finished.meta.stdout_bytes == 16);
        let calls = fake.calls();
        assert!(calls.contains(&Call::Adopt(INIT)), "{calls:?}");
        assert!(!calls.contains(&Call::Kill(INIT)), "{calls:?}");
        assert!(fake.runs().last().unwrap().contains("delete --force c1"));
    }

    #[test]
    fn past_its_deadline_a_container_without_a_cgroup_has_its_init_killed() {
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        let exited = running(&rt).wait_without_cgroup(soon()).unwrap();
        let meta = &exited.finished().meta;
        assert!(
            meta.killed_by_deadline && meta.signal == Some(9),
            "{meta:?}"
        );
        assert!(fake.calls().contains(&Call::Kill(INIT)));
        assert!(!fake.runs().iter().any(|r| r.contains("kill --all")));
    }

    #[test]
    fn past_its_deadline_a_container_with_a_cgroup_is_killed_whole_by_the_runtime() {
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.kills_on("kill --all c1 KILL")
            .file("/cg/cgroup.controllers", "memory")
            .file("/cg/cordon/l1/memory.events", "oom 0\noom_kill 0\n")
            .file("/cg/cordon/l1/memory.peak", "1024");
        let exited = running(&rt).wait(soon(), &probe(&fake)).unwrap();
        let meta = &exited.finished().meta;
        assert!(meta.killed_by_deadline && !meta.oom_killed, "{meta:?}");
        assert_eq!(meta.peak_memory_bytes, Some(1024));
        assert!(!fake.calls().contains(&Call::Kill(INIT)));
    }

    #[test]
    fn an_oom_count_that_cannot_be_read_decides_nothing() {
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.process(&format!("pid {INIT}"), Script::exits(0, b""))
            .file("/cg/cgroup.controllers", "memory");
        let e = running(&rt)
            .wait(Instant::now() + Duration::from_secs(60), &probe(&fake))
            .unwrap_err();
        assert!(e.to_string().contains("OOM-kill count"), "{e}");
    }

    #[test]
    fn every_failed_step_of_the_lifecycle_is_an_error_not_a_verdict() {
        // create exits non-zero: its stderr is the error.
        let fake = Arc::new(Fake::new());
        fake.process(
            " create ",
            Script {
                stderr: b"no bundle".to_vec(),
                ..Script::exits(1, b"")
            },
        );
        let rt = runtime(&fake, b"");
        let e = rt
            .create("c1", Path::new("/b"), Stdio3::captured(None, caps()))
            .unwrap_err();
        assert!(e.to_string().contains("no bundle"), "{e}");
        // create cannot be waited for.
        let fake = Arc::new(Fake::new());
        fake.process(" create ", Script::ending(End::Unwaitable));
        let e = runtime(&fake, b"")
            .create("c1", Path::new("/b"), Stdio3::captured(None, caps()))
            .unwrap_err();
        assert!(e.to_string().contains("create"), "{e}");
        // No init pid.
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.file("/b/init.pid", "not a pid");
        let e = rt
            .create("c1", Path::new("/b"), Stdio3::captured(None, caps()))
            .unwrap_err();
        assert!(e.to_string().contains("no init pid"), "{e}");
        // start refused.
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.reply(" start c1", ToolOutput::failed("cannot start"));
        let e = rt
            .create("c1", Path::new("/b"), Stdio3::captured(None, caps()))
            .unwrap()
            .start()
            .unwrap_err();
        assert!(e.to_string().contains("cannot start"), "{e}");
        // The init cannot be waited for.
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.process(&format!("pid {INIT}"), Script::ending(End::Unwaitable));
        let e = running(&rt).wait_without_cgroup(soon()).unwrap_err();
        assert!(e.to_string().contains("cannot wait for the init"), "{e}");
        // delete fails on a container that exists.
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.process(&format!("pid {INIT}"), Script::exits(0, b""))
            .reply("delete --force", ToolOutput::failed("device busy"));
        let e = running(&rt)
            .wait_without_cgroup(soon())
            .unwrap()
            .delete()
            .unwrap_err();
        assert!(e.to_string().contains("device busy"), "{e}");
        // ... but one already gone is deleted.
        let fake = Arc::new(Fake::new());
        let rt = runtime(&fake, b"");
        fake.process(&format!("pid {INIT}"), Script::exits(0, b""))
            .reply(
                "delete --force",
                ToolOutput::failed("container does not exist"),
            );
        running(&rt)
            .wait_without_cgroup(soon())
            .unwrap()
            .delete()
            .unwrap();
    }

    #[test]
    fn captured_stdio_keeps_the_caps_and_the_secret() {
        let s = Stdio3::captured(
            Some(b"k".to_vec()),
            OutputCaps {
                stdout: 1,
                stderr: 2,
            },
        );
        assert_eq!(s.stdin, Input::Bytes(b"k".to_vec()));
        assert_eq!(s.stdout, Output::Captured(1));
        assert_eq!(s.stderr, Output::Captured(2));
        let s = Stdio3::captured(
            None,
            OutputCaps {
                stdout: 1,
                stderr: 2,
            },
        );
        assert_eq!(s.stdin, Input::Null);
    }
}
