//! One engine session of the `lane` stage (roles B and C) or of the `reference` stage (T, the
//! pristine reference, in its own protocol): parse → plan → apply, with the framed protocol
//! driven by the host.
//!
//! Parse: the stage, its frame bounds and both phase deadlines, the one registered lane step,
//! the image pin. Plan: reopen and verify the tree and the publication (the exact ones the
//! prebuild receipt names, never a parent), check the model and the workload (its frames must
//! fit the stage's bounds), verify and unpack the image, and seal the policy's pinned worker
//! digest into the worker's argv (never the digest of what the image cache holds). Apply: one
//! [`Session`] with live stdin/stdout, driven by [`crate::driver::drive`]; a session that ends
//! early kills the container, and release (with its absence proof) always runs.
//!
//! Every session records its launch digest (the plan less the run's own values), its device
//! receipts pre, active (during the last warmup) and post (what the host observed: the CPUs
//! the kernel allowed the container's cgroup, then the release's OCI quiescence; on a GPU
//! lane what the device guard read of each GPU, [`crate::guard`], whose failure in any phase
//! is a no-decision) and the span it held the host's GPU lock.
//!
//! What it does not own: the verdict on speed and the roles' order and lanes (the qualify
//! module's), and the receipt (the CLI's).

use cordon::ExitCode;
use cordon::exit::ExitClass;
use std::path::{Component, PathBuf};
use std::time::{Duration, Instant};

use cordon::canonical::Digest;
use cordon::container::Input;
use cordon::lease::quarantine;
use cordon::receipt::{
    Decision, DevicePhase, DeviceReceipt, DeviceReceipts, LaneAssignment, LaneOutputs, LanePhase,
    LaneWindow, Rejection, Role,
};
use cordon::runtime::Meta;
use cordon::tree::{self, PUBLICATIONS, TREES};
use cordon_frame::message::{PROTOCOL, Posture, Seen};
use cordon_frame::{LANE, Limits, Protocol, REFERENCE};
use cordon_policy_lang::{MountSource, PhysicalLane, Policy, StageKind};
use cordon_stage::bundle::{PlanError, Planned};
use cordon_stage::session::{Job, SessionError};
use serde_json::json;

use crate::apart::Apart;
use crate::driver::{self, Plan, Verdict};
use crate::lock::GpuLock;
use crate::model::{self, ModelError};
use crate::workload::{Workload, WorkloadError};

/// Where the worker lives inside the runtime image.
pub const WORKER: &str = "/cordon/worker";

/// ENETUNREACH: what a connect to any address but loopback meets with no route.
const ENETUNREACH: i32 = 101;

/// The engine cache variables: where one is set, it must point into the runtime cache mount.
pub const CACHE_VARIABLES: [&str; 5] = [
    "XDG_CACHE_HOME",
    "HF_HOME",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "CUDA_CACHE_PATH",
];

/// The cache mount's destination and the cache directories the environment names under it.
///
/// # Errors
/// An engine cache variable points outside the cache mount (or there is none).
pub fn cache_dirs(
    stage: &cordon_policy_lang::Stage,
) -> Result<(Option<String>, Vec<String>), LaneError> {
    let root = stage
        .mount
        .iter()
        .find(|(_, m)| m.source == MountSource::Cache)
        .map(|(dest, _)| dest.clone());
    let under = |v: &str| {
        root.as_deref()
            .is_some_and(|r| std::path::Path::new(v).starts_with(r))
    };
    for var in CACHE_VARIABLES {
        if let Some(v) = stage.env.get(var)
            && !under(v)
        {
            return Err(LaneError::Policy(format!(
                "the engine cache variable {var}={v} does not point into the runtime cache mount"
            )));
        }
    }
    let mut dirs: Vec<String> = stage.env.values().filter(|v| under(v)).cloned().collect();
    // Lexically plain paths only: "/cache/../engine" starts with "/cache" too.
    if let Some(v) = dirs.iter().find(|v| {
        !std::path::Path::new(v)
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    }) {
        return Err(LaneError::Policy(format!(
            "the cache directory {v} is not a plain absolute path"
        )));
    }
    dirs.sort();
    dirs.dedup();
    Ok((root, dirs))
}

/// Where the stage works.
pub use cordon_stage::session::StageConfig as Config;

/// What one session runs.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The role.
    pub role: Role,
    /// The engine tree.
    pub tree: Digest,
    /// Its native publication.
    pub publication: Digest,
    /// The workload file.
    pub workload: PathBuf,
    /// The model directory.
    pub model: PathBuf,
    /// The physical lane, when the read is one of a qualification's.
    pub lane: Option<LaneAssignment>,
}

/// What cordon could not establish (exit 3), or the operator's wiring error (exit 2).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LaneError {
    /// The policy cannot run a lane session.
    #[error("the policy cannot run a lane session: {0}")]
    #[diagnostic(code(cordon::lane::policy))]
    Policy(String),
    /// The workload is not usable.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Workload(#[from] WorkloadError),
    /// The model is not usable.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Model(#[from] ModelError),
    /// The tree or publication is missing or corrupt.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Tree(#[from] tree::TreeError),
    /// The image is missing or not the pinned one.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Image(#[from] cordon::image::ImageError),
    /// The session could not establish its run.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Session(#[from] SessionError),
    /// The framed session could not be established (worker, posture, stream).
    #[error("the lane session could not be established: {0}")]
    #[diagnostic(code(cordon::lane::no_decision))]
    NoDecision(String),
}

impl ExitClass for LaneError {
    /// The operator's wiring (policy, workload, model, a session's plan) is exit 2; anything
    /// else cordon could not establish is a no-decision.
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Policy(_) | Self::Workload(_) | Self::Model(_) => ExitCode::Usage,
            Self::Session(s) => s.exit_class(),
            Self::Tree(_) | Self::Image(_) | Self::NoDecision(_) => ExitCode::NoDecision,
        }
    }
}

impl cordon_stage::receipt_io::Infrastructure for LaneError {
    fn reason_code(&self) -> &'static str {
        "lane.infrastructure"
    }
}

/// What the stage decided.
pub type Outcome = Decision<LaneOutputs>;

/// Timed tokens per second, in thousandths, from host stamps only.
#[must_use]
pub fn timed_rate_milli(windows: &[LaneWindow]) -> u64 {
    let timed: Vec<&LaneWindow> = windows
        .iter()
        .filter(|w| w.phase == LanePhase::Timed)
        .collect();
    let (Some(first), Some(last)) = (timed.first(), timed.last()) else {
        return 0;
    };
    let tokens: u128 = timed.iter().map(|w| u128::from(w.tokens)).sum();
    let span = u128::from(last.received_ns.saturating_sub(first.sent_ns)).max(1);
    u64::try_from(tokens * 1_000_000_000_000 / span).unwrap_or(u64::MAX)
}

/// What the posture must be, from the plan.
#[derive(Debug, Clone)]
pub struct Expected {
    /// The worker's digest, hex.
    pub worker: String,
    /// The run account.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Path → read-only, for every path the worker is asked about.
    pub read_only: std::collections::BTreeMap<String, bool>,
    /// The cache directories the worker must make and prove.
    pub caches: Vec<String>,
    /// In the pristine reference session: the tree and publication the worker must see from
    /// inside (the pinned tree, a publication with nothing in it). Nothing in a lane's.
    pub seen: Option<Seen>,
}

impl Expected {
    fn from_plan(
        planned: &Planned,
        worker: &Digest,
        asked: &[String],
        caches: &[String],
        seen: Option<Seen>,
    ) -> Self {
        let user = planned.spec.process().as_ref().map(|p| p.user().clone());
        let root_ro = planned
            .spec
            .root()
            .as_ref()
            .and_then(|r| r.readonly())
            .unwrap_or(false);
        let mounts = planned.spec.mounts().clone().unwrap_or_default();
        let read_only = asked
            .iter()
            .map(|path| {
                let ro = if path == "/" {
                    root_ro
                } else {
                    // A path the plan does not mount is expected writable: the posture then
                    // shows a difference either way.
                    mounts
                        .iter()
                        .find(|m| m.destination().to_string_lossy() == path.as_str())
                        .is_some_and(|m| m.options().iter().flatten().any(|o| o == "ro"))
                };
                (path.clone(), ro)
            })
            .collect();
        Self {
            worker: worker.hex(),
            uid: user.as_ref().map_or(u32::MAX, |u| u.uid()),
            gid: user.as_ref().map_or(u32::MAX, |u| u.gid()),
            read_only,
            caches: caches.to_vec(),
            seen,
        }
    }

    /// How `p` differs from this expectation (empty: as planned).
    #[must_use]
    pub fn differences(&self, p: &Posture) -> Vec<String> {
        let mut d = Vec::new();
        let mut want = |ok: bool, what: String| {
            if !ok {
                d.push(what);
            }
        };
        want(p.protocol == PROTOCOL, format!("protocol {}", p.protocol));
        want(
            p.sealed_matches && p.worker_sha256 == self.worker,
            format!("the worker is {} (sealed {})", p.worker_sha256, self.worker),
        );
        want(
            (p.uid, p.gid) == (self.uid, self.gid),
            format!("runs as {}:{}, not {}:{}", p.uid, p.gid, self.uid, self.gid),
        );
        for (name, v) in [
            ("CapEff", p.cap_eff),
            ("CapPrm", p.cap_prm),
            ("CapBnd", p.cap_bnd),
            ("CapAmb", p.cap_amb),
        ] {
            want(v == 0, format!("{name} is {v:x}"));
        }
        want(p.no_new_privs, "no_new_privs is off".into());
        want(
            p.seccomp_mode == 2 && p.seccomp_filters >= 1,
            format!(
                "seccomp mode {} with {} filters",
                p.seccomp_mode, p.seccomp_filters
            ),
        );
        want(
            p.interfaces == ["lo"],
            format!("interfaces {:?}", p.interfaces),
        );
        want(p.routes == 0, format!("{} routes", p.routes));
        want(
            p.connect_errno == Some(ENETUNREACH),
            format!(
                "a connect out ended with {:?}, not ENETUNREACH",
                p.connect_errno
            ),
        );
        want(
            p.read_only == self.read_only,
            format!(
                "read-only mounts {:?}, not {:?}",
                p.read_only, self.read_only
            ),
        );
        let caches: std::collections::BTreeMap<String, String> = self
            .caches
            .iter()
            .map(|d| (d.clone(), "ok".to_owned()))
            .collect();
        want(
            p.caches == caches,
            format!("cache directories {:?}, not all ok", p.caches),
        );
        want(
            p.seen == self.seen,
            format!(
                "from inside it sees the tree and publication {:?}, not {:?}",
                p.seen, self.seen
            ),
        );
        d
    }
}

/// Run one engine session under the host's GPU lock, waiting for it first.
///
/// # Errors
/// Anything cordon could not establish, or the operator's wiring error.
pub fn session(policy: &Policy, cfg: &Config, inputs: &Inputs) -> Result<Outcome, LaneError> {
    let lock =
        crate::lock::acquire_for(policy, &cfg.setup.lock_dir).map_err(LaneError::NoDecision)?;
    session_under(policy, cfg, inputs, &lock)
}

/// The container job of one read: the worker's argv in the pinned image, the tree, the
/// publication and the model bound in, its stdin and stdout live for the frames.
fn lane_job(
    cfg: &Config,
    inputs: &Inputs,
    argv: Vec<String>,
    (image_rootfs, model_dir, lane): (PathBuf, PathBuf, Option<PhysicalLane>),
    started: Instant,
) -> Job {
    Job {
        argv,
        image_rootfs,
        sources: [
            (
                MountSource::Tree,
                tree::root_in(&cfg.store, TREES, &inputs.tree),
            ),
            (
                MountSource::Publication,
                tree::root_in(&cfg.store, PUBLICATIONS, &inputs.publication),
            ),
            (MountSource::Model, model_dir),
        ]
        .into(),
        stdin: Input::Live,
        live_stdout: true,
        live_stderr: false,
        started,
        framed: true,
        lane,
        // Only the candidate's engine (its timed and audit reads) is stopped by an incident:
        // one in the incumbent's or the pristine reference's read implicates the host.
        candidate: matches!(inputs.role, Role::C | Role::A).then_some(inputs.tree),
    }
}

/// The stage a role's sessions run in and the protocol its worker speaks to the host: B, C and
/// C's audit (A) read in the lane; T, the pristine reference, in its own stage and protocol.
#[must_use]
pub const fn stage_of(role: Role) -> (StageKind, Protocol) {
    match role {
        Role::B | Role::C | Role::A => (StageKind::Lane, LANE),
        Role::T => (StageKind::Reference, REFERENCE),
    }
}

/// What a session's stage of the policy fixes for it, each value required.
struct LaneStage<'p> {
    kind: StageKind,
    stage: &'p cordon_policy_lang::Stage,
    limits: Limits,
    startup: Duration,
    workload_phase: Duration,
    step: &'p str,
    engine: Vec<String>,
    ranks: u32,
    role: &'p str,
    pin: Digest,
}

/// Parse: the values of stage `kind` (the lane's or the reference session's) this session
/// enforces.
fn lane_stage(policy: &Policy, kind: StageKind) -> Result<LaneStage<'_>, LaneError> {
    let stage = policy
        .stage(kind)
        .ok_or(SessionError::Plan(PlanError::NoStage { kind }))?;
    let frame = stage
        .frame
        .as_ref()
        .ok_or_else(|| LaneError::Policy(format!("the {kind} stage has no frame bounds")))?;
    let limits = Limits {
        max_bytes: u32::try_from(frame.max_bytes)
            .map_err(|_| LaneError::Policy("frame max-bytes is over 4 GiB".into()))?,
        max_frames: frame.max_frames,
    };
    let phase_ms = |name: &str| {
        stage
            .phase_deadline_ms
            .get(name)
            .copied()
            .map(Duration::from_millis)
            .ok_or_else(|| {
                LaneError::Policy(format!("the {kind} stage has no phase-deadline {name:?}"))
            })
    };
    let (startup, workload_phase) = (phase_ms("startup")?, phase_ms("workload")?);
    // The phases run one after the other inside the stage's absolute deadline (which the
    // driver also enforces): phases that could not both fit are a policy mistake.
    if startup + workload_phase > Duration::from_millis(stage.deadline_ms) {
        return Err(LaneError::Policy(
            "the startup and workload phases together are longer than the stage's deadline".into(),
        ));
    }
    if let Some(extra) = stage
        .phase_deadline_ms
        .keys()
        .find(|k| !matches!(k.as_str(), "startup" | "workload"))
    {
        return Err(LaneError::Policy(format!(
            "phase-deadline {extra:?} is not a phase of the {kind} session (startup, workload)"
        )));
    }
    let steps: Vec<&str> = policy.steps_of(kind).collect();
    let [step] = steps.as_slice() else {
        return Err(LaneError::Policy(format!(
            "exactly one step of stage \"{kind}\" must be registered, not {}",
            steps.len()
        )));
    };
    let engine = policy
        .step(step)
        .map(|(_, argv)| argv.to_vec())
        .unwrap_or_default();
    // The language requires it of an engine step; none is never read as one.
    let ranks = policy
        .step_ranks(step)
        .ok_or_else(|| LaneError::Policy(format!("the engine step {step:?} declares no ranks")))?;
    let (role, pin) = cordon_stage::bundle::image_of(policy, kind).map_err(SessionError::Plan)?;

    Ok(LaneStage {
        kind,
        stage,
        limits,
        startup,
        workload_phase,
        step,
        engine,
        ranks,
        role,
        pin,
    })
}

/// Where a stage mounts the source `source` (the pristine checks need the tree's and the
/// publication's).
fn mounted_at(stage: &cordon_policy_lang::Stage, source: MountSource) -> Result<String, LaneError> {
    stage
        .mount
        .iter()
        .find(|(_, m)| m.source == source)
        .map(|(dest, _)| dest.clone())
        .ok_or_else(|| LaneError::Policy(format!("the stage mounts no {source:?}")))
}

/// What the worker of the pristine reference session must see, and the tree and publication
/// mounts it looks at.
type Pristine = (Option<Seen>, Option<(String, String)>);

/// The pristine reference session's checks: its publication holds nothing (checked here before
/// launch, and from inside by the worker), and the worker must see exactly the pinned tree.
/// What the worker must see and the mounts it looks at; nothing for a lane read.
fn pristine_checks(
    policy: &Policy,
    stage: &cordon_policy_lang::Stage,
    inputs: &Inputs,
    (tree_record, publication): (&tree::TreeRecord, &tree::TreeRecord),
) -> Result<Pristine, LaneError> {
    // The publication's control record (its name covers it) says what made it: a build of
    // this very tree by this authority's patcher, or T's control-only publication.
    let control = tree::Control::of(publication)?;
    let refused = |why: String| {
        LaneError::NoDecision(format!(
            "publication {} is not this session's: {why}",
            inputs.publication
        ))
    };
    match inputs.role {
        Role::B | Role::C | Role::A => {
            cordon_stage::publication::matches(policy, &control, tree_record, None)
                .map_err(refused)?;
            Ok((None, None))
        }
        Role::T if !publication.entries.is_empty() => Err(LaneError::NoDecision(format!(
            "the reference session's publication {} is not control-only: it holds {} files",
            inputs.publication,
            publication.entries.len()
        ))),
        Role::T if !matches!(control, tree::Control::ControlOnly { .. }) => Err(refused(
            "the reference session runs only a control-only publication".into(),
        )),
        Role::T => Ok((
            Some(Seen {
                tree: inputs.tree.to_string(),
                publication: Vec::new(),
            }),
            Some((
                mounted_at(stage, MountSource::Tree)?,
                mounted_at(stage, MountSource::Publication)?,
            )),
        )),
    }
}

/// The worker's argv: the protocol (with the pristine checks' mounts in the reference
/// session), the sealed digest, the frame bounds, the read-only paths it checks, the caches,
/// then the engine's own argv.
fn worker_argv(
    protocol: Protocol,
    pristine: Option<(String, String)>,
    worker: &Digest,
    limits: Limits,
    (asked, cache_root, caches): (&[String], Option<&String>, &[String]),
    engine: Vec<String>,
) -> Vec<String> {
    let mut argv = vec![
        WORKER.to_owned(),
        "--protocol".into(),
        protocol.name.to_owned(),
    ];
    if let Some((tree, publication)) = pristine {
        argv.extend([
            "--tree".to_owned(),
            tree,
            "--publication".into(),
            publication,
        ]);
    }
    argv.extend([
        "--sealed".into(),
        worker.hex(),
        "--max-bytes".into(),
        limits.max_bytes.to_string(),
        "--max-frames".into(),
        limits.max_frames.to_string(),
    ]);
    for path in asked {
        argv.extend(["--read-only".to_owned(), path.clone()]);
    }
    if let (Some(root), false) = (cache_root, caches.is_empty()) {
        argv.extend(["--cache-root".to_owned(), root.clone()]);
        for dir in caches {
            argv.extend(["--cache".to_owned(), dir.clone()]);
        }
    }
    argv.push("--".into());
    argv.extend(engine);
    argv
}

/// What the device guard observed of a GPU lane's read, pre, active and post (see
/// [`crate::guard`]).
#[derive(Debug, Default)]
struct Guarded {
    gpus: Vec<String>,
    pre: crate::guard::Observed,
    active: crate::guard::Observed,
    post: crate::guard::Observed,
}

/// The device receipts of a read: the lock held before, the cgroup's CPUs during the last
/// warmup, OCI quiescence after — and on a GPU lane what the device guard observed in each.
fn device_receipts(
    lease: &str,
    pre_ns: u64,
    (active_ns, cpuset): (u64, Option<String>),
    post_ns: u64,
    guarded: Option<Guarded>,
) -> DeviceReceipts {
    let on_gpus = guarded.is_some();
    let g = guarded.unwrap_or_default();
    let receipt = |seq: u32, phase, at_ns, o: crate::guard::Observed, note: &str| {
        let mut note = note.to_owned();
        for n in &o.note {
            note.push_str("; ");
            note.push_str(n);
        }
        DeviceReceipt {
            launch: lease.to_owned(),
            seq,
            phase,
            at_ns,
            gpus: g.gpus.clone(),
            cpuset: None,
            quiescent: None,
            config: o.config,
            samples: o.samples,
            note,
        }
    };
    let [pre, active, post] = if on_gpus {
        [
            "each GPU as pinned, then drained (the policy's idle samples, the last ones kept); the host's GPU lock is held",
            "each GPU sampled during the last warmup, inside the policy's envelope; the CPUs of the container's cgroup (cpuset, effective)",
            "after the lease's release (OCI quiescence): each GPU as pinned, then drained",
        ]
    } else {
        [
            "no GPU on the lane: nothing to drain; the host's GPU lock is held (another read waits for it)",
            "no GPU on the lane: the CPUs of the container's cgroup (cpuset, effective) during the last warmup",
            "no GPU on the lane: OCI quiescence only (the lease's absence proof), no drain observed",
        ]
    };
    DeviceReceipts {
        pre: receipt(0, DevicePhase::Pre, pre_ns, g.pre, pre),
        active: DeviceReceipt {
            cpuset,
            ..receipt(1, DevicePhase::Active, active_ns, g.active, active)
        },
        post: DeviceReceipt {
            quiescent: Some(true),
            ..receipt(2, DevicePhase::Post, post_ns, g.post, post)
        },
    }
}

/// Run one engine session under `lock`, the host's GPU lock the caller holds (a
/// qualification holds it for all its reads).
///
/// # Errors
/// Anything cordon could not establish, or the operator's wiring error.
pub fn session_under(
    policy: &Policy,
    cfg: &Config,
    inputs: &Inputs,
    lock: &GpuLock,
) -> Result<Outcome, LaneError> {
    session_gated(policy, cfg, inputs, lock, |_| Ok(()))
}

/// [`session_under`] with a `gate` run as the executor's one manager before the lease begins
/// (the reference session's strict quiescence: nothing can start between it and T).
///
/// # Errors
/// Anything cordon could not establish, the operator's wiring error, or the gate's.
#[allow(clippy::too_many_lines)]
pub fn session_gated(
    policy: &Policy,
    cfg: &Config,
    inputs: &Inputs,
    lock: &GpuLock,
    gate: impl FnOnce(&cordon::lease::Manager) -> Result<(), LaneError>,
) -> Result<Outcome, LaneError> {
    let started = Instant::now();
    let from_unix_ns = crate::lock::unix_ns();
    let (kind, protocol) = stage_of(inputs.role);
    let LaneStage {
        kind,
        stage,
        limits,
        startup,
        workload_phase,
        step,
        engine,
        ranks,
        role,
        pin,
    } = lane_stage(policy, kind)?;

    // Plan: everything is verified before anything runs.
    let (workload, workload_digest) = Workload::load(&inputs.workload)?;
    workload
        .fits(limits.max_bytes, limits.max_frames)
        .map_err(|why| WorkloadError::Invalid {
            path: inputs.workload.display().to_string(),
            why,
        })?;
    let (model_dir, model_digest) = model::verify(&inputs.model)?;
    // Only a model registered by digest in the policy's models root, and neither it nor the
    // root overlapping the host's own directories.
    let models = std::path::Path::new(policy.models_root());
    let host_dirs = [
        cfg.key_dir.as_path(),
        cfg.store.root(),
        cfg.images.as_path(),
        cfg.setup.run_root.as_path(),
        cfg.setup.runtime.state_root.as_path(),
    ];
    model::apart(&model_dir, &host_dirs)?;
    let table = "/proc/self/mountinfo";
    let mountinfo = std::fs::read_to_string(table).map_err(|source| model::ModelError::Read {
        path: table.into(),
        source,
    })?;
    model::unmounted(&model_dir, &mountinfo)?;
    if let Ok(root) = std::fs::canonicalize(models) {
        model::apart(&root, &host_dirs)?;
    }
    model::registered(models, &model_dir, &model_digest)?;
    let tree_record = tree::verify(&cfg.store, &inputs.tree)?;
    let publication = tree::verify_in(&cfg.store, PUBLICATIONS, &inputs.publication)?;
    let (seen, pristine) = pristine_checks(policy, stage, inputs, (&tree_record, &publication))?;
    let rootfs = cordon::image::unpack(&cfg.store, &cfg.images.join(role), &pin)?;
    // The reviewed digest is sealed, never the bytes found in the image cache: a worker
    // replaced there reports its own digest in the posture, and the session is a no-decision.
    let worker = *policy.worker_pin().ok_or_else(|| {
        LaneError::Policy("the policy pins no worker digest (worker digest=…)".into())
    })?;
    let (cache_root, caches) = cache_dirs(stage)?;
    let asked: Vec<String> = std::iter::once("/".to_owned())
        .chain(stage.mount.keys().cloned())
        .collect();
    let argv = worker_argv(
        protocol,
        pristine,
        &worker,
        limits,
        (&asked, cache_root.as_ref(), &caches),
        engine,
    );

    let session = cfg.session(policy, kind);
    // The read's lane as the policy declares it (its GPUs with it); the caller's description,
    // which the receipt and the CPU checks use, must be the policy's exactly.
    let lane = match &inputs.lane {
        Some(l) => {
            let declared = policy.physical_lanes().get(&l.name).ok_or_else(|| {
                LaneError::Policy(format!(
                    "the read's lane {:?} is not one of the policy's physical lanes",
                    l.name
                ))
            })?;
            if (&declared.cpuset, declared.cpu_shares) != (&l.cpuset, l.cpu_shares) {
                return Err(LaneError::Policy(format!(
                    "the read's lane {:?} is described otherwise than the policy declares it",
                    l.name
                )));
            }
            Some(declared.clone())
        }
        None => None,
    };
    // A GPU lane's read is guarded: its GPUs as pinned and drained before it, sampled during
    // its last warmup, as pinned and drained after it (crate::guard).
    let pins = lane.as_ref().map(|l| l.gpus.clone()).unwrap_or_default();
    let guard = if pins.is_empty() {
        None
    } else {
        let devices = lock.devices().ok_or_else(|| {
            LaneError::NoDecision(
                "the read's lane names GPUs, and the GPU lock holds no way to read them".into(),
            )
        })?;
        let rules = policy.device_guard().ok_or_else(|| {
            LaneError::Policy("the lanes name GPUs and the policy has no device-guard".into())
        })?;
        Some(crate::guard::Guard::new(devices, &pins, rules, &cfg.store))
    };
    let mut guarded = guard.as_ref().map(|g| Guarded {
        gpus: g.gpus(),
        ..Guarded::default()
    });
    let job = lane_job(cfg, inputs, argv, (rootfs, model_dir, lane), started);
    let mut verdict = None;
    // The quarantine a containment incident imposed, said in the no-decision.
    let mut quarantined = None;
    let mut launch = None;
    let mut active = None;
    let shares = inputs.lane.as_ref().and_then(|l| l.cpu_shares);
    let mut weighted = None;
    let since =
        |t: Instant| u64::try_from(t.duration_since(started).as_nanos()).unwrap_or(u64::MAX);
    let pre_ns = since(Instant::now());
    if let (Some(g), Some(seen)) = (&guard, guarded.as_mut()) {
        match g.pre() {
            Ok(o) => seen.pre = o,
            Err(f) => return Err(guard_failed(cfg, "before the read", &seen.gpus, &f)),
        }
    }
    let mut gpu_active = None;
    let ran = session.run_gated(
        &job,
        gate,
        |running, planned, deadline| {
            launch = Some(launch_digest(planned, &pin)?);
            // Before the engine starts: the GPU nodes the container got are its lane's GPUs.
            if let Some(g) = &guard {
                g.nodes(&cordon_stage::bundle::character_devices(&planned.spec))
                    .map_err(|why| LaneError::NoDecision(format!("the lane's GPUs: {why}")))?;
            }
            // The container's cgroup, whose cpuset only the host can change.
            let lease = planned
                .spec
                .annotations()
                .as_ref()
                .and_then(|a| a.get(cordon::lease::LABEL_LEASE))
                .cloned()
                .unwrap_or_default();
            let cgroup = cfg.setup.probe(&lease);
            let plan = Plan {
                protocol,
                workload: &workload,
                limits,
                startup,
                workload_phase,
                absolute: deadline,
                ranks,
            };
            let expected = Expected::from_plan(planned, &worker, &asked, &caches, seen.clone());
            let (Some(stdin), Some(stdout)) = (running.take_stdin(), running.take_stdout()) else {
                return Err(LaneError::NoDecision(
                    "the container's pipes are not live".into(),
                ));
            };
            // The supervisor's own threads leave a timed read's lane (the reader and writer
            // spawned below inherit it) until the session is over.
            let _apart = inputs
                .lane
                .as_ref()
                .map(|l| {
                    let cpus = cordon_policy_lang::cpu_list(&l.cpuset).ok_or_else(|| {
                        LaneError::NoDecision(format!("the lane's cpu list {:?}", l.cpuset))
                    })?;
                    Apart::enter(&cpus).map_err(LaneError::NoDecision)
                })
                .transpose()?;
            let origin = Instant::now();
            let rx = driver::reader(stdout, stage.output.stdout_bytes);
            // While the engine works on its last warmup request: the CPUs the kernel's cpuset
            // gives the container's cgroup (its lane's). Not a process's affinity: the engine
            // could narrow the worker's, never widen the cgroup's.
            let mut during_warmup = || {
                active = Some((since(Instant::now()), cgroup.cpuset_effective()));
                // The lane's CPU weight, as the kernel holds it for the container's cgroup.
                weighted = shares.map(|s| (s, cgroup.has_cpu_shares(s)));
                gpu_active = guard.as_ref().map(crate::guard::Guard::active);
            };
            let mut recent = driver::Recent::default();
            let v = driver::drive(
                &rx,
                driver::writer(stdin),
                origin,
                &plan,
                &|p| expected.differences(p),
                &mut during_warmup,
                &mut recent,
            );
            if let Verdict::Containment(why) = &v {
                // Before anything else that could fail: the executor stops whatever follows.
                quarantined = Some(contained(&cfg.store, &cfg.setup.executor, why));
            }
            if !matches!(v, Verdict::Served(_)) {
                // The session is over: nothing of the engine may keep running until the
                // stage deadline. A container already gone is not an error here; release
                // proves absence either way.
                let _ = running.kill();
                // What the engine said last, as the host read it: the incident's frames.
                cfg.evidence
                    .keep("frames", recent.last())
                    .map_err(|e| LaneError::NoDecision(format!("keeping the frames: {e}")))?;
            }
            verdict = Some(v);
            Ok(())
        },
        |lease, _, finished| {
            Ok::<_, LaneError>((finished.meta.clone(), lease.record.lease.clone()))
        },
    );
    // After the release, whatever the read came to: a GPU it left busy or changed is marked.
    let post_ns = since(Instant::now());
    let gpu_post = guard.as_ref().map(crate::guard::Guard::post);
    // The release (and its absence proof) succeeded: the read is over on every device. When
    // it did not, what the guard saw (a mark its pre drain lifted, a post phase that failed)
    // is kept all the same.
    let ran = match ran {
        Ok(r) => r,
        Err(e) => {
            if let Some(seen) = guarded.as_mut() {
                let post = gpu_post.map(|p| p.map_err(|f| (f.why.clone(), f.observed)));
                let record = json!({
                    "when": "a read that did not end",
                    "gpus": seen.gpus,
                    "pre": seen.pre,
                    "post": post,
                });
                if let Err(k) = keep_devices(cfg, &record) {
                    return Err(LaneError::NoDecision(format!("{e}; {k}")));
                }
            }
            return Err(e);
        }
    };
    let gpu_lock = lock.span(from_unix_ns);
    let (meta, lease) = ran.inspected;
    let verdict =
        verdict.ok_or_else(|| LaneError::NoDecision("the session was not driven".into()))?;
    let launch =
        launch.ok_or_else(|| LaneError::NoDecision("the session was not driven".into()))?;
    if let Some((shares, applied)) = weighted
        && applied != Some(true)
    {
        // A read timed without the weight the policy gives it measured another host.
        return Err(LaneError::NoDecision(format!(
            "the lane's CPU weight (cpu-shares {shares}) was not the container's cgroup's during the read"
        )));
    }
    // What the guard could not establish voids the read's measurement: a no-decision (but for
    // a containment incident, which stands). A read that never reached its last warmup has no
    // active sample to miss.
    let mut void = Vec::new();
    if let Some(seen) = guarded.as_mut() {
        match gpu_active {
            Some(Ok(o)) => seen.active = o,
            Some(Err(f)) => {
                seen.active = f.observed;
                void.push(format!("during the last warmup: {}", f.why));
            }
            None if matches!(verdict, Verdict::Served(_)) => {
                void.push("no sample during the last warmup".to_owned());
            }
            None => {}
        }
        match gpu_post {
            Some(Ok(o)) => seen.post = o,
            Some(Err(f)) => {
                seen.post = f.observed;
                void.push(format!("after the read: {}", f.why));
            }
            None => void.push("not checked after the read".to_owned()),
        }
    }
    let devices = device_receipts(
        &lease,
        pre_ns,
        active.unwrap_or((0, None)),
        post_ns,
        guarded,
    );
    if !matches!(verdict, Verdict::Served(_)) || !void.is_empty() {
        // A read that did not serve names its device receipts as evidence (a served read
        // carries them in its outputs).
        keep_devices(cfg, &devices).map_err(LaneError::NoDecision)?;
    }
    if let (Verdict::Containment(why), Some(line)) = (&verdict, &quarantined) {
        return Err(LaneError::NoDecision(format!("{why}; {line}")));
    }
    if !void.is_empty() {
        return Err(LaneError::NoDecision(format!(
            "the lane's GPUs: {}",
            void.join("; ")
        )));
    }
    let cap = stage.output.stdout_bytes;
    decide(verdict, meta, lease, |t, meta, lease| {
        let outputs = keep_outputs(&cfg.store, &t.outputs, cap)?;
        let windows = t.windows;
        Ok(LaneOutputs {
            role: inputs.role,
            tree: inputs.tree,
            publication: inputs.publication,
            model: model_digest,
            workload: workload_digest,
            worker,
            posture: t.posture_digest,
            step: (*step).to_owned(),
            ready_ns: t.ready_ns,
            timed_rate_milli: timed_rate_milli(&windows),
            windows,
            outputs,
            meta,
            lease,
            launch,
            lane: inputs.lane.clone(),
            devices,
            gpu_lock,
        })
    })
}

/// A guard phase that did not hold, before the read: its observations kept as the read's
/// device evidence, and the no-decision that says why.
fn guard_failed(cfg: &Config, when: &str, gpus: &[String], f: &crate::guard::Failed) -> LaneError {
    let why = format!("the lane's GPUs {when}: {}", f.why);
    let record = json!({ "when": when, "gpus": gpus, "observed": f.observed, "why": f.why });
    match keep_devices(cfg, &record) {
        Ok(()) => LaneError::NoDecision(why),
        Err(e) => LaneError::NoDecision(format!("{why}; {e}")),
    }
}

/// Keep `record` as the read's device evidence.
fn keep_devices(cfg: &Config, record: &impl serde::Serialize) -> Result<(), String> {
    let text = cordon::canonical::to_canonical_json(record)
        .map_err(|e| format!("the device evidence: {e}"))?;
    cfg.evidence
        .keep("devices", text.as_bytes())
        .map_err(|e| format!("keeping the device evidence: {e}"))
}

/// Store a served session's output tokens as one content object (so grading replays from the
/// store alone) and name it by digest. Its binary form is never larger than the frames it came
/// from, which the stage's stdout cap bounded as they arrived; the cap is checked again here.
///
/// # Errors
/// The object cannot be encoded or stored, or is over the cap.
pub fn keep_outputs(
    store: &cordon::store::Store,
    outputs: &[Vec<u32>],
    cap: u64,
) -> Result<Digest, LaneError> {
    let bytes = cordon_evidence::outputs::encode(outputs)
        .map_err(|e| LaneError::NoDecision(format!("the outputs object: {e}")))?;
    if bytes.len() as u64 > cap {
        return Err(LaneError::NoDecision(format!(
            "the outputs object of {} bytes is over the stage's stdout cap of {cap}",
            bytes.len()
        )));
    }
    store
        .put_object(&bytes)
        .map_err(|e| LaneError::NoDecision(format!("storing the outputs object: {e}")))
}

/// The launch digest of a planned read: its launch identity (the spec less the run's own
/// values), the image pin, the deadlines and the protocol version.
///
/// # Errors
/// It cannot be encoded.
fn launch_digest(planned: &Planned, image: &Digest) -> Result<Digest, LaneError> {
    cordon::canonical::domain_digest(
        "cordon.launch",
        1,
        &json!({
            "spec": planned.launch,
            "image": image,
            "deadline_ms": planned.session.deadline_ms,
            "phase_deadline_ms": planned.session.phase_deadline_ms,
            "protocol": PROTOCOL,
        }),
    )
    .map_err(|e| LaneError::NoDecision(format!("the launch digest: {e}")))
}

/// The stage's decision from the driver's verdict and the container's meta record: the
/// resource kills the runtime saw are the candidate's own failures, whatever the stream said.
fn decide(
    verdict: Verdict,
    meta: Meta,
    lease: String,
    outputs: impl FnOnce(Box<driver::Transcript>, Meta, String) -> Result<LaneOutputs, LaneError>,
) -> Result<Outcome, LaneError> {
    let reject = |code: &str, message: String, meta: &Meta, lease: &str| {
        Ok(Decision::Rejected(Rejection::one(
            code,
            message,
            json!({ "meta": meta, "lease": lease }),
        )))
    };
    if meta.oom_killed {
        return reject(
            "lane.oom",
            "the engine was killed for memory".into(),
            &meta,
            &lease,
        );
    }
    if meta.killed_by_deadline {
        return reject(
            "lane.deadline",
            "the session was killed at the stage's absolute deadline".into(),
            &meta,
            &lease,
        );
    }
    match verdict {
        Verdict::Served(t) => Ok(Decision::Accepted(outputs(t, meta, lease)?)),
        Verdict::Violation { code, message } => reject(code, message, &meta, &lease),
        Verdict::NoDecision(why) => Err(LaneError::NoDecision(why)),
        // Imposed by the caller, which knows the executor, before it decides.
        Verdict::Containment(why) => Err(LaneError::NoDecision(why)),
    }
}

/// A session whose container did not hold the planned controls: no more work on `executor`
/// until an operator proves it quiescent (seed 001's checklist, step 1). The line the
/// no-decision carries. (The record names no lease: it is imposed while the session runs,
/// before anything that could fail; the receipt's evidence names the lease.)
fn contained(store: &cordon::store::Store, executor: &str, why: &str) -> String {
    quarantine::impose_on_executor(store, executor, quarantine::Cause::Containment, why, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posture_unlike_the_plan_quarantines_the_executor() {
        let dir = tempfile::tempdir().unwrap();
        let store = cordon::store::Store::open(&dir.path().join("store")).unwrap();
        let line = contained(&store, "lane-x", "CapEff is 1");
        assert!(
            line.starts_with("executor lane-x quarantined (containment, record "),
            "{line}"
        );
        let all = quarantine::in_force(&store).unwrap();
        let q = all.values().next().unwrap();
        assert_eq!(q.cause, quarantine::Cause::Containment);
        assert_eq!(q.why, "CapEff is 1");
        assert!(matches!(
            quarantine::check(&store, "lane-x", &[]),
            Err(cordon::lease::LeaseError::Quarantined { .. })
        ));
    }

    /// Each control the posture reports is compared: the posture as planned has no difference,
    /// and every one of these changes alone — a capability in any one set, no_new_privs off, no
    /// seccomp filter, another interface or a route, a connect that did not fail as planned, a
    /// writable read-only mount, a cache not made, another worker, uid or protocol, what the
    /// reference sees — is exactly one difference, named.
    #[test]
    fn every_control_in_the_posture_is_compared_with_the_plan() {
        let expected = Expected {
            worker: "ab".repeat(32),
            uid: 3_000_100,
            gid: 3_000_100,
            read_only: [("/".to_owned(), true), ("/engine".to_owned(), true)].into(),
            caches: vec!["/cache/xdg".into()],
            seen: None,
        };
        let planned = Posture {
            protocol: PROTOCOL,
            worker_sha256: expected.worker.clone(),
            sealed_matches: true,
            uid: expected.uid,
            gid: expected.gid,
            cap_eff: 0,
            cap_prm: 0,
            cap_bnd: 0,
            cap_amb: 0,
            no_new_privs: true,
            seccomp_mode: 2,
            seccomp_filters: 1,
            interfaces: vec!["lo".into()],
            routes: 0,
            connect_errno: Some(ENETUNREACH),
            read_only: expected.read_only.clone(),
            caches: [("/cache/xdg".to_owned(), "ok".to_owned())].into(),
            seen: None,
        };
        assert_eq!(expected.differences(&planned), Vec::<String>::new());
        type Change = Box<dyn Fn(&mut Posture)>;
        let changes: Vec<(&str, Change)> = vec![
            ("protocol", Box::new(|p| p.protocol += 1)),
            ("the worker", Box::new(|p| p.sealed_matches = false)),
            (
                "the worker",
                Box::new(|p| p.worker_sha256 = "cd".repeat(32)),
            ),
            ("runs as", Box::new(|p| p.uid = 0)),
            ("runs as", Box::new(|p| p.gid = 0)),
            ("CapEff", Box::new(|p| p.cap_eff = 1 << 19)),
            ("CapPrm", Box::new(|p| p.cap_prm = 1 << 19)),
            ("CapBnd", Box::new(|p| p.cap_bnd = 1 << 19)),
            ("CapAmb", Box::new(|p| p.cap_amb = 1 << 19)),
            ("no_new_privs", Box::new(|p| p.no_new_privs = false)),
            ("seccomp", Box::new(|p| p.seccomp_mode = 0)),
            ("seccomp", Box::new(|p| p.seccomp_filters = 0)),
            ("interfaces", Box::new(|p| p.interfaces.push("eth0".into()))),
            ("routes", Box::new(|p| p.routes = 1)),
            ("connect", Box::new(|p| p.connect_errno = None)),
            (
                "read-only",
                Box::new(|p| *p.read_only.get_mut("/engine").unwrap() = false),
            ),
            (
                "read-only",
                Box::new(|p| *p.read_only.get_mut("/").unwrap() = false),
            ),
            (
                "cache",
                Box::new(|p| *p.caches.get_mut("/cache/xdg").unwrap() = "missing".into()),
            ),
            (
                "sees",
                Box::new(|p| {
                    p.seen = Some(Seen {
                        tree: "x".into(),
                        publication: Vec::new(),
                    });
                }),
            ),
        ];
        for (named, change) in changes {
            let mut p = planned.clone();
            change(&mut p);
            let d = expected.differences(&p);
            assert!(d.len() == 1 && d[0].contains(named), "{named}: {d:?}");
        }
    }

    fn default_policy() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/evaluator.kdl"
        ))
        .unwrap()
    }

    fn lane_caches(text: &str) -> Result<(Option<String>, Vec<String>), LaneError> {
        let policy = cordon_policy_lang::parse("t.kdl", text).unwrap();
        cache_dirs(policy.stage(StageKind::Lane).unwrap())
    }

    #[test]
    fn every_engine_cache_variable_points_into_the_cache_mount_or_the_lane_is_refused() {
        let (root, dirs) = lane_caches(&default_policy()).unwrap();
        assert_eq!(root.as_deref(), Some("/cache"));
        assert_eq!(
            dirs,
            [
                "/cache/cuda",
                "/cache/hf",
                "/cache/inductor",
                "/cache/triton",
                "/cache/xdg"
            ]
        );
        // Only the lane's block is edited (the reference stage has the same lines).
        let text = default_policy();
        let at = text.find("stage \"reference\"").unwrap();
        let (lane, rest) = text.split_at(at);
        for (from, to) in [
            (
                "XDG_CACHE_HOME \"/cache/xdg\"",
                "XDG_CACHE_HOME \"/tmp/xdg\"",
            ),
            ("HF_HOME \"/cache/hf\"", "HF_HOME \"/cachex/hf\""),
        ] {
            let edited = cordon_testkit::replace_once(lane, from, to) + rest;
            let e = lane_caches(&edited).unwrap_err();
            assert_eq!(e.exit_class(), ExitCode::Usage, "{e}");
            assert!(
                e.to_string().contains(from.split(' ').next().unwrap()),
                "{e}"
            );
        }
        // Neither the mount nor its bounds (the language refuses one without the other).
        let no_cache = cordon_testkit::replace_once(
            &cordon_testkit::replace_once(lane, "    mount \"cache\" \"/cache\" mode=\"rw\"\n", ""),
            "    cache size=\"8GiB\" inodes=1000000\n",
            "",
        ) + rest;
        assert!(
            lane_caches(&no_cache).is_err(),
            "cache variables need a cache mount"
        );
        let dotted = cordon_testkit::replace_once(
            lane,
            "TRITON_CACHE_DIR \"/cache/triton\"",
            "TRITON_CACHE_DIR \"/cache/../engine\"",
        ) + rest;
        let e = lane_caches(&dotted).unwrap_err();
        assert!(e.to_string().contains("plain absolute path"), "{e}");
    }
}
