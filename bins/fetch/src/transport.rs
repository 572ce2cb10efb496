//! Remote transport for intake: one `https://` (or, for tests, loopback `http://`) GET under the
//! policy's rules, delivered as a byte stream — with no TLS or HTTP byte ever parsed by this
//! (root) process.
//!
//! The parent's side, here: the static checks on the source (scheme, host allow-list, literal
//! addresses), then for each hop — the first request and each redirect the child reports —
//! resolving the name itself, checking every address it resolves to (public unless the
//! policy's loopback allowance is on), connecting to exactly those addresses and handing the
//! connected socket to a confined transfer child of the run account ([`crate::transfer`]) as
//! its standard input. The child speaks TLS and HTTP and writes frames; the parent counts every
//! byte against the bound, holds the one absolute deadline over every hop (it kills the child
//! at it), re-checks a redirect's target against the allow-list as plain data, and counts the
//! redirects. Proxies from the environment are never read. The archive is parsed later, by
//! another confined child ([`cordon::archive`]).
//!
//! The stream is produced on a thread of its own and handed over through a bounded channel,
//! so the deadline is enforced on the network side even while the consumer is busy.

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use cordon::confine::{FrameError, FrameReader, Launch, Supervised};
use url::Url;

use crate::transfer::{self, Allowed, DATA, END, End, REDIRECT, Request, Target};

/// Transport rules, already resolved from the policy.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Hosts a source may name.
    pub allow_hosts: Vec<String>,
    /// Redirects followed at most.
    pub max_redirects: u64,
    /// The whole transfer's budget.
    pub deadline: Duration,
    /// Whether TLS 1.2 is refused.
    pub tls13_only: bool,
    /// PEM bytes of the only trust anchors, when the policy names a file.
    pub trust_anchor: Option<Vec<u8>>,
    /// Loopback addresses may be connected to.
    pub allow_loopback: bool,
    /// Plain `http://` to a loopback address is accepted.
    pub allow_plain_http_loopback: bool,
    /// Bytes received at most.
    pub max_bytes: u64,
    /// The host's name files ([`crate::resolve`]).
    pub names: crate::resolve::Names,
}

/// Why a transfer did not deliver a stream.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TransportError {
    /// The source as given breaks the policy's transport rules (the operator's input: exit 2).
    #[error("source {url} is not allowed: {why}")]
    #[diagnostic(
        code(cordon::fetch::source_refused),
        help(
            "use https:// to a host the policy's intake.transport section allows (adding a host there is a reviewed change of authority)"
        )
    )]
    Refused {
        /// The source.
        url: String,
        /// Which rule.
        why: String,
    },
    /// The remote side broke a rule during the transfer (exit 1, reason code given).
    #[error("transfer rejected: {code}: {why}")]
    #[diagnostic(code(cordon::fetch::transfer_rejected))]
    Rejected {
        /// Stable reason code, `transport.<rule>`.
        code: &'static str,
        /// What happened.
        why: String,
    },
    /// The transfer could not be completed (network, TLS, deadline, server error): no-decision.
    #[error("transfer failed: {why}")]
    #[diagnostic(code(cordon::fetch::transfer_failed))]
    Failed {
        /// What happened.
        why: String,
    },
}

/// Whether an address is globally routable, by the IANA special-purpose registries.
#[must_use]
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                // IPv4-compatible (::/96, deprecated): an IPv4 address in another form.
                || s[..6] == [0; 6]
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                // Site-local (fec0::/10, deprecated, still routed by some networks).
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || (s[0] == 0x0064 && s[1] == 0xff9b)
                || s[0] == 0x2002
                || (s[0] == 0x2001 && s[1] == 0))
        }
    }
}

fn address_allowed(ip: IpAddr, allow_loopback: bool) -> bool {
    is_public(ip) || (allow_loopback && ip.is_loopback())
}

/// Check a hop's target against the static rules: scheme, host allow-list, literal addresses.
/// The parent runs it on the source and on every redirect the child reports, the child on the
/// redirect it is about to report.
///
/// # Errors
/// The rule it breaks.
pub fn check_target(t: &Target, allowed: &Allowed) -> Result<(), String> {
    // The allow-list first: past it, the host is one of the policy's own names.
    if !allowed
        .hosts
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&t.host))
    {
        return Err(format!(
            "host {:?} is not on the policy's allow-list",
            t.host
        ));
    }
    let literal = t.host.parse::<IpAddr>().ok();
    if !t.https {
        if !(allowed.plain_http_loopback && allowed.loopback) {
            return Err("plain http is not allowed by the policy: use https://".into());
        }
        if !literal.is_some_and(|ip| ip.is_loopback()) {
            return Err("plain http is accepted only to a literal loopback address".into());
        }
    }
    if let Some(ip) = literal.filter(|ip| !address_allowed(*ip, allowed.loopback)) {
        return Err(format!("address {ip} is not public"));
    }
    Ok(())
}

impl Rules {
    /// What a hop may go to.
    #[must_use]
    pub fn allowed(&self) -> Allowed {
        Allowed {
            hosts: self.allow_hosts.clone(),
            loopback: self.allow_loopback,
            plain_http_loopback: self.allow_plain_http_loopback,
        }
    }
}

/// The hop under way: its child's killer, or `stopped` once the consumer has ended the
/// transfer (no further hop starts).
#[derive(Default)]
struct Hop {
    stopped: bool,
    child: Option<cordon::host::Killer>,
}

type Current = std::sync::Arc<std::sync::Mutex<Hop>>;

/// A chunk of the body, or the end, or why it stopped.
type Chunk = Result<Vec<u8>, TransportError>;

/// A remote source: checked, then started under a lease ([`Transfer::begin`]), then read.
pub struct Transfer {
    first: Target,
    rules: Rules,
    running: Option<Running>,
    /// The failure that ended the stream, kept for the caller to classify.
    failure: Option<TransportError>,
}

struct Running {
    /// The thread that runs the hops (and reaps their children).
    hops: std::thread::JoinHandle<()>,
    /// The hop under way, for [`Transfer::end`].
    hop: Current,
    rx: Receiver<Chunk>,
    current: Vec<u8>,
    offset: usize,
    done: bool,
    /// A signal to this process ends a read that waits on the network, instead of letting it
    /// wait out the transfer's deadline.
    _stop: cordon::interrupt::Registered,
}

impl Transfer {
    /// The transport failure that ended the stream, if one did.
    pub fn take_failure(&mut self) -> Option<TransportError> {
        self.failure.take()
    }

    /// Start the transfer: its hops run on a thread of their own, each in a transfer child
    /// `launch` names (its kind and request are set here, its budget is what is left of the
    /// transfer's deadline).
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn begin(&mut self, launch: &Launch) -> Result<(), TransportError> {
        let (tx, rx) = sync_channel::<Chunk>(16);
        let stop = tx.clone();
        let stop = cordon::interrupt::on_signal(move || {
            // A full channel means the reader is not waiting: it reads on, and its writes to
            // the stopped parser child fail. The transfer child stops with this process.
            let _ = stop.try_send(Err(TransportError::Failed {
                why: "a signal stopped the transfer".into(),
            }));
        });
        let (first, rules, launch) = (self.first.clone(), self.rules.clone(), launch.clone());
        let deadline = Instant::now() + rules.deadline;
        let current = Current::default();
        let theirs = current.clone();
        let hops = std::thread::Builder::new()
            .name("cordon-fetch-transfer".into())
            .spawn(move || {
                let end = hops(first, &rules, &launch, deadline, &tx, &theirs);
                // A consumer that stopped listening has already decided.
                let _ = tx.send(end.map(|()| Vec::new()));
            })
            .map_err(|e| TransportError::Failed {
                why: format!("cannot start the transfer thread: {e}"),
            })?;
        self.running = Some(Running {
            hops,
            hop: current,
            rx,
            current: Vec::new(),
            offset: 0,
            done: false,
            _stop: stop,
        });
        Ok(())
    }
}

/// Ends a transfer from another thread ([`Transfer::stopper`]).
#[derive(Clone)]
pub struct Stopper(Current);

impl Stopper {
    /// End the transfer: no further hop starts and the child under way is killed; the reader
    /// then sees the end of the stream, never a failure (the consumer has decided already).
    pub fn stop(&self) {
        let mut hop = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hop.stopped = true;
        if let Some(child) = hop.child.take() {
            let _ = child.kill();
        }
    }
}

impl Transfer {
    /// What ends this transfer from another thread (a reader blocked on it is released), once
    /// it is begun.
    #[must_use]
    pub fn stopper(&self) -> Option<Stopper> {
        self.running.as_ref().map(|r| Stopper(r.hop.clone()))
    }

    /// Stop listening and wait for the hops to end: a child still sending is killed and reaped
    /// before this returns, so none outlives the lease whose account it runs as. What ended
    /// the stream, if anything did, stays for [`Transfer::take_failure`].
    pub fn end(&mut self) {
        if let Some(r) = self.running.take() {
            // A closed channel fails the thread's next send; a child waiting on a slow server
            // is killed now rather than at the deadline; no further hop starts.
            drop(r.rx);
            Stopper(r.hop).stop();
            let _ = r.hops.join();
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        self.end();
    }
}

impl Read for Transfer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(r) = self.running.as_mut() else {
            return Err(io::Error::other("the transfer was not begun"));
        };
        while r.offset == r.current.len() {
            if r.done {
                return Ok(0);
            }
            let failure = match r.rx.recv() {
                Ok(Ok(chunk)) if chunk.is_empty() => {
                    r.done = true;
                    continue;
                }
                Ok(Ok(chunk)) => {
                    r.current = chunk;
                    r.offset = 0;
                    continue;
                }
                Ok(Err(e)) => e,
                Err(_) => TransportError::Failed {
                    why: "the transfer thread ended without finishing".into(),
                },
            };
            r.done = true;
            let msg = failure.to_string();
            self.failure = Some(failure);
            return Err(io::Error::other(msg));
        }
        let n = buf.len().min(r.current.len() - r.offset);
        buf[..n].copy_from_slice(&r.current[r.offset..r.offset + n]);
        r.offset += n;
        Ok(n)
    }
}

/// Check a source before anything is connected: the URL (the operator's input) and the
/// static rules, and the policy's trust anchor.
///
/// # Errors
/// [`TransportError::Refused`] when the URL breaks a static rule; [`TransportError::Failed`]
/// when the trust anchor holds no certificate.
pub fn open(source: &str, rules: &Rules) -> Result<Transfer, TransportError> {
    let refused = |why: String| TransportError::Refused {
        url: source.to_owned(),
        why,
    };
    let url = Url::parse(source).map_err(|e| refused(e.to_string()))?;
    let first = transfer::target_of(&url).map_err(refused)?;
    check_target(&first, &rules.allowed()).map_err(refused)?;
    // The policy's own file, read by the operator's authority: checked here, so a broken
    // anchor is the operator's error before anything is connected.
    transfer::tls_config(rules.tls13_only, rules.trust_anchor.as_deref())
        .map_err(|why| TransportError::Failed { why })?;
    // The anchors travel on the child's command line, whose one argument the kernel bounds.
    if let Some(pem) = rules
        .trust_anchor
        .as_ref()
        .filter(|p| p.len() > MAX_ANCHOR_BYTES)
    {
        return Err(refused(format!(
            "the policy's trust anchor file is {} bytes, over the {MAX_ANCHOR_BYTES} a transfer \
             child takes: name only the certificate authorities the allowed hosts use",
            pem.len()
        )));
    }
    Ok(Transfer {
        first,
        rules: rules.clone(),
        running: None,
        failure: None,
    })
}

/// The trust anchors a transfer child takes, bytes of PEM: its request is one argument on its
/// command line (the kernel's bound on one is 128 KiB).
const MAX_ANCHOR_BYTES: usize = 96 << 10;

/// The largest data frame a transfer child writes.
const FRAME_MAX: u32 = 1 << 20;

/// Every hop of a transfer, until the body ends or a rule or the deadline stops it.
fn hops(
    first: Target,
    rules: &Rules,
    launch: &Launch,
    deadline: Instant,
    tx: &SyncSender<Chunk>,
    current: &Current,
) -> Result<(), TransportError> {
    let mut target = first;
    let mut redirects = 0u64;
    let mut received = 0u64;
    loop {
        match hop(&target, rules, launch, deadline, tx, current, &mut received)? {
            None => return Ok(()),
            Some(next) => {
                redirects += 1;
                if redirects > rules.max_redirects {
                    return Err(TransportError::Rejected {
                        code: "transport.too-many-redirects",
                        why: format!("more than {} redirects", rules.max_redirects),
                    });
                }
                check_target(&next, &rules.allowed()).map_err(|why| TransportError::Rejected {
                    code: "transport.redirect",
                    why: format!(
                        "redirect to {}: {why}",
                        cordon::text::printable(&next.url()).into_owned()
                    ),
                })?;
                target = next;
            }
        }
    }
}

fn past_deadline(rules: &Rules) -> TransportError {
    TransportError::Failed {
        why: format!("the transfer deadline of {:?} passed", rules.deadline),
    }
}

/// Resolve `target`'s host (ours, so a second lookup cannot rebind; no DNS answer parsed
/// here: [`crate::resolve`]), check every address, and connect to one of exactly those before
/// `deadline`.
fn connect(
    target: &Target,
    rules: &Rules,
    launch: &Launch,
    deadline: Instant,
    current: &Current,
) -> Result<TcpStream, TransportError> {
    let failed = |why: String| TransportError::Failed { why };
    // A resolver child under way is the hop's child: stopping the transfer kills it.
    let watch = |killer: Option<cordon::host::Killer>| {
        let mut now = current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        now.child = killer;
        !now.stopped
    };
    let addrs: Vec<SocketAddr> =
        crate::resolve::resolve(&target.host, &rules.names, launch, deadline, &watch)
            .map_err(failed)?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, target.port))
            .collect();
    if addrs.is_empty() {
        return Err(failed(format!("{:?} resolves to no address", target.host)));
    }
    if let Some(bad) = addrs
        .iter()
        .find(|a| !address_allowed(a.ip(), rules.allow_loopback))
    {
        return Err(TransportError::Rejected {
            code: "transport.non-public-address",
            why: format!("the source resolves to the non-public address {}", bad.ip()),
        });
    }
    let mut last = None;
    for addr in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(past_deadline(rules));
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    Err(failed(format!(
        "cannot connect to {:?}: {}",
        target.host,
        last.unwrap_or_default()
    )))
}

/// One hop: connect, hand the socket to a transfer child, relay its body (counting every
/// byte against the bound). The redirect it reports, or `None` when the body ended.
fn hop(
    target: &Target,
    rules: &Rules,
    launch: &Launch,
    deadline: Instant,
    tx: &SyncSender<Chunk>,
    current: &Current,
    received: &mut u64,
) -> Result<Option<Target>, TransportError> {
    let failed = |why: String| TransportError::Failed { why };
    // A consumer that has decided starts no further hop (a resolution or a connection can
    // take until the deadline).
    if current
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .stopped
    {
        return Ok(None);
    }
    let socket = match connect(target, rules, launch, deadline, current) {
        Ok(s) => s,
        // The consumer decided while the host was being resolved: nobody is listening.
        Err(_)
            if current
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .stopped =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // The child waits on it with its event loop: non-blocking, as the descriptor it is given.
    socket
        .set_nonblocking(true)
        .map_err(|e| failed(format!("cannot prepare the connection: {e}")))?;
    let request = Request {
        target: target.clone(),
        tls13_only: rules.tls13_only,
        trust_anchor: rules
            .trust_anchor
            .as_ref()
            .map(|pem| String::from_utf8_lossy(pem).into_owned()),
        allowed: rules.allowed(),
        max_bytes: rules.max_bytes.saturating_sub(*received),
    };
    let mut hop = launch.clone();
    hop.spec.kind = transfer::TRANSFER_CHILD.to_owned();
    hop.spec.argument =
        Some(serde_json::to_string(&request).map_err(|e| failed(format!("the request: {e}")))?);
    hop.budget = deadline.saturating_duration_since(Instant::now());
    let (child, stdout) = {
        let mut now = current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.stopped {
            return Ok(None);
        }
        let (child, stdout) = Supervised::start_on(&hop, socket.into())
            .map_err(|e| failed(format!("cannot start the transfer child: {e}")))?;
        now.child = Some(child.killer());
        (child, stdout)
    };
    // The payload is counted exactly below; the stream's bound leaves room for a header per
    // byte of it (no data frame is empty) and the last words.
    let mut frames = FrameReader::new(
        stdout,
        FRAME_MAX,
        rules.max_bytes.saturating_mul(6).saturating_add(1 << 20),
    );
    match cordon::confine::confirmed(&mut frames) {
        Ok(true) => {}
        Ok(false) => return Err(failed(child.unconfined())),
        Err(e) => return Err(failed(format!("{e}; {}", child.unconfined()))),
    }
    // What the child said, or why the parent stopped listening to it.
    let said: Result<Said, TransportError> = loop {
        match frames.frame() {
            // An empty chunk would read as the end of the stream.
            Ok(Some((DATA, bytes))) if bytes.is_empty() => {
                break Err(broke("an empty data frame"));
            }
            Ok(Some((DATA, bytes))) => {
                *received += bytes.len() as u64;
                if *received > rules.max_bytes {
                    break Err(TransportError::Rejected {
                        code: "transport.too-big",
                        why: format!("the body exceeds {} bytes", rules.max_bytes),
                    });
                }
                // The bounded channel is the backpressure; a closed one means the consumer
                // has decided already.
                if tx.send(Ok(bytes)).is_err() {
                    break Ok(Said::Abandoned);
                }
            }
            Ok(Some((REDIRECT, json))) => {
                break serde_json::from_slice::<Target>(&json)
                    .map(Said::Redirect)
                    .map_err(|e| broke(&format!("a malformed redirect frame: {e}")));
            }
            Ok(Some((END, json))) => {
                break serde_json::from_slice::<End>(&json)
                    .map(Said::End)
                    .map_err(|e| broke(&format!("a malformed end frame: {e}")));
            }
            Ok(Some((tag, _))) => break Err(broke(&format!("an unknown frame tag {tag}"))),
            Ok(None) | Err(FrameError::Truncated) => break Ok(Said::Nothing),
            Err(FrameError::Broken(why)) => break Err(broke(&why)),
            Err(FrameError::Pipe(e)) => break Err(failed(format!("the child's output: {e}"))),
        }
    };
    drop(frames);
    // Output the parent refused, or no longer needs, ends the child; after its last word or
    // its silence it is waited for (within the deadline), so how it ended is evidence.
    let kill = matches!(said, Err(_) | Ok(Said::Abandoned));
    let finished = child
        .finish(kill, true)
        .map_err(|e| failed(format!("cannot wait for the transfer child: {e}")))?;
    let stopped = {
        let mut now = current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        now.child = None;
        now.stopped
    };
    // The consumer ended the transfer: whatever the child's end, nobody is listening.
    if stopped {
        return Ok(None);
    }
    if finished.deadline_kill {
        return Err(past_deadline(rules));
    }
    // How it ended decides over what it said when it did not end cleanly.
    match finished.ended() {
        Some(cordon::confine::Ended::Broke(why)) => return Err(broke(&finished.with_tail(&why))),
        Some(cordon::confine::Ended::Infrastructure(why)) => {
            return Err(failed(finished.with_tail(&why)));
        }
        Some(cordon::confine::Ended::Done | cordon::confine::Ended::Rejected) | None => {}
    }
    match said? {
        Said::Redirect(next) => Ok(Some(next)),
        Said::End(End::Done) | Said::Abandoned => Ok(None),
        Said::End(End::Rejected { code, why }) => Err(TransportError::Rejected {
            code: transfer::rejection_code(&code)
                .ok_or_else(|| broke("an unknown rejection code"))?,
            why: cordon::text::printable(&why).into_owned(),
        }),
        Said::End(End::Failed { why }) => Err(failed(cordon::text::printable(&why).into_owned())),
        Said::Nothing => Err(broke("the transfer child ended without a word")),
    }
}

/// What a transfer child said last.
enum Said {
    /// A checked redirect.
    Redirect(Target),
    /// Its end.
    End(End),
    /// Nothing more: the consumer stopped reading first.
    Abandoned,
    /// Nothing at all.
    Nothing,
}

/// The remote's bytes broke the child (a crash, a limit, broken framing): the candidate's.
fn broke(why: &str) -> TransportError {
    TransportError::Rejected {
        code: "transport.child",
        why: format!(
            "the transfer child broke on the remote's bytes: {}",
            cordon::text::printable(why)
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;
    use std::sync::Arc;

    use cordon::confine::{CONFINED, write_frame};
    use cordon::host::fake::{Call, End as Ends, Fake, Script};

    use super::*;

    fn frames(list: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (tag, payload) in list {
            write_frame(&mut out, *tag, payload).unwrap();
        }
        out
    }

    fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }

    /// A server that accepts and holds connections (the fake child speaks for it), and the
    /// rules that let plain http reach it.
    fn listening() -> (Rules, String) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                held.push(conn);
            }
        });
        let rules = Rules {
            allow_hosts: vec!["127.0.0.1".into()],
            max_redirects: 2,
            deadline: Duration::from_secs(30),
            tls13_only: false,
            trust_anchor: None,
            allow_loopback: true,
            allow_plain_http_loopback: true,
            max_bytes: 8,
            names: crate::resolve::Names::default(),
        };
        (rules, format!("http://127.0.0.1:{port}/a.tar"))
    }

    /// A launch whose every child the fake host runs as `script`.
    fn scripted(script: Script) -> (Arc<Fake>, Launch) {
        cordon::host::fake::scripted_launch(script, "archive", Duration::from_secs(60))
    }

    /// Run a transfer whose every child the fake host scripts as `stdout` then `end`: the
    /// body, or the failure, and the fake's calls.
    fn transfer(
        rules: &Rules,
        source: &str,
        stdout: Vec<u8>,
        end: Ends,
    ) -> (Result<Vec<u8>, TransportError>, Vec<Call>) {
        let (fake, launch) = scripted(Script {
            stdout,
            end,
            ..Script::default()
        });
        let mut t = open(source, rules).unwrap();
        t.begin(&launch).unwrap();
        let mut body = Vec::new();
        let read = t.read_to_end(&mut body);
        let result = match (read, t.take_failure()) {
            (Ok(_), None) => Ok(body),
            (_, Some(e)) => Err(e),
            (Err(e), None) => panic!("a read error without a transport failure: {e}"),
        };
        (result, fake.calls())
    }

    fn exits(code: i32) -> Ends {
        Ends::Exits(ExitStatus::from_raw(code << 8))
    }

    fn code(r: &Result<Vec<u8>, TransportError>) -> String {
        match r {
            Ok(_) => "ok".into(),
            Err(TransportError::Rejected { code, .. }) => (*code).to_owned(),
            Err(TransportError::Failed { why }) => format!("failed: {why}"),
            Err(e) => format!("{e}"),
        }
    }

    /// Special-purpose and local addresses are never public, in any of their spellings;
    /// global ones are.
    #[test]
    fn only_globally_routable_addresses_are_public() {
        for a in [
            "10.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "::1",
            "::ffff:10.0.0.1",
            "::10.0.0.1",
            "::8.8.8.8",
            "fc00::1",
            "fe80::1",
            "fec0::1",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2001:db8::1",
            "2002::1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a}");
        }
        for a in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(a.parse().unwrap()), "{a}");
        }
    }

    /// The parent relays what a confined child said, counts the bytes itself, re-checks each
    /// redirect as plain data, and judges every other end: a child's crash or broken framing
    /// is the remote's (a rejection), one that never confined itself or was killed from
    /// outside is a no-decision, and a child's words reach the receipt escaped.
    #[test]
    fn the_parent_judges_every_end_of_a_transfer_child() {
        let (rules, source) = listening();
        let confined = (CONFINED, Vec::new());
        let done = (END, json(&End::Done));
        let (r, calls) = transfer(
            &rules,
            &source,
            frames(&[
                confined.clone(),
                (DATA, b"abc".to_vec()),
                (DATA, b"de".to_vec()),
                done.clone(),
            ]),
            exits(0),
        );
        assert_eq!(r.unwrap(), b"abcde");
        // The child was started with its request on its command line, its stdin the socket.
        assert!(calls.iter().any(|c| matches!(c, Call::Spawn(line) if line.contains("transfer") && line.contains("127.0.0.1"))));
        // More bytes than the bound, whatever the child says: too big, and the child killed.
        let (r, calls) = transfer(
            &rules,
            &source,
            frames(&[confined.clone(), (DATA, vec![1; 9]), done.clone()]),
            Ends::Hangs,
        );
        assert_eq!(code(&r), "transport.too-big");
        assert!(calls.iter().any(|c| matches!(c, Call::Kill(_))));
        // A redirect off the allow-list, re-checked by the parent.
        let away = Target {
            https: true,
            host: "example.com".into(),
            port: 443,
            path: "/".into(),
        };
        let (r, _) = transfer(
            &rules,
            &source,
            frames(&[confined.clone(), (REDIRECT, json(&away))]),
            exits(0),
        );
        assert_eq!(code(&r), "transport.redirect");
        // A redirect back to itself, every hop: counted by the parent.
        let again = transfer::target_of(&Url::parse(&source).unwrap()).unwrap();
        let (r, calls) = transfer(
            &rules,
            &source,
            frames(&[confined.clone(), (REDIRECT, json(&again))]),
            exits(0),
        );
        assert_eq!(code(&r), "transport.too-many-redirects");
        assert_eq!(
            calls.iter().filter(|c| matches!(c, Call::Spawn(_))).count(),
            3
        );
        // Broken framing, an unknown frame, a rejection code it may not use, a crash, silence.
        for (stdout, end) in [
            (
                [
                    frames(std::slice::from_ref(&confined)),
                    vec![b'D', 0xff, 0xff, 0xff, 0xff],
                ]
                .concat(),
                exits(0),
            ),
            (frames(&[confined.clone(), (b'Z', Vec::new())]), exits(0)),
            (
                frames(&[
                    confined.clone(),
                    (
                        END,
                        json(&End::Rejected {
                            code: "made.up".into(),
                            why: "x".into(),
                        }),
                    ),
                ]),
                exits(0),
            ),
            (
                frames(std::slice::from_ref(&confined)),
                Ends::Exits(ExitStatus::from_raw(11)),
            ),
            (frames(std::slice::from_ref(&confined)), exits(0)),
        ] {
            let (r, _) = transfer(&rules, &source, stdout, end);
            assert_eq!(code(&r), "transport.child");
        }
        // A child that never confined itself, or was killed from outside: no decision.
        let (r, _) = transfer(
            &rules,
            &source,
            Vec::new(),
            exits(cordon::confine::UNCONFINED_EXIT),
        );
        assert!(code(&r).starts_with("failed: "), "{}", code(&r));
        let (r, _) = transfer(
            &rules,
            &source,
            frames(std::slice::from_ref(&confined)),
            Ends::Exits(ExitStatus::from_raw(9)),
        );
        assert!(code(&r).starts_with("failed: "), "{}", code(&r));
        // A failure it reports is a no-decision, its words escaped.
        let (r, _) = transfer(
            &rules,
            &source,
            frames(&[
                confined,
                (
                    END,
                    json(&End::Failed {
                        why: "TLS: \x1b[31mred".into(),
                    }),
                ),
            ]),
            exits(0),
        );
        let why = code(&r);
        assert!(
            why.starts_with("failed: TLS: ") && !why.contains('\x1b'),
            "{why}"
        );
    }

    /// A consumer that has decided ends the transfer at once: a child waiting on a silent
    /// server is killed and reaped then, not at the deadline, so none outlives its lease.
    #[test]
    fn ending_a_transfer_kills_the_child_under_way() {
        let (rules, source) = listening();
        let mut stdout = Vec::new();
        write_frame(&mut stdout, CONFINED, b"").unwrap();
        // Its budget is the deadline's: 30 s here, far past what the test waits.
        let (fake, launch) = scripted(Script {
            stdout,
            end: Ends::Hangs,
            ..Script::default()
        });
        let mut t = open(&source, &rules).unwrap();
        t.begin(&launch).unwrap();
        while !fake.calls().iter().any(|c| matches!(c, Call::Spawn(_))) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        t.end();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(fake.calls().iter().any(|c| matches!(c, Call::Kill(_))));
        assert!(t.take_failure().is_none());
    }
}
