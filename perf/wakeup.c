/* When does a CPU-hungry sleeper get its core back from a busy task on the same core?
 *
 *     gcc -O2 -o /tmp/wakeup perf/wakeup.c
 *     /tmp/wakeup --wake timer --work 100 --nice 0 --slice-us 0
 *     /tmp/wakeup --wake timer --work 100 --nice 0 --slice-us 100
 *     /tmp/wakeup --wake timer --work 100 --nice -10
 *     /tmp/wakeup --wake socket --work 100 --nice -10
 *
 * The model of a forwarder beside its application (perf/README.md#latency-under-load): on CPU0 a
 * busy task (a child) spins; the sleeper (the parent), on the same CPU, sleeps, is woken, then works
 * --work us, and again. --wake timer: it sleeps --period us on a timer. --wake socket: the busy task
 * sends it a datagram over loopback every --period us (the forwarder is woken by its application's
 * send, in the sender's own syscall). Reports how many wake-ups waited more than 0.5 ms for the
 * core and the longest. --nice and --slice-us set the sleeper with sched_setattr(2) (SCHED_OTHER;
 * a slice needs Linux >= 6.12). Bounded: 2.5 s of measuring, the busy task ends after 3 s.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LATE_NS 500000ull
#define MEASURE_NS 2500000000ull
#define BUSY_NS 3000000000ull

struct sched_attr_v1 {
	uint32_t size, policy;
	uint64_t flags;
	int32_t nice;
	uint32_t priority;
	uint64_t runtime, deadline, period;
	uint32_t util_min, util_max;
};

static uint64_t now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void spin_until(uint64_t t)
{
	while (now() < t)
		;
}

static int udp_pair(int *rx, int *tx)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;

	*rx = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	*tx = socket(AF_INET, SOCK_DGRAM, 0);
	if (*rx < 0 || *tx < 0 || bind(*rx, (void *)&a, sizeof a) ||
	    getsockname(*rx, (void *)&a, &len) || connect(*tx, (void *)&a, sizeof a))
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	int period_us = 200, work_us = 100, nice_v = 0, slice_us = 0, socket_wake = 0, c;
	static const struct option opts[] = {
		{ "wake", required_argument, 0, 'w' }, { "period", required_argument, 0, 'p' },
		{ "work", required_argument, 0, 'k' }, { "nice", required_argument, 0, 'n' },
		{ "slice-us", required_argument, 0, 's' }, { 0, 0, 0, 0 } };
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'w': socket_wake = !strcmp(optarg, "socket"); break;
		case 'p': period_us = atoi(optarg); break;
		case 'k': work_us = atoi(optarg); break;
		case 'n': nice_v = atoi(optarg); break;
		case 's': slice_us = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: wakeup [--wake timer|socket] [--period US] [--work US] "
					"[--nice N] [--slice-us US]\n");
			return 2;
		}
	}
	if (period_us < 10 || period_us > 100000 || work_us < 0 || work_us > 100000) {
		fprintf(stderr, "wakeup: --period 10..100000, --work 0..100000\n");
		return 2;
	}
	cpu_set_t cpu0;
	CPU_ZERO(&cpu0);
	CPU_SET(0, &cpu0);
	sched_setaffinity(0, sizeof cpu0, &cpu0);
	/* The busy task stamps each send, so that the sleeper measures from the wake-up's cause. */
	volatile uint64_t *sent_at = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
					  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int rx = -1, tx = -1;
	if (sent_at == MAP_FAILED || (socket_wake && udp_pair(&rx, &tx))) {
		perror("wakeup: setup");
		return 1;
	}
	pid_t busy = fork();
	if (busy == 0) {
		uint64_t end = now() + BUSY_NS, next = now();
		char b = 1;
		while (now() < end) {
			if (socket_wake && now() >= next) {
				*sent_at = now();
				if (send(tx, &b, 1, 0) < 0) { /* the sleeper's buffer full: skip */ }
				next += (uint64_t)period_us * 1000u;
			}
		}
		_exit(0);
	}
	prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
	if (nice_v || slice_us) {
		struct sched_attr_v1 at = { .size = sizeof at, .nice = nice_v,
					    .runtime = (uint64_t)slice_us * 1000u };
		if (syscall(SYS_sched_setattr, 0, &at, 0)) {
			perror("wakeup: sched_setattr");
			kill(busy, SIGKILL);
			return 1;
		}
	}
	int ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN };
	if (socket_wake)
		epoll_ctl(ep, EPOLL_CTL_ADD, rx, &ev);
	usleep(100000);            /* the busy task is running */
	uint64_t end = now() + MEASURE_NS, worst = 0, woke_late = 0, wakes = 0;
	char buf[2048];
	while (now() < end) {
		uint64_t cause;
		if (socket_wake) {
			if (epoll_wait(ep, &ev, 1, 100) <= 0)
				continue;
			cause = *sent_at;
			while (recv(rx, buf, sizeof buf, 0) > 0)
				;
		} else {
			struct timespec ts = { 0, (long)period_us * 1000 };
			uint64_t t0 = now();
			nanosleep(&ts, NULL);
			cause = t0 + (uint64_t)period_us * 1000u;
		}
		uint64_t late = now() > cause ? now() - cause : 0;
		wakes++;
		woke_late += late > LATE_NS;
		if (late > worst)
			worst = late;
		spin_until(now() + (uint64_t)work_us * 1000u);
	}
	kill(busy, SIGKILL);
	waitpid(busy, NULL, 0);
	printf("wake %s every %d us, work %d us, nice %d, slice %d us (0: default): %llu of %llu "
	       "wake-ups waited > 0.5 ms for the core, longest %.2f ms\n",
	       socket_wake ? "socket" : "timer", period_us, work_us, nice_v, slice_us,
	       (unsigned long long)woke_late, (unsigned long long)wakes, worst / 1e6);
	return 0;
}
