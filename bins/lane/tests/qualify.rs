//! The qualification against fake reads: the host's real driver and clock against scripted
//! engines that answer after fixed delays, no container. The rates are measured by the host
//! from its own stamps, never given; what each test controls is only how long an engine takes.
//! The real-container qualification is in `root_qualify.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon::exit::ExitClass;
use std::cell::Cell;
use std::time::Duration;

use cordon::canonical::Digest;
use cordon::chain;
use cordon::receipt::{
    Decision, DevicePhase, DeviceReceipt, DeviceReceipts, LaneOutputs, LanePhase, LockSpan,
    Outcome, Role, StageName,
};
use cordon::runtime::Meta;
use cordon::store::Store;
use cordon_frame::message::Request;
use cordon_lane::driver::Verdict as Driven;
use cordon_lane::lock::GpuLock;
use cordon_lane::qualify::{Build, Frozen, Plan, QualifyOutputs, exchanged, primary, qualify};
use cordon_lane::session::{Config, Inputs, LaneError, Outcome as Read, timed_rate_milli};
use cordon_lane::speed::{self, Baseline, Verdict};
use cordon_lane::workload::{Item, Workload};
use cordon_policy_lang::Policy;
use cordon_stage::args::Diagnostics;
use cordon_testkit::replace_once;

mod common;

use common::fake::{Fake, drive_script};

struct World {
    dir: tempfile::TempDir,
    store: Store,
    policy: Policy,
    cfg: Config,
}

fn world(edits: &[(&str, &str)]) -> World {
    let dir = tempfile::tempdir().unwrap();
    let mut text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    for (from, to) in edits {
        text = replace_once(&text, from, to);
    }
    let policy = cordon_policy_lang::parse("t.kdl", &text).unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut setup = cordon_stage::settings::lease_setup(
        &policy,
        "qualify-test",
        &dir.path().join("state"),
        dir.path().join("run"),
    );
    setup.watchdog = cordon_testkit::watchdog();
    // The fake reads touch no device: a private lock, not the host's.
    setup.lock_dir = dir.path().join("locks");
    let cfg = Config {
        store: store.clone(),
        images: dir.path().join("images"),
        setup,
        authority: Digest::of_bytes(b"authority"),
        runtime_version: "test".into(),
        // The test's own key: fake-backed tests never touch the host's.
        key_dir: dir.path().join("keys"),
        evidence: cordon_stage::evidence::Evidence::new(&store),
        exe: std::path::PathBuf::from("/proc/self/exe"),
    };
    World {
        dir,
        store,
        policy,
        cfg,
    }
}

/// One warmup, `conditioning`, then `timed` requests of 4 tokens.
fn workload(conditioning: u32, timed: u32) -> Workload {
    Workload {
        version: 1,
        warmup: 1,
        conditioning,
        requests: (0..1 + conditioning + timed)
            .map(|i| Item {
                prompt: vec![i],
                tokens: 4,
            })
            .collect(),
    }
}

/// How long an engine takes per request: (conditioning, timed), ms.
type Speed = (u64, u64);

/// An engine that answers each request after its phase's delay.
fn engine(w: &Workload, (conditioning, timed): Speed) -> impl FnOnce(&mut Fake) + Send + use<> {
    let phases: Vec<LanePhase> = (0..w.requests.len()).map(|i| w.phase(i)).collect();
    move |f: &mut Fake| {
        f.start();
        while let Some(frame) = f.next() {
            let r = Request::decode(&frame.payload).unwrap();
            let ms = match phases[r.index as usize] {
                LanePhase::Warmup => 0,
                LanePhase::Conditioning => conditioning,
                LanePhase::Timed => timed,
            };
            std::thread::sleep(Duration::from_millis(ms));
            f.answer(&r);
        }
        f.ended(Some(0), None);
        f.eof();
    }
}

/// What a served fake read's receipt says: the driver's transcript, the lane as assigned.
fn outputs(inputs: &Inputs, t: &cordon_lane::driver::Transcript) -> LaneOutputs {
    LaneOutputs {
        role: inputs.role,
        tree: inputs.tree,
        publication: inputs.publication,
        model: Digest::of_bytes(b"model"),
        workload: Digest::of_bytes(b"workload"),
        worker: Digest::of_bytes(b"worker"),
        posture: t.posture_digest,
        step: "serve-example".into(),
        ready_ns: t.ready_ns,
        timed_rate_milli: timed_rate_milli(&t.windows),
        windows: t.windows.clone(),
        outputs: Digest::of_bytes(&cordon_evidence::outputs::encode(&t.outputs).unwrap()),
        meta: Meta {
            exit_code: Some(0),
            ..Meta::default()
        },
        lease: "fake".into(),
        launch: Digest::of_bytes(b"launch"),
        lane: inputs.lane.clone(),
        devices: {
            let receipt = |seq, phase| DeviceReceipt {
                launch: "fake".into(),
                seq,
                phase,
                at_ns: u64::from(seq) * 1000,
                gpus: Vec::new(),
                cpuset: None,
                quiescent: None,
                config: Vec::new(),
                samples: Vec::new(),
                note: "fake".into(),
            };
            DeviceReceipts {
                pre: receipt(0, DevicePhase::Pre),
                active: DeviceReceipt {
                    cpuset: inputs.lane.as_ref().map(|l| l.cpuset.clone()),
                    ..receipt(1, DevicePhase::Active)
                },
                post: DeviceReceipt {
                    quiescent: Some(true),
                    ..receipt(2, DevicePhase::Post)
                },
            }
        },
        gpu_lock: LockSpan {
            waited_ns: 0,
            from_unix_ns: 0,
            until_unix_ns: 0,
        },
    }
}

fn build(name: &[u8]) -> Build {
    Build {
        tree: Digest::of_bytes(name),
        publication: Digest::of_bytes(&[name, b"-publication"].concat()),
        receipt: Digest::of_bytes(&[name, b"-prebuild"].concat()),
    }
}

fn plan(w: &World) -> Plan {
    Plan {
        incumbent: build(b"incumbent"),
        candidate: build(b"candidate"),
        workload: "workload.json".into(),
        model: "model".into(),
        orientation: primary(&w.policy).unwrap(),
        reproduces: None,
        frozen: cordon_lane::qualify::frozen(&w.policy, &w.cfg.setup.cdi_dirs).unwrap(),
    }
}

/// `plan` with `load` written as its workload file (the qualification checks it before any
/// read).
fn with_workload(w: &World, plan: &Plan, load: &Workload) -> Plan {
    let file = w.dir.path().join("workload.json");
    std::fs::write(&file, serde_json::to_vec(load).unwrap()).unwrap();
    Plan {
        workload: file,
        ..plan.clone()
    }
}

/// Qualify with fake reads: `speeds[i]` is the i-th read's engine (B, C, B′); `edit` may
/// change a read's receipt before the host sees it.
fn run(
    w: &World,
    plan: &Plan,
    load: &Workload,
    speeds: [Speed; 3],
    edit: &dyn Fn(usize, &mut LaneOutputs),
) -> (Result<Decision<QualifyOutputs>, LaneError>, usize) {
    let n = Cell::new(0usize);
    let mut read = |inputs: &Inputs, _: &GpuLock| -> Result<Read, LaneError> {
        let i = n.get();
        n.set(i + 1);
        let long = Duration::from_secs(30);
        match drive_script(load, long, long, long, true, engine(load, speeds[i])) {
            Driven::Served(t) => {
                let mut o = outputs(inputs, &t);
                edit(i, &mut o);
                Ok(Decision::Accepted(o))
            }
            Driven::Violation { code, message } => Ok(Decision::Rejected(
                cordon::receipt::Rejection::one(code, message, serde_json::Value::Null),
            )),
            Driven::NoDecision(why) | Driven::Containment(why) => Err(LaneError::NoDecision(why)),
        }
    };
    let plan = with_workload(w, plan, load);
    let r = qualify(
        &w.policy,
        &w.cfg,
        &plan,
        &mut read,
        Diagnostics::Text,
        &mut std::io::sink(),
    );
    (r, n.get())
}

fn accepted(r: Result<Decision<QualifyOutputs>, LaneError>) -> QualifyOutputs {
    match r {
        Ok(Decision::Accepted(o)) => o,
        other => panic!("expected a PASS, got {other:?}"),
    }
}

fn failed(r: Result<Decision<QualifyOutputs>, LaneError>) -> (String, QualifyOutputs) {
    match r {
        Ok(Decision::Rejected(rej)) => (
            rej.code().to_owned(),
            serde_json::from_value(rej.evidence).unwrap(),
        ),
        other => panic!("expected a FAIL, got {other:?}"),
    }
}

#[test]
fn a_clearly_faster_candidate_passes_and_the_verdict_recomputes_from_the_receipt() {
    let w = world(&[]);
    let p = plan(&w);
    let (r, reads) = run(
        &w,
        &p,
        &workload(0, 5),
        [(0, 40), (0, 15), (0, 40)],
        &|_, _| {},
    );
    assert_eq!(reads, 3);
    let o = accepted(r);
    assert_eq!(o.speed.verdict, Verdict::Pass);
    assert!(o.speed.speedup_bp > 20_000, "{:?}", o.speed);
    // Every session's receipt is stored, continues its role's prebuild and runs on its lane.
    for (digest, build, lane) in [
        (o.sessions.b, &p.incumbent, &p.orientation.baseline),
        (o.sessions.c, &p.candidate, &p.orientation.candidate),
        (o.sessions.b2, &p.incumbent, &p.orientation.baseline),
    ] {
        let r = chain::load(&w.store, &digest).unwrap();
        assert_eq!((r.stage, r.outcome), (StageName::Lane, Outcome::Ok));
        assert_eq!(r.prev, Some(build.receipt));
        let lo = r.outputs_as::<LaneOutputs>().unwrap();
        assert_eq!((lo.tree, lo.lane.as_ref()), (build.tree, Some(lane)));
    }
    assert_eq!(o.orientation.baseline.cpuset, "0");
    // A CPU rehearsal never settles.
    assert!(!o.settling && o.non_settling.is_some());
    // The verdict is a function of what the receipt holds.
    let speed = w.policy.speed().unwrap();
    let again = speed::decide(speed, &o.windows.b, &o.windows.c, &o.windows.b2);
    assert_eq!(again, o.speed);
}

#[test]
fn a_candidate_as_fast_as_the_incumbent_fails() {
    let w = world(&[]);
    let (r, _) = run(&w, &plan(&w), &workload(0, 5), [(0, 30); 3], &|_, _| {});
    let (code, o) = failed(r);
    assert!(
        ["speed.slower", "speed.not-proven"].contains(&code.as_str()),
        "{code}"
    );
    assert_eq!(o.speed.verdict, Verdict::Fail);
}

#[test]
fn a_candidate_inside_the_bracket_is_not_proven_faster_and_fails() {
    // A wide noise bound and a 1× multiplier make the bracket wide enough to land in: B′ is
    // 1.25× B (noise ≈ 22 %, required ≈ 1.22×), C is 1.39× B: above the bar against B, below
    // it against B′.
    let w = world(&[
        ("max-noise-bp 1000", "max-noise-bp 3000"),
        ("noise-multiplier-bp 30000", "noise-multiplier-bp 10000"),
    ]);
    let (r, _) = run(
        &w,
        &plan(&w),
        &workload(0, 4),
        [(0, 100), (0, 72), (0, 80)],
        &|_, _| {},
    );
    let (code, o) = failed(r);
    assert_eq!(code, "speed.not-proven", "{:?}", o.speed);
    assert_eq!(o.speed.baseline, Baseline::Bracketed);
    assert!(o.speed.low_bp < o.speed.required_bp && o.speed.required_bp <= o.speed.high_bp);
}

#[test]
fn bracket_drift_drops_b_prime_and_c_against_b_decides() {
    // B′ twice as fast as B: far beyond the maximum noise. C (1.5× B) passes against B; it
    // would fail against B′.
    let w = world(&[]);
    let (r, _) = run(
        &w,
        &plan(&w),
        &workload(0, 4),
        [(0, 60), (0, 40), (0, 30)],
        &|_, _| {},
    );
    let o = accepted(r);
    assert_eq!(o.speed.baseline, Baseline::Drift);
    assert!(o.speed.bracket_noise_bp > 1_000, "{:?}", o.speed);
}

#[test]
fn a_conditioning_regression_fails_a_candidate_faster_when_timed() {
    let w = world(&[]);
    let (r, _) = run(
        &w,
        &plan(&w),
        &workload(2, 4),
        [(20, 40), (80, 15), (20, 40)],
        &|_, _| {},
    );
    let (code, o) = failed(r);
    assert_eq!(code, "speed.conditioning");
    assert!(o.speed.low_bp > o.speed.required_bp, "timed, C is faster");
}

#[test]
fn a_read_that_does_not_serve_ends_the_qualification_and_is_charged_to_its_role() {
    let w = world(&[]);
    let load = workload(0, 4);
    let p = with_workload(&w, &plan(&w), &load);
    // The candidate sends too few tokens: its rejection; B′ never runs.
    let n = Cell::new(0usize);
    let mut read = |inputs: &Inputs, _: &GpuLock| -> Result<Read, LaneError> {
        n.set(n.get() + 1);
        if inputs.role == Role::C {
            return Ok(Decision::Rejected(cordon::receipt::Rejection::one(
                "lane.count",
                "too few tokens".into(),
                serde_json::Value::Null,
            )));
        }
        let long = Duration::from_secs(30);
        match drive_script(&load, long, long, long, true, engine(&load, (0, 1))) {
            Driven::Served(t) => Ok(Decision::Accepted(outputs(inputs, &t))),
            other => panic!("{other:?}"),
        }
    };
    let r = qualify(
        &w.policy,
        &w.cfg,
        &p,
        &mut read,
        Diagnostics::Text,
        &mut std::io::sink(),
    );
    match r {
        Ok(Decision::Rejected(rej)) => assert_eq!(rej.code(), "qualify.candidate"),
        other => panic!("{other:?}"),
    }
    assert_eq!(n.get(), 2);
    // The incumbent breaking its own session is never the candidate's failure.
    let mut read = |inputs: &Inputs, _: &GpuLock| -> Result<Read, LaneError> {
        assert_eq!(inputs.role, Role::B);
        Ok(Decision::Rejected(cordon::receipt::Rejection::one(
            "lane.exit",
            "the incumbent crashed".into(),
            serde_json::Value::Null,
        )))
    };
    let r = qualify(
        &w.policy,
        &w.cfg,
        &p,
        &mut read,
        Diagnostics::Text,
        &mut std::io::sink(),
    );
    assert!(matches!(r, Err(LaneError::NoDecision(_))), "{r:?}");
}

#[test]
fn reads_launched_differently_on_another_lane_or_with_broken_device_receipts_are_a_no_decision() {
    let w = world(&[]);
    let p = plan(&w);
    let load = workload(0, 4);
    let speeds = [(0, 5), (0, 2), (0, 5)];
    for (what, edit) in [
        (
            "launched differently",
            &(|i: usize, o: &mut LaneOutputs| {
                if i == 1 {
                    o.launch = Digest::of_bytes(b"another launch");
                }
            }) as &dyn Fn(usize, &mut LaneOutputs),
        ),
        ("launched differently", &|i, o| {
            if i == 2 {
                o.model = Digest::of_bytes(b"another model");
            }
        }),
        ("another physical lane", &|i, o| {
            if i == 1 {
                o.devices.active.cpuset = Some("0-1".into());
            }
        }),
        ("another physical lane", &|i, o| {
            if i == 0 {
                o.devices.active.cpuset = None;
            }
        }),
        ("different launches", &|i, o| {
            if i == 2 {
                o.devices.post.launch = "another".into();
            }
        }),
        ("in sequence and time", &|i, o| {
            if i == 1 {
                o.devices.active.seq = 0;
            }
        }),
        ("in sequence and time", &|i, o| {
            if i == 1 {
                o.devices.post.at_ns = 0;
            }
        }),
        ("quiescent", &|i, o| {
            if i == 0 {
                o.devices.post.quiescent = None;
            }
        }),
    ] {
        let (r, _) = run(&w, &p, &load, speeds, edit);
        match r {
            // It names every session it ran, so the receipts it rests on are found.
            Err(LaneError::NoDecision(why)) => {
                assert!(why.contains(what), "{why}");
                assert!(why.contains("(the sessions it ran: B sha256:"), "{why}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn a_reproduction_is_the_exact_exchange_and_settles_at_the_lower_speedup() {
    let w = world(&[]);
    let p = plan(&w);
    let load = workload(0, 4);
    let first = accepted(run(&w, &p, &load, [(0, 30), (0, 10), (0, 30)], &|_, _| {}).0);
    let swapped = exchanged(&w.policy, &first, &p.frozen).unwrap();
    assert_eq!(swapped.baseline, p.orientation.candidate);
    assert_eq!(swapped.candidate, p.orientation.baseline);
    let again = Plan {
        orientation: swapped,
        reproduces: Some((Digest::of_bytes(b"first"), first.clone())),
        ..p
    };
    let second = accepted(run(&w, &again, &load, [(0, 30), (0, 10), (0, 30)], &|_, _| {}).0);
    let s = second.settlement.clone().unwrap();
    assert_eq!(
        s.speedup_bp,
        first.speed.speedup_bp.min(second.speed.speedup_bp)
    );
    // Two PASSes, but on CPU lanes: the pair does not settle.
    assert!(!s.settles);
    // A reproduction is not reproduced (that would be the primary's orientation again).
    let e = exchanged(&w.policy, &second, &again.frozen)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("only a primary attempt on this policy's lanes is reproduced"),
        "{e}"
    );
    // Nor is a primary attempt reproduced under another frozen authority.
    for edit in [
        &(|f: &mut Frozen| f.kernel_release.push_str("-other")) as &dyn Fn(&mut Frozen),
        &|f| f.gpu_driver = Some("570.1".into()),
        &|f| f.cdi_spec = Some(Digest::of_bytes(b"cdi")),
        &|f| f.device_policy = Digest::of_bytes(b"devices"),
    ] {
        let mut now = again.frozen.clone();
        edit(&mut now);
        let e = exchanged(&w.policy, &first, &now).unwrap_err();
        assert!(e.to_string().contains("another"), "{e}");
    }
}

#[test]
fn a_workload_too_short_for_the_verdict_is_refused_before_any_read() {
    let w = world(&[]);
    let (r, reads) = run(&w, &plan(&w), &workload(0, 3), [(0, 1); 3], &|_, _| {});
    match r {
        Err(e) => {
            assert_eq!(e.exit_class(), cordon::ExitCode::Usage, "{e}");
            assert!(e.to_string().contains("timed requests"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(reads, 0);
}

#[test]
fn a_reproduction_launched_differently_from_its_primary_is_a_no_decision() {
    let w = world(&[]);
    let p = plan(&w);
    let load = workload(0, 4);
    let first = accepted(run(&w, &p, &load, [(0, 20), (0, 5), (0, 20)], &|_, _| {}).0);
    let again = Plan {
        orientation: exchanged(&w.policy, &first, &p.frozen).unwrap(),
        reproduces: Some((Digest::of_bytes(b"first"), first)),
        ..p
    };
    let (r, reads) = run(&w, &again, &load, [(0, 20), (0, 5), (0, 20)], &|_, o| {
        o.workload = Digest::of_bytes(b"another workload");
    });
    match r {
        Err(LaneError::NoDecision(why)) => assert!(why.contains("primary attempt"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(reads, 3);
}

/// Nothing of cordon's may be live before the first read: a container of another executor (a
/// dead supervisor's orphan, which no pre receipt of these reads would show) makes the
/// qualification a no-decision before any read; a listing that fails does too.
#[test]
fn a_container_live_before_the_first_read_is_a_no_decision() {
    use cordon::host::ToolOutput;
    use cordon::host::fake::Fake as Host;
    let load = workload(0, 4);
    for (list, state, why) in [
        (
            &b"[{\"id\":\"orphan-1\"}]"[..],
            &b"{\"id\":\"orphan-1\",\"annotations\":{\"org.cordon.executor\":\"lane-b\"}}"[..],
            "containers are live on this host before the qualification: orphan-1 (lane-b)",
        ),
        (
            b"[{\"id\":\"stray\"}]",
            b"{\"id\":\"stray\"}",
            "containers are live on this host before the qualification: stray (no executor)",
        ),
        (b"not json", b"", "the host's containers cannot be listed"),
    ] {
        let mut w = world(&[]);
        let host = Host::new();
        host.reply("list", ToolOutput::ok(list))
            .reply("state", ToolOutput::ok(state));
        w.cfg.setup.runtime.host = std::sync::Arc::new(host);
        let p = with_workload(&w, &plan(&w), &load);
        let (r, reads) = run(&w, &p, &load, [(0, 20), (0, 5), (0, 20)], &|_, _| {});
        match r {
            Err(LaneError::NoDecision(m)) => assert!(m.starts_with(why), "{m}"),
            other => panic!("{why}: {other:?}"),
        }
        assert_eq!(reads, 0, "{why}");
    }
}
