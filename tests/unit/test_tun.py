"""open_tun and netconf checks that need no root (no device is created).

Creating a device needs root: tests/integration/test_tun_netns.py does that.
"""
from __future__ import annotations

import pytest


def test_open_tun_rejects_bad_names():
    from dataplane.host.tun import open_tun
    with pytest.raises(ValueError):
        open_tun("x" * 16)
    with pytest.raises(ValueError):
        open_tun("")


def test_netconf_runs_in_an_asyncio_loop_too():
    """pyroute2's sync API could not (netconf refused then); our own requests do not mind one."""
    import asyncio

    from dataplane.host import netconf

    async def inside():
        return netconf.iface_mtu("lo")

    assert asyncio.run(inside()) == netconf.iface_mtu("lo") > 0
