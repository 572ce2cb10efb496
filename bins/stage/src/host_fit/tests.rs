//! The host checks: each fact read through the fake host, each rule refused at its boundary and
//! passed with only its allowance added, and the real host's facts read and judged the way an
//! independent reading of `/sys` says they should be.

use std::sync::Arc;

use cordon::host::fake::Fake;

use super::*;

const GIB: u64 = 1 << 30;

/// Read and judge, as the session does.
fn check(policy: &Policy, kind: StageKind, host: &dyn Host) -> Result<Fit, HostFitError> {
    judge(policy, kind, &read(host)?)
}

/// A copy's worst case: bytes, a page per file, an inode per file and per directory above it.
fn worst(bytes: u64, files: u64, depth: u64) -> u64 {
    bytes + files * (4096 + (depth + 1) * 1024)
}

use crate::session::tests::policy;

/// The default policy without its prebuild stage and build steps: nothing bounds a
/// publication copy (shared with the session's tests).
pub(crate) fn without_prebuild() -> Policy {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../policy/evaluator.kdl"
    ))
    .unwrap();
    let block = |name: &str| {
        let start = text.find(name).unwrap();
        (start, start + text[start..].find("\n}\n").unwrap() + 3)
    };
    let (stage, stage_end) = block("stage \"prebuild\"");
    let mut without = format!("{}{}", &text[..stage], &text[stage_end..]);
    // Every patcher (a step of the prebuild stage) goes with it.
    while let Some(at) = without.find(" stage=\"prebuild\"") {
        let start = without[..at].rfind("\nstep ").unwrap() + 1;
        let end = start + without[start..].find("\n}\n").unwrap() + 3;
        without.replace_range(start..end, "");
    }
    cordon_policy_lang::parse("without-prebuild.kdl", &without).unwrap()
}

/// A policy whose host block is `block` (the shipped one's replaced).
fn with_host(block: &str) -> Policy {
    policy(|t| {
        let start = t.find("host {").unwrap();
        let end = start + t[start..].find("\n}\n").unwrap() + 3;
        format!("{}{block}\n{}", &t[..start], &t[end..])
    })
}

/// A host with `mem_kb` of memory, SMT off, unprivileged BPF off, and these vulnerabilities.
fn fake(mem_kb: u64, vulnerabilities: &[(&str, &str)]) -> Arc<Fake> {
    let f = Arc::new(Fake::new());
    f.file(
        MEMINFO,
        &format!("MemTotal:       {mem_kb} kB\nMemFree:        1 kB\n"),
    )
    .file(SMT_ACTIVE, "0\n")
    .file(UNPRIVILEGED_BPF, "2\n")
    .file(
        CPUINFO,
        "processor\t: 0\nflags\t\t: fpu vme sse2\nbugs\t\t: spectre_v1\n",
    );
    f.dir(VULNERABILITIES, &[]);
    for (name, status) in vulnerabilities {
        f.file(format!("{VULNERABILITIES}/{name}"), &format!("{status}\n"));
    }
    f
}

const SETTLED: &[(&str, &str)] = &[
    ("meltdown", "Not affected"),
    ("spectre_v2", "Mitigation: Retpolines; STIBP: disabled"),
];

#[test]
fn a_lane_needs_its_memory_limit_and_both_copies_and_a_prebuild_its_limit_and_the_tree() {
    let p = policy(|t| t);
    let t = p.tree_rules();
    let tree = worst(t.max_total_bytes, t.max_files, t.max_depth);
    let pl = p
        .stage(StageKind::Prebuild)
        .and_then(|s| s.publication.as_ref())
        .unwrap();
    let publication = worst(pl.max_bytes, pl.max_files, pl.max_depth);
    let mem = |k| p.stage(k).unwrap().memory_bytes.unwrap();
    assert_eq!(
        demand(&p, StageKind::Lane).unwrap(),
        (mem(StageKind::Lane), tree + publication)
    );
    assert_eq!(
        demand(&p, StageKind::Reference).unwrap(),
        (mem(StageKind::Reference), tree + publication)
    );
    assert_eq!(
        demand(&p, StageKind::Prebuild).unwrap(),
        (mem(StageKind::Prebuild), tree)
    );
    // A publication copy with no prebuild stage to bound it is refused, not counted as zero.
    let p = without_prebuild();
    assert!(matches!(
        demand(&p, StageKind::Lane),
        Err(HostFitError::Unbounded {
            role: MountSource::Publication,
            ..
        })
    ));
}

#[test]
fn memory_is_refused_one_byte_past_the_host_less_its_reserve() {
    let p = with_host("host {\n    memory-reserve \"1GiB\"\n}");
    let (limit, copies) = demand(&p, StageKind::Lane).unwrap();
    let exact = limit + copies + GIB;
    assert_eq!(exact % 1024, 0);
    let fit = check(&p, StageKind::Lane, &*fake(exact / 1024, SETTLED)).unwrap();
    assert_eq!(
        (fit.demand, fit.available),
        (limit + copies, limit + copies)
    );
    assert!(fit.allowed.is_empty());
    let e = check(&p, StageKind::Lane, &*fake(exact / 1024 - 1, SETTLED)).unwrap_err();
    assert!(
        matches!(e, HostFitError::Memory { demand, reserve, .. } if demand == limit + copies && reserve == GIB),
        "{e}"
    );
    // The reserve is the policy's: a larger one refuses the same host.
    let p = with_host("host {\n    memory-reserve \"2GiB\"\n}");
    assert!(matches!(
        check(&p, StageKind::Lane, &*fake(exact / 1024, SETTLED)),
        Err(HostFitError::Memory { .. })
    ));
}

const ROOMY: u64 = 1 << 40;

#[test]
fn smt_and_unprivileged_bpf_are_refused_unless_the_policy_allows_them_with_a_reason() {
    let strict = with_host("host {\n}");
    let smt = fake(ROOMY, SETTLED);
    smt.file(SMT_ACTIVE, "1\n");
    let e = check(&strict, StageKind::Prebuild, &*smt).unwrap_err();
    assert!(
        matches!(&e, HostFitError::Posture { what, .. } if what == "smt"),
        "{e}"
    );
    let allowed = with_host("host {\n    smt \"on\" reason=\"a dedicated host\"\n}");
    let fit = check(&allowed, StageKind::Prebuild, &*smt).unwrap();
    assert_eq!(fit.allowed, ["smt"]);
    assert!(read(&*smt).unwrap().smt_active);

    let bpf = fake(ROOMY, SETTLED);
    bpf.file(UNPRIVILEGED_BPF, "0\n");
    let e = check(&strict, StageKind::Prebuild, &*bpf).unwrap_err();
    assert!(
        matches!(&e, HostFitError::Posture { what, .. } if what == "unprivileged-bpf"),
        "{e}"
    );
    let allowed = with_host("host {\n    unprivileged-bpf \"on\" reason=\"an old kernel\"\n}");
    assert_eq!(
        check(&allowed, StageKind::Prebuild, &*bpf).unwrap().allowed,
        ["unprivileged-bpf"]
    );
    // 1 and 2 are both "off".
    bpf.file(UNPRIVILEGED_BPF, "1\n");
    assert!(check(&strict, StageKind::Prebuild, &*bpf).is_ok_and(|f| f.allowed.is_empty()));
}

#[test]
fn only_settled_vulnerabilities_pass_and_each_other_needs_its_own_acceptance() {
    let strict = with_host("host {\n}");
    for status in [
        "Vulnerable",
        "Vulnerable: Safe RET, no microcode",
        "Unknown: Dependent on hypervisor status",
        "",
        "something a newer kernel says",
    ] {
        let host = fake(ROOMY, &[SETTLED[0], ("spec_store_bypass", status)]);
        let e = check(&strict, StageKind::Lane, &*host).unwrap_err();
        assert!(
            matches!(&e, HostFitError::Posture { what, status: s } if what == "CPU vulnerability spec_store_bypass" && s == status),
            "{status:?}: {e}"
        );
        // Accepting another one does not accept it.
        let other = with_host("host {\n    accept-vulnerable \"mds\" reason=\"not this one\"\n}");
        assert!(matches!(
            check(&other, StageKind::Lane, &*host),
            Err(HostFitError::Posture { what, .. }) if what == "CPU vulnerability spec_store_bypass"
        ));
        let accepted = with_host(
            "host {\n    accept-vulnerable \"spec_store_bypass\" reason=\"one candidate at a time\"\n}",
        );
        let fit = check(&accepted, StageKind::Lane, &*host).unwrap();
        assert_eq!(fit.allowed, ["spec_store_bypass"]);
        assert_eq!(
            read(&*host).unwrap().vulnerabilities["spec_store_bypass"],
            status
        );
    }
}

#[test]
fn a_fact_that_cannot_be_read_is_refused_never_assumed_fine() {
    let p = with_host(
        "host {\n    smt \"on\" reason=\"r\"\n    unprivileged-bpf \"on\" reason=\"r\"\n}",
    );
    for path in [
        MEMINFO,
        SMT_ACTIVE,
        UNPRIVILEGED_BPF,
        VULNERABILITIES,
        "/sys/devices/system/cpu/vulnerabilities/meltdown",
    ] {
        let host = fake(ROOMY, SETTLED);
        host.unreadable(path);
        let e = check(&p, StageKind::Prebuild, &*host).unwrap_err();
        assert!(
            matches!(&e, HostFitError::Unreadable { path: p, .. } if p == path),
            "{path}: {e}"
        );
    }
    // Present but not what the kernel writes.
    for (path, text) in [
        (MEMINFO, "MemFree: 1 kB\n"),
        (MEMINFO, "MemTotal: 12 MB\n"),
        (MEMINFO, "MemTotal: 99999999999999999999 kB\n"),
        (SMT_ACTIVE, "2\n"),
        (UNPRIVILEGED_BPF, "off\n"),
    ] {
        let host = fake(ROOMY, SETTLED);
        host.file(path, text);
        let e = check(&p, StageKind::Prebuild, &*host).unwrap_err();
        assert!(
            matches!(e, HostFitError::Unreadable { .. }),
            "{text:?}: {e}"
        );
    }
}

#[test]
fn a_hypervisor_is_refused_unless_allowed_and_the_huge_page_pool_is_not_the_hosts_to_give() {
    let strict = with_host("host {\n}");
    let vm = fake(ROOMY, SETTLED);
    vm.file(
        CPUINFO,
        "processor\t: 0\nflags\t\t: fpu hypervisor sse2\nprocessor\t: 1\n",
    );
    let e = check(&strict, StageKind::Prebuild, &*vm).unwrap_err();
    assert!(
        matches!(&e, HostFitError::Posture { what, .. } if what == "hypervisor"),
        "{e}"
    );
    let allowed = with_host("host {\n    hypervisor \"on\" reason=\"a cloud guest\"\n}");
    assert_eq!(
        check(&allowed, StageKind::Prebuild, &*vm).unwrap().allowed,
        ["hypervisor"]
    );
    // A word that only contains it is not the flag; no flags line cannot be established.
    vm.file(CPUINFO, "flags\t\t: fpu hypervisor_x sse2\n");
    check(&strict, StageKind::Prebuild, &*vm).unwrap();
    vm.file(CPUINFO, "processor\t: 0\n");
    assert!(matches!(
        check(&strict, StageKind::Prebuild, &*vm),
        Err(HostFitError::Unreadable { .. })
    ));
    // The huge-page pool is subtracted: the same MemTotal with a pool is refused.
    let p = with_host("host {\n    memory-reserve \"1GiB\"\n}");
    let (limit, copies) = demand(&p, StageKind::Prebuild).unwrap();
    let kb = (limit + copies + GIB) / 1024;
    let host = fake(kb, SETTLED);
    check(&p, StageKind::Prebuild, &*host).unwrap();
    host.file(
        MEMINFO,
        &format!("MemTotal:       {kb} kB\nHugetlb:        2048 kB\n"),
    );
    let e = check(&p, StageKind::Prebuild, &*host).unwrap_err();
    assert!(matches!(e, HostFitError::Memory { .. }), "{e}");
}

#[test]
fn a_mitigation_that_still_names_something_vulnerable_is_not_settled() {
    let strict = with_host("host {\n}");
    for status in [
        "Mitigation: PTE Inversion; VMX: SMT vulnerable",
        "Mitigation: Retpolines; STIBP: disabled; BHI: Vulnerable",
    ] {
        let host = fake(ROOMY, &[("l1tf", status)]);
        assert!(
            matches!(
                check(&strict, StageKind::Lane, &*host),
                Err(HostFitError::Posture { .. })
            ),
            "{status}"
        );
    }
    let host = fake(
        ROOMY,
        &[(
            "l1tf",
            "Mitigation: PTE Inversion; VMX: flush not necessary, SMT disabled",
        )],
    );
    check(&strict, StageKind::Lane, &*host).unwrap();
}

#[test]
fn the_record_keeps_the_facts_with_the_fit_or_the_refusal() {
    let p = with_host("host {\n}");
    let host = fake(ROOMY, &[("mds", "Vulnerable")]);
    let facts = read(&*host).unwrap();
    let judged = judge(&p, StageKind::Lane, &facts);
    let text = record(&facts, &judged).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["facts"]["vulnerabilities"]["mds"], "Vulnerable");
    assert!(v["refused"].as_str().unwrap().contains("mds"), "{text}");
    assert!(v.get("fit").is_none());
    let host = fake(ROOMY, SETTLED);
    let facts = read(&*host).unwrap();
    let text = record(&facts, &judge(&p, StageKind::Lane, &facts)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["fit"]["demand"].as_u64().unwrap() > 0 && v.get("refused").is_none());
}

/// The real host (no fake): it reads the kernel's own files, so it runs with the root tier.
mod root_tests {
    use super::*;

    /// The real host, read through the real seam: the facts match an independent reading of the
    /// kernel's files, and the strict policy refuses exactly when one of them is open.
    #[test]
    fn the_real_hosts_facts_are_read_and_judged_as_the_kernel_reports_them() {
        let facts = read(&cordon::host::Linux).unwrap();
        let dir = Path::new(VULNERABILITIES);
        let mut unsettled = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let status = std::fs::read_to_string(e.path()).unwrap();
            let status = status.lines().next().unwrap_or("").trim().to_owned();
            let settled = status.starts_with("Not affected")
                || (status.starts_with("Mitigation")
                    && !status.to_ascii_lowercase().contains("vulnerable"));
            if !settled {
                unsettled.push(name.clone());
            }
            assert_eq!(facts.vulnerabilities[&name], status);
        }
        assert_eq!(
            facts.smt_active,
            std::fs::read_to_string(SMT_ACTIVE).unwrap().trim() == "1"
        );
        let mut strict = String::from(
            "host {\n    memory-reserve \"256MiB\"\n    hypervisor \"on\" reason=\"r\"\n    smt \"on\" reason=\"r\"\n    unprivileged-bpf \"on\" reason=\"r\"\n",
        );
        let tiny = |t: String| {
            t.replace("memory \"8GiB\"", "memory \"256MiB\"")
                .replace("memory=\"6GiB\"", "memory=\"64MiB\"")
                .replace("max-total-bytes \"4GiB\"", "max-total-bytes \"64MiB\"")
        };
        let p = policy(|t| {
            let t = tiny(t);
            let start = t.find("host {").unwrap();
            let end = start + t[start..].find("\n}\n").unwrap() + 3;
            format!("{}{strict}}}\n{}", &t[..start], &t[end..])
        });
        let judged = judge(&p, StageKind::Prebuild, &facts);
        assert_eq!(judged.is_err(), !unsettled.is_empty(), "{judged:?}");
        for name in &unsettled {
            strict.push_str(&format!("    accept-vulnerable \"{name}\" reason=\"r\"\n"));
        }
        let p = policy(|t| {
            let t = tiny(t);
            let start = t.find("host {").unwrap();
            let end = start + t[start..].find("\n}\n").unwrap() + 3;
            format!("{}{strict}}}\n{}", &t[..start], &t[end..])
        });
        let fit = judge(&p, StageKind::Prebuild, &facts).unwrap();
        assert_eq!(
            fit.allowed.iter().filter(|a| unsettled.contains(a)).count(),
            unsettled.len()
        );
    }
}
