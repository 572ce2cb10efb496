//! One `stage` block: limits, environment, mounts, devices and everything a stage may name.

use super::*;

pub(super) fn not_in_stage(cx: &mut Cx, node: &KdlNode, kind: StageKind, what: &str) {
    cx.report(
        "not-allowed-in-stage",
        name_span(node),
        format!("not allowed in {kind}"),
        format!("{what} is not allowed in stage \"{kind}\""),
        None,
    );
}

pub(super) fn cpuset(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let s = string(cx, entry)?;
    let item_ok = |item: &str| match item.split_once('-') {
        Some((a, b)) => matches!((a.parse::<u32>(), b.parse::<u32>()), (Ok(a), Ok(b)) if a <= b),
        None => item.parse::<u32>().is_ok(),
    };
    if !s.is_empty() && s.split(',').all(item_ok) {
        return Some(s);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a cpu list",
        format!("{s:?} is not a cpu list"),
        Some("for example \"0-3\" or \"0,2,4-7\"".into()),
    );
    None
}

pub(super) fn cpus(cx: &mut Cx, entry: &KdlEntry) -> Option<u64> {
    let millis = match entry.value() {
        KdlValue::Integer(_) => integer(cx, entry, "cpus", 1, 1024)? * 1000,
        KdlValue::String(s) => match units::parse_millis(s) {
            Ok(m) => m,
            Err(message) => {
                cx.report(
                    "invalid-value",
                    entry.span(),
                    "not a CPU count",
                    message,
                    None,
                );
                return None;
            }
        },
        _ => {
            string(cx, entry);
            return None;
        }
    };
    if !(10..=1_024_000).contains(&millis) {
        cx.out_of_range(
            entry.span(),
            "cpus",
            &units::format_millis(millis),
            "0.01..=1024",
        );
        return None;
    }
    Some(millis)
}

pub(super) fn env_name_ok(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) fn env(cx: &mut Cx, node: Option<&KdlNode>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(node) = node else { return out };
    shape(cx, node, 0, 0, &[], true);
    let mut spans = Seen::default();
    for var in node.children().map(KdlDocument::nodes).unwrap_or_default() {
        let name = var.name().value().to_owned();
        if !env_name_ok(&name) {
            cx.report(
                "invalid-value",
                name_span(var),
                "not a variable name",
                format!("{name:?} is not an environment variable name"),
                None,
            );
            continue;
        }
        let Some(value) = single(cx, var, &[], string) else {
            continue;
        };
        if !spans.first(cx, &name, name_span(var), || {
            format!("variable {name} is set twice")
        }) {
            continue;
        }
        out.insert(name, value);
    }
    out
}

/// Which mount source roles a stage kind may have.
pub(super) fn mount_roles(kind: StageKind) -> &'static [MountSource] {
    match kind {
        StageKind::Prebuild => &[MountSource::Tree, MountSource::Staging],
        StageKind::Surface => &[MountSource::Workspace],
        StageKind::Lane | StageKind::Reference => &[
            MountSource::Tree,
            MountSource::Publication,
            MountSource::Model,
            MountSource::Cache,
        ],
    }
}

pub(super) fn mounts(cx: &mut Cx, nodes: &[&KdlNode], kind: StageKind) -> BTreeMap<String, Mount> {
    let mut out = BTreeMap::new();
    let mut dests: Vec<(String, SourceSpan)> = Vec::new();
    let mut roles = Seen::default();
    for n in nodes {
        shape(cx, n, 2, 2, &["mode"], false);
        let allowed = mount_roles(kind);
        let role = arg(n, 0).and_then(|e| {
            let r = keyword::<MountSource>(cx, e, "mount source")?;
            if !allowed.contains(&r) {
                let names: Vec<&str> = allowed.iter().map(|a| a.as_str()).collect();
                cx.report(
                    "not-allowed-in-stage",
                    e.span(),
                    format!("{kind} mounts: {}", names.join(", ")),
                    format!(
                        "a {:?} mount is not allowed in stage {:?}",
                        r.as_str(),
                        kind.as_str()
                    ),
                    None,
                );
                return None;
            }
            Some((r, e.span()))
        });
        let dest = arg(n, 1).and_then(|e| Some((path(cx, e, "mount destination")?, e.span())));
        let writable_role = matches!(
            role.as_ref().map(|(r, _)| r),
            Some(MountSource::Staging | MountSource::Cache | MountSource::Workspace)
        );
        let mode = match prop(n, "mode") {
            None => Some(if writable_role {
                MountMode::Rw
            } else {
                MountMode::Ro
            }),
            Some(e) => keyword::<MountMode>(cx, e, "mount mode").and_then(|m| {
                if (m == MountMode::Rw) == writable_role {
                    return Some(m);
                }
                let help = if writable_role {
                    "this mount is the stage's one writable place"
                } else {
                    "validator inputs are always read-only binds"
                };
                cx.report(
                    "invalid-value",
                    e.span(),
                    "wrong mode for this source",
                    format!("mode {:?} is not allowed for this source", m.as_str()),
                    Some(help.into()),
                );
                None
            }),
        };
        let (Some((role, role_span)), Some((dest, dest_span)), Some(mode)) = (role, dest, mode)
        else {
            continue;
        };
        if !roles.first(cx, role.as_str(), role_span, || {
            format!("source {:?} is mounted twice", role.as_str())
        }) {
            continue;
        }
        let reserved = dest == "/"
            || dest == "/tmp"
            || ["/proc", "/sys", "/dev"].iter().any(|r| nested(&dest, r));
        if reserved {
            cx.report(
                "overlap",
                dest_span,
                "reserved",
                format!("mount destination {dest} is reserved for the runtime's own mounts"),
                Some("mount validator inputs under a path of their own, such as /engine".into()),
            );
            continue;
        }
        if let Some((other, other_span)) = dests.iter().find(|(d, _)| nested(d, &dest)) {
            cx.report_at(
                "overlap",
                vec![(*other_span, other.clone()), (dest_span, dest.clone())],
                format!("mount destinations {other} and {dest} are not disjoint"),
                Some("mount roots must be pairwise disjoint".into()),
            );
            continue;
        }
        dests.push((dest.clone(), dest_span));
        out.insert(dest, Mount { source: role, mode });
    }
    out
}

pub(super) fn props_block<'a>(
    cx: &mut Cx,
    node: &'a KdlNode,
    names: &[&str],
) -> Vec<Option<&'a KdlEntry>> {
    shape(cx, node, 0, 0, names, false);
    names.iter().map(|n| required_prop(cx, node, n)).collect()
}

#[allow(clippy::too_many_lines)]
pub(super) fn stage(cx: &mut Cx, node: &KdlNode, kind: StageKind) -> Option<Stage> {
    let b = Block::read(
        cx,
        node.children(),
        &format!("stage \"{kind}\""),
        name_span(node),
        &[
            "image",
            "network",
            "root",
            "ipc",
            "capability",
            "no-new-privileges",
            "seccomp",
            "user",
            "cpus",
            "cpuset",
            "memory",
            "pids",
            "nofile",
            "core",
            "shm",
            "tmp",
            "staging",
            "child",
            "cache",
            "overlay",
            "deadline",
            "phase-deadline",
            "gpu",
            "env",
            "mount",
            "output",
            "publication",
            "frame",
            "surface",
            "sys",
        ],
        &["capability", "phase-deadline", "mount"],
    );
    // The surface runs no image: its root is empty, and only its read set and workspace exist.
    let image = match (b.one("image"), kind) {
        (Some(n), StageKind::Surface) => {
            not_in_stage(cx, n, kind, "an image (its root is empty)");
            None
        }
        (None, StageKind::Surface) => Some(None),
        _ => value(cx, &b, "image", None, |cx, e| {
            identifier(cx, e, "image role")
        })
        .map(Some),
    };
    let network = value(cx, &b, "network", None, |cx, e| {
        keyword::<Network>(cx, e, "network")
    });
    if network == Some(Network::Egress)
        && kind != StageKind::Surface
        && let Some(n) = b.one("network")
    {
        cx.report(
            "not-allowed-in-stage",
            name_span(n),
            "candidate stages have no network",
            format!("network \"egress\" is not allowed in stage \"{kind}\""),
            Some("only the surface stage may be given egress".into()),
        );
    }
    let root = value(cx, &b, "root", None, |cx, e| {
        keyword::<RootMode>(cx, e, "root")
    });
    // The surface's root is empty, and only the surface's is: every other stage runs its image.
    if let (Some(r), Some(n)) = (root, b.one("root"))
        && (r == RootMode::Empty) != (kind == StageKind::Surface)
    {
        let (label, message) = if kind == StageKind::Surface {
            (
                "the surface's root is empty",
                format!("root \"{r}\" is not allowed in stage \"surface\""),
            )
        } else {
            (
                "only the surface's root is empty",
                format!("root \"empty\" is not allowed in stage \"{kind}\""),
            )
        };
        cx.report("not-allowed-in-stage", name_span(n), label, message, None);
    }
    let ipc = value(cx, &b, "ipc", None, |cx, e| keyword::<Ipc>(cx, e, "ipc"));
    let mut capability = BTreeMap::new();
    let mut cap_spans = Seen::default();
    let known_caps: Vec<String> = caps::all().iter().map(ToString::to_string).collect();
    for n in b.all("capability") {
        shape(cx, n, 1, 1, &["reason"], false);
        let why = reason(cx, n);
        let Some(e) = arg(n, 0) else { continue };
        let Some(name) = string(cx, e) else { continue };
        if caps::Capability::from_str(&name).is_err() || !name.starts_with("CAP_") {
            let upper = format!(
                "CAP_{}",
                name.trim_start_matches("cap_").to_ascii_uppercase()
            );
            let help = suggest(&name, known_caps.iter().map(String::as_str)).or_else(|| {
                known_caps
                    .contains(&upper)
                    .then(|| format!("did you mean `{upper}`?"))
            });
            cx.report(
                "unknown-capability",
                e.span(),
                "not a capability",
                format!("{name:?} is not a Linux capability"),
                help,
            );
            continue;
        }
        let Some(reason) = why else { continue };
        if !cap_spans.first(cx, &name, e.span(), || format!("{name} is granted twice")) {
            continue;
        }
        capability.insert(name, Reasoned { reason });
    }
    let no_new_privileges = value(cx, &b, "no-new-privileges", Some(true), boolean).and_then(|v| {
        if !v && let Some(n) = b.one("no-new-privileges") {
            cx.report(
                "weakened-control",
                name_span(n),
                "cannot be turned off",
                "no-new-privileges cannot be turned off",
                Some("without it a setuid binary in the image regains privileges".into()),
            );
            return None;
        }
        Some(v)
    });
    let seccomp = value(cx, &b, "seccomp", None, |cx, e| {
        identifier(cx, e, "seccomp profile")
    });
    let user = value(cx, &b, "user", None, |cx, e| {
        let u = string(cx, e)?;
        if let Some(user) = User::from_keyword(&u) {
            return Some(user);
        }
        cx.report("weakened-control", e.span(), "only per-run", format!("user {u:?} is not allowed"), Some("candidate work runs only as a fresh per-run account (REQ-117): write user \"per-run\"".into()));
        None
    });
    if user == Some(User::Service)
        && kind != StageKind::Surface
        && let Some(n) = b.one("user")
    {
        cx.report(
            "weakened-control",
            name_span(n),
            "only the surface runs as the service user",
            format!("user \"service\" is not allowed in stage \"{kind}\""),
            Some("candidate work runs only as a fresh per-run account (REQ-117): write user \"per-run\"".into()),
        );
    }
    let cpus_milli = b.one("cpus").and_then(|n| single(cx, n, &[], cpus));
    let cpuset_v = b.one("cpuset").and_then(|n| single(cx, n, &[], cpuset));
    // Every candidate stage is capped; the surface may run where cgroups cannot be delegated
    // to its service user, and then it must not ask for what cannot be enforced (the surface
    // refuses such a policy at run time rather than applying a limit as a no-op).
    let capped = kind != StageKind::Surface;
    if capped && b.one("cpus").is_none() && b.one("cpuset").is_none() {
        cx.report(
            "missing-node",
            name_span(node),
            "needs `cpus` or `cpuset`",
            format!("stage \"{kind}\" needs a CPU cap: `cpus` or `cpuset`"),
            None,
        );
    }
    let optional =
        |cx: &mut Cx, name: &str, read: &dyn Fn(&mut Cx, &KdlEntry) -> Option<u64>| match b
            .one(name)
        {
            Some(n) => single(cx, n, &[], read).map(Some),
            None if capped => {
                b.required(cx, name);
                None
            }
            None => Some(None),
        };
    let memory = optional(cx, "memory", &|cx, e| {
        size(cx, e, "memory", 256 * MIB, 4 * TIB)
    });
    let pids = optional(cx, "pids", &|cx, e| integer(cx, e, "pids", 32, 1_048_576));
    let nofile = value(cx, &b, "nofile", Some(1024), |cx, e| {
        integer(cx, e, "nofile", 16, 1_048_576)
    });
    let core = value(cx, &b, "core", Some(0), |cx, e| size(cx, e, "core", 0, GIB));
    // /dev/shm exists only in a private IPC namespace; with ipc "none" there is none to size.
    let shm = match (ipc, b.one("shm")) {
        (Some(Ipc::None), Some(n)) => {
            cx.report(
                "redundant-entry",
                name_span(n),
                "no /dev/shm with ipc \"none\"",
                "shm changes nothing: ipc \"none\" mounts no /dev/shm",
                Some("drop shm, or write ipc \"private\"".into()),
            );
            None
        }
        (Some(Ipc::None), None) => Some(None),
        _ => value(cx, &b, "shm", Some(64 * MIB), |cx, e| {
            size(cx, e, "shm", MIB, 64 * GIB)
        })
        .map(Some),
    };
    let tmp = b.required(cx, "tmp").and_then(|n| {
        let p = props_block(cx, n, &["size", "exec"]);
        let size_v = p[0].and_then(|e| size(cx, e, "tmp size", MIB, 64 * GIB));
        let exec = p[1].and_then(|e| boolean(cx, e));
        Some(Tmp {
            size_bytes: size_v?,
            exec: exec?,
        })
    });
    let staging = match (b.one("staging"), kind) {
        (Some(n), StageKind::Prebuild) => {
            let p = props_block(cx, n, &["size", "inodes"]);
            let size_v = p[0].and_then(|e| size(cx, e, "staging size", MIB, TIB));
            let inodes = p[1].and_then(|e| integer(cx, e, "staging inodes", 16, 100_000_000));
            Some(Staging {
                size_bytes: size_v?,
                inodes: inodes?,
            })
        }
        (None, StageKind::Prebuild) => {
            b.required(cx, "staging");
            None
        }
        (Some(n), _) => {
            not_in_stage(cx, n, kind, "a staging mount");
            None
        }
        (None, _) => None,
    };
    let child = match (b.one("child"), kind) {
        (Some(n), StageKind::Prebuild) => {
            let p = props_block(cx, n, &["cpus", "memory", "pids", "deadline"]);
            let cpus_v = p[0].and_then(|e| cpus(cx, e));
            let memory_v = p[1].and_then(|e| size(cx, e, "child memory", 64 * MIB, 4 * TIB));
            let pids_v = p[2].and_then(|e| integer(cx, e, "child pids", 8, 1_048_576));
            let deadline_v =
                p[3].and_then(|e| duration(cx, e, "child deadline", SECOND, 24 * HOUR));
            Some((n, cpus_v, memory_v, pids_v, deadline_v))
        }
        (None, StageKind::Prebuild) => {
            b.required(cx, "child");
            None
        }
        (Some(n), _) => {
            not_in_stage(cx, n, kind, "a patcher's bounded child");
            None
        }
        (None, _) => None,
    };
    let cache = match (b.one("cache"), kind) {
        (Some(n), StageKind::Lane | StageKind::Reference) => {
            let p = props_block(cx, n, &["size", "inodes"]);
            let size_v = p[0].and_then(|e| size(cx, e, "cache size", MIB, TIB));
            let inodes = p[1].and_then(|e| integer(cx, e, "cache inodes", 16, 100_000_000));
            Some(Staging {
                size_bytes: size_v?,
                inodes: inodes?,
            })
        }
        (Some(n), _) => {
            not_in_stage(cx, n, kind, "a runtime cache");
            None
        }
        (None, _) => None,
    };
    // The overlay root's writable layer: the lease's own tmpfs, bounded like the cache, so a
    // write to `/` fills neither the host's disk nor the host's `/run`. Required with an
    // overlay root (its bound is reviewed, never assumed), refused with any other.
    let overlay = match (b.one("overlay"), root) {
        (Some(n), Some(RootMode::Overlay)) => {
            let p = props_block(cx, n, &["size", "inodes"]);
            let size_v = p[0].and_then(|e| size(cx, e, "overlay size", MIB, TIB));
            let inodes = p[1].and_then(|e| integer(cx, e, "overlay inodes", 16, 100_000_000));
            Some(Staging {
                size_bytes: size_v?,
                inodes: inodes?,
            })
        }
        (None, Some(RootMode::Overlay)) => {
            b.required(cx, "overlay");
            None
        }
        (Some(n), Some(_)) => {
            cx.report(
                "not-allowed-in-stage",
                name_span(n),
                "an overlay bound without an overlay root",
                format!("`overlay` is allowed only with root \"overlay\" (stage \"{kind}\")"),
                Some("drop it, or give the stage root \"overlay\"".into()),
            );
            None
        }
        (None, Some(RootMode::ReadOnly | RootMode::Empty)) | (_, None) => None,
    };
    let deadline = value(cx, &b, "deadline", None, |cx, e| {
        duration(cx, e, "deadline", SECOND, 24 * HOUR)
    });
    let mut phase_deadline_ms = BTreeMap::new();
    let mut phase_spans = Seen::default();
    for n in b.all("phase-deadline") {
        shape(cx, n, 2, 2, &[], false);
        let name = arg(n, 0).and_then(|e| identifier(cx, e, "phase"));
        let ms = arg(n, 1).and_then(|e| {
            let ms = duration(cx, e, "phase deadline", SECOND, 24 * HOUR)?;
            if let Some(total) = deadline
                && ms > total
            {
                cx.out_of_range(
                    e.span(),
                    "phase deadline",
                    &units::format_duration(ms),
                    &format!(
                        "at most the stage deadline ({})",
                        units::format_duration(total)
                    ),
                );
                return None;
            }
            Some(ms)
        });
        let (Some(name), Some(ms)) = (name, ms) else {
            continue;
        };
        if !phase_spans.first(cx, &name, name_span(n), || {
            format!("phase {name:?} has two deadlines")
        }) {
            continue;
        }
        phase_deadline_ms.insert(name, ms);
    }
    let gpu_device = gpu(cx, b.one("gpu"), kind);
    let env = env(cx, b.one("env"));
    let mount = mounts(cx, &b.all("mount"), kind);
    // The runtime cache is a bounded tmpfs of the lease's: its mount and its bounds go together
    // (a mount without bounds would be an unbounded directory, bounds without a mount a tmpfs
    // for nothing).
    let cache_mounted = mount.values().any(|m| m.source == MountSource::Cache);
    match (b.one("cache"), cache_mounted) {
        (Some(n), false) if cache.is_some() => cx.report(
            "redundant-entry",
            name_span(n),
            "no cache mount",
            format!(
                "stage {:?} bounds a runtime cache it does not mount",
                kind.as_str()
            ),
            Some("mount it (`mount \"cache\" \"/cache\" mode=\"rw\"`) or drop the bounds".into()),
        ),
        (None, true) => b.required(cx, "cache").map_or((), |_| ()),
        _ => {}
    }
    let output = match b.one("output") {
        None => Some(Output {
            stdout_bytes: MIB,
            stderr_bytes: MIB,
        }),
        Some(n) => {
            let p = props_block(cx, n, &["stdout", "stderr"]);
            let o = p[0].and_then(|e| size(cx, e, "stdout cap", KIB, GIB));
            let e2 = p[1].and_then(|e| size(cx, e, "stderr cap", KIB, GIB));
            Some(Output {
                stdout_bytes: o?,
                stderr_bytes: e2?,
            })
        }
    };
    let publication = match (b.one("publication"), kind) {
        (Some(n), StageKind::Prebuild) => {
            let p = props_block(
                cx,
                n,
                &[
                    "max-files",
                    "max-bytes",
                    "max-file-bytes",
                    "max-depth",
                    "max-path-length",
                ],
            );
            let v = (
                p[0].and_then(|e| integer(cx, e, "max-files", 1, 10_000_000)),
                p[1].and_then(|e| size(cx, e, "max-bytes", KIB, TIB)),
                p[2].and_then(|e| size(cx, e, "max-file-bytes", 1, 64 * GIB)),
                p[3].and_then(|e| integer(cx, e, "max-depth", 1, 256)),
                p[4].and_then(|e| integer(cx, e, "max-path-length", 16, 4096)),
            );
            Some(PublicationLimits {
                max_files: v.0?,
                max_bytes: v.1?,
                max_file_bytes: v.2?,
                max_depth: v.3?,
                max_path_length: v.4?,
            })
        }
        (None, StageKind::Prebuild) => {
            b.required(cx, "publication");
            None
        }
        (Some(n), _) => {
            not_in_stage(cx, n, kind, "publication limits");
            None
        }
        (None, _) => None,
    };
    let frame = match (b.one("frame"), kind) {
        (Some(n), StageKind::Lane | StageKind::Reference) => {
            let p = props_block(cx, n, &["max-bytes", "max-frames"]);
            let m = p[0].and_then(|e| size(cx, e, "frame max-bytes", KIB, GIB));
            let f = p[1].and_then(|e| integer(cx, e, "max-frames", 1, 100_000_000));
            Some(Frame {
                max_bytes: m?,
                max_frames: f?,
            })
        }
        (None, StageKind::Lane | StageKind::Reference) => Some(Frame {
            max_bytes: MIB,
            max_frames: 100_000,
        }),
        (Some(n), _) => {
            not_in_stage(cx, n, kind, "protocol framing");
            None
        }
        (None, _) => None,
    };
    let surface = match (b.one("surface"), kind) {
        (Some(n), StageKind::Surface) => surface(cx, n, &mount, &env, network),
        (None, StageKind::Surface) => {
            b.required(cx, "surface");
            None
        }
        (Some(n), _) => {
            not_in_stage(cx, n, kind, "a surface block");
            None
        }
        (None, _) => None,
    };
    let sys = value(cx, &b, "sys", Some(Sys::None), |cx, e| {
        keyword::<Sys>(cx, e, "sys")
    });
    // The child's share lies strictly inside the stage's: the patcher keeps room to end it,
    // and the host's deadline for the child comes before the stage's own.
    let child = child.and_then(|(n, cpus_v, memory_v, pids_v, deadline_v)| {
        let child = Child {
            cpus_milli: cpus_v?,
            memory_bytes: memory_v?,
            pids: pids_v?,
            deadline_ms: deadline_v?,
        };
        let outside = [
            ("cpus", cpus_milli.is_some_and(|c| child.cpus_milli > c)),
            ("memory", memory.flatten().is_some_and(|m| child.memory_bytes >= m)),
            ("pids", pids.flatten().is_some_and(|p| child.pids >= p)),
            ("deadline", deadline.is_some_and(|d| child.deadline_ms >= d)),
        ];
        for (what, over) in outside {
            if over {
                cx.report(
                    "invalid-value",
                    name_span(n),
                    "not inside the stage's",
                    format!("the child's {what} is not within the stage's own {what}"),
                    Some("a child's share is strictly smaller than its stage's (its CPUs at most equal)".into()),
                );
            }
        }
        Some(child)
    });
    Some(Stage {
        image: image?,
        network: network?,
        root: root?,
        ipc: ipc?,
        capability,
        no_new_privileges: no_new_privileges?,
        seccomp: seccomp?,
        user: user?,
        cpus_milli,
        cpuset: cpuset_v,
        memory_bytes: memory?,
        pids: pids?,
        nofile: nofile?,
        core_bytes: core?,
        shm_bytes: shm?,
        tmp: tmp?,
        staging,
        child,
        cache,
        overlay,
        deadline_ms: deadline?,
        phase_deadline_ms,
        gpu_device,
        env,
        mount,
        output: output?,
        publication,
        frame,
        surface,
        sys: sys?,
    })
}

pub(super) fn gpu(
    cx: &mut Cx,
    node: Option<&KdlNode>,
    kind: StageKind,
) -> BTreeMap<String, Reasoned> {
    let mut out = BTreeMap::new();
    let Some(node) = node else { return out };
    shape(cx, node, 0, 1, &[], true);
    if let Some(e) = arg(node, 0) {
        if node.children().is_some() {
            cx.report(
                "unexpected-children",
                name_span(node),
                "either \"none\" or a device block",
                "gpu takes either \"none\" or a block of devices, not both",
                None,
            );
        }
        choice(cx, e, "gpu", &["none"]);
        return out;
    }
    if matches!(kind, StageKind::Prebuild | StageKind::Surface) {
        not_in_stage(cx, node, kind, "GPU visibility");
        return out;
    }
    let b = Block::read(
        cx,
        node.children(),
        "gpu",
        name_span(node),
        &["device"],
        &["device"],
    );
    let mut spans = Seen::default();
    for n in b.all("device") {
        shape(cx, n, 1, 1, &["reason"], false);
        let why = reason(cx, n);
        let dev = arg(n, 0).and_then(|e| {
            let p = path(cx, e, "device")?;
            if p.starts_with("/dev/") {
                return Some((p, e.span()));
            }
            cx.report(
                "invalid-path",
                e.span(),
                "not under /dev",
                format!("device {p} is not under /dev"),
                None,
            );
            None
        });
        let (Some((dev, span)), Some(reason)) = (dev, why) else {
            continue;
        };
        if !spans.first(cx, &dev, span, || format!("device {dev} is listed twice")) {
            continue;
        }
        out.insert(dev, Reasoned { reason });
    }
    if out.is_empty() && b.all("device").is_empty() {
        cx.report(
            "missing-node",
            name_span(node),
            "no devices",
            "a gpu block lists at least one device",
            Some("write gpu \"none\" for no GPU".into()),
        );
    }
    out
}
