"""An 18-second perf/soak.py: the stable pair forwards while hosts join and leave every 3 s.

Loss is not asserted (the machine is shared: a stalled process loses datagrams that no bug lost); what
is asserted cannot be explained by contention: both stable daemons alive without a traceback, every
joining host reachable both ways, no datagram of the stream dropped for lack of a route to the peer
that stayed, counters that add up, and churners that exit 0 on SIGTERM.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import require, require_overlay

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.root, pytest.mark.etcd, pytest.mark.slow]


def test_soak_smoke(tmp_path):
    require_overlay()
    require(shutil.which("gcc") is not None, "needs gcc (the soak compiles its traffic generator)")
    out = tmp_path / "soak.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "soak.py"), "--minutes", "0.3",
                        "--rate", "1000", "--churn-every", "3", "--engines", "c,python",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert out.exists(), f"soak wrote nothing ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-3000:]}"
    s = json.loads(out.read_text())["summary"]
    assert r.returncode == 0, json.dumps(s, indent=1)
    assert s["stream_sent"] > 10000 and s["churn_joins"] >= 4
    assert s["lost_to_missing_route_at_a"] == 0 and s["churn_unreachable"] == 0
    assert s["counters_consistent"], s["hops"]
    assert all(v[0] and v[1] for v in s["rss_kb"].values()) and all(s["fds"].values())
