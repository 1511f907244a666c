"""The kernel path's contract, read from csrc/bpf/maps.h at import.

maps.h is the one source of what the tc programs and Python share: the layouts
of the maps' keys and values (cffi reads the header's structs as its cdef, so
a map value is packed by the same declaration the program was compiled
with), the counters' indexes, the flags and the limits. It is read as
contract.py reads csrc/dataplane.h, with the same parser, so a form the
parser does not know raises at import rather than give a wrong index.
"""
from __future__ import annotations

import os

from .bpf_cdef import maps_part
from .contract import HeaderError, parse_enum

_HERE = os.path.dirname(os.path.abspath(__file__))
# The package's copy first (an installed package), then the checkout's.
SOURCE_DIRS = (os.path.join(_HERE, "bpf"),
               os.path.join(os.path.dirname(os.path.dirname(_HERE)), "csrc", "bpf"))
PROGRAM_SOURCE = "flannel.bpf.c"
MAPS_HEADER = "maps.h"


def source_dir() -> str:
    """The directory that holds the programs' source and maps.h."""
    for d in SOURCE_DIRS:
        if os.path.isfile(os.path.join(d, MAPS_HEADER)):
            return d
    raise HeaderError(f"the kernel path's sources (maps.h) are in none of {', '.join(SOURCE_DIRS)}"
                      ": run from a whole checkout")


def _read() -> str:
    with open(os.path.join(source_dir(), MAPS_HEADER)) as f:
        return f.read()


_text = _read()

# cffi's cdef of the maps (bpf_cdef.py): the header less its preprocessor lines.
CDEF = maps_part(_text)

_counters = parse_enum(_text, "fu_counter")
_flags = parse_enum(_text, "fu_flags")
_limits = parse_enum(_text, "fu_limits")


def _pick(items: dict, key: str) -> int:
    if key not in items:
        raise HeaderError(f"{key} is not in {MAPS_HEADER}")
    return items[key]


# Counter names in index order, lower-cased without FU_ (FU_DROP_BAD_SOURCE -> drop_bad_source):
# the drop reasons keep the engines' names (dataplane.h's dp_stats).
N_COUNTERS = _pick(_counters, "FU_COUNTERS")
COUNTER_NAMES = tuple(k[3:].lower() for k, v in sorted(_counters.items(), key=lambda kv: kv[1])
                      if k != "FU_COUNTERS")
if len(COUNTER_NAMES) != N_COUNTERS or \
        [v for k, v in sorted(_counters.items(), key=lambda kv: kv[1])] != list(range(N_COUNTERS + 1)):
    raise HeaderError(f"{MAPS_HEADER}: enum fu_counter must count 0, 1, ... up to FU_COUNTERS")
TX_PASS = tuple(n for n in COUNTER_NAMES if n.startswith("tx_pass_"))
RX_PASS = tuple(n for n in COUNTER_NAMES if n.startswith("rx_pass_"))

F_STRICT, F_ACCEPT_ANY, F_TUN_L2, F_EXT_L2, F_DECAP_GSO = (
    _pick(_flags, "FU_F_" + n) for n in ("STRICT", "ACCEPT_ANY", "TUN_L2", "EXT_L2", "DECAP_GSO"))
ROUTES_MAX = _pick(_limits, "FU_ROUTES_MAX")
PEERS_MAX = _pick(_limits, "FU_PEERS_MAX")
LOCAL_MAX = _pick(_limits, "FU_LOCAL_MAX")
ETH_HLEN = _pick(_limits, "FU_ETH_HLEN")
OUTER4 = _pick(_limits, "FU_OUTER4")
OUTER6 = _pick(_limits, "FU_OUTER6")
OUTER_TTL = _pick(_limits, "FU_OUTER_TTL")

# The programs and maps by the names the object file gives them.
PROG_EGRESS, PROG_INGRESS = "fu_egress", "fu_ingress"
MAP_CONFIG, MAP_ROUTES4, MAP_ROUTES6 = "fu_config_map", "fu_routes4", "fu_routes6"
MAP_PEERS4, MAP_LOCAL4, MAP_LOCAL6, MAP_COUNTERS = "fu_peers4", "fu_local4", "fu_local6", "fu_counters"
MAP_PEERS6 = "fu_peers6"

del _text
