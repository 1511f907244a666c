"""The demo's steps (dataplane/demo/steps.py) and the renderer's table of them: no root, no etcd.

The integration test runs the story and renders every step of a real run; these check what a run
cannot show: that the ids the story declares and the renderer's table are the same set, so a step
is never silently printed without its facts, and that the demo picks its engine as the daemon does.
"""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from dataplane.demo import bringup, steps, steps_direct, steps_kernel
from dataplane.demo.errors import DemoError
from dataplane.demo.render import Renderer
from dataplane.engine import choice


def test_every_step_id_has_a_handler_and_every_handler_a_step_id():
    assert set(Renderer.SHOWS) == steps.STEP_IDS
    assert all(callable(show) for show in Renderer.SHOWS.values())


def test_both_stories_declare_their_steps_once_each():
    for story in (steps.TUN_PATH, steps.DIRECT_PATH, steps.KERNEL_PATH):
        assert len(set(story)) == len(story)
        assert story[:3] == ("overlay", "workloads", "app_send") and story[-1] == "summary"


def test_the_builders_follow_the_declared_order():
    # Each builder is named after the step it makes, so a step declared but never built (or built
    # out of order) shows here; a real run checks the ids themselves (tests/integration).
    def ids_of(funcs):
        return [f.__name__ for f in funcs]
    assert ids_of(steps.PING_STEPS) + ["udp_packet", "ping_cost", "batching", "summary"] \
        == list(steps.TUN_PATH[2:])
    assert ids_of(steps_direct.FOLLOW_STEPS) + ["summary"] == list(steps.DIRECT_PATH[2:])
    assert ids_of(steps_kernel.FOLLOW_STEPS) + ["slow_path", "summary"] \
        == list(steps.KERNEL_PATH[2:])


def test_an_undeclared_step_id_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="'tun_raed'"):
        steps.step("tun_raed", "a typo", host="A", side="user", why="", data={})
    s = steps.step("deliver", "t", host="B", side="kernel", why="w", data={}, syscalls=[],
                   copies=0)
    assert (s["syscalls"], s["copies"]) == ([], 0)
    assert "syscalls" not in steps.step("summary", "t", host="A+B", side="both", why="w", data={})


def test_the_renderer_refuses_a_step_it_has_no_entry_for():
    rnd = Renderer(Console(file=io.StringIO(), width=100, no_color=True))
    with pytest.raises(KeyError, match="'tun_raed'"):
        rnd.on_step({"id": "tun_raed", "n": 1, "title": "t", "side": "user", "data": {}})


def test_the_engine_is_the_projects_choice(monkeypatch):
    assert bringup.engine_kind("python") == "python"
    with pytest.raises(DemoError, match="no such engine"):
        bringup.engine_kind("pyhton")
    monkeypatch.setattr(choice, "_load_c", lambda: None)
    monkeypatch.setattr(choice, "_c_error", ImportError("no module _dataplane_c"))
    monkeypatch.setattr(choice, "_fallback_logged", True)
    assert bringup.engine_kind("auto") == "python"
    with pytest.raises(DemoError, match="--engine c: the C engine is not built"):
        bringup.engine_kind("c")


def test_engines_compared_in_the_batching_measurement(monkeypatch):
    assert bringup.engines_to_compare("python", False) == (["python"], {})
    assert bringup.engines_to_compare("c", True) == (["c", "python"], {})
    monkeypatch.setattr(choice, "_load_c", lambda: None)
    monkeypatch.setattr(choice, "_c_error", ImportError("no module _dataplane_c"))
    engines, skipped = bringup.engines_to_compare("python", True)
    assert engines == ["python"] and "not built" in skipped["c"]


def test_the_ipv6_story_is_the_ipv4_one_with_the_ping6_after_the_udp_packet():
    six = list(steps.TUN_PATH_IPV6)
    assert six.pop(six.index("udp_packet") + 1) == "ping6" and six == list(steps.TUN_PATH)


def test_demo_ipv6_is_refused_with_direct_routing():
    from dataplane.demo.story import Demo
    with pytest.raises(DemoError, match="--direct-routing"):
        Demo("auto", ipv6=True, direct_routing=True)


def test_demo_engine_kernel_says_why_it_cannot_run(monkeypatch):
    from dataplane.engine.bpf_path import KernelPathError

    def no_clang():
        raise KernelPathError("no clang to compile the kernel path's programs (apt-get install "
                              "clang)")
    monkeypatch.setattr(choice, "load_kernel_path", no_clang)
    monkeypatch.setattr(choice.choose_engine, "__kwdefaults__",
                        dict(choice.choose_engine.__kwdefaults__, load_kernel=no_clang))
    with pytest.raises(bringup.KernelPathUnavailable, match="no clang"):
        bringup.engine_kind("kernel")
    assert bringup.slow_engine("kernel") in ("c", "python")
