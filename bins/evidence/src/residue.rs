//! What an executor left behind, as the quiescence check names it: one typed item per thing,
//! so a reader (`cordon-reap` telling a live lease's own resources from residue) decides on
//! its fields, never on the wording of a message. Its display is the line a receipt records.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One thing of an executor's that exists when nothing should.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Leftover {
    /// A lease record in the store.
    LeaseRecord {
        /// The lease.
        lease: String,
        /// The record's path.
        path: String,
    },
    /// A container labelled with the executor and the store.
    Container {
        /// Its id (`cordon-<lease>`, or a sidecar's `cordon-<lease>-…`).
        id: String,
    },
    /// A run directory under the run root.
    RunDirectory {
        /// Its path (its name is the lease).
        path: String,
        /// Whether its owner could be read (an unreadable one cannot be attributed).
        attributed: bool,
    },
    /// A per-run account in the policy's range.
    Account {
        /// Its name.
        name: String,
        /// Its uid.
        uid: u32,
        /// Whether it carries this executor's owner tag.
        attributed: bool,
    },
    /// A cgroup under the executor's parent.
    Cgroup {
        /// Its path (its last component is the lease).
        path: String,
    },
    /// A mount under the run root or the store.
    Mount {
        /// Its mount point.
        path: String,
    },
    /// A rootless run (the surface's) that could not be released or is past its deadline.
    Run {
        /// The run (and its container's) id.
        run: String,
        /// What remains or could not be established.
        why: String,
    },
}

/// What `cordon-reap` established (its receipt's outputs, whatever its outcome).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReapOutputs {
    /// Nothing of the executor exists: no residue and no live lease.
    pub quiescent: bool,
    /// What this run released (absent when the run could not be completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<Vec<String>>,
    /// Live leases, not residue (absent when the run could not be completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<Vec<String>>,
    /// What remains: residue, one line each.
    pub remaining: Vec<String>,
    /// The sessions this check was asked to prove gone (the reference session's gate names a
    /// qualification's reads); none for an operator's check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<crate::verdict::Gone>,
    /// The quarantines in force, by record id: each is an alarm, and no lease is taken under
    /// one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub quarantined: std::collections::BTreeMap<String, Quarantine>,
    /// The quarantine this run lifted (`--clear`), after proving quiescence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared: Option<Quarantine>,
    /// What a monitor counts (`--status` only; seed 001's operator requirements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

/// The incident counts a monitor watches (`cordon-reap --status`): stale leases now, and over
/// the store's whole history the runs killed for memory or time, host resets and device drain
/// failures.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Counters {
    /// Lease records no live supervisor holds within its deadline: past it, or (seen as the
    /// executor's sole manager) every record there is.
    pub stale_leases: u64,
    /// Stored run receipts (prebuild, lane, audit, reference, surface) ended by the OOM killer.
    pub oom_kills: u64,
    /// Stored run receipts ended by a deadline (the run's or a phase's).
    pub deadline_kills: u64,
    /// Host resets: host-reset quarantines in force, and those lifted (`outputs.cleared`).
    pub host_resets: u64,
    /// Device drain failures: drain quarantines in force, and those lifted.
    pub drain_failures: u64,
}

/// What a quarantine holds back from new work (seed 001's incident checklist, step 1).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(tag = "scope", content = "name", rename_all = "kebab-case")]
pub enum Scope {
    /// The whole host: every lease of every executor.
    Host,
    /// One executor (its leases, accounts, cgroups and runtime state share a fate).
    Executor(String),
    /// One device node, by path.
    Device(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host => write!(f, "the host"),
            Self::Executor(e) => write!(f, "executor {e}"),
            Self::Device(d) => write!(f, "device {d}"),
        }
    }
}

/// Why a quarantine was imposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// A release could not prove what its lease held gone.
    Residue,
    /// Leases of an earlier boot were found: the host reset under them.
    HostReset,
    /// A run broke out of, or changed, a control it was held by.
    Containment,
    /// A device did not drain to idle (a later drain that holds lifts it: the read whose
    /// signed pre receipt carries that drain).
    Drain,
    /// A GPU's configuration is not its pin (changed under or between reads).
    Drift,
    /// An operator stopped new work (`cordon-reap --quarantine`).
    Operator,
}

impl Cause {
    /// The cause as written in records and receipts.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Residue => "residue",
            Self::HostReset => "host-reset",
            Self::Containment => "containment",
            Self::Drain => "drain",
            Self::Drift => "drift",
            Self::Operator => "operator",
        }
    }
}

/// A persistent quarantine record (`quarantine/<id>.json` in the store): while one matches,
/// every lease-taking stage refuses; only `cordon-reap --clear` lifts it, after a strict
/// quiescence proof, with a signed receipt that names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quarantine {
    /// What it holds back.
    pub scope: Scope,
    /// Why.
    pub cause: Cause,
    /// What happened, for people (escaped before display).
    pub why: String,
    /// The lease the incident happened under, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// When it was imposed (RFC 3339 UTC).
    pub at: String,
}

impl crate::receipt::StageOutputs for ReapOutputs {
    const STAGE: crate::receipt::StageName = crate::receipt::StageName::Reap;
}

impl Leftover {
    /// Whether this item is one of lease `lease`'s own resources (its id in the container id or
    /// in a path, or its account `account`).
    #[must_use]
    pub fn belongs_to(&self, lease: &str, account: Option<&str>) -> bool {
        match self {
            Self::LeaseRecord { lease: l, .. } => l == lease,
            Self::Container { id } => id.contains(lease),
            Self::RunDirectory { path, .. } | Self::Cgroup { path } | Self::Mount { path } => {
                path.contains(lease)
            }
            Self::Account { name, .. } => account == Some(name.as_str()),
            Self::Run { run, .. } => run == lease,
        }
    }
}

impl fmt::Display for Leftover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeaseRecord { path, .. } => write!(f, "lease record {path}"),
            Self::Container { id } => write!(f, "container {id}"),
            Self::RunDirectory {
                path,
                attributed: true,
            } => write!(f, "run directory {path}"),
            Self::RunDirectory {
                path,
                attributed: false,
            } => write!(f, "run directory {path} (no readable owner)"),
            Self::Account {
                name,
                uid,
                attributed: true,
            } => write!(f, "account {name} (uid {uid})"),
            Self::Account {
                name,
                uid,
                attributed: false,
            } => write!(f, "account {name} (uid {uid}, no owner tag)"),
            Self::Cgroup { path } => write!(f, "cgroup {path}"),
            Self::Mount { path } => write!(f, "mount {path}"),
            Self::Run { run, why } => write!(f, "run {run}: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_belongs_to_a_lease_by_its_fields_and_reads_as_before() {
        let c = Leftover::Container {
            id: "cordon-l1-s".into(),
        };
        assert!(c.belongs_to("l1", None) && !c.belongs_to("l2", None));
        let a = Leftover::Account {
            name: "cordon-run-3".into(),
            uid: 3,
            attributed: true,
        };
        assert!(a.belongs_to("l1", Some("cordon-run-3")));
        // An account is its lease's only by its name, never by a lease id inside it.
        assert!(!a.belongs_to("run", None));
        assert_eq!(a.to_string(), "account cordon-run-3 (uid 3)");
        let d = Leftover::RunDirectory {
            path: "/run/cordon/l1".into(),
            attributed: false,
        };
        assert_eq!(
            d.to_string(),
            "run directory /run/cordon/l1 (no readable owner)"
        );
        assert!(d.belongs_to("l1", None));
    }
}
