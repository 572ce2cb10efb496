//! The referee with real containers: real qualifications (B, C, B′ in the pinned runtime image,
//! per-run accounts, runc) followed by the real pristine reference session T and the final
//! verdict. Engines answer the prompt's first id (the pristine's and an honest engine's
//! tokens), or a wrong id on chosen requests; the incumbent sleeps 40 ms per request and every
//! candidate 4 ms (steady windows on a busy host, where an engine doing no work at all
//! scatters past the speed rule's bound), so each is faster and speed alone would pass it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon::canonical::Digest;
use cordon::lease::Manager;
use cordon::receipt::{Decision, IncumbentOutputs, Outcome, Receipt, StageName};
use cordon::residue::ReapOutputs;
use cordon::tree::{self, Entry, PUBLICATIONS, TREES};
use cordon_evidence::audit::{AuditOutcome, AuditOutputs};
use cordon_evidence::inputs::{MaterializeInputs, QualifyInputs};
use cordon_evidence::quality::QualityVerdict;
use cordon_evidence::verdict::{Final, ReferenceOutputs, VerdictInputs, VerdictOutputs};
use cordon_lane::qualify::{Build, Plan, frozen, primary};
use cordon_lane::session::{Inputs, session_under};
use cordon_reference::referee::{Given, Referee, RefereeError};
use cordon_stage::args::Diagnostics;

#[path = "../../lane/tests/common/mod.rs"]
mod common;

use common::{World, nothing_left, publish};

/// An engine: sleeps `ms` per request, answers the prompt's first id, plus one on requests
/// whose index (the prompt's first id) is in `wrong`.
fn serve(ms: u64, wrong: &[u32]) -> String {
    format!(
        "import time\n\n\ndef generate(prompt, tokens, model_dir):\n    time.sleep({ms} / 1000)\n    off = 1 if prompt[0] in {wrong:?} else 0\n    return [prompt[0] + off] * tokens\n"
    )
}

/// An engine right only where it is timed: it answers correctly while each request is the
/// next of the workload it memorised (request `n` of a session has prompt `[n, 7]`) — as every
/// qualification read is — and otherwise answers wrongly (`quit`: exits instead), as in an
/// audit, whose requests the host draws and shuffles.
fn by_position(quit: bool) -> String {
    let otherwise = if quit {
        "raise SystemExit(0)"
    } else {
        "return [prompt[0] + 1] * tokens"
    };
    format!(
        "import time\n\nSEEN = [0]\n\n\ndef generate(prompt, tokens, model_dir):\n    time.sleep(0.004)\n    n = SEEN[0]\n    SEEN[0] += 1\n    if prompt[0] != n:\n        {otherwise}\n    return [prompt[0]] * tokens\n"
    )
}

/// An engine tree's files; `tag` makes each tree's bytes its own, as distinct engines' are.
fn files(serve: &str, tag: &str) -> Vec<(&'static str, String)> {
    vec![
        ("engine/__init__.py", format!("# {tag}\n")),
        ("engine/serve.py", serve.to_owned()),
    ]
}

/// The tree digest of text files, as the store would name them.
fn digest_of(files: &[(&str, String)]) -> Digest {
    let mut entries: Vec<Entry> = files
        .iter()
        .map(|(p, t)| Entry {
            path: (*p).to_owned(),
            mode: 0o444,
            size: t.len() as u64,
            sha256: Digest::of_bytes(t.as_bytes()),
        })
        .collect();
    entries.sort();
    tree::digest(&entries).unwrap()
}

fn put(w: &World, r: &Receipt) -> Digest {
    let d = r.digest().unwrap();
    w.store
        .put_document(
            "receipts",
            &format!("{}.json", d.hex()),
            r.to_canonical_json().unwrap().as_bytes(),
        )
        .unwrap();
    d
}

/// A world whose policy pins the test's pristine engine, registered in its store.
fn world(slot: u32) -> (World, Digest, Digest) {
    world_edited(slot, &[])
}

/// [`world`] with further `edits` to the default policy.
fn world_edited(slot: u32, edits: &[(&str, &str)]) -> (World, Digest, Digest) {
    let pristine = files(&serve(4, &[]), "pristine");
    let pin = digest_of(&pristine);
    let from = format!(
        "pristine digest=\"{}\"",
        cordon_testkit::policy_pin("pristine")
    );
    let to = format!("pristine digest=\"{pin}\"");
    let mut all = vec![(from.as_str(), to.as_str())];
    all.extend_from_slice(edits);
    let w = common::world("reference", slot, &format!("reference-{slot}"), &all);
    let refs: Vec<(&str, &str)> = pristine.iter().map(|(p, t)| (*p, t.as_str())).collect();
    assert_eq!(publish(&w.store, TREES, &refs), pin);
    let mut registration = Receipt::new(StageName::Materialize, w.cfg.authority, Outcome::Ok);
    registration
        .set_inputs(&MaterializeInputs::Incumbent {
            incumbent_dir: "/srv/pristine".into(),
        })
        .unwrap();
    registration
        .set_outputs(&IncumbentOutputs {
            tree_digest: pin,
            incumbent: "pristine".into(),
            step: None,
            files: 2,
            bytes: 1,
        })
        .unwrap();
    let registration = put(&w, &registration);
    (w, pin, registration)
}

fn build(w: &World, serve: &str, tag: &str) -> Build {
    let f = files(serve, tag);
    let refs: Vec<(&str, &str)> = f.iter().map(|(p, t)| (*p, t.as_str())).collect();
    let tree = publish(&w.store, TREES, &refs);
    Build {
        tree,
        publication: common::native(&w.store, &w.policy, &tree, &[("lib/a", tag)]),
        receipt: Digest::of_bytes(tag.as_bytes()),
    }
}

/// Qualify `incumbent` against `candidate` (real reads) and hand the referee what the CLI
/// would: the qualification and the pristine registration.
fn qualified(w: &World, (pin, registration): (Digest, Digest), b: &str, c: &str) -> Given {
    let p = Plan {
        incumbent: build(w, b, "incumbent"),
        candidate: build(w, c, "candidate"),
        workload: common::workload(w.dir.path(), 5, 1, 4),
        model: w.model.clone(),
        orientation: primary(&w.policy).unwrap(),
        reproduces: None,
        frozen: frozen(&w.policy, &w.cfg.setup.cdi_dirs).unwrap(),
    };
    let outputs = common::qualified(w, &w.cfg, &p);
    Given {
        primary: None,
        qualify: Digest::of_bytes(b"qualify"),
        outputs,
        inputs: QualifyInputs {
            incumbent: p.incumbent.receipt,
            candidate: p.candidate.receipt,
            workload: p.workload,
            model: p.model,
            reproduces: None,
        },
        pristine: registration,
        tree: pin,
    }
}

fn referee(
    w: &World,
    given: &Given,
) -> (
    Result<Decision<VerdictOutputs>, RefereeError>,
    VerdictInputs,
) {
    let mut recorded = VerdictInputs {
        qualify: given.qualify,
        pristine: given.pristine,
        audit: None,
        quiescence: None,
        reference: None,
    };
    let r = Referee {
        policy: &w.policy,
        cfg: &w.cfg,
        mode: Diagnostics::Text,
    }
    .verdict(given, &mut recorded, &mut std::io::sink());
    (r, recorded)
}

fn failed(r: Result<Decision<VerdictOutputs>, RefereeError>) -> (String, VerdictOutputs) {
    match r {
        Ok(Decision::Rejected(x)) => (
            x.findings[0].code.clone(),
            serde_json::from_value(x.evidence).unwrap(),
        ),
        other => panic!("expected a FAIL, got {other:?}"),
    }
}

#[test]
fn a_fast_engine_with_wrong_tokens_fails_on_quality_and_a_correct_faster_one_passes() {
    let (w, pin, registration) = world(0);
    let incumbent = serve(40, &[]);

    // Every token wrong, the right number of them, fast: speed passes, the referee fails it.
    let given = qualified(
        &w,
        (pin, registration),
        &incumbent,
        &serve(4, &[0, 1, 2, 3, 4]),
    );
    let (r, recorded) = referee(&w, &given);
    let (code, o) = failed(r);
    nothing_left(&w);
    assert_eq!(code, "quality.exact");
    assert_eq!(o.verdict, Final::Fail);
    assert_eq!(
        o.graded.c.first_mismatch,
        Some(0),
        "the first differing request is named"
    );
    assert!(o.reason.contains("request 0"), "{}", o.reason);
    assert_eq!(o.speed.verdict, cordon_lane::speed::Verdict::Pass);
    // T's receipt is stored, links the quiescence receipt, and names B, C and B′ as gone.
    let t = cordon::chain::load(&w.store, &recorded.reference.unwrap()).unwrap();
    let t_out = t.outputs_as::<ReferenceOutputs>().unwrap();
    assert_eq!(
        (t_out.tree, t_out.quiescence),
        (pin, recorded.quiescence.unwrap())
    );
    assert_eq!(
        tree::verify_in(&w.store, PUBLICATIONS, &t_out.publication)
            .unwrap()
            .entries
            .len(),
        0,
        "T mounted a control-only publication"
    );
    let q = cordon::chain::load(&w.store, &t_out.quiescence).unwrap();
    let gone = q.outputs_as::<ReapOutputs>().unwrap().gone;
    let leases: Vec<&str> = gone.iter().map(|g| g.lease.as_str()).collect();
    let s = &given.outputs.sessions;
    for (d, name) in [(s.b, "B"), (s.c, "C"), (s.b2, "B′")] {
        let lane = cordon::chain::load(&w.store, &d)
            .unwrap()
            .outputs_as::<cordon::receipt::LaneOutputs>()
            .unwrap();
        assert!(
            leases.contains(&lane.lease.as_str()),
            "{name} is not named gone"
        );
    }

    // Wrong on one request only: still a FAIL, naming that request.
    let given = qualified(&w, (pin, registration), &incumbent, &serve(4, &[3]));
    let (code, o) = failed(referee(&w, &given).0);
    assert_eq!(
        (code.as_str(), o.graded.c.first_mismatch),
        ("quality.exact", Some(3))
    );
    assert_eq!(o.graded.c.exact, 4);

    // Correct and faster: PASS.
    let given = qualified(&w, (pin, registration), &incumbent, &serve(4, &[]));
    match referee(&w, &given).0 {
        Ok(Decision::Accepted(o)) => {
            assert_eq!((o.verdict, o.code.as_str()), (Final::Pass, "verdict.pass"));
        }
        other => panic!("expected a PASS, got {other:?}"),
    }
    nothing_left(&w);
}

#[test]
fn an_engine_right_when_timed_and_wrong_or_gone_when_audited_fails_on_its_audit() {
    let (w, pin, registration) = world(3);
    let incumbent = serve(40, &[]);

    let given = qualified(&w, (pin, registration), &incumbent, &by_position(false));
    let (r, recorded) = referee(&w, &given);
    let (code, o) = failed(r);
    nothing_left(&w);
    assert_eq!(code, "audit.mismatch", "{}", o.reason);
    // Right on every read of the qualification: only the audit shows it.
    assert_eq!(o.graded.c.verdict, QualityVerdict::Pass);
    assert_eq!(o.speed.verdict, cordon_lane::speed::Verdict::Pass);
    let record = o.audit.unwrap();
    assert_eq!(
        record.sample.len(),
        3,
        "the policy's audit samples 3 requests"
    );
    assert!(matches!(
        record.outcome,
        AuditOutcome::Served { ref graded, .. } if graded.verdict == QualityVerdict::Fail
    ));
    // Its own receipt, of its own stage, with no timing in it, after the qualification.
    let audit = cordon::chain::load(&w.store, &recorded.audit.unwrap()).unwrap();
    assert_eq!(
        (audit.stage, audit.prev),
        (StageName::Audit, Some(given.qualify))
    );
    let a = audit.outputs_as::<AuditOutputs>().unwrap();
    assert!(audit.outputs_as::<cordon::receipt::LaneOutputs>().is_err());
    assert_eq!(a.sample, record.sample);
    // T started only after the audit's lease was named gone with the reads'.
    let q = cordon::chain::load(&w.store, &recorded.quiescence.unwrap()).unwrap();
    let gone = q.outputs_as::<ReapOutputs>().unwrap().gone;
    assert!(
        gone.iter().any(|g| g.read == "A" && g.lease == a.lease),
        "{gone:?}"
    );

    // One that notices the audit and quits: it broke its own session, a FAIL.
    let given = qualified(&w, (pin, registration), &incumbent, &by_position(true));
    let (code, o) = failed(referee(&w, &given).0);
    nothing_left(&w);
    assert_eq!(code, "audit.rejected", "{}", o.reason);

    // The same engine under a plan that asks for no audit: a PASS, so the audit is what
    // failed it above.
    let (w, pin, registration) = world_edited(4, &[("audit {\n    requests 3\n}\n", "")]);
    let given = qualified(&w, (pin, registration), &incumbent, &by_position(false));
    match referee(&w, &given) {
        (Ok(Decision::Accepted(o)), recorded) => {
            assert!(o.audit.is_none() && recorded.audit.is_none());
        }
        other => panic!("expected a PASS without an audit, got {other:?}"),
    }
    nothing_left(&w);
}

#[test]
fn t_refuses_a_live_leftover_a_candidate_tree_and_an_incumbent_that_disagrees() {
    let (w, pin, registration) = world(1);
    let incumbent = serve(40, &[]);
    let given = qualified(&w, (pin, registration), &incumbent, &serve(4, &[]));

    // A session whose supervisor died: its record, account and run directory are left.
    {
        let m = Manager::open(&w.store, w.cfg.setup.clone()).unwrap();
        let lease = m
            .begin_with(
                &w.cfg.authority.to_string(),
                &[],
                cordon_testkit::in_an_hour(),
            )
            .unwrap();
        m.provision(&lease).unwrap();
    }
    let (r, recorded) = referee(&w, &given);
    // Recovered before anything is asserted, so a failing check leaves no account behind.
    Manager::open(&w.store, w.cfg.setup.clone())
        .unwrap()
        .recover()
        .unwrap();
    nothing_left(&w);
    let why = match r {
        Err(RefereeError::NoDecision(why)) => why,
        other => panic!("expected a no-decision, got {other:?}"),
    };
    assert!(why.contains("not quiescent"), "{why}");
    assert!(recorded.reference.is_none(), "T never started");
    let q = cordon::chain::load(&w.store, &recorded.quiescence.unwrap()).unwrap();
    assert_eq!(
        q.outcome,
        Outcome::NoDecision,
        "the quiescence receipt says so"
    );
    // Item by item: the leftover's record, account and run directory, as reap records them.
    let left = q.outputs_as::<ReapOutputs>().unwrap();
    assert!(!left.quiescent && !left.remaining.is_empty(), "{left:?}");
    assert_eq!(q.reasons.len(), left.remaining.len());
    assert!(q.reasons.iter().all(|r| r.code == "reap.residue"));

    // The candidate's own tree as the pristine one: refused before launch.
    let mut as_candidate = qualified(&w, (pin, registration), &incumbent, &serve(4, &[]));
    let candidate_tree = cordon::chain::load(&w.store, &as_candidate.outputs.sessions.c)
        .unwrap()
        .outputs_as::<cordon::receipt::LaneOutputs>()
        .unwrap()
        .tree;
    as_candidate.tree = candidate_tree;
    match referee(&w, &as_candidate) {
        (Err(RefereeError::NoDecision(why)), rec) => {
            assert!(why.contains("candidate tree"), "{why}");
            assert!(rec.quiescence.is_none() && rec.reference.is_none());
        }
        other => panic!("expected a no-decision, got {other:?}"),
    }

    // An incumbent that disagrees with T: the reference or the baseline is broken, never the
    // candidate's FAIL, even though the candidate agrees with T.
    let given = qualified(&w, (pin, registration), &serve(40, &[2]), &serve(4, &[]));
    match referee(&w, &given).0 {
        Err(RefereeError::NoDecision(why)) => assert!(why.starts_with("quality.baseline"), "{why}"),
        other => panic!("expected a no-decision, got {other:?}"),
    }
    nothing_left(&w);
}

#[test]
fn t_refuses_a_publication_with_anything_in_it() {
    let (w, pin, _) = world(2);
    let lock = cordon_lane::lock::acquire(&w.cfg.setup.lock_dir).unwrap();
    let inputs = |publication| Inputs {
        role: cordon::receipt::Role::T,
        tree: pin,
        publication,
        workload: common::workload(w.dir.path(), 2, 1, 2),
        model: w.model.clone(),
        lane: None,
    };
    let artifact = common::native(&w.store, &w.policy, &pin, &[("lib/kernel.so", "candidate")]);
    let e = session_under(&w.policy, &w.cfg, &inputs(artifact), &lock).unwrap_err();
    assert!(e.to_string().contains("not control-only"), "{e}");
    // Empty, and still a patcher's build: its control record says it is not T's.
    let built = common::native(&w.store, &w.policy, &pin, &[]);
    let e = session_under(&w.policy, &w.cfg, &inputs(built), &lock).unwrap_err();
    assert!(
        e.to_string().contains("only a control-only publication"),
        "{e}"
    );
    // The control-only publication serves, and the worker saw the pinned tree from inside.
    let empty = common::control_only(&w.store);
    match session_under(&w.policy, &w.cfg, &inputs(empty), &lock) {
        Ok(Decision::Accepted(o)) => assert_eq!(o.tree, pin),
        other => panic!("expected T to serve, got {other:?}"),
    }
    drop(lock);
    nothing_left(&w);
}
