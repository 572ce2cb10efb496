//! `cordon-materialize`: one target-scoped delta over an exact incumbent becomes a
//! content-addressed, read-only engine tree in the store.
//!
//! [`manifest`] reads the incumbent's and the delta's KDL manifests, [`guard`] is the tree
//! guard, [`analysis`] the candidate-facing request and answer its confined child computes and
//! the parent checks, [`python`] the AST policy and namespace rewrite (before it parses a file,
//! [`python_coding`] refuses encodings other than UTF-8 and [`python_nesting`] bounds its
//! nesting; [`python_rename`] checks and applies the rename's edits in the parent),
//! [`materialize`] the plan and its publication, [`cli`] the binary. Trees themselves (digest,
//! publication, verification) are the `cordon` library's [`cordon::tree`], because every stage
//! that mounts one verifies it.

#![forbid(unsafe_code)]

pub mod analysis;
pub mod cli;
pub mod guard;
pub mod manifest;
pub mod materialize;
pub mod python;
pub mod python_coding;
pub mod python_nesting;
pub mod python_rename;
