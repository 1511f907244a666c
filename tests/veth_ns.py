"""A network namespace of a test's own holding a veth pair e0/e1 (both up), set up further by
`ip -batch` lines, and removed when the test ends, also when it fails."""
from __future__ import annotations

import contextlib

from dataplane.testbed import netns as ns
from tests.conftest import require_root


@contextlib.contextmanager
def veth_namespace(label: str, *ip_lines: str):
    """The namespace's name; ``ip_lines`` (``addr add ... dev e0``, ``route add ...``) run in it
    after the pair is made."""
    require_root()
    name = ns.ns_name(ns.new_run_id(), label)
    ns.create(name, disable_ipv6=False)
    try:
        lines = ("link add e0 type veth peer name e1", "link set e0 up", "link set e1 up") + ip_lines
        ns.run_ip(["-batch", "-"], netns=name, input="".join(line + "\n" for line in lines))
        yield name
    finally:
        ns.delete(name)
