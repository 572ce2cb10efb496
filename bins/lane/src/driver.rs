//! The host's side of one framed session: posture → start → ready → one request at a time →
//! exactly one response per request → end. The host owns every clock: each chunk the container
//! writes is stamped on the host's monotonic clock by the thread that read it, each request is
//! stamped just before it is handed to the pipe, and the phases' absolute deadlines come from
//! the policy. Nothing the container says is a time the host believes.
//!
//! What this module owns: the order of the session, the deadlines, the checks on every frame
//! and the classification of what went wrong. What it does not own: the container (the
//! caller kills it when a session ends early) and the posture's expectations (the caller's).
//!
//! Classification: a violation the candidate's engine caused — output before `ready`, a
//! response before its request, a duplicate or unsolicited frame, a wrong index or token count,
//! a malformed message, a missed phase deadline, an exit before the workload ends — is a
//! rejection with its own code. What cordon cannot establish — a worker that faults, a posture
//! that differs from the plan, a broken stream from the worker itself — is a no-decision.
//!
//! Writes never block the session: a writer thread owns the pipe, so an engine that stops
//! reading meets the deadline, not a hung host.

use std::io::{Read, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel, sync_channel};
use std::time::{Duration, Instant};

use cordon::canonical::Digest;
use cordon_frame::message::{self, Ended, Fault, PROTOCOL, Posture, Request, Response};
use cordon_frame::{Decoder, Frame, Kind, Limits, Protocol, encode};

use cordon::receipt::LaneWindow as Window;

use crate::workload::Workload;

/// What the host read from the container.
#[derive(Debug)]
pub enum Stamped {
    /// Bytes, stamped when the read returned, on the host's clock.
    Bytes {
        /// When.
        at: Instant,
        /// What.
        bytes: Vec<u8>,
    },
    /// The stream ended (or could not be read).
    End,
    /// The stream passed the stage's stdout cap; the host stopped reading it.
    Overflow {
        /// The cap, in bytes.
        cap: u64,
    },
}

/// The most recent bytes of the container's framed stream, as the host read them: the evidence
/// a session that did not serve leaves (`frames`), bounded to the last
/// [`cordon::lease::EVIDENCE_MAX`] bytes.
#[derive(Debug, Default)]
pub struct Recent {
    bytes: Vec<u8>,
}

impl Recent {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        // Amortised: trim once it holds twice the bound.
        if self.bytes.len() > 2 * cordon::lease::EVIDENCE_MAX {
            let cut = self.bytes.len() - cordon::lease::EVIDENCE_MAX;
            self.bytes.drain(..cut);
        }
    }

    /// The last [`cordon::lease::EVIDENCE_MAX`] bytes read.
    #[must_use]
    pub fn last(&self) -> &[u8] {
        let from = self.bytes.len().saturating_sub(cordon::lease::EVIDENCE_MAX);
        &self.bytes[from..]
    }
}

/// Chunks in flight between the reader and the session: the reader waits when the session is
/// behind, so a flooding container meets back-pressure, not the host's memory.
const IN_FLIGHT: usize = 16;

/// Read `out` on a thread of its own, stamping each chunk as it arrives, up to `cap` bytes (the
/// stage's `output stdout=`).
pub fn reader(mut out: impl Read + Send + 'static, cap: u64) -> Receiver<Stamped> {
    let (tx, rx) = sync_channel(IN_FLIGHT);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        loop {
            let n = match out.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            let at = Instant::now();
            total += n as u64;
            let chunk = if n == 0 {
                Stamped::End
            } else if total > cap {
                Stamped::Overflow { cap }
            } else {
                Stamped::Bytes {
                    at,
                    bytes: buf[..n].to_vec(),
                }
            };
            let last = !matches!(chunk, Stamped::Bytes { .. });
            if tx.send(chunk).is_err() || last {
                return;
            }
        }
    });
    rx
}

/// Write frames to `input` on a thread of its own; dropping the sender closes the stream.
pub fn writer(mut input: impl Write + Send + 'static) -> Sender<Vec<u8>> {
    let (tx, rx) = channel::<Vec<u8>>();
    std::thread::spawn(move || {
        for bytes in rx {
            if input
                .write_all(&bytes)
                .and_then(|()| input.flush())
                .is_err()
            {
                return;
            }
        }
    });
    tx
}

/// What the host asks of one session.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// The protocol the worker speaks (the lane's, or the reference session's): a frame of
    /// any other is a broken stream.
    pub protocol: Protocol,
    /// The workload.
    pub workload: &'a Workload,
    /// The policy's frame bounds.
    pub limits: Limits,
    /// The startup phase's length, from when the container started.
    pub startup: Duration,
    /// The workload phase's length, from `ready`.
    pub workload_phase: Duration,
    /// The stage's absolute deadline: no phase runs past it.
    pub absolute: Instant,
    /// The engine step's scheduler ranks: the member coverage its processes must report
    /// exactly ([`message::coverage`]).
    pub ranks: u32,
}

/// A session the engine served to the end.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// The posture frame.
    pub posture: Posture,
    /// The digest of the posture frame's payload, as received.
    pub posture_digest: Digest,
    /// When `ready` arrived, ns since the session began.
    pub ready_ns: u64,
    /// Every request, in order.
    pub windows: Vec<Window>,
    /// Every response's output tokens, in request order.
    pub outputs: Vec<Vec<u32>>,
    /// How the engine ended.
    pub ended: Ended,
}

/// How a session ended.
#[derive(Debug)]
pub enum Verdict {
    /// The engine served the whole workload and exited cleanly.
    Served(Box<Transcript>),
    /// The candidate's engine broke the session: a rejection.
    Violation {
        /// The reason code.
        code: &'static str,
        /// For people.
        message: String,
    },
    /// Cordon could not establish the session: a no-decision.
    NoDecision(String),
    /// The container does not hold the controls the plan gave it (the worker's posture, read
    /// before any candidate code runs): a no-decision, and a containment incident on the
    /// executor that ran it.
    Containment(String),
}

fn violation(code: &'static str, message: impl Into<String>) -> Verdict {
    Verdict::Violation {
        code,
        message: message.into(),
    }
}

enum Next {
    Frame(Instant, Frame),
    End,
    Late,
    Broken(String),
}

/// The container's stream, decoded as it arrives.
struct Stream<'a> {
    rx: &'a Receiver<Stamped>,
    decoder: Decoder,
    recent: &'a mut Recent,
    queue: std::collections::VecDeque<(Instant, Frame)>,
    ended: bool,
    /// The stdout cap, once the stream passed it.
    overflow: Option<u64>,
}

impl Stream<'_> {
    fn next(&mut self, deadline: Instant) -> Next {
        loop {
            if let Some((at, f)) = self.queue.pop_front() {
                // A frame the host read after the deadline is late, however soon it is looked at.
                if at > deadline {
                    return Next::Late;
                }
                return Next::Frame(at, f);
            }
            if self.ended {
                return Next::End;
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(Stamped::End) | Err(RecvTimeoutError::Disconnected) => {
                    self.ended = true;
                    if let Err(e) = self.decoder.finish() {
                        return Next::Broken(e.to_string());
                    }
                }
                Ok(Stamped::Overflow { cap }) => {
                    self.ended = true;
                    self.overflow = Some(cap);
                    return Next::Broken(format!("the output passed its cap of {cap} bytes"));
                }
                Ok(Stamped::Bytes { at, bytes }) => {
                    self.recent.push(&bytes);
                    match self.decoder.push(&bytes) {
                        Ok(frames) => self.queue.extend(frames.into_iter().map(|f| (at, f))),
                        Err(e) => return Next::Broken(e.to_string()),
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Next::Late,
            }
        }
    }
}

fn ns(origin: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX)
}

/// Run one session over the container's stream `rx` and its input `tx`, from `origin` (when
/// the container started). `expect` lists how a posture differs from the plan (empty: as
/// planned). `during_warmup` runs once, right after the last warmup request is handed over
/// (the first request when there is no warmup), while the engine works on it: the active
/// device receipt's moment. The caller kills the container when the verdict is not `Served`.
pub fn drive(
    rx: &Receiver<Stamped>,
    tx: Sender<Vec<u8>>,
    origin: Instant,
    plan: &Plan<'_>,
    expect: &dyn Fn(&Posture) -> Vec<String>,
    during_warmup: &mut dyn FnMut(),
    recent: &mut Recent,
) -> Verdict {
    let mut s = Stream {
        rx,
        decoder: Decoder::new(plan.protocol, plan.limits),
        recent,
        queue: std::collections::VecDeque::new(),
        ended: false,
        overflow: None,
    };
    let mut started = false;
    let verdict = session(
        &mut s,
        tx,
        origin,
        plan,
        expect,
        during_warmup,
        &mut started,
    );
    match s.overflow {
        // Only the engine's frames are large: once it runs, a flood is its own.
        Some(cap) if started => violation(
            "lane.output",
            format!("the engine's framed output passed the stage's stdout cap of {cap} bytes"),
        ),
        Some(cap) => Verdict::NoDecision(format!(
            "the worker's output passed the stdout cap of {cap} bytes before the engine started"
        )),
        None => verdict,
    }
}

/// The worker's posture, its first frame before the startup deadline: anything wrong before
/// it is the worker's, not the candidate's (nothing of the candidate runs yet).
fn posture(s: &mut Stream<'_>, startup: Instant) -> Result<(Posture, Digest), Verdict> {
    Ok(match s.next(startup) {
        Next::Frame(_, f) if f.kind == Kind::Posture => {
            match message::from_payload::<Posture>(&f.payload) {
                Ok(p) => (p, Digest::of_bytes(&f.payload)),
                Err(e) => return Err(Verdict::NoDecision(format!("the posture frame: {e}"))),
            }
        }
        Next::Frame(_, f) if f.kind == Kind::Fault => return Err(fault(&f)),
        Next::Frame(_, f) => {
            return Err(Verdict::NoDecision(format!(
                "the worker sent {:?} before its posture",
                f.kind
            )));
        }
        Next::End => {
            return Err(Verdict::NoDecision(
                "the worker ended before its posture".into(),
            ));
        }
        Next::Late => {
            return Err(Verdict::NoDecision(
                "no posture before the startup deadline".into(),
            ));
        }
        Next::Broken(e) => {
            return Err(Verdict::NoDecision(format!("the worker's stream: {e}")));
        }
    })
}

/// Startup: the engine's first frame must be `ready`, in this protocol, before the startup
/// deadline. When it came (ns after `origin`).
fn ready(
    s: &mut Stream<'_>,
    origin: Instant,
    startup: Instant,
    plan: &Plan<'_>,
) -> Result<u64, Verdict> {
    Ok(match s.next(startup) {
        Next::Frame(at, f) if f.kind == Kind::Ready => match message::ready_protocol(&f.payload) {
            Ok(PROTOCOL) => ns(origin, at),
            Ok(v) => {
                return Err(violation(
                    "lane.protocol",
                    format!("the engine speaks protocol {v}, not {PROTOCOL}"),
                ));
            }
            Err(e) => return Err(violation("lane.protocol", e.to_string())),
        },
        Next::Frame(at, f) => return Err(after_start(&f, "before it was ready", ns(origin, at))),
        Next::End | Next::Broken(_) => {
            return Err(Verdict::NoDecision(
                "the worker's stream ended without a report".into(),
            ));
        }
        Next::Late if startup == plan.absolute => return Err(absolute_deadline()),
        Next::Late => {
            return Err(violation(
                "lane.startup-deadline",
                format!(
                    "the engine was not ready within the startup phase ({:?})",
                    plan.startup
                ),
            ));
        }
    })
}

/// After the last response (the stream closed): the worker's report that the engine ended
/// cleanly, then the end of the stream, all before `deadline` (`late` says what passing it
/// is). The report.
fn ended_cleanly(
    s: &mut Stream<'_>,
    (origin, deadline): (Instant, Instant),
    ranks: u32,
    late: &dyn Fn() -> Verdict,
) -> Result<Ended, Verdict> {
    let stream_ended = || Verdict::NoDecision("the worker's stream ended without a report".into());
    let ended = match s.next(deadline) {
        Next::Frame(_, f) if f.kind == Kind::Ended => message::from_payload::<Ended>(&f.payload)
            .map_err(|e| Verdict::NoDecision(format!("the worker's report: {e}")))?,
        Next::Frame(at, f) => {
            return Err(after_start(&f, "after the last response", ns(origin, at)));
        }
        Next::End | Next::Broken(_) => return Err(stream_ended()),
        Next::Late => return Err(late()),
    };
    if let Some(v) = &ended.violation {
        return Err(violation(
            "lane.protocol",
            format!("the engine broke the wire: {v}"),
        ));
    }
    // The registered process must serve the whole workload: one that ended while it was open
    // left the answers to a process of its own (a fork), which is not the registered engine.
    if ended.early {
        return Err(violation(
            "lane.exit",
            format!(
                "the engine {} before the workload ended; what answered after it was another process",
                how(&ended)
            ),
        ));
    }
    if ended.code != Some(0) {
        return Err(violation(
            "lane.exit",
            format!("the engine {} after the workload", how(&ended)),
        ));
    }
    // Exactly the step's scheduler ranks loaded candidate code, each in its own process, and
    // no process of another role did (seed 001's scheduler-only load gate).
    if let Some(why) = message::coverage(&ended.members, ended.member_fault.as_deref(), ranks) {
        return Err(violation("lane.members", why));
    }
    match s.next(deadline) {
        Next::End => {}
        Next::Frame(_, f) => {
            return Err(Verdict::NoDecision(format!(
                "the worker sent {:?} after its report",
                f.kind
            )));
        }
        Next::Late => return Err(late()),
        Next::Broken(e) => return Err(Verdict::NoDecision(format!("the worker's stream: {e}"))),
    }
    Ok(ended)
}

fn session(
    s: &mut Stream<'_>,
    tx: Sender<Vec<u8>>,
    origin: Instant,
    plan: &Plan<'_>,
    expect: &dyn Fn(&Posture) -> Vec<String>,
    during_warmup: &mut dyn FnMut(),
    started: &mut bool,
) -> Verdict {
    let startup = (origin + plan.startup).min(plan.absolute);
    let (posture, posture_digest) = match posture(s, startup) {
        Ok(p) => p,
        Err(v) => return v,
    };
    let differs = expect(&posture);
    if !differs.is_empty() {
        // Nothing of the candidate has started; closing the stream ends the worker.
        return Verdict::Containment(format!(
            "the container's posture is not the planned one: {}",
            differs.join("; ")
        ));
    }
    let send = |kind: Kind, payload: &[u8]| -> Result<(), String> {
        let bytes = encode(plan.protocol, kind, payload, plan.limits).map_err(|e| e.to_string())?;
        tx.send(bytes)
            .map_err(|_| "the host's writer is gone".to_owned())
    };
    if let Err(e) = send(Kind::Start, &[]) {
        return Verdict::NoDecision(e);
    }
    *started = true;
    let ready_ns = match ready(s, origin, startup, plan) {
        Ok(at) => at,
        Err(v) => return v,
    };
    let ready_at = origin + Duration::from_nanos(ready_ns);
    let deadline = (ready_at + plan.workload_phase).min(plan.absolute);
    let late = || {
        if deadline == plan.absolute {
            return absolute_deadline();
        }
        violation(
            "lane.workload-deadline",
            format!(
                "the engine did not finish the workload within its phase ({:?})",
                plan.workload_phase
            ),
        )
    };
    let mut windows = Vec::with_capacity(plan.workload.requests.len());
    let mut outputs = Vec::new();
    for (i, item) in plan.workload.requests.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        let request = Request {
            index,
            tokens: item.tokens,
            prompt: item.prompt.clone(),
        };
        // Stamped before the bytes are handed over: a response stamped earlier cannot be an
        // answer to this request.
        let sent = Instant::now();
        if let Err(e) = send(Kind::Request, &request.encode()) {
            return Verdict::NoDecision(e);
        }
        if i + 1 == (plan.workload.warmup as usize).max(1) {
            during_warmup();
        }
        let (at, f) = match s.next(deadline) {
            Next::Frame(at, f) => (at, f),
            Next::End | Next::Broken(_) => {
                return Verdict::NoDecision("the worker's stream ended without a report".into());
            }
            Next::Late => return late(),
        };
        if f.kind != Kind::Response {
            return after_start(
                &f,
                &format!("while request {index} was outstanding"),
                ns(origin, at),
            );
        }
        if at < sent {
            return violation(
                "lane.protocol",
                format!("a response arrived before request {index} was sent"),
            );
        }
        let r = match Response::decode(&f.payload) {
            Ok(r) => r,
            Err(e) => return violation("lane.protocol", e.to_string()),
        };
        if r.index != index {
            return violation(
                "lane.protocol",
                format!(
                    "a response to request {} arrived while request {index} was outstanding",
                    r.index
                ),
            );
        }
        if r.tokens != item.tokens || r.output.len() != item.tokens as usize {
            return violation(
                "lane.count",
                format!(
                    "request {index} asked for {} tokens; the engine said {} and sent {}",
                    item.tokens,
                    r.tokens,
                    r.output.len()
                ),
            );
        }
        outputs.push(r.output);
        windows.push(Window {
            index,
            phase: plan.workload.phase(i),
            tokens: item.tokens,
            sent_ns: ns(origin, sent),
            received_ns: ns(origin, at),
        });
    }
    // The workload is over: closing the stream tells the engine so; the next frame must be the
    // worker's report that it ended cleanly.
    drop(tx);
    let ended = match ended_cleanly(s, (origin, deadline), plan.ranks, &late) {
        Ok(ended) => ended,
        Err(v) => return v,
    };
    Verdict::Served(Box::new(Transcript {
        posture,
        posture_digest,
        ready_ns,
        windows,
        outputs,
        ended,
    }))
}

fn absolute_deadline() -> Verdict {
    violation(
        "lane.deadline",
        "the session reached the stage's absolute deadline",
    )
}

fn fault(f: &Frame) -> Verdict {
    match message::from_payload::<Fault>(&f.payload) {
        Ok(x) => Verdict::NoDecision(format!("the worker failed: {}", x.what)),
        Err(e) => Verdict::NoDecision(format!("the worker's fault frame: {e}")),
    }
}

/// How the engine ended, for people.
fn how(e: &Ended) -> String {
    match (e.code, e.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => nix::sys::signal::Signal::try_from(s).map_or_else(
            |_| format!("was killed by signal {s}"),
            |x| format!("was killed by {}", x.as_str()),
        ),
        (None, None) => "ended".into(),
    }
}

/// A frame other than the one expected, after `start`: the engine's violation, its end, or the
/// worker's fault.
fn after_start(f: &Frame, when: &str, at_ns: u64) -> Verdict {
    match f.kind {
        Kind::Fault => fault(f),
        Kind::Ended => match message::from_payload::<Ended>(&f.payload) {
            Ok(e) => match &e.violation {
                Some(v) => violation(
                    "lane.protocol",
                    format!("the engine broke the wire {when}: {v}"),
                ),
                None => violation("lane.exit", format!("the engine {} {when}", how(&e))),
            },
            Err(e) => Verdict::NoDecision(format!("the worker's report: {e}")),
        },
        Kind::Ready => violation(
            "lane.protocol",
            format!("a second ready frame {when} (at {at_ns} ns)"),
        ),
        Kind::Response => violation(
            "lane.protocol",
            format!("an unsolicited response {when} (at {at_ns} ns)"),
        ),
        Kind::Posture | Kind::Start | Kind::Request => {
            Verdict::NoDecision(format!("the worker relayed a {:?} frame {when}", f.kind))
        }
    }
}
