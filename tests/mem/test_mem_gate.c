/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-ready gating (transport/mem_gate.c): a layer's WRITEs are posted only after the
 * layer's event queried ready, including events that complete late (a host-implementation
 * copy that needs several steps, and a counter set later by another thread).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kvxfer/mem.h"

TestSuite(mem_gate, .timeout = 20.0);

/* A layer's batch of WRITEs, and the log of what the "polling lcore" posted. */
struct layer_writes {
	int layer;
	const struct kvx_mem_event *ready; /* the event it was gated on */
};

struct post_log {
	int layers[64];
	int n;
};

/* Post the released batches; each must find its event ready at post time. */
static void post_released(struct post_log *log, const struct kvx_mem_gate_item *it, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct layer_writes *w = it[i].item;

		cr_assert_eq(it[i].status, 0);
		cr_assert_eq(kvx_mem_event_query(w->ready), 1, "layer %d posted before ready",
			     w->layer);
		log->layers[log->n++] = w->layer;
	}
}

Test(mem_gate, late_stream_event_holds_write_until_complete)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_stream_params sp = {.depth = 4, .host_step_bytes = 64};
	struct kvx_mem_gate_item out[8];
	struct kvx_mem_stream *s;
	struct kvx_mem_gate *g;
	struct kvx_mem *m;
	struct kvx_mem_event ev;
	struct layer_writes w0 = {.layer = 0, .ready = &ev};
	struct post_log log = {.n = 0};
	uint8_t src[512], dst[512];
	int polls = 0;

	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	cr_assert_eq(kvx_mem_stream_create(m, &sp, &s), 0);
	cr_assert_eq(kvx_mem_gate_create(8, &g), 0);
	memset(src, 3, sizeof(src));
	/* The layer is "computed" by a copy that needs 512/64 = 8 steps. */
	cr_assert_eq(kvx_mem_copy_async(s, dst, src, sizeof(src), KVX_MEM_D2H, &ev), 0);
	cr_assert_eq(kvx_mem_gate_push(g, &ev, &w0), 0);
	for (;;) {
		uint32_t n = kvx_mem_gate_poll(g, out, 8);

		polls++;
		post_released(&log, out, n);
		if (n)
			break;
		cr_assert_eq(log.n, 0, "no WRITE before the event completed (poll %d)", polls);
		cr_assert_eq(kvx_mem_gate_count(g), 1);
		cr_assert_lt(polls, 100);
	}
	cr_assert_eq(polls, 8, "released exactly on the poll that completed the copy");
	cr_assert_eq(log.n, 1);
	cr_assert_eq(log.layers[0], 0);
	cr_assert_arr_eq(dst, src, sizeof(src));
	cr_assert_eq(kvx_mem_gate_count(g), 0);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 8), 0);
	kvx_mem_gate_destroy(g);
	kvx_mem_stream_destroy(s);
	kvx_mem_close(m);
}

struct producer {
	_Atomic uint64_t layers_done;
	_Atomic int go;
	uint8_t kv[4][256]; /* the layers' "KV" written before publishing */
};

static void *producer_main(void *arg)
{
	struct producer *p = arg;

	for (int l = 0; l < 4; l++) {
		/* Wait (bounded) until the consumer has seen layer l held back. */
		uint64_t deadline = kvx_now_ns() + 10ull * 1000000000ull;

		while (atomic_load_explicit(&p->go, memory_order_acquire) <= l &&
		       kvx_now_ns() < deadline)
			sched_yield();
		memset(p->kv[l], 0x10 + l, sizeof(p->kv[l]));
		atomic_store_explicit(&p->layers_done, (uint64_t)l + 1, memory_order_release);
	}
	return NULL;
}

Test(mem_gate, flag_set_by_other_thread_releases_layers_in_order)
{
	static struct producer p;
	struct kvx_mem_event ev[4];
	struct layer_writes w[4];
	struct kvx_mem_gate_item out[4];
	struct post_log log = {.n = 0};
	struct kvx_mem_gate *g;
	pthread_t th;
	uint64_t deadline = kvx_now_ns() + 15ull * 1000000000ull;

	memset(&p, 0, sizeof(p));
	cr_assert_eq(kvx_mem_gate_create(4, &g), 0);
	for (int l = 0; l < 4; l++) {
		kvx_mem_event_init_flag(&ev[l], &p.layers_done, (uint64_t)l + 1);
		w[l].layer = l;
		w[l].ready = &ev[l];
		cr_assert_eq(kvx_mem_gate_push(g, &ev[l], &w[l]), 0);
	}
	cr_assert_eq(pthread_create(&th, NULL, producer_main, &p), 0);
	while (log.n < 4 && kvx_now_ns() < deadline) {
		uint32_t n = kvx_mem_gate_poll(g, out, 4);

		post_released(&log, out, n);
		for (uint32_t i = 0; i < n; i++) {
			const struct layer_writes *x = out[i].item;
			uint8_t expect[256];

			/* Acquire/release pairing: the layer's bytes are visible when posted. */
			memset(expect, 0x10 + x->layer, sizeof(expect));
			cr_assert_arr_eq(p.kv[x->layer], expect, sizeof(expect));
		}
		/* Nothing beyond what the producer published was posted. */
		cr_assert_leq((uint64_t)log.n, atomic_load(&p.layers_done));
		if (n == 0 && atomic_load(&p.go) == log.n)
			atomic_store_explicit(&p.go, log.n + 1, memory_order_release);
		sched_yield();
	}
	pthread_join(th, NULL);
	cr_assert_eq(log.n, 4);
	for (int l = 0; l < 4; l++)
		cr_assert_eq(log.layers[l], l);
	kvx_mem_gate_destroy(g);
}

Test(mem_gate, ready_items_pass_blocked_ones_and_keep_order)
{
	_Atomic uint64_t a = 0, b = 0;
	struct kvx_mem_event ea, eb, er;
	struct kvx_mem_gate_item out[4];
	struct kvx_mem_gate *g;
	int items[4] = {0, 1, 2, 3};

	cr_assert_eq(kvx_mem_gate_create(4, &g), 0);
	kvx_mem_event_init_flag(&ea, &a, 1);
	kvx_mem_event_init_flag(&eb, &b, 1);
	kvx_mem_event_init_ready(&er);
	cr_assert_eq(kvx_mem_gate_push(g, &ea, &items[0]), 0);
	cr_assert_eq(kvx_mem_gate_push(g, &er, &items[1]), 0);
	cr_assert_eq(kvx_mem_gate_push(g, &eb, &items[2]), 0);
	cr_assert_eq(kvx_mem_gate_push(g, &er, &items[3]), 0);
	cr_assert_eq(kvx_mem_gate_push(g, &er, &items[3]), -ENOBUFS);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 4), 2);
	cr_assert_eq(out[0].item, &items[1]);
	cr_assert_eq(out[1].item, &items[3]);
	cr_assert_eq(kvx_mem_gate_count(g), 2);
	atomic_store(&b, 1);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 4), 1);
	cr_assert_eq(out[0].item, &items[2]);
	atomic_store(&a, 1);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 4), 1);
	cr_assert_eq(out[0].item, &items[0]);
	cr_assert_eq(kvx_mem_gate_count(g), 0);
	kvx_mem_gate_destroy(g);
}

Test(mem_gate, poll_respects_out_capacity_and_order)
{
	struct kvx_mem_event er;
	struct kvx_mem_gate_item out[2];
	struct kvx_mem_gate *g;
	int items[5];

	kvx_mem_event_init_ready(&er);
	cr_assert_eq(kvx_mem_gate_create(5, &g), 0);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(kvx_mem_gate_push(g, &er, &items[i]), 0);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 2), 2);
	cr_assert_eq(out[0].item, &items[0]);
	cr_assert_eq(out[1].item, &items[1]);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 2), 2);
	cr_assert_eq(out[0].item, &items[2]);
	cr_assert_eq(out[1].item, &items[3]);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 2), 1);
	cr_assert_eq(out[0].item, &items[4]);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 0), 0);
	kvx_mem_gate_destroy(g);
}

Test(mem_gate, failed_event_releases_item_with_error_status)
{
	struct kvx_mem_event bad;
	struct kvx_mem_gate_item out[1];
	struct kvx_mem_gate *g;
	int item;

	memset(&bad, 0, sizeof(bad));
	bad.kind = 77;
	cr_assert_eq(kvx_mem_gate_create(1, &g), 0);
	cr_assert_eq(kvx_mem_gate_push(g, &bad, &item), 0);
	cr_assert_eq(kvx_mem_gate_poll(g, out, 1), 1);
	cr_assert_eq(out[0].item, &item);
	cr_assert_eq(out[0].status, -EINVAL);
	kvx_mem_gate_destroy(g);
}

Test(mem_gate, create_rejects_bad_capacity)
{
	struct kvx_mem_gate *g = NULL;

	cr_assert_eq(kvx_mem_gate_create(0, &g), -EINVAL);
	cr_assert_eq(kvx_mem_gate_create(65537, &g), -EINVAL);
	cr_assert_null(g);
	kvx_mem_gate_destroy(NULL);
}
