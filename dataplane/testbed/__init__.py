"""Test and demo scaffolding: real etcd servers (etcd.py) and, beside it, simulated hosts.

Everything here starts real processes and cleans them up by PID; nothing is mocked.
"""
from .etcd import EtcdCluster, EtcdServer, free_port

__all__ = ["EtcdCluster", "EtcdServer", "free_port"]
