/* SPDX-License-Identifier: Apache-2.0 */
/* Engine API: parameter validation, layer registration, and fault scenarios with two real
 * engines (producer and consumer) in one process talking over loopback (real libzmq sockets,
 * real tcp provider): duplicate transfer ids (j), prefix-cache full hit in READ mode (c), a
 * producer that never answers (d), a consumer abort with the producer's writes pending (e),
 * and stop() ending live transfers. */
#include <errno.h>
#include <string.h>
#ifdef KVX_TSAN_RUNNER /* TSan build: Criterion cannot start (tests/lcore/tsan_runner.h) */
#include "tests/lcore/tsan_runner.h"
#define cr_assert_str_eq(a, b, ...) KVX_TSAN_CHECK(!strcmp((a), (b)), #a " == " #b)
#else
#include <criterion/criterion.h>
#endif
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "runtime/runtime_internal.h"
#include "tests/runtime/pipe_io.h"

TestSuite(runtime_engine, .timeout = 60.0);

#define NB 16
#define NL 2

struct eng {
	struct kvx_engine *e;
	uint8_t *mem[NL];
	uint16_t hs, nt;
};

static struct kvx_layout_tensor mla_tensor(void)
{
	return (struct kvx_layout_tensor){.ndim = 3, .shape = {NB, 4, 16}, .stride = {64, 16, 1}, .elem_size = 2};
}

static void params(struct kvx_engine_params *p, enum kvx_sched_role role, enum kvx_sched_mode mode)
{
	kvx_engine_params_init(p);
	p->role = role;
	p->mode = mode;
	p->transport = "tcp";
	p->handshake_port = 0;
	p->notify_port = 0;
	p->max_transfers = 8;
	p->max_blocks = NB;
}

static void eng_start(struct eng *g, const struct kvx_engine_params *p, uint8_t fill)
{
	char err[256] = "";
	cr_assert_eq(kvx_engine_create(p, &g->e, err, sizeof(err)), 0, "%s", err);
	for (int i = 0; i < NL; i++) {
		g->mem[i] = malloc(NB * 4 * 16 * 2);
		cr_assert_not_null(g->mem[i]);
		memset(g->mem[i], fill, NB * 4 * 16 * 2);
		char name[8];
		snprintf(name, sizeof(name), "l%d", i);
		struct kvx_engine_layer l = {.name = name, .base = g->mem[i], .tensor = mla_tensor(),
					     .spec = {.block_size = 4, .is_mla = true}};
		cr_assert_eq(kvx_engine_register_layer(g->e, &l), i);
	}
	cr_assert_eq(kvx_engine_start(g->e), 0);
	cr_assert_eq(kvx_engine_ports(g->e, &g->hs, &g->nt), 0);
}

static void eng_free(struct eng *g)
{
	kvx_engine_destroy(g->e);
	for (int i = 0; i < NL; i++)
		free(g->mem[i]);
}

/* Collect completions of one engine until pred is met or the deadline passes. */
struct seen {
	int transfer;  /* -1 none, else enum kvx_cpl_status */
	int released;  /* count of BLOCKS_RELEASED */
	int error;
	uint64_t at_ns;
};

static void pump(struct kvx_engine *e, const char *tid, struct seen *s)
{
	struct kvx_completion c[8];
	size_t n = kvx_engine_poll_completions(e, c, 8);
	for (size_t i = 0; i < n; i++) {
		cr_assert_str_eq(c[i].transfer_id, tid, "unexpected completion for %s", c[i].transfer_id);
		if (c[i].kind == KVX_CPL_TRANSFER) {
			cr_assert_eq(s->transfer, -1, "two terminal completions for %s", tid);
			s->transfer = (int)c[i].status;
			s->error = c[i].error;
			s->at_ns = kvx_now_ns();
		} else {
			s->released++;
		}
	}
}

static bool wait_for(struct kvx_engine *e, const char *tid, struct seen *s, bool want_release, uint64_t timeout_ns)
{
	uint64_t end = kvx_now_ns() + timeout_ns;
	while (kvx_now_ns() < end) {
		pump(e, tid, s);
		if (s->transfer >= 0 && (!want_release || s->released))
			return true;
		usleep(200); /* application polling cadence; the condition is the completion */
	}
	return false;
}

Test(runtime_engine, create_rejects_bad_fields_with_message)
{
	struct kvx_engine_params p;
	struct kvx_engine *e = NULL;
	char err[256];
	struct {
		const char *field;
		void (*set)(struct kvx_engine_params *);
	} cases[] = {
		{"dp_rank", NULL}, {"tp_size", NULL}, {"transport", NULL}, {"transfer_timeout_ms", NULL}, {"host", NULL},
		{"control_busy_poll_us", NULL}, {"poller_slice_us", NULL}, {"poller_slice_us", NULL},
	};
	for (size_t i = 0; i < KVX_ARRAY_SIZE(cases); i++) {
		params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
		if (i == 0)
			p.dp_rank = 1;
		else if (i == 1)
			p.tp_size = 0;
		else if (i == 2)
			p.transport = "carrier-pigeon";
		else if (i == 3)
			p.transfer_timeout_ms = 0;
		else if (i == 4)
			p.host = NULL;
		else if (i == 5)
			p.control_busy_poll_us = 1000001;
		else if (i == 6)
			p.poller_slice_us = 99; /* the kernel's shortest slice is 100 us */
		else
			p.poller_slice_us = 100001;
		err[0] = 0;
		cr_assert_eq(kvx_engine_create(&p, &e, err, sizeof(err)), -EINVAL, "case %s", cases[i].field);
		cr_assert(strstr(err, cases[i].field), "message '%s' does not name %s", err, cases[i].field);
	}
	params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	p.role = (enum kvx_sched_role)7;
	cr_assert_eq(kvx_engine_create(&p, &e, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "role"));
}

Test(runtime_engine, register_layer_errors)
{
	struct kvx_engine_params p;
	params(&p, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	struct kvx_engine *e;
	cr_assert_eq(kvx_engine_create(&p, &e, NULL, 0), 0);
	static uint8_t mem[NB * 4 * 16 * 2];
	struct kvx_engine_layer l = {.name = "a", .base = mem, .tensor = mla_tensor(),
				     .spec = {.block_size = 4, .is_mla = true}};
	cr_assert_eq(kvx_engine_register_layer(e, &l), 0);
	cr_assert_eq(kvx_engine_register_layer(e, &l), -EINVAL); /* duplicate name */
	l.name = "b";
	l.tensor.shape[0] = NB / 2; /* num_blocks differs from layer a */
	cr_assert_eq(kvx_engine_register_layer(e, &l), -EINVAL);
	l.tensor = (struct kvx_layout_tensor){.ndim = 4, .shape = {8, 4, 2, 3}, .stride = {24, 6, 3, 1}, .elem_size = 2};
	l.spec.is_mla = false;
	cr_assert_eq(kvx_engine_register_layer(e, &l), -EINVAL); /* unsupported shape */
	l.base = NULL;
	cr_assert_eq(kvx_engine_register_layer(e, &l), -EINVAL);
	struct kvx_engine_serve sv = {.transfer_id = "tx", .local_blocks = (uint32_t[]){1}, .n = 1};
	cr_assert_eq(kvx_xfer_serve(e, &sv), -EBUSY); /* not started */
	kvx_engine_destroy(e);
}

Test(runtime_engine, j_duplicate_transfer_id_rejected_first_completes)
{
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	eng_start(&P, &pp, 0x5a);
	eng_start(&D, &dp, 0);
	const uint32_t pb[2] = {1, 2}, db[2] = {9, 3};
	struct kvx_engine_serve sv = {.transfer_id = "tx-dup", .local_blocks = pb, .n = 2};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), -EEXIST);
	struct kvx_engine_read r = {.transfer_id = "tx-dup",
				    .peer = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt},
				    .local_blocks = db,
				    .remote_blocks = pb,
				    .n = 2};
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	const uint32_t other[2] = {4, 5};
	r.local_blocks = other;
	cr_assert_eq(kvx_xfer_read(D.e, &r), -EEXIST);
	struct seen sd = {.transfer = -1}, sp = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-dup", &sd, false, 20000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_DONE);
	cr_assert(wait_for(P.e, "tx-dup", &sp, true, 20000000000ull));
	cr_assert_eq(sp.transfer, KVX_CPL_DONE);
	for (int l = 0; l < NL; l++) {
		for (int b = 0; b < NB; b++) {
			uint8_t want = (b == 9 || b == 3) ? 0x5a : 0;
			for (int k = 0; k < 128; k++)
				cr_assert_eq(D.mem[l][b * 128 + k], want, "layer %d block %d", l, b);
		}
	}
	/* The id stays used after completion (one-shot). */
	r.local_blocks = db;
	cr_assert_eq(kvx_xfer_read(D.e, &r), -EEXIST);
	struct kvx_engine_stats st;
	kvx_engine_get_stats(D.e, &st);
	cr_assert_eq(st.duplicates_rejected, 2);
	cr_assert_eq(st.transfers_done, 1);
	eng_free(&D);
	eng_free(&P);
}

Test(runtime_engine, c_full_hit_read_releases_producer_without_rdma)
{
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	pp.defer_timeout_ms = 60000;
	eng_start(&P, &pp, 0x11);
	eng_start(&D, &dp, 0);
	struct kvx_engine_serve sv = {.transfer_id = "tx-hit", .local_blocks = (uint32_t[]){1, 2, 3}, .n = 3};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	struct kvx_engine_read r = {.transfer_id = "tx-hit",
				    .peer = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt},
				    .n = 0};
	uint64_t t0 = kvx_now_ns();
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen sd = {.transfer = -1}, sp = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-hit", &sd, false, 20000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_DONE);
	cr_assert(wait_for(P.e, "tx-hit", &sp, true, 20000000000ull));
	cr_assert_eq(sp.transfer, KVX_CPL_DONE);
	cr_assert_eq(sp.released, 1);
	cr_assert_lt(sp.at_ns - t0, 30000000000ull, "freed by release, not by the 60 s defer timeout");
	struct kvx_engine_stats a, b;
	kvx_engine_get_stats(D.e, &a);
	kvx_engine_get_stats(P.e, &b);
	cr_assert_eq(a.lcores[0].ops, 0, "no RDMA posted");
	cr_assert_eq(a.lcores[0].bytes, 0);
	cr_assert_eq(b.lcores[0].ops, 0);
	for (int l = 0; l < NL; l++)
		for (int k = 0; k < NB * 128; k++)
			cr_assert_eq(D.mem[l][k], 0);
	eng_free(&D);
	eng_free(&P);
}

/* A TCP port on loopback that accepts connections but never speaks (a silent producer): the
 * handshake never completes. Returns the listening socket (the test closes it); *port is its
 * number. */
static int silent_listener(uint16_t *port)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(ls, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(ls, 8), 0);
	socklen_t al = sizeof(a);
	cr_assert_eq(getsockname(ls, (struct sockaddr *)&a, &al), 0);
	*port = ntohs(a.sin_port);
	return ls;
}

/* Consumer D (READ, poller idle policy @p idle) facing a silent producer: transfer timeout
 * 300 ms. The handshake deadline (3 s) is far behind the transfer's, so that a poller stalled
 * on a loaded machine still sees the transfer's deadline first. */
static void silent_consumer_start(struct eng *D, enum kvx_engine_idle idle)
{
	struct kvx_engine_params dp;
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	dp.idle = idle;
	dp.transfer_timeout_ms = 300;
	dp.handshake_timeout_ms = 3000;
	eng_start(D, &dp, 0);
}

/* A READ of block 1 into block 1 as @p tid from the silent producer on @p port. */
static struct kvx_engine_read silent_read(const char *tid, uint16_t port)
{
	static const uint32_t one[1] = {1};
	return (struct kvx_engine_read){.transfer_id = tid,
					.peer = {.host = "127.0.0.1", .handshake_port = port, .notify_port = port},
					.local_blocks = one,
					.remote_blocks = one,
					.n = 1};
}

Test(runtime_engine, d_silent_producer_times_out_and_sends_nothing)
{
	uint16_t port;
	int ls = silent_listener(&port);
	struct eng D;
	silent_consumer_start(&D, KVX_ENGINE_IDLE_ADAPTIVE);
	struct kvx_engine_read r = silent_read("tx-silent", port);
	uint64_t t0 = kvx_now_ns();
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen s = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-silent", &s, true, 20000000000ull));
	cr_assert_eq(s.transfer, KVX_CPL_TIMED_OUT);
	cr_assert_eq(s.error, -ETIMEDOUT);
	uint64_t took = s.at_ns - t0;
	cr_assert_geq(took, 300000000ull, "reported before the transfer timeout (%llu ns)", (unsigned long long)took);
	cr_assert_lt(took, 60000000000ull, "hung: reported %llu ns after start", (unsigned long long)took);
	cr_assert_eq(kvx_xfer_layer_poll(D.e, "tx-silent", 0), -ETIMEDOUT);
	/* Past the handshake deadline too: still no notification sent, no further completion. */
	uint64_t end = t0 + 4000000000ull;
	while (kvx_now_ns() < end) {
		pump(D.e, "tx-silent", &s);
		usleep(1000);
	}
	struct kvx_engine_stats st;
	kvx_engine_get_stats(D.e, &st);
	cr_assert_eq(st.notifications_sent, 0);
	cr_assert_eq(st.transfers_timed_out, 1);
	cr_assert_eq(s.released, 1);
	eng_free(&D);
	close(ls);
}

/* Every polling lcore thread of this process (named "kvx-lcore-N", lcore/lcore.c) is blocked
 * ('S' in /proc/self/task/TID/stat; a poll loop blocks only in its idle sleep). Counts them. */
static bool pollers_blocked(unsigned *n_out)
{
	DIR *d = opendir("/proc/self/task");
	cr_assert_not_null(d);
	bool all = true;
	unsigned n = 0;
	for (struct dirent *de; (de = readdir(d));) {
		if (de->d_name[0] == '.')
			continue;
		char path[64], buf[512];
		snprintf(path, sizeof(path), "/proc/self/task/%d/stat", atoi(de->d_name));
		FILE *f = fopen(path, "re");
		if (!f)
			continue; /* a thread that just exited */
		size_t len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[len] = '\0';
		const char *l = strchr(buf, '('), *r = strrchr(buf, ')');
		if (!l || !r || strncmp(l + 1, "kvx-lcore-", 10))
			continue;
		n++;
		all &= r[2] == 'S';
	}
	closedir(d);
	*n_out = n;
	return all && n;
}

static bool pollers_blocked_within(uint64_t timeout_ns, unsigned *n)
{
	uint64_t end = kvx_now_ns() + timeout_ns;
	while (!pollers_blocked(n)) {
		if (kvx_now_ns() >= end)
			return false;
		usleep(1000);
	}
	return true;
}

static void poller_sleeps(struct kvx_engine *e, uint64_t *sleeps, uint64_t *wakeups)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	*sleeps = *wakeups = 0;
	for (uint32_t i = 0; i < st.n_lcores; i++) {
		*sleeps += st.lcores[i].sleeps;
		*wakeups += st.lcores[i].wakeups;
	}
}

Test(runtime_engine, idle_pollers_make_no_wakeup_until_a_submission)
{
	uint16_t port;
	int ls = silent_listener(&port); /* a producer that never speaks (as in d) */
	struct eng D;
	silent_consumer_start(&D, KVX_ENGINE_IDLE_ADAPTIVE);
	unsigned n;
	cr_assert(pollers_blocked_within(20000000000ull, &n), "the idle pollers never went to sleep");
	struct kvx_engine_stats st;
	kvx_engine_get_stats(D.e, &st);
	cr_assert_eq(n, st.n_lcores, "one blocked thread per polling lcore");
	uint64_t s0, w0, s1, w1;
	poller_sleeps(D.e, &s0, &w0);
	/* An observation window for the absence of wake-ups (nothing waits on it). No sleep cap,
	 * no deadline to scan: an idle poller's sleep never ends by itself. */
	usleep(1500000);
	poller_sleeps(D.e, &s1, &w1);
	cr_assert_eq(s1, s0, "%llu sleeps of idle pollers ended in 1.5 s", (unsigned long long)(s1 - s0));
	cr_assert_eq(w1, w0);
	cr_assert(pollers_blocked(&n));
	/* A submission wakes its poller at once (the submission ring's waiter); the transfer's
	 * deadline is then scanned without any cap on the sleeps (it times out, as in d). */
	struct kvx_engine_read r = silent_read("tx-idle", port);
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen s = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-idle", &s, true, 20000000000ull));
	cr_assert_eq(s.transfer, KVX_CPL_TIMED_OUT);
	poller_sleeps(D.e, &s1, &w1);
	cr_assert_geq(w1, w0 + 1, "the submission did not end its poller's sleep");
	eng_free(&D);
	close(ls);
}

Test(runtime_engine, busy_pollers_scan_deadlines_silent_producer_times_out)
{
	/* --idle busy: the pollers never sleep; the deadline scan timer still runs in their loop. */
	uint16_t port;
	int ls = silent_listener(&port);
	struct eng D;
	silent_consumer_start(&D, KVX_ENGINE_IDLE_BUSY);
	struct kvx_engine_read r = silent_read("tx-busy", port);
	uint64_t t0 = kvx_now_ns();
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen s = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-busy", &s, true, 20000000000ull));
	cr_assert_eq(s.transfer, KVX_CPL_TIMED_OUT);
	cr_assert_eq(s.error, -ETIMEDOUT);
	cr_assert_geq(s.at_ns - t0, 300000000ull, "reported before the transfer timeout");
	uint64_t sl, wk;
	poller_sleeps(D.e, &sl, &wk);
	cr_assert_eq(sl, 0, "a busy poller never sleeps");
	eng_free(&D);
	close(ls);
}

Test(runtime_engine, e_consumer_abort_keeps_blocks_until_producer_terminal)
{
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	dp.defer_timeout_ms = 60000;
	eng_start(&P, &pp, 0x77);
	eng_start(&D, &dp, 0);
	struct kvx_engine_announce an = {.transfer_id = "tx-ab",
					 .peer = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt},
					 .local_blocks = (uint32_t[]){4, 5},
					 .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	cr_assert_eq(kvx_xfer_abort(D.e, "tx-ab"), 0);
	struct seen sd = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-ab", &sd, false, 20000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_ABORTED);
	/* The producer may still write (it has the allocation): the blocks stay quarantined. */
	uint64_t end = kvx_now_ns() + 200000000ull;
	while (kvx_now_ns() < end) {
		pump(D.e, "tx-ab", &sd);
		cr_assert_eq(sd.released, 0, "blocks released while the producer could still write");
		usleep(1000);
	}
	/* The producer now begins: it sees the release, writes nothing, and says so. */
	struct kvx_engine_write w = {.transfer_id = "tx-ab",
				     .peer = {.host = "127.0.0.1", .handshake_port = D.hs, .notify_port = D.nt},
				     .local_blocks = (uint32_t[]){1, 2},
				     .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	struct seen sp = {.transfer = -1};
	cr_assert(wait_for(P.e, "tx-ab", &sp, true, 20000000000ull));
	cr_assert_eq(sp.transfer, KVX_CPL_ABORTED);
	cr_assert(wait_for(D.e, "tx-ab", &sd, true, 20000000000ull));
	cr_assert_eq(sd.released, 1);
	for (int l = 0; l < NL; l++)
		for (int k = 0; k < NB * 128; k++)
			cr_assert_eq(D.mem[l][k], 0, "no byte written after the abort");
	eng_free(&D);
	eng_free(&P);
}

Test(runtime_engine, stop_ends_live_transfers_aborted)
{
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	eng_start(&P, &pp, 0);
	struct kvx_engine_serve sv = {.transfer_id = "tx-live", .local_blocks = (uint32_t[]){1}, .n = 1};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	kvx_engine_stop(P.e);
	struct seen s = {.transfer = -1};
	pump(P.e, "tx-live", &s);
	cr_assert_eq(s.transfer, KVX_CPL_ABORTED);
	cr_assert_eq(s.released, 1);
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), -EBUSY);
	eng_free(&P);
}

Test(runtime_engine, read_fan_in_two_consumer_tp_ranks)
{
	/* P tp 1, D tp 2: both D ranks read from P rank 0 and each sends release with
	 * consumer_tp_size 2; P completes only after both (expected_acks(1, 2) = 2). */
	struct kvx_engine_params pp, d0p, d1p;
	struct eng P, D0, D1;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	params(&d0p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	d0p.tp_size = 2;
	d1p = d0p;
	d1p.tp_rank = 1;
	eng_start(&P, &pp, 0x42);
	eng_start(&D0, &d0p, 0);
	eng_start(&D1, &d1p, 0);
	const uint32_t pb[1] = {6}, db[1] = {2};
	struct kvx_engine_serve sv = {.transfer_id = "tx-fan", .local_blocks = pb, .n = 1, .consumer_tp_size = 2};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	struct kvx_engine_read r = {.transfer_id = "tx-fan",
				    .peer = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt, .tp_size = 1},
				    .local_blocks = db,
				    .remote_blocks = pb,
				    .n = 1};
	cr_assert_eq(kvx_xfer_read(D0.e, &r), 0);
	struct seen s0 = {.transfer = -1}, s1 = {.transfer = -1}, sp = {.transfer = -1};
	cr_assert(wait_for(D0.e, "tx-fan", &s0, false, 20000000000ull));
	cr_assert_eq(s0.transfer, KVX_CPL_DONE);
	/* Give rank 0's release time to land: P must still be serving. */
	uint64_t end = kvx_now_ns() + 300000000ull;
	while (kvx_now_ns() < end) {
		pump(P.e, "tx-fan", &sp);
		cr_assert_eq(sp.transfer, -1, "producer completed after one of two releases");
		usleep(1000);
	}
	cr_assert_eq(kvx_xfer_read(D1.e, &r), 0);
	cr_assert(wait_for(D1.e, "tx-fan", &s1, false, 20000000000ull));
	cr_assert_eq(s1.transfer, KVX_CPL_DONE);
	cr_assert(wait_for(P.e, "tx-fan", &sp, true, 20000000000ull));
	cr_assert_eq(sp.transfer, KVX_CPL_DONE);
	for (int l = 0; l < NL; l++)
		for (int k = 0; k < 128; k++) {
			cr_assert_eq(D0.mem[l][2 * 128 + k], 0x42);
			cr_assert_eq(D1.mem[l][2 * 128 + k], 0x42);
		}
	eng_free(&D1);
	eng_free(&D0);
	eng_free(&P);
}

/* A peer engine in a child process: a real process the test can stop with SIGSTOP, so an
 * operation is provably in flight (the stopped side cannot make progress) without any hook in
 * the engine. Forked before this process starts an engine (no threads yet). */

struct kid {
	pid_t pid;
	int to, from; /* parent's ends of the pipes */
};

/* Fork; the child runs fn(to_parent, from_parent) and exits with its return value. */
static void kid_start(struct kid *k, int (*fn)(int wr, int rd))
{
	int a[2], b[2];
	cr_assert_eq(pipe(a), 0);
	cr_assert_eq(pipe(b), 0);
	fflush(NULL);
	k->pid = fork();
	cr_assert_geq(k->pid, 0);
	if (k->pid == 0) {
		close(a[0]);
		close(b[1]);
		_exit(fn(a[1], b[0]));
	}
	close(a[1]);
	close(b[0]);
	k->from = a[0];
	k->to = b[1];
}

/* Stop the child and wait until the kernel reports it stopped (observable state). */
static void kid_stopped(struct kid *k, bool send)
{
	int st = 0;
	if (send)
		cr_assert_eq(kill(k->pid, SIGSTOP), 0);
	cr_assert_eq(waitpid(k->pid, &st, WUNTRACED), k->pid);
	cr_assert(WIFSTOPPED(st), "child not stopped (status 0x%x)", st);
}

static void kid_end(struct kid *k)
{
	int st = 0;
	cr_assert_eq(io_all(k->to, "q", 1, true), 0);
	cr_assert_eq(waitpid(k->pid, &st, 0), k->pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (status 0x%x)", st);
	close(k->to);
	close(k->from);
}

/* Polling lcores "0,1" when this host lets us pin to CPUs 0 and 1, else NULL (skip). */
static const char *two_lcores(void)
{
	cpu_set_t cs;
	if (sched_getaffinity(0, sizeof(cs), &cs) || !CPU_ISSET(0, &cs) || !CPU_ISSET(1, &cs))
		return NULL;
	return "0,1";
}

/* What the fenced consumer child saw. */
struct fence_seen {
	int status, error;
	bool reused; /* a byte of the producer's reused blocks reached the consumer */
	bool old;    /* every byte is the producer's original content */
};

/* Consumer child of f_defer_timeout_fences_reader_before_release: connects with tx-a, then on
 * 'g' submits tx-f and stops itself (SIGSTOP) until the parent's producer has fenced and
 * reused the blocks; reports what its READ delivered. */
static const char *fence_lcores; /* both engines' polling lcores (NULL: the default, one) */

static int fence_consumer(int wr, int rd)
{
	struct kvx_engine_params dp;
	struct eng D;
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	dp.transfer_timeout_ms = 20000;
	dp.lcores = fence_lcores;
	eng_start(&D, &dp, 0);
	uint16_t pt[2];
	char c;
	if (io_all(rd, pt, sizeof(pt), false))
		return 2;
	const uint32_t pa[2] = {1, 2}, da[2] = {7, 8}, pb[2] = {3, 4}, db[2] = {5, 6};
	struct kvx_engine_read r = {.transfer_id = "tx-a",
				    .peer = {.host = "127.0.0.1", .handshake_port = pt[0], .notify_port = pt[1]},
				    .local_blocks = da,
				    .remote_blocks = pa,
				    .n = 2};
	struct seen sa = {.transfer = -1}, sf = {.transfer = -1};
	if (kvx_xfer_read(D.e, &r) || !wait_for(D.e, "tx-a", &sa, false, 20000000000ull) || sa.transfer != KVX_CPL_DONE)
		return 3;
	if (io_all(wr, "a", 1, true) || io_all(rd, &c, 1, false))
		return 4;
	r.transfer_id = "tx-f";
	r.local_blocks = db;
	r.remote_blocks = pb;
	if (kvx_xfer_read(D.e, &r))
		return 5;
	raise(SIGSTOP); /* the parent resumes us once the producer fenced and reused the blocks */
	if (!wait_for(D.e, "tx-f", &sf, false, 20000000000ull))
		return 6;
	struct fence_seen fs = {.status = sf.transfer, .error = sf.error, .old = true};
	for (int l = 0; l < NL; l++)
		for (int k = 0; k < 2 * 128; k++) {
			fs.reused |= D.mem[l][5 * 128 + k] == 0xee;
			fs.old &= D.mem[l][5 * 128 + k] == 0x5a;
		}
	if (io_all(wr, &fs, sizeof(fs), true) || io_all(rd, &c, 1, false))
		return 7;
	eng_free(&D);
	return 0;
}

static void fence_case(const char *lcores)
{
	/* P's defer timeout fires while D's READ is in flight: D (a child process) submitted it and
	 * is stopped (SIGSTOP), so it can neither finish nor release. P must revoke D's access at
	 * the wire before reporting the blocks released; the blocks are then reused (overwritten)
	 * and D, resumed, must never deliver the new contents: its READ either completed from
	 * what P served before the fence (original bytes) or fails with -ESTALE (its endpoint
	 * died; it resumed on a new connection, whose lease lookup found the lease revoked). */
	struct kid k;
	fence_lcores = lcores;
	kid_start(&k, fence_consumer);
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	pp.defer_timeout_ms = 3000;
	pp.lcores = lcores;
	eng_start(&P, &pp, 0x5a);
	/* D reads only what P serves (block leases, issue 14): tx-a is served before D learns the
	 * ports, so its handshake, read and release fall inside P's defer timeout (3 s: far longer
	 * than a loopback handshake and read). */
	const uint32_t pa[2] = {1, 2}, pb[2] = {3, 4};
	struct kvx_engine_serve sv = {.transfer_id = "tx-a", .local_blocks = pa, .n = 2};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	uint16_t pt[2] = {P.hs, P.nt};
	char c;
	cr_assert_eq(io_all(k.to, pt, sizeof(pt), true), 0);
	cr_assert_eq(io_all(k.from, &c, 1, false), 0, "consumer child failed to read tx-a");
	struct seen sa = {.transfer = -1};
	cr_assert(wait_for(P.e, "tx-a", &sa, true, 20000000000ull));
	cr_assert_eq(sa.transfer, KVX_CPL_DONE);
	struct kvx_engine_stats st;
	/* P serves tx-f from now on; D reads it and stops. */
	sv.transfer_id = "tx-f";
	sv.local_blocks = pb;
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	cr_assert_eq(io_all(k.to, "g", 1, true), 0);
	kid_stopped(&k, false);
	/* P: TIMED_OUT, then BLOCKS_RELEASED only after the fence. */
	struct seen sp = {.transfer = -1};
	uint64_t end = kvx_now_ns() + 20000000000ull;
	while (!sp.released && kvx_now_ns() < end) {
		struct kvx_completion cp[4];
		size_t n = kvx_engine_poll_completions(P.e, cp, 4);
		for (size_t i = 0; i < n; i++) {
			cr_assert_str_eq(cp[i].transfer_id, "tx-f");
			kvx_engine_get_stats(P.e, &st);
			if (cp[i].kind == KVX_CPL_TRANSFER) {
				cr_assert_eq(sp.transfer, -1);
				sp.transfer = (int)cp[i].status;
				sp.error = cp[i].error;
			} else {
				cr_assert_eq(sp.transfer, KVX_CPL_TIMED_OUT, "released before the terminal completion");
				cr_assert_eq(st.fences, 1, "blocks released before the reader was fenced");
				sp.released++;
			}
		}
		if (!n)
			usleep(200); /* application polling cadence; the condition is the completion */
	}
	cr_assert_eq(sp.transfer, KVX_CPL_TIMED_OUT);
	cr_assert_eq(sp.error, -ETIMEDOUT);
	cr_assert_eq(sp.released, 1);
	/* The producer reuses the blocks for another request, then D resumes. */
	for (int l = 0; l < NL; l++)
		memset(P.mem[l] + 3 * 128, 0xee, 2 * 128);
	cr_assert_eq(kill(k.pid, SIGCONT), 0);
	struct fence_seen fs;
	cr_assert_eq(io_all(k.from, &fs, sizeof(fs), false), 0, "consumer child failed after resuming");
	cr_assert(!fs.reused, "reused producer bytes reached D (status %d)", fs.status);
	if (fs.status == KVX_CPL_DONE) {
		cr_assert(fs.old, "a DONE read must hold the bytes served before the fence");
	} else if (fs.status == KVX_CPL_TIMED_OUT) {
		/* P's kvx_failed note reached D before its own reads ended: D ends with P's status
		 * and error (READ failure notes, issue 14). */
		cr_assert_eq(fs.error, -ETIMEDOUT, "error %d", fs.error);
	} else {
		cr_assert_eq(fs.status, KVX_CPL_FAILED, "the fenced read must fail, got status %d", fs.status);
		cr_assert_eq(fs.error, -ESTALE, "error %d", fs.error);
	}
	kid_end(&k);
	eng_free(&P);
}

Test(runtime_engine, f_defer_timeout_fences_reader_before_release)
{
	fence_case(NULL);
}

/* The same with two polling lcores on each side: D's two endpoints are served by P's two tcp
 * progress groups, one per poller, and the fence holds only once both pollers have finished a
 * progress call that began after the cut (poller.c fence_confirm()). */
Test(runtime_engine, f_defer_timeout_fences_reader_before_release_two_lcores)
{
	const char *lc = two_lcores();
	if (!lc)
		cr_skip_test("CPUs 0 and 1 are not both allowed to this process");
	fence_case(lc);
}

/* docs/protocol.md §6 item 18: D caches P's connection after the first transfer; P restarts on the
 * same ports (new epoch, new tcp data port, new regions). D's second READ must not be poisoned
 * by the stale connection: the poller that meets the dead endpoint marks it stale, D
 * re-handshakes, the new connection replaces the old one in the RCU table (the old one is
 * freed once unreferenced), and the READ completes byte-exact. */
static void restart_case(const char *lcores)
{
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	pp.lcores = dp.lcores = lcores;
	eng_start(&P, &pp, 0x31);
	eng_start(&D, &dp, 0);
	uint16_t hs = P.hs, nt = P.nt;
	const uint32_t pb[2] = {1, 2}, db[2] = {7, 8};
	struct kvx_engine_serve sv = {.transfer_id = "tx-r1", .local_blocks = pb, .n = 2};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	struct kvx_engine_read r = {.transfer_id = "tx-r1",
				    .peer = {.host = "127.0.0.1", .handshake_port = hs, .notify_port = nt},
				    .local_blocks = db,
				    .remote_blocks = pb,
				    .n = 2};
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen sd = {.transfer = -1}, sp = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-r1", &sd, false, 20000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_DONE);
	cr_assert(wait_for(P.e, "tx-r1", &sp, true, 20000000000ull));
	cr_assert_eq(sp.transfer, KVX_CPL_DONE);

	/* Restart P on the same handshake and notify ports. */
	eng_free(&P);
	pp.handshake_port = hs;
	pp.notify_port = nt;
	eng_start(&P, &pp, 0x77);
	cr_assert_eq(P.hs, hs);
	sv.transfer_id = "tx-r2";
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	r.transfer_id = "tx-r2";
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen sd2 = {.transfer = -1}, sp2 = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-r2", &sd2, false, 20000000000ull));
	cr_assert_eq(sd2.transfer, KVX_CPL_DONE, "second transfer status %d error %d", sd2.transfer, sd2.error);
	cr_assert(wait_for(P.e, "tx-r2", &sp2, true, 20000000000ull));
	cr_assert_eq(sp2.transfer, KVX_CPL_DONE);
	for (int l = 0; l < NL; l++)
		for (int k = 0; k < 2 * 128; k++)
			cr_assert_eq(D.mem[l][7 * 128 + k], 0x77, "layer %d byte %d", l, k);
	struct kvx_engine_stats st;
	kvx_engine_get_stats(D.e, &st);
	cr_assert_eq(st.transfers_done, 2);
	cr_assert_eq(st.transfers_failed, 0);
	cr_assert_eq(st.peer_resets, 1);
	eng_free(&D);
	eng_free(&P);
}

Test(runtime_engine, producer_restart_between_transfers_second_succeeds)
{
	restart_case(NULL);
}

Test(runtime_engine, producer_restart_two_pollers_second_succeeds)
{
	const char *lc = two_lcores();
	if (!lc)
		cr_skip_test("needs CPUs 0 and 1 in this process's affinity mask");
	restart_case(lc);
}

/* Producer child of g_layer_wait_sleeps_until_the_layer_lands: serves tx-c (connect) and tx-w,
 * polls its completions until the parent says 'q'. */
static int wait_producer(int wr, int rd)
{
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	eng_start(&P, &pp, 0x6b);
	const uint32_t pc[1] = {8}, pw[1] = {9};
	struct kvx_engine_serve sv = {.transfer_id = "tx-c", .local_blocks = pc, .n = 1};
	if (kvx_xfer_serve(P.e, &sv))
		return 2;
	sv.transfer_id = "tx-w";
	sv.local_blocks = pw;
	if (kvx_xfer_serve(P.e, &sv))
		return 3;
	uint16_t pt[2] = {P.hs, P.nt};
	if (io_all(wr, pt, sizeof(pt), true))
		return 4;
	for (;;) {
		struct kvx_completion c[8];
		kvx_engine_poll_completions(P.e, c, 8);
		struct pollfd pf = {.fd = rd, .events = POLLIN};
		if (poll(&pf, 1, 1) > 0) /* application polling cadence; the condition is the command */
			break;
	}
	eng_free(&P);
	return 0;
}

Test(runtime_engine, g_layer_wait_sleeps_until_the_layer_lands)
{
	/* kvx_xfer_layer_wait() sleeps on the engine's waiter (docs/protocol.md §6 item 1: no busy or
	 * backoff polling): while the producer (a child process) is stopped with SIGSTOP no byte of
	 * the READ can land, and the wait neither returns nor wakes up repeatedly; once it is
	 * resumed the wait returns 0 with the layer's bytes visible. */
	struct kid k;
	kid_start(&k, wait_producer);
	struct kvx_engine_params dp;
	struct eng D;
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	dp.transfer_timeout_ms = 30000;
	eng_start(&D, &dp, 0);
	uint16_t pt[2];
	cr_assert_eq(io_all(k.from, pt, sizeof(pt), false), 0, "producer child failed to start");
	/* Connect first (tx-c), so the stop below holds the data path, not the handshake. */
	const uint32_t pc[1] = {8}, dc[1] = {11}, pb[1] = {9}, db[1] = {10};
	struct kvx_engine_read r = {.transfer_id = "tx-c",
				    .peer = {.host = "127.0.0.1", .handshake_port = pt[0], .notify_port = pt[1]},
				    .local_blocks = dc,
				    .remote_blocks = pc,
				    .n = 1};
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen sc = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-c", &sc, false, 20000000000ull));
	cr_assert_eq(sc.transfer, KVX_CPL_DONE);
	kid_stopped(&k, true);
	r.transfer_id = "tx-w";
	r.local_blocks = db;
	r.remote_blocks = pb;
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	/* Held by the stopped producer: a bounded wait times out, and sleeps rather than polls
	 * while doing so (the old nanosleep backoff made thousands of voluntary switches in
	 * 300 ms). */
	struct rusage r0, r1;
	cr_assert_eq(getrusage(RUSAGE_THREAD, &r0), 0);
	uint64_t t0 = kvx_now_ns();
	int rc = kvx_xfer_layer_wait(D.e, "tx-w", 1, 300);
	uint64_t dt = kvx_now_ns() - t0;
	cr_assert_eq(getrusage(RUSAGE_THREAD, &r1), 0);
	cr_assert_eq(rc, -ETIMEDOUT);
	cr_assert_geq(dt, 300000000ull);
	long nvcsw = r1.ru_nvcsw - r0.ru_nvcsw;
	cr_assert_leq(nvcsw, 8, "the waiting thread woke %ld times", nvcsw);
	cr_assert_eq(kvx_xfer_layer_poll(D.e, "tx-w", 0), 0, "a layer landed from a stopped producer");
	/* Resumed: the waits return with the layers' bytes visible. */
	cr_assert_eq(kill(k.pid, SIGCONT), 0);
	for (uint32_t l = 0; l < NL; l++) {
		cr_assert_eq(kvx_xfer_layer_wait(D.e, "tx-w", l, 20000), 0, "layer %u", l);
		for (int k2 = 0; k2 < 128; k2++)
			cr_assert_eq(D.mem[l][10 * 128 + k2], 0x6b, "layer %u byte %d", l, k2);
	}
	struct seen sd = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-w", &sd, false, 20000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_DONE);
	kid_end(&k);
	eng_free(&D);
}

Test(runtime_engine, f_fenced_read_resumed_finds_the_lease_revoked)
{
	/* D's first op hits P's fence (P's defer timeout passed before D posted anything): D's
	 * endpoint dies, D re-handshakes and finds the same epoch. The read resumes on the new
	 * connection behind a new lease lookup, which finds the lease revoked (P's blocks may be
	 * reused): D moves no byte of the reused blocks, asks P (kvx_status_query) and ends with
	 * P's own outcome from its failure note, TIMED_OUT -ETIMEDOUT (docs/protocol.md §5.10). */
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	pp.defer_timeout_ms = 2000;
	dp.transfer_timeout_ms = 20000;
	eng_start(&P, &pp, 0x5a);
	eng_start(&D, &dp, 0);
	/* A first transfer connects D to P (so the fence has an endpoint to revoke). D reads only
	 * what P serves (block leases, issue 14), so P serves first; its defer timeout (2 s) is far
	 * longer than a loopback read. */
	const uint32_t pb[2] = {3, 4}, db[2] = {5, 6};
	struct kvx_engine_serve sv = {.transfer_id = "tx-a", .local_blocks = pb, .n = 2};
	struct kvx_engine_read r = {.transfer_id = "tx-a",
				    .peer = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt},
				    .local_blocks = db,
				    .remote_blocks = pb,
				    .n = 2};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen sa = {.transfer = -1}, spa = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-a", &sa, false, 20000000000ull));
	cr_assert_eq(sa.transfer, KVX_CPL_DONE);
	struct kvx_engine_stats st;
	cr_assert(wait_for(P.e, "tx-a", &spa, true, 20000000000ull));
	cr_assert_eq(spa.transfer, KVX_CPL_DONE);
	/* Second transfer: D submits it (and so posts nothing) only after P's defer timeout
	 * fenced it and P reused the blocks. */
	for (int l = 0; l < NL; l++)
		memset(D.mem[l] + 5 * 128, 0, 2 * 128);
	sv.transfer_id = "tx-b";
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	struct seen sp = {.transfer = -1};
	cr_assert(wait_for(P.e, "tx-b", &sp, true, 20000000000ull));
	cr_assert_eq(sp.transfer, KVX_CPL_TIMED_OUT);
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.fences, 1);
	for (int l = 0; l < NL; l++)
		memset(P.mem[l] + 3 * 128, 0xee, 2 * 128); /* reused */
	r.transfer_id = "tx-b";
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct seen sd = {.transfer = -1};
	cr_assert(wait_for(D.e, "tx-b", &sd, false, 20000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_TIMED_OUT, "status %d", sd.transfer);
	cr_assert_eq(sd.error, -ETIMEDOUT, "error %d", sd.error);
	for (int l = 0; l < NL; l++)
		for (int k = 0; k < 2 * 128; k++)
			cr_assert_eq(D.mem[l][5 * 128 + k], 0, "layer %d byte %d: reused bytes reached D", l, k);
	kvx_engine_get_stats(D.e, &st);
	cr_assert_eq(st.peer_resets, 1);
	cr_assert_eq(st.transfers_done, 1);
	cr_assert_eq(st.transfers_failed + st.transfers_timed_out, 1);
	eng_free(&D);
	eng_free(&P);
}

/* Completions of several transfers: per transfer id, the terminal status and releases. */
struct multi {
	const char *tid[4];
	struct seen s[4];
	size_t n;
};

static void multi_pump(struct kvx_engine *e, struct multi *m)
{
	struct kvx_completion c[8];
	size_t n = kvx_engine_poll_completions(e, c, 8);
	for (size_t i = 0; i < n; i++) {
		size_t k = 0;
		while (k < m->n && strcmp(m->tid[k], c[i].transfer_id))
			k++;
		cr_assert_lt(k, m->n, "unexpected completion for %s", c[i].transfer_id);
		if (c[i].kind == KVX_CPL_TRANSFER) {
			cr_assert_eq(m->s[k].transfer, -1, "two terminal completions for %s", m->tid[k]);
			m->s[k].transfer = (int)c[i].status;
			m->s[k].error = c[i].error;
		} else {
			m->s[k].released++;
		}
	}
}

static bool multi_wait(struct kvx_engine *e, struct multi *m, size_t k, uint64_t timeout_ns)
{
	uint64_t end = kvx_now_ns() + timeout_ns;
	while (kvx_now_ns() < end) {
		multi_pump(e, m);
		if (m->s[k].transfer >= 0)
			return true;
		usleep(200); /* application polling cadence; the condition is the completion */
	}
	return false;
}

/* Issue #8: a layer's readiness event completes late. While it is pending the producer's
 * poller posts nothing for that layer (no byte reaches D, the op/byte counters do not move)
 * although it keeps running (a later ungated transfer on the same poller finishes); once the
 * event completes, the layer is written and every byte is exact. */
Test(runtime_engine, write_late_layer_event_posts_nothing_before_it)
{
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	eng_start(&P, &pp, 0);
	eng_start(&D, &dp, 0);
	for (int l = 0; l < NL; l++)
		for (int b = 0; b < NB; b++)
			memset(P.mem[l] + b * 128, 0x10 + 16 * l + b, 128);
	struct kvx_engine_peer to_p = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt};
	struct kvx_engine_peer to_d = {.host = "127.0.0.1", .handshake_port = D.hs, .notify_port = D.nt};
	const uint32_t pb[2] = {1, 2}, db[2] = {7, 3}, pb2[1] = {5}, db2[1] = {11};
	struct kvx_engine_announce an = {.transfer_id = "tx-ev", .peer = to_p, .local_blocks = db, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	struct kvx_engine_write w = {.transfer_id = "tx-ev", .peer = to_d, .local_blocks = pb, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	_Atomic uint64_t layers_done = 0; /* the producer's "compute": layers finished so far */
	for (uint32_t l = 0; l < NL; l++) {
		struct kvx_mem_event ev;
		kvx_mem_event_init_flag(&ev, &layers_done, l + 1);
		cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-ev", l, &ev), 0);
	}
	cr_assert_eq(kvx_xfer_seal(P.e, "tx-ev", NL), 0);
	/* Layer 0 computed: its writes complete (the peer is connected and D's allocation arrived;
	 * P counts bytes of completed ops, so D's memory is not read while it is written). */
	atomic_store_explicit(&layers_done, 1, memory_order_release);
	uint64_t end = kvx_now_ns() + 20000000000ull;
	struct kvx_engine_stats st;
	do {
		kvx_engine_get_stats(P.e, &st);
		if (st.lcores[0].bytes < 2 * 128)
			usleep(500);
	} while (st.lcores[0].bytes < 2 * 128 && kvx_now_ns() < end);
	cr_assert_eq(st.lcores[0].bytes, 2 * 128, "layer 0 never landed");
	/* A second, ungated transfer on the same engine completes while layer 1 of tx-ev waits. */
	struct kvx_engine_announce an2 = {.transfer_id = "tx-ev2", .peer = to_p, .local_blocks = db2, .n = 1};
	cr_assert_eq(kvx_xfer_announce(D.e, &an2), 0);
	struct kvx_engine_write w2 = {.transfer_id = "tx-ev2", .peer = to_d, .local_blocks = pb2, .n = 1};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w2), 0);
	for (uint32_t l = 0; l < NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-ev2", l, NULL), 0);
	cr_assert_eq(kvx_xfer_seal(P.e, "tx-ev2", NL), 0);
	struct multi mp = {.tid = {"tx-ev", "tx-ev2"}, .s = {{.transfer = -1}, {.transfer = -1}}, .n = 2};
	struct multi md = mp;
	cr_assert(multi_wait(P.e, &mp, 1, 20000000000ull));
	cr_assert_eq(mp.s[1].transfer, KVX_CPL_DONE);
	cr_assert(multi_wait(D.e, &md, 1, 20000000000ull));
	cr_assert_eq(md.s[1].transfer, KVX_CPL_DONE);
	/* Still gated: tx-ev is live, its layer 1 untouched at D, and P moved exactly layer 0 of
	 * tx-ev (2 blocks) plus both layers of tx-ev2 (1 block each): 4 blocks of 128 bytes. */
	cr_assert_eq(mp.s[0].transfer, -1);
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 128; k++)
			cr_assert_eq(D.mem[1][db[i] * 128 + k], 0, "layer 1 written before its event");
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.lcores[0].bytes, 4 * 128, "bytes %llu", (unsigned long long)st.lcores[0].bytes);
	/* The event completes: layer 1 is written, then write_done. */
	atomic_store_explicit(&layers_done, 2, memory_order_release);
	cr_assert(multi_wait(P.e, &mp, 0, 20000000000ull));
	cr_assert_eq(mp.s[0].transfer, KVX_CPL_DONE);
	cr_assert(multi_wait(D.e, &md, 0, 20000000000ull));
	cr_assert_eq(md.s[0].transfer, KVX_CPL_DONE);
	for (int l = 0; l < NL; l++) {
		for (int b = 0; b < NB; b++) {
			const uint8_t *src = b == 7 ? P.mem[l] + 128 : b == 3 ? P.mem[l] + 256 : b == 11 ? P.mem[l] + 5 * 128 : NULL;
			for (int k = 0; k < 128; k++)
				cr_assert_eq(D.mem[l][b * 128 + k], src ? src[k] : 0, "layer %d block %d byte %d", l, b, k);
		}
	}
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.lcores[0].bytes, 6 * 128);
	cr_assert_eq(st.transfers_done, 2);
	eng_free(&D);
	eng_free(&P);
}

/* Issue #8: a hipEvent_t on a host without a GPU is refused at the call with -ENODEV (HIP
 * build) or -ENOTSUP (no HIP build); nothing is queued and the transfer goes on. */
Test(runtime_engine, layer_ready_hip_event_without_gpu_is_refused)
{
	int want = -ENOTSUP;
	if (kvx_mem_has_hip()) {
		char why[KVX_MEM_WHY_LEN];
		if (kvx_mem_probe(&(struct kvx_mem_type){.kind = KVX_MEM_HIP}, why, sizeof(why)) == 0)
			cr_skip_test("a HIP device is present: this case covers hosts without one");
		want = -ENODEV;
	}
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	eng_start(&P, &pp, 0);
	struct kvx_engine_write w = {.transfer_id = "tx-hip",
				     .peer = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt},
				     .local_blocks = (uint32_t[]){1},
				     .n = 1};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	int fake_event; /* never dereferenced: the call is refused before any HIP call on it */
	cr_assert_eq(kvx_xfer_layer_ready_hip(P.e, "tx-hip", 0, &fake_event), want);
	cr_assert_eq(kvx_xfer_layer_ready_hip(P.e, "tx-hip", 0, &fake_event), want, "refused again (cached probe)");
	if (want == -ENODEV) {
		struct kvx_mem_event ev;
		cr_assert_eq(kvx_mem_event_init_hip(&ev, &fake_event), 0);
		cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-hip", 0, &ev), -ENODEV);
	}
	cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-hip", NL, NULL), -EINVAL);
	cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-nope", 0, NULL), -ENOENT);
	cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-hip", 0, NULL), 0, "the transfer is still live");
	eng_free(&P);
}

/* Issue 8: device memory through the engine. Both engines register their NL layers as
 * KVX_ENGINE_MEM_HOSTDEV (the test-only mock of device memory: the CPU cannot touch it, so the
 * provider must stage (tcp) or map (shm) it); one transfer moves 3 blocks per layer, and the
 * consumer's layers, read back through kvx_mem copies, hold exactly those blocks and zeros
 * elsewhere. */
static void devmem_case(enum kvx_sched_mode mode, const char *prov)
{
	struct kvx_mem *m;
	cr_assert_eq(kvx_mem_open(&(struct kvx_mem_type){.kind = KVX_MEM_HOSTDEV, .device = 0}, &m), 0);
	struct kvx_engine_params pp, dp;
	params(&pp, KVX_SCHED_PRODUCER, mode);
	params(&dp, KVX_SCHED_CONSUMER, mode);
	pp.transport = dp.transport = prov;
	struct kvx_engine *pe, *de;
	char err[256] = "";
	cr_assert_eq(kvx_engine_create(&pp, &pe, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvx_engine_create(&dp, &de, err, sizeof(err)), 0, "%s", err);
	enum { LB = NB * 128 };
	static uint8_t host[NL][LB], back[LB];
	void *pm[NL], *dm[NL];
	for (int l = 0; l < NL; l++) {
		for (int k = 0; k < LB; k++)
			host[l][k] = (uint8_t)(1 + ((k / 128) * 13 + l * 5 + k) % 251);
		cr_assert_eq(kvx_mem_alloc(m, LB, &pm[l]), 0);
		cr_assert_eq(kvx_mem_alloc(m, LB, &dm[l]), 0);
		cr_assert_eq(kvx_mem_copy_sync(m, pm[l], host[l], LB, KVX_MEM_H2D), 0);
		char name[8];
		snprintf(name, sizeof(name), "l%d", l);
		struct kvx_engine_layer ly = {.name = name, .tensor = mla_tensor(), .spec = {.block_size = 4, .is_mla = true},
					      .mem = KVX_ENGINE_MEM_HOSTDEV};
		ly.base = pm[l];
		cr_assert_eq(kvx_engine_register_layer(pe, &ly), l);
		ly.base = dm[l];
		cr_assert_eq(kvx_engine_register_layer(de, &ly), l);
	}
	cr_assert_eq(kvx_engine_start(pe), 0);
	cr_assert_eq(kvx_engine_start(de), 0);
	struct kvx_engine_peer to_p = {.host = "127.0.0.1"}, to_d = {.host = "127.0.0.1"};
	cr_assert_eq(kvx_engine_ports(pe, &to_p.handshake_port, &to_p.notify_port), 0);
	cr_assert_eq(kvx_engine_ports(de, &to_d.handshake_port, &to_d.notify_port), 0);
	uint32_t pb[3] = {9, 2, 15}, db[3] = {0, 5, 6};
	const char *tid = "tx-devmem";
	if (mode == KVX_SCHED_MODE_READ) {
		struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = pb, .n = 3};
		cr_assert_eq(kvx_xfer_serve(pe, &sv), 0);
		struct kvx_engine_read r = {.transfer_id = tid, .peer = to_p, .local_blocks = db, .remote_blocks = pb, .n = 3};
		cr_assert_eq(kvx_xfer_read(de, &r), 0);
	} else {
		struct kvx_engine_announce an = {.transfer_id = tid, .peer = to_p, .local_blocks = db, .n = 3};
		cr_assert_eq(kvx_xfer_announce(de, &an), 0);
		struct kvx_engine_write w = {.transfer_id = tid, .peer = to_d, .local_blocks = pb, .n = 3};
		cr_assert_eq(kvx_xfer_write_begin(pe, &w), 0);
		for (uint32_t l = 0; l < NL; l++)
			cr_assert_eq(kvx_xfer_layer_ready_event(pe, tid, l, NULL), 0);
		cr_assert_eq(kvx_xfer_seal(pe, tid, NL), 0);
	}
	struct seen sp = {.transfer = -1}, sd = {.transfer = -1};
	cr_assert(wait_for(de, tid, &sd, false, 30000000000ull));
	cr_assert(wait_for(pe, tid, &sp, true, 30000000000ull));
	cr_assert_eq(sd.transfer, KVX_CPL_DONE, "D outcome %d error %d", sd.transfer, sd.error);
	cr_assert_eq(sp.transfer, KVX_CPL_DONE, "P outcome %d error %d", sp.transfer, sp.error);
	for (int l = 0; l < NL; l++) {
		cr_assert_eq(kvx_mem_copy_sync(m, back, dm[l], LB, KVX_MEM_D2H), 0);
		for (uint32_t b = 0; b < NB; b++) {
			int j = -1;
			for (int i = 0; i < 3; i++)
				if (db[i] == b)
					j = i;
			for (int k = 0; k < 128; k++) {
				uint8_t want = j < 0 ? 0 : host[l][pb[j] * 128 + (uint32_t)k];
				cr_assert_eq(back[b * 128 + (uint32_t)k], want, "layer %d block %u byte %d", l, b, k);
			}
		}
	}
	kvx_engine_destroy(de);
	kvx_engine_destroy(pe);
	for (int l = 0; l < NL; l++) {
		kvx_mem_free(m, pm[l]);
		kvx_mem_free(m, dm[l]);
	}
	kvx_mem_close(m);
}

Test(runtime_engine, devmem_tcp_read_staged) { devmem_case(KVX_SCHED_MODE_READ, "tcp"); }
Test(runtime_engine, devmem_tcp_write_staged) { devmem_case(KVX_SCHED_MODE_WRITE, "tcp"); }
Test(runtime_engine, devmem_shm_read_ipc) { devmem_case(KVX_SCHED_MODE_READ, "shm"); }
Test(runtime_engine, devmem_shm_write_ipc) { devmem_case(KVX_SCHED_MODE_WRITE, "shm"); }

/* Issue 6 / docs/architecture.md §1: transfers run on every polling lcore. Two engines with two polling
 * lcores each (adaptive idle: this host may have fewer free CPUs than threads) move 24
 * transfers in 4 rounds of 6 concurrent ones; every byte is checked, and the per-lcore stats
 * show that both lcores of each engine ran transfers (routing by transfer-id hash). */
static void multi_poller_case(enum kvx_sched_mode mode, const char *prov)
{
	const char *lc = two_lcores();
	if (!lc)
		cr_skip_test("needs CPUs 0 and 1 in this process's affinity mask");
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, mode);
	params(&dp, KVX_SCHED_CONSUMER, mode);
	pp.transport = dp.transport = prov;
	pp.lcores = dp.lcores = lc;
	pp.idle = dp.idle = KVX_ENGINE_IDLE_ADAPTIVE;
	pp.max_transfers = dp.max_transfers = 16;
	eng_start(&P, &pp, 0);
	eng_start(&D, &dp, 0);
	struct kvx_engine_stats st;
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.n_lcores, 2);
	struct kvx_engine_peer to_p = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt};
	struct kvx_engine_peer to_d = {.host = "127.0.0.1", .handshake_port = D.hs, .notify_port = D.nt};
	enum { ROUNDS = 4, PER = 6 };
	uint32_t total = 0;
	for (int round = 0; round < ROUNDS; round++) {
		char tids[PER][32];
		uint32_t pb[PER][2], db[PER][2];
		for (int l = 0; l < NL; l++)
			for (int b = 0; b < NB; b++)
				memset(P.mem[l] + b * 128, 1 + ((round * 31 + l * 7 + b) & 0x7f), 128);
		for (int i = 0; i < PER; i++) {
			snprintf(tids[i], sizeof(tids[i]), "tx-%s-%d-%d", mode == KVX_SCHED_MODE_READ ? "rd" : "wr", round, i);
			pb[i][0] = (uint32_t)(i + round) % NB;
			pb[i][1] = (uint32_t)(i + round + 7) % NB;
			db[i][0] = (uint32_t)(2 * i);
			db[i][1] = (uint32_t)(2 * i + 1);
			if (mode == KVX_SCHED_MODE_READ) {
				struct kvx_engine_serve sv = {.transfer_id = tids[i], .local_blocks = pb[i], .n = 2};
				cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
				struct kvx_engine_read r = {.transfer_id = tids[i], .peer = to_p, .local_blocks = db[i],
							    .remote_blocks = pb[i], .n = 2};
				cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
			} else {
				struct kvx_engine_announce an = {.transfer_id = tids[i], .peer = to_p, .local_blocks = db[i], .n = 2};
				cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
				struct kvx_engine_write w = {.transfer_id = tids[i], .peer = to_d, .local_blocks = pb[i], .n = 2};
				cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
				for (uint32_t l = 0; l < NL; l++)
					cr_assert_eq(kvx_xfer_layer_ready_event(P.e, tids[i], l, NULL), 0);
				cr_assert_eq(kvx_xfer_seal(P.e, tids[i], NL), 0);
			}
		}
		/* Every transfer terminal on both sides (P: blocks released too). */
		int done_p = 0, done_d = 0, rel_p = 0;
		uint64_t end = kvx_now_ns() + 30000000000ull;
		while ((done_p < PER || done_d < PER || rel_p < PER) && kvx_now_ns() < end) {
			struct kvx_completion c[16];
			size_t n = kvx_engine_poll_completions(P.e, c, 16);
			for (size_t k = 0; k < n; k++) {
				if (c[k].kind == KVX_CPL_TRANSFER) {
					cr_assert_eq(c[k].status, KVX_CPL_DONE, "P %s status %d error %d", c[k].transfer_id,
						     c[k].status, c[k].error);
					done_p++;
				} else {
					rel_p++;
				}
			}
			n = kvx_engine_poll_completions(D.e, c, 16);
			for (size_t k = 0; k < n; k++) {
				if (c[k].kind == KVX_CPL_TRANSFER) {
					cr_assert_eq(c[k].status, KVX_CPL_DONE, "D %s status %d error %d", c[k].transfer_id,
						     c[k].status, c[k].error);
					done_d++;
				}
			}
			usleep(200); /* application polling cadence; the condition is the completions */
		}
		cr_assert_eq(done_p, PER, "round %d: P finished %d of %d", round, done_p, PER);
		cr_assert_eq(done_d, PER, "round %d: D finished %d of %d", round, done_d, PER);
		cr_assert_eq(rel_p, PER);
		for (int i = 0; i < PER; i++)
			for (int l = 0; l < NL; l++)
				for (int j = 0; j < 2; j++)
					cr_assert(!memcmp(D.mem[l] + db[i][j] * 128, P.mem[l] + pb[i][j] * 128, 128),
						  "round %d transfer %d layer %d block %u differs", round, i, l, db[i][j]);
		total += PER;
	}
	struct kvx_engine_stats sp, sd;
	kvx_engine_get_stats(P.e, &sp);
	kvx_engine_get_stats(D.e, &sd);
	cr_assert_eq(sp.n_lcores, 2);
	cr_assert_eq(sd.n_lcores, 2);
	cr_assert_eq(sp.transfers_done, total);
	cr_assert_eq(sd.transfers_done, total);
	const struct kvx_engine_stats *mover = mode == KVX_SCHED_MODE_READ ? &sd : &sp;
	uint64_t bytes = 0;
	for (int k = 0; k < 2; k++) {
		cr_assert_gt(sp.lcores[k].transfers, 0, "P lcore %d ran no transfer", k);
		cr_assert_gt(sd.lcores[k].transfers, 0, "D lcore %d ran no transfer", k);
		cr_assert_eq(sp.lcores[k].failures + sd.lcores[k].failures, 0);
		cr_assert_gt(mover->lcores[k].bytes, 0, "lcore %d moved no byte", k);
		bytes += mover->lcores[k].bytes;
	}
	cr_assert_eq(sp.lcores[0].transfers + sp.lcores[1].transfers, total);
	cr_assert_eq(sd.lcores[0].transfers + sd.lcores[1].transfers, total);
	cr_assert_eq(bytes, (uint64_t)total * 2 * NL * 128, "bytes %llu", (unsigned long long)bytes);
	eng_free(&D);
	eng_free(&P);
}

Test(runtime_engine, two_pollers_tcp_read_many) { multi_poller_case(KVX_SCHED_MODE_READ, "tcp"); }
Test(runtime_engine, two_pollers_tcp_write_many) { multi_poller_case(KVX_SCHED_MODE_WRITE, "tcp"); }
Test(runtime_engine, two_pollers_shm_read_many) { multi_poller_case(KVX_SCHED_MODE_READ, "shm"); }
Test(runtime_engine, two_pollers_shm_write_many) { multi_poller_case(KVX_SCHED_MODE_WRITE, "shm"); }

/* docs/protocol.md §5.8 / T39, multi-pod peers: the producer reaches decode DP rank 1, which lives
 * on pod 1 (remote_hosts[1] = 127.0.0.1; the fallback host 192.0.2.9, TEST-NET-1, has nobody),
 * for the handshake and for write_done (routed to the decode rank of remote_blocks). A later
 * transfer naming other pod hosts (192.0.2.7: nobody) is another peer: it fails on its own and
 * does not change the first transfer's routing. */
Test(runtime_engine, multi_pod_routing_per_transfer)
{
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	pp.handshake_timeout_ms = 5000; /* the unreachable pod fails after it; generous for TSan */
	dp.dp_size = 2;
	dp.dp_rank = 1;
	dp.dp_size_local = 1;
	eng_start(&P, &pp, 0);
	eng_start(&D, &dp, 0);
	for (int l = 0; l < NL; l++)
		for (int b = 0; b < NB; b++)
			memset(P.mem[l] + b * 128, 0x40 + 8 * l + b, 128);
	const char *const good[2] = {"192.0.2.8", "127.0.0.1"}, *const bad[2] = {"192.0.2.8", "192.0.2.7"};
	struct kvx_engine_peer to_d = {.host = "192.0.2.9", .handshake_port = D.hs, .notify_port = D.nt,
				       .dp_rank = 1, .dp_size_local = 1, .remote_hosts = good, .num_remote_hosts = 2};
	struct kvx_engine_peer to_p = {.host = "127.0.0.1", .handshake_port = P.hs, .notify_port = P.nt};
	const uint32_t pb[2] = {2, 5}, db[2] = {9, 4};
	struct kvx_engine_announce an = {.transfer_id = "tx-pod-a", .peer = to_p, .local_blocks = db, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	struct kvx_engine_write w = {.transfer_id = "tx-pod-a", .peer = to_d, .local_blocks = pb, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	for (uint32_t l = 0; l < NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready_event(P.e, "tx-pod-a", l, NULL), 0);
	/* The handshake reached pod 1: the writes complete (write_done is due at the seal). */
	uint64_t end = kvx_now_ns() + 20000000000ull;
	struct kvx_engine_stats st;
	do {
		kvx_engine_get_stats(P.e, &st);
		if (st.lcores[0].bytes < 2 * NL * 128)
			usleep(500);
	} while (st.lcores[0].bytes < 2 * NL * 128 && kvx_now_ns() < end);
	cr_assert_eq(st.lcores[0].bytes, 2 * NL * 128, "tx-pod-a never landed on the pod host");
	/* A later transfer to the same rank with other pod hosts, before tx-pod-a's write_done. */
	struct kvx_engine_write wb = w;
	wb.transfer_id = "tx-pod-b";
	wb.peer.remote_hosts = bad;
	cr_assert_eq(kvx_xfer_write_begin(P.e, &wb), 0);
	cr_assert_eq(kvx_xfer_seal(P.e, "tx-pod-a", NL), 0);
	struct multi mp = {.tid = {"tx-pod-a", "tx-pod-b"}, .s = {{.transfer = -1}, {.transfer = -1}}, .n = 2};
	struct multi md = {.tid = {"tx-pod-a"}, .s = {{.transfer = -1}}, .n = 1};
	cr_assert(multi_wait(P.e, &mp, 0, 20000000000ull));
	cr_assert_eq(mp.s[0].transfer, KVX_CPL_DONE, "error %d", mp.s[0].error);
	cr_assert(multi_wait(D.e, &md, 0, 20000000000ull), "write_done never reached the pod host");
	cr_assert_eq(md.s[0].transfer, KVX_CPL_DONE);
	for (int l = 0; l < NL; l++)
		for (int i = 0; i < 2; i++)
			cr_assert(!memcmp(D.mem[l] + db[i] * 128, P.mem[l] + pb[i] * 128, 128), "layer %d block %u", l, db[i]);
	cr_assert(multi_wait(P.e, &mp, 1, 20000000000ull));
	cr_assert_eq(mp.s[1].transfer, KVX_CPL_FAILED, "status %d", mp.s[1].transfer);
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.n_peers, 2, "two pod host lists are two peers");
	cr_assert_eq(st.transfers_done, 1);
	cr_assert_eq(st.transfers_failed, 1);
	eng_free(&D);
	eng_free(&P);
}

/* Register NL split K/V layers (2 x NB blocks x 4 tokens x 1 head x 16, bf16) filled with
 * `fill` and start the engine. mem: Array[NL] of the layers' buffers (caller frees). */
static void split_engine_start(struct kvx_engine *e, uint8_t *mem[NL], uint8_t fill)
{
	for (int i = 0; i < NL; i++) {
		mem[i] = malloc(2 * NB * 64 * 2);
		cr_assert_not_null(mem[i]);
		memset(mem[i], fill, 2 * NB * 64 * 2);
		char name[8];
		snprintf(name, sizeof(name), "s%d", i);
		struct kvx_engine_layer l = {
			.name = name, .base = mem[i],
			.tensor = {.ndim = 5, .shape = {2, NB, 4, 1, 16}, .stride = {NB * 64, 64, 16, 16, 1}, .elem_size = 2},
			.spec = {.block_size = 4, .num_kv_heads = 1, .head_size = 16}};
		cr_assert_eq(kvx_engine_register_layer(e, &l), i);
	}
	cr_assert_eq(kvx_engine_start(e), 0);
}

/* A TP 2 consumer with one KV head per rank reads block 2 of a TP 1 producer (same split layers)
 * into its block 1; `total` is the consumer's params.total_kv_heads. Returns the READ's
 * completion; a rejected peer must have written nothing, an accepted one exactly that block. */
static struct seen hetero_tp_read(uint32_t total, const char *tid)
{
	struct kvx_engine_params pp, dp;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	dp.tp_size = 2;
	dp.total_kv_heads = total;
	struct kvx_engine *p, *d;
	uint8_t *pm[NL], *dm[NL];
	char err[256] = "";
	cr_assert_eq(kvx_engine_create(&pp, &p, err, sizeof(err)), 0, "%s", err);
	split_engine_start(p, pm, 0x11);
	uint16_t hs, nt;
	cr_assert_eq(kvx_engine_ports(p, &hs, &nt), 0);
	cr_assert_eq(kvx_engine_create(&dp, &d, err, sizeof(err)), 0, "%s", err);
	split_engine_start(d, dm, 0);
	struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = (uint32_t[]){2}, .n = 1, .consumer_tp_size = 2};
	cr_assert_eq(kvx_xfer_serve(p, &sv), 0);
	struct kvx_engine_read r = {.transfer_id = tid,
				    .peer = {.host = "127.0.0.1", .handshake_port = hs, .notify_port = nt, .tp_size = 1},
				    .local_blocks = (uint32_t[]){1},
				    .remote_blocks = (uint32_t[]){2},
				    .n = 1};
	cr_assert_eq(kvx_xfer_read(d, &r), 0);
	struct seen s = {.transfer = -1};
	cr_assert(wait_for(d, tid, &s, false, 20000000000ull));
	/* Block 1 of each plane (K at 0, V at NB*64 elements) is bytes [128, 256) of the plane. */
	for (int i = 0; i < NL; i++)
		for (size_t k = 0; k < 2 * NB * 64 * 2; k++) {
			size_t in_plane = k % (NB * 64 * 2);
			bool moved = s.transfer == KVX_CPL_DONE && in_plane >= 128 && in_plane < 256;
			cr_assert_eq(dm[i][k], moved ? 0x11 : 0, "layer %d byte %zu", i, k);
		}
	kvx_engine_destroy(d);
	kvx_engine_destroy(p);
	for (int i = 0; i < NL; i++) {
		free(pm[i]);
		free(dm[i]);
	}
	return s;
}

/* docs/protocol.md §4.2/§4.5: a consumer with TP 2 and one KV head per rank (2 heads in all) cannot
 * take whole blocks from a TP 1 producer (min TP 1 < 2 heads): the peer is rejected when its
 * metadata arrives, and the READ fails with -ENOTSUP (no crash, no hang, nothing written). */
Test(runtime_engine, hetero_tp_peer_rejected_at_handshake)
{
	struct seen s = hetero_tp_read(0, "tx-htp");
	cr_assert_eq(s.transfer, KVX_CPL_FAILED);
	cr_assert_eq(s.error, -ENOTSUP, "error %d", s.error);
}

/* The same pair with a model of one KV head replicated on both consumer ranks
 * (params.total_kv_heads = 1): min TP 1 >= 1 head, so the handshake is accepted and the READ
 * completes (num_kv_heads x tp_size would have overcounted the heads as 2 and refused it). */
Test(runtime_engine, hetero_tp_replicated_heads_accepted)
{
	struct seen s = hetero_tp_read(1, "tx-htp-rep");
	cr_assert_eq(s.transfer, KVX_CPL_DONE, "outcome %d error %d", s.transfer, s.error);
	cr_assert_eq(s.error, 0);
}

/* Hot-path rule (no allocation per submission): transfer objects are preallocated from
 * params.max_transfers; one more live transfer is refused with -ENOBUFS (and a message), and
 * an object comes back once its last completion is polled. */
Test(runtime_engine, submissions_beyond_max_transfers_get_enobufs_until_polled)
{
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	pp.max_transfers = 4;
	eng_start(&P, &pp, 0);
	char tid[16];
	for (int i = 0; i < 4; i++) {
		snprintf(tid, sizeof(tid), "tx-cap-%d", i);
		struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = (uint32_t[]){(uint32_t)i}, .n = 1};
		cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0, "transfer %d", i);
	}
	struct kvx_engine_serve sv = {.transfer_id = "tx-cap-4", .local_blocks = (uint32_t[]){4}, .n = 1};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), -ENOBUFS);
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), -ENOBUFS, "still full");
	/* Abort one: its completions come back, and its object with them. */
	cr_assert_eq(kvx_xfer_abort(P.e, "tx-cap-1"), 0);
	struct seen s = {.transfer = -1};
	cr_assert(wait_for(P.e, "tx-cap-1", &s, true, 20000000000ull));
	cr_assert_eq(s.transfer, KVX_CPL_ABORTED);
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0, "the polled transfer's object is reused");
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), -EEXIST);
	eng_free(&P);
}

/* A submission the owning lcore's ring refuses (-ENOBUFS) leaves nothing behind: the same
 * transfer id is accepted once the ring has drained. (It used to be recorded as used, so the
 * retry the binding makes got -EEXIST: CI run of b69395b, test_binding.py burst test.) The
 * ring is filled with no-op messages (aborts of a transfer already aborted, which its poller
 * drops) until it refuses one; the submission right after finds it full unless the poller
 * drained it in between, so rounds repeat until one submission was refused. */
Test(runtime_engine, submission_refused_by_a_full_ring_is_retried_with_the_same_id)
{
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	pp.max_transfers = 64;
	eng_start(&P, &pp, 0);
	struct kvx_engine_serve hold = {.transfer_id = "tx-hold", .local_blocks = (uint32_t[]){0}, .n = 1};
	cr_assert_eq(kvx_xfer_serve(P.e, &hold), 0);
	int refused = 0, rounds = 0;
	char tid[24];
	while (!refused) {
		cr_assert_lt(rounds, 60, "no submission found the ring full in 60 rounds");
		long fill = 0;
		int rc;
		while ((rc = kvx_xfer_abort(P.e, "tx-hold")) == 0)
			cr_assert_lt(++fill, 1L << 24, "the ring never filled");
		cr_assert_eq(rc, -ENOBUFS);
		snprintf(tid, sizeof(tid), "tx-ring-%d", rounds++);
		struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = (uint32_t[]){1 + (uint32_t)rounds % (NB - 1)},
					      .n = 1};
		while ((rc = kvx_xfer_serve(P.e, &sv)) == -ENOBUFS)
			refused++;
		cr_assert_eq(rc, 0, "%s: retry after %d refusals: %d", tid, refused, rc);
		cr_assert_eq(kvx_xfer_serve(P.e, &sv), -EEXIST, "accepted once, then a duplicate");
	}
	struct kvx_engine_stats st;
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.duplicates_rejected, (uint64_t)rounds, "one -EEXIST per round, none from a retry");
	eng_free(&P);
}
