//! A lane session of a trivial engine (one request) through `cordon-lane`'s library vs bare
//! `runc run` of the same runtime image starting the same interpreter, interleaved (A B A B);
//! then the relay's round trip (host → worker → engine → worker → host) per request over a
//! longer workload, and the host timer's resolution. Prints medians and ratios; asserts
//! nothing about time.
//!
//! `cargo bench -p cordon-lane --bench lane_vs_runc` (as root; `CORDON_BENCH_RUNS`, default 10).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::process::Command;
use std::time::{Duration, Instant};

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::{Decision, Role};
use cordon::store::Store;
use cordon::tree::{self, Entry, PUBLICATIONS, TREES};
use cordon_lane::session::{Config, Inputs, session};
use cordon_testkit::{bare_runc_run, median, workspace_root};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn publish(store: &Store, section: tree::Section, files: &[(&str, &str)]) -> Digest {
    let mut batch = store.batch().unwrap();
    let mut entries = Vec::new();
    for (path, text) in files {
        let (sha256, size) = batch.add_reader(text.as_bytes(), false).unwrap();
        entries.push(Entry {
            path: (*path).to_owned(),
            mode: 0o444,
            size,
            sha256,
        });
    }
    batch.commit().unwrap();
    tree::publish_in(
        store,
        section,
        entries,
        serde_json::json!({"kind": "bench"}),
    )
    .unwrap()
    .digest
}

fn workload(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let path = dir.join(format!("workload-{n}.json"));
    let requests = vec!["{\"prompt\":[1],\"tokens\":1}"; n].join(",");
    std::fs::write(
        &path,
        format!("{{\"version\":1,\"warmup\":0,\"conditioning\":0,\"requests\":[{requests}]}}"),
    )
    .unwrap();
    path
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the lane benchmark runs real containers: run it as root"
    );
    let runs: usize = std::env::var("CORDON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let ids = cordon_testkit::account_range("lane-bench", 0);
    let text = cordon_testkit::isolated_policy(dir.path(), ids);
    let policy = cordon_policy_lang::parse("bench.kdl", &text).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    assert!(cordon_testkit::runtime_image_inputs().is_file());
    let spec = cordon_image::spec::load(&workspace_root().join("images/runtime.kdl")).unwrap();
    cordon::image::build(&spec, &dir.path().join("images/runtime")).unwrap();
    let setup = cordon_stage::settings::lease_setup(
        &policy,
        "lane-bench",
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    Manager::open(&store, setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    let runtime_version =
        cordon::identity::probe_runtime(&cordon::host::Linux, "runc", &setup.runtime.binary, None)
            .unwrap()
            .version;
    let cfg = Config {
        store: store.clone(),
        images: dir.path().join("images"),
        setup: setup.clone(),
        authority: Digest::of_bytes(b"lane-bench"),
        runtime_version,
    };
    let model = dir.path().join("models/m");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("vocab"), "1000003\n").unwrap();
    let trivial = "def generate(prompt, tokens, model_dir):\n    return [1] * tokens\n";
    let tree = publish(
        &store,
        TREES,
        &[("engine/__init__.py", ""), ("engine/serve.py", trivial)],
    );
    let publication = publish(&store, PUBLICATIONS, &[("lib/a", "a\n")]);
    let inputs = |w| Inputs {
        role: Role::C,
        tree,
        publication,
        workload: w,
        model: model.clone(),
    };
    let one = workload(dir.path(), 1);

    // The baseline: bare runc run of the unpacked runtime image, read-only, starting the same
    // interpreter with the same flags (no worker, no frames, no lease).
    let rootfs = store
        .path("images", &policy.images()["runtime"].hex())
        .join("rootfs");
    let bundle = dir.path().join("bare");
    std::fs::create_dir_all(&bundle).unwrap();
    let ok = Command::new(cordon_testkit::runc())
        .args(["spec", "--bundle"])
        .arg(&bundle)
        .status()
        .unwrap()
        .success();
    assert!(ok, "runc spec");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    config["root"]["path"] = rootfs.display().to_string().into();
    config["root"]["readonly"] = true.into();
    config["process"]["terminal"] = false.into();
    config["process"]["args"] =
        serde_json::json!(["/usr/bin/python3.11", "-I", "-S", "-B", "-c", "pass"]);
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let state = dir.path().join("bare-state");

    let (mut lane, mut bare) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let t = Instant::now();
        let o = session(&policy, &cfg, &inputs(one.clone())).unwrap();
        lane.push(t.elapsed());
        assert!(matches!(o, Decision::Accepted(_)), "{o:?}");
        bare.push(bare_runc_run(&state, &bundle, &format!("lane-bare-{i}")));
    }
    let (l, b) = (median(lane), median(bare));
    println!(
        "lane session of a trivial engine: {:.1} ms vs bare runc run {:.1} ms ({:.2}×, +{:.1} ms)",
        ms(l),
        ms(b),
        l.as_secs_f64() / b.as_secs_f64(),
        ms(l) - ms(b)
    );

    // The relay's round trip, from the receipt's own host stamps.
    let many = workload(dir.path(), 500);
    let Decision::Accepted(out) = session(&policy, &cfg, &inputs(many)).unwrap() else {
        panic!("not served");
    };
    let trips: Vec<Duration> = out
        .windows
        .iter()
        .map(|w| Duration::from_nanos(w.received_ns - w.sent_ns))
        .collect();
    println!(
        "round trip host → worker → engine → worker → host: median {:.1} µs over {} requests (ready after {:.1} ms)",
        median(trips).as_secs_f64() * 1e6,
        out.windows.len(),
        out.ready_ns as f64 / 1e6
    );

    // The host clock's resolution: the smallest step two successive readings show.
    let mut step = Duration::MAX;
    for _ in 0..100_000 {
        let a = Instant::now();
        let mut b = Instant::now();
        while b == a {
            b = Instant::now();
        }
        step = step.min(b - a);
    }
    println!(
        "host monotonic clock: smallest observed step {} ns",
        step.as_nanos()
    );
    assert!(
        Manager::open(&store, setup)
            .unwrap()
            .check()
            .unwrap()
            .is_empty(),
        "the benchmark left residue"
    );
}
