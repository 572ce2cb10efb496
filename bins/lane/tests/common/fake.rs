//! A scripted worker-and-engine side of a framed session, no container: what the protocol
//! tests and the qualification's fake reads drive the host's real driver against.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use cordon_frame::message::{self, Ended, Member, Posture, Request, Response, ready_payload};
use cordon_frame::{Decoder, Frame, Kind, LANE, Limits, Protocol, encode};
use cordon_lane::driver::{Plan, Stamped, Verdict, drive};
use cordon_lane::workload::Workload;

pub const LIMITS: Limits = Limits {
    max_bytes: 1 << 16,
    max_frames: 64,
};

/// The worker-and-engine side of a session, written as a script.
pub struct Fake {
    /// The protocol this side speaks.
    pub protocol: Protocol,
    pub from_host: Receiver<Vec<u8>>,
    pub decoder: Decoder,
    pub queue: Vec<Frame>,
    pub to_host: Sender<Stamped>,
}

impl Fake {
    pub fn raw(&self, bytes: Vec<u8>) {
        let _ = self.to_host.send(if bytes.is_empty() {
            Stamped::End
        } else {
            Stamped::Bytes {
                at: Instant::now(),
                bytes,
            }
        });
    }

    /// Bytes as the reader would hand them over, stamped `at`.
    pub fn raw_at(&self, bytes: Vec<u8>, at: Instant) {
        let _ = self.to_host.send(Stamped::Bytes { at, bytes });
    }

    pub fn overflow(&self) {
        let _ = self.to_host.send(Stamped::Overflow { cap: 1024 });
    }

    pub fn send(&self, kind: Kind, payload: &[u8]) {
        self.raw(encode(self.protocol, kind, payload, LIMITS).unwrap());
    }

    pub fn posture(&self) {
        self.send(Kind::Posture, &message::to_payload(&posture()).unwrap());
    }

    /// The host's next frame, or `None` when it closed its stream.
    pub fn next(&mut self) -> Option<Frame> {
        loop {
            if !self.queue.is_empty() {
                return Some(self.queue.remove(0));
            }
            let bytes = self.from_host.recv().ok()?;
            self.queue.extend(self.decoder.push(&bytes).unwrap());
        }
    }

    pub fn request(&mut self) -> Request {
        let f = self.next().expect("a request");
        assert_eq!(f.kind, Kind::Request);
        Request::decode(&f.payload).unwrap()
    }

    pub fn answer(&self, r: &Request) {
        self.raw(answer_in(self.protocol, r));
    }

    pub fn ended(&self, code: Option<i32>, violation: Option<&str>) {
        self.ended_as(code, violation, false);
    }

    /// The worker's report, `early` when the engine ended while the workload was open; one
    /// scheduler rank reported (the plan's one).
    pub fn ended_as(&self, code: Option<i32>, violation: Option<&str>, early: bool) {
        let one = Member {
            pid: 2,
            role: message::SCHEDULER.into(),
            rank: 0,
        };
        self.ended_with(code, violation, early, (vec![one], None));
    }

    /// The worker's report with `members` and their fault.
    pub fn ended_with(
        &self,
        code: Option<i32>,
        violation: Option<&str>,
        early: bool,
        (members, member_fault): (Vec<Member>, Option<&str>),
    ) {
        let e = Ended {
            code,
            signal: None,
            violation: violation.map(str::to_owned),
            early,
            members,
            member_fault: member_fault.map(str::to_owned),
        };
        self.send(Kind::Ended, &message::to_payload(&e).unwrap());
    }

    pub fn eof(&self) {
        self.raw(Vec::new());
    }

    /// Posture, then wait for start, then ready.
    pub fn start(&mut self) {
        self.posture();
        assert_eq!(self.next().expect("start").kind, Kind::Start);
        self.send(Kind::Ready, &ready_payload());
    }
}

pub fn answer_bytes(r: &Request) -> Vec<u8> {
    answer_in(LANE, r)
}

/// [`answer_bytes`] in `protocol`.
pub fn answer_in(protocol: Protocol, r: &Request) -> Vec<u8> {
    let output = (0..r.tokens).map(|t| t + r.index).collect();
    let resp = Response {
        index: r.index,
        tokens: r.tokens,
        output,
    };
    encode(protocol, Kind::Response, &resp.encode(), LIMITS).unwrap()
}

pub fn posture() -> Posture {
    Posture {
        protocol: 1,
        worker_sha256: "0".repeat(64),
        sealed_matches: true,
        uid: 3_000_000,
        gid: 3_000_000,
        cap_eff: 0,
        cap_prm: 0,
        cap_bnd: 0,
        cap_amb: 0,
        no_new_privs: true,
        seccomp_mode: 2,
        seccomp_filters: 1,
        interfaces: vec!["lo".into()],
        routes: 0,
        connect_errno: Some(101),
        read_only: [("/".to_owned(), false)].into(),
        seen: None,
        caches: std::collections::BTreeMap::new(),
    }
}

/// Drive one session of `w` against `script`, with `startup` and `phase` as the phase
/// lengths under an absolute deadline `absolute` from the start; a posture is as planned when
/// `expect_ok`.
pub fn drive_script(
    w: &Workload,
    startup: Duration,
    phase: Duration,
    absolute: Duration,
    expect_ok: bool,
    script: impl FnOnce(&mut Fake) + Send + 'static,
) -> Verdict {
    drive_observed(w, (startup, phase, absolute), expect_ok, script, &mut || {})
}

/// [`drive_script`] with the phases as (startup, workload, absolute) and `during_warmup` as the
/// driver's warmup hook.
pub fn drive_observed(
    w: &Workload,
    phases: (Duration, Duration, Duration),
    expect_ok: bool,
    script: impl FnOnce(&mut Fake) + Send + 'static,
    during_warmup: &mut dyn FnMut(),
) -> Verdict {
    drive_between((LANE, LANE), w, phases, expect_ok, script, during_warmup)
}

/// [`drive_observed`] with the host speaking `host` and the scripted side `worker`.
pub fn drive_between(
    (host, worker): (Protocol, Protocol),
    w: &Workload,
    (startup, phase, absolute): (Duration, Duration, Duration),
    expect_ok: bool,
    script: impl FnOnce(&mut Fake) + Send + 'static,
    during_warmup: &mut dyn FnMut(),
) -> Verdict {
    let (to_host, rx) = channel();
    let (tx, from_host) = channel();
    let handle = std::thread::spawn(move || {
        let mut fake = Fake {
            protocol: worker,
            from_host,
            decoder: Decoder::new(worker, LIMITS),
            queue: Vec::new(),
            to_host,
        };
        script(&mut fake);
    });
    let origin = Instant::now();
    let plan = Plan {
        protocol: host,
        workload: w,
        limits: LIMITS,
        startup,
        workload_phase: phase,
        absolute: origin + absolute,
        ranks: 1,
    };
    let v = drive(
        &rx,
        tx,
        origin,
        &plan,
        &|_| {
            if expect_ok {
                Vec::new()
            } else {
                vec!["CapEff is 1".into()]
            }
        },
        during_warmup,
        &mut cordon_lane::driver::Recent::default(),
    );
    drop(rx);
    let _ = handle.join();
    v
}
