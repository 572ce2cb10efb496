#!/usr/bin/env bash
# Mutation check of cordon's security-critical functions (issue 12): cargo-mutants changes one
# function or operator at a time and runs the tests that should notice; a mutant they miss is a
# test gap, killed by a new test or written down in checks/mutants-report.md with the reason it
# is equivalent. Not part of .ci/run (it takes hours on 2 cores); its last report is committed.
#
#   bash checks/mutants.sh [GROUP…]      groups: authority guard inventory lease planner posture validator
#
# Environment: CORDON_MUTANTS_BUDGET (seconds per group, default 3600), CORDON_MUTANTS_ITERATE=1
# to test again only the mutants the last run of a group did not catch, CORDON_MUTANTS_ROOT=1
# to include the root-only test binaries (root_*: real containers and accounts; never run them
# beside another root test run on this host — they share account ranges; each mutant then
# rebuilds the workspace and runs real containers: minutes per mutant). Needs
# `cargo install cargo-mutants --locked` and cargo-nextest.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-mutants >/dev/null || {
    echo "mutants: cargo-mutants is missing: cargo install cargo-mutants --locked" >&2
    exit 2
}
budget=${CORDON_MUTANTS_BUDGET:-3600}
root=${CORDON_MUTANTS_ROOT:-0}

# group → files, function pattern, test packages.
run_group() {
    local group=$1
    local skip=
    local -a files re tests
    case $group in
    authority)
        # Every stage's authority check: the input receipt's chain and identity.
        files=(bins/stage/src/receipt_io.rs bins/cordon/src/chain.rs bins/prebuild/src/prebuild.rs)
        re=('.')
        tests=(cordon cordon-stage cordon-prebuild cordon-materialize)
        ;;
    inventory)
        # The publication bounds and the staging inventory.
        files=(bins/prebuild/src/inventory.rs)
        re=('.')
        tests=(cordon-prebuild)
        ;;
    lease)
        # Lease release, recovery and the absence check; account creation and removal.
        files=(bins/cordon/src/lease/mod.rs bins/cordon/src/lease/per_run.rs bins/cordon/src/account.rs)
        re=('release|recover|check|Observer|read_records|executor_ok|owned_by|unmount_inside|create|remove|in_range|deny|taken')
        # cordon-reap's tests are all root-tier: release and recovery with real containers.
        tests=(cordon cordon-reap)
        ;;
    planner)
        # The planner's controls: what the bundle enforces.
        files=(bins/stage/src/bundle.rs bins/stage/src/oci.rs)
        re=('.')
        tests=(cordon-stage cordon-policy)
        ;;
    posture)
        # The outside check that the runtime applied the plan.
        files=(bins/stage/src/posture.rs)
        re=('.')
        tests=(cordon-stage)
        ;;
    guard)
        # The GPU lane's guard, its pure rules and settling, member coverage, CDI resolution.
        files=(bins/lane/src/guard.rs bins/evidence/src/device.rs bins/evidence/src/qualify.rs bins/frame/src/message.rs bins/stage/src/cdi.rs)
        re=('gpu_nodes|Guard<|unguarded|unsettled|coverage|member_report|resolve_lane|read_specs')
        tests=(cordon-lane cordon-evidence cordon-frame cordon-stage cordon-verify)
        # Those need the stage binaries a non-root tier does not build (and test no guard).
        skip='binary(qualify)'
        ;;
    validator)
        # The policy validator's refusals of weakened controls.
        files=(bins/policy-lang/src/build/mod.rs bins/policy-lang/src/build/stage.rs bins/policy-lang/src/build/seccomp.rs)
        re=('weaken|refuse|seccomp|stage|capab|user|mount|check')
        tests=(cordon-policy-lang cordon-policy)
        ;;
    *)
        echo "mutants: unknown group $group" >&2
        return 2
        ;;
    esac
    local -a args=(--test-tool nextest --no-shuffle -j 1 --output "target/mutants/$group")
    if [ "${CORDON_MUTANTS_ITERATE:-0}" = 1 ]; then args+=(--iterate); fi
    for f in "${files[@]}"; do args+=(--file "$f"); done
    for r in "${re[@]}"; do args+=(--re "$r"); done
    local filter
    if [ "$root" = 1 ]; then
        # The root tier runs the stage binaries it drives (cordon-reap, cordon-policy, …): the
        # whole workspace is built (cargo-mutants 27 names the mutated files' packages even
        # with --test-workspace, so --workspace goes to cargo itself), and nextest runs the
        # named packages' tests only. Baseline of the authority group: 179 s build, 98 s for
        # its 289 tests.
        args+=(--cargo-arg=--workspace)
        filter=$(printf 'package(%s) | ' "${tests[@]}")
        filter=${filter% | }
    else
        for t in "${tests[@]}"; do args+=(--test-package "$t"); done
        filter='not binary(/^root_/)'
    fi
    if [ -n "$skip" ]; then filter="($filter) & not $skip"; fi
    mkdir -p "target/mutants/$group"
    echo "mutants: $group (budget ${budget}s)"
    # cargo-mutants exits non-zero when a mutant survives; the report says which.
    timeout "$budget" cargo mutants "${args[@]}" -- -E "$filter" || true
    local dir="target/mutants/$group/mutants.out"
    for kind in caught missed timeout unviable; do
        printf '  %-8s %s\n' "$kind" "$(wc -l <"$dir/$kind.txt" 2>/dev/null || echo 0)"
    done
}

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(authority guard inventory lease planner posture validator)
for g in "${groups[@]}"; do run_group "$g"; done
