"""The benchmark harness behind ``flannel-udp bench`` (see perf/README.md).

Modules: ``build`` (the C generator/sink udpgen.c beside it, iperf3), ``topo``
(two testbed hosts, pinning, RPS, overlay addresses), ``paths`` (direct
routing, kernel VXLAN, the C and Python engines via ``flannel-udp forward``),
``path_choice`` (a path's name to its setup),
``daemon_paths`` (real daemons over an etcd on both hosts: ``c-direct``, ``flanneld``),
``measure`` (trials: flood, the PDR and NDR searches, TCP, latency, cost), ``report``
(rows, ratios, table, plot), ``runner`` (one run, start to end) and ``trend``
(the soak's memory trend).
"""
