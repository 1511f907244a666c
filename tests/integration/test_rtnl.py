"""flannel0's configuration and the host's reads over our own rtnetlink requests (host/rtnl.py,
through host/netconf.py, host/iface.py and host/blackhole.py) against a real kernel, in a
namespace of their own: what `ip link`/`ip addr`/`ip route` show after them equals what the
pyroute2 calls they replaced made (both families), the reads equal pyroute2's, and a refusal is an
OSError with the kernel's errno (EEXIST and a missing address or route as before).
"""
from __future__ import annotations

import errno
import json
import subprocess

import pytest

from dataplane.host.child import python_argv
from dataplane.testbed import netns as ns
from tests.integration.test_netlink_batch import netns  # noqa: F401 (a fixture: veths, routes)

pytestmark = [pytest.mark.root]

CHILD = r"""
import errno, ipaddress, json, re, socket, subprocess, sys
from dataplane.host import blackhole, iface, netconf

def ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
    return re.sub(r"^\d+: ", "", out, flags=re.M)       # the link's index differs per make

def fresh():
    subprocess.run(["ip", "link", "del", "t0"], capture_output=True)
    subprocess.run(["ip", "tuntap", "add", "t0", "mode", "tun"], check=True)

def shown():
    return {"link": ip("-d", "link", "show", "t0"), "addr": ip("addr", "show", "dev", "t0"),
            "routes": ip("-d", "-4", "route", "show", "dev", "t0") + ip("-d", "-6", "route", "show", "dev", "t0")}

ADDRS = ["10.5.84.0/32", "fc00:5:0:54::/128"]
NETS = ["10.5.0.0/16", "fc00:5::/48"]
out = {}

fresh()                                                 # ours
netconf.configure_tun("t0", ADDRS, 1372, txqueuelen=777)
netconf.configure_tun("t0", ADDRS, 1372)                # again: no error
out["added"] = [netconf.add_network_route(n, "t0") for n in NETS + NETS]
out["ours"] = shown()
out["facts"] = [netconf.link_facts("t0")[0], [str(a) for a in netconf.link_facts("t0")[1]],
                netconf.iface_mtu("t0"), netconf.iface_for_addr("10.5.84.0"),
                netconf.link_exists("t0"), netconf.link_exists("nope0"),
                [str(a) for a in netconf.ipv6_addresses("t0")]]
errs = {}
for what, call in (("no link", lambda: netconf.configure_tun("nope0", ADDRS[0], 1400)),
                   ("no address", lambda: netconf.remove_address("t0", "10.9.9.9/32")),
                   ("bad mtu", lambda: netconf.configure_tun("t0", ADDRS[0], 40))):
    try:
        call()
    except OSError as e:
        errs[what] = [e.errno, str(e)]
out["errors"] = errs
netconf.configure_tun("t0", "10.5.99.0/32", 1372)       # another lease's, then taken off
out["moved"] = [str(a) for a in netconf.set_ipv6_address("t0", "fc00:5:0:77::/128")]
out["after_move"] = ip("-6", "-o", "addr", "show", "dev", "t0").split()[2:3]

class Part:
    def __init__(self, addr, subnet):
        self.tun_addr, self.subnet = addr, ipaddress.ip_network(subnet)
out["removed"] = [str(a) for a in netconf.remove_other_leases("t0", [Part("10.5.84.0/32", "10.5.84.0/24")])]
out["v4_left"] = ip("-4", "addr", "show", "dev", "t0")

view = iface.NetlinkView()                              # what a start reads
view.links(), view.default_route_ifindex(), view.route_get("192.168.9.7")
netconf.AddressReader()(), blackhole.remove(ipaddress.IPv4Network("10.5.84.0/24"))
out["pyroute2_imported"] = "pyroute2" in sys.modules    # a start no longer imports it

from pyroute2 import IPRoute
fresh()                                                 # pyroute2's, as configure_tun made it
with IPRoute() as ipr:
    idx = ipr.link_lookup(ifname="t0")[0]
    netconf.prepare_ipv6("t0")
    for a in ADDRS:
        i = ipaddress.ip_interface(a)
        ipr.addr("add", index=idx, address=str(i.ip), prefixlen=i.network.prefixlen)
    ipr.link("set", index=idx, mtu=1372)
    ipr.link("set", index=idx, txqlen=777)
    ipr.link("set", index=idx, state="up")
    for n in NETS:
        net = ipaddress.ip_network(n)
        ipr.route("add", dst=n, oif=idx, proto=3, family=10 if net.version == 6 else 2)
out["pyroute2"] = shown()

# the host's reads, as pyroute2 reads them
mine = [(l.name, l.index, l.mtu, [(str(a.ip), a.flags) for a in l.addrs + l.addrs6]) for l in view.links()]
with IPRoute() as ipr:
    names = {}
    for a in ipr.get_addr():
        ipa = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
        fl = a.get_attr("IFA_FLAGS")
        names.setdefault(a["index"], []).append((ipa, int(a["flags"] if fl is None else fl)))
    theirs = [(l.get_attr("IFLA_IFNAME"), l["index"], l.get_attr("IFLA_MTU"),
               sorted(names.get(l["index"], []))) for l in ipr.get_links()]
    got = ipr.route("get", dst="10.5.3.4")[0]
    out["route_get"] = [list(view.route_get("10.5.3.4")),
                        [got.get_attr("RTA_OIF"), got.get_attr("RTA_PREFSRC")]]
    out["default"] = [view.default_route_ifindex(),
                      [r.get_attr("RTA_OIF") for r in ipr.get_default_routes(family=2, table=254)]]
out["links"] = [sorted((n, i, m, sorted(a)) for n, i, m, a in mine), sorted(theirs)]
out["host_addresses"] = sorted(map(str, netconf.host_addresses()))
subprocess.run(["ip", "route", "add", "unreachable", "10.77.0.0/16"], check=True)
try:
    view.route_get("10.77.0.1")
except OSError as e:
    out["unreachable"] = e.errno

sub = ipaddress.IPv4Network("10.5.84.0/24")
out["blackhole"] = [blackhole.add(sub), blackhole.add(sub), ip("route", "show", "type", "blackhole"),
                    blackhole.remove(sub), blackhole.remove(sub), ip("route", "show", "type", "blackhole")]
print(json.dumps(out))
"""


def test_flannel0_and_the_host_reads_over_our_requests_are_pyroute2s(netns):
    r = subprocess.run(ns.exec_argv(netns, python_argv(CHILD)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["pyroute2_imported"] is False
    assert out["ours"] == out["pyroute2"]
    assert "mtu 1372" in out["ours"]["link"] and "qlen 777" in out["ours"]["link"]
    assert "UP" in out["ours"]["link"].split("\n")[0]
    assert "inet 10.5.84.0/32" in out["ours"]["addr"] and "inet6 fc00:5:0:54::/128" in out["ours"]["addr"]
    assert "10.5.0.0/16 proto boot" in out["ours"]["routes"]
    assert out["added"] == [True, True, False, False]
    assert out["facts"] == [1372, ["10.5.84.0/32"], 1372, "t0", True, False, ["fc00:5:0:54::/128"]]
    errs = out["errors"]
    assert errs["no link"][0] == errno.ENODEV and "nope0" in errs["no link"][1]
    assert errs["no address"][0] == errno.EADDRNOTAVAIL and "10.9.9.9/32" in errs["no address"][1]
    assert errs["bad mtu"][0] == errno.EINVAL and "mtu" in errs["bad mtu"][1]
    assert out["moved"] == ["fc00:5:0:54::/128"] and out["after_move"] == ["fc00:5:0:77::/128"]
    assert out["removed"] == ["10.5.99.0/32"]
    assert "10.5.84.0/32" in out["v4_left"] and "10.5.99.0" not in out["v4_left"]
    assert out["links"][0] == out["links"][1]
    assert out["route_get"][0] == out["route_get"][1] and out["route_get"][0][1] == "10.5.84.0"
    assert out["default"][0] == out["default"][1][0] and out["default"][0]
    assert "192.168.9.1" in out["host_addresses"] and "fd00:1::1" in out["host_addresses"]
    assert out["unreachable"] in (errno.ENETUNREACH, errno.EHOSTUNREACH)
    added, again, shown, removed, none, after = out["blackhole"]
    assert (added, again, removed, none, after) == (True, False, 1, 0, "")
    assert shown.startswith("blackhole 10.5.84.0/24 proto 153 metric 4294967295")
