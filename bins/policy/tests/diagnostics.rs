//! Golden tests of the diagnostics: one fixture per code under `tests/fixtures/<code>.kdl`, its
//! rendered text snapshotted, and a file with several mistakes reporting all of them at once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use cordon_policy_lang::CODES;

fn fixture(name: &str) -> (String, String) {
    let rel = format!("tests/fixtures/{name}.kdl");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(&rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {rel}: {e}"));
    (rel, text)
}

#[test]
fn every_code_has_a_fixture_that_produces_it() {
    for (code, _) in CODES {
        let (rel, text) = fixture(code);
        let err = cordon_policy_lang::parse(&rel, &text).expect_err(code);
        let codes: Vec<&str> = err.problems().iter().map(|p| p.short_code()).collect();
        assert!(codes.contains(code), "{rel} gave {codes:?}, not {code}");
        insta::assert_snapshot!(
            format!("code-{code}"),
            err.render_text(&cordon::voice::Style::fixed(100).handler())
        );
    }
}

#[test]
fn every_fixture_is_a_documented_code() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let stem = name.trim_end_matches(".kdl");
        assert!(
            stem == "many-mistakes" || CODES.iter().any(|(c, _)| *c == stem),
            "{name} names no code"
        );
    }
}

#[test]
fn every_code_is_in_the_language_reference() {
    let readme =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/README.md")).unwrap();
    for (code, _) in CODES {
        assert!(
            readme.contains(&format!("`cordon::policy::{code}`")),
            "policy/README.md lacks {code}"
        );
    }
}

#[test]
fn several_mistakes_are_all_reported_at_once_in_file_order() {
    let (rel, text) = fixture("many-mistakes");
    let err = cordon_policy_lang::parse(&rel, &text).unwrap_err();
    let codes: Vec<&str> = err.problems().iter().map(|p| p.short_code()).collect();
    assert_eq!(
        codes,
        [
            "redundant-entry",
            "invalid-value",
            "unresolved-reference",
            "unknown-node",
            "invalid-size",
            "out-of-range"
        ]
    );
    let rendered = err.render_text(&cordon::voice::Style::fixed(100).handler());
    for at in [":16:10]", ":18:13]", ":20:5]", ":22:12]", ":23:10]"] {
        assert!(rendered.contains(at), "no label at {at}:\n{rendered}");
    }
    insta::assert_snapshot!("many-mistakes", rendered);
}

#[test]
fn json_diagnostics_carry_code_and_span() {
    let (rel, text) = fixture("out-of-range");
    let json = cordon_policy_lang::parse(&rel, &text)
        .unwrap_err()
        .render_json();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let problem = &v["problems"][0];
    assert_eq!(problem["code"], "cordon::policy::out-of-range");
    assert!(problem["labels"][0]["span"]["offset"].as_u64().unwrap() > 0);
    assert_eq!(v["policy"], rel);
}

#[test]
fn every_receipt_reason_code_the_stages_emit_is_documented() {
    let root = cordon_testkit::workspace_root();
    let readme = std::fs::read_to_string(root.join("policy/README.md")).unwrap();
    let mut found = 0;
    for dir in [
        "bins/cordon/src",
        "bins/fetch/src",
        "bins/materialize/src",
        "bins/prebuild/src",
        "bins/reap/src",
        "bins/stage/src",
    ] {
        let mut files = vec![root.join(dir)];
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, _) in text.match_indices('"') {
                let rest = &text[i + 1..];
                let Some(end) = rest.find('"') else { continue };
                let word = &rest[..end];
                let is_code = [
                    "intake.",
                    "transport.",
                    "tree.",
                    "python.",
                    "materialize.",
                    "prebuild.",
                    "publication.",
                    "reap.",
                    "receipt.",
                ]
                .iter()
                .any(|p| word.starts_with(p))
                    && word[word.find('.').unwrap() + 1..]
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !word.ends_with('.')
                    && word.len() > word.find('.').unwrap() + 1;
                if is_code {
                    found += 1;
                    assert!(
                        readme.contains(&format!("`{word}`")),
                        "policy/README.md does not document the reason code {word}"
                    );
                }
            }
        }
    }
    assert!(
        found > 50,
        "the scan found only {found} codes: is it still reading the sources?"
    );
}

/// Every arm of the weakened-control refusal, each from one edit of the default policy (an
/// edit whose pattern does not match fails the test): each must give exactly that refusal,
/// with its own message — so removing any one arm's check fails here. (The Python ban floors
/// are the language's minimum sets, smaller than the default policy's lists: dropping `pickle`
/// is a reviewable change, not a refusal.)
#[test]
fn every_arm_of_weakened_control_refuses_its_own_change() {
    use cordon_testkit::EditOnce as _;
    let text =
        std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
            .unwrap();
    // The prebuild stage's own lines (its `cpus 4` is the only one in the file).
    let stage = "    no-new-privileges #true\n    seccomp \"candidate\"\n    user \"per-run\"\n    cpus 4\n";
    let nnp_off = stage.replace("#true", "#false");
    let root = stage.replace("\"per-run\"", "\"root\"");
    let arms: [(&str, &str, &str); 8] = [
        (
            "default-action \"errno\" errno=1",
            "default-action \"allow\"",
            "turns the filter into a deny-list",
        ),
        (
            "default-action \"errno\" errno=1",
            "default-action \"log\"",
            "turns the filter into a deny-list",
        ),
        (stage, &nnp_off, "cannot be turned off"),
        (stage, &root, "is not allowed"),
        ("ban-call \"eval\" ", "ban-call ", "must include eval"),
        (
            "\"builtins\" \"importlib\" ",
            "\"builtins\" ",
            "must include importlib",
        ),
        (
            "ban-attribute-call \"exec_module\" ",
            "ban-attribute-call ",
            "must include exec_module",
        ),
        (
            "\"load_module\" \"spec_from_file_location\" ",
            "\"load_module\" ",
            "must include spec_from_file_location",
        ),
    ];
    for (from, to, says) in arms {
        let edited = text.replace_once(from, to);
        let err = cordon_policy_lang::parse("arm.kdl", &edited)
            .expect_err(&format!("{from} → {to} must be refused"));
        let found: Vec<(&str, &str)> = err
            .problems()
            .iter()
            .map(|p| (p.short_code(), p.message()))
            .collect();
        assert_eq!(found.len(), 1, "{from} → {to}: {found:?}");
        assert_eq!(found[0].0, "weakened-control", "{from} → {to}: {found:?}");
        let rendered = err.render_text(&cordon::voice::Style::fixed(100).handler());
        assert!(rendered.contains(says), "{from} → {to}: {rendered}");
    }
}
