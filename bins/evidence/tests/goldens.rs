//! The receipt of every stage and shape, pinned: its canonical text (shown pretty) and its
//! digest. A change here is a change of what every auditor reads; review the snapshot diff as
//! one. Each example also reads back through its stage's typed inputs and outputs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_evidence::examples;
use cordon_evidence::receipt::{Outcome, Receipt, StageName};

#[test]
fn every_stage_receipt_matches_its_golden() {
    for (name, r) in examples::every_stage() {
        let text = r.to_canonical_json().unwrap();
        let back = Receipt::parse(&text).unwrap();
        assert_eq!(back, r, "{name}");
        let pretty = serde_json::to_string_pretty(
            &serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        )
        .unwrap();
        insta::assert_snapshot!(
            format!("receipt-{name}"),
            format!("digest: {}\n{pretty}", r.digest().unwrap())
        );
    }
}

#[test]
fn every_example_reads_back_through_its_typed_inputs_and_outputs() {
    use cordon_evidence::inputs as i;
    use cordon_evidence::receipt as o;
    for (name, r) in examples::every_stage() {
        let established = r.outcome == Outcome::Ok;
        let ok = match r.stage {
            StageName::Fetch => {
                r.inputs_as::<i::FetchInputs>().is_ok()
                    && (!established || r.outputs_as::<o::FetchOutputs>().is_ok())
            }
            StageName::Materialize => {
                r.passes_on()
                    || (r.inputs_as::<i::MaterializeInputs>().is_ok()
                        && (r.outputs_as::<o::MaterializeOutputs>().is_ok()
                            || r.outputs_as::<o::IncumbentOutputs>().is_ok()))
            }
            StageName::Prebuild => {
                r.inputs_as::<i::PrebuildInputs>().is_ok()
                    && (!established || r.outputs_as::<o::PrebuildOutputs>().is_ok())
            }
            StageName::Lane => {
                r.inputs_as::<i::LaneInputs>().is_ok() && r.outputs_as::<o::LaneOutputs>().is_ok()
            }
            StageName::Qualify => {
                r.inputs_as::<i::QualifyInputs>().is_ok()
                    && r.outputs_as::<cordon_evidence::qualify::QualifyOutputs>()
                        .is_ok()
            }
            StageName::Reap => {
                r.inputs_as::<i::ReapInputs>().is_ok()
                    && r.outputs_as::<cordon_evidence::residue::ReapOutputs>()
                        .is_ok()
            }
            StageName::Surface => {
                r.inputs_as::<i::SurfaceInputs>().is_ok()
                    && r.outputs_as::<i::SurfaceOutputs>().is_ok()
            }
            StageName::Audit => {
                r.inputs_as::<cordon_evidence::audit::AuditInputs>().is_ok()
                    && r.outputs_as::<cordon_evidence::audit::AuditOutputs>()
                        .is_ok()
            }
            StageName::Reference => {
                r.inputs_as::<cordon_evidence::verdict::ReferenceInputs>()
                    .is_ok()
                    && r.outputs_as::<cordon_evidence::verdict::ReferenceOutputs>()
                        .is_ok()
            }
            StageName::Verdict => {
                r.inputs_as::<cordon_evidence::verdict::VerdictInputs>()
                    .is_ok()
                    && (!established
                        || r.outputs_as::<cordon_evidence::verdict::VerdictOutputs>()
                            .is_ok())
            }
            StageName::Policy => false,
        };
        assert!(ok, "{name}: {r:?}");
    }
}
