"""The registered example engine harness with several processes (a step whose `ranks` is
more than one): `serve-ranks.py RANKS`.

Validator-owned, shipped in the runtime image. Like a real serving engine it starts several
processes: this frontend, which speaks the lane's framed protocol on stdin and deals each
request to a scheduler; one scheduler process per rank, each of which loads the engine tree
(engine.serve.generate(prompt, tokens, model_dir)) and answers the requests dealt to it; and
a detokenizer, which frames each answer on stdout. Only the schedulers load candidate code,
and each reports its rank to cordon's worker on the member socket before it does, then
closes it. The frontend and the detokenizer refuse any import of the engine tree and report
the attempt in their own role, which the host rejects. Built-in and frozen modules only.
"""
import os
import sys

MAGIC = b"CDL1"
READY, REQUEST, RESPONSE = 3, 4, 5
PROTOCOL = 1

ranks = int(sys.argv[1])
members = int(os.environ["CORDON_MEMBERS_FD"])


class Gate:
    """The import gate of a process that must not load candidate code."""

    def __init__(self, role):
        self.role = role

    def find_spec(self, name, path=None, target=None):
        if name == "engine" or name.startswith("engine."):
            os.write(members, (self.role + " 0").encode())
            raise ImportError(name + ": the " + self.role + " does not load the engine tree")
        return None


def read_exact(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def words(values):
    return b"".join(v.to_bytes(4, "big") for v in values)


def send(kind, payload):
    write_all(1, MAGIC + bytes([kind]) + len(payload).to_bytes(4, "big") + payload)


def put(fd, payload):
    write_all(fd, len(payload).to_bytes(4, "big") + payload)


def get(fd):
    head = read_exact(fd, 4)
    return None if head is None else read_exact(fd, int.from_bytes(head, "big"))


def scheduler(rank, requests, answers):
    # This process, scheduler rank `rank`, loads the engine tree now.
    os.write(members, ("scheduler " + str(rank)).encode())
    os.close(members)
    sys.meta_path[:] = [m for m in sys.meta_path if not isinstance(m, Gate)]
    sys.path.insert(0, "/engine")
    import engine.serve as serve

    while True:
        payload = get(requests)
        if payload is None:
            os._exit(0)
        ids = [int.from_bytes(payload[i:i + 4], "big") for i in range(0, len(payload), 4)]
        index, tokens, prompt = ids[0], ids[1], ids[2:]
        output = serve.generate(prompt, tokens, "/model")
        put(answers, words([index, tokens] + list(output)))


def detokenizer(answers):
    sys.meta_path[:] = [m for m in sys.meta_path if not isinstance(m, Gate)]
    sys.meta_path.insert(0, Gate("detokenizer"))
    while True:
        payload = get(answers)
        if payload is None:
            os._exit(0)
        send(RESPONSE, payload)


sys.meta_path.insert(0, Gate("frontend"))
answers_r, answers_w = os.pipe()
children, to_scheduler = [], []
for rank in range(ranks):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.close(answers_r)
        for other in to_scheduler:
            os.close(other)
        try:
            scheduler(rank, r, answers_w)
        finally:
            os._exit(1)
    os.close(r)
    to_scheduler.append(w)
    children.append(pid)
pid = os.fork()
if pid == 0:
    for w in to_scheduler:
        os.close(w)
    os.close(answers_w)
    try:
        detokenizer(answers_r)
    finally:
        os._exit(1)
children.append(pid)
os.close(answers_r)
os.close(answers_w)

send(READY, words([PROTOCOL]))
inp = 0
while True:
    header = read_exact(inp, 9)
    if header is None:
        break
    if header[:4] != MAGIC or header[4] != REQUEST:
        sys.exit(2)
    payload = read_exact(inp, int.from_bytes(header[5:9], "big"))
    if payload is None:
        sys.exit(2)
    index = int.from_bytes(payload[0:4], "big")
    put(to_scheduler[index % ranks], payload)
for w in to_scheduler:
    os.close(w)
failed = 0
for pid in children:
    _, status = os.waitpid(pid, 0)
    failed |= status
sys.exit(1 if failed else 0)
