//! The collect-all KDL decoding kit every cordon KDL input uses: the policy, the incumbent and
//! delta manifests (candidate-written: they get the same labelled diagnostics), the image specs.
//!
//! A decoder says what each node may hold; the kit checks it and reports a
//! [`crate::diag::Problem`] on the offending token when it does not. A getter that reports
//! returns `None`, so decoding goes on and the next problem is found too; [`decode`] returns the
//! value only when nothing at all was reported, and otherwise every problem in file order, each
//! with its language's stable code (`cordon::policy::…`, `cordon::manifest::…`, …).

use std::collections::BTreeMap;
use std::sync::Arc;

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};
use miette::{NamedSource, SourceSpan};

use crate::diag::{KdlError, Language, Problem, Source};
use crate::units;

/// The problems found so far, the language they are reported in, and the source they point
/// into.
pub struct Cx {
    source: Source,
    language: &'static Language,
    /// The problems, in discovery order.
    pub problems: Vec<Problem>,
}

/// Decode `text` (named `name` in diagnostics) as a document of `language` with `decoder`:
/// KDL syntax errors and every problem the decoder reports are collected; the value is
/// returned only when there are none.
///
/// # Errors
/// A [`KdlError`] holding every problem, each labelled on its token.
pub fn decode<T>(
    language: &'static Language,
    name: &str,
    text: &str,
    decoder: impl FnOnce(&mut Cx, &KdlDocument) -> Option<T>,
) -> Result<T, KdlError> {
    let shared = Arc::new(text.to_owned());
    let source = Arc::new(NamedSource::new(name, shared).with_language("kdl"));
    let mut cx = Cx::new(source, language);
    let value = match parse_bounded(&mut cx, text) {
        None => None,
        Some(Ok(doc)) => decoder(&mut cx, &doc),
        Some(Err(err)) => {
            for d in err.diagnostics {
                let label = d.label.unwrap_or_else(|| "here".to_owned());
                let message = d.message.unwrap_or_else(|| "invalid KDL".to_owned());
                cx.report("syntax", d.span, label, message, d.help);
            }
            None
        }
    };
    match value {
        Some(v) if cx.problems.is_empty() => Ok(v),
        _ => Err(KdlError::new(language, name.to_owned(), cx.problems)),
    }
}

/// The most children blocks (`{`) and the most block comments (`/*`, which nest) one KDL input
/// may hold. The parser recurses once per nesting level of either; counting every occurrence —
/// inside strings too — bounds the depth without trusting a pre-scan to agree with the parser
/// about where strings end. Cordon's own files hold a few dozen.
pub const MAX_BLOCKS: usize = 1024;

/// The stack the parser runs on: measured, a debug build of the parser overflows 8 MiB at about
/// 512 nested blocks, so 64 MiB holds [`MAX_BLOCKS`] with a fourfold margin whatever thread
/// (a 2 MiB test thread, say) calls [`decode`].
const PARSE_STACK: usize = 64 << 20;

/// Parse `text` after bounding its nesting; `None` when it is refused (reported as `too-deep`).
///
/// # Panics
/// The parsing thread cannot be started (the host is out of threads or memory): a host fault,
/// which the stage prologue's panic hook turns into a no-decision.
#[expect(
    clippy::panic,
    reason = "a host fault is not a problem of the file; the prologue's hook exits 3"
)]
fn parse_bounded(cx: &mut Cx, text: &str) -> Option<Result<KdlDocument, kdl::KdlError>> {
    for (token, what) in [("{", "children blocks"), ("/*", "block comments")] {
        let count = text.matches(token).count();
        if count > MAX_BLOCKS {
            // Label the first occurrence past the bound.
            let at = text
                .match_indices(token)
                .nth(MAX_BLOCKS)
                .map_or(0, |(i, _)| i);
            cx.report(
                "too-deep",
                SourceSpan::from((at, token.len())),
                "past the bound",
                format!("{count} {what}; at most {MAX_BLOCKS} are read (nesting is bounded before parsing)"),
                None,
            );
            return None;
        }
    }
    let parsed = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("kdl-parse".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(s, || KdlDocument::parse(text))
            .map(|h| h.join())
    });
    match parsed {
        Ok(Ok(result)) => Some(result),
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(e) => panic!("cannot start the KDL parsing thread: {e}"),
    }
}

impl Cx {
    /// An empty collection of problems in `language` about `source`.
    #[must_use]
    pub fn new(source: Source, language: &'static Language) -> Self {
        Self {
            source,
            language,
            problems: Vec::new(),
        }
    }

    /// Report a problem labelled at one place.
    pub fn report(
        &mut self,
        code: &'static str,
        span: SourceSpan,
        label: impl Into<String>,
        message: impl Into<String>,
        help: Option<String>,
    ) {
        self.report_at(code, vec![(span, label.into())], message, help);
    }

    /// Report a problem labelled at several places (duplicates, overlaps).
    pub fn report_at(
        &mut self,
        code: &'static str,
        labels: Vec<(SourceSpan, String)>,
        message: impl Into<String>,
        help: Option<String>,
    ) {
        self.problems.push(Problem::new(
            self.language,
            code,
            message.into(),
            labels,
            help,
            self.source.clone(),
        ));
    }

    /// Report a value outside its bound, naming the bound.
    pub fn out_of_range(&mut self, span: SourceSpan, what: &str, shown: &str, bound: &str) {
        self.report(
            "out-of-range",
            span,
            format!("allowed: {bound}"),
            format!("{what} {shown} is out of range"),
            Some(format!("{what} must be {bound}")),
        );
    }
}

/// Names seen so far in one scope; a second sighting is a `duplicate` labelled at both places.
#[derive(Default)]
pub struct Seen(BTreeMap<String, SourceSpan>);

impl Seen {
    /// Whether `key` is new here; reports the duplicate (built by `message`) when it is not.
    pub fn first(
        &mut self,
        cx: &mut Cx,
        key: &str,
        span: SourceSpan,
        message: impl FnOnce() -> String,
    ) -> bool {
        if let Some(first) = self.0.get(key) {
            cx.report_at(
                "duplicate",
                vec![(*first, "first here".into()), (span, "again here".into())],
                message(),
                None,
            );
            return false;
        }
        self.0.insert(key.to_owned(), span);
        true
    }
}

/// "did you mean" for a misspelt name: the nearest known name by edit distance, a tie going
/// to the one sharing the longest prefix (`storage` is nearer `store` than `stage`).
pub fn suggest<'a>(given: &str, known: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let prefix = |k: &str| {
        given
            .bytes()
            .zip(k.bytes())
            .take_while(|(a, b)| a == b)
            .count()
    };
    known
        .into_iter()
        .map(|k| {
            (
                strsim::levenshtein(given, k),
                std::cmp::Reverse(prefix(k)),
                k,
            )
        })
        .filter(|(d, _, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, _, k)| format!("did you mean `{k}`?"))
}

/// `a` or `an` before `name`, as it is read aloud.
fn article(name: &str) -> &'static str {
    if name.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// A node's positional (unnamed) entries, in order.
pub fn positional(node: &KdlNode) -> Vec<&KdlEntry> {
    node.entries()
        .iter()
        .filter(|e| e.name().is_none())
        .collect()
}

/// The node's name token, for labels.
pub fn name_span(node: &KdlNode) -> SourceSpan {
    node.name().span()
}

/// Check a node's shape: between `min` and `max` arguments, only `props` as properties (each
/// once), and a children block only when `children` allows it.
pub fn shape(cx: &mut Cx, node: &KdlNode, min: usize, max: usize, props: &[&str], children: bool) {
    let name = node.name().value();
    let args = positional(node);
    if args.len() < min {
        cx.report(
            "missing-argument",
            name_span(node),
            format!("needs {min} argument(s)"),
            format!("`{name}` needs {min} argument(s), found {}", args.len()),
            None,
        );
    }
    for extra in args.iter().skip(max) {
        cx.report(
            "unexpected-argument",
            extra.span(),
            "not expected",
            format!("`{name}` takes at most {max} argument(s)"),
            None,
        );
    }
    let mut seen = Seen::default();
    for entry in node.entries() {
        let Some(key) = entry.name() else { continue };
        let key_name = key.value();
        if !props.contains(&key_name) {
            let help = suggest(key_name, props.iter().copied()).or_else(|| {
                (!props.is_empty()).then(|| format!("`{name}` takes: {}", props.join(", ")))
            });
            cx.report(
                "unknown-property",
                key.span(),
                "unknown property",
                format!("`{name}` has no property `{key_name}`"),
                help,
            );
        } else {
            seen.first(cx, key_name, key.span(), || {
                format!("property `{key_name}` is given twice")
            });
        }
    }
    if !children && node.children().is_some() {
        cx.report(
            "unexpected-children",
            name_span(node),
            "takes no children block",
            format!("`{name}` takes no children block"),
            None,
        );
    }
}

/// A property entry by name (the first, when duplicated; [`shape`] reports the duplicate).
pub fn prop<'a>(node: &'a KdlNode, key: &str) -> Option<&'a KdlEntry> {
    node.entries()
        .iter()
        .find(|e| e.name().is_some_and(|n| n.value() == key))
}

/// A required property; reports `missing-property` when absent.
pub fn required_prop<'a>(cx: &mut Cx, node: &'a KdlNode, key: &str) -> Option<&'a KdlEntry> {
    let found = prop(node, key);
    if found.is_none() {
        cx.report(
            "missing-property",
            name_span(node),
            format!("needs {key}="),
            format!("`{}` needs property `{key}`", node.name().value()),
            None,
        );
    }
    found
}

fn kind_of(value: &KdlValue) -> &'static str {
    match value {
        KdlValue::String(_) => "a string",
        KdlValue::Integer(_) => "an integer",
        KdlValue::Float(_) => "a float",
        KdlValue::Bool(_) => "a boolean",
        KdlValue::Null => "#null",
    }
}

fn wrong_type(cx: &mut Cx, entry: &KdlEntry, want: &str) {
    cx.report(
        "wrong-type",
        entry.span(),
        format!("expected {want}"),
        format!("expected {want}, found {}", kind_of(entry.value())),
        None,
    );
}

fn no_annotation(cx: &mut Cx, entry: &KdlEntry) -> bool {
    if let Some(ty) = entry.ty() {
        cx.report(
            "wrong-type",
            ty.span(),
            "type annotations are not part of the policy language",
            format!("unexpected type annotation `({})`", ty.value()),
            None,
        );
        return false;
    }
    true
}

/// An entry's value as a string; reports `wrong-type` otherwise.
pub fn string(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    if !no_annotation(cx, entry) {
        return None;
    }
    match entry.value() {
        KdlValue::String(s) => Some(s.clone()),
        _ => {
            wrong_type(cx, entry, "a string");
            None
        }
    }
}

/// An entry's value as a boolean; reports `wrong-type` otherwise.
pub fn boolean(cx: &mut Cx, entry: &KdlEntry) -> Option<bool> {
    if !no_annotation(cx, entry) {
        return None;
    }
    match entry.value() {
        KdlValue::Bool(b) => Some(*b),
        _ => {
            wrong_type(cx, entry, "a boolean (#true or #false)");
            None
        }
    }
}

/// An integer within `min..=max`.
pub fn integer(cx: &mut Cx, entry: &KdlEntry, what: &str, min: u64, max: u64) -> Option<u64> {
    if !no_annotation(cx, entry) {
        return None;
    }
    let KdlValue::Integer(n) = entry.value() else {
        wrong_type(cx, entry, "an integer");
        return None;
    };
    match u64::try_from(*n) {
        Ok(v) if (min..=max).contains(&v) => Some(v),
        _ => {
            cx.out_of_range(
                entry.span(),
                what,
                &n.to_string(),
                &format!("{min}..={max}"),
            );
            None
        }
    }
}

/// One of a fixed set of strings.
pub fn choice(cx: &mut Cx, entry: &KdlEntry, what: &str, allowed: &[&str]) -> Option<String> {
    let value = string(cx, entry)?;
    if allowed.contains(&value.as_str()) {
        return Some(value);
    }
    let help = suggest(&value, allowed.iter().copied())
        .unwrap_or_else(|| format!("{what} is one of: {}", allowed.join(", ")));
    cx.report(
        "invalid-value",
        entry.span(),
        format!("not a valid {what}"),
        format!("{value:?} is not a valid {what}"),
        Some(help),
    );
    None
}

/// How a measured quantity is written and read back.
struct Measure {
    code: &'static str,
    label: &'static str,
    example: &'static str,
    parse: fn(&str) -> Result<u64, String>,
    format: fn(u64) -> String,
}

fn measured(
    cx: &mut Cx,
    entry: &KdlEntry,
    what: &str,
    min: u64,
    max: u64,
    m: &Measure,
) -> Option<u64> {
    let text = string(cx, entry)?;
    match (m.parse)(&text) {
        Err(message) => {
            cx.report(
                m.code,
                entry.span(),
                m.label,
                message,
                Some(m.example.into()),
            );
            None
        }
        Ok(v) if (min..=max).contains(&v) => Some(v),
        Ok(_) => {
            let bound = format!("{}..={}", (m.format)(min), (m.format)(max));
            cx.out_of_range(entry.span(), what, &text, &bound);
            None
        }
    }
}

/// A size string within `min..=max` bytes.
pub fn size(cx: &mut Cx, entry: &KdlEntry, what: &str, min: u64, max: u64) -> Option<u64> {
    const SIZE: Measure = Measure {
        code: "invalid-size",
        label: "not a size",
        example: "for example \"512MiB\" or \"4GiB\"",
        parse: units::parse_size,
        format: units::format_size,
    };
    measured(cx, entry, what, min, max, &SIZE)
}

/// A duration string within `min..=max` milliseconds.
pub fn duration(cx: &mut Cx, entry: &KdlEntry, what: &str, min: u64, max: u64) -> Option<u64> {
    const DURATION: Measure = Measure {
        code: "invalid-duration",
        label: "not a duration",
        example: "for example \"90s\" or \"10m\"",
        parse: units::parse_duration,
        format: units::format_duration,
    };
    measured(cx, entry, what, min, max, &DURATION)
}

/// An absolute, normalised path: starts with `/`, no empty, `.` or `..` components, no
/// trailing slash (except `/` itself), no NUL.
pub fn path(cx: &mut Cx, entry: &KdlEntry, what: &str) -> Option<String> {
    let text = string(cx, entry)?;
    let normal = text.starts_with('/')
        && !text.contains('\0')
        && (text == "/"
            || text[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."));
    if normal {
        Some(text)
    } else {
        cx.report(
            "invalid-path",
            entry.span(),
            "not an absolute normalised path",
            format!("{what} {text:?} is not an absolute normalised path"),
            Some("write it from `/`, without `.`, `..`, `//` or a trailing `/`".into()),
        );
        None
    }
}

/// A node's `reason="…"`: required and non-empty on every allow-list entry.
pub fn reason(cx: &mut Cx, node: &KdlNode) -> Option<String> {
    let Some(entry) = prop(node, "reason") else {
        cx.report(
            "missing-reason",
            name_span(node),
            "allow-list entry without a reason",
            format!(
                "`{}` is an allow-list entry and needs reason=\"…\"",
                node.name().value()
            ),
            Some("say why this entry is needed; reviewers read it in `cordon-policy diff`".into()),
        );
        return None;
    };
    let text = string(cx, entry)?;
    if text.trim().is_empty() {
        cx.report(
            "missing-reason",
            entry.span(),
            "empty reason",
            "reason is empty",
            None,
        );
        return None;
    }
    Some(text)
}

/// A positional argument by index, when present.
pub fn arg(node: &KdlNode, index: usize) -> Option<&KdlEntry> {
    positional(node).get(index).copied()
}

/// The children of a block, sorted by name, after checking that every name is known and that
/// names not in `multi` appear at most once.
pub struct Block<'a> {
    nodes: BTreeMap<&'a str, Vec<&'a KdlNode>>,
    span: SourceSpan,
    owner: String,
}

impl<'a> Block<'a> {
    /// Read a block's children, reporting unknown names, type annotations and repeats of
    /// names not in `multi`.
    pub fn read(
        cx: &mut Cx,
        doc: Option<&'a KdlDocument>,
        owner: &str,
        span: SourceSpan,
        known: &[&str],
        multi: &[&str],
    ) -> Self {
        let mut nodes: BTreeMap<&'a str, Vec<&'a KdlNode>> = BTreeMap::new();
        for node in doc.map(KdlDocument::nodes).unwrap_or_default() {
            let name = node.name().value();
            if let Some(ty) = node.ty() {
                cx.report(
                    "wrong-type",
                    ty.span(),
                    "type annotations are not part of this language",
                    format!("unexpected type annotation `({})` on `{name}`", ty.value()),
                    None,
                );
            }
            if !known.contains(&name) {
                let help = suggest(name, known.iter().copied())
                    .unwrap_or_else(|| format!("{owner} holds: {}", known.join(", ")));
                cx.report(
                    "unknown-node",
                    name_span(node),
                    "unknown node",
                    format!("{owner} has no node `{name}`"),
                    Some(help),
                );
                continue;
            }
            let list = nodes.entry(name).or_default();
            if !multi.contains(&name)
                && let Some(first) = list.first()
            {
                cx.report_at(
                    "duplicate",
                    vec![
                        (name_span(first), "first here".into()),
                        (name_span(node), "again here".into()),
                    ],
                    format!("`{name}` is given twice in {owner}"),
                    Some("keep one".into()),
                );
                continue;
            }
            list.push(node);
        }
        Self {
            nodes,
            span,
            owner: owner.to_owned(),
        }
    }

    /// An optional section node (no arguments, a children block) read as a block; when it is
    /// absent the block is empty and problems about it point at `fallback`.
    pub fn section(
        cx: &mut Cx,
        node: Option<&'a KdlNode>,
        owner: &str,
        fallback: SourceSpan,
        known: &[&str],
        multi: &[&str],
    ) -> Self {
        if let Some(n) = node {
            shape(cx, n, 0, 0, &[], true);
        }
        let span = node.map_or(fallback, name_span);
        Self::read(
            cx,
            node.and_then(KdlNode::children),
            owner,
            span,
            known,
            multi,
        )
    }

    /// The span problems about this block point at.
    pub fn span(&self) -> SourceSpan {
        self.span
    }

    /// The node `name`, if present.
    pub fn one(&self, name: &str) -> Option<&'a KdlNode> {
        self.nodes.get(name).and_then(|v| v.first().copied())
    }

    /// Every node `name`, in file order.
    pub fn all(&self, name: &str) -> Vec<&'a KdlNode> {
        self.nodes.get(name).cloned().unwrap_or_default()
    }

    /// A node that must be present; reports `missing-node` on the owner when it is not.
    pub fn required(&self, cx: &mut Cx, name: &str) -> Option<&'a KdlNode> {
        let found = self.one(name);
        if found.is_none() {
            cx.report(
                "missing-node",
                self.span,
                format!("needs `{name}`"),
                format!("{} needs {} `{name}` node", self.owner, article(name)),
                Some(format!(
                    "add {} `{name}` node: the reviewed files in the checkout (policy/evaluator.kdl, policy/examples/, images/*.kdl) show each node in use",
                    article(name)
                )),
            );
        }
        found
    }
}

/// A singleton node's one argument read by `read`, after checking it has exactly that argument
/// and the given properties.
pub fn single<T>(
    cx: &mut Cx,
    node: &KdlNode,
    props: &[&str],
    read: impl FnOnce(&mut Cx, &KdlEntry) -> Option<T>,
) -> Option<T> {
    shape(cx, node, 1, 1, props, false);
    arg(node, 0).and_then(|e| read(cx, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_name_the_nearest_known_word_or_nothing() {
        let known = ["network", "root", "ipc"];
        assert_eq!(
            suggest("netwrok", known).as_deref(),
            Some("did you mean `network`?")
        );
        assert_eq!(suggest("zzzzzzzz", known), None);
    }
}
