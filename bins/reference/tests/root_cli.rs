//! The whole pipeline with the binaries, as root, as a reviewer would check it, through
//! `cordon-fetch`, `cordon-materialize`, `cordon-prebuild`, `cordon-lane qualify` and
//! `cordon-reference` on the CPU lanes:
//! - a candidate delta whose engine answers with the right tokens, faster, ends in PASS (exit
//!   0), its qualification non-settling, and the chain replays with `cordon-verify`;
//! - one whose engine answers every request with the right number of wrong tokens, fast (a
//!   speed PASS), ends in FAIL on quality (exit 1) naming the first differing request; the
//!   chain under the final verdict replays; and the same qualification offered to a referee
//!   under another quality rule (another authority) is refused (exit 2). Its policy requires a
//!   reproduction: the primary attempt alone is already a FAIL (a proven failure needs no
//!   reproduction), and the final verdict over the reproduction weighs both attempts.
//!
//! And every stage that needs root says so first when another user runs it.
//!
//! The incumbent here waits per token instead of computing, so its reads are steady on a busy
//! CPU host; the pristine tree is the bundled example's, which the policy pins.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cordon::canonical::Digest;
use cordon_testkit::{replace_once, workspace_root};
use serde_json::Value;

fn bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_cordon-reference")).with_file_name(name)
}

/// The example incumbent's kernel, waiting instead of computing (the same tokens).
const STEADY_KERNEL: &str = "import time\n\nEXPONENT = 65537\n\n\ndef attend(query, modulus=1000003):\n    time.sleep(0.003)\n    return [pow(q, EXPONENT, modulus) for q in query]\n";

/// The example candidate's kernel, off by one on every token: the right number, all wrong,
/// ten times as fast as the incumbent and as steady (an engine of no work at all scatters past
/// the speed rule's bound on a busy host).
const WRONG_KERNEL: &str = "import time\n\nfrom fast_attn import util\n\nEXPONENT = 65537\n\n\ndef attend(query, modulus=1000003):\n    time.sleep(0.0003)\n    return [(t + 1) % modulus for t in util.power(query, EXPONENT, modulus)]\n";

/// The example candidate's kernel as it is meant to be: the right tokens, as fast and steady.
const RIGHT_KERNEL: &str = "import time\n\nfrom fast_attn import util\n\nEXPONENT = 65537\n\n\ndef attend(query, modulus=1000003):\n    time.sleep(0.0003)\n    return util.power(query, EXPONENT, modulus)\n";

struct Cli {
    dir: tempfile::TempDir,
    executor: &'static str,
}

impl Cli {
    /// Account slot `slot` and executor `executor`; the candidate's kernel `kernel`; a policy
    /// that requires a reproduction when `reproduction`.
    fn new(slot: u32, executor: &'static str, kernel: &str, reproduction: bool) -> Self {
        cordon_testkit::require_root("the pipeline runs real containers and accounts");
        let _ = cordon_testkit::runc();
        let _ = cordon_testkit::busybox();
        assert!(cordon_testkit::runtime_image_inputs().is_file());
        let dir = tempfile::tempdir().unwrap();
        let mut policy = cordon_testkit::isolated_policy(
            dir.path(),
            cordon_testkit::account_range("reference", slot),
        );
        if reproduction {
            // The final verdict rests on a primary attempt and its reproduction.
            policy.push_str("\nreproduction \"required\"\n");
        }
        std::fs::write(dir.path().join("policy.kdl"), &policy).unwrap();
        // Another authority: the same policy under a looser quality rule.
        std::fs::write(
            dir.path().join("looser.kdl"),
            replace_once(&policy, "min-exact-bp 10000", "min-exact-bp 9000"),
        )
        .unwrap();
        // The prebuild image's sources (its compiler included) fetched and its layout shared
        // between tests; the runtime image built here.
        cordon_testkit::prebuild_layout(&dir.path().join("images/prebuild"), |to| {
            let spec = cordon_image::spec::load(&cordon_testkit::prebuild_image_spec()).unwrap();
            cordon::image::build(&spec, to).unwrap();
        });
        let spec = cordon_image::spec::load(&workspace_root().join("images/runtime.kdl")).unwrap();
        cordon::image::build(&spec, &dir.path().join("images/runtime")).unwrap();
        let cli = Self { dir, executor };
        cli.copy("checks/example/incumbent", "incumbent");
        std::fs::write(
            cli.path("incumbent/engine/attention/kernel.py"),
            STEADY_KERNEL,
        )
        .unwrap();
        cli.copy("checks/example/candidate", "candidate");
        std::fs::write(cli.path("candidate/engine/attention/kernel.py"), kernel).unwrap();
        // The model lives in a root-owned directory nobody else may write, registered by its
        // digest in the policy's models root (the lane checks both).
        let src = cli.path("model-src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::copy(
            workspace_root().join("checks/example/model/vocab"),
            src.join("vocab"),
        )
        .unwrap();
        let (_, digest) = cordon_lane::model::verify(&src).unwrap();
        let model = cordon_testkit::register_model(&src, &cli.path("models"), &digest.to_string());
        std::os::unix::fs::symlink(&model, cli.path("model")).unwrap();
        cli
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn copy(&self, from: &str, to: &str) {
        let ok = Command::new("cp")
            .arg("-r")
            .arg(workspace_root().join(from))
            .arg(self.path(to))
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// `binary` under `policy` with this test's store and lease options.
    fn command(&self, binary: &str, policy: &str) -> Command {
        let mut c = Command::new(bin(binary));
        c.arg("--policy")
            .arg(self.path(policy))
            .arg("--store")
            .arg(self.path("store"));
        if matches!(binary, "cordon-prebuild" | "cordon-reference") {
            c.args(self.lease());
        }
        c
    }

    /// The lease options (the lane takes them after its subcommand).
    fn lease(&self) -> [String; 4] {
        [
            "--run-dir".into(),
            self.path("run").display().to_string(),
            "--executor".into(),
            self.executor.into(),
        ]
    }

    /// Run `c` with `stdin` (a receipt file, or nothing); its output, the receipt kept as
    /// `keep`.
    fn run(&self, mut c: Command, stdin: Option<&str>, keep: &str) -> (Output, Value) {
        c.stdin(match stdin {
            Some(f) => Stdio::from(std::fs::File::open(self.path(f)).unwrap()),
            None => Stdio::null(),
        });
        let out = c.output().unwrap();
        std::fs::write(self.path(keep), &out.stdout).unwrap();
        let receipt = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, receipt)
    }
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cli {
    /// The pipeline with the binaries up to the qualification: the incumbent and the pristine
    /// tree registered, the incumbent built; the candidate packed, fetched, materialized and
    /// built; then `cordon-lane qualify` on the example's first ten requests (kept as
    /// `qualify.json`). The qualify command, for a reproduction.
    fn qualified(&self) -> (Output, Value, impl Fn() -> Command + '_) {
        let cli = self;
        let images = cli.path("images");
        let mut c = cli.command("cordon-materialize", "policy.kdl");
        c.arg("incumbent").arg(cli.path("incumbent"));
        let (out, incumbent) = cli.run(c, None, "incumbent.json");
        ok(&out);
        let mut c = cli.command("cordon-materialize", "policy.kdl");
        c.arg("incumbent")
            .arg(workspace_root().join("checks/example/pristine"));
        ok(&cli.run(c, None, "pristine.json").0);
        let mut c = cli.command("cordon-prebuild", "policy.kdl");
        c.arg("--images").arg(&images);
        ok(&cli
            .run(c, Some("incumbent.json"), "incumbent-prebuild.json")
            .0);

        let archive = cli.path("candidate.tar");
        std::fs::write(&archive, cordon_testkit::pack_delta(&cli.path("candidate"))).unwrap();
        let mut c = cli.command("cordon-fetch", "policy.kdl");
        c.args(["--sha256", &Digest::of_file(&archive).unwrap().to_string()])
            .arg(&archive);
        ok(&cli.run(c, None, "fetch.json").0);
        let mut c = cli.command("cordon-materialize", "policy.kdl");
        c.args([
            "--incumbent",
            incumbent["outputs"]["tree_digest"].as_str().unwrap(),
        ]);
        ok(&cli.run(c, Some("fetch.json"), "materialize.json").0);
        let mut c = cli.command("cordon-prebuild", "policy.kdl");
        c.arg("--images").arg(&images);
        ok(&cli.run(c, Some("materialize.json"), "prebuild.json").0);

        // The example's first ten requests: enough for the rule's windows, a third of the time.
        let mut workload: serde_json::Value = serde_json::from_slice(
            &std::fs::read(workspace_root().join("checks/example/workload/example.json")).unwrap(),
        )
        .unwrap();
        workload["requests"].as_array_mut().unwrap().truncate(10);
        std::fs::write(cli.path("workload.json"), workload.to_string()).unwrap();
        let qualify_command = move || {
            let mut c = cli.command("cordon-lane", "policy.kdl");
            c.arg("qualify")
                .args(cli.lease())
                .arg("--incumbent")
                .arg(cli.path("incumbent-prebuild.json"))
                .arg("--images")
                .arg(cli.path("images"))
                .arg("--workload")
                .arg(cli.path("workload.json"))
                .arg("--model")
                .arg(cli.path("model"));
            c
        };
        let (out, qualify) = cli.run(qualify_command(), Some("prebuild.json"), "qualify.json");
        (out, qualify, qualify_command)
    }

    /// `cordon-reference` on the pristine tree.
    fn referee(&self) -> Command {
        let mut c = self.command("cordon-reference", "policy.kdl");
        c.arg("--images")
            .arg(self.path("images"))
            .arg("--pristine")
            .arg(self.path("pristine.json"));
        c
    }
}

/// A right engine, faster: the whole pipeline with the binaries ends in PASS (exit 0), non-
/// settling on the CPU lanes, and the chain under the final verdict replays.
#[test]
fn a_faster_engine_with_the_right_tokens_ends_the_whole_pipeline_in_pass() {
    let cli = Cli::new(6, "reference-cli-pass", RIGHT_KERNEL, false);
    let (out, qualify, _) = cli.qualified();
    ok(&out);
    assert_eq!(qualify["outputs"]["speed"]["code"], "speed.pass");
    assert_eq!(
        qualify["outputs"]["settling"], false,
        "CPU lanes never settle"
    );
    let (out, verdict) = cli.run(cli.referee(), Some("qualify.json"), "verdict.json");
    ok(&out);
    assert_eq!(
        (verdict["stage"].as_str(), verdict["outcome"].as_str()),
        (Some("verdict"), Some("ok"))
    );
    assert_eq!(verdict["outputs"]["verdict"], "pass", "{verdict}");
    for read in ["b", "c", "b2"] {
        assert_eq!(
            verdict["outputs"]["graded"][read]["verdict"], "pass",
            "{read}: {verdict}"
        );
    }
    let mut c = Command::new(bin("cordon-verify"));
    c.arg("--store")
        .arg(cli.path("store"))
        .arg(cli.path("verdict.json"));
    ok(&c.output().unwrap());
}

#[test]
fn a_fast_engine_with_wrong_tokens_ends_the_whole_pipeline_in_fail_and_the_chain_replays() {
    let cli = Cli::new(5, "reference-cli", WRONG_KERNEL, true);
    let images = cli.path("images");
    let (out, qualify, qualify_command) = cli.qualified();
    ok(&out);
    assert_eq!(
        qualify["outputs"]["speed"]["code"], "speed.pass",
        "speed alone passes it"
    );

    let referee = || cli.referee();
    // One attempt where the policy requires two could never PASS, but its wrong tokens are
    // a failure proven all the same.
    let (out, primary_only) = cli.run(referee(), Some("qualify.json"), "primary-only.json");
    assert_eq!(out.status.code(), Some(1), "{primary_only}");
    assert_eq!(primary_only["reasons"][0]["code"], "quality.exact");

    // The reproduction: the exact lane exchange of the primary attempt.
    let mut c = qualify_command();
    c.arg("--reproduce").arg(cli.path("qualify.json"));
    let (out, reproduction) = cli.run(c, Some("prebuild.json"), "reproduction.json");
    ok(&out);
    // The primary attempt's receipt, as the referee's no-decision rested on it.
    let first = &primary_only["prev"];
    assert_eq!(&reproduction["outputs"]["reproduces"], first);

    let (out, verdict) = cli.run(referee(), Some("reproduction.json"), "verdict.json");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Both attempts weighed: the primary's wrong tokens are named first.
    assert_eq!(
        &verdict["outputs"]["primary"]["qualify"], first,
        "{verdict}"
    );
    assert!(
        verdict["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("the primary attempt: "),
        "{verdict}"
    );
    assert_eq!(
        (verdict["stage"].as_str(), verdict["outcome"].as_str()),
        (Some("verdict"), Some("rejected"))
    );
    let finding = &verdict["reasons"][0];
    assert_eq!(finding["code"], "quality.exact", "{verdict}");
    assert!(
        finding["message"].as_str().unwrap().contains("request 0"),
        "the first differing request is named: {finding}"
    );
    // The audit ran too, and its receipt is linked.
    assert!(verdict["inputs"]["audit"].is_string(), "{verdict}");

    let mut c = Command::new(bin("cordon-verify"));
    c.arg("--store")
        .arg(cli.path("store"))
        .arg(cli.path("verdict.json"));
    let out = c.output().unwrap();
    ok(&out);

    // The same qualification under a looser quality rule: another authority, refused.
    let mut c = cli.command("cordon-reference", "looser.kdl");
    c.arg("--images")
        .arg(&images)
        .arg("--pristine")
        .arg(cli.path("pristine.json"));
    let (out, _) = cli.run(c, Some("reproduction.json"), "looser.json");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every stage that runs containers or per-run accounts says it needs root before it reads or
/// makes anything (exit 2): run as `nobody`, none makes its store, and each names itself.
/// `cordon-lane model`, which only says where a model belongs, is not refused for it.
#[test]
fn a_root_stage_run_by_another_user_says_so_first_and_makes_nothing() {
    cordon_testkit::require_root("the test runs each stage as nobody");
    let dir = tempfile::tempdir().unwrap();
    // Readable by nobody: the refusal must come before the policy is even read.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let store = dir.path().join("store");
    let policy = workspace_root().join("policy/evaluator.kdl");
    let tree = format!("sha256:{}", "0".repeat(64));
    let sha = format!("sha256:{}", "0".repeat(64));
    for (tool, args) in [
        ("cordon-fetch", vec!["--sha256", &sha, "/nonexistent.tar"]),
        ("cordon-materialize", vec!["verify", &tree]),
        ("cordon-prebuild", vec![]),
        ("cordon-lane", vec!["devices"]),
        ("cordon-reference", vec!["--pristine", "/nonexistent.json"]),
        ("cordon-reap", vec!["--check"]),
    ] {
        let out = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(bin(tool))
            .arg("--policy")
            .arg(&policy)
            .arg("--store")
            .arg(&store)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tool}: {stderr}");
        assert!(
            stderr.contains(&format!("{tool} must run as root (it runs as uid 65534)")),
            "{tool}: {stderr}"
        );
        assert!(!store.exists(), "{tool} made a store");
        // The pipeline's last receipt keeps the truth: a no-decision naming the refusal,
        // printed and never kept; the device report makes no receipt, and prints none.
        let stdout = String::from_utf8_lossy(&out.stdout);
        if tool == "cordon-lane" {
            assert!(stdout.is_empty(), "{tool}: {stdout}");
            continue;
        }
        let r = cordon::receipt::Receipt::parse(stdout.trim_end())
            .unwrap_or_else(|e| panic!("{tool}: {e}: {stdout}"));
        assert_eq!(r.outcome, cordon::receipt::Outcome::NoDecision, "{tool}");
        let codes: Vec<&str> = r.reasons.iter().map(|x| x.code.as_str()).collect();
        assert_eq!(codes, ["stage.not_root", "receipt.unkept"], "{tool}");
    }
}

/// A store that cannot be opened (here: a file where the store should be) still ends the
/// stage with a no-decision receipt on stdout, saying why and that it was never kept.
#[test]
fn a_store_that_cannot_be_opened_still_ends_with_a_receipt_saying_why() {
    cordon_testkit::require_root("the stages run as root");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::write(&store, b"not a store").unwrap();
    let policy = workspace_root().join("policy/evaluator.kdl");
    let out = Command::new(bin("cordon-prebuild"))
        .arg("--policy")
        .arg(&policy)
        .arg("--store")
        .arg(&store)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r = cordon::receipt::Receipt::parse(stdout.trim_end())
        .unwrap_or_else(|e| panic!("{e}: {stdout}: {stderr}"));
    assert_eq!(r.outcome, cordon::receipt::Outcome::NoDecision);
    assert_eq!(r.reasons[0].code, "store.unusable", "{r:?}");
    assert_eq!(r.reasons[1].code, "receipt.unkept", "{r:?}");
    assert_eq!(std::fs::read(&store).unwrap(), b"not a store");
}
