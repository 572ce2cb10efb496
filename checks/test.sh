#!/usr/bin/env bash
# The test command: formatting, lints, and the whole test suite. Exits non-zero on any failure.
# CI (.ci/run) calls exactly this after installing what the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo nextest run --workspace --no-fail-fast
