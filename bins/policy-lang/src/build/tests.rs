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
    assert_eq!((lane.ipc, lane.shm_bytes), (Ipc::Private, Some(4 << 30)));
    assert!(
        lane.gpu_device.is_empty(),
        "gpu \"none\" until part 2's CDI devices"
    );
    let reference = p.stage(StageKind::Reference).unwrap();
    assert!(
        reference.gpu_device.is_empty(),
        "gpu \"none\" like the lane's"
    );
    assert!(p.pristine_pin().is_some());
    assert_eq!(
        p.steps_of(StageKind::Reference).collect::<Vec<_>>(),
        ["serve-reference"]
    );
    let gpus = crate::parse(
        "p.kdl",
        &cordon_testkit::with_reference_gpus(&default_policy()),
    )
    .unwrap();
    assert_eq!(
        gpus.stage(StageKind::Reference).unwrap().gpu_device.len(),
        3
    );
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
fn the_host_block_is_typed_its_absence_is_the_strictest_and_every_exception_has_a_reason() {
    let p = crate::parse("evaluator.kdl", &default_policy()).unwrap();
    let host = p.host();
    assert_eq!(host.memory_reserve_bytes, 3 << 30);
    assert_eq!(
        (&host.smt, &host.unprivileged_bpf),
        (&Allowance::Off, &Allowance::Off)
    );
    assert_eq!(
        host.accept_vulnerable.keys().collect::<Vec<_>>(),
        ["spec_rstack_overflow", "spec_store_bypass"]
    );
    let text = default_policy();
    let start = text.find("host {").unwrap();
    let end = start + text[start..].find("\n}\n").unwrap() + 3;
    let with = |block: &str| format!("{}{block}\n{}", &text[..start], &text[end..]);
    // Absent: a 2 GiB reserve, everything off, nothing accepted — and another authority.
    let bare = crate::parse("t.kdl", &with("")).unwrap();
    assert_eq!(
        bare.host(),
        &Host {
            memory_reserve_bytes: 2 << 30,
            hypervisor: Allowance::Off,
            smt: Allowance::Off,
            unprivileged_bpf: Allowance::Off,
            accept_vulnerable: BTreeMap::new(),
        }
    );
    assert_ne!(bare.digest().unwrap(), p.digest().unwrap());
    let on = crate::parse(
        "t.kdl",
        &with("host {\n    smt \"on\" reason=\"dedicated\"\n}"),
    )
    .unwrap();
    assert_eq!(
        on.host().smt,
        Allowance::On {
            reason: "dedicated".into()
        }
    );
    for (block, code) in [
        ("host {\n    smt \"on\"\n}", "missing-reason"),
        ("host {\n    smt \"off\" reason=\"why\"\n}", "invalid-value"),
        ("host {\n    smt \"maybe\"\n}", "invalid-value"),
        (
            "host {\n    unprivileged-bpf \"on\" reason=\"\"\n}",
            "missing-reason",
        ),
        ("host {\n    accept-vulnerable \"mds\"\n}", "missing-reason"),
        (
            "host {\n    accept-vulnerable \"Spectre V2\" reason=\"r\"\n}",
            "invalid-value",
        ),
        (
            "host {\n    accept-vulnerable \"mds\" reason=\"r\"\n    accept-vulnerable \"mds\" reason=\"s\"\n}",
            "duplicate",
        ),
        ("host {\n    memory-reserve \"1MiB\"\n}", "out-of-range"),
        ("host {\n    swap \"off\"\n}", "unknown-node"),
    ] {
        assert_eq!(codes(&with(block)), [code], "{block}");
    }
}

#[test]
fn an_overlay_root_needs_its_writable_layers_bound_and_no_other_root_takes_one() {
    let p = crate::parse("evaluator.kdl", &default_policy()).unwrap();
    let lane = p.stage(StageKind::Lane).unwrap();
    assert_eq!(
        lane.overlay,
        Some(Staging {
            size_bytes: 1 << 30,
            inodes: 100_000
        })
    );
    assert_eq!(p.stage(StageKind::Prebuild).unwrap().overlay, None);
    let text = default_policy();
    let bound = "    overlay size=\"1GiB\" inodes=100000\n";
    // Without it, an overlay root is refused (the first stage that has one names it).
    let without = text.replacen(bound, "", 1);
    assert_eq!(codes(&without), ["missing-node"]);
    // With a read-only root, a bound is refused rather than kept and ignored.
    let prebuild = text.replacen(
        "    root \"read-only\"\n",
        &format!("    root \"read-only\"\n{bound}"),
        1,
    );
    assert_eq!(codes(&prebuild), ["not-allowed-in-stage"]);
    let zero = text.replacen(bound, "    overlay size=\"1GiB\" inodes=1\n", 1);
    assert_eq!(codes(&zero), ["out-of-range"]);
}

#[test]
fn the_models_root_is_named_defaulted_and_disjoint_from_the_store_and_run_directories() {
    let text = default_policy();
    let p = crate::parse("evaluator.kdl", &text).unwrap();
    assert_eq!(p.models_root(), "/var/lib/cordon/models");
    let line = "models \"/var/lib/cordon/models\"\n";
    let without = text.replacen(line, "", 1);
    assert_eq!(
        crate::parse("t.kdl", &without).unwrap().models_root(),
        "/var/lib/cordon/models"
    );
    for inside in [
        "models \"/var/lib/cordon/store/models\"\n",
        "models \"/var/lib/cordon\"\n",
        "models \"/run/cordon/m\"\n",
    ] {
        assert_eq!(
            codes(&text.replacen(line, inside, 1)),
            ["overlap"],
            "{inside}"
        );
    }
}

#[test]
fn never_mount_paths_are_absolute_each_once_and_each_with_a_reason() {
    let text = default_policy();
    let p = crate::parse("evaluator.kdl", &text).unwrap();
    assert!(p.never_mount().any(|n| n == "/var/lib/cordon-keys"));
    let at = "models \"/var/lib/cordon/models\"\n";
    for (line, code) in [
        ("never-mount \"/srv\"\n", "missing-reason"),
        ("never-mount \"srv\" reason=\"r\"\n", "invalid-path"),
        ("never-mount \"/root\" reason=\"again\"\n", "duplicate"),
        // Beside a named root: the models root inside one, one inside the store, the run root.
        ("never-mount \"/var/lib\" reason=\"r\"\n", "overlap"),
        (
            "never-mount \"/var/lib/cordon/store/x\" reason=\"r\"\n",
            "overlap",
        ),
        ("never-mount \"/run/cordon\" reason=\"r\"\n", "overlap"),
    ] {
        assert_eq!(
            codes(&text.replacen(at, &format!("{at}{line}"), 1)),
            [code],
            "{line}"
        );
    }
}

#[test]
fn speed_and_physical_lanes_are_typed_and_every_bad_value_is_named() {
    let p = crate::parse("evaluator.kdl", &default_policy()).unwrap();
    let speed = p.speed().unwrap();
    assert_eq!((speed.min_margin_bp, speed.min_timed_windows), (500, 4));
    let lanes: Vec<(&str, Option<u64>)> = p
        .physical_lanes()
        .values()
        .map(|l| (l.cpuset.as_str(), l.cpu_shares))
        .collect();
    assert_eq!(lanes, [("0", Some(262_144)), ("1", Some(262_144))]);
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
            "\"1\" cpu-shares=262144",
            "\"1\" cpu-shares=262145",
            "out-of-range",
        ),
        (
            "\"1\" cpu-shares=262144",
            "\"1\" cpu-shares=1",
            "out-of-range",
        ),
        (
            "\"1\" cpu-shares=262144",
            "\"1\" cpu-shares=\"max\"",
            "wrong-type",
        ),
        (
            "physical-lane \"b\" cpuset=\"1\" cpu-shares=262144",
            "physical-lane \"b\" cpuset=\"1\"",
            "invalid-value",
        ),
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
        .replace_once("physical-lane \"a\" cpuset=\"0\" cpu-shares=262144\n", "")
        .replace_once("physical-lane \"b\" cpuset=\"1\" cpu-shares=262144\n", "");
    let p = crate::parse("t.kdl", &bare).unwrap();
    assert!(p.physical_lanes().is_empty());
}

#[test]
fn the_audit_is_optional_typed_and_samples_at_least_one_request() {
    let text = default_policy();
    let p = crate::parse("evaluator.kdl", &text).unwrap();
    assert_eq!(p.audit().map(|a| a.requests), Some(3));
    for (to, code) in [
        ("requests 0", "out-of-range"),
        ("requests \"3\"", "wrong-type"),
        ("", "missing-node"),
        ("requests 3\n    seed 1", "unknown-node"),
    ] {
        let edited = text.replace_once("requests 3", to);
        assert!(
            codes(&edited).contains(&code.to_owned()),
            "{to}: {:?}",
            codes(&edited)
        );
    }
    // Absent, the plan asks for no audit: a valid policy, and one of another digest.
    let start = text.find("audit {").unwrap();
    let end = start + text[start..].find('}').unwrap() + 1;
    let none = format!("{}{}", &text[..start], &text[end..]);
    let q = crate::parse("t.kdl", &none).unwrap();
    assert!(q.audit().is_none());
    assert_ne!(q.digest().unwrap(), p.digest().unwrap());
}

#[test]
fn a_required_reproduction_is_one_typed_value_and_changes_the_authority() {
    let text = default_policy();
    let p = crate::parse("evaluator.kdl", &text).unwrap();
    assert!(!p.reproduction_required());
    let required = format!("{text}\nreproduction \"required\"\n");
    let q = crate::parse("t.kdl", &required).unwrap();
    assert!(q.reproduction_required());
    assert_ne!(q.digest().unwrap(), p.digest().unwrap());
    for (node, code) in [
        ("reproduction \"optional\"", "invalid-value"),
        ("reproduction #true", "wrong-type"),
        ("reproduction", "missing-argument"),
        ("reproduction \"required\" times=2", "unknown-property"),
    ] {
        let edited = format!("{text}\n{node}\n");
        assert!(
            codes(&edited).contains(&code.to_owned()),
            "{node}: {:?}",
            codes(&edited)
        );
    }
}

#[test]
fn quality_is_typed_required_in_full_and_bounded_by_all() {
    let p = crate::parse("evaluator.kdl", &default_policy()).unwrap();
    let q = p.quality().unwrap();
    assert_eq!((q.min_exact_bp, q.min_prefix_bp), (10_000, 10_000));
    let text = default_policy();
    for (from, to, code) in [
        ("min-exact-bp 10000", "min-exact-bp 10001", "out-of-range"),
        ("min-prefix-bp 10000", "min-prefix-bp \"all\"", "wrong-type"),
        ("    min-prefix-bp 10000\n", "", "missing-node"),
        (
            "min-exact-bp 10000",
            "min-exact-bp 10000\n    max-exact-bp 1",
            "unknown-node",
        ),
    ] {
        let edited = text.replace_once(from, to);
        assert!(
            codes(&edited).contains(&code.to_owned()),
            "{from} → {to}: {:?}",
            codes(&edited)
        );
    }
    // Lowering a floor is a different policy: the digest (so the authority) moves.
    let lower = text.replace_once("min-exact-bp 10000", "min-exact-bp 9000");
    let digest = |t: &str| crate::parse("t.kdl", t).unwrap().digest().unwrap();
    assert_ne!(digest(&text), digest(&lower));
}

/// The default policy with its socket condition replaced by `conditions` on `syscall` (taken out
/// of the allow-list first).
fn with_rule(syscall: &str, conditions: &str) -> String {
    let text = default_policy();
    let text = if syscall == "socket" {
        text
    } else {
        cordon_testkit::unlisted(&text, syscall)
    };
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
        // The child's share stays inside the smallest stage the cases make.
        let text = default_policy()
            .replace_once(
                "child cpus=4 memory=\"6GiB\"",
                "child cpus=4 memory=\"64MiB\"",
            )
            .replace_once(from, to);
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
        let text =
            default_policy().replace_once("min-version=\"1.1.5\"", &format!("min-version={bad:?}"));
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

/// A GPU lane policy: each lane names one GPU with its pinned configuration, and the guard.
fn gpu_policy() -> String {
    cordon_testkit::with_gpu_lanes(&default_policy())
}

#[test]
fn gpu_lanes_pin_each_device_and_need_the_guard() {
    let text = gpu_policy();
    let p = crate::parse("t.kdl", &text).unwrap();
    let a = &p.physical_lanes()["a"];
    let config = &a.gpus["GPU-0e3f6a52-1111-4c2c-9d41-000000000001"];
    assert_eq!(config, &cordon_evidence::examples::device_config());
    let guard = p.device_guard().unwrap();
    assert_eq!(
        (
            guard.drain.samples,
            guard.drain.interval_ms,
            guard.drain.timeout_ms
        ),
        (3, 100, 2000)
    );
    assert_eq!(guard.drain.idle_memory, 600 << 20);
    assert_eq!(guard.envelope.forbidden_throttle, 0x8);
    assert_eq!(guard.envelope.max_power_mw, 700_000);
    assert_eq!(guard.cdi_hooks.len(), 1);
    // Another authority than the CPU lanes'.
    let cpu = crate::parse("t.kdl", &default_policy()).unwrap();
    assert_ne!(p.digest().unwrap(), cpu.digest().unwrap());
    let b_uuid = "GPU-0e3f6a52-1111-4c2c-9d41-000000000002";
    for (from, to, code) in [
        (
            b_uuid,
            "GPU-0e3f6a52-1111-4c2c-9d41-000000000001",
            "overlap",
        ),
        (b_uuid, "GPU-xyz", "invalid-value"),
        // NVML writes UUIDs in lower case: another case is another name.
        (
            b_uuid,
            "GPU-0E3F6A52-1111-4C2C-9D41-000000000002",
            "invalid-value",
        ),
        (
            b_uuid,
            "0e3f6a52-1111-4c2c-9d41-000000000002",
            "invalid-value",
        ),
        // The lanes' GPUs pinned unlike: one config differs.
        (
            &format!("{b_uuid}\" {{\n        driver \"550.54.15\""),
            &format!("{b_uuid}\" {{\n        driver \"560.1\""),
            "invalid-value",
        ),
        (
            "power-limit \"700W\"",
            "power-limit \"700\"",
            "invalid-value",
        ),
        ("power-limit \"700W\"", "power-limit \"0W\"", "out-of-range"),
        (
            "power-limit \"700W\"",
            "power-limit \"+700W\"",
            "invalid-value",
        ),
        ("driver \"550.54.15\"", "driver \"\"", "invalid-value"),
        ("        mig #false\n", "", "missing-node"),
        (
            "compute-mode \"exclusive-process\"",
            "compute-mode \"shared\"",
            "invalid-value",
        ),
        (
            "application-clocks graphics=1980 memory=2619",
            "application-clocks graphics=1980",
            "missing-property",
        ),
        ("drain samples=3", "drain samples=0", "out-of-range"),
        ("interval=\"100ms\"", "interval=\"5ms\"", "out-of-range"),
        // Three samples 100 ms apart cannot fit in 150 ms.
        ("timeout=\"2s\"", "timeout=\"150ms\"", "invalid-value"),
        (
            "sample-timeout=\"50ms\"",
            "sample-timeout=\"90s\"",
            "invalid-value",
        ),
        (
            "\"hw-slowdown\" max",
            "\"hw-slowness\" max",
            "invalid-value",
        ),
        (
            "\"hw-slowdown\" max",
            "\"hw-slowdown\" \"hw-slowdown\" max",
            "duplicate",
        ),
        (
            " reason=\"updates the container's linker cache for the driver's libraries\"",
            "",
            "missing-reason",
        ),
        ("    envelope ", "    // envelope ", "missing-node"),
        (
            "    cdi-hook ",
            "    cdi-hook \"/usr/bin/nvidia-cdi-hook\" reason=\"again\"\n    cdi-hook ",
            "duplicate",
        ),
    ] {
        // A pin both lanes share is edited in both (their shapes stay alike).
        let edited = if text.matches(from).count() == 2 {
            text.replace(from, to)
        } else {
            text.replace_once(from, to)
        };
        assert!(
            codes(&edited).contains(&code.to_owned()),
            "{from} → {to}: {:?}",
            codes(&edited)
        );
    }
    // A GPU-capable stage with GPU nodes of its own beside the lanes' GPUs.
    let own = cordon_testkit::with_reference_gpus(&text);
    assert_eq!(codes(&own), ["invalid-value"]);
    assert!(
        crate::parse(
            "t.kdl",
            &cordon_testkit::with_reference_gpus(&default_policy())
        )
        .is_ok()
    );
    // GPUs without the guard, and the guard without GPUs.
    let start = text.find("device-guard {").unwrap();
    let end = start + text[start..].find("\n}").unwrap() + 2;
    let unguarded = format!("{}{}", &text[..start], &text[end..]);
    assert!(
        codes(&unguarded).contains(&"missing-node".to_owned()),
        "{:?}",
        codes(&unguarded)
    );
    let guard = &text[start..end];
    let idle = format!("{}\n{guard}\n", default_policy());
    assert!(
        codes(&idle).contains(&"redundant-entry".to_owned()),
        "{:?}",
        codes(&idle)
    );
}

/// The runtime cache's mount and its bounds go together: a mount without bounds would be an
/// unbounded directory of the run's, bounds without a mount a tmpfs for nothing.
#[test]
fn a_cache_mount_and_its_bounds_go_together() {
    let text = default_policy();
    let at = text.find("stage \"lane\"").unwrap();
    let lane = |from: &str| {
        let (head, tail) = text.split_at(at);
        format!("{head}{}", tail.replacen(from, "", 1))
    };
    let unbounded = lane("    cache size=\"8GiB\" inodes=1000000\n");
    assert_eq!(codes(&unbounded), ["missing-node"]);
    let unmounted = lane("    mount \"cache\" \"/cache\" mode=\"rw\"\n");
    assert_eq!(codes(&unmounted), ["redundant-entry"]);
}

#[test]
fn an_engine_step_says_how_many_ranks_load_candidate_code_and_only_an_engine_step() {
    let text = default_policy();
    let p = crate::parse("evaluator.kdl", &text).unwrap();
    assert_eq!(p.step_ranks("serve-example"), Some(1));
    assert_eq!(p.step_ranks("serve-reference"), Some(1));
    assert_eq!(p.step_ranks("build-native"), None);
    let lane = "stage=\"lane\" {\n    argv \"/usr/bin/python3.11\" \"-I\" \"-S\" \"-B\" \"/cordon/lane/serve.py\"\n    ranks 1";
    let with = |r: &str| lane.replace("ranks 1", r);
    for (from, to, code) in [
        (lane, with("ranks 0"), "out-of-range"),
        (lane, with("ranks 65"), "out-of-range"),
        (lane, with("ranks \"1\""), "wrong-type"),
        (lane, with(""), "missing-node"),
        (
            "\"/cordon/patchers/native-rebuild\"",
            "\"/cordon/patchers/native-rebuild\"\n    ranks 1".to_owned(),
            "not-allowed-in-stage",
        ),
    ] {
        let edited = text.replace_once(from, &to);
        assert!(
            codes(&edited).contains(&code.to_owned()),
            "{to}: {:?}",
            codes(&edited)
        );
    }
    // Another count is another authority.
    let two = text.replace_once(lane, &with("ranks 2"));
    let q = crate::parse("t.kdl", &two).unwrap();
    assert_eq!(q.step_ranks("serve-example"), Some(2));
    assert_ne!(q.digest().unwrap(), p.digest().unwrap());
}

/// A prebuild step is one build tier's patcher, each tier has at most one, and no other step
/// has a tier.
#[test]
fn a_prebuild_step_is_one_tiers_only_patcher() {
    let text = default_policy();
    let p = crate::parse("evaluator.kdl", &text).unwrap();
    assert_eq!(p.step_tier("build-native"), Some(BuildTier::NativeRebuild));
    assert_eq!(p.patcher_of(BuildTier::NativeRebuild), Some("build-native"));
    assert_eq!(
        p.patcher_of(BuildTier::NativeSources),
        Some("build-native-sources")
    );
    assert_eq!(
        p.patcher_of(BuildTier::DependencyPatch),
        Some("build-dependency")
    );
    assert_eq!(
        p.patcher_of(BuildTier::SealedDirectArtifact),
        Some("build-aot")
    );
    assert_eq!(p.step_tier("serve-example"), None);
    let head = "step \"build-native\" stage=\"prebuild\" tier=\"native-rebuild\" {";
    let second = "step \"again\" stage=\"prebuild\" tier=\"native-rebuild\" {\n    argv \"/bin/sh\" \"/cordon/patchers/native-rebuild\"\n}\n";
    for (edited, code) in [
        (
            text.replace_once(head, "step \"build-native\" stage=\"prebuild\" {"),
            "missing-property",
        ),
        (
            text.replace_once(head, &head.replace("native-rebuild", "rebuild")),
            "invalid-value",
        ),
        (
            text.replace_once(
                "step \"serve-example\" stage=\"lane\" {",
                "step \"serve-example\" stage=\"lane\" tier=\"native-rebuild\" {",
            ),
            "not-allowed-in-stage",
        ),
        (
            text.replace_once(head, &format!("{second}{head}")),
            "duplicate",
        ),
        // The AOT patcher's standard input is the compile request: no secret beside it.
        (
            text.replace_once(
                "argv \"/bin/sh\" \"/cordon/patchers/sealed-direct-artifact\"",
                "argv \"/bin/sh\" \"/cordon/patchers/sealed-direct-artifact\"\n    secret \"k\"",
            ) + "secret \"k\" path=\"/etc/cordon/k\"\n",
            "not-allowed-in-stage",
        ),
    ] {
        assert_eq!(codes(&edited), [code], "{edited}");
    }
    // Another tier is another authority: two patchers' tiers swapped.
    let dependency = "step \"build-dependency\" stage=\"prebuild\" tier=\"dependency-patch\" {";
    let other = text
        .replace_once(head, &head.replace("native-rebuild", "dependency-patch"))
        .replace_once(
            dependency,
            &dependency.replace("dependency-patch", "native-rebuild"),
        );
    let q = crate::parse("t.kdl", &other).unwrap();
    assert_eq!(
        q.patcher_of(BuildTier::DependencyPatch),
        Some("build-native")
    );
    assert_ne!(q.digest().unwrap(), p.digest().unwrap());
}
