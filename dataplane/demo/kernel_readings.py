"""The kernel path's counters as a daemon's /metrics serves them, back out as flat names. No I/O.

With the kernel path the programs' counters are in the engines' families with
``datapath="kernel"`` (docs/metrics.md#kernel-path), and what they handed on to the engine in
``flannel_udp_kernel_passed_total``. The demo reads them around each probe as it reads the
engines' (``trace.stats_from_metrics``, which leaves these out): ``udp_tx_packets`` are the
datagrams the egress program sent, ``tun_tx_packets`` the packets the ingress program put into
flannel0, ``drop_<reason>`` its drops, ``passed_<direction>_<reason>`` its hand-overs.
"""
from __future__ import annotations

import re

from ..daemon.metrics import PREFIX
from . import trace as tr

_METRIC = re.compile(r'^(flannel_udp_[a-z_]+)\{(.*)\}$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_UNITS = {f"{PREFIX}_packets_total": "packets", f"{PREFIX}_bytes_total": "bytes"}


def kernel_counters(metrics: dict) -> dict:
    """{name: value} of the programs' counters in a /metrics reading ({"name{labels}": value})."""
    out: dict = {}
    for key, value in metrics.items():
        m = _METRIC.match(key)
        if not m:
            continue
        name, labels = m.group(1), dict(_LABEL.findall(m.group(2)))
        if name == f"{PREFIX}_kernel_passed_total" and set(labels) == {"direction", "reason"}:
            stat = f"passed_{labels['direction']}_{labels['reason']}"
        elif labels.get("datapath") != "kernel" or "queue" not in labels \
                or "family" not in labels:
            continue                 # the engine's, or one of parse_metrics' sums
        elif name in _UNITS and "path" in labels:
            stat = f"{labels['path']}_{_UNITS[name]}"
        elif name == f"{PREFIX}_drops_total" and "reason" in labels:
            stat = f"drop_{labels['reason']}"
        else:
            continue
        out[stat] = out.get(stat, 0) + int(value)
    return out


def window_delta(win: dict) -> dict:
    """What the programs counted on each host during a probe's window (probes.Meter.window)."""
    return {role: tr.delta(kernel_counters(win["metrics_before"][role]),
                           kernel_counters(win["metrics_after"][role]))
            for role in win["metrics_after"]}


def moved(d: dict) -> dict:
    """Only the counters that moved."""
    return {k: v for k, v in sorted(d.items()) if v}


def wire_leg(frames: list, outer: tuple, inner: tuple, proto: str, t0: float, t1: float) -> dict:
    """One packet of a probe on the kernel path, as the wire tap on A's veth saw it: the first
    datagram ``outer`` (src, dst) between t0 and t1 whose inner packet is ``inner`` (src, dst)
    of ``proto``, decoded, or None (the programs write no trace events: the tap is the witness)."""
    for f in frames:
        if not t0 <= f.get("t", t0) <= t1:
            continue
        try:
            d = tr.decode_frame(f["hex"])
        except (ValueError, KeyError):
            continue
        pkt = d["inner"]
        if (d["outer"]["src"], d["outer"]["dst"]) == tuple(outer) \
                and tr.matches(pkt, inner[0], inner[1], proto):
            d.update(frame_len=f["frame_len"], direction="out" if f.get("pkttype") == 4 else "in")
            return d
    return None
