//! The materialize binary end to end, as root: `cordon-fetch` admits the delta and
//! `cordon-materialize` analyses it, each through its confined parser child running as a real
//! per-run account (in this test's own id block), so this is the root tier.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{MANIFEST, delta_tar};
use cordon::canonical::Digest;
use cordon_testkit::workspace_root;

fn bin(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_BIN_EXE_cordon-materialize"))
        .with_file_name(name)
        .to_path_buf()
}

/// The stage binaries run against one store and the default policy with its run accounts in
/// this test's own id block `slot` (their parser children run as real accounts).
struct Cli {
    dir: tempfile::TempDir,
    store: std::path::PathBuf,
    policy: std::path::PathBuf,
}

impl Cli {
    fn new(slot: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let policy = dir.path().join("policy.kdl");
        std::fs::write(
            &policy,
            cordon_testkit::isolated_policy(
                dir.path(),
                cordon_testkit::account_range("materialize", slot),
            ),
        )
        .unwrap();
        Self { dir, store, policy }
    }

    /// `binary` with this test's policy, store and lease options.
    fn command(&self, binary: &str) -> Command {
        let mut c = Command::new(bin(binary));
        c.arg("--policy")
            .arg(&self.policy)
            .arg("--store")
            .arg(&self.store)
            .arg("--run-dir")
            .arg(self.dir.path().join("run"))
            .arg("--executor")
            .arg(format!(
                "materialize-test-{}",
                self.dir.path().file_name().unwrap().to_str().unwrap()
            ));
        c
    }

    fn materialize(&self, args: &[&str], stdin: Option<&Path>) -> std::process::Output {
        let mut c = self.command("cordon-materialize");
        c.args(args);
        if let Some(p) = stdin {
            c.stdin(std::fs::File::open(p).unwrap());
        }
        c.output().unwrap()
    }

    /// Register the bundled example incumbent; its tree digest.
    fn incumbent(&self) -> String {
        let example = workspace_root().join("checks/example/incumbent");
        let out = self.materialize(&["incumbent", example.to_str().unwrap()], None);
        assert!(out.status.success(), "{out:?}");
        let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        receipt["outputs"]["tree_digest"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Admit `archive` through `cordon-fetch`; the file holding its receipt.
    fn fetch(&self, archive: &[u8]) -> (std::path::PathBuf, std::process::Output) {
        let path = self.dir.path().join("delta.tar");
        std::fs::write(&path, archive).unwrap();
        let sha = Digest::of_file(&path).unwrap();
        let fetched = self
            .command("cordon-fetch")
            .args(["--sha256", &sha.to_string()])
            .arg(&path)
            .output()
            .expect("cordon-fetch is built beside cordon-materialize (cargo build --workspace)");
        assert!(fetched.status.success(), "{fetched:?}");
        let receipt_file = self.dir.path().join("fetch.json");
        std::fs::write(&receipt_file, &fetched.stdout).unwrap();
        (receipt_file, fetched)
    }
}

#[test]
fn a_deeply_nested_manifest_is_a_rejection_with_a_receipt_never_a_crash() {
    let cli = Cli::new(0);
    let incumbent = cli.incumbent();
    // 30 KB that overflowed the parser's stack (exit 134, no receipt) before nesting was bounded.
    let depth = 15_000;
    let manifest = format!("{}{}", "a{".repeat(depth), "}".repeat(depth));
    let (receipt_file, _) = cli.fetch(&delta_tar(&[(
        "cordon-delta.kdl",
        manifest.as_bytes(),
        0o644,
    )]));
    let out = cli.materialize(&["--incumbent", &incumbent], Some(&receipt_file));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["outcome"], "rejected");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cordon::manifest::too-deep"), "{stderr}");
}

#[test]
fn the_binary_reports_findings_on_the_candidates_source_and_exits_1() {
    let cli = Cli::new(1);
    let incumbent = cli.incumbent();
    let (receipt_file, fetched) = cli.fetch(&delta_tar(&[
        ("cordon-delta.kdl", MANIFEST, 0o644),
        (
            "engine/attention/__init__.py",
            b"import os\n\nx = eval(os.environ['X'])\n",
            0o644,
        ),
    ]));
    let run = |args: &[&str], stdin: Option<&Path>| cli.materialize(args, stdin);

    let out = run(&["--incumbent", &incumbent], Some(&receipt_file));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("python.ban-call"), "{stderr}");
    assert!(
        stderr.contains("engine/attention/__init__.py:3:5"),
        "{stderr}"
    );
    assert!(
        stderr.contains("x = eval(os.environ['X'])"),
        "the source line is shown: {stderr}"
    );
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["outcome"], "rejected");
    assert_eq!(receipt["reasons"][0]["code"], "python.ban-call");
    assert_eq!(receipt["outputs"]["findings"][0]["line"], 3);

    // A receipt of another authority is refused as an input-wiring error.
    let mut foreign: serde_json::Value = serde_json::from_slice(&fetched.stdout).unwrap();
    foreign["authority"] = serde_json::json!(Digest::of_bytes(b"other").to_string());
    std::fs::write(&receipt_file, foreign.to_string()).unwrap();
    let out = run(&["--incumbent", &incumbent], Some(&receipt_file));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("authority"));

    // A receipt written by hand under the right authority names nothing the store established:
    // the store does not hold it, so its chain cannot be walked, and it is refused.
    let mut forged: serde_json::Value = serde_json::from_slice(&fetched.stdout).unwrap();
    forged["outputs"]["files"] = serde_json::json!(999);
    std::fs::write(&receipt_file, forged.to_string()).unwrap();
    let out = run(&["--incumbent", &incumbent], Some(&receipt_file));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cordon::chain::missing"), "{stderr}");
}

/// One realistic Python module of about `bytes` bytes: imports, constants, classes with
/// methods, docstrings, comprehensions, f-strings, the shapes an engine tree is made of.
fn module(index: usize, bytes: usize) -> String {
    let mut text = format!(
        "\"\"\"Kernel module {index}: blocks of the attention engine.\"\"\"\n\nimport math\n\
         from dataclasses import dataclass\n\nSCALE_{index} = {index}.5\n\n"
    );
    let mut block = 0;
    while text.len() < bytes {
        text.push_str(&format!(
            "\n@dataclass\nclass Block{block}:\n    \"\"\"A block of {block} heads.\"\"\"\n\n    \
             heads: int = {block}\n    width: float = 1.0\n\n    def scores(self, row):\n        \
             total = sum(x * self.width for x in row if x > 0)\n        \
             table = {{k: math.sqrt(abs(v)) for k, v in enumerate(row)}}\n        \
             return [total / max(1, self.heads), table, f\"block {{self.heads}}: {{total:.3f}}\"]\n\n\
             def step_{block}(values, scale=SCALE_{index}):\n    out = []\n    \
             for i, v in enumerate(values):\n        if i % 2:\n            out.append(v * scale)\n        \
             else:\n            out.append(-v)\n    return out\n"
        ));
        block += 1;
    }
    text
}

#[test]
fn a_tree_of_hundreds_of_realistic_python_files_and_a_long_literal_pass() {
    let cli = Cli::new(2);
    let incumbent = cli.incumbent();
    // 320 modules of 2 to 32 KiB (about 5.5 MiB) in nested packages, and one valid file holding a
    // 65 000-character literal: each shape once killed the analysis child (its allocator opened
    // a /proc file under the seccomp filter), an honest candidate rejected for cordon's fault.
    let (receipt_file, _) = cli.fetch(&hundreds_of_modules());
    let out = cli.materialize(&["--incumbent", &incumbent], Some(&receipt_file));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["outcome"], "ok");
}

/// A banned call past column 65 535 (where the source renderer's padding overflows) is an
/// ordinary rejection: the receipt is stored and printed, exit 1, and the finding reaches
/// stderr after it, as its one line.
#[test]
fn a_finding_far_right_on_a_long_line_is_a_recorded_rejection() {
    let cli = Cli::new(3);
    let incumbent = cli.incumbent();
    let file = format!("x = \"{}\"; eval(\"1\")\n", "a".repeat(70_000));
    let members: Vec<common::Member<'_>> = vec![
        ("cordon-delta.kdl", MANIFEST, 0o644),
        ("engine/attention/__init__.py", file.as_bytes(), 0o644),
    ];
    let (receipt_file, _) = cli.fetch(&delta_tar(&members));
    let out = cli.materialize(&["--incumbent", &incumbent], Some(&receipt_file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["outcome"], "rejected");
    assert!(
        receipt["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["code"] == "python.ban-call"),
        "{receipt}"
    );
    assert!(stderr.contains("python.ban-call"), "{stderr}");
}

/// A delta of 320 realistic modules of 2 to 32 KiB (about 5.5 MiB) in 16 nested packages and
/// one file holding a 65 000-character literal: its archive.
fn hundreds_of_modules() -> Vec<u8> {
    let mut owned: Vec<(String, Vec<u8>)> = (0..320)
        .map(|i| {
            let size = 2048 + (i * 9_973) % (30 * 1024);
            (
                format!("engine/attention/pkg{}/mod{i}.py", i % 16),
                module(i, size).into_bytes(),
            )
        })
        .collect();
    for p in 0..16 {
        owned.push((format!("engine/attention/pkg{p}/__init__.py"), Vec::new()));
    }
    owned.push((
        "engine/attention/table.py".into(),
        format!("TABLE = \"{}\"\n", "ab".repeat(32_500)).into_bytes(),
    ));
    owned.push((
        "engine/attention/__init__.py".into(),
        b"from . import table\n".to_vec(),
    ));
    let mut members: Vec<common::Member<'_>> = vec![("cordon-delta.kdl", MANIFEST, 0o644)];
    members.extend(owned.iter().map(|(p, d)| (p.as_str(), d.as_slice(), 0o644)));
    delta_tar(&members)
}

/// SIGHUP to `cordon-materialize` while its confined child analyses a large delta: the child
/// is stopped, its lease released (no account, run directory or record), and the stage ends with
/// exit 3 and a stored no-decision naming the signal.
#[test]
fn a_signal_mid_analysis_stops_the_child_and_leaves_a_no_decision_naming_it() {
    let cli = Cli::new(4);
    let incumbent = cli.incumbent();
    let (receipt_file, _) = cli.fetch(&hundreds_of_modules());
    let child = cli
        .command("cordon-materialize")
        .args(["--incumbent", &incumbent])
        .stdin(std::fs::File::open(&receipt_file).unwrap())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stage = child.id();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while cordon_testkit::children_with_arg(stage, cordon::confine::CHILD_ARG).is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "no analysis child appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(stage).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let out = child.wait_with_output().unwrap();
    cordon_testkit::assert_stopped_by(
        "SIGHUP",
        &out,
        (&cli.store, &cli.dir.path().join("run"), cli.dir.path()),
        None,
        ("materialize", 4),
    );
}

/// Reopening a tree in a store that is not there makes no store: exit 2, naming the path.
#[test]
fn verify_on_a_store_that_is_not_there_makes_nothing_and_is_exit_2() {
    let cli = Cli::new(5);
    let tree = format!("sha256:{}", "0".repeat(64));
    let out = cli.materialize(&["verify", &tree], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no store at"), "{stderr}");
    assert!(!cli.store.exists(), "verify made a store");
    // A store that holds no such tree: the digest or the store is the operator's to check.
    cordon::store::Store::open(&cli.store).unwrap();
    let out = cli.materialize(&["verify", &tree], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("check --store and the digest"), "{stderr}");
}

/// A stage left waiting on a terminal for its input receipt says what it waits for, before
/// the wait; the end of input that follows is a usage error (exit 2), never a verdict. With
/// stdin a pipe it says nothing of the kind.
#[test]
fn a_stage_reading_its_receipt_from_a_terminal_says_so_before_it_waits() {
    let cli = Cli::new(6);
    let tree = cli.incumbent();
    let mut c = cli.command("cordon-materialize");
    c.args(["--incumbent", &tree]).env("LANG", "C.UTF-8");
    let tty = cordon_testkit::pty::run(c, true, b"\x04");
    assert_eq!(tty.code, Some(2), "{}", tty.terminal);
    assert!(
        tty.terminal.contains(
            "cordon-materialize: reading the input receipt from stdin, which is a terminal"
        ),
        "{:?}",
        tty.terminal
    );
    assert!(tty.stdout.is_empty());

    let piped = cli.materialize(&["--incumbent", &tree], None);
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert_eq!(piped.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("which is a terminal"), "{stderr}");
}

/// A receipt made under another authority is refused (exit 2) naming what differs: the
/// policy, and the policy value that changed, read from the parts the receipt names as its
/// evidence; the receipt itself names them.
#[test]
fn a_foreign_authority_is_refused_naming_the_part_that_differs() {
    let cli = Cli::new(7);
    let incumbent = cli.incumbent();
    let (receipt_file, fetched) =
        cli.fetch(&common::delta_tar(&[("cordon-delta.kdl", MANIFEST, 0o644)]));
    let receipt: serde_json::Value = serde_json::from_slice(&fetched.stdout).unwrap();
    let parts: Vec<&str> = receipt["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        parts.contains(&"authority") && parts.contains(&"policy"),
        "{receipt}"
    );
    // The operator tightened one bound between the two stages.
    let text = std::fs::read_to_string(&cli.policy).unwrap();
    std::fs::write(
        &cli.policy,
        text.replacen("max-files 50000", "max-files 40000", 1),
    )
    .unwrap();
    let out = cli.materialize(&["--incumbent", &incumbent], Some(&receipt_file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("what differs: the policy: sha256:"),
        "{stderr}"
    );
    assert!(
        stderr.contains("policy value tree.limits.max-files: 50000 → 40000"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("the binary"),
        "only the policy changed: {stderr}"
    );
}
