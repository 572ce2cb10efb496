//! Dev-only helpers shared by every cordon crate's tests.
//!
//! Tests that need something from the host (a runtime binary, root) call a `require_*` helper,
//! which fails the test with what is missing and how to install it: a test that cannot run its
//! real check never passes silently.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

pub mod blind;
pub mod pty;

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

/// Fail the test unless it runs as root; `why` says what needs it.
///
/// # Panics
/// Not root.
pub fn require_root(why: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{why}: run as root (CI does)"
    );
}

/// Every test crate (and benchmark) that creates real per-run accounts, in one table: each owner
/// gets its own block of ids, so tests running side by side — and the recovery that removes
/// orphans in a range — never meet each other's accounts or the host's (the blocks lie above the
/// default policy's 3000000..=3099999).
const ACCOUNT_OWNERS: [&str; 28] = [
    "cordon-lease",
    "prebuild-hostile",
    "prebuild-bench",
    "reap-container",
    "reap-faults",
    "reap-cli",
    "reap-bench",
    "stage-session",
    "cordon-confine",
    "fetch",
    "materialize",
    "fetch-bench",
    "stage-ablation",
    "stage-faults",
    "prebuild-cli",
    "lane-session",
    "lane-bench",
    "lane-qualify",
    "reference",
    "stage-sigint",
    "stage-sigterm",
    "stage-sighup",
    "signals-cli",
    "stage-seccomp",
    "lane-ablation",
    "lane-gpu",
    "lane-members",
    "prebuild-tiers",
];

/// The first id of the account blocks.
const ACCOUNT_BASE: u32 = 3_100_000;

/// The inclusive id range (1000 ids) of slot `slot` (0..10) of `owner`'s block: the one
/// account-range allocator for every test crate.
///
/// # Panics
/// An owner not in the table, or a slot past 9: add the owner to `ACCOUNT_OWNERS`.
#[must_use]
pub fn account_range(owner: &str, slot: u32) -> (u32, u32) {
    let index = ACCOUNT_OWNERS
        .iter()
        .position(|o| *o == owner)
        .unwrap_or_else(|| panic!("{owner:?} is not in testkit's ACCOUNT_OWNERS"));
    assert!(slot < 10, "account slots are 0..10, not {slot}");
    let first = ACCOUNT_BASE + u32::try_from(index).unwrap() * 10_000 + slot * 1000;
    (first, first + 999)
}

/// The default policy's text with the reference stage's `gpu "none"` replaced by the three
/// NVIDIA nodes a GPU host would list: what the device-planning tests plan (the shipped policy
/// has no device until the lanes take theirs from a CDI spec).
#[must_use]
pub fn with_reference_gpus(text: &str) -> String {
    replace_once(
        text,
        "reason=\"the reference session's GPU\"; … }\n    gpu \"none\"",
        "reason=\"the reference session's GPU\"; … }\n    gpu {\n        device \"/dev/nvidia0\" reason=\"the reference session's GPU, assigned by the host\"\n        device \"/dev/nvidiactl\" reason=\"NVIDIA control node the user-space driver opens\"\n        device \"/dev/nvidia-uvm\" reason=\"unified memory, required by CUDA contexts\"\n    }",
    )
}

/// The UUIDs [`with_gpu_lanes`] gives lanes `a` and `b`.
pub const LANE_GPUS: [&str; 2] = [
    "GPU-0e3f6a52-1111-4c2c-9d41-000000000001",
    "GPU-0e3f6a52-1111-4c2c-9d41-000000000002",
];

/// A CDI spec as `nvidia-ctk cdi generate --format=json --device-name-strategy=uuid` writes
/// one, for [`LANE_GPUS`]: each GPU's nodes, and the common nodes, variable, library bind
/// and ld-cache hook.
#[must_use]
pub fn cdi_spec() -> String {
    let [a, b] = LANE_GPUS;
    format!(
        r#"{{
  "cdiVersion": "0.5.0",
  "kind": "nvidia.com/gpu",
  "devices": [
    {{
      "name": "{a}",
      "containerEdits": {{
        "deviceNodes": [{{"path": "/dev/nvidia0"}}, {{"path": "/dev/dri/card1"}}]
      }}
    }},
    {{
      "name": "{b}",
      "containerEdits": {{"deviceNodes": [{{"path": "/dev/nvidia1"}}, {{"path": "/dev/dri/card2"}}]}}
    }}
  ],
  "containerEdits": {{
    "env": ["NVIDIA_VISIBLE_DEVICES=void"],
    "deviceNodes": [{{"path": "/dev/nvidiactl"}}, {{"path": "/dev/nvidia-uvm", "permissions": "rw"}}],
    "mounts": [{{
      "hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
      "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
      "options": ["ro", "nosuid", "nodev", "bind"]
    }}],
    "hooks": [{{
      "hookName": "createContainer",
      "path": "/usr/bin/nvidia-cdi-hook",
      "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]
    }}]
  }}
}}"#
    )
}

/// The shipped policy `text` with one GPU on each physical lane, pinned as
/// `cordon_evidence::examples::device_config` (an H100's usual configuration), and a device
/// guard: 3 idle samples 100 ms apart within 2 s, `hw-slowdown` forbidden while measured, the
/// NVIDIA CDI hook allowed.
#[must_use]
pub fn with_gpu_lanes(text: &str) -> String {
    let pin = |uuid: &str| {
        format!(
            " {{\n    gpu \"{uuid}\" {{\n        driver \"550.54.15\"\n        persistence #true\n        compute-mode \"exclusive-process\"\n        application-clocks graphics=1980 memory=2619\n        power-limit \"700W\"\n        ecc #true\n        mig #false\n    }}\n}}"
        )
    };
    let lane = |name: &str, cpu: &str| {
        format!("physical-lane \"{name}\" cpuset=\"{cpu}\" cpu-shares=262144")
    };
    let text = replace_once(
        text,
        &lane("a", "0"),
        &format!("{}{}", lane("a", "0"), pin(LANE_GPUS[0])),
    );
    replace_once(
        &text,
        &lane("b", "1"),
        &format!(
            "{}{}\ndevice-guard {{\n    drain samples=3 interval=\"100ms\" sample-timeout=\"50ms\" timeout=\"2s\" idle-memory=\"600MiB\"\n    envelope \"hw-slowdown\" max-temperature=85 max-power=\"700W\" min-graphics-clock=1700\n    cdi-hook \"/usr/bin/nvidia-cdi-hook\" reason=\"updates the container's linker cache for the driver's libraries\"\n}}",
            lane("b", "1"),
            pin(LANE_GPUS[1])
        ),
    )
}

/// The policy `text` with `syscall` taken out of its seccomp allow-list, so that a test can give
/// the call a rule of its own (a profile has one entry per syscall). An `allow` node that names
/// only this call goes whole; a call the list does not name leaves `text` as it is.
///
/// # Panics
/// The call is named more than once.
#[must_use]
pub fn unlisted(text: &str, syscall: &str) -> String {
    let token = format!("\"{syscall}\"");
    let alone = format!("    allow {token} reason=");
    if let Some(start) = text.find(&alone) {
        let end = start + text[start..].find('\n').unwrap() + 1;
        return format!("{}{}", &text[..start], &text[end..]);
    }
    match text.matches(&format!("{token} ")).count() {
        0 => text.to_owned(),
        _ => replace_once(text, &format!("{token} "), ""),
    }
}

/// `text` with exactly one occurrence of `from` replaced by `to`. A policy edit whose pattern
/// no longer matches fails the test, instead of silently testing the unedited policy.
///
/// # Panics
/// `from` occurs zero or several times.
#[must_use]
pub fn replace_once(text: &str, from: &str, to: &str) -> String {
    let n = text.matches(from).count();
    assert_eq!(
        n, 1,
        "the edit pattern {from:?} occurs {n} times, expected once"
    );
    text.replacen(from, to, 1)
}

/// The default policy's text with its per-run account range moved to `range`, its cron/at
/// deny files and its models root (`models`) into `dir`, and [`this_hosts_block`] for its host
/// rules.
#[must_use]
pub fn isolated_policy(dir: &Path, (first, last): (u32, u32)) -> String {
    let text = on_this_host(
        &std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap(),
    );
    let quoted = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    let text = replace_once(
        &text,
        "uid-range 3000000 3099999",
        &format!("uid-range {first} {last}"),
    );
    let text = replace_once(
        &text,
        "gid-range 3000000 3099999",
        &format!("gid-range {first} {last}"),
    );
    let text = replace_once(&text, "\"/etc/cron.deny\"", &quoted("cron.deny"));
    let text = replace_once(
        &text,
        "models \"/var/lib/cordon/models\"",
        &format!("models {}", quoted("models")),
    );
    replace_once(&text, "\"/etc/at.deny\"", &quoted("at.deny"))
}

/// Register the model directory `src` in the models root `root` (made 0755 if missing): moved
/// to `<root>/sha256-<hex>` of its digest, as the lane requires. Returns the registered path.
#[must_use]
pub fn register_model(src: &Path, root: &Path, digest: &str) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)
        .unwrap();
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let at = root.join(format!("sha256-{hex}"));
    std::fs::rename(src, &at).unwrap();
    at
}

/// The shipped policy's `host { … }` block, whole: the host rules the demo host meets.
#[must_use]
pub fn shipped_host_block() -> String {
    let text = std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap();
    let start = text
        .find("\nhost {\n")
        .expect("policy/evaluator.kdl has a host block")
        + 1;
    let end = start + text[start..].find("\n}\n").unwrap() + 3;
    text[start..end].to_owned()
}

/// A host block for the machine the tests run on: the shipped memory reserve, and every
/// side-channel rule allowed, each vulnerability the kernel lists accepted, with a reason
/// saying why. The tests that run candidates contain and measure them; the host rules are
/// tested apart (`cordon-stage`'s `host_fit` and session tests), so these run on whatever CPU
/// CI is given rather than only on the demo host's.
#[must_use]
pub fn this_hosts_block() -> String {
    let shipped = shipped_host_block();
    let reserve = shipped
        .lines()
        .find(|l| l.trim_start().starts_with("memory-reserve "))
        .expect("the shipped host block names its memory reserve");
    let why = "reason=\"the test machine's own: host rules are tested apart\"";
    let mut block = format!(
        "host {{\n{reserve}\n    hypervisor \"on\" {why}\n    smt \"on\" {why}\n    unprivileged-bpf \"on\" {why}\n"
    );
    let dir = Path::new("/sys/devices/system/cpu/vulnerabilities");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for name in names {
        block.push_str(&format!("    accept-vulnerable {name:?} {why}\n"));
    }
    block.push_str("}\n");
    block
}

/// `text` (a policy with the shipped host block) with [`this_hosts_block`] in its place and
/// [`with_test_runtime`] applied.
fn on_this_host(text: &str) -> String {
    let shipped = shipped_host_block();
    with_test_runtime(&replace_once(text, &shipped, &this_hosts_block()))
}

/// The OCI runtime the container tests run under: `CORDON_TEST_RUNTIME` (`runc`, the default,
/// at [`runc`]'s path; `crun`; `runsc`) at its usual path, or at `CORDON_TEST_RUNTIME_PATH`.
/// Its name and path: a test that builds a lease setup itself takes the binary from here, so
/// that it drives the runtime its policy names.
///
/// # Panics
/// Another name, or the requested runtime is not installed: the message says what to install.
#[must_use]
pub fn test_runtime() -> (&'static str, PathBuf) {
    let name = std::env::var("CORDON_TEST_RUNTIME").unwrap_or_else(|_| "runc".into());
    let (name, default, install): (&'static str, &str, &str) = match name.as_str() {
        "runc" => ("runc", "/usr/sbin/runc", "apt-get install -y runc"),
        "crun" => ("crun", "/usr/bin/crun", "apt-get install -y crun"),
        "runsc" => (
            "runsc",
            "/usr/local/bin/runsc",
            "gVisor's runsc (https://gvisor.dev/docs/user_guide/install/), or name it with CORDON_TEST_RUNTIME_PATH",
        ),
        other => panic!("CORDON_TEST_RUNTIME={other:?}: runc, crun or runsc"),
    };
    let path = std::env::var_os("CORDON_TEST_RUNTIME_PATH").map_or_else(
        || {
            if name == "runc" {
                runc()
            } else {
                default.into()
            }
        },
        PathBuf::from,
    );
    require_executable(&path, &format!("CORDON_TEST_RUNTIME={name} ({install})"));
    if name == "crun" {
        require_crun_host();
    }
    (name, path)
}

/// crun creates containers on this host: it refuses a hybrid cgroup layout whose v2 hierarchy
/// holds a controller ("cgroups in hybrid mode not supported"), as systemd's hybrid layout
/// leaves one that is not mounted as v1 (`hugetlb` on Debian's cloud kernels).
///
/// # Panics
/// This host's v2 hierarchy holds controllers beside v1 ones: names them and what clears them.
pub fn require_crun_host() {
    let unified = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    let Ok(held) = std::fs::read_to_string(unified) else {
        // No hybrid layout: v1 alone, or v2 alone (whose root is `/sys/fs/cgroup`).
        return;
    };
    assert!(
        held.trim().is_empty(),
        "crun refuses this hybrid cgroup host: its v2 hierarchy holds {:?}; \
         `bash checks/crun-host.sh` mounts each as v1 (what checks/test.sh does), or run on a \
         v2-only host",
        held.trim()
    );
}

/// `text` (a policy whose runtime is `runc` at `/usr/sbin/runc`) with its runtime line for
/// [`test_runtime`]: the policy's `min-version` kept for runc, dropped for crun (its own floor
/// holds), and for runsc set to the installed release (cordon keeps no floor for runsc; the
/// tests accept the one they run).
///
/// # Panics
/// The policy names another runtime, or the runtime cannot be run.
#[must_use]
pub fn with_test_runtime(text: &str) -> String {
    let (name, path) = test_runtime();
    if name == "runc" && path == Path::new("/usr/sbin/runc") {
        return text.to_owned();
    }
    let line = text
        .lines()
        .find(|l| l.starts_with("runtime \"runc\" path=\"/usr/sbin/runc\""))
        .expect("the policy's runtime is runc at /usr/sbin/runc")
        .to_owned();
    let min = match name {
        "runc" => line
            .split_once(" min-version=")
            .map(|(_, m)| format!(" min-version={m}"))
            .unwrap_or_default(),
        "runsc" => {
            let out = std::process::Command::new(&path)
                .arg("--version")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let release = text
                .split_whitespace()
                .find_map(|w| w.strip_prefix("release-"))
                .unwrap_or_else(|| panic!("{} --version names no release: {text}", path.display()));
            let (date, n) = release.split_once('.').unwrap_or((release, "0"));
            format!(" min-version=\"{date}.{n}.0\"")
        }
        _ => String::new(),
    };
    replace_once(
        text,
        &line,
        &format!(
            "runtime \"{name}\" path={:?}{min}",
            path.display().to_string()
        ),
    )
}

/// The minimal example policy's text (`policy/examples/minimal.kdl`) with its per-run account
/// range moved to `range`, its cron/at deny files into `dir`, and [`this_hosts_block`] (the
/// minimal one's host rules are the strictest, which a test machine need not meet).
#[must_use]
pub fn isolated_minimal_policy(dir: &Path, (first, last): (u32, u32)) -> String {
    let text =
        std::fs::read_to_string(workspace_root().join("policy/examples/minimal.kdl")).unwrap();
    let text = format!("{text}{}", this_hosts_block());
    let quoted = |name: &str| format!("{:?}", dir.join(name).display().to_string());
    replace_once(
        &text,
        "    uid-range 3000000 3099999\n    gid-range 3000000 3099999\n",
        &format!(
            "    uid-range {first} {last}\n    gid-range {first} {last}\n    cron-deny {}\n    at-deny {}\n",
            quoted("cron.deny"),
            quoted("at.deny")
        ),
    )
}

/// A host tool the tests run, from the environment variable `var` (default `default`), which
/// must be an executable file: the test fails saying how to install it otherwise.
#[must_use]
pub fn tool(var: &str, default: &str, install: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    require_executable(&path, install);
    path
}

/// A cordon stage binary to start as a lease's watchdog in a test whose supervisor is the test
/// itself (`cordon-reap`, built beside the test binary: `cargo nextest run --workspace` builds
/// every binary). The test fails naming what is missing otherwise.
#[must_use]
pub fn watchdog() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/cordon-reap
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("cordon-reap"))
        .unwrap();
    require_executable(
        &path,
        "cargo build --workspace (cargo nextest run --workspace does)",
    );
    path
}

/// How many times slower than this project's CI machine the host runs the tests
/// (`CORDON_TEST_SLOWDOWN`, default 1): `checks/cgroup2-vm.sh` sets it for its emulated guest.
/// Only a stage's whole deadline, which also counts the stage's start, is scaled by it; the
/// bounds a test probes (a child's deadline, memory, pids, CPU) never are.
///
/// # Panics
/// The variable is set to anything but a whole number from 1 to 100.
#[must_use]
pub fn slowdown() -> u64 {
    match std::env::var("CORDON_TEST_SLOWDOWN") {
        Err(_) => 1,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|k| (1..=100).contains(k))
            .unwrap_or_else(|| panic!("CORDON_TEST_SLOWDOWN={v:?}: a whole number from 1 to 100")),
    }
}

/// The OCI runtime the tests drive (`CORDON_TEST_RUNC`, default `/usr/sbin/runc`).
#[must_use]
pub fn runc() -> PathBuf {
    tool(
        "CORDON_TEST_RUNC",
        "/usr/sbin/runc",
        "apt-get install -y runc",
    )
}

/// A candidate delta directory packed as a submitter publishes it: a deterministic ustar of its
/// manifest and `engine` tree (the demo's `tar` line). The archive's bytes.
#[must_use]
pub fn pack_delta(dir: &Path) -> Vec<u8> {
    let out = std::process::Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .args(["--mtime=@0", "--format=ustar", "-C"])
        .arg(dir)
        .args(["-cf", "-", "cordon-delta.kdl", "engine"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tar: {out:?}");
    out.stdout
}

/// The static busybox the test images copy (`CORDON_TEST_BUSYBOX`, default `/bin/busybox`).
#[must_use]
pub fn busybox() -> PathBuf {
    tool(
        "CORDON_TEST_BUSYBOX",
        "/bin/busybox",
        "apt-get install -y busybox-static",
    )
}

/// One bare `runc run` of `bundle` as container `id` under `state_root`, stdio to /dev/null,
/// timed: the baseline the container benchmarks print their ratios against.
#[must_use]
pub fn bare_runc_run(state_root: &Path, bundle: &Path, id: &str) -> std::time::Duration {
    use std::process::{Command, Stdio};
    let t = std::time::Instant::now();
    let status = Command::new(runc())
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

/// Compile the C program `source` statically on the host into `dir/name`: the probes tests
/// place inside containers (no library of the image is needed, and the probe does exactly the
/// system calls it names).
///
/// # Panics
/// gcc or the static C library is missing, or the program does not compile.
#[must_use]
pub fn compile_static(dir: &Path, name: &str, source: &str) -> PathBuf {
    require_executable(
        Path::new("/usr/bin/gcc"),
        "apt-get install -y gcc libc6-dev",
    );
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let bin = dir.join(name);
    let out = std::process::Command::new("gcc")
        .args(["-static", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cannot build the probe {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = std::fs::read(&bin).unwrap();
    assert!(
        head.starts_with(b"\x7fELF"),
        "{} is not an ELF",
        bin.display()
    );
    bin
}

/// The attempt program (`probes/attempt.c`), compiled statically into `dir/attempt`: one
/// attempt per invocation (`attempt NAME ARGS…` prints `NAME=ok` or `NAME=blocked:WHY`), the
/// probe the ablation suite and the hostile tests place inside containers.
#[must_use]
pub fn attempt_program(dir: &Path) -> PathBuf {
    compile_static(dir, "attempt", include_str!("../probes/attempt.c"))
}

/// The seccomp verdict program (`probes/verdict.c`), compiled statically into `dir/verdict`:
/// `verdict FILE` prints the kernel's answer to each system call listed in FILE without
/// running any of them (admitted calls get errno 4000), the probe of the differential seccomp
/// test.
#[must_use]
pub fn verdict_program(dir: &Path) -> PathBuf {
    compile_static(dir, "verdict", include_str!("../probes/verdict.c"))
}

/// The mount of a bundle's `config.json` at `destination`, for a test's rewrite of it (an
/// ablation).
///
/// # Panics
/// The bundle plans no mount there.
pub fn mount_mut<'a>(
    config: &'a mut serde_json::Value,
    destination: &str,
) -> &'a mut serde_json::Value {
    config["mounts"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|m| m["destination"] == destination)
        .unwrap_or_else(|| panic!("no {destination} mount planned"))
}

/// The median of some durations.
#[must_use]
pub fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// [`replace_once`] as a method, for chains of policy edits.
pub trait EditOnce {
    /// `self` with exactly one occurrence of `from` replaced by `to`.
    ///
    /// # Panics
    /// `from` occurs zero or several times.
    #[must_use]
    fn replace_once(&self, from: &str, to: &str) -> String;
}

impl EditOnce for str {
    fn replace_once(&self, from: &str, to: &str) -> String {
        replace_once(self, from, to)
    }
}

/// Copy the directory tree `from` into `to` (created), files and directories only: what a
/// session's lease-own copy of a store tree holds, for tests and benchmarks that write bundles
/// without a session.
///
/// # Panics
/// Any step failed.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

/// A lease budget of an hour: for tests whose runs must not expire while they look.
#[must_use]
pub fn in_an_hour() -> std::time::Duration {
    std::time::Duration::from_secs(3600)
}

/// The digest `policy/evaluator.kdl` pins on the top-level line starting with `node` (`image
/// "runtime"`, `worker`), as written (`sha256:…`).
#[must_use]
pub fn policy_pin(node: &str) -> String {
    let text = std::fs::read_to_string(workspace_root().join("policy/evaluator.kdl")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{node} digest=")))
        .unwrap_or_else(|| panic!("policy/evaluator.kdl pins no {node}"));
    line.split("digest=\"")
        .nth(1)
        .unwrap()
        .trim_end_matches('"')
        .to_owned()
}

/// The prebuild image's spec (`images/prebuild.kdl`) with every source it names in place:
/// fetched and verified by `images/fetch-sources.sh` (the files `images/sources.json` pins).
///
/// # Panics
/// A source cannot be fetched: the message names it and where it was looked for.
#[must_use]
pub fn prebuild_image_spec() -> PathBuf {
    image_sources();
    workspace_root().join("images/prebuild.kdl")
}

/// Fetch the pinned images' sources (`images/fetch-sources.sh`: `images/sources.json`'s files,
/// verified by sha256, from Debian's pool or snapshot archive and PyPI, or `CORDON_SOURCES`).
///
/// # Panics
/// A source is served nowhere with its pinned bytes: the message names it and the re-pin path.
pub fn image_sources() {
    image_script(
        "images/fetch-sources.sh",
        "could not fetch a pinned source of the images (or set CORDON_SOURCES to a directory of copies)",
    );
}

/// The prebuild image's layout at `out` (made; it must not exist): built by `build` (given a
/// fresh directory) once per content of the spec and every source it names, kept under
/// `target/test-images/<sha256 of that content>` and copied from there afterwards. Every test
/// environment gets the same bytes without compressing ~18 MB again (~2.5 s in a dev build);
/// the stages verify the layout against their pin at every use as always, and the image tests
/// still build it themselves.
///
/// # Panics
/// A source is missing, or the cache cannot be written.
pub fn prebuild_layout(out: &Path, build: impl FnOnce(&Path)) {
    use sha2::Digest as _;
    let spec = prebuild_image_spec();
    let text = std::fs::read_to_string(&spec).unwrap();
    let mut key = sha2::Sha256::new();
    key.update(text.as_bytes());
    for from in text.split("from=\"").skip(1) {
        let from = from.split('"').next().unwrap();
        let path = spec.parent().unwrap().join(from);
        key.update(from.as_bytes());
        key.update(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    }
    let root = workspace_root().join("target/test-images");
    let cached = root.join(hex::encode(key.finalize()));
    if !cached.is_dir() {
        let fresh = root.join(format!(".building-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&fresh);
        std::fs::create_dir_all(&root).unwrap();
        build(&fresh);
        // Another test may have won the race: its layout has the same bytes.
        if std::fs::rename(&fresh, &cached).is_err() {
            assert!(cached.is_dir(), "cannot keep {}", cached.display());
            std::fs::remove_dir_all(&fresh).unwrap();
        }
    }
    assert!(!out.exists(), "{} exists", out.display());
    copy_tree(&cached, out);
}

/// Build the runtime image's worker as `images/build-worker.sh` does (static, path-remapped:
/// the bytes the pinned runtime image holds) and return its path, with the rest of the runtime
/// image's sources fetched ([`image_sources`]).
#[must_use]
pub fn runtime_image_inputs() -> PathBuf {
    image_sources();
    image_script("images/build-worker.sh", "failed")
}

/// Run the checkout's image input script `script` (a path from the workspace root) with bash
/// and return the path it prints; the test fails with `what` and its stderr if it fails.
fn image_script(script: &str, what: &str) -> PathBuf {
    let out = std::process::Command::new("bash")
        .arg(workspace_root().join(script))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Nothing of `owner`'s account slot `slot` is left in the host's account databases.
///
/// # Panics
/// An account or group of the slot is left, or a database cannot be read.
pub fn assert_no_accounts(owner: &str, slot: u32) {
    let (first, last) = account_range(owner, slot);
    for db in ["/etc/passwd", "/etc/group"] {
        let text = std::fs::read_to_string(db).unwrap();
        for line in text.lines() {
            let id: u32 = line.split(':').nth(2).unwrap().parse().unwrap();
            assert!(!(first..=last).contains(&id), "{db} still has {line}");
        }
    }
}

/// The lease records in `store` (`<store>/leases/*.json`), parsed.
///
/// # Panics
/// The directory or a record cannot be read or parsed.
#[must_use]
pub fn lease_records(store: &Path) -> Vec<serde_json::Value> {
    let Ok(entries) = std::fs::read_dir(store.join("leases")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap())
        .collect()
}

/// Whether a runtime's `list -f json` output names a running container: parsed, not matched as
/// text (runc writes it compact, crun spaced).
#[must_use]
pub fn lists_running(list: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(list)
        .ok()
        .and_then(|v| {
            v.as_array()
                .map(|l| l.iter().any(|c| c["status"] == "running"))
        })
        .unwrap_or(false)
}

/// Wait (up to a minute) until a container that a lease record of `store` names is running in
/// the runtime state root `state_root`; its id.
///
/// # Panics
/// None runs within the minute.
#[must_use]
pub fn wait_running(store: &Path, state_root: &Path) -> String {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        for record in lease_records(store) {
            let ids = record["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["kind"] == "container")
                .filter_map(|r| r["id"].as_str().map(str::to_owned));
            for id in ids {
                let out = std::process::Command::new(test_runtime().1)
                    .arg("--root")
                    .arg(state_root)
                    .args(["state", &id])
                    .output()
                    .unwrap();
                let state: serde_json::Value =
                    serde_json::from_slice(&out.stdout).unwrap_or_default();
                if state["status"] == "running" {
                    return id;
                }
            }
        }
        assert!(
            std::time::Instant::now() < until,
            "no container of {} ran",
            store.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A stage stopped by `signal` left nothing: its output is exit 3 with one stored no-decision
/// receipt naming the signal, and [`assert_left_nothing`] holds.
///
/// # Panics
/// Any of it does not hold.
pub fn assert_stopped_by(
    signal: &str,
    out: &std::process::Output,
    (store, run_root, state_root): (&Path, &Path, &Path),
    id: Option<&str>,
    (owner, slot): (&str, u32),
) {
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let receipt: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("one receipt on stdout ({e}): {out:?}"));
    assert_eq!(receipt["outcome"], "no-decision", "{receipt}");
    assert_eq!(
        receipt["reasons"][0]["code"], "receipt.interrupted",
        "{receipt}"
    );
    let message = receipt["reasons"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{signal} received")),
        "{message}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("{signal} received")),
        "{out:?}"
    );
    let stored = std::fs::read_dir(store.join("receipts"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .any(|e| {
            serde_json::from_slice::<serde_json::Value>(&std::fs::read(e.path()).unwrap())
                .is_ok_and(|r| r == receipt)
        });
    assert!(stored, "the printed receipt is stored");
    assert_left_nothing((store, run_root, state_root), id, (owner, slot));
}

/// The bytes of the evidence `name` that `receipt` names, read from `store`'s `evidence/` and
/// checked against their digest.
///
/// # Panics
/// The receipt names no such evidence, or the store does not hold its bytes.
#[must_use]
pub fn evidence(store: &Path, receipt: &serde_json::Value, name: &str) -> Vec<u8> {
    let named = receipt["evidence"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["name"] == name))
        .unwrap_or_else(|| panic!("the receipt names no {name} evidence: {receipt}"));
    let hex = named["sha256"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:");
    let bytes = std::fs::read(store.join("evidence").join(hex)).unwrap();
    use sha2::Digest as _;
    assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), hex, "{name}");
    assert_eq!(Some(bytes.len() as u64), named["bytes"].as_u64(), "{name}");
    bytes
}

/// A stage's run left nothing on the host: the store holds no lease record, the run root no
/// run directory, the state root no container `id`, `owner`'s slot `slot` no account, and no
/// lease watchdog of the store is alive.
///
/// # Panics
/// Any of it does not hold.
pub fn assert_left_nothing(
    (store, run_root, state_root): (&Path, &Path, &Path),
    id: Option<&str>,
    (owner, slot): (&str, u32),
) {
    assert!(lease_records(store).is_empty(), "a lease record is left");
    let runs: Vec<_> = std::fs::read_dir(run_root)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(runs.is_empty(), "run directories are left: {runs:?}");
    if let Some(id) = id {
        let out = std::process::Command::new(test_runtime().1)
            .arg("--root")
            .arg(state_root)
            .args(["state", id])
            .output()
            .unwrap();
        assert!(!out.status.success(), "container {id} is left: {out:?}");
    }
    assert_no_accounts(owner, slot);
    let watchdogs = watchdogs_of(store);
    assert!(
        watchdogs.is_empty(),
        "lease watchdogs are left: {watchdogs:?}"
    );
}

/// The children of process `parent` whose command line holds `arg` (a confined parser child's
/// marker, `cordon::confine::CHILD_ARG`), read from `/proc` now.
#[must_use]
pub fn children_with_arg(parent: u32, arg: &str) -> Vec<u32> {
    processes(Some(parent), &[arg])
}

/// What a lease's watchdog has first on its command line
/// (`cordon::lease::watchdog::WATCHDOG_ARG`; the testkit does not link cordon).
pub const WATCHDOG_ARG: &str = "--cordon-lease-watchdog";

/// The live watchdogs of leases or runs whose records lie under `dir` (a store, a surface's
/// state directory: their command line names the record), read from `/proc` now.
#[must_use]
pub fn watchdogs_of(dir: &Path) -> Vec<u32> {
    processes(None, &[WATCHDOG_ARG, &dir.display().to_string()])
}

/// The processes (children of `parent`, when given) whose command line holds every one of
/// `args`; zombies, which have none, never match.
fn processes(parent: Option<u32>, args: &[&str]) -> Vec<u32> {
    let ppid = parent.map(|p| format!("PPid:\t{p}\n"));
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            ppid.as_ref().is_none_or(|p| status.contains(p))
                && args.iter().all(|a| cmdline.contains(a))
        })
        .collect()
}
