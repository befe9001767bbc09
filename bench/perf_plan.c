/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer-perf plan: time to plan a transfer (offsets per docs/protocol.md §4.3 + merge per §4.4) for
 * a real model's KV layout, in ns per block-layer, for random and contiguous block ids.
 * Measured in the same run on the same geometry and block ids, in alternating rounds:
 *   - kvx:      kvx_plan_build for every layer (no cache), the fastest single call;
 *   - cached:   kvx_plan_cache_get per layer (planned once per geometry, T15), informative;
 *   - peer:     the seed's algorithm (MoRIIO's per-pair offsets loop + numpy merge), run by
 *               bench/plan_numpy_ref.py under /usr/bin/python3; its fully vectorised numpy
 *               variant is reported too, also as the fastest single call (a layer's plan).
 *               The peer's merged plan must equal kvx's, entry for
 *               entry, or the command fails.
 * The ratio peer/kvx (median of the per-round ratios) is the figure to compare across machines. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvxfer/layout.h"
#include "models.h"
#include "perf.h"
#include "perf_util.h"

#define PLAN_ROUNDS 3
#define PLAN_XSTR(x) #x
#define PLAN_STR(x) PLAN_XSTR(x)
#define PLAN_PEER_PY "/usr/bin/python3"

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
	double ns_kvx, ns_cached, ns_seed, ns_vec; /* ns per block-layer, medians over the rounds */
	double ratio_seed, ratio_vec;              /* medians of the per-round peer/kvx ratios */
	bool peer_ok;                              /* the peer ran and its plan equals kvx's */
	char peer_note[160];                       /* why there is no peer figure */
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

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct peer_io {
	char dir[64], ids[96], out[96];
};

/* The numpy peer script: installed next to the data (<prefix>/share/kvxfer, or
 * KVX_PERF_DATA_DIR), else the source tree's bench/ (a kvxfer-perf run from its build tree). */
static const char *peer_script(void)
{
	static char path[PATH_MAX];
	if (!path[0]) {
		snprintf(path, sizeof(path), "%s/plan_numpy_ref.py", perf_data_dir());
		if (access(path, R_OK))
			snprintf(path, sizeof(path), "%s", KVX_BENCH_SRC_DIR "/plan_numpy_ref.py");
	}
	return path;
}

/* Run the numpy peer once; on success fill seed/vec ns and compare its plan with kvx's. */
static int run_peer(const struct plan_cfg *c, const struct kvx_layout_geom *g, uint32_t layers, uint32_t n,
		    const struct peer_io *io, const uint64_t *l, const uint64_t *r, const uint64_t *s, size_t merged,
		    double *seed_ns, double *vec_ns, char *note, size_t notelen)
{
	char cmd[PATH_MAX + 768];
	snprintf(cmd, sizeof(cmd),
		 PLAN_PEER_PY " '%s' '%s' '%s' %u %llu %llu %u %llu %llu %u %llu", peer_script(),
		 io->ids, io->out, g->elem_size, (unsigned long long)g->block_stride, (unsigned long long)g->block_len,
		 g->transfers_per_block == 2 ? 2u : 1u, (unsigned long long)g->local_kv_stride,
		 (unsigned long long)g->remote_kv_stride, layers, (unsigned long long)(c->min_ns / 1000000));
	(void)n;
	FILE *p = popen(cmd, "r");
	if (!p) {
		snprintf(note, notelen, "cannot start %s: %s", PLAN_PEER_PY, strerror(errno));
		return -ENOENT;
	}
	char line[256] = "";
	size_t ranges = 0;
	bool got = fgets(line, sizeof(line), p) &&
		   sscanf(line, "seed_ns_per_block_layer=%lf vec_ns_per_block_layer=%lf ranges=%zu", seed_ns, vec_ns,
			  &ranges) == 3;
	int st = pclose(p);
	if (!got || st != 0) {
		snprintf(note, notelen, "numpy peer failed (exit status %d; needs %s with python3-numpy)", st,
			 PLAN_PEER_PY);
		return -ENOENT;
	}
	if (ranges != merged) {
		snprintf(note, notelen, "peer merged %zu ranges, kvx %zu: plans differ", ranges, merged);
		return -EPROTO;
	}
	FILE *f = fopen(io->out, "rb");
	uint64_t t[3];
	size_t i = 0;
	for (; f && i < merged && fread(t, sizeof(t), 1, f) == 1; i++) {
		if (t[0] != l[i] || t[1] != r[i] || t[2] != s[i])
			break;
	}
	if (f)
		fclose(f);
	if (i != merged) {
		snprintf(note, notelen, "peer and kvx plans differ at range %zu of %zu", i, merged);
		return -EPROTO;
	}
	return 0;
}

static int run_pattern(const struct plan_cfg *c, const struct perf_model *m, bool contiguous,
		       struct plan_result *res)
{
	int rc = -ENOMEM;
	uint32_t n = c->blocks;
	uint32_t *lid = malloc(n * sizeof(*lid)), *rid = malloc(n * sizeof(*rid));
	uint64_t *l = malloc(2 * n * sizeof(*l)), *r = malloc(2 * n * sizeof(*r)), *s = malloc(2 * n * sizeof(*s));
	uint64_t *l2 = malloc(2 * n * sizeof(*l)), *r2 = malloc(2 * n * sizeof(*r)), *s2 = malloc(2 * n * sizeof(*s));
	uint64_t *scratch = malloc(2 * n * sizeof(*scratch));
	struct kvx_plan_cache *cache = NULL;
	struct peer_io io = {.dir = "/tmp/kvxfer-perf-plan.XXXXXX"};
	bool have_dir = false;
	*res = (struct plan_result){.pattern = contiguous ? "contiguous" : "random"};
	if (!lid || !rid || !l || !r || !s || !l2 || !r2 || !s2 || !scratch || kvx_plan_cache_create(n, &cache))
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
	size_t entries = (size_t)n * g.transfers_per_block;

	/* Cross-check inside kvx: the one-pass planner equals offsets + merge. */
	int km = kvx_plan_build(&g, lid, rid, n, l, r, s, 2 * (size_t)n, scratch);
	int k2 = kvx_plan_offsets(&g, lid, n, rid, n, l2, r2, s2, 2 * (size_t)n);
	k2 = k2 < 0 ? k2 : kvx_plan_merge(l2, r2, s2, (size_t)k2, (uint32_t *)scratch);
	if (km < 0 || km != k2 || memcmp(l, l2, (size_t)km * 8) || memcmp(r, r2, (size_t)km * 8) ||
	    memcmp(s, s2, (size_t)km * 8)) {
		fprintf(stderr, "kvxfer-perf plan: kvx_plan_build and offsets+merge disagree (%d vs %d ranges)\n", km, k2);
		rc = -EPROTO;
		goto out;
	}
	res->merged = (size_t)km;

	/* The peer reads the same ids from a file. */
	have_dir = mkdtemp(io.dir) != NULL;
	snprintf(io.ids, sizeof(io.ids), "%s/ids", io.dir);
	snprintf(io.out, sizeof(io.out), "%s/plan", io.dir);
	FILE *f = have_dir ? fopen(io.ids, "wb") : NULL;
	bool ids_ok = f && fwrite(lid, sizeof(*lid), n, f) == n && fwrite(rid, sizeof(*rid), n, f) == n;
	if (f && fclose(f))
		ids_ok = false;
	if (!ids_ok)
		snprintf(res->peer_note, sizeof(res->peer_note), "cannot write the peer's ids under /tmp");

	double kvx[PLAN_ROUNDS], cached[PLAN_ROUNDS], pseed[PLAN_ROUNDS], pvec[PLAN_ROUNDS];
	double rseed[PLAN_ROUNDS], rvec[PLAN_ROUNDS];
	bool peer = ids_ok;
	for (int round = 0; round < PLAN_ROUNDS; round++) {
		double best[2] = {1e300, 1e300};
		for (int way = 0; way < 2; way++) {
			uint64_t start = kvx_now_ns(), iters = 0, now;
			do {
				uint64_t t0 = kvx_now_ns();
				for (uint32_t li = 0; li < layers; li++) {
					if (way == 0) {
						/* Each layer's plan timed alone, as the peer times its calls. */
						uint64_t c0 = kvx_now_ns();
						sink += (size_t)kvx_plan_build(&g, lid, rid, n, l2, r2, s2, 2 * (size_t)n,
									       scratch);
						double one = (double)(kvx_now_ns() - c0) / n;
						if (one < best[0])
							best[0] = one;
					} else {
						struct kvx_plan p;
						if (li == 0)
							kvx_plan_cache_reset(cache);
						if (kvx_plan_cache_get(cache, &g, lid, rid, n, &p) < 0) {
							rc = -EIO;
							goto out;
						}
						sink += p.n;
					}
				}
				now = kvx_now_ns();
				double per = (double)(now - t0) / ((double)layers * n);
				if (way == 1 && per < best[way]) /* cached: per pass (one miss, then hits) */
					best[way] = per;
				iters++;
			} while (now - start < c->min_ns || iters < 3);
		}
		kvx[round] = best[0];
		cached[round] = best[1];
		if (peer) {
			rc = run_peer(c, &g, layers, n, &io, l, r, s, res->merged, &pseed[round], &pvec[round],
				      res->peer_note, sizeof(res->peer_note));
			if (rc == -EPROTO) {
				fprintf(stderr, "kvxfer-perf plan: %s\n", res->peer_note);
				goto out;
			}
			peer = rc == 0;
			rseed[round] = pseed[round] / kvx[round];
			rvec[round] = pvec[round] / kvx[round];
		}
	}
	(void)sink;
	res->layers = layers;
	res->blocks = n;
	res->entries = entries;
	res->ns_kvx = median(kvx, PLAN_ROUNDS);
	res->ns_cached = median(cached, PLAN_ROUNDS);
	res->peer_ok = peer;
	if (peer) {
		res->ns_seed = median(pseed, PLAN_ROUNDS);
		res->ns_vec = median(pvec, PLAN_ROUNDS);
		res->ratio_seed = median(rseed, PLAN_ROUNDS);
		res->ratio_vec = median(rvec, PLAN_ROUNDS);
	} else {
		res->ns_seed = res->ns_vec = res->ratio_seed = res->ratio_vec = NAN;
	}
	rc = 0;
out:
	if (have_dir) {
		unlink(io.ids);
		unlink(io.out);
		rmdir(io.dir);
	}
	kvx_plan_cache_destroy(cache);
	free(lid);
	free(rid);
	free(l);
	free(r);
	free(s);
	free(l2);
	free(r2);
	free(s2);
	free(scratch);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvxfer-perf plan --model NAME [--models FILE] [--blocks N] [--block-tokens N]\n"
		   "                        [--pool N] [--remote-pool N] [--min-ms MS] [--seed S] [--json FILE]\n"
		   "Time to plan one transfer (offsets + merge) for every layer of a model, in ns per\n"
		   "block-layer, for random and contiguous block ids, against the seed's numpy algorithm\n"
		   "(%s under " PLAN_PEER_PY "), in " PLAN_STR(PLAN_ROUNDS) " alternating rounds.\n"
		   "  --models FILE      models.csv (default %s/models.csv)\n"
		   "  --blocks N         blocks in the transfer (default 4096)\n"
		   "  --block-tokens N   tokens per block (default 16)\n"
		   "  --pool N           local num_blocks (default 4*blocks)\n"
		   "  --remote-pool N    peer num_blocks (default pool + 1024: different on each side)\n"
		   "  --min-ms MS        minimum measuring time per way (default 200)\n",
		peer_script(), perf_data_dir());
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
	       "peer num_blocks %llu, fastest single-layer plan over >= %llu ms per way (cached: per pass), median of %d alternating rounds\n",
	       m.name, m.mla ? "MLA 3-D" : "split K/V 5-D", m.num_layers, c.blocks, c.block_tokens,
	       (unsigned long long)c.pool_blocks, (unsigned long long)c.remote_pool_blocks,
	       (unsigned long long)(c.min_ns / 1000000), PLAN_ROUNDS);
	printf("# peer: the seed's algorithm (per-pair offsets loop + numpy merge) in " PLAN_PEER_PY " %s"
	       "; numpy-vec: the same with vectorised offsets; plans checked identical\n", peer_script());
	printf("%-11s %8s %8s %12s %13s %12s %12s %9s %10s\n", "pattern", "entries", "ranges", "kvx ns/b-l",
	       "cached ns/b-l", "seed ns/b-l", "vec ns/b-l", "seed/kvx", "vec/kvx");
	for (int i = 0; i < 2; i++) {
		printf("%-11s %8zu %8zu %12.2f %13.3f %12.1f %12.1f %9.1f %10.1f\n", res[i].pattern, res[i].entries,
		       res[i].merged, res[i].ns_kvx, res[i].ns_cached, res[i].ns_seed, res[i].ns_vec, res[i].ratio_seed,
		       res[i].ratio_vec);
		if (!res[i].peer_ok)
			printf("# %s: no peer figure: %s\n", res[i].pattern, res[i].peer_note);
	}
	if (c.json) {
		FILE *f = perf_out_open(c.json);
		if (!f) {
			fprintf(stderr, "kvxfer-perf plan: cannot write %s: %s\n", c.json, strerror(errno));
			return 1;
		}
		fprintf(f, "{\"command\":\"plan\",\"model\":\"%s\",\"layout\":\"%s\",\"layers\":%u,\"blocks\":%u,"
			   "\"block_tokens\":%u,\"local_num_blocks\":%llu,\"remote_num_blocks\":%llu,\"rounds\":%d,"
			   "\"peer\":\"seed numpy (bench/plan_numpy_ref.py)\",\"results\":[",
			m.name, m.mla ? "mla" : "split", m.num_layers, c.blocks, c.block_tokens,
			(unsigned long long)c.pool_blocks, (unsigned long long)c.remote_pool_blocks, PLAN_ROUNDS);
		for (int i = 0; i < 2; i++) {
			const struct plan_result *x = &res[i];
			fprintf(f, "%s{\"pattern\":\"%s\",\"entries\":%zu,\"ranges\":%zu,\"kvx_ns_per_block_layer\":%.4f,"
				   "\"cached_ns_per_block_layer\":%.4f,\"plans_identical\":%s",
				i ? "," : "", x->pattern, x->entries, x->merged, x->ns_kvx, x->ns_cached,
				x->peer_ok ? "true" : "null");
			if (x->peer_ok)
				fprintf(f, ",\"seed_ns_per_block_layer\":%.4f,\"numpy_vec_ns_per_block_layer\":%.4f,"
					   "\"ratio_seed_over_kvx\":%.4f,\"ratio_numpy_vec_over_kvx\":%.4f}",
					x->ns_seed, x->ns_vec, x->ratio_seed, x->ratio_vec);
			else
				fprintf(f, ",\"seed_ns_per_block_layer\":null,\"ratio_seed_over_kvx\":null,"
					   "\"peer_note\":\"%s\"}", x->peer_note);
		}
		fprintf(f, "]}\n");
		if (perf_out_close(f)) {
			fprintf(stderr, "kvxfer-perf plan: write %s failed\n", c.json);
			return 1;
		}
	}
	return 0;
}
