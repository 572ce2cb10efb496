//! The incumbent and delta manifests are decoded with the policy's collect-all kit: every
//! problem at once, each labelled on its token with a `cordon::manifest::…` code. The rendered
//! diagnostics are a tested interface (golden snapshots); the delta's reach the candidate as
//! located findings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_materialize::manifest::{self, CODES};

fn codes(e: &cordon_policy_lang::KdlError) -> Vec<&'static str> {
    e.problems().iter().map(|p| p.short_code()).collect()
}

#[test]
fn a_delta_manifest_with_many_mistakes_reports_them_all_on_their_tokens() {
    let text = r#"delta target="attention" package="fast-attn" stepp="x" tier="fastest"
executable "/abs/tool.sh"
executable "engine/attention/tools/gen.sh"
executable "engine/attention/tools/gen.sh"
native-source "engine/../kernels/flash.cu"
dependency-patch 42
factory "fast_attn/aot.py"
extra "node"
"#;
    let e = manifest::delta(text).unwrap_err();
    assert_eq!(
        codes(&e),
        [
            "invalid-value",
            "unknown-property",
            "invalid-value",
            "invalid-path",
            "duplicate",
            "invalid-path",
            "wrong-type",
            "invalid-value",
            "unknown-node",
        ]
    );
    insta::assert_snapshot!(
        "delta-many-mistakes",
        e.render_text(&cordon::voice::Style::fixed(100).handler())
    );
}

/// A name over NAME_MAX is the manifest's mistake (a located finding), never a later stage's
/// "File name too long"; 255 bytes is a name.
#[test]
fn a_path_with_a_name_over_name_max_is_an_invalid_path() {
    let at = |n: usize| {
        format!(
            "delta target=\"attention\" package=\"fast_attn\"\nexecutable \"engine/{}.sh\"\n",
            "n".repeat(n - 3)
        )
    };
    if let Err(e) = manifest::delta(&at(255)) {
        panic!(
            "{}",
            e.render_text(&cordon::voice::Style::fixed(100).handler())
        );
    }
    let e = manifest::delta(&at(256)).unwrap_err();
    assert_eq!(codes(&e), ["invalid-path"]);
}

#[test]
fn an_incumbent_manifest_with_many_mistakes_reports_them_all_on_their_tokens() {
    let text = r#"incumbent "engine"
incumbent "again"
target "a" path="engine/a" python="engine.a"
target "b" path="engine/a/inner"
target "c" python="1bad"
target "a" path="engine/z"
"#;
    let e = manifest::incumbent(text).unwrap_err();
    assert_eq!(
        codes(&e),
        // In file order of each problem's first label (a duplicate is labelled first where the
        // name first appears).
        [
            "duplicate",
            "duplicate",
            "overlap",
            "missing-property",
            "invalid-value"
        ]
    );
    insta::assert_snapshot!(
        "incumbent-many-mistakes",
        e.render_text(&cordon::voice::Style::fixed(100).handler())
    );
    assert!(
        e.render_json()
            .starts_with("{\"manifest\":\"cordon-incumbent.kdl\"")
    );
}

#[test]
fn the_bundled_example_manifests_decode_and_every_code_is_documented() {
    let root = cordon_testkit::workspace_root().join("checks/example");
    let inc = std::fs::read_to_string(root.join("incumbent/cordon-incumbent.kdl")).unwrap();
    let i = manifest::incumbent(&inc).unwrap();
    assert!(i.targets.contains_key("attention"));
    let delta = std::fs::read_to_string(root.join("candidate/cordon-delta.kdl")).unwrap();
    let d = manifest::delta(&delta).unwrap();
    assert_eq!(d.target, "attention");
    let readme =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("README.md")).unwrap();
    for (code, _) in CODES {
        assert!(
            readme.contains(&format!("`cordon::manifest::{code}`")),
            "README.md does not document cordon::manifest::{code}"
        );
    }
}
