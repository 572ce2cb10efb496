//! The scripted seam: GPUs whose configuration and samples a test sets, and a clock that only
//! moves when told (a sample can be made slow, a drain's deadline passes without waiting).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::{Clock, DeviceConfig, DeviceError, Gpus, Sample};

/// A clock that moves only by [`Clock::sleep`] and [`FakeClock::advance`].
#[derive(Debug, Default)]
pub struct FakeClock(Mutex<Duration>);

impl FakeClock {
    /// Move the clock on by `d`.
    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += d;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sleep(&self, d: Duration) {
        self.advance(d);
    }
}

/// One scripted answer to a sample: the sample (or a failure) and how long reading it takes.
#[derive(Debug, Clone)]
pub struct Step {
    /// The sample, or `None` for an unreadable one.
    pub sample: Option<Sample>,
    /// How long the read takes on the fake clock.
    pub takes: Duration,
}

impl Step {
    /// An idle sample read at once.
    #[must_use]
    pub fn idle() -> Self {
        Self {
            sample: Some(idle_sample()),
            takes: Duration::ZERO,
        }
    }

    /// A sample `edit` made of an idle one, read at once.
    #[must_use]
    pub fn with(edit: impl FnOnce(&mut Sample)) -> Self {
        let mut s = idle_sample();
        edit(&mut s);
        Self {
            sample: Some(s),
            takes: Duration::ZERO,
        }
    }

    /// A sample that cannot be read.
    #[must_use]
    pub fn failing() -> Self {
        Self {
            sample: None,
            takes: Duration::ZERO,
        }
    }

    /// This step, taking `d` to read.
    #[must_use]
    pub fn taking(self, d: Duration) -> Self {
        Self { takes: d, ..self }
    }
}

pub use cordon_evidence::examples::{device_config as pinned_config, idle_sample};

#[derive(Debug, Default)]
struct Gpu {
    config: Option<DeviceConfig>,
    minor: Option<u32>,
    steps: VecDeque<Step>,
    /// The step answered once the script ran out (the last one, repeated).
    last: Option<Step>,
    /// How many samples were read.
    sampled: u32,
}

/// Scripted GPUs by UUID; a GPU not set up is missing.
#[derive(Debug)]
pub struct Fake {
    clock: Arc<FakeClock>,
    gpus: Mutex<BTreeMap<String, Gpu>>,
}

impl Fake {
    /// No GPUs, on `clock`.
    #[must_use]
    pub fn new(clock: Arc<FakeClock>) -> Self {
        Self {
            clock,
            gpus: Mutex::default(),
        }
    }

    fn with_gpu<T>(&self, uuid: &str, f: impl FnOnce(&mut Gpu) -> T) -> T {
        let mut gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        f(gpus.entry(uuid.to_owned()).or_default())
    }

    /// GPU `uuid` reports `config` (`None`: unreadable).
    pub fn config_of(&self, uuid: &str, config: Option<DeviceConfig>) -> &Self {
        self.with_gpu(uuid, |g| g.config = config);
        self
    }

    /// GPU `uuid`'s device node has minor number `minor` (`None`: unreadable).
    pub fn minor_of(&self, uuid: &str, minor: Option<u32>) -> &Self {
        self.with_gpu(uuid, |g| g.minor = minor);
        self
    }

    /// GPU `uuid` answers its next samples with `steps`, then the last of them forever.
    pub fn script(&self, uuid: &str, steps: impl IntoIterator<Item = Step>) -> &Self {
        self.with_gpu(uuid, |g| g.steps.extend(steps));
        self
    }

    /// How many samples of GPU `uuid` were read (0: none, or no such GPU).
    #[must_use]
    pub fn sampled(&self, uuid: &str) -> u32 {
        let gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        gpus.get(uuid).map_or(0, |g| g.sampled)
    }
}

impl Gpus for Fake {
    fn config(&self, uuid: &str) -> Result<DeviceConfig, DeviceError> {
        let gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        let gpu = gpus.get(uuid).ok_or_else(|| DeviceError::Missing {
            uuid: uuid.to_owned(),
            why: "not set up in the fake".to_owned(),
        })?;
        gpu.config.clone().ok_or_else(|| DeviceError::Unreadable {
            uuid: uuid.to_owned(),
            what: "the configuration",
            why: "scripted".to_owned(),
        })
    }

    fn minor(&self, uuid: &str) -> Result<u32, DeviceError> {
        let gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        gpus.get(uuid)
            .and_then(|g| g.minor)
            .ok_or_else(|| DeviceError::Unreadable {
                uuid: uuid.to_owned(),
                what: "the device node's minor number",
                why: "scripted".to_owned(),
            })
    }

    fn sample(&self, uuid: &str, at_ns: u64) -> Result<Sample, DeviceError> {
        let step = {
            let mut gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
            let gpu = gpus.get_mut(uuid).ok_or_else(|| DeviceError::Missing {
                uuid: uuid.to_owned(),
                why: "not set up in the fake".to_owned(),
            })?;
            gpu.sampled += 1;
            let step = gpu.steps.pop_front().or_else(|| gpu.last.clone());
            if let Some(s) = &step {
                gpu.last = Some(s.clone());
            }
            step.unwrap_or_else(Step::idle)
        };
        self.clock.advance(step.takes);
        step.sample
            .map(|s| Sample { at_ns, ..s })
            .ok_or_else(|| DeviceError::Unreadable {
                uuid: uuid.to_owned(),
                what: "a sample",
                why: "scripted".to_owned(),
            })
    }
}
