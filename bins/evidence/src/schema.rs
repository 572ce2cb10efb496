//! JSON Schemas of every receipt kind, generated from the types each stage writes (`schemars`
//! derives them from the same serde definitions the receipts are encoded with, so a schema
//! cannot drift from what a stage prints): the receipt's envelope, its `stage` fixed, and its
//! `inputs` and `outputs` those of the stage — or the empty object a receipt carries when the
//! stage established none (a rejection, a no-decision, a pass-on).
//!
//! It owns the map from a stage to its input and output types (the one place a reader's tool
//! learns it). `cordon-docs` writes the schemas (`share/cordon/schemas/<stage>.json`); the
//! golden receipts are validated against them in this crate's tests.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::receipt::{Receipt, StageName};

/// A type's schema, its definitions collected in the generator.
pub type Sub = fn(&mut SchemaGenerator) -> Schema;

/// [`Sub`] of `T`.
pub fn sub<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The schema of one receipt kind: `stage`, its inputs, and each shape its outputs can have
/// (a stage above this crate, `cordon-policy identity`, states its own through it).
#[must_use]
pub fn kind(stage: StageName, inputs: Sub, outputs: &[Sub]) -> (StageName, Schema) {
    let mut g = SchemaSettings::draft2020_12().into_generator();
    let none = || json_schema!({ "type": "object", "maxProperties": 0 });
    let inputs = inputs(&mut g);
    let mut shapes: Vec<Schema> = outputs.iter().map(|f| f(&mut g)).collect();
    shapes.push(none());
    let mut root = g.into_root_schema_for::<Receipt>();
    root.insert(
        "title".into(),
        format!("cordon {} receipt", stage.as_str()).into(),
    );
    if let Some(props) = root
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        props.insert(
            "stage".into(),
            serde_json::json!({ "const": stage.as_str() }),
        );
        props.insert(
            "inputs".into(),
            serde_json::json!({ "anyOf": [inputs, none()] }),
        );
        props.insert("outputs".into(), serde_json::json!({ "anyOf": shapes }));
    }
    (stage, root)
}

/// Every receipt kind a stage prints or stores, with its schema.
#[must_use]
pub fn receipts() -> Vec<(StageName, Schema)> {
    use crate::audit::{AuditInputs, AuditOutputs};
    use crate::inputs::{
        FetchInputs, LaneInputs, MaterializeInputs, PrebuildInputs, QualifyInputs, ReapInputs,
        SurfaceInputs, SurfaceOutputs,
    };
    use crate::qualify::QualifyOutputs;
    use crate::receipt::{
        FetchOutputs, IncumbentOutputs, LaneOutputs, MaterializeOutputs, PrebuildOutputs,
    };
    use crate::residue::ReapOutputs;
    use crate::verdict::{ReferenceInputs, ReferenceOutputs, VerdictInputs, VerdictOutputs};
    vec![
        kind(StageName::Fetch, sub::<FetchInputs>, &[sub::<FetchOutputs>]),
        kind(
            StageName::Materialize,
            sub::<MaterializeInputs>,
            &[sub::<MaterializeOutputs>, sub::<IncumbentOutputs>],
        ),
        kind(
            StageName::Prebuild,
            sub::<PrebuildInputs>,
            &[sub::<PrebuildOutputs>],
        ),
        kind(StageName::Lane, sub::<LaneInputs>, &[sub::<LaneOutputs>]),
        kind(
            StageName::Qualify,
            sub::<QualifyInputs>,
            &[sub::<QualifyOutputs>],
        ),
        kind(StageName::Audit, sub::<AuditInputs>, &[sub::<AuditOutputs>]),
        kind(
            StageName::Reference,
            sub::<ReferenceInputs>,
            &[sub::<ReferenceOutputs>],
        ),
        kind(
            StageName::Verdict,
            sub::<VerdictInputs>,
            &[sub::<VerdictOutputs>],
        ),
        kind(StageName::Reap, sub::<ReapInputs>, &[sub::<ReapOutputs>]),
        kind(
            StageName::Surface,
            sub::<SurfaceInputs>,
            &[sub::<SurfaceOutputs>],
        ),
    ]
}
