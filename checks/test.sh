#!/usr/bin/env bash
# The test command: formatting, lints, the whole test suite, and the packaging checks that can run
# on a Debian host (checks/nix.sh). Exits non-zero on any failure.
# CI (.ci/run) calls exactly this after installing what the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# crun refuses a hybrid cgroup host that leaves a controller on its v2 hierarchy: this clears it,
# and says so, before any test drives crun.
bash checks/crun-host.sh
cargo nextest run --workspace --no-fail-fast -j 4
# The containment suite again under crun: every real-container test that attempts a control
# from inside or ablates one, in every container stage, each run driven through crun and its
# start gate. The sessions' signal, fault and recovery tests, the command-line tests, and the
# scripted-GPU and qualification runs stay under runc alone (all pass under crun too:
# CORDON_TEST_RUNTIME=crun cargo nextest run -E 'binary(/^root_/)'), so CI stays under 15 min.
CORDON_TEST_RUNTIME=crun cargo nextest run --no-fail-fast -j 4 -E '
    binary_id(cordon-prebuild::root_hostile) | binary_id(cordon-surface::root_surface)
    | binary_id(cordon-lane::root_lane) | binary_id(cordon-lane::root_ablation)
    | binary_id(cordon-reference::root_reference) | binary_id(cordon-stage::root_ablation)
    | binary_id(cordon-stage::root_seccomp) | binary_id(cordon-stage::root_session)'
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
