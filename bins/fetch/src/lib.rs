//! `cordon-fetch`: private intake. A local archive or an `https://` source becomes content
//! objects and an intake record in the store, or nothing at all.
//!
//! [`cli::run`] is the whole binary; [`transport`] is the remote side's parent, [`transfer`]
//! its confined child, which alone speaks TLS and HTTP, and [`resolve`] the name resolution,
//! whose DNS answers only its own confined child parses. Archive shape rules and
//! the store discipline live in the `cordon` library ([`cordon::archive`], [`cordon::intake`]).

#![forbid(unsafe_code)]

pub mod cli;
pub mod resolve;
pub mod transfer;
pub mod transport;
