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
use std::path::PathBuf;

use clap::Parser;
use cordon::ExitCode;
use cordon::lease::{LeaseError, Manager, Setup};
use cordon::receipt::{Outcome, Reason, Receipt};
use cordon::runtime::Runtime;
use cordon::stage::{self, DEFAULT_POLICY};
use cordon::store::Store;
use cordon_policy::cli::{Diagnostics, report_diagnostic};
use serde_json::json;

/// cordon's runtime state root when `--state-root` is not given: no other tool's containers
/// live under it.
pub const DEFAULT_STATE_ROOT: &str = "/run/cordon-runc";

/// Recover and prove quiescence.
#[derive(Debug, Parser)]
#[command(name = "cordon-reap", version, about)]
pub struct Args {
    /// The policy file.
    #[arg(long, default_value = DEFAULT_POLICY)]
    pub policy: PathBuf,
    /// The store directory (default: the policy's `store`).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The executor id (default: the policy's name).
    #[arg(long)]
    pub executor: Option<String>,
    /// cordon's runtime state root.
    #[arg(long, default_value = DEFAULT_STATE_ROOT)]
    pub state_root: PathBuf,
    /// The run-directory root (default: the policy's `run-dir`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Only check quiescence; change nothing.
    #[arg(long)]
    pub check: bool,
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text)]
    pub diagnostics: Diagnostics,
}

/// The manager setup a policy and these arguments describe (shared with the stages' tests).
#[must_use]
pub fn setup(
    policy: &cordon_policy::Policy,
    executor: &str,
    state_root: PathBuf,
    run_dir: PathBuf,
) -> Setup {
    Setup {
        executor: executor.to_owned(),
        runtime: Runtime {
            binary: PathBuf::from(policy.runtime().path()),
            state_root: state_root.join(executor),
        },
        run_root: run_dir,
        accounts: policy.account_policy(),
        cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        passwd: PathBuf::from("/etc/passwd"),
    }
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let (loaded, authority) =
        match cordon_policy::cli::stage_start(&args.policy, args.diagnostics, stderr) {
            Ok(x) => x,
            Err(code) => return code,
        };
    let policy = &loaded.policy;
    let store_root = args
        .store
        .clone()
        .unwrap_or_else(|| PathBuf::from(policy.store()));
    let executor = args
        .executor
        .clone()
        .unwrap_or_else(|| policy.name().to_owned());
    let run_dir = args
        .run_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(policy.run_dir()));
    let store = match Store::open(&store_root) {
        Ok(s) => s,
        Err(e) => {
            report_diagnostic(&e, args.diagnostics, stderr);
            return ExitCode::NoDecision;
        }
    };
    let mut receipt = Receipt::new("reap", authority, Outcome::Ok);
    receipt.inputs = json!({ "executor": executor, "check": args.check });
    let result = Manager::open(
        &store,
        setup(policy, &executor, args.state_root.clone(), run_dir),
    )
    .and_then(|m| {
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
            report_diagnostic(&e, args.diagnostics, stderr);
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
            report_diagnostic(&e, args.diagnostics, stderr);
            ExitCode::NoDecision
        }
    }
}
