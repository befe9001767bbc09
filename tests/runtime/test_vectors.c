/* SPDX-License-Identifier: Apache-2.0 */
/* docs/protocol.md §7 vectors owned by the runtime: layout (T1–T6, T9, T11–T15, T51), WRITE state
 * machine (T16–T19), fan-in and routing (T23–T27), READ batch (T28, T30, T31), scheduler
 * (T44, T45, T47, T53). Layout cases: bf16, block_size 4, 2 KV heads, head size 3, local
 * blocks [1,3], remote [4,5], remote num_blocks 16. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/control.h"
#include "kvxfer/layout.h"
#include "runtime/runtime_internal.h"

TestSuite(runtime_vectors, .timeout = 30.0);
TestSuite(runtime_layout, .timeout = 30.0);

static const struct kvx_layout_spec g_spec = {.block_size = 4, .num_kv_heads = 2, .head_size = 3};
static const uint32_t g_local[2] = {1, 3};
static const uint32_t g_remote[2] = {4, 5};

/* Contiguous tensor of the given shape (row-major strides). */
static struct kvx_layout_tensor tensor(uint32_t ndim, const uint64_t *shape)
{
	struct kvx_layout_tensor t = {.ndim = ndim, .elem_size = 2};
	uint64_t st = 1;
	for (int i = (int)ndim - 1; i >= 0; i--) {
		t.shape[i] = shape[i];
		t.stride[i] = st;
		st *= shape[i];
	}
	return t;
}

struct triples {
	uint64_t loc[16], rem[16], size[16];
	int n;
};

static struct triples plan(const struct kvx_layout_spec *spec, uint32_t ndim, const uint64_t *shape,
			   struct kvx_layout_geom *g)
{
	struct kvx_layout_tensor t = tensor(ndim, shape);
	char err[128] = "";
	int rc = kvx_layout_geometry(spec, &t, 16, g, err, sizeof(err));
	cr_assert_eq(rc, 0, "geometry: %s", err);
	struct triples r;
	r.n = kvx_plan_offsets(g, g_local, 2, g_remote, 2, r.loc, r.rem, r.size, 16);
	cr_assert_geq(r.n, 0);
	uint32_t scratch[32];
	r.n = kvx_plan_merge(r.loc, r.rem, r.size, (size_t)r.n, scratch);
	return r;
}

static void expect_triples(const struct triples *r, int n, const uint64_t *loc, const uint64_t *rem,
			   const uint64_t *size)
{
	cr_assert_eq(r->n, n, "entries %d != %d", r->n, n);
	for (int i = 0; i < n; i++) {
		cr_expect_eq(r->loc[i], loc[i], "loc[%d] %llu != %llu", i, (unsigned long long)r->loc[i],
			     (unsigned long long)loc[i]);
		cr_expect_eq(r->rem[i], rem[i], "rem[%d] %llu != %llu", i, (unsigned long long)r->rem[i],
			     (unsigned long long)rem[i]);
		cr_expect_eq(r->size[i], size[i], "size[%d]", i);
	}
}

static bool same_triples(const struct triples *x, const struct triples *y)
{
	if (x->n != y->n)
		return false;
	for (int i = 0; i < x->n; i++)
		if (x->loc[i] != y->loc[i] || x->rem[i] != y->rem[i] || x->size[i] != y->size[i])
			return false;
	return true;
}

static const uint64_t t1_loc[] = {48, 144, 432, 528}, t1_rem[] = {192, 240, 960, 1008}, t1_sz[] = {48, 48, 48, 48};
static const uint64_t t2_loc[] = {96, 288}, t2_rem[] = {384, 480}, t2_sz[] = {96, 96};

/* One layout vector (T1–T6, T9): tensor shape in, geometry and merged triples out. */
struct layout_vec {
	bool mla;
	uint32_t ndim;
	uint64_t shape[5];
	enum kvx_layout_kind kind;
	uint64_t num_blocks, block_stride, local_kv_stride, remote_kv_stride;
	bool has_kv_stride, split;
	uint32_t transfers_per_block, kernel_blocks_per_block;
	int n;
	const uint64_t *loc, *rem, *size;
};

static void check_layout_vec(const struct layout_vec *v)
{
	static const struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	struct kvx_layout_geom g;
	struct triples r = plan(v->mla ? &mla : &g_spec, v->ndim, v->shape, &g);
	cr_assert_eq(g.kind, v->kind);
	cr_assert_eq(g.num_blocks, v->num_blocks);
	cr_assert_eq(g.block_size, 4);
	cr_assert_eq(g.block_stride, v->block_stride);
	cr_assert_eq(g.has_kv_stride, v->has_kv_stride);
	if (v->has_kv_stride) {
		cr_assert_eq(g.local_kv_stride, v->local_kv_stride);
		cr_assert_eq(g.remote_kv_stride, v->remote_kv_stride);
	}
	cr_assert_eq(g.split_kv_regions, v->split);
	cr_assert_eq(g.transfers_per_block, v->transfers_per_block);
	cr_assert_eq(g.kernel_blocks_per_block, v->kernel_blocks_per_block);
	expect_triples(&r, v->n, v->loc, v->rem, v->size);
}

/* T1 and its equivalents (HND T3, kernel blocks T5): strides 24 / 192 / 384 (remote NB 16). */
#define SPLIT_T1(...) \
	{.ndim = 5, .shape = {__VA_ARGS__}, .kind = KVX_LAYOUT_KIND_SPLIT, .num_blocks = 8, .block_stride = 24, \
	 .local_kv_stride = 192, .remote_kv_stride = 384, .has_kv_stride = true, .split = true, \
	 .transfers_per_block = 2, .n = 4, .loc = t1_loc, .rem = t1_rem, .size = t1_sz}
/* T2 and HND T4: block stride 48, kv strides 24/24, K+V of a block merged. */
#define INTERLEAVED_T2(...) \
	{.ndim = 5, .shape = {__VA_ARGS__}, .kind = KVX_LAYOUT_KIND_INTERLEAVED, .num_blocks = 8, \
	 .block_stride = 48, .local_kv_stride = 24, .remote_kv_stride = 24, .has_kv_stride = true, \
	 .transfers_per_block = 2, .kernel_blocks_per_block = 1, .n = 2, .loc = t2_loc, .rem = t2_rem, .size = t2_sz}

Test(runtime_vectors, t01_split_offsets)
{
	struct layout_vec v = SPLIT_T1(2, 8, 4, 2, 3);
	v.kernel_blocks_per_block = 1;
	check_layout_vec(&v);
}

Test(runtime_vectors, t02_interleaved_offsets)
{
	check_layout_vec(&(struct layout_vec)INTERLEAVED_T2(8, 2, 4, 2, 3));
}

Test(runtime_vectors, t03_hnd_split_same_as_t01)
{
	struct layout_vec v = SPLIT_T1(2, 8, 2, 4, 3);
	v.kernel_blocks_per_block = 1;
	check_layout_vec(&v);
}

Test(runtime_vectors, t04_hnd_interleaved_same_as_t02)
{
	check_layout_vec(&(struct layout_vec)INTERLEAVED_T2(8, 2, 2, 4, 3));
}

Test(runtime_vectors, t05_split_kernel_blocks)
{
	/* [2,16,2,2,3]: kernel block size 2, 2 kernel blocks per logical block, num_blocks 8. */
	struct layout_vec v = SPLIT_T1(2, 16, 2, 2, 3);
	v.kernel_blocks_per_block = 2;
	check_layout_vec(&v);
}

Test(runtime_vectors, t06_interleaved_kernel_blocks)
{
	/* [16,2,2,2,3]: num_blocks 8, block stride 48, kv strides none, 1 transfer per block. */
	check_layout_vec(&(struct layout_vec){.ndim = 5, .shape = {16, 2, 2, 2, 3}, .kind = KVX_LAYOUT_KIND_INTERLEAVED,
					      .num_blocks = 8, .block_stride = 48, .transfers_per_block = 1,
					      .kernel_blocks_per_block = 2, .n = 2, .loc = t2_loc, .rem = t2_rem,
					      .size = t2_sz});
}

Test(runtime_vectors, t09_mla_offsets)
{
	/* [8,4,3]: block stride 12, 1 transfer per block -> ([24,72],[96,120],[24,24]). */
	check_layout_vec(&(struct layout_vec){.mla = true, .ndim = 3, .shape = {8, 4, 3}, .kind = KVX_LAYOUT_KIND_MLA,
					      .num_blocks = 8, .block_stride = 12, .transfers_per_block = 1,
					      .kernel_blocks_per_block = 1, .n = 2, .loc = (const uint64_t[]){24, 72},
					      .rem = (const uint64_t[]){96, 120}, .size = (const uint64_t[]){24, 24}});
}

Test(runtime_vectors, t11_4d_shape_rejected)
{
	struct kvx_layout_tensor t = tensor(4, (uint64_t[]){8, 4, 2, 3});
	struct kvx_layout_geom g;
	char err[160] = "";
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 16, &g, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "Unsupported K/V cache shape [8,4,2,3]"), "message: %s", err);
}

Test(runtime_vectors, t12_length_mismatch_rejected)
{
	struct kvx_layout_geom g;
	struct kvx_layout_tensor t = tensor(5, (uint64_t[]){2, 8, 4, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 16, &g, NULL, 0), 0);
	uint64_t l[8], r[8], s[8];
	cr_assert_eq(kvx_plan_offsets(&g, g_local, 2, (uint32_t[]){4}, 1, l, r, s, 8), -EINVAL);
}

Test(runtime_vectors, t13_registration_regions)
{
	struct kvx_layout_geom g;
	struct kvx_layout_region reg[2];
	struct kvx_layout_tensor t = tensor(5, (uint64_t[]){2, 8, 4, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_regions(&g, &t, 0x10000, reg), 2);
	cr_assert_eq(reg[0].addr, 0x10000);
	cr_assert_eq(reg[1].addr, 0x10000 + 8 * 48); /* cache[1] */
	cr_assert_eq(reg[0].len, 8 * 48);
	cr_assert_eq(reg[1].len, 8 * 48);

	t = tensor(5, (uint64_t[]){8, 2, 4, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_regions(&g, &t, 0x10000, reg), 1);
	cr_assert_eq(reg[0].len, 8 * 2 * 48);

	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	t = tensor(3, (uint64_t[]){8, 4, 3});
	cr_assert_eq(kvx_layout_geometry(&mla, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_regions(&g, &t, 0x10000, reg), 1);
	cr_assert_eq(reg[0].len, 8 * 24);

	t = tensor(5, (uint64_t[]){4, 2, 4, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_regions(&g, &t, 0x10000, reg), 1);
	cr_assert_eq(reg[0].len, 4 * 2 * 48);
}

Test(runtime_vectors, t14_three_layouts_three_triples)
{
	struct kvx_layout_geom g;
	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	struct triples a = plan(&g_spec, 5, (uint64_t[]){2, 8, 4, 2, 3}, &g);
	struct triples b = plan(&g_spec, 5, (uint64_t[]){8, 2, 4, 2, 3}, &g);
	struct triples c = plan(&mla, 3, (uint64_t[]){8, 4, 3}, &g);
	/* Pairwise different as whole triples (T1, T2 and T9 give the exact values). */
	cr_assert_not(same_triples(&a, &b), "split and interleaved gave the same triples");
	cr_assert_not(same_triples(&b, &c), "interleaved and MLA gave the same triples");
	cr_assert_not(same_triples(&a, &c), "split and MLA gave the same triples");
	expect_triples(&a, 4, t1_loc, t1_rem, t1_sz);
	expect_triples(&b, 2, t2_loc, t2_rem, t2_sz);
	expect_triples(&c, 2, (uint64_t[]){24, 72}, (uint64_t[]){96, 120}, (uint64_t[]){24, 24});
}

Test(runtime_vectors, t15_plan_cached_per_geometry)
{
	struct kvx_plan_cache *c;
	cr_assert_eq(kvx_plan_cache_create(64, &c), 0);
	struct kvx_layout_geom dense, indexer;
	struct kvx_layout_tensor td = tensor(5, (uint64_t[]){2, 8, 4, 2, 3});
	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	struct kvx_layout_tensor ti = tensor(3, (uint64_t[]){8, 4, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &td, 16, &dense, NULL, 0), 0);
	cr_assert_eq(kvx_layout_geometry(&mla, &ti, 16, &indexer, NULL, 0), 0);
	struct kvx_plan p0, p1, p2;
	/* dense0, dense1 (same geometry), indexer */
	cr_assert_eq(kvx_plan_cache_get(c, &dense, g_local, g_remote, 2, &p0), 1);
	cr_assert_eq(kvx_plan_cache_get(c, &dense, g_local, g_remote, 2, &p1), 0);
	cr_assert_eq(kvx_plan_cache_get(c, &indexer, g_local, g_remote, 2, &p2), 1);
	cr_assert_eq(p0.loc, p1.loc);
	cr_assert_eq(p0.n, 4);
	cr_assert_eq(p0.bytes, 4 * 48);
	cr_assert_eq(p2.n, 2);
	kvx_plan_cache_destroy(c);
}

static struct kvx_xfer_table *table(void)
{
	struct kvx_xfer_table *t;
	cr_assert_eq(kvx_xfer_table_create(64, 16, &t), 0);
	return t;
}

/* The transfer's entry, opened as the owning poller does at submission (or on the first
 * notification naming it). */
static struct kvx_xfer *entry(struct kvx_xfer_table *t, const char *tid)
{
	struct kvx_xfer *x = kvx_xfer_find(t, tid);
	if (!x)
		cr_assert_eq(kvx_xfer_open(t, tid, &x), 0);
	return x;
}

static uint32_t *ids(const uint32_t *v, size_t n)
{
	uint32_t *c = malloc(n * sizeof(*c));
	cr_assert_not_null(c);
	memcpy(c, v, n * sizeof(*c));
	return c;
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

static struct kvx_xfer_ev ready(uint32_t layer)
{
	return (struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_READY, .layer = layer};
}

Test(runtime_vectors, t16_write_schedule_dedup_and_seal)
{
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x = entry(t, "xfer");
	struct kvx_life lf = {.kind = KVX_XFER_K_WRITE};
	cr_assert_eq(step(t, x, &lf, ready(0)).act, KVX_XFER_DO_POST_LAYER); /* dense0 */
	cr_assert_eq(step(t, x, &lf, ready(0)).act, 0);                      /* dense0 again */
	cr_assert_eq(step(t, x, &lf, ready(2)).act, KVX_XFER_DO_POST_LAYER); /* indexer */
	cr_assert_eq(step(t, x, &lf, ready(KVX_XFER_MAX_LAYERS)).act, 0);
	cr_assert_eq(x->writes_scheduled, 2);
	struct kvx_xfer_out o = step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 2});
	cr_assert_eq(o.act, 0);
	cr_assert_eq(x->writes_expected, 2);
	cr_assert(x->sealed);
	kvx_xfer_table_destroy(t);
}

Test(runtime_vectors, t17_write_done_notified_once)
{
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x = entry(t, "xfer");
	struct kvx_life lf = {.kind = KVX_XFER_K_WRITE};
	struct kvx_xfer_ev written = {.type = KVX_XFER_EV_LAYER_WRITTEN};
	cr_assert_eq(kvx_xfer_remote_blocks_take(x, ids(g_remote, 2), 2, 0, 0), 1);
	cr_assert_eq(kvx_xfer_remote_blocks_take(x, ids(g_remote, 2), 2, 0, 0), -EEXIST); /* duplicate */
	step(t, x, &lf, ready(0));
	step(t, x, &lf, ready(1));
	cr_assert_eq(step(t, x, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 2}).act, 0);
	cr_assert_eq(step(t, x, &lf, written).act, 0);
	struct kvx_xfer_out o = step(t, x, &lf, written);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	/* write_done target: D dp 0, P tp_rank 2, notify base 7000 -> 7002 */
	uint32_t rtp, off;
	cr_assert_eq(kvx_ctl_remote_tp_rank(2, 4, 4, &rtp, NULL, 0), 0);
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, kvx_ctl_fold_local_rank(0, 0), rtp, 4, &off), 0);
	cr_assert_eq(7000 + off, 7002);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL);
	cr_assert_eq(x->remote_blocks, NULL); /* alloc dropped */
	cr_assert_eq(x->decode_dp_rank, 0);   /* where write_done goes */
	/* A late duplicate completion never notifies twice. */
	cr_assert_eq(step(t, x, &lf, written).act, 0);
	lf.reported = true;
	cr_assert_eq(step(t, x, &lf, written).act, 0);
	/* Sealing after every layer was written notifies at the seal. */
	struct kvx_xfer *y = entry(t, "xfer2");
	lf = (struct kvx_life){.kind = KVX_XFER_K_WRITE};
	step(t, y, &lf, ready(0));
	cr_assert_eq(step(t, y, &lf, written).act, 0);
	o = step(t, y, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = 1});
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_WRITE_DONE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	kvx_xfer_table_destroy(t);
}

Test(runtime_vectors, t18_completion_scoped_per_transfer)
{
	struct kvx_xfer_table *t = table();
	enum kvx_xfer_action act;
	struct kvx_xfer *a = entry(t, "a"), *b = entry(t, "b");
	kvx_xfer_schedule_write(a, 0);
	kvx_xfer_schedule_write(b, 0);
	kvx_xfer_seal_count(t, a, 1, &act);
	kvx_xfer_seal_count(t, b, 1, &act);
	cr_assert_eq(kvx_xfer_mark_write_done(t, b, true), KVX_XFER_ACT_NOTIFY_WRITE_DONE);
	cr_assert_eq(a->state, KVX_XFER_S_LIVE);
	cr_assert_eq(a->writes_done, 0);
	kvx_xfer_table_destroy(t);
}

Test(runtime_vectors, t19_failed_write_terminal_and_cleared)
{
	struct kvx_xfer_table *t = table();
	enum kvx_xfer_action act;
	struct kvx_xfer *x = entry(t, "xfer");
	kvx_xfer_schedule_write(x, 0);
	kvx_xfer_schedule_write(x, 1);
	kvx_xfer_seal_count(t, x, 2, &act);
	cr_assert_eq(kvx_xfer_mark_write_done(t, x, false), KVX_XFER_ACT_NONE);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL);
	cr_assert(x->failed);
	cr_assert_eq(x->writes_scheduled, 0);
	cr_assert_not(x->sealed);
	cr_assert_eq(x->layers_sched[0], 0);
	cr_assert_not(kvx_xfer_schedule_write(x, 3));
	cr_assert_eq(kvx_xfer_live_count(t), 0);
	/* T20: remote_blocks for a terminal transfer is ignored (the ids are freed). */
	cr_assert_eq(kvx_xfer_remote_blocks_take(x, ids(g_remote, 2), 2, 0, 0), 0);
	cr_assert_not(x->has_alloc);
	cr_assert_eq(kvx_xfer_find(t, "xfer"), x); /* the id stays known (terminal LRU) */
	kvx_xfer_table_destroy(t);
}

Test(runtime_vectors, t23_remote_tp_rank)
{
	uint32_t r;
	for (uint32_t i = 0; i < 4; i++) {
		cr_assert_eq(kvx_ctl_remote_tp_rank(i, 4, 4, &r, NULL, 0), 0);
		cr_assert_eq(r, i);
	}
	const uint32_t e8[8] = {0, 0, 1, 1, 2, 2, 3, 3};
	for (uint32_t i = 0; i < 8; i++) {
		cr_assert_eq(kvx_ctl_remote_tp_rank(i, 8, 4, &r, NULL, 0), 0);
		cr_assert_eq(r, e8[i]);
	}
	for (uint32_t i = 0; i < 4; i++) {
		cr_assert_eq(kvx_ctl_remote_tp_rank(i, 4, 8, &r, NULL, 0), 0);
		cr_assert_eq(r, 2 * i);
	}
	char err[128] = "";
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 6, 4, &r, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "multiple"), "message: %s", err);
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 4, 6, &r, NULL, 0), -EINVAL);
}

/* One kvx_layout_check_hetero_tp() case: (tp_local, tp_remote, total kv heads, mla) -> rc. */
struct hetero_case {
	uint32_t tp_local, tp_remote, heads;
	bool mla;
	int rc;
};

static void expect_hetero(const struct hetero_case *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char err[160] = "untouched";
		int rc = kvx_layout_check_hetero_tp(c[i].tp_local, c[i].tp_remote, c[i].heads, c[i].mla, err,
						    sizeof(err));
		cr_assert_eq(rc, c[i].rc, "(%u,%u,%u,mla=%d): rc %d != %d (%s)", c[i].tp_local, c[i].tp_remote,
			     c[i].heads, c[i].mla, rc, c[i].rc, err);
		if (rc == 0)
			cr_assert_str_eq(err, "untouched", "success must not write err");
	}
}

Test(runtime_vectors, t24_head_guard)
{
	/* (tp_local, tp_remote, kv heads): (4,4,8), (8,4,4), (4,8,4) pass; (4,2,4), (2,4,4) are
	 * replicated KV heads (NotImplementedError -> -ENOTSUP); MLA (2,4,4) passes. */
	static const struct hetero_case c[] = {
		{4, 4, 8, false, 0},        {8, 4, 4, false, 0},        {4, 8, 4, false, 0},
		{4, 2, 4, false, -ENOTSUP}, {2, 4, 4, false, -ENOTSUP}, {2, 4, 4, true, 0},
	};
	expect_hetero(c, sizeof(c) / sizeof(c[0]));
	char err[160] = "";
	cr_assert_eq(kvx_layout_check_hetero_tp(2, 4, 4, false, err, sizeof(err)), -ENOTSUP);
	cr_assert(strstr(err, "replicated KV heads"), "message: %s", err);
	cr_assert(strstr(err, "TP 2 vs 4"), "message names both TP sizes: %s", err);
	cr_assert(strstr(err, "total_kv_heads 4"), "message names the head count: %s", err);
}

Test(runtime_layout, hetero_tp_equal_tp_and_mla_are_noops_whatever_the_heads)
{
	static const struct hetero_case c[] = {
		{1, 1, 64, false, 0}, {3, 3, 0, false, 0}, {1, 8, 64, true, 0}, {8, 1, 0, true, 0},
		{8, 16, 8, false, 0}, {16, 8, 8, false, 0}, {8, 16, 9, false, -ENOTSUP}, {1, 2, 2, false, -ENOTSUP},
	};
	expect_hetero(c, sizeof(c) / sizeof(c[0]));
}

Test(runtime_layout, hetero_tp_zero_sizes_and_unknown_heads_rejected_with_message)
{
	static const struct hetero_case c[] = {
		{0, 4, 4, false, -EINVAL}, {4, 0, 4, false, -EINVAL}, {0, 0, 4, true, -EINVAL}, {2, 4, 0, false, -EINVAL},
	};
	expect_hetero(c, sizeof(c) / sizeof(c[0]));
	char err[160] = "";
	cr_assert_eq(kvx_layout_check_hetero_tp(0, 4, 4, false, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "tp_local 0") && strstr(err, "tp_remote 4"), "message: %s", err);
	cr_assert_eq(kvx_layout_check_hetero_tp(2, 4, 0, false, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "total_kv_heads"), "message: %s", err);
	/* NULL err and a 1-byte buffer are safe. */
	cr_assert_eq(kvx_layout_check_hetero_tp(2, 4, 4, false, NULL, 0), -ENOTSUP);
	char one[1] = {'x'};
	cr_assert_eq(kvx_layout_check_hetero_tp(2, 4, 4, false, one, sizeof(one)), -ENOTSUP);
	cr_assert_eq(one[0], '\0');
}

Test(runtime_vectors, t25_expected_acks)
{
	uint32_t n;
	cr_assert_eq(kvx_ctl_expected_acks(4, 4, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(kvx_ctl_expected_acks(8, 4, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(kvx_ctl_expected_acks(4, 8, &n), 0);
	cr_assert_eq(n, 2);
	cr_assert_eq(kvx_ctl_expected_acks(4, 6, &n), -EINVAL);
}

Test(runtime_vectors, t26_resolve_ack_fan_in)
{
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *plain = entry(t, "tx-plain"), *x = entry(t, "tx-fanin");
	cr_assert_eq(kvx_xfer_resolve_ack(t, plain, 0, 4), 1); /* plain string = Ack(tid, 1) */
	cr_assert_eq(plain->state, KVX_XFER_S_TERMINAL);
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 8, 4), 0);
	cr_assert_eq(x->ack_count, 1);
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 8, 4), 1);
	cr_assert_eq(x->ack_count, 0);
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 8, 4), 0); /* duplicate */
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 6, 4), -EINVAL); /* no whole fan-in: rejected */
	/* An unknown id is never created by a lookup. */
	size_t live = kvx_xfer_live_count(t);
	cr_assert_eq(kvx_xfer_find(t, "tx-unknown"), NULL);
	cr_assert_eq(kvx_xfer_live_count(t), live);
	kvx_xfer_table_destroy(t);
}

Test(runtime_vectors, t27_fan_in_two_ticks)
{
	/* P worker get_finished over two ticks, each with one Ack(tx-fanin, 8), world_size 4:
	 * (empty, empty) then ({tx-fanin}, empty). The transfer's entry does the fan-in. */
	struct kvx_xfer_table *t = table();
	struct kvx_xfer *x = entry(t, "tx-fanin");
	/* tick 1 */
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 8, 4), 0, "tick 1: nothing finished");
	cr_assert_eq(x->state, KVX_XFER_S_LIVE);
	/* tick 2 */
	cr_assert_eq(kvx_xfer_resolve_ack(t, x, 8, 4), 1);
	cr_assert_eq(x->state, KVX_XFER_S_TERMINAL);
	cr_assert(x->ack_completed);
	kvx_xfer_table_destroy(t);
}

Test(runtime_vectors, t28_read_batch_done_releases)
{
	/* Every layer posted, every op terminal and successful: release P, DONE, blocks free. */
	struct kvx_life lf = {.kind = KVX_XFER_K_READ, .next_layer = 2, .done_posting = true};
	struct kvx_xfer_out o = step(NULL, NULL, &lf, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_DONE);
	cr_assert_eq(o.error, 0);
	cr_assert(lf.release_sent);
}

Test(runtime_vectors, t30_read_batch_pending_sends_nothing)
{
	struct kvx_xfer_ev settle = {.type = KVX_XFER_EV_READ_SETTLE};
	struct kvx_life lf = {.kind = KVX_XFER_K_READ, .next_layer = 2, .done_posting = true, .ops_out = 1};
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, 0); /* one batch in flight */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ, .next_layer = 1};
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, 0); /* layers left to post */
	cr_assert_not(lf.release_sent);
	/* Any failed + all terminal -> FAILED, still releases P and the blocks. */
	lf = (struct kvx_life){.kind = KVX_XFER_K_READ, .next_layer = 1, .done_posting = true, .failed = true,
			       .error = -ECONNRESET, .ops_out = 2};
	cr_assert_eq(step(NULL, NULL, &lf, settle).act, 0, "never while ops may still land");
	lf.ops_out = 0;
	struct kvx_xfer_out o = step(NULL, NULL, &lf, settle);
	cr_assert_eq(o.act, KVX_XFER_DO_SEND_RELEASE | KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE);
	cr_assert_eq(o.status, KVX_CPL_FAILED);
	cr_assert_eq(o.error, -ECONNRESET);
}

Test(runtime_vectors, t31_timeout_boundary_strict)
{
	/* Transfer timeout 120 s from start 5 s: pending exactly at the limit, timed out 1 ns
	 * later, for both consumer kinds and for a producer WRITE that has D's allocation. */
	const uint64_t s = 1000000000ull, tmo = 120 * s, dfr = 600 * s;
	const enum kvx_xfer_kind kinds[] = {KVX_XFER_K_READ, KVX_XFER_K_ANNOUNCE, KVX_XFER_K_WRITE};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		struct kvx_life lf = {.kind = kinds[i], .start_ns = 5 * s};
		struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 5 * s + tmo, .transfer_timeout_ns = tmo,
					   .defer_timeout_ns = dfr, .has_alloc = true};
		cr_assert_eq(step(NULL, NULL, &lf, tick).act, 0);
		cr_assert_not(lf.timed_out);
		tick.now_ns++;
		struct kvx_xfer_out o = step(NULL, NULL, &lf, tick);
		cr_assert(o.act & KVX_XFER_DO_REPORT);
		cr_assert_eq(o.status, KVX_CPL_TIMED_OUT);
		cr_assert_eq(o.error, -ETIMEDOUT);
		cr_assert(lf.timed_out);
		/* Reported: a later tick never reports it twice. */
		lf.reported = true;
		tick.now_ns = 5 * s + 2 * dfr;
		cr_assert_eq(step(NULL, NULL, &lf, tick).act & KVX_XFER_DO_REPORT, 0);
	}
	/* A clock reading older than the start (another thread's) is not a timeout. */
	struct kvx_life lf = {.kind = KVX_XFER_K_READ, .start_ns = 5 * s};
	struct kvx_xfer_ev tick = {.type = KVX_XFER_EV_TICK, .now_ns = 4 * s, .transfer_timeout_ns = tmo,
				   .defer_timeout_ns = dfr};
	cr_assert_eq(step(NULL, NULL, &lf, tick).act, 0);
}

Test(runtime_vectors, t28_read_release_target_and_frame_bytes)
{
	/* release target: 127.0.0.1, notify base 7000 + port_offset(0, remote_tp_rank(0,8,1)) */
	uint32_t rtp, off;
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 8, 1, &rtp, NULL, 0), 0);
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, 0, rtp, 1, &off), 0);
	cr_assert_eq(7000 + off, 7000);
	/* The frame: ("tx-release", "release", {"consumer_tp_size": 8}) with world_size 8. */
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_RELEASE;
	strcpy(m.transfer_id, "tx-release");
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 8;
	uint8_t buf[128];
	const uint8_t want[] = "\x83\xa4type\xa7release\xabtransfer_id\xaatx-release"
			       "\xb0" "consumer_tp_size\x08";
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)sizeof(want) - 1);
	cr_assert_arr_eq(buf, want, sizeof(want) - 1);
}

Test(runtime_vectors, t51_merge)
{
	uint32_t scratch[16];
	cr_assert_eq(kvx_plan_merge(NULL, NULL, NULL, 0, NULL), 0);
	uint64_t l1[] = {8, 0, 4}, r1[] = {108, 100, 104}, s1[] = {4, 4, 4};
	cr_assert_eq(kvx_plan_merge(l1, r1, s1, 3, scratch), 1);
	cr_assert(l1[0] == 0 && r1[0] == 100 && s1[0] == 12);
	uint64_t l2[] = {0, 4, 12}, r2[] = {0, 4, 8}, s2[] = {4, 4, 4};
	cr_assert_eq(kvx_plan_merge(l2, r2, s2, 3, scratch), 2);
	cr_assert(l2[0] == 0 && r2[0] == 0 && s2[0] == 8);
	cr_assert(l2[1] == 12 && r2[1] == 8 && s2[1] == 4);
	uint64_t l3[] = {0, 4}, r3[] = {0, 100}, s3[] = {4, 4};
	cr_assert_eq(kvx_plan_merge(l3, r3, s3, 2, scratch), 2);
	cr_assert(l3[1] == 4 && r3[1] == 100);
	uint64_t l4[] = {0, 0}, r4[] = {0, 4}, s4[] = {4, 4}; /* duplicates never merge */
	cr_assert_eq(kvx_plan_merge(l4, r4, s4, 2, scratch), 2);
	/* Unsorted input without scratch is rejected. */
	uint64_t l5[] = {4, 0}, r5[] = {4, 0}, s5[] = {4, 4};
	cr_assert_eq(kvx_plan_merge(l5, r5, s5, 2, NULL), -EINVAL);
}

/* ---- MoRIIO handshake form for split K/V layers (docs/protocol.md §3.1, §4.1) ----------------- */

/* Hand-built msgpack, written byte by byte from the msgpack spec (smallest encodings, as
 * Python's msgpack.packb(use_bin_type=True) writes them), independent of msgpack-c. */
struct mp {
	uint8_t b[2048];
	size_t n;
};

static void mp_byte(struct mp *m, uint8_t v)
{
	cr_assert_lt(m->n, sizeof(m->b));
	m->b[m->n++] = v;
}

static void mp_be(struct mp *m, uint64_t v, unsigned bytes)
{
	for (unsigned i = bytes; i-- > 0;)
		mp_byte(m, (uint8_t)(v >> (8 * i)));
}

static void mp_uint(struct mp *m, uint64_t v)
{
	if (v < 0x80) {
		mp_byte(m, (uint8_t)v);
	} else if (v <= 0xff) {
		mp_byte(m, 0xcc);
		mp_be(m, v, 1);
	} else if (v <= 0xffff) {
		mp_byte(m, 0xcd);
		mp_be(m, v, 2);
	} else if (v <= 0xffffffffull) {
		mp_byte(m, 0xce);
		mp_be(m, v, 4);
	} else {
		mp_byte(m, 0xcf);
		mp_be(m, v, 8);
	}
}

static void mp_str(struct mp *m, const char *s)
{
	size_t n = strlen(s);
	cr_assert_lt(n, 256);
	if (n < 32) {
		mp_byte(m, (uint8_t)(0xa0 | n));
	} else {
		mp_byte(m, 0xd9);
		mp_byte(m, (uint8_t)n);
	}
	for (size_t i = 0; i < n; i++)
		mp_byte(m, (uint8_t)s[i]);
}

static void mp_bin(struct mp *m, const struct mp *body)
{
	cr_assert_lt(body->n, 256);
	mp_byte(m, 0xc4);
	mp_byte(m, (uint8_t)body->n);
	for (size_t i = 0; i < body->n; i++)
		mp_byte(m, body->b[i]);
}

static void mp_arr(struct mp *m, uint32_t n)
{
	cr_assert_lt(n, 16);
	mp_byte(m, (uint8_t)(0x90 | n));
}

static void mp_map(struct mp *m, uint32_t n)
{
	cr_assert_lt(n, 16);
	mp_byte(m, (uint8_t)(0x80 | n));
}

#define MR_KEY0 0x1234u
#define MR_KEY1 0xabcdef01u
static const uint64_t g_base[2] = {0x7f1200000000ull, 0x7f1200100000ull};
static const char *const g_lname[2] = {"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"};

/* Two split layers [2,8,4,2,3] bf16 (T1 geometry): what the engine advertises through
 * kvx_layout_meta_regions(), and one whole-tensor MemoryDesc per layer. */
static void split_engine(struct kvx_msg_meta *m, struct kvx_msg_region reg[4], struct kvx_msg_layers *l,
			 struct kvx_msg_memdesc desc[2], bool kvx)
{
	struct kvx_layout_tensor t = tensor(5, (uint64_t[]){2, 8, 4, 2, 3});
	struct kvx_layout_geom g;
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	const uint64_t keys[2] = {MR_KEY0, MR_KEY1};
	uint32_t nr = 0;
	for (int i = 0; i < 2; i++) {
		int k = kvx_layout_meta_regions(&g, &t, g_base[i], keys[i], reg + nr);
		cr_assert_eq(k, 2, "split layer %d: K and V regions", i);
		nr += (uint32_t)k;
		desc[i] = (struct kvx_msg_memdesc){.id = (uint32_t)i, .device_id = 0, .addr = g_base[i],
						   .len_bytes = 2 * 8 * 48, .loc = 2};
		strcpy(desc[i].layer, g_lname[i]);
	}
	memset(m, 0, sizeof(*m));
	strcpy(m->engine_id, "10.0.0.1:6301");
	strcpy(m->engine_key, "producer:10.0.0.1:6301:tp0:dp0");
	strcpy(m->hostname, "node-a");
	strcpy(m->host, "10.0.0.1");
	m->kv_port = 0;
	m->num_blocks = g.num_blocks;
	m->block_len = g.block_len;
	strcpy(m->attn_backend, "FLASH_ATTN");
	m->has_kvx = kvx;
	m->version = KVX_MSG_PROTO_VERSION;
	m->epoch = 7;
	strcpy(m->transport, "tcp");
	strcpy(m->layout, "split");
	m->regions = reg;
	m->num_regions = nr;
	memset(l, 0, sizeof(*l));
	strcpy(l->engine_key, m->engine_key);
	l->descs = desc;
	l->num_descs = 2;
}

/* MoRIIO's AgentMetadata for split_engine(): six keys, kv_caches_base_addr = every layer's
 * cache[0] then cache[1] (8 blocks x 48 bytes apart), num_blocks 8, block_len 48. */
static void moriio_meta_bytes(struct mp *e)
{
	struct mp desc = {.n = 0};
	mp_arr(&desc, 4);
	mp_str(&desc, "producer:10.0.0.1:6301:tp0:dp0");
	mp_str(&desc, "node-a");
	mp_str(&desc, "10.0.0.1");
	mp_uint(&desc, 0);
	mp_str(e, "engine_id");
	mp_str(e, "10.0.0.1:6301");
	mp_str(e, "agent_metadata");
	mp_bin(e, &desc);
	mp_str(e, "kv_caches_base_addr");
	mp_arr(e, 4);
	for (int i = 0; i < 2; i++) {
		mp_uint(e, g_base[i]);
		mp_uint(e, g_base[i] + 8 * 48);
	}
	mp_str(e, "num_blocks");
	mp_uint(e, 8);
	mp_str(e, "block_len");
	mp_uint(e, 48);
	mp_str(e, "attn_backend_name");
	mp_str(e, "FLASH_ATTN");
}

static void moriio_layers_bytes(struct mp *e)
{
	mp_map(e, 2);
	for (int i = 0; i < 2; i++) {
		struct mp md = {.n = 0};
		mp_arr(&md, 6);
		mp_str(&md, "producer:10.0.0.1:6301:tp0:dp0");
		mp_uint(&md, (uint64_t)i);
		mp_uint(&md, 0);           /* deviceId */
		mp_uint(&md, g_base[i]);   /* data: the whole layer tensor */
		mp_uint(&md, 2 * 8 * 48);  /* size: K and V planes */
		mp_uint(&md, 2);           /* loc GPU */
		mp_str(e, g_lname[i]);
		mp_arr(e, 1);
		mp_bin(e, &md);
	}
}

static void expect_bytes(const uint8_t *got, int n, const struct mp *want, const char *what)
{
	cr_assert_eq(n, (int)want->n, "%s: %d bytes, MoRIIO form has %zu", what, n, want->n);
	for (size_t i = 0; i < want->n; i++)
		cr_assert_eq(got[i], want->b[i], "%s: byte %zu is 0x%02x, MoRIIO form has 0x%02x", what, i, got[i],
			     want->b[i]);
}

Test(runtime_vectors, t13_split_layer_advertises_k_and_v_regions)
{
	struct kvx_msg_region r[2];
	struct kvx_layout_geom g;
	struct kvx_layout_tensor t = tensor(5, (uint64_t[]){2, 8, 4, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_meta_regions(&g, &t, 0x10000, 77, r), 2);
	cr_assert_eq(r[0].addr, 0x10000);
	cr_assert_eq(r[1].addr, 0x10000 + 8 * 48, "V region at cache[1]");
	cr_assert_eq(r[0].len_bytes, 8 * 48);
	cr_assert_eq(r[1].len_bytes, 8 * 48);
	cr_assert_eq(r[0].key, 77);
	cr_assert_eq(r[1].key, 77, "V plane lies in the layer's one memory region");

	/* Kernel-block split [2,16,2,2,3] (T5): planes of 8 logical blocks of 48 bytes. */
	t = tensor(5, (uint64_t[]){2, 16, 2, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_meta_regions(&g, &t, 0x10000, 5, r), 2);
	cr_assert_eq(r[1].addr, 0x10000 + 16 * 12 * 2);
	cr_assert_eq(r[0].len_bytes, 8 * 48);

	t = tensor(5, (uint64_t[]){8, 2, 4, 2, 3});
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, 0, &g, NULL, 0), 0);
	memset(r, 0, sizeof(r));
	cr_assert_eq(kvx_layout_meta_regions(&g, &t, 0x20000, 9, r), 1);
	cr_assert_eq(r[0].addr, 0x20000);
	cr_assert_eq(r[0].len_bytes, 8 * 2 * 48);
	cr_assert_eq(r[0].key, 9);
	cr_assert_eq(r[1].addr, 0, "one region only");

	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	t = tensor(3, (uint64_t[]){8, 4, 3});
	cr_assert_eq(kvx_layout_geometry(&mla, &t, 0, &g, NULL, 0), 0);
	cr_assert_eq(kvx_layout_meta_regions(&g, &t, 0x30000, 1, r), 1);
	cr_assert_eq(r[0].len_bytes, 8 * 24);
	cr_assert_eq(kvx_layout_meta_regions(NULL, &t, 0x30000, 1, r), -EINVAL);
}

Test(runtime_layout, split_handshake_is_byte_identical_to_moriio_form)
{
	struct kvx_msg_region reg[4];
	struct kvx_msg_memdesc desc[2];
	struct kvx_msg_meta m;
	struct kvx_msg_layers l;
	uint8_t buf[2048];

	/* (a) without kvx keys: exactly MoRIIO's six-key map. */
	split_engine(&m, reg, &l, desc, false);
	struct mp e = {.n = 0};
	mp_map(&e, 6);
	moriio_meta_bytes(&e);
	expect_bytes(buf, kvx_msg_meta_encode(&m, buf, sizeof(buf)), &e, "metadata (a)");

	/* (a) with kvx keys: the same six pairs first, then kvx_ keys a MoRIIO decoder ignores;
	 * kvx_regions repeats every advertised region with its length and the layer's key. */
	split_engine(&m, reg, &l, desc, true);
	e.n = 0;
	mp_map(&e, 11);
	moriio_meta_bytes(&e);
	mp_str(&e, "kvx_version");
	mp_uint(&e, KVX_MSG_PROTO_VERSION);
	mp_str(&e, "kvx_epoch");
	mp_uint(&e, 7);
	mp_str(&e, "kvx_transport");
	mp_str(&e, "tcp");
	mp_str(&e, "kvx_layout");
	mp_str(&e, "split");
	mp_str(&e, "kvx_regions");
	mp_arr(&e, 4);
	for (int i = 0; i < 4; i++) {
		mp_arr(&e, 3);
		mp_uint(&e, g_base[i / 2] + (uint64_t)(i % 2) * 8 * 48);
		mp_uint(&e, 8 * 48);
		mp_uint(&e, i / 2 ? MR_KEY1 : MR_KEY0);
	}
	expect_bytes(buf, kvx_msg_meta_encode(&m, buf, sizeof(buf)), &e, "metadata (a) + kvx_");

	/* (b): one MemoryDesc of the whole tensor per layer. */
	e.n = 0;
	moriio_layers_bytes(&e);
	expect_bytes(buf, kvx_msg_layers_encode(&l, buf, sizeof(buf)), &e, "region map (b)");
}

static const uint32_t two_each[2] = {2, 2}, one_each[2] = {1, 1}, bad_count[2] = {2, 3};

/* Decode hand-built MoRIIO bytes (a) and (b) into d/dl with caller storage. */
static void decode_moriio(struct kvx_msg_meta *d, struct kvx_msg_region *dr, struct kvx_msg_layers *dl,
			  struct kvx_msg_memdesc *dd)
{
	struct mp a = {.n = 0}, b = {.n = 0};
	mp_map(&a, 6);
	moriio_meta_bytes(&a);
	moriio_layers_bytes(&b);
	char err[256] = "";
	memset(d, 0, sizeof(*d));
	d->regions = dr;
	d->regions_cap = 8;
	cr_assert_eq(kvx_msg_meta_decode(a.b, a.n, d, err, sizeof(err)), 0, "%s", err);
	memset(dl, 0, sizeof(*dl));
	dl->descs = dd;
	dl->descs_cap = 4;
	cr_assert_eq(kvx_msg_layers_decode(b.b, b.n, dl, err, sizeof(err)), 0, "%s", err);
}

Test(runtime_layout, moriio_split_peer_regions_map_to_layers_and_match_the_offsets)
{
	struct kvx_msg_region dr[8];
	struct kvx_msg_memdesc dd[4];
	struct kvx_msg_meta d;
	struct kvx_msg_layers dl;
	decode_moriio(&d, dr, &dl, dd);
	cr_assert_not(d.has_kvx);
	cr_assert_eq(d.num_regions, 4);
	cr_assert_eq(dl.num_layers, 2);

	struct kvx_layout_peer_layer pl[2];
	char err[256] = "";
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), 2, "%s", err);
	for (uint32_t i = 0; i < 2; i++) {
		cr_assert_eq(pl[i].desc, i);
		cr_assert_eq(pl[i].region, 2 * i);
		cr_assert_eq(pl[i].nregions, 2);
		cr_assert_eq(pl[i].mr_addr, g_base[i]);
		cr_assert_eq(pl[i].mr_len, 768);
		cr_assert_eq(pl[i].k_addr, g_base[i]);
		cr_assert_eq(pl[i].kv_offset, 384);
	}
	/* The local split geometry with the peer's num_blocks 8: V at es*remote_kv_stride = 384. */
	struct kvx_layout_tensor t = tensor(5, (uint64_t[]){2, 16, 4, 2, 3});
	struct kvx_layout_geom g;
	cr_assert_eq(kvx_layout_geometry(&g_spec, &t, d.num_blocks, &g, NULL, 0), 0);
	cr_assert_eq(g.remote_kv_stride, 8 * 24);
	cr_assert_eq(kvx_layout_check_peer_layer(&g, &pl[0], err, sizeof(err)), 0, "%s", err);
	/* A wrong peer num_blocks (16) puts V at +768 in the plan: rejected, values named. */
	kvx_layout_set_remote_blocks(&g, 16);
	cr_assert_eq(kvx_layout_check_peer_layer(&g, &pl[0], err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "384") && strstr(err, "768"), "message: %s", err);
	/* One region per layer does not fit a split local layout, and vice versa. */
	struct kvx_layout_peer_layer one = pl[0];
	one.nregions = 1;
	one.kv_offset = 0;
	kvx_layout_set_remote_blocks(&g, 8);
	cr_assert_eq(kvx_layout_check_peer_layer(&g, &one, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "1 regions"), "message: %s", err);
	struct kvx_layout_tensor ti = tensor(5, (uint64_t[]){8, 2, 4, 2, 3});
	struct kvx_layout_geom gi;
	cr_assert_eq(kvx_layout_geometry(&g_spec, &ti, 8, &gi, NULL, 0), 0);
	cr_assert_eq(kvx_layout_check_peer_layer(&gi, &pl[0], err, sizeof(err)), -EPROTO);
	one.mr_len = 768;
	cr_assert_eq(kvx_layout_check_peer_layer(&gi, &one, err, sizeof(err)), 0, "%s", err);
	one.mr_len = 767;
	cr_assert_eq(kvx_layout_check_peer_layer(&gi, &one, err, sizeof(err)), -EPROTO, "last block past the MR");
	cr_assert(strstr(err, "768") && strstr(err, "767"), "message: %s", err);
}

Test(runtime_layout, peer_regions_rejections_name_layer_and_values)
{
	struct kvx_msg_region dr[8];
	struct kvx_msg_memdesc dd[4];
	struct kvx_msg_meta d;
	struct kvx_msg_layers dl;
	struct kvx_layout_peer_layer pl[2];
	char err[256] = "";
	decode_moriio(&d, dr, &dl, dd);
	/* Counts: 4 regions are not 1 per layer, nor 2 + 1 (a split and a one-region layer); the
	 * peer's 2 layers are not 1; a count of 3 is no layout. */
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, one_each, 2, pl, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "4 regions") && strstr(err, "2 layers") && strstr(err, "have 2"), "message: %s", err);
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, (const uint32_t[]){2, 1}, 2, pl, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "have 3"), "message: %s", err);
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 1, pl, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "2 layers, this engine 1"), "message: %s", err);
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, bad_count, 2, pl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "regions_per_layer[1] = 3"), "message: %s", err);
	cr_assert_eq(kvx_layout_peer_regions(NULL, &dl, two_each, 2, pl, err, sizeof(err)), -EINVAL);
	/* V region of layer 1 outside its MemoryDesc (points into layer 0). */
	dr[3].addr = g_base[0] + 384;
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, g_lname[1]) && strstr(err, "region 3"), "message: %s", err);
	/* V not above K. */
	decode_moriio(&d, dr, &dl, dd);
	dr[1].addr = dr[0].addr;
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "V region"), "message: %s", err);
	/* kvx_ lengths: a K region that runs into V, and one past the MemoryDesc end. */
	decode_moriio(&d, dr, &dl, dd);
	dr[0].len_bytes = 385;
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), -EPROTO);
	dr[0].len_bytes = 384;
	dr[1].len_bytes = 385;
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), -EPROTO);
	cr_assert(strstr(err, "outside its MemoryDesc"), "message: %s", err);
	dr[1].len_bytes = 384;
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), 2, "%s", err);
}

Test(runtime_layout, kvxfer_split_handshake_roundtrips_through_peer_regions)
{
	struct kvx_msg_region reg[4], dr[4];
	struct kvx_msg_memdesc desc[2], dd[2];
	struct kvx_msg_meta m, d;
	struct kvx_msg_layers l, dl;
	uint8_t a[2048], b[2048];
	char err[256] = "";
	split_engine(&m, reg, &l, desc, true);
	int na = kvx_msg_meta_encode(&m, a, sizeof(a)), nb = kvx_msg_layers_encode(&l, b, sizeof(b));
	cr_assert_gt(na, 0);
	cr_assert_gt(nb, 0);
	memset(&d, 0, sizeof(d));
	d.regions = dr;
	d.regions_cap = 4;
	cr_assert_eq(kvx_msg_meta_decode(a, (size_t)na, &d, err, sizeof(err)), 0, "%s", err);
	memset(&dl, 0, sizeof(dl));
	dl.descs = dd;
	dl.descs_cap = 2;
	cr_assert_eq(kvx_msg_layers_decode(b, (size_t)nb, &dl, err, sizeof(err)), 0, "%s", err);
	cr_assert(d.has_kvx);
	cr_assert_arr_eq(dr, reg, sizeof(reg), "regions with lengths and keys survive");
	struct kvx_layout_peer_layer pl[2];
	cr_assert_eq(kvx_layout_peer_regions(&d, &dl, two_each, 2, pl, err, sizeof(err)), 2, "%s", err);
	cr_assert_eq(pl[1].kv_offset, 384);
	cr_assert_eq(d.regions[pl[1].region + 1].key, MR_KEY1);
}

Test(runtime_layout, peer_regions_mixed_split_and_mla_layers)
{
	/* A split layer then an MLA layer (e.g. an indexer): 2 + 1 regions, assigned in order. */
	struct kvx_layout_tensor ts = tensor(5, (uint64_t[]){2, 8, 4, 2, 3});
	struct kvx_layout_tensor tm = tensor(3, (uint64_t[]){8, 4, 3});
	struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	struct kvx_layout_geom gs, gm;
	cr_assert_eq(kvx_layout_geometry(&g_spec, &ts, 8, &gs, NULL, 0), 0);
	cr_assert_eq(kvx_layout_geometry(&mla, &tm, 8, &gm, NULL, 0), 0);
	struct kvx_msg_region reg[3];
	uint32_t per[2];
	per[0] = (uint32_t)kvx_layout_meta_regions(&gs, &ts, 0x100000, 1, reg);
	per[1] = (uint32_t)kvx_layout_meta_regions(&gm, &tm, 0x200000, 2, reg + per[0]);
	cr_assert_eq(per[0], 2);
	cr_assert_eq(per[1], 1);
	struct kvx_msg_memdesc desc[2] = {{.layer = "attn", .addr = 0x100000, .len_bytes = 768, .loc = 1},
					  {.layer = "indexer", .id = 1, .addr = 0x200000, .len_bytes = 192, .loc = 1}};
	struct kvx_msg_meta m = {.num_regions = 3, .regions = reg, .has_kvx = true};
	struct kvx_msg_layers l = {.num_descs = 2, .descs = desc};
	struct kvx_layout_peer_layer pl[2];
	char err[256] = "";
	cr_assert_eq(kvx_layout_peer_regions(&m, &l, per, 2, pl, err, sizeof(err)), 2, "%s", err);
	cr_assert_eq(pl[0].region, 0);
	cr_assert_eq(pl[0].nregions, 2);
	cr_assert_eq(pl[0].kv_offset, 384);
	cr_assert_eq(pl[1].region, 2);
	cr_assert_eq(pl[1].nregions, 1);
	cr_assert_eq(pl[1].k_addr, 0x200000);
	cr_assert_eq(pl[1].kv_offset, 0);
	cr_assert_eq(kvx_layout_check_peer_layer(&gs, &pl[0], err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvx_layout_check_peer_layer(&gm, &pl[1], err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(kvx_layout_check_peer_layer(&gm, &pl[0], err, sizeof(err)), -EPROTO, "split peer, MLA local");
}

/* kvx_plan_build (the one-pass planner the plan cache uses) against offsets + merge, entry for
 * entry, over split (K/V planes), MLA, plain interleaved (offsets-then-merge route) and
 * kernel-block interleaved geometries, with random, distinct random, sorted, duplicated and
 * plane-crossing ids. */
static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void expect_build_equals_offsets_merge(const struct kvx_layout_geom *g, const uint32_t *lid,
					      const uint32_t *rid, size_t n, const char *what)
{
	enum { CAP = 2 * 600 };
	static uint64_t l1[CAP], r1[CAP], s1[CAP], l2[CAP], r2[CAP], s2[CAP], scratch[CAP];
	cr_assert_leq(n, 600);
	int a = kvx_plan_build(g, lid, rid, n, l1, r1, s1, CAP, scratch);
	int k = kvx_plan_offsets(g, lid, n, rid, n, l2, r2, s2, CAP);
	cr_assert_geq(k, 0, "%s: offsets %d", what, k);
	int b = kvx_plan_merge(l2, r2, s2, (size_t)k, (uint32_t *)scratch);
	cr_assert_eq(a, b, "%s: build gave %d ranges, offsets+merge %d", what, a, b);
	for (int i = 0; i < a; i++)
		cr_assert(l1[i] == l2[i] && r1[i] == r2[i] && s1[i] == s2[i],
			  "%s: range %d (%llu,%llu,%llu) != (%llu,%llu,%llu)", what, i, (unsigned long long)l1[i],
			  (unsigned long long)r1[i], (unsigned long long)s1[i], (unsigned long long)l2[i],
			  (unsigned long long)r2[i], (unsigned long long)s2[i]);
}

static struct kvx_layout_geom geom_of(const struct kvx_layout_spec *spec, uint32_t ndim, const uint64_t *shape,
				      uint64_t remote_nb)
{
	struct kvx_layout_tensor t = tensor(ndim, shape);
	struct kvx_layout_geom g;
	char err[128] = "";
	cr_assert_eq(kvx_layout_geometry(spec, &t, remote_nb, &g, err, sizeof(err)), 0, "geometry: %s", err);
	return g;
}

Test(runtime_layout, plan_build_equals_offsets_then_merge)
{
	const struct kvx_layout_spec mla = {.block_size = 4, .is_mla = true};
	const struct kvx_layout_spec kb = {.block_size = 8, .num_kv_heads = 2, .head_size = 3};
	struct {
		const char *name;
		struct kvx_layout_geom g;
	} geo[] = {
		{"split", geom_of(&g_spec, 5, (uint64_t[]){2, 700, 4, 2, 3}, 900)},
		{"split big ids", geom_of(&g_spec, 5, (uint64_t[]){2, 5000000, 4, 2, 3}, 5000000)},
		{"mla", geom_of(&mla, 3, (uint64_t[]){700, 4, 5}, 0)},
		{"interleaved", geom_of(&g_spec, 5, (uint64_t[]){700, 2, 4, 2, 3}, 0)},
		{"interleaved kernel", geom_of(&kb, 5, (uint64_t[]){1400, 2, 4, 2, 3}, 0)},
	};
	uint32_t lid[600], rid[600];
	uint64_t seed = 0x1234567;
	for (size_t gi = 0; gi < sizeof(geo) / sizeof(geo[0]); gi++) {
		const struct kvx_layout_geom *g = &geo[gi].g;
		uint32_t nb = (uint32_t)g->num_blocks;
		for (int trial = 0; trial < 40; trial++) {
			size_t n = 1 + xs(&seed) % 600;
			if (trial % 5 == 4) {
				/* distinct random ids (a shuffled prefix of the pool): with nb <= 5n
				 * the planner sorts by placement instead of radix */
				static uint32_t perm[1400];
				uint32_t m = nb < 1400 ? nb : 1400;
				n = 140 + n % 461;
				for (uint32_t i = 0; i < m; i++)
					perm[i] = i;
				for (size_t i = 0; i < n; i++) {
					size_t j = i + xs(&seed) % (m - i);
					uint32_t t = perm[i];
					perm[i] = perm[j];
					perm[j] = t;
					lid[i] = perm[i];
					rid[i] = (uint32_t)(xs(&seed) % nb);
				}
				char what[64];
				snprintf(what, sizeof(what), "%s trial %d n %zu distinct", geo[gi].name, trial, n);
				expect_build_equals_offsets_merge(g, lid, rid, n, what);
				continue;
			}
			for (size_t i = 0; i < n; i++) {
				switch (trial % 4) {
				case 0: /* random, duplicates possible */
					lid[i] = (uint32_t)(xs(&seed) % nb);
					rid[i] = (uint32_t)(xs(&seed) % nb);
					break;
				case 1: /* sorted runs, both sides contiguous in stretches */
					lid[i] = (uint32_t)((i + trial) % nb);
					rid[i] = (uint32_t)((i / 7 * 9 + i % 7) % nb);
					break;
				case 2: /* reversed contiguous: sorts into one run per plane */
					lid[i] = (uint32_t)(n - 1 - i);
					rid[i] = (uint32_t)(n - 1 - i + 3);
					break;
				default: /* few distinct ids: many duplicates */
					lid[i] = (uint32_t)(xs(&seed) % 5);
					rid[i] = (uint32_t)(xs(&seed) % 5);
					break;
				}
			}
			char what[64];
			snprintf(what, sizeof(what), "%s trial %d n %zu", geo[gi].name, trial, n);
			expect_build_equals_offsets_merge(g, lid, rid, n, what);
		}
	}
}

Test(runtime_layout, plan_build_merges_across_the_k_to_v_plane_boundary)
{
	/* Local last block pairs with the peer's last block and block 0 with block 0: the K run ends
	 * where the V plane starts on both sides (same num_blocks), so one range covers both. */
	struct kvx_layout_geom g = geom_of(&g_spec, 5, (uint64_t[]){2, 4, 4, 2, 3}, 4);
	uint32_t lid[] = {0, 3}, rid[] = {0, 3};
	uint64_t l[4], r[4], s[4], scratch[4];
	cr_assert_eq(kvx_plan_build(&g, lid, rid, 2, l, r, s, 4, scratch), 3);
	cr_assert(l[0] == 0 && r[0] == 0 && s[0] == g.block_len);
	cr_assert(l[1] == 3 * g.block_len && r[1] == 3 * g.block_len && s[1] == 2 * g.block_len);
	cr_assert(l[2] == 7 * g.block_len && s[2] == g.block_len);
	expect_build_equals_offsets_merge(&g, lid, rid, 2, "plane boundary");
}

Test(runtime_layout, plan_build_rejects_out_of_range_ids_and_small_output)
{
	struct kvx_layout_geom g = geom_of(&g_spec, 5, (uint64_t[]){2, 8, 4, 2, 3}, 8);
	uint32_t lid[] = {1, 8}, rid[] = {0, 1};
	uint64_t l[4], r[4], s[4], scratch[4];
	cr_assert_eq(kvx_plan_build(&g, lid, rid, 2, l, r, s, 4, scratch), -EINVAL);
	lid[1] = 7;
	cr_assert_eq(kvx_plan_build(&g, lid, rid, 2, l, r, s, 3, scratch), -ENOBUFS);
	cr_assert_eq(kvx_plan_build(&g, lid, rid, 0, l, r, s, 0, scratch), 0);
	cr_assert_eq(kvx_plan_build(&g, lid, rid, 2, l, r, s, 4, scratch), 4);
}
