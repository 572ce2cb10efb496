//! The leaf of the crate map: what every other cordon crate hashes and returns with.
//!
//! It owns canonical JSON and domain-separated digests ([`canonical`]), the exit-code enum
//! ([`exit`]), the tree digest ([`tree_digest`]) and the escapes that keep candidate text from
//! driving a terminal ([`text`]). It knows nothing of policies, stores or kernels, so both the policy language and
//! the mechanism library can stand on it without standing on each other.

#![forbid(unsafe_code)]

pub mod canonical;
pub mod exit;
pub mod text;
pub mod tree_digest;

pub use canonical::Digest;
pub use exit::ExitCode;

/// An error and its causes on one line, for a receipt's reason.
#[must_use]
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}
