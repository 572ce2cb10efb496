//! The native prebuild stage: its own concern only — the registered step, the cache, the
//! inventory bounds and the sealed publication.
//!
//! Parse: the registered step the delta asked for (an unregistered or non-prebuild step is a
//! rejection), the stage's publication bounds, the pinned image. Plan: reopen and verify the
//! tree, verify and unpack the image, look the (tree, step, image, authority) key up in the
//! cache. Apply: one [`Session`] (lease, account, the planned staging tmpfs bounded in bytes and
//! inodes, one disposable container under every control of the `prebuild` stage, release with
//! its absence proof — a release that cannot be established overrides the result), whose
//! inspection inventories staging and seals the publication (published without replace,
//! reopened and re-verified) while the staging mount still exists.

use std::path::{Path, PathBuf};
use std::time::Instant;

use cordon::canonical::{Digest, domain_digest};
use cordon::container::Input;
use cordon::receipt::{Decision, Rejection};
use cordon::runtime::{Finished, Meta};
use cordon::store::StoreError;
use cordon::tree::{self, Entry, PUBLICATIONS, TREES, TreeRecord};
use cordon_policy_lang::{MountSource, Policy, PublicationLimits, StageKind};
use cordon_stage::bundle::{PlanError, Planned};
use cordon_stage::session::{Job, SessionError};
use serde_json::json;

use crate::aot;
use crate::inventory::{self, Bounds};
use cordon_stage::compile::{Encoded, Request};

/// Where the stage works.
pub use cordon_stage::session::StageConfig as Config;

/// A sealed publication the stage established.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Its record.
    pub publication: TreeRecord,
    /// The build's meta record (none when the cache answered).
    pub meta: Option<Meta>,
    /// Whether the cache answered and no container ran.
    pub cached: bool,
}

/// What the stage decided: a publication, or a rejection whose evidence is the build's meta
/// record (when a container ran).
pub type Outcome = Decision<Published>;

/// What cordon itself could not establish (exit 3), or a wiring error (exit 2).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PrebuildError {
    /// The policy has no usable prebuild stage or image pin.
    #[error("the policy cannot run a prebuild: {0}")]
    #[diagnostic(code(cordon::prebuild::policy))]
    Policy(String),
    /// The tree or a publication is missing or corrupt.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Tree(#[from] tree::TreeError),
    /// The image is missing or not the pinned one.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Image(#[from] cordon::image::ImageError),
    /// The store failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The session could not establish its run.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Session(#[from] SessionError),
    /// Encoding failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Canonical(#[from] cordon::canonical::CanonicalError),
    /// A cached publication's control record does not say this build made it.
    #[error("the cached {0}")]
    #[diagnostic(
        code(cordon::prebuild::control),
        help("the store has been tampered with, or the cache entry is stale: quarantine it")
    )]
    Control(String),
    /// The patcher's bounded child could not be held or read.
    #[error("the patcher's bounded child: {0}")]
    #[diagnostic(code(cordon::prebuild::child))]
    Child(String),
    /// The container was killed by a host process that is not cordon's deadline or the OOM
    /// killer (an operator, `cordon-reap` ending an expired lease): no verdict on the candidate.
    #[error(
        "the build container was killed from outside (SIGKILL not sent by cordon or the OOM killer)"
    )]
    #[diagnostic(code(cordon::prebuild::killed_from_outside))]
    KilledFromOutside,
    /// The host could not read the staging area (out of descriptors or memory).
    #[error(transparent)]
    #[diagnostic(code(cordon::prebuild::inventory))]
    Inventory(inventory::InventoryError),
    /// The sealed-direct-artifact tier's profile child could not be started, confined or
    /// released.
    #[error("the compile profile's confined child: {0}")]
    #[diagnostic(code(cordon::prebuild::profile_child))]
    ProfileChild(String),
    /// The secret file could not be read.
    #[error("cannot read the step's secret {path}")]
    #[diagnostic(code(cordon::prebuild::secret))]
    Secret {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl cordon_stage::receipt_io::Infrastructure for PrebuildError {
    fn reason_code(&self) -> &'static str {
        "prebuild.infrastructure"
    }
}

fn cache_name(key: &Digest) -> String {
    format!("{}.cache.json", key.hex())
}

/// A rejection, with the build's meta record when a container ran.
#[must_use]
pub fn rejected(code: &str, message: String, meta: Option<Meta>) -> Outcome {
    Decision::Rejected(Rejection::one(code, message, json!({ "meta": meta })))
}

/// Run the prebuild of `tree` with registered step `step`; `candidate` when the tree is a
/// candidate's (a materialized delta, not an incumbent's registration): an incident of its
/// build then stops it under this authority.
///
/// # Errors
/// Anything cordon could not establish.
pub fn prebuild(
    policy: &Policy,
    cfg: &Config,
    tree_digest: &Digest,
    step: &str,
    candidate: bool,
) -> Result<Outcome, PrebuildError> {
    let started = Instant::now();
    let (argv, tier) = match (policy.step(step), policy.step_tier(step)) {
        (Some((StageKind::Prebuild, argv)), Some(tier)) => (argv.to_vec(), tier),
        _ => {
            let why = format!("{step:?} is not a registered prebuild step of the policy");
            return Ok(rejected("prebuild.unknown-step", why, None));
        }
    };
    let stage =
        policy
            .stage(StageKind::Prebuild)
            .ok_or(SessionError::Plan(PlanError::NoStage {
                kind: StageKind::Prebuild,
            }))?;
    let Some(PublicationLimits {
        max_files,
        max_bytes,
        max_file_bytes,
        max_depth,
        max_path_length,
    }) = stage.publication
    else {
        return Err(PrebuildError::Policy(
            "the prebuild stage has no publication bounds".into(),
        ));
    };
    let bounds = Bounds {
        max_files,
        max_bytes,
        max_file_bytes,
        max_depth,
        max_path_length,
    };
    let (role, pin) =
        cordon_stage::bundle::image_of(policy, StageKind::Prebuild).map_err(SessionError::Plan)?;

    // Plan: everything is verified before anything runs.
    let record = tree::verify(&cfg.store, tree_digest)?;
    let compile =
        cordon_stage::compile::request_for(&record, tier).map_err(PrebuildError::Policy)?;
    let request = compile.as_ref().map(|c| c.digest);
    let rootfs = cordon::image::unpack(&cfg.store, &cfg.images.join(role), &pin)?;
    let key = domain_digest(
        "cordon.prebuild-cache",
        2,
        &json!({
            "tree": tree_digest, "step": step, "image": pin, "authority": cfg.authority,
            "request": request,
        }),
    )?;
    if let Ok(bytes) = cfg.store.read_document("publications", &cache_name(&key)) {
        let cached: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| PrebuildError::Policy(format!("cache entry: {e}")))?;
        let digest: Digest = cached["publication"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| PrebuildError::Policy("cache entry names no publication".into()))?;
        // The cache names a publication; its control record must say this build made it.
        let publication =
            cordon_stage::publication::reopen(&cfg.store, policy, &digest, tree_digest, Some(step))
                .map_err(|e| e.map_or_else(PrebuildError::Tree, PrebuildError::Control))?;
        return Ok(Decision::Accepted(Published {
            publication,
            meta: None,
            cached: true,
        }));
    }

    // A secret reaches the declared step on standard input only: never an env var or a mount.
    // The sealed-direct-artifact patcher's standard input is the compile request instead.
    let stdin = match (policy.step_secret(step), &compile) {
        (Some(_), Some(_)) => {
            return Err(PrebuildError::Policy(format!(
                "step {step:?} is the sealed-direct-artifact patcher: its standard input is the \
                 compile request, so it cannot also take a secret"
            )));
        }
        (Some(p), None) => {
            Input::Bytes(std::fs::read(p).map_err(|source| PrebuildError::Secret {
                path: PathBuf::from(p),
                source,
            })?)
        }
        (None, Some(c)) => Input::Bytes(c.bytes.clone()),
        (None, None) => Input::Null,
    };
    let session = cfg.session(policy, StageKind::Prebuild);
    // What the host saw of the patcher's bounded child, read while its cgroup exists.
    let child_seen: std::cell::Cell<Option<ChildSeen>> = std::cell::Cell::new(None);
    let job = Job {
        argv,
        image_rootfs: rootfs,
        sources: [(
            MountSource::Tree,
            tree::root_in(&cfg.store, TREES, tree_digest),
        )]
        .into(),
        stdin,
        live_stdout: false,
        live_stderr: false,
        started,
        framed: false,
        lane: None,
        candidate: candidate.then_some(*tree_digest),
    };
    let ran = session.run(
        &job,
        |running, planned, deadline| {
            if let Some(child) = &planned.child {
                child_seen.set(Some(hold_child(cfg, running, planned, child, deadline)?));
            }
            Ok::<(), PrebuildError>(())
        },
        |lease, planned, finished| {
            // What made these entries: the publication's name covers it, and every stage
            // that reopens the publication checks it against the tree it runs.
            let control =
                cordon_stage::publication::built(policy, &record, step, &lease.record.lease)
                    .map_err(PrebuildError::Policy)?;
            collect(
                cfg,
                planned,
                finished,
                (lease.ended_by_reap(), child_seen.get()),
                &bounds,
                control.to_origin()?,
                compile.is_some(),
            )
        },
    )?;
    match ran.inspected {
        Staged::Refused(outcome) => Ok(outcome),
        Staged::Built(built) => seal(policy, cfg, built, compile.as_ref(), &key),
    }
}

/// What the host saw of a patcher's bounded child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildSeen {
    /// The host killed it at its deadline.
    pub deadline_killed: bool,
    /// The kernel's OOM kills in its cgroup (`None`: unreadable).
    pub oom_kills: Option<u64>,
    /// Its cgroup's peak memory (`None`: unreadable; 0: nothing ever ran in it).
    pub peak_bytes: Option<u64>,
    /// Its deadline, milliseconds.
    pub deadline_ms: u64,
}

/// Hold the patcher's child to its deadline (the host's, out of the build's reach): at it,
/// every process in the child's cgroup is killed (as the run account's, through a pidfd) until
/// none is left; then what its cgroup counted is read, before the delete removes it.
///
/// # Errors
/// The container cannot be waited for, or the child's processes cannot be read or killed.
fn hold_child(
    cfg: &Config,
    running: &cordon::container::Running,
    planned: &Planned,
    child: &cordon_stage::bundle::ChildPlan,
    deadline: Instant,
) -> Result<ChildSeen, PrebuildError> {
    let host = cfg.setup.host();
    let fail = |why: String| PrebuildError::Child(why);
    let at = (Instant::now() + std::time::Duration::from_millis(child.deadline_ms)).min(deadline);
    let exited = running
        .exited_by(at)
        .map_err(|e| fail(format!("cannot wait for the container: {e}")))?;
    let deadline_killed = !exited && Instant::now() < deadline;
    if deadline_killed {
        let uid = planned
            .spec
            .process()
            .as_ref()
            .map_or(0, |p| p.user().uid());
        let procs = child.memory.join("cgroup.procs");
        // On v2 the kernel kills the whole cgroup at once, forks in flight included.
        if let Some(kill) = &child.kill {
            host.write_control(kill, b"1")
                .map_err(|e| fail(format!("cannot write {}: {e}", kill.display())))?;
        }
        // A process may fork while its siblings die: read and kill until the cgroup is empty
        // (its pids limit bounds how many can appear; on v2 the kill above already ended them,
        // and this waits until the kernel has).
        let mut left = Vec::new();
        for _ in 0..64 {
            let text = host
                .read(&procs)
                .map_err(|e| fail(format!("cannot read {}: {e}", procs.display())))?;
            left = String::from_utf8_lossy(&text)
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect();
            if left.is_empty() {
                break;
            }
            for pid in &left {
                host.kill_of(*pid, uid)
                    .map_err(|e| fail(format!("cannot kill process {pid} of the child: {e}")))?;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if !left.is_empty() {
            return Err(fail(format!(
                "processes {left:?} of the child outlived its deadline"
            )));
        }
    }
    let probe = cordon::runtime::CgroupProbe {
        host: cfg.setup.runtime.host.clone(),
        root: cfg.setup.cgroup_root.clone(),
        path: child.cgroup.clone(),
    };
    let (oom_kills, peak_bytes, _) = probe.accounting();
    Ok(ChildSeen {
        deadline_killed,
        oom_kills,
        peak_bytes,
        deadline_ms: child.deadline_ms,
    })
}

/// How a process ended, for people: "exited with code 7", "was killed by SIGSEGV".
fn how_it_ended(meta: &Meta) -> String {
    match (meta.exit_code, meta.signal) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(n)) => {
            let name = nix::sys::signal::Signal::try_from(n)
                .map_or_else(|_| format!("signal {n}"), |s| s.as_str().to_owned());
            format!("was killed by {name}")
        }
        (None, None) => "ended without an exit code or a signal".to_owned(),
    }
}

/// How the patcher's child ended, as the candidate's failure (its reason code and message), or
/// `None`: neither its deadline nor its memory ended it.
///
/// # Errors
/// [`PrebuildError::Child`]: its cgroup's counts cannot be read, or nothing ever ran in it (the
/// patcher did not place the build there: no bound of the child held it).
fn child_failure(c: &ChildSeen) -> Result<Option<(&'static str, String)>, PrebuildError> {
    let (Some(oom_kills), Some(peak)) = (c.oom_kills, c.peak_bytes) else {
        return Err(PrebuildError::Child(
            "the child's cgroup cannot be read".into(),
        ));
    };
    if peak == 0 {
        return Err(PrebuildError::Child(
            "nothing ran in the child's cgroup: the patcher did not place the build in its bounded child".into(),
        ));
    }
    Ok(if c.deadline_killed {
        Some((
            "prebuild.child-deadline",
            format!(
                "the build (the patcher's child) was killed by the host at its deadline of {}",
                cordon_policy_lang::units::format_duration(c.deadline_ms)
            ),
        ))
    } else if oom_kills > 0 {
        Some((
            "prebuild.oom",
            "the build (the patcher's child) was killed for memory".to_owned(),
        ))
    } else {
        None
    })
}

/// How the build step ended, as the candidate's failure (its reason code and message), or
/// `None`: it exited 0.
///
/// # Errors
/// [`PrebuildError::KilledFromOutside`]: cordon-reap ended the run, which says nothing of the
/// candidate.
fn failure(
    meta: &Meta,
    ended_by_reap: bool,
) -> Result<Option<(&'static str, String)>, PrebuildError> {
    Ok(if meta.killed_by_deadline {
        Some((
            "prebuild.deadline",
            format!(
                "the build step was killed by SIGKILL at the stage's deadline, after {}",
                cordon_policy_lang::units::format_duration(meta.wall_ms)
            ),
        ))
    } else if meta.oom_killed {
        Some((
            "prebuild.oom",
            "the build step was killed for memory".to_owned(),
        ))
    } else if meta.signal == Some(9) && ended_by_reap {
        // cordon-reap marked the lease before it killed the container: the run was ended from
        // outside and says nothing about the candidate. Only that positive evidence counts —
        // any other SIGKILL (a resource limit the candidate set itself, say) is its own.
        return Err(PrebuildError::KilledFromOutside);
    } else if meta.exit_code != Some(0) {
        Some((
            "prebuild.exit",
            format!("the build step {}", how_it_ended(meta)),
        ))
    } else {
        None
    })
}

/// What the build left in staging, before it is sealed.
enum Staged<'s> {
    /// A rejection.
    Refused(Outcome),
    /// Its files, copied into the store's scratch, not yet published.
    Built(Built<'s>),
}

/// A build's files ready to seal.
struct Built<'s> {
    batch: cordon::store::Batch<'s>,
    entries: Vec<Entry>,
    origin: serde_json::Value,
    meta: Meta,
    /// The compile profile's bytes (the sealed-direct-artifact tier's), read, never decoded.
    profile: Option<Vec<u8>>,
}

/// What the build left: a rejection, or its files copied out of staging while the staging
/// mount still exists; `compiled` for a sealed-direct-artifact build, whose staging must be
/// exactly the ABI's result layout.
fn collect<'s>(
    cfg: &'s Config,
    planned: &Planned,
    finished: &Finished,
    (ended_by_reap, child): (bool, Option<ChildSeen>),
    bounds: &Bounds,
    origin: serde_json::Value,
    compiled: bool,
) -> Result<Staged<'s>, PrebuildError> {
    let meta = finished.meta.clone();
    let failure = match failure(&meta, ended_by_reap)? {
        // The stage's own deadline and memory come first; then what the host saw of the
        // patcher's child, which the patcher's exit status only echoes.
        Some((code @ ("prebuild.deadline" | "prebuild.oom"), why)) => Some((code, why)),
        other => match child {
            Some(c) => child_failure(&c)?.or(other),
            None => other,
        },
    };
    if let Some((code, message)) = failure {
        return Ok(Staged::Refused(rejected(code, message, Some(meta))));
    }
    let staging: &Path = planned
        .staging_dir
        .as_deref()
        .ok_or_else(|| PrebuildError::Policy("the prebuild stage has no staging".into()))?;
    let items = match inventory::inventory(staging, bounds) {
        Ok(items) => items,
        Err(inventory::InventoryError::Refused(r)) => {
            let why = format!("{}: {}", r.path, r.message);
            return Ok(Staged::Refused(rejected(r.code, why, Some(meta))));
        }
        Err(host @ inventory::InventoryError::Host { .. }) => {
            return Err(PrebuildError::Inventory(host));
        }
    };
    let files = items
        .iter()
        .map(|i| (i.path.as_str(), i.size, i.executable));
    if compiled && let Err(why) = aot::layout(files) {
        return Ok(Staged::Refused(rejected(
            "publication.aot-layout",
            why,
            Some(meta),
        )));
    }
    let mut batch = cfg.store.batch()?;
    let mut entries = Vec::new();
    let mut profile = None;
    for item in items {
        let (sha, size) = if compiled && item.path == aot::PROFILE {
            // Bounded by the layout check; kept for the confined child, copied as it is.
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(&item.file, aot::MAX_PROFILE_BYTES + 1),
                &mut bytes,
            )
            .map_err(|source| StoreError::Io {
                op: "read",
                path: staging.join(aot::PROFILE),
                source,
            })?;
            let added = batch.add_reader(bytes.as_slice(), item.executable)?;
            profile = Some(bytes);
            added
        } else {
            batch.add_reader(&item.file, item.executable)?
        };
        entries.push(Entry {
            path: item.path,
            mode: if item.executable { 0o555 } else { 0o444 },
            size,
            sha256: sha,
        });
    }
    Ok(Staged::Built(Built {
        batch,
        entries,
        origin,
        meta,
        profile,
    }))
}

/// The largest answer of the profile child: the profile, decoded, and its framing.
const PROFILE_ANSWER_BYTES: u32 = 4 * 64 * 1024;

/// Seal `built`: a compiled build's profile first decoded by its confined child and checked
/// against the request and the artifact's size as the store counted it (a refusal is the
/// candidate's); then
/// the objects, the publication (published without replace, reopened and re-verified) and the
/// cache entry.
fn seal(
    policy: &Policy,
    cfg: &Config,
    built: Built<'_>,
    compile: Option<&Encoded>,
    key: &Digest,
) -> Result<Outcome, PrebuildError> {
    if let Some(c) = compile {
        // The layout check admitted no compiled build without its profile.
        let profile = built.profile.as_deref().ok_or_else(|| {
            PrebuildError::Policy("a compiled build reached its seal without a profile".into())
        })?;
        let artifact = built
            .entries
            .iter()
            .find(|e| e.path == aot::ARTIFACT)
            .map(|e| e.size)
            .ok_or_else(|| PrebuildError::Policy("the checked layout has no artifact".into()))?;
        if let Err(why) = check_profile(policy, cfg, profile, &c.request, artifact)? {
            return Ok(rejected("publication.aot-profile", why, Some(built.meta)));
        }
    }
    built.batch.commit()?;
    let record = tree::publish_in(&cfg.store, PUBLICATIONS, built.entries, built.origin)?;
    // Reopened and re-verified before it is named anywhere.
    let publication = tree::verify_in(&cfg.store, PUBLICATIONS, &record.digest)?;
    let doc = cordon::canonical::to_canonical_json(&json!({ "publication": publication.digest }))?;
    cfg.store
        .put_document("publications", &cache_name(key), doc.as_bytes())?;
    Ok(Decision::Accepted(Published {
        publication,
        meta: Some(built.meta),
        cached: false,
    }))
}

/// `profile` decoded by the confined child [`aot::PROFILE_CHILD`] under a parser lease of its
/// own, and its answer checked ([`aot::accept`]): `Ok(Err(why))` is the candidate's refusal.
///
/// # Errors
/// The child could not be started, confined or released.
fn check_profile(
    policy: &Policy,
    cfg: &Config,
    profile: &[u8],
    request: &Request,
    artifact: u64,
) -> Result<Result<aot::Profile, String>, PrebuildError> {
    use cordon::confine::ExchangeError;
    let exchanged = cordon_stage::parser::under_setup(
        policy,
        cfg.setup.clone(),
        &cfg.store,
        &cfg.authority,
        aot::PROFILE_CHILD,
        &cfg.exe,
        cordon_stage::parser::budget(policy),
        |launch| cordon::confine::exchange(launch, profile, PROFILE_ANSWER_BYTES),
    )
    .map_err(|e| PrebuildError::ProfileChild(e.to_string()))?;
    match exchanged {
        Ok(answer) => Ok(aot::accept(&answer, request, artifact)),
        Err(ExchangeError::Broke(why)) => Ok(Err(format!("the profile child broke on it: {why}"))),
        Err(ExchangeError::Infrastructure(why)) => Err(PrebuildError::ProfileChild(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_a_step_ended_is_worded_for_people() {
        let meta = |exit_code, signal| Meta {
            exit_code,
            signal,
            ..Meta::default()
        };
        assert_eq!(how_it_ended(&meta(Some(7), None)), "exited with code 7");
        assert_eq!(how_it_ended(&meta(None, Some(11))), "was killed by SIGSEGV");
        assert_eq!(
            how_it_ended(&meta(None, Some(99))),
            "was killed by signal 99"
        );
        assert_eq!(
            how_it_ended(&meta(None, None)),
            "ended without an exit code or a signal"
        );
    }

    /// Only the deadline, memory, a kill cordon-reap marked and an exit other than 0 end a
    /// build; a SIGKILL nobody marked (one the candidate arranged) is its own failure, and a
    /// mark with another end says nothing.
    #[test]
    fn how_a_step_ended_decides_the_outcome() {
        let meta = |exit_code, signal, deadline, oom| Meta {
            exit_code,
            signal,
            killed_by_deadline: deadline,
            oom_killed: oom,
            ..Meta::default()
        };
        let code = |m: &Meta, reap| failure(m, reap).map(|f| f.map(|(code, _)| code));
        assert!(matches!(
            code(&meta(Some(0), None, false, false), false),
            Ok(None)
        ));
        assert!(matches!(
            code(&meta(None, Some(9), true, false), true),
            Ok(Some("prebuild.deadline"))
        ));
        assert!(matches!(
            code(&meta(None, Some(9), false, true), true),
            Ok(Some("prebuild.oom"))
        ));
        assert!(matches!(
            code(&meta(None, Some(9), false, false), true),
            Err(PrebuildError::KilledFromOutside)
        ));
        assert!(matches!(
            code(&meta(None, Some(9), false, false), false),
            Ok(Some("prebuild.exit"))
        ));
        assert!(matches!(
            code(&meta(None, Some(15), false, false), true),
            Ok(Some("prebuild.exit"))
        ));
        assert!(matches!(
            code(&meta(Some(0), None, false, false), true),
            Ok(None)
        ));
        assert!(matches!(
            code(&meta(Some(2), None, false, false), false),
            Ok(Some("prebuild.exit"))
        ));
    }
}
