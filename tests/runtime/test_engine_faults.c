/* SPDX-License-Identifier: Apache-2.0 */
/* Fault scenarios of issue #6 at the engine level, through the public engine API only
 * (include/kvxfer/engine.h): two real engines in this process on loopback (real libzmq control
 * sockets, real tcp provider, split K/V host layers), and where a scenario needs a MoRIIO-style
 * process that the engine API cannot impersonate (the decode scheduler sending `remote_blocks`,
 * a worker repeating `write_done`), a real libzmq DEALER speaking the docs/protocol.md §3.2 wire
 * format. Scenarios: (a) request ids rewritten so that two transfers share one — completions
 * and bytes keyed by transfer id; (b) `write_done` before the consumer registered the transfer
 * — parked, then applied at registration; (h) a consumer block more than the producer, paired
 * by token position in READ; (i) a chunked-prefill step that adds no block (duplicate ready
 * marks keep the layer's gate); (j) duplicate transfer ids in WRITE mode; (d) in WRITE mode: a
 * consumer whose producer never writes times out, releases P and keeps its blocks quarantined
 * until P answers. (c)–(g) and (j) in READ mode are in test_engine.c; (h) in WRITE mode in
 * test_engine_e2e.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "engine_test_util.h"
#include "kvxfer/layout.h"

TestSuite(runtime_engine_faults, .timeout = 120.0);

static struct kvx_engine_peer peer_of(const struct et_eng *g)
{
	return (struct kvx_engine_peer){.host = "127.0.0.1", .handshake_port = g->hs, .notify_port = g->nt};
}

/* P WRITE: begin a push of @p src to @p d, every layer ready now, sealed. */
static void push_ready(struct et_eng *p, const struct et_eng *d, const char *tid, const uint32_t *src, size_t n)
{
	struct kvx_engine_write w = {.transfer_id = tid, .peer = peer_of(d), .local_blocks = src, .n = n};
	cr_assert_eq(kvx_xfer_write_begin(p->e, &w), 0, "write_begin %s", tid);
	for (uint32_t l = 0; l < ET_NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready(p->e, tid, l, NULL), 0);
	cr_assert_eq(kvx_xfer_seal(p->e, tid, ET_NL), 0);
}

/* What the decode scheduler (DS) sends each producer worker (docs/protocol.md §3.2). */
static struct kvx_msg_notify remote_blocks(const char *req_id, const char *tid, uint32_t *ids, uint32_t n)
{
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_REMOTE_BLOCKS;
	snprintf(m.req_id, sizeof(m.req_id), "%s", req_id);
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	m.block_ids = ids;
	m.num_blocks = n;
	m.decode_rank = 0;
	return m;
}

static struct kvx_engine_stats stats(struct kvx_engine *e)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st;
}

static bool one_late_notification(struct kvx_engine *e, void *arg)
{
	(void)arg;
	return stats(e).late_notifications >= 1;
}

/* The control lcore counts a notification when its DEALER takes it, after the poller's
 * completion: wait for the count instead of reading it once. */
static bool sent_at_least(struct kvx_engine *e, void *arg)
{
	return stats(e).notifications_sent >= *(const uint64_t *)arg;
}

/* Bytes one block pair moves: every layer, K and V plane. */
#define PAIR_BYTES ((uint64_t)ET_NL * 2 * ET_BLOCK)

Test(runtime_engine_faults, a_request_ids_rewritten_completions_keyed_by_transfer_id)
{
	/* vLLM's input processor rewrites request ids (docs/protocol.md §5.1): tx-a1's request started as
	 * "cmpl-7-0-1a2b3c4d" and is now "cmpl-7", which is also tx-a2's request id. The decode
	 * scheduler's remote_blocks carry that one request id for both transfers; everything must
	 * still be matched by transfer id: each transfer's blocks go to its own destination and
	 * each completion names its own transfer. */
	struct et_eng P, D;
	et_pair_start(&P, &D, KVX_SCHED_MODE_WRITE);
	const uint32_t src1[1] = {1}, src2[2] = {2, 5};
	uint32_t dst1[1] = {3}, dst2[2] = {9, 4};
	push_ready(&P, &D, "tx-a1", src1, 1);
	push_ready(&P, &D, "tx-a2", src2, 2);
	struct et_dealer ds;
	et_dealer_open(&ds, P.nt);
	struct kvx_msg_notify m1 = remote_blocks("cmpl-7", "tx-a1", dst1, 1);
	struct kvx_msg_notify m2 = remote_blocks("cmpl-7", "tx-a2", dst2, 2);
	et_dealer_send(&ds, &m1);
	et_dealer_send(&ds, &m2);
	et_dealer_close(&ds);

	struct et_track tp = {.n = 0};
	size_t k1 = et_follow(&tp, "tx-a1"), k2 = et_follow(&tp, "tx-a2");
	et_expect_done(P.e, &tp, "tx-a1", true);
	et_expect_done(P.e, &tp, "tx-a2", true);
	cr_assert_eq(tp.bytes[k1], 1 * PAIR_BYTES);
	cr_assert_eq(tp.bytes[k2], 2 * PAIR_BYTES);
	cr_assert_eq(tp.released[k1], 1);
	cr_assert_eq(tp.released[k2], 1);
	cr_assert_eq(et_bytes_moved(P.e), 3 * PAIR_BYTES);

	/* D registers both transfers now; their write_done (keyed by transfer id) completes them. */
	struct kvx_engine_announce a1 = {.transfer_id = "tx-a1", .peer = peer_of(&P), .local_blocks = dst1, .n = 1};
	struct kvx_engine_announce a2 = {.transfer_id = "tx-a2", .peer = peer_of(&P), .local_blocks = dst2, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &a1), 0);
	cr_assert_eq(kvx_xfer_announce(D.e, &a2), 0);
	struct et_track td = {.n = 0};
	size_t d1 = et_follow(&td, "tx-a1"), d2 = et_follow(&td, "tx-a2");
	et_expect_done(D.e, &td, "tx-a1", false);
	et_expect_done(D.e, &td, "tx-a2", false);
	cr_assert_eq(td.released[d1] + td.released[d2], 0, "a done consumer transfer keeps its blocks");
	const uint32_t dst[3] = {3, 9, 4}, src[3] = {1, 2, 5};
	et_expect_blocks(&D, dst, src, 3, true);
	cr_assert_eq(stats(D.e).transfers_done, 2);
	et_pair_free(&P, &D);
}

Test(runtime_engine_faults, b_write_done_before_registration_parked_then_applied)
{
	/* The producer writes and sends write_done before the consumer registered the transfer
	 * (the decode scheduler sent remote_blocks ahead of the decode worker). D must park the
	 * write_done and complete the transfer when it is announced, without asking P again. */
	struct et_eng P, D;
	et_pair_start(&P, &D, KVX_SCHED_MODE_WRITE);
	const uint32_t src[2] = {4, 5};
	uint32_t dst[2] = {6, 7};
	push_ready(&P, &D, "tx-b", src, 2);
	struct et_dealer ds;
	et_dealer_open(&ds, P.nt);
	struct kvx_msg_notify rb = remote_blocks("cmpl-b", "tx-b", dst, 2);
	et_dealer_send(&ds, &rb);
	et_dealer_close(&ds);
	struct et_track tp = {.n = 0};
	et_follow(&tp, "tx-b");
	et_expect_done(P.e, &tp, "tx-b", true);
	const uint64_t one = 1;
	cr_assert(et_wait_until(P.e, &tp, sent_at_least, (void *)&one));
	cr_assert_eq(stats(P.e).notifications_sent, 1, "one write_done");

	/* A second write_done for tx-b (a repeated notify) is the barrier: whichever of the two D
	 * handles second is dropped as late, so once one late notification is counted D has
	 * handled both, the first of them parked. */
	struct et_dealer pw;
	et_dealer_open(&pw, D.nt);
	struct kvx_msg_notify wd;
	memset(&wd, 0, sizeof(wd));
	wd.type = KVX_MSG_WRITE_DONE;
	strcpy(wd.transfer_id, "tx-b");
	et_dealer_send(&pw, &wd);
	et_dealer_close(&pw);
	struct et_track td = {.n = 0};
	size_t kd = et_follow(&td, "tx-b");
	cr_assert(et_wait_until(D.e, &td, one_late_notification, NULL), "D never handled both write_done frames");
	struct kvx_engine_stats st = stats(D.e);
	cr_assert_eq(st.late_notifications, 1);
	cr_assert_eq(st.notifications_received, 2);
	cr_assert_eq(td.status[kd], -1, "no completion before the transfer is registered");
	et_expect_blocks(&D, dst, src, 2, true); /* P's bytes are there already */

	/* Registration applies the parked write_done: DONE at once, no remote_blocks sent. */
	struct kvx_engine_announce an = {.transfer_id = "tx-b", .peer = peer_of(&P), .local_blocks = dst, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	et_expect_done(D.e, &td, "tx-b", false);
	cr_assert_eq(td.error[kd], 0);
	cr_assert_eq(td.released[kd], 0);
	st = stats(D.e);
	cr_assert_eq(st.notifications_sent, 0, "the parked write_done made remote_blocks unnecessary");
	cr_assert_eq(st.transfers_done, 1);
	cr_assert_eq(kvx_xfer_announce(D.e, &an), -EEXIST, "one-shot transfer id");
	et_pair_free(&P, &D);
}

Test(runtime_engine_faults, h_read_consumer_extra_block_paired_by_token_position)
{
	/* D has 1 block prefix-cached and allocated 3 new blocks (the first generated token needs
	 * one more block than the prompt's 3 on P). Pairing by token position reads P's blocks
	 * 2..3 of the prompt into D's first two new blocks; D's third new block is left alone. */
	struct et_eng P, D;
	et_pair_start(&P, &D, KVX_SCHED_MODE_READ);
	const uint32_t prompt[3] = {8, 2, 11}, fresh[3] = {5, 6, 7};
	size_t start = 99;
	size_t pairs = kvx_plan_pair_by_position(3, 3, 1, &start);
	cr_assert_eq(pairs, 2);
	cr_assert_eq(start, 1);
	struct kvx_engine_serve sv = {.transfer_id = "tx-h", .local_blocks = prompt, .n = 3};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	struct kvx_engine_read r = {.transfer_id = "tx-h", .peer = peer_of(&P), .local_blocks = fresh,
				    .remote_blocks = prompt + start, .n = pairs};
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	struct et_track td = {.n = 0}, tp = {.n = 0};
	size_t kd = et_follow(&td, "tx-h"), kp = et_follow(&tp, "tx-h");
	et_expect_done(D.e, &td, "tx-h", false);
	cr_assert_eq(td.bytes[kd], 2 * PAIR_BYTES);
	et_expect_done(P.e, &tp, "tx-h", true);
	cr_assert_eq(tp.released[kp], 1);
	et_expect_blocks(&D, fresh, (const uint32_t[]){2, 11}, 2, true); /* block 7 (and all others) zero */
	et_pair_free(&P, &D);
}

Test(runtime_engine_faults, i_chunk_adding_no_block_keeps_layer_gates_and_one_write_done)
{
	/* Chunked prefill: chunk 1 allocated the blocks and marked each layer ready behind a host
	 * flag (the layer's compute is not finished); chunk 2 adds no block and marks the layers
	 * again with no gate. Those marks are duplicates: they must not open the gates early, and
	 * the sealed transfer writes each layer once and sends one write_done. */
	struct et_eng P, D;
	et_pair_start(&P, &D, KVX_SCHED_MODE_WRITE);
	const uint32_t src[2] = {1, 2}, dst[2] = {10, 11}, src2[1] = {3}, dst2[1] = {12};
	struct kvx_engine_announce an = {.transfer_id = "tx-i", .peer = peer_of(&P), .local_blocks = dst, .n = 2};
	struct kvx_engine_announce an2 = {.transfer_id = "tx-i2", .peer = peer_of(&P), .local_blocks = dst2, .n = 1};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	cr_assert_eq(kvx_xfer_announce(D.e, &an2), 0);
	struct kvx_engine_write w = {.transfer_id = "tx-i", .peer = peer_of(&D), .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	static atomic_uint gate[ET_NL];
	for (uint32_t l = 0; l < ET_NL; l++) {
		atomic_store(&gate[l], 0);
		cr_assert_eq(kvx_xfer_layer_ready(P.e, "tx-i", l, &gate[l]), 0); /* chunk 1 */
	}
	for (uint32_t l = 0; l < ET_NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready(P.e, "tx-i", l, NULL), 0); /* chunk 2: no new block */
	cr_assert_eq(kvx_xfer_seal(P.e, "tx-i", ET_NL), 0);
	/* An ungated transfer submitted after them on the same (single) poller is the barrier: when
	 * it is done, the duplicate marks were handled. */
	push_ready(&P, &D, "tx-i2", src2, 1);
	struct et_track tp = {.n = 0}, td = {.n = 0};
	size_t p1 = et_follow(&tp, "tx-i");
	et_follow(&tp, "tx-i2");
	et_follow(&td, "tx-i");
	et_follow(&td, "tx-i2");
	et_expect_done(P.e, &tp, "tx-i2", true);
	et_expect_done(D.e, &td, "tx-i2", false);
	cr_assert_eq(tp.status[p1], -1, "tx-i finished with its layers still gated");
	cr_assert_eq(et_bytes_moved(P.e), 1 * PAIR_BYTES, "only tx-i2 moved bytes");
	et_expect_blocks(&D, dst2, src2, 1, true); /* blocks 10 and 11 still zero */

	for (uint32_t l = 0; l < ET_NL; l++)
		atomic_store_explicit(&gate[l], 1, memory_order_release); /* layer compute finished */
	et_expect_done(P.e, &tp, "tx-i", true);
	cr_assert_eq(tp.bytes[p1], 2 * PAIR_BYTES, "each layer written once");
	et_expect_done(D.e, &td, "tx-i", false);
	cr_assert_eq(et_bytes_moved(P.e), 3 * PAIR_BYTES);
	const uint64_t two = 2;
	cr_assert(et_wait_until(P.e, &tp, sent_at_least, (void *)&two));
	cr_assert_eq(stats(P.e).notifications_sent, 2, "one write_done per transfer");
	et_expect_blocks(&D, (const uint32_t[]){10, 11, 12}, (const uint32_t[]){1, 2, 3}, 3, true);
	et_pair_free(&P, &D);
}

Test(runtime_engine_faults, j_write_duplicate_transfer_id_rejected_first_intact)
{
	/* WRITE mode: a second announce / write_begin with a live transfer id is refused with
	 * -EEXIST and leaves the first transfer's blocks and completion untouched. */
	struct et_eng P, D;
	et_pair_start(&P, &D, KVX_SCHED_MODE_WRITE);
	const uint32_t src[2] = {6, 7}, dst[2] = {0, 15}, other[2] = {8, 9};
	struct kvx_engine_announce an = {.transfer_id = "tx-j", .peer = peer_of(&P), .local_blocks = dst, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	an.local_blocks = other;
	cr_assert_eq(kvx_xfer_announce(D.e, &an), -EEXIST);
	struct kvx_engine_write w = {.transfer_id = "tx-j", .peer = peer_of(&D), .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	w.local_blocks = other;
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), -EEXIST);
	for (uint32_t l = 0; l < ET_NL; l++)
		cr_assert_eq(kvx_xfer_layer_ready(P.e, "tx-j", l, NULL), 0);
	cr_assert_eq(kvx_xfer_seal(P.e, "tx-j", ET_NL), 0);
	struct et_track tp = {.n = 0}, td = {.n = 0};
	size_t kp = et_follow(&tp, "tx-j");
	et_follow(&td, "tx-j");
	et_expect_done(P.e, &tp, "tx-j", true);
	et_expect_done(D.e, &td, "tx-j", false);
	cr_assert_eq(tp.bytes[kp], 2 * PAIR_BYTES);
	et_expect_blocks(&D, dst, src, 2, true); /* 8 and 9 untouched */
	cr_assert_eq(stats(P.e).duplicates_rejected, 1);
	cr_assert_eq(stats(D.e).duplicates_rejected, 1);
	/* Still one-shot after completion. */
	an.local_blocks = dst;
	cr_assert_eq(kvx_xfer_announce(D.e, &an), -EEXIST);
	et_pair_free(&P, &D);
}

static bool received_at_least(struct kvx_engine *e, void *arg)
{
	return stats(e).notifications_received >= *(const uint64_t *)arg;
}

Test(runtime_engine_faults, d_write_consumer_times_out_releases_producer_blocks_quarantined)
{
	/* WRITE: D announced, P never begins within D's transfer timeout (docs/protocol.md §6 item 10:
	 * vLLM's D waits forever here). D reports TIMED_OUT within its timeout and tells P
	 * (`release`); its blocks stay quarantined, since P may still be writing, until P answers.
	 * P, beginning late, sees the release, writes nothing and answers; only then are D's blocks
	 * released. */
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	et_params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	et_params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	dp.transfer_timeout_ms = 300;
	dp.defer_timeout_ms = 60000;
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	const uint32_t dst[2] = {2, 3}, src[2] = {4, 5};
	struct kvx_engine_announce an = {.transfer_id = "tx-dw", .peer = peer_of(&P), .local_blocks = dst, .n = 2};
	uint64_t t0 = kvx_now_ns();
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	struct et_track td = {.n = 0}, tp = {.n = 0};
	size_t kd = et_follow(&td, "tx-dw");
	cr_assert(et_wait(D.e, &td, "tx-dw", false));
	uint64_t took = kvx_now_ns() - t0;
	cr_assert_eq(td.status[kd], KVX_CPL_TIMED_OUT, "status %d error %d", td.status[kd], td.error[kd]);
	cr_assert_eq(td.error[kd], -ETIMEDOUT);
	cr_assert_geq(took, 300000000ull, "timed out early (%llu ns)", (unsigned long long)took);
	cr_assert_lt(took, 60000000000ull, "hung: timed out %llu ns after the announce", (unsigned long long)took);
	cr_assert_eq(td.released[kd], 0, "blocks released while P could still write");
	/* P got remote_blocks, then release. */
	const uint64_t two = 2;
	cr_assert(et_wait_until(P.e, &tp, received_at_least, (void *)&two), "P never got remote_blocks + release");
	et_pump(D.e, &td);
	cr_assert_eq(td.released[kd], 0, "blocks released before P answered");
	/* P begins late: nothing is written, D's blocks come out of quarantine. */
	struct kvx_engine_write w = {.transfer_id = "tx-dw", .peer = peer_of(&D), .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	size_t kp = et_follow(&tp, "tx-dw");
	cr_assert(et_wait(P.e, &tp, "tx-dw", true));
	cr_assert_eq(tp.status[kp], KVX_CPL_ABORTED, "status %d error %d", tp.status[kp], tp.error[kp]);
	cr_assert_eq(tp.bytes[kp], 0);
	cr_assert(et_wait(D.e, &td, "tx-dw", true));
	cr_assert_eq(td.released[kd], 1);
	cr_assert_eq(et_bytes_moved(P.e), 0);
	et_expect_blocks(&D, NULL, NULL, 0, true); /* all of D still zero */
	cr_assert_eq(stats(D.e).transfers_timed_out, 1);
	et_pair_free(&P, &D);
}
