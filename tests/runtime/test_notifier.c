/* SPDX-License-Identifier: Apache-2.0 */
/* The scheduler-side notifier (kvx_notifier_*, include/kvxfer/engine.h) with real engines on
 * loopback: the decode scheduler sends `remote_blocks` / `release`, the decode workers only await
 * `write_done` (kvx_engine_announce.notified), as MoRIIO splits it (docs/protocol.md §1.3 step 5b).
 * Also TP 2 -> TP 2 WRITE with fixed base ports (rank r listens on base + r). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_test_util.h"

TestSuite(runtime_notifier, .timeout = 120.0);

static struct kvx_notifier *notifier(uint32_t tp_size)
{
	struct kvx_engine_params p;
	et_params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	p.tp_size = tp_size;
	struct kvx_notifier *n = NULL;
	char err[256] = "";
	cr_assert_eq(kvx_notifier_create(&p, &n, err, sizeof(err)), 0, "%s", err);
	return n;
}

static struct kvx_engine_peer peer_of(const struct et_eng *g)
{
	return (struct kvx_engine_peer){.host = "127.0.0.1", .handshake_port = g->hs, .notify_port = g->nt};
}

/* P WRITE: push src[n] of every layer to the transfer's destination. */
static void push_all(struct et_eng *p, const char *tid, const struct et_eng *d, const uint32_t *src, size_t n)
{
	struct kvx_engine_write w = {.transfer_id = tid, .peer = peer_of(d), .local_blocks = src, .n = n};
	cr_assert_eq(kvx_xfer_write_begin(p->e, &w), 0);
	for (uint32_t l = 0; l < ET_NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready(p->e, tid, l, NULL), 0);
	cr_assert_eq(kvx_xfer_seal(p->e, tid, ET_NL), 0);
}

static uint64_t notes_sent(struct kvx_engine *e)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st.notifications_sent;
}

static bool received_one(struct kvx_engine *e, void *arg)
{
	(void)arg;
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st.notifications_received >= 1;
}

/* The scheduler's remote_blocks reaches P, P writes and answers the worker with write_done;
 * the worker's engine (notified) sends nothing and completes DONE with P's bytes in place. */
Test(runtime_notifier, scheduler_sends_remote_blocks_worker_awaits_write_done)
{
	struct et_eng p, d;
	et_pair_start(&p, &d, KVX_SCHED_MODE_WRITE);
	struct kvx_notifier *n = notifier(1);
	const uint32_t src[3] = {3, 5, 9}, dst[3] = {1, 2, 7};
	struct et_track tp = {0}, td = {0};
	et_follow(&tp, "tx-n1");
	et_follow(&td, "tx-n1");
	push_all(&p, "tx-n1", &d, src, 3);
	struct kvx_engine_announce a = {.transfer_id = "tx-n1", .peer = peer_of(&p), .local_blocks = dst, .n = 3,
					.notified = true};
	cr_assert_eq(kvx_xfer_announce(d.e, &a), 0);
	cr_assert_eq(kvx_notifier_announce(n, &a, "cmpl-req-1"), 0);
	et_expect_done(d.e, &td, "tx-n1", false);
	et_expect_done(p.e, &tp, "tx-n1", true);
	et_expect_blocks(&d, dst, src, 3, true);
	cr_assert_eq(notes_sent(d.e), 0, "the worker's engine sent a notification");
	kvx_notifier_destroy(n);
	et_pair_free(&p, &d);
}

/* vLLM may hand the worker its load after P already finished (the scheduler sent remote_blocks
 * in an earlier step): the early write_done is kept, and the announce completes DONE at once. */
Test(runtime_notifier, write_done_before_the_worker_announces)
{
	struct et_eng p, d;
	et_pair_start(&p, &d, KVX_SCHED_MODE_WRITE);
	struct kvx_notifier *n = notifier(1);
	const uint32_t src[2] = {4, 6}, dst[2] = {8, 0};
	struct et_track tp = {0}, td = {0};
	et_follow(&tp, "tx-n2");
	et_follow(&td, "tx-n2");
	push_all(&p, "tx-n2", &d, src, 2);
	struct kvx_engine_announce a = {.transfer_id = "tx-n2", .peer = peer_of(&p), .local_blocks = dst, .n = 2,
					.notified = true};
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), 0);
	et_expect_done(p.e, &tp, "tx-n2", true); /* write_done was sent to D ... */
	cr_assert(et_wait_until(d.e, &td, received_one, NULL), "write_done never reached D"); /* ... and taken in */
	cr_assert_eq(kvx_xfer_announce(d.e, &a), 0);
	et_expect_done(d.e, &td, "tx-n2", false);
	et_expect_blocks(&d, dst, src, 2, true);
	kvx_notifier_destroy(n);
	et_pair_free(&p, &d);
}

/* A request aborted before allocation: the scheduler's `release` ends P's push transfer
 * (ABORTED) and frees its blocks; nothing was written to D. */
Test(runtime_notifier, scheduler_release_frees_the_producer)
{
	struct et_eng p, d;
	et_pair_start(&p, &d, KVX_SCHED_MODE_WRITE);
	struct kvx_notifier *n = notifier(1);
	const uint32_t src[2] = {1, 2};
	struct et_track tp = {0};
	size_t i = et_follow(&tp, "tx-n3");
	struct kvx_engine_write w = {.transfer_id = "tx-n3", .peer = peer_of(&d), .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(p.e, &w), 0);
	struct kvx_engine_announce a = {.transfer_id = "tx-n3", .peer = peer_of(&p)};
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), 0);
	cr_assert(et_wait(p.e, &tp, "tx-n3", true), "producer not released");
	cr_assert_eq(tp.status[i], KVX_CPL_ABORTED);
	cr_assert_eq(tp.error[i], -ECANCELED);
	et_expect_blocks(&d, NULL, NULL, 0, true);
	kvx_notifier_destroy(n);
	et_pair_free(&p, &d);
}

Test(runtime_notifier, bad_params_and_arguments)
{
	struct kvx_engine_params p;
	struct kvx_notifier *n = NULL;
	char err[256] = "";
	et_params(&p, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	cr_assert_eq(kvx_notifier_create(&p, &n, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "role/mode"), "%s", err);
	et_params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	cr_assert_eq(kvx_notifier_create(&p, &n, err, sizeof(err)), -EINVAL);
	et_params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	p.dp_rank = 1;
	cr_assert_eq(kvx_notifier_create(&p, &n, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "dp_rank"), "%s", err);
	cr_assert_null(n);
	n = notifier(1);
	const uint32_t ok[1] = {1}, big[1] = {0x80000000u};
	struct kvx_engine_announce a = {.transfer_id = "",
					.peer = {.host = "127.0.0.1", .handshake_port = 1, .notify_port = 2},
					.local_blocks = ok, .n = 1};
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), -EINVAL, "empty transfer id");
	a.transfer_id = "tx-bad";
	a.n = ET_NB + 1;
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), -EINVAL, "more than max_blocks");
	a.n = 1;
	a.local_blocks = big;
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), -EINVAL, "block id above INT32_MAX");
	a.local_blocks = NULL;
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), -EINVAL, "NULL blocks");
	a.local_blocks = ok;
	char rid[600];
	memset(rid, 'r', sizeof(rid) - 1);
	rid[sizeof(rid) - 1] = 0;
	cr_assert_eq(kvx_notifier_announce(n, &a, rid), -EINVAL, "req_id over 511 bytes");
	a.peer.host = NULL;
	cr_assert_eq(kvx_notifier_announce(n, &a, NULL), -EINVAL, "no peer host");
	kvx_notifier_destroy(n);
	kvx_notifier_destroy(NULL);
	/* a worker announce that was notified must carry blocks */
	struct et_eng pe, de;
	et_pair_start(&pe, &de, KVX_SCHED_MODE_WRITE);
	struct kvx_engine_announce z = {.transfer_id = "tx-z", .peer = peer_of(&pe), .notified = true};
	cr_assert_eq(kvx_xfer_announce(de.e, &z), -EINVAL);
	et_pair_free(&pe, &de);
}

/* TP 2 instances on fixed base ports (rank r on base + r): both ranks of each side. */
struct tp2 {
	struct et_eng r[2];
};

static void tp2_start(struct tp2 *g, enum kvx_sched_role role, bool pattern)
{
	srand((unsigned)getpid() ^ (unsigned)role);
	for (int attempt = 0; attempt < 40; attempt++) {
		uint16_t base = (uint16_t)(20000 + (unsigned)(rand() % 20000) * 2);
		int rc = 0;
		int r;
		for (r = 0; r < 2 && !rc; r++) {
			struct kvx_engine_params p;
			et_params(&p, role, KVX_SCHED_MODE_WRITE);
			p.tp_size = 2;
			p.tp_rank = (uint32_t)r;
			p.handshake_port = base;
			p.notify_port = (uint16_t)(base + 2);
			et_create(&g->r[r], &p, pattern);
			rc = et_start_layers(&g->r[r]);
		}
		if (!rc) {
			cr_assert_eq(g->r[1].hs, g->r[0].hs + 1);
			cr_assert_eq(g->r[1].nt, g->r[0].nt + 1);
			return;
		}
		cr_assert_eq(rc, -EADDRINUSE, "engine start: %d", rc);
		for (int k = 0; k < r; k++)
			et_free(&g->r[k]);
	}
	cr_assert_fail("no free port range in 40 attempts");
}

/* Rank 1 of a patterned producer holds other bytes than rank 0 (its own heads). */
static void tp2_mark_rank1(struct tp2 *g)
{
	for (uint32_t l = 0; l < ET_NL; l++)
		for (uint32_t pl = 0; pl < 2; pl++)
			for (uint32_t b = 0; b < ET_NB; b++)
				memset(et_block(&g->r[1], l, pl, b), et_pattern(l, pl, b) ^ 0x80, ET_BLOCK);
}

/* WRITE P TP 2 -> D TP 2: one `remote_blocks` per P rank (from the scheduler's notifier, or from
 * D rank 0's engine), each P rank writes its bytes to the D rank of the same index and sends it
 * write_done; both D ranks complete DONE with their peer rank's bytes. */
static void tp2_write(bool scheduler_sends)
{
	struct tp2 P, D;
	tp2_start(&P, KVX_SCHED_PRODUCER, true);
	tp2_mark_rank1(&P);
	tp2_start(&D, KVX_SCHED_CONSUMER, false);
	struct kvx_notifier *n = scheduler_sends ? notifier(2) : NULL;
	const uint32_t src[2] = {2, 11}, dst[2] = {5, 6};
	struct et_track tp[2], td[2];
	memset(tp, 0, sizeof(tp));
	memset(td, 0, sizeof(td));
	for (int r = 0; r < 2; r++) {
		et_follow(&tp[r], "tx-tp2");
		et_follow(&td[r], "tx-tp2");
		push_all(&P.r[r], "tx-tp2", &D.r[0], src, 2);
	}
	struct kvx_engine_announce a = {.transfer_id = "tx-tp2", .peer = peer_of(&P.r[0]), .local_blocks = dst, .n = 2,
					.notified = scheduler_sends};
	if (n)
		cr_assert_eq(kvx_notifier_announce(n, &a, "cmpl-tp2"), 0);
	for (int r = 0; r < 2; r++)
		cr_assert_eq(kvx_xfer_announce(D.r[r].e, &a), 0);
	for (int r = 0; r < 2; r++) {
		et_expect_done(D.r[r].e, &td[r], "tx-tp2", false);
		et_expect_done(P.r[r].e, &tp[r], "tx-tp2", true);
	}
	for (uint32_t l = 0; l < ET_NL; l++)
		for (uint32_t pl = 0; pl < 2; pl++)
			for (int i = 0; i < 2; i++)
				for (int r = 0; r < 2; r++)
					cr_assert_eq(memcmp(et_block(&D.r[r], l, pl, dst[i]), et_block(&P.r[r], l, pl, src[i]),
							    ET_BLOCK),
						     0, "D rank %d layer %u plane %u block %u", r, l, pl, dst[i]);
	kvx_notifier_destroy(n);
	for (int r = 0; r < 2; r++) {
		et_free(&D.r[r]);
		et_free(&P.r[r]);
	}
}

Test(runtime_notifier, tp2_write_remote_blocks_from_the_scheduler) { tp2_write(true); }
Test(runtime_notifier, tp2_write_remote_blocks_from_decode_rank0) { tp2_write(false); }
