//! The GPU device guard: what the host establishes of a lane's GPUs before, during and after a
//! session, through one seam ([`Gpus`]) whose real implementation is NVML ([`nvml::Nvml`],
//! loaded at run time, so a host without the driver builds and tests with [`fake::Fake`]).
//!
//! The facts and the pure rules over them are `cordon_evidence::device`'s (receipts carry them
//! and `cordon-verify` recomputes them); this crate owns reading them and the drain's loop.
//! The checks, each pure over what the seam reports:
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
//! lane's), a GPU's container edits (`cordon_stage::cdi`, which the bundle applies), and the
//! not-reusable mark a failed drain leaves on a lane (the lane's store).

pub mod fake;
mod guard;
pub mod nvml;

pub use cordon_evidence::device::{
    ComputeMode, DeviceConfig, DrainRule, Envelope, Sample, THROTTLE_REASONS, drift, throttle_names,
};
pub use guard::{Clock, DrainError, Drained, KEPT_SAMPLES, SystemClock, drain};

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

    /// The minor number of GPU `uuid`'s device node (`/dev/nvidia<minor>`, major
    /// [`NVIDIA_MAJOR`]): how the host knows which node a container got is which GPU.
    ///
    /// # Errors
    /// The GPU or its minor number cannot be read.
    fn minor(&self, uuid: &str) -> Result<u32, DeviceError>;
}

/// The major number of NVIDIA's character devices: a GPU's node has minor 0 to
/// [`GPU_MINOR_MAX`]; `nvidia-modeset` (254) and `nvidiactl` (255) are the driver's own.
pub const NVIDIA_MAJOR: u64 = 195;

/// The highest minor number a GPU's own node has.
pub const GPU_MINOR_MAX: u64 = 253;
