#!/usr/bin/env bash
# The main job: the demo pipeline on the bundled example under the default policy.
#   build the prebuild image → policy check → register the example incumbent → pack and fetch
#   the example candidate delta → materialize it → prebuild it in a disposable runc container
#   → reap --check → print the chain of receipts and the publication digest.
# Runs as root on a fresh Debian machine: installs the OCI runtime (part of the authority
# identity) and busybox-static (the prebuild image's one binary) if they are missing.
# The store is a fresh directory unless CORDON_DEMO_STORE names one.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v runc >/dev/null 2>&1 || ! command -v tar >/dev/null 2>&1 || [ ! -x /bin/busybox ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y runc tar busybox-static passwd
fi
cargo build --release --bins
bin=./target/release
policy=policy/evaluator.kdl
work=$(mktemp -d)
store=${CORDON_DEMO_STORE:-$work/store}

# The image the policy pins, built reproducibly; a mismatch with the pin is a no-decision later.
$bin/cordon-image build images/prebuild.kdl --out "$work/images/prebuild"

$bin/cordon-policy check "$policy"
$bin/cordon-policy identity "$policy"

# The candidate as a submitter would publish it: a deterministic tar of the delta directory.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=ustar \
    -C checks/example/candidate -cf "$work/candidate.tar" cordon-delta.kdl engine
sha=$(sha256sum "$work/candidate.tar" | cut -c1-64)

$bin/cordon-materialize --policy "$policy" --store "$store" incumbent checks/example/incumbent \
    > "$work/incumbent.json"
incumbent=$(sed -n 's/.*"tree_digest":"\(sha256:[0-9a-f]*\)".*/\1/p' "$work/incumbent.json")

# The pipeline: each stage reads the previous receipt on stdin and prints its own.
$bin/cordon-fetch --policy "$policy" --store "$store" --sha256 "$sha" "$work/candidate.tar" \
    | tee "$work/fetch.json" \
    | $bin/cordon-materialize --policy "$policy" --store "$store" --incumbent "$incumbent" \
    | tee "$work/materialize.json" \
    | $bin/cordon-prebuild --policy "$policy" --store "$store" --images "$work/images" \
    > "$work/prebuild.json"
$bin/cordon-reap --policy "$policy" --store "$store" --check > "$work/reap.json"

for stage in incumbent fetch materialize prebuild reap; do
    echo "== $stage receipt"
    cat "$work/$stage.json"
done
publication=$(sed -n 's/.*"publication":"\(sha256:[0-9a-f]*\)".*/\1/p' "$work/prebuild.json")
echo "== publication $publication (store $store)"
[ -n "$publication" ]
