"""subnet.env in a directory someone else can write to: a planted link or a crash never costs a file."""
import os
from ipaddress import IPv4Network

import pytest

from dataplane.control.subnetfile import read_subnet_env, write_subnet_env
from dataplane.host.family import Part

N, S = IPv4Network("10.5.0.0/16"), IPv4Network("10.5.84.0/24")
VICTIM = b"root:x:0:0:root:/root:/bin/bash\n"


def test_planted_link_at_the_old_temporary_name_is_not_followed(tmp_path):
    # The file used to be written through "<dir>/.<name>" opened with O_CREAT|O_TRUNC: a link
    # planted there by anyone who can write to the directory made root truncate its target.
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".subnet.env").symlink_to(victim)
    write_subnet_env(str(run / "subnet.env"), [Part(N, S)], 1472, False)
    assert victim.read_bytes() == VICTIM
    assert read_subnet_env(str(run / "subnet.env"))["FLANNEL_SUBNET"] == "10.5.84.1/24"
    assert not (run / "subnet.env").is_symlink()


def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "subnet.env"
    write_subnet_env(str(path), [Part(N, S)], 1472, False)
    before = path.read_bytes()
    real_write = os.write

    def half_then_fail(fd, data):          # the disk fills up after a few bytes
        real_write(fd, bytes(data)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        write_subnet_env(str(path), [Part(N, IPv4Network("10.5.9.0/24"))], 1400, True)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["subnet.env"]
