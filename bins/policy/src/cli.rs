//! The `cordon-policy` reviewer tool: `check`, `identity`, `diff`, `render`, `explain`.
//!
//! Everything the binary does is here, behind [`run`], writing to the streams it is given, so
//! tests drive the real command without spawning it. Output for pipelines (receipts, JSON) goes
//! to `out`; everything for humans goes to `err`.

use cordon::exit::ExitClass;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::identity;
use cordon::receipt::{Outcome, Receipt, StageName};
use cordon_policy_lang::{ArgCondition, ArgOp, Keyword, Policy, StageKind, SyscallRule, diff};
use cordon_stage::args::{Diagnostics, report_diagnostic};
use cordon_stage::bundle;
use cordon_stage::start::{StartError, components, load, with_runtime};

use crate::render;
use miette::Diagnostic;
use serde_json::json;

/// Review cordon policy files.
#[derive(Debug, Parser)]
#[command(name = "cordon-policy", version, about)]
pub struct Args {
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text, global = true)]
    pub diagnostics: Diagnostics,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The reviewer commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate policy files: exit 0 when all are valid, 2 with every problem otherwise.
    Check {
        /// Policy files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the policy digest, the file's sha256 and the authority identity with its parts.
    Identity {
        /// The policy file.
        file: PathBuf,
        /// Print a receipt-style JSON object on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Semantic diff for reviewers: exit 0 when identical, 1 when different, 2 on error.
    Diff {
        /// The policy before the change.
        old: PathBuf,
        /// The policy after the change.
        new: PathBuf,
    },
    /// Render a reviewed policy for this host: set host facts on their nodes (and nowhere
    /// else), pin the runtime binary by its sha256, validate, refuse any other change, write
    /// OUT (which must not exist) and print the reviewed → rendered diff. Exit 0, or 2.
    Render {
        /// The reviewed policy.
        reviewed: PathBuf,
        /// Where the rendered policy goes (created; never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// The store directory (`store`).
        #[arg(long)]
        store: Option<String>,
        /// The run-directory root (`run-dir`).
        #[arg(long)]
        run_dir: Option<String>,
        /// The runtime binary (`runtime path=`), hashed into `sha256=`.
        #[arg(long)]
        runtime: Option<PathBuf>,
        /// The per-run uid range (`accounts uid-range`).
        #[arg(long, num_args = 2, value_names = ["FIRST", "LAST"])]
        uid_range: Option<Vec<u32>>,
        /// The per-run gid range (`accounts gid-range`).
        #[arg(long, num_args = 2, value_names = ["FIRST", "LAST"])]
        gid_range: Option<Vec<u32>>,
        /// The per-run accounts' shell (`accounts shell`).
        #[arg(long)]
        shell: Option<String>,
        /// The surface's state directory (`stage "surface"` → `surface` → `state-dir`).
        #[arg(long)]
        state_dir: Option<String>,
        /// An egress domain of this deployment (repeatable): together they replace the surface's
        /// `egress` `domain` list, each within the reviewed list (a narrowing only).
        #[arg(long = "egress-domain", value_name = "DOMAIN")]
        egress_domains: Vec<String>,
    },
    /// The fully resolved settings of one stage, defaults filled in.
    Explain {
        /// The policy file.
        file: PathBuf,
        /// The stage kind: prebuild, lane, reference or surface.
        #[arg(long)]
        stage: String,
        /// Print the stage's canonical JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Print the OCI config.json the stage would run with (placeholder run inputs: the
        /// first ids of the range, `TREE`, `LEASE`, …).
        #[arg(long, conflicts_with = "json")]
        bundle: bool,
    },
}

/// A failure of the tool itself, as opposed to a policy problem.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum CliError {
    /// The policy could not be loaded, or the identity established.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Start(#[from] StartError),
    /// `explain` was asked for a stage the policy does not declare.
    #[error("policy declares no stage {stage:?}")]
    #[diagnostic(code(cordon::policy::no_stage), help("declared stages: {declared}"))]
    NoStage {
        /// The stage asked for.
        stage: String,
        /// The stages it has.
        declared: String,
    },
    /// The canonical form could not be produced.
    #[error("cannot encode the canonical form")]
    #[diagnostic(code(cordon::policy::encode))]
    Encode {
        /// The encoder's error.
        #[source]
        source: cordon::canonical::CanonicalError,
    },
    /// A receipt could not be encoded.
    #[error("cannot encode the receipt")]
    #[diagnostic(code(cordon::policy::receipt))]
    Receipt {
        /// The receipt error.
        #[source]
        source: cordon::receipt::ReceiptError,
    },
    /// The stage cannot be planned.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] cordon_stage::bundle::PlanError),
    /// The policy cannot be rendered for this host.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Render(#[from] crate::render::RenderError),
    /// The rendered policy cannot be written.
    #[error("cannot write {path}")]
    #[diagnostic(code(cordon::policy::write))]
    Write {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<identity::IdentityError> for CliError {
    fn from(e: identity::IdentityError) -> Self {
        Self::Start(e.into())
    }
}

impl ExitClass for CliError {
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Start(e) => e.exit_class(),
            Self::Encode { .. } | Self::Receipt { .. } => ExitCode::NoDecision,
            Self::NoStage { .. } | Self::Plan(_) | Self::Render(_) | Self::Write { .. } => {
                ExitCode::Usage
            }
        }
    }
}

/// Print a failure on stderr.
fn report(err: &CliError, mode: Diagnostics, stderr: &mut dyn Write) {
    match err {
        CliError::Start(e) => e.report(mode, stderr),
        other => report_diagnostic(other, mode, stderr),
    }
}

/// Both sides' authorities, hashing the installed binaries once and the runtime once when both
/// policies name the same one.
fn authorities(a: &Policy, b: &Policy) -> Result<(Digest, Digest), StartError> {
    let binaries = identity::installed_binaries(&cordon::host::Linux)?;
    let probe = |r: &cordon_policy_lang::Runtime| {
        identity::probe_runtime(
            &cordon::host::Linux,
            r.kind().as_str(),
            Path::new(r.path()),
            r.pin(),
        )
    };
    let ra = probe(a.runtime())?;
    let rb = if b.runtime() == a.runtime() {
        ra.clone()
    } else {
        probe(b.runtime())?
    };
    let x = with_runtime(a, ra, binaries.clone())?.authority()?;
    let y = with_runtime(b, rb, binaries)?.authority()?;
    Ok((x, y))
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let result = match &args.command {
        Command::Check { files } => check(files, args.diagnostics, stdout, stderr),
        Command::Identity { file, json } => identity_cmd(file, *json, stdout),
        Command::Diff { old, new } => diff_cmd(old, new, stdout, stderr),
        Command::Render {
            reviewed,
            out,
            store,
            run_dir,
            runtime,
            uid_range,
            gid_range,
            shell,
            state_dir,
            egress_domains,
        } => {
            let pair = |v: &Option<Vec<u32>>| v.as_deref().map(|r| (r[0], r[1]));
            render_cmd(
                reviewed,
                out,
                render::HostFacts {
                    store: store.clone(),
                    run_dir: run_dir.clone(),
                    runtime: None,
                    uid_range: pair(uid_range),
                    gid_range: pair(gid_range),
                    shell: shell.clone(),
                    state_dir: state_dir.clone(),
                    egress_domains: (!egress_domains.is_empty()).then(|| egress_domains.clone()),
                },
                runtime.as_deref(),
                stdout,
            )
        }
        Command::Explain {
            file,
            stage,
            json,
            bundle: false,
        } => explain_cmd(file, stage, *json, stdout),
        Command::Explain {
            file,
            stage,
            bundle: true,
            ..
        } => bundle_cmd(file, stage, stdout),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            report(&err, args.diagnostics, stderr);
            err.exit_class()
        }
    }
}

fn check(
    files: &[PathBuf],
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let mut worst = ExitCode::Ok;
    for file in files {
        match load(file) {
            Ok(_) => {
                let _ = writeln!(stdout, "{}: ok", file.display());
            }
            Err(err) => {
                err.report(mode, stderr);
                worst = ExitCode::Usage;
            }
        }
    }
    Ok(worst)
}

fn identity_cmd(file: &Path, json: bool, stdout: &mut dyn Write) -> Result<ExitCode, CliError> {
    let loaded = load(file)?;
    let parts = components(&loaded.policy)?;
    let authority = parts.authority()?;
    let text = if json {
        let mut receipt = Receipt::new(StageName::Policy, authority, Outcome::Ok);
        receipt.inputs =
            json!({ "file": file.display().to_string(), "file_sha256": loaded.raw_sha256 });
        receipt.outputs = json!({
            "policy_digest": parts.policy,
            "file_sha256": loaded.raw_sha256,
            "authority": authority,
            "components": parts,
        });
        let mut s = receipt
            .to_canonical_json()
            .map_err(|source| CliError::Receipt { source })?;
        s.push('\n');
        s
    } else {
        let mut s = format!("policy     {}  ({})\n", parts.policy, loaded.policy.name());
        s += &format!("file       {}  ({})\n", loaded.raw_sha256, file.display());
        s += &format!(
            "runtime    {}  ({} at {})\n",
            parts.runtime.sha256,
            parts.runtime.kind,
            parts.runtime.path.display()
        );
        for line in parts.runtime.version.lines() {
            s += &format!("           {line}\n");
        }
        for (role, d) in &parts.images {
            s += &format!("image      {d}  ({role})\n");
        }
        for (name, d) in &parts.binaries {
            s += &format!("binary     {d}  ({name})\n");
        }
        s += &format!("authority  {authority}\n");
        s
    };
    let _ = stdout.write_all(text.as_bytes());
    Ok(ExitCode::Ok)
}

fn render_cmd(
    reviewed: &Path,
    out: &Path,
    mut facts: render::HostFacts,
    runtime: Option<&Path>,
    stdout: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let read = |source| StartError::Read {
        path: reviewed.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(reviewed).map_err(read)?;
    facts.runtime = runtime.map(render::RuntimeBinary::at).transpose()?;
    let rendered = render::render(&reviewed.display().to_string(), &text, &facts)?;
    // create_new: a rendered policy is written once, never over another file.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .and_then(|mut f| {
            f.write_all(rendered.text.as_bytes())
                .and_then(|()| f.sync_all())
        })
        .map_err(|source| CliError::Write {
            path: out.to_path_buf(),
            source,
        })?;
    let mut s = String::new();
    for (section, lines) in diff::grouped(&rendered.changes) {
        s += &format!("[{section}]\n");
        for line in lines {
            s += &format!("  {line}\n");
        }
    }
    s += &format!("{}: rendered from {}\n", out.display(), reviewed.display());
    let _ = stdout.write_all(s.as_bytes());
    Ok(ExitCode::Ok)
}

fn diff_cmd(
    old: &Path,
    new: &Path,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let (a, b) = (load(old)?, load(new)?);
    let encode = |p: &Policy| {
        p.canonical_value()
            .map_err(|source| CliError::Encode { source })
    };
    let changes = diff::diff(&encode(&a.policy)?, &encode(&b.policy)?);
    let mut s = String::new();
    for (section, lines) in diff::grouped(&changes) {
        s += &format!("[{section}]\n");
        for line in lines {
            s += &format!("  {line}\n");
        }
    }
    let digest = |p: &Policy| p.digest().map_err(|source| CliError::Encode { source });
    let (da, db) = (digest(&a.policy)?, digest(&b.policy)?);
    if changes.is_empty() {
        s += &format!("no semantic change (identity unchanged): policy {da}\n");
    } else {
        s += &format!("policy: {da} → {db}\n");
        // The authority adds this host's runtime and binaries to each side; a reviewer's
        // machine may lack the runtime, and then says so instead of guessing.
        match authorities(&a.policy, &b.policy) {
            Ok((x, y)) => s += &format!("authority: {x} → {y}\n"),
            Err(e) => {
                let _ = writeln!(stderr, "note: authority not computed on this host: {e}");
            }
        }
    }
    let _ = stdout.write_all(s.as_bytes());
    Ok(if changes.is_empty() {
        ExitCode::Ok
    } else {
        ExitCode::Rejected
    })
}

/// The stage kind `stage` names, when the policy declares it.
fn declared_stage(policy: &Policy, stage: &str) -> Result<StageKind, CliError> {
    StageKind::from_keyword(stage)
        .filter(|k| policy.stage(*k).is_some())
        .ok_or_else(|| CliError::NoStage {
            stage: stage.to_owned(),
            declared: policy
                .stage_kinds()
                .map(StageKind::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The planned config.json of one stage, pretty-printed with sorted keys.
fn bundle_cmd(file: &Path, stage: &str, stdout: &mut dyn Write) -> Result<ExitCode, CliError> {
    let loaded = load(file)?;
    let policy = &loaded.policy;
    let kind = declared_stage(policy, stage)?;
    // The surface is planned apart: a rootless container, not a per-run lease.
    let spec = match kind {
        StageKind::Surface => {
            cordon_stage::surface::plan(policy, &cordon_stage::surface::example_inputs(policy))?
                .spec
        }
        StageKind::Prebuild | StageKind::Lane | StageKind::Reference => {
            bundle::plan(policy, kind, &bundle::example_inputs(policy, kind))?.spec
        }
    };
    let canonical = cordon::canonical::to_canonical_json(&spec)
        .map_err(|source| CliError::Encode { source })?;
    let value: serde_json::Value =
        serde_json::from_str(&canonical).map_err(|e| CliError::Encode {
            source: cordon::canonical::CanonicalError::Serialize { source: e },
        })?;
    let text = serde_json::to_string_pretty(&value).unwrap_or(canonical);
    let _ = writeln!(stdout, "{text}");
    Ok(ExitCode::Ok)
}

fn explain_cmd(
    file: &Path,
    stage: &str,
    json: bool,
    stdout: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let loaded = load(file)?;
    let policy = &loaded.policy;
    let kind = declared_stage(policy, stage)?;
    let Some(settings) = policy.stage(kind) else {
        return Err(CliError::NoStage {
            stage: stage.to_owned(),
            declared: String::new(),
        });
    };
    let (image, profile_name) = (settings.image.as_deref(), settings.seccomp.as_str());
    let root = policy
        .canonical_value()
        .map_err(|source| CliError::Encode { source })?;
    let text = if json {
        let value = json!({
            "stage": root["stage"][stage],
            "image": image.map(|image| json!({ image: root["image"][image] })),
            "seccomp": { profile_name: root["seccomp"][profile_name] },
        });
        let mut s = cordon::canonical::to_canonical_json(&value)
            .map_err(|source| CliError::Encode { source })?;
        s.push('\n');
        s
    } else {
        let mut lines = diff::explain(&root, &["stage", stage]);
        if let Some(image) = image {
            lines.extend(diff::explain(&root, &["image", image]));
        }
        let profile = &root["seccomp"][profile_name];
        for key in ["baseline", "default_action", "architectures"] {
            if let Some(v) = profile.get(key) {
                lines.push(format!(
                    "seccomp.{profile_name}.{} = {v}",
                    key.replace('_', "-")
                ));
            }
        }
        if let Some(typed) = policy.seccomp_profile(profile_name) {
            lines.extend(
                typed
                    .syscall
                    .iter()
                    .map(|(name, rule)| seccomp_line(profile_name, name, rule)),
            );
        }
        lines.join("\n") + "\n"
    };
    let _ = stdout.write_all(text.as_bytes());
    Ok(ExitCode::Ok)
}

/// One syscall rule of a profile as `explain` prints it: what the call gets, under which
/// argument conditions, and the reviewer's reason, so every admitted call is read with its why.
fn seccomp_line(profile: &str, name: &str, rule: &SyscallRule) -> String {
    let when = if rule.args.is_empty() {
        String::new()
    } else {
        let tests: Vec<String> = rule.args.iter().map(seccomp_condition).collect();
        format!(" when {}", tests.join(" and "))
    };
    format!(
        "seccomp.{profile}.syscall.{name} = {:?}{when}  # {}",
        rule.action.spelling(),
        cordon::text::printable(&rule.reason)
    )
}

/// One argument condition, in the terms the kernel compares: `arg0 & 0x7e020000 == 0 (32 bits)`.
fn seccomp_condition(c: &ArgCondition) -> String {
    let i = c.index;
    let values: Vec<String> = c.values.iter().map(ToString::to_string).collect();
    let values = values.join(", ");
    let test = match (c.op, c.mask) {
        (ArgOp::MaskedEq, Some(mask)) => format!("arg{i} & {mask:#x} == {values}"),
        (ArgOp::OneOf, _) => format!("arg{i} in [{values}]"),
        (ArgOp::Eq | ArgOp::MaskedEq, _) => format!("arg{i} == {values}"),
        (ArgOp::Ne, _) => format!("arg{i} != {values}"),
        (ArgOp::Lt, _) => format!("arg{i} < {values}"),
        (ArgOp::Le, _) => format!("arg{i} <= {values}"),
        (ArgOp::Gt, _) => format!("arg{i} > {values}"),
        (ArgOp::Ge, _) => format!("arg{i} >= {values}"),
    };
    format!("{test} ({} bits)", c.bits)
}

/// The whole of `cordon-policy`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdio(<Args as clap::Parser>::parse, run)
}
