"""Engine selection: the C engine (cffi) where it was built, else pure Python.

``DATAPLANE_ENGINE=c|python|auto`` (or the ``kind`` argument) forces a choice.
"""
from __future__ import annotations

import logging
import os

from .api import (BATCH_MAX, DEFAULT_BATCH, DROP_STATS, OFF_TUN_GRO, OFF_TUN_GRO_UDP, OFF_TUN_VNET, OFF_UDP_GRO,
                  OFF_UDP_GSO, OFFLOAD_STATS, STAT_NAMES, SYSCALL_STATS, TRACE_KINDS, Engine,
                  EngineClosed, Route)

log = logging.getLogger(__name__)

PUBLIC_API = ["Engine", "EngineClosed", "Route", "STAT_NAMES", "SYSCALL_STATS",
              "DROP_STATS", "OFFLOAD_STATS", "OFF_TUN_VNET", "OFF_UDP_GSO", "OFF_UDP_GRO",
              "OFF_TUN_GRO", "OFF_TUN_GRO_UDP", "TRACE_KINDS", "BATCH_MAX", "DEFAULT_BATCH",
              "create_engine", "engine_class", "c_available", "c_import_error"]
__all__ = PUBLIC_API

_c_error: BaseException | None = None
_fallback_logged = False


def _load_c():
    global _c_error
    try:
        from .native import CEngine
        return CEngine
    except ImportError as e:  # extension not built (no compiler at install time)
        _c_error = e
        return None


def c_available() -> bool:
    return _load_c() is not None


def c_import_error() -> BaseException | None:
    _load_c()
    return _c_error


def engine_class(kind: str | None = None):
    """Return the engine class for kind 'c', 'python' or 'auto' (default:
    $DATAPLANE_ENGINE, else 'auto'). 'c' raises ImportError if not built."""
    global _fallback_logged
    kind = (kind or os.environ.get("DATAPLANE_ENGINE") or "auto").lower()
    if kind not in ("c", "python", "auto"):
        raise ValueError(f"unknown engine {kind!r}: use c, python or auto")
    if kind in ("c", "auto"):
        cls = _load_c()
        if cls is not None:
            return cls
        if kind == "c":
            raise ImportError(
                "the C engine is not built (reinstall with a C compiler and cffi: "
                f"pip install -e .): {_c_error}") from _c_error
        if not _fallback_logged:
            log.warning("C engine not built (%s); running the pure-Python engine", _c_error)
            _fallback_logged = True
    from .pyengine import PyEngine
    return PyEngine


def create_engine(kind: str | None = None, **kwargs) -> Engine:
    """Create an engine; kwargs are Engine's constructor arguments."""
    return engine_class(kind)(**kwargs)
