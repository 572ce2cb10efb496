#!/usr/bin/env bash
# render-policy.sh TEMPLATE RUNTIME_BINARY CORDON_POLICY OUT
# The last step of rendering a policy for a host (nixos-module/policy.nix did the rest): pin the
# runtime binary the host will run by its sha256, then refuse the result unless
# `cordon-policy check` accepts it, so a broken policy fails the build, never a host.
# Used by the module's policy derivation and, on a Debian host, by checks/nix.sh.
set -euo pipefail
template=$1 runtime=$2 cordon_policy=$3 out=$4
[ "$(grep -c '@runtimeSha256@' "$template")" = 1 ] || {
    echo "render-policy.sh: $template must name @runtimeSha256@ exactly once" >&2
    exit 2
}
digest=$(sha256sum "$runtime" | cut -d' ' -f1)
sed "s/@runtimeSha256@/sha256:$digest/" "$template" > "$out.tmp"
"$cordon_policy" check "$out.tmp" >&2
mv "$out.tmp" "$out"
