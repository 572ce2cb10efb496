//! The lane's own containment controls, proved by ablation as the prebuild's are
//! (`bins/stage/tests/root_ablation.rs`, which proves the controls both stages' bundles share:
//! the read-only root and tree bind, seccomp, capabilities, no-new-privileges, limits,
//! namespaces, the environment and descriptors). Each attempt here must be refused as planned
//! **and** succeed when only its control is taken away; one refused both ways proves nothing
//! and fails. The lane's read-only binds are held three times: by the mount flag, by the
//! session's posture read from outside once the container is created
//! (`cordon_stage::posture`), and by the worker's report from inside. A bundle with one of those
//! flags removed is therefore refused by the outside comparison — a no-decision that
//! quarantines the executor — and that is what their ablation proves.
//!
//! Every run is a real lane session (lease, account, runc, the pinned runtime image, the real
//! worker) whose engine makes every attempt at import and answers them as its tokens, so the
//! host's receipt carries the inside result. The ablation is a test-only transformation at the
//! host seam: [`Interposed`] rewrites the bundle's `config.json` as `runc create` is spawned,
//! never a switch in product code. The outside check also compares `noexec` and the tmpfs
//! sizes, so for the controls proved from inside it is shown the container as planned
//! ([`Blind`]). Both runs make each target usable by the run account first (the tree's and
//! publication's lease copies world-writable, the programs executable), so permissions cannot
//! stand in for a mount flag.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cordon::canonical::Digest;
use cordon::host::fake::Interposed;
use cordon::lease::Manager;
use cordon::receipt::{Decision, Role};
use cordon::tree::TREES;
use cordon_lane::session::{Inputs, LaneError, session};
use cordon_stage::session::SessionError;
use cordon_testkit::blind::Blind;
use cordon_testkit::mount_mut;
use serde_json::Value;

mod common;

use common::{native_bytes, publish_bytes};

/// Requests of the test workload: one warmup, two timed, `TOKENS` tokens each.
const REQUESTS: usize = 3;
const TOKENS: usize = 8;

/// A removal of one control from a bundle's `config.json`.
type Ablate = fn(&mut Value);

/// One lane control an attempt proves: the attempt's index in the probe, and its removal from a
/// bundle.
struct Control {
    name: &'static str,
    /// Which answer of the probe this control decides.
    at: usize,
    ablate: Ablate,
}

/// Drop the options of the mount at `destination` that `drop` names (one at least).
fn without(config: &mut Value, destination: &str, drop: fn(&str) -> bool) {
    let options = mount_mut(config, destination)["options"]
        .as_array_mut()
        .unwrap();
    let before = options.len();
    options.retain(|o| !drop(o.as_str().unwrap()));
    assert!(options.len() < before, "{destination}: no option to drop");
}

const CONTROLS: [Control; 3] = [
    Control {
        name: "noexec tree bind",
        at: 0,
        ablate: |c| without(c, "/engine", |o| o == "noexec"),
    },
    Control {
        name: "noexec model bind",
        at: 1,
        ablate: |c| without(c, "/model", |o| o == "noexec"),
    },
    Control {
        name: "/dev/shm bound",
        at: 2,
        ablate: |c| without(c, "/dev/shm", |o| o.starts_with("size=")),
    },
];

/// The read-only binds, each removed on its own: the posture comparison must refuse the run.
const READ_ONLY: [(&str, Ablate); 3] = [
    ("/engine", |c| without(c, "/engine", |o| o == "ro")),
    ("/native", |c| without(c, "/native", |o| o == "ro")),
    ("/model", |c| without(c, "/model", |o| o == "ro")),
];

/// What the engine attempts, one answer each (0: done; else the errno): run a program from
/// the tree and from the model, write 9 MiB into `/dev/shm` (bounded to 8 MiB here), create a
/// file in the tree, the publication and the model.
const PROBE: &str = "[run('/engine/engine/true'), run('/model/true'), fill('/dev/shm/big'), create('/engine/new'), create('/native/new'), create('/model/new')]";

const HELPERS: &str = "def run(path):\n    pid = os.fork()\n    if pid == 0:\n        try:\n            os.execv(path, [path])\n        except OSError as e:\n            os._exit(e.errno)\n    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n\n\ndef create(path):\n    try:\n        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)\n    except OSError as e:\n        return e.errno\n    os.close(fd)\n    return 0\n\n\ndef fill(path):\n    try:\n        with open(path, 'wb') as f:\n            for _ in range(9):\n                f.write(b'x' * 1048576)\n                f.flush()\n    except OSError as e:\n        return e.errno\n    return 0\n";

/// The planned answers: EACCES (13) from both noexec binds, ENOSPC (28) at the shm bound,
/// EROFS (30) from the three read-only binds (the tree's and publication's copies are
/// world-writable, and the read-only check precedes the model directory's permissions).
const PLANNED: [u32; 6] = [13, 13, 28, 30, 30, 30];

/// The outputs object's digest of an engine that answers `result` to every request.
fn expected(result: &[u32]) -> Digest {
    let one: Vec<u32> = result.iter().copied().cycle().take(TOKENS).collect();
    Digest::of_bytes(&cordon_evidence::outputs::encode(&vec![one; REQUESTS]).unwrap())
}

/// Before `runc create`: make the tree's and publication's lease copies writable by anyone,
/// then apply `ablate`.
fn prepare(bundle: &Path, ablate: Option<Ablate>, applied: &AtomicU32) {
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for destination in ["/engine", "/native"] {
        let source = mount_mut(&mut config, destination)["source"]
            .as_str()
            .unwrap()
            .to_owned();
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    if let Some(f) = ablate {
        f(&mut config);
        applied.fetch_add(1, Ordering::SeqCst);
    }
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
}

#[test]
fn each_lane_control_is_refused_as_planned_and_passes_with_only_it_removed() {
    // The lane's shm bound made small (the block down to its workload phase is the lane's
    // alone; the reference stage's is left as it is).
    let tail = "    tmp size=\"4GiB\" exec=#true\n    // The lease's runtime cache: executable (JIT kernels), bounded, discarded at release.\n    cache size=\"8GiB\" inodes=1000000\n    // The overlay root's writable layer: the lease's own tmpfs, bounded (nothing in the sealed\n    // image is the run account's to write; the bound holds for images where something is).\n    overlay size=\"1GiB\" inodes=100000\n    deadline \"2h\"\n    phase-deadline \"startup\" \"20m\"\n    phase-deadline \"workload\" \"90m\"";
    let w = common::world(
        "lane-ablation",
        0,
        "lane-ablation-0",
        &[(
            &format!("    shm \"4GiB\"\n{tail}"),
            &format!("    shm \"8MiB\"\n{tail}"),
        )],
    );
    let program = std::fs::read(cordon_testkit::compile_static(
        w.dir.path(),
        "true",
        "int main(void) { return 0; }\n",
    ))
    .unwrap();
    let example = cordon_testkit::workspace_root().join("checks/example/incumbent/engine");
    let serve = format!(
        "import os\n{HELPERS}\nRESULT = {PROBE}\n\n\ndef generate(prompt, tokens, model_dir):\n    return (RESULT * tokens)[:tokens]\n"
    );
    let tree = publish_bytes(
        &w.store,
        TREES,
        &[
            (
                "engine/__init__.py",
                &std::fs::read(example.join("__init__.py")).unwrap(),
                false,
            ),
            ("engine/serve.py", serve.as_bytes(), false),
            ("engine/true", &program, true),
        ],
    );
    let publication = native_bytes(
        &w.store,
        &w.policy,
        &tree,
        &[("lib/artifact.txt", b"native\n", false)],
    );
    let workload = common::workload(w.dir.path(), REQUESTS, 1, TOKENS);
    // The model with a program in it, registered under its digest.
    let src = w.dir.path().join("model-with-program");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("vocab"), "1000003\n").unwrap();
    std::fs::write(src.join("true"), &program).unwrap();
    std::fs::set_permissions(src.join("true"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, digest) = cordon_lane::model::verify(&src).unwrap();
    let model =
        cordon_testkit::register_model(&src, &w.dir.path().join("models"), &digest.to_string());

    // One session with `ablate` applied at the seam, under executor `executor`; `blinded`: the
    // outside posture check is shown the container as planned (`Blind`).
    let attempt = |executor: &str, ablate: Option<Ablate>, blinded: bool| {
        let applied = Arc::new(AtomicU32::new(0));
        let counted = applied.clone();
        let mut cfg = w.cfg.clone();
        cfg.setup.executor = executor.to_owned();
        let blind: Arc<Mutex<Option<Blind>>> = Arc::default();
        let shown = blind.clone();
        let host = Interposed::new()
            .rewriting_reads(move |path, bytes| match &*shown.lock().unwrap() {
                Some(b) => b.shown(path, bytes),
                None => bytes,
            })
            .rewriting_spawns(move |tool| {
                let create = tool.args.iter().any(|a| a == "create");
                if let (true, Some(i)) = (create, tool.args.iter().position(|a| a == "--bundle")) {
                    if blinded {
                        *blind.lock().unwrap() = Blind::at_create(&tool.args);
                    }
                    prepare(Path::new(&tool.args[i + 1]), ablate, &counted);
                }
                tool.clone()
            });
        cfg.setup.runtime.host = Arc::new(host);
        let outcome = session(
            &w.policy,
            &cfg,
            &Inputs {
                role: Role::C,
                tree,
                publication,
                workload: workload.clone(),
                model: model.clone(),
                lane: None,
            },
        );
        if ablate.is_some() {
            assert_eq!(
                applied.load(Ordering::SeqCst),
                1,
                "the ablation was not applied once"
            );
        }
        let left = Manager::open(&w.store, cfg.setup.clone())
            .unwrap()
            .check()
            .unwrap();
        assert!(left.is_empty(), "{executor}: left {left:?}");
        outcome
    };
    let answers = |ablate: Option<Ablate>| match attempt("lane-ablation-0", ablate, true) {
        Ok(Decision::Accepted(out)) => out.outputs,
        Ok(Decision::Rejected(r)) => panic!("rejected: {:?}", r.findings),
        Err(e) => panic!("no decision: {e}"),
    };
    let mut failures = Vec::new();
    if answers(None) != expected(&PLANNED) {
        failures.push(format!("the planned bundle must answer {PLANNED:?}"));
    }
    for c in &CONTROLS {
        let mut want = PLANNED;
        want[c.at] = 0;
        if answers(Some(c.ablate)) != expected(&want) {
            failures.push(format!(
                "{}: with only this control removed the engine must answer {want:?}",
                c.name
            ));
        }
    }
    // Each read-only flag removed: refused before the engine runs, naming the mount, under an
    // executor of its own (the refusal quarantines it).
    for (i, (destination, ablate)) in READ_ONLY.iter().enumerate() {
        let executor = format!("lane-ablation-ro{i}");
        match attempt(&executor, Some(*ablate), false) {
            Err(LaneError::Session(SessionError::Posture { why }))
                if why.starts_with(&format!("mount {destination}: rw, not ro;"))
                    && why.contains(&format!("executor {executor} quarantined (containment")) => {}
            other => failures.push(format!(
                "read-only {destination}: with its flag removed the posture comparison must refuse \
                 the run, not {other:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
