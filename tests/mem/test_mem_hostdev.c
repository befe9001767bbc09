/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hostdev mock of device memory (KVX_MEM_HOSTDEV, transport/mem_host.c): its pointers
 * fault on CPU and CMA access like VRAM would, its bytes move only through kvx_mem copies,
 * and its IPC handles open the exporter's memfd in another process for real.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/mem.h"

TestSuite(mem_hostdev, .timeout = 30.0);

static struct kvx_mem *open_hostdev(void)
{
	struct kvx_mem_type t;
	struct kvx_mem *m = NULL;

	cr_assert_eq(kvx_mem_parse_type("hostdev", &t), 0);
	cr_assert_eq(t.kind, KVX_MEM_HOSTDEV);
	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	return m;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 131u + seed) ^ (i >> 9));
}

Test(mem_hostdev, parse_format_and_probe)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOSTDEV, .device = 0};
	char buf[16], why[KVX_MEM_WHY_LEN] = "";

	cr_assert_str_eq(kvx_mem_type_str(&t, buf, sizeof(buf)), "hostdev");
	cr_assert_eq(kvx_mem_probe(&t, why, sizeof(why)), 0);
	t.device = 1;
	cr_assert_eq(kvx_mem_probe(&t, why, sizeof(why)), -ENODEV);
	cr_assert_str_eq(why, "hostdev (test-only mock) has only device 0, not 1");
	cr_assert_eq(kvx_mem_parse_type("hostdev:0", &t), -EINVAL);
}

Test(mem_hostdev, cpu_access_faults_and_cma_is_refused)
{
	struct kvx_mem *m = open_hostdev();
	uint8_t *d, got[64];
	struct iovec l = {got, sizeof(got)}, r;
	pid_t pid;
	int st;

	cr_assert_eq(kvx_mem_alloc(m, 8192, (void **)&d), 0);
	/* CMA on a device pointer fails like it does on VRAM. */
	r = (struct iovec){d + 100, sizeof(got)};
	errno = 0;
	cr_assert_eq(process_vm_readv(getpid(), &l, 1, &r, 1, 0), -1);
	cr_assert_eq(errno, EFAULT);
	/* A CPU load dies with SIGSEGV (in a child, so the test survives). */
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		/* The default action (ASan would otherwise report the fault and exit 1). */
		signal(SIGSEGV, SIG_DFL);
		volatile uint8_t x = d[5];

		(void)x;
		_exit(0);
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "child status %d", st);
	kvx_mem_free(m, d);
	kvx_mem_close(m);
}

Test(mem_hostdev, copies_move_exact_bytes_and_ptr_query_names_the_allocation)
{
	struct kvx_mem *m = open_hostdev();
	enum { N = 300000 };
	uint8_t *d, *d2, *src = malloc(N), *dst = calloc(1, N), host[16];
	struct kvx_mem_ptr_info info;

	cr_assert_eq(kvx_mem_alloc(m, N, (void **)&d), 0);
	cr_assert_eq(kvx_mem_alloc(m, N, (void **)&d2), 0);
	fill(src, N, 3);
	cr_assert_eq(kvx_mem_copy_sync(m, d, src, N, KVX_MEM_H2D), 0);
	cr_assert_eq(kvx_mem_copy_sync(m, d2 + 7, d + 7, N - 7, KVX_MEM_D2D), 0);
	cr_assert_eq(kvx_mem_copy_sync(m, dst, d2, N, KVX_MEM_D2H), 0);
	cr_assert_eq(memcmp(dst + 7, src + 7, N - 7), 0);
	/* The host side is never translated: a host pointer as the device side is refused. */
	cr_assert_eq(kvx_mem_copy_sync(m, host, src, sizeof(host), KVX_MEM_H2D), -EINVAL);
	cr_assert_eq(kvx_mem_copy_sync(m, dst, d + N - 8, 16, KVX_MEM_D2H), -ERANGE);
	cr_assert_eq(kvx_mem_ptr_query(m, d + 4096, 100, &info), 0);
	cr_assert_eq(info.kind, KVX_MEM_HOSTDEV);
	cr_assert_eq(info.base, (uintptr_t)d);
	cr_assert_eq(info.alloc_len, N);
	cr_assert_eq(info.offset, 4096);
	cr_assert_eq(kvx_mem_ptr_query(m, d + N - 10, 11, &info), -ERANGE);
	cr_assert_eq(kvx_mem_ptr_query(m, src, 10, &info), -EINVAL);
	kvx_mem_free(m, d);
	kvx_mem_free(m, d2);
	/* Freed: the pointer is no longer device memory. */
	cr_assert_eq(kvx_mem_copy_sync(m, dst, d, 8, KVX_MEM_D2H), -EINVAL);
	kvx_mem_close(m);
	free(src);
	free(dst);
}

Test(mem_hostdev, stream_copy_finishes_in_steps)
{
	struct kvx_mem *m = open_hostdev();
	struct kvx_mem_stream_params sp = {.depth = 4, .host_step_bytes = 4096};
	struct kvx_mem_stream *s;
	struct kvx_mem_event ev;
	uint8_t *d, src[10000], dst[10000];
	int polls = 0, rc;

	fill(src, sizeof(src), 9);
	cr_assert_eq(kvx_mem_alloc(m, sizeof(src), (void **)&d), 0);
	cr_assert_eq(kvx_mem_stream_create(m, &sp, &s), 0);
	cr_assert_eq(kvx_mem_copy_async(s, d, src, sizeof(src), KVX_MEM_H2D, NULL), 0);
	cr_assert_eq(kvx_mem_copy_async(s, dst, d, sizeof(src), KVX_MEM_D2H, &ev), 0);
	cr_assert_eq(kvx_mem_copy_async(s, dst, src, 8, KVX_MEM_D2H, NULL), -EINVAL,
		     "a host pointer is not device memory");
	while ((rc = kvx_mem_event_query(&ev)) == 0)
		polls++;
	cr_assert_eq(rc, 1);
	/* 10000 B H2D (3 steps) then 10000 B D2H (3 steps): not ready for the first 5 queries. */
	cr_assert_eq(polls, 5);
	cr_assert_eq(memcmp(dst, src, sizeof(src)), 0);
	kvx_mem_stream_destroy(s);
	kvx_mem_free(m, d);
	kvx_mem_close(m);
}

Test(mem_hostdev, stage_pipelines_more_bytes_than_the_ring_holds)
{
	struct kvx_mem *m = open_hostdev();
	struct kvx_mem_stream_params sp = {.depth = 8, .host_step_bytes = 3000};
	struct kvx_mem_stage_params p = {.nbufs = 2, .buf_bytes = 4096, .jobs = 4};
	struct kvx_mem_stream *s;
	struct kvx_mem_stage *st, *rx;
	enum { N = 50000 };
	uint8_t *src = malloc(N), *out = calloc(1, N), *d, *d2;
	size_t got = 0, landed = 0;
	int held_max = 0, polls = 0;

	fill(src, N, 21);
	cr_assert_eq(kvx_mem_alloc(m, N, (void **)&d), 0);
	cr_assert_eq(kvx_mem_alloc(m, N, (void **)&d2), 0);
	cr_assert_eq(kvx_mem_copy_sync(m, d, src, N, KVX_MEM_H2D), 0);
	cr_assert_eq(kvx_mem_stream_create(m, &sp, &s), 0);
	cr_assert_eq(kvx_mem_stage_create(m, s, &p, &st), 0);
	cr_assert_eq(kvx_mem_stage_create(m, s, &p, &rx), 0);
	/* Send side: 50000 B through two 4 KiB bounce buffers; receive side copies each chunk
	 * back into a second device allocation through its own two buffers. */
	cr_assert_eq(kvx_mem_stage_d2h_push(st, d, N, 1), 0);
	while (landed < N) {
		struct kvx_mem_chunk c, h;
		uint64_t cookie;
		size_t len;
		int r;

		cr_assert_lt(++polls, 100000);
		r = kvx_mem_stage_h2d_poll(rx, &cookie, &len);
		cr_assert_geq(r, 0);
		if (r == 1)
			landed += len;
		if (kvx_mem_stage_h2d_get(rx, &h) != 0)
			continue;
		r = kvx_mem_stage_d2h_poll(st, &c);
		cr_assert_geq(r, 0);
		if (r == 0) {
			cr_assert_eq(kvx_mem_stage_h2d_cancel(rx, &h), 0);
			continue;
		}
		cr_assert_eq(c.job_off, got);
		memcpy(h.buf, c.buf, c.len); /* the "socket" */
		cr_assert_eq(kvx_mem_stage_h2d_commit(rx, &h, d2 + c.job_off, c.len, c.job_off), 0);
		got += c.len;
		cr_assert_eq(kvx_mem_stage_d2h_release(st, &c), 0);
		if (kvx_mem_stream_inflight(s) > (uint32_t)held_max)
			held_max = (int)kvx_mem_stream_inflight(s);
	}
	cr_assert_eq(got, N);
	cr_assert_geq(held_max, 2, "copies overlapped");
	cr_assert_eq(kvx_mem_copy_sync(m, out, d2, N, KVX_MEM_D2H), 0);
	cr_assert_eq(memcmp(out, src, N), 0);
	kvx_mem_stage_destroy(st);
	kvx_mem_stage_destroy(rx);
	kvx_mem_stream_destroy(s);
	kvx_mem_free(m, d);
	kvx_mem_free(m, d2);
	kvx_mem_close(m);
	free(src);
	free(out);
}

Test(mem_hostdev, verbs_registration_plan_refuses_it)
{
	struct kvx_mem *m = open_hostdev();
	struct kvx_mem_reg_plan plan;
	char why[KVX_MEM_WHY_LEN] = "";
	void *d;

	cr_assert_eq(kvx_mem_alloc(m, 4096, &d), 0);
	cr_assert_eq(kvx_mem_reg_plan(m, d, 4096, &plan, why, sizeof(why)), -ENOTSUP);
	cr_assert(strstr(why, "hostdev"), "why: %s", why);
	kvx_mem_free(m, d);
	kvx_mem_close(m);
}

/*
 * Cross-process IPC: a child allocates and fills hostdev memory and exports a handle; the
 * parent opens it through the cache (/proc/PID/fd/N), reads and writes the child's bytes with
 * stream copies, and the child sees the write. Two regions of one allocation share one
 * mapping (reference counted).
 */
Test(mem_hostdev, ipc_handle_maps_the_peer_allocation_refcounted)
{
	int to_parent[2], to_child[2];
	struct kvx_mem_ipc_handle h[2];
	struct kvx_mem_ipc_map map[2];
	uint8_t expect[20000], got[20000], mine[512];
	uint32_t entries;
	uint64_t opens, closes;
	char c = 'w';
	pid_t pid;
	int st;

	fill(expect, sizeof(expect), 5);
	fill(mine, sizeof(mine), 77);
	cr_assert_eq(pipe(to_parent), 0);
	cr_assert_eq(pipe(to_child), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct kvx_mem *m = open_hostdev();
		struct kvx_mem_ipc_handle ch[2];
		uint8_t *d, back[512];

		if (kvx_mem_alloc(m, sizeof(expect), (void **)&d) ||
		    kvx_mem_copy_sync(m, d, expect, sizeof(expect), KVX_MEM_H2D) ||
		    kvx_mem_ipc_export(m, d, 10000, &ch[0]) ||
		    kvx_mem_ipc_export(m, d + 10000, 10000, &ch[1]))
			_exit(2);
		if (write(to_parent[1], ch, sizeof(ch)) != (ssize_t)sizeof(ch))
			_exit(3);
		if (read(to_child[0], &c, 1) != 1)
			_exit(4);
		/* The parent wrote 512 B at offset 10000 + 100 through its mapping. */
		if (kvx_mem_copy_sync(m, back, d + 10100, sizeof(back), KVX_MEM_D2H))
			_exit(5);
		_exit(memcmp(back, mine, sizeof(back)) ? 6 : 0);
	}
	cr_assert_eq(read(to_parent[0], h, sizeof(h)), (ssize_t)sizeof(h));
	cr_assert_eq(h[0].kind, KVX_MEM_HOSTDEV);
	cr_assert_eq(h[0].pid, (uint32_t)pid);
	cr_assert_eq(h[1].offset, 10000);
	cr_assert_eq(h[1].base, h[0].base);

	struct kvx_mem *m = open_hostdev();
	struct kvx_mem_ipc_cache *cache;
	struct kvx_mem_stream *s;
	struct kvx_mem_event ev;
	cr_assert_eq(kvx_mem_ipc_cache_create(m, 4, &cache), 0);
	cr_assert_eq(kvx_mem_stream_create(m, NULL, &s), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(cache, &h[0], &map[0]), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(cache, &h[1], &map[1]), 0);
	kvx_mem_ipc_cache_stats(cache, &entries, &opens, &closes);
	cr_assert_eq(entries, 1);
	cr_assert_eq(opens, 1);
	cr_assert_eq(map[1].ptr, (uint8_t *)map[0].ptr + 10000);
	cr_assert_eq(kvx_mem_copy_async(s, got, map[0].ptr, sizeof(got), KVX_MEM_D2H, NULL), 0);
	cr_assert_eq(kvx_mem_copy_async(s, (uint8_t *)map[1].ptr + 100, mine, sizeof(mine),
					KVX_MEM_H2D, &ev),
		     0);
	while (kvx_mem_event_query(&ev) == 0)
		;
	cr_assert_arr_eq(got, expect, sizeof(got));
	/* A forged inode is refused (same pid and fd, another file). */
	struct kvx_mem_ipc_handle forged = h[0];
	struct kvx_mem_ipc_map fm;
	forged.base += 1u << 30;
	forged.hip[16] ^= 0xff;
	cr_assert_eq(kvx_mem_ipc_cache_open(cache, &forged, &fm), -EIO);
	cr_assert_eq(kvx_mem_ipc_cache_close(cache, &map[0]), 0);
	kvx_mem_ipc_cache_stats(cache, &entries, &opens, &closes);
	cr_assert_eq(entries, 1, "one reference left");
	cr_assert_eq(closes, 0);
	cr_assert_eq(kvx_mem_ipc_cache_close(cache, &map[1]), 0);
	kvx_mem_ipc_cache_stats(cache, &entries, &opens, &closes);
	cr_assert_eq(entries, 0);
	cr_assert_eq(closes, 1);
	cr_assert_eq(kvx_mem_ipc_cache_close(cache, &map[1]), -ENOENT);
	cr_assert_eq(write(to_child[1], &c, 1), 1);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	/* The exporter is gone: opening its handle now fails cleanly. */
	cr_assert_eq(kvx_mem_ipc_cache_open(cache, &h[0], &map[0]), -ECONNRESET);
	kvx_mem_stream_destroy(s);
	kvx_mem_ipc_cache_destroy(cache);
	kvx_mem_close(m);
}
