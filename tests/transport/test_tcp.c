/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp provider under the real threading contract: one thread runs kvx_xport_progress() on the
 * target context (as a polling lcore would) while the control thread registers and
 * unregisters regions, accepts and destroys endpoints, and an initiator in the same process
 * moves data. Run under TSan in CI (label stress).
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/transport.h"

struct prog {
	struct kvx_xport_ctx *ctx;
	atomic_bool stop;
	atomic_ulong loops;
};

static void *progress_thread(void *arg)
{
	struct prog *p = arg;
	unsigned idle = 0;
	while (!atomic_load_explicit(&p->stop, memory_order_acquire)) {
		int w = kvx_xport_progress(p->ctx);
		idle = w ? 0 : idle + 1;
		if (idle > 256)
			kvx_xport_ctx_wait(p->ctx, 1); /* adaptive idle: 2 cores, several threads */
		atomic_fetch_add_explicit(&p->loops, 1, memory_order_relaxed);
	}
	return NULL;
}

static struct kvx_xport_cpl wait_one(struct kvx_xport_ep *ep)
{
	struct kvx_xport_cpl c;
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0) {
		cr_assert_lt(kvx_now_ns(), deadline, "no completion within 30 s");
		kvx_xport_ep_wait(ep, 1);
	}
	return c;
}

/* Open a target context *tgt and an initiator context *ini of the tcp provider with
 * @p channels data channels each and, if @p chunk is not 0, chunks of @p chunk bytes. */
static void open_pair(struct kvx_xport_ctx **tgt, struct kvx_xport_ctx **ini, uint32_t channels, uint32_t chunk)
{
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.num_channels = channels;
	if (chunk)
		prm.chunk_bytes = chunk;
	*tgt = *ini = NULL;
	cr_assert_eq(kvx_xport_open("tcp", &prm, tgt), 0);
	cr_assert_eq(kvx_xport_open("tcp", &prm, ini), 0);
}

/* Connect a new endpoint of @p ini to @p tgt (the handshake blobs handed over in process) and
 * import the target's region @p tmr into it. Returns the imported region; *iep and *tep are
 * the initiator's and the target's endpoints. Asserts on any failure. */
static struct kvx_xport_rmr *connect_import(struct kvx_xport_ctx *ini, struct kvx_xport_ctx *tgt,
					    struct kvx_xport_mr *tmr, struct kvx_xport_ep **iep,
					    struct kvx_xport_ep **tep)
{
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al, bl;
	*iep = *tep = NULL;
	cr_assert_eq(kvx_xport_ep_create(ini, iep, a, sizeof(a), &al), 0);
	cr_assert_eq(kvx_xport_ep_accept(tgt, a, al, tep, b, sizeof(b), &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(*iep, b, bl), 0);
	cr_assert_eq(kvx_xport_mr_export(tmr, d, sizeof(d), NULL), 0);
	struct kvx_xport_rmr *rr = NULL;
	cr_assert_eq(kvx_xport_rmr_import(*iep, d, sizeof(d), &rr), 0);
	return rr;
}

Test(transport_tcp, progress_thread_with_control_thread_churn, .timeout = 120)
{
	struct kvx_xport_ctx *tgt, *ini;
	open_pair(&tgt, &ini, 2, 16384);
	struct prog p = {.ctx = tgt};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, progress_thread, &p), 0);
	enum { LEN = 65536 };
	uint8_t *src = malloc(LEN), *dst = malloc(LEN);
	struct kvx_xport_mr *lmr = NULL;
	struct kvx_xport_mr_params lp = {.addr = dst, .len_bytes = LEN, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(ini, &lp, &lmr), 0);
	for (int round = 0; round < 12; round++) {
		for (int i = 0; i < LEN; i++)
			src[i] = (uint8_t)(i * 7 + round);
		struct kvx_xport_mr *rmr_t = NULL;
		struct kvx_xport_mr_params rp = {.addr = src, .len_bytes = LEN,
						 .access = KVX_XPORT_ACCESS_REMOTE_READ};
		cr_assert_eq(kvx_xport_mr_register(tgt, &rp, &rmr_t), 0);
		struct kvx_xport_ep *iep, *tep;
		struct kvx_xport_rmr *rr = connect_import(ini, tgt, rmr_t, &iep, &tep);
		struct kvx_xport_op ops[4];
		for (int i = 0; i < 4; i++)
			ops[i] = (struct kvx_xport_op){.lmr = lmr, .rmr = rr, .loff = (uint64_t)i * 16384,
						       .roff = (uint64_t)i * 16384, .len = 16384};
		memset(dst, 0, LEN);
		cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 4, 1), 0);
		struct kvx_xport_cpl c = wait_one(iep);
		cr_assert_eq(c.status, 0);
		cr_assert_arr_eq(dst, src, LEN);
		/* Unregister while READs keep arriving: each completes with 0 (served before the
		 * key died) or -EACCES (after); unregister answers -EBUSY while one is served. */
		uint64_t posted = 2, done = 0;
		int urc;
		uint64_t deadline = kvx_now_ns() + 30000000000ull;
		cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 4, posted++), 0);
		while ((urc = kvx_xport_mr_unregister(rmr_t)) == -EBUSY) {
			struct kvx_xport_cpl cc;
			if (kvx_xport_poll_burst(iep, &cc, 1) == 1) {
				cr_assert(cc.status == 0 || cc.status == -EACCES, "status %d", cc.status);
				done++;
				cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 4, posted++), 0);
			}
			cr_assert_lt(kvx_now_ns(), deadline);
		}
		cr_assert_eq(urc, 0);
		while (done < posted - 2) {
			c = wait_one(iep);
			cr_assert(c.status == 0 || c.status == -EACCES, "status %d", c.status);
			done++;
		}
		cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 1, 99), 0);
		cr_assert_eq(wait_one(iep).status, -EACCES, "key still alive after unregister");
		/* Destroy the target side while the progress thread runs: requests that race with
		 * it are still refused (-EACCES); once the thread drops the connections, the
		 * initiator completes with -ECONNRESET. */
		kvx_xport_ep_destroy(tep);
		for (uint64_t ck = 100;; ck++) {
			cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 1, ck), 0);
			int st = wait_one(iep).status;
			if (st == -ECONNRESET)
				break;
			cr_assert_eq(st, -EACCES);
			cr_assert_lt(kvx_now_ns(), deadline);
		}
		kvx_xport_ep_destroy(iep);
	}
	atomic_store_explicit(&p.stop, true, memory_order_release);
	pthread_join(th, NULL);
	cr_assert_gt(atomic_load(&p.loops), 0);
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(tgt, &k);
	cr_assert_geq(k.reqs_served, 12 * 4);
	cr_assert_geq(k.reqs_rejected, 12);
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	free(src);
	free(dst);
}

/* ---- readiness, not retries (issue 16) --------------------------------------------------- */

static uint64_t ep_calls(struct kvx_xport_ep *ep, uint64_t *would_block)
{
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(ep, &k);
	if (would_block)
		*would_block = k.sock_would_block;
	return k.sock_calls;
}

static uint64_t ctx_calls(struct kvx_xport_ctx *ctx)
{
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(ctx, &k);
	return k.sock_calls;
}

Test(transport_tcp, blocked_socket_is_not_retried_and_its_readiness_wakes_an_armed_poller,
     .timeout = 120)
{
	struct kvx_xport_ctx *tgt, *ini;
	open_pair(&tgt, &ini, 1, 0);
	enum { LEN = 1 << 20 };
	uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
	for (int i = 0; i < LEN; i++)
		src[i] = (uint8_t)(i * 13 + 5);
	struct kvx_xport_mr *tmr = NULL, *lmr = NULL;
	struct kvx_xport_mr_params rp = {.addr = src, .len_bytes = LEN, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(tgt, &rp, &tmr), 0);
	struct kvx_xport_mr_params lp = {.addr = dst, .len_bytes = LEN, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(ini, &lp, &lmr), 0);
	struct kvx_xport_ep *iep, *tep;
	struct kvx_xport_rmr *rr = connect_import(ini, tgt, tmr, &iep, &tep);
	/* The target's progress has not run: the request goes out, no response can come. */
	struct kvx_xport_op op = {.lmr = lmr, .rmr = rr, .len = LEN};
	cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, &op, 1, 1), 0);
	struct kvx_xport_cpl c;
	cr_assert_eq(kvx_xport_poll_burst(iep, &c, 1), 0);
	uint64_t wb0, wb1, calls0 = ep_calls(iep, &wb0);
	cr_assert_geq(calls0, 1, "the request was sent");
	for (int i = 0; i < 1000; i++)
		cr_assert_eq(kvx_xport_poll_burst(iep, &c, 1), 0);
	cr_assert_eq(ep_calls(iep, &wb1), calls0, "1000 polls of a blocked endpoint made socket calls");
	cr_assert_leq(wb1, 1, "%lu calls found the socket not ready", (unsigned long)wb1);
	/* Armed: the caller's epoll set stays quiet until the response arrives. */
	int epfd = epoll_create1(EPOLL_CLOEXEC);
	cr_assert_geq(epfd, 0);
	cr_assert_eq(kvx_xport_ep_arm(iep, epfd), 1);
	cr_assert_eq(kvx_xport_ep_arm(iep, epfd), 1, "arming twice is harmless");
	struct epoll_event ev;
	cr_assert_eq(epoll_wait(epfd, &ev, 1, 0), 0, "armed set readable with nothing to do");
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	bool woke = false;
	while (!woke) {
		kvx_xport_progress(tgt); /* accepts, checks the hello, serves the READ */
		woke = epoll_wait(epfd, &ev, 1, 0) == 1;
		cr_assert_lt(kvx_now_ns(), deadline, "the response never made the armed set readable");
	}
	int n;
	while ((n = kvx_xport_poll_burst(iep, &c, 1)) == 0) {
		kvx_xport_progress(tgt);
		cr_assert_lt(kvx_now_ns(), deadline, "no completion within 30 s");
	}
	cr_assert_eq(c.status, 0);
	cr_assert_arr_eq(dst, src, LEN);
	/* Idle: neither side touches a socket (a few passes first drain the last edges). */
	for (int i = 0; i < 10; i++) {
		kvx_xport_progress(tgt);
		kvx_xport_poll_burst(iep, &c, 1);
	}
	uint64_t ic = ep_calls(iep, NULL), tc = ctx_calls(tgt);
	cr_assert_geq(tc, 2, "the target received the request and sent the response");
	for (int i = 0; i < 1000; i++) {
		cr_assert_eq(kvx_xport_progress(tgt), 0);
		cr_assert_eq(kvx_xport_poll_burst(iep, &c, 1), 0);
	}
	cr_assert_eq(ep_calls(iep, NULL), ic, "idle initiator made socket calls");
	cr_assert_eq(ctx_calls(tgt), tc, "idle target made socket calls");
	cr_assert_eq(kvx_xport_ep_arm(iep, -1), 0);
	kvx_xport_ep_destroy(iep);
	kvx_xport_ep_destroy(tep);
	kvx_xport_progress(tgt);
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	close(epfd);
	free(src);
	free(dst);
}

/* ---- data-plane authentication (issue 17) ---------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Connect to 127.0.0.1:port, send buf, then read until the target closes: returns the bytes
 * the target sent back (the socket is blocking: EOF / reset is the observable end). */
static size_t raw_session(uint16_t port, const uint8_t *buf, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
	size_t got = 0;
	uint8_t r[4096];
	ssize_t n;
	while ((n = recv(fd, r, sizeof(r), 0)) > 0)
		got += (size_t)n;
	close(fd);
	return got;
}

/* A 40-byte request header (tcp_internal.h wire format). */
static void req(uint8_t *h, int op, uint32_t key, uint64_t len, uint32_t seq)
{
	memset(h, 0, 40);
	h[0] = (uint8_t)op;
	put_le(h + 4, key, 4);
	put_le(h + 16, len, 8);
	put_le(h + 32, len, 4);
	put_le(h + 36, seq, 4);
}

Test(transport_tcp, raw_client_without_the_endpoint_secret_gets_nothing, .timeout = 120)
{
	struct kvx_xport_ctx *tgt, *ini;
	open_pair(&tgt, &ini, 1, 0);
	struct prog p = {.ctx = tgt};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, progress_thread, &p), 0);
	enum { LEN = 4096 };
	uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
	memset(src, 0xAB, LEN);
	struct kvx_xport_mr *tmr = NULL, *lmr = NULL;
	struct kvx_xport_mr_params rp = {.addr = src, .len_bytes = LEN, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(tgt, &rp, &tmr), 0);
	struct kvx_xport_mr_params lp = {.addr = dst, .len_bytes = LEN, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(ini, &lp, &lmr), 0);
	uint32_t key = kvx_xport_mr_key(tmr);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al, bl;
	struct kvx_xport_ep *iep = NULL, *tep = NULL;
	cr_assert_eq(kvx_xport_ep_create(ini, &iep, a, sizeof(a), &al), 0);
	cr_assert_eq(kvx_xport_ep_accept(tgt, a, al, &tep, b, sizeof(b), &bl), 0);
	uint16_t port = (uint16_t)(b[10] | b[11] << 8);
	/* The attacker knows the port, the endpoint token and the region key, not the secret. */
	uint8_t m[56 + 2 * 40 + LEN];
	size_t ml = 0;
	memset(m, 0, sizeof(m));
	memcpy(m, "KXTH\x02\0\0\0", 8);
	memcpy(m + 8, b + 16, 8); /* token */
	put_le(m + 18, 1, 2);     /* channel 0 of 1; proof m[24..56) left zero */
	ml = 56;
	req(m + ml, 1 /* READ */, key, LEN, 0);
	ml += 40;
	req(m + ml, 2 /* WRITE */, key, LEN, 1);
	ml += 40;
	memset(m + ml, 0xEE, LEN);
	ml += LEN;
	cr_assert_eq(raw_session(port, m, ml), 0, "forged proof: no response byte");
	/* Old (v1) hello with the right token: no proof at all. */
	m[4] = 1;
	cr_assert_eq(raw_session(port, m, ml), 0, "v1 hello: no response byte");
	/* No hello: requests straight away. */
	cr_assert_eq(raw_session(port, m + 56, ml - 56), 0, "requests without hello: nothing");
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(tgt, &k);
	cr_assert_eq(k.auth_refused, 3);
	cr_assert_eq(k.reqs_served, 0);
	cr_assert_eq(k.bytes_served, 0);
	for (int i = 0; i < LEN; i++)
		cr_assert_eq(src[i], 0xAB, "target memory untouched at %d", i);
	/* The listener survived: the real initiator proves the secret from blob B and reads. */
	cr_assert_eq(kvx_xport_ep_connect(iep, b, bl), 0);
	cr_assert_eq(kvx_xport_mr_export(tmr, d, sizeof(d), NULL), 0);
	struct kvx_xport_rmr *rr = NULL;
	cr_assert_eq(kvx_xport_rmr_import(iep, d, sizeof(d), &rr), 0);
	struct kvx_xport_op op = {.lmr = lmr, .rmr = rr, .len = LEN};
	cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, &op, 1, 7), 0);
	cr_assert_eq(wait_one(iep).status, 0);
	cr_assert_arr_eq(dst, src, LEN);
	kvx_xport_ctx_counters(tgt, &k);
	cr_assert_eq(k.auth_refused, 3);
	cr_assert_eq(k.reqs_served, 1);
	kvx_xport_ep_destroy(iep);
	kvx_xport_ep_destroy(tep);
	atomic_store_explicit(&p.stop, true, memory_order_release);
	pthread_join(th, NULL);
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	free(src);
	free(dst);
}
