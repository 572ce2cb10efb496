//! Quarantine (seed 001's incident checklist, steps 1 and 5): a persistent record, per host,
//! executor or device, that stops new work there until someone proves the place quiescent
//! and lifts it.
//!
//! It owns the records (`quarantine/<id>.json` in the store, one per scope: the first incident
//! stands until cleared), which leases they stop ([`check`]: every lease a [`Manager`] begins,
//! and the devices a session names), and lifting one. What imposes
//! one: a release that leaves residue, recovery that finds leases of an earlier boot (a host
//! reset), a container whose controls are not the planned ones (the lane's posture check), a lane GPU that did not drain or whose configuration left its pin (the lane's device guard). What lifts one is `cordon-reap --clear`, after a strict quiescence check, with a
//! signed receipt — and, for a GPU that did not drain (a device scope by UUID, cause
//! `drain`), a later read's drain that holds, which its signed pre receipt carries.

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use cordon_evidence::residue::{Cause, Quarantine, Scope};

use super::{LeaseError, Manager, io};
use crate::canonical::{domain_digest, to_canonical_json};
use crate::store::{self, Store};

/// The store section of quarantine records.
pub const QUARANTINE: &str = "quarantine";

/// The record id of a quarantine on `scope`: one record per scope.
///
/// # Errors
/// The scope cannot be encoded.
pub fn id(scope: &Scope) -> Result<String, LeaseError> {
    Ok(domain_digest("cordon.quarantine", 1, scope)?.hex()[..16].to_owned())
}

/// Impose `q` (published as every store document is, never replacing). A scope already
/// quarantined keeps its first record: the first incident stands until cleared. Its id.
///
/// # Errors
/// The record could not be written.
pub fn impose(store: &Store, q: &Quarantine) -> Result<String, LeaseError> {
    let id = id(&q.scope)?;
    match store.put_document(
        QUARANTINE,
        &format!("{id}.json"),
        to_canonical_json(q)?.as_bytes(),
    ) {
        // Another incident's record holds the name: it stands.
        Ok(_) | Err(store::StoreError::Mismatch { .. }) => Ok(id),
        Err(e) => Err(e.into()),
    }
}

/// Every quarantine in force, by id. A record that is not one is an error: an unreadable
/// quarantine is never read as none.
///
/// # Errors
/// The section cannot be listed or a record cannot be read.
pub fn in_force(store: &Store) -> Result<BTreeMap<String, Quarantine>, LeaseError> {
    let dir = store.root().join(QUARANTINE);
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).map_err(io("list", &dir))? {
        let path = entry.map_err(io("list", &dir))?.path();
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            return Err(record(path, "not a quarantine record's name".into()));
        };
        let bytes = store.read_document(QUARANTINE, &format!("{id}.json"))?;
        let q: Quarantine =
            serde_json::from_slice(&bytes).map_err(|e| record(path.clone(), e.to_string()))?;
        out.insert(id.to_owned(), q);
    }
    Ok(out)
}

fn record(path: PathBuf, why: String) -> LeaseError {
    LeaseError::Record { path, why }
}

/// The first quarantine in force that stops a lease of `executor` using `devices`.
///
/// # Errors
/// [`LeaseError::Quarantined`] naming it, or the records could not be read.
pub fn check(store: &Store, executor: &str, devices: &[String]) -> Result<(), LeaseError> {
    let stops = |scope: &Scope| match scope {
        Scope::Host => true,
        Scope::Executor(e) => e == executor,
        Scope::Device(d) => devices.contains(d),
    };
    match in_force(store)?.into_iter().find(|(_, q)| stops(&q.scope)) {
        Some((id, q)) => Err(LeaseError::Quarantined {
            path: store.path(QUARANTINE, &format!("{id}.json")),
            id,
            quarantine: Box::new(q),
        }),
        None => Ok(()),
    }
}

/// Lift quarantine `id`: its record is removed (and the removal made durable). The record it
/// was, for the receipt that lifts it.
///
/// # Errors
/// No such record, or it could not be removed.
pub fn lift(store: &Store, id: &str) -> Result<Quarantine, LeaseError> {
    let mut all = in_force(store)?;
    let q = all
        .remove(id)
        .ok_or_else(|| LeaseError::NoQuarantine { id: id.to_owned() })?;
    let path = store.path(QUARANTINE, &format!("{id}.json"));
    std::fs::remove_file(&path).map_err(io("remove", &path))?;
    store::fsync_dir(&store.root().join(QUARANTINE))?;
    Ok(q)
}

/// Impose a quarantine on `executor` for `cause` (found under `lease`, when one), and say so
/// in the line the error or receipt that caused it carries; a quarantine that cannot be
/// written is said too.
#[must_use]
pub fn impose_on_executor(
    store: &Store,
    executor: &str,
    cause: Cause,
    why: &str,
    lease: Option<&str>,
) -> String {
    let q = Quarantine {
        scope: Scope::Executor(executor.to_owned()),
        cause,
        why: why.to_owned(),
        lease: lease.map(str::to_owned),
        at: cordon_evidence::receipt::now_rfc3339(),
    };
    match impose(store, &q) {
        Ok(id) => format!(
            "executor {executor} quarantined ({}, record {id})",
            cause.as_str()
        ),
        Err(e) => format!("executor {executor} could not be quarantined: {e}"),
    }
}

impl Manager {
    /// [`impose_on_executor`] on this manager's executor.
    pub(super) fn quarantine(&self, cause: Cause, why: &str, lease: Option<&str>) -> String {
        impose_on_executor(&self.store, &self.setup.executor, cause, why, lease)
    }
}
