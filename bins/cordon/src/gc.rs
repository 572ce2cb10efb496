//! The store's collector (`cordon-reap --gc`): what no stored record names, removed.
//!
//! This module owns which store entries are named and which may go. A store keeps its records
//! forever — receipts and their signatures, lease records, quarantines, incidents — and its
//! evidence (a run that died before its receipt left its logs and host records there, named
//! by nothing but still the record of that run). The rest is content some record names, or
//! nothing does. The mark reads names from the records and from the roots the caller adds (the
//! policy, whose pins name images and trees), then from the host-written documents those names
//! reach: tree and publication manifests, intake and archive records. A name is any run of
//! exactly 64 lowercase hex digits: a reader that knows no schema misses no field (a field
//! added later that names an object keeps it), and a stray hex string — a candidate's path in
//! a manifest, say — can only keep something, never remove it. Content objects and image
//! caches are leaves, never read for names.
//!
//! The sweep removes only entries that have exactly the shape the store writes and that
//! nothing named; anything else in a section is left alone and reported. It runs only while
//! the collector holds the store exclusive ([`Store::hold_exclusive`]): every other opener
//! holds it shared from its open to its exit, so no receipt can be about to name what the
//! sweep removes, and none can start until it ends. It is refused while any lease record is in
//! the store: a lease that is live, or one a crash left before recovery, may have mounted an
//! image or tree no record names yet. Each entry is first moved whole into the collector's
//! scratch under `tmp/` (a crash leaves only stale scratch, which the next open removes, never
//! a half-removed entry under its content name), the moves made durable, then deleted.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::store::{self, RECEIPTS, Store, StoreError};

/// The section of lease records.
const LEASES: &str = "leases";

/// The sections whose every file is a record: roots of the mark, never removed.
const RECORDS: [&str; 4] = [RECEIPTS, LEASES, "quarantine", "incidents"];

/// How a content section names its entries.
#[derive(Clone, Copy)]
enum Shape {
    /// `<hex>/` with `manifest.json` (trees, publications), read for names.
    Manifest,
    /// `<hex>.json` (intake, archive records), read for names.
    Record,
    /// `<hex>/`: an image's unpacked root, a leaf.
    Leaf,
    /// `<2 hex>/<hex>` and `<2 hex>/<hex>.x`: content objects, leaves.
    Objects,
}

/// The content sections the collector removes from, each with its shape.
const CONTENT: [(&str, Shape); 6] = [
    ("trees", Shape::Manifest),
    ("publications", Shape::Manifest),
    ("intake", Shape::Record),
    ("archives", Shape::Record),
    ("images", Shape::Leaf),
    ("objects", Shape::Objects),
];

/// One entry the sweep removes (or, dry, would).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its path under the store root, `section/name`.
    pub path: String,
    /// The apparent size of the regular files under it (a file linked from elsewhere counted
    /// at each name: what is freed can be less).
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

/// Why a collection did not run.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum GcError {
    /// The store failed, or holds what the store never writes where a record must be.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// Lease records are in the store.
    #[error(
        "{count} lease record(s) in the store: a live or crashed lease may use what no record names yet"
    )]
    #[diagnostic(
        code(cordon::gc::leases),
        help(
            "collect when no stage runs and recovery has released every lease: `cordon-reap` (recovery), then `cordon-reap --gc`"
        )
    )]
    Leases {
        /// How many.
        count: usize,
    },
}

impl crate::exit::ExitClass for GcError {
    /// Nothing collected: a no-decision (3).
    fn exit_class(&self) -> crate::ExitCode {
        crate::ExitCode::NoDecision
    }
}

/// A reader of 64-hex names in a byte stream: any run of exactly 64 lowercase hex digits,
/// across any chunk boundary.
#[derive(Default)]
struct Names {
    run: Vec<u8>,
    /// The current run is longer than a name.
    long: bool,
}

impl Names {
    /// Feed `bytes`; the names ended in them are added to `into`, and those not seen before
    /// pushed on `fresh`.
    fn feed(&mut self, bytes: &[u8], into: &mut BTreeSet<String>, fresh: &mut Vec<String>) {
        for &b in bytes {
            if matches!(b, b'0'..=b'9' | b'a'..=b'f') {
                if self.run.len() < 64 {
                    self.run.push(b);
                } else {
                    self.long = true;
                }
            } else {
                self.end(into, fresh);
            }
        }
    }

    /// The stream (or a run) ended.
    fn end(&mut self, into: &mut BTreeSet<String>, fresh: &mut Vec<String>) {
        if self.run.len() == 64 && !self.long {
            // Only hex digits: ASCII.
            let hex = String::from_utf8_lossy(&self.run).into_owned();
            if into.insert(hex.clone()) {
                fresh.push(hex);
            }
        }
        self.run.clear();
        self.long = false;
    }
}

/// The names in `bytes`, added to `into`; those not seen before, in order.
#[cfg(test)]
fn names_in(bytes: &[u8], into: &mut BTreeSet<String>) -> Vec<String> {
    let mut fresh = Vec::new();
    let mut names = Names::default();
    names.feed(bytes, into, &mut fresh);
    names.end(into, &mut fresh);
    fresh
}

fn is_hex(name: &str, len: usize) -> bool {
    name.len() == len && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The names in the document at `path`, read in chunks (no size bound: a record the store
/// wrote may be as large as what it lists), added to `into`; `false` when it does not exist.
/// Never through a link.
fn scan(
    path: &Path,
    into: &mut BTreeSet<String>,
    fresh: &mut Vec<String>,
) -> Result<bool, StoreError> {
    let mut file = match store::open_nofollow(path) {
        Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(false);
        }
        other => other?,
    };
    let io_err = |source| StoreError::Io {
        op: "read",
        path: path.to_path_buf(),
        source,
    };
    if !file.metadata().map_err(io_err)?.is_file() {
        return Err(StoreError::Unsafe {
            path: path.to_path_buf(),
            why: "not a regular file".to_owned(),
        });
    }
    let mut names = Names::default();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut chunk).map_err(io_err)?;
        if n == 0 {
            break;
        }
        names.feed(&chunk[..n], into, fresh);
    }
    names.end(into, fresh);
    Ok(true)
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
fn mark(store: &Store, roots: &[&[u8]]) -> Result<BTreeSet<String>, GcError> {
    let mut named = BTreeSet::new();
    let mut todo = Vec::new();
    for bytes in roots {
        let mut names = Names::default();
        names.feed(bytes, &mut named, &mut todo);
        names.end(&mut named, &mut todo);
    }
    for section in RECORDS {
        let dir = store.root().join(section);
        let records = entries(&dir)?;
        if section == LEASES && !records.is_empty() {
            return Err(GcError::Leases {
                count: records.len(),
            });
        }
        for (name, meta) in records {
            let path = dir.join(name.as_deref().unwrap_or("?"));
            if name.is_none() || !meta.is_file() {
                return Err(StoreError::Unsafe {
                    path,
                    why: "a record section holds what the store never writes there".into(),
                }
                .into());
            }
            scan(&path, &mut named, &mut todo)?;
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
            scan(&path, &mut named, &mut todo)?;
        }
    }
    Ok(named)
}

/// What a collection of `store` would remove, with `roots` (documents outside the store whose
/// names must stay: the policy) read as records are. Changes nothing.
///
/// # Errors
/// A record, a named document or a section could not be read, or holds what the store never
/// writes, or a lease record is there: nothing may be removed then.
pub fn plan(store: &Store, roots: &[&[u8]]) -> Result<Plan, GcError> {
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
                Shape::Manifest | Shape::Leaf => meta.is_dir().then_some(name.as_str()),
                Shape::Record => name.strip_suffix(".json").filter(|_| meta.is_file()),
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

/// Remove what `plan` names, only for a plan made while `_held` (the store's exclusive hold)
/// was held, and still is: each entry moved whole into a scratch directory, the moves made
/// durable, `removed` called for each, then the scratch deleted.
///
/// # Errors
/// An entry could not be moved (those before it are gone and were reported, it and those
/// after it stay), or the moved entries could not be deleted (they are stale scratch, removed
/// by the store's next open).
pub fn sweep(
    store: &Store,
    plan: &Plan,
    _held: &nix::fcntl::Flock<fs::File>,
    mut removed: impl FnMut(&Entry),
) -> Result<(), StoreError> {
    let mut scratch = store.scratch()?;
    let mut moved: Vec<&Entry> = Vec::new();
    let mut parents: BTreeSet<PathBuf> = BTreeSet::new();
    let mut failed = None;
    for entry in &plan.remove {
        let from = store.root().join(&entry.path);
        let to = scratch.fresh_name("gc");
        // A sealed (0555) directory gets a new `..` when moved: its owner makes it writable
        // first (root needs no such thing, and the chmod is harmless).
        if fs::symlink_metadata(&from).is_ok_and(|m| m.is_dir()) {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(&from, fs::Permissions::from_mode(0o700));
        }
        if let Err(e) = store::rename_noreplace(&from, &to) {
            failed = Some(e);
            break;
        }
        parents.extend(from.parent().map(Path::to_path_buf));
        moved.push(entry);
    }
    // The moves are durable before the collector says they happened.
    for parent in &parents {
        store::fsync_dir(parent)?;
    }
    for entry in moved {
        removed(entry);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    store::remove_tree(scratch.path()).map_err(|source| StoreError::Io {
        op: "remove",
        path: scratch.path().to_path_buf(),
        source,
    })
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

    /// `text` stored as a receipt would be: a record, read for names.
    fn receipt_naming(store: &Store, text: &str) {
        store
            .put_document(RECEIPTS, &format!("{}.json", hex(text)), text.as_bytes())
            .unwrap();
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
    fn planted(store: &Store) -> (Vec<String>, Vec<String>, Vec<String>) {
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
        receipt_naming(store, &receipt);
        // What the store never writes, in a content section.
        fs::write(store.path("trees", "notes.txt"), "an operator's").unwrap();
        fs::create_dir(store.path("objects", "zz")).unwrap();
        let gone = vec![
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
            format!("images/{pinned}"),
        ];
        // Evidence is never collected, named or not: a run that died before its receipt
        // left only that.
        let evidence = vec![
            format!("evidence/{}", log.hex()),
            format!("evidence/{}", stray_log.hex()),
        ];
        (gone, kept, evidence)
    }

    #[test]
    fn only_what_no_record_names_goes_and_a_dry_plan_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let (gone, kept, evidence) = planted(&Store::open(&root).unwrap());
        let store = Store::open_to_collect(&root).unwrap();
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
        for path in kept.iter().chain(&plan.unknown).chain(&evidence) {
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
        assert!(
            matches!(e, GcError::Store(StoreError::Unsafe { .. })),
            "{e}"
        );
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
        let collector = Store::open_to_collect(&root).unwrap();
        match collector.hold_exclusive() {
            Err(StoreError::Busy { holders, .. }) => {
                assert!(
                    holders.contains(&format!("pid {}", std::process::id())),
                    "{holders}"
                );
            }
            other => panic!("{other:?}"),
        }
        drop(writer);
        // A reader holds it too: a command that only reads may still store its receipt.
        let reader = Store::open_existing(&root).unwrap();
        assert!(matches!(
            collector.hold_exclusive(),
            Err(StoreError::Busy { .. })
        ));
        drop(reader);
        let held = collector.hold_exclusive().unwrap();
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

    #[test]
    fn a_lease_record_in_the_store_refuses_the_collection() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = Store::open(&root).unwrap();
        store.put_object(b"unnamed").unwrap();
        fs::write(store.path(LEASES, "l.json"), "{}").unwrap();
        drop(store);
        let store = Store::open_to_collect(&root).unwrap();
        let e = plan(&store, &[]).unwrap_err();
        assert!(matches!(e, GcError::Leases { count: 1 }), "{e}");
    }

    /// A name is read across the reader's chunks, in a document of any size.
    #[test]
    fn a_name_across_a_chunk_boundary_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = Store::open(&root).unwrap();
        let object = store.put_object(b"named past a megabyte").unwrap().hex();
        let mut text = " ".repeat((1 << 20) - 30);
        text.push_str(&object);
        let tree = hex("big tree");
        manifest(&store, "trees", &tree, &text);
        let receipt = format!("{{\"tree\":\"sha256:{tree}\"}}");
        receipt_naming(&store, &receipt);
        drop(store);
        let store = Store::open_to_collect(&root).unwrap();
        let plan = plan(&store, &[]).unwrap();
        assert!(plan.remove.is_empty(), "{:?}", plan.remove);
        assert_eq!(plan.kept, 2);
    }
}
