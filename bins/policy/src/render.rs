//! `cordon-policy render`: a reviewed policy made concrete for one host.
//!
//! Owns the one way a deployment (the NixOS module, or an operator by hand) changes a reviewed
//! policy: it sets host facts — the store, the run directory, the runtime binary's path and its
//! sha256 pin, the image and worker pins of the images this host built or was given, the
//! per-run account ranges and shell, the surface's state directory — on the
//! parsed document, at fixed node paths, and nowhere else. A comment or a string that happens
//! to read `store "…"` is never touched, a node the reviewed policy lacks is an error (never
//! added silently, except the runtime's `sha256`, which is what rendering is for), and the
//! result must pass the same validation as any policy. Then the semantic diff between the
//! reviewed and the rendered policy must name only the fields that were set: anything else is
//! refused. The diff is what the reviewer reads.
//!
//! Writes nothing itself: the caller writes the text it returns.

use std::path::{Path, PathBuf};

use cordon::canonical::Digest;
use cordon_policy_lang::{Policy, PolicyError, diff};
use kdl::{KdlDocument, KdlEntry, KdlEntryFormat, KdlNode, KdlValue};

/// The host facts to set; `None` leaves the reviewed value.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// The store directory (top-level `store`).
    pub store: Option<String>,
    /// The run-directory root (top-level `run-dir`).
    pub run_dir: Option<String>,
    /// The runtime binary (top-level `runtime` `path=`); its sha256 becomes `sha256=`.
    pub runtime: Option<RuntimeBinary>,
    /// Image pins (top-level `image ROLE digest=`), by role: the manifests of layouts this host
    /// has (built here, or a Nix store's).
    pub images: Vec<(String, Digest)>,
    /// The worker pin (top-level `worker digest=`): the sha256 of the worker binary the runtime
    /// image holds.
    pub worker: Option<Digest>,
    /// The per-run uid range (`accounts` → `uid-range`), first and last.
    pub uid_range: Option<(u32, u32)>,
    /// The per-run gid range (`accounts` → `gid-range`).
    pub gid_range: Option<(u32, u32)>,
    /// The per-run accounts' shell (`accounts` → `shell`).
    pub shell: Option<String>,
    /// The surface's state directory (`stage "surface"` → `surface` → `state-dir`).
    pub state_dir: Option<String>,
    /// The surface's egress domains for this deployment (`stage "surface"` → `surface` →
    /// `egress` → `domain`): only a narrowing — each must be one the reviewed policy lists, or
    /// a name or `*.` suffix below one of its `*.` suffixes.
    pub egress_domains: Option<Vec<String>>,
}

/// The runtime binary a host runs, with the bytes' digest.
#[derive(Debug, Clone)]
pub struct RuntimeBinary {
    /// Its path, as the policy will name it.
    pub path: PathBuf,
    /// The sha256 of its bytes.
    pub sha256: Digest,
}

impl RuntimeBinary {
    /// Hash the binary at `path`.
    ///
    /// # Errors
    /// It cannot be read.
    pub fn at(path: &Path) -> Result<Self, RenderError> {
        Ok(Self {
            path: path.to_path_buf(),
            sha256: file_digest("runtime binary", path)?,
        })
    }
}

/// The sha256 of the file at `path` (the `what` of a pin, for the error).
///
/// # Errors
/// It cannot be read.
pub fn file_digest(what: &'static str, path: &Path) -> Result<Digest, RenderError> {
    let bytes = std::fs::read(path).map_err(|source| RenderError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Digest::of_bytes(&bytes))
}

/// An image pin from `ROLE=LAYOUT`: the role and the manifest the OCI layout's index names,
/// once the whole layout verifies against it (every blob's bytes, as a stage checks them).
///
/// # Errors
/// Not `ROLE=LAYOUT`, or the layout is unreadable, not one image, or does not verify.
pub fn layout_pin(arg: &str) -> Result<(String, Digest), RenderError> {
    let (role, layout) = arg
        .split_once('=')
        .filter(|(r, l)| !r.is_empty() && !l.is_empty())
        .ok_or_else(|| RenderError::Image(format!("{arg:?} is not ROLE=LAYOUT")))?;
    let layout = Path::new(layout);
    let index = layout.join("index.json");
    let text = std::fs::read(&index).map_err(|source| RenderError::Read {
        what: "image index",
        path: index.clone(),
        source,
    })?;
    let manifests = serde_json::from_slice::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("manifests")?.as_array().cloned())
        .unwrap_or_default();
    let [manifest] = manifests.as_slice() else {
        return Err(RenderError::Image(format!(
            "{} does not name exactly one manifest",
            index.display()
        )));
    };
    let digest: Digest = manifest
        .get("digest")
        .and_then(serde_json::Value::as_str)
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| {
            RenderError::Image(format!("{} names no sha256 manifest", index.display()))
        })?;
    cordon::image::verify(layout, &digest)
        .map_err(|e| RenderError::Image(format!("{}: {e}", layout.display())))?;
    Ok((role.to_owned(), digest))
}

/// Why a policy could not be rendered.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RenderError {
    /// The reviewed or the rendered policy is not valid.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Policy(#[from] PolicyError),
    /// A file to pin (the runtime binary, the worker, an image's index) cannot be read.
    #[error("cannot read the {what} {path}")]
    #[diagnostic(code(cordon::render::read))]
    Read {
        /// What it is.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An image layout to pin is not one verified image.
    #[error("cannot pin the image: {0}")]
    #[diagnostic(
        code(cordon::render::image),
        help("give ROLE=LAYOUT, the directory `cordon-image build --out` made")
    )]
    Image(String),
    /// A node the fact is set on is missing, or present more than once.
    #[error("the reviewed policy has {count} {what} node(s); rendering sets exactly one")]
    #[diagnostic(
        code(cordon::render::node),
        help("add it to the reviewed policy (a change a reviewer sees), or do not set this fact")
    )]
    Node {
        /// The node's path.
        what: String,
        /// How many there are.
        count: usize,
    },
    /// The node holds a value of another shape than the fact.
    #[error("{what} does not hold {expected}")]
    #[diagnostic(code(cordon::render::shape))]
    Shape {
        /// The node's path.
        what: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A value would not round-trip through KDL text (cannot happen for valid UTF-8 text).
    #[error("the reviewed policy is not KDL cordon can rewrite: {0}")]
    #[diagnostic(code(cordon::render::kdl))]
    Kdl(String),
    /// A deployment's egress domain is not within the reviewed allow-list.
    #[error("egress domain {0:?} is not within the reviewed policy's egress domains")]
    #[diagnostic(
        code(cordon::render::widened),
        help(
            "rendering only narrows the allow-list; a new domain is a change to the reviewed policy"
        )
    )]
    Widened(String),
    /// The rendered policy differs from the reviewed one in a field no fact names.
    #[error("rendering changed {0}, which no host fact names")]
    #[diagnostic(code(cordon::render::unexpected))]
    Unexpected(String),
    /// The canonical forms could not be made.
    #[error("cannot encode the canonical form")]
    #[diagnostic(code(cordon::render::encode))]
    Encode(#[source] cordon::canonical::CanonicalError),
}

/// The rendered policy text and the semantic changes from the reviewed one.
#[derive(Debug)]
pub struct Rendered {
    /// The policy text for the host.
    pub text: String,
    /// The reviewed → rendered changes, as `cordon-policy diff` prints them.
    pub changes: Vec<diff::Change>,
}

/// Render `reviewed` (named `name` in diagnostics) with `facts`.
///
/// # Errors
/// The reviewed policy is invalid; a fact's node is missing, doubled or of another shape; the
/// result is invalid or differs in a field no fact names.
pub fn render(name: &str, reviewed: &str, facts: &HostFacts) -> Result<Rendered, RenderError> {
    // Validated first (nesting bounded, every problem labelled) before the document is edited.
    let before = cordon_policy_lang::parse(name, reviewed)?;
    let mut doc = KdlDocument::parse(reviewed).map_err(|e| RenderError::Kdl(e.to_string()))?;
    // Each image pin set is allowed to change on its own role only.
    let image_paths: Vec<String> = facts
        .images
        .iter()
        .map(|(role, _)| format!("image.{role}"))
        .collect();
    let mut allowed: Vec<&str> = Vec::new();
    if let Some(store) = &facts.store {
        set_arg(only(doc.nodes_mut(), "store", None)?, "store", 0, store)?;
        allowed.push("store");
    }
    if let Some(run_dir) = &facts.run_dir {
        set_arg(
            only(doc.nodes_mut(), "run-dir", None)?,
            "run-dir",
            0,
            run_dir,
        )?;
        allowed.push("run-dir");
    }
    if let Some(rt) = &facts.runtime {
        let node = only(doc.nodes_mut(), "runtime", None)?;
        let path = rt.path.to_str().ok_or(RenderError::Shape {
            what: "runtime path".into(),
            expected: "a UTF-8 path",
        })?;
        set_prop(node, "path", path)?;
        set_prop(node, "sha256", &rt.sha256.to_string())?;
        allowed.extend(["runtime.path", "runtime.sha256"]);
    }
    for (role, digest) in &facts.images {
        let node = only(doc.nodes_mut(), "image", Some(role))?;
        set_prop(node, "digest", &digest.to_string())?;
    }
    allowed.extend(image_paths.iter().map(String::as_str));
    if let Some(worker) = &facts.worker {
        set_prop(
            only(doc.nodes_mut(), "worker", None)?,
            "digest",
            &worker.to_string(),
        )?;
        allowed.push("worker");
    }
    let accounts = [
        ("uid-range", facts.uid_range),
        ("gid-range", facts.gid_range),
    ];
    for (key, range) in accounts {
        if let Some((first, last)) = range {
            let node = only(
                children(only(doc.nodes_mut(), "accounts", None)?)?,
                key,
                None,
            )?;
            let what = format!("accounts {key}");
            set_value(
                node,
                &what,
                0,
                KdlValue::Integer(first.into()),
                first.to_string(),
            )?;
            set_value(
                node,
                &what,
                1,
                KdlValue::Integer(last.into()),
                last.to_string(),
            )?;
        }
    }
    if facts.uid_range.is_some() {
        allowed.push("accounts.uid-range");
    }
    if facts.gid_range.is_some() {
        allowed.push("accounts.gid-range");
    }
    if let Some(shell) = &facts.shell {
        let node = only(
            children(only(doc.nodes_mut(), "accounts", None)?)?,
            "shell",
            None,
        )?;
        set_arg(node, "accounts shell", 0, shell)?;
        allowed.push("accounts.shell");
    }
    if let Some(dir) = &facts.state_dir {
        let stage = only(doc.nodes_mut(), "stage", Some("surface"))?;
        let surface = only(children(stage)?, "surface", None)?;
        let node = only(children(surface)?, "state-dir", None)?;
        set_arg(node, "surface state-dir", 0, dir)?;
        allowed.push("stage.surface.surface.state-dir");
    }
    if let Some(domains) = &facts.egress_domains {
        let reviewed: Vec<&str> = before
            .stage(cordon_policy_lang::StageKind::Surface)
            .and_then(|s| s.surface.as_ref())
            .and_then(|s| s.egress.as_ref())
            .map(|e| e.domain.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for d in domains {
            if !reviewed.iter().any(|r| within(d, r)) {
                return Err(RenderError::Widened(d.clone()));
            }
        }
        let stage = only(doc.nodes_mut(), "stage", Some("surface"))?;
        let surface = only(children(stage)?, "surface", None)?;
        let egress = only(children(surface)?, "egress", None)?;
        let nodes = egress
            .children_mut()
            .as_mut()
            .ok_or(RenderError::Node {
                what: "egress { … }".into(),
                count: 0,
            })?
            .nodes_mut();
        // One `domain` node holds the deployment's list; the reviewed ones go.
        let first = nodes
            .iter()
            .position(|n| n.name().value() == "domain")
            .ok_or(RenderError::Node {
                what: "egress domain".into(),
                count: 0,
            })?;
        let mut index = 0;
        nodes.retain(|n| {
            index += 1;
            index - 1 == first || n.name().value() != "domain"
        });
        let node = &mut nodes[first];
        node.entries_mut().clear();
        for d in domains {
            let mut entry = KdlEntry::new(KdlValue::Null);
            spell(
                &mut entry,
                KdlValue::String(d.clone()),
                quoted("egress domain", d)?,
            );
            node.push(entry);
        }
        allowed.push("stage.surface.surface.egress.domain");
    }
    let text = doc.to_string();
    let after = cordon_policy_lang::parse(name, &text)?;
    let encode = |p: &Policy| p.canonical_value().map_err(RenderError::Encode);
    let changes = diff::diff(&encode(&before)?, &encode(&after)?);
    if let Some(c) = unexpected(&changes, &allowed) {
        return Err(RenderError::Unexpected(c.line.clone()));
    }
    Ok(Rendered { text, changes })
}

/// The first change whose path no fact set (`allowed`: a path, or its parent).
fn unexpected<'c>(changes: &'c [diff::Change], allowed: &[&str]) -> Option<&'c diff::Change> {
    changes.iter().find(|c| {
        let path = c.line.split(": ").next().unwrap_or_default();
        !allowed
            .iter()
            .any(|a| path == *a || path.starts_with(&format!("{a}.")))
    })
}

/// Whether the egress domain `d` is within the reviewed entry `r`: equal, or below a `*.`
/// suffix (`api.x.example` or `*.api.x.example` within `*.x.example`).
fn within(d: &str, r: &str) -> bool {
    let d = d.to_ascii_lowercase();
    if d == r {
        return true;
    }
    let name = d.strip_prefix("*.").unwrap_or(&d);
    r.strip_prefix('*')
        .is_some_and(|suffix| name.ends_with(suffix) && name.len() > suffix.len())
}

/// The one node named `name` (whose first argument is `arg0`, when given) in `nodes`.
fn only<'a>(
    nodes: &'a mut [KdlNode],
    name: &str,
    arg0: Option<&str>,
) -> Result<&'a mut KdlNode, RenderError> {
    let matches = |n: &KdlNode| {
        n.name().value() == name
            && arg0.is_none_or(|a| {
                n.entries()
                    .iter()
                    .find(|e| e.name().is_none())
                    .and_then(|e| e.value().as_string())
                    == Some(a)
            })
    };
    let what = match arg0 {
        Some(a) => format!("{name} {a:?}"),
        None => name.to_owned(),
    };
    let count = nodes.iter().filter(|n| matches(n)).count();
    match nodes.iter_mut().find(|n| matches(n)) {
        Some(node) if count == 1 => Ok(node),
        _ => Err(RenderError::Node { what, count }),
    }
}

/// A node's children, as a list to search.
fn children(node: &mut KdlNode) -> Result<&mut [KdlNode], RenderError> {
    let name = node.name().value().to_owned();
    node.children_mut()
        .as_mut()
        .map(|d| d.nodes_mut().as_mut_slice())
        .ok_or(RenderError::Node {
            what: format!("{name} {{ … }}"),
            count: 0,
        })
}

/// Set the `index`-th positional argument (which must exist) to the string `value`.
fn set_arg(node: &mut KdlNode, what: &str, index: usize, value: &str) -> Result<(), RenderError> {
    let repr = quoted(what, value)?;
    set_value(node, what, index, KdlValue::String(value.to_owned()), repr)
}

fn set_value(
    node: &mut KdlNode,
    what: &str,
    index: usize,
    value: KdlValue,
    repr: String,
) -> Result<(), RenderError> {
    let entry = node
        .entries_mut()
        .iter_mut()
        .filter(|e| e.name().is_none())
        .nth(index)
        .ok_or(RenderError::Shape {
            what: what.to_owned(),
            expected: "the argument rendering sets",
        })?;
    spell(entry, value, repr);
    Ok(())
}

/// Set (or add) the property `key` to the string `value`.
fn set_prop(node: &mut KdlNode, key: &str, value: &str) -> Result<(), RenderError> {
    let repr = quoted(key, value)?;
    let value = KdlValue::String(value.to_owned());
    match node.entry_mut(key) {
        Some(entry) => spell(entry, value, repr),
        None => {
            let mut entry = KdlEntry::new_prop(key, KdlValue::Null);
            spell(&mut entry, value, repr);
            node.push(entry);
        }
    }
    Ok(())
}

/// Give `entry` its new value, spelled `repr`: the reviewed spelling of the old value must not
/// be printed for the new one, and strings stay quoted as the reviewed policy writes them.
fn spell(entry: &mut KdlEntry, value: KdlValue, repr: String) {
    entry.set_value(value);
    match entry.format_mut() {
        Some(format) => format.value_repr = repr,
        None => entry.set_format(KdlEntryFormat {
            value_repr: repr,
            leading: " ".into(),
            ..KdlEntryFormat::default()
        }),
    }
}

/// `value` as a quoted KDL string; a control character is refused rather than escaped.
fn quoted(what: &str, value: &str) -> Result<String, RenderError> {
    if value.chars().any(char::is_control) {
        return Err(RenderError::Shape {
            what: what.to_owned(),
            expected: "text without control characters",
        });
    }
    Ok(format!(
        "\"{}\"",
        value.replace('\\', "\\\\").replace('"', "\\\"")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy file of the repository (`policy/…`); empty when unreadable, which then fails
    /// the test that reads it.
    fn policy_file(name: &str) -> String {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../policy")
                .join(name),
        )
        .unwrap_or_default()
    }

    fn evaluator() -> String {
        policy_file("evaluator.kdl")
    }

    fn runtime() -> RuntimeBinary {
        RuntimeBinary {
            path: "/nix/store/x-runc/bin/runc".into(),
            sha256: Digest::of_bytes(b"runc"),
        }
    }

    fn lines(r: &Rendered) -> Vec<String> {
        r.changes.iter().map(|c| c.line.clone()).collect()
    }

    #[test]
    fn every_fact_lands_on_its_node_and_the_diff_names_exactly_those() -> Result<(), RenderError> {
        let facts = HostFacts {
            store: Some("/srv/cordon/store".into()),
            run_dir: Some("/run/cordon-x".into()),
            runtime: Some(runtime()),
            images: vec![("runtime".into(), Digest::of_bytes(b"an image"))],
            worker: Some(Digest::of_bytes(b"a worker")),
            uid_range: Some((4_000_000, 4_000_099)),
            gid_range: Some((4_000_000, 4_000_099)),
            shell: Some("/nix/store/x-shadow/bin/nologin".into()),
            state_dir: None,
            egress_domains: None,
        };
        let r = render("evaluator.kdl", &evaluator(), &facts)?;
        let changed = lines(&r).join("\n");
        assert!(!changed.contains("image.prebuild"), "{changed}");
        for want in [
            "store: ",
            "run-dir: ",
            "runtime.path: \"/usr/sbin/runc\" → \"/nix/store/x-runc/bin/runc\"",
            "runtime.sha256: + ",
            &format!(
                "image.runtime: \"{}\"",
                cordon_policy_lang::parse("evaluator.kdl", &evaluator())
                    .unwrap()
                    .image_pin("runtime")
                    .unwrap()
            ),
            &format!("→ \"{}\"", Digest::of_bytes(b"an image")),
            &format!("→ \"{}\"", Digest::of_bytes(b"a worker")),
            "accounts.uid-range",
            "accounts.gid-range",
            "accounts.shell: ",
        ] {
            assert!(changed.contains(want), "{want} missing from:\n{changed}");
        }
        assert!(
            r.text.contains(&format!("sha256=\"{}\"", runtime().sha256)),
            "{}",
            r.text
        );
        // Comments survive: the reviewer's notes stay in the host's copy.
        assert!(
            r.text
                .contains("// A real OCI runtime, never a home-made one.")
        );
        Ok(())
    }

    #[test]
    fn a_comment_or_string_that_reads_like_a_node_is_never_touched() -> Result<(), RenderError> {
        let reviewed = evaluator().replacen(
            "store \"/var/lib/cordon/store\"",
            "/* store \"/decoy\" */ store \"/var/lib/cordon/store\"",
            1,
        );
        let facts = HostFacts {
            store: Some("/srv/s".into()),
            ..HostFacts::default()
        };
        let r = render("p.kdl", &reviewed, &facts)?;
        assert!(
            r.text.contains("/* store \"/decoy\" */ store \"/srv/s\""),
            "{}",
            r.text
        );
        assert_eq!(lines(&r).len(), 1, "{:?}", lines(&r));
        Ok(())
    }

    #[test]
    fn a_fact_without_its_node_is_refused_never_added() {
        let reviewed: String = evaluator()
            .lines()
            .filter(|l| !l.starts_with("run-dir"))
            .map(|l| format!("{l}\n"))
            .collect();
        let facts = HostFacts {
            run_dir: Some("/run/x".into()),
            ..HostFacts::default()
        };
        assert!(matches!(
            render("p.kdl", &reviewed, &facts),
            Err(RenderError::Node { count: 0, .. }) | Err(RenderError::Policy(_))
        ));
        let facts = HostFacts {
            state_dir: Some("/var/lib/agent".into()),
            ..HostFacts::default()
        };
        assert!(matches!(
            render("p.kdl", &evaluator(), &facts),
            Err(RenderError::Node { .. })
        ));
        // An image role the reviewed policy does not pin is not added.
        let facts = HostFacts {
            images: vec![("gpu".into(), Digest::of_bytes(b"x"))],
            ..HostFacts::default()
        };
        assert!(matches!(
            render("p.kdl", &evaluator(), &facts),
            Err(RenderError::Node { count: 0, .. })
        ));
    }

    #[test]
    fn an_image_pin_is_taken_only_from_a_layout_that_verifies() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["prebuild", "=x", "prebuild="] {
            assert!(
                matches!(layout_pin(bad), Err(RenderError::Image(_))),
                "{bad}"
            );
        }
        let missing = format!("prebuild={}", dir.path().display());
        assert!(matches!(
            layout_pin(&missing),
            Err(RenderError::Read { .. })
        ));
        let spec = cordon::image::ImageSpec {
            name: "t".into(),
            files: std::collections::BTreeMap::new(),
            dirs: [("/tmp".to_owned(), 0o755)].into(),
            env: Vec::new(),
            entrypoint: vec!["/x".into()],
            workdir: None,
        };
        let layout = dir.path().join("layout");
        let digest = cordon::image::build(&spec, &layout).unwrap();
        let arg = format!("prebuild={}", layout.display());
        assert_eq!(layout_pin(&arg).unwrap(), ("prebuild".into(), digest));
        // A blob changed after the build: the index still names the manifest, which no longer
        // verifies.
        let blobs = layout.join("blobs/sha256");
        let blob = std::fs::read_dir(&blobs)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&blob).unwrap();
        bytes.push(b' ');
        std::fs::write(&blob, bytes).unwrap();
        assert!(matches!(layout_pin(&arg), Err(RenderError::Image(_))));
        // An index naming two manifests is not one image.
        let index = layout.join("index.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        let first = v["manifests"][0].clone();
        v["manifests"].as_array_mut().unwrap().push(first);
        std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
        match layout_pin(&arg) {
            Err(RenderError::Image(why)) => assert!(why.contains("exactly one manifest"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_pinned_file_is_its_bytes_digest_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let worker = dir.path().join("cordon-worker");
        std::fs::write(&worker, b"a worker's bytes").unwrap();
        assert_eq!(
            file_digest("worker binary", &worker).unwrap(),
            Digest::of_bytes(b"a worker's bytes")
        );
        assert_eq!(
            RuntimeBinary::at(&worker).unwrap().sha256,
            Digest::of_bytes(b"a worker's bytes")
        );
        assert!(matches!(
            file_digest("worker binary", &dir.path().join("missing")),
            Err(RenderError::Read {
                what: "worker binary",
                ..
            })
        ));
    }

    #[test]
    fn only_the_paths_a_fact_set_may_change() {
        let change = |line: &str| diff::Change {
            section: String::new(),
            line: line.to_owned(),
            path: Vec::new(),
            effect: cordon_policy_lang::effect::Effect::Neutral,
            rule: "",
        };
        let changes = [
            change("image.prebuild: \"a\" → \"b\""),
            change("worker: \"a\" → \"b\""),
        ];
        // Each image role on its own: runtime's fact does not let prebuild's pin move.
        assert!(unexpected(&changes[..1], &["image.runtime"]).is_some());
        assert!(unexpected(&changes[..1], &["image.prebuild"]).is_none());
        assert!(unexpected(&changes[..1], &["image.pre"]).is_some());
        // No worker fact, no worker change.
        assert!(unexpected(&changes[1..], &["image.prebuild"]).is_some());
        assert!(unexpected(&changes, &["image.prebuild", "worker"]).is_none());
    }

    #[test]
    fn the_surface_state_dir_is_set_inside_the_surface_stage() -> Result<(), RenderError> {
        let reviewed = policy_file("examples/surface.kdl");
        let facts = HostFacts {
            state_dir: Some("/var/lib/cordon-agent/surface".into()),
            runtime: Some(runtime()),
            ..HostFacts::default()
        };
        let r = render("surface.kdl", &reviewed, &facts)?;
        assert!(
            r.text
                .contains("state-dir \"/var/lib/cordon-agent/surface\"")
        );
        assert_eq!(lines(&r).len(), 3, "{:?}", lines(&r));
        Ok(())
    }

    /// A deployment's egress domains replace the reviewed list only as a narrowing: each one
    /// the reviewed list names or below one of its `*.` suffixes; a wider one, or any for a
    /// policy without egress, is refused.
    #[test]
    fn egress_domains_render_only_as_a_narrowing_of_the_reviewed_list() -> Result<(), RenderError> {
        let reviewed = policy_file("examples/surface.kdl")
            .replace("network \"none\"", "network \"egress\"")
            .replace(
                "        state-dir",
                "        egress {\n            domain \"pypi.org\" \"*.pythonhosted.org\"\n            domain \"*.anthropic.com\"\n            port 443\n        }\n        state-dir",
            );
        let narrowed = |d: &[&str]| HostFacts {
            egress_domains: Some(d.iter().map(|s| (*s).to_owned()).collect()),
            ..HostFacts::default()
        };
        let r = render(
            "s.kdl",
            &reviewed,
            &narrowed(&["api.anthropic.com", "*.files.pythonhosted.org"]),
        )?;
        assert!(
            r.text
                .contains("domain \"api.anthropic.com\" \"*.files.pythonhosted.org\""),
            "{}",
            r.text
        );
        let nodes = r
            .text
            .lines()
            .filter(|l| l.trim_start().starts_with("domain "));
        assert_eq!(nodes.count(), 1, "{}", r.text);
        assert!(
            lines(&r)
                .iter()
                .all(|l| l.contains("stage.surface.surface.egress.domain")),
            "{:?}",
            lines(&r)
        );
        for wider in [
            "anthropic.com",
            "evil.example",
            "*.org",
            "pythonhosted.org",
            "xanthropic.com",
        ] {
            assert!(
                matches!(
                    render("s.kdl", &reviewed, &narrowed(&[wider])),
                    Err(RenderError::Widened(_))
                ),
                "{wider}"
            );
        }
        let none = policy_file("examples/surface.kdl");
        let e = render("s.kdl", &none, &narrowed(&["pypi.org"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is not within the reviewed policy's egress domains"),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn a_quote_in_a_value_stays_inside_its_string_and_a_control_character_is_refused()
    -> Result<(), RenderError> {
        let facts = HostFacts {
            store: Some("/srv/a\" sha256=\"x".into()),
            ..HostFacts::default()
        };
        let r = render("p.kdl", &evaluator(), &facts)?;
        assert_eq!(lines(&r).len(), 1, "{:?}", lines(&r));
        let facts = HostFacts {
            store: Some("/srv/a\nb".into()),
            ..HostFacts::default()
        };
        assert!(matches!(
            render("p.kdl", &evaluator(), &facts),
            Err(RenderError::Shape { .. })
        ));
        Ok(())
    }

    #[test]
    fn an_invalid_result_is_refused() {
        let facts = HostFacts {
            store: Some("relative/store".into()),
            ..HostFacts::default()
        };
        assert!(matches!(
            render("p.kdl", &evaluator(), &facts),
            Err(RenderError::Policy(_))
        ));
    }
}
