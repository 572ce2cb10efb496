//! The validator-owned store: one directory (root-owned, mode 0700) holding content-addressed
//! file objects, intake and archive records, trees, publications, receipts, the evidence
//! receipts name, quarantine records and leases.
//!
//! This module owns the store's layout and its durable-write discipline (brief §5): every entry
//! is first written under `tmp/` (create-exclusive, no-follow, explicit mode), fsynced, then
//! published by hard link or rename-no-replace, its parent fsynced, and reopened and re-hashed.
//! A published name is never replaced: two writers of the same content race to one name and the
//! loser checks that what won is what it meant to write.
//!
//! Crash safety: only entries under `tmp/` are ever incomplete. Each writer holds an exclusive
//! `flock` on `tmp/<token>.lock` for as long as its scratch directory `tmp/<token>/` lives; the
//! next [`Store::open`] removes every scratch directory whose lock it can take, so a writer that
//! died is cleaned up and a live one is left alone. Content objects published before a crash are
//! valid objects (their name is their hash); nothing refers to them until a record is published,
//! so they cannot be mistaken for a completed intake.
//!
//! Every opener holds an `flock` on the store's root directory, shared, for as long as its
//! [`Store`] lives; the collector ([`crate::gc`]) alone opens without it and takes it
//! exclusive, so nothing it removes as unnamed is in use or about to be named.
//!
//! It does not decide what is admissible (intake and materialization do) and never follows a
//! symbolic link inside the store.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag, RenameFlags, renameat2};
use nix::sys::stat::{UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;

use crate::canonical::Digest;
use crate::walk::{Kind, Node, Stop, walk};

/// The subdirectories of a store, created by [`Store::open`].
pub const LAYOUT: [&str; 12] = [
    "objects",
    "images",
    "intake",
    "archives",
    "trees",
    "publications",
    "receipts",
    "evidence",
    "quarantine",
    "incidents",
    "leases",
    "tmp",
];

/// The section holding every stored receipt (`<hex>.json`) and its signature.
pub const RECEIPTS: &str = "receipts";

/// The section holding what receipts name as evidence (logs, the host's records of a run):
/// content-addressed like `objects/` but apart from it, so no tree or publication can name a
/// log and a rejection's logs never read as content it added.
pub const EVIDENCE: &str = "evidence";

/// Why a store operation failed. Every variant is an infrastructure failure: the stage could
/// not establish its result (no-decision), never a verdict on a candidate.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StoreError {
    /// A filesystem call on a store path failed.
    #[error("store operation {op} failed on {path}")]
    #[diagnostic(code(cordon::store::io))]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The store root, or an entry in it, is not what the store itself writes.
    #[error("store entry {path} is unsafe: {why}")]
    #[diagnostic(
        code(cordon::store::unsafe_entry),
        help(
            "the store must be a directory owned by the running user (root in production), mode 0700, with no symbolic links; inspect it by hand, cordon never repairs it"
        )
    )]
    Unsafe {
        /// The offending path.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A command that only reads a store was given a path that holds none.
    #[error("no store at {path}")]
    #[diagnostic(
        code(cordon::store::missing),
        help(
            "a command that reads a store never creates one: check --store (or the policy's `store` path); a stage that runs work creates it"
        )
    )]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// The collector was asked for a store that writers hold.
    #[error("the store {path} is in use, held by {holders}")]
    #[diagnostic(
        code(cordon::store::busy),
        help(
            "a store is collected only while no stage writes it: run it again when they have ended (a timer's next run will)"
        )
    )]
    Busy {
        /// The store's root.
        path: PathBuf,
        /// Who holds it, by pid and command.
        holders: String,
    },
    /// A published entry differs from what was meant to be written under its name.
    #[error("store entry {path} does not match its name: expected {expected}, found {found}")]
    #[diagnostic(
        code(cordon::store::mismatch),
        help("the store has been tampered with or the disk is failing; quarantine it")
    )]
    Mismatch {
        /// The entry.
        path: PathBuf,
        /// What its name promises.
        expected: String,
        /// What is there.
        found: String,
    },
}

impl crate::exit::ExitClass for StoreError {
    /// A store that is not there is the operator's path (2); anything else cordon could not
    /// establish of one is a no-decision (3).
    fn exit_class(&self) -> crate::ExitCode {
        match self {
            Self::Missing { .. } => crate::ExitCode::Usage,
            Self::Io { .. } | Self::Unsafe { .. } | Self::Mismatch { .. } | Self::Busy { .. } => {
                crate::ExitCode::NoDecision
            }
        }
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError + use<> {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

fn nix_err(op: &'static str, path: &Path) -> impl FnOnce(nix::Error) -> StoreError + use<> {
    let path = path.to_path_buf();
    move |e| StoreError::Io {
        op,
        path,
        source: io::Error::from(e),
    }
}

/// A fully written file in a scratch directory, ready to become a content object.
#[derive(Debug, Clone)]
pub struct Staged {
    /// Where it is.
    pub path: PathBuf,
    /// The sha256 of its contents, computed while it was written.
    pub sha256: Digest,
    /// Whether it becomes the executable (0555) variant.
    pub executable: bool,
}

/// Content objects written into one scratch directory and published together by
/// [`Store::publish_objects`] when committed; dropping it uncommitted publishes nothing.
#[derive(Debug)]
pub struct Batch<'s> {
    store: &'s Store,
    scratch: Scratch,
    items: Vec<Staged>,
    queued: std::collections::BTreeSet<(Digest, bool)>,
}

impl Batch<'_> {
    /// Queued, or a regular file under the object's name (a link planted there is not the
    /// object: the write goes ahead, and its re-verification refuses the link).
    fn present(&self, sha: &Digest, executable: bool) -> bool {
        self.queued.contains(&(*sha, executable))
            || fs::symlink_metadata(self.store.object_path(sha, executable))
                .is_ok_and(|m| m.is_file())
    }

    /// Copy a reader into a new object (hashing as it goes); returns its sha256 and size. An
    /// object already in the store or the batch is not written twice.
    ///
    /// # Errors
    /// Reading or writing failed.
    pub fn add_reader(
        &mut self,
        mut src: impl Read,
        executable: bool,
    ) -> Result<(Digest, u64), StoreError> {
        use sha2::Digest as _;
        let (staged, mut file) = self.scratch.create_file()?;
        let mut hasher = sha2::Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut size = 0u64;
        loop {
            let n = src
                .read(&mut buf)
                .map_err(io_err("copy into scratch", &staged))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
            file.write_all(&buf[..n])
                .map_err(io_err("copy into scratch", &staged))?;
        }
        let sha = Digest::from_hasher(hasher);
        if self.present(&sha, executable) {
            fs::remove_file(&staged).map_err(io_err("unlink", &staged))?;
        } else {
            self.queued.insert((sha, executable));
            self.items.push(Staged {
                path: staged,
                sha256: sha,
                executable,
            });
        }
        Ok((sha, size))
    }

    /// Make sure the object exists in the requested mode variant, copying the other variant.
    ///
    /// # Errors
    /// The other variant is missing, or writing failed.
    pub fn ensure_variant(&mut self, sha: &Digest, executable: bool) -> Result<(), StoreError> {
        if self.present(sha, executable) {
            return Ok(());
        }
        let bytes = self.store.read_object(sha, !executable)?;
        self.add_reader(bytes.as_slice(), executable).map(|_| ())
    }

    /// Publish everything added.
    ///
    /// # Errors
    /// As [`Store::publish_objects`].
    pub fn commit(self) -> Result<(), StoreError> {
        self.store.publish_objects(&self.items)
    }
}

/// An opened store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// Opened by a command that only reads it ([`Store::open_existing`]).
    reader: bool,
    /// A shared `flock` on the store's root directory, held for as long as any clone lives
    /// (by every opener but the collector, [`Store::open_to_collect`], which holds it
    /// exclusive while it changes anything): nothing the collector removes as unnamed can be
    /// about to be named by a receipt, or read, while it runs.
    _hold: Option<std::sync::Arc<Flock<File>>>,
}

/// A writer's private scratch directory under `tmp/`, removed when dropped. While it lives its
/// lock is held, so [`Store::open`] in another process leaves it alone.
#[derive(Debug)]
pub struct Scratch {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: Flock<File>,
    next: u64,
}

impl Scratch {
    /// The directory itself.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Create a new empty file in the scratch directory: create-exclusive, no-follow, mode 0600.
    ///
    /// # Errors
    /// The file could not be created.
    pub fn create_file(&mut self) -> Result<(PathBuf, File), StoreError> {
        self.next += 1;
        let path = self.dir.join(format!("f{}", self.next));
        let file = create_exclusive(&path, 0o600)?;
        Ok((path, file))
    }

    /// A fresh name in the scratch directory that does not exist yet.
    #[must_use]
    pub fn fresh_name(&mut self, stem: &str) -> PathBuf {
        self.next += 1;
        self.dir.join(format!("{stem}{}", self.next))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: anything left here is removed by the next Store::open, because the lock
        // is released with this value.
        let _ = remove_tree(&self.dir);
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// Create `path` exclusively (never following a link, never reusing an existing file) with an
/// explicit mode.
///
/// # Errors
/// The file exists, or the call failed.
pub fn create_exclusive(path: &Path, mode: u32) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .write(true)
        .read(true)
        .create_new(true)
        .mode(mode)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(io_err("create", path))?;
    // The umask may have cleared bits of `mode`; set it exactly.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", path))?;
    Ok(file)
}

/// Open an existing regular file for reading without following a final symbolic link.
///
/// # Errors
/// The file is missing, a link, or not regular.
pub fn open_nofollow(path: &Path) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(io_err("open", path))?;
    let meta = file.metadata().map_err(io_err("stat", path))?;
    if !meta.file_type().is_file() {
        return Err(StoreError::Unsafe {
            path: path.to_path_buf(),
            why: "not a regular file".to_owned(),
        });
    }
    Ok(file)
}

/// fsync a directory so that a name created or removed in it is durable.
///
/// # Errors
/// The directory could not be opened or synced.
pub fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(dir)
        .map_err(io_err("open directory", dir))?;
    f.sync_all().map_err(io_err("fsync directory", dir))
}

/// Set a path's access and modification times to the epoch without following a link: store
/// entries carry no time, so two stores holding the same content are byte- and stat-identical.
///
/// # Errors
/// The call failed.
pub fn zero_mtime(path: &Path) -> Result<(), StoreError> {
    let zero = TimeSpec::new(0, 0);
    utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &zero,
        &zero,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(nix_err("set times", path))
}

/// Rename `from` to `to`, failing if `to` exists (never replacing a published entry).
///
/// # Errors
/// `to` exists ([`io::ErrorKind::AlreadyExists`] inside [`StoreError::Io`]) or the call failed.
pub fn rename_noreplace(from: &Path, to: &Path) -> Result<(), StoreError> {
    renameat2(
        nix::fcntl::AT_FDCWD,
        from,
        nix::fcntl::AT_FDCWD,
        to,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(nix_err("rename without replace", to))
}

/// Whether a store error is "the name is already taken".
#[must_use]
pub fn is_exists(err: &StoreError) -> bool {
    matches!(err, StoreError::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists)
}

/// Remove a directory tree without following links out of it and without crossing a mount
/// point: an entry on another filesystem than `path` itself (a tmpfs or overlay still mounted
/// inside, say) is an error, never emptied — it may be someone's live mount. Not on the one tree
/// walk: what it removes (a lease's run directory, its staging) may hold any name a candidate
/// wrote, UTF-8 or not, and removal must never be refused for a name.
///
/// # Errors
/// Something could not be removed, or a mount point was found inside.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match placed(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok((false, _)) => fs::remove_file(path),
        Ok((true, mount)) => remove_tree_on(path, mount),
    }
}

/// Whether `path` (not followed) is a directory, and the id of the mount it is on (`statx`
/// `STATX_MNT_ID`): what tells a mount point. A device number does not: overlayfs reports a
/// lower or upper layer's device for its files, so every file of a run directory on an
/// overlay root would read as a mount point.
///
/// # Errors
/// It cannot be examined, or the kernel does not report mount ids (Linux before 5.8).
fn placed(path: &Path) -> io::Result<(bool, u64)> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let x = statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::TYPE | StatxFlags::MNT_ID,
    )?;
    if !StatxFlags::from_bits_retain(x.stx_mask).contains(StatxFlags::MNT_ID) {
        return Err(io::Error::other(
            "this kernel does not report mount ids (statx STATX_MNT_ID)",
        ));
    }
    let dir = u32::from(x.stx_mode) & nix::libc::S_IFMT == nix::libc::S_IFDIR;
    Ok((dir, x.stx_mnt_id))
}

/// [`remove_tree`] of every entry of directory `path` but the one named `keep`, with the same
/// refusal to cross a mount point (relative to `path` itself); `path` and `keep` stay.
///
/// # Errors
/// As [`remove_tree`].
pub fn remove_entries_except(path: &Path, keep: &str) -> io::Result<()> {
    let (_, mount) = placed(path)?;
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        if entry.file_name() != keep {
            remove_tree_on(&entry.path(), mount)?;
        }
    }
    Ok(())
}

/// [`remove_tree`] on mount `mount`: an entry already gone (another cleaner of the same stale
/// scratch got there first) is removed.
fn remove_tree_on(path: &Path, mount: u64) -> io::Result<()> {
    match remove_tree_below(path, mount) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn remove_tree_below(path: &Path, mount: u64) -> io::Result<()> {
    let (dir, on) = placed(path)?;
    if on != mount {
        return Err(io::Error::other(format!(
            "{} is a mount point: not crossing it",
            path.display()
        )));
    }
    if !dir {
        return fs::remove_file(path);
    }
    // A tree published read-only (0555 directories) must be made writable before its entries can
    // be unlinked by a non-root owner; root ignores the mode but the chmod is harmless.
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o700));
    for entry in fs::read_dir(path)? {
        remove_tree_on(&entry?.path(), mount)?;
    }
    fs::remove_dir(path)
}

impl Store {
    /// Open the store at `root`, creating it (mode 0700) and its layout if missing, checking
    /// that it is a directory owned by the running user with mode exactly 0700, and removing
    /// scratch entries left by writers that died.
    ///
    /// # Errors
    /// The root is unsafe or cannot be created.
    pub fn open(root: &Path) -> Result<Self, StoreError> {
        match fs::symlink_metadata(root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                    fs::create_dir_all(parent).map_err(io_err("create parent", parent))?;
                }
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(root)
                    .map_err(io_err("create store", root))?;
                fs::set_permissions(root, fs::Permissions::from_mode(0o700))
                    .map_err(io_err("chmod", root))?;
            }
            Err(e) => return Err(io_err("stat", root)(e)),
            Ok(_) => {}
        }
        // Held before anything is made or cleaned: a collection in progress is waited for.
        let store = Self::checked_root(root)?.held()?;
        let root = &store.root;
        for sub in LAYOUT {
            let path = root.join(sub);
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => fsync_dir(root)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("create", &path)(e)),
            }
            store.check_dir(&path, 0o700)?;
        }
        store.clean_stale()?;
        Ok(store)
    }

    /// The store's root directory, opened without following a link, checked to be the
    /// directory [`Store::checked_root`] checked (same device and inode).
    fn root_dir(&self) -> Result<File, StoreError> {
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&self.root)
            .map_err(io_err("open", &self.root))?;
        let opened = dir.metadata().map_err(io_err("stat", &self.root))?;
        let named = fs::symlink_metadata(&self.root).map_err(io_err("stat", &self.root))?;
        if (opened.dev(), opened.ino()) != (named.dev(), named.ino()) {
            return Err(StoreError::Unsafe {
                path: self.root.clone(),
                why: "it changed while it was being opened".to_owned(),
            });
        }
        Ok(dir)
    }

    /// This store holding its root shared: at once, or, while a collection holds it, after
    /// one line saying who holds it.
    fn held(self) -> Result<Self, StoreError> {
        let dir = self.root_dir()?;
        let held = match Flock::lock(dir, FlockArg::LockSharedNonblock) {
            Ok(held) => held,
            Err((dir, nix::errno::Errno::EWOULDBLOCK)) => {
                crate::voice::say(
                    &mut io::stderr(),
                    crate::voice::Level::Normal,
                    &format!(
                        "waiting for the store {}, held by {} (a collection: cordon-reap --gc)",
                        self.root.display(),
                        crate::lease::lock_holders_named(&dir)
                    ),
                );
                Flock::lock(dir, FlockArg::LockShared)
                    .map_err(|(_, e)| nix_err("lock", &self.root)(e))?
            }
            Err((_, e)) => return Err(nix_err("lock", &self.root)(e)),
        };
        Ok(Self {
            _hold: Some(std::sync::Arc::new(held)),
            ..self
        })
    }

    /// Hold the whole store for the collector: its root exclusive, without waiting, so no
    /// other opener is in flight while it lives and none starts (each waits for it).
    ///
    /// # Errors
    /// [`StoreError::Busy`] naming the holders while any other opener holds the store, or the
    /// lock could not be taken.
    pub fn hold_exclusive(&self) -> Result<Flock<File>, StoreError> {
        let dir = self.root_dir()?;
        Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(|(dir, e)| {
            if e == nix::errno::Errno::EWOULDBLOCK {
                StoreError::Busy {
                    path: self.root.clone(),
                    holders: crate::lease::lock_holders_named(&dir),
                }
            } else {
                nix_err("lock", &self.root)(e)
            }
        })
    }

    /// Open the store at `root` for a command that reads it: as [`Store::open`] checks it, but
    /// nothing is created or removed (no layout, no scratch cleaning), and a path that holds no
    /// store — nothing there, or a directory without the store's layout — is
    /// [`StoreError::Missing`].
    ///
    /// # Errors
    /// There is no store at `root`, or it is unsafe.
    pub fn open_existing(root: &Path) -> Result<Self, StoreError> {
        Self::existing(root, true)
    }

    /// [`Store::open_existing`] for the collector alone: the same checks, and no shared hold,
    /// so that it can take the store exclusive ([`Store::hold_exclusive`]) before it changes
    /// anything. What it reads before that is a snapshot.
    ///
    /// # Errors
    /// As [`Store::open_existing`].
    pub fn open_to_collect(root: &Path) -> Result<Self, StoreError> {
        Self::existing(root, false)
    }

    fn existing(root: &Path, hold: bool) -> Result<Self, StoreError> {
        match fs::symlink_metadata(root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::Missing {
                    path: root.to_path_buf(),
                });
            }
            Err(e) => return Err(io_err("stat", root)(e)),
            Ok(_) => {}
        }
        let mut store = Self::checked_root(root)?;
        if hold {
            store = store.held()?;
        }
        store.reader = true;
        store.check_layout(root)?;
        Ok(store)
    }

    /// Every section of [`LAYOUT`] is there and safe; [`StoreError::Missing`] naming `given`
    /// when one is not (a directory that is not a store).
    fn check_layout(&self, given: &Path) -> Result<(), StoreError> {
        let store = self;
        let missing = || StoreError::Missing {
            path: given.to_path_buf(),
        };
        for sub in LAYOUT {
            let path = store.root.join(sub);
            match fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(io_err("stat", &path)(e)),
                Ok(_) => store.check_dir(&path, 0o700)?,
            }
        }
        Ok(())
    }

    /// The store whose root is `root`, which exists: the root itself may not be a link
    /// (checked on the path as given); then its canonical path is the store's identity in lease
    /// records, container labels, owner files and account tags, so `/x/store`, `/x/store/` and
    /// a linked parent are one.
    fn checked_root(root: &Path) -> Result<Self, StoreError> {
        Self {
            root: root.to_path_buf(),
            reader: false,
            _hold: None,
        }
        .check_dir(root, 0o700)?;
        let root = fs::canonicalize(root).map_err(io_err("resolve", root))?;
        let store = Self {
            root,
            reader: false,
            _hold: None,
        };
        store.check_dir(&store.root, 0o700)?;
        Ok(store)
    }

    fn check_dir(&self, path: &Path, mode: u32) -> Result<(), StoreError> {
        let meta = fs::symlink_metadata(path).map_err(io_err("stat", path))?;
        let unsafe_because = |why: String| StoreError::Unsafe {
            path: path.to_path_buf(),
            why,
        };
        if !meta.is_dir() {
            return Err(unsafe_because("not a directory".to_owned()));
        }
        let euid = nix::unistd::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(unsafe_because(format!(
                "owned by uid {}, not by the running uid {euid}",
                meta.uid()
            )));
        }
        if meta.mode() & 0o7777 != mode {
            return Err(unsafe_because(format!(
                "mode {:o}, must be {mode:o}",
                meta.mode() & 0o7777
            )));
        }
        Ok(())
    }

    /// The store's root directory.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this store was opened by a command that only reads it ([`Store::open_existing`]:
    /// a check, a status, a re-verification), never to write a result into it.
    #[must_use]
    pub const fn reader(&self) -> bool {
        self.reader
    }

    /// Whether the store's file system is mounted read-only: it can serve readers (a check, a
    /// verification) and keep nothing they would write.
    #[must_use]
    pub fn read_only(&self) -> bool {
        nix::sys::statvfs::statvfs(&self.root)
            .is_ok_and(|v| v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
    }

    /// A path inside the store, by layout section and name.
    #[must_use]
    pub fn path(&self, section: &str, name: &str) -> PathBuf {
        self.root.join(section).join(name)
    }

    /// Remove the scratch directories of writers that no longer hold their lock.
    fn clean_stale(&self) -> Result<(), StoreError> {
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(io_err("list", &tmp))? {
            let entry = entry.map_err(io_err("list", &tmp))?;
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let token = name.strip_suffix(".lock").unwrap_or(name);
            let lock_path = tmp.join(format!("{token}.lock"));
            let lock = OpenOptions::new()
                .read(true)
                .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
                .open(&lock_path);
            let held_elsewhere = match lock {
                Ok(f) => Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err(),
                // No lock file: a scratch entry whose writer died between creating the lock's
                // removal and the directory's, or a stray lock-less entry: stale either way.
                Err(_) => false,
            };
            if !held_elsewhere {
                remove_tree(&path).map_err(io_err("remove stale scratch", &path))?;
            }
        }
        Ok(())
    }

    /// A new scratch directory under `tmp/`, locked for this writer.
    ///
    /// # Errors
    /// It could not be created.
    pub fn scratch(&self) -> Result<Scratch, StoreError> {
        let tmp = self.root.join("tmp");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let token = format!("{}-{nanos:x}", std::process::id());
        let lock_path = tmp.join(format!("{token}.lock"));
        let file = create_exclusive(&lock_path, 0o600)?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| nix_err("lock scratch", &lock_path)(e))?;
        let dir = tmp.join(&token);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create scratch", &dir))?;
        Ok(Scratch {
            dir,
            lock_path,
            _lock: lock,
            next: 0,
        })
    }

    /// The path of a content object: `objects/<2 hex>/<hex>` for mode 0444, with `.x` for the
    /// executable (0555) variant. Modes live in the inode, which hard links share, so each mode
    /// has its own object.
    #[must_use]
    pub fn object_path(&self, sha256: &Digest, executable: bool) -> PathBuf {
        let hex = sha256.hex();
        let suffix = if executable { ".x" } else { "" };
        self.root
            .join("objects")
            .join(&hex[..2])
            .join(format!("{hex}{suffix}"))
    }

    /// Publish staged, fully written files as content objects: set each one's mode and times,
    /// make all their data durable, hard-link each into place (never replacing), make the new
    /// names durable, then reopen every object at its name and re-hash it (on two threads).
    ///
    /// Durability uses one `syncfs` of the store's filesystem before the links and one after,
    /// rather than an fsync of every file and every parent: the same guarantee (data before
    /// name, name before return) for a batch, at two flushes instead of two per file.
    ///
    /// # Errors
    /// Any step failed, or an object at its name does not hash to its digest.
    pub fn publish_objects(&self, items: &[Staged]) -> Result<(), StoreError> {
        for item in items {
            let mode = if item.executable { 0o555 } else { 0o444 };
            let file = open_nofollow(&item.path)?;
            file.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(io_err("chmod", &item.path))?;
            zero_mtime(&item.path)?;
        }
        self.sync()?;
        for item in items {
            let target = self.object_path(&item.sha256, item.executable);
            let parent = target.parent().unwrap_or(&self.root).to_path_buf();
            match fs::DirBuilder::new().mode(0o700).create(&parent) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("create", &parent)(e)),
            }
            match fs::hard_link(&item.path, &target) {
                Ok(()) => {}
                // Already published by this or another writer: the re-hash below decides.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("link", &target)(e)),
            }
        }
        self.sync()?;
        let half = items.len().div_ceil(2);
        let (a, b) = items.split_at(half);
        let verify = |part: &[Staged]| {
            part.iter().try_for_each(|i| {
                let mode = if i.executable { 0o555 } else { 0o444 };
                self.verify_object(&self.object_path(&i.sha256, i.executable), &i.sha256, mode)
            })
        };
        std::thread::scope(|scope| {
            let other = scope.spawn(|| verify(b));
            let mine = verify(a);
            let theirs = other.join().unwrap_or_else(|_| {
                Err(StoreError::Unsafe {
                    path: self.root.clone(),
                    why: "a verifying thread panicked".to_owned(),
                })
            });
            mine.and(theirs)
        })
    }

    /// Flush the store's filesystem (`syncfs`).
    fn sync(&self) -> Result<(), StoreError> {
        let dir = File::open(&self.root).map_err(io_err("open", &self.root))?;
        nix::unistd::syncfs(&dir).map_err(nix_err("syncfs", &self.root))
    }

    /// Reopen a content object and check it: a regular file owned by the store's owner, the
    /// expected mode, and contents hashing to its name.
    ///
    /// # Errors
    /// It is missing, unsafe, or does not match.
    pub fn verify_object(&self, path: &Path, sha256: &Digest, mode: u32) -> Result<(), StoreError> {
        let file = open_nofollow(path)?;
        let meta = file.metadata().map_err(io_err("stat", path))?;
        if meta.mode() & 0o7777 != mode || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(StoreError::Unsafe {
                path: path.to_path_buf(),
                why: format!("mode {:o} uid {}", meta.mode() & 0o7777, meta.uid()),
            });
        }
        let (found, _) = Digest::of_reader(file).map_err(io_err("read", path))?;
        if &found != sha256 {
            return Err(StoreError::Mismatch {
                path: path.to_path_buf(),
                expected: sha256.to_string(),
                found: found.to_string(),
            });
        }
        Ok(())
    }

    /// Publish a small document (a record or receipt) at `section/name` with mode 0444: written
    /// to scratch, fsynced, hard-linked without replacing, re-read and compared. Publishing the
    /// same bytes twice is not an error; different bytes under a taken name is a mismatch.
    ///
    /// # Errors
    /// Any step failed, or the name holds other bytes.
    pub fn put_document(
        &self,
        section: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<PathBuf, StoreError> {
        let mut scratch = self.scratch()?;
        let (staged, mut file) = scratch.create_file()?;
        file.write_all(bytes).map_err(io_err("write", &staged))?;
        file.set_permissions(fs::Permissions::from_mode(0o444))
            .map_err(io_err("chmod", &staged))?;
        file.sync_all().map_err(io_err("fsync", &staged))?;
        let target = self.path(section, name);
        match fs::hard_link(&staged, &target) {
            Ok(()) => fsync_dir(&self.root.join(section))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("link", &target)(e)),
        }
        let mut found = Vec::new();
        open_nofollow(&target)?
            .read_to_end(&mut found)
            .map_err(io_err("read", &target))?;
        if found != bytes {
            return Err(StoreError::Mismatch {
                path: target,
                expected: Digest::of_bytes(bytes).to_string(),
                found: Digest::of_bytes(&found).to_string(),
            });
        }
        Ok(target)
    }

    /// Read a content object's bytes.
    ///
    /// # Errors
    /// It is missing or unreadable.
    pub fn read_object(&self, sha: &Digest, executable: bool) -> Result<Vec<u8>, StoreError> {
        let path = self.object_path(sha, executable);
        let mut out = Vec::new();
        open_nofollow(&path)?
            .read_to_end(&mut out)
            .map_err(io_err("read object", &path))?;
        Ok(out)
    }

    /// Read content object `sha` (the plain variant) and check that its bytes still hash to
    /// its name: an object read as evidence may have been edited in place.
    ///
    /// # Errors
    /// It is missing, unreadable, or its bytes are not the named ones.
    pub fn read_object_checked(&self, sha: &Digest) -> Result<Vec<u8>, StoreError> {
        let bytes = self.read_object(sha, false)?;
        named(bytes, sha, || self.object_path(sha, false))
    }

    /// Publish `bytes` as one plain content object (nothing is written twice); its sha256.
    ///
    /// # Errors
    /// Writing or publishing failed.
    pub fn put_object(&self, bytes: &[u8]) -> Result<Digest, StoreError> {
        let mut batch = self.batch()?;
        let (sha, _) = batch.add_reader(bytes, false)?;
        batch.commit()?;
        Ok(sha)
    }

    /// A batch of content objects to write and publish together.
    ///
    /// # Errors
    /// Its scratch directory cannot be made.
    pub fn batch(&self) -> Result<Batch<'_>, StoreError> {
        Ok(Batch {
            store: self,
            scratch: self.scratch()?,
            items: Vec::new(),
            queued: std::collections::BTreeSet::new(),
        })
    }

    /// Read a published document.
    ///
    /// # Errors
    /// It is missing or unsafe.
    pub fn read_document(&self, section: &str, name: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(section, name);
        let mut out = Vec::new();
        open_nofollow(&path)?
            .read_to_end(&mut out)
            .map_err(io_err("read", &path))?;
        Ok(out)
    }

    /// Every path in the store with its mode, size, owner, link count and, for a file, the
    /// sha256 of its content (for a symbolic link, its target), sorted: what tests compare
    /// before and after an operation that must leave the store unchanged — a rewritten object
    /// of the same size, a second hard link or a changed owner all show.
    ///
    /// # Errors
    /// The store could not be listed.
    pub fn listing(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        list_into(&self.root, &mut out)?;
        out.sort();
        Ok(out)
    }

    /// [`Store::listing`] without `receipts/` and `evidence/`: the content a rejection or a
    /// no-decision must leave exactly as it was (its receipt and the evidence it names are
    /// stored; nothing else is).
    ///
    /// # Errors
    /// As [`Store::listing`].
    pub fn content_listing(&self) -> Result<Vec<String>, StoreError> {
        let mut out = self.listing()?;
        out.retain(|l| !l.starts_with("receipts/") && !l.starts_with("evidence/"));
        Ok(out)
    }

    /// Store `bytes` as evidence (`evidence/<sha256 hex>`, mode 0444, published as every
    /// document is); its sha256.
    ///
    /// # Errors
    /// Writing or publishing failed.
    pub fn put_evidence(&self, bytes: &[u8]) -> Result<Digest, StoreError> {
        let sha = Digest::of_bytes(bytes);
        self.put_document(EVIDENCE, &sha.hex(), bytes)?;
        Ok(sha)
    }

    /// Read evidence `sha` back, checking that its bytes still hash to its name.
    ///
    /// # Errors
    /// It is missing, unreadable, or not the named bytes.
    pub fn read_evidence(&self, sha: &Digest) -> Result<Vec<u8>, StoreError> {
        let bytes = self.read_document(EVIDENCE, &sha.hex())?;
        named(bytes, sha, || self.path(EVIDENCE, &sha.hex()))
    }
}

/// `bytes`, read from `path`, when they hash to `sha`: an object read as evidence may have been
/// edited in place.
fn named(bytes: Vec<u8>, sha: &Digest, path: impl Fn() -> PathBuf) -> Result<Vec<u8>, StoreError> {
    let found = Digest::of_bytes(&bytes);
    if &found != sha {
        return Err(StoreError::Mismatch {
            path: path(),
            expected: sha.to_string(),
            found: found.to_string(),
        });
    }
    Ok(bytes)
}

fn list_into(root: &Path, out: &mut Vec<String>) -> Result<(), StoreError> {
    let mut list = |n: &Node<'_>| -> Result<(), Stop<StoreError>> {
        let st = &n.stat;
        if n.path.is_empty() {
            return Ok(());
        }
        let at = |why: String| {
            Stop::Visit(StoreError::Unsafe {
                path: root.join(n.path),
                why,
            })
        };
        let what = match st.kind {
            Kind::File => Digest::of_reader(n.open()?)
                .map_err(|e| at(format!("cannot hash: {e}")))?
                .0
                .to_string(),
            Kind::Symlink => format!("-> {}", n.read_link()?.display()),
            Kind::Dir | Kind::Fifo | Kind::Socket | Kind::Device => String::new(),
        };
        let dir = st.kind == Kind::Dir;
        out.push(format!(
            "{} {:?} {:o} {} {}:{} links={} {what}",
            n.path,
            st.kind,
            st.mode,
            if dir { 0 } else { st.size },
            st.uid,
            st.gid,
            if dir { 0 } else { st.nlink },
        ));
        Ok(())
    };
    walk(root, &mut list).map_err(|stop| match stop {
        Stop::Walk(e) => StoreError::Unsafe {
            path: root.to_path_buf(),
            why: e.to_string(),
        },
        Stop::Visit(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        (dir, store)
    }

    #[test]
    fn a_reader_never_makes_a_store_and_a_path_without_one_is_the_operators() {
        use crate::exit::ExitClass;
        let dir = tempfile::tempdir().unwrap();
        let typo = dir.path().join("stroe");
        let e = Store::open_existing(&typo).unwrap_err();
        assert!(
            matches!(&e, StoreError::Missing { path } if *path == typo),
            "{e}"
        );
        assert_eq!(e.exit_class(), crate::ExitCode::Usage);
        assert!(!typo.exists(), "nothing was made");
        // A private directory that is no store: still none, and still nothing made in it.
        fs::create_dir(&typo).unwrap();
        fs::set_permissions(&typo, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            Store::open_existing(&typo),
            Err(StoreError::Missing { .. })
        ));
        assert_eq!(fs::read_dir(&typo).unwrap().count(), 0);
        // A store opens; an unsafe one is refused as such, a no-decision.
        let root = dir.path().join("store");
        Store::open(&root).unwrap();
        Store::open_existing(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let e = Store::open_existing(&root).unwrap_err();
        assert!(matches!(e, StoreError::Unsafe { .. }), "{e}");
        assert_eq!(e.exit_class(), crate::ExitCode::NoDecision);
    }

    #[test]
    fn a_root_that_is_not_private_or_is_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("open");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Store::open(&root).is_err(), "a 0755 root is not private");
        let link = dir.path().join("link");
        Store::open(&dir.path().join("real")).unwrap();
        symlink(dir.path().join("real"), &link).unwrap();
        assert!(Store::open(&link).is_err(), "a root reached through a link");
    }

    #[test]
    fn objects_are_content_addressed_read_only_and_re_verified() {
        let (_d, s) = store();
        let mut batch = s.batch().unwrap();
        let (sha, size) = batch.add_reader(&b"hello"[..], false).unwrap();
        batch.commit().unwrap();
        assert_eq!((sha, size), (Digest::of_bytes(b"hello"), 5));
        let path = s.object_path(&sha, false);
        let m = fs::metadata(&path).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o444);
        assert_eq!(s.read_object(&sha, false).unwrap(), b"hello");
        s.verify_object(&path, &sha, 0o444).unwrap();
        assert!(
            s.verify_object(&path, &Digest::of_bytes(b"x"), 0o444)
                .is_err()
        );
    }

    #[test]
    fn documents_are_never_replaced_and_scratch_of_the_dead_is_swept() {
        let (d, s) = store();
        s.put_document("receipts", "a.json", b"one").unwrap();
        // Another document under the same name is a mismatch, and the first stays.
        assert!(matches!(
            s.put_document("receipts", "a.json", b"two"),
            Err(StoreError::Mismatch { .. })
        ));
        assert_eq!(s.read_document("receipts", "a.json").unwrap(), b"one");
        // Scratch no live writer holds is removed by the next open.
        let stale = s.root().join("tmp").join("stale-token");
        fs::create_dir(&stale).unwrap();
        drop(s);
        let s = Store::open(&d.path().join("store")).unwrap();
        assert!(!stale.exists());
        create_exclusive(&s.root().join("tmp/x"), 0o600).unwrap();
        assert!(create_exclusive(&s.root().join("tmp/x"), 0o600).is_err_and(|e| is_exists(&e)));
    }

    /// Scratch a live writer holds (its lock taken through another open file, as another
    /// process's would be) survives every other open's sweep, and goes once it is dropped.
    #[test]
    fn scratch_a_live_writer_holds_survives_another_open() {
        let (d, s) = store();
        let mut scratch = s.scratch().unwrap();
        let (file, _) = scratch.create_file().unwrap();
        assert!(file.exists());
        let again = Store::open(&d.path().join("store")).unwrap();
        assert!(file.exists(), "a live writer's scratch was swept");
        drop(scratch);
        drop(again);
        Store::open(&d.path().join("store")).unwrap();
        assert_eq!(fs::read_dir(s.root().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn rename_noreplace_and_nofollow_refuse_what_they_must() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::write(&a, "a").unwrap();
        fs::write(&b, "b").unwrap();
        assert!(rename_noreplace(&a, &b).is_err_and(|e| is_exists(&e)));
        assert_eq!(fs::read_to_string(&b).unwrap(), "b");
        let l = dir.path().join("l");
        symlink(&a, &l).unwrap();
        assert!(matches!(
            open_nofollow(&l),
            Err(StoreError::Io { source, .. }) if source.raw_os_error() == Some(nix::libc::ELOOP)
        ));
        // Any name a candidate could write is removed, UTF-8 or not.
        let odd = dir.path().join("d");
        fs::create_dir(&odd).unwrap();
        fs::write(odd.join(std::ffi::OsStr::from_bytes(b"bad\xff")), "x").unwrap();
        remove_tree(dir.path()).unwrap();
        assert!(!dir.path().exists());
    }
}

#[cfg(test)]
mod root_tests {
    //! Removal against a real mount (root, as CI runs), made through the host seam.

    use super::*;
    use crate::host::Host;

    /// A tmpfs still mounted inside a directory (a live lease's staging, say) is never emptied
    /// by removing the directory: the removal stops at the mount point with an error.
    #[test]
    fn remove_tree_never_crosses_a_mount_point() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts a tmpfs: run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let staging = run.join("staging");
        fs::create_dir_all(&staging).unwrap();
        let host = crate::host::Linux;
        host.mount(&crate::host::MountRequest::Tmpfs {
            target: staging.clone(),
            options: "size=1m".into(),
        })
        .unwrap();
        fs::write(staging.join("live"), "x").unwrap();
        let err = remove_tree(&run).unwrap_err();
        assert!(err.to_string().contains("mount point"), "{err}");
        assert_eq!(fs::read_to_string(staging.join("live")).unwrap(), "x");
        host.unmount(&staging).unwrap();
        remove_tree(&run).unwrap();
        assert!(!run.exists());
    }

    /// A run directory on an overlay root (an evaluator host that is itself a container, the
    /// emulated cgroup v2 guest) is removed: its files report a layer's device, never the
    /// overlay's, and are no mount points; a tmpfs mounted inside it still is one.
    #[test]
    fn remove_tree_tells_an_overlays_files_from_a_mount_point() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts an overlay: run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let (lower, layers, merged) = (
            dir.path().join("lower"),
            dir.path().join("layers"),
            dir.path().join("merged"),
        );
        for d in [&lower, &layers, &merged] {
            fs::create_dir(d).unwrap();
        }
        fs::create_dir(lower.join("run")).unwrap();
        fs::write(lower.join("run/from-lower"), "x").unwrap();
        let host = crate::host::Linux;
        // The upper layer on a filesystem of its own, as a tmpfs overlay root has it.
        host.mount(&crate::host::MountRequest::Tmpfs {
            target: layers.clone(),
            options: "size=1m".into(),
        })
        .unwrap();
        fs::create_dir(layers.join("upper")).unwrap();
        fs::create_dir(layers.join("work")).unwrap();
        host.mount(&crate::host::MountRequest::Overlay {
            target: merged.clone(),
            lower: lower.clone(),
            upper: layers.join("upper"),
            work: layers.join("work"),
        })
        .unwrap();
        let run = merged.join("run");
        fs::write(run.join("from-upper"), "y").unwrap();
        fs::create_dir(run.join("staging")).unwrap();
        host.mount(&crate::host::MountRequest::Tmpfs {
            target: run.join("staging"),
            options: "size=1m".into(),
        })
        .unwrap();
        let err = remove_tree(&run).unwrap_err();
        assert!(
            err.to_string().contains("staging is a mount point"),
            "{err}"
        );
        host.unmount(&run.join("staging")).unwrap();
        remove_tree(&run).unwrap();
        assert!(!run.exists());
        host.unmount(&merged).unwrap();
        host.unmount(&layers).unwrap();
    }
}
