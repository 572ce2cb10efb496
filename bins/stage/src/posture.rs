//! The container's posture read from outside: what the kernel says of the created init, before
//! any of the workload's code has run, compared with the plan. Every container stage's
//! [`Session`](crate::session::Session) reads it once the runtime has created the container
//! (the runtime has then set the init's credentials, capabilities, no-new-privileges and
//! seccomp filter, made its namespaces and mounted its table; the init waits to be started) —
//! or, under a runtime that settles only as its init execs the entrypoint (crun), once started,
//! while the entrypoint waits at the start gate before anything of the workload runs (only
//! the gate's reader has run then: the image's shell, or cordon's worker).
//!
//! It is the prebuild's equivalent of the worker's posture report in the lane, and stronger
//! than a report: nothing inside the container has run, and every fact is the kernel's
//! (`/proc/<pid>/status`, its resource limits, its namespaces against the supervisor's, its
//! network namespace's routes, its mount table). A runtime that accepts a bundle and silently applies less of
//! it — a flag dropped, a namespace shared, a filter not installed — is caught here, and the
//! session ends as a no-decision that quarantines the executor (containment).
//!
//! The facts are read by pid, safely: the session is a child subreaper, so the created init,
//! orphaned when `runtime create` exits, is its child, and its pid stays its own until the
//! session reaps it — no other process can be read in its place. An init that died first is a
//! zombie whose namespaces cannot be read: no posture, a no-decision. `Seccomp_filters` is
//! Linux 5.9's: on an older kernel the posture cannot be read, and no session runs.
//!
//! What it owns: reading those facts through the host seam and the comparison. What it does
//! not: the plan (the planner's) and what a difference means for the run (the session's).

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr as _;

use cordon::host::Host;
use oci_spec::runtime::{LinuxNamespaceType, PosixRlimitType, Spec};
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
    /// Each planned resource limit (`RLIMIT_NOFILE`, …) → its soft and hard value in the init's
    /// `limits` (`u64::MAX`: unlimited).
    pub limits: BTreeMap<String, (u64, u64)>,
    /// Each mount point the plan names (the root and every mount), as the top mount there
    /// shows it; `None`: nothing is mounted there.
    pub mounts: BTreeMap<String, Option<Mount>>,
    /// Every other mount (top at its point): the runtime's masks and read-only paths, an
    /// `rbind`'s submounts, and whatever else a runtime added.
    pub others: BTreeMap<String, Mount>,
    /// The kernel's page size, in bytes: it rounds a tmpfs's size to whole pages.
    pub page_size: u64,
}

/// One mount as the kernel's table shows it: the flags the plan can ask for and the filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// Which of [`FLAGS`] the mount carries (`ro` or none of it: read-write).
    pub flags: Vec<String>,
    /// The filesystem type.
    pub fstype: String,
    /// A tmpfs's size in KiB, as the kernel shows it.
    pub size_kib: Option<u64>,
}

/// The per-mount flags compared: read-only must be as planned, the rest at least as planned
/// (a flag the runtime adds only narrows what the workload may do).
const FLAGS: [&str; 4] = ["ro", "nosuid", "nodev", "noexec"];

impl Mount {
    fn of(e: &cordon::mountinfo::Entry) -> Self {
        Self {
            flags: FLAGS
                .iter()
                .filter(|f| e.options.iter().any(|o| o == *f))
                .map(|f| (*f).to_owned())
                .collect(),
            fstype: e.fstype.clone(),
            // The kernel's own figure, in KiB.
            size_kib: e
                .super_options
                .iter()
                .find_map(|o| o.strip_prefix("size=")?.strip_suffix('k')?.parse().ok()),
        }
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
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

/// The row of `/proc/<pid>/limits` that shows `typ`.
const fn limit_row(typ: PosixRlimitType) -> &'static str {
    match typ {
        PosixRlimitType::RlimitCpu => "Max cpu time",
        PosixRlimitType::RlimitFsize => "Max file size",
        PosixRlimitType::RlimitData => "Max data size",
        PosixRlimitType::RlimitStack => "Max stack size",
        PosixRlimitType::RlimitCore => "Max core file size",
        PosixRlimitType::RlimitRss => "Max resident set",
        PosixRlimitType::RlimitNproc => "Max processes",
        PosixRlimitType::RlimitNofile => "Max open files",
        PosixRlimitType::RlimitMemlock => "Max locked memory",
        PosixRlimitType::RlimitAs => "Max address space",
        PosixRlimitType::RlimitLocks => "Max file locks",
        PosixRlimitType::RlimitSigpending => "Max pending signals",
        PosixRlimitType::RlimitMsgqueue => "Max msgqueue size",
        PosixRlimitType::RlimitNice => "Max nice priority",
        PosixRlimitType::RlimitRtprio => "Max realtime priority",
        PosixRlimitType::RlimitRttime => "Max realtime timeout",
    }
}

/// The planned resource limits.
fn planned_limits(planned: &Spec) -> Vec<oci_spec::runtime::PosixRlimit> {
    planned
        .process()
        .as_ref()
        .and_then(|p| p.rlimits().clone())
        .unwrap_or_default()
}

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
    // The runtime sets the limits from outside before `create` returns (it could not raise a
    // hard limit once the init has dropped its capabilities).
    let table = text(format!("/proc/{pid}/limits"))?;
    let mut limits = BTreeMap::new();
    for l in planned_limits(planned) {
        let row = limit_row(l.typ());
        let value = |v: &str| match v {
            "unlimited" => Ok(u64::MAX),
            n => n.parse::<u64>().map_err(|e| format!("{row}: {e}")),
        };
        let mut fields = table
            .lines()
            .find_map(|line| line.strip_prefix(row)?.strip_prefix(' '))
            .ok_or_else(|| format!("a limits table without {row}"))?
            .split_whitespace();
        let (soft, hard) = (
            fields.next().unwrap_or_default(),
            fields.next().unwrap_or_default(),
        );
        limits.insert(l.typ().to_string(), (value(soft)?, value(hard)?));
    }
    let routes = text(format!("/proc/{pid}/net/route"))?
        .lines()
        .skip(1)
        .count();
    // Read whole here (the evidence copy is bounded): a created container's table is the
    // runtime's, nothing of the workload's. The top mount at a point decides what a path there
    // is: a later line covers an earlier one.
    let mut top: BTreeMap<String, Mount> = BTreeMap::new();
    for e in cordon::mountinfo::entries(&text(format!("/proc/{pid}/mountinfo"))?) {
        top.insert(e.point.to_string_lossy().into_owned(), Mount::of(&e));
    }
    // A constant of the running kernel, the supervisor's as the container's.
    let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| n.is_power_of_two() && *n >= 4096)
        .ok_or("the kernel's page size cannot be read")?;
    // A tmpfs at the kernel's default size (half its memory, in whole pages) shows no `size=`.
    for m in top
        .values_mut()
        .filter(|m| m.fstype == "tmpfs" && m.size_kib.is_none())
    {
        let meminfo = text("/proc/meminfo".to_owned())?;
        let total: u64 = meminfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .ok_or("a memory table without MemTotal")?;
        let page_kib = page_size / 1024;
        m.size_kib = Some(total / page_kib / 2 * page_kib);
    }
    let points = planned_points(planned);
    let mounts = points
        .iter()
        .map(|p| (p.point.clone(), top.get(&p.point).cloned()))
        .collect();
    let others = top
        .into_iter()
        .filter(|(point, _)| !points.iter().any(|p| p.point == *point))
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
        limits,
        mounts,
        others,
        page_size,
    })
}

/// A mount point the plan names, with what it asks of the mount there.
struct Point {
    point: String,
    /// A bind mount: a submount beneath it must be as narrow (not the root: nothing is
    /// mounted beneath it but what the plan names).
    bind: bool,
    /// The filesystem type a mount of its own names (`tmpfs`, `proc`, …; not for a bind).
    fstype: Option<String>,
    /// The [`FLAGS`] it asks for.
    flags: Vec<String>,
    /// A tmpfs's `size=` option, as planned.
    size: Option<String>,
}

/// The root and every mount of `planned`, in the plan's order.
fn planned_points(planned: &Spec) -> Vec<Point> {
    let root_ro = planned
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false);
    let mut points = vec![Point {
        point: "/".to_owned(),
        bind: false,
        fstype: None,
        flags: if root_ro {
            vec!["ro".to_owned()]
        } else {
            Vec::new()
        },
        size: None,
    }];
    for m in planned.mounts().iter().flatten() {
        let options: Vec<&str> = m.options().iter().flatten().map(String::as_str).collect();
        let typ = m.typ().clone().unwrap_or_default();
        let bind = typ == "bind";
        points.push(Point {
            point: m.destination().to_string_lossy().into_owned(),
            bind,
            fstype: (!bind).then_some(typ),
            flags: FLAGS
                .iter()
                .filter(|f| options.contains(f))
                .map(|f| (*f).to_owned())
                .collect(),
            size: options
                .iter()
                .find_map(|o| o.strip_prefix("size="))
                .map(str::to_owned),
        });
    }
    points
}

/// The deepest of `points` strictly above `path`.
fn deepest_above<'a>(points: &'a [Point], path: &str) -> Option<&'a Point> {
    points
        .iter()
        .filter(|p| p.point != path && Path::new(path).starts_with(&p.point))
        .max_by_key(|p| p.point.len())
}

/// A tmpfs `size=` option in KiB as the kernel shows it: bytes (or a `k`, `m`, `g` multiple)
/// rounded up to whole pages of `page_size` bytes. `None`: not a size the planner writes.
fn size_kib(size: &str, page_size: u64) -> Option<u64> {
    let (digits, unit) = match size.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&size[..i], c.to_ascii_lowercase()),
        _ => (size, 'b'),
    };
    let shift = match unit {
        'b' => 0,
        'k' => 10,
        'm' => 20,
        'g' => 30,
        _ => return None,
    };
    let bytes = digits.parse::<u64>().ok()?.checked_mul(1 << shift)?;
    Some(bytes.div_ceil(page_size) * (page_size / 1024))
}

/// How `seen` differs from what `want` asks of a mount (empty: as planned); `beneath`: a mount
/// under `want`'s point, held to its flags only.
fn mount_differences(want: &Point, seen: &Mount, beneath: bool, page_size: u64) -> Vec<String> {
    let mut d = Vec::new();
    let ro = want.flags.iter().any(|f| f == "ro");
    // Read-only exactly as planned at the point itself; beneath it, at least as planned.
    if seen.has("ro") != ro && (ro || !beneath) {
        let (is, not) = if seen.has("ro") {
            ("ro", "rw")
        } else {
            ("rw", "ro")
        };
        d.push(format!("{is}, not {not}"));
    }
    for flag in want.flags.iter().filter(|f| *f != "ro") {
        if !seen.has(flag) {
            d.push(format!("without {flag}"));
        }
    }
    if beneath {
        return d;
    }
    if let Some(typ) = &want.fstype {
        if seen.fstype != *typ {
            d.push(format!("a {} mount, not {typ}", seen.fstype));
        }
    }
    if let Some(size) = &want.size {
        let planned = size_kib(size, page_size);
        if planned.is_none() || seen.size_kib != planned {
            let shown = seen
                .size_kib
                .map_or_else(|| "no".to_owned(), |k| format!("{k}k"));
            d.push(format!("{shown} size, not {size}"));
        }
    }
    d
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
    for l in planned_limits(planned) {
        let name = l.typ().to_string();
        let seen = o.limits.get(&name).copied();
        let want_limit = (l.soft(), l.hard());
        let show = |(soft, hard): (u64, u64)| {
            let one = |v: u64| {
                if v == u64::MAX {
                    "unlimited".to_owned()
                } else {
                    v.to_string()
                }
            };
            format!("{} soft, {} hard", one(soft), one(hard))
        };
        want(
            seen == Some(want_limit),
            format!(
                "{name} is {}, not {}",
                seen.map_or_else(|| "not shown".to_owned(), show),
                show(want_limit)
            ),
        );
    }
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
    // Every mount the table showed, wherever the read filed it: a record read against another
    // plan is judged against this one.
    let seen_at: BTreeMap<&str, &Mount> = o
        .mounts
        .iter()
        .filter_map(|(point, m)| Some((point.as_str(), m.as_ref()?)))
        .chain(o.others.iter().map(|(point, m)| (point.as_str(), m)))
        .collect();
    let points = planned_points(planned);
    for p in &points {
        match seen_at.get(p.point.as_str()) {
            Some(seen) => {
                for what in mount_differences(p, seen, false, o.page_size) {
                    want(false, format!("mount {}: {what}", p.point));
                }
            }
            None => want(false, format!("mount {}: nothing mounted there", p.point)),
        }
    }
    // Every other mount is the runtime's mask or read-only path, or a submount an `rbind`
    // carried under a planned bind; anything else is a mount nobody planned.
    let listed = |paths: Option<&Vec<String>>, point: &str| {
        paths.is_some_and(|v| v.iter().any(|p| p == point))
    };
    let linux = planned.linux().as_ref();
    for (point, seen) in seen_at {
        if points.iter().any(|p| p.point == point)
            || listed(linux.and_then(|l| l.masked_paths().as_ref()), point)
        {
            // Compared above; or a mask, which only hides what is beneath it, whatever its
            // flags.
            continue;
        }
        if listed(linux.and_then(|l| l.readonly_paths().as_ref()), point) {
            want(
                seen.has("ro"),
                format!("mount {point}: a read-only path, rw"),
            );
            continue;
        }
        match deepest_above(&points, point) {
            Some(above) if above.bind => {
                for what in mount_differences(above, seen, true, o.page_size) {
                    want(
                        false,
                        format!("mount {point} beneath {}: {what}", above.point),
                    );
                }
            }
            _ => want(false, format!("mount {point}: not planned")),
        }
    }
    d
}

#[cfg(test)]
mod tests;
