//! The `cordon-reap` command.
//!
//! - `cordon-reap [--policy P] [--store S]`: startup recovery — release every lease record of
//!   this executor (no live manager can hold them: this process holds the executor's lock),
//!   then remove containers in cordon's state root with this executor's exact label, orphan
//!   run directories, orphan run accounts in the policy's range, stale scratch entries.
//! - `cordon-reap --check`: a quiescence receipt — exit 0 when nothing remains, exit 3 listing
//!   what does.
//!
//! Exit codes: 0 ok/quiescent; 2 usage or policy error; 3 recovery or the check could not be
//! established (a corrupt or linked record stops recovery), with what remains in the receipt.

use std::io::Write;

use clap::Parser;
use cordon::ExitCode;
use cordon::lease::{LeaseError, Manager};
use cordon::receipt::{Outcome, Reason, Receipt};
use cordon::store::Store;
use cordon_stage::args::{LeaseArgs, StageArgs, report_diagnostic};
use cordon_stage::receipt_io as stage;
use serde_json::json;

/// Recover and prove quiescence.
#[derive(Debug, Parser)]
#[command(name = "cordon-reap", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// Where leases live.
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Only check quiescence; change nothing.
    #[arg(long)]
    pub check: bool,
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let (loaded, authority) = match cordon_stage::start::stage_start(
        &args.stage.policy,
        args.stage.diagnostics,
        stderr,
    ) {
        Ok(s) => (s.loaded, s.authority),
        Err(code) => return code,
    };
    let policy = &loaded.policy;
    let store_root = args.stage.store_root(policy);
    let executor = args.lease.executor(policy);
    let store = match Store::open(&store_root) {
        Ok(s) => s,
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            return ExitCode::NoDecision;
        }
    };
    let mut receipt = Receipt::new(cordon::receipt::StageName::Reap, authority, Outcome::Ok);
    receipt.inputs = json!({ "executor": executor, "check": args.check });
    let result = Manager::open(&store, args.lease.setup(policy)).and_then(|m| {
        if args.check {
            m.check().map(|left| (Vec::new(), left))
        } else {
            m.recover()
                .and_then(|done| m.check().map(|left| (done, left)))
        }
    });
    let code = match result {
        Ok((done, left)) if left.is_empty() => {
            receipt.outputs = json!({ "quiescent": true, "released": done, "remaining": [] });
            ExitCode::Ok
        }
        Ok((done, left)) => {
            receipt.outcome = Outcome::NoDecision;
            receipt.reasons = left
                .iter()
                .map(|l| Reason {
                    code: "reap.residue".into(),
                    message: l.clone(),
                })
                .collect();
            receipt.outputs = json!({ "quiescent": false, "released": done, "remaining": left });
            ExitCode::NoDecision
        }
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            receipt.outcome = Outcome::NoDecision;
            let items = match &e {
                LeaseError::Residue(r) => r.items.clone(),
                other => vec![stage::error_chain(other)],
            };
            receipt.reasons = items
                .iter()
                .map(|l| Reason {
                    code: "reap.residue".into(),
                    message: l.clone(),
                })
                .collect();
            receipt.outputs = json!({ "quiescent": false, "remaining": items });
            ExitCode::NoDecision
        }
    };
    match stage::emit(Some(&store), &mut receipt, stdout) {
        Ok(_) => code,
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            ExitCode::NoDecision
        }
    }
}
