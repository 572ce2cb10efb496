//! The lane's wire: length-prefixed frames between the host, `cordon-worker` and the engine,
//! and the typed messages they carry.
//!
//! What this crate owns: the byte format (a 4-byte protocol magic, a 1-byte kind, a 4-byte
//! big-endian payload length, the payload), its bounds (the policy's `frame max-bytes
//! max-frames`), and the messages' shapes. What it does not own: clocks, ordering, deadlines
//! and verdicts — those are the host's (`cordon-lane`, `cordon-reference`), which stamps every
//! frame on its own monotonic clock; nothing in a frame is a time the host believes.
//!
//! Every byte that arrives is hostile input: [`Decoder`] is pure (no I/O, no clock), never
//! buffers more than one header plus `max-bytes`, refuses a length larger than the bound
//! before reading its payload, counts frames against `max-frames`, and reports a truncated
//! frame at the end of the stream. It is fuzzed in `tests/fuzz.rs`.
//!
//! A [`Protocol`] is a magic and its own kind numbers: the lane's is [`LANE`], the pristine
//! reference session's is [`REFERENCE`]. The kinds mean the same in both, but neither their
//! magic nor any of their kind bytes is shared, so a frame of one is refused by the other's
//! decoder — a lane stream can never be taken for the reference's evidence, nor the reverse.
//! Inside the container the engine always speaks the lane's protocol to cordon's worker; the
//! worker speaks the session's protocol to the host.

use serde::{Deserialize, Serialize};

pub mod message;

/// A protocol's 4-byte magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Magic(pub [u8; 4]);

/// A protocol on the wire: its magic and the byte of its first kind (the others follow in
/// [`Kind`]'s order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    /// Its name, for people.
    pub name: &'static str,
    /// Its magic.
    pub magic: Magic,
    first: u8,
}

/// The lane protocol: kinds 1 to 7.
pub const LANE: Protocol = Protocol {
    name: "lane",
    magic: Magic(*b"CDL1"),
    first: 1,
};

/// The pristine reference session's protocol: kinds 0x41 to 0x47.
pub const REFERENCE: Protocol = Protocol {
    name: "reference",
    magic: Magic(*b"CDT1"),
    first: 0x41,
};

impl Protocol {
    /// The wire byte of `kind` in this protocol.
    #[must_use]
    pub const fn byte(self, kind: Kind) -> u8 {
        self.first + (kind as u8 - 1)
    }

    /// The kind of wire byte `b` in this protocol (`None`: not one of its kinds).
    #[must_use]
    pub const fn kind(self, b: u8) -> Option<Kind> {
        match b.checked_sub(self.first) {
            Some(i) => Kind::from_index(i),
            None => None,
        }
    }
}

/// Bytes of a frame header: magic, kind, payload length.
pub const HEADER: usize = 9;

/// What a frame is. The numbers are the order of the kinds (the lane's wire bytes); each
/// protocol has its own bytes ([`Protocol::byte`]), and an unknown one is a protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Worker → host: what the worker established from inside, before the engine exists.
    Posture = 1,
    /// Host → worker: the posture is accepted; start the registered engine command.
    Start = 2,
    /// Engine → host: initialised, ready for its first request.
    Ready = 3,
    /// Host → engine: one request of the host's workload.
    Request = 4,
    /// Engine → host: the answer to the one outstanding request.
    Response = 5,
    /// Worker → host: the engine ended (its exit status), or the worker saw the engine break
    /// the wire.
    Ended = 6,
    /// Worker → host: the worker itself could not do its job (a no-decision, never the
    /// candidate's).
    Fault = 7,
}

impl Kind {
    /// The kind at position `i` (0-based) of the protocol's kinds.
    #[must_use]
    pub const fn from_index(i: u8) -> Option<Self> {
        Some(match i {
            0 => Self::Posture,
            1 => Self::Start,
            2 => Self::Ready,
            3 => Self::Request,
            4 => Self::Response,
            5 => Self::Ended,
            6 => Self::Fault,
            _ => return None,
        })
    }

    /// Whether the engine may send this kind (everything else on its stream is forged).
    #[must_use]
    pub const fn from_engine(self) -> bool {
        matches!(self, Self::Ready | Self::Response)
    }
}

/// The bounds of one stream: the policy's `frame max-bytes max-frames`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest payload, in bytes.
    pub max_bytes: u32,
    /// The most frames one stream may carry.
    pub max_frames: u64,
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it is.
    pub kind: Kind,
    /// Its payload (at most `max_bytes`).
    pub payload: Vec<u8>,
}

/// Why a stream is not a well-formed frame sequence. Each is a protocol violation of whoever
/// wrote the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header does not start with the protocol's magic (another protocol, or garbage).
    #[error("frame {index} does not start with the protocol's magic (found {found:02x?})")]
    Magic {
        /// The frame's index in the stream.
        index: u64,
        /// The bytes found.
        found: [u8; 4],
    },
    /// The kind byte is not one the protocol knows.
    #[error("frame {index} has unknown kind {kind}")]
    UnknownKind {
        /// The frame's index.
        index: u64,
        /// The byte.
        kind: u8,
    },
    /// The payload length is over the bound (refused before any of it is read).
    #[error("frame {index} announces {length} payload bytes, over the bound of {max}")]
    Oversized {
        /// The frame's index.
        index: u64,
        /// The announced length.
        length: u32,
        /// The bound.
        max: u32,
    },
    /// More frames than the bound.
    #[error("the stream carries more than {max} frames")]
    TooMany {
        /// The bound.
        max: u64,
    },
    /// The stream ended inside a frame.
    #[error("the stream ended inside frame {index} ({pending} bytes of it arrived)")]
    Truncated {
        /// The frame's index.
        index: u64,
        /// Bytes of it that arrived.
        pending: usize,
    },
}

/// Encode one frame.
///
/// # Errors
/// The payload is over `limits.max_bytes` (the sender's own bound: it never sends what the
/// receiver must refuse).
pub fn encode(
    protocol: Protocol,
    kind: Kind,
    payload: &[u8],
    limits: Limits,
) -> Result<Vec<u8>, FrameError> {
    let length = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    if length > limits.max_bytes {
        return Err(FrameError::Oversized {
            index: 0,
            length,
            max: limits.max_bytes,
        });
    }
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&protocol.magic.0);
    out.push(protocol.byte(kind));
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// An incremental decoder of one stream: push bytes as they arrive, take frames as they
/// complete. After the first error the stream is dead: every later call repeats it.
#[derive(Debug)]
pub struct Decoder {
    protocol: Protocol,
    limits: Limits,
    buf: Vec<u8>,
    decoded: u64,
    failed: Option<FrameError>,
}

impl Decoder {
    /// A decoder of one stream of `protocol` under `limits`.
    #[must_use]
    pub const fn new(protocol: Protocol, limits: Limits) -> Self {
        Self {
            protocol,
            limits,
            buf: Vec::new(),
            decoded: 0,
            failed: None,
        }
    }

    /// Frames decoded so far.
    #[must_use]
    pub const fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Bytes of an incomplete frame held now.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Feed bytes and take every frame they complete, in order.
    ///
    /// # Errors
    /// The first violation in the stream (and every call after it).
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let mut out = Vec::new();
        loop {
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
            // Take only what the current frame needs, so the buffer never holds more than one
            // header plus one bounded payload, whatever the peer sends at once.
            let need = self.needed();
            let take = need.saturating_sub(self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() == HEADER {
                if let Err(e) = self.check_header() {
                    self.failed = Some(e.clone());
                    return Err(e);
                }
            }
            if self.buf.len() >= HEADER && self.buf.len() == self.needed() {
                let kind = self
                    .protocol
                    .kind(self.buf[4])
                    .ok_or(FrameError::UnknownKind {
                        index: self.decoded,
                        kind: self.buf[4],
                    })?;
                let payload = self.buf.split_off(HEADER);
                self.buf.clear();
                self.decoded += 1;
                out.push(Frame { kind, payload });
            }
            if bytes.is_empty() {
                return Ok(out);
            }
        }
    }

    /// The stream has ended: an incomplete frame is a truncation.
    ///
    /// # Errors
    /// [`FrameError::Truncated`], or the stream's earlier violation.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                index: self.decoded,
                pending: self.buf.len(),
            })
        }
    }

    /// Bytes the frame being read needs in all (a header until the header is complete).
    fn needed(&self) -> usize {
        if self.buf.len() < HEADER {
            HEADER
        } else {
            HEADER + Self::length(&self.buf) as usize
        }
    }

    fn length(header: &[u8]) -> u32 {
        u32::from_be_bytes([header[5], header[6], header[7], header[8]])
    }

    fn check_header(&self) -> Result<(), FrameError> {
        let index = self.decoded;
        let found = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
        if found != self.protocol.magic.0 {
            return Err(FrameError::Magic { index, found });
        }
        if index >= self.limits.max_frames {
            return Err(FrameError::TooMany {
                max: self.limits.max_frames,
            });
        }
        if self.protocol.kind(self.buf[4]).is_none() {
            return Err(FrameError::UnknownKind {
                index,
                kind: self.buf[4],
            });
        }
        let length = Self::length(&self.buf);
        if length > self.limits.max_bytes {
            return Err(FrameError::Oversized {
                index,
                length,
                max: self.limits.max_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// The engine's stream admits `ready` and `response` and nothing else: every other kind is
    /// the worker's or the host's, and one relayed from the engine would be a forged report.
    #[test]
    fn only_ready_and_response_come_from_the_engine() {
        let from_engine: Vec<super::Kind> = (0..=u8::MAX)
            .filter_map(super::Kind::from_index)
            .filter(|k| k.from_engine())
            .collect();
        assert_eq!(from_engine, [super::Kind::Ready, super::Kind::Response]);
    }

    use super::*;

    const L: Limits = Limits {
        max_bytes: 16,
        max_frames: 3,
    };

    #[test]
    fn frames_split_anywhere_decode_the_same() {
        let mut wire = encode(LANE, Kind::Ready, b"", L).unwrap();
        wire.extend(encode(LANE, Kind::Response, b"0123456789abcdef", L).unwrap());
        for cut in 0..wire.len() {
            let mut d = Decoder::new(LANE, L);
            let mut frames = d.push(&wire[..cut]).unwrap();
            frames.extend(d.push(&wire[cut..]).unwrap());
            assert_eq!(frames.len(), 2, "cut at {cut}");
            assert_eq!(frames[1].payload, b"0123456789abcdef");
            d.finish().unwrap();
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_payload() {
        let mut header = LANE.magic.0.to_vec();
        header.push(LANE.byte(Kind::Response));
        header.extend(17u32.to_be_bytes());
        let mut d = Decoder::new(LANE, L);
        assert_eq!(
            d.push(&header),
            Err(FrameError::Oversized {
                index: 0,
                length: 17,
                max: 16
            })
        );
        assert!(d.push(b"x").is_err(), "a dead stream stays dead");
        let e = encode(LANE, Kind::Response, &[0; 17], L)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("announces 17 payload bytes, over the bound of 16"),
            "{e}"
        );
    }

    #[test]
    fn another_protocols_magic_unknown_kinds_and_too_many_frames_are_refused() {
        let other = Protocol {
            name: "other",
            magic: Magic(*b"CDX1"),
            first: 1,
        };
        let mut d = Decoder::new(LANE, L);
        let wire = encode(other, Kind::Ready, b"", L).unwrap();
        assert!(matches!(d.push(&wire), Err(FrameError::Magic { .. })));

        let mut wire = encode(LANE, Kind::Ready, b"", L).unwrap();
        wire[4] = 99;
        let mut d = Decoder::new(LANE, L);
        assert_eq!(
            d.push(&wire),
            Err(FrameError::UnknownKind { index: 0, kind: 99 })
        );

        let one = encode(LANE, Kind::Ready, b"", L).unwrap();
        let mut d = Decoder::new(LANE, L);
        for _ in 0..3 {
            assert_eq!(d.push(&one).unwrap().len(), 1);
        }
        assert_eq!(d.push(&one), Err(FrameError::TooMany { max: 3 }));
    }

    #[test]
    fn a_lane_frame_is_refused_by_the_reference_and_a_reference_frame_by_the_lane() {
        let kinds = [
            Kind::Posture,
            Kind::Start,
            Kind::Ready,
            Kind::Request,
            Kind::Response,
            Kind::Ended,
            Kind::Fault,
        ];
        for (from, to) in [(LANE, REFERENCE), (REFERENCE, LANE)] {
            for kind in kinds {
                assert_eq!(from.kind(from.byte(kind)), Some(kind), "{}", from.name);
                // Neither the magic nor the kind byte of one protocol is the other's.
                assert_eq!(to.kind(from.byte(kind)), None, "{kind:?} of {}", from.name);
                let wire = encode(from, kind, b"", L).unwrap();
                let mut d = Decoder::new(to, L);
                assert!(matches!(d.push(&wire), Err(FrameError::Magic { .. })));
                // The other's magic with this kind byte: still refused, by its kind.
                let mut forged = wire.clone();
                forged[..4].copy_from_slice(&to.magic.0);
                let mut d = Decoder::new(to, L);
                assert!(matches!(
                    d.push(&forged),
                    Err(FrameError::UnknownKind { .. })
                ));
            }
        }
    }

    #[test]
    fn a_stream_ending_inside_a_frame_is_truncated() {
        let wire = encode(LANE, Kind::Response, b"abc", L).unwrap();
        let mut d = Decoder::new(LANE, L);
        assert!(d.push(&wire[..wire.len() - 1]).unwrap().is_empty());
        assert_eq!(
            d.finish(),
            Err(FrameError::Truncated {
                index: 0,
                pending: HEADER + 2
            })
        );
    }
}
