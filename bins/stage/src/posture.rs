//! The container's posture read from outside: what the kernel says of the created init, before
//! any of the workload's code has run, compared with the plan. Every container stage's
//! [`Session`](crate::session::Session) reads it once the runtime has created the container
//! (the runtime has then set the init's credentials, capabilities, no-new-privileges and
//! seccomp filter, made its namespaces and mounted its table; the init waits to be started).
//!
//! It is the prebuild's equivalent of the worker's posture report in the lane, and stronger
//! than a report: nothing inside the container has run, and every fact is the kernel's
//! (`/proc/<pid>/status`, its network namespace's `/proc/<pid>/net/{dev,route}`, its pid
//! namespace, its mount table). A runtime that accepts a bundle and silently applies less of
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
    /// `Seccomp` (2: filter mode) and `Seccomp_filters`.
    pub seccomp: (u32, u32),
    /// Whether its pid namespace is not this process's.
    pub own_pid_namespace: bool,
    /// The interfaces of its network namespace.
    pub interfaces: Vec<String>,
    /// The routes of its network namespace's main IPv4 table.
    pub routes: usize,
    /// Mount point → whether read-only, for the root and every bind mount of the plan (the
    /// top mount at that point).
    pub read_only: BTreeMap<String, bool>,
}

/// The status fields compared, as the kernel names them, with the capability set each is.
const CAP_FIELDS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

/// Read the posture of the created init `pid` through `host`; `mountinfo` is its mount table
/// (the session has already read it as evidence).
///
/// # Errors
/// A fact cannot be read or parsed: the posture is then not established.
pub fn read(
    host: &dyn Host,
    pid: i32,
    mountinfo: &[u8],
    planned: &Spec,
) -> Result<Outside, String> {
    let text = |path: String| {
        host.read(Path::new(&path))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| format!("{path}: {e}"))
    };
    let status = text(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<&str, String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .ok_or_else(|| format!("/proc/{pid}/status has no {name}"))
    };
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
        let v = u64::from_str_radix(field(name)?, 16).map_err(|e| format!("{name}: {e}"))?;
        caps.insert(name.to_owned(), v);
    }
    let ns = |p: u32| {
        host.pid_namespace(p)
            .map_err(|e| format!("the pid namespace of {p}: {e}"))?
            .1
            .ok_or_else(|| format!("the pid namespace of {p} cannot be read"))
    };
    let pid_u = u32::try_from(pid).map_err(|_| format!("no process {pid}"))?;
    let interfaces = text(format!("/proc/{pid}/net/dev"))?
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|n| n.trim().to_owned()))
        .collect();
    let routes = text(format!("/proc/{pid}/net/route"))?
        .lines()
        .skip(1)
        .count();
    let table = cordon::mountinfo::entries(&String::from_utf8_lossy(mountinfo));
    let read_only = watched(planned)
        .into_iter()
        .map(|point| {
            // The top mount at the point decides what a path there is.
            let ro = table
                .iter()
                .rev()
                .find(|e| e.point == Path::new(&point))
                .map(cordon::mountinfo::Entry::read_only)
                .ok_or_else(|| format!("nothing is mounted at {point} in the container"))?;
            Ok((point, ro))
        })
        .collect::<Result<_, String>>()?;
    Ok(Outside {
        uids: numbers("Uid")?,
        gids: numbers("Gid")?,
        groups: numbers("Groups")?,
        caps,
        no_new_privs: number("NoNewPrivs")? == 1,
        seccomp: (number("Seccomp")?, number("Seccomp_filters")?),
        own_pid_namespace: ns(pid_u)? != ns(std::process::id())?,
        interfaces,
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
    let (mode, filters) = o.seccomp;
    want(
        (mode == 2 && filters >= 1) == filtered,
        format!("seccomp mode {mode} with {filters} filters, planned filtered: {filtered}"),
    );
    let private = |kind: LinuxNamespaceType| {
        planned.linux().as_ref().is_some_and(|l| {
            l.namespaces()
                .iter()
                .flatten()
                .any(|n| n.typ() == kind && n.path().is_none())
        })
    };
    want(
        o.own_pid_namespace == private(LinuxNamespaceType::Pid),
        format!(
            "its own pid namespace: {}, planned: {}",
            o.own_pid_namespace,
            private(LinuxNamespaceType::Pid)
        ),
    );
    if private(LinuxNamespaceType::Network) {
        want(
            o.interfaces == ["lo"] && o.routes == 0,
            format!(
                "a private network namespace with interfaces {:?} and {} routes",
                o.interfaces, o.routes
            ),
        );
    }
    let root_ro = planned
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false);
    let read_only: BTreeMap<String, bool> = watched(planned)
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
            (point, ro)
        })
        .collect();
    want(
        o.read_only == read_only,
        format!("read-only mounts {:?}, not {read_only:?}", o.read_only),
    );
    d
}

#[cfg(test)]
mod tests;
