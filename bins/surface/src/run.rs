//! One surface run, applied: from the checked inputs to the released container.
//!
//! Sequence (each step's why is on the step):
//! 1. a run directory of its own under the state directory (`runs/<id>`, 0700), and in it the
//!    run record, created exclusively, locked for the life of the run and made durable before
//!    anything else exists;
//! 2. home and temp made beneath the workspace without following links, the empty root made,
//!    the plan written as `config.json`;
//! 3. create, start, wait under the absolute deadline, delete — with the runtime's state root
//!    in the state directory (`runc/`);
//! 4. release, always: the runtime must no longer list the container, no process may remain
//!    in the container's pid namespace, and the run directory is removed, the record last.
//!    Anything that cannot be established is residue: a no-decision, never a result.
//!
//! Crash story: a supervisor killed anywhere after step 1 leaves a record whose lock died with
//! it; `cordon-surface reap` finds it, removes the container from the runtime's state root,
//! proves it absent and removes the run directory. What it does not own: what ARGV does inside
//! (the OS boundary bounds it), the policy's checks (the language and the planner) and the
//! receipt (the CLI).

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

impl RunError {
    /// Whether this is a wiring error (exit 2) rather than a no-decision (exit 3).
    #[must_use]
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Trust(_) => true,
            Self::Plan(p) => !matches!(p, PlanError::Unenforceable { .. }),
            Self::Runtime(_) | Self::State { .. } | Self::Residue { .. } => false,
        }
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
    /// The workspace, canonical and checked.
    pub workspace: PathBuf,
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
    let runs = host.state.join(RUNS);
    private_dir(&runs)?;
    private_dir(&host.state.join(RUNTIME_STATE))?;
    let run = format!("cs-{}", &cordon::lease::fresh_id()[..20]);
    let dir = host.run_dir(&run);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(state_err("make", &dir))?;
    // The record exists, locked and durable, before anything else of the run does.
    let record_path = dir.join(RECORD);
    let record = Record {
        run: run.clone(),
        workspace: req.workspace.clone(),
        tier: req.tier,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&record_path)
        .map_err(state_err("create", &record_path))?;
    let text = serde_json::to_vec(&record).map_err(|e| RunError::State {
        what: "encode",
        path: record_path.clone(),
        source: std::io::Error::other(e),
    })?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(state_err("write", &record_path))?;
    fsync_dir(&dir)?;
    fsync_dir(&runs)?;
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        state_err("lock", &record_path)(std::io::Error::from_raw_os_error(e as i32))
    })?;

    let result = contain(policy, host, req, &run, &dir, started);
    let released = release(host, &run, result.as_ref().ok().and_then(|r| r.1));
    drop(lock);
    let (ran, _) = result?;
    released?;
    Ok(ran)
}

/// Steps 2 and 3: returns what ran and the container's pid namespace (for the release).
fn contain(
    policy: &Policy,
    host: &Host,
    req: &Request,
    run: &str,
    dir: &Path,
    started: Instant,
) -> Result<(Ran, Option<u64>), RunError> {
    let (_, block) = surface::surface_of(policy)?;
    // The agent's home and temp exist before it starts, made without following any link.
    trust::make_beneath(&req.workspace, &block.home)?;
    trust::make_beneath(&req.workspace, &block.temp)?;
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
            workspace: req.workspace.clone(),
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
    let ns = pid_namespace(created.pid());
    let finished = created.start()?.wait_without_cgroup(deadline)?.delete()?;
    Ok((
        Ran {
            run: run.to_owned(),
            plan,
            finished,
        },
        ns,
    ))
}

/// The inode of a process's pid namespace.
fn pid_namespace(pid: i32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
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
        let left =
            left_in(ns, host.uid).map_err(|e| residue(format!("cannot list processes: {e}")))?;
        if !left.is_empty() {
            return Err(residue(format!(
                "processes in its pid namespace: {}",
                left.join(", ")
            )));
        }
    }
    let dir = host.run_dir(run);
    for name in ["root", "config.json", "init.pid"] {
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

/// Remove every run whose supervisor died: its record's lock is free.
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
    for entry in entries {
        let entry = entry.map_err(state_err("read", &runs))?;
        let run = entry.file_name().to_string_lossy().into_owned();
        let record = entry.path().join(RECORD);
        let file = match File::open(&record) {
            Ok(f) => Some(f),
            // A crash before the record was written: the directory holds nothing of a run.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(state_err("open", &record)(e)),
        };
        let lock = match file.map(|f| Flock::lock(f, FlockArg::LockExclusiveNonblock)) {
            Some(Err((_, nix::errno::Errno::EWOULDBLOCK))) => {
                out.live.push(run);
                continue;
            }
            Some(Err((_, e))) => {
                return Err(state_err("lock", &record)(
                    std::io::Error::from_raw_os_error(e as i32),
                ));
            }
            Some(Ok(lock)) => Some(lock),
            None => None,
        };
        // The supervisor is gone: its container's processes are ended by `remove`, and the
        // runtime's listing proves the container gone.
        release(host, &run, None)?;
        drop(lock);
        out.released.push(run);
    }
    Ok(out)
}
