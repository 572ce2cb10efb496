//! The stored form of one engine session's output tokens: the object a lane or reference
//! receipt names by digest (`outputs`), so grading replays offline from the store alone.
//!
//! The form is binary and no larger than the frames it came from, so a session's stage output
//! cap (`output stdout=`) bounds it too: the magic `CDO1`, the number of requests, then per
//! request the number of tokens and each token, every number a big-endian `u32`. Its digest is
//! the plain sha256 of these bytes (the store's object name). Integers only: there is no float
//! in it to round differently on another host.
//!
//! Decoding is strict (hostile input: a stored object may have been edited): the magic, every
//! count and the exact length must agree; a count that announces more tokens than the bytes
//! hold is refused before anything is allocated for it.

/// The magic the object starts with.
pub const MAGIC: [u8; 4] = *b"CDO1";

/// Why bytes are not an outputs object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputsError {
    /// It does not start with [`MAGIC`].
    #[error("not an outputs object (it does not start with CDO1)")]
    Magic,
    /// A count or token is cut off, or bytes follow the last request.
    #[error("the outputs object's length does not match its counts (at byte {at})")]
    Length {
        /// Where it went wrong.
        at: usize,
    },
    /// More requests than fit a `u32`.
    #[error("{0} requests do not fit an outputs object")]
    TooMany(usize),
}

/// Encode a session's outputs, one token list per request in plan order.
///
/// # Errors
/// A count does not fit a `u32`.
pub fn encode(outputs: &[Vec<u32>]) -> Result<Vec<u8>, OutputsError> {
    let count = |n: usize| u32::try_from(n).map_err(|_| OutputsError::TooMany(n));
    let tokens: usize = outputs.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(8 + 4 * (outputs.len() + tokens));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&count(outputs.len())?.to_be_bytes());
    for request in outputs {
        out.extend_from_slice(&count(request.len())?.to_be_bytes());
        for t in request {
            out.extend_from_slice(&t.to_be_bytes());
        }
    }
    Ok(out)
}

/// Decode an outputs object.
///
/// # Errors
/// The bytes are not exactly one well-formed object.
pub fn decode(bytes: &[u8]) -> Result<Vec<Vec<u32>>, OutputsError> {
    let rest = bytes.strip_prefix(&MAGIC).ok_or(OutputsError::Magic)?;
    let mut words = rest.chunks(4);
    let mut at = MAGIC.len();
    let mut next = || -> Result<u32, OutputsError> {
        match words.next() {
            Some(&[a, b, c, d]) => {
                at += 4;
                Ok(u32::from_be_bytes([a, b, c, d]))
            }
            _ => Err(OutputsError::Length { at }),
        }
    };
    let requests = next()? as usize;
    // Each request holds at least its count: more requests than words left is refused before
    // any list is allocated for them.
    if requests > rest.len() / 4 {
        return Err(OutputsError::Length { at: MAGIC.len() });
    }
    let mut out = Vec::with_capacity(requests);
    for _ in 0..requests {
        let n = next()? as usize;
        let mut tokens = Vec::with_capacity(n.min(rest.len() / 4));
        for _ in 0..n {
            tokens.push(next()?);
        }
        out.push(tokens);
    }
    if next().is_ok() || !bytes.len().is_multiple_of(4) {
        return Err(OutputsError::Length { at: bytes.len() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_object_round_trips_and_names_every_count() {
        let outputs = vec![vec![7, 8], vec![], vec![u32::MAX]];
        let bytes = encode(&outputs).unwrap();
        assert_eq!(bytes.len(), 8 + 4 * (3 + 3));
        assert_eq!(&bytes[..4], b"CDO1");
        assert_eq!(decode(&bytes).unwrap(), outputs);
        assert_eq!(
            decode(&encode(&[]).unwrap()).unwrap(),
            Vec::<Vec<u32>>::new()
        );
    }

    #[test]
    fn an_edited_object_is_refused() {
        let bytes = encode(&[vec![1, 2, 3]]).unwrap();
        assert_eq!(decode(b"CDL1\0\0\0\0"), Err(OutputsError::Magic));
        assert!(
            decode(&bytes[..bytes.len() - 1]).is_err(),
            "cut inside a token"
        );
        assert!(
            decode(&bytes[..bytes.len() - 4]).is_err(),
            "a token missing"
        );
        let mut longer = bytes.clone();
        longer.extend([0, 0, 0, 9]);
        assert!(decode(&longer).is_err(), "bytes after the last request");
        let mut huge = bytes;
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&huge).is_err(), "a count over what the bytes hold");
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_are_refused_and_objects_round_trip(
            outputs in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..8), 0..8),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let bytes = encode(&outputs).unwrap();
            prop_assert_eq!(decode(&bytes).unwrap(), outputs);
            let mut hostile = MAGIC.to_vec();
            hostile.extend(&noise);
            if let Ok(decoded) = decode(&hostile) {
                prop_assert_eq!(encode(&decoded).unwrap(), hostile);
            }
        }
    }
}
