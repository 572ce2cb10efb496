//! Build steps and cross-references: steps against stages and images, and path resolution.

use super::*;

pub(super) fn step(cx: &mut Cx, node: &KdlNode) -> Option<Step> {
    shape(cx, node, 1, 1, &["stage", "tier"], true);
    let stage =
        required_prop(cx, node, "stage").and_then(|e| keyword::<StageKind>(cx, e, "stage kind"));
    // A prebuild step is one tier's registered patcher (seed 001 §3); no other step builds.
    let tier = match (prop(node, "tier"), stage) {
        (Some(e), Some(StageKind::Prebuild)) => keyword::<BuildTier>(cx, e, "build tier").map(Some),
        (Some(e), Some(_)) => {
            cx.report(
                "not-allowed-in-stage",
                e.span(),
                "not a build step",
                "`tier` belongs to a prebuild step".to_owned(),
                Some("drop it: only a prebuild step is a tier's patcher".into()),
            );
            None
        }
        (None, Some(StageKind::Prebuild)) => {
            cx.report(
                "missing-property",
                name_span(node),
                "needs `tier`",
                "a prebuild step needs tier=\"…\": the reviewed-build tier whose patcher it is"
                    .to_owned(),
                Some(format!(
                    "one of {}",
                    BuildTier::keywords()
                        .iter()
                        .map(|k| format!("{k:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            );
            None
        }
        (None, _) => Some(None),
        // The stage itself is wrong (reported): the tier cannot be judged.
        (Some(_), None) => None,
    };
    let b = Block::read(
        cx,
        node.children(),
        "step",
        name_span(node),
        &["argv", "secret", "ranks"],
        &[],
    );
    let argv = b.required(cx, "argv").and_then(|n| {
        shape(cx, n, 1, usize::MAX, &[], false);
        let args: Vec<Option<String>> = positional(n).into_iter().map(|e| string(cx, e)).collect();
        if let Some(first) = arg(n, 0) {
            path(cx, first, "argv[0]")?;
        }
        // An engine interpreter run without isolation reads its environment and the working
        // directory for code (PYTHONPATH, user site, the script's directory): `-I` is required.
        if let (Some(StageKind::Lane | StageKind::Reference), Some(first)) = (stage, arg(n, 0)) {
            let program = first.value().as_string().unwrap_or("");
            let name = program.rsplit('/').next().unwrap_or(program);
            let isolated = positional(n)
                .iter()
                .skip(1)
                .any(|e| e.value().as_string() == Some("-I"));
            if name.starts_with("python") && !isolated {
                cx.report(
                    "python-isolated",
                    first.span(),
                    "not isolated",
                    format!("the engine interpreter {program:?} runs without -I"),
                    Some("add \"-I\" right after the interpreter: isolated mode ignores PYTHON* variables, the user site and the script's directory".into()),
                );
            }
        }
        args.into_iter().collect::<Option<Vec<_>>>()
    });
    let secret = match b.one("secret") {
        // The sealed-direct-artifact patcher's standard input is the host's compile request.
        Some(n) if matches!(tier, Some(Some(BuildTier::SealedDirectArtifact))) => {
            cx.report(
                "not-allowed-in-stage",
                name_span(n),
                "not on this tier",
                "the sealed-direct-artifact patcher takes the compile request on its standard input, where a secret would go".to_owned(),
                Some("drop the secret: a factory compiles from the tree and the request only".into()),
            );
            None
        }
        Some(n) => Some(single(cx, n, &[], |cx, e| identifier(cx, e, "secret"))?),
        None => None,
    };
    // An engine's scheduler ranks: the member coverage its reads must show exactly. Only an
    // engine step has them, and it must say how many (no default count is assumed).
    let engine = matches!(stage, Some(StageKind::Lane | StageKind::Reference));
    let ranks = match (b.one("ranks"), engine) {
        (Some(n), true) => Some(
            single(cx, n, &[], |cx, e| integer(cx, e, "ranks", 1, 64))
                .and_then(|r| u32::try_from(r).ok())?,
        ),
        (Some(n), false) => {
            cx.report(
                "not-allowed-in-stage",
                name_span(n),
                "not an engine",
                "`ranks` belongs to a lane or reference engine step".to_owned(),
                Some("drop it: a build step has no scheduler ranks".into()),
            );
            None
        }
        (None, true) => {
            cx.report(
                "missing-node",
                name_span(node),
                "needs `ranks`",
                "an engine step needs `ranks N`: how many of its processes load candidate code"
                    .to_owned(),
                Some("add `ranks 1` for a single-process engine".into()),
            );
            None
        }
        (None, false) => None,
    };
    Some(Step {
        stage: stage?,
        tier: tier?,
        argv: argv?,
        secret,
        ranks,
    })
}

/// A registered step's program and every path it passes come from the pinned image (seed 001
/// §3): no argv element may name a path its stage's mounts, `/tmp` or the runtime's
/// filesystems provide, where the candidate's tree or its own writes would stand in for the
/// validator's code.
pub(super) fn steps_inside_image(
    cx: &mut Cx,
    step_nodes: &[&KdlNode],
    stages: &BTreeMap<StageKind, Stage>,
) {
    for node in step_nodes {
        let Some(stage) = prop(node, "stage")
            .and_then(|e| e.value().as_string())
            .and_then(StageKind::from_keyword)
            .and_then(|k| stages.get(&k))
        else {
            continue;
        };
        let provided: Vec<&str> = stage
            .mount
            .keys()
            .map(String::as_str)
            .chain(["/tmp", "/proc", "/dev", "/sys"])
            .collect();
        let Some(argv) = node
            .children()
            .and_then(|c| c.nodes().iter().find(|n| n.name().value() == "argv"))
        else {
            continue;
        };
        for entry in positional(argv) {
            let Some(text) = entry.value().as_string() else {
                continue;
            };
            // The working directory is `/`, so a relative path (one with a `/`) names what `/` +
            // it names; and a path inside a longer argument (`-c` scripts, `--opt=/path`) names
            // it too, where it starts and ends at a path boundary.
            let path_like = text.contains('/');
            let clean = lexical(&format!("/{}", text.trim_start_matches('/')));
            let part = |c: char| c.is_ascii_alphanumeric() || "_.-/".contains(c);
            let inside = |p: &str| {
                text.match_indices(p).any(|(i, _)| {
                    text[..i].chars().next_back().is_none_or(|c| !part(c))
                        && text[i + p.len()..]
                            .chars()
                            .next()
                            .is_none_or(|c| c == '/' || !part(c))
                })
            };
            if let Some(under) = provided.iter().find(|p| {
                (path_like && (clean == **p || clean.starts_with(&format!("{p}/")))) || inside(p)
            }) {
                cx.report(
                    "outside-image",
                    entry.span(),
                    "not in the image",
                    format!("{text:?} names {under}, which the image does not provide"),
                    Some(
                        "run a patcher the prebuild image ships (for example /cordon/patchers/native-rebuild); it finds the tree and staging itself"
                            .into(),
                    ),
                );
            }
        }
    }
}

/// An absolute path with `.`, `..` and repeated slashes resolved lexically (what it names
/// before any link is followed).
pub(super) fn lexical(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Resolve every cross-reference, and flag declarations nothing uses.
pub(super) fn resolve(
    cx: &mut Cx,
    top: &Block<'_>,
    stage_nodes: &[&KdlNode],
    steps: &BTreeMap<String, Step>,
    secrets: &BTreeMap<String, Secret>,
) {
    let child_arg = |node: &KdlNode, name: &str| -> Option<SourceSpan> {
        node.children()?
            .nodes()
            .iter()
            .find(|n| n.name().value() == name)
            .and_then(|n| arg(n, 0))
            .map(KdlEntry::span)
    };
    let unresolved = |cx: &mut Cx, span: SourceSpan, what: &str, name: &str, known: Vec<&str>| {
        let help = suggest(name, known.iter().copied()).or_else(|| {
            Some(if known.is_empty() {
                format!("no {what} is declared")
            } else {
                format!("declared: {}", known.join(", "))
            })
        });
        cx.report(
            "unresolved-reference",
            span,
            format!("no such {what}"),
            format!("{what} {name:?} is not declared"),
            help,
        );
    };
    let names = |kind: &str| -> Vec<&str> {
        top.all(kind)
            .into_iter()
            .filter_map(|n| arg(n, 0)?.value().as_string())
            .collect()
    };
    let (image_names, profile_names) = (names("image"), names("seccomp"));
    let raw_child = |node: &KdlNode, name: &str| -> Option<String> {
        let child = node
            .children()?
            .nodes()
            .iter()
            .find(|n| n.name().value() == name)?;
        Some(arg(child, 0)?.value().as_string()?.to_owned())
    };
    // References are read from the raw nodes too, so a stage with other problems still has
    // its references checked.
    for node in stage_nodes {
        for (child, what, known) in [
            ("image", "image", &image_names),
            ("seccomp", "seccomp profile", &profile_names),
        ] {
            if let Some(name) = raw_child(node, child)
                && !known.contains(&name.as_str())
                && let Some(span) = child_arg(node, child)
            {
                unresolved(cx, span, what, &name, known.clone());
            }
        }
    }
    // Usage is read from the raw nodes, so a stage or step that failed to decode does not
    // make what it names look unused or undeclared.
    let declared: BTreeSet<&str> = stage_nodes
        .iter()
        .filter_map(|n| arg(n, 0)?.value().as_string())
        .collect();
    let step_nodes = top.all("step");
    for node in &step_nodes {
        let Some(name) = arg(node, 0).and_then(|e| e.value().as_string()) else {
            continue;
        };
        let Some(step) = steps.get(name) else {
            continue;
        };
        let stage_span = prop(node, "stage").map_or(name_span(node), KdlEntry::span);
        // Registered steps are the build steps of prebuild and the engine commands of the lane
        // and the reference session; the surface runs the operator's own argv.
        if step.stage == StageKind::Surface {
            cx.report(
                "not-allowed-in-stage",
                stage_span,
                "no registered steps in the surface",
                format!(
                    "step {name:?} names stage {:?}; registered steps run in prebuild, lane or reference",
                    step.stage.as_str()
                ),
                None,
            );
        } else if !declared.contains(step.stage.as_str()) {
            unresolved(
                cx,
                stage_span,
                "stage",
                step.stage.as_str(),
                declared.iter().copied().collect(),
            );
        }
        if let Some(secret) = &step.secret
            && !secrets.contains_key(secret)
            && let Some(span) = child_arg(node, "secret")
        {
            unresolved(
                cx,
                span,
                "secret",
                secret,
                secrets.keys().map(String::as_str).collect(),
            );
        }
    }
    let used_profiles: BTreeSet<String> = stage_nodes
        .iter()
        .filter_map(|n| raw_child(n, "seccomp"))
        .collect();
    let used_secrets: BTreeSet<String> = step_nodes
        .iter()
        .filter_map(|n| raw_child(n, "secret"))
        .collect();
    for (kind, used, what, help) in [
        (
            "seccomp",
            &used_profiles,
            "used by no stage",
            "remove it, or name it in a stage",
        ),
        (
            "secret",
            &used_secrets,
            "delivered to no step",
            "remove it, or name it in a step",
        ),
    ] {
        for node in top.all(kind) {
            if let Some(e) = arg(node, 0)
                && let Some(name) = e.value().as_string()
                && !used.contains(name)
            {
                cx.report(
                    "redundant-entry",
                    e.span(),
                    what,
                    format!("{kind} {name:?} is {what}"),
                    Some(help.into()),
                );
            }
        }
    }
}
