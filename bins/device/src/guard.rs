//! The checks over what the seam reports: configuration drift, drain, the active envelope.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{DeviceConfig, Gpus, Sample, throttle_names};

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
    /// Consecutive idle samples needed (at least one).
    pub samples: u32,
    /// Between two samples (at least [`DrainRule::MIN_INTERVAL`]).
    pub interval: Duration,
    /// A sample that takes longer is late: it does not count, and the count starts again.
    pub sample_timeout: Duration,
    /// The whole drain's deadline: every sample that counts has ended by it.
    pub timeout: Duration,
    /// The most device memory an idle GPU may show allocated (the driver's own), bytes.
    pub idle_memory: u64,
}

impl DrainRule {
    /// The shortest interval between samples: NVML's utilisation is itself an average over a
    /// period of this order, and a tighter loop only grows the record.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

    /// Why this rule cannot decide a drain (`None`: it can).
    #[must_use]
    pub fn unsound(&self) -> Option<String> {
        if self.samples == 0 {
            Some("a drain of zero samples proves nothing".to_owned())
        } else if self.interval < Self::MIN_INTERVAL {
            Some(format!(
                "an interval of {:?}, below {:?}",
                self.interval,
                Self::MIN_INTERVAL
            ))
        } else if self.sample_timeout > self.timeout {
            Some(format!(
                "a sample timeout of {:?}, above the drain's {:?}",
                self.sample_timeout, self.timeout
            ))
        } else {
            None
        }
    }
}

/// The most samples a drain keeps (the last ones; the count of the rest is kept).
pub const KEPT_SAMPLES: usize = 256;

/// A drain that held: its last samples, the last `samples` of them idle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drained {
    /// The last samples read, in order (at most [`KEPT_SAMPLES`]; the idle run at the end).
    pub samples: Vec<Sample>,
    /// How many samples were read in all, and how many of the reads failed.
    pub read: (u32, u32),
    /// How long it took, ns.
    pub took_ns: u64,
}

/// Why a drain did not hold.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The rule cannot decide a drain.
    #[error("the drain rule is unsound: {0}")]
    Rule(String),
    /// The deadline passed before enough consecutive idle samples.
    #[error("GPU {uuid} did not drain within {timeout:?}: {why}")]
    NotDrained {
        /// The GPU.
        uuid: String,
        /// The rule's deadline.
        timeout: Duration,
        /// Why the last sample did not count.
        why: String,
        /// The last samples read.
        samples: Vec<Sample>,
    },
    /// A sample showed a fault: the device owes a reset, and what ran on it measured nothing.
    #[error("GPU {uuid} faulted: {why}")]
    Faulted {
        /// The GPU.
        uuid: String,
        /// The fault.
        why: String,
        /// The last samples read, the faulted one last.
        samples: Vec<Sample>,
    },
}

/// Why `s` is not idle under `rule` (empty: idle).
fn busy(rule: &DrainRule, s: &Sample) -> Vec<String> {
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
fn faults(s: &Sample) -> Vec<String> {
    let mut why = Vec::new();
    if !s.xid.is_empty() {
        why.push(format!("Xid events {:?}", s.xid));
    }
    if s.retirement_pending {
        why.push("memory pending retirement or remapping".to_owned());
    }
    why
}

/// Sample GPU `uuid` every `rule.interval` until `rule.samples` consecutive samples are idle,
/// each read within `rule.sample_timeout` and ended by `rule.timeout`. A sample that fails or
/// comes late does not count and starts the count again; a fault ends the drain at once.
/// Samples are stamped in ns since `origin` on `clock` (the caller's read, so the pre, active
/// and post samples of one read order on one scale).
///
/// # Errors
/// [`DrainError::Rule`], [`DrainError::NotDrained`] with the last samples and why the last
/// did not count, [`DrainError::Faulted`].
pub fn drain(
    gpus: &dyn Gpus,
    clock: &dyn Clock,
    origin: Duration,
    uuid: &str,
    rule: &DrainRule,
) -> Result<Drained, DrainError> {
    if let Some(why) = rule.unsound() {
        return Err(DrainError::Rule(why));
    }
    let start = clock.now();
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut samples = std::collections::VecDeque::new();
    let (mut read, mut failed) = (0u32, 0u32);
    let mut idle = 0u32;
    let mut why = "no sample was taken".to_owned();
    let not_drained = |why, samples: std::collections::VecDeque<Sample>| DrainError::NotDrained {
        uuid: uuid.to_owned(),
        timeout: rule.timeout,
        why,
        samples: samples.into(),
    };
    loop {
        let before = clock.now();
        let sampled = gpus.sample(uuid, ns(before.saturating_sub(origin)));
        let after = clock.now();
        read = read.saturating_add(1);
        if after.saturating_sub(start) > rule.timeout {
            // Ended past the deadline: it cannot count.
            return Err(not_drained(why, samples));
        }
        let took = after.saturating_sub(before);
        match sampled {
            Err(e) => {
                failed = failed.saturating_add(1);
                idle = 0;
                why = format!("a sample failed: {e}");
            }
            Ok(s) => {
                let fault = faults(&s);
                let not_idle = busy(rule, &s);
                if samples.len() == KEPT_SAMPLES {
                    samples.pop_front();
                }
                samples.push_back(s);
                if !fault.is_empty() {
                    return Err(DrainError::Faulted {
                        uuid: uuid.to_owned(),
                        why: fault.join(", "),
                        samples: samples.into(),
                    });
                }
                if took > rule.sample_timeout {
                    idle = 0;
                    why = format!("a sample took {took:?}, above {:?}", rule.sample_timeout);
                } else if not_idle.is_empty() {
                    idle += 1;
                } else {
                    idle = 0;
                    why = not_idle.join(", ");
                }
            }
        }
        if idle >= rule.samples {
            return Ok(Drained {
                samples: samples.into(),
                read: (read, failed),
                took_ns: ns(clock.now().saturating_sub(start)),
            });
        }
        clock.sleep(rule.interval);
    }
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

#[cfg(test)]
mod tests;
