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
//!   them outside it.
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
    /// The service user could change the policy.
    #[error("policy {policy} can be changed by the service user: {why}")]
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
    #[error("read path {path} contains {guarded}")]
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
/// neighbours are other runs' workspaces), the state directory, the store.
///
/// # Errors
/// [`TrustError::ReadSet`].
pub fn read_set<'a>(
    read: impl IntoIterator<Item = &'a String>,
    guarded: impl IntoIterator<Item = &'a Path> + Clone,
) -> Result<(), TrustError> {
    for path in read {
        if let Some(g) = guarded
            .clone()
            .into_iter()
            .find(|g| path_within(Path::new(path), g))
        {
            return Err(TrustError::ReadSet {
                path: path.clone(),
                guarded: g.to_path_buf(),
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
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p != dir && path_within(dir, p))
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// The state directory, checked: not a link, a directory of `uid`'s own, mode 0700, disjoint
/// from the workspace both ways.
///
/// # Errors
/// [`TrustError::StateDir`].
pub fn state_dir(dir: &Path, workspace: Option<&Path>, uid: u32) -> Result<(), TrustError> {
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
    if m.mode() & 0o077 != 0 {
        return Err(bad(format!("mode {:o}, not 0700", m.mode() & 0o7777)));
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

/// Make `rel` beneath the checked `workspace`, one component at a time relative to the open
/// parent, never following a link: the workspace opened must be the directory checked, and an
/// existing component must be a real directory.
///
/// # Errors
/// The workspace is no longer the directory checked, a component is a link or not a
/// directory, or cannot be made.
pub fn make_beneath(workspace: &Workspace, rel: &str) -> Result<(), TrustError> {
    let bad = |why: String| TrustError::Workspace {
        path: workspace.path.clone(),
        why,
    };
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(&workspace.path)
        .map_err(io(&workspace.path))?;
    if !workspace.is(&opened.metadata().map_err(io(&workspace.path))?) {
        return Err(bad("it is no longer the directory that was checked".into()));
    }
    let mut dir: std::os::fd::OwnedFd = opened.into();
    for name in rel.split('/') {
        match mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(bad(format!("cannot make {rel}: {e}"))),
        }
        dir = openat(dir.as_fd(), name, flags, Mode::empty()).map_err(|e| {
            bad(format!(
                "{rel}: component {name:?} is not a directory of its own ({e}); a link is never followed"
            ))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
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
        assert!(policy_file(&outside, Some(&ws), other, &[]).is_ok());
        // Group-writable by one of its groups, or writable by everyone: refused.
        let gid = std::fs::metadata(&outside).unwrap().gid();
        chmod(&outside, 0o664);
        assert!(policy_file(&outside, Some(&ws), other, &[gid]).is_err());
        assert!(policy_file(&outside, Some(&ws), other, &[]).is_ok());
        chmod(&outside, 0o646);
        assert!(policy_file(&outside, Some(&ws), other, &[]).is_err());
        chmod(&outside, 0o644);
        chmod(dir.path(), 0o757);
        assert!(policy_file(&outside, Some(&ws), other, &[]).is_err());
        chmod(dir.path(), 0o1757);
        assert!(policy_file(&outside, Some(&ws), other, &[]).is_ok());
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

    #[test]
    fn home_and_temp_are_made_beneath_the_workspace_and_a_planted_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let checked = workspace(&std::fs::canonicalize(&ws).unwrap(), me).unwrap();
        let ws = checked.path.clone();
        let outside = std::fs::canonicalize(&outside).unwrap();
        // Given through a link, or not as its canonical path: refused.
        std::os::unix::fs::symlink(&ws, dir.path().join("alias")).unwrap();
        assert!(workspace(&dir.path().join("alias"), me).is_err());
        assert!(workspace(&ws.join("sub/.."), me).is_err());
        let ws_ref = &checked;
        make_beneath(ws_ref, ".cph/agent-runtime").unwrap();
        make_beneath(ws_ref, ".cph/t").unwrap();
        assert!(ws.join(".cph/t").is_dir());
        // Again: existing directories are fine.
        make_beneath(ws_ref, ".cph/t").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("evil")).unwrap();
        assert!(make_beneath(ws_ref, "evil/t").is_err());
        std::fs::write(ws.join("file"), "").unwrap();
        assert!(make_beneath(ws_ref, "file/t").is_err());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // The directory at the path replaced by another: refused, nothing made in it.
        std::fs::rename(&ws, dir.path().join("moved")).unwrap();
        std::fs::create_dir(&ws).unwrap();
        assert!(make_beneath(ws_ref, "new").is_err());
        assert!(!ws.join("new").exists());
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
        assert!(state_dir(&state, Some(&ws), me).is_err());
        chmod(&state, 0o700);
        assert!(state_dir(&state, Some(&ws), me.wrapping_add(1)).is_err());
        let inner = ws.join("state");
        std::fs::create_dir(&inner).unwrap();
        chmod(&inner, 0o700);
        assert!(state_dir(&inner, Some(&ws), me).is_err());
        let nested = state.join("ws");
        std::fs::create_dir(&nested).unwrap();
        assert!(state_dir(&state, Some(&nested), me).is_err());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&state, &link).unwrap();
        assert!(state_dir(&link, Some(&ws), me).is_err());
    }
}
