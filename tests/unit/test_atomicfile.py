"""dataplane.host.atomicfile: modes, durability and cleanup of the one atomic-write helper."""
import os
import stat

import pytest

from dataplane.host import atomicfile
from dataplane.host.atomicfile import write_atomic


@pytest.fixture
def umask_077():
    old = os.umask(0o077)
    yield
    os.umask(old)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_explicit_mode_whatever_the_umask(tmp_path, umask_077):
    p = tmp_path / "f"
    write_atomic(p, "text\n", mode=0o644)
    assert p.read_text() == "text\n" and _mode(p) == 0o644


def test_mode_of_the_replaced_file_is_kept_else_the_default(tmp_path, umask_077):
    p = tmp_path / "f"
    write_atomic(p, b"one")
    assert _mode(p) == atomicfile.DEFAULT_MODE
    os.chmod(p, 0o600)
    write_atomic(p, b"two")
    assert p.read_bytes() == b"two" and _mode(p) == 0o600


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "f").symlink_to(victim)
    write_atomic(tmp_path / "f", b"new")
    assert victim.read_bytes() == b"keep"
    assert not (tmp_path / "f").is_symlink() and (tmp_path / "f").read_bytes() == b"new"


def test_data_then_directory_are_fsynced_before_returning(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        st = os.fstat(fd)
        synced.append("dir" if stat.S_ISDIR(st.st_mode) else st.st_size)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_atomic(tmp_path / "f", b"12345")
    assert synced == [5, "dir"]


def test_failed_rename_leaves_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "f"
    p.write_bytes(b"old")

    def refuse(src, dst):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="busy"):
        write_atomic(p, b"new")
    monkeypatch.undo()
    assert p.read_bytes() == b"old" and [x.name for x in tmp_path.iterdir()] == ["f"]


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:3]))
    write_atomic(tmp_path / "f", b"0123456789")
    monkeypatch.undo()
    assert (tmp_path / "f").read_bytes() == b"0123456789"
