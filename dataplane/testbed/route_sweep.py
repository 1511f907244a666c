"""Does a daemon's engine route every peer? Asked of the engine itself, by traffic.

``flannel_udp_peers`` counts what the daemon holds; a table that lost some on the way to the
engine would still count them. So :func:`sweep` sends, from inside the host, one UDP datagram to
an address in each subnet (through flannel0, where the kernel routes the whole network) and reads
the engine's counters (/metrics) before and after: every datagram the engine reads either finds
a route (and is sent to the peer's PublicIP, or fails there: the testbed's fake PublicIPs reach
no one) or is dropped as ``no_route``. One extra datagram goes to ``control``, an address no
lease covers, so that a sweep that cannot see a miss fails too. The datagrams go out in small
trains with a pause between, so that flannel0's queue (500 packets) never overflows.
"""
from __future__ import annotations

import ipaddress
import sys
import time

TRAIN = 200
PAUSE_S = 0.004
PORT = 9                         # discard

_CHILD = r"""
import socket, sys, time
train, pause, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
addrs = sys.stdin.read().split()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i, a in enumerate(addrs):
    s.sendto(b"sweep", (a, port))
    if i % train == train - 1:
        time.sleep(pause)
"""

_TUN_RX = 'flannel_udp_packets_total{path="tun_rx"}'
_NO_ROUTE = 'flannel_udp_drops_total{reason="no_route"}'
# the kernel path: what its programs sent themselves (never read by the engine), and what they
# handed to the engine for want of a route in their maps (docs/metrics.md#kernel-path)
_KERNEL_TX = 'flannel_udp_packets_total{datapath="kernel",path="udp_tx"}'
_KERNEL_NO_ROUTE = 'flannel_udp_kernel_passed_total{direction="tx",reason="no_route"}'


def sweep(overlay, host, subnets, control: str, timeout: float = 30.0) -> dict:
    """{"sent", "read", "no_route", "missing"}: datagrams sent (one per subnet and the control),
    read by the engine, dropped for want of a route, and how many of the subnets had none
    (``no_route`` less the control's). ``read < sent`` means the sweep saw too little to judge.
    On the kernel path the programs' own sends count as read, and ``kernel_missing`` is how
    many subnets their maps lacked (handed to the engine as ``no_route``, less the control's)."""
    addrs = [str(ipaddress.ip_network(s).network_address + 1) for s in subnets] + [control]
    before = overlay.metrics(host)
    overlay.exec(host, [sys.executable, "-c", _CHILD, str(TRAIN), str(PAUSE_S), str(PORT)],
                 input="\n".join(addrs), timeout=timeout, check=True)
    deadline = time.monotonic() + timeout
    while True:                 # the engine reads what flannel0 queued within a moment
        after = overlay.metrics(host)
        read = sum(after.get(k, 0) - before.get(k, 0) for k in (_TUN_RX, _KERNEL_TX))
        if read >= len(addrs) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    time.sleep(0.2)             # other traffic may have made up the count: the last ones settle
    after = overlay.metrics(host)
    no_route = int(after.get(_NO_ROUTE, 0) - before.get(_NO_ROUTE, 0))
    kernel = int(after.get(_KERNEL_NO_ROUTE, 0) - before.get(_KERNEL_NO_ROUTE, 0))
    return {"sent": len(addrs), "read": int(read), "no_route": no_route,
            "missing": no_route - 1, "kernel_missing": kernel - 1 if _KERNEL_NO_ROUTE in after
            else None}
