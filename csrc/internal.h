/*
 * internal.h - private interfaces between the C files of the engine.
 *
 * Python never sees this file (cffi reads only dataplane.h). Prototypes are
 * grouped by the file that owns them: dp_<file>_<verb> says where to look.
 * No function here reads or writes an fd, so csrc/fuzz/ calls them
 * directly; the loop's state, for the files that do I/O, is in io.h.
 * Constants that Python must know too (DP_ICMP_TTL, DP_VNET_HDR_LEN, ...)
 * are in dataplane.h, not here.
 *
 * One piece over 450 lines: every pure file, and every program under
 * csrc/fuzz/, includes nearly all of it (the counters, the wire constants,
 * the route table and the path), so headers split per owner would all be
 * included together anyway, and one file keeps the private contract in
 * one reading order.
 */
#ifndef DP_INTERNAL_H
#define DP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "dataplane.h"

/* The one clock of the engine (ICMP rate limit, coalescing, trace times):
 * CLOCK_MONOTONIC in ns, vDSO on Linux, not a syscall, so it is not counted
 * in `syscalls`. */
static inline uint64_t dp_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Counter indices, in dp_stats field order. The drop indices double as the
 * reason carried by DP_TR_DROP trace events (the header says so). */
enum dp_stat {
    DP_ST_TUN_RX_PACKETS = 0,
    DP_ST_TUN_RX_BYTES,
    DP_ST_UDP_TX_PACKETS,
    DP_ST_UDP_TX_BYTES,
    DP_ST_UDP_RX_PACKETS,
    DP_ST_UDP_RX_BYTES,
    DP_ST_TUN_TX_PACKETS,
    DP_ST_TUN_TX_BYTES,
    DP_ST_ICMP_UNREACH_SENT,
    DP_ST_ICMP_TTL_SENT,
    DP_ST_DROP_NO_ROUTE,
    DP_ST_DROP_TTL,
    DP_ST_DROP_MALFORMED,
    DP_ST_DROP_NOT_IPV4,
    DP_ST_DROP_TRUNCATED,
    DP_ST_DROP_BAD_SOURCE,
    DP_ST_DROP_SEND_ERROR,
    DP_ST_DROP_TUN_FULL,
    DP_ST_DROP_TUN_ERROR,
    DP_ST_SYSCALLS,
    DP_ST_TUN_READS,
    DP_ST_TUN_WRITES,
    DP_ST_UDP_SENDS,
    DP_ST_UDP_RECVS,
    DP_ST_POLLS,
    DP_ST_TX_BATCHES,
    DP_ST_RX_BATCHES,
    DP_ST_ROUTE_SWAPS,
    DP_ST_ICMP_RATELIMITED,
    DP_ST_TUN_RX_GSO,
    DP_ST_UDP_TX_GSO,
    DP_ST_UDP_RX_GRO,
    DP_ST_TUN_TX_GSO,
    DP_ST_UDP_GSO_FALLBACKS,
    DP_ST_DROP_INNER_LOCAL,
    DP_ST_DROP_INNER_FOREIGN,
    DP_ST_COALESCE_WAITS,
    DP_ST_DROP_SCOPE,
    DP_ST_DROP_TOO_BIG,
    DP_ST_ICMP_TOO_BIG_SENT,
    DP_ST_V6_TUN_RX_PACKETS,
    DP_ST_V6_TUN_RX_BYTES,
    DP_ST_V6_UDP_TX_PACKETS,
    DP_ST_V6_UDP_TX_BYTES,
    DP_ST_V6_UDP_RX_PACKETS,
    DP_ST_V6_UDP_RX_BYTES,
    DP_ST_V6_TUN_TX_PACKETS,
    DP_ST_V6_TUN_TX_BYTES,
    DP_ST_V6_ICMP_UNREACH_SENT,
    DP_ST_V6_ICMP_TTL_SENT,
    DP_ST_V6_DROP_NO_ROUTE,
    DP_ST_V6_DROP_TTL,
    DP_ST_V6_DROP_MALFORMED,
    DP_ST_V6_DROP_BAD_SOURCE,
    DP_ST_V6_DROP_SEND_ERROR,
    DP_ST_V6_DROP_TUN_FULL,
    DP_ST_V6_DROP_TUN_ERROR,
    DP_ST_V6_DROP_INNER_LOCAL,
    DP_ST_V6_DROP_INNER_FOREIGN,
    DP_ST_UDP_TX_FRAGMENTED,
    DP_ST_COUNT,
    DP_ST_SLOTS = sizeof(dp_stats) / sizeof(uint64_t)
};

/* The loop thread writes counters through this view; dp_loop_stats() reads
 * the same words from another thread. */
typedef union dp_counters {
    dp_stats s;
    uint64_t v[sizeof(dp_stats) / sizeof(uint64_t)];
} dp_counters;

/* IPv4/ICMP/TCP/UDP wire constants used by packet.c, gso.c, gro.c, tx.c and rx.c. */
enum dp_ipv4 {
    DP_IP_HDR_MIN = 20,
    DP_IP_HDR_MAX = 60,
    DP_IP_PROTO_ICMP = 1,
    DP_IP_FRAG_OFFSET_MASK = 0x1fff,
    DP_ICMP_HDR = 8,
    DP_ICMP_QUOTE_PAYLOAD = 8,     /* bytes of the offender's payload quoted */
    DP_ICMP_ERR_MAX = DP_IP_HDR_MIN + DP_ICMP_HDR + DP_IP_HDR_MAX + DP_ICMP_QUOTE_PAYLOAD,
    DP_ICMP_DEST_UNREACH = 3,
    DP_ICMP_TIME_EXCEEDED = 11,
    DP_IP_PROTO_TCP = 6,
    DP_IP_PROTO_UDP = 17,
    DP_IP_FLAG_DF = 0x40,          /* in byte 6 */
    DP_TCP_HDR_MIN = 20,
    DP_TCP_CSUM_OFF = 16,
    DP_TCP_FIN = 0x01,
    DP_TCP_PSH = 0x08,
    DP_TCP_ACK = 0x10,
    DP_TCP_CWR = 0x80,
    DP_UDP_HDR = 8,
    DP_UDP_CSUM_OFF = 6,
    DP_VNET_F_NEEDS_CSUM = 1       /* VIRTIO_NET_HDR_F_NEEDS_CSUM */
};

/* IPv6 wire constants used by packet6.c, path.c and gso.c. */
enum dp_ipv6 {
    DP_IP6_HDR = 40,               /* the fixed header; no options in it */
    DP_IP6_ADDR = 16,
    DP_IP6_PLEN_OFF = 4,           /* payload length: what follows the fixed header */
    DP_IP6_NH_OFF = 6,             /* next header */
    DP_IP6_HOP_OFF = 7,            /* hop limit */
    DP_IP6_SRC_OFF = 8,
    DP_IP6_DST_OFF = 24,
    DP_IP6_MCAST = 0xff,           /* first byte of ff00::/8 */
    DP_IP6_SCOPE_LINK = 2,         /* multicast scopes 0 (reserved), 1 (interface), 2 (link) */
    DP_IP6_NH_HOP = 0,             /* extension headers (RFC 8200 4, RFC 7045's list) */
    DP_IP6_NH_ROUTING = 43,
    DP_IP6_NH_FRAGMENT = 44,
    DP_IP6_NH_ESP = 50,
    DP_IP6_NH_AH = 51,
    DP_IP6_NH_DEST = 60,
    DP_IP6_NH_MOBILITY = 135,
    DP_IP6_NH_HIP = 139,
    DP_IP6_NH_SHIM6 = 140,
    DP_IP6_NH_ICMP = 58,
    DP_IP6_EXT_MIN = 8,            /* every extension header is at least this long */
    DP_IP6_FRAG_OFFSET_MASK = 0xfff8,   /* of the fragment header's bytes 2-3 */
    DP_ICMP6_DEST_UNREACH = 1,
    DP_ICMP6_TOO_BIG = 2,
    DP_ICMP6_TIME_EXCEEDED = 3,
    DP_ICMP6_INFO_MIN = 128        /* types below are errors (RFC 4443 2.1) */
};

/* An address family as a value: the index of the per-family parts (route
 * tables, peer sets), inner packets' and underlays' alike. */
enum dp_family {
    DP_FAM4 = 0,
    DP_FAM6 = 1,
    DP_FAMILIES = 2
};

/* routes.c APIs: an immutable table of both families' routes, built once,
 * then only read. */
struct dp_routes;

struct dp_route_hit {
    uint32_t peer_ip;    /* network order; 0 for an IPv6 peer */
    uint32_t port;       /* host order */
    uint32_t prefixlen;
    uint32_t mtu;        /* dp_route6.mtu; 0 (none) for dp_route */
    int v6;              /* the peer is peer6, over the IPv6 underlay */
    uint8_t peer6[16];   /* when v6; else all zero (a hit is whole: no padding) */
};

/* -EINVAL for a route dataplane.h forbids (prefixlen out of range, host
 * bits, port > 0xffff; for dp_route6 also a peer_ip it forbids, an mtu
 * out of range or a reserved word not 0); nothing is built then. */
int dp_routes_build(struct dp_routes **out, const dp_route *routes, uint32_t n,
                    const dp_route6 *routes6, uint32_t n6);
/* Reference counted: build gives one reference, hold adds n, free drops one
 * (and frees with the last). Thread-safe. */
void dp_routes_hold(struct dp_routes *t, uint32_t n);
void dp_routes_free(struct dp_routes *t);
/* 1 and *hit filled on a match, 0 on a miss. t may be NULL (empty table).
 * dst: the inner destination, network order, of f's width (4 or 16 bytes). */
int dp_routes_lookup(const struct dp_routes *t, enum dp_family f, const uint8_t *dst,
                     struct dp_route_hit *hit);
/* 1 if ip (network order, 4 or 16 bytes) is a peer of f's underlay: IPv4,
 * the peer_ip of some route of either family (dp_route's, or a dp_route6
 * one IPv4-mapped); IPv6, the peer_ip of some dp_route6 (not mapped). */
int dp_routes_has_peer(const struct dp_routes *t, enum dp_family f, const uint8_t *ip);
/* How many distinct IPv6 peers the table has (0: the IPv4 underlay only). */
uint32_t dp_routes_peers6(const struct dp_routes *t);

/* local.c APIs: this host's own sources, immutable once built (as a
 * route table). Addresses in network order, as everywhere. */
struct dp_local;

/* -EINVAL: prefixlen > 32 or prefixlen6 > 128, host bits in net or net6
 * (net6 may be NULL for prefixlen6 0), more than DP_LOCAL_MAX addrs of a
 * family. addrs6: n6 addresses of 16 bytes each. */
int dp_local_build(struct dp_local **out, uint32_t net, uint32_t prefixlen,
                   const uint32_t *addrs, uint32_t n, const uint8_t *net6,
                   uint32_t prefixlen6, const uint8_t *addrs6, uint32_t n6);
void dp_local_free(struct dp_local *l);
/* 1 if ip is one of the addresses or inside the subnet; l may be NULL (empty). */
int dp_local_has(const struct dp_local *l, uint32_t ip);
/* The same for an IPv6 address (16 bytes, network order). */
int dp_local_has6(const struct dp_local *l, const uint8_t *ip);

/* packet.c APIs: pure functions over byte buffers, no I/O. */
/* Network-order fields, byte by byte: no alignment or endianness assumed. */
static inline uint16_t dp_rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t dp_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void dp_wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void dp_wr32(uint8_t *p, uint32_t v)
{
    dp_wr16(p, (uint16_t)(v >> 16));
    dp_wr16(p + 2, (uint16_t)v);
}

/* Internet checksum pieces: dp_packet_sum is a partial sum in host order
 * (add several, and pseudo-headers, in a uint64_t), dp_packet_fold turns
 * such a total into the 16-bit sum to store big-endian (not inverted), and
 * dp_packet_csum is ~fold(sum) over one buffer: an IP header's checksum. */
uint32_t dp_packet_sum(const uint8_t *p, size_t len);
uint16_t dp_packet_fold(uint64_t sum);
uint64_t dp_packet_pseudo(const uint8_t *ip, uint8_t proto, uint32_t l4len);
uint16_t dp_packet_csum(const uint8_t *p, size_t len);
/* 0 if the TUN-side packet may be routed, else the DP_ST_DROP_* index. */
int dp_packet_check_tun(const uint8_t *p, uint32_t len);
/* Same for a datagram payload received on the UDP socket. */
int dp_packet_check_udp(const uint8_t *p, uint32_t len);
uint32_t dp_packet_dst(const uint8_t *p);
uint32_t dp_packet_src(const uint8_t *p);
/* TTL - 1 with the RFC 1624 checksum update given in dataplane.h. */
void dp_packet_ttl_dec(uint8_t *p);
/* Whether a generated error is allowed in reply to this (valid) packet. */
int dp_packet_may_unreach(const uint8_t *p, uint32_t len);
int dp_packet_may_time_exceed(const uint8_t *p, uint32_t len);
/* Builds the ICMP error into out (DP_ICMP_ERR_MAX bytes); returns its length. */
uint32_t dp_packet_icmp_error(uint8_t *out, const uint8_t *offender, uint32_t len,
                              uint8_t type, uint8_t code, uint32_t src);

/* packet6.c APIs: IPv6 checks and the hop limit; pure, no I/O, and no
 * checksum to patch (IPv6 has none in its header). */
/* 0 if p is an IPv6 packet of exactly len bytes (len >= 40, version 6,
 * payload length + 40 == len), else DP_ST_DROP_MALFORMED. */
int dp_packet6_check(const uint8_t *p, uint32_t len);
/* 1 if the (checked) packet must not leave its link: dataplane.h's link scope. */
int dp_packet6_link_scope(const uint8_t *p);
const uint8_t *dp_packet6_src(const uint8_t *p);
const uint8_t *dp_packet6_dst(const uint8_t *p);
void dp_packet6_hop_dec(uint8_t *p);
/* 1 if address a (16 bytes) is ::. */
int dp_packet6_unspecified(const uint8_t *a);
/* The partial sum of RFC 8200 8.1's pseudo-header of the IPv6 header at ip
 * (its addresses), for an upper layer nh of l4len bytes. */
uint64_t dp_packet6_pseudo(const uint8_t *ip, uint8_t nh, uint32_t l4len);
/* The pseudo-header sum of the TCP/UDP under the IP header at ip, of the
 * family its version says (gso.c and gro.c build and check both). */
static inline uint64_t dp_packet_pseudo_any(const uint8_t *ip, uint8_t proto, uint32_t l4len)
{
    return (ip[0] >> 4) == 6 ? dp_packet6_pseudo(ip, proto, l4len)
                             : dp_packet_pseudo(ip, proto, l4len);
}
/* Whether an ICMPv6 error may be sent about this (checked) packet: the
 * rules of dataplane.h's "ICMPv6 errors" (RFC 4443 2.4 e). */
int dp_packet6_may_error(const uint8_t *p, uint32_t len);
/* Builds the ICMPv6 error into out (DP_ICMP6_ERR_MAX bytes) from src (16
 * bytes) to the offender's source, word (host order) in the 4 bytes after
 * the checksum (packet too big: the MTU); returns its length. */
uint32_t dp_packet6_icmp_error(uint8_t *out, const uint8_t *offender, uint32_t len,
                               uint8_t type, uint8_t code, uint32_t word, const uint8_t *src);

/* gso.c APIs: a TUN read with IFF_VNET_HDR (DP_OFF_TUN_VNET) turned into
 * wire-sized IPv4 packets; pure functions, no I/O. */
enum dp_vnet_gso {
    DP_VNET_GSO_NONE = 0,
    DP_VNET_GSO_TCPV4 = 1,
    DP_VNET_GSO_UDP = 3,         /* UFO: never enabled, so malformed */
    DP_VNET_GSO_TCPV6 = 4,
    DP_VNET_GSO_UDP_L4 = 5,      /* USO */
    DP_VNET_PKT_MAX = 65535      /* largest packet after the header (IPv4 tot_len) */
};

struct dp_vnet_hdr {             /* struct virtio_net_hdr, host order */
    uint8_t flags, gso_type;
    uint16_t hdr_len, gso_size, csum_start, csum_offset;
};

/* A super-packet being cut into segments (dp_gso_start, then dp_gso_next). */
struct dp_gso {
    const uint8_t *pkt;
    uint32_t len, iphl, hlen;    /* hlen: IP + TCP/UDP header */
    uint32_t mss, off, idx;      /* off: payload offset of the next segment */
    uint8_t proto, done;
};

void dp_gso_hdr_parse(const uint8_t *raw, struct dp_vnet_hdr *h);
/* NEEDS_CSUM on a plain packet of either IP version: completes the
 * checksum in place; 0, or DP_ST_DROP_MALFORMED for a range outside the
 * packet (or inside its IP header). */
int dp_gso_csum(uint8_t *p, uint32_t len, const struct dp_vnet_hdr *h);
/* 0 if p (len bytes, gso_type != NONE) can be cut into packets of at most
 * mtu bytes, else the DP_ST_DROP_* reason. p must stay valid while cutting. */
int dp_gso_start(struct dp_gso *g, const uint8_t *p, uint32_t len,
                 const struct dp_vnet_hdr *h, uint32_t mtu);
/* Writes the next segment into out (room for mtu bytes); its length, or 0
 * when there is none left. */
uint32_t dp_gso_next(struct dp_gso *g, uint8_t *out);

/* gso.c, continued: where a DP_OFF_TUN_VNET read lands. The read is
 * scattered as [hdr: DP_VNET_HDR_LEN | slot: mtu | big + mtu: the rest up to
 * DP_VNET_PKT_MAX], so a plain packet lands in its send slot as a plain
 * read(mtu) would, and a super-packet is made whole in big (DP_VNET_PKT_MAX
 * bytes). */
void dp_gso_scatter(uint8_t *hdr, uint8_t *slot, uint8_t *big, uint32_t mtu,
                    struct iovec iov[3]);
/* The r bytes read that way: parses hdr into *h and points *pkt and *len at the
 * packet - in the slot cut at mtu (gso_type NONE), or in big with the
 * slot's bytes copied in front (a super-packet). 0, or DP_ST_DROP_MALFORMED
 * for a read shorter than the header (*pkt = slot, *len = 0, h untouched). */
int dp_gso_read(const uint8_t *hdr, uint32_t r, uint8_t *slot, uint8_t *big, uint32_t mtu,
                struct dp_vnet_hdr *h, uint8_t **pkt, uint32_t *len);

/* train.c APIs: the arithmetic of UDP trains (DP_OFF_UDP_GSO on send,
 * DP_OFF_UDP_GRO on receive); pure, no I/O. */
enum dp_train_limits {
    DP_GSO_SEGS_MAX = 64,          /* datagrams per UDP_SEGMENT send (UDP_MAX_SEGMENTS) */
    DP_GSO_TRAIN_BYTES = 65000,    /* payload of one such send: one IPv4 packet until the
                                      kernel cuts it (65507 at most) */
    DP_RX_GRO_SLOT = 65536,        /* a UDP_GRO train: up to 65535 - 8 bytes */
    DP_RX_SLACK = DP_TRACE_HEAD    /* after each GRO slot: see dp_train_rx_slot */
};

/* Slots first .. first + n - 1 of a batch, sent as one message. */
struct dp_train {
    uint32_t first, n;
};

/* Groups the m queued datagrams (len[i] bytes to dest[i], any key that is
 * equal for equal peer address and port) into trains; returns how many. A
 * train of n >= 2 goes with UDP_SEGMENT = len[first]; a train of one is a
 * plain message. */
uint32_t dp_train_plan(const uint32_t *len, const uint64_t *dest, uint32_t m,
                       struct dp_train *out);
/* Receive slot size for these offloads; *stride: bytes from one slot to the next. */
uint32_t dp_train_rx_slot(uint32_t offloads, uint32_t mtu, uint32_t *stride);

/* A received message of len bytes (room: what its slot can hold) cut at
 * seg, its UDP_GRO segment size (0: none). */
struct dp_train_cut {
    uint32_t len, seg, copied, mtu, off;
    int done;
};

/* One datagram of the message: at byte `off` of the slot; `len` and
 * `truncated` as dp_path_udp takes them (a datagram over the mtu or not
 * wholly in the slot is truncated, with at most mtu bytes); has_bytes: the
 * slot holds some of it (else pass NULL: only its length is known). */
struct dp_datagram {
    uint32_t off, len;
    int truncated, has_bytes;
};

/* 1 if the message is a train of >= 2 datagrams (udp_rx_gro). */
int dp_train_cut_start(struct dp_train_cut *c, uint32_t len, uint32_t seg, uint32_t room,
                       uint32_t mtu);
/* 1 and *d for the next datagram (at least one, even of 0 bytes), 0 when done. */
int dp_train_cut_next(struct dp_train_cut *c, struct dp_datagram *d);

/* trace.c APIs: the ring is written by the loop thread only. */
struct dp_trace {
    uint64_t widx;       /* events published so far (= last seq); release/acquire */
    int enabled;         /* written by any thread, read by the loop (relaxed) */
    dp_trace_event ring[DP_TRACE_RING];
};

void dp_trace_init(struct dp_trace *tr);
static inline int dp_trace_on(const struct dp_trace *tr)
{
    return __atomic_load_n(&tr->enabled, __ATOMIC_RELAXED);
}
void dp_trace_set(struct dp_trace *tr, int enable);
/* head may be NULL (head_len 0); it is cut at DP_TRACE_HEAD bytes. */
void dp_trace_record(struct dp_trace *tr, uint32_t kind, uint32_t len, uint32_t addr,
                     uint32_t port, uint32_t batch, const uint8_t *head, uint32_t head_len);
int dp_trace_read(const struct dp_trace *tr, uint64_t after, dp_trace_event *out, uint32_t max);

/* gro.c APIs: TUN GRO (DP_OFF_TUN_GRO), pure, no I/O; the rules are at the
 * top of gro.c. A run holds pointers to forwarded packets that the caller
 * keeps until it has written the run (one recvmmsg batch at most). */
enum dp_gro_limits {
    DP_GRO_SEGS_MAX = 64,          /* segments in one coalesced write */
    DP_GRO_BYTES_MAX = 65535,      /* IPv4 tot_len; IPv6's whole packet too (kept simple) */
    DP_GRO_HDR_MAX = DP_IP6_HDR + 60      /* IPv6 (or IPv4 ihl 5) + the largest TCP header */
};

struct dp_gro {
    int udp;                       /* UDP runs allowed (DP_OFF_TUN_GRO_UDP); kept by reset */
    uint32_t n;                    /* segments held; 0 = no run */
    uint8_t proto;                 /* of the run: 6 TCP, 17 UDP */
    uint32_t iphl;                 /* of the run: 20 (IPv4), 40 (IPv6) */
    uint32_t hdr_len;              /* IP + TCP/UDP header bytes, the same in all */
    uint32_t gso_size;             /* TCP/UDP payload bytes of the first */
    uint32_t total;                /* tot_len of the coalesced packet */
    uint32_t next_seq;             /* TCP: where the next segment must start */
    int closed;                    /* the last one ended the run (short, PSH) */
    int psh;                       /* the last one had PSH */
    const uint8_t *seg[DP_GRO_SEGS_MAX];
    uint32_t len[DP_GRO_SEGS_MAX];
};

void dp_gro_reset(struct dp_gro *g);
/* 1 if p opens a new run (any run held is forgotten: flush it first),
 * 0 if p cannot be part of one. */
int dp_gro_start(struct dp_gro *g, const uint8_t *p, uint32_t len);
/* 1 if p was appended to the run held, 0 if not (no run, or p breaks it). */
int dp_gro_join(struct dp_gro *g, const uint8_t *p, uint32_t len);
/* For a run of n >= 2: the virtio_net_hdr (DP_VNET_HDR_LEN bytes) and the
 * coalesced packet's IP + TCP/UDP headers (g->hdr_len bytes); the payloads
 * follow, each segment's from its byte hdr_len on. */
void dp_gro_headers(const struct dp_gro *g, uint8_t *vnet, uint8_t *hdr);
/* The iovecs of the run's one writev: vnet, hdr (as filled above), then each
 * segment's payload; returns how many (g->n + 2, at most DP_GRO_SEGS_MAX + 2). */
uint32_t dp_gro_iov(const struct dp_gro *g, uint8_t *vnet, uint8_t *hdr, struct iovec *iov);

/* path.c APIs: the per-packet work of both directions (the checks of
 * dataplane.h, the route, TTL - 1, ICMP errors and their rate limit, and
 * every counter of it), with no I/O: the caller reads and writes, then
 * reports how the write went. tx.c, rx.c and csrc/fuzz/ are the callers. */
enum dp_verdict {
    DP_V_DROP = 0,      /* counted; nothing to write */
    DP_V_FORWARD,       /* TTL decremented: send it (TUN side) or write it to the TUN */
    DP_V_ICMP           /* the drop is counted; path->icmp holds icmp_len bytes for the TUN */
};

struct dp_path {
    dp_counters c;              /* written by the loop thread only */
    struct dp_routes *routes;   /* the table in use; loop thread only */
    struct dp_local *local;     /* own sources in use (UDP step 4); loop thread only */
    uint32_t tun_addr;          /* network order: source of our ICMP errors */
    uint8_t tun_addr6[DP_IP6_ADDR];   /* source of our ICMPv6 errors; :: = none (loop thread) */
    int accept_any;
    int strict_sources;         /* UDP step 5; any thread stores (relaxed) */
    uint64_t icmp_limit;        /* rate << 32 | burst; any thread stores (relaxed) */
    uint64_t icmp_tat;          /* rate limit: theoretical arrival time (GCRA), ns */
    uint64_t now_ns;            /* CLOCK_MONOTONIC, set by the caller per TUN batch */
    uint32_t icmp_len;
    uint8_t icmp[DP_ICMP6_ERR_MAX];   /* either family's error; IPv6's is the larger */
    struct dp_trace trace;
};

/* One writer: a relaxed load + store is a plain add that readers on other
 * threads can never see torn. */
static inline void dp_path_count(struct dp_path *pa, enum dp_stat i, uint64_t n)
{
    __atomic_store_n(&pa->c.v[i], __atomic_load_n(&pa->c.v[i], __ATOMIC_RELAXED) + n,
                     __ATOMIC_RELAXED);
}

/* IPv6's share of each counter (dataplane.h, "Counters by family"), 0 for
 * a counter without one (no share is slot 0). */
static const uint8_t dp_stat_v6[DP_ST_COUNT] = {
    [DP_ST_TUN_RX_PACKETS] = DP_ST_V6_TUN_RX_PACKETS,
    [DP_ST_TUN_RX_BYTES] = DP_ST_V6_TUN_RX_BYTES,
    [DP_ST_UDP_TX_PACKETS] = DP_ST_V6_UDP_TX_PACKETS,
    [DP_ST_UDP_TX_BYTES] = DP_ST_V6_UDP_TX_BYTES,
    [DP_ST_UDP_RX_PACKETS] = DP_ST_V6_UDP_RX_PACKETS,
    [DP_ST_UDP_RX_BYTES] = DP_ST_V6_UDP_RX_BYTES,
    [DP_ST_TUN_TX_PACKETS] = DP_ST_V6_TUN_TX_PACKETS,
    [DP_ST_TUN_TX_BYTES] = DP_ST_V6_TUN_TX_BYTES,
    [DP_ST_ICMP_UNREACH_SENT] = DP_ST_V6_ICMP_UNREACH_SENT,
    [DP_ST_ICMP_TTL_SENT] = DP_ST_V6_ICMP_TTL_SENT,
    [DP_ST_DROP_NO_ROUTE] = DP_ST_V6_DROP_NO_ROUTE,
    [DP_ST_DROP_TTL] = DP_ST_V6_DROP_TTL,
    [DP_ST_DROP_MALFORMED] = DP_ST_V6_DROP_MALFORMED,
    [DP_ST_DROP_BAD_SOURCE] = DP_ST_V6_DROP_BAD_SOURCE,
    [DP_ST_DROP_SEND_ERROR] = DP_ST_V6_DROP_SEND_ERROR,
    [DP_ST_DROP_TUN_FULL] = DP_ST_V6_DROP_TUN_FULL,
    [DP_ST_DROP_TUN_ERROR] = DP_ST_V6_DROP_TUN_ERROR,
    [DP_ST_DROP_INNER_LOCAL] = DP_ST_V6_DROP_INNER_LOCAL,
    [DP_ST_DROP_INNER_FOREIGN] = DP_ST_V6_DROP_INNER_FOREIGN,
};

/* Counter i for the packet p (NULL: its bytes are not at hand), and its
 * IPv6 share when p is IPv6 by the version nibble. */
static inline void dp_path_count_of(struct dp_path *pa, enum dp_stat i, uint64_t n,
                                    const uint8_t *p, uint32_t len)
{
    enum dp_stat v6 = (enum dp_stat)dp_stat_v6[i];

    dp_path_count(pa, i, n);
    if (v6 && p && len && (p[0] >> 4) == 6)
        dp_path_count(pa, v6, n);
}

/* A *_PACKETS counter and the *_BYTES one after it, for the packet p. */
static inline void dp_path_count_packet(struct dp_path *pa, enum dp_stat packets,
                                        const uint8_t *p, uint32_t len)
{
    dp_path_count_of(pa, packets, 1, p, len);
    dp_path_count_of(pa, (enum dp_stat)(packets + 1), len, p, len);
}

static inline void dp_path_trace(struct dp_path *pa, uint32_t kind, uint32_t len, uint32_t addr,
                                 uint32_t port, uint32_t batch, const uint8_t *head)
{
    if (dp_trace_on(&pa->trace))
        dp_trace_record(&pa->trace, kind, len, addr, port, batch, head, head ? len : 0);
}

static inline void dp_path_drop(struct dp_path *pa, enum dp_stat reason, const uint8_t *p,
                                uint32_t len)
{
    dp_path_count_of(pa, reason, 1, p, len);
    dp_path_trace(pa, DP_TR_DROP, len, 0, 0, (uint32_t)reason, NULL);
}

void dp_path_init(struct dp_path *pa, uint32_t tun_addr, int accept_any);
/* rate 0 = unlimited; otherwise burst must be >= 1. Any thread. */
int dp_path_set_icmp_limit(struct dp_path *pa, uint32_t rate, uint32_t burst);
/* A packet read from the TUN. DP_V_FORWARD: *hit is where to send it. */
enum dp_verdict dp_path_tun(struct dp_path *pa, uint8_t *p, uint32_t len,
                            struct dp_route_hit *hit);
/* A TUN read dropped before dp_path_tun could see it: counted as read
 * (len bytes) and in `reason` (a DP_ST_DROP_* index). */
void dp_path_tun_drop(struct dp_path *pa, const uint8_t *p, uint32_t len, int reason);
/* A queued packet the underlay refused: longer than path_mtu less hdrs
 * (dataplane.h "Path MTU"). DP_V_ICMP: pa->icmp is the packet too big. */
enum dp_verdict dp_path_too_big(struct dp_path *pa, uint8_t *p, uint32_t len,
                                uint32_t path_mtu, uint32_t hdrs);
/* A datagram received on the UDP socket (src/sport: its source, 0 if
 * unknown; nmsgs: for the trace; truncated: MSG_TRUNC was set). */
enum dp_verdict dp_path_udp(struct dp_path *pa, uint8_t *p, uint32_t len, uint32_t src,
                            uint32_t sport, uint32_t nmsgs, int truncated);
/* The same from the IPv6 underlay's socket: src6 is its source (16 bytes). */
enum dp_verdict dp_path_udp6(struct dp_path *pa, uint8_t *p, uint32_t len, const uint8_t *src6,
                             uint32_t sport, uint32_t nmsgs, int truncated);
/* How the write of a DP_V_FORWARD (UDP side) or DP_V_ICMP went: 0 or errno. */
void dp_path_tun_written(struct dp_path *pa, const uint8_t *p, uint32_t len, int err);
void dp_path_icmp_written(struct dp_path *pa, int err);

#endif
