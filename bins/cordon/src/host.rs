//! The one seam between cordon's mechanisms and the host: every host tool run (the OCI
//! runtime's CLI, the account tools), every process spawned with live pipes (a container's
//! `runtime create`), every read of a host file that a decision rests on (passwd, group,
//! mountinfo, cgroup files), every mount and unmount, and every crash-safe edit of a host file
//! (cron and at deny lists) goes through [`Host`].
//!
//! Two implementations: [`Linux`], the real one, and [`fake::Fake`], a recording,
//! failure-injecting fake in the manner of youki's `Syscall`/`TestHelperSyscall`, which tests of
//! this crate and of the crates above use to drive every failure path (a listing that does not
//! parse, a `state` that fails, an unreadable passwd) without a kernel.
//!
//! Write discipline of [`Host::edit_file`]: take an exclusive lock on a sibling lock file (so
//! two cordon processes never interleave their edits), read the file, write the new text to a
//! scratch file in the same directory, fsync it, rename it over the file, fsync the directory.
//! A crash leaves the old file or the new one, never an empty or truncated one, and at most a
//! scratch file the next edit replaces.
//!
//! It does not decide anything: callers interpret what it returns, and an error from it is
//! always something the caller could not establish.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::canonical::Digest;

/// The `PATH` every host tool runs with (its environment is otherwise empty): Debian's system
/// directories, or the one a package fixes at build time in `CORDON_TOOL_PATH` (the Nix package
/// sets the store paths of shadow and util-linux there, so a tool is never found through a
/// mutable profile). Compiled in, so the authority identity's digest of each binary covers it.
pub const TOOL_PATH: &str = match option_env!("CORDON_TOOL_PATH") {
    Some(path) => path,
    None => "/usr/sbin:/usr/bin:/sbin:/bin",
};

/// A host tool to run to completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// How long it may take.
    pub timeout: Duration,
    /// The most bytes of stdout and of stderr kept (the rest is read and dropped).
    pub max_output: u64,
}

impl Tool {
    /// `program args…` with a 60 s timeout and 16 MiB of output at most.
    #[must_use]
    pub fn new(program: impl Into<PathBuf>, args: &[&str]) -> Self {
        Self {
            program: program.into(),
            args: args.iter().map(OsString::from).collect(),
            timeout: Duration::from_secs(60),
            max_output: 16 << 20,
        }
    }

    /// The command line, for messages.
    #[must_use]
    pub fn display(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// What a tool left behind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOutput {
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Kept stdout.
    pub stdout: Vec<u8>,
    /// Kept stderr.
    pub stderr: Vec<u8>,
    /// Whether either stream went over `max_output`.
    pub truncated: bool,
}

impl ToolOutput {
    /// Whether it exited 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// A successful output with this stdout (for fakes and tests).
    #[must_use]
    pub fn ok(stdout: &[u8]) -> Self {
        Self {
            code: Some(0),
            stdout: stdout.to_vec(),
            ..Self::default()
        }
    }

    /// A failed output with this stderr (for fakes and tests).
    #[must_use]
    pub fn failed(stderr: &str) -> Self {
        Self {
            code: Some(1),
            stderr: stderr.as_bytes().to_vec(),
            ..Self::default()
        }
    }
}

/// A mount the host makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRequest {
    /// A tmpfs with these options (`size=…,nr_inodes=…,mode=…,uid=…,gid=…`), `nosuid,nodev`.
    Tmpfs {
        /// The mount point.
        target: PathBuf,
        /// The tmpfs options.
        options: String,
    },
    /// An overlay, `nosuid,nodev`.
    Overlay {
        /// The mount point.
        target: PathBuf,
        /// The read-only lower directory.
        lower: PathBuf,
        /// The upper directory.
        upper: PathBuf,
        /// The work directory.
        work: PathBuf,
    },
}

impl MountRequest {
    /// The mount point.
    #[must_use]
    pub fn target(&self) -> &Path {
        match self {
            Self::Tmpfs { target, .. } | Self::Overlay { target, .. } => target,
        }
    }
}

/// A device node's type and numbers, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceNode {
    /// Character (`true`) or block device.
    pub char: bool,
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
}

/// Everything cordon does to a host, in one trait.
pub trait Host: std::fmt::Debug + Send + Sync {
    /// Run a tool to completion under its timeout, with an empty environment but [`TOOL_PATH`],
    /// stdin from `/dev/null`, output capped.
    ///
    /// # Errors
    /// It could not be started, or ran past its timeout (then it is killed).
    fn run(&self, tool: &Tool) -> io::Result<ToolOutput>;

    /// Spawn `tool` (its timeout and output cap unused: the caller supervises it) with piped
    /// stdout and stderr, stdin piped when `stdin` is set (else `/dev/null`), its environment
    /// cleared to [`TOOL_PATH`]: a container's `runtime create`, whose pipes the container
    /// inherits.
    ///
    /// # Errors
    /// It could not be started.
    fn spawn(&self, tool: &Tool, stdin: bool) -> io::Result<Child>;

    /// Read a host file a decision rests on.
    ///
    /// # Errors
    /// It could not be read: the caller reports that, never "empty".
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;

    /// The SHA-256 of a host file's bytes, streamed rather than read whole (a binary the
    /// authority identity covers).
    ///
    /// # Errors
    /// It could not be opened or read (`NotFound` when it does not exist).
    fn digest(&self, path: &Path) -> io::Result<Digest>;

    /// Make a mount.
    ///
    /// # Errors
    /// The kernel refused it.
    fn mount(&self, request: &MountRequest) -> io::Result<()>;

    /// Detach a mount.
    ///
    /// # Errors
    /// The kernel refused it.
    fn unmount(&self, target: &Path) -> io::Result<()>;

    /// Remove an empty directory of a kernel filesystem (a cgroup); one that does not exist is
    /// already gone.
    ///
    /// # Errors
    /// It exists and could not be removed (a cgroup with processes left in it).
    fn remove_dir(&self, path: &Path) -> io::Result<()>;

    /// The names in a directory of a kernel filesystem (a cgroup parent), sorted.
    ///
    /// # Errors
    /// It cannot be listed (`NotFound` when it does not exist).
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;

    /// The device node at `path` (following no link).
    ///
    /// # Errors
    /// It does not exist, or is not a character or block device.
    fn device(&self, path: &Path) -> io::Result<DeviceNode>;

    /// Rewrite a host file crash-safely under a lock: `edit` gets the current text (empty when
    /// the file does not exist) and returns the new text, or `None` to leave it as it is.
    ///
    /// # Errors
    /// Locking, reading, writing, syncing or renaming failed; the file is then unchanged.
    fn edit_file(&self, path: &Path, edit: &dyn Fn(&str) -> Option<String>) -> io::Result<()>;
}

/// A shared handle to the host.
pub type HostRef = Arc<dyn Host>;

/// The real host.
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

impl Linux {
    /// The real host, shared.
    #[must_use]
    pub fn shared() -> HostRef {
        Arc::new(Self)
    }
}

/// Read a pipe to its end on a thread, keeping at most `cap` bytes and counting all of them.
pub(crate) fn capped(
    mut r: impl Read + Send + 'static,
    cap: u64,
) -> std::thread::JoinHandle<(Vec<u8>, u64)> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = cap.saturating_sub(total);
                    let take = usize::try_from(room).unwrap_or(usize::MAX).min(n);
                    kept.extend_from_slice(&buf[..take]);
                    total += n as u64;
                }
            }
        }
        (kept, total)
    })
}

/// Wait for `child` under `tool`'s timeout, blocking (no polling interval added to every tool
/// call): a watchdog thread sends SIGKILL at the deadline unless told the child exited first.
/// The child is waited for without being reaped (`WNOWAIT`) until the watchdog is joined, so
/// the pid it signals is this child's, never a reused one.
fn wait_within(child: &mut Child, tool: &Tool) -> io::Result<std::process::ExitStatus> {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).map_err(io::Error::other)?);
    let (exited, watched) = std::sync::mpsc::channel::<()>();
    let timeout = tool.timeout;
    let watchdog = std::thread::spawn(move || {
        let late = matches!(
            watched.recv_timeout(timeout),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        );
        if late {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        late
    });
    let waited = loop {
        match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(nix::errno::Errno::EINTR) => {}
            other => break other,
        }
    };
    let _ = exited.send(());
    let late = watchdog.join().unwrap_or(true);
    // Reaped only now, after the watchdog can no longer signal the pid.
    let status = child.wait()?;
    waited.map_err(io::Error::from)?;
    if late {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("`{}` ran past {:?}", tool.display(), tool.timeout),
        ));
    }
    Ok(status)
}

impl Host for Linux {
    fn run(&self, tool: &Tool) -> io::Result<ToolOutput> {
        let mut child = Command::new(&tool.program)
            .args(&tool.args)
            .env_clear()
            .env("PATH", TOOL_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().map(|r| capped(r, tool.max_output));
        let err = child.stderr.take().map(|r| capped(r, tool.max_output));
        let status = wait_within(&mut child, tool)?;
        let join = |h: Option<std::thread::JoinHandle<(Vec<u8>, u64)>>| {
            h.and_then(|h| h.join().ok()).unwrap_or_default()
        };
        let (stdout, out_total) = join(out);
        let (stderr, err_total) = join(err);
        Ok(ToolOutput {
            code: status.code(),
            stdout,
            stderr,
            truncated: out_total > tool.max_output || err_total > tool.max_output,
        })
    }

    fn spawn(&self, tool: &Tool, stdin: bool) -> io::Result<Child> {
        // Nothing of the supervisor's environment reaches the runtime, or through it the
        // container: the bundle's process.env is the container's whole environment.
        Command::new(&tool.program)
            .args(&tool.args)
            .env_clear()
            .env("PATH", TOOL_PATH)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn digest(&self, path: &Path) -> io::Result<Digest> {
        Digest::of_reader(File::open(path)?).map(|(digest, _)| digest)
    }

    fn mount(&self, request: &MountRequest) -> io::Result<()> {
        use nix::mount::{MsFlags, mount};
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        let r = match request {
            MountRequest::Tmpfs { target, options } => mount(
                Some("tmpfs"),
                target,
                Some("tmpfs"),
                flags,
                Some(options.as_str()),
            ),
            MountRequest::Overlay {
                target,
                lower,
                upper,
                work,
            } => {
                let options = format!(
                    "lowerdir={},upperdir={},workdir={}",
                    lower.display(),
                    upper.display(),
                    work.display()
                );
                mount(
                    Some("overlay"),
                    target,
                    Some("overlay"),
                    flags,
                    Some(options.as_str()),
                )
            }
        };
        r.map_err(io::Error::from)
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        match fs::remove_dir(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            // Only directories are cgroups; the controller files beside them are not.
            if entry.file_type()?.is_dir() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn device(&self, path: &Path) -> io::Result<DeviceNode> {
        use nix::sys::stat::{SFlag, lstat, major, minor};
        let st = lstat(path).map_err(io::Error::from)?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        let char = if kind == SFlag::S_IFCHR {
            true
        } else if kind == SFlag::S_IFBLK {
            false
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a device node", path.display()),
            ));
        };
        Ok(DeviceNode {
            char,
            major: major(st.st_rdev),
            minor: minor(st.st_rdev),
        })
    }

    fn edit_file(&self, path: &Path, edit: &dyn Fn(&str) -> Option<String>) -> io::Result<()> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
            .to_string_lossy()
            .into_owned();
        // The lock lives beside the file, not on it: the rename replaces the file's inode.
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(dir.join(format!(".{name}.cordon-lock")))?;
        let _lock = Flock::lock(lock_file, FlockArg::LockExclusive).map_err(|(_, e)| e)?;
        let (text, mode) = match fs::read(path) {
            Ok(bytes) => {
                let mode = fs::metadata(path)?.permissions().mode() & 0o7777;
                // Never rewrite bytes we could not read back exactly.
                let text = String::from_utf8(bytes).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "the file is not UTF-8")
                })?;
                (text, mode)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => (String::new(), 0o644),
            Err(e) => return Err(e),
        };
        let Some(new) = edit(&text) else {
            return Ok(());
        };
        let scratch = dir.join(format!(".{name}.cordon-new"));
        // A scratch file a crashed earlier edit left is ours to replace (we hold the lock).
        match fs::remove_file(&scratch) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut f: File = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&scratch)?;
        f.write_all(new.as_bytes())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&scratch, path)?;
        File::open(dir)?.sync_all()
    }
}

pub mod fake {
    //! A recording, failure-injecting [`Host`] for tests: it answers tool runs from a script of
    //! replies, reads from an in-memory file table, records every call in order, and fails the
    //! call that a test names — so every "cannot establish" path can be driven without a kernel.
    //! [`Interposed`] is its counterpart for tests that run on the real host: the real calls,
    //! recorded, with the named ones failed or rewritten.

    use std::collections::BTreeMap;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::process::Child;
    use std::sync::Mutex;

    use super::{DeviceNode, Digest, Host, MountRequest, Tool, ToolOutput};

    /// One recorded call.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        /// A tool run: its command line.
        Run(String),
        /// A spawn: its command line.
        Spawn(String),
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
    }

    #[derive(Debug, Default)]
    struct State {
        calls: Vec<Call>,
        files: BTreeMap<PathBuf, Vec<u8>>,
        dirs: BTreeMap<PathBuf, Vec<String>>,
        devices: BTreeMap<PathBuf, DeviceNode>,
        unreadable: Vec<PathBuf>,
        replies: Vec<(String, ToolOutput)>,
        fail_mounts: bool,
        fail_unmounts: bool,
        fail_edits: bool,
    }

    /// The fake host.
    #[derive(Debug, Default)]
    pub struct Fake {
        state: Mutex<State>,
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
            // A poisoned lock means a test already panicked; its state is still what it was.
            let mut s = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&mut s)
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
            self.with(|s| {
                s.calls.push(Call::Run(line.clone()));
                Ok(s.replies
                    .iter()
                    .find(|(needle, _)| line.contains(needle.as_str()))
                    .map(|(_, out)| out.clone())
                    .unwrap_or_else(|| ToolOutput::ok(b"")))
            })
        }

        fn spawn(&self, tool: &Tool, _stdin: bool) -> io::Result<Child> {
            self.with(|s| s.calls.push(Call::Spawn(tool.display())));
            Err(io::Error::other("the fake host runs no processes"))
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

        fn device(&self, path: &Path) -> io::Result<DeviceNode> {
            self.with(|s| {
                s.calls.push(Call::Device(path.to_path_buf()));
                s.devices
                    .get(path)
                    .copied()
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
            })
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

    type Hook<A, R> = Box<dyn Fn(&A) -> R + Send + Sync>;

    /// The real host ([`Linux`](super::Linux)) with a test's hand on the seam, for tests that
    /// run real tools, mounts and containers: every call is recorded as a [`Call`], then either
    /// failed (when the `failing` predicate says so: a tool run answers a failed output without
    /// running, anything else an I/O error) or passed on — what `rewriting_spawns` makes of a
    /// spawn, what `rewriting_mounts` makes of a mount request. That is how a test makes
    /// `useradd` fail after a real `groupadd`, or removes one control from a bundle (an
    /// ablation) without a switch in product code.
    pub struct Interposed {
        calls: Mutex<Vec<Call>>,
        fail: Hook<Call, bool>,
        spawn: Hook<Tool, Tool>,
        mount: Hook<MountRequest, MountRequest>,
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

        /// Spawn what `rewrite` makes of each tool instead (it may also act first: change the
        /// bundle a `runc create` is about to read, say).
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
            super::Linux.run(tool)
        }

        fn spawn(&self, tool: &Tool, stdin: bool) -> io::Result<Child> {
            self.pass(Call::Spawn(tool.display()), || {
                super::Linux.spawn(&(self.spawn)(tool), stdin)
            })
        }

        fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
            self.pass(Call::Read(path.into()), || super::Linux.read(path))
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

        fn device(&self, path: &Path) -> io::Result<DeviceNode> {
            self.pass(Call::Device(path.into()), || super::Linux.device(path))
        }

        fn edit_file(&self, path: &Path, edit: &dyn Fn(&str) -> Option<String>) -> io::Result<()> {
            self.pass(Call::Edit(path.into()), || {
                super::Linux.edit_file(path, edit)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_past_its_timeout_is_killed_and_an_error() {
        let mut t = Tool::new("/bin/sleep", &["5"]);
        t.timeout = Duration::from_millis(100);
        let e = Linux.run(&t).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn tool_output_is_capped_and_the_environment_is_empty() {
        let mut t = Tool::new("/bin/sh", &["-c", "env; head -c 100000 /dev/zero"]);
        t.max_output = 1000;
        let out = Linux.run(&t).unwrap();
        assert!(out.success() && out.truncated);
        assert_eq!(out.stdout.len(), 1000);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("HOME="), "{text}");
    }

    #[test]
    fn edit_file_replaces_whole_and_leaves_no_scratch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cron.deny");
        fs::write(&path, "alice\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        Linux
            .edit_file(&path, &|t| Some(format!("{t}bob\n")))
            .unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "alice\nbob\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        // A scratch file a crash left is replaced, never read as the file.
        fs::write(dir.path().join(".cron.deny.cordon-new"), "").unwrap();
        Linux.edit_file(&path, &|_| Some(String::new())).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.ends_with("cordon-new")),
            "{names:?}"
        );
        // No change asked for: the file is untouched.
        Linux.edit_file(&path, &|_| None).unwrap();
    }

    /// Eight editors of one deny file at once (as eight leases' account steps are), each adding
    /// and then removing its own names: no edit is lost, and at the end only the file's own
    /// line is left.
    #[test]
    fn concurrent_deny_file_edits_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("at.deny");
        fs::write(&path, "root\n").unwrap();
        // Eight editors at once, each applying `edit` to each of its 25 names.
        let all_at_once = |edit: &(dyn Fn(&str, &str) -> String + Sync)| {
            std::thread::scope(|s| {
                for w in 0..8 {
                    let path = &path;
                    s.spawn(move || {
                        for i in 0..25 {
                            let name = format!("cordon-{w}-{i}");
                            Linux.edit_file(path, &|t| Some(edit(t, &name))).unwrap();
                        }
                    });
                }
            });
        };
        all_at_once(&|t, name| format!("{t}{name}\n"));
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1 + 8 * 25, "an edit was lost");
        all_at_once(&|t, name| {
            t.lines()
                .filter(|l| *l != name)
                .map(|l| format!("{l}\n"))
                .collect()
        });
        assert_eq!(fs::read_to_string(&path).unwrap(), "root\n");
    }

    #[test]
    fn the_fake_records_answers_and_fails_as_told() {
        let f = fake::Fake::new();
        f.file("/etc/passwd", "root:x:0:0::/root:/bin/sh\n")
            .unreadable("/etc/group")
            .reply("list", ToolOutput::ok(b"[]"));
        assert_eq!(f.read(Path::new("/etc/passwd")).unwrap().len(), 26);
        assert!(f.read(Path::new("/etc/group")).is_err());
        let out = f.run(&Tool::new("runc", &["list", "-f", "json"])).unwrap();
        assert_eq!(out.stdout, b"[]");
        assert_eq!(f.calls().len(), 3);
    }
}
