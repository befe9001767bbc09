/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer-perf plan: time to plan a transfer (offsets per PROTOCOL.md §4.3 + merge per §4.4) for
 * a real model's KV layout, in ns per block-layer, for random and contiguous block ids.
 * Three ways are measured in the same run on the same inputs:
 *   - kvx (per layer): kvx_plan_offsets + kvx_plan_merge for every layer (no cache);
 *   - kvx (cached):    kvx_plan_cache_get per layer (planned once per geometry, T15);
 *   - peer (qsort):    the same offsets, then libc qsort of the triples and a linear merge,
 *                      which is what a straightforward re-implementation does.
 * The ratio peer/kvx is the figure to compare across machines. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvxfer/layout.h"
#include "models.h"
#include "perf.h"
#include "perf_util.h"

struct plan_cfg {
	const char *models;
	const char *model;
	const char *json;
	uint32_t blocks;
	uint32_t block_tokens;
	uint64_t pool_blocks;
	uint64_t remote_pool_blocks;
	uint64_t min_ns;
	uint64_t seed;
};

struct plan_result {
	const char *pattern;
	uint32_t layers, blocks;
	size_t entries, merged;
	double ns_kvx, ns_cached, ns_peer; /* ns per block-layer */
};

static uint64_t rnd(uint64_t *s)
{
	uint64_t x = *s; /* xorshift64* */
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 2685821657736338717ull;
}

/* n distinct ids out of [0, pool), random order (partial Fisher-Yates). */
static int random_ids(uint32_t *out, uint32_t n, uint64_t pool, uint64_t *seed)
{
	uint32_t *all = malloc(pool * sizeof(*all));
	if (!all)
		return -ENOMEM;
	for (uint64_t i = 0; i < pool; i++)
		all[i] = (uint32_t)i;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t j = i + rnd(seed) % (pool - i);
		uint32_t t = all[i];
		all[i] = all[j];
		all[j] = t;
		out[i] = all[i];
	}
	free(all);
	return 0;
}

struct triple {
	uint64_t l, r, s;
};

static int cmp_triple(const void *a, const void *b)
{
	const struct triple *x = a, *y = b;
	return x->l < y->l ? -1 : x->l > y->l;
}

/* Peer: sort the triples with qsort, then merge contiguous neighbours. */
static size_t peer_plan(const struct kvx_layout_geom *g, const uint32_t *lid, const uint32_t *rid, size_t n,
			uint64_t *l, uint64_t *r, uint64_t *s, struct triple *tr)
{
	int k = kvx_plan_offsets(g, lid, n, rid, n, l, r, s, 2 * n);
	if (k <= 0)
		return 0;
	for (int i = 0; i < k; i++)
		tr[i] = (struct triple){l[i], r[i], s[i]};
	qsort(tr, (size_t)k, sizeof(*tr), cmp_triple);
	size_t out = 0;
	for (int i = 1; i < k; i++) {
		if (tr[i].l == tr[out].l + tr[out].s && tr[i].r == tr[out].r + tr[out].s)
			tr[out].s += tr[i].s;
		else
			tr[++out] = tr[i];
	}
	return out + 1;
}

static int run_pattern(const struct plan_cfg *c, const struct perf_model *m, bool contiguous,
		       struct plan_result *res)
{
	int rc = -ENOMEM;
	uint32_t n = c->blocks;
	uint32_t *lid = malloc(n * sizeof(*lid)), *rid = malloc(n * sizeof(*rid));
	uint64_t *l = malloc(2 * n * sizeof(*l)), *r = malloc(2 * n * sizeof(*r)), *s = malloc(2 * n * sizeof(*s));
	uint32_t *scratch = malloc(4 * n * sizeof(*scratch));
	struct triple *tr = malloc(2 * n * sizeof(*tr));
	struct kvx_plan_cache *cache = NULL;
	if (!lid || !rid || !l || !r || !s || !scratch || !tr || kvx_plan_cache_create(n, &cache))
		goto out;
	uint64_t seed = c->seed;
	if (contiguous) {
		uint32_t ls = (uint32_t)(rnd(&seed) % (c->pool_blocks - n + 1));
		uint32_t rs = (uint32_t)(rnd(&seed) % (c->remote_pool_blocks - n + 1));
		for (uint32_t i = 0; i < n; i++) {
			lid[i] = ls + i;
			rid[i] = rs + i;
		}
	} else if (random_ids(lid, n, c->pool_blocks, &seed) || random_ids(rid, n, c->remote_pool_blocks, &seed)) {
		goto out;
	}

	struct kvx_layout_spec spec = {.block_size = c->block_tokens, .num_kv_heads = m->num_kv_heads,
				       .head_size = m->head_dim, .is_mla = m->mla};
	struct kvx_layout_tensor t = {.elem_size = PERF_MODEL_ELEM_BYTES};
	if (m->mla) {
		uint64_t sh[3] = {c->pool_blocks, c->block_tokens, m->mla_latent_dim};
		t.ndim = 3;
		memcpy(t.shape, sh, sizeof(sh));
		t.stride[2] = 1;
		t.stride[1] = sh[2];
		t.stride[0] = sh[1] * sh[2];
	} else {
		uint64_t sh[5] = {2, c->pool_blocks, c->block_tokens, m->num_kv_heads, m->head_dim};
		t.ndim = 5;
		memcpy(t.shape, sh, sizeof(sh));
		t.stride[4] = 1;
		for (int i = 3; i >= 0; i--)
			t.stride[i] = t.stride[i + 1] * sh[i + 1];
	}
	struct kvx_layout_geom g;
	char err[160];
	rc = kvx_layout_geometry(&spec, &t, c->remote_pool_blocks, &g, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvxfer-perf plan: %s: %s\n", m->name, err);
		goto out;
	}
	const uint32_t layers = m->num_layers;
	volatile size_t sink = 0;
	size_t merged = 0, entries = (size_t)n * g.transfers_per_block;

	/* Reference result for the cross-check: kvx and the peer must agree. */
	int k = kvx_plan_offsets(&g, lid, n, rid, n, l, r, s, 2 * (size_t)n);
	int km = k < 0 ? k : kvx_plan_merge(l, r, s, (size_t)k, scratch);
	size_t kp = peer_plan(&g, lid, rid, n, l + 0, r + 0, s + 0, tr);
	if (km < 0 || (size_t)km != kp) {
		fprintf(stderr, "kvxfer-perf plan: kvx merged %d ranges, peer %zu: results differ\n", km, kp);
		rc = -EPROTO;
		goto out;
	}
	merged = (size_t)km;

	double best[3] = {1e300, 1e300, 1e300};
	for (int way = 0; way < 3; way++) {
		uint64_t start = kvx_now_ns(), iters = 0, now;
		do {
			uint64_t t0 = kvx_now_ns();
			for (uint32_t li = 0; li < layers; li++) {
				if (way == 0) {
					int kk = kvx_plan_offsets(&g, lid, n, rid, n, l, r, s, 2 * (size_t)n);
					sink += (size_t)kvx_plan_merge(l, r, s, (size_t)kk, scratch);
				} else if (way == 1) {
					struct kvx_plan p;
					if (li == 0)
						kvx_plan_cache_reset(cache);
					if (kvx_plan_cache_get(cache, &g, lid, rid, n, &p) < 0) {
						rc = -EIO;
						goto out;
					}
					sink += p.n;
				} else {
					sink += peer_plan(&g, lid, rid, n, l, r, s, tr);
				}
			}
			now = kvx_now_ns();
			double per = (double)(now - t0) / ((double)layers * n);
			if (per < best[way])
				best[way] = per;
			iters++;
		} while (now - start < c->min_ns || iters < 3);
	}
	(void)sink;
	*res = (struct plan_result){contiguous ? "contiguous" : "random", layers, n, entries, merged,
				    best[0], best[1], best[2]};
	rc = 0;
out:
	kvx_plan_cache_destroy(cache);
	free(lid);
	free(rid);
	free(l);
	free(r);
	free(s);
	free(scratch);
	free(tr);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvxfer-perf plan --model NAME [--models FILE] [--blocks N] [--block-tokens N]\n"
		   "                        [--pool N] [--remote-pool N] [--min-ms MS] [--seed S] [--json FILE]\n"
		   "Time to plan one transfer (offsets + merge) for every layer of a model, in ns per\n"
		   "block-layer, for random and contiguous block ids, against a qsort-based peer.\n"
		   "  --models FILE      models.csv (default %s/models.csv)\n"
		   "  --blocks N         blocks in the transfer (default 4096)\n"
		   "  --block-tokens N   tokens per block (default 16)\n"
		   "  --pool N           local num_blocks (default 4*blocks)\n"
		   "  --remote-pool N    peer num_blocks (default pool + 1024: different on each side)\n"
		   "  --min-ms MS        minimum measuring time per way (default 200)\n",
		perf_data_dir());
}

static int parse_u64(const char *name, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end || end == v || x < lo || x > hi) {
		fprintf(stderr, "kvxfer-perf plan: %s '%s' must be an integer in %llu..%llu\n", name, v,
			(unsigned long long)lo, (unsigned long long)hi);
		return -EINVAL;
	}
	*out = x;
	return 0;
}

int kvx_perf_plan_main(int argc, char **argv)
{
	struct plan_cfg c = {.models = perf_data_path("models.csv"), .blocks = 4096, .block_tokens = 16,
			     .min_ns = 200000000ull, .seed = 0x9e3779b97f4a7c15ull};
	uint64_t v, pool = 0, rpool = 0;
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'},  {"models", required_argument, 0, 'M'},
		{"blocks", required_argument, 0, 'b'}, {"block-tokens", required_argument, 0, 't'},
		{"pool", required_argument, 0, 'p'},   {"remote-pool", required_argument, 0, 'r'},
		{"min-ms", required_argument, 0, 'i'}, {"seed", required_argument, 0, 's'},
		{"json", required_argument, 0, 'j'},   {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	optind = 1;
	int o;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 'm': c.model = optarg; break;
		case 'M': c.models = optarg; break;
		case 'j': c.json = optarg; break;
		case 'b':
			if (parse_u64("--blocks", optarg, 1, 1u << 20, &v))
				return 2;
			c.blocks = (uint32_t)v;
			break;
		case 't':
			if (parse_u64("--block-tokens", optarg, 1, 4096, &v))
				return 2;
			c.block_tokens = (uint32_t)v;
			break;
		case 'p':
			if (parse_u64("--pool", optarg, 1, 1u << 24, &pool))
				return 2;
			break;
		case 'r':
			if (parse_u64("--remote-pool", optarg, 1, 1u << 24, &rpool))
				return 2;
			break;
		case 'i':
			if (parse_u64("--min-ms", optarg, 1, 600000, &v))
				return 2;
			c.min_ns = v * 1000000ull;
			break;
		case 's':
			if (parse_u64("--seed", optarg, 1, UINT64_MAX, &c.seed))
				return 2;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!c.model) {
		fprintf(stderr, "kvxfer-perf plan: --model is required\n");
		usage(stderr);
		return 2;
	}
	c.pool_blocks = pool ? pool : 4ull * c.blocks;
	c.remote_pool_blocks = rpool ? rpool : c.pool_blocks + 1024;
	if (c.pool_blocks < c.blocks || c.remote_pool_blocks < c.blocks) {
		fprintf(stderr, "kvxfer-perf plan: --pool and --remote-pool must be >= --blocks (%u)\n", c.blocks);
		return 2;
	}
	struct perf_model m;
	char err[512];
	int rc = perf_model_find(c.models, c.model, &m, err, sizeof(err));
	if (rc) {
		/* A model or table that cannot be used is a usage error, as in `trace`. */
		fprintf(stderr, "kvxfer-perf plan: %s\n", err);
		return 2;
	}
	struct plan_result res[2];
	for (int i = 0; i < 2; i++) {
		rc = run_pattern(&c, &m, i == 1, &res[i]);
		if (rc) {
			fprintf(stderr, "kvxfer-perf plan: %s\n", kvx_strerror(rc));
			return 1;
		}
	}
	printf("# kvxfer-perf plan: model %s (%s), %u layers, %u blocks of %u tokens, local num_blocks %llu, "
	       "peer num_blocks %llu, best of >= %llu ms per way\n",
	       m.name, m.mla ? "MLA 3-D" : "split K/V 5-D", m.num_layers, c.blocks, c.block_tokens,
	       (unsigned long long)c.pool_blocks, (unsigned long long)c.remote_pool_blocks,
	       (unsigned long long)(c.min_ns / 1000000));
	printf("%-11s %9s %9s %14s %14s %14s %11s\n", "pattern", "entries", "ranges", "kvx ns/blk-ly",
	       "cached ns/b-l", "qsort ns/b-l", "qsort/kvx");
	for (int i = 0; i < 2; i++)
		printf("%-11s %9zu %9zu %14.2f %14.3f %14.2f %11.2f\n", res[i].pattern, res[i].entries, res[i].merged,
		       res[i].ns_kvx, res[i].ns_cached, res[i].ns_peer, res[i].ns_peer / res[i].ns_kvx);
	if (c.json) {
		FILE *f = perf_out_open(c.json);
		if (!f) {
			fprintf(stderr, "kvxfer-perf plan: cannot write %s: %s\n", c.json, strerror(errno));
			return 1;
		}
		fprintf(f, "{\"command\":\"plan\",\"model\":\"%s\",\"layout\":\"%s\",\"layers\":%u,\"blocks\":%u,"
			   "\"block_tokens\":%u,\"local_num_blocks\":%llu,\"remote_num_blocks\":%llu,\"results\":[",
			m.name, m.mla ? "mla" : "split", m.num_layers, c.blocks, c.block_tokens,
			(unsigned long long)c.pool_blocks, (unsigned long long)c.remote_pool_blocks);
		for (int i = 0; i < 2; i++)
			fprintf(f, "%s{\"pattern\":\"%s\",\"entries\":%zu,\"ranges\":%zu,\"kvx_ns_per_block_layer\":%.4f,"
				   "\"cached_ns_per_block_layer\":%.4f,\"qsort_ns_per_block_layer\":%.4f,"
				   "\"ratio_qsort_over_kvx\":%.4f}",
				i ? "," : "", res[i].pattern, res[i].entries, res[i].merged, res[i].ns_kvx, res[i].ns_cached,
				res[i].ns_peer, res[i].ns_peer / res[i].ns_kvx);
		fprintf(f, "]}\n");
		if (perf_out_close(f)) {
			fprintf(stderr, "kvxfer-perf plan: write %s failed\n", c.json);
			return 1;
		}
	}
	return 0;
}
