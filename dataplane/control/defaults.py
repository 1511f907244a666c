"""Where flanneld looks for etcd and its keys when told nothing: the flags' defaults, in a module
of their own so that reading the flags imports no etcd client (grpc and protobuf are ~0.12 s of
a start, which the kernel path's load runs beside once the flags are read:
daemon/early_load.py begin)."""

DEFAULT_ENDPOINTS = ("http://127.0.0.1:4001", "http://127.0.0.1:2379")
DEFAULT_PREFIX = "/coreos.com/network"
