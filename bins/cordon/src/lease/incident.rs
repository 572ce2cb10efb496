//! No retry under the old authority (seed 001's incident checklist, step 7): a candidate whose
//! run ended in an incident is not run again under the same authority identity.
//!
//! It owns the incident records (`incidents/<key>.json` in the store, `key` the digest of the
//! authority identity and the candidate's engine tree; the first incident stands), the link
//! from a record to the receipt that reported it (`incidents/<key>.receipt`), and the refusal
//! ([`check`], which every container session runs before it takes a lease). What writes one:
//! the quarantine a lease of a named candidate causes — residue at its release, or a host
//! reset under it found at recovery ([`Manager`]). What lifts one: nothing. A changed image,
//! seccomp profile, mount, device policy or toolchain is a new authority identity, and under it
//! the candidate is a new attempt.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{LeaseError, Manager, Record, Supervisor, quarantine};
use crate::canonical::{Digest, domain_digest, to_canonical_json};
use crate::store::{self, Store};

pub use cordon_evidence::residue::Cause;

/// The store section of incident records.
pub const INCIDENTS: &str = "incidents";

/// One incident: what ran, under which authority, and what it left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Incident {
    /// The authority identity the run was under.
    pub authority: String,
    /// The engine tree the run ran.
    pub candidate: Digest,
    /// What kind of incident.
    pub cause: Cause,
    /// What was found, one line.
    pub why: String,
    /// The lease of the run.
    pub lease: String,
    /// The quarantine record the incident imposed (or found standing).
    pub quarantine: String,
    /// The process that found it (a session's supervisor, or a recovery).
    pub reporter: Supervisor,
    /// RFC 3339.
    pub at: String,
}

/// An incident with the receipt that reported it, when one was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The record's path.
    pub path: std::path::PathBuf,
    /// The record.
    pub incident: Incident,
    /// The reporting receipt (absent when its process ended before storing one).
    pub receipt: Option<Digest>,
}

/// The incidents this process recorded whose receipt is not linked yet, by store root: the
/// stage that runs the lease stores its receipt after the release that found the incident.
static PENDING: Mutex<Vec<(std::path::PathBuf, String)>> = Mutex::new(Vec::new());

/// The record key of `candidate` under `authority`.
///
/// # Errors
/// The pair cannot be encoded.
pub fn key(authority: &str, candidate: &Digest) -> Result<String, LeaseError> {
    Ok(domain_digest("cordon.incident", 1, &(authority, candidate))?.hex())
}

/// The incident of `candidate` under `authority`, if one stands.
///
/// # Errors
/// The record or its link cannot be read: an unreadable incident is never read as none.
pub fn find(
    store: &Store,
    authority: &str,
    candidate: &Digest,
) -> Result<Option<Found>, LeaseError> {
    let key = key(authority, candidate)?;
    let name = format!("{key}.json");
    let path = store.path(INCIDENTS, &name);
    let Some(bytes) = document(store, &name)? else {
        return Ok(None);
    };
    let incident: Incident = serde_json::from_slice(&bytes).map_err(|e| LeaseError::Record {
        path: path.clone(),
        why: e.to_string(),
    })?;
    let link = format!("{key}.receipt");
    let receipt = document(store, &link)?
        .map(|b| {
            parse_link(&b).ok_or_else(|| LeaseError::Record {
                path: store.path(INCIDENTS, &link),
                why: "not a receipt digest".into(),
            })
        })
        .transpose()?;
    Ok(Some(Found {
        path,
        incident,
        receipt,
    }))
}

/// Document `name` of the incidents section; `None` only when it does not exist.
fn document(store: &Store, name: &str) -> Result<Option<Vec<u8>>, LeaseError> {
    match store.read_document(INCIDENTS, name) {
        Ok(b) => Ok(Some(b)),
        Err(store::StoreError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn parse_link(bytes: &[u8]) -> Option<Digest> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Refuse a run of `candidate` under `authority` when an incident of it stands.
///
/// # Errors
/// [`LeaseError::Incident`] naming the record and its receipt, or the record cannot be read.
pub fn check(store: &Store, authority: &str, candidate: &Digest) -> Result<(), LeaseError> {
    match find(store, authority, candidate)? {
        Some(found) => Err(LeaseError::Incident(Box::new(found))),
        None => Ok(()),
    }
}

/// Link every incident this process recorded in `store` to `receipt`, the receipt that
/// reports it. A link that cannot be written stays pending for the next receipt.
///
/// # Errors
/// A link could not be written (the incident stands either way; only the name is missing).
pub fn link_pending(store: &Store, receipt: &Digest) -> Result<(), store::StoreError> {
    let mut pending = PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut failed = None;
    pending.retain(|(root, key)| {
        if root != store.root() || failed.is_some() {
            return true;
        }
        match store.put_document(
            INCIDENTS,
            &format!("{key}.receipt"),
            receipt.to_string().as_bytes(),
        ) {
            // An earlier receipt is linked: the first report stands.
            Ok(_) | Err(store::StoreError::Mismatch { .. }) => false,
            Err(e) => {
                failed = Some(e);
                true
            }
        }
    });
    failed.map_or(Ok(()), Err)
}

impl Manager {
    /// Record the incident of `record`'s run, when it names a candidate: the line its residue
    /// or recovery report carries.
    pub(super) fn incident(&self, cause: Cause, why: &str, record: &Record) -> Option<String> {
        let candidate = record.candidate?;
        Some(match self.record_incident(cause, why, record, candidate) {
            Ok(()) => format!(
                "candidate {candidate} is not run again under authority {}",
                record.authority
            ),
            Err(e) => format!("the incident of candidate {candidate} could not be recorded: {e}"),
        })
    }

    fn record_incident(
        &self,
        cause: Cause,
        why: &str,
        record: &Record,
        candidate: Digest,
    ) -> Result<(), LeaseError> {
        let incident = Incident {
            authority: record.authority.clone(),
            candidate,
            cause,
            why: why.to_owned(),
            lease: record.lease.clone(),
            quarantine: quarantine::id(&quarantine::Scope::Executor(self.setup.executor.clone()))?,
            reporter: Supervisor::this(self.setup.host()).map_err(|source| LeaseError::Io {
                op: "read",
                path: "/proc/self/stat".into(),
                source,
            })?,
            at: cordon_evidence::receipt::now_rfc3339(),
        };
        let key = key(&record.authority, &candidate)?;
        match self.store.put_document(
            INCIDENTS,
            &format!("{key}.json"),
            to_canonical_json(&incident)?.as_bytes(),
        ) {
            // This run's incident: the receipt this process stores next reports it.
            Ok(_) => PENDING
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((self.store.root().to_path_buf(), key)),
            // The first incident of this candidate under this authority stands (with its own
            // receipt).
            Err(store::StoreError::Mismatch { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}
