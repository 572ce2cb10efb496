//! The one tree walk: by file descriptors (`openat` with `O_NOFOLLOW`, `statx` with
//! `AT_SYMLINK_NOFOLLOW`), never by path, and never across a mount — so nothing a tree holds (a
//! symbolic link, a rename race, a mount planted inside it) can steer the host outside it.
//! Every tree cordon reads goes through it: a staging area's inventory, a stored tree's
//! verification, a delta's file list, a store's listing, a model directory, an image's seal.
//!
//! It owns the traversal and its three proofs: each entry is examined relative to its
//! directory's descriptor, each directory is reopened component by component without following
//! a link and refused if it is no longer the inode that was listed, and each entry's mount id
//! must be the root's. It does not decide what a tree may hold: the visitor does, on the
//! [`Node`] it is shown (kind, mode, owner, size, links), and may open a regular file through
//! [`Node::open`], which checks that the inode opened is the one examined.
//!
//! Order: the root first (path `""`), then each directory's entries in byte order of their
//! names; a directory's contents after all of its siblings (depth-first, last sibling first).
//! Descriptors: the root and at most one directory per level being read, never one per
//! pending directory. A host-side resource error (out of descriptors or memory) is
//! [`WalkError::Host`], never the tree's fault.
//!
//! Names: [`walk`] and [`walk_fd`] refuse a name that is not UTF-8 ([`WalkError::NonUtf8`]): a
//! tree cordon stores or publishes has text names only. A caller that must walk whatever a user
//! left (an agent's workspace handed back) uses [`walk_within`] with [`Bounds::any_names`]:
//! names are kept as bytes for every call on the tree, and the visitor's `path` shows each byte
//! that is not UTF-8 as `\xNN` (for messages only; it is never reopened). [`Bounds`] also caps
//! the entries, the depth and the time such a walk may take, so a tree built to be walked
//! forever ends in a located [`WalkError::Past`].

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::Instant;

use nix::dir::Dir;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use rustix::fs::{AtFlags, StatxFlags, statx};

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (never followed).
    Symlink,
    /// A fifo.
    Fifo,
    /// A socket.
    Socket,
    /// A character or block device.
    Device,
}

/// What the walk examined of an entry (without following it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Its kind.
    pub kind: Kind,
    /// The permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    /// Its owner.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Its link count.
    pub nlink: u64,
    /// Its size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Device and inode: its identity.
    pub id: (u64, u64),
    /// The mount it is on.
    pub mount: u64,
}

/// Why a walk could not go on.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The host ran out of a resource while reading: not the tree's fault.
    #[error("the host could not read {path}: {source}")]
    Host {
        /// The entry's relative path.
        path: String,
        /// The kernel's error.
        source: io::Error,
    },
    /// An entry cannot be examined or opened.
    #[error("{path}: cannot inspect: {source}")]
    Unreadable {
        /// The entry's relative path.
        path: String,
        /// The kernel's error.
        source: io::Error,
    },
    /// A name is not UTF-8.
    #[error("a name under {dir:?} is not UTF-8")]
    NonUtf8 {
        /// The directory's relative path.
        dir: String,
    },
    /// A directory or file was replaced between being listed and being opened.
    #[error("{path}: changed while it was walked")]
    Changed {
        /// The entry's relative path.
        path: String,
    },
    /// An entry is on another mount than the root: a mount point inside the tree.
    #[error("{path}: a mount point inside the tree; the walk does not cross it")]
    Mount {
        /// The entry's relative path.
        path: String,
    },
    /// The kind is none the walk knows.
    #[error("{path}: an entry of unknown type")]
    UnknownKind {
        /// The entry's relative path.
        path: String,
    },
    /// The walk reached one of its [`Bounds`] (entries, depth or deadline) at this entry.
    #[error("{path}: the walk went past its bound of {bound}")]
    Past {
        /// The entry's relative path.
        path: String,
        /// Which bound, in words (`1000000 entries`, `depth 256`, `its deadline`).
        bound: String,
    },
}

/// How far a walk may go and which names it takes. [`Bounds::STRICT`] is what [`walk`] and
/// [`walk_fd`] use: text names only, no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Names that are not UTF-8 are walked (shown escaped) instead of refused.
    pub any_names: bool,
    /// The most entries (the root not counted) the walk lists.
    pub entries: u64,
    /// The deepest entry it shows ([`Node::depth`]: directories above it below the root).
    pub depth: u64,
    /// When it must have ended.
    pub until: Option<Instant>,
}

impl Bounds {
    /// Text names only, no cap: a tree cordon stores, publishes or seals.
    pub const STRICT: Self = Self {
        any_names: false,
        entries: u64::MAX,
        depth: u64::MAX,
        until: None,
    };
}

/// What ended a walk whose visitor has errors of its own: the walk's finding or the visitor's.
#[derive(Debug)]
pub enum Stop<E> {
    /// The walk's own.
    Walk(WalkError),
    /// The visitor's.
    Visit(E),
}

impl<E> From<WalkError> for Stop<E> {
    fn from(e: WalkError) -> Self {
        Self::Walk(e)
    }
}

/// A failed call on `path`: the host's when it ran out of a resource, else the tree's.
fn failed(path: &str, e: impl Into<io::Error>) -> WalkError {
    let e = e.into();
    let host = [
        libc_err::EMFILE,
        libc_err::ENFILE,
        libc_err::ENOMEM,
        libc_err::ENOBUFS,
    ];
    if e.raw_os_error().is_some_and(|c| host.contains(&c)) {
        WalkError::Host {
            path: path.to_owned(),
            source: e,
        }
    } else {
        WalkError::Unreadable {
            path: path.to_owned(),
            source: e,
        }
    }
}

mod libc_err {
    pub const EMFILE: i32 = nix::libc::EMFILE;
    pub const ENFILE: i32 = nix::libc::ENFILE;
    pub const ENOMEM: i32 = nix::libc::ENOMEM;
    pub const ENOBUFS: i32 = nix::libc::ENOBUFS;
}

/// `statx` of `name` in `dir` without following it; the mount id must be reported.
fn stat_at(dir: BorrowedFd<'_>, name: &OsStr, path: &str) -> Result<Stat, WalkError> {
    let flags = if name.is_empty() {
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    let want = StatxFlags::BASIC_STATS | StatxFlags::MNT_ID;
    let x = statx(dir, name, flags, want).map_err(|e| failed(path, e))?;
    if !StatxFlags::from_bits_retain(x.stx_mask).contains(StatxFlags::MNT_ID) {
        // Without the mount id the walk cannot prove it stays on one mount: refuse — the
        // host's limit, never the tree's fault.
        return Err(WalkError::Host {
            path: path.to_owned(),
            source: io::Error::other("this kernel does not report mount ids (statx STATX_MNT_ID)"),
        });
    }
    let mode = u32::from(x.stx_mode);
    let kind = match mode & nix::libc::S_IFMT {
        nix::libc::S_IFDIR => Kind::Dir,
        nix::libc::S_IFREG => Kind::File,
        nix::libc::S_IFLNK => Kind::Symlink,
        nix::libc::S_IFIFO => Kind::Fifo,
        nix::libc::S_IFSOCK => Kind::Socket,
        nix::libc::S_IFCHR | nix::libc::S_IFBLK => Kind::Device,
        _ => {
            return Err(WalkError::UnknownKind {
                path: path.to_owned(),
            });
        }
    };
    let dev = nix::libc::makedev(x.stx_dev_major, x.stx_dev_minor);
    Ok(Stat {
        kind,
        mode: mode & 0o7777,
        uid: x.stx_uid,
        gid: x.stx_gid,
        nlink: u64::from(x.stx_nlink),
        size: x.stx_size,
        blocks: x.stx_blocks,
        id: (dev, x.stx_ino),
        mount: x.stx_mnt_id,
    })
}

/// One entry, as the visitor sees it.
#[derive(Debug)]
pub struct Node<'a> {
    /// Its path relative to the root, `/`-separated (`""` for the root).
    pub path: &'a str,
    /// Directories above it below the root (0 for the root and its entries).
    pub depth: u64,
    /// What the walk examined.
    pub stat: Stat,
    dir: BorrowedFd<'a>,
    name: &'a OsStr,
}

impl Node<'_> {
    /// Open this regular file for reading, without following a link, and prove the inode
    /// opened is the one examined: what is read is what was checked. (Its link count may have
    /// changed — a store object gains links as trees share it; a caller that requires one link
    /// checks the opened file's.) Anything but a regular file is never opened.
    ///
    /// # Errors
    /// It is not a regular file, cannot be opened, or was replaced.
    pub fn open(&self) -> Result<File, WalkError> {
        let changed = || WalkError::Changed {
            path: self.path.to_owned(),
        };
        if self.name.is_empty() || self.stat.kind != Kind::File {
            return Err(changed());
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let fd =
            openat(self.dir, self.name, flags, Mode::empty()).map_err(|e| failed(self.path, e))?;
        let again = stat_at(fd.as_fd(), OsStr::new(""), self.path)?;
        if again.id != self.stat.id || again.kind != Kind::File {
            return Err(changed());
        }
        Ok(File::from(fd))
    }

    /// Give this entry (a link itself, never its target) to `uid`:`gid`, and clear the set-id
    /// bits of a regular file: a file the previous owner made set-id never becomes the new
    /// owner's set-id program. The entry is opened (`O_PATH`, never following a link) and
    /// changed through that descriptor only after it is proven the inode examined, with the
    /// link count `nlink` (the caller's proof that no name outside its tree shares the inode)
    /// and an owner among `owners`, on that same examination: a name swapped between the walk's
    /// look and the change is refused, never followed, and another user's file moved in is
    /// never given away.
    ///
    /// # Errors
    /// It was replaced, its link count is not `nlink`, its owner is not one of `owners`, or it
    /// cannot be changed.
    pub fn chown(&self, uid: u32, gid: u32, nlink: u64, owners: &[u32]) -> Result<(), WalkError> {
        let changed = || WalkError::Changed {
            path: self.path.to_owned(),
        };
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = if self.name.is_empty() {
            self.dir
                .try_clone_to_owned()
                .map_err(|e| failed(self.path, e))?
        } else {
            openat(self.dir, self.name, flags, Mode::empty()).map_err(|e| failed(self.path, e))?
        };
        let now = stat_at(fd.as_fd(), OsStr::new(""), self.path)?;
        if now.id != self.stat.id
            || now.kind != self.stat.kind
            || now.nlink != nlink
            || !owners.contains(&now.uid)
        {
            return Err(changed());
        }
        rustix::fs::chownat(
            &fd,
            "",
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::EMPTY_PATH,
        )
        .map_err(|e| failed(self.path, e))?;
        // chown clears set-user-id, and set-group-id with group execute; what is left (a
        // set-group-id bit without it) is cleared through the same inode's descriptor link.
        let after = stat_at(fd.as_fd(), OsStr::new(""), self.path)?;
        if after.kind == Kind::File && after.mode & 0o6000 != 0 {
            let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            let mode = rustix::fs::Mode::from_raw_mode(after.mode & 0o1777);
            rustix::fs::chmod(link.as_str(), mode).map_err(|e| failed(self.path, e))?;
        }
        Ok(())
    }

    /// This symbolic link's target, read relative to its directory (never followed).
    ///
    /// # Errors
    /// It is not a link, or cannot be read.
    pub fn read_link(&self) -> Result<std::path::PathBuf, WalkError> {
        nix::fcntl::readlinkat(self.dir, self.name)
            .map(std::path::PathBuf::from)
            .map_err(|e| failed(self.path, e))
    }
}

/// Open the directory `raw` (its path's bytes; `rel` is its shown path) under `top`, one
/// component at a time without following links, and check it is still the inode that was
/// listed.
fn reopen(top: &OwnedFd, raw: &[u8], rel: &str, listed: (u64, u64)) -> Result<OwnedFd, WalkError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut fd = top.try_clone().map_err(|e| failed(rel, e))?;
    // A name never holds `/`: the bytes split back into exactly the names listed.
    for component in raw.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        fd = openat(
            fd.as_fd(),
            OsStr::from_bytes(component),
            flags,
            Mode::empty(),
        )
        .map_err(|e| failed(rel, e))?;
    }
    if stat_at(fd.as_fd(), OsStr::new(""), rel)?.id != listed {
        return Err(WalkError::Changed {
            path: rel.to_owned(),
        });
    }
    Ok(fd)
}

/// `name` as text: itself when UTF-8, else each byte that is not written `\xNN`.
fn shown(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `rel/name` (`name` alone at the root).
fn joined(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        format!("{rel}/{name}")
    }
}

/// The names in directory `fd` (`rel`), sorted by their bytes, without `.` and `..`, each with
/// its shown form; `listed` counts every name against `b`.
fn names(
    fd: &OwnedFd,
    rel: &str,
    b: &Bounds,
    listed: &mut u64,
) -> Result<Vec<(OsString, String)>, WalkError> {
    let dup = fd.try_clone().map_err(|e| failed(rel, e))?;
    let mut dir = Dir::from_fd(dup).map_err(|e| failed(rel, e))?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| failed(rel, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let text = match std::str::from_utf8(name) {
            Ok(text) => text.to_owned(),
            Err(_) if b.any_names => shown(name),
            Err(_) => {
                return Err(WalkError::NonUtf8 {
                    dir: rel.to_owned(),
                });
            }
        };
        // Counted as listed, before the directory is read to its end: one directory of
        // millions of names stops at the bound too.
        *listed += 1;
        if *listed > b.entries {
            return Err(past(&joined(rel, &text), format!("{} entries", b.entries)));
        }
        if b.until.is_some_and(|t| Instant::now() >= t) {
            return Err(past(&joined(rel, &text), "its deadline".into()));
        }
        names.push((OsString::from_vec(name.to_vec()), text));
    }
    names.sort();
    Ok(names)
}

fn past(path: &str, bound: String) -> WalkError {
    WalkError::Past {
        path: path.to_owned(),
        bound,
    }
}

/// Walk the tree at `root` (itself not followed if a link), showing `visit` the root and every
/// entry (see the module documentation). The first error, the walk's or the visitor's, ends
/// it.
///
/// # Errors
/// The walk's own ([`WalkError`], converted) or the visitor's.
pub fn walk<E: From<WalkError>>(
    root: &Path,
    visit: &mut dyn FnMut(&Node<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let top = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| failed("", e))?;
    walk_fd(&top, visit)
}

/// [`walk`] from a directory already open (`O_RDONLY | O_DIRECTORY`): for a caller that proved
/// which directory it opened (a path an untrusted user could re-point is never reopened).
///
/// # Errors
/// As [`walk`].
pub fn walk_fd<E: From<WalkError>>(
    top: &OwnedFd,
    visit: &mut dyn FnMut(&Node<'_>) -> Result<(), E>,
) -> Result<(), E> {
    walk_within(top, &Bounds::STRICT, visit)
}

/// A directory listed, to be read.
struct Pending {
    /// Its path's bytes below the root.
    raw: Vec<u8>,
    /// Its shown path.
    rel: String,
    /// Its entries' depth.
    depth: u64,
    /// Its identity when listed.
    id: (u64, u64),
}

/// [`walk_fd`] within `b`: the names it takes, and how many entries, levels and how long.
///
/// # Errors
/// As [`walk`], and [`WalkError::Past`] at the entry that reached a bound.
pub fn walk_within<E: From<WalkError>>(
    top: &OwnedFd,
    b: &Bounds,
    visit: &mut dyn FnMut(&Node<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let root_stat = stat_at(top.as_fd(), OsStr::new(""), "")?;
    visit(&Node {
        path: "",
        depth: 0,
        stat: root_stat,
        dir: top.as_fd(),
        name: OsStr::new(""),
    })?;
    let mut listed = 0;
    // Pending directories by their path's bytes, shown path, depth and listed identity: no
    // descriptor each.
    let mut stack = vec![Pending {
        raw: Vec::new(),
        rel: String::new(),
        depth: 0,
        id: root_stat.id,
    }];
    while let Some(Pending {
        raw,
        rel,
        depth,
        id,
    }) = stack.pop()
    {
        let fd = reopen(top, &raw, &rel, id)?;
        for (name, text) in names(&fd, &rel, b, &mut listed)? {
            let path = joined(&rel, &text);
            let stat = stat_at(fd.as_fd(), &name, &path)?;
            // A mount inside the tree is another tree: never walked, never reported as content.
            if stat.mount != root_stat.mount {
                return Err(WalkError::Mount { path }.into());
            }
            // Before the visitor sees it: an entry past the bound is never acted on.
            if depth > b.depth {
                return Err(past(&path, format!("depth {}", b.depth)).into());
            }
            visit(&Node {
                path: &path,
                depth,
                stat,
                dir: fd.as_fd(),
                name: &name,
            })?;
            if stat.kind == Kind::Dir {
                let mut below = raw.clone();
                if !below.is_empty() {
                    below.push(b'/');
                }
                below.extend_from_slice(name.as_bytes());
                stack.push(Pending {
                    raw: below,
                    rel: path,
                    depth: depth + 1,
                    id: stat.id,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn paths(root: &Path) -> Result<Vec<(String, Kind, u64)>, WalkError> {
        let mut out = Vec::new();
        walk::<WalkError>(root, &mut |n| {
            out.push((n.path.to_owned(), n.stat.kind, n.depth));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn every_entry_is_shown_once_without_following_a_link() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), b"x").unwrap();
        std::fs::write(d.path().join("z"), b"y").unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("a/l")).unwrap();
        let got = paths(d.path()).unwrap();
        assert_eq!(
            got,
            vec![
                (String::new(), Kind::Dir, 0),
                ("a".into(), Kind::Dir, 0),
                ("z".into(), Kind::File, 0),
                ("a/b".into(), Kind::Dir, 1),
                ("a/l".into(), Kind::Symlink, 1),
                ("a/b/f".into(), Kind::File, 2),
            ]
        );
    }

    #[test]
    fn a_root_that_is_a_link_is_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link")).unwrap();
        assert!(matches!(
            paths(&d.path().join("link")),
            Err(WalkError::Unreadable { .. })
        ));
    }

    #[test]
    fn a_non_utf8_name_is_its_own_error() {
        let d = tempfile::tempdir().unwrap();
        let name = std::ffi::OsStr::from_bytes(b"bad\xff");
        std::fs::write(d.path().join(name), b"").unwrap();
        assert!(matches!(paths(d.path()), Err(WalkError::NonUtf8 { .. })));
    }

    /// With [`Bounds::any_names`], a name of any bytes is walked: every call on it uses its
    /// bytes (its file opens, its directory is entered) and its shown path escapes them.
    #[test]
    fn any_names_walks_every_name_by_its_bytes_and_shows_it_escaped() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join(std::ffi::OsStr::from_bytes(b"d\xff"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(std::ffi::OsStr::from_bytes(b"f\xfe\x1b")), b"x").unwrap();
        let top = top(d.path());
        let b = Bounds {
            any_names: true,
            ..Bounds::STRICT
        };
        let mut got = Vec::new();
        walk_within::<WalkError>(&top, &b, &mut |n| {
            if n.stat.kind == Kind::File {
                let mut text = String::new();
                io::Read::read_to_string(&mut n.open()?, &mut text).unwrap();
                assert_eq!(text, "x");
            }
            got.push(n.path.to_owned());
            Ok(())
        })
        .unwrap();
        assert_eq!(got, ["", "d\\xff", "d\\xff/f\\xfe\u{1b}"]);
    }

    /// Each bound ends the walk at the entry that reached it, named.
    #[test]
    fn a_walk_past_its_entries_depth_or_deadline_ends_at_that_entry() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b/c")).unwrap();
        std::fs::write(d.path().join("z"), b"").unwrap();
        let top = top(d.path());
        let past = |b: Bounds| match walk_within::<WalkError>(&top, &b, &mut |_| Ok(())) {
            Err(e @ WalkError::Past { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        let all = |b: Bounds| walk_within::<WalkError>(&top, &b, &mut |_| Ok(())).is_ok();
        let entries = |entries| Bounds {
            entries,
            ..Bounds::STRICT
        };
        assert!(all(entries(4)));
        assert_eq!(
            past(entries(3)),
            "a/b/c: the walk went past its bound of 3 entries"
        );
        let depth = |depth| Bounds {
            depth,
            ..Bounds::STRICT
        };
        assert!(all(depth(2)));
        assert_eq!(
            past(depth(1)),
            "a/b/c: the walk went past its bound of depth 1"
        );
        let late = Bounds {
            until: Some(Instant::now()),
            ..Bounds::STRICT
        };
        // At the first name listed (in the directory's own order, before sorting).
        assert!(past(late).ends_with(": the walk went past its bound of its deadline"));
    }

    #[test]
    fn an_opened_file_is_the_one_examined() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"first").unwrap();
        let mut seen = Vec::new();
        walk::<WalkError>(d.path(), &mut |n| {
            if n.stat.kind == Kind::File {
                // Swapped after it was examined, before it is opened (the old inode kept, so
                // the new file cannot reuse its number).
                std::fs::rename(d.path().join("f"), d.path().join("f.old")).unwrap();
                std::fs::write(d.path().join("f"), b"second").unwrap();
                seen.push(n.open().map(|_| ()));
            }
            Ok(())
        })
        .unwrap();
        assert!(
            matches!(&seen[..], [Err(WalkError::Changed { .. })]),
            "{seen:?}"
        );
    }

    /// A file that gains a link between its examination and its opening is still the file
    /// examined (a store object shared by another tree); anything but a regular file is never
    /// opened.
    #[test]
    fn an_open_follows_the_inode_not_its_link_count_and_never_opens_a_non_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("f", d.path().join("l")).unwrap();
        let mut seen = Vec::new();
        walk::<WalkError>(d.path(), &mut |n| {
            if n.path == "f" {
                std::fs::hard_link(d.path().join("f"), d.path().join("g")).unwrap();
            }
            if !n.path.is_empty() && n.path != "g" {
                seen.push((n.path.to_owned(), n.open().is_ok()));
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [("f".to_owned(), true), ("l".to_owned(), false)]);
    }

    fn listed(path: &Path) -> (u64, u64) {
        let st = nix::sys::stat::stat(path).unwrap();
        (st.st_dev, st.st_ino)
    }

    fn top(path: &Path) -> OwnedFd {
        nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap()
    }

    /// A pending directory whose name became a symbolic link to it (same inode) is not
    /// followed: the reopen is refused, never steered through a link.
    #[test]
    fn a_directory_replaced_by_a_link_to_itself_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let top = top(d.path());
        let was = listed(&d.path().join("a"));
        reopen(&top, b"a", "a", was).unwrap();
        std::fs::rename(d.path().join("a"), d.path().join("b")).unwrap();
        std::os::unix::fs::symlink("b", d.path().join("a")).unwrap();
        assert!(matches!(
            reopen(&top, b"a", "a", was),
            Err(WalkError::Unreadable { .. })
        ));
    }

    #[test]
    fn a_directory_swapped_for_another_is_refused_as_changed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let top = top(d.path());
        assert!(matches!(
            reopen(&top, b"a", "a", listed(d.path())),
            Err(WalkError::Changed { .. })
        ));
    }

    #[test]
    fn running_out_of_a_host_resource_is_the_hosts_error() {
        for e in [
            nix::errno::Errno::EMFILE,
            nix::errno::Errno::ENFILE,
            nix::errno::Errno::ENOMEM,
            nix::errno::Errno::ENOBUFS,
        ] {
            assert!(matches!(failed("x", e), WalkError::Host { .. }), "{e}");
        }
        assert!(matches!(
            failed("x", nix::errno::Errno::EACCES),
            WalkError::Unreadable { .. }
        ));
    }
}

/// Root only (the root tier): mounting needs it.
#[cfg(test)]
mod root_tests {
    use super::*;

    /// A tmpfs mounted inside the tree is refused, never walked; without the mount the same
    /// directory is walked (the check, not the directory, refuses it).
    #[test]
    fn a_mount_inside_the_tree_is_refused() {
        cordon_testkit::require_root("the walk's mount check mounts a tmpfs inside a tree");
        let d = tempfile::tempdir().unwrap();
        let inner = d.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        let walked = |root: &Path| walk::<WalkError>(root, &mut |_| Ok(()));
        walked(d.path()).unwrap();
        let host = crate::host::Linux;
        crate::host::Host::mount(
            &host,
            &crate::host::MountRequest::Tmpfs {
                target: inner.clone(),
                options: "size=1m,mode=0755".into(),
            },
        )
        .unwrap();
        let got = walked(d.path());
        crate::host::Host::unmount(&host, &inner).unwrap();
        assert!(
            matches!(got, Err(WalkError::Mount { ref path }) if path == "inner"),
            "{got:?}"
        );
    }
}
