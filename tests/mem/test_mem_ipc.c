/* SPDX-License-Identifier: Apache-2.0 */
/*
 * IPC handles and the opened-region cache (transport/mem.c) with the host implementation:
 * export, reference counting per allocation, validation of untrusted handles, and a real
 * cross-process CMA read through an exported handle.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/mem.h"

TestSuite(mem_ipc, .timeout = 20.0);

static struct kvx_mem *g_m;
static struct kvx_mem_ipc_cache *g_c;

static void setup(uint32_t cap)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};

	cr_assert_eq(kvx_mem_open(&t, &g_m), 0);
	cr_assert_eq(kvx_mem_ipc_cache_create(g_m, cap, &g_c), 0);
}

static void teardown(void)
{
	kvx_mem_ipc_cache_destroy(g_c);
	kvx_mem_close(g_m);
}

/* A host handle as a peer (pid) would send it for [base + off, base + off + len). */
static struct kvx_mem_ipc_handle handle(uint32_t pid, uint64_t base, uint64_t alloc_len,
					uint64_t off, uint64_t len)
{
	struct kvx_mem_ipc_handle h;

	memset(&h, 0, sizeof(h));
	h.kind = KVX_MEM_HOST;
	h.pid = pid;
	h.base = base;
	h.alloc_len = alloc_len;
	h.offset = off;
	h.len = len;
	return h;
}

Test(mem_ipc, host_export_describes_pid_address_length)
{
	struct kvx_mem_ipc_handle h;
	uint8_t buf[300];

	setup(4);
	cr_assert_eq(kvx_mem_ipc_export(g_m, buf + 10, 200, &h), 0);
	cr_assert_eq(h.kind, KVX_MEM_HOST);
	cr_assert_eq(h.pid, (uint32_t)getpid());
	cr_assert_eq(h.base, (uint64_t)(uintptr_t)(buf + 10));
	cr_assert_eq(h.alloc_len, 200);
	cr_assert_eq(h.offset, 0);
	cr_assert_eq(h.len, 200);
	cr_assert_eq(h.device, 0);
	for (int i = 0; i < KVX_MEM_IPC_HIP_BYTES; i++)
		cr_assert_eq(h.hip[i], 0);
	cr_assert_eq(kvx_mem_ipc_export(g_m, buf, 0, &h), -EINVAL);
	cr_assert_eq(kvx_mem_ipc_export(g_m, NULL, 1, &h), -EINVAL);
	teardown();
}

Test(mem_ipc, same_allocation_opens_once_and_closes_on_last_reference)
{
	struct kvx_mem_ipc_handle a = handle(4242, 0x100000, 1 << 20, 0, 4096);
	struct kvx_mem_ipc_handle b = handle(4242, 0x100000, 1 << 20, 8192, 4096);
	struct kvx_mem_ipc_handle other_pid = handle(4343, 0x100000, 1 << 20, 0, 4096);
	struct kvx_mem_ipc_map ma, mb, mo;
	uint64_t opens, closes;
	uint32_t entries;

	setup(4);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &a, &ma), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &b, &mb), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &other_pid, &mo), 0);
	kvx_mem_ipc_cache_stats(g_c, &entries, &opens, &closes);
	cr_assert_eq(entries, 2);
	cr_assert_eq(opens, 2);
	cr_assert_eq(closes, 0);
	cr_assert_eq(ma.entry, mb.entry, "sub-regions share the allocation's entry");
	cr_assert_neq(ma.entry, mo.entry);
	cr_assert_eq(ma.remote_addr, 0x100000);
	cr_assert_eq(mb.remote_addr, 0x100000 + 8192);
	cr_assert_eq(mb.len, 4096);
	cr_assert_eq(mb.pid, 4242);
	cr_assert_null(mb.ptr, "host regions are reached by CMA, not mapped");
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &ma), 0);
	kvx_mem_ipc_cache_stats(g_c, &entries, NULL, &closes);
	cr_assert_eq(entries, 2);
	cr_assert_eq(closes, 0, "one reference left");
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &mb), 0);
	kvx_mem_ipc_cache_stats(g_c, &entries, NULL, &closes);
	cr_assert_eq(entries, 1);
	cr_assert_eq(closes, 1);
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &mb), -ENOENT, "already closed");
	/* Reopen after close is a fresh open. */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &b, &mb), 0);
	kvx_mem_ipc_cache_stats(g_c, &entries, &opens, NULL);
	cr_assert_eq(entries, 2);
	cr_assert_eq(opens, 3);
	teardown(); /* destroy closes what is left */
}

Test(mem_ipc, malformed_handles_are_einval)
{
	struct kvx_mem_ipc_handle h;
	struct kvx_mem_ipc_map m;
	uint32_t entries;

	setup(4);
	h = handle(0, 0x1000, 4096, 0, 10); /* pid 0 */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 0, 0); /* len 0 */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 4000, 97); /* past the allocation */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, UINT64_MAX, 2); /* offset overflow */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, UINT64_MAX - 10, 4096, 0, 1); /* base + alloc_len overflow */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0, 4096, 0, 1); /* NULL base */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 0, 1);
	h.reserved = 1;
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 0, 1);
	h.hip[5] = 1; /* host handle carrying HIP bytes */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 0, 1);
	h.kind = 7;
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 0, 1);
	h.kind = KVX_MEM_HIP; /* a device handle needs a HIP context */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), -EINVAL);
	h = handle(1, 0x1000, 4096, 4095, 1); /* last byte: fine */
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &m), 0);
	kvx_mem_ipc_cache_stats(g_c, &entries, NULL, NULL);
	cr_assert_eq(entries, 1);
	teardown();
}

Test(mem_ipc, conflicting_allocation_is_eexist_and_full_cache_enobufs)
{
	struct kvx_mem_ipc_handle a = handle(7, 0x2000, 8192, 0, 1);
	struct kvx_mem_ipc_handle a2 = handle(7, 0x2000, 4096, 0, 1);
	struct kvx_mem_ipc_handle b = handle(7, 0x9000, 8192, 0, 1);
	struct kvx_mem_ipc_handle c = handle(8, 0x2000, 8192, 0, 1);
	struct kvx_mem_ipc_map m, forged;

	setup(2);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &a, &m), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &a2, &m), -EEXIST);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &b, &m), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &c, &m), -ENOBUFS);
	forged = m;
	forged.entry = 2;
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &forged), -ENOENT);
	forged = m;
	forged.pid = 99;
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &forged), -ENOENT);
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &m), 0);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &c, &m), 0, "slot reused after close");
	teardown();
}

/*
 * A child process exports a host region and sends the handle over a pipe; the parent opens it
 * through the cache and reads the bytes with process_vm_readv (what the shm provider does).
 */
Test(mem_ipc, host_handle_reads_peer_bytes_with_cma)
{
	int to_parent[2], to_child[2];
	struct kvx_mem_ipc_handle h;
	struct kvx_mem_ipc_map map;
	uint8_t got[5000], expect[5000];
	struct iovec lv, rv;
	char done = 'x';
	pid_t pid;
	int st;

	cr_assert_eq(pipe(to_parent), 0);
	cr_assert_eq(pipe(to_child), 0);
	for (int i = 0; i < 5000; i++)
		expect[i] = (uint8_t)(i * 13 + 1);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
		struct kvx_mem *m;
		uint8_t *region;
		struct kvx_mem_ipc_handle ch;
		char c;

		if (kvx_mem_open(&t, &m) || kvx_mem_alloc(m, 5000, (void **)&region))
			_exit(2);
		memcpy(region, expect, 5000);
		if (kvx_mem_ipc_export(m, region, 5000, &ch))
			_exit(3);
		if (write(to_parent[1], &ch, sizeof(ch)) != (ssize_t)sizeof(ch))
			_exit(4);
		/* Stay alive until the parent has read. */
		if (read(to_child[0], &c, 1) != 1)
			_exit(5);
		_exit(0);
	}
	cr_assert_eq(read(to_parent[0], &h, sizeof(h)), (ssize_t)sizeof(h));
	cr_assert_eq(h.pid, (uint32_t)pid);
	setup(4);
	cr_assert_eq(kvx_mem_ipc_cache_open(g_c, &h, &map), 0);
	lv.iov_base = got;
	lv.iov_len = sizeof(got);
	rv.iov_base = (void *)(uintptr_t)map.remote_addr;
	rv.iov_len = map.len;
	cr_assert_eq(process_vm_readv((pid_t)map.pid, &lv, 1, &rv, 1, 0), 5000,
		     "process_vm_readv: %s", strerror(errno));
	cr_assert_arr_eq(got, expect, 5000);
	cr_assert_eq(kvx_mem_ipc_cache_close(g_c, &map), 0);
	cr_assert_eq(write(to_child[1], &done, 1), 1);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	teardown();
}
