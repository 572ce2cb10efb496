//! The evidence a stage's receipt names: what it preserved of a run beside its result — the
//! step's or engine's output, the bundle it launched, and the host's own records read before
//! release ([`cordon::lease::Manager::host_evidence`]) and the release's errors after it.
//!
//! It owns the recorder a stage's sessions write into ([`Evidence`], shared by clones), how the
//! receipt comes to name what was kept ([`Evidence::take`]) and the short escaped tail of a
//! failed run's output printed after its receipt ([`tail`]). Evidence is supplementary: the
//! receipt names it so an operator can read it, no verdict rests on it, and a stage that
//! cannot keep it does not report a result it cannot back (the session's caller decides).

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use cordon::receipt::{Evidence as Named, Outcome, Receipt};
use cordon::store::{Store, StoreError};

/// The recorder of one stage process: every piece kept is stored at once and named here until
/// a receipt takes it.
#[derive(Debug, Clone)]
pub struct Evidence {
    store: Store,
    kept: Arc<Mutex<Vec<Named>>>,
}

impl Evidence {
    /// A recorder storing into `store`.
    #[must_use]
    pub fn new(store: &Store) -> Self {
        Self {
            store: store.clone(),
            kept: Arc::default(),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Named>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Store `bytes` as evidence `name` and name it for the next receipt.
    ///
    /// # Errors
    /// The store could not keep it.
    pub fn keep(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let sha256 = self.store.put_evidence(bytes)?;
        self.kept().push(Named {
            name: name.to_owned(),
            sha256,
            bytes: bytes.len() as u64,
        });
        Ok(())
    }

    /// Whether a piece named `name` waits for the next receipt.
    #[must_use]
    pub fn has(&self, name: &str) -> bool {
        self.kept().iter().any(|e| e.name == name)
    }

    /// Everything kept since the last take, for a receipt to name.
    #[must_use]
    pub fn take(&self) -> Vec<Named> {
        std::mem::take(&mut *self.kept())
    }
}

/// How many lines of a failed run's output [`tail`] shows.
pub const TAIL_LINES: usize = 10;
/// How many bytes at most.
pub const TAIL_BYTES: usize = 2048;

/// After a receipt that is not `ok`, the last lines of the output it names (`stderr`, else
/// `stdout`) on `stderr`, read back from the store and escaped — candidate bytes never drive
/// the operator's terminal. Prints nothing when the receipt names no output.
pub fn tail(store: &Store, receipt: &Receipt, stage: &str, stderr: &mut dyn Write) {
    if receipt.outcome == Outcome::Ok {
        return;
    }
    let Some(log) = ["stderr", "stdout"].iter().find_map(|n| {
        receipt
            .evidence
            .iter()
            .find(|e| e.name == *n && e.bytes > 0)
    }) else {
        return;
    };
    let text = match store.read_evidence(&log.sha256) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("(cannot read it back: {e})"),
    };
    let _ = write!(
        stderr,
        "cordon-{stage}: the run's {} ended with ({} bytes in all, evidence {}):\n{}",
        log.name,
        log.bytes,
        log.sha256,
        cordon::text::terminal(&last_lines(&text))
    );
}

/// The last [`TAIL_LINES`] lines of `text`, at most [`TAIL_BYTES`] (cut on a character
/// boundary), each line indented, ending in a newline.
fn last_lines(text: &str) -> String {
    let text = text.trim_end_matches('\n');
    let mut start = text.len().saturating_sub(TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let recent = &text[start..];
    let lines: Vec<&str> = recent.split('\n').collect();
    let shown = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    shown.iter().map(|l| format!("  | {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use cordon::receipt::StageName;
    use cordon_canon::Digest;

    use super::*;

    fn stored(bytes: &[u8], outcome: Outcome) -> (tempfile::TempDir, Store, Receipt) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let evidence = Evidence::new(&store);
        evidence.keep("stderr", bytes).unwrap();
        assert!(evidence.has("stderr"));
        let mut r = Receipt::new(StageName::Prebuild, Digest::of_bytes(b"a"), outcome);
        r.evidence = evidence.take();
        assert!(!evidence.has("stderr"), "a take empties the recorder");
        (dir, store, r)
    }

    #[test]
    fn kept_evidence_is_stored_by_digest_and_named_once() {
        let (_dir, store, r) = stored(b"boom\n", Outcome::Rejected);
        assert_eq!(r.evidence.len(), 1);
        assert_eq!(r.evidence[0].bytes, 5);
        assert_eq!(
            store.read_evidence(&r.evidence[0].sha256).unwrap(),
            b"boom\n"
        );
        assert!(
            store
                .content_listing()
                .unwrap()
                .iter()
                .all(|l| !l.starts_with("evidence/")),
            "evidence is not content"
        );
    }

    #[test]
    fn the_tail_is_the_last_lines_escaped_and_only_after_a_failure() {
        let mut log = String::new();
        for i in 0..30 {
            log.push_str(&format!("line {i}\n"));
        }
        log.push_str("\u{1b}[2J\u{1b}]0;owned\u{7}all checks passed \u{202e}\n");
        let (_dir, store, r) = stored(log.as_bytes(), Outcome::Rejected);
        let mut out = Vec::new();
        tail(&store, &r, "prebuild", &mut out);
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("cordon-prebuild: the run's stderr ended with"),
            "{out}"
        );
        assert!(
            !out.contains("line 20\n") && out.contains("line 21\n"),
            "{out}"
        );
        assert!(
            !out.chars().any(|c| cordon::text::hostile(c) && c != '\n'),
            "{out:?}"
        );
        assert!(out.contains("\\u{1b}[2J"), "{out}");

        let (_dir, store, ok) = stored(log.as_bytes(), Outcome::Ok);
        let mut out = Vec::new();
        tail(&store, &ok, "prebuild", &mut out);
        assert!(out.is_empty(), "an ok run's output is not shown");
    }

    #[test]
    fn a_long_last_line_is_cut_on_a_character_boundary() {
        let long = "é".repeat(TAIL_BYTES);
        let shown = last_lines(&long);
        assert!(shown.len() <= TAIL_BYTES + 8, "{}", shown.len());
        assert!(shown.starts_with("  | é"));
    }
}
