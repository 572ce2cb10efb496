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

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};

use crate::account::{self, Account, AccountPolicy};
use crate::canonical::{Digest, to_canonical_json};
use crate::container::{Created, Stdio3};
use crate::host::MountRequest;
use crate::runtime::{CgroupProbe, Finished, OutputCaps, Runtime};
use crate::store::{self, Store};
pub use cordon_evidence::residue::Leftover;

/// The annotation keys that carry a lease's exact labels on its container.
pub const LABEL_EXECUTOR: &str = "org.cordon.executor";
/// The lease id label.
pub const LABEL_LEASE: &str = "org.cordon.lease";
/// The authority label.
pub const LABEL_AUTHORITY: &str = "org.cordon.authority";
/// The store label: the store root whose records own the container.
pub const LABEL_STORE: &str = "org.cordon.store";

/// The marker `cordon-reap` leaves in a lease's run directory before it ends the lease's
/// container: the supervisor's positive evidence that the kill came from outside the run.
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

/// The cgroup path (the bundle's `cgroupsPath`) of a lease's container.
#[must_use]
pub fn cgroup_path(executor: &str, lease: &str) -> String {
    format!("{}/{lease}", cgroup_parent(executor))
}

/// Whether `executor` is a safe name: it becomes a file name in the store and a cgroup path.
fn executor_ok(executor: &str) -> bool {
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

/// The lease record schema (2: resources are one typed list).
pub const LEASE_SCHEMA: u32 = 3;

/// One host resource a lease owns. A record lists them in the order they are created; release
/// undoes them in reverse, one loop over this list, each kind with its own undo step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Resource {
    /// The per-run account (REQ-117).
    Account {
        /// `cordon-<8 hex>`.
        name: String,
        /// Its uid.
        uid: u32,
        /// Its gid.
        gid: u32,
    },
    /// The run directory (must not pre-exist; root-owned).
    RunDir {
        /// Its path, under the run root.
        path: PathBuf,
    },
    /// A mount point inside the run directory (staging tmpfs, overlay root).
    Mount {
        /// The mount point.
        path: PathBuf,
    },
    /// The container's cgroup (the runtime creates it from the bundle's `cgroupsPath`).
    Cgroup {
        /// The cgroup path.
        path: String,
    },
    /// The container.
    Container {
        /// Its id in cordon's state root.
        id: String,
    },
    /// A device handed to the container (the lane's GPUs): released by a device drain, which
    /// this build does not implement, so a record that names one is residue until it does.
    Device {
        /// The device node.
        path: PathBuf,
    },
}

/// A lease record, `leases/<lease>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`LEASE_SCHEMA`].
    pub schema: u32,
    /// The executor that owns it.
    pub executor: String,
    /// The lease id (32 hex).
    pub lease: String,
    /// The authority identity the run is under.
    pub authority: String,
    /// RFC 3339.
    pub created_at: String,
    /// The store whose `leases/` holds this record (its root path).
    pub store: String,
    /// The absolute deadline, Unix milliseconds: past it (and [`EXPIRY_GRACE`]) the lease is
    /// expired, whoever still holds it.
    pub expires_at_ms: u64,
    /// The supervising process.
    pub supervisor: Supervisor,
    /// What the lease owns, in creation order.
    pub resources: Vec<Resource>,
}

/// The process that supervises a lease: its pid and its start time (clock ticks since boot,
/// `/proc/<pid>/stat` field 22), so a reused pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supervisor {
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks since boot.
    pub start_ticks: u64,
}

/// The owner file's content: what a run directory belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// The executor.
    pub executor: String,
    /// The store root.
    pub store: String,
    /// The lease.
    pub lease: String,
}

/// Whether the run directory `dir` is there and is `owner`'s: `Ok(false)` when it is absent,
/// an error (residue) when it exists without an owner file naming exactly `owner` — never
/// removed on a guess. Only the `pending` dot-named directory `provision` made and left before
/// its owner file was written (a crash in between) may be owned without one, and only empty.
fn owned_by(dir: &Path, owner: &Owner, pending: bool) -> Result<bool, String> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("run directory {}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "run directory {} is not a directory: left for the operator",
                dir.display()
            ));
        }
        Ok(_) => {}
    }
    let read = store::open_nofollow(&dir.join(OWNER_FILE))
        .map_err(|e| e.to_string())
        .and_then(|mut f| {
            let mut text = Vec::new();
            f.read_to_end(&mut text).map_err(|e| e.to_string())?;
            Ok(text)
        });
    match read {
        Ok(text) => match serde_json::from_slice::<Owner>(&text) {
            Ok(found) if found == *owner => Ok(true),
            Ok(found) => Err(format!(
                "run directory {} belongs to executor {}, lease {}, not this lease: left alone",
                dir.display(),
                found.executor,
                found.lease
            )),
            Err(e) => Err(format!(
                "run directory {} has an unreadable owner file ({e}): left for the operator",
                dir.display()
            )),
        },
        Err(_) if pending && fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) => Ok(true),
        Err(e) => Err(format!(
            "run directory {} has no owner file ({e}): left for the operator",
            dir.display()
        )),
    }
}

/// The start time (clock ticks since boot) of process `pid` through the host seam, or `None`
/// when it does not exist.
///
/// # Errors
/// `/proc/<pid>/stat` exists but cannot be read or parsed.
pub fn process_start(host: &dyn crate::host::Host, pid: u32) -> std::io::Result<Option<u64>> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let text = match host.read(&path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The command name (field 2) is parenthesised and may hold spaces: count after its end.
    text.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|t| t.parse().ok())
        .map(Some)
        .ok_or_else(|| std::io::Error::other(format!("{} is not a stat line", path.display())))
}

impl Supervisor {
    /// This process.
    ///
    /// # Errors
    /// Its own stat line cannot be read.
    pub fn this(host: &dyn crate::host::Host) -> std::io::Result<Self> {
        let pid = std::process::id();
        let start_ticks = process_start(host, pid)?
            .ok_or_else(|| std::io::Error::other("this process has no /proc entry"))?;
        Ok(Self { pid, start_ticks })
    }

    /// Whether the supervisor still runs (the same pid with the same start time).
    ///
    /// # Errors
    /// Its stat line exists but cannot be read.
    pub fn alive(&self, host: &dyn crate::host::Host) -> std::io::Result<bool> {
        Ok(process_start(host, self.pid)? == Some(self.start_ticks))
    }
}

impl Record {
    /// The run account.
    #[must_use]
    pub fn account(&self) -> Option<Account> {
        self.resources.iter().find_map(|r| match r {
            Resource::Account { name, uid, gid } => Some(Account {
                name: name.clone(),
                uid: *uid,
                gid: *gid,
            }),
            _ => None,
        })
    }

    /// The run directory.
    #[must_use]
    pub fn run_dir(&self) -> Option<&Path> {
        self.resources.iter().find_map(|r| match r {
            Resource::RunDir { path } => Some(path.as_path()),
            _ => None,
        })
    }

    /// The container id.
    #[must_use]
    pub fn container(&self) -> Option<&str> {
        self.resources.iter().find_map(|r| match r {
            Resource::Container { id } => Some(id.as_str()),
            _ => None,
        })
    }

    /// The mount points.
    pub fn mounts(&self) -> impl Iterator<Item = &Path> {
        self.resources.iter().filter_map(|r| match r {
            Resource::Mount { path } => Some(path.as_path()),
            _ => None,
        })
    }

    /// Exactly one account and run directory, and either exactly one cgroup and container (a
    /// container's lease) or neither (a parser child's lease): what every record cordon writes
    /// names, and what a record must name for its resources to be found again.
    fn check_shape(&self) -> Result<(), String> {
        let count = |f: fn(&Resource) -> bool| self.resources.iter().filter(|r| f(r)).count();
        let runtime = [
            ("cgroup", count(|r| matches!(r, Resource::Cgroup { .. }))),
            (
                "container",
                count(|r| matches!(r, Resource::Container { .. })),
            ),
        ];
        // A parser child's lease has no cgroup and no container; any other has one of each.
        let want_runtime = usize::from(runtime.iter().any(|(_, n)| *n != 0));
        for (what, n, want) in [
            (
                "account",
                count(|r| matches!(r, Resource::Account { .. })),
                1,
            ),
            (
                "run directory",
                count(|r| matches!(r, Resource::RunDir { .. })),
                1,
            ),
            (runtime[0].0, runtime[0].1, want_runtime),
            (runtime[1].0, runtime[1].1, want_runtime),
        ] {
            if n != want {
                return Err(format!("it names {n} {what} resources, not {want}"));
            }
        }
        Ok(())
    }
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
    #[error("another cordon manager holds executor {executor}")]
    #[diagnostic(
        code(cordon::lease::busy),
        help("one manager per executor: wait for it, or use another executor id")
    )]
    Busy {
        /// The executor.
        executor: String,
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
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LeaseError + use<> {
    let path = path.to_path_buf();
    move |source| LeaseError::Io { op, path, source }
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

    /// The cgroups left under this executor's parent (on every controller on v1), through the
    /// seam; a parent that does not exist holds none.
    ///
    /// # Errors
    /// The hierarchy or a parent cannot be read.
    fn leftover_cgroups(&self) -> Result<Vec<PathBuf>, LeaseError> {
        let parent = CgroupProbe {
            host: self.runtime.host.clone(),
            root: self.cgroup_root.clone(),
            path: cgroup_parent(&self.executor),
        };
        let dirs = parent
            .dirs()
            .map_err(io("read the cgroup hierarchy at", &self.cgroup_root))?;
        let mut out = Vec::new();
        for d in dirs {
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

/// Every lease record of `executor` in `store`, validated (regular, 0600, one link, parses).
///
/// # Errors
/// A record is unsafe or corrupt: recovery stops.
pub fn read_records(store: &Store, executor: &str) -> Result<Vec<Record>, LeaseError> {
    let dir = store.root().join("leases");
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io("list", &dir))? {
        let path = entry.map_err(io("list", &dir))?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let bad = |why: String| LeaseError::Record {
            path: path.clone(),
            why,
        };
        let m = fs::symlink_metadata(&path).map_err(|e| bad(e.to_string()))?;
        if !m.is_file() {
            return Err(bad("not a regular file (a link?)".into()));
        }
        if m.mode() & 0o7777 != 0o600 || m.nlink() != 1 {
            return Err(bad(format!(
                "mode {:o} links {}",
                m.mode() & 0o7777,
                m.nlink()
            )));
        }
        let text = fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let r: Record = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if r.schema != LEASE_SCHEMA {
            return Err(bad(format!("schema {}", r.schema)));
        }
        r.check_shape().map_err(bad)?;
        if r.executor == executor {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.lease.cmp(&b.lease));
    Ok(out)
}

/// The bytes (whole pages per file, plus one) and inodes (plus slack) a tmpfs needs to hold a
/// copy of the tree at `root`.
fn tree_size(root: &Path) -> Result<(u64, u64), LeaseError> {
    const PAGE: u64 = 4096;
    let (mut bytes, mut inodes) = (PAGE, 16u64);
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).map_err(io("list", &d))? {
            let path = entry.map_err(io("list", &d))?.path();
            let m = fs::symlink_metadata(&path).map_err(io("stat", &path))?;
            inodes += 1;
            if m.is_dir() {
                dirs.push(path);
            } else if m.is_file() {
                bytes += m.len().div_ceil(PAGE) * PAGE;
            } else {
                return Err(LeaseError::Protected {
                    path,
                    why: "a store tree holds only regular files and directories".into(),
                });
            }
        }
    }
    Ok((bytes, inodes))
}

/// Copy the tree at `from` into the empty directory `to`: directories 0555, files 0444 or 0555
/// (executable as in the store), no link followed.
fn copy_tree(from: &Path, to: &Path) -> Result<(), LeaseError> {
    for entry in fs::read_dir(from).map_err(io("list", from))? {
        let src = entry.map_err(io("list", from))?.path();
        let dst = to.join(src.file_name().unwrap_or_default());
        let m = fs::symlink_metadata(&src).map_err(io("stat", &src))?;
        if m.is_dir() {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(&dst)
                .map_err(io("create", &dst))?;
            copy_tree(&src, &dst)?;
        } else {
            let mut input = store::open_nofollow(&src)?;
            let mut out = store::create_exclusive(&dst, 0o600)?;
            std::io::copy(&mut input, &mut out).map_err(io("copy", &dst))?;
            let mode = if m.mode() & 0o111 != 0 { 0o555 } else { 0o444 };
            out.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(io("chmod", &dst))?;
        }
    }
    fs::set_permissions(to, fs::Permissions::from_mode(0o555)).map_err(io("chmod", to))
}

/// A view of an executor's leases that takes no lock: what a monitor reads while a supervisor
/// holds the executor, and how `cordon-reap` ends a lease that outlived its deadline (or its
/// supervisor) without waiting for that supervisor.
#[derive(Debug)]
pub struct Observer {
    store: Store,
    setup: Setup,
}

/// One lease as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The record.
    pub record: Record,
    /// Past its deadline and the grace, or its supervisor is gone.
    pub expired: bool,
}

impl Observer {
    /// Observe `setup.executor`'s leases in `store`.
    #[must_use]
    pub fn new(store: &Store, setup: Setup) -> Self {
        Self {
            store: store.clone(),
            setup,
        }
    }

    /// Every lease, each active or expired at `now`.
    ///
    /// # Errors
    /// A record is unsafe or corrupt, or a supervisor's state cannot be read.
    pub fn leases(&self, now: SystemTime) -> Result<Vec<Observed>, LeaseError> {
        let now_ms = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let grace = u64::try_from(EXPIRY_GRACE.as_millis()).unwrap_or(u64::MAX);
        read_records(&self.store, &self.setup.executor)?
            .into_iter()
            .map(|record| {
                let gone = !record
                    .supervisor
                    .alive(self.setup.host())
                    .map_err(io("read the supervisor of", Path::new(&record.lease)))?;
                let late = now_ms > record.expires_at_ms.saturating_add(grace);
                Ok(Observed {
                    expired: gone || late,
                    record,
                })
            })
            .collect()
    }

    /// Kill the container of every expired lease — only one that carries this executor's,
    /// this store's and that lease's exact labels — so its supervisor (if any) sees its run
    /// end, reads its accounting and deletes and releases the rest (a supervisor that is gone
    /// leaves that to recovery). Not a delete: that would remove the cgroup the supervisor is
    /// about to read, and turn an attributable kill into a lost accounting. Returns what was
    /// ended.
    ///
    /// # Errors
    /// The runtime's listing cannot be read, or a kill failed (residue).
    pub fn end_expired(&self, now: SystemTime) -> Result<Vec<String>, LeaseError> {
        let expired: Vec<Record> = self
            .leases(now)?
            .into_iter()
            .filter(|o| o.expired)
            .map(|o| o.record)
            .collect();
        if expired.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.store.root().display().to_string();
        let (mut done, mut residue) = (Vec::new(), Vec::new());
        for (id, labels) in self.setup.runtime.containers()? {
            let owned = expired.iter().find(|r| {
                r.container() == Some(id.as_str())
                    && labels.get(LABEL_EXECUTOR) == Some(&self.setup.executor)
                    && labels.get(LABEL_STORE) == Some(&store)
                    && labels.get(LABEL_LEASE) == Some(&r.lease)
            });
            if let Some(r) = owned {
                // The marker first: a kill the supervisor cannot attribute is the candidate's.
                if let Some(dir) = r.run_dir()
                    && let Err(e) = fs::write(dir.join(ENDED_BY_REAP), &r.lease)
                {
                    residue.push(format!(
                        "expired lease {}: cannot mark it ended: {e}",
                        r.lease
                    ));
                    continue;
                }
                match self.setup.runtime.kill_all(&id) {
                    Ok(()) => done.push(format!("expired lease {}: container {id} ended", r.lease)),
                    Err(e) => {
                        residue.push(format!("expired lease {}: container {id}: {e}", r.lease))
                    }
                }
            }
        }
        if residue.is_empty() {
            Ok(done)
        } else {
            Err(Residue { items: residue }.into())
        }
    }

    /// The owner tag of this executor's accounts in this store.
    pub(crate) fn owner_tag(&self) -> String {
        account::owner_tag(&self.setup.executor, self.store.root())
    }

    /// The accounts in the policy's range: this executor's and store's (by their owner tag)
    /// and the ones with no readable tag; anyone else's are not listed.
    ///
    /// # Errors
    /// The account databases cannot be read.
    fn accounts(&self) -> Result<(Vec<Account>, Vec<Account>), LeaseError> {
        let tag = self.owner_tag();
        let (mut ours, mut unattributed) = (Vec::new(), Vec::new());
        for (a, comment) in account::in_range_with_owner(self.setup.host(), &self.setup.accounts)? {
            match comment {
                Some(c) if c == tag => ours.push(a),
                Some(c) if c.starts_with("cordon ") => {}
                _ => unattributed.push(a),
            }
        }
        Ok((ours, unattributed))
    }

    /// The containers in cordon's state root labelled with this executor and this store.
    ///
    /// # Errors
    /// The runtime's listing cannot be read (never "none").
    fn own_containers(&self) -> Result<Vec<String>, LeaseError> {
        let store = self.store.root().display().to_string();
        Ok(self
            .setup
            .runtime
            .containers()?
            .into_iter()
            .filter(|(_, labels)| {
                labels.get(LABEL_EXECUTOR) == Some(&self.setup.executor)
                    && labels.get(LABEL_STORE) == Some(&store)
            })
            .map(|(id, _)| id)
            .collect())
    }

    /// The lease-named directories of the run root (`<lease>` and the dot-named ones they are
    /// made under), split into this executor's and this store's (by their owner file) and the
    /// ones whose owner cannot be read; anyone else's are not listed.
    ///
    /// # Errors
    /// The run root cannot be listed.
    fn run_dirs(&self) -> Result<(Vec<PathBuf>, Vec<PathBuf>), LeaseError> {
        let root = &self.setup.run_root;
        let (mut ours, mut unattributed) = (Vec::new(), Vec::new());
        if !root.try_exists().map_err(io("stat", root))? {
            return Ok((ours, unattributed));
        }
        let store = self.store.root().display().to_string();
        for entry in fs::read_dir(root).map_err(io("list", root))? {
            let path = entry.map_err(io("list", root))?.path();
            let is_lease = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                let id = n.strip_prefix('.').unwrap_or(n);
                id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
            });
            if !is_lease {
                continue;
            }
            let owner = store::open_nofollow(&path.join(OWNER_FILE))
                .ok()
                .and_then(|mut f| {
                    let mut text = Vec::new();
                    f.read_to_end(&mut text).ok()?;
                    serde_json::from_slice::<Owner>(&text).ok()
                });
            match owner {
                Some(o) if o.executor == self.setup.executor && o.store == store => ours.push(path),
                Some(_) => {}
                None => unattributed.push(path),
            }
        }
        Ok((ours, unattributed))
    }

    /// Quiescence of this executor in this store, taking no lock: no records of it, no
    /// containers labelled with it and this store, no run directories or accounts it owns (or
    /// whose owner cannot be read), no cgroups under its parent, no mounts under cordon's
    /// roots. Returns what remains (empty when quiescent).
    ///
    /// # Errors
    /// Something could not be inspected.
    pub fn check(&self) -> Result<Vec<Leftover>, LeaseError> {
        // This executor's records (a record that cannot be read, anyone's, is an error).
        let mut left: Vec<Leftover> = read_records(&self.store, &self.setup.executor)?
            .into_iter()
            .map(|r| Leftover::LeaseRecord {
                path: self
                    .store
                    .path("leases", &format!("{}.json", r.lease))
                    .display()
                    .to_string(),
                lease: r.lease,
            })
            .collect();
        left.extend(
            self.own_containers()?
                .into_iter()
                .map(|id| Leftover::Container { id }),
        );
        let shown = |p: &Path| p.display().to_string();
        let (ours, unattributed) = self.run_dirs()?;
        for (paths, attributed) in [(ours, true), (unattributed, false)] {
            left.extend(paths.iter().map(|p| Leftover::RunDirectory {
                path: shown(p),
                attributed,
            }));
        }
        let (ours, unattributed) = self.accounts()?;
        for (accounts, attributed) in [(ours, true), (unattributed, false)] {
            left.extend(accounts.into_iter().map(|a| Leftover::Account {
                name: a.name,
                uid: a.uid,
                attributed,
            }));
        }
        for cg in self.setup.leftover_cgroups()? {
            left.push(Leftover::Cgroup { path: shown(&cg) });
        }
        for p in self.setup.mount_points()? {
            if p.starts_with(&self.setup.run_root) || p.starts_with(self.store.root()) {
                left.push(Leftover::Mount { path: shown(&p) });
            }
        }
        Ok(left)
    }
}

/// The one manager of an executor on this host: holds its [`Setup::lock_path`].
#[derive(Debug)]
pub struct Manager {
    store: Store,
    setup: Setup,
    /// Held with others (intake's parser children), or alone (containers, recovery).
    shared: bool,
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
        let f = open_lock_file(&path).map_err(io("open lock", &path))?;
        let arg = if shared {
            FlockArg::LockSharedNonblock
        } else {
            FlockArg::LockExclusiveNonblock
        };
        let lock = Flock::lock(f, arg).map_err(|_| LeaseError::Busy {
            executor: setup.executor.clone(),
        })?;
        Ok(Self {
            store: store.clone(),
            setup,
            shared,
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

    /// Begin a lease that expires at `expires` (the run's absolute deadline): write its record
    /// (durably, before any resource exists), naming this process as its supervisor.
    ///
    /// # Errors
    /// The store failed.
    pub fn begin(&self, authority: &str, expires: SystemTime) -> Result<Lease, LeaseError> {
        self.begin_with(authority, &[], expires)
    }

    /// [`Manager::begin`], naming the mount points (relative to the run directory) the lease
    /// will create, so that a crash after mounting leaves a record that says what to unmount.
    ///
    /// # Errors
    /// The store failed.
    pub fn begin_with(
        &self,
        authority: &str,
        mounts: &[&str],
        expires: SystemTime,
    ) -> Result<Lease, LeaseError> {
        self.begin_resources(authority, mounts, expires, true)
    }

    /// Begin a lease for a parser child: an account and a run directory, no cgroup, no
    /// container (the child is a process of this one, killed with it).
    ///
    /// # Errors
    /// The store failed.
    pub fn begin_child(&self, authority: &str, expires: SystemTime) -> Result<Lease, LeaseError> {
        self.begin_resources(authority, &[], expires, false)
    }

    fn begin_resources(
        &self,
        authority: &str,
        mounts: &[&str],
        expires: SystemTime,
        container: bool,
    ) -> Result<Lease, LeaseError> {
        let supervisor = Supervisor::this(self.setup.host())
            .map_err(io("read", Path::new("/proc/self/stat")))?;
        let expires_at_ms = expires
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .unwrap_or(0);
        let lease = fresh_id();
        let run_dir = self.setup.run_root.join(&lease);
        let account = account::for_lease(&self.setup.accounts, &lease);
        // Creation order: account, run directory, mounts, then the runtime's cgroup and the
        // container; release walks this list backwards.
        let mut resources = vec![
            Resource::Account {
                name: account.name.clone(),
                uid: account.uid,
                gid: account.gid,
            },
            Resource::RunDir {
                path: run_dir.clone(),
            },
        ];
        resources.extend(mounts.iter().map(|m| Resource::Mount {
            path: run_dir.join(m),
        }));
        if container {
            resources.push(Resource::Cgroup {
                path: cgroup_path(&self.setup.executor, &lease),
            });
            resources.push(Resource::Container {
                id: format!("cordon-{lease}"),
            });
        }
        let record = Record {
            schema: LEASE_SCHEMA,
            executor: self.setup.executor.clone(),
            authority: authority.to_owned(),
            created_at: crate::receipt::now_rfc3339(),
            store: self.store.root().display().to_string(),
            expires_at_ms,
            supervisor,
            lease,
            resources,
        };
        let text = to_canonical_json(&record)?;
        let mut scratch = self.store.scratch()?;
        let (staged, mut f) = scratch.create_file()?;
        f.write_all(text.as_bytes()).map_err(io("write", &staged))?;
        f.sync_all().map_err(io("fsync", &staged))?;
        let path = self.record_path(&record.lease);
        fs::hard_link(&staged, &path).map_err(io("publish", &path))?;
        // One hard link: the scratch name goes, so the record's link count is 1.
        fs::remove_file(&staged).map_err(io("unlink", &staged))?;
        store::fsync_dir(&self.store.root().join("leases"))?;
        Ok(Lease {
            container: format!("cordon-{}", record.lease),
            record,
            run_dir,
            account,
            protected: BTreeMap::new(),
            secret: None,
        })
    }

    /// Create the lease's account and run directory (which must not exist).
    ///
    /// # Errors
    /// The account's name or ids are taken, or the directory exists.
    pub fn provision(&self, lease: &Lease) -> Result<(), LeaseError> {
        account::create(
            self.setup.host(),
            &self.setup.accounts,
            lease.account(),
            &self.view().owner_tag(),
        )?;
        let dir = lease.run_dir();
        fs::create_dir_all(&self.setup.run_root).map_err(io("create", &self.setup.run_root))?;
        if dir.try_exists().map_err(io("stat", dir))? {
            return Err(LeaseError::RunDirExists(dir.to_path_buf()));
        }
        // Made under a dot name with its owner file, then renamed into place: every run
        // directory under its lease name says whose it is, so recovery touches only its own.
        let pending = self.setup.run_root.join(format!(".{}", lease.record.lease));
        match fs::DirBuilder::new().mode(0o711).create(&pending) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(LeaseError::RunDirExists(pending));
            }
            Err(e) => return Err(io("create", &pending)(e)),
        }
        fs::set_permissions(&pending, fs::Permissions::from_mode(0o711))
            .map_err(io("chmod", &pending))?;
        let owner = to_canonical_json(&Owner {
            executor: self.setup.executor.clone(),
            store: lease.record.store.clone(),
            lease: lease.record.lease.clone(),
        })?;
        let owner_path = pending.join(OWNER_FILE);
        let mut f = store::create_exclusive(&owner_path, 0o444)?;
        f.write_all(owner.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io("write", &owner_path))?;
        store::rename_noreplace(&pending, dir).map_err(|e| match e {
            e if store::is_exists(&e) => LeaseError::RunDirExists(dir.to_path_buf()),
            e => e.into(),
        })?;
        store::fsync_dir(&self.setup.run_root)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(lease.bundle_dir())
            .map_err(io("create", &lease.bundle_dir()))?;
        Ok(())
    }

    /// [`Manager::provision`], then the parser child's empty root ([`Lease::jail_dir`]).
    ///
    /// # Errors
    /// As `provision`, or the directory cannot be made.
    pub fn provision_child(&self, lease: &Lease) -> Result<PathBuf, LeaseError> {
        self.provision(lease)?;
        let jail = lease.jail_dir();
        fs::DirBuilder::new()
            .mode(0o500)
            .create(&jail)
            .map_err(io("create", &jail))?;
        Ok(jail)
    }

    /// Mount one of the lease's writable scratch areas (the staging area, `/tmp`): a private
    /// tmpfs at `point` bounded in bytes (and in inodes when `inodes` is given), its root mode
    /// 0700 and owned by the run account. The kernel enforces the bounds, so a full area is the
    /// workload's ENOSPC, never the host's disk. The container sees it through a bind, which
    /// the runtime never re-modes (it gives a tmpfs *mount* the mode of the directory it covers,
    /// 0555 in a sealed image).
    ///
    /// # Errors
    /// The mount point is not one the record names, or the mount failed.
    pub fn mount_tmpfs(
        &self,
        lease: &Lease,
        point: &Path,
        bytes: u64,
        inodes: Option<u64>,
    ) -> Result<PathBuf, LeaseError> {
        let point = lease.named_mount_point(point)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&point)
            .map_err(io("create", &point))?;
        let a = lease.account();
        let mut options = format!("size={bytes},mode=0700,uid={},gid={}", a.uid, a.gid);
        if let Some(n) = inodes {
            options.push_str(&format!(",nr_inodes={n}"));
        }
        self.setup
            .host()
            .mount(&MountRequest::Tmpfs {
                target: point.clone(),
                options,
            })
            .map_err(io("mount tmpfs on", &point))?;
        Ok(point)
    }

    /// Mount the lease's own read-only copy of the store tree `source` at `point`: a private
    /// tmpfs (root-owned, 0755) sized to the tree, its directories 0555 and files 0444 or 0555
    /// as in the store. Each lease gets its own inodes: no lock, inotify watch, link count or
    /// access time is shared with another lease, and the mount table names no store path.
    ///
    /// # Errors
    /// The mount point is not one the record names, the tree holds anything but regular files
    /// and directories, or a step failed.
    pub fn mount_copy(
        &self,
        lease: &Lease,
        point: &Path,
        source: &Path,
    ) -> Result<PathBuf, LeaseError> {
        let point = lease.named_mount_point(point)?;
        let (bytes, inodes) = tree_size(source)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&point)
            .map_err(io("create", &point))?;
        self.setup
            .host()
            .mount(&MountRequest::Tmpfs {
                target: point.clone(),
                options: format!("size={bytes},nr_inodes={inodes},mode=0755,uid=0,gid=0"),
            })
            .map_err(io("mount tmpfs on", &point))?;
        copy_tree(source, &point)?;
        Ok(point)
    }

    /// Mount the lease's disposable root: an overlay at `point` whose lower layer is the
    /// read-only image rootfs and whose upper and work directories (created here, root-owned)
    /// belong to this lease alone, so nothing written reaches the shared image cache or
    /// outlives the lease.
    ///
    /// # Errors
    /// The mount point is not one the record names, or a directory or the mount failed.
    pub fn mount_overlay(
        &self,
        lease: &Lease,
        point: &Path,
        lower: &Path,
        upper: &Path,
        work: &Path,
    ) -> Result<PathBuf, LeaseError> {
        let point = lease.named_mount_point(point)?;
        for d in [&point, upper, work] {
            if !d.starts_with(lease.run_dir()) {
                return Err(LeaseError::Protected {
                    path: d.to_path_buf(),
                    why: "outside the lease's run directory".into(),
                });
            }
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(d)
                .map_err(io("create", d))?;
        }
        self.setup
            .host()
            .mount(&MountRequest::Overlay {
                target: point.clone(),
                lower: lower.to_path_buf(),
                upper: upper.to_path_buf(),
                work: work.to_path_buf(),
            })
            .map_err(io("mount overlay on", &point))?;
        Ok(point)
    }

    /// Write a protected, root-owned file into the lease's bundle directory and remember its
    /// size and sha256 for the check before launch.
    ///
    /// # Errors
    /// The file could not be written.
    pub fn write_protected(
        &self,
        lease: &mut Lease,
        name: &str,
        bytes: &[u8],
    ) -> Result<PathBuf, LeaseError> {
        let path = lease.bundle_dir().join(name);
        let mut f = store::create_exclusive(&path, 0o600)?;
        f.write_all(bytes).map_err(io("write", &path))?;
        f.sync_all().map_err(io("fsync", &path))?;
        lease
            .protected
            .insert(path.clone(), (bytes.len() as u64, Digest::of_bytes(bytes)));
        Ok(path)
    }

    /// Write the declared secret into the run directory as `secret`: a regular file owned by
    /// this (root) process, mode 0400, one link. Its bytes reach the workload only on stdin,
    /// read back at launch ([`Manager::create`]) after [`Manager::check_protected`].
    ///
    /// # Errors
    /// The file exists or cannot be written.
    pub fn write_secret(&self, lease: &mut Lease, bytes: &[u8]) -> Result<PathBuf, LeaseError> {
        let path = lease.run_dir().join("secret");
        let mut f = store::create_exclusive(&path, 0o400)?;
        f.write_all(bytes).map_err(io("write", &path))?;
        f.sync_all().map_err(io("fsync", &path))?;
        lease.secret = Some((path.clone(), bytes.len() as u64));
        Ok(path)
    }

    /// The declared secret's bytes, from a descriptor whose file is checked first: a regular
    /// root-owned 0400 file with one link and its written size (not hashed: a digest of a
    /// secret is a thing to guess against).
    fn read_secret(lease: &Lease) -> Result<Option<Vec<u8>>, LeaseError> {
        let Some((path, size)) = &lease.secret else {
            return Ok(None);
        };
        let bad = |why: String| LeaseError::Protected {
            path: path.clone(),
            why,
        };
        let mut f = store::open_nofollow(path).map_err(|e| bad(e.to_string()))?;
        let m = f.metadata().map_err(|e| bad(e.to_string()))?;
        if !m.is_file()
            || m.uid() != nix::unistd::geteuid().as_raw()
            || m.mode() & 0o7777 != 0o400
            || m.nlink() != 1
            || m.len() != *size
        {
            return Err(bad(format!(
                "owner {} mode {:o} links {} size {}",
                m.uid(),
                m.mode() & 0o7777,
                m.nlink(),
                m.len()
            )));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(*size).unwrap_or(0));
        f.read_to_end(&mut bytes).map_err(|e| bad(e.to_string()))?;
        if bytes.len() as u64 != *size {
            return Err(bad(format!("{} bytes read", bytes.len())));
        }
        Ok(Some(bytes))
    }

    /// Right before launch: every protected file is a regular root-owned 0600 file with one
    /// link, its recorded size and sha256.
    ///
    /// # Errors
    /// [`LeaseError::Protected`] naming what changed.
    pub fn check_protected(&self, lease: &Lease) -> Result<(), LeaseError> {
        let owner = nix::unistd::geteuid().as_raw();
        for (path, (size, sha)) in &lease.protected {
            let bad = |why: String| LeaseError::Protected {
                path: path.clone(),
                why,
            };
            let f = store::open_nofollow(path).map_err(|e| bad(e.to_string()))?;
            let m = f.metadata().map_err(|e| bad(e.to_string()))?;
            if m.uid() != owner || m.mode() & 0o7777 != 0o600 || m.nlink() != 1 || m.len() != *size
            {
                return Err(bad(format!(
                    "owner {} mode {:o} links {} size {}",
                    m.uid(),
                    m.mode() & 0o7777,
                    m.nlink(),
                    m.len()
                )));
            }
            let (found, _) = Digest::of_reader(f).map_err(|e| bad(e.to_string()))?;
            if &found != sha {
                return Err(bad(format!("sha256 is {found}")));
            }
        }
        Ok(())
    }

    /// The cgroup probe of a lease's container.
    #[must_use]
    pub fn cgroup(&self, lease: &Lease) -> CgroupProbe {
        self.setup.probe(&lease.record.lease)
    }

    /// Create the lease's container from its bundle, right after checking the protected files.
    ///
    /// # Errors
    /// A protected file changed, or the runtime failed.
    pub fn create(&self, lease: &Lease, mut stdio: Stdio3) -> Result<Created, LeaseError> {
        self.check_protected(lease)?;
        // The declared secret crosses on stdin only, read from the checked file.
        if let Some(bytes) = Self::read_secret(lease)? {
            stdio.stdin = crate::container::Input::Bytes(bytes);
        }
        Ok(self
            .setup
            .runtime
            .create(lease.container(), &lease.bundle_dir(), stdio)?)
    }

    /// Run the lease's bundle to its end or its deadline with captured output: check the
    /// protected files, create, start, wait, delete.
    ///
    /// # Errors
    /// A protected file changed, or the runtime failed.
    pub fn run(
        &self,
        lease: &Lease,
        deadline: Instant,
        caps: OutputCaps,
        stdin: Option<Vec<u8>>,
    ) -> Result<Finished, LeaseError> {
        let probe = self.cgroup(lease);
        Ok(self
            .create(lease, Stdio3::captured(stdin, caps))?
            .start()?
            .wait(deadline, &probe)?
            .delete()?)
    }

    /// Release a lease: remove the container, prove it absent (twice, to close the
    /// create/delete race), unmount, remove the run directory and the account, unlink the
    /// record. Everything is attempted; what fails is the residue.
    ///
    /// # Errors
    /// [`LeaseError::Residue`] listing what remains.
    pub fn release(&self, record: &Record) -> Result<(), LeaseError> {
        self.release_all(std::slice::from_ref(record))
    }

    /// Release many leases with one container listing before and two after (the absence
    /// proof), so recovery of many records costs a few runtime calls, not a few per record.
    fn release_all(&self, records: &[Record]) -> Result<(), LeaseError> {
        let mut residue = Vec::new();
        // Leases that never had a container (parser children) have none to prove absent.
        let containers = records
            .iter()
            .flat_map(|r| &r.resources)
            .any(|r| matches!(r, Resource::Container { .. }));
        if !containers {
            return self.release_rest(records, residue);
        }
        let rt = &self.setup.runtime;
        let mine = |labels: &crate::runtime::Labels| {
            labels.get(LABEL_EXECUTOR) == Some(&self.setup.executor)
                && records.iter().any(|r| {
                    labels.get(LABEL_LEASE) == Some(&r.lease)
                        && labels.get(LABEL_AUTHORITY) == Some(&r.authority)
                })
        };
        let listed: Option<Vec<String>> = rt
            .containers()
            .ok()
            .map(|l| l.into_iter().map(|(id, _)| id).collect());
        for id in records
            .iter()
            .flat_map(|r| &r.resources)
            .filter_map(|r| match r {
                Resource::Container { id } => Some(id),
                _ => None,
            })
        {
            // A container the runtime does not list was never created or is gone; one it lists,
            // or any when listing failed, is killed and deleted.
            let present = listed.as_ref().is_none_or(|ids| ids.contains(id));
            if present && let Err(e) = rt.remove(id) {
                residue.push(format!("container {id}: {e}"));
            }
        }
        for attempt in 0..2 {
            match rt.containers() {
                Ok(all) => {
                    let left: Vec<String> = all
                        .into_iter()
                        .filter(|(_, l)| mine(l))
                        .map(|(id, _)| id)
                        .collect();
                    for id in &left {
                        let _ = rt.remove(id);
                    }
                    if attempt == 1 && !left.is_empty() {
                        residue.push(format!("containers still listed: {}", left.join(", ")));
                    }
                }
                Err(e) => residue.push(format!("cannot list containers: {e}")),
            }
            if attempt == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let proof_failed = !residue.is_empty();
        if proof_failed {
            // A container not proven gone may still run the candidate's processes: its run
            // directory, mounts, cgroup and account stay as they are (residue, retried by the
            // next recovery) rather than be removed under it.
            residue.push(
                "the lease's other resources are kept until its containers are proven gone".into(),
            );
            return Err(Residue { items: residue }.into());
        }
        self.release_rest(records, residue)
    }

    /// Everything but the containers, record by record; a record goes once its resources did.
    fn release_rest(&self, records: &[Record], mut residue: Vec<String>) -> Result<(), LeaseError> {
        for record in records {
            let mut own = self.release_resources(record);
            if own.is_empty() {
                let path = self.record_path(&record.lease);
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => own.push(format!("record {}: {e}", path.display())),
                }
            }
            residue.extend(own);
        }
        let _ = store::fsync_dir(&self.store.root().join("leases"));
        if residue.is_empty() {
            Ok(())
        } else {
            Err(Residue { items: residue }.into())
        }
    }

    /// The host resources of one lease, undone in reverse creation order, one step per kind.
    /// The container is not among them: the batch before removed it and proved it absent.
    fn release_resources(&self, record: &Record) -> Vec<String> {
        let mut residue = Vec::new();
        let points = self.setup.mount_points();
        for resource in record.resources.iter().rev() {
            let undone: Result<(), String> = match resource {
                Resource::Container { .. } => Ok(()),
                Resource::Cgroup { path } => {
                    let probe = CgroupProbe {
                        host: self.setup.runtime.host.clone(),
                        root: self.setup.cgroup_root.clone(),
                        path: path.clone(),
                    };
                    match probe.dirs() {
                        Ok(dirs) => dirs.iter().try_for_each(|d| {
                            self.setup
                                .host()
                                .remove_dir(d)
                                .map_err(|e| format!("cgroup {}: {e}", d.display()))
                        }),
                        Err(e) => Err(format!("cgroup {path}: the hierarchy cannot be read: {e}")),
                    }
                }
                Resource::Mount { path } => match &points {
                    Ok(p) if p.contains(path) => self
                        .setup
                        .host()
                        .unmount(path)
                        .map_err(|e| format!("mount {}: {e}", path.display())),
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("mount {}: {e}", path.display())),
                },
                Resource::RunDir { path } => {
                    // Only a lease directory strictly inside the run root is ever removed, with
                    // the dot-named directory it was made under (a crash may leave that), and
                    // only when its owner file names this lease: a directory that was there
                    // before (provision refuses it) or that another writer made is left alone.
                    // While anything released before it is still there (a mount inside it
                    // that would not go) it is kept whole, owner file included, for the next
                    // recovery: removing around a live mount would leave it unattributable.
                    if !residue.is_empty() {
                        Err(format!(
                            "run directory {} kept while the residue above remains",
                            path.display()
                        ))
                    } else if path.starts_with(&self.setup.run_root) && *path != self.setup.run_root
                    {
                        let pending = path.file_name().map(|n| {
                            let mut dot = std::ffi::OsString::from(".");
                            dot.push(n);
                            path.with_file_name(dot)
                        });
                        let owner = Owner {
                            executor: self.setup.executor.clone(),
                            store: record.store.clone(),
                            lease: record.lease.clone(),
                        };
                        std::iter::once((path.clone(), false))
                            .chain(pending.map(|p| (p, true)))
                            .try_for_each(|(dir, pending)| {
                                if owned_by(&dir, &owner, pending)? {
                                    store::remove_tree(&dir).map_err(|e| {
                                        format!("run directory {}: {e}", dir.display())
                                    })
                                } else {
                                    Ok(())
                                }
                            })
                    } else {
                        Err(format!(
                            "run directory {} is outside the run root",
                            path.display()
                        ))
                    }
                }
                Resource::Account { name, uid, gid } => {
                    let a = Account {
                        name: name.clone(),
                        uid: *uid,
                        gid: *gid,
                    };
                    account::remove(self.setup.host(), &self.setup.accounts, &a)
                        .map_err(|e| format!("account {name}: {e}"))
                }
                Resource::Device { path } => Err(format!(
                    "device {}: this build cannot drain devices",
                    path.display()
                )),
            };
            if let Err(item) = undone {
                residue.push(item);
            }
        }
        residue
    }

    /// Every lease record of this executor, validated (regular, 0600, one link, parses).
    ///
    /// # Errors
    /// A record is unsafe or corrupt: recovery stops.
    pub fn records(&self) -> Result<Vec<Record>, LeaseError> {
        read_records(&self.store, &self.setup.executor)
    }

    /// Unmount every mount under `dir`, deepest first.
    fn unmount_inside(&self, dir: &Path) -> Result<(), String> {
        let mut inside: Vec<PathBuf> = self
            .setup
            .mount_points()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|p| p.starts_with(dir))
            .collect();
        inside.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        inside.iter().try_for_each(|p| {
            self.setup
                .host()
                .unmount(p)
                .map_err(|e| format!("mount {} inside it: {e}", p.display()))
        })
    }

    /// Startup recovery: release every record (this manager holds the executor's lock, so no
    /// live manager holds them), then remove orphans: containers with this executor's label,
    /// run directories, accounts in the policy range. Returns what was released.
    ///
    /// # Errors
    /// A record is unsafe, or something could not be removed (the residue).
    pub fn recover(&self) -> Result<Vec<String>, LeaseError> {
        // Other holders of a shared lock are alive and own their records.
        if self.shared {
            return Err(LeaseError::Busy {
                executor: self.setup.executor.clone(),
            });
        }
        let view = self.view();
        let mut done = Vec::new();
        let mut residue = Vec::new();
        let records = self.records()?;
        match self.release_all(&records) {
            Ok(()) => done.extend(records.iter().map(|r| format!("lease {}", r.lease))),
            Err(LeaseError::Residue(x)) => residue.extend(x.items),
            Err(e) => return Err(e),
        }
        for id in view.own_containers()? {
            match self.setup.runtime.remove(&id) {
                Ok(()) => done.push(format!("container {id}")),
                Err(e) => residue.push(format!("container {id}: {e}")),
            }
        }
        // Orphan run directories (no record names them any more): a lease whose release just
        // left residue keeps its record and its directory whole; any other is unmounted inside
        // (deepest first) and then removed — never removed around a mount, which would take its
        // owner file and leave it unattributable.
        let kept: std::collections::BTreeSet<String> =
            self.records()?.into_iter().map(|r| r.lease).collect();
        let (ours, unattributed) = view.run_dirs()?;
        for path in ours {
            let id = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.trim_start_matches('.'));
            if id.is_some_and(|id| kept.contains(id)) {
                continue;
            }
            match self
                .unmount_inside(&path)
                .and_then(|()| store::remove_tree(&path).map_err(|e| e.to_string()))
            {
                Ok(()) => done.push(format!("run directory {}", path.display())),
                Err(e) => residue.push(format!("run directory {}: {e}", path.display())),
            }
        }
        residue.extend(unattributed.iter().map(|p| {
            format!(
                "run directory {} has no readable owner: left alone",
                p.display()
            )
        }));
        // Cgroups of this executor that no container holds any more (empty ones can be
        // removed; one with processes left stays as residue).
        for cg in self.setup.leftover_cgroups()? {
            match self.setup.host().remove_dir(&cg) {
                Ok(()) => done.push(format!("cgroup {}", cg.display())),
                Err(e) => residue.push(format!("cgroup {}: {e}", cg.display())),
            }
        }
        // Accounts of this executor and store no record names any more (their record went with
        // a lost store, say), by the owner tag in their comment; one without a tag is left to
        // the operator, and another executor's is never touched.
        let (ours, unattributed) = view.accounts()?;
        for a in ours {
            match account::remove(self.setup.host(), &self.setup.accounts, &a) {
                Ok(()) => done.push(format!("account {}", a.name)),
                Err(e) => residue.push(format!("account {}: {e}", a.name)),
            }
        }
        residue.extend(
            unattributed
                .iter()
                .map(|a| format!("account {} has no owner tag: left alone", a.name)),
        );
        if residue.is_empty() {
            Ok(done)
        } else {
            Err(Residue { items: residue }.into())
        }
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

#[cfg(test)]
mod tests {
    //! Every "cannot establish" of release, recovery and the quiescence check, driven through
    //! the recording fake host: each must be residue or an error, never "nothing left".

    use std::sync::Arc;

    use super::*;
    use crate::host::ToolOutput;
    use crate::host::fake::{Call, Fake};

    struct World {
        dir: tempfile::TempDir,
        fake: Arc<Fake>,
        manager: Manager,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let fake = Arc::new(Fake::new());
        fake.file("/etc/passwd", "root:x:0:0::/root:/bin/sh\n")
            .file("/etc/group", "root:x:0:\n")
            .file(this_stat(), STAT_LINE)
            .file(
                "/proc/self/mountinfo",
                "22 1 0:21 / / rw - ext4 /dev/vda rw\n",
            )
            .reply("list", ToolOutput::ok(b"null"));
        let setup = Setup {
            executor: "fake".into(),
            runtime: Runtime {
                binary: "/usr/sbin/runc".into(),
                state_root: dir.path().join("state"),
                host: fake.clone(),
            },
            run_root: dir.path().join("run"),
            lock_dir: dir.path().join("locks"),
            accounts: crate::account::tests::policy(),
            cgroup_root: dir.path().join("cgroup"),
            mountinfo: "/proc/self/mountinfo".into(),
            init_mountinfo: "/proc/self/mountinfo".into(),
        };
        let manager = Manager::open(&store, setup).unwrap();
        World { dir, fake, manager }
    }

    /// A fake host with empty user, group and mount tables (callers add the runtime's replies).
    /// A stat line whose command holds a parenthesis and spaces; start time (field 22) 4242.
    const STAT_LINE: &str = "77 (a) b (c) S 1 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1 1";

    fn this_stat() -> String {
        format!("/proc/{}/stat", std::process::id())
    }

    fn empty_host() -> Arc<Fake> {
        let f = Arc::new(Fake::new());
        f.file("/etc/passwd", "")
            .file("/etc/group", "")
            .file(this_stat(), STAT_LINE)
            .file("/proc/self/mountinfo", "");
        f
    }

    #[test]
    fn a_supervisor_is_its_pid_and_start_time_and_a_reused_pid_is_not_it() {
        let f = empty_host();
        let me = Supervisor::this(&*f).unwrap();
        assert_eq!((me.pid, me.start_ticks), (std::process::id(), 4242));
        assert!(me.alive(&*f).unwrap());
        let reused = Supervisor {
            start_ticks: 1,
            ..me
        };
        assert!(!reused.alive(&*f).unwrap(), "same pid, another start time");
        let gone = Supervisor {
            pid: u32::MAX,
            ..me
        };
        assert!(!gone.alive(&*f).unwrap());
        f.file("/proc/1/stat", "garbage");
        assert!(
            process_start(&*f, 1).is_err(),
            "an unreadable stat line is an error"
        );
    }

    fn residue(r: Result<(), LeaseError>) -> Vec<String> {
        match r {
            Err(LeaseError::Residue(x)) => x.items,
            other => panic!("expected residue, got {other:?}"),
        }
    }

    /// The lease's run directory with its owner file, as `provision` makes it (for tests that
    /// do not create an account).
    pub(super) fn own_run_dir(lease: &Lease) {
        fs::create_dir_all(lease.run_dir()).unwrap();
        let owner = Owner {
            executor: lease.record.executor.clone(),
            store: lease.record.store.clone(),
            lease: lease.record.lease.clone(),
        };
        fs::write(
            lease.run_dir().join(OWNER_FILE),
            to_canonical_json(&owner).unwrap(),
        )
        .unwrap();
    }

    /// A lease whose deadline passed long ago (its supervisor, this process, alive), with its
    /// run directory; and that deadline.
    fn expired_lease(w: &World) -> (Lease, SystemTime) {
        let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let lease = w.manager.begin("sha256:a", expires).unwrap();
        own_run_dir(&lease);
        (lease, expires)
    }

    /// A `runc state` answer whose annotations are these labels.
    fn state_with(executor: &str, store: &str, lease: &str) -> String {
        serde_json::json!({ "annotations": {
            LABEL_EXECUTOR: executor, LABEL_STORE: store, LABEL_LEASE: lease,
        }})
        .to_string()
    }

    /// The observer ends only the container of an expired lease that carries this executor's,
    /// this store's and that lease's exact labels; a lease is expired only once its deadline
    /// and the grace have both passed (or its supervisor is gone).
    #[test]
    fn the_observer_ends_only_an_expired_leases_exactly_labelled_container() {
        let w = world();
        let (lease, expires) = expired_lease(&w);
        let id = lease.container().to_owned();
        let store = w.manager.store.root().display().to_string();
        let f = empty_host();
        // Four containers under the same id prefix: only the first has every label right.
        let labels = state_with;
        let others = [
            (
                format!("{id}-x"),
                labels("other", &store, &lease.record.lease),
            ),
            (
                format!("{id}-s"),
                labels("fake", "/elsewhere", &lease.record.lease),
            ),
            (format!("{id}-l"), labels("fake", &store, "another-lease")),
        ];
        for (other, state) in &others {
            f.reply(&format!("state {other}"), ToolOutput::ok(state.as_bytes()));
        }
        f.reply(
            &format!("state {id}"),
            ToolOutput::ok(labels("fake", &store, &lease.record.lease).as_bytes()),
        );
        let list: Vec<serde_json::Value> = std::iter::once(id.clone())
            .chain(others.iter().map(|(o, _)| o.clone()))
            .map(|i| serde_json::json!({ "id": i }))
            .collect();
        f.reply(
            " list ",
            ToolOutput::ok(serde_json::to_vec(&list).unwrap().as_slice()),
        );
        let mut setup = w.manager.setup.clone();
        setup.runtime.host = f.clone();
        let observer = Observer::new(&w.manager.store, setup);
        // At the deadline plus the grace, not yet expired; a millisecond later, expired.
        let edge = expires + EXPIRY_GRACE;
        assert!(!observer.leases(edge).unwrap()[0].expired);
        assert!(observer.end_expired(edge).unwrap().is_empty());
        assert!(observer.leases(edge + Duration::from_millis(1)).unwrap()[0].expired);
        let ended = observer
            .end_expired(edge + Duration::from_millis(1))
            .unwrap();
        assert_eq!(ended.len(), 1, "{ended:?}");
        let kills: Vec<String> = f
            .runs()
            .into_iter()
            .filter(|l| l.contains(" kill "))
            .collect();
        assert!(
            !kills.is_empty() && kills.iter().all(|k| k.ends_with(&format!("{id} KILL"))),
            "{kills:?}"
        );
        assert!(
            lease.run_dir().join(ENDED_BY_REAP).exists(),
            "marked before the kill"
        );
        // The check lists only this executor's and store's containers as residue.
        let left = observer.check().unwrap();
        let containers: Vec<&String> = left
            .iter()
            .filter_map(|l| match l {
                Leftover::Container { id } => Some(id),
                _ => None,
            })
            .collect();
        assert!(
            containers
                .iter()
                .all(|id| **id != others[0].0 && **id != others[1].0),
            "{left:?}"
        );
    }

    /// Release proves only its own containers gone — by executor, lease and authority labels
    /// — and keeps everything else of the lease while one of them is still listed.
    #[test]
    fn release_proves_its_own_containers_gone_and_ignores_others() {
        let w = world();
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        own_run_dir(&lease);
        let state = |executor: &str, lease_id: &str, authority: &str| {
            serde_json::json!({ "annotations": {
                LABEL_EXECUTOR: executor, LABEL_LEASE: lease_id, LABEL_AUTHORITY: authority,
            }})
            .to_string()
        };
        // Another lease's, another executor's and another authority's containers are listed
        // and never touched; release succeeds.
        let f = empty_host();
        let others = [
            ("other-lease", state("fake", "another", "sha256:a")),
            (
                "other-executor",
                state("other", &lease.record.lease, "sha256:a"),
            ),
            (
                "other-authority",
                state("fake", &lease.record.lease, "sha256:b"),
            ),
        ];
        for (other, s) in &others {
            f.reply(&format!("state {other}"), ToolOutput::ok(s.as_bytes()));
        }
        let list: Vec<serde_json::Value> = others
            .iter()
            .map(|(o, _)| serde_json::json!({ "id": o }))
            .collect();
        f.reply(
            " list ",
            ToolOutput::ok(serde_json::to_vec(&list).unwrap().as_slice()),
        );
        let m = with_host(&w, f.clone());
        m.release(&lease.record).unwrap();
        assert!(
            !f.calls().iter().any(
                |c| matches!(c, Call::Run(l) if l.contains(" kill ") || l.contains(" delete "))
            ),
            "{:?}",
            f.calls()
        );
        // Its own container, still listed after removal: residue, and the rest is kept.
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        own_run_dir(&lease);
        let id2 = lease.container().to_owned();
        let f = empty_host();
        f.reply(
            &format!("state {id2}"),
            ToolOutput::ok(state("fake", &lease.record.lease, "sha256:a").as_bytes()),
        )
        .reply(
            " list ",
            ToolOutput::ok(serde_json::json!([{ "id": id2 }]).to_string().as_bytes()),
        );
        let m = with_host(&w, f);
        let items = match m.release(&lease.record) {
            Err(LeaseError::Residue(r)) => r.items,
            other => panic!("a container still listed is residue: {other:?}"),
        };
        assert!(items.iter().any(|i| i.contains(&id2)), "{items:?}");
        assert!(
            lease.run_dir().join(OWNER_FILE).exists(),
            "the rest is kept"
        );
        assert!(
            m.records()
                .unwrap()
                .iter()
                .any(|r| r.lease == lease.record.lease)
        );
    }

    /// The lease's own container id under another executor's, store's or lease's labels is
    /// not ended: the id alone never makes a container this lease's.
    #[test]
    fn an_expired_leases_id_under_other_labels_is_not_ended() {
        let w = world();
        let (lease, _) = expired_lease(&w);
        let id = lease.container().to_owned();
        let store = w.manager.store.root().display().to_string();
        for (executor, store, lease_id) in [
            ("other", store.as_str(), lease.record.lease.as_str()),
            ("fake", "/elsewhere", lease.record.lease.as_str()),
            ("fake", store.as_str(), "another-lease"),
        ] {
            let f = empty_host();
            let state = state_with(executor, store, lease_id);
            f.reply(
                &format!("state {id}"),
                ToolOutput::ok(state.to_string().as_bytes()),
            )
            .reply(
                " list ",
                ToolOutput::ok(serde_json::json!([{ "id": id }]).to_string().as_bytes()),
            );
            let mut setup = w.manager.setup.clone();
            setup.runtime.host = f;
            let ended = Observer::new(&w.manager.store, setup)
                .end_expired(SystemTime::now())
                .unwrap();
            assert!(ended.is_empty(), "{executor} {store} {lease_id}: {ended:?}");
        }
    }

    /// Release edge cases (mutation survivors): a record already gone is no residue, one that
    /// cannot be removed is; a mount point that is not mounted is not unmounted; a run
    /// directory outside the run root, a link under the lease's name, or an empty lease-named
    /// directory are never removed, while the empty pending dot directory a crash left is.
    #[test]
    fn release_edges_are_each_what_they_must_be() {
        let w = world();
        let f = empty_host();
        f.reply("list", ToolOutput::ok(b"[]"));
        let m = with_host(&w, f.clone());
        // The record already gone: released all the same.
        let lease = m
            .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
            .unwrap();
        fs::remove_file(m.record_path(&lease.record.lease)).unwrap();
        m.release(&lease.record).unwrap();
        assert!(
            !f.calls().iter().any(|c| matches!(c, Call::Unmount(_))),
            "nothing was mounted, nothing is unmounted"
        );
        // A record that cannot be removed (a directory in its place) is residue.
        let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
        let record = m.record_path(&lease.record.lease);
        fs::remove_file(&record).unwrap();
        fs::create_dir(&record).unwrap();
        assert!(matches!(
            m.release(&lease.record),
            Err(LeaseError::Residue(_))
        ));
        fs::remove_dir(&record).unwrap();
        // The empty pending directory a crash left before its owner file: removed.
        let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
        let pending = m.setup.run_root.join(format!(".{}", lease.record.lease));
        fs::create_dir_all(&pending).unwrap();
        m.release(&lease.record).unwrap();
        assert!(!pending.exists());
        // A link under the lease's name to a directory that says it is this lease's: the link
        // is not followed, the directory behind it is kept.
        let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
        let elsewhere = w.dir.path().join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        let owner = Owner {
            executor: lease.record.executor.clone(),
            store: lease.record.store.clone(),
            lease: lease.record.lease.clone(),
        };
        fs::write(
            elsewhere.join(OWNER_FILE),
            to_canonical_json(&owner).unwrap(),
        )
        .unwrap();
        std::os::unix::fs::symlink(&elsewhere, lease.run_dir()).unwrap();
        assert!(matches!(
            m.release(&lease.record),
            Err(LeaseError::Residue(_))
        ));
        assert!(elsewhere.join(OWNER_FILE).exists());
        fs::remove_file(lease.run_dir()).unwrap();
        m.release(&lease.record).unwrap();
        // A run directory outside the run root is never removed.
        let mut lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
        let outside = w.dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        for r in &mut lease.record.resources {
            if let Resource::RunDir { path } = r {
                *path = outside.clone();
            }
        }
        assert!(matches!(
            m.release(&lease.record),
            Err(LeaseError::Residue(_))
        ));
        assert!(outside.exists());
        // A run directory that cannot be looked at (the run root replaced by a file: ENOTDIR)
        // is not "absent": residue.
        let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
        let root = m.setup.run_root.clone();
        fs::remove_dir_all(&root).unwrap();
        fs::write(&root, b"not a directory").unwrap();
        assert!(matches!(
            m.release(&lease.record),
            Err(LeaseError::Residue(_))
        ));
        fs::remove_file(&root).unwrap();
    }

    /// An orphan run directory with a mount inside is unmounted, deepest first, before it is
    /// removed; a mount under the run root is residue for the check.
    #[test]
    fn an_orphan_run_directory_is_unmounted_inside_before_removal() {
        let w = world();
        let root = w.manager.setup.run_root.clone();
        let dir = root.join(std::iter::repeat_n('f', 32).collect::<String>());
        fs::create_dir_all(dir.join("staging/inner")).unwrap();
        let owner = Owner {
            executor: "fake".into(),
            store: w.manager.store.root().display().to_string(),
            lease: std::iter::repeat_n('f', 32).collect(),
        };
        fs::write(dir.join(OWNER_FILE), to_canonical_json(&owner).unwrap()).unwrap();
        let f = empty_host();
        f.file(
            "/proc/self/mountinfo",
            &format!(
                "90 1 0:50 / {} rw - tmpfs t rw\n91 90 0:51 / {} rw - tmpfs t rw\n",
                dir.join("staging").display(),
                dir.join("staging/inner").display()
            ),
        )
        .reply("list", ToolOutput::ok(b"[]"));
        let m = with_host(&w, f.clone());
        assert!(
            m.check()
                .unwrap()
                .iter()
                .any(|l| matches!(l, Leftover::Mount { .. })),
            "a mount under the run root is residue"
        );
        m.recover().unwrap();
        let unmounts: Vec<PathBuf> = f
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Unmount(p) => Some(p),
                _ => None,
            })
            .collect();
        assert_eq!(unmounts, [dir.join("staging/inner"), dir.join("staging")]);
        assert!(!dir.exists());
    }

    /// Orphan run directories (no record names them) are split by their owner file: this
    /// executor's and store's are listed and removed by recovery; another executor's or
    /// another store's are neither listed nor touched; one without a readable owner is listed
    /// and left; a name that is not a lease id is not looked at.
    #[test]
    fn orphan_run_directories_are_attributed_by_their_owner_file() {
        let w = world();
        let root = w.manager.setup.run_root.clone();
        let store = w.manager.store.root().display().to_string();
        let make = |name: &str, owner: Option<(&str, &str)>| {
            let dir = root.join(name);
            fs::create_dir_all(&dir).unwrap();
            if let Some((executor, store)) = owner {
                let o = Owner {
                    executor: executor.into(),
                    store: store.into(),
                    lease: name.trim_start_matches('.').into(),
                };
                fs::write(dir.join(OWNER_FILE), to_canonical_json(&o).unwrap()).unwrap();
            }
            dir
        };
        let hex = |c: char| std::iter::repeat_n(c, 32).collect::<String>();
        let ours = make(&hex('a'), Some(("fake", &store)));
        let pending = make(&format!(".{}", hex('b')), Some(("fake", &store)));
        let other_executor = make(&hex('c'), Some(("other", &store)));
        let other_store = make(&hex('d'), Some(("fake", "/elsewhere")));
        let unowned = make(&hex('e'), None);
        let not_a_lease = make("scratch", None);
        let short_hex = make("abcdef", None);
        let m = with_host(&w, {
            let f = empty_host();
            f.reply("list", ToolOutput::ok(b"[]"));
            f
        });
        let left = m.check().unwrap();
        let named = |d: &Path| {
            left.iter().any(
                |l| matches!(l, Leftover::RunDirectory { path, .. } if *path == d.display().to_string()),
            )
        };
        assert!(
            named(&ours) && named(&pending) && named(&unowned),
            "{left:?}"
        );
        assert!(
            !named(&other_executor)
                && !named(&other_store)
                && !named(&not_a_lease)
                && !named(&short_hex),
            "{left:?}"
        );
        // The owner tag accounts carry is the account module's, for this executor and store.
        assert_eq!(
            m.view().owner_tag(),
            crate::account::owner_tag("fake", w.manager.store.root())
        );
        assert!(
            matches!(m.recover(), Err(LeaseError::Residue(_))),
            "the unowned one"
        );
        assert!(!ours.exists() && !pending.exists());
        for kept in [&other_executor, &other_store, &unowned, &not_a_lease] {
            assert!(kept.exists(), "{} was touched", kept.display());
        }
    }

    /// Recovery whose release of a record leaves residue (a mount inside the run directory that
    /// will not unmount) keeps that record and its run directory whole, owner file included —
    /// the orphan sweep never removes around it — so a later recovery can still finish it.
    #[test]
    fn recovery_keeps_the_run_directory_of_a_lease_it_could_not_release() {
        let w = world();
        let lease = w
            .manager
            .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
            .unwrap();
        own_run_dir(&lease);
        let staging = lease.run_dir().join("staging");
        fs::create_dir(&staging).unwrap();
        let f = empty_host();
        f.file(
            "/proc/self/mountinfo",
            &format!("99 1 0:50 / {} rw - tmpfs tmpfs rw\n", staging.display()),
        )
        .reply("list", ToolOutput::ok(b"[]"))
        .fail(false, true, false);
        let m = with_host(&w, f);
        let items = match m.recover() {
            Err(LeaseError::Residue(r)) => r.items,
            other => panic!("an unmount that fails is residue: {other:?}"),
        };
        assert!(items.iter().any(|i| i.contains("staging")), "{items:?}");
        assert!(
            lease.run_dir().join(OWNER_FILE).exists(),
            "the kept run directory still says whose it is"
        );
        assert_eq!(m.records().unwrap().len(), 1, "the record is kept");
    }

    /// A run directory that was there before its lease (planted, or another writer's) stops
    /// provisioning and is never removed by that lease's release: it is residue naming what it
    /// is, and once the operator has dealt with it, the lease releases cleanly. One that names
    /// another lease as its owner is left alone the same way.
    #[test]
    fn a_run_directory_that_is_not_the_leases_own_is_never_removed() {
        let w = world();
        for planted_owner in [None, Some("another-lease"), Some("")] {
            let lease = w
                .manager
                .begin("sha256:a", cordon_testkit::in_an_hour())
                .unwrap();
            let dir = lease.run_dir().to_path_buf();
            fs::create_dir_all(&dir).unwrap();
            // `Some("")`: an empty directory, no owner file — still not this lease's.
            if planted_owner != Some("") {
                fs::write(dir.join("keep"), b"not cordon's").unwrap();
            }
            if let Some(other) = planted_owner.filter(|o| !o.is_empty()) {
                let owner = Owner {
                    executor: w.manager.setup.executor.clone(),
                    store: lease.record.store.clone(),
                    lease: other.into(),
                };
                fs::write(dir.join(OWNER_FILE), to_canonical_json(&owner).unwrap()).unwrap();
            }
            assert!(matches!(
                w.manager.provision(&lease),
                Err(LeaseError::RunDirExists(p)) if p == dir
            ));
            let err = w.manager.release(&lease.record).unwrap_err();
            assert!(
                matches!(&err, LeaseError::Residue(r) if r.items.iter().any(|i| i.contains(&*dir.to_string_lossy()))),
                "{err:?}"
            );
            assert!(dir.is_dir(), "the planted directory is left");
            if planted_owner != Some("") {
                assert_eq!(fs::read(dir.join("keep")).unwrap(), b"not cordon's");
            }
            assert_eq!(w.manager.records().unwrap().len(), 1, "the record is kept");
            fs::remove_dir_all(&dir).unwrap();
            w.manager.release(&lease.record).unwrap();
            assert!(w.manager.records().unwrap().is_empty());
        }
    }

    #[test]
    fn a_clean_release_lists_twice_and_unlinks_the_record() {
        let w = world();
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        w.manager.release(&lease.record).unwrap();
        assert!(w.manager.records().unwrap().is_empty());
        let lists = w
            .fake
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Run(l) if l.contains(" list ")))
            .count();
        assert_eq!(
            lists,
            3,
            "one listing before, two after: {:?}",
            w.fake.calls()
        );
    }

    /// A protected file (the bundle's config.json) is checked right before launch: each
    /// change — its mode, a second link, its size, its bytes at the same size, a link in its
    /// place — is refused by what it changed, and the file as written passes.
    #[test]
    fn a_protected_file_changed_in_any_way_is_refused_before_launch() {
        let w = world();
        let mut lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        own_run_dir(&lease);
        fs::create_dir_all(lease.bundle_dir()).unwrap();
        let path = w
            .manager
            .write_protected(&mut lease, "config.json", b"{\"a\":1}")
            .unwrap();
        w.manager.check_protected(&lease).unwrap();
        tamper_each_way(&path, 0o600, b"{\"a\":1}", true, &|why| {
            assert!(
                matches!(
                    w.manager.check_protected(&lease),
                    Err(LeaseError::Protected { .. })
                ),
                "{why}"
            );
        });
        // As written, it passes.
        fs::remove_file(&path).unwrap();
        w.manager
            .write_protected(&mut lease, "config.json", b"{\"a\":1}")
            .unwrap();
        w.manager.check_protected(&lease).unwrap();
    }

    /// Change the file at `path` (mode `mode`, content `good`) in each way a protected file
    /// must be refused for — its mode, a second link, its size, its bytes at the same size
    /// (when `hashed`), a link in its place — calling `refused` after each (the file restored
    /// in between).
    fn tamper_each_way(path: &Path, mode: u32, good: &[u8], hashed: bool, refused: &dyn Fn(&str)) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644)).unwrap();
        refused("mode");
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
        let link = path.with_file_name("second-name");
        fs::hard_link(path, &link).unwrap();
        refused("a second link");
        fs::remove_file(&link).unwrap();
        let mut longer = good.to_vec();
        longer.push(b'+');
        fs::write(path, &longer).unwrap();
        refused("size");
        if hashed {
            let mut other = good.to_vec();
            other[0] ^= 1;
            fs::write(path, &other).unwrap();
            refused("bytes at the same size");
        }
        fs::remove_file(path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", path).unwrap();
        refused("a link in its place");
    }

    #[test]
    fn the_secret_crosses_only_from_a_root_0400_single_link_file_of_its_size() {
        let w = world();
        let mut lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        own_run_dir(&lease);
        assert_eq!(
            Manager::read_secret(&lease).unwrap(),
            None,
            "no secret declared"
        );
        let path = w.manager.write_secret(&mut lease, b"KEY\n").unwrap();
        let m = fs::metadata(&path).unwrap();
        assert_eq!((m.mode() & 0o7777, m.nlink()), (0o400, 1));
        assert_eq!(Manager::read_secret(&lease).unwrap().unwrap(), b"KEY\n");
        // Each change before launch is refused by what it changed.
        // The secret's bytes are checked by size, not hashed (it is never stored).
        tamper_each_way(&path, 0o400, b"KEY\n", false, &|why| {
            assert!(
                matches!(
                    Manager::read_secret(&lease),
                    Err(LeaseError::Protected { .. })
                ),
                "{why}"
            );
        });
    }

    #[test]
    fn a_parser_childs_lease_owns_an_account_and_a_run_directory_and_asks_no_runtime() {
        let w = world();
        let lease = w
            .manager
            .begin_child("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        assert_eq!(kinds(&lease.record), ["account", "run-dir"]);
        w.manager.release(&lease.record).unwrap();
        assert!(w.manager.records().unwrap().is_empty());
        assert!(
            !w.fake
                .calls()
                .iter()
                .any(|c| matches!(c, Call::Run(l) if l.contains("runc"))),
            "no container, no runtime call: {:?}",
            w.fake.calls()
        );
    }

    #[test]
    fn a_parser_lease_left_by_a_crash_is_recovered() {
        let w = world();
        let lease = w
            .manager
            .begin_child("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        own_run_dir(&lease);
        fs::create_dir_all(lease.jail_dir()).unwrap();
        // The supervisor is gone (a crash): its record is read back and released by recovery.
        assert_eq!(w.manager.records().unwrap().len(), 1);
        let done = w.manager.recover().unwrap();
        assert!(
            done.contains(&format!("lease {}", lease.record.lease)),
            "{done:?}"
        );
        assert!(!lease.run_dir().exists());
        assert!(w.manager.records().unwrap().is_empty());
    }

    #[test]
    fn parser_leases_share_the_executor_and_never_beside_a_sole_holder_or_a_recovery() {
        // The world's executor, with its sole manager gone.
        let World {
            dir: _dir, manager, ..
        } = world();
        let (store, setup) = (manager.store.clone(), manager.setup.clone());
        drop(manager);
        let one = Manager::open_shared(&store, setup.clone()).unwrap();
        let two = Manager::open_shared(&store, setup.clone()).unwrap();
        assert!(
            matches!(
                Manager::open(&store, setup.clone()),
                Err(LeaseError::Busy { .. })
            ),
            "no container stage or recovery beside a parser"
        );
        assert!(
            matches!(one.recover(), Err(LeaseError::Busy { .. })),
            "a shared holder never recovers: the other holders own their records"
        );
        drop((one, two));
        let sole = Manager::open(&store, setup.clone()).unwrap();
        assert!(matches!(
            Manager::open_shared(&store, setup),
            Err(LeaseError::Busy { .. })
        ));
        drop(sole);
    }

    #[test]
    fn a_listing_that_does_not_parse_is_residue_and_keeps_the_record() {
        let w = world();
        let f = empty_host();
        f.reply("list", ToolOutput::ok(b"not json"));
        let m = with_host(&w, f.clone());
        let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
        let items = residue(m.release(&lease.record));
        assert!(items.iter().any(|i| i.contains("cannot list")), "{items:?}");
        // Nothing else is released under a container that may still run.
        assert!(
            !f.calls()
                .iter()
                .any(|c| matches!(c, Call::Run(l) if l.starts_with("userdel"))
                    || matches!(c, Call::Unmount(_) | Call::RemoveDir(_))),
            "{:?}",
            f.calls()
        );
        assert_eq!(
            m.records().unwrap().len(),
            1,
            "the record stays for a retry"
        );
        assert!(
            m.check().is_err(),
            "check cannot establish quiescence either"
        );
    }

    fn with_host(w: &World, fake: Arc<Fake>) -> Manager {
        let mut setup = w.manager.setup.clone();
        setup.runtime.host = fake;
        let store = w.manager.store.clone();
        // Same executor: the lock is per process-open file, so take it for this test's manager.
        Manager {
            store,
            setup,
            shared: false,
            _lock: Flock::lock(
                File::open(w.manager.store.root()).unwrap(),
                FlockArg::LockSharedNonblock,
            )
            .unwrap(),
        }
    }

    #[test]
    fn a_state_that_fails_is_an_error_but_a_vanished_container_is_not() {
        let w = world();
        let f = Arc::new(Fake::new());
        f.reply(
            "state gone",
            ToolOutput::failed("container gone does not exist"),
        )
        .reply("state broken", ToolOutput::failed("permission denied"))
        .reply(
            "list",
            ToolOutput::ok(br#"[{"id":"gone"},{"id":"broken"}]"#),
        );
        let m = with_host(&w, f.clone());
        let e = m.runtime().containers().unwrap_err();
        assert!(e.to_string().contains("state broken"), "{e}");
        let f = Arc::new(Fake::new());
        f.reply(
            "state gone",
            ToolOutput::failed("container gone does not exist"),
        )
        .reply("list", ToolOutput::ok(br#"[{"id":"gone"}]"#));
        let m = with_host(&w, f);
        assert!(m.runtime().containers().unwrap().is_empty());
        let f = Arc::new(Fake::new());
        f.reply("list", ToolOutput::ok(br#"[{"name":"no id"}]"#));
        assert!(matches!(
            with_host(&w, f).runtime().containers(),
            Err(crate::runtime::RuntimeError::Listing { .. })
        ));
    }

    #[test]
    fn a_mount_table_of_another_namespace_than_inits_is_never_quiescence() {
        let w = world();
        let f = empty_host();
        // A copied namespace: the same root mount under another id.
        f.reply("list", ToolOutput::ok(b"[]"))
            .file("/proc/1/mountinfo", "22 1 0:21 / / rw - ext4 /dev/vda rw\n")
            .file(
                "/proc/self/mountinfo",
                "901 900 0:21 / / rw - ext4 /dev/vda rw\n",
            );
        let mut m = with_host(&w, f.clone());
        m.setup.init_mountinfo = "/proc/1/mountinfo".into();
        let lease = m
            .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
            .unwrap();
        let items = residue(m.release(&lease.record));
        assert!(
            items.iter().any(|i| i.contains("mount namespace")),
            "{items:?}"
        );
        assert!(m.check().is_err());
        // The same tables in one namespace: the release goes through.
        f.file(
            "/proc/self/mountinfo",
            "22 1 0:21 / / rw - ext4 /dev/vda rw\n",
        );
        m.release(&lease.record).unwrap();
    }

    #[test]
    fn unreadable_passwd_group_or_mountinfo_is_never_quiescence() {
        for broken in ["/etc/passwd", "/etc/group", "/proc/self/mountinfo"] {
            let w = world();
            let f = empty_host();
            f.reply("list", ToolOutput::ok(b"[]")).unreadable(broken);
            let m = with_host(&w, f);
            // A lease with a mount point, so its release must read the mount table.
            let lease = m
                .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
                .unwrap();
            let items = residue(m.release(&lease.record));
            assert!(!items.is_empty(), "{broken}");
            assert!(m.check().is_err(), "check with {broken} unreadable");
            assert!(m.recover().is_err(), "recover with {broken} unreadable");
        }
    }

    #[test]
    fn resources_are_released_in_reverse_and_a_device_is_residue_until_drains_exist() {
        let w = world();
        let mut lease = w
            .manager
            .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
            .unwrap();
        assert_eq!(
            kinds(&lease.record),
            ["account", "run-dir", "mount", "cgroup", "container"]
        );
        lease.record.resources.push(Resource::Device {
            path: "/dev/nvidia0".into(),
        });
        let items = residue(w.manager.release(&lease.record));
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[0].starts_with("device /dev/nvidia0"), "{items:?}");
        // The run directory is kept whole while anything released before it remains.
        assert!(
            items[1].contains("kept while the residue above remains"),
            "{items:?}"
        );
        // The account (created first) was still released: every other step is attempted.
        assert!(w.fake.calls().iter().any(|c| matches!(c, Call::Edit(_))));
    }

    /// The kinds of a record's resources, in order.
    fn kinds(record: &Record) -> Vec<&'static str> {
        record
            .resources
            .iter()
            .map(|r| match r {
                Resource::Account { .. } => "account",
                Resource::RunDir { .. } => "run-dir",
                Resource::Mount { .. } => "mount",
                Resource::Cgroup { .. } => "cgroup",
                Resource::Container { .. } => "container",
                Resource::Device { .. } => "device",
            })
            .collect()
    }

    /// Replace a lease's record with `record`, as a tampering or a future writer would.
    fn overwrite_record(w: &World, record: &Record) {
        let path = w.manager.record_path(&record.lease);
        fs::remove_file(&path).unwrap();
        fs::write(&path, to_canonical_json(record).unwrap()).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn a_record_without_exactly_one_of_each_required_resource_stops_recovery() {
        // A container without its cgroup, or a cgroup without its container: no record cordon
        // writes (a parser child's lease has neither).
        for (drop_kind, named) in [("container", "container"), ("cgroup", "cgroup")] {
            let w = world();
            let lease = w
                .manager
                .begin("sha256:a", cordon_testkit::in_an_hour())
                .unwrap();
            let mut broken = lease.record.clone();
            broken.resources.retain(|r| match r {
                Resource::Container { .. } => drop_kind != "container",
                Resource::Cgroup { .. } => drop_kind != "cgroup",
                _ => true,
            });
            overwrite_record(&w, &broken);
            let e = w.manager.records().unwrap_err();
            assert!(e.to_string().contains(named), "{e}");
        }
    }

    #[test]
    fn a_cgroup_that_cannot_be_removed_is_residue() {
        let w = world();
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        let f = empty_host();
        let cgroup = w
            .manager
            .setup
            .cgroup_root
            .join("memory")
            .join(lease.cgroup_path().trim_start_matches('/'));
        f.reply("list", ToolOutput::ok(b"[]"))
            .unreadable(cgroup.clone());
        let m = with_host(&w, f.clone());
        let items = residue(m.release(&lease.record));
        assert!(items.iter().any(|i| i.starts_with("cgroup ")), "{items:?}");
        assert!(f.calls().contains(&Call::RemoveDir(cgroup)));
        assert_eq!(
            m.records().unwrap().len(),
            1,
            "the record stays for a retry"
        );
    }

    #[test]
    fn a_leftover_cgroup_is_never_quiescence_and_recovery_removes_it() {
        let w = world();
        let parent = w.manager.setup.cgroup_root.join("cordon/fake");
        let f = empty_host();
        f.file(
            w.manager.setup.cgroup_root.join("cgroup.controllers"),
            "memory pids",
        )
        .dir(&parent, &["0123456789abcdef0123456789abcdef"])
        .reply("list", ToolOutput::ok(b"[]"));
        let m = with_host(&w, f.clone());
        let left = m.check().unwrap();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(matches!(left[0], Leftover::Cgroup { .. }), "{left:?}");
        let done = m.recover().unwrap();
        assert!(done.iter().any(|d| d.starts_with("cgroup ")), "{done:?}");
        assert!(f.calls().contains(&Call::RemoveDir(
            parent.join("0123456789abcdef0123456789abcdef")
        )));
        // A parent that cannot be listed is not "no cgroups".
        let f = empty_host();
        f.file(
            w.manager.setup.cgroup_root.join("cgroup.controllers"),
            "memory pids",
        )
        .unreadable(parent)
        .reply("list", ToolOutput::ok(b"[]"));
        let err = with_host(&w, f).check().unwrap_err();
        assert!(err.to_string().contains("cgroup"), "{err}");
    }

    /// Three accounts in the range: this executor's and store's (by its owner tag), another
    /// executor's, and one without a tag. Recovery removes only the first; the check lists the
    /// first and the untagged one, never the other executor's.
    #[test]
    fn recovery_removes_only_accounts_that_carry_its_own_owner_tag() {
        let w = world();
        let tag = w.manager.view().owner_tag();
        let f = empty_host();
        f.file(
            "/etc/passwd",
            &format!(
                "cordon-00000001:x:5001:5001:{tag}:/nonexistent:/usr/sbin/nologin\n\
                 cordon-00000002:x:5002:5002:cordon other 0123456789abcdef:/nonexistent:/bin/false\n\
                 cordon-00000003:x:5003:5003::/nonexistent:/usr/sbin/nologin\n"
            ),
        )
        .file(
            "/etc/group",
            "cordon-00000001:x:5001:\ncordon-00000002:x:5002:\ncordon-00000003:x:5003:\n",
        )
        .reply("list", ToolOutput::ok(b"[]"));
        let m = with_host(&w, f.clone());
        let left = m.check().unwrap();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(
            left.iter()
                .any(|l| matches!(l, Leftover::Account { name, attributed: true, .. } if name == "cordon-00000001"))
        );
        assert!(
            left.iter()
                .any(|l| matches!(l, Leftover::Account { name, attributed: false, .. } if name == "cordon-00000003"))
        );
        let residue = match m.recover() {
            Err(LeaseError::Residue(r)) => r.items,
            other => panic!("the untagged account is residue: {other:?}"),
        };
        assert!(
            residue.iter().any(|r| r.contains("cordon-00000003")),
            "{residue:?}"
        );
        let removed: Vec<String> = f
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Run(line) if line.starts_with("userdel") => Some(line),
                _ => None,
            })
            .collect();
        assert_eq!(removed, ["userdel cordon-00000001"]);
    }

    #[test]
    fn an_executor_id_that_is_not_a_safe_name_is_refused() {
        let w = world();
        let mut setup = w.manager.setup.clone();
        setup.executor = "../../etc".into();
        assert!(matches!(
            Manager::open(&w.manager.store, setup),
            Err(LeaseError::Executor { .. })
        ));
        // Each rule alone: empty, too long, a leading dot, a byte outside the set.
        let long = "a".repeat(65);
        for bad in ["", long.as_str(), ".hidden", "a/b", "a b", "é"] {
            assert!(!executor_ok(bad), "{bad:?}");
        }
        let longest = "a".repeat(64);
        for good in ["a", longest.as_str(), "host-1_a.b"] {
            assert!(executor_ok(good), "{good:?}");
        }
    }

    /// Records are read only when they are what cordon writes: a regular 0600 file with one
    /// link; a record of another mode, or with a second link, stops the read.
    #[test]
    fn a_record_with_a_loose_mode_or_a_second_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let w = world();
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        let path = w.manager.record_path(&lease.record.lease);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            w.manager.records(),
            Err(LeaseError::Record { .. })
        ));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(w.manager.records().unwrap().len(), 1);
        let link = w.dir.path().join("second");
        fs::hard_link(&path, &link).unwrap();
        assert!(matches!(
            w.manager.records(),
            Err(LeaseError::Record { .. })
        ));
    }

    #[test]
    fn a_mount_that_will_not_unmount_is_residue() {
        let w = world();
        let f = empty_host();
        let lease = w
            .manager
            .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
            .unwrap();
        let point = lease.run_dir().join("staging");
        f.file(
            "/proc/self/mountinfo",
            &format!("40 22 0:50 / {} rw - tmpfs tmpfs rw\n", point.display()),
        )
        .reply("list", ToolOutput::ok(b"[]"))
        .fail(false, true, false);
        let m = with_host(&w, f.clone());
        let items = residue(m.release(&lease.record));
        assert!(items.iter().any(|i| i.starts_with("mount ")), "{items:?}");
        assert!(f.calls().contains(&Call::Unmount(point)));
        assert!(
            m.check()
                .unwrap()
                .iter()
                .any(|l| matches!(l, Leftover::LeaseRecord { .. }))
        );
    }
}

#[cfg(test)]
mod root_tests {
    //! The per-lease overlay root on the real kernel (root, as CI runs): writes land in the
    //! lease's upper directory, never in the shared lower image, and release unmounts it.

    use super::*;

    #[test]
    fn the_overlay_root_is_per_lease_and_release_removes_it() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts an overlay: run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        for f in ["passwd", "group"] {
            fs::write(dir.path().join(f), "").unwrap();
        }
        let setup = Setup {
            executor: "overlay-test".into(),
            runtime: Runtime {
                binary: cordon_testkit::runc(),
                state_root: dir.path().join("state"),
                host: crate::host::Linux::shared(),
            },
            run_root: dir.path().join("run"),
            lock_dir: dir.path().join("locks"),
            accounts: AccountPolicy {
                uids: cordon_testkit::account_range("cordon-lease", 0),
                gids: cordon_testkit::account_range("cordon-lease", 0),
                shell: "/usr/sbin/nologin".into(),
                cron_deny: dir.path().join("cron.deny"),
                at_deny: dir.path().join("at.deny"),
                passwd: dir.path().join("passwd"),
                group: dir.path().join("group"),
            },
            cgroup_root: dir.path().join("cgroup"),
            mountinfo: "/proc/self/mountinfo".into(),
            init_mountinfo: "/proc/self/mountinfo".into(),
        };
        let lower = dir.path().join("image");
        fs::create_dir_all(lower.join("etc")).unwrap();
        fs::write(lower.join("etc/base"), "image").unwrap();
        let m = Manager::open(&store, setup).unwrap();
        let lease = m
            .begin_with("sha256:a", &["rootfs"], cordon_testkit::in_an_hour())
            .unwrap();
        super::tests::own_run_dir(&lease);
        let run = &lease.run_dir();
        // A mount point the record does not name is refused before anything is mounted.
        assert!(
            m.mount_overlay(
                &lease,
                &run.join("other"),
                &lower,
                &run.join("overlay/upper"),
                &run.join("overlay/work")
            )
            .is_err()
        );
        let root = m
            .mount_overlay(
                &lease,
                &run.join("rootfs"),
                &lower,
                &run.join("overlay/upper"),
                &run.join("overlay/work"),
            )
            .unwrap();
        fs::write(root.join("etc/written"), "lease").unwrap();
        fs::write(root.join("etc/base"), "changed").unwrap();
        assert_eq!(fs::read_to_string(lower.join("etc/base")).unwrap(), "image");
        assert!(
            !lower.join("etc/written").exists(),
            "the shared image is untouched"
        );
        assert!(run.join("overlay/upper/etc/written").exists());
        m.release(&lease.record).unwrap();
        assert!(!run.exists(), "the run directory and its overlay are gone");
        assert!(m.check().unwrap().is_empty());
        assert_eq!(fs::read_to_string(lower.join("etc/base")).unwrap(), "image");
    }
}
