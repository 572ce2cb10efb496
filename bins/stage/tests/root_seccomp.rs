//! The candidate seccomp profile, tested the way Firecracker tests its filters: the kernel's
//! verdict on **every** x86_64 system call, every argument condition at its boundaries, the
//! numbers past the table, the x32 and the i386 ABI — from two independent compilers of the
//! profile the planner wrote into a real bundle, each compared with the policy's own rule:
//! - runc (through libseccomp), inside a real prebuild session of the shipped policy;
//! - seccompiler (Firecracker's compiler), installed on a child of this test.
//!
//! Nothing probed runs: testkit's `verdict` program stacks a filter that turns every call the
//! profile admits into a user notification its other thread answers with errno 4000 (see
//! `probes/verdict.c`), so a refused call gets the profile's answer and an admitted one 4000.
//! The expected verdict comes from the policy's typed rule set ([`expected`]), not from either
//! compiler, so a planner that drops a condition, a runtime that compiles one otherwise, or a
//! number table that names the wrong call each make the test fail and say which call differs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cordon::host::fake::Interposed;
use cordon_policy_lang::{Arch, ArgCondition, ArgOp, SeccompAction, SeccompProfile, syscalls};
use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator};
use serde_json::Value;

/// What the verdict program's own filter answers a call the profile under test admits.
const ADMITTED: i64 = 4000;
/// A verdict that is no errno: the filter killed the thread that made the call.
const KILLED: i64 = -1;
/// runc's answer to a call newer than its libseccomp.
const ENOSYS: i64 = 38;
/// The bit that makes a syscall number an x32 one.
const X32: u64 = 0x4000_0000;
/// The high half of a 64-bit register, which the kernel ignores for a 32-bit argument.
const HIGH: u64 = 0xffff_ffff_0000_0000;
/// `uretprobe` (335) and `uprobe` (336): since Linux 6.13 the kernel passes these native calls
/// through without consulting any seccomp filter (a filter that refused them broke uprobes in
/// containers); outside the kernel's own trampoline they only raise SIGILL. Not probed: no
/// filter can answer them, and the probe would die of the SIGILL.
const UNFILTERED: [u64; 2] = [335, 336];

/// One probed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    i386: bool,
    nr: u64,
    args: [u64; 6],
}

impl Call {
    fn line(&self) -> String {
        let abi = if self.i386 { "i386" } else { "x64" };
        let args: Vec<String> = self.args.iter().map(|a| format!("{a:#x}")).collect();
        format!("{abi} {} {}", self.nr, args.join(" "))
    }
}

/// What the profile says a call gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// It runs.
    Admitted,
    /// A rule answers it with this errno.
    Errno(u32),
    /// No rule admits it: the profile's default answers, this errno. runc answers ENOSYS
    /// instead for numbers past the last its libseccomp can name (its stub, so that libc falls
    /// back to an older call), which is still a refusal; [`stub_boundary`] checks its shape.
    Default(u32),
    /// Any refusal: a number the table does not know (the profile's default, or runc's ENOSYS
    /// for numbers past the last one it names, which lets libc fall back) or a foreign ABI.
    Refused,
}

fn names_by_number() -> BTreeMap<u64, &'static str> {
    syscalls::X86_64
        .iter()
        .map(|n| (u64::from(syscalls::number(n).unwrap()), *n))
        .collect()
}

/// Whether `c` holds for `args`, as the policy defines it: a 32-bit argument is compared in the
/// low half the kernel reads.
fn holds(c: &ArgCondition, args: &[u64; 6]) -> bool {
    let a = args[usize::try_from(c.index).unwrap()];
    let a = if c.bits == 32 {
        a & u64::from(u32::MAX)
    } else {
        a
    };
    let v = c.values[0];
    match c.op {
        ArgOp::Eq => a == v,
        ArgOp::OneOf => c.values.contains(&a),
        ArgOp::MaskedEq => a & c.mask.unwrap() == v,
        ArgOp::Ne => a != v,
        ArgOp::Lt => a < v,
        ArgOp::Le => a <= v,
        ArgOp::Gt => a > v,
        ArgOp::Ge => a >= v,
    }
}

/// The policy's verdict on `call` (the model both compilers are held to).
fn expected(profile: &SeccompProfile, names: &BTreeMap<u64, &str>, call: &Call) -> Expect {
    assert_eq!(
        profile.architectures,
        BTreeSet::from([Arch::X86_64]),
        "this test models an x86_64-only profile"
    );
    if call.i386 || call.nr & X32 != 0 {
        return Expect::Refused;
    }
    let Some(name) = names.get(&call.nr) else {
        return Expect::Refused;
    };
    let (action, by_rule) = match profile.syscall.get(*name) {
        Some(rule) if rule.args.iter().all(|c| holds(c, &call.args)) => (rule.action, true),
        _ => (profile.default_action, false),
    };
    match (action, by_rule) {
        (SeccompAction::Allow, _) => Expect::Admitted,
        (SeccompAction::Errno(n), true) => Expect::Errno(n),
        (SeccompAction::Errno(n), false) => Expect::Default(n),
        (other, _) => panic!("this test models allow and errno, not {other}"),
    }
}

/// Values of a condition's argument at and around each boundary it draws.
fn boundaries(c: &ArgCondition) -> BTreeSet<u64> {
    let width = if c.bits == 32 {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    };
    let mut out = BTreeSet::from([0, 1, width, u64::MAX, 1 << 32]);
    for v in &c.values {
        out.extend([
            v.wrapping_sub(1),
            *v,
            v.wrapping_add(1),
            v | 1 << 32,
            v | HIGH,
        ]);
    }
    if let Some(mask) = c.mask {
        for bit in 0..64 {
            out.extend([1 << bit, (1 << bit) | c.values[0]]);
        }
        out.extend([mask, !mask, mask | c.values[0]]);
    }
    out
}

/// A value of `c`'s argument that satisfies it, to hold a rule's other conditions true while
/// one is probed.
fn passing(c: &ArgCondition) -> u64 {
    let v = c.values[0];
    let candidates = [v, v.wrapping_add(1), v.wrapping_sub(1), 0];
    let mut args = [0; 6];
    let i = usize::try_from(c.index).unwrap();
    for x in candidates {
        args[i] = x;
        if holds(c, &args) {
            return x;
        }
    }
    panic!("no value satisfies {c:?}");
}

/// Every call the test probes: each number of the table with no arguments and with every bit
/// set, each condition's boundaries (its rule's other conditions held true), each number as an
/// x32 call, the unassigned numbers in and past the table, and `getpid` through int 0x80.
fn calls(profile: &SeccompProfile) -> (Vec<Call>, Call) {
    let mut calls = BTreeSet::new();
    let x64 = |nr: u64, args| Call {
        i386: false,
        nr,
        args,
    };
    for name in syscalls::X86_64 {
        let nr = u64::from(syscalls::number(name).unwrap());
        calls.insert(x64(nr | X32, [0; 6]));
        if UNFILTERED.contains(&nr) {
            continue;
        }
        calls.extend([x64(nr, [0; 6]), x64(nr, [u64::MAX; 6])]);
        let Some(rule) = profile.syscall.get(*name) else {
            continue;
        };
        let mut base = [0; 6];
        for c in &rule.args {
            base[usize::try_from(c.index).unwrap()] = passing(c);
        }
        for c in &rule.args {
            for v in boundaries(c) {
                let mut args = base;
                args[usize::try_from(c.index).unwrap()] = v;
                calls.insert(x64(nr, args));
            }
        }
    }
    let known: BTreeSet<u64> = names_by_number().into_keys().collect();
    let last = *known.last().unwrap();
    for nr in (0..last + 64).filter(|n| !known.contains(n) && !UNFILTERED.contains(n)) {
        calls.insert(x64(nr, [0; 6]));
    }
    // getpid is 20 on i386 (and 39 on x86_64): the architecture check, not a rule, must stop it.
    let i386 = Call {
        i386: true,
        nr: 20,
        args: [0; 6],
    };
    (calls.into_iter().collect(), i386)
}

/// Parse the verdict program's output: the errno of each call, in order.
fn verdicts(out: &str, calls: &[Call]) -> Vec<i64> {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        calls.len(),
        "the verdict program answered {} of {} calls:\n{out}",
        lines.len(),
        calls.len()
    );
    lines
        .iter()
        .zip(calls)
        .map(|(line, call)| {
            let (head, errno) = line.rsplit_once(" = ").unwrap();
            assert_eq!(head, call.line(), "the verdicts are out of order");
            if errno == "killed" {
                KILLED
            } else {
                errno.parse().unwrap()
            }
        })
        .collect()
}

/// Each call whose kernel verdict under `compiler` differs from the policy's.
fn disagreements(
    compiler: &str,
    profile: &SeccompProfile,
    calls: &[Call],
    got: &[i64],
) -> Vec<String> {
    let names = names_by_number();
    calls
        .iter()
        .zip(got)
        .filter_map(|(call, errno)| {
            let want = expected(profile, &names, call);
            let agrees = match want {
                Expect::Admitted => *errno == ADMITTED,
                Expect::Errno(n) => *errno == i64::from(n),
                Expect::Default(n) if compiler == "runc" => {
                    *errno == i64::from(n) || *errno == ENOSYS
                }
                Expect::Default(n) => *errno == i64::from(n),
                Expect::Refused => *errno != ADMITTED,
            };
            (!agrees).then(|| {
                let name = names.get(&(call.nr & !X32)).copied().unwrap_or("?");
                let got = if *errno == KILLED {
                    "killed the thread".to_owned()
                } else {
                    format!("answered errno {errno}")
                };
                format!(
                    "{compiler}: {} ({name}): the policy says {want:?}, the kernel {got}",
                    call.line()
                )
            })
        })
        .collect()
}

/// Where runc's ENOSYS stub begins: every x86_64 call the policy refuses by default is
/// answered with the default errno below it and ENOSYS from it on, or the stub is not what the
/// test allows for. `None`: no call was stubbed.
fn stub_boundary(profile: &SeccompProfile, calls: &[Call], got: &[i64]) -> Option<u64> {
    let names = names_by_number();
    let refused: Vec<(u64, i64)> = calls
        .iter()
        .zip(got)
        .filter(|(c, _)| matches!(expected(profile, &names, c), Expect::Default(_)))
        .map(|(c, e)| (c.nr, *e))
        .collect();
    let first = refused
        .iter()
        .filter(|(_, e)| *e == ENOSYS)
        .map(|(n, _)| *n)
        .min()?;
    let late = refused
        .iter()
        .filter(|(n, e)| *n > first && *e != ENOSYS)
        .collect::<Vec<_>>();
    assert!(
        late.is_empty(),
        "runc answers ENOSYS from call {first} on, but not for {late:?}: not its stub"
    );
    Some(first)
}

/// seccompiler's form of the OCI profile the runtime was given: one filter for the admitted
/// calls (its mismatch the profile's default), then one per other action, which the kernel
/// prefers because a later filter wins a tie between two errno answers.
fn seccompiler_filters(oci: &LinuxSeccomp) -> Vec<seccompiler::BpfProgram> {
    use seccompiler::{
        SeccompAction as Act, SeccompCmpArgLen, SeccompCmpOp as Op, SeccompCondition,
        SeccompFilter, SeccompRule, TargetArch,
    };
    let action = |a: LinuxSeccompAction, errno: Option<u32>| match a {
        LinuxSeccompAction::ScmpActAllow => Act::Allow,
        LinuxSeccompAction::ScmpActErrno => Act::Errno(errno.unwrap_or(libc_eperm())),
        other => panic!("this test compiles allow and errno, not {other:?}"),
    };
    // Per action: syscall number → its rules (empty: unconditional).
    let mut groups: BTreeMap<String, (Act, BTreeMap<i64, Vec<SeccompRule>>)> = BTreeMap::new();
    for entry in oci.syscalls().as_deref().unwrap_or_default() {
        let act = action(entry.action(), entry.errno_ret());
        let conditions: Vec<SeccompCondition> = entry
            .args()
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|a| {
                let op = match a.op() {
                    LinuxSeccompOperator::ScmpCmpEq => Op::Eq,
                    LinuxSeccompOperator::ScmpCmpNe => Op::Ne,
                    LinuxSeccompOperator::ScmpCmpLt => Op::Lt,
                    LinuxSeccompOperator::ScmpCmpLe => Op::Le,
                    LinuxSeccompOperator::ScmpCmpGt => Op::Gt,
                    LinuxSeccompOperator::ScmpCmpGe => Op::Ge,
                    LinuxSeccompOperator::ScmpCmpMaskedEq => Op::MaskedEq(a.value()),
                };
                // The OCI form of masked-eq: value is the mask, valueTwo the compared value.
                let value = match a.op() {
                    LinuxSeccompOperator::ScmpCmpMaskedEq => a.value_two().unwrap(),
                    _ => a.value(),
                };
                let index = u8::try_from(a.index()).unwrap();
                SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value).unwrap()
            })
            .collect();
        let group = groups
            .entry(format!("{act:?}"))
            .or_insert_with(|| (act.clone(), BTreeMap::new()));
        for name in entry.names() {
            let nr = i64::from(syscalls::number(name).unwrap_or_else(|| panic!("{name}?")));
            let rules = group.1.entry(nr).or_default();
            if !conditions.is_empty() {
                rules.push(SeccompRule::new(conditions.clone()).unwrap());
            }
        }
    }
    let default = action(oci.default_action(), oci.default_errno_ret());
    let arch = TargetArch::x86_64;
    let compile = |f: SeccompFilter| -> seccompiler::BpfProgram { f.try_into().unwrap() };
    let allowed = groups
        .remove(&format!("{:?}", Act::Allow))
        .map(|(_, rules)| rules)
        .unwrap_or_default();
    let mut programs = vec![compile(
        SeccompFilter::new(allowed, default, Act::Allow, arch).unwrap(),
    )];
    for (_, (act, rules)) in groups {
        programs.push(compile(
            SeccompFilter::new(rules, Act::Allow, act, arch).unwrap(),
        ));
    }
    programs
}

/// EPERM, the errno runc answers when an errno action names none.
fn libc_eperm() -> u32 {
    u32::try_from(nix::libc::EPERM).unwrap()
}

/// The first argument that makes this test binary its own child: `--under-seccompiler
/// FILTERS PROGRAM FILE` installs the filters written to FILTERS and becomes `PROGRAM FILE`.
const UNDER_SECCOMPILER: &str = "--under-seccompiler";

/// The filters as text, one instruction per line (`code jt jf k`), a blank line after each.
fn write_filters(path: &Path, filters: &[seccompiler::BpfProgram]) {
    let mut text = String::new();
    for f in filters {
        for i in f {
            text += &format!("{} {} {} {}\n", i.code, i.jt, i.jf, i.k);
        }
        text += "\n";
    }
    std::fs::write(path, text).unwrap();
}

/// The child's side: install the filters of `path` on this process (seccompiler sets
/// no-new-privileges first, so no privilege is needed) and exec the verdict program, which
/// inherits them.
fn become_verdict(args: &[String]) -> ! {
    let [filters, program, file] = args else {
        panic!("{UNDER_SECCOMPILER} FILTERS PROGRAM FILE, not {args:?}");
    };
    let text = std::fs::read_to_string(filters).unwrap();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let program: seccompiler::BpfProgram = block
            .lines()
            .map(|l| {
                let f: Vec<u32> = l.split(' ').map(|n| n.parse().unwrap()).collect();
                seccompiler::sock_filter {
                    code: u16::try_from(f[0]).unwrap(),
                    jt: u8::try_from(f[1]).unwrap(),
                    jf: u8::try_from(f[2]).unwrap(),
                    k: f[3],
                }
            })
            .collect();
        seccompiler::apply_filter(&program).unwrap();
    }
    let err = std::process::Command::new(program).arg(file).exec();
    panic!("cannot exec {program}: {err}");
}

/// Run the verdict program on `file` under the filters written to `filters`: its stdout, and
/// whether a filter killed it.
fn under_seccompiler(program: &Path, file: &Path, filters: &Path) -> (String, bool) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg(UNDER_SECCOMPILER)
        .args([filters, program, file])
        .output()
        .unwrap();
    let killed = out.status.signal() == Some(nix::libc::SIGSYS);
    assert!(
        out.status.success() || killed,
        "the verdict program failed under seccompiler ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (String::from_utf8(out.stdout).unwrap(), killed)
}

fn every_call_gets_the_policys_verdict_from_runc_and_from_seccompiler() {
    let w = common::world();
    let policy = common::policy(&w, "stage-seccomp", 0);
    let kind = cordon_policy_lang::StageKind::Prebuild;
    let profile = policy
        .seccomp_profile(&policy.stage(kind).unwrap().seccomp)
        .unwrap()
        .clone();
    let (calls, i386) = calls(&profile);
    let lines: String = calls.iter().map(|c| c.line() + "\n").collect();
    std::fs::write(w.tree.join("calls.txt"), lines).unwrap();
    std::fs::write(w.tree.join("i386.txt"), i386.line() + "\n").unwrap();

    // runc: a real prebuild session; the bundle's profile is kept as runc was given it.
    let planned: Arc<Mutex<Option<Value>>> = Arc::default();
    let keep = planned.clone();
    let host = Interposed::new().rewriting_spawns(move |tool| {
        if let Some(i) = tool.args.iter().position(|a| a == "--bundle") {
            let config = Path::new(&tool.args[i + 1]).join("config.json");
            let config: Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
            *keep.lock().unwrap() = Some(config["linux"]["seccomp"].clone());
        }
        tool.clone()
    });
    let setup = common::setup(&w, &policy, "seccomp-0", Arc::new(host));
    let out = common::run(
        &w,
        &policy,
        &setup,
        &format!(
            "{v} /engine/calls.txt; echo \"exit=$?\"; {v} /engine/i386.txt; echo \"i386=$?\"",
            v = common::VERDICT
        ),
    )
    .unwrap();
    assert!(common::left(&w, &setup).is_empty(), "not quiescent");
    let (table, tail) = out
        .rsplit_once("exit=0\n")
        .unwrap_or_else(|| panic!("the verdict program failed in the container:\n{out}"));
    let runc = verdicts(table, &calls);
    // The i386 call: refused by the runtime's architecture check, with an errno or a kill of
    // the thread or (SIGSYS, the shell's 159) the process; never admitted.
    assert!(
        tail.ends_with("i386=159\n")
            || (tail.ends_with("i386=0\n")
                && tail.starts_with(&format!("{} = ", i386.line()))
                && !tail.starts_with(&format!("{} = {ADMITTED}\n", i386.line()))),
        "an i386 call under runc: {tail}"
    );

    // seccompiler: the same OCI profile, compiled by Firecracker's compiler, on a child here.
    let oci: LinuxSeccomp =
        serde_json::from_value(planned.lock().unwrap().clone().expect("no bundle planned"))
            .unwrap();
    let filters = w.dir.path().join("filters");
    write_filters(&filters, &seccompiler_filters(&oci));
    let program = w.dir.path().join("verdict");
    let (table, killed) = under_seccompiler(&program, &w.tree.join("calls.txt"), &filters);
    assert!(!killed, "seccompiler's filter killed an x86_64 probe");
    let ours = verdicts(&table, &calls);
    let (i386_out, i386_killed) = under_seccompiler(&program, &w.tree.join("i386.txt"), &filters);
    assert!(
        i386_killed || !i386_out.ends_with(&format!(" = {ADMITTED}\n")),
        "an i386 call under seccompiler: {i386_out}"
    );

    let stub = stub_boundary(&profile, &calls, &runc);
    let mut failures = disagreements("runc", &profile, &calls, &runc);
    failures.extend(disagreements("seccompiler", &profile, &calls, &ours));
    let admitted = ours.iter().filter(|e| **e == ADMITTED).count();
    eprintln!(
        "{} calls probed: {admitted} admitted, {} refused, under each compiler; runc's ENOSYS \
         stub from call {stub:?} on",
        calls.len(),
        calls.len() - admitted
    );
    assert!(
        failures.is_empty(),
        "{} verdicts differ from the policy's:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The compilers may differ only between two refusals: where the policy leaves the answer
    // open (unknown numbers, foreign ABIs) and at runc's stub; everywhere else they agree.
    let names = names_by_number();
    for ((call, a), b) in calls.iter().zip(&runc).zip(&ours) {
        let open = match expected(&profile, &names, call) {
            Expect::Refused => true,
            Expect::Default(_) => stub.is_some_and(|s| call.nr >= s),
            Expect::Admitted | Expect::Errno(_) => false,
        };
        if !open {
            assert_eq!(a, b, "{}: runc and seccompiler differ", call.line());
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(UNDER_SECCOMPILER) {
        become_verdict(&args[2..]);
    }
    let tests = vec![libtest_mimic::Trial::test(
        "every_call_gets_the_policys_verdict_from_runc_and_from_seccompiler",
        || {
            every_call_gets_the_policys_verdict_from_runc_and_from_seccompiler();
            Ok(())
        },
    )];
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), tests).exit();
}
