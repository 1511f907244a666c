"""A path's name -> the Path that sets it up: the kernel's and the engines' (paths.py), the real
daemons over an etcd (daemon_paths.py)."""
from __future__ import annotations

from .daemon_paths import make_daemon_path
from .families import IPV6_TWINS
from .kernel_paths import KernelBenchPath
from .paths import (ALL_PATHS, DAEMON_PATHS, ENGINE_VARIANTS, KERNEL_PATHS, DirectPath, EnginePath, Path,
                    VxlanPath)
from .topo import BenchTopo


def make_path(topo: BenchTopo, name: str, batch: int | None = None, routes: int = 0,
              flanneld: str | None = None) -> Path:
    """``flanneld``: the binary the ``flanneld`` path runs; without it that path raises
    PathSkipped."""
    if name in KERNEL_PATHS:
        return KernelBenchPath(topo, family=KERNEL_PATHS[name], batch=batch, routes=routes)
    if name == "direct":
        return DirectPath(topo)
    if name == "vxlan":
        return VxlanPath(topo)
    if name in ("c", "python"):
        return EnginePath(topo, name, batch=batch, routes=routes)
    if name == "vxlan6":
        return VxlanPath(topo, family=6)
    if name in IPV6_TWINS:
        return EnginePath(topo, IPV6_TWINS[name], batch=batch, name=name, routes=routes, family=6)
    if name in ENGINE_VARIANTS:
        kind, extra = ENGINE_VARIANTS[name]
        return EnginePath(topo, kind, batch=batch, name=name, extra_args=extra, routes=routes)
    if name in DAEMON_PATHS:
        return make_daemon_path(topo, name, flanneld=flanneld)
    raise ValueError(f"unknown path {name!r}: use {', '.join(ALL_PATHS)}")
