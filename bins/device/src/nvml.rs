//! The real seam: NVML, loaded at run time (`libnvidia-ml.so.1`), so a host without the driver
//! builds and runs everything else and fails here, with [`DeviceError::Unavailable`], only when
//! a GPU lane asks for its devices.
//!
//! Xid events are not a counter NVML can be asked for: a watcher thread registers every GPU the
//! guard was opened for and collects their critical Xid errors as they come; a sample takes
//! what arrived since the previous one, once every other fact of it was read. A watcher that
//! fails or ends, or an event it cannot place, makes every later sample unreadable — never "no
//! Xid". A GPU the guard does not watch cannot be sampled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use nvml_wrapper::Nvml as Library;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{Bits, NvmlError};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
};

use crate::{ComputeMode, DeviceConfig, DeviceError, Gpus, Sample};

/// What the watcher collected: Xid codes by watched GPU, or why the watch stopped.
type Watched = Arc<Mutex<Result<BTreeMap<String, Vec<u64>>, String>>>;

/// The GPUs the guard was opened for, read through NVML.
pub struct Nvml {
    nvml: &'static Library,
    xid: Watched,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").finish_non_exhaustive()
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // The watcher sees it at its next wait's end (a second at most) and leaves.
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The library's versioned name: what the driver installs (the unversioned link is a
/// development package's).
const LIBRARY: &str = "libnvidia-ml.so.1";

/// The process's one library, loaded once and kept for the process's lifetime (the watcher and
/// every device handle borrow it), or why it would not load.
fn library() -> Result<&'static Library, DeviceError> {
    static ONE: OnceLock<Result<Library, String>> = OnceLock::new();
    ONE.get_or_init(|| {
        Library::builder()
            .lib_path(std::ffi::OsStr::new(LIBRARY))
            .init()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|why| DeviceError::Unavailable { why: why.clone() })
}

impl Nvml {
    /// Load NVML and watch the Xid events of `uuids`, the only GPUs this guard samples.
    ///
    /// # Errors
    /// [`DeviceError::Unavailable`]: no library, no driver or no watch; [`DeviceError::Missing`]:
    /// a GPU of `uuids` is not on this host.
    pub fn open(uuids: &[String]) -> Result<Self, DeviceError> {
        let nvml = library()?;
        for uuid in uuids {
            nvml.device_by_uuid(uuid.as_str())
                .map_err(|e| missing(uuid, &e))?;
        }
        let watching = uuids.iter().map(|u| (u.clone(), Vec::new())).collect();
        let xid: Watched = Arc::new(Mutex::new(Ok(watching)));
        let stop = Arc::new(AtomicBool::new(false));
        let (watched, stopped, names) = (xid.clone(), stop.clone(), uuids.to_vec());
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cordon-xid".into())
            .spawn(move || {
                // However the watch ends (a failure, a panic), unless asked to stop, every
                // later sample is unreadable.
                let _ended = Ended(&watched, &stopped);
                watch(nvml, &names, &watched, &stopped, &ready_tx);
            })
            .map_err(|e| DeviceError::Unavailable {
                why: format!("the Xid watcher cannot start: {e}"),
            })?;
        // The watch is registered before the guard is used, so no event is missed.
        match ready.recv() {
            Ok(Ok(())) => Ok(Self { nvml, xid, stop }),
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

/// Marks the watch failed when the watcher's thread ends without being asked to.
struct Ended<'a>(&'a Watched, &'a AtomicBool);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        if !self.1.load(Ordering::SeqCst) {
            let mut w = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if w.is_ok() {
                *w = Err("the Xid watcher ended".to_owned());
            }
        }
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
/// `watched` until the library fails or `stop` is set.
fn watch(
    nvml: &'static Library,
    uuids: &[String],
    watched: &Watched,
    stop: &AtomicBool,
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
    let fail = |why: String| {
        *watched.lock().unwrap_or_else(PoisonError::into_inner) = Err(why);
    };
    while !stop.load(Ordering::SeqCst) {
        let event = match set.wait(1000) {
            Ok(event) => event,
            Err(NvmlError::Timeout) => continue,
            Err(e) => return fail(format!("the Xid watch failed: {e}")),
        };
        let code = match event.event_data {
            Some(XidError::Value(v)) => v,
            // An Xid without its code is still an Xid.
            Some(XidError::Unknown) | None => u64::MAX,
        };
        let uuid = match event.device.uuid() {
            Ok(uuid) => uuid,
            Err(e) => return fail(format!("an Xid event of an unnamed GPU: {e}")),
        };
        let mut w = watched.lock().unwrap_or_else(PoisonError::into_inner);
        match w.as_mut().map(|by_gpu| by_gpu.get_mut(&uuid)) {
            Ok(Some(codes)) => codes.push(code),
            Ok(None) => *w = Err(format!("an Xid event of an unwatched GPU {uuid}")),
            Err(_) => {}
        }
    }
}

/// A field value as an integer, or why there is none.
fn field(sample: Option<Result<FieldValueSample, NvmlError>>) -> Result<u64, NvmlError> {
    match sample.ok_or(NvmlError::Unknown)??.value? {
        SampleValue::U32(v) => Ok(u64::from(v)),
        SampleValue::U64(v) => Ok(v),
        SampleValue::I64(v) => u64::try_from(v).map_err(|_| NvmlError::Unknown),
        SampleValue::F64(_) => Err(NvmlError::Unknown),
    }
}

impl Gpus for Nvml {
    fn config(&self, uuid: &str) -> Result<DeviceConfig, DeviceError> {
        let d = self.device(uuid)?;
        let read = |what| unreadable(uuid, what);
        let ecc = d.is_ecc_enabled().map_err(read("ECC mode"))?;
        let mig = d.mig_mode().map_err(read("MIG mode"))?;
        let mode = d.compute_mode().map_err(read("the compute mode"))?;
        use nvml_wrapper::enum_wrappers::device::ComputeMode as Mode;
        let compute_mode = match mode {
            Mode::Default => ComputeMode::Default,
            Mode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
            Mode::Prohibited => ComputeMode::Prohibited,
            Mode::ExclusiveThread => {
                return Err(DeviceError::Unreadable {
                    uuid: uuid.to_owned(),
                    what: "the compute mode",
                    why: "exclusive-thread is no mode this guard knows".to_owned(),
                });
            }
        };
        Ok(DeviceConfig {
            driver: self
                .nvml
                .sys_driver_version()
                .map_err(read("the driver version"))?,
            persistence: d
                .is_in_persistent_mode()
                .map_err(read("persistence mode"))?,
            compute_mode,
            application_clocks: (
                d.applications_clock(Clock::Graphics)
                    .map_err(read("the graphics application clock"))?,
                d.applications_clock(Clock::Memory)
                    .map_err(read("the memory application clock"))?,
            ),
            power_limit_mw: d
                .enforced_power_limit()
                .map_err(read("the enforced power limit"))?,
            ecc: (ecc.currently_enabled, ecc.pending_enabled),
            mig: (mig.current != 0, mig.pending != 0),
        })
    }

    fn minor(&self, uuid: &str) -> Result<u32, DeviceError> {
        self.device(uuid)?
            .minor_number()
            .map_err(unreadable(uuid, "the device node's minor number"))
    }

    fn sample(&self, uuid: &str, at_ns: u64) -> Result<Sample, DeviceError> {
        let d = self.device(uuid)?;
        let read = |what| unreadable(uuid, what);
        let mut processes: Vec<u32> = d
            .running_compute_processes()
            .map_err(read("the compute processes"))?
            .iter()
            .chain(
                &d.running_graphics_processes()
                    .map_err(read("the graphics processes"))?,
            )
            .map(|p| p.pid)
            .collect();
        processes.sort_unstable();
        processes.dedup();
        let utilisation = d.utilization_rates().map_err(read("the utilisation"))?;
        // Row remapping is how Ampere and later retire memory (the older page retirement is
        // not supported there): pending, or failed, the device owes a reset.
        let remap = d
            .field_values_for(&[
                FieldId(NVML_FI_DEV_REMAPPED_PENDING),
                FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
            ])
            .map_err(read("row remapping"))?;
        let mut remap = remap.into_iter();
        let pending = field(remap.next()).map_err(read("pending row remapping"))?;
        let failed = field(remap.next()).map_err(read("failed row remapping"))?;
        let remapping = pending != 0 || failed != 0;
        let retirement = match d.are_pages_pending_retired() {
            Ok(pending) => pending,
            // Not a fact of this architecture: row remapping above stands for it.
            Err(NvmlError::NotSupported) => false,
            Err(e) => return Err(read("page retirement")(e)),
        };
        // Every bit the driver reports, named or not.
        let throttle = match d.current_throttle_reasons_strict() {
            Ok(r) => r.bits(),
            Err(NvmlError::IncorrectBits(Bits::U64(bits))) => bits,
            Err(e) => return Err(read("the throttle reasons")(e)),
        };
        let mut sample = Sample {
            at_ns,
            utilisation: utilisation.gpu,
            memory_utilisation: utilisation.memory,
            memory_used: d.memory_info().map_err(read("the memory"))?.used,
            processes,
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
            throttle,
            xid: Vec::new(),
            retirement_pending: retirement || remapping,
        };
        // Last, once every other fact is read: a failed sample leaves its Xids for the next.
        let mut watched = self.xid.lock().unwrap_or_else(PoisonError::into_inner);
        match watched.as_mut().map(|by_gpu| by_gpu.get_mut(uuid)) {
            Ok(Some(codes)) => sample.xid = std::mem::take(codes),
            Ok(None) => {
                return Err(DeviceError::Unreadable {
                    uuid: uuid.to_owned(),
                    what: "its Xid events",
                    why: "this guard was not opened for it".to_owned(),
                });
            }
            Err(why) => {
                return Err(DeviceError::Unreadable {
                    uuid: uuid.to_owned(),
                    what: "its Xid events",
                    why: why.clone(),
                });
            }
        }
        Ok(sample)
    }
}
