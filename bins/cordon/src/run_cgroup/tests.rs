//! The run cgroup through the fake: what is written where, under each hierarchy, and that a
//! failure leaves nothing made behind.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Limits, prepare, remove_leftover};
use crate::host::HostRef;
use crate::host::fake::{Call, Fake};

const ACCOUNT: (u32, u32) = (3_100_007, 3_100_007);

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

/// The calls of kind `Give`, as (path, uid).
fn given(fake: &Fake) -> Vec<(String, u32)> {
    fake.calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Give(p, u) => Some((p.display().to_string(), u)),
            _ => None,
        })
        .collect()
}

#[test]
fn v1_makes_a_supervisor_and_a_limited_sandbox_per_hierarchy_joins_checks_and_removes() {
    let fake = v1();
    let host: HostRef = fake.clone();
    let cg = prepare(&host, "/cg".as_ref(), "cordon-r1", &all(), ACCOUNT).unwrap();
    let w = writes(&fake);
    let at = |p: &str, v: &str| w.contains(&(format!("/cg/{p}"), v.to_owned()));
    let sb = "cordon-surface/cordon-r1/sandbox";
    assert!(at(
        &format!("memory/{sb}/memory.limit_in_bytes"),
        "67108864"
    ));
    assert!(at(
        &format!("memory/{sb}/memory.memsw.limit_in_bytes"),
        "67108864"
    ));
    assert!(at(&format!("pids/{sb}/pids.max"), "32"));
    assert!(at(&format!("cpu/{sb}/cpu.cfs_quota_us"), "150000"));
    assert!(at(&format!("cpu/{sb}/cpu.cfs_period_us"), "100000"));
    // No limit anywhere but the sandbox.
    assert!(
        w.iter()
            .filter(|(p, _)| p.contains("limit") || p.contains("max") || p.contains("quota"))
            .all(|(p, _)| p.contains("/sandbox/")),
        "{w:?}"
    );
    // Every cpuset level above the sandbox gets the hierarchy's set, the sandbox its policy's.
    assert!(at("cpuset/cordon-surface/cpuset.cpus", "0-1"));
    assert!(at("cpuset/cordon-surface/cordon-r1/cpuset.cpus", "0-1"));
    assert!(at(
        "cpuset/cordon-surface/cordon-r1/supervisor/cpuset.mems",
        "0"
    ));
    assert!(at(&format!("cpuset/{sb}/cpuset.cpus"), "0"));
    assert!(at(&format!("cpuset/{sb}/cpuset.mems"), "0"));
    // The account may move into the sandbox, in each hierarchy, and nowhere else.
    let g = given(&fake);
    assert_eq!(g.len(), 4, "{g:?}");
    assert!(
        g.iter()
            .all(|(p, u)| p.ends_with("/sandbox/cgroup.procs") && *u == ACCOUNT.0),
        "{g:?}"
    );

    // Joined to the supervisor where /proc says so in every hierarchy; anywhere else is an
    // error.
    let sup = "/cordon-surface/cordon-r1/supervisor";
    fake.file(
        "/proc/42/cgroup",
        &format!("8:pids:{sup}\n4:memory:{sup}\n3:cpuset:{sup}\n1:cpu:{sup}\n0::/\n"),
    );
    cg.join(42).unwrap();
    assert!(writes(&fake).contains(&(format!("/cg/pids{sup}/cgroup.procs"), "42".into())));
    fake.file(
        "/proc/43/cgroup",
        &format!("8:pids:{sup}\n4:memory:/\n3:cpuset:{sup}\n1:cpu:{sup}\n"),
    );
    let e = cg.join(43).unwrap_err();
    assert!(e.to_string().contains(&format!("not in {sup}")), "{e}");

    // The account's side: the sandbox's init moved into the sandbox, checked the same way.
    let sandbox = "/cordon-surface/cordon-r1/sandbox";
    fake.file(
        "/proc/44/cgroup",
        &format!("8:pids:{sandbox}\n4:memory:{sandbox}\n3:cpuset:{sandbox}\n1:cpu:{sandbox}\n"),
    );
    super::enter_sandbox(&*host, "/cg".as_ref(), "cordon-r1", &all(), 44).unwrap();
    assert!(writes(&fake).contains(&(format!("/cg/memory{sandbox}/cgroup.procs"), "44".into())));
    let e = super::enter_sandbox(&*host, "/cg".as_ref(), "cordon-r1", &all(), 42)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("process 42 is not in /cordon-surface/cordon-r1/sandbox"),
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
    assert_eq!(removed.len(), 12, "{removed:?}");
    // Children first, never the shared parent.
    assert!(removed[0].ends_with("sandbox") && removed[11].ends_with("cordon-r1"));
    assert!(!removed.contains(&PathBuf::from("/cg/memory/cordon-surface")));
}

#[test]
fn v2_enables_the_controllers_to_the_sandbox_and_writes_each_limit_there() {
    let fake = Arc::new(Fake::new());
    fake.dir("/cg", &[])
        .file("/cg/cgroup.controllers", "cpuset cpu memory pids\n");
    let host: HostRef = fake.clone();
    let cg = prepare(&host, "/cg".as_ref(), "cordon-r2", &all(), ACCOUNT).unwrap();
    let w = writes(&fake);
    let at = |p: &str, v: &str| w.contains(&(format!("/cg/{p}"), v.to_owned()));
    let every = "+cpu +cpuset +memory +pids";
    assert!(at("cgroup.subtree_control", every));
    assert!(at("cordon-surface/cgroup.subtree_control", every));
    assert!(at("cordon-surface/cordon-r2/cgroup.subtree_control", every));
    let sb = "cordon-surface/cordon-r2/sandbox";
    assert!(at(&format!("{sb}/memory.max"), "67108864"));
    assert!(at(&format!("{sb}/memory.swap.max"), "0"));
    assert!(at(&format!("{sb}/pids.max"), "32"));
    assert!(at(&format!("{sb}/cpu.max"), "150000 100000"));
    assert!(at(&format!("{sb}/cpuset.cpus"), "0"));
    // The moves' destination and their common ancestor are the account's; nothing else.
    assert_eq!(
        given(&fake),
        [
            (format!("/cg/{sb}/cgroup.procs"), ACCOUNT.0),
            (
                "/cg/cordon-surface/cordon-r2/cgroup.procs".into(),
                ACCOUNT.0
            ),
        ]
    );
    fake.file(
        "/proc/7/cgroup",
        "0::/cordon-surface/cordon-r2/supervisor\n",
    );
    cg.join(7).unwrap();
    fake.file("/proc/8/cgroup", "0::/user.slice\n");
    let e = cg.join(8).unwrap_err().to_string();
    assert!(
        e.contains("process 8 is not in /cordon-surface/cordon-r2/supervisor"),
        "{e}"
    );
    fake.file("/proc/9/cgroup", "0::/cordon-surface/cordon-r2/sandbox\n");
    super::enter_sandbox(&*host, "/cg".as_ref(), "cordon-r2", &all(), 9).unwrap();
    let e = super::enter_sandbox(&*host, "/cg".as_ref(), "cordon-r2", &all(), 7)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("process 7 is not in /cordon-surface/cordon-r2/sandbox"),
        "{e}"
    );
}

#[test]
fn a_refused_limit_or_an_existing_cgroup_is_an_error_and_nothing_made_stays() {
    // The kernel refuses the pids limit: the cgroups made so far are removed again.
    let fake = v1();
    fake.unreadable("/cg/pids/cordon-surface/cordon-r3/sandbox/pids.max");
    let host: HostRef = fake.clone();
    let e = prepare(&host, "/cg".as_ref(), "cordon-r3", &all(), ACCOUNT).unwrap_err();
    assert!(e.to_string().contains("pids.max"), "{e}");
    let calls = fake.calls();
    for made in calls.iter().filter_map(|c| match c {
        Call::MakeDir(p) if p.to_string_lossy().contains("cordon-r3") => Some(p),
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
    let e = prepare(&host, "/cg".as_ref(), "cordon-r4", &limits, ACCOUNT).unwrap_err();
    assert!(
        e.to_string()
            .contains("make /cg/memory/cordon-surface/cordon-r4"),
        "{e}"
    );
    // An unknown hierarchy is an error before anything is made.
    let fake = Arc::new(Fake::new());
    fake.unreadable("/cg/cgroup.controllers");
    let host: HostRef = fake.clone();
    let e = prepare(&host, "/cg".as_ref(), "cordon-r5", &limits, ACCOUNT)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("read /cg/cgroup.controllers: injected failure"),
        "{e}"
    );
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
        // Three levels on each of the fourteen controllers and the hybrid host's two trees.
        48
    );
    fake.unreadable("/cg/pids/cordon-surface/cordon-r6");
    let e = remove_leftover(&*host, "/cg".as_ref(), "cordon-r6")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("remove /cg/pids/cordon-surface/cordon-r6: injected failure"),
        "{e}"
    );
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
    let mount = |opts: &str| {
        format!(
            "30 20 0:26 / {} rw,nosuid - cgroup2 cgroup2 {opts}\n",
            tree.path().display()
        )
    };
    let mountinfo = mount("rw,nsdelegate,memory_recursiveprot");
    let at = super::delegated(
        &host,
        tree.path(),
        ("0::/svc/hub\n", &mountinfo),
        uid,
        &limits,
    )
    .unwrap();
    assert_eq!(at, "/svc");
    // The controllers the limits need are enabled for the runs' cgroups.
    let enabled = std::fs::read_to_string(tree.path().join("svc/cgroup.subtree_control")).unwrap();
    assert_eq!(enabled, "+memory +pids");

    // Each missing condition is a refusal that says what is missing.
    let refused = |self_cgroup: &str, uid: u32, limits: &Limits| {
        super::delegated(&host, tree.path(), (self_cgroup, &mountinfo), uid, limits).unwrap_err()
    };
    // Without nsdelegate a run could write its own limit files.
    let plain = mount("rw");
    let e = super::delegated(&host, tree.path(), ("0::/svc/hub\n", &plain), uid, &limits);
    assert!(e.unwrap_err().contains("nsdelegate"));
    // Each of the delegation's files must be the user's.
    for f in ["cgroup.procs", "cgroup.subtree_control"] {
        let p = tree.path().join("svc").join(f);
        std::os::unix::fs::chown(&p, Some(uid + 1), None).unwrap();
        assert!(refused("0::/svc/hub\n", uid, &limits).contains(f));
        std::os::unix::fs::chown(&p, Some(uid), None).unwrap();
    }
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
        .file("/cg/svc/cordon-r/memory.swap.max", "0\n")
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
    let e = check(10, &limits).unwrap_err().to_string();
    assert!(e.contains("process 10 is not in /svc/cordon-r"), "{e}");
    let other = Limits {
        pids: Some(65),
        ..limits.clone()
    };
    assert!(
        check(9, &other)
            .unwrap_err()
            .to_string()
            .contains("pids.max")
    );
    let other = Limits {
        memory_bytes: Some(1 << 29),
        ..limits.clone()
    };
    assert!(
        check(9, &other)
            .unwrap_err()
            .to_string()
            .contains("memory.max")
    );
    // Swap not bounded (the runtime skips it where the file is missing, or wrote another value).
    fake.file("/cg/svc/cordon-r/memory.swap.max", "max\n");
    assert!(check(9, &limits).unwrap_err().to_string().contains("swap"));
}
