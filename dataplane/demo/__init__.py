"""`flannel-udp demo`: a real two-host overlay, one packet followed across it.

* ``story.py``  the order of the story: each part below in turn, each step
                numbered and handed to the renderer (``Demo``);
* ``bringup.py`` what it starts and stops: the engine (``engine/choice.py``),
                etcd + two daemons with --trace, the workloads, tap and echo;
* ``facts.py``  what the overlay holds: etcd's config and leases, each host's
                facts, the kernels' ``ip route get`` answers;
* ``probes.py`` the ping, the UDP datagram and the bursts, with the counters
                and trace cursors read around each;
* ``lab.py``    the workload namespaces, the wire tap and the probe scripts;
* ``readings.py``, ``trace.py``  pure functions: tool output, etcd's leases
                (``control/lease.py``'s parser), trace events and counters ->
                the facts the steps show (a packet's leg, a timeline, costs);
* ``steps.py``, ``steps_direct.py``, ``steps_kernel.py``  pure: the steps' ids,
                titles, "why"s and data, through the engines, with
                --direct-routing and with --engine kernel (the tc programs);
* ``kernel_readings.py``  pure: the programs' counters out of /metrics
                (``datapath="kernel"``) and their datagrams out of the wire tap;
* ``render.py`` terminal output (rich; plain text when not a terminal), one
                entry per step id (the kernel path's in ``render_kernel.py``);
                ``diagram.py`` its picture of the path;
* ``svg.py``    an SVG diagram of the path with the measured values (``--out``);
                ``svg_kernel.py`` the kernel path's;
* ``errors.py`` ``DemoError``.
"""
