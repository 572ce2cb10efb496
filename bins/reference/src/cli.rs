//! The `cordon-reference` command.
//!
//! `cordon-reference --pristine REGISTRATION [--qualify QUALIFY] [--policy P] [--store S]
//! [--images DIR]` consumes a qualify receipt (stdin by default) and the pristine tree's
//! registration receipt (`cordon-materialize incumbent` on the stock engine the policy pins as
//! `pristine digest=…`), runs the candidate's audit when the policy's `audit` section asks for
//! one, runs the pristine reference session T after proving the executor quiescent, grades B, C,
//! B′ and the audit against T under the policy's quality rule, and prints the
//! final verdict ([`crate::referee`]): `ok` on PASS (exit 0), `rejected` on FAIL with every
//! number as evidence (exit 1), `no-decision` when an authority is incomplete (exit 3). The
//! audit, quiescence and reference receipts are stored and linked, not printed.
//!
//! A qualify receipt that is not `ok` (the candidate was slower, or broke its session) is
//! passed on with its exit code: the qualification already decided, and T does not run. A
//! receipt of another authority, a qualification the store does not hold, or a pristine
//! registration of any tree but the pin is refused (exit 2) before anything runs.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Parser;
use cordon::ExitCode;
use cordon::exit::ExitClass;
use cordon::receipt::{Outcome, Receipt, StageName};
use cordon::store::Store;
use cordon_evidence::inputs::QualifyInputs;
use cordon_evidence::qualify::{QualifyOutputs, Settlement};
use cordon_evidence::verdict::VerdictInputs;
use cordon_stage::args::{LeaseArgs, StageArgs, fail};
use cordon_stage::receipt_io as stage;

use crate::referee::{Given, Referee, pristine_tree};

/// The quality authority and the final verdict.
#[derive(Debug, Parser)]
#[command(name = "cordon-reference", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// The qualify receipt (default: stdin).
    #[arg(long)]
    pub qualify: Option<PathBuf>,
    /// The pristine tree's registration receipt (`cordon-materialize incumbent DIR`).
    #[arg(long)]
    pub pristine: PathBuf,
    /// The directory of image layouts, one per role (`<dir>/runtime`).
    #[arg(long, default_value = cordon_stage::args::DEFAULT_IMAGES)]
    pub images: PathBuf,
    /// Where leases live (the qualification's: its reads must be gone from it).
    #[command(flatten)]
    pub lease: LeaseArgs,
}

/// A wiring error: reported, exit 2, no receipt.
fn usage(stderr: &mut dyn Write, why: &str) -> ExitCode {
    // A stored receipt's or evidence's words may be in it: escaped before the terminal.
    let _ = writeln!(stderr, "cordon-reference: {}", cordon::text::printable(why));
    ExitCode::Usage
}

/// The store's copies of the qualification and the pristine registration, checked.
fn given(
    store: &Store,
    policy: &cordon_policy_lang::Policy,
    (qualify, digest): (&Receipt, cordon::canonical::Digest),
    pristine: &std::path::Path,
    authority: &cordon::canonical::Digest,
) -> Result<Given, String> {
    stage::require_chain(store, &digest, authority).map_err(|e| e.to_string())?;
    let outputs = qualify
        .outputs_as::<QualifyOutputs>()
        .map_err(|e| format!("the qualification: {e}"))?;
    let inputs = qualify
        .inputs_as::<QualifyInputs>()
        .map_err(|e| format!("the qualification: {e}"))?;
    let (_, registration) = stage::read_input(
        Some(pristine),
        &mut std::io::empty(),
        StageName::Materialize,
        authority,
    )
    .map_err(|e| {
        format!(
            "the pristine registration: {}",
            stage::explain_foreign(e, store)
        )
    })?;
    // The store's copy, re-hashed: a hand-written receipt registers nothing.
    let stored = cordon::chain::load(store, &registration)
        .map_err(|e| format!("the pristine registration: {e}"))?;
    let tree = pristine_tree(policy, &stored).map_err(|e| e.to_string())?;
    let primary = match outputs.reproduces {
        Some(first) => Some((first, primary(store, first, qualify, authority)?)),
        None => None,
    };
    Ok(Given {
        qualify: digest,
        outputs,
        inputs,
        pristine: registration,
        tree,
        primary,
    })
}

/// The primary attempt a reproduction names: the store's copy, an `ok` qualification under
/// this authority, of the same builds, that the reproduction exactly exchanges and whose
/// settlement recomputes.
fn primary(
    store: &Store,
    first: cordon::canonical::Digest,
    reproduction: &Receipt,
    authority: &cordon::canonical::Digest,
) -> Result<QualifyOutputs, String> {
    let why = |e: &dyn std::fmt::Display| format!("the primary attempt {first}: {e}");
    stage::require_chain(store, &first, authority).map_err(|e| why(&e))?;
    let receipt = cordon::chain::load(store, &first).map_err(|e| why(&e))?;
    Settlement::check_pair(first, &receipt, reproduction).map_err(|e| why(&e))
}

/// Run the tool: the whole of `main`.
pub fn run(
    args: &Args,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    cordon::voice::set_level(args.stage.level());
    let mode = args.stage.diagnostics;
    if let Err(code) = cordon_stage::start::require_root(
        &cordon_stage::start::RootStage {
            tool: "cordon-reference",
            why: "it runs the audit and the reference session in containers as per-run accounts",
            stage: Some(StageName::Verdict),
            policy: &args.stage.policy,
        },
        mode,
        stdout,
        stderr,
    ) {
        return code;
    }
    let (loaded, authority, runtime_version) =
        match cordon_stage::start::stage_start(&args.stage.policy, mode, stderr) {
            Ok(s) => (s.loaded, s.authority, s.runtime.version),
            Err(code) => return code,
        };
    let policy = &loaded.policy;
    let store = match stage::open_store(
        &args.stage.store_root(policy),
        (StageName::Verdict, authority),
        mode,
        stdout,
        stderr,
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (input, digest) = match stage::input_or_exit(
        args.qualify.as_deref(),
        stdin,
        StageName::Verdict,
        &authority,
        &store,
        mode,
        stdout,
        stderr,
    ) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let given = match given(&store, policy, (&input, digest), &args.pristine, &authority) {
        Ok(g) => g,
        Err(why) => return usage(stderr, &why),
    };
    let cfg = cordon_lane::session::Config::on_host(
        &store,
        &args.images,
        args.lease.setup(policy),
        (authority, runtime_version),
    );
    let mut receipt = Receipt::new(StageName::Verdict, authority, Outcome::Ok);
    receipt.prev = Some(digest);
    let mut recorded = VerdictInputs {
        qualify: digest,
        pristine: given.pristine,
        audit: None,
        quiescence: None,
        reference: None,
    };
    let referee = Referee {
        policy,
        cfg: &cfg,
        mode,
    };
    let result = referee.verdict(&given, &mut recorded, stderr);
    // The receipts it stored are named, whatever the verdict.
    if let Err(e) = receipt.set_inputs(&recorded) {
        return fail(&e, mode, stderr);
    }
    match result {
        Err(e) if e.exit_class() == ExitCode::Usage => fail(&e, mode, stderr),
        result => {
            receipt.evidence = cfg.evidence.take();
            stage::finish(&store, &mut receipt, result, mode, stdout, stderr)
        }
    }
}

/// The whole of `cordon-reference`'s `main`: parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdin(cordon_stage::args::parse::<Args>, run)
}
