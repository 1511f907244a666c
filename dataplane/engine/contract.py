"""The facts of the engine contract, read from csrc/dataplane.h at import.

The header is their one source: both engines take every number they must
agree on from it (the C files by name, Python from here). An installed
package carries the header next to this module (setup.py's build_py puts it
there, with or without a compiler); a checkout, or an editable install of
one, reads csrc/dataplane.h itself. The C engine's binding (native.py)
refuses a built library that disagrees with what is read here; everything
that must work without the library (the Python engine, the daemon, the CLI)
takes the facts from here, through api.py.

The parser reads only the forms the header promises in its opening comment:
``enum <name> { A = 1, B, ... }`` and ``typedef struct <name> { type field;
... } <name>;``. Anything else raises at import rather than yield a wrong
number.
"""
from __future__ import annotations

import os
import re

_HERE = os.path.dirname(os.path.abspath(__file__))
# The package's own copy first: an installed package must not read the header of
# whatever checkout happens to lie two directories up.
HEADER_PATHS = (os.path.join(_HERE, "dataplane.h"),
                os.path.join(os.path.dirname(os.path.dirname(_HERE)), "csrc", "dataplane.h"))


class HeaderError(ValueError):
    """The header is missing, or not in the forms this parser reads."""


def header_path() -> str:
    for path in HEADER_PATHS:
        if os.path.isfile(path):
            return path
    raise HeaderError(f"the engine contract dataplane.h is in none of {', '.join(HEADER_PATHS)}: "
                      "reinstall the package, or run from a whole checkout")


def header_text(path: str | None = None) -> str:
    with open(path or header_path()) as f:
        return f.read()


def _code(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def parse_enum(text: str, name: str) -> dict[str, int]:
    """enum <name> { A = 1, B, ... } of a C header's text, as {"A": 1, "B": 2, ...}."""
    m = re.search(r"\benum\s+%s\s*\{(.*?)\}" % re.escape(name), _code(text), re.S)
    if not m:
        raise HeaderError(f"no enum {name}")
    out: dict[str, int] = {}
    nxt = 0
    for item in filter(None, (i.strip() for i in m.group(1).split(","))):
        key, eq, value = (p.strip() for p in item.partition("="))
        if not re.fullmatch(r"[A-Za-z_]\w*", key) or \
                (eq and not re.fullmatch(r"\d+|0[xX][0-9a-fA-F]+", value)):
            raise HeaderError(f"enum {name}: cannot read {item!r} (NAME = number, or NAME)")
        nxt = int(value, 0) if eq else nxt
        out[key] = nxt
        nxt += 1
    return out


def parse_struct(text: str, name: str) -> list[tuple[str, str]]:
    """typedef struct <name> { ... } <name>; of a C header's text, as its fields in
    order: (field name, the comment that starts on the field's line, "" if none)."""
    m = re.search(r"\btypedef\s+struct\s+%s\s*\{(.*?)\}\s*%s\s*;" % ((re.escape(name),) * 2),
                  text, re.S)
    if not m:
        raise HeaderError(f"no typedef struct {name}")
    notes: list[str] = []

    def note(c: re.Match) -> str:
        notes.append(" ".join(c.group(1).split()))
        return f" @{len(notes) - 1}@ "

    # Comments become numbered marks first, so that a declaration inside one is never read.
    body = re.sub(r"/\*(.*?)\*/", note, m.group(1), flags=re.S)
    fields = []
    for decl in re.finditer(r"([^;]*);([ \t]*@(\d+)@)?", body):
        words = re.sub(r"@\d+@", " ", decl.group(1)).split()
        field = re.fullmatch(r"([A-Za-z_]\w*)(?:\[\w+\])?", words[-1]) \
            if len(words) >= 2 and "," not in decl.group(1) else None
        if not field:
            raise HeaderError(f"struct {name}: cannot read {decl.group(1).strip()!r} "
                              "(type name; or type name[N];)")
        fields.append((field.group(1), notes[int(decl.group(3))] if decl.group(3) else ""))
    return fields


def _pick(items: dict[str, int], key: str) -> int:
    if key not in items:
        raise HeaderError(f"{key} is not in {header_path()}")
    return items[key]


HEADER = header_path()
_text = header_text(HEADER)
_limits = parse_enum(_text, "dp_limits")
_offload = parse_enum(_text, "dp_offload")
_trace = parse_enum(_text, "dp_trace_kind")
_end = parse_enum(_text, "dp_loop_end")

# Counter names, in dp_stats field order (the `reserved` tail left out).
STAT_NAMES = tuple(f for f, _ in parse_struct(_text, "dp_stats") if f != "reserved")

# IPv6's shares of the counters (the header's "Counters by family"): counter -> its v6_<counter>,
# which counts the IPv6 packets of that counter, so that IPv4's share is the difference.
V6_PREFIX = "v6_"


def v6_shares(names) -> dict[str, str]:
    """{counter: its v6_ share} of dp_stats' field names; a v6_ field of no counter raises."""
    shares = {n[len(V6_PREFIX):]: n for n in names if n.startswith(V6_PREFIX)}
    for total, share in shares.items():
        if total not in names or total.startswith(V6_PREFIX):
            raise HeaderError(f"dp_stats: {share} is the IPv6 share of no counter")
    return shares


V6_SHARES = v6_shares(STAT_NAMES)

# enum dp_offload
OFF_TUN_VNET, OFF_UDP_GSO, OFF_UDP_GRO, OFF_TUN_GRO, OFF_TUN_GRO_UDP = (
    _pick(_offload, "DP_OFF_" + name)
    for name in ("TUN_VNET", "UDP_GSO", "UDP_GRO", "TUN_GRO", "TUN_GRO_UDP"))

# enum dp_trace_kind, as DP_TR_<NAME> -> value, lower-cased; and one name per kind
TRACE_KINDS = {v: k[len("DP_TR_"):].lower() for k, v in _trace.items()}
TR_TUN_READ, TR_ROUTE_HIT, TR_ROUTE_MISS, TR_UDP_SEND, TR_UDP_RECV, TR_TUN_WRITE, TR_ICMP, \
    TR_DROP = (_pick(_trace, "DP_TR_" + name)
               for name in ("TUN_READ", "ROUTE_HIT", "ROUTE_MISS", "UDP_SEND", "UDP_RECV",
                            "TUN_WRITE", "ICMP", "DROP"))

# enum dp_loop_end, as DP_END_<NAME> -> value, lower-cased: why a loop is no
# longer running (dp_state.end)
END_KINDS = {v: k[len("DP_END_"):].lower() for k, v in _end.items()}

# enum dp_limits
BATCH_MAX = _pick(_limits, "DP_BATCH_MAX")
TRACE_RING = _pick(_limits, "DP_TRACE_RING")
TRACE_HEAD = _pick(_limits, "DP_TRACE_HEAD")
MTU_MIN = _pick(_limits, "DP_MTU_MIN")
MTU_MAX = _pick(_limits, "DP_MTU_MAX")
ICMP_RATE_DEFAULT = _pick(_limits, "DP_ICMP_RATE_DEFAULT")
ICMP_BURST_DEFAULT = _pick(_limits, "DP_ICMP_BURST_DEFAULT")
ICMP_TTL = _pick(_limits, "DP_ICMP_TTL")
ICMP6_ERR_MAX = _pick(_limits, "DP_ICMP6_ERR_MAX")
MTU6_MIN = _pick(_limits, "DP_MTU6_MIN")
UNDERLAY6_HDRS = _pick(_limits, "DP_UNDERLAY6_HDRS")
UNDERLAY4_HDRS = _pick(_limits, "DP_UNDERLAY4_HDRS")
ERRQ_MAX = _pick(_limits, "DP_ERRQ_MAX")
IPV6_EXT_MAX = _pick(_limits, "DP_IPV6_EXT_MAX")
LOCAL_MAX = _pick(_limits, "DP_LOCAL_MAX")
COALESCE_MAX_US = _pick(_limits, "DP_COALESCE_MAX_US")
DENSE_WAITS = _pick(_limits, "DP_DENSE_WAITS")
LIGHT_PACKETS = _pick(_limits, "DP_LIGHT_PACKETS")
ROUNDS = _pick(_limits, "DP_ROUNDS")
WAKE_MS = _pick(_limits, "DP_WAKE_MS")
VNET_HDR_LEN = _pick(_limits, "DP_VNET_HDR_LEN")

# enum dp_limits and enum dp_offload by header name: what native.py holds the
# built library to, one for one.
HEADER_CONSTANTS = {**_limits, **_offload}

del _text
