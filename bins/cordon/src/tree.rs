//! Content-addressed, read-only engine trees in the store: `trees/<hex>/` holds `manifest.json`
//! (the tree record) and `root/`, the tree itself, whose files are hard links to content
//! objects.
//!
//! This module owns, for trees named by the tree digest (domain `cordon.tree` over the
//! materializer version and the sorted `(path, mode, size, sha256)` list; computed in
//! [`cordon_canon::tree_digest`], which the worker shares), publication (built in scratch, published by
//! rename-no-replace, so a tree is either whole or absent) and [`verify`], the one check every
//! stage runs before it mounts a tree: reopen the record, recompute the digest, walk `root/`
//! without following links and re-hash every file.
//!
//! A publication (the `publications` section) is named over its entries **and** its origin, its
//! [`Control`] record: which tree, tier, patcher and image built it, under which lease. The
//! name binds it, so every reopen re-checks it, and a stage checks it against what the receipt
//! naming the publication says ([`Control::check_built`]). A tree's origin stays descriptive.
//!
//! Files are 0444 (0555 when declared executable), directories 0555, times 0, owned by the
//! store's owner (root). A tree has no empty directories and no links. The module does not
//! decide what goes into a tree; materialization does.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{CanonicalError, Digest, to_canonical_json};
use crate::store::{self, Store, StoreError};
use crate::walk::{Kind, Node, WalkError};

/// A tree record, `trees/<hex>/manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeRecord {
    /// [`TREE_SCHEMA`].
    pub schema: u32,
    /// The materializer version the digest binds.
    pub materializer: String,
    /// The tree digest.
    pub digest: Digest,
    /// The files, sorted by path.
    pub entries: Vec<Entry>,
    /// Where the tree came from (incumbent registration or a delta): descriptive for a tree; a
    /// publication's is its [`Control`] record, which its name covers.
    pub origin: Value,
}

/// The digest schema of a publication's name: its entries and its control record.
pub const PUBLICATION_SCHEMA: u32 = 2;

/// A publication's control record: what made it. Its name covers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Control {
    /// Built from `tree` by the registered patcher of `tier` (policy step `step`, its exact
    /// `argv`) in prebuild image `image`, under lease `lease`.
    #[serde(rename = "publication")]
    Built {
        /// The engine tree it was built from.
        tree: Digest,
        /// The reviewed-build tier.
        tier: String,
        /// The registered prebuild step (the tier's patcher).
        step: String,
        /// The step's exact argv.
        argv: Vec<String>,
        /// The prebuild image's pinned digest.
        image: Digest,
        /// The build's lease.
        lease: String,
        /// The compile request's digest (the sealed-direct-artifact tier's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<Digest>,
    },
    /// The empty publication of a session that runs no candidate build (the pristine
    /// reference T).
    ControlOnly {
        /// Whose it is.
        #[serde(rename = "for")]
        purpose: String,
    },
}

impl Control {
    /// As the origin a publication is published with.
    ///
    /// # Errors
    /// It cannot be encoded (never, for these types).
    pub fn to_origin(&self) -> Result<Value, TreeError> {
        serde_json::to_value(self)
            .map_err(|source| TreeError::Encode(CanonicalError::Serialize { source }))
    }

    /// The control record of publication `record`.
    ///
    /// # Errors
    /// [`TreeError::Corrupt`]: its origin is not a control record.
    pub fn of(record: &TreeRecord) -> Result<Self, TreeError> {
        serde_json::from_value(record.origin.clone()).map_err(|e| TreeError::Corrupt {
            digest: record.digest,
            why: format!("its control record: {e}"),
        })
    }

    /// That this is the build `expected` describes (its lease aside): what the receipt naming
    /// the publication, and the authority it runs under, say.
    ///
    /// # Errors
    /// What differs, as a sentence.
    pub fn check_built(&self, expected: &Self) -> Result<(), String> {
        let (
            Self::Built {
                tree: t,
                tier: k,
                step: s,
                argv: a,
                image: i,
                request: r,
                ..
            },
            Self::Built {
                tree,
                tier,
                step,
                argv,
                image,
                request,
                ..
            },
        ) = (self, expected)
        else {
            return Err("it is a control-only publication, built by no patcher".into());
        };
        let mut differs = Vec::new();
        if t != tree {
            differs.push(format!("it was built from tree {t}, not {tree}"));
        }
        if s != step || k != tier {
            differs.push(format!(
                "it was built by step {s:?} (tier {k:?}), not {step:?} (tier {tier:?})"
            ));
        }
        if a != argv {
            differs.push(format!(
                "its patcher's argv {a:?} is not the policy's {argv:?}"
            ));
        }
        if i != image {
            differs.push(format!("it was built in image {i}, not the pinned {image}"));
        }
        if r != request {
            let shown = |r: &Option<Digest>| r.map_or_else(|| "none".to_owned(), |d| d.to_string());
            differs.push(format!(
                "it was built from compile request {}, not the tree's {}",
                shown(r),
                shown(request)
            ));
        }
        if differs.is_empty() {
            Ok(())
        } else {
            Err(differs.join("; "))
        }
    }
}

/// The name of a record's entries (and, for a publication, its control record) in `section`.
fn name_of(section: Section, entries: &[Entry], origin: &Value) -> Result<Digest, CanonicalError> {
    if section.dir != PUBLICATIONS.dir {
        return digest_in(section, entries);
    }
    #[derive(Serialize)]
    struct Payload<'a> {
        materializer: &'a str,
        entries: &'a [Entry],
        control: &'a Value,
    }
    crate::canonical::domain_digest(
        section.domain,
        PUBLICATION_SCHEMA,
        &Payload {
            materializer: MATERIALIZER,
            entries,
            control: origin,
        },
    )
}

/// Why a tree could not be published or verified.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TreeError {
    /// The store failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The record could not be encoded.
    #[error("cannot encode the tree record")]
    #[diagnostic(code(cordon::tree::encode))]
    Encode(#[from] CanonicalError),
    /// No tree with this digest is in the store.
    #[error("no tree {digest} in the store")]
    #[diagnostic(
        code(cordon::tree::missing),
        help(
            "check --store and the digest (a stage prints its tree's digest in its receipt); an incumbent's tree is registered with `cordon-materialize incumbent DIR`"
        )
    )]
    Missing {
        /// The digest asked for.
        digest: Digest,
    },
    /// The tree on disk is not the tree its record and name promise.
    #[error("tree {digest} fails verification: {why}")]
    #[diagnostic(
        code(cordon::tree::corrupt),
        help("the store has been tampered with or the disk is failing; quarantine it")
    )]
    Corrupt {
        /// The tree.
        digest: Digest,
        /// What is wrong.
        why: String,
    },
}

pub use cordon_canon::tree_digest::{
    Entry, MATERIALIZER, PUBLICATIONS, Section, TREE_SCHEMA, TREES, digest, digest_in,
};

/// The directory of tree `digest` in the store.
#[must_use]
pub fn tree_dir(store: &Store, digest: &Digest) -> PathBuf {
    dir_in(store, TREES, digest)
}

fn dir_in(store: &Store, section: Section, digest: &Digest) -> PathBuf {
    store.path(section.dir, &digest.hex())
}

/// The directory a stage mounts: `trees/<hex>/root`.
#[must_use]
pub fn root_dir(store: &Store, digest: &Digest) -> PathBuf {
    root_in(store, TREES, digest)
}

/// The mountable root of a section's entry: `<section>/<hex>/root`.
#[must_use]
pub fn root_in(store: &Store, section: Section, digest: &Digest) -> PathBuf {
    dir_in(store, section, digest).join("root")
}

/// Load a tree record, checking that it parses and that its entries hash to its name. This is
/// cheap (no file is re-hashed); [`verify`] is the full check.
///
/// # Errors
/// Missing or corrupt.
pub fn load(store: &Store, digest: &Digest) -> Result<TreeRecord, TreeError> {
    load_in(store, TREES, digest)
}

/// [`load`] in a section.
///
/// # Errors
/// Missing or corrupt.
pub fn load_in(store: &Store, section: Section, digest: &Digest) -> Result<TreeRecord, TreeError> {
    let dir = dir_in(store, section, digest);
    let path = dir.join("manifest.json");
    if fs::symlink_metadata(&path).is_err() {
        return Err(TreeError::Missing { digest: *digest });
    }
    let corrupt = |why: String| TreeError::Corrupt {
        digest: *digest,
        why,
    };
    // The tree's own directory, not only what is below it, must be the store's: a link planted
    // under the tree's name would be followed by every path through it, and by the mount.
    if !fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Err(corrupt(format!("{} is not a directory", dir.display())));
    }
    let mut text = Vec::new();
    io::Read::read_to_end(&mut store::open_nofollow(&path)?, &mut text)
        .map_err(|e| corrupt(format!("cannot read the record: {e}")))?;
    let record: TreeRecord =
        serde_json::from_slice(&text).map_err(|e| corrupt(format!("record: {e}")))?;
    if record.schema != TREE_SCHEMA {
        return Err(corrupt(format!("record schema {}", record.schema)));
    }
    if record.materializer != MATERIALIZER {
        return Err(corrupt(format!(
            "made by {:?}, this is {MATERIALIZER:?}",
            record.materializer
        )));
    }
    if &name_of(section, &record.entries, &record.origin)? != digest || &record.digest != digest {
        return Err(corrupt(
            "the record's entries do not hash to its name".into(),
        ));
    }
    if record.entries.windows(2).any(|w| w[0].path >= w[1].path) {
        return Err(corrupt(
            "the record's entries are not sorted and unique".into(),
        ));
    }
    Ok(record)
}

/// Publish a tree whose files are already content objects in the store. Builds
/// `tmp/…/tree/{manifest.json,root/}` with hard links, sets modes and times, fsyncs, renames it
/// to `trees/<hex>` without replacing, and re-checks what is there. Publishing a tree that is
/// already present is not an error (its record must match).
///
/// # Errors
/// A content object is missing or wrong, or the store failed.
pub fn publish(store: &Store, entries: Vec<Entry>, origin: Value) -> Result<TreeRecord, TreeError> {
    publish_in(store, TREES, entries, origin)
}

/// [`publish`] in a section.
///
/// # Errors
/// A content object is missing or wrong, or the store failed.
pub fn publish_in(
    store: &Store,
    section: Section,
    entries: Vec<Entry>,
    origin: Value,
) -> Result<TreeRecord, TreeError> {
    let mut entries = entries;
    entries.sort();
    let digest = name_of(section, &entries, &origin)?;
    let record = TreeRecord {
        schema: TREE_SCHEMA,
        materializer: MATERIALIZER.to_owned(),
        digest,
        entries,
        origin,
    };
    let target = dir_in(store, section, &digest);
    if fs::symlink_metadata(&target).is_ok() {
        check_existing(store, section, &record)?;
        return Ok(record);
    }
    let mut scratch = store.scratch()?;
    let staged = scratch.fresh_name("tree");
    let root = staged.join("root");
    let io_err = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { op, path, source }
    };
    fs::create_dir_all(&root).map_err(io_err("create", &root))?;
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for entry in &record.entries {
        let dest = root.join(&entry.path);
        let parent = dest.parent().unwrap_or(&root);
        if parent != root && !dirs.contains(parent) {
            fs::create_dir_all(parent).map_err(io_err("create", parent))?;
            let mut p = Some(parent);
            while let Some(d) = p.filter(|d| *d != root) {
                if !dirs.insert(d.to_path_buf()) {
                    break;
                }
                p = d.parent();
            }
        }
        let object = store.object_path(&entry.sha256, entry.executable());
        // The object's inode carries the mode, the zero times and the size: a link is the file.
        let meta = fs::symlink_metadata(&object).map_err(io_err("stat object", &object))?;
        if !meta.is_file() || meta.mode() & 0o7777 != entry.mode || meta.len() != entry.size {
            return Err(TreeError::Corrupt {
                digest,
                why: format!(
                    "content object for {:?} is not what the record says",
                    entry.path
                ),
            });
        }
        fs::hard_link(&object, &dest).map_err(io_err("link", &dest))?;
    }
    let text = to_canonical_json(&record)?;
    let manifest = staged.join("manifest.json");
    {
        let mut f = store::create_exclusive(&manifest, 0o444)?;
        io::Write::write_all(&mut f, text.as_bytes()).map_err(io_err("write", &manifest))?;
        f.sync_all().map_err(io_err("fsync", &manifest))?;
    }
    // Deepest first, so that a directory is sealed after everything in it.
    let mut all_dirs: Vec<PathBuf> = dirs.into_iter().collect();
    all_dirs.push(root.clone());
    all_dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for dir in &all_dirs {
        store::fsync_dir(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o555))
            .map_err(io_err("chmod", dir))?;
        store::zero_mtime(dir)?;
    }
    store::fsync_dir(&staged)?;
    // Moved while still writable: moving a directory to another parent rewrites its `..`, which
    // needs write permission on it for anyone but root. Sealed right after.
    match store::rename_noreplace(&staged, &target) {
        Ok(()) => {
            fs::set_permissions(&target, fs::Permissions::from_mode(0o555))
                .map_err(io_err("chmod", &target))?;
            store::fsync_dir(&store.root().join(section.dir))?;
        }
        // Another writer published the same tree first: check theirs below.
        Err(e) if store::is_exists(&e) => {}
        Err(e) => return Err(e.into()),
    }
    drop(scratch);
    check_existing(store, section, &record)?;
    Ok(record)
}

/// After publication: the record at the name is ours and every link points at an object of
/// the right size and mode. Files are not re-hashed here (their objects were, when written);
/// [`verify`] re-hashes.
fn check_existing(store: &Store, section: Section, record: &TreeRecord) -> Result<(), TreeError> {
    let found = load_in(store, section, &record.digest)?;
    if found.entries != record.entries {
        return Err(TreeError::Corrupt {
            digest: record.digest,
            why: "a tree with this name holds other entries".into(),
        });
    }
    walk(store, section, record, false)
}

/// Reopen tree `digest` and re-check every entry: the record hashes to the name, `root/` holds
/// exactly the record's files (regular, owned by the store's owner, right mode and size,
/// contents re-hashed) and directories (0555), and nothing else — no link, no extra file.
///
/// # Errors
/// Missing or corrupt.
pub fn verify(store: &Store, digest: &Digest) -> Result<TreeRecord, TreeError> {
    verify_in(store, TREES, digest)
}

/// [`verify`] in a section: what every stage calls before it mounts a tree or a publication.
///
/// # Errors
/// Missing or corrupt.
pub fn verify_in(
    store: &Store,
    section: Section,
    digest: &Digest,
) -> Result<TreeRecord, TreeError> {
    let record = load_in(store, section, digest)?;
    walk(store, section, &record, true)?;
    Ok(record)
}

/// Why a stored tree fails verification, as one sentence: the walk's findings and the record's
/// are alike a corrupt tree.
struct Why(String);

impl From<WalkError> for Why {
    fn from(e: WalkError) -> Self {
        Self(e.to_string())
    }
}

fn walk(
    store: &Store,
    section: Section,
    record: &TreeRecord,
    rehash: bool,
) -> Result<(), TreeError> {
    let root = root_in(store, section, &record.digest);
    let owner = nix::unistd::geteuid().as_raw();
    let mut expected: BTreeMap<&str, &Entry> = record
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e))
        .collect();
    let mut check = |n: &Node<'_>| -> Result<(), Why> {
        let (path, st) = (n.path, &n.stat);
        if st.kind == Kind::Dir {
            if st.mode != 0o555 || st.uid != owner {
                return Err(Why(format!(
                    "directory {path:?} is not a 0555 directory of the store's owner"
                )));
            }
            return Ok(());
        }
        let Some(entry) = expected.remove(path) else {
            return Err(Why(format!("{path:?} is not in the record")));
        };
        if st.kind != Kind::File
            || st.mode != entry.mode
            || st.size != entry.size
            || st.uid != owner
        {
            return Err(Why(format!(
                "{path:?} is not a regular file of mode {:o} and size {}",
                entry.mode, entry.size
            )));
        }
        if rehash {
            let (sha, _) =
                Digest::of_reader(n.open()?).map_err(|e| Why(format!("{path:?}: {e}")))?;
            if sha != entry.sha256 {
                return Err(Why(format!("{path:?} does not hash to {}", entry.sha256)));
            }
        }
        Ok(())
    };
    let corrupt = |why: String| TreeError::Corrupt {
        digest: record.digest,
        why,
    };
    crate::walk::walk(&root, &mut check).map_err(|Why(why)| corrupt(why))?;
    if let Some((path, _)) = expected.into_iter().next() {
        return Err(corrupt(format!("{path:?} is missing")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(store: &Store, path: &str, text: &[u8], executable: bool) -> Entry {
        let mut batch = store.batch().unwrap();
        let (sha256, size) = batch.add_reader(text, executable).unwrap();
        batch.commit().unwrap();
        Entry {
            path: path.into(),
            mode: if executable { 0o555 } else { 0o444 },
            size,
            sha256,
        }
    }

    #[test]
    fn a_tree_is_named_by_its_entries_published_once_and_re_verified() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let entries = vec![
            entry(&store, "a/run.sh", b"#!/bin/sh\n", true),
            entry(&store, "b.txt", b"b", false),
        ];
        let record = publish(&store, entries.clone(), serde_json::json!({"kind": "test"})).unwrap();
        assert_eq!(record.digest, digest(&record.entries).unwrap());
        // The same entries in another section are another digest (domain separation).
        assert_ne!(
            digest_in(PUBLICATIONS, &record.entries).unwrap(),
            record.digest
        );
        verify(&store, &record.digest).unwrap();
        let root = root_dir(&store, &record.digest);
        assert_eq!(std::fs::read(root.join("b.txt")).unwrap(), b"b");
        // A file changed behind the store's back is found by verify.
        let object = store.object_path(&record.entries[1].sha256, false);
        let mut p = std::fs::metadata(&object).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o644);
        std::fs::set_permissions(&object, p).unwrap();
        std::fs::write(&object, b"B").unwrap();
        assert!(matches!(
            verify(&store, &record.digest),
            Err(TreeError::Corrupt { .. })
        ));
        assert!(matches!(
            load(&store, &Digest::of_bytes(b"absent")),
            Err(TreeError::Missing { .. })
        ));
    }

    /// Store targets planted before a write — a link under a tree's name, a link where an
    /// object goes — are refused, never followed or taken for the real thing.
    #[test]
    fn planted_links_under_a_tree_or_object_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let entries = vec![entry(&store, "a.txt", b"a", false)];
        let record = publish(&store, entries.clone(), serde_json::json!({})).unwrap();
        // A faithful copy of the tree elsewhere, and a link to it under the tree's name.
        let target = dir_in(&store, TREES, &record.digest);
        let elsewhere = dir.path().join("elsewhere");
        // Moving a sealed directory to another parent needs write permission on it (not root).
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&target, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &target).unwrap();
        assert!(matches!(
            verify(&store, &record.digest),
            Err(TreeError::Corrupt { .. })
        ));
        assert!(matches!(
            publish(&store, entries, serde_json::json!({})),
            Err(TreeError::Corrupt { .. })
        ));
        // A link where a new object would go: the batch does not take it for the object.
        let sha = Digest::of_bytes(b"planted");
        let object = store.object_path(&sha, false);
        std::fs::create_dir_all(object.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &object).unwrap();
        let mut batch = store.batch().unwrap();
        batch.add_reader(&b"planted"[..], false).unwrap();
        assert!(matches!(
            batch.commit(),
            Err(StoreError::Io { source, .. }) if source.raw_os_error() == Some(nix::libc::ELOOP)
        ));
        assert!(std::fs::symlink_metadata(&object).unwrap().is_symlink());
    }

    /// Eight writers (each with its own handle, as separate stage processes have) publish the
    /// same objects and the same tree at once: every one succeeds, the store holds one object
    /// per content with one link per tree that names it, and the tree verifies.
    #[test]
    fn publishers_of_the_same_objects_and_tree_at_once_all_succeed_with_one_copy() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        Store::open(&root).unwrap();
        let files: [(&str, &[u8], bool); 3] = [
            ("a/run.sh", b"#!/bin/sh\n", true),
            ("b.txt", b"b", false),
            ("c.txt", b"c", false),
        ];
        let barrier = std::sync::Barrier::new(8);
        let digests: Vec<Digest> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let store = Store::open(&root).unwrap();
                        barrier.wait();
                        let entries = files
                            .iter()
                            .map(|(p, t, x)| entry(&store, p, t, *x))
                            .collect();
                        publish(&store, entries, serde_json::json!({"kind": "race"}))
                            .unwrap()
                            .digest
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
        let store = Store::open(&root).unwrap();
        verify(&store, &digests[0]).unwrap();
        assert_eq!(
            std::fs::read_dir(root.join("trees")).unwrap().count(),
            1,
            "one tree"
        );
        for (_, text, x) in files {
            let object = store.object_path(&Digest::of_bytes(text), x);
            assert_eq!(
                std::fs::metadata(&object).unwrap().nlink(),
                2,
                "the object and the one tree's link"
            );
        }
        assert_eq!(
            std::fs::read_dir(root.join("tmp")).unwrap().count(),
            0,
            "no scratch is left"
        );
    }

    /// A publication's name covers its control record: the same entries built otherwise are
    /// another publication, an edited record no longer hashes to its name, and the check names
    /// each difference from the build a stage expects.
    #[test]
    fn a_publications_name_covers_its_control_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let entries = vec![entry(&store, "lib/a", b"a", false)];
        let built = |tree: &[u8], step: &str| Control::Built {
            tree: Digest::of_bytes(tree),
            tier: "native-rebuild".into(),
            step: step.into(),
            argv: vec!["/bin/sh".into()],
            image: Digest::of_bytes(b"image"),
            lease: "l1".into(),
            request: None,
        };
        let publish = |c: &Control| {
            publish_in(
                &store,
                PUBLICATIONS,
                entries.clone(),
                c.to_origin().unwrap(),
            )
            .unwrap()
        };
        let a = publish(&built(b"t1", "build"));
        let b = publish(&built(b"t2", "build"));
        assert_ne!(a.digest, b.digest);
        let reopened = verify_in(&store, PUBLICATIONS, &a.digest).unwrap();
        let control = Control::of(&reopened).unwrap();
        assert_eq!(control, built(b"t1", "build"));
        control.check_built(&built(b"t1", "build")).unwrap();
        let why = control.check_built(&built(b"t2", "other")).unwrap_err();
        assert!(
            why.contains("built from tree") && why.contains("by step \"build\""),
            "{why}"
        );
        let only = Control::ControlOnly {
            purpose: "T".into(),
        };
        assert!(only.check_built(&control).is_err());
        // The record edited in place (its origin now says another tree): corrupt.
        let manifest = dir_in(&store, PUBLICATIONS, &a.digest).join("manifest.json");
        let text = std::fs::read_to_string(&manifest).unwrap();
        let edited = text.replace(
            &Digest::of_bytes(b"t1").to_string(),
            &Digest::of_bytes(b"t2").to_string(),
        );
        assert_ne!(text, edited);
        let mut p = std::fs::metadata(&manifest).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o644);
        std::fs::set_permissions(&manifest, p).unwrap();
        std::fs::write(&manifest, edited).unwrap();
        assert!(matches!(
            verify_in(&store, PUBLICATIONS, &a.digest),
            Err(TreeError::Corrupt { .. })
        ));
    }
}
