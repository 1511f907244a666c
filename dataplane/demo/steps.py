"""The steps of the story, as the demo tells them: title, host, side of the boundary, syscalls,
copies, the "why", and the data measured. No I/O here.

Each function takes the demo's result so far (the dict ``--json`` prints: hosts, leases, probes,
bursts, ...) and returns one step; ``story.py`` numbers it and hands it to the renderer, whose
table (``render.py``) has one entry per step id declared here. ``steps_direct.py`` holds the steps
only the direct path has, ``steps_kernel.py`` those of the kernel path.
"""
from __future__ import annotations

from . import readings
from . import trace as tr

#: The story through the engines, in the order it is told.
TUN_PATH = ("overlay", "workloads", "app_send", "kernel_route", "tun_read", "lookup", "udp_send",
            "udp_recv", "tun_write", "deliver", "reply", "udp_packet", "ping_cost", "batching",
            "summary")
#: The story with --ipv6: the same, and an IPv6 ping after the UDP datagram.
TUN_PATH_IPV6 = TUN_PATH[:TUN_PATH.index("udp_packet") + 1] + ("ping6",) + \
    TUN_PATH[TUN_PATH.index("udp_packet") + 1:]
#: The story with --direct-routing.
DIRECT_PATH = ("overlay", "workloads", "app_send", "kernel_route", "wire", "untouched",
               "deliver_direct", "summary")
#: The story with --engine kernel: the ping through the tc programs (steps_kernel.py).
KERNEL_PATH = ("overlay", "workloads", "app_send", "kernel_route", "tc_egress", "tc_ingress",
               "engines_idle", "slow_path", "summary")
STEP_IDS = frozenset(TUN_PATH_IPV6 + DIRECT_PATH + KERNEL_PATH)

#: The UDP calls of each engine: the C engine batches the UDP side (one sendmmsg/recvmmsg per
#: batch); Python has neither call, so it makes one sendto()/recvfrom_into() per datagram.
SYSCALL_NAMES = {"c": {"send": "sendmmsg()", "recv": "recvmmsg()"},
                 "python": {"send": "sendto()", "recv": "recvfrom_into()"}}


def step(sid: str, title: str, *, host: str, side: str, why: str, data: dict,
         syscalls: list | None = None, copies: int | None = None) -> dict:
    """One step; a step id the story does not declare is a mistake, refused here."""
    if sid not in STEP_IDS:
        raise ValueError(f"step {sid!r} is not one of the story's (steps.TUN_PATH, DIRECT_PATH, "
                         "KERNEL_PATH)")
    s = {"id": sid, "title": title, "host": host, "side": side}
    if syscalls is not None:
        s["syscalls"] = syscalls
    if copies is not None:
        s["copies"] = copies
    s.update(why=why, data=data)
    return s


# -- both paths -----------------------------------------------------------------------------

def overlay(r: dict, underlay_mtu: int) -> dict:
    hosts = r["hosts"]
    why = ("Each daemon picked its interface, took a lease on a subnet in etcd (key = subnet, "
           "value = its PublicIP), opened flannel0 (MTU = interface MTU "
           f"{underlay_mtu} - 28 = {hosts['A']['flannel0_link'].get('mtu')}), routed the whole "
           "network into it and wrote subnet.env. The lease table in etcd is the overlay's only "
           "routing protocol.")
    if r.get("direct_routing"):
        why += (" With DirectRouting each lease also says so, and each daemon routed the other's "
                "subnet via its PublicIP on the shared link (proto 153), more specific than the "
                "route into flannel0.")
    if r.get("datapath") == "kernel":
        why += (f" With --engine kernel each daemon also loaded two tc programs and attached them "
                f"to flannel0's egress and its interface's ingress, the {r['engine']} engine "
                "behind them as the slow path; it writes their maps from the same leases.")
    return step("overlay", "A two-host overlay: etcd, two daemons, their leases",
                host="A+B", side="control plane", why=why,
                data={"leases": r["leases"], "hosts": hosts, "config": r["network_config"],
                      "startup_s": r["startup_s"]})


def workloads(r: dict) -> dict:
    hosts = r["hosts"]
    return step("workloads", "Workloads: one 'container' per host, on FLANNEL_SUBNET",
                host="A+B", side="kernel",
                why="A container host puts its workloads on a bridge addressed from "
                    "FLANNEL_SUBNET and forwards between them and flannel0; here one namespace "
                    "per host plays the container.",
                data={"A": hosts["A"]["workload"], "B": hosts["B"]["workload"]})


def app_send(r: dict) -> dict:
    """The first step of every followed ping: the application's own send."""
    A, B = r["hosts"]["A"], r["hosts"]["B"]
    res = r["probes"]["ping"]["result"]
    return step("app_send", "ping in A's workload sends an echo request", host="A",
                side="user -> kernel", syscalls=["sendmsg() by ping"], copies=1,
                why="The application's own cost, the same on every path: one syscall, and "
                    "its bytes copied into a kernel buffer (an skb).",
                data={"from": A["workload"]["ip"], "to": B["workload"]["ip"],
                      "size": res["size"], "ip_len": res["expected_len"],
                      "route_in_workload": A["route_get_workload"]})


# -- the ping through the engines -----------------------------------------------------------

def _ping(r: dict):
    """The ping's window, its request leg, and the counters of A and B during it."""
    ping = r["probes"]["ping"]
    return ping, ping["request"], ping["counters"]["A"], ping["counters"]["B"]


def kernel_route(r: dict) -> dict:
    _, req, _, _ = _ping(r)
    return route_into_flannel0(r, req["tun_read"]["packet"]["ttl"],
                               "Handing the packet to a TUN device just queues the skb for "
                               "whoever holds the device open: the daemon.")


def route_into_flannel0(r: dict, ttl_after_forward: int | None, then: str) -> dict:
    """The kernel_route step: A's kernel routes the packet into flannel0; ``then`` says what
    happens to it there."""
    A = r["hosts"]["A"]
    return step("kernel_route", "A's kernel routes it into flannel0", host="A", side="kernel",
                syscalls=[], copies=0,
                why="Plain kernel forwarding: the longest prefix that matches is the "
                    f"{r['network_config'].get('Network')} route the daemon added "
                    f"'dev flannel0'. {then}",
                data={"route_get": A["route_get"],
                      "route": tr.route_for("\n".join(A["routes"]),
                                            r["hosts"]["B"]["workload"]["ip"]),
                      "ttl_after_forward": ttl_after_forward})


def tun_read(r: dict) -> dict:
    _, req, cA, _ = _ping(r)
    rd = req["tun_read"]
    return step("tun_read", "The engine reads the packet from flannel0", host="A",
                side="kernel -> user", syscalls=["read(flannel0)"], copies=1,
                why="The first crossing the overlay adds: one read() per packet (a TUN has "
                    "no batched read), the whole packet copied from the kernel into the "
                    "engine's buffer. The engine keeps reading until EAGAIN, so a burst costs "
                    "one extra read, not one per packet.",
                data={"len": rd["len"], "packet": rd["packet"], "head": rd["head"],
                      "tun_reads": cA.get("tun_reads"), "polls": cA.get("polls"),
                      "tun_rx_packets": cA.get("tun_rx_packets")})


def lookup(r: dict) -> dict:
    _, req, _, _ = _ping(r)
    pkt, hit = req["tun_read"]["packet"], req["route_hit"]
    return step("lookup", "Lease-table lookup: which host holds the destination's subnet?",
                host="A", side="user", syscalls=[], copies=0,
                why="A hash lookup of the destination in the route table built from the "
                    "leases in etcd (subnet -> PublicIP); TTL - 1 and an incremental checksum "
                    "update, in place. No syscall, no copy.",
                data={"dst": pkt["dst"], "prefixlen": hit["prefixlen"], "peer": hit["peer"],
                      "port": hit["port"], "lease": hit.get("lease"), "ttl_out": pkt["ttl"] - 1,
                      "checksum_in": pkt["checksum"],
                      "checksum_out": req["udp_recv"]["packet"]["checksum"]})


def udp_send(r: dict) -> dict:
    _, req, cA, _ = _ping(r)
    send, batch = r["syscall_names"]["send"], req["udp_send"]["batch"]
    return step("udp_send", f"{send}: the packet becomes a UDP payload", host="A",
                side="user -> kernel", syscalls=[f"{send} ({batch} packet(s) in this batch)"],
                copies=1,
                why="The second crossing: the packet is copied into a new skb and the kernel "
                    f"puts an IPv4 header ({tr.OUTER_IP} B) and a UDP header ({tr.OUTER_UDP} B) "
                    f"in front: {tr.OVERHEAD} bytes of overhead, which is why flannel0's MTU is "
                    "the interface MTU - 28. " + (
                        "One sendmmsg() carries the whole batch." if r["engine"] == "c" else
                        "Python has no sendmmsg(): one sendto() per packet of the batch."),
                data={"outer": req["outer"], "batch": batch, "wire": req.get("wire"),
                      "udp_sends": cA.get("udp_sends")})


def udp_recv(r: dict) -> dict:
    _, req, _, cB = _ping(r)
    rcv, recv = req["udp_recv"], r["syscall_names"]["recv"]
    return step("udp_recv", "B's engine receives the datagram", host="B", side="kernel -> user",
                syscalls=[f"{recv} ({rcv['batch']} datagram(s) in this batch)"], copies=1,
                why="The third crossing: B's kernel delivers the datagram to the daemon's "
                    f"socket and {recv} copies the payload - the inner packet - out. The "
                    "source is checked against the leases (--accept-from leases).",
                data={"source": rcv["source"], "sport": rcv["sport"], "len": rcv["len"],
                      "batch": rcv["batch"], "packet": rcv["packet"],
                      "source_is_lease": any(l["public_ip"] == rcv["source"]
                                             for l in r["leases"]),
                      "udp_recvs": cB.get("udp_recvs")})


def tun_write(r: dict) -> dict:
    ping = r["probes"]["ping"]
    wr = ping["request"]["tun_write"]
    return step("tun_write", "B's engine writes the packet into flannel0", host="B",
                side="user -> kernel", syscalls=["write(flannel0)"], copies=1,
                why="The fourth crossing: one write() per packet, the packet copied back into "
                    "a kernel skb. To B's kernel it now looks as if it had arrived on "
                    "flannel0.",
                data={"len": wr["len"], "packet": wr["packet"], "head": wr["head"],
                      "tun_writes": ping["counters"]["B"].get("tun_writes")})


def deliver(r: dict) -> dict:
    _, req, _, _ = _ping(r)
    return step("deliver", "B's kernel routes it to the workload", host="B", side="kernel",
                syscalls=[], copies=0,
                why="Ordinary forwarding again, out of flannel0 into the workload's veth. An "
                    "echo request is answered by the workload's kernel itself; a UDP "
                    "datagram would cost its application one recvfrom() and one copy, as on "
                    "any path.",
                data={"route_get": r["hosts"]["B"]["route_get"],
                      "ttl_at_workload": req["tun_write"]["packet"]["ttl"] - 1})


def reply(r: dict) -> dict:
    ping, req, _, _ = _ping(r)
    rep, sc = ping["reply"], r["syscall_names"]
    return step("reply", "The reply takes the same path back", host="B -> A", side="both",
                syscalls=["read()", sc["send"], sc["recv"], "write()"], copies=4,
                why="Mirror image: B's engine reads the echo reply from its flannel0, looks "
                    "up A's lease, sends; A's engine receives it and writes it into A's "
                    "flannel0.",
                data={**{k: rep[k] for k in tr.LEG_EVENTS}, "outer": rep["outer"],
                      "wire": rep.get("wire"), "rtt_ms": ping["result"].get("rtt_ms"),
                      "reply_ttl": ping["result"].get("ttl"),
                      "timeline": readings.timeline(req, rep, sc)})


#: The ping through the engines, step by step.
PING_STEPS = (app_send, kernel_route, tun_read, lookup, udp_send, udp_recv, tun_write, deliver,
              reply)


def udp_packet(r: dict) -> dict:
    """The UDP datagram: the same steps, shown as one table."""
    udp = r["probes"]["udp"]
    return step("udp_packet", "A UDP datagram takes the same path", host="A -> B -> A",
                side="both",
                why="Any IPv4 packet is carried the same way: the engine does not look past "
                    "the IP header. The outer datagram is always the inner packet + 28.",
                data={"request": readings.leg_summary(udp["request"]),
                      "reply": readings.leg_summary(udp["reply"]), "result": udp["result"]})


def ping6(r: dict) -> dict:
    """The IPv6 ping (demo --ipv6): the same path, shown as one table, its IPv6 header first."""
    p = r["probes"]["ping6"]
    req = p["request"]
    return step("ping6", "An IPv6 ping takes the same path, over the IPv4 underlay",
                host="A -> B -> A", side="both",
                why="The engine reads the version nibble and, for IPv6, looks the destination up "
                    "in the IPv6 routes the daemon made of the peers' IPv6 lease parts (a /64 "
                    "each, next hop the peer's IPv4 PublicIP): the outer datagram is the same "
                    "IPv4 + UDP, inner packet + 28. The hop limit is IPv6's TTL: the engine "
                    "takes one off as it takes one off the TTL, with no header checksum to "
                    "update (IPv6 has none). Nor has it an identification field: the trace ties "
                    "the two hosts' events by the echo's id and sequence.",
                data={"request": readings.leg_summary(req),
                      "reply": readings.leg_summary(p["reply"]), "result": p["result"],
                      "header": req["tun_read"]["packet"], "head": req["tun_read"]["head"],
                      "lease": req["route_hit"].get("lease")})


# -- the costs ------------------------------------------------------------------------------

def ping_cost(r: dict) -> dict:
    _, _, cA, cB = _ping(r)
    return step("ping_cost", "What that one ping cost the two engines (measured)",
                host="A+B", side="both",
                why="Two packets (request and reply) went through each engine, one at a "
                    "time. Nothing amortises: each packet pays its own wakeup (epoll_wait), "
                    "the call that moves it in, the call that moves it out, and draining calls "
                    f"that find nothing (EAGAIN): {readings.syscalls_per_packet(cA)} syscalls "
                    f"per packet on A, {readings.syscalls_per_packet(cB)} on B.",
                data={"A": readings.cost_row(cA), "B": readings.cost_row(cB),
                      "engine": r["engine"], "syscall_names": r["syscall_names"]})


def batching(r: dict, skipped: dict) -> dict:
    return step("batching", "Batching: syscalls per packet under load (measured)",
                host="A+B", side="both",
                why="When packets queue up, one wakeup drains many: the engine reads the TUN "
                    "until EAGAIN and hands the batch to one sendmmsg(); the receiver takes up "
                    "to 64 datagrams per recvmmsg(). TUN reads and writes stay one per packet "
                    "- a TUN device has no batched read or write - so the floor is about one "
                    "syscall per packet on each side. The Python engine has no sendmmsg/"
                    "recvmmsg: one sendto()/recvfrom_into() per packet, so it never gets "
                    "below about two syscalls per packet.",
                data={"bursts": r["bursts"], "skipped": skipped,
                      "reference_flanneld": tr.FLANNELD_REFERENCE})


def summary(r: dict) -> dict:
    return step("summary", "Why a TUN overlay costs what it costs", host="A+B", side="both",
                why="Kernel paths move a packet between devices inside the kernel. A TUN "
                    "overlay takes every packet out to user space and back in, on both hosts: "
                    "4 extra copies, always, and without batching 4 extra syscalls plus the "
                    "wakeups. Batching shares the wakeups and the UDP calls among the packets "
                    "of a batch, which leaves about one syscall per packet per host (a TUN has "
                    "no batched read or write: 2 per packet in all), but it never removes a "
                    "copy. Fewer copies and syscalls per byte need offloads (IFF_VNET_HDR + "
                    "UDP GSO/GRO: fewer, bigger packets), or staying in the kernel (VXLAN).",
                data=readings.cost_summary(r))
