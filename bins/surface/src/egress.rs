//! Egress by allow-list (`network "egress"`), without a tun device: the sandbox keeps its own
//! network namespace with nothing but loopback, and every connection out goes through a proxy
//! that cordon-surface runs on the host for the run's duration.
//!
//! Two halves:
//! - the **proxy** ([`Proxy`]), threads of the supervising cordon-surface listening on a Unix
//!   socket in the run directory (0700, outside the workspace and never bound into the
//!   sandbox). It speaks HTTP `CONNECT` only, admits only the policy's names (exact, or
//!   `*.suffix` for names below it) and ports, refuses address literals, resolves names itself
//!   and refuses private, loopback, link-local and other special addresses unless the policy
//!   names their range, and records every request (name, port, verdict, address, bytes);
//! - the **forwarder** ([`forwarder_requested`]), this binary started with [`FORWARD_ARG`]
//!   after the container is created and before it starts: it joins the container's user and
//!   network namespaces (the service user owns both), listens on the sandbox's loopback at
//!   [`EGRESS_PORT`] and carries each connection, byte for byte, to the proxy's socket. It
//!   lives outside the container's pid namespace (the sandbox cannot signal it) and exits when
//!   its supervisor's pipe closes.
//!
//! Nothing is decided by the forwarder or inside the sandbox: a process that ignores
//! `HTTPS_PROXY` reaches only the forwarder, which reaches only the proxy.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cordon::inputs::{EGRESS_RECORDED, EgressConnection};
use cordon_policy_lang::{Egress, domain_ok};
pub use cordon_stage::surface::EGRESS_PORT;

/// The argument that makes cordon-surface a run's forwarder: `FORWARD_ARG PID SOCKET`.
pub const FORWARD_ARG: &str = "--cordon-egress-forward";
/// The proxy's socket in a run directory.
pub const SOCKET: &str = "egress.sock";
/// The most connections served at once; more are refused.
const CONCURRENT: usize = 64;
/// The most bytes of a request head.
const HEAD_MAX: usize = 8 * 1024;
/// How long a client has to send its request head, and a far end to accept.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// What the proxy keeps of the run's requests.
#[derive(Debug, Default)]
struct Log {
    connections: Vec<EgressConnection>,
    unrecorded: u64,
    /// Each recorded tunnel's byte counters (out, in), counted as the bytes cross: what a
    /// tunnel still open when the run ends carried is recorded too.
    counters: Vec<(usize, Arc<Counters>)>,
}

/// Bytes out (sandbox → far end) and in, as they cross.
#[derive(Debug, Default)]
struct Counters {
    out: AtomicU64,
    inn: AtomicU64,
}

impl Log {
    /// Record a request; its index, when it is recorded.
    fn push(&mut self, c: EgressConnection) -> Option<usize> {
        if self.connections.len() < EGRESS_RECORDED {
            self.connections.push(c);
            Some(self.connections.len() - 1)
        } else {
            self.unrecorded += 1;
            None
        }
    }
}

/// A running proxy.
#[derive(Debug)]
pub struct Proxy {
    socket: PathBuf,
    log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    accept: Option<JoinHandle<()>>,
}

fn lock(log: &Mutex<Log>) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Proxy {
    /// Listen at `socket` (which must not exist) for `policy`'s run.
    ///
    /// # Errors
    /// The socket cannot be bound.
    pub fn start(socket: &Path, policy: &Egress) -> io::Result<Self> {
        let listener = UnixListener::bind(socket)?;
        let log = Arc::new(Mutex::new(Log::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let accept = {
            let (log, stop, active, policy) =
                (log.clone(), stop.clone(), active.clone(), policy.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    if active.fetch_add(1, Ordering::SeqCst) >= CONCURRENT {
                        active.fetch_sub(1, Ordering::SeqCst);
                        let _ = (&client).write_all(b"HTTP/1.1 503 Too Many Connections\r\n\r\n");
                        continue;
                    }
                    let (log, active, policy) = (log.clone(), active.clone(), policy.clone());
                    std::thread::spawn(move || {
                        serve(client, &policy, &log);
                        active.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            })
        };
        Ok(Self {
            socket: socket.to_path_buf(),
            log,
            stop,
            active,
            accept: Some(accept),
        })
    }

    /// Stop accepting, give open tunnels `grace` to end (the forwarder is gone by now, so
    /// each sees its end), and return what was recorded and how many went unrecorded.
    #[must_use]
    pub fn finish(mut self, grace: Duration) -> (Vec<EgressConnection>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the stop.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let until = Instant::now() + grace;
        while self.active.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut log = lock(&self.log);
        let counters = std::mem::take(&mut log.counters);
        for (i, c) in counters {
            if let Some(conn) = log.connections.get_mut(i) {
                conn.bytes_out = c.out.load(Ordering::SeqCst);
                conn.bytes_in = c.inn.load(Ordering::SeqCst);
            }
        }
        (std::mem::take(&mut log.connections), log.unrecorded)
    }
}

/// Whether `ip` is an address no name should send the proxy to unless the policy says so:
/// private, loopback, link-local, shared, unspecified, broadcast, multicast, documentation,
/// benchmarking, reserved, or an IPv4 address mapped or translated into IPv6.
#[must_use]
pub fn special(ip: IpAddr) -> bool {
    const V4: [&str; 14] = [
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    ];
    const V6: [&str; 13] = [
        "::/96",
        "::1/128",
        "::ffff:0:0/96",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "2002::/16",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    ];
    V4.iter()
        .chain(V6.iter())
        .filter_map(|n| n.parse::<ipnet::IpNet>().ok())
        .any(|n| n.contains(&ip))
}

/// Whether `name` (lower case) is one the policy admits.
fn admitted(policy: &Egress, name: &str) -> bool {
    policy.domain.iter().any(|d| match d.strip_prefix("*.") {
        Some(suffix) => name
            .strip_suffix(suffix)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => d == name,
    })
}

/// Where `host:port` may be reached under `policy`, or why not. `resolve` is the host's
/// resolver (a parameter, so the rules are tested without DNS).
///
/// # Errors
/// The refusal, as the receipt records it.
pub fn decide(
    policy: &Egress,
    host: &str,
    port: u16,
    resolve: &dyn Fn(&str, u16) -> io::Result<Vec<SocketAddr>>,
) -> Result<SocketAddr, String> {
    if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
        return Err("an address literal: only names are allowed".into());
    }
    let name = host.to_ascii_lowercase();
    if !domain_ok(&name) || name.starts_with("*.") {
        return Err("not a domain name".into());
    }
    if !admitted(policy, &name) {
        return Err("not an allowed domain".into());
    }
    if !policy.port.contains(&port) {
        return Err(format!("port {port} is not allowed"));
    }
    let addrs = resolve(&name, port).map_err(|e| format!("does not resolve: {e}"))?;
    let allowed: Vec<ipnet::IpNet> = policy
        .allow_address
        .keys()
        .filter_map(|n| n.parse().ok())
        .collect();
    addrs
        .into_iter()
        .find(|a| !special(a.ip()) || allowed.iter().any(|n| n.contains(&a.ip())))
        .ok_or_else(|| {
            "resolves only to private, loopback, link-local or reserved addresses the policy does not name".into()
        })
}

fn resolve(name: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    // Fully qualified: the resolver's search list never makes `pypi.org` another name. The one
    // single-label name allowed, `localhost`, is the hosts file's.
    let name = if name.contains('.') {
        format!("{name}.")
    } else {
        name.to_owned()
    };
    Ok((name, port).to_socket_addrs()?.collect())
}

/// A request's target as the receipt shows it: printable, at most 255 bytes.
fn shown(target: &str) -> String {
    let p = cordon_canon::text::printable(target);
    p.chars().take(255).collect()
}

/// Serve one client: read its `CONNECT`, decide, record, tunnel.
fn serve(client: UnixStream, policy: &Egress, log: &Mutex<Log>) {
    let _ = client.set_read_timeout(Some(HANDSHAKE));
    let refuse = |client: &UnixStream, status: &str| {
        let _ = (&*client).write_all(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes());
    };
    let Ok((target, rest)) = read_head(&client) else {
        refuse(&client, "400 Bad Request");
        return;
    };
    let Some((host, port)) = target
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
    else {
        lock(log).push(refused(&target, 0, "not a CONNECT to host:port"));
        refuse(&client, "400 Bad Request");
        return;
    };
    let at = match decide(policy, &host, port, &resolve) {
        Ok(at) => at,
        Err(why) => {
            lock(log).push(refused(&host, port, &why));
            refuse(&client, "403 Forbidden");
            return;
        }
    };
    let remote = match TcpStream::connect_timeout(&at, HANDSHAKE) {
        Ok(r) => r,
        Err(e) => {
            lock(log).push(refused(
                &host,
                port,
                &format!("cannot connect to {at}: {e}"),
            ));
            refuse(&client, "502 Bad Gateway");
            return;
        }
    };
    let index = lock(log).push(EgressConnection {
        domain: host,
        port,
        verdict: "allowed".into(),
        address: Some(at.to_string()),
        bytes_out: 0,
        bytes_in: 0,
    });
    let _ = client.set_read_timeout(None);
    if (&client)
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let counters = Arc::new(Counters::default());
    if let Some(i) = index {
        lock(log).counters.push((i, counters.clone()));
    }
    tunnel(client, remote, &rest, &counters);
}

fn refused(target: &str, port: u16, why: &str) -> EgressConnection {
    EgressConnection {
        domain: shown(target),
        port,
        verdict: format!("refused: {why}"),
        address: None,
        bytes_out: 0,
        bytes_in: 0,
    }
}

/// The `CONNECT` target of a request head, and any bytes the client sent after the head.
fn read_head(mut client: &UnixStream) -> Result<(String, Vec<u8>), ()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = client.read(&mut chunk).map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                if req.method != Some("CONNECT") {
                    return Err(());
                }
                let target = req.path.ok_or(())?.to_owned();
                return Ok((target, buf[len..].to_vec()));
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_MAX => {}
            _ => return Err(()),
        }
    }
}

/// Copy both ways until either side ends; the bytes each way.
fn tunnel(client: UnixStream, remote: TcpStream, early: &[u8], n: &Arc<Counters>) {
    let (Ok(mut client_r), Ok(mut remote_w)) = (client.try_clone(), remote.try_clone()) else {
        return;
    };
    let early = early.to_vec();
    let up_n = n.clone();
    let up = std::thread::spawn(move || {
        if remote_w.write_all(&early).is_ok() {
            up_n.out.fetch_add(early.len() as u64, Ordering::SeqCst);
            copy_counted(&mut client_r, &mut remote_w, &up_n.out);
        }
        let _ = remote_w.shutdown(std::net::Shutdown::Write);
    });
    let (mut remote_r, mut client_w) = (remote, client);
    copy_counted(&mut remote_r, &mut client_w, &n.inn);
    let _ = client_w.shutdown(std::net::Shutdown::Both);
    let _ = remote_r.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}

/// Copy `r` to `w` until either ends, adding each chunk to `n` once it is written.
fn copy_counted(r: &mut impl Read, w: &mut impl Write, n: &AtomicU64) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(k) => {
                if w.write_all(&buf[..k]).is_err() {
                    return;
                }
                n.fetch_add(k as u64, Ordering::SeqCst);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// When this process was started as a forwarder ([`FORWARD_ARG`] first): be one, and return
/// its exit status. Called first thing in `main`, while the process is single-threaded (a
/// multi-threaded process cannot join a user namespace).
#[must_use]
pub fn forwarder_requested() -> Option<u8> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_none_or(|a| a != FORWARD_ARG) {
        return None;
    }
    match (args.get(1).and_then(|p| p.parse::<u32>().ok()), args.get(2)) {
        (Some(pid), Some(socket)) => match forward(pid, Path::new(socket)) {
            Ok(()) => Some(0),
            Err(e) => {
                eprintln!("cordon egress forwarder: {e}");
                Some(1)
            }
        },
        _ => {
            eprintln!("cordon egress forwarder: usage: {FORWARD_ARG} PID SOCKET");
            Some(2)
        }
    }
}

/// The forwarder: join `pid`'s user and network namespaces, listen on their loopback, say
/// `ready`, carry each connection to `socket` until stdin ends.
fn forward(pid: u32, socket: &Path) -> Result<(), String> {
    use nix::sched::{CloneFlags, setns};
    let open = |ns: &str| {
        std::fs::File::open(format!("/proc/{pid}/ns/{ns}"))
            .map_err(|e| format!("cannot open the {ns} namespace of {pid}: {e}"))
    };
    // Both opened first: once in the user namespace, the host's /proc view is the same but
    // the order keeps the two the same container's.
    let (user, net) = (open("user")?, open("net")?);
    setns(&user, CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("cannot join its user namespace: {e}"))?;
    setns(&net, CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("cannot join its network namespace: {e}"))?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", EGRESS_PORT))
        .map_err(|e| format!("cannot listen on its loopback: {e}"))?;
    println!("ready");
    io::stdout().flush().map_err(|e| e.to_string())?;
    // The supervisor's end: its pipe closes when it exits, however it exits.
    std::thread::spawn(|| {
        let _ = io::copy(&mut io::stdin(), &mut io::sink());
        std::process::exit(0);
    });
    for inside in listener.incoming() {
        let Ok(inside) = inside else { continue };
        let socket = socket.to_path_buf();
        std::thread::spawn(move || {
            if let Ok(proxy) = UnixStream::connect(&socket) {
                carry(inside, proxy);
            }
        });
    }
    Ok(())
}

/// Byte-for-byte both ways between the sandbox's connection and the proxy.
fn carry(inside: std::net::TcpStream, proxy: UnixStream) {
    let (Ok(mut inside_r), Ok(mut proxy_w)) = (inside.try_clone(), proxy.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut inside_r, &mut proxy_w);
        let _ = proxy_w.shutdown(std::net::Shutdown::Write);
    });
    let (mut proxy_r, mut inside_w) = (proxy, inside);
    let _ = io::copy(&mut proxy_r, &mut inside_w);
    let _ = inside_w.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Egress {
        Egress {
            domain: ["pypi.org", "*.pythonhosted.org", "localhost"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            port: [443].into_iter().collect(),
            allow_address: [(
                "127.0.0.0/8".to_owned(),
                cordon_policy_lang::Reasoned {
                    reason: "test".into(),
                },
            )]
            .into_iter()
            .collect(),
        }
    }

    fn to(addrs: &'static [&'static str]) -> impl Fn(&str, u16) -> io::Result<Vec<SocketAddr>> {
        move |_, port| {
            Ok(addrs
                .iter()
                .map(|a| SocketAddr::new(a.parse().unwrap(), port))
                .collect())
        }
    }

    #[test]
    fn only_allowed_names_and_ports_to_public_or_named_addresses_pass() {
        let p = policy();
        let public = to(&["151.101.0.223"]);
        decide(&p, "pypi.org", 443, &public).unwrap();
        decide(&p, "PyPI.org", 443, &public).unwrap();
        decide(&p, "files.pythonhosted.org", 443, &public).unwrap();
        for (host, port, why) in [
            ("pythonhosted.org", 443, "not an allowed domain"),
            ("evilpythonhosted.org", 443, "not an allowed domain"),
            ("pypi.org.evil.example", 443, "not an allowed domain"),
            ("exfil.example", 443, "not an allowed domain"),
            ("pypi.org", 80, "port 80"),
            ("151.101.0.223", 443, "address literal"),
            ("[::1]", 443, "address literal"),
            ("0x7f000001", 443, "not a domain name"),
            ("*.pythonhosted.org", 443, "not a domain name"),
            ("pypi.org\r\nX: y", 443, "not a domain name"),
        ] {
            let e = decide(&p, host, port, &public).unwrap_err();
            assert!(e.contains(why), "{host}:{port}: {e}");
        }
        // A name that resolves into private or link-local space (DNS rebinding, metadata
        // services) is refused unless the policy names the range.
        for inner in [
            &["10.0.0.5"][..],
            &["169.254.169.254"],
            &["::ffff:10.0.0.1"],
            &["fd00::1"],
        ] {
            let addrs: &'static [&'static str] = Box::leak(Box::new(inner.to_vec()));
            let e = decide(&p, "pypi.org", 443, &to(addrs)).unwrap_err();
            assert!(e.contains("resolves only"), "{inner:?}: {e}");
        }
        assert_eq!(
            decide(&p, "localhost", 443, &to(&["::1", "127.0.0.1"])).unwrap(),
            "127.0.0.1:443".parse().unwrap()
        );
        let e = decide(&p, "pypi.org", 443, &|_, _| {
            Err(io::Error::other("NXDOMAIN"))
        });
        assert!(e.unwrap_err().contains("does not resolve"));
    }

    #[test]
    fn every_special_range_is_special_and_a_public_address_is_not() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            assert!(special(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["151.101.0.223", "2a04:4e42::223", "8.8.8.8"] {
            assert!(!special(ip.parse().unwrap()), "{ip}");
        }
    }
}
