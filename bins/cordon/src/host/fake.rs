//! A recording, failure-injecting [`Host`] for tests: it answers tool runs from a script of
//! replies, reads from an in-memory file table, records every call in order, and fails the
//! call that a test names — so every "cannot establish" path can be driven without a kernel.
//! Processes are [`Script`]ed: what a spawned or adopted one writes, and how it ends (exits,
//! hangs until killed, cannot be killed, cannot be waited for), under the same supervisor rules
//! as the real ones. [`Interposed`] is its counterpart for tests that run on the real host: the real calls,
//! recorded, with the named ones failed or rewritten.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::process::{Process, Supervise, wait_until};
use super::{DeviceNode, Digest, Host, MountRequest, Stdin, Tool, ToolOutput};

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A tool run: its command line.
    Run(String),
    /// A spawn: its command line.
    Spawn(String),
    /// A process taken on: its pid.
    Adopt(i32),
    /// A SIGKILL sent to a process: its pid.
    Kill(i32),
    /// A read.
    Read(PathBuf),
    /// A mount.
    Mount(MountRequest),
    /// An unmount.
    Unmount(PathBuf),
    /// A file edit.
    Edit(PathBuf),
    /// A device lookup.
    Device(PathBuf),
    /// A directory removal.
    RemoveDir(PathBuf),
    /// A directory listing.
    ListDir(PathBuf),
    /// A directory made.
    MakeDir(PathBuf),
    /// A control file written: its path and the value.
    Write(PathBuf, String),
    /// A file given to another owner: its path and the uid.
    Give(PathBuf, u32),
    /// A process's pid namespace looked up: its pid.
    PidNamespace(u32),
    /// A process killed if it runs as a uid: its pid and the uid.
    KillOf(u32, u32),
    /// A start gate made: its path.
    MakeFifo(PathBuf),
    /// A start gate opened for writing: its path.
    OpenGate(PathBuf),
}

/// A process in the fake's process table.
#[derive(Debug, Clone, Copy)]
struct Listed {
    uid: u32,
    ns: u64,
    killable: bool,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    files: BTreeMap<PathBuf, Vec<u8>>,
    dirs: BTreeMap<PathBuf, Vec<String>>,
    devices: BTreeMap<PathBuf, DeviceNode>,
    processes: BTreeMap<u32, Listed>,
    unreadable: Vec<PathBuf>,
    replies: Vec<(String, ToolOutput)>,
    scripts: Vec<(String, Script)>,
    killers: Vec<String>,
    live: Vec<Arc<Scripted>>,
    next_pid: i32,
    fail_mounts: bool,
    fail_unmounts: bool,
    fail_edits: bool,
    gate_unread: bool,
}

/// The fake host.
#[derive(Debug, Default)]
pub struct Fake {
    state: Arc<Mutex<State>>,
}

fn broken() -> io::Error {
    io::Error::other("injected failure")
}

impl Fake {
    /// An empty host: no files, every tool succeeds with empty output.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        with(&self.state, f)
    }

    /// Put a file in the table.
    pub fn file(&self, path: impl Into<PathBuf>, text: &str) -> &Self {
        self.with(|s| s.files.insert(path.into(), text.as_bytes().to_vec()));
        self
    }

    /// Put a directory with these subdirectories in the table.
    pub fn dir(&self, path: impl Into<PathBuf>, names: &[&str]) -> &Self {
        let names = names.iter().map(|n| (*n).to_owned()).collect();
        self.with(|s| s.dirs.insert(path.into(), names));
        self
    }

    /// Put a device node in the table.
    pub fn device_node(&self, path: impl Into<PathBuf>, node: DeviceNode) -> &Self {
        self.with(|s| s.devices.insert(path.into(), node));
        self
    }

    /// Put process `pid` of `uid` in pid namespace `ns` in the process table (and its
    /// directory in `/proc`'s listing); a `killable` one leaves it when a [`Fake::kills_on`]
    /// tool runs, as a container's processes do.
    pub fn pid_in(&self, pid: u32, uid: u32, ns: u64, killable: bool) -> &Self {
        self.with(|s| {
            s.processes.insert(pid, Listed { uid, ns, killable });
            let names = s.dirs.entry(PathBuf::from("/proc")).or_default();
            names.push(pid.to_string());
            names.sort();
        });
        self
    }

    /// No process ever opens a start gate for reading: [`Host::open_gate`] answers `None`.
    pub fn gate_unread(&self) -> &Self {
        self.with(|s| s.gate_unread = true);
        self
    }

    /// Make a path unreadable (reads fail with an I/O error).
    pub fn unreadable(&self, path: impl Into<PathBuf>) -> &Self {
        self.with(|s| s.unreadable.push(path.into()));
        self
    }

    /// Answer tool runs whose command line contains `needle` with `output` (the first
    /// registered reply that matches wins).
    pub fn reply(&self, needle: &str, output: ToolOutput) -> &Self {
        self.with(|s| s.replies.push((needle.to_owned(), output)));
        self
    }

    /// Start processes whose command line (a spawn) or `pid <n>` (an adoption) contains
    /// `needle` as `script` says (the first registered script that matches wins; a spawn that
    /// none matches fails, an adoption hangs until killed).
    pub fn process(&self, needle: &str, script: Script) -> &Self {
        self.with(|s| s.scripts.push((needle.to_owned(), script)));
        self
    }

    /// A tool run whose command line contains `needle` kills every live scripted process that
    /// a kill can end (as `runtime kill --all` ends a container's).
    pub fn kills_on(&self, needle: &str) -> &Self {
        self.with(|s| s.killers.push(needle.to_owned()));
        self
    }

    /// Make every mount (or unmount, or file edit) fail.
    pub fn fail(&self, mounts: bool, unmounts: bool, edits: bool) -> &Self {
        self.with(|s| {
            s.fail_mounts = mounts;
            s.fail_unmounts = unmounts;
            s.fail_edits = edits;
        });
        self
    }

    /// Every call so far, in order.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.with(|s| s.calls.clone())
    }

    /// The command lines of the tool runs so far, in order.
    #[must_use]
    pub fn runs(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Run(l) => Some(l),
                _ => None,
            })
            .collect()
    }

    /// The current text of a file in the table.
    #[must_use]
    pub fn text(&self, path: &Path) -> Option<String> {
        self.with(|s| {
            s.files
                .get(path)
                .map(|b| String::from_utf8_lossy(b).into_owned())
        })
    }
}

impl Host for Fake {
    fn run(&self, tool: &Tool) -> io::Result<ToolOutput> {
        let line = tool.display();
        let (out, killed) = self.with(|s| {
            s.calls.push(Call::Run(line.clone()));
            let out = s
                .replies
                .iter()
                .find(|(needle, _)| line.contains(needle.as_str()))
                .map(|(_, out)| out.clone())
                .unwrap_or_else(|| ToolOutput::ok(b""));
            let kills = s.killers.iter().any(|n| line.contains(n.as_str()));
            if kills {
                s.processes.retain(|_, p| !p.killable);
                let table = s.processes.keys().map(ToString::to_string).collect();
                s.dirs.insert(PathBuf::from("/proc"), table);
            }
            (out, if kills { s.live.clone() } else { Vec::new() })
        });
        // A container's processes; a lease's watchdog is the host's, outside every container.
        for process in killed {
            if process.script.end != End::UntilStdinCloses {
                process.end_by_kill();
            }
        }
        Ok(out)
    }

    fn spawn(&self, tool: &Tool, stdin: Stdin) -> io::Result<Process> {
        let line = tool.display();
        let script = self.with(|s| {
            s.calls.push(Call::Spawn(line.clone()));
            s.scripts
                .iter()
                .find(|(needle, _)| line.contains(needle.as_str()))
                .map(|(_, script)| script.clone())
        });
        let script =
            script.ok_or_else(|| io::Error::other("the fake host runs no such process"))?;
        let pid = self.with(|s| {
            s.next_pid += 1;
            10_000 + s.next_pid
        });
        // A given descriptor is dropped: a script reads nothing from it.
        self.start(pid, &script, matches!(stdin, Stdin::Pipe))
    }

    fn adopt(&self, pid: i32) -> io::Result<Process> {
        let line = format!("pid {pid}");
        let script = self.with(|s| {
            s.calls.push(Call::Adopt(pid));
            s.scripts
                .iter()
                .find(|(needle, _)| line.contains(needle.as_str()))
                .map(|(_, script)| script.clone())
        });
        self.start(pid, &script.unwrap_or_default(), false)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.with(|s| {
            s.calls.push(Call::Read(path.to_path_buf()));
            if s.unreadable.iter().any(|p| p == path) {
                return Err(broken());
            }
            s.files
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        })
    }

    fn digest(&self, path: &Path) -> io::Result<Digest> {
        self.read(path).map(|bytes| Digest::of_bytes(&bytes))
    }

    fn mount(&self, request: &MountRequest) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::Mount(request.clone()));
            if s.fail_mounts { Err(broken()) } else { Ok(()) }
        })
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::Unmount(target.to_path_buf()));
            if s.fail_unmounts {
                Err(broken())
            } else {
                Ok(())
            }
        })
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.with(|s| {
            s.calls.push(Call::ListDir(path.to_path_buf()));
            if s.unreadable.iter().any(|p| p == path) {
                return Err(broken());
            }
            s.dirs
                .get(path)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        })
    }

    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        self.with(|s| {
            s.calls.push(Call::ListDir(path.to_path_buf()));
            if s.unreadable.iter().any(|p| p == path) {
                return Err(broken());
            }
            // The file table's entries directly inside `path`.
            let names: Vec<String> = s
                .files
                .keys()
                .filter(|f| f.parent() == Some(path))
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            if names.is_empty() && !s.dirs.contains_key(path) {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            Ok(names)
        })
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::RemoveDir(path.to_path_buf()));
            if s.unreadable.iter().any(|p| p == path) {
                Err(broken())
            } else {
                Ok(())
            }
        })
    }

    fn make_dir(&self, path: &Path) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::MakeDir(path.to_path_buf()));
            if s.unreadable.iter().any(|p| p == path) {
                Err(broken())
            } else if s.dirs.contains_key(path) {
                Err(io::Error::from(io::ErrorKind::AlreadyExists))
            } else {
                s.dirs.insert(path.to_path_buf(), Vec::new());
                Ok(())
            }
        })
    }

    fn give(&self, path: &Path, uid: u32, _gid: u32) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::Give(path.to_path_buf(), uid));
            if s.unreadable.iter().any(|p| p == path) {
                Err(broken())
            } else {
                Ok(())
            }
        })
    }

    fn make_fifo(&self, path: &Path) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::MakeFifo(path.to_path_buf()));
            if s.unreadable.iter().any(|p| p == path) {
                Err(broken())
            } else {
                Ok(())
            }
        })
    }

    /// A gate that opens writes to `/dev/null`.
    fn open_gate(&self, path: &Path) -> io::Result<Option<std::fs::File>> {
        let (unreadable, unread) = self.with(|s| {
            s.calls.push(Call::OpenGate(path.to_path_buf()));
            (s.unreadable.iter().any(|p| p == path), s.gate_unread)
        });
        if unreadable {
            Err(broken())
        } else if unread {
            Ok(None)
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .map(Some)
        }
    }

    fn write_control(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.with(|s| {
            let value = String::from_utf8_lossy(bytes).into_owned();
            s.calls.push(Call::Write(path.to_path_buf(), value));
            if s.unreadable.iter().any(|p| p == path) {
                return Err(broken());
            }
            // The fake's control files are the ones its directories would have: any name in a
            // directory it knows.
            if path.parent().is_some_and(|d| s.dirs.contains_key(d)) || s.files.contains_key(path) {
                s.files.insert(path.to_path_buf(), bytes.to_vec());
                Ok(())
            } else {
                Err(io::Error::from(io::ErrorKind::NotFound))
            }
        })
    }

    fn device(&self, path: &Path) -> io::Result<DeviceNode> {
        self.with(|s| {
            s.calls.push(Call::Device(path.to_path_buf()));
            s.devices
                .get(path)
                .copied()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        })
    }

    fn pid_namespace(&self, pid: u32) -> io::Result<(u32, Option<u64>)> {
        self.with(|s| {
            s.calls.push(Call::PidNamespace(pid));
            let p = s
                .processes
                .get(&pid)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            let hidden = s
                .unreadable
                .contains(&PathBuf::from(format!("/proc/{pid}/ns/pid")));
            Ok((p.uid, if hidden { None } else { Some(p.ns) }))
        })
    }

    /// A listed process of `uid` leaves the table when killable; one that is not refuses the
    /// signal (a process the kernel will not let go).
    fn kill_of(&self, pid: u32, uid: u32) -> io::Result<bool> {
        self.with(|s| {
            s.calls.push(Call::KillOf(pid, uid));
            match s.processes.get(&pid) {
                Some(p) if p.uid == uid && p.killable => {
                    s.processes.remove(&pid);
                    if let Some(names) = s.dirs.get_mut(Path::new("/proc")) {
                        names.retain(|n| *n != pid.to_string());
                    }
                    Ok(true)
                }
                Some(p) if p.uid == uid => Err(io::Error::other("the fake refuses the signal")),
                _ => Ok(false),
            }
        })
    }

    /// A namespace is a file of the fake's holding its inode number
    /// ([`super::namespace_path`]); one it does not hold cannot be looked at.
    fn namespace(&self, pid: Option<u32>, kind: &str) -> io::Result<u64> {
        let text = self.read(&super::namespace_path(pid, kind))?;
        String::from_utf8_lossy(&text)
            .trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    fn edit_file(&self, path: &Path, edit: &dyn Fn(&str) -> Option<String>) -> io::Result<()> {
        self.with(|s| {
            s.calls.push(Call::Edit(path.to_path_buf()));
            if s.fail_edits || s.unreadable.iter().any(|p| p == path) {
                return Err(broken());
            }
            let old = s
                .files
                .get(path)
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            if let Some(new) = edit(&old) {
                s.files.insert(path.to_path_buf(), new.into_bytes());
            }
            Ok(())
        })
    }
}

fn with<T>(state: &Mutex<State>, f: impl FnOnce(&mut State) -> T) -> T {
    // A poisoned lock means a test already panicked; its state is still what it was.
    f(&mut state.lock().unwrap_or_else(PoisonError::into_inner))
}

/// How a scripted process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum End {
    /// It exits at once with this status.
    Exits(ExitStatus),
    /// It runs until killed (by its supervisor, or a tool run [`Fake::kills_on`] names).
    #[default]
    Hangs,
    /// It runs until its stdin closes, then exits 0 (a lease's watchdog), or until killed.
    UntilStdinCloses,
    /// It runs and a kill does not end it (a process stuck in the kernel).
    Unkillable,
    /// It cannot be waited for.
    Unwaitable,
}

/// What a scripted process does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    /// What it writes on stdout, then closes it.
    pub stdout: Vec<u8>,
    /// What it writes on stderr, then closes it.
    pub stderr: Vec<u8>,
    /// How it ends.
    pub end: End,
    /// The CPU seconds it reports at its reaping.
    pub cpu_seconds: Option<u64>,
    /// Whether a kill sent to it fails.
    pub kill_fails: bool,
}

impl Script {
    /// It exits with `code` at once, having written `stdout`.
    #[must_use]
    pub fn exits(code: i32, stdout: &[u8]) -> Self {
        Self {
            stdout: stdout.to_vec(),
            end: End::Exits(ExitStatus::from_raw(code << 8)),
            ..Self::default()
        }
    }

    /// It runs until killed.
    #[must_use]
    pub fn hangs() -> Self {
        Self::default()
    }

    /// A lease's watchdog: it reports itself armed (`armed` on stdout) and exits 0 when its
    /// stdin closes.
    #[must_use]
    pub fn watchdog(armed: &[u8]) -> Self {
        Self {
            stdout: armed.to_vec(),
            end: End::UntilStdinCloses,
            ..Self::default()
        }
    }

    /// It ends as `end` says.
    #[must_use]
    pub fn ending(end: End) -> Self {
        Self {
            end,
            ..Self::default()
        }
    }
}

/// A live scripted process: its supervisor.
#[derive(Debug)]
struct Scripted {
    pid: i32,
    script: Script,
    ended: Mutex<(Option<ExitStatus>, bool)>,
    changed: Condvar,
    host: Arc<Mutex<State>>,
}

impl Scripted {
    fn end_by_kill(&self) {
        if matches!(self.script.end, End::Hangs | End::UntilStdinCloses) {
            let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
            ended.0.get_or_insert(ExitStatus::from_raw(9));
            self.changed.notify_all();
        }
    }
}

impl Supervise for Scripted {
    fn pid(&self) -> i32 {
        self.pid
    }

    fn exited(&self, deadline: Option<Instant>) -> io::Result<bool> {
        if matches!(self.script.end, End::Unwaitable) {
            return Err(io::Error::other("injected failure: waitid"));
        }
        let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(wait_until(&self.changed, ended, deadline, |e| e.0.map(|_| ())).is_some())
    }

    fn kill(&self) -> io::Result<()> {
        with(&self.host, |s| s.calls.push(Call::Kill(self.pid)));
        if self.script.kill_fails {
            return Err(io::Error::other("injected failure: kill"));
        }
        self.end_by_kill();
        Ok(())
    }

    fn reap(&self) -> io::Result<(ExitStatus, Option<u64>)> {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        match *ended {
            (Some(status), false) => {
                ended.1 = true;
                Ok((status, self.script.cpu_seconds))
            }
            (None, _) => Err(io::Error::other("the process has not exited")),
            (Some(_), true) => Err(io::Error::other("the process was reaped already")),
        }
    }
}

/// A pipe whose reading end gets `bytes`, then end of file.
fn fed(bytes: Vec<u8>) -> io::Result<io::PipeReader> {
    let (reader, mut writer) = io::pipe()?;
    std::thread::spawn(move || {
        let _ = writer.write_all(&bytes);
    });
    Ok(reader)
}

impl Fake {
    fn start(&self, pid: i32, script: &Script, stdin: bool) -> io::Result<Process> {
        let scripted = Arc::new(Scripted {
            pid,
            script: script.clone(),
            ended: Mutex::new((
                match script.end {
                    End::Exits(status) => Some(status),
                    End::Hangs | End::UntilStdinCloses | End::Unkillable | End::Unwaitable => None,
                },
                false,
            )),
            changed: Condvar::new(),
            host: Arc::clone(&self.state),
        });
        self.with(|s| s.live.push(Arc::clone(&scripted)));
        let stdin = if stdin {
            let (mut reader, writer) = io::pipe()?;
            let process = Arc::clone(&scripted);
            // What the caller writes is read and dropped, as a process that reads it would.
            std::thread::spawn(move || {
                let _ = io::copy(&mut reader, &mut io::sink());
                if process.script.end == End::UntilStdinCloses {
                    let mut ended = process.ended.lock().unwrap_or_else(PoisonError::into_inner);
                    ended.0.get_or_insert(ExitStatus::from_raw(0));
                    process.changed.notify_all();
                }
            });
            Some(writer)
        } else {
            None
        };
        Ok(Process::new(
            scripted,
            stdin,
            Some(fed(script.stdout.clone())?),
            Some(fed(script.stderr.clone())?),
        ))
    }
}

type Hook<A, R> = Box<dyn Fn(&A) -> R + Send + Sync>;

/// What a test makes of the bytes read from a path.
type ReadHook = Box<dyn Fn(&Path, Vec<u8>) -> Vec<u8> + Send + Sync>;

/// The real host ([`Linux`](super::Linux)) with a test's hand on the seam, for tests that
/// run real tools, mounts and containers: every call is recorded as a [`Call`], then either
/// failed (when the `failing` predicate says so: a tool run answers a failed output without
/// running, anything else an I/O error) or passed on — what `rewriting_spawns` makes of a
/// spawn, what `rewriting_mounts` makes of a mount request, what `rewriting_reads` makes of
/// a file read. That is how a test makes `useradd` fail after a real `groupadd`, or removes one
/// control from a bundle (an ablation) without a switch in product code.
pub struct Interposed {
    calls: Mutex<Vec<Call>>,
    fail: Hook<Call, bool>,
    spawn: Hook<Tool, Tool>,
    mount: Hook<MountRequest, MountRequest>,
    read: ReadHook,
}

impl std::fmt::Debug for Interposed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interposed")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl Default for Interposed {
    fn default() -> Self {
        Self {
            calls: Mutex::default(),
            fail: Box::new(|_| false),
            spawn: Box::new(Clone::clone),
            mount: Box::new(Clone::clone),
            read: Box::new(|_, bytes| bytes),
        }
    }
}

impl Interposed {
    /// The real host, every call recorded, none changed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail every call `fail` picks.
    #[must_use]
    pub fn failing(mut self, fail: impl Fn(&Call) -> bool + Send + Sync + 'static) -> Self {
        self.fail = Box::new(fail);
        self
    }

    /// Spawn or run what `rewrite` makes of each tool instead (it may also act first: change
    /// the bundle a `runc create` is about to read, say).
    #[must_use]
    pub fn rewriting_spawns(
        mut self,
        rewrite: impl Fn(&Tool) -> Tool + Send + Sync + 'static,
    ) -> Self {
        self.spawn = Box::new(rewrite);
        self
    }

    /// Mount what `rewrite` makes of each mount request instead.
    #[must_use]
    pub fn rewriting_mounts(
        mut self,
        rewrite: impl Fn(&MountRequest) -> MountRequest + Send + Sync + 'static,
    ) -> Self {
        self.mount = Box::new(rewrite);
        self
    }

    /// Answer each file read with what `rewrite` makes of the real bytes (`read` only; a
    /// digest is the file's): how an ablation blinds a check that would otherwise see the
    /// control it removed, so that the attempt alone shows what the control did.
    #[must_use]
    pub fn rewriting_reads(
        mut self,
        rewrite: impl Fn(&Path, Vec<u8>) -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        self.read = Box::new(rewrite);
        self
    }

    /// Every call so far, in order (failed ones included).
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Record `call`; whether it is to fail.
    fn record(&self, call: Call) -> bool {
        let fail = (self.fail)(&call);
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(call);
        fail
    }

    /// Record `call`, then fail it or do it.
    fn pass<T>(&self, call: Call, real: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        if self.record(call) {
            Err(broken())
        } else {
            real()
        }
    }
}

impl Host for Interposed {
    fn run(&self, tool: &Tool) -> io::Result<ToolOutput> {
        if self.record(Call::Run(tool.display())) {
            return Ok(ToolOutput::failed("injected failure"));
        }
        super::Linux.run(&(self.spawn)(tool))
    }

    fn spawn(&self, tool: &Tool, stdin: Stdin) -> io::Result<Process> {
        self.pass(Call::Spawn(tool.display()), || {
            super::Linux.spawn(&(self.spawn)(tool), stdin)
        })
    }

    fn adopt(&self, pid: i32) -> io::Result<Process> {
        self.pass(Call::Adopt(pid), || super::Linux.adopt(pid))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.pass(Call::Read(path.into()), || {
            super::Linux.read(path).map(|b| (self.read)(path, b))
        })
    }

    fn digest(&self, path: &Path) -> io::Result<Digest> {
        self.pass(Call::Read(path.into()), || super::Linux.digest(path))
    }

    fn mount(&self, request: &MountRequest) -> io::Result<()> {
        self.pass(Call::Mount(request.clone()), || {
            super::Linux.mount(&(self.mount)(request))
        })
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        self.pass(Call::Unmount(target.into()), || {
            super::Linux.unmount(target)
        })
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.pass(Call::RemoveDir(path.into()), || {
            super::Linux.remove_dir(path)
        })
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.pass(Call::ListDir(path.into()), || super::Linux.list_dir(path))
    }

    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        self.pass(Call::ListDir(path.into()), || super::Linux.list_files(path))
    }

    fn device(&self, path: &Path) -> io::Result<DeviceNode> {
        self.pass(Call::Device(path.into()), || super::Linux.device(path))
    }

    fn make_dir(&self, path: &Path) -> io::Result<()> {
        self.pass(Call::MakeDir(path.into()), || super::Linux.make_dir(path))
    }

    fn give(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        self.pass(Call::Give(path.into(), uid), || {
            super::Linux.give(path, uid, gid)
        })
    }

    fn write_control(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let value = String::from_utf8_lossy(bytes).into_owned();
        self.pass(Call::Write(path.into(), value), || {
            super::Linux.write_control(path, bytes)
        })
    }

    fn pid_namespace(&self, pid: u32) -> io::Result<(u32, Option<u64>)> {
        self.pass(Call::PidNamespace(pid), || super::Linux.pid_namespace(pid))
    }

    fn kill_of(&self, pid: u32, uid: u32) -> io::Result<bool> {
        self.pass(Call::KillOf(pid, uid), || super::Linux.kill_of(pid, uid))
    }

    /// Read as a file holding the inode number, so a read rewriter sees it like any other.
    fn namespace(&self, pid: Option<u32>, kind: &str) -> io::Result<u64> {
        let path = super::namespace_path(pid, kind);
        self.pass(Call::Read(path.clone()), || {
            let real = super::Linux.namespace(pid, kind)?.to_string().into_bytes();
            String::from_utf8_lossy(&(self.read)(&path, real))
                .trim()
                .parse()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        })
    }

    fn edit_file(&self, path: &Path, edit: &dyn Fn(&str) -> Option<String>) -> io::Result<()> {
        self.pass(Call::Edit(path.into()), || {
            super::Linux.edit_file(path, edit)
        })
    }

    fn make_fifo(&self, path: &Path) -> io::Result<()> {
        self.pass(Call::MakeFifo(path.into()), || super::Linux.make_fifo(path))
    }

    fn open_gate(&self, path: &Path) -> io::Result<Option<std::fs::File>> {
        self.pass(Call::OpenGate(path.into()), || super::Linux.open_gate(path))
    }
}

/// A confined child's launch whose every child a fresh fake host runs as `script`: kind
/// `kind`, the run account 4000, the jail `/run/j`, 1 GiB of address space, 2 s of CPU and
/// `budget` of wall time — the one fixture of every stage's confined-child tests.
#[must_use]
pub fn scripted_launch(
    script: Script,
    kind: &str,
    budget: std::time::Duration,
) -> (Arc<Fake>, crate::confine::Launch) {
    use crate::confine::{CHILD_ARG, Launch, Limits, Spec};
    let fake = Arc::new(Fake::new());
    fake.process(CHILD_ARG, script);
    let launch = Launch {
        host: fake.clone(),
        exe: "/stage".into(),
        spec: Spec {
            kind: kind.into(),
            uid: 4000,
            gid: 4000,
            jail: "/run/j".into(),
            limits: Limits {
                address_space: 1 << 30,
                cpu_seconds: 2,
            },
            argument: None,
        },
        budget,
    };
    (fake, launch)
}
