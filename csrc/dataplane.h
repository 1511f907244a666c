/*
 * dataplane.h - the only interface between Python and the C engine.
 *
 * cffi reads this file verbatim as its cdef (csrc/build_ffi.py strips the
 * preprocessor lines), so it holds declarations only: no macros with
 * expressions, no inline code. The loop state is opaque to Python.
 * dataplane/engine/contract.py parses the same text at import for the facts
 * of the Python side (the enums, the dp_stats and dp_state fields), so an
 * enum item is NAME = number or NAME alone (one more than the last), and a
 * struct field is `type name;` or `type name[N];`, one per declaration.
 * One piece over 450 lines: cffi's cdef and contract.py's facts come from
 * one file, so the contract and the behaviour it promises stay one text.
 *
 * The C side knows nothing of etcd and never opens devices: it is handed a
 * TUN fd (IFF_TUN|IFF_NO_PI) and a UDP socket fd (AF_INET), and for the
 * IPv6 underlay a second UDP socket fd (AF_INET6, dp_loop_set_udp6), and
 * moves raw IPv4 and IPv6 packets between them. Behaviour (identical in
 * dataplane/engine/pypath.py):
 *
 * TUN -> UDP, per batch (read() until EAGAIN or `batch` packets):
 *   1. validate: len >= 20, version 4, ihl >= 5, ihl*4 <= len,
 *      tot_len == len                       else drop_malformed (drop_not_ipv4
 *                                           when the version nibble is not 4)
 *   2. look up dst in the route table       miss -> drop_no_route, and ICMP
 *      net unreachable (3/0) into the TUN unless the offender is ICMP or a
 *      non-first fragment (then just dropped) or the ICMP rate limit says no
 *   3. TTL <= 1 -> drop_ttl, and ICMP time exceeded (11/0) into the TUN unless
 *      the offender is an ICMP error (type 3,4,5,11,12) or a non-first
 *      fragment, or the ICMP rate limit says no
 *   4. TTL - 1 with the incremental checksum update (RFC 1624, see below)
 *   5. queue for one sendmmsg() to peer_ip:port; a message the kernel
 *      refuses is counted in drop_send_error and the rest are still sent.
 *
 * UDP -> TUN, per batch (one recvmmsg(MSG_DONTWAIT) of up to `batch`):
 *   1. MSG_TRUNC (datagram > mtu)             -> drop_truncated
 *   2. accept_any == 0 and source IP is not the peer_ip of any route
 *      of the socket's underlay ("The IPv6 underlay") -> drop_bad_source
 *   3. len < 20 or ihl < 5 or ihl*4 > len or tot_len != len -> drop_malformed
 *      (version != 4 -> drop_not_ipv4, checked before the length rules)
 *   4. the inner source is this host's own (dp_loop_set_local: one of the
 *      addresses, or inside the subnet)      -> drop_inner_local
 *   5. strict sources on (dp_loop_set_strict_sources) and the route of the
 *      inner source (the lookup of TUN step 2) is missing or has a peer_ip
 *      other than the datagram's source      -> drop_inner_foreign
 *   6. TTL <= 1 -> drop_ttl (no ICMP on this side)
 *   7. TTL - 1, incremental checksum; write() to the TUN. EAGAIN ->
 *      drop_tun_full, any other error -> drop_tun_error; never retried.
 * With DP_OFF_UDP_GRO a message may be a train of datagrams (UDP_GRO cmsg:
 * the segment size; the last may be shorter): it is split and each datagram
 * goes through 1-7 on its own, so every counter above counts datagrams as
 * without GRO - one larger than the mtu is drop_truncated with mtu bytes,
 * as a plain receive reports it; udp_rx_gro counts trains of >= 2.
 * With DP_OFF_TUN_GRO (needs DP_OFF_TUN_VNET) step 5 holds back runs of
 * consecutive forwarded TCP segments of one flow (the rules are in
 * csrc/gro.c: contiguous, equal size, ACK only, ...) and writes each run of
 * >= 2 as one GSO packet: virtio_net_hdr NEEDS_CSUM, TCPV4, gso_size = the
 * segment payload, csum_start 20, csum_offset 16, the TCP checksum field
 * holding the pseudo-header sum; tot_len and the IP checksum recomputed.
 * IPv6 runs (TCP right after the fixed header; the same bytes 0-3 and hop
 * limit in all) the same way as TCPV6, csum_start 40, the payload length
 * recomputed; a run never mixes the families.
 * With DP_OFF_TUN_GRO_UDP, runs of UDP datagrams of one flow (same rules
 * where they apply, checksum not 0) are written the same way as
 * VIRTIO_NET_HDR_GSO_UDP_L4, csum_offset 6, the UDP length and checksum
 * fields those of the whole run.
 * Packets keep their order and no run outlives its recvmmsg batch. Counters
 * still count packets (a failed GSO write drops each of its segments);
 * tun_tx_gso counts the GSO writes.
 *
 * Offloads (dp_loop_set_offloads; the C engine only, the wire is the same):
 *   DP_OFF_TUN_VNET, reading: each read() is a struct virtio_net_hdr
 *   (DP_VNET_HDR_LEN bytes, host order) and a packet of up to 64 KB.
 *     gso_type NONE: the packet as a plain read(mtu) would see it; with
 *       NEEDS_CSUM its checksum is finished first (the one's complement sum
 *       from csum_start to the end, stored at csum_start + csum_offset; 0
 *       as 0xffff); a range outside the packet, a csum_start inside the
 *       IP header (IPv4: < 20, IPv6: < 40) or an odd csum_offset ->
 *       drop_malformed. IPv4 and IPv6 alike.
 *     TCPV4 / TCPV6 / UDP_L4 (TSO / USO) super-packet (tun_rx_gso += 1): cut
 *       into packets of gso_size payload each (the last may be shorter): IPv4
 *       id + i, tot_len, full IP checksum (IPv6: payload length, TCP/UDP
 *       right after the fixed header); TCP seq + i * gso_size, FIN and PSH on
 *       the last only, CWR on the first only; UDP length; full TCP/UDP
 *       checksums (UDP 0 as 0xffff). Each of them then goes through steps
 *       1-5 above exactly as a plain read, so the tun_rx_*, drop and ICMP
 *       counters count wire-sized packets.
 *     version neither 4 nor 6 -> drop_not_ipv4; an inconsistent header
 *       (unknown or ECN-marked gso_type, TCPV6 or UFO on IPv4, TCPV4 or UFO
 *       on IPv6, protocol (next header) not the type's, tot_len (payload
 *       length + 40) != length, a fragment, a cut TCP/UDP header, NEEDS_CSUM
 *       elsewhere than that header's checksum, gso_size 0 or a segment over
 *       mtu) or a read under DP_VNET_HDR_LEN bytes -> drop_malformed;
 *       either way counted as one packet read of the super-packet's length.
 *   DP_OFF_UDP_GSO, sending: consecutive queued datagrams to the same
 *   peer:port of one length (the last may be shorter) go as one message
 *   with UDP_SEGMENT = that length, at most 64 datagrams and 65000 bytes
 *   (udp_tx_gso += 1 per such train of >= 2). A refused train is sent
 *   again datagram by datagram, each meeting its own fate as in step 5
 *   (udp_gso_fallbacks += 1 per such train). Only EIO turns UDP_GSO off, for
 *   the rest of this loop's life and for every peer (dp_loop_state then
 *   reports the bit cleared): the kernel answers EIO when it cannot segment
 *   on that path at all (UDP-Lite, IPsec, on older kernels a device without
 *   tx checksumming). EMSGSIZE or EINVAL (a segment over one peer's path
 *   MTU, SO_NO_CHECK) and any other refusal concern that send only: GSO
 *   stays on.
 *
 * IPv6 inner packets (version 6) take the same steps with IPv6's rules, in
 * place of the IPv4 ones:
 *   TUN -> UDP: len >= 20 (else drop_malformed), version 6, then len >= 40
 *     and payload length + 40 == len (else drop_malformed); link scope
 *     (below) -> drop_scope; dst looked up in the IPv6 table (a miss is
 *     drop_no_route, and ICMPv6 destination unreachable 1/0 "no route to
 *     destination" into the TUN); hop limit (byte 7) <= 1 -> drop_ttl, and
 *     ICMPv6 time exceeded 3/0; hop limit - 1 (IPv6 has no header
 *     checksum); sent as step 5. Either error only as "ICMPv6 errors"
 *     below allows. Between the hop limit and its decrement: len over the
 *     route's mtu (dp_route6.mtu, when not 0) -> drop_too_big, and ICMPv6
 *     packet too big 2/0 (its 4-byte word after the checksum: that mtu),
 *     as "ICMPv6 errors" allows, counted in icmp_too_big_sent (the order
 *     of RFC 8200 routers: hop limit first, then the link's MTU).
 *   UDP -> TUN: steps 1 and 2 as for IPv4; a version other than 4 and 6 is
 *     drop_not_ipv4 (the name kept for the dashboards: "neither IPv4 nor
 *     IPv6"); len >= 40 and payload length + 40 == len (else
 *     drop_malformed); link scope -> drop_scope; step 4 with the IPv6 own
 *     sources (dp_loop_set_local's net6/addrs6); step 5 with the IPv6
 *     table; hop limit <= 1 -> drop_ttl; hop limit - 1; written.
 *   Link scope: the source or the destination in fe80::/10, the
 *     destination ::, or a multicast destination (ff00::/8) of scope 0, 1
 *     or 2 (the low nibble of byte 1). Such a packet never leaves its link
 *     (RFC 4291): on the TUN side these are the kernel's own router and
 *     neighbour solicitations and MLD reports on flannel0, and on the UDP
 *     side a datagram that would make the host's kernel take a neighbour
 *     discovery message as if it came from the link.
 * Offloads take IPv6 as IPv4 ("Offloads" above; TUN GRO: step 5 of UDP ->
 * TUN).
 *
 * The IPv6 underlay (dp_loop_set_udp6). A route's peer is where its packets
 * go: dp_route's is an IPv4 address, dp_route6's an IPv4-mapped address
 * (::ffff:a.b.c.d: the IPv4 underlay, udp_fd) or an IPv6 address (the IPv6
 * underlay: [peer_ip]:port over udp6_fd); inner IPv6 packets may take
 * either underlay, inner IPv4 packets take IPv4's. TUN -> UDP step 5 sends
 * each packet on its peer's socket, the order of a batch kept within each
 * socket (one sendmmsg per run of one socket; DP_OFF_UDP_GSO trains never
 * mix peers, so never sockets). UDP -> TUN reads both sockets alike; step
 * 2's source check of a datagram from udp6_fd asks whether its source is
 * the IPv6 peer_ip of some dp_route6 (IPv4-mapped ones and dp_route peers
 * match only udp_fd's sources, and no IPv6 address matches those), with
 * the same counter (drop_bad_source) and the same accept_any. The inner
 * packet's family is told by its version nibble on either socket: an IPv4
 * packet from an IPv6 peer is accepted as one from an IPv4 peer is (the
 * check is on the outer source); step 5 (strict) compares the route's
 * peer, address and family, with the datagram's source, so such a packet
 * is drop_inner_foreign there, its IPv4 route's peer being IPv4. The
 * offload bits apply to both sockets (the caller sets UDP_GRO on each).
 *
 * Path MTU (the IPv6 underlay). The caller sets IPV6_RECVERR and
 * IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO on udp6_fd: the kernel then never
 * cuts an outer packet into fragments (many networks drop them), and
 * refuses a datagram longer than the path MTU it knows to that peer (learnt
 * from ICMPv6 packet too big, RFC 8201) with EMSGSIZE, that MTU on the
 * socket's error queue. A message
 * udp6_fd refuses (TUN -> UDP step 5) is judged by that queue, read first
 * (recvmsg(MSG_ERRQUEUE) until it is empty or DP_ERRQ_MAX reads, each
 * counted in udp_recvs):
 *   - refused with EMSGSIZE and the queue held the kernel's own EMSGSIZE
 *     (SO_EE_ORIGIN_LOCAL) with path MTU M (ee_info, the last such one):
 *     with m = M - DP_UNDERLAY6_HDRS, at least DP_MTU6_MIN, a packet
 *     longer than m is drop_too_big and gets ICMPv6 packet too big m, as a
 *     route's mtu does (the quote as read: the hop limit before step 4's
 *     decrement); an IPv6 one not longer than DP_MTU6_MIN (a path under
 *     DP_MTU6_MIN + DP_UNDERLAY6_HDRS) is sent once more, udp6_fd in
 *     IPV6_PMTUDISC_WANT for that send alone, the kernel cutting it into
 *     fragments as a tunnel entry must (RFC 2473): udp_tx_fragmented, or
 *     drop_send_error if refused; another one not longer, drop_send_error;
 *   - else, when the queue held an error from the network (ICMP or ICMPv6
 *     origin: the kernel hands such an error to the next call on the
 *     socket too, whatever it sends), the message is sent once more,
 *     alone; a refusal of that send is judged as above, without a third;
 *   - else drop_send_error.
 * EPOLLERR on either UDP socket empties its error queue the same way
 * (errors from the network: the kernel took the path MTU from them), and so
 * does POLLERR in dp_loop_set_coalesce's waits, which watch both sockets
 * for it even while busy.
 * Inner IPv6 over the IPv4 underlay (udp_fd): the socket stays as the
 * caller made it (the kernel fragments inner IPv4's outer packets, as under
 * flanneld), but IPv4 has no per-packet "don't fragment" but one: a
 * datagram sent with UDP_SEGMENT at least its length is never fragmented,
 * and is refused (EMSGSIZE) over the path MTU. So each inner IPv6 message
 * to an IPv4 peer carries UDP_SEGMENT = its length (a train of one; in a
 * DP_OFF_UDP_GSO train, the train's own). One refused with EMSGSIZE,
 * EINVAL or EIO (any other refusal is drop_send_error) is sent again once,
 * without it, with udp_fd in IP_PMTUDISC_DO and IP_RECVERR for that send
 * alone (its IP_MTU_DISCOVER read first and put back, IP_RECVERR cleared):
 *   - sent: forwarded; when the first refusal was not EMSGSIZE, the kernel
 *     refused the cmsg itself (EIO: no checksum offload or IPsec on the
 *     path; EINVAL: SO_NO_CHECK), so no message carries it from then on
 *     (a kernel before 4.18 ignores it: such a kernel fragments);
 *   - EMSGSIZE with the path MTU M on the error queue: as on the IPv6
 *     underlay, with m = M - DP_UNDERLAY4_HDRS (at least DP_MTU6_MIN); a
 *     packet of at most DP_MTU6_MIN goes once more plain, udp_fd's own
 *     setting fragmenting it;
 *   - else drop_send_error.
 * The common case costs a control message on each inner IPv6 datagram to
 * an IPv4 peer; no syscall and nothing for inner IPv4.
 *
 * Checks are made in exactly the order listed; a packet is counted in the
 * first drop reason it meets and in no other.
 *
 * Inner sources (UDP -> TUN steps 4 and 5). The overlay has no
 * cryptography: anyone on the underlay can send a datagram with a forged
 * outer source, so step 2 proves nothing about who sent it. Step 4 keeps
 * such a datagram from making the host accept a packet that claims to come
 * from the host itself (the daemon sets accept_local on the TUN for this
 * engine's own ICMP errors, and a bridge's address or a pod of the own
 * subnet would pass a loose rp_filter): the caller hands in every address
 * of the host and its lease subnet; an empty set (the default) checks
 * nothing. Step 5 is kernel WireGuard's rule, off by default: the inner
 * source must be routed to the peer that sent the datagram, which breaks
 * peers that send from addresses outside their lease (a host forwarding
 * other networks' traffic without masquerading). The outer port is not
 * compared: a peer's sending socket is its own business.
 *
 * Incremental TTL checksum update (both engines, bit for bit):
 *   old = ttl << 8 | proto;  new = (ttl - 1) << 8 | proto
 *   s = (~check & 0xffff) + (~old & 0xffff) + new
 *   s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16)
 *   check = ~s & 0xffff
 *
 * Generated ICMP errors (written into the TUN, counted in icmp_unreach_sent
 * or icmp_ttl_sent; a failed write counts in drop_tun_full/drop_tun_error):
 *   IPv4: 0x45, tos 0, tot_len 28 + q, id 0, frag 0 (no DF), ttl DP_ICMP_TTL
 *         (64), proto 1, full header checksum, src = tun_addr,
 *         dst = offender's src
 *   ICMP: type, code, checksum over the ICMP message, 4 zero bytes, then the
 *         quote: the offender's first min(len, ihl*4 + 8) bytes (q bytes),
 *         as read (before any TTL change).
 *
 * ICMPv6 errors (RFC 4443; the same counters, which mean "unreachable"
 * and "time exceeded" for both families, and the same rate limit):
 *   IPv6: version 6, traffic class 0, flow label 0, payload length 8 + q,
 *         next header 58, hop limit DP_ICMP_TTL (64), src = tun_addr6
 *         (dp_loop_set_addr6), dst = offender's src
 *   ICMPv6: type, code, checksum over RFC 8200 8.1's pseudo-header (src,
 *         dst, 8 + q as 32 bits, 3 zero bytes, 58) and the message, 4 zero
 *         bytes (packet too big: the mtu, 32 bits), then the offender's
 *         first q = min(len, DP_ICMP6_ERR_MAX - 48) bytes as read, so that
 *         the error is at most DP_ICMP6_ERR_MAX. Types: 1/0 unreachable,
 *         2/0 packet too big, 3/0 time exceeded.
 *   Never sent (the offender just dropped, nothing else counted, no token
 *   of the rate limit taken), in this order:
 *     - tun_addr6 is :: (the default: dp_loop_set_addr6 not called, as on a
 *       host whose flannel0 has no IPv6 address, which then sends no IPv6);
 *     - the offender's destination is multicast (ff00::/8) or its source is
 *       multicast or ::;
 *     - its upper layer is not known to be anything but an ICMPv6 error.
 *       The upper layer is found by walking the extension headers 0, 43,
 *       44, 51 (AH: (byte 1 + 2) * 4 bytes), 60, 135, 139, 140 (fragment:
 *       8 bytes; the others (byte 1 + 1) * 8): none is sent when the walk
 *       meets a header that is not whole in the packet (its first 8 bytes
 *       past len) or more than DP_IPV6_EXT_MAX extension headers, a
 *       fragment header with an offset (bytes 2-3 & 0xfff8) not 0, or ends
 *       past len, at ESP (50: encrypted, it may hide an ICMPv6 error), or
 *       at ICMPv6 (58) with no type byte left or a type < 128 (an error).
 *       Any other upper layer, one we know nothing of included, is not
 *       ICMPv6 and gets an error; so do ICMPv6 informational messages
 *       (echo request: traceroute6 -I).
 *
 * ICMP rate limit (both engines, same integer arithmetic; one bucket for the
 * errors of both families): a token bucket of
 * `burst` errors refilled at `rate` per second (by default
 * DP_ICMP_RATE_DEFAULT and DP_ICMP_BURST_DEFAULT, below; rate 0 = unlimited),
 * as GCRA with one state word tat (ns, initially 0) and now =
 * CLOCK_MONOTONIC read once at the start of each TUN batch:
 *   T = ceil(1e9 / rate); tat = max(tat, now)
 *   tat - now > (burst - 1) * T  -> not sent, icmp_ratelimited += 1
 *   else                         -> sent, tat += T
 * so any t seconds see at most burst + rate * t errors. The offender is
 * counted in its drop reason either way.
 *
 * Counters by family (both engines, at the same sites): a counter of
 * packets or bytes, of ICMP errors sent, or a drop reason that an IPv6
 * packet can meet has an IPv6 share, v6_<counter>, counted with it for a
 * packet whose version nibble (byte 0 >> 4) is 6: the inner packet read,
 * sent, received or written, the ICMP error written. The counter stays the
 * total of both families, so IPv4's share is counter - v6_<counter>.
 * drop_not_ipv4 (neither family) and drop_truncated (counted before the
 * packet is looked at; a cut UDP_GRO train may hold none of its bytes)
 * have none; drop_scope, drop_too_big and icmp_too_big_sent are IPv6's
 * alone and need none. A share is never named drop_*: those are the drop
 * reasons.
 *
 * Byte order: addresses are uint32 in network byte order (as in_addr_t);
 * ports are host order. Counters are uint64, written only by the loop
 * thread, readable at any time with dp_loop_stats().
 */
#ifndef DATAPLANE_H
#define DATAPLANE_H
#include <stdint.h>

/* Every number both engines must agree on is here, as an enum cffi reads:
 * the C files use these names, and dataplane/engine/contract.py parses this
 * file (shipped inside the package) for the Python engine and everything
 * else in Python; native.py refuses a built library that disagrees with it. */
enum dp_limits {
    DP_BATCH_MAX = 256,
    DP_TRACE_RING = 1024,
    DP_TRACE_HEAD = 64,
    DP_MTU_MIN = 68,             /* dp_loop_new: IPv4's minimum datagram ... */
    DP_MTU_MAX = 65535,          /* ... and its largest tot_len */
    DP_ICMP_RATE_DEFAULT = 100,  /* ICMP errors per second (see "ICMP rate limit") */
    DP_ICMP_BURST_DEFAULT = 50,
    DP_ICMP_TTL = 64,            /* TTL (IPv6: hop limit) of the ICMP errors we generate */
    DP_ICMP6_ERR_MAX = 1280,     /* the longest ICMPv6 error: IPv6's minimum MTU */
    DP_MTU6_MIN = 1280,          /* dp_route6.mtu: IPv6's minimum link MTU (RFC 8200 5) */
    DP_UNDERLAY6_HDRS = 48,      /* the IPv6 underlay's outer IPv6 and UDP headers ("Path MTU") */
    DP_UNDERLAY4_HDRS = 28,      /* the IPv4 underlay's outer IPv4 and UDP headers ("Path MTU") */
    DP_ERRQ_MAX = 64,            /* error queue reads at most per emptying ("Path MTU") */
    DP_IPV6_EXT_MAX = 8,         /* extension headers walked to find the upper layer */
    DP_LOCAL_MAX = 65536,        /* dp_loop_set_local: addresses at most */
    DP_COALESCE_MAX_US = 1000,   /* dp_loop_set_coalesce: a millisecond at most */
    DP_DENSE_WAITS = 4,          /* dp_loop_set_coalesce: "densely" is within this many waits */
    DP_LIGHT_PACKETS = 2,        /* dp_loop_set_coalesce: a direction this light still wakes */
    DP_ROUNDS = 8,               /* dp_loop_run: batches per direction between two polls */
    DP_WAKE_MS = 1000,           /* dp_loop_run: the longest wait, so dp_state.beats moves */
    DP_VNET_HDR_LEN = 10         /* struct virtio_net_hdr (DP_OFF_TUN_VNET) */
};

/* Route: every packet to net/prefixlen goes to peer_ip:port.
 * Lookup is longest prefix first, over the distinct prefix lengths present
 * (flannel uses one), with a hash per length: cost does not grow with peers. */
typedef struct dp_route {
    uint32_t net;        /* network order, host bits zero */
    uint32_t prefixlen;  /* 0..32 */
    uint32_t peer_ip;    /* network order */
    uint32_t port;       /* host order */
} dp_route;

/* Route of an IPv6 subnet, looked up the same way in a table of its own.
 * peer_ip says the underlay ("The IPv6 underlay" above): an IPv4-mapped
 * address (::ffff:a.b.c.d) is the IPv4 peer a.b.c.d over udp_fd; any other
 * is an IPv6 peer over the udp6 socket, and must be an address one
 * datagram can be sent to without a scope: ::, fe80::/10 (link-local) and
 * ff00::/8 (multicast) are -EINVAL.
 * mtu: the largest inner packet this route carries (RFC 8200's link MTU of
 * the tunnel towards that peer), 0 (none: the loop's mtu) or
 * DP_MTU6_MIN..DP_MTU_MAX, else -EINVAL; a longer packet gets ICMPv6
 * packet too big (see "IPv6 inner packets"). reserved not 0 is -EINVAL. */
typedef struct dp_route6 {
    uint8_t net[16];     /* network order, host bits zero */
    uint8_t peer_ip[16]; /* ::ffff:a.b.c.d (IPv4 underlay) or an IPv6 address */
    uint32_t prefixlen;  /* 0..128 */
    uint32_t port;       /* host order */
    uint32_t mtu;        /* inner MTU towards that peer; 0 = the loop's mtu */
    uint32_t reserved;
} dp_route6;

/* Counters. Names match the Python engine's stats() keys one for one.
 * Append new fields by taking them from `reserved`: the size is fixed. */
typedef struct dp_stats {
    uint64_t tun_rx_packets;     /* packets read from the TUN */
    uint64_t tun_rx_bytes;
    uint64_t udp_tx_packets;     /* datagrams the kernel accepted */
    uint64_t udp_tx_bytes;
    uint64_t udp_rx_packets;     /* datagrams received (before checks) */
    uint64_t udp_rx_bytes;
    uint64_t tun_tx_packets;     /* forwarded packets written to the TUN */
    uint64_t tun_tx_bytes;
    uint64_t icmp_unreach_sent;
    uint64_t icmp_ttl_sent;
    uint64_t drop_no_route;
    uint64_t drop_ttl;
    uint64_t drop_malformed;
    uint64_t drop_not_ipv4;
    uint64_t drop_truncated;
    uint64_t drop_bad_source;
    uint64_t drop_send_error;
    uint64_t drop_tun_full;
    uint64_t drop_tun_error;
    uint64_t syscalls;           /* every syscall the loop made */
    uint64_t tun_reads;          /* read() calls on the TUN, EAGAIN included */
    uint64_t tun_writes;
    uint64_t udp_sends;          /* sendmmsg()/sendto() calls */
    uint64_t udp_recvs;          /* recvmmsg()/recvfrom() calls, EAGAIN included, and
                                    the error queue's recvmsg() ("Path MTU") */
    uint64_t polls;              /* epoll_wait() calls */
    uint64_t tx_batches;         /* non-empty TUN->UDP batches */
    uint64_t rx_batches;         /* non-empty UDP->TUN batches */
    uint64_t route_swaps;        /* route tables taken into use by the loop */
    uint64_t icmp_ratelimited;   /* ICMP errors not sent: over the rate limit */
    uint64_t tun_rx_gso;         /* GSO super-packets read from the TUN (DP_OFF_TUN_VNET) */
    uint64_t udp_tx_gso;         /* sends that carried a train of datagrams (DP_OFF_UDP_GSO) */
    uint64_t udp_rx_gro;         /* receives that held a train of datagrams (DP_OFF_UDP_GRO) */
    uint64_t tun_tx_gso;         /* TUN writes that carried coalesced segments (DP_OFF_TUN_GRO) */
    uint64_t udp_gso_fallbacks;  /* trains refused and sent again one by one (DP_OFF_UDP_GSO) */
    uint64_t drop_inner_local;   /* UDP -> TUN step 4: inner source is this host's own */
    uint64_t drop_inner_foreign; /* step 5: inner source not routed to the sender */
    uint64_t coalesce_waits;     /* waits of dp_loop_set_coalesce after a pass with work */
    uint64_t drop_scope;         /* IPv6 with a link-scoped source or destination */
    uint64_t drop_too_big;       /* IPv6 longer than its route's mtu (dp_route6.mtu) */
    uint64_t icmp_too_big_sent;  /* ICMPv6 packet too big written into the TUN */
    uint64_t v6_tun_rx_packets;  /* IPv6's shares ("Counters by family") */
    uint64_t v6_tun_rx_bytes;
    uint64_t v6_udp_tx_packets;
    uint64_t v6_udp_tx_bytes;
    uint64_t v6_udp_rx_packets;
    uint64_t v6_udp_rx_bytes;
    uint64_t v6_tun_tx_packets;
    uint64_t v6_tun_tx_bytes;
    uint64_t v6_icmp_unreach_sent;
    uint64_t v6_icmp_ttl_sent;
    uint64_t v6_drop_no_route;
    uint64_t v6_drop_ttl;
    uint64_t v6_drop_malformed;
    uint64_t v6_drop_bad_source;
    uint64_t v6_drop_send_error;
    uint64_t v6_drop_tun_full;
    uint64_t v6_drop_tun_error;
    uint64_t v6_drop_inner_local;
    uint64_t v6_drop_inner_foreign;
    uint64_t udp_tx_fragmented;  /* IPv6 of at most DP_MTU6_MIN sent fragmented ("Path MTU") */
    uint64_t reserved[4];
} dp_stats;

/* Trace events, recorded only while tracing is on (for the demo). */
enum dp_trace_kind {
    DP_TR_TUN_READ = 1,    /* len, head: packet as read from the TUN */
    DP_TR_ROUTE_HIT = 2,   /* addr/port: chosen peer (addr 0: IPv6); len = route prefixlen */
    DP_TR_ROUTE_MISS = 3,  /* addr: the destination that had no route (0 for IPv6) */
    DP_TR_UDP_SEND = 4,    /* addr/port: peer (addr 0: IPv6); len; batch: msgs in that sendmmsg */
    DP_TR_UDP_RECV = 5,    /* addr/port: source (addr 0: IPv6); len; batch: msgs in that
                              recvmmsg; head */
    DP_TR_TUN_WRITE = 6,   /* len, head: packet as written to the TUN */
    DP_TR_ICMP = 7,        /* len, head: the ICMP error written to the TUN */
    DP_TR_DROP = 8         /* len; batch = reason index (dp_stats field order) */
};

typedef struct dp_trace_event {
    uint64_t seq;          /* 1, 2, 3, ... per loop */
    uint64_t ts_ns;        /* CLOCK_MONOTONIC */
    uint32_t kind;
    uint32_t len;
    uint32_t addr;         /* network order */
    uint32_t port;         /* host order */
    uint32_t batch;
    uint32_t head_len;
    uint8_t head[DP_TRACE_HEAD];
} dp_trace_event;

typedef struct dp_loop dp_loop;

/* All functions return 0 (or a count) on success and -errno on failure. */

/* tun_addr: network order; mtu bounds both directions' buffers. The loop
 * sets O_NONBLOCK on tun_fd; udp_fd keeps its mode (sends may block). */
int dp_loop_new(dp_loop **out, int tun_fd, int udp_fd, uint32_t tun_addr,
                uint32_t mtu, uint32_t batch, int accept_any);

/* The IPv6 underlay: fd is an AF_INET6 UDP socket (IPV6_V6ONLY, bound by
 * the caller, as udp_fd is, to the host's [address]:port) that the loop
 * reads and sends from beside udp_fd; it keeps its mode and is never
 * closed here. Before dp_loop_run() and at most once: -EBUSY while the
 * loop runs or when a udp6 socket is set already, -EBADF for fd < 0 or an
 * fd the loop has already. Until it is set, a table with an IPv6 peer is
 * -EINVAL for this loop (dp_loops_set_routes), so call it first. */
int dp_loop_set_udp6(dp_loop *loop, int fd);

/* Runs until dp_loop_stop() or until the TUN is gone; call from a dedicated
 * thread. After each wake-up it alternates the directions, one batch each,
 * while either has work, at most DP_ROUNDS times, then polls again; a poll
 * waits at most DP_WAKE_MS (an idle loop's heartbeat, dp_state.beats). Returns
 * 0 when stopped, -errno when it ended on its own: the TUN gone
 * (DP_END_TUN_GONE) or epoll failing (DP_END_ERROR). dp_loop_state says
 * which. */
int dp_loop_run(dp_loop *loop);

/* Thread-safe, idempotent; the loop returns within one batch. */
int dp_loop_stop(dp_loop *loop);

/* Frees everything; the fds are not closed (they belong to the caller).
 * Only after dp_loop_run() has returned. */
void dp_loop_free(dp_loop *loop);

/* Thread-safe: builds a new table from n IPv4 routes and n6 IPv6 routes
 * and publishes it; the loop takes both families into use together before
 * its next packet. The arrays are copied; either may be NULL when its count
 * is 0. A route dataplane.h forbids, or an IPv6 peer (dp_route6) while the
 * loop has no udp6 socket (dp_loop_set_udp6), is -EINVAL. */
int dp_loop_set_routes(dp_loop *loop, const dp_route *routes, uint32_t n,
                       const dp_route6 *routes6, uint32_t n6);

/* Thread-safe: this host's own sources for UDP -> TUN step 4, replacing
 * the previous set; taken into use like a route table. own_net/own_prefixlen:
 * the lease subnet (network order, host bits zero; prefixlen 0 and net 0:
 * none); addrs: n addresses (network order, at most DP_LOCAL_MAX; copied).
 * own_net6 (16 bytes)/own_prefixlen6 and addrs6 (n6 addresses of 16 bytes
 * each, at most DP_LOCAL_MAX) are the same for IPv6; own_net6 may be NULL
 * when own_prefixlen6 is 0. */
int dp_loop_set_local(dp_loop *loop, uint32_t own_net, uint32_t own_prefixlen,
                      const uint32_t *addrs, uint32_t n, const uint8_t *own_net6,
                      uint32_t own_prefixlen6, const uint8_t *addrs6, uint32_t n6);

/* Thread-safe: the source of the ICMPv6 errors (addr6: 16 bytes, network
 * order; flannel0's IPv6 address), taken into use like a route table. All
 * zeros (the default) generates none (see "ICMPv6 errors"). */
int dp_loop_set_addr6(dp_loop *loop, const uint8_t *addr6);

/* Thread-safe: UDP -> TUN step 5 on (1) or off (0, the default). */
int dp_loop_set_strict_sources(dp_loop *loop, int enable);

/* Thread-safe: the same n routes for several loops (the queues of one host).
 * Each loop's table is built first, then all are published one right after
 * the other, so the queues switch together; on error (-EINVAL as above for
 * any one loop) none is published.
 * dp_loop_set_routes(l, ...) is this call for the one loop l. */
int dp_loops_set_routes(dp_loop *const *loops, uint32_t nloops, const dp_route *routes,
                        uint32_t n, const dp_route6 *routes6, uint32_t n6);

/* Thread-safe snapshot of the counters. */
int dp_loop_stats(dp_loop *loop, dp_stats *out);

/* Thread-safe: bounded-delay batching, as a NIC's interrupt coalescing. With
 * usecs > 0, once work comes densely (a pass that forwarded anything ended
 * within DP_DENSE_WAITS * usecs of the end of the last such pass), a pass is
 * followed by a wait of usecs microseconds in which the loop is not woken by
 * its fds (a stop or a new table still wakes it), then by a pass without
 * epoll_wait; the loop goes back to epoll_wait only after a pass that found
 * nothing. What a pass read is sent before the wait: no packet is held
 * back, but a packet that arrives during a wait waits up to usecs longer
 * (the cost in latency), and each wake-up finds more packets (fewer wake-ups
 * and syscalls per packet, longer trains). A direction that brought at most
 * DP_LIGHT_PACKETS packets per usecs over the last wait and pass (the
 * replies, the ACKs beside a bulk flow) still wakes the wait at once: only
 * a busy direction is worth holding, and a light flow then does not queue
 * behind a bulk flow's timer.
 * 0 (the default) turns it off; more than DP_COALESCE_MAX_US is -EINVAL. */
int dp_loop_set_coalesce(dp_loop *loop, uint32_t usecs);

/* Thread-safe: the ICMP error rate limit (see above). rate 0 = unlimited;
 * with rate > 0, burst must be >= 1 (else -EINVAL). */
int dp_loop_set_icmp_limit(dp_loop *loop, uint32_t rate, uint32_t burst);

/* Offloads: kernel features the caller has switched on for the fds and
 * probed; the wire format never changes (every datagram carries exactly one
 * IPv4 packet of at most mtu bytes). Call before dp_loop_run(): -EBUSY while
 * it runs, -EINVAL for unknown bits, DP_OFF_TUN_GRO without
 * DP_OFF_TUN_VNET or DP_OFF_TUN_GRO_UDP without DP_OFF_TUN_GRO. Packet counters keep counting IP packets as they are on
 * the wire (segments, not super-packets); the *_gso/_gro counters count the
 * big reads, sends, receives and writes. */
enum dp_offload {
    DP_OFF_TUN_VNET = 1,   /* tun_fd has IFF_VNET_HDR (10-byte struct virtio_net_hdr
                              before every packet read and written) and TUNSETOFFLOAD:
                              reads may be TSO/USO super-packets, segmented here */
    DP_OFF_UDP_GSO = 2,    /* trains of equal-sized datagrams to one peer go out in
                              one message with UDP_SEGMENT */
    DP_OFF_UDP_GRO = 4,    /* udp_fd (and the udp6 socket) has UDP_GRO on: one message
                              may hold a train */
    DP_OFF_TUN_GRO = 8,    /* consecutive TCP segments of one flow are written to
                              the TUN as one GSO packet (needs DP_OFF_TUN_VNET) */
    DP_OFF_TUN_GRO_UDP = 16 /* and so are consecutive UDP datagrams of one flow, as
                              one USO packet (needs DP_OFF_TUN_GRO, and a kernel
                              that takes VIRTIO_NET_HDR_GSO_UDP_L4: Linux >= 6.2) */
};
int dp_loop_set_offloads(dp_loop *loop, uint32_t flags);

/* Why a loop is no longer running (dp_state.end). A TUN fd whose device was
 * deleted (ip link del) stays open but every read and write on it fails with
 * EBADFD and epoll reports EPOLLERR: the loop then ends at once rather than
 * run on blind, so that its caller learns it without polling the device. */
enum dp_loop_end {
    DP_END_NONE = 0,       /* running, or not run yet */
    DP_END_STOPPED = 1,    /* dp_loop_stop() */
    DP_END_TUN_GONE = 2,   /* a TUN read or write failed with EBADFD, or a read
                              failed while epoll reported EPOLLERR/EPOLLHUP */
    DP_END_ERROR = 3       /* epoll_wait() itself failed */
};

/* What a loop is doing now, readable from any thread at any time. */
typedef struct dp_state {
    uint32_t end;          /* enum dp_loop_end */
    uint32_t err;          /* the errno that ended it; 0 for DP_END_NONE/STOPPED */
    uint32_t offloads;     /* enum dp_offload bits in use now: those of
                              dp_loop_set_offloads, less DP_OFF_UDP_GSO once the
                              kernel answered EIO (see DP_OFF_UDP_GSO above) */
    uint32_t beats;        /* the loop's heartbeat: + 1 for every pass (after each
                              wake-up and each coalescing wait); an idle loop wakes
                              every DP_WAKE_MS, so a running loop whose beats stay
                              put for seconds is stuck. Wraps: only changes count */
    uint32_t reserved[4];
} dp_state;
int dp_loop_state(dp_loop *loop, dp_state *out);

/* Thread-safe on/off switch for the trace ring. */
int dp_loop_trace(dp_loop *loop, int enable);

/* Copies events with seq > after (oldest first, at most max) into out;
 * returns how many. Events older than the ring are lost. */
int dp_loop_trace_read(dp_loop *loop, uint64_t after, dp_trace_event *out,
                       uint32_t max);

#endif
