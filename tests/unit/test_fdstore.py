"""systemd's fd store as the daemon speaks it (dataplane/daemon/fdstore.py), no root and no
systemd: a unix datagram socket stands for $NOTIFY_SOCKET, a child process for a process
systemd started with LISTEN_FDS."""
from __future__ import annotations

import array
import os
import socket
import subprocess

from dataplane.host.child import python_argv
from dataplane.daemon import fdstore


def _notify_socket(tmp_path, monkeypatch, fdstore_env: str | None = "16"):
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    if fdstore_env is None:
        monkeypatch.delenv("FDSTORE", raising=False)
    else:
        monkeypatch.setenv("FDSTORE", fdstore_env)
    return s


def _recv_with_fds(s) -> tuple[bytes, list[int]]:
    data, anc, _flags, _addr = s.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
    fds = array.array("i")
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload)
    return data, list(fds)


def test_capacity_needs_the_store_and_the_socket(tmp_path, monkeypatch):
    s = _notify_socket(tmp_path, monkeypatch, "1024")
    try:
        assert fdstore.capacity() == 1024
        monkeypatch.setenv("FDSTORE", "no")
        assert fdstore.capacity() == 0
        monkeypatch.delenv("FDSTORE")
        assert fdstore.capacity() == 0          # a supervisor that only reads READY=1
        monkeypatch.setenv("FDSTORE", "8")
        monkeypatch.delenv("NOTIFY_SOCKET")
        assert fdstore.capacity() == 0
    finally:
        s.close()


def test_store_sends_each_fd_with_its_name(tmp_path, monkeypatch):
    s = _notify_socket(tmp_path, monkeypatch)
    r, w = os.pipe()
    try:
        assert fdstore.store([("tun0", r), ("udp0", w)])
        for name, fd in (("tun0", r), ("udp0", w)):
            data, fds = _recv_with_fds(s)
            assert data == f"FDSTORE=1\nFDNAME={name}".encode() and len(fds) == 1
            assert os.fstat(fds[0]).st_ino == os.fstat(fd).st_ino
            os.close(fds[0])
        fdstore.remove(["tun0"])
        assert s.recv(100) == b"FDSTOREREMOVE=1\nFDNAME=tun0"
    finally:
        os.close(r)
        os.close(w)
        s.close()


# A child as systemd starts it: the fds from 3 on (moved there first: the parent's 3 and 4 are
# pytest's), LISTEN_* in its environment, LISTEN_PID its own pid unless the test says otherwise.
_CHILD = r"""
import fcntl, json, os
for i, fd in enumerate(int(x) for x in os.environ.pop("FU_FDS", "").split()):
    os.dup2(fd, 3 + i)
if os.environ.get("LISTEN_PID") == "self":
    os.environ["LISTEN_PID"] = str(os.getpid())
from dataplane.daemon import fdstore
got = fdstore.listen_fds()
print(json.dumps({"got": got, "inodes": [os.fstat(fd).st_ino for _, fd in got],
                  "cloexec": [bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
                              for _, fd in got],
                  "env": [k for k in os.environ if k.startswith("LISTEN_")]}))
"""


def _run_child(env_extra: dict, fds=()) -> dict:
    import json
    env = dict(os.environ, FU_FDS=" ".join(map(str, fds)), **env_extra)
    r = subprocess.run(python_argv(_CHILD), env=env, pass_fds=tuple(fds), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_listen_fds_are_named_and_taken_from_the_environment():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        out = _run_child({"LISTEN_PID": "self", "LISTEN_FDS": "2",
                          "LISTEN_FDNAMES": "state:udp0"}, fds=(a.fileno(), b.fileno()))
        inodes = [os.fstat(s.fileno()).st_ino for s in (a, b)]
    finally:
        a.close()
        b.close()
    assert out["got"] == [["state", 3], ["udp0", 4]] and out["inodes"] == inodes
    assert out["cloexec"] == [True, True] and out["env"] == []


def test_listen_fds_of_another_process_are_ignored():
    out = _run_child({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1",
                      "LISTEN_FDNAMES": "tun0"})
    assert out["got"] == [] and out["env"] == []
