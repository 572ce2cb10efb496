//! What the materialize test binaries share: delta archives built from their members.

#![allow(clippy::unwrap_used)]

/// (path, contents, mode) of one delta member.
pub type Member<'a> = (&'a str, &'a [u8], u32);

/// A delta archive from its members, deterministic.
pub fn delta_tar(files: &[Member<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_mtime(0);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

pub const MANIFEST: &[u8] =
    b"delta target=\"attention\" package=\"fast_attn\" step=\"build-native\" tier=\"native-rebuild\"\n";
