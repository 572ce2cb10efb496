//! What cordon-surface trusts, checked before anything runs: nothing inside the workspace or
//! writable by the service user can widen the surface.
//!
//! - The policy is read only from the operator's path (never from an environment variable),
//!   and refused when it lies inside the workspace or when the service user could change it:
//!   the file or any directory above it owned by the service user, writable by a group it is
//!   in, or writable by everyone (a directory only with the sticky bit, whose entries the
//!   service user then cannot replace).
//! - The runtime binary the policy names is held to the same rule: it is what enforces the
//!   surface.
//! - The workspace is given by its canonical path (a link anywhere in it is refused) and is a
//!   directory of the service user's own, never `/`, identified by device and inode: the
//!   runner proves the directory the runtime mounted is this one before the run starts, so a
//!   rename race on a directory above it cannot substitute another. It has no mount beneath
//!   it: inside a user namespace the kernel binds a tree with mounts under it only recursively
//!   (a plain bind would reveal what they cover), and a recursive bind would carry a host mount
//!   placed in the workspace — `/etc` bound at `ws/sub` — into the surface.
//! - The state directory is the service user's own (0700, no link), disjoint from the
//!   workspace both ways.
//! - Home and temp are made beneath the workspace one component at a time, relative to an
//!   open directory and never following a link, so a link planted in the workspace cannot send
//!   them outside it; each directory the surface makes is recorded in the state directory
//!   (`homes/`), and one found at those paths later must be that directory (device, inode,
//!   birth, owner, mode 0700), so nothing a command or a checked-out tree put there becomes
//!   the agent's home or temp.
//!
//! It does not read any configuration from the workspace: there is none to read.

use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};

use crate::within::{path_within, resolved_within};

/// Why the surface will not run with what it was given. Each is a wiring error (exit 2).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TrustError {
    /// The policy file lies inside the workspace.
    #[error("policy {policy} lies inside the workspace {workspace}")]
    #[diagnostic(
        code(cordon::surface::policy_in_workspace),
        help("the surface reads its policy only from the operator's path, outside any workspace")
    )]
    PolicyInWorkspace {
        /// The policy.
        policy: PathBuf,
        /// The workspace.
        workspace: PathBuf,
    },
    /// The policy file is not there.
    #[error("no surface policy at {policy}")]
    #[diagnostic(
        code(cordon::surface::policy_missing),
        help(
            "name one with --policy, or install the example root-owned: install -D -m 0644 policy/examples/surface.kdl /etc/cordon/surface.kdl (its state-dir must exist, owned by the service user)"
        )
    )]
    PolicyMissing {
        /// The path given.
        policy: PathBuf,
    },
    /// The service user could change the policy.
    #[error("policy {policy} can be changed by a user it binds: {why}")]
    #[diagnostic(
        code(cordon::surface::policy_writable),
        help("install the policy root-owned, 0644, in directories only root can write")
    )]
    PolicyWritable {
        /// The policy.
        policy: PathBuf,
        /// Which path and how.
        why: String,
    },
    /// The service user could change the runtime that enforces the surface.
    #[error("runtime {runtime} can be changed by the service user: {why}")]
    #[diagnostic(code(cordon::surface::runtime_writable))]
    RuntimeWritable {
        /// The runtime.
        runtime: PathBuf,
        /// Which path and how.
        why: String,
    },
    /// A read-set path would expose the workspace's surroundings, the state or the store.
    #[error("read path {path} contains {guarded} ({why})")]
    #[diagnostic(
        code(cordon::surface::read_set),
        help(
            "name narrower read paths: none may contain the workspace, the state directory or the store"
        )
    )]
    ReadSet {
        /// The read path.
        path: String,
        /// What it contains.
        guarded: PathBuf,
        /// Why that path is kept out (a never-mount path's reviewed reason).
        why: String,
    },
    /// A read path has a mount beneath it: a rootless runtime cannot bind it without that
    /// mount (the kernel refuses a non-recursive bind that would uncover what a locked mount
    /// hides), and a recursive one would carry it in.
    #[error(
        "read path {path} has a mount beneath it ({beneath}), which this host's rootless runtime cannot leave out"
    )]
    #[diagnostic(
        code(cordon::surface::read_set),
        help(
            "name read paths with no mount beneath them (or run where none is mounted there); nothing mounted beneath a read path ever crosses"
        )
    )]
    ReadSetMount {
        /// The read path.
        path: String,
        /// The first mount point beneath it.
        beneath: PathBuf,
    },
    /// The workspace is not usable.
    #[error("workspace {path} cannot be used: {why}")]
    #[diagnostic(code(cordon::surface::workspace))]
    Workspace {
        /// The workspace.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The state directory is not the service user's own.
    #[error("state directory {path} cannot be used: {why}")]
    #[diagnostic(
        code(cordon::surface::state_dir),
        help("create it owned by the service user, mode 0700 (the NixOS module does)")
    )]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The agent's home or temp, or a directory above them, is not what the surface made.
    #[error("the agent's directories in workspace {path} cannot be trusted: {why}")]
    #[diagnostic(code(cordon::surface::agent_dirs))]
    AgentDirs {
        /// The workspace.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A path could not be examined.
    #[error("cannot examine {path}")]
    #[diagnostic(code(cordon::surface::io))]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrustError + '_ {
    move |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether the user `uid` with groups `gids` could change `path` (its metadata `m`) or, for a
/// directory, its entries.
fn changeable(m: &std::fs::Metadata, uid: u32, gids: &[u32]) -> Option<&'static str> {
    let mode = m.mode();
    let sticky_dir = m.is_dir() && mode & 0o1000 != 0;
    if m.uid() == uid {
        Some("owned by the service user")
    } else if mode & 0o020 != 0 && gids.contains(&m.gid()) {
        Some("writable by a group of the service user")
    } else if mode & 0o002 != 0 && !sticky_dir {
        Some("writable by everyone")
    } else {
        None
    }
}

/// `path`, canonical, when neither it nor a directory above it is changeable by `uid` (with
/// groups `gids`); otherwise which path is, and how.
///
/// # Errors
/// The path cannot be examined.
pub fn unchangeable(
    path: &Path,
    uid: u32,
    gids: &[u32],
) -> Result<Result<PathBuf, String>, TrustError> {
    let canonical = std::fs::canonicalize(path).map_err(io(path))?;
    for p in canonical.ancestors() {
        let m = std::fs::symlink_metadata(p).map_err(io(p))?;
        if let Some(how) = changeable(&m, uid, gids) {
            return Ok(Err(format!("{} is {how}", p.display())));
        }
    }
    Ok(Ok(canonical))
}

/// [`TrustError::PolicyMissing`] when nothing is at `policy` (not even a dangling link).
fn missing(policy: &Path) -> Result<(), TrustError> {
    match std::fs::symlink_metadata(policy) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(TrustError::PolicyMissing {
            policy: policy.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// The policy file, checked: canonical, outside the workspace, and neither it nor a directory
/// above it changeable by `uid` (with groups `gids`).
///
/// # Errors
/// [`TrustError`].
pub fn policy_file(
    policy: &Path,
    workspace: Option<&Path>,
    uid: u32,
    gids: &[u32],
) -> Result<PathBuf, TrustError> {
    missing(policy)?;
    let canonical = std::fs::canonicalize(policy).map_err(io(policy))?;
    if let Some(ws) = workspace
        && resolved_within(ws, &canonical).map_err(io(ws))?
    {
        return Err(TrustError::PolicyInWorkspace {
            policy: canonical,
            workspace: ws.to_path_buf(),
        });
    }
    unchangeable(policy, uid, gids)?.map_err(|why| TrustError::PolicyWritable {
        policy: policy.to_path_buf(),
        why,
    })
}

/// A file root reads as its authority (the policy, under `user "per-run"`): canonical, and it
/// and every directory above it root's and writable by no group or other user (a sticky
/// directory aside). Its canonical path.
///
/// # Errors
/// [`TrustError::PolicyWritable`] naming the path and how; the path cannot be examined.
pub fn root_only(path: &Path) -> Result<PathBuf, TrustError> {
    missing(path)?;
    cordon::lease::per_run::root_only(path).map_err(|why| TrustError::PolicyWritable {
        policy: path.to_path_buf(),
        why,
    })
}

/// The runtime binary: neither it nor a directory above it changeable by the service user.
///
/// # Errors
/// [`TrustError::RuntimeWritable`].
pub fn runtime(binary: &Path, uid: u32, gids: &[u32]) -> Result<(), TrustError> {
    unchangeable(binary, uid, gids)?
        .map(|_| ())
        .map_err(|why| TrustError::RuntimeWritable {
            runtime: binary.to_path_buf(),
            why,
        })
}

/// The read set: no path may contain (or be) one of `guarded` — the workspace (whose
/// neighbours are other runs' workspaces), the state directory, the store — nor contain, be or
/// lie inside one of `never` (the policy's never-mount paths), nor have a mount beneath it in
/// `mountinfo` (the kernel's table, `/proc/self/mountinfo`).
///
/// # Errors
/// [`TrustError::ReadSet`], [`TrustError::ReadSetMount`].
pub fn read_set<'a>(
    read: impl IntoIterator<Item = &'a String>,
    guarded: impl IntoIterator<Item = &'a Path> + Clone,
    never: &[(&'a Path, &'a str)],
    mountinfo: &str,
) -> Result<(), TrustError> {
    for path in read {
        // A mount beneath where the path leads (`/bin` is `/usr/bin` on a merged-/usr host).
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path));
        if let Some(beneath) = mounts_beneath(mountinfo, &resolved).into_iter().next() {
            return Err(TrustError::ReadSetMount {
                path: path.clone(),
                beneath,
            });
        }
        // A never-mount path, as written or where it leads, against the read path as written
        // and where it leads (the runtime follows links in a bind source).
        let never_real: Vec<(PathBuf, &str)> = never
            .iter()
            .filter_map(|(n, why)| Some((std::fs::canonicalize(n).ok()?, *why)))
            .collect();
        let never_all: Vec<(&Path, &str)> = never
            .iter()
            .copied()
            .chain(never_real.iter().map(|(n, why)| (n.as_path(), *why)))
            .collect();
        let touches_never = |p: &Path| {
            never_all
                .iter()
                .find(|(n, _)| path_within(n, p) || path_within(p, n))
                .map(|(n, why)| (*n, format!("never-mount: {why}")))
        };
        if let Some((g, why)) = guarded
            .clone()
            .into_iter()
            .find(|g| path_within(Path::new(path), g))
            .map(|g| {
                let why = "cordon's own: the workspace, the state directory or the store";
                (g, why.to_owned())
            })
            .or_else(|| touches_never(Path::new(path)))
            .or_else(|| touches_never(&resolved))
        {
            return Err(TrustError::ReadSet {
                path: path.clone(),
                guarded: g.to_path_buf(),
                why,
            });
        }
    }
    Ok(())
}

/// A checked workspace: its canonical path and the identity of the directory that was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// The canonical path.
    pub path: PathBuf,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
}

impl Workspace {
    /// Whether `m` is this directory.
    #[must_use]
    pub fn is(&self, m: &std::fs::Metadata) -> bool {
        m.dev() == self.dev && m.ino() == self.ino
    }
}

/// The workspace: given by its canonical path, an existing directory of `uid`'s own, not `/`,
/// with no mount beneath it.
///
/// # Errors
/// [`TrustError::Workspace`].
pub fn workspace(path: &Path, uid: u32) -> Result<Workspace, TrustError> {
    let bad = |why: &str| TrustError::Workspace {
        path: path.to_path_buf(),
        why: why.to_owned(),
    };
    let canonical = std::fs::canonicalize(path).map_err(io(path))?;
    if canonical != path {
        return Err(bad(&format!(
            "not its canonical path ({}): a link in a workspace path could be re-pointed between runs",
            canonical.display()
        )));
    }
    let m = std::fs::symlink_metadata(&canonical).map_err(io(path))?;
    if !m.is_dir() {
        return Err(bad("not a directory"));
    }
    if canonical == Path::new("/") {
        return Err(bad("the root directory is no workspace"));
    }
    if m.uid() != uid {
        return Err(bad("not owned by the service user"));
    }
    let mountinfo = Path::new("/proc/self/mountinfo");
    let table = std::fs::read_to_string(mountinfo).map_err(io(mountinfo))?;
    if let Some(point) = mounts_beneath(&table, &canonical).first() {
        return Err(bad(&format!(
            "{} is a mount point beneath it, which would cross into the surface",
            point.display()
        )));
    }
    Ok(Workspace {
        path: canonical,
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// The mount points in `mountinfo` (the kernel's table) strictly beneath `dir`.
fn mounts_beneath(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(cordon::mountinfo::unescape(p)))
        .filter(|p| p != dir && path_within(dir, p))
        .collect()
}

/// The state directory, checked: not a link, a directory of `uid`'s own, mode 0700, disjoint
/// from the workspace both ways.
///
/// # Errors
/// [`TrustError::StateDir`].
pub fn state_dir(dir: &Path, workspace: Option<&Path>, uid: u32) -> Result<(), TrustError> {
    state_dir_mode(dir, workspace, uid, 0o700)
}

/// [`state_dir`] with the exact `mode` required (root's under `user "per-run"` is 0711: each
/// per-run account must pass through it to its own directory, and no one may list it).
///
/// # Errors
/// [`TrustError::StateDir`].
pub fn state_dir_mode(
    dir: &Path,
    workspace: Option<&Path>,
    uid: u32,
    mode: u32,
) -> Result<(), TrustError> {
    let bad = |why: String| TrustError::StateDir {
        path: dir.to_path_buf(),
        why,
    };
    let m = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if !m.is_dir() {
        return Err(bad("not a directory (a link is not followed)".into()));
    }
    if m.uid() != uid {
        return Err(bad(format!(
            "owned by uid {}, not the service user",
            m.uid()
        )));
    }
    if m.mode() & 0o7777 != mode {
        return Err(bad(format!("mode {:o}, not {mode:04o}", m.mode() & 0o7777)));
    }
    let canonical = std::fs::canonicalize(dir).map_err(io(dir))?;
    if let Some(ws) = workspace
        && (resolved_within(ws, &canonical).map_err(io(ws))?
            || resolved_within(&canonical, ws).map_err(io(dir))?)
    {
        return Err(bad("not disjoint from the workspace".into()));
    }
    Ok(())
}

/// The state directory's subdirectory of agent-directory records, one per workspace path.
pub const HOMES: &str = "homes";
/// The record's schema.
const HOMES_SCHEMA: u32 = 1;

/// A directory's identity: what a replacement made at its path cannot share with it while
/// it exists (device and inode), and its birth time where the filesystem keeps one, so a
/// directory made later on a freed inode is not taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirId {
    /// The device.
    pub dev: u64,
    /// The inode.
    pub ino: u64,
    /// Birth time, ns since the epoch, when the filesystem records one.
    pub born_ns: Option<i128>,
}

impl DirId {
    /// The identity in `m`.
    #[must_use]
    pub fn of(m: &std::fs::Metadata) -> Self {
        let born_ns = m
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
        Self {
            dev: m.dev(),
            ino: m.ino(),
            born_ns,
        }
    }
}

/// The record of the agent directories of `workspace` in `state`.
#[must_use]
pub fn homes_record(state: &Path, workspace: &Path) -> PathBuf {
    state.join(HOMES).join(format!(
        "{}.json",
        cordon::canonical::Digest::of_bytes(workspace.as_os_str().as_encoded_bytes()).hex()
    ))
}

/// What the surface made for the agent in one workspace: the workspace's identity and each
/// agent directory's (relative path → identity), `STATE/homes/<sha256 of the path>.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Homes {
    schema: u32,
    workspace: PathBuf,
    id: DirId,
    dirs: std::collections::BTreeMap<String, DirId>,
}

/// The agent's directories of `workspace` (`rels`, parents first, from
/// [`cordon_stage::surface::agent_dirs`]), made or proven: each component is opened relative
/// to its open parent, never following a link; one the surface makes now (0700) is recorded
/// in `state`; one that exists must be a directory of `uid`'s, mode 0700, with the identity
/// the record holds for it. A directory at one of those paths that the surface did not make —
/// a command's replacement, a checked-out tree's `.cph` — is never the agent's: refused.
///
/// # Errors
/// The workspace is not the one checked, a component is a link, not a directory, not the
/// service user's, not 0700, or not the directory the surface made; the record cannot be
/// read or written.
pub fn agent_dirs(
    workspace: &Workspace,
    state: &Path,
    uid: u32,
    rels: &[String],
) -> Result<std::collections::BTreeMap<String, DirId>, TrustError> {
    let bad = |why: String| TrustError::AgentDirs {
        path: workspace.path.clone(),
        why,
    };
    let file = homes_record(state, &workspace.path);
    // One proof at a time per state directory: two first runs never both make, or one see
    // unrecorded, what the other is making.
    let homes_dir = state.join(HOMES);
    cordon::lease::rootless::private_dir(&homes_dir)
        .map_err(|e| bad(format!("its records' directory: {e}")))?;
    let lock = std::fs::File::open(&homes_dir).map_err(io(&homes_dir))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io(&homes_dir)(e.into()))?;
    let ws = open_checked(workspace)?;
    let ws_id = DirId::of(&nix_stat(&ws, &workspace.path)?);
    let mut homes = match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice::<Homes>(&bytes)
            .map_err(|e| bad(format!("its record {} is unreadable: {e}", file.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Homes {
            schema: HOMES_SCHEMA,
            workspace: workspace.path.clone(),
            id: ws_id,
            dirs: std::collections::BTreeMap::new(),
        },
        Err(e) => return Err(io(&file)(e)),
    };
    // A record of another directory once at this path (removed and made again) says nothing
    // about this one.
    if homes.schema != HOMES_SCHEMA || homes.id != ws_id || homes.workspace != workspace.path {
        homes = Homes {
            schema: HOMES_SCHEMA,
            workspace: workspace.path.clone(),
            id: ws_id,
            dirs: std::collections::BTreeMap::new(),
        };
    }
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let mut made = false;
    for rel in rels {
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        let mut dir = ws.try_clone().map_err(io(&workspace.path))?;
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            dir = openat(dir.as_fd(), part, flags, Mode::empty())
                .map_err(|e| bad(format!("{rel}: cannot open {part:?}: {e}")))?;
        }
        let fresh = match mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o700)) {
            Ok(()) => true,
            Err(nix::errno::Errno::EEXIST) => false,
            Err(e) => return Err(bad(format!("cannot make {rel}: {e}"))),
        };
        let opened = openat(dir.as_fd(), name, flags, Mode::empty()).map_err(|e| {
            bad(format!(
                "{rel} is not a directory of its own ({e}); a link is never followed"
            ))
        })?;
        let m = nix_stat(&opened, &workspace.path.join(rel))?;
        if m.uid() != uid {
            return Err(bad(format!(
                "{rel} is owned by uid {}, not the service user",
                m.uid()
            )));
        }
        if m.mode() & 0o7777 != 0o700 {
            return Err(bad(format!(
                "{rel} has mode {:o}, not 0700",
                m.mode() & 0o7777
            )));
        }
        let id = DirId::of(&m);
        if fresh {
            homes.dirs.insert(rel.clone(), id);
            made = true;
        } else if homes.dirs.get(rel) != Some(&id) {
            return Err(bad(format!(
                "{rel} is not the directory the surface made for the agent (a command's \
                 replacement or a checked-out tree's); inspect it and remove it, and the surface \
                 makes a fresh one"
            )));
        }
    }
    if made {
        write_record(&file, &homes)?;
    }
    Ok(homes.dirs)
}

/// The workspace opened without following a link, and proven the directory checked.
fn open_checked(workspace: &Workspace) -> Result<std::os::fd::OwnedFd, TrustError> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(&workspace.path)
        .map_err(io(&workspace.path))?;
    if !workspace.is(&opened.metadata().map_err(io(&workspace.path))?) {
        return Err(TrustError::Workspace {
            path: workspace.path.clone(),
            why: "it is no longer the directory that was checked".into(),
        });
    }
    Ok(opened.into())
}

/// The metadata of an open directory.
fn nix_stat(fd: &std::os::fd::OwnedFd, path: &Path) -> Result<std::fs::Metadata, TrustError> {
    std::fs::File::from(fd.try_clone().map_err(io(path))?)
        .metadata()
        .map_err(io(path))
}

/// `homes` written whole to `file` (0600, durable before it replaces the old record).
fn write_record(file: &Path, homes: &Homes) -> Result<(), TrustError> {
    use std::io::Write;
    let dir = file.parent().unwrap_or(Path::new("/"));
    let pending = file.with_extension("json.pending");
    let bytes = serde_json::to_vec_pretty(homes).map_err(|e| io(file)(std::io::Error::other(e)))?;
    let _ = std::fs::remove_file(&pending);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&pending)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .map_err(io(&pending))?;
    std::fs::rename(&pending, file).map_err(io(file))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Why `r` was refused: the reason of a refusal that carries one (an I/O error, which
    /// carries none, fails the test: it would pass an assertion for the wrong reason).
    fn why<T: std::fmt::Debug>(r: Result<T, TrustError>) -> String {
        match r {
            Err(
                TrustError::PolicyWritable { why, .. }
                | TrustError::RuntimeWritable { why, .. }
                | TrustError::Workspace { why, .. }
                | TrustError::StateDir { why, .. }
                | TrustError::AgentDirs { why, .. },
            ) => why,
            other => panic!("not a refusal with a reason: {other:?}"),
        }
    }

    #[test]
    fn a_policy_the_service_user_could_change_or_that_lies_in_the_workspace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let inside = ws.join("policy.kdl");
        std::fs::write(&inside, "").unwrap();
        let me = nix::unistd::geteuid().as_raw();
        // Another uid's view: the temp tree is ours, so "the service user" is someone else.
        let other = me.wrapping_add(1);
        assert!(matches!(
            policy_file(&inside, Some(&ws), other, &[]),
            Err(TrustError::PolicyInWorkspace { .. })
        ));
        // Reached through a link from outside: still inside.
        let link = dir.path().join("link.kdl");
        std::os::unix::fs::symlink(&inside, &link).unwrap();
        assert!(matches!(
            policy_file(&link, Some(&ws), other, &[]),
            Err(TrustError::PolicyInWorkspace { .. })
        ));
        let outside = dir.path().join("p.kdl");
        std::fs::write(&outside, "").unwrap();
        chmod(&outside, 0o644);
        chmod(dir.path(), 0o755);
        // Owned by the service user: refused.
        assert!(matches!(
            policy_file(&outside, Some(&ws), me, &[]),
            Err(TrustError::PolicyWritable { .. })
        ));
        // Another user's, in another user's directories (up to a sticky /tmp): accepted.
        policy_file(&outside, Some(&ws), other, &[]).unwrap();
        // Group-writable by one of its groups, or writable by everyone: refused, each for
        // that reason (the same file is accepted for a user outside the group).
        let file = std::fs::canonicalize(&outside).unwrap();
        let parent = file.parent().unwrap().to_owned();
        let gid = std::fs::metadata(&outside).unwrap().gid();
        chmod(&outside, 0o664);
        assert_eq!(
            why(policy_file(&outside, Some(&ws), other, &[gid])),
            format!(
                "{} is writable by a group of the service user",
                file.display()
            )
        );
        policy_file(&outside, Some(&ws), other, &[]).unwrap();
        chmod(&outside, 0o646);
        assert_eq!(
            why(policy_file(&outside, Some(&ws), other, &[])),
            format!("{} is writable by everyone", file.display())
        );
        chmod(&outside, 0o644);
        chmod(dir.path(), 0o757);
        assert_eq!(
            why(policy_file(&outside, Some(&ws), other, &[])),
            format!("{} is writable by everyone", parent.display())
        );
        chmod(dir.path(), 0o1757);
        policy_file(&outside, Some(&ws), other, &[]).unwrap();
    }

    /// The runtime the surface runs is one the service user cannot change: its own binary, or
    /// one in a directory it could write, is refused; another user's in another's directories
    /// is accepted.
    /// A surface policy that is not there says so, and how to install one: never read as a
    /// policy someone could change.
    #[test]
    fn a_missing_policy_says_how_to_install_one() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("surface.kdl");
        for e in [
            policy_file(&absent, None, 65534, &[]).unwrap_err(),
            root_only(&absent).unwrap_err(),
        ] {
            assert!(matches!(e, TrustError::PolicyMissing { .. }), "{e}");
            let help = miette::Diagnostic::help(&e).unwrap().to_string();
            assert!(help.contains("policy/examples/surface.kdl"), "{help}");
        }
    }

    #[test]
    fn a_runtime_the_service_user_could_change_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let runc = dir.path().join("runc");
        std::fs::write(&runc, "").unwrap();
        chmod(&runc, 0o755);
        let me = nix::unistd::geteuid().as_raw();
        let other = me.wrapping_add(1);
        runtime(&runc, other, &[]).unwrap();
        assert!(matches!(
            runtime(&runc, me, &[]),
            Err(TrustError::RuntimeWritable { .. })
        ));
        chmod(&runc, 0o757);
        assert!(matches!(
            runtime(&runc, other, &[]),
            Err(TrustError::RuntimeWritable { .. })
        ));
        chmod(&runc, 0o755);
        chmod(dir.path(), 0o775);
        let gid = std::fs::metadata(dir.path()).unwrap().gid();
        assert!(matches!(
            runtime(&runc, other, &[gid]),
            Err(TrustError::RuntimeWritable { .. })
        ));
        runtime(&runc, other, &[]).unwrap();
    }

    /// A read path with a mount beneath it is refused (seen on a GPU host: the driver's
    /// squashfs at /usr/local/nvidia, beneath /usr, made runc's non-recursive bind of /usr fail
    /// with EINVAL); a mount beside it, or one that is the read path itself, is not.
    #[test]
    fn a_read_path_with_a_mount_beneath_it_is_refused_with_the_mount_named() {
        let table = "27 1 254:0 / / rw - ext4 /dev/vda rw\n\
                     29 27 254:16 / /usr/local/nvidia ro - squashfs /dev/vdb ro\n\
                     40 27 0:30 / /etc/hosts rw - ext4 /dev/vda rw\n\
                     41 27 0:31 / /usrx rw - tmpfs tmpfs rw\n";
        let read = |paths: &[&str]| {
            let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
            read_set(
                &paths,
                [Path::new("/srv/ws")],
                &[(Path::new("/opt/secret"), "the host's secrets")],
                table,
            )
        };
        let e = read(&["/bin", "/usr"]).unwrap_err();
        assert!(
            matches!(&e, TrustError::ReadSetMount { path, beneath } if path == "/usr" && beneath == Path::new("/usr/local/nvidia")),
            "{e}"
        );
        read(&["/bin", "/etc/hosts", "/lib"]).unwrap();
        assert_eq!(
            read(&["/srv"]).unwrap_err().to_string(),
            "read path /srv contains /srv/ws (cordon's own: the workspace, the state directory or \
             the store)"
        );
        // A never-mount path: refused as the read path, above it or inside it.
        for p in ["/opt/secret", "/opt", "/opt/secret/key"] {
            assert!(
                matches!(read(&[p]), Err(TrustError::ReadSet { ref guarded, ref why, .. })
                    if guarded == Path::new("/opt/secret") && why == "never-mount: the host's secrets"),
                "{p}: {:?}",
                read(&[p])
            );
        }
        read(&["/opt/secretx"]).unwrap();
    }

    /// A read path that leads into a never-mount path through a link, or a never-mount path
    /// that is a link to a read path: refused where they really lead.
    #[test]
    fn a_never_mount_path_is_refused_where_it_really_leads() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        let link = dir.path().join("innocent");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let table = "27 1 254:0 / / rw - ext4 /dev/vda rw\n";
        let read = |p: &Path, never: &Path| {
            read_set(
                &[p.display().to_string()],
                [Path::new("/srv/ws")],
                &[(never, "t")],
                table,
            )
        };
        assert!(matches!(
            read(&link, &secret),
            Err(TrustError::ReadSet { .. })
        ));
        assert!(matches!(
            read(&secret, &link),
            Err(TrustError::ReadSet { .. })
        ));
        read(&dir.path().join("other"), &link).unwrap();
    }

    #[test]
    fn mounts_strictly_beneath_the_workspace_are_found_with_escaped_names() {
        let table = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                     30 22 8:1 /etc /srv/ws/sub rw - ext4 /dev/sda1 rw\n\
                     31 22 0:5 / /srv/ws\\040two/x rw - tmpfs tmpfs rw\n\
                     32 22 0:6 / /srv/ws rw - tmpfs tmpfs rw\n\
                     33 22 0:7 / /srv/wsx rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mounts_beneath(table, Path::new("/srv/ws")),
            vec![PathBuf::from("/srv/ws/sub")]
        );
        assert_eq!(
            mounts_beneath(table, Path::new("/srv/ws two")),
            vec![PathBuf::from("/srv/ws two/x")]
        );
    }

    fn dirs(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn home_and_temp_are_made_beneath_the_workspace_and_a_planted_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        let state = dir.path().join("state");
        for d in [&ws, &outside, &state] {
            std::fs::create_dir(d).unwrap();
        }
        let me = nix::unistd::geteuid().as_raw();
        let checked = workspace(&std::fs::canonicalize(&ws).unwrap(), me).unwrap();
        let ws = checked.path.clone();
        let outside = std::fs::canonicalize(&outside).unwrap();
        // Given through a link, or not as its canonical path: refused.
        std::os::unix::fs::symlink(&ws, dir.path().join("alias")).unwrap();
        let canonical = format!("not its canonical path ({})", ws.display());
        assert!(why(workspace(&dir.path().join("alias"), me)).starts_with(&canonical));
        std::fs::create_dir(ws.join("sub")).unwrap();
        assert!(why(workspace(&ws.join("sub/.."), me)).starts_with(&canonical));
        std::fs::remove_dir(ws.join("sub")).unwrap();
        let rels = dirs(&[".cph", ".cph/agent-runtime", ".cph/t"]);
        let made = agent_dirs(&checked, &state, me, &rels).unwrap();
        assert!(ws.join(".cph/t").is_dir());
        assert_eq!(made.len(), 3);
        // Again: the directories the surface made are proven, not made again.
        assert_eq!(agent_dirs(&checked, &state, me, &rels).unwrap(), made);
        std::os::unix::fs::symlink(&outside, ws.join("evil")).unwrap();
        let not_own = |rel: &str| {
            let why = why(agent_dirs(&checked, &state, me, &dirs(&[rel, "evil/t"])));
            assert!(
                why.starts_with(&format!("{rel} is not a directory of its own"))
                    && why.ends_with("a link is never followed"),
                "{why}"
            );
        };
        not_own("evil");
        std::fs::write(ws.join("file"), "").unwrap();
        not_own("file");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // The directory at the path replaced by another: refused, nothing made in it.
        std::fs::rename(&ws, dir.path().join("moved")).unwrap();
        std::fs::create_dir(&ws).unwrap();
        assert_eq!(
            why(agent_dirs(&checked, &state, me, &dirs(&["new"]))),
            "it is no longer the directory that was checked"
        );
        assert!(!ws.join("new").exists());
    }

    #[test]
    fn an_agent_directory_the_surface_did_not_make_is_never_the_agents() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let fresh = |name: &str| {
            let ws = dir.path().join(name);
            std::fs::create_dir(&ws).unwrap();
            workspace(&std::fs::canonicalize(&ws).unwrap(), me).unwrap()
        };
        let rels = dirs(&[".cph", ".cph/agent-runtime", ".cph/t"]);
        let refused = |w: &Workspace| match agent_dirs(w, &state, me, &rels) {
            Err(TrustError::AgentDirs { why, .. }) => why,
            other => panic!("not refused: {other:?}"),
        };
        // A checked-out tree's `.cph`, which the surface never made.
        let w = fresh("checkout");
        std::fs::create_dir_all(w.path.join(".cph/agent-runtime")).unwrap();
        chmod(&w.path.join(".cph"), 0o700);
        chmod(&w.path.join(".cph/agent-runtime"), 0o700);
        assert!(refused(&w).contains(".cph is not the directory the surface made"));
        // The attack: the home moved aside and a directory of the same name and mode made
        // in its place; then the same for the parent.
        let w = fresh("moved");
        agent_dirs(&w, &state, me, &rels).unwrap();
        let home = w.path.join(".cph/agent-runtime");
        std::fs::rename(&home, w.path.join(".cph/old")).unwrap();
        std::fs::create_dir(&home).unwrap();
        chmod(&home, 0o700);
        assert!(refused(&w).contains(".cph/agent-runtime is not the directory"));
        let w = fresh("parent");
        agent_dirs(&w, &state, me, &rels).unwrap();
        std::fs::rename(w.path.join(".cph"), w.path.join(".old")).unwrap();
        std::fs::create_dir_all(w.path.join(".cph/agent-runtime")).unwrap();
        chmod(&w.path.join(".cph"), 0o700);
        assert!(refused(&w).contains(".cph is not the directory"));
        // A mode widened, or a link in place of the directory.
        let w = fresh("mode");
        agent_dirs(&w, &state, me, &rels).unwrap();
        chmod(&w.path.join(".cph/t"), 0o755);
        assert!(refused(&w).contains("mode 755"));
        let w = fresh("link");
        agent_dirs(&w, &state, me, &rels).unwrap();
        std::fs::remove_dir(w.path.join(".cph/t")).unwrap();
        std::os::unix::fs::symlink(&state, w.path.join(".cph/t")).unwrap();
        assert!(refused(&w).contains("a link is never followed"));
        // The workspace removed and made again at its path: the record of the old one says
        // nothing, and a fresh set is made.
        let w = fresh("again");
        agent_dirs(&w, &state, me, &rels).unwrap();
        std::fs::remove_dir_all(&w.path).unwrap();
        std::fs::create_dir(&w.path).unwrap();
        let w2 = workspace(&w.path, me).unwrap();
        agent_dirs(&w2, &state, me, &rels).unwrap();
        // A record the surface cannot read stops the run.
        let w = fresh("record");
        agent_dirs(&w, &state, me, &rels).unwrap();
        for e in std::fs::read_dir(state.join(HOMES)).unwrap() {
            std::fs::write(e.unwrap().path(), "{").unwrap();
        }
        assert!(refused(&w).contains("unreadable"));
    }

    #[test]
    fn the_state_directory_is_the_service_users_own_and_disjoint_from_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let ws = dir.path().join("ws");
        let state = dir.path().join("state");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&state).unwrap();
        chmod(&state, 0o700);
        state_dir(&state, Some(&ws), me).unwrap();
        chmod(&state, 0o750);
        assert_eq!(why(state_dir(&state, Some(&ws), me)), "mode 750, not 0700");
        chmod(&state, 0o700);
        assert_eq!(
            why(state_dir(&state, Some(&ws), me.wrapping_add(1))),
            format!("owned by uid {me}, not the service user")
        );
        let inner = ws.join("state");
        std::fs::create_dir(&inner).unwrap();
        chmod(&inner, 0o700);
        let apart = "not disjoint from the workspace";
        assert_eq!(why(state_dir(&inner, Some(&ws), me)), apart);
        let nested = state.join("ws");
        std::fs::create_dir(&nested).unwrap();
        assert_eq!(why(state_dir(&state, Some(&nested), me)), apart);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&state, &link).unwrap();
        assert_eq!(
            why(state_dir(&link, Some(&ws), me)),
            "not a directory (a link is not followed)"
        );
    }
}
