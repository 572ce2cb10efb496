//! The `intake` and `tree` sections: transport rules and the tree guard's bounds and tiers.

use super::*;

pub(super) fn intake(cx: &mut Cx, node: Option<&KdlNode>, whole: SourceSpan) -> Option<Intake> {
    let b = Block::section(
        cx,
        node,
        "intake",
        whole,
        &["transport", "archive", "parser"],
        &[],
    );
    let t = Block::section(
        cx,
        b.one("transport"),
        "transport",
        b.span(),
        &[
            "allow-host",
            "max-redirects",
            "deadline",
            "min-tls",
            "trust-anchor",
            "allow-loopback",
            "allow-plain-http-loopback",
        ],
        &["allow-host"],
    );
    let mut allow_host = BTreeMap::new();
    let mut host_spans = Seen::default();
    for n in t.all("allow-host") {
        shape(cx, n, 1, 1, &["reason"], false);
        let host = arg(n, 0).and_then(|e| host_name(cx, e));
        let why = reason(cx, n);
        if let (Some(host), Some(reason)) = (host, why) {
            if host_spans.first(cx, &host, name_span(n), || {
                format!("host {host:?} is allowed twice")
            }) {
                allow_host.insert(host, Reasoned { reason });
            }
        }
    }
    let max_redirects = value(cx, &t, "max-redirects", Some(3), |cx, e| {
        integer(cx, e, "max-redirects", 0, 10)
    });
    let deadline_ms = value(cx, &t, "deadline", Some(10 * 60 * SECOND), |cx, e| {
        duration(cx, e, "deadline", SECOND, 24 * HOUR)
    });
    let min_tls = value(cx, &t, "min-tls", Some("1.2".into()), |cx, e| {
        choice(cx, e, "TLS version", &["1.2", "1.3"])
    });
    let trust_anchor = match t.one("trust-anchor") {
        Some(n) => Some(single(cx, n, &[], |cx, e| path(cx, e, "trust-anchor"))?),
        None => None,
    };
    let allow_loopback = value(cx, &t, "allow-loopback", Some(false), boolean);
    let allow_plain = value(cx, &t, "allow-plain-http-loopback", Some(false), boolean);
    if allow_plain == Some(true)
        && allow_loopback == Some(false)
        && let Some(n) = t.one("allow-plain-http-loopback")
    {
        cx.report(
            "invalid-value",
            name_span(n),
            "needs allow-loopback #true",
            "plain http is only ever allowed to loopback, and loopback is not allowed",
            Some("set allow-loopback #true as well (tests only)".into()),
        );
    }
    let a = Block::section(
        cx,
        b.one("archive"),
        "archive",
        b.span(),
        &[
            "max-archive-bytes",
            "max-extracted-bytes",
            "max-members",
            "max-file-bytes",
            "max-path-length",
            "max-depth",
            "max-pax-bytes",
            "max-compression-ratio",
            "exclude",
        ],
        &["exclude"],
    );
    let p = Block::section(
        cx,
        b.one("parser"),
        "parser",
        b.span(),
        &["address-space", "cpu-time"],
        &[],
    );
    let address_space = value(cx, &p, "address-space", Some(GIB), |cx, e| {
        size(cx, e, "address-space", 256 * MIB, 64 * GIB)
    });
    let cpu_time_ms = value(cx, &p, "cpu-time", Some(60 * SECOND), |cx, e| {
        duration(cx, e, "cpu-time", SECOND, HOUR)
    });
    let parser = address_space
        .zip(cpu_time_ms)
        .map(|(address_space, cpu_time_ms)| ParserLimits {
            address_space,
            cpu_time_ms,
        });
    let archive = ArchiveLimits {
        max_archive_bytes: value(cx, &a, "max-archive-bytes", Some(GIB), |cx, e| {
            size(cx, e, "max-archive-bytes", KIB, 64 * GIB)
        })?,
        max_extracted_bytes: value(cx, &a, "max-extracted-bytes", Some(4 * GIB), |cx, e| {
            size(cx, e, "max-extracted-bytes", KIB, 256 * GIB)
        })?,
        max_members: value(cx, &a, "max-members", Some(100_000), |cx, e| {
            integer(cx, e, "max-members", 1, 10_000_000)
        })?,
        max_file_bytes: value(cx, &a, "max-file-bytes", Some(512 * MIB), |cx, e| {
            size(cx, e, "max-file-bytes", 1, 64 * GIB)
        })?,
        max_path_length: value(cx, &a, "max-path-length", Some(1024), |cx, e| {
            integer(cx, e, "max-path-length", 16, 4096)
        })?,
        max_depth: value(cx, &a, "max-depth", Some(32), |cx, e| {
            integer(cx, e, "max-depth", 1, 256)
        })?,
        max_pax_bytes: value(cx, &a, "max-pax-bytes", Some(64 * KIB), |cx, e| {
            size(cx, e, "max-pax-bytes", 0, MIB)
        })?,
        max_compression_ratio: value(cx, &a, "max-compression-ratio", Some(200), |cx, e| {
            integer(cx, e, "max-compression-ratio", 1, 100_000)
        })?,
        exclude: strings(cx, &a.all("exclude"), |cx, e| {
            let s = string(cx, e)?;
            if s.is_empty() || s.contains('/') || s.contains('\0') {
                cx.report(
                    "invalid-value",
                    e.span(),
                    "not a name pattern",
                    format!("{s:?} is not a member-name pattern"),
                    Some(
                        "a pattern matches one path component, for example \".git\" or \"*.pyc\""
                            .into(),
                    ),
                );
                return None;
            }
            Some(s)
        }),
    };
    Some(Intake {
        transport: Transport {
            allow_host,
            max_redirects: max_redirects?,
            deadline_ms: deadline_ms?,
            min_tls: min_tls?,
            trust_anchor,
            allow_loopback: allow_loopback?,
            allow_plain_http_loopback: allow_plain?,
        },
        archive,
        parser: parser?,
    })
}

/// Every argument of every node in `nodes`, read by `read`, as a set (duplicates reported).
pub(super) fn strings(
    cx: &mut Cx,
    nodes: &[&KdlNode],
    mut read: impl FnMut(&mut Cx, &KdlEntry) -> Option<String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut spans = Seen::default();
    for node in nodes {
        shape(cx, node, 1, usize::MAX, &[], false);
        for entry in positional(node) {
            let Some(s) = read(cx, entry) else { continue };
            if spans.first(cx, &s, entry.span(), || format!("{s:?} is listed twice")) {
                out.insert(s);
            }
        }
    }
    out
}

pub(super) fn dotted(cx: &mut Cx, entry: &KdlEntry, min_parts: usize) -> Option<String> {
    let s = string(cx, entry)?;
    let part_ok = |p: &str| {
        p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if s.split('.').count() >= min_parts && s.split('.').all(part_ok) {
        return Some(s);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a Python name",
        format!("{s:?} is not a dotted Python name of at least {min_parts} part(s)"),
        None,
    );
    None
}

pub(super) fn tree(cx: &mut Cx, node: Option<&KdlNode>, whole: SourceSpan) -> Option<Tree> {
    let b = Block::section(cx, node, "tree", whole, &["limits", "python", "tiers"], &[]);
    let l = Block::section(
        cx,
        b.one("limits"),
        "limits",
        b.span(),
        &[
            "max-files",
            "max-file-bytes",
            "max-total-bytes",
            "max-depth",
            "max-path-length",
        ],
        &[],
    );
    let limits = TreeLimits {
        max_files: value(cx, &l, "max-files", Some(200_000), |cx, e| {
            integer(cx, e, "max-files", 1, 10_000_000)
        })?,
        max_file_bytes: value(cx, &l, "max-file-bytes", Some(256 * MIB), |cx, e| {
            size(cx, e, "max-file-bytes", 1, 64 * GIB)
        })?,
        max_total_bytes: value(cx, &l, "max-total-bytes", Some(16 * GIB), |cx, e| {
            size(cx, e, "max-total-bytes", KIB, TIB)
        })?,
        max_depth: value(cx, &l, "max-depth", Some(32), |cx, e| {
            integer(cx, e, "max-depth", 1, 256)
        })?,
        max_path_length: value(cx, &l, "max-path-length", Some(1024), |cx, e| {
            integer(cx, e, "max-path-length", 16, 4096)
        })?,
    };
    let p = Block::section(
        cx,
        b.one("python"),
        "python",
        b.span(),
        &[
            "ban-call",
            "ban-import",
            "ban-attribute-call",
            "jit-entry-point",
        ],
        &[
            "ban-call",
            "ban-import",
            "ban-attribute-call",
            "jit-entry-point",
        ],
    );
    let mut bans = |name: &str, minimum: &[&str], parts: usize| {
        let nodes = p.all(name);
        if nodes.is_empty() {
            return minimum.iter().map(|s| (*s).to_owned()).collect();
        }
        let set = strings(cx, &nodes, |cx, e| dotted(cx, e, parts));
        let missing: Vec<&str> = minimum
            .iter()
            .copied()
            .filter(|m| !set.contains(*m))
            .collect();
        if !missing.is_empty() {
            cx.report(
                "weakened-control",
                name_span(nodes[0]),
                "drops a required ban",
                format!("`{name}` must include {}", missing.join(", ")),
                Some(
                    "these bans are the floor of the AST policy; add to them, never remove".into(),
                ),
            );
        }
        set
    };
    let ban_call = bans("ban-call", MIN_BAN_CALL, 1);
    let ban_import = bans("ban-import", MIN_BAN_IMPORT, 1);
    let ban_attribute_call = bans("ban-attribute-call", MIN_BAN_ATTRIBUTE_CALL, 1);
    let mut jit_entry_point = BTreeMap::new();
    let mut jit_spans = Seen::default();
    for n in p.all("jit-entry-point") {
        shape(cx, n, 1, 1, &["reason"], false);
        let name = arg(n, 0).and_then(|e| dotted(cx, e, 2));
        let why = reason(cx, n);
        let (Some(name), Some(reason)) = (name, why) else {
            continue;
        };
        if jit_spans.first(cx, &name, name_span(n), || {
            format!("jit-entry-point {name:?} is given twice")
        }) {
            jit_entry_point.insert(name, Reasoned { reason });
        }
    }
    let t = Block::section(
        cx,
        b.one("tiers"),
        "tiers",
        b.span(),
        &["executables", "native-sources", "dependency-patches"],
        &[],
    );
    let tiers = Tiers {
        executables: value(cx, &t, "executables", Some(false), boolean)?,
        native_sources: value(cx, &t, "native-sources", Some(false), boolean)?,
        dependency_patches: value(cx, &t, "dependency-patches", Some(false), boolean)?,
    };
    Some(Tree {
        limits,
        python: Python {
            ban_call,
            ban_import,
            ban_attribute_call,
            jit_entry_point,
        },
        tiers,
    })
}
