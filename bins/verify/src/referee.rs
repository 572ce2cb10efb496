//! The referee's receipts in the walk: the candidate's audit, the pristine reference session
//! T and the final verdict, each checked against what it rests on, and the final verdict
//! recomputed from the stored outputs objects under the rules it records.

use cordon::canonical::Digest;
use cordon::chain;
use cordon::receipt::{LaneOutputs, Outcome, Receipt, StageName};
use cordon::store::Store;
use cordon::tree::{self, PUBLICATIONS, TREES};
use cordon_evidence::audit::{AuditInputs, AuditOutcome, AuditOutputs, regrade};
use cordon_evidence::qualify::{QualifyOutputs, Reads, Settlement};
use cordon_evidence::quality::grade;
use cordon_evidence::verdict::{
    self, Final, ReferenceInputs, ReferenceOutputs, VerdictInputs, VerdictOutputs,
};

use crate::{Edges, Names, VerifyError, tokens};

/// A final verdict's receipt: it rests on its qualification, its audit (when it had one), T
/// and the quiescence receipt; an audit the candidate broke is rested on as `rejected`.
pub(crate) fn verdict(
    store: &Store,
    digest: &Digest,
    r: &Receipt,
    mut edges: Edges,
) -> Result<Names, VerifyError> {
    let shape = |e: cordon::receipt::ReceiptError| VerifyError::Order {
        digest: *digest,
        stage: r.stage,
        why: e.to_string(),
    };
    let i = r.inputs_as::<VerdictInputs>().map_err(shape)?;
    edges.extend(i.reference.map(|d| (d, StageName::Reference)));
    edges.extend(i.quiescence.map(|d| (d, StageName::Reap)));
    let audit = i
        .audit
        .map(|d| vec![(d, StageName::Audit)])
        .unwrap_or_default();
    if r.outcome == Outcome::NoDecision {
        // A no-decision establishes nothing; the audit it may name (of any outcome) is not
        // rested on.
        return Ok(Names::edges(edges));
    }
    let o = r.outputs_as::<VerdictOutputs>().map_err(shape)?;
    recompute_verdict(store, digest, r, &i, &o)?;
    // A reproduction's primary attempt is walked too: its chain, signature and authority.
    edges.extend(o.primary.as_ref().map(|p| (p.qualify, StageName::Qualify)));
    let broke = matches!(
        o.audit.as_ref().map(|a| &a.outcome),
        Some(AuditOutcome::Rejected { .. })
    );
    Ok(if broke {
        Names {
            edges,
            rejected: audit,
            ..Names::default()
        }
    } else {
        edges.extend(audit);
        Names::edges(edges)
    })
}

/// The candidate's audit receipt: it rests on its qualification, mounted the qualification's
/// candidate tree and publication, and names its outputs object. No timing is in it.
pub(crate) fn audit(
    store: &Store,
    r: &Receipt,
    edges: Edges,
    established: bool,
) -> Result<Names, String> {
    let i = r.inputs_as::<AuditInputs>().map_err(|e| e.to_string())?;
    if Some(i.qualify) != r.prev {
        return Err("its inputs name another qualification than it rests on".into());
    }
    if !established {
        return Ok(Names::edges(edges));
    }
    let o = r.outputs_as::<AuditOutputs>().map_err(|e| e.to_string())?;
    if (o.tree, o.publication, &o.sample, o.plan) != (i.tree, i.publication, &i.sample, i.plan) {
        return Err(
            "its outputs name another tree, publication, sample or plan than its inputs".into(),
        );
    }
    let q = chain::load(store, &i.qualify)
        .map_err(|e| e.to_string())?
        .outputs_as::<QualifyOutputs>()
        .map_err(|e| format!("its qualification: {e}"))?;
    let c = chain::load(store, &q.sessions.c)
        .map_err(|e| e.to_string())?
        .outputs_as::<LaneOutputs>()
        .map_err(|e| format!("its qualification's candidate read: {e}"))?;
    if (c.tree, c.publication) != (o.tree, o.publication) {
        return Err("it audited another build than its qualification's candidate".into());
    }
    Ok(Names {
        objects: vec![(TREES, o.tree), (PUBLICATIONS, o.publication)],
        outputs: vec![o.outputs],
        edges,
        ..Names::default()
    })
}

/// The final verdict's audit against the audit receipt it names: the same sample and ending,
/// the outputs regraded against T's for the sampled requests. The outcome `decide` reads.
fn recompute_audit(
    store: &Store,
    digest: &Digest,
    (i, o): (&VerdictInputs, &VerdictOutputs),
    reference: &[Vec<u32>],
) -> Result<Option<AuditOutcome>, VerifyError> {
    let differs = |why: String| VerifyError::Recompute {
        digest: *digest,
        why,
    };
    let (section, a) = match (&o.audit_section, &o.audit) {
        (None, None) if i.audit.is_none() => return Ok(None),
        (Some(s), Some(a)) if i.audit == Some(a.receipt) => (s, a),
        _ => {
            return Err(differs(
                "its audit is not the one its audit plan and inputs name".into(),
            ));
        }
    };
    if a.sample.len() as u64 != section.requests {
        return Err(differs(format!(
            "its audit sampled {} requests; its audit plan asks for {}",
            a.sample.len(),
            section.requests
        )));
    }
    let receipt = chain::load(store, &a.receipt)?;
    if receipt.prev != Some(o.qualify) {
        return Err(differs("its audit is not its qualification's".into()));
    }
    match &a.outcome {
        AuditOutcome::Served { outputs, graded } => {
            let ao = receipt
                .outputs_as::<AuditOutputs>()
                .map_err(|e| differs(format!("its audit: {e}")))?;
            if (&ao.sample, &ao.outputs) != (&a.sample, outputs) {
                return Err(differs(
                    "its audit's sample or outputs are not the audit receipt's".into(),
                ));
            }
            let again = regrade(
                &o.quality_section,
                reference,
                &a.sample,
                &tokens(store, digest, outputs)?,
            )
            .map_err(|why| differs(format!("its audit: {why}")))?;
            if &again != graded {
                return Err(differs(
                    "the audit's grade does not recompute from the stored outputs".into(),
                ));
            }
        }
        AuditOutcome::Rejected { code, .. } => {
            if receipt.outcome != Outcome::Rejected
                || receipt.reasons.first().map(|r| &r.code) != Some(code)
            {
                return Err(differs(
                    "it records an audit the candidate broke; the audit receipt does not".into(),
                ));
            }
        }
    }
    Ok(Some(a.outcome.clone()))
}

/// A reference session's receipt: it rests on its qualification and on the quiescence receipt
/// it names; it mounted the tree and the control-only publication its inputs name, and names
/// its outputs object.
pub(crate) fn reference(
    store: &Store,
    r: &Receipt,
    mut edges: Edges,
    established: bool,
) -> Result<Names, String> {
    let i = r
        .inputs_as::<ReferenceInputs>()
        .map_err(|e| e.to_string())?;
    edges.push((i.quiescence, StageName::Reap));
    if !established {
        return Ok(Names::edges(edges));
    }
    let o = r
        .outputs_as::<ReferenceOutputs>()
        .map_err(|e| e.to_string())?;
    if (o.tree, o.publication, o.quiescence) != (i.tree, i.publication, i.quiescence) {
        return Err(
            "its outputs name another tree, publication or quiescence than its inputs".into(),
        );
    }
    // Control-only: T's publication holds nothing.
    let publication =
        tree::load_in(store, PUBLICATIONS, &o.publication).map_err(|e| e.to_string())?;
    if !publication.entries.is_empty() {
        return Err("its publication is not control-only".into());
    }
    Ok(Names {
        objects: vec![(TREES, o.tree), (PUBLICATIONS, o.publication)],
        outputs: vec![o.outputs],
        edges,
        ..Names::default()
    })
}

/// Each read's stored outputs object graded against T's.
fn regraded(
    store: &Store,
    digest: &Digest,
    rule: &cordon_evidence::quality::Quality,
    reference: &[Vec<u32>],
    outputs: &Reads<Digest>,
) -> Result<Reads<cordon_evidence::quality::QualityRecord>, VerifyError> {
    let of = |d: &Digest| Ok::<_, VerifyError>(grade(rule, reference, &tokens(store, digest, d)?));
    Ok(Reads {
        b: of(&outputs.b)?,
        c: of(&outputs.c)?,
        b2: of(&outputs.b2)?,
    })
}

/// The primary attempt a final verdict weighs: exactly the one its qualification reproduces,
/// with that receipt's speed record and outputs, and its grades recomputed against T's.
fn recompute_primary(
    store: &Store,
    digest: &Digest,
    (q, o): (&QualifyOutputs, &VerdictOutputs),
    reference: &[Vec<u32>],
) -> Result<(), VerifyError> {
    let differs = |why: &str| VerifyError::Recompute {
        digest: *digest,
        why: why.to_owned(),
    };
    let Some(p) = &o.primary else {
        return match q.reproduces {
            None => Ok(()),
            Some(_) => Err(differs(
                "its qualification is a reproduction and it weighs no primary attempt",
            )),
        };
    };
    if q.reproduces != Some(p.qualify) || q.settlement.as_ref() != Some(&p.settlement) {
        return Err(differs(
            "the primary attempt it weighs is not the one its qualification reproduces",
        ));
    }
    let first = Settlement::check_pair(
        p.qualify,
        &chain::load(store, &p.qualify)?,
        &chain::load(store, &o.qualify)?,
    )
    .map_err(differs)?;
    if (first.speed, first.outputs) != (p.speed.clone(), p.outputs.clone()) {
        return Err(differs(
            "the primary attempt's speed record or outputs are not its receipt's",
        ));
    }
    if regraded(store, digest, &o.quality_section, reference, &p.outputs)? != p.graded {
        return Err(differs(
            "the primary attempt's grades do not recompute from the stored outputs",
        ));
    }
    Ok(())
}

/// A final verdict against what it rests on: its qualification's speed record and reads, T's
/// outputs, the quality rule it records, every read regraded from the stored objects, and the
/// verdict recomputed from them.
fn recompute_verdict(
    store: &Store,
    digest: &Digest,
    r: &Receipt,
    i: &VerdictInputs,
    o: &VerdictOutputs,
) -> Result<(), VerifyError> {
    let differs = |why: String| VerifyError::Recompute {
        digest: *digest,
        why,
    };
    if (Some(o.qualify), Some(o.reference), Some(o.quiescence))
        != (r.prev, i.reference, i.quiescence)
        || i.qualify != o.qualify
    {
        return Err(differs(
            "its outputs name other receipts than it rests on".into(),
        ));
    }
    let q = chain::load(store, &o.qualify)?
        .outputs_as::<QualifyOutputs>()
        .map_err(|e| differs(format!("its qualification: {e}")))?;
    let t_receipt = chain::load(store, &o.reference)?;
    let t = t_receipt
        .outputs_as::<ReferenceOutputs>()
        .map_err(|e| differs(format!("its reference session: {e}")))?;
    if t_receipt.prev != Some(o.qualify) || t.quiescence != o.quiescence {
        return Err(differs(
            "its reference session is not its qualification's".into(),
        ));
    }
    if (&q.speed, &q.outputs, q.settling) != (&o.speed, &o.outputs, o.settling)
        || t.outputs != o.reference_outputs
    {
        return Err(differs(
            "its speed record or outputs are not its qualification's and T's".into(),
        ));
    }
    let rule = verdict::quality_policy_digest(&o.quality_section)
        .map_err(|e| differs(format!("the quality section: {e}")))?;
    if rule != o.quality_policy {
        return Err(differs(
            "the quality section it records is not the one its digest names".into(),
        ));
    }
    let reference = tokens(store, digest, &t.outputs)?;
    let graded = regraded(store, digest, &o.quality_section, &reference, &q.outputs)?;
    if graded != o.graded {
        return Err(differs(
            "the grades do not recompute from the stored outputs".into(),
        ));
    }
    let audit = recompute_audit(store, digest, (i, o), &reference)?;
    recompute_primary(store, digest, (&q, o), &reference)?;
    let pairing = verdict::Pairing {
        required: o.reproduction_required,
        primary: o.primary.as_ref(),
    };
    let again = verdict::decide(&o.speed, &graded, audit.as_ref(), pairing)
        .map_err(|why| differs(format!("the verdict recomputes to a no-decision: {why}")))?;
    if again != (o.verdict, o.code.clone(), o.reason.clone()) {
        return Err(differs(format!(
            "the verdict recomputes to {:?} ({}), the receipt says {:?} ({})",
            again.0, again.1, o.verdict, o.code
        )));
    }
    let outcome = match again.0 {
        Final::Pass => Outcome::Ok,
        Final::Fail => Outcome::Rejected,
    };
    if r.outcome != outcome {
        return Err(differs(format!(
            "its outcome is {}, the verdict it records is {:?}",
            r.outcome.as_str(),
            again.0
        )));
    }
    Ok(())
}
