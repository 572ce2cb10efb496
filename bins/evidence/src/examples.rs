//! One exact receipt of every stage, built from typed inputs and outputs on fixed host facts and
//! a fixed clock: what the receipt goldens (`tests/goldens.rs`) pin, and the material of
//! `cordon-verify`'s replay tests. Pure: no store, no clock, no host read.

use cordon_canon::Digest;

use crate::inputs::{
    EgressConnection, FetchInputs, LaneInputs, MaterializeInputs, PrebuildInputs, QualifyInputs,
    ReapInputs, StageInputs, SurfaceInputs, SurfaceOutputs, Tier, UserMapping,
};
use crate::qualify::{Frozen, Orientation, QualifyOutputs, Reads, speed_policy_digest};
use crate::receipt::{
    DevicePhase, DeviceReceipt, DeviceReceipts, FetchOutputs, Host, IncumbentOutputs,
    LaneAssignment, LaneOutputs, LanePhase, LaneWindow, LockSpan, MaterializeOutputs, Meta,
    Outcome, PrebuildOutputs, Reason, Receipt, Role, StageName, StageOutputs,
};
use crate::residue::ReapOutputs;
use crate::speed::{self, Speed};

/// The fixed clock of every example.
pub const AT: &str = "2026-01-02T03:04:05.678Z";

/// The fixed authority of every example.
#[must_use]
pub fn authority() -> Digest {
    Digest::of_bytes(b"authority")
}

/// The fixed host of every example.
#[must_use]
pub fn host() -> Host {
    Host {
        hostname: "evaluator".into(),
        kernel: "6.1.0".into(),
    }
}

/// A receipt of `stage` with `inputs` and `outputs`, after `prev`, on the fixed facts.
///
/// # Panics
/// Never for the example types (they always serialize).
#[must_use]
pub fn receipt<I: StageInputs, O: StageOutputs>(
    prev: Option<Digest>,
    inputs: &I,
    outputs: &O,
) -> Receipt {
    let mut r = Receipt::at(O::STAGE, authority(), Outcome::Ok, host(), AT);
    r.prev = prev;
    #[allow(clippy::expect_used)]
    {
        r.set_inputs(inputs).expect("example inputs serialize");
        r.set_outputs(outputs).expect("example outputs serialize");
    }
    r
}

/// A GPU's configuration the examples pin: an H100's usual one.
#[must_use]
pub fn device_config() -> crate::device::DeviceConfig {
    crate::device::DeviceConfig {
        driver: "550.54.15".to_owned(),
        persistence: true,
        compute_mode: crate::device::ComputeMode::ExclusiveProcess,
        application_clocks: (1980, 2619),
        power_limit_mw: 700_000,
        ecc: (true, true),
        mig: (false, false),
    }
}

/// An idle GPU's sample: nothing running, 500 MiB the driver's, cool and quiet.
#[must_use]
pub fn idle_sample() -> crate::device::Sample {
    crate::device::Sample {
        at_ns: 0,
        utilisation: 0,
        memory_utilisation: 0,
        memory_used: 500 << 20,
        processes: Vec::new(),
        temperature_c: 35,
        clocks: (1980, 2619),
        power_mw: 70_000,
        throttle: 0x1,
        xid: Vec::new(),
        retirement_pending: false,
    }
}

/// A speed section every example qualification is decided under.
#[must_use]
pub fn speed_section() -> Speed {
    Speed {
        min_margin_bp: 500,
        noise_multiplier_bp: 30_000,
        max_noise_bp: 1_000,
        min_timed_windows: 4,
        max_window_scatter_bp: 100_000,
        max_conditioning_slowdown_bp: 15_000,
    }
}

/// Five windows (one warm-up) of `ms` each, ten tokens apiece.
#[must_use]
pub fn windows(ms: u64) -> Vec<LaneWindow> {
    (0..5)
        .map(|i| LaneWindow {
            index: i,
            phase: if i == 0 {
                LanePhase::Warmup
            } else {
                LanePhase::Timed
            },
            tokens: 10,
            sent_ns: u64::from(i) * ms * 1_000_000,
            received_ns: (u64::from(i) + 1) * ms * 1_000_000,
        })
        .collect()
}

/// A lane session of `role` on `tree` and `publication` whose windows take `ms` each.
#[must_use]
pub fn session(role: Role, tree: Digest, publication: Digest, ms: u64) -> LaneOutputs {
    let device = |seq, phase| DeviceReceipt {
        launch: "lease".into(),
        seq,
        phase,
        at_ns: u64::from(seq),
        gpus: Vec::new(),
        cpuset: None,
        quiescent: None,
        config: Vec::new(),
        samples: Vec::new(),
        note: String::new(),
    };
    LaneOutputs {
        role,
        tree,
        publication,
        model: Digest::of_bytes(b"model"),
        workload: Digest::of_bytes(b"workload"),
        worker: Digest::of_bytes(b"worker"),
        posture: Digest::of_bytes(b"posture"),
        step: "serve".into(),
        ready_ns: 0,
        windows: windows(ms),
        outputs: Digest::of_bytes(b"tokens"),
        timed_rate_milli: 0,
        meta: Meta {
            exit_code: Some(0),
            ..Meta::default()
        },
        lease: "lease".into(),
        launch: Digest::of_bytes(b"launch"),
        lane: None,
        devices: DeviceReceipts {
            pre: device(0, DevicePhase::Pre),
            active: device(1, DevicePhase::Active),
            post: device(2, DevicePhase::Post),
        },
        gpu_lock: LockSpan {
            waited_ns: 0,
            from_unix_ns: 0,
            until_unix_ns: 0,
        },
    }
}

/// A qualification of the sessions `sessions` (stored as `digests`), decided by the speed rule.
///
/// # Panics
/// Never: the example speed section always encodes.
#[must_use]
pub fn qualification(sessions: &Reads<LaneOutputs>, digests: Reads<Digest>) -> QualifyOutputs {
    let assignment = |name: &str| LaneAssignment {
        name: name.into(),
        cpuset: "0".into(),
        cpu_shares: None,
    };
    let (b, c, b2) = (&sessions.b, &sessions.c, &sessions.b2);
    #[allow(clippy::expect_used)]
    let speed_policy = speed_policy_digest(&speed_section()).expect("the example section encodes");
    QualifyOutputs {
        sessions: digests,
        orientation: Orientation {
            baseline: assignment("a"),
            candidate: assignment("b"),
        },
        reproduces: None,
        launch: Digest::of_bytes(b"launch"),
        gpu_lock: b.gpu_lock.clone(),
        outputs: Reads {
            b: b.outputs,
            c: c.outputs,
            b2: b2.outputs,
        },
        frozen: Frozen {
            kernel_release: "6.1".into(),
            gpu_driver: None,
            cdi_spec: None,
            device_policy: Digest::of_bytes(b"devices"),
        },
        speed_policy,
        speed_section: speed_section(),
        workload: b.workload,
        model: b.model,
        windows: Reads {
            b: b.windows.clone(),
            c: c.windows.clone(),
            b2: b2.windows.clone(),
        },
        devices: Reads {
            b: b.devices.clone(),
            c: c.devices.clone(),
            b2: b2.devices.clone(),
        },
        speed: speed::decide(&speed_section(), &b.windows, &c.windows, &b2.windows),
        guard: None,
        settling: false,
        non_settling: crate::qualify::unsettled(
            None,
            [
                ("B", "a", &b.devices),
                ("C", "b", &c.devices),
                ("B′", "a", &b2.devices),
            ],
        ),
        settlement: None,
    }
}

/// The candidate's audit after `qualify`: two workload requests, drawn by the host, untimed.
fn audit(qualify: &Receipt, c: &LaneOutputs) -> Receipt {
    let d = |s: &[u8]| Digest::of_bytes(s);
    #[allow(clippy::expect_used)]
    let digest = |r: &Receipt| r.digest().expect("an example receipt encodes");
    receipt(
        Some(digest(qualify)),
        &crate::audit::AuditInputs {
            qualify: digest(qualify),
            tree: c.tree,
            publication: c.publication,
            workload: "/srv/workload.json".into(),
            model: "/srv/model".into(),
            sample: vec![3, 1],
            plan: d(b"audit plan"),
        },
        &crate::audit::AuditOutputs {
            tree: c.tree,
            publication: c.publication,
            model: c.model,
            plan: d(b"audit plan"),
            worker: c.worker,
            posture: c.posture,
            step: c.step.clone(),
            sample: vec![3, 1],
            outputs: d(b"audit outputs"),
            meta: c.meta.clone(),
            lease: "audit lease".into(),
            launch: c.launch,
            devices: c.devices.clone(),
        },
    )
}

/// The referee after `qualify`: the candidate's audit, the quiescence receipt naming B, C, B′
/// and the audit gone, the reference session T, and the final verdict (PASS: every read and
/// the audit agree with T exactly).
fn referee(
    qualify: &Receipt,
    sessions: &Reads<LaneOutputs>,
) -> (Receipt, Receipt, Receipt, Receipt) {
    let d = |s: &[u8]| Digest::of_bytes(s);
    #[allow(clippy::expect_used)]
    let digest = |r: &Receipt| r.digest().expect("an example receipt encodes");
    let gone = |read: &str, o: &LaneOutputs| crate::verdict::Gone {
        read: read.into(),
        lease: o.lease.clone(),
        post: d(read.as_bytes()),
    };
    let quiescence = receipt(
        None,
        &check_inputs(),
        &ReapOutputs {
            quiescent: true,
            released: None,
            active: Some(Vec::new()),
            remaining: Vec::new(),
            gone: vec![
                gone("B", &sessions.b),
                gone("C", &sessions.c),
                gone("B′", &sessions.b2),
                crate::verdict::Gone {
                    read: "A".into(),
                    lease: "audit lease".into(),
                    post: d(b"A"),
                },
            ],
            ..ReapOutputs::default()
        },
    );
    let b = &sessions.b;
    let reference = receipt(
        Some(digest(qualify)),
        &crate::verdict::ReferenceInputs {
            pristine: d(b"pristine registration"),
            tree: d(b"pristine tree"),
            publication: d(b"control-only publication"),
            workload: "/srv/workload.json".into(),
            model: "/srv/model".into(),
            quiescence: digest(&quiescence),
        },
        &crate::verdict::ReferenceOutputs {
            tree: d(b"pristine tree"),
            publication: d(b"control-only publication"),
            model: b.model,
            workload: b.workload,
            worker: b.worker,
            posture: d(b"reference posture"),
            step: "serve-reference".into(),
            requests: b.windows.len() as u64,
            outputs: b.outputs,
            meta: b.meta.clone(),
            lease: "reference lease".into(),
            launch: d(b"reference launch"),
            devices: b.devices.clone(),
            quiescence: digest(&quiescence),
        },
    );
    let rule = crate::quality::Quality {
        min_exact_bp: 10_000,
        min_prefix_bp: 10_000,
    };
    let tokens = vec![vec![1, 2, 3]; b.windows.len()];
    let graded = Reads {
        b: crate::quality::grade(&rule, &tokens, &tokens),
        c: crate::quality::grade(&rule, &tokens, &tokens),
        b2: crate::quality::grade(&rule, &tokens, &tokens),
    };
    #[allow(clippy::expect_used)]
    let q = qualify
        .outputs_as::<QualifyOutputs>()
        .expect("the example qualification reads back");
    #[allow(clippy::expect_used)]
    let audit = audit(qualify, &sessions.c);
    let sample = vec![3, 1];
    #[allow(clippy::expect_used)]
    let outcome = crate::audit::AuditOutcome::Served {
        outputs: d(b"audit outputs"),
        graded: crate::audit::regrade(&rule, &tokens, &sample, &vec![vec![1, 2, 3]; 2])
            .expect("the example samples requests T answered"),
    };
    #[allow(clippy::expect_used)]
    let (verdict, code, reason) = crate::verdict::decide(
        &q.speed,
        &graded,
        Some(&outcome),
        crate::verdict::Pairing::default(),
    )
    .expect("the example incumbent agrees with T");
    let outputs = crate::verdict::VerdictOutputs {
        qualify: digest(qualify),
        reference: digest(&reference),
        quiescence: digest(&quiescence),
        speed: q.speed.clone(),
        #[allow(clippy::expect_used)]
        quality_policy: crate::verdict::quality_policy_digest(&rule).expect("the rule encodes"),
        quality_section: rule,
        reference_outputs: b.outputs,
        outputs: q.outputs.clone(),
        graded,
        audit_section: Some(crate::audit::Audit { requests: 2 }),
        audit: Some(crate::audit::AuditRecord {
            receipt: digest(&audit),
            sample,
            outcome,
        }),
        reproduction_required: false,
        primary: None,
        settling: q.settling,
        non_settling: q.non_settling,
        verdict,
        code,
        reason,
    };
    let verdict = receipt(
        Some(digest(qualify)),
        &crate::verdict::VerdictInputs {
            qualify: digest(qualify),
            pristine: d(b"pristine registration"),
            audit: Some(digest(&audit)),
            quiescence: Some(digest(&quiescence)),
            reference: Some(digest(&reference)),
        },
        &outputs,
    );
    (audit, quiescence, reference, verdict)
}

/// What `cordon-reap --check` of the example executor is asked (the referee's gate records the
/// same).
fn check_inputs() -> ReapInputs {
    ReapInputs {
        executor: "evaluator".into(),
        check: true,
        status: false,
        sweep: false,
        surface_state: None,
        ..ReapInputs::default()
    }
}

/// `cordon-reap --check` on a quiescent executor.
fn reap_example() -> Receipt {
    receipt(
        None,
        &check_inputs(),
        &ReapOutputs {
            quiescent: true,
            released: Some(Vec::new()),
            active: Some(Vec::new()),
            remaining: Vec::new(),
            gone: Vec::new(),
            ..ReapOutputs::default()
        },
    )
}

/// `cordon-reap --surface --sweep` that released one run of a dead supervisor.
fn surface_reap_example() -> Receipt {
    receipt(
        None,
        &ReapInputs {
            executor: "agent-surface".into(),
            check: false,
            status: false,
            sweep: true,
            surface_state: Some("/var/lib/cordon-agent/surface".into()),
            ..ReapInputs::default()
        },
        &ReapOutputs {
            quiescent: true,
            released: Some(vec!["cs-0123456789abcdef0123".into()]),
            active: Some(Vec::new()),
            remaining: Vec::new(),
            gone: Vec::new(),
            ..ReapOutputs::default()
        },
    )
}

/// One command run on the surface.
fn surface_example() -> Receipt {
    let d = |s: &[u8]| Digest::of_bytes(s);
    receipt(
        None,
        &SurfaceInputs {
            workspace: "/srv/ws/run-1".into(),
            tier: Tier::Command,
            argv: vec!["/bin/sh".into(), "-c".into(), "make test".into()],
            skills: vec![format!("review@{}", d(b"skill"))],
        },
        &SurfaceOutputs {
            run: "run-1".into(),
            tier: Tier::Command,
            workspace: "/srv/ws/run-1".into(),
            workspace_dest: "/workspace".into(),
            surface_policy: d(b"surface section"),
            read_set: vec!["/usr".into()],
            env_names: vec!["HOME".into(), "PATH".into()],
            network: "egress".into(),
            user: UserMapping {
                host_uid: 990,
                host_gid: 990,
                mapped: 1,
            },
            argv: vec!["/bin/sh".into(), "-c".into(), "make test".into()],
            meta: Meta {
                exit_code: Some(0),
                ..Meta::default()
            },
            stdout: "ok\n".into(),
            stderr: String::new(),
            egress: vec![
                EgressConnection {
                    domain: "pypi.org".into(),
                    port: 443,
                    verdict: "allowed".into(),
                    address: Some("151.101.0.223:443".into()),
                    bytes_out: 517,
                    bytes_in: 4096,
                },
                EgressConnection {
                    domain: "exfil.example".into(),
                    port: 443,
                    verdict: "refused: not an allowed domain".into(),
                    address: None,
                    bytes_out: 0,
                    bytes_in: 0,
                },
            ],
            egress_unrecorded: 0,
        },
    )
}

/// The non-ok shapes: a rejected fetch, the pass-on of it, a no-decision prebuild.
fn non_ok(fetch: &Receipt, prebuild: &Receipt) -> [Receipt; 3] {
    #[allow(clippy::expect_used)]
    let digest = |r: &Receipt| r.digest().expect("an example receipt encodes");
    let mut rejected = fetch.clone();
    rejected.outcome = Outcome::Rejected;
    rejected.outputs = serde_json::json!({});
    rejected.reasons.push(Reason {
        code: "intake.digest".into(),
        message: "the archive is not the one named".into(),
    });
    let pass_on = {
        let mut r = Receipt::pass_on(StageName::Materialize, &rejected, digest(&rejected));
        (r.host, r.started_at, r.finished_at) = (host(), AT.into(), AT.into());
        r
    };
    let mut no_decision = prebuild.clone();
    no_decision.outcome = Outcome::NoDecision;
    no_decision.outputs = serde_json::json!({});
    no_decision.reasons.push(Reason {
        code: "receipt.interrupted".into(),
        message: "SIGTERM received: the run was stopped before its result was established".into(),
    });
    // What the host kept of the run before its release took it apart.
    no_decision.evidence = [
        "bundle",
        "lease-record",
        "runtime-state",
        "cgroup-events",
        "stderr",
    ]
    .iter()
    .map(|name| crate::receipt::Evidence {
        name: (*name).into(),
        sha256: Digest::of_bytes(name.as_bytes()),
        bytes: 64,
    })
    .collect();
    [rejected, pass_on, no_decision]
}

/// One receipt of every stage and shape, by name: intake, a delta, an incumbent's
/// registration, both prebuilds, a session, a qualification, reap, a surface run, a pass-on
/// and a no-decision.
///
/// # Panics
/// Never for the example types.
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn every_stage() -> Vec<(&'static str, Receipt)> {
    let d = |s: &[u8]| Digest::of_bytes(s);
    #[allow(clippy::expect_used)]
    let digest = |r: &Receipt| r.digest().expect("an example receipt encodes");
    let fetch = receipt(
        None,
        &FetchInputs {
            source: "/srv/candidates/c.tar".into(),
            sha256: d(b"archive"),
        },
        &FetchOutputs {
            archive_sha256: d(b"archive"),
            content_digest: d(b"content"),
            files: 3,
            bytes: 4096,
        },
    );
    let materialize = receipt(
        Some(digest(&fetch)),
        &MaterializeInputs::Delta {
            incumbent: d(b"incumbent tree"),
            delta: d(b"content"),
        },
        &MaterializeOutputs {
            tree_digest: d(b"candidate tree"),
            delta_digest: d(b"delta"),
            incumbent: d(b"incumbent tree"),
            target: "attention".into(),
            namespace: None,
            step: Some("build-native".into()),
            findings: Vec::new(),
        },
    );
    let registration = receipt(
        None,
        &MaterializeInputs::Incumbent {
            incumbent_dir: "/srv/incumbent".into(),
        },
        &IncumbentOutputs {
            tree_digest: d(b"incumbent tree"),
            incumbent: "engine".into(),
            step: Some("build-native".into()),
            files: 10,
            bytes: 65_536,
        },
    );
    let built = |prev: &Receipt, tree: &[u8], publication: &[u8]| {
        receipt(
            Some(digest(prev)),
            &PrebuildInputs {
                tree: d(tree),
                step: Some("build-native".into()),
            },
            &PrebuildOutputs {
                publication: d(publication),
                files: 1,
                bytes: 2,
                cached: false,
                meta: None,
            },
        )
    };
    let prebuild_b = built(&registration, b"incumbent tree", b"incumbent publication");
    let prebuild_c = built(&materialize, b"candidate tree", b"candidate publication");
    let read = |prev: &Receipt, name: &str, o: &LaneOutputs| {
        receipt(
            Some(digest(prev)),
            &LaneInputs {
                role: o.role,
                read: Some(name.into()),
                tree: o.tree,
                publication: o.publication,
                workload: "/srv/workload.json".into(),
                model: "/srv/model".into(),
                lane: None,
            },
            o,
        )
    };
    let sessions = Reads {
        b: session(
            Role::B,
            d(b"incumbent tree"),
            d(b"incumbent publication"),
            40,
        ),
        c: session(
            Role::C,
            d(b"candidate tree"),
            d(b"candidate publication"),
            20,
        ),
        b2: session(
            Role::B,
            d(b"incumbent tree"),
            d(b"incumbent publication"),
            40,
        ),
    };
    let (lane_b, lane_c, lane_b2) = (
        read(&prebuild_b, "B", &sessions.b),
        read(&prebuild_c, "C", &sessions.c),
        read(&prebuild_b, "B′", &sessions.b2),
    );
    let qualify = receipt(
        Some(digest(&prebuild_c)),
        &QualifyInputs {
            incumbent: digest(&prebuild_b),
            candidate: digest(&prebuild_c),
            workload: "/srv/workload.json".into(),
            model: "/srv/model".into(),
            reproduces: None,
        },
        &qualification(
            &sessions,
            Reads {
                b: digest(&lane_b),
                c: digest(&lane_c),
                b2: digest(&lane_b2),
            },
        ),
    );
    let (audit, quiescence, reference, verdict) = referee(&qualify, &sessions);
    let [rejected, pass_on, no_decision] = non_ok(&fetch, &prebuild_c);
    vec![
        ("fetch", fetch),
        ("materialize-delta", materialize),
        ("materialize-incumbent", registration),
        ("prebuild-incumbent", prebuild_b),
        ("prebuild-candidate", prebuild_c),
        ("lane-read-c", lane_c),
        ("qualify", qualify),
        ("audit", audit),
        ("reap-quiescence", quiescence),
        ("reference", reference),
        ("verdict", verdict),
        ("reap", reap_example()),
        ("reap-surface", surface_reap_example()),
        ("surface", surface_example()),
        ("fetch-rejected", rejected),
        ("materialize-pass-on", pass_on),
        ("prebuild-no-decision", no_decision),
    ]
}
