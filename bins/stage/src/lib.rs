//! Where the policy language meets the mechanisms.
//!
//! `cordon-policy-lang` knows what a policy says and nothing of hosts; `cordon` knows how to do
//! things to a host and nothing of policies. This crate is the one place that joins them:
//!
//! - [`args`]: the command-line options every stage binary flattens, and diagnostics output;
//! - [`start`]: the stage prologue — read and validate the policy, establish the authority
//!   identity on this host;
//! - [`settings`]: policy values → the mechanism library's settings (archive limits, account
//!   rules, the lease manager's setup), in one place;
//! - [`bundle`]: planning a typed policy stage into an OCI bundle, host mounts and session
//!   settings (pure, exhaustive);
//! - [`cdi`]: a lane GPU's container edits resolved from the host's CDI specs (pure), which
//!   the bundle applies;
//! - [`oci`]: the OCI spec pieces the bundle and surface planners share;
//! - [`session`]: one container of one stage under one lease, from validation to the absence
//!   proof — the sequence every container stage runs instead of copying it;
//! - [`host_fit`]: whether this host can honour a candidate stage (memory against the policy's
//!   reserve, the side-channel posture), before anything is leased;
//! - [`parser`]: a stage's confined parser child under its own lease (fetch, materialize);
//! - [`compile`]: the sealed-direct-artifact tier's compile request, derived from the tree;
//! - [`publication`]: a publication reopened and its control record checked against the
//!   authority and the tree a stage runs;
//! - [`receipt_io`]: reading an input receipt and emitting the one output receipt;
//! - [`evidence`]: what a stage preserved of a run, named by its receipt;
//! - [`surface`]: planning the agent surface's rootless container (pure).
//!
//! It does not parse KDL (the language crate does) or touch the kernel itself (the mechanism
//! library does, behind its host seam).

pub mod args;
pub mod bundle;
pub mod cdi;
pub mod compile;
pub mod evidence;
pub mod host_fit;
pub mod oci;
pub mod parser;
mod plan_error;
pub mod posture;
pub mod publication;
pub mod receipt_io;
pub mod session;
pub mod settings;
pub mod start;
pub mod surface;
