/* SPDX-License-Identifier: Apache-2.0 */
/* Memory types, contexts, host allocation, streams and events (transport/mem.c, mem_host.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kvxfer/mem.h"
#include "transport/mem_internal.h"

TestSuite(mem_type, .timeout = 10.0);
TestSuite(mem_ctx, .timeout = 10.0);
TestSuite(mem_stream, .timeout = 10.0);
TestSuite(mem_event, .timeout = 10.0);

Test(mem_type, parse_accepts_host_hip_and_hip_device)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 7};

	cr_assert_eq(kvx_mem_parse_type("host", &t), 0);
	cr_assert_eq(t.kind, KVX_MEM_HOST);
	cr_assert_eq(t.device, 0);
	cr_assert_eq(kvx_mem_parse_type("hip", &t), 0);
	cr_assert_eq(t.kind, KVX_MEM_HIP);
	cr_assert_eq(t.device, 0);
	cr_assert_eq(kvx_mem_parse_type("hip:1", &t), 0);
	cr_assert_eq(t.kind, KVX_MEM_HIP);
	cr_assert_eq(t.device, 1);
	cr_assert_eq(kvx_mem_parse_type("hip:1023", &t), 0);
	cr_assert_eq(t.device, 1023);
}

Test(mem_type, parse_rejects_malformed_with_einval)
{
	static const char *bad[] = {"",      "Host",   "hip:",  "hip:-1", "hip:+1", "hip:1x",
				    "hip:1024", "hipx", "hip1", "cuda",   "hip: 1", "host:0",
				    "hip:99999999999999999999"};
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 5};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(kvx_mem_parse_type(bad[i], &t), -EINVAL, "input '%s'", bad[i]);
		cr_assert_eq(t.kind, KVX_MEM_HIP, "output untouched for '%s'", bad[i]);
		cr_assert_eq(t.device, 5);
	}
	cr_assert_eq(kvx_mem_parse_type(NULL, &t), -EINVAL);
}

Test(mem_type, str_round_trips)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 3}, u;
	char buf[16];

	cr_assert_str_eq(kvx_mem_type_str(&t, buf, sizeof(buf)), "hip:3");
	cr_assert_eq(kvx_mem_parse_type(buf, &u), 0);
	cr_assert_eq(u.kind, KVX_MEM_HIP);
	cr_assert_eq(u.device, 3);
	t.kind = KVX_MEM_HOST;
	t.device = 0;
	cr_assert_str_eq(kvx_mem_type_str(&t, buf, sizeof(buf)), "host");
}

Test(mem_ctx, host_probe_and_open_succeed)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem *m = NULL;
	char why[KVX_MEM_WHY_LEN] = "";

	cr_assert_eq(kvx_mem_probe(&t, why, sizeof(why)), 0);
	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	cr_assert_not_null(m);
	cr_assert_eq(kvx_mem_get_type(m).kind, KVX_MEM_HOST);
	kvx_mem_close(m);
	kvx_mem_close(NULL);
}

Test(mem_ctx, bad_kind_and_device_are_einval)
{
	struct kvx_mem_type t = {.kind = (enum kvx_mem_kind)9};
	struct kvx_mem *m = NULL;
	char why[KVX_MEM_WHY_LEN] = "";

	cr_assert_eq(kvx_mem_probe(&t, why, sizeof(why)), -EINVAL);
	cr_assert_str_eq(why, "unknown memory kind 9");
	cr_assert_eq(kvx_mem_open(&t, &m), -EINVAL);
	cr_assert_null(m);
	t.kind = KVX_MEM_HIP;
	t.device = -1;
	cr_assert_eq(kvx_mem_probe(&t, why, sizeof(why)), -EINVAL);
	cr_assert_str_eq(why, "HIP device -1 out of range 0..1023");
}

/*
 * Without a GPU (these machines), or without HIP in the build, opening hip:N fails cleanly with
 * the reason; with a GPU this test has nothing to check and skips.
 */
Test(mem_ctx, hip_without_device_fails_with_reason)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	struct kvx_mem *m = NULL;
	char why[KVX_MEM_WHY_LEN] = "";
	int rc = kvx_mem_probe(&t, why, sizeof(why));

	if (rc == 0)
		cr_skip_test("a HIP device is present: the no-device path is not reachable");
	if (kvx_mem_has_hip()) {
		cr_assert_eq(rc, -ENODEV);
		cr_assert(strstr(why, "no HIP device") != NULL, "why: %s", why);
	} else {
		cr_assert_eq(rc, -ENOTSUP);
		cr_assert(strstr(why, "built without HIP") != NULL, "why: %s", why);
	}
	cr_assert_eq(kvx_mem_open(&t, &m), rc);
	cr_assert_null(m);
	/* A device ordinal past any count also fails, never crashes. */
	t.device = 1023;
	cr_assert_eq(kvx_mem_probe(&t, why, sizeof(why)), rc);
}

Test(mem_ctx, host_alloc_copy_and_ptr_query)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_ptr_info info;
	struct kvx_mem *m;
	uint8_t *a = NULL, *b = NULL;

	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	cr_assert_eq(kvx_mem_alloc(m, 0, (void **)&a), -EINVAL);
	cr_assert_eq(kvx_mem_alloc(m, (1ull << 40) + 1, (void **)&a), -EINVAL);
	cr_assert_eq(kvx_mem_alloc(m, 10000, (void **)&a), 0);
	cr_assert_eq(kvx_mem_host_alloc(m, 10000, (void **)&b), 0);
	cr_assert_eq((uintptr_t)a % 4096, 0, "page-aligned");
	for (int i = 0; i < 10000; i++)
		a[i] = (uint8_t)(i * 7 + 3);
	cr_assert_eq(kvx_mem_copy_sync(m, b, a, 10000, KVX_MEM_D2H), 0);
	cr_assert_arr_eq(a, b, 10000);
	cr_assert_eq(kvx_mem_copy_sync(m, b, a, 10, (enum kvx_mem_copy_dir)3), -EINVAL);
	cr_assert_eq(kvx_mem_copy_sync(m, NULL, a, 0, KVX_MEM_H2D), 0);
	cr_assert_eq(kvx_mem_ptr_query(m, a + 100, 50, &info), 0);
	cr_assert_eq(info.kind, KVX_MEM_HOST);
	cr_assert_eq(info.base, (uintptr_t)(a + 100));
	cr_assert_eq(info.alloc_len, 50);
	cr_assert_eq(info.offset, 0);
	cr_assert_eq(kvx_mem_ptr_query(m, a, 0, &info), -EINVAL);
	cr_assert_eq(kvx_mem_ptr_query(m, (void *)(UINTPTR_MAX - 4), 10, &info), -EINVAL);
	kvx_mem_host_free(m, b);
	kvx_mem_free(m, a);
	kvx_mem_free(m, NULL);
	kvx_mem_close(m);
}

static struct kvx_mem *g_m;
static struct kvx_mem_stream *g_s;

static void open_stream(uint32_t depth, size_t step)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_stream_params p = {.depth = depth, .host_step_bytes = step};

	cr_assert_eq(kvx_mem_open(&t, &g_m), 0);
	cr_assert_eq(kvx_mem_stream_create(g_m, &p, &g_s), 0);
}

static void close_stream(void)
{
	kvx_mem_stream_destroy(g_s);
	kvx_mem_close(g_m);
}

Test(mem_stream, host_copy_completes_after_exact_steps)
{
	uint8_t src[1000], dst[1000];
	struct kvx_mem_event ev;

	open_stream(4, 100);
	for (int i = 0; i < 1000; i++)
		src[i] = (uint8_t)(i ^ 0x5a);
	memset(dst, 0, sizeof(dst));
	cr_assert_eq(kvx_mem_copy_async(g_s, dst, src, 1000, KVX_MEM_D2H, &ev), 0);
	cr_assert_eq(ev.kind, KVX_MEM_EVENT_STREAM);
	cr_assert_eq(kvx_mem_stream_inflight(g_s), 1);
	/* 1000 bytes at 100 per query: 9 not-ready queries, ready on the 10th. */
	for (int i = 0; i < 9; i++) {
		cr_assert_eq(kvx_mem_event_query(&ev), 0, "query %d", i);
		cr_assert_eq(dst[(i + 1) * 100 - 1], src[(i + 1) * 100 - 1]);
		cr_assert_eq(dst[(i + 1) * 100], 0, "no byte past step %d yet", i);
	}
	cr_assert_eq(kvx_mem_event_query(&ev), 1);
	cr_assert_arr_eq(dst, src, 1000);
	cr_assert_eq(kvx_mem_stream_inflight(g_s), 0);
	cr_assert_eq(kvx_mem_event_query(&ev), 1, "stays ready");
	close_stream();
}

Test(mem_stream, later_copy_is_ready_only_after_earlier_ones)
{
	uint8_t src[300], d1[100], d2[100], d3[100];
	struct kvx_mem_event e1, e2, e3;
	int n = 0;

	open_stream(8, 50);
	memset(src, 0xab, sizeof(src));
	cr_assert_eq(kvx_mem_copy_async(g_s, d1, src, 100, KVX_MEM_D2H, &e1), 0);
	cr_assert_eq(kvx_mem_copy_async(g_s, d2, src + 100, 100, KVX_MEM_H2D, &e2), 0);
	cr_assert_eq(kvx_mem_copy_async(g_s, d3, src + 200, 100, KVX_MEM_D2D, &e3), 0);
	/* In-order stream: 6 steps of 50 bytes; the third event reads ready on the 6th query. */
	while (kvx_mem_event_query(&e3) == 0)
		n++;
	cr_assert_eq(n, 5);
	cr_assert_eq(kvx_mem_event_query(&e1), 1);
	cr_assert_eq(kvx_mem_event_query(&e2), 1);
	cr_assert_arr_eq(d3, src + 200, 100);
	close_stream();
}

Test(mem_stream, full_depth_returns_enobufs_until_oldest_finishes)
{
	uint8_t src[64], dst[4][64];
	struct kvx_mem_event ev[4];

	open_stream(2, 16);
	memset(src, 1, sizeof(src));
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[0], src, 64, KVX_MEM_D2H, &ev[0]), 0);
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[1], src, 64, KVX_MEM_D2H, &ev[1]), 0);
	/* Full: each refused attempt advances the oldest copy one step (4 steps of 16). */
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[2], src, 64, KVX_MEM_D2H, &ev[2]), -ENOBUFS);
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[2], src, 64, KVX_MEM_D2H, &ev[2]), -ENOBUFS);
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[2], src, 64, KVX_MEM_D2H, &ev[2]), -ENOBUFS);
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[2], src, 64, KVX_MEM_D2H, &ev[2]), 0);
	cr_assert_eq(kvx_mem_event_query(&ev[0]), 1);
	cr_assert_eq(kvx_mem_stream_inflight(g_s), 2);
	cr_assert_eq(kvx_mem_copy_async(g_s, dst[2], src, 0, KVX_MEM_D2H, NULL), -EINVAL);
	cr_assert_eq(kvx_mem_copy_async(g_s, NULL, src, 1, KVX_MEM_D2H, NULL), -EINVAL);
	close_stream();
}

Test(mem_stream, destroy_finishes_queued_copies)
{
	uint8_t src[4096], dst[4096];

	open_stream(4, 1);
	memset(src, 0x77, sizeof(src));
	memset(dst, 0, sizeof(dst));
	cr_assert_eq(kvx_mem_copy_async(g_s, dst, src, sizeof(src), KVX_MEM_D2H, NULL), 0);
	close_stream();
	cr_assert_arr_eq(dst, src, sizeof(src));
}

Test(mem_stream, bad_params_are_einval)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_stream_params p = {.depth = 4097};
	struct kvx_mem_stream *s = NULL;
	struct kvx_mem *m;

	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	cr_assert_eq(kvx_mem_stream_create(m, &p, &s), -EINVAL);
	cr_assert_null(s);
	cr_assert_eq(kvx_mem_stream_create(m, NULL, &s), 0);
	kvx_mem_stream_destroy(s);
	kvx_mem_stream_destroy(NULL);
	kvx_mem_close(m);
}

Test(mem_event, flag_counter_threshold)
{
	_Atomic uint64_t layers_done = 0;
	struct kvx_mem_event l0, l2;

	kvx_mem_event_init_flag(&l0, &layers_done, 1);
	kvx_mem_event_init_flag(&l2, &layers_done, 3);
	cr_assert_eq(kvx_mem_event_query(&l0), 0);
	atomic_store_explicit(&layers_done, 1, memory_order_release);
	cr_assert_eq(kvx_mem_event_query(&l0), 1);
	cr_assert_eq(kvx_mem_event_query(&l2), 0);
	atomic_fetch_add_explicit(&layers_done, 2, memory_order_release);
	cr_assert_eq(kvx_mem_event_query(&l2), 1);
}

Test(mem_event, zero_and_ready_events_are_ready_unknown_is_einval)
{
	struct kvx_mem_event z, r, bad;

	memset(&z, 0, sizeof(z));
	kvx_mem_event_init_ready(&r);
	cr_assert_eq(kvx_mem_event_query(&z), 1);
	cr_assert_eq(kvx_mem_event_query(&r), 1);
	memset(&bad, 0, sizeof(bad));
	bad.kind = 42;
	cr_assert_eq(kvx_mem_event_query(&bad), -EINVAL);
}

Test(mem_event, hip_event_init_checks_build_and_null)
{
	struct kvx_mem_event ev;
	int fake;

	cr_assert_eq(kvx_mem_event_init_hip(&ev, NULL), -EINVAL);
	if (kvx_mem_has_hip()) {
		cr_assert_eq(kvx_mem_event_init_hip(&ev, &fake), 0);
		cr_assert_eq(ev.kind, KVX_MEM_EVENT_HIP);
		cr_assert_eq(ev.u.hip_event, (void *)&fake);
	} else {
		cr_assert_eq(kvx_mem_event_init_hip(&ev, &fake), -ENOTSUP);
	}
}

/* Native (producer) events are queried through the memory ops of their kind: host kinds have
 * none and answer -ENOTSUP; the HIP ops (when built) fill the slot. */
Test(mem_event, native_event_query_is_a_memory_ops_slot)
{
	int fake = 0;

	cr_assert_eq(kvx_mem_host_ops.event_query(&fake), -ENOTSUP);
	cr_assert_eq(kvx_mem_hostdev_ops.event_query(&fake), -ENOTSUP);
#ifdef KVX_HAVE_HIP
	cr_assert_not_null(kvx_mem_hip_ops.event_query);
#endif
}

TestSuite(mem_buf, .timeout = 10.0);

Test(mem_buf, host_buffer_is_allocated_and_zeroed)
{
	struct kvx_mem_buf b;
	char why[KVX_MEM_WHY_LEN] = "";
	uint8_t zero[8192];

	memset(zero, 0, sizeof(zero));
	cr_assert_eq(kvx_mem_buf_init("host", sizeof(zero), &b, why, sizeof(why)), 0, "%s", why);
	cr_assert_not_null(b.mem);
	cr_assert_not_null(b.ptr);
	cr_assert_eq(b.len, sizeof(zero));
	cr_assert_eq(b.type.kind, KVX_MEM_HOST);
	cr_assert_arr_eq(b.ptr, zero, sizeof(zero));
	kvx_mem_buf_fini(&b);
	cr_assert_null(b.mem);
	cr_assert_null(b.ptr);
	kvx_mem_buf_fini(&b);
}

Test(mem_buf, hip_without_device_fails_with_no_hip_device)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 1};
	struct kvx_mem_buf b;
	char why[KVX_MEM_WHY_LEN] = "";

	if (kvx_mem_probe(&t, NULL, 0) == 0)
		cr_skip_test("HIP device 1 is present");
	if (!kvx_mem_has_hip())
		cr_skip_test("built without HIP: -ENOTSUP path (checked in mem_ctx)");
	cr_assert_eq(kvx_mem_buf_init("hip:1", 4096, &b, why, sizeof(why)), -ENODEV);
	cr_assert(strncmp(why, "--mem hip:1: no HIP device", 26) == 0, "why: %s", why);
	cr_assert_null(b.mem);
	cr_assert_null(b.ptr);
}

Test(mem_buf, malformed_option_and_length_are_einval_naming_the_value)
{
	struct kvx_mem_buf b;
	char why[KVX_MEM_WHY_LEN] = "";

	cr_assert_eq(kvx_mem_buf_init("gpu", 4096, &b, why, sizeof(why)), -EINVAL);
	cr_assert_str_eq(why, "--mem 'gpu': expected host, hip, hip:<DEVICE> or hostdev");
	cr_assert_eq(kvx_mem_buf_init("host", 0, &b, why, sizeof(why)), -EINVAL);
	cr_assert_str_eq(why, "--mem host: buffer length 0 out of range 1..2^40");
	cr_assert_null(b.mem);
}
