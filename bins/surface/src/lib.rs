//! `cordon-surface`: an agent process and every shell command it runs bounded by one run's
//! project workspace (seed 002, ADR 0018), enforced by a real OCI runtime, run by a service that
//! is itself an unprivileged user.
//!
//! - [`within`]: the invariant as a pure predicate (`path_within`), and its host-resolving form;
//! - [`trust`]: what is checked before anything runs — the policy's path and writability, the
//!   workspace, the state directory, home and temp made without following links;
//! - [`run`]: one run applied (record, bundle, container, release with its absence proof) and
//!   the recovery of runs whose supervisor died;
//! - [`egress`]: `network "egress"`'s host proxy and the forwarder inside;
//! - [`skills`]: the skill store and a run's snapshot;
//! - [`perrun`]: root's side of `user "per-run"`;
//! - [`cli`]: the command and its receipt.
//!
//! Planning the container is `cordon_stage::surface` (pure); this crate owns applying it.

pub mod cli;
pub mod egress;
pub mod perrun;
pub mod run;
pub mod skills;
pub mod trust;
pub mod within;
