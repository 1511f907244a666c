"""`flannel-udp demo`: a real two-host overlay, one packet followed across it.

* ``story.py``  the steps: starts the overlay (etcd + two daemons with --trace),
                sends the probes, collects what the system says, builds the steps;
* ``readings.py`` pure functions: tool output and counters -> the steps' data
                (a ping's timeline, a packet's leg, a cost row);
* ``lab.py``    the workload namespaces, the wire tap and the probe scripts;
* ``trace.py``  pure functions: trace events + counters + ``ip route get`` -> steps;
* ``render.py`` terminal output (rich; plain text when not a terminal);
* ``svg.py``    an SVG diagram of the path with the measured values (``--out``).
"""
