"""The etcd control plane: what the cluster agrees on, and nothing about devices or packets.

* ``config.py``        the network config at ``<prefix>/config`` (parse, defaults, checks);
* ``registry.py``      the etcd client: transactions on leases, watches that resume (the only
                       module that imports the etcd library);
* ``lease.py``         a lease's key and value: the format flanneld writes and reads;
* ``lease_manager.py`` our lease: acquire, renew, re-acquire when it is lost;
* ``peers.py``         the other nodes' leases, kept equal to etcd, reported as snapshots;
* ``peer_process.py``  the same watch in a child process (the Python engine's daemon: its
                       interpreter stays free for forwarding);
* ``peerset.py``       those snapshots (immutable; the one place our own subnet is left out);
* ``routes.py``        the route step: a snapshot and the backend port -> the route table, no I/O;
* ``configwatch.py``   warns when the network config changes under a running daemon;
* ``subnetfile.py``    subnet.env, the file the workloads' runtime reads;
* ``recurring.py``     a failure that repeats: said once, reminded slowly, said when over.
"""
