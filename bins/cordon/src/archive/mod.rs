//! The one safe tar reader: every archive cordon admits (a candidate delta at intake, an image
//! layer at unpack) goes through [`scan`].
//!
//! It owns the shape rules: only regular files and directories; clean, relative, UTF-8 paths
//! within the length and depth bounds; no duplicates (also after Unicode NFC normalisation,
//! also a file against a directory); no setuid, setgid or sticky bits; PAX and GNU long-name
//! headers bounded and only where they are legal; member, size, extracted-byte and
//! compression-ratio bounds checked while streaming, so a bomb is refused before its bytes are
//! written; a complete end-of-archive marker with nothing but zeros after it, and nothing at all
//! after the compressed stream. The archive's sha256 is computed over exactly the bytes read.
//!
//! Owners, groups and times in the archive are ignored; of the mode only "executable or not"
//! survives. Compression is recognised by magic number: gzip and zstd, else plain tar.
//!
//! It does not decide where file contents go: the caller's [`Sink`] receives them. It never
//! creates a link, a device or a special file, because it never admits one.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::rc::Rc;

use sha2::{Digest as _, Sha256};
use tar::EntryType;
use unicode_normalization::UnicodeNormalization;

use crate::canonical::Digest;

mod stream;

use stream::{Shared, classify};

/// The bounds an archive must stay within (policy `intake { archive { … } }`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveLimits {
    /// Bytes of the (compressed) archive as read from the source.
    pub max_archive_bytes: u64,
    /// Sum of the sizes of the regular files.
    pub max_extracted_bytes: u64,
    /// Members, directories included, extension headers not.
    pub max_members: u64,
    /// Size of one regular file.
    pub max_file_bytes: u64,
    /// Length of a member path in bytes.
    pub max_path_length: u64,
    /// Components of a member path.
    pub max_depth: u64,
    /// Size of one PAX extended header's data.
    pub max_pax_bytes: u64,
    /// Decompressed bytes per compressed byte (after a 1 MiB allowance).
    pub max_compression_ratio: u64,
    /// Component names refused anywhere in a path: exact names, or `*suffix` patterns.
    pub exclude: Vec<String>,
}

/// Every rejection code the reader uses.
pub const CODES: &[&str] = &[
    "intake.absolute-path",
    "intake.archive-too-big",
    "intake.compression-ratio",
    "intake.control-character",
    "intake.corrupt",
    "intake.device",
    "intake.dot-component",
    "intake.dotdot",
    "intake.duplicate",
    "intake.empty-component",
    "intake.entry-type",
    "intake.excluded",
    "intake.extracted-too-big",
    "intake.fifo",
    "intake.file-too-big",
    "intake.format",
    "intake.hardlink",
    "intake.name-too-long",
    "intake.non-utf8",
    "intake.nul",
    "intake.path-too-long",
    "intake.pax-key",
    "intake.pax-path",
    "intake.pax-too-big",
    "intake.sparse",
    "intake.special-mode",
    "intake.symlink",
    "intake.too-deep",
    "intake.too-many-members",
    "intake.trailing-data",
    "intake.truncated",
];

/// The longest path component Linux takes (`NAME_MAX`): a longer name could never be written,
/// so it is the candidate's input that is wrong, found at intake rather than as a later stage's
/// "File name too long".
pub const NAME_MAX: usize = 255;

/// Decompressed bytes always allowed before the compression ratio is enforced, so that a small
/// archive whose tar padding compresses to nothing is not mistaken for a bomb.
pub const RATIO_ALLOWANCE: u64 = 1 << 20;

/// A candidate-attributable reason an archive is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Stable reason code, `intake.<rule>`.
    pub code: &'static str,
    /// The member path concerned (lossily decoded when it is not UTF-8).
    pub path: Option<String>,
    /// A human sentence.
    pub message: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: {p:?}: {}", self.code, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

fn reject(code: &'static str, path: Option<&str>, message: impl Into<String>) -> Rejection {
    Rejection {
        code,
        path: path.map(str::to_owned),
        message: message.into(),
    }
}

/// Why [`scan`] did not produce a result.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ArchiveError {
    /// The archive breaks a rule (the candidate's fault).
    #[error("archive rejected: {0}")]
    #[diagnostic(code(cordon::archive::rejected))]
    Rejected(Rejection),
    /// The source could not be read (transport or local I/O; not the candidate's fault).
    #[error("cannot read the archive source")]
    #[diagnostic(code(cordon::archive::source))]
    Source {
        /// The reader's error.
        #[source]
        source: io::Error,
    },
    /// The sink could not store a member.
    #[error("cannot store member {path:?}")]
    #[diagnostic(code(cordon::archive::sink))]
    Sink {
        /// The member.
        path: String,
        /// The sink's error.
        #[source]
        source: io::Error,
    },
}

/// Where [`scan`] puts what it admits.
pub trait Sink {
    /// A writer for the contents of the next regular file (`size` bytes will be written).
    ///
    /// # Errors
    /// The file cannot be stored.
    fn file(&mut self, path: &str, executable: bool, size: u64) -> io::Result<Box<dyn Write + '_>>;

    /// A directory member (implicit parents are not reported).
    ///
    /// # Errors
    /// The directory cannot be stored.
    fn dir(&mut self, path: &str) -> io::Result<()>;
}

/// A sink that keeps nothing: the scan alone establishes what an archive holds (an image
/// layer's members, a fuzzed archive's admission).
pub struct Discard;

impl Sink for Discard {
    fn file(&mut self, _: &str, _: bool, _: u64) -> io::Result<Box<dyn Write + '_>> {
        Ok(Box::new(io::sink()))
    }

    fn dir(&mut self, _: &str) -> io::Result<()> {
        Ok(())
    }
}

/// One admitted regular file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Relative, clean, UTF-8 path.
    pub path: String,
    /// Whether any executable bit was set.
    pub executable: bool,
    /// Bytes.
    pub size: u64,
    /// sha256 of the contents.
    pub sha256: Digest,
}

/// What a successful scan established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// sha256 of every byte read from the source.
    pub archive_sha256: Digest,
    /// How many bytes that was.
    pub archive_bytes: u64,
    /// The regular files, in archive order.
    pub files: Vec<Member>,
    /// The directories named explicitly or implicitly, sorted.
    pub dirs: Vec<String>,
}

/// The kind an admitted path has, for duplicate detection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    ImplicitDir,
}

/// Validate a member path and return its clean form (a directory's one trailing `/` removed).
///
/// # Errors
/// The specific rule it breaks.
pub fn check_path(bytes: &[u8], is_dir: bool, limits: &ArchiveLimits) -> Result<String, Rejection> {
    let lossy = String::from_utf8_lossy(bytes).into_owned();
    let p = Some(lossy.as_str());
    if bytes.contains(&0) {
        return Err(reject("intake.nul", p, "the path contains a NUL byte"));
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(reject("intake.non-utf8", p, "the path is not UTF-8"));
    };
    // A newline or an escape in a name splits it in every line-based tool that later lists
    // the tree (a patcher's source list) and drives a terminal: no engine needs one.
    if text.chars().any(char::is_control) {
        return Err(reject(
            "intake.control-character",
            p,
            "the path contains a control character (a newline, a tab, an escape, …)",
        ));
    }
    let text = if is_dir {
        text.strip_suffix('/').unwrap_or(text)
    } else {
        text
    };
    if text.len() as u64 > limits.max_path_length {
        return Err(reject(
            "intake.path-too-long",
            p,
            format!("the path is longer than {} bytes", limits.max_path_length),
        ));
    }
    if text.starts_with('/') {
        return Err(reject("intake.absolute-path", p, "the path is absolute"));
    }
    let mut depth = 0u64;
    for component in text.split('/') {
        depth += 1;
        match component {
            "" => {
                return Err(reject(
                    "intake.empty-component",
                    p,
                    "the path has an empty component",
                ));
            }
            "." => {
                return Err(reject(
                    "intake.dot-component",
                    p,
                    "the path has a `.` component",
                ));
            }
            ".." => return Err(reject("intake.dotdot", p, "the path has a `..` component")),
            name if name.len() > NAME_MAX => {
                return Err(reject(
                    "intake.name-too-long",
                    p,
                    format!("a component of the path is longer than {NAME_MAX} bytes"),
                ));
            }
            name => {
                if let Some(pattern) = limits.exclude.iter().find(|pat| excluded(pat, name)) {
                    return Err(reject(
                        "intake.excluded",
                        p,
                        format!("the policy excludes {pattern:?}"),
                    ));
                }
            }
        }
    }
    if depth > limits.max_depth {
        return Err(reject(
            "intake.too-deep",
            p,
            format!("the path has more than {} components", limits.max_depth),
        ));
    }
    Ok(text.to_owned())
}

/// Whether a path component matches an exclusion: an exact name, or `*suffix`.
fn excluded(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => name.ends_with(suffix),
        None => name == pattern,
    }
}

/// Record `path` as `kind`, with implicit parent directories, refusing duplicates and
/// file-against-directory clashes. Keys are NFC-normalised so two spellings of one name clash.
fn admit(seen: &mut BTreeMap<String, Kind>, path: &str, kind: Kind) -> Result<(), Rejection> {
    let key: String = path.nfc().collect();
    let p = Some(path);
    let mut end = 0;
    while let Some(i) = key[end..].find('/') {
        let parent = &key[..end + i];
        match seen.get(parent) {
            Some(Kind::File) => {
                return Err(reject(
                    "intake.duplicate",
                    p,
                    format!("{parent:?} is a file and also a directory"),
                ));
            }
            Some(_) => {}
            None => {
                seen.insert(parent.to_owned(), Kind::ImplicitDir);
            }
        }
        end += i + 1;
    }
    match (seen.get(&key).copied(), kind) {
        (None, _) => {}
        (Some(Kind::ImplicitDir), Kind::Dir) => {}
        (Some(Kind::File), Kind::File) | (Some(Kind::Dir), Kind::Dir) => {
            return Err(reject(
                "intake.duplicate",
                p,
                "the path appears twice (after Unicode normalisation)",
            ));
        }
        _ => {
            return Err(reject(
                "intake.duplicate",
                p,
                "the path is both a file and a directory",
            ));
        }
    }
    seen.insert(key, kind);
    Ok(())
}

/// The member rules that do not depend on the tar encoding: count, path shape, duplicates,
/// sizes. [`scan`] applies them to each member it decodes; the privilege-separated intake
/// parent applies them again to each member its parser child reports, because it never takes
/// a path or a size from the child on trust.
pub struct Admission<'a> {
    limits: &'a ArchiveLimits,
    seen: BTreeMap<String, Kind>,
    members: u64,
    extracted: u64,
}

impl<'a> Admission<'a> {
    /// No member admitted yet.
    #[must_use]
    pub fn new(limits: &'a ArchiveLimits) -> Self {
        Self {
            limits,
            seen: BTreeMap::new(),
            members: 0,
            extracted: 0,
        }
    }

    /// Admit one member: a directory (`size` must be 0) or a regular file of `size` bytes.
    /// Returns its clean path.
    ///
    /// # Errors
    /// The first rule it breaks.
    pub fn member(
        &mut self,
        path_bytes: &[u8],
        is_dir: bool,
        size: u64,
    ) -> Result<String, Rejection> {
        let limits = self.limits;
        let lossy = String::from_utf8_lossy(path_bytes);
        let at = Some(lossy.as_ref());
        self.members += 1;
        if self.members > limits.max_members {
            return Err(reject(
                "intake.too-many-members",
                at,
                format!("the archive has more than {} members", limits.max_members),
            ));
        }
        let path = check_path(path_bytes, is_dir, limits)?;
        let kind = if is_dir { Kind::Dir } else { Kind::File };
        admit(&mut self.seen, &path, kind)?;
        if is_dir {
            if size != 0 {
                return Err(reject(
                    "intake.corrupt",
                    at,
                    "a directory member carries data",
                ));
            }
            return Ok(path);
        }
        if size > limits.max_file_bytes {
            return Err(reject(
                "intake.file-too-big",
                at,
                format!("{size} bytes exceeds {}", limits.max_file_bytes),
            ));
        }
        self.extracted += size;
        if self.extracted > limits.max_extracted_bytes {
            return Err(reject(
                "intake.extracted-too-big",
                at,
                format!(
                    "the files add up to more than {} bytes",
                    limits.max_extracted_bytes
                ),
            ));
        }
        Ok(path)
    }

    /// The directories named explicitly or implicitly, sorted.
    #[must_use]
    pub fn dirs(self) -> Vec<String> {
        self.seen
            .into_iter()
            .filter(|(_, k)| *k != Kind::File)
            .map(|(p, _)| p)
            .collect()
    }
}

/// Overrides that extension headers set for the next member.
#[derive(Default)]
struct Pending {
    pax_path: Option<Vec<u8>>,
    pax_seen: bool,
    long_name: Option<Vec<u8>>,
}

/// Keys a PAX header may carry; their values are ignored (owners, times) or applied (`path`).
const PAX_IGNORED: [&str; 8] = [
    "mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "comment",
];

/// Read an extension header's data, refusing more than `cap` bytes.
fn read_extension(
    entry: &mut dyn Read,
    size: u64,
    cap: u64,
    code: &'static str,
    what: &str,
) -> Result<Vec<u8>, io::Result<Rejection>> {
    if size > cap {
        return Err(Ok(reject(
            code,
            None,
            format!("a {what} of {size} bytes exceeds {cap}"),
        )));
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data).map_err(Err)?;
    Ok(data)
}

fn apply_pax(data: &[u8], global: bool, pending: &mut Pending) -> Result<(), Rejection> {
    for ext in tar::PaxExtensions::new(data) {
        let Ok(ext) = ext else {
            return Err(reject("intake.pax-key", None, "a PAX record is malformed"));
        };
        let Ok(key) = ext.key() else {
            return Err(reject("intake.pax-key", None, "a PAX key is not UTF-8"));
        };
        if key.starts_with("GNU.sparse.") {
            return Err(reject(
                "intake.sparse",
                None,
                "a PAX header describes a sparse file",
            ));
        }
        if global {
            if key != "comment" {
                return Err(reject(
                    "intake.pax-key",
                    None,
                    format!("the global PAX key {key:?} is not admitted"),
                ));
            }
        } else if key == "path" {
            pending.pax_path = Some(ext.value_bytes().to_vec());
        } else if !PAX_IGNORED.contains(&key) {
            return Err(reject(
                "intake.pax-key",
                None,
                format!("the PAX key {key:?} is not admitted"),
            ));
        }
    }
    Ok(())
}

/// Read an archive from `source`, check every rule, hand admitted files to `sink`.
///
/// # Errors
/// [`ArchiveError::Rejected`] with the first rule broken; [`ArchiveError::Source`] when the
/// source failed; [`ArchiveError::Sink`] when the sink did.
pub fn scan(
    source: impl Read,
    limits: &ArchiveLimits,
    sink: &mut dyn Sink,
) -> Result<Scanned, ArchiveError> {
    let (archive_sha256, archive_bytes, files, dirs) = walk(source, limits, sink, true)?;
    Ok(Scanned {
        archive_sha256: archive_sha256.ok_or_else(|| ArchiveError::Source {
            source: io::Error::other("the archive was not hashed"),
        })?,
        archive_bytes,
        files,
        dirs,
    })
}

/// [`scan`] without hashing anything: every rule checked, every file handed to `sink`, no
/// digest computed — for the confined child, whose parent hashes every byte itself and trusts
/// no digest the child could compute.
///
/// # Errors
/// As [`scan`].
pub fn check(
    source: impl Read,
    limits: &ArchiveLimits,
    sink: &mut dyn Sink,
) -> Result<(), ArchiveError> {
    walk(source, limits, sink, false).map(|_| ())
}

/// What [`walk`] established: the archive's hash and size, its files (hashed ones only), its
/// directories.
type Walked = (Option<Digest>, u64, Vec<Member>, Vec<String>);

/// Read an extension header (PAX, global PAX, GNU long name) into `pending`; whether the
/// entry was one (and so is no member).
fn extension<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    entry_type: EntryType,
    size: u64,
    limits: &ArchiveLimits,
    pending: &mut Pending,
    shared: &Shared,
) -> Result<bool, ArchiveError> {
    let ext_err = |e: io::Result<Rejection>| match e {
        Ok(r) => ArchiveError::Rejected(r),
        Err(e) => classify(shared, e, None),
    };
    match entry_type {
        EntryType::XHeader => {
            if pending.pax_seen {
                return Err(ArchiveError::Rejected(reject(
                    "intake.pax-path",
                    None,
                    "two PAX headers precede one member",
                )));
            }
            let data = read_extension(
                entry,
                size,
                limits.max_pax_bytes,
                "intake.pax-too-big",
                "PAX header",
            )
            .map_err(ext_err)?;
            apply_pax(&data, false, pending).map_err(ArchiveError::Rejected)?;
            pending.pax_seen = true;
            Ok(true)
        }
        EntryType::XGlobalHeader => {
            let data = read_extension(
                entry,
                size,
                limits.max_pax_bytes,
                "intake.pax-too-big",
                "global PAX header",
            )
            .map_err(ext_err)?;
            apply_pax(&data, true, pending).map_err(ArchiveError::Rejected)?;
            Ok(true)
        }
        EntryType::GNULongName => {
            if pending.long_name.is_some() {
                return Err(ArchiveError::Rejected(reject(
                    "intake.pax-path",
                    None,
                    "two GNU long names precede one member",
                )));
            }
            let mut data = read_extension(
                entry,
                size,
                limits.max_path_length + 1,
                "intake.path-too-long",
                "GNU long name",
            )
            .map_err(ext_err)?;
            while data.last() == Some(&0) {
                data.pop();
            }
            pending.long_name = Some(data);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The kind of member `entry_type` is: a regular file or a directory, else the rejection.
fn member_kind(entry_type: EntryType, at: Option<&str>) -> Result<Kind, ArchiveError> {
    Ok(match entry_type {
        EntryType::Regular => Kind::File,
        EntryType::Directory => Kind::Dir,
        EntryType::Symlink => {
            return Err(ArchiveError::Rejected(reject(
                "intake.symlink",
                at,
                "symbolic links are not admitted",
            )));
        }
        EntryType::Link | EntryType::GNULongLink => {
            return Err(ArchiveError::Rejected(reject(
                "intake.hardlink",
                at,
                "hard links are not admitted",
            )));
        }
        EntryType::Char | EntryType::Block => {
            return Err(ArchiveError::Rejected(reject(
                "intake.device",
                at,
                "device nodes are not admitted",
            )));
        }
        EntryType::Fifo => {
            return Err(ArchiveError::Rejected(reject(
                "intake.fifo",
                at,
                "fifos are not admitted",
            )));
        }
        EntryType::GNUSparse => {
            return Err(ArchiveError::Rejected(reject(
                "intake.sparse",
                at,
                "sparse files are not admitted",
            )));
        }
        other => {
            return Err(ArchiveError::Rejected(reject(
                "intake.entry-type",
                at,
                format!(
                    "member type {:?} is not admitted (only regular files and directories)",
                    other.as_byte() as char
                ),
            )));
        }
    })
}

/// Stream one regular member into the sink (hashing it when asked), checking it is whole.
#[allow(clippy::too_many_arguments)]
fn copy_member<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: String,
    executable: bool,
    size: u64,
    sink: &mut dyn Sink,
    hash: bool,
    buf: &mut [u8],
    shared: &Shared,
) -> Result<Option<Member>, ArchiveError> {
    let at = Some(path.as_str());
    let mut hasher = hash.then(Sha256::new);
    let sink_err = |source| ArchiveError::Sink {
        path: path.clone(),
        source,
    };
    let mut out = sink.file(&path, executable, size).map_err(sink_err)?;
    let mut copied = 0u64;
    loop {
        let n = entry.read(buf).map_err(|e| classify(shared, e, at))?;
        if n == 0 {
            break;
        }
        if let Some(h) = hasher.as_mut() {
            h.update(&buf[..n]);
        }
        copied += n as u64;
        out.write_all(&buf[..n]).map_err(sink_err)?;
    }
    // The parser hands out at most `size` bytes and stops quietly at EOF.
    if copied != size {
        return Err(ArchiveError::Rejected(reject(
            "intake.truncated",
            at,
            format!("the archive ends after {copied} of the member's {size} bytes"),
        )));
    }
    out.flush().map_err(sink_err)?;
    drop(out);
    Ok(hasher.map(|h| Member {
        path,
        executable,
        size,
        sha256: Digest::from_hasher(h),
    }))
}

fn walk(
    source: impl Read,
    limits: &ArchiveLimits,
    sink: &mut dyn Sink,
    hash: bool,
) -> Result<Walked, ArchiveError> {
    let shared = Rc::new(Shared::default());
    let expanded = stream::open(source, limits, hash, &shared)?;
    let mut archive = tar::Archive::new(expanded);
    let mut admission = Admission::new(limits);
    let mut files = Vec::new();
    let mut pending = Pending::default();
    let mut buf = vec![0u8; 256 * 1024];
    {
        let entries = archive
            .entries()
            .map_err(|e| classify(&shared, e, None))?
            .raw(true);
        for entry in entries {
            let mut entry = entry.map_err(|e| classify(&shared, e, None))?;
            let header = entry.header();
            let entry_type = header.entry_type();
            let size = header
                .entry_size()
                .map_err(|e| classify(&shared, e, None))?;
            if extension(&mut entry, entry_type, size, limits, &mut pending, &shared)? {
                continue;
            }
            let header = entry.header();
            let path_bytes = match (pending.pax_path.take(), pending.long_name.take()) {
                (Some(_), Some(_)) => {
                    return Err(ArchiveError::Rejected(reject(
                        "intake.pax-path",
                        None,
                        "a PAX path and a GNU long name both rename one member",
                    )));
                }
                (Some(p), None) | (None, Some(p)) => p,
                (None, None) => header.path_bytes().into_owned(),
            };
            pending.pax_seen = false;
            let lossy = String::from_utf8_lossy(&path_bytes).into_owned();
            let at = Some(lossy.as_str());
            let kind = member_kind(entry_type, at)?;
            // Mode first: a setuid member is refused as such, whatever else it breaks.
            let mode = header.mode().map_err(|e| classify(&shared, e, at))?;
            if mode & 0o7000 != 0 {
                return Err(ArchiveError::Rejected(reject(
                    "intake.special-mode",
                    at,
                    format!("mode {mode:o} has a setuid, setgid or sticky bit"),
                )));
            }
            let path = admission
                .member(&path_bytes, kind == Kind::Dir, size)
                .map_err(ArchiveError::Rejected)?;
            if kind == Kind::Dir {
                sink.dir(&path).map_err(|source| ArchiveError::Sink {
                    path: path.clone(),
                    source,
                })?;
                continue;
            }
            let member = copy_member(
                &mut entry,
                path,
                mode & 0o111 != 0,
                size,
                sink,
                hash,
                &mut buf,
                &shared,
            )?;
            files.extend(member);
        }
    }
    if pending.pax_path.is_some() || pending.long_name.is_some() || pending.pax_seen {
        return Err(ArchiveError::Rejected(reject(
            "intake.pax-path",
            None,
            "an extension header is followed by no member",
        )));
    }
    let raw = stream::end(archive.into_inner(), &mut buf, &shared)?;
    let archive_sha256 = if hash {
        Some(
            raw.hasher
                .finish()
                .map_err(|source| ArchiveError::Source { source })?,
        )
    } else {
        None
    };
    let dirs = admission.dirs();
    Ok((archive_sha256, shared.raw_bytes.get(), files, dirs))
}

#[cfg(test)]
mod tests {
    //! The path rules in isolation (the 50-case hostile corpus drives `scan` end to end in
    //! `tests/archive_corpus.rs`).

    use super::*;

    fn limits() -> ArchiveLimits {
        ArchiveLimits {
            max_archive_bytes: 1 << 20,
            max_extracted_bytes: 1 << 20,
            max_members: 100,
            max_file_bytes: 1 << 20,
            max_path_length: 64,
            max_depth: 4,
            max_pax_bytes: 4096,
            max_compression_ratio: 100,
            exclude: vec![".git".into(), "*.pyc".into()],
        }
    }

    #[test]
    fn clean_relative_utf8_paths_pass_and_each_escape_has_its_code() {
        let l = limits();
        assert_eq!(check_path(b"a/b.py", false, &l).unwrap(), "a/b.py");
        for (path, code) in [
            (&b"/etc/passwd"[..], "intake.absolute-path"),
            (b"a/../../x", "intake.dotdot"),
            (b"./a", "intake.dot-component"),
            (b"a//b", "intake.empty-component"),
            (b"a/\xff", "intake.non-utf8"),
            (b"a/\0b", "intake.nul"),
            (b"a/b\nc.c", "intake.control-character"),
            (b"a/\x1b[2J", "intake.control-character"),
            (b"a/.git/config", "intake.excluded"),
            (b"a/b/c/d/e/f", "intake.too-deep"),
        ] {
            let r = check_path(path, false, &l).unwrap_err();
            assert_eq!(r.code, code, "{}", String::from_utf8_lossy(path));
        }
        // A component over NAME_MAX in a path within max-path-length; NAME_MAX itself passes.
        let l = ArchiveLimits {
            max_path_length: 1024,
            ..limits()
        };
        let at_max = format!("a/{}", "n".repeat(255));
        assert_eq!(check_path(at_max.as_bytes(), false, &l).unwrap(), at_max);
        for (path, code) in [
            (format!("a/{}", "n".repeat(256)), "intake.name-too-long"),
            (format!("{}/b", "é".repeat(128)), "intake.name-too-long"),
        ] {
            let r = check_path(path.as_bytes(), false, &l).unwrap_err();
            assert_eq!(r.code, code, "{path}");
        }
        let long = "a".repeat(65);
        assert_eq!(
            check_path(long.as_bytes(), false, &limits())
                .unwrap_err()
                .code,
            "intake.path-too-long"
        );
    }
}
