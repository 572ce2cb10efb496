//! Whether this host can honour a candidate stage, established before anything is leased: the
//! policy's `host { … }` against what the kernel reports.
//!
//! It owns two checks and the record of them:
//! - **memory**: the stage's memory limit bounds everything its container faults in — its
//!   processes, and the tmpfs and overlay pages it writes (the kernel charges those to the
//!   container's cgroup; `prebuild.oom` and `lane.oom` test it) — but not the copies the host
//!   makes for it (the tree and the publication, each on a tmpfs of the lease's, charged to
//!   the supervisor). Each copy's worst case under the policy's bounds — its bytes, each file
//!   rounded up to a page, and the kernel's inode and dentry memory for every file and every
//!   directory a file's path may add — plus the limit must fit in the host's memory (less its
//!   huge-page pool) less the policy's reserve; otherwise the bound is one this host cannot
//!   honour, and a verdict under it would rest on the host's OOM killer instead of the
//!   policy's limit. Static on purpose: no candidate byte can turn its own run into this
//!   refusal.
//! - **side channels**: not a virtual machine (where SMT and the vulnerabilities read are the
//!   guest's view, not the physical core's), SMT off, unprivileged BPF off, and every CPU
//!   vulnerability the kernel lists reads `Not affected` or `Mitigation: …` with nothing in it
//!   still vulnerable — unless the policy allows it with a reason. A fact that cannot be read
//!   is not "fine": it is refused like a failed one.
//!
//! Every refusal is a no-decision (exit 3): the host, not the candidate. What was read and
//! judged — refusals included — is kept as the session's `host` evidence, named by its
//! receipt. What it does not own: concurrent sessions (each is checked alone; the sum of
//! concurrent sessions on one host is not bounded by this check), a memory limit on a cgroup
//! above cordon's, and the agent surface and the parser children, which do not run this
//! check (the surface is bounded by its own limits).

use std::collections::BTreeMap;
use std::path::Path;

use cordon::host::Host;
use cordon_policy_lang::{Allowance, MountSource, Policy, StageKind};
use serde::Serialize;

use crate::bundle::copy_dir;

/// Where the kernel reports what this module reads.
const MEMINFO: &str = "/proc/meminfo";
const SMT_ACTIVE: &str = "/sys/devices/system/cpu/smt/active";
const UNPRIVILEGED_BPF: &str = "/proc/sys/kernel/unprivileged_bpf_disabled";
const VULNERABILITIES: &str = "/sys/devices/system/cpu/vulnerabilities";
const CPUINFO: &str = "/proc/cpuinfo";

/// A tmpfs page: every file of a copy is rounded up to it.
const PAGE: u64 = 4096;
/// The kernel's memory for one tmpfs inode and its dentry, about (shmem inode ~0.8 KiB and a
/// dentry ~0.2 KiB on 6.x kernels), charged to whoever makes the copy.
const INODE: u64 = 1024;

/// Why this host cannot run the stage (a no-decision).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum HostFitError {
    /// A fact the policy's host rules need could not be read.
    #[error("cannot establish {what} from {path}: {why}")]
    #[diagnostic(
        code(cordon::host::unreadable),
        help("a host fact that cannot be read is refused, never assumed fine")
    )]
    Unreadable {
        /// The fact.
        what: &'static str,
        /// Where it was read.
        path: String,
        /// Why.
        why: String,
    },
    /// The stage's memory bound and the host's copies do not fit beside the reserve.
    #[error(
        "stage {kind} needs {demand} bytes (its memory limit {limit} and the host's copies {copies}), more than this host's {total} bytes less the policy's reserve {reserve}"
    )]
    #[diagnostic(
        code(cordon::host::memory),
        help(
            "lower the stage's memory (or the tree's max-total-bytes) in a reviewed change, or run it on a host with more memory"
        )
    )]
    Memory {
        /// The stage.
        kind: StageKind,
        /// Limit plus copies.
        demand: u64,
        /// The stage's memory limit.
        limit: u64,
        /// The copies' bounds.
        copies: u64,
        /// The host's memory.
        total: u64,
        /// The policy's reserve.
        reserve: u64,
    },
    /// A side channel the policy wants closed is open here.
    #[error("this host has {what}: {status}")]
    #[diagnostic(
        code(cordon::host::posture),
        help(
            "close it on the host, or allow it in the policy's host block with a reason (a reviewed change of authority)"
        )
    )]
    Posture {
        /// The feature or vulnerability.
        what: String,
        /// What the kernel says.
        status: String,
    },
    /// A candidate stage without a memory limit (the language requires one; never counted as
    /// zero).
    #[error("stage {kind} has no memory limit to check against this host")]
    #[diagnostic(code(cordon::host::unbounded))]
    NoLimit {
        /// The stage.
        kind: StageKind,
    },
    /// The stage mounts a copy the policy gives no bound for.
    #[error("stage {kind} mounts a copy of the {role}, which the policy does not bound")]
    #[diagnostic(code(cordon::host::unbounded))]
    Unbounded {
        /// The stage.
        kind: StageKind,
        /// The copied role.
        role: MountSource,
    },
}

/// What the kernel reports, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Facts {
    /// `MemTotal` less `Hugetlb` (the huge-page pool no tmpfs or container page can use), in
    /// bytes.
    pub mem_total: u64,
    /// Whether the CPU says a hypervisor runs it (the `hypervisor` flag).
    pub hypervisor: bool,
    /// `smt/active`: whether sibling hardware threads run.
    pub smt_active: bool,
    /// `kernel.unprivileged_bpf_disabled` (0: unprivileged BPF on; 1 or 2: off).
    pub unprivileged_bpf_disabled: u64,
    /// Each vulnerability file's name and first line.
    pub vulnerabilities: BTreeMap<String, String>,
}

/// A host's fit for a stage: the memory sum, and which of the policy's allowances this host
/// needed (kept beside the facts it was judged on: [`record`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fit {
    /// The stage's memory limit plus the host's copies.
    pub demand: u64,
    /// The host's memory less the reserve.
    pub available: u64,
    /// The allowances this host used (`smt`, `unprivileged-bpf`, vulnerability names).
    pub allowed: Vec<String>,
}

fn unreadable(what: &'static str, path: &str, why: impl ToString) -> HostFitError {
    HostFitError::Unreadable {
        what,
        path: path.to_owned(),
        why: why.to_string(),
    }
}

fn text(host: &dyn Host, what: &'static str, path: &str) -> Result<String, HostFitError> {
    let bytes = host
        .read(Path::new(path))
        .map_err(|e| unreadable(what, path, e))?;
    String::from_utf8(bytes).map_err(|_| unreadable(what, path, "not UTF-8"))
}

/// Read the facts through the host seam.
///
/// # Errors
/// [`HostFitError::Unreadable`] for the first fact that cannot be read or parsed (a kernel
/// without `smt/active` included: whether siblings run is then unknown).
pub fn read(host: &dyn Host) -> Result<Facts, HostFitError> {
    let meminfo = text(host, "the host's memory", MEMINFO)?;
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .and_then(|kb| kb.checked_mul(1024))
    };
    let total = field("MemTotal:")
        .ok_or_else(|| unreadable("the host's memory", MEMINFO, "no MemTotal in kB"))?;
    // Absent on a kernel without huge pages: no pool.
    let hugetlb = match meminfo.lines().any(|l| l.starts_with("Hugetlb:")) {
        true => field("Hugetlb:")
            .ok_or_else(|| unreadable("the host's memory", MEMINFO, "Hugetlb is not in kB"))?,
        false => 0,
    };
    let mem_total = total.saturating_sub(hugetlb);
    let cpuinfo = text(host, "whether a hypervisor runs this host", CPUINFO)?;
    let flags = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("flags")
                .and_then(|r| r.trim_start().strip_prefix(':'))
        })
        .ok_or_else(|| {
            unreadable(
                "whether a hypervisor runs this host",
                CPUINFO,
                "no flags line",
            )
        })?;
    let hypervisor = flags.split_whitespace().any(|f| f == "hypervisor");
    let smt_active = match text(host, "whether SMT is active", SMT_ACTIVE)?.trim() {
        "0" => false,
        "1" => true,
        other => return Err(unreadable("whether SMT is active", SMT_ACTIVE, other)),
    };
    let bpf = text(host, "the unprivileged BPF setting", UNPRIVILEGED_BPF)?;
    let unprivileged_bpf_disabled = bpf
        .trim()
        .parse()
        .map_err(|_| unreadable("the unprivileged BPF setting", UNPRIVILEGED_BPF, bpf.trim()))?;
    let mut vulnerabilities = BTreeMap::new();
    let names = host
        .list_files(Path::new(VULNERABILITIES))
        .map_err(|e| unreadable("the CPU's vulnerabilities", VULNERABILITIES, e))?;
    for name in names {
        let path = format!("{VULNERABILITIES}/{name}");
        let status = text(host, "a CPU vulnerability's status", &path)?;
        let first = status.lines().next().unwrap_or("").trim().to_owned();
        vulnerabilities.insert(name, first);
    }
    Ok(Facts {
        mem_total,
        hypervisor,
        smt_active,
        unprivileged_bpf_disabled,
        vulnerabilities,
    })
}

/// The stage's memory limit, and the worst case of the copies the host makes for it under the
/// policy's bounds: a copy of at most `bytes` in at most `files` files, each path at most
/// `depth` components deep, takes its bytes, a page per file for rounding, and an inode for
/// every file and every directory a path may add.
///
/// # Errors
/// [`HostFitError::NoLimit`] for a stage without a memory limit, and
/// [`HostFitError::Unbounded`] for a copy the policy gives no bound for.
pub fn demand(policy: &Policy, kind: StageKind) -> Result<(u64, u64), HostFitError> {
    let Some(stage) = policy.stage(kind) else {
        return Ok((0, 0));
    };
    let limit = stage.memory_bytes.ok_or(HostFitError::NoLimit { kind })?;
    let worst = |bytes: u64, files: u64, depth: u64| {
        let per_file = PAGE.saturating_add(depth.saturating_add(1).saturating_mul(INODE));
        bytes.saturating_add(files.saturating_mul(per_file))
    };
    let mut copies = 0u64;
    for m in stage.mount.values() {
        if copy_dir(m.source).is_none() {
            continue;
        }
        let bound = match m.source {
            MountSource::Tree => {
                let t = policy.tree_rules();
                Some(worst(t.max_total_bytes, t.max_files, t.max_depth))
            }
            MountSource::Publication => policy
                .stage(StageKind::Prebuild)
                .and_then(|p| p.publication.as_ref())
                .map(|p| worst(p.max_bytes, p.max_files, p.max_depth)),
            _ => None,
        }
        .ok_or(HostFitError::Unbounded {
            kind,
            role: m.source,
        })?;
        copies = copies.saturating_add(bound);
    }
    Ok((limit, copies))
}

/// Judge `facts` against the policy's host rules for stage `kind`.
///
/// # Errors
/// The first rule this host breaks.
pub fn judge(policy: &Policy, kind: StageKind, facts: &Facts) -> Result<Fit, HostFitError> {
    let rules = policy.host();
    let (limit, copies) = demand(policy, kind)?;
    let demand = limit.saturating_add(copies);
    let available = facts.mem_total.saturating_sub(rules.memory_reserve_bytes);
    if demand > available {
        return Err(HostFitError::Memory {
            kind,
            demand,
            limit,
            copies,
            total: facts.mem_total,
            reserve: rules.memory_reserve_bytes,
        });
    }
    let mut allowed = Vec::new();
    let mut feature =
        |name: &str, allowance: &Allowance, open: bool, status: String| match (open, allowance) {
            (false, _) => Ok(()),
            (true, Allowance::On { .. }) => {
                allowed.push(name.to_owned());
                Ok(())
            }
            (true, Allowance::Off) => Err(HostFitError::Posture {
                what: name.to_owned(),
                status,
            }),
        };
    feature(
        "hypervisor",
        &rules.hypervisor,
        facts.hypervisor,
        "it runs under a hypervisor: SMT and the vulnerabilities it reports are the guest's view"
            .into(),
    )?;
    feature(
        "smt",
        &rules.smt,
        facts.smt_active,
        "sibling hardware threads are active".into(),
    )?;
    feature(
        "unprivileged-bpf",
        &rules.unprivileged_bpf,
        facts.unprivileged_bpf_disabled == 0,
        "kernel.unprivileged_bpf_disabled is 0".into(),
    )?;
    for (name, status) in &facts.vulnerabilities {
        // Only the kernel's two settled answers pass — and a mitigation that still names
        // something vulnerable ("…; SMT vulnerable", "BHI: Vulnerable") is not settled;
        // "Vulnerable", "Unknown" and anything a newer kernel says need the policy's reason.
        let settled = status.starts_with("Not affected")
            || (status.starts_with("Mitigation")
                && !status.to_ascii_lowercase().contains("vulnerable"));
        if settled {
            continue;
        }
        if rules.accept_vulnerable.contains_key(name) {
            allowed.push(name.clone());
        } else {
            return Err(HostFitError::Posture {
                what: format!("CPU vulnerability {name}"),
                status: status.clone(),
            });
        }
    }
    Ok(Fit {
        demand,
        available,
        allowed,
    })
}

/// The `host` evidence of one judgement: what was read, and the fit or why it was refused.
///
/// # Errors
/// Encoding failed.
pub fn record(
    facts: &Facts,
    judged: &Result<Fit, HostFitError>,
) -> Result<String, cordon_canon::canonical::CanonicalError> {
    #[derive(Serialize)]
    struct Record<'a> {
        facts: &'a Facts,
        #[serde(skip_serializing_if = "Option::is_none")]
        fit: Option<&'a Fit>,
        #[serde(skip_serializing_if = "Option::is_none")]
        refused: Option<String>,
    }
    cordon_canon::canonical::to_canonical_json(&Record {
        facts,
        fit: judged.as_ref().ok(),
        refused: judged.as_ref().err().map(ToString::to_string),
    })
}

#[cfg(test)]
pub(crate) mod tests;
