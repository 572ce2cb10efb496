//! `cordon-lane`: the runtime lane (seed 001 §4). One engine session in a disposable container
//! of the policy's `lane` stage, whose only channel is the framed protocol the host drives and
//! times ([`driver`]), started by cordon's own worker after it has reported the posture from
//! inside ([`session`]), under the host-global lock that serializes GPU work ([`lock`]). A
//! speed qualification runs three such sessions — B, C, B′ on the policy's physical lanes —
//! and decides from the host's own stamps ([`qualify`]; the rule is `cordon_evidence::speed`).
//! On a GPU lane, the device guard checks each read's GPUs before, during and after it
//! ([`guard`]).

pub mod apart;
pub mod cli;
pub mod devices;
pub mod driver;
pub mod guard;
pub mod lock;
pub mod model;
pub mod qualify;
pub mod session;
pub use cordon_evidence::speed;
pub mod workload;
