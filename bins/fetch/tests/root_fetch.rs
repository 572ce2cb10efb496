//! cordon-fetch against real servers on loopback — an HTTPS one with a test CA that the policy
//! names as its only trust anchor, and a plain one — and against local files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::store::Store;
use cordon_fetch::cli::{Args, run};
use cordon_stage::args::{Diagnostics, LeaseArgs, StageArgs};

/// What the test server answers for a path.
#[derive(Clone)]
enum Reply {
    Body(Vec<u8>),
    Redirect(String),
    /// Sends the body a few bytes at a time, sleeping between.
    Slow(Vec<u8>),
    /// Declares a Content-Length smaller than what it sends.
    Lying(Vec<u8>),
    Status(u16),
    /// A status line and a header of its own, raw: an oversized header, terminal escapes.
    Raw(Vec<u8>),
    /// The body in chunked encoding, one byte per chunk.
    Chunked(Vec<u8>),
    /// A Content-Length of 1 MiB, these bytes, then silence until the client goes.
    Stalls(Vec<u8>),
}

type Routes = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

fn respond(stream: &mut dyn ReadWrite, routes: &Routes) {
    let mut req = Vec::new();
    let mut byte = [0u8; 1];
    while !req.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).unwrap_or(0) == 0 {
            return;
        }
        req.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&req);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let head = |status: &str, extra: &str, len: usize| {
        format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n{extra}\r\n")
    };
    let _ = match routes(&path) {
        Reply::Body(b) => stream
            .write_all(head("200 OK", "", b.len()).as_bytes())
            .and_then(|()| stream.write_all(&b)),
        Reply::Redirect(to) => {
            stream.write_all(head("302 Found", &format!("Location: {to}\r\n"), 0).as_bytes())
        }
        Reply::Status(code) => stream.write_all(head(&format!("{code} No"), "", 0).as_bytes()),
        Reply::Raw(bytes) => stream.write_all(&bytes),
        Reply::Chunked(b) => {
            let mut all =
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    .to_vec();
            for byte in b {
                all.extend_from_slice(b"1\r\n");
                all.push(byte);
                all.extend_from_slice(b"\r\n");
            }
            all.extend_from_slice(b"0\r\n\r\n");
            stream.write_all(&all)
        }
        Reply::Stalls(b) => {
            let r = stream
                .write_all(head("200 OK", "", 1 << 20).as_bytes())
                .and_then(|()| stream.write_all(&b))
                .and_then(|()| stream.flush());
            std::thread::sleep(Duration::from_secs(30));
            r
        }
        Reply::Lying(b) => stream
            .write_all(head("200 OK", "", 10).as_bytes())
            .and_then(|()| stream.write_all(&b)),
        Reply::Slow(b) => {
            let mut r = stream.write_all(head("200 OK", "", b.len()).as_bytes());
            for chunk in b.chunks(64) {
                std::thread::sleep(Duration::from_millis(200));
                r = r
                    .and_then(|()| stream.write_all(chunk))
                    .and_then(|()| stream.flush());
                if r.is_err() {
                    break;
                }
            }
            r
        }
    };
    let _ = stream.flush();
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// A server on 127.0.0.1: TLS with `tls`, plain otherwise. Returns its port.
fn serve(tls: Option<Arc<rustls::ServerConfig>>, routes: Routes) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(tcp) = conn else { continue };
            let routes = routes.clone();
            let tls = tls.clone();
            std::thread::spawn(move || handle(tcp, tls, &routes));
        }
    });
    port
}

fn handle(tcp: TcpStream, tls: Option<Arc<rustls::ServerConfig>>, routes: &Routes) {
    match tls {
        Some(cfg) => {
            let conn = rustls::ServerConnection::new(cfg).unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            respond(&mut s, routes);
            s.conn.send_close_notify();
            let _ = s.flush();
        }
        None => {
            let mut tcp = tcp;
            respond(&mut tcp, routes);
        }
    }
}

struct Pki {
    ca_pem: String,
    server: Arc<rustls::ServerConfig>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned(), NAMED_HOST.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server: Arc::new(server),
    }
}

/// A policy for these tests: the minimal example plus an intake section, its run accounts in
/// this test's own id block `slot` and its cron/at deny files in `dir`.
fn policy(dir: &Path, slot: u32, transport: &str) -> PathBuf {
    let base =
        cordon_testkit::isolated_minimal_policy(dir, cordon_testkit::account_range("fetch", slot));
    let text = format!(
        "{base}\nintake {{\n    transport {{\n{transport}\n    }}\n    archive {{\n        max-archive-bytes \"1MiB\"\n    }}\n}}\n"
    );
    let path = dir.join("policy.kdl");
    std::fs::write(&path, text).unwrap();
    path
}

fn archive() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(6);
    h.set_mode(0o644);
    b.append_data(&mut h, "pkg/a.py", &b"x = 1\n"[..]).unwrap();
    b.into_inner().unwrap()
}

struct Outcome {
    code: ExitCode,
    receipt: Option<serde_json::Value>,
    stderr: String,
}

/// The lease options of a test whose policy is in `dir`: run directories and runtime state in
/// it, an executor named after it.
fn lease_args(policy: &Path) -> LeaseArgs {
    let dir = policy.parent().unwrap();
    LeaseArgs {
        state_root: dir.join("state"),
        run_dir: Some(dir.join("run")),
        executor: Some(format!(
            "fetch-test-{}",
            dir.file_name().unwrap().to_str().unwrap()
        )),
    }
}

/// This package's binary: the confined parser child.
fn child() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cordon-fetch"))
}

fn args(policy: &Path, store: &Path, sha: &Digest, source: &str) -> Args {
    Args {
        stage: StageArgs::new(policy, Some(store)),
        lease: lease_args(policy),
        sha256: sha.hex(),
        source: source.to_owned(),
        hosts_file: "/etc/hosts".into(),
        resolv_conf: "/etc/resolv.conf".into(),
    }
}

fn fetch(policy: &Path, store: &Path, sha: &Digest, source: &str) -> Outcome {
    let args = args(policy, store, sha, source);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&args, child(), &mut out, &mut err);
    Outcome {
        code,
        receipt: serde_json::from_slice(&out).ok(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    }
}

/// A host no hosts file lists: only a nameserver answers for it.
const NAMED_HOST: &str = "fetch.cordon.test";

/// What the test nameserver does with a question.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dns {
    /// Answers A with this address and AAAA with nothing.
    Address([u8; 4]),
    /// Says the name does not exist.
    NoSuchName,
    /// Answers with bytes that are no DNS message, and with a well-formed answer to another
    /// query id, never with an answer to the question.
    Hostile,
    /// Says nothing.
    Silent,
}

/// A nameserver on `ip`:53 (a resolver file names no port) doing what `mode` says at the time
/// of each question.
fn nameserver(ip: &str, mode: Arc<std::sync::Mutex<Dns>>) {
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType, rdata::A};
    let socket = std::net::UdpSocket::bind((ip, 53)).unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                return;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::new();
            r.set_id(q.id()).set_message_type(MessageType::Response);
            for query in q.queries() {
                r.add_query(query.clone());
            }
            let mode = *mode.lock().unwrap();
            let replies: Vec<Vec<u8>> = match mode {
                Dns::Silent => vec![],
                Dns::NoSuchName => {
                    r.set_response_code(ResponseCode::NXDomain);
                    vec![r.to_vec().unwrap()]
                }
                Dns::Address(ip) => {
                    if q.queries()[0].query_type() == RecordType::A {
                        r.add_answer(Record::from_rdata(
                            q.queries()[0].name().clone(),
                            60,
                            RData::A(A::from(std::net::Ipv4Addr::from(ip))),
                        ));
                    }
                    vec![r.to_vec().unwrap()]
                }
                Dns::Hostile => {
                    r.set_id(q.id().wrapping_add(1));
                    r.add_answer(Record::from_rdata(
                        q.queries()[0].name().clone(),
                        60,
                        RData::A(A::from(std::net::Ipv4Addr::LOCALHOST)),
                    ));
                    vec![b"\xff\xff\x1b[31m not dns".to_vec(), r.to_vec().unwrap()]
                }
            };
            for reply in replies {
                let _ = socket.send_to(&reply, from);
            }
        }
    });
}

fn reason(o: &Outcome) -> String {
    o.receipt.as_ref().map_or_else(
        || format!("no receipt; stderr: {}", o.stderr),
        |r| r["reasons"][0]["code"].as_str().unwrap_or("").to_owned(),
    )
}

struct Setup {
    dir: tempfile::TempDir,
    pki: Pki,
    port: u16,
}

fn https(routes: Routes) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    std::fs::write(dir.path().join("ca.pem"), &pki.ca_pem).unwrap();
    let port = serve(Some(pki.server.clone()), routes);
    Setup { dir, pki, port }
}

fn loopback_policy(s: &Setup, slot: u32, extra: &str) -> PathBuf {
    let anchor = s.dir.path().join("ca.pem");
    policy(
        s.dir.path(),
        slot,
        &format!(
            "        allow-host \"localhost\" reason=\"the test server\"\n        trust-anchor \"{}\"\n        allow-loopback #true\n        max-redirects 2\n        deadline \"3s\"\n{extra}",
            anchor.display()
        ),
    )
}

fn routes_for(port: u16, body: Vec<u8>) -> Routes {
    Arc::new(move |path: &str| match path {
        "/a.tar" => Reply::Body(body.clone()),
        "/hop" => Reply::Redirect(format!("https://localhost:{port}/a.tar")),
        "/loop" => Reply::Redirect("/loop".to_owned()),
        "/away" => Reply::Redirect("https://example.com/a.tar".to_owned()),
        "/slow" => Reply::Slow(body.clone()),
        "/lie" => Reply::Lying(body.clone()),
        "/big" => Reply::Body(vec![0u8; 2 << 20]),
        "/huge-header" => Reply::Raw(
            [
                b"HTTP/1.1 200 OK\r\nX-Pad: ".as_slice(),
                &vec![b'a'; 1 << 20],
                b"\r\nContent-Length: 0\r\n\r\n",
            ]
            .concat(),
        ),
        "/escapes" => Reply::Raw(
            b"HTTP/1.1 500 \x1b[31mred\x1b]0;title\x07\r\nContent-Length: 0\r\n\r\n".to_vec(),
        ),
        _ => Reply::Status(404),
    })
}

/// Bind the routes after the port is known.
fn https_with_archive() -> (Setup, Vec<u8>) {
    let body = archive();
    let port_cell = Arc::new(std::sync::OnceLock::<u16>::new());
    let pc = port_cell.clone();
    let b = body.clone();
    let routes: Routes =
        Arc::new(move |path: &str| routes_for(*pc.get().unwrap(), b.clone())(path));
    let s = https(routes);
    port_cell.set(s.port).unwrap();
    (s, body)
}

#[test]
fn an_https_fetch_under_the_policys_trust_anchor_is_admitted() {
    let (s, body) = https_with_archive();
    let policy = loopback_policy(&s, 0, "");
    let store = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let url = format!("https://localhost:{}/a.tar", s.port);
    let o = fetch(&policy, &store, &sha, &url);
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
    let r = o.receipt.unwrap();
    assert_eq!(r["outputs"]["archive_sha256"], sha.to_string());
    assert_eq!(r["outputs"]["files"], 1);
    // A bounded redirect to the same allowed host is followed.
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/hop", s.port),
    );
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
    drop(s.pki);
}

/// A loopback test's policy (account block `slot`), its store, the store's content before
/// anything ran, and the committed digest of `body`.
struct Checked {
    policy: PathBuf,
    store_dir: PathBuf,
    store: Store,
    before: Vec<String>,
    sha: Digest,
}

fn checked(s: &Setup, slot: u32, body: &[u8]) -> Checked {
    let policy = loopback_policy(s, slot, "");
    let store_dir = s.dir.path().join("store");
    let store = Store::open(&store_dir).unwrap();
    let before = store.content_listing().unwrap();
    Checked {
        policy,
        store_dir,
        store,
        before,
        sha: Digest::of_bytes(body),
    }
}

/// A name no hosts file lists is resolved by a confined resolver child asking the resolver
/// file's nameserver (no DNS byte parsed by this root process): an honest answer is fetched
/// from; an answer naming a non-public address is refused like any other; a nameserver that
/// says the name does not exist, one that answers only with garbage and answers to other
/// queries, and one that stays silent each end in a no-decision within the deadline.
#[test]
fn names_are_resolved_by_a_confined_child_and_every_answer_is_checked() {
    let (s, body) = https_with_archive();
    let policy = loopback_policy(
        &s,
        3,
        &format!("        allow-host \"{NAMED_HOST}\" reason=\"the named test server\""),
    );
    let store = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let mode = Arc::new(std::sync::Mutex::new(Dns::Address([127, 0, 0, 1])));
    // Its own loopback address: port 53 on the usual ones may be the host's resolver.
    nameserver("127.0.53.3", mode.clone());
    let (hosts, resolv_conf) = (s.dir.path().join("hosts"), s.dir.path().join("resolv.conf"));
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    std::fs::write(&resolv_conf, "nameserver 127.0.53.3\n").unwrap();
    let url = format!("https://{NAMED_HOST}:{}/a.tar", s.port);
    let fetch_named = |dns: Dns| {
        *mode.lock().unwrap() = dns;
        let args = Args {
            hosts_file: hosts.clone(),
            resolv_conf: resolv_conf.clone(),
            ..args(&policy, &store, &sha, &url)
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let started = std::time::Instant::now();
        let code = run(&args, child(), &mut out, &mut err);
        (
            Outcome {
                code,
                receipt: serde_json::from_slice(&out).ok(),
                stderr: String::from_utf8_lossy(&err).into_owned(),
            },
            started.elapsed(),
        )
    };
    let (o, _) = fetch_named(Dns::Address([127, 0, 0, 1]));
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
    let (o, _) = fetch_named(Dns::Address([10, 1, 2, 3]));
    assert_eq!(o.code, ExitCode::Rejected, "{}", o.stderr);
    assert_eq!(reason(&o), "transport.non-public-address");
    for (dns, says) in [
        (Dns::NoSuchName, "does not exist"),
        (Dns::Hostile, "no answer"),
        (Dns::Silent, "no answer"),
    ] {
        let (o, took) = fetch_named(dns);
        assert_eq!(o.code, ExitCode::NoDecision, "{dns:?}: {}", o.stderr);
        assert!(o.stderr.contains(says), "{dns:?}: {}", o.stderr);
        // The terminal never sees the nameserver's bytes raw.
        assert!(!o.stderr.contains('\u{1b}'), "{dns:?}: {}", o.stderr);
        assert!(took < Duration::from_secs(6), "{dns:?} took {took:?}");
    }
    // A literal address and a listed name never ask a nameserver.
    *mode.lock().unwrap() = Dns::Silent;
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/a.tar", s.port),
    );
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
    drop(s.pki);
}

#[test]
fn transfers_that_break_a_transport_rule_are_rejected_and_store_nothing() {
    let (s, body) = https_with_archive();
    let Checked {
        policy,
        store_dir,
        store,
        before,
        sha,
    } = checked(&s, 1, &body);
    let at = |p: &str| format!("https://localhost:{}{p}", s.port);
    for (path, code) in [
        ("/loop", "transport.too-many-redirects"),
        ("/away", "transport.redirect"),
        ("/big", "transport.too-big"),
    ] {
        let o = fetch(&policy, &store_dir, &sha, &at(path));
        assert_eq!(o.code, ExitCode::Rejected, "{path}: {}", o.stderr);
        assert_eq!(reason(&o), code, "{path}");
        assert_eq!(
            store.content_listing().unwrap(),
            before,
            "{path}: the store changed"
        );
    }
    // A Content-Length that lies is not trusted: the bytes received are what count.
    let o = fetch(&policy, &store_dir, &sha, &at("/lie"));
    assert_ne!(o.code, ExitCode::Ok, "a lying Content-Length must not pass");
    assert_eq!(store.content_listing().unwrap(), before);
}

#[test]
fn failures_cordon_cannot_attribute_are_no_decisions() {
    let (s, body) = https_with_archive();
    let store = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let policy = loopback_policy(&s, 2, "");
    // The deadline covers the whole transfer, however slowly the bytes drip.
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/slow", s.port),
    );
    assert_eq!(o.code, ExitCode::NoDecision, "{}", o.stderr);
    assert!(
        o.receipt.unwrap()["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("deadline")
    );
    // A server whose certificate does not chain to the trust anchor.
    std::fs::write(s.dir.path().join("ca.pem"), pki().ca_pem).unwrap();
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/a.tar", s.port),
    );
    assert_eq!(o.code, ExitCode::NoDecision, "{}", o.stderr);
    // A 404.
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/missing", s.port),
    );
    assert_eq!(o.code, ExitCode::NoDecision, "{}", o.stderr);
}

/// An archive of one file of `size` bytes.
fn archive_of(size: usize) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(size as u64);
    h.set_mode(0o644);
    let text: Vec<u8> = (0..size).map(|i| b"# comment line\n"[i % 15]).collect();
    b.append_data(&mut h, "pkg/a.py", text.as_slice()).unwrap();
    b.into_inner().unwrap()
}

/// A body in the smallest pieces HTTP allows costs no more than in one piece: an honest
/// 1-byte-chunked archive of 300 KiB under a 1 MiB cap is admitted. And an archive the parser
/// rejects from its first bytes is rejected at once, its transfer ended, even while the
/// server stalls on the rest.
#[test]
fn small_chunks_are_admitted_and_an_early_rejection_ends_the_transfer() {
    let body = archive_of(300 << 10);
    let b = body.clone();
    let routes: Routes = Arc::new(move |path: &str| match path {
        "/chunked" => Reply::Chunked(b.clone()),
        "/stalls" => Reply::Stalls(vec![0x5a; 4096]),
        _ => Reply::Status(404),
    });
    let s = https(routes);
    let policy = loopback_policy(&s, 9, "");
    let store = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/chunked", s.port),
    );
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
    let started = std::time::Instant::now();
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/stalls", s.port),
    );
    assert_eq!(o.code, ExitCode::Rejected, "{}", o.stderr);
    assert!(reason(&o).starts_with("intake."), "{}", reason(&o));
    // The policy's deadline is 3 s: the verdict came before it.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// A raw server on loopback that reads the client's first bytes and answers `reply`. Its port.
fn raw_server(reply: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut tcp) = conn else { continue };
            let mut first = [0u8; 512];
            let _ = tcp.read(&mut first);
            let _ = tcp.write_all(reply);
        }
    });
    port
}

/// TLS and HTTP are spoken by the transfer child alone: a hostile server's malformed TLS
/// records, an oversized header or a status line full of terminal escapes ends in a receipt
/// (a no-decision or a rejection, the message escaped), never in a crash of this process, and
/// the store is unchanged.
#[test]
fn a_hostile_servers_bytes_end_in_a_receipt_never_in_the_root_process() {
    let (s, body) = https_with_archive();
    let Checked {
        policy,
        store_dir,
        store,
        before,
        sha,
    } = checked(&s, 8, &body);
    // A handshake record of the largest length and garbage in it; a fatal alert; noise.
    let garbage: &'static [u8] = Box::leak(
        [b"\x16\x03\x03\xff\xff".as_slice(), &[0xa5u8; 70_000]]
            .concat()
            .into_boxed_slice(),
    );
    let sources: Vec<String> = [
        raw_server(garbage),
        raw_server(b"\x15\x03\x03\x00\x02\x02\x28"),
        raw_server(b"HTTP/1.1 200 OK\r\n\r\n"),
    ]
    .iter()
    .map(|port| format!("https://localhost:{port}/a.tar"))
    .chain(["/huge-header", "/escapes"].map(|p| format!("https://localhost:{}{p}", s.port)))
    .collect();
    for source in sources {
        let o = fetch(&policy, &store_dir, &sha, &source);
        assert!(
            matches!(o.code, ExitCode::NoDecision | ExitCode::Rejected),
            "{source}: {:?} {}",
            o.code,
            o.stderr
        );
        let receipt = o.receipt.expect("a receipt");
        let message = receipt["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            !message.contains('\x1b') && !o.stderr.contains('\x1b'),
            "{source}: {message:?}"
        );
        // What broke is named (the child's TLS or HTTP error), not a crash.
        assert!(
            message.contains("TLS:") || message.contains("HTTP:"),
            "{source}: {message:?}"
        );
        assert_eq!(store.content_listing().unwrap(), before, "{source}");
    }
}

#[test]
fn loopback_is_refused_unless_the_policy_allows_it() {
    let (s, body) = https_with_archive();
    let anchor = s.dir.path().join("ca.pem");
    let policy = policy(
        s.dir.path(),
        3,
        &format!(
            "        allow-host \"localhost\" reason=\"the test server\"\n        trust-anchor \"{}\"",
            anchor.display()
        ),
    );
    let store = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://localhost:{}/a.tar", s.port),
    );
    assert_eq!(o.code, ExitCode::Rejected, "{}", o.stderr);
    assert_eq!(reason(&o), "transport.non-public-address");
    // A literal loopback address is refused before any connection: the operator's input.
    let o = fetch(
        &policy,
        &store,
        &sha,
        &format!("https://127.0.0.1:{}/a.tar", s.port),
    );
    assert_eq!(o.code, ExitCode::Usage, "{}", o.stderr);
    // A host that is not on the allow-list, and a scheme that is not https.
    let o = fetch(&policy, &store, &sha, "https://example.com/a.tar");
    assert_eq!(o.code, ExitCode::Usage);
    assert!(o.stderr.contains("allow-list"), "{}", o.stderr);
    let o = fetch(&policy, &store, &sha, "ftp://localhost/a.tar");
    assert_eq!(o.code, ExitCode::Usage);
}

#[test]
fn plain_http_is_accepted_only_to_loopback_and_only_when_the_policy_allows_it() {
    let body = archive();
    let b = body.clone();
    let port = serve(None, Arc::new(move |_: &str| Reply::Body(b.clone())));
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let url = format!("http://127.0.0.1:{port}/a.tar");
    let strict = policy(
        dir.path(),
        4,
        "        allow-host \"127.0.0.1\" reason=\"the test server\"\n        allow-loopback #true",
    );
    let o = fetch(&strict, &store, &sha, &url);
    assert_eq!(o.code, ExitCode::Usage, "{}", o.stderr);
    assert!(o.stderr.contains("plain http"), "{}", o.stderr);
    let open = policy(
        dir.path(),
        4,
        "        allow-host \"127.0.0.1\" reason=\"the test server\"\n        allow-loopback #true\n        allow-plain-http-loopback #true",
    );
    let o = fetch(&open, &store, &sha, &url);
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
}

#[test]
fn a_local_archive_is_admitted_and_a_wrong_digest_rejected_with_the_store_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), 5, "");
    let store_dir = dir.path().join("store");
    let file = dir.path().join("a.tar");
    std::fs::write(&file, archive()).unwrap();
    let sha = Digest::of_file(&file).unwrap();
    let o = fetch(&policy, &store_dir, &sha, file.to_str().unwrap());
    assert_eq!(o.code, ExitCode::Ok, "{}", o.stderr);
    let receipt = o.receipt.unwrap();
    let stored = Store::open(&store_dir).unwrap();
    assert!(
        stored
            .listing()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("receipts/")),
        "the ok receipt is stored by digest"
    );
    let before = stored.content_listing().unwrap();
    let wrong = Digest::of_bytes(b"not it");
    let o = fetch(&policy, &store_dir, &wrong, file.to_str().unwrap());
    assert_eq!(o.code, ExitCode::Rejected);
    assert_eq!(reason(&o), "intake.hash-mismatch");
    let after = stored.listing().unwrap();
    assert_eq!(
        stored.content_listing().unwrap(),
        before,
        "a rejection leaves the store's content as it was"
    );
    let rejected = o.receipt.unwrap();
    let name = cordon::receipt::Receipt::parse(&rejected.to_string())
        .unwrap()
        .digest()
        .unwrap()
        .hex();
    assert!(
        after
            .iter()
            .any(|l| l.starts_with(&format!("receipts/{name}.json"))),
        "every verdict is stored, the rejection too: {after:?}"
    );
    assert_eq!(rejected["authority"], receipt["authority"]);
    // A malformed digest and a missing file are usage errors, before the store is touched.
    let mut stage = StageArgs::new(&policy, Some(&store_dir));
    stage.diagnostics = Diagnostics::Json;
    let args = Args {
        stage,
        sha256: "abc".into(),
        ..args(&policy, &store_dir, &sha, file.to_str().unwrap())
    };
    assert_eq!(
        run(&args, child(), &mut Vec::new(), &mut Vec::new()),
        ExitCode::Usage
    );
    let o = fetch(&policy, &store_dir, &sha, "/nonexistent/a.tar");
    assert_eq!(o.code, ExitCode::Usage);
    // A FIFO named as the source is refused as not a file, at once: no writer is waited for.
    let fifo = dir.path().join("a.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = std::time::Instant::now();
    let o = fetch(&policy, &store_dir, &sha, fifo.to_str().unwrap());
    assert_eq!(o.code, ExitCode::Usage, "{}", o.stderr);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The confined parser child of this test process, found from outside once it has confined
/// itself (its seccomp filter on): its pid and uid.
fn parser_child() -> (u32, u32) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        for pid in cordon_testkit::children_with_arg(std::process::id(), cordon::confine::CHILD_ARG)
        {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| v.split_whitespace().next().map(str::to_owned))
            };
            if field("Seccomp:").as_deref() == Some("2") {
                return (pid, field("Uid:").unwrap().parse().unwrap());
            }
        }
        assert!(
            std::time::Instant::now() < until,
            "no confined parser child appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_archive_is_parsed_by_a_fresh_run_account_and_a_parser_killed_from_outside_is_a_no_decision()
{
    let (s, body) = https_with_archive();
    let policy = loopback_policy(&s, 6, "");
    let store_dir = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let url = format!("https://localhost:{}/slow", s.port);
    let (first, last) = cordon_testkit::account_range("fetch", 6);
    let fetching = std::thread::spawn({
        let (policy, store_dir, url) = (policy.clone(), store_dir.clone(), url.clone());
        move || fetch(&policy, &store_dir, &sha, &url)
    });
    let (pid, uid) = parser_child();
    assert!(
        (first..=last).contains(&uid),
        "uid {uid} is not the run account's"
    );
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let account = passwd
        .lines()
        .find(|l| l.split(':').nth(2) == Some(&uid.to_string()))
        .unwrap_or_else(|| panic!("uid {uid} has no account"));
    assert!(account.starts_with("cordon-"), "{account}");
    assert!(account.ends_with(":/usr/sbin/nologin"), "{account}");
    // Killed by someone other than cordon: not the candidate's doing.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let o = fetching.join().unwrap();
    assert_eq!(o.code, ExitCode::NoDecision, "{}", o.stderr);
    let message = o.receipt.unwrap()["reasons"][0]["message"].to_string();
    assert!(message.contains("killed from outside"), "{message}");
    // The account and the run directory are gone, the store holds no content.
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(
        !passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some(&uid.to_string())),
        "the run account outlived its lease"
    );
    let run = s.dir.path().join("run");
    assert_eq!(std::fs::read_dir(&run).unwrap().count(), 0);
    let fresh = tempfile::tempdir().unwrap();
    assert_eq!(
        Store::open(&store_dir).unwrap().content_listing().unwrap(),
        Store::open(&fresh.path().join("store"))
            .unwrap()
            .content_listing()
            .unwrap(),
        "a no-decision leaves the store's content as a fresh store's"
    );
}

/// SIGINT while the parser child waits on a slow transfer: the child is stopped, the transfer
/// abandoned without waiting out its deadline, the lease released (no account, no run
/// directory, no record), and the receipt is a stored no-decision naming the signal.
/// A transfer stopped by its consumer (it decided) while a resolver child waits on a silent
/// nameserver kills that child at once, instead of leaving it to its wait (5 s of the 10 s
/// deadline here), and no hop follows.
#[test]
fn stopping_a_transfer_kills_its_resolver_child() {
    let (s, _) = https_with_archive();
    let policy_path = loopback_policy(
        &s,
        4,
        &format!("        allow-host \"{NAMED_HOST}\" reason=\"the named test server\""),
    );
    let policy =
        cordon_policy_lang::parse("p.kdl", &std::fs::read_to_string(&policy_path).unwrap())
            .unwrap();
    nameserver("127.0.53.4", Arc::new(std::sync::Mutex::new(Dns::Silent)));
    let (hosts, resolv_conf) = (s.dir.path().join("hosts"), s.dir.path().join("resolv.conf"));
    std::fs::write(&hosts, "").unwrap();
    std::fs::write(&resolv_conf, "nameserver 127.0.53.4\n").unwrap();
    let rules = cordon_fetch::transport::Rules {
        allow_hosts: vec![NAMED_HOST.to_owned()],
        max_redirects: 2,
        deadline: Duration::from_secs(10),
        tls13_only: false,
        trust_anchor: None,
        allow_loopback: true,
        allow_plain_http_loopback: false,
        max_bytes: 1 << 20,
        names: cordon_fetch::resolve::Names { hosts, resolv_conf },
    };
    let store = Store::open(&s.dir.path().join("store")).unwrap();
    let took = cordon_stage::parser::under_setup(
        &policy,
        lease_args(&policy_path).setup(&policy),
        &store,
        &Digest::of_bytes(b"authority"),
        "transfer",
        child(),
        Duration::from_secs(20),
        |launch| {
            let url = format!("https://{NAMED_HOST}:{}/a.tar", s.port);
            let mut t = cordon_fetch::transport::open(&url, &rules).unwrap();
            t.begin(launch).unwrap();
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while cordon_testkit::children_with_arg(
                std::process::id(),
                cordon_fetch::resolve::RESOLVE_CHILD,
            )
            .is_empty()
            {
                assert!(
                    std::time::Instant::now() < until,
                    "no resolver child appeared"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let stopped = std::time::Instant::now();
            t.stopper().unwrap().stop();
            t.end();
            assert!(t.take_failure().is_none());
            stopped.elapsed()
        },
    )
    .unwrap();
    assert!(took < Duration::from_millis(1000), "the stop took {took:?}");
    cordon_testkit::assert_no_accounts("fetch", 4);
    drop(s.pki);
}

#[test]
fn a_signal_mid_transfer_stops_the_parser_and_releases_its_lease() {
    let (s, body) = https_with_archive();
    let policy = loopback_policy(&s, 7, "");
    let store_dir = s.dir.path().join("store");
    let sha = Digest::of_bytes(&body);
    let url = format!("https://localhost:{}/slow", s.port);
    let started = std::time::Instant::now();
    let fetching = std::thread::spawn({
        let (policy, store_dir) = (policy.clone(), store_dir.clone());
        move || fetch(&policy, &store_dir, &sha, &url)
    });
    let _ = parser_child();
    nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGINT).unwrap();
    let o = fetching.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the fetch ended before the transfer's 3 s deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(o.code, ExitCode::NoDecision, "{}", o.stderr);
    assert!(o.stderr.contains("SIGINT received"), "{}", o.stderr);
    let receipt = o.receipt.unwrap();
    assert_eq!(receipt["outcome"], "no-decision");
    assert_eq!(
        receipt["reasons"][0]["code"], "receipt.interrupted",
        "{receipt}"
    );
    let stored = std::fs::read_dir(store_dir.join("receipts"))
        .unwrap()
        .count();
    assert_eq!(stored, 2, "the receipt and its signature are stored");
    // No account, run directory or lease record is left.
    cordon_testkit::assert_no_accounts("fetch", 7);
    assert_eq!(
        std::fs::read_dir(s.dir.path().join("run")).unwrap().count(),
        0
    );
    assert!(cordon_testkit::lease_records(&store_dir).is_empty());
}
