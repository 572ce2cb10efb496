//! Run-scoped skill snapshots (seed 002: "each run copies only those selected immutable
//! versions into a run-scoped plugin outside the project workspace; the sandbox exposes that
//! snapshot read-only and deletes it after the run").
//!
//! - **Store**: `STATE/skills/<hex>/`, one directory per version, named by its skill digest
//!   (domain `cordon.skill` over the sorted `(path, mode, size, sha256)` list, the same entry
//!   shape as an engine tree's). The state directory is the service user's own (0700) and
//!   disjoint from every workspace; a version, once published (by rename), is never changed:
//!   files 0444 or 0555, directories 0555. `cordon-surface skills import DIR` adds one.
//! - **Snapshot**: `run --skill NAME@sha256:<hex>` copies exactly that version into the run
//!   directory (`runs/<run>/skills/NAME`), hashing every byte it copies: a stored version
//!   that no longer matches its digest is refused, never exposed. The copy is bound
//!   read-only at the policy's `skills` path; it goes with the run directory at release (or
//!   at `cordon-reap --surface` after a crash). The receipt records the versions requested.
//!
//! Nothing is read from the workspace: a skill or configuration planted there is just a file.
//! Links, devices, sockets and fifos are refused at import, as are names that are not clean
//! UTF-8 paths.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon::canonical::{Digest, domain_digest};
use cordon_canon::tree_digest::Entry;

/// The state directory's skill store.
pub const SKILLS: &str = "skills";
/// A run directory's snapshot.
pub const SNAPSHOT: &str = "skills";
/// The most files in one skill.
const FILES_MAX: usize = 10_000;
/// The most bytes in one skill.
const BYTES_MAX: u64 = 256 << 20;

/// Why a skill cannot be imported or selected (a usage error: exit 2; a stored version that
/// no longer matches its digest is a no-decision: exit 3).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SkillError {
    /// `--skill` is not `NAME@sha256:<hex>`.
    #[error("skill {0:?} is not NAME@sha256:<64 hex>")]
    #[diagnostic(
        code(cordon::surface::skill_spec),
        help(
            "NAME is 1–64 of A-Z a-z 0-9 . _ - (not . or ..); the digest is what `skills import` printed"
        )
    )]
    Spec(String),
    /// The directory to import holds what a skill may not.
    #[error("cannot import {path}: {why}")]
    #[diagnostic(code(cordon::surface::skill_import))]
    Import {
        /// The offending path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The version is not in the store.
    #[error("skill version {0} is not in the store")]
    #[diagnostic(
        code(cordon::surface::skill_missing),
        help("import it first: cordon-surface skills import DIR")
    )]
    Missing(String),
    /// The stored version no longer matches its digest.
    #[error("stored skill version {requested} does not match its digest (found {found})")]
    #[diagnostic(code(cordon::surface::skill_corrupt))]
    Corrupt {
        /// What was asked for.
        requested: String,
        /// What the bytes hash to.
        found: Digest,
    },
    /// A file could not be read or written.
    #[error("cannot {what} {path}")]
    #[diagnostic(code(cordon::surface::skill_io))]
    Io {
        /// What.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl cordon::exit::ExitClass for SkillError {
    fn exit_class(&self) -> cordon::ExitCode {
        match self {
            Self::Spec(_) | Self::Import { .. } | Self::Missing(_) => cordon::ExitCode::Usage,
            Self::Corrupt { .. } | Self::Io { .. } => cordon::ExitCode::NoDecision,
        }
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SkillError + 'a {
    move |source| SkillError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A selected version: `NAME@sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// Where it appears under the policy's `skills` path.
    pub name: String,
    /// Its skill digest.
    pub digest: Digest,
}

impl std::fmt::Display for Selected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.digest)
    }
}

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
}

/// Parse `NAME@sha256:<hex>`.
///
/// # Errors
/// [`SkillError::Spec`].
pub fn parse(spec: &str) -> Result<Selected, SkillError> {
    let bad = || SkillError::Spec(cordon_canon::text::printable(spec).into_owned());
    let (name, digest) = spec.split_once('@').ok_or_else(bad)?;
    if !name_ok(name) {
        return Err(bad());
    }
    let digest: Digest = digest.parse().map_err(|_| bad())?;
    Ok(Selected {
        name: name.to_owned(),
        digest,
    })
}

/// The skill digest of sorted entries.
fn digest_of(entries: &[Entry]) -> Digest {
    // Entries are plain data: encoding cannot fail; a failure would be a bug, kept visible.
    domain_digest("cordon.skill", 1, entries).unwrap_or_else(|_| Digest::of_bytes(b"unencodable"))
}

/// A file of a tree to copy: its relative path and whether it is executable.
struct File1 {
    rel: String,
    executable: bool,
}

/// The regular files beneath `root`, sorted, with the directories to make; links, devices,
/// sockets and fifos refused, every name clean UTF-8.
fn walk(root: &Path) -> Result<(Vec<String>, Vec<File1>), SkillError> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut stack = vec![String::new()];
    let mut bytes = 0u64;
    while let Some(rel) = stack.pop() {
        let at = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        for e in fs::read_dir(&at).map_err(io_err("read", &at))? {
            let e = e.map_err(io_err("read", &at))?;
            let path = e.path();
            let bad = |why: &str| SkillError::Import {
                path: path.clone(),
                why: why.to_owned(),
            };
            let name = e
                .file_name()
                .into_string()
                .map_err(|_| bad("the name is not UTF-8"))?;
            if name.contains(['\n', '\r', '\\']) || name.chars().any(char::is_control) {
                return Err(bad("the name holds a control character"));
            }
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let m = fs::symlink_metadata(&path).map_err(io_err("examine", &path))?;
            if m.is_dir() {
                dirs.push(child.clone());
                stack.push(child);
            } else if m.is_file() {
                bytes += m.len();
                if files.len() >= FILES_MAX || bytes > BYTES_MAX {
                    return Err(bad(&format!(
                        "a skill holds at most {FILES_MAX} files and {BYTES_MAX} bytes"
                    )));
                }
                files.push(File1 {
                    rel: child,
                    executable: m.mode() & 0o111 != 0,
                });
            } else {
                return Err(bad(
                    "not a directory or a regular file (links are not followed)",
                ));
            }
        }
    }
    dirs.sort();
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok((dirs, files))
}

/// A reader that writes what it reads.
struct Tee<R, W>(R, W);

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// Copy the tree at `src` to `dest` (which must not exist), hashing every byte copied:
/// files `file_mode` (executable for its readers when the source is), directories made 0700 and then given
/// `dir_mode`. The copy's entries, sorted.
fn copy_tree(
    src: &Path,
    dest: &Path,
    file_mode: u32,
    dir_mode: u32,
) -> Result<Vec<Entry>, SkillError> {
    let (dirs, files) = walk(src)?;
    let mk = |p: &Path| {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(p)
            .map_err(io_err("make", p))
    };
    mk(dest)?;
    for d in &dirs {
        mk(&dest.join(d))?;
    }
    let mut entries = Vec::with_capacity(files.len());
    for f in &files {
        let from = src.join(&f.rel);
        let to = dest.join(&f.rel);
        let input = OpenOptions::new()
            .read(true)
            // Never a link, and a fifo put in a file's place never blocks the copy.
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&from)
            .map_err(io_err("read", &from))?;
        let output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&to)
            .map_err(io_err("write", &to))?;
        let (sha256, size) =
            Digest::of_reader(Tee(input, &output)).map_err(io_err("copy", &from))?;
        let mode = if f.executable { 0o555 } else { 0o444 };
        // Executable for exactly those who may read it: 0444 → 0555, 0400 → 0500.
        let own = if f.executable {
            file_mode | (file_mode & 0o444) >> 2
        } else {
            file_mode
        };
        output
            .set_permissions(fs::Permissions::from_mode(own))
            .map_err(io_err("seal", &to))?;
        entries.push(Entry {
            path: f.rel.clone(),
            mode,
            size,
            sha256,
        });
    }
    // Deepest first, so a sealed parent never stops its child's change.
    for d in dirs
        .iter()
        .rev()
        .map(|d| dest.join(d))
        .chain([dest.to_path_buf()])
    {
        fs::set_permissions(&d, fs::Permissions::from_mode(dir_mode))
            .map_err(io_err("seal", &d))?;
    }
    Ok(entries)
}

/// Import the skill at `dir` into `state`'s store; its selection, named by `dir`'s last
/// component. Importing a version already stored verifies it and changes nothing.
///
/// # Errors
/// [`SkillError`].
pub fn import(state: &Path, dir: &Path) -> Result<Selected, SkillError> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| name_ok(n))
        .ok_or_else(|| SkillError::Import {
            path: dir.to_path_buf(),
            why: "its directory name is not a skill name (1–64 of A-Z a-z 0-9 . _ -)".into(),
        })?
        .to_owned();
    let store = state.join(SKILLS);
    cordon::lease::rootless::private_dir(&store).map_err(|e| SkillError::Io {
        what: "make",
        path: store.clone(),
        source: io::Error::other(e.to_string()),
    })?;
    let pending = store.join(format!(".pending-{}", cordon::lease::fresh_id()));
    let copied = copy_tree(dir, &pending, 0o444, 0o555);
    let result = copied.and_then(|entries| {
        let digest = digest_of(&entries);
        let at = store.join(digest.hex());
        if at.exists() {
            return Ok(digest);
        }
        fs::rename(&pending, &at).map_err(io_err("publish", &at))?;
        File::open(&store)
            .and_then(|d| d.sync_all())
            .map_err(io_err("sync", &store))?;
        Ok(digest)
    });
    // Whatever is left of the pending copy goes (its directories sealed 0555 first opened).
    if pending.exists() {
        let _ = unseal(&pending);
        let _ = fs::remove_dir_all(&pending);
    }
    let digest = result?;
    let selected = Selected { name, digest };
    // The stored version, already there or just published, is what the digest says.
    verify(state, &selected)?;
    Ok(selected)
}

/// Give the owner write access to every directory beneath `dir` again (to remove it).
fn unseal(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            unseal(&e.path())?;
        }
    }
    Ok(())
}

/// Re-hash a stored version against its digest.
fn verify(state: &Path, selected: &Selected) -> Result<(), SkillError> {
    let at = state.join(SKILLS).join(selected.digest.hex());
    let (_, files) = walk(&at)?;
    let mut entries = Vec::with_capacity(files.len());
    for f in files {
        let p = at.join(&f.rel);
        let file = File::open(&p).map_err(io_err("read", &p))?;
        let (sha256, size) = Digest::of_reader(file).map_err(io_err("read", &p))?;
        entries.push(Entry {
            path: f.rel,
            mode: if f.executable { 0o555 } else { 0o444 },
            size,
            sha256,
        });
    }
    let found = digest_of(&entries);
    if found != selected.digest {
        return Err(SkillError::Corrupt {
            requested: selected.to_string(),
            found,
        });
    }
    Ok(())
}

/// Where `run_dir`'s snapshot of each selection goes (the planner binds these).
#[must_use]
pub fn snapshot_paths(run_dir: &Path, selected: &[Selected]) -> Vec<(String, PathBuf)> {
    selected
        .iter()
        .map(|s| (s.name.clone(), run_dir.join(SNAPSHOT).join(&s.name)))
        .collect()
}

/// Whether every selected version is stored, and no name is selected twice (before the run
/// exists: a run never starts for a version it cannot have).
///
/// # Errors
/// [`SkillError::Missing`], [`SkillError::Spec`].
pub fn check(state: &Path, selected: &[Selected]) -> Result<(), SkillError> {
    let mut names = std::collections::BTreeSet::new();
    for s in selected {
        if !names.insert(&s.name) {
            return Err(SkillError::Spec(format!("{s} (the name {} twice)", s.name)));
        }
        if !state.join(SKILLS).join(s.digest.hex()).is_dir() {
            return Err(SkillError::Missing(s.to_string()));
        }
    }
    Ok(())
}

/// Copy each selected version into `run_dir`'s snapshot (owner-only: the bind makes it
/// read-only inside), each byte hashed on the way: exactly the version asked for, or refused.
///
/// # Errors
/// [`SkillError::Corrupt`] for a stored version that no longer matches its digest; I/O.
pub fn snapshot(state: &Path, run_dir: &Path, selected: &[Selected]) -> Result<(), SkillError> {
    if selected.is_empty() {
        return Ok(());
    }
    let root = run_dir.join(SNAPSHOT);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(io_err("make", &root))?;
    for s in selected {
        let src = state.join(SKILLS).join(s.digest.hex());
        let entries = copy_tree(&src, &root.join(&s.name), 0o400, 0o700)?;
        let found = digest_of(&entries);
        if found != s.digest {
            return Err(SkillError::Corrupt {
                requested: s.to_string(),
                found,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skill_is_imported_once_snapshotted_exactly_and_a_changed_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        let skill = dir.path().join("review");
        fs::create_dir_all(skill.join("bin")).unwrap();
        fs::write(skill.join("SKILL.md"), "review code\n").unwrap();
        fs::write(skill.join("bin/run"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(skill.join("bin/run"), fs::Permissions::from_mode(0o755)).unwrap();
        let sel = import(&state, &skill).unwrap();
        assert_eq!(sel.name, "review");
        // Again: the same version, nothing new.
        assert_eq!(import(&state, &skill).unwrap(), sel);
        assert_eq!(fs::read_dir(state.join(SKILLS)).unwrap().count(), 1);
        let parsed = parse(&sel.to_string()).unwrap();
        assert_eq!(parsed, sel);
        check(&state, std::slice::from_ref(&sel)).unwrap();
        let run = dir.path().join("run");
        fs::create_dir(&run).unwrap();
        snapshot(&state, &run, std::slice::from_ref(&sel)).unwrap();
        assert_eq!(
            fs::read_to_string(run.join("skills/review/SKILL.md")).unwrap(),
            "review code\n"
        );
        let m = fs::metadata(run.join("skills/review/bin/run")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o500);
        // The snapshot can be removed by its owner (the run directory's release).
        fs::remove_dir_all(run.join("skills")).unwrap();
        // A changed stored version is never exposed.
        let stored = state.join(SKILLS).join(sel.digest.hex());
        fs::set_permissions(&stored, fs::Permissions::from_mode(0o755)).unwrap();
        let f = stored.join("SKILL.md");
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&f, "exfiltrate\n").unwrap();
        assert!(matches!(
            snapshot(&state, &run, std::slice::from_ref(&sel)),
            Err(SkillError::Corrupt { .. })
        ));
        // Unknown versions, bad names and links are refused.
        let other = parse(&format!("review@{}", Digest::of_bytes(b"x"))).unwrap();
        assert!(matches!(
            check(&state, &[other]),
            Err(SkillError::Missing(_))
        ));
        assert!(matches!(
            check(&state, &[sel.clone(), sel]),
            Err(SkillError::Spec(_))
        ));
        for bad in [
            "..@sha256:00",
            "a/b@sha256:00",
            "x",
            "x@md5:00",
            "@sha256:00",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let linked = dir.path().join("linked");
        fs::create_dir(&linked).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", linked.join("passwd")).unwrap();
        assert!(matches!(
            import(&state, &linked),
            Err(SkillError::Import { .. })
        ));
        assert_eq!(
            fs::read_dir(state.join(SKILLS)).unwrap().count(),
            1,
            "nothing left pending"
        );
    }
}
