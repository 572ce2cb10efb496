//! The `cordon-prebuild` command: `cordon-prebuild [--policy P] [--store S] [--receipt FILE]`.
//!
//! It consumes a materialize receipt — a candidate's delta, or an incumbent's registration
//! whose manifest names its build step — (stdin by default; another authority's is refused, exit
//! 2, both identities shown) and prints one receipt: `ok` with the publication digest and the
//! build's meta record (exit 0), `rejected` with a reason code (exit 1), or `no-decision`
//! (exit 3: image missing, runtime failure, cleanup or absence proof failed).

use cordon::exit::ExitClass;
use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Parser;
use cordon::ExitCode;
use cordon::inputs::PrebuildInputs;
use cordon::receipt::{
    Decision, IncumbentOutputs, MaterializeOutputs, Outcome, PrebuildOutputs, Receipt, StageName,
};
use cordon_stage::args::{LeaseArgs, StageArgs, fail, report_diagnostic};
use cordon_stage::receipt_io as stage;

use crate::prebuild::{Config, prebuild, rejected};

/// Build a materialized tree's native publication in a disposable container.
#[derive(Debug, Parser)]
#[command(name = "cordon-prebuild", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// The materialize receipt (default, or `-`: stdin).
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// The directory of image layouts, one per role (`<dir>/prebuild`).
    #[arg(long, default_value = cordon_stage::args::DEFAULT_IMAGES)]
    pub images: PathBuf,
    /// Where leases live.
    #[command(flatten)]
    pub lease: LeaseArgs,
}

/// Run the tool: the whole of `main`.
pub fn run(
    args: &Args,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    cordon::voice::set_level(args.stage.level());
    if let Err(code) = cordon_stage::start::require_root(
        &cordon_stage::start::RootStage {
            tool: "cordon-prebuild",
            why: "it runs the build in a container as a per-run account",
            stage: Some(StageName::Prebuild),
            policy: &args.stage.policy,
        },
        args.stage.diagnostics,
        stdout,
        stderr,
    ) {
        return code;
    }
    let (loaded, authority, runtime_version) = match cordon_stage::start::stage_start(
        &args.stage.policy,
        args.stage.diagnostics,
        stderr,
    ) {
        Ok(s) => (s.loaded, s.authority, s.runtime.version),
        Err(code) => return code,
    };
    let policy = &loaded.policy;
    let store_root = args.stage.store_root(policy);
    let store = match stage::open_store(
        &store_root,
        (StageName::Prebuild, authority),
        args.stage.diagnostics,
        stdout,
        stderr,
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (input, prev) = match stage::input_or_exit(
        args.receipt.as_deref(),
        stdin,
        StageName::Prebuild,
        &authority,
        &store,
        args.stage.diagnostics,
        stdout,
        stderr,
    ) {
        Ok(x) => x,
        Err(code) => return code,
    };
    // A candidate's materialized delta, or an incumbent's registration (role B builds the
    // incumbent's own publication with the step its manifest names).
    let (tree, step, candidate) = match input
        .outputs_as::<MaterializeOutputs>()
        .map(|o| (o.tree_digest, o.step, true))
        .or_else(|e| {
            input
                .outputs_as::<IncumbentOutputs>()
                .map(|o| (o.tree_digest, o.step, false))
                .map_err(|_| e)
        }) {
        Ok(o) => o,
        Err(e) => {
            return fail(&e, args.stage.diagnostics, stderr);
        }
    };
    // The input must be this store's own, and its chain must walk back to intake under this
    // authority: a receipt written by hand names nothing the store established.
    if let Err(e) = stage::require_chain(&store, &prev, &authority) {
        report_diagnostic(&e, args.stage.diagnostics, stderr);
        return e.exit_class();
    }
    let cfg = Config::on_host(
        &store,
        &args.images,
        args.lease.setup(policy),
        (authority, runtime_version),
    );
    let mut receipt = Receipt::new(StageName::Prebuild, authority, Outcome::Ok);
    receipt.prev = Some(prev);
    if let Err(e) = receipt.set_inputs(&PrebuildInputs {
        tree,
        step: step.clone(),
    }) {
        return fail(&e, args.stage.diagnostics, stderr);
    }
    let result = match &step {
        Some(step) => prebuild(policy, &cfg, &tree, step, candidate),
        None => Ok(rejected(
            "prebuild.unknown-step",
            "the tree names no build step".into(),
            None,
        )),
    };
    let result = result.map(|d| match d {
        Decision::Accepted(p) => Decision::Accepted(PrebuildOutputs {
            publication: p.publication.digest,
            files: p.publication.entries.len() as u64,
            bytes: p.publication.entries.iter().map(|e| e.size).sum::<u64>(),
            cached: p.cached,
            meta: p.meta,
        }),
        Decision::Rejected(r) => Decision::Rejected(r),
    });
    receipt.evidence = cfg.evidence.take();
    stage::finish(
        &store,
        &mut receipt,
        result,
        args.stage.diagnostics,
        stdout,
        stderr,
    )
}

/// The whole of `cordon-prebuild`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code. Started as its own
/// confined child, it decodes one sealed-direct-artifact profile ([`crate::aot`]) instead.
#[must_use]
pub fn main() -> ExitCode {
    if let Some((spec, parent)) = cordon::confine::requested() {
        cordon::confine::run_child(&spec, parent, |spec| match spec.kind.as_str() {
            crate::aot::PROFILE_CHILD => crate::aot::child_main(),
            _ => cordon::confine::UNCONFINED_EXIT,
        });
    }
    cordon::exit::with_stdin(cordon_stage::args::parse::<Args>, run)
}
