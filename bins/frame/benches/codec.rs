//! Frame codec throughput: encode and decode a stream of response-sized frames, interleaved
//! with a plain copy of the same bytes as the baseline, and print frames per second, time per
//! frame and the ratio to the copy. Goal (issue 14): at least 200k frames/s, at most 5 µs per
//! frame. Run: `cargo bench -p cordon-frame --bench codec`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cordon_frame::message::Response;
use cordon_frame::{Decoder, Kind, LANE, Limits, encode};

const FRAMES: usize = 100_000;
const L: Limits = Limits {
    max_bytes: 4 << 20,
    max_frames: 1_000_000,
};

fn wire() -> Vec<u8> {
    let mut wire = Vec::new();
    for i in 0..FRAMES {
        let r = Response {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            tokens: 16,
            output: (0..16).collect(),
        };
        wire.extend(encode(LANE, Kind::Response, &r.encode(), L).unwrap_or_default());
    }
    wire
}

fn codec(wire: &[u8], typed: bool) -> Duration {
    let t = Instant::now();
    let mut d = Decoder::new(LANE, L);
    let mut n = 0usize;
    for chunk in wire.chunks(64 * 1024) {
        for f in d.push(chunk).unwrap_or_default() {
            if typed {
                let r = Response::decode(&f.payload).ok();
                n += usize::from(black_box(r).is_some());
            } else {
                n += black_box(f.payload.len()).min(1);
            }
        }
    }
    assert_eq!(n, FRAMES);
    t.elapsed()
}

fn copy(wire: &[u8]) -> Duration {
    let t = Instant::now();
    let mut out = Vec::with_capacity(wire.len());
    for chunk in wire.chunks(64 * 1024) {
        out.extend_from_slice(black_box(chunk));
    }
    black_box(out);
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let wire = wire();
    let (mut frames, mut typed, mut base) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        base.push(copy(&wire));
        frames.push(codec(&wire, false));
        typed.push(codec(&wire, true));
    }
    let (b, f, t) = (median(base), median(frames), median(typed));
    let per = |d: Duration| d.as_secs_f64() / FRAMES as f64;
    println!("frames: {FRAMES} of {} B on the wire", wire.len() / FRAMES);
    println!(
        "decode only:       {:>10.0} frames/s  {:>6.3} µs/frame  {:>6.1}× memcpy",
        1.0 / per(f),
        per(f) * 1e6,
        f.as_secs_f64() / b.as_secs_f64()
    );
    println!(
        "decode + response: {:>10.0} frames/s  {:>6.3} µs/frame  {:>6.1}× memcpy",
        1.0 / per(t),
        per(t) * 1e6,
        t.as_secs_f64() / b.as_secs_f64()
    );
}
