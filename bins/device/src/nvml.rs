//! The real seam: NVML, loaded at run time (`libnvidia-ml.so.1`), so a host without the driver
//! builds and runs everything else and fails here, with [`DeviceError::Unavailable`], only when
//! a GPU lane asks for its devices.
//!
//! Xid events are not a counter NVML can be asked for: a watcher thread registers every GPU the
//! guard was opened for and collects their critical Xid errors as they come; each sample takes
//! what arrived since the previous one. A watcher that fails makes every later sample
//! unreadable, never "no Xid".

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use nvml_wrapper::Nvml as Library;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use crate::{ComputeMode, DeviceConfig, DeviceError, Gpus, Sample};

/// What the watcher collected: Xid codes by GPU, or why it stopped.
type Watched = Arc<Mutex<Result<BTreeMap<String, Vec<u64>>, String>>>;

/// The GPUs the guard was opened for, read through NVML.
pub struct Nvml {
    nvml: &'static Library,
    xid: Watched,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").finish_non_exhaustive()
    }
}

/// The library's versioned name: what the driver installs (the unversioned link is a
/// development package's).
const LIBRARY: &str = "libnvidia-ml.so.1";

impl Nvml {
    /// Load NVML and watch the Xid events of `uuids`.
    ///
    /// # Errors
    /// [`DeviceError::Unavailable`]: no library or no driver; [`DeviceError::Missing`]: a GPU
    /// of `uuids` is not on this host.
    pub fn open(uuids: &[String]) -> Result<Self, DeviceError> {
        let nvml = Library::builder()
            .lib_path(std::ffi::OsStr::new(LIBRARY))
            .init()
            .map_err(|e| DeviceError::Unavailable { why: e.to_string() })?;
        // One library per process, for the process's lifetime: the watcher and every device
        // handle borrow it.
        let nvml: &'static Library = Box::leak(Box::new(nvml));
        for uuid in uuids {
            nvml.device_by_uuid(uuid.as_str())
                .map_err(|e| missing(uuid, &e))?;
        }
        let xid: Watched = Arc::new(Mutex::new(Ok(BTreeMap::new())));
        let (watched, names) = (xid.clone(), uuids.to_vec());
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cordon-xid".into())
            .spawn(move || watch(nvml, &names, &watched, &ready_tx))
            .map_err(|e| DeviceError::Unavailable {
                why: format!("the Xid watcher cannot start: {e}"),
            })?;
        // The watch is registered before the guard is used, so no event is missed.
        match ready.recv() {
            Ok(Ok(())) => Ok(Self { nvml, xid }),
            Ok(Err(why)) => Err(DeviceError::Unavailable { why }),
            Err(e) => Err(DeviceError::Unavailable {
                why: format!("the Xid watcher stopped: {e}"),
            }),
        }
    }

    fn device(&self, uuid: &str) -> Result<nvml_wrapper::Device<'static>, DeviceError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|e| missing(uuid, &e))
    }
}

/// The error of a fact `what` of GPU `uuid` that NVML would not give.
fn unreadable<'a>(uuid: &'a str, what: &'static str) -> impl Fn(NvmlError) -> DeviceError + 'a {
    move |e| DeviceError::Unreadable {
        uuid: uuid.to_owned(),
        what,
        why: e.to_string(),
    }
}

fn missing(uuid: &str, e: &NvmlError) -> DeviceError {
    DeviceError::Missing {
        uuid: uuid.to_owned(),
        why: e.to_string(),
    }
}

/// Register `uuids` for critical Xid errors, say so on `ready`, then collect events into
/// `watched` until the library fails.
fn watch(
    nvml: &'static Library,
    uuids: &[String],
    watched: &Watched,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
) {
    let registered = (|| -> Result<_, String> {
        let mut set = nvml.create_event_set().map_err(|e| e.to_string())?;
        for uuid in uuids {
            let device = nvml
                .device_by_uuid(uuid.as_str())
                .map_err(|e| e.to_string())?;
            set = device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| format!("{uuid}: {}", e.error))?;
        }
        Ok(set)
    })();
    let set = match registered {
        Ok(set) => {
            let _ = ready.send(Ok(()));
            set
        }
        Err(why) => {
            let _ = ready.send(Err(format!("cannot watch Xid events: {why}")));
            return;
        }
    };
    loop {
        let event = match set.wait(1000) {
            Ok(event) => event,
            Err(NvmlError::Timeout) => continue,
            Err(e) => {
                *watched.lock().unwrap_or_else(PoisonError::into_inner) =
                    Err(format!("the Xid watch failed: {e}"));
                return;
            }
        };
        let code = match event.event_data {
            Some(XidError::Value(v)) => v,
            // An Xid without its code is still an Xid.
            Some(XidError::Unknown) | None => u64::MAX,
        };
        let uuid = event.device.uuid().unwrap_or_default();
        if let Ok(by_gpu) = watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            by_gpu.entry(uuid).or_default().push(code);
        }
    }
}

impl Gpus for Nvml {
    fn config(&self, uuid: &str) -> Result<DeviceConfig, DeviceError> {
        let d = self.device(uuid)?;
        let read = |what| unreadable(uuid, what);
        let ecc = d.is_ecc_enabled().map_err(read("ECC mode"))?;
        let mig = d.mig_mode().map_err(read("MIG mode"))?;
        Ok(DeviceConfig {
            driver: self
                .nvml
                .sys_driver_version()
                .map_err(read("the driver version"))?,
            persistence: d
                .is_in_persistent_mode()
                .map_err(read("persistence mode"))?,
            compute_mode: match d.compute_mode().map_err(read("the compute mode"))? {
                nvml_wrapper::enum_wrappers::device::ComputeMode::Default => ComputeMode::Default,
                nvml_wrapper::enum_wrappers::device::ComputeMode::ExclusiveProcess => {
                    ComputeMode::ExclusiveProcess
                }
                nvml_wrapper::enum_wrappers::device::ComputeMode::Prohibited => {
                    ComputeMode::Prohibited
                }
                other => {
                    return Err(DeviceError::Unreadable {
                        uuid: uuid.to_owned(),
                        what: "the compute mode",
                        why: format!("{other:?} is no mode this guard knows"),
                    });
                }
            },
            application_clocks: (
                d.applications_clock(Clock::Graphics)
                    .map_err(read("the graphics application clock"))?,
                d.applications_clock(Clock::Memory)
                    .map_err(read("the memory application clock"))?,
            ),
            power_limit_mw: d
                .power_management_limit()
                .map_err(read("the power limit"))?,
            // A change pending until the next reset is a difference too.
            ecc: ecc.currently_enabled && ecc.pending_enabled,
            mig: mig.current != 0 || mig.pending != 0,
        })
    }

    fn sample(&self, uuid: &str, at_ns: u64) -> Result<Sample, DeviceError> {
        let d = self.device(uuid)?;
        let read = |what| unreadable(uuid, what);
        let processes = d
            .running_compute_processes()
            .map_err(read("the compute processes"))?;
        let xid = {
            let mut watched = self.xid.lock().unwrap_or_else(PoisonError::into_inner);
            match watched.as_mut() {
                Ok(by_gpu) => by_gpu.remove(uuid).unwrap_or_default(),
                Err(why) => {
                    return Err(DeviceError::Unreadable {
                        uuid: uuid.to_owned(),
                        what: "its Xid events",
                        why: why.clone(),
                    });
                }
            }
        };
        Ok(Sample {
            at_ns,
            utilisation: d.utilization_rates().map_err(read("the utilisation"))?.gpu,
            memory_used: d.memory_info().map_err(read("the memory"))?.used,
            processes: processes.iter().map(|p| p.pid).collect(),
            temperature_c: d
                .temperature(TemperatureSensor::Gpu)
                .map_err(read("the temperature"))?,
            clocks: (
                d.clock_info(Clock::Graphics)
                    .map_err(read("the graphics clock"))?,
                d.clock_info(Clock::Memory)
                    .map_err(read("the memory clock"))?,
            ),
            power_mw: d.power_usage().map_err(read("the power draw"))?,
            throttle: d
                .current_throttle_reasons()
                .map_err(read("the throttle reasons"))?
                .bits(),
            xid,
            retirement_pending: d
                .are_pages_pending_retired()
                .map_err(read("page retirement"))?,
        })
    }
}
