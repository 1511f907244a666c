"""The facts of the engine contract, csrc/dataplane.h, as Python values.

The header is their source. The C engine's binding (native.py) takes them
from the built cffi library, and refuses a library that disagrees with
this module; everything that must work without the library (the Python
engine, the daemon, the CLI) takes them from here, through api.py.
tests/unit/test_contract.py holds this module equal to the header: it
parses the header text, and compares with the library where it is built.
"""
from __future__ import annotations

# Counter names, in dp_stats field order (the `reserved` tail left out).
STAT_NAMES = (
    "tun_rx_packets", "tun_rx_bytes",
    "udp_tx_packets", "udp_tx_bytes",
    "udp_rx_packets", "udp_rx_bytes",
    "tun_tx_packets", "tun_tx_bytes",
    "icmp_unreach_sent", "icmp_ttl_sent",
    "drop_no_route", "drop_ttl", "drop_malformed", "drop_not_ipv4",
    "drop_truncated", "drop_bad_source", "drop_send_error",
    "drop_tun_full", "drop_tun_error",
    "syscalls", "tun_reads", "tun_writes", "udp_sends", "udp_recvs", "polls",
    "tx_batches", "rx_batches", "route_swaps",
    "icmp_ratelimited",
    "tun_rx_gso", "udp_tx_gso", "udp_rx_gro", "tun_tx_gso",
    "udp_gso_fallbacks",
    "drop_inner_local", "drop_inner_foreign",
    "coalesce_waits",
)

# enum dp_offload
OFF_TUN_VNET = 1
OFF_UDP_GSO = 2
OFF_UDP_GRO = 4
OFF_TUN_GRO = 8
OFF_TUN_GRO_UDP = 16

# enum dp_trace_kind, as DP_TR_<NAME> -> value, lower-cased
TRACE_KINDS = {1: "tun_read", 2: "route_hit", 3: "route_miss", 4: "udp_send",
               5: "udp_recv", 6: "tun_write", 7: "icmp", 8: "drop"}

# enum dp_loop_end, as DP_END_<NAME> -> value, lower-cased: why a loop is no
# longer running (dp_state.end)
END_KINDS = {0: "none", 1: "stopped", 2: "tun_gone", 3: "error"}

# enum dp_limits
BATCH_MAX = 256
TRACE_RING = 1024
TRACE_HEAD = 64
MTU_MIN = 68
MTU_MAX = 65535
ICMP_RATE_DEFAULT = 100
ICMP_BURST_DEFAULT = 50
LOCAL_MAX = 65536
COALESCE_MAX_US = 1000

# The names of enum dp_limits and enum dp_offload above, by header name: what
# the test and native.py compare one for one.
HEADER_CONSTANTS = {
    "DP_BATCH_MAX": BATCH_MAX, "DP_TRACE_RING": TRACE_RING, "DP_TRACE_HEAD": TRACE_HEAD,
    "DP_MTU_MIN": MTU_MIN, "DP_MTU_MAX": MTU_MAX,
    "DP_ICMP_RATE_DEFAULT": ICMP_RATE_DEFAULT, "DP_ICMP_BURST_DEFAULT": ICMP_BURST_DEFAULT,
    "DP_LOCAL_MAX": LOCAL_MAX, "DP_COALESCE_MAX_US": COALESCE_MAX_US,
    "DP_OFF_TUN_VNET": OFF_TUN_VNET, "DP_OFF_UDP_GSO": OFF_UDP_GSO, "DP_OFF_UDP_GRO": OFF_UDP_GRO,
    "DP_OFF_TUN_GRO": OFF_TUN_GRO, "DP_OFF_TUN_GRO_UDP": OFF_TUN_GRO_UDP,
}
