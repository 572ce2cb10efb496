//! The `cordon-prebuild` binary end to end, as root: the demo's pipeline (`cordon-fetch`, then
//! `cordon-materialize`, then `cordon-prebuild` on the receipt) with this test's own store,
//! image directory and account block, checking each outcome's receipt and exit code — 0 with a
//! publication, 1 with the build's own failure, 2 for an input of another authority or none at
//! all, 3 when cordon cannot establish the run (here: no image to run it in).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cordon::canonical::Digest;
use cordon_testkit::workspace_root;
use serde_json::{Value, json};

fn bin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_cordon-prebuild")).with_file_name(name)
}

/// One store, policy (its accounts in this test's block) and image directory.
struct Cli {
    dir: tempfile::TempDir,
    /// Its own executor: the executor's lock is host-global, so tests sharing one would see
    /// each other's prebuilds as a busy executor.
    executor: String,
}

impl Cli {
    fn new(slot: u32) -> Self {
        cordon_testkit::require_root("the prebuild binary runs real containers and accounts");
        let _ = cordon_testkit::runc();
        let _ = cordon_testkit::busybox();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("policy.kdl"),
            cordon_testkit::isolated_policy(
                dir.path(),
                cordon_testkit::account_range("prebuild-cli", slot),
            ),
        )
        .unwrap();
        cordon_testkit::prebuild_layout(&dir.path().join("images/prebuild"), |to| {
            let spec = cordon_image::spec::load(&cordon_testkit::prebuild_image_spec()).unwrap();
            cordon::image::build(&spec, to).unwrap();
        });
        Self {
            dir,
            executor: format!("prebuild-cli-{slot}"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `binary` with this test's policy, store and lease options.
    fn command(&self, binary: &str) -> Command {
        let mut c = Command::new(bin(binary));
        c.args(self.options());
        c
    }

    /// The policy, store and lease options every stage binary here takes.
    fn options(&self) -> Vec<String> {
        let path = |name: &str| self.path(name).display().to_string();
        vec![
            "--policy".into(),
            path("policy.kdl"),
            "--store".into(),
            path("store"),
            "--run-dir".into(),
            path("run"),
            "--executor".into(),
            self.executor.clone(),
        ]
    }

    /// `binary` and its options as one shell word list (the test's paths hold no spaces).
    fn shell(&self, binary: &str, extra: &str) -> String {
        format!(
            "{} {} {extra}",
            bin(binary).display(),
            self.options().join(" ")
        )
    }

    /// Register `incumbent` (a directory), fetch the bundled example candidate and materialize
    /// it over that incumbent: the materialize receipt's file. Its tier is native-sources (the
    /// registered compiler builds its C sources).
    fn materialized(&self, incumbent: &Path) -> PathBuf {
        self.materialized_as(incumbent, "native-sources")
    }

    /// [`Cli::materialized`] with the candidate declaring `tier` (`native-rebuild`: the
    /// incumbent's `build.sh` builds it).
    fn materialized_as(&self, incumbent: &Path, tier: &str) -> PathBuf {
        self.materialized_from(incumbent, "candidate", ("native-sources", tier))
    }

    /// Register `incumbent`, fetch the bundled example `checks/example/<example>` with its
    /// manifest's `tier="FROM"` written `tier="TO"`, and materialize it.
    fn materialized_from(
        &self,
        incumbent: &Path,
        example: &str,
        (from, to): (&str, &str),
    ) -> PathBuf {
        let out = self
            .command("cordon-materialize")
            .arg("incumbent")
            .arg(incumbent)
            .output()
            .expect("cordon-materialize is built beside cordon-prebuild (cargo build --workspace)");
        assert!(out.status.success(), "{out:?}");
        let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
        let tree = receipt["outputs"]["tree_digest"]
            .as_str()
            .unwrap()
            .to_owned();
        let candidate = self.path("candidate");
        let _ = std::fs::remove_dir_all(&candidate);
        cordon_testkit::copy_tree(
            &workspace_root().join("checks/example").join(example),
            &candidate,
        );
        let manifest = candidate.join("cordon-delta.kdl");
        let text = std::fs::read_to_string(&manifest).unwrap();
        assert!(text.contains(&format!("tier={from:?}")), "{text}");
        std::fs::write(
            &manifest,
            text.replace(&format!("tier={from:?}"), &format!("tier={to:?}")),
        )
        .unwrap();
        let archive = self.path("candidate.tar");
        std::fs::write(&archive, cordon_testkit::pack_delta(&candidate)).unwrap();
        let sha = Digest::of_file(&archive).unwrap();
        let fetched = self
            .command("cordon-fetch")
            .args(["--sha256", &sha.to_string()])
            .arg(&archive)
            .output()
            .unwrap();
        assert!(fetched.status.success(), "{fetched:?}");
        let fetch_file = self.path("fetch.json");
        std::fs::write(&fetch_file, &fetched.stdout).unwrap();
        let out = self
            .command("cordon-materialize")
            .args(["--incumbent", &tree, "--receipt"])
            .arg(&fetch_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let file = self.path("materialize.json");
        std::fs::write(&file, &out.stdout).unwrap();
        file
    }

    /// [`Cli::materialized`] over the example incumbent with a build that runs for ever.
    fn materialized_forever(&self) -> PathBuf {
        let incumbent = self.path("incumbent");
        cordon_testkit::copy_tree(
            &workspace_root().join("checks/example/incumbent"),
            &incumbent,
        );
        std::fs::write(
            incumbent.join("build.sh"),
            "#!/bin/sh\nwhile :; do :; done\n",
        )
        .unwrap();
        self.materialized_as(&incumbent, "native-rebuild")
    }

    /// `cordon-prebuild` on the receipt in `receipt` with image directory `images`.
    /// `cordon-prebuild` started on `receipt` with the test's images, its stdout and stderr
    /// each `stdio()`: for a test that signals or kills it mid-build.
    fn spawn_prebuild(
        &self,
        receipt: &Path,
        stdio: fn() -> std::process::Stdio,
    ) -> std::process::Child {
        self.command("cordon-prebuild")
            .arg("--images")
            .arg(self.path("images"))
            .stdin(std::fs::File::open(receipt).unwrap())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .unwrap()
    }

    fn prebuild(&self, receipt: &Path, images: &Path) -> (Output, Value) {
        let out = self
            .command("cordon-prebuild")
            .arg("--images")
            .arg(images)
            .stdin(std::fs::File::open(receipt).unwrap())
            .output()
            .unwrap();
        let value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("one receipt on stdout ({e}): {out:?}"));
        (out, value)
    }
}

/// The receipt fields every outcome carries: this stage, the authority of its input, and the
/// input as `prev`.
fn common_shape(receipt: &Value, input: &Value, outcome: &str) {
    assert_eq!(receipt["stage"], "prebuild", "{receipt}");
    assert_eq!(receipt["outcome"], outcome, "{receipt}");
    assert_eq!(receipt["authority"], input["authority"], "{receipt}");
    assert!(
        receipt["prev"]
            .as_str()
            .is_some_and(|p| p.starts_with("sha256:")),
        "{receipt}"
    );
}

#[test]
fn each_outcome_has_its_receipt_and_exit_code() {
    let cli = Cli::new(0);
    let images = cli.path("images");
    let receipt = cli.materialized(&workspace_root().join("checks/example/incumbent"));
    let input: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();

    // 0: the example builds; its publication is named.
    let (out, r) = cli.prebuild(&receipt, &images);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    common_shape(&r, &input, "ok");
    assert!(
        r["outputs"]["publication"]
            .as_str()
            .is_some_and(|p| p.starts_with("sha256:")),
        "{r}"
    );
    assert_eq!(r["outputs"]["files"], 1, "{r}");

    // 3: no image to run it in — cordon cannot establish the run.
    let (out, r) = cli.prebuild(&receipt, &cli.path("no-images"));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    common_shape(&r, &input, "no-decision");
    assert_eq!(r["reasons"][0]["code"], "prebuild.infrastructure", "{r}");
    // Named as missing, with how to make it (the help on stderr), never "re-pin".
    let message = r["reasons"][0]["message"].as_str().unwrap();
    assert!(message.contains("no image layout at"), "{message}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cordon-image build"), "{stderr}");
    assert!(!stderr.contains("re-pin"), "{stderr}");

    // 2: a receipt of another authority, with both identities shown; and no receipt at all.
    let mut foreign = input.clone();
    foreign["authority"] = Value::String(Digest::of_bytes(b"other").to_string());
    let foreign_file = cli.path("foreign.json");
    std::fs::write(&foreign_file, foreign.to_string()).unwrap();
    let out = cli
        .command("cordon-prebuild")
        .arg("--images")
        .arg(&images)
        .arg("--receipt")
        .arg(&foreign_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(input["authority"].as_str().unwrap())
            && stderr.contains(foreign["authority"].as_str().unwrap()),
        "both identities: {stderr}"
    );
    let out = cli
        .command("cordon-prebuild")
        .arg("--images")
        .arg(&images)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Chained as the README shows, a candidate fetch rejects ends the pipeline with fetch's exit
/// code under `set -o pipefail`, and the last receipt is prebuild's, rejected, naming the
/// materialize receipt that passed the verdict on, which names fetch's.
#[test]
fn a_pipeline_carries_an_upstream_verdict_to_its_last_receipt_and_exit_code() {
    let cli = Cli::new(2);
    let tree = {
        let out = cli
            .command("cordon-materialize")
            .arg("incumbent")
            .arg(workspace_root().join("checks/example/incumbent"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        r["outputs"]["tree_digest"].as_str().unwrap().to_owned()
    };
    let archive = cli.path("candidate.tar");
    std::fs::write(&archive, b"not the archive the digest names").unwrap();
    let wrong = Digest::of_bytes(b"something else");
    let script = format!(
        "set -o pipefail; {} | {} | {} > {}",
        cli.shell(
            "cordon-fetch",
            &format!("--sha256 {wrong} {}", archive.display())
        ),
        cli.shell("cordon-materialize", &format!("--incumbent {tree}")),
        cli.shell(
            "cordon-prebuild",
            &format!("--images {}", cli.path("images").display())
        ),
        cli.path("last.json").display()
    );
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let last: Value =
        serde_json::from_slice(&std::fs::read(cli.path("last.json")).unwrap()).unwrap();
    assert_eq!(last["stage"], "prebuild", "{last}");
    assert_eq!(last["outcome"], "rejected", "{last}");
    assert_eq!(last["reasons"][0]["code"], "stage.upstream", "{last}");
    assert!(
        last["reasons"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("materialize")),
        "{last}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cordon-materialize: rejected upstream (fetch receipt")
            && stderr.contains("cordon-prebuild: rejected upstream (materialize receipt"),
        "{stderr}"
    );
    // Every receipt of the rejected pipeline was stored and signed: its last one verifies.
    let verified = Command::new(bin("cordon-verify"))
        .arg("--store")
        .arg(cli.path("store"))
        .arg(cli.path("last.json"))
        .output()
        .unwrap();
    assert_eq!(verified.status.code(), Some(0), "{verified:?}");

    // A `rejected` materialize receipt written by hand (the store never held it) is refused
    // like any forged input: exit 2, and no receipt.
    let mut forged = last.clone();
    forged["stage"] = "materialize".into();
    forged["started_at"] = "2026-01-01T00:00:00.000Z".into();
    let forged_file = cli.path("forged.json");
    std::fs::write(&forged_file, forged.to_string()).unwrap();
    let out = cli
        .command("cordon-prebuild")
        .arg("--images")
        .arg(cli.path("images"))
        .arg("--receipt")
        .arg(&forged_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cordon::chain::missing"),
        "{out:?}"
    );
}

#[test]
fn a_build_step_that_fails_is_a_rejection_with_exit_1() {
    let cli = Cli::new(1);
    let incumbent = cli.path("incumbent");
    cordon_testkit::copy_tree(
        &workspace_root().join("checks/example/incumbent"),
        &incumbent,
    );
    // Its last words try to drive the operator's terminal: clear it, fake a pass, retitle it.
    let build = "#!/bin/sh\necho compiling\ni=1; while [ $i -le 20 ]; do echo \"warning $i\" >&2; i=$((i+1)); done\n\
                 printf '\\033[2J\\033[32mall checks passed\\033]0;owned\\007\\n' >&2\nexit 7\n";
    std::fs::write(incumbent.join("build.sh"), build).unwrap();
    let receipt = cli.materialized_as(&incumbent, "native-rebuild");
    let input: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    let store = cordon::store::Store::open(&cli.path("store")).unwrap();
    let before = store.content_listing().unwrap();
    let (out, r) = cli.prebuild(&receipt, &cli.path("images"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    common_shape(&r, &input, "rejected");
    assert_eq!(r["reasons"][0]["code"], "prebuild.exit", "{r}");
    // Worded for people, not Rust's debug form.
    assert_eq!(
        r["reasons"][0]["message"], "the build step exited with code 7",
        "{r}"
    );
    // Its output and the host's records of the run are kept as evidence the receipt names;
    // the stored stderr is the build's, byte for byte.
    let evidence = |name: &str| -> Vec<u8> {
        let named = r["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name);
        let sha: cordon::Digest = named.unwrap_or_else(|| panic!("no {name}: {r}"))["sha256"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        store.read_evidence(&sha).unwrap()
    };
    let log = String::from_utf8(evidence("stderr")).unwrap();
    assert!(
        log.starts_with("warning 1\n") && log.contains("\u{1b}[2J"),
        "{log:?}"
    );
    assert_eq!(evidence("stdout"), b"compiling\n");
    for name in ["bundle", "lease-record", "runtime-state", "cgroup-events"] {
        assert!(!evidence(name).is_empty(), "{name}");
    }
    // The container's mount table as the kernel listed it at create: its root and /proc.
    let mounts = String::from_utf8(evidence("mountinfo")).unwrap();
    assert!(
        mounts.lines().any(|l| l.split(' ').nth(4) == Some("/proc")),
        "{mounts}"
    );
    // On the operator's terminal: the tail, escaped — nothing of it drives the terminal.
    let said = String::from_utf8(out.stderr.clone()).unwrap();
    assert!(said.contains("the run's stderr ended with"), "{said}");
    assert!(
        said.contains("warning 20\n") && !said.contains("warning 10\n"),
        "{said}"
    );
    assert!(said.contains("\\u{1b}[2J"), "{said}");
    assert!(
        !said.contains('\u{1b}') && !said.contains('\u{7}'),
        "{said:?}"
    );
    // The first run on a fresh store unpacks the pinned image into the verified image cache
    // (`images/<manifest hex>/`: the policy's image, never candidate bytes); nothing else of
    // the store changes, and a second rejection changes nothing at all.
    let after = store.content_listing().unwrap();
    let removed: Vec<&String> = before.iter().filter(|l| !after.contains(l)).collect();
    assert!(removed.is_empty(), "{removed:?}");
    let added: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
    assert!(
        !added.is_empty() && added.iter().all(|l| l.starts_with("images")),
        "{added:?}"
    );
    let (out, _) = cli.prebuild(&receipt, &cli.path("images"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(store.content_listing().unwrap(), after);
}

/// SIGINT, SIGTERM and SIGHUP to `cordon-prebuild` while its build runs (a build that would
/// run for ever): each stops the build, releases the lease (no container, mount, account,
/// cgroup, run directory or lease record left) and ends with exit 3 and a stored no-decision
/// receipt naming the signal.
#[test]
fn a_signal_mid_build_stops_it_and_leaves_a_no_decision_naming_it() {
    let cli = Cli::new(3);
    let receipt = cli.materialized_forever();
    let state_root = Path::new(cordon::lease::DEFAULT_STATE_ROOT).join(&cli.executor);
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        let child = cli.spawn_prebuild(&receipt, std::process::Stdio::piped);
        let id = cordon_testkit::wait_running(&cli.path("store"), &state_root);
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
        let out = child.wait_with_output().unwrap();
        cordon_testkit::assert_stopped_by(
            signal.as_str(),
            &out,
            (&cli.path("store"), &cli.path("run"), &state_root),
            Some(&id),
            ("prebuild-cli", 3),
        );
        // The no-decision names what the host kept of the run before its release.
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let evidence = |name| cordon_testkit::evidence(&cli.path("store"), &r, name);
        let state = String::from_utf8(evidence("runtime-state")).unwrap();
        assert!(state.contains(&id), "{state}");
        let record = String::from_utf8(evidence("lease-record")).unwrap();
        assert!(record.contains(&id), "{record}");
        assert!(!evidence("cgroup-events").is_empty());
    }
}

/// A SIGKILLed `cordon-prebuild` handles nothing, and nothing else runs after it: its lease's
/// watchdog sees it gone and ends the build's container at once (the run directory marked as
/// ended from outside), then exits. What the lease still holds runs no process; `cordon-reap`
/// releases it and the quiescence check finds nothing.
#[test]
fn a_sigkilled_supervisors_container_is_ended_by_its_lease_watchdog() {
    let cli = Cli::new(4);
    let receipt = cli.materialized_forever();
    let (store, run_root) = (cli.path("store"), cli.path("run"));
    let state_root = Path::new(cordon::lease::DEFAULT_STATE_ROOT).join(&cli.executor);
    let mut child = cli.spawn_prebuild(&receipt, std::process::Stdio::null);
    let id = cordon_testkit::wait_running(&store, &state_root);
    assert_eq!(
        cordon_testkit::watchdogs_of(&store).len(),
        1,
        "one watchdog for the one lease"
    );
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "killed, not exited");
    let runtime_state = || {
        Command::new(cordon_testkit::test_runtime().1)
            .arg("--root")
            .arg(&state_root)
            .args(["state", &id])
            .output()
            .unwrap()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = runtime_state();
        let state: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if state["status"] == "stopped" {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the container still runs 10 s after its supervisor died: {out:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let records = cordon_testkit::lease_records(&store);
    assert_eq!(records.len(), 1, "the lease was never released");
    let run_dir = records[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "run-dir")
        .and_then(|r| r["path"].as_str())
        .map(PathBuf::from)
        .unwrap();
    assert!(
        run_dir.join(cordon::lease::ENDED_BY_REAP).exists(),
        "the watchdog marks the run ended from outside"
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cordon_testkit::watchdogs_of(&store).is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "the watchdog outlived its work"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let reaped = cli.command("cordon-reap").output().unwrap();
    assert_eq!(reaped.status.code(), Some(0), "{reaped:?}");
    let checked = cli.command("cordon-reap").arg("--check").output().unwrap();
    assert_eq!(checked.status.code(), Some(0), "{checked:?}");
    cordon_testkit::assert_left_nothing(
        (&store, &run_root, &state_root),
        Some(&id),
        ("prebuild-cli", 4),
    );
}

/// Seed 001's checklist, step 7: a candidate whose run ended in an incident is refused under
/// the same authority before any lease is taken, naming the incident's receipt; nothing is
/// built and nothing of a run is left.
#[test]
fn a_candidate_with_an_incident_under_this_authority_is_not_run_again() {
    use cordon::lease::incident::{self, Incident};
    let cli = Cli::new(5);
    let receipt = cli.materialized(&workspace_root().join("checks/example/incumbent"));
    let input: Value = serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    let authority = input["authority"].as_str().unwrap();
    let tree: Digest = input["outputs"]["tree_digest"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // An earlier run's incident, as a release that left residue records it.
    let store = cordon::store::Store::open(&cli.path("store")).unwrap();
    let key = incident::key(authority, &tree).unwrap();
    let earlier = Incident {
        authority: authority.to_owned(),
        candidate: tree,
        cause: incident::Cause::Residue,
        why: "container cordon-0123 could not be proven absent".into(),
        lease: "0123".into(),
        quarantine: "0123456789abcdef".into(),
        reporter: cordon::lease::Supervisor {
            pid: 1,
            start_ticks: 1,
        },
        at: "2026-12-03T00:00:00.000Z".into(),
    };
    store
        .put_document(
            incident::INCIDENTS,
            &format!("{key}.json"),
            cordon::canonical::to_canonical_json(&earlier)
                .unwrap()
                .as_bytes(),
        )
        .unwrap();
    let reported = Digest::of_bytes(b"the incident's receipt");
    store
        .put_document(
            incident::INCIDENTS,
            &format!("{key}.receipt"),
            reported.to_string().as_bytes(),
        )
        .unwrap();

    let (out, r) = cli.prebuild(&receipt, &cli.path("images"));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    common_shape(&r, &input, "no-decision");
    let reason = r["reasons"][0]["message"].as_str().unwrap();
    assert!(
        reason.contains(&format!("candidate {tree} ended in an incident"))
            && reason.contains(&format!("receipt {reported}")),
        "{r}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a new authority identity"),
        "{out:?}"
    );
    // No lease was taken, nothing was published.
    for section in ["leases", "publications"] {
        let left: Vec<_> = std::fs::read_dir(cli.path("store").join(section))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{section}: {left:?}");
    }
    assert_eq!(
        std::fs::read_dir(cli.path("run")).map_or(0, Iterator::count),
        0
    );
}

/// The bundled examples of the sealed-direct-artifact and dependency-patch tiers
/// (`checks/example/candidate-aot`, `candidate-dep`) through the real binaries: fetched,
/// materialized and built by their tier's registered patcher — the factory (recorded, renamed
/// into the tree's namespace) compiled under the closed ABI with its profile decoded by the
/// prebuild's confined child; the patch applied to the dependency the example incumbent
/// vendors and the patched copy compiled.
#[test]
fn the_bundled_aot_and_dependency_patch_examples_build_through_the_pipeline() {
    let cli = Cli::new(6);
    let incumbent = workspace_root().join("checks/example/incumbent");
    for (example, tier, step, files) in [
        ("candidate-aot", "sealed-direct-artifact", "build-aot", 2),
        ("candidate-dep", "dependency-patch", "build-dependency", 1),
    ] {
        let receipt = cli.materialized_from(&incumbent, example, (tier, tier));
        let (out, r) = cli.prebuild(&receipt, &cli.path("images"));
        assert_eq!(out.status.code(), Some(0), "{example}: {out:?}");
        assert_eq!(r["inputs"]["step"], step);
        assert_eq!(r["outputs"]["files"], files, "{r}");
    }
}

/// crun is gated by its own table: a policy naming crun at runc's binary is refused as not
/// crun before anything exists. A crun that passes it builds, its step behind the start gate:
/// the bundle's argv waits at the gate, and the posture read there — after crun's init has
/// exec'd the entrypoint, so its seccomp filter is installed — is the planned one (filter mode,
/// one filter of the runtime's). Nothing of the executor is left either way.
#[test]
fn crun_is_gated_by_its_own_table_and_its_runs_wait_at_the_start_gate() {
    let crun = Path::new("/usr/bin/crun");
    cordon_testkit::require_executable(crun, "apt-get install -y crun");
    cordon_testkit::require_crun_host();
    let cli = Cli::new(7);
    let policy = cli.path("policy.kdl");
    let reviewed = std::fs::read_to_string(&policy).unwrap();
    let line = reviewed
        .lines()
        .find(|l| l.starts_with("runtime "))
        .unwrap()
        .to_owned();
    let state = Path::new(cordon::lease::DEFAULT_STATE_ROOT).join(&cli.executor);
    let nothing_left = |named: &str| {
        assert!(
            std::fs::read_dir(&state).map_or(true, |mut d| d.next().is_none()),
            "{named}: a container is left"
        );
        assert!(
            cordon_testkit::lease_records(&cli.path("store")).is_empty(),
            "{named}: a lease is left"
        );
    };
    let named = "runtime \"crun\" path=\"/usr/sbin/runc\"";
    std::fs::write(&policy, reviewed.replace(&line, named)).unwrap();
    let receipt = cli.materialized(&workspace_root().join("checks/example/incumbent"));
    let (out, r) = cli.prebuild(&receipt, &cli.path("images"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{named}: {out:?}");
    assert_eq!(r["outcome"], "no-decision", "{r}");
    assert!(
        stderr.contains("cordon::runtime::not_named") && stderr.contains("does not say it is crun"),
        "{named}: {stderr}"
    );
    nothing_left(named);

    let named = "runtime \"crun\" path=\"/usr/bin/crun\"";
    std::fs::write(&policy, reviewed.replace(&line, named)).unwrap();
    let receipt = cli.materialized(&workspace_root().join("checks/example/incumbent"));
    let (out, r) = cli.prebuild(&receipt, &cli.path("images"));
    assert_eq!(out.status.code(), Some(0), "{named}: {out:?}");
    let evidence = |name| cordon_testkit::evidence(&cli.path("store"), &r, name);
    let bundle: Value = serde_json::from_slice(&evidence("bundle")).unwrap();
    let argv = bundle["process"]["args"].as_array().unwrap();
    assert_eq!(argv[..2], [json!("/bin/sh"), json!("-c")], "{bundle}");
    assert!(
        argv[2]
            .as_str()
            .unwrap()
            .starts_with("read -r cordon_gate < /dev/.cordon-gate || exit 70;"),
        "{bundle}"
    );
    let posture: Value = serde_json::from_slice(&evidence("posture")).unwrap();
    assert_eq!(posture["seccomp"], json!([2, 1]), "{posture}");
    assert_eq!(posture["no_new_privs"], json!(true), "{posture}");
    nothing_left(named);
}
