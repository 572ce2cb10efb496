#!/usr/bin/env bash
# What an operator runs on a GPU evaluator host before its first qualification (issue 34):
#   bash checks/gpu.sh POLICY
# POLICY is the host's rendered policy: its physical lanes name their GPUs by UUID, each with
# its pinned configuration, and its device-guard section holds the drain and envelope rules.
# It lists the GPUs (nvidia-smi -L) and the devices the host's CDI specs name, then runs
# `cordon-lane devices --drain`: every lane GPU's configuration read through NVML against its
# pin, one telemetry sample, and a real drain under the policy's guard. Nothing is skipped: a
# missing tool, library, spec or GPU fails the script with what is missing. A lane session on
# a GPU is not part of this build yet (the planner refuses a GPU lane, `plan::unimplemented`):
# the script says so and fails, so a host is never taken for checked when it was not.
set -euo pipefail
cd "$(dirname "$0")/.."
policy=${1:?usage: bash checks/gpu.sh POLICY (the host's policy naming its lanes' GPUs)}

fail() {
    echo "gpu.sh: $*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || fail "run as root: NVML's drain facts and the lanes' devices need it"
command -v nvidia-smi >/dev/null || fail "nvidia-smi is missing: install the NVIDIA driver's utilities"
ldconfig -p | grep -q 'libnvidia-ml\.so\.1' \
    || fail "libnvidia-ml.so.1 is not in the linker cache: install the NVIDIA driver"
specs=$(find /etc/cdi /var/run/cdi -maxdepth 1 -name '*.json' 2>/dev/null || true)
[ -n "$specs" ] || fail "no CDI spec in JSON under /etc/cdi or /var/run/cdi: nvidia-ctk cdi generate --format=json --device-name-strategy=uuid --output=/etc/cdi/nvidia.json"

echo "== GPUs (nvidia-smi -L)"
nvidia-smi -L
echo "== CDI specs and their devices"
for s in $specs; do
    echo "$s"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print("  %s=%s" % (d["kind"], x["name"])) for x in d["devices"]]' "$s" \
        || fail "$s does not parse as a CDI spec"
done

cargo build --release --bin cordon-lane
echo "== cordon-lane devices --drain (configuration against the pins, a sample, a drain)"
./target/release/cordon-lane --policy "$policy" devices --drain \
    || fail "a lane GPU is not as the policy pins it, cannot be read, or did not drain (above)"

fail "NOT YET: a lane session on a GPU is refused by this build (issue 34: CDI devices and the device guard are not applied to sessions); the checks above passed"
