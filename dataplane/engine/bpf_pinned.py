"""A pinned kernel path seen from outside, with no object loaded (no clang needed): what
`flannel-udp status` shows when no daemon runs, and what `flannel-udp cleanup` removes.

Its facts come from the pins (bpf_pins.py) and the kernel: the programs' ids, tags and load
times, the devices from the pinned config map, the filters on their hooks (libbpf's tc query,
in the caller's network namespace), the counters from the pinned per-CPU map.
"""
from __future__ import annotations

import errno
import os
import socket
import struct

from . import bpf_contract as bc
from . import bpf_pins
from .bpf_lib import BpfLibError, check, ffi, lib, percpu_sums, sized
from .bpf_path import TC_HANDLE, TC_PRIORITY

# clsact's two parents (linux/pkt_sched.h TC_H_MIN_INGRESS / EGRESS under TC_H_CLSACT)
_PARENTS = {"BPF_TC_INGRESS": 0xFFFFFFF2, "BPF_TC_EGRESS": 0xFFFFFFF3}
HOOKS = ((bc.PROG_EGRESS, "tun_ifindex", "BPF_TC_EGRESS"),
         (bc.PROG_INGRESS, "ext_ifindex", "BPF_TC_INGRESS"))


def _config(directory: str):
    fd = bpf_pins.obj_get(os.path.join(directory, bc.MAP_CONFIG))
    if fd is None:
        return None
    try:
        cfg = ffi.new("fu_config *")
        check(lib().bpf_map_lookup_elem(fd, ffi.new("__u32 *", 0), cfg), "reading the config")
        return cfg
    finally:
        os.close(fd)


def _counters(directory: str) -> dict:
    fd = bpf_pins.obj_get(os.path.join(directory, bc.MAP_COUNTERS))
    if fd is None:
        return {}
    try:
        return dict(zip(bc.COUNTER_NAMES, percpu_sums(fd, bc.N_COUNTERS, "reading the counters")))
    except BpfLibError:
        return {}
    finally:
        os.close(fd)


def _name(ifindex: int) -> str | None:
    try:
        return socket.if_indextoname(ifindex)
    except OSError:
        return None


def describe(directory: str) -> dict:
    """What runs from the pins in ``directory``: {"dir", "programs": {name: {id, tag,
    loaded_at, attached: device name or None}}, "own_ip", "port", "routes", "counters"}."""
    cfg = _config(directory)
    progs = bpf_pins.pinned_programs(directory, (bc.PROG_EGRESS, bc.PROG_INGRESS))
    out = {"dir": directory, "pins": bpf_pins.listing(directory), "programs": {},
           "counters": _counters(directory), "own_ip": None, "port": None}
    if cfg is not None:
        out["own_ip"] = socket.inet_ntoa(struct.pack("=I", cfg.own_ip))
        out["port"] = cfg.port
    for prog, field, point in HOOKS:
        info = progs.get(prog)
        if info is None:
            continue
        ifindex = getattr(cfg, field) if cfg is not None else 0
        on = ifindex and bpf_pins.filter_prog_id(ifindex, point, TC_HANDLE, TC_PRIORITY)
        out["programs"][prog] = {"id": info.id, "tag": info.tag, "loaded_at": info.loaded_at,
                                 "attached": _name(ifindex) if on == info.id else None}
    return out


def _filters(ifindex: int, point: str) -> list:
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        return list(ipr.get_filters(index=ifindex, parent=_PARENTS[point]))


def remove(directory: str) -> list[str]:
    """Take the path of ``directory`` away: our filters off the hooks the config names (where
    they still hold a program of ours), the clsact qdisc where it then holds no filter, every
    pin; then the external interface's features the path turned off on again (bpf_pins
    OffloadRecord), once nothing of ours sends there. What was done, one line each."""
    lb, done = lib(), []
    cfg = _config(directory)
    offload = bpf_pins.OffloadRecord(directory).read()
    ours = {p.id for p in bpf_pins.pinned_programs(
        directory, (bc.PROG_EGRESS, bc.PROG_INGRESS)).values()}
    for prog, field, point in HOOKS:
        ifindex = getattr(cfg, field) if cfg is not None else 0
        pid = ifindex and bpf_pins.filter_prog_id(ifindex, point, TC_HANDLE, TC_PRIORITY)
        if not pid:
            continue
        if pid not in ours and prog not in bpf_pins.prog_name_of(pid):
            continue            # someone else's filter at our place: not ours to remove
        hook = sized("struct bpf_tc_hook")
        hook.ifindex, hook.attach_point = ifindex, getattr(lb, point)
        opts = sized("struct bpf_tc_opts")
        opts.handle, opts.priority = TC_HANDLE, TC_PRIORITY
        check(lb.bpf_tc_detach(hook, opts), f"detaching {prog} from {_name(ifindex)}")
        done.append(f"{prog} off {_name(ifindex)} ({point[7:].lower()})")
        if not _filters(ifindex, "BPF_TC_INGRESS") and not _filters(ifindex, "BPF_TC_EGRESS"):
            hook.attach_point = lb.BPF_TC_INGRESS | lb.BPF_TC_EGRESS
            if lb.bpf_tc_hook_destroy(hook) == 0:
                done.append(f"the clsact qdisc of {_name(ifindex)} (it held nothing else)")
    for path in bpf_pins.unpin_all(directory):
        done.append(f"unpinned {path}")
    if offload:
        from ..host.tunnel_gso import put_back
        device, features = offload
        try:
            put_back(device, features)
            done.append(f"{', '.join(features)} on again on {device} (as before the kernel path)")
        except OSError as e:
            if e.errno == errno.ENODEV:     # the device went, and its settings with it
                return done
            done.append(f"{', '.join(features)} not turned on again on {device}: {e} (ethtool -K "
                        f"{device} ... on)")
    return done
