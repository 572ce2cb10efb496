//! The rootless lease on the fake host: every release and recovery failure path, driven by
//! the runtime's answers and the process table, with the state directory on disk.

use super::*;
use crate::host::ToolOutput;
use crate::host::fake::Fake;
use std::sync::Arc;

const UID: u32 = 4711;
const NS: u64 = 9001;
const INIT: i32 = 77;
const FAR: u64 = u64::MAX / 2;

struct Case {
    _dir: tempfile::TempDir,
    fake: Arc<Fake>,
    setup: Setup,
}

/// A state directory and a runtime on the fake host whose `kill` ends the container's
/// processes. Replies registered by `replies` win over the defaults: `list` answers
/// `listing`, `state` an empty object.
fn case(replies: &[(&str, ToolOutput)], listing: &[u8]) -> Case {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::new());
    for (needle, out) in replies {
        fake.reply(needle, out.clone());
    }
    fake.reply(" list ", ToolOutput::ok(listing))
        .reply(" state ", ToolOutput::ok(b"{}"))
        .kills_on(" kill ")
        .process(
            super::super::watchdog::WATCHDOG_ARG,
            crate::host::fake::Script::watchdog(b"W"),
        )
        // Someone else's process, and one of the service user's outside the run.
        .pid_in(1, 0, 1, false)
        .pid_in(500, UID, 1, false);
    let setup = Setup {
        runtime: Runtime {
            binary: "/usr/sbin/runc".into(),
            state_root: dir.path().join(RUNTIME_STATE),
            host: fake.clone(),
        },
        state: dir.path().to_path_buf(),
        uid: UID,
        exit_grace: Duration::from_millis(60),
        watchdog: "/usr/libexec/cordon-test-watchdog".into(),
    };
    Case {
        _dir: dir,
        fake,
        setup,
    }
}

/// The tests' boot.
const BOOT: &str = "0f0e0d0c-0b0a-0908-0706-050403020100";

/// The moment the tests observe at: a hundred seconds into their boot.
fn now() -> BootTime {
    BootTime {
        boot_id: BOOT.into(),
        ms: 100_000,
    }
}

fn record(run: &str, deadline_ms: u64) -> Record {
    Record {
        schema: ROOTLESS_SCHEMA,
        run: run.into(),
        authority: "sha256:00".into(),
        created_at: "2026-12-03T00:00:00Z".into(),
        deadline: BootTime {
            boot_id: BOOT.into(),
            ms: deadline_ms,
        },
        supervisor: Supervisor {
            pid: 1,
            start_ticks: 1,
        },
        workspace: "/ws".into(),
        tier: Tier::Command,
    }
}

/// A published run whose container's init is [`INIT`] in namespace [`NS`]; `killable` when
/// the runtime's kill ends it.
fn started(c: &Case, run: &str, killable: bool) -> Run {
    c.fake.pid_in(INIT as u32, UID, NS, killable);
    let mut r = begin(&c.setup, record(run, FAR)).unwrap();
    r.note_namespace(&c.setup, INIT).unwrap();
    r
}

fn residue_of(e: LeaseError) -> String {
    match e {
        LeaseError::Residue(r) => r.items.join("; "),
        other => panic!("not residue: {other:?}"),
    }
}

#[test]
fn a_released_run_is_removed_proven_gone_and_leaves_nothing() {
    let c = case(&[], b"null");
    let r = started(&c, "cs-a", true);
    assert_eq!(fs::read_to_string(r.dir().join(PIDNS)).unwrap(), "9001");
    let dir = r.dir().to_path_buf();
    r.release(&c.setup).unwrap();
    assert!(!dir.exists());
    let runs = c.fake.runs();
    assert!(runs[0].contains(" kill --all cs-a KILL"), "{runs:?}");
    assert!(runs[1].contains(" delete --force cs-a"), "{runs:?}");
    assert!(runs[2].contains(" list -f json"), "{runs:?}");
    let seen = observe(&c.setup, false, &now()).unwrap();
    assert_eq!(seen, Observed::default());
}

#[test]
fn a_container_the_runtime_cannot_remove_is_residue_and_its_record_stays() {
    let c = case(&[(" delete ", ToolOutput::failed("device busy"))], b"null");
    let r = started(&c, "cs-b", true);
    let dir = r.dir().to_path_buf();
    let why = residue_of(r.release(&c.setup).unwrap_err());
    assert!(why.contains("run cs-b: the runtime cannot remove"), "{why}");
    assert!(dir.join(RECORD).exists(), "the record is kept for recovery");
}

#[test]
fn a_container_still_listed_is_residue() {
    let c = case(&[], br#"[{"id":"cs-c"}]"#);
    let why = residue_of(started(&c, "cs-c", true).release(&c.setup).unwrap_err());
    assert!(why.contains("still lists its container"), "{why}");
}

#[test]
fn an_unreadable_listing_is_residue_never_none() {
    let c = case(&[], b"not json");
    let why = residue_of(started(&c, "cs-d", true).release(&c.setup).unwrap_err());
    assert!(why.contains("the runtime's listing"), "{why}");
}

#[test]
fn a_process_left_in_the_runs_namespace_is_residue_after_the_grace() {
    let c = case(&[], b"null");
    let r = started(&c, "cs-e", false);
    let dir = r.dir().to_path_buf();
    let why = residue_of(r.release(&c.setup).unwrap_err());
    assert!(why.contains("processes in its pid namespace: 77"), "{why}");
    assert!(dir.join(RECORD).exists());
}

#[test]
fn a_process_whose_namespace_cannot_be_read_is_residue_and_an_unreadable_proc_too() {
    let c = case(&[], b"null");
    c.fake
        .pid_in(600, UID, 1, false)
        .pid_in(601, 0, 1, false)
        .unreadable("/proc/600/ns/pid")
        .unreadable("/proc/601/ns/pid");
    let why = residue_of(started(&c, "cs-f", true).release(&c.setup).unwrap_err());
    assert!(why.contains("600 (namespace unreadable"), "{why}");
    assert!(
        !why.contains("601"),
        "another user's process is not the run's: {why}"
    );

    let c = case(&[], b"null");
    let r = started(&c, "cs-g", true);
    c.fake.unreadable("/proc");
    let why = residue_of(r.release(&c.setup).unwrap_err());
    assert!(why.contains("cannot list processes"), "{why}");
}

#[test]
fn recovery_leaves_a_live_run_alone_and_releases_a_dead_supervisors() {
    let c = case(&[], b"null");
    let live = started(&c, "cs-h", true);
    let seen = observe(&c.setup, true, &now()).unwrap();
    assert_eq!(seen.active, vec![live.record().clone()]);
    assert!(
        seen.released.is_empty() && seen.residue.is_empty(),
        "{seen:?}"
    );
    assert!(c.fake.runs().iter().all(|r| !r.contains("delete")));
    // The supervisor dies: its lock goes with it; the record stays.
    let dir = live.dir().to_path_buf();
    drop(live);
    let seen = observe(&c.setup, false, &now()).unwrap();
    assert_eq!(
        seen.residue,
        vec![Leftover::LeaseRecord {
            lease: "cs-h".into(),
            path: dir.join(RECORD).display().to_string(),
        }],
        "the check names a dead run and changes nothing"
    );
    assert!(dir.exists());
    let seen = observe(&c.setup, true, &now()).unwrap();
    assert_eq!(seen.released, vec!["cs-h".to_owned()]);
    assert!(seen.residue.is_empty(), "{seen:?}");
    assert!(!dir.exists());
}

#[test]
fn recovery_reports_a_dead_run_it_cannot_release_and_goes_on_to_the_next() {
    let c = case(
        &[(" delete --force cs-i", ToolOutput::failed("busy"))],
        b"null",
    );
    drop(started(&c, "cs-i", true));
    drop(begin(&c.setup, record("cs-j", FAR)).unwrap());
    let seen = observe(&c.setup, true, &now()).unwrap();
    assert_eq!(seen.released, vec!["cs-j".to_owned()]);
    assert!(
        matches!(&seen.residue[..], [Leftover::Run { run, why }] if run == "cs-i" && why.contains("cannot remove")),
        "{seen:?}"
    );
}

#[test]
fn a_run_directory_without_a_published_record_is_removed_by_recovery_only() {
    let c = case(&[], b"null");
    let dir = c.setup.run_dir("cs-k");
    private_dir(&c.setup.state.join(RUNS)).unwrap();
    private_dir(&dir).unwrap();
    fs::write(dir.join(RECORD_PENDING), b"{").unwrap();
    let seen = observe(&c.setup, false, &now()).unwrap();
    assert!(
        matches!(
            &seen.residue[..],
            [Leftover::RunDirectory {
                attributed: false,
                ..
            }]
        ),
        "{seen:?}"
    );
    let seen = observe(&c.setup, true, &now()).unwrap();
    assert_eq!(seen.released, vec!["cs-k".to_owned()]);
    assert!(!dir.exists());
}

#[test]
fn a_live_run_past_its_deadline_is_residue_not_active() {
    let c = case(&[], b"null");
    let _held = begin(&c.setup, record("cs-l", 1_000)).unwrap();
    let seen = observe(&c.setup, false, &now()).unwrap();
    assert!(seen.active.is_empty(), "{seen:?}");
    assert!(
        matches!(&seen.residue[..], [Leftover::Run { run, why }] if run == "cs-l" && why.contains("past its deadline")),
        "{seen:?}"
    );
}

#[test]
fn a_container_no_run_owns_is_residue() {
    let c = case(&[], br#"[{"id":"cs-orphan"}]"#);
    let seen = observe(&c.setup, false, &now()).unwrap();
    assert_eq!(
        seen.residue,
        vec![Leftover::Container {
            id: "cs-orphan".into()
        }]
    );
}

#[test]
fn a_forged_or_linked_record_is_that_runs_residue_and_recovery_goes_on() {
    let c = case(&[], b"null");
    drop(begin(&c.setup, record("cs-a-dead", FAR)).unwrap());
    let dir = c.setup.run_dir("cs-m");
    private_dir(&dir).unwrap();
    let in_doubt = |seen: &Observed| matches!(&seen.residue[..], [Leftover::Run { run, why }] if run == "cs-m" && why.contains("unsafe"));
    fs::write(dir.join(RECORD), b"{\"run\":\"cs-m\"}").unwrap();
    let seen = observe(&c.setup, true, &now()).unwrap();
    assert!(in_doubt(&seen), "{seen:?}");
    assert_eq!(
        seen.released,
        vec!["cs-a-dead".to_owned()],
        "the other run is recovered"
    );
    fs::remove_file(dir.join(RECORD)).unwrap();
    let mut other = record("cs-other", FAR);
    other.run = "cs-other".into();
    fs::write(dir.join(RECORD), serde_json::to_vec(&other).unwrap()).unwrap();
    assert!(in_doubt(&observe(&c.setup, true, &now()).unwrap()));
    fs::remove_file(dir.join(RECORD)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join(RECORD)).unwrap();
    assert!(in_doubt(&observe(&c.setup, true, &now()).unwrap()));
    assert!(dir.exists(), "a run in doubt is never removed");
    let runs = c.fake.runs();
    assert!(
        runs.iter()
            .all(|r| !(r.contains("delete") && r.contains("cs-m"))),
        "nor its container deleted: {runs:?}"
    );
}
