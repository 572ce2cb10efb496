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
//!   exit 3 only for residue or expired leases; its receipt counts what seed 001 asks an
//!   operator to monitor (`outputs.counters`: stale leases now; OOM kills, deadline kills, host
//!   resets and drain failures over the store's stored receipts and quarantines).
//! - `cordon-reap --sweep`: recovery for a timer — the default's work, with `--status`'s
//!   verdict (a live lease is not an alarm).
//! - `cordon-reap --quarantine WHY`: stop new work on this executor now (seed 001's checklist,
//!   step 1, for an incident an operator found), then report as `--status` does.
//! - `cordon-reap --clear ID`: lift quarantine `ID` of this executor
//!   ([`cordon::lease::quarantine`]) once the strict quiescence check holds, holding the
//!   executor so nothing starts between the proof and the lift; the receipt names the record.
//!
//! Every mode lists the quarantines in force in its receipt (`quarantined`), and each is an
//! alarm: exit 3 until it is cleared.
//!
//! - `cordon-reap --surface --policy SURFACE.kdl [--check|--status|--sweep|--quarantine
//!   WHY|--clear ID]`: the same for the rootless runs of the policy's surface stage
//!   ([`cordon::lease::rootless`]), run as the surface's service user (root is refused: those
//!   runs and their state directory are the service user's); its receipt is kept in the
//!   surface's own store and signed with its key, and so are the surface's quarantines (one
//!   scope for all its runs, [`rootless::QUARANTINE_SCOPE`]).
//!
//! While a live supervisor holds the executor (its host-global lock), recovery does not wait:
//! it ends the container of every lease past its deadline (plus a grace) or whose supervisor is
//! gone — only a container with this executor's, this store's and that lease's exact labels —
//! so the supervisor sees its run end and releases the rest; `cordon-reap` runs from a timer.
//!
//! Exit codes: 0 ok/quiescent; 2 usage or policy error; 3 recovery or the check could not be
//! established (a corrupt or linked record stops recovery), with what remains in the receipt.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use cordon::ExitCode;
use cordon::exit::ExitClass;
use cordon::lease::rootless;
use cordon::runtime::Runtime;
use cordon_policy_lang::Policy;

use cordon::inputs::ReapInputs;
use cordon::lease::{BOOT_ID, BootTime, LeaseError, Leftover, Manager, Observer, quarantine};
use cordon::receipt::{Outcome, Reason, Receipt, StageName};
use cordon::store::Store;
use cordon_evidence::residue::{Counters, ReapOutputs};
use cordon_stage::args::{Diagnostics, LeaseArgs, StageArgs, fail, report_diagnostic};
use cordon_stage::receipt_io as stage;
use std::collections::BTreeMap;

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
    /// List every lease record in the store (every executor's: its supervisor, live or gone,
    /// its deadline and authority) and every executor lock on the host with its holder, one
    /// line each on stdout; change nothing, print no receipt.
    #[arg(long, conflicts_with_all = ["check", "status", "sweep", "surface", "clear", "quarantine"])]
    pub list: bool,
    /// Collect the store: remove every tree, publication, intake or archive record, content
    /// object and image cache that no stored record (receipt, quarantine, incident) and no pin
    /// of the policy names, each listed on stdout; keep every record and all evidence; print
    /// no receipt. Refused (exit 3) while any other command holds the store (naming them) or
    /// any lease record is in it (recover first).
    #[arg(long, conflicts_with_all = ["check", "status", "sweep", "surface", "clear", "quarantine", "list"])]
    pub gc: bool,
    /// With `--gc`: list what would be removed, and remove nothing.
    #[arg(long, requires = "gc", conflicts_with_all = ["check", "status", "sweep", "surface", "clear", "quarantine", "list"])]
    pub dry_run: bool,
    /// Reap the rootless runs of the policy's surface stage instead of the host's leases.
    #[arg(long, conflicts_with_all = ["store", "run_dir", "state_root"])]
    pub surface: bool,
    /// Lift quarantine ID of this executor once it is proven quiescent (`--status` lists ids).
    #[arg(long, value_name = "ID", conflicts_with_all = ["check", "status", "sweep"])]
    pub clear: Option<String>,
    /// Quarantine this executor now, for the reason WHY: no lease is taken on it until
    /// `--clear` lifts the record.
    #[arg(long, value_name = "WHY", conflicts_with_all = ["check", "status", "sweep", "clear"])]
    pub quarantine: Option<String>,
    /// Root's, under `user "per-run"`: the per-run account's state directory whose runs this
    /// process (the account) recovers.
    #[arg(long = "per-run-state", hide = true, requires = "surface")]
    pub per_run_state: Option<PathBuf>,
}

/// What a run of the tool found.
struct Found {
    released: Vec<String>,
    active: Vec<String>,
    residue: Vec<String>,
    /// The quarantine `--clear` lifted.
    cleared: Option<quarantine::Quarantine>,
    /// Lease records (or rootless runs) no live supervisor holds within their deadline.
    stale: u64,
}

fn lines(items: impl IntoIterator<Item = Leftover>) -> Vec<String> {
    items.into_iter().map(|l| l.to_string()).collect()
}

/// Recover (or only look) while holding the executor.
fn as_manager(m: &Manager, change: bool) -> Result<Found, LeaseError> {
    // As the sole manager, every record left is one no supervisor holds.
    let stale = m.records()?.len() as u64;
    let released = if change { m.recover()? } else { Vec::new() };
    Ok(Found {
        released,
        active: Vec::new(),
        residue: lines(m.check()?),
        cleared: None,
        stale,
    })
}

/// `--clear ID`: as this executor's sole manager (nothing can start meanwhile), the strict
/// quiescence check, then the lift. Only an executor's own quarantine is lifted here: a
/// host's needs every executor proven, a device's a drain receipt (the GPU lane's), and
/// neither exists yet — refused, never lifted on less.
fn clear(m: &Manager, store: &Store, executor: &str, id: &str) -> Result<Found, LeaseError> {
    lift_if_quiet(as_manager(m, false)?, store, executor, id)
}

/// Lift quarantine `id` of `executor` when `found` (a look that changed nothing) is strictly
/// quiescent: no residue, no active lease or run.
fn lift_if_quiet(
    mut found: Found,
    store: &Store,
    executor: &str,
    id: &str,
) -> Result<Found, LeaseError> {
    let q = quarantine::in_force(store)?
        .remove(id)
        .ok_or_else(|| LeaseError::NoQuarantine { id: id.to_owned() })?;
    if q.scope != quarantine::Scope::Executor(executor.to_owned()) {
        found.residue.push(format!(
            "quarantine {id} holds {}: cordon-reap lifts only executor {executor}'s own",
            q.scope
        ));
    }
    if found.residue.is_empty() && found.active.is_empty() {
        found.cleared = Some(quarantine::lift(store, id)?);
    }
    Ok(found)
}

/// `--quarantine WHY`: stop new work on `executor` now. The executor's first record stands;
/// either way it is quarantined from here on.
fn operator_quarantine(store: &Store, executor: &str, why: &str) -> Result<(), LeaseError> {
    quarantine::impose(
        store,
        &quarantine::Quarantine {
            scope: quarantine::Scope::Executor(executor.to_owned()),
            cause: quarantine::Cause::Operator,
            why: why.to_owned(),
            lease: None,
            at: cordon::receipt::now_rfc3339(),
        },
    )
    .map(drop)
}

/// A live supervisor holds the executor: end expired leases (when allowed to change anything),
/// report the live ones as active, and everything else of this executor that the lock-free
/// check finds — containers, run directories, accounts, cgroups, mounts — as residue unless it
/// belongs to an active lease. Never "quiescent" on the strength of the records alone.
fn as_observer(o: &Observer, change: bool, now: &BootTime) -> Result<Found, LeaseError> {
    let released = if change {
        o.end_expired(now)?
    } else {
        Vec::new()
    };
    let (mut active, mut residue) = (Vec::new(), Vec::new());
    let mut live = Vec::new();
    let mut stale = 0;
    for l in o.leases(now)? {
        let r = &l.record;
        if l.expired {
            stale += 1;
            residue.push(format!(
                "expired lease {} (supervisor pid {})",
                r.lease, r.supervisor.pid
            ));
        } else {
            active.push(format!(
                "lease {} (supervisor pid {}, {} ms to its deadline)",
                r.lease,
                r.supervisor.pid,
                r.deadline.left(now)
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
        cleared: None,
        stale,
    })
}

/// The rootless runs of the surface stage, as the service user: released, active, residue.
fn as_surface(setup: &rootless::Setup, change: bool, now: &BootTime) -> Result<Found, LeaseError> {
    let seen = rootless::observe(setup, change, now)?;
    Ok(Found {
        released: seen.released,
        active: seen
            .active
            .iter()
            .map(|r| {
                format!(
                    "run {} (supervisor pid {}, {} ms to its deadline)",
                    r.run,
                    r.supervisor.pid,
                    r.deadline.left(now)
                )
            })
            .collect(),
        stale: seen
            .residue
            .iter()
            .filter(|l| matches!(l, Leftover::Run { .. }))
            .count() as u64,
        residue: lines(seen.residue),
        cleared: None,
    })
}

/// The stages whose receipts report one run each: the ones the OOM killer or a deadline can
/// end. Summaries (qualify, verdict) repeat their sessions' reasons and are not counted again.
const RUNS: [StageName; 5] = [
    StageName::Prebuild,
    StageName::Lane,
    StageName::Audit,
    StageName::Reference,
    StageName::Surface,
];

/// `--status`'s counters: `stale` as found, the quarantines in force, and the store's stored
/// receipts (every one read: a receipt that cannot be read is an error, never a zero).
fn counters(
    store: &Store,
    quarantined: &BTreeMap<String, quarantine::Quarantine>,
    stale: u64,
) -> Result<Counters, LeaseError> {
    let mut c = Counters {
        stale_leases: stale,
        ..Counters::default()
    };
    let mut incident = |cause| match cause {
        quarantine::Cause::HostReset => c.host_resets += 1,
        quarantine::Cause::Drain => c.drain_failures += 1,
        quarantine::Cause::Residue
        | quarantine::Cause::Drift
        | quarantine::Cause::Containment
        | quarantine::Cause::Operator => {}
    };
    for q in quarantined.values() {
        incident(q.cause);
    }
    let dir = store.root().join(cordon::store::RECEIPTS);
    let (mut oom, mut deadline) = (0, 0);
    let list = |source| LeaseError::Io {
        op: "list",
        path: dir.clone(),
        source,
    };
    for entry in std::fs::read_dir(&dir).map_err(list)? {
        let entry = entry.map_err(list)?;
        let name = entry.file_name();
        // Signatures sit beside their receipts.
        let Some(name) = name.to_str().filter(|n| n.ends_with(".json")) else {
            continue;
        };
        let unreadable = |why: String| LeaseError::Record {
            path: dir.join(name),
            why,
        };
        let r: Receipt =
            serde_json::from_slice(&store.read_document(cordon::store::RECEIPTS, name)?)
                .map_err(|e| unreadable(e.to_string()))?;
        let has = |suffix: &str| r.reasons.iter().any(|x| x.code.ends_with(suffix));
        if r.stage == StageName::Reap {
            // A lifted quarantine is counted where its receipt says so.
            if let Some(q) = r.outputs.get("cleared") {
                let q: quarantine::Quarantine =
                    serde_json::from_value(q.clone()).map_err(|e| unreadable(e.to_string()))?;
                incident(q.cause);
            }
        } else if RUNS.contains(&r.stage) {
            oom += u64::from(has(".oom"));
            deadline += u64::from(has("deadline"));
        }
    }
    c.oom_kills = oom;
    c.deadline_kills = deadline;
    Ok(c)
}

/// Where this reap looks and keeps its receipt.
struct Place {
    store: Store,
    key_dir: PathBuf,
    surface_state: Option<PathBuf>,
}

/// Why a reap cannot start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
enum StartError {
    /// The wrong user for the policy's surface: root for a service user's, or a user for
    /// per-run accounts'.
    #[error("cordon-reap --surface: {0}")]
    #[diagnostic(
        code(cordon::reap::surface_root),
        help(
            "a service user's runs are reaped as that user (the surface's own timer does); per-run accounts' as root"
        )
    )]
    SurfaceUser(String),
    /// The policy has no usable surface stage.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] cordon_stage::bundle::PlanError),
    /// The store or the state directory cannot be used.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] cordon::store::StoreError),
    /// The state directory cannot be used.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(#[from] LeaseError),
    /// The policy's pins could not be read for the collector.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Pins(#[from] cordon::canonical::CanonicalError),
    /// The collection could not run.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Gc(#[from] cordon::gc::GcError),
}

impl ExitClass for StartError {
    /// Root for the surface and a policy without one are wiring errors (2); a store or state
    /// directory that cannot be used is a no-decision (3).
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::SurfaceUser(_) => ExitCode::Usage,
            Self::Plan(e) => e.exit_class(),
            Self::Store(e) => e.exit_class(),
            Self::Lease(_) | Self::Pins(_) | Self::Gc(_) => ExitCode::NoDecision,
        }
    }
}

/// The surface's state directory, its lease setup and its own store and key.
fn surface_place(
    policy: &Policy,
    policy_path: &Path,
    per_run_state: Option<&Path>,
) -> Result<(Place, rootless::Setup), StartError> {
    let uid = nix::unistd::geteuid().as_raw();
    let state = if uid == 0 {
        let (stage, block) = cordon_stage::surface::surface_of(policy)?;
        if stage.user != cordon_policy_lang::User::PerRun || per_run_state.is_some() {
            return Err(StartError::SurfaceUser(
                "a service user's runs are never reaped as root".into(),
            ));
        }
        // Root acts on what the policy names: no one but root may be able to change it.
        cordon::lease::per_run::root_only(policy_path).map_err(StartError::SurfaceUser)?;
        let state = PathBuf::from(&block.state_dir);
        cordon::lease::per_run::existing_state(&state)?;
        state
    } else {
        let state = cordon_stage::surface::state_dir_for(policy, per_run_state, uid)
            .map_err(StartError::SurfaceUser)?;
        rootless::existing_private_dir(&state)?;
        state
    };
    let setup = rootless::Setup {
        runtime: Runtime {
            binary: PathBuf::from(policy.runtime().path()),
            state_root: state.join(rootless::RUNTIME_STATE),
            host: cordon::host::Linux::shared(),
        },
        state: state.clone(),
        uid,
        exit_grace: rootless::EXIT_GRACE,
        watchdog: PathBuf::from("/proc/self/exe"),
    };
    let place = Place {
        store: Store::open(&state.join(rootless::RECEIPTS))?,
        key_dir: state.join(rootless::KEYS),
        surface_state: Some(state),
    };
    Ok((place, setup))
}

/// Root's recovery of per-run surface runs: each account's runs released by this binary run
/// as the account ([`cordon::lease::per_run`]), then the run ended (workspace back, account
/// and its state removed). Looking changes nothing: every run not ended is residue.
fn per_run(args: &Args, policy: &Policy, state: &Path, change: bool) -> Result<Found, LeaseError> {
    use cordon::lease::per_run;
    let host = cordon::host::Linux::shared();
    let accounts = cordon_stage::settings::account_policy(policy);
    let mut f = Found {
        released: Vec::new(),
        active: Vec::new(),
        residue: Vec::new(),
        cleared: None,
        stale: 0,
    };
    // The child reap is given the policy by its canonical path (it runs from /).
    let policy_path =
        std::fs::canonicalize(&args.stage.policy).map_err(|source| LeaseError::Io {
            op: "resolve",
            path: args.stage.policy.clone(),
            source,
        })?;
    for (record, live) in per_run::pending(state)? {
        let name = &record.account.name;
        if live {
            f.active.push(format!(
                "per-run account {name} (its supervisor holds the run of {})",
                record.workspace.display()
            ));
            continue;
        }
        f.stale += 1;
        if !change {
            f.residue.push(format!(
                "per-run account {name} holds workspace {}",
                record.workspace.display()
            ));
            continue;
        }
        let own = per_run::account_state(state, &record.account);
        if own.is_dir() {
            let mut tool = cordon::host::Tool::new("/proc/self/exe", &[]);
            tool.tool_path = false;
            tool.args = vec![
                "--policy".into(),
                policy_path.clone().into(),
                "--surface".into(),
                "--per-run-state".into(),
                own.into(),
            ];
            tool.user = Some((record.account.uid, record.account.gid));
            tool.dir = Some(PathBuf::from("/"));
            match host.run(&tool) {
                Ok(out) if out.success() => {}
                Ok(out) => {
                    f.residue.push(format!(
                        "per-run account {name}'s runs are not released (its reap exited {:?})",
                        out.code
                    ));
                    continue;
                }
                Err(e) => {
                    f.residue
                        .push(format!("per-run account {name}'s reap could not run: {e}"));
                    continue;
                }
            }
        }
        match per_run::end(&*host, &accounts, state, &record) {
            Ok(()) => f.released.push(format!(
                "per-run account {name} removed, workspace {} returned",
                record.workspace.display()
            )),
            Err(e) => f.residue.push(format!(
                "per-run account {name} not ended: {}",
                cordon_stage::receipt_io::error_chain(&e)
            )),
        }
    }
    Ok(f)
}

/// This boot's clock, through the runtime's host seam.
fn now(runtime: &Runtime) -> Result<BootTime, LeaseError> {
    BootTime::now(&*runtime.host).map_err(|source| LeaseError::Io {
        op: "read the boot clock and",
        path: PathBuf::from(BOOT_ID),
        source,
    })
}

/// Recover or look: the surface's runs, or the host's leases (as their sole manager, or
/// beside a live one).
fn found(args: &Args, policy: &Policy) -> Result<(Place, Result<Found, LeaseError>), StartError> {
    let change = !args.check && !args.status && args.quarantine.is_none();
    if args.surface {
        let (place, setup) =
            surface_place(policy, &args.stage.policy, args.per_run_state.as_deref())?;
        if setup.uid == 0 {
            let result = per_run(args, policy, &setup.state, change);
            return Ok((place, result));
        }
        // The surface's runs share one quarantine, kept in its own store.
        let scope = rootless::QUARANTINE_SCOPE;
        if let Some(why) = &args.quarantine
            && let Err(e) = operator_quarantine(&place.store, scope, why)
        {
            return Ok((place, Err(e)));
        }
        let result = now(&setup.runtime)
            .and_then(|now| as_surface(&setup, change, &now))
            .and_then(|mut f| {
                // Residue recovery could not remove stops new runs until it is proven gone.
                if change && !f.residue.is_empty() {
                    let why = f.residue.join("; ");
                    let line = quarantine::impose_on_executor(
                        &place.store,
                        scope,
                        quarantine::Cause::Residue,
                        &why,
                        None,
                    );
                    f.residue.push(line);
                }
                match &args.clear {
                    Some(id) => lift_if_quiet(f, &place.store, scope, id),
                    None => Ok(f),
                }
            });
        return Ok((place, result));
    }
    // A check or a status only reads: it never makes a store where none is (a mistyped path
    // would otherwise answer "quiescent").
    let root = args.stage.store_root(policy);
    let place = Place {
        store: if change {
            Store::open(&root)?
        } else {
            Store::open_existing(&root)?
        },
        key_dir: PathBuf::from(stage::KEY_DIR),
        surface_state: None,
    };
    let setup = args.lease.setup(policy);
    if let Some(why) = &args.quarantine
        && let Err(e) = operator_quarantine(&place.store, &setup.executor, why)
    {
        return Ok((place, Err(e)));
    }
    let result = match Manager::open(&place.store, setup.clone()) {
        Ok(m) => match &args.clear {
            Some(id) => clear(&m, &place.store, &setup.executor, id),
            None => as_manager(&m, change),
        },
        // A lift needs the executor to itself: beside a live supervisor it is refused (Busy).
        Err(LeaseError::Busy { .. }) if args.clear.is_none() => now(&setup.runtime)
            .and_then(|now| as_observer(&Observer::new(&place.store, setup), change, &now)),
        Err(e) => Err(e),
    };
    Ok((place, result))
}

/// `--list`: every lease record in the store and every executor lock on the host, read only.
fn list(args: &Args, policy: &Policy, stdout: &mut dyn Write) -> Result<(), StartError> {
    let store = Store::open_existing(&args.stage.store_root(policy))?;
    let host = cordon::host::Linux;
    let mut out = String::new();
    for r in cordon::lease::read_all_records(&store)? {
        let live = match r.supervisor.alive(&host) {
            Ok(true) => "live",
            Ok(false) => "gone",
            Err(_) => "unknown",
        };
        out += &format!(
            "lease {} executor {} supervisor pid {} ({live}) created {} authority {}{}\n",
            r.lease,
            r.executor,
            r.supervisor.pid,
            r.created_at,
            r.authority,
            r.candidate
                .map_or_else(String::new, |c| format!(" candidate {c}"))
        );
    }
    let lock_dir = args.lease.setup(policy).lock_dir;
    let mut locks: Vec<std::path::PathBuf> = std::fs::read_dir(&lock_dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    locks.sort();
    for path in locks {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(executor) = name.strip_suffix(".lock") else {
            continue;
        };
        let holders = std::fs::File::open(&path)
            .map(|f| cordon::lease::lock_holders(&f))
            .unwrap_or_default();
        let held = if holders.is_empty() {
            "free".to_owned()
        } else {
            let pids: Vec<String> = holders.iter().map(ToString::to_string).collect();
            format!("held by pid {}", pids.join(", "))
        };
        // A name starting with a dot is a host lock (the GPU lock), not an executor's.
        let what = if executor.starts_with('.') {
            "host lock"
        } else {
            "executor"
        };
        out += &format!("{what} {executor} {held}\n");
    }
    // Names from the store and the lock directory: escaped before the terminal.
    let _ = stdout.write_all(cordon::text::terminal(&out).as_bytes());
    Ok(())
}

/// `--gc [--dry-run]`: what no record names, listed on stdout and (unless dry) removed while the
/// store is held exclusive; the count and size said on stderr.
fn gc(
    args: &Args,
    policy: &Policy,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), StartError> {
    let store = Store::open_to_collect(&args.stage.store_root(policy))?;
    // The policy's pins (images, the pristine tree) stay whether or not a receipt names them.
    let pins = policy.canonical_json()?;
    // Held before the mark, so nothing is named between the plan and the sweep.
    let held = if args.dry_run {
        None
    } else {
        Some(store.hold_exclusive()?)
    };
    let plan = cordon::gc::plan(&store, &[pins.as_bytes()])?;
    let line = |e: &cordon::gc::Entry| format!("{} {}\n", e.path, e.bytes);
    match &held {
        None => {
            for e in &plan.remove {
                let _ = stdout.write_all(line(e).as_bytes());
            }
        }
        Some(held) => cordon::gc::sweep(&store, &plan, held, |e| {
            let _ = stdout.write_all(line(e).as_bytes());
        })?,
    }
    for path in &plan.unknown {
        cordon::voice::say(
            stderr,
            cordon::voice::Level::Normal,
            &format!("cordon-reap: left alone, not an entry the store writes: {path}"),
        );
    }
    let total: u64 = plan.remove.iter().map(|e| e.bytes).sum();
    cordon::voice::say(
        stderr,
        cordon::voice::Level::Normal,
        &format!(
            "cordon-reap: gc {} {} entries ({} apparent) no record names; kept {} named and all evidence",
            if args.dry_run {
                "would remove"
            } else {
                "removed"
            },
            plan.remove.len(),
            cordon::voice::bytes(total),
            plan.kept
        ),
    );
    Ok(())
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    cordon::voice::set_level(args.stage.level());
    let mode = args.stage.diagnostics;
    // The surface's runs are its service user's; every other lease is root's.
    if !args.surface
        && let Err(code) = cordon_stage::start::require_root(
            &cordon_stage::start::RootStage {
                tool: "cordon-reap",
                why: "the leases it checks and releases are root's (use --surface for the surface's runs)",
                stage: (!args.list && !args.gc).then_some(StageName::Reap),
                policy: &args.stage.policy,
            },
            mode,
            stdout,
            stderr,
        )
    {
        return code;
    }
    let (loaded, authority) =
        match cordon_stage::start::stage_start(&args.stage.policy, mode, stderr) {
            Ok(s) => (s.loaded, s.authority),
            Err(code) => return code,
        };
    let policy = &loaded.policy;
    if args.list || args.gc {
        let done = if args.list {
            list(args, policy, stdout)
        } else {
            gc(args, policy, stdout, stderr)
        };
        return match done {
            Ok(()) => ExitCode::Ok,
            Err(e) => fail(&e, mode, stderr),
        };
    }
    let (place, result) = match found(args, policy) {
        Ok(f) => f,
        Err(e) => {
            // A store that cannot be opened still gets its no-decision said on stdout; a
            // missing one is the operator's typo (exit 2), and says so alone.
            if let StartError::Store(store) = &e
                && !matches!(store, cordon::store::StoreError::Missing { .. })
            {
                stage::print_unkept(
                    StageName::Reap,
                    authority,
                    (stage::UNUSABLE, &stage::error_chain(&e)),
                    stdout,
                );
            }
            return fail(&e, mode, stderr);
        }
    };
    // `--clear` of an id no quarantine has is the operator's typo: no receipt, exit 2.
    if let Err(e @ LeaseError::NoQuarantine { .. }) = &result {
        report_diagnostic(e, mode, stderr);
        return ExitCode::Usage;
    }
    let mut receipt = Receipt::new(cordon::receipt::StageName::Reap, authority, Outcome::Ok);
    let inputs = ReapInputs {
        executor: args.lease.executor(policy),
        check: args.check,
        status: args.status,
        sweep: args.sweep,
        surface_state: place.surface_state.clone(),
        clear: args.clear.clone(),
        quarantine: args.quarantine.clone(),
    };
    if let Err(e) = receipt.set_inputs(&inputs) {
        return fail(&e, mode, stderr);
    }
    let reasons = |code: &str, items: &[String]| -> Vec<Reason> {
        items
            .iter()
            .map(|l| Reason {
                code: code.into(),
                message: l.clone(),
            })
            .collect()
    };
    // The quarantines in force after this run (the surface's are in its own store).
    let quarantined = quarantine::in_force(&place.store);
    let counted = |f: Found| -> Result<(Found, BTreeMap<_, _>, Option<Counters>), LeaseError> {
        let quarantined = quarantined?;
        let counters = if args.status || args.quarantine.is_some() {
            Some(counters(&place.store, &quarantined, f.stale)?)
        } else {
            None
        };
        Ok((f, quarantined, counters))
    };
    let (code, outputs, failed) = match result.and_then(counted) {
        Ok((f, quarantined, counters)) => {
            let quiescent = f.active.is_empty() && f.residue.is_empty();
            let alarms: Vec<String> = quarantined
                .iter()
                .map(|(id, q)| {
                    format!(
                        "{} is quarantined ({}, record {id}): {}",
                        q.scope,
                        q.cause.as_str(),
                        q.why
                    )
                })
                .collect();
            // --status and --sweep raise no alarm for live leases; the strict check and
            // recovery do. A quarantine in force is an alarm in every mode.
            let code = if f.residue.is_empty()
                && alarms.is_empty()
                && (args.status || args.sweep || args.quarantine.is_some() || f.active.is_empty())
            {
                ExitCode::Ok
            } else {
                receipt.outcome = Outcome::NoDecision;
                receipt.reasons = reasons("reap.residue", &f.residue);
                receipt.reasons.extend(reasons("reap.active", &f.active));
                receipt.reasons.extend(reasons("reap.quarantined", &alarms));
                ExitCode::NoDecision
            };
            let outputs = ReapOutputs {
                quiescent,
                released: Some(f.released),
                active: Some(f.active),
                remaining: f.residue,
                gone: Vec::new(),
                quarantined,
                cleared: f.cleared,
                counters,
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
                gone: Vec::new(),
                ..ReapOutputs::default()
            };
            (ExitCode::NoDecision, outputs, Some(e))
        }
    };
    if let Err(e) = receipt.set_outputs(&outputs) {
        return fail(&e, mode, stderr);
    }
    // A recovery a signal reached ran to its end (the signal never cuts a release short), but
    // its receipt says it was asked to stop.
    let interrupted = stage::stamp_interrupted(&mut receipt);
    let emitted = stage::emit_signed(&place.store, &place.key_dir, &mut receipt, stdout);
    // Reported once the receipt is safe.
    if let Some(e) = &failed {
        report_diagnostic(e, mode, stderr);
    }
    if let Some(e) = interrupted {
        report_diagnostic(&e, mode, stderr);
    }
    if let (Ok(digest), Diagnostics::Text) = (&emitted, mode) {
        // The residue and alarms were said by nothing else.
        stage::summary(&receipt, digest, failed.is_none(), stderr);
    }
    match (emitted, interrupted) {
        // A recovery on a read-only store kept nothing: emitting made it a no-decision.
        (Ok(_), None) if receipt.outcome == Outcome::NoDecision => ExitCode::NoDecision,
        (Ok(_), None) => code,
        (Ok(_), Some(_)) => ExitCode::NoDecision,
        (Err(e), _) => fail(&e, mode, stderr),
    }
}

/// The whole of `cordon-reap`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdio(cordon_stage::args::parse::<Args>, run)
}
