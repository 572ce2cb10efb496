//! The stage Session end to end on real runc (root, as CI runs): one container under one lease
//! from validation to the absence proof, and the controls the typed planner added, each probed
//! from inside and ablated: `ipc "none"` has no `/dev/shm` (and `ipc "private"` has one), and
//! `root "overlay"` gives the container a per-lease overlay root (and `root "read-only"` the
//! image's own read-only root), with the shared image cache unchanged outside.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use common::World;
use cordon::container::{Input, Running};
use cordon::host::Linux;
use cordon::image;
use cordon_stage::bundle::HostMount;
use cordon_stage::session::SessionError;

/// Run `script` as the prebuild stage of the default policy with `edits` applied (the image
/// pin moved to the test image, accounts and deny files isolated), and return what it wrote to
/// `/staging/r` and the planned host mounts.
fn run(w: &World, slot: u32, edits: &[(&str, &str)], script: &str) -> (String, Vec<HostMount>) {
    run_driven(w, slot, edits, script, false, |_, _, _| Ok(()))
}

/// [`run`], with stdin and stdout held live for `drive` when `live` is set.
fn run_driven(
    w: &World,
    slot: u32,
    edits: &[(&str, &str)],
    script: &str,
    live: bool,
    drive: impl FnOnce(
        &mut Running,
        &cordon_stage::bundle::Planned,
        Instant,
    ) -> Result<(), SessionError>,
) -> (String, Vec<HostMount>) {
    let policy = common::pinned_policy(w, "stage-session", slot, edits);
    let setup = common::setup(w, &policy, &format!("session-{slot}"), Linux::shared());
    let stdin = if live { Input::Live } else { Input::Null };
    let ran = common::session(w, &policy, &setup)
        .run(
            &common::job(w, script, stdin, live),
            drive,
            |lease, planned, finished| {
                assert_eq!(finished.meta.exit_code, Some(0), "{finished:?}");
                assert!(lease.run_dir().exists());
                let staging = lease.run_dir().join("staging");
                Ok::<_, SessionError>((
                    std::fs::read_to_string(staging.join("r")).unwrap(),
                    planned.host_mounts.clone(),
                ))
            },
        )
        .unwrap();
    // Outside, after release: nothing of the lease is left, and the shared image is unchanged.
    assert!(common::left(w, &setup).is_empty());
    image::verify(&w.layout, &w.digest).unwrap();
    ran.inspected
}

const IPC_PROBE: &str =
    "echo x > /dev/shm/probe 2>/dev/null && echo shm=yes > /staging/r || echo shm=no > /staging/r";

#[test]
fn ipc_none_has_no_dev_shm_and_private_has_one() {
    let w = common::world();
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
    let w = common::world();
    let (r, mounts) = run(
        &w,
        2,
        &[(
            "    root \"read-only\"\n",
            "    root \"overlay\"\n    overlay size=\"64MiB\" inodes=1000\n",
        )],
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
    let w = common::world();
    let (r, _) = run_driven(
        &w,
        4,
        &[],
        "read line; echo \"pong:$line\"; echo done > /staging/r",
        true,
        |running, _, deadline| {
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
