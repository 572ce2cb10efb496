#!/usr/bin/env bash
# Make this host one crun can create containers on, and say what changed. crun refuses a hybrid
# cgroup layout whose v2 hierarchy (/sys/fs/cgroup/unified) holds a controller: systemd's hybrid
# layout leaves there each controller it does not mount as v1 (hugetlb on Debian's cloud
# kernels). This mounts each such controller as a v1 hierarchy of its own, where a hybrid host
# keeps the others; runc drives either layout, and nothing of cordon's depends on the controller.
# A v1-only or v2-only host is left as it is. Run as root; checks/test.sh runs it before the
# containment tests under crun.
set -euo pipefail
held=/sys/fs/cgroup/unified/cgroup.controllers
[ -r "$held" ] || exit 0
for c in $(cat "$held"); do
    mkdir -p "/sys/fs/cgroup/$c"
    mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"
    echo "checks/crun-host.sh: mounted the $c controller as v1 at /sys/fs/cgroup/$c (crun refuses it on the v2 hierarchy of a hybrid host)"
done
left=$(cat "$held")
if [ -n "$left" ]; then
    echo "checks/crun-host.sh: the v2 hierarchy still holds: $left" >&2
    exit 1
fi
