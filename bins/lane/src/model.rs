//! The model a lane session mounts: a host-owned directory, checked and identified by digest
//! before it is mounted read-only.
//!
//! What it checks: the directory and every ancestor are owned by root and not group- or
//! world-writable — an ancestor may be a sticky shared directory such as `/tmp`, where nobody
//! but root can rename root's entries — (so nobody but root can change it between this check
//! and the mount), every
//! entry inside is a directory or a regular file with the same ownership rule (no links, no
//! devices, no sockets), and the digest covers each entry's path, kind, mode, size and content.
//! A model is registered by digest in the policy's models root ([`registered`]): it is the
//! directory `<models>/sha256-<hex>` directly inside that root (root-owned, written by root
//! alone, no sticky exception), and `<hex>` is the digest computed here — so any root-owned
//! directory that happens to pass the ownership rule (the signing key's, say) is not a model.
//! The models root, like any model, may not be, hold or lie inside one of the host's own
//! directories (the signing key's, the store, the image cache, the lease state), by real path
//! and by device and inode along every ancestor, so a bind mount aliasing one is caught too
//! ([`apart`]). What it does not own: which model a workload expects.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon::canonical::{Digest, domain_digest};
use cordon::walk::{Kind, Node, Stop, walk};
use serde::Serialize;

/// Why a model cannot be used (the operator's input: a usage error).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ModelError {
    /// It cannot be read.
    #[error("cannot read the model at {path}")]
    #[diagnostic(
        code(cordon::lane::model),
        help(
            "name the model's directory, root-owned and writable by root only (the example's is checks/example/model in the checkout)"
        )
    )]
    Read {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// An entry breaks the ownership or kind rule.
    #[error("the model entry {path} {why}")]
    #[diagnostic(
        code(cordon::lane::model),
        help(
            "a model is a root-owned tree of directories and regular files that only root can write (chown -R root:root; chmod -R go-w)"
        )
    )]
    Unfit {
        /// The entry.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// It is not registered by digest in the policy's models root.
    #[error("the model {path} is not registered: a model of its digest is {at}")]
    #[diagnostic(
        code(cordon::lane::model),
        help(
            "register it by moving it there (a model is named by its digest, directly inside the policy's models root)"
        )
    )]
    Unregistered {
        /// The model, canonical.
        path: PathBuf,
        /// Where a model of its digest is registered.
        at: PathBuf,
    },
    /// It is, holds or lies inside a directory of the host's own (the signing key's, the
    /// store, the image cache, the lease state): mounting it would show that to the candidate.
    #[error("the model {path} overlaps {with}, which is the host's own")]
    #[diagnostic(
        code(cordon::lane::model),
        help(
            "keep models in a directory of their own, apart from the store, keys, images and lease state"
        )
    )]
    Overlaps {
        /// The model, canonical.
        path: PathBuf,
        /// The host's directory it overlaps.
        with: PathBuf,
    },
    /// Something is mounted at or inside it: what the candidate would see there is another
    /// directory's (a subdirectory of the host's own, say, which no ancestry check can see).
    #[error("the model {path} has a mount at {at}")]
    #[diagnostic(
        code(cordon::lane::model),
        help(
            "a model is a plain directory of its root's filesystem: unmount what is mounted there and register the model's own files"
        )
    )]
    Mounted {
        /// The model, canonical.
        path: PathBuf,
        /// The mount point at or inside it.
        at: PathBuf,
    },
    /// Encoding failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Canonical(#[from] cordon::canonical::CanonicalError),
}

/// Refuse a model or models root (canonical) that is, holds or lies inside one of the host's
/// own directories (each canonicalised where it exists; one that does not exist cannot
/// overlap): by path, and by device and inode along each one's ancestors, so a bind mount of
/// one directory at another path is the same directory.
///
/// # Errors
/// [`ModelError::Overlaps`] naming the first.
pub fn apart(model: &Path, host_dirs: &[&Path]) -> Result<(), ModelError> {
    let ids = |p: &Path| -> Vec<(u64, u64)> {
        p.ancestors()
            .filter_map(|a| fs::metadata(a).ok())
            .map(|m| (m.dev(), m.ino()))
            .collect()
    };
    let model_ids = ids(model);
    for dir in host_dirs {
        let Ok(dir) = fs::canonicalize(dir) else {
            continue;
        };
        let dir_ids = ids(&dir);
        let nested_by_path = model.starts_with(&dir) || dir.starts_with(model);
        // The first id of each list is the directory itself; the rest its ancestors.
        let nested_by_inode = dir_ids.first().is_some_and(|d| model_ids.contains(d))
            || model_ids.first().is_some_and(|m| dir_ids.contains(m));
        if nested_by_path || nested_by_inode {
            return Err(ModelError::Overlaps {
                path: model.to_path_buf(),
                with: dir,
            });
        }
    }
    Ok(())
}

/// Refuse a model (canonical) with a mount at or inside it in `mountinfo` (the supervisor's
/// table, `/proc/self/mountinfo`): the lane binds the model recursively, so a mount there would
/// be carried into the container with whatever it shows.
///
/// # Errors
/// [`ModelError::Mounted`] naming the first.
pub fn unmounted(model: &Path, mountinfo: &str) -> Result<(), ModelError> {
    match cordon::mountinfo::entries(mountinfo)
        .into_iter()
        .find(|e| e.point.starts_with(model))
    {
        Some(e) => Err(ModelError::Mounted {
            path: model.to_path_buf(),
            at: e.point,
        }),
        None => Ok(()),
    }
}

/// Require `model` (canonical, of `digest`) to be registered in the models `root`: the
/// directory `sha256-<hex>` directly inside it, and the root root-owned and written by root
/// alone (no sticky exception: nobody but root may add a directory there).
///
/// # Errors
/// [`ModelError::Read`] or [`ModelError::Unfit`] for the root, [`ModelError::Unregistered`]
/// for a model anywhere else or under another name.
pub fn registered(root: &Path, model: &Path, digest: &Digest) -> Result<(), ModelError> {
    let real = fs::canonicalize(root).map_err(|source| ModelError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    let m = fs::symlink_metadata(&real).map_err(|source| ModelError::Read {
        path: real.clone(),
        source,
    })?;
    owned_or_sticky(&real, &m, false)?;
    let name = format!("sha256-{}", digest.hex());
    if model.parent() != Some(real.as_path())
        || model.file_name().and_then(|n| n.to_str()) != Some(name.as_str())
    {
        return Err(ModelError::Unregistered {
            path: model.to_path_buf(),
            at: real.join(name),
        });
    }
    Ok(())
}

#[derive(Serialize)]
struct Item {
    path: String,
    dir: bool,
    mode: u32,
    size: u64,
    sha256: Option<Digest>,
}

fn owned_or_sticky(path: &Path, m: &fs::Metadata, sticky_ok: bool) -> Result<(), ModelError> {
    let unfit = |why| ModelError::Unfit {
        path: path.to_path_buf(),
        why,
    };
    if m.uid() != 0 {
        return Err(unfit("is not owned by root"));
    }
    let sticky = sticky_ok && m.is_dir() && m.permissions().mode() & 0o1000 != 0;
    if m.permissions().mode() & 0o022 != 0 && !sticky {
        return Err(unfit("is writable by its group or by others"));
    }
    Ok(())
}

/// The deepest directory and the most entries a model may have.
const MAX_DEPTH: u64 = 32;
const MAX_ENTRIES: usize = 1_000_000;

/// Every entry under `root`, on the one tree walk, in the order the digest covers them: a
/// directory before its contents, names in byte order.
fn items(root: &Path) -> Result<Vec<Item>, ModelError> {
    let mut out = Vec::new();
    let mut visit = |n: &Node<'_>| -> Result<(), Stop<ModelError>> {
        if n.path.is_empty() {
            return Ok(());
        }
        let path = root.join(n.path);
        let unfit = |why| {
            Stop::Visit(ModelError::Unfit {
                path: path.clone(),
                why,
            })
        };
        let st = &n.stat;
        if st.uid != 0 {
            return Err(unfit("is not owned by root"));
        }
        if st.mode & 0o022 != 0 {
            return Err(unfit("is writable by its group or by others"));
        }
        if out.len() >= MAX_ENTRIES {
            return Err(unfit("takes the model past 1,000,000 entries"));
        }
        let item = match st.kind {
            Kind::Dir if n.depth + 1 > MAX_DEPTH => {
                return Err(unfit("is deeper than 32 directories"));
            }
            Kind::Dir => Item {
                path: n.path.to_owned(),
                dir: true,
                mode: st.mode,
                size: 0,
                sha256: None,
            },
            Kind::File => Item {
                path: n.path.to_owned(),
                dir: false,
                mode: st.mode,
                size: st.size,
                sha256: Some(
                    Digest::of_reader(n.open()?)
                        .map_err(|source| {
                            Stop::Visit(ModelError::Read {
                                path: path.clone(),
                                source,
                            })
                        })?
                        .0,
                ),
            },
            Kind::Symlink | Kind::Fifo | Kind::Socket | Kind::Device => {
                return Err(unfit("is neither a directory nor a regular file"));
            }
        };
        out.push(item);
        Ok(())
    };
    walk(root, &mut visit).map_err(|stop| match stop {
        Stop::Walk(e) => ModelError::Read {
            path: root.to_path_buf(),
            source: std::io::Error::other(e),
        },
        Stop::Visit(e) => e,
    })?;
    // Pre-order by components: what the digest has always covered.
    out.sort_by(|a, b| a.path.split('/').cmp(b.path.split('/')));
    Ok(out)
}

/// Check the model at `dir` and return its canonical path and digest.
///
/// # Errors
/// It cannot be read, or an entry or an ancestor breaks the rule.
pub fn verify(dir: &Path) -> Result<(PathBuf, Digest), ModelError> {
    let real = fs::canonicalize(dir).map_err(|source| ModelError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for (i, p) in real.ancestors().enumerate() {
        let m = fs::symlink_metadata(p).map_err(|source| ModelError::Read {
            path: p.to_path_buf(),
            source,
        })?;
        owned_or_sticky(p, &m, i > 0)?;
    }
    if !fs::symlink_metadata(&real).is_ok_and(|m| m.is_dir()) {
        return Err(ModelError::Unfit {
            path: real,
            why: "is not a directory",
        });
    }
    let items = items(&real)?;
    let digest = domain_digest("cordon.model", 1, &items)?;
    Ok((real, digest))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_model_that_is_holds_or_lies_in_a_host_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (keys, models) = (dir.path().join("keys"), dir.path().join("models"));
        for d in [&keys, &models.join("m")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let m = std::fs::canonicalize(models.join("m")).unwrap();
        super::apart(&m, &[&keys, &dir.path().join("absent")]).unwrap();
        for host in [&models, &models.join("m"), &dir.path().to_path_buf()] {
            assert!(super::apart(&m, &[host]).is_err(), "{}", host.display());
        }
        let inside = std::fs::canonicalize(&keys).unwrap();
        let e = super::apart(&dir.path().canonicalize().unwrap(), &[&inside])
            .unwrap_err()
            .to_string();
        assert!(e.contains("which is the host's own"), "{e}");
    }

    #[test]
    fn a_model_with_a_mount_at_or_inside_it_is_refused() {
        let table = "22 1 0:21 / / rw - ext4 /dev/vda rw\n\
                     23 22 0:22 / /models rw - ext4 /dev/vdb rw\n\
                     24 22 0:23 /keys/sub /models/sha256-a/w\\040x ro - ext4 /dev/vda rw\n\
                     25 22 0:24 / /models/sha256-b rw - ext4 /dev/vda rw\n";
        let m = |name: &str| std::path::PathBuf::from(format!("/models/{name}"));
        // A mount above it (its root's own disk) or beside it is no mount of its own.
        super::unmounted(&m("sha256-c"), table).unwrap();
        super::unmounted(&m("sha256-a2"), table).unwrap();
        for (name, at) in [
            ("sha256-a", "/models/sha256-a/w x"),
            ("sha256-b", "/models/sha256-b"),
        ] {
            let e = super::unmounted(&m(name), table).unwrap_err();
            assert!(
                matches!(&e, super::ModelError::Mounted { at: a, .. } if a == std::path::Path::new(at)),
                "{e}"
            );
        }
    }
}

/// The ownership rule needs root-owned files: the root tier.
#[cfg(test)]
mod root_tests {
    use super::*;

    /// Only `<models>/sha256-<its digest>` is a registered model: another name, another
    /// directory (the signing key's, say) or a models root others can write is refused; and a
    /// bind mount of a host directory inside the models root is that directory.
    #[test]
    fn a_model_is_registered_only_under_its_digest_in_the_models_root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the ownership rule and the bind mount need root: run as root"
        );
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("models");
        fs::create_dir(&root).unwrap();
        let src = root.join("incoming");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("weights"), b"1000003\n").unwrap();
        let (real, digest) = verify(&src).unwrap();
        let refused = registered(&root, &real, &digest).unwrap_err();
        let ModelError::Unregistered { at, .. } = &refused else {
            panic!("{refused:?}")
        };
        assert_eq!(
            at,
            &root
                .canonicalize()
                .unwrap()
                .join(format!("sha256-{}", digest.hex()))
        );
        fs::rename(&src, at).unwrap();
        let (real, again) = verify(at).unwrap();
        assert_eq!(again, digest, "the name is not part of the digest");
        registered(&root, &real, &digest).unwrap();
        // The right name elsewhere (a directory beside the root) is not registered.
        let keys = dir.path().join("keys");
        let beside = keys.join(format!("sha256-{}", digest.hex()));
        fs::create_dir_all(&beside).unwrap();
        fs::write(beside.join("weights"), b"1000003\n").unwrap();
        let (real_beside, d) = verify(&beside).unwrap();
        assert!(matches!(
            registered(&root, &real_beside, &d),
            Err(ModelError::Unregistered { .. })
        ));
        // A models root others may write (sticky or not) registers nothing.
        for mode in [0o777, 0o1777, 0o775] {
            fs::set_permissions(&root, fs::Permissions::from_mode(mode)).unwrap();
            assert!(
                matches!(
                    registered(&root, &real, &digest),
                    Err(ModelError::Unfit { .. })
                ),
                "{mode:o}"
            );
        }
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        // A bind mount of the key directory inside the models root: apart by path, the same
        // directory by device and inode.
        let alias = root.join("alias");
        fs::create_dir(&alias).unwrap();
        nix::mount::mount(
            Some(&keys),
            &alias,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let aliased = apart(&alias.canonicalize().unwrap(), &[&keys]);
        let without_the_alias = apart(&real, &[&keys]);
        nix::mount::umount(&alias).unwrap();
        assert!(
            matches!(aliased, Err(ModelError::Overlaps { .. })),
            "{aliased:?}"
        );
        without_the_alias.unwrap();
        // A subdirectory of the key directory bound inside the model: no ancestry of either
        // path shows it, the mount table does.
        let sub = keys.join("sub");
        fs::create_dir(&sub).unwrap();
        let inside = real.join("w");
        fs::create_dir(&inside).unwrap();
        let table = || fs::read_to_string("/proc/self/mountinfo").unwrap();
        unmounted(&real, &table()).unwrap();
        nix::mount::mount(
            Some(&sub),
            &inside,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let by_ancestry = apart(&real, &[&keys]);
        let by_table = unmounted(&real, &table());
        nix::mount::umount(&inside).unwrap();
        by_ancestry.unwrap();
        assert!(
            matches!(&by_table, Err(ModelError::Mounted { at, .. }) if *at == inside),
            "{by_table:?}"
        );
    }

    #[test]
    fn a_model_is_identified_by_its_entries_and_refused_when_others_could_write_it() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the ownership rule needs root-owned files: run as root"
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(
            matches!(verify(Path::new("/tmp")), Err(ModelError::Unfit { .. })),
            "a directory others can write is no model, sticky or not"
        );
        let shared = dir.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        fs::create_dir(shared.join("m")).unwrap();
        assert!(
            matches!(verify(&shared.join("m")), Err(ModelError::Unfit { .. })),
            "below a directory others can write (not sticky), the model could be replaced"
        );
        let m = dir.path().join("m");
        fs::create_dir(&m).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(m.join("weights"), b"1000003\n").unwrap();
        let (_, a) = verify(&m).unwrap();
        fs::write(m.join("weights"), b"1000033\n").unwrap();
        let (_, b) = verify(&m).unwrap();
        assert_ne!(a, b, "the digest covers content");
        fs::set_permissions(m.join("weights"), fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(verify(&m), Err(ModelError::Unfit { .. })));
        fs::set_permissions(m.join("weights"), fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", m.join("link")).unwrap();
        assert!(matches!(verify(&m), Err(ModelError::Unfit { .. })));
    }
}
