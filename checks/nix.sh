#!/usr/bin/env bash
# The packaging checks that run on a Debian host (CI installs Debian's nix-bin; nixpkgs cannot be
# fetched here). What they prove and what only a Nix host can: README, "Packaging".
#   1. every .nix file parses (nix-instantiate --parse);
#   2. the flake's outputs and the NixOS module evaluate against checks/nix/stub.nix: output
#      names, assertions (each refusal is provoked and must fire), the rendered units;
#   3. `systemd-analyze security --offline=yes` on every rendered unit: each unit that runs as
#      a user must score at most 2.0; each root unit's score is printed beside the reasons in
#      nixos-module/default.nix for the capabilities it keeps;
#   4. both images build in the Nix sandbox from a static cordon-image, equal the pins in
#      policy/evaluator.kdl, and rebuild bit for bit (nix-build --check);
#   5. the module's `cordon-policy render` commands, run on the real policies (with those
#      layouts and this checkout's worker for the flake's), give policies that pass
#      `cordon-policy check`, pin the runtime they hashed and the images they were given;
#      render refuses what it cannot set exactly.
# Any check that cannot run fails and says what is missing; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
for tool in nix-instantiate nix-build systemd-analyze python3; do
    command -v "$tool" >/dev/null || {
        echo "checks/nix.sh: $tool is missing (apt-get install nix-bin systemd python3)" >&2
        exit 1
    }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "checks/nix.sh: FAIL: $*" >&2
    exit 1
}
sandbox=(--option sandbox true --option substituters '' --option build-users-group '')

echo "== 1. parse"
mapfile -t files < <(find . -name '*.nix' -not -path './target/*' | sort)
[ "${#files[@]}" -ge 6 ] || fail "only ${#files[@]} .nix files found"
for f in "${files[@]}"; do
    nix-instantiate --parse "$f" >/dev/null || fail "$f does not parse"
    echo "parsed $f"
done

echo "== 2. evaluate against the stub"
evaluate() { # settings-expression → JSON on stdout
    nix-instantiate --eval --strict --json \
        -E "import $root/checks/nix/eval.nix { settings = $1; }"
}
surface_host="{
  services.cordon = { enable = true; surface = { enable = true;
    policy = $root/policy/examples/surface.kdl; command = [ \"/run/current-system/sw/bin/agent\" ]; }; };
  users.users = { root = { uid = 0; }; alice = { uid = 1000;
    subUidRanges = [ { startUid = 100000; count = 65536; } ]; }; };
  users.groups = { root = { gid = 0; }; };
}"
evaluate "$surface_host" >"$work/host.json"
python3 - "$work/host.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["failedAssertions"] == [], d["failedAssertions"]
f = d["flake"]
for name in ("default", "image-prebuild", "image-runtime", "cordon-worker-static"):
    assert name in f["packages"], f"packages.{name} missing: {f['packages']}"
assert "default" in f["nixosModules"] and "default" in f["devShells"], f
for name in ("no-root", "vm", "image-prebuild-pin"):
    assert name in f["checks"], f"checks.{name} missing"
assert f["formatter"] == "cordon-nixfmt", f["formatter"]
assert f["toolPath"].endswith("-util-linux/bin") and "-shadow/bin" in f["toolPath"], f["toolPath"]
assert set(d["services"]) == {"cordon-recover", "cordon-reap", "cordon-agent"}, list(d["services"])
assert d["timers"]["cordon-reap"]["timerConfig"]["OnUnitActiveSec"] == "1min"
recover = d["services"]["cordon-recover"]
assert "systemd-user-sessions.service" in recover["before"], recover
assert d["services"]["cordon-agent"]["serviceConfig"]["User"] == "cordon-agent"
assert d["sysctl"]["kernel.yama.ptrace_scope"] == 2 and d["sysctl"]["kernel.kptr_restrict"] == 2
assert "d /var/lib/cordon/store 0700 root root -" in d["tmpfiles"], d["tmpfiles"]
# The default images (the flake's packages) linked where a stage reads them without --images.
assert any(r.startswith("L+ /var/lib/cordon/images/prebuild - - - - ") for r in d["tmpfiles"]), d["tmpfiles"]
# Recovery and the sweep run once per executor, each named.
for unit in ("cordon-recover", "cordon-reap"):
    starts = d["services"][unit]["serviceConfig"]["ExecStart"]
    assert starts == [s for s in starts if "--executor " in s] and len(starts) >= 1, starts
assert d["activation"]["users"]["deps"] == ["cordonHoldLeases"], d["activation"]
hold = d["activation"]["cordonHoldLeases"]["text"]
assert "flock -x -w" in hold and "/run/cordon-locks/*.lock" in hold and "exit 1" in hold, hold
for etc in ("cordon/policy.kdl", "cordon/surface.kdl"):
    assert d["etc"][etc]["mode"] == "0444", d["etc"][etc]
print("outputs:", f["packages"], "checks:", f["checks"])
print("units:", sorted(d["services"]), "timers:", sorted(d["timers"]))
EOF
# The surface's egress domains and skills: the domains rendered as a narrowing of the reviewed
# list, the agent service's IP sockets opened for its proxy, the skills copied under their names
# and imported at start, their selections written to the service's runtime directory.
evaluate "{
  services.cordon = { enable = true; surface = { enable = true;
    policy = $root/policy/examples/surface.kdl; command = [ \"/bin/agent\" ];
    egress.domains = [ \"api.anthropic.com\" ]; skills = { review = $root/checks/nix; }; }; };
  users.users = { root = { uid = 0; }; }; users.groups = { root = { gid = 0; }; };
}" >"$work/egress.json"
python3 - "$work/egress.json" "$work/host.json" <<'EOF'
import json, sys
d, plain = (json.load(open(p)) for p in sys.argv[1:3])
assert d["failedAssertions"] == [], d["failedAssertions"]
facts = d["etc"]["cordon/surface.kdl"]["facts"]
assert facts[-2:] == ["--egress-domain", "api.anthropic.com"], facts
agent = d["services"]["cordon-agent"]["serviceConfig"]
assert "AF_INET" in agent["RestrictAddressFamilies"] and agent["PrivateNetwork"] is False, agent
assert "IPAddressDeny" not in agent, agent
pre = agent["ExecStartPre"]
assert len(pre) == 2 and pre[0].endswith("--surface --policy /etc/cordon/surface.kdl --sweep"), pre
assert pre[1].endswith("-cordon-agent-skills"), pre
assert agent["RuntimeDirectory"] == "cordon-agent" and agent["RuntimeDirectoryMode"] == "0700"
# Without either, the service has no IP at all and imports nothing.
base = plain["services"]["cordon-agent"]["serviceConfig"]
assert base["PrivateNetwork"] is True and base["IPAddressDeny"] == "any", base
assert "AF_INET" not in base["RestrictAddressFamilies"], base
assert len(base["ExecStartPre"]) == 1 and "--egress-domain" not in plain["etc"]["cordon/surface.kdl"]["facts"]
assert "Delegate" not in base and base["ProtectControlGroups"] is True, base
print("egress and skills: facts", facts[-2:], "ExecStartPre", len(pre))
EOF
# Limits: the unit is delegated a cgroup v2 subtree, its processes in the leaf hub, the cgroup
# tree writable to it; nothing of that without the option (above).
evaluate "{
  services.cordon = { enable = true; surface = { enable = true; limits = true;
    policy = $root/policy/examples/surface.kdl; command = [ \"/bin/agent\" ]; }; };
  users.users = { root = { uid = 0; }; }; users.groups = { root = { gid = 0; }; };
}" >"$work/limits.json"
python3 -c '
import json, sys
agent = json.load(open(sys.argv[1]))["services"]["cordon-agent"]["serviceConfig"]
assert agent["Delegate"] == "cpu cpuset memory pids" and agent["DelegateSubgroup"] == "hub", agent
assert agent["ProtectControlGroups"] is False and agent["User"] == "cordon-agent", agent
print("limits: Delegate", agent["Delegate"], "DelegateSubgroup", agent["DelegateSubgroup"])
' "$work/limits.json"
# Without the surface, no agent unit, user or policy.
evaluate '{ services.cordon.enable = true; }' >"$work/plain.json"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert set(d["services"]) == {"cordon-recover", "cordon-reap"} and "cordon/surface.kdl" not in d["etc"], d
' "$work/plain.json"
# Every executor the host uses is recovered and swept, each by name.
evaluate '{ services.cordon = { enable = true; executor = "a"; extraExecutors = [ "b" ]; }; }' >"$work/executors.json"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for unit, tail in (("cordon-recover", ""), ("cordon-reap", " --sweep")):
    starts = d["services"][unit]["serviceConfig"]["ExecStart"]
    assert [s.split("/bin/")[-1] for s in starts] == [
        f"cordon-reap --policy /etc/cordon/policy.kdl --executor {e}{tail}" for e in ("a", "b")
    ], starts
hold = d["activation"]["cordonHoldLeases"]["text"]
assert "touch /run/cordon-locks/a.lock /run/cordon-locks/b.lock" in hold, hold
print("executors: recovered, swept and held at activation", "a", "b")
' "$work/executors.json"
# Disabled: nothing at all.
[ "$(evaluate '{ }' | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["services"]) + len(d["etc"]))')" = 0 ] \
    || fail "a disabled module still renders units or files"

refused() { # settings, expected message fragment
    local got
    got=$(evaluate "$1" | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["failedAssertions"]))')
    grep -qF "$2" <<<"$got" || fail "expected the assertion '$2' for $1; got: ${got:-none}"
    echo "refused as expected: $2"
}
refused '{ services.cordon.enable = true; users.users.alice = { uid = 3000005; }; }' \
    'uidRange overlaps declared uids'
refused '{ services.cordon.enable = true; users.users.alice = { uid = 1000; subUidRanges = [ { startUid = 3099999; count = 10; } ]; }; }' \
    'uidRange overlaps declared uids or subuid ranges: [3099999]'
refused '{ services.cordon.enable = true; users.groups.g = { gid = 3000000; }; }' \
    'gidRange overlaps declared gids'
refused '{ services.cordon = { enable = true; accounts.uidRange = { first = 5; last = 4; }; }; }' \
    'first is past last'
refused '{ services.cordon.enable = true; users.users = builtins.listToAttrs (builtins.genList (i: { name = "u${toString i}"; value = { autoSubUidGidRange = true; }; }) 45); }' \
    '45 users have autoSubUidGidRange, whose ranges reach 3049120'
refused '{ services.cordon.enable = true; containers.c.privateUsers = "pick"; }' \
    'use privateUsers = "pick"'
# One field of a range set: the other keeps its default (a submodule's fields default apart).
[ "$(evaluate '{ services.cordon = { enable = true; accounts.uidRange.first = 3000100; }; }' \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["etc"]["cordon/policy.kdl"]["facts"][7:9], d["failedAssertions"])')" \
    = "['3000100', '3099999'] []" ] || fail "a range with one field set lost the other's default"
refused '{ services.cordon = { enable = true; runtime = "crun"; }; }' \
    'names another runtime'
# A policy that names crun, with crun: nixpkgs' crun is the runtime rendered into it.
[ "$(evaluate "{ services.cordon = { enable = true; runtime = \"crun\"; images = {};
    policy = $root/policy/examples/pinned-runtime-crun.kdl; }; }" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); f=d["etc"]["cordon/policy.kdl"]["facts"]; print(f[f.index("--runtime") + 1].split("-", 1)[1], d["failedAssertions"])')" \
    = "crun-1.20/bin/crun []" ] || fail "a crun policy does not render nixpkgs' crun"
refused '{ services.cordon.enable = true; systemd.sysusers.enable = true; }' \
    'systemd.sysusers and services.userborn are not supported'
refused "{ services.cordon = { enable = true; surface = { enable = true; user = \"root\"; policy = $root/policy/examples/surface.kdl; command = [ \"a\" ]; }; }; }" \
    'never runs as root'

echo "== 3. systemd-analyze security --offline=yes"
mkdir "$work/units"
python3 checks/nix/units.py "$work/units" <"$work/host.json" >"$work/units.txt"
while read -r unit who; do
    if [ "$who" = user ]; then
        # The threshold is on systemd's 0–100 scale: 20 is an exposure of 2.0.
        systemd-analyze security --offline=yes --threshold=20 "$unit" >"$work/analyze.txt" 2>&1 \
            || { cat "$work/analyze.txt"; fail "$(basename "$unit") scores above 2.0"; }
    else
        # Root units keep what recovery needs (nixos-module/default.nix says why for each).
        systemd-analyze security --offline=yes "$unit" >"$work/analyze.txt" 2>&1
    fi
    echo "$(basename "$unit") ($who): $(grep -o 'exposure level for [^:]*: [0-9.]*' "$work/analyze.txt" | sed 's/.*: //')"
done <"$work/units.txt"

echo "== 4. images in the Nix sandbox"
image_tool=$(bash images/build-worker.sh cordon-image)
bash images/build-worker.sh >/dev/null
bash images/fetch-sources.sh >/dev/null
sources() { # spec → a Nix attribute set of its sources as store paths (links resolved)
    echo "{"
    grep -o 'from="[^"]*"' "images/$1.kdl" | sed 's/from="\(.*\)"/\1/' | sort -u | while read -r from; do
        case $from in
        /*) real=$(realpath -e "$from") ;;
        *) real=$(realpath -e "images/$from") ;;
        esac
        echo "  \"$from\" = builtins.path { path = $real; name = \"source\"; };"
    done
    echo "}"
}
# A source that is a derivation's output (the flake's busybox from a Debian .deb) must not
# stop the image from instantiating (toFile refuses such a reference in its text).
nix-instantiate --quiet "${sandbox[@]}" -E "(import $root/images {
  cordonImage = builtins.path { path = $image_tool; name = \"cordon-image\"; };
  sources = $(sources prebuild) // {
    \"/bin/busybox\" = derivation { name = \"busybox\"; system = \"x86_64-linux\"; builder = \"/x\"; };
  };
}).prebuild" >/dev/null || fail "an image with a derivation output as a source does not instantiate"
for image in prebuild runtime; do
    cat >"$work/$image.nix" <<EOF
(import $root/images {
  cordonImage = builtins.path { path = $image_tool; name = "cordon-image"; };
  sources = $(sources "$image");
}).$image
EOF
    out=$(nix-build "${sandbox[@]}" --no-out-link "$work/$image.nix")
    pin=$(sed -n "s/^image \"$image\" digest=\"\(sha256:[0-9a-f]*\)\"/\1/p" policy/evaluator.kdl)
    got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$out/index.json")
    [ "$got" = "$pin" ] || fail "image $image built in the sandbox is $got, the policy pins $pin"
    nix-build "${sandbox[@]}" --no-out-link --check "$work/$image.nix" >/dev/null \
        || fail "image $image does not rebuild bit for bit"
    echo "image $image: $got = pin, rebuilt bit for bit ($out)"
    declare "layout_$image=$out"
done
echo "== 5. the module's render commands, run on the real policies"
cargo build --quiet --locked -p cordon-policy
policy_bin=$root/target/debug/cordon-policy
runc_bin=$(command -v runc)
for etc in policy surface; do
    # The facts exactly as the module passes them, the stub's runc path swapped for this host's,
    # the images' for the layouts the sandbox built (4.) and the worker's for the one they hold.
    mapfile -t facts < <(python3 -c '
import json, re, sys
e = json.load(open(sys.argv[1]))["etc"]["cordon/" + sys.argv[2] + ".kdl"]
runc, layouts, worker = sys.argv[3], dict(zip(("prebuild", "runtime"), sys.argv[4:6])), sys.argv[6]
print(e["reviewed"])
for f in e["facts"]:
    image = re.fullmatch(r"(prebuild|runtime)=/nix/store/[^/]*-cordon-image-(prebuild|runtime)", f)
    if f.endswith("-runc-1.3.0/bin/runc"):
        print(runc)
    elif image and image[1] == image[2]:
        print(f"{image[1]}={layouts[image[1]]}")
    elif re.fullmatch(r"/nix/store/[^/]*-cordon-worker[^/]*/bin/cordon-worker", f):
        print(worker)
    else:
        print(f)
' "$work/host.json" "$etc" "$runc_bin" "$layout_prebuild" "$layout_runtime" \
        "$root/target/worker/x86_64-unknown-linux-gnu/release/cordon-worker")
    "$policy_bin" render "${facts[0]}" --out "$work/$etc.kdl" "${facts[@]:1}" >"$work/$etc.diff"
    "$policy_bin" check "$work/$etc.kdl" >/dev/null
    grep -q "sha256=\"sha256:$(sha256sum "$runc_bin" | cut -c1-64)\"" "$work/$etc.kdl" \
        || fail "the rendered $etc policy does not pin the runtime it hashed"
    echo "-- cordon-policy render ${facts[0]} (the diff a reviewer sees):"
    cat "$work/$etc.diff"
done
grep -q "^runtime \"runc\" path=\"$runc_bin\"" "$work/policy.kdl" || fail "the rendered policy does not name the runtime"
# The module pins the images and worker it was given: here the pinned ones, so no change shows.
grep -q -- '--image' <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["etc"]["cordon/policy.kdl"]["facts"])' "$work/host.json") \
    || fail "the module does not render the image pins"
! grep -q '^\[image\]\|^\[worker\]' "$work/policy.diff" || fail "the pinned images rendered as a change"
grep -q 'accounts.shell: "/usr/sbin/nologin" → ' "$work/policy.diff" || fail "the diff does not show the shell"
grep -q 'state-dir' "$work/surface.diff" || fail "the surface diff does not show the state directory"
# Render refuses to overwrite, and a fact whose node the policy lacks.
if "$policy_bin" render policy/evaluator.kdl --out "$work/policy.kdl" --store /s 2>/dev/null; then
    fail "render overwrote an existing file"
fi
if "$policy_bin" render policy/evaluator.kdl --out "$work/x.kdl" --state-dir /s 2>/dev/null; then
    fail "render set a surface state-dir on a policy without a surface stage"
fi
[ ! -e "$work/x.kdl" ] || fail "a refused render left its output behind"

echo "checks/nix.sh: all packaging checks that can run here passed"
