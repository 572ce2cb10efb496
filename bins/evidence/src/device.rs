//! A GPU's facts as the host's device guard reads them and the receipts carry them, and the
//! pure rules over them: the pinned configuration and its drift, what "idle" and "faulted"
//! mean for a drain, and the active envelope. Pure, so `cordon-verify` recomputes a read's
//! device verdict from its receipt without a driver; the sampling itself (NVML, the drain's
//! loop and clock) is `cordon-device`'s.

use serde::{Deserialize, Serialize};

/// How contexts may share a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ComputeMode {
    /// Any number of contexts.
    Default,
    /// One context, of one process.
    ExclusiveProcess,
    /// No context at all.
    Prohibited,
}

/// A GPU's configuration as the driver reports it; the policy pins one per GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// The driver's version.
    pub driver: String,
    /// Persistence mode on.
    pub persistence: bool,
    /// The compute mode.
    pub compute_mode: ComputeMode,
    /// The application clocks, graphics and memory, MHz.
    pub application_clocks: (u32, u32),
    /// The power limit the GPU enforces (the lower of the driver's and any out-of-band cap),
    /// milliwatts.
    pub power_limit_mw: u32,
    /// ECC: on now, and on after the next reset (a pending change is a change).
    pub ecc: (bool, bool),
    /// MIG mode: on now, and on after the next reset.
    pub mig: (bool, bool),
}

/// One telemetry sample of one GPU, as the host read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// When, ns on the guard's clock.
    pub at_ns: u64,
    /// Percent of the last period a kernel ran.
    pub utilisation: u32,
    /// Percent of the last period device memory was read or written (copies included).
    pub memory_utilisation: u32,
    /// Device memory allocated, bytes.
    pub memory_used: u64,
    /// The compute and graphics processes on it, by host pid.
    pub processes: Vec<u32>,
    /// Core temperature, °C.
    pub temperature_c: u32,
    /// Current graphics and memory clocks, MHz.
    pub clocks: (u32, u32),
    /// Power draw, milliwatts.
    pub power_mw: u32,
    /// The driver's current clock throttle reasons ([`THROTTLE_REASONS`] bits).
    pub throttle: u64,
    /// Xid events the driver reported since the previous sample (their codes).
    pub xid: Vec<u64>,
    /// Pages pending retirement or rows pending remapping, or a failed remapping: the device
    /// owes a reset.
    pub retirement_pending: bool,
}

/// The throttle reason bits NVML reports, with their names (`nvmlClocksEventReason*`).
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu-idle"),
    (0x2, "application-clocks-setting"),
    (0x4, "sw-power-cap"),
    (0x8, "hw-slowdown"),
    (0x10, "sync-boost"),
    (0x20, "sw-thermal-slowdown"),
    (0x40, "hw-thermal-slowdown"),
    (0x80, "hw-power-brake-slowdown"),
    (0x100, "display-clock-setting"),
];

/// The names of the reasons set in `bits`, and `0x…` for any bit without a name.
#[must_use]
pub fn throttle_names(bits: u64) -> Vec<String> {
    let named: u64 = THROTTLE_REASONS
        .iter()
        .map(|(b, _)| b)
        .fold(0, |a, b| a | b);
    let mut names: Vec<String> = THROTTLE_REASONS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| (*n).to_owned())
        .collect();
    if bits & !named != 0 {
        names.push(format!("{:#x}", bits & !named));
    }
    names
}

/// How `seen` differs from the `pinned` configuration, one line per field (empty: as pinned).
#[must_use]
pub fn drift(pinned: &DeviceConfig, seen: &DeviceConfig) -> Vec<String> {
    let DeviceConfig {
        driver,
        persistence,
        compute_mode,
        application_clocks,
        power_limit_mw,
        ecc,
        mig,
    } = pinned;
    let mut d = Vec::new();
    let mut want = |same: bool, what: String| {
        if !same {
            d.push(what);
        }
    };
    want(
        seen.driver == *driver,
        format!("driver {}, not {driver}", seen.driver),
    );
    want(
        seen.persistence == *persistence,
        format!("persistence {}, not {persistence}", seen.persistence),
    );
    want(
        seen.compute_mode == *compute_mode,
        format!("compute mode {:?}, not {compute_mode:?}", seen.compute_mode),
    );
    want(
        seen.application_clocks == *application_clocks,
        format!(
            "application clocks {:?} MHz, not {application_clocks:?}",
            seen.application_clocks
        ),
    );
    want(
        seen.power_limit_mw == *power_limit_mw,
        format!(
            "power limit {} mW, not {power_limit_mw}",
            seen.power_limit_mw
        ),
    );
    want(
        seen.ecc == *ecc,
        format!("ECC (now, after reset) {:?}, not {ecc:?}", seen.ecc),
    );
    want(
        seen.mig == *mig,
        format!("MIG (now, after reset) {:?}, not {mig:?}", seen.mig),
    );
    d
}

/// What "drained" means, from the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRule {
    /// Consecutive idle samples needed (at least one).
    pub samples: u32,
    /// Between two samples, ms (at least [`DrainRule::MIN_INTERVAL_MS`]).
    pub interval_ms: u64,
    /// A sample that takes longer is late: it does not count, and the count starts again; ms.
    pub sample_timeout_ms: u64,
    /// The whole drain's deadline: every sample that counts has ended by it; ms.
    pub timeout_ms: u64,
    /// The most device memory an idle GPU may show allocated (the driver's own), bytes.
    pub idle_memory: u64,
}

impl DrainRule {
    /// The shortest interval between samples: NVML's utilisation is itself an average over a
    /// period of this order, and a tighter loop only grows the record.
    pub const MIN_INTERVAL_MS: u64 = 10;

    /// Why this rule cannot decide a drain (`None`: it can).
    #[must_use]
    pub fn unsound(&self) -> Option<String> {
        if self.samples == 0 {
            Some("a drain of zero samples proves nothing".to_owned())
        } else if self.interval_ms < Self::MIN_INTERVAL_MS {
            Some(format!(
                "an interval of {} ms, below {}",
                self.interval_ms,
                Self::MIN_INTERVAL_MS
            ))
        } else if u64::from(self.samples - 1).saturating_mul(self.interval_ms) > self.timeout_ms {
            Some(format!(
                "{} samples {} ms apart cannot fit in {} ms",
                self.samples, self.interval_ms, self.timeout_ms
            ))
        } else if self.sample_timeout_ms > self.timeout_ms {
            Some(format!(
                "a sample timeout of {} ms, above the drain's {}",
                self.sample_timeout_ms, self.timeout_ms
            ))
        } else {
            None
        }
    }
}

/// Why `s` is not idle under `rule` (empty: idle).
#[must_use]
pub fn busy(rule: &DrainRule, s: &Sample) -> Vec<String> {
    let mut why = Vec::new();
    if !s.processes.is_empty() {
        why.push(format!("processes {:?}", s.processes));
    }
    if s.utilisation != 0 {
        why.push(format!("utilisation {}%", s.utilisation));
    }
    if s.memory_utilisation != 0 {
        why.push(format!("memory utilisation {}%", s.memory_utilisation));
    }
    if s.memory_used > rule.idle_memory {
        why.push(format!(
            "{} bytes of memory allocated, above {}",
            s.memory_used, rule.idle_memory
        ));
    }
    why
}

/// The faults `s` shows (empty: none).
#[must_use]
pub fn faults(s: &Sample) -> Vec<String> {
    let mut why = Vec::new();
    if !s.xid.is_empty() {
        why.push(format!("Xid events {:?}", s.xid));
    }
    if s.retirement_pending {
        why.push("memory pending retirement or remapping".to_owned());
    }
    why
}

/// The bounds the active sample must be inside, from the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Highest core temperature, °C.
    pub max_temperature_c: u32,
    /// Highest power draw, milliwatts.
    pub max_power_mw: u32,
    /// Lowest graphics clock while working, MHz.
    pub min_graphics_mhz: u32,
    /// Throttle reasons that may not be set ([`crate::THROTTLE_REASONS`] bits).
    pub forbidden_throttle: u64,
}

impl Envelope {
    /// How `s` breaks the envelope (empty: inside it). A fault (an Xid event, memory pending
    /// retirement or remapping) breaks it too: a device that faults while measured measured
    /// nothing.
    #[must_use]
    pub fn breaches(&self, s: &Sample) -> Vec<String> {
        let mut b = Vec::new();
        if s.temperature_c > self.max_temperature_c {
            b.push(format!(
                "temperature {} °C, above {}",
                s.temperature_c, self.max_temperature_c
            ));
        }
        if s.power_mw > self.max_power_mw {
            b.push(format!(
                "power {} mW, above {}",
                s.power_mw, self.max_power_mw
            ));
        }
        if s.clocks.0 < self.min_graphics_mhz {
            b.push(format!(
                "graphics clock {} MHz, below {}",
                s.clocks.0, self.min_graphics_mhz
            ));
        }
        let forbidden = s.throttle & self.forbidden_throttle;
        if forbidden != 0 {
            b.push(format!(
                "throttled: {}",
                throttle_names(forbidden).join(", ")
            ));
        }
        b.extend(faults(s));
        b
    }
}

/// Why a GPU lane's read is not proved guarded by its device receipts (empty: it is), against
/// the lane's pinned GPUs and the policy's drain rule and envelope — what the session checked
/// as it read, recomputed from the receipts alone (`cordon-verify` replays it): each receipt
/// names exactly the lane's GPUs; pre and post, each GPU's configuration is its pin and its
/// samples end in `rule.samples` idle ones with no fault among any kept; the active sample of
/// each is inside the envelope. The samples' timing (interval, lateness) is the drain's own and
/// is not recomputed.
#[must_use]
pub fn unguarded(
    pins: &std::collections::BTreeMap<String, DeviceConfig>,
    rule: &DrainRule,
    envelope: &Envelope,
    receipts: &crate::receipt::DeviceReceipts,
) -> Vec<String> {
    let mut why = Vec::new();
    let gpus: Vec<&String> = pins.keys().collect();
    if gpus.is_empty() {
        why.push("the lane has no GPU".to_owned());
        return why;
    }
    use crate::receipt::DevicePhase;
    let slots = [
        (DevicePhase::Pre, &receipts.pre),
        (DevicePhase::Active, &receipts.active),
        (DevicePhase::Post, &receipts.post),
    ];
    // Pre, active and post, each in its place, in sequence and in time, and so each GPU's
    // samples: the last before, the one during, the first after.
    let in_order = slots
        .windows(2)
        .all(|w| w[0].1.seq < w[1].1.seq && w[0].1.at_ns <= w[1].1.at_ns);
    if !in_order || slots.iter().any(|(slot, r)| r.phase != *slot) {
        why.push("the receipts are not pre, active and post in sequence and time".to_owned());
    }
    for (i, uuid) in gpus.iter().enumerate() {
        let stamp = |r: &crate::receipt::DeviceReceipt, last: bool| {
            let s = r.samples.get(i)?;
            if last { s.last() } else { s.first() }.map(|x| x.at_ns)
        };
        let (pre, active, post) = (
            stamp(&receipts.pre, true),
            stamp(&receipts.active, true),
            stamp(&receipts.post, false),
        );
        if let (Some(p), Some(a), Some(q)) = (pre, active, post)
            && !(p <= a && a <= q)
        {
            why.push(format!("GPU {uuid}: its samples are not in time order"));
        }
    }
    for (slot, r) in slots {
        let phase = format!("{slot:?}").to_lowercase();
        if r.gpus.iter().collect::<Vec<_>>() != gpus || r.samples.len() != gpus.len() {
            why.push(format!(
                "the {phase} receipt does not cover exactly the lane's GPUs"
            ));
            continue;
        }
        let drained = !matches!(slot, DevicePhase::Active);
        if drained && r.config.len() != gpus.len() {
            why.push(format!("the {phase} receipt lacks a GPU's configuration"));
        }
        for (i, uuid) in gpus.iter().enumerate() {
            let samples = &r.samples[i];
            if drained {
                if let Some(seen) = r.config.get(i) {
                    for d in drift(&pins[*uuid], seen) {
                        why.push(format!("{phase}: GPU {uuid}: {d}"));
                    }
                }
                let n = usize::try_from(rule.samples).unwrap_or(usize::MAX);
                let idle = samples
                    .iter()
                    .rev()
                    .take_while(|s| busy(rule, s).is_empty())
                    .count();
                if idle < n {
                    why.push(format!(
                        "{phase}: GPU {uuid}: {idle} idle samples at the end, not {n}"
                    ));
                }
                if let Some(f) = samples.iter().map(faults).find(|f| !f.is_empty()) {
                    why.push(format!("{phase}: GPU {uuid}: {}", f.join(", ")));
                }
            } else {
                match samples.as_slice() {
                    [s] => why.extend(
                        envelope
                            .breaches(s)
                            .into_iter()
                            .map(|b| format!("{phase}: GPU {uuid}: {b}")),
                    ),
                    _ => why.push(format!("{phase}: GPU {uuid}: not one sample")),
                }
            }
        }
    }
    why
}

#[cfg(test)]
mod tests;
