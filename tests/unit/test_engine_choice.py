"""Engine choice in one function: --engine, else $DATAPLANE_ENGINE, else auto (C if built)."""
from __future__ import annotations

import pytest

from dataplane.engine import (EngineChoiceError, EngineUnavailable, c_available, choose_engine,
                              engine_class)
from dataplane.engine.pyengine import PyEngine

AUTO = "c" if c_available() else "python"

CASES = [
    # (id, flag, env, engine, words in the reason)
    ("default", None, {}, AUTO, ["auto:"]),
    ("flag-python", "python", {}, "python", ["--engine python"]),
    ("env-python", None, {"DATAPLANE_ENGINE": "python"}, "python", ["$DATAPLANE_ENGINE python"]),
    ("flag-beats-env", "python", {"DATAPLANE_ENGINE": "c"}, "python", ["--engine python"]),
    ("env-auto", None, {"DATAPLANE_ENGINE": " Auto "}, AUTO, ["auto:", "$DATAPLANE_ENGINE"]),
    ("empty-env-is-default", None, {"DATAPLANE_ENGINE": "  "}, AUTO, ["auto:"]),
    ("flag-auto", "auto", {"DATAPLANE_ENGINE": "python"}, AUTO, ["auto:"]),
]


@pytest.mark.parametrize("flag,env,engine,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choice(flag, env, engine, words):
    cls, why = choose_engine(flag, env=env)
    assert cls.name == engine
    for w in words:
        assert w in why, why


@pytest.mark.parametrize("flag,env,named", [("rust", {}, "--engine='rust'"),
                                            (None, {"DATAPLANE_ENGINE": "fast"}, "$DATAPLANE_ENGINE='fast'")])
def test_unknown_engine_is_a_clear_error(flag, env, named):
    with pytest.raises(EngineChoiceError) as e:
        choose_engine(flag, env=env)
    assert named in str(e.value) and "use c, python or auto" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_flag_name_is_the_callers():
    with pytest.raises(EngineChoiceError, match="-engine='x'"):
        choose_engine("x", flag_name="-engine", env={})


def test_c_when_not_built_says_how_to_get_it(monkeypatch):
    from dataplane.engine import choice
    monkeypatch.setattr(choice, "_load_c", lambda: None)
    monkeypatch.setattr(choice, "_c_error", ImportError("no module _dataplane_c"))
    with pytest.raises(EngineUnavailable, match="not built.*C compiler") as e:
        choose_engine("c", env={})
    assert isinstance(e.value, ImportError)
    cls, why = choose_engine(None, env={})
    assert cls is PyEngine and why.startswith("auto: the C engine is not built")


def test_engine_class_reads_the_environment(monkeypatch):
    monkeypatch.setenv("DATAPLANE_ENGINE", "python")
    assert engine_class() is PyEngine
    monkeypatch.setenv("DATAPLANE_ENGINE", "nonsense")
    with pytest.raises(ValueError, match="DATAPLANE_ENGINE"):
        engine_class()
