"""Which engine runs: the one place where --engine, $DATAPLANE_ENGINE and the default meet.

The C engine is an optional extension (built by cffi at install time when a compiler is there);
the pure-Python engine always loads. ``choose_engine`` resolves, in this order, the command line
flag, then ``$DATAPLANE_ENGINE``, then ``auto`` (C if built, else Python), and says why in a
sentence the daemon and ``flannel-udp forward`` log as it is.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping, NamedTuple, Optional

log = logging.getLogger(__name__)

KINDS = ("c", "python", "auto")
ENV_VAR = "DATAPLANE_ENGINE"

_c_error: Optional[BaseException] = None
_fallback_logged = False


class EngineChoiceError(ValueError):
    """The flag or $DATAPLANE_ENGINE names no engine."""


class EngineUnavailable(ImportError):
    """The engine asked for cannot be loaded (the C extension is not built)."""


class EngineChoice(NamedTuple):
    cls: type
    why: str


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


def c_import_error() -> Optional[BaseException]:
    _load_c()
    return _c_error


def _load_python():
    try:
        from .pyengine import PyEngine
    except ImportError as e:
        raise EngineUnavailable(f"the Python engine cannot be loaded ({e}); the installation is "
                                "incomplete: reinstall flannel-udp (pip install -e .)") from e
    return PyEngine


def choose_engine(flag: Optional[str] = None, *, flag_name: str = "--engine",
                  env: Optional[Mapping[str, str]] = None) -> EngineChoice:
    """The engine class for ``flag`` (c|python|auto; None = not given), else $DATAPLANE_ENGINE,
    else auto, with the reason. Raises EngineChoiceError for an unknown value and
    EngineUnavailable when the C engine is asked for and not built."""
    global _fallback_logged
    env = os.environ if env is None else env
    if flag:
        requested, source = flag, flag_name
    elif env.get(ENV_VAR, "").strip():
        requested, source = env[ENV_VAR], f"${ENV_VAR}"
    else:
        requested, source = "auto", "default"
    requested = requested.strip().lower()
    if requested not in KINDS:
        raise EngineChoiceError(f"{source}={requested!r}: no such engine; use c, python or auto")
    from_env = f" (from ${ENV_VAR})" if source == f"${ENV_VAR}" else ""
    if requested == "python":
        return EngineChoice(_load_python(), f"requested with {source} python")
    c_engine = _load_c()
    if requested == "c":
        if c_engine is None:
            raise EngineUnavailable(
                f"{source} c: the C engine is not built ({_c_error}); reinstall with a C compiler "
                "and cffi (pip install -e .), or choose python or auto") from _c_error
        return EngineChoice(c_engine, f"requested with {source} c")
    if c_engine is not None:
        return EngineChoice(c_engine, f"auto: the C engine is built (the fast path){from_env}")
    if not _fallback_logged:
        log.warning("C engine not built (%s); running the pure-Python engine", _c_error)
        _fallback_logged = True
    return EngineChoice(_load_python(), f"auto: the C engine is not built ({_c_error}); install "
                                        f"a C compiler and reinstall for the fast path{from_env}")
