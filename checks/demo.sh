#!/usr/bin/env bash
# The main job, for now: validate the default policy and print its authority identity.
# Later issues replace this with the demo pipeline (fetch → materialize → prebuild → reap).
# Runs as root on a fresh Debian machine: installs the OCI runtime if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v runc >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y runc
fi
cargo build --release --bins
./target/release/cordon-policy check policy/evaluator.kdl
./target/release/cordon-policy identity policy/evaluator.kdl
