#!/usr/bin/env bash
# Build cordon-worker (or the package named as $1, e.g. cordon-image for the Nix image build) as
# the runtime image ships it: static, stripped, with the checkout's and cargo's paths remapped, so
# the same source and toolchain give the same bytes wherever the checkout lives — the image digest
# pinned in policy/evaluator.kdl covers the worker's bytes. Static also means it runs in a Nix
# build sandbox, which holds no loader and no libc (images/default.nix).
# Prints the binary's path. Its own target directory keeps these flags away from the rest.
set -euo pipefail
package="${1:-cordon-worker}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols --remap-path-prefix=$root=/cordon --remap-path-prefix=$cargo_home=/cargo" \
    cargo build --quiet --locked -p "$package" --release --target "$target" \
    --manifest-path "$root/Cargo.toml" --target-dir "$root/target/worker"
echo "$root/target/worker/$target/release/$package"
