//! Property tests of the Python checks on hostile input: arbitrary bytes, deep nesting of every
//! kind, identifiers in any script and coding declarations never panic or exhaust the stack,
//! and the normalisation and coding rules hold for every spelling generated. Bounded (256
//! cases each) so that they run in seconds in the ordinary, unprivileged test tier.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_materialize::python::{Checked, PyRules, STACK_BYTES, check};
use proptest::prelude::*;

fn rules() -> PyRules {
    let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    PyRules {
        ban_call: set(&["eval", "exec", "compile", "__import__", "breakpoint"]),
        ban_import: set(&["builtins", "importlib"]),
        ban_attribute_call: set(&["exec_module", "load_module", "spec_from_file_location"]),
        jit_entry_points: vec![("cutlass.cute".into(), "compile".into())],
        local_cutlass: false,
    }
}

/// The whole check on a thread with the stack it documents; a panic fails the property.
fn run(source: String) -> Checked {
    std::thread::Builder::new()
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let checked = check(&source, "fuzz.py", &rules(), None);
            for f in &checked.findings {
                assert!(f.start <= f.end && f.end <= source.len(), "{f:?}");
                assert!(source.is_char_boundary(f.start) && source.is_char_boundary(f.end));
            }
            checked
        })
        .unwrap()
        .join()
        .unwrap()
}

fn codes(c: &Checked) -> Vec<&'static str> {
    c.findings.iter().map(|f| f.code).collect()
}

/// One level of nesting, as text before and after the inner expression.
fn level() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop::sample::select(vec![
        ("(", ")"),
        ("[", "]"),
        ("{", "}"),
        ("-", ""),
        ("not ", ""),
        ("~", ""),
        ("lambda: ", ""),
        ("lambda a, b: ", ""),
        ("1 if c else ", ""),
        ("", " + 1"),
        ("", ".a"),
        ("", "()"),
        ("", "[0]"),
        ("await ", ""),
        ("*", ""),
        ("f'{", "}'"),
        ("'", "'"),
        ("# ", "\n"),
    ])
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(text) = String::from_utf8(bytes) {
            run(text);
        }
    }

    #[test]
    fn arbitrary_python_ish_text_never_panics(
        text in prop::collection::vec(
            prop::sample::select(vec![
                "(", ")", "[", "]", "{", "}", "'", "\"", "'''", "f'", "f\"", "#", "\n", "\r",
                " ", "    ", "\\", ":", ",", "lambda", "if", "elif", "else", "x", "1", "-",
                "=", ".", "eval", "__dict__", "getattr", "# coding: latin-1", "\u{feff}", "ｅ",
            ]),
            0..200,
        )
    ) {
        run(text.concat());
    }

    #[test]
    fn any_nesting_is_checked_or_refused_never_overflows(
        levels in prop::collection::vec(level(), 0..4_000)
    ) {
        let mut src = String::from("x = ");
        for (open, _) in &levels {
            src.push_str(open);
        }
        src.push('y');
        for (_, close) in levels.iter().rev() {
            src.push_str(close);
        }
        src.push('\n');
        run(src);
    }

    #[test]
    fn a_banned_name_in_any_width_is_found(
        name in prop::sample::select(vec!["eval", "exec", "compile", "breakpoint"]),
        wide in prop::collection::vec(any::<bool>(), 10),
    ) {
        // Any mix of ASCII and full-width letters is the same identifier to CPython.
        let spelled: String = name
            .chars()
            .zip(wide.iter().cycle())
            .map(|(c, w)| if *w { char::from_u32(c as u32 + 0xFEE0).unwrap() } else { c })
            .collect();
        let called = run(format!("{spelled}(s)\n"));
        prop_assert_eq!(codes(&called), ["python.ban-call"]);
        let named = run(format!("f = x.{spelled}\n"));
        prop_assert_eq!(codes(&named), ["python.ban-name"]);
    }

    #[test]
    fn only_a_utf8_coding_declaration_is_admitted(
        name in prop::sample::select(vec![
            "utf-8", "utf8", "latin-1", "unicode_escape", "utf-7", "cp1252", "ascii",
            "utf-8-sig", "utf_16", "raw-unicode-escape",
        ]),
        upper in any::<bool>(),
        underscore in any::<bool>(),
        line in 0..3usize,
        style in prop::sample::select(vec!["# coding: {}\n", "# -*- coding: {} -*-\n", "# vim: set fileencoding={} :\n"]),
    ) {
        let mut spelled = if upper { name.to_uppercase() } else { name.to_owned() };
        if underscore {
            spelled = spelled.replace('-', "_");
        }
        let src = format!("{}{}x = 1\n", "\n".repeat(line), style.replace("{}", &spelled));
        let found = codes(&run(src));
        let utf8 = matches!(name, "utf-8" | "utf8");
        // The third line is not a declaration, for CPython or for the check.
        if utf8 || line == 2 {
            prop_assert!(found.is_empty(), "{:?}", found);
        } else {
            prop_assert_eq!(found, ["python.coding"]);
        }
    }
}
