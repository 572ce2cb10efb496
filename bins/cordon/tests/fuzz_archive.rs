//! Bounded fuzzing of the archive reader, run in the ordinary test tier: arbitrary bytes, and
//! valid archives (plain, gzip, zstd) truncated and with bytes overwritten, must each end in an
//! admission, a coded rejection or a source error — never a panic, a hang or an overflow.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;

use cordon::archive::{self, ArchiveError, ArchiveLimits, Discard};
use proptest::prelude::*;

fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_archive_bytes: 1 << 20,
        max_extracted_bytes: 1 << 20,
        max_members: 64,
        max_file_bytes: 256 << 10,
        max_path_length: 256,
        max_depth: 16,
        max_pax_bytes: 4096,
        max_compression_ratio: 100,
        exclude: vec![".git".into()],
    }
}

/// Scan `bytes`: an admission or a coded rejection. Reading a byte slice cannot fail on the
/// host's side, so a source or sink error here would blame the host for the candidate's bytes.
fn scan(bytes: &[u8]) {
    match archive::scan(bytes, &limits(), &mut Discard) {
        Ok(_) => {}
        Err(ArchiveError::Rejected(r)) => assert!(r.code.starts_with("intake."), "{r:?}"),
        Err(other) => panic!("candidate bytes were classified as a host fault: {other:?}"),
    }
}

/// A small valid archive: directories, a file, a symlink, a long (GNU) name.
fn seed() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("a/b/c.py", &b"print(1)\n"[..]),
        ("a/d", b""),
        (&"x".repeat(120)[..], b"long"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        b.append_data(&mut h, path, data).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "a/link", "b/c.py").unwrap();
    b.into_inner().unwrap()
}

fn encodings() -> [Vec<u8>; 3] {
    let plain = seed();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::encode_all(&plain[..], 1).unwrap();
    [plain, gz, zst]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_crash_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        scan(&bytes);
    }

    #[test]
    fn damaged_archives_never_crash_the_reader(
        which in 0usize..3,
        cut in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..16),
    ) {
        let mut bytes = encodings()[which].clone();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        scan(&bytes);
    }
}
