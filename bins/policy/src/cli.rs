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
use cordon_policy_lang::effect::Effect;
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

/// What makes `diff` end with exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    /// Any semantic change.
    Change,
    /// A change that weakens containment.
    Weaken,
}

/// The reviewer commands.
// Parsed once per process: `render`'s many host facts cost nothing worth boxing.
#[allow(clippy::large_enum_variant)]
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
    /// Semantic diff for reviewers, each change classified as weakens, tightens or neutral for
    /// containment, with its file:line on each side: exit 0 when identical (with `--fail-on
    /// weaken`: when nothing weakens), 1 when different (when something weakens), 2 on error.
    Diff {
        /// The policy before the change.
        old: PathBuf,
        /// The policy after the change.
        new: PathBuf,
        /// What ends the command with exit 1: any change (as diff(1)), or only a change that
        /// weakens containment.
        #[arg(long, value_enum, default_value_t = FailOn::Change)]
        fail_on: FailOn,
        /// One JSON document on stdout instead of text.
        #[arg(long)]
        json: bool,
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
        /// An image this host has, as ROLE=LAYOUT (repeatable): the OCI layout's manifest,
        /// verified blob by blob, becomes `image ROLE digest=`.
        #[arg(long = "image", value_name = "ROLE=LAYOUT")]
        images: Vec<String>,
        /// The worker binary the runtime image holds, hashed into `worker digest=`.
        #[arg(long)]
        worker: Option<PathBuf>,
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
    #[diagnostic(
        code(cordon::policy::write),
        help(
            "--out must name a new file in a directory that exists: a rendered policy never replaces one"
        )
    )]
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
        Command::Diff {
            old,
            new,
            fail_on,
            json,
        } => diff_cmd(old, new, (*fail_on, *json), stdout, stderr),
        Command::Render {
            reviewed,
            out,
            store,
            run_dir,
            runtime,
            images,
            worker,
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
                    images: Vec::new(),
                    worker: None,
                    uid_range: pair(uid_range),
                    gid_range: pair(gid_range),
                    shell: shell.clone(),
                    state_dir: state_dir.clone(),
                    egress_domains: (!egress_domains.is_empty()).then(|| egress_domains.clone()),
                },
                (runtime.as_deref(), images, worker.as_deref()),
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

/// What `identity --json` read: the policy file, by path and by its bytes' sha256.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentityInputs {
    /// The policy file as given.
    pub file: String,
    /// sha256 of its bytes (formatting included).
    pub file_sha256: Digest,
}

/// What `identity --json` establishes: the authority identity on this host and its parts.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentityOutputs {
    /// The policy's canonical digest.
    pub policy_digest: Digest,
    /// sha256 of the file's bytes.
    pub file_sha256: Digest,
    /// The authority identity.
    pub authority: Digest,
    /// Everything it is made of.
    pub components: identity::AuthorityComponents,
}

impl cordon::inputs::StageInputs for IdentityInputs {
    const STAGE: StageName = StageName::Policy;
}

impl cordon::receipt::StageOutputs for IdentityOutputs {
    const STAGE: StageName = StageName::Policy;
}

/// The JSON Schema of `identity --json`'s object (a `policy` receipt), for `cordon-docs`.
#[must_use]
pub fn identity_schema() -> schemars::Schema {
    use cordon_evidence::schema::{kind, sub};
    kind(
        StageName::Policy,
        sub::<IdentityInputs>,
        &[sub::<IdentityOutputs>],
    )
    .1
}

fn identity_cmd(file: &Path, json: bool, stdout: &mut dyn Write) -> Result<ExitCode, CliError> {
    let loaded = load(file)?;
    let parts = components(&loaded.policy)?;
    let authority = parts.authority()?;
    let text = if json {
        let mut receipt = Receipt::new(StageName::Policy, authority, Outcome::Ok);
        let encode = |source| CliError::Receipt { source };
        receipt
            .set_inputs(&IdentityInputs {
                file: file.display().to_string(),
                file_sha256: loaded.raw_sha256,
            })
            .map_err(encode)?;
        receipt
            .set_outputs(&IdentityOutputs {
                policy_digest: parts.policy,
                file_sha256: loaded.raw_sha256,
                authority,
                components: parts.clone(),
            })
            .map_err(encode)?;
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
    (runtime, images, worker): (Option<&Path>, &[String], Option<&Path>),
    stdout: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let read = |source| StartError::read(reviewed, source);
    let text = std::fs::read_to_string(reviewed).map_err(read)?;
    facts.runtime = runtime.map(render::RuntimeBinary::at).transpose()?;
    facts.images = images
        .iter()
        .map(|i| render::layout_pin(i))
        .collect::<Result<_, _>>()?;
    facts.worker = worker
        .map(|w| render::file_digest("worker binary", w))
        .transpose()?;
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
    let mut s = classified_text(&rendered.changes, (reviewed, &text), (out, &rendered.text));
    s += &format!("{}: rendered from {}\n", out.display(), reviewed.display());
    let _ = stdout.write_all(s.as_bytes());
    Ok(ExitCode::Ok)
}

/// A policy file's path and text, for placing a change on it.
type Source<'a> = (&'a Path, &'a str);

/// Where `change` is written in `source`: `file:line`, or `file (not written)` when the file does
/// not write it.
fn place(source: Source<'_>, change: &diff::Change) -> String {
    match cordon_policy_lang::locate::line(source.1, &change.path) {
        Some(line) => format!("{}:{line}", source.0.display()),
        None => format!("{} (not written)", source.0.display()),
    }
}

/// The changes grouped by section, each line led by its effect and followed by where it is
/// written on each side (a side the change is absent from is not named).
fn classified_text(changes: &[diff::Change], old: Source<'_>, new: Source<'_>) -> String {
    let mut sections: std::collections::BTreeMap<&str, Vec<&diff::Change>> =
        std::collections::BTreeMap::new();
    for c in changes {
        sections.entry(c.section.as_str()).or_default().push(c);
    }
    let mut s = String::new();
    for (section, changes) in sections {
        s += &format!("[{section}]\n");
        for c in changes {
            s += &format!(
                "  {:<8}  {}  ({} → {})\n",
                c.effect.as_str(),
                c.line,
                place(old, c),
                place(new, c)
            );
        }
    }
    s
}

/// How many changes of each effect.
fn tally(changes: &[diff::Change]) -> [(Effect, usize); 3] {
    [Effect::Weakens, Effect::Tightens, Effect::Neutral]
        .map(|e| (e, changes.iter().filter(|c| c.effect == e).count()))
}

fn diff_cmd(
    old: &Path,
    new: &Path,
    (fail_on, as_json): (FailOn, bool),
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| StartError::read(path, source))
    };
    let (a, b) = (load(old)?, load(new)?);
    let (ta, tb) = (read(old)?, read(new)?);
    let encode = |p: &Policy| {
        p.canonical_value()
            .map_err(|source| CliError::Encode { source })
    };
    let changes = diff::diff(&encode(&a.policy)?, &encode(&b.policy)?);
    let digest = |p: &Policy| p.digest().map_err(|source| CliError::Encode { source });
    let (da, db) = (digest(&a.policy)?, digest(&b.policy)?);
    // The authority adds this host's runtime and binaries to each side; a reviewer's machine
    // may lack the runtime, and then says so instead of guessing.
    let authority = if changes.is_empty() {
        None
    } else {
        match authorities(&a.policy, &b.policy) {
            Ok(pair) => Some(pair),
            Err(e) => {
                let _ = writeln!(stderr, "note: authority not computed on this host: {e}");
                None
            }
        }
    };
    let counts = tally(&changes);
    let text = if as_json {
        let line = |text: &str, c: &diff::Change| cordon_policy_lang::locate::line(text, &c.path);
        let items: Vec<serde_json::Value> = changes
            .iter()
            .map(|c| {
                json!({
                    "section": c.section,
                    "path": c.path,
                    "line": c.line,
                    "effect": c.effect,
                    "rule": c.rule,
                    "old_line": line(&ta, c),
                    "new_line": line(&tb, c),
                })
            })
            .collect();
        let side = |path: &Path, d: &Digest, auth: Option<&Digest>| json!({ "file": path.display().to_string(), "policy": d.to_string(), "authority": auth.map(ToString::to_string) });
        let doc = json!({
            "old": side(old, &da, authority.as_ref().map(|a| &a.0)),
            "new": side(new, &db, authority.as_ref().map(|a| &a.1)),
            "changes": items,
            "counts": counts.iter().map(|(e, n)| (e.as_str().to_owned(), json!(n))).collect::<serde_json::Map<_, _>>(),
        });
        format!("{doc}\n")
    } else {
        let mut s = classified_text(&changes, (old, &ta), (new, &tb));
        if changes.is_empty() {
            s += &format!("no semantic change (identity unchanged): policy {da}\n");
        } else {
            let [(_, w), (_, t), (_, n)] = counts;
            s += &format!(
                "{} changes: {w} weaken, {t} tighten, {n} neutral\n",
                changes.len()
            );
            s += &format!("policy: {da} → {db}\n");
            if let Some((x, y)) = authority {
                s += &format!("authority: {x} → {y}\n");
            }
        }
        s
    };
    let _ = stdout.write_all(text.as_bytes());
    let failing = match fail_on {
        FailOn::Change => !changes.is_empty(),
        FailOn::Weaken => counts[0].1 > 0,
    };
    Ok(if failing {
        ExitCode::Rejected
    } else {
        ExitCode::Ok
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
    cordon::exit::with_stdio(cordon_stage::args::parse::<Args>, run)
}
