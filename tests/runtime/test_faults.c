/* SPDX-License-Identifier: Apache-2.0 */
/* Fault scenarios of the runtime issue, driven through the scheduler and transfer state
 * machines with an injected clock (times are plain ns values). Scenario (g), the per-layer
 * wait, needs the engine and is not covered here. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "kvxfer/layout.h"
#include "kvxfer/sched.h"
#include "runtime/runtime_internal.h"

TestSuite(runtime_faults, .timeout = 30.0);

static struct kvx_sched *mk(enum kvx_sched_role role, enum kvx_sched_mode mode)
{
	struct kvx_sched_params p = {.role = role, .mode = mode, .block_size = 16, .defer_timeout_ns = 60,
				     .transfer_timeout_ns = 30, .max_requests = 16};
	struct kvx_sched *s;
	cr_assert_eq(kvx_sched_create(&p, &s), 0);
	return s;
}

Test(runtime_faults, a_request_id_rewritten_completion_keyed_by_transfer)
{
	struct kvx_sched *s = mk(KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-a", .request_id = "cmpl-1", .block_ids = (uint32_t[]){3},
				    .n_blocks = 1, .num_prompt_tokens = 10};
	cr_assert_eq(kvx_sched_alloc(s, &a, 0, &res), 0);
	cr_assert_eq(kvx_sched_rename(s, "tx-a", "cmpl-1-0-deadbeef"), 0);
	cr_assert_eq(kvx_sched_finished(s, "tx-a", true, 1), 1);
	cr_assert_eq(kvx_sched_ack(s, "tx-a", 2), 0);
	struct kvx_sched_event ev[4];
	cr_assert_eq(kvx_sched_update(s, 2, ev, 4), 1);
	cr_assert_eq(ev[0].kind, KVX_SCHED_EV_FINISHED_SENDING);
	cr_assert_str_eq(ev[0].transfer_id, "tx-a");
	cr_assert_str_eq(ev[0].request_id, "cmpl-1-0-deadbeef");
	kvx_sched_destroy(s);
}

Test(runtime_faults, b_write_done_before_registration_parked_then_applied)
{
	struct kvx_sched *s = mk(KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	struct kvx_sched_event ev[4];
	cr_assert_eq(kvx_sched_ack(s, "tx-b", 10), 1); /* parked */
	cr_assert_eq(kvx_sched_update(s, 11, ev, 4), 0);
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-b", .block_ids = (uint32_t[]){7, 8}, .n_blocks = 2};
	cr_assert_eq(kvx_sched_alloc(s, &a, 12, &res), 0);
	cr_assert_eq(res.action, KVX_SCHED_ACT_SEND_REMOTE_BLOCKS);
	cr_assert_eq(kvx_sched_update(s, 13, ev, 4), 1);
	cr_assert_eq(ev[0].kind, KVX_SCHED_EV_FINISHED_RECVING);
	cr_assert_str_eq(ev[0].transfer_id, "tx-b");
	struct kvx_sched_stats st;
	kvx_sched_get_stats(s, &st);
	cr_assert_eq(st.parked, 1);
	cr_assert_eq(st.stale_dropped, 0);
	kvx_sched_destroy(s);
}

Test(runtime_faults, c_full_prefix_hit_read_releases_without_rdma)
{
	struct kvx_sched *d = mk(KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-c", .n_blocks = 0, .cached_blocks = 4, .n_remote_blocks = 4};
	cr_assert_eq(kvx_sched_alloc(d, &a, 0, &res), 0);
	cr_assert_eq(res.action, KVX_SCHED_ACT_SEND_RELEASE);
	cr_assert_eq(res.n_pairs, 0);
	cr_assert_eq(kvx_sched_live(d), 0);
	kvx_sched_destroy(d);
	/* Producer: the release ACK frees its deferred blocks at the next update, no reaping wait. */
	struct kvx_sched *p = mk(KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	struct kvx_sched_alloc ap = {.transfer_id = "tx-c", .block_ids = (uint32_t[]){1, 2, 3, 4}, .n_blocks = 4,
				     .num_prompt_tokens = 64};
	cr_assert_eq(kvx_sched_alloc(p, &ap, 0, &res), 0);
	cr_assert_eq(kvx_sched_finished(p, "tx-c", true, 0), 1);
	cr_assert_eq(kvx_sched_ack(p, "tx-c", 1), 0);
	struct kvx_sched_event ev[2];
	cr_assert_eq(kvx_sched_update(p, 1, ev, 2), 1);
	cr_assert_not(ev[0].reaped);
	kvx_sched_destroy(p);
}

Test(runtime_faults, d_read_producer_silent_times_out_no_late_release)
{
	struct kvx_sched *d = mk(KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ); /* transfer timeout 30 */
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-d", .block_ids = (uint32_t[]){5, 6}, .n_blocks = 2,
				    .n_remote_blocks = 2};
	cr_assert_eq(kvx_sched_alloc(d, &a, 100, &res), 0);
	cr_assert_eq(res.action, KVX_SCHED_ACT_START_READ);
	struct kvx_sched_event ev[4];
	cr_assert_eq(kvx_sched_update(d, 130, ev, 4), 0); /* exactly at the timeout: not yet */
	cr_assert_eq(kvx_sched_update(d, 131, ev, 4), 1);
	cr_assert_eq(ev[0].kind, KVX_SCHED_EV_FAILED);
	cr_assert_eq(ev[0].error, -ETIMEDOUT);
	/* Blocks stay quarantined while our reads may still land; nothing further is reported. */
	cr_assert_eq(kvx_sched_update(d, 500, ev, 4), 0);
	cr_assert_eq(kvx_sched_set_wire_busy(d, "tx-d", false), 0); /* endpoints torn down */
	cr_assert_eq(kvx_sched_update(d, 501, ev, 4), 1);
	cr_assert_eq(ev[0].kind, KVX_SCHED_EV_FREE_BLOCKS);
	/* The batch state says: fail, no release. */
	struct kvx_xfer x = {.ops_posted = 2, .start_ns = 100};
	cr_assert_eq(kvx_xfer_read_action(kvx_xfer_read_state(&x, 131, 30)), KVX_XFER_ACT_FAIL_NO_RELEASE);
	/* A late ACK (producer answers after all) is dropped: the transfer is finished. */
	cr_assert_eq(kvx_sched_ack(d, "tx-d", 600), 2);
	kvx_sched_destroy(d);
}

Test(runtime_faults, e_consumer_abort_quarantines_until_writes_terminal)
{
	struct kvx_sched *d = mk(KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-e", .block_ids = (uint32_t[]){9, 10}, .n_blocks = 2};
	cr_assert_eq(kvx_sched_alloc(d, &a, 0, &res), 0);
	enum kvx_sched_action act;
	cr_assert_eq(kvx_sched_abort(d, "tx-e", 1, &act), 0);
	cr_assert_eq(act, KVX_SCHED_ACT_SEND_RELEASE);
	struct kvx_sched_event ev[4];
	cr_assert_eq(kvx_sched_update(d, 2, ev, 4), 0); /* P writes may be in flight */
	struct kvx_sched_stats st;
	kvx_sched_get_stats(d, &st);
	cr_assert_eq(st.quarantined, 1);
	cr_assert_eq(kvx_sched_ack(d, "tx-e", 3), 0); /* P's terminal write_done */
	cr_assert_eq(kvx_sched_update(d, 3, ev, 4), 1);
	cr_assert_eq(ev[0].kind, KVX_SCHED_EV_FREE_BLOCKS);
	cr_assert_eq(kvx_sched_update(d, 4, ev, 4), 0); /* exactly once */
	/* Abort before allocation also releases P. */
	cr_assert_eq(kvx_sched_abort(d, "tx-e2", 5, &act), 0);
	cr_assert_eq(act, KVX_SCHED_ACT_SEND_RELEASE);
	kvx_sched_destroy(d);
}

Test(runtime_faults, f_defer_timeout_does_not_free_under_reader)
{
	struct kvx_sched *p = mk(KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ); /* defer 60 */
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-f", .block_ids = (uint32_t[]){1, 2}, .n_blocks = 2,
				    .num_prompt_tokens = 32};
	cr_assert_eq(kvx_sched_alloc(p, &a, 0, &res), 0);
	cr_assert_eq(kvx_sched_finished(p, "tx-f", true, 0), 1);
	cr_assert_eq(kvx_sched_set_wire_busy(p, "tx-f", true), 0); /* a READ is being served */
	struct kvx_sched_event ev[4];
	cr_assert_eq(kvx_sched_update(p, 60, ev, 4), 0);
	cr_assert_eq(kvx_sched_update(p, 1000, ev, 4), 0);
	cr_assert_eq(kvx_sched_set_wire_busy(p, "tx-f", false), 0);
	cr_assert_eq(kvx_sched_update(p, 1001, ev, 4), 1);
	cr_assert_eq(ev[0].kind, KVX_SCHED_EV_FINISHED_SENDING);
	cr_assert(ev[0].reaped);
	kvx_sched_destroy(p);
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
	struct kvx_sched *d = mk(KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	struct kvx_sched_alloc_result res;
	const uint32_t local[5] = {20, 21, 22, 23, 24};
	struct kvx_sched_alloc a = {.transfer_id = "tx-h", .block_ids = local, .n_blocks = 5, .cached_blocks = 2,
				    .n_remote_blocks = 6};
	cr_assert_eq(kvx_sched_alloc(d, &a, 0, &res), 0);
	cr_assert_eq(res.action, KVX_SCHED_ACT_START_READ);
	cr_assert_eq(res.n_pairs, 4);
	cr_assert_eq(res.remote_start, 2);
	/* The plan for those pairs is in bounds on both sides (MLA [32,4,3], peer num_blocks 8). */
	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	struct kvx_layout_tensor t = {.ndim = 3, .shape = {32, 4, 3}, .stride = {12, 3, 1}, .elem_size = 2};
	struct kvx_layout_geom g;
	cr_assert_eq(kvx_layout_geometry(&mla, &t, 8, &g, NULL, 0), 0);
	const uint32_t remote[6] = {0, 1, 2, 3, 4, 5};
	uint64_t l[8], r[8], s[8];
	cr_assert_eq(kvx_plan_offsets(&g, local, res.n_pairs, remote + res.remote_start, res.n_pairs, l, r, s, 8), 4);
	cr_assert_eq(l[0], 20 * 24);
	cr_assert_eq(r[0], 2 * 24);
	cr_assert_eq(r[3] + s[3], 6 * 24); /* ends at the peer's last paired block */
	kvx_sched_destroy(d);
}

Test(runtime_faults, i_chunk_without_new_block)
{
	struct kvx_sched *p = mk(KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-i", .block_ids = (uint32_t[]){4, 5}, .n_blocks = 2,
				    .num_prompt_tokens = 40};
	cr_assert_eq(kvx_sched_alloc(p, &a, 0, &res), 0);
	const uint32_t *b;
	size_t n;
	cr_assert_eq(kvx_sched_step(p, "tx-i", NULL, 0, 16, &b, &n), 0); /* no new block */
	cr_assert_eq(kvx_sched_step(p, "tx-i", (uint32_t[]){6}, 1, 32, &b, &n), 0);
	/* Blocks are all allocated but only 32 of 40 tokens computed: not the final chunk. */
	cr_assert_eq(kvx_sched_step(p, "tx-i", NULL, 0, 39, &b, &n), 0);
	cr_assert_eq(kvx_sched_step(p, "tx-i", NULL, 0, 40, &b, &n), 1);
	cr_assert_eq(n, 3);
	cr_assert(b[0] == 4 && b[1] == 5 && b[2] == 6);
	cr_assert_eq(kvx_sched_step(p, "tx-i", NULL, 0, 40, &b, &n), 0); /* save emitted once */
	/* The write state machine seals with the layers actually scheduled. */
	struct kvx_xfer_table *t;
	cr_assert_eq(kvx_xfer_table_create(8, 4, &t), 0);
	enum kvx_xfer_action act;
	cr_assert(kvx_xfer_schedule_write(t, "tx-i", 0));
	cr_assert_eq(kvx_xfer_seal_scheduled(t, "tx-i", &act), 1);
	cr_assert_eq(kvx_xfer_mark_write_done(t, "tx-i", true), KVX_XFER_ACT_NOTIFY_WRITE_DONE);
	kvx_xfer_table_destroy(t);
	kvx_sched_destroy(p);
}

Test(runtime_faults, j_duplicate_transfer_id_rejected_first_intact)
{
	struct kvx_sched *d = mk(KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	struct kvx_sched_alloc_result res;
	struct kvx_sched_alloc a = {.transfer_id = "tx-j", .request_id = "r1", .block_ids = (uint32_t[]){1},
				    .n_blocks = 1};
	struct kvx_sched_alloc b = {.transfer_id = "tx-j", .request_id = "r2", .block_ids = (uint32_t[]){2},
				    .n_blocks = 1};
	cr_assert_eq(kvx_sched_alloc(d, &a, 0, &res), 0);
	cr_assert_eq(kvx_sched_alloc(d, &b, 0, &res), -EEXIST);
	cr_assert_eq(kvx_sched_ack(d, "tx-j", 1), 0);
	struct kvx_sched_event ev[4];
	cr_assert_eq(kvx_sched_update(d, 1, ev, 4), 1);
	cr_assert_str_eq(ev[0].request_id, "r1");
	/* One-shot: reusing the id after completion is also rejected. */
	cr_assert_eq(kvx_sched_alloc(d, &b, 2, &res), -EEXIST);
	kvx_sched_destroy(d);
	struct kvx_xfer_table *t;
	struct kvx_xfer *x, *y;
	cr_assert_eq(kvx_xfer_table_create(8, 4, &t), 0);
	cr_assert_eq(kvx_xfer_open(t, "tx-j", &x), 0);
	x->ops_posted = 3;
	cr_assert_eq(kvx_xfer_open(t, "tx-j", &y), -EEXIST);
	cr_assert_eq(x->ops_posted, 3);
	kvx_xfer_table_destroy(t);
}
