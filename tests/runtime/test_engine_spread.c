/* SPDX-License-Identifier: Apache-2.0 */
/* Layer spread (issue 16, docs/performance.md §7): one transfer's layers posted by every polling
 * lcore of an engine. Real engines with two polling lcores each (CPUs 0 and 1, else SKIP), real
 * tcp and shm providers, real libzmq: (1) a 4-layer transfer moves exactly two layers' bytes on
 * each lcore (per-lcore byte counters) and exact bytes at the destination, and with
 * KVX_ENGINE_SPREAD_NONE every byte on the owner's lcore; (2) ops that fail on the helper lcore
 * fail the transfer once with their status, and the owner's own layers, opened afterwards, are
 * never posted; (3) abort and timeout with the helper's ops outstanding (the consumer process
 * is stopped) end terminal, release once the ops end, and the engine keeps working. */
#include <errno.h>
#include <string.h>
#ifdef KVX_TSAN_RUNNER /* TSan build: Criterion cannot start (tests/lcore/tsan_runner.h) */
#include "tests/lcore/tsan_runner.h"
#else
#include <criterion/criterion.h>
#endif
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "kvxfer/control.h"
#include "kvxfer/engine.h"
#include "runtime/runtime_internal.h"
#include "tests/runtime/pipe_io.h"

TestSuite(runtime_spread, .timeout = 120.0);

#define NB 16
#define NL 4
#define BLK 128 /* bytes of one block in one layer: [NB, 4, 16] x 2 bytes, MLA */

struct eng {
	struct kvx_engine *e;
	uint8_t *mem[NL];
	uint16_t hs, nt;
};

/* Polling lcores "0,1" when this process may run on CPUs 0 and 1, else NULL (skip). */
static const char *two_lcores(void)
{
	cpu_set_t cs;
	if (sched_getaffinity(0, sizeof(cs), &cs) || !CPU_ISSET(0, &cs) || !CPU_ISSET(1, &cs))
		return NULL;
	return "0,1";
}

static void params(struct kvx_engine_params *p, enum kvx_sched_role role, enum kvx_sched_mode mode, const char *prov)
{
	kvx_engine_params_init(p);
	p->role = role;
	p->mode = mode;
	p->transport = prov;
	p->handshake_port = 0;
	p->notify_port = 0;
	p->max_transfers = 8;
	p->max_blocks = NB;
	p->lcores = "0,1";
	p->idle = KVX_ENGINE_IDLE_ADAPTIVE;
}

static uint8_t pattern(uint32_t layer, uint32_t block)
{
	return (uint8_t)(0x11 + 37 * layer + block);
}

/* Create, register NL layers (filled with pattern() or zeros) and start; 0 or the error. */
static int eng_start(struct eng *g, const struct kvx_engine_params *p, bool fill)
{
	char err[256] = "";
	int rc = kvx_engine_create(p, &g->e, err, sizeof(err));
	if (rc)
		return rc;
	for (uint32_t l = 0; l < NL; l++) {
		g->mem[l] = malloc(NB * BLK);
		if (!g->mem[l])
			return -ENOMEM;
		for (uint32_t b = 0; b < NB; b++)
			memset(g->mem[l] + b * BLK, fill ? pattern(l, b) : 0, BLK);
		char name[8];
		snprintf(name, sizeof(name), "l%u", l);
		struct kvx_engine_layer ly = {
			.name = name, .base = g->mem[l],
			.tensor = {.ndim = 3, .shape = {NB, 4, 16}, .stride = {64, 16, 1}, .elem_size = 2},
			.spec = {.block_size = 4, .is_mla = true}};
		if ((rc = kvx_engine_register_layer(g->e, &ly)) != (int)l)
			return rc < 0 ? rc : -EINVAL;
	}
	if ((rc = kvx_engine_start(g->e)))
		return rc;
	return kvx_engine_ports(g->e, &g->hs, &g->nt);
}

static void eng_free(struct eng *g)
{
	kvx_engine_destroy(g->e);
	for (uint32_t l = 0; l < NL; l++)
		free(g->mem[l]);
}

static struct kvx_engine_peer peer_of(const struct eng *g)
{
	return (struct kvx_engine_peer){.host = "127.0.0.1", .handshake_port = g->hs, .notify_port = g->nt};
}

static struct kvx_engine_stats stats(struct kvx_engine *e)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st;
}

/* The completions of one transfer seen on one engine. */
struct seen {
	const char *tid;
	int transfer; /* -1 none, else enum kvx_cpl_status */
	int error;
	int released;
};

static void pump(struct kvx_engine *e, struct seen *s)
{
	struct kvx_completion c[8];
	size_t n = kvx_engine_poll_completions(e, c, 8);
	for (size_t i = 0; i < n; i++) {
		cr_assert(!strcmp(c[i].transfer_id, s->tid), "unexpected completion for %s", c[i].transfer_id);
		if (c[i].kind == KVX_CPL_TRANSFER) {
			cr_assert_eq(s->transfer, -1, "two terminal completions for %s", s->tid);
			s->transfer = (int)c[i].status;
			s->error = c[i].error;
		} else {
			cr_assert_eq(s->released, 0, "two releases for %s", s->tid);
			s->released++;
		}
	}
}

/* Poll until @p s is terminal (and released when asked); false after 60 s. */
static bool wait_for(struct kvx_engine *e, struct seen *s, bool want_release)
{
	uint64_t end = kvx_now_ns() + 60000000000ull;
	while (kvx_now_ns() < end) {
		pump(e, s);
		if (s->transfer >= 0 && (!want_release || s->released))
			return true;
		usleep(200); /* application polling cadence; the condition is the completion */
	}
	return false;
}

/* The owning lcore of a transfer id on a 2-poller engine (eng_tid_poller()). */
static uint32_t owner_of(const char *tid)
{
	return kvx_xfer_tid_hash(tid) % 2;
}

/* ---------------------------------------------------------------------------------------- */
/* (1) bytes on both lcores                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void both_lcores_case(enum kvx_sched_mode mode, const char *prov, enum kvx_engine_spread spread)
{
	if (!two_lcores())
		cr_skip_test("needs CPUs 0 and 1 in this process's affinity mask");
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, mode, prov);
	params(&dp, KVX_SCHED_CONSUMER, mode, prov);
	pp.spread = dp.spread = spread;
	cr_assert_eq(eng_start(&P, &pp, true), 0);
	cr_assert_eq(eng_start(&D, &dp, false), 0);
	const char *tid = mode == KVX_SCHED_MODE_READ ? "tx-spread-rd" : "tx-spread-wr";
	enum { N = 5 };
	uint32_t src[N] = {3, 1, 4, 15, 9}, dst[N] = {2, 7, 1, 8, 12};
	struct seen sp = {.tid = tid, .transfer = -1}, sd = {.tid = tid, .transfer = -1};
	if (mode == KVX_SCHED_MODE_READ) {
		struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = src, .n = N};
		cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
		struct kvx_engine_read r = {.transfer_id = tid, .peer = peer_of(&P), .local_blocks = dst,
					    .remote_blocks = src, .n = N};
		cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	} else {
		struct kvx_engine_announce an = {.transfer_id = tid, .peer = peer_of(&P), .local_blocks = dst, .n = N};
		cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
		struct kvx_engine_write w = {.transfer_id = tid, .peer = peer_of(&D), .local_blocks = src, .n = N};
		cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
		for (uint32_t l = 0; l < NL; l++)
			cr_assert_eq(kvx_xfer_layer_ready_event(P.e, tid, l, NULL), 0);
		cr_assert_eq(kvx_xfer_seal(P.e, tid, NL), 0);
	}
	cr_assert(wait_for(D.e, &sd, false), "consumer not terminal");
	cr_assert(wait_for(P.e, &sp, true), "producer not terminal and released");
	cr_assert_eq(sd.transfer, KVX_CPL_DONE, "consumer status %d error %d", sd.transfer, sd.error);
	cr_assert_eq(sp.transfer, KVX_CPL_DONE, "producer status %d error %d", sp.transfer, sp.error);
	for (uint32_t l = 0; l < NL; l++)
		for (uint32_t i = 0; i < NB; i++) {
			uint8_t want = 0;
			for (int j = 0; j < N; j++)
				if (dst[j] == i)
					want = pattern(l, src[j]);
			for (uint32_t k = 0; k < BLK; k++)
				cr_assert_eq(D.mem[l][i * BLK + k], want, "layer %u block %u byte %u", l, i, k);
		}
	/* The engine that posts: D reads, P writes. */
	struct kvx_engine_stats st = stats(mode == KVX_SCHED_MODE_READ ? D.e : P.e);
	cr_assert_eq(st.n_lcores, 2);
	uint32_t own = owner_of(tid);
	const uint64_t layer_bytes = (uint64_t)N * BLK;
	for (uint32_t k = 0; k < 2; k++) {
		uint64_t want = spread == KVX_ENGINE_SPREAD_LAYERS ? 2 * layer_bytes : k == own ? NL * layer_bytes : 0;
		cr_assert_eq(st.lcores[k].bytes, want, "lcore %u moved %llu bytes, want %llu", k,
			     (unsigned long long)st.lcores[k].bytes, (unsigned long long)want);
		cr_assert_eq(st.lcores[k].transfers, k == own ? 1u : 0u, "the transfer ends on its owner only");
	}
	eng_free(&D);
	eng_free(&P);
}

Test(runtime_spread, tcp_read_four_layers_bytes_on_both_lcores)
{
	both_lcores_case(KVX_SCHED_MODE_READ, "tcp", KVX_ENGINE_SPREAD_LAYERS);
}
Test(runtime_spread, tcp_write_four_layers_bytes_on_both_lcores)
{
	both_lcores_case(KVX_SCHED_MODE_WRITE, "tcp", KVX_ENGINE_SPREAD_LAYERS);
}
Test(runtime_spread, shm_read_four_layers_bytes_on_both_lcores)
{
	both_lcores_case(KVX_SCHED_MODE_READ, "shm", KVX_ENGINE_SPREAD_LAYERS);
}
Test(runtime_spread, shm_write_four_layers_bytes_on_both_lcores)
{
	both_lcores_case(KVX_SCHED_MODE_WRITE, "shm", KVX_ENGINE_SPREAD_LAYERS);
}
Test(runtime_spread, spread_none_every_byte_on_the_owner)
{
	both_lcores_case(KVX_SCHED_MODE_WRITE, "tcp", KVX_ENGINE_SPREAD_NONE);
	both_lcores_case(KVX_SCHED_MODE_READ, "shm", KVX_ENGINE_SPREAD_NONE);
}

/* ---------------------------------------------------------------------------------------- */
/* A decode scheduler's remote_blocks (MoRIIO-style: no kvx_epoch, so no lease), from a real   */
/* libzmq DEALER in the wire format of docs/protocol.md §3.2.                                 */
/* ---------------------------------------------------------------------------------------- */

static void send_remote_blocks(uint16_t port, const char *tid, uint32_t *ids, uint32_t n)
{
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_REMOTE_BLOCKS;
	snprintf(m.req_id, sizeof(m.req_id), "req-%s", tid);
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	m.block_ids = ids;
	m.num_blocks = n;
	m.decode_rank = 0;
	uint8_t buf[1024];
	int len = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_gt(len, 0);
	void *ctx = zmq_ctx_new();
	cr_assert_not_null(ctx);
	void *s = zmq_socket(ctx, ZMQ_DEALER);
	cr_assert_not_null(s);
	int linger = 5000;
	cr_assert_eq(zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)), 0);
	char ep[64];
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);
	cr_assert_eq(zmq_connect(s, ep), 0);
	cr_assert_eq(zmq_send(s, buf, (size_t)len, 0), len);
	zmq_close(s);
	zmq_ctx_term(ctx); /* returns once the frame is out (at most the linger) */
}

/* P WRITE of @p tid to D, every layer ready now, sealed; D's allocation from the scheduler. */
static void push_moriio(struct eng *P, const struct eng *D, const char *tid, const uint32_t *src, uint32_t *dst,
			uint32_t n)
{
	struct kvx_engine_write w = {.transfer_id = tid, .peer = peer_of(D), .local_blocks = src, .n = n};
	cr_assert_eq(kvx_xfer_write_begin(P->e, &w), 0);
	for (uint32_t l = 0; l < NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready(P->e, tid, l, NULL), 0);
	cr_assert_eq(kvx_xfer_seal(P->e, tid, NL), 0);
	send_remote_blocks(P->nt, tid, dst, n);
}

/* ---------------------------------------------------------------------------------------- */
/* (2) a failing op on the helper lcore                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(runtime_spread, helper_op_failure_fails_transfer_once_owner_posts_nothing)
{
	if (!two_lcores())
		cr_skip_test("needs CPUs 0 and 1 in this process's affinity mask");
	struct kvx_engine_params pp, dp;
	struct eng P, D;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE, "tcp");
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE, "tcp");
	cr_assert_eq(eng_start(&P, &pp, true), 0);
	cr_assert_eq(eng_start(&D, &dp, false), 0);
	const char *tid = "tx-helper-fails";
	uint32_t own = owner_of(tid), helper = 1 - own;
	/* D's allocation names blocks past the end of D's regions: the tcp target refuses every
	 * op of a posted layer with -ERANGE (the connection stays usable). */
	uint32_t src[2] = {1, 3}, dst[2] = {NB + 1000, NB + 1005}; /* not merged: 2 ops a layer */
	static atomic_uint gate[NL];
	struct kvx_engine_write w = {.transfer_id = tid, .peer = peer_of(&D), .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	for (uint32_t l = 0; l < NL; l++) {
		atomic_store(&gate[l], l % 2 == helper); /* only the helper's layers are computed */
		cr_assert_eq(kvx_xfer_layer_ready(P.e, tid, l, &gate[l]), 0);
	}
	cr_assert_eq(kvx_xfer_seal(P.e, tid, NL), 0);
	send_remote_blocks(P.nt, tid, dst, 2);
	struct seen sp = {.tid = tid, .transfer = -1};
	cr_assert(wait_for(P.e, &sp, true), "producer not terminal and released");
	cr_assert_eq(sp.transfer, KVX_CPL_FAILED, "status %d error %d", sp.transfer, sp.error);
	cr_assert_eq(sp.error, -ERANGE, "error %d", sp.error);
	/* Released: every hand-off is back, so nothing more of it is posted. The helper posted
	 * one or both of its layers (2 ops each): when the first layer's -ERANGE is back before
	 * the owner hands over the second, the owner hands nothing more. The owner posted none. */
	struct kvx_engine_stats st1 = stats(P.e);
	uint64_t h1 = st1.lcores[helper].ops;
	cr_assert(h1 == 2 || h1 == 4, "helper ops of the failed transfer %llu", (unsigned long long)h1);
	cr_assert_eq(st1.lcores[own].ops, 0, "owner ops %llu", (unsigned long long)st1.lcores[own].ops);
	/* The owner's layers open after the transfer settled: nothing is posted for them. */
	for (uint32_t l = 0; l < NL; l++)
		atomic_store_explicit(&gate[l], 1, memory_order_release);
	/* A barrier on the same owner: a good transfer submitted after it, done. */
	const char *tid2 = owner_of("tx-after-0") == own ? "tx-after-0" : "tx-after-1";
	cr_assert_eq(owner_of(tid2), own);
	uint32_t src2[1] = {5}, dst2[1] = {6};
	push_moriio(&P, &D, tid2, src2, dst2, 1);
	struct seen s2 = {.tid = tid2, .transfer = -1};
	cr_assert(wait_for(P.e, &s2, true), "second transfer not terminal");
	cr_assert_eq(s2.transfer, KVX_CPL_DONE, "status %d error %d", s2.transfer, s2.error);
	struct kvx_engine_stats st = stats(P.e);
	cr_assert_eq(st.transfers_failed, 1);
	cr_assert_eq(st.transfers_done, 1);
	cr_assert_eq(st.lcores[own].failures, 1, "the failure is counted once, on the owner");
	cr_assert_eq(st.lcores[helper].failures, 0);
	/* Ops since: tx2's 4 layers (1 block each, 2 per lcore); none for the failed transfer's
	 * owner layers, whose gates opened after it settled. */
	cr_assert_eq(st.lcores[helper].ops, h1 + 2, "helper ops %llu", (unsigned long long)st.lcores[helper].ops);
	cr_assert_eq(st.lcores[own].ops, 2, "owner ops %llu", (unsigned long long)st.lcores[own].ops);
	cr_assert_eq(st.lcores[helper].bytes + st.lcores[own].bytes, (uint64_t)NL * BLK, "only tx2's bytes landed");
	for (uint32_t l = 0; l < NL; l++)
		for (uint32_t k = 0; k < BLK; k++)
			cr_assert_eq(D.mem[l][6 * BLK + k], pattern(l, 5));
	eng_free(&D);
	eng_free(&P);
}

/* ---------------------------------------------------------------------------------------- */
/* (3) abort / timeout with the helper's ops outstanding                                     */
/* ---------------------------------------------------------------------------------------- */


/* Consumer child: a WRITE consumer engine (tcp target) that reports its ports and runs until
 * the parent writes a byte. Exit status 0 on success. */
static int consumer_child(int wr, int rd)
{
	struct kvx_engine_params dp;
	struct eng D;
	params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE, "tcp");
	if (eng_start(&D, &dp, false))
		return 1;
	uint16_t ports[2] = {D.hs, D.nt};
	if (io_all(wr, ports, sizeof(ports), true))
		return 2;
	char q;
	if (io_all(rd, &q, 1, false))
		return 3;
	eng_free(&D);
	return 0;
}

static void outstanding_case(bool abort)
{
	if (!two_lcores())
		cr_skip_test("needs CPUs 0 and 1 in this process's affinity mask");
	int a[2], b[2];
	cr_assert_eq(pipe(a), 0);
	cr_assert_eq(pipe(b), 0);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(a[0]);
		close(b[1]);
		_exit(consumer_child(a[1], b[0]));
	}
	close(a[1]);
	close(b[0]);
	struct eng D = {0};
	uint16_t ports[2];
	cr_assert_eq(io_all(a[0], ports, sizeof(ports), false), 0, "consumer child did not start");
	D.hs = ports[0];
	D.nt = ports[1];
	struct kvx_engine_params pp;
	struct eng P;
	params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE, "tcp");
	/* The epoch check against the stopped consumer ends after the handshake timeout (the
	 * connection is then trusted and the layers posted); the warm-up's handshake, with the
	 * consumer running, must fit in it too (TSan builds are slow). */
	pp.handshake_timeout_ms = 3000;
	pp.transfer_timeout_ms = abort ? 60000 : 8000;
	cr_assert_eq(eng_start(&P, &pp, true), 0);
	/* The connection, while the consumer runs. */
	uint32_t s0[1] = {0}, d0[1] = {0};
	push_moriio(&P, &D, "tx-warm", s0, d0, 1);
	struct seen sw = {.tid = "tx-warm", .transfer = -1};
	cr_assert(wait_for(P.e, &sw, true));
	cr_assert_eq(sw.transfer, KVX_CPL_DONE, "warm-up status %d error %d", sw.transfer, sw.error);
	struct kvx_engine_stats st0 = stats(P.e);
	/* The consumer stops: every op posted now stays outstanding until it continues. */
	int wst = 0;
	cr_assert_eq(kill(pid, SIGSTOP), 0);
	cr_assert_eq(waitpid(pid, &wst, WUNTRACED), pid);
	cr_assert(WIFSTOPPED(wst));
	const char *tid = "tx-stuck";
	uint32_t own = owner_of(tid), helper = 1 - own;
	uint32_t src[4] = {1, 2, 3, 4}, dst[4] = {5, 6, 7, 8};
	push_moriio(&P, &D, tid, src, dst, 4);
	struct seen sp = {.tid = tid, .transfer = -1};
	if (abort) {
		/* Posted on both lcores (the epoch check times out against the stopped peer and the
		 * connection is trusted), then aborted with those ops outstanding. */
		uint64_t end = kvx_now_ns() + 60000000000ull;
		struct kvx_engine_stats st;
		do {
			usleep(200); /* observation cadence; the condition is the counters */
			st = stats(P.e);
		} while ((st.lcores[helper].ops == st0.lcores[helper].ops || st.lcores[own].ops == st0.lcores[own].ops) &&
			 kvx_now_ns() < end);
		cr_assert_gt(st.lcores[helper].ops, st0.lcores[helper].ops, "nothing posted on the helper");
		cr_assert_gt(st.lcores[own].ops, st0.lcores[own].ops, "nothing posted on the owner");
		cr_assert_eq(kvx_xfer_abort(P.e, tid), 0);
	}
	/* Terminal while the ops are outstanding (the consumer is still stopped). */
	cr_assert(wait_for(P.e, &sp, false), "not terminal");
	/* The ops' own deadline is the transfer timeout too (counted from their post): when it
	 * fires before the transfer's deadline scan, the transfer fails with their -ETIMEDOUT. */
	bool op_deadline = !abort && sp.transfer == KVX_CPL_FAILED && sp.error == -ETIMEDOUT;
	cr_assert(abort ? sp.transfer == KVX_CPL_ABORTED : sp.transfer == KVX_CPL_TIMED_OUT || op_deadline,
		  "status %d error %d", sp.transfer, sp.error);
	/* The consumer continues: the ops end, the blocks are released, once. */
	cr_assert_eq(kill(pid, SIGCONT), 0);
	cr_assert(wait_for(P.e, &sp, true), "blocks not released");
	/* Nothing leaked: the same engine moves the next transfer on both lcores. The ops' own
	 * deadline is the transfer timeout: with the timeout they may end -ETIMEDOUT while the
	 * consumer is stopped, which puts their endpoint in error state. A transfer that posts
	 * on that connection before the re-handshake replaced it fails once -ETIMEDOUT or
	 * -ECONNRESET (docs/protocol.md §6 item 18); the next one uses the new connection. */
	struct kvx_engine_stats st1, st2;
	struct seen sn = {.transfer = -1};
	uint32_t failed_first = 0;
	for (int attempt = 0; attempt < 4; attempt++) {
		static char tid_next[4][16];
		snprintf(tid_next[attempt], sizeof(tid_next[attempt]), "tx-next-%d", attempt);
		st1 = stats(P.e);
		uint32_t s2[2] = {9, 10}, d2[2] = {11, 12};
		push_moriio(&P, &D, tid_next[attempt], s2, d2, 2);
		sn = (struct seen){.tid = tid_next[attempt], .transfer = -1};
		cr_assert(wait_for(P.e, &sn, true));
		if (sn.transfer == KVX_CPL_DONE)
			break;
		cr_assert(!abort && sn.transfer == KVX_CPL_FAILED && (sn.error == -ETIMEDOUT || sn.error == -ECONNRESET),
			  "next status %d error %d", sn.transfer, sn.error);
		failed_first++;
	}
	cr_assert_eq(sn.transfer, KVX_CPL_DONE, "next status %d error %d", sn.transfer, sn.error);
	st2 = stats(P.e);
	for (uint32_t k = 0; k < 2; k++)
		cr_assert_eq(st2.lcores[k].bytes - st1.lcores[k].bytes, 2ull * 2 * BLK, "lcore %u", k);
	cr_assert_eq(st2.transfers_done, 2);
	cr_assert_eq(st2.transfers_failed, failed_first + (op_deadline ? 1 : 0));
	cr_assert_eq(abort ? st2.transfers_aborted : st2.transfers_timed_out, op_deadline ? 0u : 1u);
	eng_free(&P);
	cr_assert_eq(io_all(b[1], "q", 1, true), 0);
	cr_assert_eq(waitpid(pid, &wst, 0), pid);
	cr_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "consumer child failed (status 0x%x)", wst);
	close(a[0]);
	close(b[1]);
}

Test(runtime_spread, abort_with_helper_ops_outstanding_terminal_then_released)
{
	outstanding_case(true);
}

Test(runtime_spread, timeout_with_helper_ops_outstanding_terminal_then_released)
{
	outstanding_case(false);
}
