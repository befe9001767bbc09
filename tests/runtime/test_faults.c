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
	/* A duplicate write_done changes nothing. */
	cr_assert_eq(kvx_xfer_resolve_ack(t, y, 1, 1), 0);
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
}

Test(runtime_faults, e_consumer_abort_quarantines_until_write_done_or_defer_timeout)
{
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
