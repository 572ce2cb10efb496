//! The OCI runtime driver: runc (or crun, runsc) driven through its CLI, with a state root of
//! cordon's own per executor.
//!
//! It owns the runtime's CLI (every call bounded in time and output, through the host seam),
//! the version preflight, the fail-closed listing of cordon's containers with their labels,
//! force removal, and the meta record of a run, in the manner of isolate's meta file: exit code
//! or signal, killed by the deadline, OOM-killed (read from the cgroup), wall and CPU time, peak
//! memory, output bytes and truncation. One container's step-by-step lifecycle is
//! [`crate::container`].
//!
//! It does not write bundles (the planner does) or decide what is cleaned up when (the lease
//! does).

use std::io;
use std::path::{Path, PathBuf};

use crate::host::{Host, HostRef, Tool};

/// A runtime release as (major, minor, patch); runsc's `release-YYYYMMDD.N` reads as
/// (YYYYMMDD, N, 0).
pub type Version = (u32, u32, u32);

/// A release range known to carry a container escape that cordon's configuration can reach,
/// checked at preflight: a runtime below `below` is refused unless its `commit:` line names a
/// distribution build that carries the fix.
#[derive(Debug, Clone, Copy)]
pub struct KnownBad {
    /// The first upstream release with the fix.
    pub below: Version,
    /// The advisory.
    pub cve: &'static str,
    /// What a candidate could do with it in cordon's configuration.
    pub what: &'static str,
    /// Builds (their `commit:` text) that carry the fix without the upstream version.
    pub patched_builds: &'static [&'static str],
}

/// The OCI runtimes cordon drives (the policy's `runtime "runc"|"crun"|"runsc"`), each through
/// the same CLI (`--root`, `create --pid-file`, `start`, `list -f json`, `state`, `kill --all`,
/// `delete --force`) and each with a version gate of its own ([`Gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// runc.
    Runc,
    /// crun.
    Crun,
    /// gVisor's runsc.
    Runsc,
}

impl Kind {
    /// Whether the runtime's init becomes the run's only as it execs the entrypoint, after
    /// `start`, so that the created init cannot yet be checked from outside: crun installs the
    /// seccomp filter then (measured with 1.8.1: after `create` its init has seccomp mode 0,
    /// capabilities and no_new_privs already set), and until then keeps its init non-dumpable
    /// (a rootless supervisor cannot read its namespaces or root). Its runs wait at a start
    /// gate, and are checked once the entrypoint holds it.
    #[must_use]
    pub fn settles_at_exec(self) -> bool {
        match self {
            Self::Runc => false,
            Self::Crun => true,
            // Its processes run under its Sentry; what cordon reads of them from the host is
            // not their posture (the stages refuse it for that).
            Self::Runsc => false,
        }
    }
}

/// What cordon requires of one runtime's releases, read from its `--version` text.
#[derive(Debug)]
pub struct Gate {
    /// Its name, which its version text begins with (`runc version …`).
    pub name: &'static str,
    /// The oldest release cordon drives; `None` when cordon keeps no floor for it and the
    /// policy's `min-version` must name one.
    pub floor: Option<Version>,
    /// Releases with an escape cordon's configuration can reach (the policy README says why
    /// each applies and why the others cannot be reached).
    pub known_bad: &'static [KnownBad],
    /// Build features its version text must list (crun prints `+SECCOMP +CAP …`), each with what
    /// cordon relies on it for.
    pub features: &'static [(&'static str, &'static str)],
}

/// runc: the oldest release cordon drives (its `--root`, `create --pid-file`, `list -f json`
/// and the seccomp `defaultErrnoRet` field are relied on), and its reachable escapes.
pub const RUNC: Gate = Gate {
    name: "runc",
    floor: Some((1, 1, 0)),
    known_bad: &[
        KnownBad {
            below: (1, 1, 2),
            cve: "CVE-2022-29162",
            what: "the container's processes get inheritable capabilities the bundle did not grant",
            patched_builds: &[],
        },
        KnownBad {
            below: (1, 1, 5),
            cve: "CVE-2023-27561",
            what: "a /proc symlink in the image defeats the runtime's own confinement of its init",
            patched_builds: &[],
        },
        KnownBad {
            below: (1, 1, 12),
            cve: "CVE-2024-21626",
            what: "a host directory descriptor leaked into the container reaches the host filesystem",
            // Debian 12's runc carries the fix as a patch on 1.1.5.
            patched_builds: &["1.1.5+ds1-1+deb12u1"],
        },
    ],
    features: &[],
};

/// crun: the oldest release the containment suite has run against (Debian 12's 1.8.1; every
/// crun advisory that cordon's configuration could reach is fixed below it), and the build
/// features its bundles need. No crun escape above the floor is reachable (policy README).
pub const CRUN: Gate = Gate {
    name: "crun",
    floor: Some((1, 8, 0)),
    known_bad: &[],
    features: &[
        ("+SECCOMP", "the bundle's seccomp filter"),
        ("+CAP", "the bundle's capability sets"),
        ("+EBPF", "the device allow-list on cgroup v2"),
    ],
};

/// gVisor's runsc: cordon keeps no release floor (gVisor does not issue advisories for most
/// fixes, so there is no table to derive one from): the policy's `min-version` is the
/// reviewer's floor, `YYYYMMDD.N.0` for `release-YYYYMMDD.N`, and is required.
pub const RUNSC: Gate = Gate {
    name: "runsc",
    floor: None,
    known_bad: &[],
    features: &[],
};

impl Kind {
    /// Its version gate.
    #[must_use]
    pub fn gate(self) -> &'static Gate {
        match self {
            Self::Runc => &RUNC,
            Self::Crun => &CRUN,
            Self::Runsc => &RUNSC,
        }
    }
}

/// A release read from a `--version` text: its number, and whether it is a pre-release of it
/// (`1.2.0-rc.1`, `1.2.0~rc1`, `1.2.0rc1`, which come before 1.2.0; `+ds1` build metadata does
/// not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Release {
    number: Version,
    pre: bool,
}

impl Release {
    /// Whether this release comes before `bound` (a pre-release of `bound` does).
    fn before(self, bound: Version) -> bool {
        self.number < bound || (self.number == bound && self.pre)
    }
}

/// The release of a `--version` text of runtime `gate`, the version as written, and its
/// `commit:` line; `None` when the text is not that runtime's (crun's `crun version 1.8.1`
/// would otherwise read as runc 1.8.1, past every runc advisory) or names no release.
fn version_of<'t>(gate: &Gate, text: &'t str) -> Option<(Release, &'t str, &'t str)> {
    let version = text
        .lines()
        .next()?
        .strip_prefix(gate.name)?
        .strip_prefix(" version ")?
        .split_whitespace()
        .next()?;
    let digits = version.strip_prefix("release-").unwrap_or(version);
    let end = digits
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(digits.len());
    let mut parts = digits[..end].split('.').map(|p| p.parse::<u32>().ok());
    let number = (
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    );
    let commit = text
        .lines()
        .find_map(|l| l.strip_prefix("commit:"))
        .map_or("", str::trim);
    // `-rc.1` (semver), `~rc1` (Debian) and `rc1` right after the number all mark a
    // pre-release; `+ds1` is build metadata.
    let pre = digits[end..].starts_with(|c: char| c == '-' || c == '~' || c.is_ascii_alphabetic());
    Some((Release { number, pre }, version, commit))
}

/// The runtime to drive.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// The runtime binary (the policy's, already measured for the authority).
    pub binary: PathBuf,
    /// cordon's own state root for this executor: nothing else's containers live here.
    pub state_root: PathBuf,
    /// The host seam every runtime call and host read goes through.
    pub host: HostRef,
}

/// Why the runtime could not be driven. Every variant is a no-decision.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RuntimeError {
    /// The runtime binary could not be started.
    #[error("cannot run the OCI runtime {binary}")]
    #[diagnostic(
        code(cordon::runtime::spawn),
        help(
            "install the runtime (apt-get install runc, or crun) or fix the policy's runtime path"
        )
    )]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The runtime is older than cordon supports.
    #[error("OCI runtime {binary} is version {found}, cordon needs at least {need}")]
    #[diagnostic(code(cordon::runtime::too_old))]
    TooOld {
        /// The binary.
        binary: PathBuf,
        /// Its version text.
        found: String,
        /// The minimum.
        need: String,
    },
    /// The binary's version text is not the runtime's the policy names.
    #[error("OCI runtime {binary} does not say it is {kind}: {found:?}")]
    #[diagnostic(
        code(cordon::runtime::not_named),
        help(
            "point the policy's runtime path at the runtime it names, or name the runtime the path holds (its versions are gated by their own table)"
        )
    )]
    NotNamed {
        /// The binary.
        binary: PathBuf,
        /// The runtime the policy names.
        kind: &'static str,
        /// The first line of its version text, escaped.
        found: String,
    },
    /// The runtime's build lacks a feature cordon's bundles rely on.
    #[error("OCI runtime {binary} is built without {feature} ({why})")]
    #[diagnostic(
        code(cordon::runtime::feature),
        help("install a build of the runtime with that feature")
    )]
    Feature {
        /// The binary.
        binary: PathBuf,
        /// The flag its version text lacks.
        feature: &'static str,
        /// What cordon needs it for.
        why: &'static str,
    },
    /// cordon keeps no release floor for this runtime and the policy names none.
    #[error(
        "cordon keeps no release floor for {kind}, and the policy's runtime has no min-version"
    )]
    #[diagnostic(
        code(cordon::runtime::no_floor),
        help(
            "set min-version on the policy's runtime to the oldest release the reviewer accepts (runsc's release-YYYYMMDD.N is YYYYMMDD.N.0)"
        )
    )]
    NoFloor {
        /// The binary.
        binary: PathBuf,
        /// The runtime.
        kind: &'static str,
    },
    /// The runtime is a release with a known escape cordon's configuration can reach.
    #[error("OCI runtime {binary} is version {found}, affected by {cve}: {what}")]
    #[diagnostic(
        code(cordon::runtime::known_bad),
        help("install a release with the fix, or a distribution build that carries it")
    )]
    KnownBad {
        /// The binary.
        binary: PathBuf,
        /// Its version text.
        found: String,
        /// The advisory.
        cve: &'static str,
        /// What it allows.
        what: &'static str,
    },
    /// A runtime command failed.
    #[error("`{command}` failed: {stderr}")]
    #[diagnostic(code(cordon::runtime::command))]
    Command {
        /// What was run.
        command: String,
        /// What it said.
        stderr: String,
    },
    /// The runtime's listing or state could not be read: nothing is known to be absent.
    #[error("cannot establish the runtime's containers: {why}")]
    #[diagnostic(code(cordon::runtime::listing))]
    Listing {
        /// What could not be read.
        why: String,
    },
    /// Waiting for, or reading from, the container failed.
    #[error("cannot supervise container {id}: {why}")]
    #[diagnostic(code(cordon::runtime::supervise))]
    Supervise {
        /// The container.
        id: String,
        /// What went wrong.
        why: String,
    },
}

/// A container's annotations.
pub type Labels = std::collections::BTreeMap<String, String>;

/// Caps on captured output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputCaps {
    /// Bytes of stdout kept.
    pub stdout: u64,
    /// Bytes of stderr kept.
    pub stderr: u64,
}

pub use cordon_evidence::receipt::Meta;

/// A finished run: the meta record and the kept output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The meta record.
    pub meta: Meta,
    /// Kept stdout.
    pub stdout: Vec<u8>,
    /// Kept stderr.
    pub stderr: Vec<u8>,
}

/// Whether the cgroup filesystem at `root` is the unified (v2) hierarchy.
///
/// # Errors
/// `cgroup.controllers` exists but cannot be read: the hierarchy is not known, and a guess
/// would look for (and "remove") cgroups where they are not.
pub fn unified(host: &dyn Host, root: &Path) -> io::Result<bool> {
    match host.read(&root.join("cgroup.controllers")) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The directories cgroup `path` occupies below `root`: one on v2, one per controller on v1
/// (every v1 controller the runtime may join, mounted here or not) — and, on a hybrid v1 host, in the v2 tree mounted at `unified` and the named `systemd`
/// hierarchy, where the runtime makes a container's cgroup too (a directory that does not
/// exist there holds nothing and is nothing to remove).
///
/// # Errors
/// The hierarchy is not known ([`unified`]).
pub fn cgroup_dirs(host: &dyn Host, root: &Path, path: &str) -> io::Result<Vec<PathBuf>> {
    let rel = path.trim_start_matches('/');
    if unified(host, root)? {
        return Ok(vec![root.join(rel)]);
    }
    Ok([
        "memory",
        "cpu",
        "cpuacct",
        "pids",
        "cpuset",
        "devices",
        "freezer",
        "blkio",
        "hugetlb",
        "net_cls",
        "net_prio",
        "perf_event",
        "rdma",
        "misc",
        "unified",
        "systemd",
    ]
    .iter()
    .map(|c| root.join(c).join(rel))
    .collect())
}

/// Where the container's cgroup is, to read its accounting before it is deleted.
#[derive(Debug, Clone)]
pub struct CgroupProbe {
    /// The host seam its files are read through.
    pub host: HostRef,
    /// The cgroup filesystem root (`/sys/fs/cgroup`, injectable for tests).
    pub root: PathBuf,
    /// The bundle's `cgroupsPath` (`/cordon/<lease>`).
    pub path: String,
}

impl CgroupProbe {
    fn rel(&self) -> &str {
        self.path.trim_start_matches('/')
    }

    fn text(&self, path: &Path) -> Option<String> {
        let bytes = self.host.read(path).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn read_u64(&self, path: &Path) -> Option<u64> {
        self.text(path)?.trim().parse().ok()
    }

    fn field(&self, path: &Path, key: &str) -> Option<u64> {
        self.text(path)?.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// Whether the host uses the unified (v2) hierarchy.
    ///
    /// # Errors
    /// `cgroup.controllers` exists but cannot be read: the hierarchy is not known, and a guess
    /// would look for (and "remove") cgroups where they are not.
    pub fn unified(&self) -> io::Result<bool> {
        unified(&*self.host, &self.root)
    }

    /// The directories this cgroup occupies (one on v2, one per controller on v1).
    ///
    /// # Errors
    /// The hierarchy is not known ([`CgroupProbe::unified`]).
    pub fn dirs(&self) -> io::Result<Vec<PathBuf>> {
        cgroup_dirs(&*self.host, &self.root, &self.path)
    }

    /// (oom kills, peak bytes, cpu ms) as far as the hierarchy tells; the OOM count is what a
    /// verdict rests on, so the caller refuses a run whose count cannot be read.
    pub fn accounting(&self) -> (Option<u64>, Option<u64>, Option<u64>) {
        let Ok(unified) = self.unified() else {
            return (None, None, None);
        };
        if unified {
            let d = self.root.join(self.rel());
            return (
                self.field(&d.join("memory.events"), "oom_kill"),
                self.read_u64(&d.join("memory.peak")),
                self.field(&d.join("cpu.stat"), "usage_usec")
                    .map(|u| u / 1000),
            );
        }
        let mem = self.root.join("memory").join(self.rel());
        let cpu = self.root.join("cpuacct").join(self.rel());
        (
            self.field(&mem.join("memory.oom_control"), "oom_kill"),
            self.read_u64(&mem.join("memory.max_usage_in_bytes")),
            self.read_u64(&cpu.join("cpuacct.usage"))
                .map(|ns| ns / 1_000_000),
        )
    }

    /// The cgroup's event and usage counters as text, one `file: value` line each (a file's
    /// lines joined by `; `), for the evidence a run leaves: OOM and pids-limit events,
    /// memory and CPU use. A file that cannot be read says so on its line.
    #[must_use]
    pub fn events(&self) -> String {
        let files: &[(&str, &str)] = match self.unified() {
            Ok(true) => &[
                ("", "cgroup.events"),
                ("", "memory.events"),
                ("", "memory.peak"),
                ("", "memory.current"),
                ("", "pids.events"),
                ("", "pids.current"),
                ("", "cpu.stat"),
            ],
            Ok(false) => &[
                ("memory", "memory.oom_control"),
                ("memory", "memory.failcnt"),
                ("memory", "memory.max_usage_in_bytes"),
                ("memory", "memory.usage_in_bytes"),
                ("pids", "pids.events"),
                ("pids", "pids.current"),
                ("cpuacct", "cpuacct.usage"),
            ],
            Err(e) => return format!("hierarchy: unknown: {e}\n"),
        };
        let mut out = String::new();
        for (controller, file) in files {
            let path = self.root.join(controller).join(self.rel()).join(file);
            let value = match self.host.read(&path) {
                Ok(bytes) => String::from_utf8_lossy(&bytes)
                    .trim()
                    .lines()
                    .collect::<Vec<_>>()
                    .join("; "),
                Err(e) => format!("unavailable: {e}"),
            };
            let name = Path::new(controller).join(file);
            out.push_str(&format!("{}: {value}\n", name.display()));
        }
        out
    }

    /// The memory limit the kernel applied (bytes), to check the bundle took effect.
    #[must_use]
    pub fn memory_limit(&self) -> Option<u64> {
        if self.unified().ok()? {
            self.read_u64(&self.root.join(self.rel()).join("memory.max"))
        } else {
            self.read_u64(
                &self
                    .root
                    .join("memory")
                    .join(self.rel())
                    .join("memory.limit_in_bytes"),
            )
        }
    }

    /// The CPUs the kernel's cpuset controller gives this cgroup (effective), as a cpu list.
    /// The container's processes cannot change it (affinity calls only narrow within it).
    #[must_use]
    pub fn cpuset_effective(&self) -> Option<String> {
        let file = if self.unified().ok()? {
            self.root.join(self.rel()).join("cpuset.cpus.effective")
        } else {
            self.root
                .join("cpuset")
                .join(self.rel())
                .join("cpuset.effective_cpus")
        };
        Some(self.text(&file)?.trim().to_owned())
    }

    /// Whether the kernel gives this cgroup the CPU weight of `shares` (OCI's
    /// `cpu.shares`): `cpu.shares` itself on v1; on v2 the `cpu.weight` runc converts it to
    /// (`1 + (shares − 2) × 9999 / 262142`). `None` when it cannot be read.
    #[must_use]
    pub fn has_cpu_shares(&self, shares: u64) -> Option<bool> {
        if self.unified().ok()? {
            let weight = self.read_u64(&self.root.join(self.rel()).join("cpu.weight"))?;
            Some(weight == 1 + (shares.saturating_sub(2) * 9999) / 262_142)
        } else {
            let file = self.root.join("cpu").join(self.rel()).join("cpu.shares");
            Some(self.read_u64(&file)? == shares)
        }
    }

    /// The pids limit the kernel applied.
    #[must_use]
    pub fn pids_limit(&self) -> Option<u64> {
        let d = if self.unified().ok()? {
            self.root.join(self.rel())
        } else {
            self.root.join("pids").join(self.rel())
        };
        self.read_u64(&d.join("pids.max"))
    }
}

/// What the runtime says when a kill finds no container to kill: it already ended, or never
/// was made. Such a kill needs nothing done.
pub const ALREADY_ENDED: &[&str] = &["not running", "not exist"];

impl Runtime {
    /// The runtime's command line for a subcommand under cordon's state root.
    #[must_use]
    pub fn tool(&self, args: &[&str]) -> Tool {
        let mut tool = Tool::new(&self.binary, &["--root"]);
        tool.args.push(self.state_root.clone().into_os_string());
        tool.args.extend(args.iter().map(std::ffi::OsString::from));
        tool
    }

    /// Run a runtime subcommand to completion through the host seam (bounded in time and
    /// output); its stderr is the error.
    ///
    /// # Errors
    /// It could not be started, ran past its timeout, or exited non-zero.
    pub fn call(&self, args: &[&str]) -> Result<Vec<u8>, RuntimeError> {
        let tool = self.tool(args);
        let out = self.host.run(&tool).map_err(|source| RuntimeError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(RuntimeError::Command {
                command: format!("{} {}", self.binary.display(), args.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }

    /// Check that the runtime is the `kind` the policy names, new enough — at least its
    /// [`Gate::floor`] and the policy's own minimum `policy_min` — not a release in its
    /// [`Gate::known_bad`], and built with its [`Gate::features`], from its `--version` text
    /// (the one the authority identity read, bounded in time and output, so the runtime is not
    /// run twice).
    ///
    /// # Errors
    /// Another runtime's text, too old, no floor at all, known-bad, a missing feature, or a
    /// version that cannot be read.
    pub fn check_version(
        &self,
        kind: Kind,
        text: &str,
        policy_min: Option<Version>,
    ) -> Result<(), RuntimeError> {
        let gate = kind.gate();
        let need = match (gate.floor, policy_min) {
            (Some(floor), min) => min.map_or(floor, |m| m.max(floor)),
            // runsc's releases are dates: a minimum that is not one (0.0.0, 2024.2.12) would
            // admit every release.
            (None, Some(min)) if min.0 >= 19_700_101 => min,
            (None, _) => {
                return Err(RuntimeError::NoFloor {
                    binary: self.binary.clone(),
                    kind: gate.name,
                });
            }
        };
        let too_old = |found: &str| RuntimeError::TooOld {
            binary: self.binary.clone(),
            found: found.to_owned(),
            need: format!("{}.{}.{}", need.0, need.1, need.2),
        };
        let first = text.lines().next().unwrap_or("");
        if !first.starts_with(&format!("{} version ", gate.name)) {
            return Err(RuntimeError::NotNamed {
                binary: self.binary.clone(),
                kind: gate.name,
                found: crate::text::printable(first).into_owned(),
            });
        }
        let Some((found, version, commit)) = version_of(gate, text) else {
            return Err(too_old(first));
        };
        if found.before(need) {
            return Err(too_old(version));
        }
        if let Some(bad) = gate
            .known_bad
            .iter()
            .find(|b| found.before(b.below) && !b.patched_builds.contains(&commit))
        {
            return Err(RuntimeError::KnownBad {
                binary: self.binary.clone(),
                found: version.to_owned(),
                cve: bad.cve,
                what: bad.what,
            });
        }
        // A feature is a whole word of the text's feature line (crun's `+SYSTEMD +SECCOMP …`),
        // never `+SECCOMP_X`, nor a word of another line (a `commit:` text).
        let words: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(['+', '-']))
            .flat_map(str::split_whitespace)
            .collect();
        if let Some((feature, why)) = gate.features.iter().find(|(f, _)| !words.contains(f)) {
            return Err(RuntimeError::Feature {
                binary: self.binary.clone(),
                feature,
                why,
            });
        }
        Ok(())
    }

    /// The ids of the containers in cordon's state root with their annotations (from
    /// `runc state`), for absence proofs and recovery.
    ///
    /// Fails closed: a listing that does not parse, an entry without an id, or a `state` that
    /// fails for any reason but the container's being gone (deleted between list and state:
    /// runc says it "does not exist"; crun cannot open its status file, and its directory is
    /// no longer in the state root) is an error, never "no containers".
    ///
    /// # Errors
    /// [`RuntimeError::Listing`], or the runtime failed.
    pub fn containers(&self) -> Result<Vec<(String, Labels)>, RuntimeError> {
        let listing = |why: String| RuntimeError::Listing { why };
        let out = self.call(&["list", "-f", "json"])?;
        // runc prints `null` for an empty (or not yet created) state root.
        let list: Option<Vec<serde_json::Value>> = serde_json::from_slice(&out)
            .map_err(|e| listing(format!("`list -f json` is not a JSON list: {e}")))?;
        let mut found = Vec::new();
        for c in list.unwrap_or_default() {
            let id = c["id"]
                .as_str()
                .ok_or_else(|| listing(format!("a listed container has no id: {c}")))?;
            let state = match self.call(&["state", id]) {
                Ok(state) => state,
                // Gone between list and state: runc says it no longer exists.
                Err(RuntimeError::Command { stderr, .. }) if stderr.contains("does not exist") => {
                    continue;
                }
                // crun only says it cannot open the status file: gone exactly when its
                // directory has left the state root too (a container still being created has
                // its directory and no status yet, and is not gone).
                Err(e) => match self.host.list_dir(&self.state_root) {
                    Ok(names) if !names.iter().any(|n| n == id) => continue,
                    Ok(_) => return Err(listing(format!("`state {id}`: {e}"))),
                    Err(read) => {
                        return Err(listing(format!(
                            "`state {id}`: {e}; the state root {}: {read}",
                            self.state_root.display()
                        )));
                    }
                },
            };
            let state: serde_json::Value = serde_json::from_slice(&state)
                .map_err(|e| listing(format!("`state {id}` is not JSON: {e}")))?;
            let labels: Labels = match &state["annotations"] {
                serde_json::Value::Null => Labels::new(),
                a => serde_json::from_value(a.clone())
                    .map_err(|e| listing(format!("`state {id}` annotations: {e}")))?,
            };
            found.push((id.to_owned(), labels));
        }
        Ok(found)
    }

    /// SIGKILL every process of container `id`, leaving the container (and its cgroup, whose
    /// accounting its supervisor still reads) for the supervisor to delete. One that is no
    /// longer running, or gone, is already ended.
    ///
    /// # Errors
    /// The kill failed for another reason.
    pub fn kill_all(&self, id: &str) -> Result<(), RuntimeError> {
        self.call_unless(&["kill", "--all", id, "KILL"], ALREADY_ENDED)
    }

    /// Force-remove a container: kill everything in it, then delete it. A container that does
    /// not exist is not an error.
    ///
    /// # Errors
    /// The runtime reports a failure for a container that exists.
    pub fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        // The delete decides: it fails on a container that exists and cannot be removed.
        let _ = self.kill_all(id);
        self.delete(id)
    }

    /// Delete a container whose init has exited, with no separate kill: its own pid namespace
    /// went with the init, and `delete --force` still kills whatever is left before it
    /// removes the cgroup. A container that does not exist is not an error.
    ///
    /// # Errors
    /// The runtime reports a failure for a container that exists.
    pub fn delete(&self, id: &str) -> Result<(), RuntimeError> {
        self.call_unless(&["delete", "--force", id], &["not exist"])
    }

    /// [`Runtime::call`], where a failure whose stderr names one of `already` means the work
    /// was already done (the container gone, or no longer running).
    fn call_unless(&self, args: &[&str], already: &[&str]) -> Result<(), RuntimeError> {
        match self.call(args) {
            Ok(_) => Ok(()),
            Err(RuntimeError::Command { stderr, .. })
                if already.iter().any(|a| stderr.contains(a)) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl crate::exit::ExitClass for RuntimeError {
    /// A runtime that fails is cordon's infrastructure: a no-decision (3).
    fn exit_class(&self) -> crate::ExitCode {
        crate::ExitCode::NoDecision
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::ToolOutput;
    use crate::host::fake::{Call, Fake};

    fn runtime(fake: &Arc<Fake>) -> Runtime {
        Runtime {
            binary: "/usr/sbin/runc".into(),
            state_root: "/run/cordon-runc/x".into(),
            host: fake.clone(),
        }
    }

    #[test]
    fn versions_below_a_minimum_known_bad_or_unreadable_are_refused() {
        let r = runtime(&Arc::new(Fake::new()));
        r.check_version(
            Kind::Runc,
            "runc version 1.1.12\ncommit: v1.1.12\nspec: 1.0.2-dev",
            None,
        )
        .unwrap();
        r.check_version(Kind::Runc, "runc version 1.2.0", None)
            .unwrap();
        for old in [
            "runc version 1.0.0-rc93",
            "runc version 0.9",
            "runc version ",
        ] {
            assert!(
                matches!(
                    r.check_version(Kind::Runc, old, None),
                    Err(RuntimeError::TooOld { .. })
                ),
                "{old:?}"
            );
        }
        // Another runtime's text (crun 1.8.1 would read as a runc past every advisory), or
        // none, is not runc's.
        for other in [
            "crun version 1.8.1\ncommit: f8a096be060b22ccd3d5f3ebe44108517fbf6c30\nspec: 1.0.0",
            "runsc version release-20240212.0\nspec: 1.1.0-rc.1",
            "garbage",
            "",
        ] {
            assert!(
                matches!(
                    r.check_version(Kind::Runc, other, None),
                    Err(RuntimeError::NotNamed { kind: "runc", .. })
                ),
                "{other:?}"
            );
        }
        // The policy's minimum raises the floor, never lowers it.
        assert!(matches!(
            r.check_version(Kind::Runc, "runc version 1.1.12", Some((1, 2, 0))),
            Err(RuntimeError::TooOld { .. })
        ));
        assert!(matches!(
            r.check_version(Kind::Runc, "runc version 1.0.0", Some((0, 1, 0))),
            Err(RuntimeError::TooOld { .. })
        ));
        // Upstream releases with a reachable escape are refused, a build with the fix is not.
        for (text, cve) in [
            ("runc version 1.1.1", "CVE-2022-29162"),
            ("runc version 1.1.4\ncommit: v1.1.4", "CVE-2023-27561"),
            ("runc version 1.1.11\ncommit: v1.1.11", "CVE-2024-21626"),
            (
                "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1",
                "CVE-2024-21626",
            ),
        ] {
            match r.check_version(Kind::Runc, text, None) {
                Err(RuntimeError::KnownBad { cve: c, .. }) => assert_eq!(c, cve, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        r.check_version(
            Kind::Runc,
            "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev",
            None,
        )
        .unwrap();
        // A pre-release comes before its release: below the policy's minimum and inside an
        // advisory's range; build metadata (`+ds1`, above) is not a pre-release.
        assert!(matches!(
            r.check_version(Kind::Runc, "runc version 1.2.0-rc.1", Some((1, 2, 0))),
            Err(RuntimeError::TooOld { .. })
        ));
        assert!(matches!(
            r.check_version(
                Kind::Runc,
                "runc version 1.1.12-rc.1\ncommit: v1.1.12-rc.1",
                None
            ),
            Err(RuntimeError::KnownBad {
                cve: "CVE-2024-21626",
                ..
            })
        ));
        r.check_version(Kind::Runc, "runc version 1.2.0", Some((1, 2, 0)))
            .unwrap();
        for pre in ["1.2.0~rc1+ds1", "1.2.0rc1", "1.2.0-rc.1+dev"] {
            assert!(
                matches!(
                    r.check_version(Kind::Runc, &format!("runc version {pre}"), Some((1, 2, 0))),
                    Err(RuntimeError::TooOld { .. })
                ),
                "{pre}"
            );
        }
    }

    #[test]
    fn crun_and_runsc_are_gated_by_their_own_tables() {
        let r = runtime(&Arc::new(Fake::new()));
        let debian = "crun version 1.8.1\ncommit: f8a096be060b22ccd3d5f3ebe44108517fbf6c30\n\
                      rundir: /run/crun\nspec: 1.0.0\n+SYSTEMD +SELINUX +APPARMOR +CAP +SECCOMP +EBPF +YAJL";
        r.check_version(Kind::Crun, debian, None).unwrap();
        // runc's text is not crun's, nor the other way round.
        assert!(matches!(
            r.check_version(Kind::Crun, "runc version 1.1.12", None),
            Err(RuntimeError::NotNamed { kind: "crun", .. })
        ));
        assert!(matches!(
            r.check_version(Kind::Runc, debian, None),
            Err(RuntimeError::NotNamed { kind: "runc", .. })
        ));
        // Below the floor (1.8.0: the 1.7 line is refused, 1.8.0 is not), or the policy's
        // minimum.
        for (version, ok) in [("1.4.4", false), ("1.7.2", false), ("1.8.0", true)] {
            let text = debian.replace("1.8.1", version);
            let checked = r.check_version(Kind::Crun, &text, None);
            if ok {
                assert!(checked.is_ok(), "{version}: {checked:?}");
            } else {
                assert!(
                    matches!(checked, Err(RuntimeError::TooOld { .. })),
                    "{version}: {checked:?}"
                );
            }
        }
        assert!(matches!(
            r.check_version(Kind::Crun, debian, Some((1, 9, 0))),
            Err(RuntimeError::TooOld { .. })
        ));
        // A build without a feature the bundles need is refused by name; a longer word is not
        // the feature.
        for (feature, text) in [
            ("+SECCOMP", debian.replace("+SECCOMP", "-SECCOMP")),
            // Only the feature line counts, never a word of another line.
            (
                "+SECCOMP",
                debian
                    .replace("+SECCOMP", "-SECCOMP")
                    .replace("commit: f8a", "commit: +SECCOMP f8a"),
            ),
            ("+CAP", debian.replace(" +CAP", "")),
            ("+EBPF", debian.replace("+EBPF", "+EBPFX")),
        ] {
            match r.check_version(Kind::Crun, &text, None) {
                Err(RuntimeError::Feature { feature: f, .. }) => assert_eq!(f, feature),
                other => panic!("{feature}: {other:?}"),
            }
        }
        // runsc: no floor of cordon's own, so the policy's minimum is required and holds.
        let runsc = "runsc version release-20240212.0\nspec: 1.1.0-rc.1";
        assert!(matches!(
            r.check_version(Kind::Runsc, runsc, None),
            Err(RuntimeError::NoFloor { kind: "runsc", .. })
        ));
        r.check_version(Kind::Runsc, runsc, Some((20_240_212, 0, 0)))
            .unwrap();
        assert!(matches!(
            r.check_version(Kind::Runsc, runsc, Some((20_240_401, 0, 0))),
            Err(RuntimeError::TooOld { .. })
        ));
        assert!(matches!(
            r.check_version(
                Kind::Runsc,
                "runsc version garbage",
                Some((20_240_212, 0, 0))
            ),
            Err(RuntimeError::TooOld { .. })
        ));
        // A minimum that is not a runsc release (a date) would admit every release.
        for min in [(0, 0, 0), (2024, 2, 12)] {
            assert!(
                matches!(
                    r.check_version(Kind::Runsc, runsc, Some(min)),
                    Err(RuntimeError::NoFloor { .. })
                ),
                "{min:?}"
            );
        }
    }

    #[test]
    fn every_call_names_cordons_state_root_and_a_failure_carries_stderr() {
        let fake = Arc::new(Fake::new());
        fake.reply("delete", ToolOutput::failed("permission denied"));
        let r = runtime(&fake);
        r.call(&["start", "c1"]).unwrap();
        let e = r.remove("c1").unwrap_err();
        assert!(e.to_string().contains("permission denied"), "{e}");
        let calls = fake.calls();
        assert_eq!(
            calls[0],
            Call::Run("/usr/sbin/runc --root /run/cordon-runc/x start c1".into())
        );
        // A container that does not exist is removed already.
        let fake = Arc::new(Fake::new());
        fake.reply("delete", ToolOutput::failed("container c2 does not exist"));
        runtime(&fake).remove("c2").unwrap();
    }

    #[test]
    fn cgroup_accounting_reads_v2_and_v1_through_the_seam() {
        let fake = Arc::new(Fake::new());
        fake.file("/cg/cgroup.controllers", "memory pids")
            .file("/cg/cordon/l/memory.events", "low 0\noom 1\noom_kill 2\n")
            .file("/cg/cordon/l/memory.peak", "4096\n")
            .file("/cg/cordon/l/cpu.stat", "usage_usec 5000\n")
            .file("/cg/cordon/l/memory.max", "1048576\n")
            .file("/cg/cordon/l/cpu.weight", "10000\n");
        let p = CgroupProbe {
            host: fake.clone(),
            root: "/cg".into(),
            path: "/cordon/l".into(),
        };
        assert!(p.unified().unwrap());
        assert_eq!(p.accounting(), (Some(2), Some(4096), Some(5)));
        assert_eq!(p.memory_limit(), Some(1_048_576));
        assert_eq!(
            (p.has_cpu_shares(262_144), p.has_cpu_shares(1024)),
            (Some(true), Some(false))
        );
        assert_eq!(p.dirs().unwrap(), vec![PathBuf::from("/cg/cordon/l")]);
        let fake = Arc::new(Fake::new());
        fake.file("/cg/pids/cordon/l/pids.max", "64\n")
            .file("/cg/cpu/cordon/l/cpu.shares", "262144\n");
        let p = CgroupProbe {
            host: fake,
            root: "/cg".into(),
            path: "/cordon/l".into(),
        };
        assert!(!p.unified().unwrap());
        assert_eq!(p.pids_limit(), Some(64));
        assert_eq!(
            (p.has_cpu_shares(262_144), p.has_cpu_shares(2)),
            (Some(true), Some(false))
        );
        assert_eq!(p.dirs().unwrap().len(), 16);
        // A hierarchy that cannot be told is an error, never a guess.
        let fake = Arc::new(Fake::new());
        fake.unreadable("/cg/cgroup.controllers");
        let p = CgroupProbe {
            host: fake,
            root: "/cg".into(),
            path: "/cordon/l".into(),
        };
        for e in [
            p.unified().unwrap_err().to_string(),
            p.dirs().unwrap_err().to_string(),
        ] {
            assert!(e.contains("injected failure"), "{e}");
        }
    }
}
