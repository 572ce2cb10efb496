//! A lane session of a trivial engine (one request) through `cordon-lane`'s library vs bare
//! `runc run` of the same runtime image starting the same interpreter, interleaved (A B A B);
//! then the relay's round trip (host → worker → engine → worker → host) per request over a
//! longer workload, and the host timer's resolution. Prints medians and ratios; asserts
//! nothing about time.
//!
//! `cargo bench -p cordon-lane --bench lane_vs_runc` (as root; `CORDON_BENCH_RUNS`, default 10).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use cordon::lease::Manager;
use cordon::receipt::{Decision, Role};
use cordon::tree::TREES;
use cordon_lane::session::{Inputs, session};
use cordon_testkit::{bare_runc_run, median};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
    let w = common::world("lane-bench", 0, "lane-bench", &[]);
    let (dir, store, policy, cfg, model) = (w.dir, w.store, w.policy, w.cfg, w.model);
    let setup = cfg.setup.clone();
    let trivial = "def generate(prompt, tokens, model_dir):\n    return [1] * tokens\n";
    let tree = common::publish(
        &store,
        TREES,
        &[("engine/__init__.py", ""), ("engine/serve.py", trivial)],
    );
    let publication = common::native(&store, &policy, &tree, &[("lib/a", "a\n")]);
    let inputs = |w| Inputs {
        role: Role::C,
        tree,
        publication,
        workload: w,
        model: model.clone(),
        lane: None,
    };
    let one = common::workload(dir.path(), 1, 0, 1);

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
    let many = common::workload(dir.path(), 500, 0, 1);
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
