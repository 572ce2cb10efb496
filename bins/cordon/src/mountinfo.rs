//! The kernel's mount table (`/proc/<pid>/mountinfo`) as cordon reads it: each mount's point,
//! its per-mount options, its filesystem type and that filesystem's (super block's) options, the
//! octal escapes of a point decoded. Pure: the caller reads the table through its host seam.

use std::ffi::OsString;
use std::path::PathBuf;

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The mount point, relative to the reading process's root, decoded.
    pub point: PathBuf,
    /// The per-mount options (field 6: `ro` or `rw`, `nosuid`, `nodev`, `noexec`, …).
    pub options: Vec<String>,
    /// The filesystem type (the field after the ` - ` separator); empty on a line without one.
    pub fstype: String,
    /// The super block's options (the last field: a tmpfs's `size=…k`, …).
    pub super_options: Vec<String>,
}

impl Entry {
    /// Whether the mount is read-only.
    #[must_use]
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Every mount of `table`, in the table's order (a later mount at a point covers an earlier
/// one); a line too short to be the kernel's is skipped.
#[must_use]
pub fn entries(table: &str) -> Vec<Entry> {
    table
        .lines()
        .filter_map(|l| {
            let mut fields = l.split(' ');
            let point = fields.nth(4)?;
            let options = fields.next()?;
            // Optional fields (`shared:1`, …) run up to the lone `-`; then type, source and the
            // super block's options.
            let mut rest = fields.skip_while(|f| *f != "-").skip(1);
            let fstype = rest.next().unwrap_or_default();
            let super_options = rest.nth(1).unwrap_or_default();
            let split = |o: &str| -> Vec<String> {
                o.split(',')
                    .filter(|o| !o.is_empty())
                    .map(str::to_owned)
                    .collect()
            };
            Some(Entry {
                point: PathBuf::from(unescape(point)),
                options: split(options),
                fstype: fstype.to_owned(),
                super_options: split(super_options),
            })
        })
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
#[must_use]
pub fn unescape(field: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // Three octal digits of one byte (the first at most 3): the kernel's escapes are
        // `\040`, `\011`, `\012` and `\134`; anything else is kept as it is.
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| (b'0'..=b'3').contains(&d[0]))
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_decoded_and_options_split() {
        let table = "22 1 0:21 / / ro,nosuid shared:1 master:2 - overlay overlay rw,lowerdir=/x\n\
                     23 22 0:22 / /a\\040b rw,noexec - tmpfs tmpfs rw,size=65536k,mode=755\n\
                     24 22 0:23 / /c\\134d\\011e\\012 ro - tmpfs tmpfs rw\n\
                     25 22 0:24 / /d rw\n\
                     short line\n";
        let e = entries(table);
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].fstype, "overlay");
        assert_eq!(e[0].super_options, ["rw", "lowerdir=/x"]);
        assert_eq!(e[1].fstype, "tmpfs");
        assert_eq!(e[1].super_options, ["rw", "size=65536k", "mode=755"]);
        // A line without the separator: no type, no super options.
        assert_eq!((e[3].fstype.as_str(), e[3].super_options.len()), ("", 0));
        assert_eq!(e[0].point, PathBuf::from("/"));
        assert!(e[0].read_only());
        assert_eq!(e[1].point, PathBuf::from("/a b"));
        assert_eq!(e[1].options, ["rw", "noexec"]);
        assert!(!e[1].read_only());
        assert_eq!(e[2].point, PathBuf::from("/c\\d\te\n"));
        // Every escape the kernel writes, and what is not one kept as it is.
        assert_eq!(
            unescape("/a\\040b\\011c\\012d\\134e"),
            OsString::from("/a b\tc\nd\\e")
        );
        assert_eq!(unescape("/x\\777\\8\\04"), OsString::from("/x\\777\\8\\04"));
    }
}
