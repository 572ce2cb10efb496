//! `cordon-reap`: startup recovery and proof of quiescence for one executor.
//!
//! [`cli::run`] is the whole binary; the mechanism (records, release, recovery, the check) is
//! the `cordon` library's [`cordon::lease`], which every container stage uses.

#![forbid(unsafe_code)]

pub mod cli;
