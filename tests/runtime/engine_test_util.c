/* SPDX-License-Identifier: Apache-2.0 */
/* Engine test helpers (see engine_test_util.h). */
#include "engine_test_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

void et_params(struct kvx_engine_params *p, enum kvx_sched_role role, enum kvx_sched_mode mode)
{
	kvx_engine_params_init(p);
	p->role = role;
	p->mode = mode;
	p->transport = "tcp";
	p->handshake_port = 0;
	p->notify_port = 0;
	p->max_transfers = 8;
	p->max_blocks = ET_NB;
}

uint8_t et_pattern(uint32_t layer, uint32_t plane, uint32_t block)
{
	return (uint8_t)(0x20 + 64 * layer + 32 * plane + block);
}

uint8_t *et_block(const struct et_eng *g, uint32_t layer, uint32_t plane, uint32_t block)
{
	return g->mem[layer] + ((size_t)plane * ET_NB + block) * ET_BLOCK;
}

void et_start(struct et_eng *g, const struct kvx_engine_params *p, bool pattern)
{
	et_create(g, p, pattern);
	cr_assert_eq(et_start_layers(g), 0);
}

void et_create(struct et_eng *g, const struct kvx_engine_params *p, bool pattern)
{
	memset(g, 0, sizeof(*g));
	for (uint32_t l = 0; l < ET_NL; l++) {
		g->mem[l] = calloc(2 * ET_NB, ET_BLOCK);
		cr_assert_not_null(g->mem[l]);
	}
	et_create_over(g, p, pattern);
}

void et_create_over(struct et_eng *g, const struct kvx_engine_params *p, bool pattern)
{
	char err[256] = "";
	cr_assert_eq(kvx_engine_create(p, &g->e, err, sizeof(err)), 0, "engine create: %s", err);
	/* [2, NB, BS=4, H=2, HD=8] bf16: K plane, then V plane; one block is 4*2*8*2 = 128 bytes. */
	const struct kvx_layout_tensor t = {.ndim = 5,
					    .shape = {2, ET_NB, 4, 2, 8},
					    .stride = {ET_NB * 64, 64, 16, 8, 1},
					    .elem_size = 2};
	for (uint32_t l = 0; l < ET_NL; l++) {
		memset(g->mem[l], 0, 2 * ET_NB * ET_BLOCK);
		for (uint32_t pl = 0; pattern && pl < 2; pl++)
			for (uint32_t b = 0; b < ET_NB; b++)
				memset(et_block(g, l, pl, b), et_pattern(l, pl, b), ET_BLOCK);
		char name[32];
		snprintf(name, sizeof(name), "model.layers.%u.attn", l);
		struct kvx_engine_layer ly = {.name = name, .base = g->mem[l], .tensor = t,
					      .spec = {.block_size = 4, .num_kv_heads = 2, .head_size = 8}};
		cr_assert_eq(kvx_engine_register_layer(g->e, &ly), (int)l);
	}
}

int et_start_layers(struct et_eng *g)
{
	int rc = kvx_engine_start(g->e);
	return rc ? rc : kvx_engine_ports(g->e, &g->hs, &g->nt);
}

void et_free(struct et_eng *g)
{
	kvx_engine_destroy(g->e);
	for (uint32_t l = 0; l < ET_NL; l++)
		free(g->mem[l]);
	memset(g, 0, sizeof(*g));
}

void et_pair_start(struct et_eng *p, struct et_eng *d, enum kvx_sched_mode mode)
{
	struct kvx_engine_params pp, dp;
	et_params(&pp, KVX_SCHED_PRODUCER, mode);
	et_params(&dp, KVX_SCHED_CONSUMER, mode);
	et_start(p, &pp, true);
	et_start(d, &dp, false);
}

void et_pair_free(struct et_eng *p, struct et_eng *d)
{
	et_free(d);
	et_free(p);
}

void et_expect_blocks(const struct et_eng *d, const uint32_t *dst, const uint32_t *src, size_t n, bool others_zero)
{
	for (uint32_t l = 0; l < ET_NL; l++) {
		for (uint32_t pl = 0; pl < 2; pl++) {
			for (uint32_t b = 0; b < ET_NB; b++) {
				int want = others_zero ? 0 : -1;
				for (size_t i = 0; i < n; i++)
					if (dst[i] == b)
						want = et_pattern(l, pl, src[i]);
				if (want < 0)
					continue;
				const uint8_t *p = et_block(d, l, pl, b);
				for (uint32_t k = 0; k < ET_BLOCK; k++)
					cr_assert_eq(p[k], want, "layer %u %s block %u byte %u: 0x%02x, want 0x%02x", l,
						     pl ? "V" : "K", b, k, p[k], want);
			}
		}
	}
}

size_t et_follow(struct et_track *t, const char *tid)
{
	cr_assert_lt(t->n, ET_TRACK_MAX);
	size_t k = t->n++;
	t->tid[k] = tid;
	t->status[k] = -1;
	t->error[k] = 0;
	t->released[k] = 0;
	t->bytes[k] = 0;
	return k;
}

static size_t find(const struct et_track *t, const char *tid)
{
	for (size_t k = 0; k < t->n; k++)
		if (!strcmp(t->tid[k], tid))
			return k;
	return t->n;
}

void et_pump(struct kvx_engine *e, struct et_track *t)
{
	struct kvx_completion c[8];
	size_t n = kvx_engine_poll_completions(e, c, 8);
	for (size_t i = 0; i < n; i++) {
		size_t k = find(t, c[i].transfer_id);
		cr_assert_lt(k, t->n, "completion for a transfer id the test never submitted: '%s'", c[i].transfer_id);
		if (c[i].kind == KVX_CPL_TRANSFER) {
			cr_assert_eq(t->status[k], -1, "two terminal completions for %s", t->tid[k]);
			t->status[k] = (int)c[i].status;
			t->error[k] = c[i].error;
			t->bytes[k] = c[i].bytes;
		} else {
			cr_assert_eq(c[i].kind, KVX_CPL_BLOCKS_RELEASED);
			t->released[k]++;
		}
	}
}

bool et_wait_until(struct kvx_engine *e, struct et_track *t, bool (*pred)(struct kvx_engine *e, void *arg),
		   void *arg)
{
	uint64_t end = kvx_now_ns() + ET_DEADLINE_NS;
	for (;;) {
		et_pump(e, t);
		if (pred(e, arg))
			return true;
		if (kvx_now_ns() >= end)
			return false;
		usleep(200); /* application polling cadence; the condition is the predicate */
	}
}

struct done_arg {
	struct et_track *t;
	size_t k;
	bool want_release;
};

static bool done_pred(struct kvx_engine *e, void *arg)
{
	(void)e;
	struct done_arg *a = arg;
	return a->t->status[a->k] >= 0 && (!a->want_release || a->t->released[a->k] > 0);
}

bool et_wait(struct kvx_engine *e, struct et_track *t, const char *tid, bool want_release)
{
	struct done_arg a = {.t = t, .k = find(t, tid), .want_release = want_release};
	cr_assert_lt(a.k, t->n, "waiting for %s, which is not followed", tid);
	return et_wait_until(e, t, done_pred, &a);
}

size_t et_expect_done(struct kvx_engine *e, struct et_track *t, const char *tid, bool want_release)
{
	size_t k = find(t, tid);
	cr_assert(et_wait(e, t, tid, want_release), "%s: no terminal completion%s within the deadline", tid,
		  want_release ? " and blocks release" : "");
	cr_assert_eq(t->status[k], KVX_CPL_DONE, "%s: status %d error %d", tid, t->status[k], t->error[k]);
	cr_assert_eq(t->error[k], 0);
	return k;
}

/* Sum over the engine's lcores of their byte counters (ops false) or data-op counters (true). */
static uint64_t lcore_sum(struct kvx_engine *e, bool ops)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	uint64_t n = 0;
	for (uint32_t i = 0; i < st.n_lcores; i++)
		n += ops ? st.lcores[i].ops : st.lcores[i].bytes;
	return n;
}

uint64_t et_bytes_moved(struct kvx_engine *e)
{
	return lcore_sum(e, false);
}

void et_dealer_open(struct et_dealer *d, uint16_t port)
{
	d->ctx = zmq_ctx_new();
	cr_assert_not_null(d->ctx);
	d->sock = zmq_socket(d->ctx, ZMQ_DEALER);
	cr_assert_not_null(d->sock);
	int linger = 5000;
	cr_assert_eq(zmq_setsockopt(d->sock, ZMQ_LINGER, &linger, sizeof(linger)), 0);
	char ep[64];
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);
	cr_assert_eq(zmq_connect(d->sock, ep), 0, "connect %s: %s", ep, zmq_strerror(zmq_errno()));
}

void et_dealer_send(struct et_dealer *d, const struct kvx_msg_notify *m)
{
	uint8_t buf[1024];
	int n = kvx_msg_notify_encode(m, buf, sizeof(buf));
	cr_assert_gt(n, 0, "encode: %d", n);
	cr_assert_eq(zmq_send(d->sock, buf, (size_t)n, 0), n);
}

void et_dealer_close(struct et_dealer *d)
{
	zmq_close(d->sock);
	zmq_ctx_term(d->ctx); /* blocks until queued frames are sent, at most the 5 s linger */
	d->sock = d->ctx = NULL;
}

int et_read_all(int fd, void *b, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)b + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

int et_write_all(int fd, const void *b, size_t n)
{
	return write(fd, b, n) == (ssize_t)n ? 0 : -1;
}

struct kvx_engine_peer et_peer(uint16_t hs, uint16_t nt)
{
	return (struct kvx_engine_peer){.host = "127.0.0.1", .handshake_port = hs, .notify_port = nt};
}

void et_fill(struct et_eng *g, uint8_t v)
{
	for (uint32_t l = 0; l < ET_NL; l++)
		memset(g->mem[l], v, 2 * ET_NB * ET_BLOCK);
}

/* Block b of g, in both planes of every layer, is v (src < 0) or the pattern of block src. */
static bool block_holds(const struct et_eng *g, uint32_t b, int64_t src, uint8_t v)
{
	for (uint32_t l = 0; l < ET_NL; l++)
		for (uint32_t pl = 0; pl < 2; pl++) {
			uint8_t want = src >= 0 ? et_pattern(l, pl, (uint32_t)src) : v;
			const uint8_t *p = et_block(g, l, pl, b);
			for (uint32_t k = 0; k < ET_BLOCK; k++)
				if (p[k] != want)
					return false;
		}
	return true;
}

bool et_block_is(const struct et_eng *g, uint32_t b, uint8_t v)
{
	return block_holds(g, b, -1, v);
}

bool et_block_is_pattern(const struct et_eng *g, uint32_t b, uint32_t src)
{
	return block_holds(g, b, src, 0);
}

uint64_t et_ops_posted(struct kvx_engine *e)
{
	return lcore_sum(e, true);
}

bool et_notes_at_least(struct kvx_engine *e, void *arg)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st.notifications_received >= *(const uint64_t *)arg;
}

int et_write_layers(struct kvx_engine *e, const char *tid)
{
	for (uint32_t l = 0; l < ET_NL; l++) {
		int rc = kvx_xfer_layer_ready(e, tid, l, NULL);
		if (rc)
			return rc;
	}
	return kvx_xfer_seal(e, tid, ET_NL);
}

size_t et_read_done(struct et_eng *p, struct et_track *tp, struct et_eng *d, struct et_track *td, const char *tid,
		    const uint32_t *dst, const uint32_t *src, size_t n, bool others_zero)
{
	struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = src, .n = n};
	cr_assert_eq(kvx_xfer_serve(p->e, &sv), 0, "serve %s", tid);
	et_follow(tp, tid);
	struct kvx_engine_read r = {.transfer_id = tid, .peer = et_peer(p->hs, p->nt), .local_blocks = dst,
				    .remote_blocks = src, .n = n};
	cr_assert_eq(kvx_xfer_read(d->e, &r), 0, "read %s", tid);
	et_follow(td, tid);
	size_t k = et_expect_done(d->e, td, tid, false);
	et_expect_done(p->e, tp, tid, true);
	et_expect_blocks(d, dst, src, n, others_zero);
	return k;
}

struct et_ports et_ports_of(const struct et_eng *g)
{
	return (struct et_ports){.hs = g->hs, .nt = g->nt};
}

void et_child_spawn(struct et_child *c, et_child_fn fn, void *arg)
{
	int down[2], up[2];
	cr_assert_eq(pipe(down), 0);
	cr_assert_eq(pipe(up), 0);
	fflush(NULL); /* nothing buffered is written twice */
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(down[1]);
		close(up[0]);
		_exit(fn(arg, up[1], down[0]));
	}
	close(down[0]);
	close(up[1]);
	*c = (struct et_child){.pid = pid, .to = down[1], .from = up[0]};
}

void et_child_send(const struct et_child *c, const void *b, size_t n)
{
	cr_assert_eq(et_write_all(c->to, b, n), 0, "write to child %d failed", (int)c->pid);
}

void et_child_recv(const struct et_child *c, void *b, size_t n, const char *what)
{
	cr_assert_eq(et_read_all(c->from, b, n), 0, "%s", what);
}

static void child_close(struct et_child *c)
{
	close(c->to);
	close(c->from);
	c->pid = 0;
}

void et_child_kill9(struct et_child *c)
{
	int wst = 0;
	cr_assert_eq(kill(c->pid, SIGKILL), 0);
	cr_assert_eq(waitpid(c->pid, &wst, 0), c->pid);
	cr_assert(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "child %d: status 0x%x", (int)c->pid, wst);
	child_close(c);
}

void et_child_join(struct et_child *c, const char *who)
{
	int wst = 0;
	cr_assert_eq(waitpid(c->pid, &wst, 0), c->pid);
	cr_assert(WIFEXITED(wst), "%s crashed (status 0x%x)", who, wst);
	cr_assert_eq(WEXITSTATUS(wst), 0, "%s exit code %d", who, WEXITSTATUS(wst));
	child_close(c);
}
