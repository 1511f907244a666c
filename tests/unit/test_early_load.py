"""daemon/early_load.py: the kernel path's load in a thread, taken by the engine's choice.

The loader is a stand-in here (loading real programs is test_kernel_early_load.py's): what is
checked is the hand-off: the result or the error arrives at the join, a result nobody takes is
closed, no thread outlives the join, and only a fresh start whose choice loads the path loads.
"""
from __future__ import annotations

import threading

import pytest

from dataplane.daemon import early_load
from dataplane.daemon.early_load import EarlyLoad
from dataplane.daemon.options import Options


class Loaded:
    closed = False

    def close(self):
        self.closed = True


def loaded_at(where: str, result=None, error=None):
    gate = threading.Event()

    def load(pin_dir):
        gate.wait(5)
        assert pin_dir == where
        if error is not None:
            raise error
        return result
    return EarlyLoad(lambda: where, load), gate


def test_the_choice_takes_the_result_at_the_join():
    kp = Loaded()
    early, gate = loaded_at("/pins/flannel0", kp)
    # the load ends while the choice waits for it (not at the gate's 5 s timeout)
    threading.Timer(0.05, gate.set).start()
    take = early.loader("/pins/flannel0")
    assert gate.is_set()
    assert take() is kp
    assert not early._thread.is_alive()
    early.discard()                       # taken: the caller's to close
    assert not kp.closed


def test_the_error_is_raised_at_the_join():
    early, gate = loaded_at("/pins/flannel0", error=RuntimeError("the verifier said no"))
    gate.set()
    with pytest.raises(RuntimeError, match="the verifier said no"):
        early.loader("/pins/flannel0")()
    assert not early._thread.is_alive()


def test_another_pin_dir_or_no_choice_closes_the_load():
    kp = Loaded()
    early, gate = loaded_at("/pins/flannel0", kp)
    gate.set()
    assert early.loader("/pins/flannel1") is None
    assert kp.closed and not early._thread.is_alive()
    kp2 = Loaded()
    early, gate = loaded_at("/pins/flannel0", kp2)
    gate.set()
    early_load.discard(early)             # the start ended before the choice
    assert kp2.closed


def test_only_a_fresh_start_that_loads_the_kernel_path_loads_early(monkeypatch):
    monkeypatch.delenv("DATAPLANE_ENGINE", raising=False)
    for engine in ("c", "python"):
        assert early_load.start(Options(engine=engine, sources={"engine": "flag"}), None) is None
    assert early_load.start(Options(engine="kernel", sources={"engine": "flag"}),
                            inherited=object()) is None
    monkeypatch.setenv("DATAPLANE_ENGINE", "c")
    assert early_load.start(Options(sources={"engine": "default"}), None) is None
    assert early_load.loader(None, "/pins/flannel0") is None


def test_begun_before_the_imports_only_where_nothing_can_be_handed_over(monkeypatch):
    calls = []
    monkeypatch.setattr(early_load, "start", lambda opts, inherited: calls.append(opts) or "load")
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    fresh = Options(engine="kernel", sources={"engine": "flag"})
    assert early_load.begin(fresh) == "load" and calls == [fresh]
    assert early_load.begin(Options(engine="kernel", sources={"engine": "flag"},
                                    handover=True)) is None
    monkeypatch.setenv("LISTEN_FDS", "3")         # systemd's fd store may hand over
    assert early_load.begin(fresh) is None
    assert calls == [fresh]


def test_a_begun_load_is_the_fresh_start_s_and_a_takeover_discards_it():
    kp = Loaded()
    early, gate = loaded_at("/pins/flannel0", kp)
    opts = Options(engine="kernel", sources={"engine": "flag"})
    assert early_load.start(opts, None, begun=early) is early
    gate.set()
    assert early_load.start(opts, inherited=object(), begun=early) is None
    assert kp.closed and not early._thread.is_alive()
