//! The policy's canonical form and digest.
//!
//! The canonical form is the validated [`Policy`] serialized through `cordon`'s canonical JSON
//! encoder: formatting, comments, node order and set-member order do not appear in it; every
//! semantic value does. The policy digest is its domain-separated digest.

use cordon_canon::canonical::{CanonicalError, Digest, domain_digest, to_canonical_json};

use crate::model::Policy;

/// The schema of the canonical policy form; bumped with any change to its shape.
pub const POLICY_SCHEMA: u32 = 1;

impl Policy {
    /// The canonical JSON text.
    ///
    /// # Errors
    /// Never for a validated policy (it holds no floats); the encoder is fallible in general.
    pub fn canonical_json(&self) -> Result<String, CanonicalError> {
        to_canonical_json(self)
    }

    /// The policy digest: `domain_digest("cordon.policy", POLICY_SCHEMA, canonical form)`.
    ///
    /// # Errors
    /// As [`Policy::canonical_json`].
    pub fn digest(&self) -> Result<Digest, CanonicalError> {
        domain_digest("cordon.policy", POLICY_SCHEMA, self)
    }

    /// The canonical form as a JSON value, for the diff and explain views.
    ///
    /// # Errors
    /// As [`Policy::canonical_json`].
    pub fn canonical_value(&self) -> Result<serde_json::Value, CanonicalError> {
        serde_json::to_value(self).map_err(|source| CanonicalError::Serialize { source })
    }
}
