//! Every "cannot establish" of release, recovery and the quiescence check, driven through
//! the recording fake host: each must be residue or an error, never "nothing left".

use std::sync::Arc;

use super::*;
use crate::host::ToolOutput;
use crate::host::fake::{Call, Fake, Script};

struct World {
    dir: tempfile::TempDir,
    fake: Arc<Fake>,
    manager: Manager,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let fake = Arc::new(Fake::new());
    fake.file("/etc/passwd", "root:x:0:0::/root:/bin/sh\n")
        .file("/etc/group", "root:x:0:\n")
        .file(this_stat(), STAT_LINE)
        .file(BOOT_ID, BOOT)
        .file(
            "/proc/self/mountinfo",
            "22 1 0:21 / / rw - ext4 /dev/vda rw\n",
        )
        .reply("list", ToolOutput::ok(b"null"))
        .process(watchdog::WATCHDOG_ARG, Script::watchdog(b"W"));
    let setup = Setup {
        executor: "fake".into(),
        runtime: Runtime {
            binary: "/usr/sbin/runc".into(),
            state_root: dir.path().join("state"),
            host: fake.clone(),
        },
        run_root: dir.path().join("run"),
        lock_dir: dir.path().join("locks"),
        accounts: crate::account::tests::policy(),
        cgroup_root: dir.path().join("cgroup"),
        mountinfo: "/proc/self/mountinfo".into(),
        init_mountinfo: "/proc/self/mountinfo".into(),
        cdi_dirs: Vec::new(),
        watchdog: "/usr/libexec/cordon-test-watchdog".into(),
    };
    let manager = Manager::open(&store, setup).unwrap();
    World { dir, fake, manager }
}

/// A fake host with empty user, group and mount tables (callers add the runtime's replies).
/// A stat line whose command holds a parenthesis and spaces; start time (field 22) 4242.
const STAT_LINE: &str = "77 (a) b (c) S 1 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1 1";

fn this_stat() -> String {
    format!("/proc/{}/stat", std::process::id())
}

fn empty_host() -> Arc<Fake> {
    let f = Arc::new(Fake::new());
    f.file("/etc/passwd", "")
        .file("/etc/group", "")
        .file(this_stat(), STAT_LINE)
        .file(BOOT_ID, BOOT)
        .file("/proc/self/mountinfo", "")
        .process(watchdog::WATCHDOG_ARG, Script::watchdog(b"W"));
    f
}

/// The fake hosts' boot id.
const BOOT: &str = "0f0e0d0c-0b0a-0908-0706-050403020100\n";

#[test]
fn a_supervisor_is_its_pid_and_start_time_and_a_reused_pid_is_not_it() {
    let f = empty_host();
    let me = Supervisor::this(&*f).unwrap();
    assert_eq!((me.pid, me.start_ticks), (std::process::id(), 4242));
    assert!(me.alive(&*f).unwrap());
    let reused = Supervisor {
        start_ticks: 1,
        ..me
    };
    assert!(!reused.alive(&*f).unwrap(), "same pid, another start time");
    let gone = Supervisor {
        pid: u32::MAX,
        ..me
    };
    assert!(!gone.alive(&*f).unwrap());
    f.file("/proc/1/stat", "garbage");
    assert!(
        process_start(&*f, 1).is_err(),
        "an unreadable stat line is an error"
    );
}

/// Lift every quarantine in force in `m`'s store (an operator's `--clear` after residue the
/// test made on purpose), asserting there was one: the next lease may begin.
fn lift_all(m: &Manager) {
    let all = quarantine::in_force(&m.store).unwrap();
    assert!(!all.is_empty(), "residue quarantines the executor");
    for id in all.keys() {
        quarantine::lift(&m.store, id).unwrap();
    }
}

fn residue(r: Result<(), LeaseError>) -> Vec<String> {
    match r {
        Err(LeaseError::Residue(x)) => x.items,
        other => panic!("expected residue, got {other:?}"),
    }
}

/// The lease's run directory with its owner file, as `provision` makes it (for tests that
/// do not create an account).
/// A parser child's lease of `w`'s manager, its run directory made as provisioning makes it.
fn child(w: &World) -> Lease {
    let lease = w
        .manager
        .begin_child("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&lease);
    lease
}

pub(super) fn own_run_dir(lease: &Lease) {
    fs::create_dir_all(lease.run_dir()).unwrap();
    let owner = Owner {
        executor: lease.record.executor.clone(),
        store: lease.record.store.clone(),
        lease: lease.record.lease.clone(),
    };
    fs::write(
        lease.run_dir().join(OWNER_FILE),
        to_canonical_json(&owner).unwrap(),
    )
    .unwrap();
}

/// A lease whose deadline is now (its supervisor, this process, alive), with its run
/// directory; and a moment past that deadline and the grace.
fn expired_lease(w: &World) -> (Lease, BootTime) {
    let lease = w.manager.begin("sha256:a", Duration::ZERO).unwrap();
    own_run_dir(&lease);
    let late = lease.record.deadline.after(EXPIRY_GRACE * 2);
    (lease, late)
}

/// A `runc state` answer whose annotations are these labels.
fn state_with(executor: &str, store: &str, lease: &str) -> String {
    serde_json::json!({ "annotations": {
        LABEL_EXECUTOR: executor, LABEL_STORE: store, LABEL_LEASE: lease,
    }})
    .to_string()
}

/// The observer ends only the container of an expired lease that carries this executor's,
/// this store's and that lease's exact labels; a lease is expired only once its deadline
/// and the grace have both passed (or its supervisor is gone).
#[test]
fn the_observer_ends_only_an_expired_leases_exactly_labelled_container() {
    let w = world();
    let (lease, _) = expired_lease(&w);
    let id = lease.container().to_owned();
    let store = w.manager.store.root().display().to_string();
    let f = empty_host();
    // Four containers under the same id prefix: only the first has every label right.
    let labels = state_with;
    let others = [
        (
            format!("{id}-x"),
            labels("other", &store, &lease.record.lease),
        ),
        (
            format!("{id}-s"),
            labels("fake", "/elsewhere", &lease.record.lease),
        ),
        (format!("{id}-l"), labels("fake", &store, "another-lease")),
    ];
    for (other, state) in &others {
        f.reply(&format!("state {other}"), ToolOutput::ok(state.as_bytes()));
    }
    f.reply(
        &format!("state {id}"),
        ToolOutput::ok(labels("fake", &store, &lease.record.lease).as_bytes()),
    );
    let list: Vec<serde_json::Value> = std::iter::once(id.clone())
        .chain(others.iter().map(|(o, _)| o.clone()))
        .map(|i| serde_json::json!({ "id": i }))
        .collect();
    f.reply(
        " list ",
        ToolOutput::ok(serde_json::to_vec(&list).unwrap().as_slice()),
    );
    let mut setup = w.manager.setup.clone();
    setup.runtime.host = f.clone();
    let observer = Observer::new(&w.manager.store, setup);
    // At the deadline plus the grace, not yet expired; a millisecond later, expired; on
    // another boot, expired whatever the clock says.
    let edge = lease.record.deadline.after(EXPIRY_GRACE);
    assert!(!observer.leases(&edge).unwrap()[0].expired);
    assert!(observer.end_expired(&edge).unwrap().is_empty());
    let later = edge.after(Duration::from_millis(1));
    assert!(observer.leases(&later).unwrap()[0].expired);
    let rebooted = BootTime {
        boot_id: "ffffffff-0b0a-0908-0706-050403020100".into(),
        ms: 0,
    };
    assert!(observer.leases(&rebooted).unwrap()[0].expired);
    let ended = observer.end_expired(&later).unwrap();
    assert_eq!(ended.len(), 1, "{ended:?}");
    let kills: Vec<String> = f
        .runs()
        .into_iter()
        .filter(|l| l.contains(" kill "))
        .collect();
    assert!(
        !kills.is_empty() && kills.iter().all(|k| k.ends_with(&format!("{id} KILL"))),
        "{kills:?}"
    );
    assert!(
        lease.run_dir().join(ENDED_BY_REAP).exists(),
        "marked before the kill"
    );
    // The check lists only this executor's and store's containers as residue.
    let left = observer.check().unwrap();
    let containers: Vec<&String> = left
        .iter()
        .filter_map(|l| match l {
            Leftover::Container { id } => Some(id),
            _ => None,
        })
        .collect();
    assert!(
        containers
            .iter()
            .all(|id| **id != others[0].0 && **id != others[1].0),
        "{left:?}"
    );
}

/// Release proves only its own containers gone — by executor, lease and authority labels
/// — and keeps everything else of the lease while one of them is still listed.
#[test]
fn release_proves_its_own_containers_gone_and_ignores_others() {
    let w = world();
    let lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&lease);
    let state = |executor: &str, lease_id: &str, authority: &str| {
        serde_json::json!({ "annotations": {
            LABEL_EXECUTOR: executor, LABEL_LEASE: lease_id, LABEL_AUTHORITY: authority,
        }})
        .to_string()
    };
    // Another lease's, another executor's and another authority's containers are listed
    // and never touched; release succeeds.
    let f = empty_host();
    let others = [
        ("other-lease", state("fake", "another", "sha256:a")),
        (
            "other-executor",
            state("other", &lease.record.lease, "sha256:a"),
        ),
        (
            "other-authority",
            state("fake", &lease.record.lease, "sha256:b"),
        ),
    ];
    for (other, s) in &others {
        f.reply(&format!("state {other}"), ToolOutput::ok(s.as_bytes()));
    }
    let list: Vec<serde_json::Value> = others
        .iter()
        .map(|(o, _)| serde_json::json!({ "id": o }))
        .collect();
    f.reply(
        " list ",
        ToolOutput::ok(serde_json::to_vec(&list).unwrap().as_slice()),
    );
    let m = with_host(&w, f.clone());
    m.release(&lease.record).unwrap();
    assert!(
        !f.calls()
            .iter()
            .any(|c| matches!(c, Call::Run(l) if l.contains(" kill ") || l.contains(" delete "))),
        "{:?}",
        f.calls()
    );
    // Its own container, still listed after removal: residue, and the rest is kept.
    let lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&lease);
    let id2 = lease.container().to_owned();
    let f = empty_host();
    f.reply(
        &format!("state {id2}"),
        ToolOutput::ok(state("fake", &lease.record.lease, "sha256:a").as_bytes()),
    )
    .reply(
        " list ",
        ToolOutput::ok(serde_json::json!([{ "id": id2 }]).to_string().as_bytes()),
    );
    let m = with_host(&w, f);
    let items = match m.release(&lease.record) {
        Err(LeaseError::Residue(r)) => r.items,
        other => panic!("a container still listed is residue: {other:?}"),
    };
    assert!(items.iter().any(|i| i.contains(&id2)), "{items:?}");
    assert!(
        lease.run_dir().join(OWNER_FILE).exists(),
        "the rest is kept"
    );
    assert!(
        m.records()
            .unwrap()
            .iter()
            .any(|r| r.lease == lease.record.lease)
    );
}

/// The lease's own container id under another executor's, store's or lease's labels is
/// not ended: the id alone never makes a container this lease's.
#[test]
fn an_expired_leases_id_under_other_labels_is_not_ended() {
    let w = world();
    let (lease, late) = expired_lease(&w);
    let id = lease.container().to_owned();
    let store = w.manager.store.root().display().to_string();
    for (executor, store, lease_id) in [
        ("other", store.as_str(), lease.record.lease.as_str()),
        ("fake", "/elsewhere", lease.record.lease.as_str()),
        ("fake", store.as_str(), "another-lease"),
    ] {
        let f = empty_host();
        let state = state_with(executor, store, lease_id);
        f.reply(
            &format!("state {id}"),
            ToolOutput::ok(state.to_string().as_bytes()),
        )
        .reply(
            " list ",
            ToolOutput::ok(serde_json::json!([{ "id": id }]).to_string().as_bytes()),
        );
        let mut setup = w.manager.setup.clone();
        setup.runtime.host = f;
        let ended = Observer::new(&w.manager.store, setup)
            .end_expired(&late)
            .unwrap();
        assert!(ended.is_empty(), "{executor} {store} {lease_id}: {ended:?}");
    }
}

/// Release edge cases (mutation survivors): a record already gone is no residue, one that
/// cannot be removed is; a mount point that is not mounted is not unmounted; a run
/// directory outside the run root, a link under the lease's name, or an empty lease-named
/// directory are never removed, while the empty pending dot directory a crash left is.
/// The overlay's writable layer is a bounded, root-owned tmpfs mounted before the overlay
/// over it; a tmpfs that cannot be mounted mounts no overlay (never one on the host's disk).
#[test]
fn the_overlays_writable_layer_is_mounted_bounded_before_the_overlay() {
    let w = world();
    // A lease naming the overlay's points, and its overlay of the test image mounted, bounded.
    let overlay = |m: &Manager| {
        let lease = m
            .begin_with(
                "sha256:a",
                &["overlay", "rootfs"],
                cordon_testkit::in_an_hour(),
            )
            .unwrap();
        own_run_dir(&lease);
        let run = lease.run_dir().to_path_buf();
        let mounted = m.mount_overlay(
            &lease,
            &run.join("rootfs"),
            &w.dir.path().join("image"),
            &run.join("overlay/upper"),
            &run.join("overlay/work"),
            1 << 20,
            64,
        );
        (lease, run, mounted)
    };
    let f = empty_host();
    f.reply("list", ToolOutput::ok(b"[]"));
    let m = with_host(&w, f.clone());
    let (lease, run, mounted) = overlay(&m);
    mounted.unwrap();
    let mounts: Vec<MountRequest> = f
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Mount(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(
        mounts,
        [
            MountRequest::Tmpfs {
                target: run.join("overlay"),
                options: "size=1048576,nr_inodes=64,mode=0700,uid=0,gid=0".into(),
            },
            MountRequest::Overlay {
                target: run.join("rootfs"),
                lower: w.dir.path().join("image"),
                upper: run.join("overlay/upper"),
                work: run.join("overlay/work"),
            },
        ]
    );
    m.release(&lease.record).unwrap();
    // The tmpfs fails: no overlay is attempted.
    let f = empty_host();
    f.reply("list", ToolOutput::ok(b"[]"))
        .fail(true, false, false);
    let m = with_host(&w, f.clone());
    let (_lease, run, failed) = overlay(&m);
    assert!(
        matches!(
            failed,
            Err(LeaseError::Io {
                op: "mount tmpfs on",
                ..
            })
        ),
        "{failed:?}"
    );
    let mounts: Vec<Call> = f
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Mount(_)))
        .collect();
    assert!(
        matches!(&mounts[..], [Call::Mount(MountRequest::Tmpfs { .. })]),
        "{mounts:?}"
    );
    assert!(!run.join("overlay/upper").exists());
}

#[test]
fn release_edges_are_each_what_they_must_be() {
    let w = world();
    let f = empty_host();
    f.reply("list", ToolOutput::ok(b"[]"));
    let m = with_host(&w, f.clone());
    // The record already gone: released all the same.
    let lease = m
        .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
        .unwrap();
    fs::remove_file(m.record_path(&lease.record.lease)).unwrap();
    m.release(&lease.record).unwrap();
    assert!(
        !f.calls().iter().any(|c| matches!(c, Call::Unmount(_))),
        "nothing was mounted, nothing is unmounted"
    );
    // A record that cannot be removed (a directory in its place) is residue.
    let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let record = m.record_path(&lease.record.lease);
    fs::remove_file(&record).unwrap();
    fs::create_dir(&record).unwrap();
    assert!(matches!(
        m.release(&lease.record),
        Err(LeaseError::Residue(_))
    ));
    lift_all(&m);
    fs::remove_dir(&record).unwrap();
    // The empty pending directory a crash left before its owner file: removed.
    let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let pending = m.setup.run_root.join(format!(".{}", lease.record.lease));
    fs::create_dir_all(&pending).unwrap();
    m.release(&lease.record).unwrap();
    assert!(!pending.exists());
    // A link under the lease's name to a directory that says it is this lease's: the link
    // is not followed, the directory behind it is kept.
    let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let elsewhere = w.dir.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    let owner = Owner {
        executor: lease.record.executor.clone(),
        store: lease.record.store.clone(),
        lease: lease.record.lease.clone(),
    };
    fs::write(
        elsewhere.join(OWNER_FILE),
        to_canonical_json(&owner).unwrap(),
    )
    .unwrap();
    std::os::unix::fs::symlink(&elsewhere, lease.run_dir()).unwrap();
    assert!(matches!(
        m.release(&lease.record),
        Err(LeaseError::Residue(_))
    ));
    lift_all(&m);
    assert!(elsewhere.join(OWNER_FILE).exists());
    fs::remove_file(lease.run_dir()).unwrap();
    m.release(&lease.record).unwrap();
    // A run directory outside the run root is never removed.
    let mut lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let outside = w.dir.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    for r in &mut lease.record.resources {
        if let Resource::RunDir { path } = r {
            *path = outside.clone();
        }
    }
    assert!(matches!(
        m.release(&lease.record),
        Err(LeaseError::Residue(_))
    ));
    lift_all(&m);
    assert!(outside.exists());
    // A run directory that cannot be looked at (the run root replaced by a file: ENOTDIR)
    // is not "absent": residue.
    let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let root = m.setup.run_root.clone();
    fs::remove_dir_all(&root).unwrap();
    fs::write(&root, b"not a directory").unwrap();
    assert!(matches!(
        m.release(&lease.record),
        Err(LeaseError::Residue(_))
    ));
    lift_all(&m);
    fs::remove_file(&root).unwrap();
}

/// An orphan run directory with a mount inside is unmounted, deepest first, before it is
/// removed; a mount under the run root is residue for the check.
#[test]
fn an_orphan_run_directory_is_unmounted_inside_before_removal() {
    let w = world();
    let root = w.manager.setup.run_root.clone();
    let dir = root.join(std::iter::repeat_n('f', 32).collect::<String>());
    fs::create_dir_all(dir.join("staging/inner")).unwrap();
    let owner = Owner {
        executor: "fake".into(),
        store: w.manager.store.root().display().to_string(),
        lease: std::iter::repeat_n('f', 32).collect(),
    };
    fs::write(dir.join(OWNER_FILE), to_canonical_json(&owner).unwrap()).unwrap();
    let f = empty_host();
    f.file(
        "/proc/self/mountinfo",
        &format!(
            "90 1 0:50 / {} rw - tmpfs t rw\n91 90 0:51 / {} rw - tmpfs t rw\n",
            dir.join("staging").display(),
            dir.join("staging/inner").display()
        ),
    )
    .reply("list", ToolOutput::ok(b"[]"));
    let m = with_host(&w, f.clone());
    assert!(
        m.check()
            .unwrap()
            .iter()
            .any(|l| matches!(l, Leftover::Mount { .. })),
        "a mount under the run root is residue"
    );
    m.recover().unwrap();
    let unmounts: Vec<PathBuf> = f
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Unmount(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(unmounts, [dir.join("staging/inner"), dir.join("staging")]);
    assert!(!dir.exists());
}

/// Orphan run directories (no record names them) are split by their owner file: this
/// executor's and store's are listed and removed by recovery; another executor's or
/// another store's are neither listed nor touched; one without a readable owner is listed
/// and left; a name that is not a lease id is not looked at.
#[test]
fn orphan_run_directories_are_attributed_by_their_owner_file() {
    let w = world();
    let root = w.manager.setup.run_root.clone();
    let store = w.manager.store.root().display().to_string();
    let make = |name: &str, owner: Option<(&str, &str)>| {
        let dir = root.join(name);
        fs::create_dir_all(&dir).unwrap();
        if let Some((executor, store)) = owner {
            let o = Owner {
                executor: executor.into(),
                store: store.into(),
                lease: name.trim_start_matches('.').into(),
            };
            fs::write(dir.join(OWNER_FILE), to_canonical_json(&o).unwrap()).unwrap();
        }
        dir
    };
    let hex = |c: char| std::iter::repeat_n(c, 32).collect::<String>();
    let ours = make(&hex('a'), Some(("fake", &store)));
    let pending = make(&format!(".{}", hex('b')), Some(("fake", &store)));
    let other_executor = make(&hex('c'), Some(("other", &store)));
    let other_store = make(&hex('d'), Some(("fake", "/elsewhere")));
    let unowned = make(&hex('e'), None);
    let not_a_lease = make("scratch", None);
    let short_hex = make("abcdef", None);
    let m = with_host(&w, {
        let f = empty_host();
        f.reply("list", ToolOutput::ok(b"[]"));
        f
    });
    let left = m.check().unwrap();
    let named = |d: &Path| {
        left.iter().any(
            |l| matches!(l, Leftover::RunDirectory { path, .. } if *path == d.display().to_string()),
        )
    };
    assert!(
        named(&ours) && named(&pending) && named(&unowned),
        "{left:?}"
    );
    assert!(
        !named(&other_executor)
            && !named(&other_store)
            && !named(&not_a_lease)
            && !named(&short_hex),
        "{left:?}"
    );
    // The owner tag accounts carry is the account module's, for this executor and store.
    assert_eq!(
        m.view().owner_tag(),
        crate::account::owner_tag("fake", w.manager.store.root())
    );
    assert!(
        matches!(m.recover(), Err(LeaseError::Residue(_))),
        "the unowned one"
    );
    assert!(!ours.exists() && !pending.exists());
    for kept in [&other_executor, &other_store, &unowned, &not_a_lease] {
        assert!(kept.exists(), "{} was touched", kept.display());
    }
}

/// Recovery whose release of a record leaves residue (a mount inside the run directory that
/// will not unmount) keeps that record and its run directory whole, owner file included —
/// the orphan sweep never removes around it — so a later recovery can still finish it.
#[test]
fn recovery_keeps_the_run_directory_of_a_lease_it_could_not_release() {
    let w = world();
    let lease = w
        .manager
        .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&lease);
    let staging = lease.run_dir().join("staging");
    fs::create_dir(&staging).unwrap();
    let f = empty_host();
    f.file(
        "/proc/self/mountinfo",
        &format!("99 1 0:50 / {} rw - tmpfs tmpfs rw\n", staging.display()),
    )
    .reply("list", ToolOutput::ok(b"[]"))
    .fail(false, true, false);
    let m = with_host(&w, f);
    let items = match m.recover() {
        Err(LeaseError::Residue(r)) => r.items,
        other => panic!("an unmount that fails is residue: {other:?}"),
    };
    assert!(items.iter().any(|i| i.contains("staging")), "{items:?}");
    assert!(
        lease.run_dir().join(OWNER_FILE).exists(),
        "the kept run directory still says whose it is"
    );
    assert_eq!(m.records().unwrap().len(), 1, "the record is kept");
}

/// A run directory that was there before its lease (planted, or another writer's) stops
/// provisioning and is never removed by that lease's release: it is residue naming what it
/// is, and once the operator has dealt with it, the lease releases cleanly. One that names
/// another lease as its owner is left alone the same way.
#[test]
fn a_run_directory_that_is_not_the_leases_own_is_never_removed() {
    let w = world();
    for planted_owner in [None, Some("another-lease"), Some("")] {
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        let dir = lease.run_dir().to_path_buf();
        fs::create_dir_all(&dir).unwrap();
        // `Some("")`: an empty directory, no owner file — still not this lease's.
        if planted_owner != Some("") {
            fs::write(dir.join("keep"), b"not cordon's").unwrap();
        }
        if let Some(other) = planted_owner.filter(|o| !o.is_empty()) {
            let owner = Owner {
                executor: w.manager.setup.executor.clone(),
                store: lease.record.store.clone(),
                lease: other.into(),
            };
            fs::write(dir.join(OWNER_FILE), to_canonical_json(&owner).unwrap()).unwrap();
        }
        assert!(matches!(
            w.manager.provision(&lease),
            Err(LeaseError::RunDirExists(p)) if p == dir
        ));
        let err = w.manager.release(&lease.record).unwrap_err();
        assert!(
            matches!(&err, LeaseError::Residue(r) if r.items.iter().any(|i| i.contains(&*dir.to_string_lossy()))),
            "{err:?}"
        );
        assert!(dir.is_dir(), "the planted directory is left");
        lift_all(&w.manager);
        if planted_owner != Some("") {
            assert_eq!(fs::read(dir.join("keep")).unwrap(), b"not cordon's");
        }
        assert_eq!(w.manager.records().unwrap().len(), 1, "the record is kept");
        fs::remove_dir_all(&dir).unwrap();
        w.manager.release(&lease.record).unwrap();
        assert!(w.manager.records().unwrap().is_empty());
    }
}

#[test]
fn a_clean_release_lists_twice_and_unlinks_the_record() {
    let w = world();
    let lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    w.manager.release(&lease.record).unwrap();
    assert!(w.manager.records().unwrap().is_empty());
    let lists = w
        .fake
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Run(l) if l.contains(" list ")))
        .count();
    assert_eq!(
        lists,
        3,
        "one listing before, two after: {:?}",
        w.fake.calls()
    );
}

/// A protected file (the bundle's config.json) is checked right before launch: each
/// change — its mode, a second link, its size, its bytes at the same size, a link in its
/// place — is refused by what it changed, and the file as written passes.
#[test]
fn a_protected_file_changed_in_any_way_is_refused_before_launch() {
    let w = world();
    let mut lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&lease);
    fs::create_dir_all(lease.bundle_dir()).unwrap();
    let path = w
        .manager
        .write_protected(&mut lease, "config.json", b"{\"a\":1}")
        .unwrap();
    w.manager.check_protected(&lease).unwrap();
    tamper_each_way(&path, 0o600, b"{\"a\":1}", true, &|why| {
        assert!(
            matches!(
                w.manager.check_protected(&lease),
                Err(LeaseError::Protected { .. })
            ),
            "{why}"
        );
    });
    // As written, it passes.
    fs::remove_file(&path).unwrap();
    w.manager
        .write_protected(&mut lease, "config.json", b"{\"a\":1}")
        .unwrap();
    w.manager.check_protected(&lease).unwrap();
}

/// Change the file at `path` (mode `mode`, content `good`) in each way a protected file
/// must be refused for — its mode, a second link, its size, its bytes at the same size
/// (when `hashed`), a link in its place — calling `refused` after each (the file restored
/// in between).
fn tamper_each_way(path: &Path, mode: u32, good: &[u8], hashed: bool, refused: &dyn Fn(&str)) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).unwrap();
    refused("mode");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    let link = path.with_file_name("second-name");
    fs::hard_link(path, &link).unwrap();
    refused("a second link");
    fs::remove_file(&link).unwrap();
    // Rewritten through a writable mode (only root writes a 0400 file as it is), then the
    // mode the check expects restored: only the bytes differ.
    let rewrite = |bytes: &[u8]| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o200)).unwrap();
        fs::write(path, bytes).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    };
    let mut longer = good.to_vec();
    longer.push(b'+');
    rewrite(&longer);
    refused("size");
    if hashed {
        let mut other = good.to_vec();
        other[0] ^= 1;
        rewrite(&other);
        refused("bytes at the same size");
    }
    fs::remove_file(path).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", path).unwrap();
    refused("a link in its place");
}

#[test]
fn the_secret_crosses_only_from_a_root_0400_single_link_file_of_its_size() {
    let w = world();
    let mut lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&lease);
    assert_eq!(
        Manager::read_secret(&lease).unwrap(),
        None,
        "no secret declared"
    );
    let path = w.manager.write_secret(&mut lease, b"KEY\n").unwrap();
    let m = fs::metadata(&path).unwrap();
    assert_eq!((m.mode() & 0o7777, m.nlink()), (0o400, 1));
    assert_eq!(Manager::read_secret(&lease).unwrap().unwrap(), b"KEY\n");
    // Each change before launch is refused by what it changed.
    // The secret's bytes are checked by size, not hashed (it is never stored).
    tamper_each_way(&path, 0o400, b"KEY\n", false, &|why| {
        assert!(
            matches!(
                Manager::read_secret(&lease),
                Err(LeaseError::Protected { .. })
            ),
            "{why}"
        );
    });
}

#[test]
fn a_parser_childs_lease_owns_an_account_and_a_run_directory_and_asks_no_runtime() {
    let w = world();
    let lease = w
        .manager
        .begin_child("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    assert_eq!(kinds(&lease.record), ["account", "run-dir"]);
    w.manager.release(&lease.record).unwrap();
    assert!(w.manager.records().unwrap().is_empty());
    assert!(
        !w.fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Run(l) if l.contains("runc"))),
        "no container, no runtime call: {:?}",
        w.fake.calls()
    );
}

#[test]
fn a_parser_lease_left_by_a_crash_is_recovered() {
    let w = world();
    let lease = child(&w);
    fs::create_dir_all(lease.jail_dir()).unwrap();
    // The supervisor is gone (a crash): its record is read back and released by recovery.
    assert_eq!(w.manager.records().unwrap().len(), 1);
    let done = w.manager.recover().unwrap();
    assert!(
        done.contains(&format!("lease {}", lease.record.lease)),
        "{done:?}"
    );
    assert!(!lease.run_dir().exists());
    assert!(w.manager.records().unwrap().is_empty());
}

#[test]
fn parser_leases_share_the_executor_and_never_beside_a_sole_holder_or_a_recovery() {
    // The world's executor, with its sole manager gone.
    let World {
        dir: _dir, manager, ..
    } = world();
    let (store, setup) = (manager.store.clone(), manager.setup.clone());
    drop(manager);
    let one = Manager::open_shared(&store, setup.clone()).unwrap();
    let two = Manager::open_shared(&store, setup.clone()).unwrap();
    // Refused, naming who holds it: this process, as the kernel lists the lock's holders.
    let busy = Manager::open(&store, setup.clone()).unwrap_err();
    let me = std::process::id();
    assert!(
        matches!(&busy, LeaseError::Busy { holders, .. } if *holders == [me]),
        "no container stage or recovery beside a parser: {busy:?}"
    );
    assert!(
        busy.to_string().ends_with(&format!("(held by pid {me})")),
        "{busy}"
    );
    assert!(
        matches!(one.recover(), Err(LeaseError::Busy { .. })),
        "a shared holder never recovers: the other holders own their records"
    );
    drop((one, two));
    let sole = Manager::open(&store, setup.clone()).unwrap();
    assert!(matches!(
        Manager::open_shared(&store, setup),
        Err(LeaseError::Busy { .. })
    ));
    drop(sole);
}

#[test]
fn a_listing_that_does_not_parse_is_residue_and_keeps_the_record() {
    let w = world();
    let f = empty_host();
    f.reply("list", ToolOutput::ok(b"not json"));
    let m = with_host(&w, f.clone());
    let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let items = residue(m.release(&lease.record));
    assert!(items.iter().any(|i| i.contains("cannot list")), "{items:?}");
    // Nothing else is released under a container that may still run.
    assert!(
        !f.calls()
            .iter()
            .any(|c| matches!(c, Call::Run(l) if l.starts_with("userdel"))
                || matches!(c, Call::Unmount(_) | Call::RemoveDir(_))),
        "{:?}",
        f.calls()
    );
    assert_eq!(
        m.records().unwrap().len(),
        1,
        "the record stays for a retry"
    );
    assert!(
        m.check().is_err(),
        "check cannot establish quiescence either"
    );
}

fn with_host(w: &World, fake: Arc<Fake>) -> Manager {
    let mut setup = w.manager.setup.clone();
    setup.runtime.host = fake;
    let store = w.manager.store.clone();
    // Same executor: the lock is per process-open file, so take it for this test's manager.
    Manager {
        store,
        setup,
        shared: false,
        watchdogs: std::sync::Mutex::default(),
        _lock: Flock::lock(
            File::open(w.manager.store.root()).unwrap(),
            FlockArg::LockSharedNonblock,
        )
        .unwrap(),
    }
}

#[test]
fn a_state_that_fails_is_an_error_but_a_vanished_container_is_not() {
    let w = world();
    let f = Arc::new(Fake::new());
    f.reply(
        "state gone",
        ToolOutput::failed("container gone does not exist"),
    )
    .reply("state broken", ToolOutput::failed("permission denied"))
    .reply(
        "list",
        ToolOutput::ok(br#"[{"id":"gone"},{"id":"broken"}]"#),
    );
    let m = with_host(&w, f.clone());
    let e = m.runtime().containers().unwrap_err();
    assert!(e.to_string().contains("state broken"), "{e}");
    let f = Arc::new(Fake::new());
    f.reply(
        "state gone",
        ToolOutput::failed("container gone does not exist"),
    )
    .reply("list", ToolOutput::ok(br#"[{"id":"gone"}]"#));
    let m = with_host(&w, f);
    assert!(m.runtime().containers().unwrap().is_empty());
    // crun names no absence, only its status file: gone when its directory has left the state
    // root, an error while it is there (still being created, or unreadable).
    let crun_gone = "error opening file `/run/x/gone/status`: No such file or directory";
    let state_root = with_host(&w, Arc::new(Fake::new()))
        .runtime()
        .state_root
        .clone();
    for (left, ok) in [(&["other"][..], true), (&["gone"][..], false)] {
        let f = Arc::new(Fake::new());
        f.reply("state gone", ToolOutput::failed(crun_gone))
            .reply("list", ToolOutput::ok(br#"[{"id":"gone"}]"#))
            .dir(&state_root, left);
        let listed = with_host(&w, f).runtime().containers();
        assert_eq!(listed.is_ok(), ok, "{left:?}: {listed:?}");
    }
    let f = Arc::new(Fake::new());
    f.reply("state gone", ToolOutput::failed(crun_gone))
        .reply("list", ToolOutput::ok(br#"[{"id":"gone"}]"#));
    assert!(
        with_host(&w, f).runtime().containers().is_err(),
        "an unlisted state root"
    );
    let f = Arc::new(Fake::new());
    f.reply("list", ToolOutput::ok(br#"[{"name":"no id"}]"#));
    assert!(matches!(
        with_host(&w, f).runtime().containers(),
        Err(crate::runtime::RuntimeError::Listing { .. })
    ));
}

#[test]
fn a_mount_table_of_another_namespace_than_inits_is_never_quiescence() {
    let w = world();
    let f = empty_host();
    // A copied namespace: the same root mount under another id.
    f.reply("list", ToolOutput::ok(b"[]"))
        .file("/proc/1/mountinfo", "22 1 0:21 / / rw - ext4 /dev/vda rw\n")
        .file(
            "/proc/self/mountinfo",
            "901 900 0:21 / / rw - ext4 /dev/vda rw\n",
        );
    let mut m = with_host(&w, f.clone());
    m.setup.init_mountinfo = "/proc/1/mountinfo".into();
    let lease = m
        .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
        .unwrap();
    let items = residue(m.release(&lease.record));
    assert!(
        items.iter().any(|i| i.contains("mount namespace")),
        "{items:?}"
    );
    let e = m.check().unwrap_err().to_string();
    assert!(e.contains("mount namespace is not the host's"), "{e}");
    // The same tables in one namespace: the release goes through.
    f.file(
        "/proc/self/mountinfo",
        "22 1 0:21 / / rw - ext4 /dev/vda rw\n",
    );
    m.release(&lease.record).unwrap();
}

#[test]
fn unreadable_passwd_group_or_mountinfo_is_never_quiescence() {
    for broken in ["/etc/passwd", "/etc/group", "/proc/self/mountinfo"] {
        let w = world();
        let f = empty_host();
        f.reply("list", ToolOutput::ok(b"[]")).unreadable(broken);
        let m = with_host(&w, f);
        // A lease with a mount point, so its release must read the mount table.
        let lease = m
            .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
            .unwrap();
        let items = residue(m.release(&lease.record));
        assert!(!items.is_empty(), "{broken}");
        assert!(m.check().is_err(), "check with {broken} unreadable");
        assert!(m.recover().is_err(), "recover with {broken} unreadable");
    }
}

#[test]
fn resources_are_released_in_reverse_and_a_device_is_residue_until_drains_exist() {
    let w = world();
    let mut lease = w
        .manager
        .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
        .unwrap();
    assert_eq!(
        kinds(&lease.record),
        ["account", "run-dir", "mount", "cgroup", "container"]
    );
    lease.record.resources.push(Resource::Device {
        path: "/dev/nvidia0".into(),
    });
    let items = residue(w.manager.release(&lease.record));
    assert_eq!(items.len(), 3, "{items:?}");
    assert!(items[0].starts_with("device /dev/nvidia0"), "{items:?}");
    assert!(
        items[2].starts_with("executor fake quarantined (residue"),
        "{items:?}"
    );
    // The run directory is kept whole while anything released before it remains.
    assert!(
        items[1].contains("kept while the residue above remains"),
        "{items:?}"
    );
    // The account (created first) was still released: every other step is attempted.
    assert!(w.fake.calls().iter().any(|c| matches!(c, Call::Edit(_))));
}

/// The kinds of a record's resources, in order.
fn kinds(record: &Record) -> Vec<&'static str> {
    record
        .resources
        .iter()
        .map(|r| match r {
            Resource::Account { .. } => "account",
            Resource::RunDir { .. } => "run-dir",
            Resource::Mount { .. } => "mount",
            Resource::Cgroup { .. } => "cgroup",
            Resource::Container { .. } => "container",
            Resource::Device { .. } => "device",
        })
        .collect()
}

/// Replace a lease's record with `record`, as a tampering or a future writer would.
fn overwrite_record(w: &World, record: &Record) {
    let path = w.manager.record_path(&record.lease);
    fs::remove_file(&path).unwrap();
    fs::write(&path, to_canonical_json(record).unwrap()).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn a_record_without_exactly_one_of_each_required_resource_stops_recovery() {
    // A container without its cgroup, or a cgroup without its container: no record cordon
    // writes (a parser child's lease has neither).
    for (drop_kind, named) in [("container", "container"), ("cgroup", "cgroup")] {
        let w = world();
        let lease = w
            .manager
            .begin("sha256:a", cordon_testkit::in_an_hour())
            .unwrap();
        let mut broken = lease.record.clone();
        broken.resources.retain(|r| match r {
            Resource::Container { .. } => drop_kind != "container",
            Resource::Cgroup { .. } => drop_kind != "cgroup",
            _ => true,
        });
        overwrite_record(&w, &broken);
        let e = w.manager.records().unwrap_err();
        assert!(e.to_string().contains(named), "{e}");
    }
}

#[test]
fn a_cgroup_that_cannot_be_removed_is_residue() {
    let w = world();
    let lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    let f = empty_host();
    let cgroup = w
        .manager
        .setup
        .cgroup_root
        .join("memory")
        .join(lease.cgroup_path().trim_start_matches('/'));
    f.reply("list", ToolOutput::ok(b"[]"))
        .unreadable(cgroup.clone());
    let m = with_host(&w, f.clone());
    let items = residue(m.release(&lease.record));
    assert!(items.iter().any(|i| i.starts_with("cgroup ")), "{items:?}");
    assert!(f.calls().contains(&Call::RemoveDir(cgroup)));
    assert_eq!(
        m.records().unwrap().len(),
        1,
        "the record stays for a retry"
    );
}

#[test]
fn a_leftover_cgroup_is_never_quiescence_and_recovery_removes_it() {
    let w = world();
    let parent = w.manager.setup.cgroup_root.join("cordon/fake");
    let f = empty_host();
    f.file(
        w.manager.setup.cgroup_root.join("cgroup.controllers"),
        "memory pids",
    )
    .dir(&parent, &["0123456789abcdef0123456789abcdef"])
    .reply("list", ToolOutput::ok(b"[]"));
    let m = with_host(&w, f.clone());
    let left = m.check().unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(matches!(left[0], Leftover::Cgroup { .. }), "{left:?}");
    let done = m.recover().unwrap();
    assert!(done.iter().any(|d| d.starts_with("cgroup ")), "{done:?}");
    assert!(f.calls().contains(&Call::RemoveDir(
        parent.join("0123456789abcdef0123456789abcdef")
    )));
    // A parent that cannot be listed is not "no cgroups".
    let f = empty_host();
    f.file(
        w.manager.setup.cgroup_root.join("cgroup.controllers"),
        "memory pids",
    )
    .unreadable(parent)
    .reply("list", ToolOutput::ok(b"[]"));
    let err = with_host(&w, f).check().unwrap_err();
    assert!(err.to_string().contains("cgroup"), "{err}");
}

/// Three accounts in the range: this executor's and store's (by its owner tag), another
/// executor's, and one without a tag. Recovery removes only the first; the check lists the
/// first and the untagged one, never the other executor's.
#[test]
fn recovery_removes_only_accounts_that_carry_its_own_owner_tag() {
    let w = world();
    let tag = w.manager.view().owner_tag();
    let f = empty_host();
    f.file(
        "/etc/passwd",
        &format!(
            "cordon-00000001:x:5001:5001:{tag}:/nonexistent:/usr/sbin/nologin\n\
             cordon-00000002:x:5002:5002:cordon other 0123456789abcdef:/nonexistent:/bin/false\n\
             cordon-00000003:x:5003:5003::/nonexistent:/usr/sbin/nologin\n"
        ),
    )
    .file(
        "/etc/group",
        "cordon-00000001:x:5001:\ncordon-00000002:x:5002:\ncordon-00000003:x:5003:\n",
    )
    .reply("list", ToolOutput::ok(b"[]"));
    let m = with_host(&w, f.clone());
    let left = m.check().unwrap();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.iter()
            .any(|l| matches!(l, Leftover::Account { name, attributed: true, .. } if name == "cordon-00000001"))
    );
    assert!(
        left.iter()
            .any(|l| matches!(l, Leftover::Account { name, attributed: false, .. } if name == "cordon-00000003"))
    );
    let residue = match m.recover() {
        Err(LeaseError::Residue(r)) => r.items,
        other => panic!("the untagged account is residue: {other:?}"),
    };
    assert!(
        residue.iter().any(|r| r.contains("cordon-00000003")),
        "{residue:?}"
    );
    let removed: Vec<String> = f
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Run(line) if line.starts_with("userdel") => Some(line),
            _ => None,
        })
        .collect();
    assert_eq!(removed, ["userdel cordon-00000001"]);
}

#[test]
fn an_executor_id_that_is_not_a_safe_name_is_refused() {
    let w = world();
    let mut setup = w.manager.setup.clone();
    setup.executor = "../../etc".into();
    assert!(matches!(
        Manager::open(&w.manager.store, setup),
        Err(LeaseError::Executor { .. })
    ));
    // Each rule alone: empty, too long, a leading dot, a byte outside the set.
    let long = "a".repeat(65);
    for bad in ["", long.as_str(), ".hidden", "a/b", "a b", "é"] {
        assert!(!executor_ok(bad), "{bad:?}");
    }
    let longest = "a".repeat(64);
    for good in ["a", longest.as_str(), "host-1_a.b"] {
        assert!(executor_ok(good), "{good:?}");
    }
}

/// Records are read only when they are what cordon writes: a regular 0600 file with one
/// link; a record of another mode, or with a second link, stops the read.
#[test]
fn a_record_with_a_loose_mode_or_a_second_link_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let w = world();
    let lease = w
        .manager
        .begin("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    let path = w.manager.record_path(&lease.record.lease);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(
        w.manager.records(),
        Err(LeaseError::Record { .. })
    ));
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(w.manager.records().unwrap().len(), 1);
    let link = w.dir.path().join("second");
    fs::hard_link(&path, &link).unwrap();
    assert!(matches!(
        w.manager.records(),
        Err(LeaseError::Record { .. })
    ));
}

#[test]
fn a_mount_that_will_not_unmount_is_residue() {
    let w = world();
    let f = empty_host();
    let lease = w
        .manager
        .begin_with("sha256:a", &["staging"], cordon_testkit::in_an_hour())
        .unwrap();
    let point = lease.run_dir().join("staging");
    f.file(
        "/proc/self/mountinfo",
        &format!("40 22 0:50 / {} rw - tmpfs tmpfs rw\n", point.display()),
    )
    .reply("list", ToolOutput::ok(b"[]"))
    .fail(false, true, false);
    let m = with_host(&w, f.clone());
    let items = residue(m.release(&lease.record));
    assert!(items.iter().any(|i| i.starts_with("mount ")), "{items:?}");
    assert!(f.calls().contains(&Call::Unmount(point)));
    assert!(
        m.check()
            .unwrap()
            .iter()
            .any(|l| matches!(l, Leftover::LeaseRecord { .. }))
    );
}

#[cfg(test)]
mod root_tests {
    //! The per-lease overlay root on the real kernel (root, as CI runs): writes land in the
    //! lease's upper directory, never in the shared lower image, and release unmounts it.

    use super::*;

    #[test]
    fn the_overlay_root_is_per_lease_and_release_removes_it() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts an overlay: run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        for f in ["passwd", "group"] {
            fs::write(dir.path().join(f), "").unwrap();
        }
        let setup = Setup {
            executor: "overlay-test".into(),
            runtime: Runtime {
                binary: cordon_testkit::runc(),
                state_root: dir.path().join("state"),
                host: crate::host::Linux::shared(),
            },
            run_root: dir.path().join("run"),
            lock_dir: dir.path().join("locks"),
            accounts: AccountPolicy {
                uids: cordon_testkit::account_range("cordon-lease", 0),
                gids: cordon_testkit::account_range("cordon-lease", 0),
                shell: "/usr/sbin/nologin".into(),
                cron_deny: dir.path().join("cron.deny"),
                at_deny: dir.path().join("at.deny"),
                passwd: dir.path().join("passwd"),
                group: dir.path().join("group"),
            },
            cgroup_root: dir.path().join("cgroup"),
            mountinfo: "/proc/self/mountinfo".into(),
            init_mountinfo: "/proc/self/mountinfo".into(),
            cdi_dirs: Vec::new(),
            watchdog: cordon_testkit::watchdog(),
        };
        let lower = dir.path().join("image");
        fs::create_dir_all(lower.join("etc")).unwrap();
        fs::write(lower.join("etc/base"), "image").unwrap();
        let m = Manager::open(&store, setup).unwrap();
        let lease = m
            .begin_with(
                "sha256:a",
                &["overlay", "rootfs"],
                cordon_testkit::in_an_hour(),
            )
            .unwrap();
        super::tests::own_run_dir(&lease);
        let run = &lease.run_dir();
        let overlay = |point: &str, upper: &str, work: &str| {
            m.mount_overlay(
                &lease,
                &run.join(point),
                &lower,
                &run.join(upper),
                &run.join(work),
                1 << 20,
                64,
            )
        };
        // A mount point the record does not name, a writable layer under a parent it does not
        // name, or upper and work apart: each refused before anything is mounted.
        for (point, upper, work) in [
            ("other", "overlay/upper", "overlay/work"),
            ("rootfs", "elsewhere/upper", "elsewhere/work"),
            ("rootfs", "overlay/upper", "work"),
        ] {
            assert!(
                matches!(
                    overlay(point, upper, work),
                    Err(LeaseError::Protected { .. })
                ),
                "{point} {upper} {work}"
            );
        }
        assert!(
            m.setup
                .mount_points()
                .unwrap()
                .iter()
                .all(|p| !p.starts_with(run))
        );
        let root = overlay("rootfs", "overlay/upper", "overlay/work").unwrap();
        // The writable layer is a tmpfs of its own, bounded: a write past 1 MiB, or past its
        // inodes, is ENOSPC, and the host's disk never sees it.
        let big = fs::write(root.join("big"), vec![0u8; 2 << 20]).unwrap_err();
        assert_eq!(big.raw_os_error(), Some(nix::libc::ENOSPC), "{big}");
        fs::remove_file(root.join("big")).unwrap();
        let many = (0..100).try_for_each(|i| fs::write(root.join(format!("f{i}")), ""));
        assert_eq!(many.unwrap_err().raw_os_error(), Some(nix::libc::ENOSPC));
        (0..100).for_each(|i| {
            let _ = fs::remove_file(root.join(format!("f{i}")));
        });
        fs::write(root.join("etc/written"), "lease").unwrap();
        fs::write(root.join("etc/base"), "changed").unwrap();
        assert_eq!(fs::read_to_string(lower.join("etc/base")).unwrap(), "image");
        assert!(
            !lower.join("etc/written").exists(),
            "the shared image is untouched"
        );
        assert!(run.join("overlay/upper/etc/written").exists());
        m.release(&lease.record).unwrap();
        assert!(!run.exists(), "the run directory and its overlay are gone");
        assert!(m.check().unwrap().is_empty());
        assert_eq!(fs::read_to_string(lower.join("etc/base")).unwrap(), "image");
        // Ablation: with only the bound raised, the same writes succeed.
        let lease = m
            .begin_with(
                "sha256:a",
                &["overlay", "rootfs"],
                cordon_testkit::in_an_hour(),
            )
            .unwrap();
        super::tests::own_run_dir(&lease);
        let run = lease.run_dir();
        let root = m
            .mount_overlay(
                &lease,
                &run.join("rootfs"),
                &lower,
                &run.join("overlay/upper"),
                &run.join("overlay/work"),
                8 << 20,
                1000,
            )
            .unwrap();
        fs::write(root.join("big"), vec![0u8; 2 << 20]).unwrap();
        (0..100).for_each(|i| fs::write(root.join(format!("f{i}")), "").unwrap());
        m.release(&lease.record).unwrap();
        assert!(m.check().unwrap().is_empty());
    }
}

/// Residue quarantines the executor: no lease is begun while the record stands, the record
/// names the lease and the residue, and lifting it lets work start again.
#[test]
fn residue_quarantines_the_executor_until_the_quarantine_is_lifted() {
    let w = world();
    let f = empty_host();
    f.reply("list", ToolOutput::ok(b"not json"));
    let m = with_host(&w, f);
    let lease = m.begin("sha256:a", cordon_testkit::in_an_hour()).unwrap();
    let items = residue(m.release(&lease.record));
    assert!(
        items
            .iter()
            .any(|i| i.starts_with("executor fake quarantined (residue, record ")),
        "{items:?}"
    );
    let store = &w.manager.store;
    let all = quarantine::in_force(store).unwrap();
    let (id, q) = all.iter().next().unwrap();
    assert_eq!(q.scope, quarantine::Scope::Executor("fake".into()));
    assert_eq!(q.cause, quarantine::Cause::Residue);
    assert_eq!(q.lease.as_deref(), Some(lease.record.lease.as_str()));
    assert!(q.why.contains("cannot list"), "{q:?}");
    // Every lease-taking path is refused, naming the record; a parser child's too.
    for e in [
        w.manager.begin("sha256:a", cordon_testkit::in_an_hour()),
        w.manager
            .begin_child("sha256:a", cordon_testkit::in_an_hour()),
    ] {
        match e {
            Err(LeaseError::Quarantined { id: named, .. }) => assert_eq!(&named, id),
            other => panic!("not refused: {other:?}"),
        }
    }
    // Another executor's leases are not this quarantine's business.
    quarantine::check(store, "other", &[]).unwrap();
    // A second incident keeps the first record.
    let again = w
        .manager
        .quarantine(quarantine::Cause::HostReset, "later", None);
    assert!(again.contains(id.as_str()), "{again}");
    assert_eq!(
        quarantine::in_force(store).unwrap()[id].cause,
        quarantine::Cause::Residue
    );
    let lifted = quarantine::lift(store, id).unwrap();
    assert_eq!(&lifted, q);
    assert!(matches!(
        quarantine::lift(store, id),
        Err(LeaseError::NoQuarantine { .. })
    ));
    let again = w
        .manager
        .begin_child("sha256:a", cordon_testkit::in_an_hour())
        .unwrap();
    own_run_dir(&again);
}

/// A device quarantine stops only the sessions that use that device.
#[test]
fn a_device_quarantine_stops_only_leases_that_use_the_device() {
    let w = world();
    let store = &w.manager.store;
    quarantine::impose(
        store,
        &quarantine::Quarantine {
            scope: quarantine::Scope::Device("/dev/nvidia0".into()),
            cause: quarantine::Cause::Drain,
            why: "did not drain".into(),
            lease: None,
            at: "2026-12-03T00:00:00.000Z".into(),
        },
    )
    .unwrap();
    quarantine::check(store, "fake", &["/dev/nvidia1".into()]).unwrap();
    assert!(matches!(
        quarantine::check(store, "fake", &["/dev/nvidia0".into()]),
        Err(LeaseError::Quarantined { .. })
    ));
    // An unreadable record is never read as none.
    fs::write(store.root().join(quarantine::QUARANTINE).join("junk"), "x").unwrap();
    let e = quarantine::check(store, "fake", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a quarantine record's name"), "{e}");
}

/// Recovery that finds a lease of an earlier boot quarantines the executor as a host reset —
/// and still releases what it can.
#[test]
fn a_lease_of_an_earlier_boot_is_a_host_reset_and_quarantines_the_executor() {
    let w = world();
    let lease = child(&w);
    let mut record = lease.record.clone();
    record.deadline.boot_id = "ffffffff-0000-0000-0000-000000000000".into();
    let candidate = Digest::of_bytes(b"engine tree");
    record.candidate = Some(candidate);
    overwrite_record(&w, &record);
    // Before any recovery: nothing new starts beside it.
    match w.manager.begin("sha256:a", cordon_testkit::in_an_hour()) {
        Err(LeaseError::Unrecovered { lease: l }) => assert_eq!(l, record.lease),
        other => panic!("not refused: {other:?}"),
    }
    let done = w.manager.recover().unwrap();
    // The candidate the reset interrupted is not run again under that authority.
    let found = incident::find(&w.manager.store, &record.authority, &candidate)
        .unwrap()
        .expect("an incident of the interrupted candidate");
    assert_eq!(found.incident.cause, quarantine::Cause::HostReset);
    assert_eq!(found.incident.lease, record.lease);
    assert!(
        done.iter()
            .any(|d| d.starts_with("executor fake quarantined (host-reset")),
        "{done:?}"
    );
    assert!(
        w.manager.records().unwrap().is_empty(),
        "released all the same"
    );
    let all = quarantine::in_force(&w.manager.store).unwrap();
    let q = all.values().next().unwrap();
    assert_eq!(q.cause, quarantine::Cause::HostReset);
    assert!(q.why.contains(&lease.record.lease), "{q:?}");
    assert!(matches!(
        w.manager
            .begin_child("sha256:a", cordon_testkit::in_an_hour()),
        Err(LeaseError::Quarantined { .. })
    ));
}

/// A lease of a named candidate that leaves residue records an incident: that candidate is not
/// run again under that authority (another authority, another candidate are unaffected), and the
/// first receipt this process stores afterwards is named as the one that reported it.
#[test]
fn an_incident_stops_its_candidate_under_its_authority_only() {
    let w = world();
    let f = empty_host();
    f.reply("list", ToolOutput::ok(b"not json"));
    let m = with_host(&w, f);
    let candidate = Digest::of_bytes(b"engine tree");
    let lease = m
        .begin_for("sha256:a", &candidate, &[], cordon_testkit::in_an_hour())
        .unwrap();
    assert_eq!(lease.record.candidate.as_ref(), Some(&candidate));
    let items = residue(m.release(&lease.record));
    assert!(
        items
            .iter()
            .any(|i| i
                == &format!("candidate {candidate} is not run again under authority sha256:a")),
        "{items:?}"
    );
    let store = &w.manager.store;
    let e = incident::check(store, "sha256:a", &candidate).unwrap_err();
    let LeaseError::Incident(found) = &e else {
        panic!("not refused as an incident: {e:?}")
    };
    assert_eq!(found.incident.cause, quarantine::Cause::Residue);
    assert_eq!(found.incident.lease, lease.record.lease);
    assert!(found.receipt.is_none());
    assert!(e.to_string().contains("no receipt was stored"), "{e}");
    // Under another authority, or for another tree, it is a new attempt.
    incident::check(store, "sha256:b", &candidate).unwrap();
    incident::check(store, "sha256:a", &Digest::of_bytes(b"other tree")).unwrap();
    // The receipt stored next names it; a later one does not replace it.
    let receipt = Digest::of_bytes(b"the no-decision receipt");
    incident::link_pending(store, &receipt).unwrap();
    incident::link_pending(store, &Digest::of_bytes(b"later")).unwrap();
    let e = incident::check(store, "sha256:a", &candidate).unwrap_err();
    assert!(e.to_string().contains(&format!("receipt {receipt}")), "{e}");
    // Lifting the quarantine does not lift the incident.
    lift_all(&w.manager);
    let e = incident::check(store, "sha256:a", &candidate)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ended in an incident under this authority"),
        "{e}"
    );
    // An unreadable record is never read as none.
    let key = incident::key("sha256:a", &candidate).unwrap();
    let path = store.path(incident::INCIDENTS, &format!("{key}.receipt"));
    fs::remove_file(&path).unwrap();
    fs::write(&path, "junk").unwrap();
    assert!(matches!(
        incident::find(store, "sha256:a", &candidate),
        Err(LeaseError::Record { .. })
    ));
}

/// Recovery removes the lock files nobody holds, never a held one nor its own; a lock taken
/// on a file that was removed under it is taken again on the file the path names.
#[test]
fn unheld_lock_files_are_removed_and_a_lock_always_guards_the_named_file() {
    use nix::fcntl::FlockArg;
    let dir = tempfile::tempdir().unwrap();
    let (held, idle, own) = (
        dir.path().join("held.lock"),
        dir.path().join("idle.lock"),
        dir.path().join("own.lock"),
    );
    let holding = super::lock_at(&held, FlockArg::LockExclusiveNonblock)
        .unwrap()
        .unwrap();
    drop(
        super::lock_at(&idle, FlockArg::LockExclusiveNonblock)
            .unwrap()
            .unwrap(),
    );
    let _own = super::lock_at(&own, FlockArg::LockExclusiveNonblock)
        .unwrap()
        .unwrap();
    std::fs::write(dir.path().join("other.txt"), b"").unwrap();
    let removed = super::remove_unheld_locks(dir.path(), &own);
    assert_eq!(removed, ["idle.lock"]);
    assert!(held.exists() && own.exists() && !idle.exists());
    assert!(dir.path().join("other.txt").exists(), "only lock files");
    // A second holder of a held file is told so, with the file to name who holds it.
    assert!(
        super::lock_at(&held, FlockArg::LockExclusiveNonblock)
            .unwrap()
            .is_err()
    );
    drop(holding);

    // A file opened before its removal no longer names the path: a lock on it guards nothing.
    let stale = super::open_lock_file(&idle).unwrap();
    std::fs::remove_file(&idle).unwrap();
    let fresh = super::lock_at(&idle, FlockArg::LockExclusiveNonblock)
        .unwrap()
        .unwrap();
    assert!(!super::names(&stale, &idle).unwrap());
    assert!(super::names(&fresh, &idle).unwrap());
}

/// An expired parser child's lease has no container: its child, every process of its fresh
/// account, is killed (each through a pidfd, once seen to run as the account) after the mark;
/// an account that runs nothing is left alone, and a kill that fails is residue.
#[test]
fn the_observer_ends_an_expired_parser_childs_processes() {
    let w = world();
    let lease = w.manager.begin_child("sha256:a", Duration::ZERO).unwrap();
    own_run_dir(&lease);
    let late = lease.record.deadline.after(EXPIRY_GRACE * 2);
    let account = lease.record.account().unwrap();
    let f = empty_host();
    f.dir("/proc", &[]).reply(" list ", ToolOutput::ok(b"[]"));
    let mut setup = w.manager.setup.clone();
    setup.runtime.host = f.clone();
    let observer = Observer::new(&w.manager.store, setup);
    assert!(observer.leases(&late).unwrap()[0].expired);
    assert!(observer.end_expired(&late).unwrap().is_empty());
    assert!(!lease.run_dir().join(ENDED_BY_REAP).exists());
    // Its account's process is killed; another account's is not even asked about.
    f.pid_in(4242, account.uid, 1, true)
        .pid_in(4343, account.uid + 1, 1, true)
        .file(
            "/proc/4242/status",
            &format!("Uid:\t{0}\t{0}\t{0}\t{0}\n", account.uid),
        )
        .file(
            "/proc/4343/status",
            &format!("Uid:\t{0}\t{0}\t{0}\t{0}\n", account.uid + 1),
        );
    let ended = observer.end_expired(&late).unwrap();
    assert!(ended.len() == 1 && ended[0].contains("4242"), "{ended:?}");
    assert!(lease.run_dir().join(ENDED_BY_REAP).exists());
    let kills: Vec<Call> = f
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::KillOf(..)))
        .collect();
    assert_eq!(kills, [Call::KillOf(4242, account.uid)]);
    // A process the kernel will not let go: residue, never "ended".
    f.pid_in(4444, account.uid, 1, false).file(
        "/proc/4444/status",
        &format!("Uid:\t{0}\t{0}\t{0}\t{0}\n", account.uid),
    );
    let left = residue(observer.end_expired(&late).map(drop));
    assert!(left[0].contains("process 4444"), "{left:?}");
}
