//! The `cordon-verify` command.
//!
//! - `cordon-verify --store S [--key ed25519:HEX] [--explain] RECEIPT` verifies the chain under
//!   RECEIPT (a `sha256:…` digest, or a receipt file whose digest is taken) with the trusted
//!   public key: `--key`, or the host's own when it can read it. Prints one line per receipt
//!   (with `--explain`, a timeline a reviewer reads after an incident) and exits 0; a chain that
//!   does not verify is reported on stderr, exit 1.
//! - `cordon-verify --store S [--key …] --export DIR RECEIPT` verifies it, then writes a
//!   self-contained store at DIR (which must not exist) holding the chain's receipts,
//!   signatures, trees and publications, for an auditor's `cordon-verify --store DIR --key …`.
//! - `cordon-verify --public-key` prints the host's public key (`ed25519:<hex>`), making the
//!   key on first use: what a host publishes for auditors.
//! - Key rotation ([`cordon::keyset`], seed 001's checklist step 6): `--key-set` prints the
//!   host's key set (every key it signed with, with its validity window: what a host publishes
//!   once it has rotated); `--rotate-key` retires the current key now and makes a fresh one;
//!   `--compromised KEY --at TIME` declares a retired key compromised from TIME. An auditor
//!   verifies with `--keys FILE` (a published set) instead of `--key`; without either, the
//!   host's own set is used. A receipt verifies under a set only when signed inside its key's
//!   window and before its compromise; one accepted under a key later declared compromised is
//!   said on stderr.
//!
//! A usage error is exit 2 (a `--key`, `--keys` file or `--at` that is not one included); a
//! store that cannot be opened or the host's key or key set that cannot be read, exit 3.

use cordon_evidence::verdict::{ReferenceOutputs, VerdictOutputs};
use std::borrow::Cow;
use std::io::Write;

use cordon_stage::args::{Diagnostics, report_diagnostic};
use std::path::{Path, PathBuf};

use clap::Parser;
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::error_chain;
use cordon::exit::ExitClass;
use cordon::keyset::{self, KeySet};
use cordon::receipt::{
    FetchOutputs, IncumbentOutputs, LaneOutputs, MaterializeOutputs, PrebuildOutputs, Receipt,
    StageName,
};
use cordon::signing::{HostKey, KEY_DIR};
use cordon::store::Store;
use cordon_evidence::qualify::QualifyOutputs;

use crate::{Hop, export, verify};

/// Replay a receipt chain offline.
#[derive(Debug, Parser)]
#[command(name = "cordon-verify", version, about)]
pub struct Args {
    /// The store (or an exported copy of one).
    #[arg(long, required_unless_present_any = ["public_key", "key_set", "rotate_key", "compromised"])]
    pub store: Option<PathBuf>,
    /// The trusted public key, `ed25519:<hex>` (default: this host's own key set).
    #[arg(long, conflicts_with = "keys")]
    pub key: Option<String>,
    /// The trusted key set: a file holding a host's published `--key-set`.
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text)]
    pub diagnostics: Diagnostics,
    /// Print the chain as a timeline.
    #[arg(long)]
    pub explain: bool,
    /// Write the verified chain as a self-contained store here.
    #[arg(long, value_name = "DIR")]
    pub export: Option<PathBuf>,
    /// Print this host's public key and exit.
    #[arg(long, conflicts_with_all = ["store", "key", "keys", "explain", "export", "receipt"])]
    pub public_key: bool,
    /// Print this host's key set and exit.
    #[arg(long, conflicts_with_all = ["store", "key", "keys", "explain", "export", "receipt", "public_key"])]
    pub key_set: bool,
    /// Retire this host's key now, make a fresh one current, and print the new key set.
    #[arg(long, conflicts_with_all = ["store", "key", "keys", "explain", "export", "receipt", "public_key", "key_set"])]
    pub rotate_key: bool,
    /// Declare this host's retired key KEY compromised (from `--at`), and print the key set.
    #[arg(long, value_name = "KEY", requires = "at", conflicts_with_all = ["store", "key", "keys", "explain", "export", "receipt", "public_key", "key_set", "rotate_key"])]
    pub compromised: Option<String>,
    /// When the key was compromised (RFC 3339, e.g. 2026-12-01T00:00:00Z): no signature it
    /// made from then on verifies.
    #[arg(long, value_name = "TIME", requires = "compromised")]
    pub at: Option<String>,
    /// The head receipt: `sha256:…`, or a receipt file.
    #[arg(required_unless_present_any = ["public_key", "key_set", "rotate_key", "compromised"])]
    pub receipt: Option<String>,
}

/// Report an error on stderr: one line, or (`--diagnostics json`) one JSON document, as every
/// stage reports its errors.
fn report(stderr: &mut dyn Write, mode: Diagnostics, e: &dyn std::error::Error) {
    say(stderr, mode, &error_chain(e));
}

/// [`report`] for a message of cordon-verify's own.
fn say(stderr: &mut dyn Write, mode: Diagnostics, message: &str) {
    match mode {
        // A receipt's text may be a candidate's: escaped before the terminal.
        Diagnostics::Text => {
            let _ = writeln!(
                stderr,
                "cordon-verify: {}",
                cordon::text::printable(message)
            );
        }
        Diagnostics::Json => report_diagnostic(
            &miette::MietteDiagnostic::new(message.to_owned()).with_code("cordon::verify"),
            mode,
            stderr,
        ),
    }
}

/// The head's digest: a `sha256:` digest (or its 64 hex digits) as given, or the digest of a
/// receipt file (`-`: stdin). Each mistake says what to give instead.
fn head_of(given: &str) -> Result<Digest, String> {
    if let Ok(d) = given.parse::<Digest>() {
        return Ok(d);
    }
    if let Ok(d) = format!("sha256:{given}").parse::<Digest>() {
        return Ok(d);
    }
    let digest_like = given.starts_with("sha256:")
        || (!given.is_empty() && given.bytes().all(|b| b.is_ascii_hexdigit()));
    if digest_like && !Path::new(given).exists() {
        return Err(format!(
            "{given} is not a receipt digest: give sha256: and 64 lowercase hex digits, or the path of a receipt file (- for stdin)"
        ));
    }
    let text = if given == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| format!("stdin: {e}"))?;
        text
    } else {
        std::fs::read_to_string(given).map_err(|e| {
            format!(
                "{given}: {e}: give a receipt file a stage printed, a sha256: digest, or - for stdin"
            )
        })?
    };
    // A stage prints its receipt's canonical text and one newline; any other bytes (an edited
    // file whose parse still hashes to the original, a key given twice) are not that receipt.
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let receipt = Receipt::parse(text).map_err(|e| format!("{given}: {e}"))?;
    if receipt
        .to_canonical_json()
        .map_err(|e| format!("{given}: {e}"))?
        != text
    {
        return Err(format!(
            "{given}: not a receipt's canonical text (edited bytes are not the receipt they parse to)"
        ));
    }
    receipt.digest().map_err(|e| format!("{given}: {e}"))
}

/// The hops in causal order: each after every receipt it rests on (what it consumed, what it
/// links), so a qualification reads after its sessions and a verdict after its references,
/// whatever the clocks say; among receipts that rest on nothing unlisted, the one that finished
/// first comes first.
fn causal(hops: &[Hop]) -> Vec<&Hop> {
    let mut placed: std::collections::BTreeSet<Digest> = std::collections::BTreeSet::new();
    let mut left: Vec<&Hop> = hops.iter().collect();
    left.sort_by(|a, b| a.receipt.finished_at.cmp(&b.receipt.finished_at));
    let mut out = Vec::with_capacity(left.len());
    while !left.is_empty() {
        // A verified chain has no cycle (a receipt's digest covers what it names); should one
        // appear, the rest follow in finishing order rather than looping.
        let next = left
            .iter()
            .position(|h| h.rests_on.iter().all(|d| placed.contains(d)))
            .unwrap_or(0);
        let h = left.remove(next);
        placed.insert(h.digest);
        out.push(h);
    }
    out
}

/// How long a receipt's stage ran, from its two timestamps (`1.3 s`), or `?` when they do not
/// read as times.
fn took(r: &Receipt) -> String {
    let at = |t: &str| humantime::parse_rfc3339(t).ok();
    match (at(&r.started_at), at(&r.finished_at)) {
        (Some(a), Some(b)) => b
            .duration_since(a)
            .map_or_else(|_| "?".to_owned(), cordon::voice::duration),
        _ => "?".to_owned(),
    }
}

/// One line per receipt in causal order ([`causal`]): when it started, how long it ran, stage,
/// outcome, digest, and what it established.
fn timeline(hops: &[Hop]) -> Vec<String> {
    causal(hops)
        .iter()
        .map(|h| {
            let r = &h.receipt;
            let facts = facts(r);
            format!(
                "{} ({:>10})  {:<11} {:<11} {}{}",
                r.started_at,
                took(r),
                r.stage.as_str(),
                r.outcome.as_str(),
                h.digest,
                if facts.is_empty() {
                    String::new()
                } else {
                    format!("\n    {facts}")
                }
            )
        })
        .collect()
}

/// The key facts a reviewer looks for, per stage, read from its typed outputs.
fn facts(r: &Receipt) -> String {
    let reasons = r
        .reasons
        .iter()
        .map(|x| format!("{}: {}", x.code, x.message))
        .collect::<Vec<_>>()
        .join("; ");
    let own = match r.stage {
        StageName::Qualify => r.outputs_as::<QualifyOutputs>().ok().map(|o| {
            let s = &o.speed;
            format!(
                "verdict={:?} code={:?} speedup_bp={} noise_bp={} required_bp={} settling={}",
                s.verdict, s.code, s.speedup_bp, s.noise_bp, s.required_bp, o.settling
            )
        }),
        StageName::Lane => r.outputs_as::<LaneOutputs>().ok().map(|o| {
            format!(
                "role={:?} tree={} publication={} timed_rate_milli={}",
                o.role, o.tree, o.publication, o.timed_rate_milli
            )
        }),
        StageName::Fetch => r
            .outputs_as::<FetchOutputs>()
            .ok()
            .map(|o| format!("content_digest={}", o.content_digest)),
        StageName::Materialize => r
            .outputs_as::<MaterializeOutputs>()
            .ok()
            .map(|o| (o.tree_digest, o.incumbent.to_string(), o.step))
            .or_else(|| {
                r.outputs_as::<IncumbentOutputs>()
                    .ok()
                    .map(|o| (o.tree_digest, o.incumbent, o.step))
            })
            .map(|(tree, incumbent, step)| {
                // The step is named by the delta's manifest: a candidate's text, escaped.
                let step = step.as_deref().map_or(Cow::Borrowed("none"), cordon::text::printable);
                format!("tree_digest={tree} incumbent={incumbent} step={step}")
            }),
        StageName::Prebuild => r
            .outputs_as::<PrebuildOutputs>()
            .ok()
            .map(|o| format!("publication={}", o.publication)),
        StageName::Verdict => r.outputs_as::<VerdictOutputs>().ok().map(|o| {
            let (g, speed) = (&o.graded, &o.speed);
            let audit = match o.audit.as_ref().map(|a| &a.outcome) {
                None => "none".to_owned(),
                Some(cordon_evidence::audit::AuditOutcome::Served { graded, .. }) => {
                    format!("{}/{}", graded.exact, graded.requests)
                }
                Some(cordon_evidence::audit::AuditOutcome::Rejected { code, .. }) => code.clone(),
            };
            format!(
                "verdict={:?} code={:?} speed={:?} c_exact={}/{} b_exact={}/{} b2_exact={}/{} audit={audit}",
                o.verdict,
                o.code,
                speed.code,
                g.c.exact,
                g.c.requests,
                g.b.exact,
                g.b.requests,
                g.b2.exact,
                g.b2.requests,
            )
        }),
        StageName::Audit => r
            .outputs_as::<cordon_evidence::audit::AuditOutputs>()
            .ok()
            .map(|o| format!("tree={} sample={:?} outputs={}", o.tree, o.sample, o.outputs)),
        StageName::Reference => r.outputs_as::<ReferenceOutputs>().ok().map(|o| {
            format!(
                "tree={} publication={} requests={} outputs={}",
                o.tree, o.publication, o.requests, o.outputs
            )
        }),
        StageName::Reap => r
            .outputs_as::<cordon_evidence::residue::ReapOutputs>()
            .ok()
            .map(|o| {
                let gone: Vec<&str> = o.gone.iter().map(|g| g.read.as_str()).collect();
                format!("quiescent={} gone={gone:?}", o.quiescent)
            }),
        StageName::Policy | StageName::Surface => None,
    };
    [own.unwrap_or_default(), reasons]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n    ")
}

/// The trusted key set: `--key` alone, `--keys FILE`, or this host's own set.
fn trusted(args: &Args) -> Result<KeySet, (Box<dyn std::error::Error>, ExitCode)> {
    match (&args.key, &args.keys) {
        (Some(k), _) => {
            cordon::signing::public_key(k).map_err(|e| (e.into(), ExitCode::Usage))?;
            Ok(KeySet::single(k))
        }
        (None, Some(file)) => std::fs::read_to_string(file)
            .map_err(|e| format!("{}: {e}", file.display()).into())
            .and_then(|t| KeySet::parse(&t).map_err(Into::into))
            .map_err(|e| (e, ExitCode::Usage)),
        (None, None) => {
            keyset::host_set(Path::new(KEY_DIR)).map_err(|e| (e.into(), ExitCode::NoDecision))
        }
    }
}

/// `--key-set`, `--rotate-key`, `--compromised`: the host's key operations, each printing the
/// key set as it now is (canonical JSON, what the host publishes). `None`: not one of them.
fn host_keys(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> Option<ExitCode> {
    let dir = Path::new(KEY_DIR);
    let set = if args.key_set {
        keyset::host_set(dir)
    } else if args.rotate_key {
        keyset::rotate(dir)
    } else if let (Some(key), Some(at)) = (&args.compromised, &args.at) {
        // The operator's wiring, told apart from a key directory that cannot be used (3).
        if let Err(e) = keyset::time("--at", at).and_then(|_| cordon::signing::public_key(key)) {
            report(stderr, args.diagnostics, &e);
            return Some(ExitCode::Usage);
        }
        keyset::declare_compromised(dir, key, at)
    } else {
        return None;
    };
    Some(
        match set.and_then(|s| {
            cordon::canonical::to_canonical_json(&s)
                .map_err(|e| cordon::signing::SigningError::KeySet { why: e.to_string() })
        }) {
            Ok(text) => {
                let _ = writeln!(stdout, "{text}");
                ExitCode::Ok
            }
            Err(e) => {
                report(stderr, args.diagnostics, &e);
                e.exit_class()
            }
        },
    )
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    if args.public_key {
        return match HostKey::load_or_create(Path::new(KEY_DIR)) {
            Ok(k) => {
                let _ = writeln!(stdout, "{}", k.public());
                ExitCode::Ok
            }
            Err(e) => {
                report(stderr, args.diagnostics, &e);
                ExitCode::NoDecision
            }
        };
    }
    if let Some(code) = host_keys(args, stdout, stderr) {
        return code;
    }
    let (Some(store_dir), Some(given)) = (&args.store, &args.receipt) else {
        return ExitCode::Usage;
    };
    let head = match head_of(given) {
        Ok(d) => d,
        Err(why) => {
            say(stderr, args.diagnostics, &why);
            return ExitCode::Usage;
        }
    };
    let keys = match trusted(args) {
        Ok(k) => k,
        Err((e, code)) => {
            report(stderr, args.diagnostics, &*e);
            let _ = writeln!(
                stderr,
                "cordon-verify: give the host's published key with --key ed25519:… or its key set with --keys FILE"
            );
            return code;
        }
    };
    // A verifier never makes or changes a store: the one it is given must already be one.
    let store = match Store::open_existing(store_dir) {
        Ok(s) => s,
        Err(e) => {
            report(stderr, args.diagnostics, &e);
            return cordon::exit::ExitClass::exit_class(&e);
        }
    };
    // A head the store does not hold is the operator's digest or store, not failed evidence.
    if !store
        .path(cordon::store::RECEIPTS, &format!("{}.json", head.hex()))
        .exists()
    {
        say(
            stderr,
            args.diagnostics,
            &format!(
                "the store {} holds no receipt {head}: check --store and the digest (each stage prints its receipt's digest on stderr; the store's receipts are {}/receipts/<hex>.json)",
                store.root().display(),
                store.root().display()
            ),
        );
        return ExitCode::Usage;
    }
    let result = match &args.export {
        None => verify(&store, &head, &keys),
        Some(dir) => {
            if dir.exists() {
                say(
                    stderr,
                    args.diagnostics,
                    &format!(
                        "{} exists: --export writes a new store; name a path that does not exist yet",
                        dir.display()
                    ),
                );
                return ExitCode::Usage;
            }
            match Store::open(dir) {
                Ok(dest) => export(&store, &head, &keys, &dest),
                Err(e) => {
                    report(stderr, args.diagnostics, &e);
                    return ExitCode::NoDecision;
                }
            }
        }
    };
    match result {
        Ok(hops) => {
            if args.explain {
                for line in timeline(&hops) {
                    let _ = writeln!(stdout, "{line}");
                }
            } else {
                for h in &hops {
                    let _ = writeln!(
                        stdout,
                        "{} {} {}",
                        h.digest,
                        h.receipt.stage.as_str(),
                        h.receipt.outcome.as_str()
                    );
                }
            }
            // Accepted only as signed before the compromise: the time is the signer's own.
            for h in hops.iter().filter(|h| h.signed_by.compromised_at.is_some()) {
                let _ = writeln!(
                    stderr,
                    "cordon-verify: warning: receipt {} is signed by {}, declared compromised from {}; it verifies as signed at {}, a time its signer states: trust it only if its digest was known before the compromise",
                    h.digest,
                    h.signed_by.key,
                    h.signed_by.compromised_at.as_deref().unwrap_or_default(),
                    h.receipt.finished_at
                );
            }
            let mut signers: Vec<&str> = hops.iter().map(|h| h.signed_by.key.as_str()).collect();
            signers.sort_unstable();
            signers.dedup();
            let _ = writeln!(
                stdout,
                "verified: {} receipts under authority {}, signed by {}{}",
                hops.len(),
                hops.first()
                    .map_or_else(String::new, |h| h.receipt.authority.to_string()),
                signers.join(", "),
                args.export
                    .as_ref()
                    .map_or_else(String::new, |d| format!("; exported to {}", d.display()))
            );
            ExitCode::Ok
        }
        Err(e) => {
            report(stderr, args.diagnostics, &e);
            e.exit_class()
        }
    }
}

/// The whole of `cordon-verify`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdio(cordon_stage::args::parse::<Args>, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon::keyset::KeyEntry;
    use cordon::receipt::Outcome;

    fn hop(name: &str, started: &str, finished: &str, rests_on: &[&Hop]) -> Hop {
        let mut receipt = Receipt::new(StageName::Lane, Digest::of_bytes(b"a"), Outcome::Ok);
        receipt.started_at = started.to_owned();
        receipt.finished_at = finished.to_owned();
        Hop {
            digest: Digest::of_bytes(name.as_bytes()),
            receipt,
            objects: Vec::new(),
            outputs: Vec::new(),
            signed_by: KeyEntry {
                key: "ed25519:00".into(),
                valid_from: None,
                valid_until: None,
                compromised_at: None,
            },
            rests_on: rests_on.iter().map(|h| h.digest).collect(),
        }
    }

    /// A qualification starts before its sessions and finishes after them: the timeline puts
    /// it after them, each line with how long it ran, never by start time.
    #[test]
    fn the_timeline_is_causal_with_readable_durations() {
        let build = hop(
            "build",
            "2026-01-01T00:00:00.000Z",
            "2026-01-01T00:00:01.300Z",
            &[],
        );
        let b = hop(
            "b",
            "2026-01-01T00:00:03.000Z",
            "2026-01-01T00:00:04.000Z",
            &[&build],
        );
        let c = hop(
            "c",
            "2026-01-01T00:00:04.000Z",
            "2026-01-01T00:02:09.000Z",
            &[&build],
        );
        let qualify = hop(
            "q",
            "2026-01-01T00:00:02.000Z",
            "2026-01-01T00:02:10.000Z",
            &[&build, &b, &c],
        );
        let order: Vec<Digest> = causal(&[qualify, c, b, build])
            .iter()
            .map(|h| h.digest)
            .collect();
        let names: Vec<Digest> = ["build", "b", "c", "q"]
            .iter()
            .map(|n| Digest::of_bytes(n.as_bytes()))
            .collect();
        assert_eq!(order, names);
        let q = hop(
            "q",
            "2026-01-01T00:00:02.000Z",
            "2026-01-01T00:02:10.000Z",
            &[],
        );
        assert_eq!(took(&q.receipt), "2 min 08 s");
        let lines = timeline(&[q]);
        assert!(
            lines[0].starts_with("2026-01-01T00:00:02.000Z (2 min 08 s)  lane"),
            "{lines:?}"
        );
    }
}
