//! The validated policy: what one evaluator host's authority is.
//!
//! Values only, no spans: a [`Policy`] exists only after every check in [`crate::build`] has
//! passed, and its fields are private to this crate so nothing can build or change one that
//! skipped validation. Its `Serialize` form is the canonical form (sets are `BTreeSet`s and
//! named entries `BTreeMap`s, sizes are `*_bytes`, durations `*_ms`, CPU counts `*_milli`);
//! [`crate::canonical`] hashes it and [`crate::diff`] compares it leaf by leaf.

use std::collections::{BTreeMap, BTreeSet};

use cordon::Digest;
use serde::Serialize;

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub(crate) policy: Header,
    pub(crate) store: String,
    pub(crate) run_dir: String,
    pub(crate) runtime: Runtime,
    pub(crate) accounts: Accounts,
    pub(crate) secret: BTreeMap<String, Secret>,
    pub(crate) intake: Intake,
    pub(crate) tree: Tree,
    pub(crate) image: BTreeMap<String, Digest>,
    pub(crate) seccomp: BTreeMap<String, SeccompProfile>,
    pub(crate) stage: BTreeMap<String, Stage>,
    pub(crate) step: BTreeMap<String, Step>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Header {
    pub(crate) name: String,
    pub(crate) version: u64,
}

/// The OCI runtime the policy names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Runtime {
    pub(crate) kind: String,
    pub(crate) path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sha256: Option<Digest>,
}

impl Runtime {
    /// `runc`, `crun` or `runsc`.
    #[must_use]
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The runtime binary's absolute path.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The digest the binary must have, when the policy pins one.
    #[must_use]
    pub fn pin(&self) -> Option<&Digest> {
        self.sha256.as_ref()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct IdRange {
    pub(crate) first: u64,
    pub(crate) last: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Accounts {
    pub(crate) uid_range: IdRange,
    pub(crate) gid_range: IdRange,
    pub(crate) shell: String,
    pub(crate) cron_deny: String,
    pub(crate) at_deny: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Secret {
    pub(crate) path: String,
}

/// An allow-list entry's justification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Reasoned {
    pub(crate) reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Intake {
    pub(crate) transport: Transport,
    pub(crate) archive: ArchiveLimits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Transport {
    pub(crate) allow_host: BTreeMap<String, Reasoned>,
    pub(crate) max_redirects: u64,
    pub(crate) deadline_ms: u64,
    pub(crate) min_tls: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) trust_anchor: Option<String>,
    pub(crate) allow_loopback: bool,
    pub(crate) allow_plain_http_loopback: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ArchiveLimits {
    pub(crate) max_archive_bytes: u64,
    pub(crate) max_extracted_bytes: u64,
    pub(crate) max_members: u64,
    pub(crate) max_file_bytes: u64,
    pub(crate) max_path_length: u64,
    pub(crate) max_depth: u64,
    pub(crate) max_pax_bytes: u64,
    pub(crate) max_compression_ratio: u64,
    pub(crate) exclude: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Tree {
    pub(crate) limits: TreeLimits,
    pub(crate) python: Python,
    pub(crate) tiers: Tiers,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct TreeLimits {
    pub(crate) max_files: u64,
    pub(crate) max_file_bytes: u64,
    pub(crate) max_total_bytes: u64,
    pub(crate) max_depth: u64,
    pub(crate) max_path_length: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Python {
    pub(crate) ban_call: BTreeSet<String>,
    pub(crate) ban_import: BTreeSet<String>,
    pub(crate) ban_attribute_call: BTreeSet<String>,
    pub(crate) jit_entry_point: BTreeMap<String, Reasoned>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Tiers {
    pub(crate) executables: bool,
    pub(crate) cuda_sources: bool,
    pub(crate) dependency_patches: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SeccompProfile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) baseline: Option<String>,
    pub(crate) default_action: String,
    pub(crate) architectures: BTreeSet<String>,
    /// The effective rule set: the baseline's entries with the policy's removals and additions
    /// applied, so two spellings of the same filter have one canonical form.
    pub(crate) syscall: BTreeMap<String, SyscallRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) struct ArgCondition {
    pub(crate) index: u64,
    pub(crate) op: String,
    pub(crate) value: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mask: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SyscallRule {
    /// `allow`, `errno:N`, `kill-process`, `trap` or `log`.
    pub(crate) action: String,
    /// ANDed conditions, sorted: their order does not matter to the kernel.
    pub(crate) args: Vec<ArgCondition>,
    pub(crate) reason: String,
}

/// One stage's settings, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage {
    pub(crate) image: String,
    pub(crate) network: String,
    pub(crate) root: String,
    pub(crate) ipc: String,
    pub(crate) capability: BTreeMap<String, Reasoned>,
    pub(crate) no_new_privileges: bool,
    pub(crate) seccomp: String,
    pub(crate) user: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpus_milli: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpuset: Option<String>,
    pub(crate) memory_bytes: u64,
    pub(crate) pids: u64,
    pub(crate) nofile: u64,
    pub(crate) core_bytes: u64,
    pub(crate) shm_bytes: u64,
    pub(crate) tmp: Tmp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) staging: Option<Staging>,
    pub(crate) deadline_ms: u64,
    pub(crate) phase_deadline_ms: BTreeMap<String, u64>,
    pub(crate) gpu_device: BTreeMap<String, Reasoned>,
    pub(crate) env: BTreeMap<String, String>,
    /// Keyed by destination inside the container.
    pub(crate) mount: BTreeMap<String, Mount>,
    pub(crate) output: Output,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) publication: Option<PublicationLimits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) frame: Option<Frame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) surface: Option<Surface>,
    pub(crate) sys: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Tmp {
    pub(crate) size_bytes: u64,
    pub(crate) exec: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Staging {
    pub(crate) size_bytes: u64,
    pub(crate) inodes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Mount {
    pub(crate) source: String,
    pub(crate) mode: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Output {
    pub(crate) stdout_bytes: u64,
    pub(crate) stderr_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PublicationLimits {
    pub(crate) max_files: u64,
    pub(crate) max_bytes: u64,
    pub(crate) max_file_bytes: u64,
    pub(crate) max_depth: u64,
    pub(crate) max_path_length: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Frame {
    pub(crate) max_bytes: u64,
    pub(crate) max_frames: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Surface {
    pub(crate) read: BTreeMap<String, Reasoned>,
    pub(crate) write: String,
    pub(crate) deny_env: BTreeSet<String>,
    pub(crate) deny_file: BTreeSet<String>,
    pub(crate) tmpdir_prefix_max: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Step {
    pub(crate) stage: String,
    pub(crate) argv: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) secret: Option<String>,
}

impl Policy {
    /// The policy's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.policy.name
    }

    /// The OCI runtime.
    #[must_use]
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Image role → pinned manifest digest.
    #[must_use]
    pub fn images(&self) -> &BTreeMap<String, Digest> {
        &self.image
    }

    /// The stage of this kind, when the policy declares one.
    #[must_use]
    pub fn stage(&self, kind: &str) -> Option<&Stage> {
        self.stage.get(kind)
    }

    /// The declared stage kinds.
    pub fn stage_kinds(&self) -> impl Iterator<Item = &str> {
        self.stage.keys().map(String::as_str)
    }
}

impl Stage {
    /// The image role this stage runs.
    #[must_use]
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The seccomp profile this stage runs under.
    #[must_use]
    pub fn seccomp_profile(&self) -> &str {
        &self.seccomp
    }
}

/// How intake may reach a remote source (policy `intake { transport { … } }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportRules<'a> {
    /// Hosts an `https://` source may name, exactly.
    pub allow_hosts: Vec<&'a str>,
    /// Redirects followed at most.
    pub max_redirects: u64,
    /// One deadline for the whole transfer, redirects included, in milliseconds.
    pub deadline_ms: u64,
    /// `"1.2"` or `"1.3"`.
    pub min_tls: &'a str,
    /// A PEM file whose certificates are the only trust anchors, when set.
    pub trust_anchor: Option<&'a str>,
    /// Whether loopback addresses may be connected to (tests only).
    pub allow_loopback: bool,
    /// Whether plain `http://` to a loopback address is accepted (tests only).
    pub allow_plain_http_loopback: bool,
}

/// The static checks on a materialized tree (policy `tree { … }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeRules {
    /// Files in the tree at most.
    pub max_files: u64,
    /// Bytes of one file at most.
    pub max_file_bytes: u64,
    /// Bytes of the whole tree at most.
    pub max_total_bytes: u64,
    /// Path components at most.
    pub max_depth: u64,
    /// Path bytes at most.
    pub max_path_length: u64,
    /// Names that may not be called (`eval(…)`, and `x.eval(…)`).
    pub ban_call: BTreeSet<String>,
    /// Modules that may not be imported (a name bans its submodules too).
    pub ban_import: BTreeSet<String>,
    /// Attribute names that may not be called (`x.exec_module(…)`).
    pub ban_attribute_call: BTreeSet<String>,
    /// Admitted JIT entry points, `module.function` (the CuTe DSL carve-out).
    pub jit_entry_points: BTreeSet<String>,
    /// Whether a delta may declare executables.
    pub executables: bool,
    /// Whether a delta may declare CUDA sources.
    pub cuda_sources: bool,
    /// Whether a delta may declare dependency patches.
    pub dependency_patches: bool,
}

impl Policy {
    /// The store directory.
    #[must_use]
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The archive bounds, in the form the safe tar reader takes.
    #[must_use]
    pub fn archive_limits(&self) -> cordon::archive::ArchiveLimits {
        let a = &self.intake.archive;
        cordon::archive::ArchiveLimits {
            max_archive_bytes: a.max_archive_bytes,
            max_extracted_bytes: a.max_extracted_bytes,
            max_members: a.max_members,
            max_file_bytes: a.max_file_bytes,
            max_path_length: a.max_path_length,
            max_depth: a.max_depth,
            max_pax_bytes: a.max_pax_bytes,
            max_compression_ratio: a.max_compression_ratio,
            exclude: a.exclude.iter().cloned().collect(),
        }
    }

    /// The transport rules for remote intake.
    #[must_use]
    pub fn transport(&self) -> TransportRules<'_> {
        let t = &self.intake.transport;
        TransportRules {
            allow_hosts: t.allow_host.keys().map(String::as_str).collect(),
            max_redirects: t.max_redirects,
            deadline_ms: t.deadline_ms,
            min_tls: &t.min_tls,
            trust_anchor: t.trust_anchor.as_deref(),
            allow_loopback: t.allow_loopback,
            allow_plain_http_loopback: t.allow_plain_http_loopback,
        }
    }

    /// The tree guard's bounds and the Python AST policy.
    #[must_use]
    pub fn tree_rules(&self) -> TreeRules {
        let t = &self.tree;
        TreeRules {
            max_files: t.limits.max_files,
            max_file_bytes: t.limits.max_file_bytes,
            max_total_bytes: t.limits.max_total_bytes,
            max_depth: t.limits.max_depth,
            max_path_length: t.limits.max_path_length,
            ban_call: t.python.ban_call.clone(),
            ban_import: t.python.ban_import.clone(),
            ban_attribute_call: t.python.ban_attribute_call.clone(),
            jit_entry_points: t.python.jit_entry_point.keys().cloned().collect(),
            executables: t.tiers.executables,
            cuda_sources: t.tiers.cuda_sources,
            dependency_patches: t.tiers.dependency_patches,
        }
    }

    /// The names of the registered build steps.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.step.keys().map(String::as_str)
    }

    /// The registered build step `name`: its stage kind and exact argv.
    #[must_use]
    pub fn step(&self, name: &str) -> Option<(&str, &[String])> {
        self.step
            .get(name)
            .map(|s| (s.stage.as_str(), s.argv.as_slice()))
    }
}

impl Policy {
    /// The run-directory root.
    #[must_use]
    pub fn run_dir(&self) -> &str {
        &self.run_dir
    }

    /// The per-run account settings, in the form the account module takes.
    #[must_use]
    pub fn account_policy(&self) -> cordon::account::AccountPolicy {
        let a = &self.accounts;
        let r = |x: &IdRange| {
            (
                u32::try_from(x.first).unwrap_or(u32::MAX),
                u32::try_from(x.last).unwrap_or(u32::MAX),
            )
        };
        cordon::account::AccountPolicy {
            uids: r(&a.uid_range),
            gids: r(&a.gid_range),
            shell: a.shell.clone().into(),
            cron_deny: a.cron_deny.clone().into(),
            at_deny: a.at_deny.clone().into(),
        }
    }
}

/// What one stage kind runs with, beyond its bundle: the plain values a stage binary needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRun {
    /// The image role, and its pinned manifest digest.
    pub image: (String, Option<Digest>),
    /// The absolute deadline of the whole stage, ms.
    pub deadline_ms: u64,
    /// Output caps (stdout, stderr), bytes.
    pub output: (u64, u64),
    /// The staging bounds (bytes, inodes), for stages that have staging.
    pub staging: Option<(u64, u64)>,
    /// The publication bounds (files, bytes, per-file bytes, depth, path length).
    pub publication: Option<(u64, u64, u64, u64, u64)>,
}

impl Policy {
    /// The run settings of stage `kind`.
    #[must_use]
    pub fn stage_run(&self, kind: &str) -> Option<StageRun> {
        let s = self.stage.get(kind)?;
        Some(StageRun {
            image: (s.image.clone(), self.image.get(&s.image).copied()),
            deadline_ms: s.deadline_ms,
            output: (s.output.stdout_bytes, s.output.stderr_bytes),
            staging: s.staging.as_ref().map(|st| (st.size_bytes, st.inodes)),
            publication: s.publication.as_ref().map(|p| {
                (
                    p.max_files,
                    p.max_bytes,
                    p.max_file_bytes,
                    p.max_depth,
                    p.max_path_length,
                )
            }),
        })
    }

    /// The secret file a registered step receives on standard input, if it declares one.
    #[must_use]
    pub fn step_secret(&self, step: &str) -> Option<&str> {
        let name = self.step.get(step)?.secret.as_ref()?;
        self.secret.get(name).map(|s| s.path.as_str())
    }
}
