//! The command-line options every stage binary shares (flattened into each binary's own
//! arguments, in the manner of youki's `liboci-cli`), and how diagnostics are printed.
//!
//! It owns option names, defaults, the voice level they set (`-q`, `-v`:
//! [`cordon::voice`]) and the stderr rendering of errors (no colour; ASCII unless the locale
//! and terminal show more; wrapped at the terminal's width, never when piped — or one JSON
//! document per error). It does not decide exit codes (each error type does).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use cordon::exit::ExitClass;
use cordon_policy_lang::Policy;
use miette::{Diagnostic, JSONReportHandler};

/// The policy file a stage reads when `--policy` is not given (the NixOS module installs it;
/// on Debian, `checks/install.sh`).
pub const DEFAULT_POLICY: &str = "/etc/cordon/policy.kdl";

/// The directory of pinned image layouts a container stage reads when `--images` is not given.
pub const DEFAULT_IMAGES: &str = "/var/lib/cordon/images";

/// How errors are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Diagnostics {
    /// Human-readable, labelled on the source.
    Text,
    /// One JSON document per error.
    Json,
}

/// The options every stage binary shares.
#[derive(Debug, Clone, clap::Args)]
pub struct StageArgs {
    /// The policy file.
    #[arg(long, default_value = DEFAULT_POLICY, global = true)]
    pub policy: PathBuf,
    /// The store directory (default: the policy's `store`).
    #[arg(long, global = true)]
    pub store: Option<PathBuf>,
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text, global = true)]
    pub diagnostics: Diagnostics,
    /// Say only errors on stderr (no summary line, no wait or progress lines).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Also say each step on stderr (the policy, the authority, the store).
    #[arg(short, long, global = true)]
    pub verbose: bool,
}

impl StageArgs {
    /// These options for a policy file, the store given, text diagnostics.
    #[must_use]
    pub fn new(policy: &Path, store: Option<&Path>) -> Self {
        Self {
            policy: policy.to_path_buf(),
            store: store.map(Path::to_path_buf),
            diagnostics: Diagnostics::Text,
            quiet: false,
            verbose: false,
        }
    }

    /// The voice level these options ask for.
    #[must_use]
    pub const fn level(&self) -> cordon::voice::Level {
        match (self.quiet, self.verbose) {
            (true, _) => cordon::voice::Level::Quiet,
            (false, true) => cordon::voice::Level::Verbose,
            (false, false) => cordon::voice::Level::Normal,
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
    #[arg(long, default_value = cordon::lease::DEFAULT_STATE_ROOT, global = true)]
    pub state_root: PathBuf,
    /// The run-directory root (default: the policy's `run-dir`).
    #[arg(long, global = true)]
    pub run_dir: Option<PathBuf>,
    /// The executor id (default: the policy's name).
    #[arg(long, global = true, value_parser = executor_id)]
    pub executor: Option<String>,
}

/// `--executor`, refused at the command line (exit 2, no receipt) unless it is a safe id.
fn executor_id(given: &str) -> Result<String, String> {
    if cordon::lease::executor_ok(given) {
        Ok(given.to_owned())
    } else {
        Err(
            "an executor id is 1 to 64 of A-Z, a-z, 0-9, '-', '_', '.', not starting with '.'"
                .into(),
        )
    }
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
        crate::settings::lease_setup(policy, &self.executor(policy), &self.state_root, run_dir)
    }
}

/// This binary's version line: the release, the commit it was built from and the sha256 of
/// its own bytes — the digest the authority identity counts for it, so an operator can tell
/// which build a receipt's authority names.
#[must_use]
pub fn version() -> String {
    let digest = std::env::current_exe()
        .ok()
        .and_then(|exe| cordon::canonical::Digest::of_file(&exe).ok())
        .map_or_else(|| "unreadable".to_owned(), |d| d.to_string());
    format!(
        "{} (commit {}, binary {digest})",
        env!("CARGO_PKG_VERSION"),
        env!("CORDON_COMMIT")
    )
}

/// Parse this process's arguments as `A`, with [`version`] as `--version` says it (computed
/// only when asked: hashing the binary is not free).
#[must_use]
pub fn parse<A: clap::Parser>() -> A {
    let mut command = A::command();
    if std::env::args_os().any(|a| a == "--version" || a == "-V") {
        // Once per process, on the way out: clap keeps the line for the process's life.
        command = command.version(&*Box::leak(version().into_boxed_str()));
    }
    let matches = command.get_matches();
    A::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Report `e` on stderr and end with its exit class: the one way a stage fails where it prints
/// no receipt (before its receipt exists, or when the receipt itself cannot be kept).
pub fn fail<E: Diagnostic + ExitClass>(
    e: &E,
    mode: Diagnostics,
    stderr: &mut dyn Write,
) -> cordon::ExitCode {
    report_diagnostic(e, mode, stderr);
    e.exit_class()
}

/// Print any diagnostic on stderr, in text (as stderr can show it: [`cordon::voice::Style`])
/// or JSON.
pub fn report_diagnostic(err: &dyn Diagnostic, mode: Diagnostics, stderr: &mut dyn Write) {
    let text = match mode {
        Diagnostics::Text => {
            let mut s = String::new();
            let _ = cordon::voice::Style::stderr()
                .handler()
                .render_report(&mut s, err);
            s
        }
        Diagnostics::Json => {
            let mut s = String::new();
            let _ = JSONReportHandler::new().render_report(&mut s, err);
            s.push('\n');
            s
        }
    };
    // Candidate text (a finding's source line, a path, an engine's message) may be in it:
    // nothing of it drives the operator's terminal. A closed stderr leaves nothing better to
    // do; the exit code still tells.
    let safe = match mode {
        Diagnostics::Text => cordon::text::terminal(&text),
        Diagnostics::Json => cordon::text::json(&text),
    };
    let _ = stderr.write_all(safe.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finding whose text and source line came from a candidate.
    #[derive(Debug, thiserror::Error, miette::Diagnostic)]
    #[error("banned call in \u{1b}]0;pwned\u{7}engine/serve.py\u{202e}yp.")]
    struct Hostile {
        #[source_code]
        src: String,
        #[label("here\r\u{1b}[32m all checks passed")]
        at: miette::SourceSpan,
    }

    #[test]
    fn candidate_text_never_reaches_the_terminal_raw_in_either_mode() {
        let e = Hostile {
            src: "x = '\u{1b}[2J\u{1b}[32mall checks passed\u{9b}0m'\neval(x)\n".into(),
            at: (44, 4).into(),
        };
        for mode in [Diagnostics::Text, Diagnostics::Json] {
            let mut out = Vec::new();
            report_diagnostic(&e, mode, &mut out);
            let out = String::from_utf8(out).unwrap();
            assert!(
                !out.chars().any(|c| cordon::text::hostile(c) && c != '\n'),
                "{mode:?}: {out:?}"
            );
            assert!(out.contains("banned call"), "{out}");
            if mode == Diagnostics::Json {
                let v: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
                assert!(
                    v["message"].as_str().unwrap().contains('\u{202e}'),
                    "the same value"
                );
            }
        }
    }
}
