//! The native prebuild stage: parse → plan → apply.
//!
//! Parse: the registered step the delta asked for (an unregistered or non-prebuild step is a
//! rejection), the stage's settings, the pinned image. Plan: reopen and verify the tree,
//! verify and unpack the image, look the (tree, step, image, authority) key up in the cache.
//! Apply: one lease — record, account, run directory, a tmpfs staging mount bounded in bytes
//! and inodes — one disposable container under every control of the policy's `prebuild` stage,
//! the inventory of staging, the sealed publication (published without replace, reopened and
//! re-verified), and release with its absence proof. Release runs whatever happened before it;
//! if it cannot be established, the outcome is a no-decision whatever the build did.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon::canonical::{Digest, domain_digest};
use cordon::lease::{Lease, LeaseError, Manager, Setup};
use cordon::runtime::{Meta, OutputCaps};
use cordon::store::{Store, StoreError};
use cordon::tree::{self, Entry, PUBLICATIONS, TREES, TreeRecord};
use cordon_policy_lang::{MountSource, Policy, PublicationLimits, StageKind, Staging};
use cordon_stage::bundle::{self, HostMount, RunInputs};
use serde_json::json;

use crate::inventory::{self, Bounds};

/// Where the stage works.
#[derive(Debug, Clone)]
pub struct Config {
    /// The store.
    pub store: Store,
    /// The directory holding image layouts, one per role (`<dir>/<role>`).
    pub images: PathBuf,
    /// The lease manager's setup.
    pub setup: Setup,
    /// The authority identity.
    pub authority: Digest,
}

/// What the stage established.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A sealed publication.
    Published {
        /// Its record.
        publication: TreeRecord,
        /// The build's meta record (none when the cache answered).
        meta: Option<Meta>,
        /// Whether the cache answered and no container ran.
        cached: bool,
    },
    /// The candidate's build failed a rule.
    Rejected {
        /// Stable reason code.
        code: &'static str,
        /// The sentence.
        message: String,
        /// The build's meta record, when a container ran.
        meta: Option<Meta>,
    },
}

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
    /// The lease, account, mounts, runtime or cleanup failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(#[from] LeaseError),
    /// The store failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The stage cannot be planned.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] bundle::PlanError),
    /// Encoding failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Canonical(#[from] cordon::canonical::CanonicalError),
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

fn cache_name(key: &Digest) -> String {
    format!("{}.cache.json", key.hex())
}

/// Run the prebuild of `tree` with registered step `step`.
///
/// # Errors
/// Anything cordon could not establish.
pub fn prebuild(
    policy: &Policy,
    cfg: &Config,
    tree_digest: &Digest,
    step: &str,
) -> Result<Outcome, PrebuildError> {
    let started = Instant::now();
    let argv = match policy.step(step) {
        Some((StageKind::Prebuild, argv)) => argv.to_vec(),
        _ => {
            return Ok(Outcome::Rejected {
                code: "prebuild.unknown-step",
                message: format!("{step:?} is not a registered prebuild step of the policy"),
                meta: None,
            });
        }
    };
    let run = policy
        .stage(StageKind::Prebuild)
        .ok_or_else(|| PrebuildError::Policy("no stage \"prebuild\"".into()))?;
    let role = run.image.clone();
    let pin = *policy
        .image_pin(&role)
        .ok_or_else(|| PrebuildError::Policy(format!("image role {role:?} is not pinned")))?;
    let Some(Staging { .. }) = run.staging else {
        return Err(PrebuildError::Policy(
            "the prebuild stage has no staging".into(),
        ));
    };
    let Some(PublicationLimits {
        max_files,
        max_bytes,
        max_file_bytes,
        max_depth,
        max_path_length,
    }) = run.publication
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
    let deadline = started + Duration::from_millis(run.deadline_ms);

    // Plan: everything is verified before anything runs.
    tree::verify(&cfg.store, tree_digest)?;
    let rootfs = cordon::image::unpack(&cfg.store, &cfg.images.join(&role), &pin)?;
    let key = domain_digest(
        "cordon.prebuild-cache",
        1,
        &json!({ "tree": tree_digest, "step": step, "image": pin, "authority": cfg.authority }),
    )?;
    if let Ok(bytes) = cfg.store.read_document("publications", &cache_name(&key)) {
        let cached: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| PrebuildError::Policy(format!("cache entry: {e}")))?;
        let digest: Digest = cached["publication"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| PrebuildError::Policy("cache entry names no publication".into()))?;
        let publication = tree::verify_in(&cfg.store, PUBLICATIONS, &digest)?;
        return Ok(Outcome::Published {
            publication,
            meta: None,
            cached: true,
        });
    }

    // Apply, on a runtime that runs and is new enough (its digest and version are already part
    // of the authority).
    cfg.setup.runtime.preflight().map_err(LeaseError::from)?;
    let manager = Manager::open(&cfg.store, cfg.setup.clone())?;
    let lease = manager.begin_with(&cfg.authority.to_string(), &bundle::lease_mount_points(run))?;
    let job = Job {
        argv,
        step,
        rootfs,
        bounds,
        caps: OutputCaps {
            stdout: run.output.stdout_bytes,
            stderr: run.output.stderr_bytes,
        },
        deadline,
        tree: tree_digest,
        key,
    };
    let result = build(policy, cfg, &manager, lease.clone(), &job);
    // Release whatever happened; a release that cannot be established overrides the result.
    manager.release(&lease.record)?;
    result
}

/// Everything one build needs, established before the lease exists.
struct Job<'a> {
    argv: Vec<String>,
    step: &'a str,
    rootfs: PathBuf,
    bounds: Bounds,
    caps: OutputCaps,
    deadline: Instant,
    tree: &'a Digest,
    key: Digest,
}

fn build(
    policy: &Policy,
    cfg: &Config,
    manager: &Manager,
    mut lease: Lease,
    job: &Job<'_>,
) -> Result<Outcome, PrebuildError> {
    let (argv, step, tree_digest, key, bounds) =
        (&job.argv, job.step, job.tree, &job.key, &job.bounds);
    manager.provision(&lease)?;
    let store_root = cfg.store.root().to_path_buf();
    let inputs = RunInputs {
        argv: argv.clone(),
        uid: lease.record.account.uid,
        gid: lease.record.account.gid,
        image_rootfs: job.rootfs.clone(),
        run_dir: lease.record.run_dir.clone(),
        sources: [(
            MountSource::Tree,
            tree::root_in(&cfg.store, TREES, tree_digest),
        )]
        .into(),
        devices: Default::default(),
        executor: lease.record.executor.clone(),
        lease: lease.record.lease.clone(),
        authority: lease.record.authority.clone(),
        protected: [
            Some(store_root.clone()),
            Some(lease.bundle_dir()),
            Some(cfg.setup.runtime.state_root.clone()),
            std::env::current_dir().ok(),
        ]
        .into_iter()
        .flatten()
        .collect(),
        mountable_store_roots: vec![store_root.join("trees")],
    };
    let planned = bundle::plan(policy, StageKind::Prebuild, &inputs)?;
    let mut staging = None;
    for m in &planned.host_mounts {
        match m {
            HostMount::Tmpfs {
                target,
                bytes,
                inodes,
                ..
            } => {
                staging = Some(manager.mount_staging(&lease, target, *bytes, *inodes)?);
            }
            HostMount::Overlay { .. } => {
                return Err(PrebuildError::Policy(
                    "the prebuild stage runs on a read-only root".into(),
                ));
            }
        }
    }
    let staging =
        staging.ok_or_else(|| PrebuildError::Policy("the prebuild stage has no staging".into()))?;
    let config = cordon::canonical::to_canonical_json(&planned.spec)?;
    manager.write_protected(&mut lease, "config.json", config.as_bytes())?;
    // A secret reaches the declared step on standard input only: never an env var or a mount.
    let stdin = match policy.step_secret(step) {
        Some(p) => Some(std::fs::read(p).map_err(|source| PrebuildError::Secret {
            path: PathBuf::from(p),
            source,
        })?),
        None => None,
    };
    let finished = manager.run(&lease, job.deadline, job.caps, stdin)?;
    let meta = finished.meta.clone();
    let failure = if meta.killed_by_deadline {
        Some((
            "prebuild.deadline",
            "the build step ran past the stage's deadline".to_owned(),
        ))
    } else if meta.oom_killed {
        Some((
            "prebuild.oom",
            "the build step was killed for memory".to_owned(),
        ))
    } else if meta.exit_code != Some(0) {
        Some((
            "prebuild.exit",
            format!(
                "the build step ended with exit code {:?}, signal {:?}",
                meta.exit_code, meta.signal
            ),
        ))
    } else {
        None
    };
    if let Some((code, message)) = failure {
        return Ok(Outcome::Rejected {
            code,
            message,
            meta: Some(meta),
        });
    }
    let items = match inventory::inventory(&staging, bounds) {
        Ok(items) => items,
        Err(r) => {
            return Ok(Outcome::Rejected {
                code: r.code,
                message: format!("{}: {}", r.path, r.message),
                meta: Some(meta),
            });
        }
    };
    let mut batch = cfg.store.batch()?;
    let mut entries = Vec::new();
    for item in items {
        let (sha, size) = batch.add_reader(&item.file, item.executable)?;
        entries.push(Entry {
            path: item.path,
            mode: if item.executable { 0o555 } else { 0o444 },
            size,
            sha256: sha,
        });
    }
    batch.commit()?;
    let origin = json!({ "kind": "publication", "tree": tree_digest, "step": step, "lease": lease.record.lease });
    let record = tree::publish_in(&cfg.store, PUBLICATIONS, entries, origin)?;
    // Reopened and re-verified before it is named anywhere.
    let publication = tree::verify_in(&cfg.store, PUBLICATIONS, &record.digest)?;
    let doc = cordon::canonical::to_canonical_json(&json!({ "publication": publication.digest }))?;
    cfg.store
        .put_document("publications", &cache_name(key), doc.as_bytes())?;
    Ok(Outcome::Published {
        publication,
        meta: Some(meta),
        cached: false,
    })
}
