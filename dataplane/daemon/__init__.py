"""`flannel-udp run`: the daemon, an orchestrator over the control plane, the host and the engines.

* ``main.py``     start order, the serve loop, shutdown;
* ``metrics.py``  the /healthz, /metrics and /debug/trace server and the Prometheus collector.
"""
