use std::collections::BTreeMap;
use std::path::Path;

use super::*;

const UUID: &str = "GPU-0e3f6a52-1111-4c2c-9d41-000000000001";

/// A spec as `nvidia-ctk cdi generate --format=json --device-name-strategy=uuid` writes one.
fn spec() -> String {
    format!(
        r#"{{
  "cdiVersion": "0.5.0",
  "kind": "nvidia.com/gpu",
  "devices": [
    {{
      "name": "{UUID}",
      "containerEdits": {{
        "deviceNodes": [{{"path": "/dev/nvidia0"}}, {{"path": "/dev/dri/card1"}}]
      }}
    }},
    {{
      "name": "GPU-0e3f6a52-1111-4c2c-9d41-000000000002",
      "containerEdits": {{"deviceNodes": [{{"path": "/dev/nvidia1"}}]}}
    }}
  ],
  "containerEdits": {{
    "env": ["NVIDIA_VISIBLE_DEVICES=void"],
    "deviceNodes": [{{"path": "/dev/nvidiactl"}}, {{"path": "/dev/nvidia-uvm", "permissions": "rw"}}],
    "mounts": [{{
      "hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
      "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
      "options": ["ro", "nosuid", "nodev", "bind"]
    }}],
    "hooks": [{{
      "hookName": "createContainer",
      "path": "/usr/bin/nvidia-cdi-hook",
      "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]
    }}]
  }}
}}"#
    )
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
