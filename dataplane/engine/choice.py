"""Which engine runs: the one place where --engine, $DATAPLANE_ENGINE and the default meet.

The C engine is an optional extension (built by cffi at install time when a compiler is there);
the pure-Python engine always loads; the kernel path (the tc programs of csrc/bpf/, bpf_path.py)
runs in front of one of them where its programs build and load. ``choose_engine`` resolves, in
this order, the command line flag, then ``$DATAPLANE_ENGINE``, then ``auto`` (the kernel path
with the C engine behind it where the programs load, else C if built, else Python), and says why
in a sentence the daemon and ``flannel-udp forward`` log as it is; with the kernel path it hands
the loaded programs over (``EngineChoice.kernel``), to be attached when the engine starts
(kernel_engine.py), and when auto does without them ``kernel_why`` says why in one line.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping, NamedTuple, Optional

log = logging.getLogger(__name__)

KINDS = ("kernel", "c", "python", "auto")
# bpf_skb_adjust_room's DECAP flags, which the ingress program uses (docs/kernel-path.md,
# "Helpers and the oldest kernel for each")
KERNEL_MIN = (6, 3)
BTF = "/sys/kernel/btf/vmlinux"
ENV_VAR = "DATAPLANE_ENGINE"

_c_error: Optional[BaseException] = None
_fallback_logged = False


class EngineChoiceError(ValueError):
    """The flag or $DATAPLANE_ENGINE names no engine."""


class EngineUnavailable(ImportError):
    """The engine asked for cannot be loaded (the C extension is not built)."""


class _Choice(NamedTuple):
    cls: type
    why: str


class EngineChoice(_Choice):
    """``cls`` the engine class (the slow path's, with the kernel path), ``why`` the reason
    (the pair unpacks as ever: ``cls, why = choose_engine()``); ``kernel`` the kernel path's
    loaded programs (a KernelPath) or None, ``kernel_why`` why they do not run when auto went
    without them ("" otherwise)."""
    kernel = None
    kernel_why = ""

    def __new__(cls, engine, why: str, kernel=None, kernel_why: str = ""):
        self = super().__new__(cls, engine, why)
        self.kernel, self.kernel_why = kernel, kernel_why
        return self

    @property
    def forced(self) -> bool:
        """Asked for by name (the flag or $DATAPLANE_ENGINE), not auto's pick: a kernel path
        that cannot attach then fails the start."""
        return self.why.startswith("requested")


def kernel_release(release: str | None = None) -> tuple:
    """The running kernel's (major, minor), (0, 0) when its release does not say."""
    release = release or os.uname().release
    try:
        major, minor = release.split("-")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return 0, 0


def load_kernel_path(release: str | None = None, btf: str = BTF, pin_dir: str | None = None):
    """The kernel path's programs built and loaded (a KernelPath, not attached); KernelPathError
    says why not and what to do: a kernel older than KERNEL_MIN or without BTF, not root, no
    clang or libbpf (bpf_build, bpf_lib), a verifier refusal, no bpffs for ``pin_dir``. With
    ``pin_dir`` (the daemon's: bpf_pins.pin_dir) the path is pinned there, and what a daemon
    before left there is adopted (bpf_path.KernelPath)."""
    from . import bpf_pins
    from .bpf_build import BpfBuildError
    from .bpf_lib import BpfLibError
    from .bpf_path import KernelPath, KernelPathError
    have = kernel_release(release)
    if have < KERNEL_MIN:
        raise KernelPathError(
            f"this kernel ({release or os.uname().release}) is older than "
            f"{KERNEL_MIN[0]}.{KERNEL_MIN[1]}, whose bpf_skb_adjust_room decapsulation flags the "
            "programs use (docs/kernel-path.md)")
    if not os.path.exists(btf):
        raise KernelPathError(f"this kernel has no BTF ({btf}): build it with "
                              "CONFIG_DEBUG_INFO_BTF=y")
    try:
        if pin_dir and bpf_pins.ensure_bpffs(os.path.dirname(pin_dir)):
            log.info("kernel path: mounted a bpffs at %s for its pins (none was mounted)",
                     bpf_pins.BPFFS)
        return KernelPath(pin_dir=pin_dir)
    except (BpfBuildError, BpfLibError) as e:
        raise KernelPathError(str(e)) from None


def _kernel_reason(e: BaseException) -> str:
    """The loader's reason in one line (a verifier's log runs long: its first line says it)."""
    line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "Operation not permitted" in line:
        line = (line.removesuffix("; the verifier said:") + ": this process may not load BPF "
                "programs (CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, or CAP_SYS_ADMIN; a systemd "
                "unit's CapabilityBoundingSet can withhold them)")
    elif "Function not implemented" in line:
        # no verifier ran: an empty "said:" would only mislead
        line = (line.removesuffix("; the verifier said:") + ": this kernel has no bpf() system "
                "call (built without CONFIG_BPF_SYSCALL, or an emulator such as QEMU's user mode)")
    return line


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


def _requested(flag: Optional[str], flag_name: str = "--engine",
               env: Optional[Mapping[str, str]] = None) -> tuple[str, str]:
    """(the kind asked for, lowercased, maybe no engine's; where it came from)."""
    env = os.environ if env is None else env
    if flag:
        requested, source = flag, flag_name
    elif env.get(ENV_VAR, "").strip():
        requested, source = env[ENV_VAR], f"${ENV_VAR}"
    else:
        requested, source = "auto", "default"
    return requested.strip().lower(), source


def loads_kernel(flag: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether choose_engine(flag, kernel=True) loads the kernel path's programs (kernel, auto)."""
    return _requested(flag, env=env)[0] in ("kernel", "auto")


def choose_engine(flag: Optional[str] = None, *, flag_name: str = "--engine",
                  env: Optional[Mapping[str, str]] = None, kernel: bool = False,
                  load_kernel=load_kernel_path) -> EngineChoice:
    """The engine class for ``flag`` (kernel|c|python|auto; None = not given), else
    $DATAPLANE_ENGINE, else auto, with the reason. With ``kernel`` (the daemon and forward,
    which attach it) kernel and auto load the kernel path's programs (``load_kernel``): kernel
    with the C engine (else Python) as its slow path, auto where they load; without it
    (engine_class) both name the slow path's class only. Raises EngineChoiceError for an
    unknown value and EngineUnavailable when the C engine or the kernel path is asked for and
    cannot run."""
    global _fallback_logged
    requested, source = _requested(flag, flag_name, env)
    if requested not in KINDS:
        raise EngineChoiceError(f"{source}={requested!r}: no such engine; use c, python or auto, "
                                "or kernel for the kernel path")
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
    kernel_why = ""
    if requested == "kernel" or (requested == "auto" and kernel):
        slow = c_engine or _load_python()
        slow_name = "the C engine" if c_engine is not None else \
            f"the Python engine (the C engine is not built: {_c_error})"
        if not kernel:
            return EngineChoice(slow, f"requested with {source} kernel: {slow_name} as the slow path")
        try:
            kpath = load_kernel()
        except (OSError, RuntimeError) as e:
            if requested == "kernel":
                raise EngineUnavailable(
                    f"{source} kernel: the kernel path cannot run here: {_kernel_reason(e)}; "
                    "fix that, or choose c, python or auto") from None
            kernel_why = f"kernel path: not used: {_kernel_reason(e)}"
        else:
            if requested == "kernel":
                return EngineChoice(slow, f"requested with {source} kernel: the tc programs, "
                                    f"{slow_name} as the slow path", kpath)
            return EngineChoice(slow, f"auto: the kernel path's programs load here; {slow_name} "
                                f"is the slow path behind them{from_env}", kpath)
        if c_engine is not None:
            return EngineChoice(c_engine, f"auto: the C engine is built (the fast path){from_env}",
                                None, f"{kernel_why}; the C engine forwards alone")
    if c_engine is not None:
        return EngineChoice(c_engine, f"auto: the C engine is built (the fast path){from_env}")
    if not _fallback_logged:
        log.warning("C engine not built (%s); running the pure-Python engine", _c_error)
        _fallback_logged = True
    return EngineChoice(_load_python(), f"auto: the C engine is not built ({_c_error}); install "
                                        f"a C compiler and reinstall for the fast path{from_env}",
                        None, kernel_why and f"{kernel_why}; the Python engine forwards alone")
