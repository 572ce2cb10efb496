//! Benchmark: `check` + `identity` on the default policy (goal: ≤ 5 ms).
//!
//! Prints medians side by side with a baseline run in the same process: `openssl dgst -sha256`
//! of the same file, spawned the same way as the `cordon-policy` binary, so the ratio shows
//! what cordon adds over hashing the file; and, for `identity`, `openssl dgst -sha256` of the
//! runtime and cordon binaries that identity must hash on every call. Run with
//! `cargo bench -p cordon-policy --bench check_identity`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 50;

fn median(mut f: impl FnMut()) -> Duration {
    let mut samples: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples[RUNS / 2]
}

fn spawn(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = root.join("policy/evaluator.kdl");
    let file_s = file.to_str().unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let bin = env!("CARGO_BIN_EXE_cordon-policy");

    let parse_digest = median(|| {
        let policy = cordon_policy_lang::parse(file_s, &text).unwrap();
        policy.digest().unwrap();
    });
    let baseline = median(|| spawn("openssl", &["dgst", "-sha256", file_s]));
    // What identity must hash besides the policy: the runtime and the cordon binaries.
    let runtime = cordon_policy_lang::parse(file_s, &text)
        .unwrap()
        .runtime()
        .path()
        .to_owned();
    let hashed = median(|| spawn("openssl", &["dgst", "-sha256", &runtime, bin]));
    let check = median(|| spawn(bin, &["check", file_s]));
    let identity = median(|| spawn(bin, &["identity", file_s]));
    let both = check + identity;

    println!("check + identity on policy/evaluator.kdl, median of {RUNS} runs");
    println!(
        "  in-process parse + validate + policy digest  {:8.3} ms",
        ms(parse_digest)
    );
    println!(
        "  baseline: openssl dgst -sha256 (spawned)     {:8.3} ms",
        ms(baseline)
    );
    println!(
        "  cordon-policy check (spawned)                {:8.3} ms  ratio {:.2}x",
        ms(check),
        ms(check) / ms(baseline)
    );
    println!(
        "  baseline: openssl dgst -sha256 runtime + bin {:8.3} ms",
        ms(hashed)
    );
    println!(
        "  cordon-policy identity (spawned)             {:8.3} ms  ratio {:.2}x, {:.2}x vs hashing the same binaries",
        ms(identity),
        ms(identity) / ms(baseline),
        ms(identity) / ms(hashed)
    );
    println!(
        "  check + identity                             {:8.3} ms  ratio {:.2}x  (goal <= 5 ms)",
        ms(both),
        ms(both) / ms(baseline)
    );
}
