//! The ablation suite: each containment control of the prebuild stage, proved by an attempt from
//! inside that the planned bundle must block **and** that must succeed when exactly that control
//! is taken away. A probe blocked both ways is *confounded* (something else stopped it, so it
//! proves nothing about its control) and fails the test, as does one the plan does not block.
//!
//! Every run is a real [`Session`] (lease, account, host mounts, runc, release, absence check)
//! of the default policy, pinned to a test image. The only difference between the two runs of a
//! control is a test-only transformation applied at the host seam, never a switch in product
//! code: the real host, [`Interposed`], when the session spawns `runc create`, rewrites
//! the bundle's `config.json` (or, for the host-mounted bounds, drops the size options of one
//! tmpfs mount). Where a control can only be removed together with another (the kernel refuses
//! the bundle otherwise) the ablation says so.
//!
//! The attempts are one static C program (testkit's `probes/attempt.c`), so a probe depends on
//! no applet name or library of the image, and each target is made usable by the run account
//! first (a world-writable file in the read-only root, a writable file in the read-only tree), so
//! permissions cannot stand in for the control. This property is part of cordon's proof (README,
//! "What the tests prove").

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use common::World;
use cordon::host::MountRequest;
use cordon::host::fake::Interposed;
use cordon_testkit::blind::Blind;
use cordon_testkit::mount_mut;
use serde_json::{Value, json};

/// One way to take a control away.
#[derive(Clone, Copy)]
enum Ablation {
    /// Rewrite the bundle's `config.json`.
    Bundle(fn(&mut Value)),
    /// Mount the lease's tmpfs whose mount point ends with this name without its size and inode
    /// bounds.
    Unbounded(&'static str),
    /// Ask the runtime to pass the supervisor's descriptors up to this one to the container
    /// (`runc create --preserve-fds`): what a supervisor that leaked them to its runtime, and a
    /// runtime that kept them, would do.
    Inherited(i32),
}

/// One control: the attempts that prove it, what the plan must answer, and its removal.
struct Control {
    name: &'static str,
    /// Shell lines running `/bin/attempt …`; each prints one `NAME=…` line.
    attempts: String,
    /// The exact output of the attempts under the planned bundle.
    planned: String,
    ablation: Ablation,
    /// Applied to the planned run too, when the kernel couples this control to another: the
    /// planned run then differs from the ablated one in this control alone.
    base: Option<Ablation>,
}

/// The real host with `ablation` (if any) applied at the seam; `applied` counts how often.
fn interposed(ablation: Option<Ablation>, applied: &Arc<AtomicU32>) -> Interposed {
    let on_spawn = applied.clone();
    let on_mount = applied.clone();
    // What the outside posture check is shown once a bundle was rewritten (`Blind`).
    let blind: Arc<Mutex<Option<Blind>>> = Arc::default();
    let shown = blind.clone();
    Interposed::new()
        .rewriting_reads(move |path, bytes| match &*shown.lock().unwrap() {
            Some(b) => b.shown(path, bytes),
            None => bytes,
        })
        .rewriting_spawns(move |tool| {
            let mut tool = tool.clone();
            let create = tool.args.iter().position(|a| a == "create");
            if let (Some(at), Some(i)) = (create, tool.args.iter().position(|a| a == "--bundle")) {
                if ablation.is_some() {
                    *blind.lock().unwrap() = Blind::at_create(&tool.args);
                }
                prepare(Path::new(&tool.args[i + 1]), ablation, &on_spawn);
                if let Some(Ablation::Inherited(fd)) = ablation {
                    let extra = (fd - 2).to_string();
                    tool.args
                        .splice(at + 1..at + 1, ["--preserve-fds".into(), extra.into()]);
                    on_spawn.fetch_add(1, Ordering::SeqCst);
                }
            }
            tool
        })
        .rewriting_mounts(move |request| match (ablation, request) {
            (Some(Ablation::Unbounded(name)), MountRequest::Tmpfs { target, options })
                if target.file_name().is_some_and(|n| n == name) =>
            {
                on_mount.fetch_add(1, Ordering::SeqCst);
                MountRequest::Tmpfs {
                    target: target.clone(),
                    options: options
                        .split(',')
                        .filter(|o| !o.starts_with("size=") && !o.starts_with("nr_inodes="))
                        .collect::<Vec<_>>()
                        .join(","),
                }
            }
            _ => request.clone(),
        })
}

/// Before `runc create`: make the tree's file writable by anyone (so only the read-only bind
/// can refuse a write), then apply a bundle ablation.
fn prepare(bundle: &Path, ablation: Option<Ablation>, applied: &AtomicU32) {
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let engine = mount_mut(&mut config, "/engine")["source"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::set_permissions(
        Path::new(&engine).join("build.sh"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    if let Some(Ablation::Bundle(f)) = ablation {
        f(&mut config);
        applied.fetch_add(1, Ordering::SeqCst);
    }
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
}

/// Replace mount option `from` of the mount at `destination` by `to` (or drop it).
fn mount_option(config: &mut Value, destination: &str, from: &str, to: Option<&str>) {
    let options = mount_mut(config, destination)["options"]
        .as_array_mut()
        .unwrap();
    let at = options
        .iter()
        .position(|o| o == from)
        .unwrap_or_else(|| panic!("{destination} has no option {from}"));
    match to {
        Some(to) => options[at] = json!(to),
        None => {
            options.remove(at);
        }
    }
}

/// Remove `key` from the object at `pointer`, which must hold it.
fn remove(config: &mut Value, pointer: &str, key: &str) {
    let removed = config
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .and_then(|o| o.remove(key));
    assert!(removed.is_some(), "the bundle has no {pointer}/{key}");
}

/// Add `cap` to each of the capability `sets`.
fn grant(config: &mut Value, cap: &str, sets: &[&str]) {
    for set in sets {
        config["process"]["capabilities"][set]
            .as_array_mut()
            .unwrap()
            .push(json!(cap));
    }
}

/// Drop the namespace `kind` from the bundle.
fn share_namespace(config: &mut Value, kind: &str) {
    let spaces = config["linux"]["namespaces"].as_array_mut().unwrap();
    let before = spaces.len();
    spaces.retain(|n| n["type"] != kind);
    assert_eq!(spaces.len() + 1, before, "no {kind} namespace planned");
}

/// Drop the argument conditions of the seccomp rules for `syscall`.
fn unconditional(config: &mut Value, syscall: &str) {
    let mut n = 0;
    for rule in config["linux"]["seccomp"]["syscalls"]
        .as_array_mut()
        .unwrap()
    {
        if rule["names"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == syscall)
        {
            n += usize::from(rule.as_object_mut().unwrap().remove("args").is_some());
        }
    }
    assert!(n > 0, "no conditional rule for {syscall}");
}

/// Run `attempts` in one session of the prebuild stage, with `ablation` applied at the host
/// seam, and return the attempt lines. Afterwards the executor must be quiescent.
fn run(w: &World, slot: u32, ablation: Option<Ablation>, attempts: &str) -> String {
    let policy = common::policy(w, "stage-ablation", slot);
    let applied = Arc::new(AtomicU32::new(0));
    let host = Arc::new(interposed(ablation, &applied));
    let setup = common::setup(w, &policy, &format!("ablation-{slot}"), host);
    let out = common::run(w, &policy, &setup, attempts).unwrap();
    if ablation.is_some() {
        assert_eq!(
            applied.load(Ordering::SeqCst),
            1,
            "the ablation was not applied exactly once"
        );
    }
    let left = common::left(w, &setup);
    assert!(
        left.is_empty(),
        "not quiescent after {attempts:?}: {left:?}"
    );
    out
}

/// Prove each control: blocked as planned, unblocked with only it removed. Every failure is
/// collected, so one run names every confounded or unblocked probe.
fn prove(slot: u32, controls: &[Control]) {
    let w = common::world();
    let mut failures = Vec::new();
    for c in controls {
        let planned = run(&w, slot, c.base, &c.attempts);
        if planned != c.planned {
            failures.push(format!(
                "{}: the planned bundle must answer\n{}but answered\n{planned}",
                c.name, c.planned
            ));
        }
        let ablated = run(&w, slot, Some(c.ablation), &c.attempts);
        let lines: Vec<&str> = ablated.lines().collect();
        if lines.len() != c.planned.lines().count() || !lines.iter().all(|l| l.ends_with("=ok")) {
            failures.push(format!(
                "{}: confounded — with only this control removed the attempts still fail, so \
                 they prove nothing about it:\n{ablated}",
                c.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every path the prebuild masks that this host has and would show the run account — a file
/// every uid may read with content, a directory every uid may list with entries — read from
/// inside: empty as planned, its content with the masks removed. Left out, each for its
/// reason: paths this kernel lacks, `/sys` ones (the prebuild mounts no `/sys`), files only
/// root may read (the run account is refused by their mode, masked or not), empty
/// directories, and `/proc/keys` (it lists only the reader's own keys, and the run account has
/// none).
fn masked_paths() -> Control {
    let mut attempts = Vec::new();
    let mut planned = String::new();
    let masked = cordon_stage::oci::MASKED_PATHS
        .iter()
        .chain(&cordon_stage::oci::MASKED_IN_PREBUILD)
        .chain(&cordon_stage::oci::MASKED_WITHOUT_GPU);
    for p in masked {
        let path = Path::new(p);
        let Ok(m) = std::fs::metadata(path) else {
            continue;
        };
        let others = m.permissions().mode();
        if p.starts_with("/sys/") || *p == "/proc/keys" {
            continue;
        }
        if m.is_dir() {
            let entries = std::fs::read_dir(path).map_or(0, Iterator::count);
            if others & 0o005 == 0o005 && entries > 0 {
                attempts.push(format!("/bin/attempt masked-dir {p}"));
                planned.push_str("masked-dir=blocked:0\n");
            }
        } else {
            let mut buf = [0u8; 64];
            let has = std::fs::File::open(path)
                .and_then(|mut f| std::io::Read::read(&mut f, &mut buf))
                .is_ok_and(|n| n > 0);
            if others & 0o004 != 0 && has {
                attempts.push(format!("/bin/attempt masked {p}"));
                planned.push_str("masked=blocked:0\n");
            }
        }
    }
    // The probe is worth something only if it reaches most of them: on this project's hosts,
    // ten files and /proc/pressure.
    assert!(
        attempts.len() >= 8,
        "only {attempts:?} of the masked paths can be probed on this host"
    );
    Control {
        name: "masked paths",
        base: None,
        attempts: attempts.join("; "),
        planned,
        ablation: Ablation::Bundle(|c| c["linux"]["maskedPaths"] = json!([])),
    }
}

#[test]
fn filesystem_controls_are_each_proved_by_ablation() {
    // Read-only paths are looked for where the host has them (this kernel has no sysrq).
    for d in ["/proc/sys", "/proc/fs", "/proc/irq", "/proc/bus"] {
        assert!(
            Path::new(d).is_dir(),
            "{d} is missing on this host: the read-only-path observation proves nothing"
        );
    }
    prove(
        0,
        &[
            Control {
                name: "read-only root",
                base: None,
                attempts: "/bin/attempt write /probe/writable".into(),
                planned: "write=blocked:30\n".into(),
                ablation: Ablation::Bundle(|c| c["root"]["readonly"] = json!(false)),
            },
            Control {
                name: "read-only tree bind",
                base: None,
                attempts: "/bin/attempt write /engine/build.sh".into(),
                planned: "write=blocked:30\n".into(),
                ablation: Ablation::Bundle(|c| mount_option(c, "/engine", "ro", Some("rw"))),
            },
            Control {
                name: "noexec /tmp",
                base: None,
                attempts: "/bin/attempt exec /tmp".into(),
                planned: "exec=blocked:13\n".into(),
                ablation: Ablation::Bundle(|c| mount_option(c, "/tmp", "noexec", None)),
            },
            masked_paths(),
            Control {
                name: "read-only paths (the mount table: no uid but 0 can write there)",
                base: None,
                attempts: "for p in /proc/sys /proc/fs /proc/irq /proc/bus; do \
                           /bin/attempt ro-mount $p; done"
                    .into(),
                planned: "ro-mount=blocked:0\nro-mount=blocked:0\nro-mount=blocked:0\nro-mount=blocked:0\n".into(),
                ablation: Ablation::Bundle(|c| c["linux"]["readonlyPaths"] = json!([])),
            },
            Control {
                name: "the per-run account",
                base: None,
                attempts: "/bin/attempt read /probe/secret".into(),
                planned: "read=blocked:13\n".into(),
                ablation: Ablation::Bundle(|c| {
                    c["process"]["user"] = json!({"uid": 0, "gid": 0, "additionalGids": []});
                }),
            },
        ],
    );
}

#[test]
fn privilege_controls_are_each_proved_by_ablation() {
    prove(
        1,
        &[
            Control {
                name: "no-new-privileges",
                base: None,
                attempts: "/bin/attempt setuid /bin/attempt-suid".into(),
                planned: "setuid=blocked:1\n".into(),
                ablation: Ablation::Bundle(|c| c["process"]["noNewPrivileges"] = json!(false)),
            },
            Control {
                name: "empty bounding set",
                base: None,
                attempts: "/bin/attempt cap CapBnd".into(),
                planned: "cap=blocked:0\n".into(),
                ablation: Ablation::Bundle(|c| grant(c, "CAP_CHOWN", &["bounding"])),
            },
            Control {
                // The kernel admits an inheritable capability only from the bounding set.
                name: "empty inheritable set (with the bounding set it needs)",
                // The planned run has the bounding capability: only inheritable differs.
                base: Some(Ablation::Bundle(|c| grant(c, "CAP_CHOWN", &["bounding"]))),
                attempts: "/bin/attempt cap CapInh".into(),
                planned: "cap=blocked:0\n".into(),
                ablation: Ablation::Bundle(|c| grant(c, "CAP_CHOWN", &["bounding", "inheritable"])),
            },
            Control {
                // A non-root process keeps after execve only what is ambient, and ambient needs
                // the capability permitted and inheritable: the sets fall together.
                name: "empty ambient, effective and permitted sets",
                // The planned run has bounding and inheritable: only these three differ.
                base: Some(Ablation::Bundle(|c| {
                    grant(c, "CAP_CHOWN", &["bounding", "inheritable"]);
                })),
                attempts: "/bin/attempt chown /tmp; /bin/attempt cap CapEff; \
                           /bin/attempt cap CapPrm; /bin/attempt cap CapAmb"
                    .into(),
                planned: "chown=blocked:1\ncap=blocked:0\ncap=blocked:0\ncap=blocked:0\n".into(),
                ablation: Ablation::Bundle(|c| {
                    grant(
                        c,
                        "CAP_CHOWN",
                        &[
                            "bounding",
                            "inheritable",
                            "permitted",
                            "effective",
                            "ambient",
                        ],
                    );
                }),
            },
        ],
    );
}

#[test]
fn seccomp_rule_classes_are_each_proved_by_ablation() {
    prove(
        2,
        &[
            Control {
                name: "default action (a call no capability gates)",
                base: None,
                attempts: "/bin/attempt syscall".into(),
                planned: "syscall=blocked:1\n".into(),
                ablation: Ablation::Bundle(|c| {
                    let seccomp = &mut c["linux"]["seccomp"];
                    seccomp["defaultAction"] = json!("SCMP_ACT_ALLOW");
                    // An errno goes with an errno action only (crun refuses it with allow).
                    seccomp.as_object_mut().unwrap().remove("defaultErrnoRet");
                }),
            },
            Control {
                name: "a call the allow-list leaves out (pidfd_getfd on its own child)",
                base: None,
                attempts: "/bin/attempt removed".into(),
                planned: "removed=blocked:1\n".into(),
                ablation: Ablation::Bundle(|c| {
                    c["linux"]["seccomp"]["syscalls"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"action": "SCMP_ACT_ALLOW", "names": ["pidfd_getfd"]}));
                }),
            },
            Control {
                name: "socket family condition",
                base: None,
                attempts: "/bin/attempt socket".into(),
                planned: "socket=blocked:1\n".into(),
                ablation: Ablation::Bundle(|c| unconditional(c, "socket")),
            },
            Control {
                name: "clone flag condition",
                base: None,
                attempts: "/bin/attempt clone".into(),
                planned: "clone=blocked:1\n".into(),
                ablation: Ablation::Bundle(|c| unconditional(c, "clone")),
            },
            Control {
                name: "architecture (an i386 call is killed)",
                base: None,
                attempts: "/bin/attempt arch".into(),
                planned: "arch=blocked:1031\n".into(),
                ablation: Ablation::Bundle(|c| {
                    c["linux"]["seccomp"]["architectures"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!("SCMP_ARCH_X86"));
                }),
            },
        ],
    );
}

#[test]
fn resource_limits_are_each_proved_by_ablation() {
    prove(
        3,
        &[
            Control {
                name: "pids limit",
                base: None,
                attempts: "/bin/attempt pids 64".into(),
                planned: "pids=blocked:11\n".into(),
                ablation: Ablation::Bundle(|c| remove(c, "/linux/resources", "pids")),
            },
            Control {
                name: "memory limit",
                base: None,
                attempts: "/bin/attempt memory 384".into(),
                planned: "memory=blocked:1009\n".into(),
                ablation: Ablation::Bundle(|c| remove(c, "/linux/resources", "memory")),
            },
            Control {
                name: "CPU quota",
                base: None,
                // 150 ms of CPU under 0.1 CPU is ~14 stops of ~90 ms, one per period; host
                // load alone does not stop a spinning process for a period 5 times over.
                attempts: "/bin/attempt cpu 150 5".into(),
                planned: "cpu=blocked:0\n".into(),
                ablation: Ablation::Bundle(|c| remove(c, "/linux/resources", "cpu")),
            },
            Control {
                name: "staging bytes and inodes",
                base: None,
                attempts: "/bin/attempt fill /staging/big 2097152; /bin/attempt files /staging 100"
                    .into(),
                planned: "fill=blocked:28\nfiles=blocked:28\n".into(),
                ablation: Ablation::Unbounded("staging"),
            },
            Control {
                name: "tmp bytes",
                base: None,
                attempts: "/bin/attempt fill /tmp/big 16777216".into(),
                planned: "fill=blocked:28\n".into(),
                ablation: Ablation::Unbounded("tmp"),
            },
        ],
    );
}

/// Removes the host's shared memory segment it made, whatever the test's outcome.
struct Segment(String);

impl Drop for Segment {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ipcrm")
            .args(["-m", &self.0])
            .status();
    }
}

#[test]
fn namespaces_and_the_environment_are_each_proved_by_ablation() {
    // The host listens on its loopback; the host holds a world-readable System V segment; the
    // supervisor's environment holds a variable the container must never see.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    cordon_testkit::require_executable(
        Path::new("/usr/bin/ipcmk"),
        "apt-get install -y util-linux",
    );
    let made = std::process::Command::new("ipcmk")
        .args(["-M", "4096", "-p", "0666"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&made.stdout);
    let segment = Segment(
        text.trim()
            .rsplit(' ')
            .next()
            .filter(|id| id.parse::<u32>().is_ok())
            .unwrap_or_else(|| panic!("ipcmk made no segment: {text}"))
            .to_owned(),
    );
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "the supervisor's environment has no CARGO_MANIFEST_DIR to leak: run under cargo"
    );
    // A host file the supervisor holds open without close-on-exec, so every process it spawns
    // (the runtime included) inherits it: the container must not.
    let leaked = std::fs::File::open("/etc/hostname").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    nix::fcntl::fcntl(
        &leaked,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    prove(
        4,
        &[
            Control {
                name: "no descriptor of the supervisor's reaches the container",
                base: None,
                attempts: format!("/bin/attempt fd {fd}"),
                planned: "fd=blocked:9\n".into(),
                ablation: Ablation::Inherited(fd),
            },
            Control {
                name: "network none",
                base: None,
                attempts: format!("/bin/attempt connect {port}"),
                planned: "connect=blocked:111\n".into(),
                ablation: Ablation::Bundle(|c| share_namespace(c, "network")),
            },
            Control {
                name: "private IPC namespace",
                base: None,
                attempts: format!("/bin/attempt shm {}", segment.0),
                planned: "shm=blocked:22\n".into(),
                ablation: Ablation::Bundle(|c| share_namespace(c, "ipc")),
            },
            Control {
                name: "the environment is the policy's, not the supervisor's",
                base: None,
                attempts: "/bin/attempt env CARGO_MANIFEST_DIR".into(),
                planned: "env=blocked:0\n".into(),
                ablation: Ablation::Bundle(|c| {
                    let env = c["process"]["env"].as_array_mut().unwrap();
                    env.extend(std::env::vars().map(|(k, v)| json!(format!("{k}={v}"))));
                }),
            },
        ],
    );
    // Outside: exactly one connection reached the host, the ablated run's.
    assert!(
        listener.accept().is_ok(),
        "the ablated connect never arrived"
    );
    assert!(
        listener.accept().is_err(),
        "the planned run reached the host's listener"
    );
    drop(leaked);
}

/// The outside posture check itself, proved the same way: each flag it reads, removed from the
/// bundle alone and the check not blinded, is refused before the workload runs — a
/// no-decision naming the difference that quarantines the executor (each case under an
/// executor of its own) — while the planned bundle passes it (every test above).
#[test]
fn the_outside_posture_check_refuses_each_flag_the_runtime_was_given_otherwise() {
    let w = common::world();
    let policy = common::policy(&w, "stage-ablation", 5);
    type Rewrite = fn(&mut Value);
    let cases: [(&str, Rewrite); 10] = [
        // Under crun, which installs the filter only as its init execs the entrypoint, this is
        // read at the start gate: the attempt never runs either way.
        ("seccomp", |c| c["linux"]["seccomp"] = Value::Null),
        ("mount /: rw, not ro", |c| {
            c["root"]["readonly"] = json!(false)
        }),
        ("mount /engine: rw, not ro", |c| {
            mount_option(c, "/engine", "ro", Some("rw"));
        }),
        ("mount /tmp: without noexec", |c| {
            mount_option(c, "/tmp", "noexec", None);
        }),
        ("mount /engine: without nosuid", |c| {
            mount_option(c, "/engine", "nosuid", None);
        }),
        ("uids", |c| {
            c["process"]["user"] = json!({"uid": 0, "gid": 0, "additionalGids": []});
        }),
        ("no_new_privs", |c| {
            c["process"]["noNewPrivileges"] = json!(false)
        }),
        ("CapBnd", |c| grant(c, "CAP_CHOWN", &["bounding"])),
        ("namespaces", |c| {
            share_namespace(c, "network");
        }),
        ("namespaces", |c| {
            share_namespace(c, "ipc");
        }),
    ];
    let mut failures = Vec::new();
    for (i, (difference, ablate)) in cases.into_iter().enumerate() {
        let executor = format!("posture-{i}");
        let host = Interposed::new().rewriting_spawns(move |tool| {
            if tool.args.iter().any(|a| a == "create")
                && let Some(at) = tool.args.iter().position(|a| a == "--bundle")
            {
                let path = Path::new(&tool.args[at + 1]).join("config.json");
                let mut config: Value =
                    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                ablate(&mut config);
                std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
            }
            tool.clone()
        });
        let setup = common::setup(&w, &policy, &executor, Arc::new(host));
        match common::run(&w, &policy, &setup, "/bin/attempt write /probe/writable") {
            Err(cordon_stage::session::SessionError::Posture { why })
                if why.starts_with(difference)
                    && why.contains(&format!("executor {executor} quarantined (containment")) => {}
            other => failures.push(format!("{difference}: {other:?}")),
        }
        let left = common::left(&w, &setup);
        assert!(left.is_empty(), "{executor}: not quiescent: {left:?}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
