"""Host plumbing: the kernel objects the daemon opens and configures; nothing here knows etcd.

* ``tun.py``      opening flannel0 (one fd per queue, vnet headers);
* ``netconf.py``  its address, MTU, link state and route, over netlink; the host's addresses;
* ``own_sources.py`` telling the engine this host's own sources (the inner sources no datagram
  may claim), again whenever its addresses change;
* ``iface.py``    choosing the external interface by flanneld's rules;
* ``family.py``   an address family as one value (IPv4, IPv6), and one family of the overlay
  on this host (network, lease subnet, flannel0's address) as the daemon hands it down;
* ``firewall.py`` the iptables/nftables rules of --ip-masq and --iptables-forward-rules, one
  family's (ip6tables and ``ip6 flannel-ipv6`` for IPv6), installed, resynced, kept;
* ``firewall_rules.py`` those rules as iptables arguments and iptables-restore text (pure);
* ``firewall_nft.py`` the same rules as an nftables table (pure);
* ``firewall_tools.py`` which tool, running it, and removing every flannel rule (cleanup);
* ``firewall_stack.py`` every enabled family's rules as the daemon holds them (EnableIPv6);
* ``blackhole.py`` the route ``blackhole <lease subnet>`` of --ip-blackhole-route (its metric
  lets a bridge's route of the subnet win);
* ``direct_routes.py`` DirectRouting's kernel routes to peers on this link (proto 153), and the
  watch of the host's own routes and addresses that makes the daemon reconsider them;
* ``nexthops.py``  the nexthop objects those routes go through where the kernel has them (5.3
  on): messages, our id block, which of our routes uses which id;
* ``netlink_batch.py`` rtnetlink requests in bulk on one socket, each answer mapped back to its
  request (those routes, 16,000 at a start), and dumps;
* ``route_lookup.py`` the kernel's route lookup for many addresses at once, in Python from one
  dump (which peers' PublicIPs are on the link);
* ``forwarding.py`` whether the kernel forwards each family (read, never written), and the fix;
* ``sched.py``    the engine loop threads' real-time scheduling (--realtime-priority);
* ``malloc.py``   glibc's allocator kept from holding freed memory (its thresholds fixed);
* ``udpsock.py``  the UDP sockets, one per queue (SO_REUSEPORT, steered by the inner flow);
* ``underlay_probe.py`` the IPv6 underlay's probe as bytes, and the raw socket of its answers;
* ``assembly.py`` the dataplane assembled: flannel0's queues, the sockets, the offloads and the
  engine, for the daemon and `flannel-udp forward` alike;
* ``queues.py``   how many queues;
* ``offload.py``  probing and switching on the kernel offloads (TSO/USO, UDP GSO/GRO);
* ``atomicfile.py`` writing a file others read (subnet.env, results) in one rename;
* ``logfmt.py``   how log lines are written on stderr (text, json, journald's priority prefixes);
* ``child.py``    the command line of a child process that runs this very package (the peer
  watch's process, a successor daemon, testbed daemons, bench forwarders);
* ``unix_listener.py`` a root-only unix socket served by one thread (the daemon's handover and
  status sockets).
"""
