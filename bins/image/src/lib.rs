//! `cordon-image`: reproducible, digest-pinned OCI image layouts.
//!
//! [`spec`] reads an image spec (KDL); building, verifying and unpacking are the `cordon`
//! library's [`cordon::image`], because every container stage verifies and unpacks its image.

#![forbid(unsafe_code)]

pub mod cli;
pub mod spec;
