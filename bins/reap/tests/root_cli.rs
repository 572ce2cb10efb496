//! The cordon-reap binary: a quiescence receipt (exit 0), residue listed (exit 3), and
//! recovery of a stale lease record.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::{Outcome, Reason, Receipt, StageName};
use cordon::store::Store;

/// This test's executor: executor locks are host-global, and tests run side by side.
fn executor() -> String {
    format!("cli-{}", std::process::id())
}

/// The default policy with an account range of its own, so that recovery here can never touch
/// the accounts of tests running beside it.
fn policy(dir: &Path, slot: u32) -> std::path::PathBuf {
    let text =
        cordon_testkit::isolated_policy(dir, cordon_testkit::account_range("reap-cli", slot));
    let path = dir.join("policy.kdl");
    std::fs::write(&path, text).unwrap();
    path
}

/// The store in `dir` and this test's executor's lease setup under `policy`, as the stages
/// and `cordon-reap` see them.
fn lease_setup(dir: &Path, policy: &Path) -> (Store, cordon::lease::Setup) {
    let text = std::fs::read_to_string(policy).unwrap();
    let p = cordon_policy_lang::parse("policy.kdl", &text).unwrap();
    let store = Store::open(&dir.join("store")).unwrap();
    let mut setup =
        cordon_stage::settings::lease_setup(&p, &executor(), &dir.join("state"), dir.join("run"));
    setup.watchdog = cordon_testkit::watchdog();
    (store, setup)
}

fn reap(dir: &Path, policy: &Path, check: bool) -> (Option<i32>, serde_json::Value) {
    let mode: &[&str] = if check { &["--check"] } else { &[] };
    reap_as(dir, policy, "store", &executor(), mode)
}

/// `cordon-reap` as `executor` against `dir/store_name`, with extra arguments.
fn reap_as(
    dir: &Path,
    policy: &Path,
    store_name: &str,
    executor: &str,
    extra: &[&str],
) -> (Option<i32>, serde_json::Value) {
    let out = reap_command_at(dir, &dir.join(store_name), policy)
        .args(["--executor", executor])
        .args(extra)
        .output()
        .unwrap();
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
    let policy = policy(dir.path(), 0);
    // A check reads a store that exists (one on a path with none is exit 2).
    Store::open(&dir.path().join("store")).unwrap();
    let (code, r) = reap(dir.path(), &policy, true);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["stage"], "reap");
    assert_eq!(r["outputs"]["quiescent"], true);

    // A supervisor that died after writing its record and creating its account.
    stale_lease(dir.path(), &policy);
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

/// A supervisor that died after writing its lease record and creating its account.
fn stale_lease(dir: &Path, policy: &Path) {
    let (store, setup) = lease_setup(dir, policy);
    let m = Manager::open(&store, setup).unwrap();
    let lease = m
        .begin("sha256:stale", cordon_testkit::in_an_hour())
        .unwrap();
    m.provision(&lease).unwrap();
}

/// A live supervisor's lease (its account, its run directory) as executor `cli-test`, with the
/// manager kept open: the executor is held.
fn live_lease(
    dir: &Path,
    policy: &Path,
    budget: std::time::Duration,
) -> (Manager, cordon::lease::Lease) {
    let (store, setup) = lease_setup(dir, policy);
    let m = Manager::open(&store, setup).unwrap();
    let lease = m.begin("sha256:live", budget).unwrap();
    m.provision(&lease).unwrap();
    (m, lease)
}

/// Move a lease's recorded deadline an hour into the past (a budget cannot be negative).
fn backdate(dir: &Path, lease: &cordon::lease::Lease) {
    let path = dir.join(format!("store/leases/{}.json", lease.record.lease));
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let ms = record["deadline"]["ms"].as_u64().unwrap();
    record["deadline"]["ms"] = ms.saturating_sub(3_600_000).into();
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
}

/// Recovery by another executor, or by the same executor against another store, must not touch
/// a live lease: before, it deleted the run directory (bundle, staging) and removed the account
/// while the container ran.
#[test]
fn recovery_never_touches_another_executors_or_another_stores_live_lease() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: real accounts"
    );
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 1);
    let hour = cordon_testkit::in_an_hour();
    let (m, lease) = live_lease(dir.path(), &policy, hour);
    let intact = |when: &str| {
        assert!(
            lease.run_dir().join("bundle").is_dir(),
            "{when}: run directory touched"
        );
        assert!(
            nix::unistd::User::from_name(&lease.account().name)
                .unwrap()
                .is_some(),
            "{when}: account removed"
        );
    };
    // Another executor: the account in the shared range carries cli's owner tag, the run
    // directory cli's owner file, the record cli's name: none of it is the other's.
    let other = format!("other-{}", std::process::id());
    let (code, r) = reap_as(dir.path(), &policy, "store", &other, &[]);
    intact("another executor's recovery");
    assert_eq!(code, Some(0), "nothing of the other executor exists: {r}");
    assert_eq!(r["outputs"]["released"], serde_json::json!([]));
    // The same executor against another store: the executor lock is host-global.
    let (code, r) = reap_as(dir.path(), &policy, "store2", &executor(), &[]);
    intact("another store's recovery");
    assert_eq!(code, Some(0), "nothing of this executor is in store2: {r}");
    assert_eq!(r["outputs"]["released"], serde_json::json!([]));
    // An executor that is not a plain name is refused at the command line (exit 2, no
    // receipt) before anything is read.
    let out = reap_command_at(dir.path(), &dir.path().join("store"), &policy)
        .args(["--executor", "../x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "a receipt for a typo");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("an executor id is 1 to 64"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    intact("a refused executor");
    m.release(&lease.record).unwrap();
}

/// While the supervisor holds the executor, --check lists its lease as active (exit 3),
/// --status reports it without alarm (exit 0); once past its deadline it is expired, an alarm
/// for both; and with the supervisor gone recovery releases it.
#[test]
fn live_leases_are_active_expired_ones_are_an_alarm_and_a_dead_supervisors_are_released() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: real accounts"
    );
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 2);
    let hour = cordon_testkit::in_an_hour();
    let (m, lease) = live_lease(dir.path(), &policy, hour);
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--check"]);
    assert_eq!(code, Some(3), "{r}");
    assert!(
        r["outputs"]["active"]
            .to_string()
            .contains(&lease.record.lease),
        "{r}"
    );
    assert_eq!(
        r["outputs"]["remaining"],
        serde_json::json!([]),
        "active is not residue"
    );
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(code, Some(0), "{r}");
    // The recovery timer's sweep: a live lease is neither an alarm nor touched; recovery
    // without --sweep still calls it one.
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--sweep"]);
    assert_eq!(code, Some(0), "{r}");
    assert!(
        lease.run_dir().exists(),
        "the sweep left the live lease alone"
    );
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &[]);
    assert_eq!(code, Some(3), "{r}");
    m.release(&lease.record).unwrap();
    drop(m);

    let (m, lease) = live_lease(dir.path(), &policy, std::time::Duration::ZERO);
    backdate(dir.path(), &lease);
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(code, Some(3), "{r}");
    assert!(
        r["outputs"]["remaining"]
            .to_string()
            .contains("expired lease"),
        "{r}"
    );
    // The supervisor dies (its manager and lock go): recovery releases everything.
    drop(m);
    let (code, r) = reap(dir.path(), &policy, false);
    assert_eq!(code, Some(0), "{r}");
    assert!(!lease.run_dir().exists());
}

/// A host reset found by recovery quarantines the executor: every mode of `cordon-reap` then
/// raises it (exit 3, `reap.quarantined`), stages refuse, and only `--clear ID` lifts it — after
/// the strict quiescence check, with a receipt naming the record, and never another
/// executor's.
#[test]
fn a_host_reset_quarantines_the_executor_until_reap_clears_it() {
    cordon_testkit::require_root("recovery removes real accounts");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 3);
    let (store, setup) = lease_setup(dir.path(), &policy);
    // A lease whose record says it was taken on another boot (its supervisor long gone).
    {
        let m = Manager::open(&store, setup.clone()).unwrap();
        let lease = m
            .begin_child("sha256:old", cordon_testkit::in_an_hour())
            .unwrap();
        m.provision(&lease).unwrap();
        let path = store.path("leases", &format!("{}.json", lease.record.lease));
        let text = std::fs::read_to_string(&path).unwrap();
        let boot = std::fs::read_to_string(cordon::lease::BOOT_ID).unwrap();
        // It ran a candidate's tree (as a container session's lease names it).
        let moved = text
            .replace(boot.trim(), "ffffffff-0000-4000-8000-000000000000")
            .replace(
                "\"created_at\"",
                &format!("\"candidate\":\"{}\",\"created_at\"", candidate()),
            );
        assert_ne!(moved, text);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, moved).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    // The monitor's view before recovery: one stale lease, nothing else yet.
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(code, Some(3), "{r}");
    assert_eq!(r["outputs"]["counters"]["stale_leases"], 1, "{r}");
    assert_eq!(r["outputs"]["counters"]["host_resets"], 0, "{r}");
    // Recovery releases it, and quarantines the executor.
    let (code, r) = reap(dir.path(), &policy, false);
    assert_eq!(code, Some(3), "{r}");
    assert!(r["outputs"]["counters"].is_null(), "--status only: {r}");
    // The candidate it ran is not run again under that authority; the recovery's receipt is
    // the one that reported it.
    let found = cordon::lease::incident::find(&store, "sha256:old", &candidate())
        .unwrap()
        .expect("an incident of the candidate the reset interrupted");
    let reported = found.receipt.expect("linked to the recovery's receipt");
    let stored: serde_json::Value = serde_json::from_slice(
        &store
            .read_document("receipts", &format!("{}.json", reported.hex()))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(stored["stage"], "reap", "{stored}");
    assert_eq!(stored["started_at"], r["started_at"], "{stored}");
    assert!(
        r["outputs"]["released"].to_string().contains("lease"),
        "{r}"
    );
    let quarantined = r["outputs"]["quarantined"].as_object().unwrap().clone();
    let (id, q) = quarantined.iter().next().unwrap();
    assert_eq!(q["cause"], "host-reset", "{r}");
    assert_eq!(r["reasons"][0]["code"], "reap.quarantined", "{r}");
    // Every mode says so.
    for mode in [&["--status"][..], &["--check"], &["--sweep"]] {
        let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), mode);
        assert_eq!(code, Some(3), "{mode:?}: {r}");
        assert!(r["outputs"]["quarantined"].get(id).is_some(), "{r}");
    }
    let (_, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(
        r["outputs"]["counters"],
        serde_json::json!({"stale_leases": 0, "oom_kills": 0, "deadline_kills": 0,
            "host_resets": 1, "drain_failures": 0}),
        "{r}"
    );
    // No lease is begun under it.
    let m = Manager::open(&store, setup.clone()).unwrap();
    assert!(matches!(
        m.begin_child("sha256:new", cordon_testkit::in_an_hour()),
        Err(cordon::lease::LeaseError::Quarantined { .. })
    ));
    drop(m);
    // Another executor cannot lift it (a refusal it records); an unknown id is no lift: the
    // operator's typo (exit 2, no receipt), pointing at --status.
    let (code, r) = reap_as(dir.path(), &policy, "store", "cli-other", &["--clear", id]);
    assert_eq!(code, Some(3), "{r}");
    assert!(r["outputs"]["cleared"].is_null(), "{r}");
    let out = reap_command(dir.path(), &policy)
        .args(["--executor", &executor(), "--clear", "00"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "a receipt for a typo");
    assert!(stderr.contains("cordon-reap --status"), "{stderr}");
    // Lifted once quiescent, with a receipt naming what it lifted.
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--clear", id]);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["inputs"]["clear"], id.as_str(), "{r}");
    assert_eq!(&r["outputs"]["cleared"], q, "{r}");
    assert_eq!(r["outputs"]["quiescent"], true, "{r}");
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(code, Some(0), "{r}");
    // The lifted reset still counts (its --clear receipt says so); runs the OOM killer or a
    // deadline ended count once each, from their own receipts, not from summaries.
    assert_eq!(r["outputs"]["counters"]["host_resets"], 1, "{r}");
    for (stage, code) in [
        (StageName::Lane, "lane.oom"),
        (StageName::Prebuild, "prebuild.deadline"),
        (StageName::Qualify, "lane.workload-deadline"),
    ] {
        let mut run = Receipt::new(stage, Digest::of_bytes(b"a"), Outcome::Rejected);
        run.reasons.push(Reason {
            code: code.into(),
            message: "ended".into(),
        });
        let text = cordon::canonical::to_canonical_json(&run).unwrap();
        let name = format!("{}.json", Digest::of_bytes(text.as_bytes()).hex());
        store
            .put_document("receipts", &name, text.as_bytes())
            .unwrap();
    }
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["outputs"]["counters"]["oom_kills"], 1, "{r}");
    assert_eq!(r["outputs"]["counters"]["deadline_kills"], 1, "{r}");
    // A receipt that cannot be read is never counted as nothing.
    store
        .put_document("receipts", "junk.json", b"not a receipt")
        .unwrap();
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--status"]);
    assert_eq!(code, Some(3), "{r}");
    assert!(
        r["outputs"]["remaining"].to_string().contains("junk.json"),
        "{r}"
    );
    std::fs::remove_file(store.path("receipts", "junk.json")).unwrap();
    // An operator stops new work by hand (the checklist's step 1 for an incident found
    // outside cordon); --clear lifts it like any other.
    let why = "suspected escape: \u{1b}[2J";
    let (code, r) = reap_as(
        dir.path(),
        &policy,
        "store",
        &executor(),
        &["--quarantine", why],
    );
    assert_eq!(code, Some(3), "{r}");
    assert_eq!(r["inputs"]["quarantine"], why, "{r}");
    let quarantined = r["outputs"]["quarantined"].as_object().unwrap().clone();
    let (id, q) = quarantined.iter().next().unwrap();
    assert_eq!(q["cause"], "operator", "{r}");
    let m = Manager::open(&store, setup).unwrap();
    assert!(matches!(
        m.begin_child("sha256:new", cordon_testkit::in_an_hour()),
        Err(cordon::lease::LeaseError::Quarantined { .. })
    ));
    drop(m);
    let (code, r) = reap_as(dir.path(), &policy, "store", &executor(), &["--clear", id]);
    assert_eq!(code, Some(0), "{r}");
}

/// The engine tree the host-reset test's lease ran.
fn candidate() -> Digest {
    Digest::of_bytes(b"the interrupted candidate's tree")
}

/// A check or a status on a mistyped store path makes nothing and answers nothing quiescent:
/// exit 2, naming the path, in ASCII where the terminal shows no more.
#[test]
fn a_check_on_a_store_that_is_not_there_is_the_operators_mistake_and_makes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 6);
    for mode in ["--check", "--status"] {
        let out = reap_command_at(dir.path(), &dir.path().join("stroe"), &policy)
            .args(["--executor", &executor(), mode])
            // A terminal that shows only ASCII gets only ASCII (no box drawing).
            .env_remove("LC_ALL")
            .env("LANG", "C")
            .env("TERM", "dumb")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode}: {stderr}");
        assert!(stderr.contains("no store at"), "{mode}: {stderr}");
        assert!(stderr.is_ascii(), "{mode}: {stderr}");
        assert!(!dir.path().join("stroe").exists(), "{mode} made a store");
    }
}

/// Whether `stderr` ends with a duration (`840 ms`, `1.3 s`).
fn timed(stderr: &str) -> bool {
    stderr.ends_with(" ms\n") || stderr.ends_with(" s\n")
}

/// `cordon-reap --check` with `extra` arguments and environment, stderr piped: its exit code,
/// its receipt's digest and its stderr.
fn check_said(
    (dir, store): (&Path, &Path),
    policy: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, Digest, String) {
    let out = check_command((dir, store), policy, extra, env)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let receipt = Receipt::parse(text.trim_end()).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    (out.status.code(), receipt.digest().unwrap(), stderr)
}

fn check_command(
    (dir, store): (&Path, &Path),
    policy: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let mut c = reap_command_at(dir, store, policy);
    c.arg("--check")
        .args(["--executor", &executor()])
        .args(extra)
        .env_remove("NO_COLOR")
        .env_remove("LC_ALL")
        .env_remove("LC_CTYPE")
        .env("LANG", "C.UTF-8")
        .env("TERM", "xterm");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A stage ends with one line: its outcome, its receipt's digest whole (never wrapped when
/// piped) and its duration; the reasons nothing else said (a check's residue) come before it;
/// `-q` says nothing, `-v` each part of the authority; ASCII under `LANG=C TERM=dumb`.
#[test]
fn a_stage_says_its_outcome_receipt_and_duration_in_one_line_and_nothing_under_quiet() {
    cordon_testkit::require_root("reap checks root's leases");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 7);
    Store::open(&dir.path().join("store")).unwrap();

    let (code, digest, stderr) =
        check_said((dir.path(), &dir.path().join("store")), &policy, &[], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let line = format!("cordon-reap: ok · receipt {digest} · ");
    assert!(stderr.starts_with(&line) && timed(&stderr), "{stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let (code, _, stderr) = check_said(
        (dir.path(), &dir.path().join("store")),
        &policy,
        &["-q"],
        &[],
    );
    assert_eq!((code, stderr.as_str()), (Some(0), ""));

    let (code, digest, stderr) = check_said(
        (dir.path(), &dir.path().join("store")),
        &policy,
        &["-v"],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let runtime = format!("runtime {} at ", cordon_testkit::test_runtime().0);
    for part in [
        "policy ",
        &runtime,
        "binary cordon-reap: sha256:",
        "authority sha256:",
    ] {
        assert!(
            stderr.lines().any(|l| l.starts_with(part)),
            "{part}: {stderr}"
        );
    }
    assert!(
        timed(&stderr) && stderr.contains(&digest.to_string()),
        "{stderr}"
    );

    // A stale lease: the residue is listed, then the no-decision.
    stale_lease(dir.path(), &policy);
    let (code, digest, stderr) = check_said(
        (dir.path(), &dir.path().join("store")),
        &policy,
        &[],
        &[("LANG", "C"), ("TERM", "dumb")],
    );
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.is_ascii(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cordon-reap: reap.residue: ") && l.contains("account cordon-")),
        "{stderr}"
    );
    let last = format!("cordon-reap: no-decision (reap.residue) - receipt {digest} - ");
    assert!(lines.last().unwrap().starts_with(&last), "{stderr}");

    // Recover, so that nothing is left for the tests beside it.
    let (code, _) = reap(dir.path(), &policy, false);
    assert_eq!(code, Some(0));
}

/// On a terminal the outcome is coloured, never under `NO_COLOR`; the receipt on stdout is the
/// same bytes either way.
#[test]
fn on_a_terminal_the_outcome_is_coloured_and_never_under_no_color() {
    cordon_testkit::require_root("reap checks root's leases");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 8);
    Store::open(&dir.path().join("store")).unwrap();
    let tty = cordon_testkit::pty::run(
        check_command((dir.path(), &dir.path().join("store")), &policy, &[], &[]),
        false,
        b"",
    );
    assert_eq!(tty.code, Some(0), "{}", tty.terminal);
    assert!(
        tty.terminal
            .contains("cordon-reap: \u{1b}[32mok\u{1b}[0m · receipt sha256:"),
        "{:?}",
        tty.terminal
    );
    Receipt::parse(String::from_utf8(tty.stdout).unwrap().trim_end()).unwrap();

    let plain = cordon_testkit::pty::run(
        check_command(
            (dir.path(), &dir.path().join("store")),
            &policy,
            &[],
            &[("NO_COLOR", "1")],
        ),
        false,
        b"",
    );
    assert_eq!(plain.code, Some(0), "{}", plain.terminal);
    assert!(!plain.terminal.contains('\u{1b}'), "{:?}", plain.terminal);
    assert!(
        plain.terminal.contains("cordon-reap: ok · receipt sha256:"),
        "{:?}",
        plain.terminal
    );
}

/// Unmounts its path when dropped, whatever the test came to.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount(&self.0);
    }
}

/// A store on a read-only file system serves the commands that only read it: a check answers
/// with its receipt on stdout, saying it was never kept; the store is left as it was.
#[test]
fn a_read_only_store_serves_a_check_and_its_receipt_says_it_was_not_kept() {
    cordon_testkit::require_root("a read-only bind mount");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 9);
    // The store's file system is read-only (a volume mounted so), not a mount on the store.
    let volume = dir.path().join("volume");
    std::fs::create_dir(&volume).unwrap();
    let root = volume.join("store");
    let store = Store::open(&root).unwrap();
    let before = store.content_listing().unwrap();
    let receipts = || std::fs::read_dir(root.join("receipts")).unwrap().count();
    let kept = receipts();
    use nix::mount::{MsFlags, mount};
    mount(
        Some(&volume),
        &volume,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let _guard = Mounted(volume.clone());
    mount(
        None::<&str>,
        &volume,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
    let (code, digest, stderr) = check_said((dir.path(), &root), &policy, &[], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("(receipt.unkept)") && stderr.contains(&digest.to_string()),
        "{stderr}"
    );
    let out = check_command((dir.path(), &root), &policy, &[], &[])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["reasons"][0]["code"], "receipt.unkept", "{r}");
    // A recovery writes into the store: on a read-only one it established nothing it could
    // keep, whatever it found, and says so as a no-decision (exit 3), never an unkept "ok".
    let out = reap_command_at(dir.path(), &root, &policy)
        .args(["--executor", &executor()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["outcome"], "no-decision", "{r}");
    assert!(r["reasons"].to_string().contains("receipt.unkept"), "{r}");
    assert_eq!(receipts(), kept, "a receipt was stored");
    assert_eq!(store.content_listing().unwrap(), before);
}

/// `--list` names every lease record in the store, its executor and whether its supervisor
/// lives, and every executor lock with its holder; it changes nothing and prints no receipt.
#[test]
fn list_names_each_lease_its_supervisor_and_each_executor_lock() {
    cordon_testkit::require_root("reap reads root's leases");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 4);
    let (store, setup) = lease_setup(dir.path(), &policy);
    let held = Manager::open(&store, setup).unwrap();
    let lease = held
        .begin("sha256:listed", cordon_testkit::in_an_hour())
        .unwrap();
    let out = reap_command(dir.path(), &policy)
        .args(["--executor", &executor(), "--list"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("lease {} ", lease.record.lease)))
        .unwrap_or_else(|| panic!("{stdout}"));
    let me = std::process::id();
    assert!(
        line.contains(&format!(
            "executor {} supervisor pid {me} (live)",
            executor()
        )),
        "{line}"
    );
    assert!(
        stdout.contains(&format!("executor {} held by pid {me}", executor())),
        "{stdout}"
    );
    assert!(
        Receipt::parse(stdout.lines().next().unwrap()).is_err(),
        "a listing, not a receipt"
    );
    held.release(&lease.record).unwrap();
}

/// `--gc` removes what no record and no pin names, listed on stdout; `--dry-run` only lists;
/// the collector is refused while any other command holds the store (a reader here), and a
/// receipt's evidence stays.
#[test]
fn gc_removes_only_what_nothing_names_and_never_under_a_writer() {
    cordon_testkit::require_root("reap reads root's store");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 5);
    let root = dir.path().join("store");
    let (code, r) = {
        Store::open(&root).unwrap();
        reap(dir.path(), &policy, true)
    };
    assert_eq!(code, Some(0), "{r}");
    let evidence: Vec<String> = r["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["sha256"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:")
                .to_owned()
        })
        .collect();
    assert!(
        !evidence.is_empty(),
        "the receipt names its authority's parts: {r}"
    );
    let pin = {
        let text = std::fs::read_to_string(&policy).unwrap();
        cordon_policy_lang::parse("policy.kdl", &text)
            .unwrap()
            .images()["runtime"]
            .hex()
    };
    let other = Digest::of_bytes(b"an image no pin names").hex();
    let orphan = {
        let store = Store::open(&root).unwrap();
        for image in [&pin, &other] {
            std::fs::create_dir_all(store.path("images", image).join("rootfs")).unwrap();
        }
        store
            .put_object(b"a crashed writer's object")
            .unwrap()
            .hex()
    };
    let orphan_path = format!("objects/{}/{orphan}", &orphan[..2]);
    let gc = |extra: &[&str]| {
        reap_command(dir.path(), &policy)
            .arg("--gc")
            .args(extra)
            .output()
            .unwrap()
    };

    // Listed without holding the store (a reader's hold would refuse the collection).
    let store = Store::open_to_collect(&root).unwrap();
    let before = store.listing().unwrap();
    let out = gc(&["--dry-run"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut listed: Vec<&str> = stdout.lines().filter_map(|l| l.split(' ').next()).collect();
    listed.sort_unstable();
    assert_eq!(listed, vec![format!("images/{other}"), orphan_path.clone()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("would remove 2 entries"));
    assert_eq!(
        store.listing().unwrap(),
        before,
        "a dry run changed the store"
    );

    let writer = Store::open_existing(&root).unwrap();
    let out = gc(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("in use") && stderr.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );
    assert_eq!(
        store.listing().unwrap(),
        before,
        "a refused collection changed the store"
    );
    drop(writer);

    let out = gc(&[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        stdout,
        "what it said it would"
    );
    assert!(!root.join(&orphan_path).exists());
    assert!(!store.path("images", &other).exists());
    assert!(store.path("images", &pin).exists(), "a pinned image went");
    for e in &evidence {
        assert!(store.path("evidence", e).exists(), "evidence {e} went");
    }
    let (code, r) = reap(dir.path(), &policy, true);
    assert_eq!(code, Some(0), "{r}");
}

/// `cordon-reap` with this test's policy, store, state root and run directory.
fn reap_command(dir: &Path, policy: &Path) -> Command {
    reap_command_at(dir, &dir.join("store"), policy)
}

/// [`reap_command`] on the store at `store`.
fn reap_command_at(dir: &Path, store: &Path, policy: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cordon-reap"));
    c.arg("--policy")
        .arg(policy)
        .arg("--store")
        .arg(store)
        .arg("--state-root")
        .arg(dir.join("state"))
        .arg("--run-dir")
        .arg(dir.join("run"));
    c
}
