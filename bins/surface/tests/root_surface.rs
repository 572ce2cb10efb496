//! The surface with real containers: `cordon-surface` run by an unprivileged service user (uid
//! 65534, through `setpriv`) on rootless runc. Each control gets an attempt from inside that must
//! fail, a check from outside that the host is unchanged, and — where a policy value is the
//! control — the same probe succeeding once only that value is changed. Needs root (to become
//! the service user and to plant host state), runc and python3: CI has all three.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const SERVICE: u32 = 65534;

struct Surface {
    dir: tempfile::TempDir,
    ws: PathBuf,
    state: PathBuf,
    policy: PathBuf,
    bin: PathBuf,
    reaper: PathBuf,
    outside: PathBuf,
    // Beside /tmp, which a read path may not touch.
    _outside_dir: tempfile::TempDir,
}

fn chown(p: &Path) {
    std::os::unix::fs::chown(p, Some(SERVICE), Some(SERVICE)).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

struct Done {
    code: i32,
    receipt: Value,
    stderr: String,
}

impl Done {
    fn stdout(&self) -> &str {
        self.receipt["outputs"]["stdout"].as_str().unwrap_or("")
    }
}

impl Surface {
    /// A fresh service-user workspace and state directory, and the example surface policy
    /// (root-owned, 0644) edited by `edit`.
    fn new(edit: &dyn Fn(String) -> String) -> Self {
        Self::at(edit, "ws")
    }

    fn at(edit: &dyn Fn(String) -> String, ws_name: &str) -> Self {
        cordon_testkit::require_root("the surface tests become the service user with setpriv");
        let _ = cordon_testkit::test_runtime();
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        chmod(&bin, 0o755);
        // An install is whole or refused: every cordon binary beside the surface (its runs
        // are reaped by cordon-reap among them), linked where the file system allows.
        let built = Path::new(env!("CARGO_BIN_EXE_cordon-surface"));
        for name in cordon::identity::CORDON_BINARIES {
            let to = bin.join(name);
            let from = built.with_file_name(name);
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).unwrap_or_else(|e| {
                    panic!("{}: {e} (cargo build --workspace)", from.display())
                });
            }
            chmod(&to, 0o755);
        }
        let exe = bin.join("cordon-surface");
        let reaper = bin.join("cordon-reap");
        let ws = dir.path().join(ws_name);
        std::fs::create_dir(&ws).unwrap();
        chown(&ws);
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        chmod(&state, 0o700);
        chown(&state);
        let outside_dir = tempfile::tempdir_in("/var/tmp").unwrap();
        chmod(outside_dir.path(), 0o755);
        let outside = outside_dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        chmod(&outside, 0o755);
        std::fs::write(outside.join("secret.txt"), "OUTSIDE-SECRET\n").unwrap();
        chmod(&outside.join("secret.txt"), 0o644);
        let text = std::fs::read_to_string(
            cordon_testkit::workspace_root().join("policy/examples/surface.kdl"),
        )
        .unwrap();
        let text = cordon_testkit::replace_once(
            &text,
            "state-dir \"/run/cordon-surface\"",
            &format!("state-dir \"{}\"", state.display()),
        );
        let text = cordon_testkit::with_test_runtime(&text);
        let policy = dir.path().join("surface.kdl");
        std::fs::write(&policy, edit(text)).unwrap();
        chmod(&policy, 0o644);
        Self {
            dir,
            ws,
            state,
            policy,
            bin: exe,
            reaper,
            outside,
            _outside_dir: outside_dir,
        }
    }

    fn command(&self, policy: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
        self.command_as(&["--clear-groups"], policy, args, env)
    }

    fn command_as(
        &self,
        groups: &[&str],
        policy: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Command {
        self.as_service(&self.bin, groups, policy, args, env)
    }

    /// `cordon-reap --surface ARGS` on this surface's policy, as the service user.
    fn reap(&self, args: &[&str]) -> std::process::Output {
        let args: Vec<&str> = ["--surface"].iter().chain(args).copied().collect();
        self.as_service(&self.reaper, &["--clear-groups"], &self.policy, &args, &[])
            .output()
            .unwrap()
    }

    fn as_service(
        &self,
        program: &Path,
        groups: &[&str],
        policy: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Command {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            &SERVICE.to_string(),
            "--regid",
            &SERVICE.to_string(),
        ])
        .args(groups)
        .arg("--")
        .arg(program)
        .arg("--policy")
        .arg(policy)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .current_dir("/");
        c
    }

    fn run_args(&self, policy: &Path, ws: &Path, tier: &str, script: &str) -> Vec<String> {
        let _ = policy;
        vec![
            "run".into(),
            "--workspace".into(),
            ws.display().to_string(),
            "--tier".into(),
            tier.into(),
            "--".into(),
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
        ]
    }

    fn run_with(
        &self,
        policy: &Path,
        ws: &Path,
        tier: &str,
        script: &str,
        env: &[(&str, &str)],
    ) -> Done {
        let args = self.run_args(policy, ws, tier, script);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.command(policy, &args, env).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        Done {
            code: out.status.code().unwrap_or(-1),
            receipt: serde_json::from_str(stdout.trim()).unwrap_or(Value::Null),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn run(&self, tier: &str, script: &str, env: &[(&str, &str)]) -> Done {
        self.run_with(&self.policy, &self.ws, tier, script, env)
    }

    fn spawn(&self, tier: &str, script: &str, env: &[(&str, &str)]) -> Child {
        let args = self.run_args(&self.policy, &self.ws, tier, script);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(&self.policy, &args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Nothing of any run is left: no run directory, no container in the runtime's state.
    fn assert_released(&self) {
        let runs = self.state.join("runs");
        let left: Vec<_> = std::fs::read_dir(&runs)
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "run directories left: {left:?}");
        let out = Command::new(cordon_testkit::test_runtime().1)
            .arg("--root")
            .arg(self.state.join("runc"))
            .args(["list", "-q"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).trim().is_empty(),
            "containers left: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

fn wait_for(path: &Path, what: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < until, "{what} never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a process whose command line is exactly `argv` exists on the host.
fn process_exists(argv: &[&str]) -> bool {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc").unwrap().any(|e| {
        let p = e.unwrap().path();
        std::fs::read(p.join("cmdline")).is_ok_and(|c| c == want)
    })
}

const SECRETS: [(&str, &str); 6] = [
    ("DATABASE_URL", "postgres://hub:db-SECRET-1@db/hub"),
    ("FEISHU_APP_SECRET", "feishu-SECRET-2"),
    ("HUB_SESSION_SECRET", "hub-SECRET-3"),
    ("ANTHROPIC_API_KEY", "sk-ant-SECRET-4"),
    ("AWS_SECRET_ACCESS_KEY", "aws-SECRET-5"),
    ("SSH_AUTH_SOCK", "/tmp/ssh-SECRET-6/agent.1"),
];

#[test]
fn a_hostile_command_reaches_nothing_outside_its_workspace_and_leaves_nothing() {
    let s = Surface::new(&|t| t);
    let marker = format!("cordon-surface-escape-{}", std::process::id());
    // Planted on the host: a link in the workspace pointing outside, and a policy and config
    // files in the workspace that would widen the read set if anything read them.
    std::os::unix::fs::symlink(&s.outside, s.ws.join("link")).unwrap();
    let widened = format!(
        "read \"{}\" reason=\"widen\"\nread \"/etc\" reason=\"widen\"\n",
        s.outside.display()
    );
    std::fs::create_dir(s.ws.join(".cordon")).unwrap();
    std::fs::write(s.ws.join(".cordon/policy.kdl"), &widened).unwrap();
    std::fs::write(s.ws.join("surface.kdl"), &widened).unwrap();
    std::fs::write(s.ws.join(".cph-config"), &widened).unwrap();
    let shadow_before = std::fs::read("/etc/shadow").unwrap();
    let script = format!(
        r#"
try() {{ if eval "$2" >/dev/null 2>&1; then echo "$1=yes"; else echo "$1=no"; fi; }}
try read-shadow 'cat /etc/shadow'
try read-hostname 'cat /etc/hostname'
try list-root 'ls /root'
try read-passwd 'cat /etc/passwd'
try read-link 'cat /workspace/link/secret.txt'
try read-outside 'cat {outside}/secret.txt'
try write-etc 'echo x > /etc/{marker}'
try write-tmp 'echo x > /tmp/{marker} && cat /tmp/{marker}'
try write-up 'echo x > /workspace/../{marker}'
try write-link 'echo x > /workspace/link/{marker}'
try hardlink 'ln /usr/bin/env /workspace/hardlink'
try write-ws 'echo inside > /workspace/made-inside'
try caps 'grep -q "CapEff:.0000000000000000" /proc/self/status'
try new-userns 'unshare -r true'
env | sort
(sleep 3171 &)
"#,
        outside = s.outside.display(),
        marker = marker,
    );
    let done = s.run("command", &script, &SECRETS);
    assert_eq!(done.code, 0, "{}\n{}", done.stderr, done.receipt);
    let out = done.stdout();
    for (probe, expect) in [
        ("read-shadow", "no"),
        ("read-hostname", "no"),
        ("list-root", "no"),
        ("read-passwd", "no"),
        ("read-link", "no"),
        ("read-outside", "no"),
        ("write-etc", "no"),
        // Lands in the run's private tmpfs: checked below to be absent on the host.
        ("write-tmp", "yes"),
        ("write-up", "no"),
        ("write-link", "no"),
        ("hardlink", "no"),
        ("write-ws", "yes"),
        ("caps", "yes"),
        ("new-userns", "no"),
    ] {
        assert!(
            out.contains(&format!("{probe}={expect}\n")),
            "{probe} should be {expect}:\n{out}"
        );
    }
    for (name, value) in SECRETS {
        assert!(!out.contains(value), "{name}'s value crossed:\n{out}");
        assert!(!done.receipt.to_string().contains(value));
    }
    // Outside: the host is unchanged, nothing of the run is left.
    assert_eq!(std::fs::read("/etc/shadow").unwrap(), shadow_before);
    for p in [
        PathBuf::from("/etc").join(&marker),
        PathBuf::from("/tmp").join(&marker),
        s.dir.path().join(&marker),
        s.outside.join(&marker),
        s.outside.parent().unwrap().join(&marker),
    ] {
        assert!(!p.exists(), "{} was written on the host", p.display());
    }
    assert_eq!(
        std::fs::read_to_string(s.ws.join("made-inside")).unwrap(),
        "inside\n"
    );
    assert_eq!(
        std::fs::metadata(s.ws.join("made-inside")).unwrap().uid(),
        SERVICE,
        "the run's files belong to the service user on the host"
    );
    assert!(
        !process_exists(&["sleep", "3171"]),
        "a background process survived"
    );
    s.assert_released();
    let receipt = &done.receipt;
    assert_eq!(receipt["stage"], "surface");
    assert_eq!(receipt["outputs"]["network"], "none");
    assert_eq!(receipt["outputs"]["user"]["host_uid"], SERVICE);
    let names: Vec<&str> = receipt["outputs"]["env_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(names.contains(&"TMPDIR") && !names.contains(&"DATABASE_URL"));
}

#[test]
fn each_probe_succeeds_once_only_its_control_is_removed() {
    // The same probes as above, with the one policy value that stops each changed.
    let outside = |s: &Surface| s.outside.display().to_string();
    let s = Surface::new(&|t| t);
    let widened = Surface::new(&|t| t);
    let text = std::fs::read_to_string(&widened.policy).unwrap();
    let text = cordon_testkit::replace_once(
        &text,
        "        write \"workspace\"",
        &format!(
            "        read \"{}\" reason=\"the control removed\"\n        read \"/etc/hostname\" reason=\"the control removed\"\n        write \"workspace\"",
            outside(&widened)
        ),
    );
    let text = cordon_testkit::replace_once(
        &text,
        "pass-env \"TERM\"",
        "pass-env \"TERM\" \"AWS_SECRET_ACCESS_KEY\"",
    );
    std::fs::write(&widened.policy, text).unwrap();
    std::os::unix::fs::symlink(&widened.outside, widened.ws.join("link")).unwrap();
    std::os::unix::fs::symlink(&s.outside, s.ws.join("link")).unwrap();
    let script = |o: &str| {
        format!(
            "cat /etc/hostname >/dev/null && echo hostname=yes; cat {o}/secret.txt; cat /workspace/link/secret.txt; env"
        )
    };
    let base = s.run("command", &script(&outside(&s)), &SECRETS);
    let open = widened.run("command", &script(&outside(&widened)), &SECRETS);
    assert_eq!(base.code, 0, "{}\n{}", base.stderr, base.receipt);
    assert_eq!(open.code, 0, "{}\n{}", open.stderr, open.receipt);
    assert!(!base.stdout().contains("hostname=yes"));
    assert!(open.stdout().contains("hostname=yes"));
    assert!(!base.stdout().contains("OUTSIDE-SECRET"));
    // Read directly and through the workspace's link.
    assert_eq!(open.stdout().matches("OUTSIDE-SECRET").count(), 2);
    assert!(!base.stdout().contains("aws-SECRET-5"));
    assert!(open.stdout().contains("aws-SECRET-5"));
    s.assert_released();
    widened.assert_released();
}

#[test]
fn the_agents_provider_variables_never_reach_its_commands() {
    let s = Surface::new(&|t| t);
    let key = "sk-ant-SECRET-4";
    let probe = "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c ANTHROPIC_API_KEY; env | grep -c ANTHROPIC_API_KEY";
    // The agent holds the key while one of its commands runs beside it.
    let agent = s.spawn(
        "agent",
        &format!("touch /workspace/agent-up; while [ ! -e /workspace/cmd-done ]; do sleep 0.05; done; {probe}"),
        &SECRETS,
    );
    wait_for(&s.ws.join("agent-up"), "the agent's marker");
    let command = s.run(
        "command",
        &format!("{probe}; touch /workspace/cmd-done"),
        &SECRETS,
    );
    let agent = agent.wait_with_output().unwrap();
    let agent: Value = serde_json::from_slice(&agent.stdout).unwrap();
    // The command: neither its own environment nor any process it can see holds the key.
    assert!(!command.receipt.to_string().contains(key));
    assert_eq!(command.stdout(), "0\n0\n", "{}", command.receipt);
    // The same probe in the agent's own run finds it (its /proc/1/environ and its env): the
    // probe can see what it looks for.
    let agent_out = agent["outputs"]["stdout"].as_str().unwrap();
    let counts: Vec<u32> = agent_out.lines().map(|l| l.parse().unwrap()).collect();
    assert!(counts[0] >= 1 && counts[1] == 1, "{agent}");
    assert_eq!(agent["outputs"]["tier"], "agent");
    s.assert_released();
}

#[test]
fn the_run_fails_before_starting_when_the_temp_prefix_passes_the_limit() {
    // `<workspace>/.cph/t` at exactly 56 bytes runs; at 57 it is refused before ARGV starts.
    let probe = Surface::new(&|t| t);
    let base = probe.dir.path().display().to_string().len() + 1;
    let name = |total: usize| "w".repeat(total - "/.cph/t".len() - base);
    for (total, runs) in [(56, true), (57, false)] {
        let s = Surface::at(&|t| t, &name(total));
        assert_eq!(
            format!("{}/.cph/t", s.ws.display()).len(),
            total,
            "the test's own arithmetic"
        );
        let done = s.run("command", "touch /workspace/ran", &[]);
        if runs {
            assert_eq!(done.code, 0, "{}\n{}", done.stderr, done.receipt);
        } else {
            assert_eq!(done.code, 2, "{}", done.stderr);
            assert!(done.stderr.contains("temp_prefix"), "{}", done.stderr);
            assert!(done.receipt.is_null(), "a usage error prints no receipt");
        }
        assert_eq!(s.ws.join("ran").exists(), runs);
        s.assert_released();
    }
}

#[test]
fn a_policy_the_service_user_could_change_or_that_lies_in_the_workspace_is_refused() {
    let s = Surface::new(&|t| t);
    let inside = s.ws.join("surface.kdl");
    std::fs::copy(&s.policy, &inside).unwrap();
    chmod(&inside, 0o644);
    let done = s.run_with(&inside, &s.ws, "command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 2, "{}", done.stderr);
    assert!(
        done.stderr.contains("policy_in_workspace"),
        "{}",
        done.stderr
    );
    let owned = s.dir.path().join("owned.kdl");
    std::fs::copy(&s.policy, &owned).unwrap();
    chmod(&owned, 0o644);
    chown(&owned);
    let done = s.run_with(&owned, &s.ws, "command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 2, "{}", done.stderr);
    assert!(done.stderr.contains("policy_writable"), "{}", done.stderr);
    // The operator's own copy runs.
    let done = s.run("command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    // Root is never the service user.
    let out = Command::new(&s.bin)
        .arg("--policy")
        .arg(&s.policy)
        .args(["run", "--workspace"])
        .arg(&s.ws)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    s.assert_released();
}

/// A surface policy naming crun passes crun's own version gate and runs its command rootless
/// under crun (the surface reads no posture from outside, so it needs no start gate).
#[test]
fn crun_passes_its_gate_and_runs_the_command() {
    cordon_testkit::require_executable(Path::new("/usr/bin/crun"), "apt-get install -y crun");
    let runtime = cordon_testkit::with_test_runtime(
        r#"runtime "runc" path="/usr/sbin/runc" min-version="1.1.5""#,
    );
    let s = Surface::new(&|t| {
        cordon_testkit::replace_once(&t, &runtime, "runtime \"crun\" path=\"/usr/bin/crun\"")
    });
    let done = s.run("command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(s.ws.join("ran").exists());
    s.assert_released();
}

#[test]
fn a_limit_the_rootless_runtime_cannot_enforce_is_refused_and_argv_never_runs() {
    let s = Surface::new(&|t| {
        cordon_testkit::replace_once(
            &t,
            "    nofile 1024\n",
            "    nofile 1024\n    memory \"1GiB\"\n",
        )
    });
    let done = s.run("command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 3, "{}", done.stderr);
    assert!(done.stderr.contains("unenforceable"), "{}", done.stderr);
    assert_eq!(done.receipt["outcome"], "no-decision");
    assert!(!s.ws.join("ran").exists());
    s.assert_released();
}

#[test]
fn a_workspace_with_a_host_mount_beneath_it_is_refused_and_argv_never_runs() {
    let s = Surface::new(&|t| t);
    let sub = s.ws.join("sub");
    std::fs::create_dir(&sub).unwrap();
    chown(&sub);
    let status = Command::new("mount")
        .args(["--bind"])
        .arg(&s.outside)
        .arg(&sub)
        .status()
        .unwrap();
    assert!(status.success());
    // On the host the bind shows the outside file: a recursive bind of the workspace would
    // carry it in, and a plain one is refused in a user namespace.
    assert!(sub.join("secret.txt").exists());
    let done = s.run("command", "touch /workspace/ran", &[]);
    let _ = Command::new("umount").arg(&sub).status();
    assert_eq!(done.code, 2, "{}", done.stderr);
    assert!(
        done.stderr.contains("cordon::surface::workspace"),
        "{}",
        done.stderr
    );
    assert!(done.stderr.contains("is a mount point"), "{}", done.stderr);
    assert!(!s.ws.join("ran").exists());
    // Without the mount the same run goes ahead.
    let done = s.run("command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    s.assert_released();
}

#[test]
fn host_loopback_is_unreachable_from_the_surface() {
    let s = Surface::new(&|t| t);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // From the host the listener answers: the probe below can reach what exists.
    std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let done = s.run(
        "command",
        &format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' 2>/dev/null && echo reached || echo unreachable"
        ),
        &[],
    );
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert_eq!(done.stdout(), "unreachable\n");
    s.assert_released();
}

#[test]
fn a_run_past_its_deadline_is_killed_and_rejected() {
    let s =
        Surface::new(&|t| cordon_testkit::replace_once(&t, "deadline \"1h\"", "deadline \"1s\""));
    let done = s.run("command", "sleep 3172", &[]);
    assert_eq!(done.code, 1, "{}", done.stderr);
    assert_eq!(done.receipt["reasons"][0]["code"], "surface.deadline");
    assert!(!process_exists(&["sleep", "3172"]));
    s.assert_released();
}

/// Every surface receipt, ok or rejected, is the one its store holds, signed with the surface's
/// own key: `cordon-verify`, given that key, replays it; given another, it refuses.
#[test]
fn every_surface_receipt_is_stored_signed_and_verifies() {
    let s = Surface::new(&|t| t);
    let ok = s.run("command", "echo fine", &[]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let failed = s.run("command", "exit 4", &[]);
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    let key = s.command(&s.policy, &["key"], &[]).output().unwrap();
    assert_eq!(key.status.code(), Some(0), "{key:?}");
    let key = String::from_utf8(key.stdout).unwrap();
    let verifier = s.dir.path().join("bin/cordon-verify");
    std::fs::copy(
        Path::new(env!("CARGO_BIN_EXE_cordon-surface")).with_file_name("cordon-verify"),
        &verifier,
    )
    .unwrap();
    chmod(&verifier, 0o755);
    let verify = |done: &Done, key: &str| {
        let digest = cordon::receipt::Receipt::parse(&done.receipt.to_string())
            .unwrap()
            .digest()
            .unwrap()
            .to_string();
        let store = s.state.join("store");
        Command::new("setpriv")
            .args([
                "--reuid",
                &SERVICE.to_string(),
                "--regid",
                &SERVICE.to_string(),
            ])
            .args(["--clear-groups", "--"])
            .arg(&verifier)
            .arg("--store")
            .arg(&store)
            .args(["--key", key.trim(), &digest])
            .current_dir("/")
            .output()
            .unwrap()
    };
    for done in [&ok, &failed] {
        let out = verify(done, &key);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("verified: 1 receipts"));
    }
    let other = format!("ed25519:{}", "11".repeat(32));
    assert_eq!(verify(&ok, &other).status.code(), Some(1));
}

/// The rootless lease's recovery, end to end: `cordon-reap --surface` as the service user
/// names the dead run in its check, releases it, proves it gone, and its receipt is stored and
/// signed in the surface's own store.
#[test]
fn cordon_reap_releases_what_a_killed_supervisor_left() {
    let s = Surface::new(&|t| t);
    let mut child = s.spawn("command", "touch /workspace/up; exec sleep 3173", &[]);
    wait_for(&s.ws.join("up"), "the run's marker");
    // setpriv execs cordon-surface: the child is the supervisor.
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(
        std::fs::read_dir(s.state.join("runs")).unwrap().count(),
        1,
        "the killed run's record is left for reap"
    );
    let check = s.reap(&["--check"]);
    assert_eq!(check.status.code(), Some(3), "{check:?}");
    let receipt: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert!(
        receipt["outputs"]["remaining"][0]
            .as_str()
            .unwrap()
            .starts_with("lease record "),
        "{receipt}"
    );
    // The command itself is ended by the run's watchdog (a_sigkilled_surface_runs_command_…);
    // what the check must leave alone is the run it reports.
    assert_eq!(
        std::fs::read_dir(s.state.join("runs")).unwrap().count(),
        1,
        "the check changes nothing"
    );
    let out = s.reap(&[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["stage"], "reap", "{receipt}");
    assert_eq!(
        receipt["inputs"]["surface_state"],
        s.state.display().to_string()
    );
    assert_eq!(
        receipt["outputs"]["released"].as_array().unwrap().len(),
        1,
        "{receipt}"
    );
    let digest = cordon::receipt::Receipt::parse(&receipt.to_string())
        .unwrap()
        .digest()
        .unwrap();
    assert!(
        s.state
            .join(format!("store/receipts/{}.sig", digest.hex()))
            .exists()
    );
    assert!(!process_exists(&["sleep", "3173"]));
    s.assert_released();
    let check = s.reap(&["--check"]);
    assert_eq!(check.status.code(), Some(0), "{check:?}");
}

/// Root never reaps the service user's runs: those runs and their state are the user's.
#[test]
fn cordon_reap_refuses_the_surface_as_root() {
    let s = Surface::new(&|t| t);
    let out = Command::new(&s.reaper)
        .args(["--surface", "--policy"])
        .arg(&s.policy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cordon::reap::surface_root"));
    assert!(out.stdout.is_empty());
}

#[test]
fn a_command_gets_home_and_temp_of_its_own_and_cannot_plant_the_agents_configuration() {
    let s = Surface::new(&|t| t);
    let agent = s.run(
        "agent",
        "echo agent-config > \"$HOME/settings.json\"; echo agent-sock > \"$TMPDIR/bridge\"",
        &[],
    );
    assert_eq!(agent.code, 0, "{}", agent.stderr);
    let command = s.run(
        "command",
        "ls -A \"$HOME\" \"$TMPDIR\"; echo hook > \"$HOME/settings.json\"; echo end",
        &[],
    );
    assert_eq!(command.code, 0, "{}", command.stderr);
    // The command saw neither file, and its own write went to its disposable home.
    assert!(
        !command.stdout().contains("settings.json"),
        "{}",
        command.stdout()
    );
    assert!(!command.stdout().contains("bridge"), "{}", command.stdout());
    assert_eq!(
        std::fs::read_to_string(s.ws.join(".cph/agent-runtime/settings.json")).unwrap(),
        "agent-config\n"
    );
    // The agent's own next run still finds its home.
    let again = s.run("agent", "cat \"$HOME/settings.json\"", &[]);
    assert_eq!(again.stdout(), "agent-config\n");
    s.assert_released();
}

#[test]
fn supplementary_groups_of_the_service_user_refuse_the_run() {
    let s = Surface::new(&|t| t);
    // A root-group-42 file in the workspace: with the group crossing it would be readable.
    let args = s.run_args(&s.policy, &s.ws, "command", "touch /workspace/ran");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = s
        .command_as(&["--groups", "42"], &s.policy, &args, &[])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("cordon::surface::groups"), "{stderr}");
    assert!(!s.ws.join("ran").exists());
    // Without them the same run goes ahead.
    assert_eq!(s.run("command", "touch /workspace/ran", &[]).code, 0);
    s.assert_released();
}

#[test]
fn a_workspace_given_through_a_link_is_refused() {
    let s = Surface::new(&|t| t);
    let alias = s.dir.path().join("alias");
    std::os::unix::fs::symlink(&s.ws, &alias).unwrap();
    let done = s.run_with(&s.policy, &alias, "command", "touch /workspace/ran", &[]);
    assert_eq!(done.code, 2, "{}", done.stderr);
    assert!(done.stderr.contains("canonical"), "{}", done.stderr);
    assert!(!s.ws.join("ran").exists());
}

#[test]
fn cordon_reap_leaves_a_live_run_alone() {
    let s = Surface::new(&|t| t);
    let child = s.spawn(
        "command",
        "touch /workspace/up; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo survived",
        &[],
    );
    wait_for(&s.ws.join("up"), "the run's marker");
    let out = s.reap(&["--sweep"]);
    std::fs::write(s.ws.join("go"), "").unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let reaped: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        reaped["outputs"]["active"].as_array().unwrap().len(),
        1,
        "{reaped}"
    );
    assert!(
        reaped["outputs"]["released"].as_array().unwrap().is_empty(),
        "{reaped}"
    );
    let out = child.wait_with_output().unwrap();
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["outputs"]["stdout"], "survived\n");
    s.assert_released();
}

/// SIGINT, SIGTERM and SIGHUP to `cordon-surface run` while its command runs: the command is
/// stopped, the run released (no run directory, no container), and the surface ends with exit
/// 3 and a no-decision receipt naming the signal.
#[test]
fn a_signal_stops_the_command_and_releases_the_run() {
    let s = Surface::new(&|t| t);
    for (signal, seconds) in [
        (nix::sys::signal::Signal::SIGINT, "3181"),
        (nix::sys::signal::Signal::SIGTERM, "3182"),
        (nix::sys::signal::Signal::SIGHUP, "3183"),
    ] {
        let marker = s.ws.join(format!("up-{seconds}"));
        let child = s.spawn(
            "command",
            &format!("touch /workspace/up-{seconds}; exec sleep {seconds}"),
            &[],
        );
        wait_for(&marker, "the run's marker");
        // setpriv execs cordon-surface: the child is the supervisor.
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(receipt["outcome"], "no-decision", "{receipt}");
        assert_eq!(
            receipt["reasons"][0]["code"], "receipt.interrupted",
            "{receipt}"
        );
        assert!(
            receipt["reasons"][0]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{} received", signal.as_str())),
            "{receipt}"
        );
        assert!(
            !process_exists(&["sleep", seconds]),
            "the command outlived its supervisor's signal"
        );
        s.assert_released();
    }
}

/// A SIGKILLed `cordon-surface run` handles nothing: its run's watchdog sees it gone and ends
/// the command's container at once, then exits; `cordon-reap --surface` releases the rest and
/// nothing is left.
#[test]
fn a_sigkilled_surface_runs_command_is_ended_by_its_watchdog() {
    let s = Surface::new(&|t| t);
    let seconds = "3184";
    let marker = s.ws.join(format!("up-{seconds}"));
    let mut child = s.spawn(
        "command",
        &format!("touch /workspace/up-{seconds}; exec sleep {seconds}"),
        &[],
    );
    wait_for(&marker, "the run's marker");
    assert_eq!(cordon_testkit::watchdogs_of(&s.state).len(), 1);
    // setpriv execs cordon-surface: the child is the supervisor.
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "killed, not exited");
    let until = Instant::now() + Duration::from_secs(10);
    while process_exists(&["sleep", seconds]) || !cordon_testkit::watchdogs_of(&s.state).is_empty()
    {
        assert!(
            Instant::now() < until,
            "the command or its watchdog outlived the SIGKILLed supervisor by 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = s.reap(&[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    s.assert_released();
}

/// Seed 001's checklist, step 1, for the surface: a quarantine in its own store stops every run
/// before anything is made for it; `cordon-reap --surface` lists it (exit 3 in every mode) and
/// lifts it with `--clear` once no run is left, and the next run runs.
#[test]
fn a_quarantine_stops_every_surface_run_until_reap_clears_it() {
    let s = Surface::new(&|t| t);
    let out = s.reap(&["--quarantine", "suspected escape"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let quarantined = r["outputs"]["quarantined"].as_object().unwrap().clone();
    let (id, q) = quarantined.iter().next().unwrap();
    assert_eq!(q["scope"]["name"], "surface", "{r}");
    assert_eq!(q["cause"], "operator", "{r}");
    let done = s.run("command", "echo x > /workspace/ran", &[]);
    assert_eq!(done.code, 3, "{}", done.stderr);
    assert_eq!(done.receipt["outcome"], "no-decision", "{}", done.receipt);
    assert!(
        done.receipt["reasons"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains(id.as_str())),
        "{}",
        done.receipt
    );
    assert!(!s.ws.join("ran").exists(), "argv never ran");
    s.assert_released();
    let status = s.reap(&["--status"]);
    assert_eq!(status.status.code(), Some(3), "{status:?}");
    let clear = s.reap(&["--clear", id]);
    assert_eq!(clear.status.code(), Some(0), "{clear:?}");
    let r: Value = serde_json::from_slice(&clear.stdout).unwrap();
    assert_eq!(&r["outputs"]["cleared"], q, "{r}");
    let done = s.run("command", "echo x > /workspace/ran", &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(s.ws.join("ran").exists());
    s.assert_released();
}

/// Issue 32's attack (a): a command moves the directory that holds the agent's home and temp
/// aside and makes its own at their paths, with a file the agent would run. Its run covers that
/// directory, so the moves fail (the same moves of a plain directory succeed), its plants land
/// in its disposable covers, and the host's directories are the ones the surface made. A
/// replacement made anyway — by anything outside a run — is refused before the agent runs.
#[test]
fn a_command_cannot_move_or_replace_the_agents_home_and_a_replacement_is_refused() {
    let s = Surface::new(&|t| t);
    let first = s.run("agent", "echo kept > \"$HOME/settings.json\"", &[]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let id = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    };
    let before: Vec<_> = [".cph", ".cph/agent-runtime", ".cph/t"]
        .iter()
        .map(|r| id(&s.ws.join(r)))
        .collect();
    std::fs::create_dir(s.ws.join("plain")).unwrap();
    chown(&s.ws.join("plain"));
    let script = r#"
try() { if eval "$2" >/dev/null 2>&1; then echo "$1=yes"; else echo "$1=no"; fi; }
try move-plain 'mv /workspace/plain /workspace/plain-moved'
try move-parent 'mv /workspace/.cph /workspace/.cph-moved'
try move-home 'mv /workspace/.cph/agent-runtime /workspace/.cph/old'
try remove-home 'rmdir /workspace/.cph/agent-runtime'
try plant 'mkdir -p /workspace/.cph/agent-runtime && echo planted > /workspace/.cph/agent-runtime/settings.json'
"#;
    let done = s.run("command", script, &[]);
    assert_eq!(done.code, 0, "{}\n{}", done.stderr, done.receipt);
    for (probe, expect) in [
        ("move-plain", "yes"),
        ("move-parent", "no"),
        ("move-home", "no"),
        ("remove-home", "no"),
        // Into its own cover: checked below to be nowhere on the host.
        ("plant", "yes"),
    ] {
        assert!(
            done.stdout().contains(&format!("{probe}={expect}\n")),
            "{probe} should be {expect}:\n{}",
            done.stdout()
        );
    }
    let after: Vec<_> = [".cph", ".cph/agent-runtime", ".cph/t"]
        .iter()
        .map(|r| id(&s.ws.join(r)))
        .collect();
    assert_eq!(before, after, "the agent's directories are the ones made");
    assert!(!s.ws.join(".cph-moved").exists() && !s.ws.join(".cph/old").exists());
    let agent = s.run("agent", "cat \"$HOME/settings.json\"", &[]);
    assert_eq!(agent.stdout(), "kept\n", "{}", agent.stderr);

    // What a command could once do, done on the host: the parent moved aside, a look-alike
    // (same names, same owner, mode 0700) made in its place with a planted file.
    std::fs::rename(s.ws.join(".cph"), s.ws.join(".cph-aside")).unwrap();
    for rel in [".cph", ".cph/agent-runtime", ".cph/t"] {
        let p = s.ws.join(rel);
        std::fs::create_dir(&p).unwrap();
        chown(&p);
        chmod(&p, 0o700);
    }
    std::fs::write(s.ws.join(".cph/agent-runtime/settings.json"), "planted").unwrap();
    let refused = s.run("agent", "echo ran > /workspace/agent-ran", &[]);
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert_eq!(
        refused.receipt["outcome"], "no-decision",
        "{}",
        refused.receipt
    );
    let why = refused.receipt["reasons"][0]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        why.contains("not the directory the surface made"),
        "{}",
        refused.receipt
    );
    assert!(!s.ws.join("agent-ran").exists(), "argv never ran");
    s.assert_released();
}

/// Issue 32's attack (b): a command reads what the agent kept in its home, directly or by
/// moving the directory aside. It sees only its own cover.
#[test]
fn a_command_cannot_read_the_agents_earlier_home() {
    let s = Surface::new(&|t| t);
    let agent = s.run("agent", "echo agent-only-7 > \"$HOME/notes\"", &[]);
    assert_eq!(agent.code, 0, "{}", agent.stderr);
    let script = r"
ls -A /workspace/.cph /workspace/.cph/agent-runtime
cat /workspace/.cph/agent-runtime/notes
mv /workspace/.cph /workspace/x && cat /workspace/x/agent-runtime/notes
grep -r agent-only-7 /workspace
echo end
";
    let done = s.run("command", script, &[]);
    assert_eq!(done.code, 0, "{}\n{}", done.stderr, done.receipt);
    assert!(done.stdout().ends_with("end\n"), "{}", done.stdout());
    assert!(!done.stdout().contains("agent-only-7"), "{}", done.stdout());
    assert!(!done.stdout().contains("notes"), "{}", done.stdout());
    // Outside, the agent's file is where it left it.
    assert_eq!(
        std::fs::read_to_string(s.ws.join(".cph/agent-runtime/notes")).unwrap(),
        "agent-only-7\n"
    );
    s.assert_released();
}

/// Issue 32's attack (c): a command, running beside the agent, moves the directory that holds
/// the agent's temp aside, makes its own at its path and waits for the agent to bind its
/// socket there, to read the key through it. Its move fails (its run covers that directory),
/// the agent binds in its own temp, and the command never sees the socket.
#[test]
fn a_command_cannot_reach_a_socket_the_agent_binds_in_its_temp() {
    let s = Surface::new(&|t| t);
    let first = s.run("agent", "true", &[]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let lurk = r#"
mv /workspace/.cph /workspace/.cph-moved 2>/dev/null && echo moved
mkdir -p /workspace/.cph/t 2>/dev/null
touch /workspace/lurking
python3 -c '
import socket, time
for _ in range(40):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect("/workspace/.cph/t/bridge.sock")
        print("got", s.recv(100))
        break
    except OSError as e:
        err = e.errno
        time.sleep(0.05)
else:
    print("never", err)
'
"#;
    let lurker = s.spawn("command", lurk, &[]);
    wait_for(&s.ws.join("lurking"), "the lurking command");
    let serve = r#"python3 -c '
import os, socket
s = socket.socket(socket.AF_UNIX)
s.bind(os.environ["TMPDIR"] + "/bridge.sock")
s.listen(1)
s.settimeout(60)
try:
    c, _ = s.accept()
    c.sendall(os.environ["ANTHROPIC_API_KEY"].encode())
except OSError:
    pass
'"#;
    let mut agent = s.spawn("agent", serve, &[("ANTHROPIC_API_KEY", "sk-ant-SOCKET-9")]);
    wait_for(&s.ws.join(".cph/t/bridge.sock"), "the agent's socket");
    let out = lurker.wait_with_output().unwrap();
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    let said = receipt["outputs"]["stdout"].as_str().unwrap_or("");
    assert_eq!(receipt["outcome"], "ok", "{receipt}");
    assert!(!said.contains("moved"), "{said}");
    assert!(!said.contains("SOCKET-9"), "{said}");
    assert!(said.contains("never 2"), "ENOENT throughout: {said}");
    // The same connection from the host reaches the agent: the probe proves something.
    let host = std::os::unix::net::UnixStream::connect(s.ws.join(".cph/t/bridge.sock"));
    let mut got = String::new();
    std::io::Read::read_to_string(&mut host.unwrap(), &mut got).unwrap();
    assert_eq!(got, "sk-ant-SOCKET-9");
    assert!(agent.wait().unwrap().success());
    s.assert_released();
}

/// The surface's own check between trust and start, driven by the bundle changing under it:
/// `run::run` in this test binary, re-executed as the service user
/// ([`helper_run_on_an_interposed_runtime`]), with the real host interposed. Returns the
/// helper's `RESULT` line.
fn interposed_run(s: &Surface, decoy: &Path) -> String {
    let exe = s.dir.path().join("bin/root_surface");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    chmod(&exe, 0o755);
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(&exe)
        .args([
            "--ignored",
            "--exact",
            "helper_run_on_an_interposed_runtime",
            "--nocapture",
        ])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("CORDON_TEST_POLICY", &s.policy)
        .env("CORDON_TEST_WORKSPACE", &s.ws)
        .env("CORDON_TEST_DECOY", decoy)
        .env("CORDON_TEST_WATCHDOG", &s.bin)
        .current_dir("/")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT: "))
        .unwrap_or_else(|| panic!("no result: {out:?}"))
        .to_owned()
}

/// Not a test of its own: [`interposed_run`]'s helper, run as the service user. The
/// workspace's bind source is changed to the decoy just before `runc create` reads the bundle,
/// as a rename race between the trust check and the start would.
#[test]
#[ignore = "run by interposed_run as the service user"]
fn helper_run_on_an_interposed_runtime() {
    use cordon::host::fake::Interposed;
    use cordon::lease::rootless;
    let var = |k: &str| PathBuf::from(std::env::var_os(k).unwrap());
    let (policy_path, ws, decoy) = (
        var("CORDON_TEST_POLICY"),
        var("CORDON_TEST_WORKSPACE"),
        var("CORDON_TEST_DECOY"),
    );
    let text = std::fs::read_to_string(&policy_path).unwrap();
    let policy = cordon_policy_lang::parse("surface.kdl", &text).unwrap();
    let (_, block) = cordon_stage::surface::surface_of(&policy).unwrap();
    let state = PathBuf::from(&block.state_dir);
    let (ws_src, decoy_src) = (ws.display().to_string(), decoy.display().to_string());
    let host = Interposed::new().rewriting_spawns(move |tool| {
        let args: Vec<String> = tool
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let has = |w: &str| args.iter().any(|a| a == w);
        if let (true, Some(i)) = (has("create"), args.iter().position(|a| a == "--bundle")) {
            let config = Path::new(&args[i + 1]).join("config.json");
            let spec = std::fs::read_to_string(&config).unwrap();
            let spec = spec.replace(
                &format!("\"source\": \"{ws_src}\""),
                &format!("\"source\": \"{decoy_src}\""),
            );
            std::fs::write(&config, spec).unwrap();
        }
        tool.clone()
    });
    let uid = nix::unistd::geteuid().as_raw();
    let run_host = cordon_surface::run::Host {
        lease: rootless::Setup {
            runtime: cordon::runtime::Runtime {
                binary: PathBuf::from(policy.runtime().path()),
                state_root: state.join(rootless::RUNTIME_STATE),
                host: std::sync::Arc::new(host),
            },
            state: state.clone(),
            uid,
            exit_grace: rootless::EXIT_GRACE,
            // cordon-surface's main is the watchdog's.
            watchdog: var("CORDON_TEST_WATCHDOG"),
        },
        gid: nix::unistd::getegid().as_raw(),
        groups: Vec::new(),
        authority: "sha256:test".into(),
    };
    let script = "touch /workspace/ran";
    let req = cordon_surface::run::Request {
        workspace: cordon_surface::trust::workspace(&ws, uid).unwrap(),
        tier: cordon_stage::surface::Tier::Command,
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        invoker_env: std::collections::BTreeMap::new(),
        skills: Vec::new(),
        sandbox_cgroup: None,
    };
    let store = cordon::store::Store::open(&state.join(rootless::RECEIPTS)).unwrap();
    let result = cordon_surface::run::run(&policy, &run_host, &req, &store);
    println!(
        "RESULT: {}",
        match result {
            Ok(ran) => format!("ran {:?}", ran.finished.meta.exit_code),
            Err(e) => {
                let chain: Vec<String> =
                    std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                        .map(ToString::to_string)
                        .collect();
                format!("refused {}", chain.join(": "))
            }
        }
        .replace('\n', " ")
    );
}

/// The directory the runtime mounted is proven the one checked: a decoy substituted between
/// the trust check and the start (here, in the bundle `runc create` reads) stops the run
/// before argv runs, in either directory.
#[test]
fn a_workspace_substituted_before_the_start_stops_the_run() {
    let s = Surface::new(&|t| t);
    let decoy = s.dir.path().join("decoy");
    std::fs::create_dir(&decoy).unwrap();
    chown(&decoy);
    let result = interposed_run(&s, &decoy);
    assert!(
        result.starts_with("refused the workspace cannot be prepared")
            && result.contains("not the one that was checked"),
        "{result}"
    );
    assert!(!decoy.join("ran").exists() && !s.ws.join("ran").exists());
    s.assert_released();
}

/// The probe of egress: CONNECT through the proxy variable's address, then every way around it.
const EGRESS_PROBE: &str = r#"
import os, socket, sys
port, other, abstract = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
proxy = os.environ.get("HTTPS_PROXY", "")
print("proxy", proxy)
def connect(target):
    s = socket.create_connection(("127.0.0.1", 3128), 5)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            break
        head += b
    return s, head.split(b"\r\n")[0].decode()
try:
    s, status = connect("localhost:%d" % port)
    print("allowed", status)
    s.sendall(b"ping\n")
    print("echo", s.makefile().readline().strip())
    s.close()
except OSError as e:
    print("allowed failed", e.errno)
for t in ["denied.example:%d" % port, "127.0.0.1:%d" % port, "localhost:%d" % other]:
    try:
        print("refused", t, connect(t)[1])
    except OSError as e:
        print("refused", t, "error", e.errno)
try:
    held, status = connect("localhost:%d" % port)
    held.sendall(b"hold\n")
    print("held", held.makefile().readline().strip())
except OSError as e:
    print("held failed", e.errno)
def attempt(name, f):
    try:
        f()
        print(name, "reached")
    except OSError as e:
        print(name, "failed")
attempt("direct", lambda: socket.create_connection(("127.0.0.1", port), 2))
attempt("raw", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("dns", lambda: socket.getaddrinfo("localhost.", port, socket.AF_INET) and socket.getaddrinfo("example.com", 443))
attempt("abstract", lambda: socket.socket(socket.AF_UNIX).connect("\0" + abstract))
"#;

/// Egress by allow-list: the sandbox reaches a listed name and port only through the host's
/// proxy, whose every decision the receipt records; a name not listed, an address literal and
/// a port not listed are refused by the proxy and never reach the far end; direct connections,
/// raw sockets, DNS and the host's abstract sockets reach nothing. The same CONNECT under
/// `network "none"` reaches nothing: the proxy is the only way out.
#[test]
fn egress_reaches_only_the_listed_names_and_ports_through_the_hosts_proxy() {
    use std::io::{BufRead, Write};
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let reached = reached.clone();
        std::thread::spawn(move || {
            // A far end that never closes the tunnel it is asked to hold.
            let mut held = Vec::new();
            for conn in server.incoming() {
                let Ok(mut conn) = conn else { return };
                reached.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut line = String::new();
                let _ = std::io::BufReader::new(&conn).read_line(&mut line);
                let _ = conn.write_all(format!("pong:{line}").as_bytes());
                if line == "hold\n" {
                    held.push(conn);
                }
            }
        });
    }
    // A host abstract socket: a network namespace of its own cannot name it.
    let abstract_name = format!("cordon-egress-test-{}", std::process::id());
    let _abstract = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    let egress = |t: String| {
        let t = cordon_testkit::replace_once(&t, "network \"none\"", "network \"egress\"");
        cordon_testkit::replace_once(
            &t,
            "        state-dir",
            &format!(
                "        egress {{\n            domain \"localhost\"\n            port {port}\n            allow-address \"127.0.0.0/8\" reason=\"the test's far end on the host's loopback\"\n        }}\n        state-dir"
            ),
        )
    };
    let s = Surface::new(&egress);
    let probe = s.ws.join("probe.py");
    std::fs::write(&probe, EGRESS_PROBE).unwrap();
    chown(&probe);
    let script = format!("python3 /workspace/probe.py {port} {other_port} {abstract_name}");
    let done = s.run("command", &script, &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    let out = done.stdout();
    for line in [
        "proxy http://127.0.0.1:3128",
        "allowed HTTP/1.1 200 Connection Established",
        "echo pong:ping",
        "held pong:hold",
        &format!("refused denied.example:{port} HTTP/1.1 403"),
        &format!("refused 127.0.0.1:{port} HTTP/1.1 403"),
        "direct failed",
        "raw failed",
        "dns failed",
        "abstract failed",
    ] {
        assert!(out.contains(line), "{line:?} missing from:\n{out}");
    }
    // Only the two allowed connections reached a far end; the port not listed was never
    // dialled.
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "{out}"
    );
    assert!(
        out.contains(&format!("refused localhost:{other_port} HTTP/1.1 403")),
        "{out}"
    );
    other.set_nonblocking(true).unwrap();
    assert!(other.accept().is_err(), "the unlisted port was reached");
    let egress = done.receipt["outputs"]["egress"].as_array().unwrap();
    let verdicts: Vec<(String, String)> = egress
        .iter()
        .map(|c| {
            (
                format!("{}:{}", c["domain"].as_str().unwrap(), c["port"]),
                c["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(verdicts[0], (format!("localhost:{port}"), "allowed".into()));
    assert!(egress[0]["bytes_out"].as_u64().unwrap() >= 5);
    assert!(verdicts[1].1.starts_with("refused: ") && verdicts[1].0.starts_with("denied.example"));
    assert!(verdicts[2].1.contains("address literal"), "{verdicts:?}");
    assert!(verdicts[3].1.contains("port"), "{verdicts:?}");
    // A tunnel its far end never closed is recorded with what it carried.
    assert_eq!(verdicts[4], (format!("localhost:{port}"), "allowed".into()));
    assert_eq!(egress[4]["bytes_out"], 5, "{egress:?}");
    assert_eq!(egress[4]["bytes_in"], 10, "{egress:?}");
    // The proxy's socket went with the run directory.
    s.assert_released();

    // The ablation: without egress the same probe reaches nothing at all.
    let none = Surface::new(&|t| t);
    let probe = none.ws.join("probe.py");
    std::fs::write(&probe, EGRESS_PROBE).unwrap();
    chown(&probe);
    let done = none.run("command", &script, &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(
        done.stdout().contains("allowed failed"),
        "{}",
        done.stdout()
    );
    assert!(
        done.receipt["outputs"]
            .get("egress")
            .is_none_or(|e| e.as_array().is_some_and(Vec::is_empty))
    );
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Skills (ADR 0018): a version imported by the service user appears, read-only, at the
/// policy's skills path only in a run that selects it, from a run-scoped copy removed with the
/// run; the receipt names the version. What the workspace plants as skills never appears there,
/// a version not imported is refused before anything runs, and a changed stored version is
/// never exposed.
#[test]
fn selected_skill_versions_appear_read_only_for_one_run_and_nothing_else_does() {
    let s = Surface::new(&|t| t);
    let src = s.dir.path().join("review");
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::write(src.join("SKILL.md"), "REVIEW-SKILL\n").unwrap();
    std::fs::write(src.join("bin/run"), "#!/bin/sh\necho skill-ran\n").unwrap();
    chmod(&src.join("bin/run"), 0o755);
    for d in [&src, &src.join("bin")] {
        chmod(d, 0o755);
    }
    let import = s
        .command(&s.policy, &["skills", "import", src.to_str().unwrap()], &[])
        .output()
        .unwrap();
    assert_eq!(import.status.code(), Some(0), "{import:?}");
    let selected = String::from_utf8(import.stdout).unwrap().trim().to_owned();
    assert!(selected.starts_with("review@sha256:"), "{selected}");
    // The workspace plants a skill of its own where agents look for them.
    let planted = s.ws.join(".claude/skills/evil");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(planted.join("SKILL.md"), "EVIL\n").unwrap();
    for p in [
        s.ws.join(".claude"),
        s.ws.join(".claude/skills"),
        planted.clone(),
    ] {
        chown(&p);
    }
    chown(&planted.join("SKILL.md"));
    let run = |skills: &[&str], script: &str| {
        let mut args = vec![
            "run",
            "--workspace",
            s.ws.to_str().unwrap(),
            "--tier",
            "agent",
        ];
        for k in skills {
            args.extend(["--skill", k]);
        }
        args.extend(["--", "/bin/sh", "-c", script]);
        let out = s.command(&s.policy, &args, &[]).output().unwrap();
        Done {
            code: out.status.code().unwrap_or(-1),
            receipt: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let script = "ls /skills; cat /skills/review/SKILL.md; /skills/review/bin/run; \
                  touch /skills/review/x 2>/dev/null && echo wrote || echo read-only; \
                  echo more >> /skills/review/SKILL.md 2>/dev/null && echo changed || echo unchanged";
    let done = run(&[&selected], script);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert_eq!(
        done.stdout(),
        "review\nREVIEW-SKILL\nskill-ran\nread-only\nunchanged\n"
    );
    assert_eq!(done.receipt["inputs"]["skills"][0], selected.as_str());
    s.assert_released();
    // Without a selection nothing is there, the workspace's plant included.
    let bare = run(
        &[],
        "ls -A /skills 2>&1 | grep -c . ; cat /skills/*/SKILL.md 2>/dev/null; true",
    );
    assert_eq!(bare.code, 0, "{}", bare.stderr);
    assert!(
        !bare.stdout().contains("EVIL") && !bare.stdout().contains("REVIEW"),
        "{}",
        bare.stdout()
    );
    assert!(bare.receipt["inputs"].get("skills").is_none());
    // A version never imported is refused before anything runs.
    let unknown = format!("review@{}", cordon::Digest::of_bytes(b"other"));
    let refused = run(&[&unknown], "touch /workspace/ran");
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("not in the store"),
        "{}",
        refused.stderr
    );
    assert!(!s.ws.join("ran").exists());
    // A stored version changed on disk is never exposed: no decision, nothing runs.
    let hex = selected.rsplit(':').next().unwrap();
    let stored = s.state.join("skills").join(hex);
    chmod(&stored, 0o755);
    chmod(&stored.join("SKILL.md"), 0o644);
    std::fs::write(stored.join("SKILL.md"), "TAMPERED\n").unwrap();
    let tampered = run(&[&selected], "touch /workspace/ran");
    assert_eq!(tampered.code, 3, "{}", tampered.stderr);
    assert!(!s.ws.join("ran").exists());
    s.assert_released();
}

/// The per-run accounts this surface made: `cordon-…` with a uid in the policy's range and the
/// owner tag of its state directory (tests run side by side).
fn per_run_accounts(s: &Surface) -> Vec<String> {
    let tag = cordon::account::owner_tag("surface", &s.state);
    std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split(':').collect();
            f[0].starts_with("cordon-")
                && f[2]
                    .parse::<u32>()
                    .is_ok_and(|u| (3_100_000..=3_199_999).contains(&u))
                && f[4] == tag
        })
        .map(|l| l.split(':').next().unwrap().to_owned())
        .collect()
}

impl Surface {
    /// This surface under `user "per-run"`: its state directory root's, and its command run
    /// as root.
    fn per_run() -> Self {
        Self::per_run_with(&|t| t)
    }

    /// A per-run policy, edited further by `edit`.
    fn per_run_with(edit: &dyn Fn(String) -> String) -> Self {
        let s = Self::new(&|t| {
            edit(cordon_testkit::replace_once(
                &t,
                "user \"service\"",
                "user \"per-run\"",
            ))
        });
        std::os::unix::fs::chown(&s.state, Some(0), Some(0)).unwrap();
        chmod(&s.state, 0o711);
        s
    }

    fn as_root(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.arg("--policy")
            .arg(&self.policy)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/");
        c
    }

    fn root_run(&self, script: &str) -> Done {
        let ws = self.ws.to_str().unwrap();
        let out = self
            .as_root(
                &self.bin,
                &["run", "--workspace", ws, "--", "/bin/sh", "-c", script],
            )
            .output()
            .unwrap();
        Done {
            code: out.status.code().unwrap_or(-1),
            receipt: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// REQ-117 as root: `user "per-run"` runs each command in a fresh account of the policy's range
/// that holds the workspace only for the run; afterwards every entry is the owner's again (a
/// set-id file the run made loses its bits), the account, its cron/at lines and its state are
/// gone, and the receipt of record — root's, signed with the surface's key — names it. A
/// workspace holding a third user's file is refused before anything changes; a service policy
/// is still refused as root.
#[test]
fn as_root_each_run_gets_a_fresh_account_that_holds_the_workspace_only_for_the_run() {
    let s = Surface::per_run();
    assert!(
        per_run_accounts(&s).is_empty(),
        "{:?}",
        per_run_accounts(&s)
    );
    std::fs::write(s.ws.join("before.txt"), "mine\n").unwrap();
    chown(&s.ws.join("before.txt"));
    let done = s.root_run(
        "stat -c '%u %a' /workspace/before.txt; grep -c . /etc/passwd 2>/dev/null || echo no-passwd; \
         echo made > /workspace/made.txt; cp /bin/true /workspace/suid; chmod 6755 /workspace/suid; \
         mkdir \"/workspace/$(printf 'raw\\377')\"; touch \"/workspace/$(printf 'raw\\377/\\033[31m\\377')\"; \
         cat /proc/self/status | grep -E '^(Uid|CapEff)'",
    );
    assert_eq!(done.code, 0, "{}\n{}", done.stderr, done.receipt);
    let user = &done.receipt["outputs"]["user"];
    let account = user["account"].as_str().unwrap().to_owned();
    assert!(account.starts_with("cordon-"), "{user}");
    let uid = user["host_uid"].as_u64().unwrap();
    assert!((3_100_000..=3_199_999).contains(&uid), "{user}");
    assert!(
        done.stdout().contains("CapEff:\t0000000000000000"),
        "{}",
        done.stdout()
    );
    // Inside, the workspace was the account's (mapped to the sandbox's only uid).
    assert!(done.stdout().starts_with("0 644\n"), "{}", done.stdout());
    // Afterwards everything is the owner's, set-id bits gone; the account and its state too
    // (names that are not UTF-8 and that hold escape sequences included).
    let raw = std::ffi::OsStr::from_bytes(b"raw\xff");
    let odd =
        s.ws.join(raw)
            .join(std::ffi::OsStr::from_bytes(b"\x1b[31m\xff"));
    for f in [
        Path::new("before.txt"),
        Path::new("made.txt"),
        Path::new("suid"),
        Path::new(""),
        Path::new(raw),
        &odd,
    ] {
        let m = std::fs::symlink_metadata(s.ws.join(f)).unwrap();
        assert_eq!((m.uid(), m.gid()), (SERVICE, SERVICE), "{}", f.display());
        assert_eq!(m.mode() & 0o6000, 0, "{}", f.display());
    }
    assert!(
        per_run_accounts(&s).is_empty(),
        "{:?}",
        per_run_accounts(&s)
    );
    for deny in ["/etc/cron.deny", "/etc/at.deny"] {
        let text = std::fs::read_to_string(deny).unwrap_or_default();
        assert!(!text.contains(&account), "{deny}");
    }
    let per_run = s.state.join("per-run");
    assert_eq!(std::fs::read_dir(&per_run).unwrap().count(), 0);
    // The receipt of record is root's: stored and signed with the surface's key.
    let key = s.as_root(&s.bin, &["key"]).output().unwrap();
    assert_eq!(key.status.code(), Some(0), "{key:?}");
    let verifier = s.dir.path().join("bin/cordon-verify");
    std::fs::copy(
        Path::new(env!("CARGO_BIN_EXE_cordon-surface")).with_file_name("cordon-verify"),
        &verifier,
    )
    .unwrap();
    let digest = cordon::receipt::Receipt::parse(&done.receipt.to_string())
        .unwrap()
        .digest()
        .unwrap()
        .to_string();
    let key = String::from_utf8(key.stdout).unwrap();
    let verify = Command::new(&verifier)
        .arg("--store")
        .arg(s.state.join("store"))
        .args(["--key", key.trim(), &digest])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{verify:?}");
    // Skills as root: imported into the surface's store, given to the account, seen read-only.
    let src = s.dir.path().join("lint");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("SKILL.md"), "LINT-SKILL\n").unwrap();
    let import = s
        .as_root(&s.bin, &["skills", "import", src.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(import.status.code(), Some(0), "{import:?}");
    let selected = String::from_utf8(import.stdout).unwrap().trim().to_owned();
    let ws = s.ws.to_str().unwrap();
    let out = s
        .as_root(
            &s.bin,
            &[
                "run",
                "--workspace",
                ws,
                "--skill",
                &selected,
                "--",
                "/bin/sh",
                "-c",
                "cat /skills/lint/SKILL.md; touch /skills/lint/x 2>/dev/null || echo read-only",
            ],
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let skilled: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(skilled["outputs"]["stdout"], "LINT-SKILL\nread-only\n");
    assert_eq!(skilled["inputs"]["skills"][0], selected.as_str());
    // A second run gets an account of its own again, and a failing command is rejected.
    let failed = s.root_run("exit 5");
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert!(per_run_accounts(&s).is_empty());
    // A third user's file in the workspace: refused before anything changes.
    std::fs::write(s.ws.join("roots.txt"), "root's\n").unwrap();
    let refused = s.root_run("touch /workspace/ran");
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert!(!s.ws.join("ran").exists());
    assert_eq!(std::fs::symlink_metadata(&s.ws).unwrap().uid(), SERVICE);
    assert_eq!(
        std::fs::symlink_metadata(s.ws.join("before.txt"))
            .unwrap()
            .uid(),
        SERVICE
    );
    assert!(per_run_accounts(&s).is_empty());
    std::fs::remove_file(s.ws.join("roots.txt")).unwrap();
    // A hard link to a file of the owner's outside: refused, the file never the account's.
    let outside = s.dir.path().join("owners-outside.txt");
    std::fs::write(&outside, "outside\n").unwrap();
    chown(&outside);
    std::fs::hard_link(&outside, s.ws.join("linked.txt")).unwrap();
    let linked = s.root_run("touch /workspace/ran");
    assert_eq!(linked.code, 3, "{}", linked.stderr);
    assert!(
        linked.stderr.contains("hard link outside"),
        "{}",
        linked.stderr
    );
    assert!(!s.ws.join("ran").exists());
    assert_eq!(std::fs::symlink_metadata(&outside).unwrap().uid(), SERVICE);
    std::fs::remove_file(s.ws.join("linked.txt")).unwrap();
    // The service policy's surface is never run as root.
    let service = Surface::new(&|t| t);
    let out = service
        .as_root(
            &service.bin,
            &[
                "run",
                "--workspace",
                service.ws.to_str().unwrap(),
                "--",
                "/bin/true",
            ],
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // And a per-run policy is never run by a plain user.
    let plain = s
        .command(
            &s.policy,
            &[
                "run",
                "--workspace",
                s.ws.to_str().unwrap(),
                "--",
                "/bin/true",
            ],
            &[],
        )
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(2), "{plain:?}");
}

/// A per-run run whose root supervisor was killed: its account holds the workspace until
/// `cordon-reap --surface` as root recovers it — the account's runs released as the account,
/// the workspace returned, the account removed. Until then no per-run run starts.
#[test]
fn cordon_reap_as_root_removes_a_crashed_per_run_account_and_returns_the_workspace() {
    let s = Surface::per_run();
    let ws = s.ws.to_str().unwrap().to_owned();
    let mut root = s
        .as_root(
            &s.bin,
            &[
                "run",
                "--workspace",
                &ws,
                "--",
                "/bin/sh",
                "-c",
                "touch /workspace/up; exec sleep 3175",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&s.ws.join("up"), "the per-run command to start");
    root.kill().unwrap();
    root.wait().unwrap();
    let account = per_run_accounts(&s);
    assert_eq!(account.len(), 1, "{account:?}");
    // The account's own surface lives on until its run ends: kill it, as a crash would.
    let _ = Command::new("pkill")
        .args(["-KILL", "-u", &account[0]])
        .status();
    assert_ne!(std::fs::symlink_metadata(&s.ws).unwrap().uid(), SERVICE);
    // A new run refuses while the earlier one is not recovered.
    let blocked = s.root_run("touch /workspace/ran");
    assert_eq!(blocked.code, 3, "{}", blocked.stderr);
    assert!(!s.ws.join("ran").exists());
    let check = s
        .as_root(&s.reaper, &["--surface", "--check"])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(3), "{check:?}");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let out = s.as_root(&s.reaper, &["--surface"]).output().unwrap();
        if out.status.code() == Some(0) {
            break;
        }
        assert!(Instant::now() < until, "{out:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(per_run_accounts(&s).is_empty());
    assert!(!process_exists(&["sleep", "3175"]));
    for f in ["", "up"] {
        assert_eq!(
            std::fs::symlink_metadata(s.ws.join(f)).unwrap().uid(),
            SERVICE,
            "{f}"
        );
    }
    let check = s
        .as_root(&s.reaper, &["--surface", "--check"])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "{check:?}");
    let again = s.root_run("echo again");
    assert_eq!(again.code, 0, "{}", again.stderr);
    // Root acts on nothing another user could have written: a policy writable by others is
    // refused by both.
    chmod(&s.policy, 0o666);
    let out = s.as_root(&s.reaper, &["--surface"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(s.root_run("echo refused").code, 2);
}

/// The limits' probes: one holds 400 MB of memory, one fills /tmp with 400 MB, one starts 150
/// processes.
const HOG: &str = "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo held ${#x}";
const FILL: &str = "head -c 400000000 /dev/zero > /tmp/fill && echo filled";
const FORKS: &str = "i=0; while [ $i -lt 150 ]; do sleep 30 & i=$((i+1)); done; echo spawned $i";

/// The example policy with a memory limit of 256 MiB and a pids limit of 64.
fn with_limits(t: String) -> String {
    cordon_testkit::replace_once(
        &t,
        "    nofile 1024\n",
        "    nofile 1024\n    memory \"256MiB\"\n    pids 64\n",
    )
}

/// Each probe met its limit: the memory was never held, the processes could not all start.
fn held_to_limits(hog: &Done, forks: &Done) {
    assert!(
        !hog.stdout().contains("held"),
        "{}\n{}",
        hog.stderr,
        hog.receipt
    );
    assert!(
        !forks.stdout().contains("spawned"),
        "{}\n{}",
        forks.stderr,
        forks.receipt
    );
    let said = forks.receipt["outputs"]["stderr"].as_str().unwrap_or("");
    assert!(said.contains("Cannot fork"), "{}", forks.receipt);
}

/// Each probe did what it set out to.
fn within_no_limits(hog: &Done, forks: &Done) {
    assert!(
        hog.stdout().contains("held 400000000"),
        "{}\n{}",
        hog.stderr,
        hog.receipt
    );
    assert!(
        forks.stdout().contains("spawned 150"),
        "{}\n{}",
        forks.stderr,
        forks.receipt
    );
}

/// The run cgroups of the surface's per-run accounts left on the host (v1 memory and pids, or v2).
fn surface_cgroups() -> Vec<String> {
    [
        "memory/cordon-surface",
        "pids/cordon-surface",
        "cordon-surface",
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(Path::new("/sys/fs/cgroup").join(d)).ok())
    .flatten()
    .filter_map(Result::ok)
    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
    .map(|e| e.path().display().to_string())
    .collect()
}

/// Limits as root: under `user "per-run"` the account's whole run is held in a cgroup root
/// prepared (the rootless runtime cannot set limits), so a run that holds more memory than the
/// policy's is OOM-killed (the receipt counts it) and one that starts more processes than its
/// pids limit cannot; the same probes succeed with only the limits removed; no run's cgroup is
/// left on the host.
#[test]
fn as_root_a_per_run_run_is_held_to_the_policys_memory_and_pids_limits() {
    let before = surface_cgroups();
    let limited = Surface::per_run_with(&with_limits);
    // Pages of the sandbox's /tmp (512 MiB) count against the limit and belong to no process:
    // the kernel still kills in the sandbox, never the account's surface, which ends the run
    // as the command's failure with nothing left.
    let fill = limited.root_run(FILL);
    assert_eq!(fill.code, 1, "{}\n{}", fill.stderr, fill.receipt);
    assert!(!fill.stdout().contains("filled"), "{}", fill.receipt);
    assert!(
        fill.receipt["outputs"]["limits"]["oom_kills"]
            .as_u64()
            .unwrap()
            >= 1,
        "{}",
        fill.receipt
    );
    assert!(per_run_accounts(&limited).is_empty());
    let (hog, forks) = (limited.root_run(HOG), limited.root_run(FORKS));
    held_to_limits(&hog, &forks);
    let limits = &hog.receipt["outputs"]["limits"];
    assert_eq!(limits["memory_bytes"], 256 << 20, "{}", hog.receipt);
    assert_eq!(limits["pids"], 64, "{}", hog.receipt);
    assert!(
        limits["oom_kills"].as_u64().unwrap() >= 1,
        "{}",
        hog.receipt
    );
    assert_eq!(surface_cgroups(), before);
    assert!(per_run_accounts(&limited).is_empty());

    // The same probes, the limits alone removed: both succeed, and no cgroup is made.
    let free = Surface::per_run();
    let (hog, forks) = (free.root_run(HOG), free.root_run(FORKS));
    within_no_limits(&hog, &forks);
    assert!(free.root_run(FILL).stdout().contains("filled"));
    assert!(
        hog.receipt["outputs"].get("limits").is_none(),
        "{}",
        hog.receipt
    );
    assert_eq!(surface_cgroups(), before);
}

/// A cgroup v2 subtree delegated to the service user as systemd's `Delegate=yes` leaves one:
/// `/sys/fs/cgroup/<name>` and its `cgroup.procs`, `cgroup.subtree_control` and
/// `cgroup.threads` the user's, the service's processes in its leaf `hub`. Removed on drop.
struct Delegated {
    dir: PathBuf,
}

impl Delegated {
    fn new() -> Self {
        let root = Path::new("/sys/fs/cgroup");
        assert!(
            root.join("cgroup.controllers").exists() && !root.join("memory").exists(),
            "needs a host on cgroup v2 alone (/sys/fs/cgroup/cgroup.controllers, no v1 hierarchies): checks/cgroup2.sh"
        );
        std::fs::write(root.join("cgroup.subtree_control"), "+memory +pids").unwrap();
        let dir = root.join(format!("cordon-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(dir.join("hub")).unwrap();
        let d = Self { dir };
        d.delegate(true);
        d
    }

    /// Give the subtree to the service user, or take it back.
    fn delegate(&self, to_service: bool) {
        let id = if to_service { SERVICE } else { 0 };
        for p in [
            "",
            "cgroup.procs",
            "cgroup.subtree_control",
            "cgroup.threads",
        ] {
            std::os::unix::fs::chown(self.dir.join(p), Some(id), Some(id)).unwrap();
        }
    }

    /// `command`, started in the subtree's leaf (as systemd starts the service there).
    fn start_in(&self, command: &Command) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(self.dir.join("hub/cgroup.procs"))
            .arg(command.get_program())
            .args(command.get_args())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/");
        c
    }

    /// The runs' cgroups left in the subtree.
    fn runs_left(&self) -> Vec<String> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("cordon-"))
            .collect()
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(self.dir.join("hub"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Limits as the service user, on a host that delegates it a cgroup v2 subtree: the rootless
/// runtime sets them in the run's own cgroup below it, the surface checks from outside that the
/// container is there with the limits asked for, a run over its memory is OOM-killed (the meta
/// record says so) and one past its pids limit cannot fork; with the subtree taken back the same
/// policy is refused before anything runs, and with only the limits removed both probes succeed.
/// No run's cgroup is left. CI's hosts are cgroup v1, where this cannot run: `checks/cgroup2.sh`
/// runs it on a cgroup v2 host.
#[test]
#[ignore = "needs a cgroup v2 host: checks/cgroup2.sh"]
fn as_the_service_user_limits_are_set_in_a_delegated_cgroup_v2_subtree() {
    let delegated = Delegated::new();
    let run = |s: &Surface, script: &str| {
        let args = s.run_args(&s.policy, &s.ws, "command", script);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = delegated
            .start_in(&s.command(&s.policy, &args, &[]))
            .output()
            .unwrap();
        Done {
            code: out.status.code().unwrap_or(-1),
            receipt: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let limited = Surface::new(&with_limits);
    let (hog, forks) = (run(&limited, HOG), run(&limited, FORKS));
    held_to_limits(&hog, &forks);
    let meta = &hog.receipt["outputs"]["meta"];
    assert_eq!(meta["oom_killed"], true, "{}", hog.receipt);
    assert!(
        delegated.runs_left().is_empty(),
        "{:?}",
        delegated.runs_left()
    );
    limited.assert_released();

    // The subtree taken back: the same policy is refused, and nothing runs.
    delegated.delegate(false);
    let done = run(&limited, "touch /workspace/ran");
    assert_eq!(done.code, 3, "{}", done.stderr);
    assert!(done.stderr.contains("Delegate=yes"), "{}", done.stderr);
    assert!(!limited.ws.join("ran").exists());
    delegated.delegate(true);

    // Only the limits removed: both probes succeed.
    let free = Surface::new(&|t| t);
    within_no_limits(&run(&free, HOG), &run(&free, FORKS));
    assert!(
        delegated.runs_left().is_empty(),
        "{:?}",
        delegated.runs_left()
    );
}

/// The account's surface does nothing until root releases it (after placing it in the run's
/// cgroup): with its stdin closed, or anything but the release byte on it, it ends at once as
/// a no-decision, before it reads its policy or touches its workspace.
#[test]
fn a_per_run_surface_that_root_did_not_release_does_nothing() {
    use std::io::Write as _;
    let s = Surface::per_run();
    let state = s.state.join("per-run/cordon-unreleased");
    let ws = s.ws.to_str().unwrap().to_owned();
    let args = [
        "--per-run-state",
        state.to_str().unwrap(),
        "run",
        "--workspace",
        &ws,
        "--",
        "/bin/sh",
        "-c",
        "touch /workspace/ran",
    ];
    for (given, why) in [(None, "did not release"), (Some(b"x"), "unknown byte")] {
        let mut c = s
            .command(&s.policy, &args, &[])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = c.stdin.take().unwrap();
        if let Some(b) = given {
            stdin.write_all(b).unwrap();
        }
        drop(stdin);
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(why),
            "{out:?}"
        );
        assert!(out.stdout.is_empty() && !s.ws.join("ran").exists());
    }
}
