"""flannel-udp: a userspace UDP/TUN overlay dataplane compatible with flanneld's udp backend.

The folders are the layers, from the top:

* ``cli/``      ``flannel-udp`` and its subcommands, flanneld's flag table;
* ``daemon/``   ``flannel-udp run``: the orchestrator over the three below;
* ``control/``  the etcd control plane: config, leases, peers, the route step;
* ``host/``     the kernel objects: flannel0, netlink, sockets, firewall rules, offloads;
* ``engine/``   the packet loops (C through cffi, pure Python) behind one contract;
* ``demo/``, ``bench/``, ``testbed/``  tools on top: the demo, the benchmark, simulated hosts.
"""
__version__ = "0.1.0"
