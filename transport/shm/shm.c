/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm provider: READ/WRITE with process_vm_readv/process_vm_writev (cross-memory attach)
 * against the peer's advertised regions (docs/architecture.md §3).
 *
 * Trust model: both engines run on one host (same boot id) as one user (same uid). The
 * target publishes a table of its registered regions in its own memory; the initiator
 * verifies every imported descriptor against that table (key, address, length, access) and
 * then checks every op against the verified descriptor before the syscall. The kernel
 * enforces only ptrace permission, not our regions: a malicious same-user process could
 * write anywhere in the target, which is why shm is limited to same-host, same-user peers.
 * Unregistering a region on the target is seen by initiators at their next import only.
 *
 * Host regions: post checks each op and appends it to the endpoint's pending group; the group
 * moves in one process_vm_readv/writev of up to SHM_IOV_MAX iovecs when poll runs, when the
 * next post has the other opcode, or when it is full. Consecutive posts of small ops (one per
 * post, as a poller posting block by block does) thus share one syscall, and each post still
 * gets its own completion: an op whose bytes did not move fails only its own post's
 * completion (the group is redone op by op to find it). Ops move in post order.
 * A poll that can fill its whole burst with completions already final (posts before the
 * group's first) returns those and leaves the group to grow: an application that polls in
 * bursts smaller than what it keeps in flight (kvxfer-perf bw: 64 of 128) would otherwise
 * move every group at half its size. The group still moves at the first poll whose burst the
 * final completions do not fill, so a pending op waits at most for the application to take
 * the completions posted before it; a group of SHM_HOLD_BYTES or more does not wait (one
 * call's cost, about a microsecond, is already small beside its copy), nor does one at a poll
 * of 0 completions (which only drives I/O).
 *
 * Conditional ops (kvx_xport_post_bulk_cond(), the block leases of docs/protocol.md §5.11):
 * CMA cannot be revoked by the target, so the initiator checks the condition word in the
 * target's memory right before each syscall that moves a conditional group, and publishes
 * that it is inside such a copy in a busy word of its own memory (one per initiator endpoint,
 * in the context's busy array; its address goes to the target in blob A). The target's owner
 * (kvx_xport_ctx_cond_busy()) reads the busy words of every initiator it accepted before it
 * reuses memory whose word it changed. The ordering argument is at cond_enter().
 *
 * Device regions (HIP, or the hostdev mock: the same code, only the kvx_mem ops differ): never
 * touched with CMA. The target exports an IPC handle per device region into its published
 * table; the initiator reads it with the slot at import, verifies it against the descriptor,
 * and opens it in the endpoint's IPC cache (one mapping per peer allocation, reference counted,
 * closed when the endpoint is destroyed). Ops on a device remote region are asynchronous copies
 * (kvx_mem_copy_async: D2H, H2D or D2D) on the endpoint's stream; the batch completes when the
 * last copy's event is ready (copies on a stream finish in order), polled without blocking.
 * Each post with device ops checks the peer's liveness with one 8-byte read of its probe word
 * (an IPC mapping outlives its exporter, CMA does not). A local device region against a host
 * remote region would need CMA on device memory: those ops complete with -ENOTSUP.
 */
#include "transport_internal.h"

#include "mem_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#define SHM_MAX_BATCH 4096u
#define SHM_IOV_MAX 1024u
#define SHM_MAX_OP (1ull << 30)
#define SHM_HOLD_BYTES (1ull << 20) /* a pending group this large moves at the next poll */
#define SHM_RMR_VERIFIED 1u
#define SHM_RMR_DEVICE 2u   /* remote device region: prov_flags >> 8 is its IPC cache entry */
#define SHM_IPC_ENTRIES 256 /* peer device allocations mapped per endpoint */
#define SHM_BUSY_SLOTS 4096u /* initiator endpoints per context (one busy word each) */
#define SHM_WRITERS 1024u    /* initiators (peer busy words) a context tracks */

_Static_assert((int)KVX_XPORT_MEM_HIP == (int)KVX_MEM_HIP &&
		       (int)KVX_XPORT_MEM_HOSTDEV == (int)KVX_MEM_HOSTDEV,
	       "transport and mem kinds share values");

/* One published region slot, read by initiators with process_vm_readv. */
struct shm_slot {
	uint64_t addr;
	uint64_t len;
	uint32_t key;
	uint32_t access;
	struct kvx_mem_ipc_handle ipc; /* device regions: exported handle; zero for host */
};

/* An initiator this context accepted: where its busy word is. Written by the control thread
 * (accept; pid 0 = free, stored last with release), read by any thread (cond_busy). */
struct shm_writer {
	_Atomic uint64_t pid;
	_Atomic uint64_t addr;
};

struct shm_ctx {
	struct kvx_xport_ctx base;
	struct shm_slot *table; /* Array[max_regions] */
	uint16_t *gen;          /* Array[max_regions]: generation per slot */
	/* Busy words of our initiator endpoints (Array[SHM_BUSY_SLOTS], page aligned): word i is
	 * written by the poller of the endpoint holding it, read by peers (process_vm_readv);
	 * busy_used (control thread) says which are held. Lives as long as the context. */
	_Atomic uint64_t *busy;
	uint8_t *busy_used;
	struct shm_writer *writers;  /* Array[SHM_WRITERS] */
	_Atomic uint32_t n_writers;  /* entries in use are below this (control thread grows it) */
	uint64_t magic;         /* probe value read by initiators at connect */
	uint8_t boot_id[16];
	struct kvx_mem *dev;    /* device memory domain (first device region); control thread */
};

struct shm_mr {
	struct kvx_xport_mr base;
	uint32_t slot;
};

struct shm_ep {
	struct kvx_xport_ep base;
	pid_t peer;
	uint64_t table_addr;
	uint32_t table_slots;
	uint32_t cq_mask;
	uint32_t cq_head, cq_tail; /* free-running; head - tail = queued completions */
	uint32_t ops_queued;       /* ops whose completion is not polled yet */
	struct kvx_xport_cpl *cq;  /* Array[cq_mask + 1] */
	struct kvx_mem_event *cq_ev; /* Array[cq_mask + 1]: last copy of a batch (or ready) */
	uint64_t probe_addr;       /* peer's probe word (liveness check of device batches) */
	_Atomic uint64_t *busy;    /* initiator: our busy word (ctx->busy[busy_idx]) */
	uint32_t busy_idx;
	/* Device copies; created at the first device import on the control thread while the
	 * poller may be posting host ops (R1 here, A1 in post). */
	_Atomic(struct kvx_mem_stream *) stream;
	uint32_t stream_depth;          /* copies in flight on it, at most */
	struct kvx_mem_ipc_cache *ipc;  /* peer device allocations opened on this endpoint */
	/* Pending group (host ops posted, not moved yet): iov j is op idx[j] of the post whose
	 * completion is cq[cqi[j] & cq_mask]; all of opcode pend_opc. */
	struct iovec *liov, *riov; /* Array[SHM_IOV_MAX] each */
	uint32_t *idx;             /* Array[SHM_IOV_MAX]: op index of each iov in its post */
	uint32_t *cqi;             /* Array[SHM_IOV_MAX]: completion (free-running) of each iov */
	int32_t *st;               /* Array[SHM_IOV_MAX]: status of each iov of a flushed group */
	uint32_t pend;             /* iovs pending (their bytes are already in their cq[].bytes) */
	uint64_t pend_bytes;       /* their bytes */
	enum kvx_xport_opcode pend_opc;
	bool pend_cond;            /* the group moves only while the peer's word at pend_caddr */
	uint64_t pend_caddr;       /* holds pend_cexp (conditional ops) */
	uint64_t pend_cexp;
};

static int yama_scope(void)
{
	FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (!f)
		return 0; /* no Yama: classic ptrace rules (same uid) */
	int v = 0;
	if (fscanf(f, "%d", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

static int shm_probe(char *reason, size_t cap)
{
	int scope = yama_scope();
	if (scope >= 2) {
		snprintf(reason, cap,
			 "shm: kernel.yama.ptrace_scope=%d forbids process_vm_readv between processes "
			 "(set it to 0 or 1: sysctl -w kernel.yama.ptrace_scope=1)",
			 scope);
		return -EPERM;
	}
	uint64_t src = 0x6b7678, dst = 0;
	struct iovec l = {&dst, sizeof(dst)}, r = {&src, sizeof(src)};
	if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(dst)) {
		int e = errno;
		snprintf(reason, cap, "shm: process_vm_readv not usable here: %s", kvx_strerror(e));
		return e == ENOSYS ? -ENOTSUP : -EPERM;
	}
	return 0;
}

static int shm_open_ctx(const struct kvx_xport_ctx_params *p, struct kvx_xport_ctx **out)
{
	struct shm_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->table = calloc(p->max_regions, sizeof(*c->table));
	c->gen = calloc(p->max_regions, sizeof(*c->gen));
	c->busy = aligned_alloc(4096, SHM_BUSY_SLOTS * sizeof(*c->busy));
	c->busy_used = calloc(SHM_BUSY_SLOTS, 1);
	c->writers = calloc(SHM_WRITERS, sizeof(*c->writers));
	int rc = xport_boot_id(c->boot_id);
	if (!c->table || !c->gen || !c->busy || !c->busy_used || !c->writers || rc) {
		free(c->table);
		free(c->gen);
		free((void *)c->busy);
		free(c->busy_used);
		free(c->writers);
		free(c);
		return rc ? rc : -ENOMEM;
	}
	memset((void *)c->busy, 0, SHM_BUSY_SLOTS * sizeof(*c->busy));
	if (getrandom(&c->magic, sizeof(c->magic), 0) != sizeof(c->magic))
		c->magic = kvx_now_ns() ^ ((uint64_t)getpid() << 32);
	c->magic |= 1; /* never 0, so a zeroed read never matches */
	struct kvx_xport_caps *cp = &c->base.caps;
	cp->max_op_bytes = SHM_MAX_OP;
	cp->max_batch = p->queue_depth < SHM_MAX_BATCH ? p->queue_depth : SHM_MAX_BATCH;
	cp->inline_bytes = 0; /* host data moves at the next poll (or a later post), not in post */
	cp->max_channels = 1;
	cp->num_channels = 1;
	cp->mem_types = kvx_mem_usable_kinds();
	cp->needs_progress = false;
	cp->same_host_only = true;
	cp->cond_ops = true;
	*out = &c->base;
	return 0;
}

static void shm_close(struct kvx_xport_ctx *ctx)
{
	struct shm_ctx *c = (struct shm_ctx *)ctx;
	while (ctx->mrs) {
		struct kvx_xport_mr *mr = ctx->mrs;
		xport_mr_unlink(mr);
		free(mr);
	}
	kvx_mem_close(c->dev);
	free(c->table);
	free(c->gen);
	free((void *)c->busy);
	free(c->busy_used);
	free(c->writers);
	free(c);
}

static int shm_mr_register(struct kvx_xport_ctx *ctx, const struct kvx_xport_mr_params *p,
			   struct kvx_xport_mr **out)
{
	struct shm_ctx *c = (struct shm_ctx *)ctx;
	uint32_t slot = 0;
	while (slot < ctx->params.max_regions && c->table[slot].key)
		slot++;
	if (slot == ctx->params.max_regions)
		return -ENOBUFS;
	struct kvx_mem_ipc_handle ipc;
	memset(&ipc, 0, sizeof(ipc));
	if (p->mem_type != KVX_XPORT_MEM_HOST) {
		/* Device memory: published as an IPC handle (never CMA); the export checks that
		 * [addr, addr + len) is device memory of this type. */
		struct kvx_mem_type t = {.kind = (enum kvx_mem_kind)p->mem_type,
					 .device = p->mem_type == KVX_XPORT_MEM_HIP ? p->device_id : 0};
		int rc = kvx_mem_domain_get(&c->dev, &t, "shm mr_register");
		if (!rc)
			rc = kvx_mem_ipc_export(c->dev, p->addr, p->len_bytes, &ipc);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "shm mr_register: %p (+%llu bytes) is not device memory "
				"of its mem_type %d or cannot be exported: %s", p->addr,
				(unsigned long long)p->len_bytes, (int)p->mem_type, kvx_strerror(rc));
			return rc;
		}
	}
	struct shm_mr *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	/* key = random generation (16 bits, never 0, never the previous one) << 16 | slot: a stale
	 * key never matches a reused slot and keys are not guessable from earlier ones. */
	c->gen[slot] = xport_key_gen(c->gen[slot]);
	m->slot = slot;
	m->base.ctx = ctx;
	m->base.addr = p->addr;
	m->base.len = p->len_bytes;
	m->base.access = p->access;
	m->base.mem_type = p->mem_type;
	m->base.device_id = p->device_id;
	m->base.key = ((uint32_t)c->gen[slot] << 16) | slot;
	c->table[slot] = (struct shm_slot){(uint64_t)(uintptr_t)p->addr, p->len_bytes, m->base.key,
					   p->access, ipc};
	*out = &m->base;
	return 0;
}

static int shm_mr_unregister(struct kvx_xport_mr *mr)
{
	struct shm_ctx *c = (struct shm_ctx *)mr->ctx;
	struct shm_mr *m = (struct shm_mr *)mr;
	memset(&c->table[m->slot], 0, sizeof(c->table[m->slot]));
	free(m);
	return 0;
}

/* Verify an imported descriptor against the target's published table. A mismatch (wrong key,
 * forged length or address) is not an import error: the ops complete with -EACCES, so the
 * failure shows where tcp and verbs show it. */
/* Device state of an initiator endpoint (control path, first device import): the context's
 * device domain, a stream and the IPC cache. */
static int ep_dev_init(struct shm_ep *e, const struct kvx_mem_type *t)
{
	struct shm_ctx *c = (struct shm_ctx *)e->base.ctx;
	int rc = kvx_mem_domain_get(&c->dev, t, "shm import");
	if (rc || atomic_load_explicit(&e->stream, memory_order_relaxed))
		return rc;
	uint32_t depth = c->base.params.queue_depth;
	struct kvx_mem_stream_params sp = {.depth = depth < 4096 ? depth : 4096};
	struct kvx_mem_stream *s = NULL;
	rc = kvx_mem_stream_create(c->dev, &sp, &s);
	if (!rc) {
		rc = kvx_mem_ipc_cache_create(c->dev, SHM_IPC_ENTRIES, &e->ipc);
		if (rc) {
			kvx_mem_stream_destroy(s);
			return rc;
		}
		e->stream_depth = sp.depth;
		/* R1: publishes stream_depth and ipc; pairs with A1 in shm_post(). */
		atomic_store_explicit(&e->stream, s, memory_order_release);
	}
	return rc;
}

/* Open the verified device region's IPC handle; sets the DEVICE flag and the cache entry. */
static int rmr_dev_open(struct shm_ep *e, struct kvx_xport_rmr *r, const struct shm_slot *s)
{
	const struct kvx_mem_ipc_handle *h = &s->ipc;
	if (h->kind != (uint32_t)r->mem_type || h->pid != (uint32_t)e->peer ||
	    h->offset > UINT64_MAX - h->base || h->base + h->offset != r->addr || h->len != r->len) {
		kvx_log(KVX_LOG_WARN, "shm import: device region key 0x%x of pid %d: its IPC handle "
			"does not describe the descriptor (kind/pid/address/length)", r->key,
			(int)e->peer);
		return 0; /* unverified: its ops complete with -EACCES */
	}
	struct kvx_mem_type t = {.kind = (enum kvx_mem_kind)h->kind, .device = h->device};
	int rc = ep_dev_init(e, &t);
	if (rc)
		return rc;
	struct kvx_mem_ipc_map map;
	rc = kvx_mem_ipc_cache_open(e->ipc, h, &map);
	if (rc)
		return rc;
	r->prov_flags = SHM_RMR_VERIFIED | SHM_RMR_DEVICE | (map.entry << 8);
	return 0;
}

static int shm_rmr_check(struct kvx_xport_ep *ep, const struct kvx_xport_rmr *rmr)
{
	struct shm_ep *e = (struct shm_ep *)ep;
	if (rmr->mem_type != KVX_XPORT_MEM_HOST && !(ep->ctx->caps.mem_types & (1u << rmr->mem_type)))
		return -ENOTSUP;
	if (!ep->connected)
		return -ENOTCONN;
	struct kvx_xport_rmr *r = (struct kvx_xport_rmr *)rmr;
	r->prov_flags = 0;
	uint32_t slot = rmr->key & 0xffff;
	if (slot >= e->table_slots)
		return 0;
	struct shm_slot s;
	struct iovec l = {&s, sizeof(s)};
	struct iovec rv = {(void *)(uintptr_t)(e->table_addr + (uint64_t)slot * sizeof(s)), sizeof(s)};
	ssize_t n = process_vm_readv(e->peer, &l, 1, &rv, 1, 0);
	if (n != (ssize_t)sizeof(s))
		return n < 0 && errno == ESRCH ? -ECONNRESET : 0;
	if (s.key != rmr->key || s.addr != rmr->addr || s.len != rmr->len || s.access != rmr->access)
		return 0;
	if (rmr->mem_type != KVX_XPORT_MEM_HOST)
		return rmr_dev_open(e, r, &s);
	if (s.ipc.kind != KVX_MEM_HOST)
		return 0; /* a device region announced as host memory: never CMA it */
	r->prov_flags = SHM_RMR_VERIFIED;
	return 0;
}

#define SHM_A_BYTES (XPORT_BLOB_HDR_BYTES + 32)
#define SHM_B_BYTES (XPORT_BLOB_HDR_BYTES + 56)

static struct shm_ep *ep_alloc(struct kvx_xport_ctx *ctx, bool initiator)
{
	struct shm_ep *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->base.ctx = ctx;
	if (!initiator)
		return e;
	uint32_t depth = ctx->params.queue_depth;
	e->cq_mask = depth - 1;
	e->cq = calloc(depth, sizeof(*e->cq));
	e->cq_ev = calloc(depth, sizeof(*e->cq_ev));
	e->liov = calloc(SHM_IOV_MAX, sizeof(*e->liov));
	e->riov = calloc(SHM_IOV_MAX, sizeof(*e->riov));
	e->idx = calloc(SHM_IOV_MAX, sizeof(*e->idx));
	e->cqi = calloc(SHM_IOV_MAX, sizeof(*e->cqi));
	e->st = calloc(SHM_IOV_MAX, sizeof(*e->st));
	if (!e->cq || !e->cq_ev || !e->liov || !e->riov || !e->idx || !e->cqi || !e->st) {
		free(e->cq);
		free(e->cq_ev);
		free(e->liov);
		free(e->riov);
		free(e->idx);
		free(e->cqi);
		free(e->st);
		free(e);
		return NULL;
	}
	return e;
}

static void shm_ep_destroy(struct kvx_xport_ep *ep)
{
	struct shm_ep *e = (struct shm_ep *)ep;
	if (e->busy) {
		struct shm_ctx *c = (struct shm_ctx *)ep->ctx;
		atomic_store_explicit(e->busy, 0, memory_order_release);
		c->busy_used[e->busy_idx] = 0;
	}
	/* Copies in flight use the peer mappings: finish them before closing the mappings. */
	kvx_mem_stream_destroy(atomic_load_explicit(&e->stream, memory_order_acquire));
	kvx_mem_ipc_cache_destroy(e->ipc);
	free(e->cq);
	free(e->cq_ev);
	free(e->liov);
	free(e->riov);
	free(e->idx);
	free(e->cqi);
	free(e->st);
	free(e);
}

static int shm_ep_create(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, uint8_t *blob,
			 size_t cap, size_t *len)
{
	struct shm_ctx *c = (struct shm_ctx *)ctx;
	if (cap < SHM_A_BYTES)
		return -EMSGSIZE;
	uint32_t bi = 0;
	while (bi < SHM_BUSY_SLOTS && c->busy_used[bi])
		bi++;
	if (bi == SHM_BUSY_SLOTS) {
		kvx_log(KVX_LOG_ERROR, "shm ep_create: %u initiator endpoints in this context already "
			"(one busy word each)", SHM_BUSY_SLOTS);
		return -ENOBUFS;
	}
	struct shm_ep *e = ep_alloc(ctx, true);
	if (!e)
		return -ENOMEM;
	c->busy_used[bi] = 1;
	e->busy_idx = bi;
	e->busy = &c->busy[bi];
	atomic_store_explicit(e->busy, 0, memory_order_relaxed);
	/* Yama scope 1: the target reads our busy word (kvx_xport_ctx_cond_busy()). */
	if (yama_scope() == 1)
		(void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	xport_blob_hdr_put(blob, KVX_XPORT_PROV_SHM, XPORT_BLOB_A);
	xport_put_u32(blob + 8, (uint32_t)getpid());
	xport_put_u32(blob + 12, (uint32_t)getuid());
	memcpy(blob + 16, c->boot_id, 16);
	xport_put_u64(blob + 32, (uint64_t)(uintptr_t)e->busy);
	*len = SHM_A_BYTES;
	*out = &e->base;
	return 0;
}

/* Read one 8-byte word of @p pid's memory: 0, or the status an op completes with. */
static int peer_word(pid_t pid, uint64_t addr, uint64_t *v)
{
	struct iovec l = {v, sizeof(*v)}, r = {(void *)(uintptr_t)addr, sizeof(*v)};
	ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
	if (n == (ssize_t)sizeof(*v))
		return 0;
	return n < 0 ? (errno == ESRCH ? -ECONNRESET : errno == EPERM ? -EACCES : -ERANGE) : -ERANGE;
}

/* Track an accepted initiator's busy word (control thread). Its first read happens here: an
 * initiator whose busy word we cannot read is refused, since we could never tell whether it is
 * inside a conditional copy. Entries of gone processes are reused. */
static int writer_add(struct shm_ctx *c, pid_t pid, uint64_t addr)
{
	uint64_t v;
	int rc = peer_word(pid, addr, &v);
	if (rc == -EACCES) {
		kvx_log(KVX_LOG_ERROR,
			"shm accept: process_vm_readv(pid %d) denied: the target reads each initiator's "
			"busy word, so cross-memory attach must work both ways: same uid, and "
			"kernel.yama.ptrace_scope=0 (sysctl -w kernel.yama.ptrace_scope=0) or 1, or "
			"CAP_SYS_PTRACE", (int)pid);
		return -EPERM;
	}
	if (rc) {
		kvx_log(KVX_LOG_WARN, "shm accept: cannot read the busy word of pid %d at 0x%llx: %s",
			(int)pid, (unsigned long long)addr, kvx_strerror(rc));
		return rc == -ECONNRESET ? -ECONNRESET : -EPROTO;
	}
	uint32_t n = atomic_load_explicit(&c->n_writers, memory_order_relaxed), free_i = SHM_WRITERS;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t p = atomic_load_explicit(&c->writers[i].pid, memory_order_relaxed);
		if (p == (uint64_t)pid && atomic_load_explicit(&c->writers[i].addr, memory_order_relaxed) == addr)
			return 0;
		if (free_i == SHM_WRITERS && (!p || (kill((pid_t)p, 0) && errno == ESRCH)))
			free_i = i;
	}
	if (free_i == SHM_WRITERS) {
		if (n == SHM_WRITERS) {
			kvx_log(KVX_LOG_ERROR, "shm accept: %u live initiators tracked already", SHM_WRITERS);
			return -ENOBUFS;
		}
		free_i = n;
	}
	struct shm_writer *w = &c->writers[free_i];
	atomic_store_explicit(&w->pid, 0, memory_order_relaxed);
	atomic_store_explicit(&w->addr, addr, memory_order_relaxed);
	atomic_store_explicit(&w->pid, (uint64_t)pid, memory_order_release);
	if (free_i == n)
		atomic_store_explicit(&c->n_writers, n + 1, memory_order_release);
	return 0;
}

static int shm_ep_accept(struct kvx_xport_ctx *ctx, const uint8_t *a, size_t alen,
			 struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len)
{
	struct shm_ctx *c = (struct shm_ctx *)ctx;
	int rc = xport_blob_hdr_check(a, alen, SHM_A_BYTES, KVX_XPORT_PROV_SHM, XPORT_BLOB_A,
				      "shm accept");
	if (rc)
		return rc;
	if (cap < SHM_B_BYTES)
		return -EMSGSIZE;
	uint32_t pid = xport_get_u32(a + 8), uid = xport_get_u32(a + 12);
	if (pid == 0 || pid > INT_MAX) {
		kvx_log(KVX_LOG_WARN, "shm accept: bad pid %u in blob A", pid);
		return -EPROTO;
	}
	if (memcmp(a + 16, c->boot_id, 16)) {
		kvx_log(KVX_LOG_WARN, "shm accept: peer pid %u is on another host (boot id differs)", pid);
		return -ENOTSUP;
	}
	if (uid != (uint32_t)getuid()) {
		kvx_log(KVX_LOG_WARN, "shm accept: peer uid %u differs from ours (%u): not allowed", uid,
			(unsigned)getuid());
		return -ENOTSUP;
	}
	/* Yama scope 1 only lets ancestors attach: declare same-user initiators as allowed
	 * ptracers, which is exactly the shm trust model. */
	if (yama_scope() == 1)
		(void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	rc = writer_add(c, (pid_t)pid, xport_get_u64(a + 32));
	if (rc)
		return rc;
	struct shm_ep *e = ep_alloc(ctx, false);
	if (!e)
		return -ENOMEM;
	e->peer = (pid_t)pid;
	xport_blob_hdr_put(blob, KVX_XPORT_PROV_SHM, XPORT_BLOB_B);
	xport_put_u32(blob + 8, (uint32_t)getpid());
	xport_put_u32(blob + 12, (uint32_t)getuid());
	memcpy(blob + 16, c->boot_id, 16);
	xport_put_u64(blob + 32, (uint64_t)(uintptr_t)&c->magic);
	xport_put_u64(blob + 40, c->magic);
	xport_put_u64(blob + 48, (uint64_t)(uintptr_t)c->table);
	xport_put_u32(blob + 56, ctx->params.max_regions);
	xport_put_u32(blob + 60, 0);
	*len = SHM_B_BYTES;
	*out = &e->base;
	return 0;
}

static int shm_ep_connect(struct kvx_xport_ep *ep, const uint8_t *b, size_t blen)
{
	struct shm_ep *e = (struct shm_ep *)ep;
	struct shm_ctx *c = (struct shm_ctx *)ep->ctx;
	int rc = xport_blob_hdr_check(b, blen, SHM_B_BYTES, KVX_XPORT_PROV_SHM, XPORT_BLOB_B,
				      "shm connect");
	if (rc)
		return rc;
	uint32_t pid = xport_get_u32(b + 8);
	if (pid == 0 || pid > INT_MAX || xport_get_u32(b + 60) ||
	    xport_get_u32(b + 56) > 65535) {
		kvx_log(KVX_LOG_WARN, "shm connect: blob B rejected: bad pid %u or table fields", pid);
		return -EPROTO;
	}
	if (memcmp(b + 16, c->boot_id, 16)) {
		kvx_log(KVX_LOG_ERROR, "shm connect: peer pid %u is on another host (boot id differs)",
			pid);
		return -ENOTSUP;
	}
	uint64_t probe = 0;
	struct iovec l = {&probe, sizeof(probe)};
	struct iovec r = {(void *)(uintptr_t)xport_get_u64(b + 32), sizeof(probe)};
	ssize_t n = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
	if (n != (ssize_t)sizeof(probe)) {
		int err = n < 0 ? errno : EIO;
		if (err == EPERM || err == EACCES) {
			kvx_log(KVX_LOG_ERROR,
				"shm connect: process_vm_readv(pid %u) denied (%s): cross-memory attach "
				"needs ptrace permission over the peer: same uid, and "
				"kernel.yama.ptrace_scope=0 (sysctl -w kernel.yama.ptrace_scope=0) or "
				"1 with the peer allowing us, or CAP_SYS_PTRACE",
				pid, kvx_strerror(err));
			return -EPERM;
		}
		kvx_log(KVX_LOG_ERROR, "shm connect: probe read from pid %u failed: %s", pid,
			kvx_strerror(err));
		return err == ESRCH ? -ECONNRESET : -EPROTO;
	}
	if (probe != xport_get_u64(b + 40)) {
		kvx_log(KVX_LOG_ERROR, "shm connect: pid %u is not the peer that sent blob B "
			"(probe mismatch)", pid);
		return -EPROTO;
	}
	e->peer = (pid_t)pid;
	e->probe_addr = xport_get_u64(b + 32);
	e->table_addr = xport_get_u64(b + 48);
	e->table_slots = xport_get_u32(b + 56);
	return 0;
}

/* Check one op; 0 or the status it completes with. */
static int op_check(enum kvx_xport_opcode opc, const struct kvx_xport_op *o)
{
	const struct kvx_xport_mr *l = o->lmr;
	const struct kvx_xport_rmr *r = o->rmr;
	if (o->loff > l->len || o->len > l->len - o->loff)
		return -ERANGE;
	if (!(r->prov_flags & SHM_RMR_VERIFIED))
		return -EACCES;
	if (o->roff > r->len || o->len > r->len - o->roff)
		return -ERANGE;
	if (opc == KVX_XPORT_OP_READ &&
	    (!(r->access & KVX_XPORT_ACCESS_REMOTE_READ) || !(l->access & KVX_XPORT_ACCESS_LOCAL_WRITE)))
		return -EACCES;
	if (opc == KVX_XPORT_OP_WRITE && !(r->access & KVX_XPORT_ACCESS_REMOTE_WRITE))
		return -EACCES;
	return 0;
}

static ssize_t xfer(pid_t pid, enum kvx_xport_opcode opc, struct iovec *l, struct iovec *r,
		    unsigned long n)
{
	return opc == KVX_XPORT_OP_READ ? process_vm_readv(pid, l, n, r, n, 0)
					: process_vm_writev(pid, l, n, r, n, 0);
}

static int errno_status(int err)
{
	if (err == ESRCH)
		return -ECONNRESET;
	if (err == EPERM)
		return -EACCES;
	return -ERANGE; /* EFAULT: remote range not mapped */
}

/* Record that op @p i of completion @p c failed with @p status: the completion's status is
 * that of its lowest-numbered failed op, whichever order the failures were found in. */
static void cpl_fail(struct kvx_xport_cpl *c, uint32_t i, int status)
{
	if (!c->n_failed || i < c->first_failed) {
		c->status = status;
		c->first_failed = i;
	}
	c->n_failed++;
}

/* Run iovs one at a time (after a failed or short group) to find each one's status. */
static void xfer_each(struct shm_ep *e, uint32_t from, uint32_t k)
{
	for (uint32_t j = from; j < k; j++) {
		if (atomic_load_explicit(&e->base.status, memory_order_relaxed)) {
			e->st[j] = -ECONNRESET;
			continue;
		}
		ssize_t n = xfer(e->peer, e->pend_opc, &e->liov[j], &e->riov[j], 1);
		xport_cnt_add(&e->base.cnt, cma_calls, 1);
		if (n == (ssize_t)e->liov[j].iov_len)
			continue;
		e->st[j] = n < 0 ? errno_status(errno) : -ERANGE;
		if (e->st[j] == -ECONNRESET) {
			atomic_store_explicit(&e->base.status, -ECONNRESET, memory_order_relaxed);
			xport_cnt_add(&e->base.cnt, resets, 1);
		}
	}
}

/* Account each iov of a group whose statuses are in st[] to its post's completion (post
 * counted every pending iov's bytes in it: a failed iov takes its bytes back). */
static void account_group(struct shm_ep *e, uint32_t k)
{
	uint64_t ok = 0, bytes = 0;
	for (uint32_t j = 0; j < k; j++) {
		struct kvx_xport_cpl *c = &e->cq[e->cqi[j] & e->cq_mask];
		if (e->st[j]) {
			c->bytes -= e->liov[j].iov_len;
			cpl_fail(c, e->idx[j], e->st[j]);
			continue;
		}
		bytes += e->liov[j].iov_len;
		ok++;
	}
	xport_cnt_add(&e->base.cnt, ops_ok, ok);
	xport_cnt_add(&e->base.cnt, ops_failed, k - ok);
	if (e->pend_opc == KVX_XPORT_OP_READ)
		xport_cnt_add(&e->base.cnt, bytes_read, bytes);
	else
		xport_cnt_add(&e->base.cnt, bytes_written, bytes);
}

/* Move a group of k iovs (total bytes) in one syscall; account each iov. */
static void move_group(struct shm_ep *e, uint32_t k, uint64_t total)
{
	ssize_t n = xfer(e->peer, e->pend_opc, e->liov, e->riov, k);
	xport_cnt_add(&e->base.cnt, cma_calls, 1);
	if (KVX_LIKELY(n >= 0 && (uint64_t)n == total)) {
		/* Each iov's bytes were counted in its completion at post. */
		xport_cnt_add(&e->base.cnt, ops_ok, k);
		if (e->pend_opc == KVX_XPORT_OP_READ)
			xport_cnt_add(&e->base.cnt, bytes_read, total);
		else
			xport_cnt_add(&e->base.cnt, bytes_written, total);
		return;
	}
	memset(e->st, 0, k * sizeof(*e->st));
	if (n < 0 && errno == ESRCH) {
		atomic_store_explicit(&e->base.status, -ECONNRESET, memory_order_relaxed);
		xport_cnt_add(&e->base.cnt, resets, 1);
		for (uint32_t j = 0; j < k; j++)
			e->st[j] = -ECONNRESET;
	} else {
		/* Iovs fully covered by a short count moved; redo the rest one by one. */
		uint32_t j = 0;
		uint64_t done = n > 0 ? (uint64_t)n : 0;
		while (j < k && done >= e->liov[j].iov_len) {
			done -= e->liov[j].iov_len;
			j++;
		}
		xfer_each(e, j, k);
	}
	account_group(e, k);
}

/* Whether the owner's word at @p addr still holds @p expect: 0, -ESTALE, or the status of a
 * failed read. */
static int cond_read(struct shm_ep *e, uint64_t addr, uint64_t expect)
{
	uint64_t v = 0;
	int rc = peer_word(e->peer, addr, &v);
	if (rc == -ECONNRESET) {
		atomic_store_explicit(&e->base.status, -ECONNRESET, memory_order_relaxed);
		xport_cnt_add(&e->base.cnt, resets, 1);
	}
	return rc ? rc : v == expect ? 0 : -ESTALE;
}

#if defined(__SANITIZE_THREAD__)
/* TSan does not model fences (gcc rejects them with -fsanitize=thread). The TSan build, a test
 * build, takes a seq_cst read-modify-write of a word of its own instead (a full barrier on x86);
 * the other side's read is a syscall that TSan does not see either. */
static _Atomic uint64_t shm_tsan_fence;
#define SHM_FENCE() ((void)atomic_fetch_add_explicit(&shm_tsan_fence, 0, memory_order_seq_cst))
#else
#define SHM_FENCE() atomic_thread_fence(memory_order_seq_cst)
#endif

/*
 * Enter a conditional copy: publish the expected word in our busy word, then read the owner's
 * word; 0 means copy (the busy word stays set until the copy returned), else the status every
 * op of the group completes with (nothing moves).
 *
 * Ordering (Dekker): the initiator does   B: busy = W;  F1: seq_cst fence;  R1: read word;
 * the owner (kvx_xport_ctx_cond_busy() caller) does T: word = tombstone;  F2: seq_cst fence;
 * R2: read busy.  R1 and R2 are process_vm_readv calls: the kernel's loads of the other
 * process's page, issued by this thread after its fence in program order, so F1 / F2 order
 * them after B / T as for any load (x86: mfence; arm64: dmb ish, both cover the kernel's
 * accesses of the same thread). With both fences in the single total order of seq_cst
 * fences, R1 misses T and R2 misses B cannot both happen: either the initiator sees the
 * tombstone (the ops fail -ESTALE, nothing moves) or the owner sees the busy word (and waits
 * until the copy returned and the busy word was cleared, with release, after it).
 */
static int cond_enter(struct shm_ep *e)
{
	atomic_store_explicit(e->busy, e->pend_cexp, memory_order_relaxed); /* B */
	SHM_FENCE();                                                        /* F1 */
	return cond_read(e, e->pend_caddr, e->pend_cexp);                   /* R1 */
}

/* Move the pending group in one syscall and account each iov to its post's completion; a
 * conditional group first checks its word (cond_enter()). */
static void flush_group(struct shm_ep *e)
{
	uint32_t k = e->pend;
	if (!k)
		return;
	e->pend = 0;
	uint64_t total = e->pend_bytes;
	e->pend_bytes = 0;
	bool cond = e->pend_cond;
	e->pend_cond = false;
	int cs = cond ? cond_enter(e) : 0;
	if (KVX_LIKELY(!cs)) {
		move_group(e, k, total);
	} else {
		for (uint32_t j = 0; j < k; j++)
			e->st[j] = cs;
		account_group(e, k);
	}
	if (cond)
		atomic_store_explicit(e->busy, 0, memory_order_release); /* after the copy returned */
}

/* Whether a busy word read from a peer says it is copying under @p w. A torn read (the kernel's
 * copy is not promised to be one 8-byte access) shows bytes of w and zeros: busy too. */
static bool busy_match(uint64_t v, uint64_t w)
{
	for (unsigned i = 0; i < 64; i += 8) {
		uint64_t b = (v >> i) & 0xff;
		if (b && b != ((w >> i) & 0xff))
			return false;
	}
	return v != 0;
}

static int shm_cond_busy(struct kvx_xport_ctx *ctx, uint64_t word)
{
	struct shm_ctx *c = (struct shm_ctx *)ctx;
	SHM_FENCE(); /* F2: after the caller's change of the word */
	uint32_t n = atomic_load_explicit(&c->n_writers, memory_order_acquire);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t pid = atomic_load_explicit(&c->writers[i].pid, memory_order_acquire);
		if (!pid)
			continue;
		uint64_t v = 0;
		/* A gone process (or a pid reused by another) holds no copy of ours. */
		if (!peer_word((pid_t)pid, atomic_load_explicit(&c->writers[i].addr, memory_order_relaxed), &v) &&
		    busy_match(v, word))
			return 1;
	}
	return 0;
}

/* Whether the peer still exists: one 8-byte read of its probe word (device batches only). */
static bool peer_alive(struct shm_ep *e)
{
	uint64_t v;
	struct iovec l = {&v, sizeof(v)}, r = {(void *)(uintptr_t)e->probe_addr, sizeof(v)};
	return process_vm_readv(e->peer, &l, 1, &r, 1, 0) == (ssize_t)sizeof(v) || errno != ESRCH;
}

/* Start the asynchronous copy of one op on a device remote region; 0 or the op's status. */
static int dev_op(struct shm_ep *e, enum kvx_xport_opcode opc, const struct kvx_xport_op *o,
		  struct kvx_mem_event *ev)
{
	const struct kvx_xport_mr *l = o->lmr;
	void *rp = NULL;
	struct kvx_mem_stream *s = atomic_load_explicit(&e->stream, memory_order_relaxed);
	int rc = kvx_mem_ipc_cache_ptr(e->ipc, o->rmr->prov_flags >> 8, o->rmr->addr + o->roff,
				       o->len, &rp);
	if (KVX_UNLIKELY(rc))
		return -ERANGE;
	bool ldev = l->mem_type != KVX_XPORT_MEM_HOST;
	if (KVX_UNLIKELY(ldev && l->mem_type != o->rmr->mem_type))
		return -ENOTSUP; /* two device memory types in one op */
	uint8_t *lp = l->addr + o->loff;
	if (opc == KVX_XPORT_OP_READ)
		rc = kvx_mem_copy_async(s, lp, rp, o->len, ldev ? KVX_MEM_D2D : KVX_MEM_D2H, ev);
	else
		rc = kvx_mem_copy_async(s, rp, lp, o->len, ldev ? KVX_MEM_D2D : KVX_MEM_H2D, ev);
	return rc == -ENOBUFS ? -EIO : rc; /* room was checked before the batch started */
}

/* Device ops in a batch (ops on a device remote region). */
static uint32_t count_dev(const struct kvx_xport_op *ops, uint32_t n)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < n; i++)
		k += (ops[i].rmr->prov_flags & SHM_RMR_DEVICE) != 0;
	return k;
}

/* The condition's word must be a verified host region of the peer with REMOTE_READ. */
static int cond_check(const struct kvx_xport_cond *cd)
{
	const struct kvx_xport_rmr *r = cd->rmr;
	if (!(r->prov_flags & SHM_RMR_VERIFIED) || (r->prov_flags & SHM_RMR_DEVICE) ||
	    !(r->access & KVX_XPORT_ACCESS_REMOTE_READ))
		return -EACCES;
	return 0;
}

/* Append @p o (checked) to the pending group: iov j, completion @p ci. */
static inline void pend_add(struct shm_ep *e, const struct kvx_xport_op *o, uint32_t i, uint32_t ci)
{
	uint32_t j = e->pend++;
	e->liov[j].iov_base = o->lmr->addr + o->loff;
	e->liov[j].iov_len = o->len;
	e->riov[j].iov_base = (void *)(uintptr_t)(o->rmr->addr + o->roff);
	e->riov[j].iov_len = o->len;
	e->idx[j] = i;
	e->cqi[j] = ci;
	e->pend_bytes += o->len;
}

static int post_any(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc,
		    const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie,
		    const struct kvx_xport_cond *cd)
{
	struct shm_ep *e = (struct shm_ep *)ep;
	/* A1: pairs with R1 in ep_dev_init(). */
	struct kvx_mem_stream *s = atomic_load_explicit(&e->stream, memory_order_acquire);
	uint32_t ndev = s ? count_dev(ops, n) : 0;
	if (KVX_UNLIKELY(e->cq_head - e->cq_tail > e->cq_mask ||
			 e->ops_queued + n > ep->ctx->params.queue_depth ||
			 (ndev && kvx_mem_stream_inflight(s) + ndev > e->stream_depth))) {
		xport_cnt_add(&ep->cnt, post_nobufs, 1);
		return -ENOBUFS;
	}
	int dead = atomic_load_explicit(&ep->status, memory_order_relaxed);
	if (ndev && !dead && KVX_UNLIKELY(!peer_alive(e))) {
		atomic_store_explicit(&ep->status, -ECONNRESET, memory_order_relaxed);
		xport_cnt_add(&ep->cnt, resets, 1);
		dead = -ECONNRESET;
	}
	struct kvx_mem_event *ev = &e->cq_ev[e->cq_head & e->cq_mask];
	/* A host-only batch is final once its group moved: its event only has to read ready (the
	 * kind is all kvx_mem_event_query() reads of it); device ops record their copy in it. */
	if (ndev)
		kvx_mem_event_init_ready(ev);
	else
		ev->kind = KVX_MEM_EVENT_READY;
	struct kvx_xport_cpl *c = &e->cq[e->cq_head & e->cq_mask];
	*c = (struct kvx_xport_cpl){.cookie = cookie, .n_ops = n, .first_failed = n};
	/* Ops move in post order: a pending group of the other opcode or condition goes first. */
	bool cnd = cd != NULL;
	uint64_t caddr = cnd ? cd->rmr->addr + cd->roff : 0, cexp = cnd ? cd->expect : 0;
	if (e->pend && (e->pend_opc != opc || e->pend_cond != cnd ||
			(cnd && (e->pend_caddr != caddr || e->pend_cexp != cexp))))
		flush_group(e);
	/* The group is empty or has this post's opcode and condition. */
	e->pend_opc = opc;
	e->pend_cond = cnd;
	e->pend_caddr = caddr;
	e->pend_cexp = cexp;
	int cst = cnd ? cond_check(cd) : 0;
	/* Device ops copy asynchronously: their condition is checked once, here (no busy word). */
	int dev_cst = cnd && ndev && !cst && !dead ? cond_read(e, caddr, cexp) : 0;
	uint64_t dev_ok = 0, dev_bytes = 0, bad = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvx_xport_op *o = &ops[i];
		int st = dead ? -ECONNRESET : cst ? cst : op_check(opc, o);
		if (!st && (o->rmr->prov_flags & SHM_RMR_DEVICE)) {
			st = dev_cst ? dev_cst : dev_op(e, opc, o, ev);
			if (!st) {
				c->bytes += o->len;
				dev_ok++;
				dev_bytes += o->len;
				continue;
			}
		} else if (!st && KVX_UNLIKELY(o->lmr->mem_type != KVX_XPORT_MEM_HOST)) {
			st = -ENOTSUP; /* CMA never touches device memory */
		}
		if (st) {
			cpl_fail(c, i, st);
			bad++;
			continue;
		}
		/* One syscall's total stays far below what process_vm_rw moves in one call. */
		if (KVX_UNLIKELY(e->pend == SHM_IOV_MAX || e->pend_bytes + o->len > SHM_MAX_OP)) {
			flush_group(e);
			e->pend_cond = cnd; /* flush_group() cleared it */
		}
		pend_add(e, o, i, e->cq_head);
		c->bytes += o->len; /* taken back by account_group() if it does not move */
	}
	e->cq_head++;
	e->ops_queued += n;
	xport_cnt_add(&ep->cnt, ops_posted, n);
	if (KVX_UNLIKELY(dev_ok | bad)) {
		xport_cnt_add(&ep->cnt, ops_ok, dev_ok);
		xport_cnt_add(&ep->cnt, ops_failed, bad);
		if (opc == KVX_XPORT_OP_READ)
			xport_cnt_add(&ep->cnt, bytes_read, dev_bytes);
		else
			xport_cnt_add(&ep->cnt, bytes_written, dev_bytes);
	}
	return 0;
}

/*
 * One host op that joins the pending group as it is (small ops posted one by one): the work of
 * post_any() for that case and nothing else. Anything else (more ops, device memory, a group to
 * move first, an op that fails its checks, no room, a dead endpoint) goes to post_any().
 */
static int shm_post(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc,
		    const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie)
{
	struct shm_ep *e = (struct shm_ep *)ep;
	const struct kvx_xport_op *o = ops;
	if (KVX_UNLIKELY(n != 1 || e->cq_head - e->cq_tail > e->cq_mask ||
			 e->ops_queued + 1 > ep->ctx->params.queue_depth ||
			 atomic_load_explicit(&ep->status, memory_order_relaxed) ||
			 (e->pend && (e->pend_opc != opc || e->pend_cond)) || e->pend == SHM_IOV_MAX ||
			 e->pend_bytes + o->len > SHM_MAX_OP || (o->rmr->prov_flags & SHM_RMR_DEVICE) ||
			 o->lmr->mem_type != KVX_XPORT_MEM_HOST || op_check(opc, o)))
		return post_any(ep, opc, ops, n, cookie, NULL);
	uint32_t ci = e->cq_head;
	e->cq_ev[ci & e->cq_mask].kind = KVX_MEM_EVENT_READY; /* as post_any(): host only */
	e->cq[ci & e->cq_mask] = (struct kvx_xport_cpl){.cookie = cookie, .n_ops = 1,
							 .first_failed = 1, .bytes = o->len};
	e->pend_opc = opc;
	e->pend_cond = false;
	pend_add(e, o, 0, ci);
	e->cq_head = ci + 1;
	e->ops_queued++;
	xport_cnt_add(&ep->cnt, ops_posted, 1);
	return 0;
}

static int shm_post_cond(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc,
			 const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie,
			 const struct kvx_xport_cond *cond)
{
	return post_any(ep, opc, ops, n, cookie, cond);
}

static int shm_poll(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max)
{
	struct shm_ep *e = (struct shm_ep *)ep;
	uint32_t got = 0;
	/* Completions of posts before the pending group's first are final. When they fill the
	 * burst, the group waits to grow (header); else it moves now, and every queued completion
	 * is final after that. */
	uint32_t end = e->pend ? e->cqi[0] : e->cq_head;
	bool held = max && e->pend && e->pend_bytes < SHM_HOLD_BYTES && end - e->cq_tail >= max;
	if (!held) {
		flush_group(e);
		end = e->cq_head;
	}
	while (got < max && e->cq_tail != end) {
		struct kvx_mem_event *ev = &e->cq_ev[e->cq_tail & e->cq_mask];
		struct kvx_xport_cpl *c = &e->cq[e->cq_tail & e->cq_mask];
		int rc = ev->kind == KVX_MEM_EVENT_READY ? 1 : kvx_mem_event_query(ev);
		if (rc == 0)
			break; /* the batch's device copies are still running: in order */
		if (KVX_UNLIKELY(rc < 0)) {
			/* The stream failed: no byte of this batch is known to have landed. */
			xport_cnt_add(&ep->cnt, ops_ok, 0 - (uint64_t)(c->n_ops - c->n_failed));
			xport_cnt_add(&ep->cnt, ops_failed, c->n_ops - c->n_failed);
			*c = (struct kvx_xport_cpl){.cookie = c->cookie, .status = -EIO,
						    .n_ops = c->n_ops, .n_failed = c->n_ops};
		}
		cpl[got] = *c;
		e->ops_queued -= c->n_ops;
		e->cq_tail++;
		got++;
	}
	if (held && got < max)
		flush_group(e); /* device copies stopped the burst: the group moves meanwhile */
	if (got)
		xport_cnt_add(&ep->cnt, batches_done, got);
	return (int)got;
}

const struct kvx_xport_ops kvx_xport_shm_ops = {
	.name = "shm",
	.id = KVX_XPORT_PROV_SHM,
	.probe = shm_probe,
	.open = shm_open_ctx,
	.close = shm_close,
	.mr_register = shm_mr_register,
	.mr_unregister = shm_mr_unregister,
	.rmr_check = shm_rmr_check,
	.ep_create = shm_ep_create,
	.ep_accept = shm_ep_accept,
	.ep_connect = shm_ep_connect,
	.ep_destroy = shm_ep_destroy,
	.post = shm_post,
	.post_cond = shm_post_cond,
	.cond_busy = shm_cond_busy,
	.poll = shm_poll,
	.progress = kvx_xport_noop_progress,
	.ctx_wait_fd = kvx_xport_enotsup_ctx_wait_fd,
	.ctx_wait = kvx_xport_enotsup_ctx_wait,
	.ep_wait = kvx_xport_enotsup_ep_wait,
	.ep_arm = kvx_xport_enotsup_ep_arm,
	.ep_create_group = kvx_xport_any_group_ep_create,
	.ep_set_group = kvx_xport_record_ep_set_group,
	.ctx_event_fd = kvx_xport_enotsup_ctx_event_fd,
	.ctx_handle_events = kvx_xport_noop_handle_events,
	.ep_reset = kvx_xport_enotsup_ep_reset,
	.ep_reaccept = kvx_xport_enotsup_ep_reaccept,
};
