"""The sealed-direct-artifact tier's compile driver (seed 001 §3), validator code shipped in the
prebuild image and run by images/patchers/sealed-direct-artifact as the patcher's bounded child.

It reads the compile request the host wrote (canonical JSON, schema cordon.compile-request/1,
at most 64 KiB) on stdin, imports the declared candidate factory from the tree (mounted
read-only at /engine, the only import path) and calls it with the request. The closed ABI: the
factory returns a pair (artifact, profile) -- artifact bytes and a profile dict -- and the
driver writes them in the fixed layout /staging/result/artifact.bin and
/staging/result/profile.json (canonical JSON), and nothing else.

The driver is not a trust boundary: the factory runs in this interpreter and can change
anything here. The host checks what is left in staging after the child is gone (exactly the
two files, their bounds, the profile's schema) before anything is sealed, and never imports
the candidate's Python or loads the artifact.
"""
import json
import os
import sys

MAX_REQUEST = 64 * 1024
REQUEST_SCHEMA = "cordon.compile-request/1"


def fail(why):
    sys.stderr.write("aot-driver: " + why + "\n")
    sys.exit(2)


raw = sys.stdin.buffer.read(MAX_REQUEST + 1)
if len(raw) > MAX_REQUEST:
    fail("the compile request is larger than 64 KiB")
request = json.loads(raw)
if not isinstance(request, dict) or request.get("schema") != REQUEST_SCHEMA:
    fail("the compile request is not " + REQUEST_SCHEMA)
module, _, name = request["factory"].partition(":")

# The tree is the only place an import resolves beyond the interpreter's own modules.
sys.path[:] = ["/engine"]
factory = getattr(__import__(module, fromlist=["_"]), name)
result = factory(request)
if not (isinstance(result, tuple) and len(result) == 2):
    fail("the factory did not return a pair (artifact, profile)")
artifact, profile = result
if not isinstance(artifact, bytes) or not isinstance(profile, dict):
    fail("the factory's pair is not (bytes, dict)")
os.mkdir("/staging/result")
with open("/staging/result/artifact.bin", "wb") as f:
    f.write(artifact)
with open("/staging/result/profile.json", "w", encoding="utf-8") as f:
    f.write(json.dumps(profile, sort_keys=True, separators=(",", ":"), ensure_ascii=True))
