//! One surface run, applied: from the checked inputs to the released container.
//!
//! Sequence (each step's why is on the step):
//! 0. the invoker holds no supplementary group (rootless runc cannot drop them, so they would
//!    cross into the container);
//! 1. the agent's directories (home, temp and the workspace directories above them) made
//!    beneath the workspace without following links, or proven the ones the surface made
//!    ([`trust::agent_dirs`]), and the plan made: nothing of the run exists yet, so a refusal
//!    leaves nothing behind;
//! 2. the run published on the rootless lease ([`cordon::lease::rootless`]): its run directory
//!    and locked record, durable before anything else of the run exists;
//! 3. the empty root made and the plan written as `config.json`; create; the container's pid
//!    namespace noted on the lease; the directory the runtime mounted at the workspace's
//!    destination proven to be the one that was checked (device and inode, through the
//!    container's root), and for the agent each of its directories too, else the run never
//!    starts; then start, wait under the absolute
//!    deadline, delete — with the runtime's state root in the state directory (`runc/`);
//! 4. the lease released, always: the runtime no longer lists the container, no process
//!    remains in its pid namespace, the run directory is gone. Anything that cannot be
//!    established is residue: a no-decision, never a result, and it takes precedence over any
//!    other error.
//!
//! Crash story: a supervisor killed anywhere after step 2 leaves a record whose lock died with
//! it; `cordon-reap --surface` releases it as step 4 would. Until it runs, a run whose
//! supervisor died has no deadline: run it on a timer. What it does not own: what ARGV does
//! inside (the OS boundary bounds it), the policy's checks (the language and the planner), the
//! lease's bookkeeping (the library) and the receipt (the CLI).

use cordon::ExitCode;
use cordon::exit::ExitClass;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon::container::{Running, Stdio3};
use cordon::lease::{BootTime, LeaseError, Supervisor};
use cordon::lease::{quarantine, rootless};
use cordon::run_cgroup;
use cordon::runtime::{CgroupProbe, Finished, OutputCaps, RuntimeError};
use cordon::store::Store;
use cordon_policy_lang::Policy;
use cordon_stage::bundle::PlanError;
use cordon_stage::surface::{self, SurfaceInputs, SurfacePlan, Tier};

use crate::egress;
use crate::skills::{self, SkillError};
use crate::trust::{self, TrustError};
use cordon::inputs::EgressConnection;

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
    /// The run's cgroup is not where, or does not hold the limits, the plan asked for.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Cgroup(#[from] run_cgroup::CgroupError),
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
    /// The run's lease could not be published, or its release could not prove it gone.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(#[from] LeaseError),
    /// A selected skill cannot be had.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Skill(#[from] SkillError),
}

impl ExitClass for RunError {
    /// Untrusted inputs and a plan the policy cannot make are wiring errors (2), except a
    /// control this host cannot apply; anything else is a no-decision (3).
    fn exit_class(&self) -> ExitCode {
        match self {
            // A host fact, not the operator's wiring: this host cannot run the policy's read set.
            Self::Trust(TrustError::ReadSetMount { .. }) => ExitCode::NoDecision,
            Self::Trust(_) => ExitCode::Usage,
            Self::Skill(e) => e.exit_class(),
            Self::Plan(e) => e.exit_class(),
            Self::Runtime(_)
            | Self::Cgroup(_)
            | Self::State { .. }
            | Self::Lease(_)
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
    /// The skill versions selected for the run.
    pub skills: Vec<skills::Selected>,
    /// Under `user "per-run"` with limits: the account's name (its run cgroup's) and the
    /// limits, whose sandbox cgroup the sandbox's init is moved into before it starts.
    pub sandbox_cgroup: Option<(String, run_cgroup::Limits)>,
}

/// Where a run happens: the host facts the CLI established.
#[derive(Debug, Clone)]
pub struct Host {
    /// The rootless lease: the runtime (its state root the state directory's `runc/`), the
    /// state directory, checked, and the service user's uid.
    pub lease: rootless::Setup,
    /// The service user's gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// The authority identity.
    pub authority: String,
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
    /// Under egress: the connections asked of the proxy, and how many went unrecorded.
    pub egress: Vec<EgressConnection>,
    /// Connections past the receipt's limit.
    pub egress_unrecorded: u64,
}

/// Run `req` under `policy` on `host`: see the module documentation. The record's lock is held
/// until the release has finished.
///
/// # Errors
/// The run could not be established, or its release could not prove it gone (then the error
/// is the residue, whatever the run did).
pub fn run(policy: &Policy, host: &Host, req: &Request, store: &Store) -> Result<Ran, RunError> {
    let started = Instant::now();
    let lease = &host.lease;
    let extra: Vec<u32> = host
        .groups
        .iter()
        .copied()
        .filter(|g| *g != host.gid)
        .collect();
    if !extra.is_empty() {
        return Err(RunError::Groups { groups: extra });
    }
    // No run while a quarantine of the surface stands (seed 001's checklist, step 1): nothing
    // is made for it, not even its home and temp.
    quarantine::check(store, rootless::QUARANTINE_SCOPE, &[])?;
    skills::check(&lease.state, &req.skills)?;
    let run = format!("cs-{}", &cordon::lease::fresh_id()[..20]);
    let (_, block) = surface::surface_of(policy)?;
    // The agent's home and temp exist before it starts, made by the surface without following
    // any link, or proven the ones it made (a command cannot move or replace them: its run
    // covers them, and this proof holds against anything else that could).
    let agent_dirs = trust::agent_dirs(
        &req.workspace,
        &lease.state,
        lease.uid,
        &surface::agent_dirs(block),
    )
    .map_err(RunError::Prepare)?;
    let plan = surface::plan(
        policy,
        &SurfaceInputs {
            argv: req.argv.clone(),
            tier: req.tier,
            uid: lease.uid,
            gid: host.gid,
            root: lease.run_dir(&run).join("root"),
            workspace: req.workspace.path.clone(),
            invoker_env: req.invoker_env.clone(),
            run: run.clone(),
            authority: host.authority.clone(),
            skills: skills::snapshot_paths(&lease.run_dir(&run), &req.skills),
            delegated: delegated(policy, lease)?,
        },
    )?;
    let deadline = started + Duration::from_millis(plan.settings.deadline_ms);
    let now = BootTime::now(&*lease.runtime.host)
        .map_err(state_err("read", Path::new(cordon::lease::BOOT_ID)))?;
    let supervisor = Supervisor::this(&*lease.runtime.host)
        .map_err(state_err("read", Path::new("/proc/self")))?;
    let record = rootless::Record {
        schema: rootless::ROOTLESS_SCHEMA,
        run: run.clone(),
        authority: host.authority.clone(),
        created_at: cordon::receipt::now_rfc3339(),
        deadline: now.after(Duration::from_millis(plan.settings.deadline_ms)),
        supervisor,
        workspace: req.workspace.path.clone(),
        tier: req.tier,
    };
    let mut held = rootless::begin(lease, record)?;
    let result = contain(lease, req, &plan, &agent_dirs, &mut held, deadline);
    // Residue first: a run that cannot be proven gone is a no-decision whatever else failed,
    // and stops the next run until `cordon-reap --surface --clear` proves it gone.
    match held.release(lease) {
        Err(LeaseError::Residue(mut r)) => {
            let why = r.items.join("; ");
            r.items.push(quarantine::impose_on_executor(
                store,
                rootless::QUARANTINE_SCOPE,
                quarantine::Cause::Residue,
                &why,
                Some(&run),
            ));
            return Err(LeaseError::Residue(r).into());
        }
        released => released?,
    }
    // The runtime removes the run's cgroup with its container; one still there is not ours to
    // leave behind.
    if let Some((path, _)) = &plan.settings.cgroup {
        let dir = Path::new(run_cgroup::ROOT).join(path.trim_start_matches('/'));
        lease
            .runtime
            .host
            .remove_dir(&dir)
            .map_err(|source| run_cgroup::CgroupError {
                what: format!("remove {}", dir.display()),
                source,
            })?;
    }
    result.map(|(finished, (egress, egress_unrecorded))| Ran {
        run,
        plan,
        finished,
        egress,
        egress_unrecorded,
    })
}

/// The cgroup v2 subtree delegated to the service user, looked for only when a service policy
/// sets limits (its runtime then sets them below it); why there is none otherwise.
fn delegated(policy: &Policy, lease: &rootless::Setup) -> Result<Result<String, String>, RunError> {
    let (stage, _) = surface::surface_of(policy)?;
    let limits = surface::limits_of(stage);
    if limits.is_empty() || stage.user == cordon_policy_lang::User::PerRun {
        return Ok(Err("no limits of the service user's to set".into()));
    }
    let host = &*lease.runtime.host;
    let read = |p: &'static str| {
        host.read(Path::new(p))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(state_err("read", Path::new(p)))
    };
    let (own, mounts) = (read("/proc/self/cgroup")?, read("/proc/self/mountinfo")?);
    Ok(run_cgroup::delegated(
        host,
        Path::new(run_cgroup::ROOT),
        (&own, &mounts),
        lease.uid,
        &limits,
    ))
}

/// Step 3; the container's pid namespace is noted on the lease as soon as it exists.
fn contain(
    lease: &rootless::Setup,
    req: &Request,
    plan: &SurfacePlan,
    agent_dirs: &BTreeMap<String, trust::DirId>,
    held: &mut rootless::Run,
    deadline: Instant,
) -> Result<(Finished, (Vec<EgressConnection>, u64)), RunError> {
    let dir = held.dir().to_path_buf();
    let root = dir.join("root");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(state_err("make", &root))?;
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
    let caps = OutputCaps {
        stdout: plan.settings.output.stdout_bytes,
        stderr: plan.settings.output.stderr_bytes,
    };
    // The selected skill versions, copied (and each byte hashed) into the run directory.
    skills::snapshot(&lease.state, &dir, &req.skills)?;
    // The egress proxy listens before anything could ask it.
    let proxy = match &plan.settings.egress {
        Some(allow) => {
            let socket = dir.join(egress::SOCKET);
            Some(egress::Proxy::start(&socket, allow).map_err(state_err("listen on", &socket))?)
        }
        None => None,
    };
    // The start gate, where the runtime needs one: the service user's, in its run directory.
    if let Some(gate) = &plan.gate {
        lease
            .runtime
            .host
            .make_fifo(gate)
            .map_err(state_err("make", gate))?;
    }
    let finished = created_and_run(
        lease,
        req,
        plan,
        agent_dirs,
        held,
        deadline,
        caps,
        &dir,
        proxy.is_some(),
    );
    let egress = proxy.map(|p| p.finish(EGRESS_GRACE)).unwrap_or_default();
    finished.map(|f| (f, egress))
}

/// How long open egress tunnels get to end once the run has.
const EGRESS_GRACE: Duration = Duration::from_secs(2);

/// Create, establish, (with egress) start the forwarder, start, wait, delete; under a
/// runtime whose init is the run's only once it has exec'd the entrypoint, start first and
/// establish while the entrypoint waits at the start gate, then let it on.
#[allow(clippy::too_many_arguments)]
fn created_and_run(
    lease: &rootless::Setup,
    req: &Request,
    plan: &SurfacePlan,
    agent_dirs: &BTreeMap<String, trust::DirId>,
    held: &mut rootless::Run,
    deadline: Instant,
    caps: OutputCaps,
    dir: &Path,
    egress: bool,
) -> Result<Finished, RunError> {
    let created = lease
        .runtime
        .create(&held.record().run, dir, Stdio3::captured(None, caps))?;
    let ready = |held: &mut rootless::Run, pid: i32| {
        established(req, plan, agent_dirs, held, lease, pid).and_then(|()| {
            egress
                .then(|| forwarder(lease, pid, &dir.join(egress::SOCKET)))
                .transpose()
        })
    };
    // A run with limits waits on its cgroup: the kill reaches every process in it, and the
    // meta record gets the kernel's OOM count, peak memory and CPU time.
    let probe = plan.settings.cgroup.as_ref().map(|(path, _)| CgroupProbe {
        host: lease.runtime.host.clone(),
        root: PathBuf::from(run_cgroup::ROOT),
        path: path.clone(),
    });
    let ended = |running: Running| {
        match &probe {
            Some(p) => running.wait(deadline, p),
            None => running.wait_without_cgroup(deadline),
        }
        .and_then(cordon::container::Exited::delete)
    };
    let (finished, forwarder) = match &plan.gate {
        None => {
            // A run refused between create and start leaves no init behind (nor its zombie).
            let forwarder = match ready(held, created.pid()) {
                Ok(f) => f,
                Err(e) => {
                    let _ = created.abandon();
                    return Err(e);
                }
            };
            (created.start().and_then(ended), forwarder)
        }
        Some(gate) => {
            let running = created.start()?;
            let host = &*lease.runtime.host;
            let at_gate = cordon_stage::session::hold_gate(host, gate, deadline, |until| {
                running.exited_by(until)
            })
            .map_err(|e| RunError::State {
                what: "hold the start gate",
                path: gate.clone(),
                source: std::io::Error::other(e.to_string()),
            })
            .and_then(|held_gate| Ok((held_gate, ready(held, running.pid())?)))
            .and_then(
                |(mut held_gate, forwarder)| match held_gate.write_all(b"\n") {
                    Ok(()) => Ok(forwarder),
                    Err(e) => {
                        forwarder.into_iter().for_each(end_forwarder);
                        Err(state_err("open the start gate", gate)(e))
                    }
                },
            );
            match at_gate {
                Ok(forwarder) => (ended(running), forwarder),
                // Refused at the gate: nothing of the command ran (the gate closes without its
                // line), and its init, the container's only process, goes as a created one's.
                Err(e) => {
                    let _ = running.abandon();
                    return Err(e);
                }
            }
        }
    };
    forwarder.into_iter().for_each(end_forwarder);
    Ok(finished?)
}

/// The forwarder ends with its pipe; it is reaped here, whatever the run did.
fn end_forwarder(mut f: cordon::host::Process) {
    drop(f.stdin.take());
    let _ = f.kill();
    let _ = f.wait();
}

/// Start the egress forwarder in the container `pid`'s user and network namespaces and wait
/// for it to listen; its stdin is its supervisor's pipe.
fn forwarder(
    lease: &rootless::Setup,
    pid: i32,
    socket: &Path,
) -> Result<cordon::host::Process, RunError> {
    let pid = pid.to_string();
    let socket_arg = socket.display().to_string();
    let tool = cordon::host::Tool::new(&lease.watchdog, &[egress::FORWARD_ARG, &pid, &socket_arg]);
    let mut process = lease
        .runtime
        .host
        .spawn(&tool, cordon::host::Stdin::Pipe)
        .map_err(state_err("start the egress forwarder for", socket))?;
    let mut line = String::new();
    let ready = process
        .stdout
        .take()
        .map(std::io::BufReader::new)
        .map(|mut r| std::io::BufRead::read_line(&mut r, &mut line));
    if !matches!(ready, Some(Ok(_))) || line.trim() != "ready" {
        let _ = process.kill();
        let mut why = String::new();
        if let Some(mut e) = process.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&mut e, 4096), &mut why);
        }
        let _ = process.wait();
        return Err(RunError::State {
            what: "start the egress forwarder for",
            path: socket.to_path_buf(),
            source: std::io::Error::other(cordon_canon::text::printable(why.trim()).into_owned()),
        });
    }
    Ok(process)
}

/// Between create and start (under a gated runtime, while the entrypoint waits at the start
/// gate): the container's pid namespace noted on the lease, and what the runtime mounted
/// proven to be what was checked.
fn established(
    req: &Request,
    plan: &SurfacePlan,
    agent_dirs: &BTreeMap<String, trust::DirId>,
    held: &mut rootless::Run,
    lease: &rootless::Setup,
    pid: i32,
) -> Result<(), RunError> {
    held.note_namespace(lease, pid)?;
    // A per-run run's limits hold in the sandbox cgroup root prepared: the init goes there
    // before it runs anything (the account's surface stays in the supervisor cgroup, out of
    // the sandbox's OOM kills).
    if let Some((name, limits)) = &req.sandbox_cgroup {
        let pid = u32::try_from(pid)
            .map_err(|e| state_err("place", Path::new(name))(std::io::Error::other(e)))?;
        run_cgroup::enter_sandbox(
            &*lease.runtime.host,
            Path::new(run_cgroup::ROOT),
            name,
            limits,
            pid,
        )?;
    }
    // Limits the runtime was asked to set are checked from outside before anything runs: the
    // init in the run's cgroup, the kernel holding the memory and pids limits.
    if let Some((path, limits)) = &plan.settings.cgroup {
        let pid = u32::try_from(pid)
            .map_err(|e| state_err("place", Path::new(path))(std::io::Error::other(e)))?;
        run_cgroup::check_placed(
            &lease.runtime.host,
            Path::new(run_cgroup::ROOT),
            path,
            pid,
            limits,
        )?;
    }
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
    // The agent's directories, seen the same way, are the ones the surface made and proved
    // (a command's run sees its own covers there instead, so there is nothing of the agent's
    // to prove).
    if req.tier == Tier::Agent {
        for (rel, id) in agent_dirs {
            let at = mounted.join(rel);
            let seen = std::fs::symlink_metadata(&at).map_err(state_err("examine", &at))?;
            if trust::DirId::of(&seen) != *id {
                return Err(RunError::Prepare(TrustError::AgentDirs {
                    path: req.workspace.path.clone(),
                    why: format!("{rel} as the runtime mounted it is not the directory proven"),
                }));
            }
        }
    }
    Ok(())
}
