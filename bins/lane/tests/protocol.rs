//! The host's side of the framed session against scripted workers and engines, no container:
//! every ordering, count and deadline rule of the protocol, and which side each failure is
//! charged to (a rejection is the engine's; a no-decision is what cordon could not establish).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use cordon_frame::message::{self, Fault, Request, Response, ready_payload};
use cordon_frame::{Kind, LANE, REFERENCE, encode};
use cordon_lane::driver::Verdict;
use cordon_lane::workload::{Item, Workload};

mod common;

use common::fake::{Fake, LIMITS, answer_bytes, drive_between, drive_script};

fn workload(n: u32) -> Workload {
    Workload {
        version: 1,
        warmup: 1,
        conditioning: 0,
        requests: (0..n)
            .map(|i| Item {
                prompt: vec![i, 7],
                tokens: 3,
            })
            .collect(),
    }
}

/// Run one session against `script`, with `startup` and `phase` as the phase lengths.
fn session_with(
    n: u32,
    startup: Duration,
    phase: Duration,
    expect_ok: bool,
    script: impl FnOnce(&mut Fake) + Send + 'static,
) -> Verdict {
    session_within(
        n,
        startup,
        phase,
        Duration::from_secs(60),
        expect_ok,
        script,
    )
}

/// [`session_with`] under an absolute deadline `absolute` from the start.
fn session_within(
    n: u32,
    startup: Duration,
    phase: Duration,
    absolute: Duration,
    expect_ok: bool,
    script: impl FnOnce(&mut Fake) + Send + 'static,
) -> Verdict {
    drive_script(&workload(n), startup, phase, absolute, expect_ok, script)
}

fn session(script: impl FnOnce(&mut Fake) + Send + 'static) -> Verdict {
    let long = Duration::from_secs(10);
    session_with(3, long, long, true, script)
}

fn rejected(v: &Verdict) -> (&'static str, String) {
    match v {
        Verdict::Violation { code, message } => (code, message.clone()),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn no_decision(v: &Verdict) -> String {
    match v {
        Verdict::NoDecision(why) => why.clone(),
        other => panic!("expected a no-decision, got {other:?}"),
    }
}

/// An engine that answers every request, then exits 0 when the host closes its stream.
fn honest(f: &mut Fake) {
    f.start();
    while let Some(frame) = f.next() {
        let r = Request::decode(&frame.payload).unwrap();
        f.answer(&r);
    }
    f.ended(Some(0), None);
    f.eof();
}

#[test]
fn an_honest_engine_is_served_with_host_stamped_windows_in_order() {
    let Verdict::Served(t) = session(honest) else {
        panic!("not served")
    };
    assert_eq!(t.windows.len(), 3);
    assert_eq!(t.windows[0].phase, cordon::receipt::LanePhase::Warmup);
    assert!(
        t.windows[1..]
            .iter()
            .all(|w| w.phase == cordon::receipt::LanePhase::Timed)
    );
    for w in &t.windows {
        assert!(w.sent_ns <= w.received_ns, "{w:?}");
        assert!(t.ready_ns <= w.sent_ns);
    }
    for pair in t.windows.windows(2) {
        assert!(
            pair[0].received_ns <= pair[1].sent_ns,
            "one request at a time"
        );
    }
    assert_eq!(t.ended.code, Some(0));
}

/// The registered engine process ended while the workload was open (the worker says so) and a
/// process it left answered every request: the answers are not the engine's, `lane.exit`.
#[test]
fn an_engine_that_left_a_child_to_answer_is_an_exit_before_the_workload_ended() {
    let v = session(|f| {
        f.start();
        while let Some(frame) = f.next() {
            let r = Request::decode(&frame.payload).unwrap();
            f.answer(&r);
        }
        f.ended_as(Some(0), None, true);
        f.eof();
    });
    let (code, message) = rejected(&v);
    assert_eq!(code, "lane.exit");
    assert!(message.contains("before the workload ended"), "{message}");
}

#[test]
fn the_reference_protocol_serves_its_own_frames_and_refuses_the_lanes_and_the_reverse() {
    let long = Duration::from_secs(10);
    let between = |host, worker| {
        drive_between(
            (host, worker),
            &workload(3),
            (long, long, Duration::from_secs(60)),
            true,
            honest,
            &mut || {},
        )
    };
    let Verdict::Served(t) = between(REFERENCE, REFERENCE) else {
        panic!("the reference session was not served in its own protocol")
    };
    assert_eq!(t.outputs.len(), 3);
    // A lane worker's stream in T, and T's in a lane: refused at the first frame, before any
    // posture is believed (the worker's side: cordon could not establish the session).
    for (host, worker) in [(REFERENCE, LANE), (LANE, REFERENCE)] {
        let why = no_decision(&between(host, worker));
        assert!(
            why.contains("magic"),
            "{} host, {} worker: {why}",
            host.name,
            worker.name
        );
    }
}

#[test]
fn a_posture_unlike_the_plan_is_a_containment_incident_and_the_engine_never_starts() {
    let long = Duration::from_secs(10);
    let v = session_with(3, long, long, false, |f| {
        f.posture();
        assert!(f.next().is_none(), "the host closes without start");
    });
    let Verdict::Containment(why) = &v else {
        panic!("expected a containment incident, got {v:?}")
    };
    assert!(why.contains("CapEff is 1"), "{v:?}");
}

#[test]
fn a_worker_fault_or_silence_before_its_posture_is_a_no_decision() {
    let v = session(|f| {
        let fault = Fault {
            what: "cannot read /proc/self/status".into(),
        };
        f.send(Kind::Fault, &message::to_payload(&fault).unwrap());
    });
    assert!(no_decision(&v).contains("/proc/self/status"));
    let v = session(|f| f.eof());
    assert!(no_decision(&v).contains("before its posture"));
    let v = session(|f| f.send(Kind::Ready, &ready_payload()));
    assert!(no_decision(&v).contains("before its posture"));
}

#[test]
fn output_before_ready_is_a_protocol_violation() {
    let v = session(|f| {
        f.posture();
        f.next();
        f.answer(&Request {
            index: 0,
            tokens: 3,
            prompt: vec![],
        });
    });
    let (code, message) = rejected(&v);
    assert_eq!(code, "lane.protocol");
    assert!(message.contains("before it was ready"), "{message}");
}

#[test]
fn a_response_sent_before_its_request_is_a_protocol_violation() {
    let v = session(|f| {
        f.start();
        let r = f.request();
        // Guessing the next request and answering it in the same write as this one, so the
        // host reads it before it has sent request 1.
        let guess = Request {
            index: 1,
            tokens: 3,
            prompt: vec![],
        };
        f.raw([answer_bytes(&r), answer_bytes(&guess)].concat());
        let _ = f.request();
    });
    let (code, message) = rejected(&v);
    assert_eq!(code, "lane.protocol");
    assert!(message.contains("before request 1 was sent"), "{message}");
}

#[test]
fn a_duplicate_response_is_a_protocol_violation() {
    let v = session(|f| {
        f.start();
        let r = f.request();
        f.answer(&r);
        let next = f.request();
        f.answer(&r);
        f.answer(&next);
    });
    let (code, _) = rejected(&v);
    assert_eq!(code, "lane.protocol");
}

#[test]
fn a_lie_about_the_token_count_is_rejected() {
    for (claimed, sent) in [(4u32, 3usize), (3, 4), (2, 2)] {
        let v = session(move |f| {
            f.start();
            let r = f.request();
            let resp = Response {
                index: r.index,
                tokens: claimed,
                output: vec![1; sent],
            };
            f.send(Kind::Response, &resp.encode());
            let _ = f.next();
        });
        let (code, message) = rejected(&v);
        assert_eq!(code, "lane.count", "{claimed}/{sent}: {message}");
    }
}

#[test]
fn a_malformed_response_or_a_second_ready_is_a_protocol_violation() {
    let v = session(|f| {
        f.start();
        let _ = f.request();
        f.send(Kind::Response, &[0; 7]);
    });
    assert_eq!(rejected(&v).0, "lane.protocol");
    let v = session(|f| {
        f.start();
        let _ = f.request();
        f.send(Kind::Ready, &ready_payload());
    });
    assert_eq!(rejected(&v).0, "lane.protocol");
}

#[test]
fn an_engine_that_is_never_ready_misses_the_startup_deadline() {
    let v = session_with(
        3,
        Duration::from_millis(200),
        Duration::from_secs(10),
        true,
        |f| {
            f.posture();
            let _ = f.next();
            // Silence: the host's clock, not the engine, ends the phase.
            let _ = f.next();
        },
    );
    assert_eq!(rejected(&v).0, "lane.startup-deadline");
}

#[test]
fn an_engine_that_stops_answering_misses_the_workload_deadline() {
    let started = Instant::now();
    let v = session_with(
        3,
        Duration::from_secs(10),
        Duration::from_millis(300),
        true,
        |f| {
            f.start();
            let r = f.request();
            f.answer(&r);
            let _ = f.request();
            let _ = f.next();
        },
    );
    assert_eq!(rejected(&v).0, "lane.workload-deadline");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_engine_that_exits_early_or_badly_is_rejected_and_a_wire_violation_the_worker_saw_too() {
    let v = session(|f| {
        f.start();
        let _ = f.request();
        f.ended(Some(1), None);
        f.eof();
    });
    let (code, message) = rejected(&v);
    assert_eq!(code, "lane.exit");
    assert!(message.contains("exited with code 1"), "{message}");

    let v = session(|f| {
        f.start();
        while let Some(frame) = f.next() {
            f.answer(&Request::decode(&frame.payload).unwrap());
        }
        f.ended(Some(3), None);
        f.eof();
    });
    assert_eq!(rejected(&v).0, "lane.exit");

    let v = session(|f| {
        f.start();
        let _ = f.request();
        f.ended(None, Some("frame 1 announces 99999999 payload bytes"));
        f.eof();
    });
    let (code, message) = rejected(&v);
    assert_eq!(code, "lane.protocol");
    assert!(message.contains("99999999"), "{message}");
}

/// The worker's member reports against the plan's one scheduler rank: exactly rank 0, by one
/// process, or the engine is rejected (`lane.members`); a fault reading them is one too.
#[test]
fn member_coverage_other_than_exactly_the_steps_ranks_is_rejected() {
    let m = |pid, role: &str, rank| message::Member {
        pid,
        role: role.into(),
        rank,
    };
    for (members, fault, why) in [
        (vec![], None, "are [], not each of 0 to 0 once"),
        (
            vec![m(2, message::SCHEDULER, 0), m(3, message::SCHEDULER, 1)],
            None,
            "are [0, 1]",
        ),
        (
            vec![m(2, message::SCHEDULER, 0), m(4, "detokenizer", 0)],
            None,
            "process 4 of role detokenizer, which must not load it",
        ),
        (
            vec![m(2, message::SCHEDULER, 0)],
            Some("process 9 sent a member report of 3 bytes that is not `ROLE RANK`"),
            "process 9 sent a member report",
        ),
    ] {
        let v = session(move |f| {
            f.start();
            while let Some(frame) = f.next() {
                f.answer(&Request::decode(&frame.payload).unwrap());
            }
            f.ended_with(Some(0), None, false, (members, fault));
            f.eof();
        });
        let (code, message) = rejected(&v);
        assert_eq!(code, "lane.members");
        assert!(message.contains(why), "{why}: {message}");
    }
}

#[test]
fn an_extra_frame_after_the_workload_is_unsolicited() {
    let v = session(|f| {
        f.start();
        let mut last = None;
        while let Some(frame) = f.next() {
            let r = Request::decode(&frame.payload).unwrap();
            f.answer(&r);
            last = Some(r);
        }
        f.answer(&last.unwrap());
    });
    let (code, message) = rejected(&v);
    assert_eq!(code, "lane.protocol");
    assert!(message.contains("after the last response"), "{message}");
}

#[test]
fn a_broken_or_truncated_stream_from_the_worker_is_a_no_decision() {
    let v = session(|f| {
        f.start();
        let _ = f.request();
        let mut bytes = encode(LANE, Kind::Response, &[0; 12], LIMITS).unwrap();
        bytes.truncate(10);
        f.raw(bytes);
        f.eof();
    });
    no_decision(&v);
    let v = session(|f| {
        f.start();
        let _ = f.request();
        f.raw(b"GARBAGE!!".to_vec());
    });
    no_decision(&v);
}

#[test]
fn output_past_the_stdout_cap_is_the_engines_once_it_runs_and_the_workers_before() {
    let v = session(|f| {
        f.start();
        let _ = f.request();
        f.overflow();
    });
    assert_eq!(rejected(&v).0, "lane.output");
    let v = session(|f| f.overflow());
    assert!(
        no_decision(&v).contains("before the engine started"),
        "{v:?}"
    );
}

#[test]
fn no_phase_runs_past_the_stages_absolute_deadline() {
    let started = Instant::now();
    let long = Duration::from_secs(30);
    let v = session_within(3, long, long, Duration::from_millis(300), true, |f| {
        f.start();
        let _ = f.request();
        let _ = f.next();
    });
    assert_eq!(rejected(&v).0, "lane.deadline");
    assert!(started.elapsed() < Duration::from_secs(5));
    let v = session_within(3, long, long, Duration::from_millis(300), true, |f| {
        f.posture();
        let _ = f.next();
        let _ = f.next();
    });
    assert_eq!(rejected(&v).0, "lane.deadline", "startup is capped too");
}

#[test]
fn a_frame_read_after_its_deadline_is_late_however_soon_it_is_looked_at() {
    // The response reaches the session at once, but the reader stamped it after the phase
    // ended (a host that looks late at a queue must not take it for on time).
    let v = session_with(
        3,
        Duration::from_secs(10),
        Duration::from_secs(2),
        true,
        |f| {
            f.start();
            let r = f.request();
            f.raw_at(answer_bytes(&r), Instant::now() + Duration::from_secs(5));
            let _ = f.next();
        },
    );
    assert_eq!(rejected(&v).0, "lane.workload-deadline");
}

#[test]
fn the_warmup_hook_runs_once_while_the_last_warmup_request_is_outstanding() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    for warmup in [0u32, 1, 2] {
        let w = Workload {
            warmup,
            ..workload(warmup + 2)
        };
        let answered = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&answered);
        let mut calls = Vec::new();
        let long = Duration::from_secs(10);
        let v = common::fake::drive_observed(
            &w,
            (long, long, long),
            true,
            move |f: &mut Fake| {
                f.start();
                while let Some(frame) = f.next() {
                    let r = Request::decode(&frame.payload).unwrap();
                    // Slow enough that the host's hook runs before the answer.
                    std::thread::sleep(Duration::from_millis(50));
                    // Counted before the host can see the answer.
                    seen.fetch_add(1, Ordering::SeqCst);
                    f.answer(&r);
                }
                f.ended(Some(0), None);
                f.eof();
            },
            &mut || calls.push(answered.load(Ordering::SeqCst)),
        );
        assert!(matches!(v, Verdict::Served(_)), "{v:?}");
        // Once, with every request before the last warmup one answered and that one not yet.
        assert_eq!(calls, [(warmup as usize).max(1) - 1], "warmup {warmup}");
    }
}
