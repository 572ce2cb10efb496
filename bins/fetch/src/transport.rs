//! Remote transport for intake: one `https://` (or, for tests, loopback `http://`) GET under the
//! policy's rules, delivered as a byte stream.
//!
//! It owns the transport rules: the host must be on the allow-list (checked again for every
//! redirect target); every address a name resolves to must be public unless the policy's
//! loopback allowance is on, and the connection goes to exactly the addresses that were checked
//! (the resolver is ours, so a second lookup cannot rebind); TLS is rustls with TLS ≥ 1.2 (or
//! 1.3 by policy) and either the policy's trust anchor alone or the compiled-in Mozilla roots;
//! proxies from the environment are ignored; one absolute deadline covers the whole transfer,
//! redirects included; the byte cap is enforced on the bytes received, never on a
//! Content-Length.
//!
//! The stream is produced on a private tokio runtime thread and handed over through a bounded
//! channel, so the deadline is enforced on the network side even while the consumer is busy.
//! It does not parse the archive; that is [`cordon::archive`].

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{Receiver, Sender, channel};
use url::{Host, Url};

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
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
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

/// Check a URL against the static rules: scheme, host allow-list, literal addresses.
fn check_url(url: &Url, rules: &Rules) -> Result<(), String> {
    let host = url.host().ok_or("the URL names no host")?;
    let loopback_literal = match &host {
        Host::Ipv4(v4) => v4.is_loopback(),
        Host::Ipv6(v6) => v6.is_loopback(),
        Host::Domain(_) => false,
    };
    match url.scheme() {
        "https" => {}
        "http" if rules.allow_plain_http_loopback && rules.allow_loopback => {
            if !loopback_literal {
                return Err("plain http is accepted only to a literal loopback address".into());
            }
        }
        "http" => return Err("plain http is not allowed by the policy: use https://".into()),
        other => return Err(format!("scheme {other:?} is not allowed")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials in the URL are not allowed".into());
    }
    let name = host.to_string();
    let name = name.trim_start_matches('[').trim_end_matches(']');
    if !rules
        .allow_hosts
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
    {
        return Err(format!("host {name:?} is not on the policy's allow-list"));
    }
    let literal = match host {
        Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        Host::Domain(_) => None,
    };
    if let Some(ip) = literal.filter(|ip| !address_allowed(*ip, rules.allow_loopback)) {
        return Err(format!("address {ip} is not public"));
    }
    Ok(())
}

/// The resolver reqwest connects through: every address a name resolves to must be allowed, and
/// only those addresses are returned, so what is connected to is what was checked.
struct CheckedResolver {
    allow_loopback: bool,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_loopback = self.allow_loopback;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::task::spawn_blocking(move || (host.as_str(), 0).to_socket_addrs())
                    .await
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)??
                    .collect();
            if addrs.is_empty() {
                return Err(io::Error::other("the name resolves to no address").into());
            }
            if let Some(bad) = addrs
                .iter()
                .find(|a| !address_allowed(a.ip(), allow_loopback))
            {
                return Err(io::Error::other(NonPublic(bad.ip())).into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The marker error a resolver returns for a non-public address, found again in the chain.
#[derive(Debug)]
struct NonPublic(IpAddr);

impl std::fmt::Display for NonPublic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the name resolves to the non-public address {}", self.0)
    }
}

impl std::error::Error for NonPublic {}

fn find_non_public(err: &(dyn std::error::Error + 'static)) -> Option<IpAddr> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(NonPublic(ip)) = e.downcast_ref::<NonPublic>() {
            return Some(*ip);
        }
        if let Some(io) = e.downcast_ref::<io::Error>()
            && let Some(NonPublic(ip)) = io.get_ref().and_then(|i| i.downcast_ref::<NonPublic>())
        {
            return Some(*ip);
        }
        cur = e.source();
    }
    None
}

fn tls_config(rules: &Rules) -> Result<rustls::ClientConfig, TransportError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let failed = |why: String| TransportError::Failed { why };
    let mut roots = rustls::RootCertStore::empty();
    match &rules.trust_anchor {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| failed(format!("trust anchor: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| failed(format!("trust anchor: {e}")))?;
            }
            if roots.is_empty() {
                return Err(failed("the trust anchor file holds no certificate".into()));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let versions: &[&rustls::SupportedProtocolVersion] = if rules.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .map_err(|e| failed(format!("tls configuration: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(config)
}

/// A chunk of the body, or the end, or why it stopped.
type Chunk = Result<Vec<u8>, TransportError>;

/// The consumer's side of a transfer.
pub struct Body {
    rx: Receiver<Chunk>,
    current: Vec<u8>,
    offset: usize,
    done: bool,
    /// The failure that ended the stream, kept for the caller to classify.
    failure: Option<TransportError>,
    /// A signal to this process ends a read that waits on the network, instead of letting it
    /// wait out the transfer's deadline.
    _stop: cordon::interrupt::Registered,
}

impl Body {
    /// The transport failure that ended the stream, if one did.
    pub fn take_failure(&mut self) -> Option<TransportError> {
        self.failure.take()
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.offset == self.current.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) if chunk.is_empty() => self.done = true,
                Some(Ok(chunk)) => {
                    self.current = chunk;
                    self.offset = 0;
                }
                Some(Err(e)) => {
                    let msg = e.to_string();
                    self.failure = Some(e);
                    self.done = true;
                    return Err(io::Error::other(msg));
                }
                None => {
                    self.done = true;
                    let e = TransportError::Failed {
                        why: "the transfer thread ended without finishing".into(),
                    };
                    let msg = e.to_string();
                    self.failure = Some(e);
                    return Err(io::Error::other(msg));
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.offset);
        buf[..n].copy_from_slice(&self.current[self.offset..self.offset + n]);
        self.offset += n;
        Ok(n)
    }
}

/// Start a transfer. The static checks on `source` happen here, before any connection; the
/// rest happens on the transfer thread and surfaces through the returned [`Body`].
///
/// # Errors
/// [`TransportError::Refused`] when the URL breaks a static rule; [`TransportError::Failed`]
/// when the client cannot be built.
pub fn open(source: &str, rules: &Rules) -> Result<Body, TransportError> {
    let url = Url::parse(source).map_err(|e| TransportError::Refused {
        url: source.to_owned(),
        why: e.to_string(),
    })?;
    check_url(&url, rules).map_err(|why| TransportError::Refused {
        url: source.to_owned(),
        why,
    })?;
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls_config(rules)?)
        .dns_resolver(Arc::new(CheckedResolver {
            allow_loopback: rules.allow_loopback,
        }))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .referer(false)
        .https_only(!rules.allow_plain_http_loopback)
        .build()
        .map_err(|e| TransportError::Failed {
            why: cordon_stage::receipt_io::error_chain(&e),
        })?;
    let (tx, rx) = channel::<Chunk>(16);
    let stop = tx.clone();
    let stop = cordon::interrupt::on_signal(move || {
        // A full channel means the reader is not waiting: it reads on, and its writes to the
        // stopped parser child fail.
        let _ = stop.try_send(Err(TransportError::Failed {
            why: "a signal stopped the transfer".into(),
        }));
    });
    let rules = rules.clone();
    let deadline = Instant::now() + rules.deadline;
    std::thread::Builder::new()
        .name("cordon-fetch-transfer".into())
        .spawn(move || transfer(client, url, rules, deadline, tx))
        .map_err(|e| TransportError::Failed {
            why: format!("cannot start the transfer thread: {e}"),
        })?;
    Ok(Body {
        rx,
        current: Vec::new(),
        offset: 0,
        done: false,
        failure: None,
        _stop: stop,
    })
}

fn transfer(client: reqwest::Client, url: Url, rules: Rules, deadline: Instant, tx: Sender<Chunk>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.blocking_send(Err(TransportError::Failed {
                why: format!("cannot start the transfer runtime: {e}"),
            }));
            return;
        }
    };
    runtime.block_on(async move {
        let budget = tokio::time::Instant::from_std(deadline);
        let result = match tokio::time::timeout_at(budget, stream(client, url, &rules, &tx)).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Failed {
                why: format!("the transfer deadline of {:?} passed", rules.deadline),
            }),
        };
        // A consumer that stopped listening has already decided; nothing to report to it.
        let _ = match result {
            Ok(()) => tx.send(Ok(Vec::new())).await,
            Err(e) => tx.send(Err(e)).await,
        };
    });
}

async fn stream(
    client: reqwest::Client,
    mut url: Url,
    rules: &Rules,
    tx: &Sender<Chunk>,
) -> Result<(), TransportError> {
    let failed = |e: reqwest::Error| match find_non_public(&e) {
        Some(ip) => TransportError::Rejected {
            code: "transport.non-public-address",
            why: format!("the source resolves to the non-public address {ip}"),
        },
        None => TransportError::Failed {
            why: cordon_stage::receipt_io::error_chain(&e),
        },
    };
    let mut redirects = 0u64;
    let mut response = loop {
        let response = client
            .get(url.clone())
            .header(reqwest::header::ACCEPT_ENCODING, "identity")
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        if status.is_redirection() {
            redirects += 1;
            if redirects > rules.max_redirects {
                return Err(TransportError::Rejected {
                    code: "transport.too-many-redirects",
                    why: format!("more than {} redirects", rules.max_redirects),
                });
            }
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| TransportError::Failed {
                    why: format!("a {status} response without a usable Location"),
                })?;
            let next = url.join(location).map_err(|e| TransportError::Rejected {
                code: "transport.redirect",
                why: format!("redirect to an invalid URL {location:?}: {e}"),
            })?;
            check_url(&next, rules).map_err(|why| TransportError::Rejected {
                code: "transport.redirect",
                why: format!("redirect to {next}: {why}"),
            })?;
            url = next;
            continue;
        }
        if status != reqwest::StatusCode::OK {
            return Err(TransportError::Failed {
                why: format!("the server answered {status}"),
            });
        }
        break response;
    };
    let mut received = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        received += chunk.len() as u64;
        if received > rules.max_bytes {
            return Err(TransportError::Rejected {
                code: "transport.too-big",
                why: format!("the body exceeds {} bytes", rules.max_bytes),
            });
        }
        // The bounded channel is the backpressure: a slow consumer slows the transfer, and the
        // deadline still covers it. A send error means the consumer has stopped: end quietly.
        if tx.send(Ok(chunk.to_vec())).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}
