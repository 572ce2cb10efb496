#!/usr/bin/env bash
# What an operator runs on a GPU evaluator host before its first qualification (issue 34):
#   bash checks/gpu.sh POLICY
# POLICY is the host's rendered policy: its physical lanes name their GPUs by UUID, each with
# its pinned configuration, and its device-guard section holds the drain and envelope rules.
# It lists the GPUs (nvidia-smi -L) and the devices the host's CDI specs name, then runs
# `cordon-lane devices --drain`: every lane GPU resolved from the CDI specs as cordon resolves
# it (hooks only as the policy allows), its configuration read through NVML against its pin,
# one telemetry sample without a fault, and a real drain under the policy's guard. Nothing is
# skipped: a missing tool, library, spec or GPU fails the script (exit 1) with what is missing.
# Then it runs the demo pipeline under POLICY (CORDON_DEMO_POLICY): real lane sessions on the
# lanes' GPUs, guarded before, during and after, the audit and T on the lanes too, and requires
# a final verdict and a settling qualification. The demo's example engine computes on the CPU:
# the GPU stays idle while it is measured, so POLICY's envelope must allow an idle GPU's clocks
# (min-graphics-clock) for the check to pass; anything else fails with the demo's reason.
set -euo pipefail
policy=$(realpath -e "${1:?usage: bash checks/gpu.sh POLICY (the host's policy naming its lanes' GPUs)}")
cd "$(dirname "$0")/.."

fail() {
    echo "gpu.sh: $*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || fail "run as root: NVML's drain facts and the lanes' devices need it"
command -v nvidia-smi >/dev/null || fail "nvidia-smi is missing: install the NVIDIA driver's utilities"
command -v python3 >/dev/null || fail "python3 is missing (it lists the CDI specs' devices): apt-get install python3"
# Read whole first: grep -q closing the pipe early would fail ldconfig under pipefail.
cache=$(ldconfig -p)
grep -q 'libnvidia-ml\.so\.1' <<<"$cache" \
    || fail "libnvidia-ml.so.1 is not in the linker cache: install the NVIDIA driver"
specs=$(find /etc/cdi /var/run/cdi -maxdepth 1 -name '*.json' 2>/dev/null || true)
[ -n "$specs" ] || fail "no CDI spec in JSON under /etc/cdi or /var/run/cdi: nvidia-ctk cdi generate --format=json --device-name-strategy=uuid --output=/etc/cdi/nvidia.json"

echo "== GPUs (nvidia-smi -L)"
nvidia-smi -L
echo "== CDI specs and their devices"
for s in $specs; do
    echo "$s"
    # ascii(): a spec's strings reach the terminal escaped.
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print("  " + ascii(d["kind"] + "=" + x["name"])) for x in d["devices"]]' "$s" \
        || fail "$s does not parse as a CDI spec"
done

cargo build --release --bin cordon-lane
echo "== cordon-lane devices --drain (configuration against the pins, a sample, a drain)"
rc=0
./target/release/cordon-lane --policy "$policy" devices --drain || rc=$?
case $rc in
0) ;;
3) fail "a lane GPU is not resolved, not as the policy pins it, faulted, unreadable or did not drain (the report above)" ;;
*) fail "cordon-lane devices ended with exit $rc (2: the policy or the command line; see above)" ;;
esac

echo "== the demo pipeline under $policy (lane sessions on the lanes' GPUs)"
log=$(mktemp)
rc=0
CORDON_DEMO_POLICY=$policy bash checks/demo.sh | tee "$log" || rc=$?
[ "$rc" = 0 ] || fail "the demo pipeline under $policy ended with exit $rc (its last lines above say why)"
grep -q '^== lanes: .*; settling$' "$log" \
    || fail "the qualification on the GPU lanes did not settle (its '== lanes:' line above says why)"
echo "gpu.sh: every check passed: the lanes' GPUs, the guard's drain, and guarded sessions that settle"
