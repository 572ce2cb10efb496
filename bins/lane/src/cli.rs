//! The `cordon-lane` command.
//!
//! `cordon-lane session --role B|C --workload W --model M [--receipt PREBUILD] [--policy P]
//! [--store S] [--images DIR]` consumes a prebuild receipt (stdin by default; another
//! authority's is refused, exit 2; a rejected or no-decision one is passed on with its exit
//! code) and prints one lane receipt: `ok` with the role, tree, publication, model, workload,
//! worker and posture digests, every host-stamped window, the timed rate and the container's
//! meta record (exit 0); `rejected` with the engine's violation (exit 1); `no-decision` when
//! cordon could not establish the session (exit 3). A workload, model or policy the session
//! cannot use is a usage error (exit 2) and prints no receipt.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use cordon::ExitCode;
use cordon::receipt::{Outcome, PrebuildOutputs, Receipt, Role, StageName};
use cordon::store::Store;
use cordon_stage::args::{LeaseArgs, StageArgs, report_diagnostic};
use cordon_stage::receipt_io as stage;
use serde_json::json;

use crate::session::{Config, Inputs, session, tree_of};

/// Run engine sessions in the runtime lane.
#[derive(Debug, Parser)]
#[command(name = "cordon-lane", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A role on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    /// The incumbent.
    #[value(name = "B")]
    B,
    /// The candidate.
    #[value(name = "C")]
    C,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One engine session of one role.
    Session {
        /// The session's role.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// The prebuild receipt (default: stdin).
        #[arg(long)]
        receipt: Option<PathBuf>,
        /// The workload file.
        #[arg(long)]
        workload: PathBuf,
        /// The model directory (root-owned, writable by root only).
        #[arg(long)]
        model: PathBuf,
        /// The directory of image layouts, one per role (`<dir>/runtime`).
        #[arg(long, default_value = "/var/lib/cordon/images")]
        images: PathBuf,
        /// Where leases live.
        #[command(flatten)]
        lease: LeaseArgs,
    },
}

/// Run the tool: the whole of `main`.
pub fn run(
    args: &Args,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    let Command::Session {
        role,
        receipt: receipt_file,
        workload,
        model,
        images,
        lease,
    } = &args.command;
    let mode = args.stage.diagnostics;
    let (loaded, authority, runtime_version) =
        match cordon_stage::start::stage_start(&args.stage.policy, mode, stderr) {
            Ok(s) => (s.loaded, s.authority, s.runtime.version),
            Err(code) => return code,
        };
    let policy = &loaded.policy;
    let (input, prev) = match stage::input_or_exit(
        receipt_file.as_deref(),
        stdin,
        StageName::Lane,
        &authority,
        mode,
        stdout,
        stderr,
    ) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let publication = match input.outputs_as::<PrebuildOutputs>() {
        Ok(o) => o.publication,
        Err(e) => {
            report_diagnostic(&e, mode, stderr);
            return ExitCode::Usage;
        }
    };
    let tree = match tree_of(&input.inputs) {
        Ok(t) => t,
        Err(why) => {
            let _ = writeln!(stderr, "cordon-lane: {why}");
            return ExitCode::Usage;
        }
    };
    let store = match Store::open(&args.stage.store_root(policy)) {
        Ok(s) => s,
        Err(e) => {
            report_diagnostic(&e, mode, stderr);
            return ExitCode::NoDecision;
        }
    };
    if let Err(e) = stage::require_chain(&store, &prev, &authority) {
        report_diagnostic(&e, mode, stderr);
        return e.exit_code();
    }
    let cfg = Config {
        store: store.clone(),
        images: images.clone(),
        setup: lease.setup(policy),
        authority,
        runtime_version,
    };
    let inputs = Inputs {
        role: match role {
            RoleArg::B => Role::B,
            RoleArg::C => Role::C,
        },
        tree,
        publication,
        workload: workload.clone(),
        model: model.clone(),
    };
    let mut receipt = Receipt::new(StageName::Lane, authority, Outcome::Ok);
    receipt.prev = Some(prev);
    receipt.inputs = json!({
        "role": inputs.role,
        "tree": tree,
        "publication": publication,
        "workload": workload,
        "model": model,
    });
    match session(policy, &cfg, &inputs) {
        // The operator's inputs: nothing ran, nothing to record.
        Err(e) if e.is_usage() => {
            report_diagnostic(&e, mode, stderr);
            ExitCode::Usage
        }
        result => stage::finish(&store, &mut receipt, result, mode, stdout, stderr),
    }
}
