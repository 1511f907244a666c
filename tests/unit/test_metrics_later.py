"""prometheus_client off a start's path to READY (perf/README.md#prom-later): /metrics serves
the daemon's families without it, and its process_* and python_* ones once load_standard ran."""
from __future__ import annotations

import subprocess
import sys

# A start's modules, an HTTP server as startup.py makes it, a scrape before READY, then what
# main.py does as READY=1 goes out.
_START = """
import sys, urllib.request
import dataplane.cli.run, dataplane.daemon.main, dataplane.daemon.startup
from dataplane.daemon.http import HttpServer
from dataplane.daemon.metrics import MetricsSource
from dataplane.daemon.metrics_registry import load_standard_soon
s = HttpServer("127.0.0.1", 0, MetricsSource(), ("healthz", "metrics")).start()
url = "http://%s:%d/metrics" % s.address
with urllib.request.urlopen(url, timeout=10) as r:
    before = r.read().decode()
    ctype = r.headers["Content-Type"]
print("prometheus_client" in sys.modules)
print("flannel_udp_build_info" in before, "process_" in before)
load_standard_soon().join(30)
with urllib.request.urlopen(url, timeout=10) as r:
    after = r.read().decode()
print("process_cpu_seconds_total" in after, "python_info" in after)
from prometheus_client import CONTENT_TYPE_LATEST
print(ctype == CONTENT_TYPE_LATEST)
s.close()
"""


def test_a_start_and_its_scrapes_import_no_prometheus_client_before_ready():
    out = subprocess.run([sys.executable, "-c", _START], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split("\n")[:4] == ["False", "True False", "True True", "True"]


def test_a_scrape_before_the_standard_families_serves_the_daemons():
    from dataplane.daemon.metrics import MetricsSource, make_registry
    from dataplane.daemon.metrics_text import MetricsText, generate_latest
    reg = make_registry(MetricsSource(), standard_now=False)
    text = MetricsText().render(reg)
    assert b"flannel_udp_build_info" in text and text == generate_latest(reg)
