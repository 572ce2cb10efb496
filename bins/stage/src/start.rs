//! The stage prologue: process-wide settings first (before any thread exists), then read and
//! validate the policy and establish the authority identity on this host (the policy digest,
//! the probed runtime, the pinned images, the installed cordon binaries). Every stage binary
//! starts here.
//!
//! It owns the mapping of those failures to exit codes: a policy problem is a usage error (2),
//! an identity that cannot be established is a no-decision (3).

use std::io::Write;
use std::path::{Path, PathBuf};

use cordon::identity::{self, AuthorityComponents};
use cordon_canon::exit::ExitClass;
use cordon_canon::{Digest, ExitCode};
use cordon_policy_lang::{Policy, PolicyError, RuntimeKind};

use crate::args::{Diagnostics, report_diagnostic};

/// Why a stage could not start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StartError {
    /// The policy file could not be read.
    #[error("cannot read policy file {path}")]
    #[diagnostic(code(cordon::policy::read), help("{hint}"))]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
        /// What to do next, for this path and this error ([`StartError::read`]).
        hint: String,
    },
    /// The policy file is not UTF-8.
    #[error("policy file {path} is not UTF-8")]
    #[diagnostic(code(cordon::policy::encoding))]
    Encoding {
        /// The file.
        path: PathBuf,
    },
    /// The policy did not validate.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A host component of the identity could not be established.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Identity(#[from] identity::IdentityError),
    /// The canonical form could not be produced.
    #[error("cannot encode the canonical form")]
    #[diagnostic(code(cordon::policy::encode))]
    Encode {
        /// The encoder's error.
        #[source]
        source: cordon_canon::canonical::CanonicalError,
    },
}

impl ExitClass for StartError {
    fn exit_class(&self) -> ExitCode {
        match self {
            Self::Identity(e) => e.exit_class(),
            Self::Encode { .. } => ExitCode::NoDecision,
            Self::Read { .. } | Self::Encoding { .. } | Self::Policy(_) => ExitCode::Usage,
        }
    }
}

impl StartError {
    /// [`StartError::Read`] of `path`, its help fitted to the mistake: the default path not
    /// installed, a path named that is not there, a directory named instead of a file.
    #[must_use]
    pub fn read(path: &Path, source: std::io::Error) -> Self {
        let hint = if path == Path::new(crate::args::DEFAULT_POLICY) {
            "name it with --policy PATH; without it a stage reads /etc/cordon/policy.kdl, which the NixOS module installs (on Debian, `bash checks/install.sh` from the checkout installs it with every binary and the pinned images; or only the policy: install -D -m 0644 policy/evaluator.kdl /etc/cordon/policy.kdl)".to_owned()
        } else if path.is_dir() {
            "that is a directory: name the policy file itself (the reviewed one is policy/evaluator.kdl in the checkout)".to_owned()
        } else if source.kind() == std::io::ErrorKind::NotFound {
            "no file at that path: check it (a relative path is from the current directory; the reviewed policy is policy/evaluator.kdl in the checkout, the installed one /etc/cordon/policy.kdl)".to_owned()
        } else {
            "make the file readable by this user (root, for a stage)".to_owned()
        };
        Self::Read {
            path: path.to_path_buf(),
            source,
            hint,
        }
    }

    /// Print it on stderr: policy problems each labelled on the source, anything else as a
    /// miette report, in text or JSON.
    pub fn report(&self, mode: Diagnostics, stderr: &mut dyn Write) {
        match self {
            Self::Policy(p) => {
                let text = match mode {
                    Diagnostics::Text => p.render_text(&cordon::voice::Style::stderr().handler()),
                    Diagnostics::Json => format!("{}\n", p.render_json()),
                };
                // A closed stderr leaves nothing better to do; the exit code still tells.
                let _ = stderr.write_all(text.as_bytes());
            }
            other => report_diagnostic(other, mode, stderr),
        }
    }
}

/// A stage that runs containers and per-run accounts was started by another user than root.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{tool} must run as root (it runs as uid {uid}): {why}")]
#[diagnostic(
    code(cordon::stage::not_root),
    help(
        "run it as root (sudo, or the NixOS module's units); nothing was made. The agent surface is the one stage that runs as its service user"
    )
)]
pub struct NotRoot {
    /// The binary.
    pub tool: &'static str,
    /// Who ran it.
    pub uid: u32,
    /// What it does that needs root.
    pub why: &'static str,
}

/// What a stage that must run as root is, for its refusal ([`require_root`]).
#[derive(Debug, Clone, Copy)]
pub struct RootStage<'a> {
    /// The binary.
    pub tool: &'static str,
    /// What it does that needs root.
    pub why: &'static str,
    /// The stage whose receipt the refusal prints, when the invocation makes one (not a
    /// listing, not a device report).
    pub stage: Option<cordon::receipt::StageName>,
    /// The policy the authority of that receipt is computed from.
    pub policy: &'a Path,
}

/// Refuse to start `stage` unless it runs as root, before anything is made: its work needs
/// root, and a stage that found out halfway would leave a store or a lease behind. Reported on
/// `stderr`; exit 2 (the operator's invocation). When the invocation makes a receipt and the
/// authority can be computed without root (the policy is readable), a no-decision receipt
/// naming the refusal is printed on `stdout`, never stored ([`crate::receipt_io::print_unkept`]),
/// so a pipeline run as the wrong user ends with a receipt that says so.
///
/// # Errors
/// The exit code to end with.
pub fn require_root(
    stage: &RootStage<'_>,
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), ExitCode> {
    let uid = nix::unistd::geteuid().as_raw();
    if uid == 0 {
        return Ok(());
    }
    let refusal = NotRoot {
        tool: stage.tool,
        uid,
        why: stage.why,
    };
    report_diagnostic(&refusal, mode, stderr);
    if let Some(name) = stage.stage
        && let Ok(authority) =
            load(stage.policy).and_then(|l| Ok(components(&l.policy)?.authority()?))
    {
        crate::receipt_io::print_unkept(
            name,
            authority,
            ("stage.not_root", &refusal.to_string()),
            stdout,
        );
    }
    Err(ExitCode::Usage)
}

/// A policy read from disk, with the sha256 of its raw bytes.
#[derive(Debug)]
pub struct Loaded {
    /// The validated policy.
    pub policy: Policy,
    /// sha256 of the file's bytes (formatting included; not part of the authority).
    pub raw_sha256: Digest,
}

/// Read and validate a policy file.
///
/// # Errors
/// The file is unreadable, not UTF-8, or not a valid policy (exit 2).
pub fn load(path: &Path) -> Result<Loaded, StartError> {
    let bytes = std::fs::read(path).map_err(|source| StartError::read(path, source))?;
    let raw_sha256 = Digest::of_bytes(&bytes);
    let text = String::from_utf8(bytes).map_err(|_| StartError::Encoding {
        path: path.to_path_buf(),
    })?;
    let policy = cordon_policy_lang::parse(&path.display().to_string(), &text)?;
    Ok(Loaded { policy, raw_sha256 })
}

/// Why the process-wide settings could not be made.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PrologueError {
    /// The kernel refused to make this process a subreaper.
    #[error("cannot make this process a child subreaper")]
    #[diagnostic(code(cordon::stage::prologue))]
    Subreaper(#[source] nix::Error),
    /// The descriptor limit could not be read or raised.
    #[error("cannot raise the soft open-file limit to the hard limit")]
    #[diagnostic(code(cordon::stage::prologue))]
    Nofile(#[source] nix::Error),
    /// SIGINT, SIGTERM and SIGHUP could not be caught: a stage that would die on them with its
    /// candidate running does not start.
    #[error("cannot catch SIGINT, SIGTERM and SIGHUP")]
    #[diagnostic(code(cordon::stage::prologue))]
    Signals(#[source] std::io::Error),
}

/// Process-wide settings, made before any thread starts (brief §6):
/// - this process becomes a child subreaper, so a container's init — orphaned when `runtime
///   create` exits — is reparented here and waited for directly, and so are any processes that
///   escape it;
/// - the soft open-file limit is raised to the hard one, so walking a candidate's tree (within
///   every policy bound) never runs out of descriptors at the default soft 1024;
/// - a panic — a defect in cordon, never a verdict on the candidate — ends the process with a
///   no-decision (exit 3) instead of Rust's 101, so no stage exits outside 0–3;
/// - SIGINT, SIGTERM and SIGHUP stop the candidate and end the stage through its release with
///   a no-decision receipt naming the signal ([`cordon::interrupt`]).
///
/// # Errors
/// The kernel refused.
pub fn prologue() -> Result<(), PrologueError> {
    cordon_canon::exit::no_decision_on_panic();
    nix::sys::prctl::set_child_subreaper(true).map_err(PrologueError::Subreaper)?;
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_err(PrologueError::Nofile)?;
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .map_err(PrologueError::Nofile)?;
    cordon::interrupt::install().map_err(PrologueError::Signals)
}

/// A stage that has started: its policy, its authority on this host, and the runtime facts the
/// authority was computed from (the session's runtime preflight reuses their version text
/// rather than running the runtime again).
#[derive(Debug)]
pub struct Started {
    /// The policy read from disk.
    pub loaded: Loaded,
    /// The authority identity.
    pub authority: Digest,
    /// The probed runtime.
    pub runtime: identity::RuntimeFacts,
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
) -> Result<Started, ExitCode> {
    if let Err(e) = prologue() {
        report_diagnostic(&e, mode, stderr);
        return Err(ExitCode::NoDecision);
    }
    let started = load(path).and_then(|loaded| {
        let parts = components(&loaded.policy)?;
        let authority = parts.authority()?;
        say_verbose(path, &parts, &authority, stderr);
        // Every receipt this process stores names these parts (receipt_io::own_authority).
        let policy = loaded
            .policy
            .canonical_value()
            .map_err(|source| StartError::Encode { source })?;
        crate::receipt_io::own_authority(authority, parts.clone(), policy);
        Ok(Started {
            authority,
            runtime: parts.runtime,
            loaded,
        })
    });
    started.map_err(|e| {
        e.report(mode, stderr);
        e.exit_class()
    })
}

/// At `-v`: the policy and each part of the authority it and this host make.
fn say_verbose(
    path: &Path,
    parts: &AuthorityComponents,
    authority: &Digest,
    stderr: &mut dyn Write,
) {
    use cordon::voice::{Level, say};
    say(
        stderr,
        Level::Verbose,
        &format!("policy {} (digest {})", path.display(), parts.policy),
    );
    let rt = &parts.runtime;
    say(
        stderr,
        Level::Verbose,
        &format!(
            "runtime {} at {} ({}, {})",
            rt.kind,
            rt.path.display(),
            rt.sha256,
            rt.version.lines().next().unwrap_or("")
        ),
    );
    for (role, digest) in &parts.images {
        say(stderr, Level::Verbose, &format!("image {role}: {digest}"));
    }
    for (name, digest) in &parts.binaries {
        say(stderr, Level::Verbose, &format!("binary {name}: {digest}"));
    }
    say(stderr, Level::Verbose, &format!("authority {authority}"));
}

/// The authority components of a policy on this host: its digest, the probed runtime, the
/// pinned images and the installed cordon binaries.
///
/// # Errors
/// The runtime or the binaries could not be established (no-decision), or encoding failed.
pub fn components(policy: &Policy) -> Result<AuthorityComponents, StartError> {
    let runtime = policy.runtime();
    let facts = identity::probe_runtime(
        &cordon::host::Linux,
        runtime.kind().as_str(),
        Path::new(runtime.path()),
        runtime.pin(),
    )?;
    with_runtime(
        policy,
        facts,
        identity::installed_binaries(&cordon::host::Linux)?,
    )
}

/// The runtime a policy names, as the driver gates it (each kind by its own version table).
#[must_use]
pub fn runtime_kind(policy: &Policy) -> cordon::runtime::Kind {
    match policy.runtime().kind() {
        RuntimeKind::Runc => cordon::runtime::Kind::Runc,
        RuntimeKind::Crun => cordon::runtime::Kind::Crun,
        RuntimeKind::Runsc => cordon::runtime::Kind::Runsc,
    }
}

/// What the stages still lack to drive runtime `kind`, or nothing. Each is refused (after its
/// version gate) rather than run half-checked.
#[must_use]
pub fn undriven(kind: cordon::runtime::Kind) -> Option<&'static str> {
    match kind {
        // crun's runs wait at a start gate for their posture check (`Kind::settles_at_exec`).
        cordon::runtime::Kind::Runc | cordon::runtime::Kind::Crun => None,
        cordon::runtime::Kind::Runsc => Some(
            "a posture check of gVisor's sandbox, whose processes run under its Sentry rather than the host kernel cordon reads a container's posture from",
        ),
    }
}

/// The authority components of a policy with runtime facts and binaries already probed.
///
/// # Errors
/// Encoding failed.
pub fn with_runtime(
    policy: &Policy,
    runtime: identity::RuntimeFacts,
    binaries: std::collections::BTreeMap<String, Digest>,
) -> Result<AuthorityComponents, StartError> {
    Ok(AuthorityComponents {
        policy: policy
            .digest()
            .map_err(|source| StartError::Encode { source })?,
        runtime,
        images: policy.images().clone(),
        binaries,
    })
}

#[cfg(test)]
mod tests {
    use cordon::runtime::Kind;

    #[test]
    fn each_runtime_a_policy_names_maps_to_its_gate_and_only_runsc_is_undriven() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../policy/evaluator.kdl");
        let text = std::fs::read_to_string(path).unwrap();
        let line = text.lines().find(|l| l.starts_with("runtime ")).unwrap();
        for (name, kind) in [
            ("runc", Kind::Runc),
            ("crun", Kind::Crun),
            ("runsc", Kind::Runsc),
        ] {
            let named = text.replace(line, &format!("runtime {name:?} path=\"/usr/bin/{name}\""));
            let policy = cordon_policy_lang::parse("p.kdl", &named).unwrap();
            assert_eq!(super::runtime_kind(&policy), kind, "{name}");
            assert_eq!(
                super::undriven(kind).is_none(),
                kind != Kind::Runsc,
                "{name}"
            );
        }
    }

    #[test]
    fn the_prologue_makes_this_process_a_child_subreaper() {
        // nextest runs each test in a process of its own, so the change stays in this one.
        super::prologue().unwrap();
        assert!(nix::sys::prctl::get_child_subreaper().unwrap());
    }
}
