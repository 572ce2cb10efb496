//! The library every cordon stage links.
//!
//! It owns the contracts that all stages share (brief §5): the exit-code enum, canonical JSON
//! and domain-separated digests, the receipt type, and the assembly of the authority identity.
//! Later stages add the store, the OCI bundle and runtime driver, leases and accounts here.
//!
//! It deliberately does not know the policy language: `cordon-policy` depends on this crate and
//! hands it plain values (a policy digest, image digests, a runtime path), so that everything
//! hashed in cordon goes through the one encoder in [`canonical`].

pub mod canonical;
pub mod exit;
pub mod identity;
pub mod receipt;

pub use canonical::Digest;
pub use exit::ExitCode;
