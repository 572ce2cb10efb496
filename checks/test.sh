#!/usr/bin/env bash
# The test command: formatting, lints, the whole test suite, and the packaging checks that can run
# on a Debian host (checks/nix.sh). Exits non-zero on any failure.
# CI (.ci/run) calls exactly this after installing what the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo nextest run --workspace --no-fail-fast
bash checks/nix.sh
