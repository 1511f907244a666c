"""Replacing a file so that a reader sees the old content or the new, never a mix, and nothing else
is touched: the one way this project writes a file that others read (subnet.env, the bench's and the
soak's results, the ready and stats files of helper processes).

The temporary file gets a fresh name in the target's directory (mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW),
so a link or file planted there by whoever can write to the directory is never opened, truncated or
followed: a fixed temporary name would let them point root's write anywhere. The data is fsynced
before the rename and the directory after it, so after a crash the name holds one of the two complete
files. On any failure the temporary file is removed and the old file is left as it was.
"""
from __future__ import annotations

import os
import stat
import tempfile

DEFAULT_MODE = 0o644


def write_atomic(path: "str | os.PathLike", data: "bytes | str", mode: "int | None" = None) -> None:
    """Replace `path` with `data` (str is written as UTF-8). `mode` sets the permission bits
    whatever the umask; None keeps those of the file being replaced, else DEFAULT_MODE.
    Raises OSError; the old file is then unchanged and no temporary file is left."""
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    if isinstance(data, str):
        data = data.encode()
    if mode is None:
        mode = _current_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def _current_mode(path: str) -> int:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return DEFAULT_MODE
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else DEFAULT_MODE


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable (the new name's directory entry)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
