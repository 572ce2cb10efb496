//! Private intake into the store: an archive stream becomes content objects and an intake
//! record, or nothing at all.
//!
//! Two records, keyed by what they describe: `intake/<content>.json` holds only the content (the
//! sorted file list, the same whichever archive carried it), and `archives/<sha256>.json` the
//! one archive-specific fact, which content that archive carried. So any later archive of
//! admitted content — repacked, recompressed, reordered, by anyone — is admitted too, and writes
//! the same content record byte for byte.
//!
//! This module owns the order of intake: scan the whole archive into a private scratch
//! directory (every shape rule checked while streaming, [`crate::archive`]), compare the archive
//! bytes with the committed sha256, and only then publish the content objects and the record.
//! A rejection at any point drops the scratch directory, so the store is exactly as it was.
//!
//! It does not own transport (the `cordon-fetch` package opens the source) or what a delta
//! means (materialization reads the record).

use std::io::{self, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::archive::{self, ArchiveError, ArchiveLimits, Member, Rejection, Sink};
use crate::canonical::{CanonicalError, Digest, domain_digest, to_canonical_json};
use crate::store::{Scratch, Staged, Store, StoreError};

mod confined;

pub use confined::{ARCHIVE_CHILD, archive_child, ingest_confined};

/// The schema of intake and archive records.
pub const INTAKE_SCHEMA: u32 = 2;

/// The schema of the content-digest payload (unchanged since the records were split, so
/// content digests did not move).
pub const CONTENT_DIGEST_SCHEMA: u32 = 1;

/// Why intake produced no record.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum IntakeError {
    /// The archive or its hash is refused: the candidate's fault (exit 1).
    #[error("intake rejected: {0}")]
    #[diagnostic(code(cordon::intake::rejected))]
    Rejected(Rejection),
    /// The source could not be read to the end.
    #[error("cannot read the source")]
    #[diagnostic(code(cordon::intake::source))]
    Source {
        /// The reader's error.
        #[source]
        source: io::Error,
    },
    /// The parser child could not be started, could not confine itself, or was killed from
    /// outside: not the candidate's fault (exit 3).
    #[error("the confined parser failed: {0}")]
    #[diagnostic(code(cordon::intake::child))]
    Child(String),
    /// The store failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// A record could not be encoded.
    #[error("cannot encode the intake record")]
    #[diagnostic(code(cordon::intake::encode))]
    Encode(#[from] CanonicalError),
    /// A stored record does not hash to its name or does not parse.
    #[error("intake record {name} is corrupt: {why}")]
    #[diagnostic(
        code(cordon::intake::corrupt_record),
        help("the store has been tampered with; quarantine it")
    )]
    CorruptRecord {
        /// The record's name.
        name: String,
        /// What is wrong.
        why: String,
    },
}

/// The intake record: the canonical file list of admitted content, whatever archive carried it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeRecord {
    /// [`INTAKE_SCHEMA`].
    pub schema: u32,
    /// Domain-separated digest of the sorted file list ([`content_digest`]).
    pub content_digest: Digest,
    /// The files, sorted by path.
    pub files: Vec<Member>,
    /// Sum of the file sizes.
    pub bytes: u64,
}

/// The archive record: which content one admitted archive carried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveRecord {
    /// [`INTAKE_SCHEMA`].
    pub schema: u32,
    /// sha256 of the archive bytes (the committed digest).
    pub archive_sha256: Digest,
    /// The content it carried.
    pub content_digest: Digest,
}

/// What one admission established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The archive and what it carried.
    pub archive: ArchiveRecord,
    /// The content.
    pub record: IntakeRecord,
}

/// The digest of a sorted file list under domain `cordon.intake`: what the candidate's content
/// *is*, independent of how it was archived or compressed.
///
/// # Errors
/// As [`domain_digest`].
pub fn content_digest(files: &[Member]) -> Result<Digest, CanonicalError> {
    domain_digest("cordon.intake", CONTENT_DIGEST_SCHEMA, files)
}

/// A sink that writes each file into the scratch directory and remembers where.
struct ScratchSink<'a> {
    scratch: &'a mut Scratch,
    staged: Vec<PathBuf>,
}

impl Sink for ScratchSink<'_> {
    fn file(&mut self, _path: &str, _exec: bool, _size: u64) -> io::Result<Box<dyn Write + '_>> {
        let (path, file) = self.scratch.create_file().map_err(io::Error::other)?;
        self.staged.push(path);
        Ok(Box::new(file))
    }

    fn dir(&mut self, _path: &str) -> io::Result<()> {
        Ok(())
    }
}

/// Admit an archive: scan it, check its sha256 against `committed`, publish its files as
/// content objects, its content record under `intake/<content hex>.json` and its archive record
/// under `archives/<sha256 hex>.json` (content first: an archive record never names content the
/// store does not hold).
///
/// # Errors
/// [`IntakeError::Rejected`] for the candidate's faults (the store is unchanged);
/// the other variants for infrastructure failures.
pub fn ingest(
    store: &Store,
    source: impl io::Read,
    committed: &Digest,
    limits: &ArchiveLimits,
) -> Result<Admitted, IntakeError> {
    let mut scratch = store.scratch()?;
    let scratch_path = scratch.path().to_path_buf();
    let mut sink = ScratchSink {
        scratch: &mut scratch,
        staged: Vec::new(),
    };
    let scanned = match archive::scan(source, limits, &mut sink) {
        Ok(s) => s,
        Err(ArchiveError::Rejected(r)) => return Err(IntakeError::Rejected(r)),
        Err(ArchiveError::Source { source }) => return Err(IntakeError::Source { source }),
        Err(ArchiveError::Sink { source, .. }) => {
            return Err(IntakeError::Store(StoreError::Io {
                op: "stage member",
                path: scratch_path,
                source,
            }));
        }
    };
    let staged = sink.staged;
    check_committed(&scanned.archive_sha256, committed)?;
    publish(store, scanned.files, staged, scanned.archive_sha256)
}

/// The candidate's archive is the one committed to, or a rejection.
fn check_committed(actual: &Digest, committed: &Digest) -> Result<(), IntakeError> {
    if actual == committed {
        return Ok(());
    }
    Err(IntakeError::Rejected(Rejection {
        code: "intake.hash-mismatch",
        path: None,
        message: format!("the archive's sha256 is {actual}, the committed digest is {committed}"),
    }))
}

/// Publish admitted files (each staged at the matching path) and both records.
fn publish(
    store: &Store,
    mut files: Vec<Member>,
    staged: Vec<PathBuf>,
    archive_sha256: Digest,
) -> Result<Admitted, IntakeError> {
    let batch: Vec<Staged> = files
        .iter()
        .zip(staged)
        .map(|(m, path)| Staged {
            path,
            sha256: m.sha256,
            executable: m.executable,
        })
        .collect();
    store.publish_objects(&batch)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let record = IntakeRecord {
        schema: INTAKE_SCHEMA,
        content_digest: content_digest(&files)?,
        bytes: files.iter().map(|f| f.size).sum(),
        files,
    };
    let text = to_canonical_json(&record)?;
    store.put_document(
        "intake",
        &format!("{}.json", record.content_digest.hex()),
        text.as_bytes(),
    )?;
    let archive = ArchiveRecord {
        schema: INTAKE_SCHEMA,
        archive_sha256,
        content_digest: record.content_digest,
    };
    let text = to_canonical_json(&archive)?;
    store.put_document(
        "archives",
        &format!("{}.json", archive.archive_sha256.hex()),
        text.as_bytes(),
    )?;
    Ok(Admitted { archive, record })
}

/// Read an intake record back by its content digest, checking that it parses and that its file
/// list hashes to the name it is stored under.
///
/// # Errors
/// Missing, unreadable or corrupt.
pub fn load(store: &Store, content: &Digest) -> Result<IntakeRecord, IntakeError> {
    let name = format!("{}.json", content.hex());
    let bytes = store.read_document("intake", &name)?;
    let corrupt = |why: String| IntakeError::CorruptRecord {
        name: name.clone(),
        why,
    };
    let record: IntakeRecord =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if record.schema != INTAKE_SCHEMA {
        return Err(corrupt(format!("schema {}", record.schema)));
    }
    if &content_digest(&record.files)? != content || &record.content_digest != content {
        return Err(corrupt(
            "its file list does not hash to its name".to_owned(),
        ));
    }
    Ok(record)
}
