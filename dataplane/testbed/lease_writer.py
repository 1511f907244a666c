"""Many peer leases written at once into a testbed's etcd, as a large cluster would write them.

The testbed's etcd listens inside the switch namespace, out of the caller's reach, and `etcdctl`
costs a process per key; so :class:`LeaseWriter` keeps one child in the switch namespace that talks
to etcd with the project's own client (control/registry.py, over control/etcd.py) and takes its
orders as JSON lines on stdin::

    {"op": "put", "leases": [["10.1.0.0/24", "172.16.0.1"], ...], "txn": 0, "window": 32}
    {"op": "delete", "subnets": ["10.1.0.0/24", ...], "window": 32}

Each lease gets flanneld's key and value (docs/flannel-compat.md#lease-value), with no etcd lease
attached. ``txn: K`` writes K keys per transaction (a quick way to preload thousands); otherwise every
key is its own put (or delete), hence its own revision and its own watch event, ``window`` of them in
flight at once from one thread (a burst as fast as etcd takes it, for little of the machine's CPU,
which the daemons under test share). The answer is one JSON line: ``{"t_first", "t_last", "count",
"results"}`` (results: how many calls answered a revision or a deletion), the wall-clock times
(``time.time()``, the same clock in every namespace) at which the first request was sent and the last
one answered.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import deque
from ipaddress import IPv4Address, IPv4Network

from ..host.child import python_argv

WINDOW = 32                 # requests in flight during a burst
TXN_MAX_OPS = 128           # etcd's default --max-txn-ops
CALL_TIMEOUT_S = 30.0
FAKE_PUBLIC_IPS = "172.16.0.1"      # fake_leases' PublicIPs upwards
# an address for a host's link whose prefix holds every fake PublicIP (172.16/12): with it,
# a DirectRouting scene finds every peer on the link
FAKE_PUBLIC_IPS_ON_LINK = "172.31.255.254/12"


class LeaseWriter:
    """The parent's side: one child in ``where`` (the testbed's switch), closed by :meth:`close`."""

    def __init__(self, testbed, etcd_url: str, prefix: str, where: str = "switch"):
        self._tb = testbed
        self._lock = threading.Lock()
        self.proc = testbed.popen(where, python_argv(
            "from dataplane.testbed.lease_writer import serve\n"
            f"serve({etcd_url!r}, {prefix!r})"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)

    def _ask(self, order: dict, timeout: float) -> dict:
        with self._lock:
            self.proc.stdin.write(json.dumps(order) + "\n")
            self.proc.stdin.flush()
            line = _readline(self.proc.stdout, timeout)
        if not line:
            raise RuntimeError(f"lease writer exited ({self.proc.poll()}): {self.proc.stderr.read()[-2000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"lease writer: {answer['error']}")
        return answer

    def put(self, leases, *, txn: int = 0, window: int = WINDOW, prefix: str | None = None,
            timeout: float = 300.0, direct_routing: bool = False) -> dict:
        """``leases``: {subnet: PublicIP} (or pairs). One revision per key unless ``txn``.
        ``prefix``: another etcd prefix than the overlay's (the same load, nobody watching).
        ``direct_routing``: the values say ``"DirectRouting": true`` (control/direct.py)."""
        pairs = leases.items() if hasattr(leases, "items") else leases
        return self._ask({"op": "put", "leases": [[str(s), str(ip)] for s, ip in pairs],
                          "txn": int(txn), "window": int(window), "prefix": prefix,
                          "direct_routing": bool(direct_routing)}, timeout)

    def delete(self, subnets, *, window: int = WINDOW, prefix: str | None = None,
               timeout: float = 300.0) -> dict:
        """One delete, hence one revision, per subnet."""
        return self._ask({"op": "delete", "subnets": [str(s) for s in subnets],
                          "window": int(window), "prefix": prefix}, timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._tb.kill(self.proc)


def fake_leases(base: str, count: int, first_ip: int = 0) -> dict:
    """{subnet: PublicIP} for ``count`` /24s upwards from ``base``, as a large cluster's other
    hosts: each its own PublicIP, in 172.16/12 from its ``first_ip``-th address on (addresses that
    never answer: nothing on the testbed holds them)."""
    start, ip0 = int(IPv4Address(base)), int(IPv4Address(FAKE_PUBLIC_IPS)) + first_ip
    return {IPv4Network((start + (i << 8), 24)): str(IPv4Address(ip0 + i)) for i in range(count)}


def _readline(stream, timeout: float) -> str:
    """One line from ``stream``, or "" after ``timeout`` seconds (the child is stuck)."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else ""


# -- the child ------------------------------------------------------------------------------------

def serve(etcd_url: str, prefix: str) -> None:
    """The child's loop: one order per stdin line, one answer per stdout line, until EOF."""
    from ..control.registry import Registry
    reg = Registry([etcd_url], prefix, timeout=CALL_TIMEOUT_S)
    try:
        for line in sys.stdin:
            try:
                answer = _perform(reg, json.loads(line))
            except Exception as exc:          # reported to the parent, which raises it
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        reg.close()


def _perform(reg, order: dict) -> dict:
    from ..control.lease import LeaseAttrs, subnet_key_name
    op, window = order["op"], int(order.get("window") or WINDOW)
    under = f"{order['prefix'].rstrip('/')}/subnets/" if order.get("prefix") else reg.subnets_prefix

    def key(subnet: str) -> str:
        return under + subnet_key_name(IPv4Network(subnet))
    if op == "put":
        direct = bool(order.get("direct_routing"))
        items = [(key(s), LeaseAttrs(IPv4Address(ip), direct_routing=direct).to_json())
                 for s, ip in order["leases"]]
        chunk = min(int(order.get("txn") or 0), TXN_MAX_OPS)
        if chunk:
            batches = [dict(items[i:i + chunk]) for i in range(0, len(items), chunk)]
            return _timed(lambda b: reg.txn_put_delete(b), batches)
        return _burst(lambda: pipelined(reg, puts=items, window=window), len(items))
    if op == "delete":
        keys = [key(s) for s in order["subnets"]]
        return _burst(lambda: pipelined(reg, deletes=keys, window=window), len(keys))
    raise ValueError(f"unknown op {op!r}")


def _timed(call, items) -> dict:
    t_first = time.time()
    results = [call(x) for x in items]
    return {"t_first": t_first, "t_last": time.time(), "count": len(items),
            "results": sum(map(bool, results))}


def _burst(call, count: int) -> dict:
    """``call()``: pipelined calls, each key its own (:func:`pipelined`)."""
    t_first = time.time()
    answered = call()
    return {"t_first": t_first, "t_last": time.time(), "count": count, "results": answered}


def pipelined(etcd, puts: "list[tuple[str, bytes | str]]" = (), deletes: "list[str]" = (),
              window: int = WINDOW) -> int:
    """Each put (key, value), then each delete (key), its own call on the client ``etcd``
    (control/etcd.py), hence its own revision and watch event, ``window`` calls in flight from
    this one thread: a burst as fast as etcd takes it, for little CPU. On the current endpoint,
    without failover: a load generator's, not the daemon's. Returns how many puts got a
    revision and deletes deleted a key."""
    import grpc                 # after control/etcd.py (``etcd`` is its client), which quiets gRPC
    from pyetcd import etcdrpc

    from ..control.etcd_errors import RegistryError
    channel = etcd.endpoint().channel()
    metadata = etcd.metadata(channel)
    kv = etcdrpc.KVStub(channel)
    calls = [(kv.Put, etcdrpc.PutRequest(key=k.encode(), value=v if isinstance(v, bytes) else v.encode()))
             for k, v in puts]
    calls += [(kv.DeleteRange, etcdrpc.DeleteRangeRequest(key=k.encode())) for k in deletes]
    pending: deque = deque()
    answered = 0

    def settle() -> int:
        resp = pending.popleft().result()
        return int(resp.deleted > 0) if hasattr(resp, "deleted") else int(resp.header.revision > 0)
    try:
        for method, req in calls:
            if len(pending) >= window:
                answered += settle()
            pending.append(method.future(req, timeout=etcd.timeout, metadata=metadata))
        while pending:
            answered += settle()
    except grpc.RpcError as exc:
        raise RegistryError(f"etcd burst: {exc.code().name}: {exc.details()}") from None
    return answered
