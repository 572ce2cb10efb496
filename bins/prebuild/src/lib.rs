//! `cordon-prebuild`: one disposable build container per materialized tree and registered
//! step, then a sealed native publication.
//!
//! [`inventory`] walks the staging area after the container exits (fd-based, no-follow) and
//! enforces the publication rules; [`aot`] is the sealed-direct-artifact tier's compile ABI
//! (the request, the result layout, the profile decoded by a confined child); [`prebuild`] is
//! the stage (parse → plan → apply); [`cli`] is the binary. Containers, leases and accounts are the `cordon` library's.

#![forbid(unsafe_code)]

pub mod aot;
pub mod cli;
pub mod inventory;
pub mod prebuild;
