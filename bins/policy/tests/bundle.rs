//! The planned config.json of every stage of the default policy (golden), and the mount rules
//! that are checked before anything starts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use cordon_policy::cli::{Args, run};
use cordon_policy_lang::{MountSource, StageKind};
use cordon_stage::bundle;

fn policy() -> cordon_policy_lang::Policy {
    let path = cordon_testkit::workspace_root().join("policy/evaluator.kdl");
    cordon_policy_lang::parse("evaluator.kdl", &std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn every_stage_plans_to_its_golden_config_json() {
    let file = cordon_testkit::workspace_root().join("policy/evaluator.kdl");
    for stage in ["prebuild", "lane", "reference"] {
        let args = <Args as clap::Parser>::parse_from([
            "cordon-policy",
            "explain",
            file.to_str().unwrap(),
            "--stage",
            stage,
            "--bundle",
        ]);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&args, &mut out, &mut err);
        assert_eq!(
            code,
            cordon::ExitCode::Ok,
            "{}",
            String::from_utf8_lossy(&err)
        );
        let text = String::from_utf8(out).unwrap();
        insta::assert_snapshot!(format!("bundle-{stage}"), text);
    }
}

#[test]
fn the_example_surface_plans_to_its_golden_config_json() {
    let file = cordon_testkit::workspace_root().join("policy/examples/surface.kdl");
    let args = <Args as clap::Parser>::parse_from([
        "cordon-policy",
        "explain",
        file.to_str().unwrap(),
        "--stage",
        "surface",
        "--bundle",
    ]);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&args, &mut out, &mut err);
    assert_eq!(
        code,
        cordon::ExitCode::Ok,
        "{}",
        String::from_utf8_lossy(&err)
    );
    insta::assert_snapshot!("bundle-surface", String::from_utf8(out).unwrap());
}

#[test]
fn the_prebuild_bundle_carries_every_control() {
    let p = policy();
    let spec = bundle::plan(
        &p,
        StageKind::Prebuild,
        &bundle::example_inputs(&p, StageKind::Prebuild),
    )
    .unwrap()
    .spec;
    let v = serde_json::to_value(&spec).unwrap();
    let process = &v["process"];
    assert_eq!(process["noNewPrivileges"], true);
    assert_eq!(process["user"]["uid"], 3_000_000);
    for set in [
        "bounding",
        "effective",
        "inheritable",
        "permitted",
        "ambient",
    ] {
        assert_eq!(process["capabilities"][set], serde_json::json!([]), "{set}");
    }
    assert_eq!(v["root"]["readonly"], true);
    let mounts = v["mounts"].as_array().unwrap();
    let tmp = mounts.iter().find(|m| m["destination"] == "/tmp").unwrap();
    assert!(
        tmp["options"]
            .as_array()
            .unwrap()
            .contains(&"noexec".into())
    );
    assert!(
        mounts.iter().all(|m| m["destination"] != "/sys"),
        "no /sys unless asked for"
    );
    let engine = mounts
        .iter()
        .find(|m| m["destination"] == "/engine")
        .unwrap();
    for o in ["ro", "rprivate", "nosuid", "nodev"] {
        assert!(
            engine["options"].as_array().unwrap().contains(&o.into()),
            "{o}"
        );
    }
    let ns: Vec<_> = v["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["type"].as_str().unwrap())
        .collect();
    for n in ["pid", "network", "ipc", "uts", "mount", "cgroup"] {
        assert!(ns.contains(&n), "{n}");
    }
    let masked = v["linux"]["maskedPaths"].as_array().unwrap();
    for m in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/sys/firmware",
    ] {
        assert!(masked.contains(&m.into()), "{m}");
    }
    assert!(
        v["linux"]["readonlyPaths"]
            .as_array()
            .unwrap()
            .contains(&"/proc/sysrq-trigger".into())
    );
    assert_eq!(
        v["linux"]["resources"]["memory"]["limit"],
        v["linux"]["resources"]["memory"]["swap"]
    );
    assert_eq!(v["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
}

#[test]
fn overlapping_or_protected_mount_sources_are_refused_before_anything_starts() {
    let p = policy();
    let plan = |inputs: &bundle::RunInputs| bundle::plan(&p, StageKind::Prebuild, inputs);
    // Staging (in the run directory) inside the tree: not disjoint.
    let mut inputs = bundle::example_inputs(&p, StageKind::Prebuild);
    inputs.run_dir = PathBuf::from("/var/lib/cordon/store/trees/TREE/root/out");
    let err = plan(&inputs).unwrap_err();
    assert!(err.to_string().contains("not pairwise disjoint"), "{err}");
    // The store's private objects.
    let mut inputs = bundle::example_inputs(&p, StageKind::Prebuild);
    inputs.sources.insert(
        MountSource::Tree,
        PathBuf::from("/var/lib/cordon/store/objects"),
    );
    let err = plan(&inputs).unwrap_err();
    assert!(err.to_string().contains("protected"), "{err}");
    // A source above a protected path (the store).
    let mut inputs = bundle::example_inputs(&p, StageKind::Prebuild);
    inputs
        .sources
        .insert(MountSource::Tree, PathBuf::from("/var/lib/cordon"));
    let err = plan(&inputs).unwrap_err();
    assert!(err.to_string().contains("protected"), "{err}");
    // A missing source for a declared mount.
    let mut inputs = bundle::example_inputs(&p, StageKind::Prebuild);
    inputs.sources.remove(&MountSource::Tree);
    assert!(matches!(
        plan(&inputs),
        Err(bundle::PlanError::NoSource { .. })
    ));
}
