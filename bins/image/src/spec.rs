//! The image spec, KDL v2. Paths in the image are absolute; host files are read at build time.
//!
//! ```kdl
//! image "cordon-prebuild"
//! file "/bin/sh" from="/bin/busybox" mode=0o555
//! dir "/tmp" mode=0o755
//! env "PATH" "/bin"
//! entrypoint "/bin/sh"
//! workdir "/"
//! ```
//!
//! Unknown nodes and properties are errors. Relative `from=` paths are relative to the spec.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cordon::image::ImageSpec;
use kdl::{KdlDocument, KdlNode};

/// A spec problem.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{file}: {why}")]
#[diagnostic(code(cordon::image::spec))]
pub struct SpecError {
    /// The spec file.
    pub file: String,
    /// What is wrong.
    pub why: String,
}

fn strings(node: &KdlNode) -> Vec<String> {
    node.entries()
        .iter()
        .filter(|e| e.name().is_none())
        .filter_map(|e| e.value().as_string().map(str::to_owned))
        .collect()
}

/// Parse a spec; `base` resolves relative `from=` paths.
///
/// # Errors
/// Any problem, as a sentence.
pub fn parse(file: &str, text: &str, base: &Path) -> Result<ImageSpec, SpecError> {
    let err = |why: String| SpecError {
        file: file.to_owned(),
        why,
    };
    let doc = KdlDocument::parse(text).map_err(|e| err(format!("not valid KDL: {e}")))?;
    let mut spec = ImageSpec {
        name: String::new(),
        files: BTreeMap::new(),
        dirs: BTreeMap::new(),
        env: Vec::new(),
        entrypoint: Vec::new(),
        workdir: None,
    };
    for node in doc.nodes() {
        let name = node.name().value();
        let args = strings(node);
        let props: BTreeMap<&str, &kdl::KdlValue> = node
            .entries()
            .iter()
            .filter_map(|e| e.name().map(|n| (n.value(), e.value())))
            .collect();
        let allowed: &[&str] = match name {
            "file" => &["from", "mode"],
            "dir" => &["mode"],
            _ => &[],
        };
        if let Some(k) = props.keys().find(|k| !allowed.contains(k)) {
            return Err(err(format!("node {name:?}: unknown property {k:?}")));
        }
        let mode = || -> Result<u32, SpecError> {
            let v = props
                .get("mode")
                .and_then(|v| v.as_integer())
                .ok_or_else(|| err(format!("node {name:?} needs an integer mode=, e.g. 0o755")))?;
            u32::try_from(v)
                .ok()
                .filter(|m| *m & !0o777 == 0)
                .ok_or_else(|| err(format!("mode {v:o} has bits beyond 0o777")))
        };
        let one = || -> Result<String, SpecError> {
            match args.as_slice() {
                [a] => Ok(a.clone()),
                _ => Err(err(format!("node {name:?} takes one string"))),
            }
        };
        match name {
            "image" => spec.name = one()?,
            "file" => {
                let from = props
                    .get("from")
                    .and_then(|v| v.as_string())
                    .ok_or_else(|| err("file needs from=\"HOST PATH\"".into()))?;
                let from = base.join(from);
                if spec.files.insert(one()?, (from, mode()?)).is_some() {
                    return Err(err(format!("file {:?} twice", args[0])));
                }
            }
            "dir" => {
                if spec.dirs.insert(one()?, mode()?).is_some() {
                    return Err(err(format!("dir {:?} twice", args[0])));
                }
            }
            "env" => match args.as_slice() {
                [k, v] => spec.env.push(format!("{k}={v}")),
                _ => return Err(err("env takes a name and a value".into())),
            },
            "entrypoint" => spec.entrypoint = args,
            "workdir" => spec.workdir = Some(one()?),
            other => return Err(err(format!("unknown node {other:?}"))),
        }
    }
    if spec.name.is_empty() {
        return Err(err("missing \"image\"".into()));
    }
    Ok(spec)
}

/// Read and parse a spec file.
///
/// # Errors
/// Unreadable or invalid.
pub fn load(path: &Path) -> Result<ImageSpec, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|e| SpecError {
        file: path.display().to_string(),
        why: e.to_string(),
    })?;
    let base: PathBuf = path.parent().map(Path::to_path_buf).unwrap_or_default();
    parse(&path.display().to_string(), &text, &base)
}
