//! `cordon-materialize`: one target-scoped delta over an exact incumbent becomes a
//! content-addressed, read-only engine tree in the store.
//!
//! [`manifest`] reads the incumbent's and the delta's KDL manifests, [`guard`] is the tree
//! guard, [`python`] the AST policy and namespace rewrite, [`materialize`] the plan and its
//! publication, [`cli`] the binary. Trees themselves (digest, publication, verification) are
//! the `cordon` library's [`cordon::tree`], because every stage that mounts one verifies it.

#![forbid(unsafe_code)]

pub mod cli;
pub mod guard;
pub mod manifest;
pub mod materialize;
pub mod python;
