use std::sync::Arc;

use cordon_device::fake::{Fake, FakeClock, Step, pinned_config};

use super::*;

const A: &str = "GPU-0e3f6a52-1111-4c2c-9d41-000000000001";
const B: &str = "GPU-0e3f6a52-1111-4c2c-9d41-000000000002";

/// The shipped policy with one GPU on each lane, pinned as the fake's, and a guard.
fn gpu_policy() -> Policy {
    let pin = |uuid: &str| {
        format!(
            " {{\n    gpu \"{uuid}\" {{\n        driver \"550.54.15\"\n        persistence #true\n        compute-mode \"exclusive-process\"\n        application-clocks graphics=1980 memory=2619\n        power-limit \"700W\"\n        ecc #true\n        mig #false\n    }}\n}}"
        )
    };
    let text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    let text = cordon_testkit::replace_once(
        &text,
        "physical-lane \"a\" cpuset=\"0\" cpu-shares=262144",
        &format!(
            "physical-lane \"a\" cpuset=\"0\" cpu-shares=262144{}",
            pin(A)
        ),
    );
    let text = cordon_testkit::replace_once(
        &text,
        "physical-lane \"b\" cpuset=\"1\" cpu-shares=262144",
        &format!(
            "physical-lane \"b\" cpuset=\"1\" cpu-shares=262144{}\ndevice-guard {{\n    drain samples=3 interval=\"100ms\" sample-timeout=\"50ms\" timeout=\"2s\" idle-memory=\"600MiB\"\n    envelope \"hw-slowdown\" max-temperature=85 max-power=\"700W\" min-graphics-clock=1700\n}}",
            pin(B)
        ),
    );
    cordon_policy_lang::parse("t.kdl", &text).unwrap()
}

fn host() -> (Arc<FakeClock>, Fake) {
    let clock = Arc::new(FakeClock::default());
    let fake = Fake::new(clock.clone());
    fake.config_of(A, Some(pinned_config()))
        .config_of(B, Some(pinned_config()));
    (clock, fake)
}

#[test]
fn every_lane_gpu_is_read_compared_and_drained() {
    let p = gpu_policy();
    assert_eq!(named(&p), [("a".into(), A.into()), ("b".into(), B.into())]);
    let (clock, fake) = host();
    let (r, ok) = report(&p, &fake, &*clock, true);
    assert!(ok, "{r:#}");
    assert_eq!(r["gpus"][0]["drift"], json!([]));
    assert_eq!(r["gpus"][1]["drain"]["drained"]["read"], json!([3, 0]));
    assert_eq!(exit(ok), ExitCode::Ok);
    // Without --drain, no drain.
    let (r, ok) = report(&p, &fake, &*clock, false);
    assert!(ok && r["gpus"][0].get("drain").is_none(), "{r:#}");
}

#[test]
fn a_drifted_unreadable_or_busy_gpu_fails_the_report() {
    let p = gpu_policy();
    // Drifted: the power limit lowered.
    let (clock, fake) = host();
    let mut low = pinned_config();
    low.power_limit_mw = 350_000;
    fake.config_of(B, Some(low));
    let (r, ok) = report(&p, &fake, &*clock, false);
    assert!(!ok);
    assert_eq!(
        r["gpus"][1]["drift"],
        json!(["power limit 350000 mW, not 700000"])
    );
    assert_eq!(exit(ok), ExitCode::NoDecision);
    // Unreadable configuration; a sample that cannot be read.
    let (clock, fake) = host();
    fake.config_of(A, None).script(B, [Step::failing()]);
    let (r, ok) = report(&p, &fake, &*clock, false);
    assert!(!ok);
    assert!(r["gpus"][0]["config"]["unreadable"].is_string(), "{r:#}");
    assert!(r["gpus"][1]["sample"]["unreadable"].is_string(), "{r:#}");
    // Busy forever: the drain fails, naming why.
    let (clock, fake) = host();
    fake.script(A, [Step::with(|s| s.processes = vec![4242])]);
    let (r, ok) = report(&p, &fake, &*clock, true);
    assert!(!ok);
    let failed = r["gpus"][0]["drain"]["failed"].as_str().unwrap();
    assert!(failed.contains("processes [4242]"), "{failed}");
}
