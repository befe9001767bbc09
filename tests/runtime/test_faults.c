/* SPDX-License-Identifier: Apache-2.0 */
/* Fault scenarios of the runtime issue at the level of the per-transfer state the polling
 * lcores keep (runtime/xfer.c) and of the planner. The engine-level side of every scenario
 * (a-j, with real engines and sockets) is in test_engine.c and test_engine_faults.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/layout.h"
#include "runtime/runtime_internal.h"

TestSuite(runtime_faults, .timeout = 30.0);

static struct kvx_xfer_table *table(void)
{
	struct kvx_xfer_table *t;
	cr_assert_eq(kvx_xfer_table_create(8, 4, &t), 0);
	return t;
}

Test(runtime_faults, b_write_done_before_registration_parked_then_applied)
{
	struct kvx_xfer_out o;
	/* D's poller gets write_done for a transfer whose announcement it has not processed yet:
	 * the entry is opened (parked) and the fan-in completes it; the submission that follows
	 * finds it terminal and complete (the engine then reports DONE at once). */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x, *y;
	cr_assert_eq(kvx_xfer_open(t, "tx-b", &x), 0);
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 1, 1), 1);
	cr_assert_eq(kvx_xfer_open(t, "tx-b", &y), -EEXIST);
	y = kvx_xfer_find(t, "tx-b");
	cr_assert_eq(y, x);
	cr_assert_eq(y->state, KVX_XFER_S_TERMINAL);
	cr_assert(y->ack_completed);
	kvx_xfer_on_submit(KVX_XFER_K_ANNOUNCE, 2, y, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE, "DONE at once, no remote_blocks");
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* A duplicate write_done changes nothing. */
	cr_assert_eq(kvx_xfer_resolve_ack(t, y, 1, 1), 0);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, c_full_prefix_hit_read_releases_without_rdma)
{
	/* D READ with nothing to move: P is released at once, DONE, nothing posted. */
	struct kvx_xfer_out o;
	kvx_xfer_on_submit(KVX_XFER_K_READ, 0, NULL, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* D WRITE with nothing to receive: every P rank is released, no remote_blocks. */
	kvx_xfer_on_submit(KVX_XFER_K_ANNOUNCE, 0, NULL, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	/* With blocks: a READ posts, an announcement sends remote_blocks and waits. */
	kvx_xfer_on_submit(KVX_XFER_K_READ, 4, NULL, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_PROGRESS);
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-c", &x), 0);
	kvx_xfer_on_submit(KVX_XFER_K_ANNOUNCE, 4, x, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_BLOCKS);
	/* P READ: the consumer's release came first (parked): DONE at submission. */
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 1, 1), 1);
	kvx_xfer_on_submit(KVX_XFER_K_SERVE, 4, x, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* P WRITE: D's release came first (D aborted): nothing written, write_done tells D so. */
	kvx_xfer_on_submit(KVX_XFER_K_WRITE, 4, x, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, d_read_producer_silent_times_out_at_the_transfer_timeout)
{
	/* D READ, transfer timeout 30 from start 100: not yet at 130, timed out at 131; the
	 * producer's defer timeout (60) plays no part on the consumer. */
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_READ, false, false, 100, 0, 130, 30, 60), KVX_XFER_TICK_NONE);
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_READ, false, false, 100, 0, 131, 30, 60), KVX_XFER_TICK_TIMED_OUT);
	/* Once reported, later ticks do nothing (a consumer READ is released by its ops, not the
	 * clock). */
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_READ, true, false, 100, 0, 500, 30, 60), KVX_XFER_TICK_NONE);
	/* Timed out with nothing posted: the blocks are freed and P gets no late release. */
	struct kvx_xfer_out o;
	kvx_xfer_read_settle(true, false, false, false, false, false, 0, 0, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_RELEASE);
	/* Timed out after posting: once the ops are terminal, P is released (once). */
	kvx_xfer_read_settle(true, false, true, false, false, false, 0, 1, &o);
	cr_assert_eq(o.act, 0);
	kvx_xfer_read_settle(true, false, true, false, false, false, 0, 0, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_RELEASE);
	kvx_xfer_read_settle(true, false, true, true, false, false, 0, 0, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_RELEASE);
}

Test(runtime_faults, e_consumer_abort_quarantines_until_write_done_or_defer_timeout)
{
	/* D WRITE abort: every P rank is told to stop, ABORTED is reported, the blocks are held. */
	struct kvx_xfer_out o;
	kvx_xfer_on_abort(NULL, KVX_XFER_K_ANNOUNCE, NULL, 0, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE | KVX_XFER_DO_REPORT);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	/* P's write_done then completes the fan-in: the poller releases the blocks (DONE). */
	/* P WRITE abort with writes in flight: stop posting, report, hold until they are terminal. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-e", &x), 0);
	kvx_xfer_on_abort(t, KVX_XFER_K_WRITE, x, 2, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL);
	cr_assert_not(kvx_xfer_schedule_write(x, 0)); /* nothing more is scheduled */
	kvx_xfer_on_abort(t, KVX_XFER_K_WRITE, x, 0, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	/* D READ abort: reported now, P released once its ops are terminal. */
	kvx_xfer_on_abort(t, KVX_XFER_K_READ, NULL, 1, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_PROGRESS);
	kvx_xfer_read_settle(true, true, false, false, false, false, 0, 0, &o);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_RELEASE, "an abort always releases P");
	kvx_xfer_table_destroy(t);

	/* D WRITE aborted (or timed out) at 10 with defer timeout 60: quarantined until 70
	 * inclusive, reusable after it when no write_done came first. */
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_ANNOUNCE, true, false, 0, 70, 70, 30, 60), KVX_XFER_TICK_NONE);
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_ANNOUNCE, true, false, 0, 70, 71, 30, 60),
		     KVX_XFER_TICK_QUARANTINE_OVER);
	/* Only D WRITE has a quarantine deadline on the clock. */
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_SERVE, true, false, 0, 70, 71, 30, 60), KVX_XFER_TICK_NONE);
}

Test(runtime_faults, f_producer_holds_blocks_for_the_defer_timeout)
{
	/* P READ (serve) and P WRITE before D's allocation hold blocks for a peer: their limit is
	 * the defer timeout (60), not the transfer timeout (30). */
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_SERVE, false, false, 0, 0, 31, 30, 60), KVX_XFER_TICK_NONE);
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_SERVE, false, false, 0, 0, 60, 30, 60), KVX_XFER_TICK_NONE);
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_SERVE, false, false, 0, 0, 61, 30, 60), KVX_XFER_TICK_TIMED_OUT);
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_WRITE, false, false, 0, 0, 31, 30, 60), KVX_XFER_TICK_NONE);
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_WRITE, false, false, 0, 0, 61, 30, 60), KVX_XFER_TICK_TIMED_OUT);
	/* With D's allocation the WRITE is bounded by the transfer timeout. */
	cr_assert_eq(kvx_xfer_tick(KVX_XFER_K_WRITE, false, true, 0, 0, 31, 30, 60), KVX_XFER_TICK_TIMED_OUT);
}

Test(runtime_faults, h_consumer_extra_block_pairs_by_position)
{
	/* P has 4 blocks; D allocated 5 (first token appended): 4 pairs, no error. */
	size_t start;
	cr_assert_eq(kvx_plan_pair_by_position(5, 4, 0, &start), 4);
	cr_assert_eq(start, 0);
	/* Partial hit: 2 cached, P 6 blocks, D 5 new -> local[0..4) <- remote[2..6). */
	cr_assert_eq(kvx_plan_pair_by_position(5, 6, 2, &start), 4);
	cr_assert_eq(start, 2);
	/* The plan for those pairs is in bounds on both sides (MLA [32,4,3], peer num_blocks 8). */
	const uint32_t local[5] = {20, 21, 22, 23, 24};
	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	struct kvx_layout_tensor t = {.ndim = 3, .shape = {32, 4, 3}, .stride = {12, 3, 1}, .elem_size = 2};
	struct kvx_layout_geom g;
	cr_assert_eq(kvx_layout_geometry(&mla, &t, 8, &g, NULL, 0), 0);
	const uint32_t remote[6] = {0, 1, 2, 3, 4, 5};
	uint64_t l[8], r[8], s[8];
	cr_assert_eq(kvx_plan_offsets(&g, local, 4, remote + start, 4, l, r, s, 8), 4);
	cr_assert_eq(l[0], 20 * 24);
	cr_assert_eq(r[0], 2 * 24);
	cr_assert_eq(r[3] + s[3], 6 * 24); /* ends at the peer's last paired block */
}

Test(runtime_faults, i_chunk_without_new_block)
{
	/* A prefill chunk that adds no block re-announces layers already scheduled: each layer
	 * is written once, and write_done is due once, after the sealed count. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-i", &x), 0);
	enum kvx_xfer_action act;
	cr_assert(kvx_xfer_schedule_write(x, 0));
	cr_assert_not(kvx_xfer_schedule_write(x, 0)); /* the chunk without a new block */
	cr_assert_eq(kvx_xfer_seal_count(t, x, 1, &act), 1);
	cr_assert_eq(act, KVX_XFER_ACT_NONE);
	cr_assert_eq(kvx_xfer_mark_write_done(t, x, true), KVX_XFER_ACT_NOTIFY_WRITE_DONE);
	cr_assert_eq(kvx_xfer_mark_write_done(t, x, true), KVX_XFER_ACT_NONE);
	cr_assert_eq(kvx_xfer_seal_count(t, x, 1, &act), -ENOENT);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, j_duplicate_transfer_id_rejected_first_intact)
{
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x, *y;
	cr_assert_eq(kvx_xfer_open(t, "tx-j", &x), 0);
	cr_assert(kvx_xfer_schedule_write(x, 3));
	cr_assert_eq(kvx_xfer_open(t, "tx-j", &y), -EEXIST);
	cr_assert_eq(x->writes_scheduled, 1);
	/* One-shot: the id stays taken once terminal, while it is in the terminal LRU. */
	kvx_xfer_make_terminal(t, x);
	cr_assert_eq(kvx_xfer_open(t, "tx-j", &y), -EEXIST);
	cr_assert_eq(kvx_xfer_open(t, "", &y), -EINVAL);
	kvx_xfer_table_destroy(t);
}
