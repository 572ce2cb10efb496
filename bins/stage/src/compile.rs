//! The sealed-direct-artifact tier's compile request (seed 001 §3's closed compile ABI): what
//! the host asks a candidate factory to compile, derived from nothing but the tree (its
//! recorded factory, which its digest covers through the generated shim) and the validator's
//! target. Prebuild gives it to the patcher; its digest is the publication control record's
//! `request`, so every stage that reopens a publication recomputes and compares it.
//!
//! It owns the request's schema and canonical bytes. The rest of the ABI (the result layout,
//! the profile and its confined decoding) is `cordon-prebuild`'s.

use cordon::canonical::{Digest, to_canonical_json};
use cordon::tree::TreeRecord;
use cordon_policy_lang::BuildTier;
use serde::{Deserialize, Serialize};

/// The compile request's schema.
pub const REQUEST_SCHEMA: &str = "cordon.compile-request/1";

/// One input of the compiled callable: its name, element type and shape (`-1`: any extent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// An identifier.
    pub name: String,
    /// An element type.
    pub dtype: String,
    /// Its extents, each `-1` or more.
    pub shape: Vec<i64>,
}

/// What the artifact is compiled for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The instruction set.
    pub arch: String,
    /// The device class the lane runs it on.
    pub device: String,
}

/// The compile request ([`REQUEST_SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Request {
    /// [`REQUEST_SCHEMA`].
    pub schema: &'static str,
    /// The factory, `module:callable`, as the tree holds it.
    pub factory: String,
    /// What it compiles for.
    pub target: Target,
    /// The callable's inputs.
    pub inputs: Vec<Input>,
}

/// A request with its canonical bytes and their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The request.
    pub request: Request,
    /// Its canonical JSON.
    pub bytes: Vec<u8>,
    /// Their sha256.
    pub digest: Digest,
}

impl Request {
    /// The request for `factory`: the CPU lanes' target (the only lanes this build runs a
    /// sealed artifact on) and the example attention target's one input, a query of token ids.
    #[must_use]
    pub fn for_factory(factory: &str) -> Self {
        Self {
            schema: REQUEST_SCHEMA,
            factory: factory.to_owned(),
            target: Target {
                arch: "x86_64".into(),
                device: "cpu".into(),
            },
            inputs: vec![Input {
                name: "query".into(),
                dtype: "int64".into(),
                shape: vec![-1],
            }],
        }
    }

    /// It with its canonical bytes and their digest.
    ///
    /// # Errors
    /// It cannot be encoded.
    pub fn encode(self) -> Result<Encoded, String> {
        let text = to_canonical_json(&self).map_err(|e| format!("the compile request: {e}"))?;
        let digest = Digest::of_bytes(text.as_bytes());
        Ok(Encoded {
            request: self,
            bytes: text.into_bytes(),
            digest,
        })
    }
}

/// The request a build of `tree` by `tier`'s patcher is given: the tree's recorded factory for
/// the sealed-direct-artifact tier, none for any other.
///
/// # Errors
/// A sealed-direct-artifact build of a tree that records no factory (an incumbent's, or a
/// delta of another tier), or a request that cannot be encoded.
pub fn request_for(tree: &TreeRecord, tier: BuildTier) -> Result<Option<Encoded>, String> {
    match tier {
        BuildTier::SealedDirectArtifact => {
            let factory = tree
                .origin
                .get("factory")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| {
                    format!(
                        "tree {} records no factory: the sealed-direct-artifact tier compiles the \
                         one a delta declares",
                        tree.digest
                    )
                })?;
            Request::for_factory(factory).encode().map(Some)
        }
        BuildTier::NativeRebuild | BuildTier::NativeSources | BuildTier::DependencyPatch => {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_canonical_json_of_its_schema() {
        let e = Request::for_factory("m.n:f").encode().unwrap();
        let text = String::from_utf8(e.bytes.clone()).unwrap();
        assert!(
            text.starts_with("{\"factory\":\"m.n:f\",\"inputs\":["),
            "{text}"
        );
        assert!(
            text.contains("\"schema\":\"cordon.compile-request/1\""),
            "{text}"
        );
        assert_eq!(e.digest, Digest::of_bytes(&e.bytes));
    }
}
