/* SPDX-License-Identifier: Apache-2.0 */
/* Fault scenarios of the runtime issue at the level of the per-transfer state the polling
 * lcores keep (runtime/xfer.c) and of the planner. The engine-level side of every scenario
 * (a-j, with real engines and sockets) is in test_engine.c and test_engine_faults.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
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

/* One event into a transfer's lifecycle, as its poller feeds it. */
static struct kvx_xfer_out step(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf,
				struct kvx_xfer_ev ev)
{
	struct kvx_xfer_out o;
	memset(&o, 0xa5, sizeof(o));
	kvx_xfer_step(tab, t, lf, &ev, &o);
	return o;
}

/* What the poller does after performing REPORT / RELEASE (its state, not a decision). */
static void performed(struct kvx_life *lf, struct kvx_xfer_out o)
{
	if (o.act & KVX_XFER_DO_REPORT)
		lf->reported = true;
	if (o.act & KVX_XFER_DO_RELEASE)
		lf->released = true;
}

Test(runtime_faults, b_write_done_before_registration_parked_then_applied)
{
	/* D's poller gets write_done for a transfer whose announcement it has not processed yet:
	 * the entry is opened (parked) and the fan-in completes it; the submission that follows
	 * finds it terminal and complete: DONE at once, no remote_blocks sent. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x, *y;
	struct kvx_xfer_ev wd = {.type = KVX_XFER_EV_WRITE_DONE, .consumer_tp = 1, .producer_tp = 1};
	cr_assert_eq(kvx_xfer_open(t, "tx-b", &x), 0);
	struct kvx_xfer_out p = step(t, x, NULL, wd); /* no transfer yet: parked on the entry */
	cr_assert_eq(p.act, 0);
	cr_assert_not(p.late);
	cr_assert(step(t, x, NULL, wd).late, "a second write_done for it is late");
	cr_assert_eq(kvx_xfer_open(t, "tx-b", &y), -EEXIST);
	y = kvx_xfer_find(t, "tx-b");
	cr_assert_eq(y, x);
	cr_assert_eq(y->state, KVX_XFER_S_TERMINAL);
	cr_assert(y->ack_completed);
	struct kvx_life lf = {.kind = KVX_XFER_K_ANNOUNCE};
	struct kvx_xfer_out o = step(t, y, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SUBMIT, .n_blocks = 2});
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* A duplicate write_done changes nothing. */
	cr_assert_eq(kvx_xfer_resolve_ack(t, y, 1, 1), 0);
	/* remote_blocks: stored once; a duplicate, or one for a finished transfer, is late. */
	struct kvx_xfer *z;
	cr_assert_eq(kvx_xfer_open(t, "tx-b2", &z), 0);
	uint32_t *ids = malloc(2 * sizeof(*ids)), *dup = malloc(2 * sizeof(*dup));
	cr_assert(ids && dup);
	ids[0] = dup[0] = 7;
	ids[1] = dup[1] = 8;
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	o = step(t, z, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_REMOTE_BLOCKS, .block_ids = ids, .n_blocks = 2,
						 .decode_dp_rank = 1});
	cr_assert_eq(o.act, KVX_XFER_DO_PROGRESS);
	cr_assert_not(o.late);
	cr_assert(z->has_alloc && z->n_remote_blocks == 2 && z->decode_dp_rank == 1);
	o = step(t, z, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_REMOTE_BLOCKS, .block_ids = dup, .n_blocks = 2});
	cr_assert(o.late);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, c_full_prefix_hit_read_releases_without_rdma)
{
	struct kvx_xfer_ev sub0 = {.type = KVX_XFER_EV_SUBMIT, .n_blocks = 0}, sub4 = {.type = KVX_XFER_EV_SUBMIT,
											.n_blocks = 4};
	/* D READ with nothing to move: P is released at once, DONE, nothing posted. */
	struct kvx_life lf = {.kind = KVX_XFER_K_READ};
	struct kvx_xfer_out o = step(NULL, NULL, &lf, sub0);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* D WRITE with nothing to receive: every P rank is released, no remote_blocks. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE};
	o = step(NULL, NULL, &lf, sub0);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	/* With blocks: a READ posts, an announcement sends remote_blocks and waits. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ};
	cr_assert_eq(step(NULL, NULL, &lf, sub4).act, KVX_XFER_DO_PROGRESS);
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-c", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE};
	cr_assert_eq(step(t, x, &lf, sub4).act, KVX_XFER_DO_SEND_BLOCKS);
	lf = (struct kvx_life){.kind = KVX_XFER_K_SERVE};
	cr_assert_eq(step(t, x, &lf, sub4).act, 0, "P READ waits for D's release");
	/* P READ: the consumer's release came first (parked): DONE at submission. */
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 1, 1), 1);
	o = step(t, x, &lf, sub4);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* P WRITE: D's release came first (D aborted): nothing written, write_done tells D so. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	o = step(t, x, &lf, sub4);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	cr_assert(lf.aborted);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, d_read_producer_silent_times_out_no_late_release)
{
	/* D READ, transfer timeout 30 from start 100: not yet at 130, timed out at 131; the
	 * producer's defer timeout (60) plays no part on the consumer. */
	struct kvx_life lf = {.kind = KVX_XFER_K_READ, .start_ns = 100};
	struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 130, .transfer_timeout_ns = 30,
				   .defer_timeout_ns = 60};
	cr_assert_eq(step(NULL, NULL, &lf, tick).act, 0);
	tick.now_ns = 131;
	struct kvx_xfer_out o = step(NULL, NULL, &lf, tick);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_PROGRESS);
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	cr_assert_eq(o.error, -ETIMEDOUT);
	performed(&lf, o);
	/* Nothing posted (the producer never answered): the blocks are freed, no late release. */
	struct kvx_xfer_ev settle = {.type = KVX_XFER_EV_READ_SETTLE};
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, KVX_XFER_DO_RELEASE);
	cr_assert_not(lf.release_sent);
	/* Timed out after posting: once the ops are terminal, P is released, once. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ, .reported = true, .timed_out = true, .next_layer = 1,
			       .ops_out = 1};
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, 0);
	lf.ops_out = 0;
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_RELEASE);
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, KVX_XFER_DO_RELEASE);
}

Test(runtime_faults, e_consumer_abort_quarantines_until_writes_terminal)
{
	/* D WRITE aborted at 10, defer timeout 60: every P rank is told to stop, ABORTED, the
	 * blocks are held until P's write_done or 70 has passed. */
	struct kvx_life lf = {.kind = KVX_XFER_K_ANNOUNCE};
	struct kvx_xfer_out o = step(NULL, NULL, &lf,
				     (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT, .now_ns = 10, .defer_timeout_ns = 60});
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE | KVX_XFER_DO_REPORT);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	cr_assert_eq(lf.quarantine_ns, 70);
	performed(&lf, o);
	struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 70, .transfer_timeout_ns = 30,
				   .defer_timeout_ns = 60};
	cr_assert_eq(step(NULL, NULL, &lf, tick).act, 0);
	/* P's write_done (the fan-in completes on the entry): the blocks leave quarantine now. */
	struct kvx_xfer_table *t0 = table();
	struct kvx_xfer *x0;
	cr_assert_eq(kvx_xfer_open(t0, "tx-e0", &x0), 0);
	o = step(t0, x0, &lf,
		 (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_DONE, .consumer_tp = 1, .producer_tp = 1});
	cr_assert(o.act & KVX_XFER_DO_RELEASE);
	cr_assert_not(o.late);
	kvx_xfer_table_destroy(t0);
	/* Without it, the quarantine ends after the defer timeout. Where every data transport
	 * refuses a write whose lease is revoked (tcp) or has no wire (shm), the blocks come back
	 * then. */
	struct kvx_life lf2 = lf;
	tick.now_ns = 71;
	cr_assert_eq(step(NULL, NULL, &lf2, tick).act, KVX_XFER_DO_RELEASE);
	cr_assert_not(lf2.fence_pending);
	/* Otherwise (verbs) first every connection a late write could land through is cut
	 * (once), and only the fence's completion frees the blocks; a write_done meanwhile
	 * leaves that to the fence. */
	tick.fence_writers = true;
	cr_assert_eq(step(NULL, NULL, &lf, tick).act, KVX_XFER_DO_FENCE);
	cr_assert(lf.fence_pending);
	tick.now_ns = 72;
	cr_assert_eq(step(NULL, NULL, &lf, tick).act, 0);
	t0 = table();
	cr_assert_eq(kvx_xfer_open(t0, "tx-e1", &x0), 0);
	o = step(t0, x0, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_DONE, .consumer_tp = 1, .producer_tp = 1});
	cr_assert_eq(o.act, 0);
	kvx_xfer_table_destroy(t0);
	cr_assert_eq(step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_FENCED}).act, KVX_XFER_DO_RELEASE);
	/* P WRITE aborted by its application with writes in flight: stop posting, report, hold;
	 * once the writes are terminal the blocks are free. Never a write_done (D would take it for
	 * DONE, issue 14 item 6): a kvxfer D (its remote_blocks named an epoch) gets kvx_failed,
	 * once; a MoRIIO D nothing. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-e", &x), 0);
	uint32_t *ids = malloc(sizeof(*ids));
	ids[0] = 3;
	cr_assert_eq(kvx_xfer_remote_blocks_take(x, ids, 1, 0, 77), 1);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE, .ops_out = 2};
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT});
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL);
	cr_assert_not(kvx_xfer_schedule_write(x, 0)); /* nothing more is scheduled */
	performed(&lf, o);
	struct kvx_xfer_ev wsettle = {.type = KVX_XFER_EV_WRITE_SETTLE};
	cr_assert_eq(step(t, x, &lf, wsettle).act, 0);
	lf.ops_out = 0;
	o = step(t, x, &lf, wsettle);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_FAILED | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(step(t, x, &lf, wsettle).act & (KVX_XFER_DO_SEND_FAILED | KVX_XFER_DO_SEND_WRITE_DONE), 0,
		     "one note");
	/* The same with a MoRIIO consumer (no epoch): nothing is sent. */
	struct kvx_xfer *xm;
	cr_assert_eq(kvx_xfer_open(t, "tx-em", &xm), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	o = step(t, xm, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT});
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	/* D aborting a P WRITE (its release): the same, decided on P. */
	struct kvx_xfer *y;
	cr_assert_eq(kvx_xfer_open(t, "tx-e2", &y), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE, .ops_out = 1};
	o = step(t, y, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_RELEASE, .consumer_tp = 1, .producer_tp = 1});
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT | KVX_XFER_DO_PROGRESS);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(y->state, KVX_XFER_S_TERMINAL);
	performed(&lf, o);
	lf.ops_out = 0;
	o = step(t, y, &lf, wsettle); /* D stopped us: write_done frees its quarantine */
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	/* D READ abort: reported now; P released once the ops are terminal (always, on abort). */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ, .ops_out = 1};
	o = step(t, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT});
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_PROGRESS);
	performed(&lf, o);
	lf.ops_out = 0;
	cr_assert_eq(step(t, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE}).act,
		     KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_RELEASE);
	/* A second abort of a reported transfer does nothing. */
	cr_assert_eq(step(t, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT}).act, 0);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, f_defer_timeout_does_not_free_under_reader)
{
	/* P READ (serve) holds blocks for the defer timeout (60), not the transfer timeout (30);
	 * when it passes the blocks stay held until every reader is revoked (fence). */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-f", &x), 0);
	struct kvx_life lf = {.kind = KVX_XFER_K_SERVE};
	struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 31, .transfer_timeout_ns = 30,
				   .defer_timeout_ns = 60};
	cr_assert_eq(step(t, x, &lf, tick).act, 0);
	tick.now_ns = 60;
	cr_assert_eq(step(t, x, &lf, tick).act, 0);
	tick.now_ns = 61;
	struct kvx_xfer_out o = step(t, x, &lf, tick);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_FENCE, "no release before the fence");
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	cr_assert(lf.fence_pending);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL); /* a late release is ignored */
	performed(&lf, o);
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_FENCED});
	cr_assert_eq(o.act, KVX_XFER_DO_RELEASE);
	cr_assert_not(lf.fence_pending);
	cr_assert_eq(step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_FENCED}).act, 0);
	/* P WRITE before D's allocation holds blocks for the defer timeout too; with it, the
	 * transfer timeout bounds it. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	tick.now_ns = 31;
	cr_assert_eq(step(NULL, NULL, &lf, tick).act, 0);
	tick.has_alloc = true;
	o = step(NULL, NULL, &lf, tick);
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, g_handshake_failure_fails_only_unbound_movers)
{
	/* The handshake with the peer failed: a D READ / P WRITE without a usable connection fails
	 * with the handshake's errno (released when no op is in flight); one still bound, or a
	 * kind that moves nothing, keeps going. */
	struct kvx_xfer_ev failed = {.type = KVX_XFER_EV_PEER_FAILED, .unbound = true, .error = -EHOSTUNREACH,
				     .hs_ends = 3};
	struct kvx_life lf = {.kind = KVX_XFER_K_READ};
	struct kvx_xfer_out o = step(NULL, NULL, &lf, failed);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -EHOSTUNREACH);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE, .ops_out = 1};
	failed.error = 0;
	o = step(NULL, NULL, &lf, failed);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT);
	cr_assert_eq(o.error, -ECONNREFUSED);
	lf = (struct kvx_life){.kind = KVX_XFER_K_SERVE};
	cr_assert_eq(step(NULL, NULL, &lf, failed).act, KVX_XFER_DO_PROGRESS);
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ};
	failed.unbound = false;
	cr_assert_eq(step(NULL, NULL, &lf, failed).act, KVX_XFER_DO_PROGRESS);
	/* A failure of a handshake that ended before the submission (the third of the peer's
	 * handshakes, submitted after it) is not this transfer's: it waits for the one it asked for. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ, .hs_after = 3};
	failed.unbound = true;
	cr_assert_eq(step(NULL, NULL, &lf, failed).act, KVX_XFER_DO_PROGRESS);
	cr_assert_not(lf.failed);
	failed.hs_ends = 4;
	cr_assert_eq(step(NULL, NULL, &lf, failed).act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
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
	struct kvx_life lf = {.kind = KVX_XFER_K_WRITE};
	struct kvx_xfer_ev ready0 = {.type = KVX_XFER_EV_LAYER_READY, .layer = 0};
	struct kvx_xfer_ev written = {.type = KVX_XFER_EV_LAYER_WRITTEN};
	cr_assert_eq(step(t, x, &lf, ready0).act, KVX_XFER_DO_POST_LAYER);
	cr_assert_eq(step(t, x, &lf, ready0).act, 0); /* the chunk without a new block */
	cr_assert_eq(step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 1}).act, 0);
	struct kvx_xfer_out o = step(t, x, &lf, written);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(step(t, x, &lf, written).act, 0);
	cr_assert_eq(step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 1}).act, 0);
	/* A failed write ends it FAILED: nothing more is scheduled, released once ops are done. */
	struct kvx_xfer *y;
	cr_assert_eq(kvx_xfer_open(t, "tx-i2", &y), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE, .ops_out = 1};
	step(t, y, &lf, ready0);
	o = step(t, y, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = -EIO});
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -EIO);
	cr_assert_eq(y->state, KVX_XFER_S_TERMINAL);
	performed(&lf, o);
	lf.ops_out = 0;
	o = step(t, y, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_SETTLE});
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE, "no write_done after a failure");
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

/* Peer incarnation (docs/protocol.md §6 item 18): the decisions the poller leaves to
 * kvx_xfer_step() when endpoints die and peers restart (OP_FAILED, PEER_CONNECTED,
 * PEER_EPOCH). */

Test(runtime_faults, p_read_dead_endpoint_nothing_moved_retries_only_on_new_epoch)
{
	/* D READ bound to epoch 5: its first op fails on a dead endpoint before any byte landed.
	 * It neither fails nor settles; it waits for its own ops, then for the peer's next
	 * connection: a new epoch (the producer restarted) re-posts every layer there. */
	struct kvx_life lf = {.kind = KVX_XFER_K_READ};
	struct kvx_xfer_out o = step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 5});
	cr_assert_eq(o.act, KVX_XFER_DO_BIND);
	cr_assert_eq(lf.bound_epoch, 5);
	lf.next_layer = 2;
	lf.done_posting = true;
	lf.ops_out = 2;
	o = step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_OP_FAILED, .error = -ECONNRESET, .ep_dead = true});
	cr_assert_eq(o.act, KVX_XFER_DO_RESET_PEER);
	cr_assert(lf.await_peer);
	cr_assert_not(lf.failed);
	lf.ops_out = 1;
	o = step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 6, .bound = true});
	cr_assert_eq(o.act, 0, "decided while its own op is in flight");
	lf.ops_out = 0;
	o = step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
	cr_assert_eq(o.act, 0, "settled (DONE) although nothing landed");
	o = step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 6, .bound = true});
	cr_assert_eq(o.act, KVX_XFER_DO_BIND | KVX_XFER_DO_REPOST);
	cr_assert_eq(lf.bound_epoch, 6);
	cr_assert_eq(lf.next_layer, 0);
	cr_assert_not(lf.done_posting);
	cr_assert_not(lf.await_peer);
	cr_assert_not(lf.failed);
}

Test(runtime_faults, q_read_same_epoch_after_dead_endpoint_resumes_lease_checked)
{
	/* The same epoch after the re-handshake: the link failed (a partition) or the producer
	 * fenced us (its defer timeout). The read resumes on the new connection: every layer is
	 * posted again behind a new lease lookup (the poller's), which fails it -ESTALE if the
	 * producer revoked the lease; bytes that landed before do not rule that out. */
	struct kvx_life lf = {.kind = KVX_XFER_K_READ};
	step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 5});
	lf.next_layer = 2;
	lf.done_posting = true;
	step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_OP_FAILED, .error = -ECONNRESET, .ep_dead = true,
						   .moved = true});
	cr_assert(lf.await_peer);
	cr_assert_not(lf.failed);
	struct kvx_xfer_out o = step(NULL, NULL, &lf,
				     (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 5, .bound = true,
							  .moved = true});
	cr_assert_eq(o.act, KVX_XFER_DO_BIND | KVX_XFER_DO_REPOST);
	cr_assert_eq(lf.next_layer, 0);
	cr_assert_not(lf.done_posting);
	cr_assert_not(lf.await_peer);
	cr_assert_not(lf.failed);

	/* A new epoch after bytes of its predecessor landed: FAILED -ECONNRESET, no retry. An op
	 * that failed on a live endpoint fails the read at once. */
	struct kvx_life ln = {.kind = KVX_XFER_K_READ};
	step(NULL, NULL, &ln, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 5});
	step(NULL, NULL, &ln, (struct kvx_xfer_ev){.type = KVX_XFER_EV_OP_FAILED, .error = -ECONNRESET, .ep_dead = true,
						   .moved = true});
	cr_assert(ln.await_peer);
	o = step(NULL, NULL, &ln, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 9, .bound = true,
						       .moved = true});
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -ECONNRESET);
	cr_assert(ln.release_sent);

	/* An op error on a live endpoint resets nothing. */
	struct kvx_life ll = {.kind = KVX_XFER_K_READ};
	o = step(NULL, NULL, &ll, (struct kvx_xfer_ev){.type = KVX_XFER_EV_OP_FAILED, .error = -EINVAL});
	cr_assert_eq(o.act, 0);
	cr_assert(ll.failed);
	cr_assert_eq(ll.error, -EINVAL);
}

Test(runtime_faults, r_write_never_binds_a_restarted_consumer)
{
	/* P WRITE bound to epoch 5 whose endpoint died: a new connection of epoch 6 means the
	 * consumer restarted and its allocation is gone: FAILED -ECONNRESET with nothing in
	 * flight (blocks reusable, its entry terminal); the same epoch 5 rebinds. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-m", &x), 0);
	struct kvx_life lf = {.kind = KVX_XFER_K_WRITE};
	struct kvx_xfer_out o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 5});
	cr_assert_eq(o.act, KVX_XFER_DO_BIND);
	lf.ops_out = 1;
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 6, .bound = true});
	cr_assert_eq(o.act, 0, "decided while its own op is in flight");
	lf.ops_out = 0;
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 5, .bound = true});
	cr_assert_eq(o.act, KVX_XFER_DO_BIND, "same incarnation: rebind");
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 6, .bound = true});
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -ECONNRESET);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL);
	performed(&lf, o);
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 7, .bound = true});
	cr_assert_eq(o.act, 0, "reported: nothing more");
	/* Unbound, but the allocation named epoch 8: a connection of epoch 9 is refused. */
	struct kvx_life lu = {.kind = KVX_XFER_K_WRITE, .alloc_known = true, .alloc_epoch = 8};
	o = step(NULL, NULL, &lu, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 9});
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -ECONNRESET);
	struct kvx_life lv = {.kind = KVX_XFER_K_WRITE, .alloc_known = true, .alloc_epoch = 8};
	o = step(NULL, NULL, &lv, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = 8});
	cr_assert_eq(o.act, KVX_XFER_DO_BIND);
	cr_assert_eq(lv.bound_epoch, 8);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, s_write_allocation_epoch_named_by_remote_blocks)
{
	/* A kvxfer consumer names its incarnation in remote_blocks: settled at once. A live
	 * connection of another epoch belongs to a consumer that restarted: RESET_PEER (stale +
	 * re-handshake); one being replaced already is left to its re-handshake. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	cr_assert_eq(kvx_xfer_open(t, "tx-n", &x), 0);
	uint32_t *ids = malloc(sizeof(*ids));
	cr_assert_not_null(ids);
	ids[0] = 3;
	struct kvx_life lf = {.kind = KVX_XFER_K_WRITE};
	step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_REMOTE_BLOCKS, .block_ids = ids, .n_blocks = 1,
					     .alloc_epoch = 7});
	struct kvx_life l2 = lf;
	struct kvx_xfer_out o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_EPOCH, .has_conn = true,
								    .conn_epoch = 5});
	cr_assert_eq(o.act, KVX_XFER_DO_RESET_PEER);
	cr_assert(lf.alloc_known);
	cr_assert_eq(lf.alloc_epoch, 7);
	o = step(t, x, &l2, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_EPOCH, .has_conn = true, .conn_stale = true,
						 .conn_epoch = 5});
	cr_assert_eq(o.act, 0);
	cr_assert(l2.alloc_known && l2.alloc_epoch == 7);
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_EPOCH, .has_conn = true, .conn_epoch = 5});
	cr_assert_eq(o.act, 0, "settled once");
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, t_write_moriio_allocation_epoch_checked_unless_link_fresh)
{
	/* A MoRIIO consumer names no epoch. A link with a fresh successful op vouches for the
	 * connection; else the peer's epoch is fetched again, and only a check numbered after the
	 * allocation counts. The check saw epoch 9 while the connection is of epoch 5: the
	 * consumer restarted (RESET_PEER), and the allocation is epoch 9's. */
	struct kvx_life fresh = {.kind = KVX_XFER_K_WRITE};
	struct kvx_xfer_out o = step(NULL, NULL, &fresh, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_EPOCH,
									     .has_conn = true, .conn_epoch = 5,
									     .link_fresh = true});
	cr_assert_eq(o.act, 0);
	cr_assert(fresh.alloc_known && fresh.alloc_epoch == 5);
	struct kvx_life none = {.kind = KVX_XFER_K_WRITE};
	o = step(NULL, NULL, &none, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_EPOCH});
	cr_assert_eq(o.act, 0);
	cr_assert(none.alloc_known && none.alloc_epoch == 0, "no connection yet: whatever connects is current");

	struct kvx_life lf = {.kind = KVX_XFER_K_WRITE};
	struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_EPOCH, .has_conn = true, .conn_epoch = 5, .check_started = 3,
				 .check_done = 3, .checked_epoch = 5};
	o = step(NULL, NULL, &lf, ev);
	cr_assert_eq(o.act, KVX_XFER_DO_EPOCH_CHECK);
	cr_assert(lf.check_wait && lf.check_need == 4);
	cr_assert_not(lf.alloc_known);
	o = step(NULL, NULL, &lf, ev);
	cr_assert_eq(o.act, KVX_XFER_DO_EPOCH_CHECK, "an older check's result does not count");
	ev.check_started = ev.check_done = 4;
	ev.checked_epoch = 9;
	o = step(NULL, NULL, &lf, ev);
	cr_assert_eq(o.act, KVX_XFER_DO_RESET_PEER);
	cr_assert(lf.alloc_known && lf.alloc_epoch == 9);
	cr_assert_not(lf.check_wait);
	/* A failed check (epoch 0) trusts the connection. */
	struct kvx_life lg = {.kind = KVX_XFER_K_WRITE, .check_wait = true, .check_need = 4};
	ev.checked_epoch = 0;
	o = step(NULL, NULL, &lg, ev);
	cr_assert_eq(o.act, 0);
	cr_assert(lg.alloc_known && lg.alloc_epoch == 5);
	/* Waiting while the connection is being replaced: its re-handshake gives the epoch. */
	struct kvx_life lh = {.kind = KVX_XFER_K_WRITE, .check_wait = true, .check_need = 9};
	o = step(NULL, NULL, &lh, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_EPOCH, .has_conn = true,
						       .conn_stale = true, .conn_epoch = 5});
	cr_assert_eq(o.act, 0);
	cr_assert(lh.alloc_known && lh.alloc_epoch == 0);
}

/* Issue 14 (control plane), decided in kvx_xfer_step(): ACKs that name their sender count once
 * per sender; a producer's kvx_failed ends a D WRITE with the producer's status; a D WRITE asks a
 * kvxfer producer before it times out; a producer answers queries and late allocations from the
 * outcome it keeps with the id. */
Test(runtime_faults, k_named_acks_failure_notes_status_queries)
{
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	uint64_t p0 = kvx_xfer_sender_key("10.0.0.1:6301", 0, 9), p1 = kvx_xfer_sender_key("10.0.0.1:6301", 1, 9);
	cr_assert_neq(p0, p1);
	cr_assert_neq(p0, kvx_xfer_sender_key("10.0.0.1:6301", 0, 10), "another incarnation is another sender");
	/* D WRITE expecting two write_done (P TP 2, D TP 1): rank 0's, twice, is not DONE. */
	cr_assert_eq(kvx_xfer_open(t, "tx-k1", &x), 0);
	struct kvx_life lf = {.kind = KVX_XFER_K_ANNOUNCE};
	struct kvx_xfer_ev wd = {.type = KVX_XFER_EV_WRITE_DONE, .consumer_tp = 2, .producer_tp = 1, .sender_key = p0};
	struct kvx_xfer_out o = step(t, x, &lf, wd);
	cr_assert_eq(o.act, 0);
	cr_assert_not(o.late);
	o = step(t, x, &lf, wd);
	cr_assert_eq(o.act, 0, "a duplicate from one sender completes nothing");
	cr_assert(o.late);
	cr_assert_eq(x->state, KVX_XFER_S_LIVE);
	wd.sender_key = p1;
	o = step(t, x, &lf, wd);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* MoRIIO senders (no name) keep count semantics: the same message twice completes. */
	cr_assert_eq(kvx_xfer_open(t, "tx-k2", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE};
	wd.sender_key = 0;
	cr_assert_eq(step(t, x, &lf, wd).act, 0);
	o = step(t, x, &lf, wd);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);

	/* P READ serving a consumer of TP 2: the same consumer rank's release twice completes
	 * nothing; the other rank's does. */
	cr_assert_eq(kvx_xfer_open(t, "tx-k2r", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_SERVE};
	uint64_t d0 = kvx_xfer_sender_key("10.0.0.2:6301", 0, 3), d1 = kvx_xfer_sender_key("10.0.0.2:6301", 1, 3);
	struct kvx_xfer_ev rel = {.type = KVX_XFER_EV_RELEASE, .consumer_tp = 2, .producer_tp = 1, .sender_key = d0};
	cr_assert_eq(step(t, x, &lf, rel).act, 0);
	o = step(t, x, &lf, rel);
	cr_assert_eq(o.act, 0);
	cr_assert(o.late);
	rel.sender_key = d1;
	cr_assert_eq(step(t, x, &lf, rel).act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);

	/* kvx_failed from P rank 0 of two: FAILED with P's status now, the other rank is told to
	 * stop, the blocks wait for it (quarantine); its write_done (or note) frees them. */
	cr_assert_eq(kvx_xfer_open(t, "tx-k3", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE};
	struct kvx_xfer_ev fn = {.type = KVX_XFER_EV_PEER_FAILED_NOTE, .consumer_tp = 2, .producer_tp = 1,
				 .sender_key = p0, .fail_status = KVX_CPL_ABORTED, .error = -ECANCELED,
				 .now_ns = 100, .defer_timeout_ns = 50};
	o = step(t, x, &lf, fn);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	cr_assert_eq(lf.quarantine_ns, 150);
	performed(&lf, o);
	cr_assert(step(t, x, &lf, fn).late, "the same note twice");
	wd.sender_key = p1;
	cr_assert_eq(step(t, x, &lf, wd).act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	/* With P TP 1 the note alone ends it and frees the blocks. */
	cr_assert_eq(kvx_xfer_open(t, "tx-k4", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE};
	fn.consumer_tp = 1;
	fn.fail_status = KVX_CPL_FAILED;
	fn.error = -ECONNRESET;
	o = step(t, x, &lf, fn);
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -ECONNRESET);
	/* Before the announce: parked, applied at submission. */
	kvx_xfer_table_destroy(t);
	t = table();
	cr_assert_eq(kvx_xfer_open(t, "tx-k5", &x), 0);
	fn.fail_status = KVX_CPL_TIMED_OUT;
	fn.error = -ETIMEDOUT;
	o = step(t, x, NULL, fn);
	cr_assert_eq(o.act, 0);
	cr_assert_not(o.late);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE};
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SUBMIT, .n_blocks = 2});
	cr_assert_eq(o.act, KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	cr_assert_eq(o.error, -ETIMEDOUT);

	/* D WRITE near its deadline with a kvxfer producer: the query goes out once the grace
	 * before the deadline starts (strict), the deadline itself does not move; a MoRIIO
	 * producer is not asked. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE, .start_ns = 0};
	struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 20, .transfer_timeout_ns = 30,
				   .defer_timeout_ns = 100, .query_peer = true, .query_grace_ns = 10};
	cr_assert_eq(step(t, NULL, &lf, tick).act, 0);
	tick.now_ns = 21;
	cr_assert_eq(step(t, NULL, &lf, tick).act, KVX_XFER_DO_SEND_QUERY);
	cr_assert_eq(step(t, NULL, &lf, tick).act, 0, "asked once");
	tick.now_ns = 30;
	cr_assert_eq(step(t, NULL, &lf, tick).act, 0, "exactly at the deadline: still pending");
	tick.now_ns = 31;
	o = step(t, NULL, &lf, tick);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE | KVX_XFER_DO_REPORT);
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE, .start_ns = 0};
	tick.query_peer = false;
	tick.now_ns = 21;
	cr_assert_eq(step(t, NULL, &lf, tick).act, 0);
	tick.now_ns = 31;
	cr_assert_eq(step(t, NULL, &lf, tick).status, KVX_CPL_TIMED_OUT);

	/* P WRITE: DONE, then a status query is answered with write_done; an aborted one with
	 * kvx_failed; a running one or an unknown id with nothing. */
	struct kvx_xfer *w;
	cr_assert_eq(kvx_xfer_open(t, "tx-k6", &w), 0);
	struct kvx_xfer_ev q = {.type = KVX_XFER_EV_STATUS_QUERY, .sender_key = p0};
	cr_assert(step(t, w, NULL, q).late, "running: no answer");
	uint32_t *ids = malloc(sizeof(*ids));
	ids[0] = 1;
	cr_assert_eq(kvx_xfer_remote_blocks_take(w, ids, 1, 0, 5), 1);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	cr_assert_eq(step(t, w, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 0}).act,
		     KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	o = step(t, w, NULL, q);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	cr_assert_eq(kvx_xfer_open(t, "tx-k7", &w), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	o = step(t, w, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT});
	cr_assert_eq(o.act, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE,
		     "no allocation yet: nobody to tell");
	o = step(t, w, NULL, q);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_FAILED);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	cr_assert(step(t, NULL, NULL, q).late, "unknown id");
	/* The allocation of a kvxfer consumer arrives after that: answered with kvx_failed at
	 * once; a MoRIIO consumer's (no epoch) is only late. */
	ids = malloc(2 * sizeof(*ids));
	ids[0] = 4;
	ids[1] = 5;
	o = step(t, w, NULL,
		 (struct kvx_xfer_ev){.type = KVX_XFER_EV_REMOTE_BLOCKS, .block_ids = ids, .n_blocks = 2,
				      .decode_dp_rank = 1, .alloc_epoch = 33});
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_FAILED);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert(o.late);
	cr_assert_eq(w->decode_dp_rank, 1, "answered to the rank that allocated");
	ids = malloc(sizeof(*ids));
	ids[0] = 4;
	o = step(t, w, NULL,
		 (struct kvx_xfer_ev){.type = KVX_XFER_EV_REMOTE_BLOCKS, .block_ids = ids, .n_blocks = 1});
	cr_assert_eq(o.act, 0);
	cr_assert(o.late);
	kvx_xfer_table_destroy(t);
}

/* u: READ failure notes and the deadline rules behind the soak's disagreements (issue 14). */
Test(runtime_faults, u_read_failure_note_and_no_done_past_the_deadline)
{
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x;
	/* D READ with a read in flight gets P's kvx_failed: nothing until its own op is terminal,
	 * then P's status and error, P released, blocks back. */
	cr_assert_eq(kvx_xfer_open(t, "tx-u1", &x), 0);
	struct kvx_life lf = {.kind = KVX_XFER_K_READ, .ops_out = 1, .next_layer = 1, .queried = true};
	struct kvx_xfer_ev fn = {.type = KVX_XFER_EV_PEER_FAILED_NOTE, .fail_status = KVX_CPL_ABORTED,
				 .error = -ECANCELED};
	struct kvx_xfer_out o = step(t, x, &lf, fn);
	cr_assert_eq(o.act, 0, "reported while its own read is in flight");
	cr_assert(lf.done_posting, "posts on after P's note");
	lf.ops_out = 0;
	o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_ABORTED);
	cr_assert_eq(o.error, -ECANCELED);
	performed(&lf, o);
	cr_assert(step(t, x, &lf, fn).late, "a second note");

	/* A revoked lease (-ESTALE) after it asked: it waits for P's note, and at its deadline
	 * without one it ends FAILED -ESTALE (not TIMED_OUT). */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ, .queried = true, .await_note = true, .failed = true,
			       .error = -ESTALE, .done_posting = true, .start_ns = 1000};
	cr_assert_eq(step(t, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE}).act, 0);
	struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 1000 + 500, .transfer_timeout_ns = 500,
				   .defer_timeout_ns = 2000};
	cr_assert_eq(step(t, NULL, &lf, tick).act, 0, "exactly at the deadline it still waits");
	tick.now_ns++;
	o = step(t, NULL, &lf, tick);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -ESTALE);

	/* P WRITE holding D's allocation whose last layer is written after its deadline (its
	 * poller was held up): TIMED_OUT, never DONE; in time it is DONE. */
	for (int late = 1; late >= 0; late--) {
		char id[16];
		snprintf(id, sizeof(id), "tx-u2%d", late);
		cr_assert_eq(kvx_xfer_open(t, id, &x), 0);
		uint32_t *ids = malloc(sizeof(*ids));
		ids[0] = 3;
		cr_assert_eq(kvx_xfer_remote_blocks_take(x, ids, 1, 0, 0), 1);
		lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE, .start_ns = 1000};
		cr_assert(kvx_xfer_schedule_write(x, 0));
		cr_assert_eq(step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 1, .now_ns = 1100,
								   .transfer_timeout_ns = 500})
				     .act,
			     0);
		o = step(t, x, &lf,
			 (struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_WRITTEN, .now_ns = late ? 1501 : 1500,
					      .transfer_timeout_ns = 500});
		cr_assert(o.act & KVX_XFER_DO_REPORT);
		cr_assert_eq(o.status, late ? KVX_CPL_TIMED_OUT : KVX_CPL_DONE, "late %d: status %d", late, o.status);
		cr_assert_eq(!!(o.act & KVX_XFER_DO_SEND_WRITE_DONE), !late);
	}

	/* D WRITE whose query goes out only after its deadline (held up): the answer gets the
	 * usual window (a quarter of the timeout) from then; one sent on time changes nothing. */
	cr_assert_eq(kvx_xfer_open(t, "tx-u3", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE, .start_ns = 1000};
	tick = (struct kvx_xfer_ev){.type = KVX_XFER_EV_TICK, .now_ns = 1000 + 900, .transfer_timeout_ns = 400,
				    .defer_timeout_ns = 2000, .query_peer = true, .query_grace_ns = 100};
	cr_assert_eq(step(t, x, &lf, tick).act, KVX_XFER_DO_SEND_QUERY);
	tick.now_ns += 99;
	cr_assert_eq(step(t, x, &lf, tick).act, 0, "timed out inside the late query's window");
	tick.now_ns += 1;
	o = step(t, x, &lf, tick);
	cr_assert(o.act & KVX_XFER_DO_REPORT);
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	cr_assert_eq(kvx_xfer_open(t, "tx-u4", &x), 0);
	lf = (struct kvx_life){.kind = KVX_XFER_K_ANNOUNCE, .start_ns = 1000};
	tick.now_ns = 1000 + 301;
	cr_assert_eq(step(t, x, &lf, tick).act, KVX_XFER_DO_SEND_QUERY, "asked a quarter before the deadline");
	tick.now_ns = 1000 + 401;
	o = step(t, x, &lf, tick);
	cr_assert(o.act & KVX_XFER_DO_REPORT, "the deadline moved for a query sent on time");
	cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
	kvx_xfer_table_destroy(t);
}

Test(runtime_faults, discarded_entry_frees_its_id_terminal_one_stays_used)
{
	/* A submission refused after its entry was opened (no lease word, ring full) discards it:
	 * the id is free again. A finished transfer's id is not: discarding it changes nothing. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x, *y;
	cr_assert_eq(kvx_xfer_open(t, "tx-d", &x), 0);
	cr_assert_eq(kvx_xfer_live_count(t), 1);
	kvx_xfer_discard(t, x);
	cr_assert_eq(kvx_xfer_live_count(t), 0);
	cr_assert_null(kvx_xfer_find(t, "tx-d"));
	cr_assert_eq(kvx_xfer_open(t, "tx-d", &y), 0, "the refused id is accepted again");
	kvx_xfer_make_terminal(t, y);
	kvx_xfer_discard(t, y);
	cr_assert_eq(kvx_xfer_find(t, "tx-d"), y);
	cr_assert_eq(kvx_xfer_open(t, "tx-d", &x), -EEXIST, "a finished id stays used");
	cr_assert_eq(kvx_xfer_live_count(t), 0);
	kvx_xfer_table_destroy(t);
}
