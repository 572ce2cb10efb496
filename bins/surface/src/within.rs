//! The surface's invariant as a pure predicate: the ADR's `AgentFileOp.Authorized`. Every file
//! effect of a run — read, write, create, delete, glob or grep target — lies within the run's
//! workspace, except reads of the named read set.
//!
//! Inside the container the operating system enforces it: nothing but the read set and the
//! workspace exists there. On the host, cordon-surface uses [`resolved_within`] wherever it
//! decides what belongs to a run (the policy file must not, the state directory must not, the
//! home and temp directories it makes must). [`path_within`] is lexical — `..` and `.` are
//! resolved as the kernel resolves them from the root, a path is compared component by
//! component and byte by byte (non-UTF-8 names included) — and knows nothing of symbolic links
//! or mounts; [`resolved_within`] resolves links on the host first.

use std::path::{Component, Path, PathBuf};

/// `path` with `.` and `..` resolved lexically; a relative `path` is taken from `cwd`. `..` at
/// the root stays at the root, as the kernel's resolution does.
#[must_use]
pub fn normalize(cwd: &Path, path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    let start = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    for c in start.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
        }
    }
    out
}

/// Whether `path` — absolute, or relative to the run's workspace, where a run starts — lies
/// within `run` (the workspace, absolute). Lexical: see the module documentation.
#[must_use]
pub fn path_within(run: &Path, path: &Path) -> bool {
    if !run.is_absolute() {
        return false;
    }
    let run = normalize(Path::new("/"), run);
    normalize(&run, path).starts_with(&run)
}

/// [`path_within`] after resolving symbolic links on the host: the deepest existing ancestor of
/// `path` is canonicalized (a link anywhere in it is followed), the rest appended lexically.
/// `run` is canonicalized too.
///
/// # Errors
/// `run` cannot be canonicalized, or an existing ancestor of `path` cannot be read.
pub fn resolved_within(run: &Path, path: &Path) -> std::io::Result<bool> {
    let run = std::fs::canonicalize(run)?;
    let full = normalize(&run, path);
    let mut existing = full.as_path();
    let mut rest = Vec::new();
    let base = loop {
        match std::fs::canonicalize(existing) {
            Ok(p) => break p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(name) = existing.file_name() else {
                    return Err(e);
                };
                rest.push(name.to_owned());
                existing = existing.parent().unwrap_or(Path::new("/"));
            }
            Err(e) => return Err(e),
        }
    };
    let resolved = rest.iter().rev().fold(base, |p, n| p.join(n));
    Ok(path_within(&run, &resolved))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use proptest::prelude::*;

    use super::*;

    /// A path component: a name (any bytes but `/` and NUL, non-UTF-8 included), `.` or `..`.
    fn component() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => proptest::collection::vec(
                any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0),
                1..6
            ).prop_filter("not . or ..", |v| v != b"." && v != b".."),
            1 => Just(b"..".to_vec()),
            1 => Just(b".".to_vec()),
        ]
    }

    fn join(parts: &[Vec<u8>]) -> PathBuf {
        let mut p = PathBuf::new();
        for c in parts {
            p.push(OsStr::from_bytes(c));
        }
        p
    }

    /// The reference model: a stack of names, `..` pops (never below the root).
    fn model(run: &[Vec<u8>], path: &[Vec<u8>], absolute: bool) -> bool {
        let mut stack: Vec<&[u8]> = if absolute {
            Vec::new()
        } else {
            run.iter().map(Vec::as_slice).collect()
        };
        for c in path {
            match c.as_slice() {
                b"." => {}
                b".." => {
                    stack.pop();
                }
                name => stack.push(name),
            }
        }
        stack.len() >= run.len() && stack.iter().zip(run).all(|(a, b)| *a == b.as_slice())
    }

    proptest! {
        #[test]
        fn agrees_with_a_stack_model_over_dots_and_non_utf8_names(
            run in proptest::collection::vec(
                proptest::collection::vec(b'a'..=b'c', 1..3), 1..4),
            path in proptest::collection::vec(component(), 0..10),
            absolute in any::<bool>(),
        ) {
            let run_path = Path::new("/").join(join(&run));
            let p = if absolute { Path::new("/").join(join(&path)) } else { join(&path) };
            prop_assert_eq!(path_within(&run_path, &p), model(&run, &path, absolute));
        }

        #[test]
        fn a_name_that_only_shares_a_prefix_is_outside(
            suffix in proptest::collection::vec(
                any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0), 1..8),
        ) {
            let mut sibling = b"/ws".to_vec();
            sibling.extend(&suffix);
            prop_assert!(!path_within(Path::new("/ws"), Path::new(OsStr::from_bytes(&sibling))));
        }
    }

    #[test]
    fn dot_dot_out_and_back_in_is_within_and_out_is_not() {
        let ws = Path::new("/srv/ws");
        assert!(path_within(ws, Path::new("a/../b")));
        assert!(path_within(ws, Path::new("../ws/x")));
        assert!(!path_within(ws, Path::new("../ws2/x")));
        assert!(!path_within(ws, Path::new("../../../../etc/shadow")));
        assert!(!path_within(ws, Path::new("/etc/shadow")));
        assert!(path_within(ws, Path::new("/srv/ws")));
        assert!(!path_within(ws, Path::new("/srv")));
        assert!(!path_within(Path::new("relative"), Path::new("relative/x")));
    }

    #[test]
    fn a_symlink_inside_pointing_outside_is_outside_once_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::os::unix::fs::symlink("/etc", ws.join("link")).unwrap();
        std::fs::create_dir(ws.join("real")).unwrap();
        // Lexically inside; on the host it is /etc.
        assert!(path_within(&ws, Path::new("link/shadow")));
        assert!(!resolved_within(&ws, Path::new("link/shadow")).unwrap());
        assert!(!resolved_within(&ws, Path::new("link/not-there/x")).unwrap());
        assert!(resolved_within(&ws, Path::new("real/not-yet")).unwrap());
        // The workspace itself reached through a link is still the workspace.
        std::os::unix::fs::symlink(&ws, dir.path().join("alias")).unwrap();
        assert!(resolved_within(&dir.path().join("alias"), Path::new("real")).unwrap());
    }
}
