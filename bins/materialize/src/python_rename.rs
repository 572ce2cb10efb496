//! The rename of a candidate's package to its namespace, as the parent applies it: the edits
//! the confined analysis child computed ([`crate::python`]'s checks) are checked one by one
//! here before any is applied, so a subverted child can rename, never write code.

/// A rename of the candidate's package to its namespace.
#[derive(Debug, Clone, Copy)]
pub struct Rename<'a> {
    /// The package name the candidate's own imports use.
    pub package: &'a str,
    /// The namespace it becomes.
    pub namespace: &'a str,
}

/// One edit of a rename: the bytes `start..end` become `replacement`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// Start of the replaced bytes.
    pub start: usize,
    /// End of the replaced bytes (`start` for an insertion).
    pub end: usize,
    /// What they become.
    pub replacement: String,
}

/// The rewritten source: `edits` applied to `source`, or `None` when there are none. Each edit
/// must be one a rename makes — the package's own dotted name (ASCII, as written) becoming
/// the namespace's, `package` becoming `namespace as package`, or the insertion
/// `; package = namespace` — sorted, in bounds and not overlapping: edits computed by a
/// confined child are checked here, so a subverted child can rename, never write code.
///
/// # Errors
/// The first edit that is not a rename's.
pub fn apply(source: &str, edits: &[Edit], rename: Rename<'_>) -> Result<Option<String>, String> {
    if edits.is_empty() {
        return Ok(None);
    }
    let (p, ns) = (rename.package, rename.namespace);
    let mut out = String::with_capacity(source.len() + edits.len() * 16);
    let mut pos = 0;
    // The end of the last rename (not insertion) edit: a rebinding insertion must follow one.
    let mut renamed_to: Option<usize> = None;
    for e in edits {
        let Some(original) = source.get(e.start..e.end).filter(|_| e.start >= pos) else {
            return Err(format!(
                "edit {}..{} is out of order, out of bounds or splits a character",
                e.start, e.end
            ));
        };
        let dotted = original == p
            || (original.starts_with(p)
                && original[p.len()..].starts_with('.')
                && original
                    .bytes()
                    .all(|b| b == b'.' || b == b'_' || b.is_ascii_alphanumeric()));
        let ok = if e.start == e.end {
            // Only at the end of the logical line a rename is on: nothing but names, dots,
            // commas, blanks and line continuations since that rename, and a token boundary
            // after (so it can never split a quote and turn a string into code).
            let between = renamed_to.and_then(|r| source.get(r..e.start));
            let after = source[e.start..].chars().next();
            e.replacement == format!("; {p} = {ns}")
                && between.is_some_and(|b| {
                    let joined = b.replace("\\\r\n", "").replace("\\\n", "");
                    joined
                        .chars()
                        .all(|c| c.is_alphanumeric() || "_., \t\x0c".contains(c))
                })
                && after.is_none_or(|c| "\n\r;# \t\x0c".contains(c))
        } else {
            dotted
                && (e.replacement == format!("{ns}{}", &original[p.len()..])
                    || (original == p && e.replacement == format!("{ns} as {p}")))
        };
        if !ok {
            return Err(format!(
                "edit {}..{} ({original:?} → {:?}) is not a rename of {p:?} to {ns:?}",
                e.start, e.end, e.replacement
            ));
        }
        out.push_str(&source[pos..e.start]);
        out.push_str(&e.replacement);
        pos = e.end;
        if e.start != e.end {
            renamed_to = Some(e.end);
        }
    }
    out.push_str(&source[pos..]);
    Ok(Some(out))
}
