use std::sync::Arc;

use cordon_device::fake::{Fake, FakeClock, Step, pinned_config};
use cordon_evidence::device::unguarded;
use cordon_evidence::receipt::{DevicePhase, DeviceReceipt, DeviceReceipts};

use super::*;

const A: &str = cordon_testkit::LANE_GPUS[0];

struct World {
    _dir: tempfile::TempDir,
    store: Store,
    fake: Arc<Fake>,
    clock: Arc<FakeClock>,
    devices: Devices,
    pins: BTreeMap<String, DeviceConfig>,
    rules: DeviceGuard,
}

/// Lane a of the GPU policy: one GPU, pinned as the fake reports it, idle; an empty store.
fn world() -> World {
    let text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    let policy =
        cordon_policy_lang::parse("t.kdl", &cordon_testkit::with_gpu_lanes(&text)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let clock = Arc::new(FakeClock::default());
    let fake = Arc::new(Fake::new(clock.clone()));
    fake.config_of(A, Some(pinned_config()))
        .minor_of(A, Some(0));
    let devices = Devices {
        gpus: fake.clone(),
        clock: clock.clone(),
    };
    World {
        _dir: dir,
        store,
        fake,
        clock,
        devices,
        pins: policy.physical_lanes()["a"].gpus.clone(),
        rules: policy.device_guard().unwrap().clone(),
    }
}

impl World {
    fn guard(&self) -> Guard<'_> {
        Guard::new(&self.devices, &self.pins, &self.rules, &self.store)
    }

    fn marks(&self) -> Vec<(Scope, Cause)> {
        quarantine::in_force(&self.store)
            .unwrap()
            .into_values()
            .map(|q| (q.scope, q.cause))
            .collect()
    }
}

fn receipt(phase: DevicePhase, gpus: Vec<String>, o: Observed) -> DeviceReceipt {
    let seq = phase as u32;
    DeviceReceipt {
        launch: "l".into(),
        seq,
        phase,
        at_ns: u64::from(seq),
        gpus,
        cpuset: None,
        quiescent: None,
        config: o.config,
        samples: o.samples,
        note: String::new(),
    }
}

#[test]
fn an_idle_pinned_gpu_passes_pre_active_and_post_and_the_receipts_recompute_as_guarded() {
    let w = world();
    let g = w.guard();
    let pre = g.pre().unwrap();
    assert_eq!(pre.config, [pinned_config()]);
    assert_eq!(pre.samples[0].len(), 3, "the rule's 3 idle samples");
    // Under load while measured: the envelope holds (no forbidden throttle, clocks up).
    w.fake.script(
        A,
        [Step::with(|s| {
            s.utilisation = 100;
            s.processes = vec![4242];
            s.clocks = (1980, 2619);
            s.power_mw = 600_000;
        })],
    );
    let active = g.active().unwrap();
    w.fake.script(A, [Step::idle()]);
    let post = g.post().unwrap();
    let gpus = g.gpus();
    let receipts = DeviceReceipts {
        pre: receipt(DevicePhase::Pre, gpus.clone(), pre),
        active: receipt(DevicePhase::Active, gpus.clone(), active.clone()),
        post: receipt(DevicePhase::Post, gpus.clone(), post.clone()),
    };
    assert_eq!(
        unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &receipts),
        Vec::<String>::new()
    );
    assert!(w.marks().is_empty());
    // The recomputation fails a receipt that lacks what it claims: a GPU's samples missing,
    // a busy sample last, the active sample outside the envelope.
    let mut r = receipts.clone();
    r.post.samples[0].pop();
    r.post.samples[0].push(active.samples[0][0].clone());
    r.active.samples[0][0].temperature_c = 99;
    let why = unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r);
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why[0].starts_with("active: GPU"), "{why:?}");
    assert!(
        why[1].contains("0 idle samples at the end, not 3"),
        "{why:?}"
    );
    // Out of place, out of sequence, samples out of time.
    let out_of_order = "the receipts are not pre, active and post in sequence and time".to_owned();
    let mut r = receipts.clone();
    std::mem::swap(&mut r.pre, &mut r.post);
    assert!(unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r).contains(&out_of_order));
    // One sequence number twice; in sequence but back in time.
    let mut r = receipts.clone();
    r.active.seq = r.pre.seq;
    assert_eq!(
        unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r),
        std::slice::from_ref(&out_of_order)
    );
    let mut r = receipts.clone();
    r.active.phase = DevicePhase::Pre;
    assert!(unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r).contains(&out_of_order));
    let mut r = receipts.clone();
    r.post.at_ns = 0;
    assert_eq!(
        unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r),
        std::slice::from_ref(&out_of_order)
    );
    let mut r = receipts.clone();
    r.active.samples[0][0].at_ns = 0;
    assert_eq!(
        unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r),
        [format!("GPU {A}: its samples are not in time order")]
    );
    let mut r = receipts;
    r.pre.gpus.clear();
    assert_eq!(
        unguarded(&w.pins, &w.rules.drain, &w.rules.envelope, &r),
        ["the pre receipt does not cover exactly the lane's GPUs"]
    );
}

#[test]
fn a_drain_resets_on_a_busy_or_failed_sample_and_holds_after_enough_idle_ones() {
    let w = world();
    w.fake.script(
        A,
        [
            Step::idle(),
            Step::with(|s| s.processes = vec![7]),
            Step::idle(),
            Step::failing(),
            Step::idle(),
            Step::idle(),
            Step::idle(),
        ],
    );
    let pre = w.guard().pre().unwrap();
    assert_eq!(w.fake.sampled(A), 7);
    assert_eq!(pre.samples[0].len(), 6, "the failed read kept nothing");
}

#[test]
fn a_gpu_that_does_not_drain_is_marked_not_reusable_until_a_drain_holds() {
    let w = world();
    w.fake.script(A, [Step::with(|s| s.memory_used = 1 << 40)]);
    let e = w.guard().pre().unwrap_err();
    assert!(e.why.contains("did not drain"), "{}", e.why);
    assert!(e.why.contains("quarantined (drain"), "{}", e.why);
    assert!(!e.observed.samples[0].is_empty());
    assert_eq!(w.marks(), [(Scope::Device(A.into()), Cause::Drain)]);
    // It stays marked while it does not drain (one record), and the stage's check refuses
    // any other work on it.
    let e = w.guard().pre().unwrap_err();
    assert!(e.why.contains("stays quarantined"), "{}", e.why);
    assert!(quarantine::check(&w.store, "x", &[A.to_owned()]).is_err());
    // Post does not lift it.
    assert!(
        w.guard()
            .post()
            .unwrap_err()
            .why
            .contains("is quarantined (drain")
    );
    // A later read's drain that holds lifts it, and says so.
    w.fake.script(A, [Step::idle()]);
    let pre = w.guard().pre().unwrap();
    assert!(pre.note[0].contains("not-reusable mark"), "{:?}", pre.note);
    assert!(w.marks().is_empty());
}

#[test]
fn a_drain_past_its_deadline_or_a_fault_fails_and_marks() {
    // Every sample late: the drain's timeout passes.
    let w = world();
    w.fake
        .script(A, [Step::idle().taking(Duration::from_millis(60))]);
    let e = w.guard().pre().unwrap_err();
    assert!(e.why.contains("did not drain within"), "{}", e.why);
    assert!(w.clock.now() >= Duration::from_secs(2));
    // A fault: at once.
    let w = world();
    w.fake.script(A, [Step::with(|s| s.xid = vec![79])]);
    let e = w.guard().post().unwrap_err();
    assert!(e.why.contains("faulted: Xid events [79]"), "{}", e.why);
    assert_eq!(w.marks(), [(Scope::Device(A.into()), Cause::Drain)]);
}

#[test]
fn a_drifted_configuration_is_terminal_and_no_drain_lifts_it() {
    let w = world();
    let mut low = pinned_config();
    low.power_limit_mw = 350_000;
    w.fake.config_of(A, Some(low.clone()));
    let e = w.guard().post().unwrap_err();
    assert!(
        e.why.contains("not as pinned: power limit 350000 mW"),
        "{}",
        e.why
    );
    assert_eq!(e.observed.config, [low]);
    assert_eq!(w.marks(), [(Scope::Device(A.into()), Cause::Drift)]);
    // Restored, it still may not run: only an operator clears a drift.
    w.fake.config_of(A, Some(pinned_config()));
    let e = w.guard().pre().unwrap_err();
    assert!(e.why.contains("is quarantined (drift"), "{}", e.why);
    assert_eq!(w.fake.sampled(A), 0, "nothing was drained");
    // An unreadable configuration is a failure too, without a mark.
    let w = world();
    w.fake.config_of(A, None);
    assert!(w.guard().pre().is_err());
    assert!(w.marks().is_empty());
}

#[test]
fn an_active_sample_outside_the_envelope_or_unreadable_fails() {
    for (step, why) in [
        (
            Step::with(|s| s.throttle = 1 << 3),
            "while measured: throttled: hw-slowdown",
        ),
        (
            Step::with(|s| s.temperature_c = 90),
            "while measured: temperature 90 °C, above 85",
        ),
        (
            Step::with(|s| s.power_mw = 800_000),
            "while measured: power 800000 mW, above 700000",
        ),
        (
            Step::with(|s| s.clocks = (1000, 2619)),
            "graphics clock 1000 MHz, below 1700",
        ),
        (Step::failing(), "cannot read"),
    ] {
        let w = world();
        w.fake.script(A, [step]);
        let e = w.guard().active().unwrap_err();
        assert!(e.why.contains(why), "{why}: {}", e.why);
    }
}

#[test]
fn the_containers_gpu_nodes_must_be_exactly_the_lanes_gpus() {
    let w = world();
    let g = w.guard();
    // nvidiactl (195:255), uvm (another major) and a GPU's node: lane a's GPU is minor 0.
    let (ctl, uvm) = ((195, 255), (508, 0));
    g.nodes(&[ctl, uvm, (195, 0)]).unwrap();
    for (planned, why) in [
        (
            vec![ctl, uvm],
            "are 195:[], and the lane's GPUs are 195:[0]",
        ),
        (
            vec![ctl, (195, 1)],
            "are 195:[1], and the lane's GPUs are 195:[0]",
        ),
        (vec![(195, 0), (195, 1)], "are 195:[0, 1]"),
    ] {
        let e = g.nodes(&planned).unwrap_err();
        assert!(e.contains(why), "{planned:?}: {e}");
    }
    w.fake.minor_of(A, None);
    assert!(g.nodes(&[(195, 0)]).unwrap_err().contains("minor number"));
}
