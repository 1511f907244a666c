"""Scripts the integration tests run inside namespaces to move a TCP stream
and prove it arrived intact (length and sha256 on both ends).

Run as ``python -c HASH_SINK IP PORT [TIMEOUT]``: prints ``listening``, then,
after one connection closed, ``<bytes> <sha256>``.
``python -c HASH_SOURCE IP PORT NBYTES [SEED] [TIMEOUT]``: sends NBYTES of
seeded random data and prints the same line for what it sent.
"""

HASH_SINK = r"""
import hashlib, socket, sys
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 20
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(timeout)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(timeout)
h = hashlib.sha256(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    h.update(b); n += len(b)
print(n, h.hexdigest(), flush=True)
"""

HASH_SOURCE = r"""
import hashlib, random, socket, sys
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 7
timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 20
data = random.Random(seed).randbytes(int(sys.argv[3]))
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=timeout)
s.sendall(data); s.close()
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"""
