//! The device guard on a GPU lane's read (seed 001 §4's pre/active/post device receipts and
//! drain), through the `cordon-device` seam the caller holds with the host's GPU lock:
//! - **pre**, before the container exists: each GPU's configuration must be its pin (a drift
//!   quarantines the GPU, cause `drift`: terminal until an operator clears it), then each must
//!   drain; a GPU that does not drain is quarantined, cause `drain` ("not reusable"), and a
//!   drain that holds lifts such a mark left by an earlier read — the signed pre receipt that
//!   carries the drain is the proof. Any other quarantine on a GPU stops the read;
//! - **active**, during the last warmup request: one sample of each GPU, which must be inside
//!   the policy's envelope;
//! - **post**, after the lease's release: the drain and the configuration again, with the same
//!   marks.
//!
//! Every failure is a no-decision: the host could not measure, which is never the candidate's
//! fault. What it does not own: the checks themselves (`cordon_evidence::device`), reading the
//! GPUs (`cordon-device`), when each phase runs (the session's), the receipts' other fields.

use std::collections::BTreeMap;
use std::time::Duration;

use cordon::lease::quarantine::{self, Cause, Quarantine, Scope};
use cordon::store::Store;
use cordon_device::{Clock, DrainError, GPU_MINOR_MAX, Gpus, NVIDIA_MAJOR, drain, drift};
use cordon_evidence::device::{DeviceConfig, Sample};
use cordon_policy_lang::DeviceGuard;

/// The host's GPUs as reads see them: the seam and its clock (NVML and the monotonic clock on
/// a GPU host, the fake in tests). The caller holds them with the host's GPU lock.
pub struct Devices {
    /// The seam.
    pub gpus: std::sync::Arc<dyn Gpus>,
    /// Its clock.
    pub clock: std::sync::Arc<dyn Clock + Send + Sync>,
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Devices")
    }
}

/// What one phase observed, each GPU in the pins' order.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Observed {
    /// Each GPU's configuration (pre and post).
    pub config: Vec<DeviceConfig>,
    /// Each GPU's samples (pre and post its drain's last ones; active its one).
    pub samples: Vec<Vec<Sample>>,
    /// What the phase did beyond observing, for people (a lifted mark).
    pub note: Vec<String>,
}

/// Why a phase did not hold, with what it observed up to then.
#[derive(Debug, Clone)]
pub struct Failed {
    /// Why, with any quarantine it imposed.
    pub why: String,
    /// What it observed.
    pub observed: Observed,
}

/// Whether device numbers `planned` hold exactly the GPU nodes of `uuids` (see
/// [`Guard::nodes`]), the minor numbers read through `gpus`.
///
/// # Errors
/// Why not, or a minor number that cannot be read.
pub fn gpu_nodes<'u>(
    gpus: &dyn Gpus,
    uuids: impl IntoIterator<Item = &'u String>,
    planned: &[(u64, u64)],
) -> Result<(), String> {
    let mut want = Vec::new();
    for uuid in uuids {
        let minor = gpus.minor(uuid).map_err(|e| e.to_string())?;
        want.push(u64::from(minor));
    }
    want.sort_unstable();
    let mut got: Vec<u64> = planned
        .iter()
        .filter(|(major, minor)| *major == NVIDIA_MAJOR && *minor <= GPU_MINOR_MAX)
        .map(|(_, minor)| *minor)
        .collect();
    got.sort_unstable();
    if got != want {
        return Err(format!(
            "the container's GPU device nodes are {NVIDIA_MAJOR}:{got:?}, and the lane's GPUs are {NVIDIA_MAJOR}:{want:?}"
        ));
    }
    Ok(())
}

/// One read's guard over its lane's GPUs.
pub struct Guard<'a> {
    devices: &'a Devices,
    pins: &'a BTreeMap<String, DeviceConfig>,
    rules: &'a DeviceGuard,
    store: &'a Store,
    origin: Duration,
}

impl<'a> Guard<'a> {
    /// The guard of a read that begins now, of the lane GPUs `pins`, under the policy's
    /// `rules`, its marks kept in `store`.
    #[must_use]
    pub fn new(
        devices: &'a Devices,
        pins: &'a BTreeMap<String, DeviceConfig>,
        rules: &'a DeviceGuard,
        store: &'a Store,
    ) -> Self {
        Self {
            devices,
            pins,
            rules,
            store,
            origin: devices.clock.now(),
        }
    }

    /// The lane's GPUs, in order.
    #[must_use]
    pub fn gpus(&self) -> Vec<String> {
        self.pins.keys().cloned().collect()
    }

    /// ns since the read began, on the guard's clock (the samples' stamps).
    fn at_ns(&self) -> u64 {
        let d = self.devices.clock.now().saturating_sub(self.origin);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Quarantine GPU `uuid` for `cause`, and say so.
    fn mark(&self, uuid: &str, cause: Cause, why: &str) -> String {
        let q = Quarantine {
            scope: Scope::Device(uuid.to_owned()),
            cause,
            why: why.to_owned(),
            lease: None,
            at: cordon_evidence::receipt::now_rfc3339(),
        };
        match quarantine::impose(self.store, &q) {
            Ok(id) => format!("GPU {uuid} quarantined ({}, record {id})", cause.as_str()),
            Err(e) => format!("GPU {uuid} could not be quarantined: {e}"),
        }
    }

    /// Each GPU's configuration against its pin, then its drain; `lift` lifts a drain mark
    /// once the drain holds (pre), else none is expected (post).
    fn drained(&self, lift: bool) -> Result<Observed, Failed> {
        let mut o = Observed::default();
        let fail = |why: String, o: &Observed| Failed {
            why,
            observed: o.clone(),
        };
        let marks = quarantine::in_force(self.store)
            .map_err(|e| fail(format!("the quarantine records: {e}"), &o))?;
        for (uuid, pin) in self.pins {
            let mut lifts = None;
            for (id, q) in &marks {
                if q.scope != Scope::Device(uuid.clone()) {
                    continue;
                }
                if lift && q.cause == Cause::Drain {
                    lifts = Some(id.clone());
                } else {
                    return Err(fail(
                        format!(
                            "GPU {uuid} is quarantined ({}, record {id}): {}",
                            q.cause.as_str(),
                            cordon::text::printable(&q.why)
                        ),
                        &o,
                    ));
                }
            }
            let seen = self
                .devices
                .gpus
                .config(uuid)
                .map_err(|e| fail(e.to_string(), &o))?;
            let d = drift(pin, &seen);
            o.config.push(seen);
            if !d.is_empty() {
                let why = format!("GPU {uuid} is not as pinned: {}", d.join(", "));
                let line = self.mark(uuid, Cause::Drift, &why);
                return Err(fail(format!("{why}; {line}"), &o));
            }
            match drain(
                &*self.devices.gpus,
                &*self.devices.clock,
                self.origin,
                uuid,
                &self.rules.drain,
            ) {
                Ok(d) => o.samples.push(d.samples),
                Err(e) => {
                    let samples = match &e {
                        DrainError::NotDrained { samples, .. }
                        | DrainError::Faulted { samples, .. } => samples.clone(),
                        DrainError::Rule(_) => Vec::new(),
                    };
                    o.samples.push(samples);
                    // A mark already there stands (one record per scope).
                    let line = if lifts.is_some() {
                        format!("GPU {uuid} stays quarantined")
                    } else {
                        self.mark(uuid, Cause::Drain, &e.to_string())
                    };
                    return Err(fail(format!("{e}; {line}"), &o));
                }
            }
            if let Some(id) = lifts {
                quarantine::lift(self.store, &id)
                    .map_err(|e| fail(format!("lifting GPU {uuid}'s drain mark: {e}"), &o))?;
                o.note.push(format!(
                    "GPU {uuid} drained: its not-reusable mark (record {id}) is lifted"
                ));
            }
        }
        Ok(o)
    }

    /// Whether the container's planned device nodes are exactly the lane's GPUs: its NVIDIA
    /// GPU nodes (major [`NVIDIA_MAJOR`], minor at most [`GPU_MINOR_MAX`]) must be those whose
    /// minor numbers the driver gives the lane's GPUs, no more (another lane's GPU) and no
    /// fewer. What the guard measures by UUID is then what the container can open.
    ///
    /// # Errors
    /// Why not, or a minor number that cannot be read.
    pub fn nodes(&self, planned: &[(u64, u64)]) -> Result<(), String> {
        gpu_nodes(&*self.devices.gpus, self.pins.keys(), planned)
    }

    /// Before the container: each GPU as pinned and drained ([`Guard`]).
    ///
    /// # Errors
    /// A GPU is quarantined for anything but a drain, drifted, unreadable or not drained.
    pub fn pre(&self) -> Result<Observed, Failed> {
        self.drained(true)
    }

    /// During the last warmup request: one sample of each GPU. A sample that cannot be read
    /// or breaks the envelope is a failure, with what was sampled.
    ///
    /// # Errors
    /// As said.
    pub fn active(&self) -> Result<Observed, Failed> {
        let at = self.at_ns();
        let mut o = Observed::default();
        let mut why = Vec::new();
        for uuid in self.pins.keys() {
            match self.devices.gpus.sample(uuid, at) {
                Ok(s) => {
                    why.extend(
                        self.rules
                            .envelope
                            .breaches(&s)
                            .into_iter()
                            .map(|b| format!("GPU {uuid} while measured: {b}")),
                    );
                    o.samples.push(vec![s]);
                }
                Err(e) => {
                    o.samples.push(Vec::new());
                    why.push(e.to_string());
                }
            }
        }
        if why.is_empty() {
            Ok(o)
        } else {
            Err(Failed {
                why: why.join("; "),
                observed: o,
            })
        }
    }

    /// After the release: each GPU as pinned and drained again.
    ///
    /// # Errors
    /// A GPU is quarantined, drifted, unreadable or not drained.
    pub fn post(&self) -> Result<Observed, Failed> {
        self.drained(false)
    }
}

#[cfg(test)]
mod tests;
