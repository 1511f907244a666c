"""The kernel path outliving its process (engine/bpf_pins.py, bpf_pinned.py, KernelPath's
pin_dir, host/tun.py's persist): a new KernelPath adopts the pinned maps and reads them back,
leaves the same code on its hooks and replaces other code in place with the maps kept; maps of
another layout are new and pinned only once attached; a persistent TUN keeps its address,
routes and filters with no process; removal leaves nothing. Root: a namespace of its own with
a veth pair and a bpffs mounted for the test."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import subprocess

import pytest

from dataplane.engine import bpf_contract as bc
from dataplane.engine.api import Route
from tests.conftest import require_bpf
from tests.unit.test_bpf_programs import MTU, OWN_IP, PEER, PORT

pytestmark = pytest.mark.root
NS = f"fu-kpin-unit-{os.getpid()}"


def ip(*args):
    subprocess.run(["ip", "-n", NS, *args], check=True, capture_output=True, text=True)


@pytest.fixture
def host(tmp_path):
    """(pin directory on a bpffs of the test's own, ifindex of a TUN stand-in, ifindex of
    the external stand-in), this thread in a namespace of its own meanwhile."""
    require_bpf()
    from dataplane.bench.kernel_paths import in_netns
    libc = ctypes.CDLL(None, use_errno=True)
    fs = tmp_path / "bpffs"
    fs.mkdir()
    assert libc.mount(b"bpffs", str(fs).encode(), b"bpf", 0, None) == 0
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        # no IPv6 chatter (router solicitations, MLD) through the programs: the counters stay
        subprocess.run(["ip", "netns", "exec", NS, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], check=True)
        ip("link", "add", "ext0", "type", "veth", "peer", "name", "tunx")
        ip("link", "set", "ext0", "up")
        ip("link", "set", "tunx", "up")
        with in_netns(NS):
            yield str(fs / "flannel-udp" / "flannel0"), socket.if_nametoindex("tunx"), \
                socket.if_nametoindex("ext0")
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)
        libc.umount2(str(fs).encode(), 2)


def started(pins, tun, ext, obj=None, routes=((f"10.5.2.0/24", PEER),)):
    from dataplane.engine.bpf_path import KernelPath
    kp = KernelPath(obj, pin_dir=pins)
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_subnets=["10.5.1.0/24"])
    kp.set_routes([Route.make(s, p, PORT) for s, p in routes])
    kp.set_local([OWN_IP, "10.5.1.0", "fd00:5:1::"])
    kp.attach(tun, ext)
    return kp


def on_hooks(tun, ext):
    from dataplane.engine import bpf_pins
    from dataplane.engine.bpf_path import TC_HANDLE, TC_PRIORITY
    return (bpf_pins.filter_prog_id(tun, "BPF_TC_EGRESS", TC_HANDLE, TC_PRIORITY),
            bpf_pins.filter_prog_id(ext, "BPF_TC_INGRESS", TC_HANDLE, TC_PRIORITY))


def variant(tmp_path, edit) -> str:
    """The programs compiled from a copy of their sources changed by ``edit`` (text -> text of
    maps.h, or of flannel.bpf.c with a name of its own)."""
    from dataplane.engine import bpf_build
    src = tmp_path / "src"
    shutil.copytree(bc.source_dir(), src)
    for name in (bc.MAPS_HEADER, bc.PROGRAM_SOURCE):
        (src / name).write_text(edit(name, (src / name).read_text()))
    out = str(tmp_path / "variant.bpf.o")
    subprocess.run([bpf_build.clang(), *bpf_build._flags(), "-c", str(src / bc.PROGRAM_SOURCE),
                    "-o", out], check=True, capture_output=True)
    return out


def test_a_new_process_adopts_what_the_pins_hold(host):
    pins, tun, ext = host
    kp = started(pins, tun, ext, routes=(("10.5.2.0/24", PEER), ("fd00:5:2::/64", PEER)))
    assert kp.maps_state == "new" and not kp.adopted
    ids = on_hooks(tun, ext)
    kp.test_run(bc.PROG_EGRESS, b"\0" * 64)         # something counted
    counted = kp.counters()
    kp.leave()
    assert on_hooks(tun, ext) == ids                 # no process: the filters stay
    from dataplane.engine.bpf_path import KernelPath
    with contextlib.closing(KernelPath(pin_dir=pins)) as again:
        assert (again.maps_state, again.adopted, again.same_programs) == ("reused", True, True)
        assert {str(s): (str(p), m) for s, (p, m) in again._routes.items()} == {
            "10.5.2.0/24": (PEER, 0), "fd00:5:2::/64": (PEER, 0)}
        assert {str(a) for a in again._local} == {OWN_IP, "10.5.1.0", "fd00:5:1::"}
        assert again.counters() == counted         # the same maps: counting on
        assert socket.inet_ntoa(again._cfg.own_ip.to_bytes(4, "little")) == OWN_IP
        again.attach(tun, ext)
        assert on_hooks(tun, ext) == ids             # the same code: left running
        again.set_routes([Route.make("10.5.2.0/24", PEER, PORT)])
        again.leave()
    from dataplane.engine import bpf_pinned
    seen = bpf_pinned.describe(pins)
    assert {p: v["attached"] for p, v in seen["programs"].items()} == {
        bc.PROG_EGRESS: "tunx", bc.PROG_INGRESS: "ext0"}
    assert seen["own_ip"] == OWN_IP and seen["port"] == PORT
    with contextlib.closing(KernelPath(pin_dir=pins)) as third:
        assert list(map(str, third._routes)) == ["10.5.2.0/24"]
        third.leave()
    done = bpf_pinned.remove(pins)
    assert on_hooks(tun, ext) == (None, None) and not os.path.exists(pins), done
    assert any("clsact" in line for line in done)


def test_a_device_made_again_gets_the_programs_and_their_pins(host):
    pins, tun, ext = host
    started(pins, tun, ext).leave()
    ip("link", "del", "ext0")                       # takes its peer, the TUN stand-in, along
    ip("link", "add", "ext0", "type", "veth", "peer", "name", "tunx")
    ip("link", "set", "ext0", "up")
    ip("link", "set", "tunx", "up")
    tun, ext = socket.if_nametoindex("tunx"), socket.if_nametoindex("ext0")
    assert on_hooks(tun, ext) == (None, None)
    from dataplane.engine.bpf_path import KernelPath
    with contextlib.closing(KernelPath(pin_dir=pins)) as again:
        assert again.same_programs
        again.attach(tun, ext)
        again.leave()
    from dataplane.engine import bpf_pinned
    seen = bpf_pinned.describe(pins)["programs"]
    assert {p: v["attached"] for p, v in seen.items()} == {
        bc.PROG_EGRESS: "tunx", bc.PROG_INGRESS: "ext0"}, seen
    bpf_pinned.remove(pins)


def test_other_code_replaces_the_programs_in_place_and_keeps_the_maps(host, tmp_path):
    pins, tun, ext = host
    started(pins, tun, ext).leave()
    old = on_hooks(tun, ext)
    # the same program, compiled with one more instruction: another tag
    head = "int fu_egress(struct __sk_buff *skb)\n{"
    obj = variant(tmp_path, lambda n, t: t.replace(head, head + '\n    asm volatile("r0 = 0" ::: "r0");')
                  if n == bc.PROGRAM_SOURCE else t)
    from dataplane.engine.bpf_path import KernelPath
    with contextlib.closing(KernelPath(obj, pin_dir=pins)) as up:
        assert (up.maps_state, up.same_programs) == ("reused", False)
        assert list(map(str, up._routes)) == ["10.5.2.0/24"]
        up.attach(tun, ext)
        new = on_hooks(tun, ext)
        assert new[0] != old[0] and None not in new
        up.leave()
    from dataplane.engine import bpf_pinned
    assert bpf_pinned.describe(pins)["programs"][bc.PROG_EGRESS]["id"] == new[0]
    bpf_pinned.remove(pins)


def test_maps_of_another_layout_are_new_and_pinned_once_attached(host, tmp_path):
    pins, tun, ext = host
    started(pins, tun, ext).leave()
    from dataplane.engine import bpf_pins
    old_map = bpf_pins.map_info(bpf_pins.obj_get(os.path.join(pins, bc.MAP_PEERS4))).id
    obj = variant(tmp_path, lambda n, t: t.replace("FU_PEERS_MAX = 65536", "FU_PEERS_MAX = 4096"))
    from dataplane.engine.bpf_path import KernelPath
    with contextlib.closing(KernelPath(obj, pin_dir=pins)) as up:
        assert (up.maps_state, up.adopted, up._routes) == ("changed", False, {})
        # the old path still serves from the old pins until the new one is attached
        assert bpf_pins.map_info(bpf_pins.obj_get(os.path.join(pins, bc.MAP_PEERS4))).id == old_map
        up.configure(own_ip=OWN_IP, port=PORT, mtu=MTU)
        up.set_routes([Route.make("10.5.2.0/24", PEER, PORT)])
        up.attach(tun, ext)
        pinned = bpf_pins.map_info(bpf_pins.obj_get(os.path.join(pins, bc.MAP_PEERS4)))
        assert pinned.id != old_map and pinned.max_entries == 4096
        up.leave()
    from dataplane.engine import bpf_pinned
    bpf_pinned.remove(pins)


def test_a_persistent_tun_keeps_its_address_routes_and_filters(host):
    pins, _, ext = host
    from dataplane.host import tun
    fd, name = tun.open_tun("flannel0", persist=True)
    ip("addr", "add", "10.5.1.0/32", "dev", name)
    ip("link", "set", name, "up")
    ip("route", "add", "10.5.0.0/16", "dev", name)
    kp = started(pins, socket.if_nametoindex(name), ext)
    kp.leave()
    os.close(fd)                                     # the process gone: the device stays
    ifindex = socket.if_nametoindex(name)
    assert on_hooks(ifindex, ext)[0] is not None
    fd, again = tun.open_tun(name, persist=True)     # attached again, as it is
    try:
        tun.set_persist(fd, False)                   # and back: it would go with this fd
        assert not tun.tun_info(fd)[1] & tun.IFF_PERSIST
        tun.set_persist(fd, True)
        assert again == name and socket.if_nametoindex(name) == ifindex
        assert tun.tun_info(fd)[1] & tun.IFF_PERSIST
        shown = subprocess.run(["ip", "-n", NS, "addr", "show", name], capture_output=True,
                               text=True).stdout
        assert "10.5.1.0/32" in shown, shown
        assert "10.5.0.0/16" in subprocess.run(["ip", "-n", NS, "route"], capture_output=True,
                                               text=True).stdout
        assert on_hooks(ifindex, ext)[0] is not None
        with pytest.raises(OSError):                 # held: one queue, one process
            tun.remove_persistent(name)
    finally:
        os.close(fd)
    from dataplane.engine import bpf_pinned
    bpf_pinned.remove(pins)
    assert tun.remove_persistent(name)
    with pytest.raises(OSError):
        socket.if_nametoindex(name)
    assert not tun.remove_persistent(name)


def test_a_tun_is_not_persistent_by_default(host):
    from dataplane.host import tun
    fd, name = tun.open_tun("flannel%d")
    assert not tun.tun_info(fd)[1] & tun.IFF_PERSIST
    os.close(fd)
    with pytest.raises(OSError):
        socket.if_nametoindex(name)


def test_the_mount_that_holds_a_path(tmp_path):
    from dataplane.engine.bpf_pins import mount_of
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
                    "25 22 0:22 / /sys rw - sysfs sysfs rw\n"
                    "31 25 0:27 / /sys/fs/bpf rw - bpf bpf rw\n"
                    "40 22 0:30 / /sys/fs/bpfx rw - tmpfs tmpfs rw\n")
    assert mount_of("/sys/fs/bpf/flannel-udp/flannel0", str(info)) == ("/sys/fs/bpf", "bpf")
    assert mount_of("/sys/fs/bpfx/a", str(info)) == ("/sys/fs/bpfx", "tmpfs")
    assert mount_of("/sys/class/net", str(info)) == ("/sys", "sysfs")


def test_ensure_bpffs_mounts_only_where_none_holds_the_root(host, tmp_path):
    from dataplane.engine.bpf_pins import ensure_bpffs, mount_of
    pins = host[0]
    root = os.path.dirname(pins)
    assert ensure_bpffs(root, mountpoint="/nonexistent-never-used") is False and os.path.isdir(root)
    fresh = tmp_path / "fresh"
    assert ensure_bpffs(str(fresh / "flannel-udp"), mountpoint=str(fresh)) is True
    try:
        assert mount_of(str(fresh / "flannel-udp")) == (str(fresh), "bpf")
    finally:
        ctypes.CDLL(None).umount2(str(fresh).encode(), 2)


def test_a_stale_peer_of_either_underlay_goes_with_the_first_whole_set(host):
    """A peer entry no route names (a process killed between a route's removal and its peer's)
    is read back at adoption and removed by the next set_routes, the IPv6 underlay's too."""
    import ipaddress
    from dataplane.engine.bpf_lib import ffi
    from dataplane.engine.bpf_path import KernelPath
    pins, tun, ext = host
    kp = started(pins, tun, ext)
    for stale in ("192.168.7.66", "fd00:99::66"):
        kp._update(*kp._peer_key(ipaddress.ip_address(stale)), ffi.new("__u32 *", 1))
    kp.leave()
    with contextlib.closing(KernelPath(pin_dir=pins)) as again:
        assert {str(p) for p, n in again._peers.items() if n == 0} == {"192.168.7.66",
                                                                       "fd00:99::66"}
        again.set_routes([Route.make("10.5.2.0/24", PEER, PORT)])
        assert {str(p) for p in again._peers} == {PEER}
        assert again._keys(bc.MAP_PEERS6, "fu_addr6") == []
        assert len(again._keys(bc.MAP_PEERS4, "__u32")) == 1
        again.leave()


def test_adoption_reads_back_what_was_written_object_for_object(host):
    """What a new process reads back from the pins (its routes, peers and their counts) equals
    what the one before wrote, in ipaddress's own types and hashes: routes of both families, a
    peer named by several routes, 0.0.0.0 (written with the MTU that hands its packets to the
    engine), a /32 and a /0, and the IPv6 underlay's peers."""
    from dataplane.engine.bpf_path import KernelPath
    pins, tun, ext = host
    kp = KernelPath(pin_dir=pins)
    kp.configure(own_ip=OWN_IP, port=PORT, mtu=MTU, own_subnets=["10.5.1.0/24"],
                 own_ip6="fd00:77::1")
    routes = [Route.make(f"10.5.{i}.0/24", PEER if i % 3 else f"192.168.8.{i}", PORT)
              for i in range(2, 40)]
    routes += [Route.make("10.6.0.0/16", "0.0.0.0", PORT), Route.make("10.7.0.9/32", PEER, PORT),
               Route.make("0.0.0.0/0", "192.168.8.250", PORT),
               Route.make("fd00:5:2::/64", PEER, PORT),
               Route.make("fd00:5:3::/64", "fd00:77::2", PORT)]
    kp.set_routes(routes)
    kp.set_local([OWN_IP])
    kp.attach(tun, ext)
    wrote = dict(kp._routes), dict(kp._peers)
    kp.leave()
    with contextlib.closing(KernelPath(pin_dir=pins)) as again:
        assert (again._routes, again._peers) == wrote
        for got, want in ((again._routes, wrote[0]), (again._peers, wrote[1])):
            assert sorted((str(k), type(k), hash(k)) for k in got) == \
                sorted((str(k), type(k), hash(k)) for k in want)
        assert sorted((str(p), type(p), m) for p, m in again._routes.values()) == \
            sorted((str(p), type(p), m) for p, m in wrote[0].values())
        again.leave()


def test_what_the_path_turned_off_is_put_back_by_its_removal(host):
    """The external interface's features the path turned off (host/tunnel_gso.py) are recorded
    beside the pins: a successor that finds them off takes them as turned off, not as the
    device's own state, and the path's removal (cleanup's) turns them on again."""
    from dataplane.engine import bpf_pinned
    from dataplane.engine.bpf_pins import OffloadRecord
    from dataplane.host.tunnel_gso import TunnelSegmentation, active
    pins, tun, ext = host
    first = TunnelSegmentation("ext0", OffloadRecord(pins))
    first.cut()
    assert "tx-udp_tnl-segmentation" in first.turned_off        # a veth has them on
    assert not any(active("ext0").values())
    started(pins, tun, ext).leave()
    successor = TunnelSegmentation("ext0", OffloadRecord(pins))
    successor.cut()
    assert successor.turned_off == first.turned_off
    done = bpf_pinned.remove(pins)
    assert not os.path.exists(pins), done
    now = active("ext0")
    assert [f for f in first.turned_off if now[f]] == first.turned_off, done
    assert any(line.endswith("on again on ext0 (as before the kernel path)") for line in done)
