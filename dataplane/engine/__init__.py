"""The engines: two implementations of one contract, and the choice between them.

* ``api.py``          the interface both engines keep (Engine, Route);
* ``contract.py``     the facts of csrc/dataplane.h as Python values (counter names, limits, bits);
* ``native.py``       the C engine: the cffi binding of csrc/dataplane.h;
* ``pyengine.py``     the pure-Python engine, the oracle of the differential tests: its API;
* ``pyloop.py``       its loop thread, the I/O around ``pypath.py``;
* ``pypath.py``       its per-packet work, no I/O: csrc/path.c in Python, function for function;
* ``ipv4.py``         the IPv4/ICMP header helpers, csrc/packet.c's rules written for reading
                      (the Python engine's slow paths, the tests and the demo use them);
* ``ipv6.py``         the same for inner IPv6 packets: building, decoding, the link-scope rule;
* ``pytable.py``, ``route_array.py``  the route table as both engines hold it;
* ``multi.py``        several queues behind one Engine;
* ``choice.py``       which engine runs (--engine, $DATAPLANE_ENGINE, auto).
"""
from __future__ import annotations

from .api import (BATCH_MAX, DEFAULT_BATCH, DROP_STATS, OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO,
                  OFF_UDP_GSO, OFFLOAD_STATS, STAT_NAMES, SYSCALL_STATS, TRACE_KINDS, Engine,
                  EngineClosed, Route)
from .choice import (EngineChoice, EngineChoiceError, EngineUnavailable, c_available, c_import_error,
                     choose_engine)

PUBLIC_API = ["Engine", "EngineClosed", "Route", "STAT_NAMES", "SYSCALL_STATS",
              "DROP_STATS", "OFFLOAD_STATS", "OFF_TUN_VNET", "OFF_UDP_GSO", "OFF_UDP_GRO",
              "OFF_TUN_GRO", "OFF_TUN_GRO_UDP", "TRACE_KINDS", "BATCH_MAX", "DEFAULT_BATCH",
              "create_engine", "engine_class", "choose_engine", "EngineChoice", "EngineChoiceError",
              "EngineUnavailable", "c_available", "c_import_error"]
__all__ = PUBLIC_API


def engine_class(kind: str | None = None):
    """The engine class for kind 'c', 'python' or 'auto' (None: $DATAPLANE_ENGINE, else 'auto').
    'c' raises ImportError if not built, an unknown kind ValueError."""
    return choose_engine(kind).cls


def create_engine(kind: str | None = None, **kwargs) -> Engine:
    """Create an engine; kwargs are Engine's constructor arguments."""
    return engine_class(kind)(**kwargs)
