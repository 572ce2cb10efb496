//! The store's collector (`cordon-reap --gc`): what no stored record names, removed.
//!
//! This module owns which store entries are named and which may go. A store keeps its records
//! forever — receipts and their signatures, lease records, quarantines, incidents — and the
//! rest is content some record names, or nothing does. The mark reads names from the records
//! and from the roots the caller adds (the policy, whose pins name images and trees), then
//! from the host-written documents those names reach: tree and publication manifests, intake
//! and archive records. A name is any run of exactly 64 lowercase hex digits: a reader that
//! knows no schema misses no field (a field added later that names an object keeps it), and a
//! stray hex string can only keep something, never remove it. Evidence, content objects and
//! image caches are leaves: their bytes may be a candidate's and are never read for names.
//!
//! The sweep removes only entries that have exactly the shape the store writes and that
//! nothing named; anything else in a section is left alone and reported. It runs only while
//! the collector holds the store exclusive ([`Store::hold_exclusive`]): every writer holds it
//! shared from its open to its exit, so no receipt can be about to name what the sweep
//! removes, and no writer can start until it ends.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::path::Path;

use crate::store::{self, RECEIPTS, Store, StoreError};

/// The sections whose every file is a record: roots of the mark, never removed.
const RECORDS: [&str; 4] = [RECEIPTS, "leases", "quarantine", "incidents"];

/// The most bytes read of one document for names: records and manifests are far smaller; a
/// larger one is not something the store writes.
const MAX_DOCUMENT: u64 = 64 << 20;

/// How a content section names its entries.
#[derive(Clone, Copy)]
enum Shape {
    /// `<hex>/` with `manifest.json` (trees, publications), read for names.
    Manifest,
    /// `<hex>.json` (intake, archive records), read for names.
    Record,
    /// `<hex>` (evidence) or `<hex>/` (an image's unpacked root): a leaf.
    Leaf,
    /// `<2 hex>/<hex>` and `<2 hex>/<hex>.x`: content objects, leaves.
    Objects,
}

/// The content sections, each with its shape.
const CONTENT: [(&str, Shape); 7] = [
    ("trees", Shape::Manifest),
    ("publications", Shape::Manifest),
    ("intake", Shape::Record),
    ("archives", Shape::Record),
    (store::EVIDENCE, Shape::Leaf),
    ("images", Shape::Leaf),
    ("objects", Shape::Objects),
];

/// One entry the sweep removes (or, dry, would).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its path under the store root, `section/name`.
    pub path: String,
    /// The bytes of the regular files under it (hard links counted at each name).
    pub bytes: u64,
}

/// What a collection found: what goes, how much stays, what it does not recognise.
#[derive(Debug, Default)]
pub struct Plan {
    /// Unnamed entries, by path.
    pub remove: Vec<Entry>,
    /// Named content entries, kept.
    pub kept: usize,
    /// Paths under a content section whose shape the store never writes: left alone.
    pub unknown: Vec<String>,
}

/// The names (64-hex runs) in `bytes`, added to `into`; those not seen before, in order.
fn names_in(bytes: &[u8], into: &mut BTreeSet<String>) -> Vec<String> {
    let mut fresh = Vec::new();
    for run in bytes.split(|b| !matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        if run.len() == 64 {
            // Only hex digits: ASCII.
            let hex = String::from_utf8_lossy(run).into_owned();
            if into.insert(hex.clone()) {
                fresh.push(hex);
            }
        }
    }
    fresh
}

fn is_hex(name: &str, len: usize) -> bool {
    name.len() == len && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A document's bytes, or `None` when it does not exist; never through a link.
fn document(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    let file = match store::open_nofollow(path) {
        Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None);
        }
        other => other?,
    };
    let io_err = |source| StoreError::Io {
        op: "read",
        path: path.to_path_buf(),
        source,
    };
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() || meta.len() > MAX_DOCUMENT {
        return Err(StoreError::Unsafe {
            path: path.to_path_buf(),
            why: format!("not a regular file of at most {MAX_DOCUMENT} bytes"),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    Ok(Some(bytes))
}

/// The names of directory `path`, sorted; non-UTF-8 names as `None` (never the store's).
fn entries(path: &Path) -> Result<Vec<(Option<String>, fs::Metadata)>, StoreError> {
    let io_err = |source| StoreError::Io {
        op: "list",
        path: path.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in fs::read_dir(path).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let meta = fs::symlink_metadata(entry.path()).map_err(io_err)?;
        out.push((entry.file_name().into_string().ok(), meta));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The bytes of the regular files under `path`, not following links.
fn size_of(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return if meta.is_file() { meta.len() } else { 0 };
    }
    fs::read_dir(path)
        .map(|d| d.filter_map(Result::ok).map(|e| size_of(&e.path())).sum())
        .unwrap_or(0)
}

/// Every name the store's records and `roots` reach. Anything that cannot be read stops the
/// mark: a record cordon cannot read may name anything, so nothing may go.
fn mark(store: &Store, roots: &[&[u8]]) -> Result<BTreeSet<String>, StoreError> {
    let mut named = BTreeSet::new();
    let mut todo = Vec::new();
    for bytes in roots {
        todo.extend(names_in(bytes, &mut named));
    }
    for section in RECORDS {
        let dir = store.root().join(section);
        for (name, meta) in entries(&dir)? {
            let path = dir.join(name.as_deref().unwrap_or("?"));
            if name.is_none() || !meta.is_file() {
                return Err(StoreError::Unsafe {
                    path,
                    why: "a record section holds what the store never writes there".into(),
                });
            }
            let bytes = document(&path)?.unwrap_or_default();
            todo.extend(names_in(&bytes, &mut named));
        }
    }
    // Follow each name into the documents it may be the name of.
    while let Some(hex) = todo.pop() {
        for (section, shape) in CONTENT {
            let path = match shape {
                Shape::Manifest => store.path(section, &hex).join("manifest.json"),
                Shape::Record => store.path(section, &format!("{hex}.json")),
                Shape::Leaf | Shape::Objects => continue,
            };
            if let Some(bytes) = document(&path)? {
                todo.extend(names_in(&bytes, &mut named));
            }
        }
    }
    Ok(named)
}

/// What a collection of `store` would remove, with `roots` (documents outside the store whose
/// names must stay: the policy) read as records are. Changes nothing.
///
/// # Errors
/// A record, a named document or a section could not be read, or holds what the store never
/// writes: nothing may be removed then.
pub fn plan(store: &Store, roots: &[&[u8]]) -> Result<Plan, StoreError> {
    let named = mark(store, roots)?;
    let mut plan = Plan::default();
    let consider = |plan: &mut Plan, rel: String, hex: Option<&str>| match hex {
        Some(hex) if named.contains(hex) => plan.kept += 1,
        Some(_) => plan.remove.push(Entry {
            bytes: size_of(&store.root().join(&rel)),
            path: rel,
        }),
        None => plan.unknown.push(rel),
    };
    for (section, shape) in CONTENT {
        let dir = store.root().join(section);
        for (name, meta) in entries(&dir)? {
            let name_or = name.as_deref().unwrap_or("?");
            let rel = format!("{section}/{name_or}");
            let Some(name) = name else {
                plan.unknown.push(rel);
                continue;
            };
            let hex = match shape {
                Shape::Manifest => meta.is_dir().then_some(name.as_str()),
                Shape::Record => name.strip_suffix(".json").filter(|_| meta.is_file()),
                Shape::Leaf => (meta.is_dir() || meta.is_file()).then_some(name.as_str()),
                Shape::Objects if meta.is_dir() && is_hex(&name, 2) => {
                    for (object, meta) in entries(&dir.join(&name))? {
                        let rel = format!("{rel}/{}", object.as_deref().unwrap_or("?"));
                        let hex = object
                            .as_deref()
                            .map(|o| o.strip_suffix(".x").unwrap_or(o))
                            .filter(|h| meta.is_file() && is_hex(h, 64) && h.starts_with(&name));
                        consider(&mut plan, rel, hex);
                    }
                    continue;
                }
                Shape::Objects => None,
            };
            consider(&mut plan, rel, hex.filter(|h| is_hex(h, 64)));
        }
    }
    Ok(plan)
}

/// Remove what `plan` names, each entry whole, calling `removed` after each. Only for a plan
/// made while `_held` (the store's exclusive hold) was held, and still is.
///
/// # Errors
/// An entry could not be removed: those before it are gone, it and those after it stay.
pub fn sweep(
    store: &Store,
    plan: &Plan,
    _held: &nix::fcntl::Flock<fs::File>,
    mut removed: impl FnMut(&Entry),
) -> Result<(), StoreError> {
    // Scratch of writers that died: no writer is alive while the hold is.
    store.clean_stale()?;
    let mut parents = BTreeSet::new();
    for entry in &plan.remove {
        let path = store.root().join(&entry.path);
        store::remove_tree(&path).map_err(|source| StoreError::Io {
            op: "remove",
            path: path.clone(),
            source,
        })?;
        parents.extend(path.parent().map(Path::to_path_buf));
        removed(entry);
    }
    // The removals are durable before the collector says they happened.
    for parent in parents {
        store::fsync_dir(&parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::canonical::Digest;

    fn hex(seed: &str) -> String {
        Digest::of_bytes(seed.as_bytes()).hex()
    }

    /// A directory entry of `section` named `name`, holding `manifest.json` with `text`.
    fn manifest(store: &Store, section: &str, name: &str, text: &str) {
        let dir = store.path(section, name);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("manifest.json"), text).unwrap();
    }

    #[test]
    fn a_name_is_a_run_of_exactly_64_lowercase_hex_digits() {
        let h = hex("a");
        let text = format!("sha256:{h} x{}y {}0 {} {h}", &h[1..], h, h.to_uppercase());
        let mut seen = BTreeSet::new();
        assert_eq!(names_in(text.as_bytes(), &mut seen), vec![h.clone()]);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(names_in(text.as_bytes(), &mut seen).is_empty(), "seen once");
    }

    /// A store where records name some entries through manifests and records, and evidence
    /// (a leaf) names another that nothing else does.
    fn planted(store: &Store) -> (Vec<String>, Vec<String>) {
        let named_object = store.put_object(b"named through a tree").unwrap();
        let intake_object = store.put_object(b"named through an intake record").unwrap();
        let orphan = store.put_object(b"named by nothing").unwrap();
        let only_in_evidence = store.put_object(b"named only by a log").unwrap();
        let (tree, intake, image, pinned) = (hex("tree"), hex("intake"), hex("img"), hex("pin"));
        manifest(
            store,
            "trees",
            &tree,
            &format!("{{\"sha256\":\"sha256:{named_object}\"}}"),
        );
        manifest(store, "trees", &hex("old tree"), "{}");
        manifest(store, "publications", &hex("old publication"), "{}");
        store
            .put_document(
                "intake",
                &format!("{intake}.json"),
                format!("[\"{intake_object}\"]").as_bytes(),
            )
            .unwrap();
        let log = store
            .put_evidence(format!("a candidate prints {only_in_evidence}").as_bytes())
            .unwrap();
        let stray_log = store.put_evidence(b"a log no receipt names").unwrap();
        for name in [&image, &pinned] {
            fs::create_dir_all(store.path("images", name).join("rootfs")).unwrap();
        }
        let receipt = format!(
            "{{\"outputs\":{{\"tree\":\"sha256:{tree}\",\"intake\":\"sha256:{intake}\"}},\"evidence\":[\"sha256:{log}\"]}}"
        );
        store
            .put_document(
                RECEIPTS,
                &format!("{}.json", hex(&receipt)),
                receipt.as_bytes(),
            )
            .unwrap();
        // What the store never writes, in a content section.
        fs::write(store.path("trees", "notes.txt"), "an operator's").unwrap();
        fs::create_dir(store.path("objects", "zz")).unwrap();
        let gone = vec![
            format!("evidence/{}", stray_log.hex()),
            format!("images/{image}"),
            format!(
                "objects/{}/{}",
                &only_in_evidence.hex()[..2],
                only_in_evidence.hex()
            ),
            format!("objects/{}/{}", &orphan.hex()[..2], orphan.hex()),
            format!("publications/{}", hex("old publication")),
            format!("trees/{}", hex("old tree")),
        ];
        let kept = vec![
            format!(
                "objects/{}/{}",
                &named_object.hex()[..2],
                named_object.hex()
            ),
            format!(
                "objects/{}/{}",
                &intake_object.hex()[..2],
                intake_object.hex()
            ),
            format!("trees/{tree}"),
            format!("intake/{intake}.json"),
            format!("evidence/{}", log.hex()),
            format!("images/{pinned}"),
        ];
        (gone, kept)
    }

    #[test]
    fn only_what_no_record_names_goes_and_a_dry_plan_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let (gone, kept) = planted(&Store::open(&root).unwrap());
        let store = Store::open_existing(&root).unwrap();
        let policy = format!("{{\"images\":{{\"runtime\":\"sha256:{}\"}}}}", hex("pin"));
        let before = store.listing().unwrap();
        let plan = plan(&store, &[policy.as_bytes()]).unwrap();
        assert_eq!(store.listing().unwrap(), before, "a plan changes nothing");
        let mut planned: Vec<String> = plan.remove.iter().map(|e| e.path.clone()).collect();
        planned.sort();
        let mut expected = gone.clone();
        expected.sort();
        assert_eq!(planned, expected);
        assert_eq!(plan.kept, kept.len());
        assert_eq!(plan.unknown, vec!["trees/notes.txt", "objects/zz"]);

        let held = store.hold_exclusive().unwrap();
        let mut said = Vec::new();
        sweep(&store, &plan, &held, |e| said.push(e.path.clone())).unwrap();
        assert_eq!(said.len(), gone.len());
        for path in &gone {
            assert!(!store.root().join(path).exists(), "{path} stayed");
        }
        for path in kept.iter().chain(&plan.unknown) {
            assert!(store.root().join(path).exists(), "{path} went");
        }
        let again = super::plan(&store, &[policy.as_bytes()]).unwrap();
        assert!(again.remove.is_empty(), "{:?}", again.remove);
    }

    #[test]
    fn a_record_section_holding_what_the_store_never_writes_stops_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = Store::open(&root).unwrap();
        store.put_object(b"unnamed").unwrap();
        fs::create_dir(store.path("quarantine", "a-directory")).unwrap();
        let e = plan(&store, &[]).unwrap_err();
        assert!(matches!(e, StoreError::Unsafe { .. }), "{e}");
        // An unreadable (here: linked) record too: it might name anything.
        fs::remove_dir(store.path("quarantine", "a-directory")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", store.path(RECEIPTS, "x.json")).unwrap();
        assert!(plan(&store, &[]).is_err());
    }

    #[test]
    fn the_collector_is_refused_while_a_writer_holds_the_store_and_a_writer_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let writer = Store::open(&root).unwrap();
        let reader = Store::open_existing(&root).unwrap();
        match reader.hold_exclusive() {
            Err(StoreError::Busy { holders, .. }) => {
                assert!(
                    holders.contains(&format!("pid {}", std::process::id())),
                    "{holders}"
                );
            }
            other => panic!("{other:?}"),
        }
        drop(writer);
        let held = reader.hold_exclusive().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let opener = {
            let root = root.clone();
            std::thread::spawn(move || {
                let store = Store::open(&root);
                tx.send(()).unwrap();
                store.map(|_| ())
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            rx.try_recv().is_err(),
            "a writer opened the store the collector holds"
        );
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        opener.join().unwrap().unwrap();
    }
}
