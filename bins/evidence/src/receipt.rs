//! The receipt every stage prints on stdout and stores by digest (brief §5).
//!
//! A receipt is the only thing one stage hands the next. This module owns its shape (the stage
//! that wrote it is a [`StageName`], never free text), its digest, the authority check a stage
//! makes before it trusts an input receipt, the one rejection shape ([`Decision`]: accepted, or
//! rejected with [`Reason`]s — infrastructure failures are errors, never decisions), and the
//! typed outputs a later stage reads ([`FetchOutputs`], [`MaterializeOutputs`],
//! [`PrebuildOutputs`]). It does not own where receipts are stored or how a chain of them is
//! walked (`cordon::chain` does).

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use cordon_canon::canonical::{CanonicalError, Digest, domain_digest, to_canonical_json};

/// The receipt schema this build writes and accepts (2: receipts name their [`Evidence`]).
pub const RECEIPT_SCHEMA: u32 = 2;

/// The one reason a pass-on receipt carries ([`Receipt::pass_on`]).
pub const PASS_ON: &str = "stage.upstream";

/// The stage that wrote a receipt.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum StageName {
    /// `cordon-policy identity --json`.
    Policy,
    /// Private intake: the start of every candidate chain.
    Fetch,
    /// Materialization (a delta, an incumbent's registration, or a verification).
    Materialize,
    /// Native prebuild.
    Prebuild,
    /// The runtime lane: one engine session.
    Lane,
    /// A speed qualification: the three lane sessions B, C, B′ and the host's verdict.
    Qualify,
    /// The candidate's untimed audit session: regraded against T, never speed evidence.
    Audit,
    /// The pristine reference session.
    Reference,
    /// The final verdict: speed, quality and quiescence together.
    Verdict,
    /// The agent surface.
    Surface,
    /// Hygiene: recovery and quiescence.
    Reap,
}

impl StageName {
    /// The stage whose receipt this stage consumes in a candidate chain (`None`: it starts a
    /// chain, or stands alone).
    #[must_use]
    pub const fn predecessor(self) -> Option<Self> {
        match self {
            Self::Materialize => Some(Self::Fetch),
            Self::Prebuild => Some(Self::Materialize),
            Self::Lane => Some(Self::Prebuild),
            Self::Qualify => Some(Self::Prebuild),
            Self::Audit | Self::Reference | Self::Verdict => Some(Self::Qualify),
            Self::Policy | Self::Fetch | Self::Surface | Self::Reap => None,
        }
    }

    /// The name as written in receipts.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Fetch => "fetch",
            Self::Materialize => "materialize",
            Self::Prebuild => "prebuild",
            Self::Lane => "lane",
            Self::Qualify => "qualify",
            Self::Audit => "audit",
            Self::Reference => "reference",
            Self::Verdict => "verdict",
            Self::Surface => "surface",
            Self::Reap => "reap",
        }
    }
}

impl std::fmt::Display for StageName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a stage decided about the candidate: its established value, or a rejection with the
/// findings behind it. What the infrastructure could not establish is never a decision: it is
/// an error, and becomes a no-decision receipt.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<T> {
    /// The candidate passed this stage.
    Accepted(T),
    /// The candidate failed.
    Rejected(Rejection),
}

/// Why the candidate failed: every finding (each with its stable code), and the evidence the
/// rejection receipt carries as its outputs (a meta record, located findings).
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// The findings, at least one.
    pub findings: Vec<Reason>,
    /// The rejection receipt's outputs.
    pub evidence: Value,
}

impl Rejection {
    /// A rejection with one finding.
    #[must_use]
    pub fn one(code: &str, message: String, evidence: Value) -> Self {
        Self {
            findings: vec![Reason {
                code: code.to_owned(),
                message,
            }],
            evidence,
        }
    }

    /// The first finding's code.
    #[must_use]
    pub fn code(&self) -> &str {
        self.findings.first().map_or("", |f| f.code.as_str())
    }
}

/// What `cordon-fetch` established (an `ok` receipt's outputs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchOutputs {
    /// The archive's own sha256 (the committed hash).
    pub archive_sha256: Digest,
    /// The intake record's content digest.
    pub content_digest: Digest,
    /// Files admitted.
    pub files: u64,
    /// Bytes admitted.
    pub bytes: u64,
}

/// What `cordon-materialize` established for a delta (an `ok` receipt's outputs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MaterializeOutputs {
    /// The materialized tree.
    pub tree_digest: Digest,
    /// The delta's content digest.
    pub delta_digest: Digest,
    /// The incumbent tree it replaced one target of.
    pub incumbent: Digest,
    /// The target.
    pub target: String,
    /// The candidate's namespace.
    pub namespace: Option<String>,
    /// The registered build step the delta names.
    pub step: Option<String>,
    /// Findings (empty on `ok`).
    pub findings: Vec<serde_json::Value>,
}

/// What `cordon-materialize incumbent` established: a registered incumbent tree. Such a
/// receipt has no predecessor; it starts an incumbent's chain (role B's), as a fetch receipt
/// starts a candidate's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IncumbentOutputs {
    /// The registered tree.
    pub tree_digest: Digest,
    /// The engine's name, from its manifest.
    pub incumbent: String,
    /// The registered prebuild step that builds its publication (`build step=`).
    pub step: Option<String>,
    /// Its files.
    pub files: u64,
    /// Its bytes.
    pub bytes: u64,
}

/// What `cordon-prebuild` established (an `ok` receipt's outputs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrebuildOutputs {
    /// The sealed publication.
    pub publication: Digest,
    /// Its files.
    pub files: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Whether the cache answered and no container ran.
    pub cached: bool,
    /// The build's meta record (none when cached).
    pub meta: Option<Meta>,
}

/// The role of an engine session: the standing incumbent (B), the candidate (C), the pristine
/// reference (T), the quality authority, which runs in its own stage and protocol, or the
/// candidate again in its untimed audit session (A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Role {
    /// The incumbent.
    B,
    /// The candidate.
    C,
    /// The pristine reference.
    T,
    /// The candidate in its untimed audit session (host-sampled requests, regraded against T).
    A,
}

/// Which part of a workload a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LanePhase {
    /// Warms the engine up; not timed.
    Warmup,
    /// Conditions the engine; measured apart from the timed requests.
    Conditioning,
    /// Timed.
    Timed,
}

/// One request of a lane session as the host saw it: host stamps only, nanoseconds since the
/// container started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaneWindow {
    /// The request's index in the workload.
    pub index: u32,
    /// Its phase.
    pub phase: LanePhase,
    /// The tokens the plan asked for (and the engine produced).
    pub tokens: u32,
    /// When the host began sending the request.
    pub sent_ns: u64,
    /// When the host had received the whole response.
    pub received_ns: u64,
}

/// The physical lane a read ran on (its device set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaneAssignment {
    /// The policy's name for it.
    pub name: String,
    /// Its CPUs, as a cpu list.
    pub cpuset: String,
    /// The read's CPU weight on it (the policy's `cpu-shares`), when the policy names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
}

/// When a device receipt was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DevicePhase {
    /// Before the container exists, with the host's GPU lock held.
    Pre,
    /// During the last warmup request, while the engine works on it.
    Active,
    /// After the lease's release.
    Post,
}

/// What the host observed of a read's devices at one moment. It only claims what it
/// observed: with no GPU there are no GPU samples and no drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceReceipt {
    /// The read it belongs to (its lease).
    pub launch: String,
    /// Its place in the read's receipts: strictly increasing, pre first.
    pub seq: u32,
    /// When in the read.
    pub phase: DevicePhase,
    /// When, ns since the read began, on the host's monotonic clock.
    pub at_ns: u64,
    /// The GPUs observed (none: the lane has no GPU).
    pub gpus: Vec<String>,
    /// Active: the CPUs the kernel's cpuset controller gives the container's cgroup
    /// (effective), as a cpu list.
    pub cpuset: Option<String>,
    /// Post: the lease's release proved the container and its processes absent (OCI
    /// quiescence). Never set where it was not observed.
    pub quiescent: Option<bool>,
    /// A GPU lane's, pre and post: each GPU's configuration as the driver reported it, in
    /// `gpus`' order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<crate::device::DeviceConfig>,
    /// A GPU lane's: each GPU's samples, in `gpus`' order — pre and post its drain's last
    /// samples (the idle run last), active the one sample during the last warmup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<Vec<crate::device::Sample>>,
    /// What was and was not observed, for people.
    pub note: String,
}

/// A read's device receipts, pre, active and post.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceReceipts {
    /// Before.
    pub pre: DeviceReceipt,
    /// During the last warmup.
    pub active: DeviceReceipt,
    /// After.
    pub post: DeviceReceipt,
}

/// How long a read held the host-global lock that serializes GPU work across lanes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LockSpan {
    /// How long the read waited for it, ns.
    pub waited_ns: u64,
    /// When it was acquired, ns since the Unix epoch (the host's wall clock).
    pub from_unix_ns: u64,
    /// When it was released, ns since the Unix epoch.
    pub until_unix_ns: u64,
}

/// What `cordon-lane session` established (an `ok` receipt's outputs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaneOutputs {
    /// The session's role.
    pub role: Role,
    /// The engine tree mounted read-only.
    pub tree: Digest,
    /// The native publication mounted read-only.
    pub publication: Digest,
    /// The model mounted read-only.
    pub model: Digest,
    /// The workload file.
    pub workload: Digest,
    /// The worker's installed bytes (inside the pinned image).
    pub worker: Digest,
    /// The posture frame's payload as received.
    pub posture: Digest,
    /// The registered engine step.
    pub step: String,
    /// When the engine was ready, ns after the container started.
    pub ready_ns: u64,
    /// Every request, host-stamped.
    pub windows: Vec<LaneWindow>,
    /// The digest of the engine's output tokens, in request order.
    pub outputs: Digest,
    /// Timed tokens per second, in thousandths, from host stamps only: timed tokens over the
    /// span from the first timed request sent to the last timed response received.
    pub timed_rate_milli: u64,
    /// The container's meta record.
    pub meta: Meta,
    /// The lease the session ran under.
    pub lease: String,
    /// The launch digest: the normalised `config.json` (argv, env, seccomp profile, mount
    /// table by role, devices, limits, namespaces), the image, the deadlines and the protocol
    /// version — everything of the launch but the run's own values (tree, publication,
    /// account, lease, lane).
    pub launch: Digest,
    /// The physical lane, when the read was assigned one.
    pub lane: Option<LaneAssignment>,
    /// What the host observed of the devices, pre, active and post.
    pub devices: DeviceReceipts,
    /// The host-global lock span.
    pub gpu_lock: LockSpan,
}

/// Typed outputs of one stage's `ok` receipt.
pub trait StageOutputs: Serialize + for<'de> Deserialize<'de> {
    /// The stage that writes them.
    const STAGE: StageName;
}

impl StageOutputs for FetchOutputs {
    const STAGE: StageName = StageName::Fetch;
}

impl StageOutputs for MaterializeOutputs {
    const STAGE: StageName = StageName::Materialize;
}

impl StageOutputs for IncumbentOutputs {
    const STAGE: StageName = StageName::Materialize;
}

impl StageOutputs for PrebuildOutputs {
    const STAGE: StageName = StageName::Prebuild;
}

impl StageOutputs for LaneOutputs {
    const STAGE: StageName = StageName::Lane;
}

/// Whether a stage established its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The candidate passed this stage.
    Ok,
    /// The candidate failed a check; `reasons` says which.
    Rejected,
    /// The infrastructure could not establish authority.
    NoDecision,
}

impl Outcome {
    /// The outcome as written in receipts.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::NoDecision => "no-decision",
        }
    }
}

/// One machine-readable reason behind an outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Reason {
    /// A stable dotted code such as `intake.symlink`.
    pub code: String,
    /// A human sentence.
    pub message: String,
}

/// One object a stage preserved for whoever reads its receipt later: the build's or engine's
/// output, or the host's own record of the run (its lease record, the runtime's state, the
/// cgroup's events, the container's mount table, teardown errors). Stored by content under the
/// store's `evidence/`; candidate bytes in it are shown only escaped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    /// What it is: `stdout`, `stderr`, `lease-record`, `runtime-state`, `cgroup-events`,
    /// `mountinfo`, `bundle`, `teardown`, `frames`.
    pub name: String,
    /// Its sha256: its name in the store's `evidence/`.
    pub sha256: Digest,
    /// Its size in bytes (after its bound).
    pub bytes: u64,
}

/// Facts about the host that produced a receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Host {
    /// The kernel's hostname.
    pub hostname: String,
    /// The kernel release (`uname -r`).
    pub kernel: String,
}

impl Host {
    /// Read the host facts from `/proc/sys/kernel`. Missing files give `"unknown"`: these are
    /// descriptive facts, never used to decide anything.
    #[must_use]
    pub fn probe() -> Self {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".to_owned())
        };
        Self {
            hostname: read("hostname"),
            kernel: read("osrelease"),
        }
    }
}

/// A stage's receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// [`RECEIPT_SCHEMA`].
    pub schema: u32,
    /// Which stage wrote it.
    pub stage: StageName,
    /// The authority identity the stage ran under.
    pub authority: Digest,
    /// What the stage established.
    pub outcome: Outcome,
    /// Why, in machine-readable form.
    pub reasons: Vec<Reason>,
    /// What the stage consumed.
    pub inputs: Value,
    /// What the stage produced.
    pub outputs: Value,
    /// The digest of the receipt this stage consumed, if any.
    pub prev: Option<Digest>,
    /// What the stage preserved beside its result: logs and host evidence, stored by digest
    /// under the store's `evidence/` (absent when empty). Supplementary: a reader may inspect
    /// it, no verdict rests on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<Evidence>,
    /// Where it ran.
    pub host: Host,
    /// RFC 3339 UTC, millisecond precision.
    pub started_at: String,
    /// RFC 3339 UTC, millisecond precision.
    pub finished_at: String,
}

/// `; what differs: …` for a foreign authority whose differing parts are known.
fn what_differs(differs: &[String]) -> String {
    if differs.is_empty() {
        String::new()
    } else {
        format!("; what differs: {}", differs.join("; "))
    }
}

/// What a foreign authority's refusal knows of its parts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForeignParts {
    /// The evidence the receipt names for its authority's parts (`authority`, `policy`).
    pub evidence: Vec<Evidence>,
    /// Each part that differs, once read (empty: not known).
    pub differs: Vec<String>,
}

/// The evidence names under which a receipt carries its authority's parts: the authority
/// components and the canonical policy, each stored by its sha256.
pub const AUTHORITY_PARTS: [&str; 2] = ["authority", "policy"];

/// Why a receipt could not be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ReceiptError {
    /// The receipt was made under another authority than the one this stage runs under.
    #[error(
        "receipt was made under authority {found}, this stage runs under {expected}{}",
        what_differs(&parts.differs)
    )]
    #[diagnostic(
        code(cordon::receipt::foreign_authority),
        help(
            "re-run the earlier stages under the current policy, runtime and images (what differs is read from the parts the receipt names as its `authority` and `policy` evidence, when the store holds them)"
        )
    )]
    ForeignAuthority {
        /// The receipt's authority.
        found: Digest,
        /// This stage's authority.
        expected: Digest,
        /// Its parts and what differs (boxed: every receipt error carries this variant's size).
        parts: Box<ForeignParts>,
    },
    /// The receipt's schema is not the one this build understands.
    #[error("receipt schema {found} is not supported (this build reads schema {RECEIPT_SCHEMA})")]
    #[diagnostic(code(cordon::receipt::schema))]
    Schema {
        /// The schema found.
        found: u32,
    },
    /// The receipt text is not a receipt.
    #[error("input is not a cordon receipt")]
    #[diagnostic(
        code(cordon::receipt::parse),
        help(
            "give the receipt the stage before printed: pipe it in (`cordon-fetch … | cordon-materialize …`) or name its file (`--receipt FILE`; cordon-reference's `--qualify FILE`; `-` for stdin); an input that ends at once means nothing was piped in"
        )
    )]
    Parse {
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The receipt's outputs are not what its stage writes.
    #[error("the {stage} receipt's outputs are not {stage} outputs")]
    #[diagnostic(code(cordon::receipt::outputs))]
    Outputs {
        /// The stage.
        stage: StageName,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The receipt's inputs are not what its stage records.
    #[error("the {stage} receipt's inputs are not {stage} inputs")]
    #[diagnostic(code(cordon::receipt::inputs))]
    Inputs {
        /// The stage.
        stage: StageName,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The receipt is another stage's than the outputs asked for.
    #[error("the receipt is from stage {found}, not {expected}")]
    #[diagnostic(code(cordon::receipt::stage))]
    Stage {
        /// Its stage.
        found: StageName,
        /// The stage asked for.
        expected: StageName,
    },
    /// A stage's own inputs or outputs could not be recorded in its receipt.
    #[error("the {stage} stage cannot record its own inputs or outputs")]
    #[diagnostic(code(cordon::receipt::record))]
    Record {
        /// The stage.
        stage: StageName,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The receipt could not be encoded.
    #[error("receipt cannot be encoded")]
    #[diagnostic(code(cordon::receipt::encode))]
    Encode {
        /// The encoder's error.
        #[source]
        source: CanonicalError,
    },
}

impl cordon_canon::exit::ExitClass for ReceiptError {
    /// A receipt that is not usable as an input is the operator's wiring (2); one cordon cannot
    /// record or encode is a no-decision (3). (An input receipt that does not encode reaches a
    /// stage through `StageError::Receipt`, which keeps it the operator's.)
    fn exit_class(&self) -> cordon_canon::ExitCode {
        match self {
            Self::Record { .. } | Self::Encode { .. } => cordon_canon::ExitCode::NoDecision,
            Self::ForeignAuthority { .. }
            | Self::Schema { .. }
            | Self::Parse { .. }
            | Self::Outputs { .. }
            | Self::Inputs { .. }
            | Self::Stage { .. } => cordon_canon::ExitCode::Usage,
        }
    }
}

/// The current time as RFC 3339 UTC with millisecond precision.
#[must_use]
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Receipt {
    /// A receipt with `started_at` and `finished_at` both now; callers set `started_at` when
    /// the stage did work worth timing.
    #[must_use]
    pub fn new(stage: StageName, authority: Digest, outcome: Outcome) -> Self {
        Self::at(stage, authority, outcome, Host::probe(), &now_rfc3339())
    }

    /// A receipt made on `host` at `now` (both timestamps): the host facts and the clock passed
    /// in, so a receipt can be built exactly (goldens, [`crate::examples`]).
    #[must_use]
    pub fn at(
        stage: StageName,
        authority: Digest,
        outcome: Outcome,
        host: Host,
        now: &str,
    ) -> Self {
        Self {
            schema: RECEIPT_SCHEMA,
            stage,
            authority,
            outcome,
            reasons: Vec::new(),
            inputs: Value::Object(serde_json::Map::new()),
            outputs: Value::Object(serde_json::Map::new()),
            prev: None,
            evidence: Vec::new(),
            host,
            started_at: now.to_owned(),
            finished_at: now.to_owned(),
        }
    }

    /// The receipt of a stage that did nothing because its input, `upstream` (stored as
    /// `digest`), records a verdict rather than a result: the same outcome, `upstream` as its
    /// `prev`, one [`PASS_ON`] reason and no outputs. Such a receipt is the one that may rest
    /// on a receipt that is not `ok` ([`Receipt::passes_on`]).
    #[must_use]
    pub fn pass_on(stage: StageName, upstream: &Self, digest: Digest) -> Self {
        let mut r = Self::new(stage, upstream.authority, upstream.outcome);
        r.prev = Some(digest);
        r.reasons.push(Reason {
            code: PASS_ON.into(),
            message: format!(
                "the {} receipt {digest} is {}: this stage did nothing",
                upstream.stage.as_str(),
                upstream.outcome.as_str()
            ),
        });
        r
    }

    /// Whether this receipt only passes on its predecessor's verdict ([`Receipt::pass_on`]'s
    /// shape): not `ok`, a `prev`, exactly one [`PASS_ON`] reason and empty outputs. A
    /// chain walker lets such a receipt, and only such, rest on one of the same outcome.
    #[must_use]
    pub fn passes_on(&self) -> bool {
        self.outcome != Outcome::Ok
            && self.prev.is_some()
            && matches!(self.reasons.as_slice(), [r] if r.code == PASS_ON)
            && self
                .outputs
                .as_object()
                .is_some_and(serde_json::Map::is_empty)
    }

    /// Parse a receipt and check its schema.
    ///
    /// # Errors
    /// [`ReceiptError::Parse`] or [`ReceiptError::Schema`].
    pub fn parse(text: &str) -> Result<Self, ReceiptError> {
        let receipt: Self =
            serde_json::from_str(text).map_err(|source| ReceiptError::Parse { source })?;
        if receipt.schema != RECEIPT_SCHEMA {
            return Err(ReceiptError::Schema {
                found: receipt.schema,
            });
        }
        Ok(receipt)
    }

    /// Refuse a receipt made under another authority.
    ///
    /// # Errors
    /// [`ReceiptError::ForeignAuthority`], showing both identities.
    pub fn require_authority(&self, expected: &Digest) -> Result<(), ReceiptError> {
        if &self.authority == expected {
            Ok(())
        } else {
            Err(ReceiptError::ForeignAuthority {
                found: self.authority,
                expected: *expected,
                parts: Box::new(ForeignParts {
                    evidence: self
                        .evidence
                        .iter()
                        .filter(|e| AUTHORITY_PARTS.contains(&e.name.as_str()))
                        .cloned()
                        .collect(),
                    differs: Vec::new(),
                }),
            })
        }
    }

    /// The canonical JSON text, as printed on stdout and stored.
    ///
    /// # Errors
    /// [`ReceiptError::Encode`] when inputs or outputs hold a float.
    pub fn to_canonical_json(&self) -> Result<String, ReceiptError> {
        to_canonical_json(self).map_err(|source| ReceiptError::Encode { source })
    }

    /// The outputs of this receipt as its stage's typed outputs.
    ///
    /// # Errors
    /// Another stage's receipt, or outputs of another shape.
    pub fn outputs_as<T: StageOutputs>(&self) -> Result<T, ReceiptError> {
        if self.stage != T::STAGE {
            return Err(ReceiptError::Stage {
                found: self.stage,
                expected: T::STAGE,
            });
        }
        serde_json::from_value(self.outputs.clone()).map_err(|source| ReceiptError::Outputs {
            stage: self.stage,
            source,
        })
    }

    /// The inputs of this receipt as its stage's typed inputs.
    ///
    /// # Errors
    /// Another stage's receipt, or inputs of another shape.
    pub fn inputs_as<T: crate::inputs::StageInputs>(&self) -> Result<T, ReceiptError> {
        if self.stage != T::STAGE {
            return Err(ReceiptError::Stage {
                found: self.stage,
                expected: T::STAGE,
            });
        }
        serde_json::from_value(self.inputs.clone()).map_err(|source| ReceiptError::Inputs {
            stage: self.stage,
            source,
        })
    }

    /// Set the inputs from a stage's typed inputs.
    ///
    /// # Errors
    /// The inputs do not serialize.
    pub fn set_inputs<T: crate::inputs::StageInputs>(
        &mut self,
        inputs: &T,
    ) -> Result<(), ReceiptError> {
        self.inputs = serde_json::to_value(inputs).map_err(|source| ReceiptError::Record {
            stage: T::STAGE,
            source,
        })?;
        Ok(())
    }

    /// Set the outputs from a stage's typed outputs.
    ///
    /// # Errors
    /// The outputs do not serialize.
    pub fn set_outputs<T: StageOutputs>(&mut self, outputs: &T) -> Result<(), ReceiptError> {
        self.outputs = serde_json::to_value(outputs).map_err(|source| ReceiptError::Record {
            stage: T::STAGE,
            source,
        })?;
        Ok(())
    }

    /// The receipt's digest, which the next stage records as `prev`.
    ///
    /// # Errors
    /// [`ReceiptError::Encode`] when inputs or outputs hold a float.
    pub fn digest(&self) -> Result<Digest, ReceiptError> {
        domain_digest("cordon.receipt", RECEIPT_SCHEMA, self)
            .map_err(|source| ReceiptError::Encode { source })
    }
}

/// The meta record of one run (the default: nothing recorded).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Meta {
    /// Exit code when the init exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when it was killed by one.
    pub signal: Option<i32>,
    /// Whether cordon killed it because the deadline passed.
    pub killed_by_deadline: bool,
    /// Whether the kernel's OOM killer acted in its cgroup.
    pub oom_killed: bool,
    /// Wall time from start to exit, ms.
    pub wall_ms: u64,
    /// CPU time of the cgroup, ms (when the cgroup could be read).
    pub cpu_ms: Option<u64>,
    /// Peak memory of the cgroup, bytes (when it could be read).
    pub peak_memory_bytes: Option<u64>,
    /// Bytes the container wrote to stdout (all of them, kept or not).
    pub stdout_bytes: u64,
    /// Bytes to stderr.
    pub stderr_bytes: u64,
    /// Whether stdout went over its cap.
    pub stdout_truncated: bool,
    /// Whether stderr went over its cap.
    pub stderr_truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_round_trips_through_canonical_json() {
        let mut r = Receipt::new(StageName::Policy, Digest::of_bytes(b"a"), Outcome::Ok);
        r.reasons.push(Reason {
            code: "x.y".into(),
            message: "m".into(),
        });
        let text = r.to_canonical_json().unwrap();
        let back = Receipt::parse(&text).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.digest().unwrap(), r.digest().unwrap());
        assert!(text.contains(r#""outcome":"ok""#));
    }

    #[test]
    fn foreign_authority_is_refused_showing_both() {
        let r = Receipt::new(StageName::Fetch, Digest::of_bytes(b"a"), Outcome::Ok);
        let other = Digest::of_bytes(b"b");
        let err = r.require_authority(&other).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&r.authority.to_string()) && text.contains(&other.to_string()));
        r.require_authority(&r.authority).unwrap();
    }

    #[test]
    fn other_schema_and_unknown_fields_are_refused() {
        let r = Receipt::new(
            StageName::Fetch,
            Digest::of_bytes(b"a"),
            Outcome::NoDecision,
        );
        let text = r.to_canonical_json().unwrap();
        let old = text.replace(r#""schema":2"#, r#""schema":1"#);
        assert!(matches!(
            Receipt::parse(&old),
            Err(ReceiptError::Schema { found: 1 })
        ));
        let extra = text.replacen('{', r#"{"zzz":1,"#, 1);
        assert!(matches!(
            Receipt::parse(&extra),
            Err(ReceiptError::Parse { .. })
        ));
    }
}
