//! The library every cordon stage links.
//!
//! It owns the contracts that all stages share (brief §5): the exit-code enum, canonical JSON
//! and domain-separated digests, the receipt type, and the assembly of the authority identity.
//! It also owns the validator's private storage ([`store`]), the one safe tar reader
//! ([`archive`]) and intake into the store ([`intake`]), and the receipt plumbing every stage
//! binary shares ([`stage`]). Later stages add the OCI bundle and runtime driver, leases and
//! accounts here.
//!
//! It deliberately does not know the policy language: `cordon-policy` depends on this crate and
//! hands it plain values (a policy digest, image digests, a runtime path), so that everything
//! hashed in cordon goes through the one encoder in [`canonical`].

pub mod account;
pub mod archive;
pub mod bundle;
pub mod canonical;
pub mod exit;
pub mod identity;
pub mod image;
pub mod intake;
pub mod lease;
pub mod receipt;
pub mod runtime;
pub mod stage;
pub mod store;
pub mod tree;

pub use canonical::Digest;
pub use exit::ExitCode;
