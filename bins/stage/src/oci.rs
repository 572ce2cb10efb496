//! The OCI runtime-spec pieces both planners build the same way — the bundle planner
//! ([`crate::bundle`]) for the per-run stages and the surface planner ([`crate::surface`]):
//! the masked and read-only paths, the process (exact argv and environment, ids, capability
//! sets, rlimits), the base mount table, `/dev/shm`, namespaces, the seccomp profile in OCI
//! form, and the spec around them. Pure, like its callers; what differs between the two
//! (ids, root, binds, resources, user namespace) stays with each planner.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use cordon_policy_lang::{
    Arch, ArgCondition, ArgOp, Ipc, Policy, SeccompAction, SeccompProfile, StageKind,
};
use oci_spec::runtime::{
    Arch as OciArch, Capability, Linux, LinuxCapabilitiesBuilder, LinuxNamespace,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscallBuilder, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, Process, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use crate::bundle::{PlanError, invalid};

/// Paths runc masks by default, plus the ones cordon adds: kernel memory, keys, timers, and
/// host facts a candidate has no use for (the boot command line, the kernel's configuration,
/// symbols and modules, other users' key quotas, the host's boot id). A path the kernel does
/// not have is skipped by the runtime.
pub const MASKED_PATHS: [&str; 18] = [
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
    "/proc/cmdline",
    "/proc/config.gz",
    "/proc/kallsyms",
    "/proc/key-users",
    "/proc/modules",
    "/proc/sys/kernel/random/boot_id",
];

/// Masked as well in the prebuild: host-wide activity counters no build needs, through which a
/// build would watch the host's other work (its load, CPU and I/O counters, pressure stalls).
/// The lane keeps them (an engine's libraries read `/proc/stat`); they are a documented channel
/// there.
pub const MASKED_IN_PREBUILD: [&str; 5] = [
    "/proc/loadavg",
    "/proc/stat",
    "/proc/pressure",
    "/proc/diskstats",
    "/proc/vmstat",
];

/// Masked as well in a stage granted no GPU: the driver's view of the host's devices.
pub const MASKED_WITHOUT_GPU: [&str; 1] = ["/proc/driver"];

/// Paths runc makes read-only by default, plus `/proc/sysrq-trigger`.
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// [`READONLY_PATHS`], owned.
/// The memory, CPU and pids resources of `limits`, each only where set: memory with swap
/// included (memory+swap equal to the limit), the CPU quota per 100 ms period and the CPU set,
/// the task count. A lane's CPU set and weight are its caller's to add to `cpu`.
pub(crate) fn limit_resources(
    limits: &cordon::run_cgroup::Limits,
    mut cpu: oci_spec::runtime::LinuxCpuBuilder,
) -> Result<oci_spec::runtime::LinuxResourcesBuilder, PlanError> {
    use oci_spec::runtime::{LinuxMemoryBuilder, LinuxPidsBuilder, LinuxResourcesBuilder};
    let mut r = LinuxResourcesBuilder::default();
    if let Some(bytes) = limits.memory_bytes {
        let m = i64::try_from(bytes).map_err(invalid)?;
        r = r.memory(
            LinuxMemoryBuilder::default()
                .limit(m)
                .swap(m)
                .build()
                .map_err(invalid)?,
        );
    }
    if let Some(milli) = limits.cpus_milli {
        cpu = cpu
            .period(100_000u64)
            .quota(i64::try_from(milli * 100).map_err(invalid)?);
    }
    if let Some(set) = &limits.cpuset {
        cpu = cpu.cpus(set.clone());
    }
    r = r.cpu(cpu.build().map_err(invalid)?);
    if let Some(n) = limits.pids {
        r = r.pids(
            LinuxPidsBuilder::default()
                .limit(i64::try_from(n).map_err(invalid)?)
                .build()
                .map_err(invalid)?,
        );
    }
    Ok(r)
}

pub(crate) fn readonly_paths() -> Vec<String> {
    READONLY_PATHS.iter().map(|s| (*s).to_owned()).collect()
}

/// What the container's one process is.
pub(crate) struct ProcessPlan<'a> {
    /// Its uid inside the container.
    pub uid: u32,
    /// Its gid inside the container (no supplementary groups).
    pub gid: u32,
    /// The exact argv.
    pub argv: &'a [String],
    /// The whole environment.
    pub env: Vec<String>,
    /// The working directory.
    pub cwd: &'a str,
    /// The capabilities it holds (bounding, effective and permitted; never inheritable or
    /// ambient).
    pub capabilities: HashSet<Capability>,
    /// `RLIMIT_NOFILE`.
    pub nofile: u64,
    /// `RLIMIT_CORE`, bytes.
    pub core_bytes: u64,
    /// `no_new_privileges`.
    pub no_new_privileges: bool,
}

/// The spec's process.
pub(crate) fn process(p: ProcessPlan<'_>) -> Result<Process, PlanError> {
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(p.capabilities.clone())
        .effective(p.capabilities.clone())
        .inheritable(HashSet::new())
        .permitted(p.capabilities)
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
    ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(p.uid)
                .gid(p.gid)
                .additional_gids(Vec::<u32>::new())
                .build()
                .map_err(invalid)?,
        )
        .args(p.argv.to_vec())
        .env(p.env)
        .cwd(p.cwd)
        .capabilities(capabilities)
        .rlimits(vec![
            rlimit(PosixRlimitType::RlimitNofile, p.nofile)?,
            rlimit(PosixRlimitType::RlimitCore, p.core_bytes)?,
            // No real-time class and no raised priority without a capability, whatever the
            // supervisor's own limits are (runc leaves an unplanned limit as it inherits it):
            // the seccomp allow-list admits the scheduling calls on this ground.
            rlimit(PosixRlimitType::RlimitRtprio, 0)?,
            rlimit(PosixRlimitType::RlimitNice, 0)?,
        ])
        .no_new_privileges(p.no_new_privileges)
        .build()
        .map_err(invalid)
}

/// The mounts every container starts with: `proc` and a minimal `/dev`.
pub(crate) fn base_mounts() -> Result<Vec<Mount>, PlanError> {
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "noexec", "strictatime", "mode=755", "size=65536k"],
        )?,
    ])
}

/// `/dev/shm`: sized exactly when IPC is private. Both IPC settings are a new IPC namespace;
/// with `ipc "none"` (Docker's `--ipc=none`) there is no `/dev/shm` to share anything through.
pub(crate) fn shm(ipc: Ipc, shm_bytes: Option<u64>) -> Result<Option<Mount>, PlanError> {
    match (ipc, shm_bytes) {
        (Ipc::None, None) => Ok(None),
        (Ipc::Private, Some(bytes)) => {
            let shm_size = format!("size={bytes}");
            mount(
                "/dev/shm",
                "tmpfs",
                "shm",
                &["nosuid", "noexec", "nodev", "mode=1777", shm_size.as_str()],
            )
            .map(Some)
        }
        (Ipc::None, Some(_)) | (Ipc::Private, None) => {
            Err(invalid("shm is sized exactly when ipc is private"))
        }
    }
}

/// New namespaces of these types.
pub(crate) fn namespaces(
    types: impl IntoIterator<Item = LinuxNamespaceType>,
) -> Result<Vec<LinuxNamespace>, PlanError> {
    types
        .into_iter()
        .map(|t| {
            LinuxNamespaceBuilder::default()
                .typ(t)
                .build()
                .map_err(invalid)
        })
        .collect()
}

/// The spec: its root, hostname `cordon`, process, mounts, Linux section and annotations.
pub(crate) fn spec(
    root: &Path,
    readonly: bool,
    process: Process,
    mounts: Vec<Mount>,
    linux: Linux,
    annotations: HashMap<String, String>,
) -> Result<Spec, PlanError> {
    SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(root)
                .readonly(readonly)
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

/// The seccomp profile stage `kind` names; a missing one is an error, never a substituted
/// default.
pub(crate) fn seccomp_profile<'p>(
    policy: &'p Policy,
    kind: StageKind,
    name: &str,
) -> Result<&'p SeccompProfile, PlanError> {
    policy
        .seccomp_profile(name)
        .ok_or_else(|| PlanError::NoSeccomp {
            kind,
            name: name.to_owned(),
        })
}

/// A mount of the spec.
pub(crate) fn mount(
    dest: &str,
    typ: &str,
    source: &str,
    options: &[&str],
) -> Result<Mount, PlanError> {
    MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
        .build()
        .map_err(invalid)
}

fn action(a: SeccompAction) -> (LinuxSeccompAction, Option<u32>) {
    match a {
        SeccompAction::Allow => (LinuxSeccompAction::ScmpActAllow, None),
        SeccompAction::Errno(n) => (LinuxSeccompAction::ScmpActErrno, Some(n)),
        SeccompAction::KillProcess => (LinuxSeccompAction::ScmpActKillProcess, None),
        SeccompAction::KillThread => (LinuxSeccompAction::ScmpActKillThread, None),
        SeccompAction::Trap => (LinuxSeccompAction::ScmpActTrap, None),
        SeccompAction::Log => (LinuxSeccompAction::ScmpActLog, None),
    }
}

fn arch(a: Arch) -> OciArch {
    match a {
        Arch::X86_64 => OciArch::ScmpArchX86_64,
        Arch::X86 => OciArch::ScmpArchX86,
        Arch::X32 => OciArch::ScmpArchX32,
    }
}

/// The OCI alternatives one condition compiles to: any one of them admits the call.
///
/// Seccomp compares the whole 64-bit register and the kernel reads a 32-bit argument from its
/// low half, so every test on a 32-bit argument is masked to that half; the language refuses
/// the operators that cannot be (and so does this, should a hand-built policy carry one).
fn seccomp_alternatives(
    c: &ArgCondition,
) -> Result<Vec<oci_spec::runtime::LinuxSeccompArg>, PlanError> {
    use LinuxSeccompOperator as Op;
    let ArgCondition {
        index,
        bits,
        op,
        values,
        mask,
    } = c;
    let low_half = u64::from(u32::MAX);
    // (operator, value, valueTwo) per admitted alternative; for masked-eq the OCI form is
    // value = mask, valueTwo = the compared value.
    let tests: Vec<(Op, u64, Option<u64>)> = match (op, bits, mask) {
        (ArgOp::Eq | ArgOp::OneOf, 32, None) => values
            .iter()
            .map(|v| (Op::ScmpCmpMaskedEq, low_half, Some(*v)))
            .collect(),
        (ArgOp::Eq | ArgOp::OneOf, 64, None) => {
            values.iter().map(|v| (Op::ScmpCmpEq, *v, None)).collect()
        }
        (ArgOp::MaskedEq, 32 | 64, Some(m)) if *bits == 64 || *m <= low_half => values
            .iter()
            .map(|v| (Op::ScmpCmpMaskedEq, *m, Some(*v)))
            .collect(),
        (ArgOp::Ne | ArgOp::Lt | ArgOp::Le | ArgOp::Gt | ArgOp::Ge, 64, None) => {
            let o = ordering(*op).ok_or_else(|| invalid("not an ordering"))?;
            values.iter().map(|v| (o, *v, None)).collect()
        }
        _ => {
            return Err(invalid(format!(
                "argument condition {op:?} on a {bits}-bit argument (mask {mask:?}) has no sound \
                 seccomp form"
            )));
        }
    };
    if tests.is_empty() || (*op != ArgOp::OneOf && tests.len() != 1) {
        return Err(invalid(format!(
            "argument condition {op:?} with {} values",
            tests.len()
        )));
    }
    tests
        .into_iter()
        .map(|(o, value, two)| {
            let mut b = LinuxSeccompArgBuilder::default()
                .index(usize::try_from(*index).map_err(invalid)?)
                .value(value)
                .op(o);
            if let Some(t) = two {
                b = b.value_two(t);
            }
            b.build().map_err(invalid)
        })
        .collect()
}

/// The seccomp operator of a plain comparison; `None` for the ones compiled otherwise.
fn ordering(op: ArgOp) -> Option<LinuxSeccompOperator> {
    match op {
        ArgOp::Ne => Some(LinuxSeccompOperator::ScmpCmpNe),
        ArgOp::Lt => Some(LinuxSeccompOperator::ScmpCmpLt),
        ArgOp::Le => Some(LinuxSeccompOperator::ScmpCmpLe),
        ArgOp::Gt => Some(LinuxSeccompOperator::ScmpCmpGt),
        ArgOp::Ge => Some(LinuxSeccompOperator::ScmpCmpGe),
        ArgOp::Eq | ArgOp::MaskedEq | ArgOp::OneOf => None,
    }
}

/// Every combination of one alternative per condition: the OCI entries of one rule.
fn seccomp_entries(
    args: &[ArgCondition],
) -> Result<Vec<Vec<oci_spec::runtime::LinuxSeccompArg>>, PlanError> {
    let mut entries = vec![Vec::new()];
    for c in args {
        let alternatives = seccomp_alternatives(c)?;
        entries = entries
            .iter()
            .flat_map(|prefix| {
                alternatives.iter().map(move |a| {
                    let mut e = prefix.clone();
                    e.push(*a);
                    e
                })
            })
            .collect();
    }
    Ok(entries)
}

pub(crate) fn seccomp(p: &SeccompProfile) -> Result<oci_spec::runtime::LinuxSeccomp, PlanError> {
    let SeccompProfile {
        baseline: _,
        default_action,
        architectures,
        syscall,
    } = p;
    let (default, default_errno) = action(*default_action);
    // Rules with the same action and no arguments share one entry, as Moby's profile does.
    let mut plain: BTreeMap<SeccompAction, Vec<String>> = BTreeMap::new();
    let mut syscalls = Vec::new();
    for (name, r) in syscall {
        if r.args.is_empty() {
            plain.entry(r.action).or_default().push(name.clone());
            continue;
        }
        let (act, errno) = action(r.action);
        for args in seccomp_entries(&r.args)? {
            let mut b = LinuxSyscallBuilder::default()
                .names(vec![name.clone()])
                .action(act)
                .args(args);
            if let Some(e) = errno {
                b = b.errno_ret(e);
            }
            syscalls.push(b.build().map_err(invalid)?);
        }
    }
    for (a, names) in plain {
        let (act, errno) = action(a);
        let mut b = LinuxSyscallBuilder::default().names(names).action(act);
        if let Some(e) = errno {
            b = b.errno_ret(e);
        }
        syscalls.insert(0, b.build().map_err(invalid)?);
    }
    let mut b = LinuxSeccompBuilder::default()
        .default_action(default)
        .architectures(architectures.iter().map(|a| arch(*a)).collect::<Vec<_>>())
        .syscalls(syscalls);
    if let Some(e) = default_errno {
        b = b.default_errno_ret(e);
    }
    b.build().map_err(invalid)
}
