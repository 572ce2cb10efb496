//! Bundle planning: a validated policy stage and the host's run-time facts become the OCI
//! `config.json`, the host mounts the lease must make first, and the session settings the stage
//! runs under. Pure: no filesystem, no kernel — it is unit- and snapshot-tested, and
//! `cordon-policy explain --stage S --bundle` prints its result.
//!
//! Planning is an exhaustive destructuring of the typed [`Stage`] and an exhaustive `match` over
//! every enum in it: a value is planned, carried into [`SessionSettings`] for the session to
//! enforce, or refused with a named [`PlanError`] — never hashed into the authority and then
//! dropped. A field or an enum value added to the language is a compile error here.
//!
//! It owns every control that lives in the bundle: the exact argv and environment (nothing
//! inherited), the per-run uid/gid, `no_new_privileges`, empty capability sets unless the
//! policy lists some, rlimits, the root (the image rootfs read-only, or a per-lease overlay whose
//! upper and work directories live in the lease's run directory — never a writable shared
//! cache), the mount table (proc; a minimal `/dev`; a private `/tmp` tmpfs, noexec unless the
//! stage allows exec; a sized `/dev/shm` only with `ipc "private"` — `ipc "none"` has none;
//! read-only `rprivate nosuid nodev` binds for validator inputs — `noexec` too for the model
//! and, outside a build, the tree, which are read as data — and the stage's one writable bind
//! (staging, cache); `/sys` only when asked for, and then read-only), masked and read-only paths, the
//! namespaces, resources, the device allow-list (deny all, then each policy GPU device), the
//! seccomp profile in OCI form, and the lease labels as annotations. It refuses mount sources
//! that are not pairwise disjoint or that would expose a protected path, before anything starts.
//!
//! It does not create the run directory, the account or the mounts (the lease does, from
//! [`Planned::host_mounts`]), nor run anything (the runtime driver does).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cordon::lease::{LABEL_AUTHORITY, LABEL_EXECUTOR, LABEL_LEASE, LABEL_STORE};
use cordon_canon::Digest;
use cordon_policy_lang::{
    Child, Frame, Mount as PolicyMount, MountMode, MountSource, Network, Output, PhysicalLane,
    Policy, PublicationLimits, RootMode, Stage, StageKind, Staging, Sys, Tmp, User,
};
use oci_spec::runtime::{
    Capability, HookBuilder, Hooks, LinuxBuilder, LinuxCpuBuilder, LinuxDevice, LinuxDeviceBuilder,
    LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxNamespace,
    LinuxNamespaceType, LinuxResources, Mount, MountBuilder, Spec,
};

use crate::oci::{self, mount, seccomp};
pub use crate::oci::{MASKED_IN_PREBUILD, MASKED_PATHS, MASKED_WITHOUT_GPU, READONLY_PATHS};
pub use crate::plan_error::PlanError;
pub(crate) use crate::plan_error::invalid;

/// The annotation that names the CDI specs a GPU lane's edits were resolved from.
pub const LABEL_CDI_SPECS: &str = "org.cordon.cdi-specs";

/// Destinations the bundle itself mounts; a bind may not land on or under them.
const RESERVED: [&str; 5] = ["/proc", "/dev", "/sys", "/tmp", "/dev/shm"];

/// The run-directory name of the staging tmpfs.
pub const STAGING_DIR: &str = "staging";
/// The run-directory name of the `/tmp` tmpfs.
pub const TMP_DIR: &str = "tmp";
/// The run-directory name of the runtime cache tmpfs.
pub const CACHE_DIR: &str = "cache";

/// The run-directory name of the start gate's directory (its maker's alone, 0700: no other
/// process of the host can open the gate before the entrypoint does).
pub const GATE_DIR: &str = cordon::lease::GATE_DIR;
/// The start gate's name in [`GATE_DIR`].
pub const GATE_FIFO: &str = "fifo";
/// Where the start gate is bound in the container: in the runtime's own `/dev` tmpfs, which any
/// uid may search (a wrong one the runtime gave the entrypoint reaches the posture check
/// rather than failing at the gate), read-only.
pub const GATE: &str = "/dev/.cordon-gate";

/// How a run's entrypoint waits at its start gate, under a runtime that installs part of the
/// bundle only as its init execs the entrypoint ([`cordon::runtime::Kind::settles_at_exec`]):
/// the entrypoint opens the gate (a FIFO the host made in the lease's run directory, bound at
/// [`GATE`]) and reads one line before anything of the workload runs; the host reads the
/// posture once the gate is held, and only then writes the line. Under any other runtime the
/// argv is the job's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A registered step: the image's `/bin/sh` reads the gate, then execs the step's argv.
    Step,
    /// cordon's worker, which reads the gate itself (`--gate`) before anything else.
    Worker,
}

impl Entry {
    /// What stage `kind`'s runs start: the worker in the lane and the reference session, a
    /// step (or the agent's command) otherwise — never the caller's say, so a run whose argv
    /// would not wait is never planned as one that does.
    #[must_use]
    pub fn of(kind: StageKind) -> Self {
        match kind {
            StageKind::Lane | StageKind::Reference => Self::Worker,
            StageKind::Prebuild | StageKind::Surface => Self::Step,
        }
    }
}

/// The run-directory name of the lease's own copy of a store tree mounted in role `source`, or
/// `None` for a role that is bound as it is. Trees and publications are hard links to the
/// store's objects: bound directly, one file is one inode in every container at once (a lock
/// or inotify channel between concurrent candidates, link counts and access times that tell
/// who reads what) and the mount table names the store's digests.
#[must_use]
pub fn copy_dir(source: MountSource) -> Option<&'static str> {
    match source {
        MountSource::Tree => Some("copy-tree"),
        MountSource::Publication => Some("copy-publication"),
        MountSource::Staging | MountSource::Cache | MountSource::Model | MountSource::Workspace => {
            None
        }
    }
}
/// The run-directory name of the overlay root's mount point.
pub const OVERLAY_ROOT_DIR: &str = "rootfs";
/// The run-directory name of the overlay's upper and work directories' parent.
pub const OVERLAY_STATE_DIR: &str = "overlay";

/// A device node as the host found it (through the host seam), for a GPU device the policy
/// names.
pub use cordon::host::DeviceNode;

/// What only the host knows at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInputs {
    /// The exact argv (a registered step's, or cordon's own worker's).
    pub argv: Vec<String>,
    /// The per-run uid.
    pub uid: u32,
    /// The per-run gid.
    pub gid: u32,
    /// The unpacked image rootfs (a shared read-only cache).
    pub image_rootfs: PathBuf,
    /// The lease's run directory (staging and overlay state live in it).
    pub run_dir: PathBuf,
    /// Mount role → host source, for the roles the host supplies (`tree`, `publication`,
    /// `model`, `workspace`); `staging` is the lease's own tmpfs and is planned here.
    pub sources: BTreeMap<MountSource, PathBuf>,
    /// The GPU device nodes the host found, by their path in the container (the policy's
    /// `gpu { device }` nodes, or the lane's CDI nodes, each found at its host path).
    pub devices: BTreeMap<String, DeviceNode>,
    /// A GPU lane's container edits from the host's CDI specs (exactly when the run's lane
    /// names GPUs).
    pub cdi: Option<crate::cdi::Applied>,
    /// The run's physical lane: its cpu list replaces the stage's cpuset (the policy refuses a
    /// lane stage with a cpuset of its own when it declares physical lanes), its CPU weight
    /// is the container's.
    pub lane: Option<PhysicalLane>,
    /// The executor label.
    pub executor: String,
    /// The lease id.
    pub lease: String,
    /// The authority identity (the lease record's).
    pub authority: String,
    /// The store root whose records own the lease (the store label).
    pub store: String,
    /// Paths no mount may expose.
    pub protected: Vec<PathBuf>,
    /// Store subtrees that may be mounted despite the store being protected.
    pub mountable_store_roots: Vec<PathBuf>,
    /// Where the policy's never-mount paths really lead on this host, each with the path as
    /// the policy writes it (the session resolves them; planning itself reads no filesystem):
    /// checked with the paths as written.
    pub never_mount_real: Vec<(PathBuf, String)>,
    /// The host's cgroup layout, where a prebuild patcher's bounded child is prepared; `None`
    /// (not read) refuses a child.
    pub cgroups: Option<Cgroups>,
    /// How the entrypoint waits at a start gate, where the runtime needs one.
    pub entry: Entry,
}

impl RunInputs {
    /// The inputs of one run under `lease`: its account, run directory and labels, with no
    /// sources, devices or protected paths yet (the caller adds what the stage needs).
    #[must_use]
    pub fn for_lease(
        lease: &cordon::lease::Lease,
        argv: Vec<String>,
        image_rootfs: PathBuf,
    ) -> Self {
        Self {
            argv,
            uid: lease.account().uid,
            gid: lease.account().gid,
            image_rootfs,
            run_dir: lease.run_dir().to_path_buf(),
            sources: BTreeMap::new(),
            devices: BTreeMap::new(),
            cdi: None,
            lane: None,
            executor: lease.record.executor.clone(),
            lease: lease.record.lease.clone(),
            authority: lease.record.authority.clone(),
            store: lease.record.store.clone(),
            protected: Vec::new(),
            mountable_store_roots: Vec::new(),
            never_mount_real: Vec::new(),
            cgroups: None,
            entry: Entry::Step,
        }
    }
}

/// The host's cgroup filesystem, as the session read it at its root (`/sys/fs/cgroup`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// One hierarchy per controller (v1).
    V1(PathBuf),
    /// The unified hierarchy (v2).
    Unified(PathBuf),
}

/// The controllers a patcher's child is bounded by (on v1, one hierarchy each).
pub const CHILD_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// Where in the container the child's cgroup is bound: at `<CHILD_MOUNT>/<controller>` for
/// each of [`CHILD_CONTROLLERS`] on v1, at `<CHILD_MOUNT>/unified` on v2 (its `cgroup.procs`
/// the run account's, every other file root's).
pub const CHILD_MOUNT: &str = "/cordon/child";

/// A patcher's bounded child as the host prepares it: a cgroup nested in the container's own
/// (`<container's cgroup>/child`), so everything the container is held to (its limits as a
/// whole, its device filter, its cgroup namespace) holds the child too, with the policy's
/// tighter limits of its own, its `cgroup.procs` given to the run account and bound into the
/// container at [`CHILD_MOUNT`]; and the deadline the host holds.
///
/// On v2 a cgroup that holds processes cannot enable a controller for its children, so once
/// the runtime has created the container (its init, the runtime's, waits to start), the host
/// moves that init into a sibling leaf ([`cordon::lease::MAIN_CGROUP`]) and only then enables
/// the controllers below the container's cgroup. The account is also given the container
/// cgroup's `cgroup.procs`, the common ancestor a v2 move needs; nothing can be moved into it
/// (it has controllers enabled), and `main`'s stays root's, so the child cannot go back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildPlan {
    /// The directories the host makes before the container is created (its binds need them),
    /// parents first, each with whether it may exist already (cordon's parents, which another
    /// run may have made; never the lease's own).
    pub make: Vec<(PathBuf, bool)>,
    /// On v2, after create: every process in the first `cgroup.procs` (the container's
    /// cgroup) is moved into the second (its [`cordon::lease::MAIN_CGROUP`] leaf).
    pub vacate: Option<(PathBuf, PathBuf)>,
    /// Control files and what the host writes to each after create, in order (on v2 the
    /// container cgroup's `cgroup.subtree_control` first).
    pub limits: Vec<(PathBuf, String)>,
    /// The files given to the run account after its limits are written.
    pub given: Vec<PathBuf>,
    /// Each child cgroup directory with its name under [`CHILD_MOUNT`].
    pub binds: Vec<(PathBuf, &'static str)>,
    /// The child's directory on the memory controller's hierarchy: its processes.
    pub memory: PathBuf,
    /// On v2, the child's `cgroup.kill`: at the deadline every process in it is killed at
    /// once, so a build still forking cannot outrun a kill pass.
    pub kill: Option<PathBuf>,
    /// The child's cgroup path below each hierarchy's root (its accounting).
    pub cgroup: String,
    /// The child's deadline from the container's start, milliseconds.
    pub deadline_ms: u64,
}

/// Plan `child` of a run: its cgroup on the host's layout, refused where that was not read.
fn child_plan(kind: StageKind, run: &RunInputs, child: &Child) -> Result<ChildPlan, PlanError> {
    let Some(cgroups) = &run.cgroups else {
        return Err(PlanError::Unimplemented {
            kind,
            what: "a patcher's bounded child on a host whose cgroup layout was not read",
        });
    };
    let path = cordon::lease::cgroup_path(&run.executor, &run.lease);
    let rel = Path::new(path.trim_start_matches('/'));
    // Below a hierarchy's root: cordon's parents (which runs before made), then the lease's
    // own cgroup and its children, all new.
    let made = |hierarchy: &Path, leaves: &[&str]| -> Vec<(PathBuf, bool)> {
        let parents: Vec<&Path> = rel
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .collect();
        parents
            .iter()
            .rev()
            .map(|a| (hierarchy.join(a), true))
            .chain([(hierarchy.join(rel), false)])
            .chain(leaves.iter().map(|l| (hierarchy.join(rel).join(l), false)))
            .collect()
    };
    // The quota per 100 ms period: thousandths of a CPU × 100 µs.
    let quota = child.cpus_milli.saturating_mul(100);
    let memory = child.memory_bytes.to_string();
    let child_rel = rel.join(cordon::lease::CHILD_CGROUP);
    let (make, vacate, limits, given, binds, memory_dir, kill) = match cgroups {
        Cgroups::V1(root) => {
            let dir = |c: &str| root.join(c).join(&child_rel);
            let mem = dir("memory");
            (
                CHILD_CONTROLLERS
                    .iter()
                    .flat_map(|c| made(&root.join(c), &[cordon::lease::CHILD_CGROUP]))
                    .collect(),
                None,
                vec![
                    // memsw after the limit (it may never be below it): swap included, as
                    // the stage's.
                    (mem.join("memory.limit_in_bytes"), memory.clone()),
                    (mem.join("memory.memsw.limit_in_bytes"), memory),
                    (dir("pids").join("pids.max"), child.pids.to_string()),
                    (dir("cpu").join("cpu.cfs_period_us"), "100000".to_owned()),
                    (dir("cpu").join("cpu.cfs_quota_us"), quota.to_string()),
                ],
                CHILD_CONTROLLERS
                    .iter()
                    .map(|c| dir(c).join("cgroup.procs"))
                    .collect(),
                CHILD_CONTROLLERS.iter().map(|c| (dir(c), *c)).collect(),
                mem,
                None,
            )
        }
        Cgroups::Unified(root) => {
            let container = root.join(rel);
            let dir = root.join(&child_rel);
            let main = container.join(cordon::lease::MAIN_CGROUP);
            (
                made(
                    root,
                    &[cordon::lease::MAIN_CGROUP, cordon::lease::CHILD_CGROUP],
                ),
                Some((container.join("cgroup.procs"), main.join("cgroup.procs"))),
                vec![
                    (
                        container.join("cgroup.subtree_control"),
                        CHILD_CONTROLLERS.map(|c| format!("+{c}")).join(" "),
                    ),
                    (dir.join("memory.max"), memory),
                    // Swap included, as the stage's: none beyond the memory limit.
                    (dir.join("memory.swap.max"), "0".to_owned()),
                    (dir.join("pids.max"), child.pids.to_string()),
                    (dir.join("cpu.max"), format!("{quota} 100000")),
                ],
                vec![dir.join("cgroup.procs"), container.join("cgroup.procs")],
                vec![(dir.clone(), "unified")],
                dir.clone(),
                Some(dir.join("cgroup.kill")),
            )
        }
    };
    Ok(ChildPlan {
        make,
        vacate,
        limits,
        given,
        binds,
        memory: memory_dir,
        kill,
        cgroup: format!("{path}/{}", cordon::lease::CHILD_CGROUP),
        deadline_ms: child.deadline_ms,
    })
}

/// A mount the host makes in the lease's run directory before the container is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMount {
    /// A private tmpfs bounded in bytes (and inodes), owned by the run account.
    Tmpfs {
        /// The mount point.
        target: PathBuf,
        /// Its size.
        bytes: u64,
        /// Its inode bound, if the policy sets one.
        inodes: Option<u64>,
        /// The owner.
        uid: u32,
        /// The owner's group.
        gid: u32,
    },
    /// A private tmpfs holding the lease's own copy of a store tree (root-owned, files 0444 or
    /// 0555), sized to it.
    Copy {
        /// The mount point.
        target: PathBuf,
        /// The store tree copied.
        source: PathBuf,
    },
    /// An overlay whose lower layer is the read-only image rootfs and whose upper and work
    /// directories belong to this lease alone, on a tmpfs of their own (their parent) bounded
    /// in bytes and inodes.
    Overlay {
        /// The mount point (the container's root).
        target: PathBuf,
        /// The image rootfs.
        lower: PathBuf,
        /// The lease's upper directory.
        upper: PathBuf,
        /// The lease's work directory.
        work: PathBuf,
        /// The writable layer's size.
        bytes: u64,
        /// Its inode bound.
        inodes: u64,
    },
}

impl HostMount {
    /// The mount point.
    #[must_use]
    pub fn target(&self) -> &Path {
        match self {
            Self::Tmpfs { target, .. }
            | Self::Copy { target, .. }
            | Self::Overlay { target, .. } => target,
        }
    }
}

/// What the session enforces beyond the bundle: values of the stage that are not OCI settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// The image role and its pinned digest.
    pub image: (String, Digest),
    /// The whole stage's deadline, ms.
    pub deadline_ms: u64,
    /// Named phases' deadlines, ms (the lane's session drives them).
    pub phase_deadline_ms: BTreeMap<String, u64>,
    /// Output caps.
    pub output: Output,
    /// Publication bounds (prebuild).
    pub publication: Option<PublicationLimits>,
    /// Framing bounds (lane, reference).
    pub frame: Option<Frame>,
    /// The staging bounds (prebuild).
    pub staging: Option<Staging>,
}

/// A planned run: the bundle, the host mounts it needs, the session settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The OCI `config.json`.
    pub spec: Spec,
    /// Mounts the lease makes first, in order.
    pub host_mounts: Vec<HostMount>,
    /// The host path of the staging area, when the stage has one (what prebuild publishes).
    pub staging_dir: Option<PathBuf>,
    /// The patcher's bounded child, when the stage has one (prebuild).
    pub child: Option<ChildPlan>,
    /// The host path of the start gate the host makes in the lease's run directory, when the
    /// runtime needs one ([`Entry`]).
    pub gate: Option<PathBuf>,
    /// What the session enforces.
    pub session: SessionSettings,
    /// The spec as every run of this stage under this policy shares it: the run's own values
    /// replaced by placeholders (see [`launch_identity`]).
    pub launch: serde_json::Value,
}

/// What no session runs.
const GPU_LANES: &str = "a read without a GPU lane under a policy whose lanes name GPUs";

/// Refuse a stage that could reach a GPU (the lane's reads, the audit, the reference T) under a
/// policy whose physical lanes name GPUs, unless it runs on one of those lanes: only a read on
/// a GPU lane gets that lane's devices and the device guard (the lane session's, before,
/// during and after it), and no GPU-capable read runs beside the guarded ones unguarded (the
/// referee puts the audit and T on the qualification's lanes). The session calls it before
/// anything exists.
///
/// # Errors
/// [`PlanError::Unimplemented`].
pub fn unguarded_gpus(
    policy: &Policy,
    kind: StageKind,
    lane: Option<&PhysicalLane>,
) -> Result<(), PlanError> {
    // Exhaustive: a new stage kind decides here whether it can reach a GPU.
    let gpu_capable = match kind {
        StageKind::Lane | StageKind::Reference => true,
        StageKind::Prebuild | StageKind::Surface => false,
    };
    let gpu_lane = lane.is_some_and(|l| !l.gpus.is_empty());
    if gpu_capable && !gpu_lane && policy.physical_lanes().values().any(|l| !l.gpus.is_empty()) {
        return Err(PlanError::Unimplemented {
            kind,
            what: GPU_LANES,
        });
    }
    Ok(())
}

/// The spec with the values that are the run's own replaced by placeholders: the account's
/// ids (`$UID`, `$GID`), the lease (`$LEASE`) and its run directory (`$RUN`), the image cache
/// path (`$IMAGE`), each host-supplied role's source (`$tree`, `$publication`, …) and the
/// cpuset of the lane (`$LANE`), and what names a GPU lane's own devices: its CDI nodes' paths
/// and numbers (`$GPU_NODE`, in the spec's order, their permissions kept) and its hooks'
/// arguments (`$GPU_ARGS`: a device's hook names its paths and PCI address). Its binds,
/// variables, hook programs and points, and the specs' digest (an annotation) stay, and `cdi`
/// is the lane's GPU count: two lanes' reads resolved from the same specs compare equal when
/// their devices differ only in which they are. Two runs with
/// equal launch identities differ in nothing else of their `config.json`: same argv, env,
/// seccomp profile, mount table by role, devices, limits and namespaces.
///
/// # Errors
/// The spec does not serialize.
pub fn launch_identity(spec: &Spec, run: &RunInputs) -> Result<serde_json::Value, PlanError> {
    use serde_json::Value;
    let mut v = serde_json::to_value(spec).map_err(invalid)?;
    for (pointer, token) in [
        ("/process/user/uid", "$UID"),
        ("/process/user/gid", "$GID"),
        ("/linux/resources/cpu/cpus", "$LANE"),
    ] {
        if let Some(x) = v.pointer_mut(pointer) {
            *x = Value::from(token);
        }
    }
    // Device nodes are owned by the run account's group.
    if let Some(Value::Array(devices)) = v.pointer_mut("/linux/devices") {
        for d in devices.iter_mut() {
            for (key, id, token) in [("uid", run.uid, "$UID"), ("gid", run.gid, "$GID")] {
                if let Some(x) = d.get_mut(key).filter(|x| x.as_u64() == Some(u64::from(id))) {
                    *x = Value::from(token);
                }
            }
        }
    }
    if let Some(cdi) = &run.cdi {
        let nodes: Vec<&str> = cdi.nodes.iter().map(|n| n.path.as_str()).collect();
        let numbers: Vec<(u64, u64)> = nodes
            .iter()
            .filter_map(|p| run.devices.get(*p).map(|d| (d.major, d.minor)))
            .collect();
        let field = |x: &Value, k: &str| x.get(k).and_then(Value::as_u64);
        let token = |x: &mut Value, keys: &[&str]| {
            for k in keys {
                if let Some(v) = x.get_mut(*k) {
                    *v = Value::from("$GPU_NODE");
                }
            }
        };
        if let Some(Value::Array(devices)) = v.pointer_mut("/linux/devices") {
            for d in devices
                .iter_mut()
                .filter(|d| nodes.contains(&d.get("path").and_then(Value::as_str).unwrap_or("")))
            {
                token(d, &["path", "major", "minor"]);
            }
        }
        if let Some(Value::Array(rules)) = v.pointer_mut("/linux/resources/devices") {
            for r in rules.iter_mut().filter(|r| {
                r.get("allow") == Some(&Value::Bool(true))
                    && numbers
                        .iter()
                        .any(|n| (field(r, "major"), field(r, "minor")) == (Some(n.0), Some(n.1)))
            }) {
                token(r, &["major", "minor"]);
            }
        }
        // A device's own hooks name its own paths and PCI address (`create-symlinks`).
        if let Some(Value::Object(points)) = v.pointer_mut("/hooks") {
            for h in points
                .values_mut()
                .filter_map(Value::as_array_mut)
                .flatten()
            {
                if let Some(args) = h.get_mut("args") {
                    *args = Value::from("$GPU_ARGS");
                }
            }
        }
        if let Some(o) = v.as_object_mut() {
            o.insert("cdi".to_owned(), Value::from(cdi.devices.len()));
        }
    }
    // Longest path first, so a path inside another is replaced whole.
    let mut paths: Vec<(String, String)> = run
        .sources
        .iter()
        .map(|(role, p)| (p.display().to_string(), format!("${}", role.as_str())))
        .chain([
            (run.run_dir.display().to_string(), "$RUN".to_owned()),
            (run.image_rootfs.display().to_string(), "$IMAGE".to_owned()),
        ])
        .collect();
    paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    fn scrub(v: &mut Value, f: &dyn Fn(&str) -> Option<String>) {
        match v {
            Value::String(s) => {
                if let Some(n) = f(s) {
                    *s = n;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| scrub(x, f)),
            Value::Object(o) => o.values_mut().for_each(|x| scrub(x, f)),
            _ => {}
        }
    }
    scrub(&mut v, &|s: &str| {
        for (p, t) in &paths {
            if let Some(rest) = s.strip_prefix(p.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return Some(format!("{t}{rest}"));
            }
        }
        s.contains(run.lease.as_str())
            .then(|| s.replace(run.lease.as_str(), "$LEASE"))
    });
    Ok(v)
}

/// The run-directory entries a stage's host mounts occupy: what a lease record names before
/// any of them exists, so a crash after mounting leaves a record that says what to unmount.
#[must_use]
pub fn lease_mount_points(stage: &Stage) -> Vec<&'static str> {
    let mut points = vec![TMP_DIR];
    if stage.staging.is_some() {
        points.push(STAGING_DIR);
    }
    if stage.cache.is_some() {
        points.push(CACHE_DIR);
    }
    points.extend(stage.mount.values().filter_map(|m| copy_dir(m.source)));
    match stage.root {
        RootMode::ReadOnly | RootMode::Empty => {}
        // The writable layer's tmpfs first: release undoes in reverse, the root before it.
        RootMode::Overlay => points.extend([OVERLAY_STATE_DIR, OVERLAY_ROOT_DIR]),
    }
    points
}

/// A bind in plain form, before the OCI mount is built.
struct Bind {
    source: PathBuf,
    destination: PathBuf,
    writable: bool,
    /// Whether files on it may be executed or mapped executable.
    executable: bool,
    /// Whether the mounts beneath its source come with it (`rbind`): a CDI bind's do not, so
    /// none escapes the read-only, nosuid, nodev options it is given.
    recursive: bool,
}

/// Whether a role's files may be executed in stage `kind`: the model (weights) never, the tree
/// only by a build (in the lane and the reference session the engine's source is read by its
/// interpreter, and native code comes from the publication alone); the publication (native
/// libraries mapped executable), staging (build outputs), the runtime cache (JIT kernels) and
/// the workspace (the agent's tools) may.
const fn executable(source: MountSource, kind: StageKind) -> bool {
    match source {
        MountSource::Model => false,
        MountSource::Tree => matches!(kind, StageKind::Prebuild),
        MountSource::Publication
        | MountSource::Staging
        | MountSource::Cache
        | MountSource::Workspace => true,
    }
}

/// `a` is `b` or inside it.
fn within(a: &Path, b: &Path) -> bool {
    a.starts_with(b)
}

fn check_mounts(binds: &[Bind], run: &RunInputs) -> Result<(), PlanError> {
    for x in binds {
        if !x.source.is_absolute() || !x.destination.is_absolute() {
            return Err(invalid(format!(
                "bind {} is not absolute",
                x.source.display()
            )));
        }
        for r in RESERVED {
            let r = Path::new(r);
            if within(&x.destination, r) || within(r, &x.destination) {
                return Err(PlanError::Overlap {
                    a: x.destination.display().to_string(),
                    b: r.display().to_string(),
                });
            }
        }
        let allowed = run
            .mountable_store_roots
            .iter()
            .any(|m| within(&x.source, m));
        for p in &run.protected {
            // A source inside a protected path exposes it (unless it is a mountable store root);
            // a source above one exposes it always.
            if within(p, &x.source) || (within(&x.source, p) && !allowed) {
                return Err(PlanError::Protected {
                    source_path: x.source.display().to_string(),
                    protected: p.display().to_string(),
                    why: "cordon's own: the store, the lease's bundle, the runtime's state or the \
                          working directory"
                        .to_owned(),
                });
            }
        }
    }
    // Pairwise disjointness after every source is known to expose nothing protected, so an
    // exposing source is named as such even when it also contains another bind's source.
    for (i, x) in binds.iter().enumerate() {
        for y in &binds[i + 1..] {
            if within(&x.source, &y.source) || within(&y.source, &x.source) {
                return Err(PlanError::Overlap {
                    a: x.source.display().to_string(),
                    b: y.source.display().to_string(),
                });
            }
            if within(&x.destination, &y.destination) || within(&y.destination, &x.destination) {
                return Err(PlanError::Overlap {
                    a: x.destination.display().to_string(),
                    b: y.destination.display().to_string(),
                });
            }
        }
    }
    Ok(())
}

/// The image role of candidate stage `kind` and its pinned digest.
///
/// # Errors
/// The stage is missing, runs no image (the surface), or its role is not pinned.
pub fn image_of(policy: &Policy, kind: StageKind) -> Result<(&str, Digest), PlanError> {
    let stage = policy.stage(kind).ok_or(PlanError::NoStage { kind })?;
    let role = stage
        .image
        .as_deref()
        .ok_or_else(|| invalid("a candidate stage without an image"))?;
    let pin = policy.image_pin(role).ok_or_else(|| PlanError::Unpinned {
        kind,
        role: role.to_owned(),
    })?;
    Ok((role, *pin))
}

/// Where a run's writable storage lives on the host: the mounts the lease makes for it, and the
/// container's root.
struct Storage {
    host_mounts: Vec<HostMount>,
    tmp_dir: PathBuf,
    staging_dir: PathBuf,
    cache_dir: PathBuf,
    root: PathBuf,
    root_readonly: bool,
}

/// The lease's tmpfs mounts (`/tmp`, staging, cache) and the root (the image read-only, or an
/// overlay over it).
fn storage(stage: &Stage, run: &RunInputs, uid: u32, gid: u32) -> Result<Storage, PlanError> {
    let tmpfs = |target: &PathBuf, bounds: &Staging| HostMount::Tmpfs {
        target: target.clone(),
        bytes: bounds.size_bytes,
        inodes: Some(bounds.inodes),
        uid,
        gid,
    };
    // /tmp is the lease's own tmpfs, made by the host and bound in: a tmpfs mounted by the
    // runtime would take the 0555 mode of the sealed image's /tmp and be unwritable.
    let tmp_dir = run.run_dir.join(TMP_DIR);
    let mut host_mounts = vec![HostMount::Tmpfs {
        target: tmp_dir.clone(),
        bytes: stage.tmp.size_bytes,
        inodes: None,
        uid,
        gid,
    }];
    let staging_dir = run.run_dir.join(STAGING_DIR);
    if let Some(bounds) = &stage.staging {
        host_mounts.push(tmpfs(&staging_dir, bounds));
    }
    // The runtime cache: the lease's own bounded tmpfs, the run account's, executable (JIT
    // kernels are written and loaded there), gone at release.
    let cache_dir = run.run_dir.join(CACHE_DIR);
    if let Some(bounds) = &stage.cache {
        host_mounts.push(tmpfs(&cache_dir, bounds));
    }
    let cache_mounted = stage.mount.values().any(|m| m.source == MountSource::Cache);
    if stage.cache.is_some() && !cache_mounted {
        return Err(invalid("cache bounds without a cache mount"));
    }
    let (root, root_readonly) = match stage.root {
        RootMode::Empty => return Err(invalid("only the surface's root is empty")),
        RootMode::ReadOnly => (run.image_rootfs.clone(), true),
        RootMode::Overlay => {
            let Some(bound) = &stage.overlay else {
                return Err(invalid("an overlay root without its bound"));
            };
            let target = run.run_dir.join(OVERLAY_ROOT_DIR);
            let state = run.run_dir.join(OVERLAY_STATE_DIR);
            host_mounts.push(HostMount::Overlay {
                target: target.clone(),
                lower: run.image_rootfs.clone(),
                upper: state.join("upper"),
                work: state.join("work"),
                bytes: bound.size_bytes,
                inodes: bound.inodes,
            });
            (target, false)
        }
    };
    Ok(Storage {
        host_mounts,
        tmp_dir,
        staging_dir,
        cache_dir,
        root,
        root_readonly,
    })
}

/// The policy's binds with their host sources, checked; a store tree is then bound from the
/// lease's own copy of it (a copy the lease makes: added to `storage`'s host mounts).
fn binds(
    kind: StageKind,
    stage: &Stage,
    run: &RunInputs,
    storage: &mut Storage,
) -> Result<Vec<Bind>, PlanError> {
    let mut binds = Vec::new();
    let mut roles = Vec::new();
    for (dest, PolicyMount { source, mode }) in &stage.mount {
        let host = match source {
            MountSource::Staging if stage.staging.is_some() => storage.staging_dir.clone(),
            MountSource::Staging => return Err(invalid("a staging mount without staging bounds")),
            MountSource::Cache if stage.cache.is_some() => storage.cache_dir.clone(),
            MountSource::Cache => return Err(invalid("a cache mount without cache bounds")),
            MountSource::Tree
            | MountSource::Publication
            | MountSource::Model
            | MountSource::Workspace => {
                run.sources
                    .get(source)
                    .cloned()
                    .ok_or_else(|| PlanError::NoSource {
                        kind,
                        role: *source,
                        dest: dest.clone(),
                    })?
            }
        };
        binds.push(Bind {
            source: host,
            destination: PathBuf::from(dest),
            executable: executable(*source, kind),
            recursive: true,
            writable: match mode {
                MountMode::Ro => false,
                MountMode::Rw => true,
            },
        });
        roles.push(*source);
    }
    // A GPU lane's CDI binds, checked with the stage's (reserved destinations, protected
    // sources, pairwise disjoint). They come after the stage's binds, so the copies below,
    // zipped with the stage's roles, never touch them.
    if let Some(cdi) = &run.cdi {
        if !cdi.mounts.is_empty() && stage.root != RootMode::Overlay {
            // The runtime makes a bind's mount point in the root: under a read-only root that
            // is the shared image cache.
            return Err(PlanError::Cdi {
                kind,
                why: "its binds need an overlay root (the runtime makes their mount points in the root)"
                    .to_owned(),
            });
        }
        for m in &cdi.mounts {
            binds.push(cdi_bind(kind, m)?);
        }
    }
    check_mounts(&binds, run)?;
    for (b, role) in binds.iter_mut().zip(&roles) {
        if let Some(name) = copy_dir(*role) {
            let target = run.run_dir.join(name);
            storage.host_mounts.push(HostMount::Copy {
                target: target.clone(),
                source: std::mem::replace(&mut b.source, target),
            });
        }
    }
    Ok(binds)
}

/// A CDI bind as the bundle makes it: read-only, private, nosuid and nodev whatever the spec
/// says, and not recursive (a mount beneath its source is not bound); executable unless the
/// spec says `noexec` (a driver's user-space libraries are mapped
/// executable by the engine). Any other type or option is refused, never dropped.
fn cdi_bind(kind: StageKind, m: &crate::cdi::Mount) -> Result<Bind, PlanError> {
    let refuse = |why: String| PlanError::Cdi {
        kind,
        why: format!("bind {}: {why}", m.container_path),
    };
    if let Some(k) = m.kind.as_deref().filter(|k| *k != "bind") {
        return Err(refuse(format!("mount type {k:?} (only binds)")));
    }
    let mut executable = true;
    for o in &m.options {
        match o.as_str() {
            // What every bind of the bundle is anyway.
            "ro" | "nosuid" | "nodev" | "bind" | "rbind" | "rprivate" | "private" => {}
            "noexec" => executable = false,
            other => {
                return Err(refuse(format!(
                    "option {other:?} (a lane GPU's binds are read-only, private, nosuid, nodev)"
                )));
            }
        }
    }
    Ok(Bind {
        source: PathBuf::from(&m.host_path),
        destination: PathBuf::from(&m.container_path),
        writable: false,
        executable,
        recursive: false,
    })
}

/// No host source of the stage's binds (a GPU lane's CDI binds among them) may be, hold or lie inside one of the policy's
/// never-mount paths, as written or where they really lead — with no exemption (a store tree
/// a never-mount path names is not bound either).
fn never_mounted(policy: &Policy, stage: &Stage, run: &RunInputs) -> Result<(), PlanError> {
    let never: Vec<(PathBuf, &str)> = policy
        .never_mount()
        .map(|n| (PathBuf::from(n), n))
        .chain(
            run.never_mount_real
                .iter()
                .map(|(real, written)| (real.clone(), written.as_str())),
        )
        .collect();
    let cdi = run.cdi.iter().flat_map(|c| &c.mounts);
    let sources = stage
        .mount
        .values()
        .filter_map(|m| run.sources.get(&m.source).cloned())
        .chain(cdi.map(|m| PathBuf::from(&m.host_path)));
    for source in sources {
        let source = &source;
        if let Some((n, written)) = never
            .iter()
            .find(|(n, _)| within(source, n) || within(n, source))
        {
            return Err(PlanError::Protected {
                source_path: source.display().to_string(),
                protected: n.display().to_string(),
                why: format!(
                    "never-mount: {}",
                    policy.never_mount_reason(written).unwrap_or_default()
                ),
            });
        }
    }
    Ok(())
}

/// The container's mount table: the base, `/dev/shm`, the lease's `/tmp`, `/sys` when asked
/// for, then the binds.
fn mounts(stage: &Stage, tmp_dir: &Path, binds: &[Bind]) -> Result<Vec<Mount>, PlanError> {
    // noexec stops execve of a file on /tmp; it does not stop memfd_create + execveat, nor an
    // interpreter reading a script from /tmp, and the staging area stays executable.
    let Tmp {
        size_bytes: _,
        exec,
    } = stage.tmp;
    let mut tmp_opts = vec!["rbind", "rw", "rprivate", "nosuid", "nodev"];
    if !exec {
        tmp_opts.push("noexec");
    }
    let mut mounts = oci::base_mounts()?;
    mounts.extend(oci::shm(stage.ipc, stage.shm_bytes)?);
    let tmp_source = tmp_dir
        .to_str()
        .ok_or_else(|| invalid("the run directory is not UTF-8"))?;
    mounts.push(mount("/tmp", "bind", tmp_source, &tmp_opts)?);
    match stage.sys {
        Sys::None => {}
        Sys::ReadOnly => mounts.push(mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?),
    }
    for b in binds {
        let mode = if b.writable { "rw" } else { "ro" };
        let bind = if b.recursive { "rbind" } else { "bind" };
        let mut options = vec![bind, mode, "rprivate", "nosuid", "nodev"];
        if !b.executable {
            options.push("noexec");
        }
        mounts.push(
            MountBuilder::default()
                .destination(&b.destination)
                .typ("bind")
                .source(&b.source)
                .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
                .build()
                .map_err(invalid)?,
        );
    }
    Ok(mounts)
}

/// Devices: deny everything, then allow exactly the GPU nodes the policy names or the lane's
/// CDI edits give (runc adds its default pseudo-devices — null, zero, full, random, urandom,
/// tty — after these rules). Every node is made 0660, root's and the run group's.
fn devices(
    kind: StageKind,
    stage: &Stage,
    run: &RunInputs,
    gid: u32,
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>), PlanError> {
    let mut wanted: Vec<(&str, String)> = stage
        .gpu_device
        .keys()
        .map(|p| (p.as_str(), "rw".to_owned()))
        .collect();
    for n in run.cdi.iter().flat_map(|c| &c.nodes) {
        let refuse = |why: &str| PlanError::Cdi {
            kind,
            why: format!("device node {}: {why}", n.path),
        };
        if n.file_mode.is_some() || n.uid.is_some() || n.gid.is_some() {
            return Err(refuse(
                "it sets its mode or owner (cordon makes every node 0660, root's and the run group's)",
            ));
        }
        let permissions = n.permissions.as_deref().unwrap_or("rwm");
        if permissions.is_empty() || !permissions.chars().all(|c| "rwm".contains(c)) {
            return Err(refuse(&format!("permissions {permissions:?} (r, w, m)")));
        }
        // mknod is never granted: a node the run could make is not one the spec names (and it
        // has no CAP_MKNOD).
        let access: String = permissions.chars().filter(|c| *c != 'm').collect();
        if access.is_empty() {
            return Err(refuse("it grants nothing but mknod"));
        }
        let node = run
            .devices
            .get(&n.path)
            .ok_or_else(|| PlanError::NoDevice {
                kind,
                path: n.path.clone(),
            })?;
        let numbers = (n.major, n.minor);
        let found = (
            i64::try_from(node.major).ok(),
            i64::try_from(node.minor).ok(),
        );
        if !node.char
            || n.major.is_some_and(|m| Some(m) != found.0)
            || n.minor.is_some_and(|m| Some(m) != found.1)
        {
            return Err(refuse(&format!(
                "the spec says {numbers:?}, the host has {} {}:{}",
                if node.char {
                    "character device"
                } else {
                    "block device"
                },
                node.major,
                node.minor
            )));
        }
        if wanted.iter().any(|(p, _)| *p == n.path) {
            return Err(refuse("it is named twice"));
        }
        wanted.push((n.path.as_str(), access));
    }
    let mut devices = Vec::new();
    let mut rules = vec![
        LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()
            .map_err(invalid)?,
    ];
    for (path, access) in wanted {
        let node = run.devices.get(path).ok_or_else(|| PlanError::NoDevice {
            kind,
            path: path.to_owned(),
        })?;
        let typ = if node.char {
            LinuxDeviceType::C
        } else {
            LinuxDeviceType::B
        };
        let major = i64::try_from(node.major).map_err(invalid)?;
        let minor = i64::try_from(node.minor).map_err(invalid)?;
        devices.push(
            LinuxDeviceBuilder::default()
                .path(PathBuf::from(path))
                .typ(typ)
                .major(major)
                .minor(minor)
                .file_mode(0o660u32)
                .uid(0u32)
                .gid(gid)
                .build()
                .map_err(invalid)?,
        );
        rules.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(typ)
                .major(major)
                .minor(minor)
                .access(access)
                .build()
                .map_err(invalid)?,
        );
    }
    Ok((devices, rules))
}

/// The OCI hooks of a GPU lane's CDI edits: each one the policy allows, at its lifecycle point
/// (the resolver refused the rest, and any point but the three before the process starts).
fn hooks(kind: StageKind, run: &RunInputs) -> Result<Option<Hooks>, PlanError> {
    let Some(cdi) = run.cdi.as_ref().filter(|c| !c.hooks.is_empty()) else {
        return Ok(None);
    };
    let mut points: BTreeMap<&str, Vec<oci_spec::runtime::Hook>> = BTreeMap::new();
    for h in &cdi.hooks {
        let mut hook = HookBuilder::default()
            .path(&h.path)
            .args(h.args.clone())
            .env(h.env.clone());
        if let Some(t) = h.timeout {
            hook = hook.timeout(t);
        }
        points
            .entry(h.hook_name.as_str())
            .or_default()
            .push(hook.build().map_err(invalid)?);
    }
    let mut hooks = Hooks::default();
    for (point, list) in points {
        match point {
            "createRuntime" => hooks.set_create_runtime(Some(list)),
            "createContainer" => hooks.set_create_container(Some(list)),
            "startContainer" => hooks.set_start_container(Some(list)),
            other => {
                return Err(PlanError::Cdi {
                    kind,
                    why: format!(
                        "hook point {other:?} (createRuntime, createContainer, startContainer)"
                    ),
                });
            }
        };
    }
    Ok(Some(hooks))
}

/// The (major, minor) numbers of the character devices planned `spec` gives its container.
#[must_use]
pub fn character_devices(spec: &Spec) -> Vec<(u64, u64)> {
    let devices = spec.linux().as_ref().and_then(|l| l.devices().as_ref());
    devices
        .into_iter()
        .flatten()
        .filter(|d| d.typ() == LinuxDeviceType::C)
        .filter_map(|d| {
            Some((
                u64::try_from(d.major()).ok()?,
                u64::try_from(d.minor()).ok()?,
            ))
        })
        .collect()
}

/// The cgroup resources: memory (swap included) and pids as limited, the CPU quota and set,
/// the device rules.
fn resources(
    stage: &Stage,
    run: &RunInputs,
    memory_bytes: u64,
    pids: u64,
    device_rules: Vec<LinuxDeviceCgroup>,
) -> Result<LinuxResources, PlanError> {
    let mut cpu = LinuxCpuBuilder::default();
    // A physical lane's cpu list replaces the stage's cpuset.
    if let Some(l) = &run.lane {
        cpu = cpu.cpus(l.cpuset.clone());
    }
    if let Some(shares) = run.lane.as_ref().and_then(|l| l.cpu_shares) {
        cpu = cpu.shares(shares);
    }
    let limits = cordon::run_cgroup::Limits {
        cpus_milli: stage.cpus_milli,
        cpuset: stage.cpuset.clone().filter(|_| run.lane.is_none()),
        memory_bytes: Some(memory_bytes),
        pids: Some(pids),
    };
    oci::limit_resources(&limits, cpu)?
        .devices(device_rules)
        .build()
        .map_err(invalid)
}

/// The namespaces: all new, the network one included (the only network a per-run stage has).
fn namespaces(kind: StageKind, network: Network) -> Result<Vec<LinuxNamespace>, PlanError> {
    let mut namespaces = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
        // Both IPC settings are a new IPC namespace; they differ in /dev/shm.
        LinuxNamespaceType::Ipc,
    ];
    match network {
        Network::None => namespaces.push(LinuxNamespaceType::Network),
        Network::Egress => {
            return Err(PlanError::Unimplemented {
                kind,
                what: "network \"egress\" outside the surface",
            });
        }
    }
    oci::namespaces(namespaces)
}

/// Plan stage `kind` of `policy` for one run.
///
/// # Errors
/// The stage is missing or not implemented, a value has no source or device on this host, or
/// the mounts are not disjoint or would expose a protected path.
pub fn plan(policy: &Policy, kind: StageKind, run: &RunInputs) -> Result<Planned, PlanError> {
    let stage = policy.stage(kind).ok_or(PlanError::NoStage { kind })?;
    match kind {
        StageKind::Prebuild | StageKind::Lane | StageKind::Reference => {}
        // The surface runs as its service user behind a user namespace, not in a per-run
        // lease: `surface::plan` plans it.
        StageKind::Surface => {
            return Err(PlanError::Unimplemented {
                kind,
                what: "the surface stage in a per-run lease (cordon-surface plans it)",
            });
        }
    }
    // Every field, by name: a field added to the language does not compile here until it is
    // planned (here or in the helpers above, which read it from `stage`), carried into the
    // session settings, or refused.
    let Stage {
        image: _,
        network,
        root: _,
        ipc: _,
        capability,
        no_new_privileges,
        seccomp: seccomp_name,
        user,
        cpus_milli: _,
        cpuset: _,
        memory_bytes,
        pids,
        nofile,
        core_bytes,
        shm_bytes: _,
        tmp: _,
        staging,
        child,
        cache: _,
        overlay: _,
        deadline_ms,
        phase_deadline_ms,
        gpu_device,
        env,
        mount: _,
        output,
        publication,
        frame,
        surface,
        sys: _,
    } = stage;
    if surface.is_some() {
        return Err(PlanError::Unimplemented {
            kind,
            what: "a surface block",
        });
    }
    // A GPU lane's run carries exactly its GPUs' CDI edits, and only such a run has any.
    let lane_gpus: Option<Vec<String>> = run
        .lane
        .as_ref()
        .filter(|l| !l.gpus.is_empty())
        .map(|l| l.gpus.keys().map(|u| crate::cdi::gpu(u)).collect());
    if lane_gpus.as_ref() != run.cdi.as_ref().map(|c| &c.devices) {
        return Err(invalid(
            "the run's CDI edits are not exactly those of its lane's GPUs",
        ));
    }
    // The language requires these of every candidate stage; a policy value without them is
    // refused, never run unlimited.
    let (image, pin) = image_of(policy, kind)?;
    let (Some(memory_bytes), Some(pids)) = (memory_bytes, pids) else {
        return Err(invalid("a candidate stage without a memory or pids limit"));
    };
    let profile = oci::seccomp_profile(policy, kind, seccomp_name)?;
    let (uid, gid) = match user {
        User::PerRun => (run.uid, run.gid),
        User::Service => return Err(invalid("only the surface runs as its service user")),
    };
    if uid == 0 || gid == 0 {
        return Err(invalid("the per-run account has id 0"));
    }
    let mut storage = storage(stage, run, uid, gid)?;
    never_mounted(policy, stage, run)?;
    let mut binds = binds(kind, stage, run, &mut storage)?;
    let child = match (kind, child) {
        (StageKind::Prebuild, Some(c)) => Some(child_plan(kind, run, c)?),
        (_, None) => None,
        (_, Some(_)) => return Err(invalid("a bounded child outside the prebuild stage")),
    };
    // Each controller's child cgroup, bound where the patcher finds it: it can move its child
    // in (cgroup.procs is the account's) and change nothing else (every limit file is root's).
    for (dir, name) in child.iter().flat_map(|p| &p.binds) {
        binds.push(Bind {
            source: dir.clone(),
            destination: Path::new(CHILD_MOUNT).join(name),
            writable: true,
            executable: false,
            recursive: false,
        });
    }
    // The stage's environment, then a GPU lane's CDI variables (none may set a stage's key).
    let cdi_env = run.cdi.iter().flat_map(|c| &c.env);
    if let Some(e) = cdi_env
        .clone()
        .find(|e| e.split_once('=').is_some_and(|(k, _)| env.contains_key(k)))
    {
        return Err(PlanError::Cdi {
            kind,
            why: format!("variable {e:?} sets a key the stage's environment sets"),
        });
    }
    // A runtime that installs the seccomp filter only as its init execs the entrypoint: the
    // entrypoint waits at a start gate until the host has read the posture it runs under.
    let gate = crate::start::runtime_kind(policy)
        .settles_at_exec()
        .then(|| run.run_dir.join(GATE_DIR).join(GATE_FIFO));
    let env: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain(cdi_env.cloned())
        .collect();
    let argv = match gate {
        Some(_) => gated_argv(&run.argv, run.entry, &env)?,
        None => run.argv.clone(),
    };
    let process = oci::process(oci::ProcessPlan {
        uid,
        gid,
        argv: &argv,
        env,
        cwd: "/",
        capabilities: capability
            .keys()
            .map(|c| Capability::from_str(c).map_err(invalid))
            .collect::<Result<_, _>>()?,
        nofile: *nofile,
        core_bytes: *core_bytes,
        no_new_privileges: *no_new_privileges,
    })?;
    let mut mounts = mounts(stage, &storage.tmp_dir, &binds)?;
    if let Some(gate) = &gate {
        mounts.push(gate_mount(gate)?);
    }
    let (devices, device_rules) = devices(kind, stage, run, gid)?;
    let linux = LinuxBuilder::default()
        .namespaces(namespaces(kind, *network)?)
        .devices(devices)
        .masked_paths(
            MASKED_PATHS
                .iter()
                .chain(if gpu_device.is_empty() && run.cdi.is_none() {
                    &MASKED_WITHOUT_GPU[..]
                } else {
                    &[]
                })
                .chain(if kind == StageKind::Prebuild {
                    &MASKED_IN_PREBUILD[..]
                } else {
                    &[]
                })
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>(),
        )
        .readonly_paths(oci::readonly_paths())
        .resources(resources(stage, run, *memory_bytes, *pids, device_rules)?)
        .seccomp(seccomp(profile)?)
        .cgroups_path(PathBuf::from(cordon::lease::cgroup_path(
            &run.executor,
            &run.lease,
        )))
        .rootfs_propagation("private")
        .build()
        .map_err(invalid)?;
    let annotations: HashMap<String, String> = [
        (LABEL_EXECUTOR.to_owned(), run.executor.clone()),
        (LABEL_LEASE.to_owned(), run.lease.clone()),
        (LABEL_AUTHORITY.to_owned(), run.authority.clone()),
        (LABEL_STORE.to_owned(), run.store.clone()),
    ]
    .into_iter()
    .chain(
        run.cdi
            .iter()
            .map(|c| (LABEL_CDI_SPECS.to_owned(), c.specs.to_string())),
    )
    .collect();
    let mut spec = oci::spec(
        &storage.root,
        storage.root_readonly,
        process,
        mounts,
        linux,
        annotations,
    )?;
    spec.set_hooks(hooks(kind, run)?);
    Ok(Planned {
        launch: launch_identity(&spec, run)?,
        spec,
        host_mounts: storage.host_mounts,
        staging_dir: staging.as_ref().map(|_| storage.staging_dir.clone()),
        child,
        gate,
        session: SessionSettings {
            image: (image.to_owned(), pin),
            deadline_ms: *deadline_ms,
            phase_deadline_ms: phase_deadline_ms.clone(),
            output: output.clone(),
            publication: publication.clone(),
            frame: frame.clone(),
            staging: staging.clone(),
        },
    })
}

/// The variables a POSIX shell sets in its own environment as it starts (ash and dash: `PWD`,
/// `SHLVL`; `OLDPWD` after a `cd`).
const SHELL_SET: [&str; 3] = ["PWD", "SHLVL", "OLDPWD"];

/// The start gate at host path `gate`, bound read-only at [`GATE`].
///
/// # Errors
/// The path is not UTF-8.
pub(crate) fn gate_mount(gate: &Path) -> Result<Mount, PlanError> {
    let source = gate
        .to_str()
        .ok_or_else(|| invalid("the run directory is not UTF-8"))?;
    mount(
        GATE,
        "bind",
        source,
        &["bind", "ro", "rprivate", "nosuid", "nodev", "noexec"],
    )
}

/// `argv` behind its entrypoint's wait at the start gate ([`Entry`]). A step's wait is
/// `/bin/sh` of its root, which puts back exactly the planned `env` (each of [`SHELL_SET`]
/// unset, or set to the planned value) before it execs the step, so the step starts with the
/// environment it has under any other runtime.
///
/// # Errors
/// A worker's argv is empty.
pub(crate) fn gated_argv(
    argv: &[String],
    entry: Entry,
    env: &[String],
) -> Result<Vec<String>, PlanError> {
    match entry {
        Entry::Step => {
            let restore: String = SHELL_SET
                .iter()
                .map(|name| {
                    let planned = env
                        .iter()
                        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='));
                    match planned {
                        Some(v) => format!("export {name}='{}'; ", v.replace('\'', r"'\''")),
                        None => format!("unset {name}; "),
                    }
                })
                .collect();
            // `read` fails at end of file: a gate closed without its line runs nothing.
            let script = format!("read -r cordon_gate < {GATE} || exit 70; {restore}exec \"$@\"");
            Ok(["/bin/sh", "-c", &script, "cordon-gate"]
                .into_iter()
                .map(str::to_owned)
                .chain(argv.iter().cloned())
                .collect())
        }
        Entry::Worker => {
            let (worker, rest) = argv
                .split_first()
                .ok_or_else(|| invalid("a worker run with an empty argv"))?;
            Ok([worker.clone(), "--gate".into(), GATE.to_owned()]
                .into_iter()
                .chain(rest.iter().cloned())
                .collect())
        }
    }
}

/// Placeholder run inputs for `explain --bundle`: the first ids of the range, the pinned
/// image's cache path, store paths with `TREE`/`LEASE` placeholders, and placeholder device
/// numbers (the session stats the real nodes).
#[must_use]
pub fn example_inputs(policy: &Policy, kind: StageKind) -> RunInputs {
    let store = PathBuf::from(policy.store());
    let stage = policy.stage(kind);
    let image = stage
        .and_then(|s| policy.image_pin(s.image.as_deref()?))
        .map_or_else(|| "IMAGE".to_owned(), Digest::hex);
    let run_dir = PathBuf::from(policy.run_dir()).join("LEASE");
    let sources: BTreeMap<MountSource, PathBuf> = [
        (MountSource::Tree, store.join("trees/TREE/root")),
        (
            MountSource::Publication,
            store.join("publications/PUBLICATION/root"),
        ),
        (
            MountSource::Model,
            PathBuf::from("/var/lib/cordon/models/MODEL"),
        ),
        (
            MountSource::Workspace,
            PathBuf::from("/var/lib/cordon/workspaces/WORKSPACE"),
        ),
    ]
    .into_iter()
    .collect();
    let devices = stage
        .map(|s| {
            s.gpu_device
                .keys()
                .zip(0u64..)
                .map(|(p, i)| {
                    (
                        p.clone(),
                        DeviceNode {
                            char: true,
                            major: 195,
                            minor: i,
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let argv = policy
        .step_names()
        .filter_map(|n| policy.step(n))
        .find(|(k, _)| *k == kind)
        .map_or_else(|| vec!["/bin/sh".to_owned()], |(_, argv)| argv.to_vec());
    let accounts = policy.accounts();
    RunInputs {
        argv,
        uid: accounts.uid_range.first,
        gid: accounts.gid_range.first,
        image_rootfs: store.join("images").join(image).join("rootfs"),
        run_dir: run_dir.clone(),
        sources,
        devices,
        cdi: None,
        lane: None,
        executor: "EXECUTOR".into(),
        lease: "LEASE".into(),
        authority: "AUTHORITY".into(),
        store: "STORE".into(),
        protected: vec![
            store.clone(),
            run_dir.join("bundle"),
            PathBuf::from(cordon::lease::DEFAULT_STATE_ROOT),
        ],
        mountable_store_roots: vec![store.join("trees"), store.join("publications")],
        never_mount_real: Vec::new(),
        cgroups: Some(Cgroups::V1(PathBuf::from(cordon::run_cgroup::ROOT))),
        // The argv above is the step's, in every stage (a lane's runs put the worker first).
        entry: Entry::Step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_testkit::EditOnce as _;

    fn policy(edit: impl Fn(String) -> String) -> Policy {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../policy/evaluator.kdl");
        let text = edit(std::fs::read_to_string(path).unwrap());
        cordon_policy_lang::parse("evaluator.kdl", &text).unwrap()
    }

    fn spec_json(p: &Planned) -> serde_json::Value {
        serde_json::to_value(&p.spec).unwrap()
    }

    #[test]
    fn overlay_root_is_per_lease_over_the_read_only_image() {
        let p = policy(|t| t);
        let run = example_inputs(&p, StageKind::Lane);
        let planned = plan(&p, StageKind::Lane, &run).unwrap();
        let root = spec_json(&planned)["root"].clone();
        assert_eq!(root["path"], "/run/cordon/LEASE/rootfs");
        assert_ne!(root["path"].as_str(), run.image_rootfs.to_str());
        assert_eq!(
            planned.host_mounts,
            vec![
                HostMount::Tmpfs {
                    target: run.run_dir.join(TMP_DIR),
                    bytes: p.stage(StageKind::Lane).unwrap().tmp.size_bytes,
                    inodes: None,
                    uid: run.uid,
                    gid: run.gid,
                },
                // The runtime cache: the lease's own, bounded in bytes and inodes.
                HostMount::Tmpfs {
                    target: run.run_dir.join(CACHE_DIR),
                    bytes: 8 << 30,
                    inodes: Some(1_000_000),
                    uid: run.uid,
                    gid: run.gid,
                },
                HostMount::Overlay {
                    target: run.run_dir.join("rootfs"),
                    lower: run.image_rootfs.clone(),
                    upper: run.run_dir.join("overlay/upper"),
                    work: run.run_dir.join("overlay/work"),
                    // The writable layer's own bounded tmpfs.
                    bytes: 1 << 30,
                    inodes: 100_000,
                },
                // Store trees are bound from the lease's own copies, never directly.
                HostMount::Copy {
                    target: run.run_dir.join("copy-tree"),
                    source: run.sources[&MountSource::Tree].clone(),
                },
                HostMount::Copy {
                    target: run.run_dir.join("copy-publication"),
                    source: run.sources[&MountSource::Publication].clone(),
                },
            ]
        );
    }

    #[test]
    fn the_launch_identity_differs_only_where_the_plan_does_not_belong_to_the_run() {
        let p = policy(|t| t);
        let a = example_inputs(&p, StageKind::Lane);
        let launch = |run: &RunInputs| plan(&p, StageKind::Lane, run).unwrap().launch;
        // Another account, lease, run directory, image cache path and role sources: the same
        // launch, and none of the run's values is left in it.
        let mut b = a.clone();
        b.uid += 7;
        b.gid += 7;
        b.lease = "other-lease".into();
        b.run_dir = PathBuf::from("/run/cordon/other-lease");
        b.image_rootfs = PathBuf::from("/var/lib/cordon/store/images/other/rootfs");
        for (role, path) in &mut b.sources {
            *path = PathBuf::from(format!("/elsewhere/{}", role.as_str()));
        }
        assert_eq!(launch(&a), launch(&b));
        let text = launch(&b).to_string();
        for run_value in ["other-lease", "/elsewhere", "/var/lib/cordon/store/images"] {
            assert!(!text.contains(run_value), "{run_value} is in {text}");
        }
        assert!(!text.contains(&format!("\"uid\":{}", b.uid)), "{text}");
        // A stage with device nodes (owned by the run account's group) likewise.
        let on = |run: &RunInputs| plan(&p, StageKind::Reference, run).unwrap().launch;
        let r = example_inputs(&p, StageKind::Reference);
        let mut s = r.clone();
        s.uid += 7;
        s.gid += 7;
        assert_eq!(on(&r), on(&s));
        assert!(!on(&s).to_string().contains(&s.gid.to_string()));
        // What every run shares is in it: another argv or another limit is another launch.
        let mut c = a.clone();
        c.argv.push("--extra".into());
        assert_ne!(launch(&a), launch(&c));
        let q = policy(|t| t.replace("pids 4096", "pids 4095"));
        assert_ne!(
            launch(&a),
            plan(&q, StageKind::Lane, &example_inputs(&q, StageKind::Lane))
                .unwrap()
                .launch
        );
    }

    /// Under crun (which installs the seccomp filter only as it execs the entrypoint) every run
    /// waits at a start gate bound read-only into its `/dev`: a step behind the image's shell, which puts
    /// back exactly the planned environment, the worker by its own `--gate`; under runc the
    /// argv is the job's and there is no gate.
    #[test]
    fn under_crun_the_entrypoint_waits_at_a_start_gate_with_the_planned_environment() {
        let runc = policy(|t| t);
        let crun = policy(|t| {
            t.replace_once(
                r#"runtime "runc" path="/usr/sbin/runc" min-version="1.1.5""#,
                r#"runtime "crun" path="/usr/bin/crun""#,
            )
            .replace_once(
                r#"        LANG "C.UTF-8"
        PYTHONDONTWRITEBYTECODE "1""#,
                r#"        LANG "C.UTF-8"
        PWD "/it's"
        PYTHONDONTWRITEBYTECODE "1""#,
            )
        });
        let run = example_inputs(&runc, StageKind::Prebuild);
        let argv = |p: &Planned| p.spec.process().as_ref().unwrap().args().clone().unwrap();
        let plain = plan(&runc, StageKind::Prebuild, &run).unwrap();
        assert_eq!(plain.gate, None);
        assert_eq!(argv(&plain), run.argv);
        let gated = plan(&crun, StageKind::Prebuild, &run).unwrap();
        assert_eq!(gated.gate, Some(run.run_dir.join(GATE_DIR).join(GATE_FIFO)));
        let bound = |p: &Planned| {
            spec_json(p)["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["destination"] == GATE)
                .cloned()
                .collect::<Vec<_>>()
        };
        assert!(bound(&plain).is_empty());
        assert_eq!(
            bound(&gated),
            [serde_json::json!({
                "destination": GATE,
                "type": "bind",
                "source": run.run_dir.join(GATE_DIR).join(GATE_FIFO),
                "options": ["bind", "ro", "rprivate", "nosuid", "nodev", "noexec"],
            })]
        );
        let script = r#"read -r cordon_gate < /dev/.cordon-gate || exit 70; export PWD='/it'\''s'; unset SHLVL; unset OLDPWD; exec "$@""#;
        let head = ["/bin/sh", "-c", script, "cordon-gate"].map(str::to_owned);
        assert_eq!(argv(&gated), [&head[..], &run.argv[..]].concat());
        let mut worker = run.clone();
        worker.entry = Entry::Worker;
        worker.argv = ["/cordon/worker", "--protocol", "lane"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(
            argv(&plan(&crun, StageKind::Prebuild, &worker).unwrap()),
            ["/cordon/worker", "--gate", GATE, "--protocol", "lane"]
        );
        worker.argv.clear();
        assert!(plan(&crun, StageKind::Prebuild, &worker).is_err());
    }

    /// The patcher's child is planned from the policy's `child`: its cgroup's directories
    /// (cordon's parents may exist, the lease's own may not), its limits, the files given to
    /// the account, and the binds; on v1 one per controller, on v2 one nested cgroup beside a
    /// `main` leaf the created init is moved into; refused where the layout was not read.
    #[test]
    fn a_patchers_child_is_a_host_prepared_cgroup_on_v1_and_v2() {
        let p = policy(|t| t);
        let run = example_inputs(&p, StageKind::Prebuild);
        let planned = plan(&p, StageKind::Prebuild, &run).unwrap();
        let child = planned.child.as_ref().unwrap();
        let at = |c: &str| format!("/sys/fs/cgroup/{c}/cordon/EXECUTOR/LEASE/child");
        let binds = |planned: &Planned| -> Vec<(String, String)> {
            spec_json(planned)["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["destination"].as_str().unwrap().starts_with(CHILD_MOUNT))
                .map(|m| {
                    (
                        m["source"].as_str().unwrap().to_owned(),
                        m["destination"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        let limit = |child: &ChildPlan, f: &str| {
            child
                .limits
                .iter()
                .find(|(p, _)| p.ends_with(f))
                .map(|(_, v)| v.clone())
        };
        let made: Vec<(String, bool)> = child
            .make
            .iter()
            .filter(|(d, _)| d.starts_with("/sys/fs/cgroup/memory"))
            .map(|(d, e)| (d.display().to_string(), *e))
            .collect();
        assert_eq!(
            made,
            [
                ("/sys/fs/cgroup/memory/cordon".into(), true),
                ("/sys/fs/cgroup/memory/cordon/EXECUTOR".into(), true),
                ("/sys/fs/cgroup/memory/cordon/EXECUTOR/LEASE".into(), false),
                (at("memory"), false),
            ]
        );
        assert_eq!(child.make.len(), 12);
        assert_eq!(child.vacate, None);
        assert_eq!(
            limit(child, "memory.limit_in_bytes").as_deref(),
            Some("6442450944")
        );
        assert_eq!(
            limit(child, "memory.memsw.limit_in_bytes").as_deref(),
            Some("6442450944")
        );
        assert_eq!(limit(child, "pids.max").as_deref(), Some("768"));
        assert_eq!(limit(child, "cpu.cfs_quota_us").as_deref(), Some("400000"));
        assert_eq!(
            child.given,
            CHILD_CONTROLLERS.map(|c| PathBuf::from(at(c)).join("cgroup.procs"))
        );
        assert_eq!(child.memory, PathBuf::from(at("memory")));
        assert_eq!(child.kill, None);
        assert_eq!(child.deadline_ms, 25 * 60_000);
        assert_eq!(
            binds(&planned),
            CHILD_CONTROLLERS.map(|c| (at(c), format!("/cordon/child/{c}")))
        );

        let v2 = RunInputs {
            cgroups: Some(Cgroups::Unified("/sys/fs/cgroup".into())),
            ..run.clone()
        };
        let planned = plan(&p, StageKind::Prebuild, &v2).unwrap();
        let child = planned.child.as_ref().unwrap();
        let lease = "/sys/fs/cgroup/cordon/EXECUTOR/LEASE";
        let dir = PathBuf::from(format!("{lease}/child"));
        let made: Vec<(String, bool)> = child
            .make
            .iter()
            .map(|(d, e)| (d.display().to_string(), *e))
            .collect();
        assert_eq!(
            made,
            [
                ("/sys/fs/cgroup/cordon".into(), true),
                ("/sys/fs/cgroup/cordon/EXECUTOR".into(), true),
                (lease.into(), false),
                (format!("{lease}/main"), false),
                (format!("{lease}/child"), false),
            ]
        );
        assert_eq!(
            child.vacate,
            Some((
                PathBuf::from(format!("{lease}/cgroup.procs")),
                PathBuf::from(format!("{lease}/main/cgroup.procs"))
            ))
        );
        // The controllers are enabled below the container's cgroup before any child limit.
        assert_eq!(
            child.limits[0],
            (
                PathBuf::from(format!("{lease}/cgroup.subtree_control")),
                "+memory +pids +cpu".to_owned()
            )
        );
        assert_eq!(limit(child, "memory.max").as_deref(), Some("6442450944"));
        assert_eq!(limit(child, "memory.swap.max").as_deref(), Some("0"));
        assert_eq!(limit(child, "pids.max").as_deref(), Some("768"));
        assert_eq!(limit(child, "cpu.max").as_deref(), Some("400000 100000"));
        assert!(child.limits[1..].iter().all(|(f, _)| f.starts_with(&dir)));
        assert_eq!(
            child.given,
            [
                dir.join("cgroup.procs"),
                PathBuf::from(format!("{lease}/cgroup.procs"))
            ]
        );
        assert_eq!(child.memory, dir);
        assert_eq!(child.kill, Some(dir.join("cgroup.kill")));
        assert_eq!(
            binds(&planned),
            [(
                dir.display().to_string(),
                "/cordon/child/unified".to_owned()
            )]
        );
        // The cgroup namespace stays: the child is inside the container's cgroup.
        assert!(
            planned
                .spec
                .linux()
                .as_ref()
                .unwrap()
                .namespaces()
                .as_ref()
                .unwrap()
                .iter()
                .any(|n| n.typ() == LinuxNamespaceType::Cgroup)
        );

        let unread = RunInputs {
            cgroups: None,
            ..run
        };
        assert!(matches!(
            plan(&p, StageKind::Prebuild, &unread),
            Err(PlanError::Unimplemented { what, .. }) if what.contains("cgroup layout")
        ));
    }

    #[test]
    fn ipc_none_has_no_dev_shm_and_ipc_private_has_a_bounded_one() {
        let p = policy(|t| t);
        let prebuild = plan(
            &p,
            StageKind::Prebuild,
            &example_inputs(&p, StageKind::Prebuild),
        )
        .unwrap();
        let j = spec_json(&prebuild);
        let dests: Vec<&str> = j["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert!(!dests.contains(&"/dev/shm"), "{dests:?}");
        assert!(j["linux"]["namespaces"].to_string().contains("\"ipc\""));
        let lane = plan(&p, StageKind::Lane, &example_inputs(&p, StageKind::Lane)).unwrap();
        let shm = spec_json(&lane)["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .cloned()
            .unwrap();
        assert!(shm["options"].to_string().contains("size=4294967296"));
    }

    /// A read on GPU lane `name` of the GPU policy, its devices resolved from `spec` and found
    /// on the host as character devices 195:N in the spec's order.
    fn gpu_read(p: &Policy, name: &str, spec: &str) -> RunInputs {
        let mut run = example_inputs(p, StageKind::Lane);
        let lane = p.physical_lanes()[name].clone();
        let devices: Vec<String> = lane.gpus.keys().map(|u| crate::cdi::gpu(u)).collect();
        let hooks = &p.device_guard().unwrap().cdi_hooks;
        let path = Path::new("/etc/cdi/nvidia.json");
        let cdi = crate::cdi::resolve_lane(&[(path, spec.as_bytes())], &devices, hooks).unwrap();
        run.devices = cdi
            .nodes
            .iter()
            .zip(0u64..)
            .map(|(n, i)| {
                let node = DeviceNode {
                    char: true,
                    major: 195,
                    minor: i,
                };
                (n.path.clone(), node)
            })
            .collect();
        run.cdi = Some(cdi);
        run.lane = Some(lane);
        run
    }

    fn gpu_policy() -> Policy {
        policy(|t| cordon_testkit::with_gpu_lanes(&t))
    }

    #[test]
    fn a_gpu_lanes_read_gets_exactly_its_cdi_edits_and_nothing_more() {
        let p = gpu_policy();
        let run = gpu_read(&p, "a", &cordon_testkit::cdi_spec());
        let j = spec_json(&plan(&p, StageKind::Lane, &run).unwrap());
        // Each node the spec gives, 0660 and the run group's; the device cgroup denies all,
        // then allows exactly those nodes, never mknod.
        let nodes: Vec<&str> = j["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            nodes,
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/dri/card1"
            ]
        );
        assert_eq!(j["linux"]["devices"][2]["fileMode"], 0o660);
        assert_eq!(j["linux"]["devices"][2]["gid"], run.gid);
        let rules = j["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(
            rules[0],
            serde_json::json!({"allow": false, "access": "rwm"})
        );
        assert_eq!(rules.len(), 5);
        for (i, r) in rules[1..].iter().enumerate() {
            assert_eq!(
                (
                    &r["allow"],
                    &r["type"],
                    &r["major"],
                    &r["minor"],
                    &r["access"]
                ),
                (
                    &true.into(),
                    &"c".into(),
                    &195.into(),
                    &i.into(),
                    &"rw".into()
                ),
            );
        }
        // The library bind: read-only, private, no set-id or devices, executable (it is
        // mapped executable); the variable; the allowed hook at its point; the driver's /proc
        // files not masked; the specs named.
        let lib = j["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
            .unwrap();
        assert_eq!(lib["type"], "bind");
        assert_eq!(
            lib["options"],
            serde_json::json!(["bind", "ro", "rprivate", "nosuid", "nodev"])
        );
        assert!(
            j["process"]["env"]
                .as_array()
                .unwrap()
                .contains(&"NVIDIA_VISIBLE_DEVICES=void".into())
        );
        assert_eq!(
            j["hooks"]["createContainer"][0]["path"],
            "/usr/bin/nvidia-cdi-hook"
        );
        assert_eq!(j["hooks"].as_object().unwrap().len(), 1);
        assert!(
            !j["linux"]["maskedPaths"]
                .to_string()
                .contains("/proc/driver")
        );
        assert_eq!(
            j["annotations"][LABEL_CDI_SPECS],
            run.cdi.as_ref().unwrap().specs.to_string()
        );
    }

    /// Lane a's and lane b's reads resolve to other nodes: one launch identity all the same
    /// (the lane is the receipts'), while other specs are another launch.
    #[test]
    fn two_gpu_lanes_share_one_launch_identity_and_other_specs_are_another() {
        let p = gpu_policy();
        let spec = cordon_testkit::cdi_spec();
        let launch = |run: &RunInputs| plan(&p, StageKind::Lane, run).unwrap().launch;
        let (a, b) = (gpu_read(&p, "a", &spec), gpu_read(&p, "b", &spec));
        assert_ne!(
            plan(&p, StageKind::Lane, &a).unwrap().spec,
            plan(&p, StageKind::Lane, &b).unwrap().spec
        );
        assert_eq!(launch(&a), launch(&b));
        let text = launch(&a).to_string();
        for gone in ["/dev/nvidia0", "/dev/dri/card1", "update-ldcache"] {
            assert!(!text.contains(gone), "{gone} in {text}");
        }
        for kept in [
            "libcuda",
            "NVIDIA_VISIBLE_DEVICES=void",
            "nvidia-cdi-hook",
            "$GPU_NODE",
        ] {
            assert!(text.contains(kept), "{kept} not in {text}");
        }
        assert_eq!(launch(&a)["cdi"], 1);
        // Other specs; a device of its own with another variable, bind or node count.
        let other = gpu_read(&p, "a", &spec.replace("550.54.15", "550.54.16"));
        assert_ne!(launch(&a), launch(&other));
        let own = r#"{"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}]"#;
        for to in [
            r#"{"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}], "env": ["LD_PRELOAD=/x.so"]"#,
            r#"{"path": "/dev/nvidia1"}]"#,
            r#"{"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}], "mounts": [{"hostPath": "/usr/lib/x.so", "containerPath": "/usr/lib/x.so"}]"#,
        ] {
            let edited = spec.replacen(own, to, 1);
            assert_ne!(edited, spec, "{to}");
            let b = gpu_read(&p, "b", &edited);
            assert_ne!(launch(&a), launch(&b), "{to}");
        }
    }

    /// A GPU lane's read without its CDI edits, or edits on a read whose lane has no GPU, is
    /// refused: never run as the CPU set it also is.
    #[test]
    fn a_gpu_lanes_read_without_its_cdi_edits_is_refused() {
        let p = gpu_policy();
        let mut run = gpu_read(&p, "a", &cordon_testkit::cdi_spec());
        let refused = |run: &RunInputs| {
            matches!(
                plan(&p, StageKind::Lane, run),
                Err(PlanError::Invalid { why }) if why.contains("CDI edits")
            )
        };
        let cdi = run.cdi.take();
        assert!(refused(&run));
        run.cdi = cdi;
        let mut other = run.clone();
        other.lane = Some(p.physical_lanes()["b"].clone());
        assert!(refused(&other));
        let cpu = policy(|t| t);
        run.lane = Some(cpu.physical_lanes()["a"].clone());
        assert!(matches!(
            plan(&cpu, StageKind::Lane, &run),
            Err(PlanError::Invalid { .. })
        ));
    }

    /// What the bundle cannot apply as the spec asks is refused (the host's spec: a
    /// no-decision), each alone.
    #[test]
    fn cdi_edits_the_bundle_cannot_apply_as_asked_are_refused() {
        let p = gpu_policy();
        let spec = cordon_testkit::cdi_spec();
        let node = r#"{"path": "/dev/nvidiactl"}"#;
        let bind = r#""options": ["ro", "nosuid", "nodev", "bind"]"#;
        for (from, to, why) in [
            (
                node,
                r#"{"path": "/dev/nvidiactl", "fileMode": 438}"#,
                "sets its mode or owner",
            ),
            (
                node,
                r#"{"path": "/dev/nvidiactl", "uid": 0}"#,
                "sets its mode or owner",
            ),
            (
                node,
                r#"{"path": "/dev/nvidiactl", "permissions": "m"}"#,
                "nothing but mknod",
            ),
            (
                node,
                r#"{"path": "/dev/nvidiactl", "permissions": "rwx"}"#,
                "permissions",
            ),
            (
                node,
                r#"{"path": "/dev/nvidiactl", "major": 10}"#,
                "the host has",
            ),
            (bind, r#""options": ["rw", "bind"]"#, "option \"rw\""),
            (bind, r#""options": ["ro", "suid"]"#, "option \"suid\""),
            (bind, r#""type": "tmpfs", "options": []"#, "mount type"),
            (
                "NVIDIA_VISIBLE_DEVICES=void",
                "PATH=/candidate/bin",
                "sets a key the stage's environment sets",
            ),
        ] {
            let edited = spec.replacen(from, to, 1);
            assert_ne!(edited, spec, "{from}");
            let run = gpu_read(&p, "a", &edited);
            match plan(&p, StageKind::Lane, &run) {
                Err(e @ PlanError::Cdi { .. }) => {
                    assert!(e.to_string().contains(why), "{to}: {e}");
                    assert_eq!(
                        cordon::exit::ExitClass::exit_class(&e),
                        cordon::ExitCode::NoDecision
                    );
                }
                other => panic!("{to}: {other:?}"),
            }
        }
        // A node the host does not have; a block device where the spec names a GPU's.
        let mut run = gpu_read(&p, "a", &spec);
        run.devices.remove("/dev/nvidia0");
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::NoDevice { path, .. }) if path == "/dev/nvidia0"
        ));
        let mut run = gpu_read(&p, "a", &spec);
        run.devices.get_mut("/dev/nvidia0").unwrap().char = false;
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::Cdi { why, .. }) if why.contains("block device")
        ));
        // Binds under a read-only root would make mount points in the shared image cache.
        let ro = policy(|t| {
            let t = cordon_testkit::with_gpu_lanes(&t);
            let (a, b) = t.split_at(t.find("stage \"lane\"").unwrap());
            let overlay = b.find("\n    overlay ").unwrap();
            let end = overlay + 1 + b[overlay + 1..].find('\n').unwrap();
            let b = format!("{}{}", &b[..overlay], &b[end..]);
            format!(
                "{a}{}",
                b.replacen("root \"overlay\"", "root \"read-only\"", 1)
            )
        });
        assert!(matches!(
            plan(&ro, StageKind::Lane, &gpu_read(&ro, "a", &spec)),
            Err(PlanError::Cdi { why, .. }) if why.contains("overlay root")
        ));
    }

    /// CDI binds are checked as the stage's are: no reserved destination, no protected or
    /// never-mount source.
    #[test]
    fn cdi_binds_may_not_reach_reserved_protected_or_never_mount_paths() {
        let p = gpu_policy();
        let spec = cordon_testkit::cdi_spec();
        let never = p.never_mount().next().unwrap().to_owned();
        let lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15";
        for (from, to) in [
            (
                format!(r#""containerPath": "{lib}""#),
                r#""containerPath": "/proc/driver/nvidia""#.to_owned(),
            ),
            (
                format!(r#""hostPath": "{lib}""#),
                format!(r#""hostPath": "{never}/libcuda.so""#),
            ),
            (
                format!(r#""hostPath": "{lib}""#),
                r#""hostPath": "/var/lib/cordon/store/objects""#.to_owned(),
            ),
        ] {
            let edited = spec.replacen(&from, &to, 1);
            assert_ne!(edited, spec, "{from}");
            let mut run = gpu_read(&p, "a", &edited);
            run.protected = vec![PathBuf::from(p.store())];
            let e = plan(&p, StageKind::Lane, &run).unwrap_err();
            assert!(
                matches!(e, PlanError::Overlap { .. } | PlanError::Protected { .. }),
                "{to}: {e:?}"
            );
        }
    }

    /// Under a GPU-lane policy, a stage that could reach a GPU runs only on a GPU lane (where
    /// the lane session guards it); the prebuild, which has no GPU, runs.
    #[test]
    fn a_policy_with_gpu_lanes_runs_no_gpu_capable_stage_off_its_gpu_lanes() {
        let p = gpu_policy();
        let lanes = p.physical_lanes();
        for kind in [StageKind::Lane, StageKind::Reference] {
            assert!(matches!(
                unguarded_gpus(&p, kind, None),
                Err(PlanError::Unimplemented { .. })
            ));
            unguarded_gpus(&p, kind, Some(&lanes["a"])).unwrap();
        }
        let mut cpu_only = lanes["a"].clone();
        cpu_only.gpus.clear();
        assert!(unguarded_gpus(&p, StageKind::Lane, Some(&cpu_only)).is_err());
        unguarded_gpus(&p, StageKind::Prebuild, None).unwrap();
        unguarded_gpus(&policy(|t| t), StageKind::Lane, None).unwrap();
    }

    #[test]
    fn a_read_on_a_physical_lane_gets_its_cpus_and_weight_and_one_launch_identity() {
        let p = policy(|t| t);
        let on = |name: &str| {
            let mut run = example_inputs(&p, StageKind::Lane);
            run.lane = p.physical_lanes().get(name).cloned();
            plan(&p, StageKind::Lane, &run).unwrap()
        };
        let (a, b) = (on("a"), on("b"));
        for (planned, cpus) in [(&a, "0"), (&b, "1")] {
            let cpu = spec_json(planned)["linux"]["resources"]["cpu"].clone();
            assert_eq!(
                (cpu["cpus"].as_str(), cpu["shares"].as_u64()),
                (Some(cpus), Some(262_144))
            );
        }
        // The lane's CPUs are the run's own; its weight is every read's.
        assert_eq!(a.launch, b.launch);
        assert_eq!(a.launch["linux"]["resources"]["cpu"]["shares"], 262_144);
        // Off a lane (the audit, T): the kernel's default weight, nothing written.
        let off = plan(&p, StageKind::Lane, &example_inputs(&p, StageKind::Lane)).unwrap();
        assert!(spec_json(&off)["linux"]["resources"]["cpu"]["shares"].is_null());
    }

    #[test]
    fn gpu_devices_are_planned_and_a_missing_one_is_refused() {
        // A reference stage that lists GPU nodes (the lane takes its devices from CDI in part 2).
        let p = policy(|t| cordon_testkit::with_reference_gpus(&t));
        let mut run = example_inputs(&p, StageKind::Reference);
        let planned = plan(&p, StageKind::Reference, &run).unwrap();
        let j = spec_json(&planned);
        let paths: Vec<&str> = j["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]);
        let rules = j["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0]["allow"], false);
        assert_eq!(rules.len(), 4);
        run.devices.remove("/dev/nvidia0");
        assert!(matches!(
            plan(&p, StageKind::Reference, &run),
            Err(PlanError::NoDevice { .. })
        ));
        // Two runs under other accounts have one launch identity: each device node's owner is
        // the run's own account, and stands as `$UID`/`$GID`.
        run = example_inputs(&p, StageKind::Reference);
        let identity = |run: &RunInputs| {
            let planned = plan(&p, StageKind::Reference, run).unwrap();
            launch_identity(&planned.spec, run).unwrap()
        };
        let first = identity(&run);
        let devices = first["linux"]["devices"].as_array().unwrap();
        assert!(devices.iter().all(|d| d["gid"] == "$GID"), "{devices:?}");
        let mut other = run.clone();
        other.uid += 7;
        other.gid += 7;
        assert_eq!(identity(&other), first);
        // The prebuild stage has no GPU: only the deny-all rule.
        let prebuild = plan(
            &p,
            StageKind::Prebuild,
            &example_inputs(&p, StageKind::Prebuild),
        )
        .unwrap();
        let j = spec_json(&prebuild);
        assert_eq!(
            j["linux"]["resources"]["devices"].as_array().unwrap().len(),
            1
        );
    }

    #[test]
    fn the_surface_stage_is_refused_not_half_planned() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/examples/surface.kdl"
        ))
        .unwrap();
        let p = cordon_policy_lang::parse("surface.kdl", &text).unwrap();
        let run = example_inputs(&p, StageKind::Surface);
        assert!(matches!(
            plan(&p, StageKind::Surface, &run),
            Err(PlanError::Unimplemented { .. })
        ));
    }

    /// A never-mount path is never bound: not itself, not a path above it, not one inside it;
    /// without the policy's line the same model plans.
    #[test]
    fn a_never_mount_path_is_never_bound() {
        let line = "never-mount \"/srv/secrets\" reason=\"the host's secrets\"\n";
        let at = "models \"/var/lib/cordon/models\"\n";
        let p = policy(|t| t.replacen(at, &format!("{at}{line}"), 1));
        for model in ["/srv/secrets", "/srv", "/srv/secrets/m"] {
            let mut run = example_inputs(&p, StageKind::Lane);
            run.sources.insert(MountSource::Model, PathBuf::from(model));
            assert!(
                matches!(
                    plan(&p, StageKind::Lane, &run),
                    Err(PlanError::Protected { ref protected, ref why, .. })
                        if protected == "/srv/secrets" && why == "never-mount: the host's secrets"
                ),
                "{model}"
            );
            let without = policy(|t| t);
            plan(&without, StageKind::Lane, &run).unwrap();
        }
        // Where a never-mount path really leads counts too (the session resolves it).
        let mut run = example_inputs(&p, StageKind::Lane);
        run.sources
            .insert(MountSource::Model, PathBuf::from("/real/secrets/m"));
        plan(&p, StageKind::Lane, &run).unwrap();
        run.never_mount_real = vec![(PathBuf::from("/real/secrets"), "/srv/secrets".to_owned())];
        let e = plan(&p, StageKind::Lane, &run).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mount source /real/secrets/m would expose the protected path /real/secrets \
             (never-mount: the host's secrets)"
        );
        // A never-mount path inside the store (a tree's, say) never reaches planning: the
        // language refuses it beside a named root.
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/evaluator.kdl"
        ))
        .unwrap();
        let run = example_inputs(&p, StageKind::Lane);
        let tree = run.sources[&MountSource::Tree].display().to_string();
        let named = format!("never-mount {tree:?} reason=\"t\"\n");
        let refused =
            cordon_policy_lang::parse("t.kdl", &text.replacen(at, &format!("{at}{named}"), 1))
                .unwrap_err();
        assert!(
            refused
                .problems()
                .iter()
                .any(|p| p.short_code() == "overlap"),
            "{}",
            refused.render_text(&cordon::voice::Style::fixed(100).handler())
        );
        // The shipped policy's: the signing key's directory among them.
        let shipped = policy(|t| t);
        let mut run = example_inputs(&shipped, StageKind::Lane);
        run.sources
            .insert(MountSource::Model, PathBuf::from("/var/lib/cordon-keys"));
        assert!(matches!(
            plan(&shipped, StageKind::Lane, &run),
            Err(PlanError::Protected { .. })
        ));
    }

    #[test]
    fn a_missing_source_and_an_undeclared_stage_are_named_errors() {
        let p = policy(|t| t);
        let mut run = example_inputs(&p, StageKind::Lane);
        run.sources.remove(&MountSource::Model);
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::NoSource {
                role: MountSource::Model,
                ..
            })
        ));
        let minimal = cordon_policy_lang::parse(
            "minimal.kdl",
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../policy/examples/minimal.kdl"
            ))
            .unwrap(),
        )
        .unwrap();
        if minimal.stage(StageKind::Lane).is_none() {
            assert!(matches!(
                plan(&minimal, StageKind::Lane, &run),
                Err(PlanError::NoStage { .. })
            ));
        }
    }

    /// A lease names every host mount its stage will make before any exists: the prebuild's
    /// `/tmp` and staging tmpfs and its tree copy; the lane's `/tmp`, its runtime cache, its
    /// copies of the tree and publication, and its overlay root with its writable layer's tmpfs.
    #[test]
    fn a_lease_names_every_mount_point_its_stage_makes() {
        let p = policy(|t| t);
        let prebuild = p.stage(StageKind::Prebuild).unwrap();
        assert_eq!(
            lease_mount_points(prebuild),
            [TMP_DIR, STAGING_DIR, "copy-tree"]
        );
        let lane = p.stage(StageKind::Lane).unwrap();
        let points = lease_mount_points(lane);
        // The overlay's writable layer before its root: release undoes in reverse order, so
        // the root is unmounted before the tmpfs beneath its upper directory.
        let at = |name| points.iter().position(|p| *p == name).unwrap();
        assert!(at(OVERLAY_STATE_DIR) < at(OVERLAY_ROOT_DIR), "{points:?}");
        let mut points = points.clone();
        points.sort_unstable();
        assert_eq!(
            points,
            [
                CACHE_DIR,
                "copy-publication",
                "copy-tree",
                OVERLAY_STATE_DIR,
                OVERLAY_ROOT_DIR,
                TMP_DIR
            ]
        );
    }

    /// Each operator the language admits compiles to its own OCI form: 64-bit comparisons and
    /// equalities as themselves, 32-bit equalities and masks as a masked test of the low half.
    #[test]
    fn each_argument_operator_compiles_to_its_oci_form() {
        let rules = "    rule \"ioctl\" action=\"allow\" reason=\"t\" {\n        arg index=2 op=\"ne\" value=5\n    }\n\
            rule \"setsockopt\" action=\"allow\" reason=\"t\" {\n        arg index=3 op=\"lt\" value=100\n    }\n\
            rule \"socketpair\" action=\"allow\" reason=\"t\" {\n        arg index=3 op=\"le\" value=100\n    }\n\
            rule \"prctl\" action=\"allow\" reason=\"t\" {\n        arg index=1 op=\"gt\" value=100\n        arg index=2 op=\"ge\" value=7\n    }\n\
            rule \"mmap\" action=\"allow\" reason=\"t\" {\n        arg index=0 op=\"eq\" value=4096\n    }\n\
            rule \"unshare\" action=\"allow\" reason=\"t\" {\n        arg index=0 op=\"masked-eq\" value=0 mask=2113994752\n    }\n\
            rule \"mprotect\" action=\"allow\" reason=\"t\" {\n        arg index=2 op=\"masked-eq\" value=0 mask=4294967296\n    }\n\
            rule \"flock\" action=\"allow\" reason=\"t\" {\n        arg index=1 op=\"eq\" value=1\n    }\n";
        let anchor = "        arg index=0 op=\"one-of\" 1 2 10\n    }\n";
        let p = policy(|t| {
            let t = [
                "ioctl",
                "setsockopt",
                "socketpair",
                "prctl",
                "mmap",
                "mprotect",
                "flock",
            ]
            .iter()
            .fold(t, |t, name| cordon_testkit::unlisted(&t, name));
            t.replace_once(anchor, &format!("{anchor}{rules}"))
        });
        let planned = plan(
            &p,
            StageKind::Prebuild,
            &example_inputs(&p, StageKind::Prebuild),
        )
        .unwrap();
        let json = spec_json(&planned);
        let args = |name: &str| -> Vec<(String, u64, Option<u64>)> {
            json["linux"]["seccomp"]["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == name))
                .flat_map(|r| r["args"].as_array().cloned().unwrap_or_default())
                .map(|a| {
                    (
                        a["op"].as_str().unwrap().to_owned(),
                        a["value"].as_u64().unwrap(),
                        a["valueTwo"].as_u64(),
                    )
                })
                .collect()
        };
        let op = |o: &str, v: u64, two: Option<u64>| (o.to_owned(), v, two);
        let low = u64::from(u32::MAX);
        assert_eq!(args("ioctl"), [op("SCMP_CMP_NE", 5, None)]);
        assert_eq!(args("setsockopt"), [op("SCMP_CMP_LT", 100, None)]);
        assert_eq!(args("socketpair"), [op("SCMP_CMP_LE", 100, None)]);
        assert_eq!(
            args("prctl"),
            [op("SCMP_CMP_GT", 100, None), op("SCMP_CMP_GE", 7, None)]
        );
        assert_eq!(args("mmap"), [op("SCMP_CMP_EQ", 4096, None)]);
        assert_eq!(
            args("unshare"),
            [op("SCMP_CMP_MASKED_EQ", 2_113_994_752, Some(0))]
        );
        assert_eq!(args("flock"), [op("SCMP_CMP_MASKED_EQ", low, Some(1))]);
        // A 64-bit argument takes a mask above the low half as it is.
        assert_eq!(
            args("mprotect"),
            [op("SCMP_CMP_MASKED_EQ", 1 << 32, Some(0))]
        );
    }

    /// A run account with id 0, user or group, is refused by the planner itself.
    #[test]
    fn a_run_account_with_id_zero_is_refused() {
        let p = policy(|t| t);
        for (uid, gid) in [(0, 5), (5, 0)] {
            let mut run = example_inputs(&p, StageKind::Prebuild);
            run.uid = uid;
            run.gid = gid;
            assert!(
                matches!(
                    plan(&p, StageKind::Prebuild, &run),
                    Err(PlanError::Invalid { .. })
                ),
                "{uid}:{gid}"
            );
        }
    }

    /// A relative source or destination is refused, even beside an absolute other half.
    #[test]
    fn a_relative_bind_is_refused() {
        let p = policy(|t| t);
        let mut run = example_inputs(&p, StageKind::Lane);
        run.sources
            .insert(MountSource::Model, PathBuf::from("relative/model"));
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::Invalid { .. })
        ));
    }

    #[test]
    fn protected_and_overlapping_sources_are_refused() {
        let p = policy(|t| t);
        let mut run = example_inputs(&p, StageKind::Lane);
        run.sources.insert(
            MountSource::Model,
            PathBuf::from("/var/lib/cordon/store/objects"),
        );
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::Protected { .. })
        ));
        // A source above the lease's protected bundle directory.
        let mut run = example_inputs(&p, StageKind::Lane);
        let above = run.run_dir.clone();
        run.sources.insert(MountSource::Model, above);
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::Protected { .. })
        ));
        let mut run = example_inputs(&p, StageKind::Lane);
        let tree = run.sources[&MountSource::Tree].clone();
        run.sources.insert(MountSource::Model, tree.join("sub"));
        assert!(matches!(
            plan(&p, StageKind::Lane, &run),
            Err(PlanError::Overlap { .. })
        ));
    }

    #[test]
    fn every_seccomp_action_and_architecture_has_its_oci_form() {
        // Argument conditions are x86_64's alone: this profile has none (no baseline, no
        // socket rule) so that it may cover every architecture.
        let p = policy(|t| {
            let start = t.find("seccomp \"candidate\" {\n").unwrap();
            let end = start + t[start..].find("\n}\n").unwrap() + 3;
            format!(
                "{}seccomp \"candidate\" {{\n    default-action \"errno\" errno=1\n    \
                 architectures \"x86_64\" \"x86\" \"x32\"\n    allow \"read\" \"write\" \
                 \"exit_group\" reason=\"t\"\n    rule \"process_madvise\" action=\"kill-thread\" \
                 reason=\"t\"\n}}\n{}",
                &t[..start],
                &t[end..]
            )
        });
        let planned = plan(
            &p,
            StageKind::Prebuild,
            &example_inputs(&p, StageKind::Prebuild),
        )
        .unwrap();
        let j = spec_json(&planned);
        let s = j["linux"]["seccomp"].to_string();
        assert!(
            s.contains("SCMP_ARCH_X86\"") && s.contains("SCMP_ARCH_X32"),
            "{s}"
        );
        assert!(s.contains("SCMP_ACT_KILL_THREAD"), "{s}");
        assert_eq!(j["linux"]["seccomp"]["defaultErrnoRet"], 1);
    }
}
