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
//! Decoded with the policy language's collect-all kit: every problem at once, each labelled on
//! its token with a `cordon::image-spec::…` code ([`CODES`]). Unknown nodes and properties are
//! errors. Relative `from=` paths are relative to the spec.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cordon::image::ImageSpec;
use cordon_policy_lang::kit::{
    Block, Cx, Seen, arg, integer, name_span, path, positional, required_prop, shape, single,
    string,
};
use cordon_policy_lang::{KdlError, Language};
use kdl::KdlNode;
use miette::SourceSpan;

/// Every image-spec diagnostic code, with its meaning.
pub const CODES: &[(&str, &str)] = &[
    ("syntax", "the file is not valid KDL v2"),
    ("unknown-node", "a node the spec does not define"),
    ("unknown-property", "a property this node does not take"),
    ("unexpected-argument", "more arguments than the node takes"),
    ("missing-argument", "fewer arguments than the node needs"),
    ("missing-property", "a required property is absent"),
    ("missing-node", "the `image` node is absent"),
    (
        "unexpected-children",
        "a children block on a node that takes none",
    ),
    (
        "wrong-type",
        "a value of the wrong kind, or a type annotation",
    ),
    ("duplicate", "the same node, file or directory twice"),
    (
        "invalid-path",
        "an image path that is not absolute and normalised",
    ),
    ("out-of-range", "a mode with bits beyond 0o777"),
    (
        "too-deep",
        "more children blocks or block comments than the parser reads (bounded before parsing)",
    ),
];

/// The image-spec language.
pub static IMAGE_SPEC: Language = Language {
    prefix: "cordon::image-spec",
    noun: "image spec",
    codes: CODES,
};

/// Why a spec could not be read or decoded.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read image spec {file}")]
    #[diagnostic(
        code(cordon::image::spec_read),
        help(
            "name the spec file (a relative path is from the current directory; the pinned specs are images/prebuild.kdl and images/runtime.kdl in the checkout)"
        )
    )]
    Read {
        /// The spec file.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The spec does not decode: every problem, labelled.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Invalid(#[from] KdlError),
}

/// A permission mode: no bits beyond 0o777 (no setuid, setgid or sticky bit), shown in octal.
fn mode(cx: &mut Cx, node: &KdlNode) -> Option<u32> {
    let e = required_prop(cx, node, "mode")?;
    let m = integer(cx, e, "mode", 0, u64::from(u32::MAX))?;
    if m & !0o777 != 0 {
        cx.out_of_range(e.span(), "mode", &format!("0o{m:o}"), "0o0..=0o777");
        return None;
    }
    u32::try_from(m).ok()
}

/// Parse a spec; `base` resolves relative `from=` paths.
///
/// # Errors
/// Every problem, each labelled on its token.
pub fn parse(file: &str, text: &str, base: &Path) -> Result<ImageSpec, SpecError> {
    let spec = cordon_policy_lang::kit::decode(&IMAGE_SPEC, file, text, |cx, doc| {
        let b = Block::read(
            cx,
            Some(doc),
            "the image spec",
            SourceSpan::from((0, 0)),
            &["image", "file", "dir", "env", "entrypoint", "workdir"],
            &["file", "dir", "env"],
        );
        let name = b
            .required(cx, "image")
            .and_then(|n| single(cx, n, &[], string));
        let mut files = BTreeMap::new();
        let mut seen = Seen::default();
        for n in b.all("file") {
            shape(cx, n, 1, 1, &["from", "mode"], false);
            let to = arg(n, 0).and_then(|e| path(cx, e, "image path"));
            let from = required_prop(cx, n, "from").and_then(|e| string(cx, e));
            let m = mode(cx, n);
            let (Some(to), Some(from), Some(m)) = (to, from, m) else {
                continue;
            };
            if seen.first(cx, &to, name_span(n), || {
                format!("file {to} is given twice")
            }) {
                files.insert(to, (base.join(from), m));
            }
        }
        let mut dirs = BTreeMap::new();
        let mut seen = Seen::default();
        for n in b.all("dir") {
            shape(cx, n, 1, 1, &["mode"], false);
            let d = arg(n, 0).and_then(|e| path(cx, e, "image directory"));
            let m = mode(cx, n);
            let (Some(d), Some(m)) = (d, m) else { continue };
            if seen.first(cx, &d, name_span(n), || format!("dir {d} is given twice")) {
                dirs.insert(d, m);
            }
        }
        let mut env = Vec::new();
        for n in b.all("env") {
            shape(cx, n, 2, 2, &[], false);
            let k = arg(n, 0).and_then(|e| string(cx, e));
            let v = arg(n, 1).and_then(|e| string(cx, e));
            if let (Some(k), Some(v)) = (k, v) {
                env.push(format!("{k}={v}"));
            }
        }
        let entrypoint = match b.one("entrypoint") {
            Some(n) => {
                shape(cx, n, 1, usize::MAX, &[], false);
                positional(n)
                    .into_iter()
                    .map(|e| string(cx, e))
                    .collect::<Option<Vec<_>>>()?
            }
            None => Vec::new(),
        };
        let workdir = match b.one("workdir") {
            Some(n) => Some(single(cx, n, &[], |cx, e| path(cx, e, "workdir"))?),
            None => None,
        };
        Some(ImageSpec {
            name: name?,
            files,
            dirs,
            env,
            entrypoint,
            workdir,
        })
    })?;
    Ok(spec)
}

/// Read and parse a spec file.
///
/// # Errors
/// Unreadable or invalid.
pub fn load(file: &Path) -> Result<ImageSpec, SpecError> {
    let text = std::fs::read_to_string(file).map_err(|source| SpecError::Read {
        file: file.display().to_string(),
        source,
    })?;
    let base: PathBuf = file.parent().map(Path::to_path_buf).unwrap_or_default();
    parse(&file.display().to_string(), &text, &base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_spec_decodes_and_mistakes_are_all_reported() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/prebuild.kdl");
        let spec = load(&root).unwrap();
        assert!(spec.files.contains_key("/bin/sh"));
        let text = "image \"x\"\nfile \"bin/sh\" from=\"/bin/busybox\" mode=0o4755\ndir \"/tmp\"\nenv \"PATH\"\nlayer \"x\"\n";
        let SpecError::Invalid(e) = parse("t.kdl", text, Path::new("/")).unwrap_err() else {
            panic!("expected a decoding error");
        };
        let codes: Vec<&str> = e.problems().iter().map(|p| p.short_code()).collect();
        assert_eq!(
            codes,
            [
                "invalid-path",
                "out-of-range",
                "missing-property",
                "missing-argument",
                "unknown-node"
            ]
        );
        insta::assert_snapshot!(
            "image-spec-mistakes",
            e.render_text(&cordon::voice::Style::fixed(100).handler())
        );
    }
}
