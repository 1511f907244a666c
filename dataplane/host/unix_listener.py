"""A root-only unix stream socket served by one thread: what the daemon's handover and status
sockets have in common.

The socket is bound under a umask that leaves nobody a moment to connect before it is 0600, and a
client's credentials are checked again at accept (a socket passed on keeps its mode, not its
owner). At close the path is removed only if it is still ours: a daemon that took over from us
has bound its own socket there, and our exit must not take it away.
"""
from __future__ import annotations

import os
import socket
import struct
import threading

_UCRED = struct.Struct("3i")


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of ``conn``."""
    pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                   _UCRED.size))
    return pid, uid


def peer_allowed(uid: int) -> bool:
    return uid in (0, os.getuid())


class UnixListener:
    """Subclasses give ``handle(conn)``, called in the thread for each client in turn; True
    ends the loop (the client is kept), else the next one is taken."""
    backlog = 1
    thread_name = "unix-listener"

    def __init__(self, path: str):
        self.path = path
        self._sock = None
        self._ino = None
        self._thread = None
        self._closing = threading.Event()

    def listen(self) -> None:
        """Bind (replacing a file left at ``path``: a dead daemon's socket, or the one we take
        over from, which leaves our path alone at exit) and start the thread; OSError."""
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old = os.umask(0o177)
            try:
                s.bind(self.path)
            finally:
                os.umask(old)
            os.chmod(self.path, 0o600)
            s.listen(self.backlog)
        except OSError:
            s.close()
            raise
        self._ino = os.stat(self.path).st_ino
        self._sock = s
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()


    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2)
        try:
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except OSError:
            pass

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:             # closed
                return
            if self.handle(conn):
                return

    def handle(self, conn: socket.socket) -> bool:
        raise NotImplementedError
