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
# The Debian install path, staged under a scratch root: every binary, the policy and the pinned
# images where a stage looks by default; the installed authority computes; an install missing
# one binary is refused, naming it.
inst=$(mktemp -d)
trap 'rm -rf "$inst"' EXIT
bash checks/install.sh --root "$inst" --from target/debug
"$inst/usr/local/bin/cordon-policy" identity "$inst/etc/cordon/policy.kdl" >/dev/null
rm "$inst/usr/local/bin/cordon-surface"
if "$inst/usr/local/bin/cordon-policy" identity "$inst/etc/cordon/policy.kdl" >/dev/null 2>"$inst/partial.txt"; then
    echo "checks/test.sh: a partial install computed an authority" >&2
    exit 1
fi
grep -q "cordon-surface missing from" "$inst/partial.txt" || { cat "$inst/partial.txt" >&2; exit 1; }
echo "checks/test.sh: the staged install holds, and a partial one is refused"
