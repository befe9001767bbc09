/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging ring (transport/mem_stage.c) against the host implementation, whose copies finish
 * in steps: byte-exact delivery, ring order, overlap of copies with held (being-sent) buffers,
 * and the refusal paths.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/mem.h"

TestSuite(mem_stage, .timeout = 20.0);

static struct kvx_mem *g_m;
static struct kvx_mem_stream *g_s;
static struct kvx_mem_stage *g_st;

static void setup(uint32_t nbufs, size_t buf_bytes, size_t step, uint32_t jobs)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_stream_params sp = {.depth = 8, .host_step_bytes = step};
	struct kvx_mem_stage_params p = {.nbufs = nbufs, .buf_bytes = buf_bytes, .jobs = jobs};

	cr_assert_eq(kvx_mem_open(&t, &g_m), 0);
	cr_assert_eq(kvx_mem_stream_create(g_m, &sp, &g_s), 0);
	cr_assert_eq(kvx_mem_stage_create(g_m, g_s, &p, &g_st), 0);
}

static void teardown(void)
{
	kvx_mem_stage_destroy(g_st);
	kvx_mem_stream_destroy(g_s);
	kvx_mem_close(g_m);
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 131u + seed) ^ (i >> 8));
}

Test(mem_stage, d2h_delivers_every_byte_of_every_job_in_order)
{
	static const size_t sizes[3] = {10000, 4096, 1};
	uint8_t *src[3], *got[3];
	size_t received[3] = {0, 0, 0};
	int chunks = 0, lasts = 0, polls = 0;
	uint64_t next_cookie = 100;

	setup(3, 4096, 1000, 8);
	for (int j = 0; j < 3; j++) {
		cr_assert_eq(kvx_mem_alloc(g_m, sizes[j], (void **)&src[j]), 0);
		got[j] = calloc(1, sizes[j]);
		fill_pattern(src[j], sizes[j], (uint32_t)j * 17);
		cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src[j], sizes[j], 100 + (uint64_t)j), 0);
	}
	while (lasts < 3) {
		struct kvx_mem_chunk c;
		int r = kvx_mem_stage_d2h_poll(g_st, &c);
		int j;

		cr_assert_geq(r, 0);
		cr_assert_lt(++polls, 1000);
		if (r == 0)
			continue;
		j = (int)(c.cookie - 100);
		cr_assert(j >= 0 && j < 3, "cookie %llu", (unsigned long long)c.cookie);
		/* Chunks arrive job after job, each job's chunks in offset order. */
		cr_assert_eq(c.cookie, next_cookie);
		cr_assert_eq(c.job_off, received[j]);
		cr_assert_leq(c.len, 4096);
		memcpy(got[j] + c.job_off, c.buf, c.len); /* "send" */
		received[j] += c.len;
		cr_assert_eq(c.last, received[j] == sizes[j]);
		if (c.last) {
			lasts++;
			next_cookie++;
		}
		chunks++;
		cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c), 0);
	}
	cr_assert_eq(chunks, 3 + 1 + 1);
	for (int j = 0; j < 3; j++) {
		cr_assert_arr_eq(got[j], src[j], sizes[j], "job %d", j);
		kvx_mem_free(g_m, src[j]);
		free(got[j]);
	}
	{
		struct kvx_mem_chunk c;

		cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &c), 0, "idle after the last job");
	}
	teardown();
}

Test(mem_stage, d2h_copies_next_buffer_while_previous_is_held)
{
	uint8_t src[4 * 4096];
	struct kvx_mem_chunk c0, c1, c2, c3, x;

	setup(2, 4096, 4096, 4); /* one step per chunk */
	fill_pattern(src, sizeof(src), 9);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, sizeof(src), 1), 0);
	/* Poll 1 starts copies into both buffers; the first completes and is handed out. */
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &c0), 1);
	cr_assert_eq(c0.job_off, 0);
	cr_assert_eq(kvx_mem_stream_inflight(g_s), 1, "chunk 1's copy is in flight");
	/* c0 is being "sent" (held); chunk 1 finishes copying meanwhile. */
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &c1), 1);
	cr_assert_eq(c1.job_off, 4096);
	cr_assert_arr_eq(c0.buf, src, 4096);
	cr_assert_arr_eq(c1.buf, src + 4096, 4096);
	cr_assert_neq(c0.buf, c1.buf);
	/* Both buffers held: nothing more. */
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &x), 0);
	/* Releasing c1 first does not let the ring skip c0's slot (fill in ring order). */
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c1), 0);
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &x), 0);
	cr_assert_eq(kvx_mem_stream_inflight(g_s), 0);
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c0), 0);
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &c2), 1);
	cr_assert_eq(c2.job_off, 8192);
	cr_assert_eq(c2.buf, c0.buf);
	cr_assert_not(c2.last);
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &c3), 1);
	cr_assert_eq(c3.job_off, 12288);
	cr_assert(c3.last);
	cr_assert_arr_eq(c2.buf, src + 8192, 4096);
	cr_assert_arr_eq(c3.buf, src + 12288, 4096);
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c2), 0);
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c3), 0);
	teardown();
}

Test(mem_stage, d2h_release_rejects_chunks_not_held)
{
	uint8_t src[100];
	struct kvx_mem_chunk c, forged;

	setup(2, 4096, 4096, 4);
	memset(src, 1, sizeof(src));
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, sizeof(src), 5), 0);
	cr_assert_eq(kvx_mem_stage_d2h_poll(g_st, &c), 1);
	forged = c;
	forged.slot = 1;
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &forged), -EINVAL);
	forged.slot = 16;
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &forged), -EINVAL);
	forged = c;
	forged.buf = src;
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &forged), -EINVAL);
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c), 0);
	cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &c), -EINVAL, "double release");
	teardown();
}

Test(mem_stage, d2h_push_full_queue_returns_enobufs)
{
	uint8_t src[10];

	setup(2, 4096, 4096, 2);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, 10, 1), 0);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, 10, 2), 0);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, 10, 3), -ENOBUFS);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, 0, 3), -EINVAL);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, NULL, 1, 3), -EINVAL);
	teardown();
}

Test(mem_stage, h2d_received_chunks_reach_device_bytes_exact)
{
	enum { TOTAL = 3 * 4096 + 500 };
	uint8_t *wire = malloc(TOTAL), *dev;
	size_t sent = 0, retired_bytes = 0;
	uint64_t expect_cookie = 0;
	int polls = 0;

	setup(2, 4096, 1024, 4);
	fill_pattern(wire, TOTAL, 77);
	cr_assert_eq(kvx_mem_alloc(g_m, TOTAL, (void **)&dev), 0);
	memset(dev, 0, TOTAL);
	while (retired_bytes < TOTAL) {
		struct kvx_mem_chunk c;
		uint64_t cookie;
		size_t len;
		int r;

		cr_assert_lt(++polls, 1000);
		if (sent < TOTAL && kvx_mem_stage_h2d_get(g_st, &c) == 0) {
			size_t n = TOTAL - sent < c.len ? TOTAL - sent : c.len;

			cr_assert_eq(c.len, 4096);
			memcpy(c.buf, wire + sent, n); /* "recv" */
			cr_assert_eq(kvx_mem_stage_h2d_commit(g_st, &c, dev + sent, n, sent), 0);
			sent += n;
		}
		r = kvx_mem_stage_h2d_poll(g_st, &cookie, &len);
		cr_assert_geq(r, 0);
		if (r == 1) {
			cr_assert_eq(cookie, expect_cookie, "retired in order");
			expect_cookie += len;
			retired_bytes += len;
		}
	}
	cr_assert_arr_eq(dev, wire, TOTAL);
	kvx_mem_free(g_m, dev);
	free(wire);
	teardown();
}

Test(mem_stage, h2d_get_refuses_when_all_buffers_busy_and_cancel_frees)
{
	uint8_t dev[8192];
	struct kvx_mem_chunk a, b, c;
	uint64_t cookie;

	setup(2, 4096, 4096, 4);
	cr_assert_eq(kvx_mem_stage_h2d_get(g_st, &a), 0);
	cr_assert_eq(kvx_mem_stage_h2d_get(g_st, &b), 0);
	cr_assert_eq(kvx_mem_stage_h2d_get(g_st, &c), -ENOBUFS);
	cr_assert_eq(kvx_mem_stage_h2d_commit(g_st, &a, dev, 4097, 1), -EINVAL, "over capacity");
	cr_assert_eq(kvx_mem_stage_h2d_commit(g_st, &a, NULL, 1, 1), -EINVAL);
	cr_assert_eq(kvx_mem_stage_h2d_cancel(g_st, &a), 0);
	cr_assert_eq(kvx_mem_stage_h2d_cancel(g_st, &a), -EINVAL, "double cancel");
	cr_assert_eq(kvx_mem_stage_h2d_commit(g_st, &a, dev, 1, 1), -EINVAL, "cancelled");
	/* b is held (not committed): poll skips the cancelled slot and then waits on b. */
	cr_assert_eq(kvx_mem_stage_h2d_poll(g_st, &cookie, NULL), 0);
	cr_assert_eq(kvx_mem_stage_h2d_get(g_st, &c), 0, "a's buffer is free again");
	cr_assert_eq(c.buf, a.buf);
	memset(b.buf, 0xee, 10);
	cr_assert_eq(kvx_mem_stage_h2d_commit(g_st, &b, dev, 10, 42), 0);
	cr_assert_eq(kvx_mem_stage_h2d_poll(g_st, &cookie, NULL), 1);
	cr_assert_eq(cookie, 42);
	cr_assert_eq(dev[9], 0xee);
	cr_assert_eq(kvx_mem_stage_h2d_cancel(g_st, &c), 0);
	teardown();
}

Test(mem_stage, create_rejects_bad_params)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_stage_params p = {.nbufs = 1};
	struct kvx_mem *m, *other;
	struct kvx_mem_stream *s;
	struct kvx_mem_stage *st = NULL;

	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	cr_assert_eq(kvx_mem_open(&t, &other), 0);
	cr_assert_eq(kvx_mem_stream_create(m, NULL, &s), 0);
	cr_assert_eq(kvx_mem_stage_create(m, s, &p, &st), -EINVAL);
	p.nbufs = KVX_MEM_STAGE_MAX_BUFS + 1;
	cr_assert_eq(kvx_mem_stage_create(m, s, &p, &st), -EINVAL);
	p.nbufs = 2;
	p.buf_bytes = 100;
	cr_assert_eq(kvx_mem_stage_create(m, s, &p, &st), -EINVAL);
	cr_assert_eq(kvx_mem_stage_create(other, s, NULL, &st), -EINVAL, "stream of another ctx");
	cr_assert_null(st);
	cr_assert_eq(kvx_mem_stage_create(m, s, NULL, &st), 0);
	kvx_mem_stage_destroy(st);
	kvx_mem_stage_destroy(NULL);
	kvx_mem_stream_destroy(s);
	kvx_mem_close(other);
	kvx_mem_close(m);
}

/*
 * Both directions over a real socket, as the tcp provider would use them: the send side stages
 * device -> bounce and sends each buffer while the next copies run; the receive side receives
 * into bounce buffers and copies them to device memory. Two simulated lcores share this thread.
 */
Test(mem_stage, d2h_send_and_recv_h2d_over_socket_are_byte_exact_and_overlap)
{
	enum { TOTAL = 200000 + 17, BUF = 4096 };
	struct kvx_mem_stream_params sp = {.depth = 8, .host_step_bytes = 1500};
	struct kvx_mem_stage_params p = {.nbufs = 4, .buf_bytes = BUF};
	struct kvx_mem_stream *rs;
	struct kvx_mem_stage *rx;
	struct kvx_mem_chunk out, in;
	uint8_t *src, *dst;
	size_t out_sent = 0, sent_total = 0, in_fill = 0, recvd = 0, landed = 0;
	bool have_out = false, have_in = false;
	uint64_t overlap = 0, iters = 0;
	uint64_t deadline = kvx_now_ns() + 15ull * 1000000000ull;
	int sv[2];

	setup(4, BUF, 1500, 4);
	cr_assert_eq(kvx_mem_stream_create(g_m, &sp, &rs), 0);
	cr_assert_eq(kvx_mem_stage_create(g_m, rs, &p, &rx), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	cr_assert_eq(kvx_mem_alloc(g_m, TOTAL, (void **)&src), 0);
	cr_assert_eq(kvx_mem_alloc(g_m, TOTAL, (void **)&dst), 0);
	fill_pattern(src, TOTAL, 1234);
	memset(dst, 0, TOTAL);
	cr_assert_eq(kvx_mem_stage_d2h_push(g_st, src, TOTAL, 1), 0);
	while (landed < TOTAL && kvx_now_ns() < deadline) {
		uint64_t cookie;
		size_t len;
		ssize_t k;
		int r;

		iters++;
		/* Send side lcore. */
		if (!have_out) {
			r = kvx_mem_stage_d2h_poll(g_st, &out);
			cr_assert_geq(r, 0);
			have_out = r == 1;
			out_sent = 0;
		}
		if (have_out) {
			if (kvx_mem_stream_inflight(g_s) > 0)
				overlap++; /* a buffer is on the wire while later copies run */
			k = send(sv[0], (uint8_t *)out.buf + out_sent, out.len - out_sent, MSG_NOSIGNAL);
			if (k > 0) {
				out_sent += (size_t)k;
				sent_total += (size_t)k;
			} else {
				cr_assert(k < 0 && errno == EAGAIN, "send: %s", strerror(errno));
			}
			if (out_sent == out.len) {
				cr_assert_eq(kvx_mem_stage_d2h_release(g_st, &out), 0);
				have_out = false;
			}
		}
		/* Receive side lcore. */
		if (!have_in && recvd < TOTAL && kvx_mem_stage_h2d_get(rx, &in) == 0) {
			have_in = true;
			in_fill = 0;
		}
		if (have_in) {
			size_t want = TOTAL - recvd < in.len ? TOTAL - recvd : in.len;

			k = recv(sv[1], (uint8_t *)in.buf + in_fill, want - in_fill, 0);
			if (k > 0)
				in_fill += (size_t)k;
			else
				cr_assert(k < 0 && errno == EAGAIN, "recv: %s", strerror(errno));
			if (in_fill == want) {
				r = kvx_mem_stage_h2d_commit(rx, &in, dst + recvd, want, recvd);
				if (r == 0) {
					recvd += want;
					have_in = false;
				} else {
					cr_assert_eq(r, -ENOBUFS);
				}
			}
		}
		r = kvx_mem_stage_h2d_poll(rx, &cookie, &len);
		cr_assert_geq(r, 0);
		if (r == 1) {
			cr_assert_eq(cookie, landed, "copies land in order");
			landed += len;
		}
	}
	cr_assert_eq(sent_total, TOTAL);
	cr_assert_eq(landed, TOTAL);
	cr_assert_arr_eq(dst, src, TOTAL);
	cr_assert_gt(overlap, 0, "send of one buffer overlapped a copy into another (%llu iters)",
		     (unsigned long long)iters);
	close(sv[0]);
	close(sv[1]);
	kvx_mem_free(g_m, src);
	kvx_mem_free(g_m, dst);
	kvx_mem_stage_destroy(rx);
	kvx_mem_stream_destroy(rs);
	teardown();
}
