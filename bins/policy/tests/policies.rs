//! Every shipped policy validates, and the default one has the controls seed 001 requires.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_testkit::{policy_files, workspace_root};

#[test]
fn every_policy_file_parses() {
    let files = policy_files();
    assert!(
        files.len() >= 4,
        "expected the default policy and its examples, found {files:?}"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        if let Err(err) = cordon_policy_lang::parse(&file.display().to_string(), &text) {
            panic!(
                "{}",
                err.render_text(&cordon::voice::Style::fixed(100).handler())
            );
        }
    }
}

#[test]
fn default_policy_is_the_reviewed_evaluator() {
    let path = workspace_root().join("policy/evaluator.kdl");
    let policy =
        cordon_policy_lang::parse("evaluator.kdl", &std::fs::read_to_string(path).unwrap())
            .unwrap();
    let v = policy.canonical_value().unwrap();
    let prebuild = &v["stage"]["prebuild"];
    assert_eq!(prebuild["network"], "none");
    assert_eq!(prebuild["root"], "read-only");
    assert_eq!(prebuild["ipc"], "none");
    assert_eq!(prebuild["capability"], serde_json::json!({}));
    assert_eq!(prebuild["no_new_privileges"], true);
    assert_eq!(prebuild["user"], "per-run");
    assert_eq!(prebuild["tmp"]["exec"], false);
    assert_eq!(prebuild["gpu_device"], serde_json::json!({}));
    assert!(prebuild["staging"]["size_bytes"].as_u64().unwrap() > 0);
    for kind in ["lane", "reference"] {
        assert_eq!(v["stage"][kind]["network"], "none", "{kind}");
        assert_eq!(v["stage"][kind]["env"]["HF_HUB_OFFLINE"], "1", "{kind}");
    }
    let seccomp = &v["seccomp"]["candidate"];
    assert_eq!(seccomp["default_action"], "errno:1");
    for banned in [
        "ptrace",
        "mount",
        "bpf",
        "keyctl",
        "io_uring_setup",
        "perf_event_open",
        "unshare",
    ] {
        assert!(
            seccomp["syscall"].get(banned).is_none(),
            "{banned} is allowed"
        );
    }
}

/// The NixOS VM test's policy runs the flake's prebuild image, which the flake checks against
/// the evaluator's pin: its own pin must be the same, or the VM test fails on a re-pin.
#[test]
fn the_vm_tests_policy_pins_the_evaluators_prebuild_image() {
    let parse = |rel: &str| {
        let text = std::fs::read_to_string(workspace_root().join(rel)).unwrap();
        cordon_policy_lang::parse(rel, &text).unwrap()
    };
    let evaluator = parse("policy/evaluator.kdl");
    let vm = parse("policy/examples/vm-test.kdl");
    assert_eq!(
        vm.image_pin("prebuild").unwrap(),
        evaluator.image_pin("prebuild").unwrap()
    );
}
