/* SPDX-License-Identifier: Apache-2.0 */
/* The --peer cma loop (bench/trace_cma.c) between this process and a forked child holding the
 * target pool: which bytes land where, how ranges merge, and how bad input is refused; and the
 * --peer tcp loop (bench/trace_tcp_peer.c) over a real loopback connection. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "trace_cma.h"
#include "trace_tcp_peer.h"

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

/* ---- --peer tcp (bench/trace_tcp_peer.c): the socket loop walks the same ranges ---- */

struct rx_arg {
	int lfd;
	const struct trace_cma_log *log;
	const struct trace_cma_pool *pool;
	bool initiator;
	const void *info;
	size_t len;
	struct trace_cma_result r;
};

static void *rx_main(void *arg)
{
	struct rx_arg *a = arg;
	trace_tcp_peer_recv(a->lfd, a->log, a->pool, a->initiator, a->info, a->len, &a->r);
	return NULL;
}

/* Producer pool side 1, consumer pool side 2, over a real loopback connection: the consumer
 * receives on a thread of this process while this thread sends. Producer log: transfers 7
 * {0,1,2,3}, 8 {5} (the consumer never logged it), 3 {6,7}; consumer log, in another order:
 * 3 {1}, 7 {4,5,6}, 9 {2}. @p write: the producer initiated (its order rules the stream), else
 * the consumer did. Either way producer blocks 1,2,3 land on 4,5,6 and 7 on 1. */
static void tcp_loop(bool write)
{
	struct side prod, cons;
	side_init(&prod, 1);
	side_init(&cons, 2);
	struct trace_cma_log pl = {0}, cl = {0};
	uint32_t p7[] = {0, 1, 2, 3}, p8[] = {5}, p3[] = {6, 7}, c3[] = {1}, c7[] = {4, 5, 6}, c9[] = {2};
	cr_assert_eq(trace_cma_log_add(&pl, 7, p7, 4) | trace_cma_log_add(&pl, 8, p8, 1) |
		     trace_cma_log_add(&pl, 3, p3, 2), 0);
	cr_assert_eq(trace_cma_log_add(&cl, 3, c3, 1) | trace_cma_log_add(&cl, 7, c7, 3) |
		     trace_cma_log_add(&cl, 9, c9, 1), 0);
	void *pinfo, *cinfo;
	size_t plen, clen;
	cr_assert_eq(trace_cma_info_pack(&pl, &prod.pool, getpid(), &pinfo, &plen), 0);
	cr_assert_eq(trace_cma_info_pack(&cl, &cons.pool, getpid(), &cinfo, &clen), 0);
	uint32_t port = 0;
	struct rx_arg a = {.lfd = trace_tcp_peer_listen(&port), .log = &cl, .pool = &cons.pool,
			   .initiator = !write, .info = pinfo, .len = plen};
	cr_assert_geq(a.lfd, 0, "%s", strerror(-a.lfd));
	cr_assert_gt(port, 0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, rx_main, &a), 0);
	struct trace_cma_result s;
	trace_tcp_peer_send(port, &pl, &prod.pool, write, cinfo, clen, &s);
	cr_assert_eq(pthread_join(t, NULL), 0);
	close(a.lfd);
	cr_assert_eq(s.status, 0, "%d", s.status);
	cr_assert_eq(a.r.status, 0, "%d", a.r.status);
	cr_assert_eq(s.bytes, 4u * BL * PLANES * LAYERS);
	cr_assert_eq(a.r.bytes, s.bytes);
	cr_assert_eq(s.transfers, 2);
	cr_assert_eq(a.r.transfers, 2);
	/* Transfer 8 (producer only) in WRITE, 9 (consumer only) in READ: the initiator's. */
	cr_assert_eq(s.missing, 1);
	cr_assert_eq(a.r.missing, 1);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t p = 0; p < PLANES; p++)
			for (uint32_t b = 0; b < NB; b++) {
				unsigned char want = b >= 4 && b <= 6 ? val(1, l, p, b - 3)
						     : b == 1	     ? val(1, l, p, 7)
									     : val(2, l, p, b);
				cr_assert_eq(bad_block(&cons, l, p, b, want), 0, "layer %u plane %u block %u", l, p, b);
				cr_assert_eq(bad_block(&prod, l, p, b, val(1, l, p, b)), 0, "the sender's pool changed");
			}
	free(pinfo);
	free(cinfo);
	trace_cma_log_free(&pl);
	trace_cma_log_free(&cl);
	side_free(&prod);
	side_free(&cons);
}

Test(bench_trace_cma, tcp_write_order_lands_the_producer_blocks_on_the_paired_consumer_ids)
{
	tcp_loop(true);
}

Test(bench_trace_cma, tcp_read_order_lands_the_producer_blocks_on_the_paired_consumer_ids)
{
	tcp_loop(false);
}

Test(bench_trace_cma, tcp_receiver_without_a_sender_times_out_and_a_short_stream_is_reset)
{
	struct side cons;
	side_init(&cons, 2);
	struct trace_cma_log cl = {0}, pl = {0};
	uint32_t c7[] = {4, 5, 6}, p7[] = {1, 2, 3};
	cr_assert_eq(trace_cma_log_add(&cl, 7, c7, 3) | trace_cma_log_add(&pl, 7, p7, 3), 0);
	void *pinfo;
	size_t plen;
	cr_assert_eq(trace_cma_info_pack(&pl, &cons.pool, getpid(), &pinfo, &plen), 0);
	/* A sender that connects, sends one block's worth and closes: the receiver reports the
	 * stream ended early instead of waiting for ever. */
	uint32_t port = 0;
	struct rx_arg a = {.lfd = trace_tcp_peer_listen(&port), .log = &cl, .pool = &cons.pool,
			   .initiator = false, .info = pinfo, .len = plen};
	cr_assert_geq(a.lfd, 0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, rx_main, &a), 0);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)port)};
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	unsigned char one[BL];
	memset(one, 0xEE, sizeof(one));
	cr_assert_eq(write(fd, one, sizeof(one)), (ssize_t)sizeof(one));
	close(fd);
	cr_assert_eq(pthread_join(t, NULL), 0);
	close(a.lfd);
	cr_assert_eq(a.r.status, -ECONNRESET, "%d", a.r.status);
	cr_assert_eq(a.r.bytes, BL);
	/* A port nobody listens on: the sender fails at once, moving nothing. */
	struct trace_cma_result s;
	int lfd = trace_tcp_peer_listen(&port);
	cr_assert_geq(lfd, 0);
	close(lfd);
	trace_tcp_peer_send(port, &pl, &cons.pool, true, pinfo, plen, &s);
	cr_assert_eq(s.status, -ECONNREFUSED, "%d", s.status);
	cr_assert_eq(s.bytes, 0);
	trace_tcp_peer_send(0, &pl, &cons.pool, true, pinfo, plen, &s);
	cr_assert_eq(s.status, -EINVAL);
	free(pinfo);
	trace_cma_log_free(&cl);
	trace_cma_log_free(&pl);
	side_free(&cons);
}
