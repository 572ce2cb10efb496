//! The codec against hostile streams: arbitrary bytes never panic and never make the decoder
//! hold more than one header plus one bounded payload; valid frames split anywhere decode to
//! themselves; a corrupted header is refused, never misread as another frame.

use cordon_frame::message::{Request, Response, member_report};
use cordon_frame::{Decoder, FrameError, HEADER, Kind, LANE, Limits, encode};
use proptest::prelude::*;

const L: Limits = Limits {
    max_bytes: 256,
    max_frames: 64,
};

fn kind() -> impl Strategy<Value = Kind> {
    (0u8..7).prop_map(|i| Kind::from_index(i).unwrap_or(Kind::Ready))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A member report datagram is the engine's bytes: parsed to a plain role and rank or
    /// refused, never a panic, and a refusal never carries the bytes.
    #[test]
    fn arbitrary_member_reports_parse_plainly_or_are_refused_without_their_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        match member_report(&bytes) {
            Ok((role, rank)) => {
                prop_assert!(role.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
                prop_assert!(rank < 10_000);
                prop_assert_eq!(format!("{role} {}", std::str::from_utf8(&bytes[role.len() + 1..]).unwrap()), String::from_utf8(bytes.clone()).unwrap());
            }
            Err(e) => prop_assert_eq!(e, format!("a member report of {} bytes that is not `ROLE RANK`", bytes.len())),
        }
    }

    #[test]
    fn arbitrary_bytes_in_arbitrary_chunks_never_panic_or_overbuffer(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(0usize..2048, 0..16),
    ) {
        let mut d = Decoder::new(LANE, L);
        let mut cuts = cuts;
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        for w in cuts.windows(2) {
            let (a, b) = (w[0].min(bytes.len()), w[1].min(bytes.len()));
            match d.push(&bytes[a..b]) {
                Ok(frames) => {
                    for f in frames {
                        prop_assert!(f.payload.len() <= L.max_bytes as usize);
                    }
                }
                Err(_) => break,
            }
            prop_assert!(d.pending() <= HEADER + L.max_bytes as usize);
        }
        prop_assert!(d.decoded() <= L.max_frames);
    }

    #[test]
    fn valid_frames_split_anywhere_decode_to_themselves(
        frames in proptest::collection::vec((kind(), proptest::collection::vec(any::<u8>(), 0..256)), 0..20),
        chunk in 1usize..64,
    ) {
        let mut wire = Vec::new();
        for (k, p) in &frames {
            wire.extend(encode(LANE, *k, p, L).unwrap());
        }
        let mut d = Decoder::new(LANE, L);
        let mut out = Vec::new();
        for c in wire.chunks(chunk) {
            out.extend(d.push(c).unwrap());
        }
        d.finish().unwrap();
        prop_assert_eq!(out.len(), frames.len());
        for (f, (k, p)) in out.iter().zip(&frames) {
            prop_assert_eq!(f.kind, *k);
            prop_assert_eq!(&f.payload, p);
        }
    }

    #[test]
    fn a_corrupted_header_byte_is_refused_or_read_as_exactly_what_it_says(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        at in 0usize..HEADER,
        xor in 1u8..=255,
    ) {
        let mut wire = encode(LANE, Kind::Response, &payload, L).unwrap();
        wire[at] ^= xor;
        let mut d = Decoder::new(LANE, L);
        match d.push(&wire) {
            Err(FrameError::Magic { .. } | FrameError::UnknownKind { .. } | FrameError::Oversized { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected {e}"),
            // A changed kind byte that is still a kind, or a shorter length: the bytes say so.
            Ok(frames) => {
                prop_assert!(at >= 4);
                if let Some(f) = frames.first() {
                    prop_assert!(f.payload.len() <= payload.len());
                } else {
                    prop_assert!(d.finish().is_err() || wire.len() == HEADER);
                }
            }
        }
    }

    #[test]
    fn arbitrary_payloads_decode_to_a_message_or_an_error_never_a_panic(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let ok = payload.len() >= 8 && payload.len() % 4 == 0;
        prop_assert_eq!(Response::decode(&payload).is_ok(), ok);
        if let Ok(r) = Request::decode(&payload) {
            prop_assert_eq!(r.encode(), payload);
        }
    }

    #[test]
    fn valid_streams_with_flipped_bytes_and_cuts_stay_bounded_and_end_in_a_verdict(
        frames in proptest::collection::vec((kind(), proptest::collection::vec(any::<u8>(), 0..300)), 1..72),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        // Streams that mostly parse: near-valid input walks the decoder's every state, where
        // random bytes die at the first header.
        let mut wire = Vec::new();
        for (k, p) in &frames {
            let p = &p[..p.len().min(L.max_bytes as usize)];
            wire.extend(encode(LANE, *k, p, L).unwrap());
        }
        for (at, x) in &flips {
            let i = at.index(wire.len());
            wire[i] ^= x;
        }
        wire.truncate(cut.index(wire.len() + 1));
        let mut d = Decoder::new(LANE, L);
        let mut seen = 0u64;
        let mut failed = false;
        for chunk in wire.chunks(97) {
            match d.push(chunk) {
                Ok(out) => {
                    for f in out {
                        prop_assert!(f.payload.len() <= L.max_bytes as usize);
                        seen += 1;
                    }
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
            prop_assert!(d.pending() <= HEADER + L.max_bytes as usize);
        }
        prop_assert!(seen <= L.max_frames);
        // Without a violation, the stream either ended on a frame boundary or is truncated.
        if !failed {
            prop_assert_eq!(d.finish().is_ok(), d.pending() == 0);
        }
    }
}
