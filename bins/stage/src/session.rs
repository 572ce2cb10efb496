//! A [`Session`]: one container of one policy stage under one lease, from validation to the
//! absence proof. Every container stage (prebuild today; the lane, the reference session and
//! the surface next) runs through it instead of copying the sequence.
//!
//! The sequence, in order (each step's why is on the step):
//! 1. validate before touching anything: the stage is declared, the runtime is new enough (from
//!    the version text the authority identity already read), every GPU device the stage names
//!    exists on this host;
//! 2. become the executor's one manager and begin a lease whose record names every mount point
//!    the plan will make (written before any resource exists);
//! 3. provision the account and the run directory, plan the bundle from the typed stage and the
//!    lease's facts, make the planned host mounts (staging tmpfs, overlay root) and a
//!    patcher's bounded child's cgroup directories;
//! 4. write `config.json` as a protected file, re-checked right before `create`;
//! 5. create; read the created init's posture from outside and compare it with the plan
//!    ([`crate::posture`]: a difference quarantines the executor, a no-decision); arm the
//!    bounded child ([`arm_child`]: its limits, written while nothing of the workload runs);
//!    start (stdin,
//!    stdout held live when asked for), let the caller drive the running container, wait under
//!    the absolute deadline, delete;
//! 6. let the caller inspect what the run left while the lease's mounts still exist;
//! 7. release — always, whatever happened — with its absence proof; a release that cannot be
//!    established overrides the result: residue is a no-decision.
//!
//! Evidence ([`crate::evidence`]): the bundle as launched (step 4), the container's mount table
//! and its posture read from outside once created (before the workload runs), the host's records of the run read once its init has exited and before the
//! delete (the lease record, the runtime's state, the cgroup's counters), the captured stdout
//! and stderr (step 5), and — when the run failed before that — the same host records, read
//! before the release of step 7 takes them apart; a release that fails leaves its error as
//! `teardown`. The receipt names them all.
//!
//! A signal (SIGINT, SIGTERM, SIGHUP; [`cordon::interrupt`]) kills the container's init from
//! the moment it is created; before that, each step that would make something new checks for
//! one and ends the session as an error. Either way the release of step 7 runs as after any
//! other failure, and a second signal does not cut it short.
//!
//! Crash story: the lease record is durable before step 3; a supervisor killed anywhere after it
//! leaves a record from which `cordon-reap` removes the container, mounts, run directory and
//! account. What the session does not own: what the workload is (the caller's argv and
//! sources), what its result means (the caller's `inspect`), and the receipt.

use cordon::ExitCode;
use cordon::exit::ExitClass;
use cordon::interrupt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon::container::{Running, Stdio3};
use cordon::lease::{Lease, LeaseError, Manager, Setup};
use cordon::runtime::{Finished, RuntimeError};
use cordon::store::Store;
use cordon_canon::Digest;
use cordon_policy_lang::{MountSource, PhysicalLane, Policy, StageKind};

use crate::bundle::{self, HostMount, PlanError, Planned, RunInputs};
use crate::evidence::Evidence;

/// Why a session could not establish its run. A wiring error is exit 2; everything else is a
/// no-decision (exit 3).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SessionError {
    /// The stage cannot be planned from the policy and this host.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] PlanError),
    /// A patcher's bounded child cgroup could not be prepared (or its layout read).
    #[error("the patcher's bounded child: cannot {what}")]
    #[diagnostic(code(cordon::session::child))]
    Child {
        /// What, with the path.
        what: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// A device the stage names is not on this host.
    #[error("stage {kind} needs device {path}, which cannot be found on this host")]
    #[diagnostic(
        code(cordon::session::device),
        help("the stage runs only on a host with every device its policy names")
    )]
    Device {
        /// The stage.
        kind: StageKind,
        /// The device.
        path: String,
        /// What the host said.
        #[source]
        source: std::io::Error,
    },
    /// A GPU lane's devices cannot be resolved from the host's CDI specs.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Cdi(#[from] crate::cdi::CdiError),
    /// The stage's descriptor limit is above what this supervisor can hand the runtime: its
    /// hard limit is lower and raising it needs `CAP_SYS_RESOURCE`, which this host withholds.
    #[error(
        "stage {kind} asks for nofile {wanted}, above this supervisor's hard limit {hard}: the control cannot be applied here"
    )]
    #[diagnostic(
        code(cordon::session::nofile),
        help(
            "raise the supervisor's hard limit (LimitNOFILE= in its unit) or lower the stage's nofile"
        )
    )]
    Nofile {
        /// The stage.
        kind: StageKind,
        /// The policy's limit.
        wanted: u64,
        /// This process's hard limit.
        hard: u64,
    },
    /// This host cannot honour the stage (its memory, its side-channel posture).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Host(#[from] crate::host_fit::HostFitError),
    /// The lease, account, mounts, runtime or cleanup failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(#[from] LeaseError),
    /// The controller's working directory cannot be established, so it cannot be protected.
    #[error("cannot establish the working directory to keep it out of every mount")]
    #[diagnostic(code(cordon::session::cwd))]
    WorkingDirectory {
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding the bundle failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Canonical(#[from] cordon_canon::canonical::CanonicalError),
    /// A signal stopped the session before its result was established.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Interrupted(#[from] cordon::interrupt::Interrupted),
    /// The created container's posture, read from outside before any of the workload's code
    /// ran, is not the planned one (the executor is then quarantined), or could not be read.
    #[error("the container's posture read from outside is not the planned one: {why}")]
    #[diagnostic(
        code(cordon::session::posture),
        help(
            "the runtime applied less than the bundle asked: inspect the runtime and kernel, then lift the executor's quarantine with cordon-reap"
        )
    )]
    Posture {
        /// Each difference, and the quarantine imposed; or why it could not be read.
        why: String,
    },
    /// The start gate could not be made, held or opened: nothing of the workload ran.
    #[error("the container's start gate: {why}")]
    #[diagnostic(code(cordon::session::gate))]
    Gate {
        /// What failed, with the path.
        why: String,
    },
    /// The run's evidence could not be kept: a receipt would name what the store lacks.
    #[error("cannot keep the run's evidence")]
    #[diagnostic(code(cordon::session::evidence))]
    Evidence(#[source] cordon::store::StoreError),
}

impl From<RuntimeError> for SessionError {
    fn from(e: RuntimeError) -> Self {
        Self::Lease(e.into())
    }
}

impl ExitClass for SessionError {
    /// A plan the policy cannot make is the operator's wiring (2), except a device this host
    /// lacks; anything else is a no-decision (3).
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Plan(e) => e.exit_class(),
            // A copy the policy does not bound, or a stage without a limit, is the policy's
            // wiring.
            Self::Host(
                crate::host_fit::HostFitError::Unbounded { .. }
                | crate::host_fit::HostFitError::NoLimit { .. },
            ) => ExitCode::Usage,
            Self::Host(_)
            | Self::Device { .. }
            | Self::Cdi(_)
            | Self::Nofile { .. }
            | Self::Lease(_)
            | Self::WorkingDirectory { .. }
            | Self::Canonical(_)
            | Self::Interrupted(_)
            | Self::Posture { .. }
            | Self::Gate { .. }
            | Self::Child { .. }
            | Self::Evidence(_) => ExitCode::NoDecision,
        }
    }
}

/// How often a gated run's supervisor looks for its entrypoint at the start gate (a FIFO's
/// writer can be opened only once its reader holds it, and nothing signals that).
const GATE_POLL: Duration = Duration::from_millis(1);

/// Wait, until `deadline`, for a gated run's entrypoint to hold its start gate open: it has
/// exec'd, so the runtime has installed all it installs, and it waits for the gate's line
/// before anything of the workload runs. The gate's writing end. `exited` blocks until the
/// container's init has exited (`true`) or the instant it is given passes. An init that ends
/// first, a deadline that passes or a gate that cannot be opened is a no-decision; a signal
/// ends the wait as itself.
///
/// # Errors
/// [`SessionError::Gate`], or [`SessionError::Interrupted`].
pub fn hold_gate(
    host: &dyn cordon::host::Host,
    gate: &std::path::Path,
    deadline: Instant,
    exited: impl Fn(Instant) -> std::io::Result<bool>,
) -> Result<std::fs::File, SessionError> {
    let failed = |why: &str| SessionError::Gate {
        why: format!("{}: {why}", gate.display()),
    };
    loop {
        interrupt::check().map_err(SessionError::from)?;
        if let Some(file) = host
            .open_gate(gate)
            .map_err(|e| failed(&format!("cannot be opened: {e}")))?
        {
            return Ok(file);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(failed(
                "the entrypoint did not open it by the stage's deadline",
            ));
        }
        // Blocks until the init exits or the slice ends: an init that ends is seen at once.
        if exited((now + GATE_POLL).min(deadline))
            .map_err(|e| failed(&format!("the init cannot be waited for: {e}")))?
        {
            interrupt::check().map_err(SessionError::from)?;
            return Err(failed(
                "the container's init ended before its entrypoint opened it",
            ));
        }
    }
}

fn child_failed(what: &str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SessionError {
    let what = format!("{what} {}", path.display());
    move |source| SessionError::Child { what, source }
}

/// Make a patcher's bounded child's cgroup directories before its container is created (the
/// container binds them).
///
/// # Errors
/// [`SessionError::Child`]: a step the kernel refused.
pub fn prepare_child(
    host: &dyn cordon::host::Host,
    child: &bundle::ChildPlan,
) -> Result<(), SessionError> {
    for (dir, may_exist) in &child.make {
        match host.make_dir(dir) {
            Err(e) if *may_exist && e.kind() == std::io::ErrorKind::AlreadyExists => {}
            made => made.map_err(child_failed("make", dir))?,
        }
    }
    Ok(())
}

/// Arm a patcher's bounded child once its container is created and before it starts: on v2
/// move the created init out of the container's cgroup into its sibling leaf, then write the
/// child's limits (on v2 enabling its controllers first) and give the run account (`uid`,
/// `gid`) the files it may write (its `cgroup.procs`; on v2 the common ancestor's too).
///
/// # Errors
/// [`SessionError::Child`]: a step the kernel refused (on v2 a process left in the container's
/// cgroup makes enabling the controllers fail: nothing is started unbounded).
pub fn arm_child(
    host: &dyn cordon::host::Host,
    child: &bundle::ChildPlan,
    uid: u32,
    gid: u32,
) -> Result<(), SessionError> {
    if let Some((from, to)) = &child.vacate {
        let procs = host.read(from).map_err(child_failed("read", from))?;
        for pid in String::from_utf8_lossy(&procs).split_whitespace() {
            host.write_control(to, pid.as_bytes())
                .map_err(child_failed(&format!("move process {pid} into"), to))?;
        }
    }
    for (file, value) in &child.limits {
        host.write_control(file, value.as_bytes())
            .map_err(child_failed("write", file))?;
    }
    for file in &child.given {
        host.give(file, uid, gid)
            .map_err(child_failed("give", file))?;
    }
    Ok(())
}

/// What one run is: the workload and the host paths only the caller knows.
#[derive(Debug, Clone)]
pub struct Job {
    /// The exact argv (a registered step's, or cordon's own worker's).
    pub argv: Vec<String>,
    /// The unpacked, verified image rootfs.
    pub image_rootfs: PathBuf,
    /// Mount role → host source (`tree`, `publication`, `model`, `workspace`).
    pub sources: BTreeMap<MountSource, PathBuf>,
    /// What the workload reads on stdin: nothing, a declared secret, or a live pipe.
    pub stdin: cordon::container::Input,
    /// Hold stdout live for the driver instead of capturing it.
    pub live_stdout: bool,
    /// Hold stderr live for the driver instead of capturing it.
    pub live_stderr: bool,
    /// When the stage started: the absolute deadline counts from here.
    pub started: Instant,
    /// The caller drives the stage's framed protocol and enforces its phase deadlines (the
    /// lane). A stage with framing or phases run by a caller that does not is refused.
    pub framed: bool,
    /// The run's physical lane: its CPUs replace the stage's cpuset; its CPU weight is the
    /// container's.
    pub lane: Option<PhysicalLane>,
    /// The engine tree the run runs: refused when an earlier run of it ended in an incident
    /// under this authority, and named in the lease record so an incident of this run stops it.
    pub candidate: Option<Digest>,
}

/// Where a container stage works on this host: what its binary establishes at start and the
/// operator's paths (each container stage's `Config`).
#[derive(Debug, Clone)]
pub struct StageConfig {
    /// The store.
    pub store: Store,
    /// The directory holding image layouts, one per role (`<dir>/<role>`).
    pub images: PathBuf,
    /// The lease manager's setup.
    pub setup: Setup,
    /// The authority identity.
    pub authority: Digest,
    /// The runtime's `--version` text, as the identity read it.
    pub runtime_version: String,
    /// The directory of the key that signs the receipts this stage stores besides its own
    /// (the host's: `cordon::signing::KEY_DIR`).
    pub key_dir: PathBuf,
    /// What this stage's sessions preserved, until a receipt names it.
    pub evidence: Evidence,
    /// The stage binary itself, which becomes its confined parser children
    /// (`/proc/self/exe` in production: the binary whose digest the authority covers).
    pub exe: PathBuf,
}

impl StageConfig {
    /// A stage binary's configuration on this host: what it established at start, the
    /// operator's paths, and the host's own signing key (`cordon::signing::KEY_DIR`).
    #[must_use]
    pub fn on_host(
        store: &Store,
        images: &std::path::Path,
        setup: Setup,
        (authority, runtime_version): (Digest, String),
    ) -> Self {
        Self {
            store: store.clone(),
            images: images.to_path_buf(),
            setup,
            authority,
            runtime_version,
            key_dir: PathBuf::from(cordon::signing::KEY_DIR),
            evidence: Evidence::new(store),
            exe: PathBuf::from("/proc/self/exe"),
        }
    }

    /// The sessions of stage `kind` of `policy` here.
    #[must_use]
    pub fn session<'a>(&self, policy: &'a Policy, kind: StageKind) -> Session<'a> {
        Session {
            policy,
            kind,
            store: self.store.clone(),
            setup: self.setup.clone(),
            authority: self.authority,
            runtime_version: self.runtime_version.clone(),
            evidence: self.evidence.clone(),
        }
    }
}

/// One stage's sessions on this host.
#[derive(Debug, Clone)]
pub struct Session<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// The stage kind.
    pub kind: StageKind,
    /// The store.
    pub store: Store,
    /// The lease manager's setup.
    pub setup: Setup,
    /// The authority every lease and container is labelled with.
    pub authority: Digest,
    /// The runtime's `--version` text, as the identity read it.
    pub runtime_version: String,
    /// Where the session's evidence is kept.
    pub evidence: Evidence,
}

/// What a run left, with what the caller's inspection made of it.
#[derive(Debug)]
pub struct Ran<T> {
    /// The meta record and kept output.
    pub finished: Finished,
    /// The lease id.
    pub lease: String,
    /// What `inspect` returned.
    pub inspected: T,
}

impl Session<'_> {
    /// Run `job` in one container of this stage under one lease: `drive` may exchange data
    /// with the running container until the stage's absolute deadline, which it is given and
    /// must honour (it returns when the caller is done driving; the wait that follows kills
    /// whatever runs past the deadline), `inspect`
    /// reads what the run left while the lease's mounts still exist. Release always runs; if it
    /// cannot be established its residue is the result.
    ///
    /// # Errors
    /// Anything the session could not establish, or what `drive`/`inspect` returned.
    pub fn run<T, E: From<SessionError>>(
        &self,
        job: &Job,
        drive: impl FnOnce(&mut Running, &Planned, Instant) -> Result<(), E>,
        inspect: impl FnOnce(&Lease, &Planned, &Finished) -> Result<T, E>,
    ) -> Result<Ran<T>, E> {
        self.run_gated(job, |_| Ok(()), drive, inspect)
    }

    /// [`Session::run`] with a `gate` that runs once this process is the executor's one
    /// manager and before the lease begins: nothing of this executor can start between what the
    /// gate establishes (the reference session's strict quiescence) and this run, and a gate
    /// that fails ends the session before anything exists.
    ///
    /// # Errors
    /// As [`Session::run`], or what `gate` returned.
    pub fn run_gated<T, E: From<SessionError>>(
        &self,
        job: &Job,
        gate: impl FnOnce(&Manager) -> Result<(), E>,
        drive: impl FnOnce(&mut Running, &Planned, Instant) -> Result<(), E>,
        inspect: impl FnOnce(&Lease, &Planned, &Finished) -> Result<T, E>,
    ) -> Result<Ran<T>, E> {
        // 1. Validate everything before touching anything; a signal already received makes
        // nothing new (here, before the container, before its start: each step that would).
        interrupt::check().map_err(SessionError::from)?;
        let stage = self
            .policy
            .stage(self.kind)
            .ok_or(SessionError::Plan(PlanError::NoStage { kind: self.kind }))?;
        // The version gate of the runtime the policy names: its text, floor and the policy's
        // minimum, known-bad releases and build features.
        let runtime = crate::start::runtime_kind(self.policy);
        self.setup
            .runtime
            .check_version(
                runtime,
                &self.runtime_version,
                self.policy.runtime().min_version(),
            )
            .map_err(SessionError::from)?;
        if let Some(what) = crate::start::undriven(runtime) {
            return Err(SessionError::Plan(PlanError::Unimplemented {
                kind: self.kind,
                what,
            })
            .into());
        }
        // The runtime inherits this process's hard limit and cannot raise it without
        // CAP_SYS_RESOURCE: a stage limit above it would fail deep inside `runc create`.
        let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or((0, 0));
        if stage.nofile > hard {
            return Err(SessionError::Nofile {
                kind: self.kind,
                wanted: stage.nofile,
                hard,
            }
            .into());
        }
        crate::bundle::unguarded_gpus(self.policy, self.kind, job.lane.as_ref())
            .map_err(SessionError::from)?;
        let mut devices = BTreeMap::new();
        for path in stage.gpu_device.keys() {
            devices.insert(path.clone(), self.device_at(path)?);
        }
        // A GPU lane's devices, from the host's CDI specs: each node found at its host path.
        let cdi = match job.lane.as_ref().filter(|l| !l.gpus.is_empty()) {
            Some(lane) => Some(self.lane_devices(lane, &mut devices)?),
            None => None,
        };
        // Values this session cannot enforce are refused, never planned and then ignored:
        // protocol framing and phase deadlines are enforced by a caller that drives them (the
        // lane's), and only such a caller may run a stage that has them — and the reverse: a
        // framed caller needs the stage's bounds.
        let has_protocol = stage.frame.is_some() || !stage.phase_deadline_ms.is_empty();
        if has_protocol != job.framed {
            return Err(SessionError::Plan(PlanError::Unimplemented {
                kind: self.kind,
                what: if job.framed {
                    "a framed session of a stage without frame bounds and phase deadlines"
                } else {
                    "protocol framing and phase deadlines without a driver that enforces them"
                },
            })
            .into());
        }
        // Whether this host can honour the stage at all: its memory and its side-channel
        // posture, against the policy's host rules. What it read is kept for the receipt, a
        // refusal's included.
        let facts = crate::host_fit::read(self.setup.host()).map_err(SessionError::from)?;
        let judged = crate::host_fit::judge(self.policy, self.kind, &facts);
        let record = crate::host_fit::record(&facts, &judged).map_err(SessionError::from)?;
        self.evidence
            .keep("host", record.as_bytes())
            .map_err(SessionError::Evidence)?;
        judged.map_err(SessionError::from)?;
        // 2. The lease record names every mount point before any exists.
        let manager = Manager::open(&self.store, self.setup.clone()).map_err(SessionError::from)?;
        // No new work on a quarantined host, executor or device (the lease refuses the first
        // two itself; only the session knows its devices).
        let gpus = job.lane.iter().flat_map(|l| l.gpus.keys().cloned());
        cordon::lease::quarantine::check(
            &self.store,
            &self.setup.executor,
            &devices.keys().cloned().chain(gpus).collect::<Vec<_>>(),
        )
        .map_err(SessionError::from)?;
        // Nor a candidate whose earlier run ended in an incident under this authority (seed
        // 001's checklist, step 7).
        let authority = self.authority.to_string();
        if let Some(c) = &job.candidate {
            cordon::lease::incident::check(&self.store, &authority, c)
                .map_err(SessionError::from)?;
        }
        gate(&manager)?;
        let mounts = bundle::lease_mount_points(stage);
        // The record carries the absolute deadline, so cordon-reap can end a run whose
        // supervisor is gone or hung (plus the grace for release).
        let budget = Duration::from_millis(stage.deadline_ms).saturating_sub(job.started.elapsed());
        let lease = match &job.candidate {
            Some(c) => manager.begin_for(&authority, c, &mounts, budget),
            None => manager.begin_with(&authority, &mounts, budget),
        }
        .map_err(SessionError::from)?;
        let result = self.inside(&manager, lease.clone(), job, (devices, cdi), drive, inspect);
        // A run that failed before its init exited leaves the host's records as they are now:
        // the release below takes them apart.
        if result.is_err() && !self.evidence.has("lease-record") {
            let _ = self.keep_host_evidence(&manager, &lease);
        }
        // 7. Release whatever happened; a release that cannot be established overrides.
        if let Err(e) = manager.release(&lease.record) {
            let _ = self
                .evidence
                .keep("teardown", crate::receipt_io::error_chain(&e).as_bytes());
            return Err(SessionError::from(e).into());
        }
        result
    }

    /// The device node at host path `path`, through the host seam.
    fn device_at(&self, path: &str) -> Result<bundle::DeviceNode, SessionError> {
        self.setup
            .host()
            .device(std::path::Path::new(path))
            .map_err(|source| SessionError::Device {
                kind: self.kind,
                path: path.to_owned(),
                source,
            })
    }

    /// The CDI edits of GPU lane `lane` from the host's specs ([`crate::cdi::resolve_lane`],
    /// hooks only as the policy's device guard allows), each device node found at its host
    /// path and added to `devices` by its path in the container.
    ///
    /// # Errors
    /// The specs cannot be read, a device does not resolve, or a node is not on this host.
    fn lane_devices(
        &self,
        lane: &cordon_policy_lang::PhysicalLane,
        devices: &mut BTreeMap<String, bundle::DeviceNode>,
    ) -> Result<crate::cdi::Applied, SessionError> {
        let cdi_error = |why: String| crate::cdi::CdiError::Spec {
            path: format!("{:?}", self.setup.cdi_dirs),
            why,
        };
        let read = crate::cdi::read_specs(&self.setup.cdi_dirs).map_err(cdi_error)?;
        let specs = crate::cdi::files(&read);
        let hooks = self
            .policy
            .device_guard()
            .map(|g| g.cdi_hooks.clone())
            .unwrap_or_default();
        let names: Vec<String> = lane.gpus.keys().map(|u| crate::cdi::gpu(u)).collect();
        let applied = crate::cdi::resolve_lane(&specs, &names, &hooks)?;
        // A bind's source as the spec writes it is the one checked against the protected and
        // never-mount paths: it may not be a link (the runtime would follow it elsewhere), and
        // only files and directories are bound (a socket would reach a root daemon).
        for m in &applied.mounts {
            let source = std::path::Path::new(&m.host_path);
            let refuse = |why: String| {
                SessionError::Cdi(crate::cdi::CdiError::Device {
                    device: applied.devices.join(", "),
                    why: format!("bind source {}: {why}", m.host_path),
                })
            };
            let real = std::fs::canonicalize(source).map_err(|e| refuse(e.to_string()))?;
            if real != source {
                return Err(refuse(format!("leads to {}", real.display())));
            }
            let meta = std::fs::metadata(source).map_err(|e| refuse(e.to_string()))?;
            if !meta.is_file() && !meta.is_dir() {
                return Err(refuse("neither a file nor a directory".to_owned()));
            }
        }
        for n in &applied.nodes {
            let host = n.host_path.as_deref().unwrap_or(&n.path);
            devices.insert(n.path.clone(), self.device_at(host)?);
        }
        Ok(applied)
    }

    /// Read the created init `pid`'s posture from outside ([`crate::posture`]), keep it as
    /// evidence and compare it with the plan: a difference quarantines the executor
    /// (containment) and ends the session as a no-decision; a posture that cannot be read is
    /// one too.
    fn check_posture(&self, pid: i32, planned: &Planned) -> Result<(), SessionError> {
        // A signal kills the created init: what is then read of it is the signal's doing, never
        // a containment failure (and no quarantine).
        let posture = |why: String| match interrupt::check() {
            Err(i) => SessionError::from(i),
            Ok(()) => SessionError::Posture { why },
        };
        let outside = crate::posture::read(self.setup.host(), pid, &planned.spec)
            .map_err(|why| posture(format!("cannot be read: {why}")))?;
        let json = cordon::canonical::to_canonical_json(&outside).map_err(SessionError::from)?;
        self.evidence
            .keep("posture", json.as_bytes())
            .map_err(SessionError::Evidence)?;
        let differences = crate::posture::differences(&planned.spec, &outside);
        if differences.is_empty() {
            return Ok(());
        }
        let why = differences.join("; ");
        interrupt::check().map_err(SessionError::from)?;
        let line = cordon::lease::quarantine::impose_on_executor(
            &self.store,
            &self.setup.executor,
            cordon::lease::quarantine::Cause::Containment,
            &why,
            None,
        );
        Err(posture(format!("{why}; {line}")))
    }

    /// A gated run's posture check ([`bundle::Entry`]): once the entrypoint holds the start
    /// gate ([`hold_gate`]), read the posture as [`Session::check_posture`] does, and only then
    /// write the gate's line. A posture that differs quarantines the executor, and the gate
    /// closes without its line.
    fn pass_gate(
        &self,
        running: &Running,
        gate: &std::path::Path,
        planned: &Planned,
        deadline: Instant,
    ) -> Result<(), SessionError> {
        use std::io::Write as _;
        let mut held = hold_gate(self.setup.host(), gate, deadline, |until| {
            running.exited_by(until)
        })?;
        self.check_posture(running.pid(), planned)?;
        held.write_all(b"\n").map_err(|e| SessionError::Gate {
            why: format!("{}: cannot be written: {e}", gate.display()),
        })
    }

    /// Keep the host's records of `lease`'s run ([`Manager::host_evidence`]).
    fn keep_host_evidence(&self, manager: &Manager, lease: &Lease) -> Result<(), SessionError> {
        for (name, bytes) in manager.host_evidence(lease) {
            self.evidence
                .keep(name, &bytes)
                .map_err(SessionError::Evidence)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn inside<T, E: From<SessionError>>(
        &self,
        manager: &Manager,
        mut lease: Lease,
        job: &Job,
        (devices, cdi): (
            BTreeMap<String, bundle::DeviceNode>,
            Option<crate::cdi::Applied>,
        ),
        drive: impl FnOnce(&mut Running, &Planned, Instant) -> Result<(), E>,
        inspect: impl FnOnce(&Lease, &Planned, &Finished) -> Result<T, E>,
    ) -> Result<Ran<T>, E> {
        // 3. Provision, plan from the lease's facts, make the planned host mounts.
        manager.provision(&lease).map_err(SessionError::from)?;
        let store_root = self.store.root().to_path_buf();
        let mut inputs = RunInputs::for_lease(&lease, job.argv.clone(), job.image_rootfs.clone());
        inputs.sources.clone_from(&job.sources);
        inputs.devices = devices;
        inputs.cdi = cdi;
        inputs.lane.clone_from(&job.lane);
        inputs.entry = bundle::Entry::of(self.kind);
        // No mount may expose the store's private parts, the protected bundle, the runtime's
        // state or the controller's working directory; published trees and publications may be
        // mounted (read-only, by the plan).
        let cwd =
            std::env::current_dir().map_err(|source| SessionError::WorkingDirectory { source })?;
        inputs.protected = vec![
            store_root.clone(),
            lease.bundle_dir(),
            self.setup.runtime.state_root.clone(),
            cwd,
        ];
        // Where the policy's never-mount paths really lead (a link among them is followed).
        inputs.never_mount_real = self
            .policy
            .never_mount()
            .filter_map(|n| Some((std::fs::canonicalize(n).ok()?, n.to_owned())))
            .collect();
        inputs.mountable_store_roots = vec![
            store_root.join(cordon::tree::TREES.dir),
            store_root.join(cordon::tree::PUBLICATIONS.dir),
        ];
        let cgroups = &self.setup.cgroup_root;
        inputs.cgroups = match cordon::runtime::unified(self.setup.host(), cgroups) {
            Ok(true) => Some(bundle::Cgroups::Unified(cgroups.clone())),
            Ok(false) => Some(bundle::Cgroups::V1(cgroups.clone())),
            Err(source) => {
                return Err(SessionError::Child {
                    what: format!("read the cgroup layout at {}", cgroups.display()),
                    source,
                }
                .into());
            }
        };
        let planned = bundle::plan(self.policy, self.kind, &inputs).map_err(SessionError::from)?;
        if let Some(child) = &planned.child {
            prepare_child(self.setup.host(), child)?;
        }

        for m in &planned.host_mounts {
            let made = match m {
                HostMount::Tmpfs {
                    target,
                    bytes,
                    inodes,
                    ..
                } => manager.mount_tmpfs(&lease, target, *bytes, *inodes),
                HostMount::Copy { target, source } => manager.mount_copy(&lease, target, source),
                HostMount::Overlay {
                    target,
                    lower,
                    upper,
                    work,
                    bytes,
                    inodes,
                } => manager.mount_overlay(&lease, target, lower, upper, work, *bytes, *inodes),
            };
            made.map_err(SessionError::from)?;
        }
        // The start gate, in the run directory (root's): nothing but the entrypoint runs in
        // the container until the gate is passed, and its name is gone then.
        if let Some(gate) = &planned.gate {
            self.setup
                .host()
                .make_fifo(gate)
                .map_err(|e| SessionError::Gate {
                    why: format!("cannot make {}: {e}", gate.display()),
                })?;
        }
        // 4. The bundle is a protected file, re-checked right before create.
        let config = cordon_canon::canonical::to_canonical_json(&planned.spec)
            .map_err(SessionError::from)?;
        manager
            .write_protected(&mut lease, "config.json", config.as_bytes())
            .map_err(SessionError::from)?;
        self.evidence
            .keep("bundle", config.as_bytes())
            .map_err(SessionError::Evidence)?;
        // A declared secret lives in the run directory (root, 0400, one link), checked and
        // read back at launch: its bytes cross on stdin and nowhere else.
        let stdin = match &job.stdin {
            cordon::container::Input::Bytes(secret) => {
                manager
                    .write_secret(&mut lease, secret)
                    .map_err(SessionError::from)?;
                cordon::container::Input::Null
            }
            other => other.clone(),
        };
        // 5. Create → start → drive → wait under the absolute deadline → delete.
        let deadline = job.started + Duration::from_millis(planned.session.deadline_ms);
        let output = &planned.session.output;
        let stdio = Stdio3 {
            stdin,
            stdout: if job.live_stdout {
                cordon::container::Output::Live
            } else {
                cordon::container::Output::Captured(output.stdout_bytes)
            },
            stderr: if job.live_stderr {
                cordon::container::Output::Live
            } else {
                cordon::container::Output::Captured(output.stderr_bytes)
            },
        };
        interrupt::check().map_err(SessionError::from)?;
        let created = manager.create(&lease, stdio).map_err(SessionError::from)?;
        // The mount table the runtime made, before any of the workload's code has run.
        let table = cordon::lease::mount_table(self.setup.host(), created.pid());
        self.evidence
            .keep("mountinfo", &table)
            .map_err(SessionError::Evidence)?;
        // From here the init is stopped by a signal; a created container is not started after
        // one (the release deletes it).
        interrupt::check().map_err(SessionError::from)?;
        // The kernel's view of the created init against the plan: a runtime that applied less
        // than the bundle (a flag, a namespace, a filter) is caught before anything runs. A
        // gated run's is read at its gate instead, once the runtime has applied all of it.
        if planned.gate.is_none() {
            self.check_posture(created.pid(), &planned)?;
        }
        if let Some(child) = &planned.child {
            arm_child(self.setup.host(), child, inputs.uid, inputs.gid)?;
        }
        let mut running = created.start().map_err(SessionError::from)?;
        if let Some(gate) = &planned.gate {
            self.pass_gate(&running, gate, &planned, deadline)?;
        }
        drive(&mut running, &planned, deadline)?;
        let exited = running
            .wait(deadline, &manager.cgroup(&lease))
            .map_err(SessionError::from)?;
        // The cgroup and the runtime's state go with the delete.
        self.keep_host_evidence(manager, &lease)?;
        let finished = exited.delete().map_err(SessionError::from)?;
        // Captured output (the live streams are the caller's), bounded by the stage's caps.
        for (name, live, bytes) in [
            ("stdout", job.live_stdout, &finished.stdout),
            ("stderr", job.live_stderr, &finished.stderr),
        ] {
            if !live && !bytes.is_empty() {
                self.evidence
                    .keep(name, bytes)
                    .map_err(SessionError::Evidence)?;
            }
        }
        // 6. The caller reads what the run left while the mounts exist.
        let inspected = inspect(&lease, &planned, &finished)?;
        Ok(Ran {
            finished,
            lease: lease.record.lease.clone(),
            inspected,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Validation happens before anything is touched: driven through the fake host, a runtime
    //! too old or a missing GPU device ends the session before a lease record exists.

    use std::sync::Arc;

    use cordon::host::fake::{Call, Fake};

    use super::*;

    /// The default policy with `edit` applied to its text.
    pub(crate) fn policy(edit: impl Fn(String) -> String) -> Policy {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/evaluator.kdl"
        ))
        .unwrap();
        cordon_policy_lang::parse("evaluator.kdl", &edit(text)).unwrap()
    }

    /// On v2 the child is armed after create: the created init moved into `main`, the
    /// controllers enabled, the child's limits, then the two files given; a step the kernel
    /// refuses (a process left behind makes enabling the controllers fail) ends the run before
    /// anything of it starts, and nothing later is written.
    #[test]
    fn a_v2_child_is_armed_in_order_and_a_refused_step_stops_it() {
        let p = policy(|t| t);
        let mut run = bundle::example_inputs(&p, StageKind::Prebuild);
        run.cgroups = Some(bundle::Cgroups::Unified("/cg".into()));
        let planned = bundle::plan(&p, StageKind::Prebuild, &run).unwrap();
        let child = planned.child.unwrap();
        let lease = std::path::Path::new("/cg/cordon/EXECUTOR/LEASE");
        let host = Fake::new();
        host.file(lease.join("cgroup.procs"), "41\n42\n")
            .dir(lease, &["child", "main"])
            .dir(lease.join("child"), &[])
            .dir(lease.join("main"), &[]);
        arm_child(&host, &child, 1000, 1000).unwrap();
        let w = |f: &str, v: &str| Call::Write(lease.join(f), v.to_owned());
        let writes: Vec<Call> = host
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Write(..) | Call::Give(..)))
            .collect();
        assert_eq!(
            writes,
            [
                w("main/cgroup.procs", "41"),
                w("main/cgroup.procs", "42"),
                w("cgroup.subtree_control", "+memory +pids +cpu"),
                w("child/memory.max", "6442450944"),
                w("child/memory.swap.max", "0"),
                w("child/pids.max", "768"),
                w("child/cpu.max", "400000 100000"),
                Call::Give(lease.join("child/cgroup.procs"), 1000),
                Call::Give(lease.join("cgroup.procs"), 1000),
            ]
        );

        let refused = Fake::new();
        refused
            .file(lease.join("cgroup.procs"), "41\n")
            .dir(lease, &["child", "main"])
            .dir(lease.join("child"), &[])
            .dir(lease.join("main"), &[])
            .unreadable(lease.join("cgroup.subtree_control"));
        let e = arm_child(&refused, &child, 1000, 1000).unwrap_err();
        assert!(
            matches!(&e, SessionError::Child { what, .. } if what.contains("cgroup.subtree_control")),
            "{e}"
        );
        assert!(!refused.calls().iter().any(|c| matches!(c, Call::Give(..))
            || matches!(c, Call::Write(f, _) if f.starts_with(lease.join("child")))));
    }

    /// The start gate through the fake: held once a reader has it (one open), and each way it
    /// fails is a no-decision naming the gate — an init that ends first, a deadline that
    /// passes while nobody opens it, a gate the host cannot open.
    #[test]
    fn a_start_gate_is_held_once_its_reader_has_it_and_every_failure_names_it() {
        let gate = std::path::Path::new("/run/l/gate");
        let later = Instant::now() + Duration::from_secs(60);
        let never = |_| Ok(false);
        let host = Fake::new();
        hold_gate(&host, gate, later, never).unwrap();
        assert_eq!(host.calls(), [Call::OpenGate(gate.into())]);

        let why = |e: SessionError| match e {
            SessionError::Gate { why } => why,
            other => panic!("{other:?}"),
        };
        let unread = Fake::new();
        unread.gate_unread();
        let ended = why(hold_gate(&unread, gate, later, |_| Ok(true)).unwrap_err());
        assert!(
            ended.contains("init ended before its entrypoint opened it"),
            "{ended}"
        );
        let past = Instant::now() + Duration::from_millis(20);
        let late = why(hold_gate(&unread, gate, past, never).unwrap_err());
        assert!(
            late.contains("did not open it by the stage's deadline"),
            "{late}"
        );
        assert!(
            unread.calls().len() > 2,
            "it looked again until the deadline"
        );

        let broken = Fake::new();
        broken.unreadable(gate);
        let e = why(hold_gate(&broken, gate, later, never).unwrap_err());
        assert!(e.starts_with("/run/l/gate: cannot be opened"), "{e}");
    }

    fn try_run(kind: StageKind, version: &str) -> (SessionError, Vec<Call>, usize) {
        try_run_with(&policy(|t| t), kind, version, &[])
    }

    fn try_run_with(
        policy: &Policy,
        kind: StageKind,
        version: &str,
        devices: &[&str],
    ) -> (SessionError, Vec<Call>, usize) {
        let (e, calls, leases, _) = try_run_on(Fake::new(), policy, kind, version, devices, false);
        (e, calls, leases)
    }

    /// A run on `fake`: its error, the host calls, the lease records made, and the evidence
    /// kept for the receipt.
    fn try_run_on(
        fake: Fake,
        policy: &Policy,
        kind: StageKind,
        version: &str,
        devices: &[&str],
        framed: bool,
    ) -> (
        SessionError,
        Vec<Call>,
        usize,
        Vec<cordon::receipt::Evidence>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let fake = Arc::new(fake);
        for d in devices {
            fake.device_node(
                *d,
                cordon::host::DeviceNode {
                    char: true,
                    major: 195,
                    minor: 0,
                },
            );
        }
        let mut setup = crate::settings::lease_setup(
            policy,
            "session-unit",
            &dir.path().join("state"),
            dir.path().join("run"),
        );
        setup.runtime.host = fake.clone();
        let session = Session {
            policy,
            kind,
            store: store.clone(),
            setup,
            authority: Digest::of_bytes(b"a"),
            runtime_version: version.to_owned(),
            evidence: crate::evidence::Evidence::new(&store),
        };
        let evidence = session.evidence.clone();
        let job = Job {
            argv: vec!["/bin/true".into()],
            image_rootfs: dir.path().join("rootfs"),
            sources: BTreeMap::new(),
            stdin: cordon::container::Input::Null,
            live_stdout: false,
            live_stderr: false,
            started: Instant::now(),
            framed,
            lane: None,
            candidate: None,
        };
        let e = session
            .run(&job, |_, _, _| Ok::<(), SessionError>(()), |_, _, _| Ok(()))
            .unwrap_err();
        let leases = std::fs::read_dir(store.root().join("leases"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "json")
            })
            .count();
        (e, fake.calls(), leases, evidence.take())
    }

    #[test]
    fn a_host_that_cannot_honour_the_stage_stops_before_any_lease_and_a_fit_ones_facts_are_kept() {
        let p = policy(|t| t);
        // Nothing readable: refused, a no-decision, before the lease.
        let (e, calls, leases, kept) = try_run_on(
            Fake::new(),
            &p,
            StageKind::Prebuild,
            "runc version 1.1.12",
            &[],
            false,
        );
        assert!(
            matches!(
                e,
                SessionError::Host(crate::host_fit::HostFitError::Unreadable { .. })
            ),
            "{e}"
        );
        assert_eq!(e.exit_class(), ExitCode::NoDecision);
        assert_eq!(calls, [Call::Read("/proc/meminfo".into())]);
        assert_eq!((leases, kept.len()), (0, 0));
        let host = |mem_kb: u64, smt: &str| {
            let f = Fake::new();
            f.file("/proc/meminfo", &format!("MemTotal: {mem_kb} kB\n"))
                .file("/sys/devices/system/cpu/smt/active", smt)
                .file("/proc/sys/kernel/unprivileged_bpf_disabled", "2")
                .file("/proc/cpuinfo", "flags\t: fpu sse2\n")
                .file(
                    "/sys/devices/system/cpu/vulnerabilities/meltdown",
                    "Not affected",
                );
            f
        };
        // Too little memory, or SMT on: refused the same way, no lease.
        for (f, code) in [
            (host(1 << 20, "0"), "cordon::host::memory"),
            (host(1 << 40, "1"), "cordon::host::posture"),
        ] {
            let (e, _, leases, kept) = try_run_on(
                f,
                &p,
                StageKind::Prebuild,
                "runc version 1.1.12",
                &[],
                false,
            );
            let got = miette::Diagnostic::code(&e).map(|c| c.to_string());
            assert_eq!(got.as_deref(), Some(code), "{e}");
            assert_eq!(e.exit_class(), ExitCode::NoDecision);
            // No lease; what the host reported, and why it was refused, kept for the receipt.
            assert_eq!(leases, 0);
            assert_eq!(
                kept.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
                ["host"]
            );
        }
        // A lane that mounts a publication no prebuild stage bounds: the policy's wiring.
        let unbounded = crate::host_fit::tests::without_prebuild();
        let devices = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"];
        let (e, _, leases, _) = try_run_on(
            host(1 << 40, "0"),
            &unbounded,
            StageKind::Reference,
            "runc version 1.1.12",
            &devices,
            true,
        );
        assert!(
            matches!(
                e,
                SessionError::Host(crate::host_fit::HostFitError::Unbounded { .. })
            ),
            "{e}"
        );
        assert_eq!((e.exit_class(), leases), (ExitCode::Usage, 0));
        // A fit host: the session goes on (and fails later on this fake), its facts kept.
        let (e, _, _, kept) = try_run_on(
            host(1 << 40, "0"),
            &p,
            StageKind::Prebuild,
            "runc version 1.1.12",
            &[],
            false,
        );
        assert!(!matches!(e, SessionError::Host(_)), "{e}");
        let record = kept.iter().find(|k| k.name == "host").unwrap();
        assert!(record.bytes > 0);
    }

    #[test]
    fn a_runtime_too_old_stops_before_anything_is_touched() {
        let (e, calls, leases) = try_run(StageKind::Prebuild, "runc version 1.0.0");
        assert!(
            matches!(
                e,
                SessionError::Lease(LeaseError::Runtime(RuntimeError::TooOld { .. }))
            ),
            "{e}"
        );
        assert!(calls.is_empty(), "{calls:?}");
        assert_eq!(leases, 0);
    }

    #[test]
    fn a_missing_gpu_device_stops_before_any_lease_exists() {
        // A reference stage that lists GPU nodes (the lane's come from CDI in part 2).
        let (e, calls, leases) = try_run_with(
            &policy(|t| cordon_testkit::with_reference_gpus(&t)),
            StageKind::Reference,
            "runc version 1.1.12",
            &[],
        );
        assert!(matches!(e, SessionError::Device { .. }), "{e}");
        assert_eq!(
            e.exit_class(),
            ExitCode::NoDecision,
            "a host without the device is a no-decision"
        );
        assert!(matches!(calls[0], Call::Device(_)), "{calls:?}");
        assert_eq!(leases, 0);
    }

    #[test]
    fn a_lane_run_by_a_caller_that_does_not_drive_its_framing_is_refused_before_a_lease() {
        let devices = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"];
        let (e, _, leases) = try_run_with(
            &policy(|t| t),
            StageKind::Lane,
            "runc version 1.1.12",
            &devices,
        );
        assert!(
            matches!(e, SessionError::Plan(PlanError::Unimplemented { .. })),
            "{e}"
        );
        assert_eq!(leases, 0);
    }

    #[test]
    fn a_descriptor_limit_above_the_supervisors_hard_limit_stops_before_anything_is_touched() {
        let (_, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let policy = policy(|t| t.replacen("nofile 4096", &format!("nofile {}", hard + 1), 1));
        let (e, calls, leases) =
            try_run_with(&policy, StageKind::Prebuild, "runc version 1.1.12", &[]);
        assert!(
            matches!(e, SessionError::Nofile { wanted, .. } if wanted == hard + 1),
            "{e}"
        );
        assert_eq!(
            e.exit_class(),
            ExitCode::NoDecision,
            "a control this host cannot apply is a no-decision"
        );
        assert!(calls.is_empty(), "{calls:?}");
        assert_eq!(leases, 0);
    }

    #[test]
    fn an_undeclared_stage_is_a_wiring_error() {
        let (e, _, leases) = try_run(StageKind::Surface, "runc version 1.1.12");
        assert_eq!(e.exit_class(), ExitCode::Usage, "{e}");
        assert_eq!(leases, 0);
    }
}
