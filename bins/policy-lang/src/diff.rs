//! The reviewer's views of a policy: a semantic diff of two policies, and the flattened
//! settings of one part of a policy (`explain`).
//!
//! Both walk the canonical form leaf by leaf and print each leaf in dotted form, in the policy
//! language's own spelling (`max-redirects`, not `max_redirects`) and units (`4 GiB`, `90s`).
//! An added or removed allow-list entry is one line naming the entry and its reason, for
//! example `seccomp.default: + allow ptrace (reason "…")`.

use serde_json::Value;

use crate::effect::{Effect, classify};
use crate::units::{format_duration, format_millis, format_size};

/// Maps whose keys are names from the policy (kept as written), not field names.
pub(crate) const NAMED_MAPS: &[&str] = &[
    "secret",
    "image",
    "seccomp",
    "stage",
    "step",
    "syscall",
    "capability",
    "allow_host",
    "jit_entry_point",
    "phase_deadline_ms",
    "gpu_device",
    "env",
    "mount",
    "read",
    "never_mount",
    "accept_vulnerable",
];

/// Arrays that are sets: diffed member by member.
const SETS: &[&str] = &[
    "exclude",
    "ban_call",
    "ban_import",
    "ban_attribute_call",
    "architectures",
    "deny_env",
    "deny_file",
];

/// How an added or removed reasoned entry of a named map is introduced.
fn noun<'a>(map: &str, entry: &'a Value) -> Option<&'a str> {
    match map {
        "syscall" => entry.get("action").and_then(Value::as_str),
        "capability" => Some("capability"),
        "allow_host" => Some("allow-host"),
        "jit_entry_point" => Some("jit-entry-point"),
        "gpu_device" => Some("device"),
        "read" => Some("read"),
        "never_mount" => Some("never-mount"),
        "accept_vulnerable" => Some("accept-vulnerable"),
        _ => None,
    }
}

/// One line of a diff, with the section it belongs to and what it does to containment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The top-level section (`stage`, `seccomp`, `intake`, …).
    pub section: String,
    /// The line, without indentation.
    pub line: String,
    /// The canonical keys from the root to what changed (for a set member or a named entry,
    /// the set or entry last): where [`crate::locate`] finds it in each file.
    pub path: Vec<String>,
    /// Whether it weakens, tightens or leaves containment as it was ([`crate::effect`]).
    pub effect: Effect,
    /// The rule that decided [`Self::effect`].
    pub rule: &'static str,
}

/// The two whole canonical forms a diff compares (what a change is weighed against).
type Roots<'a> = (&'a Value, &'a Value);

impl Change {
    fn new(
        roots: Roots<'_>,
        path: &[String],
        line: String,
        (old, new): (Option<&Value>, Option<&Value>),
    ) -> Self {
        let (effect, rule) = classify(path, old, new, Some(roots));
        Self {
            section: path.first().cloned().unwrap_or_default(),
            line,
            path: path.to_vec(),
            effect,
            rule,
        }
    }
}

/// The policy spelling of canonical key `key`: dashes, and no unit suffix the language's node
/// name leaves out (`max-*-bytes` limits carry the unit in their policy name too; elsewhere the
/// unit suffix is the canonical form's and the policy name is without it).
pub(crate) fn spelled(key: &str) -> String {
    let trimmed = if key.starts_with("max_") {
        key
    } else {
        ["_bytes", "_ms", "_milli"]
            .iter()
            .find_map(|s| key.strip_suffix(s))
            .unwrap_or(key)
    };
    trimmed.replace('_', "-")
}

#[derive(Clone)]
struct Path(Vec<String>);

impl Path {
    fn child(&self, key: &str) -> Self {
        let mut v = self.0.clone();
        v.push(key.to_owned());
        Self(v)
    }

    fn last(&self) -> &str {
        self.0.last().map_or("", String::as_str)
    }

    fn parent_key(&self) -> &str {
        self.0
            .len()
            .checked_sub(2)
            .map_or("", |i| self.0[i].as_str())
    }

    fn display(&self) -> String {
        let mut out = String::new();
        for (i, key) in self.0.iter().enumerate() {
            let under_named_map = i > 0 && NAMED_MAPS.contains(&self.0[i - 1].as_str());
            let shown = if under_named_map {
                key.clone()
            } else {
                spelled(key)
            };
            let plain = shown
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if i > 0 && plain {
                out.push('.');
            }
            if plain {
                out.push_str(&shown);
            } else {
                out.push_str(&format!("[{}]", Value::String(shown)));
            }
        }
        out
    }
}

/// A leaf value in the policy's own units.
fn render(path: &Path, value: &Value) -> String {
    let unit_key = if NAMED_MAPS.contains(&path.parent_key()) {
        path.parent_key()
    } else {
        path.last()
    };
    match value.as_u64() {
        Some(n) if unit_key.ends_with("_bytes") => format_size(n),
        Some(n) if unit_key.ends_with("_ms") => format_duration(n),
        Some(n) if unit_key.ends_with("_milli") => format_millis(n),
        _ => value.to_string(),
    }
}

/// Every leaf under `value` with its path.
fn leaves<'a>(path: &Path, value: &'a Value, out: &mut Vec<(Path, &'a Value)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(&path.child(k), v, out);
            }
        }
        _ => out.push((path.clone(), value)),
    }
}

fn reasoned_line(path: &Path, key: &str, entry: &Value, sign: char) -> Option<String> {
    let noun = noun(path.last(), entry)?;
    let reason = entry.get("reason")?.as_str()?;
    let args = entry
        .get("args")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .map(|a| format!(" if {}", Value::Array(a.clone())))
        .unwrap_or_default();
    let owner = Path(path.0[..path.0.len() - 1].to_vec());
    Some(format!(
        "{}: {sign} {noun} {key}{args} (reason {})",
        owner.display(),
        Value::String(reason.to_owned())
    ))
}

fn added_or_removed(
    roots: Roots<'_>,
    path: &Path,
    (key, value, sign): (&str, &Value, char),
    out: &mut Vec<Change>,
) {
    let sides = |v| {
        if sign == '+' {
            (None, Some(v))
        } else {
            (Some(v), None)
        }
    };
    if let Some(line) = reasoned_line(path, key, value, sign) {
        out.push(Change::new(roots, &path.child(key).0, line, sides(value)));
        return;
    }
    let mut flat = Vec::new();
    leaves(&path.child(key), value, &mut flat);
    for (p, v) in flat {
        out.push(Change::new(
            roots,
            &p.0,
            format!("{}: {sign} {}", p.display(), render(&p, v)),
            sides(v),
        ));
    }
}

fn walk(roots: Roots<'_>, path: &Path, old: &Value, new: &Value, out: &mut Vec<Change>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => walk(roots, &path.child(k), x, y, out),
                    (Some(x), None) => added_or_removed(roots, path, (k, x, '-'), out),
                    (None, Some(y)) => added_or_removed(roots, path, (k, y, '+'), out),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if SETS.contains(&path.last()) => {
            for x in a.iter().filter(|x| !b.contains(x)) {
                let line = format!("{}: - {x}", path.display());
                out.push(Change::new(roots, &path.0, line, (Some(x), None)));
            }
            for y in b.iter().filter(|y| !a.contains(y)) {
                let line = format!("{}: + {y}", path.display());
                out.push(Change::new(roots, &path.0, line, (None, Some(y))));
            }
        }
        _ if old != new => {
            let line = format!(
                "{}: {} → {}",
                path.display(),
                render(path, old),
                render(path, new)
            );
            out.push(Change::new(roots, &path.0, line, (Some(old), Some(new))));
        }
        _ => {}
    }
}

/// The semantic differences between two canonical forms, one line per changed leaf or
/// allow-list entry, grouped by section (sections in canonical order).
#[must_use]
pub fn diff(old: &Value, new: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    walk((old, new), &Path(Vec::new()), old, new, &mut out);
    out
}

/// Every leaf under `key` of a canonical form as `path = value` lines (`explain`).
#[must_use]
pub fn explain(root: &Value, keys: &[&str]) -> Vec<String> {
    let mut value = root;
    let mut path = Path(Vec::new());
    for k in keys {
        match value.get(k) {
            Some(v) => {
                value = v;
                path = path.child(k);
            }
            None => return Vec::new(),
        }
    }
    let mut flat = Vec::new();
    leaves(&path, value, &mut flat);
    flat.into_iter()
        .map(|(p, v)| format!("{} = {}", p.display(), render(&p, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn leaves_render_in_policy_units_and_spelling() {
        let old = json!({"stage": {"prebuild": {"memory_bytes": 4u64 << 30, "deadline_ms": 600_000, "cpus_milli": 1500}}});
        let new = json!({"stage": {"prebuild": {"memory_bytes": 8u64 << 30, "deadline_ms": 600_000, "cpus_milli": 2000}}});
        let lines: Vec<String> = diff(&old, &new).into_iter().map(|c| c.line).collect();
        assert_eq!(
            lines,
            [
                "stage.prebuild.cpus: 1.5 → 2",
                "stage.prebuild.memory: 4 GiB → 8 GiB"
            ]
        );
    }

    #[test]
    fn reasoned_entries_are_one_line_each() {
        let old = json!({"seccomp": {"default": {"syscall": {}}}});
        let new = json!({"seccomp": {"default": {"syscall": {"ptrace": {"action": "allow", "args": [], "reason": "debugger"}}}}});
        let lines: Vec<String> = diff(&old, &new).into_iter().map(|c| c.line).collect();
        assert_eq!(
            lines,
            [r#"seccomp.default: + allow ptrace (reason "debugger")"#]
        );
        let back: Vec<String> = diff(&new, &old).into_iter().map(|c| c.line).collect();
        assert_eq!(
            back,
            [r#"seccomp.default: - allow ptrace (reason "debugger")"#]
        );
    }

    #[test]
    fn named_keys_keep_their_spelling_and_odd_keys_are_quoted() {
        let old = json!({"stage": {"lane": {"env": {"HF_HUB_OFFLINE": "1"}, "mount": {"/engine": {"mode": "ro"}}}}});
        let new = json!({"stage": {"lane": {"env": {"HF_HUB_OFFLINE": "0"}, "mount": {"/engine": {"mode": "rw"}}}}});
        let lines: Vec<String> = diff(&old, &new).into_iter().map(|c| c.line).collect();
        assert_eq!(
            lines,
            [
                r#"stage.lane.env.HF_HUB_OFFLINE: "1" → "0""#,
                r#"stage.lane.mount["/engine"].mode: "ro" → "rw""#,
            ]
        );
    }

    #[test]
    fn sets_diff_by_member() {
        let old = json!({"intake": {"archive": {"exclude": [".git", "*.pyc"]}}});
        let new = json!({"intake": {"archive": {"exclude": [".git", "*.so"]}}});
        let lines: Vec<String> = diff(&old, &new).into_iter().map(|c| c.line).collect();
        assert_eq!(
            lines,
            [
                r#"intake.archive.exclude: - "*.pyc""#,
                r#"intake.archive.exclude: + "*.so""#
            ]
        );
    }

    #[test]
    fn identical_forms_have_no_diff() {
        let v = json!({"a": {"b": [1, 2]}});
        assert!(diff(&v, &v).is_empty());
    }
}
