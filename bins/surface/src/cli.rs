//! The `cordon-surface` command.
//!
//! - `cordon-surface run --workspace DIR [--tier agent|command] [--policy P] -- ARGV…` runs
//!   ARGV in the policy's surface (see [`crate::run`]) and prints one receipt on stdout: `ok`
//!   (exit 0) when ARGV exited 0, `rejected` (exit 1, `surface.exit` or `surface.deadline`)
//!   when it did not, `no-decision` (exit 3) when the surface could not be established or
//!   released — and then ARGV either never ran or its run is residue. A usage or policy error
//!   is exit 2 with no receipt. There is no way to run ARGV outside the surface.
//!   `--skill NAME@sha256:…` (repeatable) exposes those imported skill versions read-only.
//! - `cordon-surface key [--policy P]` prints the public key the surface signs with.
//! - `cordon-surface skills import DIR` stores a skill version and prints its selection.
//!
//! Runs whose supervisor died are released by `cordon-reap --surface --policy P`, run as the
//! service user: the surface's runs live on the rootless lease ([`cordon::lease::rootless`]).
//!
//! Every receipt is stored in the state directory's own store (`store/receipts/`) and signed
//! with the surface's own key (`keys/`): the service user holds neither the host's store nor
//! its key. `cordon-verify --store STATE/store --key "$(cordon-surface key)" RECEIPT` replays it.
//!
//! The policy comes only from `--policy` (default `/etc/cordon/surface.kdl`), never from the
//! environment or the workspace, and is refused when the service user could change it. The
//! surface runs as the invoking user; as root it runs only a policy of `user "per-run"`, each
//! run as a fresh account ([`crate::perrun`]), and refuses every other.

use cordon::exit::ExitClass;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use cordon::ExitCode;
use cordon::canonical::domain_digest;
use cordon::inputs::{SurfaceInputs, SurfaceOutputs, UserMapping};
use cordon::receipt::{Decision, Outcome, Reason, Receipt, Rejection, StageName};
use cordon::runtime::Runtime;
use cordon::signing::HostKey;
use cordon::store::Store;
use cordon_policy_lang::StageKind;
use cordon_stage::args::{Diagnostics, fail};
use cordon_stage::receipt_io::finish_signed;
use cordon_stage::start::stage_start;
use cordon_stage::surface::{Tier, limits_of, surface_of};

use crate::run::{self, Host, Ran, Request, RunError};
use crate::trust;
use cordon::lease::rootless;

/// The surface policy read when `--policy` is not given (the NixOS module installs it).
pub const DEFAULT_SURFACE_POLICY: &str = "/etc/cordon/surface.kdl";

/// Run an agent or one of its commands bounded by its workspace.
#[derive(Debug, Parser)]
#[command(name = "cordon-surface", version, about)]
pub struct Args {
    /// The policy file (the operator's; never one inside a workspace).
    #[arg(long, default_value = DEFAULT_SURFACE_POLICY, global = true)]
    pub policy: PathBuf,
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text, global = true)]
    pub diagnostics: Diagnostics,
    /// Root's, under `user "per-run"`: the per-run account's own state directory, where this
    /// process (the account) keeps its run ([`crate::perrun`]).
    #[arg(long = crate::perrun::PER_RUN_STATE_ARG, hide = true, global = true)]
    pub per_run_state: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run ARGV in the surface.
    Run {
        /// The run's project workspace (the service user's own directory).
        #[arg(long)]
        workspace: PathBuf,
        /// The agent itself (`agent`: its provider variables cross) or one of its shell
        /// commands (`command`: they never do).
        #[arg(long, value_enum, default_value_t = TierArg::Command)]
        tier: TierArg,
        /// A skill version for the run, `NAME@sha256:<hex>` as `skills import` printed it
        /// (repeatable): copied into the run's own snapshot, bound read-only at the policy's
        /// `skills` path, removed with the run.
        #[arg(long = "skill", value_name = "NAME@DIGEST")]
        skills: Vec<String>,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Print the public key the surface signs its receipts with (`ed25519:<hex>`, made on
    /// first use), for `cordon-verify --key`.
    Key,
    /// The skill store in the state directory (outside every workspace).
    #[command(subcommand)]
    Skills(SkillsCommand),
}

/// `cordon-surface skills …`.
#[derive(Debug, clap::Subcommand)]
pub enum SkillsCommand {
    /// Store the skill in DIR (named by DIR's last component) as an immutable version and
    /// print its selection, `NAME@sha256:<hex>`, for `run --skill`.
    Import {
        /// The skill's directory: regular files and directories only.
        dir: PathBuf,
    },
}

/// `--tier`: which run of an agent this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TierArg {
    /// The agent process: its provider variables cross.
    Agent,
    /// One of its shell commands: they never do.
    Command,
}

impl From<TierArg> for Tier {
    fn from(t: TierArg) -> Self {
        match t {
            TierArg::Agent => Self::Agent,
            TierArg::Command => Self::Command,
        }
    }
}

/// Run the command.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let mode = args.diagnostics;
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    if uid == 0 {
        return crate::perrun::run(args, stdout, stderr);
    }
    // A per-run account's surface does nothing until root has placed it in the run's cgroup.
    if args.per_run_state.is_some() {
        if let Err(why) = crate::perrun::await_release(&mut std::io::stdin().lock()) {
            let _ = writeln!(stderr, "cordon-surface: {why}");
            return ExitCode::NoDecision;
        }
    }
    // Groups that cannot be read cannot be proven absent: the run refuses them below.
    let groups: Vec<u32> = match nix::unistd::getgroups() {
        Ok(g) => g.into_iter().map(nix::unistd::Gid::as_raw).collect(),
        Err(e) => {
            let _ = writeln!(
                stderr,
                "cordon-surface: cannot read this process's groups: {e}"
            );
            return ExitCode::NoDecision;
        }
    };
    let mut gids = groups.clone();
    gids.push(gid);
    let workspace = match &args.command {
        Command::Run { workspace, .. } => match trust::workspace(workspace, uid) {
            Ok(w) => Some(w),
            Err(e) => return fail(&RunError::from(e), mode, stderr),
        },
        Command::Key | Command::Skills(_) => None,
    };
    let ws = workspace.as_ref().map(|w| w.path.as_path());
    // Checked before it is read: nothing the service user can change decides the surface.
    let policy_path = match trust::policy_file(&args.policy, ws, uid, &gids) {
        Ok(p) => p,
        Err(e) => return fail(&RunError::from(e), mode, stderr),
    };
    let started = match stage_start(&policy_path, mode, stderr) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let policy = &started.loaded.policy;
    let (stage, block) = match surface_of(policy) {
        Ok(s) => s,
        Err(e) => return fail(&RunError::from(e), mode, stderr),
    };
    let state =
        match cordon_stage::surface::state_dir_for(policy, args.per_run_state.as_deref(), uid) {
            Ok(s) => s,
            Err(why) => {
                let _ = writeln!(stderr, "cordon-surface: {why}");
                return ExitCode::Usage;
            }
        };
    let checked = trust::state_dir(&state, ws, uid)
        .and_then(|()| trust::runtime(Path::new(policy.runtime().path()), uid, &gids))
        .and_then(|()| {
            let guarded = [Some(state.as_path()), ws, Some(Path::new(policy.store()))];
            let mountinfo = Path::new("/proc/self/mountinfo");
            let table =
                std::fs::read_to_string(mountinfo).map_err(|source| trust::TrustError::Io {
                    path: mountinfo.to_path_buf(),
                    source,
                })?;
            let never: Vec<(&Path, &str)> = policy
                .never_mount()
                .map(|n| {
                    (
                        Path::new(n),
                        policy.never_mount_reason(n).unwrap_or_default(),
                    )
                })
                .collect();
            trust::read_set(
                block.read.keys(),
                guarded.into_iter().flatten(),
                &never,
                &table,
            )
        });
    if let Err(e) = checked {
        return fail(&RunError::from(e), mode, stderr);
    }
    let runtime = Runtime {
        binary: PathBuf::from(policy.runtime().path()),
        state_root: state.join(rootless::RUNTIME_STATE),
        host: cordon::host::Linux::shared(),
    };
    let kind = cordon_stage::start::runtime_kind(policy);
    if let Err(e) = runtime.check_version(
        kind,
        &started.runtime.version,
        policy.runtime().min_version(),
    ) {
        return fail(&RunError::from(e), mode, stderr);
    }
    if let Some(what) = cordon_stage::start::undriven(kind) {
        let e = cordon_stage::bundle::PlanError::Unimplemented {
            kind: cordon_policy_lang::StageKind::Surface,
            what,
        };
        return fail(&RunError::from(e), mode, stderr);
    }
    let host = Host {
        lease: rootless::Setup {
            runtime,
            state,
            uid,
            exit_grace: rootless::EXIT_GRACE,
            watchdog: PathBuf::from("/proc/self/exe"),
        },
        gid,
        groups,
        authority: started.authority.to_string(),
    };
    match &args.command {
        Command::Key => match HostKey::load_or_create(&host.lease.state.join(rootless::KEYS)) {
            Ok(k) => {
                let _ = writeln!(stdout, "{}", k.public());
                ExitCode::Ok
            }
            Err(e) => fail(&e, mode, stderr),
        },
        Command::Skills(SkillsCommand::Import { dir }) => {
            match crate::skills::import(&host.lease.state, dir) {
                Ok(selected) => {
                    let _ = writeln!(stdout, "{selected}");
                    ExitCode::Ok
                }
                Err(e) => fail(&e, mode, stderr),
            }
        }
        Command::Run {
            tier, argv, skills, ..
        } => {
            let Some(workspace) = workspace else {
                return ExitCode::Usage;
            };
            let skills = match skills
                .iter()
                .map(|s| crate::skills::parse(s))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(s) => s,
                Err(e) => return fail(&e, mode, stderr),
            };
            // A per-run account's run: its limits hold in the sandbox cgroup root prepared,
            // named for the account (its state directory's name).
            let sandbox_cgroup = args
                .per_run_state
                .as_ref()
                .and_then(|d| d.file_name())
                .map(|n| (n.to_string_lossy().into_owned(), limits_of(stage)))
                .filter(|(_, l)| !l.is_empty());
            let req = Request {
                workspace,
                tier: (*tier).into(),
                argv: argv.clone(),
                invoker_env: std::env::vars_os().collect::<BTreeMap<_, _>>(),
                skills,
                sandbox_cgroup,
            };
            // Opened before the run: a run whose receipt could not be kept never starts.
            let store = match Store::open(&host.lease.state.join(rootless::RECEIPTS)) {
                Ok(s) => s,
                Err(e) => {
                    return fail(&e, mode, stderr);
                }
            };
            let mut receipt = Receipt::new(StageName::Surface, started.authority, Outcome::Ok);
            let inputs = SurfaceInputs {
                workspace: req.workspace.path.clone(),
                tier: req.tier,
                argv: req.argv.clone(),
                skills: req.skills.iter().map(ToString::to_string).collect(),
            };
            if let Err(e) = receipt.set_inputs(&inputs) {
                return fail(&e, mode, stderr);
            }
            let result = match run::run(policy, &host, &req, &store) {
                Err(e) if e.exit_class() == ExitCode::Usage => return fail(&e, mode, stderr),
                result => result
                    .and_then(|ran| outputs(policy, &host, &req, ran))
                    .map(|(out, reason)| match reason {
                        None => Decision::Accepted(out),
                        Some(reason) => Decision::Rejected(Rejection {
                            findings: vec![reason],
                            evidence: out,
                        }),
                    }),
            };
            // The service user cannot write the host's store or hold the host key: the
            // surface keeps its receipts in its own store, signed with its own key.
            finish_signed(
                &store,
                &host.lease.state.join(rootless::KEYS),
                &mut receipt,
                result,
                (mode, stdout, stderr),
            )
        }
    }
}

/// The receipt's outputs, and the rejection reason when ARGV did not exit 0.
fn outputs(
    policy: &cordon_policy_lang::Policy,
    host: &Host,
    req: &Request,
    ran: Ran,
) -> Result<(serde_json::Value, Option<Reason>), RunError> {
    let (stage, block) = surface_of(policy)?;
    let encode = |e: cordon::canonical::CanonicalError| RunError::State {
        what: "encode",
        path: PathBuf::from("the policy"),
        source: std::io::Error::other(e),
    };
    let section =
        policy.canonical_value().map_err(encode)?["stage"][StageKind::Surface.as_str()].clone();
    let surface_policy = domain_digest("cordon.surface-policy", 1, &section).map_err(encode)?;
    let meta = ran.finished.meta.clone();
    let reason = if meta.killed_by_deadline {
        Some(Reason {
            code: "surface.deadline".into(),
            message: format!(
                "the run passed its deadline of {} ms",
                ran.plan.settings.deadline_ms
            ),
        })
    } else if meta.exit_code != Some(0) {
        Some(Reason {
            code: "surface.exit".into(),
            message: match (meta.exit_code, meta.signal) {
                (Some(c), _) => format!("the command exited {c}"),
                (None, Some(s)) => format!("the command was killed by signal {s}"),
                (None, None) => "the command ended without a status".into(),
            },
        })
    } else {
        None
    };
    let out = SurfaceOutputs {
        run: ran.run,
        tier: req.tier,
        workspace: req.workspace.path.clone(),
        workspace_dest: ran.plan.settings.workspace_dest.clone(),
        surface_policy,
        read_set: block.read.keys().cloned().collect(),
        env_names: ran.plan.env_names.clone(),
        network: stage.network.as_str().to_owned(),
        user: UserMapping {
            host_uid: host.lease.uid,
            host_gid: host.gid,
            mapped: 1,
        },
        argv: req.argv.clone(),
        meta,
        stdout: String::from_utf8_lossy(&ran.finished.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&ran.finished.stderr).into_owned(),
        egress: ran.egress,
        egress_unrecorded: ran.egress_unrecorded,
    };
    let out = serde_json::to_value(&out).map_err(|e| RunError::State {
        what: "encode",
        path: PathBuf::from("the receipt's outputs"),
        source: std::io::Error::other(e),
    })?;
    Ok((out, reason))
}

/// The whole of `cordon-surface`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdio(cordon_stage::args::parse::<Args>, run)
}
