use std::collections::BTreeMap;
use std::path::Path;

use super::*;

use cordon_testkit::LANE_GPUS;

const UUID: &str = LANE_GPUS[0];

fn spec() -> String {
    cordon_testkit::cdi_spec()
}

fn allowed() -> BTreeMap<String, String> {
    [(
        "/usr/bin/nvidia-cdi-hook".to_owned(),
        "reviewed: updates the container's ld cache".to_owned(),
    )]
    .into()
}

fn one(text: &str) -> Result<Resolved, CdiError> {
    let path = Path::new("/etc/cdi/nvidia.json");
    resolve(
        &[(path, text.as_bytes())],
        &format!("nvidia.com/gpu={UUID}"),
        &allowed(),
    )
}

#[test]
fn a_device_gets_the_specs_common_edits_and_its_own() {
    let r = one(&spec()).unwrap();
    assert_eq!(r.spec, "/etc/cdi/nvidia.json");
    let nodes: Vec<&str> = r.nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        nodes,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia0",
            "/dev/dri/card1"
        ]
    );
    assert_eq!(r.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(r.mounts.len(), 1);
    assert_eq!(r.hooks[0].args[1], "update-ldcache");
    // The other GPU's node is not this one's.
    assert!(!nodes.contains(&"/dev/nvidia1"));
}

#[test]
fn a_hook_the_policy_does_not_name_is_refused() {
    let path = Path::new("/etc/cdi/nvidia.json");
    let text = spec();
    let e = resolve(
        &[(path, text.as_bytes())],
        &format!("nvidia.com/gpu={UUID}"),
        &BTreeMap::new(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "CDI device nvidia.com/gpu={UUID} asks for hook /usr/bin/nvidia-cdi-hook (createContainer), which the policy does not allow"
        )
    );
    // Allowed by its path only: the same program elsewhere is another program.
    let moved = text.replace(
        "\"path\": \"/usr/bin/nvidia-cdi-hook\"",
        "\"path\": \"/tmp/nvidia-cdi-hook\"",
    );
    assert!(
        matches!(one(&moved), Err(CdiError::Hook { path, .. }) if path == "/tmp/nvidia-cdi-hook")
    );
}

#[test]
fn what_cordon_cannot_apply_or_place_is_refused() {
    let text = spec();
    for (from, to, why) in [
        // A field this schema does not know (a later version's edit).
        (
            "\"env\":",
            "\"netDevices\": [], \"env\":",
            "unknown field `netDevices`",
        ),
        (
            "\"0.5.0\"",
            "\"1.0.0\"",
            "CDI version \"1.0.0\" is not one cordon reads",
        ),
        ("\"0.5.0\"", "\"0.9.0\"", "is not one cordon reads"),
        (
            "{\"path\": \"/dev/nvidiactl\"}",
            "{\"path\": \"dev/nvidiactl\"}",
            "not an absolute normalised path",
        ),
        (
            "{\"path\": \"/dev/nvidiactl\"}",
            "{\"path\": \"/dev/../etc/shadow\"}",
            "not an absolute normalised path",
        ),
        (
            "\"hostPath\": \"/usr/lib",
            "\"hostPath\": \"/usr//lib",
            "not an absolute normalised path",
        ),
        (
            "NVIDIA_VISIBLE_DEVICES=void",
            "NVIDIA_VISIBLE_DEVICES",
            "is not KEY=VALUE",
        ),
        (
            "\"cdiVersion\"",
            "\"cdiversion\"",
            "unknown field `cdiversion`",
        ),
        // Hooks run as root on the host: only before the container's process starts.
        (
            "\"hookName\": \"createContainer\"",
            "\"hookName\": \"poststop\"",
            "hook point \"poststop\": cordon runs CDI hooks only before",
        ),
        (
            "\"hookName\": \"createContainer\"",
            "\"hookName\": \"prestart\"",
            "hook point \"prestart\"",
        ),
    ] {
        let edited = text.replacen(from, to, 1);
        assert_ne!(edited, text, "{from}");
        match one(&edited) {
            Err(CdiError::Spec { why: w, .. }) => assert!(w.contains(why), "{from}: {w}"),
            other => panic!("{from}: {other:?}"),
        }
    }
    // A YAML spec is refused by its name, with the command that writes JSON in the help.
    let yaml = resolve(
        &[(Path::new("/etc/cdi/nvidia.yaml"), b"cdiVersion: 0.5.0")],
        &format!("nvidia.com/gpu={UUID}"),
        &allowed(),
    );
    assert!(matches!(yaml, Err(CdiError::Spec { why, .. }) if why.contains("YAML")));
}

#[test]
fn a_device_no_spec_or_two_specs_name_is_refused() {
    let text = spec();
    let a = Path::new("/etc/cdi/a.json");
    let b = Path::new("/var/run/cdi/b.json");
    for (specs, device, why) in [
        (
            vec![(a, text.as_bytes())],
            "nvidia.com/gpu=GPU-absent".to_owned(),
            "no spec on this host names it",
        ),
        (
            vec![(a, text.as_bytes()), (b, text.as_bytes())],
            format!("nvidia.com/gpu={UUID}"),
            "2 specs name it",
        ),
        (
            vec![(a, text.as_bytes())],
            format!("example.com/gpu={UUID}"),
            "no spec on this host names it",
        ),
        (
            vec![(a, text.as_bytes())],
            UUID.to_owned(),
            "not a fully qualified name",
        ),
    ] {
        match resolve(&specs, &device, &allowed()) {
            Err(CdiError::Device { why: w, .. }) => assert!(w.starts_with(why), "{device}: {w}"),
            other => panic!("{device}: {other:?}"),
        }
    }
}

#[test]
fn a_lanes_devices_share_the_specs_common_edits_once() {
    let text = spec();
    let specs = [(Path::new("/etc/cdi/nvidia.json"), text.as_bytes())];
    let devices: Vec<String> = LANE_GPUS.iter().map(|u| gpu(u)).collect();
    let a = resolve_lane(&specs, &devices, &allowed()).unwrap();
    let nodes: Vec<&str> = a.nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        nodes,
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia0",
            "/dev/dri/card1",
            "/dev/nvidia1",
            "/dev/dri/card2"
        ]
    );
    assert_eq!(a.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!((a.mounts.len(), a.hooks.len()), (1, 1));
    assert_eq!(a.specs, digest(&specs).unwrap());
    assert_eq!(a.devices, devices);
    // Another spec's bytes are another digest.
    let other = text.replace("550.54.15", "550.54.16");
    assert_ne!(
        digest(&[(Path::new("/etc/cdi/nvidia.json"), other.as_bytes())]).unwrap(),
        a.specs
    );
}

#[test]
fn two_devices_of_a_lane_that_want_one_thing_differently_are_refused() {
    let text = spec();
    let devices: Vec<String> = LANE_GPUS.iter().map(|u| gpu(u)).collect();
    for (from, to, what) in [
        (
            r#""containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}]}"#,
            r#""containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "permissions": "r"}]}"#,
            "it wants device node /dev/nvidia0",
        ),
        (
            r#""containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}]}"#,
            r#""containerEdits": {"env": ["GPU_SLOT=b"], "deviceNodes": [{"path": "/dev/nvidia1"}]}"#,
            "it sets GPU_SLOT",
        ),
        (
            r#""containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/dri/card2"}]}"#,
            r#""containerEdits": {"mounts": [{"hostPath": "/opt/other/libcuda.so", "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"}], "deviceNodes": [{"path": "/dev/nvidia1"}]}"#,
            "it mounts /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
        ),
    ] {
        // The first device sets GPU_SLOT=a.
        let edited = text.replacen(from, to, 1).replacen(
            r#""deviceNodes": [{"path": "/dev/nvidia0"}"#,
            r#""env": ["GPU_SLOT=a"], "deviceNodes": [{"path": "/dev/nvidia0"}"#,
            1,
        );
        assert_ne!(edited, text, "{from}");
        let specs = [(Path::new("/etc/cdi/nvidia.json"), edited.as_bytes())];
        match resolve_lane(&specs, &devices, &allowed()) {
            Err(CdiError::Device { device, why }) => {
                assert_eq!(device, devices[1]);
                assert_eq!(
                    why,
                    format!("{what} differently from another device of the lane")
                );
            }
            other => panic!("{from}: {other:?}"),
        }
    }
}

#[test]
fn the_spec_directories_are_read_whole_and_a_missing_one_holds_none() {
    cordon_testkit::require_root("a CDI spec must be root's: the test's files are its owner's");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("absent"));
    std::fs::create_dir(&a).unwrap();
    for name in ["z.json", "m.yaml", "notes.txt"] {
        std::fs::write(a.join(name), name).unwrap();
    }
    let specs = read_specs([a.as_path(), b.as_path()]).unwrap();
    let names: Vec<_> = specs.iter().map(|(p, _)| p.file_name().unwrap()).collect();
    // YAML is read too (the resolver refuses it by name); other files are not specs.
    assert_eq!(names, ["m.yaml", "z.json"]);
    // A directory that exists and cannot be read is an error, never "no spec".
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    assert!(read_specs([file.as_path()]).is_err());
    // So is one that cannot be looked at (a file in its path): only "not there" holds none.
    assert!(read_specs([file.join("cdi").as_path()]).is_err());
    // Root's alone, and a regular file: a spec others could write, or a link, is refused.
    use std::os::unix::fs::PermissionsExt;
    let mode =
        |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(&a.join("z.json"), 0o664);
    let e = read_specs([a.as_path()]).unwrap_err();
    assert!(e.contains("writable by root alone"), "{e}");
    mode(&a.join("z.json"), 0o644);
    mode(&a, 0o777);
    assert!(read_specs([a.as_path()]).is_err());
    mode(&a, 0o755);
    std::os::unix::fs::symlink(a.join("z.json"), a.join("y.json")).unwrap();
    let e = read_specs([a.as_path()]).unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
}
