"""The registered example engine harness (policy step "serve-example", stage lane).

Validator-owned, shipped in the runtime image: it speaks the lane's framed protocol on
stdin/stdout (4-byte magic, 1-byte kind, 4-byte big-endian length, payload; requests and
responses are big-endian u32 words) and asks the engine tree's registered entry point,
engine.serve.generate(prompt, tokens, model_dir), for each response. It imports nothing
but what the interpreter has built in or frozen, so the image carries no standard library
beyond the encodings the interpreter needs to start.

It is the engine's one scheduler rank (its step declares `ranks 1`): before it loads the
engine tree it reports so to cordon's worker on the member socket, then closes it, so
nothing of the candidate can report in its name.
"""
import os
import sys

# The member report: this process, scheduler rank 0 (the kernel attaches its pid).
members = int(os.environ["CORDON_MEMBERS_FD"])
os.write(members, b"scheduler 0")
os.close(members)

# The engine tree is mounted read-only at /engine; -I keeps every other path out.
sys.path.insert(0, "/engine")

import engine.serve as serve  # noqa: E402

MAGIC = b"CDL1"
READY, REQUEST, RESPONSE = 3, 4, 5
PROTOCOL = 1

inp = sys.stdin.buffer
out = sys.stdout.buffer


def send(kind, payload):
    out.write(MAGIC + bytes([kind]) + len(payload).to_bytes(4, "big") + payload)
    out.flush()


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = inp.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def words(values):
    return b"".join(v.to_bytes(4, "big") for v in values)


send(READY, words([PROTOCOL]))
while True:
    header = read_exact(9)
    if header is None:
        break
    if header[:4] != MAGIC or header[4] != REQUEST:
        sys.exit(2)
    payload = read_exact(int.from_bytes(header[5:9], "big"))
    if payload is None:
        sys.exit(2)
    ids = [int.from_bytes(payload[i:i + 4], "big") for i in range(0, len(payload), 4)]
    index, tokens, prompt = ids[0], ids[1], ids[2:]
    output = serve.generate(prompt, tokens, "/model")
    send(RESPONSE, words([index, tokens] + list(output)))
