//! Real lane sessions: the pinned runtime image, the real worker, real accounts, runc. Each
//! hostile engine is a tree whose `engine/serve.py` the validator's harness imports; what it
//! attempts from inside comes back as its output tokens, so the host's receipt (the outputs
//! digest) carries the inside result, and the test checks the outside itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::{Decision, LaneOutputs, Role};
use cordon::store::Store;
use cordon::tree::{self, PUBLICATIONS, TREES};
use cordon_lane::session::{Config, Inputs, LaneError, Outcome, session};
use cordon_policy_lang::Policy;
use cordon_testkit::workspace_root;

mod common;

use common::{native, native_bytes, publish, publish_bytes};

struct Env {
    dir: tempfile::TempDir,
    store: Store,
    policy: Policy,
    cfg: Config,
    model: PathBuf,
    workload: PathBuf,
}

/// Requests of the test workload: one warmup, two timed, `TOKENS` tokens each.
const REQUESTS: usize = 3;
const TOKENS: usize = 8;

fn env(slot: u32, edits: &[(&str, &str)]) -> Env {
    env_of(("lane-session", slot), &format!("lane-{slot}"), edits)
}

/// [`env`] in `owner`'s account block `slot` as `executor` (a test run beside the others).
fn env_of((owner, slot): (&str, u32), executor: &str, edits: &[(&str, &str)]) -> Env {
    let w = common::world(owner, slot, executor, edits);
    let workload = common::workload(w.dir.path(), REQUESTS, 1, TOKENS);
    Env {
        dir: w.dir,
        store: w.store,
        policy: w.policy,
        cfg: w.cfg,
        model: w.model,
        workload,
    }
}

/// A tree of the example incumbent with `serve` as its `engine/serve.py` and `kernel` as its
/// attention kernel.
fn engine(e: &Env, serve: &str, kernel: &str) -> Digest {
    let example = workspace_root().join("checks/example/incumbent/engine");
    let read = |p: &str| std::fs::read_to_string(example.join(p)).unwrap();
    publish(
        &e.store,
        TREES,
        &[
            ("engine/__init__.py", &read("__init__.py")),
            ("engine/serve.py", serve),
            (
                "engine/attention/__init__.py",
                &read("attention/__init__.py"),
            ),
            ("engine/attention/kernel.py", kernel),
        ],
    )
}

fn example_serve() -> String {
    std::fs::read_to_string(workspace_root().join("checks/example/incumbent/engine/serve.py"))
        .unwrap()
}

fn incumbent_kernel() -> String {
    std::fs::read_to_string(
        workspace_root().join("checks/example/incumbent/engine/attention/kernel.py"),
    )
    .unwrap()
}

/// A serve.py whose every response is `probe` (a Python expression giving a list of ints,
/// evaluated once at import, after `prelude`), repeated to the asked length.
fn probing(prelude: &str, probe: &str) -> String {
    format!(
        "import os\nimport time\n{prelude}\nRESULT = {probe}\n\n\ndef generate(prompt, tokens, model_dir):\n    return (RESULT * tokens)[:tokens]\n"
    )
}

fn run(e: &Env, tree: Digest) -> Result<Outcome, LaneError> {
    run_with(e, tree, built(e, &tree))
}

/// The publication the policy's patcher built from `tree`.
fn built(e: &Env, tree: &Digest) -> Digest {
    native(
        &e.store,
        &e.policy,
        tree,
        &[("lib/artifact.txt", "native\n")],
    )
}

fn run_with(e: &Env, tree: Digest, publication: Digest) -> Result<Outcome, LaneError> {
    session(
        &e.policy,
        &e.cfg,
        &Inputs {
            role: Role::C,
            tree,
            publication,
            workload: e.workload.clone(),
            model: e.model.clone(),
            lane: None,
        },
    )
}

fn served(o: Result<Outcome, LaneError>) -> LaneOutputs {
    match o {
        Ok(Decision::Accepted(out)) => out,
        Ok(Decision::Rejected(r)) => panic!("rejected: {:?}", r.findings),
        Err(err) => panic!("no decision: {err}"),
    }
}

fn rejected(o: Result<Outcome, LaneError>) -> (String, String) {
    match o {
        Ok(Decision::Rejected(r)) => (r.findings[0].code.clone(), r.findings[0].message.clone()),
        Ok(Decision::Accepted(_)) => panic!("served"),
        Err(err) => panic!("no decision: {err}"),
    }
}

/// The outputs object's digest of an engine that answers `result` (repeated) to every request.
fn expected(result: &[u32]) -> Digest {
    let one: Vec<u32> = result.iter().copied().cycle().take(TOKENS).collect();
    Digest::of_bytes(&cordon_evidence::outputs::encode(&vec![one; REQUESTS]).unwrap())
}

/// Outside, after the session: no lease, account, mount, container or run directory left.
fn nothing_left(e: &Env) {
    let left = Manager::open(&e.store, e.cfg.setup.clone())
        .unwrap()
        .check()
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    let run = e.dir.path().join("run");
    let entries: Vec<_> = std::fs::read_dir(&run)
        .map(|d| d.map(|x| x.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(entries.is_empty(), "run directories left: {entries:?}");
}

#[test]
fn the_example_engine_is_served_and_a_faster_kernel_gives_the_same_tokens_faster() {
    let e = env(0, &[]);
    let slow = served(run(&e, engine(&e, &example_serve(), &incumbent_kernel())));
    nothing_left(&e);
    let fast_kernel =
        "def attend(query, modulus=1000003):\n    return [pow(q, 65537, modulus) for q in query]\n";
    let fast = served(run(&e, engine(&e, &example_serve(), fast_kernel)));
    nothing_left(&e);
    assert_eq!(slow.outputs, fast.outputs, "the same tokens");
    // The tokens are kept in the store under the digest the receipt names, for offline grading.
    let kept = e.store.read_object_checked(&slow.outputs).unwrap();
    let tokens = cordon_evidence::outputs::decode(&kept).unwrap();
    assert_eq!(tokens.len(), REQUESTS);
    assert!(tokens.iter().all(|t| t.len() == TOKENS));
    assert_eq!(slow.windows.len(), REQUESTS);
    assert!(
        fast.timed_rate_milli > slow.timed_rate_milli,
        "{} vs {}",
        fast.timed_rate_milli,
        slow.timed_rate_milli
    );
    assert_eq!(slow.meta.exit_code, Some(0), "the worker ended cleanly");
    assert_eq!(slow.worker, *e.policy.worker_pin().unwrap());
}

#[test]
fn writes_to_every_read_only_mount_and_the_worker_fail_inside_and_change_nothing_outside() {
    let e = env(1, &[]);
    let (_, model_before) = cordon_lane::model::verify(&e.model).unwrap();
    let attempts = "def attempt(path):\n    try:\n        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)\n    except OSError as e:\n        return e.errno\n    os.close(fd)\n    return 0\n";
    // Creations: the read-only check comes before any permission check, so EROFS can only
    // come from the mount (a writable mount would answer EACCES for these root-owned
    // directories); the image's files and directories are the run account's to read only.
    let probe = "[attempt(p) for p in ('/engine/new', '/engine/engine/new', '/native/new', '/model/new', '/cordon/worker', '/cordon/new', '/new')]";
    let tree = engine(&e, &probing(attempts, probe), &incumbent_kernel());
    let out = served(run(&e, tree));
    // EROFS (30) in the three read-only binds, EACCES (13) in the image's root-owned overlay.
    assert_eq!(out.outputs, expected(&[30, 30, 30, 30, 13, 13, 13]));
    nothing_left(&e);
    tree::verify(&e.store, &tree).unwrap();
    tree::verify_in(&e.store, PUBLICATIONS, &built(&e, &tree)).unwrap();
    assert_eq!(
        cordon_lane::model::verify(&e.model).unwrap().1,
        model_before
    );
    let rootfs = e
        .store
        .path("images", &e.policy.image_pin("runtime").unwrap().hex())
        .join("rootfs/cordon/worker");
    assert_eq!(
        Digest::of_file(&rootfs).unwrap(),
        *e.policy.worker_pin().unwrap()
    );
}

#[test]
fn the_engine_can_neither_kill_nor_read_the_worker() {
    let e = env(2, &[]);
    // SIGKILL, SIGSEGV, SIGBUS, SIGUSR1, SIGTERM, SIGHUP, SIGSTOP: each accepted by kill(2)
    // and dropped or held by the worker, which goes on relaying.
    let helpers = "def kill_init():\n    try:\n        for sig in (9, 11, 7, 10, 15, 1, 19):\n            os.kill(1, sig)\n    except OSError as e:\n        return e.errno\n    time.sleep(0.2)\n    return 0\n\n\ndef read(path):\n    try:\n        with open(path, 'rb') as f:\n            f.read(1)\n    except OSError as e:\n        return e.errno\n    return 0\n\n\ndef write(path):\n    try:\n        with open(path, 'wb') as f:\n            f.write(b'CDL1')\n    except OSError as e:\n        return e.errno\n    return 0\n";
    // The worker's stdout is the host's framed stream: the engine cannot open it to speak
    // there in the worker's name (every frame the host decodes is the worker's own encoding).
    let probe = "[kill_init(), read('/proc/1/mem'), read('/proc/1/environ'), read('/proc/self/environ'), write('/proc/1/fd/1')]";
    let out = served(run(
        &e,
        engine(&e, &probing(helpers, probe), &incumbent_kernel()),
    ));
    // SIGKILL to the namespace's init from inside is dropped (the session goes on); its /proc
    // files (its memory, environment and descriptors) are root's because it is not dumpable;
    // the engine's own are readable (the control).
    assert_eq!(out.outputs, expected(&[0, 13, 13, 0, 13]));
    nothing_left(&e);
}

#[test]
fn garbage_forged_frames_and_token_lies_from_the_engine_are_rejected() {
    let e = env(3, &[]);
    let garbage = "import sys\n\n\ndef generate(prompt, tokens, model_dir):\n    sys.stdout.buffer.write(b'GARBAGE' * 100000)\n    sys.stdout.buffer.flush()\n    return [0] * tokens\n";
    let (code, message) = rejected(run(&e, engine(&e, garbage, &incumbent_kernel())));
    assert_eq!(code, "lane.protocol", "{message}");
    assert!(message.contains("magic"), "{message}");
    nothing_left(&e);
    // The frames the host read (the worker's posture and its report of the engine's garbage)
    // are the incident's evidence.
    let kept = e.cfg.evidence.take();
    let frames = kept
        .iter()
        .find(|k| k.name == "frames")
        .expect("frames kept");
    let heard =
        String::from_utf8_lossy(&e.store.read_evidence(&frames.sha256).unwrap()).into_owned();
    assert!(
        heard.starts_with("CDL1") && heard.contains("protocol's magic"),
        "{heard:?}"
    );

    let forged = "import sys\n\n\ndef generate(prompt, tokens, model_dir):\n    sys.stdout.buffer.write(b'CDL1' + bytes([1]) + (2).to_bytes(4, 'big') + b'{}')\n    sys.stdout.buffer.flush()\n    return [0] * tokens\n";
    let (code, message) = rejected(run(&e, engine(&e, forged, &incumbent_kernel())));
    assert_eq!(code, "lane.protocol");
    assert!(message.contains("Posture"), "{message}");
    nothing_left(&e);
    // The worker's own reports forged by the engine: a fault would turn the engine's failure
    // into a no-decision, an ended report would end its session on its word. The worker
    // refuses both kinds from the engine's stream: the engine's violation.
    for (kind, payload, name) in [
        (7, "{\"what\": \"forged\"}", "Fault"),
        (
            6,
            "{\"code\": 0, \"signal\": null, \"violation\": null, \"early\": false}",
            "Ended",
        ),
    ] {
        let forged = format!(
            "import sys\n\n\ndef generate(prompt, tokens, model_dir):\n    p = {payload:?}.encode()\n    sys.stdout.buffer.write(b'CDL1' + bytes([{kind}]) + len(p).to_bytes(4, 'big') + p)\n    sys.stdout.buffer.flush()\n    return [0] * tokens\n"
        );
        let (code, message) = rejected(run(&e, engine(&e, &forged, &incumbent_kernel())));
        assert_eq!(code, "lane.protocol", "{message}");
        assert!(message.contains(name), "{message}");
        nothing_left(&e);
    }

    let short = "import sys\n\n\ndef generate(prompt, tokens, model_dir):\n    sys.stderr.write('short by one\\n')\n    return [1] * (tokens - 1)\n";
    let _ = e.cfg.evidence.take();
    let (code, message) = rejected(run(&e, engine(&e, short, &incumbent_kernel())));
    assert_eq!(code, "lane.count", "{message}");
    nothing_left(&e);
    // The engine's stderr is kept as evidence for the receipt, with the host's records.
    let kept = e.cfg.evidence.take();
    let stderr = kept
        .iter()
        .find(|k| k.name == "stderr")
        .expect("stderr kept");
    let text = e.store.read_evidence(&stderr.sha256).unwrap();
    assert!(
        String::from_utf8_lossy(&text).contains("short by one"),
        "{text:?}"
    );
    for name in [
        "bundle",
        "mountinfo",
        "lease-record",
        "runtime-state",
        "cgroup-events",
        "devices",
    ] {
        assert!(kept.iter().any(|k| k.name == name), "{name}: {kept:?}");
    }
    // The device receipts of the read that did not serve: pre, active, post.
    let devices = kept.iter().find(|k| k.name == "devices").unwrap();
    let devices: serde_json::Value =
        serde_json::from_slice(&e.store.read_evidence(&devices.sha256).unwrap()).unwrap();
    for phase in ["pre", "active", "post"] {
        assert!(devices[phase]["launch"].is_string(), "{devices}");
    }
}

#[test]
fn an_engine_asleep_past_either_phase_is_rejected_and_killed_on_time() {
    let e = env(
        4,
        &[(
            "phase-deadline \"startup\" \"20m\"\n    phase-deadline \"workload\" \"90m\"",
            "phase-deadline \"startup\" \"3s\"\n    phase-deadline \"workload\" \"3s\"",
        )],
    );
    // Each session ends within its 3 s phase plus what a session costs here (a lease, an
    // account, a container, release): nowhere near the stage's two hours.
    let on_time = |started: std::time::Instant| {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "killed at the phase deadline, not the stage's: {:?}",
            started.elapsed()
        );
    };
    let asleep_at_import = "import time\ntime.sleep(600)\n";
    let tree = engine(&e, asleep_at_import, &incumbent_kernel());
    let started = std::time::Instant::now();
    let (code, _) = rejected(run(&e, tree));
    assert_eq!(code, "lane.startup-deadline");
    on_time(started);
    nothing_left(&e);
    let asleep_serving =
        "import time\n\n\ndef generate(prompt, tokens, model_dir):\n    time.sleep(600)\n";
    let tree = engine(&e, asleep_serving, &incumbent_kernel());
    let started = std::time::Instant::now();
    let (code, _) = rejected(run(&e, tree));
    assert_eq!(code, "lane.workload-deadline");
    on_time(started);
    nothing_left(&e);
}

/// Processes the engine leaves behind. One in the background is gone after release. And when
/// the registered engine process leaves right away and a fork of it serves the whole workload
/// (within the worker's drain window), the answers are not the registered engine's: the session
/// is `lane.exit`, never served, and nothing is left.
#[test]
fn a_background_process_the_engine_leaves_is_gone_after_release() {
    let e = env(5, &[]);
    let leaves = "if os.fork() != 0:\n    os._exit(0)\n";
    let (code, message) = rejected(run(
        &e,
        engine(&e, &probing(leaves, "[1]"), &incumbent_kernel()),
    ));
    assert_eq!(code, "lane.exit", "{message}");
    nothing_left(&e);
    // A model that overlaps a directory of the host's own (here the image cache, root-owned
    // regular files like any model) is refused before anything runs.
    let tree = engine(&e, &example_serve(), &incumbent_kernel());
    let refused = session(
        &e.policy,
        &e.cfg,
        &Inputs {
            role: Role::C,
            tree,
            publication: built(&e, &tree),
            workload: e.workload.clone(),
            model: e.cfg.images.clone(),
            lane: None,
        },
    );
    assert!(
        matches!(&refused, Err(LaneError::Model(_)))
            && format!("{:?}", refused.as_ref().err()).contains("Overlaps"),
        "{:?}",
        refused.err()
    );
    nothing_left(&e);
    // A publication the patcher built from another tree, or T's control-only one, is not this
    // tree's (its control record, which its name covers, says so): refused before anything
    // runs. The tree's own passes the same check (every session above).
    let other = engine(&e, &example_serve(), "# another kernel\n");
    for publication in [built(&e, &other), common::control_only(&e.store)] {
        let refused = run_with(&e, tree, publication);
        assert!(
            matches!(&refused, Err(LaneError::NoDecision(why)) if why.contains("is not this session's")),
            "{:?}",
            refused.err()
        );
    }
    nothing_left(&e);
    let (first, _) = cordon_testkit::account_range("lane-session", 5);
    let forks = "def spawn():\n    pid = os.fork()\n    if pid == 0:\n        os.setsid()\n        time.sleep(600)\n        os._exit(0)\n    return 1\n";
    let out = served(run(
        &e,
        engine(&e, &probing(forks, "[spawn()]"), &incumbent_kernel()),
    ));
    assert_eq!(out.outputs, expected(&[1]));
    nothing_left(&e);
    // Outside: no process of the lane's account range is left on the host.
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|p| {
            let status = std::fs::read_to_string(p.ok()?.path().join("status")).ok()?;
            let uid: u32 = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            (first..first + 1000).contains(&uid).then_some(status)
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_tampered_image_cache_or_a_worker_not_the_pinned_one_is_a_no_decision_before_the_engine_starts()
{
    let e = env(6, &[]);
    let tree = engine(&e, &example_serve(), &incumbent_kernel());
    served(run(&e, tree));
    let rootfs = e
        .store
        .path("images", &e.policy.image_pin("runtime").unwrap().hex())
        .join("rootfs");
    // Swap a cached file for other bytes (the worker: one more byte of itself, the same
    // program; the harness: one line more): the host checks the cached tree against the
    // verified layers before every run and refuses it.
    for (file, extra) in [
        ("cordon/worker", &b"\0"[..]),
        ("cordon/lane/serve.py", b"\n"),
    ] {
        let cached = rootfs.join(file);
        let original = std::fs::read(&cached).unwrap();
        let mode = if file.ends_with(".py") { 0o444 } else { 0o555 };
        // The cache's file replaced by `bytes`, with the mode and time the image gives it.
        let replace = |bytes: &[u8]| {
            let _ = std::fs::remove_file(&cached);
            std::fs::write(&cached, bytes).unwrap();
            std::fs::set_permissions(&cached, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            cordon::store::zero_mtime(&cached).unwrap();
        };
        replace(&[&original[..], extra].concat());
        match run(&e, tree) {
            Err(err @ LaneError::Image(cordon::image::ImageError::Tampered { .. })) => {
                assert_eq!(
                    cordon::exit::ExitClass::exit_class(&err),
                    cordon::ExitCode::NoDecision
                );
                assert!(err.to_string().contains(file), "{err}");
            }
            other => panic!("{file}: expected the cache refused, got {other:?}"),
        }
        nothing_left(&e);
        // Restored, the cache is the image's again and serves.
        replace(&original);
        served(run(&e, tree));
    }
    drop(e);
    // The worker's own seal still holds behind it: a policy pinning other worker bytes is
    // refused when the worker reports its digest, before the engine starts.
    let pin = format!(
        "worker digest=\"{}\"",
        cordon::canonical::Digest::of_bytes(b"other worker")
    );
    let text = std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("worker digest="))
        .unwrap()
        .to_owned();
    let e = env(6, &[(&line, &pin)]);
    let tree = engine(&e, &example_serve(), &incumbent_kernel());
    match run(&e, tree) {
        Err(LaneError::NoDecision(why)) => assert!(why.contains("the worker is"), "{why}"),
        other => panic!("expected a no-decision, got {other:?}"),
    }
    nothing_left(&e);
}

#[test]
fn the_runtime_cache_is_private_executable_and_bounded_in_bytes_and_inodes_and_tmpfs_pages_are_the_containers_memory()
 {
    // The lane's block alone (the reference stage has the same lines but its workload phase).
    let e = env(
        7,
        &[(
            "tmp size=\"4GiB\" exec=#true\n    // The lease's runtime cache: executable (JIT kernels), bounded, discarded at release.\n    cache size=\"8GiB\" inodes=1000000\n    // The overlay root's writable layer: the lease's own tmpfs, bounded (nothing in the sealed\n    // image is the run account's to write; the bound holds for images where something is).\n    overlay size=\"1GiB\" inodes=100000\n    deadline \"2h\"\n    phase-deadline \"startup\" \"20m\"\n    phase-deadline \"workload\" \"90m\"",
            "tmp size=\"1MiB\" exec=#true\n    cache size=\"1MiB\" inodes=64\n    overlay size=\"1GiB\" inodes=100000\n    deadline \"2h\"\n    phase-deadline \"startup\" \"20m\"\n    phase-deadline \"workload\" \"90m\"",
        )],
    );
    let helpers = "def fill(path):\n    try:\n        with open(path, 'wb') as f:\n            for _ in range(64):\n                f.write(b'x' * 65536)\n                f.flush()\n    except OSError as e:\n        return e.errno\n    return 0\n\n\ndef many(dir):\n    try:\n        for i in range(200):\n            open(dir + '/f' + str(i), 'wb').close()\n    except OSError as e:\n        return e.errno\n    return 0\n\n\ndef mode(path):\n    st = os.stat(path)\n    return (st.st_mode & 0o7777) + (st.st_uid == os.getuid()) * 10000\n";
    let probe = "[fill('/cache/xdg/big'), many('/cache/hf'), mode('/cache/triton'), int(os.environ.get('CUDA_CACHE_PATH') == '/cache/cuda'), fill('/tmp/big')]";
    let out = served(run(
        &e,
        engine(&e, &probing(helpers, probe), &incumbent_kernel()),
    ));
    // ENOSPC (28) at the byte bound and at the inode bound; each cache directory is the run
    // account's, mode 0700 (10000 + 0o700); the engine's cache variables point there; /tmp
    // is bounded the same way (its `tmp size`).
    assert_eq!(out.outputs, expected(&[28, 28, 10000 + 0o700, 1, 28]));
    nothing_left(&e);
    drop(e);
    // The same fills with only the bounds as the shipped policy has them: both succeed.
    let e = env(7, &[]);
    let probe = "[fill('/cache/xdg/big'), fill('/tmp/big')]";
    let out = served(run(
        &e,
        engine(&e, &probing(helpers, probe), &incumbent_kernel()),
    ));
    assert_eq!(out.outputs, expected(&[0, 0]));
    nothing_left(&e);
    drop(e);
    // tmpfs pages count against the container's own memory limit (the host's memory check
    // rests on it): a /tmp larger than the limit, filled past it, is the engine's OOM kill…
    let block = |memory: &str| {
        format!(
            "memory \"{memory}\"\n    pids 4096\n    // Below the supervisor's hard limit: the runtime cannot raise it without CAP_SYS_RESOURCE.\n    nofile 16384\n    core \"0B\"\n    shm \"4GiB\"\n    tmp size=\"1GiB\" exec=#true\n    // The lease's runtime cache: executable (JIT kernels), bounded, discarded at release.\n    cache size=\"8GiB\" inodes=1000000\n    // The overlay root's writable layer: the lease's own tmpfs, bounded (nothing in the sealed\n    // image is the run account's to write; the bound holds for images where something is).\n    overlay size=\"1GiB\" inodes=100000\n    deadline \"2h\"\n    phase-deadline \"startup\" \"20m\"\n    phase-deadline \"workload\" \"90m\""
        )
    };
    let shipped = block("10GiB").replace("tmp size=\"1GiB\"", "tmp size=\"4GiB\"");
    let hog = "def hog(path):\n    with open(path, 'wb') as f:\n        for _ in range(512):\n            f.write(b'x' * 1048576)\n            f.flush()\n    return 0\n";
    let e = env(7, &[(&shipped, &block("256MiB"))]);
    let (code, _) = rejected(run(
        &e,
        engine(&e, &probing(hog, "[hog('/tmp/big')]"), &incumbent_kernel()),
    ));
    assert_eq!(code, "lane.oom");
    nothing_left(&e);
    drop(e);
    // …and with only the limit raised, the same fill is served.
    let e = env(7, &[(&shipped, &block("2GiB"))]);
    let out = served(run(
        &e,
        engine(&e, &probing(hog, "[hog('/tmp/big')]"), &incumbent_kernel()),
    ));
    assert_eq!(out.outputs, expected(&[0]));
    nothing_left(&e);
}

#[test]
fn programs_in_the_tree_and_the_model_cannot_run_and_the_publications_can() {
    let mut e = env(9, &[]);
    let program = std::fs::read(cordon_testkit::compile_static(
        e.dir.path(),
        "true",
        "int main(void) { return 0; }\n",
    ))
    .unwrap();
    let example = workspace_root().join("checks/example/incumbent/engine");
    let read = |p: &str| std::fs::read(example.join(p)).unwrap();
    let runs = "def run(path):\n    pid = os.fork()\n    if pid == 0:\n        try:\n            os.execv(path, [path])\n        except OSError as e:\n            os._exit(e.errno)\n    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n";
    let serve = probing(
        runs,
        "[run('/engine/engine/true'), run('/model/true'), run('/native/bin/true')]",
    );
    let tree = publish_bytes(
        &e.store,
        TREES,
        &[
            ("engine/__init__.py", &read("__init__.py"), false),
            ("engine/serve.py", serve.as_bytes(), false),
            ("engine/true", &program, true),
        ],
    );
    let publication = native_bytes(&e.store, &e.policy, &tree, &[("bin/true", &program, true)]);
    let model_program = e.model.join("true");
    std::fs::write(&model_program, &program).unwrap();
    std::fs::set_permissions(
        &model_program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // A changed model is another model: registered again under its new digest.
    let (_, digest) = cordon_lane::model::verify(&e.model).unwrap();
    e.model =
        cordon_testkit::register_model(&e.model, &e.dir.path().join("models"), &digest.to_string());
    let out = served(run_with(&e, tree, publication));
    // EACCES (13) from the noexec tree and model binds; the same program runs from the
    // publication, whose native code the engine may load (the control).
    assert_eq!(out.outputs, expected(&[13, 13, 0]));
    nothing_left(&e);
}

#[test]
fn the_engine_cannot_lower_the_workers_limits_but_its_own() {
    let e = env(8, &[]);
    let program = std::fs::read(cordon_testkit::compile_static(
        e.dir.path(),
        "limit",
        "#define _GNU_SOURCE\n#include <errno.h>\n#include <sys/resource.h>\nint main(int argc, char **argv) {\n    struct rlimit r = {3, 3};\n    (void)argv;\n    return prlimit(argc > 1 ? 0 : 1, RLIMIT_NOFILE, &r, 0) == 0 ? 0 : errno;\n}\n",
    ))
    .unwrap();
    let runs = "def run(*argv):\n    pid = os.fork()\n    if pid == 0:\n        try:\n            os.execv(argv[0], list(argv))\n        except OSError as e:\n            os._exit(e.errno)\n    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n";
    let serve = probing(
        runs,
        "[run('/native/bin/limit'), run('/native/bin/limit', 'self')]",
    );
    let tree = engine(&e, &serve, &incumbent_kernel());
    let publication = native_bytes(&e.store, &e.policy, &tree, &[("bin/limit", &program, true)]);
    let out = served(run_with(&e, tree, publication));
    // EPERM (1) for the worker (pid 1), the program's own limits lowered (the control); and
    // the worker, untouched, relayed the whole session.
    assert_eq!(out.outputs, expected(&[1, 0]));
    nothing_left(&e);
}

/// SIGTERM to the supervisor while the engine serves (asleep, far from either phase deadline):
/// the container is stopped at once, the framed session ends, and the release leaves nothing;
/// the receipt path turns the session's end into a no-decision naming the signal.
#[test]
fn a_signal_mid_read_stops_the_engine_and_releases_the_lane() {
    cordon::interrupt::install().unwrap();
    let e = env(7, &[]);
    let asleep_serving =
        "import time\n\n\ndef generate(prompt, tokens, model_dir):\n    time.sleep(600)\n";
    let tree = engine(&e, asleep_serving, &incumbent_kernel());
    let (store, state_root) = (
        e.store.root().to_path_buf(),
        e.cfg.setup.runtime.state_root.clone(),
    );
    let signaller = std::thread::spawn(move || {
        let _ = cordon_testkit::wait_running(&store, &state_root);
        nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    });
    let started = std::time::Instant::now();
    let _ = run(&e, tree);
    signaller.join().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "stopped by the signal, not by a phase deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(
        cordon::interrupt::raised(),
        Some(nix::sys::signal::Signal::SIGTERM)
    );
    nothing_left(&e);
}

/// A multi-process engine, the image's `serve-ranks.py` (a frontend, one scheduler process per
/// rank, a detokenizer), reports each rank from the process that loads the engine tree: it is
/// served when its step declares that many ranks, with the single-process engine's tokens, and
/// rejected (`lane.members`) when the step declares another count either way.
#[test]
fn a_multi_process_engine_covers_exactly_the_ranks_its_step_declares() {
    let step = "step \"serve-example\" stage=\"lane\" {\n    argv \"/usr/bin/python3.11\" \"-I\" \"-S\" \"-B\" \"/cordon/lane/serve.py\"\n    ranks 1";
    let with = |harness: &str, ranks: u32| {
        step.replace(
            "\"/cordon/lane/serve.py\"\n    ranks 1",
            &format!("{harness}\n    ranks {ranks}"),
        )
    };
    let single = env_of(("lane-members", 0), "members-0", &[]);
    let tree = engine(&single, &example_serve(), &incumbent_kernel());
    let tokens = served(run(&single, tree)).outputs;
    nothing_left(&single);
    for (harness, ranks, outcome) in [
        ("\"/cordon/lane/serve-ranks.py\" \"2\"", 2, None),
        (
            "\"/cordon/lane/serve-ranks.py\" \"2\"",
            3,
            Some("are [0, 1], not each of 0 to 2 once"),
        ),
        (
            "\"/cordon/lane/serve-ranks.py\" \"2\"",
            1,
            Some("are [0, 1], not each of 0 to 0 once"),
        ),
        (
            "\"/cordon/lane/serve.py\"",
            2,
            Some("are [0], not each of 0 to 1 once"),
        ),
    ] {
        let e = env_of(
            ("lane-members", 0),
            "members-0",
            &[(step, &with(harness, ranks))],
        );
        let tree = engine(&e, &example_serve(), &incumbent_kernel());
        match outcome {
            None => assert_eq!(served(run(&e, tree)).outputs, tokens, "{harness} {ranks}"),
            Some(why) => {
                let (code, message) = rejected(run(&e, tree));
                assert_eq!(code, "lane.members", "{harness} {ranks}: {message}");
                assert!(message.contains(why), "{harness} {ranks}: {message}");
            }
        }
        nothing_left(&e);
    }
}
