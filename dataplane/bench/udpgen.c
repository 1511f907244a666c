/*
 * udpgen.c - the benchmark's traffic generator, sink and latency probe.
 *
 * (Over 450 lines as one piece: the four modes share the datagram's layout,
 * the option parser and the bounds in count and time, and ship as one binary.)
 *
 * One binary, four modes, each bounded in count and in time:
 *
 *   send  paced (or flood) UDP with sendmmsg() to one destination; every
 *         datagram carries {magic, tag, seq, ts} so that a sink can tell a
 *         trial's packets from a late straggler of the previous one.
 *   sink  recvmmsg() on a bound socket, counting this tag's datagrams; on
 *         SIGUSR1 it drains until the socket has been idle --idle-ms, then
 *         prints its result. Prints "READY" on stdout once bound.
 *   echo  replies every datagram to its source (the far end of rr).
 *   rr    request/response round trips at a fixed interval; prints p50, p90,
 *         p99, p99.9 and max (nearest rank) and how many round trips they rest on.
 *
 * Addresses are IPv4 (10.5.2.1:9000) or IPv6 in brackets ([fc00:5:0:2::1]:9000; --src
 * without a port may drop them): the bench's inner IPv6 paths run the same modes over AF_INET6.
 *
 * Results are one JSON object on stdout; errors go to stderr with exit 1.
 * Ships inside the package; dataplane/bench/build.py compiles it on first use
 * into the user's cache directory (~/.cache/flannel-udp/).
 *
 * Pacing sleeps with clock_nanosleep(TIMER_ABSTIME) and never spins: the
 * sender shares its core with host A's forwarder, and spinning would steal
 * the forwarder's time and make the generator, not the path, the limit.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum limits {
	BATCH_MAX = 256,
	SIZE_MIN = 32,          /* room for struct hdr */
	SIZE_MAX_ = 65000,
	DURATION_MAX_S = 300,   /* hard bound on every mode */
	SOCKBUF = 8 << 20
};

#define MAGIC 0x66754265u /* "fuBe" */

struct hdr {
	uint32_t magic;
	uint32_t tag;
	uint64_t seq;
	uint64_t ts_ns;
	uint64_t pad;
};

/* One socket address of either family; sa_family tells which. */
union addr {
	struct sockaddr sa;
	struct sockaddr_in v4;
	struct sockaddr_in6 v6;
};

static socklen_t addr_len(const union addr *a)
{
	return a->sa.sa_family == AF_INET6 ? sizeof(a->v6) : sizeof(a->v4);
}

struct opts {
	const char *mode;
	union addr dst, src, bind;
	int have_dst, have_src, have_bind;
	unsigned size, batch, tag, idle_ms, timeout_ms;
	double rate, duration, deadline, interval_us;
	uint64_t count;
};

static volatile sig_atomic_t drain_flag, stop_flag;

static void on_usr1(int sig) { (void)sig; drain_flag = 1; }
static void on_term(int sig) { (void)sig; stop_flag = 1; }

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = t / 1000000000ull, .tv_nsec = t % 1000000000ull };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop_flag)
		;
}

static void die(const char *what)
{
	fprintf(stderr, "udpgen: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void usage(void)
{
	fprintf(stderr,
		"addresses: IPv4 as 10.5.2.1:9000, IPv6 as [fc00:5:0:2::1]:9000 (--src: a bare IPv6 too)\n"
		"usage: udpgen send --dst IP:PORT [--src IP] --size N [--rate PPS] --count N --duration S [--batch N] [--tag N]\n"
		"       udpgen sink --bind IP:PORT [--tag N] --deadline S [--idle-ms N] [--batch N]\n"
		"       udpgen echo --bind IP:PORT --deadline S\n"
		"       udpgen rr   --dst IP:PORT [--src IP] [--size N] --count N [--interval-us N] [--timeout-ms N]\n"
		"rate 0 means flood (as fast as sendmmsg goes); every mode is bounded in time.\n");
	exit(2);
}

static int parse_addr(const char *s, union addr *out, int need_port)
{
	char buf[64];
	const char *host = s, *colon, *port = NULL;
	size_t n;
	int v6 = 0;

	if (*s == '[') {        /* [IPv6]:PORT or [IPv6] */
		const char *close = strchr(s, ']');
		if (!close)
			return -1;
		host = s + 1;
		n = (size_t)(close - host);
		v6 = 1;
		if (close[1] == ':')
			port = close + 2;
		else if (close[1])
			return -1;
	} else if (strchr(s, ':') != strrchr(s, ':')) {  /* a bare IPv6 address, no port */
		n = strlen(s);
		v6 = 1;
	} else {
		colon = strrchr(s, ':');
		n = colon ? (size_t)(colon - s) : strlen(s);
		port = colon ? colon + 1 : NULL;
	}
	if (n >= sizeof(buf) || (need_port && !port))
		return -1;
	memcpy(buf, host, n);
	buf[n] = 0;
	memset(out, 0, sizeof(*out));
	if (v6) {
		out->v6.sin6_family = AF_INET6;
		if (inet_pton(AF_INET6, buf, &out->v6.sin6_addr) != 1)
			return -1;
	} else {
		out->v4.sin_family = AF_INET;
		if (inet_pton(AF_INET, buf, &out->v4.sin_addr) != 1)
			return -1;
	}
	if (port) {
		long p = strtol(port, NULL, 10);
		if (p < 0 || p > 65535)
			return -1;
		/* sin_port and sin6_port sit at the same offset */
		out->v4.sin_port = htons((uint16_t)p);
	}
	return 0;
}

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "dst", required_argument, 0, 'd' },
		{ "src", required_argument, 0, 's' },
		{ "bind", required_argument, 0, 'b' },
		{ "size", required_argument, 0, 'z' },
		{ "rate", required_argument, 0, 'r' },
		{ "count", required_argument, 0, 'c' },
		{ "duration", required_argument, 0, 't' },
		{ "deadline", required_argument, 0, 'D' },
		{ "batch", required_argument, 0, 'B' },
		{ "tag", required_argument, 0, 'T' },
		{ "idle-ms", required_argument, 0, 'i' },
		{ "interval-us", required_argument, 0, 'I' },
		{ "timeout-ms", required_argument, 0, 'w' },
		{ 0, 0, 0, 0 }
	};
	int c;

	if (argc < 2)
		usage();
	memset(o, 0, sizeof(*o));
	o->mode = argv[1];
	o->size = 64;
	o->batch = 32;
	o->idle_ms = 200;
	o->timeout_ms = 200;
	o->duration = 1.0;
	o->deadline = 10.0;
	o->interval_us = 1000;
	o->count = 1000;
	optind = 2;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'd': if (parse_addr(optarg, &o->dst, 1)) usage(); o->have_dst = 1; break;
		case 's': if (parse_addr(optarg, &o->src, 0)) usage(); o->have_src = 1; break;
		case 'b': if (parse_addr(optarg, &o->bind, 1)) usage(); o->have_bind = 1; break;
		case 'z': o->size = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'r': o->rate = strtod(optarg, NULL); break;
		case 'c': o->count = strtoull(optarg, NULL, 10); break;
		case 't': o->duration = strtod(optarg, NULL); break;
		case 'D': o->deadline = strtod(optarg, NULL); break;
		case 'B': o->batch = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'T': o->tag = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'i': o->idle_ms = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'I': o->interval_us = strtod(optarg, NULL); break;
		case 'w': o->timeout_ms = (unsigned)strtoul(optarg, NULL, 10); break;
		default: usage();
		}
	}
	if (o->size < SIZE_MIN || o->size > SIZE_MAX_ || o->batch < 1 || o->batch > BATCH_MAX)
		usage();
	/* Every mode is bounded: clamp the time limits. */
	if (o->duration <= 0 || o->duration > DURATION_MAX_S)
		o->duration = DURATION_MAX_S;
	if (o->deadline <= 0 || o->deadline > DURATION_MAX_S)
		o->deadline = DURATION_MAX_S;
	if (o->rate < 0)
		usage();
	/* A socket has one family: the source must be the destination's. */
	if (o->have_src && o->have_dst && o->src.sa.sa_family != o->dst.sa.sa_family)
		usage();
}

static int udp_socket(int family, const union addr *bind_to)
{
	int fd = socket(family, SOCK_DGRAM, 0);
	int buf = SOCKBUF;

	if (fd < 0)
		die("socket");
	/* FORCE variants need CAP_NET_ADMIN (we run as root); fall back quietly. */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	if (bind_to && bind(fd, &bind_to->sa, addr_len(bind_to)) < 0)
		die("bind");
	return fd;
}

/* send: paced by an absolute schedule (packet i is due at start + i/rate). */
static int mode_send(struct opts *o)
{
	static struct mmsghdr msgs[BATCH_MAX];
	static struct iovec iov[BATCH_MAX];
	uint8_t *bufs = calloc(BATCH_MAX, o->size);
	union addr src = o->src;
	uint64_t sent = 0, errors = 0, calls = 0, start, end, deadline;
	int fd;

	if (!o->have_dst)
		usage();
	if (!bufs)
		die("calloc");
	src.v4.sin_port = 0;
	fd = udp_socket(o->dst.sa.sa_family, o->have_src ? &src : NULL);
	for (unsigned i = 0; i < o->batch; i++) {
		struct hdr *h = (struct hdr *)(bufs + (size_t)i * o->size);
		h->magic = MAGIC;
		h->tag = o->tag;
		iov[i].iov_base = h;
		iov[i].iov_len = o->size;
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
		msgs[i].msg_hdr.msg_name = &o->dst;
		msgs[i].msg_hdr.msg_namelen = addr_len(&o->dst);
	}
	start = now_ns();
	deadline = start + (uint64_t)(o->duration * 1e9);
	while (sent < o->count && !stop_flag) {
		uint64_t t = now_ns(), n;
		int r;

		if (t >= deadline)
			break;
		n = o->count - sent;
		if (o->rate > 0) {
			uint64_t due = (uint64_t)((double)(t - start) * 1e-9 * o->rate) + 1;
			if (due > o->count)
				due = o->count;
			if (due <= sent) {
				uint64_t next = start + (uint64_t)((double)sent * 1e9 / o->rate);
				sleep_until(next < deadline ? next : deadline);
				continue;
			}
			n = due - sent;
		}
		if (n > o->batch)
			n = o->batch;
		for (unsigned i = 0; i < n; i++) {
			struct hdr *h = iov[i].iov_base;
			h->seq = sent + i;
			h->ts_ns = t;
		}
		r = sendmmsg(fd, msgs, (unsigned)n, 0);
		calls++;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			/* One refused datagram (e.g. ENOBUFS): count it as offered
			 * and lost, and go on with the rest. */
			errors++;
			sent++;
			continue;
		}
		sent += (uint64_t)r;
	}
	end = now_ns();
	{
		double el = (double)(end - start) * 1e-9;
		printf("{\"sent\": %llu, \"errors\": %llu, \"calls\": %llu, \"elapsed_s\": %.6f, "
		       "\"rate_pps\": %.1f}\n",
		       (unsigned long long)sent, (unsigned long long)errors,
		       (unsigned long long)calls, el, el > 0 ? (double)sent / el : 0.0);
	}
	return 0;
}

static int mode_sink(struct opts *o)
{
	static struct mmsghdr msgs[BATCH_MAX];
	static struct iovec iov[BATCH_MAX];
	const unsigned bufsz = 65536;
	uint8_t *bufs = malloc((size_t)o->batch * bufsz);
	uint64_t received = 0, bytes = 0, other = 0, first = 0, last = 0, calls = 0;
	uint64_t start, deadline, drain_since = 0;
	struct timeval tv = { .tv_sec = 0, .tv_usec = 20000 };
	int fd;

	if (!o->have_bind)
		usage();
	if (!bufs)
		die("malloc");
	fd = udp_socket(o->bind.sa.sa_family, &o->bind);
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		die("SO_RCVTIMEO");
	for (unsigned i = 0; i < o->batch; i++) {
		iov[i].iov_base = bufs + (size_t)i * bufsz;
		iov[i].iov_len = bufsz;
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	printf("READY\n");
	fflush(stdout);
	start = now_ns();
	deadline = start + (uint64_t)(o->deadline * 1e9);
	for (;;) {
		uint64_t t = now_ns();
		int r;

		if (stop_flag || t >= deadline)
			break;
		if (drain_flag) {
			uint64_t quiet_from = last > drain_since ? last : drain_since;
			if (!drain_since)
				drain_since = quiet_from = t;
			if (t - quiet_from >= (uint64_t)o->idle_ms * 1000000ull)
				break;
		}
		r = recvmmsg(fd, msgs, o->batch, MSG_WAITFORONE, NULL);
		calls++;
		if (r <= 0)
			continue; /* timeout or EINTR: re-check the bounds */
		t = now_ns();
		for (int i = 0; i < r; i++) {
			const struct hdr *h = iov[i].iov_base;
			if (msgs[i].msg_len >= sizeof(*h) && h->magic == MAGIC && h->tag == o->tag) {
				received++;
				bytes += msgs[i].msg_len;
			} else {
				other++;
			}
		}
		if (!first)
			first = t;
		last = t;
	}
	{
		double win = last > first ? (double)(last - first) * 1e-9 : 0.0;
		printf("{\"received\": %llu, \"bytes\": %llu, \"other\": %llu, \"calls\": %llu, "
		       "\"window_s\": %.6f, \"rate_pps\": %.1f}\n",
		       (unsigned long long)received, (unsigned long long)bytes,
		       (unsigned long long)other, (unsigned long long)calls, win,
		       win > 0 ? (double)received / win : 0.0);
	}
	return 0;
}

static int mode_echo(struct opts *o)
{
	uint8_t buf[65536];
	struct timeval tv = { .tv_sec = 0, .tv_usec = 100000 };
	uint64_t deadline, echoed = 0;
	int fd;

	if (!o->have_bind)
		usage();
	fd = udp_socket(o->bind.sa.sa_family, &o->bind);
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
		die("SO_RCVTIMEO");
	printf("READY\n");
	fflush(stdout);
	deadline = now_ns() + (uint64_t)(o->deadline * 1e9);
	while (!stop_flag && now_ns() < deadline) {
		union addr from;
		socklen_t fl = sizeof(from);
		ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, &from.sa, &fl);
		if (n <= 0)
			continue;
		if (sendto(fd, buf, (size_t)n, 0, &from.sa, fl) == n)
			echoed++;
	}
	printf("{\"echoed\": %llu}\n", (unsigned long long)echoed);
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const uint64_t *v, uint64_t n, double p)
{
	uint64_t k;
	if (!n)
		return 0.0;
	k = (uint64_t)(p / 100.0 * (double)n + 0.999999);
	if (k < 1)
		k = 1;
	if (k > n)
		k = n;
	return (double)v[k - 1] / 1000.0;
}

static int mode_rr(struct opts *o)
{
	uint8_t out[65536], in[65536];
	union addr src = o->src;
	uint64_t *rtt, got = 0, lost = 0, start, deadline, sum = 0;
	struct hdr *h = (struct hdr *)out;
	int fd;

	if (!o->have_dst || o->count == 0 || o->count > 10000000)
		usage();
	rtt = calloc(o->count, sizeof(*rtt));
	if (!rtt)
		die("calloc");
	src.v4.sin_port = 0;
	fd = udp_socket(o->dst.sa.sa_family, o->have_src ? &src : NULL);
	if (connect(fd, &o->dst.sa, addr_len(&o->dst)) < 0)
		die("connect");
	memset(out, 0, sizeof(out));
	h->magic = MAGIC;
	h->tag = o->tag;
	start = now_ns();
	/* Bounded: count probes, each waiting at most timeout_ms, and overall
	 * by --deadline. */
	deadline = start + (uint64_t)(o->deadline * 1e9);
	for (uint64_t i = 0; i < o->count && !stop_flag; i++) {
		uint64_t t0, t_end;

		sleep_until(start + (uint64_t)((double)i * o->interval_us * 1000.0));
		if (now_ns() >= deadline)
			break;
		h->seq = i;
		t0 = h->ts_ns = now_ns();
		if (send(fd, out, o->size, 0) < 0) {
			lost++;
			continue;
		}
		t_end = t0 + (uint64_t)o->timeout_ms * 1000000ull;
		for (;;) {
			uint64_t t = now_ns();
			struct pollfd pfd = { .fd = fd, .events = POLLIN };
			int left_ms = t < t_end ? (int)((t_end - t + 999999) / 1000000) : 0;
			ssize_t n;

			if (poll(&pfd, 1, left_ms) <= 0) {
				lost++;
				break;
			}
			n = recv(fd, in, sizeof(in), MSG_DONTWAIT);
			if (n >= (ssize_t)sizeof(struct hdr) && ((struct hdr *)in)->seq == i &&
			    ((struct hdr *)in)->magic == MAGIC) {
				rtt[got] = now_ns() - t0;
				sum += rtt[got];
				got++;
				break;
			}
			/* A late reply to an earlier probe, or junk: keep waiting. */
		}
	}
	qsort(rtt, got, sizeof(*rtt), cmp_u64);
	/* p99.9 rests on the slowest 0.1 %: with fewer than 1000 round trips it is
	 * the maximum, which is why the sample count goes with it. */
	printf("{\"sent\": %llu, \"received\": %llu, \"lost\": %llu, \"p50_us\": %.1f, "
	       "\"p90_us\": %.1f, \"p99_us\": %.1f, \"p999_us\": %.1f, \"min_us\": %.1f, "
	       "\"max_us\": %.1f, \"mean_us\": %.1f}\n",
	       (unsigned long long)(got + lost), (unsigned long long)got,
	       (unsigned long long)lost, pct(rtt, got, 50), pct(rtt, got, 90), pct(rtt, got, 99),
	       pct(rtt, got, 99.9),
	       got ? (double)rtt[0] / 1000.0 : 0.0,
	       got ? (double)rtt[got - 1] / 1000.0 : 0.0,
	       got ? (double)sum / (double)got / 1000.0 : 0.0);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct sigaction sa;

	parse(argc, argv, &o);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1; /* no SA_RESTART: interrupt a blocked recvmmsg */
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	prctl(PR_SET_TIMERSLACK, 1UL); /* pacing wants µs wake-ups */
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (!strcmp(o.mode, "send"))
		return mode_send(&o);
	if (!strcmp(o.mode, "sink"))
		return mode_sink(&o);
	if (!strcmp(o.mode, "echo"))
		return mode_echo(&o);
	if (!strcmp(o.mode, "rr"))
		return mode_rr(&o);
	usage();
	return 2;
}
