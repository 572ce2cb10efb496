//! The policy digest moves with semantics and only with semantics, and `diff` names exactly
//! the value that changed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_policy_lang::Policy;
use cordon_testkit::EditOnce as _;
use cordon_testkit::workspace_root;

fn default_text() -> String {
    std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap()
}

fn parse(text: &str) -> Policy {
    cordon_policy_lang::parse("test.kdl", text).unwrap_or_else(|e| {
        panic!(
            "{}",
            e.render_text(&cordon::voice::Style::fixed(100).handler())
        )
    })
}

fn lines(old: &Policy, new: &Policy) -> Vec<String> {
    cordon_policy_lang::diff::diff(
        &old.canonical_value().unwrap(),
        &new.canonical_value().unwrap(),
    )
    .into_iter()
    .map(|c| c.line)
    .collect()
}

#[test]
fn formatting_comments_and_order_do_not_move_the_digest() {
    let text = default_text();
    let base = parse(&text);
    // Comments dropped, indentation changed, blank lines removed.
    let stripped: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") && !l.trim().is_empty())
        .map(|l| format!("\t{}\n", l.trim()))
        .collect();
    // Set members and sibling nodes reordered; an extra comment and block comment added.
    let reordered = text
        .replace_once(
            "ban-call \"eval\" \"exec\" \"compile\"",
            "ban-call \"compile\" /* moved */ \"exec\" \"eval\"",
        )
        .replace_once(
            "allow \"uname\" \"sysinfo\" \"getrandom\"",
            "allow \"getrandom\" \"uname\" \"sysinfo\"",
        )
        .replace_once(
            "    pids 1024\n    nofile 4096\n",
            "    nofile 4096 // swapped\n    pids 1024\n",
        )
        .replace_once("exclude \".git\" \".hg\"", "exclude \".hg\" \".git\"");
    // The same values in other spellings: 8GiB as 8192MiB, 30m as 1800s.
    let respelt = text
        .replace_once("memory \"8GiB\"", "memory \"8192MiB\"")
        .replace_once("deadline \"30m\"", "deadline \"1800s\"");
    for (what, variant) in [
        ("stripped", stripped),
        ("reordered", reordered),
        ("respelt", respelt),
    ] {
        assert_ne!(variant, text, "{what} did not change the text");
        let other = parse(&variant);
        assert_eq!(
            other.digest().unwrap(),
            base.digest().unwrap(),
            "{what} moved the digest"
        );
        assert!(lines(&base, &other).is_empty(), "{what}");
    }
}

#[test]
fn each_semantic_change_moves_the_digest_and_diff_names_it() {
    let text = default_text();
    let base = parse(&text);
    let cases = [
        (
            "memory \"8GiB\"",
            "memory \"16GiB\"",
            "stage.prebuild.memory: 8 GiB → 16 GiB",
        ),
        ("pids 1024", "pids 2048", "stage.prebuild.pids: 1024 → 2048"),
        (
            "deadline \"30m\"",
            "deadline \"45m\"",
            "stage.prebuild.deadline: 30m → 45m",
        ),
        (
            "tmp size=\"1GiB\" exec=#false",
            "tmp size=\"1GiB\" exec=#true",
            "stage.prebuild.tmp.exec: false → true",
        ),
        ("cpus 4", "cpus \"4.5\"", "stage.prebuild.cpus: 4 → 4.5"),
        (
            "max-redirects 3",
            "max-redirects 2",
            "intake.transport.max-redirects: 3 → 2",
        ),
        (
            "max-members 200000",
            "max-members 100000",
            "intake.archive.max-members: 200000 → 100000",
        ),
        (
            "uid-range 3000000 3099999",
            "uid-range 3000000 3199999",
            "accounts.uid-range.last: 3099999 → 3199999",
        ),
        (
            "store \"/var/lib/cordon/store\"",
            "store \"/srv/cordon\"",
            "store: \"/var/lib/cordon/store\" → \"/srv/cordon\"",
        ),
        (
            "\"*.pyo\"",
            "\"*.pyo\" \"*.so\"",
            "intake.archive.exclude: + \"*.so\"",
        ),
        (
            "allow \"uname\" \"sysinfo\" \"getrandom\"",
            "allow \"uname\" \"getrandom\"",
            "seccomp.candidate: - allow sysinfo (reason \"the kernel's name, memory and load \
             totals, and randomness: sysinfo's host-wide figures are a known channel (README.md, \
             host facts)\")",
        ),
        (
            "architectures \"x86_64\"",
            "architectures \"x86_64\"\n    allow \"ptrace\" reason=\"debugger\"",
            "seccomp.candidate: + allow ptrace (reason \"debugger\")",
        ),
        (
            "    ipc \"none\"\n",
            "    ipc \"none\"\n    capability \"CAP_CHOWN\" reason=\"fix ownership\"\n",
            "stage.prebuild: + capability CAP_CHOWN (reason \"fix ownership\")",
        ),
        (
            "HF_HUB_OFFLINE \"1\"\n        TRANSFORMERS_OFFLINE \"1\"\n        // Every engine cache points into the lease's runtime cache (the worker makes each\n        // directory 0700 for the run account and proves it writable and executable).\n        XDG_CACHE_HOME \"/cache/xdg\"\n        HF_HOME \"/cache/hf\"\n        TRITON_CACHE_DIR \"/cache/triton\"\n        TORCHINDUCTOR_CACHE_DIR \"/cache/inductor\"\n        CUDA_CACHE_PATH \"/cache/cuda\"\n    }\n    mount \"tree\" \"/engine\" mode=\"ro\"\n    mount \"publication\" \"/native\" mode=\"ro\"\n    mount \"model\" \"/model\" mode=\"ro\"\n    mount \"cache\" \"/cache\" mode=\"rw\"\n    output stdout=\"16MiB\" stderr=\"16MiB\"\n    frame max-bytes=\"4MiB\" max-frames=1000000\n}\n\n// Pristine",
            "HF_HUB_OFFLINE \"0\"\n        TRANSFORMERS_OFFLINE \"1\"\n        // Every engine cache points into the lease's runtime cache (the worker makes each\n        // directory 0700 for the run account and proves it writable and executable).\n        XDG_CACHE_HOME \"/cache/xdg\"\n        HF_HOME \"/cache/hf\"\n        TRITON_CACHE_DIR \"/cache/triton\"\n        TORCHINDUCTOR_CACHE_DIR \"/cache/inductor\"\n        CUDA_CACHE_PATH \"/cache/cuda\"\n    }\n    mount \"tree\" \"/engine\" mode=\"ro\"\n    mount \"publication\" \"/native\" mode=\"ro\"\n    mount \"model\" \"/model\" mode=\"ro\"\n    mount \"cache\" \"/cache\" mode=\"rw\"\n    output stdout=\"16MiB\" stderr=\"16MiB\"\n    frame max-bytes=\"4MiB\" max-frames=1000000\n}\n\n// Pristine",
            "stage.lane.env.HF_HUB_OFFLINE: \"1\" → \"0\"",
        ),
        (
            "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\"",
            "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\" \"600\"",
            "step.build-native.argv: [\"/bin/sh\",\"/cordon/patchers/native-rebuild\"] → [\"/bin/sh\",\"/cordon/patchers/native-rebuild\",\"600\"]",
        ),
    ];
    for (from, to, expected) in cases {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{from:?} is not unique in the default policy"
        );
        let changed = parse(&text.replacen(from, to, 1));
        assert_ne!(
            changed.digest().unwrap(),
            base.digest().unwrap(),
            "{from} → {to} kept the digest"
        );
        assert_eq!(lines(&base, &changed), [expected], "{from} → {to}");
    }
}
