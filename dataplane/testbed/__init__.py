"""Test, demo and bench scaffolding: real etcd servers and simulated hosts.

* ``netns.py``       network namespaces, named with the suite's prefix, and the sweep of a dead
  run's leftovers;
* ``hosts.py``       simulated hosts joined by veth pairs to a bridge (the ``Testbed``);
* ``router.py``      the router between the hosts' link and a link of its own behind it;
* ``processes.py``   the processes started in the namespaces, tracked by PID;
* ``forwarder.py``   ``flannel-udp forward`` in hosts, with static routes;
* ``wait.py``        waiting, bounded, for a condition;
* ``cni.py``         pods made by the real ``bridge`` and ``host-local`` CNI plugins;
* ``etcd.py``        real etcd servers: one member, or a 3-member cluster;
* ``overlay.py``     a whole overlay: etcd, the network config and a daemon per host;
* ``lease_writer.py`` many peer leases written at once;
* ``peer_count.py``  waiting for a daemon's route table to reach a size;
* ``answer_times.py`` how long a daemon takes to answer /metrics and its status socket;
* ``route_sweep.py`` whether a daemon's engine routes every peer, asked by traffic;
* ``ping_stream.py`` a ping stream between two hosts, and what it lost.

Everything here starts real processes and cleans them up by PID; nothing is mocked.
"""
from .etcd import EtcdCluster, EtcdServer, free_port

__all__ = ["EtcdCluster", "EtcdServer", "free_port"]
