/*
 * maps.h - the kernel path's contract: the layouts of its maps' keys and
 * values and the indexes of its counters, shared by the tc programs
 * (flannel.bpf.c) and Python (dataplane/engine/bpf_contract.py parses the
 * enums with contract.py's parser; bpf_cdef.py gives the structs to cffi as
 * its cdef).
 *
 * So it holds what cffi's cdef reads: enums whose items are NAME = number
 * or NAME alone, and typedef structs of __u8/__u16/__u32 fields, one per
 * declaration; no macros, no code. Addresses are in network order, ports
 * and lengths in host order.
 */
#ifndef FU_MAPS_H
#define FU_MAPS_H

enum fu_limits {
    FU_ROUTES_MAX = 65536,   /* entries of each LPM map (fu_routes4, fu_routes6) */
    FU_PEERS_MAX = 65536,    /* distinct peer addresses per underlay (fu_peers4, fu_peers6) */
    FU_LOCAL_MAX = 65536,    /* this host's own addresses per family (fu_local4, fu_local6) */
    FU_ETH_HLEN = 14,        /* an Ethernet header, where a device has one */
    FU_OUTER4 = 28,          /* the IPv4 underlay's outer IPv4 + UDP headers */
    FU_OUTER6 = 48,          /* the IPv6 underlay's outer IPv6 + UDP headers */
    FU_OUTER_TTL = 64,       /* the outer TTL (IPv6: hop limit), as the kernel gives the engines'
                                datagrams */
    FU_CSUM_CHUNK = 128,     /* the bytes a checksum over a whole packet reads at a time */
    FU_CSUM_CHUNKS = 512,    /* ... and how many at most: 128 * 512 bytes > an IPv4 packet's 65535 */
    FU_PMTU_FLOOR4 = 552,    /* the least path MTU the kernel keeps with DF on (IPv4: min_pmtu's
                                default), and IPv6's least link MTU: an outer datagram no longer */
    FU_PMTU_FLOOR6 = 1280    /* fits every path, so it is sent with no path MTU lookup (pmtu.h) */
};

/* fu_config.flags */
enum fu_flags {
    FU_F_STRICT = 1,         /* UDP -> TUN step 5: the inner source is routed to the sender */
    FU_F_ACCEPT_ANY = 2,     /* no step 2: any outer source (the engines' accept_any) */
    FU_F_TUN_L2 = 4,         /* flannel0's packets start with an Ethernet header (the
                                test runs: BPF_PROG_TEST_RUN always hands one in) */
    FU_F_EXT_L2 = 8,         /* the external interface's do (Ethernet: the usual case) */
    FU_F_DECAP_GSO = 16      /* ingress takes a GSO super-packet (a peer program's TCP, encapsulated
                                whole) apart from its outer headers itself: the kernel clears the
                                tunnel's GSO bits on decapsulation (BPF_F_ADJ_ROOM_DECAP_L4_UDP) */
};

/* Counters: one per-CPU array (fu_counters) of __u64, indexed by these. The
 * drop reasons are the engines' (csrc/dataplane.h), counted where the
 * program drops; tx_pass_* and rx_pass_* count what it hands to the
 * userspace engine unchanged, each under the first reason met. */
enum fu_counter {
    FU_UDP_TX_PACKETS = 0,   /* egress: encapsulated and redirected to the peer */
    FU_UDP_TX_BYTES,         /* their inner bytes */
    FU_TUN_TX_PACKETS,       /* ingress: decapsulated into flannel0 */
    FU_TUN_TX_BYTES,         /* their inner bytes */
    FU_DROP_BAD_SOURCE,      /* ingress step 2: the outer source holds no lease */
    FU_DROP_INNER_LOCAL,     /* step 4: the inner source is this host's own */
    FU_DROP_INNER_FOREIGN,   /* step 5 (strict): not routed to the sender */
    FU_TX_PASS_MALFORMED,    /* egress: lengths or version wrong (the engine drops it) */
    FU_TX_PASS_OPTIONS,      /* IPv4 options */
    FU_TX_PASS_FRAGMENT,     /* an IPv4 fragment */
    FU_TX_PASS_SCOPE,        /* IPv6 link scope */
    FU_TX_PASS_NO_ROUTE,     /* the engine answers ICMP unreachable */
    FU_TX_PASS_TTL,          /* TTL / hop limit <= 1: time exceeded */
    FU_TX_PASS_TOO_BIG,      /* over the route's MTU: packet too big */
    FU_TX_PASS_HELPER,       /* a helper refused before the packet changed */
    FU_TX_DROP_HELPER,       /* a helper refused after: a half-made packet, dropped */
    FU_RX_PASS_GSO,          /* ingress: a GSO packet not taken apart here (the socket splits it) */
    FU_RX_PASS_TRUNCATED,    /* ingress: inner packet over the mtu */
    FU_RX_PASS_MALFORMED,
    FU_RX_PASS_OPTIONS,
    FU_RX_PASS_SCOPE,
    FU_RX_PASS_TTL,
    FU_RX_PASS_HELPER,
    FU_RX_DROP_HELPER,
    FU_TX_PASS_GSO6,         /* egress: a GSO packet for the IPv6 underlay (its segments would all
                                carry one UDP checksum: tc cannot ask the kernel for theirs) */
    FU_RX_DROP_CHECKSUM,     /* ingress: the outer UDP checksum is wrong (or 0 over IPv6): what the
                                engines' socket never sees, the kernel dropping it first */
    FU_TX_PASS_PATH_MTU,     /* egress: within the route's MTU, over the path MTU the kernel learnt
                                towards the peer (pmtu.h): the engine answers it */
    FU_COUNTERS              /* how many: the array's size */
};

/* fu_config[0]: set by the loader before any route. */
typedef struct fu_config {
    __u32 own_ip;            /* this host's PublicIP: outer source, ingress destination */
    __u32 ext_ifindex;       /* where encapsulated packets leave */
    __u32 tun_ifindex;       /* flannel0: where decapsulated packets enter */
    __u32 port;              /* UDP source and destination port */
    __u32 mtu;               /* the largest inner packet (flannel0's MTU) */
    __u32 flags;             /* enum fu_flags */
    __u32 own_net;           /* the lease subnet (step 4); own_mask 0: none */
    __u32 own_mask;
    __u8 own_net6[16];       /* the IPv6 lease subnet; own_mask6 all 0: none */
    __u8 own_mask6[16];
    __u8 own_ip6[16];        /* this host's PublicIPv6 (the IPv6 underlay's outer source and the
                                address its datagrams come to); all 0: no IPv6 underlay */
} fu_config;

/* LPM keys: prefixlen first, as BPF_MAP_TYPE_LPM_TRIE wants. */
typedef struct fu_key4 {
    __u32 prefixlen;
    __u8 addr[4];
} fu_key4;

typedef struct fu_key6 {
    __u32 prefixlen;
    __u8 addr[16];
} fu_key6;

/* A route's value, of either inner family and either underlay. */
typedef struct fu_hop {
    __u32 peer_ip;           /* the peer's PublicIP; 0: the IPv6 underlay, to peer_ip6 */
    __u32 mtu;               /* the largest inner packet towards it; 0: fu_config.mtu */
    __u8 peer_ip6[16];       /* the peer's PublicIPv6, where peer_ip is 0 */
} fu_hop;

/* fu_local6's and fu_peers6's key; fu_local4's is a __u32, fu_peers4's too (the peers' value:
 * how many routes name it). */
typedef struct fu_addr6 {
    __u8 addr[16];
} fu_addr6;

#endif
