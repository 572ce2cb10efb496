//! A stage running `/bin/true` through the library (lease, account, run directory, bundle,
//! create/start/wait, release with absence proof) vs bare `runc run` of the same bundle, side by
//! side in one run; and recovery of 10,000 stale lease records. Prints times and ratios.
//!
//! `cargo bench -p cordon-reap --bench lifecycle` (as root; `CORDON_BENCH_RUNS`, default 10).
//! Goals: ≤ 1.05× bare runc + 25 ms; recovery of 10,000 records ≤ 2 s.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use cordon::lease::{Manager, Resource};
use cordon::runtime::OutputCaps;
use cordon::store::Store;
use cordon_policy_lang::{MountSource, StageKind};
use cordon_stage::bundle::{self, RunInputs};

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the lifecycle benchmark runs real containers: run it as root"
    );
    let runs: usize = std::env::var("CORDON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    let policy = cordon_policy_lang::parse("evaluator.kdl", &text).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        "bench",
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    setup.accounts.uids = cordon_testkit::account_range("reap-bench", 0);
    setup.accounts.gids = setup.accounts.uids;
    setup.accounts.cron_deny = dir.path().join("cron.deny");
    setup.accounts.at_deny = dir.path().join("at.deny");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    for d in ["proc", "dev", "tmp", "engine", "staging"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy(cordon_testkit::busybox(), rootfs.join("bin/true")).unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let m = Manager::open(&store, setup.clone()).unwrap();
    m.recover().unwrap();
    let caps = OutputCaps {
        stdout: 4096,
        stderr: 4096,
    };
    let mut lib = Vec::new();
    let mut bare = Vec::new();
    for i in 0..runs {
        let t = Instant::now();
        let mut lease = m
            .begin("sha256:bench", cordon_testkit::in_an_hour())
            .unwrap();
        m.provision(&lease).unwrap();
        let staging = lease.run_dir().join("staging");
        std::fs::create_dir_all(&staging).unwrap();
        let mut inputs = RunInputs::for_lease(&lease, vec!["/bin/true".into()], rootfs.clone());
        inputs.sources.insert(MountSource::Tree, tree.clone());
        let planned = bundle::plan(&policy, StageKind::Prebuild, &inputs).unwrap();
        let json = cordon::canonical::to_canonical_json(&planned.spec).unwrap();
        m.write_protected(&mut lease, "config.json", json.as_bytes())
            .unwrap();
        // The same bundle, for the baseline: copied before the lease is released.
        let bundle = dir.path().join(format!("bare{i}"));
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("config.json"), &json).unwrap();
        let f = m
            .run(&lease, Instant::now() + Duration::from_secs(30), caps, None)
            .unwrap();
        assert_eq!(f.meta.exit_code, Some(0));
        m.release(&lease.record).unwrap();
        lib.push(t.elapsed());

        // Bare runc run needs the staging path and account to exist as the lease had them.
        std::fs::create_dir_all(&staging).unwrap();
        bare.push(cordon_testkit::bare_runc_run(
            &dir.path().join("bare-state"),
            &bundle,
            &format!("bare{i}"),
        ));
        let _ = std::fs::remove_dir_all(lease.run_dir());
    }
    let (l, b) = (cordon_testkit::median(lib), cordon_testkit::median(bare));
    println!(
        "/bin/true through the library (median of {runs}): {:>7.1} ms",
        l.as_secs_f64() * 1e3
    );
    println!(
        "bare runc run of the same bundle:            {:>7.1} ms",
        b.as_secs_f64() * 1e3
    );
    println!(
        "library / bare: {:.2}x, overhead {:+.1} ms (goal <= 1.05x + 25 ms)",
        l.as_secs_f64() / b.as_secs_f64(),
        (l.as_secs_f64() - b.as_secs_f64()) * 1e3
    );

    // 10,000 stale records, as 10,000 dead supervisors would leave them (record only).
    let template = m
        .begin("sha256:bench", cordon_testkit::in_an_hour())
        .unwrap()
        .record;
    let leases = store.root().join("leases");
    for i in 0..10_000u32 {
        let mut r = template.clone();
        r.lease = format!("{i:08x}{}", &template.lease[8..]);
        for res in &mut r.resources {
            match res {
                Resource::Container { id } => *id = format!("cordon-{}", r.lease),
                Resource::RunDir { path } => *path = setup.run_root.join(&r.lease),
                Resource::Cgroup { path } => {
                    *path = cordon::lease::cgroup_path(&r.executor, &r.lease);
                }
                _ => {}
            }
        }
        let path = leases.join(format!("{}.json", r.lease));
        std::fs::write(&path, cordon::canonical::to_canonical_json(&r).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    let t = Instant::now();
    let done = m.recover().unwrap();
    let took = t.elapsed();
    assert!(m.check().unwrap().is_empty());
    println!(
        "recovery of {} stale records: {:>7.1} ms (goal <= 2000 ms)",
        done.len(),
        took.as_secs_f64() * 1e3
    );
}
