//! The `surface` block of the agent surface stage: workspace, read set, environments, state.

use super::*;

/// The variables the surface sets itself, from `home` and `temp`: a policy may not also name
/// them in `env`, `pass-env`, `agent-env` or `temp-env`.
pub const SURFACE_SET_ENV: [&str; 8] = [
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "TMPDIR",
    "TMP",
    "TEMP",
];

/// A path relative to the workspace: non-empty, normal components only, no NUL.
pub(super) fn relative(cx: &mut Cx, entry: &KdlEntry, what: &str) -> Option<String> {
    let text = string(cx, entry)?;
    let ok = !text.is_empty()
        && text.len() <= 64
        && !text.contains('\0')
        && text
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        return Some(text);
    }
    cx.report(
        "invalid-path",
        entry.span(),
        "not a normal relative path",
        format!("{what} {text:?} is not a normal path relative to the workspace"),
        Some("write it without a leading `/`, `.`, `..` or `//`, at most 64 bytes".into()),
    );
    None
}

#[allow(clippy::too_many_lines)]
pub(super) fn surface(
    cx: &mut Cx,
    node: &KdlNode,
    mounts: &BTreeMap<String, Mount>,
    stage_env: &BTreeMap<String, String>,
    network: Option<Network>,
) -> Option<Surface> {
    shape(cx, node, 0, 0, &[], true);
    let b = Block::read(
        cx,
        node.children(),
        "surface",
        name_span(node),
        &[
            "read",
            "write",
            "deny-env",
            "deny-file",
            "tmpdir-prefix-max",
            "pass-env",
            "agent-env",
            "home",
            "temp",
            "temp-env",
            "state-dir",
            "skills",
            "egress",
        ],
        &[
            "read",
            "deny-env",
            "deny-file",
            "pass-env",
            "agent-env",
            "temp-env",
        ],
    );
    let mut read = BTreeMap::new();
    let mut spans = Seen::default();
    for n in b.all("read") {
        shape(cx, n, 1, 1, &["reason"], false);
        let why = reason(cx, n);
        let p = arg(n, 0).and_then(|e| Some((path(cx, e, "read path")?, e.span())));
        let (Some((p, span)), Some(reason)) = (p, why) else {
            continue;
        };
        if !spans.first(cx, &p, span, || format!("read path {p} is listed twice")) {
            continue;
        }
        // The runtime's own mounts and the workspace are not the host's to show: a read path
        // on or around them would cover them with host content.
        if let Some(taken) = ["/proc", "/sys", "/dev", "/tmp"]
            .into_iter()
            .chain(mounts.keys().map(String::as_str))
            .find(|r| nested(&p, r))
        {
            cx.report(
                "overlap",
                span,
                "not disjoint from the container's own mounts",
                format!("read path {p} and {taken} are not disjoint"),
                Some("name read paths beside /proc, /sys, /dev, /tmp and the workspace".into()),
            );
            continue;
        }
        read.insert(p, Reasoned { reason });
    }
    let write = value(cx, &b, "write", None, |cx, e| {
        keyword::<WriteScope>(cx, e, "write scope")
    });
    if write.is_some() && !mounts.values().any(|m| m.source == MountSource::Workspace) {
        cx.report(
            "missing-node",
            name_span(node),
            "no workspace mount",
            "write \"workspace\" needs a `mount \"workspace\" …` in this stage",
            None,
        );
    }
    let name = |cx: &mut Cx, e: &KdlEntry| {
        let s = string(cx, e)?;
        if env_name_ok(&s) {
            return Some(s);
        }
        cx.report(
            "invalid-value",
            e.span(),
            "not a variable name",
            format!("{s:?} is not an environment variable name"),
            None,
        );
        None
    };
    let deny_env = strings(cx, &b.all("deny-env"), name);
    let pass_env = strings(cx, &b.all("pass-env"), name);
    let agent_env = strings(cx, &b.all("agent-env"), name);
    let temp_env = strings(cx, &b.all("temp-env"), name);
    // Each variable has one source: the stage's fixed `env`, the invoker (`pass-env` to every
    // run, `agent-env` to the agent's only), the surface itself (home and temp), or nowhere
    // (`deny-env`). A name in two places would make one of them silently lose.
    let mut sources: BTreeMap<&str, &str> = BTreeMap::new();
    let lists: [(&str, Vec<&str>); 6] = [
        ("env", stage_env.keys().map(String::as_str).collect()),
        ("the surface itself", SURFACE_SET_ENV.to_vec()),
        ("pass-env", pass_env.iter().map(String::as_str).collect()),
        ("agent-env", agent_env.iter().map(String::as_str).collect()),
        ("temp-env", temp_env.iter().map(String::as_str).collect()),
        ("deny-env", deny_env.iter().map(String::as_str).collect()),
    ];
    for (list, names) in &lists {
        for n in names {
            if let Some(first) = sources.insert(n, list) {
                cx.report(
                    "duplicate",
                    name_span(node),
                    "a variable with two sources",
                    format!("variable {n} is named by {first} and by {list}"),
                    Some("give each variable one source: env, pass-env, agent-env, temp-env or deny-env".into()),
                );
            }
        }
    }
    let home = value(cx, &b, "home", None, |cx, e| relative(cx, e, "home"));
    let temp = value(cx, &b, "temp", None, |cx, e| relative(cx, e, "temp"));
    if let (Some(h), Some(t)) = (&home, &temp)
        && nested(&format!("/{h}"), &format!("/{t}"))
    {
        cx.report(
            "overlap",
            name_span(node),
            "home and temp overlap",
            format!("home {h:?} and temp {t:?} are not disjoint"),
            None,
        );
    }
    let state_dir = value(cx, &b, "state-dir", None, |cx, e| path(cx, e, "state-dir"));
    let deny_file = strings(cx, &b.all("deny-file"), |cx, e| path(cx, e, "deny-file"));
    let tmpdir_prefix_max = value(cx, &b, "tmpdir-prefix-max", Some(56), |cx, e| {
        integer(cx, e, "tmpdir-prefix-max", 8, 80)
    });
    let skills = match b.one("skills") {
        Some(n) => {
            let dest = single(cx, n, &[], |cx, e| path(cx, e, "skills"));
            // Its own place: never over the runtime's mounts, the workspace or the read set.
            if let Some(d) = &dest
                && let Some(taken) = ["/proc", "/sys", "/dev", "/tmp"]
                    .into_iter()
                    .chain(mounts.keys().map(String::as_str))
                    .chain(read.keys().map(String::as_str))
                    .find(|r| nested(d, r))
            {
                cx.report(
                    "overlap",
                    name_span(n),
                    "not disjoint from the container's other mounts",
                    format!("skills {d} and {taken} are not disjoint"),
                    None,
                );
            }
            Some(dest)
        }
        None => Some(None),
    };
    let egress = match (b.one("egress"), network) {
        (Some(n), Some(Network::Egress)) => egress(cx, n).map(Some),
        (None, Some(Network::Egress)) => {
            cx.report(
                "missing-node",
                name_span(node),
                "egress without its allow-list",
                "network \"egress\" needs an `egress { domain …; port … }` block in the surface",
                None,
            );
            None
        }
        (Some(n), _) => {
            cx.report(
                "not-allowed-in-stage",
                name_span(n),
                "an allow-list for a network the stage does not have",
                "an egress block needs network \"egress\"",
                None,
            );
            None
        }
        (None, _) => Some(None),
    };
    Some(Surface {
        read,
        write: write?,
        deny_env,
        deny_file,
        tmpdir_prefix_max: tmpdir_prefix_max?,
        pass_env,
        agent_env,
        home: home?,
        temp: temp?,
        temp_env,
        state_dir: state_dir?,
        skills: skills?,
        egress: egress?,
    })
}

/// `egress { domain "a.example" "*.b.example"; port 443; allow-address "10.0.0.0/8" reason=… }`.
fn egress(cx: &mut Cx, node: &KdlNode) -> Option<Egress> {
    shape(cx, node, 0, 0, &[], true);
    let b = Block::read(
        cx,
        node.children(),
        "egress",
        name_span(node),
        &["domain", "port", "allow-address"],
        &["domain", "port", "allow-address"],
    );
    let domain = strings(cx, &b.all("domain"), |cx, e| {
        let s = string(cx, e)?;
        if domain_ok(&s) {
            return Some(s.to_ascii_lowercase());
        }
        cx.report(
            "invalid-value",
            e.span(),
            "not a domain name",
            format!("{s:?} is not a domain name or `*.` and one"),
            Some(
                "write a name (`pypi.org`) or a suffix (`*.pythonhosted.org`); never an address"
                    .into(),
            ),
        );
        None
    });
    let mut port = BTreeSet::new();
    for n in b.all("port") {
        shape(cx, n, 1, usize::MAX, &[], false);
        for e in positional(n) {
            if let Some(p) = integer(cx, e, "port", 1, 65535) {
                port.insert(u16::try_from(p).unwrap_or(0));
            }
        }
    }
    let mut allow_address = BTreeMap::new();
    for n in b.all("allow-address") {
        shape(cx, n, 1, 1, &["reason"], false);
        let why = reason(cx, n);
        let net = arg(n, 0).and_then(|e| {
            let s = string(cx, e)?;
            match s.parse::<ipnet::IpNet>() {
                Ok(net) if net.trunc() == net => Some(net.to_string()),
                _ => {
                    cx.report(
                        "invalid-value",
                        e.span(),
                        "not an address range",
                        format!("{s:?} is not a CIDR range with its host bits zero"),
                        Some("write `127.0.0.0/8` or `fd00::/8`".into()),
                    );
                    None
                }
            }
        });
        if let (Some(net), Some(reason)) = (net, why) {
            allow_address.insert(net, Reasoned { reason });
        }
    }
    if domain.is_empty() || port.is_empty() {
        cx.report(
            "missing-node",
            name_span(node),
            "an empty allow-list",
            "egress names at least one domain and one port",
            Some("a surface with nowhere to go is network \"none\"".into()),
        );
        return None;
    }
    Some(Egress {
        domain,
        port,
        allow_address,
    })
}

/// A DNS name of letters, digits and hyphens in dot-separated labels (at most 253 bytes, each
/// label 1–63, at least two labels or `localhost`), optionally behind one leading `*.`. Never
/// an IP literal: a literal is an address, and addresses are `allow-address`.
pub fn domain_ok(s: &str) -> bool {
    let name = s.strip_prefix("*.").unwrap_or(s);
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
    };
    !name.is_empty()
        && name.len() <= 253
        && labels.iter().all(label_ok)
        && name.parse::<std::net::IpAddr>().is_err()
        && labels
            .last()
            .is_some_and(|l| !l.bytes().all(|c| c.is_ascii_digit()))
        && (labels.len() >= 2 || name == "localhost")
}
