//! `cordon-lane devices`: what an operator checks of a GPU host before its first qualification
//! (`checks/gpu.sh` runs it). For every GPU the policy's physical lanes name: its container
//! edits resolved from the host's CDI specs (`nvidia.com/gpu=<UUID>`, hooks only as the policy
//! allows), its configuration as the driver reports it against the policy's pin, one telemetry
//! sample (no fault in it), and, when asked, a drain under the policy's guard — the same seam
//! and checks a GPU read uses (`cordon-device`); and each lane's devices resolved together, as
//! a read applies them. One canonical JSON document on stdout
//! (hostile text escaped); exit 0 only when every GPU holds; anything not established or
//! different is exit 3.
//!
//! What it does not own: the checks themselves (`cordon_evidence::device`, `cordon-device`),
//! and what a read makes of them (the lane's `guard` and the bundle's CDI edits).

use cordon::ExitCode;
use cordon_device::{Clock, Gpus, drain, drift};
use cordon_evidence::device::faults;
use cordon_policy_lang::Policy;
use cordon_stage::cdi::{self, SpecFile};
use serde_json::{Value, json};

/// Every lane GPU of `policy`, as `(lane, uuid)`.
#[must_use]
pub fn named(policy: &Policy) -> Vec<(String, String)> {
    policy
        .physical_lanes()
        .iter()
        .flat_map(|(lane, l)| l.gpus.keys().map(move |u| (lane.clone(), u.clone())))
        .collect()
}

/// How the report learns a host device node's numbers ([`character_device`] on a host).
pub type Stat = dyn Fn(&std::path::Path) -> Option<(u64, u64)>;

/// The report of every lane GPU of `policy`: resolved from `specs`, read through `gpus`,
/// drained under the policy's guard when `drained`; each lane's devices resolved together,
/// their GPU nodes (numbered by `stat`) the lane's GPUs; and whether every one holds.
#[must_use]
pub fn report(
    policy: &Policy,
    specs: &[SpecFile<'_>],
    gpus: &dyn Gpus,
    clock: &dyn Clock,
    (drained, stat): (bool, &Stat),
) -> (Value, bool) {
    let mut ok = true;
    let mut out = Vec::new();
    let no_hooks = std::collections::BTreeMap::new();
    let hooks = policy.device_guard().map_or(&no_hooks, |g| &g.cdi_hooks);
    for (lane, uuid) in named(policy) {
        let pinned = &policy.physical_lanes()[&lane].gpus[&uuid];
        let mut entry = json!({ "lane": lane, "gpu": uuid });
        match cdi::resolve(specs, &cdi::gpu(&uuid), hooks) {
            Ok(r) => entry["cdi"] = json!(r),
            Err(e) => {
                ok = false;
                entry["cdi"] = json!({ "refused": e.to_string() });
            }
        }
        match gpus.config(&uuid) {
            Ok(seen) => {
                let d = drift(pinned, &seen);
                ok &= d.is_empty();
                entry["config"] = json!(seen);
                entry["drift"] = json!(d);
            }
            Err(e) => {
                ok = false;
                entry["config"] = json!({ "unreadable": e.to_string() });
            }
        }
        match gpus.sample(&uuid, 0) {
            Ok(s) => {
                let f = faults(&s);
                ok &= f.is_empty();
                entry["faults"] = json!(f);
                entry["sample"] = json!(s);
            }
            Err(e) => {
                ok = false;
                entry["sample"] = json!({ "unreadable": e.to_string() });
            }
        }
        if drained {
            // Checked by the language: a policy that names GPUs has a guard.
            match policy.device_guard() {
                Some(guard) => match drain(gpus, clock, clock.now(), &uuid, &guard.drain) {
                    Ok(d) => entry["drain"] = json!({ "drained": d }),
                    Err(e) => {
                        ok = false;
                        entry["drain"] = json!({ "failed": e.to_string() });
                    }
                },
                None => {
                    ok = false;
                    entry["drain"] = json!({ "failed": "the policy has no device-guard" });
                }
            }
        }
        out.push(entry);
    }
    // Each lane's devices together, as a session applies them (two devices of a lane that
    // want one node differently are refused there).
    let mut lanes = Vec::new();
    for (lane, l) in policy.physical_lanes() {
        if l.gpus.is_empty() {
            continue;
        }
        let devices: Vec<String> = l.gpus.keys().map(|u| cdi::gpu(u)).collect();
        let applied = match cdi::resolve_lane(specs, &devices, hooks) {
            // Its GPU nodes, as the host numbers them, are the lane's GPUs (as a read checks
            // before its engine starts).
            Ok(a) => {
                let numbers: Vec<(u64, u64)> = a
                    .nodes
                    .iter()
                    .filter_map(|n| {
                        stat(std::path::Path::new(
                            n.host_path.as_ref().unwrap_or(&n.path),
                        ))
                    })
                    .collect();
                let nodes = match crate::guard::gpu_nodes(gpus, l.gpus.keys(), &numbers) {
                    Ok(()) => json!("the lane's GPUs"),
                    Err(why) => {
                        ok = false;
                        json!({ "refused": why })
                    }
                };
                json!({ "applied": a, "nodes": nodes })
            }
            Err(e) => {
                ok = false;
                json!({ "refused": e.to_string() })
            }
        };
        lanes.push(json!({ "lane": lane, "cdi": applied }));
    }
    (json!({ "gpus": out, "lanes": lanes, "ok": ok }), ok)
}

/// The (major, minor) numbers of the character device at `path` on this host (`None`: it is
/// none, or cannot be looked at).
#[must_use]
pub fn character_device(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    m.file_type().is_char_device().then(|| {
        let rdev = m.rdev();
        (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
    })
}

/// The exit of a report: 0 when every GPU holds, 3 otherwise.
#[must_use]
pub const fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::Ok
    } else {
        ExitCode::NoDecision
    }
}

#[cfg(test)]
mod tests;
