/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block leases (issue 14, docs/architecture.md §3.1, docs/protocol.md §5.11): the lease
 * directory of the engine that owns the memory, a table of 64-bit words it registers with every
 * transport context (REMOTE_READ) and exports in the connection blob. A served (P READ) or
 * announced (D WRITE) transfer holds one word from kvx_xfer_serve() / kvx_xfer_announce() until
 * it ends (release, write_done, abort, timeout). A READ consumer reads its transfer's window
 * before its first data op and the one word it found again after its last one, and reports DONE
 * only if that word did not change in between; a WRITE producer finds the word before its first
 * write.
 *
 * Word: (lease key & ~0xffff) | generation; 0 = never used; generation 0 = a tombstone (revoked,
 * free for the next grant), so a reader that comes after the revocation fails at once instead of
 * waiting for a grant that will not come. The key hashes the transfer id and the
 * producer's epoch, so a restarted producer (new epoch) never holds a key of its predecessor;
 * the generation (16 bits, never 0, per producer) tells two serves of one id apart. The word of
 * a key lives in the window of LEASE_WIN words starting at key % lease_n (no wrap: the
 * directory has lease_n + LEASE_WIN words), so a reader finds it with one read of the window.
 *
 * Writers: a word goes 0 -> lease by the application thread (CAS, eng_lease_stamp()) and
 * lease -> 0 by the poller that owns the transfer (eng_lease_clear()), before that poller hands
 * the blocks back. Peers only read.
 *
 * WRITE producers post every op under the lease as a conditional op: the tcp target checks the
 * word per op; an shm initiator checks it before each copy and shows the copy in its busy
 * word, which the consumer reads (eng_writers_busy()) before it hands revoked blocks back.
 */
#include "engine_internal.h"

#include <stdlib.h>
#include <string.h>

uint64_t eng_lease_key(const char *tid, uint64_t epoch)
{
	/* FNV-1a over the id, then a 64-bit finaliser (splitmix64) mixed with the epoch. */
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *p = (const unsigned char *)tid; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;
	h ^= epoch + 0x9e3779b97f4a7c15ull;
	h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
	h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
	h ^= h >> 31;
	return h & ~(uint64_t)LEASE_GEN_MASK ? h : h | (1ull << 63); /* key bits never all 0 */
}

uint32_t eng_lease_base(uint64_t key, uint32_t lease_n)
{
	return (uint32_t)((key >> 16) & (lease_n - 1));
}

int eng_lease_stamp(struct kvx_engine *e, uint64_t key, uint32_t *idx)
{
	uint32_t base = eng_lease_base(key, e->lease_n);
	uint16_t g = (uint16_t)(e->lease_gen + 1);
	if (!g)
		g = 1;
	e->lease_gen = g;
	const uint64_t hi = key & ~(uint64_t)LEASE_GEN_MASK, w = hi | g;
	/* A word is free when 0 or a tombstone (generation 0). Taken in this order: the tombstone
	 * of this key (a reader never meets a stale tombstone next to a live grant of the same key),
	 * a never-used word, then another key's tombstone (its late readers then wait for their
	 * deadline instead of failing at once). */
	for (int pass = 0; pass < 3; pass++) {
		for (uint32_t i = 0; i < LEASE_WIN; i++) {
			uint64_t cur = atomic_load_explicit(&e->lease[base + i], memory_order_relaxed);
			if (cur & LEASE_GEN_MASK)
				continue;
			if ((pass == 0 && (!cur || cur != hi)) || (pass == 1 && cur))
				continue;
			/* R1: the grant is visible before the block ids leave this thread (the app hands
			 * them on after kvx_xfer_serve() / kvx_xfer_announce() returns). */
			if (atomic_compare_exchange_strong_explicit(&e->lease[base + i], &cur, w, memory_order_acq_rel,
								    memory_order_relaxed)) {
				*idx = base + i;
				return 0;
			}
		}
	}
	return -ENOBUFS;
}

uint64_t eng_lease_clear(struct kvx_engine *e, uint32_t idx)
{
	/* R2: the revocation (a tombstone: the key, generation 0) is stored before the completion
	 * that hands the blocks back is enqueued (release); a reader that saw any byte written after
	 * that sees it too. Only this poller writes an occupied word. */
	uint64_t w = atomic_load_explicit(&e->lease[idx], memory_order_relaxed);
	atomic_store_explicit(&e->lease[idx], w & ~(uint64_t)LEASE_GEN_MASK, memory_order_release);
	return w;
}

bool eng_writers_busy(struct kvx_engine *e, uint64_t w)
{
	/* shm writers copy without a target thread: the owner's side of their conditional ops
	 * (the fence after the tombstone is kvx_xport_ctx_cond_busy()'s own). */
	for (uint32_t k = 0; k < e->n_xctx; k++)
		if (e->caps[k].cond_ops && kvx_xport_ctx_cond_busy(e->xctx[k], w) > 0)
			return true;
	return false;
}

int eng_lease_find(const uint64_t *win, uint64_t key, uint32_t *pos)
{
	const uint64_t hi = key & ~(uint64_t)LEASE_GEN_MASK;
	bool revoked = false;
	for (uint32_t i = 0; i < LEASE_WIN; i++) {
		if ((win[i] & ~(uint64_t)LEASE_GEN_MASK) != hi)
			continue;
		if (win[i] & LEASE_GEN_MASK) {
			*pos = i;
			return 0;
		}
		revoked = true;
	}
	return revoked ? -ESTALE : -EAGAIN;
}

int eng_lease_init(struct kvx_engine *e)
{
	uint32_t n = 1;
	while (n < 8 * e->p.max_transfers || n < 1024)
		n <<= 1; /* >= 1024: tombstones of small engines last a while */
	e->lease_n = n;
	size_t dir = ((size_t)n + LEASE_WIN) * sizeof(uint64_t);
	size_t buf = (size_t)e->p.max_transfers * LEASE_WIN * sizeof(uint64_t);
	e->lease = aligned_alloc(4096, (dir + 4095) & ~(size_t)4095);
	e->lease_buf = aligned_alloc(4096, (buf + 4095) & ~(size_t)4095);
	if (!e->lease || !e->lease_buf)
		return -ENOMEM;
	memset((void *)e->lease, 0, dir);
	memset(e->lease_buf, 0, buf);
	for (uint32_t k = 0; k < e->n_xctx; k++) {
		struct kvx_xport_mr_params mp = {.addr = (void *)e->lease, .len_bytes = dir,
						 .access = KVX_XPORT_ACCESS_REMOTE_READ,
						 .mem_type = KVX_XPORT_MEM_HOST};
		int rc = kvx_xport_mr_register(e->xctx[k], &mp, &e->lease_mr[k]);
		if (rc)
			return rc;
		mp.addr = e->lease_buf;
		mp.len_bytes = buf;
		mp.access = KVX_XPORT_ACCESS_ALL;
		rc = kvx_xport_mr_register(e->xctx[k], &mp, &e->lease_buf_mr[k]);
		if (rc)
			return rc;
	}
	return 0;
}

void eng_lease_fini(struct kvx_engine *e)
{
	for (uint32_t k = 0; k < 2; k++) {
		if (e->lease_mr[k])
			kvx_xport_mr_unregister(e->lease_mr[k]);
		if (e->lease_buf_mr[k])
			kvx_xport_mr_unregister(e->lease_buf_mr[k]);
		e->lease_mr[k] = e->lease_buf_mr[k] = NULL;
	}
}
