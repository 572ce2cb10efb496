//! The mechanism library: everything cordon does to a host, policy-agnostic.
//!
//! It owns the validator's private storage ([`store`]), the one safe tar reader ([`archive`])
//! and intake into the store ([`intake`]), the confined parser child that decodes candidate
//! bytes for the root process ([`confine`]), content-addressed trees ([`tree`]), OCI image layouts
//! ([`image`]), the OCI runtime driver ([`runtime`]), durable leases ([`lease`]), per-run
//! accounts ([`account`]), what a stage does on SIGINT, SIGTERM and SIGHUP ([`interrupt`]), what a binary says on stderr and how ([`voice`]), the receipt type ([`receipt`]) and the host components of the
//! authority identity ([`identity`]). It re-exports the leaf crate's canonical JSON, digests and
//! exit codes.
//!
//! It deliberately does not know the policy language: callers (the `cordon-stage` glue) hand it
//! plain values — limits, paths, ids — so the language can sit beside it rather than above or
//! below it, and everything hashed goes through the one encoder in [`canonical`].

pub mod account;
pub mod archive;
pub mod chain;
pub mod confine;
pub mod container;
pub mod gc;
pub mod host;
pub mod identity;
pub mod image;
pub mod intake;
pub mod interrupt;
pub mod keyset;
pub mod lease;
pub mod mountinfo;
pub mod run_cgroup;
pub mod runtime;
pub mod signing;
pub mod store;
pub mod tree;
pub mod voice;
pub mod walk;

pub use cordon_canon::{Digest, ExitCode, canonical, error_chain, exit, text};
/// The receipt, the stages' typed inputs and residue live in the evidence crate (what auditors
/// read); stages reach them from here.
pub use cordon_evidence::{inputs, receipt, residue};
