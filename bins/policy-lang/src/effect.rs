//! What one change of a policy does to containment: weakens, tightens or neutral
//! (`cordon-policy diff`'s classification; the table in `policy/README.md` is this module's
//! rules in prose, and a test holds the two together).
//!
//! A rule matches a change by its place in the canonical form (the keys from the root, as the
//! diff walks them) and compares the two sides. Every change no rule claims is classified
//! **weakens** ("unclassified"): a reviewer's tool that cannot show a change is harmless must
//! not call it harmless, so `--fail-on weaken` stops on it. It is pure and knows nothing of
//! files or lines ([`crate::diff`] places each change on its side's source).

use serde_json::Value;

use crate::diff::NAMED_MAPS;

/// What a change does to containment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// A candidate may do more, reach more or be judged more leniently (or the change could
    /// not be shown otherwise).
    Weakens,
    /// A candidate may do less, reach less or is judged more strictly.
    Tightens,
    /// Words, names and places: nothing a candidate can do or reach changes.
    Neutral,
}

impl Effect {
    /// The word a diff line starts with.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Weakens => "weakens",
            Self::Tightens => "tightens",
            Self::Neutral => "neutral",
        }
    }
}

/// A change's effect and the rule (one phrase, the README table's row) that decided it.
pub type Classified = (Effect, &'static str);

/// Maps whose added entries give a candidate more (an allowed syscall, a capability, a host
/// the transport may reach, a device, a read path, a secret, an accepted vulnerability, a JIT
/// carve-out): an entry added weakens, one removed tightens.
const GRANTS: &[&str] = &[
    "capability",
    "gpu_device",
    "allow_host",
    "accept_vulnerable",
    "jit_entry_point",
    "read",
    "secret",
    "architectures",
    "pass_env",
    "agent_env",
    "domain",
];

/// Sets whose members take something away (a banned call or import, a path never mounted, an
/// excluded archive member, a denied variable or file): a member added tightens, one removed
/// weakens.
const DENIALS: &[&str] = &[
    "never_mount",
    "ban_call",
    "ban_import",
    "ban_attribute_call",
    "exclude",
    "deny_env",
    "deny_file",
];

/// Numbers where more is stricter (the host's reserve, the referee's thresholds and sample
/// counts).
const MORE_IS_STRICTER: &[&str] = &[
    "memory_reserve_bytes",
    "min_exact_bp",
    "min_prefix_bp",
    "min_margin_bp",
    "min_timed_windows",
    "requests",
    "noise_multiplier_bp",
];

/// Top-level sections whose numbers are bounds on a candidate (more is weaker).
const BOUNDED: &[&str] = &["stage", "surface", "intake", "tree", "speed"];

/// Strings that only name, place or explain: changing them changes no containment.
const WORDS: &[&str] = &["reason", "name", "version"];

/// Top-level places that say where, not what (the store, run and models roots; the physical
/// lanes' CPU sets and shares and the per-run id ranges are matched by their fields).
const PLACES: &[&str] = &["store", "run_dir", "models"];

/// Maps whose entries are only a reason (`never-mount "/root" reason=…`): a change of the
/// entry's value is a change of words.
const REASONED: &[&str] = &["never_mount", "accept_vulnerable"];

/// Seccomp actions, strictest first: from `log` on, the call runs.
const ACTIONS: &[&str] = &[
    "kill-process",
    "kill-thread",
    "trap",
    "errno",
    "log",
    "allow",
];

/// Closed vocabularies in order, strictest first: moving right weakens.
const ORDERS: &[(&str, &[&str])] = &[
    ("network", &["none", "egress"]),
    ("root", &["empty", "read-only", "overlay"]),
    ("ipc", &["none", "private"]),
    ("sys", &["none", "read-only"]),
    ("user", &["per-run", "service"]),
    ("mode", &["ro", "rw"]),
    ("min_tls", &["1.3", "1.2"]),
    // A seccomp action: what an unlisted or a listed call meets.
    ("default_action", ACTIONS),
    ("action", ACTIONS),
    // The host's side-channel posture: a feature left on is weaker.
    ("state", &["off", "on"]),
    (
        "shell",
        &["/usr/sbin/nologin", "/sbin/nologin", "/bin/false"],
    ),
];

/// Booleans where `true` is weaker (a loopback transport, plain http, an executable /tmp, a
/// build tier admitted); `no_new_privileges` is the one where `false` is.
fn bool_effect(key: &str, old: bool, new: bool) -> Classified {
    let weaker_when_true = key != "no_new_privileges";
    match (old == new, new == weaker_when_true) {
        (true, _) => (Effect::Neutral, "unchanged"),
        (false, true) => (Effect::Weakens, "a switch that allows more turned on"),
        (false, false) => (Effect::Tightens, "a switch that allows more turned off"),
    }
}

fn rank(order: &[&str], v: &Value) -> Option<usize> {
    let s = v.as_str()?;
    // `errno:1` ranks as `errno`.
    let s = s.split(':').next().unwrap_or(s);
    order.iter().position(|o| *o == s)
}

/// The effect of the change at `path` (canonical keys from the root; for a set member or a map
/// entry, the set's or map's key last) from `old` to `new` (`None`: absent on that side), with
/// the two whole canonical forms when known (`roots`: a syscall rule is weighed against its
/// profile's default action on each side).
#[must_use]
pub fn classify(
    path: &[String],
    old: Option<&Value>,
    new: Option<&Value>,
    roots: Option<(&Value, &Value)>,
) -> Classified {
    let n = path.len();
    // A key is a field of the language, not the name of an entry a policy chose (a step
    // named `exclude`, an image role named `mode`), unless the key before it is a field that
    // names a map: only fields decide a rule.
    let mut fields = Vec::with_capacity(n);
    for i in 0..n {
        let entry = i > 0 && fields[i - 1] && NAMED_MAPS.contains(&path[i - 1].as_str());
        fields.push(!entry);
    }
    let field = |i: usize| fields[i];
    let at = |i: usize| path.get(i).map_or("", String::as_str);
    let key = if n > 0 && field(n - 1) { at(n - 1) } else { "" };
    let parent = if n > 1 && field(n - 2) { at(n - 2) } else { "" };
    let top = at(0);
    let has = |k: &str| (0..n).any(|i| path[i] == k && field(i));

    if WORDS.contains(&key) || top == "policy" {
        return (Effect::Neutral, "words: a reason, a name");
    }
    if PLACES.contains(&top)
        || key == "state_dir"
        || (top == "accounts" && (key == "first" || key == "last"))
        || (top == "physical_lane" && (key == "cpuset" || key == "cpu_shares"))
    {
        return (Effect::Neutral, "a place: where, not what");
    }
    // The runtime's pin: a binary pinned by its digest cannot be swapped unseen.
    if top == "runtime" && key == "sha256" {
        return match (old, new) {
            (None, Some(_)) => (Effect::Tightens, "a pin added"),
            (Some(_), None) => (Effect::Weakens, "a pin removed"),
            _ => (Effect::Weakens, "unclassified: treated as weakening"),
        };
    }
    // A syscall rule: its action against the profile's default decides.
    if parent == "syscall" {
        let default = |root: &Value| {
            path[..n - 2]
                .iter()
                .try_fold(root, |v, k| v.get(k))
                .and_then(|profile| profile.get("default_action"))
                .cloned()
        };
        let defaults = roots.map(|(a, b)| (default(a), default(b)));
        return syscall_entry(old, new, defaults);
    }
    // A named entry added or removed (the map's or set's key is the parent or, for a set
    // member, the key itself): the grant maps and the denial sets.
    let within = |keys: &[&str]| keys.contains(&parent) || keys.contains(&key);
    let reason_only = matches!((old, new), (Some(Value::String(_)), Some(Value::String(_))))
        && REASONED.contains(&parent);
    if reason_only {
        return (Effect::Neutral, "words: a reason, a name");
    }
    if within(GRANTS) {
        return match (old, new) {
            (None, Some(_)) => (Effect::Weakens, "a grant added"),
            (Some(_), None) => (Effect::Tightens, "a grant removed"),
            _ => (Effect::Weakens, "a grant changed: unclassified"),
        };
    }
    if within(DENIALS) {
        return match (old, new) {
            (None, Some(_)) => (Effect::Tightens, "a denial added"),
            (Some(_), None) => (Effect::Weakens, "a denial removed"),
            _ => (Effect::Weakens, "a denial changed: unclassified"),
        };
    }
    if key == "args" && n > 2 && at(n - 3) == "syscall" {
        return args_effect(old, new);
    }
    if let Some((_, order)) = ORDERS.iter().find(|(k, _)| *k == key)
        && let (Some(a), Some(b)) = (
            old.and_then(|v| rank(order, v)),
            new.and_then(|v| rank(order, v)),
        )
    {
        return match a.cmp(&b) {
            std::cmp::Ordering::Less => (Effect::Weakens, "a setting moved toward the looser end"),
            std::cmp::Ordering::Greater => {
                (Effect::Tightens, "a setting moved toward the stricter end")
            }
            std::cmp::Ordering::Equal => (Effect::Neutral, "the same setting"),
        };
    }
    match (old, new) {
        (Some(Value::Bool(a)), Some(Value::Bool(b))) if !key.is_empty() => {
            return bool_effect(key, *a, *b);
        }
        (Some(a), Some(b)) if a.is_u64() && b.is_u64() && !key.is_empty() => {
            return number_effect(top, key, path, a.as_u64(), b.as_u64());
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if key == "min_version" => {
            let version = |v: &[Value]| v.iter().map(Value::as_u64).collect::<Vec<_>>();
            return if version(b) > version(a) {
                (Effect::Tightens, "a newer minimum runtime")
            } else {
                (Effect::Weakens, "an older minimum runtime")
            };
        }
        // A mount, a stage, a step, a variable, a profile: added grants more, removed less.
        (None, Some(_)) if matches!(top, "stage" | "step") && has("mount") => {
            return (Effect::Weakens, "a mount added");
        }
        (Some(_), None) if matches!(top, "stage" | "step") && has("mount") => {
            return (Effect::Tightens, "a mount removed");
        }
        _ => {}
    }
    (Effect::Weakens, "unclassified: treated as weakening")
}

/// An added or removed syscall rule, or its action changed: weighed against what the call
/// meets without the rule, the profile's default action on that side (`defaults`: old, new),
/// when known; else a rule that lets the call run weakens when added.
fn syscall_entry(
    old: Option<&Value>,
    new: Option<&Value>,
    defaults: Option<(Option<Value>, Option<Value>)>,
) -> Classified {
    let action = |v: Option<&Value>| rank(ACTIONS, v?.get("action")?);
    let (old_default, new_default) = defaults.map_or((None, None), |(a, b)| {
        (
            a.as_ref().and_then(|v| rank(ACTIONS, v)),
            b.as_ref().and_then(|v| rank(ACTIONS, v)),
        )
    });
    // From `log` on, the call runs.
    let runs = |a: usize| a >= ACTIONS.len() - 2;
    let versus = |looser: bool, stricter: bool, (weaker, tighter): (Classified, Classified)| {
        if looser {
            weaker
        } else if stricter {
            tighter
        } else {
            (Effect::Neutral, "the same setting")
        }
    };
    match (action(old), action(new)) {
        // A rule added: the call meets its action instead of the profile's default.
        (None, Some(a)) => match new_default {
            Some(d) => versus(
                a > d,
                a < d,
                (
                    (
                        Effect::Weakens,
                        "a syscall rule looser than its profile's default",
                    ),
                    (
                        Effect::Tightens,
                        "a syscall rule stricter than its profile's default",
                    ),
                ),
            ),
            None if runs(a) => (Effect::Weakens, "a syscall allowed (or logged)"),
            None => (Effect::Tightens, "a syscall denied by name"),
        },
        // A rule removed: the call meets the profile's default instead of the rule.
        (Some(a), None) => match new_default.or(old_default) {
            Some(d) => versus(
                d > a,
                d < a,
                (
                    (
                        Effect::Weakens,
                        "a syscall rule removed for a looser default",
                    ),
                    (
                        Effect::Tightens,
                        "a syscall rule removed for a stricter default",
                    ),
                ),
            ),
            None if runs(a) => (Effect::Tightens, "an allowed syscall removed"),
            None => (Effect::Weakens, "a syscall's denial removed"),
        },
        (Some(a), Some(b)) if b > a => (Effect::Weakens, "a syscall's action loosened"),
        (Some(a), Some(b)) if b < a => (Effect::Tightens, "a syscall's action tightened"),
        _ => (Effect::Weakens, "unclassified: treated as weakening"),
    }
}

/// An allowed syscall's argument conditions: conditions dropped admit more calls.
fn args_effect(old: Option<&Value>, new: Option<&Value>) -> Classified {
    let len = |v: Option<&Value>| v.and_then(Value::as_array).map_or(0, Vec::len);
    match (len(old), len(new)) {
        (a, 0) if a > 0 => (Effect::Weakens, "a syscall's argument conditions dropped"),
        (0, b) if b > 0 => (Effect::Tightens, "argument conditions added to a syscall"),
        _ => (Effect::Weakens, "unclassified: treated as weakening"),
    }
}

/// A number under a bounded section: more is weaker unless it is one of the thresholds where
/// more is stricter.
fn number_effect(
    top: &str,
    key: &str,
    path: &[String],
    a: Option<u64>,
    b: Option<u64>,
) -> Classified {
    let (Some(a), Some(b)) = (a, b) else {
        return (Effect::Weakens, "unclassified: treated as weakening");
    };
    let stricter_up = MORE_IS_STRICTER.contains(&key);
    if !stricter_up
        && !BOUNDED.contains(&top)
        && top != "host"
        && top != "audit"
        && top != "quality"
    {
        return (Effect::Weakens, "unclassified: treated as weakening");
    }
    // Shares and ranks say how work is split, not how much of the host it reaches.
    if key == "ranks" || path.iter().any(|p| p == "cpu_shares") {
        return (Effect::Neutral, "how work is split");
    }
    match (b > a, stricter_up) {
        (true, false) => (Effect::Weakens, "a bound raised"),
        (false, false) => (Effect::Tightens, "a bound lowered"),
        (true, true) => (Effect::Tightens, "a threshold raised"),
        (false, true) => (Effect::Weakens, "a threshold lowered"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(s: &str) -> Vec<String> {
        s.split('.').map(str::to_owned).collect()
    }

    fn e(path: &str, old: Option<Value>, new: Option<Value>) -> Effect {
        classify(&p(path), old.as_ref(), new.as_ref(), None).0
    }

    #[test]
    fn the_issues_examples_weaken_and_a_lower_pids_tightens() {
        // CAP_SYS_PTRACE granted.
        assert_eq!(
            e(
                "stage.lane.capability.CAP_SYS_PTRACE",
                None,
                Some(json!({"reason": "x"}))
            ),
            Effect::Weakens
        );
        // An executable /tmp.
        assert_eq!(
            e(
                "stage.prebuild.tmp.exec",
                Some(json!(false)),
                Some(json!(true))
            ),
            Effect::Weakens
        );
        // process_madvise allowed again.
        assert_eq!(
            e(
                "seccomp.candidate.syscall.process_madvise",
                None,
                Some(json!({"action": "allow", "args": [], "reason": "x"}))
            ),
            Effect::Weakens
        );
        // The pickle ban dropped.
        assert_eq!(
            e("tree.python.ban_import", Some(json!("pickle")), None),
            Effect::Weakens
        );
        // pids 1024 → 512.
        assert_eq!(
            e("stage.prebuild.pids", Some(json!(1024)), Some(json!(512))),
            Effect::Tightens
        );
    }

    #[test]
    fn each_direction_reverses() {
        let cases: &[(&str, Value, Value)] = &[
            ("stage.lane.memory_bytes", json!(1), json!(2)),
            ("stage.lane.network", json!("none"), json!("egress")),
            ("stage.lane.mount./engine.mode", json!("ro"), json!("rw")),
            ("stage.lane.root", json!("read-only"), json!("overlay")),
            ("stage.lane.no_new_privileges", json!(true), json!(false)),
            ("host.smt.state", json!("off"), json!("on")),
            ("host.memory_reserve_bytes", json!(3), json!(1)),
            ("quality.min_exact_bp", json!(10000), json!(9000)),
            ("intake.transport.min_tls", json!("1.3"), json!("1.2")),
            (
                "seccomp.candidate.default_action",
                json!("kill-process"),
                json!("errno:1"),
            ),
            ("runtime.min_version", json!([1, 2, 0]), json!([1, 1, 5])),
            ("intake.transport.allow_loopback", json!(false), json!(true)),
        ];
        for (path, looser_from, looser_to) in cases {
            assert_eq!(
                e(path, Some(looser_from.clone()), Some(looser_to.clone())),
                Effect::Weakens,
                "{path}"
            );
            assert_eq!(
                e(path, Some(looser_to.clone()), Some(looser_from.clone())),
                Effect::Tightens,
                "{path}"
            );
        }
    }

    #[test]
    fn a_syscall_named_like_a_grant_map_is_a_syscall() {
        let read = |action: &str| Some(json!({"action": action, "args": [], "reason": "x"}));
        assert_eq!(
            e("seccomp.c.syscall.read", None, read("allow")),
            Effect::Weakens
        );
        assert_eq!(
            e("seccomp.c.syscall.read", read("allow"), None),
            Effect::Tightens
        );
        assert_eq!(
            e("seccomp.c.syscall.read", None, read("kill-process")),
            Effect::Tightens
        );
        assert_eq!(
            e(
                "seccomp.c.syscall.read.action",
                Some(json!("errno:1")),
                Some(json!("allow"))
            ),
            Effect::Weakens
        );
        assert_eq!(
            e(
                "seccomp.c.syscall.read.args",
                Some(json!([{"index": 0}])),
                Some(json!([]))
            ),
            Effect::Weakens
        );
    }

    /// An entry a policy names like a field (a step called `exclude`) is an entry, never the
    /// field: its argv is not a denial added.
    #[test]
    fn an_entry_named_like_a_field_is_classified_as_the_entry() {
        let argv = Some(json!(["/bin/sh", "-c", "x"]));
        assert_eq!(e("step.exclude.argv", None, argv.clone()), Effect::Weakens);
        assert_eq!(e("step.never_mount.argv", None, argv), Effect::Weakens);
        assert_eq!(
            e(
                "image.mode",
                Some(json!("sha256:a")),
                Some(json!("sha256:b"))
            ),
            Effect::Weakens
        );
        // A lane's GPU is no place: its configuration is not neutral.
        assert_eq!(
            e(
                "physical_lane.a.gpus.GPU-1.compute_mode",
                Some(json!("exclusive-process")),
                Some(json!("default"))
            ),
            Effect::Weakens
        );
        assert_eq!(
            e("physical_lane.a.cpuset", Some(json!("0")), Some(json!("1"))),
            Effect::Neutral
        );
    }

    /// A syscall rule is weighed against what the call meets without it: its profile's
    /// default action on that side.
    #[test]
    fn a_syscall_rule_is_weighed_against_its_profiles_default() {
        let rule = |action: &str| json!({"action": action, "args": [], "reason": "x"});
        let root =
            |default: &str| json!({"seccomp": {"p": {"default_action": default, "syscall": {}}}});
        let path = p("seccomp.p.syscall.ptrace");
        let with = |d: &str, old: Option<Value>, new: Option<Value>| {
            let (a, b) = (root(d), root(d));
            classify(&path, old.as_ref(), new.as_ref(), Some((&a, &b))).0
        };
        // Under kill-process, an errno rule lets the process live: looser.
        assert_eq!(
            with("kill-process", None, Some(rule("errno"))),
            Effect::Weakens
        );
        assert_eq!(with("errno:1", None, Some(rule("allow"))), Effect::Weakens);
        assert_eq!(
            with("errno:1", None, Some(rule("kill-process"))),
            Effect::Tightens
        );
        // Removed, the call meets the default.
        assert_eq!(
            with("kill-process", Some(rule("errno")), None),
            Effect::Tightens
        );
        assert_eq!(with("allow", Some(rule("errno")), None), Effect::Weakens);
    }

    #[test]
    fn words_and_places_are_neutral_and_the_unknown_weakens() {
        assert_eq!(
            e(
                "seccomp.candidate.syscall.read.reason",
                Some(json!("a")),
                Some(json!("b"))
            ),
            Effect::Neutral
        );
        assert_eq!(
            e("store", Some(json!("/a")), Some(json!("/b"))),
            Effect::Neutral
        );
        assert_eq!(
            e(
                "image.runtime",
                Some(json!("sha256:a")),
                Some(json!("sha256:b"))
            ),
            Effect::Weakens
        );
        assert_eq!(
            e("stage.lane.env.PYTHONSAFEPATH", Some(json!("1")), None),
            Effect::Weakens
        );
    }

    /// Every rule phrase in this file is a row of the policy README's table.
    #[test]
    fn every_rule_is_in_the_readme_table() {
        let code = include_str!("effect.rs");
        let readme = include_str!("../../../policy/README.md");
        let mut rules = 0;
        for part in code.split("(Effect::").skip(1) {
            let Some(rest) = part.split_once(',').map(|(_, r)| r.trim_start()) else {
                continue;
            };
            let Some(rule) = rest
                .strip_prefix('"')
                .and_then(|r| r.split_once('"'))
                .map(|(r, _)| r)
            else {
                continue;
            };
            rules += 1;
            assert!(readme.contains(&format!("`{rule}`")), "{rule}");
        }
        assert!(rules > 20, "{rules}");
    }
}
