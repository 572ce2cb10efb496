//! Intake through a confined parser child (REQ-117): the root parent never decodes a
//! candidate byte.
//!
//! The parent streams the source to the child's stdin (after one frame with the archive
//! bounds), hashing and counting every byte itself; the child ([`archive_child`], confined by
//! [`crate::confine`]) runs the one safe tar reader and answers with frames: `F` a regular
//! file's path, mode bit and size, then its bytes in `B` frames; `D` a directory; `R` a
//! rejection; `E` the end. The parent re-applies every member rule ([`Admission`]) to what the
//! child reports, counts and hashes each file's bytes itself, compares its own archive hash
//! with the committed one, and only then publishes. A child that crashes, hits a limit, runs
//! past its deadline or breaks the framing is a rejection (`intake.parser`); one that cannot
//! confine itself or is killed from outside is a no-decision. Either way the store's content
//! is unchanged: files are staged in the parent's scratch directory, dropped on any error.
//!
//! What the parent cannot check is that the files are really the archive's: a child subverted
//! by its input can report other files. Those would still be the candidate's own bytes (only
//! the candidate's archive reaches the child), bounded and shaped by the same rules, and the
//! child has nothing else to reach: no store, no host file, no network.

use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{Admitted, IntakeError, check_committed, publish};
use crate::archive::{self, Admission, ArchiveError, ArchiveLimits, Member, Rejection, Sink};
use crate::canonical::Digest;
use crate::confine::{self, Ended, FrameError, FrameReader, Launch, Supervised, write_frame};
use crate::store::{Store, StoreError};

/// The dispatch key of the archive parser child.
pub const ARCHIVE_CHILD: &str = "archive";

/// Bytes of file content per `B` frame.
const CHUNK: usize = 64 * 1024;

/// A regular file's header frame.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFact {
    path: String,
    executable: bool,
    size: u64,
}

/// A directory's frame.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirFact {
    path: String,
}

/// A rejection's frame.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RejectFact {
    code: String,
    path: Option<String>,
    message: String,
}

/// The child's sink: each file becomes an `F` frame and its bytes `B` frames.
struct FrameSink<'a> {
    out: &'a mut dyn Write,
}

struct FileFrames<'a> {
    out: &'a mut dyn Write,
}

impl Write for FileFrames<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK);
        write_frame(self.out, b'B', &buf[..n])?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn json<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(io::Error::other)
}

impl Sink for FrameSink<'_> {
    fn file(&mut self, path: &str, executable: bool, size: u64) -> io::Result<Box<dyn Write + '_>> {
        let fact = FileFact {
            path: path.to_owned(),
            executable,
            size,
        };
        write_frame(self.out, b'F', &json(&fact)?)?;
        Ok(Box::new(FileFrames { out: self.out }))
    }

    fn dir(&mut self, path: &str) -> io::Result<()> {
        let fact = DirFact {
            path: path.to_owned(),
        };
        write_frame(self.out, b'D', &json(&fact)?)
    }
}

/// The child's work, after it confined itself: read the bounds frame, then decode the archive
/// on `input` into frames on `output`. Returns the exit status.
pub fn archive_child(input: &mut dyn Read, output: &mut dyn Write) -> i32 {
    let mut out = BufWriter::with_capacity(256 * 1024, output);
    let limits = match FrameReader::new(&mut *input, 64 * 1024, 64 * 1024).frame() {
        Ok(Some((b'L', payload))) => match serde_json::from_slice::<ArchiveLimits>(&payload) {
            Ok(l) => l,
            Err(_) => return 2,
        },
        _ => return 2,
    };
    // The parent hashes every byte itself: the child hashes nothing.
    let checked = archive::check(&mut *input, &limits, &mut FrameSink { out: &mut out });
    let (status, frame) = match checked {
        Ok(()) => (0, (b'E', Vec::new())),
        Err(ArchiveError::Rejected(r)) => {
            let fact = RejectFact {
                code: r.code.to_owned(),
                path: r.path,
                message: r.message,
            };
            match json(&fact) {
                Ok(bytes) => (confine::REJECTED_EXIT, (b'R', bytes)),
                Err(_) => return 4,
            }
        }
        // The parent's pipe failed: it knows why, from its own side.
        Err(ArchiveError::Source { .. }) => return 3,
        Err(ArchiveError::Sink { .. }) => return 4,
    };
    if write_frame(&mut out, frame.0, &frame.1)
        .and_then(|()| out.flush())
        .is_err()
    {
        return 4;
    }
    status
}

/// What the pump thread saw of the source.
struct Pumped {
    sha256: Digest,
    /// The source had more than the archive bound.
    too_big: bool,
    /// The source failed.
    failed: Option<io::Error>,
    /// The whole source was read and written to the child: only then is `sha256` its hash.
    complete: bool,
}

/// Copy the bounds frame and then the source to the child, hashing and counting as it goes.
fn pump(mut source: impl Read, mut to_child: impl Write, limits: &ArchiveLimits) -> Pumped {
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    let mut out = Pumped {
        sha256: Digest::from_hasher(Sha256::new()),
        too_big: false,
        failed: None,
        complete: false,
    };
    let head = json(limits).and_then(|l| write_frame(&mut to_child, b'L', &l));
    if head.is_err() {
        // The child is gone; how it ended says why.
        return out;
    }
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.failed = Some(e);
                return out;
            }
        };
        total += n as u64;
        if total > limits.max_archive_bytes {
            out.too_big = true;
            return out;
        }
        hasher.update(&buf[..n]);
        if to_child.write_all(&buf[..n]).is_err() {
            // The child stopped reading (it rejected or died): keep hashing nothing more.
            return out;
        }
    }
    out.sha256 = Digest::from_hasher(hasher);
    out.complete = true;
    out
}

/// What the parent made of the child's frames.
enum Facts {
    /// Every frame checked and an `E` frame seen.
    Complete(Vec<Member>, Vec<PathBuf>),
    /// The child reported a rejection.
    Rejected(Rejection),
    /// The parent's own check of a reported fact failed.
    Refused(Rejection),
    /// The frames broke their shape or bounds.
    Broken(String),
    /// The output stopped before its end frame: the child closed it or died.
    Cut(String),
}

fn parser_rejection(why: impl Into<String>) -> Rejection {
    Rejection {
        code: "intake.parser",
        path: None,
        message: why.into(),
    }
}

/// The code of a rejection the child reported, as one of the reader's own codes: a code the
/// reader never uses is a broken frame.
fn known_code(code: &str) -> Option<&'static str> {
    archive::CODES.iter().copied().find(|c| *c == code)
}

/// Read and check the child's frames, staging each file in `scratch`.
fn read_facts(
    frames: &mut FrameReader<impl Read>,
    limits: &ArchiveLimits,
    scratch: &mut crate::store::Scratch,
) -> Result<Facts, IntakeError> {
    struct Open {
        fact: FileFact,
        path: String,
        file: std::fs::File,
        hasher: Sha256,
        written: u64,
    }
    let mut admission = Admission::new(limits);
    let mut files = Vec::new();
    let mut staged = Vec::new();
    let mut open: Option<Open> = None;
    let close = |o: Open, files: &mut Vec<Member>| -> Result<(), String> {
        if o.written != o.fact.size {
            return Err(format!(
                "{:?}: {} bytes reported, {} sent",
                o.path, o.fact.size, o.written
            ));
        }
        files.push(Member {
            path: o.path,
            executable: o.fact.executable,
            size: o.written,
            sha256: Digest::from_hasher(o.hasher),
        });
        Ok(())
    };
    loop {
        let frame = match frames.frame() {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(Facts::Cut("the output ends without an end frame".into())),
            Err(FrameError::Truncated) => {
                return Ok(Facts::Cut("the output stops inside a frame".into()));
            }
            Err(FrameError::Broken(why)) => return Ok(Facts::Broken(why)),
            Err(FrameError::Pipe(source)) => return Err(IntakeError::Child(source.to_string())),
        };
        if frame.0 != b'B'
            && let Some(o) = open.take()
            && let Err(why) = close(o, &mut files)
        {
            return Ok(Facts::Broken(why));
        }
        match frame {
            (b'F', payload) => {
                let Ok(fact) = serde_json::from_slice::<FileFact>(&payload) else {
                    return Ok(Facts::Broken("a file frame does not decode".into()));
                };
                let path = match admission.member(fact.path.as_bytes(), false, fact.size) {
                    Ok(p) => p,
                    Err(r) => return Ok(Facts::Refused(r)),
                };
                let (at, file) = scratch.create_file()?;
                staged.push(at);
                open = Some(Open {
                    fact,
                    path,
                    file,
                    hasher: Sha256::new(),
                    written: 0,
                });
            }
            (b'B', bytes) => {
                let Some(o) = open.as_mut() else {
                    return Ok(Facts::Broken("bytes outside a file".into()));
                };
                o.written += bytes.len() as u64;
                if o.written > o.fact.size {
                    return Ok(Facts::Broken(format!(
                        "{:?}: more bytes than reported",
                        o.path
                    )));
                }
                o.hasher.update(&bytes);
                o.file.write_all(&bytes).map_err(|source| StoreError::Io {
                    op: "stage member",
                    path: scratch.path().to_path_buf(),
                    source,
                })?;
            }
            (b'D', payload) => {
                let Ok(fact) = serde_json::from_slice::<DirFact>(&payload) else {
                    return Ok(Facts::Broken("a directory frame does not decode".into()));
                };
                if let Err(r) = admission.member(fact.path.as_bytes(), true, 0) {
                    return Ok(Facts::Refused(r));
                }
            }
            (b'R', payload) => {
                let fact = serde_json::from_slice::<RejectFact>(&payload).ok();
                return Ok(match fact.and_then(|f| Some((known_code(&f.code)?, f))) {
                    Some((code, f)) => Facts::Rejected(Rejection {
                        code,
                        path: f
                            .path
                            .as_deref()
                            .map(|p| crate::text::printable(p).into_owned()),
                        message: crate::text::printable(&f.message).into_owned(),
                    }),
                    None => Facts::Broken("a rejection frame does not decode".into()),
                });
            }
            (b'E', payload) if payload.is_empty() => {
                return Ok(match frames.frame() {
                    Ok(None) => Facts::Complete(files, staged),
                    _ => Facts::Broken("output follows the end frame".into()),
                });
            }
            (tag, _) => return Ok(Facts::Broken(format!("unknown frame tag {tag}"))),
        }
    }
}

/// The bound on the child's whole output: the files' bytes, their frames, one header per
/// member.
fn output_bound(limits: &ArchiveLimits) -> u64 {
    let per_member = limits.max_path_length.saturating_add(256);
    limits
        .max_extracted_bytes
        .saturating_add(limits.max_extracted_bytes / CHUNK as u64 * 5 + 5)
        .saturating_add(
            limits
                .max_members
                .saturating_add(2)
                .saturating_mul(per_member + 5),
        )
}

/// Admit an archive as [`super::ingest`] does, with every candidate byte decoded by a confined
/// child started as `launch` says. `stop_source` is called once the child has decided without
/// needing the rest of the source (a rejection): it ends a source still arriving.
///
/// # Errors
/// [`IntakeError::Rejected`] for the candidate's faults, the child's crashes and limits
/// included (the store is unchanged); [`IntakeError::Child`] when the child could not be
/// started, could not confine itself or was killed from outside; the other variants for the
/// store and the source.
pub fn ingest_confined(
    store: &Store,
    source: impl Read + Send,
    committed: &Digest,
    limits: &ArchiveLimits,
    launch: &Launch,
    stop_source: &(dyn Fn() + Sync),
) -> Result<Admitted, IntakeError> {
    let mut scratch = store.scratch()?;
    let (child, stdin, stdout) = Supervised::start(launch)
        .map_err(|e| IntakeError::Child(format!("cannot start {}: {e}", launch.exe.display())))?;
    let (pumped, outcome) = std::thread::scope(|scope| {
        let pumper = scope.spawn(|| pump(source, stdin, limits));
        let mut frames = FrameReader::new(stdout, (CHUNK + 4096) as u32, output_bound(limits));
        let outcome = match confine::confirmed(&mut frames) {
            Ok(true) => {
                let facts = read_facts(&mut frames, limits, &mut scratch);
                drop(frames);
                // A child whose output the parent refused is ended by the parent; one whose
                // output ended is waited for, bounded by the deadline, so a death from outside
                // shows as such.
                let refused = !matches!(facts, Ok(Facts::Complete(..) | Facts::Cut(_)));
                Ok((facts, child.finish(refused, true)))
            }
            Ok(false) => {
                drop(frames);
                Err(child.unconfined())
            }
            Err(e) => {
                drop(frames);
                Err(format!(
                    "cannot read the child's output: {e}; {}",
                    child.unconfined()
                ))
            }
        };
        // Anything but a complete decoding is decided without the rest of the source: a
        // source still arriving (a transfer) is ended, so the pump is not left waiting on it.
        if !matches!(&outcome, Ok((Ok(Facts::Complete(..)), _))) {
            stop_source();
        }
        (pumper.join(), outcome)
    });
    let pumped = pumped.map_err(|_| IntakeError::Child("the pump thread panicked".into()))?;
    let (facts, finished) = outcome.map_err(IntakeError::Child)?;
    let finished =
        finished.map_err(|e| IntakeError::Child(format!("cannot wait for the child: {e}")))?;
    if let Some(source) = pumped.failed {
        return Err(IntakeError::Source { source });
    }
    if pumped.too_big {
        return Err(IntakeError::Rejected(Rejection {
            code: "intake.archive-too-big",
            path: None,
            message: format!("the archive exceeds {} bytes", limits.max_archive_bytes),
        }));
    }
    let facts = facts?;
    // The parent's own checks, and what the child reported before the parent ended it, are
    // the candidate's; otherwise the child's own end decides.
    match (finished.ended(), facts) {
        (Some(Ended::Infrastructure(why)), _) => Err(IntakeError::Child(finished.with_tail(&why))),
        (_, Facts::Refused(r)) => Err(IntakeError::Rejected(r)),
        (None | Some(Ended::Rejected), Facts::Rejected(r)) => Err(IntakeError::Rejected(r)),
        // An end frame before the whole source was read is not a decoding of the source.
        (Some(Ended::Done), Facts::Complete(..)) if !pumped.complete => Err(IntakeError::Rejected(
            parser_rejection("the parser ended before reading its whole input"),
        )),
        (Some(Ended::Done), Facts::Complete(files, staged)) => {
            check_committed(&pumped.sha256, committed)?;
            publish(store, files, staged, pumped.sha256)
        }
        (Some(Ended::Broke(why)), _) => Err(IntakeError::Rejected(parser_rejection(
            finished.with_tail(&why),
        ))),
        (_, Facts::Broken(why) | Facts::Cut(why)) => {
            Err(IntakeError::Rejected(parser_rejection(why)))
        }
        (ended, _) => Err(IntakeError::Rejected(parser_rejection(format!(
            "its exit ({ended:?}) contradicts its output"
        )))),
    }
}
