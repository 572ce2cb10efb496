#!/usr/bin/env bash
# The main job: the demo pipeline on the bundled example under the default policy.
#   policy check → register the example incumbent → pack and fetch the example candidate delta
#   → materialize it → verify the tree → print the chain of receipts.
# Later issues extend it with prebuild and reap. Runs as root on a fresh Debian machine:
# installs the OCI runtime (part of the authority identity) if it is missing.
# The store is a fresh directory unless CORDON_DEMO_STORE names one.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v runc >/dev/null 2>&1 || ! command -v tar >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y runc tar
fi
cargo build --release --bins
bin=./target/release
policy=policy/evaluator.kdl
work=$(mktemp -d)
store=${CORDON_DEMO_STORE:-$work/store}

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
    > "$work/materialize.json"
tree=$(sed -n 's/.*"tree_digest":"\(sha256:[0-9a-f]*\)".*/\1/p' "$work/materialize.json")
$bin/cordon-materialize --policy "$policy" --store "$store" verify "$tree" > "$work/verify.json"

for stage in incumbent fetch materialize verify; do
    echo "== $stage receipt"
    cat "$work/$stage.json"
done
echo "== engine tree $tree (store $store)"
