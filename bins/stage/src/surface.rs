//! Planning the agent surface (seed 002): the policy's `surface` stage and one run's facts
//! become the OCI `config.json` of a rootless container, the environment it gets and the
//! settings the surface enforces. Pure: no filesystem, no kernel.
//!
//! The surface is not a candidate stage in a per-run lease. Its invoker is an unprivileged
//! service user, so the container runs behind a user namespace that maps only that user (as
//! the container's uid 0, with every capability set empty and `no_new_privileges`: runc 1.1
//! needs a mapped container root, and a process with no capabilities in a namespace it does not
//! own is the service user and nothing more). The root is an empty directory of the run's own,
//! read-only; inside it exist only `/proc`, a minimal `/dev`, a private `/tmp` tmpfs, the
//! policy's named read set (each a plain — not recursive — read-only bind, so nothing mounted
//! beneath a named path on the host crosses) and the workspace, read-write, as the working
//! directory. A read of anything else fails because the path does not exist there. A command's
//! run gets disposable home and temp of its own, and the workspace directories that hold the
//! agent's are covered ([`agent_dirs`]): a mount point can be neither renamed nor removed, so a
//! command can neither read nor move nor replace what the agent keeps there.
//!
//! Every field of the stage is destructured: a value is planned, carried into
//! [`SurfaceSettings`], or refused with a named [`PlanError`]. Cgroup limits (`cpus`, `cpuset`,
//! `memory`, `pids`) of a service user are its rootless runtime's to set, in a cgroup of the run
//! below the cgroup v2 subtree the host delegates to it; where none is delegated (cgroup v1
//! never does) they are refused, never applied as a no-op. Under `user "per-run"` root holds
//! them ([`limits_of`]): the account's process tree runs in a cgroup root prepared. `network "egress"` is the same private namespace as `none` (loopback only) with
//! every client pointed at the host's proxy on that loopback ([`EGRESS_PORT`], [`PROXY_ENV`]);
//! the proxy and its allow-list are cordon-surface's. A run's selected skills are bound
//! read-only at the policy's `skills` path from their run-scoped copies.
//!
//! It does not create the root, the workspace's home and temp directories, or run anything
//! (`cordon-surface` does).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use cordon_policy_lang::{
    Egress, MountMode, MountSource, Network, Output, Policy, RootMode, Stage, StageKind, Surface,
    Sys, Tmp, User,
};
use oci_spec::runtime::{
    LinuxBuilder, LinuxCpuBuilder, LinuxIdMappingBuilder, LinuxNamespaceType, Spec,
};

use crate::bundle::{PlanError, invalid};
use crate::oci::{self, MASKED_PATHS, MASKED_WITHOUT_GPU, mount};

/// Which run of an agent this is (the evidence crate's, as its receipt records it).
pub use cordon::inputs::Tier;

/// What only the run knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurfaceInputs {
    /// The exact argv.
    pub argv: Vec<String>,
    /// Which tier.
    pub tier: Tier,
    /// The service user's uid, mapped to the container's uid 0.
    pub uid: u32,
    /// The service user's gid, mapped to the container's gid 0.
    pub gid: u32,
    /// The run's empty root directory.
    pub root: PathBuf,
    /// The workspace, canonical.
    pub workspace: PathBuf,
    /// The invoker's environment: only what the policy names is read from it.
    pub invoker_env: BTreeMap<OsString, OsString>,
    /// The run id (a label on the container).
    pub run: String,
    /// The authority identity (a label on the container).
    pub authority: String,
    /// The run's skill snapshot: each selected skill's name and its run-scoped copy on the
    /// host, bound read-only at the policy's `skills` path.
    pub skills: Vec<(String, PathBuf)>,
    /// The cgroup v2 subtree delegated to the service user ([`cordon::run_cgroup::delegated`]),
    /// where its runtime sets the policy's limits; or why there is none (then a service policy
    /// with limits is refused). Not looked at under `user "per-run"`, whose limits are root's.
    pub delegated: Result<String, String>,
}

/// What the surface enforces beyond the bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurfaceSettings {
    /// The whole run's deadline, ms.
    pub deadline_ms: u64,
    /// Output caps.
    pub output: Output,
    /// Where the workspace is inside.
    pub workspace_dest: String,
    /// Home, relative to the workspace (made before the run).
    pub home: String,
    /// The temporary directory, relative to the workspace (made before the run).
    pub temp: String,
    /// Under `network "egress"`: what the host's proxy admits.
    pub egress: Option<Egress>,
    /// A service user's run with limits: its cgroup below the delegated subtree, and the
    /// limits the surface checks the kernel holds there once the container exists.
    pub cgroup: Option<(String, cordon::run_cgroup::Limits)>,
}

/// The loopback port inside a sandbox with egress where the proxy answers (`HTTPS_PROXY`).
pub const EGRESS_PORT: u16 = 3128;

/// The variables that name the proxy under egress: the surface's own, never the invoker's.
pub const PROXY_ENV: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// A planned surface run.
#[derive(Debug, Clone, PartialEq)]
pub struct SurfacePlan {
    /// The OCI `config.json`.
    pub spec: Spec,
    /// The names of the variables set inside, never their values (for the receipt).
    pub env_names: Vec<String>,
    /// The host path of the start gate the surface makes in the run directory, when the
    /// runtime needs one ([`crate::bundle::Entry`]).
    pub gate: Option<PathBuf>,
    /// What the surface enforces.
    pub settings: SurfaceSettings,
}

/// The stage and its surface block of `policy`.
///
/// # Errors
/// The policy declares no surface stage.
pub fn surface_of(policy: &Policy) -> Result<(&Stage, &Surface), PlanError> {
    let kind = StageKind::Surface;
    let stage = policy.stage(kind).ok_or(PlanError::NoStage { kind })?;
    let surface = stage
        .surface
        .as_ref()
        .ok_or_else(|| invalid("a surface stage without its surface block"))?;
    Ok((stage, surface))
}

/// The workspace's destination inside, from the stage's one `workspace` mount.
///
/// # Errors
/// The stage has no workspace mount, or it is not read-write.
pub fn workspace_dest(stage: &Stage) -> Result<&str, PlanError> {
    let mut found = stage
        .mount
        .iter()
        .filter(|(_, m)| m.source == MountSource::Workspace);
    match (found.next(), found.next()) {
        (Some((dest, m)), None) if m.mode == MountMode::Rw => Ok(dest),
        _ => Err(invalid(
            "the surface needs exactly one read-write workspace mount",
        )),
    }
}

/// Whether `prefix` (a temporary directory, as a tool would see it) fits `max` bytes; the
/// error names it.
///
/// # Errors
/// [`PlanError::TempPrefix`].
pub fn check_temp_prefix(prefix: &Path, max: u64) -> Result<(), PlanError> {
    let bytes = prefix.as_os_str().len();
    if u64::try_from(bytes).map_or(true, |b| b > max) {
        return Err(PlanError::TempPrefix {
            prefix: prefix.display().to_string(),
            bytes,
            max,
        });
    }
    Ok(())
}

/// The environment of one run: the stage's fixed values, then `pass-env` (and, for the agent,
/// `agent-env`) as far as the invoker has them, then home and temp inside the workspace.
/// Nothing else of the invoker's environment crosses; `deny-env` names are disjoint from every
/// source (the language checks it) and are checked again here.
///
/// # Errors
/// An allowed variable's value is not UTF-8, or a denied one would be set.
pub fn environment(
    stage_env: &BTreeMap<String, String>,
    surface: &Surface,
    tier: Tier,
    invoker: &BTreeMap<OsString, OsString>,
    dest: &str,
) -> Result<BTreeMap<String, String>, PlanError> {
    let mut env = stage_env.clone();
    // The provider tier crosses into the agent's own run, never into a command's.
    let agent = surface.agent_env.iter().filter(|_| tier == Tier::Agent);
    for name in surface.pass_env.iter().chain(agent) {
        if let Some(v) = invoker.get(&OsString::from(name)) {
            let v = v
                .to_str()
                .ok_or_else(|| invalid(format!("the value of {name} is not UTF-8")))?;
            env.insert(name.clone(), v.to_owned());
        }
    }
    let home = format!("{dest}/{}", surface.home);
    let temp = format!("{dest}/{}", surface.temp);
    for (k, v) in [
        ("HOME", home.clone()),
        ("XDG_CONFIG_HOME", format!("{home}/.config")),
        ("XDG_CACHE_HOME", format!("{home}/.cache")),
        ("XDG_DATA_HOME", format!("{home}/.local/share")),
        ("XDG_STATE_HOME", format!("{home}/.local/state")),
    ] {
        env.insert(k.to_owned(), v);
    }
    for k in ["TMPDIR", "TMP", "TEMP"]
        .into_iter()
        .chain(surface.temp_env.iter().map(String::as_str))
    {
        env.insert(k.to_owned(), temp.clone());
    }
    // Under egress every client is pointed at the proxy, and nothing else may say otherwise:
    // a policy that could carry a proxy variable (or NO_PROXY, a way around it) from any source
    // is refused whether or not this invoker happens to have it set.
    if surface.egress.is_some() {
        let sources = stage_env
            .keys()
            .chain(&surface.pass_env)
            .chain(&surface.agent_env);
        for k in sources {
            if PROXY_ENV.contains(&k.as_str()) || k.eq_ignore_ascii_case("NO_PROXY") {
                return Err(invalid(format!(
                    "{k} is the surface's own under egress and may not come from the policy or the invoker"
                )));
            }
        }
        let proxy = format!("http://127.0.0.1:{EGRESS_PORT}");
        for k in PROXY_ENV {
            env.insert(k.to_owned(), proxy.clone());
        }
    }
    if let Some(denied) = surface.deny_env.iter().find(|n| env.contains_key(*n)) {
        return Err(invalid(format!("denied variable {denied} would cross")));
    }
    Ok(env)
}

/// The state directory a non-root process of the surface (cordon-surface, cordon-reap) works
/// in: the policy's, for its service user; under `user "per-run"`, the per-run account's own,
/// which root names with `--per-run-state` — accepted only for a uid of the policy's account
/// range and only in the policy's `per-run/` directory (its owner and mode are checked after).
///
/// # Errors
/// The wrong mode for this policy, or a directory no per-run account of it has: what to do.
pub fn state_dir_for(policy: &Policy, given: Option<&Path>, uid: u32) -> Result<PathBuf, String> {
    let (stage, block) = surface_of(policy).map_err(|e| e.to_string())?;
    match (stage.user, given) {
        (User::Service, None) => Ok(PathBuf::from(&block.state_dir)),
        (User::Service, Some(_)) => Err(
            "--per-run-state is root's, for a policy of user \"per-run\"; this one runs as its service user".into(),
        ),
        (User::PerRun, None) => Err(
            "this policy's surface runs each run in a per-run account (user \"per-run\"): run it as root".into(),
        ),
        (User::PerRun, Some(dir)) => {
            let range = policy.accounts().uid_range;
            let parent = Path::new(&block.state_dir).join(cordon::lease::per_run::PER_RUN);
            if (range.first..=range.last).contains(&uid) && dir.parent() == Some(parent.as_path()) {
                Ok(dir.to_path_buf())
            } else {
                Err(format!(
                    "--per-run-state {} is not a per-run account's state directory for uid {uid}",
                    dir.display()
                ))
            }
        }
    }
}

/// Placeholder run inputs for `explain --bundle`: a command run of service user 1000 in
/// `/WORKSPACE`, with nothing from the invoker's environment.
#[must_use]
pub fn example_inputs(policy: &Policy) -> SurfaceInputs {
    let state = surface_of(policy).map_or("/STATE", |(_, s)| s.state_dir.as_str());
    SurfaceInputs {
        argv: vec!["ARGV".into()],
        tier: Tier::Command,
        uid: 1000,
        gid: 1000,
        root: Path::new(state).join("runs/RUN/root"),
        workspace: PathBuf::from("/WORKSPACE"),
        invoker_env: BTreeMap::new(),
        run: "RUN".into(),
        authority: "AUTHORITY".into(),
        skills: Vec::new(),
        delegated: Err("not examined: explain plans without the host".into()),
    }
}

/// The user namespace's one mapping: the container's id 0 is host id `host`, and nothing else
/// is mapped.
fn id_map(host: u32) -> Result<oci_spec::runtime::LinuxIdMapping, PlanError> {
    LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(host)
        .size(1u32)
        .build()
        .map_err(invalid)
}

/// A control this host cannot apply for the surface (exit 3).
fn unenforceable(what: &str) -> PlanError {
    PlanError::Unenforceable {
        kind: StageKind::Surface,
        what: what.to_owned(),
        mode: "a service user's rootless runtime",
    }
}

/// The cgroup limits of a per-run run: root places the account's whole process tree in a
/// cgroup of its own with them before it runs anything ([`cordon::run_cgroup`]), so the
/// account's rootless runtime, which cannot set them, need not.
#[must_use]
pub fn limits_of(stage: &Stage) -> cordon::run_cgroup::Limits {
    cordon::run_cgroup::Limits {
        cpus_milli: stage.cpus_milli,
        cpuset: stage.cpuset.clone(),
        memory_bytes: stage.memory_bytes,
        pids: stage.pids,
    }
}

/// What a rootless runtime cannot apply, refused: devices and capabilities.
fn rootless_refusals(stage: &Stage) -> Result<(), PlanError> {
    if !stage.gpu_device.is_empty() {
        return Err(unenforceable("GPU devices"));
    }
    // A capability in the user namespace would be root's power over everything the namespace
    // owns (its mounts, its network): the surface grants none.
    if !stage.capability.is_empty() {
        return Err(unenforceable("capabilities"));
    }
    Ok(())
}

/// The cgroup of a service user's run and its resources: the run's own below the delegated
/// subtree, where the rootless runtime writes the limits; `None` without limits, and under
/// `user "per-run"` (root holds them, [`limits_of`]).
///
/// # Errors
/// A service policy sets limits and no subtree is delegated: unenforceable, with the reason.
fn limits_cgroup(
    stage: &Stage,
    run: &SurfaceInputs,
) -> Result<Option<(String, oci_spec::runtime::LinuxResources)>, PlanError> {
    let limits = limits_of(stage);
    if limits.is_empty() || stage.user == User::PerRun {
        return Ok(None);
    }
    match &run.delegated {
        Ok(parent) => {
            let resources = oci::limit_resources(&limits, LinuxCpuBuilder::default())?
                .build()
                .map_err(invalid)?;
            Ok(Some((format!("{parent}/cordon-{}", run.run), resources)))
        }
        Err(why) => Err(unenforceable(&format!(
            "cgroup limits (cpus, cpuset, memory, pids) without a cgroup v2 subtree delegated to the service user ({why})"
        ))),
    }
}

/// The container's mount table: the base, a private `/tmp`, `/dev/shm`, the read set, the
/// workspace, and for a command its own home and temp.
fn mounts(
    stage: &Stage,
    surface: &Surface,
    run: &SurfaceInputs,
    dest: &str,
) -> Result<Vec<oci_spec::runtime::Mount>, PlanError> {
    let Tmp { size_bytes, exec } = &stage.tmp;
    let tmp_size = format!("size={size_bytes}");
    let mut tmp_opts = vec!["nosuid", "nodev", "mode=1777", tmp_size.as_str()];
    if !exec {
        tmp_opts.push("noexec");
    }
    let mut mounts = oci::base_mounts()?;
    // A tmpfs the runtime mounts inside the container's own mount namespace: writes to /tmp
    // never reach the host, and it is gone with the container.
    mounts.push(mount("/tmp", "tmpfs", "tmpfs", &tmp_opts)?);
    mounts.extend(oci::shm(stage.ipc, stage.shm_bytes)?);
    match stage.sys {
        Sys::None => {}
        Sys::ReadOnly => return Err(unenforceable("/sys")),
    }
    // The read set: plain binds (not recursive), read-only, no setuid, no devices.
    for path in surface.read.keys() {
        mounts.push(mount(
            path,
            "bind",
            path,
            &["bind", "ro", "rprivate", "nosuid", "nodev"],
        )?);
    }
    let ws = run
        .workspace
        .to_str()
        .ok_or_else(|| invalid("the workspace path is not UTF-8"))?;
    // The run's skill snapshot: run-scoped copies outside the workspace, read-only.
    if !run.skills.is_empty() {
        let at = surface
            .skills
            .as_ref()
            .ok_or_else(|| invalid("skills were selected but the policy names no skills path"))?;
        for (name, copy) in &run.skills {
            let src = copy
                .to_str()
                .ok_or_else(|| invalid("a skill snapshot path is not UTF-8"))?;
            mounts.push(mount(
                &format!("{at}/{name}"),
                "bind",
                src,
                &["bind", "ro", "rprivate", "nosuid", "nodev"],
            )?);
        }
    }
    // The one writable host path. Not recursive: a mount beneath the workspace on the host does
    // not cross.
    mounts.push(mount(
        dest,
        "bind",
        ws,
        &["bind", "rw", "rprivate", "nosuid", "nodev"],
    )?);
    // A command gets home and temp of its own, disposable: it can neither plant configuration
    // the agent (which holds the provider variables) would run, nor reach the agent's sockets.
    // The workspace directory that holds them is covered first: a mount point can be neither
    // renamed nor removed, so the command cannot move the agent's directories aside and leave
    // directories of its own at their paths (its covers would move with them).
    match run.tier {
        Tier::Agent => {}
        Tier::Command => {
            let covers = agent_dirs(surface)
                .into_iter()
                .filter(|rel| !rel.contains('/') || *rel == surface.home || *rel == surface.temp);
            for rel in covers {
                mounts.push(mount(
                    &format!("{dest}/{rel}"),
                    "tmpfs",
                    "tmpfs",
                    &tmp_opts,
                )?);
            }
        }
    }
    Ok(mounts)
}

/// The agent's directories relative to the workspace, parents first: every leading path of
/// home and of temp (`.cph`, `.cph/agent-runtime`, `.cph/t`). Each is made and proven by the
/// surface before a run, and covered in a command's run.
#[must_use]
pub fn agent_dirs(surface: &Surface) -> Vec<String> {
    let mut dirs = std::collections::BTreeSet::new();
    for rel in [&surface.home, &surface.temp] {
        let mut at = String::new();
        for part in rel.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            dirs.insert(at.clone());
        }
    }
    // Sorted by depth, so each directory comes after its parent.
    let mut dirs: Vec<String> = dirs.into_iter().collect();
    dirs.sort_by_key(|d| d.matches('/').count());
    dirs
}

/// Plan one surface run of `policy`.
///
/// # Errors
/// The stage is missing, asks for what this mode cannot enforce or this build does not
/// implement, a temporary prefix is too long, or a value has no OCI form.
#[allow(clippy::too_many_lines)]
pub fn plan(policy: &Policy, run: &SurfaceInputs) -> Result<SurfacePlan, PlanError> {
    let kind = StageKind::Surface;
    let (stage, surface) = surface_of(policy)?;
    // Every field, by name (those read through `stage` by the helpers above as `_`): a field
    // added to the language does not compile here until it is planned or refused.
    let Stage {
        image,
        network,
        root,
        ipc: _,
        capability: _,
        no_new_privileges,
        seccomp: seccomp_name,
        user,
        cpus_milli: _,
        cpuset: _,
        memory_bytes: _,
        pids: _,
        nofile,
        core_bytes,
        shm_bytes: _,
        tmp: _,
        staging,
        child,
        cache,
        overlay,
        deadline_ms,
        phase_deadline_ms,
        gpu_device: _,
        env,
        mount: binds,
        output,
        publication,
        frame,
        surface: _,
        sys: _,
    } = stage;
    // Either way the container maps exactly the invoking uid: the service user's, or the
    // per-run account's whose surface root started (cordon-surface's per-run module).
    match user {
        User::Service | User::PerRun => {}
    }
    match root {
        RootMode::Empty => {}
        RootMode::ReadOnly | RootMode::Overlay => {
            return Err(invalid("the surface's root is empty"));
        }
    }
    if image.is_some()
        || staging.is_some()
        || child.is_some()
        || cache.is_some()
        || overlay.is_some()
        || publication.is_some()
    {
        return Err(invalid(
            "the surface has no image, staging, bounded child, cache, overlay or publication",
        ));
    }
    if frame.is_some() || !phase_deadline_ms.is_empty() {
        return Err(PlanError::Unimplemented {
            kind,
            what: "framing or phase deadlines in the surface",
        });
    }
    rootless_refusals(stage)?;
    if !no_new_privileges {
        return Err(invalid("no_new_privileges cannot be off"));
    }
    // Every field of the surface block, by name, as for the stage.
    let Surface {
        read: _,
        write: _,
        deny_env: _,
        deny_file: _,
        tmpdir_prefix_max: _,
        pass_env: _,
        agent_env: _,
        home: _,
        temp: _,
        temp_env: _,
        state_dir: _,
        skills: _,
        egress,
    } = surface;
    // Egress is the same private namespace (loopback only): the host's proxy listens on its
    // loopback, and the sandbox reaches nothing else.
    match (network, egress) {
        (Network::None, None) | (Network::Egress, Some(_)) => {}
        (Network::None, Some(_)) | (Network::Egress, None) => {
            return Err(invalid(
                "an egress allow-list goes with network \"egress\" only",
            ));
        }
    }
    let profile = oci::seccomp_profile(policy, kind, seccomp_name)?;
    let dest = workspace_dest(stage)?.to_owned();
    if binds.len() != 1 {
        return Err(invalid("the surface mounts its workspace and nothing else"));
    }

    // The temp prefix, as a tool inside sees it and as the host sees it (a host-side bridge
    // that binds sockets into the workspace).
    let max = surface.tmpdir_prefix_max;
    check_temp_prefix(&Path::new(&dest).join(&surface.temp), max)?;
    check_temp_prefix(&run.workspace.join(&surface.temp), max)?;

    let env = environment(env, surface, run.tier, &run.invoker_env, &dest)?;
    let env_names: Vec<String> = env.keys().cloned().collect();
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();

    // A runtime whose init is checked only once it has exec'd the entrypoint (crun's, until
    // then non-dumpable, has namespaces and a root the service user cannot read): the command
    // waits at a start gate beside the run's root, in its run directory.
    let gate = if crate::start::runtime_kind(policy).settles_at_exec() {
        let dir = run
            .root
            .parent()
            .ok_or_else(|| invalid("the run's root has no run directory"))?;
        Some(
            dir.join(crate::bundle::GATE_DIR)
                .join(crate::bundle::GATE_FIFO),
        )
    } else {
        None
    };
    let argv = match &gate {
        Some(_) => crate::bundle::gated_argv(&run.argv, crate::bundle::Entry::of(kind), &env)?,
        None => run.argv.clone(),
    };

    // The container's root is the service user (the only id mapped), with no capability.
    let process = oci::process(oci::ProcessPlan {
        uid: 0,
        gid: 0,
        argv: &argv,
        env,
        cwd: &dest,
        capabilities: HashSet::new(),
        nofile: *nofile,
        core_bytes: *core_bytes,
        no_new_privileges: true,
    })?;

    let mut mounts = mounts(stage, surface, run, &dest)?;
    if let Some(gate) = &gate {
        mounts.push(crate::bundle::gate_mount(gate)?);
    }

    let namespaces = oci::namespaces([
        LinuxNamespaceType::User,
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
        LinuxNamespaceType::Network,
    ])?;
    // Denied files: the runtime binds /dev/null over a file and an empty read-only tmpfs over a
    // directory, wherever the read set would have exposed it.
    let masked: Vec<String> = MASKED_PATHS
        .iter()
        .chain(MASKED_WITHOUT_GPU.iter())
        .map(|s| (*s).to_owned())
        .chain(surface.deny_file.iter().cloned())
        .collect();
    let mut linux = LinuxBuilder::default()
        .uid_mappings(vec![id_map(run.uid)?])
        .gid_mappings(vec![id_map(run.gid)?])
        .namespaces(namespaces)
        .masked_paths(masked)
        .readonly_paths(oci::readonly_paths())
        .seccomp(oci::seccomp(profile)?)
        .rootfs_propagation("private")
        .build()
        .map_err(invalid)?;
    // Cgroup settings only where the service user's runtime can apply them: in its own cgroup
    // below the delegated subtree. The only device nodes are the runtime's default
    // pseudo-devices, bound from the host.
    let cgroup = limits_cgroup(stage, run)?;
    linux.set_resources(cgroup.as_ref().map(|(_, r)| r.clone()));
    linux.set_cgroups_path(cgroup.as_ref().map(|(p, _)| PathBuf::from(p)));
    let annotations: HashMap<String, String> = [
        (cordon::lease::LABEL_LEASE.to_owned(), run.run.clone()),
        (
            cordon::lease::LABEL_AUTHORITY.to_owned(),
            run.authority.clone(),
        ),
    ]
    .into_iter()
    .collect();
    let spec = oci::spec(&run.root, true, process, mounts, linux, annotations)?;
    Ok(SurfacePlan {
        spec,
        env_names,
        gate,
        settings: SurfaceSettings {
            deadline_ms: *deadline_ms,
            output: output.clone(),
            workspace_dest: dest,
            home: surface.home.clone(),
            temp: surface.temp.clone(),
            egress: egress.clone(),
            cgroup: cgroup.map(|(path, _)| (path, limits_of(stage))),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(edit: &dyn Fn(String) -> String) -> Policy {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/examples/surface.kdl"
        );
        let text = edit(std::fs::read_to_string(path).unwrap());
        cordon_policy_lang::parse("surface.kdl", &text).unwrap()
    }

    fn inputs(tier: Tier) -> SurfaceInputs {
        let invoker = [
            ("TERM", "xterm"),
            ("ANTHROPIC_API_KEY", "sk-secret"),
            ("DATABASE_URL", "postgres://secret"),
            ("HOME", "/home/service"),
            ("LD_PRELOAD", "/tmp/evil.so"),
        ];
        SurfaceInputs {
            argv: vec!["/bin/sh".into()],
            tier,
            uid: 990,
            gid: 991,
            root: PathBuf::from("/run/cordon-surface/runs/R/root"),
            workspace: PathBuf::from("/srv/ws/o1/p1"),
            invoker_env: invoker
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect(),
            run: "R".into(),
            authority: "A".into(),
            skills: Vec::new(),
            delegated: Err("none here".into()),
        }
    }

    /// Under crun (whose init the service user can read only once it has exec'd the
    /// entrypoint) the command waits at a start gate in its run directory, bound read-only into
    /// its `/dev`; under runc the argv is the run's and there is no gate.
    #[test]
    fn under_crun_the_command_waits_at_a_start_gate_in_its_run_directory() {
        let runc = plan(&example(&|t| t), &inputs(Tier::Command)).unwrap();
        assert_eq!(runc.gate, None);
        let crun = example(&|t| {
            t.replace(
                r#"runtime "runc" path="/usr/sbin/runc" min-version="1.1.5""#,
                r#"runtime "crun" path="/usr/bin/crun""#,
            )
        });
        let p = plan(&crun, &inputs(Tier::Command)).unwrap();
        assert_eq!(
            p.gate.as_deref(),
            Some(Path::new("/run/cordon-surface/runs/R/gate/fifo"))
        );
        let spec = serde_json::to_value(&p.spec).unwrap();
        let argv = spec["process"]["args"].as_array().unwrap();
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert!(
            argv[2]
                .as_str()
                .unwrap()
                .starts_with("read -r cordon_gate < /dev/.cordon-gate")
        );
        assert_eq!(argv[3..], ["cordon-gate", "/bin/sh"]);
        let bound: Vec<_> = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["destination"] == crate::bundle::GATE)
            .collect();
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0]["source"], "/run/cordon-surface/runs/R/gate/fifo");
    }

    /// Limits: a service user's go to its runtime in the run's cgroup below the delegated
    /// subtree, refused with the reason where none is delegated; a per-run run's are root's.
    #[test]
    fn limits_are_the_runtimes_below_a_delegated_subtree_refused_without_one_and_roots_per_run() {
        let limited = |t: String| {
            t.replace(
                "    nofile 1024\n",
                "    nofile 1024\n    memory \"1GiB\"\n    pids 64\n    cpus \"1.5\"\n",
            )
        };
        let policy = example(&limited);
        let e = plan(&policy, &inputs(Tier::Command)).unwrap_err();
        assert!(e.to_string().contains("none here"), "{e}");
        let mut run = inputs(Tier::Command);
        run.delegated = Ok("/system.slice/hub.service".into());
        let p = plan(&policy, &run).unwrap();
        let spec = serde_json::to_value(&p.spec).unwrap();
        assert_eq!(
            spec["linux"]["cgroupsPath"],
            "/system.slice/hub.service/cordon-R"
        );
        let r = &spec["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 1 << 30);
        assert_eq!(r["memory"]["swap"], 1 << 30);
        assert_eq!(r["pids"]["limit"], 64);
        assert_eq!(r["cpu"]["quota"], 150_000);
        let (path, limits) = p.settings.cgroup.unwrap();
        assert_eq!(path, "/system.slice/hub.service/cordon-R");
        assert_eq!(limits.memory_bytes, Some(1 << 30));
        // Without limits: no cgroup at all, delegated or not.
        let p = plan(&example(&|t| t), &run).unwrap();
        let spec = serde_json::to_value(&p.spec).unwrap();
        assert!(spec["linux"].get("cgroupsPath").is_none() && p.settings.cgroup.is_none());
        // Per-run: root's, whatever the account's surface found.
        let per_run = example(&|t| limited(t).replace("user \"service\"", "user \"per-run\""));
        let p = plan(&per_run, &inputs(Tier::Command)).unwrap();
        let spec = serde_json::to_value(&p.spec).unwrap();
        assert!(spec["linux"].get("resources").is_none() && p.settings.cgroup.is_none());
    }

    #[test]
    fn the_example_plans_a_rootless_container_that_maps_only_the_service_user() {
        let p = plan(&example(&|t| t), &inputs(Tier::Command)).unwrap();
        let spec = serde_json::to_value(&p.spec).unwrap();
        let linux = &spec["linux"];
        let one = |host: u32| serde_json::json!([{"containerID": 0, "hostID": host, "size": 1}]);
        assert_eq!(linux["uidMappings"], one(990));
        assert_eq!(linux["gidMappings"], one(991));
        let kinds: Vec<&str> = linux["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        for ns in ["user", "pid", "mount", "network", "ipc", "uts", "cgroup"] {
            assert!(kinds.contains(&ns), "{ns} namespace");
        }
        // A new namespace, never a path to someone else's.
        assert!(
            linux["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n.get("path").is_none())
        );
        assert!(linux.get("resources").is_none() && linux.get("cgroupsPath").is_none());
        let process = &spec["process"];
        assert_eq!(process["noNewPrivileges"], true);
        for set in [
            "bounding",
            "effective",
            "permitted",
            "inheritable",
            "ambient",
        ] {
            assert_eq!(process["capabilities"][set], serde_json::json!([]), "{set}");
        }
        assert_eq!(process["cwd"], "/workspace");
        assert_eq!(spec["root"]["readonly"], true);
        let mounts = spec["mounts"].as_array().unwrap();
        let ws = mounts
            .iter()
            .find(|m| m["destination"] == "/workspace")
            .unwrap();
        assert_eq!(ws["source"], "/srv/ws/o1/p1");
        let opts: Vec<&str> = ws["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert!(opts.contains(&"rw") && opts.contains(&"bind") && !opts.contains(&"rbind"));
        // Every other bind is the read set, read-only, and nothing else of the host is bound.
        let binds: Vec<&serde_json::Value> = mounts
            .iter()
            .filter(|m| m["type"] == "bind" && m["destination"] != "/workspace")
            .collect();
        assert_eq!(binds.len(), 8);
        for b in binds {
            assert_eq!(b["source"], b["destination"]);
            let o = b["options"].to_string();
            assert!(o.contains("\"ro\"") && o.contains("nosuid") && !o.contains("rbind"));
        }
        assert!(
            linux["maskedPaths"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!("/etc/cph/credentials"))
        );
    }

    #[test]
    fn only_named_variables_cross_and_provider_variables_only_into_the_agent() {
        let policy = example(&|t| t);
        let command = plan(&policy, &inputs(Tier::Command)).unwrap();
        let agent = plan(&policy, &inputs(Tier::Agent)).unwrap();
        let env = |p: &SurfacePlan| p.spec.process().as_ref().unwrap().env().clone().unwrap();
        let command_env = env(&command);
        assert!(command_env.contains(&"TERM=xterm".to_owned()));
        assert!(command_env.contains(&"HOME=/workspace/.cph/agent-runtime".to_owned()));
        assert!(command_env.contains(&"TMPDIR=/workspace/.cph/t".to_owned()));
        assert!(command_env.contains(&"CLAUDE_CODE_TMPDIR=/workspace/.cph/t".to_owned()));
        for secret in ["sk-secret", "postgres://secret", "/home/service", "evil.so"] {
            assert!(!command_env.iter().any(|e| e.contains(secret)), "{secret}");
        }
        assert!(!command.env_names.contains(&"ANTHROPIC_API_KEY".to_owned()));
        let agent_env = env(&agent);
        assert!(agent_env.contains(&"ANTHROPIC_API_KEY=sk-secret".to_owned()));
        assert!(!agent_env.iter().any(|e| e.contains("postgres://secret")));
    }

    #[test]
    fn what_the_rootless_mode_cannot_enforce_or_this_build_cannot_plan_is_refused() {
        let edit = |from: &'static str, to: &'static str| {
            move |t: String| cordon_testkit::replace_once(&t, from, to)
        };
        let refused = |e: &dyn Fn(String) -> String| plan(&example(e), &inputs(Tier::Command));
        for limit in ["memory \"1GiB\"", "pids 64", "cpus 1", "cpuset \"0\""] {
            let to: &'static str = Box::leak(format!("nofile 1024\n    {limit}").into_boxed_str());
            assert!(
                matches!(
                    refused(&edit("nofile 1024", to)),
                    Err(PlanError::Unenforceable { .. })
                ),
                "{limit}"
            );
        }
        // Egress without its allow-list does not parse; with one it plans, every client
        // pointed at the proxy on the sandbox's loopback, and the proxy variables are the
        // surface's own.
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/examples/surface.kdl"
        ))
        .unwrap();
        let egress = cordon_testkit::replace_once(&text, "network \"none\"", "network \"egress\"");
        let codes = |text: &str| -> Vec<String> {
            let e = cordon_policy_lang::parse("s.kdl", text).unwrap_err();
            e.problems()
                .iter()
                .map(|p| p.short_code().to_owned())
                .collect()
        };
        assert_eq!(codes(&egress), ["missing-node"]);
        let egress = cordon_testkit::replace_once(
            &egress,
            "        state-dir",
            "        egress {\n            domain \"pypi.org\"\n            port 443\n        }\n        state-dir",
        );
        let planned = plan(&example(&|_| egress.clone()), &inputs(Tier::Command)).unwrap();
        let env = planned
            .spec
            .process()
            .as_ref()
            .unwrap()
            .env()
            .clone()
            .unwrap();
        assert!(env.contains(&"HTTPS_PROXY=http://127.0.0.1:3128".to_owned()));
        assert!(planned.settings.egress.is_some());
        let passing = cordon_testkit::replace_once(
            &egress,
            "pass-env \"TERM\"",
            "pass-env \"TERM\" \"HTTPS_PROXY\"",
        );
        assert!(matches!(
            plan(&example(&|_| passing.clone()), &inputs(Tier::Command)),
            Err(PlanError::Invalid { why }) if why.starts_with("HTTPS_PROXY is the surface's own")
        ));
        let none = cordon_testkit::replace_once(
            &text,
            "        state-dir",
            "        egress {\n            domain \"pypi.org\"\n            port 443\n        }\n        state-dir",
        );
        assert_eq!(codes(&none), ["not-allowed-in-stage"]);
        assert!(matches!(
            refused(&edit("tmpdir-prefix-max 56", "tmpdir-prefix-max 16")),
            Err(PlanError::TempPrefix { .. })
        ));
        // The host prefix counts too: /srv/ws/o1/p1/.cph/t is 20 bytes.
        let policy = example(&edit("tmpdir-prefix-max 56", "tmpdir-prefix-max 19"));
        let mut run = inputs(Tier::Command);
        assert!(matches!(
            plan(&policy, &run),
            Err(PlanError::TempPrefix { bytes: 20, .. })
        ));
        run.workspace = PathBuf::from("/w");
        plan(&policy, &run).unwrap();
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// A hostile invoker environment: the policy's names, denied names, the surface's own
        /// names and arbitrary ones, with arbitrary values. Only what the policy lets cross does,
        /// with the invoker's value; the surface's own names keep the surface's values.
        #[test]
        fn only_what_the_policy_names_crosses_whatever_the_invoker_holds(
            invoker in proptest::collection::btree_map(
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        "TERM", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "DATABASE_URL",
                        "FEISHU_APP_SECRET", "HOME", "TMPDIR", "PATH", "LD_PRELOAD",
                        "CLAUDE_CODE_TMPDIR", "XDG_CONFIG_HOME",
                    ]).prop_map(str::to_owned),
                    "[A-Z_]{1,12}",
                ],
                "[ -~]{0,16}",
                0..12,
            ),
            agent in proptest::bool::ANY,
        ) {
            let policy = example(&|t| t);
            let (stage, surface) = surface_of(&policy).unwrap();
            let tier = if agent { Tier::Agent } else { Tier::Command };
            let os: BTreeMap<OsString, OsString> = invoker
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect();
            let env = environment(&stage.env, surface, tier, &os, "/workspace").unwrap();
            for (k, v) in &env {
                let own = cordon_policy_lang::SURFACE_SET_ENV.contains(&k.as_str())
                    || surface.temp_env.contains(k);
                let passed = surface.pass_env.contains(k)
                    || (agent && surface.agent_env.contains(k));
                proptest::prop_assert!(
                    own || passed || stage.env.contains_key(k),
                    "{k} crossed"
                );
                proptest::prop_assert!(!surface.deny_env.contains(k));
                if passed {
                    proptest::prop_assert_eq!(Some(v), invoker.get(k));
                }
                if own {
                    proptest::prop_assert!(v.starts_with("/workspace/"), "{k}={v}");
                }
                if stage.env.contains_key(k) {
                    proptest::prop_assert_eq!(Some(v), stage.env.get(k));
                }
            }
        }
    }

    #[test]
    fn a_tool_can_bind_a_socket_name_of_the_budget_under_a_56_byte_prefix() {
        // sun_path holds 108 bytes with its NUL: a 56-byte prefix leaves 50 for "/" + a name.
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().display().to_string();
        let prefix = format!("{base}/{}", "p".repeat(56 - base.len() - 1));
        assert_eq!(prefix.len(), 56);
        std::fs::create_dir(&prefix).unwrap();
        check_temp_prefix(Path::new(&prefix), 56).unwrap();
        let fits = format!("{prefix}/{}", "s".repeat(50));
        std::os::unix::net::UnixListener::bind(&fits).unwrap();
        // One byte more than sun_path holds is refused by the kernel's interface.
        let over = format!("{prefix}/{}", "t".repeat(51));
        let e = std::os::unix::net::UnixListener::bind(&over).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        let long = format!("{prefix}x");
        assert!(matches!(
            check_temp_prefix(Path::new(&long), 56),
            Err(PlanError::TempPrefix { bytes: 57, .. })
        ));
    }
}
