"""The kernel path's pins: its maps and programs kept on bpffs, so that they outlive the process.

The tc filters hold the programs and the programs their maps, so packets keep flowing when
the process that attached them exits or is killed (with flannel0 persistent: host/tun.py). What
the pins add is a name: a new process finds the running maps at ``<dir>/<map name>`` and the
programs at ``<dir>/<program name>`` (one directory per flannel device, DEFAULT_ROOT/<tun name>;
a parameter, since a bpffs mount is one per mount namespace and the tests use their own), opens
them (``bpf_obj_get``), reads back what they hold and goes on from there: bpf_path.KernelPath
with ``pin_dir``. bpffs holds nothing but pins and directories, so every fact about the path
lives in its maps (the config map names the devices) or in the kernel's own information about
the programs (their id, tag and load time).

An upgrade: the new object's maps are compared with the pinned ones (type, key and value size,
entries, flags). All alike: the new object takes the pinned maps over (``bpf_map__reuse_fd``)
and what they hold goes on serving; its programs replace the old ones on the hooks in place
(tc's replace at our handle: no moment without a program), or not at all when the kernel's tag
of each is the same (the same code). One differs (maps.h changed): the new object makes new
maps, the caller fills them, and only then are its programs put on the hooks and the new maps
pinned in place of the old ones, which go with the old programs.

One thing beside the pins is no BPF object: :class:`OffloadRecord`, what the kernel path turned
off on the external interface (host/tunnel_gso.py), so that whoever takes the path away puts it
back, however many daemons adopted the path meanwhile.

This module knows bpffs and libbpf's fds; no device, no netlink but libbpf's tc calls.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import time
from dataclasses import dataclass

from .bpf_lib import BpfLibError, check, ffi, lib, sized

BPFFS = "/sys/fs/bpf"
DEFAULT_ROOT = "/sys/fs/bpf/flannel-udp"
_OBJ_NAME_LEN = 16
# The head of struct bpf_prog_info / bpf_map_info (linux/bpf.h) that is read: the kernel fills
# as much as it is given.
_PROG_INFO = struct.Struct("=II8sIIQQQII8s16s")     # type id tag jited xlated .. load_time .. name
_MAP_INFO = struct.Struct("=IIIIII16s")              # type id key value max_entries flags name


def pin_dir(tun_name: str, root: str = DEFAULT_ROOT) -> str:
    """Where the kernel path of flannel device ``tun_name`` is pinned."""
    return os.path.join(root, tun_name)


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """(mount point, file system type) of the mount that holds ``path``."""
    path = os.path.realpath(path)
    best = ("/", "")
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].replace("\\040", " ")
            fstype = right.split()[0] if right else ""
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, fstype)
    return best


def ensure_bpffs(root: str = DEFAULT_ROOT, mountpoint: str = BPFFS) -> bool:
    """``root`` on a bpffs, made if missing; bpffs mounted at ``mountpoint`` first where no bpffs
    holds ``root`` (what systemd does at boot; a container may lack it). True when it mounted."""
    mounted = False
    if mount_of(root)[1] != "bpf":
        os.makedirs(mountpoint, exist_ok=True)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"bpffs", mountpoint.encode(), b"bpf", 0, None) != 0:
            err = ctypes.get_errno()
            raise BpfLibError(err, f"mounting bpffs at {mountpoint}: {os.strerror(err)}")
        mounted = True
        if mount_of(root)[1] != "bpf":
            raise BpfLibError(errno.ENOTDIR, f"{root} is not under the bpffs at {mountpoint}")
    os.makedirs(root, exist_ok=True)
    return mounted


def obj_get(path: str) -> int | None:
    """An fd of the map or program pinned at ``path``, None when nothing is pinned there."""
    fd = lib().bpf_obj_get(path.encode())
    if fd == -errno.ENOENT:
        return None
    return check(fd, f"opening the pin {path}")


def pin(fd: int, path: str) -> None:
    """Pin ``fd`` at ``path``, in place of what was pinned there (the old one lives on for as
    long as anything else holds it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    check(lib().bpf_obj_pin(fd, path.encode()), f"pinning {path}")


def _info(fd: int, layout: struct.Struct) -> tuple:
    buf = ffi.new("char[]", layout.size)
    size = ffi.new("uint32_t *", layout.size)
    check(lib().bpf_obj_get_info_by_fd(fd, buf, size), "reading a BPF object's information")
    return layout.unpack(ffi.buffer(buf, layout.size)[:])


@dataclass(frozen=True)
class ProgInfo:
    id: int
    tag: str            # the kernel's hash of the code: the same code, the same tag
    loaded_at: float    # wall-clock time
    name: str


def prog_info(fd: int) -> ProgInfo:
    _t, pid, tag, _j, _x, _ji, _xi, load_ns, _uid, _n, _ids, name = _info(fd, _PROG_INFO)
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return ProgInfo(pid, tag.hex(), boot + load_ns / 1e9, name.split(b"\0", 1)[0].decode())


@dataclass(frozen=True)
class MapInfo:
    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str

    def layout(self) -> tuple:
        return (self.type, self.key_size, self.value_size, self.max_entries, self.flags)


def map_info(fd: int) -> MapInfo:
    *head, name = _info(fd, _MAP_INFO)
    return MapInfo(*head, name.split(b"\0", 1)[0].decode())


def object_map_layout(bpf_map) -> tuple:
    """What a map of an opened (not yet loaded) object will be, as MapInfo.layout() says it."""
    lb = lib()
    return (lb.bpf_map__type(bpf_map), lb.bpf_map__key_size(bpf_map),
            lb.bpf_map__value_size(bpf_map), lb.bpf_map__max_entries(bpf_map),
            lb.bpf_map__map_flags(bpf_map))


def reuse_maps(maps: dict, directory: str | None) -> str:
    """Before an object is loaded: have its maps (``{name: struct bpf_map *}``) take over the
    pinned ones in ``directory``, all or none. "reused" (every map was pinned and alike),
    "new" (nothing pinned: the first start), "changed" (a map missing or of another layout:
    the object makes new maps, to be pinned once its programs are on the hooks)."""
    if not directory:
        return "new"
    fds, verdict = {}, "reused"
    try:
        for name, m in maps.items():
            fd = obj_get(os.path.join(directory, name))
            if fd is None:
                verdict = "changed"
                continue
            fds[name] = fd
            if map_info(fd).layout() != object_map_layout(m):
                verdict = "changed"
        if not fds:
            return "new"
        if verdict == "reused":
            for name, m in maps.items():        # libbpf keeps a dup of the fd
                check(lib().bpf_map__reuse_fd(m, fds[name]), f"reusing the pinned {name}")
        return verdict
    finally:
        for fd in fds.values():
            os.close(fd)


def pinned_programs(directory: str, names) -> dict:
    """{program name: ProgInfo} of the programs pinned in ``directory``."""
    out = {}
    for name in names:
        fd = obj_get(os.path.join(directory, name))
        if fd is not None:
            try:
                out[name] = prog_info(fd)
            finally:
                os.close(fd)
    return out


def filter_prog_id(ifindex: int, attach_point: str, handle: int, priority: int) -> int | None:
    """The id of the program in the tc filter at (handle, priority) on a device's hook (in the
    caller's network namespace), None when there is none (or no device, or no clsact)."""
    lb = lib()
    hook = sized("struct bpf_tc_hook")
    hook.ifindex, hook.attach_point = ifindex, getattr(lb, attach_point)
    opts = sized("struct bpf_tc_opts")
    opts.handle, opts.priority = handle, priority
    rc = lb.bpf_tc_query(hook, opts)
    return opts.prog_id if rc == 0 else None


def prog_name_of(prog_id: int) -> str:
    """The name of the loaded program with this id ("" when it is gone)."""
    fd = lib().bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        return ""
    try:
        return prog_info(fd).name
    finally:
        os.close(fd)


def listing(directory: str) -> list[str]:
    """The pins in ``directory`` ([] when there is none)."""
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def directories(root: str = DEFAULT_ROOT) -> list[str]:
    """Every pin directory under ``root`` (one per flannel device)."""
    return [os.path.join(root, d) for d in listing(root) if os.path.isdir(os.path.join(root, d))]


def unpin_all(directory: str) -> list[str]:
    """Remove every pin in ``directory`` and the directory (and ``root`` above it when that is
    left empty); what was removed. A map or program nothing else holds goes with its pin."""
    gone = []
    for name in listing(directory):
        path = os.path.join(directory, name)
        os.unlink(path)
        gone.append(path)
    for d in (directory, os.path.dirname(directory)):
        try:
            os.rmdir(d)
        except OSError:                  # not empty (another device's pins) or absent
            break
    return gone


OFFLOAD_RECORD = "fu_offload"


class OffloadRecord:
    """The external interface's features the kernel path turned off (host/tunnel_gso.py), kept
    in pin directory ``directory`` for as long as the path: the daemon that turned them off
    writes it, a successor that finds them off reads it (rather than take "off" for the
    device's own state), and the removal of the path (bpf_pinned.remove: `flannel-udp cleanup`,
    a daemon that runs an engine alone) turns them on again. bpffs holds no files, so it is a
    symlink whose target is the text "<device>:<feature>,<feature>"; it goes at a reboot with
    the pins, as the features' change does."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, OFFLOAD_RECORD)

    def read(self) -> tuple[str, list[str]] | None:
        """(device, features turned off), None when nothing is recorded."""
        try:
            text = os.readlink(self.path)
        except OSError:
            return None
        device, _, features = text.partition(":")
        return (device, [f for f in features.split(",") if f]) if device else None

    def write(self, device: str, features) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.clear()                    # bpffs renames no symlink: no atomic replace
        os.symlink(f"{device}:{','.join(features)}", self.path)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
