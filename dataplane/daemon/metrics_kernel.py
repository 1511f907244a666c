"""The kernel path's counters (engine/bpf_contract.py COUNTER_NAMES) as /metrics samples.

daemon/metrics.py serves them in the engines' families where they mean the same (packets sent to
peers and written into flannel0, the source rules' drops), labelled ``datapath="kernel"`` beside
the engines' ``datapath="engine"``, with ``queue="none"`` and ``family="all"`` (the programs run
on no queue and count both families together): a sum over datapath is the host's total. What the programs hand
on to the engine is a family of its own (``flannel_udp_kernel_passed_total``, by direction and
reason): the engine then counts those packets again, as it forwards or drops them.
"""
from __future__ import annotations

PACKETS, BYTES, DROPS = "flannel_udp_packets_total", "flannel_udp_bytes_total", \
    "flannel_udp_drops_total"
PASSED = "flannel_udp_kernel_passed_total"
# counter -> (family, its path or reason label); tx/rx_drop_helper: a helper refused after the
# packet changed (both directions are one reason)
KERNEL_COUNTERS = {
    "udp_tx_packets": (PACKETS, "udp_tx"), "udp_tx_bytes": (BYTES, "udp_tx"),
    "tun_tx_packets": (PACKETS, "tun_tx"), "tun_tx_bytes": (BYTES, "tun_tx"),
    "drop_bad_source": (DROPS, "bad_source"), "drop_inner_local": (DROPS, "inner_local"),
    "drop_inner_foreign": (DROPS, "inner_foreign"),
    "tx_drop_helper": (DROPS, "kernel_helper"), "rx_drop_helper": (DROPS, "kernel_helper"),
}
# the families that carry the datapath label (the engines' samples are "engine")
DATAPATH_LABELLED = frozenset({PACKETS, BYTES, DROPS})


def samples(counters) -> dict:
    """{family: [(label values, value)]} of the programs' counters (None: none)."""
    out: dict = {}
    for name, value in (counters or {}).items():
        decl = KERNEL_COUNTERS.get(name)
        if decl is None:
            continue
        family, lval = decl
        got = out.setdefault(family, {})
        got[lval] = got.get(lval, 0) + value
    return {family: [((lval, "all", "none", "kernel"), v) for lval, v in got.items()]
            for family, got in out.items()}


def passed(ask) -> list:
    """flannel_udp_kernel_passed_total's samples: (direction, reason) of tx_pass_<reason> and
    rx_pass_<reason>."""
    counters = ask("kernel_counters") or {}
    return [((name[:2], name[len("tx_pass_"):]), v) for name, v in counters.items()
            if name.startswith(("tx_pass_", "rx_pass_"))]
