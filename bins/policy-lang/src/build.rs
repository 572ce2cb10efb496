//! The section decoders: KDL document → validated [`Policy`].
//!
//! Each decoder reads one section, reports every problem it finds through [`Cx`], and goes on;
//! cross-references (stage → image, stage → seccomp profile, step → stage, step → secret) are
//! resolved once every section has been read. A [`Policy`] is returned only when nothing at
//! all was reported. The language itself is documented in `policy/README.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use cordon_canon::Digest;
use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};
use miette::SourceSpan;

use crate::kit::{
    Block, Cx, Seen, arg, boolean, choice, duration, integer, name_span, path, positional, prop,
    reason, required_prop, shape, single, size, string, suggest,
};
use crate::model::*;
use crate::syscalls::{self, BaselineEntry};
use crate::units;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const SECOND: u64 = 1000;
const HOUR: u64 = 3_600_000;

/// A keyword of type `T`, reported like any other choice when it is not one.
fn keyword<T: Keyword>(cx: &mut Cx, entry: &KdlEntry, what: &str) -> Option<T> {
    choice(cx, entry, what, &T::keywords()).and_then(|s| T::from_keyword(&s))
}

/// The Python AST bans no policy may drop (seed 001, "Static scanning").
const MIN_BAN_CALL: &[&str] = &["__import__", "compile", "eval", "exec"];
const MIN_BAN_IMPORT: &[&str] = &["builtins", "importlib"];
const MIN_BAN_ATTRIBUTE_CALL: &[&str] = &["exec_module", "load_module", "spec_from_file_location"];

/// Read a whole policy document.
pub(crate) fn policy(cx: &mut Cx, doc: &KdlDocument, whole: SourceSpan) -> Option<Policy> {
    let top = Block::read(
        cx,
        Some(doc),
        "the policy file",
        whole,
        &[
            "policy",
            "store",
            "run-dir",
            "runtime",
            "accounts",
            "secret",
            "intake",
            "tree",
            "image",
            "worker",
            "seccomp",
            "physical-lane",
            "speed",
            "stage",
            "step",
        ],
        &[
            "secret",
            "image",
            "seccomp",
            "physical-lane",
            "stage",
            "step",
        ],
    );
    let header = top.required(cx, "policy").and_then(|n| header(cx, n));
    let store = value(cx, &top, "store", None, |cx, e| path(cx, e, "store"));
    let run_dir = value(
        cx,
        &top,
        "run-dir",
        Some("/run/cordon".to_owned()),
        |cx, e| path(cx, e, "run-dir"),
    );
    if let (Some(s), Some(r)) = (&store, &run_dir) {
        let span = |name: &str| top.one(name).map_or(whole, name_span);
        if nested(s, r) {
            cx.report_at(
                "overlap",
                vec![
                    (span("store"), "store".into()),
                    (span("run-dir"), "run-dir".into()),
                ],
                format!("store {s} and run-dir {r} overlap"),
                Some("the private store and the run directories must be disjoint trees".into()),
            );
        }
    }
    let runtime = top.required(cx, "runtime").and_then(|n| runtime(cx, n));
    let accounts = top.required(cx, "accounts").and_then(|n| accounts(cx, n));
    let secret = named(cx, &top.all("secret"), "secret")
        .into_iter()
        .filter_map(|(name, node)| {
            shape(cx, node, 1, 1, &["path"], false);
            let p = required_prop(cx, node, "path").and_then(|e| path(cx, e, "secret path"));
            Some((name, Secret { path: p? }))
        })
        .collect::<BTreeMap<_, _>>();
    let intake = intake(cx, top.one("intake"), whole);
    let tree = tree(cx, top.one("tree"), whole);
    let image = named(cx, &top.all("image"), "image role")
        .into_iter()
        .filter_map(|(name, node)| {
            shape(cx, node, 1, 1, &["digest"], false);
            let digest = required_prop(cx, node, "digest").and_then(|e| digest(cx, e));
            Some((name, digest?))
        })
        .collect::<BTreeMap<_, _>>();
    // cordon's own worker inside the runtime image: its digest is pinned on its own, so the
    // host seals the reviewed bytes, never what it finds in an image cache.
    let worker = match top.one("worker") {
        Some(node) => {
            shape(cx, node, 0, 0, &["digest"], false);
            required_prop(cx, node, "digest").and_then(|e| digest(cx, e))
        }
        None => None,
    };
    let physical_lane = physical_lanes(cx, &top.all("physical-lane"));
    let speed = match top.one("speed") {
        Some(node) => speed(cx, node).map(Some),
        None => Some(None),
    };
    let seccomp = named(cx, &top.all("seccomp"), "seccomp profile")
        .into_iter()
        .filter_map(|(name, node)| Some((name, seccomp(cx, node)?)))
        .collect::<BTreeMap<_, _>>();
    let stage_nodes = top.all("stage");
    let mut stages = BTreeMap::new();
    let mut seen_kind = Seen::default();
    for node in &stage_nodes {
        shape(cx, node, 1, 1, &[], true);
        let Some(kind) = arg(node, 0).and_then(|e| keyword::<StageKind>(cx, e, "stage kind"))
        else {
            continue;
        };
        if !seen_kind.first(cx, kind.as_str(), name_span(node), || {
            format!("stage {:?} is declared twice", kind.as_str())
        }) {
            continue;
        }
        if let Some(stage) = stage(cx, node, kind) {
            stages.insert(kind, stage);
        }
    }
    let steps = named(cx, &top.all("step"), "step")
        .into_iter()
        .filter_map(|(name, node)| Some((name, step(cx, node)?)))
        .collect::<BTreeMap<_, _>>();

    // A read's CPUs are its physical lane's: a lane stage with a cpuset of its own would
    // contradict one of them.
    if let (Some(lanes), Some(lane)) = (&physical_lane, stages.get(&StageKind::Lane))
        && !lanes.is_empty()
        && lane.cpuset.is_some()
        && let Some(first) = top.all("physical-lane").first()
    {
        cx.report(
            "invalid-value",
            name_span(first),
            "the lane stage sets a cpuset",
            "stage \"lane\" sets `cpuset` and the policy declares physical lanes".to_owned(),
            Some("each read runs on its physical lane's CPUs: drop the stage's cpuset".into()),
        );
    }
    resolve(cx, &top, &stage_nodes, &steps, &secret);
    steps_inside_image(cx, &top.all("step"), &stages);

    let policy = Policy {
        policy: header?,
        store: store?,
        run_dir: run_dir?,
        runtime: runtime?,
        accounts: accounts?,
        secret,
        intake: intake?,
        tree: tree?,
        image,
        worker,
        seccomp,
        physical_lane: physical_lane?,
        speed: speed?,
        stage: stages,
        step: steps,
    };
    cx.problems.is_empty().then_some(policy)
}

/// A node's single value, or `default` when the node is absent (`None`: the node is required).
fn value<T>(
    cx: &mut Cx,
    block: &Block<'_>,
    name: &str,
    default: Option<T>,
    read: impl FnOnce(&mut Cx, &KdlEntry) -> Option<T>,
) -> Option<T> {
    match block.one(name) {
        Some(node) => single(cx, node, &[], read),
        None if default.is_some() => default,
        None => {
            block.required(cx, name);
            None
        }
    }
}

/// Whether `a` and `b` are the same path or one lies under the other.
fn nested(a: &str, b: &str) -> bool {
    let under = |inner: &str, outer: &str| {
        inner == outer
            || outer == "/"
            || inner
                .strip_prefix(outer)
                .is_some_and(|r| r.starts_with('/'))
    };
    under(a, b) || under(b, a)
}

fn identifier(cx: &mut Cx, entry: &KdlEntry, what: &str) -> Option<String> {
    let text = string(cx, entry)?;
    let ok = text.len() <= 64
        && text.starts_with(|c: char| c.is_ascii_lowercase())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        return Some(text);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a name",
        format!("{what} {text:?} is not a valid name"),
        Some("names are 1 to 64 of a-z, 0-9 and -, starting with a letter".into()),
    );
    None
}

/// Nodes named by their first argument, each name once (duplicates labelled at both places).
fn named<'a>(cx: &mut Cx, nodes: &[&'a KdlNode], what: &str) -> Vec<(String, &'a KdlNode)> {
    let mut seen = Seen::default();
    let mut out = Vec::new();
    for node in nodes {
        let Some(entry) = arg(node, 0) else {
            shape(cx, node, 1, 1, &[], true);
            continue;
        };
        let Some(name) = identifier(cx, entry, what) else {
            continue;
        };
        if !seen.first(cx, &name, entry.span(), || {
            format!("{what} {name:?} is declared twice")
        }) {
            continue;
        }
        out.push((name, *node));
    }
    out
}

fn digest(cx: &mut Cx, entry: &KdlEntry) -> Option<Digest> {
    let text = string(cx, entry)?;
    match Digest::from_str(&text) {
        Ok(d) => Some(d),
        Err(_) => {
            cx.report(
                "invalid-value",
                entry.span(),
                "not a digest",
                format!("{text:?} is not a digest"),
                Some("write sha256: followed by 64 lowercase hex digits".into()),
            );
            None
        }
    }
}

fn header(cx: &mut Cx, node: &KdlNode) -> Option<Header> {
    shape(cx, node, 1, 1, &["version"], false);
    let name = arg(node, 0).and_then(|e| identifier(cx, e, "policy name"));
    let version = required_prop(cx, node, "version").and_then(|e| {
        let v = integer(cx, e, "version", 0, u64::MAX)?;
        if v != 1 {
            cx.report(
                "unsupported-version",
                e.span(),
                "unsupported",
                format!("policy language version {v} is not supported"),
                Some("this build reads version=1".into()),
            );
            return None;
        }
        Some(v)
    });
    Some(Header {
        name: name?,
        version: version?,
    })
}

fn runtime(cx: &mut Cx, node: &KdlNode) -> Option<Runtime> {
    shape(cx, node, 1, 1, &["path", "sha256", "min-version"], false);
    let kind = arg(node, 0).and_then(|e| keyword::<RuntimeKind>(cx, e, "runtime"));
    let p = required_prop(cx, node, "path").and_then(|e| path(cx, e, "runtime path"));
    let sha256 = match prop(node, "sha256") {
        Some(e) => Some(digest(cx, e)?),
        None => None,
    };
    let min_version = match prop(node, "min-version") {
        Some(e) => Some(release(cx, e)?),
        None => None,
    };
    Some(Runtime {
        kind: kind?,
        path: p?,
        sha256,
        min_version,
    })
}

/// A release number `MAJOR.MINOR.PATCH`.
fn release(cx: &mut Cx, entry: &KdlEntry) -> Option<(u32, u32, u32)> {
    let text = string(cx, entry)?;
    let parts: Vec<Option<u32>> = text.split('.').map(|p| p.parse().ok()).collect();
    if let [Some(a), Some(b), Some(c)] = parts[..] {
        return Some((a, b, c));
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a release number",
        format!("{text:?} is not a release number"),
        Some("write MAJOR.MINOR.PATCH, for example \"1.1.12\"".into()),
    );
    None
}

/// The physical lanes: none, or two disjoint CPU sets of identical shape (a qualification's
/// baseline and candidate lanes, exchanged by its reproduction).
fn physical_lanes(cx: &mut Cx, nodes: &[&KdlNode]) -> Option<BTreeMap<String, PhysicalLane>> {
    let lanes: Vec<(String, &KdlNode, PhysicalLane)> = named(cx, nodes, "physical lane")
        .into_iter()
        .filter_map(|(name, node)| {
            shape(cx, node, 1, 1, &["cpuset"], false);
            let set = required_prop(cx, node, "cpuset").and_then(|e| cpuset(cx, e))?;
            Some((name, node, PhysicalLane { cpuset: set }))
        })
        .collect();
    if lanes.len() != nodes.len() {
        return None;
    }
    let span = |n: &KdlNode| name_span(n);
    match lanes.as_slice() {
        [] => Some(BTreeMap::new()),
        [(_, a, la), (_, b, lb)] => {
            let (sa, sb) = (cpu_list(&la.cpuset)?, cpu_list(&lb.cpuset)?);
            if !sa.is_disjoint(&sb) {
                cx.report_at(
                    "overlap",
                    vec![(span(a), la.cpuset.clone()), (span(b), lb.cpuset.clone())],
                    "the two physical lanes share CPUs",
                    Some("each lane is a device set of its own".into()),
                );
                return None;
            }
            if sa.len() != sb.len() {
                cx.report_at(
                    "invalid-value",
                    vec![(span(a), la.cpuset.clone()), (span(b), lb.cpuset.clone())],
                    format!(
                        "the physical lanes differ in shape ({} and {} CPUs)",
                        sa.len(),
                        sb.len()
                    ),
                    Some("a qualification compares reads on lanes of identical shape".into()),
                );
                return None;
            }
            Some(lanes.into_iter().map(|(n, _, l)| (n, l)).collect())
        }
        [(_, first, _), ..] => {
            cx.report(
                "invalid-value",
                span(first),
                "not two lanes",
                format!("{} physical lanes are declared, not two", lanes.len()),
                Some("declare a baseline lane and a candidate lane, or none".into()),
            );
            None
        }
    }
}

/// The largest ratio a speed value may name, in basis points (100×).
const MAX_BP: u64 = 1_000_000;

fn speed(cx: &mut Cx, node: &KdlNode) -> Option<Speed> {
    shape(cx, node, 0, 0, &[], true);
    let names = [
        "min-margin-bp",
        "noise-multiplier-bp",
        "max-noise-bp",
        "min-timed-windows",
        "max-window-scatter-bp",
        "max-conditioning-slowdown-bp",
    ];
    let b = Block::read(cx, node.children(), "speed", name_span(node), &names, &[]);
    // Every value is required: a verdict threshold is reviewed, never defaulted.
    let mut get = |name: &str, min: u64, max: u64| {
        b.required(cx, name)
            .and_then(|n| single(cx, n, &[], |cx, e| integer(cx, e, name, min, max)))
    };
    let min_margin_bp = get("min-margin-bp", 1, MAX_BP);
    let noise_multiplier_bp = get("noise-multiplier-bp", 0, MAX_BP);
    let max_noise_bp = get("max-noise-bp", 0, MAX_BP);
    // Two halves of one read stand in for a dropped bracket (the drift rule): each needs one.
    let min_timed_windows = get("min-timed-windows", 2, 1_000_000);
    let max_window_scatter_bp = get("max-window-scatter-bp", 0, MAX_BP);
    // Below 1× would fail a candidate for conditioning as fast as the incumbent.
    let max_conditioning_slowdown_bp = get("max-conditioning-slowdown-bp", 10_000, MAX_BP);
    Some(Speed {
        min_margin_bp: min_margin_bp?,
        noise_multiplier_bp: noise_multiplier_bp?,
        max_noise_bp: max_noise_bp?,
        min_timed_windows: min_timed_windows?,
        max_window_scatter_bp: max_window_scatter_bp?,
        max_conditioning_slowdown_bp: max_conditioning_slowdown_bp?,
    })
}

fn id_range(cx: &mut Cx, node: &KdlNode) -> Option<IdRange> {
    shape(cx, node, 2, 2, &[], false);
    let what = node.name().value();
    let first = arg(node, 0).and_then(|e| integer(cx, e, what, 0, u64::from(u32::MAX - 1)));
    let last = arg(node, 1).and_then(|e| integer(cx, e, what, 0, u64::from(u32::MAX - 1)));
    let (first, last) = (first?, last?);
    if first == 0 || last == 0 || first > last {
        cx.report(
            "invalid-range",
            name_span(node),
            "invalid range",
            format!("{what} {first}..={last} is not a range of nonzero ids"),
            Some("both ends are nonzero (id 0 is root) and the first is not above the last".into()),
        );
        return None;
    }
    // Both ends are at most u32::MAX - 1 (checked above), so the conversions hold.
    Some(IdRange {
        first: u32::try_from(first).ok()?,
        last: u32::try_from(last).ok()?,
    })
}

fn accounts(cx: &mut Cx, node: &KdlNode) -> Option<Accounts> {
    shape(cx, node, 0, 0, &[], true);
    let b = Block::read(
        cx,
        node.children(),
        "accounts",
        name_span(node),
        &["uid-range", "gid-range", "shell", "cron-deny", "at-deny"],
        &[],
    );
    let uid_range = b.required(cx, "uid-range").and_then(|n| id_range(cx, n));
    let gid_range = b.required(cx, "gid-range").and_then(|n| id_range(cx, n));
    let shell = value(
        cx,
        &b,
        "shell",
        Some("/usr/sbin/nologin".into()),
        |cx, e| path(cx, e, "shell"),
    );
    let cron_deny = value(
        cx,
        &b,
        "cron-deny",
        Some("/etc/cron.deny".into()),
        |cx, e| path(cx, e, "cron-deny"),
    );
    let at_deny = value(cx, &b, "at-deny", Some("/etc/at.deny".into()), |cx, e| {
        path(cx, e, "at-deny")
    });
    Some(Accounts {
        uid_range: uid_range?,
        gid_range: gid_range?,
        shell: shell?,
        cron_deny: cron_deny?,
        at_deny: at_deny?,
    })
}

fn host_name(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let text = string(cx, entry)?;
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if text.len() <= 253 && text.split('.').all(label_ok) {
        return Some(text);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a host name",
        format!("{text:?} is not a lowercase DNS host name"),
        Some("write the exact host, without scheme, port, path or wildcard".into()),
    );
    None
}

fn intake(cx: &mut Cx, node: Option<&KdlNode>, whole: SourceSpan) -> Option<Intake> {
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
fn strings(
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

fn dotted(cx: &mut Cx, entry: &KdlEntry, min_parts: usize) -> Option<String> {
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

fn tree(cx: &mut Cx, node: Option<&KdlNode>, whole: SourceSpan) -> Option<Tree> {
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
        &["executables", "cuda-sources", "dependency-patches"],
        &[],
    );
    let tiers = Tiers {
        executables: value(cx, &t, "executables", Some(false), boolean)?,
        cuda_sources: value(cx, &t, "cuda-sources", Some(false), boolean)?,
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

const ACTIONS: &[&str] = &[
    "allow",
    "errno",
    "kill-process",
    "kill-thread",
    "trap",
    "log",
];

/// An action and its `errno=` property.
fn action(cx: &mut Cx, node: &KdlNode, entry: &KdlEntry) -> Option<SeccompAction> {
    let kind = choice(cx, entry, "seccomp action", ACTIONS)?;
    let errno = prop(node, "errno");
    match (kind.as_str(), errno) {
        ("errno", Some(e)) => {
            let n = integer(cx, e, "errno", 1, 4095)?;
            Some(SeccompAction::Errno(u32::try_from(n).ok()?))
        }
        ("errno", None) => {
            required_prop(cx, node, "errno");
            None
        }
        (_, Some(e)) => {
            cx.report(
                "unknown-property",
                e.span(),
                "only with errno",
                format!("errno= is only meaningful with action \"errno\", not {kind:?}"),
                None,
            );
            None
        }
        (_, None) => match kind.as_str() {
            "allow" => Some(SeccompAction::Allow),
            "kill-process" => Some(SeccompAction::KillProcess),
            "kill-thread" => Some(SeccompAction::KillThread),
            "trap" => Some(SeccompAction::Trap),
            "log" => Some(SeccompAction::Log),
            // `choice` admitted only ACTIONS, and errno is handled above.
            _ => None,
        },
    }
}

fn syscall_name(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let name = string(cx, entry)?;
    if syscalls::is_syscall(&name) {
        return Some(name);
    }
    cx.report(
        "unknown-syscall",
        entry.span(),
        "not an x86_64 syscall",
        format!("{name:?} is not an x86_64 system call"),
        suggest(&name, syscalls::X86_64.iter().copied()),
    );
    None
}

/// The most filter entries one rule's `one-of` conditions may expand to.
const MAX_ALTERNATIVES: usize = 64;

/// One `arg` condition of a rule on `syscall`, whose arguments have `widths`.
fn arg_condition(
    cx: &mut Cx,
    node: &KdlNode,
    syscall: &str,
    widths: &[u32],
) -> Option<ArgCondition> {
    let op = required_prop(cx, node, "op").and_then(|e| keyword::<ArgOp>(cx, e, "comparison"));
    let one_of = op == Some(ArgOp::OneOf);
    let (min, max) = if one_of {
        (2, MAX_ALTERNATIVES)
    } else {
        (0, 0)
    };
    let props: &[&str] = if one_of {
        &["index", "op"]
    } else {
        &["index", "op", "value", "mask"]
    };
    shape(cx, node, min, max, props, false);
    let arity = u64::try_from(widths.len()).unwrap_or(6);
    let index = required_prop(cx, node, "index")
        .and_then(|e| integer(cx, e, &format!("argument index of {syscall}"), 0, arity - 1))?;
    let bits = widths[usize::try_from(index).ok()?];
    let limit = if bits == 32 {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    };
    let what = format!("{bits}-bit argument {index} of {syscall}");
    let values = if one_of {
        let mut seen = BTreeSet::new();
        for e in positional(node) {
            let Some(v) = integer(cx, e, &what, 0, limit) else {
                continue;
            };
            if !seen.insert(v) {
                cx.report(
                    "redundant-entry",
                    e.span(),
                    "listed twice",
                    format!("{v} appears twice in this one-of"),
                    None,
                );
            }
        }
        seen.into_iter().collect()
    } else {
        vec![required_prop(cx, node, "value").and_then(|e| integer(cx, e, &what, 0, limit))?]
    };
    let op = op?;
    let mask = match (op, prop(node, "mask")) {
        (ArgOp::MaskedEq, Some(e)) => Some(integer(cx, e, &format!("mask of {what}"), 0, limit)?),
        (ArgOp::MaskedEq, None) => {
            required_prop(cx, node, "mask");
            return None;
        }
        (_, Some(e)) => {
            cx.report(
                "unknown-property",
                e.span(),
                "only with masked-eq",
                "mask= is only meaningful with op \"masked-eq\"",
                None,
            );
            return None;
        }
        (_, None) => None,
    };
    // Seccomp compares the whole 64-bit register; the kernel reads a 32-bit argument from its
    // low half. eq, one-of and masked-eq are compiled masked to the low half and mean what they
    // say; an ordering or ne test would admit every value whose high bits are set.
    let sound = bits == 64 || matches!(op, ArgOp::Eq | ArgOp::OneOf | ArgOp::MaskedEq);
    if !sound {
        let span = prop(node, "op").map_or(name_span(node), KdlEntry::span);
        cx.report(
            "unsound-condition",
            span,
            "compares bits the kernel ignores",
            format!(
                "the kernel reads argument {index} of {syscall} as 32 bits but seccomp compares \
                 all 64: op {:?} admits any value with high bits set",
                op.as_str()
            ),
            Some("list what is admitted with op=\"one-of\" (or eq, masked-eq)".into()),
        );
        return None;
    }
    Some(ArgCondition {
        index,
        bits,
        op,
        values,
        mask,
    })
}

fn seccomp(cx: &mut Cx, node: &KdlNode) -> Option<SeccompProfile> {
    shape(cx, node, 1, 1, &[], true);
    let b = Block::read(
        cx,
        node.children(),
        "seccomp",
        name_span(node),
        &[
            "baseline",
            "default-action",
            "architectures",
            "allow",
            "remove",
            "rule",
        ],
        &["allow", "remove", "rule"],
    );
    let baseline_name = match b.one("baseline") {
        Some(n) => Some(single(cx, n, &[], |cx, e| {
            choice(cx, e, "seccomp baseline", syscalls::BASELINES)
        })?),
        None => None,
    };
    let default_action = b.required(cx, "default-action").and_then(|n| {
        shape(cx, n, 1, 1, &["errno"], false);
        let act = action(cx, n, arg(n, 0)?)?;
        if matches!(act, SeccompAction::Allow | SeccompAction::Log) {
            cx.report(
                "weakened-control",
                name_span(n),
                "filter that admits everything",
                format!(
                    "default-action {:?} turns the filter into a deny-list",
                    act.spelling()
                ),
                Some(
                    "use errno, kill-process, kill-thread or trap, and allow what is needed".into(),
                ),
            );
            return None;
        }
        Some(act)
    });
    let architectures = match b.one("architectures") {
        None => BTreeSet::from([Arch::X86_64]),
        Some(_) => strings(cx, &b.all("architectures"), |cx, e| {
            choice(cx, e, "architecture", &Arch::keywords())
        })
        .iter()
        .filter_map(|a| Arch::from_keyword(a))
        .collect(),
    };
    let base: BTreeMap<String, SyscallRule> = baseline_name
        .as_deref()
        .and_then(syscalls::baseline)
        .unwrap_or_default()
        .into_iter()
        .map(|(name, entry)| {
            let (action, args) = match entry {
                BaselineEntry::Allow => (SeccompAction::Allow, Vec::new()),
                BaselineEntry::AllowIfMaskedZero { index, bits, mask } => (
                    SeccompAction::Allow,
                    vec![ArgCondition {
                        index: u64::from(index),
                        bits,
                        op: ArgOp::MaskedEq,
                        values: vec![0],
                        mask: Some(mask),
                    }],
                ),
                BaselineEntry::Errno(n) => (SeccompAction::Errno(n), Vec::new()),
            };
            let reason = format!("baseline {}", baseline_name.as_deref().unwrap_or_default());
            (
                name.to_owned(),
                SyscallRule {
                    action,
                    args,
                    reason,
                },
            )
        })
        .collect();
    let mut rules = base.clone();
    let mut touched = Seen::default();
    let mut claim = |cx: &mut Cx, name: &str, span: SourceSpan| {
        touched.first(cx, name, span, || {
            format!("syscall {name:?} appears twice in this profile (one entry per syscall: allow, remove or rule)")
        })
    };
    for n in b.all("remove") {
        shape(cx, n, 1, usize::MAX, &["reason"], false);
        for e in positional(n) {
            let Some(name) = syscall_name(cx, e) else {
                continue;
            };
            if !claim(cx, &name, e.span()) {
                continue;
            }
            if rules.remove(&name).is_none() {
                cx.report(
                    "redundant-entry",
                    e.span(),
                    "not in the baseline",
                    format!("remove {name:?} changes nothing: the baseline does not allow it"),
                    None,
                );
            }
        }
    }
    let add = |cx: &mut Cx,
               name: String,
               span: SourceSpan,
               rule: SyscallRule,
               rules: &mut BTreeMap<String, SyscallRule>| {
        let same_as_base = base
            .get(&name)
            .is_some_and(|r| r.action == rule.action && r.args == rule.args);
        if same_as_base {
            cx.report(
                "redundant-entry",
                span,
                "already in the baseline",
                format!("{name:?} is already {} in the baseline", rule.action),
                Some("drop this entry".into()),
            );
        } else {
            rules.insert(name, rule);
        }
    };
    for n in b.all("allow") {
        shape(cx, n, 1, usize::MAX, &["reason"], false);
        let why = reason(cx, n);
        for e in positional(n) {
            let Some(name) = syscall_name(cx, e) else {
                continue;
            };
            if !claim(cx, &name, e.span()) {
                continue;
            }
            if let Some(reason) = why.clone() {
                add(
                    cx,
                    name,
                    e.span(),
                    SyscallRule {
                        action: SeccompAction::Allow,
                        args: Vec::new(),
                        reason,
                    },
                    &mut rules,
                );
            }
        }
    }
    for n in b.all("rule") {
        shape(cx, n, 1, 1, &["action", "errno", "reason"], true);
        let name = arg(n, 0).and_then(|e| syscall_name(cx, e));
        let act = required_prop(cx, n, "action").and_then(|e| action(cx, n, e));
        let why = reason(cx, n);
        let conds = Block::read(cx, n.children(), "rule", name_span(n), &["arg"], &["arg"]);
        let conds = conds.all("arg");
        let widths = name.as_deref().and_then(syscalls::arg_widths);
        let mut args: Vec<ArgCondition> =
            match (&name, widths) {
                (Some(name), Some(widths)) => {
                    let total = conds.len();
                    let args: Vec<ArgCondition> = conds
                        .into_iter()
                        .filter_map(|a| arg_condition(cx, a, name, widths))
                        .collect();
                    if args.len() != total {
                        // Already reported; a rule without the refused condition would admit more.
                        continue;
                    }
                    args
                }
                (Some(name), None) if !conds.is_empty() => {
                    cx.report(
                    "unmodelled-argument",
                    name_span(n),
                    "argument widths unknown",
                    format!(
                        "cordon does not model the arguments of {name:?}, so it cannot say what \
                         a condition on them means"
                    ),
                    Some(format!(
                        "conditions are allowed on: {}",
                        syscalls::modelled_arguments().collect::<Vec<_>>().join(", ")
                    )),
                );
                    continue;
                }
                _ => Vec::new(),
            };
        args.sort();
        // Conditions are ANDed only across arguments: runc turns two conditions on one argument
        // into two rules, ORed, so a second test of an index would widen, not narrow.
        if let Some(w) = args.windows(2).find(|w| w[0].index == w[1].index) {
            cx.report(
                "duplicate",
                name_span(n),
                "one argument tested twice",
                format!(
                    "argument {} of this rule has two conditions; the runtime would OR them",
                    w[0].index
                ),
                Some("one condition per argument: use one-of or masked-eq".into()),
            );
            continue;
        }
        let entries: usize = args.iter().map(|a| a.values.len()).product();
        if entries > MAX_ALTERNATIVES {
            cx.report(
                "invalid-value",
                name_span(n),
                "too many alternatives",
                format!(
                    "the one-of lists of this rule expand to {entries} filter entries; at most \
                     {MAX_ALTERNATIVES}"
                ),
                None,
            );
            continue;
        }
        let (Some(name), Some(action), Some(reason)) = (name, act, why) else {
            continue;
        };
        let span = arg(n, 0).map_or(name_span(n), KdlEntry::span);
        if claim(cx, &name, span) {
            add(
                cx,
                name,
                span,
                SyscallRule {
                    action,
                    args,
                    reason,
                },
                &mut rules,
            );
        }
    }
    // The widths are the x86_64 kernel's; on i386 and x32 the same names take other
    // arguments (i386 multiplexes sockets through socketcall), so conditions are refused there.
    let conditional = rules.values().any(|r| !r.args.is_empty());
    if conditional && architectures != BTreeSet::from([Arch::X86_64]) {
        let span = b.one("architectures").map_or(name_span(node), name_span);
        cx.report(
            "unsound-condition",
            span,
            "argument conditions are x86_64's",
            "argument conditions are modelled for x86_64 only; a filter that also covers x86 or x32 would not enforce them there",
            Some("cover x86_64 alone (other architectures are then killed by the filter)".into()),
        );
        return None;
    }
    Some(SeccompProfile {
        baseline: baseline_name,
        default_action: default_action?,
        architectures,
        syscall: rules,
    })
}

fn not_in_stage(cx: &mut Cx, node: &KdlNode, kind: StageKind, what: &str) {
    cx.report(
        "not-allowed-in-stage",
        name_span(node),
        format!("not allowed in {kind}"),
        format!("{what} is not allowed in stage \"{kind}\""),
        None,
    );
}

fn cpuset(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
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

fn cpus(cx: &mut Cx, entry: &KdlEntry) -> Option<u64> {
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

fn env_name_ok(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn env(cx: &mut Cx, node: Option<&KdlNode>) -> BTreeMap<String, String> {
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
fn mount_roles(kind: StageKind) -> &'static [MountSource] {
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

fn mounts(cx: &mut Cx, nodes: &[&KdlNode], kind: StageKind) -> BTreeMap<String, Mount> {
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

fn props_block<'a>(cx: &mut Cx, node: &'a KdlNode, names: &[&str]) -> Vec<Option<&'a KdlEntry>> {
    shape(cx, node, 0, 0, names, false);
    names.iter().map(|n| required_prop(cx, node, n)).collect()
}

#[allow(clippy::too_many_lines)]
fn stage(cx: &mut Cx, node: &KdlNode, kind: StageKind) -> Option<Stage> {
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
            "cache",
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
        (Some(n), StageKind::Surface) => surface(cx, n, &mount, &env),
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
        cache,
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

fn gpu(cx: &mut Cx, node: Option<&KdlNode>, kind: StageKind) -> BTreeMap<String, Reasoned> {
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
fn relative(cx: &mut Cx, entry: &KdlEntry, what: &str) -> Option<String> {
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
fn surface(
    cx: &mut Cx,
    node: &KdlNode,
    mounts: &BTreeMap<String, Mount>,
    stage_env: &BTreeMap<String, String>,
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
    })
}

fn step(cx: &mut Cx, node: &KdlNode) -> Option<Step> {
    shape(cx, node, 1, 1, &["stage"], true);
    let stage =
        required_prop(cx, node, "stage").and_then(|e| keyword::<StageKind>(cx, e, "stage kind"));
    let b = Block::read(
        cx,
        node.children(),
        "step",
        name_span(node),
        &["argv", "secret"],
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
        Some(n) => Some(single(cx, n, &[], |cx, e| identifier(cx, e, "secret"))?),
        None => None,
    };
    Some(Step {
        stage: stage?,
        argv: argv?,
        secret,
    })
}

/// A registered step's program and every path it passes come from the pinned image (seed 001
/// §3): no argv element may name a path its stage's mounts, `/tmp` or the runtime's
/// filesystems provide, where the candidate's tree or its own writes would stand in for the
/// validator's code.
fn steps_inside_image(cx: &mut Cx, step_nodes: &[&KdlNode], stages: &BTreeMap<StageKind, Stage>) {
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
fn lexical(path: &str) -> String {
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
fn resolve(
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

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_testkit::EditOnce as _;

    fn default_policy() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/evaluator.kdl"
        ))
        .unwrap()
    }

    fn codes(text: &str) -> Vec<String> {
        crate::parse("t.kdl", text)
            .err()
            .map(|e| {
                e.problems()
                    .iter()
                    .map(|p| p.short_code().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_default_policy_decodes_to_typed_values() {
        let p = crate::parse("evaluator.kdl", &default_policy()).unwrap();
        let prebuild = p.stage(StageKind::Prebuild).unwrap();
        assert_eq!(prebuild.network, Network::None);
        assert_eq!(prebuild.root, RootMode::ReadOnly);
        assert_eq!((prebuild.ipc, prebuild.shm_bytes), (Ipc::None, None));
        let lane = p.stage(StageKind::Lane).unwrap();
        assert_eq!(lane.root, RootMode::Overlay);
        assert_eq!((lane.ipc, lane.shm_bytes), (Ipc::Private, Some(16 << 30)));
        assert!(
            lane.gpu_device.is_empty(),
            "gpu \"none\" until part 2's CDI devices"
        );
        let reference = p.stage(StageKind::Reference).unwrap();
        assert_eq!(reference.gpu_device.len(), 3);
        assert!(p.worker_pin().is_some());
        assert_eq!(
            p.steps_of(StageKind::Lane).collect::<Vec<_>>(),
            ["serve-example"]
        );
        let profile = p.seccomp_profile(&prebuild.seccomp).unwrap();
        assert_eq!(profile.default_action, SeccompAction::Errno(1));
        let socket = &profile.syscall["socket"];
        assert_eq!(socket.args[0].op, ArgOp::OneOf);
        assert_eq!(socket.args[0].bits, 32);
    }

    #[test]
    fn speed_and_physical_lanes_are_typed_and_every_bad_value_is_named() {
        let p = crate::parse("evaluator.kdl", &default_policy()).unwrap();
        let speed = p.speed().unwrap();
        assert_eq!((speed.min_margin_bp, speed.min_timed_windows), (500, 4));
        let lanes: Vec<&str> = p
            .physical_lanes()
            .values()
            .map(|l| l.cpuset.as_str())
            .collect();
        assert_eq!(lanes, ["0", "1"]);
        let text = default_policy();
        for (from, to, code) in [
            ("min-timed-windows 4", "min-timed-windows 1", "out-of-range"),
            ("min-margin-bp 500", "min-margin-bp \"5%\"", "wrong-type"),
            ("    min-margin-bp 500\n", "", "missing-node"),
            (
                "max-conditioning-slowdown-bp 15000",
                "max-conditioning-slowdown-bp 9999",
                "out-of-range",
            ),
            ("cpuset=\"1\"", "cpuset=\"0\"", "overlap"),
            ("cpuset=\"1\"", "cpuset=\"1-2\"", "invalid-value"),
            ("cpuset=\"1\"", "cpuset=\"x\"", "invalid-value"),
            (
                "physical-lane \"b\" cpuset=\"1\"",
                "physical-lane \"b\" cpuset=\"1\"\nphysical-lane \"c\" cpuset=\"2\"",
                "invalid-value",
            ),
            (
                "phase-deadline \"workload\" \"90m\"",
                "phase-deadline \"workload\" \"90m\"\n    cpuset \"0-1\"",
                "invalid-value",
            ),
        ] {
            let edited = text.replace_once(from, to);
            assert!(
                codes(&edited).contains(&code.to_owned()),
                "{from} → {to}: {:?}",
                codes(&edited)
            );
        }
        // No lanes and no speed: a policy that cannot qualify, but a valid one.
        let bare = text
            .replace_once("physical-lane \"a\" cpuset=\"0\"\n", "")
            .replace_once("physical-lane \"b\" cpuset=\"1\"\n", "");
        let p = crate::parse("t.kdl", &bare).unwrap();
        assert!(p.physical_lanes().is_empty());
    }

    /// The default policy with its socket condition replaced by `conditions` on `syscall`.
    fn with_rule(syscall: &str, conditions: &str) -> String {
        let text = default_policy();
        let start = text.find("    rule \"socket\"").unwrap();
        let end = start + text[start..].find("    }\n").unwrap() + 6;
        format!(
            "{}    rule \"{syscall}\" action=\"allow\" reason=\"t\" {{\n{conditions}    }}\n{}",
            &text[..start],
            &text[end..]
        )
    }

    #[test]
    fn conditions_on_32_bit_arguments_admit_only_what_a_masked_test_enforces() {
        let ok = |syscall: &str, c: &str| {
            let text = with_rule(syscall, c);
            assert_eq!(codes(&text), Vec::<String>::new(), "{syscall}: {c}");
            let p = crate::parse("t.kdl", &text).unwrap();
            p.seccomp_profile("candidate").unwrap().syscall[syscall]
                .args
                .clone()
        };
        let bad = |syscall: &str, c: &str| codes(&with_rule(syscall, c));
        // Sound on 32 bits: eq, one-of, masked-eq within the low half.
        let a = ok("socket", "arg index=0 op=\"one-of\" 10 1 2\n");
        assert_eq!((a[0].bits, a[0].values.clone()), (32, vec![1, 2, 10]));
        ok("fcntl", "arg index=1 op=\"eq\" value=1\n");
        ok(
            "personality",
            "arg index=0 op=\"masked-eq\" value=8 mask=4294967295\n",
        );
        // Unsound on 32 bits: every ordering and ne.
        for op in ["ne", "lt", "le", "gt", "ge"] {
            let c = format!("arg index=0 op=\"{op}\" value=40\n");
            assert_eq!(bad("socket", &c), ["unsound-condition"], "{op}");
            // ... and meaningful on a 64-bit argument.
            let c = format!("arg index=2 op=\"{op}\" value=40\n");
            assert_eq!(ok("ioctl", &c)[0].bits, 64, "{op}");
        }
        // Values and masks must fit the width; the index must be an argument.
        assert_eq!(
            bad("socket", "arg index=0 op=\"eq\" value=4294967336\n"),
            ["out-of-range"]
        );
        assert_eq!(
            bad(
                "socket",
                "arg index=0 op=\"masked-eq\" value=0 mask=4294967296\n"
            ),
            ["out-of-range"]
        );
        assert_eq!(
            bad("socket", "arg index=3 op=\"eq\" value=1\n"),
            ["out-of-range"]
        );
        // Syscalls cordon does not model take no conditions.
        assert_eq!(
            bad("read", "arg index=2 op=\"lt\" value=4096\n"),
            ["unmodelled-argument"]
        );
        // one-of takes its values as arguments, at least two, once each.
        assert_eq!(
            bad("socket", "arg index=0 op=\"one-of\" value=1\n"),
            ["missing-argument", "unknown-property"]
        );
        assert_eq!(
            bad("socket", "arg index=0 op=\"one-of\" 1 1\n"),
            ["redundant-entry"]
        );
        // One argument tested twice would be ORed by the runtime.
        assert_eq!(
            bad(
                "socket",
                "arg index=0 op=\"eq\" value=1\narg index=0 op=\"masked-eq\" value=0 mask=1\n"
            ),
            ["duplicate"]
        );
        // Conditions are x86_64's: a filter that also covers x86 refuses them.
        let text = with_rule("socket", "arg index=0 op=\"one-of\" 1 2\n").replace_once(
            "architectures \"x86_64\"",
            "architectures \"x86_64\" \"x86\"",
        );
        assert_eq!(codes(&text), ["unsound-condition"]);
        let many: Vec<String> = (0..9).map(|v| v.to_string()).collect();
        let c = format!(
            "arg index=0 op=\"one-of\" {0}\narg index=1 op=\"one-of\" {0}\n",
            many.join(" ")
        );
        assert_eq!(bad("socket", &c), ["invalid-value"], "81 entries > 64");
        // Exactly the bound is admitted: 8 × 8 = 64 entries.
        let eight: Vec<String> = (0..8).map(|v| v.to_string()).collect();
        let c = format!(
            "arg index=0 op=\"one-of\" {0}\narg index=1 op=\"one-of\" {0}\n",
            eight.join(" ")
        );
        assert_eq!(
            codes(&with_rule("socketpair", &c)),
            Vec::<String>::new(),
            "64 entries"
        );
        // A filter without argument conditions may cover x86 too (nothing to misread there),
        // and an unmodelled call may be allowed as long as it carries no condition.
        let prebuild = "    seccomp \"candidate\"\n    user \"per-run\"\n    cpus 4\n";
        let text = format!(
            "{}\nseccomp \"plain\" {{\n    default-action \"errno\" errno=1\n    \
             architectures \"x86_64\" \"x86\"\n    \
             rule \"read\" action=\"allow\" reason=\"t\"\n    \
             rule \"io_uring_setup\" action=\"allow\" reason=\"t\"\n}}\n",
            default_policy().replace_once(prebuild, &prebuild.replace("candidate", "plain"))
        );
        assert_eq!(codes(&text), Vec::<String>::new());
    }

    /// The stage bounds admit exactly their ends and refuse one step past them; a phase may
    /// last as long as its stage, not longer, and has one deadline.
    #[test]
    fn stage_bounds_admit_their_ends_and_refuse_one_past() {
        let lane = crate::parse("t.kdl", &default_policy()).unwrap();
        let phases = &lane.stage(StageKind::Lane).unwrap().phase_deadline_ms;
        assert_eq!(
            phases
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            [("startup", 20 * 60_000), ("workload", 90 * 60_000)],
            "every phase deadline is kept, the first included"
        );
        let none = Vec::<String>::new();
        let publication = "max-file-bytes=\"1GiB\" max-depth=16";
        let lane = "    phase-deadline \"workload\" \"90m\"\n";
        for (from, to, want) in [
            ("memory \"8GiB\"", "memory \"256MiB\"", none.clone()),
            (
                "memory \"8GiB\"",
                "memory \"255MiB\"",
                vec!["out-of-range".to_owned()],
            ),
            ("memory \"8GiB\"", "memory \"4TiB\"", none.clone()),
            (
                "memory \"8GiB\"",
                "memory \"4097GiB\"",
                vec!["out-of-range".to_owned()],
            ),
            (
                publication,
                "max-file-bytes=\"64GiB\" max-depth=16",
                none.clone(),
            ),
            (
                publication,
                "max-file-bytes=\"65GiB\" max-depth=16",
                vec!["out-of-range".to_owned()],
            ),
            (
                lane,
                "    phase-deadline \"workload\" \"2h\"\n",
                none.clone(),
            ),
            (
                lane,
                "    phase-deadline \"workload\" \"121m\"\n",
                vec!["out-of-range".to_owned()],
            ),
            (
                lane,
                "    phase-deadline \"workload\" \"90m\"\n    phase-deadline \"workload\" \"9m\"\n",
                vec!["duplicate".to_owned()],
            ),
        ] {
            let text = default_policy().replace_once(from, to);
            assert_eq!(codes(&text), want, "{to}");
        }
    }

    /// The runtime's own destinations are reserved: the root, `/tmp`, and anything at or below
    /// `/proc`, `/sys` or `/dev`.
    #[test]
    fn the_runtimes_own_mount_destinations_are_reserved() {
        let line = "    mount \"tree\" \"/engine\" mode=\"ro\"\n    mount \"staging\"";
        for dest in ["/", "/tmp", "/proc", "/sys/fs", "/dev/shm"] {
            let text = default_policy().replace_once(line, &line.replace("/engine", dest));
            assert_eq!(codes(&text), ["overlap"], "{dest}");
        }
        let text = default_policy().replace_once(line, &line.replace("/engine", "/procs"));
        assert_eq!(codes(&text), Vec::<String>::new(), "/procs is not /proc");
    }

    /// Each block a stage kind may not have is refused in it, by name.
    #[test]
    fn blocks_a_stage_kind_may_not_have_are_refused_in_it() {
        for (stage, block) in [
            (
                "stage \"lane\" {\n",
                "    staging size=\"1GiB\" inodes=10\n",
            ),
            (
                "stage \"lane\" {\n",
                "    publication max-files=1 max-bytes=\"1MiB\" max-file-bytes=\"1MiB\" max-depth=2 max-path-length=9\n",
            ),
        ] {
            let text = default_policy().replace_once(stage, &format!("{stage}{block}"));
            assert_eq!(codes(&text), ["not-allowed-in-stage"], "{block}");
        }
    }

    #[test]
    fn the_surface_is_typed_apart_from_the_candidate_stages() {
        let surface = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policy/examples/surface.kdl"
        ))
        .unwrap();
        let p = crate::parse("s.kdl", &surface).unwrap();
        let s = p.stage(StageKind::Surface).unwrap();
        assert_eq!(
            (s.image.as_deref(), s.root, s.user),
            (None, RootMode::Empty, User::Service)
        );
        assert_eq!((s.memory_bytes, s.pids), (None, None));
        let block = s.surface.as_ref().unwrap();
        assert!(block.agent_env.contains("ANTHROPIC_API_KEY"));
        assert_eq!(
            (block.home.as_str(), block.temp.as_str()),
            (".cph/agent-runtime", ".cph/t")
        );
        for (from, to, code) in [
            // One source per variable.
            (
                "pass-env \"TERM\"",
                "pass-env \"TERM\" \"DATABASE_URL\"",
                "duplicate",
            ),
            (
                "pass-env \"TERM\"",
                "pass-env \"TERM\" \"HOME\"",
                "duplicate",
            ),
            (
                "pass-env \"TERM\"",
                "pass-env \"TERM\" \"PATH\"",
                "duplicate",
            ),
            (
                "temp-env \"CLAUDE_CODE_TMPDIR\"",
                "temp-env \"ANTHROPIC_API_KEY\"",
                "duplicate",
            ),
            (
                "home \".cph/agent-runtime\"",
                "home \"../up\"",
                "invalid-path",
            ),
            (
                "home \".cph/agent-runtime\"",
                "home \"/abs\"",
                "invalid-path",
            ),
            ("home \".cph/agent-runtime\"", "home \".cph\"", "overlap"),
            (
                "    root \"empty\"\n",
                "    root \"read-only\"\n",
                "not-allowed-in-stage",
            ),
            (
                "    root \"empty\"\n",
                "    root \"empty\"\n    image \"x\"\n",
                "not-allowed-in-stage",
            ),
            (
                "    network \"none\"\n",
                "    network \"host\"\n",
                "invalid-value",
            ),
            ("read \"/usr\" ", "read \"/\" ", "overlap"),
            ("read \"/usr\" ", "read \"/tmp\" ", "overlap"),
            ("read \"/usr\" ", "read \"/workspace/x\" ", "overlap"),
        ] {
            let text = replace_exactly_once(&surface, from, to);
            assert!(
                codes(&text).contains(&code.to_owned()),
                "{to:?}: {:?}",
                codes(&text)
            );
        }
        // And the candidate stages keep every control they had.
        for (from, to, code) in [
            (
                "    root \"read-only\"\n",
                "    root \"empty\"\n",
                "not-allowed-in-stage",
            ),
            (
                "    user \"per-run\"\n",
                "    user \"service\"\n",
                "weakened-control",
            ),
            (
                "    network \"none\"\n",
                "    network \"egress\"\n",
                "not-allowed-in-stage",
            ),
            ("    memory \"8GiB\"\n", "", "missing-node"),
        ] {
            // The first occurrence: the prebuild stage's.
            let text = default_policy().replacen(from, to, 1);
            assert_ne!(text, default_policy(), "{from:?}");
            assert!(
                codes(&text).contains(&code.to_owned()),
                "{to:?}: {:?}",
                codes(&text)
            );
        }
    }

    fn replace_exactly_once(text: &str, from: &str, to: &str) -> String {
        assert_eq!(text.matches(from).count(), 1, "{from:?}");
        text.replacen(from, to, 1)
    }

    #[test]
    fn a_runtime_minimum_is_a_release_number() {
        let p = crate::parse("t.kdl", &default_policy()).unwrap();
        assert_eq!(p.runtime().min_version(), Some((1, 1, 5)));
        for bad in ["1.1", "1.x.5", "v1.1.5", ""] {
            let text = default_policy()
                .replace_once("min-version=\"1.1.5\"", &format!("min-version={bad:?}"));
            assert_eq!(codes(&text), ["invalid-value"], "{bad:?}");
        }
    }

    #[test]
    fn shm_is_sized_only_for_a_private_ipc_namespace() {
        let text = default_policy().replace_once(
            "    ipc \"none\"\n",
            "    ipc \"none\"\n    shm \"64MiB\"\n",
        );
        assert_ne!(text, default_policy(), "the edit must apply");
        assert_eq!(codes(&text), ["redundant-entry"]);
        let text = default_policy().replace_once("    ipc \"none\"\n", "    ipc \"private\"\n");
        let p = crate::parse("t.kdl", &text).unwrap();
        assert_eq!(
            p.stage(StageKind::Prebuild).unwrap().shm_bytes,
            Some(64 << 20),
            "a private namespace without shm gets the 64MiB default"
        );
    }
}
