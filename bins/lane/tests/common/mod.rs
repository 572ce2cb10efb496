//! What the lane's real-container tests and its benchmark share: one lane world (the default
//! policy with its accounts moved to the caller's block and edits applied, a store, the pinned
//! runtime image built, a lease setup recovered and the runtime probed, a root-owned model) and
//! publishing trees and publications straight into the store.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake;

use std::path::{Path, PathBuf};

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::Decision;
use cordon::store::Store;
use cordon::tree::{self, Entry};
use cordon_lane::lock::GpuLock;
use cordon_lane::qualify::{Plan, QualifyOutputs, qualify};
use cordon_lane::session::{Config, Inputs, session_under};
use cordon_policy_lang::Policy;
use cordon_stage::args::Diagnostics;
use cordon_testkit::{replace_once, workspace_root};

/// One lane world in a temporary directory.
pub struct World {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub policy: Policy,
    pub cfg: Config,
    pub model: PathBuf,
}

/// The world of `owner`'s account block `slot`, executor `executor`, the default policy with
/// `edits` (each must match exactly once).
pub fn world(owner: &str, slot: u32, executor: &str, edits: &[(&str, &str)]) -> World {
    world_of(owner, slot, executor, &|mut text| {
        for (from, to) in edits {
            text = replace_once(&text, from, to);
        }
        text
    })
}

/// The world of `owner`'s account block `slot`, executor `executor`, the default policy as
/// `edit` makes it.
pub fn world_of(owner: &str, slot: u32, executor: &str, edit: &dyn Fn(String) -> String) -> World {
    cordon_testkit::require_root("lane sessions run real containers and accounts");
    let (runtime, binary) = cordon_testkit::test_runtime();
    let dir = tempfile::tempdir().unwrap();
    let ids = cordon_testkit::account_range(owner, slot);
    let text = edit(cordon_testkit::isolated_policy(dir.path(), ids));
    let policy = cordon_policy_lang::parse("lane-test.kdl", &text).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    assert!(cordon_testkit::runtime_image_inputs().is_file());
    let spec = cordon_image::spec::load(&workspace_root().join("images/runtime.kdl")).unwrap();
    cordon::image::build(&spec, &dir.path().join("images/runtime")).unwrap();
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        executor,
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    setup.runtime.binary = binary;
    Manager::open(&store, setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    let runtime_version =
        cordon::identity::probe_runtime(&cordon::host::Linux, runtime, &setup.runtime.binary, None)
            .unwrap()
            .version;
    let src = dir.path().join("model-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("vocab"), "1000003\n").unwrap();
    let (_, digest) = cordon_lane::model::verify(&src).unwrap();
    let model =
        cordon_testkit::register_model(&src, &dir.path().join("models"), &digest.to_string());
    let cfg = Config {
        store: store.clone(),
        images: dir.path().join("images"),
        setup,
        authority: Digest::of_bytes(executor.as_bytes()),
        runtime_version,
        key_dir: std::path::PathBuf::from(cordon::signing::KEY_DIR),
        evidence: cordon_stage::evidence::Evidence::new(&store),
        exe: std::path::PathBuf::from("/proc/self/exe"),
    };
    World {
        dir,
        store,
        policy,
        cfg,
        model,
    }
}

/// A build whose engine sleeps `ms` per request and answers the prompt's first id repeated,
/// running `probe` (indented Python lines) first in every request.
pub fn build_probing(w: &World, ms: u64, probe: &str) -> cordon_lane::qualify::Build {
    let serve = format!(
        "import time\n\n\ndef generate(prompt, tokens, model_dir):\n{probe}    time.sleep({ms} / 1000)\n    return [prompt[0]] * tokens\n"
    );
    let tree = publish(
        &w.store,
        tree::TREES,
        &[("engine/__init__.py", ""), ("engine/serve.py", &serve)],
    );
    cordon_lane::qualify::Build {
        tree,
        publication: native(&w.store, &w.policy, &tree, &[("lib/a", &format!("{ms}\n"))]),
        receipt: Digest::of_bytes(format!("prebuild-{ms}").as_bytes()),
    }
}

/// [`build_probing`] with no probe.
pub fn build(w: &World, ms: u64) -> cordon_lane::qualify::Build {
    build_probing(w, ms, "")
}

/// Publish text files as a tree or publication.
pub fn publish(store: &Store, section: tree::Section, files: &[(&str, &str)]) -> Digest {
    let files: Vec<(&str, &[u8], bool)> = files
        .iter()
        .map(|(p, t)| (*p, t.as_bytes(), false))
        .collect();
    publish_bytes(store, section, &files)
}

/// Publish `(path, bytes, executable)` entries as a tree.
pub fn publish_bytes(
    store: &Store,
    section: tree::Section,
    files: &[(&str, &[u8], bool)],
) -> Digest {
    tree::publish_in(
        store,
        section,
        entries(store, files),
        serde_json::json!({"kind": "test"}),
    )
    .unwrap()
    .digest
}

/// `(path, bytes, executable)` files as content objects in the store, and their entries.
fn entries(store: &Store, files: &[(&str, &[u8], bool)]) -> Vec<Entry> {
    let mut batch = store.batch().unwrap();
    let mut entries = Vec::new();
    for (path, bytes, executable) in files {
        let (sha256, size) = batch.add_reader(*bytes, *executable).unwrap();
        entries.push(Entry {
            path: (*path).to_owned(),
            mode: if *executable { 0o555 } else { 0o444 },
            size,
            sha256,
        });
    }
    batch.commit().unwrap();
    entries
}

/// Publish text files as the publication `policy`'s native-rebuild patcher built from `tree`
/// (its control record says so, as a lane session checks).
pub fn native(store: &Store, policy: &Policy, tree: &Digest, files: &[(&str, &str)]) -> Digest {
    let files: Vec<(&str, &[u8], bool)> = files
        .iter()
        .map(|(p, t)| (*p, t.as_bytes(), false))
        .collect();
    native_bytes(store, policy, tree, &files)
}

/// [`native`] of `(path, bytes, executable)` entries.
pub fn native_bytes(
    store: &Store,
    policy: &Policy,
    tree: &Digest,
    files: &[(&str, &[u8], bool)],
) -> Digest {
    let step = policy
        .patcher_of(cordon_policy_lang::BuildTier::NativeRebuild)
        .unwrap();
    let tree = tree::load(store, tree).unwrap();
    let control = cordon_stage::publication::built(policy, &tree, step, "test").unwrap();
    tree::publish_in(
        store,
        tree::PUBLICATIONS,
        entries(store, files),
        control.to_origin().unwrap(),
    )
    .unwrap()
    .digest
}

/// The pristine reference session's empty, control-only publication.
pub fn control_only(store: &Store) -> Digest {
    let control = tree::Control::ControlOnly {
        purpose: "a test's reference session".into(),
    };
    tree::publish_in(
        store,
        tree::PUBLICATIONS,
        Vec::new(),
        control.to_origin().unwrap(),
    )
    .unwrap()
    .digest
}

/// A workload of `n` requests (the first `warmup` of them warm-up) of `tokens` tokens each,
/// written into `dir`.
pub fn workload(dir: &Path, n: usize, warmup: usize, tokens: usize) -> PathBuf {
    let path = dir.join(format!("workload-{n}-{warmup}-{tokens}.json"));
    let requests: Vec<String> = (0..n)
        .map(|i| format!("{{\"prompt\":[{i},7],\"tokens\":{tokens}}}"))
        .collect();
    std::fs::write(
        &path,
        format!(
            "{{\"version\":1,\"warmup\":{warmup},\"conditioning\":0,\"requests\":[{}]}}",
            requests.join(",")
        ),
    )
    .unwrap();
    path
}

/// Qualify `p` with real reads under `cfg`: its outputs, which must be a speed PASS.
pub fn qualified(w: &World, cfg: &Config, p: &Plan) -> QualifyOutputs {
    let mut read = |inputs: &Inputs, lock: &GpuLock| session_under(&w.policy, cfg, inputs, lock);
    match qualify(
        &w.policy,
        cfg,
        p,
        &mut read,
        Diagnostics::Text,
        &mut std::io::sink(),
    ) {
        Ok(Decision::Accepted(o)) => o,
        other => panic!("expected a PASS, got {other:?}"),
    }
}

/// Outside, after the sessions: nothing of the world's executor is left.
pub fn nothing_left(w: &World) {
    let left = Manager::open(&w.store, w.cfg.setup.clone())
        .unwrap()
        .check()
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}
