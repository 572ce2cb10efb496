//! The `cordon-materialize` command.
//!
//! - `cordon-materialize incumbent DIR`: register an incumbent tree.
//! - `cordon-materialize --incumbent sha256:TREE [--receipt FILE]`: materialize the delta of a
//!   fetch receipt (stdin by default) over that incumbent.
//! - `cordon-materialize verify sha256:TREE`: reopen a tree and re-check every entry.
//!
//! Exit codes: 0 ok; 1 the delta is rejected (findings on stderr as diagnostics on the
//! candidate's own source, and in the receipt); 2 usage, policy or input-wiring error; 3 the
//! store or a tree could not be established.

use cordon::exit::ExitClass;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::inputs::MaterializeInputs;
use cordon::intake;
use cordon::receipt::{
    Decision, FetchOutputs, IncumbentOutputs, MaterializeOutputs, Outcome, Reason, Receipt,
    Rejection, StageName,
};
use cordon::store::Store;
use cordon::tree;
use cordon_policy_lang::{BuildTier, Policy};
use cordon_stage::args::{LeaseArgs, StageArgs, fail, report_diagnostic};
use cordon_stage::receipt_io::{self as stage, StageError};
use miette::{Diagnostic, LabeledSpan, NamedSource, SourceCode};
use serde_json::{Value, json};

use crate::analysis;
use crate::guard::Finding;
use crate::manifest;
use crate::materialize::{self, MaterializeError};

/// Materialize engine trees.
#[derive(Debug, Parser)]
#[command(name = "cordon-materialize", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// Where the analysis child's lease lives.
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// The incumbent tree the delta is materialized over.
    #[arg(long)]
    pub incumbent: Option<String>,
    /// The fetch receipt of the delta (default, or `-`: stdin).
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// A subcommand instead of materializing.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The other things the tool does.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Register an incumbent engine tree (its root carries `cordon-incumbent.kdl`).
    Incumbent {
        /// The incumbent directory.
        dir: PathBuf,
    },
    /// Reopen a tree and re-check every entry.
    Verify {
        /// The tree digest.
        tree: String,
    },
}

/// Failures before a receipt can be written.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum CommandError {
    /// A digest argument is malformed.
    #[error("{given:?} is not a digest")]
    #[diagnostic(
        code(cordon::materialize::digest),
        help("write sha256:<64 lowercase hex>")
    )]
    Digest {
        /// What was given.
        given: String,
    },
    /// Neither `--incumbent` nor a subcommand.
    #[error("give either --incumbent sha256:TREE or a subcommand, not both and not neither")]
    #[diagnostic(code(cordon::materialize::usage))]
    Usage,
    /// The input receipt is not usable.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Input(StageError),
    /// The store cannot be opened.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] cordon::store::StoreError),
}

impl ExitClass for CommandError {
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Digest { .. } | Self::Usage => ExitCode::Usage,
            Self::Input(e) => e.exit_class(),
            Self::Store(e) => e.exit_class(),
        }
    }
}

/// One finding as a diagnostic on the candidate's own source.
#[derive(Debug)]
struct SourceFinding {
    finding: Finding,
    source: Option<NamedSource<Arc<String>>>,
}

/// The last column a finding is shown on its source at: the renderer pads to the column with a
/// formatter width, which cannot pass `u16::MAX`, and a line that long is unreadable anyway.
/// A finding further right is shown as its one line (its receipt keeps line and column).
const MAX_SHOWN_COLUMN: usize = 4096;

impl SourceFinding {
    /// `f`, with the source it was found in when it has a place that can be shown.
    fn on(f: &Finding, sources: &[(String, Arc<String>)]) -> Self {
        let source = f.at.filter(|at| at.col <= MAX_SHOWN_COLUMN).and_then(|_| {
            sources.iter().find(|(p, _)| *p == f.path).map(|(p, text)| {
                let language = if p.ends_with(".kdl") { "kdl" } else { "python" };
                NamedSource::new(p, text.clone()).with_language(language)
            })
        });
        Self {
            finding: f.clone(),
            source,
        }
    }
}

impl fmt::Display for SourceFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.finding.one_line())
    }
}

impl std::error::Error for SourceFinding {}

impl Diagnostic for SourceFinding {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.finding.code))
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.source.as_ref().map(|s| s as &dyn SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let at = self.finding.at?;
        self.source.as_ref()?;
        Some(Box::new(std::iter::once(LabeledSpan::new(
            Some(self.finding.label.clone()),
            at.start,
            at.end - at.start,
        ))))
    }
}

fn parse_digest(given: &str) -> Result<Digest, CommandError> {
    Digest::from_str(given).map_err(|_| CommandError::Digest {
        given: given.to_owned(),
    })
}

fn finding_json(f: &Finding) -> Value {
    json!({
        "code": f.code,
        "path": f.path,
        "line": f.at.map(|p| p.line),
        "col": f.at.map(|p| p.col),
        "message": f.message,
    })
}

/// The largest answer the analysis child may give, for a request of `asked` bytes: findings
/// and edits are bounded by the files they are about.
fn answer_bound(asked: usize) -> u32 {
    u32::try_from(asked.saturating_mul(4).saturating_add(16 << 20)).unwrap_or(u32::MAX)
}

/// `request` answered by the confined child `launch` names.
fn confined_analysis(
    launch: &cordon::confine::Launch,
    request: &analysis::Request,
) -> Result<analysis::Answer, MaterializeError> {
    use cordon::confine::ExchangeError;
    let broke = |why: String| {
        MaterializeError::Rejected(vec![materialize::parser_finding(why)], Vec::new())
    };
    let bytes = serde_json::to_vec(request).map_err(|e| MaterializeError::Child(e.to_string()))?;
    match cordon::confine::exchange(launch, &bytes, answer_bound(bytes.len())) {
        Ok(answer) => serde_json::from_slice(&answer)
            .map_err(|e| broke(format!("its answer does not decode: {e}"))),
        Err(ExchangeError::Broke(why)) => Err(broke(why)),
        Err(ExchangeError::Infrastructure(why)) => Err(MaterializeError::Child(why)),
    }
}

/// Run the tool: the whole of `main`. `child` is the executable that becomes the confined
/// analysis child (`/proc/self/exe`: this binary, whose digest the authority covers).
pub fn run(
    args: &Args,
    child: &Path,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    cordon::voice::set_level(args.stage.level());
    if let Err(code) = cordon_stage::start::require_root(
        &cordon_stage::start::RootStage {
            tool: "cordon-materialize",
            why: "its store is root's, and a delta's analysis child runs as a per-run account, confined",
            stage: Some(StageName::Materialize),
            policy: &args.stage.policy,
        },
        args.stage.diagnostics,
        stdout,
        stderr,
    ) {
        return code;
    }
    let (loaded, authority) = match cordon_stage::start::stage_start(
        &args.stage.policy,
        args.stage.diagnostics,
        stderr,
    ) {
        Ok(s) => (s.loaded, s.authority),
        Err(code) => return code,
    };
    match dispatch(
        args,
        child,
        &loaded.policy,
        authority,
        stdin,
        stdout,
        stderr,
    ) {
        Ok(code) => code,
        Err(CommandError::Input(e @ stage::StageError::NotOk { .. })) => {
            // A verdict upstream is passed on, not reported as a wiring error.
            match Store::open(&args.stage.store_root(&loaded.policy)) {
                Ok(store) => stage::pass_on(
                    &e,
                    StageName::Materialize,
                    (&store, std::path::Path::new(cordon::signing::KEY_DIR)),
                    args.stage.diagnostics,
                    stdout,
                    stderr,
                )
                .unwrap_or(ExitCode::NoDecision),
                Err(e) => fail(&e, args.stage.diagnostics, stderr),
            }
        }
        Err(CommandError::Input(e)) => {
            // A foreign authority says what differs when the store holds the receipt's parts
            // (read only: a refusal never makes a store).
            let e = match Store::open_existing(&args.stage.store_root(&loaded.policy)) {
                Ok(store) => stage::explain_foreign(e, &store),
                Err(_) => e,
            };
            fail(&e, args.stage.diagnostics, stderr)
        }
        Err(e) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            e.exit_class()
        }
    }
}

/// What one invocation does, parsed (with its input receipt) before the store is touched.
enum Job<'a> {
    Incumbent(&'a Path),
    Verify(Digest),
    Delta { incumbent: Digest, content: Digest },
}

/// The job `args` ask for, its inputs set on `receipt` (and, for a delta, the fetch receipt it
/// chains to).
fn job<'a>(
    args: &'a Args,
    authority: &Digest,
    stdin: &mut dyn Read,
    receipt: &mut Receipt,
) -> Result<Job<'a>, CommandError> {
    Ok(match (&args.command, &args.incumbent) {
        (Some(_), Some(_)) | (None, None) => return Err(CommandError::Usage),
        (Some(Command::Incumbent { dir }), None) => {
            receipt
                .set_inputs(&MaterializeInputs::Incumbent {
                    incumbent_dir: dir.clone(),
                })
                .map_err(|e| CommandError::Input(e.into()))?;
            Job::Incumbent(dir)
        }
        (Some(Command::Verify { tree: t }), None) => {
            let digest = parse_digest(t)?;
            receipt
                .set_inputs(&MaterializeInputs::Verify { tree: digest })
                .map_err(|e| CommandError::Input(e.into()))?;
            Job::Verify(digest)
        }
        (None, Some(inc)) => {
            let incumbent = parse_digest(inc)?;
            let (input, prev) =
                stage::read_input(args.receipt.as_deref(), stdin, StageName::Fetch, authority)
                    .map_err(CommandError::Input)?;
            let content = input
                .outputs_as::<FetchOutputs>()
                .map_err(|e| CommandError::Input(e.into()))?
                .content_digest;
            receipt.prev = Some(prev);
            receipt
                .set_inputs(&MaterializeInputs::Delta {
                    incumbent,
                    delta: content,
                })
                .map_err(|e| CommandError::Input(e.into()))?;
            Job::Delta { incumbent, content }
        }
    })
}

fn outputs_error(source: serde_json::Error) -> MaterializeError {
    MaterializeError::Receipt(cordon::receipt::ReceiptError::Record {
        stage: StageName::Materialize,
        source,
    })
}

/// Register the incumbent in `dir`: its receipt's outputs.
fn incumbent_outputs(
    store: &Store,
    dir: &Path,
    rules: &cordon_policy_lang::TreeRules,
    steps: &BTreeMap<String, BuildTier>,
) -> Result<Value, MaterializeError> {
    materialize::register_incumbent(store, dir, rules).and_then(|record| {
        let step = record.origin["build"].as_str().map(str::to_owned);
        // The operator's manifest names the incumbent's build: it must be one the
        // policy registers, as a candidate's must.
        if let Some(s) = step.as_ref().filter(|s| !steps.contains_key(*s)) {
            return Err(MaterializeError::Incumbent {
                path: dir.join(manifest::INCUMBENT_MANIFEST),
                why: format!("build step {s:?} is not a registered prebuild step of the policy"),
            });
        }
        serde_json::to_value(IncumbentOutputs {
            tree_digest: record.digest,
            incumbent: record.origin["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            step,
            files: record.entries.len() as u64,
            bytes: record.entries.iter().map(|e| e.size).sum::<u64>(),
        })
        .map_err(outputs_error)
    })
}

fn dispatch(
    args: &Args,
    child: &Path,
    policy: &Policy,
    authority: Digest,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<ExitCode, CommandError> {
    let store_root = args.stage.store_root(policy);
    let rules = policy.tree_rules();
    let mut receipt = Receipt::new(StageName::Materialize, authority, Outcome::Ok);
    if args.incumbent.is_some() {
        stage::stdin_notice("cordon-materialize", args.receipt.as_deref(), stderr);
    }
    let job = job(args, &authority, stdin, &mut receipt)?;
    // Reopening a tree only reads the store: it never makes one where none is.
    let store = match &job {
        Job::Verify(_) => Store::open_existing(&store_root)?,
        Job::Delta { .. } | Job::Incumbent(_) => match stage::open_store(
            &store_root,
            (StageName::Materialize, authority),
            args.stage.diagnostics,
            stdout,
            stderr,
        ) {
            Ok(s) => s,
            Err(code) => return Ok(code),
        },
    };
    // A tree the store does not hold is the operator's digest or store: said, exit 2.
    if let Job::Verify(digest) = &job
        && !tree::tree_dir(&store, digest).exists()
    {
        cordon_stage::args::report_diagnostic(
            &tree::TreeError::Missing { digest: *digest },
            args.stage.diagnostics,
            stderr,
        );
        return Ok(ExitCode::Usage);
    }
    // A delta's fetch receipt must be this store's own, and start its chain under this
    // authority: a receipt written by hand names nothing the store established.
    if let (Job::Delta { .. }, Some(prev)) = (&job, receipt.prev) {
        stage::require_chain(&store, &prev, &authority).map_err(CommandError::Input)?;
    }
    // The registered patchers: each prebuild step with the one tier it builds.
    let steps: BTreeMap<String, BuildTier> = policy
        .steps_of(cordon_policy_lang::StageKind::Prebuild)
        .filter_map(|s| Some((s.to_owned(), policy.step_tier(s)?)))
        .collect();
    let result: Result<Value, MaterializeError> = match job {
        Job::Incumbent(dir) => incumbent_outputs(&store, dir, &rules, &steps),
        Job::Verify(digest) => tree::verify(&store, &digest)
            .map(|record| {
                json!({
                    "tree_digest": record.digest,
                    "files": record.entries.len(),
                })
            })
            .map_err(MaterializeError::Tree),
        Job::Delta { incumbent, content } => intake::load(&store, &content)
            .map_err(MaterializeError::Intake)
            .and_then(|record| {
                cordon_stage::parser::under_setup(
                    policy,
                    args.lease.setup(policy),
                    &store,
                    &authority,
                    analysis::ANALYSIS_CHILD,
                    child,
                    cordon_stage::parser::budget(policy),
                    |launch| {
                        materialize::materialize(
                            &store,
                            &incumbent,
                            &record,
                            &rules,
                            &steps,
                            &|request| confined_analysis(launch, request),
                        )
                    },
                )?
            })
            .and_then(|m| {
                serde_json::to_value(MaterializeOutputs {
                    tree_digest: m.record.digest,
                    delta_digest: m.delta,
                    incumbent,
                    target: m.target,
                    namespace: m.namespace,
                    step: m.step,
                    findings: Vec::new(),
                })
                .map_err(outputs_error)
            }),
    };
    // Findings are shown on the candidate's own source only once the receipt is safe.
    let mut shown = Vec::new();
    let decision = match result {
        Ok(outputs) => Ok(Decision::Accepted(outputs)),
        Err(MaterializeError::Rejected(findings, sources)) => {
            shown = findings
                .iter()
                .map(|f| SourceFinding::on(f, &sources))
                .collect();
            Ok(Decision::Rejected(Rejection {
                findings: findings
                    .iter()
                    .map(|f| Reason {
                        code: f.code.to_owned(),
                        message: f.one_line(),
                    })
                    .collect(),
                evidence: json!({ "findings": findings.iter().map(finding_json).collect::<Vec<_>>() }),
            }))
        }
        Err(e @ (MaterializeError::Incumbent { .. } | MaterializeError::IncumbentManifest(_))) => {
            report_diagnostic(&e, args.stage.diagnostics, stderr);
            return Ok(ExitCode::Usage);
        }
        Err(e) => Err(e),
    };
    let mode = args.stage.diagnostics;
    Ok(stage::finish_showing(
        &store,
        &mut receipt,
        decision,
        (mode, stdout, stderr),
        &mut |stderr| {
            for diag in &shown {
                report_diagnostic(diag, mode, stderr);
            }
        },
    ))
}

/// The whole of `cordon-materialize`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    if let Some((spec, parent)) = cordon::confine::requested() {
        cordon::confine::run_child(&spec, parent, |spec| match spec.kind.as_str() {
            crate::analysis::ANALYSIS_CHILD => crate::analysis::child_main(),
            _ => cordon::confine::UNCONFINED_EXIT,
        });
    }
    cordon::exit::with_stdin(
        cordon_stage::args::parse::<Args>,
        |args, stdin, stdout, stderr| {
            run(
                args,
                std::path::Path::new("/proc/self/exe"),
                stdin,
                stdout,
                stderr,
            )
        },
    )
}
