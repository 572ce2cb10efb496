#!/usr/bin/env bash
# The checks that need a host on cgroup v2 alone, run as root (this project's CI is cgroup v1,
# where they cannot run; README, "Limits"):
#   - the service user's limits set by its rootless runtime in a delegated cgroup v2 subtree
#     (`as_the_service_user_limits_are_set_in_a_delegated_cgroup_v2_subtree`);
#   - the per-run account's limits held by root in a v2 cgroup
#     (`as_root_a_per_run_run_is_held_to_the_policys_memory_and_pids_limits`, which CI runs on v1);
#   - a prebuild patcher's bounded child nested in the container's v2 cgroup, each bound probed
#     from inside and ablated (`the_patchers_child_is_held_to_its_memory_pids_and_deadline`,
#     `…_to_its_cpu_share`, `the_aot_childs_memory_and_deadline_each_decide_alone`; CI runs
#     them on v1).
# Needs runc (CORDON_TEST_RUNC or /usr/sbin/runc), setpriv and cargo. A host without a v2
# hierarchy runs them all in an emulated guest: `checks/cgroup2-vm.sh`. On a host without a
# toolchain, `checks/cgroup2.sh --prebuilt DIR` runs the surface's two checks only (the prebuild
# checks build the prebuild image from this checkout's pinned sources), with DIR holding every
# stripped cordon binary and the root_surface test binary built from this checkout (`--pack
# DIR` makes it, on the build host), which expect the checkout at the path they were built in.
# Any check that cannot run fails and says what is missing; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each check as `<crate>/<test binary>/<test>`.
tests=(cordon-surface/root_surface/as_the_service_user_limits_are_set_in_a_delegated_cgroup_v2_subtree
    cordon-surface/root_surface/as_root_a_per_run_run_is_held_to_the_policys_memory_and_pids_limits
    cordon-prebuild/root_hostile/the_patchers_child_is_held_to_its_memory_pids_and_deadline
    cordon-prebuild/root_hostile/the_patchers_child_is_held_to_its_cpu_share
    cordon-prebuild/root_hostile/the_aot_childs_memory_and_deadline_each_decide_alone)
case "${1:-}" in
--pack)
    out=${2:?--pack DIR}
    mkdir -p "$out"
    exe=$(cargo test -p cordon-surface --test root_surface --no-run --message-format json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "root_surface" and m.get("executable"):
        print(m["executable"])')
    # Every cordon binary: the authority counts them all, and a partial install is refused.
    cargo build --quiet --workspace --bins
    for f in target/debug/cordon-{fetch,image,lane,materialize,policy,prebuild,reap,reference,surface} "$exe"; do
        strip -o "$out/$(basename "$f" | sed 's/-[0-9a-f]*$//')" "$f"
    done
    echo "$PWD" >"$out/built-in"
    exit 0
    ;;
--prebuilt)
    dir=${2:?--prebuilt DIR}
    built=$(cat "$dir/built-in")
    # The test binary finds the checkout and its binaries where it was built.
    if [ "$(realpath "$built" 2>/dev/null)" != "$PWD" ]; then
        [ -e "$built" ] && { echo "checks/cgroup2.sh: $built exists and is not this checkout" >&2; exit 1; }
        mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
    fi
    mkdir -p target/debug
    cp "$dir"/cordon-* target/debug/
    tests=("${tests[@]:0:2}")
    run() { "$dir/$2" "${@:3}"; }
    ;;
"")
    command -v cargo >/dev/null || { echo "checks/cgroup2.sh: cargo is missing (or use --prebuilt)" >&2; exit 1; }
    run() { cargo test --quiet -p "$1" --test "$2" -- "${@:3}"; }
    ;;
*)
    echo "usage: checks/cgroup2.sh [--pack DIR | --prebuilt DIR]" >&2
    exit 2
    ;;
esac
[ "$(id -u)" = 0 ] || { echo "checks/cgroup2.sh: run as root" >&2; exit 1; }
[ -f /sys/fs/cgroup/cgroup.controllers ] && [ ! -d /sys/fs/cgroup/memory ] || {
    echo "checks/cgroup2.sh: this host is not on cgroup v2 alone" >&2
    exit 1
}
for tool in setpriv "${CORDON_TEST_RUNC:-/usr/sbin/runc}"; do
    command -v "$tool" >/dev/null || { echo "checks/cgroup2.sh: $tool is missing" >&2; exit 1; }
done
for t in "${tests[@]}"; do
    IFS=/ read -r crate bin name <<<"$t"
    run "$crate" "$bin" --include-ignored --exact "$name" --test-threads 1
done
echo "checks/cgroup2.sh: all ${#tests[@]} pass"
