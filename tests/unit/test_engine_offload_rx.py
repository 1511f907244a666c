"""The receive offloads of the C engine (csrc/rx.c, csrc/train.c, csrc/gro.c):
UDP_GRO trains split into datagrams, TCP segments coalesced into one GSO
write to the TUN (DP_OFF_TUN_GRO, rules at the top of csrc/gro.c), IPv4's
and IPv6's (a TCPV6 or UDP_L4 write whose csum_start is 40).

The "TUN" is the harness's socketpair (tests/engine_harness.py): the engine
only writes bytes, so what it wrote - virtio_net_hdr and all - is read back
as it is. Datagrams are queued before the engine starts, so that they all
arrive in its first recvmmsg batch (runs never outlive a batch).

What a coalesced write means is checked the way the kernel reads it: it is
segmented as tcp_gso_segment would (:func:`kernel_segments`), and those
segments must be exactly the forwarded packets, in order. The Python
engine has no offloads: every test runs on it with offloads 0 and the same
check (each write alone is a "segmentation" of one), so both engines are
seen to deliver the same packets.

One file over 450 lines: its packets, the kernel's segmentation and the run are what every
test here (and test_engine_udp_gro.py's) checks against; the UDP_GRO trains went to that file.
"""
from __future__ import annotations

import errno
import socket
import struct
import time

import pytest

from dataplane.engine import ipv4, ipv6
from dataplane.engine import OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO
from tests import gso_packets as gp
from tests.engine_harness import Harness, nonzero

SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104
ACK, PSH, FIN, SYN, RST, URG = 0x10, 0x08, 0x01, 0x02, 0x04, 0x20
VNET = struct.Struct("=BBHHHH")      # struct virtio_net_hdr, host order (the TUN default)
SRC, DST = "10.5.2.7", "10.5.1.9"
SRC6, DST6 = "fc00:5:0:2::7", "fc00:5:0:1::9"
RX_ALL = OFF_TUN_VNET | OFF_UDP_GRO | OFF_TUN_GRO


# ---- packets ------------------------------------------------------------------------

def tcp_seg(seq: int, size: int, *, flags: int = ACK, ack: int = 7777, win: int = 501,
            opts: bytes = b"", sport: int = 40000, dport: int = 5201, ident: int | None = None,
            ttl: int = 64, tos: int = 0, df: bool = True, src: str = SRC, dst: str = DST,
            bad_csum: bool = False) -> bytes:
    """A TCP/IPv4 segment with valid checksums (unless bad_csum); payload
    bytes depend on seq, so misplaced data shows."""
    data = bytes((seq + i) * 131 % 251 for i in range(size))
    thl = 20 + len(opts)
    th = bytearray(struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack,
                               (thl // 4) << 4, flags, win, 0, 0) + opts + data)
    pseudo = ipv4._addr(src) + ipv4._addr(dst) + struct.pack("!HH", 6, len(th))
    check = ipv4.checksum(pseudo + th) ^ (0x5555 if bad_csum else 0)
    th[16:18] = check.to_bytes(2, "big")
    return ipv4.build(src, dst, bytes(th), proto=6, ttl=ttl, tos=tos,
                      ident=(seq // 7) & 0xFFFF if ident is None else ident,
                      flags=2 if df else 0)


def udp_dgram(size: int, ident: int, *, sport: int = 4000, dport: int = 5000, ttl: int = 64,
              tos: int = 0, df: bool = True, src: str = SRC, dst: str = DST, csum: str = "ok",
              fill: int | None = None) -> bytes:
    """A UDP/IPv4 datagram of `size` payload bytes; csum "ok", "bad" or
    "none" (0: sent without one)."""
    data = bytes([ident & 0xFF if fill is None else fill]) * size
    uh = bytearray(struct.pack("!HHHH", sport, dport, 8 + size, 0) + data)
    if csum != "none":
        pseudo = ipv4._addr(src) + ipv4._addr(dst) + struct.pack("!HH", 17, len(uh))
        c = ipv4.checksum(pseudo + uh) or 0xFFFF
        uh[6:8] = (c ^ (0x5555 if csum == "bad" else 0)).to_bytes(2, "big")
    return ipv4.build(src, dst, bytes(uh), proto=17, ttl=ttl, tos=tos, ident=ident,
                      flags=2 if df else 0)


def udp_flow(n: int, size: int = 700, ident0: int = 300, **kw) -> list[bytes]:
    return [udp_dgram(size, ident0 + i, **kw) for i in range(n)]


def flow(n: int, size: int = 1000, seq0: int = 1000, ident0: int = 100, **kw) -> list[bytes]:
    """n contiguous segments of one flow, ids counting up."""
    return [tcp_seg(seq0 + i * size, size, ident=ident0 + i, **kw) for i in range(n)]


def tcp6_seg(seq: int, size: int, *, flags: int = ACK, hop: int = 64, flow_label: int = 0,
             traffic_class: int = 0, dst: str = DST6, sport: int = 40000) -> bytes:
    """A TCP/IPv6 segment of one flow (TCP right after the fixed header), payload by seq."""
    data = bytes((seq + i) * 131 % 251 for i in range(size))
    return gp.tcp6(SRC6, dst, data, sport=sport, dport=5201, seq=seq, ack=7777, flags=flags,
                   window=501, hop=hop, flow_label=flow_label, traffic_class=traffic_class)


def flow6(n: int, size: int = 1000, seq0: int = 1000, **kw) -> list[bytes]:
    return [tcp6_seg(seq0 + i * size, size, **kw) for i in range(n)]


def udp6_flow(n: int, size: int = 700, fill0: int = 0, dst: str = DST6, **kw) -> list[bytes]:
    return [gp.udp6(SRC6, dst, bytes([(fill0 + i) & 0xFF]) * size, **kw) for i in range(n)]


def udp_pkt(i: int, size: int, ttl: int = 64) -> bytes:
    return ipv4.build(SRC, DST, ipv4.udp_payload(4000, 5000, bytes([i]) * (size - 28)),
                      ttl=ttl, ident=i)


def forwarded(p: bytes) -> bytes:
    """p as the engine writes it: TTL (hop limit) - 1 (p's checksum is valid,
    so the incremental update equals a full one)."""
    if p[0] >> 4 == 6:
        return p[:7] + bytes([p[7] - 1]) + p[8:]
    h = bytearray(p[:20])
    h[8] -= 1
    h[10:12] = b"\0\0"
    h[10:12] = ipv4.checksum(h).to_bytes(2, "big")
    return bytes(h) + p[20:]


def pseudo_sum(ip: bytes, tcp_len: int) -> int:
    """The TCP pseudo-header sum, folded, not inverted."""
    return ~ipv4.checksum(ip[12:20] + struct.pack("!HH", 6, tcp_len)) & 0xFFFF


def kernel_segments(write: bytes, vnet: bool) -> tuple[list[bytes], bool]:
    """The IP packets the kernel makes of one TUN write, and whether it was
    a GSO write. A GSO write is checked field by field on the way."""
    if not vnet:
        return [write], False
    flags, gso_type, hdr_len, gso_size, cstart, coff = VNET.unpack_from(write)
    pkt = write[VNET.size:]
    if (flags, gso_type) == (0, 0):
        assert (hdr_len, gso_size, cstart, coff) == (0, 0, 0, 0), write[:10]
        return [pkt], False
    if pkt[0] >> 4 == 6:
        return _segments6(pkt, gso_type, hdr_len, gso_size, cstart, coff, flags), True
    if gso_type == 5:
        return _udp_segments(pkt, hdr_len, gso_size, cstart, coff, flags), True
    assert (flags, gso_type, cstart, coff) == (1, 1, 20, 16), VNET.unpack_from(write)
    assert pkt[0] == 0x45 and pkt[9] == 6
    thl = (pkt[32] >> 4) * 4
    assert hdr_len == 20 + thl
    assert int.from_bytes(pkt[2:4], "big") == len(pkt), "tot_len of the coalesced packet"
    assert ipv4.header_checksum_ok(pkt), "IP checksum of the coalesced packet"
    assert int.from_bytes(pkt[36:38], "big") == pseudo_sum(pkt, len(pkt) - 20), \
        "TCP checksum field must hold the folded pseudo-header sum"
    payload = pkt[hdr_len:]
    assert len(payload) > gso_size, "a GSO write must hold more than one segment"
    ident, seq0 = int.from_bytes(pkt[4:6], "big"), int.from_bytes(pkt[24:28], "big")
    out = []
    for i, off in enumerate(range(0, len(payload), gso_size)):
        chunk = payload[off:off + gso_size]
        last = off + gso_size >= len(payload)
        ip = bytearray(pkt[:20])
        ip[2:4] = (hdr_len + len(chunk)).to_bytes(2, "big")
        ip[4:6] = ((ident + i) & 0xFFFF).to_bytes(2, "big")     # inet_gso_segment
        ip[10:12] = b"\0\0"
        ip[10:12] = ipv4.checksum(ip).to_bytes(2, "big")
        th = bytearray(pkt[20:hdr_len])
        th[4:8] = ((seq0 + off) & 0xFFFFFFFF).to_bytes(4, "big")
        if not last:
            th[13] &= ~(PSH | FIN)                              # tcp_gso_segment
        th[16:18] = b"\0\0"
        pseudo = bytes(ip[12:20]) + struct.pack("!HH", 6, len(th) + len(chunk))
        th[16:18] = ipv4.checksum(pseudo + th + chunk).to_bytes(2, "big")
        out.append(bytes(ip) + bytes(th) + chunk)
    return out, True


def _udp_segments(pkt: bytes, hdr_len: int, gso_size: int, cstart: int, coff: int,
                  flags: int) -> list[bytes]:
    """A VIRTIO_NET_HDR_GSO_UDP_L4 write cut as __udp_gso_segment would."""
    assert (flags, hdr_len, cstart, coff) == (1, 28, 20, 6)
    assert pkt[0] == 0x45 and pkt[9] == 17
    assert int.from_bytes(pkt[2:4], "big") == len(pkt), "tot_len of the coalesced packet"
    assert ipv4.header_checksum_ok(pkt), "IP checksum of the coalesced packet"
    assert int.from_bytes(pkt[24:26], "big") == len(pkt) - 20, "UDP length of the whole run"
    pseudo = ~ipv4.checksum(pkt[12:20] + struct.pack("!HH", 17, len(pkt) - 20)) & 0xFFFF
    assert int.from_bytes(pkt[26:28], "big") == pseudo, \
        "UDP checksum field must hold the folded pseudo-header sum"
    payload = pkt[28:]
    assert len(payload) > gso_size, "a GSO write must hold more than one datagram"
    ident = int.from_bytes(pkt[4:6], "big")
    out = []
    for i, off in enumerate(range(0, len(payload), gso_size)):
        chunk = payload[off:off + gso_size]
        ip = bytearray(pkt[:20])
        ip[2:4] = (28 + len(chunk)).to_bytes(2, "big")
        ip[4:6] = ((ident + i) & 0xFFFF).to_bytes(2, "big")
        ip[10:12] = b"\0\0"
        ip[10:12] = ipv4.checksum(ip).to_bytes(2, "big")
        uh = bytearray(pkt[20:28])
        uh[4:6] = (8 + len(chunk)).to_bytes(2, "big")
        uh[6:8] = b"\0\0"
        c = ipv4.checksum(bytes(ip[12:20]) + struct.pack("!HH", 17, 8 + len(chunk)) + uh + chunk)
        uh[6:8] = (c or 0xFFFF).to_bytes(2, "big")
        out.append(bytes(ip) + bytes(uh) + chunk)
    return out


def _segments6(pkt: bytes, gso_type: int, hdr_len: int, gso_size: int, cstart: int, coff: int,
               flags: int) -> list[bytes]:
    """An IPv6 GSO write (TCPV6 or UDP_L4) checked field by field, then cut as the kernel's
    GSO would (tests/gso_packets.py's reference cut: payload length, seq, full checksums)."""
    proto = pkt[6]
    thl = (pkt[52] >> 4) * 4 if proto == 6 else 8
    assert (flags, cstart, hdr_len) == (1, 40, 40 + thl)
    assert (gso_type, coff) == ((4, 16) if proto == 6 else (5, 6)), (gso_type, coff)
    assert int.from_bytes(pkt[4:6], "big") + 40 == len(pkt), "payload length of the whole"
    if proto == 17:
        assert int.from_bytes(pkt[44:46], "big") == len(pkt) - 40, "UDP length of the whole run"
    pseudo = ~ipv6.checksum(pkt[8:40] + struct.pack("!IxxxB", len(pkt) - 40, proto)) & 0xFFFF
    assert int.from_bytes(pkt[40 + coff:42 + coff], "big") == pseudo, \
        "the checksum field must hold the folded pseudo-header sum"
    assert len(pkt) - hdr_len > gso_size, "a GSO write must hold more than one segment"
    return gp.segment(pkt, gso_size)


# ---- running an engine ------------------------------------------------------------------

def send_train(h: Harness, peer, datagrams: list[bytes]) -> None:
    """One sendmsg with UDP_SEGMENT: the kernel keeps it one GSO skb up to a
    UDP_GRO socket, which receives it as one message (a train). An IPv6 peer
    sends to the engine's IPv6 socket."""
    size = len(datagrams[0])
    assert all(len(d) == size for d in datagrams[:-1]) and len(datagrams[-1]) <= size
    to = h.udp6_addr if peer.sock.family == socket.AF_INET6 else h.udp_addr
    peer.sock.sendmsg([b"".join(datagrams)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))],
                      0, to)


def run(kind: str, offloads: int, messages, *, mtu: int = 1472, **harness) -> tuple[list[bytes], dict]:
    """Queue messages (a bytes: one datagram; a list: a train) from a peer,
    then start the engine and wait until it has handled them all; returns
    (what it wrote to the TUN, stats)."""
    if kind != "c":
        offloads = 0
    ndgrams = sum(len(m) if isinstance(m, list) else 1 for m in messages)
    with Harness(kind, mtu=mtu, start=False, **harness) as h:
        if offloads & OFF_UDP_GRO:
            h.udp.setsockopt(SOL_UDP, UDP_GRO, 1)
        if offloads:
            h.engine.set_offloads(offloads)
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p), h.route("fc00:5:0:2::/64", p)], wait=False)
        for m in messages:
            if isinstance(m, list):
                send_train(h, p, m)     # a socket without UDP_GRO gets the datagrams
            else:
                h.inject_udp(p, m)
        h.engine.start()

        def done(st):
            # Every successful write arrives as one message; only C coalesces.
            writes = st["tun_writes"] - st["drop_tun_full"] - st["drop_tun_error"] \
                if kind == "c" else st["tun_tx_packets"]
            return (st["udp_rx_packets"] >= ndgrams
                    and h.outputs()[0] >= max(writes, 0))
        h.wait_for(done, what=f"{ndgrams} datagrams handled and written")
        st, still = h.stats(), 0
        while still < 3:        # counters stand still: nothing more is coming
            time.sleep(0.005)
            st2 = h.stats()
            still = still + 1 if st2 == st else 0
            st = st2
        return h.take_tun(), st


def check_writes(kind: str, offloads: int, writes: list[bytes], sent: list[bytes],
                 groups: list[int]) -> None:
    """The writes are, in order, the forwarded packets `sent`, `groups`
    giving how many went into each write (C with TUN GRO) - or one each."""
    vnet = kind == "c" and bool(offloads & OFF_TUN_VNET)
    if kind != "c" or not offloads & OFF_TUN_GRO:
        groups = [1] * len(sent)
    got, sizes = [], []
    for w in writes:
        segs, gso = kernel_segments(w, vnet)
        assert gso == (len(segs) > 1)
        got += segs
        sizes.append(len(segs))
    assert got == [forwarded(p) for p in sent], "segments differ from the forwarded packets"
    assert sizes == groups


# ---- coalescing -----------------------------------------------------------------------

def test_run_of_one_flow_becomes_one_gso_write(engine_kind):
    sent = flow(7, 1000) + [tcp_seg(8000, 400, flags=ACK | PSH, ident=107)]
    writes, st = run(engine_kind, OFF_TUN_VNET | OFF_TUN_GRO, sent)
    check_writes(engine_kind, OFF_TUN_VNET | OFF_TUN_GRO, writes, sent, [8])
    nbytes = sum(map(len, sent))
    assert (st["udp_rx_packets"], st["udp_rx_bytes"]) == (8, nbytes)
    assert (st["tun_tx_packets"], st["tun_tx_bytes"]) == (8, nbytes)
    if engine_kind == "c":
        assert st["tun_tx_gso"] == 1 and st["tun_writes"] == 1, nonzero(st)
        _, _, hdr_len, gso_size, _, _ = VNET.unpack_from(writes[0])
        assert (hdr_len, gso_size) == (40, 1000)
        pkt = writes[0][10:]
        assert pkt[33] == ACK | PSH, "the run's last segment pushed: so does the GSO packet"
        assert pkt[40:] == b"".join(p[40:] for p in sent)
        assert pkt[8] == 63 and int.from_bytes(pkt[4:6], "big") == 100


def _cases():
    f = flow
    big = flow(47, 1400)
    opt1 = b"\x01\x01\x08\x0a" + bytes(8)          # NOP NOP timestamps
    opt2 = b"\x01\x01\x08\x0a" + b"\0\0\0\1" + bytes(4)
    return {
        # name: (segments, writes' sizes)
        "gap_in_seq": (f(2) + f(2, seq0=4000, ident0=102), [2, 2]),
        "other_flow_between": (f(2) + [tcp_seg(9000, 1000, dport=80, ident=102)] +
                               f(1, seq0=3000, ident0=103), [2, 1, 1]),
        "other_dst": (f(2) + [tcp_seg(3000, 1000, dst="10.5.1.10", ident=102)], [2, 1]),
        "fin": (f(2) + [tcp_seg(3000, 1000, flags=ACK | FIN, ident=102)] +
                f(2, seq0=4000, ident0=103), [2, 1, 2]),
        "syn_rst_urg": ([tcp_seg(1000, 10, flags=SYN | ACK, ident=1)] + f(2, seq0=1010, ident0=2) +
                        [tcp_seg(3010, 1000, flags=ACK | URG, ident=4),
                         tcp_seg(4010, 1000, flags=RST | ACK, ident=5)], [1, 2, 1, 1]),
        "options_differ": (f(2, opts=opt1) + f(2, seq0=3000, ident0=102, opts=opt2), [2, 2]),
        "option_length_differs": (f(2, opts=opt1) + f(1, seq0=3000, ident0=102), [2, 1]),
        "shorter_middle_ends_the_run": (f(2) + [tcp_seg(3000, 500, ident=102)] +
                                        f(2, seq0=3500, ident0=103), [3, 2]),
        "larger_than_first": (f(1, 500) + f(2, seq0=1500, ident0=101), [1, 2]),
        "psh_in_the_middle": (f(1) + [tcp_seg(2000, 1000, flags=ACK | PSH, ident=101)] +
                              f(2, seq0=3000, ident0=102), [2, 2]),
        "psh_first_alone": ([tcp_seg(1000, 1000, flags=ACK | PSH, ident=100)] +
                            f(2, seq0=2000, ident0=101), [1, 2]),
        "bad_tcp_checksum_alone": (f(1) + [tcp_seg(2000, 1000, ident=101, bad_csum=True)] +
                                   f(2, seq0=3000, ident0=102), [1, 1, 2]),
        "pure_acks_alone": ([tcp_seg(1000, 0, ident=1), tcp_seg(1000, 0, ident=2)] +
                            f(2, ident0=3), [1, 1, 2]),
        "ack_number_differs": (f(2) + f(2, seq0=3000, ident0=102, ack=9999), [2, 2]),
        "window_differs": (f(2) + f(2, seq0=3000, ident0=102, win=1000), [2, 2]),
        "ttl_differs": (f(2) + f(2, seq0=3000, ident0=102, ttl=30), [2, 2]),
        "tos_differs": (f(2) + f(2, seq0=3000, ident0=102, tos=2), [2, 2]),
        "id_jumps_without_df": (f(2, df=False) + f(2, seq0=3000, ident0=500, df=False), [2, 2]),
        "df_differs": (f(2) + f(2, seq0=3000, ident0=102, df=False), [2, 2]),
        "udp_between": (f(1) + [ipv4.build(SRC, DST, ipv4.udp_payload(1, 2, bytes(1000)))] +
                        f(1, seq0=2000, ident0=101), [1, 1, 1]),
        "at_most_64_segments": (f(70, 100), [64, 6]),
        "at_most_64k": (big, [46, 1]),
    }


CASES = _cases()


def check_groups(kind: str, offloads: int, sent: list[bytes], groups: list[int]) -> None:
    """Forward `sent` with these offloads: the writes must be `groups` (how
    many packets each) for C, one each for Python; nothing dropped."""
    assert sum(groups) == len(sent)
    writes, st = run(kind, offloads, sent, mtu=1500)
    check_writes(kind, offloads, writes, sent, groups)
    assert st["tun_tx_packets"] == len(sent) and st["tun_tx_bytes"] == sum(map(len, sent))
    assert not any(st[k] for k in st if k.startswith("drop_")), nonzero(st)
    if kind == "c":
        assert st["tun_tx_gso"] == sum(g > 1 for g in groups)
        assert st["tun_writes"] == len(groups)


@pytest.mark.parametrize("name", sorted(CASES))
def test_what_is_not_coalesced_is_written_alone_in_order(engine_kind, name):
    check_groups(engine_kind, OFF_TUN_VNET | OFF_TUN_GRO, *CASES[name])


def test_vnet_without_gro_writes_plain_headers(engine_kind):
    sent = flow(4)
    writes, st = run(engine_kind, OFF_TUN_VNET, sent)
    check_writes(engine_kind, OFF_TUN_VNET, writes, sent, [1, 1, 1, 1])
    if engine_kind == "c":
        assert all(w[:10] == bytes(10) for w in writes)
        assert st["tun_tx_gso"] == 0


def test_failed_coalesced_write_drops_every_segment(engine_kind):
    # A socket buffer of 4 KB (8 KB as the kernel doubles it) takes one
    # segment but not 12 of them (EMSGSIZE): the write fails as a whole.
    sent = flow(12, 1000) + [ipv4.build(SRC, DST, ipv4.udp_payload(1, 2, bytes(100)))]
    writes, st = run(engine_kind, OFF_TUN_VNET | OFF_TUN_GRO, sent, tun_sndbuf=4096)
    if engine_kind == "c":
        assert st["drop_tun_error"] == 12 and st["tun_tx_packets"] == 1, nonzero(st)
        assert st["tun_tx_gso"] == 0 and st["tun_writes"] == 2
        assert [kernel_segments(w, True)[0] for w in writes] == [[forwarded(sent[-1])]]
    else:   # one write each, so some may find the small buffer full
        assert st["tun_tx_packets"] + st["drop_tun_full"] == 13, nonzero(st)


# ---- UDP runs (DP_OFF_TUN_GRO_UDP) --------------------------------------------------

UDP_RUNS = OFF_TUN_VNET | OFF_TUN_GRO | OFF_TUN_GRO_UDP


def test_udp_run_becomes_one_uso_write(engine_kind):
    sent = udp_flow(9, 700) + [udp_dgram(200, 309)]
    writes, st = run(engine_kind, UDP_RUNS, sent)
    check_writes(engine_kind, UDP_RUNS, writes, sent, [10])
    nbytes = sum(map(len, sent))
    assert (st["tun_tx_packets"], st["tun_tx_bytes"]) == (10, nbytes)
    if engine_kind == "c":
        assert st["tun_tx_gso"] == 1 and st["tun_writes"] == 1, nonzero(st)
        _, gso_type, hdr_len, gso_size, _, _ = VNET.unpack_from(writes[0])
        assert (gso_type, hdr_len, gso_size) == (5, 28, 700)
        assert writes[0][10 + 28:] == b"".join(p[28:] for p in sent)


def test_udp_runs_need_their_flag(engine_kind):
    """TUN GRO alone coalesces TCP only: a kernel before 6.2 would refuse a
    UDP GSO write."""
    sent = udp_flow(4) + flow(3)
    off = OFF_TUN_VNET | OFF_TUN_GRO
    writes, st = run(engine_kind, off, sent)
    check_writes(engine_kind, off, writes, sent, [1, 1, 1, 1, 3])


def _udp_cases():
    f = udp_flow
    return {
        "checksum_zero_alone": (f(2) + [udp_dgram(700, 302, csum="none")] + f(2, ident0=303),
                                [2, 1, 2]),
        "bad_checksum_alone": (f(2) + [udp_dgram(700, 302, csum="bad")] + f(2, ident0=303),
                               [2, 1, 2]),
        "other_port": (f(2) + f(2, ident0=302, sport=4001), [2, 2]),
        "other_dst": (f(2) + f(2, ident0=302, dst="10.5.1.10"), [2, 2]),
        "ttl_differs": (f(2) + f(2, ident0=302, ttl=30), [2, 2]),
        "tos_differs": (f(2) + f(2, ident0=302, tos=4), [2, 2]),
        "id_jumps_without_df": (f(2, df=False) + f(2, ident0=900, df=False), [2, 2]),
        "shorter_ends_the_run": (f(2) + [udp_dgram(100, 302)] + f(2, ident0=303), [3, 2]),
        "larger_than_first": (f(1, 300) + f(2, ident0=301), [1, 2]),
        "empty_payload_alone": ([udp_dgram(0, 1), udp_dgram(0, 2)] + f(2), [1, 1, 2]),
        "tcp_and_udp_runs_alternate": (f(2) + flow(3) + f(2, ident0=310), [2, 3, 2]),
        "at_most_64_datagrams": (f(70, 64), [64, 6]),
        "at_most_64k": (f(47, 1400), [46, 1]),
    }


UDP_CASES = _udp_cases()


@pytest.mark.parametrize("name", sorted(UDP_CASES))
def test_udp_not_coalesced_is_written_alone_in_order(engine_kind, name):
    check_groups(engine_kind, UDP_RUNS, *UDP_CASES[name])


# ---- IPv6 runs ---------------------------------------------------------------------

def test_ipv6_runs_become_tcpv6_and_uso_writes(engine_kind):
    sent = (flow6(5, 1200) + [tcp6_seg(7000, 300, flags=ACK | PSH)] + udp6_flow(4, 900)
            + [gp.udp6(SRC6, DST6, b"end" * 10)])
    writes, st = run(engine_kind, UDP_RUNS, sent)
    check_writes(engine_kind, UDP_RUNS, writes, sent, [6, 5])
    nbytes = sum(map(len, sent))
    assert (st["tun_tx_packets"], st["tun_tx_bytes"]) == (11, nbytes)
    if engine_kind == "c":
        assert st["tun_tx_gso"] == 2 and st["tun_writes"] == 2, nonzero(st)
        assert [VNET.unpack_from(w)[1:4] for w in writes] == [(4, 60, 1200), (5, 48, 900)]
        pkt = writes[0][10:]
        assert pkt[53] == ACK | PSH, "the run's last segment pushed: so does the GSO packet"
        assert pkt[7] == 63 and pkt[60:] == b"".join(p[60:] for p in sent[:6])


def _ipv6_cases():
    f, u = flow6, udp6_flow
    dest_opts = ipv6.build(SRC6, DST6, bytes([6, 0]) + bytes(6) + tcp6_seg(3000, 1000)[40:],
                           next_header=60)
    return {
        "flow_label_differs": (f(2) + f(2, seq0=3000, flow_label=5), [2, 2]),
        "class_differs": (f(2) + f(2, seq0=3000, traffic_class=4), [2, 2]),
        "hop_limit_differs": (f(2) + f(2, seq0=3000, hop=30), [2, 2]),
        "other_dst": (f(2) + f(2, seq0=3000, dst="fc00:5:0:1::a"), [2, 2]),
        "gap_in_seq": (f(2) + f(2, seq0=4000), [2, 2]),
        "extension_header_alone": (f(2) + [dest_opts] + f(2, seq0=4000), [2, 1, 2]),
        "ipv4_and_ipv6_of_like_ports": (flow(2) + f(2) + flow(2, seq0=3000, ident0=102),
                                        [2, 2, 2]),
        "udp_other_dst": (u(2) + u(2, dst="fc00:5:0:1::a"), [2, 2]),
        "udp_hop_limit_differs": (u(2) + u(2, hop=9), [2, 2]),
        "udp_ipv4_between": (u(2) + udp_flow(2) + u(2, fill0=5), [2, 2, 2]),
        "at_most_64k": (u(47, 1400), [46, 1]),
    }


IPV6_CASES = _ipv6_cases()


@pytest.mark.parametrize("name", sorted(IPV6_CASES))
def test_ipv6_not_coalesced_is_written_alone_in_order(engine_kind, name):
    check_groups(engine_kind, UDP_RUNS, *IPV6_CASES[name])


# ---- the contract ---------------------------------------------------------------------

def test_set_offloads_rules(engine_kind):
    with Harness(engine_kind, start=False) as h:
        if engine_kind != "c":
            with pytest.raises(OSError) as e:
                h.engine.set_offloads(OFF_UDP_GRO)
            assert e.value.errno == errno.EOPNOTSUPP
            h.engine.set_offloads(0)
            return
        for bad in (OFF_TUN_GRO, OFF_TUN_GRO | OFF_UDP_GRO, OFF_TUN_VNET | OFF_TUN_GRO_UDP,
                    OFF_TUN_GRO_UDP, 32):
            with pytest.raises(OSError) as e:
                h.engine.set_offloads(bad)
            assert e.value.errno == errno.EINVAL
        # On and off again before the start: the slots go back to mtu bytes.
        h.engine.set_offloads(RX_ALL)
        h.engine.set_offloads(0)
        h.engine.start()
        with pytest.raises(OSError) as e:
            h.engine.set_offloads(RX_ALL)
        assert e.value.errno == errno.EBUSY
        p = h.add_peer()
        h.set_routes([h.route("10.5.2.0/24", p)])
        h.inject_udp(p, udp_pkt(1, 1472), udp_pkt(2, 1500)[:1472] + b"x")
        st = h.settle()
        assert st["tun_tx_packets"] == 1 and st["drop_truncated"] == 1, nonzero(st)
