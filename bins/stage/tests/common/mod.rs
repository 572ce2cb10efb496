//! What the stage's real-container test files share: one test image (busybox's `sh` and `cat`,
//! testkit's static attempt program and its set-user-id copy, its seccomp verdict program, the
//! probe files), the default policy pinned to it with small bounds, and one Session run of the
//! prebuild stage on a host the test chooses (the real one, or
//! [`Interposed`](cordon::host::fake::Interposed) with failures or ablations).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Instant;

use cordon::container::Input;
use cordon::host::{HostRef, Linux};
use cordon::image::{self, ImageSpec};
use cordon::lease::{Manager, Setup};
use cordon::store::Store;
use cordon_policy_lang::{MountSource, Policy, StageKind};
use cordon_stage::session::{Job, Session, SessionError};
use cordon_testkit::EditOnce as _;

/// A world-writable file of the image (made so after unpacking): only a read-only root stops a
/// write to it.
pub const WRITABLE: &str = "/probe/writable";
/// A file only root may read: only the per-run account stops a read of it.
pub const SECRET: &str = "/probe/secret";
/// The set-user-id-root copy of the attempt program.
pub const SETUID: &str = "/bin/attempt-suid";
/// The seccomp verdict program (testkit's `probes/verdict.c`).
pub const VERDICT: &str = "/bin/verdict";

/// One test's image, store and tree.
pub struct World {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub layout: PathBuf,
    pub digest: cordon::Digest,
    /// The test's own copy of the unpacked image, with the modes no image may carry: the
    /// cache itself is checked against the layout at every use and would be refused.
    pub rootfs: PathBuf,
    pub tree: PathBuf,
}

/// The test image: a shell, the attempt program and its set-user-id copy, and the probe files;
/// unpacked, and copied to the test's own root filesystem with the modes no image may carry.
pub fn world() -> World {
    cordon_testkit::require_root("these tests run real containers and accounts");
    let _ = cordon_testkit::runc();
    let busybox = cordon_testkit::busybox();
    let dir = tempfile::tempdir().unwrap();
    let attempt = cordon_testkit::attempt_program(dir.path());
    let verdict = cordon_testkit::verdict_program(dir.path());
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut spec = ImageSpec {
        name: "stage-test".into(),
        files: Default::default(),
        dirs: Default::default(),
        env: vec!["PATH=/bin".into()],
        entrypoint: vec!["/bin/sh".into()],
        workdir: None,
    };
    for applet in ["sh", "cat"] {
        spec.files
            .insert(format!("/bin/{applet}"), (busybox.clone(), 0o555));
    }
    for path in ["/bin/attempt", SETUID, WRITABLE, SECRET] {
        spec.files.insert(path.into(), (attempt.clone(), 0o555));
    }
    spec.files.insert(VERDICT.into(), (verdict, 0o555));
    for d in ["/dev", "/proc", "/tmp", "/engine", "/staging", "/sys"] {
        spec.dirs.insert(d.into(), 0o755);
    }
    let layout = dir.path().join("layout");
    let digest = image::build(&spec, &layout).unwrap();
    let cached = image::unpack(&store, &layout, &digest).unwrap();
    let rootfs = dir.path().join("rootfs");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&cached)
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(copied.success(), "cp -a {}", cached.display());
    for (path, mode) in [(WRITABLE, 0o666), (SECRET, 0o400), (SETUID, 0o4555)] {
        let file = rootfs.join(path.trim_start_matches('/'));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("build.sh"), "echo tree\n").unwrap();
    World {
        dir,
        store,
        layout,
        digest,
        rootfs,
        tree,
    }
}

/// The default policy pinned to the test image, its account range in `owner`'s slot, with
/// `edits` (each must match exactly once).
pub fn pinned_policy(w: &World, owner: &str, slot: u32, edits: &[(&str, &str)]) -> Policy {
    let ids = cordon_testkit::account_range(owner, slot);
    let mut text = cordon_testkit::isolated_policy(w.dir.path(), ids).replace_once(
        "image \"prebuild\" digest=\"sha256:0efbca039f7fdca394eb074de77367957ec4ff290f1faa1f843854525dd4a9b5\"",
        &format!("image \"prebuild\" digest=\"{}\"", w.digest),
    );
    for (from, to) in edits {
        text = text.replace_once(from, to);
    }
    cordon_policy_lang::parse("stage-test.kdl", &text).unwrap()
}

/// [`pinned_policy`] with the bounds the resource attempts meet made small (each still planned
/// by the planner from the policy, not patched in the bundle).
pub fn policy(w: &World, owner: &str, slot: u32) -> Policy {
    pinned_policy(
        w,
        owner,
        slot,
        &[
            ("    cpus 4\n", "    cpus \"0.1\"\n"),
            ("memory \"8GiB\"", "memory \"256MiB\""),
            ("pids 1024", "pids 48"),
            (
                "child cpus=4 memory=\"6GiB\" pids=768 deadline=\"25m\"",
                "child cpus=\"0.1\" memory=\"192MiB\" pids=32 deadline=\"25m\"",
            ),
            (
                "staging size=\"4GiB\" inodes=200000",
                "staging size=\"1MiB\" inodes=64",
            ),
            (
                "tmp size=\"1GiB\" exec=#false",
                "tmp size=\"8MiB\" exec=#false",
            ),
        ],
    )
}

/// The lease setup of executor `executor` in the test's directories, on `host`, after the
/// startup recovery every manager does first (an earlier crashed run may have left residue).
pub fn setup(w: &World, policy: &Policy, executor: &str, host: HostRef) -> Setup {
    let mut setup = cordon_stage::settings::lease_setup(
        policy,
        executor,
        &w.dir.path().join("state"),
        w.dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    setup.runtime.binary = cordon_testkit::test_runtime().1;
    let mut clean = setup.clone();
    clean.runtime.host = Linux::shared();
    Manager::open(&w.store, clean).unwrap().recover().unwrap();
    setup.runtime.host = host;
    setup
}

/// The prebuild stage's session under `setup`.
pub fn session<'a>(w: &World, policy: &'a Policy, setup: &Setup) -> Session<'a> {
    Session {
        policy,
        kind: StageKind::Prebuild,
        store: w.store.clone(),
        setup: setup.clone(),
        authority: cordon::Digest::of_bytes(b"stage-test"),
        runtime_version: cordon::identity::probe_runtime(
            &Linux,
            "runc",
            &setup.runtime.binary,
            None,
        )
        .unwrap()
        .version,
        evidence: cordon_stage::evidence::Evidence::new(&w.store),
    }
}

/// `/bin/sh -c script` in the test image over the test tree, with `stdin`, stdout live when
/// `live`.
pub fn job(w: &World, script: &str, stdin: Input, live: bool) -> Job {
    Job {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        image_rootfs: w.rootfs.clone(),
        sources: [(MountSource::Tree, w.tree.clone())].into(),
        stdin,
        live_stdout: live,
        live_stderr: false,
        framed: false,
        started: Instant::now(),
        lane: None,
        candidate: None,
    }
}

/// Run `script` in one session of the prebuild stage under `setup`; its stdout.
///
/// # Errors
/// The session's own.
pub fn run(
    w: &World,
    policy: &Policy,
    setup: &Setup,
    script: &str,
) -> Result<String, SessionError> {
    session(w, policy, setup)
        .run(
            &job(w, script, Input::Null, false),
            |_, _, _| Ok::<_, SessionError>(()),
            |_, _, finished| {
                Ok::<_, SessionError>(String::from_utf8_lossy(&finished.stdout).into_owned())
            },
        )
        .map(|ran| ran.inspected)
}

/// What the executor of `setup` has left, read on the real host.
pub fn left(w: &World, setup: &Setup) -> Vec<cordon::lease::Leftover> {
    let mut clean = setup.clone();
    clean.runtime.host = Linux::shared();
    Manager::open(&w.store, clean).unwrap().check().unwrap()
}
