//! One surface run, applied: from the checked inputs to the released container.
//!
//! Sequence (each step's why is on the step):
//! 0. the invoker holds no supplementary group (rootless runc cannot drop them, so they would
//!    cross into the container);
//! 1. under a shared hold of the state directory's `reap.lock` (which `reap` takes
//!    exclusively), a run directory of its own (`runs/<id>`, 0700) and in it the run record,
//!    created under a temporary name, locked, made durable and only then renamed into place:
//!    `reap` never sees a run that is still being published;
//! 2. home and temp made beneath the workspace without following links, the empty root made,
//!    the plan written as `config.json`;
//! 3. create; the container's pid namespace recorded (`pidns`, for the release and `reap`);
//!    the directory the runtime mounted at the workspace's destination proven to be the one
//!    that was checked (device and inode, through the container's root), else the run never
//!    starts; then start, wait under the absolute deadline, delete — with the runtime's state
//!    root in the state directory (`runc/`);
//! 4. release, always: the runtime must no longer list the container, no process may remain
//!    in the container's pid namespace, and the run directory is removed, the record last.
//!    Anything that cannot be established is residue: a no-decision, never a result, and it
//!    takes precedence over any other error.
//!
//! Crash story: a supervisor killed anywhere after step 1 leaves a record whose lock died with
//! it; `cordon-surface reap` finds it, removes the container from the runtime's state root,
//! proves it and its pid namespace's processes gone and removes the run directory. Until reap
//! runs, a run whose supervisor died has no deadline: run reap on a timer. What it does not own: what ARGV does inside
//! (the OS boundary bounds it), the policy's checks (the language and the planner) and the
//! receipt (the CLI).

use cordon::ExitCode;
use cordon::exit::ExitClass;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon::container::Stdio3;
use cordon::runtime::{Finished, OutputCaps, Runtime, RuntimeError};
use cordon_policy_lang::Policy;
use cordon_stage::bundle::PlanError;
use cordon_stage::surface::{self, SurfaceInputs, SurfacePlan, Tier};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::trust::{self, TrustError};

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
/// The state directory's lock that orders run publication before reap.
pub const REAP_LOCK: &str = "reap.lock";
/// The state directory's store of surface receipts (each signed, as every stage's).
pub const RECEIPTS: &str = "store";
/// The state directory's signing key directory: the surface's own key, the service user's,
/// outside its store and outside every workspace (the host key is root's).
pub const KEYS: &str = "keys";
/// How long the processes of a killed pid namespace may take to leave.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Why a run could not be established or released.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RunError {
    /// The inputs are not to be trusted (exit 2).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Trust(#[from] TrustError),
    /// The policy's surface cannot be planned (exit 2, or 3 for a control this host cannot
    /// apply).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] PlanError),
    /// The runtime failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Runtime(#[from] RuntimeError),
    /// The run's state could not be written or read.
    #[error("cannot {what} {path}")]
    #[diagnostic(code(cordon::surface::state))]
    State {
        /// What.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The invoker holds supplementary groups, which a rootless runtime cannot drop.
    #[error(
        "the service user holds supplementary groups {groups:?}, which would cross into the surface"
    )]
    #[diagnostic(
        code(cordon::surface::groups),
        help("run the service with no supplementary groups (systemd: no SupplementaryGroups=)")
    )]
    Groups {
        /// The groups.
        groups: Vec<u32>,
    },
    /// The workspace's contents keep the run from being prepared (a link or a file where home
    /// or temp goes), or the directory the runtime mounted is not the one checked.
    #[error("the workspace cannot be prepared for the run")]
    #[diagnostic(code(cordon::surface::prepare))]
    Prepare(#[source] TrustError),
    /// The release could not prove the run gone.
    #[error("run {run} left residue: {what}")]
    #[diagnostic(
        code(cordon::surface::residue),
        help("cordon-surface reap removes what a run left; until then this is a no-decision")
    )]
    Residue {
        /// The run.
        run: String,
        /// What remains or could not be established.
        what: String,
    },
}

impl ExitClass for RunError {
    /// Untrusted inputs and a plan the policy cannot make are wiring errors (2), except a
    /// control this host cannot apply; anything else is a no-decision (3).
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Trust(_) => ExitCode::Usage,
            Self::Plan(PlanError::Unenforceable { .. }) => ExitCode::NoDecision,
            Self::Plan(_) => ExitCode::Usage,
            Self::Runtime(_)
            | Self::State { .. }
            | Self::Residue { .. }
            | Self::Groups { .. }
            | Self::Prepare(_) => ExitCode::NoDecision,
        }
    }
}

impl cordon_stage::receipt_io::Infrastructure for RunError {
    fn reason_code(&self) -> &'static str {
        "surface.infrastructure"
    }
}

fn state_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RunError + 'a {
    move |source| RunError::State {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A run's durable record: what `reap` needs to remove it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The run (and container) id.
    pub run: String,
    /// The workspace.
    pub workspace: PathBuf,
    /// The tier.
    pub tier: Tier,
}

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct Request {
    /// The workspace, checked.
    pub workspace: trust::Workspace,
    /// The tier.
    pub tier: Tier,
    /// The exact argv.
    pub argv: Vec<String>,
    /// The invoker's environment.
    pub invoker_env: BTreeMap<OsString, OsString>,
}

/// Where a run happens: the host facts the CLI established.
#[derive(Debug, Clone)]
pub struct Host {
    /// The runtime (its state root is the state directory's `runc/`).
    pub runtime: Runtime,
    /// The state directory, checked.
    pub state: PathBuf,
    /// The service user's uid.
    pub uid: u32,
    /// The service user's gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// The authority identity.
    pub authority: String,
}

impl Host {
    /// The run directory of `run`.
    #[must_use]
    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.state.join(RUNS).join(run)
    }
}

/// What a finished run established.
#[derive(Debug)]
pub struct Ran {
    /// The run id.
    pub run: String,
    /// The plan it ran (its spec, environment names and settings).
    pub plan: SurfacePlan,
    /// The container's meta record and kept output.
    pub finished: Finished,
}

/// A directory of the state tree, made if missing, 0700.
fn private_dir(path: &Path) -> Result<(), RunError> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(path).map_err(state_err("examine", path))?;
            if m.is_dir() && m.mode() & 0o077 == 0 {
                Ok(())
            } else {
                Err(RunError::State {
                    what: "use",
                    path: path.to_path_buf(),
                    source: std::io::Error::other("not a private directory"),
                })
            }
        }
        Err(e) => Err(state_err("make", path)(e)),
    }
}

fn fsync_dir(path: &Path) -> Result<(), RunError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(state_err("sync", path))
}

/// Run `req` under `policy` on `host`: see the module documentation. The record's lock is held
/// until the release has finished.
///
/// # Errors
/// The run could not be established, or its release could not prove it gone (then the error
/// is the residue, whatever the run did).
pub fn run(policy: &Policy, host: &Host, req: &Request) -> Result<Ran, RunError> {
    let started = Instant::now();
    let extra: Vec<u32> = host
        .groups
        .iter()
        .copied()
        .filter(|g| *g != host.gid)
        .collect();
    if !extra.is_empty() {
        return Err(RunError::Groups { groups: extra });
    }
    let runs = host.state.join(RUNS);
    private_dir(&runs)?;
    private_dir(&host.state.join(RUNTIME_STATE))?;
    let run = format!("cs-{}", &cordon::lease::fresh_id()[..20]);
    let dir = host.run_dir(&run);
    let lock = publish(host, req, &run, &dir)?;
    let mut ns = None;
    let result = contain(policy, host, req, &run, &dir, started, &mut ns);
    let released = release(host, &run, ns);
    drop(lock);
    // Residue first: a run that cannot be proven gone is a no-decision whatever else failed.
    released?;
    result
}

fn lock_file(path: &Path, shared: bool) -> Result<Flock<File>, RunError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(state_err("open", path))?;
    let arg = if shared {
        FlockArg::LockShared
    } else {
        FlockArg::LockExclusive
    };
    Flock::lock(file, arg)
        .map_err(|(_, e)| state_err("lock", path)(std::io::Error::from_raw_os_error(e as i32)))
}

/// Step 1: the run directory and its record, locked before it is published under its name,
/// all while `reap` is held off.
fn publish(host: &Host, req: &Request, run: &str, dir: &Path) -> Result<Flock<File>, RunError> {
    let gate = lock_file(&host.state.join(REAP_LOCK), true)?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(state_err("make", dir))?;
    let pending = dir.join(RECORD_PENDING);
    let record = Record {
        run: run.to_owned(),
        workspace: req.workspace.path.clone(),
        tier: req.tier,
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&pending)
        .map_err(state_err("create", &pending))?;
    let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        state_err("lock", &pending)(std::io::Error::from_raw_os_error(e as i32))
    })?;
    let text = serde_json::to_vec(&record).map_err(|e| RunError::State {
        what: "encode",
        path: pending.clone(),
        source: std::io::Error::other(e),
    })?;
    lock.write_all(&text)
        .and_then(|()| lock.sync_all())
        .map_err(state_err("write", &pending))?;
    let record_path = dir.join(RECORD);
    std::fs::rename(&pending, &record_path).map_err(state_err("publish", &record_path))?;
    fsync_dir(dir)?;
    fsync_dir(&host.state.join(RUNS))?;
    drop(gate);
    Ok(lock)
}

/// Steps 2 and 3; the container's pid namespace goes to `ns` as soon as it exists.
fn contain(
    policy: &Policy,
    host: &Host,
    req: &Request,
    run: &str,
    dir: &Path,
    started: Instant,
    ns: &mut Option<u64>,
) -> Result<Ran, RunError> {
    let (_, block) = surface::surface_of(policy)?;
    // The agent's home and temp exist before it starts, made without following any link.
    trust::make_beneath(&req.workspace, &block.home).map_err(RunError::Prepare)?;
    trust::make_beneath(&req.workspace, &block.temp).map_err(RunError::Prepare)?;
    let root = dir.join("root");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(state_err("make", &root))?;
    let plan = surface::plan(
        policy,
        &SurfaceInputs {
            argv: req.argv.clone(),
            tier: req.tier,
            uid: host.uid,
            gid: host.gid,
            root,
            workspace: req.workspace.path.clone(),
            invoker_env: req.invoker_env.clone(),
            run: run.to_owned(),
            authority: host.authority.clone(),
        },
    )?;
    let config = dir.join("config.json");
    let bytes = serde_json::to_vec_pretty(&plan.spec).map_err(|e| RunError::State {
        what: "encode",
        path: config.clone(),
        source: std::io::Error::other(e),
    })?;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&config)
        .and_then(|mut f| f.write_all(&bytes))
        .map_err(state_err("write", &config))?;
    let deadline = started + Duration::from_millis(plan.settings.deadline_ms);
    let caps = OutputCaps {
        stdout: plan.settings.output.stdout_bytes,
        stderr: plan.settings.output.stderr_bytes,
    };
    let created = host
        .runtime
        .create(run, dir, Stdio3::captured(None, caps))?;
    let pid = created.pid();
    let ns_link = PathBuf::from(format!("/proc/{pid}/ns/pid"));
    let id = std::fs::metadata(&ns_link)
        .map_err(state_err("read the pid namespace", &ns_link))?
        .ino();
    *ns = Some(id);
    let note = dir.join(PIDNS);
    std::fs::write(&note, id.to_string()).map_err(state_err("write", &note))?;
    // The directory the runtime mounted, seen through the container's root, is the one whose
    // ownership was checked: a rename race above the workspace path cannot substitute another.
    let mounted = PathBuf::from(format!("/proc/{pid}/root{}", plan.settings.workspace_dest));
    let seen = std::fs::metadata(&mounted).map_err(state_err("examine", &mounted))?;
    if !req.workspace.is(&seen) {
        return Err(RunError::Prepare(TrustError::Workspace {
            path: req.workspace.path.clone(),
            why: "the directory the runtime mounted is not the one that was checked".into(),
        }));
    }
    let finished = created.start()?.wait_without_cgroup(deadline)?.delete()?;
    Ok(Ran {
        run: run.to_owned(),
        plan,
        finished,
    })
}

/// Processes of `uid` in pid namespace `ns`; a process of `uid` whose namespace cannot be read
/// is reported too (it cannot be proven outside).
fn left_in(ns: u64, uid: u32) -> Result<Vec<String>, std::io::Error> {
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(m) = entry.metadata() else { continue };
        if m.uid() != uid {
            continue;
        }
        match std::fs::metadata(entry.path().join("ns/pid")) {
            Ok(n) if n.ino() != ns => {}
            Ok(_) => left.push(pid.to_owned()),
            // Exited between the listing and the read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => left.push(format!("{pid} (namespace unreadable: {e})")),
        }
    }
    Ok(left)
}

/// Step 4 (and `reap`'s): remove the container, prove it and its processes gone, remove the
/// run directory, the record last.
///
/// # Errors
/// [`RunError::Residue`] naming what remains or could not be established.
pub fn release(host: &Host, run: &str, ns: Option<u64>) -> Result<(), RunError> {
    let residue = |what: String| RunError::Residue {
        run: run.to_owned(),
        what,
    };
    host.runtime
        .remove(run)
        .map_err(|e| residue(format!("the runtime cannot remove it: {e}")))?;
    let listed = host
        .runtime
        .containers()
        .map_err(|e| residue(format!("the runtime's listing: {e}")))?;
    if listed.iter().any(|(id, _)| id == run) {
        return Err(residue("the runtime still lists the container".into()));
    }
    if let Some(ns) = ns {
        // Killed processes take a moment to leave: the namespace's init was sent SIGKILL, so
        // every process in it is dying; one still there after the grace is residue.
        let until = Instant::now() + EXIT_GRACE;
        loop {
            let left = left_in(ns, host.uid)
                .map_err(|e| residue(format!("cannot list processes: {e}")))?;
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
    let dir = host.run_dir(run);
    for name in ["root", "config.json", "init.pid", PIDNS, RECORD_PENDING] {
        let p = dir.join(name);
        let gone = match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            Ok(_) => std::fs::remove_file(&p),
            Err(e) => Err(e),
        };
        gone.map_err(|e| residue(format!("cannot remove {}: {e}", p.display())))?;
    }
    std::fs::remove_file(dir.join(RECORD))
        .and_then(|()| std::fs::remove_dir(&dir))
        .map_err(|e| residue(format!("cannot remove {}: {e}", dir.display())))?;
    Ok(())
}

/// What `reap` found: runs released, runs still held by a live supervisor.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Reaped {
    /// Runs whose supervisor had died, now removed.
    pub released: Vec<String>,
    /// Runs whose supervisor still holds the record.
    pub live: Vec<String>,
}

/// Remove every run whose supervisor died (its record's lock is free), holding `reap.lock`
/// exclusively so no run is mid-publication. A run directory without a published record
/// crashed before its container could exist: it is removed. One run's residue does not stop
/// the others; it is reported at the end.
///
/// # Errors
/// The state directory cannot be read, or a dead run's release left residue.
pub fn reap(host: &Host) -> Result<Reaped, RunError> {
    let runs = host.state.join(RUNS);
    let mut out = Reaped::default();
    let entries = match std::fs::read_dir(&runs) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(state_err("read", &runs)(e)),
    };
    let _gate = lock_file(&host.state.join(REAP_LOCK), false)?;
    let mut residue = Vec::new();
    for entry in entries {
        let entry = entry.map_err(state_err("read", &runs))?;
        let run = entry.file_name().to_string_lossy().into_owned();
        match reap_one(host, &run, &entry.path()) {
            Ok(true) => out.released.push(run),
            Ok(false) => out.live.push(run),
            Err(e) => residue.push(cordon_stage::receipt_io::error_chain(&e)),
        }
    }
    if residue.is_empty() {
        Ok(out)
    } else {
        Err(RunError::Residue {
            run: "reap".into(),
            what: residue.join("; "),
        })
    }
}

/// One run directory: `Ok(false)` while its supervisor holds it, `Ok(true)` once released.
fn reap_one(host: &Host, run: &str, dir: &Path) -> Result<bool, RunError> {
    let record = dir.join(RECORD);
    let file = match File::open(&record) {
        Ok(f) => f,
        // Never published: the container is created only after the record is.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let _ = std::fs::remove_file(dir.join(RECORD_PENDING));
            std::fs::remove_dir(dir).map_err(state_err("remove", dir))?;
            return Ok(true);
        }
        Err(e) => return Err(state_err("open", &record)(e)),
    };
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(false),
        Err((_, e)) => {
            return Err(state_err("lock", &record)(
                std::io::Error::from_raw_os_error(e as i32),
            ));
        }
    };
    let note = dir.join(PIDNS);
    let ns = match std::fs::read_to_string(&note) {
        Ok(text) => Some(text.trim().parse::<u64>().map_err(|e| RunError::State {
            what: "parse",
            path: note.clone(),
            source: std::io::Error::other(e),
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(state_err("read", &note)(e)),
    };
    // The supervisor is gone: `remove` ends the container (its init, so its pid namespace),
    // the listing proves the container gone and the namespace proves its processes gone.
    release(host, run, ns)?;
    drop(lock);
    Ok(true)
}
