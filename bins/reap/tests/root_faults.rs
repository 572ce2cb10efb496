//! Fault injection: the supervising process is SIGKILLed at each lifecycle point — after the
//! record, after the account, after create, after start, while waiting, during release — and
//! every time startup recovery then leaves the executor quiescent. Also: a runtime whose delete
//! fails, and a record that is a symbolic link, give a no-decision.
//!
//! The supervisor is this test binary itself, re-executed with `CORDON_FAULT_AT` naming the
//! point: the child does the lifecycle up to that point and kills itself with SIGKILL, so no
//! destructor and no cleanup runs — exactly what a crash leaves.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon::host::fake::Interposed;
use cordon::lease::{Lease, Leftover, Manager, Setup};
use cordon::runtime::OutputCaps;
use cordon::store::Store;
use cordon_policy_lang::{MountSource, StageKind};
use cordon_stage::bundle::{self, RunInputs};
use cordon_testkit::workspace_root;

const POINTS: [&str; 7] = [
    "after-record",
    "after-account",
    "after-staging",
    "after-create",
    "after-start",
    "while-waiting",
    "during-release",
];

fn policy() -> cordon_policy_lang::Policy {
    let text = std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap();
    cordon_policy_lang::parse("evaluator.kdl", &text).unwrap()
}

fn setup(dir: &Path, slot: u32) -> Setup {
    let mut s = cordon_stage::settings::lease_setup(
        &policy(),
        "faults",
        &dir.join("state"),
        dir.join("run"),
    );
    s.watchdog = cordon_testkit::watchdog();
    s.runtime.binary = cordon_testkit::test_runtime().1;
    s.lock_dir = dir.join("locks");
    s.accounts.uids = cordon_testkit::account_range("reap-faults", slot);
    s.accounts.gids = s.accounts.uids;
    s.accounts.cron_deny = dir.join("cron.deny");
    s.accounts.at_deny = dir.join("at.deny");
    s
}

/// A minimal bundle: busybox as the root, `sleep` as the workload.
fn write_bundle(dir: &Path, m: &Manager, lease: &mut Lease, script: &str) {
    let rootfs = dir.join("rootfs");
    if !rootfs.exists() {
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        for d in [
            "proc",
            "dev",
            "tmp",
            "engine",
            "staging",
            "cordon/child/memory",
            "cordon/child/pids",
            "cordon/child/cpu",
        ] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        for a in ["sh", "sleep"] {
            std::fs::copy(cordon_testkit::busybox(), rootfs.join("bin").join(a)).unwrap();
        }
    }
    let tree = dir.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    for area in [bundle::STAGING_DIR, bundle::TMP_DIR] {
        std::fs::create_dir_all(lease.run_dir().join(area)).unwrap();
    }
    let p = policy();
    let argv = vec!["/bin/sh".into(), "-c".into(), script.into()];
    let mut inputs = RunInputs::for_lease(lease, argv, rootfs);
    inputs.sources.insert(MountSource::Tree, tree);
    inputs.cgroups = Some(bundle::Cgroups::V1(cordon::run_cgroup::ROOT.into()));
    let planned = bundle::plan(&p, StageKind::Prebuild, &inputs).unwrap();
    // The patcher's bounded child, as the session prepares it: a supervisor killed after this
    // leaves it for recovery to remove, before its parent.
    if let Some(child) = &planned.child {
        cordon_stage::session::prepare_child(&cordon::host::Linux, child).unwrap();
    }
    // The session copies store trees into the lease; these tests run without a session.
    for m in &planned.host_mounts {
        if let bundle::HostMount::Copy { target, source } = m {
            cordon_testkit::copy_tree(source, target);
        }
    }
    let json = cordon::canonical::to_canonical_json(&planned.spec).unwrap();
    m.write_protected(lease, "config.json", json.as_bytes())
        .unwrap();
}

fn die() -> ! {
    nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL).unwrap();
    unreachable!("SIGKILL cannot be caught")
}

const CAPS: OutputCaps = OutputCaps {
    stdout: 4096,
    stderr: 4096,
};

/// The child: run the lifecycle up to `point`, then die without cleaning up.
fn child(point: &str, dir: &Path) -> ! {
    let store = Store::open(&dir.join("store")).unwrap();
    let mut s = setup(dir, 0);
    if point == "during-release" {
        // Killed at a known step of the release, never after a guessed delay: as it removes
        // the run account, its container already deleted.
        s.runtime.host = Arc::new(Interposed::new().rewriting_spawns(|tool| {
            if tool.program.ends_with("userdel") {
                die();
            }
            tool.clone()
        }));
    }
    let m = Manager::open(&store, s).unwrap();
    // The staging point's lease names its mount, as a session's does.
    let mounts: &[&str] = if point == "after-staging" {
        &[bundle::STAGING_DIR]
    } else {
        &[]
    };
    let mut lease = m
        .begin_with("sha256:faults", mounts, cordon_testkit::in_an_hour())
        .unwrap();
    if point == "after-record" {
        die();
    }
    m.provision(&lease).unwrap();
    if point == "after-account" {
        die();
    }
    if point == "after-staging" {
        let point = lease.run_dir().join(bundle::STAGING_DIR);
        m.mount_tmpfs(&lease, &point, 1 << 20, Some(64)).unwrap();
        die();
    }
    write_bundle(dir, &m, &mut lease, "sleep 60");
    if point == "after-create" {
        // stdio to /dev/null: the created init inherits runc's stdio and would hold a pipe.
        let rt = m.runtime();
        let ok = Command::new(&rt.binary)
            .arg("--root")
            .arg(&rt.state_root)
            .args(["create", "--bundle"])
            .arg(lease.bundle_dir())
            .arg(lease.container())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success());
        die();
    }
    if point == "during-release" {
        let r = lease.record.clone();
        let _ = m.run(
            &lease,
            Instant::now() + Duration::from_millis(100),
            CAPS,
            None,
        );
        let _ = m.release(&r);
        panic!("the release never removed the run account");
    }
    // after-start and while-waiting: the parent kills this process once the container runs.
    let _ = m.run(&lease, Instant::now() + Duration::from_secs(60), CAPS, None);
    die();
}

/// Whether the supervisor `pid` has a child and none of its children is the runtime (`runc`
/// create, start or another call): the container's init, reparented to its subreaper, is all
/// it waits for.
fn only_the_init_left(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let children: Vec<String> = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    !children.is_empty()
        && children.iter().all(|c| {
            std::fs::read_to_string(format!("/proc/{c}/comm"))
                .is_ok_and(|comm| !comm.starts_with("runc"))
        })
}

fn container_status(setup: &Setup) -> Option<String> {
    let out = setup.runtime.call(&["list", "-f", "json"]).ok()?;
    let list: Option<Vec<serde_json::Value>> = serde_json::from_slice(&out).ok()?;
    list?
        .first()
        .and_then(|c| c["status"].as_str().map(str::to_owned))
}

#[test]
fn a_supervisor_killed_at_any_point_leaves_nothing_recovery_cannot_remove() {
    let dir_env = std::env::var_os("CORDON_FAULT_DIR");
    if let (Ok(point), Some(dir)) = (std::env::var("CORDON_FAULT_AT"), dir_env) {
        child(&point, Path::new(&dir));
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: real containers and accounts"
    );
    let _ = cordon_testkit::runc();
    let _ = cordon_testkit::busybox();
    for point in POINTS {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let s = setup(dir.path(), 0);
        // Clear what an earlier crashed run of this very test may have left in the range.
        Manager::open(&store, s.clone()).unwrap().recover().unwrap();
        let mut c = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_supervisor_killed_at_any_point_leaves_nothing_recovery_cannot_remove",
                "--nocapture",
            ])
            .env("CORDON_FAULT_AT", point)
            .env("CORDON_FAULT_DIR", dir.path())
            .spawn()
            .unwrap();
        if matches!(point, "after-start" | "while-waiting") {
            let t = Instant::now();
            while container_status(&s).as_deref() != Some("running") {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "{point}: the container never ran"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            if point == "while-waiting" {
                // Its runtime calls over: what is left of the supervisor's work is the wait.
                while !only_the_init_left(c.id()) {
                    assert!(
                        t.elapsed() < Duration::from_secs(30),
                        "{point}: the supervisor never reached its wait"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            c.kill().unwrap();
        }
        let status = c.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(nix::libc::SIGKILL),
            "{point}: the supervisor must have been killed at its point, not finished or \
             failed ({status})"
        );
        let m = Manager::open(&store, s.clone()).unwrap();
        let before = m.check().unwrap();
        if point != "during-release" {
            assert!(
                !before.is_empty(),
                "{point}: the crash should have left something to recover"
            );
        }
        if point == "after-staging" {
            assert!(
                before.iter().any(
                    |l| matches!(l, Leftover::Mount { path } if path.contains(bundle::STAGING_DIR))
                ),
                "{point}: the staging mount is residue: {before:?}"
            );
        }
        m.recover()
            .unwrap_or_else(|e| panic!("{point}: recovery failed: {e}"));
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(&dir.path().join("run").display().to_string()),
            "{point}: a mount under the run root is left: {mounts}"
        );
        let left = m.check().unwrap();
        assert!(
            left.is_empty(),
            "{point}: not quiescent after recovery: {left:?}"
        );
        // Nothing of the executor is left in the cgroup tree, its own parent included.
        let parent = cordon::lease::cgroup_parent(&s.executor);
        let parent = parent.trim_start_matches('/');
        let mut places = vec![s.cgroup_root.join(parent)];
        for hierarchy in std::fs::read_dir(&s.cgroup_root)
            .unwrap()
            .filter_map(Result::ok)
        {
            places.push(hierarchy.path().join(parent));
        }
        for place in places {
            assert!(!place.exists(), "{point}: {} is left", place.display());
        }
    }
}

#[test]
fn a_linked_or_corrupt_record_stops_recovery_and_a_failing_delete_is_residue() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: real accounts"
    );
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let s = setup(dir.path(), 1);
    let m = Manager::open(&store, s.clone()).unwrap();
    let lease = m
        .begin("sha256:faults", cordon_testkit::in_an_hour())
        .unwrap();
    let record = store.path("leases", &format!("{}.json", lease.record.lease));
    let elsewhere: PathBuf = dir.path().join("elsewhere.json");
    std::fs::rename(&record, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &record).unwrap();
    let err = m.recover().unwrap_err();
    assert!(err.to_string().contains("unsafe"), "{err}");
    std::fs::remove_file(&record).unwrap();
    std::fs::write(&record, b"{not json").unwrap();
    std::fs::set_permissions(&record, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    assert!(m.recover().is_err(), "a corrupt record stops recovery");
    std::fs::remove_file(&record).unwrap();

    // A runtime whose list and delete fail: release cannot prove absence, reports residue (a
    // no-decision), and keeps the record so that recovery can try again.
    let fake = dir.path().join("fake-runc");
    std::fs::write(&fake, "#!/bin/sh\ncase \"$3\" in list) echo 'list failed' >&2; exit 1;; delete) echo 'delete failed' >&2; exit 1;; *) exit 0;; esac\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut broken = s.clone();
    broken.runtime.binary = fake;
    std::fs::create_dir_all(&broken.runtime.state_root).unwrap();
    drop(m);
    let m = Manager::open(&store, broken).unwrap();
    let lease = m
        .begin("sha256:faults", cordon_testkit::in_an_hour())
        .unwrap();
    let err = m.release(&lease.record).unwrap_err();
    assert!(err.to_string().contains("delete failed"), "{err}");
    assert!(
        store
            .path("leases", &format!("{}.json", lease.record.lease))
            .exists()
    );
    drop(m);
    let m = Manager::open(&store, s).unwrap();
    m.recover().unwrap();
    assert!(m.check().unwrap().is_empty());
}

#[test]
fn a_container_that_will_not_disappear_and_a_runtime_too_old_are_no_decisions() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: real accounts"
    );
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let s = setup(dir.path(), 2);
    let m = Manager::open(&store, s.clone()).unwrap();
    let lease = m
        .begin("sha256:faults", cordon_testkit::in_an_hour())
        .unwrap();
    drop(m);
    // A runtime that keeps listing the lease's container with its exact labels after delete.
    let fake = dir.path().join("sticky-runc");
    let r = &lease.record;
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 'runc version 1.0.0'; exit 0; }}\ncase \"$3\" in\n list) echo '[{{\"id\":\"{c}\"}}]';;\n state) echo '{{\"annotations\":{{\"org.cordon.executor\":\"{e}\",\"org.cordon.lease\":\"{l}\",\"org.cordon.authority\":\"{a}\"}}}}';;\n *) exit 0;;\nesac\n",
            c = lease.container(),
            e = r.executor,
            l = r.lease,
            a = r.authority
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut sticky = s.clone();
    sticky.runtime.binary = fake.clone();
    std::fs::create_dir_all(&sticky.runtime.state_root).unwrap();
    let m = Manager::open(&store, sticky.clone()).unwrap();
    let err = m.release(&lease.record).unwrap_err();
    assert!(err.to_string().contains("still listed"), "{err}");
    assert!(
        store.path("leases", &format!("{}.json", r.lease)).exists(),
        "the record stays for a retry"
    );
    // The same fake is older than cordon supports: a clear no-decision before anything runs.
    let v = std::process::Command::new(&fake)
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).contains("1.0.0"));
    let facts =
        cordon::identity::probe_runtime(&cordon::host::Linux, "runc", &sticky.runtime.binary, None)
            .unwrap();
    let err = sticky
        .runtime
        .check_version(cordon::runtime::Kind::Runc, &facts.version, None)
        .unwrap_err();
    assert!(err.to_string().contains("needs at least 1.1"), "{err}");
    drop(m);
    let m = Manager::open(&store, s).unwrap();
    m.recover().unwrap();
    assert!(m.check().unwrap().is_empty());
}
