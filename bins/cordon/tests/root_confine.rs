//! The confined parser child, from inside and outside (root: it needs `chroot` and `setresuid`).
//!
//! This test binary is its own child: started with [`confine::CHILD_ARG`] it confines itself
//! with the product's [`confine::enter`] and then runs a *probe* — test-only code standing in
//! for a parser subverted by its input (a simulated parser bug), which tries what a hostile
//! parser would: open the store or a host file, open a socket, start a process, regain root,
//! allocate without bound, spin. Each attempt must end the child the way the module documents,
//! and [`confine::classify`] must call it the candidate's fault. The facts only the kernel
//! knows (uid, capabilities, no-new-privileges, seccomp mode, root directory, namespaces,
//! limits) are read from outside, in `/proc`, while a child waits on its input.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cordon::archive::{ArchiveLimits, Rejection};
use cordon::canonical::Digest;
use cordon::confine::{self, Ended, Launch, Limits, Spec};
use cordon::host::{Linux, Process};
use cordon::intake::{IntakeError, ingest_confined};
use cordon::store::Store;
use libtest_mimic::{Arguments, Failed, Trial};

/// Where the `datagram-sendto` probe tries to send instead of its socket's peer.
const ELSEWHERE: &str = "127.0.0.1:9";

/// The probes, run inside the confined child; the exit status is the verdict the test reads.
fn probe(kind: &str) -> i32 {
    let mut input = String::new();
    match kind {
        // Wait for the parent to close stdin: the child is observed from outside meanwhile.
        "wait" => {
            let _ = std::io::stdin().read_to_string(&mut input);
            0
        }
        // A path on stdin: opening it must be refused by the filter (EACCES), never succeed.
        // The empty root alone would answer ENOENT: 12 says the filter did not decide.
        "open" => {
            let _ = std::io::stdin().read_to_string(&mut input);
            match std::fs::File::open(input.trim()) {
                Ok(_) => 10,
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => 11,
                Err(_) => 12,
            }
        }
        "socket" => match std::net::TcpStream::connect("127.0.0.1:9") {
            Ok(_) => 10,
            Err(_) => 11,
        },
        // The connection the parent gave it as stdin: a descriptor of its own, then a
        // round trip over it (what a transfer child does).
        "use-connection" => {
            use std::os::fd::AsFd;
            let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else {
                return 10;
            };
            let mut conn = std::net::TcpStream::from(fd);
            let mut reply = [0u8; 4];
            match conn
                .write_all(b"ping")
                .and_then(|()| conn.read_exact(&mut reply))
            {
                Ok(()) if &reply == b"pong" => 0,
                _ => 12,
            }
        }
        // The datagram socket the parent connected (what a resolver child holds): a send on
        // it; or a send naming another destination ([`ELSEWHERE`]), which the kernel would
        // honour on a connected datagram socket. Nothing else is called: a kill is the send's.
        "datagram-send" | "datagram-sendto" => {
            use std::os::fd::AsFd;
            let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else {
                return 10;
            };
            let sock = std::net::UdpSocket::from(fd);
            let sent = if kind == "datagram-send" {
                sock.send(b"ping")
            } else {
                sock.send_to(b"ping", ELSEWHERE)
            };
            match sent {
                Ok(_) => 0,
                Err(_) => 12,
            }
        }
        // Asking the kernel to signal another process of the account when data arrives on
        // the connection (F_SETOWN): refused by the filter.
        "signal-owner" => {
            use std::os::fd::AsFd;
            match nix::fcntl::fcntl(std::io::stdin().as_fd(), nix::fcntl::FcntlArg::F_GETFL) {
                Ok(_) => {}
                Err(_) => return 12,
            }
            let _ = nix::fcntl::fcntl(
                std::io::stdin().as_fd(),
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_ASYNC),
            );
            10
        }
        // A process, not a thread: fork is clone without CLONE_THREAD.
        "process" => match std::process::Command::new("/bin/true").status() {
            Ok(_) => 10,
            Err(_) => 11,
        },
        // A thread works: the C library's clone3 falls back to a checked clone.
        "thread" => match std::thread::spawn(|| 7).join() {
            Ok(7) => 0,
            _ => 10,
        },
        "setuid" => match nix::unistd::setuid(nix::unistd::Uid::from_raw(0)) {
            Ok(()) => 10,
            Err(_) => 11,
        },
        // Allocation past RLIMIT_AS aborts.
        "allocate" => {
            let mut v: Vec<Vec<u8>> = Vec::new();
            loop {
                v.push(vec![1u8; 64 << 20]);
                if v.len() > 1024 {
                    return 10;
                }
            }
        }
        // CPU past RLIMIT_CPU: SIGXCPU.
        "spin" => {
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        }
        // The real archive parser.
        cordon::intake::ARCHIVE_CHILD => cordon::intake::archive_child(
            &mut std::io::stdin().lock(),
            &mut std::io::stdout().lock(),
        ),
        // Parsers that lie to the parent about what they decoded.
        "lie-path" => lie(&[
            (
                b'F',
                br#"{"path":"../../etc/cron.d/x","executable":false,"size":1}"#,
            ),
            (b'B', b"x"),
            (b'E', b""),
        ]),
        "lie-size" => lie(&[
            (b'F', br#"{"path":"a","executable":false,"size":1}"#),
            (b'B', b"xx"),
            (b'E', b""),
        ]),
        "lie-short" => lie(&[
            (b'F', br#"{"path":"a","executable":false,"size":3}"#),
            (b'B', b"x"),
            (b'E', b""),
        ]),
        "lie-code" => lie(&[(b'R', br#"{"code":"intake.fine","path":null,"message":"x"}"#)]),
        "lie-exit" => {
            let _ = lie(&[(b'E', b"")]);
            1
        }
        "no-end" => lie(&[(b'D', br#"{"path":"d"}"#)]),
        // A child that ends itself as if it had never confined, or kills itself.
        "exit125" => std::process::exit(confine::UNCONFINED_EXIT),
        "selfkill" => {
            // raise(3) is tgkill on this thread.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            10
        }
        // Reports one file and ends without reading the rest of its input.
        "early-end" => {
            let mut out = std::io::stdout().lock();
            for (tag, payload) in [
                (b'F', &br#"{"path":"a","executable":false,"size":1}"#[..]),
                (b'B', b"x"),
                (b'E', b""),
            ] {
                confine::write_frame(&mut out, tag, payload).unwrap();
            }
            out.flush().unwrap();
            0
        }
        // Request/answer children.
        "answer-echo" => confine::answer(|mut q| {
            q.reverse();
            q
        }),
        "answer-twice" => lie(&[(b'A', b"one"), (b'A', b"two")]),
        "answer-tag" => lie(&[(b'X', b"one")]),
        "answer-none" => lie(&[]),
        "answer-huge" => lie(&[(b'A', &[0u8; 2048])]),
        "extra-field" => lie(&[
            (
                b'F',
                br#"{"path":"a","executable":true,"size":0,"mode":2541}"#,
            ),
            (b'E', b""),
        ]),
        _ => 12,
    }
}

/// Drain the input, then write `frames` and exit 0.
fn lie(frames: &[(u8, &[u8])]) -> i32 {
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    let mut out = std::io::stdout().lock();
    for (tag, payload) in frames {
        confine::write_frame(&mut out, *tag, payload).unwrap();
    }
    out.flush().unwrap();
    0
}

struct Env {
    _dir: tempfile::TempDir,
    jail: PathBuf,
    store: PathBuf,
    uid: u32,
}

fn env(slot: u32) -> Env {
    cordon_testkit::require_root("the confined child needs chroot and setresuid");
    let dir = tempfile::tempdir().unwrap();
    let jail = dir.path().join("jail");
    std::fs::create_dir(&jail).unwrap();
    std::fs::set_permissions(&jail, std::fs::Permissions::from_mode(0o500)).unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::write(store.join("object"), b"store bytes").unwrap();
    std::fs::set_permissions(store.join("object"), std::fs::Permissions::from_mode(0o444)).unwrap();
    let (first, _) = cordon_testkit::account_range("cordon-confine", slot);
    Env {
        _dir: dir,
        jail,
        store,
        uid: first + 7,
    }
}

fn spec(e: &Env, kind: &str, cpu_seconds: u64) -> Spec {
    Spec {
        kind: kind.to_owned(),
        uid: e.uid,
        gid: e.uid,
        jail: e.jail.clone(),
        limits: Limits {
            address_space: 512 << 20,
            cpu_seconds,
        },
        argument: None,
    }
}

/// Run the child `s` describes with nothing on stdin: its status and stderr.
fn run_spec(s: &Spec) -> (ExitStatus, String) {
    output(
        confine::spawn(
            &Linux,
            &std::env::current_exe().unwrap(),
            s,
            cordon::host::Stdin::Null,
        )
        .unwrap(),
    )
}

fn start(e: &Env, kind: &str, cpu_seconds: u64) -> Process {
    confine::spawn(
        &Linux,
        &std::env::current_exe().unwrap(),
        &spec(e, kind, cpu_seconds),
        cordon::host::Stdin::Pipe,
    )
    .unwrap()
}

/// Its status and stderr, its output drained to the end.
fn output(mut child: Process) -> (ExitStatus, String) {
    let drain = |pipe: Option<std::io::PipeReader>| {
        let mut pipe = pipe.unwrap();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).unwrap();
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let status = child.wait().unwrap().status;
    out.join().unwrap();
    (status, err.join().unwrap())
}

/// Run probe `kind` with `input` on stdin; how it ended.
fn ended(
    e: &Env,
    kind: &str,
    input: &str,
    cpu_seconds: u64,
) -> (Ended, std::process::ExitStatus, String) {
    let mut child = start(e, kind, cpu_seconds);
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let (status, stderr) = output(child);
    (confine::classify(status, false), status, stderr)
}

fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("/proc/{pid}/status has no {key}"))
        .trim()
        .to_owned()
}

/// Wait until the child has confined itself (its uid changed) or fail.
fn confined_pid(child: &Process, uid: u32) -> u32 {
    let pid = u32::try_from(child.pid()).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let seccomp = status_field(pid, "Seccomp");
        let uids = status_field(pid, "Uid");
        if seccomp == "2" && uids.split_whitespace().all(|u| u == uid.to_string()) {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "the child never confined itself: Uid {uids}, Seccomp {seccomp}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn the_child_runs_as_the_account_with_nothing_left_observed_from_outside() -> Result<(), Failed> {
    let e = env(0);
    let mut child = start(&e, "wait", 10);
    let pid = confined_pid(&child, e.uid);
    let id = e.uid.to_string();
    for key in ["Uid", "Gid"] {
        let v = status_field(pid, key);
        assert!(v.split_whitespace().all(|x| x == id), "{key}: {v}");
    }
    assert_eq!(status_field(pid, "Groups"), "", "no supplementary groups");
    for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, key), "0000000000000000", "{key}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    // Its root is the empty jail; its network and IPC namespaces are its own.
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/root")).unwrap(),
        e.jail
    );
    for ns in ["net", "ipc"] {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        assert_ne!(mine, its, "the child shares the {ns} namespace");
    }
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let row = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {limits}"))
            .split_whitespace()
            .rev()
            .skip(1)
            .take(2)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("Max address space"), ["536870912", "536870912"]);
    assert_eq!(row("Max cpu time"), ["11", "10"]);
    assert_eq!(row("Max file size"), ["0", "0"]);
    assert_eq!(row("Max core file size"), ["0", "0"]);
    assert_eq!(row("Max processes"), ["4", "4"]);
    drop(child.stdin.take());
    assert!(output(child).0.success());
    Ok(())
}

fn killed_by(status: std::process::ExitStatus, signal: nix::sys::signal::Signal) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(signal as i32)
}

fn a_subverted_parser_cannot_open_the_store_a_host_file_a_socket_or_a_process() -> Result<(), Failed>
{
    use nix::sys::signal::Signal;
    let e = env(1);
    let object = e.store.join("object");
    // Opening a file by name is answered EACCES by the filter (the C library's allocator opens
    // files of its own and copes with a refusal): the probe sees the refusal and exits 11.
    for input in [object.to_str().unwrap(), "/etc/passwd", "/proc/self/status"] {
        let (end, status, stderr) = ended(&e, "open", input, 10);
        assert_eq!(status.code(), Some(11), "open {input}: {status:?} {stderr}");
        assert!(matches!(end, Ended::Broke(_)), "open: {end:?}");
    }
    for (kind, input) in [("socket", ""), ("process", ""), ("setuid", "")] {
        let (end, status, stderr) = ended(&e, kind, input, 10);
        assert!(
            killed_by(status, Signal::SIGSYS),
            "{kind} {input}: {status:?} {stderr}"
        );
        assert!(matches!(end, Ended::Broke(_)), "{kind}: {end:?}");
    }
    // What a parser needs still works: threads.
    let (end, status, stderr) = ended(&e, "thread", "", 10);
    assert_eq!(end, Ended::Done, "{status:?} {stderr}");
    // A child handed a connection as its stdin (a transfer child) may use that one: and still
    // neither make a socket nor connect one.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        for _ in 0..3 {
            let (mut conn, _) = listener.accept().unwrap();
            let mut ping = [0u8; 4];
            if conn.read_exact(&mut ping).is_ok() {
                let _ = conn.write_all(b"pong");
            }
        }
    });
    // Probe `kind` with `socket` as its stdin.
    let on_socket = |kind: &str, socket: std::os::fd::OwnedFd| {
        output(
            confine::spawn(
                &Linux,
                &std::env::current_exe().unwrap(),
                &spec(&e, kind, 10),
                cordon::host::Stdin::Fd(socket),
            )
            .unwrap(),
        )
    };
    let on_connection =
        |kind: &str| on_socket(kind, std::net::TcpStream::connect(at).unwrap().into());
    let (status, stderr) = on_connection("use-connection");
    assert_eq!(status.code(), Some(0), "{status:?} {stderr}");
    let (status, stderr) = on_connection("socket");
    assert!(killed_by(status, Signal::SIGSYS), "{status:?} {stderr}");
    // Reading its flags is admitted; setting O_ASYNC (signals to a process it names) is not.
    let (status, stderr) = on_connection("signal-owner");
    assert!(killed_by(status, Signal::SIGSYS), "{status:?} {stderr}");
    peer.join().unwrap();
    // A datagram socket connected to one peer (a resolver child's nameserver): a send to it
    // arrives; a send naming another address is killed and nothing reaches that address.
    let bound = |port: u16| std::net::UdpSocket::bind(("127.0.0.1", port)).unwrap();
    let nameserver = bound(0);
    let elsewhere = std::net::UdpSocket::bind(ELSEWHERE)
        .unwrap_or_else(|e| panic!("this test needs {ELSEWHERE} free: {e}"));
    for s in [&nameserver, &elsewhere] {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
    }
    let on_datagram = |kind: &str| {
        let sock = bound(0);
        sock.connect(nameserver.local_addr().unwrap()).unwrap();
        on_socket(kind, sock.into())
    };
    let (status, stderr) = on_datagram("datagram-send");
    assert_eq!(status.code(), Some(0), "{status:?} {stderr}");
    let mut got = [0u8; 8];
    assert_eq!(nameserver.recv(&mut got).unwrap(), 4);
    let (status, stderr) = on_datagram("datagram-sendto");
    assert!(killed_by(status, Signal::SIGSYS), "{status:?} {stderr}");
    assert!(
        elsewhere.recv(&mut got).is_err(),
        "a datagram reached another address"
    );
    // The same round trip from a child whose stdin is a pipe is killed: the socket calls are
    // admitted only to a child the parent gave a connection.
    let (end, status, stderr) = ended(&e, "use-connection", "", 10);
    assert!(killed_by(status, Signal::SIGSYS), "{status:?} {stderr}");
    assert!(matches!(end, Ended::Broke(_)), "{end:?}");
    Ok(())
}

fn a_parser_past_its_limits_is_the_candidates_fault() -> Result<(), Failed> {
    use nix::sys::signal::Signal;
    let e = env(2);
    let (end, status, stderr) = ended(&e, "allocate", "", 10);
    assert!(killed_by(status, Signal::SIGABRT), "{status:?} {stderr}");
    assert!(matches!(end, Ended::Broke(_)), "{end:?}");
    let (end, status, stderr) = ended(&e, "spin", "", 1);
    assert!(killed_by(status, Signal::SIGXCPU), "{status:?} {stderr}");
    assert!(matches!(end, Ended::Broke(_)), "{end:?}");
    Ok(())
}

fn a_child_that_cannot_confine_itself_reads_nothing_and_says_so() -> Result<(), Failed> {
    let e = env(3);
    // Root is refused as the run account, before anything else changes.
    let mut s = spec(&e, "open", 10);
    s.uid = 0;
    let (status, _) = run_spec(&s);
    assert_eq!(status.code(), Some(confine::UNCONFINED_EXIT));
    assert!(matches!(
        confine::classify(status, false),
        Ended::Infrastructure(_)
    ));
    // A jail that does not exist.
    let mut s = spec(&e, "open", 10);
    s.jail = Path::new("/nonexistent/jail").to_path_buf();
    let (status, stderr) = run_spec(&s);
    assert_eq!(status.code(), Some(confine::UNCONFINED_EXIT));
    assert!(stderr.contains("chroot"));
    Ok(())
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_archive_bytes: 1 << 20,
        max_extracted_bytes: 1 << 20,
        max_members: 100,
        max_file_bytes: 1 << 20,
        max_path_length: 256,
        max_depth: 8,
        max_pax_bytes: 4096,
        max_compression_ratio: 100,
        exclude: vec![],
    }
}

fn launch(e: &Env, kind: &str, cpu_seconds: u64, deadline: Duration) -> Launch {
    Launch {
        host: Linux::shared(),
        exe: std::env::current_exe().unwrap(),
        spec: spec(e, kind, cpu_seconds),
        budget: deadline,
    }
}

fn ingest(e: &Env, kind: &str, archive: &[u8]) -> Result<cordon::intake::Admitted, IntakeError> {
    let store = Store::open(&e.store.join("s")).unwrap();
    let sha = Digest::of_bytes(archive);
    ingest_confined(
        &store,
        archive,
        &sha,
        &limits(),
        &launch(e, kind, 1, Duration::from_secs(30)),
        &|| {},
    )
}

fn rejected(r: Result<cordon::intake::Admitted, IntakeError>) -> Rejection {
    match r {
        Err(IntakeError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn the_parent_admits_what_the_real_parser_reports_and_hashes_it_itself() -> Result<(), Failed> {
    let e = env(4);
    let archive = tar_of(&[("pkg/a.py", b"x = 1\n"), ("pkg/b", b"")]);
    let admitted = ingest(&e, cordon::intake::ARCHIVE_CHILD, &archive).unwrap();
    assert_eq!(admitted.archive.archive_sha256, Digest::of_bytes(&archive));
    let files: Vec<(&str, Digest)> = admitted
        .record
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.sha256))
        .collect();
    assert_eq!(
        files,
        [
            ("pkg/a.py", Digest::of_bytes(b"x = 1\n")),
            ("pkg/b", Digest::of_bytes(b""))
        ]
    );
    // A shape rule the real parser enforces comes back as its own code.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "link", "/etc/shadow").unwrap();
    let bad = b.into_inner().unwrap();
    let r = rejected(ingest(&e, cordon::intake::ARCHIVE_CHILD, &bad));
    assert_eq!(
        (r.code, r.path.as_deref()),
        ("intake.symlink", Some("link"))
    );
    Ok(())
}

fn a_lying_parser_is_caught_by_the_parents_own_checks_and_the_store_is_unchanged()
-> Result<(), Failed> {
    let e = env(5);
    let archive = tar_of(&[("a", b"x")]);
    let store = Store::open(&e.store.join("s")).unwrap();
    let before = store.content_listing().unwrap();
    for (kind, code) in [
        ("lie-path", "intake.dotdot"),
        ("lie-size", "intake.parser"),
        ("lie-short", "intake.parser"),
        ("lie-code", "intake.parser"),
        ("lie-exit", "intake.parser"),
        ("no-end", "intake.parser"),
        ("extra-field", "intake.parser"),
        ("exit125", "intake.parser"),
        ("selfkill", "intake.parser"),
        ("spin", "intake.parser"),
        ("socket", "intake.parser"),
    ] {
        let r = rejected(ingest(&e, kind, &archive));
        assert_eq!(r.code, code, "{kind}: {r}");
        assert_eq!(store.content_listing().unwrap(), before, "{kind}");
    }
    Ok(())
}

/// A source that gives a byte every 50 ms for `total` bytes.
struct Drip(usize);

impl Read for Drip {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0 == 0 || buf.is_empty() {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(50));
        self.0 -= 1;
        buf[0] = 0;
        Ok(1)
    }
}

fn a_parser_past_the_deadline_is_rejected_and_one_killed_from_outside_is_no_decision()
-> Result<(), Failed> {
    let e = env(6);
    let store = Store::open(&e.store.join("s")).unwrap();
    let before = store.content_listing().unwrap();
    let sha = Digest::of_bytes(b"");
    let r = ingest_confined(
        &store,
        Drip(40),
        &sha,
        &limits(),
        &launch(&e, "wait", 10, Duration::from_millis(300)),
        &|| {},
    );
    let r = rejected(r);
    assert_eq!(r.code, "intake.parser");
    assert!(r.message.contains("deadline"), "{r}");
    // Killed by someone else: found from outside by its uid, then killed.
    let uid = e.uid;
    let killer = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let found = std::fs::read_dir("/proc").unwrap().find_map(|d| {
                let pid: u32 = d.ok()?.file_name().to_str()?.parse().ok()?;
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                (status
                    .lines()
                    .any(|l| l.starts_with("Uid:") && l.contains(&uid.to_string()))
                    && status.lines().any(|l| l == "Seccomp:\t2"))
                .then_some(pid)
            });
            if let Some(pid) = found {
                // Past its filter, it writes its marker and waits on its input.
                std::thread::sleep(Duration::from_millis(100));
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                return;
            }
            assert!(Instant::now() < until, "the child never appeared");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let r = ingest_confined(
        &store,
        Drip(100),
        &sha,
        &limits(),
        &launch(&e, "wait", 10, Duration::from_secs(30)),
        &|| {},
    );
    killer.join().unwrap();
    match r {
        Err(IntakeError::Child(why)) => assert!(why.contains("killed from outside"), "{why}"),
        other => panic!("expected a no-decision, got {other:?}"),
    }
    assert_eq!(store.content_listing().unwrap(), before);
    Ok(())
}

fn an_exchange_returns_the_answer_and_judges_every_other_end() -> Result<(), Failed> {
    use cordon::confine::{ExchangeError, exchange};
    let e = env(7);
    let ask = |kind: &str, cpu: u64| {
        exchange(
            &launch(&e, kind, cpu, Duration::from_secs(30)),
            b"abc",
            1024,
        )
    };
    assert_eq!(ask("answer-echo", 10).unwrap(), b"cba");
    for kind in [
        "answer-twice",
        "answer-tag",
        "answer-none",
        "answer-huge",
        "spin",
        "socket",
    ] {
        match ask(kind, 1) {
            Err(ExchangeError::Broke(_)) => {}
            other => panic!("{kind}: expected the child's fault, got {other:?}"),
        }
    }
    let mut s = spec(&e, "answer-echo", 10);
    s.uid = 0;
    let unconfined = Launch {
        host: Linux::shared(),
        exe: std::env::current_exe().unwrap(),
        spec: s,
        budget: Duration::from_secs(30),
    };
    assert!(matches!(
        exchange(&unconfined, b"abc", 1024),
        Err(ExchangeError::Infrastructure(_))
    ));
    Ok(())
}

fn an_early_end_frame_is_no_decoding_of_the_whole_source() -> Result<(), Failed> {
    let e = env(8);
    // More than the pipes hold, so the parent is still writing when the child stops reading.
    let archive = vec![0u8; 8 << 20];
    let store = Store::open(&e.store.join("s")).unwrap();
    let mut l = limits();
    l.max_archive_bytes = 16 << 20;
    let r = ingest_confined(
        &store,
        archive.as_slice(),
        &Digest::of_bytes(b""),
        &l,
        &launch(&e, "early-end", 10, Duration::from_secs(30)),
        &|| {},
    );
    let r = rejected(r);
    assert_eq!(r.code, "intake.parser", "{r}");
    Ok(())
}

/// The intermediate parent of [`the_child_dies_with_its_parent`]: starts a confined `wait`
/// child, prints its pid, and sleeps until it is killed.
fn intermediate(uid: u32, jail: &Path) -> ! {
    let spec = Spec {
        kind: "wait".into(),
        uid,
        gid: uid,
        jail: jail.to_path_buf(),
        limits: Limits {
            address_space: 512 << 20,
            cpu_seconds: 10,
        },
        argument: None,
    };
    // Its input is this process's: the test holds it open, so only the parent-death signal
    // can end the child.
    // The product's command line, spawned here with this process's stdin (the seam pipes it).
    let tool = confine::tool(&std::env::current_exe().unwrap(), &spec);
    let child = std::process::Command::new(&tool.program)
        .args(&tool.args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::inherit())
        // Not this process's stdout: the child's own frames (its confined marker) would race
        // the pid line the test reads from it.
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    println!("{}", child.id());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(0)
}

fn the_child_dies_with_its_parent_and_holds_no_inherited_descriptor() -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let e = env(9);
    // A descriptor the parent holds without close-on-exec must not reach the child.
    let secret = e.store.join("object");
    let leaked = nix::fcntl::open(
        &secret,
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let mut middle = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--intermediate")
        .arg(e.uid.to_string())
        .arg(&e.jail)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let held_input = middle.stdin.take();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(middle.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while status_field(pid, "Seccomp") != "2" {
        assert!(Instant::now() < until, "the child never confined itself");
        std::thread::sleep(Duration::from_millis(10));
    }
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut fds = fds;
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"], "fd {} leaked", leaked.as_raw_fd());
    // Its parent dies: so must it (the parent-death signal survives the uid change).
    middle.kill().unwrap();
    middle.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let gone = state.is_empty()
            || state
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'));
        if gone {
            break;
        }
        assert!(
            Instant::now() < until,
            "the child outlived its parent: {state}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop((leaked, held_input));
    Ok(())
}

fn main() {
    if let Some((spec, parent)) = confine::requested() {
        confine::run_child(&spec, parent, |spec| probe(&spec.kind));
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--intermediate") {
        intermediate(args[2].parse().unwrap(), Path::new(&args[3]));
    }
    let tests = vec![
        Trial::test(
            "an_early_end_frame_is_no_decoding_of_the_whole_source",
            an_early_end_frame_is_no_decoding_of_the_whole_source,
        ),
        Trial::test(
            "the_child_dies_with_its_parent_and_holds_no_inherited_descriptor",
            the_child_dies_with_its_parent_and_holds_no_inherited_descriptor,
        ),
        Trial::test(
            "an_exchange_returns_the_answer_and_judges_every_other_end",
            an_exchange_returns_the_answer_and_judges_every_other_end,
        ),
        Trial::test(
            "the_parent_admits_what_the_real_parser_reports_and_hashes_it_itself",
            the_parent_admits_what_the_real_parser_reports_and_hashes_it_itself,
        ),
        Trial::test(
            "a_lying_parser_is_caught_by_the_parents_own_checks_and_the_store_is_unchanged",
            a_lying_parser_is_caught_by_the_parents_own_checks_and_the_store_is_unchanged,
        ),
        Trial::test(
            "a_parser_past_the_deadline_is_rejected_and_one_killed_from_outside_is_no_decision",
            a_parser_past_the_deadline_is_rejected_and_one_killed_from_outside_is_no_decision,
        ),
        Trial::test(
            "the_child_runs_as_the_account_with_nothing_left_observed_from_outside",
            the_child_runs_as_the_account_with_nothing_left_observed_from_outside,
        ),
        Trial::test(
            "a_subverted_parser_cannot_open_the_store_a_host_file_a_socket_or_a_process",
            a_subverted_parser_cannot_open_the_store_a_host_file_a_socket_or_a_process,
        ),
        Trial::test(
            "a_parser_past_its_limits_is_the_candidates_fault",
            a_parser_past_its_limits_is_the_candidates_fault,
        ),
        Trial::test(
            "a_child_that_cannot_confine_itself_reads_nothing_and_says_so",
            a_child_that_cannot_confine_itself_reads_nothing_and_says_so,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), tests).exit();
}
