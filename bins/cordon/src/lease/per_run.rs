//! The surface in a per-run account (REQ-117, `user "per-run"`): started as root, the surface
//! makes a fresh account, hands it the workspace, runs its rootless path as that account in a
//! state directory of the account's own, then takes the workspace back and removes the account.
//!
//! It owns the per-run layout under the surface's state directory (root's, [`STATE_MODE`]):
//! `per-run/<account>.json`, the record, made durable before the account exists, and
//! `per-run/<account>/`, the account's own state directory (0700, the account's). A record on
//! disk is a run not yet ended: while one exists no per-run run starts (the run before it may
//! still hold the workspace), and `cordon-reap --surface` as root recovers it — the account's
//! runs released as the account, then [`end`].
//!
//! The handover goes by file descriptors ([`crate::walk`], never following a link or crossing
//! a mount): before the run every entry of the workspace must be its owner's (otherwise
//! nothing is changed and the run is refused: an entry of a third user's would become the
//! account's); after it every entry is the owner's again, with set-id bits cleared.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{LeaseError, Residue, io, rootless};
use crate::account::{self, Account, AccountPolicy};
use crate::host::Host;
use crate::walk::{WalkError, walk};

/// The surface state directory's subdirectory of per-run records and account state.
pub const PER_RUN: &str = "per-run";
/// The mode of root's state directory and of its `per-run/`: each account passes through both
/// to its own directory, and no one but root lists or changes them.
pub const STATE_MODE: u32 = 0o711;
const SCHEMA: u32 = 1;

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
    /// Files of root's state directory (relative) the account's state gets a copy of at the
    /// start and gives back at the end (the surface's record of the agent's directories).
    pub carried: Vec<PathBuf>,
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

fn record_path(state: &Path, name: &str) -> PathBuf {
    state.join(PER_RUN).join(format!("{name}.json"))
}

fn sync_dir(path: &Path) -> Result<(), LeaseError> {
    fs::File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", path))
}

/// The per-run runs not yet ended, by their records.
///
/// # Errors
/// The directory or a record cannot be read: nothing is then known to be ended.
pub fn pending(state: &Path) -> Result<Vec<Record>, LeaseError> {
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
        let text = fs::read(&path).map_err(io("read", &path))?;
        let record: Record = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if record.schema != SCHEMA || record_path(state, &record.account.name) != path {
            return Err(bad("not a per-run record of this build's".into()));
        }
        out.push(record);
    }
    out.sort_by(|a, b| a.account.name.cmp(&b.account.name));
    Ok(out)
}

/// Give every entry of `workspace` to `to`.
fn hand(workspace: &Path, to: (u32, u32)) -> Result<(), LeaseError> {
    walk::<WalkError>(workspace, &mut |n| n.chown(to.0, to.1))
        .map_err(|e| io("hand over", workspace)(std::io::Error::other(e.to_string())))
}

/// Copy each of `files` (relative, plain names below a directory) that exists under `from` to
/// `to`, directories made 0700; given `owner`, everything made is theirs. Written whole, then
/// renamed into place.
fn carry(
    from: &Path,
    to: &Path,
    files: &[PathBuf],
    owner: Option<(u32, u32)>,
) -> Result<(), LeaseError> {
    let give = |p: &Path| match owner {
        Some((uid, gid)) => {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid)).map_err(io("give", p))
        }
        None => Ok(()),
    };
    for rel in files {
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(io("carry", rel)(std::io::Error::other(
                "not a plain relative path",
            )));
        }
        let source = from.join(rel);
        let text = match fs::read(&source) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("read", &source)(e)),
        };
        let dest = to.join(rel);
        if let Some(dir) = dest.parent() {
            if !dir.is_dir() {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(dir)
                    .map_err(io("make", dir))?;
                give(dir)?;
            }
        }
        let partial = dest.with_extension("partial");
        fs::write(&partial, text).map_err(io("write", &partial))?;
        give(&partial)?;
        fs::rename(&partial, &dest).map_err(io("write", &dest))?;
    }
    Ok(())
}

/// Begin a per-run run of `workspace`: refuse while an earlier one is not ended, write the
/// record, make the account, its state directory, and hand it the workspace. The record, so
/// that whatever fails after it was written is [`end`]ed by recovery.
///
/// # Errors
/// An earlier run is pending, the workspace holds a foreign entry, or a step failed.
pub fn begin(
    host: &dyn Host,
    accounts: &AccountPolicy,
    state: &Path,
    owner_tag: &str,
    workspace: &Path,
    run: &str,
    carried: &[PathBuf],
) -> Result<Record, LeaseError> {
    let dir = state.join(PER_RUN);
    match fs::DirBuilder::new().mode(STATE_MODE).create(&dir) {
        Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(STATE_MODE))
            .map_err(io("make", &dir))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("make", &dir)(e)),
    }
    existing_state(&dir)?;
    if let Some(earlier) = pending(state)?.first() {
        return Err(LeaseError::Residue(Residue {
            items: vec![format!(
                "the per-run account {} of an earlier run is not removed (cordon-reap --surface recovers it)",
                earlier.account.name
            )],
        }));
    }
    let m = fs::symlink_metadata(workspace).map_err(io("examine", workspace))?;
    let record = Record {
        schema: SCHEMA,
        account: account::for_lease(accounts, run),
        workspace: workspace.to_path_buf(),
        owner: (m.uid(), m.gid()),
        workspace_id: (m.dev(), m.ino()),
        carried: carried.to_vec(),
    };
    // Proven before anything exists: a refused workspace leaves nothing to recover.
    let mut foreign = None;
    walk::<WalkError>(workspace, &mut |n| {
        let why = if (n.stat.uid, n.stat.gid) != record.owner {
            Some("is not the workspace owner's: a third user's file would become the run's")
        } else if n.stat.kind == crate::walk::Kind::File && n.stat.nlink > 1 {
            // Its inode may also be a file outside the workspace, which the handover would give.
            Some("has other hard links: the file they name would become the run's")
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
    .map_err(|e| io("examine", workspace)(std::io::Error::other(e.to_string())))?;
    if let Some(why) = foreign {
        return Err(io("hand over", workspace)(std::io::Error::other(why)));
    }
    let path = record_path(state, &record.account.name);
    let text =
        serde_json::to_vec(&record).map_err(|e| io("encode", &path)(std::io::Error::other(e)))?;
    {
        use std::io::Write;
        let mut f = crate::store::create_exclusive(&path, 0o600)?;
        f.write_all(&text)
            .and_then(|()| f.sync_all())
            .map_err(io("write", &path))?;
    }
    sync_dir(&dir)?;
    match account::create(host, accounts, &record.account, owner_tag) {
        Ok(()) => {}
        // Nothing was made: the record goes with the refusal.
        Err(e @ account::AccountError::Taken { .. }) => {
            fs::remove_file(&path).map_err(io("remove", &path))?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    }
    let own = account_state(state, &record.account);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&own)
        .map_err(io("make", &own))?;
    let to = (record.account.uid, record.account.gid);
    std::os::unix::fs::lchown(&own, Some(to.0), Some(to.1)).map_err(io("give", &own))?;
    carry(state, &own, &record.carried, Some(to))?;
    hand(workspace, to)?;
    Ok(record)
}

/// End a per-run run: the account's runs must all be released (its state directory holds no
/// run), then the workspace is its owner's again, the account's state directory and the
/// account are removed, and the record last. Ending what is already partly ended finishes it.
///
/// # Errors
/// A run of the account is left, the workspace at its path is another directory, or a step
/// failed: the record stays, for recovery.
pub fn end(
    host: &dyn Host,
    accounts: &AccountPolicy,
    state: &Path,
    record: &Record,
) -> Result<(), LeaseError> {
    let own = account_state(state, &record.account);
    let runs = own.join(rootless::RUNS);
    match fs::read_dir(&runs) {
        Ok(mut d) => {
            if let Some(left) = d.next() {
                let left = left.map_err(io("list", &runs))?;
                return Err(LeaseError::Residue(Residue {
                    items: vec![format!(
                        "run {:?} of per-run account {} is not released",
                        left.file_name(),
                        record.account.name
                    )],
                }));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("list", &runs)(e)),
    }
    let m = fs::symlink_metadata(&record.workspace).map_err(io("examine", &record.workspace))?;
    if !m.is_dir() || (m.dev(), m.ino()) != record.workspace_id {
        return Err(LeaseError::Residue(Residue {
            items: vec![format!(
                "the workspace {} is no longer the directory handed to {}",
                record.workspace.display(),
                record.account.name
            )],
        }));
    }
    hand(&record.workspace, record.owner)?;
    if own.is_dir() {
        carry(&own, state, &record.carried, None)?;
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

    fn owner(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().uid()
    }

    /// An account whose name or id is taken: nothing is made, no record is left, the workspace
    /// is untouched. A useradd that fails after groupadd: the record stays for recovery, and
    /// the workspace was never handed over.
    #[test]
    fn an_account_that_cannot_be_made_leaves_the_workspace_and_only_a_recoverable_record() {
        let (_d, state, ws) = setup();
        let f = Fake::new();
        f.file("/etc/passwd", "").file("/etc/group", "");
        let a = account::for_lease(&policy(), "0000002a");
        f.file("/etc/passwd", &format!("{}:x:1:1::/:/bin/sh\n", a.name));
        let e = begin(&f, &policy(), &state, "t", &ws, "0000002a", &[]).unwrap_err();
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
        assert!(begin(&f, &policy(), &state, "t", &ws, "0000002a", &[]).is_err());
        assert_eq!(pending(&state).unwrap().len(), 1);
        assert_eq!(owner(&ws.join("f")), 1000);
        // While it is pending nothing else begins.
        let e = begin(&f, &policy(), &state, "t", &ws, "0000002b", &[]).unwrap_err();
        assert!(matches!(e, LeaseError::Residue(_)), "{e}");
    }

    /// A run is ended only when the account's state holds no run; an account userdel refuses
    /// (a live process) keeps the record: the workspace is returned, the run is residue until
    /// recovery ends it, which then finishes.
    #[test]
    fn an_account_that_cannot_be_removed_is_residue_until_a_later_end_finishes() {
        let (_d, state, ws) = setup();
        let f = Fake::new();
        f.file("/etc/passwd", "").file("/etc/group", "");
        let record = begin(&f, &policy(), &state, "t", &ws, "0000002c", &[]).unwrap();
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
        assert!(end(&f, &policy(), &state, &record).is_err());
        assert_eq!(owner(&ws.join("f")), 1000);
        assert_eq!(pending(&state).unwrap(), vec![record.clone()]);
        let f = Fake::new();
        f.file("/etc/passwd", "").file("/etc/group", "");
        end(&f, &policy(), &state, &record).unwrap();
        assert!(pending(&state).unwrap().is_empty());
    }
}
