//! The rootless lease: the lease system for runs of an unprivileged service user (the agent
//! surface), which has no store of the host's, no account, cgroup or mount to own — only a
//! run directory and a container in a state directory of its own.
//!
//! It owns the layout of that state directory (`runs/<run>/`, the runtime's state root
//! `runc/`, the surface's receipt store and key), the run record and its publication, the
//! release of one run and the recovery and quiescence check `cordon-reap --surface` runs.
//!
//! - **Publication**: under a shared hold of `recovery.lock` (which recovery takes exclusively), a
//!   run directory (0700) and in it the record, created under a temporary name, locked, made
//!   durable and only then renamed into place: recovery never sees a run still being
//!   published. The record's lock is the supervisor's liveness: held for the run's whole life,
//!   it dies with the supervisor.
//! - **Release**: the runtime removes the container, its listing must no longer show it, no
//!   process of the service user may remain in the container's pid namespace (noted in
//!   `pidns` right after create), and the run directory is removed, the record last. Anything
//!   that cannot be established is [`Residue`], never "gone".
//! - **Recovery**: a record nobody holds is a dead supervisor's run: released as above. A run
//!   directory with no published record crashed before its container could exist.
//!
//! Every process and runtime step goes through the host seam, so each failure path is driven
//! by the fake (see the tests).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{BootTime, EXPIRY_GRACE, LeaseError, Residue, Supervisor, io};
use crate::runtime::Runtime;
use cordon_evidence::inputs::Tier;
use cordon_evidence::residue::Leftover;

/// The state directory's subdirectory of run directories.
pub const RUNS: &str = "runs";
/// The state directory's subdirectory the runtime keeps its state in.
pub const RUNTIME_STATE: &str = "runc";
/// A run directory's record.
pub const RECORD: &str = "record.json";
/// The record before it is published.
pub const RECORD_PENDING: &str = "record.json.pending";
/// A run directory's note of its container's pid namespace (written after create).
pub const PIDNS: &str = "pidns";
/// The note before it is published.
const PIDNS_PENDING: &str = "pidns.pending";
/// The state directory's lock that orders run publication before recovery.
pub const REAP_LOCK: &str = "recovery.lock";
/// The state directory's store of surface and surface-reap receipts (each signed).
pub const RECEIPTS: &str = "store";

/// The quarantine scope of every run of a surface, in its own store
/// (`Scope::Executor(QUARANTINE_SCOPE)`): residue of one run stops the next.
pub const QUARANTINE_SCOPE: &str = "surface";
/// The state directory's signing key directory: the service user's own key, outside its store
/// and outside every workspace (the host key is root's).
pub const KEYS: &str = "keys";
/// How long the processes of a killed pid namespace may take to leave.
pub const EXIT_GRACE: Duration = Duration::from_secs(10);
/// The rootless record's schema (2: the deadline is a [`BootTime`]).
pub const ROOTLESS_SCHEMA: u32 = 2;
/// The most a record may hold: it is a few hundred bytes.
const RECORD_MAX: u64 = 64 * 1024;

/// A run's durable record, `runs/<run>/record.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`ROOTLESS_SCHEMA`].
    pub schema: u32,
    /// The run (and container) id.
    pub run: String,
    /// The authority identity the run is under.
    pub authority: String,
    /// RFC 3339.
    pub created_at: String,
    /// The run's absolute deadline, on the boot it began in: a supervisor still holding the
    /// record past it (and [`EXPIRY_GRACE`]), or a record of an earlier boot, is reported, never
    /// trusted as live.
    pub deadline: BootTime,
    /// The supervising process.
    pub supervisor: Supervisor,
    /// The workspace.
    pub workspace: PathBuf,
    /// The tier.
    pub tier: Tier,
}

/// Where rootless runs live.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The runtime; its state root is the state directory's [`RUNTIME_STATE`].
    pub runtime: Runtime,
    /// The state directory (the service user's own, 0700).
    pub state: PathBuf,
    /// The service user: the only owner whose processes a release looks for.
    pub uid: u32,
    /// How long the processes of a killed pid namespace may take to leave.
    pub exit_grace: Duration,
    /// The program a run's [`watchdog`](super::watchdog) runs (`/proc/self/exe` in production).
    pub watchdog: PathBuf,
}

impl Setup {
    /// The run directory of `run`.
    #[must_use]
    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.state.join(RUNS).join(run)
    }

    fn host(&self) -> &dyn crate::host::Host {
        &*self.runtime.host
    }
}

/// A run in progress: its record published and locked, its [`watchdog`](super::watchdog)
/// armed. Dropping it without [`Run::release`] leaves the record for recovery, as a crash
/// would, and the watchdog ends the container.
#[derive(Debug)]
pub struct Run {
    record: Record,
    dir: PathBuf,
    namespace: Option<u64>,
    watchdog: crate::host::Process,
    _lock: Flock<File>,
}

/// A directory of the state tree, made if missing: 0700 and this user's, else refused.
///
/// # Errors
/// It cannot be made, or exists as anything else.
pub fn private_dir(path: &Path) -> Result<(), LeaseError> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => existing_private_dir(path),
        Err(e) => Err(io("make", path)(e)),
    }
}

/// A directory that must already exist (the state directory itself: a mistyped one is never
/// made), a directory of this user's closed to others, not a link.
///
/// # Errors
/// It is not there, or is anything else.
pub fn existing_private_dir(path: &Path) -> Result<(), LeaseError> {
    let m = fs::symlink_metadata(path).map_err(io("examine", path))?;
    if m.is_dir() && m.mode() & 0o077 == 0 && m.uid() == nix::unistd::geteuid().as_raw() {
        Ok(())
    } else {
        Err(io("use", path)(std::io::Error::other(
            "not a private directory of this user's",
        )))
    }
}

fn fsync_dir(path: &Path) -> Result<(), LeaseError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", path))
}

fn lock_file(path: &Path, shared: bool) -> Result<Flock<File>, LeaseError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(io("open", path))?;
    let arg = if shared {
        FlockArg::LockShared
    } else {
        FlockArg::LockExclusive
    };
    Flock::lock(file, arg)
        .map_err(|(_, e)| io("lock", path)(std::io::Error::from_raw_os_error(e as i32)))
}

/// Publish `record`'s run: its directory and its record, locked before it is published under
/// its name, all while recovery is held off.
///
/// # Errors
/// The state directory cannot hold it.
pub fn begin(setup: &Setup, record: Record) -> Result<Run, LeaseError> {
    let runs = setup.state.join(RUNS);
    private_dir(&runs)?;
    private_dir(&setup.state.join(RUNTIME_STATE))?;
    let gate = lock_file(&setup.state.join(REAP_LOCK), true)?;
    let dir = setup.run_dir(&record.run);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(io("make", &dir))?;
    let pending = dir.join(RECORD_PENDING);
    let file = crate::store::create_exclusive(&pending, 0o600)?;
    let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| io("lock", &pending)(std::io::Error::from_raw_os_error(e as i32)))?;
    let text = serde_json::to_vec(&record)
        .map_err(|e| io("encode", &pending)(std::io::Error::other(e)))?;
    lock.write_all(&text)
        .and_then(|()| lock.sync_all())
        .map_err(io("write", &pending))?;
    let published = dir.join(RECORD);
    // Armed before the record is published: from its first moment, the container it names is
    // ended at the deadline or when this process is gone, whoever else runs or not.
    let watch = super::watchdog::Watch::for_run(
        &setup.watchdog,
        &published,
        &dir,
        &record.run,
        &record.deadline,
        // The init alone: its pid namespace dies with it, and a rootless runtime on cgroup v1
        // has no cgroup in which to find the rest (`kill --all` fails there).
        setup.runtime.tool(&["kill", &record.run, "KILL"]),
    );
    let watchdog = super::watchdog::start(setup.host(), &watch)
        .map_err(io("start the watchdog of", &published))?;
    fs::rename(&pending, &published).map_err(io("publish", &published))?;
    fsync_dir(&dir)?;
    fsync_dir(&runs)?;
    drop(gate);
    Ok(Run {
        record,
        dir,
        namespace: None,
        watchdog,
        _lock: lock,
    })
}

impl Run {
    /// Its run directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its record.
    #[must_use]
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Note the pid namespace of the container's init `pid`, for this release and recovery's.
    ///
    /// # Errors
    /// It cannot be read or noted.
    pub fn note_namespace(&mut self, setup: &Setup, pid: i32) -> Result<(), LeaseError> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let pid = u32::try_from(pid).map_err(|_| {
            io("read the pid namespace of", &proc)(std::io::Error::other("bad pid"))
        })?;
        let ns = setup
            .host()
            .pid_namespace(pid)
            .map_err(io("read the pid namespace of", &proc))?
            .1
            .ok_or_else(|| {
                io("read the pid namespace of", &proc)(std::io::Error::other("unreadable"))
            })?;
        self.namespace = Some(ns);
        // Durable and whole, or absent: a torn note would be read as another namespace.
        let note = self.dir.join(PIDNS);
        let pending = self.dir.join(PIDNS_PENDING);
        let mut f = crate::store::create_exclusive(&pending, 0o600)?;
        f.write_all(ns.to_string().as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io("write", &pending))?;
        fs::rename(&pending, &note).map_err(io("publish", &note))?;
        fsync_dir(&self.dir)
    }

    /// Release the run (see the module documentation); its record's lock is held until the
    /// release has finished.
    ///
    /// # Errors
    /// [`LeaseError::Residue`] naming what remains or could not be established.
    pub fn release(self, setup: &Setup) -> Result<(), LeaseError> {
        // Held shared while the run directory goes: recovery (exclusive) never sees it half
        // removed — a directory without its record — and removes it under this release.
        let _gate = lock_file(&setup.state.join(REAP_LOCK), true)?;
        release(setup, &self.record.run, self.namespace).map_err(|l| {
            LeaseError::Residue(Residue {
                items: vec![l.to_string()],
            })
        })?;
        // The record is gone: the watchdog exits at its pipe's end.
        super::watchdog::end(self.watchdog).map_err(|why| Residue { items: vec![why] }.into())
    }
}

/// Processes of the service user in pid namespace `ns`, through the seam; one of its
/// processes whose namespace cannot be read is reported too (it cannot be proven outside).
fn left_in(setup: &Setup, ns: u64) -> Result<Vec<String>, std::io::Error> {
    let mut left = Vec::new();
    for name in setup.host().list_dir(Path::new("/proc"))? {
        let Ok(pid) = name.parse::<u32>() else {
            continue;
        };
        match setup.host().pid_namespace(pid) {
            // Another user's: the container maps only the service user.
            Ok((uid, _)) if uid != setup.uid => {}
            Ok((_, Some(n))) if n == ns => left.push(pid.to_string()),
            Ok((_, Some(_))) => {}
            Ok((_, None)) => left.push(format!("{pid} (namespace unreadable)")),
            // Exited between the listing and the read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => left.push(format!("{pid} (unreadable: {e})")),
        }
    }
    Ok(left)
}

/// Remove run `run`'s container, prove it and the processes of its pid namespace `ns` gone,
/// remove its run directory, the record last.
///
/// # Errors
/// The one thing that remains or could not be established.
pub fn release(setup: &Setup, run: &str, ns: Option<u64>) -> Result<(), Leftover> {
    let residue = |why: String| Leftover::Run {
        run: run.to_owned(),
        why,
    };
    setup
        .runtime
        .remove(run)
        .map_err(|e| residue(format!("the runtime cannot remove its container: {e}")))?;
    let listed = setup
        .runtime
        .containers()
        .map_err(|e| residue(format!("the runtime's listing: {e}")))?;
    if listed.iter().any(|(id, _)| id == run) {
        return Err(residue("the runtime still lists its container".into()));
    }
    if let Some(ns) = ns {
        // The namespace's init was sent SIGKILL, so every process in it is dying; one still
        // there after the grace is residue.
        let until = Instant::now() + setup.exit_grace;
        loop {
            let left =
                left_in(setup, ns).map_err(|e| residue(format!("cannot list processes: {e}")))?;
            if left.is_empty() {
                break;
            }
            if Instant::now() >= until {
                return Err(residue(format!(
                    "processes in its pid namespace: {}",
                    left.join(", ")
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let dir = setup.run_dir(run);
    for name in [
        "root",
        "config.json",
        "init.pid",
        PIDNS,
        PIDNS_PENDING,
        RECORD_PENDING,
        super::ENDED_BY_REAP,
        // The surface's run-scoped skill snapshot and its egress proxy's socket.
        "skills",
        "egress.sock",
        // The start gate's directory (its FIFO is unlinked once opened, or still in it).
        super::GATE_DIR,
    ] {
        let p = dir.join(name);
        let gone = match fs::symlink_metadata(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Ok(m) if m.is_dir() => fs::remove_dir_all(&p),
            Ok(_) => fs::remove_file(&p),
            Err(e) => Err(e),
        };
        gone.map_err(|e| residue(format!("cannot remove {}: {e}", p.display())))?;
    }
    fs::remove_file(dir.join(RECORD))
        .and_then(|()| fs::remove_dir(&dir))
        .map_err(|e| residue(format!("cannot remove {}: {e}", dir.display())))
}

/// What a run directory holds, as recovery sees it.
enum Found {
    /// No published record: the run crashed before its container could exist.
    Unpublished,
    /// A supervisor holds the record.
    Live(Record),
    /// Nobody holds it: the record (locked now by this process) and the noted namespace.
    Dead(Record, Option<u64>, Flock<File>),
    /// Released by its own supervisor while recovery looked.
    Gone,
}

/// Read a run directory's record: a regular file of this user's with one link, not too large,
/// in the schema. Anything else stops recovery of that run.
fn read_record(path: &Path) -> Result<Option<(Record, File)>, LeaseError> {
    let unsafe_record = |why: String| LeaseError::Record {
        path: path.to_path_buf(),
        why,
    };
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unsafe_record(format!("cannot open it: {e}"))),
    };
    let m = file.metadata().map_err(io("examine", path))?;
    if !m.is_file() || m.nlink() != 1 || m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(unsafe_record(
            "not a regular file of this user's with one link".into(),
        ));
    }
    let mut text = Vec::new();
    (&mut file)
        .take(RECORD_MAX + 1)
        .read_to_end(&mut text)
        .map_err(io("read", path))?;
    if text.len() as u64 > RECORD_MAX {
        return Err(unsafe_record("too large".into()));
    }
    let record: Record =
        serde_json::from_slice(&text).map_err(|e| unsafe_record(format!("not a record: {e}")))?;
    if record.schema != ROOTLESS_SCHEMA {
        return Err(unsafe_record(format!("schema {}", record.schema)));
    }
    if path.parent().and_then(Path::file_name) != Some(record.run.as_ref()) {
        return Err(unsafe_record(format!(
            "names run {:?}, not its directory",
            record.run
        )));
    }
    Ok(Some((record, file)))
}

fn found(dir: &Path) -> Result<Found, LeaseError> {
    let Some((record, file)) = read_record(&dir.join(RECORD))? else {
        return Ok(Found::Unpublished);
    };
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(Found::Live(record)),
        Err((_, e)) => {
            return Err(io("lock", &dir.join(RECORD))(
                std::io::Error::from_raw_os_error(e as i32),
            ));
        }
    };
    // Unlinked between the open and the lock: its supervisor released it and let go.
    if lock
        .metadata()
        .map_err(io("examine", &dir.join(RECORD)))?
        .nlink()
        == 0
    {
        return Ok(Found::Gone);
    }
    let note = dir.join(PIDNS);
    let ns = match fs::read_to_string(&note) {
        Ok(text) => Some(text.trim().parse::<u64>().map_err(|e| LeaseError::Record {
            path: note.clone(),
            why: format!("not a namespace inode: {e}"),
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("read", &note)(e)),
    };
    Ok(Found::Dead(record, ns, lock))
}

/// What recovery or the check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Runs of dead supervisors this recovery released.
    pub released: Vec<String>,
    /// Runs whose supervisor holds the record, within their deadline.
    pub active: Vec<Record>,
    /// What remains: dead runs not released, expired runs, containers no run owns.
    pub residue: Vec<Leftover>,
}

/// Recover (`change`) or only look: every run directory, under `recovery.lock` held exclusively
/// so no run is mid-publication, then the runtime's containers that no run directory owns.
/// One run's residue — a record in doubt included — does not stop the others; a state
/// directory that is not there is an error, never "nothing there".
///
/// # Errors
/// The state directory or a record cannot be read.
pub fn observe(setup: &Setup, change: bool, now: &BootTime) -> Result<Observed, LeaseError> {
    let mut out = Observed::default();
    let _gate = lock_file(&setup.state.join(REAP_LOCK), false)?;
    let runs = setup.state.join(RUNS);
    let mut names = Vec::new();
    match fs::read_dir(&runs) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(io("read", &runs))?;
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("read", &runs)(e)),
    }
    names.sort();
    for run in &names {
        let dir = runs.join(run);
        let seen = match found(&dir) {
            Ok(seen) => seen,
            // One run in doubt is that run's residue; the others are still recovered.
            Err(e) => {
                out.residue.push(Leftover::Run {
                    run: run.clone(),
                    why: crate::error_chain(&e),
                });
                continue;
            }
        };
        match seen {
            Found::Gone => {}
            Found::Live(record) => {
                if record.deadline.passed(EXPIRY_GRACE, now) {
                    out.residue.push(Leftover::Run {
                        why: format!(
                            "past its deadline, its supervisor (pid {}) still holds it",
                            record.supervisor.pid
                        ),
                        run: record.run,
                    });
                } else {
                    out.active.push(record);
                }
            }
            Found::Unpublished if change => {
                let _ = fs::remove_file(dir.join(RECORD_PENDING));
                match fs::remove_dir(&dir) {
                    Ok(()) => out.released.push(run.clone()),
                    Err(e) => out.residue.push(Leftover::Run {
                        run: run.clone(),
                        why: format!("cannot remove {}: {e}", dir.display()),
                    }),
                }
            }
            Found::Unpublished => out.residue.push(Leftover::RunDirectory {
                path: dir.display().to_string(),
                attributed: false,
            }),
            Found::Dead(record, ns, lock) if change => {
                // The supervisor is gone: `remove` ends the container (its init, so its pid
                // namespace); the listing and the namespace prove them gone.
                match release(setup, &record.run, ns) {
                    Ok(()) => out.released.push(record.run),
                    Err(left) => out.residue.push(left),
                }
                drop(lock);
            }
            Found::Dead(record, ..) => out.residue.push(Leftover::LeaseRecord {
                lease: record.run,
                path: dir.join(RECORD).display().to_string(),
            }),
        }
    }
    let listed = setup.runtime.containers()?;
    for (id, _) in listed {
        if !names.contains(&id) {
            out.residue.push(Leftover::Container { id });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
