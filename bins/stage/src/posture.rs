//! The container's posture read from outside: what the kernel says of the created init, before
//! any of the workload's code has run, compared with the plan. Every container stage's
//! [`Session`](crate::session::Session) reads it once the runtime has created the container
//! (the runtime has then set the init's credentials, capabilities, no-new-privileges and
//! seccomp filter, made its namespaces and mounted its table; the init waits to be started).
//!
//! It is the prebuild's equivalent of the worker's posture report in the lane, and stronger
//! than a report: nothing inside the container has run, and every fact is the kernel's
//! (`/proc/<pid>/status`, its namespaces against the supervisor's, its network namespace's
//! routes, its mount table). A runtime that accepts a bundle and silently applies less of
//! it — a flag dropped, a namespace shared, a filter not installed — is caught here, and the
//! session ends as a no-decision that quarantines the executor (containment).
//!
//! What it owns: reading those facts through the host seam and the comparison. What it does
//! not: the plan (the planner's) and what a difference means for the run (the session's).

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr as _;

use cordon::host::Host;
use oci_spec::runtime::{LinuxNamespaceType, Spec};
use serde::Serialize;

/// The created init's posture, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outside {
    /// Real, effective, saved and filesystem uid.
    pub uids: Vec<u32>,
    /// Real, effective, saved and filesystem gid.
    pub gids: Vec<u32>,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// `CapInh`, `CapPrm`, `CapEff`, `CapBnd`, `CapAmb`.
    pub caps: BTreeMap<String, u64>,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp` (2: filter mode) and `Seccomp_filters` beyond the supervisor's own (the init
    /// inherits those: only the ones the runtime installed count).
    pub seccomp: (u32, i64),
    /// Namespace kind (`/proc/<pid>/ns/<kind>`) → whether it is not the supervisor's.
    pub namespaces: BTreeMap<String, bool>,
    /// The routes of its network namespace's main IPv4 table.
    pub routes: usize,
    /// Mount point → whether read-only, for the root and every bind mount of the plan (the
    /// top mount at that point); `None`: nothing is mounted there.
    pub read_only: BTreeMap<String, Option<bool>>,
}

/// The namespace kinds compared, with the plan's name for each.
const NAMESPACES: [(&str, LinuxNamespaceType); 7] = [
    ("pid", LinuxNamespaceType::Pid),
    ("net", LinuxNamespaceType::Network),
    ("ipc", LinuxNamespaceType::Ipc),
    ("uts", LinuxNamespaceType::Uts),
    ("mnt", LinuxNamespaceType::Mount),
    ("cgroup", LinuxNamespaceType::Cgroup),
    ("user", LinuxNamespaceType::User),
];

/// The status fields compared, as the kernel names them, with the capability set each is.
const CAP_FIELDS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

/// Read the posture of the created init `pid` through `host`.
///
/// # Errors
/// A fact cannot be read or parsed: the posture is then not established.
pub fn read(host: &dyn Host, pid: i32, planned: &Spec) -> Result<Outside, String> {
    let text = |path: String| {
        host.read(Path::new(&path))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| format!("{path}: {e}"))
    };
    let status = text(format!("/proc/{pid}/status"))?;
    let own = text("/proc/self/status".to_owned())?;
    let field_of = |status: &str, name: &str| -> Result<String, String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
            .ok_or_else(|| format!("a process status without {name}"))
    };
    let field = |name: &str| field_of(&status, name);
    let numbers = |name: &str| -> Result<Vec<u32>, String> {
        field(name)?
            .split_whitespace()
            .map(|n| n.parse().map_err(|e| format!("{name}: {e}")))
            .collect()
    };
    let number = |name: &str| -> Result<u32, String> {
        field(name)?.parse().map_err(|e| format!("{name}: {e}"))
    };
    let mut caps = BTreeMap::new();
    for name in CAP_FIELDS {
        let v = u64::from_str_radix(&field(name)?, 16).map_err(|e| format!("{name}: {e}"))?;
        caps.insert(name.to_owned(), v);
    }
    let pid_u = u32::try_from(pid).map_err(|_| format!("no process {pid}"))?;
    let mut namespaces = BTreeMap::new();
    for (kind, _) in NAMESPACES {
        let of = |p: Option<u32>| {
            host.namespace(p, kind)
                .map_err(|e| format!("{}: {e}", cordon::host::namespace_path(p, kind).display()))
        };
        namespaces.insert(kind.to_owned(), of(Some(pid_u))? != of(None)?);
    }
    let routes = text(format!("/proc/{pid}/net/route"))?
        .lines()
        .skip(1)
        .count();
    // Read whole here (the evidence copy is bounded): a created container's table is the
    // runtime's, nothing of the workload's.
    let table = cordon::mountinfo::entries(&text(format!("/proc/{pid}/mountinfo"))?);
    let read_only = watched(planned)
        .into_iter()
        .map(|point| {
            // The top mount at the point decides what a path there is.
            let ro = table
                .iter()
                .rev()
                .find(|e| e.point == Path::new(&point))
                .map(cordon::mountinfo::Entry::read_only);
            (point, ro)
        })
        .collect();
    let filters = |status: &str| -> Result<i64, String> {
        field_of(status, "Seccomp_filters")?
            .parse()
            .map_err(|e| format!("Seccomp_filters: {e}"))
    };
    Ok(Outside {
        uids: numbers("Uid")?,
        gids: numbers("Gid")?,
        groups: numbers("Groups")?,
        caps,
        no_new_privs: number("NoNewPrivs")? == 1,
        seccomp: (number("Seccomp")?, filters(&status)? - filters(&own)?),
        namespaces,
        routes,
        read_only,
    })
}

/// The mount points whose read-only flag the posture reports: the root and every bind mount.
fn watched(planned: &Spec) -> Vec<String> {
    let mut points = vec!["/".to_owned()];
    points.extend(
        planned
            .mounts()
            .iter()
            .flatten()
            .filter(|m| m.typ().as_deref() == Some("bind"))
            .map(|m| m.destination().to_string_lossy().into_owned()),
    );
    points
}

/// The capability set `name` (a [`CAP_FIELDS`] entry) of the plan, as the kernel's bitmask.
fn planned_caps(planned: &Spec, name: &str) -> u64 {
    let Some(c) = planned
        .process()
        .as_ref()
        .and_then(|p| p.capabilities().clone())
    else {
        return 0;
    };
    let set = match name {
        "CapInh" => c.inheritable(),
        "CapPrm" => c.permitted(),
        "CapEff" => c.effective(),
        "CapBnd" => c.bounding(),
        _ => c.ambient(),
    };
    set.iter()
        .flatten()
        .map(|cap| {
            // A name the kernel's list lacks cannot be granted: all bits, so it differs.
            caps::Capability::from_str(&format!("CAP_{cap}")).map_or(u64::MAX, |k| k.bitmask())
        })
        .fold(0, |acc, bit| acc | bit)
}

/// How `o` differs from what `planned` asks of the runtime (empty: as planned).
#[must_use]
pub fn differences(planned: &Spec, o: &Outside) -> Vec<String> {
    let mut d = Vec::new();
    let mut want = |ok: bool, what: String| {
        if !ok {
            d.push(what);
        }
    };
    let process = planned.process().as_ref();
    let user = process.map(|p| p.user().clone());
    let uid = user.as_ref().map_or(u32::MAX, |u| u.uid());
    let gid = user.as_ref().map_or(u32::MAX, |u| u.gid());
    want(
        o.uids == [uid; 4],
        format!("uids {:?}, not {uid} throughout", o.uids),
    );
    want(
        o.gids == [gid; 4],
        format!("gids {:?}, not {gid} throughout", o.gids),
    );
    let groups: Vec<u32> = user
        .as_ref()
        .and_then(|u| u.additional_gids().clone())
        .unwrap_or_default();
    want(
        o.groups == groups,
        format!("groups {:?}, not {groups:?}", o.groups),
    );
    for name in CAP_FIELDS {
        let (got, plan) = (o.caps.get(name).copied(), planned_caps(planned, name));
        want(
            got == Some(plan),
            format!("{name} is {:x}, not {plan:x}", got.unwrap_or(u64::MAX)),
        );
    }
    let nnp = process.and_then(|p| p.no_new_privileges()).unwrap_or(false);
    want(
        o.no_new_privs == nnp,
        format!("no_new_privs is {}, not {nnp}", o.no_new_privs),
    );
    let filtered = planned
        .linux()
        .as_ref()
        .is_some_and(|l| l.seccomp().is_some());
    // Exactly the one filter the runtime installs, above whatever the supervisor runs under.
    let (mode, filters) = o.seccomp;
    let want_filters = i64::from(filtered);
    want(
        filters == want_filters,
        format!("seccomp mode {mode} with {filters} filters of the runtime's, not {want_filters}"),
    );
    let private = |kind: LinuxNamespaceType| {
        planned.linux().as_ref().is_some_and(|l| {
            l.namespaces()
                .iter()
                .flatten()
                .any(|n| n.typ() == kind && n.path().is_none())
        })
    };
    let namespaces: BTreeMap<String, bool> = NAMESPACES
        .iter()
        .map(|(kind, typ)| ((*kind).to_owned(), private(*typ)))
        .collect();
    want(
        o.namespaces == namespaces,
        format!(
            "namespaces of its own {:?}, not {namespaces:?}",
            o.namespaces
        ),
    );
    if private(LinuxNamespaceType::Network) {
        want(
            o.routes == 0,
            format!("a private network namespace with {} routes", o.routes),
        );
    }
    let root_ro = planned
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false);
    let read_only: BTreeMap<String, Option<bool>> = watched(planned)
        .into_iter()
        .map(|point| {
            let ro = if point == "/" {
                root_ro
            } else {
                planned.mounts().iter().flatten().any(|m| {
                    m.destination().to_string_lossy() == point.as_str()
                        && m.options().iter().flatten().any(|o| o == "ro")
                })
            };
            (point, Some(ro))
        })
        .collect();
    // Each mount as `point ro`, `point rw` or `point unmounted`, in the table's terms.
    let show = |m: &BTreeMap<String, Option<bool>>| {
        m.iter()
            .map(|(point, ro)| {
                let flag = match ro {
                    Some(true) => "ro",
                    Some(false) => "rw",
                    None => "unmounted",
                };
                format!("{point} {flag}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    want(
        o.read_only == read_only,
        format!(
            "read-only mounts [{}], not [{}]",
            show(&o.read_only),
            show(&read_only)
        ),
    );
    d
}

#[cfg(test)]
mod tests;
