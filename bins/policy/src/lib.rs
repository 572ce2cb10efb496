//! The `cordon-policy` reviewer tool over the policy language: `check`, `identity`, `diff` and
//! `explain` (with `--bundle`, the OCI `config.json` a stage would run with). Everything the
//! binary does is in [`cli`]; the language itself is `cordon-policy-lang`.

#![forbid(unsafe_code)]

pub mod cli;
pub mod render;
