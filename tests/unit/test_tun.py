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


def test_netconf_refuses_to_run_in_an_asyncio_loop():
    import asyncio

    from dataplane.host import netconf

    async def inside():
        netconf.iface_mtu("lo")

    with pytest.raises(RuntimeError, match="to_thread"):
        asyncio.run(inside())
