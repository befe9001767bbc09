/* SPDX-License-Identifier: Apache-2.0 */
/* The --peer cma loop (bench/trace_cma.c) between this process and a forked child holding the
 * target pool: which bytes land where, how ranges merge, and how bad input is refused. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "trace_cma.h"

TestSuite(bench_trace_cma, .timeout = 60.0);

#define LAYERS 2
#define PLANES 2
#define NB 8
#define BL 64

struct side {
	unsigned char *layer[LAYERS];
	struct trace_cma_pool pool;
};

/* Every byte of block (l, p, b) of a side's pool: who (1 initiator, 2 target) and where. */
static unsigned char val(int who, uint32_t l, uint32_t p, uint32_t b)
{
	return (unsigned char)(who * 100 + l * 20 + p * 10 + b);
}

static void side_init(struct side *s, int who)
{
	for (uint32_t l = 0; l < LAYERS; l++) {
		/* A guard page's worth apart, so two layers never look contiguous. */
		s->layer[l] = malloc(PLANES * NB * BL + 4096);
		cr_assert_not_null(s->layer[l]);
		for (uint32_t p = 0; p < PLANES; p++)
			for (uint32_t b = 0; b < NB; b++)
				memset(s->layer[l] + (p * NB + b) * BL, val(who, l, p, b), BL);
	}
	s->pool = (struct trace_cma_pool){.layers = LAYERS, .planes = PLANES, .nb = NB, .block_len = BL,
					  .layer = s->layer};
}

static void side_free(struct side *s)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		free(s->layer[l]);
}

static unsigned char *blk(struct side *s, uint32_t l, uint32_t p, uint32_t b)
{
	return s->layer[l] + (p * NB + b) * BL;
}

/* Count blocks of @p s whose bytes are not all @p v. */
static int bad_block(struct side *s, uint32_t l, uint32_t p, uint32_t b, unsigned char v)
{
	const unsigned char *x = blk(s, l, p, b);
	for (int i = 0; i < BL; i++)
		if (x[i] != v)
			return 1;
	return 0;
}

struct child {
	pid_t pid;
	int to, from; /* pipes: to the child, from the child */
};

/* The target: a forked child that rewrites its copy of the pool as side 2, logs transfer 7 with
 * ids {4, 5, 6} (and transfer 9 with {2}), sends its CMA_INFO, then on a byte from the parent
 * counts the blocks a WRITE should have changed that hold something else, and exits with it. */
static void child_start(struct child *c, struct side *t, void **info, size_t *len)
{
	int a[2], b[2];
	cr_assert_eq(pipe(a), 0);
	cr_assert_eq(pipe(b), 0);
	c->pid = fork();
	cr_assert_geq(c->pid, 0);
	if (c->pid == 0) {
		close(a[1]);
		close(b[0]);
		side_init(t, 2);
		struct trace_cma_log log = {0};
		uint32_t ids[] = {4, 5, 6}, ids9[] = {2};
		if (trace_cma_log_add(&log, 7, ids, 3) || trace_cma_log_add(&log, 9, ids9, 1))
			_exit(90);
		void *p;
		size_t n;
		if (trace_cma_info_pack(&log, &t->pool, getpid(), &p, &n))
			_exit(91);
		if (write(b[1], &n, sizeof(n)) != sizeof(n) || write(b[1], p, n) != (ssize_t)n)
			_exit(92);
		char go;
		if (read(a[0], &go, 1) != 1)
			_exit(93);
		/* WRITE: initiator blocks {1, 2, 3} of the suffix pairing landed on {4, 5, 6}. */
		int bad = 0;
		for (uint32_t l = 0; l < LAYERS; l++)
			for (uint32_t p2 = 0; p2 < PLANES; p2++)
				for (uint32_t k = 0; k < NB; k++) {
					unsigned char want = k >= 4 && k <= 6 ? val(1, l, p2, k - 3) : val(2, l, p2, k);
					bad += bad_block(t, l, p2, k, want);
				}
		_exit(bad);
	}
	close(a[0]);
	close(b[1]);
	c->to = a[1];
	c->from = b[0];
	cr_assert_eq(read(c->from, len, sizeof(*len)), (ssize_t)sizeof(*len));
	*info = malloc(*len);
	cr_assert_not_null(*info);
	size_t got = 0;
	while (got < *len) {
		ssize_t r = read(c->from, (char *)*info + got, *len - got);
		cr_assert_gt(r, 0);
		got += (size_t)r;
	}
}

static int child_finish(struct child *c)
{
	cr_assert_eq(write(c->to, "g", 1), 1);
	int st;
	cr_assert_eq(waitpid(c->pid, &st, 0), c->pid);
	close(c->to);
	close(c->from);
	cr_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* Initiator log: transfer 7 with ids {0, 1, 2, 3} (a prefix hit of 1: the last 3 pair with the
 * target's 3), and transfer 8, which the target never logged. */
static void initiator_log(struct trace_cma_log *log)
{
	uint32_t ids[] = {0, 1, 2, 3}, ids8[] = {5};
	cr_assert_eq(trace_cma_log_add(log, 7, ids, 4), 0);
	cr_assert_eq(trace_cma_log_add(log, 8, ids8, 1), 0);
}

/* The rig of every test: this process's pool (side 1), the target child (child_start()) with
 * its CMA_INFO, and an empty initiator log. */
struct rig {
	struct side me, t;
	struct child c;
	void *info;
	size_t len;
	struct trace_cma_log log;
};

static void rig_up(struct rig *g)
{
	side_init(&g->me, 1);
	child_start(&g->c, &g->t, &g->info, &g->len);
	g->log = (struct trace_cma_log){0};
}

/* Let the child check its pool and exit; free the log, the info and this side's pool. Returns
 * the child's exit status (child_finish()). */
static int rig_down(struct rig *g)
{
	int bad = child_finish(&g->c);
	trace_cma_log_free(&g->log);
	free(g->info);
	side_free(&g->me);
	return bad;
}

Test(bench_trace_cma, read_lands_the_target_blocks_paired_from_the_end_in_merged_ranges)
{
	struct rig g;
	rig_up(&g);
	initiator_log(&g.log);
	struct trace_cma_result r;
	trace_cma_run(&g.log, &g.me.pool, 0, g.info, g.len, &r);
	cr_assert_eq(r.status, 0, "%d", r.status);
	cr_assert_eq(r.bytes, 3u * BL * PLANES * LAYERS);
	cr_assert_eq(r.iovs, PLANES * LAYERS, "ids 1-3 and 4-6 are runs: one range per layer-plane");
	cr_assert_eq(r.calls, 1);
	cr_assert_eq(r.transfers, 1);
	cr_assert_eq(r.missing, 1);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t p = 0; p < PLANES; p++)
			for (uint32_t b = 0; b < NB; b++) {
				unsigned char want = b >= 1 && b <= 3 ? val(2, l, p, b + 3) : val(1, l, p, b);
				cr_assert_eq(bad_block(&g.me, l, p, b, want), 0, "layer %u plane %u block %u", l, p, b);
			}
	cr_assert_eq(rig_down(&g) != 0, 1, "a READ leaves the target's pool as it was");
	cr_assert_null(g.log.e);
}

Test(bench_trace_cma, write_lands_the_initiator_blocks_on_the_target_ids)
{
	struct rig g;
	rig_up(&g);
	initiator_log(&g.log);
	struct trace_cma_result r;
	trace_cma_run(&g.log, &g.me.pool, 1, g.info, g.len, &r);
	cr_assert_eq(r.status, 0, "%d", r.status);
	cr_assert_eq(r.bytes, 3u * BL * PLANES * LAYERS);
	cr_assert_eq(rig_down(&g), 0, "target blocks that differ from the expected WRITE");
}

Test(bench_trace_cma, split_runs_make_one_range_each)
{
	struct rig g;
	rig_up(&g);
	uint32_t ids[] = {0, 1, 7}; /* pairs (0,4) (1,5) run on, (7,6) does not */
	cr_assert_eq(trace_cma_log_add(&g.log, 7, ids, 3), 0);
	struct trace_cma_result r;
	trace_cma_run(&g.log, &g.me.pool, 0, g.info, g.len, &r);
	cr_assert_eq(r.status, 0);
	cr_assert_eq(r.iovs, 2 * PLANES * LAYERS);
	cr_assert_eq(bad_block(&g.me, 1, 1, 7, val(2, 1, 1, 6)), 0);
	cr_assert_eq(bad_block(&g.me, 0, 0, 1, val(2, 0, 0, 5)), 0);
	cr_assert_eq(bad_block(&g.me, 0, 0, 2, val(1, 0, 0, 2)), 0);
	rig_down(&g);
}

Test(bench_trace_cma, bad_info_and_ids_outside_the_pool_are_refused_before_moving)
{
	struct rig g;
	rig_up(&g);
	initiator_log(&g.log);
	struct trace_cma_result r;
	trace_cma_run(&g.log, &g.me.pool, 0, g.info, g.len - 1, &r);
	cr_assert_eq(r.status, -EPROTO);
	cr_assert_eq(r.bytes, 0);
	trace_cma_run(&g.log, &g.me.pool, 0, g.info, 8, &r);
	cr_assert_eq(r.status, -EPROTO);
	struct trace_cma_log bad = {0};
	uint32_t ids[] = {NB};
	cr_assert_eq(trace_cma_log_add(&bad, 9, ids, 1), 0);
	trace_cma_run(&bad, &g.me.pool, 0, g.info, g.len, &r);
	cr_assert_eq(r.status, -EINVAL);
	cr_assert_eq(r.bytes, 0);
	g.me.pool.planes = 1;
	trace_cma_run(&g.log, &g.me.pool, 0, g.info, g.len, &r);
	cr_assert_eq(r.status, -EINVAL, "geometry differs");
	for (uint32_t b = 0; b < NB; b++)
		cr_assert_eq(bad_block(&g.me, 0, 0, b, val(1, 0, 0, b)), 0);
	rig_down(&g);
	trace_cma_log_free(&bad);
}
