/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HIP implementation (transport/hip/mem_hip.c) on a real GPU. Every test skips with the reason
 * (e.g. "no HIP device (hipGetDeviceCount: hipErrorNoDevice)") where there is no GPU or the
 * build has no HIP. Label: hw.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/mem.h"
#include "transport/mem_internal.h"

TestSuite(mem_hip, .timeout = 60.0);

static struct kvx_mem *open_hip_or_skip(void)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	char why[KVX_MEM_WHY_LEN] = "";
	struct kvx_mem *m = NULL;

	if (kvx_mem_probe(&t, why, sizeof(why)) != 0)
		cr_skip_test("%s", why);
	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	return m;
}

/* Poll an event with a bounded deadline (the GPU finishes asynchronously). */
static int wait_event(const struct kvx_mem_event *ev)
{
	uint64_t deadline = kvx_now_ns() + 10ull * 1000000000ull;
	int r;

	while ((r = kvx_mem_event_query(ev)) == 0 && kvx_now_ns() < deadline)
		;
	return r;
}

Test(mem_hip, alloc_copy_round_trip_is_byte_exact)
{
	struct kvx_mem *m = open_hip_or_skip();
	size_t n = 3u << 20;
	uint8_t *dev, *h1, *h2;

	cr_assert_eq(kvx_mem_alloc(m, n, (void **)&dev), 0);
	cr_assert_eq(kvx_mem_host_alloc(m, n, (void **)&h1), 0);
	cr_assert_eq(kvx_mem_host_alloc(m, n, (void **)&h2), 0);
	for (size_t i = 0; i < n; i++)
		h1[i] = (uint8_t)(i * 31 + 7);
	memset(h2, 0, n);
	cr_assert_eq(kvx_mem_copy_sync(m, dev, h1, n, KVX_MEM_H2D), 0);
	cr_assert_eq(kvx_mem_copy_sync(m, h2, dev, n, KVX_MEM_D2H), 0);
	cr_assert_arr_eq(h1, h2, n);
	kvx_mem_host_free(m, h2);
	kvx_mem_host_free(m, h1);
	kvx_mem_free(m, dev);
	kvx_mem_close(m);
}

Test(mem_hip, async_copy_event_becomes_ready)
{
	struct kvx_mem *m = open_hip_or_skip();
	struct kvx_mem_stream *s;
	struct kvx_mem_event ev;
	size_t n = 8u << 20;
	uint8_t *dev, *h1, *h2;

	cr_assert_eq(kvx_mem_stream_create(m, NULL, &s), 0);
	cr_assert_eq(kvx_mem_alloc(m, n, (void **)&dev), 0);
	cr_assert_eq(kvx_mem_host_alloc(m, n, (void **)&h1), 0);
	cr_assert_eq(kvx_mem_host_alloc(m, n, (void **)&h2), 0);
	memset(h1, 0x3c, n);
	memset(h2, 0, n);
	cr_assert_eq(kvx_mem_copy_async(s, dev, h1, n, KVX_MEM_H2D, NULL), 0);
	cr_assert_eq(kvx_mem_copy_async(s, h2, dev, n, KVX_MEM_D2H, &ev), 0);
	cr_assert_eq(wait_event(&ev), 1);
	cr_assert_eq(kvx_mem_stream_inflight(s), 0);
	cr_assert_arr_eq(h1, h2, n);
	kvx_mem_host_free(m, h2);
	kvx_mem_host_free(m, h1);
	kvx_mem_free(m, dev);
	kvx_mem_stream_destroy(s);
	kvx_mem_close(m);
}

Test(mem_hip, ptr_query_reports_real_offset_of_sub_buffer)
{
	struct kvx_mem *m = open_hip_or_skip();
	struct kvx_mem_ptr_info info;
	struct kvx_mem_ipc_handle h;
	uint8_t *dev;
	uint8_t host[64];

	cr_assert_eq(kvx_mem_alloc(m, 1u << 20, (void **)&dev), 0);
	cr_assert_eq(kvx_mem_ptr_query(m, dev + 65536 + 100, 4096, &info), 0);
	cr_assert_eq(info.kind, KVX_MEM_HIP);
	cr_assert_eq(info.base, (uintptr_t)dev);
	cr_assert_eq(info.offset, 65536 + 100);
	cr_assert_geq(info.alloc_len, 1u << 20);
	cr_assert_eq(kvx_mem_ptr_query(m, dev + info.alloc_len - 10, 11, &info), -ERANGE);
	cr_assert_eq(kvx_mem_ptr_query(m, host, sizeof(host), &info), -EINVAL, "host pointer");
	cr_assert_eq(kvx_mem_ipc_export(m, dev + 4096, 8192, &h), 0);
	cr_assert_eq(h.kind, KVX_MEM_HIP);
	cr_assert_eq(h.base, (uint64_t)(uintptr_t)dev);
	cr_assert_eq(h.offset, 4096);
	cr_assert_eq(h.len, 8192);
	kvx_mem_free(m, dev);
	kvx_mem_close(m);
}

Test(mem_hip, reg_plan_uses_dmabuf_offset_or_names_what_is_missing)
{
	struct kvx_mem *m = open_hip_or_skip();
	struct kvx_mem_reg_plan plan;
	char why[KVX_MEM_WHY_LEN] = "";
	uint8_t *dev;
	int rc;

	cr_assert_eq(kvx_mem_alloc(m, 1u << 21, (void **)&dev), 0);
	rc = kvx_mem_reg_plan(m, dev + 8192, 4096, &plan, why, sizeof(why));
	if (rc == -ENOTSUP) {
		cr_assert(strstr(why, "cannot register HIP device memory"), "%s", why);
	} else {
		cr_assert_eq(rc, 0, "%s", why);
		if (plan.method == KVX_MEM_REG_DMABUF) {
			cr_assert_geq(plan.dmabuf_fd, 0);
			cr_assert_eq(plan.dmabuf_offset % 4096, 8192 % 4096);
			cr_assert_geq(plan.dmabuf_offset, 8192, "real offset, not 0");
		} else {
			cr_assert_eq(plan.method, KVX_MEM_REG_PEERMEM);
		}
		kvx_mem_reg_plan_fini(&plan);
	}
	kvx_mem_free(m, dev);
	kvx_mem_close(m);
}

Test(mem_hip, staging_ring_moves_device_bytes)
{
	struct kvx_mem *m = open_hip_or_skip();
	struct kvx_mem_stage_params p = {.nbufs = 3, .buf_bytes = 1u << 20};
	struct kvx_mem_stream *s;
	struct kvx_mem_stage *st;
	size_t n = (5u << 20) + 123, got = 0;
	uint8_t *dev, *src, *dst;
	uint64_t deadline = kvx_now_ns() + 20ull * 1000000000ull;

	cr_assert_eq(kvx_mem_stream_create(m, NULL, &s), 0);
	cr_assert_eq(kvx_mem_stage_create(m, s, &p, &st), 0);
	cr_assert_eq(kvx_mem_alloc(m, n, (void **)&dev), 0);
	src = malloc(n);
	dst = malloc(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(i * 5 + (i >> 12));
	cr_assert_eq(kvx_mem_copy_sync(m, dev, src, n, KVX_MEM_H2D), 0);
	cr_assert_eq(kvx_mem_stage_d2h_push(st, dev, n, 9), 0);
	while (got < n && kvx_now_ns() < deadline) {
		struct kvx_mem_chunk c;
		int r = kvx_mem_stage_d2h_poll(st, &c);

		cr_assert_geq(r, 0);
		if (r == 1) {
			memcpy(dst + c.job_off, c.buf, c.len);
			got += c.len;
			cr_assert_eq(kvx_mem_stage_d2h_release(st, &c), 0);
		}
	}
	cr_assert_eq(got, n);
	cr_assert_arr_eq(dst, src, n);
	free(src);
	free(dst);
	kvx_mem_free(m, dev);
	kvx_mem_stage_destroy(st);
	kvx_mem_stream_destroy(s);
	kvx_mem_close(m);
}

/*
 * No GPU: drive the HIP ops table with a context forged for device 0 (kvx_mem_open refuses
 * it). Every HIP call then fails inside the HIP runtime (hipErrorInvalidDevice), and each op
 * must return a negative errno, never crash: this runs the error path of the conversion layer.
 */
TestSuite(mem_hip_nodev, .timeout = 30.0);

Test(mem_hip_nodev, every_op_fails_cleanly_without_a_device)
{
#ifdef KVX_HAVE_HIP
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	struct kvx_mem forged = {.type = {.kind = KVX_MEM_HIP, .device = 0},
				 .ops = &kvx_mem_hip_ops};
	struct kvx_mem_stream_params sp = {.depth = 2};
	struct kvx_mem_stream *s = NULL;
	struct kvx_mem_ptr_info info;
	struct kvx_mem_ipc_handle h;
	struct kvx_mem_event ev;
	uint8_t bytes[KVX_MEM_IPC_HIP_BYTES];
	uint8_t host[64];
	void *p = NULL;
	int probe = kvx_mem_probe(&t, NULL, 0);

	if (probe == 0)
		cr_skip_test("a HIP device is present: the no-device paths are not reachable");
	cr_assert_eq(probe, -ENODEV);
	cr_assert_lt(kvx_mem_alloc(&forged, 4096, &p), 0);
	cr_assert_null(p);
	cr_assert_lt(kvx_mem_host_alloc(&forged, 4096, &p), 0);
	cr_assert_lt(kvx_mem_copy_sync(&forged, host, host + 32, 32, KVX_MEM_D2H), 0);
	cr_assert_lt(kvx_mem_ptr_query(&forged, host, sizeof(host), &info), 0);
	cr_assert_lt(kvx_mem_ipc_export(&forged, host, sizeof(host), &h), 0);
	cr_assert_lt(kvx_mem_stream_create(&forged, &sp, &s), 0);
	cr_assert_null(s);
	memset(bytes, 0, sizeof(bytes));
	cr_assert_lt(kvx_mem_hip_ops.ipc_get(&forged, host, bytes), 0);
	cr_assert_lt(kvx_mem_hip_ops.ipc_open(&forged, bytes, &p), 0);
	cr_assert_lt(kvx_mem_hip_ops.ipc_close(&forged, host), 0);
	/* A producer's event that the runtime cannot query is an error, not "ready". */
	cr_assert_eq(kvx_mem_event_init_hip(&ev, host), 0);
	cr_assert_eq(kvx_mem_event_query(&ev), -EIO);
	/* Freeing through HIP without a device is ignored, not a crash. */
	kvx_mem_hip_ops.free(&forged, host);
	kvx_mem_hip_ops.host_free(&forged, host);
#else
	cr_skip_test("built without HIP (libamdhip64 not found)");
#endif
}
