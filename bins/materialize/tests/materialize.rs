//! Materialization end to end through the library (the analysis answered in process, checked as
//! the binary checks its child's answer; the binary itself is `root_cli.rs`): determinism across
//! store roots, exactly one target replaced, the tree guard, and verification of published
//! trees.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{MANIFEST, Member, delta_tar};
use cordon::canonical::Digest;
use cordon::intake;
use cordon::store::Store;
use cordon::tree;
use cordon_materialize::analysis;
use cordon_materialize::materialize::{MaterializeError, Materialized, register_incumbent};
use cordon_policy_lang::{BuildTier, TreeRules};
use cordon_testkit::workspace_root;

/// Materialization with the analysis answered in this process: the same analysis the confined
/// child runs and the same checks of its answer (the binary's tests run the child itself).
fn materialize(
    store: &Store,
    incumbent: &Digest,
    record: &intake::IntakeRecord,
    rules: &TreeRules,
    steps: &BTreeMap<String, BuildTier>,
) -> Result<Materialized, MaterializeError> {
    cordon_materialize::materialize::materialize(store, incumbent, record, rules, steps, &|r| {
        Ok(analysis::respond(r).unwrap())
    })
}

fn policy() -> cordon_policy_lang::Policy {
    let path = workspace_root().join("policy/evaluator.kdl");
    cordon_policy_lang::parse("evaluator.kdl", &std::fs::read_to_string(path).unwrap()).unwrap()
}

fn rules() -> TreeRules {
    policy().tree_rules()
}

/// The registered patchers: the policy's own, and one for native sources and AOT.
fn steps() -> BTreeMap<String, BuildTier> {
    [
        ("build-native".to_owned(), BuildTier::NativeRebuild),
        ("build-sources".to_owned(), BuildTier::NativeSources),
        ("build-aot".to_owned(), BuildTier::SealedDirectArtifact),
    ]
    .into()
}

fn example_delta() -> Vec<u8> {
    let dir = workspace_root().join("checks/example/candidate");
    let read = |p: &str| std::fs::read(dir.join(p)).unwrap();
    let init = read("engine/attention/__init__.py");
    let kernel = read("engine/attention/kernel.py");
    let util = read("engine/attention/util.py");
    delta_tar(&[
        ("cordon-delta.kdl", MANIFEST, 0o644),
        ("engine/attention/__init__.py", &init, 0o644),
        ("engine/attention/kernel.py", &kernel, 0o644),
        ("engine/attention/util.py", &util, 0o644),
    ])
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    incumbent: Digest,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let incumbent = register_incumbent(
        &store,
        &workspace_root().join("checks/example/incumbent"),
        &rules(),
    )
    .unwrap()
    .digest;
    Fixture {
        _dir: dir,
        store,
        incumbent,
    }
}

fn ingest(store: &Store, bytes: &[u8]) -> intake::IntakeRecord {
    intake::ingest(
        store,
        bytes,
        &Digest::of_bytes(bytes),
        &cordon_stage::settings::archive_limits(&policy()),
    )
    .unwrap()
    .record
}

fn rejected_codes(files: &[Member<'_>], rules: &TreeRules) -> Vec<&'static str> {
    let f = fixture();
    let record = ingest(&f.store, &delta_tar(files));
    let before = f.store.listing().unwrap();
    let err = materialize(&f.store, &f.incumbent, &record, rules, &steps()).unwrap_err();
    assert_eq!(
        f.store.listing().unwrap(),
        before,
        "a rejected delta changed the store"
    );
    match err {
        MaterializeError::Rejected(findings, _) => findings.iter().map(|f| f.code).collect(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn the_same_inputs_give_the_same_tree_digest_in_two_stores() {
    let a = fixture();
    let b = fixture();
    assert_eq!(a.incumbent, b.incumbent);
    let delta = example_delta();
    let ra = materialize(
        &a.store,
        &a.incumbent,
        &ingest(&a.store, &delta),
        &rules(),
        &steps(),
    )
    .unwrap();
    let rb = materialize(
        &b.store,
        &b.incumbent,
        &ingest(&b.store, &delta),
        &rules(),
        &steps(),
    )
    .unwrap();
    assert_eq!(ra.record.digest, rb.record.digest);
    // Materializing again reopens the published tree instead of failing.
    let again = materialize(
        &a.store,
        &a.incumbent,
        &ingest(&a.store, &delta),
        &rules(),
        &steps(),
    )
    .unwrap();
    assert_eq!(again.record.digest, ra.record.digest);
    tree::verify(&a.store, &ra.record.digest).unwrap();
}

#[test]
fn exactly_the_one_target_is_replaced_and_its_package_renamed() {
    let f = fixture();
    let m = materialize(
        &f.store,
        &f.incumbent,
        &ingest(&f.store, &example_delta()),
        &rules(),
        &steps(),
    )
    .unwrap();
    let ns = m.namespace.clone().unwrap();
    assert!(ns.starts_with("cordon_c_") && ns.len() == "cordon_c_".len() + 12);
    let base = tree::load(&f.store, &f.incumbent).unwrap();
    let outside = |p: &str| !p.starts_with("engine/attention/");
    let kept: Vec<_> = base.entries.iter().filter(|e| outside(&e.path)).collect();
    let now: Vec<_> = m
        .record
        .entries
        .iter()
        .filter(|e| outside(&e.path) && !e.path.starts_with(&format!("{ns}/")))
        .collect();
    assert_eq!(
        kept, now,
        "everything outside the target is the incumbent's own"
    );
    let root = tree::root_dir(&f.store, &m.record.digest);
    let init = std::fs::read_to_string(root.join(&ns).join("__init__.py")).unwrap();
    assert!(
        init.contains(&format!("from {ns}.kernel import attend")),
        "{init}"
    );
    assert!(!init.contains("from fast_attn"), "{init}");
    let shim = std::fs::read_to_string(root.join("engine/attention/__init__.py")).unwrap();
    assert!(shim.contains(&format!("import {ns} as _cordon_candidate")));
    // The registered import name really resolves to the candidate, in a real interpreter.
    let out = Command::new("python3")
        .current_dir(&root)
        .args([
            "-I",
            "-c",
            "import sys; sys.path.insert(0, '.'); import engine.serve as s; import engine.attention as a; print(a.attend.__module__, s.handle([1, 2]))",
        ])
        .output()
        .expect("python3 is needed to import the materialized tree (apt-get install python3)");
    // The candidate's kernel answers (its module, under the namespace), with the incumbent's
    // tokens: the example's kernels differ in speed, not in results.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{ns}.kernel [1, 50199]"),
        "{out:?}"
    );
    // Read-only: files 0444, directories 0555, times zero.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root.join("engine/serve.py")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o444);
    assert_eq!(meta.mtime(), 0);
    assert_eq!(std::fs::metadata(&root).unwrap().mode() & 0o7777, 0o555);
}

#[test]
fn a_delta_that_touches_anything_outside_its_target_is_rejected() {
    let codes = rejected_codes(
        &[
            ("cordon-delta.kdl", MANIFEST, 0o644),
            ("engine/attention/__init__.py", b"x = 1\n", 0o644),
            ("engine/serve.py", b"x = 2\n", 0o644),
        ],
        &rules(),
    );
    assert_eq!(codes, ["tree.outside-target"]);
}

#[test]
fn the_tree_guard_rejects_each_undeclared_or_binary_file() {
    let m = MANIFEST;
    let ok = ("engine/attention/__init__.py", b"x = 1\n".as_slice(), 0o644);
    let cases: Vec<(Vec<Member<'_>>, &str)> = vec![
        (
            vec![ok, ("engine/attention/run.sh", b"#!/bin/sh\n", 0o755)],
            "tree.executable",
        ),
        (
            vec![ok, ("engine/attention/blob", b"\x7fELF\x02\x01\x01", 0o644)],
            "tree.binary",
        ),
        (
            vec![ok, ("engine/attention/lib.so", b"text", 0o644)],
            "tree.binary",
        ),
        (
            vec![
                ok,
                ("engine/attention/k.cu", b"__global__ void k(){}", 0o644),
            ],
            "tree.native-undeclared",
        ),
        (
            vec![
                ok,
                ("engine/attention/ops.c", b"int f(void){return 1;}", 0o644),
            ],
            "tree.native-undeclared",
        ),
        (
            vec![ok, ("engine/attention/fix.patch", b"--- a\n+++ b\n", 0o644)],
            "tree.patch-undeclared",
        ),
        (
            vec![ok, ("engine/attention/.gitmodules", b"[submodule]", 0o644)],
            "tree.submodule",
        ),
        (
            vec![ok, ("engine/attention/bad.py", b"eval(s)\n", 0o644)],
            "python.ban-call",
        ),
        (
            vec![ok, ("engine/attention/bad.py", b"\xff\xfe", 0o644)],
            "python.encoding",
        ),
    ];
    for (files, code) in cases {
        let mut all = vec![("cordon-delta.kdl", m, 0o644)];
        all.extend(files);
        assert_eq!(rejected_codes(&all, &rules()), [code], "{code}");
    }
}

#[test]
fn a_file_nested_past_the_bounds_is_rejected_whatever_the_callers_stack() {
    // The Python checks run on threads of their own, sized for any input: materialization on a
    // thread with a 512 KiB stack still ends in a clean rejection, never a stack overflow.
    let files: [(&str, String); 3] = [
        (
            "engine/attention/neg.py",
            format!("x = {}1\n", "-".repeat(50_000)),
        ),
        (
            "engine/attention/lists.py",
            format!("{}a{} = 1\n", "[".repeat(50_000), "]".repeat(50_000)),
        ),
        (
            "engine/attention/elif.py",
            format!("if a:\n    pass\n{}", "elif a:\n    pass\n".repeat(50_000)),
        ),
    ];
    let codes = std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(move || {
            let mut all = vec![("cordon-delta.kdl", MANIFEST, 0o644)];
            all.extend(files.iter().map(|(p, t)| (*p, t.as_bytes(), 0o644)));
            rejected_codes(&all, &rules())
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(codes, ["python.nesting"; 3]);
}

#[test]
fn declarations_must_be_carried_allowed_and_registered() {
    let ok = ("engine/attention/__init__.py", b"x = 1\n".as_slice(), 0o644);
    let declared = b"delta target=\"attention\" package=\"fast_attn\" tier=\"native-sources\"\nnative-source \"engine/attention/k.cu\"\n";
    // Declared and carried: admitted.
    let f = fixture();
    let record = ingest(
        &f.store,
        &delta_tar(&[
            ("cordon-delta.kdl", declared, 0o644),
            ok,
            ("engine/attention/k.cu", b"__global__ void k(){}", 0o644),
        ]),
    );
    materialize(&f.store, &f.incumbent, &record, &rules(), &steps()).unwrap();
    // Declared but not carried.
    assert_eq!(
        rejected_codes(&[("cordon-delta.kdl", declared, 0o644), ok], &rules()),
        ["tree.declared-missing"]
    );
    // A tier the policy does not admit.
    let mut strict = rules();
    strict.native_sources = false;
    assert_eq!(
        rejected_codes(
            &[
                ("cordon-delta.kdl", declared, 0o644),
                ok,
                ("engine/attention/k.cu", b"__global__ void k(){}", 0o644),
            ],
            &strict
        ),
        ["tree.tier-disabled"]
    );
    // An unregistered target, an unregistered step, a missing manifest.
    assert_eq!(
        rejected_codes(
            &[("cordon-delta.kdl", b"delta target=\"nope\"\n", 0o644), ok],
            &rules()
        ),
        ["tree.unknown-target"]
    );
    assert_eq!(
        rejected_codes(
            &[
                (
                    "cordon-delta.kdl",
                    b"delta target=\"attention\" package=\"p\" step=\"rm-rf\"\n",
                    0o644
                ),
                ok
            ],
            &rules()
        ),
        ["tree.unknown-step"]
    );
    assert_eq!(rejected_codes(&[ok], &rules()), ["tree.manifest"]);
    // Each tier names one registered patcher, and builds from what it declares.
    let k = (
        "engine/attention/k.cu",
        b"__global__ void k(){}".as_slice(),
        0o644,
    );
    let head = |rest: &str| format!("delta target=\"attention\" package=\"p\" {rest}\n");
    let cases: [(String, Vec<Member<'_>>, &[&str]); 9] = [
        (
            head("step=\"build-native\""),
            vec![ok],
            &["tree.tier-undeclared"],
        ),
        (
            head("step=\"build-native\" tier=\"native-sources\"")
                + "native-source \"engine/attention/k.cu\"\n",
            vec![ok, k],
            &["tree.tier-mismatch"],
        ),
        (
            head("tier=\"dependency-patch\""),
            vec![ok],
            &["tree.tier-unregistered", "tree.tier-mismatch"],
        ),
        (
            head("tier=\"native-sources\""),
            vec![ok],
            &["tree.tier-mismatch"],
        ),
        (
            head("tier=\"native-rebuild\"") + "factory \"p.aot:build\"\n",
            vec![ok],
            &["tree.tier-mismatch"],
        ),
        (
            head("") + "native-source \"engine/attention/k.cu\"\n",
            vec![ok, k],
            &["tree.tier-mismatch"],
        ),
        (
            head("tier=\"sealed-direct-artifact\""),
            vec![ok],
            &["tree.tier-mismatch"],
        ),
        // A factory outside the delta's package would name another's code as the candidate's.
        (
            head("tier=\"sealed-direct-artifact\"") + "factory \"json.decoder:f\"\n",
            vec![ok],
            &["tree.tier-mismatch"],
        ),
        // No package to import it from.
        (
            "delta target=\"attention\" tier=\"sealed-direct-artifact\"\nfactory \"p.aot:build\"\n"
                .to_owned(),
            vec![ok],
            &["tree.manifest", "tree.tier-mismatch"],
        ),
    ];
    for (manifest, files, codes) in cases {
        let mut all = vec![("cordon-delta.kdl", manifest.as_bytes(), 0o644)];
        all.extend(files);
        assert_eq!(rejected_codes(&all, &rules()), codes, "{manifest}");
    }
    // The tier alone names its patcher, which the tree's origin records; native-rebuild may
    // build declared sources (the tree's build.sh compiles them).
    for (manifest, step, carried) in [
        (
            head("tier=\"sealed-direct-artifact\"") + "factory \"p.aot:build\"\n",
            "build-aot",
            vec![ok],
        ),
        (
            head("tier=\"native-rebuild\"") + "native-source \"engine/attention/k.cu\"\n",
            "build-native",
            vec![ok, k],
        ),
    ] {
        let f = fixture();
        let mut files = vec![("cordon-delta.kdl", manifest.as_bytes(), 0o644)];
        files.extend(carried);
        let record = ingest(&f.store, &delta_tar(&files));
        let m = materialize(&f.store, &f.incumbent, &record, &rules(), &steps()).unwrap();
        assert_eq!(m.step.as_deref(), Some(step), "{manifest}");
        assert_eq!(m.record.origin["step"], step);
        // The factory as the tree holds it: renamed into the delta's namespace.
        let factory = m.namespace.map(|ns| format!("{ns}.aot:build"));
        let factory = factory.filter(|_| step == "build-aot");
        assert_eq!(m.record.origin["factory"].as_str(), factory.as_deref());
    }
    // The tree's digest covers the factory (the shim names it): the same files with another
    // factory are another tree, never one whose stored origin names the first's.
    let aot = |factory: &str| {
        let f = fixture();
        let manifest =
            head("tier=\"sealed-direct-artifact\"") + &format!("factory \"{factory}\"\n");
        let record = ingest(
            &f.store,
            &delta_tar(&[("cordon-delta.kdl", manifest.as_bytes(), 0o644), ok]),
        );
        materialize(&f.store, &f.incumbent, &record, &rules(), &steps())
            .unwrap()
            .record
    };
    let (one, two) = (aot("p.aot:build"), aot("p.aot:other"));
    assert_ne!(one.digest, two.digest);
    assert_eq!(
        rejected_codes(
            &[
                (
                    "cordon-delta.kdl",
                    b"delta target=\"attention\" sneaky=\"1\"\n",
                    0o644
                ),
                ok
            ],
            &rules()
        ),
        ["tree.manifest"]
    );
}

#[test]
fn verify_finds_a_modified_an_extra_and_a_missing_file() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    tree::verify(&f.store, &f.incumbent).unwrap();
    let root = tree::root_dir(&f.store, &f.incumbent);
    let victim = root.join("engine/serve.py");
    // Tampering through the hard link changes the shared object too: verify must notice.
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&victim, b"import os\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o444)).unwrap();
    let err = tree::verify(&f.store, &f.incumbent).unwrap_err();
    assert!(err.to_string().contains("engine/serve.py"), "{err}");

    let g = fixture();
    let root = tree::root_dir(&g.store, &g.incumbent);
    let engine = root.join("engine");
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(engine.join("extra.py"), b"").unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o555)).unwrap();
    let err = tree::verify(&g.store, &g.incumbent).unwrap_err();
    assert!(err.to_string().contains("not in the record"), "{err}");

    let h = fixture();
    let root = tree::root_dir(&h.store, &h.incumbent);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(root.join("build.sh")).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o555)).unwrap();
    let err = tree::verify(&h.store, &h.incumbent).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

/// An incumbent path that is not one says what to give instead, before anything is read: not
/// a directory, or a candidate's delta (which goes through cordon-fetch).
#[test]
fn an_incumbent_path_that_is_not_one_says_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let why = |path: &std::path::Path| match register_incumbent(&store, path, &rules()) {
        Err(MaterializeError::Incumbent { why, .. }) => why,
        other => panic!("{other:?}"),
    };
    let missing = why(&dir.path().join("checks/example/incumbent"));
    assert!(
        missing.contains("not a directory: give the incumbent's directory"),
        "{missing}"
    );
    let delta = why(&workspace_root().join("checks/example/candidate"));
    assert!(
        delta.contains("a candidate's delta") && delta.contains("cordon-fetch"),
        "{delta}"
    );
    let before = store.listing().unwrap();
    why(&dir.path().join("nothing"));
    assert_eq!(store.listing().unwrap(), before);
}
