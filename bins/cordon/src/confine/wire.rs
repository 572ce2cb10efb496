//! The framing the supervisor and its confined child speak over their pipes: a tag byte, a
//! little-endian u32 length, the payload; the reader bounds each frame and the whole stream.
//! Blocking and byte-tagged, with a total-bytes bound, where `cordon-frame` (the lane's wire)
//! is push-decoded with a closed kind set and a frame count: the two stay apart until that
//! crate is generic over a protocol's kinds and bounds.

use std::io::{self, Read, Write};

/// Write one frame: tag, length (u32 little-endian), payload.
///
/// # Errors
/// The payload is over 4 GiB or the write failed.
pub fn write_frame(w: &mut dyn Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(io::Error::other)?;
    w.write_all(&[tag])?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(payload)
}

/// Why no frame could be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream breaks its bounds or its shape: the child's fault.
    #[error("the parser child broke its framing: {0}")]
    Broken(String),
    /// The stream stops inside a frame: the child closed its output or died, and how it
    /// ended says which.
    #[error("the parser child's output stops inside a frame")]
    Truncated,
    /// The pipe itself failed: not the child's fault.
    #[error("cannot read the parser child's output")]
    Pipe(#[source] io::Error),
}

/// One frame: its tag and payload.
pub type Frame = (u8, Vec<u8>);

/// Reads frames from a child, each at most `max_frame` bytes and all together at most
/// `max_total`.
pub struct FrameReader<R> {
    inner: R,
    max_frame: u32,
    remaining: u64,
}

impl<R: Read> FrameReader<R> {
    /// A reader over `inner`.
    pub fn new(inner: R, max_frame: u32, max_total: u64) -> Self {
        Self {
            inner,
            max_frame,
            remaining: max_total,
        }
    }

    /// The next frame, or `None` at a clean end of stream (between frames).
    ///
    /// # Errors
    /// [`FrameError::Broken`] for a broken frame, [`FrameError::Pipe`] when the pipe failed.
    pub fn frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let broken = |why: &str| Err(FrameError::Broken(why.to_owned()));
        let mut head = [0u8; 5];
        let mut got = 0;
        while got < head.len() {
            let n = self
                .inner
                .read(&mut head[got..])
                .map_err(FrameError::Pipe)?;
            if n == 0 {
                return if got == 0 {
                    Ok(None)
                } else {
                    Err(FrameError::Truncated)
                };
            }
            got += n;
        }
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if len > self.max_frame {
            return Err(FrameError::Broken(format!(
                "a frame of {len} bytes exceeds {}",
                self.max_frame
            )));
        }
        let cost = u64::from(len) + 5;
        if cost > self.remaining {
            return broken("the stream exceeds its total bound");
        }
        self.remaining -= cost;
        let mut payload = vec![0u8; len as usize];
        let mut filled = 0;
        while filled < payload.len() {
            let n = self
                .inner
                .read(&mut payload[filled..])
                .map_err(FrameError::Pipe)?;
            if n == 0 {
                return Err(FrameError::Truncated);
            }
            filled += n;
        }
        Ok(Some((head[0], payload)))
    }
}
