//! The `cordon-reap` command.
//!
//! - `cordon-reap [--policy P] [--store S]`: startup recovery — release every lease record of
//!   this executor (no live manager can hold them: this process holds the executor's lock),
//!   then remove containers in cordon's state root with this executor's exact label, orphan
//!   run directories, orphan run accounts in the policy's range, stale scratch entries.
//! - `cordon-reap --check`: the strict quiescence proof later stages rely on — exit 0 only when
//!   nothing of this executor exists in this store, exit 3 listing what does: residue, and
//!   live leases as *active* (distinct from residue).
//! - `cordon-reap --status`: the monitor's view — active leases reported without alarm (exit 0),
//!   exit 3 only for residue or expired leases.
//! - `cordon-reap --sweep`: recovery for a timer — the default's work, with `--status`'s
//!   verdict (a live lease is not an alarm).
//!
//! While a live supervisor holds the executor (its host-global lock), recovery does not wait:
//! it ends the container of every lease past its deadline (plus a grace) or whose supervisor is
//! gone — only a container with this executor's, this store's and that lease's exact labels —
//! so the supervisor sees its run end and releases the rest; `cordon-reap` runs from a timer.
//!
//! Exit codes: 0 ok/quiescent; 2 usage or policy error; 3 recovery or the check could not be
//! established (a corrupt or linked record stops recovery), with what remains in the receipt.

use std::io::Write;

use clap::Parser;
use cordon::ExitCode;
use std::time::SystemTime;

use cordon::inputs::ReapInputs;
use cordon::lease::{LeaseError, Leftover, Manager, Observer};
use cordon::receipt::{Outcome, Reason, Receipt};
use cordon::store::Store;
use cordon_evidence::residue::ReapOutputs;
use cordon_stage::args::{LeaseArgs, StageArgs, report_diagnostic};
use cordon_stage::receipt_io as stage;

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
    #[arg(long, conflicts_with = "status")]
    pub check: bool,
    /// Report leases and residue for monitoring; change nothing; active leases are not an alarm.
    #[arg(long)]
    pub status: bool,
    /// Recover as the default does, but raise no alarm for live leases (the recovery timer:
    /// exit 0 while stages run, 3 only for residue or expired leases).
    #[arg(long, conflicts_with_all = ["check", "status"])]
    pub sweep: bool,
}

/// What a run of the tool found.
struct Found {
    released: Vec<String>,
    active: Vec<String>,
    residue: Vec<String>,
}

fn lines(items: impl IntoIterator<Item = Leftover>) -> Vec<String> {
    items.into_iter().map(|l| l.to_string()).collect()
}

/// Recover (or only look) while holding the executor.
fn as_manager(m: &Manager, change: bool) -> Result<Found, LeaseError> {
    let released = if change { m.recover()? } else { Vec::new() };
    Ok(Found {
        released,
        active: Vec::new(),
        residue: lines(m.check()?),
    })
}

/// A live supervisor holds the executor: end expired leases (when allowed to change anything),
/// report the live ones as active, and everything else of this executor that the lock-free
/// check finds — containers, run directories, accounts, cgroups, mounts — as residue unless it
/// belongs to an active lease. Never "quiescent" on the strength of the records alone.
fn as_observer(o: &Observer, change: bool) -> Result<Found, LeaseError> {
    let now = SystemTime::now();
    let released = if change {
        o.end_expired(now)?
    } else {
        Vec::new()
    };
    let now_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (mut active, mut residue) = (Vec::new(), Vec::new());
    let mut live = Vec::new();
    for l in o.leases(now)? {
        let r = &l.record;
        if l.expired {
            residue.push(format!(
                "expired lease {} (supervisor pid {})",
                r.lease, r.supervisor.pid
            ));
        } else {
            active.push(format!(
                "lease {} (supervisor pid {}, {} ms to its deadline)",
                r.lease,
                r.supervisor.pid,
                r.expires_at_ms.saturating_sub(now_ms)
            ));
            live.push(r.clone());
        }
    }
    // What an active lease owns is named by its record: its id in every path and container id,
    // and its account's name.
    let of_live = |item: &Leftover| {
        live.iter().any(|r| {
            let account = r.account().map(|a| a.name);
            item.belongs_to(&r.lease, account.as_deref())
        })
    };
    residue.extend(lines(o.check()?.into_iter().filter(|i| !of_live(i))));
    Ok(Found {
        released,
        active,
        residue,
    })
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
    let inputs = ReapInputs {
        executor,
        check: args.check,
        status: args.status,
        sweep: args.sweep,
    };
    if let Err(e) = receipt.set_inputs(&inputs) {
        report_diagnostic(&e, args.stage.diagnostics, stderr);
        return ExitCode::NoDecision;
    }
    let change = !args.check && !args.status;
    let setup = args.lease.setup(policy);
    let result = match Manager::open(&store, setup.clone()) {
        Ok(m) => as_manager(&m, change),
        Err(LeaseError::Busy { .. }) => as_observer(&Observer::new(&store, setup), change),
        Err(e) => Err(e),
    };
    let reasons = |code: &str, items: &[String]| -> Vec<Reason> {
        items
            .iter()
            .map(|l| Reason {
                code: code.into(),
                message: l.clone(),
            })
            .collect()
    };
    let (code, outputs, failed) = match result {
        Ok(f) => {
            let quiescent = f.active.is_empty() && f.residue.is_empty();
            // --status and --sweep raise no alarm for live leases; the strict check and
            // recovery do.
            let code = if f.residue.is_empty() && (args.status || args.sweep || f.active.is_empty())
            {
                ExitCode::Ok
            } else {
                receipt.outcome = Outcome::NoDecision;
                receipt.reasons = reasons("reap.residue", &f.residue);
                receipt.reasons.extend(reasons("reap.active", &f.active));
                ExitCode::NoDecision
            };
            let outputs = ReapOutputs {
                quiescent,
                released: Some(f.released),
                active: Some(f.active),
                remaining: f.residue,
            };
            (code, outputs, None)
        }
        Err(e) => {
            receipt.outcome = Outcome::NoDecision;
            let items = match &e {
                LeaseError::Residue(r) => r.items.clone(),
                other => vec![stage::error_chain(other)],
            };
            receipt.reasons = reasons("reap.residue", &items);
            let outputs = ReapOutputs {
                quiescent: false,
                released: None,
                active: None,
                remaining: items,
            };
            (ExitCode::NoDecision, outputs, Some(e))
        }
    };
    let code = match receipt.set_outputs(&outputs) {
        Ok(()) => code,
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            return ExitCode::NoDecision;
        }
    };
    let emitted = stage::emit(&store, &mut receipt, stdout);
    // Reported once the receipt is safe.
    if let Some(e) = failed {
        report_diagnostic(&e, args.stage.diagnostics, stderr);
    }
    match emitted {
        Ok(_) => code,
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            ExitCode::NoDecision
        }
    }
}

/// The whole of `cordon-reap`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdio(<Args as clap::Parser>::parse, run)
}
