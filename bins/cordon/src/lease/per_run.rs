//! The surface in a per-run account (REQ-117, `user "per-run"`): started as root, the surface
//! makes a fresh account, hands it the workspace, runs its rootless path as that account in a
//! state directory of the account's own, then takes the workspace back and removes the account.
//!
//! It owns the per-run layout under the surface's state directory (root's, [`STATE_MODE`]):
//! `per-run/<account>.json`, the record, published (written, made durable, locked, renamed
//! into place) before the account exists and locked by its supervisor for the run's whole
//! life, and `per-run/<account>/`, the account's own state directory (0700, the account's). A
//! record on disk is a run not yet ended: while one names a workspace no other per-run run of
//! it starts, and `cordon-reap --surface` as root recovers a record nobody holds — the
//! account's runs released as the account, then [`end`].
//!
//! The handover goes by file descriptors: the workspace is opened once, with no link anywhere
//! in its path (`openat2` `RESOLVE_NO_SYMLINKS`), proven the recorded directory, and walked
//! from that descriptor ([`crate::walk::walk_within`]), each entry changed through a descriptor of
//! the inode examined ([`crate::walk::Node::chown`]). An inode that a name outside the
//! workspace shares (its link count above the names the walk saw) is never handed over: before
//! the run the workspace is refused; after it, it is residue. Before the run every entry must be
//! the owner's; after it every entry is the owner's again, set-id bits cleared — and only once
//! no process of the account is left.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::{LeaseError, Residue, io, rootless};
use crate::account::{self, Account, AccountPolicy};
use crate::host::Host;
use crate::walk::{Bounds, Kind, Node, WalkError, walk_within};

/// The surface state directory's subdirectory of per-run records and account state.
pub const PER_RUN: &str = "per-run";
/// The mode of root's state directory and of its `per-run/`: each account passes through both
/// to its own directory, and no one but root lists or changes them.
pub const STATE_MODE: u32 = 0o711;
const SCHEMA: u32 = 1;
/// The most bytes of a carried file.
const CARRIED_MAX: u64 = 1 << 20;
/// The most entries root walks in a workspace; past it, its owner's run is refused before it
/// starts, or its end is residue for the operator to clear (never a walk without end).
pub const WORKSPACE_ENTRIES: u64 = 1 << 22;
/// The most levels of directories root descends in a workspace: each level is reopened name
/// by name from the top, so a chain thousands deep would cost its square.
pub const WORKSPACE_DEPTH: u64 = 1024;
/// The longest root's checks of a workspace may walk it, and then its handover (each its own).
pub const WORKSPACE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// The bounds of a workspace walk that must end by `until`: any name the agent left (it is
/// handed back, whatever its bytes), within [`WORKSPACE_ENTRIES`] and [`WORKSPACE_DEPTH`].
fn workspace_bounds(until: std::time::Instant) -> Bounds {
    Bounds {
        any_names: true,
        entries: WORKSPACE_ENTRIES,
        depth: WORKSPACE_DEPTH,
        until: Some(until),
    }
}

/// What root must know to end a per-run run, whoever ends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The account.
    pub account: Account,
    /// The workspace (canonical).
    pub workspace: PathBuf,
    /// Its owner before the run, and after: uid and gid.
    pub owner: (u32, u32),
    /// Its device and inode: the take-back refuses another directory put at the path.
    pub workspace_id: (u64, u64),
    /// Its mode before the run (0700 during it: no one but the account passes through it).
    pub workspace_mode: u32,
    /// Files of root's state directory (relative) the account's state gets a copy of at the
    /// start and gives back at the end (the surface's record of the agent's directories).
    pub carried: Vec<PathBuf>,
}

/// A run begun: its record, and the lock that says its supervisor lives.
#[derive(Debug)]
pub struct Begun {
    /// The record.
    pub record: Record,
    _lock: Flock<File>,
}

/// The account's state directory under the surface's state directory `state`.
#[must_use]
pub fn account_state(state: &Path, account: &Account) -> PathBuf {
    state.join(PER_RUN).join(&account.name)
}

/// A directory root's per-run runs pass through (the state directory, its `per-run/`): root's,
/// not a link, mode [`STATE_MODE`].
///
/// # Errors
/// It is anything else.
pub fn existing_state(dir: &Path) -> Result<(), LeaseError> {
    let m = fs::symlink_metadata(dir).map_err(io("examine", dir))?;
    if m.is_dir() && m.uid() == 0 && m.mode() & 0o7777 == STATE_MODE {
        Ok(())
    } else {
        Err(io("use", dir)(std::io::Error::other(format!(
            "not a directory of root's, mode {STATE_MODE:04o}"
        ))))
    }
}

/// `path`, canonical, when it and every directory above it are root's and writable by no group
/// or other user (a sticky directory aside): a file root reads as its authority under
/// `user "per-run"` (the policy). Otherwise which path is not, and how.
///
/// # Errors
/// The path cannot be examined, or is changeable by someone other than root.
pub fn root_only(path: &Path) -> Result<PathBuf, String> {
    let canonical = fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for p in canonical.ancestors() {
        let m = fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let sticky_dir = m.is_dir() && m.mode() & 0o1000 != 0;
        if m.uid() != 0 {
            return Err(format!(
                "{} is owned by uid {}, not root",
                p.display(),
                m.uid()
            ));
        }
        if m.mode() & 0o022 != 0 && !sticky_dir {
            return Err(format!(
                "{} is writable by a group or everyone",
                p.display()
            ));
        }
    }
    Ok(canonical)
}

fn record_path(state: &Path, name: &str) -> PathBuf {
    state.join(PER_RUN).join(format!("{name}.json"))
}

fn sync_dir(path: &Path) -> Result<(), LeaseError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", path))
}

fn residue(item: String) -> LeaseError {
    LeaseError::Residue(Residue { items: vec![item] })
}

/// The per-run runs not yet ended, by their records; with each, whether its supervisor still
/// holds it (`true`: live, never to be ended by anyone else).
///
/// # Errors
/// The directory or a record cannot be read: nothing is then known to be ended.
pub fn pending(state: &Path) -> Result<Vec<(Record, bool)>, LeaseError> {
    let dir = state.join(PER_RUN);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("list", &dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(io("list", &dir))?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let bad = |why: String| LeaseError::Record {
            path: path.clone(),
            why,
        };
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io("read", &path))?;
        let live = match Flock::lock(
            file.try_clone().map_err(io("read", &path))?,
            FlockArg::LockSharedNonblock,
        ) {
            Ok(_) => false,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => true,
            Err((_, e)) => return Err(io("lock", &path)(e.into())),
        };
        let mut text = Vec::new();
        file.take(CARRIED_MAX)
            .read_to_end(&mut text)
            .map_err(io("read", &path))?;
        let record: Record = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if record.schema != SCHEMA || record_path(state, &record.account.name) != path {
            return Err(bad("not a per-run record of this build's".into()));
        }
        out.push((record, live));
    }
    out.sort_by(|a, b| a.0.account.name.cmp(&b.0.account.name));
    Ok(out)
}

/// The workspace at `path`, opened with no link anywhere in the path, and its identity; with
/// `expect`, only that directory.
fn open_workspace(
    path: &Path,
    expect: Option<(u64, u64)>,
) -> Result<(OwnedFd, fs::Metadata), LeaseError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let fd = rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| io("open", path)(e.into()))?;
    let m = File::from(fd.try_clone().map_err(io("open", path))?)
        .metadata()
        .map_err(io("examine", path))?;
    if expect.is_some_and(|id| (m.dev(), m.ino()) != id) {
        return Err(residue(format!(
            "the workspace {} is no longer the directory handed over",
            path.display()
        )));
    }
    Ok((fd, m))
}

/// How many names the walk of the workspace saw for each inode.
fn names_seen(
    top: &OwnedFd,
    path: &Path,
    b: &Bounds,
) -> Result<HashMap<(u64, u64), u64>, LeaseError> {
    let mut seen: HashMap<(u64, u64), u64> = HashMap::new();
    walk_within::<WalkError>(top, b, &mut |n| {
        *seen.entry(n.stat.id).or_default() += 1;
        Ok(())
    })
    .map_err(|e| walk_failed(path, &e))?;
    Ok(seen)
}

/// A walk's failure; the names in it are the agent's, so escaped.
fn walk_failed(path: &Path, e: &WalkError) -> LeaseError {
    let why = crate::text::printable(&e.to_string()).into_owned();
    io("walk", path)(std::io::Error::other(why))
}

/// Whether `n`'s inode has a name the walk did not see (outside the workspace).
fn linked_outside(n: &Node<'_>, seen: &HashMap<(u64, u64), u64>) -> bool {
    n.stat.kind != Kind::Dir && seen.get(&n.stat.id).copied().unwrap_or(0) < n.stat.nlink
}

/// Give every entry below the workspace open at `top` to `to` (the root itself is the
/// caller's: it decides when anyone may pass through it). Only entries owned by one of
/// `owners` change hands; one linked outside the workspace, of another owner, or changed since
/// `seen` was counted stops the handover.
fn hand(
    top: &OwnedFd,
    path: &Path,
    seen: &HashMap<(u64, u64), u64>,
    to: (u32, u32),
    owners: &[u32],
    b: &Bounds,
) -> Result<(), LeaseError> {
    // An inode with several names inside is changed once, at its first.
    let mut done = std::collections::HashSet::new();
    walk_within::<WalkError>(top, b, &mut |n| {
        if n.path.is_empty() || done.contains(&n.stat.id) {
            return Ok(());
        }
        if linked_outside(n, seen) || !owners.contains(&n.stat.uid) {
            return Err(WalkError::Changed {
                path: n.path.to_owned(),
            });
        }
        n.chown(to.0, to.1, n.stat.nlink, owners)?;
        done.insert(n.stat.id);
        Ok(())
    })
    .map_err(|e| walk_failed(path, &e))
}

/// The workspace's root directory given to `to` with `mode`, through its open descriptor.
fn set_root(top: &OwnedFd, path: &Path, to: (u32, u32), mode: u32) -> Result<(), LeaseError> {
    rustix::fs::fchown(
        top,
        Some(rustix::fs::Uid::from_raw(to.0)),
        Some(rustix::fs::Gid::from_raw(to.1)),
    )
    .and_then(|()| rustix::fs::fchmod(top, rustix::fs::Mode::from_raw_mode(mode)))
    .map_err(|e| io("give", path)(e.into()))
}

/// Give the tree at `path` (one root just made: the account's copy of its skills) to `to`.
///
/// # Errors
/// It cannot be walked or changed.
pub fn give_tree(path: &Path, to: (u32, u32)) -> Result<(), LeaseError> {
    let top = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| io("open", path)(e.into()))?;
    let seen = names_seen(&top, path, &Bounds::STRICT)?;
    hand(&top, path, &seen, to, &[0], &Bounds::STRICT)?;
    let mode = File::from(top.try_clone().map_err(io("open", path))?)
        .metadata()
        .map_err(io("examine", path))?
        .mode()
        & 0o7777;
    set_root(&top, path, to, mode)
}

/// Copy each of `files` (plain relative paths) that exists under `from` to `to` (root's, which
/// no one else can change while it is written), directories made 0700. A source is read only if it is a regular
/// file of `from_owner`'s with one link and at most [`CARRIED_MAX`] bytes, never through a link:
/// the account's state is the account's to fill.
fn carry(from: &Path, from_owner: u32, to: &Path, files: &[PathBuf]) -> Result<(), LeaseError> {
    for rel in files {
        if rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(io("carry", rel)(std::io::Error::other(
                "not a plain relative path",
            )));
        }
        let source = from.join(rel);
        let file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&source)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("read", &source)(e)),
        };
        let m = file.metadata().map_err(io("examine", &source))?;
        if !m.is_file() || m.nlink() != 1 || m.uid() != from_owner || m.len() > CARRIED_MAX {
            return Err(residue(format!(
                "{} is not a plain file of uid {from_owner}'s of at most {CARRIED_MAX} bytes",
                source.display()
            )));
        }
        let mut text = Vec::new();
        file.take(CARRIED_MAX)
            .read_to_end(&mut text)
            .map_err(io("read", &source))?;
        let dest = to.join(rel);
        if let Some(dir) = dest.parent()
            && !dir.is_dir()
        {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(io("make", dir))?;
        }
        let partial = dest.with_extension("partial");
        let _ = fs::remove_file(&partial);
        let mut out = crate::store::create_exclusive(&partial, 0o600)?;
        out.write_all(&text)
            .and_then(|()| out.sync_all())
            .map_err(io("write", &partial))?;
        fs::rename(&partial, &dest).map_err(io("write", &dest))?;
    }
    Ok(())
}

/// Begin a per-run run of `workspace`: refuse while an earlier run of it is not ended, publish
/// the record (locked for as long as the returned [`Begun`] lives), make the account, its state
/// directory, and hand it the workspace. Whatever fails after the record is published is
/// [`end`]ed by recovery.
///
/// # Errors
/// An earlier run of the workspace is pending, the workspace holds a foreign or outside-linked
/// entry, or a step failed.
pub fn begin(
    host: &dyn Host,
    accounts: &AccountPolicy,
    state: &Path,
    owner_tag: &str,
    (workspace, checked): (&Path, (u64, u64)),
    run: &str,
    carried: &[PathBuf],
) -> Result<Begun, LeaseError> {
    let dir = state.join(PER_RUN);
    match fs::DirBuilder::new().mode(STATE_MODE).create(&dir) {
        Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(STATE_MODE))
            .map_err(io("make", &dir))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("make", &dir)(e)),
    }
    existing_state(&dir)?;
    // The directory the caller checked, and no other put at its path since.
    let (top, m) = open_workspace(workspace, Some(checked))?;
    // Root's directories, and a workspace an account holds now (a nested one), are never
    // handed over.
    if m.uid() == 0 || (accounts.uids.0..=accounts.uids.1).contains(&m.uid()) {
        return Err(io("hand over", workspace)(std::io::Error::other(format!(
            "the workspace is uid {}'s: neither root's nor a per-run account's is handed over",
            m.uid()
        ))));
    }
    let record = Record {
        schema: SCHEMA,
        account: account::for_lease(accounts, run),
        workspace: workspace.to_path_buf(),
        owner: (m.uid(), m.gid()),
        workspace_id: (m.dev(), m.ino()),
        workspace_mode: m.mode() & 0o7777,
        carried: carried.to_vec(),
    };
    // Proven before anything exists: a refused workspace leaves nothing to recover.
    let b = workspace_bounds(std::time::Instant::now() + WORKSPACE_DEADLINE);
    let seen = names_seen(&top, workspace, &b)?;
    let mut foreign = None;
    walk_within::<WalkError>(&top, &b, &mut |n| {
        let why = if (n.stat.uid, n.stat.gid) != record.owner {
            Some("is not the workspace owner's: a third user's file would become the run's")
        } else if linked_outside(n, &seen) {
            Some("has a hard link outside the workspace: the file it names would become the run's")
        } else {
            None
        };
        if foreign.is_none()
            && let Some(why) = why
        {
            foreign = Some(format!("{:?} {why}", n.path));
        }
        Ok(())
    })
    .map_err(|e| walk_failed(workspace, &e))?;
    if let Some(why) = foreign {
        return Err(io("hand over", workspace)(std::io::Error::other(why)));
    }
    // Published under the directory's lock: two runs of one workspace never both pass.
    let gate = Flock::lock(
        File::open(&dir).map_err(io("open", &dir))?,
        FlockArg::LockExclusive,
    )
    .map_err(|(_, e)| io("lock", &dir)(e.into()))?;
    if let Some((earlier, _)) = pending(state)?
        .into_iter()
        .find(|(r, _)| r.workspace == record.workspace || r.workspace_id == record.workspace_id)
    {
        return Err(residue(format!(
            "the per-run account {} of an earlier run of this workspace is not removed (cordon-reap --surface recovers it)",
            earlier.account.name
        )));
    }
    let path = record_path(state, &record.account.name);
    let pending_path = path.with_extension("json.pending");
    let text =
        serde_json::to_vec(&record).map_err(|e| io("encode", &path)(std::io::Error::other(e)))?;
    let file = crate::store::create_exclusive(&pending_path, 0o600)?;
    let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| io("lock", &pending_path)(e.into()))?;
    lock.write_all(&text)
        .and_then(|()| lock.sync_all())
        .map_err(io("write", &pending_path))?;
    fs::rename(&pending_path, &path).map_err(io("publish", &path))?;
    sync_dir(&dir)?;
    drop(gate);
    match account::create(host, accounts, &record.account, owner_tag) {
        Ok(()) => {}
        // Nothing was made: the record goes with the refusal.
        Err(e @ account::AccountError::Taken { .. }) => {
            fs::remove_file(&path).map_err(io("remove", &path))?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    }
    // A process of this uid (an account of an earlier run that reused it) would hold the
    // workspace with the new account.
    let live = processes_of(host, record.account.uid)?;
    if !live.is_empty() {
        return Err(residue(format!(
            "uid {} of the new account {} already runs processes {}",
            record.account.uid,
            record.account.name,
            live.join(", ")
        )));
    }
    // The account's state is filled while it is root's, and given by [`give_state`].
    let own = account_state(state, &record.account);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&own)
        .map_err(io("make", &own))?;
    carry(state, 0, &own, &record.carried)?;
    let to = (record.account.uid, record.account.gid);
    // Its own deadline: the proof walks' time spent never cuts a handover short.
    let b = workspace_bounds(std::time::Instant::now() + WORKSPACE_DEADLINE);
    hand(&top, workspace, &seen, to, &[record.owner.0], &b)?;
    // Closed to everyone but the account for the run: no one runs what it makes set-id.
    set_root(&top, workspace, to, 0o700)?;
    Ok(Begun {
        record,
        _lock: lock,
    })
}

/// Give the account its state directory, once root has filled it (the carried files, its
/// skills): the last step before anything runs as the account.
///
/// # Errors
/// It cannot be walked or changed.
pub fn give_state(state: &Path, record: &Record) -> Result<(), LeaseError> {
    give_tree(
        &account_state(state, &record.account),
        (record.account.uid, record.account.gid),
    )
}

/// The processes running as `uid`, by the host's process table.
pub(super) fn processes_of(host: &dyn Host, uid: u32) -> Result<Vec<String>, LeaseError> {
    let proc = Path::new("/proc");
    let mut out = Vec::new();
    for pid in host
        .list_dir(proc)
        .map_err(io("list", proc))?
        .into_iter()
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
    {
        let status = proc.join(&pid).join("status");
        // A process that ended while listed is gone; any other error is not knowing.
        let text = match host.read(&status) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("read", &status)(e)),
        };
        let text = String::from_utf8_lossy(&text);
        let uids = text
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .unwrap_or_default();
        if uids.split_whitespace().any(|u| u == uid.to_string()) {
            out.push(pid);
        }
    }
    Ok(out)
}

/// End a per-run run: the account's runs must all be released (its state directory holds no
/// run) and no process of the account may be left; then the workspace is its owner's again,
/// the carried files are root's again, the account's state directory and the account are
/// removed, and the record last. Ending what is already partly ended finishes it.
///
/// # Errors
/// A run or process of the account is left, the workspace at its path is another directory or
/// holds an entry linked outside it, or a step failed: the record stays, for recovery.
pub fn end(
    host: &dyn Host,
    accounts: &AccountPolicy,
    state: &Path,
    record: &Record,
) -> Result<(), LeaseError> {
    let own = account_state(state, &record.account);
    let runs = own.join(rootless::RUNS);
    if fs::symlink_metadata(&runs).is_ok_and(|m| !m.is_dir()) {
        return Err(residue(format!(
            "{} is not a directory: the account's runs cannot be known released",
            runs.display()
        )));
    }
    match fs::read_dir(&runs) {
        Ok(mut d) => {
            if let Some(left) = d.next() {
                let left = left.map_err(io("list", &runs))?;
                return Err(residue(format!(
                    "run {:?} of per-run account {} is not released",
                    left.file_name(),
                    record.account.name
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("list", &runs)(e)),
    }
    // Nothing of the account may run while its files change hands.
    let live = processes_of(host, record.account.uid)?;
    if !live.is_empty() {
        return Err(residue(format!(
            "per-run account {} still runs processes {}",
            record.account.name,
            live.join(", ")
        )));
    }
    // Its run's cgroup (the limits root held it to) is empty now; one that cannot be removed is
    // residue, and the record stays for recovery to find it again.
    crate::run_cgroup::remove_leftover(
        host,
        Path::new(crate::run_cgroup::ROOT),
        &record.account.name,
    )
    .map_err(|e| residue(e.to_string()))?;
    let (top, _) = open_workspace(&record.workspace, Some(record.workspace_id))?;
    let b = workspace_bounds(std::time::Instant::now() + WORKSPACE_DEADLINE);
    let seen = names_seen(&top, &record.workspace, &b)?;
    let mut outside = Vec::new();
    walk_within::<WalkError>(&top, &b, &mut |n| {
        if linked_outside(n, &seen) && outside.len() < 8 {
            outside.push(format!("{:?}", n.path));
        }
        Ok(())
    })
    .map_err(|e| walk_failed(&record.workspace, &e))?;
    if !outside.is_empty() {
        return Err(residue(format!(
            "the workspace {} holds hard links to files outside it ({}): remove them, then recover",
            record.workspace.display(),
            outside.join(", ")
        )));
    }
    // Root's and closed while its entries change hands: no one passes through to run an
    // entry of the account's before it is the owner's; the owner's, with its mode, last.
    set_root(&top, &record.workspace, (0, 0), 0o700)?;
    let b = workspace_bounds(std::time::Instant::now() + WORKSPACE_DEADLINE);
    hand(
        &top,
        &record.workspace,
        &seen,
        record.owner,
        &[record.account.uid, record.owner.0],
        &b,
    )?;
    set_root(&top, &record.workspace, record.owner, record.workspace_mode)?;
    if own.is_dir() {
        carry(&own, record.account.uid, state, &record.carried)?;
    }
    match fs::remove_dir_all(&own) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", &own)(e)),
    }
    // userdel refuses an account with a live process: then it is residue, never removed.
    account::remove(host, accounts, &record.account)?;
    let path = record_path(state, &record.account.name);
    fs::remove_file(&path).map_err(io("remove", &path))?;
    sync_dir(&state.join(PER_RUN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::tests::policy;
    use crate::host::ToolOutput;
    use crate::host::fake::Fake;

    /// A state directory of root's and a workspace of uid 1000's, with a file in it.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        cordon_testkit::require_root("the per-run handover gives files to other users");
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::DirBuilder::new()
            .mode(STATE_MODE)
            .create(&state)
            .unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(STATE_MODE)).unwrap();
        let ws = dir.path().join("ws");
        fs::create_dir(&ws).unwrap();
        fs::write(ws.join("f"), "x").unwrap();
        for p in [&ws, &ws.join("f")] {
            std::os::unix::fs::lchown(p, Some(1000), Some(1000)).unwrap();
        }
        (dir, state, ws)
    }

    /// A host with empty account databases and no process.
    fn fake() -> Fake {
        let f = Fake::new();
        f.file("/etc/passwd", "")
            .file("/etc/group", "")
            .dir("/proc", &[]);
        f
    }

    /// [`begin`] of `ws` as checked now, run `run`, with the test account rules.
    fn begin_at(f: &Fake, state: &Path, ws: &Path, run: &str) -> Result<Begun, LeaseError> {
        begin(f, &policy(), state, "t", (ws, id_of(ws)), run, &[])
    }

    fn id_of(p: &Path) -> (u64, u64) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    fn owner(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().uid()
    }

    /// An account whose name or id is taken: nothing is made, no record is left, the workspace
    /// is untouched. A useradd that fails after groupadd: the record stays for recovery, and
    /// the workspace was never handed over.
    #[test]
    fn an_account_that_cannot_be_made_leaves_the_workspace_and_only_a_recoverable_record() {
        let (_d, state, ws) = setup();
        let f = fake();
        let a = account::for_lease(&policy(), "0000002a");
        f.file("/etc/passwd", &format!("{}:x:1:1::/:/bin/sh\n", a.name));
        let e = begin_at(&f, &state, &ws, "0000002a").unwrap_err();
        assert!(matches!(
            e,
            LeaseError::Account(account::AccountError::Taken { .. })
        ));
        assert!(pending(&state).unwrap().is_empty());
        assert_eq!(owner(&ws.join("f")), 1000);
        f.file("/etc/passwd", "").reply(
            "useradd",
            ToolOutput::failed("useradd: cannot lock /etc/passwd"),
        );
        let e = begin_at(&f, &state, &ws, "0000002a")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("failed: useradd: cannot lock /etc/passwd"),
            "{e}"
        );
        assert_eq!(pending(&state).unwrap().len(), 1);
        assert_eq!(owner(&ws.join("f")), 1000);
        // While it is pending nothing else begins.
        let e = begin_at(&f, &state, &ws, "0000002b").unwrap_err();
        assert!(matches!(e, LeaseError::Residue(_)), "{e}");
    }

    /// A run is ended only when the account's state holds no run; an account userdel refuses
    /// (a live process) keeps the record: the workspace is returned, the run is residue until
    /// recovery ends it, which then finishes.
    #[test]
    fn an_account_that_cannot_be_removed_is_residue_until_a_later_end_finishes() {
        let (_d, state, ws) = setup();
        let f = fake();
        let record = begin_at(&f, &state, &ws, "0000002c").unwrap().record;
        assert_eq!(owner(&ws.join("f")), record.account.uid);
        let own = account_state(&state, &record.account);
        fs::create_dir_all(own.join(rootless::RUNS).join("cs-1")).unwrap();
        assert!(matches!(
            end(&f, &policy(), &state, &record),
            Err(LeaseError::Residue(_))
        ));
        assert_eq!(owner(&ws.join("f")), record.account.uid);
        fs::remove_dir(own.join(rootless::RUNS).join("cs-1")).unwrap();
        let a = &record.account;
        f.file(
            "/etc/passwd",
            &format!("{}:x:{}:{}::/:/bin/false\n", a.name, a.uid, a.gid),
        )
        .reply(
            "userdel",
            ToolOutput::failed("userdel: user is currently used by process 7"),
        );
        let e = end(&f, &policy(), &state, &record).unwrap_err().to_string();
        assert!(
            e.contains("failed: userdel: user is currently used by process 7"),
            "{e}"
        );
        assert_eq!(owner(&ws.join("f")), 1000);
        assert_eq!(pending(&state).unwrap(), vec![(record.clone(), false)]);
        let f = fake();
        end(&f, &policy(), &state, &record).unwrap();
        assert!(pending(&state).unwrap().is_empty());
    }

    /// Whatever names the run left are handed back, bytes that are not UTF-8 included; a
    /// workspace deeper than root walks is residue, named, until it is cleared.
    #[test]
    fn any_name_the_run_left_is_handed_back_and_a_walk_without_end_is_residue() {
        use std::os::unix::ffi::OsStrExt;
        let (_d, state, ws) = setup();
        let f = fake();
        let begun = begin_at(&f, &state, &ws, "00000035").unwrap();
        let record = begun.record.clone();
        drop(begun);
        let raw = ws.join(std::ffi::OsStr::from_bytes(b"raw\xff"));
        let odd = raw.join(std::ffi::OsStr::from_bytes(b"\x1b[2J\xfe"));
        let deep = ws.join(vec!["d"; usize::try_from(WORKSPACE_DEPTH).unwrap() + 2].join("/"));
        fs::create_dir_all(&deep).unwrap();
        fs::create_dir(&raw).unwrap();
        fs::write(&odd, "x").unwrap();
        let uid = Some(record.account.uid);
        for p in [&raw, &odd] {
            std::os::unix::fs::lchown(p, uid, uid).unwrap();
        }
        let e = crate::error_chain(&end(&f, &policy(), &state, &record).unwrap_err());
        assert!(
            e.ends_with("d/d: the walk went past its bound of depth 1024"),
            "{e}"
        );
        assert_eq!(pending(&state).unwrap(), vec![(record.clone(), false)]);
        fs::remove_dir_all(ws.join("d")).unwrap();
        end(&f, &policy(), &state, &record).unwrap();
        for p in [&raw, &odd] {
            assert_eq!(owner(p), 1000);
        }
        assert!(pending(&state).unwrap().is_empty());
    }

    /// The workspace is never reached through a link, and an inode with a name outside it is
    /// never handed over: refused before the run; residue after it (removed, recovery ends).
    /// Hard links inside it are its own. A process of the account left stops the take-back.
    #[test]
    fn links_out_of_the_workspace_and_live_processes_stop_the_handover() {
        let (d, state, ws) = setup();
        let f = fake();
        // A link above the workspace (a parent its owner could re-point) is never followed.
        let via = d.path().join("via");
        std::os::unix::fs::symlink(d.path(), &via).unwrap();
        assert!(
            begin(
                &f,
                &policy(),
                &state,
                "t",
                (&via.join("ws"), id_of(&ws)),
                "00000031",
                &[],
            )
            .is_err()
        );
        assert!(pending(&state).unwrap().is_empty());
        let outside = d.path().join("outside");
        fs::write(&outside, "o").unwrap();
        std::os::unix::fs::lchown(&outside, Some(1000), Some(1000)).unwrap();
        fs::hard_link(&outside, ws.join("out")).unwrap();
        let e = begin_at(&f, &state, &ws, "00000032").unwrap_err();
        assert!(e.to_string().contains("hand over"), "{e}");
        assert_eq!(owner(&outside), 1000);
        fs::remove_file(ws.join("out")).unwrap();
        // Two names inside: handed over and back like any file.
        fs::hard_link(ws.join("f"), ws.join("g")).unwrap();
        let begun = begin_at(&f, &state, &ws, "00000033").unwrap();
        let record = begun.record.clone();
        assert_eq!(owner(&ws.join("g")), record.account.uid);
        // Closed to all but the account while it runs.
        assert_eq!(fs::metadata(&ws).unwrap().mode() & 0o7777, 0o700);
        // Another user's file moved in during the run is never given to the owner.
        let foreign = ws.join("foreign");
        fs::write(&foreign, "bob's").unwrap();
        std::os::unix::fs::lchown(&foreign, Some(2000), Some(2000)).unwrap();
        // Refused at the file itself: its owner is not one the walk may hand over.
        let e = crate::error_chain(&end(&f, &policy(), &state, &record).unwrap_err());
        assert!(e.ends_with("foreign: changed while it was walked"), "{e}");
        assert_eq!(owner(&foreign), 2000);
        fs::remove_file(&foreign).unwrap();
        // Live: its supervisor holds it.
        assert_eq!(pending(&state).unwrap(), vec![(record.clone(), true)]);
        drop(begun);
        // The run linked a file outside into the workspace: residue, the outside file untouched.
        fs::hard_link(&outside, ws.join("planted")).unwrap();
        assert!(matches!(
            end(&f, &policy(), &state, &record),
            Err(LeaseError::Residue(_))
        ));
        assert_eq!(owner(&outside), 1000);
        fs::remove_file(ws.join("planted")).unwrap();
        // A process of the account: residue until it is gone.
        let busy = fake();
        busy.dir("/proc", &["7"]).file(
            "/proc/7/status",
            &format!("Name:\tsh\nUid:\t{0}\t{0}\t{0}\t{0}\n", record.account.uid),
        );
        assert!(matches!(
            end(&busy, &policy(), &state, &record),
            Err(LeaseError::Residue(_))
        ));
        // Residue keeps the workspace closed: root's, 0700, until an end finishes.
        assert_eq!(owner(&ws), 0);
        assert_eq!(fs::metadata(&ws).unwrap().mode() & 0o7777, 0o700);
        end(&f, &policy(), &state, &record).unwrap();
        assert_eq!(owner(&ws.join("g")), 1000);
        assert_eq!(owner(&ws), 1000);
        assert_eq!(
            fs::metadata(&ws).unwrap().mode() & 0o7777,
            record.workspace_mode
        );
        assert!(pending(&state).unwrap().is_empty());
        // Root's workspace, or one an account holds (a nested run), is never handed over.
        for uid in [0, 5500] {
            std::os::unix::fs::lchown(&ws, Some(uid), Some(uid)).unwrap();
            let e = crate::error_chain(&begin_at(&f, &state, &ws, "00000034").unwrap_err());
            assert!(
                e.contains(&format!(
                    "the workspace is uid {uid}'s: neither root's nor a per-run account's"
                )),
                "{e}"
            );
        }
        assert!(pending(&state).unwrap().is_empty());
    }
}
