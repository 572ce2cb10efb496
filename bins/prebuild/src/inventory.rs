//! The inventory of a staging area after the build container has exited, on the one tree
//! walk ([`cordon::walk`]: by file descriptors, never across a mount), so nothing the candidate
//! left — a symbolic link, a rename race — can steer the host outside it.
//!
//! Only regular files and directories are admitted. Refused: symbolic links, hard links (a
//! link count above one), fifos, sockets, devices, setuid/setgid bits, sparse files (fewer
//! blocks than bytes), non-UTF-8 names, and anything over the policy's bounds (files, total
//! bytes, bytes per file, depth, path length). Every file is opened once, checked to be the
//! inode that was listed, and handed on as an open descriptor, so what is copied is what was
//! checked. Nothing is ever executed or loaded. A host-side resource error (out of descriptors
//! or memory), or a mount inside the staging area (which only the host can make), is
//! [`InventoryError::Host`], never the candidate's refusal.

use std::fs::File;
use std::path::Path;

use cordon::walk::{Kind, Node, WalkError, walk};

/// The publication bounds (policy `publication …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Files at most.
    pub max_files: u64,
    /// Total bytes at most.
    pub max_bytes: u64,
    /// Bytes of one file at most.
    pub max_file_bytes: u64,
    /// Path components at most.
    pub max_depth: u64,
    /// Path bytes at most.
    pub max_path_length: u64,
}

/// Why a publication is refused (the candidate's build produced it: a rejection).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {path}: {message}")]
pub struct Refused {
    /// Stable reason code, `publication.<rule>`.
    pub code: &'static str,
    /// The path in the staging area.
    pub path: String,
    /// The sentence.
    pub message: String,
}

/// An inventoried file, open.
#[derive(Debug)]
pub struct Item {
    /// Relative path.
    pub path: String,
    /// Whether any executable bit is set.
    pub executable: bool,
    /// Bytes.
    pub size: u64,
    /// The open file (the inode that was checked).
    pub file: File,
}

fn refuse(code: &'static str, path: &str, message: impl Into<String>) -> InventoryError {
    InventoryError::Refused(Refused {
        code,
        path: path.to_owned(),
        message: message.into(),
    })
}

/// Why an inventory ended without a list.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The staging area breaks a rule: the candidate's build produced it.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The host ran out of a resource while reading it, or found a mount inside it: not the
    /// candidate's fault.
    #[error("the host could not inventory the staging area: {0}")]
    Host(WalkError),
}

impl From<WalkError> for InventoryError {
    /// What the walk found in the staging area is the candidate's, except what only the host
    /// can cause.
    fn from(e: WalkError) -> Self {
        match e {
            // The inventory walks unbounded ([`Bounds::STRICT`]); its own bounds are the
            // visitor's, so a walk's bound is never the candidate's finding.
            WalkError::Host { .. } | WalkError::Mount { .. } | WalkError::Past { .. } => {
                Self::Host(e)
            }
            WalkError::Unreadable { path, source } => refuse(
                "publication.unreadable",
                &path,
                format!("cannot inspect: {source}"),
            ),
            WalkError::NonUtf8 { dir } => {
                refuse("publication.non-utf8", &dir, "a name is not UTF-8")
            }
            WalkError::Changed { path } => refuse(
                "publication.changed",
                &path,
                "it changed while it was inventoried",
            ),
            WalkError::UnknownKind { path } => refuse(
                "publication.entry-type",
                &path,
                "only regular files and directories are admitted",
            ),
        }
    }
}

/// The rules for one entry; an admitted file is opened and added to `items`.
fn admit(
    n: &Node<'_>,
    b: &Bounds,
    items: &mut Vec<Item>,
    total: &mut u64,
) -> Result<(), InventoryError> {
    let (path, st) = (n.path, &n.stat);
    if path.is_empty() {
        return Ok(());
    }
    if path.len() as u64 > b.max_path_length {
        return Err(refuse(
            "publication.path-too-long",
            path,
            format!("longer than {} bytes", b.max_path_length),
        ));
    }
    if st.mode & 0o6000 != 0 {
        return Err(refuse(
            "publication.special-mode",
            path,
            format!("mode {:o} has a setuid or setgid bit", st.mode),
        ));
    }
    let code = match st.kind {
        Kind::Dir if n.depth + 1 >= b.max_depth => Some((
            "publication.too-deep",
            format!("deeper than {} components", b.max_depth),
        )),
        Kind::Dir => return Ok(()),
        Kind::File => None,
        Kind::Symlink => Some((
            "publication.symlink",
            "symbolic links are not admitted".into(),
        )),
        Kind::Fifo => Some(("publication.fifo", "fifos are not admitted".into())),
        Kind::Socket => Some(("publication.socket", "sockets are not admitted".into())),
        Kind::Device => Some(("publication.device", "devices are not admitted".into())),
    };
    if let Some((code, msg)) = code {
        return Err(refuse(code, path, msg));
    }
    if st.nlink > 1 {
        return Err(refuse(
            "publication.hardlink",
            path,
            format!("{} links to one file", st.nlink),
        ));
    }
    let allocated = st.blocks.saturating_mul(512);
    if allocated < st.size {
        return Err(refuse(
            "publication.sparse",
            path,
            format!("{} bytes in {allocated} allocated", st.size),
        ));
    }
    if st.size > b.max_file_bytes {
        return Err(refuse(
            "publication.file-too-big",
            path,
            format!("{} bytes exceeds {}", st.size, b.max_file_bytes),
        ));
    }
    *total += st.size;
    if *total > b.max_bytes {
        return Err(refuse(
            "publication.too-big",
            path,
            format!("the publication exceeds {} bytes", b.max_bytes),
        ));
    }
    if items.len() as u64 >= b.max_files {
        return Err(refuse(
            "publication.too-many-files",
            path,
            format!("more than {} files", b.max_files),
        ));
    }
    // The inode opened is the inode listed (nothing swapped it in between), and it still has
    // one link (none was made to it since).
    let file = n.open()?;
    let links = std::os::unix::fs::MetadataExt::nlink(&file.metadata().map_err(|source| {
        InventoryError::Host(WalkError::Host {
            path: path.to_owned(),
            source,
        })
    })?);
    if links > 1 {
        return Err(refuse(
            "publication.hardlink",
            path,
            format!("{links} links to one file"),
        ));
    }
    items.push(Item {
        path: path.to_owned(),
        executable: st.mode & 0o111 != 0,
        size: st.size,
        file,
    });
    Ok(())
}

/// Inventory the staging area at `root`.
///
/// # Errors
/// The first rule broken, or the host failed.
pub fn inventory(root: &Path, b: &Bounds) -> Result<Vec<Item>, InventoryError> {
    let mut items = Vec::new();
    let mut total = 0u64;
    walk(root, &mut |n| admit(n, b, &mut items, &mut total))?;
    items.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;

    /// The refusal code of an inventory of `dir` under `b`, or "ok".
    fn outcome(dir: &Path, b: &Bounds) -> String {
        match inventory(dir, b) {
            Ok(_) => "ok".into(),
            Err(InventoryError::Refused(r)) => r.code.to_owned(),
            Err(e) => panic!("a host error: {e}"),
        }
    }

    /// A fresh directory holding `files` (relative path → bytes).
    fn staged(files: &[(&str, usize)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, len) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![b'x'; *len]).unwrap();
        }
        dir
    }

    /// Each bound admits exactly its value and refuses one more.
    #[test]
    fn every_bound_admits_its_value_and_refuses_one_more() {
        let b = Bounds {
            max_files: 3,
            max_bytes: 30,
            max_file_bytes: 20,
            max_depth: 3,
            max_path_length: 12,
        };
        let cases: [(&[(&str, usize)], &str); 10] = [
            (&[("a", 1), ("b", 1), ("c", 1)], "ok"),
            (
                &[("a", 1), ("b", 1), ("c", 1), ("d", 1)],
                "publication.too-many-files",
            ),
            (&[("a", 20), ("b", 10)], "ok"),
            (&[("a", 20), ("b", 11)], "publication.too-big"),
            (&[("a", 20)], "ok"),
            (&[("a", 21)], "publication.file-too-big"),
            (&[("d1/d2/f", 1)], "ok"),
            (&[("d1/d2/d3/f", 1)], "publication.too-deep"),
            (&[("abcdefghijkl", 1)], "ok"),
            (&[("abcdefghijklm", 1)], "publication.path-too-long"),
        ];
        for (files, want) in cases {
            let dir = staged(files);
            assert_eq!(outcome(dir.path(), &b), want, "{files:?}");
        }
    }

    /// Every kind of entry but a regular file or directory, and every special shape of a file,
    /// is refused with its own code; what is admitted is listed sorted, sized and marked
    /// executable by any execute bit.
    #[test]
    fn each_forbidden_entry_has_its_own_code_and_admitted_files_are_described() {
        let b = bounds();
        let dir = staged(&[("f", 4)]);
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        assert_eq!(outcome(dir.path(), &b), "publication.symlink");
        let dir = staged(&[("f", 4)]);
        std::fs::hard_link(dir.path().join("f"), dir.path().join("g")).unwrap();
        assert_eq!(outcome(dir.path(), &b), "publication.hardlink");
        let dir = staged(&[]);
        nix::unistd::mkfifo(&dir.path().join("p"), Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(outcome(dir.path(), &b), "publication.fifo");
        let dir = staged(&[]);
        let _sock = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        assert_eq!(outcome(dir.path(), &b), "publication.socket");
        for mode in [0o4755, 0o2755] {
            let dir = staged(&[("f", 4)]);
            std::fs::set_permissions(dir.path().join("f"), std::fs::Permissions::from_mode(mode))
                .unwrap();
            assert_eq!(
                outcome(dir.path(), &b),
                "publication.special-mode",
                "{mode:o}"
            );
        }
        let dir = staged(&[]);
        let f = File::create(dir.path().join("sparse")).unwrap();
        f.set_len(1 << 16).unwrap();
        assert_eq!(outcome(dir.path(), &b), "publication.sparse");
        let dir = staged(&[]);
        let name = std::ffi::OsStr::from_bytes(b"bad\xff");
        std::fs::write(dir.path().join(name), b"x").unwrap();
        assert_eq!(outcome(dir.path(), &b), "publication.non-utf8");
        // Admitted: sorted, sized, executable by any x bit (the owner's alone for `b/x`; readable,
        // so that the inventory reads it without root as the stage, as root, always can).
        let dir = staged(&[("b/x", 3), ("a", 5), ("c", 0)]);
        for (path, mode) in [("a", 0o644), ("b/x", 0o500), ("c", 0o755)] {
            std::fs::set_permissions(dir.path().join(path), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        let items = inventory(dir.path(), &b).unwrap();
        let seen: Vec<(&str, u64, bool)> = items
            .iter()
            .map(|i| (i.path.as_str(), i.size, i.executable))
            .collect();
        assert_eq!(seen, [("a", 5, false), ("b/x", 3, true), ("c", 0, true)]);
    }

    /// The staging root itself is opened without following a link: a link to a directory is
    /// never inventoried as if it were the staging area.
    #[test]
    fn a_root_that_is_a_link_is_refused() {
        let dir = staged(&[("real/f", 1)]);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("real", &link).unwrap();
        inventory(&dir.path().join("real"), &bounds()).unwrap();
        match inventory(&link, &bounds()) {
            Err(InventoryError::Refused(r)) => assert_eq!(r.code, "publication.unreadable"),
            other => panic!("a link must not be followed: {other:?}"),
        }
    }

    fn bounds() -> Bounds {
        Bounds {
            max_files: 10_000,
            max_bytes: 1 << 20,
            max_file_bytes: 1 << 20,
            max_depth: 16,
            max_path_length: 512,
        }
    }

    /// 1500 sibling directories (within every bound) under a soft limit of 256 descriptors:
    /// a walk that held one descriptor per pending directory ran out (EMFILE) and blamed the
    /// candidate. The limit is this test process's own (nextest runs each test alone).
    #[test]
    fn many_sibling_directories_need_no_descriptor_each() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..1500 {
            let d = dir.path().join(format!("d{i:04}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("f"), b"x").unwrap();
        }
        let (_, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 256, hard)
            .unwrap();
        let mut b = bounds();
        b.max_files = 100;
        // The file bound is met long before the descriptor limit would be by open files.
        match inventory(dir.path(), &b) {
            Err(InventoryError::Refused(r)) => assert_eq!(r.code, "publication.too-many-files"),
            other => panic!("expected the file bound, got {other:?}"),
        }
        let empty = tempfile::tempdir().unwrap();
        for i in 0..1500 {
            std::fs::create_dir(empty.path().join(format!("d{i:04}"))).unwrap();
        }
        assert!(inventory(empty.path(), &bounds()).unwrap().is_empty());
    }
}

#[cfg(test)]
mod root_tests {
    //! Entries only root can make (root, as CI runs).

    use super::*;
    use nix::sys::stat::{Mode, SFlag};

    /// A device node left in staging is refused as a device (`mknod` needs root).
    #[test]
    fn a_device_node_is_refused_as_a_device() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test makes a device node: run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        nix::sys::stat::mknod(
            &dir.path().join("null"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
        let b = Bounds {
            max_files: 10,
            max_bytes: 1 << 20,
            max_file_bytes: 1 << 20,
            max_depth: 4,
            max_path_length: 64,
        };
        match inventory(dir.path(), &b) {
            Err(InventoryError::Refused(r)) => assert_eq!(r.code, "publication.device"),
            other => panic!("a device must be refused as one: {other:?}"),
        }
    }
}
