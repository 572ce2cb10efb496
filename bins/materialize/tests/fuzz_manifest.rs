//! Bounded fuzzing of the KDL readers every candidate manifest (and the policy) goes through,
//! in the ordinary test tier: arbitrary text, deep nesting of blocks and comments hidden among
//! strings, and the real manifests with characters overwritten must each decode or be refused
//! with coded problems — never panic or overflow the stack (the test threads' 2 MiB included).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_materialize::manifest;
use proptest::prelude::*;

/// Decode `text` as every KDL language a candidate or operator file is read in.
fn decode_all(text: &str) {
    for result in [
        manifest::delta(text).err(),
        manifest::incumbent(text).err(),
        cordon_policy_lang::parse("fuzz.kdl", text).err(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(
            !result.problems().is_empty(),
            "a refusal names its problems"
        );
    }
}

/// Nesting pieces an attacker combines: blocks, nested comments, strings that hold braces.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a{",
        "}",
        "/*",
        "*/",
        "\"}\"",
        "\"{\"",
        "#\"}\"#",
        "\"\\\"{\"",
        "// {\n",
        "\n",
        " ",
        "b \"x\" {",
        "r#\"",
        "\"\"\"\n{\n\"\"\"",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_is_decoded_or_refused(text in "\\PC{0,512}") {
        decode_all(&text);
    }

    #[test]
    fn deep_nesting_among_strings_is_refused_not_a_crash(
        pieces in proptest::collection::vec(piece(), 0..64),
        repeat in 1usize..4000,
    ) {
        let unit: String = pieces.concat();
        decode_all(&unit.repeat(repeat));
    }

    #[test]
    fn damaged_manifests_are_decoded_or_refused(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..8),
    ) {
        let root = cordon_testkit::workspace_root().join("checks/example");
        let text = std::fs::read_to_string(root.join("incumbent/cordon-incumbent.kdl")).unwrap();
        let mut chars: Vec<char> = text.chars().collect();
        for (at, c) in edits {
            let i = at.index(chars.len());
            chars[i] = c;
        }
        decode_all(&chars.into_iter().collect::<String>());
    }
}

#[test]
fn nesting_just_past_the_bound_is_refused_and_just_below_decodes() {
    let max = cordon_policy_lang::kit::MAX_BLOCKS;
    let nested = |d: usize| format!("{}{}", "a{".repeat(d), "}".repeat(d));
    // At the bound the parser runs (on its own stack) and the manifest's own rules refuse it.
    let codes = |text: &str| -> Vec<String> {
        manifest::delta(text)
            .unwrap_err()
            .problems()
            .iter()
            .map(|p| p.short_code().to_owned())
            .collect()
    };
    assert!(!codes(&nested(max)).contains(&"too-deep".to_owned()));
    assert_eq!(codes(&nested(max + 1)), ["too-deep"]);
    let comments = format!("{}{}", "/*".repeat(max + 1), "*/".repeat(max + 1));
    assert_eq!(codes(&comments), ["too-deep"]);
}
