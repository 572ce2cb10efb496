//! Diagnostics of every KDL input: the languages and their stable codes, the problem type, and
//! how problems are rendered.
//!
//! Every problem found in a KDL file is collected (never only the first) and reported as a
//! miette diagnostic with a stable code `<language prefix>::<name>` (`cordon::policy::…` for
//! policies), a label on the offending token and, where a fix is known, help. This module owns
//! the policy's list of codes ([`CODES`]), which `policy/README.md` documents and the golden
//! tests cover one fixture each; other inputs declare their own [`Language`].

use std::fmt;
use std::sync::Arc;

use miette::{
    Diagnostic, GraphicalReportHandler, JSONReportHandler, LabeledSpan, NamedSource, SourceSpan,
};

/// Every diagnostic code, with the one-line meaning `policy/README.md` gives it.
pub const CODES: &[(&str, &str)] = &[
    ("syntax", "the file is not valid KDL v2"),
    ("unknown-node", "a node this section does not define"),
    ("unknown-property", "a property this node does not take"),
    ("unexpected-argument", "more arguments than the node takes"),
    ("missing-argument", "fewer arguments than the node needs"),
    ("missing-property", "a required property is absent"),
    ("missing-node", "a required node or section is absent"),
    (
        "unexpected-children",
        "a children block on a node that takes none",
    ),
    (
        "wrong-type",
        "a value of the wrong kind (string, integer, boolean) or with a type annotation",
    ),
    (
        "invalid-value",
        "a value outside the node's fixed set or format",
    ),
    (
        "out-of-range",
        "a number, size or duration outside its bound (the bound is named)",
    ),
    (
        "invalid-size",
        "a size not written as an integer with an IEC suffix",
    ),
    (
        "invalid-duration",
        "a duration not written as an integer with ms, s, m or h",
    ),
    ("invalid-path", "a path that is not absolute and normalised"),
    ("invalid-range", "an id range with a zero or inverted end"),
    (
        "duplicate",
        "the same node, property or entry twice (both places are labelled)",
    ),
    (
        "unresolved-reference",
        "a name that refers to no declared image, profile, stage or secret",
    ),
    (
        "unknown-syscall",
        "a name that is not an x86_64 system call",
    ),
    (
        "unknown-capability",
        "a name that is not a Linux capability",
    ),
    ("missing-reason", "an allow-list entry without reason=\"…\""),
    (
        "redundant-entry",
        "an entry that changes nothing (already allowed, or removing what is absent)",
    ),
    (
        "unsupported-version",
        "a policy language version this build does not read",
    ),
    (
        "not-allowed-in-stage",
        "a node or value that this stage kind may not have",
    ),
    (
        "weakened-control",
        "an attempt to turn off a control cordon never runs without",
    ),
    (
        "overlap",
        "paths or mount destinations that are not pairwise disjoint, or a reserved destination",
    ),
    (
        "too-deep",
        "more children blocks or block comments than the parser reads (bounded before parsing)",
    ),
    (
        "outside-image",
        "a registered step's argv naming a path the pinned image does not provide (a mount, /tmp, /proc, /dev, /sys)",
    ),
    (
        "python-isolated",
        "a lane or reference engine interpreter (python*) registered without -I",
    ),
    (
        "unsound-condition",
        "a seccomp test on a 32-bit argument that the 64-bit comparison would not enforce",
    ),
    (
        "unmodelled-argument",
        "a seccomp condition on a syscall whose argument widths cordon does not know",
    ),
];

/// One KDL input language: the prefix of its diagnostic codes, the noun its files are called
/// by, and its codes with their meanings.
#[derive(Debug)]
pub struct Language {
    /// `cordon::policy`, `cordon::manifest`, …
    pub prefix: &'static str,
    /// `policy`, `manifest`, … (used in summaries and as the JSON key of the file's name).
    pub noun: &'static str,
    /// Every code a problem of this language may carry, with its meaning.
    pub codes: &'static [(&'static str, &'static str)],
}

/// The policy language.
pub static POLICY: Language = Language {
    prefix: "cordon::policy",
    noun: "policy",
    codes: CODES,
};

/// The source a KDL file was read from, shared by all its problems.
pub type Source = Arc<NamedSource<Arc<String>>>;

/// One problem in a KDL file.
#[derive(Debug, Clone)]
pub struct Problem {
    language: &'static Language,
    code: &'static str,
    message: String,
    labels: Vec<(SourceSpan, String)>,
    help: Option<String>,
    source: Source,
}

impl Problem {
    pub(crate) fn new(
        language: &'static Language,
        code: &'static str,
        message: String,
        labels: Vec<(SourceSpan, String)>,
        help: Option<String>,
        source: Source,
    ) -> Self {
        debug_assert!(
            language.codes.iter().any(|(c, _)| *c == code),
            "undocumented code {code}"
        );
        Self {
            language,
            code,
            message,
            labels,
            help,
            source,
        }
    }

    /// The short code, without the language's prefix.
    #[must_use]
    pub fn short_code(&self) -> &'static str {
        self.code
    }

    /// The sentence.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The first label: where the problem is, and what is said there.
    #[must_use]
    pub fn primary(&self) -> Option<(SourceSpan, &str)> {
        self.labels.first().map(|(s, l)| (*s, l.as_str()))
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Problem {}

impl Diagnostic for Problem {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(format!("{}::{}", self.language.prefix, self.code)))
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h.clone()) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&*self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().map(|(span, text)| {
            LabeledSpan::new_with_span(Some(text.clone()), *span)
        })))
    }
}

/// A KDL file that did not decode: every problem found, in file order.
#[derive(Debug, thiserror::Error)]
#[error("{} {name} has {count} problem(s)", language.noun, count = problems.len())]
pub struct KdlError {
    language: &'static Language,
    name: String,
    problems: Vec<Problem>,
}

/// A policy file that did not validate.
pub type PolicyError = KdlError;

impl Diagnostic for KdlError {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(format!("{}::invalid", self.language.prefix)))
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn Diagnostic> + 'a>> {
        Some(Box::new(self.problems.iter().map(|p| p as &dyn Diagnostic)))
    }
}

/// The most problems [`KdlError::render_text`] shows: past them a file is
/// rarely the language at all, and the terminal is the operator's.
const SHOWN: usize = 10;

/// The most lines one rendered problem keeps in a flood (more than [`SHOWN`] problems): a span
/// over a whole file that is not this language would otherwise quote all of it.
const PROBLEM_LINES: usize = 24;

/// `report` with at most [`PROBLEM_LINES`] lines: its head and its last lines (the help),
/// the middle said as a count.
fn clipped(report: &str) -> String {
    let lines: Vec<&str> = report.lines().collect();
    if lines.len() <= PROBLEM_LINES {
        return report.to_owned();
    }
    let tail = 4;
    let head = PROBLEM_LINES - tail - 1;
    let mut out = lines[..head].join("\n");
    out.push_str(&format!(
        "\n      ... ({} lines of the source not shown)\n",
        lines.len() - head - tail
    ));
    out.push_str(&lines[lines.len() - tail..].join("\n"));
    out.push('\n');
    out
}

impl KdlError {
    pub(crate) fn new(
        language: &'static Language,
        name: String,
        mut problems: Vec<Problem>,
    ) -> Self {
        // File order reads best; ties keep discovery order (the sort is stable).
        problems.sort_by_key(|p| p.labels.first().map_or(0, |(s, _)| s.offset()));
        Self {
            language,
            name,
            problems,
        }
    }

    /// The problems, in file order.
    #[must_use]
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Render every problem as text with `handler` (the stages build it for their stderr, the
    /// golden tests a fixed one: `cordon::voice::Style`).
    #[must_use]
    pub fn render_text(&self, handler: &GraphicalReportHandler) -> String {
        let mut out = String::new();
        for problem in self.problems.iter().take(SHOWN) {
            let mut one = String::new();
            // Writing to a String cannot fail.
            let _ = handler.render_report(&mut one, problem);
            // Only a flood is clipped: a real file's few problems keep every line they quote.
            if self.problems.len() > SHOWN {
                out.push_str(&clipped(&one));
            } else {
                out.push_str(&one);
            }
            out.push('\n');
        }
        // A file that is not this language at all (a README, the other language's file)
        // has a problem on every line: the first ones say what it is.
        if let Some(more) = self.problems.len().checked_sub(SHOWN).filter(|n| *n > 0) {
            out.push_str(&format!(
                "... and {more} more not shown (`--diagnostics json` lists every one); is this a {} file at all?\n",
                self.language.noun
            ));
        }
        out.push_str(&format!("{self}\n"));
        out
    }

    /// Render every problem as one JSON document (`--diagnostics json`).
    #[must_use]
    pub fn render_json(&self) -> String {
        let handler = JSONReportHandler::new();
        let mut items = Vec::new();
        for problem in &self.problems {
            let mut one = String::new();
            let _ = handler.render_report(&mut one, problem);
            items.push(one);
        }
        format!(
            "{{{}:{},\"problems\":[{}]}}",
            serde_json::Value::String(self.language.noun.to_owned()),
            serde_json::Value::String(self.name.clone()),
            items.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_problem_renders_in_text_and_json_with_its_code_and_place() {
        let text = "policy \"p\" version=2\n";
        let err = crate::parse("p.kdl", text).unwrap_err();
        let rendered = err.render_text(
            &miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
                .with_width(100),
        );
        assert!(
            rendered.contains("cordon::policy::unsupported-version"),
            "{rendered}"
        );
        assert!(rendered.contains("p.kdl:1:"), "{rendered}");
        let json: serde_json::Value = serde_json::from_str(&err.render_json()).unwrap();
        assert!(json.to_string().contains("unsupported-version"), "{json}");
    }
}
