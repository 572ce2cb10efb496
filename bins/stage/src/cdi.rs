//! A GPU's container edits from the host's CDI specs (the Container Device Interface,
//! `/etc/cdi` and `/var/run/cdi`): the device nodes, mounts, environment and hooks a device
//! named `vendor/class=name` needs, resolved into plain values the planner applies.
//!
//! Parsed with cordon's own types, not the `container-device-interface` crate: that crate
//! brings `oci-spec` 0.10 (the workspace is on 0.8), a JSON-schema validator that resolves
//! references over HTTP by default, `anyhow` errors and the deprecated `serde_yaml`, for what
//! is here one closed serde schema. Specs are read as JSON (`nvidia-ctk cdi generate
//! --format=json`); a YAML spec is refused with that command. Fail closed throughout:
//! - a field this schema does not know is refused (an edit cordon would not apply is never
//!   skipped);
//! - a device named by two specs is refused (no priority guessing);
//! - a hook is refused unless the policy names its program's path, with a reason (hooks run as
//!   root on the host, before the container exists), and its lifecycle point is one OCI knows;
//! - paths must be absolute and normalised, device nodes under `/dev` and character devices
//!   (a GPU's; a block device is a disk);
//! - an environment entry is `KEY=VALUE` with a key, each key once.
//!
//! What the planner must still decide when it applies them: mount types and options, and
//! that no mount reaches a never-mount path (this module resolves; it does not plan).
//!
//! Pure but for [`read_specs`]: the caller reads the spec files, [`resolve_lane`] resolves a
//! lane's GPUs from them into one edit set, and [`digest`] names the specs for the launch
//! identity and the frozen values.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use cordon_canon::Digest;

use serde::{Deserialize, Serialize};

/// One spec file as read: its path and bytes.
pub type SpecFile<'a> = (&'a Path, &'a [u8]);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    cdi_version: String,
    kind: String,
    /// Metadata for people: applies nothing.
    #[serde(default, rename = "annotations")]
    _annotations: serde::de::IgnoredAny,
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Device {
    name: String,
    /// Metadata for people: applies nothing.
    #[serde(default, rename = "annotations")]
    _annotations: serde::de::IgnoredAny,
    container_edits: Edits,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Edits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<Node>,
    #[serde(default)]
    mounts: Vec<Mount>,
    #[serde(default)]
    hooks: Vec<Hook>,
}

/// A device node the container gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Node {
    /// Its path in the container.
    pub path: String,
    /// Its path on the host (absent: the same as in the container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` or `b` (absent: read from the host node).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Its major number (absent: read from the host node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Its minor number (absent: read from the host node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// The cgroup access (`rwm` or less; absent: `rwm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Its mode in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Its owner in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Its group in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A bind the container gets (a driver's libraries, a socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    /// Its source on the host.
    pub host_path: String,
    /// Its destination in the container.
    pub container_path: String,
    /// The mount type (absent: a bind).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Its options.
    #[serde(default)]
    pub options: Vec<String>,
}

/// A program the runtime runs at one of the container's lifecycle points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    /// When (`createRuntime`, `createContainer` or `startContainer`: [`HOOK_POINTS`]).
    pub hook_name: String,
    /// The program.
    pub path: String,
    /// Its argv.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment.
    #[serde(default)]
    pub env: Vec<String>,
    /// Its timeout, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// The lifecycle points a CDI hook may run at: OCI's three before the container's process
/// starts. Not `prestart` (deprecated for these), and not `poststart` or `poststop`: a hook
/// runs as root on the host, and after the candidate has run its root filesystem is the
/// candidate's work (a link planted for a root program to follow).
const HOOK_POINTS: [&str; 3] = ["createRuntime", "createContainer", "startContainer"];

/// What a device needs in the container: the spec's common edits and the device's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolved {
    /// The device's fully qualified name.
    pub device: String,
    /// The spec file it came from.
    pub spec: String,
    /// Environment entries (`KEY=VALUE`).
    pub env: Vec<String>,
    /// Device nodes.
    pub nodes: Vec<Node>,
    /// Binds.
    pub mounts: Vec<Mount>,
    /// Hooks, each one the policy allows.
    pub hooks: Vec<Hook>,
}

/// Why a device cannot be resolved.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CdiError {
    /// A spec does not parse as the schema cordon applies.
    #[error("CDI spec {path}: {why}")]
    #[diagnostic(
        code(cordon::device::cdi),
        help(
            "write the spec as JSON (`nvidia-ctk cdi generate --format=json --output=/etc/cdi/nvidia.json`); a field cordon does not know is refused, never skipped"
        )
    )]
    Spec {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The device is in no spec, or in more than one.
    #[error("CDI device {device}: {why}")]
    #[diagnostic(
        code(cordon::device::cdi),
        help("`nvidia-ctk cdi list` lists the devices the host's specs name")
    )]
    Device {
        /// The device's fully qualified name.
        device: String,
        /// What is wrong.
        why: String,
    },
    /// A hook the policy does not allow.
    #[error(
        "CDI device {device} asks for hook {path} ({hook_name}), which the policy does not allow"
    )]
    #[diagnostic(
        code(cordon::device::cdi_hook),
        help(
            "hooks run as root on the host: name the program in device-guard with `cdi-hook \"PATH\" reason=\"…\"` after review, or generate the spec without it"
        )
    )]
    Hook {
        /// The device.
        device: String,
        /// The hook's program.
        path: String,
        /// When it would run.
        hook_name: String,
    },
}

/// Resolve `device` (`vendor/class=name`) from `specs`, allowing only the hooks `allowed`
/// names (by program path).
///
/// # Errors
/// [`CdiError`] naming the spec, device or hook.
pub fn resolve(
    specs: &[SpecFile<'_>],
    device: &str,
    allowed: &BTreeMap<String, String>,
) -> Result<Resolved, CdiError> {
    let no = |why: &str| CdiError::Device {
        device: device.to_owned(),
        why: why.to_owned(),
    };
    let (kind, name) = device
        .split_once('=')
        .filter(|(k, n)| k.contains('/') && !n.is_empty())
        .ok_or_else(|| no("not a fully qualified name (vendor/class=name)"))?;
    let mut found = Vec::new();
    for (path, bytes) in specs {
        let spec = parse(path, bytes)?;
        if spec.kind != kind {
            continue;
        }
        for d in spec.devices.into_iter().filter(|d| d.name == name) {
            found.push((path.display().to_string(), spec.container_edits.clone(), d));
        }
    }
    let (spec, common, d) = match found.len() {
        0 => return Err(no("no spec on this host names it")),
        1 => found.remove(0),
        n => return Err(no(&format!("{n} specs name it"))),
    };
    let mut r = Resolved {
        device: device.to_owned(),
        spec,
        env: Vec::new(),
        nodes: Vec::new(),
        mounts: Vec::new(),
        hooks: Vec::new(),
    };
    for edits in [common, d.container_edits] {
        r.env.extend(edits.env);
        r.nodes.extend(edits.device_nodes);
        r.mounts.extend(edits.mounts);
        r.hooks.extend(edits.hooks);
    }
    let bad = |why: String| CdiError::Spec {
        path: r.spec.clone(),
        why,
    };
    for n in &r.nodes {
        for p in std::iter::once(&n.path).chain(n.host_path.iter()) {
            absolute(p).map_err(|why| bad(format!("device node {p:?}: {why}")))?;
        }
    }
    for m in &r.mounts {
        for p in [&m.host_path, &m.container_path] {
            absolute(p).map_err(|why| bad(format!("mount {p:?}: {why}")))?;
        }
    }
    for n in &r.nodes {
        if !Path::new(&n.path).starts_with("/dev") {
            return Err(bad(format!("device node {:?} is not under /dev", n.path)));
        }
        if n.kind.as_deref().is_some_and(|k| k != "c") {
            return Err(bad(format!(
                "device node {:?} is not a character device",
                n.path
            )));
        }
    }
    let mut keys = std::collections::BTreeSet::new();
    for e in &r.env {
        match e.split_once('=') {
            Some((key, _)) if !key.is_empty() => {
                if !keys.insert(key) {
                    return Err(bad(format!("environment key {key:?} is set twice")));
                }
            }
            _ => return Err(bad(format!("environment entry {e:?} is not KEY=VALUE"))),
        }
    }
    if let Some(h) = r
        .hooks
        .iter()
        .find(|h| !HOOK_POINTS.contains(&h.hook_name.as_str()))
    {
        return Err(bad(format!(
            "hook point {:?}: cordon runs CDI hooks only before the container's process starts ({})",
            h.hook_name,
            HOOK_POINTS.join(", ")
        )));
    }
    if let Some(h) = r.hooks.iter().find(|h| !allowed.contains_key(&h.path)) {
        return Err(CdiError::Hook {
            device: device.to_owned(),
            path: h.path.clone(),
            hook_name: h.hook_name.clone(),
        });
    }
    Ok(r)
}

/// The CDI device a lane GPU is: NVIDIA's kind, named by UUID
/// (`nvidia-ctk cdi generate --device-name-strategy=uuid`).
#[must_use]
pub fn gpu(uuid: &str) -> String {
    format!("nvidia.com/gpu={uuid}")
}

/// Where a host's CDI specs live (the CDI registry's directories).
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The spec files in `dirs`, read, in path order: every `.json`, `.yaml` and `.yml` file (the
/// resolver refuses YAML by name, never skipping it). A directory that does not exist holds
/// none; one that exists and cannot be read is an error, never "no spec". A spec decides what
/// a container gets of the host, so each directory and file must be root's and writable by
/// root alone, and a spec must be a regular file (not a link).
///
/// # Errors
/// A directory or spec file that exists cannot be read, or is not root's alone.
pub fn read_specs(
    dirs: impl IntoIterator<Item = impl AsRef<Path>>,
) -> Result<Vec<(PathBuf, Vec<u8>)>, String> {
    use std::os::unix::fs::MetadataExt;
    let owned = |path: &Path, m: &std::fs::Metadata| {
        if m.uid() != 0 || m.mode() & 0o022 != 0 {
            return Err(format!(
                "{}: owned by uid {} with mode {:o}: a CDI spec and its directory must be root's and writable by root alone",
                path.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
        Ok(())
    };
    let mut specs = Vec::new();
    for dir in dirs {
        let dir = dir.as_ref();
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        owned(dir, &meta)?;
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path
                .extension()
                .is_some_and(|e| e == "json" || e == "yaml" || e == "yml")
            {
                let m = std::fs::symlink_metadata(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if !m.is_file() {
                    return Err(format!("{}: not a regular file", path.display()));
                }
                owned(&path, &m)?;
                let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                specs.push((path, bytes));
            }
        }
    }
    specs.sort();
    Ok(specs)
}

/// Spec files as read ([`read_specs`]), viewed as the resolver takes them.
#[must_use]
pub fn files(specs: &[(PathBuf, Vec<u8>)]) -> Vec<SpecFile<'_>> {
    specs
        .iter()
        .map(|(p, b)| (p.as_path(), b.as_slice()))
        .collect()
}

/// The digest of the spec files as read (each path with its bytes' digest): what the launch
/// identity and a qualification's frozen values carry, so two reads resolved their devices
/// from the same specs.
///
/// # Errors
/// It cannot be encoded.
pub fn digest(specs: &[SpecFile<'_>]) -> Result<Digest, cordon_canon::canonical::CanonicalError> {
    let files: Vec<(String, Digest)> = specs
        .iter()
        .map(|(p, b)| (p.display().to_string(), Digest::of_bytes(b)))
        .collect();
    cordon_canon::canonical::domain_digest("cordon.cdi-specs", 1, &files)
}

/// A lane's GPUs' container edits, each device resolved and the set merged: what the bundle
/// applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The devices' fully qualified names, in the lane's order.
    pub devices: Vec<String>,
    /// The specs they were resolved from ([`digest`]).
    pub specs: Digest,
    /// Environment entries (`KEY=VALUE`), each key once.
    pub env: Vec<String>,
    /// Device nodes, each container path once.
    pub nodes: Vec<Node>,
    /// Binds, each destination once.
    pub mounts: Vec<Mount>,
    /// Hooks, each the policy allows, each once.
    pub hooks: Vec<Hook>,
}

/// Resolve every one of `devices` from `specs` ([`resolve`]) and merge their edits: an edit
/// two devices share (the spec's common ones) is applied once; two devices that want the same
/// node, destination or variable differently are refused (no priority guessing).
///
/// # Errors
/// A device does not resolve, or two of them conflict; the specs cannot be digested.
pub fn resolve_lane(
    specs: &[SpecFile<'_>],
    devices: &[String],
    allowed: &BTreeMap<String, String>,
) -> Result<Applied, CdiError> {
    let mut a = Applied {
        devices: devices.to_vec(),
        specs: digest(specs).map_err(|e| CdiError::Spec {
            path: SPEC_DIRS.join(", "),
            why: e.to_string(),
        })?,
        env: Vec::new(),
        nodes: Vec::new(),
        mounts: Vec::new(),
        hooks: Vec::new(),
    };
    for device in devices {
        let r = resolve(specs, device, allowed)?;
        let clash = |what: String| CdiError::Device {
            device: device.clone(),
            why: format!("{what} differently from another device of the lane"),
        };
        for e in r.env {
            let key = e.split_once('=').map_or("", |(k, _)| k);
            match a
                .env
                .iter()
                .find(|x| x.split_once('=').map(|(k, _)| k) == Some(key))
            {
                Some(x) if *x == e => {}
                Some(_) => return Err(clash(format!("it sets {key}"))),
                None => a.env.push(e),
            }
        }
        for n in r.nodes {
            match a.nodes.iter().find(|x| x.path == n.path) {
                Some(x) if *x == n => {}
                Some(_) => return Err(clash(format!("it wants device node {}", n.path))),
                None => a.nodes.push(n),
            }
        }
        for m in r.mounts {
            match a
                .mounts
                .iter()
                .find(|x| x.container_path == m.container_path)
            {
                Some(x) if *x == m => {}
                Some(_) => return Err(clash(format!("it mounts {}", m.container_path))),
                None => a.mounts.push(m),
            }
        }
        for h in r.hooks {
            if !a.hooks.contains(&h) {
                a.hooks.push(h);
            }
        }
    }
    Ok(a)
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Spec, CdiError> {
    let bad = |why: String| CdiError::Spec {
        path: path.display().to_string(),
        why,
    };
    if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        return Err(bad("a YAML spec; cordon reads CDI specs as JSON".to_owned()));
    }
    let spec: Spec = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    // Versions whose schema this is: 0.3 to 0.8 (later ones add edits cordon does not apply).
    let minor = spec
        .cdi_version
        .strip_prefix("0.")
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    if !minor.is_some_and(|m| (3..=8).contains(&m)) {
        return Err(bad(format!(
            "CDI version {:?} is not one cordon reads (0.3 to 0.8)",
            spec.cdi_version
        )));
    }
    Ok(spec)
}

/// Whether `p` is absolute and normalised (no empty, `.` or `..` component).
fn absolute(p: &str) -> Result<(), String> {
    let path = Path::new(p);
    let normal = path.is_absolute()
        && !p.ends_with('/')
        && !p.contains("//")
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if normal {
        Ok(())
    } else {
        Err("not an absolute normalised path".to_owned())
    }
}

#[cfg(test)]
mod tests;
