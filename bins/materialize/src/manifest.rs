//! The two manifests materialization reads, both KDL v2.
//!
//! `cordon-incumbent.kdl`, at the root of an incumbent tree (operator-written, kept in the tree
//! so the tree digest covers it):
//!
//! ```kdl
//! incumbent "example-engine"
//! target "attention" path="engine/attention" python="engine.attention"
//! target "kernels" path="engine/kernels"
//! build step="build-native"
//! ```
//!
//! `build step=` names the registered prebuild step that builds the incumbent's own native
//! publication (role B of a qualification runs the incumbent's build, never the candidate's).
//!
//! `cordon-delta.kdl`, at the root of a candidate delta archive (candidate-written, so every
//! problem is a rejection, never a usage error):
//!
//! ```kdl
//! delta target="attention" package="fast_attn" tier="native-sources"
//! executable "engine/attention/tools/gen.sh"
//! native-source "engine/attention/kernels/flash.cu"
//! dependency-patch "engine/attention/patches/triton.patch"
//! factory "fast_attn.aot:build"
//! ```
//!
//! `tier=` is the reviewed-build tier of seed 001 §3 whose registered patcher builds the delta
//! (the policy maps each tier to one prebuild step); `step=`, when given, must name that same
//! patcher. `factory` is the sealed-direct-artifact tier's candidate factory, `module:callable`.
//!
//! Both are decoded with the policy language's collect-all kit: every problem is reported at
//! once, labelled on its token, with a stable code `cordon::manifest::<name>` ([`CODES`]).
//! Unknown nodes and properties are errors; so is a missing or repeated required one.

use std::collections::{BTreeMap, BTreeSet};

use cordon_policy_lang::kit::{
    Block, Cx, Seen, arg, choice, name_span, positional, prop, required_prop, shape, single, string,
};
use cordon_policy_lang::{BuildTier, KdlError, Keyword, Language};
use kdl::{KdlEntry, KdlNode};
use miette::SourceSpan;

/// The file name of the incumbent manifest.
pub const INCUMBENT_MANIFEST: &str = "cordon-incumbent.kdl";
/// The file name of the delta manifest.
pub const DELTA_MANIFEST: &str = "cordon-delta.kdl";

/// A registered target of an incumbent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Target {
    /// Its name.
    pub name: String,
    /// The subtree it occupies (a directory path).
    pub path: String,
    /// For a Python target, the import name the engine uses for it.
    pub python: Option<String>,
}

/// The incumbent manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incumbent {
    /// The engine's name.
    pub name: String,
    /// Targets by name.
    pub targets: BTreeMap<String, Target>,
    /// The registered prebuild step that builds the incumbent's publication.
    pub step: Option<String>,
}

/// The delta manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delta {
    /// The one target it replaces.
    pub target: String,
    /// The package name its own imports use (Python targets).
    pub package: Option<String>,
    /// The registered build step it asks for.
    pub step: Option<String>,
    /// The reviewed-build tier it declares.
    pub tier: Option<BuildTier>,
    /// Declared executables (tree paths).
    pub executables: BTreeSet<String>,
    /// Declared native sources: C, C++ and CUDA sources and headers.
    pub native_sources: BTreeSet<String>,
    /// Declared dependency patches.
    pub dependency_patches: BTreeSet<String>,
    /// The sealed-direct-artifact tier's factory, `module:callable`.
    pub factory: Option<String>,
}

/// Every manifest diagnostic code, with its meaning.
pub const CODES: &[(&str, &str)] = &[
    ("syntax", "the file is not valid KDL v2"),
    ("unknown-node", "a node the manifest does not define"),
    ("unknown-property", "a property this node does not take"),
    ("unexpected-argument", "more arguments than the node takes"),
    ("missing-argument", "fewer arguments than the node needs"),
    ("missing-property", "a required property is absent"),
    (
        "missing-node",
        "a required node is absent, or no target is registered",
    ),
    (
        "unexpected-children",
        "a children block on a node that takes none",
    ),
    (
        "wrong-type",
        "a value that is not a string, or a type annotation",
    ),
    (
        "duplicate",
        "the same node, target or declared path twice (both places are labelled)",
    ),
    ("invalid-path", "a path that is not clean and relative"),
    (
        "invalid-value",
        "a package or import name that is not a dotted Python name",
    ),
    ("overlap", "two targets whose paths nest"),
    (
        "too-deep",
        "more children blocks or block comments than the parser reads (bounded before parsing)",
    ),
];

/// The manifest language.
pub static MANIFEST: Language = Language {
    prefix: "cordon::manifest",
    noun: "manifest",
    codes: CODES,
};

/// A clean relative directory or file path: no empty, `.` or `..` components, none longer than
/// `NAME_MAX`, not absolute.
fn clean_path(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let p = string(cx, entry)?;
    let trimmed = p.strip_suffix('/').unwrap_or(&p);
    let bad = trimmed.is_empty()
        || trimmed.starts_with('/')
        || trimmed
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.len() > cordon::archive::NAME_MAX);
    if bad {
        cx.report(
            "invalid-path",
            entry.span(),
            "not a clean relative path",
            format!("{p:?} is not a clean relative path"),
            Some("write it relative to the tree root, without `.`, `..`, `//` or a name over 255 bytes".into()),
        );
        return None;
    }
    Some(trimmed.to_owned())
}

/// A dotted Python name: identifiers joined by dots.
/// Whether `n` is a dotted Python name of ASCII identifiers.
#[must_use]
pub fn is_python_name(n: &str) -> bool {
    !n.is_empty()
        && n.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
}

fn python_name(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let n = string(cx, entry)?;
    if is_python_name(&n) {
        return Some(n);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a dotted Python name",
        format!("{n:?} is not a dotted Python name"),
        None,
    );
    None
}

/// An optional property read by `read`: `Some(None)` when absent, `None` when it is bad.
fn optional(
    cx: &mut Cx,
    node: &KdlNode,
    key: &str,
    read: impl FnOnce(&mut Cx, &KdlEntry) -> Option<String>,
) -> Option<Option<String>> {
    match prop(node, key) {
        Some(e) => read(cx, e).map(Some),
        None => Some(None),
    }
}

/// Parse an incumbent manifest.
///
/// # Errors
/// Every problem, each labelled on its token.
pub fn incumbent(text: &str) -> Result<Incumbent, KdlError> {
    cordon_policy_lang::kit::decode(&MANIFEST, INCUMBENT_MANIFEST, text, |cx, doc| {
        let whole = SourceSpan::from((0, 0));
        let b = Block::read(
            cx,
            Some(doc),
            "the incumbent manifest",
            whole,
            &["incumbent", "target", "build"],
            &["target"],
        );
        let name = b
            .required(cx, "incumbent")
            .and_then(|n| single(cx, n, &[], string));
        let step = match b.one("build") {
            Some(n) => {
                shape(cx, n, 0, 0, &["step"], false);
                required_prop(cx, n, "step")
                    .and_then(|e| string(cx, e))
                    .map(Some)
            }
            None => Some(None),
        };
        let mut targets = BTreeMap::new();
        let mut spans: Vec<(String, SourceSpan)> = Vec::new();
        let mut seen = Seen::default();
        for n in b.all("target") {
            shape(cx, n, 1, 1, &["path", "python"], false);
            let tname = arg(n, 0).and_then(|e| string(cx, e));
            let path = required_prop(cx, n, "path").and_then(|e| clean_path(cx, e));
            let python = optional(cx, n, "python", python_name);
            let (Some(tname), Some(path), Some(python)) = (tname, path, python) else {
                continue;
            };
            if !seen.first(cx, &tname, name_span(n), || {
                format!("target {tname:?} appears twice")
            }) {
                continue;
            }
            let span = prop(n, "path").map_or(name_span(n), KdlEntry::span);
            if let Some((other, other_span)) = spans.iter().find(|(p, _)| {
                path.starts_with(&format!("{p}/"))
                    || p.starts_with(&format!("{path}/"))
                    || *p == path
            }) {
                cx.report_at(
                    "overlap",
                    vec![(*other_span, other.clone()), (span, path.clone())],
                    format!("targets {other:?} and {path:?} overlap"),
                    Some("each target occupies a subtree of its own".into()),
                );
                continue;
            }
            spans.push((path.clone(), span));
            targets.insert(
                tname.clone(),
                Target {
                    name: tname,
                    path,
                    python,
                },
            );
        }
        if b.all("target").is_empty() {
            cx.report(
                "missing-node",
                whole,
                "no target",
                "no target is registered",
                Some("register each replaceable subtree: target \"NAME\" path=\"…\"".into()),
            );
        }
        Some(Incumbent {
            name: name?,
            targets,
            step: step?,
        })
    })
}

/// Parse a delta manifest.
///
/// # Errors
/// Every problem, each labelled on its token.
pub fn delta(text: &str) -> Result<Delta, KdlError> {
    cordon_policy_lang::kit::decode(&MANIFEST, DELTA_MANIFEST, text, |cx, doc| {
        let whole = SourceSpan::from((0, 0));
        let b = Block::read(
            cx,
            Some(doc),
            "the delta manifest",
            whole,
            &[
                "delta",
                "executable",
                "native-source",
                "dependency-patch",
                "factory",
            ],
            &["executable", "native-source", "dependency-patch"],
        );
        let head = b.required(cx, "delta").and_then(|n| {
            shape(cx, n, 0, 0, &["target", "package", "step", "tier"], false);
            let target = required_prop(cx, n, "target").and_then(|e| string(cx, e));
            let package = optional(cx, n, "package", python_name);
            let step = optional(cx, n, "step", string);
            let tier = match prop(n, "tier") {
                Some(e) => choice(cx, e, "build tier", &BuildTier::keywords())
                    .and_then(|t| BuildTier::from_keyword(&t))
                    .map(Some),
                None => Some(None),
            };
            Some((target?, package?, step?, tier?))
        });
        let mut declared = |kind: &str| -> BTreeSet<String> {
            let mut out = BTreeSet::new();
            let mut seen = Seen::default();
            for n in b.all(kind) {
                shape(cx, n, 1, 1, &[], false);
                let Some(e) = positional(n).first().copied() else {
                    continue;
                };
                let Some(p) = clean_path(cx, e) else { continue };
                if seen.first(cx, &p, e.span(), || format!("{p:?} is declared twice")) {
                    out.insert(p);
                }
            }
            out
        };
        let executables = declared("executable");
        let native_sources = declared("native-source");
        let dependency_patches = declared("dependency-patch");
        let factory = match b.one("factory") {
            Some(n) => single(cx, n, &[], factory).map(Some),
            None => Some(None),
        };
        let (target, package, step, tier) = head?;
        let factory = factory?;
        Some(Delta {
            target,
            package,
            step,
            tier,
            executables,
            native_sources,
            dependency_patches,
            factory,
        })
    })
}

/// Whether `f` is a factory, `dotted.module:callable`.
#[must_use]
pub fn is_factory(f: &str) -> bool {
    f.split_once(':').is_some_and(|(module, callable)| {
        is_python_name(module) && is_python_name(callable) && !callable.contains('.')
    })
}

/// A factory, `dotted.module:callable`: the one name the compile child imports and calls.
fn factory(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let f = string(cx, entry)?;
    if is_factory(&f) {
        return Some(f);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not module:callable",
        format!("{f:?} is not a factory `dotted.module:callable`"),
        Some("name the module by its dotted import name and the callable after one colon".into()),
    );
    None
}
