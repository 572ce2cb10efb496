//! The one seam between cordon's mechanisms and the host: every host tool run (the OCI
//! runtime's CLI, the account tools), every process spawned with live pipes (a container's
//! `runtime create`, the confined parser child) or taken on (a container's init), each under
//! the one supervisor of [`process`], every read of a host file that a decision rests on (passwd, group,
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
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::canonical::Digest;
pub use process::{Exit, Killer, Process};

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
    /// Its working directory (this process's when `None`).
    pub dir: Option<PathBuf>,
    /// Whether its environment holds `PATH=`[`TOOL_PATH`]; it is otherwise empty but for
    /// `env`.
    pub tool_path: bool,
    /// Variables set in its environment, after `PATH`.
    pub env: Vec<(OsString, OsString)>,
    /// The uid and gid it runs as, with no supplementary group (root only); this process's
    /// when `None`.
    pub user: Option<(u32, u32)>,
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
            dir: None,
            tool_path: true,
            env: Vec::new(),
            user: None,
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

/// A spawned process's standard input.
#[derive(Debug)]
pub enum Stdin {
    /// `/dev/null`.
    Null,
    /// A pipe the caller writes ([`Process::stdin`]).
    Pipe,
    /// This descriptor, given to the process (a connected socket).
    Fd(std::os::fd::OwnedFd),
}

/// Everything cordon does to a host, in one trait.
pub trait Host: std::fmt::Debug + Send + Sync {
    /// Run a tool to completion under its timeout, with an empty environment but [`TOOL_PATH`],
    /// stdin from `/dev/null`, output capped.
    ///
    /// # Errors
    /// It could not be started, or ran past its timeout (then it is killed).
    fn run(&self, tool: &Tool) -> io::Result<ToolOutput>;

    /// Spawn `tool` (its timeout and output cap unused: the caller supervises it through the
    /// returned [`Process`]) with piped stdout and stderr and its stdin as `stdin` says: a
    /// container's `runtime create`, whose pipes the container inherits, or a confined parser
    /// child (a transfer child's stdin is the connection the parent made).
    ///
    /// # Errors
    /// It could not be started.
    fn spawn(&self, tool: &Tool, stdin: Stdin) -> io::Result<Process>;

    /// Take on child `pid`, which this process did not spawn but is the parent of: a
    /// container's init, reparented to this subreaper when `runtime create` exited. No pipes.
    ///
    /// # Errors
    /// It cannot be supervised.
    fn adopt(&self, pid: i32) -> io::Result<Process>;

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

    /// The regular files in a directory of a kernel filesystem (`/sys/…/vulnerabilities`),
    /// sorted.
    ///
    /// # Errors
    /// It cannot be listed (`NotFound` when it does not exist).
    fn list_files(&self, path: &Path) -> io::Result<Vec<String>>;

    /// Make a directory of a kernel filesystem (a cgroup), mode 0755.
    ///
    /// # Errors
    /// It could not be made (`AlreadyExists` when it exists).
    fn make_dir(&self, path: &Path) -> io::Result<()>;

    /// Give a kernel filesystem's file to `uid`:`gid` (a cgroup's `cgroup.procs`, delegating
    /// the moves into that cgroup), following no link.
    ///
    /// # Errors
    /// It does not exist, or the kernel refused.
    fn give(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()>;

    /// Write `bytes` in one write to an existing control file of a kernel filesystem (a
    /// cgroup's limit or `cgroup.procs`), never creating or truncating it, following no link.
    ///
    /// # Errors
    /// It does not exist, or the kernel refused the value.
    fn write_control(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;

    /// The device node at `path` (following no link).
    ///
    /// # Errors
    /// It does not exist, or is not a character or block device.
    fn device(&self, path: &Path) -> io::Result<DeviceNode>;

    /// The owner uid of process `pid` and the inode of its pid namespace (`/proc/<pid>`'s owner,
    /// `/proc/<pid>/ns/pid`'s inode, `None` when that cannot be read — another user's process,
    /// say): how a rootless release proves a container's processes gone.
    ///
    /// # Errors
    /// `NotFound` once it has exited; any other error is an unreadable process.
    fn pid_namespace(&self, pid: u32) -> io::Result<(u32, Option<u64>)>;

    /// SIGKILL process `pid` if it runs as `uid` (its real, effective, saved or filesystem uid):
    /// through a pidfd opened before the uid is read, so a pid reused in between is never
    /// signalled. `false` when it is gone or runs as another uid.
    ///
    /// # Errors
    /// It cannot be looked at, or the kernel refused the signal.
    fn kill_of(&self, pid: u32, uid: u32) -> io::Result<bool>;

    /// The identity (the inode of `/proc/<pid>/ns/<kind>`) of namespace `kind` (`net`, `ipc`,
    /// `mnt`, …) of process `pid`, or of this process when `pid` is `None`: two processes share
    /// a namespace exactly when these agree.
    ///
    /// # Errors
    /// The process or the namespace cannot be looked at.
    fn namespace(&self, pid: Option<u32>, kind: &str) -> io::Result<u64>;

    /// Rewrite a host file crash-safely under a lock: `edit` gets the current text (empty when
    /// the file does not exist) and returns the new text, or `None` to leave it as it is.
    ///
    /// # Errors
    /// Locking, reading, writing, syncing or renaming failed; the file is then unchanged.
    fn edit_file(&self, path: &Path, edit: &dyn Fn(&str) -> Option<String>) -> io::Result<()>;

    /// Make `path`'s parent directory, this process's, mode 0700, and in it a FIFO at `path`,
    /// mode 0644 (neither following nor replacing anything there): a container's start gate.
    /// Its entrypoint reaches it through a bind and opens and reads it before it runs anything
    /// of the workload — whatever uid the runtime gave it, so that a wrong one reaches the
    /// posture check rather than failing at the gate; only its maker may write it, and no other
    /// process of the host can reach it to open it first (a reader it held would open the
    /// gate's writing end before the entrypoint did).
    ///
    /// # Errors
    /// The parent or the FIFO exists, or the kernel refused.
    fn make_fifo(&self, path: &Path) -> io::Result<()>;

    /// Open the FIFO at `path` for writing without waiting, following no link, and remove its
    /// name (whoever holds it open keeps it): `None` while no process holds it open for
    /// reading. The writing end is blocking once open.
    ///
    /// # Errors
    /// It is not a FIFO, or it could not be opened or unlinked.
    fn open_gate(&self, path: &Path) -> io::Result<Option<File>>;
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

/// See `process` to its end as [`Host::run`] does: its output kept to `tool`'s cap, killed at
/// `tool`'s timeout (then an error). For a process that was spawned to be prepared before it
/// runs (placed in a cgroup, then released through its stdin).
///
/// # Errors
/// It ran past its timeout, or could not be waited for.
pub fn collect(mut process: Process, tool: &Tool) -> io::Result<ToolOutput> {
    let out = process.stdout.take().map(|r| capped(r, tool.max_output));
    let err = process.stderr.take().map(|r| capped(r, tool.max_output));
    process.kill_at(std::time::Instant::now() + tool.timeout);
    let exit = process.wait()?;
    if exit.killed_at_deadline {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("`{}` ran past {:?}", tool.display(), tool.timeout),
        ));
    }
    let join = |h: Option<std::thread::JoinHandle<(Vec<u8>, u64)>>| {
        h.and_then(|h| h.join().ok()).unwrap_or_default()
    };
    let (stdout, out_total) = join(out);
    let (stderr, err_total) = join(err);
    Ok(ToolOutput {
        code: exit.status.code(),
        stdout,
        stderr,
        truncated: out_total > tool.max_output || err_total > tool.max_output,
    })
}

/// `/proc/<pid>/ns/<kind>`, or `/proc/self/ns/<kind>` for this process.
#[must_use]
pub fn namespace_path(pid: Option<u32>, kind: &str) -> PathBuf {
    let who = pid.map_or_else(|| "self".to_owned(), |p| p.to_string());
    PathBuf::from(format!("/proc/{who}/ns/{kind}"))
}

impl Host for Linux {
    fn run(&self, tool: &Tool) -> io::Result<ToolOutput> {
        collect(self.spawn(tool, Stdin::Null)?, tool)
    }

    fn spawn(&self, tool: &Tool, stdin: Stdin) -> io::Result<Process> {
        // Nothing of the supervisor's environment reaches the tool, the runtime, or through it
        // the container: the bundle's process.env is the container's whole environment.
        let mut command = Command::new(&tool.program);
        command
            .args(&tool.args)
            .env_clear()
            .stdin(match stdin {
                Stdin::Null => Stdio::null(),
                Stdin::Pipe => Stdio::piped(),
                Stdin::Fd(fd) => Stdio::from(fd),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if tool.tool_path {
            command.env("PATH", TOOL_PATH);
        }
        command.envs(tool.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &tool.dir {
            command.current_dir(dir);
        }
        // std drops every supplementary group (setgroups(0)) before setuid when root sets a uid
        // without groups: the tool holds exactly this uid and gid.
        if let Some((uid, gid)) = tool.user {
            command.uid(uid).gid(gid);
        }
        // A process group of its own: a terminal's Ctrl-C reaches the supervisor alone, which
        // stops the candidate and releases; a `runtime delete` mid-release is never cut short.
        command.process_group(0);
        let mut child = command.spawn()?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        // The std handle is dropped (that neither kills nor reaps): the waiter reaps the pid.
        Ok(Process::new(
            process::Waiter::watch(pid),
            child.stdin.take().map(|p| OwnedFd::from(p).into()),
            child.stdout.take().map(|p| OwnedFd::from(p).into()),
            child.stderr.take().map(|p| OwnedFd::from(p).into()),
        ))
    }

    fn adopt(&self, pid: i32) -> io::Result<Process> {
        Ok(Process::new(process::Waiter::watch(pid), None, None, None))
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
            // Only directories are cgroups (or processes); the files beside them are not. An
            // entry gone between the listing and its examination (a process that exited, in
            // /proc) is not there.
            match entry.file_type() {
                Ok(t) if t.is_dir() => names.push(entry.file_name().to_string_lossy().into_owned()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        names.sort();
        Ok(names)
    }

    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn make_dir(&self, path: &Path) -> io::Result<()> {
        fs::DirBuilder::new().mode(0o755).create(path)
    }

    fn give(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        use nix::unistd::{Gid, Uid, fchownat};
        fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io::Error::from)
    }

    fn write_control(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)?;
        // A control file takes one value per write: a short write is a refused value.
        let n = f.write(bytes)?;
        if n == bytes.len() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{} took {n} of {} bytes",
                path.display(),
                bytes.len()
            )))
        }
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

    fn pid_namespace(&self, pid: u32) -> io::Result<(u32, Option<u64>)> {
        use std::os::unix::fs::MetadataExt;
        let owner = fs::metadata(format!("/proc/{pid}"))?.uid();
        match fs::metadata(format!("/proc/{pid}/ns/pid")) {
            Ok(m) => Ok((owner, Some(m.ino()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(e),
            Err(_) => Ok((owner, None)),
        }
    }

    fn namespace(&self, pid: Option<u32>, kind: &str) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(namespace_path(pid, kind)).map(|m| m.ino())
    }

    fn make_fifo(&self, path: &Path) -> io::Result<()> {
        use nix::sys::stat::{FchmodatFlags, Mode, fchmodat};
        let parent = path
            .parent()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a gate needs a parent"))?;
        fs::DirBuilder::new().mode(0o700).create(parent)?;
        let mode = Mode::S_IRUSR | Mode::S_IWUSR | Mode::S_IRGRP | Mode::S_IROTH;
        nix::unistd::mkfifo(path, mode).map_err(io::Error::from)?;
        // Set again: the umask applies to mkfifo, and every reader needs its bit (by name: the
        // parent was made above, 0700, and nobody else can put a link there).
        fchmodat(
            nix::fcntl::AT_FDCWD,
            path,
            mode,
            FchmodatFlags::FollowSymlink,
        )
        .map_err(io::Error::from)
    }

    fn open_gate(&self, path: &Path) -> io::Result<Option<File>> {
        use std::os::unix::fs::FileTypeExt as _;
        // ENXIO: no reader yet. O_NONBLOCK only for the open; the write that opens the gate
        // blocks as any pipe write does (one byte into an empty pipe never waits).
        let file = match OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)
        {
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => return Ok(None),
            opened => opened?,
        };
        if !file.metadata()?.file_type().is_fifo() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a FIFO", path.display()),
            ));
        }
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        fs::remove_file(path)?;
        Ok(Some(file))
    }

    fn kill_of(&self, pid: u32, uid: u32) -> io::Result<bool> {
        use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
        let gone = |e: &rustix::io::Errno| *e == rustix::io::Errno::SRCH;
        let Some(id) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
            return Ok(false);
        };
        // The pidfd first: from here on it names this process, whatever the pid comes to mean.
        let fd = match pidfd_open(id, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(e) if gone(&e) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        // A process that exits now reads as ESRCH (or NotFound): gone.
        let status = match fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(t) => t,
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(nix::libc::ESRCH) =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let ours = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .is_some_and(|ids| ids.split_whitespace().any(|u| u == uid.to_string()));
        // The pidfd names the process that had the pid when it was opened; if that one has
        // exited since, the signal below fails with ESRCH, whatever the pid names now.
        if !ours {
            return Ok(false);
        }
        match pidfd_send_signal(&fd, Signal::KILL) {
            Ok(()) => Ok(true),
            Err(e) if gone(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
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

pub mod fake;
pub mod process;

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

    /// A process is killed only as the uid it runs as: asked for another uid it is left
    /// running, asked for its own it dies; a pid that is gone is `false`.
    #[test]
    fn kill_of_signals_a_process_only_as_its_own_uid() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        cordon_testkit::require_root("the process under test runs as another uid");
        // An id no account holds (above every test block), so nothing else of it runs.
        let uid = 3_999_917;
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("60")
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!Linux.kill_of(pid, uid + 1).unwrap());
        assert!(child.try_wait().unwrap().is_none(), "killed as another uid");
        assert!(Linux.kill_of(pid, uid).unwrap());
        assert_eq!(child.wait().unwrap().signal(), Some(9));
        assert!(!Linux.kill_of(pid, uid).unwrap());
    }

    /// A start gate is a FIFO anyone may read and only its maker write, mode 0644, in a
    /// directory of its own only its maker may enter; its writer opens only once a reader holds
    /// it, and the open takes its name away; what is not a FIFO is refused, and nothing is made
    /// over what exists.
    #[test]
    fn a_start_gate_opens_only_for_its_reader_and_leaves_no_name() {
        use std::io::Read as _;
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        let dir = tempfile::tempdir().unwrap();
        let gate = dir.path().join("gate").join("fifo");
        Linux.make_fifo(&gate).unwrap();
        let m = fs::symlink_metadata(&gate).unwrap();
        assert!(m.file_type().is_fifo());
        assert_eq!(m.mode() & 0o7777, 0o644);
        let parent = fs::symlink_metadata(dir.path().join("gate")).unwrap();
        assert!(parent.is_dir());
        assert_eq!(parent.mode() & 0o7777, 0o700);
        // Another account of the host cannot hold it open first (a reader would open the
        // writing end before the entrypoint did): refused by the directory alone — the same
        // non-blocking open succeeds once the directory lets it through.
        cordon_testkit::require_root("the foreign reader runs as another uid");
        let foreign = || {
            std::process::Command::new("/bin/dd")
                .arg(format!("if={}", gate.display()))
                .args(["iflag=nonblock", "count=0", "status=none"])
                .uid(65_534)
                .gid(65_534)
                .output()
                .unwrap()
        };
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let refused = foreign();
        assert!(
            !refused.status.success()
                && String::from_utf8_lossy(&refused.stderr).contains("Permission denied"),
            "{refused:?}"
        );
        fs::set_permissions(dir.path().join("gate"), fs::Permissions::from_mode(0o711)).unwrap();
        assert!(foreign().status.success(), "the probe proves nothing");
        fs::set_permissions(dir.path().join("gate"), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            Linux.make_fifo(&gate).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(Linux.open_gate(&gate).unwrap().is_none(), "no reader yet");
        let reader = std::thread::spawn({
            let gate = gate.clone();
            move || {
                let mut line = String::new();
                File::open(gate).unwrap().read_to_string(&mut line).unwrap();
                line
            }
        });
        let mut held = loop {
            if let Some(f) = Linux.open_gate(&gate).unwrap() {
                break f;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert!(!gate.exists(), "the gate's name outlived its open");
        held.write_all(b"\n").unwrap();
        drop(held);
        assert_eq!(reader.join().unwrap(), "\n");
        let plain = dir.path().join("plain");
        fs::write(&plain, "").unwrap();
        assert!(Linux.open_gate(&plain).is_err());
    }

    #[test]
    fn a_supervised_child_is_killed_at_its_deadline_and_its_pid_let_go_only_once_reaped() {
        use std::os::unix::process::ExitStatusExt;
        let mut p = Linux
            .spawn(&Tool::new("/bin/sleep", &["5"]), Stdin::Pipe)
            .unwrap();
        assert!(p.stdin.is_some() && p.stdout.is_some() && p.stderr.is_some());
        p.kill_at(std::time::Instant::now() + Duration::from_millis(50));
        let exit = p.wait().unwrap();
        assert!(exit.killed_at_deadline && exit.status.signal() == Some(9));
        // Reaped once: a second reap is refused and a kill sends nothing.
        let p = Linux
            .spawn(&Tool::new("/bin/true", &[]), Stdin::Null)
            .unwrap();
        let waiter = process::Waiter::watch(p.pid());
        use process::Supervise;
        assert!(waiter.exited(None).unwrap());
        assert!(waiter.reap().unwrap().0.success());
        let e = waiter.reap().unwrap_err().to_string();
        assert!(e.contains("the process was reaped already"), "{e}");
        waiter.kill().unwrap();
        // A process that is not this one's child cannot be supervised: an error, not "exited".
        let later = std::time::Instant::now() + Duration::from_secs(10);
        let e = Linux
            .adopt(1)
            .unwrap()
            .exited_by(later)
            .unwrap_err()
            .to_string();
        assert!(e.contains("(os error 10)"), "{e}");
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
        let e = f.read(Path::new("/etc/group")).unwrap_err().to_string();
        assert!(e.contains("injected failure"), "{e}");
        let out = f.run(&Tool::new("runc", &["list", "-f", "json"])).unwrap();
        assert_eq!(out.stdout, b"[]");
        assert_eq!(f.calls().len(), 3);
    }
}
