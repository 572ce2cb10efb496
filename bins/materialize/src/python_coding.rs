//! The source encoding: a file is read as UTF-8 and only as UTF-8, so a PEP 263 coding
//! declaration that makes CPython read it otherwise is refused.
//!
//! CPython honours `# -*- coding: NAME -*-` on the first or second line (the regex
//! `^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)`, the second line only when the first holds nothing
//! but a comment). With `unicode_escape`, `utf-7` or any codec other than UTF-8, text the scanner
//! reads as a comment or a string can decode into code, so the AST policy would judge a
//! different program from the one CPython runs. This module is stricter than CPython, never
//! looser: it reads both first lines whatever the first holds, ends a line at `\n`, `\r` or
//! `\r\n`, takes every `coding:`/`coding=` on them (not only the first, and not only in a
//! comment), and admits only the names `utf-8` and `utf8`, ignoring case, `_` read as `-` (as
//! CPython's `get_normal_name` does). `utf-8-sig`, `u8` and `cp65001` are refused although
//! CPython decodes them as UTF-8: an operator loses nothing by a plain `utf-8`. A UTF-8
//! byte-order mark is admitted, alone or with a `utf-8` declaration, as CPython does.
//!
//! What it does not do: decide whether the bytes are UTF-8 — a file that is not is refused
//! before it becomes text (`python.encoding`, in the caller).

/// A refused declaration: where it is and what it names.
#[derive(Debug)]
pub struct Declared {
    /// Byte offset of the declared name in the file.
    pub start: usize,
    /// End of the name.
    pub end: usize,
    /// The declared name as written.
    pub name: String,
    /// The file starts with a UTF-8 byte-order mark.
    pub bom: bool,
}

/// The first coding declaration of `source` that is not UTF-8, if any.
#[must_use]
pub fn refused(source: &str) -> Option<Declared> {
    let bom = source.starts_with('\u{feff}');
    let mut offset = 0;
    for line in first_lines(source) {
        let mut from = 0;
        while let Some(found) = line[from..].find("coding") {
            let at = from + found + "coding".len();
            from = at;
            if !matches!(line.as_bytes().get(at), Some(b':' | b'=')) {
                continue;
            }
            let rest = &line[at + 1..];
            let skipped = rest.len() - rest.trim_start_matches([' ', '\t']).len();
            let name_at = at + 1 + skipped;
            let len = line[name_at..]
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                .count();
            let name = &line[name_at..name_at + len];
            // An empty name is no declaration: CPython reads on.
            if !name.is_empty() && !is_utf8(name) {
                return Some(Declared {
                    start: offset + name_at,
                    end: offset + name_at + len,
                    name: name.to_owned(),
                    bom,
                });
            }
        }
        offset += line.len();
    }
    None
}

/// The first two lines, each with its terminator (so offsets add up).
fn first_lines(source: &str) -> impl Iterator<Item = &str> {
    let mut rest = source;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.find(['\n', '\r']).map_or(rest.len(), |i| {
            if rest[i..].starts_with("\r\n") {
                i + 2
            } else {
                i + 1
            }
        });
        let (line, tail) = rest.split_at(end);
        rest = tail;
        Some(line)
    })
    .take(2)
}

fn is_utf8(name: &str) -> bool {
    let normal = name.to_ascii_lowercase().replace('_', "-");
    normal == "utf-8" || normal == "utf8"
}
