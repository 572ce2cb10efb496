//! Materializing a 1 MiB delta over a 1 GiB and a 10 GiB incumbent with the same number of
//! files, side by side in one run: the cost must not grow with the incumbent's bytes. Prints
//! times and their ratio; asserts nothing about time.
//!
//! `cargo bench -p cordon-materialize --bench flat_materialize` (sizes in GiB:
//! `CORDON_BENCH_GIB`, default `1,10`). Goal: flat, ≤ 50 ms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use cordon::canonical::Digest;
use cordon::store::Store;
use cordon_materialize::materialize::{materialize, register_incumbent};

/// Files in every incumbent, so that only their size changes between the two runs.
const FILES: u64 = 1000;

fn make_incumbent(dir: &Path, gib: u64) {
    let per_file = (gib << 30) / FILES;
    std::fs::create_dir_all(dir.join("engine/attention")).unwrap();
    std::fs::create_dir_all(dir.join("weights")).unwrap();
    std::fs::write(
        dir.join("cordon-incumbent.kdl"),
        "incumbent \"bench\"\ntarget \"attention\" path=\"engine/attention\" python=\"engine.attention\"\n",
    )
    .unwrap();
    std::fs::write(dir.join("engine/attention/__init__.py"), "x = 1\n").unwrap();
    let block = vec![0x5au8; 1 << 20];
    for i in 0..FILES {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(dir.join(format!("weights/w{i:05}.dat"))).unwrap(),
        );
        // A distinct first line per file, so that no two files share a content object.
        writeln!(f, "file {i} of {gib} GiB").unwrap();
        let mut left = per_file;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            f.write_all(&block[..n]).unwrap();
            left -= n as u64;
        }
    }
}

/// A 1 MiB delta for the target: 16 Python files of 32 KiB and 16 data files of 32 KiB.
fn delta(variant: u32) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, data).unwrap();
    };
    add(
        "cordon-delta.kdl",
        b"delta target=\"attention\" package=\"fast_attn\"\n",
    );
    let mut py = format!("# variant {variant}\nfrom fast_attn import m0\n");
    while py.len() < 32 << 10 {
        py.push_str("def f(x):\n    return [v * 2 for v in x if v]\n\n");
    }
    for i in 0..16 {
        add(&format!("engine/attention/m{i}.py"), py.as_bytes());
        let data = vec![b'a' + (i as u8); 32 << 10];
        add(&format!("engine/attention/d{i}.txt"), &data);
    }
    b.into_inner().unwrap()
}

fn main() {
    let sizes: Vec<u64> = std::env::var("CORDON_BENCH_GIB")
        .unwrap_or_else(|_| "1,10".to_owned())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    let policy = cordon_policy_lang::parse("evaluator.kdl", &text).unwrap();
    let mut rules = policy.tree_rules();
    rules.max_total_bytes = u64::MAX;
    let limits = cordon_stage::settings::archive_limits(&policy);
    let steps = std::collections::BTreeMap::new();
    let mut results = Vec::new();
    for gib in sizes {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("incumbent");
        make_incumbent(&src, gib);
        let store = Store::open(&dir.path().join("store")).unwrap();
        let inc = register_incumbent(&store, &src, &rules).unwrap().digest;
        cordon::store::remove_tree(&src).unwrap();
        let mut times = Vec::new();
        for variant in 0..5 {
            let bytes = delta(variant);
            let record = cordon::intake::ingest(
                &store,
                bytes.as_slice(),
                &Digest::of_bytes(&bytes),
                &limits,
            )
            .unwrap()
            .record;
            let t = Instant::now();
            materialize(&store, &inc, &record, &rules, &steps, &|r| {
                Ok(cordon_materialize::analysis::respond(r).unwrap())
            })
            .unwrap();
            times.push(t.elapsed());
        }
        let best = *times.iter().min().unwrap();
        println!(
            "1 MiB delta over a {gib:>2} GiB incumbent ({FILES} files): best {:>6.1} ms of 5",
            best.as_secs_f64() * 1e3
        );
        results.push((gib, best));
    }
    if let (Some((g0, t0)), Some((g1, t1))) = (results.first(), results.last()) {
        let ratio = t1.as_secs_f64() / t0.as_secs_f64().max(Duration::from_micros(1).as_secs_f64());
        println!("{g1} GiB time / {g0} GiB time: {ratio:.2} (goal: flat, each <= 50 ms)");
    }
}
