//! `seccomp` profiles: actions, syscall names and argument conditions, over the baseline.

use super::*;

pub(super) const ACTIONS: &[&str] = &[
    "allow",
    "errno",
    "kill-process",
    "kill-thread",
    "trap",
    "log",
];

/// An action and its `errno=` property.
pub(super) fn action(cx: &mut Cx, node: &KdlNode, entry: &KdlEntry) -> Option<SeccompAction> {
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

pub(super) fn syscall_name(cx: &mut Cx, entry: &KdlEntry) -> Option<String> {
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
pub(super) const MAX_ALTERNATIVES: usize = 64;

/// One `arg` condition of a rule on `syscall`, whose arguments have `widths`.
pub(super) fn arg_condition(
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

pub(super) fn seccomp(cx: &mut Cx, node: &KdlNode) -> Option<SeccompProfile> {
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
