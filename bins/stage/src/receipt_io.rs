//! What every stage binary does around its own work: read the input receipt (and prove that the
//! store holds it and that its chain walks back to intake under this authority), print exactly
//! one receipt on stdout, and store it signed.
//!
//! Every receipt [`emit`] is given a store for is stored (under `receipts/<hex>.json`, through
//! `cordon::signing::HostKey::store_receipt`), whatever its outcome: a rejection or a
//! no-decision adds only its receipt and signature, the store's content stays byte-for-byte as
//! it was, which is what the "nothing changed" tests check (they compare
//! `Store::content_listing`, which leaves `receipts/` out). The one exception is the verified
//! image cache (`images/<manifest hex>/`): a container stage's first run unpacks the policy's
//! pinned image there whatever its outcome — the policy's bytes, never a candidate's.

use std::io::{Read, Write};
use std::path::Path;

use cordon::chain::{self, ChainError};
use cordon::receipt::{
    AUTHORITY_PARTS, Decision, Outcome, Reason, Receipt, ReceiptError, StageName,
};
use cordon_canon::ExitCode;
use cordon_canon::exit::ExitClass;

use crate::args::{Diagnostics, fail, report_diagnostic};
pub use cordon::signing::KEY_DIR;
use cordon::signing::{HostKey, SigningError};
use cordon::store::{Store, StoreError};
use cordon_canon::Digest;

/// Why the receipt plumbing failed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StageError {
    /// The input receipt could not be read.
    #[error("cannot read the input receipt from {from}")]
    #[diagnostic(
        code(cordon::stage::read_receipt),
        help(
            "name the file the stage before printed (a relative path is from the current directory), or pipe it in; `-` reads stdin"
        )
    )]
    ReadReceipt {
        /// `stdin` or the file.
        from: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The input receipt is not usable.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Receipt(#[from] ReceiptError),
    /// The input receipt, of the expected stage and authority, does not record an established
    /// result: the stage does nothing and passes the verdict on ([`pass_on`]).
    #[error("the input receipt's outcome is {outcome:?}, not ok")]
    #[diagnostic(
        code(cordon::stage::not_ok),
        help("a stage only continues from an ok receipt of the stage before it")
    )]
    NotOk {
        /// Its outcome.
        outcome: Outcome,
        /// The receipt.
        upstream: Box<Receipt>,
        /// Its digest.
        digest: Digest,
    },
    /// The input receipt comes from another stage than the one expected.
    #[error(
        "the input receipt is a {} receipt (printed by {}), and this stage takes a {} receipt",
        .found.as_str(),
        printed_by(*.found),
        .expected.as_str()
    )]
    #[diagnostic(
        code(cordon::stage::wrong_stage),
        help("give it the receipt {} printed (piped in, or its file)", printed_by(*.expected))
    )]
    WrongStage {
        /// Its stage.
        found: StageName,
        /// The stage this one consumes.
        expected: StageName,
    },
    /// The input receipt's chain could not be established in this store.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Chain(#[from] ChainError),
    /// The receipt could not be stored.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The receipt could not be signed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Signing(#[from] SigningError),
    /// stdout could not be written.
    #[error("cannot write the receipt to stdout")]
    #[diagnostic(code(cordon::stage::stdout))]
    Stdout {
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The command that prints a receipt of `stage`: what an operator runs to get one.
#[must_use]
pub const fn printed_by(stage: StageName) -> &'static str {
    match stage {
        StageName::Fetch => "cordon-fetch",
        StageName::Materialize => "cordon-materialize",
        StageName::Prebuild => "cordon-prebuild",
        StageName::Lane => "cordon-lane session",
        StageName::Qualify => "cordon-lane qualify",
        StageName::Reference | StageName::Audit | StageName::Verdict => "cordon-reference",
        StageName::Reap => "cordon-reap",
        StageName::Surface => "cordon-surface",
        StageName::Policy => "cordon-policy identity --json",
    }
}

/// Read an input receipt from `file`, or from `stdin` when none is given or it is `-`, and check that it is
/// an `ok` receipt of `expected_stage` made under `authority`. Returns it and its digest.
///
/// # Errors
/// Unreadable, not a receipt, another stage, not ok, or another authority.
pub fn read_input(
    file: Option<&Path>,
    stdin: &mut dyn Read,
    expected_stage: StageName,
    authority: &Digest,
) -> Result<(Receipt, Digest), StageError> {
    // `-` is stdin, as every pipeline tool spells it.
    let file = file.filter(|p| *p != Path::new("-"));
    let mut text = String::new();
    let from = file.map_or_else(|| "stdin".to_owned(), |p| p.display().to_string());
    let read = match file {
        Some(p) => std::fs::read_to_string(p).map(|t| text = t),
        None => stdin.read_to_string(&mut text).map(|_| ()),
    };
    read.map_err(|source| StageError::ReadReceipt { from, source })?;
    let receipt = Receipt::parse(text.trim_end())?;
    if receipt.stage != expected_stage {
        return Err(StageError::WrongStage {
            found: receipt.stage,
            expected: expected_stage,
        });
    }
    receipt.require_authority(authority)?;
    let digest = receipt.digest()?;
    if receipt.outcome != Outcome::Ok {
        return Err(StageError::NotOk {
            outcome: receipt.outcome,
            upstream: Box::new(receipt),
            digest,
        });
    }
    Ok((receipt, digest))
}

/// Before `tool` reads its input receipt from stdin (no `file`, or `-`) and stdin is a
/// terminal: one line saying what it waits for, so an operator who forgot the pipe is not left
/// before a silent cursor.
pub fn stdin_notice(tool: &str, file: Option<&Path>, stderr: &mut dyn Write) {
    use std::io::IsTerminal;
    if file.is_none_or(|p| p == Path::new("-")) && std::io::stdin().is_terminal() {
        cordon::voice::say(
            stderr,
            cordon::voice::Level::Normal,
            &format!(
                "{tool}: reading the input receipt from stdin, which is a terminal: pipe the previous stage's receipt in or give --receipt FILE (Ctrl-D ends the input)"
            ),
        );
    }
}

/// When `err` is an upstream verdict ([`StageError::NotOk`]: a rejected or no-decision receipt
/// of the expected stage, under this authority), pass it on, signed with the key in `key_dir`:
/// if `store` holds it and its chain
/// walks back to intake ([`chain::walk_verdict`]), store, sign and print this stage's pass-on
/// receipt ([`Receipt::pass_on`]) and return the upstream's exit code — so a pipeline under
/// `set -o pipefail` and its last receipt both tell the verdict, and the last receipt verifies.
/// A verdict the store does not hold is refused as any forged receipt is (its chain error's
/// exit code, 2 when absent). Any other error is `None` (the caller reports it).
pub fn pass_on(
    err: &StageError,
    stage: StageName,
    (store, key_dir): (&Store, &Path),
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Option<ExitCode> {
    let StageError::NotOk {
        upstream, digest, ..
    } = err
    else {
        return None;
    };
    // A hand-written `rejected` receipt names nothing the store established.
    if let Err(e) = chain::walk_verdict(store, digest, &upstream.authority) {
        report_diagnostic(&e, mode, stderr);
        return Some(e.exit_class());
    }
    let mut receipt = Receipt::pass_on(stage, upstream, *digest);
    let passed = match emit_signed(store, key_dir, &mut receipt, stdout) {
        Ok(passed) => passed,
        Err(e) => return Some(fail(&e, mode, stderr)),
    };
    if mode == Diagnostics::Text {
        cordon::voice::say(
            stderr,
            cordon::voice::Level::Normal,
            &format!(
                "cordon-{}: {} upstream ({} receipt {digest}); nothing done",
                stage.as_str(),
                upstream.outcome.as_str(),
                upstream.stage.as_str()
            ),
        );
        summary(&receipt, &passed, false, stderr);
    }
    // The receipt's own outcome: the upstream's, or a no-decision emitting made it.
    Some(match receipt.outcome {
        Outcome::Rejected => ExitCode::Rejected,
        Outcome::Ok | Outcome::NoDecision => ExitCode::NoDecision,
    })
}

/// What a stage binary does with its input receipt: read it ([`read_input`]) as the receipt of
/// `stage`'s predecessor; an upstream verdict is passed on ([`pass_on`], into `store`) and any
/// other error reported on stderr, and either way the exit code to end with is returned.
///
/// # Errors
/// The exit code, everything already printed.
#[allow(clippy::too_many_arguments)]
pub fn input_or_exit(
    file: Option<&Path>,
    stdin: &mut dyn Read,
    stage: StageName,
    authority: &Digest,
    store: &Store,
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(Receipt, Digest), ExitCode> {
    let Some(expected) = stage.predecessor() else {
        return Err(ExitCode::Usage);
    };
    stdin_notice(&format!("cordon-{}", stage.as_str()), file, stderr);
    read_input(file, stdin, expected, authority).map_err(|e| {
        let e = explain_foreign(e, store);
        // A verdict upstream is passed on, not reported as a wiring error.
        pass_on(&e, stage, (store, Path::new(KEY_DIR)), mode, stdout, stderr).unwrap_or_else(|| {
            report_diagnostic(&e, mode, stderr);
            e.exit_class()
        })
    })
}

/// Prove that the store holds the input receipt `digest` and that its chain walks back to
/// intake under `authority`, each hop from the stage its successor consumes.
///
/// # Errors
/// [`StageError::Chain`] naming the first hop that cannot be established.
pub fn require_chain(
    store: &Store,
    digest: &Digest,
    authority: &Digest,
) -> Result<Vec<Receipt>, StageError> {
    Ok(chain::walk(store, digest, authority)?)
}

impl ExitClass for StageError {
    /// An input that is not a usable receipt is a wiring error (2), except a chain the store
    /// cannot establish because the store itself is in doubt, or a receipt that cannot be
    /// stored or printed (3).
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Chain(e) => e.exit_class(),
            Self::Store(_) | Self::Signing(_) | Self::Stdout { .. } => ExitCode::NoDecision,
            // An input receipt, whichever way it is unusable (a float that does not encode
            // included): the operator's wiring.
            Self::ReadReceipt { .. }
            | Self::Receipt(_)
            | Self::NotOk { .. }
            | Self::WrongStage { .. } => ExitCode::Usage,
        }
    }
}

/// Finish a receipt (set `finished_at`), store it under `receipts/` with the host's signature
/// beside it (`receipts/<hex>.sig`, [`cordon::signing`]) — every verdict, `ok`,
/// `rejected` and `no-decision` alike, so a pipeline can pass any of them on and an incident
/// keeps its evidence (content stays unchanged by a rejection: only the receipt is written) —
/// and print it as one line of canonical JSON on `stdout`. Returns its digest.
///
/// # Errors
/// Encoding, signing, storing or printing failed.
pub fn emit(
    store: &Store,
    receipt: &mut Receipt,
    stdout: &mut dyn Write,
) -> Result<Digest, StageError> {
    emit_signed(store, Path::new(KEY_DIR), receipt, stdout)
}

/// This process's own authority, once its stage established it ([`own_authority`]): the
/// parts every receipt it stores names as evidence, and what a foreign authority is compared
/// with.
struct Own {
    authority: Digest,
    components: cordon::identity::AuthorityComponents,
    policy: serde_json::Value,
    /// The parts as receipts name them: evidence name and canonical text, encoded once.
    texts: Vec<(&'static str, String)>,
}

static OWN: std::sync::OnceLock<Own> = std::sync::OnceLock::new();

/// Record this process's authority and its parts (the stage prologue does, once), their
/// canonical texts encoded here rather than at every receipt.
pub fn own_authority(
    authority: Digest,
    components: cordon::identity::AuthorityComponents,
    policy: serde_json::Value,
) {
    let texts = [
        (AUTHORITY_PARTS[0], serde_json::to_value(&components).ok()),
        (AUTHORITY_PARTS[1], Some(policy.clone())),
    ]
    .into_iter()
    .filter_map(|(name, v)| Some((name, cordon::canonical::to_canonical_json(&v?).ok()?)))
    .collect();
    let _ = OWN.set(Own {
        authority,
        components,
        policy,
        texts,
    });
}

/// Name this process's authority parts as `receipt`'s evidence (`authority`: the components,
/// `policy`: the canonical policy), each stored once by its sha256, so whoever later meets the
/// receipt under another authority can be told which part differs. Nothing when the receipt is
/// another authority's (a pass-on keeps its own) or the process never established its own.
fn attach_parts(store: &Store, receipt: &mut Receipt) {
    let Some(own) = OWN.get().filter(|o| o.authority == receipt.authority) else {
        return;
    };
    for (name, text) in &own.texts {
        if receipt.evidence.iter().any(|e| e.name == *name) {
            continue;
        }
        let sha = Digest::of_bytes(text.as_bytes());
        // Stored once: every receipt of every run under this authority names the same bytes.
        // Best effort: the parts only explain a later refusal, and a verdict is never lost
        // for them (a part that cannot be stored is not named).
        if store.read_evidence(&sha).is_err() && store.put_evidence(text.as_bytes()).is_err() {
            continue;
        }
        receipt.evidence.push(cordon::receipt::Evidence {
            name: (*name).to_owned(),
            sha256: sha,
            bytes: text.len() as u64,
        });
    }
}

/// Fill in what differs for a foreign-authority refusal: the parts the receipt names, read from
/// `store`, against this process's own — each differing component, and for the policy each
/// value that changed (`cordon-policy diff`'s lines). Any other error is returned unchanged.
#[must_use]
pub fn explain_foreign(err: StageError, store: &Store) -> StageError {
    let StageError::Receipt(ReceiptError::ForeignAuthority {
        found,
        expected,
        mut parts,
    }) = err
    else {
        return err;
    };
    let read = |name: &str| -> Option<serde_json::Value> {
        let e = parts.evidence.iter().find(|e| e.name == name)?;
        serde_json::from_slice(&store.read_evidence(&e.sha256).ok()?).ok()
    };
    let explained = OWN.get().and_then(|own| {
        let theirs: cordon::identity::AuthorityComponents =
            serde_json::from_value(read(AUTHORITY_PARTS[0])?).ok()?;
        let mut lines = theirs.differs(&own.components);
        if theirs.policy != own.components.policy
            && let Some(policy) = read(AUTHORITY_PARTS[1])
        {
            lines.extend(
                cordon_policy_lang::diff::diff(&policy, &own.policy)
                    .into_iter()
                    .map(|c| format!("policy value {}", c.line)),
            );
        }
        // The parts are read from the store's evidence: whatever they say reaches a terminal
        // as one escaped line each (a runtime's version text spans lines).
        Some(
            lines
                .iter()
                .map(|l| cordon::text::printable(l).into_owned())
                .collect(),
        )
    });
    if let Some(lines) = explained {
        parts.differs = lines;
    }
    StageError::Receipt(ReceiptError::ForeignAuthority {
        found,
        expected,
        parts,
    })
}

/// When a stage fails before it has a store to keep its receipt in (it is not root, its store
/// cannot be opened): print a no-decision receipt under `authority` on `stdout` anyway, with
/// `code` and the failure's words as its reason and [`UNKEPT`] after it, so a pipeline's last
/// receipt still tells why nothing was decided. It is never stored or signed, so nothing can
/// rest on it. A receipt that cannot be printed leaves the diagnostic and the exit code to say
/// it.
pub fn print_unkept(
    stage: StageName,
    authority: Digest,
    (code, why): (&str, &str),
    stdout: &mut dyn Write,
) {
    let mut receipt = Receipt::new(stage, authority, Outcome::NoDecision);
    receipt.reasons = vec![
        Reason {
            code: code.to_owned(),
            message: why.to_owned(),
        },
        Reason {
            code: UNKEPT.to_owned(),
            message: "this receipt is printed, never stored or signed: the stage had no store to keep it in".to_owned(),
        },
    ];
    if let Ok(text) = receipt.to_canonical_json() {
        let _ = writeln!(stdout, "{text}");
    }
}

/// Open the store at `root` for `stage`, or fail as a stage fails before its receipt can be
/// kept: the error reported, an unkept no-decision receipt ([`print_unkept`], reason
/// `store.unusable`) printed, and the error's exit code returned.
///
/// # Errors
/// The exit code to end with.
pub fn open_store(
    root: &Path,
    (stage, authority): (StageName, Digest),
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<Store, ExitCode> {
    Store::open(root).map_err(|e| {
        print_unkept(stage, authority, (UNUSABLE, &error_chain(&e)), stdout);
        fail(&e, mode, stderr)
    })
}

/// The reason an unkept receipt of a stage whose store could not be opened carries first.
pub const UNUSABLE: &str = "store.unusable";

/// The reason a receipt printed from a read-only store carries.
pub const UNKEPT: &str = "receipt.unkept";

/// [`emit`], signed with the key kept in `key_dir` (the host's is [`KEY_DIR`]; the rootless
/// surface keeps its own in its state directory). On a read-only store the receipt is printed
/// unsigned with the reason [`UNKEPT`], never stored.
///
/// # Errors
/// Encoding, signing, storing or printing failed.
pub fn emit_signed(
    store: &Store,
    key_dir: &Path,
    receipt: &mut Receipt,
    stdout: &mut dyn Write,
) -> Result<Digest, StageError> {
    receipt.finished_at = cordon::receipt::now_rfc3339();
    if store.read_only() {
        // A read-only store serves a reader (a check, a tree's re-verification): its receipt
        // is printed, so the pipeline keeps the verdict, and says it was never kept. A stage
        // that writes its result into the store established nothing it could keep: whatever
        // it came to, its receipt is a no-decision.
        if !store.reader() {
            receipt.outcome = Outcome::NoDecision;
        }
        receipt.reasons.push(Reason {
            code: UNKEPT.to_owned(),
            message: format!(
                "the store {} is read-only: this receipt is printed, never stored or signed, and no chain can rest on it",
                store.root().display()
            ),
        });
        let text = receipt.to_canonical_json()?;
        writeln!(stdout, "{text}").map_err(|source| StageError::Stdout { source })?;
        return Ok(receipt.digest()?);
    }
    attach_parts(store, receipt);
    let (digest, text) = HostKey::load_or_create(key_dir)?.store_receipt(store, receipt)?;
    // An incident this run found names this receipt, the one that reports it. A link that
    // cannot be written leaves the incident standing without its receipt's name (the refusal
    // says so) and must not unprint a stored receipt.
    let _ = cordon::lease::incident::link_pending(store, &digest);
    writeln!(stdout, "{text}").map_err(|source| StageError::Stdout { source })?;
    Ok(digest)
}

/// What a stage could not establish its result through: a diagnostic that also names the
/// stable reason code its no-decision receipt carries.
pub trait Infrastructure: miette::Diagnostic {
    /// The reason code (`<stage>.infrastructure`, `transport.failed`, …).
    fn reason_code(&self) -> &'static str;
}

/// The one wrapper from a stage's result to its receipt and exit code: an accepted value is an
/// `ok` receipt with the stage's outputs (exit 0), a rejection a `rejected` receipt with its
/// findings and evidence (exit 1), an error a `no-decision` receipt whose reason is the error's
/// chain under its reason code (exit 3, the error also reported on stderr). The receipt is then
/// emitted (and stored, whatever its outcome); a failure to emit is a no-decision. Nothing
/// reaches stderr before the receipt is safe: a report that fails cannot unrecord a verdict.
/// After a receipt that is not `ok`, the escaped tail of the output it names follows
/// ([`crate::evidence::tail`]). The caller sets the receipt's `evidence` before.
pub fn finish<T: serde::Serialize, E: Infrastructure + 'static>(
    store: &Store,
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    finish_signed(
        store,
        Path::new(KEY_DIR),
        receipt,
        result,
        (mode, stdout, stderr),
    )
}

/// The most reasons [`summary`] lists; the receipt keeps every one.
const SAID_REASONS: usize = 20;

/// The stage's last words on stderr, after its receipt is safe (text diagnostics, unless `-q`):
/// when `reasons`, each of the receipt's reasons on a line of its own (a rejection's origin, a
/// check's residue, nothing else having said them), then one line with the stage, its outcome
/// (coloured on a terminal) and first reason code, the receipt's digest — what `cordon-verify`
/// and the next stage take — and how long the process ran. Never wrapped, so the digest can be
/// copied whole.
pub fn summary(receipt: &Receipt, digest: &Digest, reasons: bool, stderr: &mut dyn Write) {
    use cordon::voice::{self, Colour, Level, Style};
    if !voice::says(Level::Normal) {
        return;
    }
    let style = Style::stderr();
    let tool = format!("cordon-{}", receipt.stage.as_str());
    if reasons {
        // Candidate text may be in a reason's message (a finding's line, an engine's words).
        for r in receipt.reasons.iter().take(SAID_REASONS) {
            voice::say(
                stderr,
                Level::Normal,
                &format!("{tool}: {}: {}", r.code, r.message),
            );
        }
        if let Some(more) = receipt
            .reasons
            .len()
            .checked_sub(SAID_REASONS)
            .filter(|n| *n > 0)
        {
            voice::say(
                stderr,
                Level::Normal,
                &format!("{tool}: and {more} more reasons (the receipt has every one)"),
            );
        }
    }
    let colour = match receipt.outcome {
        Outcome::Ok => Colour::Green,
        Outcome::Rejected => Colour::Red,
        Outcome::NoDecision => Colour::Yellow,
    };
    // Reason codes are cordon's own; escaped all the same, before any colour is added.
    let why = receipt.reasons.first().map_or_else(String::new, |r| {
        format!(" ({})", cordon::text::printable(&r.code))
    });
    let _ = writeln!(
        stderr,
        "{tool}: {}{why}{dot}receipt {digest}{dot}{}",
        style.paint(colour, receipt.outcome.as_str()),
        voice::duration(voice::elapsed()),
        dot = style.dot(),
    );
}

/// [`finish`], the receipt signed with the key in `key_dir` ([`emit_signed`]).
pub fn finish_signed<T: serde::Serialize, E: Infrastructure + 'static>(
    store: &Store,
    key_dir: &Path,
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
    (mode, stdout, stderr): (Diagnostics, &mut dyn Write, &mut dyn Write),
) -> ExitCode {
    finish_inner(
        store,
        key_dir,
        receipt,
        result,
        (mode, stdout, stderr),
        true,
    )
    .0
}

/// [`finish`], with `shown` writing the stage's own report of a rejection (its findings on the
/// candidate's source) once the receipt is safe, before the [`summary`] line, which then does
/// not list the reasons again.
pub fn finish_showing<T: serde::Serialize, E: Infrastructure + 'static>(
    store: &Store,
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
    (mode, stdout, stderr): (Diagnostics, &mut dyn Write, &mut dyn Write),
    shown: &mut dyn FnMut(&mut dyn Write),
) -> ExitCode {
    let (code, emitted) = finish_inner(
        store,
        Path::new(KEY_DIR),
        receipt,
        result,
        (mode, stdout, stderr),
        false,
    );
    shown(stderr);
    // Only a receipt that was emitted is summed up: a failure to keep it was reported.
    if mode == Diagnostics::Text
        && let Some(digest) = emitted
    {
        summary(receipt, &digest, false, stderr);
    }
    code
}

/// [`finish_signed`], with its [`summary`] when `summarise` (not for a receipt another one
/// links, nor before a stage's own report of its rejection); the exit code and the emitted
/// receipt's digest (`None`: it could not be emitted, and that was reported).
fn finish_inner<T: serde::Serialize, E: Infrastructure + 'static>(
    store: &Store,
    key_dir: &Path,
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
    (mode, stdout, stderr): (Diagnostics, &mut dyn Write, &mut dyn Write),
    summarise: bool,
) -> (ExitCode, Option<Digest>) {
    let (code, cause) = decide(receipt, result);
    match emit_signed(store, key_dir, receipt, stdout) {
        Ok(digest) => {
            // Emitting may have made it a no-decision (a writer on a read-only store).
            let code = if receipt.outcome == Outcome::NoDecision {
                ExitCode::NoDecision
            } else {
                code
            };
            if let Some(e) = &cause {
                report_diagnostic(e.as_ref(), mode, stderr);
            }
            // The run's own last words, escaped, after everything cordon says (text only: JSON
            // diagnostics stay one document per error).
            if mode == Diagnostics::Text {
                crate::evidence::tail(store, receipt, receipt.stage.as_str(), stderr);
                if summarise {
                    // A rejection's reasons are said here (its origin: a hash mismatch, a
                    // violation); an error's were reported above.
                    let reasons = cause.is_none() && receipt.outcome == Outcome::Rejected;
                    summary(receipt, &digest, reasons, stderr);
                }
            }
            (code, Some(digest))
        }
        Err(e) => {
            if let Some(cause) = cause {
                report_diagnostic(cause.as_ref(), mode, stderr);
            }
            report_diagnostic(&e, mode, stderr);
            (ExitCode::NoDecision, None)
        }
    }
}

/// [`finish_signed`] for a receipt another one links (a qualification's sessions, the
/// referee's quiescence and reference receipts): stored and signed, never printed, and linked
/// only once the store holds it. Its digest.
///
/// # Errors
/// It cannot be encoded, or the store does not hold it (why, for the linking receipt's reason).
pub fn store_linked<T: serde::Serialize, E: Infrastructure + 'static>(
    store: &Store,
    key_dir: &Path,
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
    (mode, stderr): (Diagnostics, &mut dyn Write),
) -> Result<Digest, String> {
    finish_inner(
        store,
        key_dir,
        receipt,
        result,
        (mode, &mut std::io::sink(), stderr),
        false,
    );
    let digest = receipt.digest().map_err(|e| e.to_string())?;
    chain::load(store, &digest).map_err(|e| format!("it is not stored: {e}"))?;
    Ok(digest)
}

/// Record `result` on `receipt`: its exit code, and the error behind a no-decision, to be
/// reported once the receipt is safe. A stage a signal reached ([`cordon::interrupt`]) records
/// a no-decision naming the signal, whatever its result: a candidate stopped by the host did
/// not pass or fail (its own result follows, as information, without its outputs).
fn decide<T: serde::Serialize, E: Infrastructure + 'static>(
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
) -> (ExitCode, Option<Box<dyn miette::Diagnostic>>) {
    let decided = decide_result(receipt, result);
    match stamp_interrupted(receipt) {
        Some(interrupted) => {
            receipt.outputs = serde_json::Value::Object(serde_json::Map::new());
            (ExitCode::NoDecision, Some(Box::new(interrupted)))
        }
        None => decided,
    }
}

/// If a signal reached this stage ([`cordon::interrupt`]), make `receipt` a no-decision naming
/// it: the signal's reason first, the stage's own reasons after it. The signal, if one arrived.
pub fn stamp_interrupted(receipt: &mut Receipt) -> Option<cordon::interrupt::Interrupted> {
    let interrupted = cordon::interrupt::check().err()?;
    receipt.outcome = Outcome::NoDecision;
    receipt.reasons.insert(
        0,
        Reason {
            code: "receipt.interrupted".to_owned(),
            message: interrupted.to_string(),
        },
    );
    Some(interrupted)
}

/// [`decide`] for a stage no signal reached.
fn decide_result<T: serde::Serialize, E: Infrastructure + 'static>(
    receipt: &mut Receipt,
    result: Result<Decision<T>, E>,
) -> (ExitCode, Option<Box<dyn miette::Diagnostic>>) {
    let (code, e): (&str, Box<dyn miette::Diagnostic>) = match result {
        Ok(Decision::Accepted(outputs)) => match serde_json::to_value(&outputs) {
            Ok(v) => {
                receipt.outputs = v;
                return (ExitCode::Ok, None);
            }
            Err(source) => (
                "receipt.outputs",
                Box::new(ReceiptError::Record {
                    stage: receipt.stage,
                    source,
                }),
            ),
        },
        Ok(Decision::Rejected(r)) => {
            receipt.outcome = Outcome::Rejected;
            receipt.reasons.extend(r.findings);
            receipt.outputs = r.evidence;
            return (ExitCode::Rejected, None);
        }
        Err(e) => (e.reason_code(), Box::new(e)),
    };
    receipt.outcome = Outcome::NoDecision;
    receipt.reasons.push(Reason {
        code: code.to_owned(),
        message: error_chain(e.as_ref()),
    });
    (ExitCode::NoDecision, Some(e))
}

pub use cordon_canon::error_chain;

#[cfg(test)]
mod tests {
    use cordon::receipt::{FetchOutputs, Rejection};

    use super::*;

    #[derive(Debug, thiserror::Error, miette::Diagnostic)]
    #[error("the disk is on fire")]
    struct Broken;

    impl Infrastructure for Broken {
        fn reason_code(&self) -> &'static str {
            "fetch.infrastructure"
        }
    }

    fn outputs() -> FetchOutputs {
        FetchOutputs {
            archive_sha256: Digest::of_bytes(b"a"),
            content_digest: Digest::of_bytes(b"c"),
            files: 1,
            bytes: 2,
        }
    }

    fn finish_with(result: Result<Decision<FetchOutputs>, Broken>) -> (ExitCode, Receipt, usize) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let keys = dir.path().join("keys");
        let mut r = Receipt::new(StageName::Fetch, Digest::of_bytes(b"x"), Outcome::Ok);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = finish_signed(
            &store,
            &keys,
            &mut r,
            result,
            (Diagnostics::Text, &mut out, &mut err),
        );
        let printed = Receipt::parse(String::from_utf8(out).unwrap().trim_end()).unwrap();
        assert_eq!(printed, r);
        let names: Vec<String> = std::fs::read_dir(store.root().join("receipts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let stored = names.iter().filter(|n| n.ends_with(".json")).count();
        // Every stored receipt is signed with the host's key, the signature beside it.
        let digest = printed.digest().unwrap();
        let sig = cordon::signing::stored(&store, &digest).unwrap();
        let key = HostKey::load(&keys).unwrap().public();
        cordon::signing::verify(&key, &digest, &sig).unwrap();
        assert_eq!(names.len(), 2 * stored, "{names:?}");
        (code, printed, stored)
    }

    #[test]
    fn accepted_rejected_and_errors_each_have_one_receipt_shape() {
        let (code, r, stored) = finish_with(Ok(Decision::Accepted(outputs())));
        assert_eq!((code, r.outcome, stored), (ExitCode::Ok, Outcome::Ok, 1));
        assert_eq!(r.outputs_as::<FetchOutputs>().unwrap(), outputs());

        let rejection = Rejection::one("intake.symlink", "a link".into(), serde_json::json!({}));
        let (code, r, stored) = finish_with(Ok(Decision::Rejected(rejection)));
        assert_eq!(
            (code, r.outcome, stored),
            (ExitCode::Rejected, Outcome::Rejected, 1),
            "every verdict is stored"
        );
        assert_eq!(r.reasons[0].code, "intake.symlink");

        let (code, r, stored) = finish_with(Err(Broken));
        assert_eq!(
            (code, r.outcome, stored),
            (ExitCode::NoDecision, Outcome::NoDecision, 1),
            "every verdict is stored"
        );
        assert_eq!(r.reasons[0].code, "fetch.infrastructure");
        assert_eq!(r.reasons[0].message, "the disk is on fire");
    }

    #[test]
    fn after_a_signal_every_result_is_a_stored_no_decision_naming_it() {
        // This test's process (nextest gives it one of its own) receives SIGTERM.
        cordon::interrupt::install().unwrap();
        nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        while cordon::interrupt::raised().is_none() {
            std::thread::yield_now();
        }
        let rejection = Rejection::one("intake.symlink", "a link".into(), serde_json::json!({}));
        for (result, then) in [
            (Ok(Decision::Accepted(outputs())), None),
            (Ok(Decision::Rejected(rejection)), Some("intake.symlink")),
            (Err(Broken), Some("fetch.infrastructure")),
        ] {
            let (code, r, stored) = finish_with(result);
            assert_eq!(
                (code, r.outcome, stored),
                (ExitCode::NoDecision, Outcome::NoDecision, 1)
            );
            assert_eq!(r.reasons[0].code, "receipt.interrupted");
            assert!(
                r.reasons[0].message.starts_with("SIGTERM received"),
                "{r:?}"
            );
            assert_eq!(r.reasons.get(1).map(|x| x.code.as_str()), then, "{r:?}");
            assert_eq!(
                r.outputs,
                serde_json::json!({}),
                "no outputs of a stopped run"
            );
        }
    }

    #[test]
    fn an_input_of_another_stage_authority_or_outcome_is_refused_and_a_stored_verdict_passed_on() {
        let a = Digest::of_bytes(b"a");
        let mut stdin: &[u8] = b"";
        let read = |r: &Receipt, stage: StageName, authority: &Digest| {
            let text = r.to_canonical_json().unwrap();
            read_input(None, &mut text.as_bytes(), stage, authority)
        };
        let fetch = Receipt::new(StageName::Fetch, a, Outcome::Ok);
        read(&fetch, StageName::Fetch, &a).unwrap();
        // `--receipt -` reads stdin, never a file named `-`.
        let text = fetch.to_canonical_json().unwrap();
        read_input(
            Some(Path::new("-")),
            &mut text.as_bytes(),
            StageName::Fetch,
            &a,
        )
        .unwrap();
        // Another stage's receipt names the command that prints the right one.
        let wrong = read(&fetch, StageName::Materialize, &a).unwrap_err();
        assert!(matches!(wrong, StageError::WrongStage { .. }));
        assert_eq!(
            wrong.to_string(),
            "the input receipt is a fetch receipt (printed by cordon-fetch), and this stage takes a materialize receipt"
        );
        let help = miette::Diagnostic::help(&wrong).unwrap().to_string();
        assert!(help.contains("cordon-materialize printed"), "{help}");
        assert!(matches!(
            read(&fetch, StageName::Fetch, &Digest::of_bytes(b"b")),
            Err(StageError::Receipt(ReceiptError::ForeignAuthority { .. }))
        ));
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let keys = dir.path().join("keys");
        let key = HostKey::load_or_create(&keys).unwrap();
        let rejected = Receipt::new(StageName::Fetch, a, Outcome::Rejected);
        let err = read(&rejected, StageName::Fetch, &a).unwrap_err();
        assert!(matches!(err, StageError::NotOk { .. }));
        // Not in the store: refused as any forged receipt is, and nothing printed.
        let (mut out, mut diag) = (Vec::new(), Vec::new());
        let pass = |err: &StageError, out: &mut Vec<u8>, diag: &mut Vec<u8>| {
            pass_on(
                err,
                StageName::Materialize,
                (&store, &keys),
                Diagnostics::Text,
                out,
                diag,
            )
        };
        assert_eq!(pass(&err, &mut out, &mut diag), Some(ExitCode::Usage));
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
        // Stored: passed on with the same outcome and exit code, the upstream receipt as prev,
        // itself stored and signed.
        key.store_receipt(&store, &rejected).unwrap();
        let mut diag = Vec::new();
        assert_eq!(pass(&err, &mut out, &mut diag), Some(ExitCode::Rejected));
        let passed = Receipt::parse(String::from_utf8(out).unwrap().trim_end()).unwrap();
        assert_eq!(
            (passed.stage, passed.outcome, passed.prev),
            (
                StageName::Materialize,
                Outcome::Rejected,
                Some(rejected.digest().unwrap())
            )
        );
        assert!(passed.passes_on());
        let digest = passed.digest().unwrap();
        assert_eq!(chain::load(&store, &digest).unwrap(), passed);
        let sig = cordon::signing::stored(&store, &digest).unwrap();
        cordon::signing::verify(&key.public(), &digest, &sig).unwrap();
        assert!(
            String::from_utf8(diag)
                .unwrap()
                .contains("rejected upstream")
        );
        let stopped = Receipt::new(StageName::Fetch, a, Outcome::NoDecision);
        key.store_receipt(&store, &stopped).unwrap();
        let err = read(&stopped, StageName::Fetch, &a).unwrap_err();
        assert_eq!(
            pass(&err, &mut Vec::new(), &mut Vec::new()),
            Some(ExitCode::NoDecision)
        );
        let wrong = read(&fetch, StageName::Materialize, &a).unwrap_err();
        assert_eq!(
            pass_on(
                &wrong,
                StageName::Prebuild,
                (&store, &keys),
                Diagnostics::Text,
                &mut Vec::new(),
                &mut Vec::new()
            ),
            None
        );
        assert!(matches!(
            read_input(None, &mut stdin, StageName::Fetch, &a),
            Err(StageError::Receipt(ReceiptError::Parse { .. }))
        ));
    }
}
