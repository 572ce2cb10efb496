//! Name resolution for a transfer hop, with no DNS byte parsed by this (root) process.
//!
//! The parent ([`resolve`]) reads only the host's own files, which root owns: an address
//! literal is itself; a name listed in the hosts file (`/etc/hosts`) is what that lists; any
//! other name goes to each nameserver of the resolver file (`/etc/resolv.conf`) in turn. No
//! search list is applied (an allow-listed name is asked for as written) and no NSS module is
//! ever loaded into root (glibc's `getaddrinfo` would load whatever `nsswitch.conf` names and
//! parse the answers here).
//!
//! For each nameserver the parent makes a UDP socket connected to it and hands it, as standard
//! input, to a confined resolver child of the run account ([`child`]; the same confinement as
//! the transfer child: an empty root and network namespace, no capabilities, a seccomp filter
//! with I/O on the descriptors it holds but no new socket and no connect). The child asks for
//! the name's A and AAAA records, checks each answer against its question, follows the CNAME
//! chain within the answer, and writes each address as a fixed-size frame ([`ADDRESS`]), then
//! its [`END`]. The parent reads at most [`MAX_ADDRESSES`] frames of exactly 4 or 16 bytes —
//! nothing else it says is decoded but the end's small JSON, as from every confined child —
//! and holds the transfer's one deadline over it. The caller checks every address it gets.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon::confine::{FrameError, FrameReader, Launch, Supervised, write_frame};
use serde::{Deserialize, Serialize};

use crate::transfer::{END, End, failed, last_frame};

/// The child kind: `cordon-fetch`'s dispatch key for a resolver child.
pub const RESOLVE_CHILD: &str = "resolve";

/// One address: 4 bytes (IPv4) or 16 (IPv6), network order. The child ends with the
/// transfer child's [`END`] frame.
pub const ADDRESS: u8 = b'A';

/// Addresses taken from one answer at most; more is the answer's fault.
pub const MAX_ADDRESSES: usize = 32;

/// Nameservers asked at most (glibc's `MAXNS`).
const MAX_NAMESERVERS: usize = 3;

/// The largest DNS message over UDP the child reads, and asks for (EDNS's safe payload
/// size: no fragmentation on any path).
const MAX_MESSAGE: u16 = 1232;

/// How long one nameserver is waited for at most (glibc's default `timeout`): one that is
/// silent leaves the others, and the transfer, their time.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// CNAME links followed within one answer at most.
const MAX_CHAIN: usize = 8;

/// Where the host's name files are: root's, read by the parent only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The hosts file (`/etc/hosts`).
    pub hosts: PathBuf,
    /// The resolver file (`/etc/resolv.conf`): its `nameserver` lines.
    pub resolv_conf: PathBuf,
}

impl Default for Names {
    fn default() -> Self {
        Self {
            hosts: PathBuf::from("/etc/hosts"),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
        }
    }
}

/// What the parent asks the child (its command-line argument).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The name, as the allow-list admitted it.
    pub name: String,
    /// How long to wait for each answer, milliseconds.
    pub wait_ms: u64,
}

/// How a transfer follows its resolver children, so that stopping it ends one under way:
/// called with a started child's killer (`false`: the transfer was stopped, the child is
/// killed and nothing more is asked), and with `None` before each nameserver and once a child
/// ended (`false`: stopped, nothing more is asked).
pub type Watch<'a> = &'a dyn Fn(Option<cordon::host::Killer>) -> bool;

/// What a stopped transfer's resolution ends with.
pub const STOPPED: &str = "the transfer was stopped";

/// The addresses of `host`: itself when it is an address literal, else from the hosts file,
/// else from the nameservers by confined resolver children under `launch`, before `deadline`.
///
/// # Errors
/// A string: why no address was established (the caller's no-decision), or [`STOPPED`].
pub fn resolve(
    host: &str,
    names: &Names,
    launch: &Launch,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Vec<IpAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let hosts = read_host_file(&names.hosts)?;
    let listed = from_hosts(&hosts, host);
    if !listed.is_empty() {
        return Ok(listed);
    }
    let servers = nameservers(&read_host_file(&names.resolv_conf)?);
    if servers.is_empty() {
        return Err(format!(
            "{} names no nameserver",
            names.resolv_conf.display()
        ));
    }
    let mut tried = Vec::new();
    for server in servers.into_iter().take(MAX_NAMESERVERS) {
        if !watch(None) {
            return Err(STOPPED.to_owned());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tried.push("the deadline passed".to_owned());
            break;
        }
        match ask(host, server, launch, deadline, watch) {
            Ok(Answer::Addresses(a)) => return Ok(a),
            Ok(Answer::Unanswered(why)) | Err(why) => tried.push(format!("{server}: {why}")),
        }
    }
    Err(format!("cannot resolve {host:?}: {}", tried.join("; ")))
}

/// A root-owned host file, read whole (a missing one is empty).
fn read_host_file(path: &Path) -> Result<String, String> {
    match std::fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// The addresses the hosts file `text` lists for `host` (names compare without case).
fn from_hosts(text: &str, host: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split('#').next()?.split_whitespace();
            let ip = words.next()?.parse::<IpAddr>().ok()?;
            words.any(|n| n.eq_ignore_ascii_case(host)).then_some(ip)
        })
        .collect()
}

/// The nameservers of the resolver file `text`, in its order: its `nameserver ADDRESS` lines
/// (every other line and option is the C library's business, not this lookup's: glibc too
/// ignores what it does not know; a link-local address with a zone is not used).
fn nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == "nameserver")
                .then(|| words.next()?.parse::<IpAddr>().ok())
                .flatten()
        })
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// What one nameserver said, through its child.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The name's addresses (at least one).
    Addresses(Vec<IpAddr>),
    /// No usable answer from this one (no such name, silence, a failure, a broken child):
    /// the next is asked.
    Unanswered(String),
}

/// Ask `server` for `host` through one resolver child.
fn ask(
    host: &str,
    server: SocketAddr,
    launch: &Launch,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Answer, String> {
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind)
        .and_then(|s| s.connect(server).map(|()| s))
        // The child waits on it with its event loop.
        .and_then(|s| s.set_nonblocking(true).map(|()| s))
        .map_err(|e| format!("cannot make a socket to it: {e}"))?;
    let left = deadline.saturating_duration_since(Instant::now());
    let question = Question {
        name: host.to_owned(),
        // Both questions are asked at once; half of what is left (at most MAX_WAIT) is
        // waited for them, so a silent nameserver is told as such before the deadline ends
        // the child, and leaves the next one time.
        wait_ms: u64::try_from((left / 2).min(MAX_WAIT).as_millis()).unwrap_or(u64::MAX),
    };
    let mut child = launch.clone();
    child.spec.kind = RESOLVE_CHILD.to_owned();
    child.spec.argument =
        Some(serde_json::to_string(&question).map_err(|e| format!("the question: {e}"))?);
    child.budget = left;
    let (child, stdout) = Supervised::start_on(&child, socket.into())
        .map_err(|e| format!("cannot start the resolver child: {e}"))?;
    if !watch(Some(child.killer())) {
        let _ = child.finish(true, false);
        return Err(STOPPED.to_owned());
    }
    let mut frames = FrameReader::new(stdout, 4096, 1 << 16);
    match cordon::confine::confirmed(&mut frames) {
        Ok(true) => {}
        Ok(false) => return Err(child.unconfined()),
        Err(e) => return Err(format!("{e}; {}", child.unconfined())),
    }
    let said = read_answer(&mut frames);
    drop(frames);
    let finished = child
        .finish(said.is_err(), true)
        .map_err(|e| format!("cannot wait for the resolver child: {e}"))?;
    if !watch(None) {
        return Err(STOPPED.to_owned());
    }
    if finished.deadline_kill {
        return Err("the transfer deadline passed".to_owned());
    }
    if let Some(cordon::confine::Ended::Broke(why) | cordon::confine::Ended::Infrastructure(why)) =
        finished.ended()
    {
        return Ok(Answer::Unanswered(finished.with_tail(&why)));
    }
    said.map_err(|why| format!("the resolver child: {}", cordon::text::printable(&why)))
}

/// The child's frames: addresses, then its end.
fn read_answer(frames: &mut FrameReader<impl io::Read>) -> Result<Answer, String> {
    let mut addresses = Vec::new();
    loop {
        match frames.frame() {
            Ok(Some((ADDRESS, bytes))) => {
                if addresses.len() == MAX_ADDRESSES {
                    return Err(format!("more than {MAX_ADDRESSES} addresses"));
                }
                addresses.push(match <[u8; 4]>::try_from(bytes.as_slice()) {
                    Ok(v4) => IpAddr::from(v4),
                    Err(_) => IpAddr::from(
                        <[u8; 16]>::try_from(bytes.as_slice())
                            .map_err(|_| format!("an address frame of {} bytes", bytes.len()))?,
                    ),
                });
            }
            Ok(Some((END, json))) => {
                return match serde_json::from_slice::<End>(&json)
                    .map_err(|e| format!("a malformed end frame: {e}"))?
                {
                    End::Done if addresses.is_empty() => Err("no address and no reason".into()),
                    End::Done => Ok(Answer::Addresses(addresses)),
                    End::Rejected { .. } => Err("a rejection, which it never reports".into()),
                    End::Failed { why } => Ok(Answer::Unanswered(
                        cordon::text::printable(&why).into_owned(),
                    )),
                };
            }
            Ok(Some((tag, _))) => return Err(format!("an unknown frame tag {tag}")),
            Ok(None) | Err(FrameError::Truncated) => return Err("it ended without a word".into()),
            Err(FrameError::Broken(why)) => return Err(why),
            Err(FrameError::Pipe(e)) => return Err(format!("its output: {e}")),
        }
    }
}

/// The child: `argument` is the parent's JSON [`Question`], stdin the socket connected to one
/// nameserver, stdout the frames. Its exit status (0 once it wrote its last frame).
pub fn child(argument: Option<&str>, out: &mut dyn io::Write) -> i32 {
    let Some(question) = argument.and_then(|a| serde_json::from_str::<Question>(a).ok()) else {
        return 2;
    };
    let end = match lookup(&question) {
        Ok(addresses) => {
            for ip in addresses {
                let bytes = match ip {
                    IpAddr::V4(v4) => v4.octets().to_vec(),
                    IpAddr::V6(v6) => v6.octets().to_vec(),
                };
                if write_frame(out, ADDRESS, &bytes).is_err() {
                    return 4;
                }
            }
            End::Done
        }
        Err(end) => end,
    };
    last_frame(out, END, &end)
}

/// Ask for `question`'s A and AAAA records on stdin's socket: every address of both, or why
/// not.
fn lookup(question: &Question) -> Result<Vec<IpAddr>, End> {
    use hickory_proto::rr::{Name, RecordType};
    use std::os::fd::AsFd;
    let name = Name::from_ascii(&question.name)
        .map(|mut n| {
            // Asked as written: the name is absolute, no search list.
            n.set_fqdn(true);
            n
        })
        .map_err(|e| failed(format!("the name {:?}: {e}", question.name)))?;
    let socket = io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| failed(format!("the socket: {e}")))?;
    let socket = UdpSocket::from(socket);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| failed(format!("cannot start the runtime: {e}")))?;
    let wait = Duration::from_millis(question.wait_ms);
    runtime.block_on(async {
        let socket = tokio::net::UdpSocket::from_std(socket)
            .map_err(|e| failed(format!("the socket: {e}")))?;
        let kinds = [RecordType::A, RecordType::AAAA];
        let mut asked = Vec::new();
        for kind in kinds {
            let id = query_id().map_err(failed)?;
            socket
                .send(&query(&name, kind, id).map_err(failed)?)
                .await
                .map_err(|e| failed(format!("cannot send the question: {e}")))?;
            asked.push((kind, id));
        }
        // Both answered, or the wait ended: replies that are not to a question asked (a late
        // one, a spoofed one) are skipped meanwhile.
        let mut answers: Vec<Option<Result<Vec<IpAddr>, String>>> = vec![None, None];
        let read = tokio::time::timeout(wait, async {
            let mut buf = vec![0u8; usize::from(MAX_MESSAGE)];
            while answers.iter().any(Option::is_none) {
                let n = socket.recv(&mut buf).await?;
                for ((kind, id), answer) in asked.iter().zip(answers.iter_mut()) {
                    if answer.is_none()
                        && let Some(reply) = addresses(&buf[..n], &name, *kind, *id)
                    {
                        *answer = Some(reply);
                    }
                }
            }
            Ok::<_, io::Error>(())
        })
        .await;
        if let Ok(Err(e)) = read {
            return Err(failed(format!("cannot read the answer: {e}")));
        }
        let mut all = Vec::new();
        // Why a kind gave nothing: told only when neither gave an address.
        let mut why = None;
        for (kind, answer) in kinds.iter().zip(answers) {
            match answer {
                Some(Ok(found)) => all.extend(found),
                Some(Err(e)) => why = why.or(Some(e)),
                None => why = why.or(Some(format!("no answer to {kind} within {wait:?}"))),
            }
        }
        all.dedup();
        if all.is_empty() {
            return Err(failed(
                why.unwrap_or_else(|| format!("{name} has no A or AAAA record")),
            ));
        }
        all.truncate(MAX_ADDRESSES);
        Ok(all)
    })
}

/// A fresh random query id (the child may ask the kernel for randomness).
fn query_id() -> Result<u16, String> {
    let mut id = [0u8; 2];
    getrandom::fill(&mut id).map_err(|e| format!("no randomness for the query id: {e}"))?;
    Ok(u16::from_be_bytes(id))
}

/// The query for `name`'s `kind` records, with `id`, recursion desired.
fn query(
    name: &hickory_proto::rr::Name,
    kind: hickory_proto::rr::RecordType,
    id: u16,
) -> Result<Vec<u8>, String> {
    use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
    let mut edns = Edns::new();
    edns.set_max_payload(MAX_MESSAGE);
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), kind))
        .set_edns(edns);
    m.to_vec()
        .map_err(|e| format!("cannot encode the question: {e}"))
}

/// What `reply` says of `name`'s `kind` records when it answers query `id` (`None`: it does
/// not: another id, question or kind, or no DNS message at all): the records of that kind
/// owned by `name` or by the end of its CNAME chain within the answer (none when the name
/// exists without them), or why the answer cannot be used.
fn addresses(
    reply: &[u8],
    name: &hickory_proto::rr::Name,
    kind: hickory_proto::rr::RecordType,
    id: u16,
) -> Option<Result<Vec<IpAddr>, String>> {
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, RecordType};
    let m = Message::from_vec(reply).ok()?;
    let ours = m.id() == id
        && m.message_type() == MessageType::Response
        && m.queries().len() == 1
        && m.queries()[0].name() == name
        && m.queries()[0].query_type() == kind;
    if !ours {
        return None;
    }
    match m.response_code() {
        ResponseCode::NoError => {}
        ResponseCode::NXDomain => return Some(Err(format!("{name} does not exist"))),
        other => return Some(Err(format!("the nameserver answered {other}"))),
    }
    if m.truncated() {
        return Some(Err("the answer was truncated".into()));
    }
    // Follow the chain from the name asked, link by link, within this answer.
    let mut owner = name.clone();
    for _ in 0..=MAX_CHAIN {
        let found: Vec<IpAddr> = m
            .answers()
            .iter()
            .filter(|r| r.name() == &owner)
            .filter_map(|r| match (r.data(), kind) {
                (RData::A(a), RecordType::A) => Some(IpAddr::V4(a.0)),
                (RData::AAAA(a), RecordType::AAAA) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .take(MAX_ADDRESSES)
            .collect();
        if !found.is_empty() {
            return Some(Ok(found));
        }
        match m.answers().iter().find_map(|r| match r.data() {
            RData::CNAME(c) if r.name() == &owner => Some(c.0.clone()),
            _ => None,
        }) {
            Some(next) => owner = next,
            None => return Some(Ok(Vec::new())),
        }
    }
    Some(Err(format!("a CNAME chain longer than {MAX_CHAIN} links")))
}

#[cfg(test)]
mod tests;
