//! Real runc containers through the library: each planned control observed from inside the
//! workload and from outside (the cgroup, the host), then release and a quiescent check; the
//! deadline, the OOM killer and an output flood recorded in the meta record; and cordon-reap
//! recovering what a supervisor that died left behind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon::image::{self, ImageSpec};
use cordon::lease::{BootTime, Lease, Manager, Setup};
use cordon::runtime::{Finished, OutputCaps};
use cordon::store::Store;
use cordon_policy_lang::{MountSource, StageKind};
use cordon_stage::bundle::{self, RunInputs};
use cordon_testkit::workspace_root;

const APPLETS: [&str; 14] = [
    "sh", "id", "grep", "cat", "touch", "cp", "head", "wc", "cut", "tail", "sleep", "dd", "seq",
    "mkdir",
];

struct Env {
    dir: tempfile::TempDir,
    store: Store,
    policy: cordon_policy_lang::Policy,
    rootfs: PathBuf,
    setup: Setup,
}

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test runs real containers and creates real accounts: run it as root (CI does)"
    );
}

/// A test environment whose account ids come from their own slice of the policy's range, so
/// tests running side by side never see each other's accounts.
fn env(slot: u32) -> Env {
    require_root();
    let _ = cordon_testkit::runc();
    let _ = cordon_testkit::busybox();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let text = std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap();
    let policy = cordon_policy_lang::parse("evaluator.kdl", &text).unwrap();
    let mut spec = ImageSpec {
        name: "test".into(),
        files: Default::default(),
        dirs: Default::default(),
        env: vec!["PATH=/bin".into()],
        entrypoint: vec!["/bin/sh".into()],
        workdir: None,
    };
    for a in APPLETS {
        spec.files
            .insert(format!("/bin/{a}"), (cordon_testkit::busybox(), 0o555));
    }
    for d in ["/dev", "/proc", "/tmp", "/engine", "/staging", "/sys"] {
        spec.dirs.insert(d.into(), 0o755);
    }
    let layout = dir.path().join("layout");
    let digest = image::build(&spec, &layout).unwrap();
    let rootfs = image::unpack(&store, &layout, &digest).unwrap();
    let executor = format!("test-{}-{slot}", std::process::id());
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        &executor,
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    setup.runtime.binary = cordon_testkit::test_runtime().1;
    setup.accounts.uids = cordon_testkit::account_range("reap-container", slot);
    setup.accounts.gids = setup.accounts.uids;
    setup.accounts.cron_deny = dir.path().join("cron.deny");
    setup.accounts.at_deny = dir.path().join("at.deny");
    // Startup recovery, as every manager does first: a crashed earlier run of this test may
    // have left an account in this slot's range.
    Manager::open(&store, setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    Env {
        dir,
        store,
        policy,
        rootfs,
        setup,
    }
}

/// Begin a lease, provision it, write its bundle for `script` (with plan tweaks), and run it.
fn run_script(
    e: &Env,
    m: &Manager,
    script: &str,
    tweak: impl FnOnce(&mut serde_json::Value),
    deadline: Duration,
    caps: OutputCaps,
) -> (Lease, Result<Finished, cordon::lease::LeaseError>) {
    let lease = m
        .begin("sha256:test-authority", cordon_testkit::in_an_hour())
        .unwrap();
    run_in(e, m, lease, script, tweak, deadline, caps)
}

/// Provision a begun lease, write its bundle for `script` (with plan tweaks), run it.
fn run_in(
    e: &Env,
    m: &Manager,
    mut lease: Lease,
    script: &str,
    tweak: impl FnOnce(&mut serde_json::Value),
    deadline: Duration,
    caps: OutputCaps,
) -> (Lease, Result<Finished, cordon::lease::LeaseError>) {
    m.provision(&lease).unwrap();
    let tree = e.dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("build.sh"), "echo tree\n").unwrap();
    // The scratch areas as plain directories of the run account (the session mounts tmpfs).
    for area in [bundle::STAGING_DIR, bundle::TMP_DIR] {
        let dir = lease.run_dir().join(area);
        std::fs::create_dir(&dir).unwrap();
        nix::unistd::chown(
            &dir,
            Some(nix::unistd::Uid::from_raw(lease.account().uid)),
            Some(nix::unistd::Gid::from_raw(lease.account().gid)),
        )
        .unwrap();
    }
    let argv = vec!["/bin/sh".into(), "-c".into(), script.into()];
    let mut inputs = RunInputs::for_lease(&lease, argv, e.rootfs.clone());
    inputs.sources.insert(MountSource::Tree, tree);
    inputs.protected = vec![
        e.store.root().to_path_buf(),
        lease.bundle_dir(),
        e.setup.runtime.state_root.clone(),
    ];
    inputs.cgroups = Some(bundle::Cgroups::V1(cordon::run_cgroup::ROOT.into()));
    let planned = bundle::plan(&e.policy, StageKind::Prebuild, &inputs).unwrap();
    // The patcher's bounded child, as the session prepares it (recovery removes it too).
    if let Some(child) = &planned.child {
        cordon_stage::session::prepare_child(&cordon::host::Linux, child).unwrap();
    }
    // The session copies store trees into the lease; these tests run without a session.
    for m in &planned.host_mounts {
        if let bundle::HostMount::Copy { target, source } = m {
            cordon_testkit::copy_tree(source, target);
            // World-writable, so only a read-only bind can refuse a write into it.
            std::fs::set_permissions(target, std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .unwrap();
        }
    }
    // A test-only transformation of config.json (an ablation or a tighter bound).
    let mut config = serde_json::to_value(&planned.spec).unwrap();
    tweak(&mut config);
    let json = cordon::canonical::to_canonical_json(&config).unwrap();
    m.write_protected(&mut lease, "config.json", json.as_bytes())
        .unwrap();
    let result = m.run(&lease, Instant::now() + deadline, caps, None);
    (lease, result)
}

const CAPS: OutputCaps = OutputCaps {
    stdout: 1 << 20,
    stderr: 1 << 20,
};

fn assert_quiescent(m: &Manager, lease: &Lease) {
    let left = m.check().unwrap();
    assert!(left.is_empty(), "residue after release: {left:?}");
    assert!(
        nix::unistd::User::from_name(&lease.account().name)
            .unwrap()
            .is_none(),
        "the run account must be gone"
    );
    assert!(!lease.run_dir().exists(), "the run directory must be gone");
}

#[test]
fn every_planned_control_holds_inside_and_outside() {
    let e = env(1);
    let m = Manager::open(&e.store, e.setup.clone()).unwrap();
    let script = r#"
echo uid=$(id -u) gid=$(id -g)
grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status
echo ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)
touch /engine/x 2>/dev/null && echo treewrite=yes || echo treewrite=no
touch /staging/out && echo stagingwrite=yes || echo stagingwrite=no
cp /bin/sh /tmp/sh && echo tmpcopy=yes; /tmp/sh -c true 2>/dev/null && echo tmpexec=yes || echo tmpexec=no
cp /bin/sh /staging/sh; /staging/sh -c true && echo stagingexec=yes || echo stagingexec=no
echo HOME=${HOME:-unset} USER=${USER:-unset}
sleep 1
"#;
    let lease = m
        .begin("sha256:test-authority", cordon_testkit::in_an_hour())
        .unwrap();
    let cgroup = std::thread::spawn({
        let probe = cordon::runtime::CgroupProbe {
            host: e.setup.runtime.host.clone(),
            root: e.setup.cgroup_root.clone(),
            path: lease.cgroup_path(),
        };
        move || {
            // From outside, while the workload sleeps: the kernel's own view of the limits.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if let (Some(mem), Some(pids)) = (probe.memory_limit(), probe.pids_limit()) {
                    return Some((mem, pids));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        }
    });
    let (lease, result) = run_in(&e, &m, lease, script, |_| {}, Duration::from_secs(30), CAPS);
    let f = result.unwrap();
    let out = String::from_utf8_lossy(&f.stdout);
    let uid = lease.account().uid;
    assert!(uid != 0);
    assert!(
        out.contains(&format!("uid={uid} gid={}", lease.account().gid)),
        "{out}"
    );
    // Every capability set, not only the effective one (a bounding set holding CAP_SYS_ADMIN
    // would let a setuid or file-capability exec gain it back).
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            out.contains(&format!("{set}:\t0000000000000000")),
            "{set}: {out}"
        );
    }
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert!(
        out.contains("ifaces=lo,\n"),
        "only the loopback interface: {out}"
    );
    // The tree's directory is world-writable on the host (run_in), so only the read-only bind
    // refuses the write; the same copy of the shell that noexec /tmp refuses runs from
    // staging. (The read-only root and masked paths are proved by cordon-stage's ablation
    // suite, with targets the run account could otherwise use.)
    for want in [
        "treewrite=no",
        "stagingwrite=yes",
        "tmpcopy=yes",
        "tmpexec=no",
        "stagingexec=yes",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert!(
        out.contains("HOME=/nonexistent USER=unset"),
        "nothing inherited: {out}"
    );
    assert_eq!(f.meta.exit_code, Some(0), "{:?}", f);
    assert!(!f.meta.killed_by_deadline && !f.meta.oom_killed);
    let (mem, pids) = cgroup
        .join()
        .unwrap()
        .expect("the container's cgroup was never seen");
    assert_eq!(mem, 8u64 << 30);
    assert_eq!(pids, 1024);
    assert!(
        f.meta.peak_memory_bytes.is_some() && f.meta.cpu_ms.is_some(),
        "{:?}",
        f.meta
    );
    // Nothing written outside: the tree on the host is unchanged.
    assert!(!e.dir.path().join("tree/x").exists());
    // The run account may not schedule cron or at jobs: it is in both deny files while it
    // exists, and out of them after release.
    let name = &lease.account().name;
    for f in [&e.setup.accounts.cron_deny, &e.setup.accounts.at_deny] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.lines().any(|l| l == name),
            "{name} not in {}",
            f.display()
        );
    }
    m.release(&lease.record).unwrap();
    for f in [&e.setup.accounts.cron_deny, &e.setup.accounts.at_deny] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.lines().any(|l| l == name),
            "{name} still in {}",
            f.display()
        );
    }
    assert_quiescent(&m, &lease);
}

#[test]
fn the_deadline_the_oom_killer_and_an_output_flood_are_recorded() {
    let e = env(2);
    let m = Manager::open(&e.store, e.setup.clone()).unwrap();

    let (lease, r) = run_script(&e, &m, "sleep 60", |_| {}, Duration::from_secs(1), CAPS);
    let f = r.unwrap();
    assert!(f.meta.killed_by_deadline, "{:?}", f.meta);
    assert_eq!(f.meta.signal, Some(9));
    assert!(f.meta.wall_ms < 20_000);
    m.release(&lease.record).unwrap();

    let (lease, r) = run_script(
        &e,
        &m,
        "dd if=/dev/zero of=/dev/null bs=256M count=1",
        |c| {
            c["linux"]["resources"]["memory"] =
                serde_json::json!({"limit": 32 << 20, "swap": 32 << 20})
        },
        Duration::from_secs(30),
        CAPS,
    );
    let f = r.unwrap();
    assert!(f.meta.oom_killed, "{:?}", f.meta);
    m.release(&lease.record).unwrap();

    let caps = OutputCaps {
        stdout: 64 << 10,
        stderr: 1 << 10,
    };
    let (lease, r) = run_script(
        &e,
        &m,
        "head -c 50000000 /dev/zero",
        |_| {},
        Duration::from_secs(30),
        caps,
    );
    let f = r.unwrap();
    assert!(f.meta.stdout_truncated);
    assert_eq!(f.stdout.len(), 64 << 10, "kept output is capped");
    assert_eq!(f.meta.stdout_bytes, 50_000_000, "every byte is counted");
    m.release(&lease.record).unwrap();
    assert_quiescent(&m, &lease);
}

#[test]
fn a_forkbomb_meets_the_pids_limit_and_a_changed_bundle_never_starts() {
    let e = env(3);
    let m = Manager::open(&e.store, e.setup.clone()).unwrap();
    let (lease, r) = run_script(
        &e,
        &m,
        "for i in $(seq 1 64); do sleep 5 & done; echo forked",
        |c| c["linux"]["resources"]["pids"]["limit"] = serde_json::json!(16),
        Duration::from_secs(30),
        CAPS,
    );
    // The shell's 17th fork fails with EAGAIN and the non-interactive shell gives up there: it
    // never reaches the end of the loop. (The ablation suite proves the limit is what stops it.)
    let f = r.unwrap();
    let err = String::from_utf8_lossy(&f.stderr);
    assert!(
        err.contains("can't fork: Resource temporarily unavailable"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&f.stdout).contains("forked"),
        "{f:?}"
    );
    assert_ne!(f.meta.exit_code, Some(0), "{:?}", f.meta);
    m.release(&lease.record).unwrap();

    // The protected config.json is changed after it was written: the run stops before launch.
    let mut lease = m
        .begin("sha256:test-authority", cordon_testkit::in_an_hour())
        .unwrap();
    m.provision(&lease).unwrap();
    let path = m.write_protected(&mut lease, "config.json", b"{}").unwrap();
    std::fs::write(&path, b"{\"tampered\":true}").unwrap();
    let err = m
        .run(&lease, Instant::now() + Duration::from_secs(5), CAPS, None)
        .unwrap_err();
    assert!(err.to_string().contains("changed before launch"), "{err}");
    m.release(&lease.record).unwrap();
    assert_quiescent(&m, &lease);
}

#[test]
fn an_account_whose_id_is_taken_stops_the_run() {
    let e = env(4);
    let m = Manager::open(&e.store, e.setup.clone()).unwrap();
    // A second manager of the same executor is refused.
    assert!(matches!(
        Manager::open(&e.store, e.setup.clone()),
        Err(cordon::lease::LeaseError::Busy { .. })
    ));
    let lease = m
        .begin("sha256:test-authority", cordon_testkit::in_an_hour())
        .unwrap();
    // Someone else already has the name: nothing is created.
    let a = &lease.account();
    let status = std::process::Command::new("groupadd")
        .args(["--gid", &a.gid.to_string(), &a.name])
        .status()
        .unwrap();
    assert!(status.success());
    let err = m.provision(&lease).unwrap_err();
    assert!(err.to_string().contains("cannot be created"), "{err}");
    std::process::Command::new("groupdel")
        .arg(&a.name)
        .status()
        .unwrap();
    m.release(&lease.record).unwrap();
    assert_quiescent(&m, &lease);
}

/// A supervisor that holds its lease past the deadline (hung, or its clock stopped mattering):
/// `cordon-reap`'s observer ends the container by its exact labels without the executor's lock,
/// the supervisor's wait returns at once with the kill, and its release leaves nothing.
#[test]
fn an_expired_lease_is_ended_while_its_supervisor_still_holds_it() {
    let e = env(5);
    let m = Manager::open(&e.store, e.setup.clone()).unwrap();
    let lease = m.begin("sha256:test-authority", Duration::ZERO).unwrap();
    let observer = cordon::lease::Observer::new(&e.store, e.setup.clone());
    let started = Instant::now();
    let (lease, result) = std::thread::scope(|s| {
        let running = s.spawn(|| {
            run_in(
                &e,
                &m,
                lease,
                "echo up; sleep 60",
                |_| {},
                Duration::from_secs(60),
                CAPS,
            )
        });
        // Once its container runs (polled, never a guessed delay), and not yet past the
        // grace: nothing is ended.
        let t = Instant::now();
        while !e
            .setup
            .runtime
            .call(&["list", "-f", "json"])
            .is_ok_and(|out| cordon_testkit::lists_running(&out))
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the container never ran"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            observer
                .end_expired(&BootTime::now(&cordon::host::Linux).unwrap())
                .unwrap()
                .is_empty()
        );
        let later = BootTime::now(&cordon::host::Linux)
            .unwrap()
            .after(cordon::lease::EXPIRY_GRACE * 2);
        let ended = observer.end_expired(&later).unwrap();
        assert_eq!(ended.len(), 1, "{ended:?}");
        running.join().unwrap()
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the run outlived the kill"
    );
    let f = result.unwrap();
    assert_eq!(f.meta.signal, Some(9), "{:?}", f.meta);
    assert!(!f.meta.killed_by_deadline);
    m.release(&lease.record).unwrap();
    assert_quiescent(&m, &lease);
}

/// A supervisor past its deadline that no `cordon-reap` looks at (hung, or stopped): the
/// lease's watchdog ends the container at the deadline plus the grace, on the boot clock, and
/// marks it ended from outside; the supervisor's wait returns with the kill (not its own
/// deadline's), and its release ends the watchdog and leaves nothing.
#[test]
fn a_leases_watchdog_ends_its_container_at_the_deadline_plus_the_grace() {
    let e = env(6);
    let m = Manager::open(&e.store, e.setup.clone()).unwrap();
    let lease = m.begin("sha256:test-authority", Duration::ZERO).unwrap();
    let started = Instant::now();
    let (lease, result) = run_in(
        &e,
        &m,
        lease,
        "echo up; sleep 120",
        |_| {},
        Duration::from_secs(120),
        CAPS,
    );
    let took = started.elapsed();
    let grace = cordon::lease::EXPIRY_GRACE;
    assert!(
        took >= grace && took < grace + Duration::from_secs(20),
        "ended after {took:?}, not at the grace ({grace:?})"
    );
    let f = result.unwrap();
    assert_eq!(f.meta.signal, Some(9), "{:?}", f.meta);
    assert!(!f.meta.killed_by_deadline, "{:?}", f.meta);
    assert!(lease.ended_by_reap(), "the watchdog marks the kill");
    m.release(&lease.record).unwrap();
    assert!(cordon_testkit::watchdogs_of(e.store.root()).is_empty());
    assert_quiescent(&m, &lease);
}
