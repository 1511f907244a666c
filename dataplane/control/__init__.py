"""The etcd control plane: what the cluster agrees on, and nothing about devices or packets.

* ``config.py``        the network config at ``<prefix>/config`` (parse, defaults, checks);
* ``etcd.py``          the etcd transport: endpoints, failover, auth, TLS, refusals named, the
                       key-value and lease calls (the only module that opens gRPC channels);
* ``etcd_watch.py``    the etcd watch: a watch that resumes (WatchLoop), read then watch;
* ``etcd_errors.py``   what the etcd client raises (below both, and the daemon catches);
* ``registry.py``      flannel's keys: the config key and the lease keys, created, renewed,
                       reclaimed, listed and deleted with flanneld's transactions (``Registry``,
                       the etcd client the daemon holds);
* ``lease.py``         a lease's key and value: the format flanneld writes and reads;
* ``lease_manager.py`` our lease: acquire, renew, re-acquire when it is lost;
* ``allocate.py``      free subnets (IPv4 and IPv6 parts) and the random pick among them, no I/O;
* ``peer_watch.py``    the interface of the peer watch, declared once (PeerWatch);
* ``peers.py``         the other nodes' leases, kept equal to etcd, reported as snapshots;
* ``claims.py``        which key holds each subnet and IPv6 part when two keys name one, no I/O;
* ``peer_process.py``  the same watch in a child process (the Python engine's daemon: its
                       interpreter stays free for forwarding);
* ``peerset.py``       those snapshots (immutable; the one place our own subnet is left out);
* ``routes.py``        the route step: a snapshot and the backend port -> the route table, no I/O;
* ``direct.py``        DirectRouting: which peers get a plain kernel route, no I/O;
* ``underlay_health.py`` whom to probe when, and whose IPv6 underlay failed or works again, no I/O;
* ``configwatch.py``   warns when the network config changes under a running daemon;
* ``subnetfile.py``    subnet.env, the file the workloads' runtime reads;
* ``recurring.py``     a failure that repeats: said once, reminded slowly, said when over.
"""
