//! The `cordon-fetch` command: `cordon-fetch [--policy P] [--store S] --sha256 HEX SOURCE`.
//!
//! Order: parse the policy (exit 2 on any problem), establish the authority (exit 3 when the
//! runtime or binaries cannot be measured), check the source against the transport rules (exit
//! 2), open the store (exit 3), then stream the source through intake. The receipt says `ok`
//! (exit 0), `rejected` with a reason code and member path (exit 1), or `no-decision` (exit 3).

use cordon::exit::ExitClass;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::intake::{self, IntakeError};
use cordon::lease::LeaseError;
use cordon::receipt::{Decision, FetchOutputs, Outcome, Receipt, Rejection, StageName};
use cordon_stage::args::{LeaseArgs, StageArgs, report_diagnostic};
use cordon_stage::receipt_io as stage;
use serde_json::json;

use crate::transport::{self, Rules, Transfer, TransportError};

/// Admit an archive into the validator's private store.
#[derive(Debug, Parser)]
#[command(name = "cordon-fetch", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// Where the parser child's lease lives.
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// The committed sha256 of the archive bytes: 64 hex digits, `sha256:` prefix optional.
    #[arg(long)]
    pub sha256: String,
    /// A local path, or an `https://` URL.
    pub source: String,
    /// The hosts file a remote source's host is looked up in first (root's own file, read by
    /// this process; no NSS module is loaded).
    #[arg(long, default_value = "/etc/hosts")]
    pub hosts_file: PathBuf,
    /// The resolver file whose nameservers are asked next (its `nameserver` lines), each by a
    /// confined resolver child: no DNS answer is parsed by this process.
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
}

/// Failures before a receipt can be written.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum FetchError {
    /// The committed digest is malformed.
    #[error("--sha256 {given:?} is not 64 lowercase hex digits")]
    #[diagnostic(
        code(cordon::fetch::digest),
        help(
            "give the archive's sha256 as the candidate committed it (`sha256sum FILE` prints it; an optional sha256: prefix is accepted)"
        )
    )]
    Digest {
        /// What was given.
        given: String,
    },
    /// A local source cannot be opened.
    #[error("cannot open the source {path}")]
    #[diagnostic(
        code(cordon::fetch::open_source),
        help(
            "name an archive file (a relative path is from the current directory) or an https URL"
        )
    )]
    OpenSource {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A local source is not a regular file.
    #[error("the source {path} is not a regular file")]
    #[diagnostic(
        code(cordon::fetch::source_kind),
        help(
            "cordon-fetch admits an archive, never a directory: pack a delta deterministically (`tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf delta.tar -C DIR .`) and give its sha256"
        )
    )]
    SourceKind {
        /// The path.
        path: PathBuf,
    },
    /// The policy's trust anchor cannot be read.
    #[error("cannot read the policy's trust anchor {path}")]
    #[diagnostic(code(cordon::fetch::trust_anchor))]
    TrustAnchor {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The source breaks the transport rules, or the client cannot start.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Transport(#[from] TransportError),
    /// The store cannot be opened.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] cordon::store::StoreError),
    /// The receipt's inputs could not be recorded.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Receipt(#[from] cordon::receipt::ReceiptError),
}

impl ExitClass for FetchError {
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Digest { .. }
            | Self::OpenSource { .. }
            | Self::SourceKind { .. }
            | Self::TrustAnchor { .. }
            | Self::Transport(TransportError::Refused { .. }) => ExitCode::Usage,
            Self::Transport(_) | Self::Store(_) | Self::Receipt(_) => ExitCode::NoDecision,
        }
    }
}

fn parse_digest(given: &str) -> Result<Digest, FetchError> {
    let text = if given.starts_with("sha256:") {
        given.to_owned()
    } else {
        format!("sha256:{given}")
    };
    Digest::from_str(&text).map_err(|_| FetchError::Digest {
        given: given.to_owned(),
    })
}

/// The transport rules of a policy, with the trust anchor read and the byte cap applied.
fn rules(
    policy: &cordon_policy_lang::Policy,
    names: crate::resolve::Names,
) -> Result<Rules, FetchError> {
    let t = policy.transport();
    let trust_anchor = match t.trust_anchor {
        Some(path) => Some(
            std::fs::read(path).map_err(|source| FetchError::TrustAnchor {
                path: PathBuf::from(path),
                source,
            })?,
        ),
        None => None,
    };
    Ok(Rules {
        allow_hosts: t.allow_hosts.iter().map(|h| (*h).to_owned()).collect(),
        max_redirects: t.max_redirects,
        deadline: Duration::from_millis(t.deadline_ms),
        tls13_only: t.min_tls == "1.3",
        trust_anchor,
        allow_loopback: t.allow_loopback,
        allow_plain_http_loopback: t.allow_plain_http_loopback,
        max_bytes: cordon_stage::settings::archive_limits(policy).max_archive_bytes,
        names,
    })
}

/// The source, opened: a local file, or a remote transfer (begun under the lease).
enum Source {
    Local(std::fs::File),
    Remote(Box<Transfer>),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Local(f) => f.read(buf),
            Self::Remote(b) => b.read(buf),
        }
    }
}

fn open_source(
    given: &str,
    policy: &cordon_policy_lang::Policy,
    names: crate::resolve::Names,
) -> Result<Source, FetchError> {
    if given.contains("://") {
        return Ok(Source::Remote(Box::new(transport::open(
            given,
            &rules(policy, names)?,
        )?)));
    }
    let path = Path::new(given);
    // Non-blocking, so a FIFO at the path is opened and refused below instead of holding this
    // process until a writer comes (a regular file reads the same either way).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| FetchError::OpenSource {
            path: path.to_path_buf(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| FetchError::OpenSource {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(FetchError::SourceKind {
            path: path.to_path_buf(),
        });
    }
    Ok(Source::Local(file))
}

/// Run the tool: the whole of `main`. `child` is the executable that becomes the confined
/// parser child (`/proc/self/exe`: this binary, whose digest the authority covers).
pub fn run(args: &Args, child: &Path, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    cordon::voice::set_level(args.stage.level());
    if let Err(code) = cordon_stage::start::require_root(
        &cordon_stage::start::RootStage {
            tool: "cordon-fetch",
            why: "its archive parser runs as a per-run account, confined",
            stage: Some(StageName::Fetch),
            policy: &args.stage.policy,
        },
        args.stage.diagnostics,
        stdout,
        stderr,
    ) {
        return code;
    }
    let (loaded, authority) = match cordon_stage::start::stage_start(
        &args.stage.policy,
        args.stage.diagnostics,
        stderr,
    ) {
        Ok(s) => (s.loaded, s.authority),
        Err(code) => return code,
    };
    match fetch(args, child, &loaded.policy, authority, stdout, stderr) {
        Ok(code) => code,
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            e.exit_class()
        }
    }
}

/// What intake could not establish (exit 3), with its reason code.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
enum FetchFailure {
    /// The transfer failed: DNS, connection, TLS, deadline or a server error.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Transport(TransportError),
    /// The store, the local source or the parser child failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Intake(IntakeError),
    /// The parser child's lease could not be made or released.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(LeaseError),
}

impl stage::Infrastructure for FetchFailure {
    fn reason_code(&self) -> &'static str {
        match self {
            Self::Transport(_) => "transport.failed",
            Self::Intake(_) => "intake.infrastructure",
            Self::Lease(_) => "intake.infrastructure",
        }
    }
}

fn fetch(
    args: &Args,
    child: &Path,
    policy: &cordon_policy_lang::Policy,
    authority: Digest,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<ExitCode, FetchError> {
    let committed = parse_digest(&args.sha256)?;
    // On a terminal, how far the transfer has come (a 600 MiB fetch is otherwise silent).
    let mut source = cordon::voice::Progress::new(
        open_source(
            &args.source,
            policy,
            crate::resolve::Names {
                hosts: args.hosts_file.clone(),
                resolv_conf: args.resolv_conf.clone(),
            },
        )?,
        "cordon-fetch: read",
    );
    let store_root = args.stage.store_root(policy);
    let store = match stage::open_store(
        &store_root,
        (StageName::Fetch, authority),
        args.stage.diagnostics,
        stdout,
        stderr,
    ) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let mut receipt = Receipt::new(StageName::Fetch, authority, Outcome::Ok);
    receipt.set_inputs(&cordon::inputs::FetchInputs {
        source: args.source.clone(),
        sha256: committed,
    })?;
    let limits = cordon_stage::settings::archive_limits(policy);
    // The child may wait on the transfer for its whole deadline, then needs its CPU time.
    let budget = Duration::from_millis(policy.transport().deadline_ms)
        + cordon_stage::parser::budget(policy);
    let result = cordon_stage::parser::under_setup(
        policy,
        args.lease.setup(policy),
        &store,
        &authority,
        intake::ARCHIVE_CHILD,
        child,
        budget,
        |launch| {
            // The transfer's children run as the lease's account, beside the archive's.
            if let Source::Remote(transfer) = source.get_mut()
                && let Err(e) = transfer.begin(launch)
            {
                return Err(e);
            }
            let stopper = match source.get_mut() {
                Source::Remote(transfer) => transfer.stopper(),
                Source::Local(_) => None,
            };
            let ingested =
                intake::ingest_confined(&store, &mut source, &committed, &limits, launch, &|| {
                    stopper.iter().for_each(transport::Stopper::stop)
                });
            // Before the lease is released: no transfer child outlives its account.
            if let Source::Remote(transfer) = source.get_mut() {
                transfer.end();
            }
            Ok(ingested)
        },
    );
    let result = match result {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Ok(stage::finish(
                &store,
                &mut receipt,
                Err::<Decision<FetchOutputs>, _>(FetchFailure::Transport(e)),
                args.stage.diagnostics,
                stdout,
                stderr,
            ));
        }
        Err(e) => {
            return Ok(stage::finish(
                &store,
                &mut receipt,
                Err::<Decision<FetchOutputs>, _>(FetchFailure::Lease(e)),
                args.stage.diagnostics,
                stdout,
                stderr,
            ));
        }
    };
    let transport_failure = match source.get_mut() {
        Source::Remote(body) => body.take_failure(),
        Source::Local(_) => None,
    };
    // A failed transfer explains a failed ingest: its verdict wins.
    let decision = match (result, transport_failure) {
        (Ok(intake::Admitted { archive, record }), _) => Ok(Decision::Accepted(FetchOutputs {
            archive_sha256: archive.archive_sha256,
            content_digest: record.content_digest,
            files: record.files.len() as u64,
            bytes: record.bytes,
        })),
        (Err(_), Some(TransportError::Rejected { code, why })) => {
            Ok(Decision::Rejected(Rejection::one(code, why, json!({}))))
        }
        (Err(_), Some(other)) => Err(FetchFailure::Transport(other)),
        (Err(IntakeError::Rejected(r)), None) => {
            let message = match r.path {
                Some(p) => format!("{p}: {}", r.message),
                None => r.message,
            };
            Ok(Decision::Rejected(Rejection::one(
                r.code,
                message,
                json!({}),
            )))
        }
        (Err(other), None) => Err(FetchFailure::Intake(other)),
    };
    Ok(stage::finish(
        &store,
        &mut receipt,
        decision,
        args.stage.diagnostics,
        stdout,
        stderr,
    ))
}

/// The whole of `cordon-fetch`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    if let Some((spec, parent)) = cordon::confine::requested() {
        cordon::confine::run_child(&spec, parent, |spec| match spec.kind.as_str() {
            cordon::intake::ARCHIVE_CHILD => cordon::intake::archive_child(
                &mut std::io::stdin().lock(),
                &mut std::io::stdout().lock(),
            ),
            crate::transfer::TRANSFER_CHILD => {
                crate::transfer::child(spec.argument.as_deref(), &mut std::io::stdout().lock())
            }
            crate::resolve::RESOLVE_CHILD => {
                crate::resolve::child(spec.argument.as_deref(), &mut std::io::stdout().lock())
            }
            _ => cordon::confine::UNCONFINED_EXIT,
        });
    }
    cordon::exit::with_stdio(cordon_stage::args::parse::<Args>, |args, stdout, stderr| {
        run(args, std::path::Path::new("/proc/self/exe"), stdout, stderr)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn help(e: &FetchError) -> String {
        miette::Diagnostic::help(e).unwrap().to_string()
    }

    /// A newcomer's likeliest mistakes each say what to do next: a delta's directory given
    /// for its archive, a digest that is not one.
    #[test]
    fn a_directory_or_a_malformed_digest_says_what_to_give_instead() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policy/examples/minimal.kdl"),
        )
        .unwrap();
        let policy = cordon_policy_lang::parse("minimal.kdl", &text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let Err(e) = open_source(
            &dir.path().display().to_string(),
            &policy,
            crate::resolve::Names::default(),
        ) else {
            panic!("a directory opened as a source");
        };
        assert!(matches!(e, FetchError::SourceKind { .. }), "{e}");
        assert!(
            help(&e).contains("pack a delta deterministically"),
            "{}",
            help(&e)
        );
        let e = parse_digest("ABCD").unwrap_err();
        assert!(help(&e).contains("sha256sum FILE"), "{}", help(&e));
        assert!(parse_digest(&"a".repeat(64)).is_ok());
    }
}
