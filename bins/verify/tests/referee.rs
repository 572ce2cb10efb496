//! The offline replay of a final verdict: the qualification chain of `common`, then the
//! candidate's audit, the quiescence receipt, the pristine registration, T and the final verdict,
//! each stored and signed through the one path every stage uses — and each way of tampering
//! with what the verdict rests on: an edited outputs object, a quality rule edited under its
//! digest, grades or an audit that do not recompute, another authority's qualification, and an
//! audit receipt offered as speed evidence. Every one is caught, with its own message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon::canonical::Digest;
use cordon::keyset::KeySet;
use cordon::receipt::{
    IncumbentOutputs, LaneOutputs, Outcome, Receipt, Rejection, StageName, StageOutputs,
};
use cordon::residue::ReapOutputs;
use cordon::signing::HostKey;
use cordon::tree::{self, PUBLICATIONS, TREES};
use cordon_evidence::audit::{
    Audit, AuditInputs, AuditOutcome, AuditOutputs, AuditRecord, regrade,
};
use cordon_evidence::examples;
use cordon_evidence::inputs::ReapInputs;
use cordon_evidence::qualify::{QualifyOutputs, Reads};
use cordon_evidence::quality::{Quality, grade};
use cordon_evidence::verdict::{
    self, Final, ReferenceInputs, ReferenceOutputs, VerdictInputs, VerdictOutputs,
};
use cordon_verify::{VerifyError, export, verify};
use serde_json::json;

mod common;

use common::{AUTHORITY, Chain, chain_with, emit, keys, publish};

const EXACT: Quality = Quality {
    min_exact_bp: 10_000,
    min_prefix_bp: 10_000,
};

/// How the candidate's audit went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Audited {
    /// It answered the sampled requests as T did.
    Right,
    /// It answered one sampled request wrongly.
    Wrong,
    /// It broke its session.
    Broke,
}

/// The referee's receipts over a chain: their digests and the verdict's outputs.
struct Referee {
    audit: Digest,
    reference: Digest,
    verdict: Digest,
    inputs: VerdictInputs,
    outputs: VerdictOutputs,
}

fn tokens(first: u32) -> Vec<Vec<u32>> {
    (0..5).map(|i| vec![first + i; 3]).collect()
}

fn object(c: &Chain, t: &[Vec<u32>]) -> Digest {
    c.store
        .put_object(&cordon_evidence::outputs::encode(t).unwrap())
        .unwrap()
}

/// Store and sign `r` as it is (any outcome); its digest.
fn sign(c: &Chain, r: &Receipt) -> Digest {
    HostKey::load_or_create(&keys(&c.store))
        .unwrap()
        .store_receipt(&c.store, r)
        .unwrap()
        .0
}

fn emit_as<T: StageOutputs>(
    c: &Chain,
    stage: StageName,
    prev: Option<Digest>,
    inputs: serde_json::Value,
    outputs: &T,
) -> Digest {
    emit(
        &c.store,
        stage,
        Digest::of_bytes(AUTHORITY),
        prev,
        inputs,
        outputs,
    )
}

/// The candidate's audit of requests 3 and 1, as `how` says.
fn audit(c: &Chain, how: Audited) -> (Digest, Option<Digest>) {
    let lane = cordon::chain::load(&c.store, &c.qualify.sessions.c)
        .unwrap()
        .outputs_as::<LaneOutputs>()
        .unwrap();
    let sample = vec![3, 1];
    let plan = c.store.put_object(b"{\"version\":1}").unwrap();
    let inputs = AuditInputs {
        qualify: c.head,
        tree: lane.tree,
        publication: lane.publication,
        workload: "/srv/workload.json".into(),
        model: "/srv/model".into(),
        sample: sample.clone(),
        plan,
    };
    if how == Audited::Broke {
        let mut r = Receipt::new(
            StageName::Audit,
            Digest::of_bytes(AUTHORITY),
            Outcome::Rejected,
        );
        r.prev = Some(c.head);
        r.set_inputs(&inputs).unwrap();
        r.reasons = Rejection::one("lane.exit", "the engine exited".into(), json!({})).findings;
        return (sign(c, &r), None);
    }
    let t = tokens(1);
    let mut answered: Vec<Vec<u32>> = sample.iter().map(|&i| t[i as usize].clone()).collect();
    if how == Audited::Wrong {
        answered[1][2] += 1;
    }
    let outputs = object(c, &answered);
    let o = AuditOutputs {
        tree: lane.tree,
        publication: lane.publication,
        model: lane.model,
        plan,
        worker: lane.worker,
        posture: lane.posture,
        step: lane.step.clone(),
        sample,
        outputs,
        meta: lane.meta.clone(),
        lease: "audit lease".into(),
        launch: lane.launch,
        devices: lane.devices,
    };
    (
        emit_as(c, StageName::Audit, Some(c.head), json!(inputs), &o),
        Some(outputs),
    )
}

/// The referee's receipts after `c`'s qualification, the audit going as `how` says.
fn referee(c: &Chain, how: Audited) -> Referee {
    let (audit, audit_outputs) = audit(c, how);
    let quiescence = emit_as(
        c,
        StageName::Reap,
        None,
        json!(ReapInputs {
            executor: "evaluator".into(),
            check: true,
            status: false,
            sweep: false,
            surface_state: None,
            ..ReapInputs::default()
        }),
        &ReapOutputs {
            quiescent: true,
            released: None,
            active: Some(Vec::new()),
            remaining: Vec::new(),
            gone: Vec::new(),
            ..ReapOutputs::default()
        },
    );
    let pristine = publish(&c.store, TREES, "pristine");
    let registration = emit_as(
        c,
        StageName::Materialize,
        None,
        json!({"incumbent_dir": "/srv/pristine"}),
        &IncumbentOutputs {
            tree_digest: pristine,
            incumbent: "pristine".into(),
            step: None,
            files: 1,
            bytes: 1,
        },
    );
    let control = tree::publish_in(&c.store, PUBLICATIONS, Vec::new(), json!({}))
        .unwrap()
        .digest;
    let t_outputs = object(c, &tokens(1));
    let b = examples::session(cordon::receipt::Role::B, pristine, control, 40);
    let reference = emit_as(
        c,
        StageName::Reference,
        Some(c.head),
        json!(ReferenceInputs {
            pristine: registration,
            tree: pristine,
            publication: control,
            workload: "/srv/workload.json".into(),
            model: "/srv/model".into(),
            quiescence,
        }),
        &ReferenceOutputs {
            tree: pristine,
            publication: control,
            model: b.model,
            workload: b.workload,
            worker: b.worker,
            posture: b.posture,
            step: "serve-reference".into(),
            requests: 5,
            outputs: t_outputs,
            meta: b.meta,
            lease: "reference lease".into(),
            launch: b.launch,
            devices: b.devices,
            quiescence,
        },
    );
    let q = &c.qualify;
    let t = tokens(1);
    let read = |d: &Digest| {
        let bytes = c.store.read_object_checked(d).unwrap();
        grade(
            &EXACT,
            &t,
            &cordon_evidence::outputs::decode(&bytes).unwrap(),
        )
    };
    let graded = Reads {
        b: read(&q.outputs.b),
        c: read(&q.outputs.c),
        b2: read(&q.outputs.b2),
    };
    let sample = vec![3, 1];
    let outcome = match audit_outputs {
        Some(outputs) => {
            let bytes = c.store.read_object_checked(&outputs).unwrap();
            let answered = cordon_evidence::outputs::decode(&bytes).unwrap();
            AuditOutcome::Served {
                outputs,
                graded: regrade(&EXACT, &t, &sample, &answered).unwrap(),
            }
        }
        None => AuditOutcome::Rejected {
            code: "lane.exit".into(),
            reason: "the engine exited".into(),
        },
    };
    let (v, code, reason) =
        verdict::decide(&q.speed, &graded, Some(&outcome), Default::default()).unwrap();
    let inputs = VerdictInputs {
        qualify: c.head,
        pristine: registration,
        audit: Some(audit),
        quiescence: Some(quiescence),
        reference: Some(reference),
    };
    let outputs = VerdictOutputs {
        qualify: c.head,
        reference,
        quiescence,
        speed: q.speed.clone(),
        quality_policy: verdict::quality_policy_digest(&EXACT).unwrap(),
        quality_section: EXACT,
        reference_outputs: t_outputs,
        outputs: q.outputs.clone(),
        graded,
        audit_section: Some(Audit { requests: 2 }),
        audit: Some(AuditRecord {
            receipt: audit,
            sample,
            outcome,
        }),
        reproduction_required: false,
        primary: None,
        settling: q.settling,
        non_settling: q.non_settling.clone(),
        verdict: v,
        code,
        reason,
    };
    let verdict = sign_verdict(c, &inputs, &outputs, Digest::of_bytes(AUTHORITY));
    Referee {
        audit,
        reference,
        verdict,
        inputs,
        outputs,
    }
}

/// A final verdict receipt of `outputs`, under `authority`, its outcome the verdict's.
fn sign_verdict(
    c: &Chain,
    inputs: &VerdictInputs,
    outputs: &VerdictOutputs,
    authority: Digest,
) -> Digest {
    let outcome = match outputs.verdict {
        Final::Pass => Outcome::Ok,
        Final::Fail => Outcome::Rejected,
    };
    let mut r = Receipt::new(StageName::Verdict, authority, outcome);
    r.prev = Some(c.head);
    r.set_inputs(inputs).unwrap();
    r.set_outputs(outputs).unwrap();
    sign(c, &r)
}

fn recompute_error(c: &Chain, head: &Digest) -> String {
    match verify(&c.store, head, &KeySet::single(&c.key)) {
        Err(VerifyError::Recompute { digest, why }) if digest == *head => why,
        other => panic!("expected the verdict not to recompute, got {other:?}"),
    }
}

#[test]
fn a_final_verdict_with_its_audit_verifies_here_and_from_its_export_alone() {
    let c = chain_with(1);
    let r = referee(&c, Audited::Right);
    assert_eq!(r.outputs.verdict, Final::Pass);
    let hops = verify(&c.store, &r.verdict, &KeySet::single(&c.key)).unwrap();
    let stages: Vec<StageName> = hops.iter().map(|h| h.receipt.stage).collect();
    for s in [
        StageName::Verdict,
        StageName::Audit,
        StageName::Reference,
        StageName::Reap,
        StageName::Qualify,
    ] {
        assert!(stages.contains(&s), "{s} is walked: {stages:?}");
    }
    let bundle = cordon::store::Store::open(&c.dir.path().join("bundle")).unwrap();
    export(&c.store, &r.verdict, &KeySet::single(&c.key), &bundle).unwrap();
    assert_eq!(
        verify(&bundle, &r.verdict, &KeySet::single(&c.key))
            .unwrap()
            .len(),
        hops.len()
    );
}

#[test]
fn an_audit_that_regrades_wrong_or_that_the_candidate_broke_is_a_fail_that_verifies() {
    let c = chain_with(1);
    let wrong = referee(&c, Audited::Wrong);
    assert_eq!(
        (wrong.outputs.verdict, wrong.outputs.code.as_str()),
        (Final::Fail, "audit.mismatch")
    );
    verify(&c.store, &wrong.verdict, &KeySet::single(&c.key)).unwrap();

    let broke = referee(&c, Audited::Broke);
    assert_eq!(broke.outputs.code, "audit.rejected");
    // The rejected audit receipt is rested on as the candidate's own failure.
    let hops = verify(&c.store, &broke.verdict, &KeySet::single(&c.key)).unwrap();
    assert!(hops.iter().any(|h| h.digest == broke.audit));

    // A PASS that says the audit served, over a rejected audit receipt: refused.
    let mut pass = wrong.outputs.clone();
    let served = referee(&c, Audited::Right).outputs;
    pass.audit = served.audit.map(|mut a| {
        a.receipt = broke.audit;
        a
    });
    (pass.verdict, pass.code, pass.reason) = (served.verdict, served.code, served.reason);
    let mut inputs = wrong.inputs.clone();
    inputs.audit = Some(broke.audit);
    let head = sign_verdict(&c, &inputs, &pass, Digest::of_bytes(AUTHORITY));
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("its audit"), "{e}");
}

#[test]
fn every_tampering_with_what_the_verdict_rests_on_is_caught() {
    let c = chain_with(1);
    let r = referee(&c, Audited::Right);
    let a = Digest::of_bytes(AUTHORITY);
    let resigned = |edit: &dyn Fn(&mut VerdictOutputs)| {
        let mut o = r.outputs.clone();
        edit(&mut o);
        sign_verdict(&c, &r.inputs, &o, a)
    };

    // The quality rule edited, its digest kept: refused, whatever the grades say.
    let head = resigned(&|o| o.quality_section.min_exact_bp = 0);
    assert!(
        recompute_error(&c, &head).contains("quality section"),
        "{head}"
    );
    // Grades that do not follow from the stored outputs.
    let head = resigned(&|o| o.graded.c.exact = 4);
    assert!(recompute_error(&c, &head).contains("grades do not recompute"));
    // An audit grade that does not follow from the audit's outputs.
    let head = resigned(&|o| {
        if let Some(AuditOutcome::Served { graded, .. }) = o.audit.as_mut().map(|a| &mut a.outcome)
        {
            graded.exact = 1;
        }
    });
    assert!(recompute_error(&c, &head).contains("audit's grade"));
    // An audit of fewer requests than its plan asks for.
    let head = resigned(&|o| o.audit_section = Some(Audit { requests: 3 }));
    assert!(recompute_error(&c, &head).contains("asks for 3"));
    // The audit dropped from a verdict whose plan asked for one.
    let head = resigned(&|o| o.audit = None);
    assert!(recompute_error(&c, &head).contains("audit"));

    // The audit's outputs object edited in place: it no longer hashes to its name.
    let Some(AuditOutcome::Served { outputs, .. }) = r.outputs.audit.as_ref().map(|a| &a.outcome)
    else {
        panic!("the audit served");
    };
    let path = c.store.object_path(outputs, false);
    let mut bytes = std::fs::read(&path).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let e = verify(&c.store, &r.verdict, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("outputs object"), "{e}");
}

#[test]
fn a_verdict_over_another_authoritys_qualification_and_an_audit_as_speed_evidence_are_refused() {
    let c = chain_with(1);
    let r = referee(&c, Audited::Right);
    // The same verdict, signed under another authority: its qualification is not its own.
    let head = sign_verdict(&c, &r.inputs, &r.outputs, Digest::of_bytes(b"another"));
    match verify(&c.store, &head, &KeySet::single(&c.key)) {
        Err(VerifyError::Authority { .. }) => {}
        other => panic!("expected an authority mismatch, got {other:?}"),
    }

    // A qualify receipt whose candidate read is the audit receipt: no speed computation reads
    // an audit, so the walk refuses it.
    let mut q: QualifyOutputs = c.qualify.clone();
    q.sessions.c = r.audit;
    let head = emit(
        &c.store,
        StageName::Qualify,
        Digest::of_bytes(AUTHORITY),
        Some(c.prebuild_c),
        json!({}),
        &q,
    );
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(
        matches!(&e, VerifyError::Recompute { why, .. } if why.contains("a session's outputs")),
        "{e}"
    );
    let audit = cordon::chain::load(&c.store, &r.audit).unwrap();
    assert!(audit.outputs_as::<LaneOutputs>().is_err());
    let _ = r.reference;
}
