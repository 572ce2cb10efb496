//! Hostile build steps. Each case is attempted from inside the registered build step (its
//! results written into the staging area, so they come back in the publication), its outcome
//! checked inside and outside, and after every case the executor is quiescent.
//!
//! The build step is the tree's `build.sh`, run as the bounded child of the image's registered
//! patcher (`/bin/sh /cordon/patchers/native-rebuild`, which runs `/bin/sh /engine/build.sh
//! /staging`) in the pinned prebuild image (static busybox; applets are reached as
//! `busybox APPLET`). System calls are probed by a small static C program the
//! test compiles on the host and places in the tree.
//!
//! `CORPUS.md` beside this file maps every behaviour of the hostile corpus (sections A–F) to
//! the test that attempts it, and names the ones still open.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::Command;

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::Decision;
use cordon::store::Store;
use cordon::tree::{self, PUBLICATIONS};
use cordon_prebuild::prebuild::{Config, Outcome, Published, prebuild};
use cordon_testkit::EditOnce as _;
use cordon_testkit::compile_static;

struct Env {
    dir: tempfile::TempDir,
    store: Store,
    policy: cordon_policy_lang::Policy,
    cfg: Config,
}

/// The default policy with the prebuild stage's bounds made small enough to hit quickly, its
/// own account range, cron/at files and a secret.
fn env(slot: u32) -> Env {
    env_with(slot, |t| t)
}

/// [`env`] with one more edit of the policy text.
fn env_with(slot: u32, edit: impl Fn(String) -> String) -> Env {
    env_in("prebuild-hostile", slot, edit)
}

/// The policy's stage deadline of `secs` seconds, as the tests write it (scaled on a slow
/// host: [`cordon_testkit::slowdown`]).
fn stage_deadline(secs: u64) -> String {
    format!("deadline \"{}s\"", secs * cordon_testkit::slowdown())
}

/// [`env_with`] in `owner`'s account slot.
fn env_in(owner: &str, slot: u32, edit: impl Fn(String) -> String) -> Env {
    assert!(
        nix::unistd::geteuid().is_root(),
        "hostile prebuild tests run real containers: run as root"
    );
    let _ = cordon_testkit::runc();
    let _ = cordon_testkit::busybox();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "TOPSECRET-KEY\n").unwrap();
    let text =
        cordon_testkit::isolated_policy(dir.path(), cordon_testkit::account_range(owner, slot))
            .replace_once("memory \"8GiB\"", "memory \"256MiB\"")
            .replace_once("pids 1024", "pids 64")
            .replace_once("deadline \"30m\"", &stage_deadline(8))
            .replace_once(
                "child cpus=4 memory=\"6GiB\" pids=768 deadline=\"25m\"",
                "child cpus=4 memory=\"192MiB\" pids=48 deadline=\"6s\"",
            )
            .replace_once(
                "staging size=\"4GiB\" inodes=200000",
                "staging size=\"1MiB\" inodes=64",
            )
            .replace_once(
                "tmp size=\"1GiB\" exec=#false",
                "tmp size=\"8MiB\" exec=#false",
            )
            .replace_once(
                "output stdout=\"4MiB\" stderr=\"4MiB\"",
                "output stdout=\"64KiB\" stderr=\"64KiB\"",
            )
            .replace_once(
                "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\"",
                "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\"\n    secret \"build-key\"",
            )
            + &format!(
                "\nsecret \"build-key\" path={:?}\n",
                secret.display().to_string()
            );
    let policy = cordon_policy_lang::parse("hostile.kdl", &edit(text)).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    cordon_testkit::prebuild_layout(&dir.path().join("images/prebuild"), |to| {
        let spec = cordon_image::spec::load(&cordon_testkit::prebuild_image_spec()).unwrap();
        cordon::image::build(&spec, to).unwrap();
    });
    // The executor names the host-wide lock and cgroup parent: one per owner and slot, so no
    // two tests running side by side share them.
    let executor = format!("{owner}-{slot}");
    let authority = Digest::of_bytes(executor.as_bytes());
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        &executor,
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    setup.runtime.binary = cordon_testkit::test_runtime().1;
    Manager::open(&store, setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    let runtime_version =
        cordon::identity::probe_runtime(&cordon::host::Linux, "runc", &setup.runtime.binary, None)
            .unwrap()
            .version;
    let cfg = Config {
        store: store.clone(),
        images: dir.path().join("images"),
        setup,
        authority,
        runtime_version,
        key_dir: std::path::PathBuf::from(cordon::signing::KEY_DIR),
        evidence: cordon_stage::evidence::Evidence::new(&store),
        exe: std::path::PathBuf::from(env!("CARGO_BIN_EXE_cordon-prebuild")),
    };
    Env {
        dir,
        store,
        policy,
        cfg,
    }
}

/// Register a tree holding `build.sh` (and any extra files), run the prebuild.
fn build(e: &Env, script: &str, extra: &[(&str, &Path)]) -> (Digest, Outcome) {
    let (tree, outcome) = try_build(e, script, extra);
    (tree, outcome.unwrap())
}

/// [`build`], keeping the prebuild's error.
fn try_build(
    e: &Env,
    script: &str,
    extra: &[(&str, &Path)],
) -> (
    Digest,
    Result<Outcome, cordon_prebuild::prebuild::PrebuildError>,
) {
    let src = tempfile::tempdir_in(e.dir.path()).unwrap();
    std::fs::write(
        src.path().join("cordon-incumbent.kdl"),
        "incumbent \"hostile\"\ntarget \"t\" path=\"t\"\n",
    )
    .unwrap();
    std::fs::create_dir(src.path().join("t")).unwrap();
    std::fs::write(src.path().join("t/keep"), "").unwrap();
    std::fs::write(
        src.path().join("build.sh"),
        format!("out=\"$1\"\n{script}\n"),
    )
    .unwrap();
    for (name, from) in extra {
        std::fs::copy(from, src.path().join(name)).unwrap();
    }
    let rules = e.policy.tree_rules();
    let tree = cordon_materialize::materialize::register_incumbent(&e.store, src.path(), &rules)
        .unwrap()
        .digest;
    (tree, run_step(e, &tree, "build-native"))
}

/// Prebuild `tree` with `step`; nothing of the run is left afterwards.
fn run_step(
    e: &Env,
    tree: &Digest,
    step: &str,
) -> Result<Outcome, cordon_prebuild::prebuild::PrebuildError> {
    let outcome = prebuild(&e.policy, &e.cfg, tree, step, true);
    let left = Manager::open(&e.store, e.cfg.setup.clone())
        .unwrap()
        .check()
        .unwrap();
    assert!(
        left.is_empty(),
        "not quiescent after {step} of {tree}: {left:?}; the step ended in {outcome:?}"
    );
    outcome
}

/// The text of `path` in a published outcome; the test fails if the step did not write it.
fn published(e: &Env, o: &Outcome, path: &str) -> String {
    match o {
        Decision::Accepted(Published { publication, .. }) => {
            let root = tree::root_in(&e.store, PUBLICATIONS, &publication.digest);
            // A missing file is a failed probe, never an empty (passing) answer.
            std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|e| panic!("the publication has no {path}: {e}"))
        }
        Decision::Rejected(r) => panic!("expected a publication, got {:?}", r.findings),
    }
}

fn rejected(o: &Outcome) -> &str {
    match o {
        Decision::Rejected(r) => r.code(),
        Decision::Accepted(_) => panic!("expected a rejection, got a publication"),
    }
}

#[test]
fn no_network_egress_tcp_udp_or_dns() {
    let e = env(1);
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tp, up) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    let script = format!(
        "busybox nc -w 2 127.0.0.1 {tp} </dev/null && echo tcp=yes >> $out/r || echo tcp=no >> $out/r\n\
         echo hello | busybox nc -u -w 1 127.0.0.1 {up} ; echo udp-sent >> $out/r\n\
         busybox nslookup example.com >/dev/null 2>&1 && echo dns=yes >> $out/r || echo dns=no >> $out/r\n\
         echo ifaces=$(busybox cat /proc/net/dev | busybox tail -n +3 | busybox cut -d: -f1 | busybox tr -d ' \\n') >> $out/r"
    );
    let (_, o) = build(&e, &script, &[]);
    let r = published(&e, &o, "r");
    assert!(
        r.contains("tcp=no") && r.contains("dns=no") && r.contains("ifaces=lo\n"),
        "{r}"
    );
    // Outside: the host's listeners heard nothing.
    assert!(tcp.accept().is_err(), "a TCP connection reached the host");
    let mut buf = [0u8; 16];
    assert!(
        udp.recv(&mut buf).is_err(),
        "a UDP datagram reached the host"
    );
}

#[test]
fn writes_outside_staging_exec_from_tmp_and_setuid_are_refused() {
    let e = env(2);
    // The read-only root and tree, masked and read-only /proc paths and each capability set are
    // proved by the ablation suite (cordon-stage's root_ablation), with targets the run account
    // could otherwise use; here the pinned image's root and the tree's files are root's and
    // 0555/0444, so a write attempt would be refused by permissions first and prove nothing.
    let script = "echo hi > /tmp/w && echo tmpwrite=$(busybox cat /tmp/w) >> $out/r\n\
        echo tmpmode=$(busybox stat -c %a /tmp) >> $out/r\n\
        busybox cp /bin/busybox /tmp/sh && echo tmpcopy=yes >> $out/r\n\
        /tmp/sh -c true 2>/dev/null && echo tmpexec=yes >> $out/r || echo tmpexec=no >> $out/r\n\
        /engine/attempt exec /tmp >> $out/r; /engine/attempt exec $out >> $out/r; busybox rm -f $out/attempt-exec\n\
        printf '#!/bin/sh\\necho ok\\n' > $out/x; busybox chmod 755 $out/x; [ \"$($out/x)\" = ok ] && echo stagingexec=yes >> $out/r; busybox rm -f $out/x\n\
        busybox ls /sys/firmware >/dev/null 2>&1 && echo firmware=yes >> $out/r || echo firmware=no >> $out/r\n\
        echo uid=$(busybox id -u) >> $out/r\n\
        echo treelinks=$(busybox stat -c %h /engine/build.sh) >> $out/r\n\
        echo engineroot=$(busybox grep ' /engine ' /proc/self/mountinfo | busybox cut -d' ' -f4) >> $out/r\n\
        echo storepaths=$(busybox grep -cE 'trees/|publications/' /proc/self/mountinfo) >> $out/r\n\
        for f in /proc/cmdline /proc/key-users /proc/config.gz /proc/kallsyms /proc/sys/kernel/random/boot_id /proc/loadavg /proc/stat /proc/pressure/cpu /proc/diskstats /proc/vmstat; do echo \"hostfact $f=$(busybox head -c 64 $f 2>/dev/null | busybox wc -c)\" >> $out/r; done\n\
        echo gpuenv=$(busybox env | busybox grep -cE '^(NVIDIA|CUDA)_') >> $out/r\n\
        busybox ln /bin/busybox $out/hl 2>/dev/null && echo hardlink=yes >> $out/r || echo hardlink=no >> $out/r\n\
        echo core=$(busybox grep 'Max core file size' /proc/self/limits | busybox tr -s ' ' | busybox cut -d' ' -f5) >> $out/r\n\
        echo pids=$(busybox ls /proc | busybox grep -c '^[0-9]') >> $out/r\n\
        busybox cat /proc/1/environ >/dev/null 2>&1; echo shadow=$(busybox cat /etc/shadow 2>/dev/null | busybox wc -c) >> $out/r\n\
        echo procdriver=$(busybox ls -A /proc/driver 2>/dev/null | busybox wc -l) >> $out/r\n\
        [ -e /sys/bus/pci ] && echo pci=yes >> $out/r || echo pci=no >> $out/r\n\
        for p in /dev/nvidia0 /dev/nvidiactl /model /root /home /var/run/docker.sock /run/docker.sock /run/containerd /nonexistent; do [ -e $p ] && echo present=$p >> $out/r; done\n\
        busybox cut -d' ' -f5 /proc/self/mountinfo | busybox sort -u | busybox tr '\\n' ' ' > $out/mounts\n\
        busybox cut -d' ' -f4,5,6 /proc/self/mountinfo > $out/mountopts";
    let attempt = cordon_testkit::attempt_program(e.dir.path());
    let (tree, o) = build(&e, script, &[("attempt", &attempt)]);
    let r = published(&e, &o, "r");
    for want in [
        // /tmp is writable by the run account, and noexec: the copy succeeds, its exec fails —
        // and the static attempt program's copy of itself runs from staging, which is not
        // noexec (documented), where it is refused in /tmp: only noexec refused it.
        "tmpwrite=hi",
        "tmpmode=700",
        "tmpcopy=yes",
        "tmpexec=no",
        "exec=blocked:13\nexec=ok\n",
        "stagingexec=yes",
        "firmware=no",
    ] {
        assert!(r.contains(want), "{want}: {r}");
    }
    assert!(!r.contains("uid=0"), "the step ran as root: {r}");
    // Corpus 33, 25: the tree is the lease's own copy — one link per file (the store's object
    // has at least two: the object and the tree's link), so no inode is shared with another
    // lease — and the mount table names no store tree (the image rootfs path still shows as
    // the root's bind source: CORPUS.md #25).
    let outside =
        std::fs::metadata(tree::root_in(&e.store, tree::TREES, &tree).join("build.sh")).unwrap();
    assert!(
        std::os::unix::fs::MetadataExt::nlink(&outside) >= 2,
        "the store's file is not shared: the probe proves nothing"
    );
    for want in ["treelinks=1\n", "engineroot=/\n", "storepaths=0\n"] {
        assert!(r.contains(want), "{want}: {r}");
    }
    // Host facts are masked (each is readable on this host, so the probe could see them), and
    // nothing of a GPU is visible: no variables, no driver directory, no PCI devices.
    for f in [
        "/proc/cmdline",
        "/proc/key-users",
        "/proc/config.gz",
        "/proc/kallsyms",
        "/proc/sys/kernel/random/boot_id",
        // The host's activity (MASKED_IN_PREBUILD).
        "/proc/loadavg",
        "/proc/stat",
        "/proc/pressure/cpu",
        "/proc/diskstats",
        "/proc/vmstat",
    ] {
        let host = std::fs::read(f).map_or(0, |b| b.len());
        assert!(
            host > 0,
            "{f} is empty on this host: the probe proves nothing"
        );
        assert!(
            r.contains(&format!("hostfact {f}=0\n")),
            "{f} is visible: {r}"
        );
    }
    // Corpus 19, 12, 52, 51: no hard link out of staging (another filesystem), no core
    // dumps, only the container's own processes, no host secrets to read.
    for want in ["hardlink=no", "core=0", "shadow=0"] {
        assert!(r.contains(want), "{want}: {r}");
    }
    let pids: u32 = r
        .lines()
        .find_map(|l| l.strip_prefix("pids="))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(pids < 10, "host processes are visible: {pids}");
    for want in ["gpuenv=0", "procdriver=0", "pci=no"] {
        assert!(r.contains(want), "{want}: {r}");
    }
    assert!(
        !r.contains("present="),
        "no GPU, model, home, wallet or runtime socket: {r}"
    );
    // The mount table holds exactly the planned mounts (and runc's masks over /proc, /sys).
    let mounts = published(&e, &o, "mounts");
    assert!(
        mounts.contains("/engine ") && mounts.contains("/staging "),
        "{mounts}"
    );
    // ipc "none": a private IPC namespace and no /dev/shm to share anything through.
    assert!(
        !mounts.split_whitespace().any(|m| m == "/dev/shm"),
        "ipc \"none\" must mount no /dev/shm: {mounts}"
    );
    for m in mounts.split_whitespace() {
        let planned = [
            "/",
            "/proc",
            "/dev",
            "/dev/mqueue",
            "/dev/pts",
            "/tmp",
            "/engine",
            "/staging",
            "/cordon/child/memory",
            "/cordon/child/pids",
            "/cordon/child/cpu",
        ];
        assert!(
            planned.contains(&m)
                || m.starts_with("/proc/")
                || m.starts_with("/sys/")
                || m.starts_with("/dev/"),
            "an unplanned mount {m}: {mounts}"
        );
    }
    // Corpus 13, recursively: every mount is read-only but the planned writable ones — the
    // lease's /tmp and staging, the patcher's child cgroup (each controller's, whose
    // cgroup.procs alone is the account's; its limits are root's, probed below), and runc's
    // /dev, /dev/pts, /dev/mqueue and /proc (root-owned, or the kernel's own) — and runc's
    // masks, each `/dev/null` bound over a /proc file (writes vanish, reads are empty).
    let opts = published(&e, &o, "mountopts");
    let entries: Vec<(&str, &str, &str)> = opts
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            Some((f.next()?, f.next()?, f.next()?))
        })
        .collect();
    let ro = |o: &str| o.split(',').any(|f| f == "ro");
    let planned_writable = [
        "/tmp",
        "/staging",
        "/cordon/child/memory",
        "/cordon/child/pids",
        "/cordon/child/cpu",
        "/dev",
        "/dev/pts",
        "/dev/mqueue",
        "/proc",
    ];
    let unplanned: Vec<_> = entries
        .iter()
        .filter(|(root, m, o)| {
            let mask = m.starts_with("/proc/") && *root == "/null";
            !(ro(o) || planned_writable.contains(m) || mask)
        })
        .collect();
    assert!(
        unplanned.is_empty(),
        "writable mounts {unplanned:?}: {opts}"
    );
    // The probe read the options it checks: the root and the tree are there, read-only, and
    // at least one mask was seen as a /dev/null bind.
    for m in ["/", "/engine"] {
        assert!(
            entries.iter().any(|(_, p, o)| *p == m && ro(o)),
            "{m} is not read-only: {opts}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|(root, m, _)| *root == "/null" && *m == "/proc/kallsyms"),
        "{opts}"
    );
    // Outside: the tree is exactly what was published.
    tree::verify(&e.store, &tree).unwrap();

    // A setuid file left in staging: executing it grants nothing (nosuid), publishing refuses it.
    let script = "printf '#!/bin/sh\\nbusybox id -u\\n' > $out/su; busybox chmod 4755 $out/su; $out/su > $out/uid; exit 0";
    let (_, o) = build(&e, script, &[]);
    assert_eq!(rejected(&o), "publication.special-mode");
}

#[test]
fn every_forbidden_leftover_in_staging_is_refused() {
    let e = env(3);
    for (script, code) in [
        ("busybox ln -s /etc/passwd $out/l", "publication.symlink"),
        (
            "echo x > $out/a; busybox ln $out/a $out/b",
            "publication.hardlink",
        ),
        ("busybox mkfifo $out/f", "publication.fifo"),
        ("busybox truncate -s 512K $out/sparse", "publication.sparse"),
        (
            "echo x > $out/g; busybox chmod g+s $out/g",
            "publication.special-mode",
        ),
    ] {
        let (_, o) = build(&e, script, &[]);
        assert_eq!(rejected(&o), code, "{script}");
    }
    // A clean publication is sealed: files 0444/0555, reopened and verified, and the same
    // (tree, step, image, authority) reopens it without starting a container.
    let (tree, o) = build(
        &e,
        "busybox mkdir -p $out/lib; echo ok > $out/lib/a; printf '#!/bin/sh\\n' > $out/tool; busybox chmod 755 $out/tool",
        &[],
    );
    let Decision::Accepted(Published {
        publication,
        cached,
        ..
    }) = &o
    else {
        panic!("{o:?}")
    };
    assert!(!cached);
    let root = tree::root_in(&e.store, PUBLICATIONS, &publication.digest);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(root.join("lib/a")).unwrap().mode() & 0o7777,
        0o444
    );
    assert_eq!(
        std::fs::metadata(root.join("tool")).unwrap().mode() & 0o7777,
        0o555
    );
    let again = prebuild(&e.policy, &e.cfg, &tree, "build-native", true).unwrap();
    let Decision::Accepted(Published {
        publication: p2,
        cached: true,
        meta: None,
    }) = again
    else {
        panic!("{again:?}")
    };
    assert_eq!(p2.digest, publication.digest);
    // Under another authority (another policy, runtime, image set or binary) the cache is never
    // reused: the build runs again, in a container.
    let mut other = e.cfg.clone();
    other.authority = Digest::of_bytes(b"another authority");
    let rebuilt = prebuild(&e.policy, &other, &tree, "build-native", true).unwrap();
    assert!(
        matches!(
            rebuilt,
            Decision::Accepted(Published {
                cached: false,
                meta: Some(_),
                ..
            })
        ),
        "{rebuilt:?}"
    );
    // An unregistered step is a rejection.
    let o = prebuild(&e.policy, &e.cfg, &tree, "rm-rf", true).unwrap();
    assert_eq!(rejected(&o), "prebuild.unknown-step");
}

/// Register a tree holding `files` (a native-sources tree: C sources, no build script) and run
/// the native-sources patcher on it.
fn compile(e: &Env, files: &[(&str, &str)]) -> Outcome {
    let files: Vec<_> = files.iter().map(|(n, t)| (format!("t/{n}"), *t)).collect();
    let files: Vec<_> = files.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    build_tier(e, "build-native-sources", &files)
}

/// Register a tree holding `files` (paths from its root; its one target `t`) and run step
/// `step` on it.
fn build_tier(e: &Env, step: &str, files: &[(&str, &str)]) -> Outcome {
    let src = tempfile::tempdir_in(e.dir.path()).unwrap();
    std::fs::write(
        src.path().join("cordon-incumbent.kdl"),
        "incumbent \"native\"\ntarget \"t\" path=\"t\"\n",
    )
    .unwrap();
    std::fs::create_dir(src.path().join("t")).unwrap();
    for (name, text) in files {
        let path = src.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let rules = e.policy.tree_rules();
    let tree = cordon_materialize::materialize::register_incumbent(&e.store, src.path(), &rules)
        .unwrap()
        .digest;
    run_step(e, &tree, step).unwrap()
}

/// The native-sources tier: the tree's C sources, compiled by the image's pinned compiler with
/// the validator's flags in the bounded child, make one freestanding shared object; what the
/// compiler cannot build, or a source that makes it exhaust the child's memory, is a rejection
/// and the host is unaffected. The object is never loaded by the host: only its bytes are read.
#[test]
fn the_native_sources_patcher_compiles_c_sources_in_the_bounded_child() {
    let e = env_in("prebuild-tiers", 0, |t| t);
    let o = compile(
        &e,
        &[
            ("k.h", "long long twice(long long x);\n"),
            (
                "k.c",
                "#include <stddef.h>\n#include \"k.h\"\nlong long twice(long long x) { return 2 * x; }\n",
            ),
        ],
    );
    let Decision::Accepted(Published { publication, .. }) = &o else {
        panic!("expected a publication, got {:?}", rejected(&o));
    };
    let so = std::fs::read(
        tree::root_in(&e.store, PUBLICATIONS, &publication.digest).join("lib/native.so"),
    )
    .unwrap();
    // An ELF shared object (e_type ET_DYN) that exports the source's function.
    assert_eq!(&so[..4], b"\x7fELF");
    assert_eq!(so[16], 3);
    assert!(so.windows(6).any(|w| w == b"twice\0"));
    // C++ and CUDA have no registered compiler; a source that does not compile fails the step.
    for bad in [("k.cpp", "int f() { return 0; }\n"), ("k.c", "int f( {\n")] {
        assert_eq!(rejected(&compile(&e, &[bad])), "prebuild.exit", "{bad:?}");
    }
    // A preprocessor bomb (2^30 tokens) ends at the child's memory bound, the host unaffected.
    let mut bomb = String::from("#define A0 x+\n");
    for i in 1..=30 {
        bomb.push_str(&format!("#define A{i} A{p} A{p}\n", p = i - 1));
    }
    bomb.push_str("int f(void) { return A30 0; }\n");
    assert_eq!(rejected(&compile(&e, &[("bomb.c", &bomb)])), "prebuild.oom");
}

/// The dependency-patch tier: a patch named for a dependency the tree vendors at deps/<name> is
/// applied to a copy (the tree is never changed) and the patched sources compiled into
/// lib/<name>.so; a patch for a dependency the tree does not vendor, one that does not apply,
/// and one whose name is no dependency's are rejections.
#[test]
fn the_dependency_patch_patcher_builds_a_patched_copy_of_a_vendored_dependency() {
    let e = env_in("prebuild-tiers", 2, |t| t);
    let dep = ("deps/lib/lib.c", "long long one(void) { return 1; }\n");
    let patch = "--- a/lib.c\n+++ b/lib.c\n@@ -1 +1,2 @@\n long long one(void) { return 1; }\n+long long two(void) { return 2; }\n";
    let o = build_tier(&e, "build-dependency", &[dep, ("t/lib.patch", patch)]);
    let Decision::Accepted(Published { publication, .. }) = &o else {
        panic!("expected a publication, got {:?}", rejected(&o));
    };
    let root = tree::root_in(&e.store, PUBLICATIONS, &publication.digest);
    let so = std::fs::read(root.join("lib/lib.so")).unwrap();
    assert_eq!(&so[..4], b"\x7fELF");
    assert!(
        so.windows(4).any(|w| w == b"two\0"),
        "the patch was not applied"
    );
    for files in [
        vec![("t/other.patch", patch)],
        vec![
            dep,
            (
                "t/lib.patch",
                "--- a/lib.c\n+++ b/lib.c\n@@ -1 +1 @@\n-nothing like it\n+x\n",
            ),
        ],
        vec![dep, ("t/..patch", patch)],
    ] {
        assert_eq!(
            rejected(&build_tier(&e, "build-dependency", &files)),
            "prebuild.exit",
            "{files:?}"
        );
    }
}

/// A candidate tree holding `files` under package `pkg` whose origin records `pkg.aot:build` as
/// its factory (as materialize records a sealed-direct-artifact delta's), built by the AOT
/// patcher.
fn compile_aot(e: &Env, aot_py: &str) -> Outcome {
    let mut batch = e.store.batch().unwrap();
    let mut entries = Vec::new();
    for (path, text) in [("pkg/__init__.py", ""), ("pkg/aot.py", aot_py)] {
        let (sha256, size) = batch.add_reader(text.as_bytes(), false).unwrap();
        entries.push(tree::Entry {
            path: path.into(),
            mode: 0o444,
            size,
            sha256,
        });
    }
    batch.commit().unwrap();
    let origin = serde_json::json!({ "kind": "candidate", "factory": "pkg.aot:build" });
    let tree = tree::publish(&e.store, entries, origin).unwrap().digest;
    run_step(e, &tree, "build-aot").unwrap()
}

/// An honest factory's profile, as the example's states it; `{artifact}` is its artifact's
/// expression, `{extra}` more profile fields.
const FACTORY: &str = r#"def build(request):
    artifact = {artifact}
    profile = {"schema": "cordon.compile-profile/1", "factory": request["factory"],
               "entry": "attend", "inputs": request["inputs"],
               "artifact": {"bytes": len(artifact)}}
    {extra}
    return artifact, profile
"#;

fn factory(artifact: &str, extra: &str) -> String {
    FACTORY
        .replace("{artifact}", artifact)
        .replace("{extra}", extra)
}

/// The sealed-direct-artifact tier's closed compile ABI, end to end in real containers: an
/// honest factory's artifact and profile are sealed with the request's digest in the control
/// record; a factory that writes outside the result, returns a malformed or lying profile,
/// exceeds a bound or spins is a rejection, and the host never decodes the profile itself.
#[test]
fn the_aot_patcher_seals_only_what_the_closed_compile_abi_admits() {
    let e = env_in("prebuild-tiers", 1, |t| t);
    let o = compile_aot(&e, &factory("b'attend x86_64 cpu\\n'", ""));
    let Decision::Accepted(Published { publication, .. }) = &o else {
        panic!("expected a publication, got {:?}", rejected(&o));
    };
    let paths: Vec<_> = publication
        .entries
        .iter()
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(paths, ["result/artifact.bin", "result/profile.json"]);
    assert_eq!(
        published(&e, &o, "result/artifact.bin"),
        "attend x86_64 cpu\n"
    );
    let request = cordon_stage::compile::Request::for_factory("pkg.aot:build")
        .encode()
        .unwrap()
        .digest;
    let control = tree::Control::of(publication).unwrap();
    let tree::Control::Built {
        request: Some(r),
        tier,
        ..
    } = control
    else {
        panic!("{control:?}");
    };
    assert_eq!((r, tier.as_str()), (request, "sealed-direct-artifact"));
    // Each hostile factory, and what it ends in.
    let cases = [
        // Writes outside the result: an extra file in staging.
        (
            factory("b'x'", "open('/staging/extra', 'w').write('x')"),
            "publication.aot-layout",
        ),
        // A profile the schema refuses, and one that lies about the artifact.
        (
            factory("b'x'", "profile['extra'] = 1"),
            "publication.aot-profile",
        ),
        (
            factory("b'x'", "profile['artifact']['bytes'] = 2"),
            "publication.aot-profile",
        ),
        (
            factory("b'x'", "profile['inputs'] = []"),
            "publication.aot-profile",
        ),
        // Not the ABI's pair.
        (
            "def build(request):\n    return b'x'\n".to_owned(),
            "prebuild.exit",
        ),
        // Each bound: the profile's size, staging's bytes, the child's memory, its deadline.
        (
            factory("b'x'", "profile['entry'] = 'a' * 70000"),
            "publication.aot-layout",
        ),
        (factory("b'x' * (2 << 20)", ""), "prebuild.exit"),
        (
            factory("b'x'", "hog = [b'y' * (1 << 20) for _ in range(400)]"),
            "prebuild.oom",
        ),
        (
            factory("b'x'", "while True:\n        pass"),
            "prebuild.child-deadline",
        ),
    ];
    for (source, code) in cases {
        assert_eq!(rejected(&compile_aot(&e, &source)), code, "{source}");
    }
}

/// The patcher's child is held to its own CPU share, probed from inside: a build spinning in
/// the child under 0.1 CPU is stopped once per CFS period; with the child's share raised to the
/// stage's own (the only change), the same probe runs unstopped.
#[test]
fn the_patchers_child_is_held_to_its_cpu_share() {
    for (slot, cpus, want) in [(3, "\"0.1\"", "cpu=blocked:0\n"), (4, "4", "cpu=ok\n")] {
        let e = env_in("prebuild-tiers", slot, |t| {
            t.replace_once("child cpus=4 ", &format!("child cpus={cpus} "))
        });
        let attempt = cordon_testkit::attempt_program(e.dir.path());
        let (_, o) = build(
            &e,
            "/engine/attempt cpu 150 5 > $out/r",
            &[("attempt", &attempt)],
        );
        assert_eq!(published(&e, &o, "r"), want, "child cpus={cpus}");
    }
}

/// The AOT child's memory and deadline, each ablated: a factory that holds 210 MiB is killed
/// under the child's 192 MiB and compiles with only the child's memory raised to 248 MiB (still
/// inside the stage's 256 MiB); one that sleeps 3 s is killed at a 2 s child deadline and
/// compiles at the usual 6 s.
#[test]
fn the_aot_childs_memory_and_deadline_each_decide_alone() {
    let hog = factory("b'x'", "hog = b'y' * (210 << 20)");
    let nap = factory("b'x'", "import time\n    time.sleep(3)");
    for (slot, child, source, want) in [
        (
            5,
            "memory=\"192MiB\" pids=48 deadline=\"6s\"",
            &hog,
            Some("prebuild.oom"),
        ),
        (6, "memory=\"248MiB\" pids=48 deadline=\"6s\"", &hog, None),
        (
            7,
            "memory=\"192MiB\" pids=48 deadline=\"2s\"",
            &nap,
            Some("prebuild.child-deadline"),
        ),
        (8, "memory=\"192MiB\" pids=48 deadline=\"6s\"", &nap, None),
    ] {
        let e = env_in("prebuild-tiers", slot, |t| {
            t.replace_once(
                "child cpus=4 memory=\"192MiB\" pids=48 deadline=\"6s\"",
                &format!("child cpus=4 {child}"),
            )
        });
        let o = compile_aot(&e, source);
        match want {
            Some(code) => assert_eq!(rejected(&o), code, "{child}: {source}"),
            None => assert!(matches!(o, Decision::Accepted(_)), "{child}: {source}"),
        }
    }
}

#[test]
fn resource_bounds_hold_and_failures_are_rejections() {
    let e = env(4);
    // Fork bomb: the pids limit (64) stops the 200 forks with EAGAIN; the sleepers left
    // behind when the step ends do not survive the stage, and the host is unaffected.
    let attempt = cordon_testkit::attempt_program(e.dir.path());
    let (_, o) = build(
        &e,
        "/engine/attempt pids 200 > $out/r; busybox sleep 31 & busybox sleep 31 & exit 0",
        &[("attempt", &attempt)],
    );
    assert_eq!(published(&e, &o, "r"), "pids=blocked:11\n");
    // Corpus 5, the benign control: 64 GiB of address space reserved and never touched (as a
    // GPU runtime reserves at start) is not refused under a 256 MiB memory limit — no
    // RLIMIT_AS is planned; the memory limit bounds what is used, not what is mapped.
    let (_, o) = build(
        &e,
        "/engine/attempt reserve 65536 > $out/r",
        &[("attempt", &attempt)],
    );
    assert_eq!(published(&e, &o, "r"), "reserve=ok\n");
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("sleep 31"),
        "a forked process survived"
    );
    // Memory balloon: OOM-killed, a rejection.
    let (_, o) = build(
        &e,
        "busybox dd if=/dev/zero of=/dev/null bs=600M count=1",
        &[],
    );
    assert_eq!(rejected(&o), "prebuild.oom");
    // Filling staging: bytes (1 MiB) and inodes (64) are the tmpfs's, the step sees ENOSPC
    // (the attempt's answer is kept in /tmp and copied back once staging is emptied).
    for (attempt_line, want) in [
        ("/engine/attempt fill $out/big 2097152", "fill=blocked:28\n"),
        ("/engine/attempt files $out 100", "files=blocked:28\n"),
    ] {
        let script =
            format!("{attempt_line} > /tmp/r; busybox rm -rf $out/*; busybox cp /tmp/r $out/r");
        let (_, o) = build(&e, &script, &[("attempt", &attempt)]);
        assert_eq!(published(&e, &o, "r"), want, "{attempt_line}");
    }
    // Sleeping past the deadline: the child's, held by the host.
    let (_, o) = build(&e, "busybox sleep 60", &[]);
    assert_eq!(rejected(&o), "prebuild.child-deadline");
    // A failing step.
    let (_, o) = build(&e, "exit 7", &[]);
    assert_eq!(rejected(&o), "prebuild.exit");
    // A setsid double fork: gone afterwards (quiescence was checked by build; no such process).
    let (_, o) = build(
        &e,
        "busybox setsid sh -c 'busybox sleep 313 &' ; exit 0",
        &[],
    );
    assert!(matches!(o, Decision::Accepted(_)));
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("sleep 313"),
        "a background process survived"
    );
    // A stdout flood is capped and counted.
    let (_, o) = build(&e, "busybox head -c 10000000 /dev/zero", &[]);
    let Decision::Accepted(Published { meta: Some(m), .. }) = o else {
        panic!()
    };
    assert!(m.stdout_truncated && m.stdout_bytes == 10_000_000, "{m:?}");
}

#[test]
fn secrets_environment_and_inherited_descriptors_stay_out() {
    let e = env(5);
    // The secret arrives on stdin only; the file itself is not reachable; the init's whole
    // environment is the policy's (the supervisor's never reaches it).
    // From outside, while the step runs: the secret's copy in the run directory is root's,
    // 0400, one link.
    let run_root = e.cfg.setup.run_root.clone();
    let watcher = std::thread::spawn(move || {
        use std::os::unix::fs::MetadataExt;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let found = std::fs::read_dir(&run_root).ok().and_then(|dirs| {
                dirs.filter_map(Result::ok)
                    .find_map(|d| std::fs::symlink_metadata(d.path().join("secret")).ok())
            });
            // Seen once written: the 20 ms poll can catch it between create and write.
            if let Some(m) = found.filter(|m| m.len() > 0) {
                return (m.uid(), m.mode() & 0o7777, m.nlink(), m.len());
            }
            assert!(std::time::Instant::now() < until, "no secret file appeared");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    let script = format!(
        "busybox cat > $out/stdin\n\
         busybox sleep 1\n\
         busybox cat {} > $out/file 2>/dev/null; echo $? > $out/file-rc\n\
         busybox cat /proc/1/environ | busybox tr '\\0' '\\n' > $out/env\n\
         busybox ls /proc/self/fd > $out/fds\n\
         busybox crontab -l >/dev/null 2>&1; echo cron=$? >> $out/r",
        e.dir.path().join("secret").display()
    );
    let (_, o) = build(&e, &script, &[]);
    assert_eq!(
        published(&e, &o, "stdin"),
        "TOPSECRET-KEY\n",
        "the declared step gets the secret on stdin"
    );
    assert!(published(&e, &o, "file").is_empty() && published(&e, &o, "file-rc").trim() != "0");
    assert_eq!(
        watcher.join().unwrap(),
        (0, 0o400, 1, "TOPSECRET-KEY\n".len() as u64),
        "the run directory's secret: root, 0400, one link, its size"
    );
    let env_text = published(&e, &o, "env");
    // Sorted: the order is the runtime's (a gated run's shell passes its own table's).
    let mut names: Vec<&str> = env_text
        .lines()
        .filter_map(|l| l.split('=').next())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE"],
        "{env_text}"
    );
    let fds: Vec<String> = published(&e, &o, "fds")
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        fds.iter()
            .all(|f| ["0", "1", "2", "3"].contains(&f.as_str())),
        "descriptors beyond stdio: {fds:?}"
    );
}

/// Each call fails with EPERM. Four of them (`mount`, `ptrace`, `AF_PACKET`, raw sockets) are
/// also refused for want of a capability, so their EPERM shows the two layers agree, not that
/// the filter alone holds: the ablation suite (cordon-stage's root_ablation) proves each seccomp
/// rule class with calls no capability gates.
#[test]
fn blocked_system_calls_and_socket_families_fail_with_eperm() {
    let e = env(6);
    let bin = compile_static(e.dir.path(), "probe", PROBE);
    let (_, o) = build(&e, "/engine/probe > $out/r 2>&1", &[("probe", &bin)]);
    let r = published(&e, &o, "r");
    for name in [
        "mount",
        "unshare",
        "ptrace",
        "keyctl",
        "io_uring_setup",
        "bpf",
        "perf_event_open",
        "af_vsock",
        "af_vsock_high_bits",
        "af_netlink_uevent",
        "af_packet",
        "af_alg",
        "raw",
        "setns",
        "umount_proc",
        "clock_settime",
        "mknod",
        "add_key",
        "init_module",
        "kexec_load",
        "userfaultfd",
        "personality",
    ] {
        assert!(
            r.contains(&format!("{name}=-1:1\n")),
            "{name} must fail with EPERM: {r}"
        );
    }
    // TIOCSTI: no controlling terminal to push input into (stdio is never a tty), high bits or not.
    for name in ["tiocsti", "tiocsti_high"] {
        assert!(
            r.contains(&format!("{name}=-1:25\n")) || r.contains(&format!("{name}=-1:1\n")),
            "{name} must find no terminal: {r}"
        );
    }
    // Descriptors end at the policy's nofile (4096, less stdio and the probe's own), as EMFILE.
    assert!(
        r.lines()
            .any(|l| l.starts_with("nofile_opened=409") && l.ends_with("errno=24")),
        "{r}"
    );
    // An i386 call (int 0x80) from the x86_64 process: killed by the filter (SIGSYS, 31).
    assert!(r.contains("int80=signal:31\n"), "{r}");
    // The same probe succeeds where the allow-list admits: the filter, not the probe, refuses.
    for name in ["af_unix", "af_unix_high_bits", "af_inet"] {
        assert!(
            r.lines()
                .any(|l| l.starts_with(&format!("{name}=")) && l.ends_with(":0")),
            "{name} must be admitted: {r}"
        );
    }
}

/// Every operator the language admits, compiled by the planner and loaded by the runtime, probed
/// from inside with values around each boundary and with high bits set. Each probe uses
/// arguments the kernel rejects with its own errno (EBADF, EINVAL) or that are harmless, so
/// `-1:1` (EPERM) can only be the filter's answer.
#[test]
fn argument_conditions_hold_at_every_boundary_and_with_high_bits_set() {
    let rules = r#"
    rule "ioctl" action="allow" reason="t" {
        arg index=2 op="ne" value=5
    }
    rule "setsockopt" action="allow" reason="t" {
        arg index=3 op="lt" value=100
    }
    rule "socketpair" action="allow" reason="t" {
        arg index=3 op="le" value=100
    }
    rule "prctl" action="allow" reason="t" {
        arg index=0 op="one-of" 9998 9999
        arg index=1 op="gt" value=100
        arg index=2 op="ge" value=7
    }
    rule "unshare" action="allow" reason="t" {
        arg index=0 op="masked-eq" value=0 mask=2113994752
    }
    rule "personality" action="allow" reason="t" {
        arg index=0 op="masked-eq" value=0 mask=65280
    }
    rule "flock" action="allow" reason="t" {
        arg index=1 op="eq" value=1
    }
"#;
    let e = env_with(7, |t| {
        let t = ["ioctl", "setsockopt", "socketpair", "prctl", "flock"]
            .iter()
            .fold(t, |t, name| cordon_testkit::unlisted(&t, name));
        t.replace_once(
            "        arg index=0 op=\"one-of\" 1 2 10\n    }\n",
            &format!("        arg index=0 op=\"one-of\" 1 2 10\n    }}\n{rules}"),
        )
    });
    let bin = compile_static(e.dir.path(), "args", ARG_PROBE);
    let (_, o) = build(&e, "/engine/args > $out/r 2>&1", &[("args", &bin)]);
    let r = published(&e, &o, "r");
    let expect = [
        // 64-bit ne: only exactly 5 is refused; 5 with a high bit is another value.
        ("ioctl_ne_5", "-1:1"),
        ("ioctl_ne_6", "-1:9"),
        ("ioctl_ne_5_high", "-1:9"),
        // 64-bit lt / le / gt / ge at their boundaries.
        ("setsockopt_lt_99", "-1:9"),
        ("setsockopt_lt_100", "-1:1"),
        ("setsockopt_lt_high", "-1:1"),
        ("socketpair_le_100", "-1:14"),
        ("socketpair_le_101", "-1:1"),
        ("prctl_gt_101", "-1:22"),
        ("prctl_gt_100", "-1:1"),
        ("prctl_gt_high", "-1:22"),
        ("prctl_ge_7", "-1:22"),
        ("prctl_ge_6", "-1:1"),
        // 32-bit one-of: high bits are ignored, as the kernel ignores them.
        ("prctl_one_of_high", "-1:22"),
        ("prctl_one_of_other", "-1:1"),
        ("prctl_one_of_other_high", "-1:1"),
        // 64-bit masked-eq: bits outside the mask are free, bits inside refused.
        ("unshare_masked_outside", "-1:22"),
        ("unshare_masked_newuser", "-1:1"),
        // 32-bit masked-eq: the high half is ignored, a bit inside the mask refused.
        ("personality_masked_high", "0:0"),
        ("personality_masked_inside", "-1:1"),
        // 32-bit eq: the kernel's value with high bits set is still that value.
        ("flock_eq_1", "-1:9"),
        ("flock_eq_1_high", "-1:9"),
        ("flock_eq_2", "-1:1"),
        ("flock_eq_2_high", "-1:1"),
    ];
    for (name, want) in expect {
        assert!(
            r.contains(&format!("{name}={want}\n")),
            "{name} should be {want}: {r}"
        );
    }
    assert!(r.contains("done\n"), "{r}");
}

const PROBE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static void report(const char *name, long r) { printf("%s=%ld:%d\n", name, r, r < 0 ? errno : 0); }
int main(void) {
    errno = 0; report("mount", syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, 0));
    errno = 0; report("unshare", syscall(SYS_unshare, 0x10000000L));
    errno = 0; report("ptrace", syscall(SYS_ptrace, 16L, 1L, 0L, 0L));
    errno = 0; report("keyctl", syscall(SYS_keyctl, 0L, 0L, 0L));
    errno = 0; report("io_uring_setup", syscall(SYS_io_uring_setup, 1L, 0L));
    errno = 0; report("bpf", syscall(SYS_bpf, 0L, 0L, 0L));
    errno = 0; report("perf_event_open", syscall(SYS_perf_event_open, 0L, 0L, -1L, -1L, 0L));
    errno = 0; report("af_vsock", socket(40, SOCK_STREAM, 0));
    /* The kernel reads the family as an int: this is AF_VSOCK to it. */
    errno = 0; report("af_vsock_high_bits", syscall(SYS_socket, 0x100000028L, (long)SOCK_STREAM, 0L));
    errno = 0; report("af_netlink_uevent", socket(16, SOCK_DGRAM, 15));
    errno = 0; report("af_packet", socket(17, SOCK_RAW, 0));
    errno = 0; report("af_alg", socket(38, SOCK_SEQPACKET, 0));
    errno = 0; report("raw", socket(AF_INET, SOCK_RAW, 1));
    errno = 0; report("af_unix", socket(AF_UNIX, SOCK_STREAM, 0) >= 0 ? 0 : -1);
    errno = 0; report("af_unix_high_bits", syscall(SYS_socket, 0x100000001L, (long)SOCK_STREAM, 0L) >= 0 ? 0 : -1);
    errno = 0; report("af_inet", socket(AF_INET, SOCK_DGRAM, 0) >= 0 ? 0 : -1);
    /* Corpus 30: join or make namespaces, unmount /proc. */
    errno = 0; report("setns", syscall(SYS_setns, 0L, 0L));
    errno = 0; report("umount_proc", syscall(SYS_umount2, "/proc", 2L));
    /* Corpus 10: the clock cannot be changed from inside. */
    struct timespec ts = {0, 0};
    errno = 0; report("clock_settime", syscall(SYS_clock_settime, 0L, &ts));
    /* Corpus 20: no device node can be made. */
    errno = 0; report("mknod", syscall(SYS_mknod, "/tmp/null", (long)(S_IFCHR | 0666), (long)makedev(1, 3)));
    /* Corpus 31, 39: key, module, kexec, userfaultfd, personality. */
    errno = 0; report("add_key", syscall(SYS_add_key, "user", "k", "v", 1L, -1L));
    errno = 0; report("init_module", syscall(SYS_init_module, 0L, 0L, ""));
    errno = 0; report("kexec_load", syscall(SYS_kexec_load, 0L, 0L, 0L, 0L));
    errno = 0; report("userfaultfd", syscall(SYS_userfaultfd, 0L));
    errno = 0; report("personality", syscall(SYS_personality, 0x0040000L));
    /* Corpus 37: TIOCSTI, plain and with high bits set (CVE-2019-10063). */
    char c = 'x';
    errno = 0; report("tiocsti", syscall(SYS_ioctl, 0L, (long)TIOCSTI, &c));
    errno = 0; report("tiocsti_high", syscall(SYS_ioctl, 0L, 0x100000000L | TIOCSTI, &c));
    /* Corpus 8: descriptors run out at the policy's nofile, as EMFILE. */
    int n = 0, last = 0;
    for (;;) { int fd = open("/dev/null", O_RDONLY); if (fd < 0) { last = errno; break; } n++; if (n > 100000) break; }
    printf("nofile_opened=%d errno=%d\n", n, last);
    /* Corpus 36: an i386 system call from a 64-bit process is killed (the filter is x86_64 only). */
    pid_t child = fork();
    if (child == 0) { long r; __asm__ volatile ("int $0x80" : "=a"(r) : "a"(20L)); _exit(r > 0 ? 7 : 8); }
    int status = 0;
    waitpid(child, &status, 0);
    printf("int80=%s:%d\n", WIFSIGNALED(status) ? "signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    return 0;
}
"#;

const ARG_PROBE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
static void report(const char *name, long r) { printf("%s=%ld:%d\n", name, r, r < 0 ? errno : 0); }
#define P(name, ...) do { errno = 0; report(name, syscall(__VA_ARGS__)); } while (0)
#define HIGH 0x100000000L
int main(void) {
    P("ioctl_ne_5", SYS_ioctl, -1L, 0L, 5L);
    P("ioctl_ne_6", SYS_ioctl, -1L, 0L, 6L);
    P("ioctl_ne_5_high", SYS_ioctl, -1L, 0L, HIGH | 5L);
    P("setsockopt_lt_99", SYS_setsockopt, -1L, 0L, 0L, 99L, 0L);
    P("setsockopt_lt_100", SYS_setsockopt, -1L, 0L, 0L, 100L, 0L);
    P("setsockopt_lt_high", SYS_setsockopt, -1L, 0L, 0L, HIGH | 5L, 0L);
    P("socketpair_le_100", SYS_socketpair, 9999L, 0L, 0L, 100L);
    P("socketpair_le_101", SYS_socketpair, 9999L, 0L, 0L, 101L);
    P("prctl_gt_101", SYS_prctl, 9999L, 101L, 7L, 0L, 0L);
    P("prctl_gt_100", SYS_prctl, 9999L, 100L, 7L, 0L, 0L);
    P("prctl_gt_high", SYS_prctl, 9999L, HIGH, 7L, 0L, 0L);
    P("prctl_ge_7", SYS_prctl, 9999L, 101L, 7L, 0L, 0L);
    P("prctl_ge_6", SYS_prctl, 9999L, 101L, 6L, 0L, 0L);
    P("prctl_one_of_high", SYS_prctl, HIGH | 9998L, 101L, 7L, 0L, 0L);
    P("prctl_one_of_other", SYS_prctl, 9997L, 101L, 7L, 0L, 0L);
    P("prctl_one_of_other_high", SYS_prctl, HIGH | 9997L, 101L, 7L, 0L, 0L);
    P("unshare_masked_outside", SYS_unshare, 0x10000000000L);
    P("unshare_masked_newuser", SYS_unshare, 0x10000000L);
    P("personality_masked_high", SYS_personality, HIGH | 0L);
    P("personality_masked_inside", SYS_personality, 0x0100L);
    P("flock_eq_1", SYS_flock, -1L, 1L);
    P("flock_eq_1_high", SYS_flock, -1L, HIGH | 1L);
    P("flock_eq_2", SYS_flock, -1L, 2L);
    P("flock_eq_2_high", SYS_flock, -1L, HIGH | 2L);
    printf("done\n");
    return 0;
}
"#;

/// A run ended from outside by cordon-reap (which marks the lease first) is a no-decision; a
/// SIGKILL of the container's init from inside is ignored, and one the candidate arranges for
/// itself (a CPU limit it set) is its own failure, never a forged "ended from outside".
#[test]
fn only_a_kill_by_cordon_reap_is_a_no_decision() {
    let e = env(8);
    let (_, o) = build(&e, "busybox kill -9 1; echo survived > $out/r", &[]);
    assert_eq!(published(&e, &o, "r"), "survived\n");
    let (_, o) = build(&e, "ulimit -t 1; while :; do :; done", &[]);
    assert_eq!(
        rejected(&o),
        "prebuild.exit",
        "a self-inflicted kill is the candidate's"
    );
    let observer = cordon::lease::Observer::new(&e.store, e.cfg.setup.clone());
    let (runc, state) = (
        e.cfg.setup.runtime.binary.clone(),
        e.cfg.setup.runtime.state_root.clone(),
    );
    let killer = std::thread::spawn(move || {
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            // Once the build runs (ended before its start, the run is a no-decision too, but
            // through the runtime's error rather than this path).
            let list = Command::new(&runc)
                .arg("--root")
                .arg(&state)
                .args(["list", "-f", "json"])
                .output()
                .unwrap();
            if !cordon_testkit::lists_running(&list.stdout) {
                continue;
            }
            // Long past any deadline: every live lease counts as expired.
            let later = cordon::lease::BootTime::now(&cordon::host::Linux)
                .unwrap()
                .after(std::time::Duration::from_secs(86_400));
            if !observer.end_expired(&later).unwrap().is_empty() {
                return true;
            }
        }
        false
    });
    let (_, r) = try_build(&e, "busybox sleep 5; echo done > $out/r", &[]);
    assert!(killer.join().unwrap(), "the observer never ended the run");
    assert!(
        matches!(
            r,
            Err(cordon_prebuild::prebuild::PrebuildError::KilledFromOutside)
        ),
        "{r:?}"
    );
}

/// A build that kills every process it can signal (`kill -9 -1`: in its pid namespace, as its
/// account, that is any watchdog the container could hold but the init) still ends at the stage's
/// deadline, which the host holds from outside, and nothing written after it is published; the
/// same build with only a deadline it fits in publishes what it wrote. The patcher holds no
/// deadline of its own, and refuses the argument that once set one. And nothing one build
/// plants in /tmp is there for the next (corpus 17), and the pages it fills in /tmp count
/// against its memory limit.
#[test]
fn a_build_that_kills_every_process_it_can_still_ends_at_the_hosts_deadline() {
    let script = "kill -9 -1; busybox sleep 4; echo late > $out/late";
    // The build is the patcher's child: its deadline is the host's, held outside it, and the
    // patcher (the container's init) outlives the build's `kill -9 -1`.
    let short = env_with(9, |t| {
        t.replace_once(&stage_deadline(8), &stage_deadline(3))
            .replace_once("deadline=\"6s\"", "deadline=\"1s\"")
    });
    let (_, o) = build(&short, script, &[]);
    assert_eq!(rejected(&o), "prebuild.child-deadline");
    let (_, o) = build(&short, "echo built > $out/r", &[]);
    assert_eq!(published(&short, &o, "r"), "built\n");
    // Corpus 3: a build still forking when the kill pass comes — three loops each starting a
    // short-lived process as fast as they can, well below the pids limit (a fork the limit
    // refused would end the shell) — ends at the deadline with nothing of it left (`build`
    // checks the executor quiescent after every case).
    let forking = "spawn() { while :; do busybox sleep 0.02 & busybox sleep 0.01; done; }; spawn & spawn & spawn & echo started > $out/r; wait";
    let (_, o) = build(&short, forking, &[]);
    assert_eq!(rejected(&o), "prebuild.child-deadline");
    drop(short);
    // Only the deadline changed: the same build runs to its end and its output is published.
    let e = env_with(9, |t| t);
    let (_, o) = build(&e, script, &[]);
    assert_eq!(published(&e, &o, "late"), "late\n");
    // Corpus 17: what one build plants in /tmp (a link to the root, a file) is not there for
    // the next: each run gets a fresh /tmp and staging.
    let plant = "busybox ln -s / /tmp/planted; echo x > /tmp/left; echo planted > $out/r";
    let (_, o) = build(&e, plant, &[]);
    assert_eq!(published(&e, &o, "r"), "planted\n");
    let look = "if [ -e /tmp/planted ] || [ -L /tmp/planted ] || [ -e /tmp/left ]; then echo seen > $out/r; else echo fresh > $out/r; fi";
    let (_, o) = build(&e, look, &[]);
    assert_eq!(published(&e, &o, "r"), "fresh\n");
    drop(e);
    let old = env_with(9, |t| {
        t.replace_once(
            "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\"",
            "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\" \"1\"",
        )
    });
    // A patcher that refuses its argv never places a build in its child: not the candidate's
    // doing, a no-decision.
    let (_, r) = try_build(&old, "echo built > $out/r", &[]);
    assert!(
        matches!(&r, Err(cordon_prebuild::prebuild::PrebuildError::Child(why)) if why.contains("did not place")),
        "{r:?}"
    );
    drop(old);
    // The stage's own deadline still ends a container whose patcher itself never ends (here a
    // step that is no patcher at all): it comes before anything the child's cgroup says.
    let stuck = env_with(9, |t| {
        t.replace_once(
            "argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\"",
            "argv \"/bin/busybox\" \"sleep\" \"60\"",
        )
    });
    let (_, o) = build(&stuck, "echo built > $out/r", &[]);
    assert_eq!(rejected(&o), "prebuild.deadline");
    drop(stuck);

    // Pages a build fills in its tmpfs /tmp belong to no process but are charged to its own
    // cgroup (issue 33's first hole): with /tmp larger than the memory limit, filling it past
    // the limit is the OOM killer's, and the same fill succeeds with only the limit raised.
    let fill = "busybox head -c 400000000 /dev/zero > /tmp/fill && echo filled > $out/r";
    let big_tmp = |t: String| {
        t.replace_once(
            "tmp size=\"8MiB\" exec=#false",
            "tmp size=\"512MiB\" exec=#false",
        )
    };
    let e = env_with(9, big_tmp);
    let (_, o) = build(&e, fill, &[]);
    assert_eq!(rejected(&o), "prebuild.oom");
    drop(e);
    let e = env_with(9, |t| {
        big_tmp(t)
            .replace_once("memory \"256MiB\"", "memory \"1GiB\"")
            .replace_once("memory=\"192MiB\"", "memory=\"900MiB\"")
    });
    let (_, o) = build(&e, fill, &[]);
    assert_eq!(published(&e, &o, "r"), "filled\n");
    drop(e);
}

/// The patcher's child is held to its own share, inside the stage's, by the host (on cgroup v1
/// and v2 alike: `checks/cgroup2.sh` runs this on v2): each bound met from inside, and the same
/// probe passing with only that bound raised.
#[test]
fn the_patchers_child_is_held_to_its_memory_pids_and_deadline() {
    let e_dir = tempfile::tempdir().unwrap();
    let child = |memory: &str, pids: u32, deadline: &str| {
        let edit = format!("child cpus=4 memory={memory:?} pids={pids} deadline={deadline:?}");
        env_in("prebuild-tiers", 9, move |t| {
            t.replace_once(
                "child cpus=4 memory=\"192MiB\" pids=48 deadline=\"6s\"",
                &edit,
            )
        })
    };
    let balloon = "busybox dd if=/dev/zero of=/dev/null bs=100M count=1 && echo grew > $out/r";
    let attempt = cordon_testkit::attempt_program(e_dir.path());
    let forks = "/engine/attempt pids 24 > $out/r";
    let slow = "busybox sleep 2; echo slept > $out/r";
    let e = child("64MiB", 12, "1s");
    let (_, o) = build(&e, balloon, &[]);
    assert_eq!(rejected(&o), "prebuild.oom", "memory");
    let (_, o) = build(&e, forks, &[("attempt", &attempt)]);
    assert_eq!(published(&e, &o, "r"), "pids=blocked:11\n", "pids");
    let (_, o) = build(&e, slow, &[]);
    assert_eq!(rejected(&o), "prebuild.child-deadline");
    // Nothing but its cgroup.procs is the build's: its own limits stay root's.
    let (_, o) = build(
        &e,
        "for f in /cordon/child/memory/memory.limit_in_bytes /cordon/child/unified/memory.max; do if [ -e $f ]; then echo 999999999 > $f && echo raised > $out/r || echo refused > $out/r; fi; done",
        &[],
    );
    assert_eq!(published(&e, &o, "r"), "refused\n");
    drop(e);
    let e = child("192MiB", 40, "6s");
    let (_, o) = build(&e, balloon, &[]);
    assert_eq!(published(&e, &o, "r"), "grew\n", "memory, ablated");
    let (_, o) = build(&e, forks, &[("attempt", &attempt)]);
    assert_eq!(published(&e, &o, "r"), "pids=ok\n", "pids, ablated");
    let (_, o) = build(&e, slow, &[]);
    assert_eq!(published(&e, &o, "r"), "slept\n", "deadline, ablated");
}

/// What the prebuild reopens before it trusts it: the image layout against the policy's pin,
/// and a cached publication against its record. Each changed behind the store's back is a
/// no-decision — never a build in a wrong image, never a cached result that is not what was
/// sealed.
#[test]
fn a_tampered_or_mispinned_image_and_a_corrupt_cached_publication_are_no_decisions() {
    use std::os::unix::fs::PermissionsExt;
    let e = env(0);
    // A clean build, then its cached publication tampered with.
    let (tree, o) = build(&e, "echo ok > $out/a", &[]);
    let Decision::Accepted(Published { publication, .. }) = &o else {
        panic!("{o:?}")
    };
    // The cache entry edited to name another tree's publication, whole and verified: its
    // control record says it is not this build's, so it is never handed out.
    let (_, other) = build(&e, "echo other > $out/a", &[]);
    let Decision::Accepted(Published {
        publication: theirs,
        ..
    }) = &other
    else {
        panic!("{other:?}")
    };
    let entries = e.store.path("publications", "");
    let ours = std::fs::read_dir(&entries)
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| {
            std::fs::read_to_string(p).is_ok_and(|t| t.contains(&publication.digest.to_string()))
        })
        .expect("the cache entry of the first build");
    let text = std::fs::read_to_string(&ours).unwrap();
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(
        &ours,
        text.replace(&publication.digest.to_string(), &theirs.digest.to_string()),
    )
    .unwrap();
    let r = prebuild(&e.policy, &e.cfg, &tree, "build-native", true);
    assert!(
        matches!(&r, Err(cordon_prebuild::prebuild::PrebuildError::Control(why)) if why.contains("built from tree")),
        "another tree's publication in the cache: {r:?}"
    );
    std::fs::write(&ours, text).unwrap();
    let object = e.store.object_path(&publication.entries[0].sha256, false);
    std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&object, "ko\n").unwrap();
    let r = prebuild(&e.policy, &e.cfg, &tree, "build-native", true);
    assert!(
        matches!(r, Err(cordon_prebuild::prebuild::PrebuildError::Tree(_))),
        "a corrupt cached publication: {r:?}"
    );
    // The pin names another image: refused before anything runs.
    let pinned = cordon_testkit::isolated_policy(
        e.dir.path(),
        cordon_testkit::account_range("prebuild-hostile", 0),
    )
    .replace_once(
        "sha256:0efbca039f7fdca394eb074de77367957ec4ff290f1faa1f843854525dd4a9b5",
        "sha256:1111111111111111111111111111111111111111111111111111111111111111",
    );
    let policy = cordon_policy_lang::parse("pin.kdl", &pinned).unwrap();
    let r = prebuild(&policy, &e.cfg, &tree, "build-native", true);
    assert!(
        matches!(r, Err(cordon_prebuild::prebuild::PrebuildError::Image(_))),
        "a mis-pinned image: {r:?}"
    );
    // A blob of the layout changed: refused the same way.
    let blobs = e.dir.path().join("images/prebuild/blobs/sha256");
    let blob = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|d| d.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let r = prebuild(&e.policy, &e.cfg, &tree, "build-native", true);
    assert!(
        matches!(r, Err(cordon_prebuild::prebuild::PrebuildError::Image(_))),
        "a tampered image layout: {r:?}"
    );
    let left = Manager::open(&e.store, e.cfg.setup.clone())
        .unwrap()
        .check()
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}
