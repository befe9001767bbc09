/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_INTERNAL_MEM_H
#define KVX_INTERNAL_MEM_H
/**
 * @file
 * @internal
 * Provider internals of kvx_mem (kvxfer/mem.h):
 * - **Staging** (`struct kvx_mem_stage`): a small ring of pinned host bounce buffers per lcore
 *   that overlaps device->bounce copies with the send of earlier buffers (tcp provider), and
 *   bounce->device copies with the receive of later ones.
 * - **IPC** (`struct kvx_mem_ipc_handle`, `struct kvx_mem_ipc_cache`): same-host sharing for
 *   the shm provider: host regions as (pid, address, length) for CMA, device regions as HIP IPC
 *   handles; the cache opens each peer allocation once and reference-counts it.
 * - **Registration plan** (kvx_mem_reg_plan()): how the verbs provider registers a region:
 *   host -> `ibv_reg_mr`; HIP -> `ibv_reg_dmabuf_mr` with the fd and real offset from
 *   `hsa_amd_portable_export_dmabuf` (looked up with dlsym; absent in ROCm 5.2), else
 *   `ibv_reg_mr` on the device pointer when a peer-memory kernel is present, else an error
 *   naming what is missing.
 *
 * Used by transport/, the benchmarks and the tests; not installed, and its functions are not
 * exported by libkvxfer.so (no KVX_API). kvxfer/mem.h includes it in-tree, so
 * `#include "kvxfer/mem.h"` keeps giving the whole module to in-tree code.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Maximum bounce buffers in one staging ring. */
#define KVX_MEM_STAGE_MAX_BUFS 16
/** Default bounce buffers per staging ring. */
#define KVX_MEM_STAGE_DEFAULT_BUFS 4
/** Default bounce buffer size, bytes (1 MiB). */
#define KVX_MEM_STAGE_DEFAULT_BUF_BYTES (1u << 20)

/** Size of the opaque HIP IPC handle bytes (HIP_IPC_HANDLE_SIZE). */
#define KVX_MEM_IPC_HIP_BYTES 64

struct kvx_mem_stage;
struct kvx_mem_ipc_cache;

/** Parameters of a staging ring (kvx_mem_stage_create()); zero fields take the defaults. */
struct kvx_mem_stage_params {
	uint32_t nbufs;   /**< Bounce buffers, 2..KVX_MEM_STAGE_MAX_BUFS; 0 = default (4). */
	size_t buf_bytes; /**< Bytes per bounce buffer, 4 KiB..1 GiB; 0 = default (1 MiB). */
	uint32_t jobs;    /**< D2H jobs queued at once, 1..4096; 0 = 64. */
};

/** One bounce buffer handed to the caller by a staging ring. */
struct kvx_mem_chunk {
	void *buf;        /**< Pinned host bounce buffer. */
	size_t len;       /**< D2H: bytes filled; H2D: capacity (bytes) until committed. */
	uint64_t job_off; /**< D2H: offset of this chunk inside its job, bytes. */
	uint64_t cookie;  /**< Caller's job cookie. */
	uint32_t slot;    /**< Ring slot (used by release/commit/cancel). */
	bool last;        /**< D2H: this is the last chunk of its job. */
};

/**
 * Same-host sharing handle of a region, exported by its owner and sent to a peer on the same
 * host (native byte order; never crosses hosts).
 */
struct kvx_mem_ipc_handle {
	uint32_t kind;        /**< enum kvx_mem_kind. */
	int32_t device;       /**< HIP device of the exporter; 0 for host. */
	uint32_t pid;         /**< Exporter's process id (CMA target for host memory). */
	uint32_t reserved;    /**< Zero. */
	uint64_t base;        /**< Exporter's address of the allocation base. */
	uint64_t alloc_len;   /**< Length of the allocation, bytes. */
	uint64_t offset;      /**< Offset of the region inside the allocation, bytes. */
	uint64_t len;         /**< Length of the region, bytes. */
	uint8_t hip[KVX_MEM_IPC_HIP_BYTES]; /**< hipIpcMemHandle_t of the base (HIP), the memfd
	                                         handle (hostdev); zero for host. */
};
_Static_assert(sizeof(struct kvx_mem_ipc_handle) == 112, "kvx_mem_ipc_handle is a wire struct");

/** An opened peer region (kvx_mem_ipc_cache_open()). */
struct kvx_mem_ipc_map {
	enum kvx_mem_kind kind; /**< Memory kind of the peer region. */
	uint32_t pid;           /**< Peer process id. */
	void *ptr;     /**< HIP/hostdev: local device pointer to the region (mapped base + offset);
	                    host: NULL. */
	uint64_t remote_addr; /**< Peer's address of the region (base + offset): CMA target. */
	uint64_t len;         /**< Region length, bytes. */
	uint32_t entry;       /**< Cache entry (used by kvx_mem_ipc_cache_close()). */
};

/** How the verbs provider must register a region (kvx_mem_reg_plan()). */
enum kvx_mem_reg_method {
	KVX_MEM_REG_HOST = 0,    /**< `ibv_reg_mr(pd, ptr, len)` on host memory. */
	KVX_MEM_REG_DMABUF = 1,  /**< `ibv_reg_dmabuf_mr(pd, dmabuf_offset, len, iova=ptr, fd)`. */
	KVX_MEM_REG_PEERMEM = 2, /**< `ibv_reg_mr` on the device pointer (peer-memory kernel). */
};

/** A registration plan; close it with kvx_mem_reg_plan_fini() after the MR is created. */
struct kvx_mem_reg_plan {
	enum kvx_mem_reg_method method; /**< What to call. */
	int dmabuf_fd;                  /**< DMABUF: exported fd; -1 otherwise. */
	uint64_t dmabuf_offset; /**< DMABUF: offset of ptr inside the dma-buf, bytes (real, not 0). */
};

/* ---------------------------------------------------------------- staging */

/**
 * Create a staging ring of pinned bounce buffers (kvx_mem_host_alloc()) on a stream.
 *
 * One ring serves one direction at a time: use the d2h functions (send side: device ->
 * bounce -> socket) or the h2d functions (receive side: socket -> bounce -> device), not both.
 *
 * @param m         Context of the device memory; not NULL.
 * @param s         Stream of the owning lcore; not NULL; must outlive the stage.
 * @param p         Parameters or NULL for the defaults.
 * @param[out] out  New stage; not NULL.
 * @retval 0        Created.
 * @retval -EINVAL  Parameter out of range.
 * @retval -ENOMEM  Out of memory.
 * @retval -EIO     HIP error.
 * @par Thread safety  Belongs to the stream's owner thread.  @par Context  Slow path.
 */
int kvx_mem_stage_create(struct kvx_mem *m, struct kvx_mem_stream *s,
			 const struct kvx_mem_stage_params *p, struct kvx_mem_stage **out);

/**
 * Destroy a staging ring (waits for copies in flight). NULL is a no-op.
 *
 * @param st  Stage or NULL.
 */
void kvx_mem_stage_destroy(struct kvx_mem_stage *st);

/**
 * Queue a device->host job: @p len bytes at @p src are copied chunk by chunk into bounce
 * buffers and handed out by kvx_mem_stage_d2h_poll() in order.
 *
 * @param st      Stage; not NULL.
 * @param src     Array[len] device bytes; valid until the job's last chunk was handed out.
 * @param len     Bytes, >= 1.
 * @param cookie  Caller's job id, returned in every chunk.
 * @retval 0        Queued.
 * @retval -ENOBUFS Job queue full.
 * @retval -EINVAL  NULL src or len 0.
 * @par Context  Hot path: O(1), no allocation.
 */
int kvx_mem_stage_d2h_push(struct kvx_mem_stage *st, const void *src, size_t len,
			   uint64_t cookie);

/**
 * Advance the device->host pipeline: start copies into free bounce buffers, then hand out the
 * oldest filled one. The caller sends it and calls kvx_mem_stage_d2h_release(); copies into the
 * other buffers continue meanwhile.
 *
 * @param st         Stage; not NULL.
 * @param[out] out   The filled chunk when the result is 1; not NULL.
 * @return           1 a chunk was handed out, 0 nothing ready (also while every buffer is
 *                   held by the caller: release some).
 * @retval -EIO      A copy failed (HIP error); the stage must be destroyed.
 * @par Context  Hot path: no allocation, no blocking.
 */
int kvx_mem_stage_d2h_poll(struct kvx_mem_stage *st, struct kvx_mem_chunk *out);

/**
 * Return a chunk handed out by kvx_mem_stage_d2h_poll() once its bytes were sent.
 *
 * @param st  Stage; not NULL.
 * @param c   The chunk; not NULL.
 * @retval 0        Released; the buffer is reused for the next copy.
 * @retval -EINVAL  c is not a chunk currently held by the caller.
 */
int kvx_mem_stage_d2h_release(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c);

/**
 * Take a free bounce buffer to receive into (host->device side).
 *
 * @param st        Stage; not NULL.
 * @param[out] out  buf and capacity (len) of the free buffer; not NULL.
 * @retval 0        Taken.
 * @retval -ENOBUFS No free buffer (poll kvx_mem_stage_h2d_poll() to retire copies).
 * @par Context  Hot path.
 */
int kvx_mem_stage_h2d_get(struct kvx_mem_stage *st, struct kvx_mem_chunk *out);

/**
 * Start copying a received bounce buffer to device memory.
 *
 * @param st      Stage; not NULL.
 * @param c       Chunk from kvx_mem_stage_h2d_get(); not NULL.
 * @param dst     Array[len] device destination.
 * @param len     Bytes received into the buffer, 1..c->len.
 * @param cookie  Caller's id, returned by kvx_mem_stage_h2d_poll() when this copy finished.
 * @retval 0        Copy started.
 * @retval -EINVAL  Bad chunk, NULL dst or len out of range.
 * @retval -ENOBUFS Stream depth reached (retry after polling).
 * @retval -EIO     HIP error.
 * @par Context  Hot path.
 */
int kvx_mem_stage_h2d_commit(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c,
			     void *dst, size_t len, uint64_t cookie);

/**
 * Give back a buffer from kvx_mem_stage_h2d_get() without copying (receive aborted).
 *
 * @param st  Stage; not NULL.
 * @param c   Chunk; not NULL.
 * @retval 0        Returned.
 * @retval -EINVAL  c is not a buffer held by the caller.
 */
int kvx_mem_stage_h2d_cancel(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c);

/**
 * Retire the oldest host->device copy if it finished, freeing its buffer.
 *
 * @param st           Stage; not NULL.
 * @param[out] cookie  Cookie of the finished copy when the result is 1; not NULL.
 * @param[out] len     Bytes of the finished copy when the result is 1; may be NULL.
 * @return             1 one copy retired, 0 none finished (or none in flight).
 * @retval -EIO        A copy failed.
 * @par Context  Hot path.
 */
int kvx_mem_stage_h2d_poll(struct kvx_mem_stage *st, uint64_t *cookie, size_t *len);

/* ---------------------------------------------------------------- IPC (same host) */

/**
 * Export a region for a peer process on the same host: host -> (pid, address, length) for
 * CMA; HIP -> hipIpcGetMemHandle of the allocation base plus the region's offset; hostdev ->
 * the allocation's memfd (pid, fd number, inode) plus the offset.
 *
 * @param m         Context of the region's memory type; not NULL.
 * @param ptr       Start of the region; not NULL.
 * @param len       Region length, bytes, >= 1.
 * @param[out] out  Handle to send to the peer; not NULL.
 * @retval 0        Exported.
 * @retval -EINVAL  Bad argument or pointer not of the context's type.
 * @retval -ERANGE  Region extends past its allocation.
 * @retval -EIO     HIP error.
 * @par Thread safety  Any thread.  @par Context  Slow path (handshake).
 */
int kvx_mem_ipc_export(struct kvx_mem *m, const void *ptr, size_t len,
		       struct kvx_mem_ipc_handle *out);

/**
 * Create a cache of opened peer regions, keyed by (kind, device, pid, allocation base).
 *
 * @param m         Context used to open HIP handles (its device); not NULL.
 * @param capacity  Distinct allocations, 1..65536.
 * @param[out] out  New cache; not NULL.
 * @retval 0        Created.
 * @retval -EINVAL  capacity out of range.
 * @retval -ENOMEM  Out of memory.
 * @par Thread safety  One thread (the shm provider's control path).
 */
int kvx_mem_ipc_cache_create(struct kvx_mem *m, uint32_t capacity,
			     struct kvx_mem_ipc_cache **out);

/**
 * Destroy a cache, closing every mapping still open. NULL is a no-op.
 *
 * @param c  Cache or NULL.
 */
void kvx_mem_ipc_cache_destroy(struct kvx_mem_ipc_cache *c);

/**
 * Open a peer region. The first open of an allocation opens it (hipIpcOpenMemHandle; hostdev:
 * open `/proc/PID/fd/N`, check the inode, map it; host:
 * validation only); later opens of any region of the same allocation take a reference.
 *
 * Validation: kind, non-zero pid, len >= 1, offset + len <= alloc_len without overflow,
 * base + alloc_len without overflow, reserved zero, a host handle has zero HIP bytes, and a
 * second handle for a known allocation must carry the same alloc_len and HIP bytes.
 *
 * @param c         Cache; not NULL.
 * @param h         Handle from the peer (untrusted); not NULL.
 * @param[out] out  Mapping; not NULL.
 * @retval 0        Opened (or referenced).
 * @retval -EINVAL  Malformed handle (logged naming the field) or memory kind not matching the
 *                  cache's context (a HIP handle needs a HIP context).
 * @retval -EEXIST  Same allocation announced with a different length or HIP handle.
 * @retval -ENOBUFS Cache full.
 * @retval -EIO     hipIpcOpenMemHandle failed (hostdev: the memfd is not the one announced).
 * @retval -ECONNRESET  hostdev: the exporting process or its memfd is gone.
 * @par Context  Slow path.
 */
int kvx_mem_ipc_cache_open(struct kvx_mem_ipc_cache *c,
			   const struct kvx_mem_ipc_handle *h, struct kvx_mem_ipc_map *out);

/**
 * Drop one reference to a mapping; the last one closes it (hipIpcCloseMemHandle).
 *
 * @param c    Cache; not NULL.
 * @param map  Mapping from kvx_mem_ipc_cache_open(); not NULL.
 * @retval 0        Dropped.
 * @retval -ENOENT  No open entry for this mapping.
 * @par Context  Slow path.
 */
int kvx_mem_ipc_cache_close(struct kvx_mem_ipc_cache *c,
			    const struct kvx_mem_ipc_map *map);

/**
 * Cache bookkeeping counters.
 *
 * @param c            Cache; not NULL.
 * @param[out] entries If non-NULL, allocations currently open.
 * @param[out] opens   If non-NULL, underlying opens performed so far.
 * @param[out] closes  If non-NULL, underlying closes performed so far.
 */
void kvx_mem_ipc_cache_stats(const struct kvx_mem_ipc_cache *c, uint32_t *entries,
			     uint64_t *opens, uint64_t *closes);

/* ---------------------------------------------------------------- verbs registration */

/**
 * Decide how the verbs provider registers [ptr, ptr + len) and export a dma-buf if needed.
 *
 * Decision chain (docs/runtime-notes.md §3.9, §0.1 item 1):
 * 1. host memory -> KVX_MEM_REG_HOST (`ibv_reg_mr`).
 * 2. HIP memory and the ROCm at run time exports dma-bufs (`hsa_amd_portable_export_dmabuf`
 *    found with dlsym in libhsa-runtime64.so.1; absent in ROCm 5.2) -> KVX_MEM_REG_DMABUF with
 *    the fd and the region's **real offset inside the exported allocation** (a pooled
 *    sub-buffer registered at offset 0 gives IBV_WC_LOC_PROT_ERR).
 * 3. HIP memory and a peer-memory kernel (`/sys/kernel/mm/memory_peers/<client>` exists) ->
 *    KVX_MEM_REG_PEERMEM (`ibv_reg_mr` on the device pointer).
 * 4. Otherwise -ENOTSUP, with @p why naming both missing pieces.
 *
 * @param m         Context of the region; not NULL.
 * @param ptr       Region start; not NULL.
 * @param len       Region length, bytes, >= 1.
 * @param[out] out  Plan; not NULL. Call kvx_mem_reg_plan_fini() after ibv_reg_*mr returned.
 * @param why       Array[why_len] receiving the reason on failure; may be NULL.
 * @param why_len   Size of why, bytes (KVX_MEM_WHY_LEN suffices).
 * @retval 0        Plan ready.
 * @retval -ENOTSUP Device memory cannot be registered here (see why).
 * @retval -EINVAL  Bad argument / pointer not of the context's type.
 * @retval -ERANGE  Region extends past its allocation.
 * @retval -EIO     The export call failed.
 * @par Thread safety  Any thread.  @par Context  Slow path (registration).
 */
int kvx_mem_reg_plan(struct kvx_mem *m, const void *ptr, size_t len,
		     struct kvx_mem_reg_plan *out, char *why, size_t why_len);

/**
 * kvx_mem_reg_plan() for a memory type instead of an open context: what a provider's region
 * registration calls with the region's (mem_type, device_id). Opens and closes a context
 * internally.
 *
 * @param t         Memory type of the region; not NULL.
 * @param ptr       Region start; not NULL.
 * @param len       Region length, bytes, >= 1.
 * @param[out] out  Plan; not NULL.
 * @param why       Array[why_len] receiving the reason on failure; may be NULL. Without a GPU:
 *                  "no HIP device (hipGetDeviceCount: hipErrorNoDevice)".
 * @param why_len   Size of why, bytes (KVX_MEM_WHY_LEN suffices).
 * @retval 0        Plan ready.
 * @retval -ENODEV  No HIP device (or not that ordinal).
 * @retval -ENOTSUP Built without HIP, or device memory cannot be registered here.
 * @retval -EINVAL  Bad argument.
 * @retval -ERANGE  Region extends past its allocation.
 * @retval -ENOMEM  Out of memory.
 * @retval -EIO     The export call failed.
 * @par Thread safety  Any thread.  @par Context  Slow path (registration).
 */
int kvx_mem_reg_plan_by_type(const struct kvx_mem_type *t, const void *ptr, size_t len,
			     struct kvx_mem_reg_plan *out, char *why, size_t why_len);

/**
 * Release what a plan holds (closes the dma-buf fd; the kernel keeps its own reference once
 * the MR exists). Safe on a plan with no fd.
 *
 * @param plan  Plan; not NULL; its fd is set to -1.
 */
void kvx_mem_reg_plan_fini(struct kvx_mem_reg_plan *plan);

/**
 * Whether the ROCm at run time exports dma-bufs (hsa_amd_portable_export_dmabuf found).
 *
 * @param why      Array[why_len] receiving the reason when false; may be NULL.
 * @param why_len  Size of why, bytes.
 * @return         true if available.
 * @par Thread safety  Any thread (the lookup is done once).
 */
bool kvx_mem_dmabuf_available(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* KVX_INTERNAL_MEM_H */
