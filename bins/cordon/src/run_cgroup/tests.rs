//! The run cgroup through the fake: what is written where, under each hierarchy, and that a
//! failure leaves nothing made behind.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Limits, prepare, remove_leftover};
use crate::host::HostRef;
use crate::host::fake::{Call, Fake};

fn all() -> Limits {
    Limits {
        cpus_milli: Some(1500),
        cpuset: Some("0".into()),
        memory_bytes: Some(64 << 20),
        pids: Some(32),
    }
}

fn writes(fake: &Fake) -> Vec<(String, String)> {
    fake.calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Write(p, v) => Some((p.display().to_string(), v)),
            _ => None,
        })
        .collect()
}

fn v1() -> Arc<Fake> {
    let fake = Arc::new(Fake::new());
    for c in ["memory", "pids", "cpu", "cpuset"] {
        fake.dir(format!("/cg/{c}"), &[]);
    }
    fake.file("/cg/cpuset/cpuset.cpus", "0-1\n")
        .file("/cg/cpuset/cpuset.mems", "0\n")
        .file("/cg/cpuset/cordon-surface/cpuset.cpus", "\n")
        .file("/cg/cpuset/cordon-surface/cpuset.mems", "\n");
    fake
}

#[test]
fn v1_makes_one_cgroup_per_limited_hierarchy_joins_checks_and_removes() {
    let fake = v1();
    let host: HostRef = fake.clone();
    let cg = prepare(&host, "/cg".as_ref(), "cordon-r1", &all()).unwrap();
    let w = writes(&fake);
    let at = |p: &str, v: &str| w.contains(&(format!("/cg/{p}"), v.to_owned()));
    assert!(at(
        "memory/cordon-surface/cordon-r1/memory.limit_in_bytes",
        "67108864"
    ));
    assert!(at(
        "memory/cordon-surface/cordon-r1/memory.memsw.limit_in_bytes",
        "67108864"
    ));
    assert!(at("pids/cordon-surface/cordon-r1/pids.max", "32"));
    assert!(at(
        "cpu/cordon-surface/cordon-r1/cpu.cfs_quota_us",
        "150000"
    ));
    assert!(at(
        "cpu/cordon-surface/cordon-r1/cpu.cfs_period_us",
        "100000"
    ));
    // The cpuset parent gets the hierarchy's set before the run's can be written.
    assert!(at("cpuset/cordon-surface/cpuset.cpus", "0-1"));
    assert!(at("cpuset/cordon-surface/cpuset.mems", "0"));
    assert!(at("cpuset/cordon-surface/cordon-r1/cpuset.cpus", "0"));
    assert!(at("cpuset/cordon-surface/cordon-r1/cpuset.mems", "0"));

    // Joined where /proc says so in every hierarchy; anywhere else is an error.
    fake.file(
        "/proc/42/cgroup",
        "8:pids:/cordon-surface/cordon-r1\n4:memory:/cordon-surface/cordon-r1\n3:cpuset:/cordon-surface/cordon-r1\n1:cpu:/cordon-surface/cordon-r1\n0::/\n",
    );
    cg.join(42).unwrap();
    assert!(writes(&fake).contains(&(
        "/cg/pids/cordon-surface/cordon-r1/cgroup.procs".into(),
        "42".into()
    )));
    fake.file(
        "/proc/43/cgroup",
        "8:pids:/cordon-surface/cordon-r1\n4:memory:/\n3:cpuset:/cordon-surface/cordon-r1\n1:cpu:/cordon-surface/cordon-r1\n",
    );
    let e = cg.join(43).unwrap_err();
    assert!(
        e.to_string().contains("not in /cordon-surface/cordon-r1"),
        "{e}"
    );

    cg.remove().unwrap();
    let removed: Vec<_> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::RemoveDir(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(removed.len(), 4, "{removed:?}");
    assert!(!removed.contains(&PathBuf::from("/cg/memory/cordon-surface")));
}

#[test]
fn v2_enables_the_controllers_and_writes_each_limit_in_one_cgroup() {
    let fake = Arc::new(Fake::new());
    fake.dir("/cg", &[])
        .file("/cg/cgroup.controllers", "cpuset cpu memory pids\n");
    let host: HostRef = fake.clone();
    let cg = prepare(&host, "/cg".as_ref(), "cordon-r2", &all()).unwrap();
    let w = writes(&fake);
    let at = |p: &str, v: &str| w.contains(&(format!("/cg/{p}"), v.to_owned()));
    assert!(at("cgroup.subtree_control", "+cpu +cpuset +memory +pids"));
    assert!(at(
        "cordon-surface/cgroup.subtree_control",
        "+cpu +cpuset +memory +pids"
    ));
    assert!(at("cordon-surface/cordon-r2/memory.max", "67108864"));
    assert!(at("cordon-surface/cordon-r2/memory.swap.max", "0"));
    assert!(at("cordon-surface/cordon-r2/pids.max", "32"));
    assert!(at("cordon-surface/cordon-r2/cpu.max", "150000 100000"));
    assert!(at("cordon-surface/cordon-r2/cpuset.cpus", "0"));
    fake.file("/proc/7/cgroup", "0::/cordon-surface/cordon-r2\n");
    cg.join(7).unwrap();
    fake.file("/proc/8/cgroup", "0::/user.slice\n");
    assert!(cg.join(8).is_err());
}

#[test]
fn a_refused_limit_or_an_existing_cgroup_is_an_error_and_nothing_made_stays() {
    // The kernel refuses the pids limit: the cgroups made so far are removed again.
    let fake = v1();
    fake.unreadable("/cg/pids/cordon-surface/cordon-r3/pids.max");
    let host: HostRef = fake.clone();
    let e = prepare(&host, "/cg".as_ref(), "cordon-r3", &all()).unwrap_err();
    assert!(e.to_string().contains("pids.max"), "{e}");
    let calls = fake.calls();
    for made in calls.iter().filter_map(|c| match c {
        Call::MakeDir(p) if p.ends_with("cordon-r3") => Some(p),
        _ => None,
    }) {
        assert!(
            calls.contains(&Call::RemoveDir(made.clone())),
            "{made:?} left"
        );
    }
    // A cgroup of the run's name already there is another's, or residue: never reused.
    let fake = v1();
    fake.dir("/cg/memory/cordon-surface", &[])
        .dir("/cg/memory/cordon-surface/cordon-r4", &[]);
    let host: HostRef = fake.clone();
    let limits = Limits {
        memory_bytes: Some(1 << 20),
        ..Limits::default()
    };
    let e = prepare(&host, "/cg".as_ref(), "cordon-r4", &limits).unwrap_err();
    assert!(
        e.to_string()
            .contains("make /cg/memory/cordon-surface/cordon-r4"),
        "{e}"
    );
    // An unknown hierarchy is an error before anything is made.
    let fake = Arc::new(Fake::new());
    fake.unreadable("/cg/cgroup.controllers");
    let host: HostRef = fake.clone();
    assert!(prepare(&host, "/cg".as_ref(), "cordon-r5", &limits).is_err());
    assert!(!fake.calls().iter().any(|c| matches!(c, Call::MakeDir(_))));
}

#[test]
fn a_leftover_is_removed_from_every_hierarchy_and_one_that_stays_is_an_error() {
    let fake = v1();
    let host: HostRef = fake.clone();
    remove_leftover(&*host, "/cg".as_ref(), "cordon-r6").unwrap();
    assert_eq!(
        fake.calls()
            .iter()
            .filter(|c| matches!(c, Call::RemoveDir(_)))
            .count(),
        8
    );
    fake.unreadable("/cg/pids/cordon-surface/cordon-r6");
    assert!(remove_leftover(&*host, "/cg".as_ref(), "cordon-r6").is_err());
}

/// A cgroup v2 tree in a temporary directory: the root and `svc` (delegated, holding `hub`).
fn delegation_tree(controllers: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let svc = dir.path().join("svc");
    std::fs::create_dir_all(svc.join("hub")).unwrap();
    std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    for f in ["cgroup.procs", "cgroup.subtree_control"] {
        std::fs::write(svc.join(f), "").unwrap();
    }
    std::fs::write(svc.join("cgroup.controllers"), controllers).unwrap();
    dir
}

#[test]
fn a_delegated_subtree_is_the_parent_of_this_process_cgroup_owned_by_the_user_with_the_controllers()
{
    use std::os::unix::fs::MetadataExt;
    let tree = delegation_tree("cpu memory pids\n");
    let uid = std::fs::metadata(tree.path()).unwrap().uid();
    let limits = Limits {
        memory_bytes: Some(1 << 30),
        pids: Some(64),
        ..Limits::default()
    };
    let host = crate::host::Linux;
    let at = super::delegated(&host, tree.path(), "0::/svc/hub\n", uid, &limits).unwrap();
    assert_eq!(at, "/svc");
    // The controllers the limits need are enabled for the runs' cgroups.
    let enabled = std::fs::read_to_string(tree.path().join("svc/cgroup.subtree_control")).unwrap();
    assert_eq!(enabled, "+memory +pids");

    // Each missing condition is a refusal that says what is missing.
    let refused = |self_cgroup: &str, uid: u32, limits: &Limits| {
        super::delegated(&host, tree.path(), self_cgroup, uid, limits).unwrap_err()
    };
    let hybrid = "4:memory:/svc/hub\n0::/svc/hub\n";
    assert!(refused(hybrid, uid, &limits).contains("v2 alone"));
    assert!(refused("0::/hub\n", uid, &limits).contains("no parent"));
    assert!(refused("0::/svc/hub\n", uid + 1, &limits).contains("Delegate=yes"));
    let cpuset = Limits {
        cpuset: Some("0".into()),
        ..Limits::default()
    };
    assert!(refused("0::/svc/hub\n", uid, &cpuset).contains("cpuset controller"));
    std::fs::remove_file(tree.path().join("cgroup.controllers")).unwrap();
    assert!(refused("0::/svc/hub\n", uid, &limits).contains("not the cgroup v2 hierarchy"));
}

#[test]
fn a_container_is_checked_in_its_cgroup_with_the_limits_asked_for() {
    let fake = Arc::new(Fake::new());
    fake.file("/cg/cgroup.controllers", "memory pids\n")
        .file("/cg/svc/cordon-r/memory.max", "1073741824\n")
        .file("/cg/svc/cordon-r/pids.max", "64\n")
        .file("/proc/9/cgroup", "0::/svc/cordon-r\n")
        .file("/proc/10/cgroup", "0::/svc/hub\n");
    let host: HostRef = fake.clone();
    let limits = Limits {
        memory_bytes: Some(1 << 30),
        pids: Some(64),
        ..Limits::default()
    };
    let check = |pid: u32, limits: &Limits| {
        super::check_placed(&host, "/cg".as_ref(), "/svc/cordon-r", pid, limits)
    };
    check(9, &limits).unwrap();
    assert!(check(10, &limits).is_err());
    let other = Limits {
        pids: Some(65),
        ..limits
    };
    assert!(
        check(9, &other)
            .unwrap_err()
            .to_string()
            .contains("pids.max")
    );
}
