//! The stage Session end to end on real runc (root, as CI runs): one container under one lease
//! from validation to the absence proof, and the controls the typed planner added, each probed
//! from inside and ablated: `ipc "none"` has no `/dev/shm` (and `ipc "private"` has one), and
//! `root "overlay"` gives the container a per-lease overlay root (and `root "read-only"` the
//! image's own read-only root), with the shared image cache unchanged outside.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use std::io::{BufRead, Write};

use cordon::container::{Input, Running};
use cordon::image::{self, ImageSpec};
use cordon::lease::Manager;
use cordon::store::Store;
use cordon_policy_lang::{MountSource, StageKind};
use cordon_stage::bundle::HostMount;
use cordon_stage::session::{Job, Session, SessionError};
use cordon_testkit::EditOnce as _;

const APPLETS: [&str; 6] = ["sh", "cat", "grep", "touch", "mkdir", "echo"];

struct World {
    dir: tempfile::TempDir,
    store: Store,
    layout: PathBuf,
    digest: cordon::Digest,
}

fn world() -> World {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test runs real containers and creates real accounts: run it as root (CI does)"
    );
    let _ = cordon_testkit::runc();
    let busybox = cordon_testkit::busybox();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut spec = ImageSpec {
        name: "session".into(),
        files: Default::default(),
        dirs: Default::default(),
        env: vec!["PATH=/bin".into()],
        entrypoint: vec!["/bin/sh".into()],
        workdir: None,
    };
    for a in APPLETS {
        spec.files
            .insert(format!("/bin/{a}"), (busybox.clone(), 0o555));
    }
    for d in ["/dev", "/proc", "/tmp", "/engine", "/staging"] {
        spec.dirs.insert(d.into(), 0o755);
    }
    let layout = dir.path().join("layout");
    let digest = image::build(&spec, &layout).unwrap();
    World {
        dir,
        store,
        layout,
        digest,
    }
}

/// Run `script` as the prebuild stage of the default policy with `edits` applied (the image
/// pin moved to the test image, accounts and deny files isolated), and return what it wrote to
/// `/staging/r`, the planned host mounts and the image rootfs.
fn run(w: &World, slot: u32, edits: &[(&str, &str)], script: &str) -> (String, Vec<HostMount>) {
    run_driven(w, slot, edits, script, false, |_, _| Ok(()))
}

/// [`run`], with stdin and stdout held live for `drive` when `live` is set.
fn run_driven(
    w: &World,
    slot: u32,
    edits: &[(&str, &str)],
    script: &str,
    live: bool,
    drive: impl FnOnce(&mut Running, Instant) -> Result<(), SessionError>,
) -> (String, Vec<HostMount>) {
    let ids = cordon_testkit::account_range("stage-session", slot);
    let mut text = cordon_testkit::isolated_policy(w.dir.path(), ids).replace_once(
        "image \"prebuild\" digest=\"sha256:90f5a0d82828426b1382ad80947b38bdd0ca6200f11620cbfbaa788d8ebc4de1\"",
        &format!("image \"prebuild\" digest=\"{}\"", w.digest),
    );
    for (from, to) in edits {
        text = text.replace_once(from, to);
    }
    let policy = cordon_policy_lang::parse("session.kdl", &text).unwrap();
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        &format!("session-{slot}"),
        &w.dir.path().join("state"),
        w.dir.path().join("run"),
    );
    setup.runtime.binary = cordon_testkit::runc();
    Manager::open(&w.store, setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    let rootfs = image::unpack(&w.store, &w.layout, &w.digest).unwrap();
    let tree = w.dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let session = Session {
        policy: &policy,
        kind: StageKind::Prebuild,
        store: w.store.clone(),
        setup: setup.clone(),
        authority: cordon::Digest::of_bytes(b"session-test"),
        runtime_version: cordon::identity::probe_runtime(
            &cordon::host::Linux,
            "runc",
            &setup.runtime.binary,
            None,
        )
        .unwrap()
        .version,
    };
    let job = Job {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        image_rootfs: rootfs.clone(),
        sources: [(MountSource::Tree, tree)].into(),
        stdin: if live { Input::Live } else { Input::Null },
        live_stdout: live,
        live_stderr: false,
        started: Instant::now(),
    };
    let ran = session
        .run(&job, drive, |lease, planned, finished| {
            assert_eq!(finished.meta.exit_code, Some(0), "{finished:?}");
            assert!(lease.run_dir().exists());
            let staging = lease.run_dir().join("staging");
            Ok::<_, SessionError>((
                std::fs::read_to_string(staging.join("r")).unwrap(),
                planned.host_mounts.clone(),
            ))
        })
        .unwrap();
    // Outside, after release: nothing of the lease is left, and the shared image is unchanged.
    let m = Manager::open(&w.store, setup).unwrap();
    assert!(m.check().unwrap().is_empty());
    image::verify(&w.layout, &w.digest).unwrap();
    ran.inspected
}

const IPC_PROBE: &str =
    "echo x > /dev/shm/probe 2>/dev/null && echo shm=yes > /staging/r || echo shm=no > /staging/r";

#[test]
fn ipc_none_has_no_dev_shm_and_private_has_one() {
    let w = world();
    let (r, _) = run(&w, 0, &[], IPC_PROBE);
    assert_eq!(
        r.trim(),
        "shm=no",
        "ipc \"none\" must give the workload no /dev/shm"
    );
    // Ablation: the same probe with only the IPC control changed must succeed.
    let (r, _) = run(
        &w,
        1,
        &[(
            "    ipc \"none\"\n",
            "    ipc \"private\"\n    shm \"1MiB\"\n",
        )],
        IPC_PROBE,
    );
    assert_eq!(
        r.trim(),
        "shm=yes",
        "the probe proves nothing if it fails either way"
    );
}

/// The container's mount table, from inside.
const ROOT_PROBE: &str = "cat /proc/self/mountinfo > /staging/r";

/// The mount table's entry for `/`.
fn root_entry(mountinfo: &str) -> &str {
    mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no / in {mountinfo}"))
}

#[test]
fn an_overlay_root_is_the_leases_own_and_read_only_is_the_images() {
    let w = world();
    let (r, mounts) = run(
        &w,
        2,
        &[("    root \"read-only\"\n", "    root \"overlay\"\n")],
        ROOT_PROBE,
    );
    let root = root_entry(&r);
    assert!(
        root.contains(" - overlay "),
        "an overlay root from inside: {root}"
    );
    let Some(HostMount::Overlay { upper, .. }) = mounts
        .iter()
        .find(|m| matches!(m, HostMount::Overlay { .. }))
    else {
        panic!("no overlay planned: {mounts:?}");
    };
    assert!(
        !Path::new(upper).exists(),
        "the lease's upper directory went with its run directory"
    );
    // Ablation: the read-only root of the default policy is not an overlay, and read-only.
    let (r, _) = run(&w, 3, &[], ROOT_PROBE);
    let root = root_entry(&r);
    assert!(!root.contains(" - overlay "), "{root}");
    let options = root.split(' ').nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "a read-only root: {root}"
    );
}

#[test]
fn a_driver_exchanges_lines_with_the_running_container_over_live_pipes() {
    let w = world();
    let (r, _) = run_driven(
        &w,
        4,
        &[],
        "read line; echo \"pong:$line\"; echo done > /staging/r",
        true,
        |running, deadline| {
            assert!(
                deadline > Instant::now(),
                "the driver is given the stage deadline"
            );
            let mut stdin = running.take_stdin().expect("stdin was asked live");
            let stdout = running.take_stdout().expect("stdout was asked live");
            assert!(
                running.take_stdout().is_none(),
                "a live pipe is handed out once"
            );
            stdin.write_all(b"ping\n").unwrap();
            drop(stdin);
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line, "pong:ping\n");
            Ok(())
        },
    );
    assert_eq!(r.trim(), "done");
}
