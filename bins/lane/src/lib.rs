//! `cordon-lane`: the runtime lane (seed 001 §4). Part 1 of the lane: one engine session in a
//! disposable container of the policy's `lane` stage, whose only channel is the framed protocol
//! the host drives and times ([`driver`]), started by cordon's own worker after it has reported
//! the posture from inside ([`session`]). Part 2 (roles B/C/B′, the speed verdict, device
//! receipts) builds on this.

pub mod cli;
pub mod driver;
pub mod model;
pub mod session;
pub mod speed;
pub mod workload;
