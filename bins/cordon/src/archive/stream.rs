//! The reader layers under the tar parser: the raw source (counted, capped at the archive
//! limit, hashed on its own thread), the decoder chosen by magic number, and the expanded
//! stream (the compression ratio enforced); the classification of an I/O error met in them,
//! and the check of what follows the end-of-archive marker.

use std::cell::{Cell, RefCell};
use std::io::{self, BufRead, BufReader, Read};
use std::rc::Rc;

use sha2::{Digest as _, Sha256};

use super::{ArchiveError, ArchiveLimits, RATIO_ALLOWANCE, Rejection, reject};
use crate::canonical::Digest;

/// State shared by the reader layers: a limit tripped deep inside a decoder is reported as
/// itself, not as whatever error the decoder wraps it in.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) raw_bytes: Cell<u64>,
    tripped: RefCell<Option<Rejection>>,
    source_failed: Cell<bool>,
}

/// The archive hash, computed on its own thread: the archive and the files inside it are both
/// hashed, and on two cores the two passes then cost about one.
/// Or no hash at all, for a reader whose caller hashes the bytes itself.
pub(super) struct ArchiveHasher {
    tx: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    done: Option<std::thread::JoinHandle<Sha256>>,
    enabled: bool,
}

impl ArchiveHasher {
    fn off() -> Self {
        Self {
            tx: None,
            done: None,
            enabled: false,
        }
    }

    fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
        let done = std::thread::Builder::new()
            .name("cordon-archive-sha256".into())
            .spawn(move || {
                let mut hasher = Sha256::new();
                for chunk in rx {
                    hasher.update(&chunk);
                }
                hasher
            })
            .ok();
        Self {
            tx: Some(tx),
            done,
            enabled: true,
        }
    }

    fn update(&mut self, bytes: &[u8]) -> io::Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let sent = match (&self.tx, &self.done) {
            (Some(tx), Some(_)) => tx.send(bytes.to_vec()).is_ok(),
            _ => false,
        };
        if sent {
            Ok(())
        } else {
            Err(io::Error::other("the archive hashing thread is gone"))
        }
    }

    pub(super) fn finish(mut self) -> io::Result<Digest> {
        drop(self.tx.take());
        self.done
            .take()
            .and_then(|h| h.join().ok())
            .map(Digest::from_hasher)
            .ok_or_else(|| io::Error::other("the archive hashing thread failed"))
    }
}

/// The bottom layer: counts and hashes what the source yields and enforces the archive cap.
pub(super) struct Raw<R> {
    inner: R,
    pub(super) hasher: ArchiveHasher,
    cap: u64,
    shared: Rc<Shared>,
}

impl<R: Read> Read for Raw<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf).inspect_err(|_| {
            self.shared.source_failed.set(true);
        })?;
        self.hasher.update(&buf[..n])?;
        let total = self.shared.raw_bytes.get() + n as u64;
        self.shared.raw_bytes.set(total);
        if total > self.cap {
            let r = reject(
                "intake.archive-too-big",
                None,
                format!("the archive exceeds {} bytes", self.cap),
            );
            *self.shared.tripped.borrow_mut() = Some(r);
            return Err(io::Error::other("archive byte cap"));
        }
        Ok(n)
    }
}

/// The decompressed stream, whichever format it is.
enum Decoder<R: Read> {
    Plain(BufReader<Raw<R>>),
    Gzip(flate2::bufread::GzDecoder<BufReader<Raw<R>>>),
    Zstd(zstd::stream::read::Decoder<'static, BufReader<Raw<R>>>),
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(r) => r.read(buf),
            Self::Gzip(r) => r.read(buf),
            Self::Zstd(r) => r.read(buf),
        }
    }
}

impl<R: Read> Decoder<R> {
    fn into_raw(self) -> BufReader<Raw<R>> {
        match self {
            Self::Plain(r) => r,
            Self::Gzip(r) => r.into_inner(),
            Self::Zstd(r) => r.finish(),
        }
    }
}

/// The top layer, read by the tar parser: counts decompressed bytes and enforces the ratio.
pub(super) struct Expanded<R: Read> {
    inner: Decoder<R>,
    pos: u64,
    ratio: u64,
    shared: Rc<Shared>,
}

impl<R: Read> Read for Expanded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        let allowed = self
            .shared
            .raw_bytes
            .get()
            .saturating_mul(self.ratio)
            .saturating_add(RATIO_ALLOWANCE);
        if self.pos > allowed {
            let r = reject(
                "intake.compression-ratio",
                None,
                format!(
                    "{} bytes expanded from {} compressed, above the ratio {}",
                    self.pos,
                    self.shared.raw_bytes.get(),
                    self.ratio
                ),
            );
            *self.shared.tripped.borrow_mut() = Some(r);
            return Err(io::Error::other("compression ratio"));
        }
        Ok(n)
    }
}

/// Classify an I/O error met while reading the archive: a tripped limit, a failed source, a
/// truncation, or a malformed archive.
pub(super) fn classify(shared: &Shared, err: io::Error, path: Option<&str>) -> ArchiveError {
    if let Some(r) = shared.tripped.borrow_mut().take() {
        return ArchiveError::Rejected(r);
    }
    if shared.source_failed.get() {
        return ArchiveError::Source { source: err };
    }
    if err.kind() == io::ErrorKind::UnexpectedEof || err.to_string().contains("unexpected EOF") {
        return ArchiveError::Rejected(reject(
            "intake.truncated",
            path,
            "the archive ends inside a member",
        ));
    }
    ArchiveError::Rejected(reject("intake.corrupt", path, err.to_string()))
}

/// The layered reader over `source`: raw bytes counted, capped and hashed, decompressed by
/// magic number (gzip, zstd, else plain; xz and bzip2 refused), expansion ratio enforced.
pub(super) fn open<R: Read>(
    source: R,
    limits: &ArchiveLimits,
    hash: bool,
    shared: &Rc<Shared>,
) -> Result<Expanded<R>, ArchiveError> {
    let raw = Raw {
        inner: source,
        hasher: if hash {
            ArchiveHasher::start()
        } else {
            ArchiveHasher::off()
        },
        cap: limits.max_archive_bytes,
        shared: Rc::clone(shared),
    };
    let mut buffered = BufReader::with_capacity(256 * 1024, raw);
    let magic = buffered
        .fill_buf()
        .map_err(|e| classify(shared, e, None))?
        .to_vec();
    let decoder = if magic.starts_with(&[0x1f, 0x8b]) {
        Decoder::Gzip(flate2::bufread::GzDecoder::new(buffered))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let d = zstd::stream::read::Decoder::with_buffer(buffered)
            .map_err(|e| classify(shared, e, None))?
            .single_frame();
        Decoder::Zstd(d)
    } else if magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) || magic.starts_with(b"BZh") {
        return Err(ArchiveError::Rejected(reject(
            "intake.format",
            None,
            "xz and bzip2 are not admitted; use tar, tar+gzip or tar+zstd",
        )));
    } else {
        Decoder::Plain(buffered)
    };
    let expanded = Expanded {
        inner: decoder,
        pos: 0,
        ratio: limits.max_compression_ratio,
        shared: Rc::clone(shared),
    };
    Ok(expanded)
}

/// After the tar parser stopped: the second zero block and nothing but zero padding, then
/// nothing after the compressed stream. The raw layer, for its hash.
pub(super) fn end<R: Read>(
    mut expanded: Expanded<R>,
    buf: &mut [u8],
    shared: &Shared,
) -> Result<Raw<R>, ArchiveError> {
    let end_seen = expanded.pos;
    // The parser stopped at a zero block or at EOF. What follows must be the second zero block
    // and nothing but zero padding; a stream that just stops has lost its end marker.
    let mut rest = 0u64;
    loop {
        let n = expanded.read(buf).map_err(|e| classify(shared, e, None))?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Err(ArchiveError::Rejected(reject(
                "intake.trailing-data",
                None,
                "non-zero data follows the end-of-archive marker",
            )));
        }
        rest += n as u64;
    }
    if !end_seen.is_multiple_of(512) || rest < 512 {
        return Err(ArchiveError::Rejected(reject(
            "intake.truncated",
            None,
            "the archive has no complete end-of-archive marker",
        )));
    }
    let mut raw = expanded.inner.into_raw();
    let mut tail = [0u8; 1];
    match raw.read(&mut tail) {
        Ok(0) => {}
        Ok(_) => {
            return Err(ArchiveError::Rejected(reject(
                "intake.trailing-data",
                None,
                "bytes follow the end of the compressed stream",
            )));
        }
        Err(e) => return Err(classify(shared, e, None)),
    }
    Ok(raw.into_inner())
}
