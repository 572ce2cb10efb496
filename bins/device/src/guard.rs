//! The checks over what the seam reports: configuration drift, drain, the active envelope.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{DeviceConfig, DeviceError, Gpus, Sample, throttle_names};

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
    want(seen.ecc == *ecc, format!("ECC {}, not {ecc}", seen.ecc));
    want(seen.mig == *mig, format!("MIG {}, not {mig}", seen.mig));
    d
}

/// The guard's clock: monotonic time and sleeping, a seam so the drain's deadlines are tested
/// without waiting.
pub trait Clock {
    /// Time since an arbitrary fixed start.
    fn now(&self) -> Duration;
    /// Wait `d`.
    fn sleep(&self, d: Duration);
}

/// The host's monotonic clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// What "drained" means, from the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRule {
    /// Consecutive idle samples needed.
    pub samples: u32,
    /// Between two samples.
    pub interval: Duration,
    /// A sample that takes longer is late: it does not count, and the count starts again.
    pub sample_timeout: Duration,
    /// The whole drain's deadline.
    pub timeout: Duration,
    /// The most device memory an idle GPU may show allocated (the driver's own), bytes.
    pub idle_memory: u64,
}

/// A drain that held: the samples that made it, the last `samples` of them idle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drained {
    /// Every sample taken, in order (the idle run at the end).
    pub samples: Vec<Sample>,
    /// How long it took, ns.
    pub took_ns: u64,
}

/// Why a drain did not hold.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The deadline passed before enough consecutive idle samples.
    #[error("GPU {uuid} did not drain within {timeout:?}: {why}")]
    NotDrained {
        /// The GPU.
        uuid: String,
        /// The rule's deadline.
        timeout: Duration,
        /// Why the last sample was not idle (or failed).
        why: String,
        /// Every sample taken.
        samples: Vec<Sample>,
    },
}

/// Why `s` is not idle under `rule` (empty: idle).
fn busy(rule: &DrainRule, s: &Sample) -> Vec<String> {
    let mut why = Vec::new();
    if !s.processes.is_empty() {
        why.push(format!("compute processes {:?}", s.processes));
    }
    if s.utilisation != 0 {
        why.push(format!("utilisation {}%", s.utilisation));
    }
    if s.memory_used > rule.idle_memory {
        why.push(format!(
            "{} bytes of memory allocated, above {}",
            s.memory_used, rule.idle_memory
        ));
    }
    if !s.xid.is_empty() {
        why.push(format!("Xid events {:?}", s.xid));
    }
    if s.retirement_pending {
        why.push("pages pending retirement".to_owned());
    }
    why
}

/// Sample GPU `uuid` every `rule.interval` until `rule.samples` consecutive samples are idle,
/// within `rule.timeout`. A sample that fails or takes longer than `rule.sample_timeout` does
/// not count and starts the count again.
///
/// # Errors
/// [`DrainError::NotDrained`] with every sample taken and why the last did not count.
pub fn drain(
    gpus: &dyn Gpus,
    clock: &dyn Clock,
    uuid: &str,
    rule: &DrainRule,
) -> Result<Drained, DrainError> {
    let start = clock.now();
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut samples = Vec::new();
    let mut idle = 0u32;
    let mut why = "no sample was taken".to_owned();
    loop {
        let before = clock.now();
        if before.saturating_sub(start) > rule.timeout {
            return Err(DrainError::NotDrained {
                uuid: uuid.to_owned(),
                timeout: rule.timeout,
                why,
                samples,
            });
        }
        let read = gpus.sample(uuid, ns(before.saturating_sub(start)));
        let took = clock.now().saturating_sub(before);
        match read {
            Err(e) => {
                idle = 0;
                why = sample_failed(&e);
            }
            Ok(s) => {
                let not_idle = busy(rule, &s);
                if took > rule.sample_timeout {
                    idle = 0;
                    why = format!("a sample took {took:?}, above {:?}", rule.sample_timeout);
                } else if not_idle.is_empty() {
                    idle += 1;
                } else {
                    idle = 0;
                    why = not_idle.join(", ");
                }
                samples.push(s);
            }
        }
        if idle >= rule.samples {
            return Ok(Drained {
                samples,
                took_ns: ns(clock.now().saturating_sub(start)),
            });
        }
        clock.sleep(rule.interval);
    }
}

fn sample_failed(e: &DeviceError) -> String {
    format!("a sample failed: {e}")
}

/// The bounds the active sample must be inside, from the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// How `s` breaks the envelope (empty: inside it). Xid events and pending retirement
    /// break it too: a device that faults while measured measured nothing.
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
        if !s.xid.is_empty() {
            b.push(format!("Xid events {:?}", s.xid));
        }
        if s.retirement_pending {
            b.push("pages pending retirement".to_owned());
        }
        b
    }
}

#[cfg(test)]
mod tests;
