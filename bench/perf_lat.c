/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf lat: latency of one outstanding READ or WRITE, perftest ib_*_lat style
 * (docs/runtime-notes.md §7.3), in microseconds. Two methods (-m pingpong|completion):
 *
 * - ping-pong (default for WRITE), ib_write_lat's method: each side owns an initiator endpoint
 *   into the other (one per direction) and a buffer split into a send half and a receive half.
 *   The client WRITEs `size` bytes whose last byte carries the exchange's value into the
 *   server's receive half and waits for its completion; the server spins on the last byte of
 *   its receive half until that value appears and WRITEs back the same way; the client spins
 *   on its own receive half, and so on. The client stamps the clock before each post: n
 *   exchanges give n-1 round trips; the two largest are dropped (as perftest does) and every
 *   figure is a round trip / 2 (typical = the median). No separate warm-up, as ib_write_lat.
 * - completion (always for READ, as ib_read_lat; `-m write -m completion` for WRITE):
 *   post -> completion of one op, after 16 untimed ops.
 *
 * While a side waits (for a completion, a byte or an out-of-band message) it drives its
 * provider (kvx_xport_progress() where the provider needs it: tcp). It spins, and after
 * PX_SPIN_NS without news yields the CPU each round (at once when both sides share one CPU),
 * so two busy sides on fewer CPUs than threads still progress.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "perf.h"
#include "perf_util.h"
#include "perf_xport.h"

#define RESULT_LINE "---------------------------------------------------------------------------------------\n"
#define PX_SPIN_NS 200000ull         /* spin this long without news before yielding */
#define PX_PEER_WAIT_NS 30000000000ull /* give up on a peer silent this long */
#define PX_LAT_TAIL 2                /* ping-pong: largest round trips dropped (ib_write_lat) */

void px_lat_header(const struct px_cfg *c)
{
	if (c->output_bw)
		return;
	printf(RESULT_LINE);
	px_row(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
	       "t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec] \n");
}

/*
 * Timestamps of the timed loops: the TSC where there is one (as perftest's get_cycles()), so
 * stamping costs no syscall even where clock_gettime() has no vDSO (hpet in a TCG VM), scaled
 * to ns by the CLOCK_MONOTONIC time of the whole run (px_clock_begin/end); elsewhere ns.
 */
struct px_clock {
	uint64_t ns0, c0;
	double ns_per_tick;
};

static inline uint64_t px_ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
	return __rdtsc();
#else
	return kvx_now_ns();
#endif
}

static void px_clock_begin(struct px_clock *k)
{
	k->ns0 = kvx_now_ns();
	k->c0 = px_ticks();
	k->ns_per_tick = 1;
}

/* 0, or -ERANGE if the ticks did not advance with the clock (then no rate can be trusted). */
static int px_clock_end(struct px_clock *k)
{
	uint64_t c1 = px_ticks(), ns1 = kvx_now_ns();
	if (c1 <= k->c0 || ns1 <= k->ns0) {
		fprintf(stderr, "kvxfer-perf lat: the cycle counter did not advance (%llu -> %llu) "
				"over %llu ns\n", (unsigned long long)k->c0, (unsigned long long)c1,
			(unsigned long long)(ns1 - k->ns0));
		return -ERANGE;
	}
	k->ns_per_tick = (double)(ns1 - k->ns0) / (double)(c1 - k->c0);
	return 0;
}

/*
 * Clock check of a wait loop, every (mask + 1) rounds (a clock read is a syscall where the
 * clocksource has no vDSO, e.g. hpet in a TCG VM); *yield when the caller should yield now.
 */
struct px_waiter {
	uint64_t rounds, since, mask;
	bool same_cpu;
	bool no_deadline; /* the provider's op timeout bounds this wait instead */
};

static int waiter_tick(struct px_waiter *w, bool *yield)
{
	*yield = false;
	if ((++w->rounds & w->mask) != 0)
		return 0;
	uint64_t now = kvx_now_ns();
	if (!w->since) {
		w->since = now;
		return 0;
	}
	*yield = w->same_cpu || now - w->since > PX_SPIN_NS;
	return !w->no_deadline && now - w->since > PX_PEER_WAIT_NS ? -ETIMEDOUT : 0;
}

static bool oob_readable(int fd)
{
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	return poll(&pf, 1, 0) > 0;
}

int px_oob_wait(struct px_sess *s, uint64_t timeout_ns)
{
	struct pollfd pf = {.fd = s->fd, .events = POLLIN};
	uint64_t t0 = kvx_now_ns();
	for (;;) {
		int busy = s->caps.needs_progress ? kvx_xport_progress(s->ctx) : 0;
		int r = poll(&pf, 1, busy ? 0 : s->caps.needs_progress ? 1 : 100);
		if (r > 0)
			return 0; /* readable, or hung up: the receive reports which */
		if (r < 0 && errno != EINTR)
			return -errno;
		if (timeout_ns && kvx_now_ns() - t0 > timeout_ns)
			return -ETIMEDOUT;
	}
}

/*
 * Spin until the byte at @p off of this side's buffer holds @p v (the peer's WRITE landed),
 * driving the provider. Returns 0, 1 if @p stop_fd (>= 0) became readable first (checked only
 * once the wait has gone on for PX_SPIN_NS), or -ETIMEDOUT.
 */
static int wait_byte(struct px_sess *s, uint64_t off, uint8_t v, int stop_fd)
{
	/* A round is one load (plus the provider's progress where it needs it): check the clock
	 * rarely. */
	struct px_waiter w = {.same_cpu = s->same_cpu, .mask = s->caps.needs_progress ? 63 : 1023};
	const uint8_t *p = &s->buf[off];
	for (;;) {
		if (__atomic_load_n(p, __ATOMIC_ACQUIRE) == v)
			return 0;
		if (s->caps.needs_progress)
			kvx_xport_progress(s->ctx);
		bool yield;
		int rc = waiter_tick(&w, &yield);
		if (rc)
			return rc;
		if (yield) {
			if (stop_fd >= 0 && oob_readable(stop_fd))
				return 1;
			sched_yield();
		}
	}
}

/* Poll this side's initiator endpoint until the completion of @p cookie. 0 or its error. */
static int wait_cpl(struct px_sess *s, uint64_t cookie)
{
	struct px_waiter w = {.same_cpu = s->same_cpu, .mask = 63, .no_deadline = true};
	struct kvx_xport_cpl cpl;
	for (;;) {
		if (kvx_xport_poll_burst(s->ep, &cpl, 1) == 1)
			return cpl.status ? cpl.status : cpl.cookie == cookie ? 0 : -EPROTO;
		if (s->caps.needs_progress)
			kvx_xport_progress(s->ctx);
		bool yield;
		waiter_tick(&w, &yield);
		if (yield)
			sched_yield();
	}
}

/* One ping-pong WRITE of @p size bytes whose last byte is @p v, to completion. */
static int pp_write(struct px_sess *s, uint64_t size, uint8_t v, uint64_t cookie)
{
	struct kvx_xport_op op = {.lmr = s->lmr, .rmr = s->rmr, .loff = 0, .roff = s->rx_off,
				  .len = size};
	s->buf[size - 1] = v;
	int rc = kvx_xport_post_bulk(s->ep, KVX_XPORT_OP_WRITE, &op, 1, cookie);
	return rc ? rc : wait_cpl(s, cookie);
}

/* Value carried by exchange @p i: 1..255, never the 0 a barrier resets the byte to. */
static uint8_t pp_value(uint64_t i)
{
	return (uint8_t)(i % 255 + 1);
}

int px_pong_run(struct px_sess *s, uint64_t size, uint64_t iters)
{
	for (uint64_t i = 0; !iters || i < iters; i++) {
		int rc = wait_byte(s, s->rx_off + size - 1, pp_value(i), s->fd);
		if (rc == 1)
			return 0; /* PX_PING_END: the client stopped (duration, or gave up) */
		if (rc) {
			fprintf(stderr, "kvxfer-perf server: ping %llu of %llu bytes: %s\n",
				(unsigned long long)i, (unsigned long long)size, kvx_strerror(rc));
			return rc;
		}
		if ((rc = pp_write(s, size, pp_value(i), i))) {
			fprintf(stderr, "kvxfer-perf server: pong WRITE: %s\n", kvx_strerror(rc));
			return rc;
		}
	}
	return 0;
}

/*
 * Client side of one size: PX_PING barrier, exchanges, PX_PING_END barrier. Stamps t[i]
 * before post i; *n_out = exchanges done.
 */
static int ping_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, uint64_t *t,
		    uint64_t cap, uint64_t *n_out, struct px_clock *clk)
{
	struct px_msg *m = calloc(1, sizeof(*m));
	uint64_t iters = c->duration_s > 0 ? 0 : (c->iters ? c->iters : 1000);
	int rc, run_rc = 0;
	*n_out = 0;
	if (!m)
		return -ENOMEM;
	/* Nothing is in flight: reset the byte this side polls, then the server resets its own. */
	__atomic_store_n(&s->buf[s->rx_off + size - 1], 0, __ATOMIC_RELEASE);
	m->type = PX_PING;
	m->size = size;
	m->iters = iters;
	if ((rc = px_msg_send(s->fd, m)) || (rc = px_oob_wait(s, PX_PEER_WAIT_NS)) ||
	    (rc = px_msg_recv(s->fd, m, PX_PING)) || (rc = m->rc))
		goto out;
	uint64_t end_ns = iters ? 0 : kvx_now_ns() + (uint64_t)(c->duration_s * 1e9);
	uint64_t n = 0;
	px_clock_begin(clk);
	for (;;) {
		/* -D: at least PX_LAT_TAIL + 2 exchanges, so one round trip is left to report. */
		if (iters ? n == iters : n == cap || (n >= PX_LAT_TAIL + 2 && kvx_now_ns() >= end_ns))
			break;
		uint8_t v = pp_value(n);
		t[n] = px_ticks();
		if ((run_rc = pp_write(s, size, v, n))) {
			fprintf(stderr, "kvxfer-perf lat: ping WRITE: %s\n", kvx_strerror(run_rc));
			break;
		}
		n++;
		if ((run_rc = wait_byte(s, s->rx_off + size - 1, v, -1))) {
			fprintf(stderr, "kvxfer-perf lat: pong %llu of %llu bytes: %s\n",
				(unsigned long long)n - 1, (unsigned long long)size,
				kvx_strerror(run_rc));
			break;
		}
	}
	*n_out = n;
	if (!run_rc)
		run_rc = px_clock_end(clk);
	m->type = PX_PING_END;
	if ((rc = px_msg_send(s->fd, m)) || (rc = px_oob_wait(s, PX_PEER_WAIT_NS)) ||
	    (rc = px_msg_recv(s->fd, m, PX_PING_END)))
		goto out;
	if (m->rc)
		fprintf(stderr, "kvxfer-perf lat: server: %s\n", kvx_strerror(m->rc));
	rc = run_rc ? run_rc : m->rc;
out:
	if (rc && !run_rc && rc != m->rc)
		fprintf(stderr, "kvxfer-perf lat: ping-pong barrier: %s\n", kvx_strerror(rc));
	free(m);
	return rc;
}

/* Post -> completion of one op per sample, after 16 untimed ops. */
static int completion_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, uint64_t *t,
			  uint64_t cap, uint64_t *n_out, struct px_clock *clk)
{
	uint64_t iters = c->iters ? c->iters : 1000;
	struct kvx_xport_op op = {.lmr = s->lmr, .rmr = s->rmr, .loff = 0, .roff = 0, .len = size};
	struct kvx_xport_cpl cpl;
	uint64_t warm = 16, n = 0;
	uint64_t end_ns = c->duration_s > 0 ? kvx_now_ns() + (uint64_t)(c->duration_s * 1e9) : 0;
	*n_out = 0;
	px_clock_begin(clk);
	for (uint64_t i = 0;; i++) {
		/* -D stops only once at least one timed sample exists (min/avg/percentiles
		 * of zero samples are undefined). */
		if (end_ns ? (n && kvx_now_ns() >= end_ns) || n == cap : n == iters)
			break;
		uint64_t t0 = px_ticks();
		int rc = kvx_xport_post_bulk(s->ep, c->mode, &op, 1, i);
		if (rc) {
			fprintf(stderr, "kvxfer-perf lat: post: %s\n", kvx_strerror(rc));
			return rc;
		}
		while (kvx_xport_poll_burst(s->ep, &cpl, 1) == 0)
			;
		uint64_t t1 = px_ticks();
		if (cpl.status) {
			fprintf(stderr, "kvxfer-perf lat: op failed: %s\n", kvx_strerror(cpl.status));
			return cpl.status;
		}
		if (i >= warm)
			t[n++] = t1 - t0;
	}
	*n_out = n;
	return px_clock_end(clk);
}

/* Median of sorted samples (mean of the middle two for an even count). */
static double median_sorted(const uint64_t *v, uint64_t n)
{
	return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

int px_lat_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, FILE *json, bool first)
{
	bool pp = c->lat_method == PX_LAT_PINGPONG;
	uint64_t iters = c->iters ? c->iters : 1000;
	uint64_t cap = c->duration_s > 0 ? 10000000 : iters;
	uint64_t *t = malloc(cap * sizeof(*t));
	uint64_t n = 0, exchanges = 0;
	if (!t)
		return -ENOMEM;
	struct px_clock clk;
	int rc = pp ? ping_run(c, s, size, t, cap, &exchanges, &clk)
		    : completion_run(c, s, size, t, cap, &n, &clk);
	if (rc) {
		free(t);
		return rc;
	}
	double div = 1; /* ns per reported ns */
	if (pp) {
		/* Round trips between consecutive posts; the largest PX_LAT_TAIL are dropped. */
		for (uint64_t i = 0; i + 1 < exchanges; i++)
			t[i] = t[i + 1] - t[i];
		n = exchanges - 1;
		div = 2;
	}
	perf_sort_u64(t, n);
	if (pp)
		n -= PX_LAT_TAIL;
	double sum = 0, sq = 0;
	for (uint64_t i = 0; i < n; i++)
		sum += (double)t[i];
	double avg = sum / (double)n;
	for (uint64_t i = 0; i < n; i++)
		sq += ((double)t[i] - avg) * ((double)t[i] - avg);
	double k = clk.ns_per_tick * 1e-3 / div; /* ticks -> us, and round trip -> one way */
	double sd = sqrt(sq / (double)n) * k;
	double mn = (double)t[0] * k, mx = (double)t[n - 1] * k;
	double typ = median_sorted(t, n) * k;
	double p99 = (double)perf_percentile_u64(t, n, 99.0) * k;
	double p999 = (double)perf_percentile_u64(t, n, 99.9) * k;
	uint64_t shown = pp ? exchanges : n;
	avg *= k;
	if (c->output_bw)
		px_row("%lf\n", typ);
	else
		px_row(" %-7llu %-10llu      %-7.2f        %-7.2f      %-7.2f          %-7.2f        "
		       "%-7.2f          %-7.2f                 %-7.2f\n",
		       (unsigned long long)size, (unsigned long long)shown, mn, mx, typ, avg, sd, p99,
		       p999);
	if (json)
		fprintf(json,
			"%s    {\"bytes\": %llu, \"iterations\": %llu, \"samples\": %llu, "
			"\"t_min_us\": %.3f, \"t_max_us\": %.3f, \"t_typical_us\": %.3f, "
			"\"t_avg_us\": %.3f, \"t_stdev_us\": %.3f, \"p99_us\": %.3f, \"p99_9_us\": %.3f}",
			first ? "" : ",\n", (unsigned long long)size, (unsigned long long)shown,
			(unsigned long long)n, mn, mx, typ, avg, sd, p99, p999);
	free(t);
	return 0;
}

static int check_size(const char *sub, const char *opt, const char *v, uint64_t lo, uint64_t hi,
		      const char *what)
{
	uint64_t x;
	if (perf_parse_size(v, &x) || x < lo || x > hi) {
		fprintf(stderr, "kvxfer-perf %s: %s '%s': expected %s\n", sub, opt, v, what);
		return 2;
	}
	return 0;
}

static int check_lcores(const char *sub, const char *v)
{
	char *end, err[256] = "";
	long cpu[2] = {-1, -1};
	int n = 0;
	const char *p = v;
	for (;;) {
		if (*p < '0' || *p > '9')
			goto bad;
		errno = 0;
		cpu[n++] = strtol(p, &end, 10);
		if (errno)
			goto bad;
		if (*end == '\0')
			break;
		if (n == 2 || (*end != ',' && *end != '-'))
			goto bad;
		p = end + 1;
	}
	for (int i = 0; i < n; i++) {
		if (cpu[i] >= CPU_SETSIZE) {
			fprintf(stderr, "kvxfer-perf %s: -l '%s': CPU %ld does not exist on this host\n",
				sub, v, cpu[i]);
			return 2;
		}
		if (perf_check_cpu(cpu[i], err, sizeof(err))) {
			fprintf(stderr, "kvxfer-perf %s: -l '%s': %s\n", sub, v, err);
			return 2;
		}
	}
	return 0;
bad:
	fprintf(stderr, "kvxfer-perf %s: -l '%s': expected CPU or CPU,CPU\n", sub, v);
	return 2;
}

int px_check_args(int argc, char **argv, bool lat)
{
	/* perf_px_opts: the table px_main's parser (perf_bw.c) uses, so both agree on values. */
	const char *sub = lat ? "lat" : "bw";
	int o, rc = 0, saved_opterr = opterr;
	opterr = 0; /* unknown options are px_main's to report */
	optind = 0;
	while (!rc && (o = getopt_long(argc, argv, PERF_PX_SHORTOPTS, perf_px_opts, NULL)) != -1) {
		switch (o) {
		case 's':
			rc = check_size(sub, "-s", optarg, 1, 1ull << 30, "1 .. 1G bytes");
			break;
		case 'n':
			rc = check_size(sub, "-n", optarg, 5, UINT64_MAX / 2,
					"a positive iteration count >= 5");
			break;
		case PERF_PX_O_CHUNK:
			rc = check_size(sub, "--chunk", optarg, 4096, 16u << 20, "4K..16M");
			break;
		case 'l':
			rc = check_lcores(sub, optarg);
			break;
		default:
			break;
		}
	}
	opterr = saved_opterr;
	optind = 0;
	return rc;
}

int kvx_perf_lat_main(int argc, char **argv)
{
	int rc = px_check_args(argc, argv, true);
	return rc ? rc : px_main(argc, argv, true);
}
