//! The cordon-reap binary: a quiescence receipt (exit 0), residue listed (exit 3), and
//! recovery of a stale lease record.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use cordon::lease::Manager;
use cordon::store::Store;

/// The default policy with an account range of its own, so that recovery here can never touch
/// the accounts of tests running beside it.
fn policy(dir: &Path) -> std::path::PathBuf {
    let text = cordon_testkit::isolated_policy(dir, cordon_testkit::account_range("reap-cli", 0));
    let path = dir.join("policy.kdl");
    std::fs::write(&path, text).unwrap();
    path
}

fn reap(dir: &Path, policy: &Path, check: bool) -> (Option<i32>, serde_json::Value) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cordon-reap"));
    c.arg("--policy")
        .arg(policy)
        .arg("--store")
        .arg(dir.join("store"))
        .arg("--state-root")
        .arg(dir.join("state"))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .args(["--executor", "cli-test"]);
    if check {
        c.arg("--check");
    }
    let out = c.output().unwrap();
    let receipt = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no receipt: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), receipt)
}

#[test]
fn check_is_a_quiescence_receipt_and_recovery_releases_a_stale_lease() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: recovery removes real accounts"
    );
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path());
    let (code, r) = reap(dir.path(), &policy, true);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["stage"], "reap");
    assert_eq!(r["outputs"]["quiescent"], true);

    // A supervisor that died after writing its record and creating its account.
    let text = std::fs::read_to_string(&policy).unwrap();
    let p = cordon_policy_lang::parse("policy.kdl", &text).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let setup = cordon_stage::settings::lease_setup(
        &p,
        "cli-test",
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    {
        let m = Manager::open(&store, setup).unwrap();
        let lease = m.begin("sha256:stale").unwrap();
        m.provision(&lease).unwrap();
    }
    let (code, r) = reap(dir.path(), &policy, true);
    assert_eq!(code, Some(3), "{r}");
    assert_eq!(r["outcome"], "no-decision");
    let remaining = r["outputs"]["remaining"].to_string();
    assert!(
        remaining.contains("lease record") && remaining.contains("account cordon-"),
        "{remaining}"
    );

    let (code, r) = reap(dir.path(), &policy, false);
    assert_eq!(code, Some(0), "{r}");
    assert!(r["outputs"]["released"].to_string().contains("lease"));
    let (code, _) = reap(dir.path(), &policy, true);
    assert_eq!(code, Some(0));
}
