//! The validated policy: what one evaluator host's authority is.
//!
//! Values only, no spans: a [`Policy`] exists only after every check in [`crate::build`] has
//! passed, and its fields are private to this crate so nothing can build or change one that
//! skipped validation. Its `Serialize` form is the canonical form (sets are `BTreeSet`s and
//! named entries `BTreeMap`s, sizes are `*_bytes`, durations `*_ms`, CPU counts `*_milli`);
//! [`crate::canonical`] hashes it and [`crate::diff`] compares it leaf by leaf.

use std::collections::{BTreeMap, BTreeSet};

use cordon_canon::Digest;
use serde::Serialize;

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub(crate) policy: Header,
    pub(crate) store: String,
    pub(crate) run_dir: String,
    /// The models root: each model the lane mounts is registered there by its digest.
    pub(crate) models: String,
    /// Host paths no stage may ever bind, each with its reason.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) never_mount: BTreeMap<String, String>,
    pub(crate) runtime: Runtime,
    pub(crate) accounts: Accounts,
    pub(crate) host: Host,
    pub(crate) secret: BTreeMap<String, Secret>,
    pub(crate) intake: Intake,
    pub(crate) tree: Tree,
    pub(crate) image: BTreeMap<String, Digest>,
    /// cordon-worker's sha256, the bytes the runtime image ships (absent: no lane can run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<Digest>,
    /// The pristine reference tree's digest: a separately registered stock tree, never the
    /// incumbent (absent: no reference session can run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pristine: Option<Digest>,
    pub(crate) seccomp: BTreeMap<String, SeccompProfile>,
    /// The two physical lanes of a qualification, by name (none: no qualification can run).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) physical_lane: BTreeMap<String, PhysicalLane>,
    /// The device guard's rules (present exactly when a physical lane names GPUs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) device_guard: Option<DeviceGuard>,
    /// The reviewed speed verdict (absent: no qualification can be decided).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) speed: Option<Speed>,
    /// The sampled slot audit the qualification plan asks for (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) audit: Option<Audit>,
    /// The final verdict needs a primary attempt and its reproduction (`reproduction
    /// "required"`), not one attempt.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) reproduction_required: bool,
    /// The reviewed quality verdict (absent: no final verdict can be decided).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quality: Option<Quality>,
    pub(crate) stage: BTreeMap<StageKind, Stage>,
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
    pub(crate) kind: RuntimeKind,
    pub(crate) path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sha256: Option<Digest>,
    /// The lowest release the policy accepts, (major, minor, patch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_version: Option<(u32, u32, u32)>,
}

impl Runtime {
    /// `runc`, `crun` or `runsc`.
    #[must_use]
    pub fn kind(&self) -> RuntimeKind {
        self.kind
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

    /// The policy's minimum release, when it sets one (the toolchain's own floor and its list of
    /// known-bad releases apply regardless).
    #[must_use]
    pub fn min_version(&self) -> Option<(u32, u32, u32)> {
        self.min_version
    }
}

/// An inclusive range of nonzero ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdRange {
    /// The first id.
    pub first: u32,
    /// The last id.
    pub last: u32,
}

/// A physical lane: the device set one read of a qualification runs on. With `gpu "none"` it
/// is a CPU set; the two lanes are disjoint and of identical shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PhysicalLane {
    /// The CPUs, as a cpu list (`"0-3"`).
    pub cpuset: String,
    /// The CPU weight of a session on the lane (OCI `linux.resources.cpu.shares`, 2–262144;
    /// runc converts it to `cpu.weight` on cgroup v2): host work the operator left on the
    /// lane's CPUs yields to the timed read. Absent, the kernel's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    /// The lane's GPUs by UUID, each with the configuration the policy pins (none: a CPU set).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gpus: BTreeMap<String, DeviceConfig>,
}

/// The device guard's rules: what a drained GPU is, the envelope of the active sample, and the
/// container-device hooks a CDI spec may run (each named with its reason; any other refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceGuard {
    /// The drain before and after every read.
    pub drain: DrainRule,
    /// The bounds of the sample taken during the last warmup request.
    pub envelope: Envelope,
    /// Hooks a CDI spec may ask for, by program path, each with its reason.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cdi_hooks: BTreeMap<String, String>,
}

/// The CPUs a cpu list names (`"0-3,8"` → 0, 1, 2, 3, 8), or `None` when it is not one.
#[must_use]
pub fn cpu_list(s: &str) -> Option<std::collections::BTreeSet<u32>> {
    let mut out = std::collections::BTreeSet::new();
    for item in s.split(',') {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = item.parse::<u32>().ok()?;
                (a, a)
            }
        };
        // A bounded range: the list names CPUs of one host, not a span to enumerate.
        if a > b || b - a > 4096 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

pub use cordon_evidence::audit::Audit;
pub use cordon_evidence::device::{ComputeMode, DeviceConfig, DrainRule, Envelope};
pub use cordon_evidence::quality::Quality;
pub use cordon_evidence::speed::Speed;

/// What a host must be for a candidate stage to run on it (`host { … }`): the memory it keeps
/// for itself, and its side-channel posture — seed 001 calls co-tenancy a deployment decision,
/// and this is where it is made, reviewed, never assumed. Every value left out is the
/// strictest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Host {
    /// Memory the host keeps for itself (the supervisor, the runtime, the kernel): a stage
    /// runs only when its memory limit and the copies the host makes for it fit in the rest.
    pub memory_reserve_bytes: u64,
    /// Running under a hypervisor: what the host reads of SMT and the CPU's vulnerabilities is
    /// then the guest's view, and the physical core may be shared with another tenant.
    pub hypervisor: Allowance,
    /// Simultaneous multithreading: a candidate on one hardware thread shares a core's caches
    /// and ports with whatever runs on its sibling.
    pub smt: Allowance,
    /// The unprivileged `bpf()` system call, a long line of kernel exploits and side channels.
    pub unprivileged_bpf: Allowance,
    /// CPU vulnerabilities the kernel reports as `Vulnerable` that the policy accepts, each with
    /// its reason; every other one must read `Not affected` or `Mitigation: …`.
    pub accept_vulnerable: BTreeMap<String, String>,
}

/// A host feature the policy wants off, or allows with a stated reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum Allowance {
    /// It must be off on the host.
    Off,
    /// The host may have it on, for this reason.
    On {
        /// Why.
        reason: String,
    },
}

/// The per-run account rules (REQ-117).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Accounts {
    /// Where uids come from.
    pub uid_range: IdRange,
    /// Where gids come from.
    pub gid_range: IdRange,
    /// The no-login shell.
    pub shell: String,
    /// cron's deny file.
    pub cron_deny: String,
    /// at's deny file.
    pub at_deny: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Secret {
    pub(crate) path: String,
}

/// An allow-list entry's justification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reasoned {
    /// Why the entry is there.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Intake {
    pub(crate) transport: Transport,
    pub(crate) archive: ArchiveLimits,
    pub(crate) parser: ParserLimits,
}

/// The limits a confined parser child sets on itself before it reads candidate bytes
/// (policy `intake { parser { … } }`, REQ-117): one child per fetch and per materialization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ParserLimits {
    /// Address space, bytes (`RLIMIT_AS`).
    pub address_space: u64,
    /// CPU time, milliseconds (`RLIMIT_CPU`, rounded up to whole seconds).
    pub cpu_time_ms: u64,
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

/// The bounds of the safe tar reader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveLimits {
    /// Archive bytes at most.
    pub max_archive_bytes: u64,
    /// Extracted bytes at most.
    pub max_extracted_bytes: u64,
    /// Members at most.
    pub max_members: u64,
    /// Bytes of one member at most.
    pub max_file_bytes: u64,
    /// Path bytes at most.
    pub max_path_length: u64,
    /// Path components at most.
    pub max_depth: u64,
    /// PAX header bytes at most.
    pub max_pax_bytes: u64,
    /// Extracted-to-archive ratio at most.
    pub max_compression_ratio: u64,
    /// Names (or `*.ext` patterns) dropped from every archive.
    pub exclude: BTreeSet<String>,
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
    pub(crate) native_sources: bool,
    pub(crate) dependency_patches: bool,
}

/// A seccomp profile, as its effective rule set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeccompProfile {
    /// The baseline it started from, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// What a call no rule matches gets (never allow or log).
    pub default_action: SeccompAction,
    /// The architectures the filter covers.
    pub architectures: BTreeSet<Arch>,
    /// The effective rule set: the baseline's entries with the policy's removals and additions
    /// applied, so two spellings of the same filter have one canonical form.
    pub syscall: BTreeMap<String, SyscallRule>,
}

/// One ANDed argument condition.
///
/// `bits` is the width the kernel reads the argument at (from the syscall's signature in
/// [`crate::syscalls::arg_widths`]), not a policy choice: seccomp compares all 64 bits of the
/// register, so a 32-bit argument is compared masked to its low half, and operators that
/// cannot be made to mean the same thing on a 32-bit argument are refused when the policy is
/// read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ArgCondition {
    /// The argument's index (0 to 5).
    pub index: u64,
    /// How many bits of the argument the kernel reads: 32 or 64.
    pub bits: u32,
    /// The comparison.
    pub op: ArgOp,
    /// The values compared with: exactly one, except for `one-of` (two or more, sorted).
    pub values: Vec<u64>,
    /// The mask, exactly when `op` is `masked-eq`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<u64>,
}

/// One system call's rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyscallRule {
    /// What the call gets.
    pub action: SeccompAction,
    /// ANDed conditions, sorted: their order does not matter to the kernel.
    pub args: Vec<ArgCondition>,
    /// Why.
    pub reason: String,
}

/// A keyword of the language: an enum whose values are spelled as in the policy file, and
/// serialized the same way, so the canonical form reads like the policy.
pub trait Keyword: Sized + Copy + 'static {
    /// Every value with its spelling, in declaration order.
    const ALL: &'static [(&'static str, Self)];

    /// The value spelled `text`.
    fn from_keyword(text: &str) -> Option<Self> {
        Self::ALL.iter().find(|(k, _)| *k == text).map(|(_, v)| *v)
    }

    /// Every spelling.
    fn keywords() -> Vec<&'static str> {
        Self::ALL.iter().map(|(k, _)| *k).collect()
    }
}

macro_rules! keyword {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl Keyword for $name {
            const ALL: &'static [(&'static str, Self)] = &[$(($text, Self::$variant),)+];
        }

        impl $name {
            /// The spelling in the policy file.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::from_keyword(&text).ok_or_else(|| {
                    serde::de::Error::unknown_variant(&text, &[$($text,)+])
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

keyword! {
    /// The stage kinds, in pipeline order.
    StageKind {
        /// The disposable native build container.
        Prebuild = "prebuild",
        /// The GPU runtime container.
        Lane = "lane",
        /// The pristine reference session.
        Reference = "reference",
        /// The workspace-bounded agent surface.
        Surface = "surface",
    }
}

keyword! {
    /// The reviewed-build tiers of seed 001 §3: how a delta's native part is built. Each maps to
    /// one registered prebuild step (its patcher); a delta declares its tier in its manifest.
    BuildTier {
        /// The tree's own `build.sh` (the incumbent's) run as the patcher's bounded child.
        NativeRebuild = "native-rebuild",
        /// Declared C, C++ and CUDA sources compiled by the patcher with validator-owned flags.
        NativeSources = "native-sources",
        /// A declared patch against a dependency pinned by digest, applied and built by the
        /// patcher.
        DependencyPatch = "dependency-patch",
        /// A declared candidate factory called in a bounded child under the closed
        /// compile-request/profile ABI (AOT); the host never imports it nor loads its product.
        SealedDirectArtifact = "sealed-direct-artifact",
    }
}

keyword! {
    /// The container's network.
    Network {
        /// A new, empty network namespace (loopback only).
        None = "none",
        /// A private network namespace whose traffic leaves only through a user-space
        /// forwarder, host loopback unreachable (the surface stage only). Never the host's
        /// namespace: that would also expose host loopback services and abstract sockets.
        Egress = "egress",
    }
}

keyword! {
    /// The container's root filesystem.
    RootMode {
        /// The image rootfs, mounted read-only.
        ReadOnly = "read-only",
        /// A per-lease disposable overlay over the read-only image rootfs.
        Overlay = "overlay",
        /// No image: an empty read-only root in which only the surface's named read set and
        /// workspace exist (the surface stage only, and its only root).
        Empty = "empty",
    }
}

keyword! {
    /// System V IPC and POSIX shared memory.
    Ipc {
        /// A new IPC namespace and no `/dev/shm` at all.
        None = "none",
        /// A new IPC namespace with a bounded private `/dev/shm`.
        Private = "private",
    }
}

keyword! {
    /// Whom the workload runs as.
    User {
        /// A fresh per-run account (REQ-117).
        PerRun = "per-run",
        /// The unprivileged service user that invokes the surface, behind a user namespace
        /// that maps only it (the surface stage only; never root).
        Service = "service",
    }
}

keyword! {
    /// A bind's writability.
    MountMode {
        /// Read-only.
        Ro = "ro",
        /// Writable (staging and workspace only).
        Rw = "rw",
    }
}

keyword! {
    /// What a bind mounts: a role whose host path only the host knows at run time.
    MountSource {
        /// The materialized engine tree.
        Tree = "tree",
        /// The sealed native publication.
        Publication = "publication",
        /// The model weights.
        Model = "model",
        /// The lease's bounded staging tmpfs.
        Staging = "staging",
        /// The lease's bounded runtime cache tmpfs (engine caches, JIT kernels).
        Cache = "cache",
        /// The agent's workspace.
        Workspace = "workspace",
    }
}

keyword! {
    /// `/sys` in the container.
    Sys {
        /// No `/sys`.
        None = "none",
        /// A read-only `/sys`.
        ReadOnly = "read-only",
    }
}

keyword! {
    /// A seccomp argument comparison.
    ArgOp {
        /// Equal.
        Eq = "eq",
        /// Not equal.
        Ne = "ne",
        /// Less than.
        Lt = "lt",
        /// Less or equal.
        Le = "le",
        /// Greater than.
        Gt = "gt",
        /// Greater or equal.
        Ge = "ge",
        /// `(arg & mask) == value`.
        MaskedEq = "masked-eq",
        /// Equal to one of a listed set: the allow-list form.
        OneOf = "one-of",
    }
}

keyword! {
    /// A seccomp filter architecture.
    Arch {
        /// x32 (declared first so that sets sort as their spellings do).
        X32 = "x32",
        /// i386.
        X86 = "x86",
        /// amd64.
        X86_64 = "x86_64",
    }
}

keyword! {
    /// The OCI runtime's kind.
    RuntimeKind {
        /// runc.
        Runc = "runc",
        /// crun.
        Crun = "crun",
        /// gVisor's runsc.
        Runsc = "runsc",
    }
}

keyword! {
    /// What the surface may write.
    WriteScope {
        /// Its workspace only.
        Workspace = "workspace",
    }
}

/// What a seccomp rule (or the default) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SeccompAction {
    /// Let the call through.
    Allow,
    /// Fail it with this errno.
    Errno(u32),
    /// Kill the whole process.
    KillProcess,
    /// Kill the calling thread.
    KillThread,
    /// Send SIGSYS.
    Trap,
    /// Let it through and log it.
    Log,
}

impl SeccompAction {
    /// The canonical spelling: `allow`, `errno:N`, `kill-process`, `kill-thread`, `trap`, `log`.
    #[must_use]
    pub fn spelling(self) -> String {
        match self {
            Self::Allow => "allow".into(),
            Self::Errno(n) => format!("errno:{n}"),
            Self::KillProcess => "kill-process".into(),
            Self::KillThread => "kill-thread".into(),
            Self::Trap => "trap".into(),
            Self::Log => "log".into(),
        }
    }
}

impl std::fmt::Display for SeccompAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelling())
    }
}

impl Serialize for SeccompAction {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.spelling())
    }
}

/// One stage's settings, defaults filled in. Fields are public so that the planner can
/// destructure a stage exhaustively (a new field is a compile error there); a stage that counts
/// is only ever read out of a validated [`Policy`], whose own fields are private.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage {
    /// The image role it runs (every stage but the surface, whose root is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its network.
    pub network: Network,
    /// Its root filesystem.
    pub root: RootMode,
    /// Its IPC namespace.
    pub ipc: Ipc,
    /// Capabilities granted (usually none), each with its reason.
    pub capability: BTreeMap<String, Reasoned>,
    /// `no_new_privileges` (validated to be true).
    pub no_new_privileges: bool,
    /// The seccomp profile's name (validated to exist).
    pub seccomp: String,
    /// Whom the workload runs as.
    pub user: User,
    /// CPU quota in thousandths of a CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus_milli: Option<u64>,
    /// Or a cpuset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpuset: Option<String>,
    /// Memory (and memory+swap) limit (required in every stage but the surface).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// PID limit (required in every stage but the surface).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_CORE.
    pub core_bytes: u64,
    /// `/dev/shm` size: present exactly when `ipc` is `private`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_bytes: Option<u64>,
    /// The private `/tmp`.
    pub tmp: Tmp,
    /// The lease-scoped staging tmpfs (prebuild).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staging: Option<Staging>,
    /// The prebuild patcher's bounded child: its own share under the stage's, held by the
    /// host (prebuild only, required there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<Child>,
    /// The runtime cache tmpfs bounds (lane and reference only; exec allowed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<Staging>,
    /// The overlay root's writable layer: a tmpfs of the lease's, bounded (with root
    /// "overlay" only, where it is required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlay: Option<Staging>,
    /// The whole stage's deadline.
    pub deadline_ms: u64,
    /// Named phases' deadlines (each at most the stage's).
    pub phase_deadline_ms: BTreeMap<String, u64>,
    /// GPU device nodes the container may open, each with its reason.
    pub gpu_device: BTreeMap<String, Reasoned>,
    /// The exact environment.
    pub env: BTreeMap<String, String>,
    /// Binds, keyed by destination inside the container.
    pub mount: BTreeMap<String, Mount>,
    /// Output caps.
    pub output: Output,
    /// Publication bounds (prebuild).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publication: Option<PublicationLimits>,
    /// Protocol framing bounds (lane, reference).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<Frame>,
    /// The agent surface's bounds (surface).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub surface: Option<Surface>,
    /// `/sys` in the container.
    pub sys: Sys,
}

/// The private `/tmp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tmp {
    /// Its size.
    pub size_bytes: u64,
    /// Whether it allows exec.
    pub exec: bool,
}

/// A lease tmpfs's bounds: the prebuild's staging, the lane's runtime cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Staging {
    /// Bytes.
    pub size_bytes: u64,
    /// Inodes.
    pub inodes: u64,
}

/// The bounds of a patcher's child (seed 001 §3: candidate work runs only as a bounded child
/// of a registered patcher): a nested cgroup the host prepares and a deadline the host holds,
/// each strictly inside the stage's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Child {
    /// The CPU quota, thousandths of a CPU.
    pub cpus_milli: u64,
    /// Memory, swap included, bytes.
    pub memory_bytes: u64,
    /// Tasks.
    pub pids: u64,
    /// Its deadline, counted from the container's start, milliseconds.
    pub deadline_ms: u64,
}

/// One bind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// Its source role.
    pub source: MountSource,
    /// Its mode.
    pub mode: MountMode,
}

/// Output caps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Output {
    /// Bytes of stdout kept.
    pub stdout_bytes: u64,
    /// Bytes of stderr kept.
    pub stderr_bytes: u64,
}

/// Bounds on a sealed publication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublicationLimits {
    /// Files at most.
    pub max_files: u64,
    /// Bytes at most.
    pub max_bytes: u64,
    /// Bytes of one file at most.
    pub max_file_bytes: u64,
    /// Path depth at most.
    pub max_depth: u64,
    /// Path bytes at most.
    pub max_path_length: u64,
}

/// Protocol framing bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// Bytes of one frame at most.
    pub max_bytes: u64,
    /// Frames of one session at most.
    pub max_frames: u64,
}

/// The agent surface's bounds (seed 002).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Surface {
    /// Host paths readable beside the workspace, each with its reason.
    pub read: BTreeMap<String, Reasoned>,
    /// What may be written.
    pub write: WriteScope,
    /// Environment variables that never cross.
    pub deny_env: BTreeSet<String>,
    /// Files that are never readable.
    pub deny_file: BTreeSet<String>,
    /// The longest temporary-directory prefix, in bytes, inside the container and on the
    /// host alike.
    pub tmpdir_prefix_max: u64,
    /// Variables that cross from the invoker's environment into every run (agent and command).
    pub pass_env: BTreeSet<String>,
    /// Variables that cross into the agent's own run only, never into a command's (the
    /// provider protocol variables of the ADR's first tier).
    pub agent_env: BTreeSet<String>,
    /// Home, configuration and cache, relative to the workspace.
    pub home: String,
    /// The temporary directory, relative to the workspace (`TMPDIR`, `TMP`, `TEMP`).
    pub temp: String,
    /// Further variables that name the temporary directory.
    pub temp_env: BTreeSet<String>,
    /// The service user's own directory for run state (records, bundles, the runtime's state).
    pub state_dir: String,
    /// Where a run's skill snapshot is bound read-only inside (`run --skill`); without it a
    /// run takes no skills.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skills: Option<String>,
    /// The allow-list of `network "egress"`: present exactly when the stage has egress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
}

/// What the surface's egress proxy admits (`network "egress"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Egress {
    /// Allowed names: exact (`pypi.org`) or a suffix (`*.pythonhosted.org`, which does not
    /// admit the bare name).
    pub domain: BTreeSet<String>,
    /// Allowed ports.
    pub port: BTreeSet<u16>,
    /// Address ranges (CIDR) a name may resolve into although they are private, loopback or
    /// link-local, each with its reason; every other such address is refused.
    pub allow_address: BTreeMap<String, Reasoned>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Step {
    pub(crate) stage: StageKind,
    pub(crate) argv: Vec<String>,
    /// A prebuild step's reviewed-build tier: the one tier whose patcher it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tier: Option<BuildTier>,
    /// A lane or reference engine's scheduler ranks: exactly this many of its processes load
    /// candidate code, each reporting its rank (member coverage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ranks: Option<u32>,
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
    pub fn stage(&self, kind: StageKind) -> Option<&Stage> {
        self.stage.get(&kind)
    }

    /// The declared stage kinds.
    pub fn stage_kinds(&self) -> impl Iterator<Item = StageKind> + '_ {
        self.stage.keys().copied()
    }

    /// The seccomp profile `name` (every stage's profile is validated to exist).
    #[must_use]
    pub fn seccomp_profile(&self, name: &str) -> Option<&SeccompProfile> {
        self.seccomp.get(name)
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
    /// Whether a delta may declare native (C, C++, CUDA) sources.
    pub native_sources: bool,
    /// Whether a delta may declare dependency patches.
    pub dependency_patches: bool,
}

impl Policy {
    /// The store directory.
    #[must_use]
    pub fn store(&self) -> &str {
        &self.store
    }

    /// The limits of the confined parser children.
    #[must_use]
    pub fn parser(&self) -> ParserLimits {
        self.intake.parser
    }

    /// The archive bounds.
    #[must_use]
    pub fn archive(&self) -> &ArchiveLimits {
        &self.intake.archive
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
            native_sources: t.tiers.native_sources,
            dependency_patches: t.tiers.dependency_patches,
        }
    }

    /// The names of the registered build steps.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.step.keys().map(String::as_str)
    }

    /// The names of the registered steps of stage `kind`.
    pub fn steps_of(&self, kind: StageKind) -> impl Iterator<Item = &str> {
        self.step
            .iter()
            .filter(move |(_, s)| s.stage == kind)
            .map(|(n, _)| n.as_str())
    }

    /// The registered build step `name`: its stage kind and exact argv.
    #[must_use]
    pub fn step(&self, name: &str) -> Option<(StageKind, &[String])> {
        self.step.get(name).map(|s| (s.stage, s.argv.as_slice()))
    }

    /// The reviewed-build tier whose patcher registered prebuild step `name` is.
    #[must_use]
    pub fn step_tier(&self, name: &str) -> Option<BuildTier> {
        self.step.get(name).and_then(|s| s.tier)
    }

    /// The registered prebuild step that is tier `tier`'s patcher.
    #[must_use]
    pub fn patcher_of(&self, tier: BuildTier) -> Option<&str> {
        self.step
            .iter()
            .find(|(_, s)| s.tier == Some(tier))
            .map(|(n, _)| n.as_str())
    }

    /// The scheduler ranks of registered engine step `name` (a lane or reference step's; the
    /// language requires them there and refuses them elsewhere).
    #[must_use]
    pub fn step_ranks(&self, name: &str) -> Option<u32> {
        self.step.get(name).and_then(|s| s.ranks)
    }
}

impl Policy {
    /// The run-directory root.
    #[must_use]
    pub fn run_dir(&self) -> &str {
        &self.run_dir
    }

    /// The per-run account rules.
    #[must_use]
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// The physical lanes, by name (two, or none).
    #[must_use]
    pub fn physical_lanes(&self) -> &BTreeMap<String, PhysicalLane> {
        &self.physical_lane
    }

    /// The reviewed speed verdict, when the policy has one.
    #[must_use]
    pub fn speed(&self) -> Option<&Speed> {
        self.speed.as_ref()
    }

    /// The device guard's rules (present exactly when a physical lane names GPUs).
    #[must_use]
    pub fn device_guard(&self) -> Option<&DeviceGuard> {
        self.device_guard.as_ref()
    }

    /// Host paths no stage may bind (nor a path holding or inside one).
    pub fn never_mount(&self) -> impl Iterator<Item = &str> + '_ {
        self.never_mount.keys().map(String::as_str)
    }

    /// The reviewed reason a never-mount path is named (`None`: not one of them).
    #[must_use]
    pub fn never_mount_reason(&self, path: &str) -> Option<&str> {
        self.never_mount.get(path).map(String::as_str)
    }

    /// The models root: a model is `<root>/sha256-<hex>` of its own digest.
    #[must_use]
    pub fn models_root(&self) -> &str {
        &self.models
    }

    /// What a host must be for a candidate stage to run on it.
    #[must_use]
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Whether the final verdict needs a reproduction of the primary attempt.
    #[must_use]
    pub fn reproduction_required(&self) -> bool {
        self.reproduction_required
    }

    /// The sampled slot audit, when the policy's qualification plan asks for one.
    #[must_use]
    pub fn audit(&self) -> Option<&Audit> {
        self.audit.as_ref()
    }

    /// The reviewed quality verdict, when the policy has one.
    #[must_use]
    pub fn quality(&self) -> Option<&Quality> {
        self.quality.as_ref()
    }

    /// The pinned digest of cordon-worker, the runtime image's first process.
    #[must_use]
    pub fn worker_pin(&self) -> Option<&Digest> {
        self.worker.as_ref()
    }

    /// The pinned digest of the pristine reference tree, the only tree T runs.
    #[must_use]
    pub fn pristine_pin(&self) -> Option<&Digest> {
        self.pristine.as_ref()
    }

    /// The digest pinned for image role `role`.
    #[must_use]
    pub fn image_pin(&self, role: &str) -> Option<&Digest> {
        self.image.get(role)
    }

    /// The secret file a registered step receives on standard input, if it declares one.
    #[must_use]
    pub fn step_secret(&self, step: &str) -> Option<&str> {
        let name = self.step.get(step)?.secret.as_ref()?;
        self.secret.get(name).map(|s| s.path.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Keyword + Serialize + PartialEq + std::fmt::Debug>() {
        for (text, value) in T::ALL {
            assert_eq!(T::from_keyword(text), Some(*value));
            assert_eq!(serde_json::to_value(value).unwrap(), *text);
        }
        assert_eq!(T::from_keyword("no-such-keyword"), None);
    }

    #[test]
    fn every_keyword_is_spelled_as_in_the_policy_and_serialized_the_same() {
        round_trip::<StageKind>();
        round_trip::<Network>();
        round_trip::<RootMode>();
        round_trip::<Ipc>();
        round_trip::<User>();
        round_trip::<MountMode>();
        round_trip::<MountSource>();
        round_trip::<Sys>();
        round_trip::<ArgOp>();
        round_trip::<Arch>();
        round_trip::<RuntimeKind>();
        round_trip::<WriteScope>();
        assert_eq!(StageKind::Prebuild.as_str(), "prebuild");
    }

    #[test]
    fn seccomp_actions_keep_their_canonical_spelling_and_sets_sort_as_text() {
        for (a, text) in [
            (SeccompAction::Allow, "allow"),
            (SeccompAction::Errno(38), "errno:38"),
            (SeccompAction::KillProcess, "kill-process"),
            (SeccompAction::KillThread, "kill-thread"),
            (SeccompAction::Trap, "trap"),
            (SeccompAction::Log, "log"),
        ] {
            assert_eq!(serde_json::to_value(a).unwrap(), text);
        }
        let set: BTreeSet<Arch> = [Arch::X86_64, Arch::X86, Arch::X32].into();
        assert_eq!(
            serde_json::to_value(&set).unwrap(),
            serde_json::json!(["x32", "x86", "x86_64"])
        );
    }
}
