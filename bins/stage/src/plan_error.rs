//! Why a stage cannot be planned: the one error of both planners ([`crate::bundle`],
//! [`crate::surface`]), reached through [`crate::bundle::PlanError`].

use cordon_policy_lang::{MountSource, StageKind};

/// Why a stage could not be planned: wiring or policy errors (exit 2), found before anything
/// touches the host — except a device or a control this host cannot give (exit 3).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PlanError {
    /// The stage kind is not declared.
    #[error("the policy declares no stage {kind}")]
    #[diagnostic(
        code(cordon::plan::no_stage),
        help(
            "name a policy that declares it: the evaluator's stages are in policy/evaluator.kdl, the agent surface's in policy/examples/surface.kdl (`cordon-policy explain FILE` lists a policy's stages)"
        )
    )]
    NoStage {
        /// The kind.
        kind: StageKind,
    },
    /// The stage kind (or one of its values) has no planner yet: refused, not half-planned.
    #[error("stage {kind} cannot be planned: {what} is not implemented by this build")]
    #[diagnostic(
        code(cordon::plan::unimplemented),
        help("a value cordon cannot enforce is refused rather than ignored")
    )]
    Unimplemented {
        /// The kind.
        kind: StageKind,
        /// What has no planner.
        what: &'static str,
    },
    /// The stage's image role has no pinned digest.
    #[error("image role {role:?} of stage {kind} is not pinned")]
    #[diagnostic(code(cordon::plan::unpinned))]
    Unpinned {
        /// The kind.
        kind: StageKind,
        /// The role.
        role: String,
    },
    /// The stage's seccomp profile does not exist (the validator checks this; a missing one is
    /// never replaced by a default).
    #[error("stage {kind} names seccomp profile {name:?}, which the policy does not define")]
    #[diagnostic(code(cordon::plan::no_seccomp))]
    NoSeccomp {
        /// The kind.
        kind: StageKind,
        /// The profile.
        name: String,
    },
    /// A mount role has no source.
    #[error("stage {kind} mounts {role} at {dest}, but no source was given for it")]
    #[diagnostic(code(cordon::plan::no_source))]
    NoSource {
        /// The kind.
        kind: StageKind,
        /// The role.
        role: MountSource,
        /// Where it mounts.
        dest: String,
    },
    /// A GPU device the policy names is not on this host.
    #[error("stage {kind} allows GPU device {path}, which this host does not have")]
    #[diagnostic(
        code(cordon::plan::no_device),
        help("the lane runs only on a host with the devices its policy names")
    )]
    NoDevice {
        /// The kind.
        kind: StageKind,
        /// The device path.
        path: String,
    },
    /// A lane GPU's container edits from the host's CDI spec cannot be applied as they are
    /// (the host's spec, not the policy: a no-decision).
    #[error("stage {kind} cannot apply the lane's CDI edits: {why}")]
    #[diagnostic(
        code(cordon::plan::cdi),
        help(
            "regenerate the spec (`nvidia-ctk cdi generate --format=json --device-name-strategy=uuid`); cordon applies CDI edits only as read-only binds, character devices and reviewed hooks"
        )
    )]
    Cdi {
        /// The kind.
        kind: StageKind,
        /// What cannot be applied.
        why: String,
    },
    /// Two mount sources overlap, or two destinations do.
    #[error("mounts are not pairwise disjoint: {a} and {b}")]
    #[diagnostic(code(cordon::plan::overlap))]
    Overlap {
        /// One path.
        a: String,
        /// The other.
        b: String,
    },
    /// A mount would expose a protected path.
    #[error("mount source {source_path} would expose the protected path {protected} ({why})")]
    #[diagnostic(
        code(cordon::plan::protected),
        help(
            "only published trees, publications and the lease's staging directory may be mounted"
        )
    )]
    Protected {
        /// The source.
        source_path: String,
        /// What it would expose.
        protected: String,
        /// Why that path is protected (a never-mount path's reviewed reason).
        why: String,
    },
    /// A control the policy asks for cannot be enforced in the mode this run would use: it
    /// is refused, never applied as a no-op.
    #[error("stage {kind} asks for {what}, which {mode} cannot enforce on this host")]
    #[diagnostic(
        code(cordon::plan::unenforceable),
        help("drop the value from the stage, or run where the control can be applied")
    )]
    Unenforceable {
        /// The kind.
        kind: StageKind,
        /// The value.
        what: String,
        /// The mode.
        mode: &'static str,
    },
    /// A temporary-directory prefix is longer than the policy allows: a tool appending a
    /// socket name to it would overflow `sockaddr_un.sun_path`.
    #[error("temporary-directory prefix {prefix} is {bytes} bytes, above the policy's {max}")]
    #[diagnostic(
        code(cordon::plan::temp_prefix),
        help("use a shorter workspace root with compact path segments")
    )]
    TempPrefix {
        /// The prefix.
        prefix: String,
        /// Its length.
        bytes: usize,
        /// The policy's bound.
        max: u64,
    },
    /// A value has no OCI form.
    #[error("cannot build the bundle: {why}")]
    #[diagnostic(code(cordon::plan::invalid))]
    Invalid {
        /// What is wrong.
        why: String,
    },
}

pub(crate) fn invalid(e: impl std::fmt::Display) -> PlanError {
    PlanError::Invalid { why: e.to_string() }
}

impl cordon::exit::ExitClass for PlanError {
    /// A value this host cannot honour (a device it lacks, a control its mode cannot apply) is
    /// a no-decision (3); every other refusal is the policy's (2).
    fn exit_class(&self) -> cordon::ExitCode {
        match self {
            Self::NoDevice { .. } | Self::Cdi { .. } | Self::Unenforceable { .. } => {
                cordon::ExitCode::NoDecision
            }
            Self::NoStage { .. }
            | Self::Unimplemented { .. }
            | Self::Unpinned { .. }
            | Self::NoSeccomp { .. }
            | Self::NoSource { .. }
            | Self::Overlap { .. }
            | Self::Protected { .. }
            | Self::TempPrefix { .. }
            | Self::Invalid { .. } => cordon::ExitCode::Usage,
        }
    }
}
