//! The GPU device guard: what the host establishes of a lane's GPUs before, during and after a
//! session, through one seam ([`Gpus`]) whose real implementation is NVML ([`nvml::Nvml`],
//! loaded at run time, so a host without the driver builds and tests with [`fake::Fake`]).
//!
//! It owns four checks, each pure over what the seam reports:
//! - **the pinned configuration** ([`DeviceConfig`], [`drift`]): persistence mode, compute
//!   mode, application clocks, power limit, ECC, MIG mode and the driver version, as the
//!   policy pins them; read before and after every session, and any difference is terminal for
//!   the lane (the caller's no-decision and quarantine);
//! - **drain** ([`drain`]): consecutive idle samples (no compute or graphics process, kernel
//!   and memory utilisation zero, memory at most the idle bound) within a deadline; a sample
//!   that fails or comes late resets the count; any fault seen (an Xid event, memory pending
//!   retirement or remapping) fails it, since a device that faulted during a session measured
//!   nothing; a device that does not drain is a no-decision;
//! - **the active envelope** ([`Envelope`]): one sample during the last warmup request, inside
//!   the policy's bounds (temperature, power, clocks, no forbidden throttle reason);
//! - the **telemetry** itself ([`Sample`]): every fact sampled is kept in the receipts.
//!
//! What it does not own: which GPUs a lane has and what the policy pins (the language's and the
//! lane's), the receipts that carry these facts and what a failure means for the run (the
//! lane's), and the not-reusable mark a failed drain leaves on a lane (the lane's store).

pub mod fake;
mod guard;
pub mod nvml;

pub use guard::{Clock, DrainError, DrainRule, Drained, Envelope, SystemClock, drain, drift};

use serde::{Deserialize, Serialize};

/// How contexts may share a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// What the seam could not establish.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum DeviceError {
    /// The management library is not there or would not start (no driver on this host).
    #[error("the GPU management library cannot be used: {why}")]
    #[diagnostic(
        code(cordon::device::unavailable),
        help("a GPU lane needs the NVIDIA driver and libnvidia-ml.so.1 on the host")
    )]
    Unavailable {
        /// What the library said.
        why: String,
    },
    /// The policy names a GPU the host does not have.
    #[error("no GPU {uuid} on this host: {why}")]
    #[diagnostic(
        code(cordon::device::missing),
        help("a lane's GPUs are named by UUID (`nvidia-smi -L` lists them)")
    )]
    Missing {
        /// The GPU's UUID.
        uuid: String,
        /// What the library said.
        why: String,
    },
    /// A fact could not be read.
    #[error("cannot read {what} of GPU {uuid}: {why}")]
    #[diagnostic(
        code(cordon::device::unreadable),
        help("a device fact that cannot be read is never assumed fine")
    )]
    Unreadable {
        /// The GPU's UUID.
        uuid: String,
        /// Which fact.
        what: &'static str,
        /// What the library said.
        why: String,
    },
}

/// The seam: what the host reads of its GPUs. [`nvml::Nvml`] is the real one, [`fake::Fake`]
/// the scripted one.
pub trait Gpus: Send + Sync {
    /// The configuration of GPU `uuid`.
    ///
    /// # Errors
    /// The GPU or a fact of it cannot be read.
    fn config(&self, uuid: &str) -> Result<DeviceConfig, DeviceError>;

    /// One telemetry sample of GPU `uuid`, stamped `at_ns`.
    ///
    /// # Errors
    /// The GPU or a fact of it cannot be read.
    fn sample(&self, uuid: &str, at_ns: u64) -> Result<Sample, DeviceError>;
}
