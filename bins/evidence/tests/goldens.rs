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

/// Every golden receipt is valid under its kind's schema (generated from the types), and a
/// receipt whose outputs break their type is not: the schemas describe what stages print.
#[test]
fn every_golden_receipt_is_valid_under_its_kinds_schema() {
    let schemas = cordon_evidence::schema::receipts();
    let schema_of = |stage: StageName| {
        let (_, s) = schemas
            .iter()
            .find(|(k, _)| *k == stage)
            .unwrap_or_else(|| panic!("no schema for {stage:?}"));
        jsonschema::validator_for(&serde_json::to_value(s).unwrap()).unwrap()
    };
    for (name, r) in examples::every_stage() {
        let value: serde_json::Value =
            serde_json::from_str(&r.to_canonical_json().unwrap()).unwrap();
        let validator = schema_of(r.stage);
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
        // The same receipt with a field of its outputs given the wrong type, or under another
        // stage's schema, is refused.
        if r.outcome == Outcome::Ok {
            let mut broken = value.clone();
            let outputs = broken["outputs"].as_object_mut().unwrap();
            let field = outputs.keys().next().unwrap().clone();
            outputs.insert(field.clone(), serde_json::json!([1, 2, 3]));
            assert!(
                !validator.is_valid(&broken),
                "{name}: {field} as a list passed"
            );
        }
        let mut foreign = value.clone();
        foreign["stage"] = serde_json::json!("policy");
        assert!(
            !validator.is_valid(&foreign),
            "{name}: another stage passed"
        );
    }
}
