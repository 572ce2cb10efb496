//! Bundle planning: a stage's settings and its inputs become the OCI `config.json` that the
//! runtime is given. Pure: no filesystem, no kernel — it is unit- and snapshot-tested, and
//! `cordon-policy explain --stage` prints its result.
//!
//! It owns every control that lives in the bundle: the exact argv and environment (nothing
//! inherited), the per-run uid/gid, `no_new_privileges`, empty capability sets unless the
//! policy lists some, rlimits, a read-only root, the mount table (proc; a minimal `/dev`; a
//! private `/tmp` tmpfs, noexec unless the stage allows exec; a sized `/dev/shm`; read-only
//! `rprivate nosuid nodev` binds for validator inputs and the one writable staging bind; `/sys`
//! only when asked for, and then read-only), masked and read-only paths, the namespaces (a new
//! empty network namespace for `network none`), resources, the seccomp profile in OCI form, and
//! the lease labels as annotations. It refuses mount sources that are not pairwise disjoint or
//! that would expose a protected path, before anything starts.
//!
//! It does not create the run directory, the account or the mounts (the lease does), nor run
//! anything (the runtime driver does).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use oci_spec::runtime::{
    Arch, Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder,
    LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator,
    LinuxSyscallBuilder, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, ProcessBuilder,
    RootBuilder, Spec, SpecBuilder, UserBuilder,
};

/// The annotation keys that carry a lease's exact labels.
pub const LABEL_EXECUTOR: &str = "org.cordon.executor";
/// The lease id label.
pub const LABEL_LEASE: &str = "org.cordon.lease";
/// The authority label.
pub const LABEL_AUTHORITY: &str = "org.cordon.authority";

/// Paths runc masks by default, plus the ones cordon adds (kernel memory, keys, timers).
pub const MASKED_PATHS: [&str; 12] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/interrupts",
];

/// Paths runc makes read-only by default, plus `/proc/sysrq-trigger`.
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Destinations the bundle itself mounts; a bind may not land on or under them.
const RESERVED: [&str; 5] = ["/proc", "/dev", "/sys", "/tmp", "/dev/shm"];

/// One seccomp rule in plain form (from the policy's effective profile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallRule {
    /// The system call.
    pub name: String,
    /// `allow`, `errno:N`, `kill-process`, `trap` or `log`.
    pub action: String,
    /// ANDed argument conditions: (index, op, value, mask).
    pub args: Vec<(u64, String, u64, Option<u64>)>,
}

/// A seccomp profile in plain form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seccomp {
    /// The default action, as in [`SyscallRule::action`].
    pub default_action: String,
    /// Architectures, e.g. `x86_64`.
    pub architectures: Vec<String>,
    /// The rules.
    pub rules: Vec<SyscallRule>,
}

/// A bind of a validator input (or the staging directory) into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Container path.
    pub destination: PathBuf,
    /// Writable (only the staging bind is).
    pub writable: bool,
}

/// Everything planning needs, in plain values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Exact argv.
    pub argv: Vec<String>,
    /// Exact environment.
    pub env: BTreeMap<String, String>,
    /// The per-run uid and gid.
    pub uid: u32,
    /// The per-run gid.
    pub gid: u32,
    /// The unpacked image root.
    pub rootfs: PathBuf,
    /// Whether the root is mounted read-only.
    pub readonly_root: bool,
    /// Capabilities the policy grants (`CAP_…`), usually none.
    pub capabilities: Vec<String>,
    /// `no_new_privileges`.
    pub no_new_privileges: bool,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_CORE in bytes.
    pub core_bytes: u64,
    /// `/tmp` size and whether it allows exec.
    pub tmp_bytes: u64,
    /// Whether `/tmp` allows exec.
    pub tmp_exec: bool,
    /// `/dev/shm` size.
    pub shm_bytes: u64,
    /// Binds, in order.
    pub binds: Vec<Bind>,
    /// Mount `/sys` read-only.
    pub sys: bool,
    /// A new empty network namespace (`network none`).
    pub network_none: bool,
    /// CPU quota in thousandths of a CPU.
    pub cpus_milli: Option<u64>,
    /// Or a cpuset.
    pub cpuset: Option<String>,
    /// Memory limit (memory+swap is set to the same).
    pub memory_bytes: u64,
    /// PID limit.
    pub pids: u64,
    /// The seccomp profile.
    pub seccomp: Seccomp,
    /// Lease labels.
    pub executor: String,
    /// The lease id.
    pub lease: String,
    /// The authority identity.
    pub authority: String,
    /// The cgroup path the runtime creates.
    pub cgroup_path: String,
    /// Paths no bind may expose: the store's private parts, the run directory's protected
    /// files, the runtime's state root, the controller's working directory.
    pub protected: Vec<PathBuf>,
    /// Bind sources under this prefix are allowed even though the store is protected (the
    /// published trees and publications themselves).
    pub mountable_store_roots: Vec<PathBuf>,
}

/// Why a bundle could not be planned.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum BundleError {
    /// Two mount sources overlap, or two destinations do.
    #[error("mounts are not pairwise disjoint: {a} and {b}")]
    #[diagnostic(code(cordon::bundle::overlap))]
    Overlap {
        /// One path.
        a: String,
        /// The other.
        b: String,
    },
    /// A mount would expose a protected path.
    #[error("mount source {source_path} would expose the protected path {protected}")]
    #[diagnostic(
        code(cordon::bundle::protected),
        help(
            "only published trees, publications and the lease's staging directory may be mounted"
        )
    )]
    Protected {
        /// The source.
        source_path: String,
        /// What it would expose.
        protected: String,
    },
    /// A value has no OCI form.
    #[error("cannot plan the bundle: {why}")]
    #[diagnostic(code(cordon::bundle::invalid))]
    Invalid {
        /// What is wrong.
        why: String,
    },
}

fn invalid(e: impl std::fmt::Display) -> BundleError {
    BundleError::Invalid { why: e.to_string() }
}

/// `a` is `b` or inside it.
fn within(a: &Path, b: &Path) -> bool {
    a.starts_with(b)
}

fn check_mounts(plan: &Plan) -> Result<(), BundleError> {
    for (i, x) in plan.binds.iter().enumerate() {
        if !x.source.is_absolute() || !x.destination.is_absolute() {
            return Err(invalid(format!("bind {:?} is not absolute", x.source)));
        }
        for y in &plan.binds[i + 1..] {
            if within(&x.source, &y.source) || within(&y.source, &x.source) {
                return Err(BundleError::Overlap {
                    a: x.source.display().to_string(),
                    b: y.source.display().to_string(),
                });
            }
            if within(&x.destination, &y.destination) || within(&y.destination, &x.destination) {
                return Err(BundleError::Overlap {
                    a: x.destination.display().to_string(),
                    b: y.destination.display().to_string(),
                });
            }
        }
        for r in RESERVED {
            let r = Path::new(r);
            if within(&x.destination, r) || within(r, &x.destination) {
                return Err(BundleError::Overlap {
                    a: x.destination.display().to_string(),
                    b: r.display().to_string(),
                });
            }
        }
        let allowed = plan
            .mountable_store_roots
            .iter()
            .any(|m| within(&x.source, m));
        for p in &plan.protected {
            // A source inside a protected path exposes it (unless it is a mountable store root);
            // a source above one exposes it always.
            if within(p, &x.source) || (within(&x.source, p) && !allowed) {
                return Err(BundleError::Protected {
                    source_path: x.source.display().to_string(),
                    protected: p.display().to_string(),
                });
            }
        }
    }
    Ok(())
}

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, BundleError> {
    MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
        .build()
        .map_err(invalid)
}

fn action(a: &str) -> Result<(LinuxSeccompAction, Option<u32>), BundleError> {
    Ok(match a {
        "allow" => (LinuxSeccompAction::ScmpActAllow, None),
        "kill-process" => (LinuxSeccompAction::ScmpActKillProcess, None),
        "trap" => (LinuxSeccompAction::ScmpActTrap, None),
        "log" => (LinuxSeccompAction::ScmpActLog, None),
        other => match other.strip_prefix("errno:").and_then(|n| n.parse().ok()) {
            Some(n) => (LinuxSeccompAction::ScmpActErrno, Some(n)),
            None => return Err(invalid(format!("seccomp action {other:?}"))),
        },
    })
}

fn seccomp(s: &Seccomp) -> Result<oci_spec::runtime::LinuxSeccomp, BundleError> {
    let (default, default_errno) = action(&s.default_action)?;
    let arches = s
        .architectures
        .iter()
        .map(|a| match a.as_str() {
            "x86_64" => Ok(Arch::ScmpArchX86_64),
            "aarch64" => Ok(Arch::ScmpArchAarch64),
            other => Err(invalid(format!("architecture {other:?}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Rules with the same action and no arguments share one entry, as Moby's profile does.
    let mut plain: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut syscalls = Vec::new();
    for r in &s.rules {
        if r.args.is_empty() {
            plain
                .entry(r.action.clone())
                .or_default()
                .push(r.name.clone());
            continue;
        }
        let (act, errno) = action(&r.action)?;
        let args = r
            .args
            .iter()
            .map(|(index, op, value, mask)| {
                let op = match op.as_str() {
                    "eq" => LinuxSeccompOperator::ScmpCmpEq,
                    "ne" => LinuxSeccompOperator::ScmpCmpNe,
                    "lt" => LinuxSeccompOperator::ScmpCmpLt,
                    "le" => LinuxSeccompOperator::ScmpCmpLe,
                    "gt" => LinuxSeccompOperator::ScmpCmpGt,
                    "ge" => LinuxSeccompOperator::ScmpCmpGe,
                    "masked-eq" => LinuxSeccompOperator::ScmpCmpMaskedEq,
                    other => return Err(invalid(format!("seccomp operator {other:?}"))),
                };
                // For masked-eq the OCI form is value = mask, valueTwo = the compared value.
                let (value, two) = match mask {
                    Some(m) => (*m, Some(*value)),
                    None => (*value, None),
                };
                let mut b = LinuxSeccompArgBuilder::default()
                    .index(usize::try_from(*index).map_err(invalid)?)
                    .value(value)
                    .op(op);
                if let Some(t) = two {
                    b = b.value_two(t);
                }
                b.build().map_err(invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut b = LinuxSyscallBuilder::default()
            .names(vec![r.name.clone()])
            .action(act)
            .args(args);
        if let Some(e) = errno {
            b = b.errno_ret(e);
        }
        syscalls.push(b.build().map_err(invalid)?);
    }
    for (a, names) in plain {
        let (act, errno) = action(&a)?;
        let mut b = LinuxSyscallBuilder::default().names(names).action(act);
        if let Some(e) = errno {
            b = b.errno_ret(e);
        }
        syscalls.insert(0, b.build().map_err(invalid)?);
    }
    let mut b = LinuxSeccompBuilder::default()
        .default_action(default)
        .architectures(arches)
        .syscalls(syscalls);
    if let Some(e) = default_errno {
        b = b.default_errno_ret(e);
    }
    b.build().map_err(invalid)
}

/// Plan the bundle's `config.json`.
///
/// # Errors
/// Overlapping or protected mounts, or a value with no OCI form.
pub fn plan(p: &Plan) -> Result<Spec, BundleError> {
    check_mounts(p)?;
    let caps: HashSet<Capability> = p
        .capabilities
        .iter()
        .map(|c| Capability::from_str(c).map_err(invalid))
        .collect::<Result<_, _>>()?;
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .inheritable(HashSet::new())
        .permitted(caps.clone())
        .ambient(HashSet::new())
        .build()
        .map_err(invalid)?;
    let rlimit = |typ, n: u64| {
        PosixRlimitBuilder::default()
            .typ(typ)
            .hard(n)
            .soft(n)
            .build()
            .map_err(invalid)
    };
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(p.uid)
                .gid(p.gid)
                .additional_gids(Vec::<u32>::new())
                .build()
                .map_err(invalid)?,
        )
        .args(p.argv.clone())
        .env(
            p.env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
        )
        .cwd("/")
        .capabilities(capabilities)
        .rlimits(vec![
            rlimit(PosixRlimitType::RlimitNofile, p.nofile)?,
            rlimit(PosixRlimitType::RlimitCore, p.core_bytes)?,
        ])
        .no_new_privileges(p.no_new_privileges)
        .build()
        .map_err(invalid)?;
    let tmp_size = format!("size={}", p.tmp_bytes);
    let shm_size = format!("size={}", p.shm_bytes);
    let mut tmp_opts = vec!["nosuid", "nodev", "mode=1777", tmp_size.as_str()];
    if !p.tmp_exec {
        tmp_opts.push("noexec");
    }
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "noexec", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", shm_size.as_str()],
        )?,
        mount("/tmp", "tmpfs", "tmpfs", &tmp_opts)?,
    ];
    if p.sys {
        mounts.push(mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?);
    }
    for b in &p.binds {
        let mode = if b.writable { "rw" } else { "ro" };
        mounts.push(
            MountBuilder::default()
                .destination(&b.destination)
                .typ("bind")
                .source(&b.source)
                .options(
                    ["rbind", mode, "rprivate", "nosuid", "nodev"]
                        .iter()
                        .map(|o| (*o).to_owned())
                        .collect::<Vec<_>>(),
                )
                .build()
                .map_err(invalid)?,
        );
    }
    let mut ns = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
    ];
    if p.network_none {
        ns.push(LinuxNamespaceType::Network);
    }
    let namespaces = ns
        .into_iter()
        .map(|t| {
            LinuxNamespaceBuilder::default()
                .typ(t)
                .build()
                .map_err(invalid)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let memory = i64::try_from(p.memory_bytes).map_err(invalid)?;
    let mut cpu = LinuxCpuBuilder::default();
    if let Some(m) = p.cpus_milli {
        cpu = cpu
            .period(100_000u64)
            .quota(i64::try_from(m * 100).map_err(invalid)?);
    }
    if let Some(set) = &p.cpuset {
        cpu = cpu.cpus(set.clone());
    }
    let resources = LinuxResourcesBuilder::default()
        .memory(
            LinuxMemoryBuilder::default()
                .limit(memory)
                .swap(memory)
                .build()
                .map_err(invalid)?,
        )
        .cpu(cpu.build().map_err(invalid)?)
        .pids(
            LinuxPidsBuilder::default()
                .limit(i64::try_from(p.pids).map_err(invalid)?)
                .build()
                .map_err(invalid)?,
        )
        .build()
        .map_err(invalid)?;
    let linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .masked_paths(
            MASKED_PATHS
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>(),
        )
        .readonly_paths(
            READONLY_PATHS
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>(),
        )
        .resources(resources)
        .seccomp(seccomp(&p.seccomp)?)
        .cgroups_path(PathBuf::from(&p.cgroup_path))
        .rootfs_propagation("private")
        .build()
        .map_err(invalid)?;
    let annotations: HashMap<String, String> = [
        (LABEL_EXECUTOR.to_owned(), p.executor.clone()),
        (LABEL_LEASE.to_owned(), p.lease.clone()),
        (LABEL_AUTHORITY.to_owned(), p.authority.clone()),
    ]
    .into_iter()
    .collect();
    SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(&p.rootfs)
                .readonly(p.readonly_root)
                .build()
                .map_err(invalid)?,
        )
        .hostname("cordon")
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .annotations(annotations)
        .build()
        .map_err(invalid)
}
