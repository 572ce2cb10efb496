//! Fetch of a large tar vs `openssl dgst -sha256` and vs `tar -x` of the same file, side by
//! side in one run. Prints throughputs and ratios; asserts nothing about time.
//!
//! `cargo bench -p cordon-fetch --bench fetch_vs_baselines` (size: `CORDON_BENCH_MIB`, default
//! 1024). Goals: fetch ≥ 80 % of OpenSSL's one-core sha256 throughput, ≤ 1.2× `tar -x`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn best_of(n: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..n).map(|_| f()).min().unwrap()
}

fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    t.elapsed()
}

fn make_tar(path: &Path, mib: u64) {
    let file_mib = 16u64;
    let mut b = tar::Builder::new(std::io::BufWriter::new(
        std::fs::File::create(path).unwrap(),
    ));
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = vec![0u8; (file_mib << 20) as usize];
    for i in 0..mib.div_ceil(file_mib) {
        // Fresh pseudo-random contents per file, so no two objects share a hash.
        for chunk in data.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        b.append_data(&mut h, format!("engine/blob{i:04}.bin"), data.as_slice())
            .unwrap();
    }
    b.into_inner().unwrap().flush().unwrap();
}

fn main() {
    let mib: u64 = std::env::var("CORDON_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let dir = tempfile::tempdir().unwrap();
    let tar_path = dir.path().join("bench.tar");
    make_tar(&tar_path, mib);
    let bytes = std::fs::metadata(&tar_path).unwrap().len();
    let sha = cordon::canonical::Digest::of_file(&tar_path).unwrap();
    let policy = dir.path().join("policy.kdl");
    // The parser child runs as a real account: this benchmark's own id block and deny files.
    let base = cordon_testkit::isolated_minimal_policy(
        dir.path(),
        cordon_testkit::account_range("fetch-bench", 0),
    );
    std::fs::write(
        &policy,
        format!("{base}\nintake {{\n    archive {{\n        max-archive-bytes \"64GiB\"\n        max-extracted-bytes \"64GiB\"\n        max-file-bytes \"1GiB\"\n    }}\n}}\n"),
    )
    .unwrap();

    let openssl = best_of(3, || {
        timed(
            Command::new("openssl")
                .args(["dgst", "-sha256"])
                .arg(&tar_path),
        )
    });
    let untar = best_of(3, || {
        let out = dir.path().join("x");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir(&out).unwrap();
        let d = timed(
            Command::new("tar")
                .arg("-xf")
                .arg(&tar_path)
                .arg("-C")
                .arg(&out),
        );
        std::fs::remove_dir_all(&out).unwrap();
        d
    });
    let fetch = best_of(3, || {
        let store = dir.path().join("store");
        let _ = cordon::store::remove_tree(&store);
        let d = timed(
            Command::new(env!("CARGO_BIN_EXE_cordon-fetch"))
                .arg("--policy")
                .arg(&policy)
                .arg("--store")
                .arg(&store)
                .arg("--run-dir")
                .arg(dir.path().join("run"))
                .args(["--executor", "fetch-bench"])
                .args(["--sha256", &sha.hex()])
                .arg(&tar_path),
        );
        cordon::store::remove_tree(&store).unwrap();
        d
    });
    let mbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
    println!("archive: {} MiB in {} files", bytes >> 20, mib.div_ceil(16));
    println!(
        "openssl dgst -sha256: {:>8.1} ms  {:>7.1} MB/s",
        openssl.as_secs_f64() * 1e3,
        mbps(openssl)
    );
    println!(
        "tar -x:               {:>8.1} ms  {:>7.1} MB/s",
        untar.as_secs_f64() * 1e3,
        mbps(untar)
    );
    println!(
        "cordon-fetch:         {:>8.1} ms  {:>7.1} MB/s",
        fetch.as_secs_f64() * 1e3,
        mbps(fetch)
    );
    println!(
        "fetch throughput / openssl throughput: {:.2} (goal >= 0.80)",
        mbps(fetch) / mbps(openssl)
    );
    println!(
        "fetch time / tar -x time:              {:.2} (goal <= 1.20)",
        fetch.as_secs_f64() / untar.as_secs_f64()
    );
}
