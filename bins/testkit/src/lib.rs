//! Dev-only helpers shared by every cordon crate's tests.
//!
//! Tests that need something from the host (a runtime binary, root) call a `require_*` helper,
//! which fails the test with what is missing and how to install it: a test that cannot run its
//! real check never passes silently.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The workspace root (the directory holding the top-level `Cargo.toml`).
#[must_use]
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("testkit lives two levels below the workspace root")
        .to_path_buf()
}

/// Every `*.kdl` file under `policy/`, sorted.
#[must_use]
pub fn policy_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "kdl") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&workspace_root().join("policy"), &mut out);
    out.sort();
    out
}

/// Fail the test unless `path` is an executable file; `install` says how to get it.
pub fn require_executable(path: &Path, install: &str) {
    use std::os::unix::fs::PermissionsExt;
    let ok =
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    assert!(
        ok,
        "this test needs {} and it is missing: {install}",
        path.display()
    );
}

/// The default policy's text with its per-run account range moved to `first..=first + 999` and
/// its cron/at deny files into `dir`, so that a test's accounts — and the recovery that removes
/// orphans in the range — never meet another test's or the host's.
#[must_use]
pub fn isolated_policy(dir: &Path, first: u32) -> String {
    let text = std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap();
    let quoted = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    text.replace(
        "uid-range 3000000 3099999",
        &format!("uid-range {first} {}", first + 999),
    )
    .replace(
        "gid-range 3000000 3099999",
        &format!("gid-range {first} {}", first + 999),
    )
    .replace("\"/etc/cron.deny\"", &quoted("cron.deny"))
    .replace("\"/etc/at.deny\"", &quoted("at.deny"))
}

/// One bare `runc run` of `bundle` as container `id` under `state_root`, stdio to /dev/null,
/// timed: the baseline the container benchmarks print their ratios against.
#[must_use]
pub fn bare_runc_run(state_root: &Path, bundle: &Path, id: &str) -> std::time::Duration {
    use std::process::{Command, Stdio};
    let t = std::time::Instant::now();
    let status = Command::new("/usr/sbin/runc")
        .arg("--root")
        .arg(state_root)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let took = t.elapsed();
    assert!(
        status.success(),
        "bare runc run of {} failed",
        bundle.display()
    );
    took
}

/// The median of some durations.
#[must_use]
pub fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}
