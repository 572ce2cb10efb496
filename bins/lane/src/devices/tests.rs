use std::sync::Arc;

use cordon_device::fake::{Fake, FakeClock, Step, pinned_config};

use super::*;

const A: &str = cordon_testkit::LANE_GPUS[0];
const B: &str = cordon_testkit::LANE_GPUS[1];

/// The shipped policy with one GPU on each lane, pinned as the fake's, and a guard.
fn gpu_policy() -> Policy {
    let text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    cordon_policy_lang::parse("t.kdl", &cordon_testkit::with_gpu_lanes(&text)).unwrap()
}

/// A JSON CDI spec naming both lane GPUs, with the hook the policy allows.
fn spec() -> Vec<u8> {
    cordon_testkit::cdi_spec().into_bytes()
}

/// The host's NVIDIA nodes as the test spec names them: /dev/nvidiaN is 195:N.
fn nvidia(path: &std::path::Path) -> Option<(u64, u64)> {
    let n = path.to_str()?.strip_prefix("/dev/nvidia")?.parse().ok()?;
    Some((195, n))
}

/// The report with `spec` as the host's one CDI spec.
fn with_spec(
    p: &Policy,
    spec: &[u8],
    fake: &Fake,
    clock: &FakeClock,
    drained: bool,
) -> (Value, bool) {
    report(
        p,
        &[(std::path::Path::new("/etc/cdi/nvidia.json"), spec)],
        fake,
        clock,
        (drained, &nvidia),
    )
}

fn host() -> (Arc<FakeClock>, Fake) {
    let clock = Arc::new(FakeClock::default());
    let fake = Fake::new(clock.clone());
    fake.config_of(A, Some(pinned_config()))
        .config_of(B, Some(pinned_config()))
        .minor_of(A, Some(0))
        .minor_of(B, Some(1));
    (clock, fake)
}

#[test]
fn every_lane_gpu_is_read_compared_and_drained() {
    let p = gpu_policy();
    assert_eq!(named(&p), [("a".into(), A.into()), ("b".into(), B.into())]);
    let (clock, fake) = host();
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, true);
    assert!(ok, "{r:#}");
    assert_eq!(r["gpus"][0]["drift"], json!([]));
    assert_eq!(r["gpus"][1]["cdi"]["nodes"][2]["path"], "/dev/nvidia1");
    // Each lane's devices together, as a session applies them.
    assert_eq!(r["lanes"][1]["lane"], "b");
    assert_eq!(
        r["lanes"][1]["cdi"]["applied"]["devices"],
        json!([format!("nvidia.com/gpu={B}")])
    );
    assert_eq!(r["lanes"][1]["cdi"]["nodes"], "the lane's GPUs");
    assert_eq!(r["gpus"][1]["drain"]["drained"]["read"], json!([3, 0]));
    assert_eq!(exit(ok), ExitCode::Ok);
    // A spec whose node for lane b's GPU is not the one the driver gives its UUID.
    fake.minor_of(B, Some(7));
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, false);
    assert!(!ok);
    let refused = r["lanes"][1]["cdi"]["nodes"]["refused"].as_str().unwrap();
    assert!(
        refused.contains("are 195:[1], and the lane's GPUs are 195:[7]"),
        "{refused}"
    );
    fake.minor_of(B, Some(1));
    // Without --drain, no drain.
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, false);
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
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, false);
    assert!(!ok);
    assert_eq!(
        r["gpus"][1]["drift"],
        json!(["power limit 350000 mW, not 700000"])
    );
    assert_eq!(exit(ok), ExitCode::NoDecision);
    // Unreadable configuration; a sample that cannot be read.
    let (clock, fake) = host();
    fake.config_of(A, None).script(B, [Step::failing()]);
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, false);
    assert!(!ok);
    assert!(r["gpus"][0]["config"]["unreadable"].is_string(), "{r:#}");
    assert!(r["gpus"][1]["sample"]["unreadable"].is_string(), "{r:#}");
    // A sample with a fault in it, even without --drain.
    let (clock, fake) = host();
    fake.script(B, [Step::with(|s| s.xid = vec![79])]);
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, false);
    assert!(!ok);
    assert_eq!(r["gpus"][1]["faults"], json!(["Xid events [79]"]));
    // A GPU no spec names, a spec with a hook the policy does not allow.
    let (clock, fake) = host();
    let (r, ok) = report(&p, &[], &fake, &*clock, (false, &nvidia));
    assert!(!ok);
    assert!(
        r["gpus"][0]["cdi"]["refused"]
            .as_str()
            .unwrap()
            .contains("no spec"),
        "{r:#}"
    );
    let other = String::from_utf8(spec())
        .unwrap()
        .replace("/usr/bin/nvidia-cdi-hook", "/usr/bin/other-hook");
    let (r, ok) = with_spec(&p, other.as_bytes(), &fake, &clock, false);
    assert!(!ok);
    assert!(
        r["gpus"][1]["cdi"]["refused"]
            .as_str()
            .unwrap()
            .contains("other-hook"),
        "{r:#}"
    );
    // Busy forever: the drain fails, naming why.
    let (clock, fake) = host();
    fake.script(A, [Step::with(|s| s.processes = vec![4242])]);
    let (r, ok) = with_spec(&p, &spec(), &fake, &clock, true);
    assert!(!ok);
    let failed = r["gpus"][0]["drain"]["failed"].as_str().unwrap();
    assert!(failed.contains("processes [4242]"), "{failed}");
}
