//! The two manifests materialization reads, both KDL v2.
//!
//! `cordon-incumbent.kdl`, at the root of an incumbent tree (operator-written, kept in the tree
//! so the tree digest covers it):
//!
//! ```kdl
//! incumbent "example-engine"
//! target "attention" path="engine/attention" python="engine.attention"
//! target "kernels" path="engine/kernels"
//! ```
//!
//! `cordon-delta.kdl`, at the root of a candidate delta archive (candidate-written, so every
//! problem is a rejection, never a usage error):
//!
//! ```kdl
//! delta target="attention" package="fast_attn" step="build-native"
//! executable "engine/attention/tools/gen.sh"
//! cuda-source "engine/attention/kernels/flash.cu"
//! dependency-patch "engine/attention/patches/triton.patch"
//! ```
//!
//! Unknown nodes and properties are errors; so is a missing or repeated required one.

use std::collections::{BTreeMap, BTreeSet};

use kdl::{KdlDocument, KdlNode};

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
}

/// The delta manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// The one target it replaces.
    pub target: String,
    /// The package name its own imports use (Python targets).
    pub package: Option<String>,
    /// The registered build step it asks for.
    pub step: Option<String>,
    /// Declared executables (tree paths).
    pub executables: BTreeSet<String>,
    /// Declared CUDA sources.
    pub cuda_sources: BTreeSet<String>,
    /// Declared dependency patches.
    pub dependency_patches: BTreeSet<String>,
}

/// A manifest problem, as a sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ManifestError {
    /// Which manifest.
    pub file: &'static str,
    /// What is wrong.
    pub message: String,
}

fn err(file: &'static str, message: impl Into<String>) -> ManifestError {
    ManifestError {
        file,
        message: message.into(),
    }
}

/// The positional string arguments and string properties of a node, refusing anything else.
fn read_node(
    file: &'static str,
    node: &KdlNode,
    allowed: &[&str],
    positional: usize,
) -> Result<(Vec<String>, BTreeMap<String, String>), ManifestError> {
    let name = node.name().value();
    if node.children().is_some() {
        return Err(err(file, format!("node {name:?} takes no children")));
    }
    let mut args = Vec::new();
    let mut props = BTreeMap::new();
    for entry in node.entries() {
        let Some(value) = entry.value().as_string() else {
            return Err(err(file, format!("node {name:?}: every value is a string")));
        };
        match entry.name() {
            None => args.push(value.to_owned()),
            Some(key) => {
                let key = key.value();
                if !allowed.contains(&key) {
                    return Err(err(
                        file,
                        format!("node {name:?}: unknown property {key:?}"),
                    ));
                }
                if props.insert(key.to_owned(), value.to_owned()).is_some() {
                    return Err(err(file, format!("node {name:?}: property {key:?} twice")));
                }
            }
        }
    }
    if args.len() != positional {
        return Err(err(
            file,
            format!("node {name:?} takes {positional} positional value(s)"),
        ));
    }
    Ok((args, props))
}

fn parse_doc(file: &'static str, text: &str) -> Result<KdlDocument, ManifestError> {
    KdlDocument::parse(text).map_err(|e| err(file, format!("not valid KDL: {e}")))
}

/// A clean relative directory or file path: no empty, `.` or `..` components, not absolute.
fn clean_path(file: &'static str, p: &str) -> Result<String, ManifestError> {
    let trimmed = p.strip_suffix('/').unwrap_or(p);
    if trimmed.is_empty()
        || trimmed.starts_with('/')
        || trimmed
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(err(file, format!("{p:?} is not a clean relative path")));
    }
    Ok(trimmed.to_owned())
}

/// A dotted Python name: identifiers joined by dots.
fn python_name(file: &'static str, n: &str) -> Result<String, ManifestError> {
    let ok = !n.is_empty()
        && n.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        });
    if ok {
        Ok(n.to_owned())
    } else {
        Err(err(file, format!("{n:?} is not a dotted Python name")))
    }
}

/// Parse an incumbent manifest.
///
/// # Errors
/// Any problem, as a sentence.
pub fn incumbent(text: &str) -> Result<Incumbent, ManifestError> {
    let file = INCUMBENT_MANIFEST;
    let doc = parse_doc(file, text)?;
    let mut name = None;
    let mut targets = BTreeMap::new();
    for node in doc.nodes() {
        match node.name().value() {
            "incumbent" => {
                let (args, _) = read_node(file, node, &[], 1)?;
                if name.replace(args[0].clone()).is_some() {
                    return Err(err(file, "\"incumbent\" appears twice"));
                }
            }
            "target" => {
                let (args, props) = read_node(file, node, &["path", "python"], 1)?;
                let path = props
                    .get("path")
                    .ok_or_else(|| err(file, format!("target {:?} needs path=", args[0])))?;
                let target = Target {
                    name: args[0].clone(),
                    path: clean_path(file, path)?,
                    python: props
                        .get("python")
                        .map(|p| python_name(file, p))
                        .transpose()?,
                };
                if targets.insert(args[0].clone(), target).is_some() {
                    return Err(err(file, format!("target {:?} appears twice", args[0])));
                }
            }
            other => return Err(err(file, format!("unknown node {other:?}"))),
        }
    }
    let name = name.ok_or_else(|| err(file, "missing \"incumbent\""))?;
    if targets.is_empty() {
        return Err(err(file, "no target is registered"));
    }
    let paths: Vec<&String> = targets.values().map(|t| &t.path).collect();
    for a in &paths {
        for b in &paths {
            if a != b && b.starts_with(&format!("{a}/")) {
                return Err(err(file, format!("targets {a:?} and {b:?} overlap")));
            }
        }
    }
    Ok(Incumbent { name, targets })
}

/// Parse a delta manifest.
///
/// # Errors
/// Any problem, as a sentence.
pub fn delta(text: &str) -> Result<Delta, ManifestError> {
    let file = DELTA_MANIFEST;
    let doc = parse_doc(file, text)?;
    let mut head: Option<BTreeMap<String, String>> = None;
    let mut executables = BTreeSet::new();
    let mut cuda_sources = BTreeSet::new();
    let mut dependency_patches = BTreeSet::new();
    for node in doc.nodes() {
        let set = match node.name().value() {
            "delta" => {
                let (_, props) = read_node(file, node, &["target", "package", "step"], 0)?;
                if head.replace(props).is_some() {
                    return Err(err(file, "\"delta\" appears twice"));
                }
                continue;
            }
            "executable" => &mut executables,
            "cuda-source" => &mut cuda_sources,
            "dependency-patch" => &mut dependency_patches,
            other => return Err(err(file, format!("unknown node {other:?}"))),
        };
        let (args, _) = read_node(file, node, &[], 1)?;
        let p = clean_path(file, &args[0])?;
        if !set.insert(p.clone()) {
            return Err(err(file, format!("{p:?} is declared twice")));
        }
    }
    let head = head.ok_or_else(|| err(file, "missing \"delta\""))?;
    let target = head
        .get("target")
        .ok_or_else(|| err(file, "\"delta\" needs target="))?
        .clone();
    Ok(Delta {
        target,
        package: head
            .get("package")
            .map(|p| python_name(file, p))
            .transpose()?,
        step: head.get("step").cloned(),
        executables,
        cuda_sources,
        dependency_patches,
    })
}
