//! `cordon-surface` started as root under `user "per-run"` (REQ-117): every run in a fresh
//! account ([`cordon::lease::per_run`]). Root checks what it reads, makes the account, hands it
//! the workspace and the selected skill versions, and runs this same binary as the account
//! ([`PER_RUN_STATE_ARG`]), which takes the rootless path unchanged in the account's own state
//! directory. Root then ends the run (workspace back, account gone) and issues the receipt of
//! record from the account's: the same inputs, outputs and verdict, the account named in
//! `outputs.user`, stored in the surface's (root's) store and signed with its key. Whatever
//! root cannot end is residue: a no-decision, the record left for `cordon-reap --surface`.
//!
//! Root never runs the sandbox itself and never reads the workspace's contents: it only
//! examines and re-owns entries through [`cordon::walk`].

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon::ExitCode;
use cordon::host::Tool;
use cordon::inputs::SurfaceInputs;
use cordon::lease::per_run;
use cordon::lease::{LeaseError, rootless};
use cordon::receipt::{Decision, Outcome, Reason, Receipt, Rejection, StageName};
use cordon::run_cgroup;
use cordon::signing::HostKey;
use cordon::store::Store;
use cordon_stage::args::fail;
use cordon_stage::receipt_io::finish_signed;
use cordon_stage::settings::account_policy;
use cordon_stage::start::stage_start;
use cordon_stage::surface::{Tier, limits_of, surface_of};

use crate::cli::{Args, Command, SkillsCommand};
use crate::run::RunError;
use crate::{skills, trust};

/// The argument that runs this binary as a per-run account's surface: its state directory,
/// `STATE/per-run/<account>`. Root passes it; no one else can make the directory it names.
pub const PER_RUN_STATE_ARG: &str = "per-run-state";

/// The byte root writes to the account's surface once it is in the run's cgroup: until then it
/// does nothing ([`await_release`]).
pub const RELEASE: u8 = b'g';

/// The account's side of the release: block until root writes [`RELEASE`] on stdin.
///
/// # Errors
/// Root closed the pipe, or wrote anything else: root did not place this process.
pub fn await_release(stdin: &mut dyn std::io::Read) -> Result<(), String> {
    let mut byte = [0u8; 1];
    match stdin.read_exact(&mut byte) {
        Ok(()) if byte[0] == RELEASE => Ok(()),
        Ok(()) => Err("root released this run with an unknown byte".into()),
        Err(e) => Err(format!("root did not release this run ({e})")),
    }
}

/// Why root could not run or end a per-run run.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PerRunError {
    /// The account's lease.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(#[from] LeaseError),
    /// The account's surface did not give a receipt this run can stand on.
    #[error("the per-run account's surface {0}")]
    #[diagnostic(code(cordon::surface::per_run))]
    Child(String),
    /// The run's cgroup (its limits) could not be prepared, joined or removed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Cgroup(#[from] run_cgroup::CgroupError),
    /// The account's surface decided no-decision; its reasons.
    #[error("{0}")]
    #[diagnostic(code(cordon::surface::per_run))]
    NoDecision(String),
}

impl cordon_stage::receipt_io::Infrastructure for PerRunError {
    fn reason_code(&self) -> &'static str {
        "surface.infrastructure"
    }
}

/// The whole of `cordon-surface` as root.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let mode = args.diagnostics;
    let ws = match &args.command {
        Command::Run { workspace, .. } => Some(workspace.as_path()),
        Command::Key | Command::Skills(_) => None,
    };
    // Root reads it: no one but root may be able to change it, or what it names.
    let policy_path = match trust::root_only(&args.policy) {
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
    if stage.user != cordon_policy_lang::User::PerRun {
        let _ = writeln!(
            stderr,
            "cordon-surface: refusing to run as root: this policy's surface runs as its unprivileged service user (user \"service\"); root runs only user \"per-run\""
        );
        return ExitCode::Usage;
    }
    let state = PathBuf::from(&block.state_dir);
    if let Err(e) = trust::state_dir_mode(&state, ws, 0, per_run::STATE_MODE) {
        return fail(&RunError::from(e), mode, stderr);
    }
    match &args.command {
        Command::Key => match HostKey::load_or_create(&state.join(rootless::KEYS)) {
            Ok(k) => {
                let _ = writeln!(stdout, "{}", k.public());
                ExitCode::Ok
            }
            Err(e) => fail(&e, mode, stderr),
        },
        // Root copies only a tree no one else can change under it (a parent re-pointed mid-copy
        // would import what root can read).
        Command::Skills(SkillsCommand::Import { dir }) => match trust::root_only(dir)
            .map_err(|e| skills::SkillError::Spec(e.to_string()))
            .and_then(|dir| skills::import(&state, &dir))
        {
            Ok(selected) => {
                let _ = writeln!(stdout, "{selected}");
                ExitCode::Ok
            }
            Err(e) => fail(&e, mode, stderr),
        },
        Command::Run {
            workspace,
            tier,
            skills: requested,
            argv,
        } => {
            let workspace = match owned_workspace(workspace) {
                Ok(w) => w,
                Err(e) => return fail(&RunError::from(e), mode, stderr),
            };
            let selected = match requested
                .iter()
                .map(|s| skills::parse(s))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|s| skills::check(&state, &s).map(|()| s))
            {
                Ok(s) => s,
                Err(e) => return fail(&e, mode, stderr),
            };
            let store = match Store::open(&state.join(rootless::RECEIPTS)) {
                Ok(s) => s,
                Err(e) => return fail(&e, mode, stderr),
            };
            let mut child_args: Vec<OsString> = vec![
                "--policy".into(),
                policy_path.clone().into(),
                "--diagnostics".into(),
                arg_name(&mode).into(),
                format!("--{PER_RUN_STATE_ARG}").into(),
                OsString::new(),
                "run".into(),
                "--workspace".into(),
                workspace.path.clone().into(),
                "--tier".into(),
                arg_name(tier).into(),
            ];
            for s in &selected {
                child_args.extend(["--skill".into(), s.to_string().into()]);
            }
            child_args.push("--".into());
            child_args.extend(argv.iter().map(OsString::from));
            let deadline = Duration::from_millis(stage.deadline_ms);
            let mut receipt = Receipt::new(StageName::Surface, started.authority, Outcome::Ok);
            let inputs = SurfaceInputs {
                workspace: workspace.path.clone(),
                tier: (*tier).into(),
                argv: argv.clone(),
                skills: selected.iter().map(ToString::to_string).collect(),
            };
            let Ok(expected) = serde_json::to_value(&inputs) else {
                let _ = writeln!(stderr, "cordon-surface: cannot encode the run's inputs");
                return ExitCode::NoDecision;
            };
            let tier: Tier = (*tier).into();
            let crossing: Vec<String> = block
                .pass_env
                .iter()
                .chain(block.agent_env.iter().filter(|_| tier == Tier::Agent))
                .cloned()
                .collect();
            let result = supervise(
                policy,
                &state,
                &workspace,
                &selected,
                child_args,
                (&expected, &crossing),
                deadline,
                &mut receipt,
                stderr,
            );
            finish_signed(
                &store,
                &state.join(rootless::KEYS),
                &mut receipt,
                result,
                (mode, stdout, stderr),
            )
        }
    }
}

/// A value's name on the command line.
fn arg_name(v: &impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

/// The workspace as root sees it: checked as the trust module checks a service user's, for its
/// owner, which may not be root.
fn owned_workspace(path: &Path) -> Result<trust::Workspace, trust::TrustError> {
    let owner = std::fs::symlink_metadata(path)
        .map_err(|source| trust::TrustError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .uid();
    if owner == 0 {
        return Err(trust::TrustError::Workspace {
            path: path.to_path_buf(),
            why: "owned by root: a per-run run hands its workspace to the account, and a root directory is never handed over".into(),
        });
    }
    trust::workspace(path, owner)
}

/// One per-run run: begin (account, state, skills, workspace), the account's surface, end;
/// `receipt` given the account's inputs when they are `expected`; `crossing`, the variables
/// the account's surface may be given.
#[allow(clippy::too_many_arguments)]
fn supervise(
    policy: &cordon_policy_lang::Policy,
    state: &Path,
    workspace: &trust::Workspace,
    selected: &[skills::Selected],
    mut child_args: Vec<OsString>,
    (expected, crossing): (&serde_json::Value, &[String]),
    deadline: Duration,
    receipt: &mut Receipt,
    stderr: &mut dyn Write,
) -> Result<Decision<serde_json::Value>, PerRunError> {
    let host = cordon::host::Linux::shared();
    let accounts = account_policy(policy);
    // Known before anything is begun: every error after `begin` ends the run.
    let limits = limits_of(
        surface_of(policy)
            .map_err(|e| PerRunError::Child(e.to_string()))?
            .0,
    );
    let run = format!("cs-{}", &cordon::lease::fresh_id()[..20]);
    let tag = cordon::account::owner_tag("surface", state);
    // The record of the agent directories the earlier accounts made, for this one to prove.
    let homes = trust::homes_record(Path::new(""), &workspace.path);
    let begun = per_run::begin(
        &*host,
        &accounts,
        state,
        &tag,
        (&workspace.path, (workspace.dev, workspace.ino)),
        &run,
        &[homes],
    )?;
    let record = &begun.record;
    let own = per_run::account_state(state, &record.account);
    child_args[5] = own.clone().into();
    let mut cgroup = None;
    let ran = install(state, &own, selected)
        .and_then(|()| Ok(per_run::give_state(state, record)?))
        .and_then(|()| {
            if !limits.is_empty() {
                let root = Path::new(run_cgroup::ROOT);
                let account = (record.account.uid, record.account.gid);
                cgroup = Some(run_cgroup::prepare(
                    &host,
                    root,
                    &record.account.name,
                    &limits,
                    account,
                )?);
            }
            Ok(())
        })
        .and_then(|()| {
            let mut tool = Tool::new("/proc/self/exe", &[]);
            tool.args = child_args;
            tool.tool_path = false;
            // Of the invoker's environment only what the policy lets cross into this tier's run
            // goes to the account's surface (which filters again): nothing else of root's is
            // readable in the account's process.
            tool.env = std::env::vars_os()
                .filter(|(k, _)| crossing.iter().any(|c| k == c.as_str()))
                .collect();
            tool.user = Some((record.account.uid, record.account.gid));
            tool.dir = Some(PathBuf::from("/"));
            // Its own deadline ends the sandbox; this one ends a surface that hangs past it.
            tool.timeout = deadline + Duration::from_secs(120);
            let mut child = host
                .spawn(&tool, cordon::host::Stdin::Pipe)
                .map_err(|e| PerRunError::Child(format!("could not be run: {e}")))?;
            // It waits for one byte before it does anything: it is released only once it is
            // in the run's cgroup, so nothing it starts is outside the limits.
            let placed = match &cgroup {
                Some(cg) => u32::try_from(child.pid())
                    .map_err(|e| PerRunError::Child(e.to_string()))
                    .and_then(|pid| Ok(cg.join(pid)?)),
                None => Ok(()),
            }
            .and_then(|()| {
                let mut go = child.stdin.take().ok_or_else(|| {
                    PerRunError::Child("was started without the pipe that releases it".into())
                })?;
                go.write_all(&[RELEASE])
                    .map_err(|e| PerRunError::Child(format!("could not be released: {e}")))
            });
            if let Err(e) = placed {
                // Unreleased, it has run nothing; it ends here.
                let _ = child.kill();
                drop(child.stdin.take());
                let _ = cordon::host::collect(child, &tool);
                return Err(e);
            }
            cordon::host::collect(child, &tool)
                .map_err(|e| PerRunError::Child(format!("could not be run: {e}")))
        });
    // What the kernel counted against the limits, read before the end removes the cgroup.
    let held = cgroup.as_ref().map(run_cgroup::RunCgroup::accounting);
    // Ended whatever the account's surface did: a run that cannot be ended is residue; so is a
    // cgroup that cannot be removed once no process of the account is left.
    let ended = per_run::end(&*host, &accounts, state, record);
    let out = ran?;
    // The account's stderr can carry what its sandbox wrote: escaped before the terminal.
    let _ =
        stderr.write_all(cordon::text::terminal(&String::from_utf8_lossy(&out.stderr)).as_bytes());
    ended?;
    let theirs = Receipt::parse(String::from_utf8_lossy(&out.stdout).trim()).map_err(|e| {
        PerRunError::Child(format!("exited {:?} without a receipt ({e})", out.code))
    })?;
    // Root signs only what it asked for: the account's receipt must be of this authority and
    // record exactly these inputs. Its outputs and verdict are the account's surface's, as
    // trusted as the service user's surface is in the rootless mode.
    // Its exit status must be the one its receipt's outcome has.
    let code = match theirs.outcome {
        Outcome::Ok => 0,
        Outcome::Rejected => 1,
        Outcome::NoDecision => 3,
    };
    if theirs.authority != receipt.authority
        || theirs.stage != StageName::Surface
        || theirs.inputs != *expected
        || out.code != Some(code)
    {
        return Err(PerRunError::Child(
            "gave a receipt of another authority, stage or inputs than root asked for, or exited otherwise than it says".into(),
        ));
    }
    receipt.inputs = theirs.inputs;
    let mut outputs = theirs.outputs;
    if let Some(user) = outputs.get_mut("user").and_then(|u| u.as_object_mut()) {
        user.insert("account".into(), record.account.name.clone().into());
    }
    // The limits root held the run to, and what the kernel counted against them.
    if let (Some(held), Some(o)) = (held, outputs.as_object_mut()) {
        let mut limits = serde_json::to_value(&limits).unwrap_or_default();
        if let (Some(l), Some(h)) = (limits.as_object_mut(), held.as_object()) {
            l.extend(h.clone());
        }
        o.insert("limits".into(), limits);
    }
    match theirs.outcome {
        Outcome::Ok => Ok(Decision::Accepted(outputs)),
        Outcome::Rejected => Ok(Decision::Rejected(Rejection {
            findings: theirs.reasons,
            evidence: outputs,
        })),
        Outcome::NoDecision => Err(PerRunError::NoDecision(
            theirs
                .reasons
                .iter()
                .map(|r: &Reason| format!("{}: {}", r.code, r.message))
                .collect::<Vec<_>>()
                .join("; "),
        )),
    }
}

/// The selected skill versions, copied from the surface's store into the account's state
/// (still root's), each verified against its digest on the way.
fn install(state: &Path, own: &Path, selected: &[skills::Selected]) -> Result<(), PerRunError> {
    for s in selected {
        let stored = state.join(skills::SKILLS).join(s.digest.hex());
        let copied = skills::import(own, &stored)
            .map_err(|e| PerRunError::Child(format!("could not be given skill {s}: {e}")))?;
        if copied.digest != s.digest {
            return Err(PerRunError::Child(format!(
                "was given skill {s}, which the store no longer holds intact"
            )));
        }
    }
    Ok(())
}
