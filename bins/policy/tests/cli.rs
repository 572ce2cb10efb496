//! The `cordon-policy` commands as an interface: exit codes, stdout and stderr.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use clap::Parser;
use cordon_policy::cli::{Args, run};
use cordon_testkit::EditOnce as _;
use cordon_testkit::{require_executable, workspace_root};

fn cmd(args: &[&str]) -> (u8, String, String) {
    let parsed =
        Args::try_parse_from(std::iter::once("cordon-policy").chain(args.iter().copied())).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&parsed, &mut out, &mut err).code();
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn default_policy() -> String {
    workspace_root()
        .join("policy/evaluator.kdl")
        .display()
        .to_string()
}

/// A copy of the minimal policy whose runtime is a fake script printing `version`.
fn with_fake_runtime(dir: &Path, version: &str, extra: &str) -> PathBuf {
    let runtime = dir.join("fake-runc");
    std::fs::write(&runtime, format!("#!/bin/sh\necho '{version}'\n")).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
    let text = std::fs::read_to_string(workspace_root().join("policy/examples/minimal.kdl"))
        .unwrap()
        .replace_once(
            "path=\"/usr/sbin/runc\"",
            &format!("path=\"{}\"", runtime.display()),
        )
        .replace_once("    pids 256\n", &format!("    pids 256\n{extra}"));
    let file = dir.join(format!("policy-{}.kdl", extra.len()));
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn check_exits_0_for_valid_and_2_with_every_problem() {
    let (code, out, err) = cmd(&["check", &default_policy()]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(out.ends_with(": ok\n"));
    let bad = workspace_root().join("bins/policy/tests/fixtures/many-mistakes.kdl");
    let (code, out, err) = cmd(&["check", &default_policy(), &bad.display().to_string()]);
    assert_eq!(code, 2);
    assert_eq!(out.lines().count(), 1, "only the valid file is reported ok");
    assert!(err.contains("has 6 problem(s)"), "{err}");
}

#[test]
fn check_json_diagnostics_and_unreadable_files() {
    let bad = workspace_root().join("bins/policy/tests/fixtures/wrong-type.kdl");
    let (code, _, err) = cmd(&["--diagnostics", "json", "check", &bad.display().to_string()]);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(err.trim()).unwrap();
    assert_eq!(v["problems"][0]["code"], "cordon::policy::wrong-type");
    let (code, _, err) = cmd(&["check", "/nonexistent/policy.kdl"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read policy file /nonexistent/policy.kdl"),
        "{err}"
    );
    // What to do next: the path named is not there; where the reviewed policy is.
    assert!(
        err.contains("no file at that path") && err.contains("policy/evaluator.kdl"),
        "{err}"
    );
    // A directory named for the file, and the default path missing, each say their own.
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = cmd(&["check", &dir.path().display().to_string()]);
    assert_eq!(code, 2);
    assert!(err.contains("that is a directory"), "{err}");
    let e = cordon_stage::start::StartError::read(
        Path::new(cordon_stage::args::DEFAULT_POLICY),
        std::io::Error::from(std::io::ErrorKind::NotFound),
    );
    let help = miette::Diagnostic::help(&e).unwrap().to_string();
    assert!(
        help.contains("--policy PATH") && help.contains("checks/install.sh"),
        "{help}"
    );
}

#[test]
fn identity_names_every_component_and_follows_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_fake_runtime(dir.path(), "fake-runc 1.0", "");
    let file_s = file.display().to_string();
    let (code, out, err) = cmd(&["identity", &file_s]);
    assert_eq!(code, 0, "{err}");
    for label in ["policy ", "file ", "runtime ", "image ", "authority "] {
        assert!(
            out.lines().any(|l| l.starts_with(label)),
            "no {label}line in:\n{out}"
        );
    }
    assert!(out.contains("fake-runc 1.0"));
    let (code, json, _) = cmd(&["identity", &file_s, "--json"]);
    assert_eq!(code, 0);
    let receipt = cordon::receipt::Receipt::parse(json.trim()).unwrap();
    assert_eq!(receipt.stage, cordon::receipt::StageName::Policy);
    assert_eq!(receipt.outputs["authority"], receipt.authority.to_string());
    assert!(out.contains(&receipt.authority.to_string()));
    // A different runtime version is a different authority over the same policy.
    let other = with_fake_runtime(dir.path(), "fake-runc 2.0", "");
    let (_, json2, _) = cmd(&["identity", &other.display().to_string(), "--json"]);
    let receipt2 = cordon::receipt::Receipt::parse(json2.trim()).unwrap();
    assert_eq!(
        receipt2.outputs["policy_digest"],
        receipt.outputs["policy_digest"]
    );
    assert_ne!(receipt2.authority, receipt.authority);
}

/// `identity --json` is a `policy` receipt its published schema describes.
#[test]
fn identity_json_matches_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_fake_runtime(dir.path(), "runc version 1.1.12", "");
    let (code, json, err) = cmd(&["identity", &file.display().to_string(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let schema = serde_json::to_value(cordon_policy::cli::identity_schema()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{json}");
    // A field the schema does not know is refused: the schema is closed.
    let mut extra = value.clone();
    extra["outputs"]["components"]["extra"] = serde_json::json!(1);
    assert!(!validator.is_valid(&extra));
}

#[test]
fn identity_without_its_runtime_is_no_decision() {
    let dir = tempfile::tempdir().unwrap();
    let file = with_fake_runtime(dir.path(), "x", "");
    std::fs::remove_file(dir.path().join("fake-runc")).unwrap();
    let (code, out, err) = cmd(&["identity", &file.display().to_string()]);
    assert_eq!((code, out.as_str()), (3, ""));
    assert!(err.contains("oci runtime not found"), "{err}");
}

#[test]
fn identity_of_the_default_policy_uses_the_real_runc() {
    require_executable(Path::new("/usr/sbin/runc"), "apt-get install -y runc");
    let (code, out, err) = cmd(&["identity", &default_policy()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("runc version"), "{out}");
}

#[test]
fn diff_exits_like_diff_and_names_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let a = with_fake_runtime(dir.path(), "v", "");
    let b = with_fake_runtime(dir.path(), "v", "    nofile 2048\n");
    let (a, b) = (a.display().to_string(), b.display().to_string());
    let (code, out, _) = cmd(&["diff", &a, &a]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("no semantic change (identity unchanged)"),
        "{out}"
    );
    let (code, out, err) = cmd(&["diff", &a, &b]);
    assert_eq!(code, 1, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "[stage]");
    // The file does not write nofile before the change: the stage's node is where it goes.
    let line = std::fs::read_to_string(&b)
        .unwrap()
        .lines()
        .position(|l| l == "    nofile 2048")
        .unwrap()
        + 1;
    assert!(
        lines[1].starts_with("  weakens   stage.prebuild.nofile: 1024 → 2048  (")
            && lines[1].ends_with(&format!(" → {b}:{line})")),
        "{out}"
    );
    assert_eq!(lines[2], "1 changes: 1 weaken, 0 tighten, 0 neutral");
    assert!(
        lines[3].starts_with("policy: sha256:") && lines[4].starts_with("authority: sha256:"),
        "{out}"
    );
    let bad = workspace_root()
        .join("bins/policy/tests/fixtures/syntax.kdl")
        .display()
        .to_string();
    assert_eq!(cmd(&["diff", &a, &bad]).0, 2);
}

#[test]
fn explain_resolves_defaults_and_refuses_unknown_stages() {
    let (code, out, _) = cmd(&["explain", &default_policy(), "--stage", "prebuild"]);
    assert_eq!(code, 0);
    for line in [
        "stage.prebuild.memory = 8 GiB",
        "stage.prebuild.sys = \"none\"",
        "stage.prebuild.tmp.exec = false",
        "seccomp.candidate.syscall.clone = \"allow\" when arg0 & 0x7e020000 == 0 (32 bits)  \
         # threads and processes, never a new namespace: the namespace flags must be clear",
        "seccomp.candidate.syscall.socket = \"allow\" when arg0 in [1, 2, 10] (32 bits)  # AF_UNIX \
         (1), AF_INET (2) and AF_INET6 (10) only: vsock, netlink, packet and crypto sockets reach \
         past the namespace or into the kernel",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    // Every admitted call is printed with its reason: the reviewer reads the whole allow-list.
    let profile =
        cordon_policy_lang::parse("p", &std::fs::read_to_string(default_policy()).unwrap())
            .unwrap()
            .seccomp_profile("candidate")
            .unwrap()
            .clone();
    for (name, rule) in &profile.syscall {
        let head = format!("seccomp.candidate.syscall.{name} = ");
        let line = out.lines().find(|l| l.starts_with(&head));
        assert!(
            line.is_some_and(|l| l.ends_with(&format!("  # {}", rule.reason))),
            "{name} is not printed with its reason: {line:?}"
        );
    }
    let (code, out, _) = cmd(&["explain", &default_policy(), "--stage", "lane", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["stage"]["network"], "none");
    assert!(v["seccomp"]["candidate"]["syscall"]["read"].is_object());
    let (code, _, err) = cmd(&["explain", &default_policy(), "--stage", "surface"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("declared stages: prebuild, lane, reference"),
        "{err}"
    );
}

/// The weakenings a reviewer must not miss read as weakenings, a lower bound as a tightening,
/// each on its file and line; `--fail-on weaken` fails on them and passes a change that only
/// tightens; `--json` carries the same classification.
#[test]
fn diff_marks_weakening_and_fails_on_it_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let old = default_policy();
    let text = std::fs::read_to_string(&old).unwrap();
    let weaker = text
        .replace_once(
            "tmp size=\"1GiB\" exec=#false",
            "tmp size=\"1GiB\" exec=#true",
        )
        .replace_once(
            "\"ctypes\" \"pickle\" \"marshal\"",
            "\"ctypes\" \"marshal\"",
        )
        .replace_once(
            "stage \"lane\" {\n",
            "stage \"lane\" {\n    capability \"CAP_SYS_PTRACE\" reason=\"a debugger\"\n",
        )
        .replace_once(
            "    allow \"ioctl\"",
            "    allow \"process_madvise\" reason=\"again\"\n    allow \"ioctl\"",
        );
    let tighter = text.replace_once("    pids 1024\n", "    pids 800\n");
    let (weaker_file, tighter_file) = (
        dir.path().join("weaker.kdl"),
        dir.path().join("tighter.kdl"),
    );
    std::fs::write(&weaker_file, &weaker).unwrap();
    std::fs::write(&tighter_file, &tighter).unwrap();
    let (w, t) = (
        weaker_file.display().to_string(),
        tighter_file.display().to_string(),
    );

    let (code, out, err) = cmd(&["diff", "--fail-on", "weaken", &old, &w]);
    assert_eq!(code, 1, "{err}");
    let line_of = |needle: &str| weaker.lines().position(|l| l.contains(needle)).unwrap() + 1;
    for (change, needle) in [
        ("stage.prebuild.tmp.exec: false → true", "exec=#true"),
        ("tree.python.ban-import: - \"pickle\"", "ban-import"),
        ("stage.lane: + capability CAP_SYS_PTRACE", "CAP_SYS_PTRACE"),
        (
            "seccomp.candidate: + allow process_madvise",
            "allow \"process_madvise\"",
        ),
    ] {
        let line = out
            .lines()
            .find(|l| l.contains(change))
            .unwrap_or_else(|| panic!("{change}: {out}"));
        assert!(line.starts_with("  weakens "), "{line}");
        assert!(
            line.contains(&format!("{w}:{})", line_of(needle))),
            "{line}: {needle}"
        );
    }
    assert!(
        out.contains("4 changes: 4 weaken, 0 tighten, 0 neutral"),
        "{out}"
    );

    let (code, out, err) = cmd(&["diff", "--fail-on", "weaken", &old, &t]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("  tightens  stage.prebuild.pids: 1024 → 800"),
        "{out}"
    );
    // Without --fail-on, any change is exit 1, as diff(1).
    assert_eq!(cmd(&["diff", &old, &t]).0, 1);

    let (code, out, _) = cmd(&["diff", "--json", "--fail-on", "weaken", &old, &w]);
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["counts"]["weakens"], 4, "{doc}");
    let exec = doc["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == serde_json::json!(["stage", "prebuild", "tmp", "exec"]))
        .unwrap();
    assert_eq!(exec["effect"], "weakens");
    assert_eq!(exec["new_line"], line_of("exec=#true"));
    assert!(
        doc["old"]["policy"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
}

/// `--version` names the release, the commit and the sha256 of the binary's own bytes, the
/// digest the authority counts for it.
#[test]
fn version_names_the_release_the_commit_and_the_binarys_digest() {
    let exe = env!("CARGO_BIN_EXE_cordon-policy");
    for flag in ["--version", "-V"] {
        let out = std::process::Command::new(exe).arg(flag).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let line = String::from_utf8(out.stdout).unwrap();
        let digest = cordon::canonical::Digest::of_file(Path::new(exe)).unwrap();
        assert!(
            line.starts_with(&format!(
                "cordon-policy {} (commit ",
                env!("CARGO_PKG_VERSION")
            )) && line.ends_with(&format!(", binary {digest})\n")),
            "{line}"
        );
        assert!(!line.contains("commit unknown"), "{line}");
    }
}

/// A file that is not a policy at all (the README) shows its first problems and a count, never
/// a screen per line of it.
#[test]
fn a_file_that_is_no_policy_shows_its_first_problems_and_a_count() {
    let readme = workspace_root().join("README.md").display().to_string();
    let (code, _, err) = cmd(&["check", &readme]);
    assert_eq!(code, 2);
    assert!(
        err.contains("more not shown") && err.contains("is this a policy file at all?"),
        "{}",
        &err[err.len().saturating_sub(400)..]
    );
    assert!(err.lines().count() < 400, "{} lines", err.lines().count());
}
