//! The section decoders: KDL document → validated [`Policy`].
//!
//! Each decoder reads one section, reports every problem it finds through [`Cx`], and goes on;
//! cross-references (stage → image, stage → seccomp profile, step → stage, step → secret) are
//! resolved once every section has been read. A [`Policy`] is returned only when nothing at
//! all was reported. The language itself is documented in `policy/README.md`.
//!
//! This module reads the document and the small sections (header, runtime, lanes, speed,
//! accounts) and keeps the shared readers; `intake` holds the intake and tree sections,
//! `seccomp` the profiles, `stage` one stage block, `surface` the surface block and `steps` the
//! build steps and the cross-references.

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

mod intake;
mod seccomp;
mod stage;
mod steps;
mod surface;

use intake::*;
use seccomp::*;
use stage::*;
use steps::*;
use surface::*;
pub use surface::{SURFACE_SET_ENV, domain_ok};

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

/// A top-level `NAME digest="sha256:…"` pin, when the policy has one.
/// An optional top-level section: `Some(None)` when absent, `None` when present and invalid.
fn optional<T>(
    cx: &mut Cx,
    top: &Block<'_>,
    name: &str,
    build: fn(&mut Cx, &KdlNode) -> Option<T>,
) -> Option<Option<T>> {
    match top.one(name) {
        Some(node) => build(cx, node).map(Some),
        None => Some(None),
    }
}

fn pin(cx: &mut Cx, top: &Block<'_>, name: &str) -> Option<Digest> {
    let node = top.one(name)?;
    shape(cx, node, 0, 0, &["digest"], false);
    required_prop(cx, node, "digest").and_then(|e| digest(cx, e))
}

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
            "models",
            "never-mount",
            "runtime",
            "accounts",
            "host",
            "secret",
            "intake",
            "tree",
            "image",
            "worker",
            "pristine",
            "seccomp",
            "physical-lane",
            "device-guard",
            "speed",
            "quality",
            "audit",
            "reproduction",
            "stage",
            "step",
        ],
        &[
            "never-mount",
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
    let models = value(
        cx,
        &top,
        "models",
        Some("/var/lib/cordon/models".to_owned()),
        |cx, e| path(cx, e, "models"),
    );
    let mut never_mount = BTreeMap::new();
    let mut seen_never = Seen::default();
    for node in top.all("never-mount") {
        shape(cx, node, 1, 1, &["reason"], false);
        let Some(entry) = arg(node, 0) else { continue };
        let Some(p) = path(cx, entry, "never-mount") else {
            continue;
        };
        let why = reason(cx, node);
        if !seen_never.first(cx, &p, entry.span(), || {
            format!("never-mount {p:?} is listed twice")
        }) {
            continue;
        }
        // A named root beside a never-mount path: its trees, models or run directories could
        // never be bound, or a never-mount path inside one would be — refused here rather than
        // at every session's planning.
        let clash = [
            ("store", &store),
            ("run-dir", &run_dir),
            ("models", &models),
        ]
        .into_iter()
        .find(|(_, r)| r.as_ref().is_some_and(|r| nested(r, &p)));
        if let Some((root, Some(r))) = clash {
            cx.report_at(
                "overlap",
                vec![
                    (entry.span(), "never-mount".into()),
                    (top.one(root).map_or(whole, name_span), root.into()),
                ],
                format!("never-mount {p} and {root} {r} overlap"),
                Some(
                    "a never-mount path lies apart from the store, run directories and models root"
                        .into(),
                ),
            );
            continue;
        }
        if let Some(why) = why {
            never_mount.insert(p, why);
        }
    }
    // The named roots are pairwise disjoint (by path here; the lane also checks real paths and
    // inodes on the host).
    let roots = [
        ("store", &store),
        ("run-dir", &run_dir),
        ("models", &models),
    ];
    for (i, (a, pa)) in roots.iter().enumerate() {
        for (b, pb) in &roots[i + 1..] {
            if let (Some(x), Some(y)) = (pa, pb)
                && nested(x, y)
            {
                let span = |name: &str| top.one(name).map_or(whole, name_span);
                cx.report_at(
                    "overlap",
                    vec![(span(a), (*a).into()), (span(b), (*b).into())],
                    format!("{a} {x} and {b} {y} overlap"),
                    Some(
                        "the store, the run directories and the models root must be disjoint trees"
                            .into(),
                    ),
                );
            }
        }
    }
    let runtime = top.required(cx, "runtime").and_then(|n| runtime(cx, n));
    let accounts = top.required(cx, "accounts").and_then(|n| accounts(cx, n));
    let host = host(cx, top.one("host"), whole);
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
    let worker = pin(cx, &top, "worker");
    // The pristine reference tree (seed 001 §5): pinned like the worker, so T runs only the
    // reviewed stock tree, never one a stage was handed.
    let pristine = pin(cx, &top, "pristine");
    let physical_lane = physical_lanes(cx, &top.all("physical-lane"));
    let device_guard = optional(cx, &top, "device-guard", device_guard);
    // The guard's rules exactly when a lane names GPUs: rules for no device, or GPUs with no
    // rule to hold them to, are refused.
    if let (Some(lanes), Some(guard)) = (&physical_lane, &device_guard) {
        let gpus = lanes.values().any(|l| !l.gpus.is_empty());
        match (
            gpus,
            guard,
            top.one("device-guard"),
            top.all("physical-lane").first(),
        ) {
            (false, Some(_), Some(node), _) => cx.report(
                "redundant-entry",
                name_span(node),
                "no GPU to guard",
                "device-guard is set and no physical lane names a GPU".to_owned(),
                Some("drop device-guard, or name each lane's GPUs".into()),
            ),
            (true, None, _, Some(first)) => cx.report(
                "missing-node",
                name_span(first),
                "GPUs without a guard",
                "the physical lanes name GPUs and the policy has no device-guard".to_owned(),
                Some(
                    "add device-guard { drain …; envelope … }: a GPU read is never unguarded"
                        .into(),
                ),
            ),
            _ => {}
        }
    }
    let speed = optional(cx, &top, "speed", speed);
    let quality = optional(cx, &top, "quality", quality);
    let audit = optional(cx, &top, "audit", audit);
    let reproduction = optional(cx, &top, "reproduction", reproduction);
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
    let mut patchers = Seen::default();
    let steps = named(cx, &top.all("step"), "step")
        .into_iter()
        .filter_map(|(name, node)| {
            let step = step(cx, node)?;
            // Each tier has one patcher: a delta's tier names the program that builds it.
            if let (Some(tier), Some(e)) = (step.tier, prop(node, "tier")) {
                patchers.first(cx, tier.as_str(), e.span(), || {
                    format!("tier {:?} has a registered patcher already", tier.as_str())
                });
            }
            Some((name, step))
        })
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
    // A GPU read's devices are its lane's, resolved from CDI under the guard: a GPU-capable
    // stage that also names device nodes of its own would reach a GPU outside both.
    if let Some(lanes) = &physical_lane
        && lanes.values().any(|l| !l.gpus.is_empty())
    {
        for kind in [StageKind::Lane, StageKind::Reference] {
            if stages.get(&kind).is_some_and(|s| !s.gpu_device.is_empty())
                && let Some(node) = stage_nodes
                    .iter()
                    .find(|n| arg(n, 0).and_then(|e| e.value().as_string()) == Some(kind.as_str()))
            {
                cx.report(
                    "invalid-value",
                    name_span(node),
                    "GPU nodes of its own",
                    format!(
                        "stage {:?} names GPU device nodes and the physical lanes name GPUs",
                        kind.as_str()
                    ),
                    Some(
                        "a GPU read's devices are its lane's, from CDI: write `gpu \"none\"`"
                            .into(),
                    ),
                );
            }
        }
    }
    resolve(cx, &top, &stage_nodes, &steps, &secret);
    steps_inside_image(cx, &top.all("step"), &stages);

    let policy = Policy {
        policy: header?,
        store: store?,
        run_dir: run_dir?,
        models: models?,
        never_mount,
        runtime: runtime?,
        accounts: accounts?,
        host: host?,
        secret,
        intake: intake?,
        tree: tree?,
        image,
        worker,
        pristine,
        seccomp,
        physical_lane: physical_lane?,
        device_guard: device_guard?,
        speed: speed?,
        quality: quality?,
        audit: audit?,
        reproduction_required: reproduction?.is_some(),
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
            shape(cx, node, 1, 1, &["cpuset", "cpu-shares"], true);
            let set = required_prop(cx, node, "cpuset").and_then(|e| cpuset(cx, e));
            let cpu_shares = match prop(node, "cpu-shares") {
                // The kernel's own bounds for cpu.shares.
                Some(e) => Some(integer(cx, e, "cpu-shares", 2, 262_144)?),
                None => None,
            };
            let gpus = lane_gpus(cx, node, &name);
            Some((
                name,
                node,
                PhysicalLane {
                    cpuset: set?,
                    cpu_shares,
                    gpus: gpus?,
                },
            ))
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
            if la.cpu_shares != lb.cpu_shares {
                let shares = |l: &PhysicalLane| {
                    l.cpu_shares
                        .map_or_else(|| "the default".to_owned(), |n| n.to_string())
                };
                cx.report_at(
                    "invalid-value",
                    vec![(span(a), shares(la)), (span(b), shares(lb))],
                    "the physical lanes differ in CPU weight",
                    Some("a qualification compares reads on lanes of identical shape".into()),
                );
                return None;
            }
            // A GPU belongs to one lane; the lanes' GPUs are pinned alike (a comparison of
            // reads on unlike devices measures the devices).
            if let Some(shared) = la.gpus.keys().find(|u| lb.gpus.contains_key(*u)) {
                cx.report_at(
                    "overlap",
                    vec![(span(a), shared.clone()), (span(b), shared.clone())],
                    format!("the two physical lanes share GPU {shared}"),
                    Some("each lane is a device set of its own".into()),
                );
                return None;
            }
            let mut ca: Vec<&DeviceConfig> = la.gpus.values().collect();
            let mut cb: Vec<&DeviceConfig> = lb.gpus.values().collect();
            let key = |c: &&DeviceConfig| format!("{c:?}");
            ca.sort_by_key(key);
            cb.sort_by_key(key);
            if ca != cb {
                cx.report_at(
                    "invalid-value",
                    vec![
                        (span(a), format!("{} GPUs", la.gpus.len())),
                        (span(b), format!("{} GPUs", lb.gpus.len())),
                    ],
                    "the physical lanes' GPUs differ in number or pinned configuration",
                    Some("a qualification compares reads on lanes of identical shape".into()),
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

/// A physical lane's GPUs: `gpu "GPU-<uuid>" { … }`, each with its pinned configuration.
fn lane_gpus(cx: &mut Cx, node: &KdlNode, lane: &str) -> Option<BTreeMap<String, DeviceConfig>> {
    let owner = format!("physical-lane {lane:?}");
    let b = Block::read(
        cx,
        node.children(),
        &owner,
        name_span(node),
        &["gpu"],
        &["gpu"],
    );
    let mut gpus = BTreeMap::new();
    let mut ok = true;
    let mut seen = Seen::default();
    for g in b.all("gpu") {
        shape(cx, g, 1, 1, &[], true);
        let Some(entry) = arg(g, 0) else {
            ok = false;
            continue;
        };
        let Some(uuid) = string(cx, entry) else {
            ok = false;
            continue;
        };
        if !gpu_uuid(&uuid) {
            cx.report(
                "invalid-value",
                entry.span(),
                "not a GPU UUID",
                format!("{uuid:?} is not a GPU UUID"),
                Some("name a GPU as NVML does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (`nvidia-smi -L`)".into()),
            );
            ok = false;
            continue;
        }
        if !seen.first(cx, &uuid, entry.span(), || {
            format!("GPU {uuid:?} is named twice")
        }) {
            ok = false;
            continue;
        }
        match pinned(cx, g, &uuid) {
            Some(c) => {
                gpus.insert(uuid, c);
            }
            None => ok = false,
        }
    }
    ok.then_some(gpus)
}

/// NVML's form of a GPU's UUID: `GPU-` and 8-4-4-4-12 lower-case hexadecimal digits (NVML
/// writes them so; another case would be another name to every comparison).
fn gpu_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| {
            g.len() == n
                && g.chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        })
}

/// One GPU's pinned configuration: every field required, none defaulted (a pin is reviewed).
fn pinned(cx: &mut Cx, node: &KdlNode, uuid: &str) -> Option<DeviceConfig> {
    let names = [
        "driver",
        "persistence",
        "compute-mode",
        "application-clocks",
        "power-limit",
        "ecc",
        "mig",
    ];
    let b = Block::read(
        cx,
        node.children(),
        &format!("gpu {uuid:?}"),
        name_span(node),
        &names,
        &[],
    );
    let driver = b.required(cx, "driver").and_then(|n| {
        single(cx, n, &[], |cx, e| {
            let v = string(cx, e)?;
            if v.is_empty() {
                cx.report(
                    "invalid-value",
                    e.span(),
                    "empty",
                    "an empty driver version pins nothing".to_owned(),
                    Some("the version `nvidia-smi` reports, e.g. \"550.54.15\"".into()),
                );
                return None;
            }
            Some(v)
        })
    });
    let mut flag = |name: &str| {
        b.required(cx, name)
            .and_then(|n| single(cx, n, &[], boolean))
    };
    let persistence = flag("persistence");
    let ecc = flag("ecc");
    let mig = flag("mig");
    let compute_mode = b.required(cx, "compute-mode").and_then(|n| {
        single(cx, n, &[], |cx, e| {
            choice(
                cx,
                e,
                "compute-mode",
                &["default", "exclusive-process", "prohibited"],
            )
        })
    });
    let clocks = b.required(cx, "application-clocks").and_then(|n| {
        shape(cx, n, 0, 0, &["graphics", "memory"], false);
        let mhz = |cx: &mut Cx, key: &str| {
            required_prop(cx, n, key).and_then(|e| integer(cx, e, key, 1, 100_000))
        };
        let (g, m) = (mhz(cx, "graphics"), mhz(cx, "memory"));
        Some((u32::try_from(g?).ok()?, u32::try_from(m?).ok()?))
    });
    let power = b
        .required(cx, "power-limit")
        .and_then(|n| single(cx, n, &[], |cx, e| watts(cx, e, "power-limit")));
    Some(DeviceConfig {
        driver: driver?,
        persistence: persistence?,
        compute_mode: match compute_mode?.as_str() {
            "default" => ComputeMode::Default,
            "exclusive-process" => ComputeMode::ExclusiveProcess,
            _ => ComputeMode::Prohibited,
        },
        application_clocks: clocks?,
        power_limit_mw: power?,
        // A pin holds now and after the next reset alike.
        ecc: (ecc?, ecc?),
        mig: (mig?, mig?),
    })
}

/// A power in watts (`"700W"`), as milliwatts; at most 10 kW.
fn watts(cx: &mut Cx, entry: &KdlEntry, what: &str) -> Option<u32> {
    let text = string(cx, entry)?;
    // Digits only, no sign and no leading zero: one spelling per value.
    let w = text
        .strip_suffix('W')
        .filter(|n| n.chars().all(|c| c.is_ascii_digit()) && (!n.starts_with('0') || *n == "0"))
        .and_then(|n| n.parse::<u32>().ok());
    match w {
        Some(w) if (1..=10_000).contains(&w) => Some(w * 1000),
        Some(_) => {
            cx.report(
                "out-of-range",
                entry.span(),
                "out of range",
                format!("{what} {text:?} is outside 1W to 10000W"),
                None,
            );
            None
        }
        None => {
            cx.report(
                "invalid-value",
                entry.span(),
                "not a power",
                format!("{what} {text:?} is not a power in whole watts"),
                Some("for example \"700W\" (1W to 10000W)".into()),
            );
            None
        }
    }
}

/// The device guard: `drain …`, `envelope …`, and the CDI hooks allowed, each with a reason.
fn device_guard(cx: &mut Cx, node: &KdlNode) -> Option<DeviceGuard> {
    shape(cx, node, 0, 0, &[], true);
    let b = Block::read(
        cx,
        node.children(),
        "device-guard",
        name_span(node),
        &["drain", "envelope", "cdi-hook"],
        &["cdi-hook"],
    );
    let drain = b.required(cx, "drain").and_then(|n| {
        shape(
            cx,
            n,
            0,
            0,
            &[
                "samples",
                "interval",
                "sample-timeout",
                "timeout",
                "idle-memory",
            ],
            false,
        );
        let samples =
            required_prop(cx, n, "samples").and_then(|e| integer(cx, e, "samples", 1, 1000));
        let ms = |cx: &mut Cx, key: &str, min: u64| {
            required_prop(cx, n, key).and_then(|e| duration(cx, e, key, min, 3_600_000))
        };
        let interval = ms(cx, "interval", DrainRule::MIN_INTERVAL_MS);
        let sample_timeout = ms(cx, "sample-timeout", 1);
        let timeout = ms(cx, "timeout", 1);
        let idle = required_prop(cx, n, "idle-memory")
            .and_then(|e| size(cx, e, "idle-memory", 0, 1 << 40));
        let rule = DrainRule {
            samples: u32::try_from(samples?).ok()?,
            interval_ms: interval?,
            sample_timeout_ms: sample_timeout?,
            timeout_ms: timeout?,
            idle_memory: idle?,
        };
        if let Some(why) = rule.unsound() {
            cx.report(
                "invalid-value",
                name_span(n),
                "unsound",
                format!("the drain rule is unsound: {why}"),
                None,
            );
            return None;
        }
        Some(rule)
    });
    let envelope = b.required(cx, "envelope").and_then(|n| {
        shape(
            cx,
            n,
            0,
            usize::MAX,
            &["max-temperature", "max-power", "min-graphics-clock"],
            false,
        );
        let temperature = required_prop(cx, n, "max-temperature")
            .and_then(|e| integer(cx, e, "max-temperature", 1, 150));
        let power = required_prop(cx, n, "max-power").and_then(|e| watts(cx, e, "max-power"));
        let clock = required_prop(cx, n, "min-graphics-clock")
            .and_then(|e| integer(cx, e, "min-graphics-clock", 0, 100_000));
        // The positional arguments: the throttle reasons forbidden while measured, each once.
        let mut forbidden = 0u64;
        let mut ok = true;
        let mut seen = Seen::default();
        for e in n.entries().iter().filter(|e| e.name().is_none()) {
            let names: Vec<&str> = cordon_evidence::device::THROTTLE_REASONS
                .iter()
                .map(|(_, name)| *name)
                .collect();
            match choice(cx, e, "throttle reason", &names) {
                Some(name)
                    if !seen.first(cx, &name, e.span(), || {
                        format!("throttle reason {name:?} is named twice")
                    }) =>
                {
                    ok = false;
                }
                Some(name) => {
                    forbidden |= cordon_evidence::device::THROTTLE_REASONS
                        .iter()
                        .find(|(_, n)| *n == name)
                        .map_or(0, |(bit, _)| *bit);
                }
                None => ok = false,
            }
        }
        Some(Envelope {
            max_temperature_c: u32::try_from(temperature?).ok()?,
            max_power_mw: power?,
            min_graphics_mhz: u32::try_from(clock?).ok()?,
            forbidden_throttle: ok.then_some(forbidden)?,
        })
    });
    let mut cdi_hooks = BTreeMap::new();
    let mut seen = Seen::default();
    let mut hooks_ok = true;
    for h in b.all("cdi-hook") {
        shape(cx, h, 1, 1, &["reason"], false);
        let entry = arg(h, 0);
        let name = entry.and_then(|e| path(cx, e, "cdi-hook"));
        let why = reason(cx, h);
        match (name, why, entry) {
            (Some(name), Some(why), Some(e)) => {
                if seen.first(cx, &name, e.span(), || {
                    format!("cdi-hook {name:?} is named twice")
                }) {
                    cdi_hooks.insert(name, why);
                } else {
                    hooks_ok = false;
                }
            }
            _ => hooks_ok = false,
        }
    }
    Some(DeviceGuard {
        drain: drain?,
        envelope: envelope?,
        cdi_hooks: hooks_ok.then_some(cdi_hooks)?,
    })
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

fn quality(cx: &mut Cx, node: &KdlNode) -> Option<Quality> {
    shape(cx, node, 0, 0, &[], true);
    let names = ["min-exact-bp", "min-prefix-bp"];
    let b = Block::read(cx, node.children(), "quality", name_span(node), &names, &[]);
    // Both required: a verdict threshold is reviewed, never defaulted. Shares: at most all.
    let mut get = |name: &str| {
        b.required(cx, name)
            .and_then(|n| single(cx, n, &[], |cx, e| integer(cx, e, name, 0, 10_000)))
    };
    let min_exact_bp = get("min-exact-bp");
    let min_prefix_bp = get("min-prefix-bp");
    Some(Quality {
        min_exact_bp: min_exact_bp?,
        min_prefix_bp: min_prefix_bp?,
    })
}

fn audit(cx: &mut Cx, node: &KdlNode) -> Option<Audit> {
    shape(cx, node, 0, 0, &[], true);
    let b = Block::read(
        cx,
        node.children(),
        "audit",
        name_span(node),
        &["requests"],
        &[],
    );
    // Required when the section is there: an audit of no request would audit nothing.
    let requests = b
        .required(cx, "requests")
        .and_then(|n| single(cx, n, &[], |cx, e| integer(cx, e, "requests", 1, 1_000_000)));
    Some(Audit {
        requests: requests?,
    })
}

/// `reproduction "required"`: the final verdict rests on a primary attempt and its exchanged
/// reproduction, never on one attempt. The one value there is: absent is "not required".
fn reproduction(cx: &mut Cx, node: &KdlNode) -> Option<()> {
    shape(cx, node, 1, 1, &[], false);
    arg(node, 0)
        .and_then(|e| choice(cx, e, "reproduction", &["required"]))
        .map(|_| ())
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

/// `host { … }`: what a host must be for a candidate stage to run on it. Absent, or any value
/// left out, is the strictest: a 2 GiB reserve, no hypervisor, SMT off, unprivileged BPF off, no CPU
/// vulnerability accepted.
fn host(cx: &mut Cx, node: Option<&KdlNode>, whole: SourceSpan) -> Option<Host> {
    let b = Block::section(
        cx,
        node,
        "host",
        whole,
        &[
            "memory-reserve",
            "hypervisor",
            "smt",
            "unprivileged-bpf",
            "accept-vulnerable",
        ],
        &["accept-vulnerable"],
    );
    let memory_reserve_bytes = value(cx, &b, "memory-reserve", Some(2 * GIB), |cx, e| {
        size(cx, e, "memory-reserve", 256 * MIB, TIB)
    });
    let hypervisor = allowance(cx, &b, "hypervisor");
    let smt = allowance(cx, &b, "smt");
    let unprivileged_bpf = allowance(cx, &b, "unprivileged-bpf");
    let mut seen = Seen::default();
    let mut accept_vulnerable = BTreeMap::new();
    for node in b.all("accept-vulnerable") {
        shape(cx, node, 1, 1, &["reason"], false);
        let Some(entry) = arg(node, 0) else { continue };
        let Some(name) = vulnerability(cx, entry) else {
            continue;
        };
        let why = reason(cx, node);
        if seen.first(cx, &name, entry.span(), || {
            format!("vulnerability {name:?} is accepted twice")
        }) && let Some(why) = why
        {
            accept_vulnerable.insert(name, why);
        }
    }
    Some(Host {
        memory_reserve_bytes: memory_reserve_bytes?,
        hypervisor: hypervisor?,
        smt: smt?,
        unprivileged_bpf: unprivileged_bpf?,
        accept_vulnerable,
    })
}

/// `NAME "off"`, or `NAME "on" reason="…"`; absent is off.
fn allowance(cx: &mut Cx, b: &Block<'_>, name: &str) -> Option<Allowance> {
    let Some(node) = b.one(name) else {
        return Some(Allowance::Off);
    };
    shape(cx, node, 1, 1, &["reason"], false);
    match arg(node, 0)
        .and_then(|e| choice(cx, e, name, &["off", "on"]))?
        .as_str()
    {
        "off" => {
            // A reason for "off" would be read by a reviewer and then dropped: refused.
            if let Some(e) = prop(node, "reason") {
                cx.report(
                    "invalid-value",
                    e.span(),
                    "a reason for \"off\"",
                    format!("{name} \"off\" needs no reason"),
                    Some("a reason is for \"on\", the exception".into()),
                );
                return None;
            }
            Some(Allowance::Off)
        }
        _ => Some(Allowance::On {
            reason: reason(cx, node)?,
        }),
    }
}

/// A CPU vulnerability's name as the kernel spells it under
/// `/sys/devices/system/cpu/vulnerabilities` (`spec_store_bypass`).
fn vulnerability(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
    let text = string(cx, entry)?;
    if text.len() <= 64
        && text.starts_with(|c: char| c.is_ascii_lowercase())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Some(text);
    }
    cx.report(
        "invalid-value",
        entry.span(),
        "not a vulnerability name",
        format!("{text:?} is not a CPU vulnerability's name"),
        Some("write the file name under /sys/devices/system/cpu/vulnerabilities, e.g. \"spec_store_bypass\"".into()),
    );
    None
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

#[cfg(test)]
mod tests;
