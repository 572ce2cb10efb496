//! The `cordon-policy` reviewer tool: `check`, `identity`, `diff`, `explain`.
//!
//! Everything the binary does is here, behind [`run`], writing to the streams it is given, so
//! tests drive the real command without spawning it. Output for pipelines (receipts, JSON) goes
//! to `out`; everything for humans goes to `err`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::identity::{self, AuthorityComponents};
use cordon::receipt::{Outcome, Receipt};
use miette::{Diagnostic, GraphicalReportHandler, GraphicalTheme, JSONReportHandler};
use serde_json::json;

use crate::{Policy, PolicyError, diff};

/// Width diagnostics are wrapped at: fixed, so the text is a stable, tested interface.
const WIDTH: usize = 100;

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

/// How errors are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Diagnostics {
    /// Human-readable, labelled on the source.
    Text,
    /// One JSON document per error.
    Json,
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

/// The options every stage binary shares.
#[derive(Debug, Clone, clap::Args)]
pub struct StageArgs {
    /// The policy file.
    #[arg(long, default_value = cordon::stage::DEFAULT_POLICY, global = true)]
    pub policy: PathBuf,
    /// The store directory (default: the policy's `store`).
    #[arg(long, global = true)]
    pub store: Option<PathBuf>,
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text, global = true)]
    pub diagnostics: Diagnostics,
}

impl StageArgs {
    /// These options for a policy file, the store given, text diagnostics.
    #[must_use]
    pub fn new(policy: &Path, store: Option<&Path>) -> Self {
        Self {
            policy: policy.to_path_buf(),
            store: store.map(Path::to_path_buf),
            diagnostics: Diagnostics::Text,
        }
    }

    /// The store directory: `--store`, else the policy's.
    #[must_use]
    pub fn store_root(&self, policy: &Policy) -> PathBuf {
        self.store
            .clone()
            .unwrap_or_else(|| PathBuf::from(policy.store()))
    }
}

/// The options of stage binaries that hold leases.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseArgs {
    /// cordon's runtime state root.
    #[arg(long, default_value = cordon::lease::DEFAULT_STATE_ROOT)]
    pub state_root: PathBuf,
    /// The run-directory root (default: the policy's `run-dir`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// The executor id (default: the policy's name).
    #[arg(long)]
    pub executor: Option<String>,
}

impl LeaseArgs {
    /// The executor id these options name.
    #[must_use]
    pub fn executor(&self, policy: &Policy) -> String {
        self.executor
            .clone()
            .unwrap_or_else(|| policy.name().to_owned())
    }

    /// The lease manager's setup these options and the policy describe.
    #[must_use]
    pub fn setup(&self, policy: &Policy) -> cordon::lease::Setup {
        let run_dir = self
            .run_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(policy.run_dir()));
        policy.lease_setup(&self.executor(policy), &self.state_root, run_dir)
    }
}

/// A failure of the tool itself, as opposed to a policy problem.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum CliError {
    /// The policy file could not be read.
    #[error("cannot read policy file {path}")]
    #[diagnostic(code(cordon::policy::read))]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The policy file is not UTF-8.
    #[error("policy file {path} is not UTF-8")]
    #[diagnostic(code(cordon::policy::encoding))]
    Encoding {
        /// The file.
        path: PathBuf,
    },
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
    /// A host component of the identity could not be established.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Identity(#[from] identity::IdentityError),
    /// The policy did not validate.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The stage cannot be planned.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// The bundle cannot be planned.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Bundle(#[from] cordon::bundle::BundleError),
}

impl CliError {
    /// The exit code this failure maps to.
    #[must_use]
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Identity(e) => e.exit_code(),
            Self::Encode { .. } | Self::Receipt { .. } => ExitCode::NoDecision,
            Self::Read { .. }
            | Self::Encoding { .. }
            | Self::NoStage { .. }
            | Self::Policy(_)
            | Self::Plan(_)
            | Self::Bundle(_) => ExitCode::Usage,
        }
    }
}

/// A policy read from disk, with the sha256 of its raw bytes.
#[derive(Debug)]
pub struct Loaded {
    /// The validated policy.
    pub policy: Policy,
    /// sha256 of the file's bytes (formatting included; not part of the authority).
    pub raw_sha256: Digest,
}

/// Read and validate a policy file: what every stage binary does first.
///
/// # Errors
/// The file is unreadable, not UTF-8, or not a valid policy (exit 2).
pub fn load(path: &Path) -> Result<Loaded, CliError> {
    let bytes = std::fs::read(path).map_err(|source| CliError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let raw_sha256 = Digest::of_bytes(&bytes);
    let text = String::from_utf8(bytes).map_err(|_| CliError::Encoding {
        path: path.to_path_buf(),
    })?;
    let policy = crate::parse(&path.display().to_string(), &text)?;
    Ok(Loaded { policy, raw_sha256 })
}

/// What every stage binary does first: read and validate its policy and establish the
/// authority identity on this host. On failure the problem is already reported on `stderr` and
/// the exit code is returned (2 for a policy problem, 3 for an identity that cannot be
/// established).
///
/// # Errors
/// The exit code to end with.
pub fn stage_start(
    path: &Path,
    mode: Diagnostics,
    stderr: &mut dyn Write,
) -> Result<(Loaded, Digest), ExitCode> {
    let authority = load(path).and_then(|loaded| {
        let a = components(&loaded.policy)?.authority()?;
        Ok((loaded, a))
    });
    authority.map_err(|e| {
        report(&e, mode, stderr);
        e.exit_code()
    })
}

/// The authority components of a policy on this host: its digest, the probed runtime, the
/// pinned images and the installed cordon binaries.
///
/// # Errors
/// The runtime or the binaries could not be established (no-decision), or encoding failed.
pub fn components(policy: &Policy) -> Result<AuthorityComponents, CliError> {
    let runtime = policy.runtime();
    let facts = identity::probe_runtime(runtime.kind(), Path::new(runtime.path()), runtime.pin())?;
    with_runtime(policy, facts, identity::installed_binaries()?)
}

fn with_runtime(
    policy: &Policy,
    runtime: identity::RuntimeFacts,
    binaries: std::collections::BTreeMap<String, Digest>,
) -> Result<AuthorityComponents, CliError> {
    Ok(AuthorityComponents {
        policy: policy
            .digest()
            .map_err(|source| CliError::Encode { source })?,
        runtime,
        images: policy.images().clone(),
        binaries,
    })
}

/// Both sides' authorities, hashing the installed binaries once and the runtime once when both
/// policies name the same one.
fn authorities(a: &Policy, b: &Policy) -> Result<(Digest, Digest), CliError> {
    let binaries = identity::installed_binaries()?;
    let probe =
        |r: &crate::Runtime| identity::probe_runtime(r.kind(), Path::new(r.path()), r.pin());
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

/// Print a failure on stderr: policy problems each labelled on the source, anything else as a
/// miette report, in text or JSON.
pub fn report(err: &CliError, mode: Diagnostics, stderr: &mut dyn Write) {
    match err {
        CliError::Policy(p) => {
            let text = match mode {
                Diagnostics::Text => p.render_text(WIDTH),
                Diagnostics::Json => format!("{}\n", p.render_json()),
            };
            // A closed stderr leaves nothing better to do; the exit code still tells.
            let _ = stderr.write_all(text.as_bytes());
        }
        other => report_diagnostic(other, mode, stderr),
    }
}

/// Print any diagnostic on stderr, in text (fixed width, no colour) or JSON.
pub fn report_diagnostic(err: &dyn Diagnostic, mode: Diagnostics, stderr: &mut dyn Write) {
    let text = match mode {
        Diagnostics::Text => {
            let mut s = String::new();
            let handler = GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
                .with_width(WIDTH)
                .with_links(false);
            let _ = handler.render_report(&mut s, err);
            s
        }
        Diagnostics::Json => {
            let mut s = String::new();
            let _ = JSONReportHandler::new().render_report(&mut s, err);
            s.push('\n');
            s
        }
    };
    // A closed stderr leaves nothing better to do; the exit code still tells.
    let _ = stderr.write_all(text.as_bytes());
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let result = match &args.command {
        Command::Check { files } => check(files, args.diagnostics, stdout, stderr),
        Command::Identity { file, json } => identity_cmd(file, *json, stdout),
        Command::Diff { old, new } => diff_cmd(old, new, stdout, stderr),
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
            err.exit_code()
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
                report(&err, mode, stderr);
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
        let mut receipt = Receipt::new("policy", authority, Outcome::Ok);
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

/// The planned config.json of one stage, pretty-printed with sorted keys.
fn bundle_cmd(file: &Path, stage: &str, stdout: &mut dyn Write) -> Result<ExitCode, CliError> {
    let loaded = load(file)?;
    let policy = &loaded.policy;
    let plan = policy.bundle_plan(stage, &policy.example_inputs(stage))?;
    let spec = cordon::bundle::plan(&plan)?;
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
    let Some(settings) = policy.stage(stage) else {
        return Err(CliError::NoStage {
            stage: stage.to_owned(),
            declared: policy.stage_kinds().collect::<Vec<_>>().join(", "),
        });
    };
    let root = policy
        .canonical_value()
        .map_err(|source| CliError::Encode { source })?;
    let text = if json {
        let value = json!({
            "stage": root["stage"][stage],
            "image": { settings.image(): root["image"][settings.image()] },
            "seccomp": { settings.seccomp_profile(): root["seccomp"][settings.seccomp_profile()] },
        });
        let mut s = cordon::canonical::to_canonical_json(&value)
            .map_err(|source| CliError::Encode { source })?;
        s.push('\n');
        s
    } else {
        let mut lines = diff::explain(&root, &["stage", stage]);
        lines.extend(diff::explain(&root, &["image", settings.image()]));
        let profile = &root["seccomp"][settings.seccomp_profile()];
        for key in ["baseline", "default_action", "architectures"] {
            if let Some(v) = profile.get(key) {
                lines.push(format!(
                    "seccomp.{}.{} = {v}",
                    settings.seccomp_profile(),
                    key.replace('_', "-")
                ));
            }
        }
        let allowed = profile["syscall"]
            .as_object()
            .map_or(0, serde_json::Map::len);
        lines.push(format!(
            "seccomp.{}.syscall = {allowed} rules (cordon-policy explain --json lists them)",
            settings.seccomp_profile()
        ));
        lines.join("\n") + "\n"
    };
    let _ = stdout.write_all(text.as_bytes());
    Ok(ExitCode::Ok)
}
