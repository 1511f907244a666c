"""flannel-udp: a userspace UDP/TUN overlay dataplane compatible with flanneld's udp backend."""
__version__ = "0.1.0"
