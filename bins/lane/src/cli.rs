//! The `cordon-lane` command.
//!
//! `cordon-lane qualify --incumbent PREBUILD_B [--candidate PREBUILD_C] --workload W --model M
//! [--reproduce FIRST]` consumes the candidate's prebuild receipt (stdin by default) and the
//! incumbent's (a file; its chain starts at the incumbent's registration, and the candidate's
//! delta must be over that same tree), runs B, C, B′ ([`crate::qualify`]) and prints one qualify
//! receipt: `ok` on PASS (exit 0), `rejected` on FAIL (exit 1, the evidence holds every number),
//! `no-decision` when the host could not measure (exit 3). Each read's session receipt is
//! stored and linked, not printed. `--reproduce` runs the exact lane exchange of a primary
//! attempt of the same builds under the same authority and speed policy.
//!
//! `cordon-lane session --role B|C --workload W --model M [--receipt PREBUILD] [--policy P]
//! [--store S] [--images DIR]` consumes a prebuild receipt (stdin by default; another
//! authority's is refused, exit 2; a rejected or no-decision one is passed on with its exit
//! code; one of the other role's chain is refused, exit 2) and prints one lane receipt: `ok` with the role, tree, publication, model, workload,
//! worker and posture digests, every host-stamped window, the timed rate and the container's
//! meta record (exit 0); `rejected` with the engine's violation (exit 1); `no-decision` when
//! cordon could not establish the session (exit 3). A workload, model or policy the session
//! cannot use is a usage error (exit 2) and prints no receipt.

use cordon::exit::ExitClass;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::chain::starts_incumbent_chain;
use cordon::receipt::{
    IncumbentOutputs, MaterializeOutputs, Outcome, PrebuildOutputs, Receipt, Role, StageName,
};
use cordon::store::Store;
use cordon_stage::args::{Diagnostics, LeaseArgs, StageArgs, fail, report_diagnostic};
use cordon_stage::receipt_io as stage;

use crate::qualify::{self, Build, Plan, QualifyOutputs};
use crate::session::{Config, Inputs, session, session_under};
use cordon_evidence::inputs::{LaneInputs, PrebuildInputs, QualifyInputs};

/// Run engine sessions in the runtime lane.
#[derive(Debug, Parser)]
#[command(name = "cordon-lane", version, about)]
pub struct Args {
    /// The options every stage shares.
    #[command(flatten)]
    pub stage: StageArgs,
    /// The directory of image layouts, one per role (`<dir>/runtime`).
    #[arg(long, default_value = cordon_stage::args::DEFAULT_IMAGES, global = true)]
    pub images: PathBuf,
    /// Where leases live (before or after the subcommand, as every other option).
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A role on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    /// The incumbent.
    #[value(name = "B")]
    B,
    /// The candidate.
    #[value(name = "C")]
    C,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One engine session of one role.
    Session {
        /// The session's role: B needs a prebuild of the incumbent's chain, C a candidate's.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// The prebuild receipt (default, or `-`: stdin).
        #[arg(long)]
        receipt: Option<PathBuf>,
        /// The workload file.
        #[arg(long)]
        workload: PathBuf,
        /// The model directory (root-owned, writable by root only).
        #[arg(long)]
        model: PathBuf,
    },
    /// A speed qualification: reads B, C, B′ on the policy's physical lanes and the host's
    /// verdict.
    Qualify {
        /// The incumbent's prebuild receipt (its chain starts at the incumbent's registration).
        #[arg(long)]
        incumbent: PathBuf,
        /// The candidate's prebuild receipt (default: stdin).
        #[arg(long)]
        candidate: Option<PathBuf>,
        /// The workload file.
        #[arg(long)]
        workload: PathBuf,
        /// The model directory (root-owned, writable by root only).
        #[arg(long)]
        model: PathBuf,
        /// A primary attempt's qualify receipt: run its exact exchange (lanes swapped).
        #[arg(long)]
        reproduce: Option<PathBuf>,
    },
    /// Where a model must be registered: prints its digest and its path in the policy's models
    /// root (`<models>/sha256-<hex>`), after the ownership and kind checks a session makes of
    /// the model itself (not of the models root or its place). Moves nothing.
    Model {
        /// The model directory (root-owned, writable by root only).
        dir: PathBuf,
    },
    /// Every GPU the policy's physical lanes name, read through NVML: its configuration
    /// against the policy's pin, one telemetry sample and, with `--drain`, a drain under the
    /// policy's guard. One JSON document; exit 0 when every GPU holds, 3 otherwise.
    Devices {
        /// Drain each GPU under the policy's device guard too.
        #[arg(long)]
        drain: bool,
    },
}

/// A wiring error: reported, exit 2, no receipt.
fn usage(stderr: &mut dyn Write, why: &str) -> ExitCode {
    let _ = writeln!(stderr, "cordon-lane: {why}");
    ExitCode::Usage
}

/// A prebuild receipt checked against its role: its store chain walks back to the
/// incumbent's registration (B) or to intake (C). Returns the build and the chain.
fn build_of(
    store: &Store,
    input: &Receipt,
    prev: Digest,
    role: Role,
    authority: &Digest,
    mode: Diagnostics,
    stderr: &mut dyn Write,
) -> Result<(Build, Vec<Receipt>), ExitCode> {
    let publication = input
        .outputs_as::<PrebuildOutputs>()
        .map_err(|e| fail(&e, mode, stderr))?
        .publication;
    let tree = input
        .inputs_as::<PrebuildInputs>()
        .map_err(|e| fail(&e, mode, stderr))?
        .tree;
    let chain = stage::require_chain(store, &prev, authority).map_err(|e| {
        report_diagnostic(&e, mode, stderr);
        e.exit_class()
    })?;
    // The host owns the role: a candidate's build never runs as the incumbent, nor the reverse.
    let incumbent = chain.last().is_some_and(starts_incumbent_chain);
    if incumbent != (role == Role::B) {
        return Err(usage(
            stderr,
            &format!(
                "role {role:?} needs a prebuild of {}'s chain; {prev} is a {}'s",
                if role == Role::B {
                    "the incumbent"
                } else {
                    "a candidate"
                },
                if incumbent { "incumbent" } else { "candidate" }
            ),
        ));
    }
    Ok((
        Build {
            tree,
            publication,
            receipt: prev,
        },
        chain,
    ))
}

/// One invocation's established context: the policy, its store, the lane configuration, the
/// input receipt and what it chains to.
struct Invocation<'a> {
    policy: &'a cordon_policy_lang::Policy,
    store: Store,
    cfg: Config,
    authority: cordon::canonical::Digest,
    input: Receipt,
    prev: cordon::canonical::Digest,
    mode: cordon_stage::args::Diagnostics,
}

impl Invocation<'_> {
    /// `cordon-lane session`: one read of one role's build.
    fn session(
        &self,
        role: &RoleArg,
        workload: &Path,
        model: &Path,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> ExitCode {
        let role = match role {
            RoleArg::B => Role::B,
            RoleArg::C => Role::C,
        };
        let build = match build_of(
            &self.store,
            &self.input,
            self.prev,
            role,
            &self.authority,
            self.mode,
            stderr,
        ) {
            Ok((b, _)) => b,
            Err(code) => return code,
        };
        let inputs = Inputs {
            role,
            tree: build.tree,
            publication: build.publication,
            workload: workload.to_path_buf(),
            model: model.to_path_buf(),
            lane: None,
        };
        let mut receipt = Receipt::new(StageName::Lane, self.authority, Outcome::Ok);
        receipt.prev = Some(self.prev);
        let recorded = LaneInputs {
            role: inputs.role,
            read: None,
            tree: inputs.tree,
            publication: inputs.publication,
            workload: workload.to_path_buf(),
            model: model.to_path_buf(),
            lane: None,
        };
        if let Err(e) = receipt.set_inputs(&recorded) {
            return fail(&e, self.mode, stderr);
        }
        match session(self.policy, &self.cfg, &inputs) {
            // The operator's inputs: nothing ran, nothing to record.
            Err(e) if e.exit_class() == ExitCode::Usage => fail(&e, self.mode, stderr),
            result => {
                receipt.evidence = self.cfg.evidence.take();
                stage::finish(&self.store, &mut receipt, result, self.mode, stdout, stderr)
            }
        }
    }

    /// `cordon-lane qualify`: the incumbent and the candidate read in the policy's order, and
    /// the speed verdict.
    fn qualify(
        &self,
        incumbent: &Path,
        workload: &Path,
        model: &Path,
        reproduce: Option<&Path>,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> ExitCode {
        let (candidate, c_chain) = match build_of(
            &self.store,
            &self.input,
            self.prev,
            Role::C,
            &self.authority,
            self.mode,
            stderr,
        ) {
            Ok(x) => x,
            Err(code) => return code,
        };
        // The incumbent's build must be an established one: a failed incumbent build is
        // the operator's input, not a verdict to pass on.
        let (b_input, b_prev) = match stage::read_input(
            Some(incumbent),
            &mut std::io::empty(),
            StageName::Prebuild,
            &self.authority,
        ) {
            Ok(x) => x,
            Err(e) => {
                return fail(&stage::explain_foreign(e, &self.store), self.mode, stderr);
            }
        };
        let (incumbent_build, b_chain) = match build_of(
            &self.store,
            &b_input,
            b_prev,
            Role::B,
            &self.authority,
            self.mode,
            stderr,
        ) {
            Ok(x) => x,
            Err(code) => return code,
        };
        // The candidate's delta is over exactly this incumbent.
        let registered = b_chain
            .last()
            .and_then(|r| r.outputs_as::<IncumbentOutputs>().ok())
            .map(|o| o.tree_digest);
        let over = c_chain
            .iter()
            .find_map(|r| r.outputs_as::<MaterializeOutputs>().ok())
            .map(|o| o.incumbent);
        if registered.is_none() || registered != over {
            return usage(
                stderr,
                &format!(
                    "the candidate's delta is over incumbent {over:?}, not the registered {registered:?}"
                ),
            );
        }
        let mut receipt = Receipt::new(StageName::Qualify, self.authority, Outcome::Ok);
        receipt.prev = Some(self.prev);
        let mut recorded = QualifyInputs {
            incumbent: b_prev,
            candidate: self.prev,
            workload: workload.to_path_buf(),
            model: model.to_path_buf(),
            reproduces: None,
        };
        if let Err(e) = receipt.set_inputs(&recorded) {
            return fail(&e, self.mode, stderr);
        }
        // What the authority is frozen on is this host's now; a value cordon cannot read
        // is a no-decision before any read.
        let frozen = match qualify::frozen(self.policy, &self.cfg.setup.cdi_dirs) {
            Ok(f) => f,
            Err(e) => {
                return stage::finish::<QualifyOutputs, _>(
                    &self.store,
                    &mut receipt,
                    Err(e),
                    self.mode,
                    stdout,
                    stderr,
                );
            }
        };
        let (orientation, reproduces) = match reproduce {
            None => (qualify::primary(self.policy), None),
            Some(path) => {
                match reproduction(
                    &self.store,
                    self.policy,
                    path,
                    &self.authority,
                    (b_prev, self.prev),
                    &frozen,
                ) {
                    Ok((o, first)) => (Ok(o), Some(first)),
                    Err(why) => return usage(stderr, &why),
                }
            }
        };
        let orientation = match orientation {
            Ok(o) => o,
            Err(e) => {
                return fail(&e, self.mode, stderr);
            }
        };
        let plan = Plan {
            incumbent: incumbent_build,
            candidate,
            workload: workload.to_path_buf(),
            model: model.to_path_buf(),
            orientation,
            reproduces,
            frozen,
        };
        recorded.reproduces = plan.reproduces.as_ref().map(|(d, _)| *d);
        if let Err(e) = receipt.set_inputs(&recorded) {
            return fail(&e, self.mode, stderr);
        }
        let mut read = |inputs: &Inputs, lock: &crate::lock::GpuLock| {
            session_under(self.policy, &self.cfg, inputs, lock)
        };
        match qualify::qualify(self.policy, &self.cfg, &plan, &mut read, self.mode, stderr) {
            Err(e) if e.exit_class() == ExitCode::Usage => fail(&e, self.mode, stderr),
            result => {
                receipt.evidence = self.cfg.evidence.take();
                stage::finish(&self.store, &mut receipt, result, self.mode, stdout, stderr)
            }
        }
    }
}

/// Run the tool: the whole of `main`.
pub fn run(
    args: &Args,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    cordon::voice::set_level(args.stage.level());
    let mode = args.stage.diagnostics;
    // Where a model belongs is for anyone to ask; every other command runs or reads devices.
    if !matches!(args.command, Command::Model { .. })
        && let Err(code) = cordon_stage::start::require_root(
            &cordon_stage::start::RootStage {
                tool: "cordon-lane",
                why: "it runs engines in containers as per-run accounts and reads the lanes' devices",
                stage: match &args.command {
                    Command::Session { .. } => Some(StageName::Lane),
                    Command::Qualify { .. } => Some(StageName::Qualify),
                    Command::Model { .. } | Command::Devices { .. } => None,
                },
                policy: &args.stage.policy,
            },
            mode,
            stdout,
            stderr,
        )
    {
        return code;
    }
    let (loaded, authority, runtime_version) =
        match cordon_stage::start::stage_start(&args.stage.policy, mode, stderr) {
            Ok(s) => (s.loaded, s.authority, s.runtime.version),
            Err(code) => return code,
        };
    let policy = &loaded.policy;
    let (images, lease) = (&args.images, &args.lease);
    let (stage_name, file) = match &args.command {
        Command::Model { dir } => return model_path(policy, dir, mode, stdout, stderr),
        Command::Devices { drain } => return devices(policy, *drain, mode, stdout, stderr),
        Command::Session { receipt, .. } => (StageName::Lane, receipt),
        Command::Qualify { candidate, .. } => (StageName::Qualify, candidate),
    };
    let store = match stage::open_store(
        &args.stage.store_root(policy),
        (stage_name, authority),
        mode,
        stdout,
        stderr,
    ) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (input, prev) = match stage::input_or_exit(
        file.as_deref(),
        stdin,
        stage_name,
        &authority,
        &store,
        mode,
        stdout,
        stderr,
    ) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let cfg = Config::on_host(
        &store,
        images,
        lease.setup(policy),
        (authority, runtime_version),
    );
    let invocation = Invocation {
        policy,
        store,
        cfg,
        authority,
        input,
        prev,
        mode,
    };
    match &args.command {
        Command::Model { .. } | Command::Devices { .. } => {
            unreachable!("answered before any store is opened")
        }
        Command::Session {
            role,
            workload,
            model,
            ..
        } => invocation.session(role, workload, model, stdout, stderr),
        Command::Qualify {
            incumbent,
            workload,
            model,
            reproduce,
            ..
        } => invocation.qualify(
            incumbent,
            workload,
            model,
            reproduce.as_deref(),
            stdout,
            stderr,
        ),
    }
}

/// `cordon-lane model DIR`: the model's digest and where the policy's models root registers it.
fn model_path(
    policy: &cordon_policy_lang::Policy,
    dir: &std::path::Path,
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    match crate::model::verify(dir) {
        Ok((_, digest)) => {
            let at =
                std::path::Path::new(policy.models_root()).join(format!("sha256-{}", digest.hex()));
            match writeln!(stdout, "{digest} {}", at.display()) {
                Ok(()) => ExitCode::Ok,
                Err(_) => ExitCode::NoDecision,
            }
        }
        Err(e) => fail(&crate::session::LaneError::Model(e), mode, stderr),
    }
}

/// `cordon-lane devices`: the lanes' GPUs through NVML ([`crate::devices`]).
fn devices(
    policy: &cordon_policy_lang::Policy,
    drain: bool,
    mode: Diagnostics,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    let named = crate::devices::named(policy);
    if named.is_empty() {
        return usage(
            stderr,
            "no physical lane of the policy names a GPU (physical-lane … { gpu \"GPU-…\" { … } })",
        );
    }
    let uuids: Vec<String> = named.into_iter().map(|(_, u)| u).collect();
    let gpus = match cordon_device::nvml::Nvml::open(&uuids) {
        Ok(g) => g,
        Err(e) => {
            report_diagnostic(&e, mode, stderr);
            return ExitCode::NoDecision;
        }
    };
    let specs = match cordon_stage::cdi::read_specs(cordon_stage::cdi::SPEC_DIRS) {
        Ok(s) => s,
        Err(why) => {
            let _ = writeln!(
                stderr,
                "cordon-lane: the host's CDI specs: {}",
                cordon::text::printable(&why)
            );
            return ExitCode::NoDecision;
        }
    };
    let files = cordon_stage::cdi::files(&specs);
    let clock = cordon_device::SystemClock::default();
    let (report, ok) = crate::devices::report(
        policy,
        &files,
        &gpus,
        &clock,
        (drain, &crate::devices::character_device),
    );
    // Canonical JSON escapes what could drive a terminal (a driver's string, a spec's path).
    match cordon::canonical::to_canonical_json(&report) {
        Ok(text) if writeln!(stdout, "{text}").is_ok() => crate::devices::exit(ok),
        _ => ExitCode::NoDecision,
    }
}

/// The primary attempt a reproduction exchanges: an `ok` qualify receipt this store holds,
/// whose chain walks back to intake under this authority, of the same incumbent and candidate
/// builds, decided under the same speed policy — and whose verdict recomputes from its own
/// windows to what it says.
fn reproduction(
    store: &Store,
    policy: &cordon_policy_lang::Policy,
    path: &std::path::Path,
    authority: &Digest,
    builds: (Digest, Digest),
    frozen: &qualify::Frozen,
) -> Result<(qualify::Orientation, (Digest, QualifyOutputs)), String> {
    let (incumbent, candidate) = builds;
    let (_, digest) = stage::read_input(
        Some(path),
        &mut std::io::empty(),
        StageName::Qualify,
        authority,
    )
    .map_err(|e| format!("the primary attempt: {e}"))?;
    // The store's copy, re-hashed, never the file's: a hand-written receipt names nothing
    // the store established.
    let first =
        cordon::chain::load(store, &digest).map_err(|e| format!("the primary attempt: {e}"))?;
    stage::require_chain(store, &digest, authority)
        .map_err(|e| format!("the primary attempt: {e}"))?;
    let outputs = first
        .outputs_as::<QualifyOutputs>()
        .map_err(|e| format!("the primary attempt: {e}"))?;
    let asked = first
        .inputs_as::<QualifyInputs>()
        .map_err(|e| format!("the primary attempt: {e}"))?;
    if (asked.incumbent, asked.candidate) != (incumbent, candidate) {
        return Err("the primary attempt qualified other builds".into());
    }
    let speed = policy
        .speed()
        .ok_or_else(|| "the policy has no speed section".to_owned())?;
    if qualify::speed_policy_digest(speed).map_err(|e| e.to_string())? != outputs.speed_policy {
        return Err("the primary attempt was decided under another speed policy".into());
    }
    let w = &outputs.windows;
    if crate::speed::decide(speed, &w.b, &w.c, &w.b2) != outputs.speed {
        return Err("the primary attempt's verdict does not recompute from its windows".into());
    }
    let o = qualify::exchanged(policy, &outputs, frozen).map_err(|e| e.to_string())?;
    Ok((o, (digest, outputs)))
}

/// The whole of `cordon-lane`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdin(cordon_stage::args::parse::<Args>, run)
}

#[cfg(test)]
mod tests {
    use cordon::receipt::{FetchOutputs, IncumbentOutputs, MaterializeOutputs, StageOutputs};

    use super::*;

    /// Every option is taken before or after the subcommand, as every other binary takes it.
    #[test]
    fn options_go_before_or_after_the_subcommand() {
        let opts = [
            "--images",
            "/i",
            "--executor",
            "e",
            "--state-root",
            "/s",
            "--run-dir",
            "/r",
            "-q",
            "--policy",
            "/p",
        ];
        let session = ["session", "--role", "B", "--workload", "w", "--model", "m"];
        for args in [
            [&opts[..], &session[..]].concat(),
            [&session[..], &opts[..]].concat(),
        ] {
            let a =
                Args::try_parse_from(std::iter::once("cordon-lane").chain(args.iter().copied()))
                    .unwrap();
            assert_eq!(a.images, Path::new("/i"));
            assert_eq!(a.lease.executor.as_deref(), Some("e"));
            assert_eq!(a.lease.state_root, Path::new("/s"));
            assert_eq!(a.lease.run_dir.as_deref(), Some(Path::new("/r")));
            assert_eq!(a.stage.policy, Path::new("/p"));
            assert!(a.stage.quiet);
        }
    }

    fn put<T: StageOutputs>(
        store: &Store,
        stage: StageName,
        a: Digest,
        prev: Option<Digest>,
        outputs: &T,
    ) -> (Receipt, Digest) {
        let mut r = Receipt::new(stage, a, Outcome::Ok);
        r.prev = prev;
        r.set_outputs(outputs).unwrap();
        r.inputs = serde_json::json!({ "tree": Digest::of_bytes(b"tree") });
        let d = r.digest().unwrap();
        store
            .put_document(
                "receipts",
                &format!("{}.json", d.hex()),
                r.to_canonical_json().unwrap().as_bytes(),
            )
            .unwrap();
        (r, d)
    }

    #[test]
    fn a_build_runs_only_in_the_role_its_chain_starts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let a = Digest::of_bytes(b"authority");
        let tree = Digest::of_bytes(b"tree");
        let prebuilt = PrebuildOutputs {
            publication: Digest::of_bytes(b"publication"),
            files: 1,
            bytes: 1,
            cached: false,
            meta: None,
        };
        let (_, registration) = put(
            &store,
            StageName::Materialize,
            a,
            None,
            &IncumbentOutputs {
                tree_digest: tree,
                incumbent: "engine".into(),
                step: Some("build-native".into()),
                files: 1,
                bytes: 1,
            },
        );
        let (b, b_digest) = put(
            &store,
            StageName::Prebuild,
            a,
            Some(registration),
            &prebuilt,
        );
        let (_, fetch) = put(
            &store,
            StageName::Fetch,
            a,
            None,
            &FetchOutputs {
                archive_sha256: tree,
                content_digest: tree,
                files: 1,
                bytes: 1,
            },
        );
        let (_, materialized) = put(
            &store,
            StageName::Materialize,
            a,
            Some(fetch),
            &MaterializeOutputs {
                tree_digest: tree,
                delta_digest: tree,
                incumbent: tree,
                target: "attention".into(),
                namespace: None,
                step: None,
                findings: Vec::new(),
            },
        );
        let (c, c_digest) = put(
            &store,
            StageName::Prebuild,
            a,
            Some(materialized),
            &prebuilt,
        );
        let mut err = Vec::new();
        let mode = Diagnostics::Text;
        let role_of = |r: &Receipt, d: Digest, role: Role, err: &mut Vec<u8>| {
            build_of(&store, r, d, role, &a, mode, err).map(|(b, _)| b.receipt)
        };
        assert_eq!(role_of(&b, b_digest, Role::B, &mut err), Ok(b_digest));
        assert_eq!(role_of(&c, c_digest, Role::C, &mut err), Ok(c_digest));
        assert_eq!(
            role_of(&c, c_digest, Role::B, &mut err),
            Err(ExitCode::Usage)
        );
        assert_eq!(
            role_of(&b, b_digest, Role::C, &mut err),
            Err(ExitCode::Usage)
        );
        let said = String::from_utf8(err).unwrap();
        assert!(
            said.contains("role B needs a prebuild of the incumbent's chain"),
            "{said}"
        );
    }
}
