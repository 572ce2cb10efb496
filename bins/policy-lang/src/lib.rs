//! The cordon policy language.
//!
//! One KDL v2 file describes one evaluator host's authority: where its store is, which OCI
//! runtime it trusts, how intake and materialization are bounded, which images and seccomp
//! profiles exist, and what each stage (prebuild, lane, reference, surface) may do. This crate
//! parses such a file into a validated [`Policy`] (reporting every problem at once, each on its
//! token), gives it one canonical form and digest, and compares two policies semantically for
//! reviewers. `policy/README.md` is the language reference.
//!
//! It is pure: no I/O (the caller hands it the text), no kernel, no runtime, and no dependency
//! on the mechanism library — only on the leaf `cordon-canon` for digests. The model is typed:
//! every choice of the language (stage kind, network, root, ipc, user, mount source and mode,
//! seccomp action and operator, architecture, runtime) is an enum, so the planner in
//! `cordon-stage` matches exhaustively and a new value is a compile error there, never a silent
//! fall-through. The authority identity that combines the policy digest with host facts is
//! assembled by `cordon-stage`; the `cordon-policy` tool is its reviewer front end.

#![forbid(unsafe_code)]

mod build;
mod canonical;
pub mod diag;
pub mod diff;
pub mod effect;
pub mod kit;
pub mod locate;
mod model;
pub mod syscalls;
pub mod units;

use miette::SourceSpan;

pub use build::{SURFACE_SET_ENV, domain_ok};
pub use canonical::POLICY_SCHEMA;
pub use diag::{CODES, KdlError, Language, PolicyError, Problem};
pub use model::cpu_list;
pub use model::{
    Accounts, Allowance, Arch, ArchiveLimits, ArgCondition, ArgOp, Audit, BuildTier, Child,
    ComputeMode, DeviceConfig, DeviceGuard, DrainRule, Egress, Envelope, Frame, Host, IdRange, Ipc,
    Keyword, Mount, MountMode, MountSource, Network, Output, ParserLimits, PhysicalLane, Policy,
    PublicationLimits, Quality, Reasoned, RootMode, Runtime, RuntimeKind, SeccompAction,
    SeccompProfile, Speed, Stage, StageKind, Staging, Surface, Sys, SyscallRule, Tmp,
    TransportRules, TreeRules, User, WriteScope,
};

/// Parse and validate a policy. `name` labels diagnostics (normally the file's path).
///
/// # Errors
/// A [`PolicyError`] holding every problem found, KDL syntax errors included.
pub fn parse(name: &str, text: &str) -> Result<Policy, PolicyError> {
    kit::decode(&diag::POLICY, name, text, |cx, doc| {
        build::policy(cx, doc, SourceSpan::from((0, 0)))
    })
}
