//! A cgroup root prepares for a process tree it starts but does not containerise itself: a
//! per-run account's surface (REQ-117), whose rootless runtime cannot set limits of its own.
//! Root makes `/cordon-surface/<name>` in each v1 hierarchy a limit needs, or once under v2,
//! with two children: [`SUPERVISOR`], where it places the account's surface before that runs
//! anything ([`RunCgroup::join`]), and [`SANDBOX`], which holds the limits and into which the
//! account's surface moves the sandbox's init before starting it ([`enter_sandbox`]). Root
//! reads the sandbox's accounting and removes it all ([`RunCgroup::remove`],
//! [`remove_leftover`] after a crash). Every file but the sandbox's `cgroup.procs` (under v2,
//! the run's too) stays root's: the account can neither raise a limit, nor make a cgroup, nor
//! move a process anywhere but into the sandbox (a move needs write access to the
//! destination's `cgroup.procs`, and under v2 to the common ancestor's), and the sandbox's
//! memory pressure and OOM kills stay in the sandbox.
//!
//! A service user's rootless runtime sets limits itself where the host delegates a cgroup v2
//! subtree to it ([`delegated`]: systemd's `Delegate=yes`); the surface then checks that the
//! container landed in its cgroup with the limits it asked for ([`check_placed`]).
//!
//! Every write goes through the host seam, so each write and each refusal is driven by the fake.

use std::io;
use std::path::{Path, PathBuf};

use crate::host::{Host, HostRef};
use crate::runtime::{CgroupProbe, cgroup_dirs, unified};

/// The cgroup filesystem.
pub const ROOT: &str = "/sys/fs/cgroup";

/// Where the surface's run cgroups live, below each hierarchy's root (the lanes' are `/cordon`).
pub const SURFACE_PARENT: &str = "/cordon-surface";

/// The limits of one run, as the policy's stage gives them; `None` is no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// The CPU quota, thousandths of a CPU per 100 ms period.
    pub cpus_milli: Option<u64>,
    /// The CPUs it may run on (a cpuset list).
    pub cpuset: Option<String>,
    /// Memory, swap included, bytes.
    pub memory_bytes: Option<u64>,
    /// Tasks.
    pub pids: Option<u64>,
}

impl Limits {
    /// Whether no limit is set (then no cgroup is made).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The controllers the limits need, as v2 names them (v1 mounts each as its own hierarchy).
    fn controllers(&self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if self.cpus_milli.is_some() {
            c.push("cpu");
        }
        if self.cpuset.is_some() {
            c.push("cpuset");
        }
        if self.memory_bytes.is_some() {
            c.push("memory");
        }
        if self.pids.is_some() {
            c.push("pids");
        }
        c
    }
}

/// A step of preparing, joining or removing a run cgroup failed: which, and why.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("the run's cgroup: {what}: {source}")]
#[diagnostic(code(cordon::cgroup))]
pub struct CgroupError {
    /// What was being done, with the path.
    pub what: String,
    /// Why it failed.
    #[source]
    pub source: io::Error,
}

fn failed(what: impl std::fmt::Display, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let what = format!("{what} {}", path.display());
    move |source| CgroupError { what, source }
}

/// The per-run cgroup's two children: the account's surface and runtime are placed in
/// [`SUPERVISOR`], which has no limit; the account's surface moves the sandbox's init into
/// [`SANDBOX`], which holds every limit, before it starts. So the sandbox's memory (its tmpfs
/// pages included), pids and CPU are bounded, and its OOM kills never reach the supervisor.
pub const SUPERVISOR: &str = "supervisor";

/// See [`SUPERVISOR`].
pub const SANDBOX: &str = "sandbox";

/// Run `name`'s cgroup, relative to a hierarchy's root.
fn run_path(name: &str) -> String {
    format!("{SURFACE_PARENT}/{name}")
}

/// A prepared run cgroup: its sandbox's probe (accounting, events) and the directories it
/// occupies.
#[derive(Debug)]
pub struct RunCgroup {
    /// The sandbox's accounting and events, read through the host seam.
    pub probe: CgroupProbe,
    /// Its directories, parents first: each hierarchy's run, supervisor and sandbox.
    dirs: Vec<PathBuf>,
    /// The v1 hierarchies used (empty under v2), to check `/proc/<pid>/cgroup`.
    hierarchies: Vec<&'static str>,
}

/// The sandbox cgroup's directories of run `name` with `limits`: one per limited v1
/// hierarchy, or one under v2.
fn sandbox_dirs(
    host: &dyn Host,
    root: &Path,
    name: &str,
    limits: &Limits,
) -> Result<(Vec<PathBuf>, Vec<&'static str>), CgroupError> {
    let rel = format!("{}/{SANDBOX}", run_path(name));
    let rel = rel.trim_start_matches('/');
    if unified(host, root).map_err(failed("read", &root.join("cgroup.controllers")))? {
        return Ok((vec![root.join(rel)], Vec::new()));
    }
    let controllers = limits.controllers();
    Ok((
        controllers.iter().map(|c| root.join(c).join(rel)).collect(),
        controllers,
    ))
}

/// Make the run cgroup `/cordon-surface/<name>` below `root` (`/sys/fs/cgroup`) with its
/// [`SUPERVISOR`] and its [`SANDBOX`], which holds `limits` and whose `cgroup.procs` (under v2
/// its parent's too, the moves' common ancestor) is given to `account` (uid, gid). A run cgroup
/// of that name that already exists is refused (another run's, or residue); what was made
/// before a failure is removed again.
///
/// # Errors
/// The hierarchy is not known, or a directory, limit or owner could not be made or written.
pub fn prepare(
    host: &HostRef,
    root: &Path,
    name: &str,
    limits: &Limits,
    account: (u32, u32),
) -> Result<RunCgroup, CgroupError> {
    let probe = CgroupProbe {
        host: host.clone(),
        root: root.to_path_buf(),
        path: format!("{}/{SANDBOX}", run_path(name)),
    };
    let unified = probe
        .unified()
        .map_err(failed("read", &root.join("cgroup.controllers")))?;
    let mut cg = RunCgroup {
        probe,
        dirs: Vec::new(),
        hierarchies: Vec::new(),
    };
    let made = if unified {
        cg.prepare_v2(&**host, root, name, limits, account)
    } else {
        cg.prepare_v1(&**host, root, name, limits, account)
    };
    match made {
        Ok(()) => Ok(cg),
        Err(e) => {
            // Nothing has joined it: an empty cgroup is removable, and what cannot be removed
            // is found again by reap by its name.
            let _ = cg.remove();
            Err(e)
        }
    }
}

fn write(host: &dyn Host, path: &Path, value: &str) -> Result<(), CgroupError> {
    host.write_control(path, value.as_bytes())
        .map_err(failed(format_args!("write {value:?} to"), path))
}

fn read_text(host: &dyn Host, path: &Path) -> Result<String, CgroupError> {
    let bytes = host.read(path).map_err(failed("read", path))?;
    Ok(String::from_utf8_lossy(&bytes).trim().to_owned())
}

fn give(host: &dyn Host, path: &Path, (uid, gid): (u32, u32)) -> Result<(), CgroupError> {
    host.give(path, uid, gid)
        .map_err(failed(format_args!("give to {uid}"), path))
}

/// Make `dir`'s parent if missing, then `dir` itself, fresh.
fn make_fresh(host: &dyn Host, dir: &Path) -> Result<(), CgroupError> {
    let parent = dir.parent().unwrap_or(dir);
    match host.make_dir(parent) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(failed("make", parent)(e)),
    }
    host.make_dir(dir).map_err(failed("make", dir))
}

impl RunCgroup {
    /// Make the run's directory in a hierarchy, then its supervisor and sandbox; the caller
    /// writes the sandbox's limits.
    fn make(&mut self, host: &dyn Host, run: &Path) -> Result<(PathBuf, PathBuf), CgroupError> {
        make_fresh(host, run)?;
        self.dirs.push(run.to_path_buf());
        let (sup, sb) = (run.join(SUPERVISOR), run.join(SANDBOX));
        for d in [&sup, &sb] {
            host.make_dir(d).map_err(failed("make", d))?;
            self.dirs.push(d.clone());
        }
        Ok((sup, sb))
    }

    fn prepare_v1(
        &mut self,
        host: &dyn Host,
        root: &Path,
        name: &str,
        limits: &Limits,
        account: (u32, u32),
    ) -> Result<(), CgroupError> {
        let rel = run_path(name);
        for controller in limits.controllers() {
            let hierarchy = root.join(controller);
            let run = hierarchy.join(rel.trim_start_matches('/'));
            let (sup, sb) = self.make(host, &run)?;
            self.hierarchies.push(controller);
            match controller {
                "memory" => {
                    let n = limits.memory_bytes.unwrap_or_default().to_string();
                    write(host, &sb.join("memory.limit_in_bytes"), &n)?;
                    // Swap included: without swap accounting the limit would bound RAM alone.
                    write(host, &sb.join("memory.memsw.limit_in_bytes"), &n)?;
                }
                "pids" => write(
                    host,
                    &sb.join("pids.max"),
                    &limits.pids.unwrap_or_default().to_string(),
                )?,
                "cpu" => {
                    write(host, &sb.join("cpu.cfs_period_us"), "100000")?;
                    let quota = limits.cpus_milli.unwrap_or_default() * 100;
                    write(host, &sb.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
                _ => {
                    // A v1 cpuset takes no task until it has CPUs and memory nodes, and takes
                    // only what its parent has: each level above the sandbox is given the
                    // hierarchy's whole set (the shared parent once), the sandbox its policy's.
                    let all = |file: &str| read_text(host, &hierarchy.join(file));
                    let parent = run.parent().unwrap_or(&run);
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        if read_text(host, &parent.join(file))?.is_empty() {
                            write(host, &parent.join(file), &all(file)?)?;
                        }
                        for d in [&run, &sup] {
                            write(host, &d.join(file), &all(file)?)?;
                        }
                    }
                    write(
                        host,
                        &sb.join("cpuset.cpus"),
                        limits.cpuset.as_deref().unwrap_or_default(),
                    )?;
                    write(host, &sb.join("cpuset.mems"), &all("cpuset.mems")?)?;
                }
            }
            // The account moves its sandbox's init in; nothing moves out (every other
            // `cgroup.procs` is root's).
            give(host, &sb.join("cgroup.procs"), account)?;
        }
        Ok(())
    }

    fn prepare_v2(
        &mut self,
        host: &dyn Host,
        root: &Path,
        name: &str,
        limits: &Limits,
        account: (u32, u32),
    ) -> Result<(), CgroupError> {
        let run = root.join(run_path(name).trim_start_matches('/'));
        // Each controller is enabled for the children of the root, the shared parent and the
        // run (the v2 root takes processes and children alike; the others hold no process).
        let enable: String = limits
            .controllers()
            .iter()
            .map(|c| format!("+{c} "))
            .collect();
        let enable = enable.trim_end();
        write(host, &root.join("cgroup.subtree_control"), enable)?;
        let (_, sb) = self.make(host, &run)?;
        // Enabled once the children exist, the controllers' files appear in them.
        for d in [run.parent().unwrap_or(&run), &run] {
            write(host, &d.join("cgroup.subtree_control"), enable)?;
        }
        if let Some(n) = limits.memory_bytes {
            write(host, &sb.join("memory.max"), &n.to_string())?;
            // Swap included: v2 bounds swap apart, so none at all keeps the total at the limit.
            write(host, &sb.join("memory.swap.max"), "0")?;
        }
        if let Some(n) = limits.pids {
            write(host, &sb.join("pids.max"), &n.to_string())?;
        }
        if let Some(m) = limits.cpus_milli {
            write(host, &sb.join("cpu.max"), &format!("{} 100000", m * 100))?;
        }
        if let Some(set) = &limits.cpuset {
            write(host, &sb.join("cpuset.cpus"), set)?;
        }
        // A move needs write access to the destination's and the common ancestor's
        // `cgroup.procs`: the account can move the sandbox's init from the supervisor into the
        // sandbox, and nothing anywhere else (the run itself holds no process: v2's rule).
        give(host, &sb.join("cgroup.procs"), account)?;
        give(host, &run.join("cgroup.procs"), account)?;
        Ok(())
    }

    /// Place process `pid` (stopped before it runs anything of its own) in the supervisor,
    /// then check from `/proc/<pid>/cgroup` that the kernel has it there in every hierarchy.
    ///
    /// # Errors
    /// A write was refused, or the process is not where it was placed.
    pub fn join(&self, pid: u32) -> Result<(), CgroupError> {
        let host = &self.probe.host;
        let sup: Vec<&PathBuf> = self
            .dirs
            .iter()
            .filter(|d| d.ends_with(SUPERVISOR))
            .collect();
        for dir in sup {
            write(&**host, &dir.join("cgroup.procs"), &pid.to_string())?;
        }
        let run = self
            .probe
            .path
            .strip_suffix(&format!("/{SANDBOX}"))
            .unwrap_or(&self.probe.path);
        placed(
            &**host,
            pid,
            &format!("{run}/{SUPERVISOR}"),
            &self.hierarchies,
        )
    }

    /// The limits' evidence: OOM kills and peak memory where the hierarchy tells.
    #[must_use]
    pub fn accounting(&self) -> serde_json::Value {
        let (oom_kills, peak_bytes, cpu_ms) = self.probe.accounting();
        serde_json::json!({
            "path": self.probe.path,
            "oom_kills": oom_kills,
            "peak_bytes": peak_bytes,
            "cpu_ms": cpu_ms,
        })
    }

    /// Remove the run's cgroup (its directories, children first, never the shared parent).
    ///
    /// # Errors
    /// A directory could not be removed: a process is still in it (residue).
    pub fn remove(&self) -> Result<(), CgroupError> {
        let mut dirs = self.dirs.clone();
        dirs.reverse();
        remove_dirs(&*self.probe.host, &dirs)
    }
}

/// The account's side: move the sandbox's init `pid` (created, not started) into run `name`'s
/// [`SANDBOX`], then check `/proc/<pid>/cgroup` has it there.
///
/// # Errors
/// A move was refused, or the process is not there.
pub fn enter_sandbox(
    host: &dyn Host,
    root: &Path,
    name: &str,
    limits: &Limits,
    pid: u32,
) -> Result<(), CgroupError> {
    let (dirs, hierarchies) = sandbox_dirs(host, root, name, limits)?;
    for dir in &dirs {
        write(host, &dir.join("cgroup.procs"), &pid.to_string())?;
    }
    placed(
        host,
        pid,
        &format!("{}/{SANDBOX}", run_path(name)),
        &hierarchies,
    )
}

fn remove_dirs(host: &dyn Host, dirs: &[PathBuf]) -> Result<(), CgroupError> {
    let mut first = None;
    for dir in dirs {
        if let Err(e) = host.remove_dir(dir) {
            first.get_or_insert_with(|| failed("remove", dir)(e));
        }
    }
    first.map_or(Ok(()), Err)
}

/// Remove run `name`'s cgroup wherever a run left it (each hierarchy, children first; one
/// already gone, or never made, is fine): how the end of a per-run run, or its recovery,
/// removes it.
///
/// # Errors
/// The hierarchy is not known, or a directory could not be removed (a process left in it).
pub fn remove_leftover(host: &dyn Host, root: &Path, name: &str) -> Result<(), CgroupError> {
    let run = run_path(name);
    let mut dirs = Vec::new();
    for path in [
        format!("{run}/{SANDBOX}"),
        format!("{run}/{SUPERVISOR}"),
        run.clone(),
    ] {
        dirs.extend(
            cgroup_dirs(host, root, &path)
                .map_err(failed("read", &root.join("cgroup.controllers")))?,
        );
    }
    remove_dirs(host, &dirs)
}

/// Whether `/proc/<pid>/cgroup` has `pid` at `path` in every hierarchy of `hierarchies` (v1),
/// or in the unified one when it is empty.
fn placed(
    host: &dyn Host,
    pid: u32,
    path: &str,
    hierarchies: &[&'static str],
) -> Result<(), CgroupError> {
    let proc = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = read_text(host, &proc)?;
    let at = |controller: Option<&str>| {
        text.lines().any(|l| {
            let mut f = l.splitn(3, ':');
            let (_, list, at) = (f.next(), f.next().unwrap_or("x"), f.next());
            let listed = match controller {
                None => list.is_empty(),
                Some(c) => list.split(',').any(|x| x == c),
            };
            listed && at == Some(path)
        })
    };
    let found = if hierarchies.is_empty() {
        at(None)
    } else {
        hierarchies.iter().all(|c| at(Some(c)))
    };
    if found {
        Ok(())
    } else {
        Err(CgroupError {
            what: format!("process {pid} is not in {path}"),
            source: io::Error::other(text),
        })
    }
}

/// The cgroup v2 subtree delegated to user `uid`, for runs of a process whose own cgroup is
/// `own` (the `0::` path of its `/proc/self/cgroup`, whose whole text is `self_cgroup`): the
/// parent of its own cgroup, when `root` is the unified hierarchy alone, mounted with
/// `nsdelegate` (its line in `mountinfo`, `/proc/self/mountinfo`), that parent is the
/// user's (the directory, its `cgroup.procs` and `cgroup.subtree_control`, as systemd's
/// `Delegate=yes` leaves them) and it offers every controller `limits` need. Those controllers
/// are then enabled for its children (the runs' cgroups, siblings of this process's own).
/// Returns the parent's path, below which a run's cgroup is `cordon-<run>`.
///
/// # Errors
/// Why no subtree is delegated, for the operator (a refusal, never a run without the limits).
pub fn delegated(
    host: &dyn Host,
    root: &Path,
    (self_cgroup, mountinfo): (&str, &str),
    uid: u32,
    limits: &Limits,
) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let mut lines = self_cgroup.lines().filter(|l| !l.is_empty());
    let own = match (lines.next(), lines.next()) {
        (Some(l), None) => l.strip_prefix("0::").map(str::to_owned),
        _ => None,
    }
    .ok_or("this process is not on cgroup v2 alone (its /proc/self/cgroup lists v1 hierarchies)")?;
    if !unified(host, root).unwrap_or(false) {
        return Err(format!("{} is not the cgroup v2 hierarchy", root.display()));
    }
    // The run's limit files are the user's (its runtime writes them): only `nsdelegate` keeps a
    // process in a cgroup namespace below them from writing them too.
    let root_text = root.to_string_lossy();
    let nsdelegate = mountinfo.lines().any(|l| {
        let (mount, sup) = l.split_once(" - ").unwrap_or((l, ""));
        mount.split(' ').nth(4) == Some(root_text.as_ref())
            && sup.starts_with("cgroup2 ")
            && sup
                .split(' ')
                .nth(2)
                .is_some_and(|o| o.split(',').any(|o| o == "nsdelegate"))
    });
    if !nsdelegate {
        return Err(format!(
            "{} is not mounted with nsdelegate: a run could write its own limits",
            root.display()
        ));
    }
    let parent = Path::new(&own)
        .parent()
        .filter(|p| *p != Path::new("/"))
        .ok_or_else(|| {
            format!("this process's cgroup {own} has no parent below the root to delegate")
        })?
        .to_str()
        .unwrap_or_default()
        .to_owned();
    let dir = root.join(parent.trim_start_matches('/'));
    for p in [
        dir.clone(),
        dir.join("cgroup.procs"),
        dir.join("cgroup.subtree_control"),
    ] {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.uid() == uid => {}
            Ok(m) => {
                return Err(format!(
                    "{} is uid {}'s, not this user's: no cgroup is delegated to it (systemd: Delegate=yes)",
                    p.display(),
                    m.uid()
                ));
            }
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    let offered = read_text(host, &dir.join("cgroup.controllers")).map_err(|e| e.to_string())?;
    let needed = limits.controllers();
    if let Some(missing) = needed
        .iter()
        .find(|c| !offered.split_whitespace().any(|o| o == **c))
    {
        return Err(format!(
            "the delegated cgroup {parent} does not offer the {missing} controller"
        ));
    }
    let enable: Vec<String> = needed.iter().map(|c| format!("+{c}")).collect();
    write(host, &dir.join("cgroup.subtree_control"), &enable.join(" "))
        .map_err(|e| e.to_string())?;
    Ok(parent)
}

/// Check from outside that the container's init `pid` is in cgroup `path` (unified hierarchy)
/// and that the kernel holds the memory and pids limits `limits` asked for.
///
/// # Errors
/// It is elsewhere, or a limit is not the one asked for.
pub fn check_placed(
    host: &HostRef,
    root: &Path,
    path: &str,
    pid: u32,
    limits: &Limits,
) -> Result<(), CgroupError> {
    placed(&**host, pid, path, &[])?;
    let probe = CgroupProbe {
        host: host.clone(),
        root: root.to_path_buf(),
        path: path.to_owned(),
    };
    // Swap included: the runtime turns the planned memory+swap into no swap at all, and skips
    // that where the file is missing, which would leave swap unbounded.
    if limits.memory_bytes.is_some() {
        let swap = root
            .join(path.trim_start_matches('/'))
            .join("memory.swap.max");
        let got = read_text(&**host, &swap)?;
        if got != "0" {
            return Err(CgroupError {
                what: swap.display().to_string(),
                source: io::Error::other(format!("holds {got:?}, not \"0\": swap is not bounded")),
            });
        }
    }
    for (want, got, what) in [
        (limits.memory_bytes, probe.memory_limit(), "memory.max"),
        (limits.pids, probe.pids_limit(), "pids.max"),
    ] {
        if want.is_some() && want != got {
            return Err(CgroupError {
                what: format!("{path}/{what}"),
                source: io::Error::other(format!("holds {got:?}, not {want:?}")),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
