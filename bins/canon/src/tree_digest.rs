//! The tree digest: what names an engine tree or a native publication, over the materializer
//! version and the sorted `(path, mode, size, sha256)` list of its files.
//!
//! It lives in the leaf crate because two sides compute it: the store, which publishes and
//! verifies trees (`cordon::tree`), and `cordon-worker`, which recomputes the digest of the tree
//! it sees from inside the pristine reference session, so the host can compare it with the
//! policy's pin. It reads no file: callers list the entries.

use serde::{Deserialize, Serialize};

use crate::canonical::{CanonicalError, Digest, domain_digest};

/// The schema of tree records and of the tree digest's payload.
pub const TREE_SCHEMA: u32 = 1;

/// One file of a tree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Relative, clean, UTF-8 path.
    pub path: String,
    /// 0o444 or 0o555.
    pub mode: u32,
    /// Bytes.
    pub size: u64,
    /// sha256 of the contents: also the content object's name.
    pub sha256: Digest,
}

impl Entry {
    /// Whether the entry is executable (mode 0555).
    #[must_use]
    pub fn executable(&self) -> bool {
        self.mode == 0o555
    }
}

/// The materializer version bound into every tree digest.
pub const MATERIALIZER: &str = concat!("cordon-materialize ", env!("CARGO_PKG_VERSION"));

/// Where a kind of content-addressed tree lives in the store, and the digest domain that names
/// it: engine trees (`trees`, `cordon.tree`) and native publications (`publications`,
/// `cordon.publication`) share one format, one publication and one verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// The store section.
    pub dir: &'static str,
    /// The digest domain.
    pub domain: &'static str,
}

/// Materialized engine trees.
pub const TREES: Section = Section {
    dir: "trees",
    domain: "cordon.tree",
};

/// Sealed native publications.
pub const PUBLICATIONS: Section = Section {
    dir: "publications",
    domain: "cordon.publication",
};

/// The tree digest of a sorted entry list.
///
/// # Errors
/// As [`domain_digest`].
pub fn digest(entries: &[Entry]) -> Result<Digest, CanonicalError> {
    digest_in(TREES, entries)
}

/// The digest of a sorted entry list in a section's domain.
///
/// # Errors
/// As [`domain_digest`].
pub fn digest_in(section: Section, entries: &[Entry]) -> Result<Digest, CanonicalError> {
    #[derive(Serialize)]
    struct Payload<'a> {
        materializer: &'a str,
        entries: &'a [Entry],
    }
    domain_digest(
        section.domain,
        TREE_SCHEMA,
        &Payload {
            materializer: MATERIALIZER,
            entries,
        },
    )
}
