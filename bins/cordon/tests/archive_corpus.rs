//! The generated corpus of hostile archives: each is refused by intake with its specific reason
//! code and leaves the store exactly as it was; the benign controls are admitted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;

use cordon::archive::ArchiveLimits;
use cordon::canonical::Digest;
use cordon::intake::{self, IntakeError};
use cordon::store::Store;

fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_archive_bytes: 16 << 20,
        max_extracted_bytes: 4 << 20,
        max_members: 50,
        max_file_bytes: 1 << 20,
        max_path_length: 1024,
        max_depth: 32,
        max_pax_bytes: 4096,
        max_compression_ratio: 10,
        exclude: vec![".git".into(), "__pycache__".into(), "*.pyc".into()],
    }
}

/// One 512-byte ustar header with raw name bytes (the tar crate's setters refuse the names
/// this corpus needs, which is the point).
fn header(name: &[u8], kind: u8, size: u64, mode: u32) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_mtime(0);
    {
        let raw = h.as_old_mut();
        raw.name = [0; 100];
        raw.name[..name.len()].copy_from_slice(name);
    }
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A member: header plus data padded to the block size.
fn member(name: &[u8], kind: u8, data: &[u8], mode: u32) -> Vec<u8> {
    let mut out = header(name, kind, data.len() as u64, mode);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    member(name.as_bytes(), b'0', data, 0o644)
}

fn dir(name: &str) -> Vec<u8> {
    member(name.as_bytes(), b'5', b"", 0o755)
}

/// A PAX record list as an extended-header member of type `kind` (`x` or `g`).
fn pax(kind: u8, records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut data = Vec::new();
    for (k, v) in records {
        let body_len = k.len() + v.len() + 3;
        let mut len = body_len + body_len.to_string().len();
        if len.to_string().len() + body_len != len {
            len += 1;
        }
        data.extend_from_slice(format!("{len} {k}=").as_bytes());
        data.extend_from_slice(v);
        data.push(b'\n');
    }
    member(b"././@PaxHeader", kind, &data, 0o644)
}

fn end(mut blocks: Vec<u8>) -> Vec<u8> {
    blocks.extend_from_slice(&[0u8; 1024]);
    blocks
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    end(parts.concat())
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    (dir, store)
}

/// Ingest `bytes` committed to their own sha256 and expect the rejection `code`, with the store
/// listing unchanged.
fn expect_rejected(name: &str, bytes: &[u8], code: &str) {
    let (_dir, store) = store();
    let before = store.listing().unwrap();
    let committed = Digest::of_bytes(bytes);
    match intake::ingest(&store, bytes, &committed, &limits()) {
        Err(IntakeError::Rejected(r)) => {
            assert_eq!(r.code, code, "{name}: rejected for the wrong reason: {r}");
        }
        other => panic!("{name}: expected rejection {code}, got {other:?}"),
    }
    assert_eq!(
        store.listing().unwrap(),
        before,
        "{name}: the store changed"
    );
    // The confined child's walk, which hashes nothing, refuses it for the same reason.
    match cordon::archive::check(bytes, &limits(), &mut Discard) {
        Err(cordon::archive::ArchiveError::Rejected(r)) => {
            assert_eq!(r.code, code, "{name}: the unhashed walk disagrees: {r}");
        }
        other => panic!("{name}: the unhashed walk did not reject: {other:?}"),
    }
}

/// A sink that keeps nothing.
struct Discard;

impl cordon::archive::Sink for Discard {
    fn file(&mut self, _: &str, _: bool, _: u64) -> std::io::Result<Box<dyn std::io::Write + '_>> {
        Ok(Box::new(std::io::sink()))
    }

    fn dir(&mut self, _: &str) -> std::io::Result<()> {
        Ok(())
    }
}

fn corpus() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let long = "d/".repeat(600) + "f";
    let deep = "d/".repeat(40) + "f";
    let name_max = format!("d/{}", "n".repeat(256));
    let zeros = vec![0u8; 4 << 20];
    let mut bomb_members = Vec::new();
    for i in 0..4 {
        bomb_members.push(file(&format!("z{i}"), &zeros[..1 << 20]));
    }
    let bomb = gzip(&cat(&bomb_members));
    let good = cat(&[file("a", b"hello")]);
    let mut truncated = cat(&[file("a", &[7u8; 4000])]);
    truncated.truncate(512 + 1000);
    let mut no_end = file("a", b"hello");
    no_end.extend_from_slice(&[0u8; 512]);
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"surprise");
    let mut after_gzip = gzip(&good);
    after_gzip.extend_from_slice(b"more");
    let mut bad_sum = file("a", b"hello");
    bad_sum[0] = b'b';
    let many: Vec<Vec<u8>> = (0..51).map(|i| file(&format!("f{i}"), b"x")).collect();
    let big = vec![1u8; (1 << 20) + 1];
    let five: Vec<Vec<u8>> = (0..5)
        .map(|i| file(&format!("m{i}"), &vec![2u8; 1 << 20]))
        .collect();
    let composed = "caf\u{e9}";
    let decomposed = "cafe\u{301}";
    vec![
        (
            "symlink",
            cat(&[member(b"l", b'2', b"", 0o777)]),
            "intake.symlink",
        ),
        (
            "hard link",
            cat(&[member(b"h", b'1', b"", 0o644)]),
            "intake.hardlink",
        ),
        (
            "hard link to an earlier member",
            cat(&[file("a", b"x"), member(b"b", b'1', b"", 0o644)]),
            "intake.hardlink",
        ),
        (
            "character device",
            cat(&[member(b"c", b'3', b"", 0o644)]),
            "intake.device",
        ),
        (
            "block device",
            cat(&[member(b"b", b'4', b"", 0o644)]),
            "intake.device",
        ),
        (
            "fifo",
            cat(&[member(b"p", b'6', b"", 0o644)]),
            "intake.fifo",
        ),
        (
            "GNU sparse",
            cat(&[member(b"s", b'S', b"", 0o644)]),
            "intake.sparse",
        ),
        (
            "PAX sparse map",
            cat(&[pax(b'x', &[("GNU.sparse.map", b"0,1")]), file("s", b"x")]),
            "intake.sparse",
        ),
        (
            "contiguous file",
            cat(&[member(b"c", b'7', b"x", 0o644)]),
            "intake.entry-type",
        ),
        (
            "absolute path",
            cat(&[file("/etc/passwd", b"x")]),
            "intake.absolute-path",
        ),
        ("dot-dot", cat(&[file("a/../../x", b"x")]), "intake.dotdot"),
        (
            "empty component",
            cat(&[file("a//b", b"x")]),
            "intake.empty-component",
        ),
        (
            "dot component",
            cat(&[file("./a", b"x")]),
            "intake.dot-component",
        ),
        (
            "NUL through a PAX path",
            cat(&[pax(b'x', &[("path", b"a\0b")]), file("a", b"x")]),
            "intake.nul",
        ),
        (
            "non-UTF-8 name",
            cat(&[member(b"bad\xff", b'0', b"x", 0o644)]),
            "intake.non-utf8",
        ),
        (
            "over-long path",
            cat(&[pax(b'x', &[("path", long.as_bytes())]), file("a", b"x")]),
            "intake.path-too-long",
        ),
        (
            "a name over NAME_MAX in a path under the limit",
            cat(&[pax(b'x', &[("path", name_max.as_bytes())]), file("a", b"x")]),
            "intake.name-too-long",
        ),
        (
            "over-deep path",
            cat(&[pax(b'x', &[("path", deep.as_bytes())]), file("a", b"x")]),
            "intake.too-deep",
        ),
        (
            "duplicate file",
            cat(&[file("a", b"x"), file("a", b"y")]),
            "intake.duplicate",
        ),
        (
            "duplicate after NFC normalisation",
            cat(&[
                pax(b'x', &[("path", composed.as_bytes())]),
                file("n1", b"x"),
                pax(b'x', &[("path", decomposed.as_bytes())]),
                file("n2", b"y"),
            ]),
            "intake.duplicate",
        ),
        (
            "file then directory",
            cat(&[file("a", b"x"), dir("a/")]),
            "intake.duplicate",
        ),
        (
            "file then a child of it",
            cat(&[file("a", b"x"), file("a/b", b"y")]),
            "intake.duplicate",
        ),
        (
            "directory then file",
            cat(&[dir("a/"), file("a", b"y")]),
            "intake.duplicate",
        ),
        (
            "setuid",
            cat(&[member(b"s", b'0', b"x", 0o4755)]),
            "intake.special-mode",
        ),
        (
            "setgid",
            cat(&[member(b"s", b'0', b"x", 0o2755)]),
            "intake.special-mode",
        ),
        (
            "sticky directory",
            cat(&[member(b"t/", b'5', b"", 0o1777)]),
            "intake.special-mode",
        ),
        (
            "PAX header over its limit",
            cat(&[pax(b'x', &[("comment", &[b'c'; 5000])]), file("a", b"x")]),
            "intake.pax-too-big",
        ),
        (
            "PAX path override escaping",
            cat(&[pax(b'x', &[("path", b"../evil")]), file("innocent", b"x")]),
            "intake.dotdot",
        ),
        (
            "two PAX headers for one member",
            cat(&[
                pax(b'x', &[("mtime", b"0")]),
                pax(b'x', &[("mtime", b"0")]),
                file("a", b"x"),
            ]),
            "intake.pax-path",
        ),
        (
            "PAX header and then the end",
            cat(&[pax(b'x', &[("path", b"a")])]),
            "intake.pax-path",
        ),
        (
            "PAX link path",
            cat(&[pax(b'x', &[("linkpath", b"/etc/shadow")]), file("a", b"x")]),
            "intake.pax-key",
        ),
        (
            "PAX file capability xattr",
            cat(&[
                pax(b'x', &[("SCHILY.xattr.security.capability", b"\x01")]),
                file("a", b"x"),
            ]),
            "intake.pax-key",
        ),
        (
            "global PAX path",
            cat(&[pax(b'g', &[("path", b"x")]), file("a", b"x")]),
            "intake.pax-key",
        ),
        (
            "GNU long name escaping",
            cat(&[
                member(b"././@LongLink", b'L', b"../../evil\0", 0o644),
                file("short", b"x"),
            ]),
            "intake.dotdot",
        ),
        (
            "GNU long name over the limit",
            cat(&[
                member(b"././@LongLink", b'L', long.as_bytes(), 0o644),
                file("short", b"x"),
            ]),
            "intake.path-too-long",
        ),
        (
            "GNU long name and PAX path together",
            cat(&[
                member(b"././@LongLink", b'L', b"one\0", 0o644),
                pax(b'x', &[("path", b"two")]),
                file("short", b"x"),
            ]),
            "intake.pax-path",
        ),
        (
            "GNU long link",
            cat(&[
                member(b"././@LongLink", b'K', b"t\0", 0o644),
                file("a", b"x"),
            ]),
            "intake.hardlink",
        ),
        ("too many members", cat(&many), "intake.too-many-members"),
        (
            "file over the size limit",
            cat(&[file("big", &big)]),
            "intake.file-too-big",
        ),
        (
            "files over the extracted limit",
            cat(&five),
            "intake.extracted-too-big",
        ),
        ("gzip bomb", bomb, "intake.compression-ratio"),
        ("truncated inside a member", truncated, "intake.truncated"),
        ("no end-of-archive marker", no_end, "intake.truncated"),
        (
            "data after the end marker",
            trailing,
            "intake.trailing-data",
        ),
        (
            "bytes after the gzip stream",
            after_gzip,
            "intake.trailing-data",
        ),
        ("corrupt header checksum", end(bad_sum), "intake.corrupt"),
        (
            "excluded .git",
            cat(&[file(".git/config", b"x")]),
            "intake.excluded",
        ),
        (
            "excluded bytecode",
            cat(&[file("pkg/m.pyc", b"x")]),
            "intake.excluded",
        ),
        (
            "excluded __pycache__",
            cat(&[file("__pycache__/m.py", b"x")]),
            "intake.excluded",
        ),
        ("xz", b"\xfd7zXZ\0rest".to_vec(), "intake.format"),
    ]
}

#[test]
fn every_hostile_archive_is_refused_with_its_own_code_and_the_store_is_unchanged() {
    let corpus = corpus();
    assert!(corpus.len() >= 30, "the corpus must cover every rule");
    for (name, bytes, code) in &corpus {
        expect_rejected(name, bytes, code);
    }
}

#[test]
fn a_committed_digest_that_does_not_match_is_refused_and_nothing_is_stored() {
    let (_dir, store) = store();
    let before = store.listing().unwrap();
    let bytes = cat(&[file("a", b"x")]);
    let wrong = Digest::of_bytes(b"something else");
    let err = intake::ingest(&store, bytes.as_slice(), &wrong, &limits()).unwrap_err();
    assert!(matches!(err, IntakeError::Rejected(ref r) if r.code == "intake.hash-mismatch"));
    assert_eq!(store.listing().unwrap(), before);
}

#[test]
fn an_archive_over_the_byte_cap_is_refused_while_streaming() {
    let (_dir, store) = store();
    let mut l = limits();
    l.max_archive_bytes = 2048;
    let bytes = cat(&[file("a", &[1u8; 4096])]);
    let err = intake::ingest(&store, bytes.as_slice(), &Digest::of_bytes(&bytes), &l).unwrap_err();
    assert!(matches!(err, IntakeError::Rejected(ref r) if r.code == "intake.archive-too-big"));
}

/// Admit `bytes` into `store` and check what it wrote.
fn admit_into(store: &Store, bytes: &[u8]) -> cordon::intake::Admitted {
    let admitted = intake::ingest(store, bytes, &Digest::of_bytes(bytes), &limits()).unwrap();
    let record = &admitted.record;
    for f in &record.files {
        store
            .verify_object(
                &store.object_path(&f.sha256, f.executable),
                &f.sha256,
                if f.executable { 0o555 } else { 0o444 },
            )
            .unwrap();
    }
    assert_eq!(
        &intake::load(store, &record.content_digest).unwrap(),
        record
    );
    assert_eq!(admitted.archive.archive_sha256, Digest::of_bytes(bytes));
    assert_eq!(admitted.archive.content_digest, record.content_digest);
    admitted
}

/// Admit `bytes` into a store of its own.
fn admit(bytes: &[u8]) -> cordon::intake::Admitted {
    let (_dir, store) = store();
    admit_into(&store, bytes)
}

#[test]
fn benign_archives_are_admitted_whatever_their_compression() {
    let plain = cat(&[
        dir("pkg/"),
        file("pkg/a.py", b"print(1)\n"),
        member(b"pkg/run.sh", b'0', b"#!/bin/sh\n", 0o755),
    ]);
    let a = admit(&plain);
    let b = admit(&gzip(&plain));
    let c = admit(&zstd(&plain));
    // The content digest is what the files are, not how they were packed.
    assert_eq!(a.record, b.record);
    assert_eq!(a.record, c.record);
    assert_ne!(a.archive.archive_sha256, b.archive.archive_sha256);
    let paths: Vec<_> = a
        .record
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.executable))
        .collect();
    assert_eq!(paths, [("pkg/a.py", false), ("pkg/run.sh", true)]);
    assert_eq!(a.record.bytes, 19);
}

/// A rival who repacks a competitor's archive (another order, another compression) and submits
/// it first must not block the competitor: every archive of admitted content is admitted, in
/// either order, and the content record is written once, byte for byte the same.
#[test]
fn every_archive_of_admitted_content_is_admitted_in_one_store() {
    let theirs = cat(&[
        file("pkg/a.py", b"print(1)\n"),
        file("pkg/b.py", b"x = 2\n"),
    ]);
    let repacked = gzip(&cat(&[
        file("pkg/b.py", b"x = 2\n"),
        dir("pkg/"),
        file("pkg/a.py", b"print(1)\n"),
    ]));
    let (_dir, store) = store();
    let first = admit_into(&store, &repacked);
    let content = store
        .read_document(
            "intake",
            &format!("{}.json", first.record.content_digest.hex()),
        )
        .unwrap();
    let second = admit_into(&store, &theirs);
    let again = admit_into(&store, &repacked);
    assert_eq!(first.record, second.record);
    assert_eq!(first, again);
    assert_ne!(first.archive, second.archive);
    assert_eq!(
        store
            .read_document(
                "intake",
                &format!("{}.json", first.record.content_digest.hex())
            )
            .unwrap(),
        content
    );
    for a in [&first, &second] {
        let name = format!("{}.json", a.archive.archive_sha256.hex());
        assert!(!store.read_document("archives", &name).unwrap().is_empty());
    }
}

#[test]
fn legitimate_pax_and_gnu_long_names_and_a_git_archive_comment_are_admitted() {
    let long = format!("{}/{}/file.py", "a".repeat(120), "b".repeat(60));
    let bytes = cat(&[
        pax(b'g', &[("comment", b"0123456789abcdef")]),
        pax(
            b'x',
            &[("path", long.as_bytes()), ("mtime", b"1700000000.5")],
        ),
        file("ignored-short-name", b"a"),
        member(
            b"././@LongLink",
            b'L',
            format!("{long}2\0").as_bytes(),
            0o644,
        ),
        file("short", b"b"),
    ]);
    let r = admit(&bytes);
    let paths: Vec<_> = r.record.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(paths, [long.clone(), format!("{long}2")]);
}

#[test]
fn an_archive_made_by_gnu_tar_is_admitted_with_its_executable_bits() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("engine")).unwrap();
    std::fs::write(src.join("engine/m.py"), "x = 1\n").unwrap();
    std::fs::write(src.join("build.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        src.join("build.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = dir.path().join("a.tgz");
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&src)
        .arg("-czf")
        .arg(&out)
        .args(["engine", "build.sh"])
        .status()
        .expect("GNU tar is needed to make this archive (apt-get install tar)");
    assert!(status.success());
    let r = admit(&std::fs::read(&out).unwrap());
    let paths: Vec<_> = r
        .record
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.executable))
        .collect();
    assert_eq!(paths, [("build.sh", true), ("engine/m.py", false)]);
}

#[test]
fn a_scratch_directory_left_by_a_dead_writer_is_removed_and_a_live_one_kept() {
    let (_dir, store) = store();
    let live = store.scratch().unwrap();
    let dead = store.root().join("tmp").join("12345-dead");
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join("f1"), b"half written").unwrap();
    let reopened = Store::open(store.root()).unwrap();
    assert!(!dead.exists(), "the dead writer's scratch must be cleaned");
    assert!(
        live.path().exists(),
        "a live writer's scratch must be left alone"
    );
    drop(live);
    drop(reopened);
    let left: Vec<_> = std::fs::read_dir(store.root().join("tmp"))
        .unwrap()
        .collect();
    assert!(
        left.is_empty(),
        "a dropped scratch leaves nothing: {left:?}"
    );
}

#[test]
fn a_store_root_with_a_loose_mode_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let err = Store::open(&root).unwrap_err();
    assert!(err.to_string().contains("mode 755"), "{err}");
}
