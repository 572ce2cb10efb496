//! A prebuild of a trivial step through `cordon-prebuild`'s library vs bare `runc run` of an
//! equivalent bundle (same policy, image, tree and controls), side by side in one run; and the
//! demo pipeline's time by stage. Prints times and the ratio; asserts nothing about time.
//!
//! `cargo bench -p cordon-prebuild --bench prebuild_vs_runc` (as root; `CORDON_BENCH_RUNS`,
//! default 10). Goal: ≤ 1.05× bare runc + 25 ms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::Decision;
use cordon::store::Store;
use cordon_policy_lang::{MountSource, StageKind};
use cordon_prebuild::prebuild::{Config, Published, prebuild};
use cordon_stage::bundle::{self, RunInputs};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the prebuild benchmark runs real containers: run it as root"
    );
    let runs: usize = std::env::var("CORDON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let root = cordon_testkit::workspace_root();
    let dir = tempfile::tempdir().unwrap();
    // The bare baseline runs as the last id of the block, which no lease of the range is given
    // while the benchmark runs fewer leases than the block holds.
    let ids = cordon_testkit::account_range("prebuild-bench", 0);
    let text = cordon_testkit::isolated_policy(dir.path(), ids);
    let policy = cordon_policy_lang::parse("bench.kdl", &text).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let spec = cordon_image::spec::load(&cordon_testkit::prebuild_image_spec()).unwrap();
    cordon::image::build(&spec, &dir.path().join("images/prebuild")).unwrap();

    // The demo pipeline, stage by stage, in process.
    let t = Instant::now();
    let incumbent = cordon_materialize::materialize::register_incumbent(
        &store,
        &root.join("checks/example/incumbent"),
        &policy.tree_rules(),
    )
    .unwrap()
    .digest;
    let t_inc = t.elapsed();
    let tar = cordon_testkit::pack_delta(&root.join("checks/example/candidate"));
    let t = Instant::now();
    let record = cordon::intake::ingest(
        &store,
        tar.as_slice(),
        &Digest::of_bytes(&tar),
        &cordon_stage::settings::archive_limits(&policy),
    )
    .unwrap()
    .record;
    let t_fetch = t.elapsed();
    let t = Instant::now();
    let steps = [(
        "build-native".to_owned(),
        cordon_policy_lang::BuildTier::NativeRebuild,
    )]
    .into();
    let tree = cordon_materialize::materialize::materialize(
        &store,
        &incumbent,
        &record,
        &policy.tree_rules(),
        &steps,
        &|r| Ok(cordon_materialize::analysis::respond(r).unwrap()),
    )
    .unwrap()
    .record
    .digest;
    let t_mat = t.elapsed();
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        "bench",
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    Manager::open(&store, setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    let runtime_version =
        cordon::identity::probe_runtime(&cordon::host::Linux, "runc", &setup.runtime.binary, None)
            .unwrap()
            .version;
    let cfg = |i: usize| Config {
        store: store.clone(),
        images: dir.path().join("images"),
        setup: setup.clone(),
        // A fresh authority per run, so the cache never answers and a container always runs.
        authority: Digest::of_bytes(format!("bench-{i}").as_bytes()),
        runtime_version: runtime_version.clone(),
        key_dir: std::path::PathBuf::from(cordon::signing::KEY_DIR),
        evidence: cordon_stage::evidence::Evidence::new(&store),
        exe: std::path::PathBuf::from(env!("CARGO_BIN_EXE_cordon-prebuild")),
    };
    let mut lib = Vec::new();
    for i in 0..runs {
        let t = Instant::now();
        let o = prebuild(&policy, &cfg(i), &tree, "build-native", true).unwrap();
        lib.push(t.elapsed());
        assert!(matches!(
            o,
            Decision::Accepted(Published { cached: false, .. })
        ));
    }
    let t = Instant::now();
    let left = Manager::open(&store, setup.clone())
        .unwrap()
        .check()
        .unwrap();
    let t_reap = t.elapsed();
    assert!(left.is_empty());

    // The baseline: bare runc run of the same plan (image rootfs, tree, a staging directory).
    let pin = policy.images()["prebuild"];
    let rootfs = store.path("images", &pin.hex()).join("rootfs");
    let mut bare = Vec::new();
    for i in 0..runs {
        let run_dir = dir.path().join(format!("run{i}"));
        for area in [bundle::STAGING_DIR, bundle::TMP_DIR] {
            std::fs::create_dir_all(run_dir.join(area)).unwrap();
        }
        let inputs = RunInputs {
            argv: policy.step("build-native").unwrap().1.to_vec(),
            uid: ids.1,
            gid: ids.1,
            image_rootfs: rootfs.clone(),
            run_dir,
            sources: [(MountSource::Tree, cordon::tree::root_dir(&store, &tree))].into(),
            devices: Default::default(),
            cdi: None,
            lane: None,
            executor: "bare".into(),
            lease: format!("bare{i}"),
            authority: "bare".into(),
            store: "bare".into(),
            protected: vec![],
            mountable_store_roots: vec![],
            never_mount_real: vec![],
            cgroups: Some(bundle::Cgroups::V1(cordon::run_cgroup::ROOT.into())),
            entry: bundle::Entry::Step,
        };
        let planned = bundle::plan(&policy, StageKind::Prebuild, &inputs).unwrap();
        // The same bounded child as the stage's, prepared outside the timed region (on v1 its
        // limits can be written before the create).
        if let Some(child) = &planned.child {
            cordon_stage::session::prepare_child(&cordon::host::Linux, child).unwrap();
            cordon_stage::session::arm_child(&cordon::host::Linux, child, ids.1, ids.1).unwrap();
        }
        // The bare run binds the same copies, made outside the timed region.
        for m in &planned.host_mounts {
            if let bundle::HostMount::Copy { target, source } = m {
                cordon_testkit::copy_tree(source, target);
            }
        }
        let spec = planned.spec;
        let bundle = dir.path().join(format!("bundle{i}"));
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            cordon::canonical::to_canonical_json(&spec).unwrap(),
        )
        .unwrap();
        for area in [bundle::STAGING_DIR, bundle::TMP_DIR] {
            nix::unistd::chown(
                &dir.path().join(format!("run{i}")).join(area),
                Some(nix::unistd::Uid::from_raw(ids.1)),
                Some(nix::unistd::Gid::from_raw(ids.1)),
            )
            .unwrap();
        }
        bare.push(cordon_testkit::bare_runc_run(
            &dir.path().join("bare-state"),
            &bundle,
            &format!("bare{i}"),
        ));
    }
    let (l, b) = (cordon_testkit::median(lib), cordon_testkit::median(bare));
    println!(
        "prebuild of the example step (median of {runs}): {:>7.1} ms",
        ms(l)
    );
    println!(
        "bare runc run of the same bundle:              {:>7.1} ms",
        ms(b)
    );
    println!(
        "prebuild / bare: {:.2}x, overhead {:+.1} ms (goal <= 1.05x + 25 ms)",
        ms(l) / ms(b),
        ms(l) - ms(b)
    );
    println!(
        "pipeline by stage: incumbent {:.1} ms, fetch {:.1} ms, materialize {:.1} ms, prebuild {:.1} ms, reap --check {:.1} ms",
        ms(t_inc),
        ms(t_fetch),
        ms(t_mat),
        ms(l),
        ms(t_reap)
    );
}
