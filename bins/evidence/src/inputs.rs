//! What each stage consumed, as its receipt's `inputs` records it: one typed shape per stage, so
//! a later stage or an auditor reads a field by its name in Rust, never by a JSON key. The
//! surface's outputs live here too, beside its inputs, since no other stage reads them.

use std::path::PathBuf;

use cordon_canon::Digest;
use serde::{Deserialize, Serialize};

use crate::receipt::{LaneAssignment, Meta, Role, StageName, StageOutputs};

/// A stage's typed inputs ([`crate::receipt::Receipt::inputs_as`]).
pub trait StageInputs: Serialize + for<'de> Deserialize<'de> {
    /// The stage that records them.
    const STAGE: StageName;
}

/// What `cordon-fetch` was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchInputs {
    /// The source as given (a path or a URL).
    pub source: String,
    /// The digest the archive must have.
    pub sha256: Digest,
}

/// What `cordon-materialize` was asked for: one of its three jobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged, deny_unknown_fields)]
pub enum MaterializeInputs {
    /// Register an incumbent from a directory.
    Incumbent {
        /// The directory.
        incumbent_dir: PathBuf,
    },
    /// Re-verify a stored tree.
    Verify {
        /// The tree.
        tree: Digest,
    },
    /// Materialize a fetched delta over an incumbent.
    Delta {
        /// The incumbent's tree.
        incumbent: Digest,
        /// The delta's intake content.
        delta: Digest,
    },
}

/// What `cordon-prebuild` built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrebuildInputs {
    /// The engine tree.
    pub tree: Digest,
    /// The registered build step it names, if any.
    pub step: Option<String>,
}

/// What one lane session ran: a session of its own, or one read of a qualification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaneInputs {
    /// The role.
    pub role: Role,
    /// Which read of a qualification (`B`, `C`, `B′`), when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<String>,
    /// The engine tree.
    pub tree: Digest,
    /// Its native publication.
    pub publication: Digest,
    /// The workload file.
    pub workload: PathBuf,
    /// The model directory.
    pub model: PathBuf,
    /// The physical lane, when a qualification assigned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<LaneAssignment>,
}

/// What a qualification compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QualifyInputs {
    /// The incumbent's prebuild receipt.
    pub incumbent: Digest,
    /// The candidate's prebuild receipt.
    pub candidate: Digest,
    /// The workload file.
    pub workload: PathBuf,
    /// The model directory.
    pub model: PathBuf,
    /// The primary attempt this one reproduces (lanes swapped), when it is a reproduction.
    #[serde(default)]
    pub reproduces: Option<Digest>,
}

/// What `cordon-reap` was asked to do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReapInputs {
    /// The executor.
    pub executor: String,
    /// `--check`.
    pub check: bool,
    /// `--status`.
    pub status: bool,
    /// `--sweep`.
    pub sweep: bool,
    /// `--surface`: the surface's state directory whose rootless runs were reaped (absent for
    /// the host's leases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface_state: Option<PathBuf>,
    /// `--clear`: the quarantine this run was asked to lift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear: Option<String>,
    /// `--quarantine`: why the operator stopped new work on the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<String>,
}

/// Which run of an agent a surface run is: the ADR's two credential tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// The agent process: `pass-env` and `agent-env` cross.
    Agent,
    /// One shell command of the agent: only `pass-env` crosses, and home and temp are private
    /// tmpfs of its own over the agent's.
    Command,
}

/// What a surface run was asked to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SurfaceInputs {
    /// The workspace (canonical host path).
    pub workspace: PathBuf,
    /// The tier.
    pub tier: Tier,
    /// The argv.
    pub argv: Vec<String>,
    /// The skill versions requested (`NAME@sha256:…`), as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
}

/// One connection the surface's egress proxy was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressConnection {
    /// The name asked for (escaped when it is not a name).
    pub domain: String,
    /// The port asked for.
    pub port: u16,
    /// `allowed`, or `refused: why`.
    pub verdict: String,
    /// The address connected to, when allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Bytes from the sandbox out.
    pub bytes_out: u64,
    /// Bytes from the far end in.
    pub bytes_in: u64,
}

/// What an `ok` or `rejected` surface receipt records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SurfaceOutputs {
    /// The run id.
    pub run: String,
    /// The tier.
    pub tier: Tier,
    /// The workspace (canonical host path).
    pub workspace: PathBuf,
    /// Where the workspace was inside.
    pub workspace_dest: String,
    /// The digest of the policy's surface stage.
    pub surface_policy: Digest,
    /// The named read set.
    pub read_set: Vec<String>,
    /// The variables set inside (names only, never values).
    pub env_names: Vec<String>,
    /// The network mode: `none` is the stage's own empty namespace (loopback only).
    pub network: String,
    /// Whom the run was, on the host and inside.
    pub user: UserMapping,
    /// The argv.
    pub argv: Vec<String>,
    /// The container's meta record (no cgroup accounting: see `cordon::container`).
    pub meta: Meta,
    /// Kept stdout (lossy UTF-8).
    pub stdout: String,
    /// Kept stderr (lossy UTF-8).
    pub stderr: String,
    /// Under `network "egress"`: every connection asked of the proxy, in order (at most
    /// [`EGRESS_RECORDED`]; `egress_unrecorded` counts the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressConnection>,
    /// Connections past [`EGRESS_RECORDED`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_unrecorded: u64,
}

/// The most egress connections a receipt lists.
pub const EGRESS_RECORDED: usize = 1000;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The user namespace's mapping of a surface run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UserMapping {
    /// The service user's uid, mapped as the container's uid 0 with no capabilities.
    pub host_uid: u32,
    /// Its gid.
    pub host_gid: u32,
    /// How many ids the namespace maps: one.
    pub mapped: u32,
}

impl StageOutputs for SurfaceOutputs {
    const STAGE: StageName = StageName::Surface;
}

macro_rules! inputs_of {
    ($($t:ty => $stage:ident),* $(,)?) => {
        $(impl StageInputs for $t {
            const STAGE: StageName = StageName::$stage;
        })*
    };
}

inputs_of! {
    FetchInputs => Fetch,
    MaterializeInputs => Materialize,
    PrebuildInputs => Prebuild,
    LaneInputs => Lane,
    QualifyInputs => Qualify,
    ReapInputs => Reap,
    SurfaceInputs => Surface,
}
