//! The drain: sampling a GPU through the seam until it is idle, on a clock that is a seam too.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use cordon_evidence::device::{DrainRule, Sample, busy, faults};

use crate::Gpus;

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

/// Sample GPU `uuid` every `rule.interval_ms` until `rule.samples` consecutive samples are
/// idle ([`busy`]), each read within `rule.sample_timeout_ms` and ended by `rule.timeout_ms`. A sample that fails or
/// comes late does not count and starts the count again; a fault ([`faults`]) ends the drain at once.
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
    let ms = Duration::from_millis;
    let (timeout, sample_timeout, interval) = (
        ms(rule.timeout_ms),
        ms(rule.sample_timeout_ms),
        ms(rule.interval_ms),
    );
    let start = clock.now();
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut samples = std::collections::VecDeque::new();
    let (mut read, mut failed) = (0u32, 0u32);
    let mut idle = 0u32;
    let mut why = "no sample was taken".to_owned();
    let not_drained = |why, samples: std::collections::VecDeque<Sample>| DrainError::NotDrained {
        uuid: uuid.to_owned(),
        timeout,
        why,
        samples: samples.into(),
    };
    loop {
        let before = clock.now();
        let sampled = gpus.sample(uuid, ns(before.saturating_sub(origin)));
        let after = clock.now();
        read = read.saturating_add(1);
        if after.saturating_sub(start) > timeout {
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
                if took > sample_timeout {
                    idle = 0;
                    why = format!("a sample took {took:?}, above {sample_timeout:?}");
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
        clock.sleep(interval);
    }
}

#[cfg(test)]
mod tests;
