use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::DrainRule;
use crate::fake::{Fake, FakeClock, Step, pinned_config};

const GPU: &str = "GPU-0e3f6a52-0000-4c2c-9d41-000000000001";

fn rule() -> DrainRule {
    DrainRule {
        samples: 3,
        interval_ms: 100,
        sample_timeout_ms: 50,
        timeout_ms: 2000,
        idle_memory: 600 << 20,
    }
}

fn setup() -> (Arc<FakeClock>, Fake) {
    let clock = Arc::new(FakeClock::default());
    let fake = Fake::new(clock.clone());
    fake.config_of(GPU, Some(pinned_config()));
    (clock, fake)
}

#[test]
fn an_idle_device_drains_after_the_consecutive_samples_the_rule_asks() {
    let (clock, fake) = setup();
    let d = drain(&fake, &*clock, Duration::ZERO, GPU, &rule()).unwrap();
    assert_eq!(d.samples.len(), 3);
    assert_eq!(fake.sampled(GPU), 3);
    // Two intervals between three samples; each sample stamped on the guard's clock.
    assert_eq!(d.took_ns, 200_000_000);
    let at: Vec<u64> = d.samples.iter().map(|s| s.at_ns).collect();
    assert_eq!(at, [0, 100_000_000, 200_000_000]);
}

#[test]
fn each_kind_of_activity_resets_the_count() {
    let busy: [(&str, Step, u32); 8] = [
        (
            "processes [4242]",
            Step::with(|s| s.processes = vec![4242]),
            6,
        ),
        ("utilisation 3%", Step::with(|s| s.utilisation = 3), 6),
        (
            "memory utilisation 1%",
            Step::with(|s| s.memory_utilisation = 1),
            6,
        ),
        (
            "629145601 bytes of memory allocated, above 629145600",
            Step::with(|s| s.memory_used = (600 << 20) + 1),
            6,
        ),
        ("a sample failed", Step::failing(), 5),
        (
            "a sample took 50.000001ms, above 50ms",
            Step::idle().taking(Duration::from_nanos(50_000_001)),
            6,
        ),
        // At each bound exactly: idle, so nothing resets (three samples drain).
        ("", Step::with(|s| s.memory_used = 600 << 20), 3),
        ("", Step::idle().taking(Duration::from_millis(50)), 3),
    ];
    for (why, step, kept) in busy {
        // Idle, idle, then the step, then idle: the count starts again after a busy one.
        let (clock, fake) = setup();
        fake.script(
            GPU,
            [Step::idle(), Step::idle(), step.clone(), Step::idle()],
        );
        let d = drain(&fake, &*clock, Duration::ZERO, GPU, &rule()).unwrap();
        let read = if kept == 3 { 3 } else { 6 };
        assert_eq!(fake.sampled(GPU), read, "{why}");
        assert_eq!(d.read, (read, read - kept), "{why}");
        assert_eq!(d.samples.len(), kept as usize, "{why}");
        if why.is_empty() {
            continue;
        }
        // The same activity forever: no drain, and the last reason says what it was.
        let (clock, fake) = setup();
        fake.script(GPU, [step]);
        match drain(&fake, &*clock, Duration::ZERO, GPU, &rule()) {
            Err(DrainError::NotDrained { why: last, .. }) => {
                assert!(last.contains(why), "{why}: {last}");
            }
            other => panic!("{why}: {other:?}"),
        }
    }
}

/// A fault seen while draining (an Xid from the session just ended, memory owed a reset)
/// fails the drain at once, whatever idle samples would follow.
#[test]
fn a_fault_fails_the_drain_at_once() {
    for (why, step) in [
        ("Xid events [79]", Step::with(|s| s.xid = vec![79])),
        (
            "memory pending retirement or remapping",
            Step::with(|s| s.retirement_pending = true),
        ),
    ] {
        let (clock, fake) = setup();
        fake.script(GPU, [Step::idle(), step, Step::idle()]);
        match drain(&fake, &*clock, Duration::ZERO, GPU, &rule()) {
            Err(DrainError::Faulted {
                uuid,
                why: w,
                samples,
            }) => {
                assert_eq!((uuid.as_str(), w.as_str()), (GPU, why));
                assert_eq!(samples.len(), 2, "{why}");
            }
            other => panic!("{why}: {other:?}"),
        }
        assert_eq!(fake.sampled(GPU), 2, "{why}");
    }
}

/// A rule that cannot decide a drain is refused before any sample.
#[test]
fn an_unsound_rule_is_refused() {
    type Break = fn(&mut DrainRule);
    let unsound: [(&str, Break); 4] = [
        ("3 samples 100 ms apart cannot fit in 150 ms", |r| {
            r.timeout_ms = 150;
            r.sample_timeout_ms = 50;
        }),
        ("a drain of zero samples proves nothing", |r| r.samples = 0),
        ("an interval of 9 ms, below 10", |r| r.interval_ms = 9),
        ("a sample timeout of 3000 ms, above the drain's 2000", |r| {
            r.sample_timeout_ms = 3000;
        }),
    ];
    for (why, b) in unsound {
        let (clock, fake) = setup();
        let mut r = rule();
        b(&mut r);
        match drain(&fake, &*clock, Duration::ZERO, GPU, &r) {
            Err(DrainError::Rule(w)) => assert_eq!(w, why),
            other => panic!("{why}: {other:?}"),
        }
        assert_eq!(fake.sampled(GPU), 0);
    }
}

/// Samples are stamped from the caller's origin; a long drain keeps only its last samples.
#[test]
fn samples_are_stamped_from_the_origin_and_bounded() {
    let (clock, fake) = setup();
    clock.advance(Duration::from_secs(5));
    let d = drain(&fake, &*clock, Duration::from_secs(4), GPU, &rule()).unwrap();
    let at: Vec<u64> = d.samples.iter().map(|s| s.at_ns).collect();
    assert_eq!(at, [1_000_000_000, 1_100_000_000, 1_200_000_000]);
    let (clock, fake) = setup();
    let mut r = rule();
    r.interval_ms = DrainRule::MIN_INTERVAL_MS;
    r.timeout_ms = 60_000;
    let mut steps = vec![Step::with(|s| s.utilisation = 1); 1000];
    steps.push(Step::idle());
    fake.script(GPU, steps);
    let d = drain(&fake, &*clock, Duration::ZERO, GPU, &r).unwrap();
    assert_eq!(d.read, (1003, 0));
    assert_eq!(d.samples.len(), super::KEPT_SAMPLES);
    assert_eq!(d.samples.last().unwrap().utilisation, 0);
}

#[test]
fn the_deadline_ends_a_drain_that_never_holds_and_keeps_every_sample() {
    let (clock, fake) = setup();
    fake.script(GPU, [Step::with(|s| s.utilisation = 100)]);
    let e = drain(&fake, &*clock, Duration::ZERO, GPU, &rule()).unwrap_err();
    let DrainError::NotDrained {
        uuid,
        timeout,
        why,
        samples,
    } = e
    else {
        panic!("{e:?}")
    };
    assert_eq!((uuid.as_str(), timeout), (GPU, Duration::from_secs(2)));
    assert_eq!(why, "utilisation 100%");
    // A sample every 100 ms from 0 to 2 s inclusive, none after the deadline.
    assert_eq!(samples.len(), 21);
    assert!(clock.now() <= Duration::from_millis(2100));
    // An idle run that would complete just past the deadline (its third sample at 2.1 s)
    // does not count; one that completes at 2 s exactly does.
    let (clock, fake) = setup();
    let mut steps = vec![Step::with(|s| s.utilisation = 1); 19];
    steps.push(Step::idle());
    fake.script(GPU, steps);
    assert!(matches!(
        drain(&fake, &*clock, Duration::ZERO, GPU, &rule()),
        Err(DrainError::NotDrained { .. })
    ));
    let (clock, fake) = setup();
    let mut steps = vec![Step::with(|s| s.utilisation = 1); 18];
    steps.push(Step::idle());
    fake.script(GPU, steps);
    assert_eq!(
        drain(&fake, &*clock, Duration::ZERO, GPU, &rule())
            .unwrap()
            .took_ns,
        2_000_000_000
    );
    // A sample that starts before the deadline but ends after it does not count.
    let (clock, fake) = setup();
    let mut steps = vec![Step::with(|s| s.utilisation = 1); 18];
    steps.extend([
        Step::idle(),
        Step::idle(),
        Step::idle().taking(Duration::from_millis(1)),
    ]);
    fake.script(GPU, steps);
    assert!(matches!(
        drain(&fake, &*clock, Duration::ZERO, GPU, &rule()),
        Err(DrainError::NotDrained { .. })
    ));
    // A GPU the host does not have never drains.
    let (clock, fake) = setup();
    let e = drain(&fake, &*clock, Duration::ZERO, "GPU-absent", &rule()).unwrap_err();
    assert!(e.to_string().contains("no GPU GPU-absent"), "{e}");
}

#[test]
fn the_fake_reports_a_missing_or_unreadable_configuration() {
    let (_, fake) = setup();
    assert!(matches!(
        crate::Gpus::config(&fake, "GPU-absent"),
        Err(crate::DeviceError::Missing { .. })
    ));
    fake.config_of(GPU, None);
    assert!(matches!(
        crate::Gpus::config(&fake, GPU),
        Err(crate::DeviceError::Unreadable { .. })
    ));
}

/// The real seam on a host without that GPU (this one has no driver at all; a GPU host has no
/// GPU of this made-up UUID): an error naming why, never a guard that reads nothing.
#[test]
fn nvml_for_a_gpu_the_host_does_not_have_is_an_error() {
    match crate::nvml::Nvml::open(&["GPU-00000000-0000-0000-0000-000000000000".to_owned()]) {
        Err(crate::DeviceError::Unavailable { why }) => assert!(!why.is_empty()),
        Err(crate::DeviceError::Missing { uuid, .. }) => {
            assert_eq!(uuid, "GPU-00000000-0000-0000-0000-000000000000");
        }
        other => panic!("{other:?}"),
    }
}
