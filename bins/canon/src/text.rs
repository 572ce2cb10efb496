//! Candidate text made safe for a terminal (brief §5: "candidate text is hostile on a terminal
//! too").
//!
//! It owns the one definition of a character that may drive or disguise a terminal —
//! [`hostile`]: every control character (C0, DEL, C1: escape sequences, carriage returns,
//! the single-byte CSI) and the bidirectional and zero-width formatting characters that make
//! text read otherwise than it is — and the escapes every output path uses:
//! - [`printable`]: one line of text for a receipt's message or a log summary, every hostile
//!   character written as Rust's `\u{..}` escape (newlines included);
//! - [`terminal`]: a rendered multi-line report (a diagnostic with a candidate's source line in
//!   it), the same escapes but its line breaks kept;
//! - [`json`]: JSON text, each hostile character a `\uXXXX` escape — the same JSON value, only
//!   ASCII where it matters; canonical JSON writes its strings through it, so a receipt printed
//!   on a terminal is safe too.
//!
//! It does not decide where candidate text flows; it is pure.

use std::borrow::Cow;

/// Whether `c` may drive or disguise a terminal: a control character, or a bidirectional or
/// zero-width formatting character.
#[must_use]
pub fn hostile(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

fn escaped(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| hostile(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hostile(c) && !keep(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` as one printable line: every hostile character escaped (`\u{1b}`, `\n`, `\u{202e}`).
#[must_use]
pub fn printable(text: &str) -> Cow<'_, str> {
    escaped(text, |_| false)
}

/// A rendered report for a terminal: every hostile character escaped but its line breaks.
#[must_use]
pub fn terminal(text: &str) -> Cow<'_, str> {
    escaped(text, |c| c == '\n')
}

/// JSON text with every hostile character outside the JSON syntax's own line breaks written as
/// a `\uXXXX` escape: the same JSON value. `text` must be JSON whose strings the serializer
/// already escaped its C0 controls in (as `serde_json` does), so every character replaced here
/// sits inside a string.
#[must_use]
pub fn json(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| hostile(c) && c != '\n') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hostile(c) && c != '\n' {
            // Every hostile character is in the Basic Multilingual Plane: one escape.
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn escape_sequences_returns_and_direction_overrides_are_escaped() {
        let evil = "ok\u{1b}[2J\u{1b}]0;title\u{7}\r\u{9b}31m\u{202e}gnp.exe\u{200b}";
        let p = printable(evil);
        assert!(!p.chars().any(hostile), "{p}");
        assert!(p.contains("\\u{1b}[2J") && p.contains("\\r") && p.contains("\\u{202e}"));
        assert_eq!(printable("plain text, ünïcode"), "plain text, ünïcode");
        assert_eq!(terminal("a\nb\u{1b}"), "a\nb\\u{1b}");
        assert_eq!(json("\"\u{9b}\u{202e}\""), "\"\\u009b\\u202e\"");
    }

    proptest! {
        /// Whatever the text, nothing hostile is left, and JSON keeps its value.
        #[test]
        fn nothing_hostile_survives_and_json_keeps_its_value(s in any::<String>()) {
            prop_assert!(!printable(&s).chars().any(hostile));
            prop_assert!(!terminal(&s).chars().any(|c| hostile(c) && c != '\n'));
            let encoded = serde_json::to_string(&s).unwrap();
            let safe = json(&encoded);
            prop_assert!(!safe.chars().any(hostile));
            prop_assert_eq!(serde_json::from_str::<String>(&safe).unwrap(), s);
        }
    }
}
