//! The transfer child (REQ-117): TLS and HTTP spoken by a confined child of the run account,
//! never by the root process.
//!
//! The parent ([`crate::transport`]) resolved the host, checked every address, connected, and
//! gave the connected socket to this child as its standard input. The child confines itself
//! like every parser child (`cordon::confine`: an empty root, a network namespace of its own in
//! which it can reach nothing, no capabilities, the run account, limits, a seccomp filter that
//! admits I/O and waiting on the descriptors it holds but no new socket and no connect), then
//! sends one GET over the socket and writes frames to stdout: the body in [`DATA`] frames
//! (within the bound it was given), or a redirect it has resolved and checked ([`REDIRECT`]),
//! then its [`END`]. Nothing it says is trusted: the parent counts the bytes, re-checks the
//! redirect and holds the deadline.

use std::io::Write;
use std::sync::Arc;

use cordon::confine::write_frame;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use url::Url;

/// The child kind: `cordon-fetch`'s dispatch key for a transfer child.
pub const TRANSFER_CHILD: &str = "transfer";

/// A chunk of the body.
pub const DATA: u8 = b'D';
/// A redirect's checked target (JSON [`Target`]); nothing follows.
pub const REDIRECT: u8 = b'R';
/// The end (JSON [`End`]); nothing follows.
pub const END: u8 = b'E';

/// Where one hop goes: plain data the parent checks against its allow-list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// `https` (else plain `http`, loopback only).
    pub https: bool,
    /// The host, a name or a literal address (without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The path and query, from `/`.
    pub path: String,
}

impl Target {
    /// As a URL, for messages.
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority(), self.path)
    }

    /// `host:port`, an IPv6 literal in brackets.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The target of `url`: its scheme, host, port and path; no credentials.
///
/// # Errors
/// The URL cannot be fetched as a hop.
pub fn target_of(url: &Url) -> Result<Target, String> {
    let https = match url.scheme() {
        "https" => true,
        "http" => false,
        other => return Err(format!("scheme {other:?} is not allowed")),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials in the URL are not allowed".into());
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_owned(),
        Some(url::Host::Ipv4(v4)) => v4.to_string(),
        Some(url::Host::Ipv6(v6)) => v6.to_string(),
        None => return Err("the URL names no host".into()),
    };
    let port = url.port_or_known_default().ok_or("the URL names no port")?;
    let mut path = url.path().to_owned();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    Ok(Target {
        https,
        host,
        port,
        path,
    })
}

/// What the parent asks of one hop.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Where.
    pub target: Target,
    /// Whether TLS 1.2 is refused.
    pub tls13_only: bool,
    /// The only trust anchors (PEM), or the compiled-in roots.
    pub trust_anchor: Option<String>,
    /// What a redirect may name, checked before it is reported.
    pub allowed: Allowed,
    /// Body bytes at most, for this hop.
    pub max_bytes: u64,
}

/// What a hop may go to: the policy's hosts and loopback allowances.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allowed {
    /// Hosts a hop may name.
    pub hosts: Vec<String>,
    /// Loopback addresses may be connected to.
    pub loopback: bool,
    /// Plain `http://` to a literal loopback address is accepted.
    pub plain_http_loopback: bool,
}

/// How a hop ended, as the child says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "kebab-case", deny_unknown_fields)]
pub enum End {
    /// The body ended.
    Done,
    /// The remote broke a rule.
    Rejected {
        /// A `transport.*` code ([`rejection_code`]).
        code: String,
        /// What happened.
        why: String,
    },
    /// It could not be completed (TLS, HTTP, a server error).
    Failed {
        /// What happened.
        why: String,
    },
}

/// The rejection codes a child may report, as the parent's own.
#[must_use]
pub fn rejection_code(code: &str) -> Option<&'static str> {
    ["transport.too-big", "transport.redirect"]
        .into_iter()
        .find(|c| *c == code)
}

/// The TLS configuration: TLS ≥ 1.2 (or 1.3), the given anchors alone or the compiled-in
/// Mozilla roots.
///
/// # Errors
/// The anchors hold no certificate, or the configuration cannot be built.
pub fn tls_config(tls13_only: bool, anchor: Option<&[u8]>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match anchor {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("trust anchor: {e}"))?;
                roots.add(cert).map_err(|e| format!("trust anchor: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the trust anchor file holds no certificate".into());
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .map_err(|e| format!("tls configuration: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// The largest data frame the child writes.
const CHUNK: usize = 64 << 10;

/// The child: `argument` is the parent's JSON [`Request`], stdin the connected socket, stdout
/// the frames. Its exit status (0 once it wrote its last frame).
pub fn child(argument: Option<&str>, out: &mut dyn Write) -> i32 {
    let Some(request) = argument.and_then(|a| serde_json::from_str::<Request>(a).ok()) else {
        return 2;
    };
    let end = match start(&request, out) {
        Ok(Some(redirect)) => return last_frame(out, REDIRECT, &redirect),
        Ok(None) => End::Done,
        Err(end) => end,
    };
    last_frame(out, END, &end)
}

/// A child's last frame: `value` as JSON under `tag`, flushed. The child's exit status: 0 once
/// it is written.
pub(crate) fn last_frame(out: &mut dyn Write, tag: u8, value: &impl Serialize) -> i32 {
    let Ok(json) = serde_json::to_vec(value) else {
        return 4;
    };
    match write_frame(out, tag, &json).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(_) => 4,
    }
}

/// [`End::Failed`] with `why`.
pub(crate) fn failed(why: impl std::fmt::Display) -> End {
    End::Failed {
        why: why.to_string(),
    }
}

fn start(request: &Request, out: &mut dyn Write) -> Result<Option<Target>, End> {
    use std::os::fd::AsFd;
    // Its stdin is the connection; a descriptor of its own keeps it after stdin is locked away.
    let socket = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| failed(format!("the connection: {e}")))?;
    let socket = std::net::TcpStream::from(socket);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| failed(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(get(request, socket, out))
}

/// Anything the connection can be: TLS over the socket, or the socket itself.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

async fn get(
    request: &Request,
    socket: std::net::TcpStream,
    out: &mut dyn Write,
) -> Result<Option<Target>, End> {
    let t = &request.target;
    let tcp = tokio::net::TcpStream::from_std(socket)
        .map_err(|e| failed(format!("the connection: {e}")))?;
    let io: Box<dyn Io> = if t.https {
        let config = tls_config(
            request.tls13_only,
            request.trust_anchor.as_deref().map(str::as_bytes),
        )
        .map_err(failed)?;
        let name = rustls::pki_types::ServerName::try_from(t.host.clone())
            .map_err(|e| failed(format!("server name {:?}: {e}", t.host)))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| failed(format!("TLS: {}", cordon::error_chain(&e))))?;
        Box::new(tls)
    } else {
        Box::new(tcp)
    };
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| failed(format!("HTTP: {}", cordon::error_chain(&e))))?;
    let driver = tokio::spawn(connection);
    let host = if (t.https && t.port == 443) || (!t.https && t.port == 80) {
        t.authority()
            .rsplit_once(':')
            .map_or_else(String::new, |(h, _)| h.to_owned())
    } else {
        t.authority()
    };
    let get = hyper::Request::get(t.path.as_str())
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT_ENCODING, "identity")
        .header(hyper::header::USER_AGENT, "cordon-fetch")
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(format!("the request: {e}")))?;
    let mut response = sender
        .send_request(get)
        .await
        .map_err(|e| failed(format!("HTTP: {}", cordon::error_chain(&e))))?;
    let status = response.status();
    if status.is_redirection() {
        driver.abort();
        return redirect(request, &response).map(Some);
    }
    if status != hyper::StatusCode::OK {
        return Err(failed(format!("the server answered {status}")));
    }
    let mut received = 0u64;
    // Frames of up to CHUNK bytes, however small the server's pieces: each frame costs a
    // header and a wakeup of the parent.
    let mut pending: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut send = |bytes: &[u8]| {
        write_frame(out, DATA, bytes).map_err(|e| failed(format!("the parent: {e}")))
    };
    loop {
        // What is ready now joins the pending frame; before waiting on the server, what is
        // pending goes out (a slow server's bytes are never held back).
        let ready = {
            let mut next = std::pin::pin!(response.body_mut().frame());
            match next
                .as_mut()
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
            {
                std::task::Poll::Ready(frame) => Some(frame),
                std::task::Poll::Pending => None,
            }
        };
        let frame = match ready {
            Some(frame) => frame,
            None => {
                if !pending.is_empty() {
                    send(&pending)?;
                    pending.clear();
                }
                response.body_mut().frame().await
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| failed(format!("the body: {}", cordon::error_chain(&e))))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len() as u64;
        if received > request.max_bytes {
            return Err(End::Rejected {
                code: "transport.too-big".into(),
                why: format!("the body exceeds {} bytes", request.max_bytes),
            });
        }
        let mut rest: &[u8] = &data;
        while !rest.is_empty() {
            let take = rest.len().min(CHUNK - pending.len());
            pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if pending.len() == CHUNK {
                send(&pending)?;
                pending.clear();
            }
        }
    }
    if !pending.is_empty() {
        send(&pending)?;
    }
    Ok(None)
}

/// The redirect `response` asks for, resolved against the target and checked.
fn redirect(
    request: &Request,
    response: &hyper::Response<hyper::body::Incoming>,
) -> Result<Target, End> {
    let status = response.status();
    let location = response
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| failed(format!("a {status} response without a usable Location")))?;
    let rejected = |why: String| End::Rejected {
        code: "transport.redirect".into(),
        why,
    };
    let here = Url::parse(&request.target.url()).map_err(failed)?;
    let next = here
        .join(location)
        .map_err(|e| rejected(format!("redirect to an invalid URL {location:?}: {e}")))?;
    let target = target_of(&next).map_err(|why| rejected(format!("redirect to {next}: {why}")))?;
    crate::transport::check_target(&target, &request.allowed)
        .map_err(|why| rejected(format!("redirect to {next}: {why}")))?;
    Ok(target)
}
