//! Durable leases: every container and its resources (run directory, run account, mounts)
//! belong to one lease record, written before any of them exists and removed only after all of
//! them are proven gone.
//!
//! It owns the record format and its durability (0600, one hard link, fsynced, published by
//! link), the one-manager-per-executor lock, the lifecycle of one run (account → run directory
//! → bundle, checked right before launch → container), release (kill, delete, prove absence by
//! listing the runtime's containers with the exact labels, twice, unmount, remove the run
//! directory, remove the account, unlink the record), startup recovery of records no live
//! manager holds, and the quiescence check.
//!
//! If cleanup or the absence proof cannot be established the result is a [`Residue`] — a
//! no-decision listing what remains — never a pass or a fail, and nothing without this
//! executor's exact labels is ever touched to make a check pass.
//!
//! This module keeps the labels, the lock, the errors, the [`Setup`] and the [`Manager`]
//! itself; `record` the record format, `provision` a lease's life up to its launch, `release`
//! release and recovery, `observe` the lock-free view and the quiescence check.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};

use crate::account::{self, Account, AccountPolicy};
use crate::canonical::{Digest, to_canonical_json};
use crate::container::{Created, Stdio3};
use crate::host::MountRequest;
use crate::runtime::{CgroupProbe, Finished, OutputCaps, Runtime};
use crate::store::{self, Store};
pub use cordon_evidence::residue::Leftover;

mod evidence;
pub mod incident;
mod observe;
pub mod per_run;
mod provision;
pub mod quarantine;
mod record;
mod release;
pub mod rootless;
pub mod watchdog;

pub use evidence::{EVIDENCE_MAX, bounded, mount_table};
pub use observe::{Observed, Observer};
pub use record::*;

/// The annotation keys that carry a lease's exact labels on its container.
pub const LABEL_EXECUTOR: &str = "org.cordon.executor";
/// The lease id label.
pub const LABEL_LEASE: &str = "org.cordon.lease";
/// The authority label.
pub const LABEL_AUTHORITY: &str = "org.cordon.authority";
/// The store label: the store root whose records own the container.
pub const LABEL_STORE: &str = "org.cordon.store";

/// The run-directory name of a run's start gate's directory (its maker's alone, 0700), under a
/// runtime whose init settles only as it execs the entrypoint
/// ([`crate::runtime::Kind::settles_at_exec`]).
pub const GATE_DIR: &str = "gate";

/// The marker `cordon-reap` or a lease's [`watchdog`] leaves in a lease's run directory before
/// it ends the lease's container: the supervisor's positive evidence that the kill came from
/// outside the run.
pub const ENDED_BY_REAP: &str = "ended-by-reap";

/// The owner file inside every run directory: which executor, store and lease it belongs to.
pub const OWNER_FILE: &str = "owner.json";

/// How long past its deadline a lease whose supervisor still holds the executor is left
/// before `cordon-reap` kills its container.
pub const EXPIRY_GRACE: Duration = Duration::from_secs(30);

/// The cgroup parent of an executor's containers: everything under it is this executor's, so
/// the quiescence check and recovery can list it without touching anyone else's.
#[must_use]
pub fn cgroup_parent(executor: &str) -> String {
    format!("/cordon/{executor}")
}

/// The name of a patcher's bounded child cgroup inside its container's cgroup (prebuild): the
/// host makes it before the container, and a release removes it before its parent.
pub const CHILD_CGROUP: &str = "child";

/// The name of the leaf inside a container's cgroup that holds its other processes when it
/// has a bounded child on cgroup v2 (where a cgroup with processes cannot enable controllers
/// for its children); made and released as [`CHILD_CGROUP`] is.
pub const MAIN_CGROUP: &str = "main";

/// The cgroups a release removes inside a container's cgroup, before the cgroup itself.
pub const NESTED_CGROUPS: [&str; 2] = [CHILD_CGROUP, MAIN_CGROUP];

/// The cgroup path (the bundle's `cgroupsPath`) of a lease's container.
#[must_use]
pub fn cgroup_path(executor: &str, lease: &str) -> String {
    format!("{}/{lease}", cgroup_parent(executor))
}

/// Whether `executor` is a safe name: it becomes a file name in the store and a cgroup path.
/// Whether `executor` is a safe executor id: 1 to 64 of A-Z, a-z, 0-9, `-`, `_`, `.`, not
/// starting with a dot (a host lock's name).
#[must_use]
pub fn executor_ok(executor: &str) -> bool {
    !executor.is_empty()
        && executor.len() <= 64
        && !executor.starts_with('.')
        && executor
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// cordon's runtime state root when none is given: no other tool's containers live under it.
pub const DEFAULT_STATE_ROOT: &str = "/run/cordon-runc";

/// Where executors' locks live: one fixed directory per host, not a flag, so no second
/// reaper — another store, another state root, another run directory — can believe it owns an
/// executor that a live supervisor holds.
pub const LOCK_DIR: &str = "/run/cordon-locks";

/// Open (creating it, and its directory 0700) a host lock file in [`LOCK_DIR`]: a regular file
/// of this user's, readable and writable by it alone. Anything else planted there — a link
/// (`O_NOFOLLOW`), a FIFO (`O_NONBLOCK`: the open never waits for a writer), another user's
/// file or one others may open — is refused rather than locked.
///
/// # Errors
/// It cannot be made or opened, or is not such a file.
pub fn open_lock_file(path: &Path) -> std::io::Result<File> {
    if let Some(parent) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the lock is not a regular file of this user's, closed to others",
        ));
    }
    Ok(f)
}

/// How often, and how far apart, a busy executor's lock is tried again before it counts as
/// busy: long enough for another executor's recovery to check the file and let go.
const BUSY_RETRIES: u32 = 10;
const BUSY_RETRY: Duration = Duration::from_millis(20);

/// How often [`lock_at`] reopens a lock file that was removed under it before giving up.
const LOCK_TRIES: usize = 8;

/// Whether `file` is still the file `path` names (same device and inode).
fn names(file: &File, path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let (held, named) = (file.metadata()?, fs::symlink_metadata(path)?);
    Ok(held.dev() == named.dev() && held.ino() == named.ino())
}

/// Take `arg` (a non-blocking flock) on the host lock file at `path` ([`open_lock_file`]),
/// making sure, once taken, that the path still names the file locked: recovery removes lock
/// files nobody holds ([`remove_unheld_locks`]), and a lock on a removed file would guard
/// nothing. `Ok(Err(file))`: another holds it (the file, to name them).
///
/// # Errors
/// The file cannot be opened or trusted, or was removed under every try.
pub fn lock_at(path: &Path, arg: FlockArg) -> std::io::Result<Result<Flock<File>, File>> {
    for _ in 0..LOCK_TRIES {
        let f = open_lock_file(path)?;
        let lock = match Flock::lock(f, arg) {
            Ok(lock) => lock,
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => return Ok(Err(f)),
            Err((_, e)) => return Err(e.into()),
        };
        match names(&lock, path) {
            Ok(true) => return Ok(Ok(lock)),
            // Removed (or replaced) between the open and the lock: open the path again.
            Ok(false) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "{} was removed under every one of {LOCK_TRIES} tries",
        path.display()
    )))
}

/// Remove every lock file in `dir` that nobody holds, except `keep` (the caller's own): an
/// executor's lock file carries no state (the lock is only a meeting point), and one left per
/// executor ever run would pile up. Each is removed while this process holds it exclusively,
/// and every locker checks after locking that its path still names the file it locked
/// ([`lock_at`]), so no stage is left holding a removed file. Best effort: a file that cannot
/// be taken or removed is left. The names removed.
pub fn remove_unheld_locks(dir: &Path, keep: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path == keep || path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(f) = open_lock_file(&path) else {
            continue;
        };
        let Ok(lock) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        if names(&lock, &path).unwrap_or(false) && fs::remove_file(&path).is_ok() {
            removed.push(entry.file_name().to_string_lossy().into_owned());
        }
        drop(lock);
    }
    removed
}

/// What cleanup could not remove: the outcome is a no-decision that lists it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, miette::Diagnostic, Serialize)]
#[error("cleanup could not be established; residue: {}", .items.join("; "))]
#[diagnostic(
    code(cordon::lease::residue),
    help(
        "inspect by hand; cordon-reap retries and never deletes anything without this executor's exact labels"
    )
)]
pub struct Residue {
    /// One line per thing left.
    pub items: Vec<String>,
}

/// Why a lease operation failed (all no-decisions).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LeaseError {
    /// A signal stopped the run before the lease's work began.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Interrupted(#[from] crate::interrupt::Interrupted),
    /// This process sees another mount namespace than the host's init: the mounts it would
    /// remove or prove absent are not the host's.
    #[error(
        "this process's mount namespace is not the host's (the first mount of {ours} is {our_id}, of {init}'s {init_id})"
    )]
    #[diagnostic(
        code(cordon::lease::mount_namespace),
        help(
            "run cordon in the host's mount namespace: a service unit without ProtectSystem, PrivateTmp, ProtectHostname or any other option that gives it a private one"
        )
    )]
    MountNamespace {
        /// This process's mount table.
        ours: PathBuf,
        /// Its first mount's id.
        our_id: String,
        /// The host init's mount table.
        init: PathBuf,
        /// Its first mount's id.
        init_id: String,
    },
    /// Another manager holds this executor.
    #[error("another cordon manager holds executor {executor}{}", held_by(.holders))]
    #[diagnostic(
        code(cordon::lease::busy),
        help("one manager per executor: wait for it, or use another executor id")
    )]
    Busy {
        /// The executor.
        executor: String,
        /// The processes holding its lock, as the kernel lists them (`/proc/locks`; none when
        /// they cannot be told).
        holders: Vec<u32>,
    },
    /// A record is corrupt, a link, or not what cordon writes.
    #[error("lease record {path} is unsafe: {why}")]
    #[diagnostic(
        code(cordon::lease::record),
        help("recovery stops here: inspect the record by hand")
    )]
    Record {
        /// The record.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The executor id is not a safe name.
    #[error("executor id {executor:?} is not 1 to 64 of A-Z, a-z, 0-9, '-', '_', '.'")]
    #[diagnostic(code(cordon::lease::executor))]
    Executor {
        /// The id given.
        executor: String,
    },
    /// The run directory already exists.
    #[error("run directory {0} already exists")]
    #[diagnostic(code(cordon::lease::run_dir_exists))]
    RunDirExists(PathBuf),
    /// A protected file changed between writing and launch.
    #[error("protected file {path} changed before launch: {why}")]
    #[diagnostic(code(cordon::lease::protected))]
    Protected {
        /// The file.
        path: PathBuf,
        /// What changed.
        why: String,
    },
    /// A filesystem step failed.
    #[error("{op} {path}")]
    #[diagnostic(code(cordon::lease::io))]
    Io {
        /// What was done.
        op: &'static str,
        /// To what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The store failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] store::StoreError),
    /// The account could not be made.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Account(#[from] account::AccountError),
    /// The runtime failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// Encoding failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Canonical(#[from] crate::canonical::CanonicalError),
    /// Cleanup left residue.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Residue(#[from] Residue),
    /// A quarantine stops new work here.
    #[error(
        "{} is quarantined ({}: {}), record {id} at {path}",
        quarantine.scope,
        quarantine.cause.as_str(),
        crate::text::printable(&quarantine.why)
    )]
    #[diagnostic(
        code(cordon::lease::quarantined),
        help(
            "read the record and the receipts of its lease; once the cause is dealt with, `cordon-reap --clear ID` proves quiescence and lifts it"
        )
    )]
    Quarantined {
        /// The record's id.
        id: String,
        /// Its path.
        path: PathBuf,
        /// The record.
        quarantine: Box<quarantine::Quarantine>,
    },
    /// `--clear` named no quarantine in force.
    #[error("no quarantine {id} is in force")]
    #[diagnostic(
        code(cordon::lease::no_quarantine),
        help("`cordon-reap --status` lists the quarantines in force with their ids")
    )]
    NoQuarantine {
        /// The id given.
        id: String,
    },
    /// A lease of an earlier boot is still recorded: the host reset under it and no recovery
    /// has classified it.
    #[error("lease {lease} was taken on an earlier boot and no recovery has run since")]
    #[diagnostic(
        code(cordon::lease::unrecovered),
        help(
            "run `cordon-reap` (the startup recovery): it classifies the host reset, quarantines what the lease held and records the incident"
        )
    )]
    Unrecovered {
        /// The lease.
        lease: String,
    },
    /// The candidate's run already ended in an incident under this authority.
    #[error(
        "candidate {} ended in an incident under this authority ({}, lease {}, {}): it is not run again under it",
        .0.incident.candidate,
        .0.incident.cause.as_str(),
        .0.incident.lease,
        .0.receipt.as_ref().map_or_else(|| "no receipt was stored".to_owned(), |r| format!("receipt {r}"))
    )]
    #[diagnostic(
        code(cordon::lease::incident),
        help(
            "seed 001's checklist, step 7: a change of image, seccomp, mounts, device policy or toolchain is a new authority identity; record {} says what happened",
            .0.path.display()
        )
    )]
    Incident(Box<incident::Found>),
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LeaseError + use<> {
    let path = path.to_path_buf();
    move |source| LeaseError::Io { op, path, source }
}

/// ` (held by pid N[, M…])`, or nothing when the holders cannot be told.
fn held_by(pids: &[u32]) -> String {
    if pids.is_empty() {
        return String::new();
    }
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!(" (held by pid {})", pids.join(", "))
}

/// Who holds an flock on `file`, for a line an operator reads: `pid N (comm)`, comma-separated,
/// or a phrase saying the kernel does not name them. The command is the holder's own text:
/// the caller escapes the line before the terminal.
#[must_use]
pub fn lock_holders_named(file: &File) -> String {
    let holders: Vec<String> = lock_holders(file)
        .into_iter()
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim_end())
        })
        .collect();
    if holders.is_empty() {
        "a process /proc/locks does not name".to_owned()
    } else {
        holders.join(", ")
    }
}

/// The processes the kernel lists as holding an flock on `file` (`/proc/locks`: the lock's
/// device as `major:minor` in hex and its inode): who to wait for, in a busy message. Empty
/// when it cannot be read.
#[must_use]
pub fn lock_holders(file: &File) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(meta), Ok(locks)) = (file.metadata(), std::fs::read_to_string("/proc/locks")) else {
        return Vec::new();
    };
    let key = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(meta.dev()),
        nix::sys::stat::minor(meta.dev()),
        meta.ino()
    );
    let mut pids: Vec<u32> = locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // `N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END`; a blocked waiter's line
            // starts `N: -> FLOCK …` and holds nothing.
            (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&key.as_str()))
                .then(|| f.get(4)?.parse().ok())
                .flatten()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Where the manager works.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The executor id (labels every container).
    pub executor: String,
    /// The runtime and cordon's state root for it.
    pub runtime: Runtime,
    /// The parent of run directories (policy `run-dir`).
    pub run_root: PathBuf,
    /// Where the executor's lock lives ([`LOCK_DIR`] on a host; a test's own directory).
    pub lock_dir: PathBuf,
    /// The account policy.
    pub accounts: AccountPolicy,
    /// The cgroup filesystem root.
    pub cgroup_root: PathBuf,
    /// This mount namespace's mount table (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// The host init's mount table (`/proc/1/mountinfo`): the two must be one namespace's.
    pub init_mountinfo: PathBuf,
    /// Where the host's CDI specs are (`/etc/cdi` and `/var/run/cdi` on a host; a test's
    /// own): a GPU lane's devices are resolved from them.
    pub cdi_dirs: Vec<PathBuf>,
    /// The program a container lease's [`watchdog`] runs: a cordon stage binary, started with
    /// [`watchdog::WATCHDOG_ARG`] (`/proc/self/exe` in production: the supervisor's own).
    pub watchdog: PathBuf,
}

impl Setup {
    /// The executor's host-global lock, `<lock dir>/<executor>.lock`: one per host whatever
    /// the store, state root or run directory.
    #[must_use]
    pub fn lock_path(&self) -> PathBuf {
        self.lock_dir.join(format!("{}.lock", self.executor))
    }

    /// The host seam (the runtime's).
    #[must_use]
    pub fn host(&self) -> &dyn crate::host::Host {
        &*self.runtime.host
    }

    /// The cgroup of `lease`'s container, read through the host seam.
    #[must_use]
    pub fn probe(&self, lease: &str) -> CgroupProbe {
        CgroupProbe {
            host: self.runtime.host.clone(),
            root: self.cgroup_root.clone(),
            path: cgroup_path(&self.executor, lease),
        }
    }

    /// This executor's cgroup parent on each hierarchy (every controller's on v1).
    ///
    /// # Errors
    /// The hierarchy cannot be read.
    fn cgroup_parents(&self) -> Result<Vec<PathBuf>, LeaseError> {
        let parent = CgroupProbe {
            host: self.runtime.host.clone(),
            root: self.cgroup_root.clone(),
            path: cgroup_parent(&self.executor),
        };
        parent
            .dirs()
            .map_err(io("read the cgroup hierarchy at", &self.cgroup_root))
    }

    /// The cgroups left under this executor's parent (on every controller on v1), through the
    /// seam; a parent that does not exist holds none.
    ///
    /// # Errors
    /// The hierarchy or a parent cannot be read.
    fn leftover_cgroups(&self) -> Result<Vec<PathBuf>, LeaseError> {
        let mut out = Vec::new();
        for d in self.cgroup_parents()? {
            match self.host().list_dir(&d) {
                Ok(names) => out.extend(names.into_iter().map(|n| d.join(n))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("list", &d)(e)),
            }
        }
        Ok(out)
    }

    /// The mount points of this mount namespace (mountinfo field 5); an unreadable table is an
    /// error, never "no mounts". The namespace must be the host init's: in a private copy (a
    /// service unit with `ProtectSystem=`, say) an unmount would leave the host's mount in place
    /// and this table would then show it gone. A copied namespace gives every mount a new id, so
    /// the first mount's id (mountinfo field 1) tells the two apart.
    ///
    /// # Errors
    /// A table cannot be read, or the namespaces differ.
    pub fn mount_points(&self) -> Result<Vec<PathBuf>, LeaseError> {
        let read = |path: &Path| {
            self.host()
                .read(path)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(io("read", path))
        };
        let (table, init) = (read(&self.mountinfo)?, read(&self.init_mountinfo)?);
        let first_id = |t: &str| t.split(' ').next().unwrap_or_default().to_owned();
        if first_id(&table) != first_id(&init) {
            return Err(LeaseError::MountNamespace {
                ours: self.mountinfo.clone(),
                our_id: first_id(&table),
                init: self.init_mountinfo.clone(),
                init_id: first_id(&init),
            });
        }
        Ok(table
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .collect())
    }
}

/// The one manager of an executor on this host: holds its [`Setup::lock_path`].
#[derive(Debug)]
pub struct Manager {
    store: Store,
    setup: Setup,
    /// Held with others (intake's parser children), or alone (containers, recovery).
    shared: bool,
    /// The watchdog of each container lease this manager began and has not yet released:
    /// dropping one (this manager's end) closes its pipe, and it ends what is left.
    watchdogs: std::sync::Mutex<BTreeMap<String, crate::host::Process>>,
    _lock: Flock<File>,
}

/// A lease in progress.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Its record.
    pub record: Record,
    run_dir: PathBuf,
    account: Account,
    container: String,
    /// Protected files written into the run directory: path → (size, sha256).
    pub protected: BTreeMap<PathBuf, (u64, Digest)>,
    /// The declared secret written into the run directory, and its size (REQ-117: checked by
    /// owner, mode, link count and size before launch, never hashed).
    pub secret: Option<(PathBuf, u64)>,
}

impl Lease {
    /// `point`, when the lease record names it as a mount point: a crash after mounting must
    /// leave a record that says what to unmount.
    fn named_mount_point(&self, point: &Path) -> Result<PathBuf, LeaseError> {
        if self.record.mounts().any(|m| m == point) {
            Ok(point.to_path_buf())
        } else {
            Err(LeaseError::Protected {
                path: point.to_path_buf(),
                why: "the lease record does not name this mount point".into(),
            })
        }
    }

    /// The bundle directory inside the run directory.
    #[must_use]
    pub fn bundle_dir(&self) -> PathBuf {
        self.run_dir().join("bundle")
    }

    /// The run directory (every lease cordon begins names one).
    #[must_use]
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Whether `cordon-reap` ended this lease's container (it marks the run directory first).
    #[must_use]
    pub fn ended_by_reap(&self) -> bool {
        self.run_dir.join(ENDED_BY_REAP).exists()
    }

    /// The parser child's root inside the run directory: empty, root-owned, mode 0500.
    #[must_use]
    pub fn jail_dir(&self) -> PathBuf {
        self.run_dir().join("jail")
    }

    /// The run account.
    #[must_use]
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// The container id.
    #[must_use]
    pub fn container(&self) -> &str {
        &self.container
    }

    /// The cgroup path the bundle must use.
    #[must_use]
    pub fn cgroup_path(&self) -> String {
        cgroup_path(&self.record.executor, &self.record.lease)
    }
}

/// A fresh lease (or run) id: 32 hex digits from the kernel's random source.
#[must_use]
pub fn fresh_id() -> String {
    let mut bytes = [0u8; 16];
    // The kernel's random source; a lease id only needs to be unique, not secret.
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&t.to_le_bytes());
    }
    hex::encode(bytes)
}

impl Manager {
    /// Become the manager of `setup.executor`, alone: containers run and recovery acts only
    /// under this lock.
    ///
    /// # Errors
    /// Another manager holds it, or the store failed.
    pub fn open(store: &Store, setup: Setup) -> Result<Self, LeaseError> {
        Self::open_with(store, setup, false)
    }

    /// Become one of the managers of `setup.executor` that run only parser children (intake,
    /// materialization): many may hold it at once, none while a container stage or a recovery
    /// holds it alone, and none of them may recover (only a sole holder knows that every
    /// record's supervisor is gone).
    ///
    /// # Errors
    /// A sole manager holds it, or the store failed.
    pub fn open_shared(store: &Store, setup: Setup) -> Result<Self, LeaseError> {
        Self::open_with(store, setup, true)
    }

    fn open_with(store: &Store, setup: Setup, shared: bool) -> Result<Self, LeaseError> {
        if !executor_ok(&setup.executor) {
            return Err(LeaseError::Executor {
                executor: setup.executor,
            });
        }
        // Host-global, not per store: two stores never both believe they own one executor.
        let path = setup.lock_path();
        let arg = if shared {
            FlockArg::LockSharedNonblock
        } else {
            FlockArg::LockExclusiveNonblock
        };
        // Recovery of another executor holds this file a moment while it checks whether it
        // can remove it ([`remove_unheld_locks`]): a holder that stays is a busy executor, one
        // that lets go within the retries was that check.
        let mut tries = BUSY_RETRIES;
        let lock = loop {
            match lock_at(&path, arg).map_err(io("open lock", &path))? {
                Ok(lock) => break lock,
                Err(_) if tries > 0 => {
                    tries -= 1;
                    std::thread::sleep(BUSY_RETRY);
                }
                Err(f) => {
                    return Err(LeaseError::Busy {
                        executor: setup.executor.clone(),
                        holders: lock_holders(&f),
                    });
                }
            }
        };
        Ok(Self {
            store: store.clone(),
            setup,
            shared,
            watchdogs: std::sync::Mutex::default(),
            _lock: lock,
        })
    }

    /// The runtime this manager drives.
    #[must_use]
    pub fn runtime(&self) -> &Runtime {
        &self.setup.runtime
    }

    fn record_path(&self, lease: &str) -> PathBuf {
        self.store.path("leases", &format!("{lease}.json"))
    }

    /// This executor's leases and resources in this store, seen without the lock.
    fn view(&self) -> Observer {
        Observer::new(&self.store, self.setup.clone())
    }

    /// Quiescence, as [`Observer::check`] sees it.
    ///
    /// # Errors
    /// Something could not be inspected.
    pub fn check(&self) -> Result<Vec<Leftover>, LeaseError> {
        self.view().check()
    }
}

impl crate::exit::ExitClass for LeaseError {
    /// Every lease failure — a busy executor, a record in doubt, residue — is a no-decision (3).
    fn exit_class(&self) -> crate::ExitCode {
        crate::ExitCode::NoDecision
    }
}

#[cfg(test)]
mod tests;
