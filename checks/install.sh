#!/usr/bin/env bash
# Install cordon on a Debian host the way the NixOS module installs it on NixOS: every binary
# side by side (the authority counts them all; a partial install is refused), the reviewed
# policy at the one place a stage reads by default, /etc/cordon/policy.kdl, and the pinned
# images built bit for bit at the one place a container stage reads them by default,
# /var/lib/cordon/images/ROLE. Run as root from the checkout:
#
#   bash checks/install.sh [--root DIR] [--from BINDIR]
#
# --root DIR installs under DIR instead of / (a staging tree; the tests use one); --from BINDIR
# takes built binaries from BINDIR instead of building the release ones. A policy already at
# /etc/cordon/policy.kdl is kept, never overwritten: its diff against the reviewed one is
# printed, classified, for the operator to review. Each image built is checked against the
# policy's pin, and a mismatch is said, not hidden (a host whose packages differ from the
# pinning host's builds other bytes; the policy's render path takes its own pins).
set -euo pipefail
cd "$(dirname "$0")/.."
root=
from=
while [ $# -gt 0 ]; do
    case "$1" in
    --root) root=${2:?--root DIR}; shift 2 ;;
    --from) from=${2:?--from BINDIR}; shift 2 ;;
    *) echo "usage: checks/install.sh [--root DIR] [--from BINDIR]" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "checks/install.sh: run it as root (it installs into /usr/local/bin, /etc/cordon and /var/lib/cordon)" >&2; exit 2; }
if [ -z "$from" ]; then
    cargo build --quiet --locked --release --bins
    from=target/release
fi
bins=(cordon-fetch cordon-image cordon-lane cordon-materialize cordon-policy cordon-prebuild
    cordon-reap cordon-reference cordon-surface cordon-verify)
for b in "${bins[@]}"; do
    [ -x "$from/$b" ] || { echo "checks/install.sh: $from/$b is missing: build every binary (cargo build --release --bins)" >&2; exit 2; }
done
install -d -m 0755 "$root/usr/local/bin" "$root/etc/cordon"
install -d -m 0700 "$root/var/lib/cordon" "$root/var/lib/cordon/images"
for b in "${bins[@]}"; do
    install -m 0755 "$from/$b" "$root/usr/local/bin/$b"
done
bin=$root/usr/local/bin

policy=$root/etc/cordon/policy.kdl
if [ -e "$policy" ]; then
    echo "checks/install.sh: $policy exists and is kept; the reviewed policy against it:"
    "$bin/cordon-policy" diff "$policy" policy/evaluator.kdl || true
else
    install -m 0644 policy/evaluator.kdl "$policy"
    echo "checks/install.sh: installed $policy"
fi
"$bin/cordon-policy" check "$policy"

# The prebuild image ships the native-sources compiler (fetched by version and sha256), the
# runtime image cordon's worker (built static and path-remapped): both first.
bash images/fetch-sources.sh >/dev/null
bash images/build-worker.sh >/dev/null
for role in prebuild runtime; do
    dest=$root/var/lib/cordon/images/$role
    rm -rf "$dest"
    built=$("$bin/cordon-image" build "images/$role.kdl" --out "$dest")
    pin=$(sed -n "s/^image \"$role\" digest=\"\(sha256:[0-9a-f]*\)\".*/\1/p" "$policy")
    if [ "$built" = "$pin" ]; then
        echo "checks/install.sh: $dest: $built, the policy's pin"
    else
        echo "checks/install.sh: $dest: $built, NOT the policy's pin ${pin:-(none)}: a container stage on this host is a no-decision until the pins agree (see README, \"Pins\")" >&2
    fi
done
echo "checks/install.sh: done; try: $bin/cordon-policy identity $policy"
