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


PREFIX = "/coreos.com/network/subnets/"


def test_lease_facts_come_from_the_control_planes_parser():
    # docs/flannel-compat.md#lease-value: the udp backend's value, read as a daemon reads it
    value = '{"PublicIP":"192.168.77.2","PublicIPv6":null}'
    fact = readings.lease_fact(PREFIX + "10.5.27.0-24", value)
    assert fact == {"key": PREFIX + "10.5.27.0-24", "subnet": "10.5.27.0/24",
                    "public_ip": "192.168.77.2", "value": {"PublicIP": "192.168.77.2",
                                                          "PublicIPv6": None}}
    # a dual-stack key: the IPv6 half is read by the same parser, not cut off or mangled
    dual = readings.lease_fact(PREFIX + "10.5.1.0-24&fc00:5:0:1::-64", value)
    assert dual["subnet"] == "10.5.1.0/24" and dual["ipv6_subnet"] == "fc00:5:0:1::/64"


def test_a_lease_no_daemon_would_read_is_refused():
    from dataplane.control.lease import LeaseFormatError
    ok = '{"PublicIP":"192.168.77.2"}'
    for key, value in ((PREFIX + "10.5.3.7-24", ok), (PREFIX + "10.5.3.0/24", ok),
                       (PREFIX + "10.5.3.0-24", '{"PublicIP":"not an address"}')):
        try:
            readings.lease_fact(key, value)
        except LeaseFormatError:
            continue
        raise AssertionError(f"accepted {key} = {value}")


def test_etcd_json_and_the_lease_of_a_destination():
    import base64
    import json

    def b64(s):
        return base64.b64encode(s.encode()).decode()
    text = json.dumps({"kvs": [{"key": b64(PREFIX + "10.5.2.0-24"),
                                "value": b64('{"PublicIP":"192.168.77.2"}')},
                               {"key": b64("/coreos.com/network/config")}]})
    kvs = readings.etcd_kvs(text)
    assert kvs == {PREFIX + "10.5.2.0-24": '{"PublicIP":"192.168.77.2"}',
                   "/coreos.com/network/config": ""}
    leases = [readings.lease_fact(k, v) for k, v in kvs.items() if k.startswith(PREFIX)]
    assert readings.lease_for(leases, "192.168.77.2", "10.5.2.9") is leases[0]
    assert readings.lease_for(leases, "192.168.77.2", "10.5.3.9") is None
    assert readings.lease_for(leases, "192.168.77.9", "10.5.2.9") is None


def test_daemon_log_routes_and_echo_lines():
    log = ("2026-11-27 10:00:00.000 +0000 INFO: Subnet added: 10.5.2.0/24 via 192.168.77.2, a "
           "direct route\n2026-11-27 10:00:00.001 +0000 INFO: Lease renewed\n")
    assert readings.peers_added(log) == ["10.5.2.0/24 via 192.168.77.2, a direct route"]
    routes = ["10.5.2.0/24 via 192.168.77.2 dev v0 proto 153", "10.5.0.0/16 dev flannel0"]
    assert readings.has_route(routes, "10.5.2.0/24 via 192.168.77.2 dev v0")
    assert readings.has_route(routes, "10.5.0.0/16 dev flannel0")
    assert not readings.has_route(routes, "10.5.2.0/24 via 192.168.77.2 dev v")
    assert readings.echo_seen("ready\necho 10.5.1.2 40000 31\necho 10.5.1.2 40001 5\n") == \
        {"from": "10.5.1.2", "sport": 40001, "len": 5}
    assert readings.echo_seen("ready\n") is None
