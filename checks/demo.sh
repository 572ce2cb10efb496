#!/usr/bin/env bash
# The main job: the demo pipeline on the bundled example under the default policy.
#   build the prebuild and runtime images → policy check → register the example incumbent and
#   prebuild its own publication → pack and fetch the example candidate delta → materialize it
#   → prebuild it in a disposable runc container → qualify it: lane sessions B (incumbent), C
#   (candidate), B′ (incumbent again) on the policy's two CPU lanes, host-framed and
#   host-timed, and the host's speed verdict → the referee: the candidate's untimed audit on
#   host-drawn requests, quiescence proven, the pristine reference session T, B, C, B′ and the
#   audit graded against it, the final verdict → reap --check → reap --gc (the store keeps
#   all a receipt names) →
#   cordon-verify the signed chain under the final verdict (its grades recomputed from the
#   stored outputs), export it and replay the export offline → print the chain of receipts, the
#   timeline, the B, C, B′ rates, the speedup, the noise, the grades and the final verdict →
#   the other build tiers' examples (sealed-direct-artifact, dependency-patch) fetched,
#   materialized and built → the agent surface: one shell command of an agent run by an unprivileged service user
#   (nobody) with cordon-surface in a rootless container bounded by its workspace, its host
#   environment full of secrets.
# Runs as root on a fresh Debian machine: installs the OCI runtime (part of the authority
# identity), python3 (images/fetch-sources.sh and the summaries below) and ca-certificates (the
# images' sources are fetched over https) if they are missing.
# The store is a fresh directory, removed at the end with the rest of the demo's scratch,
# unless CORDON_DEMO_STORE names one to keep; the policy is the default
# one unless CORDON_DEMO_POLICY names another (checks/gpu.sh runs it under a GPU host's).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v runc >/dev/null 2>&1 || ! command -v tar >/dev/null 2>&1 \
    || ! command -v python3 >/dev/null 2>&1 || [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y runc tar passwd python3 ca-certificates
fi
cargo build --release --bins
bin=./target/release
policy=${CORDON_DEMO_POLICY:-policy/evaluator.kdl}
work=$(mktemp -d)
surface=
# Its scratch goes when it ends, however it ends; a store to keep is CORDON_DEMO_STORE's.
trap 'rm -rf "$work" ${surface:+"$surface"}' EXIT
store=${CORDON_DEMO_STORE:-$work/store}

# The images the policy pins, built reproducibly from the files images/sources.json names by
# version and sha256 (never this host's installed packages), and cordon's worker built static
# and path-remapped. A stage verifies every byte against the pin it runs under.
images_from="their pinned sources (images/sources.json)"
if ! sources_err=$(bash images/fetch-sources.sh 2>&1 >/dev/null); then
    printf '%s\n' "$sources_err" >&2
    echo "demo: the pinned images cannot be rebuilt on this host (above); building them from this" \
        "host's installed Debian packages instead, under a LOCAL authority (below)" >&2
    # The packages it copies, as this host's Debian serves them now.
    mapfile -t debs < <(python3 -c 'import json; [print(s["name"]) for s in json.load(open("images/sources.json"))["sources"] if s["kind"] == "deb"]')
    DEBIAN_FRONTEND=noninteractive apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${debs[@]}" >&2
    bash images/fetch-sources.sh --host >/dev/null
    images_from="this host's installed Debian packages (images/fetch-sources.sh --host)"
fi
$bin/cordon-image build images/prebuild.kdl --out "$work/images/prebuild"
worker=$(bash images/build-worker.sh)
$bin/cordon-image build images/runtime.kdl --out "$work/images/runtime"

# The authority: the reviewed policy when what was built here is what it pins. Otherwise (the
# pinned sources are gone, or this toolchain builds another worker) a local policy rendered
# from it that pins what was built, its diff printed: every receipt then names that authority.
$bin/cordon-policy check "$policy"
reviewed=$policy
$bin/cordon-policy render "$policy" --out "$work/local-policy.kdl" \
    --image prebuild="$work/images/prebuild" --image runtime="$work/images/runtime" \
    --worker "$worker" > "$work/render.txt"
authority_of() { $bin/cordon-policy identity "$1" | sed -n 's/^authority *//p'; }
if [ "$(authority_of "$work/local-policy.kdl")" = "$(authority_of "$policy")" ]; then
    authority="the reviewed policy $reviewed: the images built here from $images_from are the ones it pins"
else
    echo "demo: the images or worker built here are not the ones $reviewed pins; the demo runs" \
        "under a LOCAL authority, $work/local-policy.kdl, which differs from it in:" >&2
    sed 's/^/  /' "$work/render.txt" >&2
    policy=$work/local-policy.kdl
    authority="a LOCAL policy rendered from $reviewed to pin the images built here from $images_from (not the reviewed authority; its diff is above)"
fi
$bin/cordon-policy identity "$policy"
echo "== authority: $authority"

# A candidate as a submitter would publish it: a deterministic tar of the delta directory.
pack() { # example directory, archive
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=ustar \
        -C "checks/example/$1" -cf "$2" cordon-delta.kdl engine
}
pack candidate "$work/candidate.tar"
sha=$(sha256sum "$work/candidate.tar" | cut -c1-64)

$bin/cordon-materialize --policy "$policy" --store "$store" incumbent checks/example/incumbent \
    > "$work/incumbent.json"
incumbent=$(sed -n 's/.*"tree_digest":"\(sha256:[0-9a-f]*\)".*/\1/p' "$work/incumbent.json")
# The pristine reference tree T runs: the stock engine, registered on its own (the policy pins
# its digest); never the incumbent.
$bin/cordon-materialize --policy "$policy" --store "$store" incumbent checks/example/pristine \
    > "$work/pristine.json"
# Role B's publication is the incumbent's own build (the step its manifest names).
$bin/cordon-prebuild --policy "$policy" --store "$store" --images "$work/images" \
    --receipt "$work/incumbent.json" > "$work/incumbent-prebuild.json"

# The model is registered by its digest in the policy's models root (root-owned, writable by
# root only; the lane checks both): `cordon-lane model DIR` prints where it belongs.
chmod -R go-w checks/example/model
read -r _ model < <($bin/cordon-lane --policy "$policy" model checks/example/model)
[ -n "$model" ] || { echo "demo: cordon-lane model failed" >&2; exit 1; }
install -d -m 0755 "$(dirname "$model")"
[ -d "$model" ] || cp -r checks/example/model "$model"

# The pipeline: each stage reads the previous receipt on stdin and prints its own.
$bin/cordon-fetch --policy "$policy" --store "$store" --sha256 "$sha" "$work/candidate.tar" \
    | tee "$work/fetch.json" \
    | $bin/cordon-materialize --policy "$policy" --store "$store" --incumbent "$incumbent" \
    | tee "$work/materialize.json" \
    | $bin/cordon-prebuild --policy "$policy" --store "$store" --images "$work/images" \
    | tee "$work/prebuild.json" \
    | $bin/cordon-lane --policy "$policy" --store "$store" qualify \
        --incumbent "$work/incumbent-prebuild.json" \
        --images "$work/images" --workload checks/example/workload/example.json \
        --model "$model" \
    | tee "$work/qualify.json" \
    | $bin/cordon-reference --policy "$policy" --store "$store" --images "$work/images" \
        --pristine "$work/pristine.json" \
    > "$work/verdict.json"
$bin/cordon-reap --policy "$policy" --store "$store" --check > "$work/reap.json"
# The collector keeps everything a stored receipt names: the chain verifies after it.
$bin/cordon-reap --policy "$policy" --store "$store" --gc > "$work/gc.txt"
# The evidence: every stored receipt is signed with this host's key; the chain under the
# qualify receipt replays offline, here and from an exported bundle with the published key.
key=$($bin/cordon-verify --public-key)
$bin/cordon-verify --store "$store" --key "$key" --export "$work/bundle" "$work/verdict.json" \
    > "$work/verify.txt"
$bin/cordon-verify --store "$work/bundle" --key "$key" --explain "$work/verdict.json" \
    > "$work/explain.txt"

# The other build tiers' bundled examples, each fetched, materialized over the same incumbent
# and built by its tier's registered patcher (they are not qualified: one candidate is).
for tier in aot dep; do
    pack "candidate-$tier" "$work/candidate-$tier.tar"
    $bin/cordon-fetch --policy "$policy" --store "$store" \
        --sha256 "$(sha256sum "$work/candidate-$tier.tar" | cut -c1-64)" "$work/candidate-$tier.tar" \
        | $bin/cordon-materialize --policy "$policy" --store "$store" --incumbent "$incumbent" \
        | $bin/cordon-prebuild --policy "$policy" --store "$store" --images "$work/images" \
        > "$work/prebuild-$tier.json"
done

# The agent surface (seed 002, policy/examples/surface.kdl): the service user's workspace and
# state directory, the operator's root-owned policy naming that state directory.
surface=$(mktemp -d)
chmod 755 "$surface"
install -d -o 65534 -g 65534 -m 755 "$surface/ws"
install -d -o 65534 -g 65534 -m 700 "$surface/state"
sed "s#state-dir \"/run/cordon-surface\"#state-dir \"$surface/state\"#" policy/examples/surface.kdl \
    > "$surface/surface.kdl"
chmod 644 "$surface/surface.kdl"
setpriv --reuid 65534 --regid 65534 --clear-groups \
    env -i PATH=/usr/bin:/bin TERM=dumb DATABASE_URL=postgres://hub:demo-secret@db/hub \
    ANTHROPIC_API_KEY=sk-demo-secret \
    $bin/cordon-surface --policy "$surface/surface.kdl" run --workspace "$surface/ws" -- \
    /bin/sh -c 'echo "agent notes" > notes.txt; ls /; cat /etc/shadow || true; env | sort' \
    > "$work/surface.json"

for stage in incumbent pristine incumbent-prebuild fetch materialize prebuild qualify verdict reap surface; do
    echo "== $stage receipt"
    cat "$work/$stage.json"
done
echo "== cordon-reap --gc: $(wc -l < "$work/gc.txt") store entries no receipt names removed"
echo "== authority of every receipt above: $(authority_of "$policy")"
echo "   $authority"
echo "== cordon-verify --explain (from the exported bundle, signed by $key)"
cat "$work/explain.txt"
publication=$(sed -n 's/.*"publication":"\(sha256:[0-9a-f]*\)".*/\1/p' "$work/prebuild.json")
[ -n "$publication" ]
python3 - "$work/prebuild.json" "$publication" "$store" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
o = r["outputs"]
print(f"== publication {sys.argv[2]} (store {sys.argv[3]}): {r['inputs']['step']} built "
      f"{o['files']} file(s), {o['bytes']} bytes, from the candidate's declared C sources")
PY
python3 - "$work/prebuild-aot.json" "$work/prebuild-dep.json" <<'PY'
import json, sys
for path, what in zip(sys.argv[1:], ["the factory's artifact and profile, under the closed compile ABI",
                                     "minilib, patched by the candidate's declared patch"]):
    r = json.load(open(path))
    o = r["outputs"]
    print(f"== the other tiers: {r['inputs']['step']} ({r['outcome']}): {o['files']} file(s), "
          f"{o['bytes']} bytes: {what}")
PY
# The surface's run, from its receipt: what ran inside, what the host kept.
python3 - "$work/surface.json" "$surface/ws" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
o = r["outputs"]
print(f"== surface ({r['outcome']}): uid {o['user']['host_uid']} as the container's only id, "
      f"network {o['network']}, read set {', '.join(o['read_set'])}")
print("== inside, the command printed:")
print(o["stdout"] + o["stderr"], end="")
assert "secret" not in json.dumps(r), "a secret crossed"
print(f"== the workspace holds: {sorted(os.listdir(sys.argv[2]))}; no secret crossed")
PY
# The verdict, from the qualify receipt alone (every number in it is the host's).
python3 - "$work/qualify.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
o = r["outputs"]  # a FAIL's evidence has the same shape
s = o["speed"]
rate = lambda f: f"{f['rate_milli'] / 1000:.1f} tokens/s"
print(f"== qualify ({r['outcome']}): B {rate(s['b'])}, C {rate(s['c'])}, B' {rate(s['b2'])}")
print(f"== speedup {s['speedup_bp'] / 10000:.2f}x the baseline, noise {s['noise_bp'] / 100:.2f}%, "
      f"required {s['required_bp'] / 10000:.4f}x: {s['verdict'].upper()} ({s['code']})")
settling = "settling" if o["settling"] else f"non-settling: {o['non_settling']}"
print(f"== lanes: B and B' on {o['orientation']['baseline']['name']}, C on "
      f"{o['orientation']['candidate']['name']}; {settling}")
PY
# The final verdict (seed 001 §5): speed from the qualification, quality against the pristine
# reference T, which ran only after B, C, B' and the audit were proven gone.
python3 - "$work/verdict.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if r["outcome"] == "no-decision":
    print(f"== final verdict: NO_DECISION ({r['reasons'][0]['code']}): {r['reasons'][0]['message']}")
    sys.exit(3)
o = r["outputs"]
for read in ("b", "c", "b2"):
    g = o["graded"][read]
    print(f"== quality of {read.upper().replace('B2', 'B prime')} against T: {g['exact']} of "
          f"{g['requests']} requests exact, least prefix {g['least_prefix_bp'] / 100:.2f}%: "
          f"{g['verdict'].upper()} ({g['code']})")
a = o.get("audit")
if a:
    out = a["outcome"]
    if "served" in out:
        g = out["served"]["graded"]
        print(f"== audit of C on host-drawn requests {a['sample']} (untimed, regraded against T): "
              f"{g['exact']} of {g['requests']} exact: {g['verdict'].upper()} ({g['code']})")
    else:
        print(f"== audit of C: the candidate broke its audit session ({out['rejected']['code']})")
print(f"== final verdict: {o['verdict'].upper()} ({o['code']}): {o['reason']}")
sys.exit(0 if o["verdict"] == "pass" else 1)
PY
