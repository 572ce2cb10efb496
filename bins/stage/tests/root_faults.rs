//! Failure paths of a real session, through the host seam: each case fails one real call
//! ([`Interposed`] passes every other to the host) and checks that the session ends in a
//! no-decision, never a result, and what the executor is left with — nothing at all where
//! release can still do its work, or residue that a later recovery on the plain host removes
//! where the failing call was release's own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cordon::exit::ExitClass;
use cordon::lease::Leftover;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cordon::host::MountRequest;
use cordon::host::fake::{Call, Interposed};
use cordon::host::{HostRef, Linux};
use cordon::lease::Manager;

/// Run a trivial session with the calls `fail` picks failed; the session must fail with a
/// no-decision. Returns the failure's text, what the executor had left right after (after a
/// recovery on the plain host it must be nothing), the interposed host, and the text of every
/// piece of evidence the store kept.
fn fail_one(
    slot: u32,
    fail: impl Fn(&Call) -> bool + Send + Sync + 'static,
) -> (String, Vec<Leftover>, Arc<Interposed>, Vec<String>) {
    let w = common::world();
    let policy = common::policy(&w, "stage-faults", slot);
    let host = Arc::new(Interposed::new().failing(fail));
    let setup = common::setup(
        &w,
        &policy,
        &format!("faults-{slot}"),
        host.clone() as HostRef,
    );
    let err = common::run(&w, &policy, &setup, "echo ran")
        .expect_err("the injected failure must end the session");
    assert_eq!(
        err.exit_class(),
        cordon::ExitCode::NoDecision,
        "a host failure is a no-decision: {err}"
    );
    let left = common::left(&w, &setup);
    let mut clean = setup.clone();
    clean.runtime.host = Linux::shared();
    Manager::open(&w.store, clean.clone())
        .unwrap()
        .recover()
        .unwrap_or_else(|e| panic!("recovery on the plain host failed: {e}"));
    let after = common::left(&w, &clean);
    assert!(after.is_empty(), "not quiescent after recovery: {after:?}");
    // Nothing of the run account is left in the host's databases or deny files.
    cordon_testkit::assert_no_accounts("stage-faults", slot);
    for deny in ["cron.deny", "at.deny"] {
        // A deny file never written (its first edit failed, or came after the failure) names no
        // one; any other read error fails the test.
        let text = match std::fs::read_to_string(w.dir.path().join(deny)) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => panic!("{deny}: {e}"),
        };
        assert!(!text.contains("cordon-"), "{deny} still names {text}");
    }
    let evidence = std::fs::read_dir(w.store.root().join("evidence"))
        .unwrap()
        .map(|e| String::from_utf8_lossy(&std::fs::read(e.unwrap().path()).unwrap()).into_owned())
        .collect();
    (format!("{err}"), left, host, evidence)
}

/// A second session on an executor a live manager holds is refused at once, creating nothing:
/// the documented choice is "refuse", never "wait".
#[test]
fn a_second_run_on_a_held_executor_is_refused_and_creates_nothing() {
    let w = common::world();
    let policy = common::policy(&w, "stage-faults", 7);
    let host = Arc::new(Interposed::new());
    let setup = common::setup(&w, &policy, "faults-7", host.clone() as HostRef);
    let holder = Manager::open(&w.store, setup.clone()).unwrap();
    let err = common::run(&w, &policy, &setup, "echo ran").expect_err("the executor is held");
    assert!(
        matches!(
            &err,
            cordon_stage::session::SessionError::Lease(cordon::lease::LeaseError::Busy { .. })
        ),
        "{err}"
    );
    assert_eq!(err.exit_class(), cordon::ExitCode::NoDecision);
    assert!(
        !host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Run(_) | Call::Spawn(_) | Call::Mount(_))),
        "nothing was created: {:?}",
        host.calls()
    );
    drop(holder);
    assert_eq!(
        common::run(&w, &policy, &setup, "echo ran").unwrap(),
        "ran\n"
    );
}

fn runs(call: &Call, needle: &str) -> bool {
    matches!(call, Call::Run(line) if line.contains(needle))
}

#[test]
fn useradd_failing_after_a_real_groupadd_leaves_no_group() {
    let (err, left, host, _) = fail_one(0, |c| runs(c, "useradd "));
    assert!(err.contains("useradd"), "{err}");
    assert!(
        host.calls().iter().any(|c| runs(c, "groupdel ")),
        "release removes the group groupadd made"
    );
    assert!(left.is_empty(), "release left {left:?}");
}

#[test]
fn a_deny_file_that_cannot_be_edited_ends_the_run_before_anything_starts() {
    // Only the first edit (the append) fails; release's own edit works.
    let failed = AtomicBool::new(false);
    let (err, left, host, _) = fail_one(1, move |c| {
        matches!(c, Call::Edit(p) if p.ends_with("cron.deny"))
            && !failed.swap(true, Ordering::SeqCst)
    });
    assert!(err.contains("cron.deny"), "{err}");
    // The lease's watchdog is started with its record; the runtime is never.
    assert!(
        !host.calls().iter().any(
            |c| matches!(c, Call::Spawn(l) if !l.contains(cordon::lease::watchdog::WATCHDOG_ARG))
        ),
        "no container was created"
    );
    assert!(left.is_empty(), "release left {left:?}");
}

#[test]
fn a_staging_mount_that_fails_after_tmp_unmounts_tmp() {
    let (err, left, host, _) = fail_one(
        2,
        |c| matches!(c, Call::Mount(MountRequest::Tmpfs { target, .. }) if target.ends_with("staging")),
    );
    assert!(err.contains("staging"), "{err}");
    let calls = host.calls();
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, Call::Mount(m) if m.target().ends_with("tmp"))),
        "tmp was mounted first: {calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, Call::Unmount(t) if t.ends_with("tmp"))),
        "and unmounted at release: {calls:?}"
    );
    assert!(left.is_empty(), "release left {left:?}");
}

#[test]
fn an_unmount_that_fails_at_release_is_residue_until_recovery() {
    let (err, left, _, evidence) = fail_one(
        3,
        |c| matches!(c, Call::Unmount(t) if t.ends_with("staging")),
    );
    assert!(
        left.iter()
            .any(|l| matches!(l, Leftover::Mount { path } if path.contains("staging"))),
        "the mount that would not go is residue, and the lease with it: {left:?}"
    );
    // The release's own error is kept as evidence (`teardown`) beside the host's records.
    assert!(
        evidence
            .iter()
            .any(|e| e.starts_with(&err) && e.contains("staging")),
        "no teardown evidence naming {err:?}: {evidence:?}"
    );
}

#[test]
fn a_runtime_create_that_fails_leaves_nothing() {
    let (_, left, _, _) = fail_one(4, |c| matches!(c, Call::Spawn(l) if l.contains(" create ")));
    assert!(left.is_empty(), "release left {left:?}");
}

#[test]
fn a_runtime_start_that_fails_deletes_the_created_container() {
    let (_, left, host, evidence) = fail_one(5, |c| runs(c, " start "));
    assert!(
        host.calls().iter().any(|c| runs(c, " delete ")),
        "the created container is deleted"
    );
    // Before the release deleted it, the host kept the runtime's state of it: created.
    assert!(
        evidence
            .iter()
            .any(|e| e.contains(r#""status": "created""#)),
        "{evidence:?}"
    );
    assert!(left.is_empty(), "release left {left:?}");
}

#[test]
fn a_runtime_delete_that_fails_is_residue_until_recovery() {
    let (_, left, _, _) = fail_one(6, |c| runs(c, " delete "));
    assert!(
        left.iter().any(|l| matches!(l, Leftover::Container { .. })),
        "a container that could not be deleted is residue, never quiescence: {left:?}"
    );
}
