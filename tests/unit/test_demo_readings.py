"""The demo's readings (dataplane/demo/readings.py): tool output and counters -> step data."""
from __future__ import annotations

from dataplane.demo import readings

SC = {"send": "sendmmsg()", "recv": "recvmmsg()"}


def _leg(base_ns: int, order=("tun_read", "udp_send", "udp_recv", "tun_write")) -> dict:
    return {k: {"ts_ns": base_ns + 1000 * i} for i, k in enumerate(order)}


def test_timeline_in_time_order_with_deltas():
    req, rep = _leg(10_000), _leg(20_000)
    t = readings.timeline(req, rep, SC)
    assert [e["event"] for e in t["events"]] == ["TUN_READ", "UDP_SEND", "UDP_RECV", "TUN_WRITE"] * 2
    assert [e["host"] for e in t["events"]] == ["A", "A", "B", "B", "B", "B", "A", "A"]
    assert t["events"][0]["t_us"] == 0 and t["events"][1]["delta_us"] == 1.0
    assert t["total_us"] == 13.0 and t["reordered"] is False


def test_timeline_says_when_the_receiver_stamped_before_the_sender_returned():
    # veth -> bridge -> veth runs inside the sender's syscall: the receive can be stamped first
    req = {"tun_read": {"ts_ns": 0}, "udp_send": {"ts_ns": 5000}, "udp_recv": {"ts_ns": 3000},
           "tun_write": {"ts_ns": 6000}}
    t = readings.timeline(req, {}, SC)
    assert t["reordered"] is True
    assert [e["event"] for e in t["events"]] == ["TUN_READ", "UDP_RECV", "UDP_SEND", "TUN_WRITE"]


def test_timeline_of_nothing():
    assert readings.timeline({}, {}, SC) == {"events": [], "reordered": False, "total_us": None}


def test_cost_row_counts_every_copy_once():
    c = {"tun_rx_bytes": 84, "udp_tx_bytes": 84, "udp_rx_bytes": 84, "tun_tx_bytes": 84,
         "tun_rx_packets": 1, "udp_rx_packets": 1, "syscalls": 9}
    row = readings.cost_row(c)
    assert row["bytes_copied"] == readings.bytes_copied(c) == 336
    assert row["packets"] == 2 and row["polls"] == 0
    assert readings.syscalls_per_packet(c) == "4.5"
    assert readings.syscalls_per_packet({}) == "?"


def test_ping_with_and_without_a_reply():
    got = readings.parse_ping("PING x\n64 bytes from 10.5.2.2: icmp_seq=1 ttl=62 time=0.31 ms\n", 0)
    assert (got["received"], got["ttl"], got["rtt_ms"], got["reply_bytes"]) == (1, 62, 0.31, 64)
    assert readings.parse_ping("PING x\n\n1 packets transmitted, 0 received\n", 1)["received"] == 0


def test_host_tool_facts():
    addr = "5: flannel0    inet 10.5.1.0/16 scope global flannel0\\       valid_lft forever"
    link = "5: flannel0: <POINTOPOINT,NOARP,UP,LOWER_UP> mtu 1472 qdisc fq_codel state UNKNOWN qlen 500"
    assert readings.flannel0_facts(addr, link) == {"addr": "10.5.1.0/16", "mtu": 1472, "qlen": 500}
    ss = ("State  Recv-Q Send-Q Local Address:Port  Peer Address:Port\n"
          "UNCONN 0      0      0.0.0.0:8285        0.0.0.0:*    users:((\"flannel-udp\",pid=7,fd=5))\n")
    assert readings.udp_socket_line(ss, 8285).startswith("UNCONN 0 0 0.0.0.0:8285")
    assert readings.udp_socket_line(ss, 8472) is None
    assert readings.squeezed_lines("a   b\n\n  c d  \n") == ["a b", "c d"]
