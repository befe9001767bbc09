/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_CMA_H
#define KVX_BENCH_TRACE_CMA_H
/**
 * @file
 * `kvxfer-perf trace --local --peer cma`: the reference the shm main job is measured against
 * (issue 16). After the kvxfer replay, the transfer's initiator role (WRITE: the producer, READ:
 * the consumer) moves the same bytes again with a plain streaming loop of
 * process_vm_writev (WRITE) / process_vm_readv (READ) against the other role's pool:
 *  - the same requests, in the order the role started them, with the block ids each side used
 *    for each of them in the replay (both roles log them: struct trace_cma_log);
 *  - the same block-layer extents: per layer and plane, (local id, remote id) pairs by
 *    position (the last min(n_local, n_remote) ids of each side, as the engine pairs a prefix
 *    hit), consecutive on both sides merged into one range;
 *  - as many iovecs per call as the kernel takes (IOV_MAX); the loop never waits between
 *    requests. Timed from before its first call to after its last; it neither fills nor checks.
 *
 * Wire payloads (driver channel, same build on both ends):
 *  - CMA_INFO (target role -> driver, forwarded unchanged as CMA_RUN to the initiator):
 *    struct trace_cma_info, then uint64_t layer_base[layers], then per logged transfer
 *    struct trace_cma_entry and its ids (uint32_t[n], padded to a multiple of 2 ids).
 *  - CMA_RESULT (initiator -> driver): struct trace_cma_result.
 * Not thread-safe: each role's main thread owns its log.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/** A role's pool as the loop sees it: layer l, plane p, block b at
 *  layer[l] + (p * nb + b) * block_len (bench/trace_role.c block_ptr()). */
struct trace_cma_pool {
	uint32_t layers;        /**< Layers. */
	uint32_t planes;        /**< Planes per layer (2 split K/V, 1 MLA). */
	uint64_t nb;            /**< Blocks per plane (pool size). */
	uint64_t block_len;     /**< Bytes of one block of one plane of one layer. */
	unsigned char **layer;  /**< Array[layers] bases. */
};

/** Header of a CMA_INFO payload. */
struct trace_cma_info {
	int32_t pid;        /**< Target role's pid. */
	uint32_t layers;    /**< Its layers. */
	uint32_t planes;    /**< Its planes. */
	uint32_t pad;
	uint64_t nb;        /**< Its blocks per plane. */
	uint64_t block_len; /**< Its bytes per block-plane-layer. */
	uint64_t entries;   /**< Logged transfers that follow the layer bases. */
};

/** One logged transfer in a CMA_INFO payload; its ids follow. */
struct trace_cma_entry {
	uint64_t idx; /**< Transfer index (trace_msg_req.idx, piece bits included). */
	uint64_t n;   /**< Block ids that follow. */
};

/** CMA_RESULT payload. */
struct trace_cma_result {
	int32_t status;     /**< 0, or negative errno (the first failed call, or a bad CMA_RUN). */
	uint32_t pad;
	uint64_t bytes;     /**< Bytes moved. */
	uint64_t ns;        /**< Wall time of the loop, ns. */
	uint64_t calls;     /**< process_vm_readv/writev calls. */
	uint64_t iovs;      /**< Ranges (iovecs) moved, after merging. */
	uint64_t transfers; /**< Logged transfers replayed. */
	uint64_t missing;   /**< Initiator transfers the target had not logged (not moved). */
};

/** Block ids a role used per transfer, in the order it started them. */
struct trace_cma_log {
	struct trace_cma_entry *e; /**< Array[n]; e[i].n ids at ids + off[i]. */
	uint64_t *off;             /**< Array[n]. */
	uint32_t *ids;             /**< Array[nids]. */
	size_t n, cap;
	size_t nids, capids;
};

/**
 * Log the block ids of transfer @p idx (copied).
 * @retval 0 Logged.  @retval -ENOMEM Out of memory (the log is unchanged).
 */
int trace_cma_log_add(struct trace_cma_log *l, uint64_t idx, const uint32_t *ids, uint64_t n);

/** Free the log's arrays (the struct itself is the caller's); it is empty afterwards. */
void trace_cma_log_free(struct trace_cma_log *l);

/**
 * Build a CMA_INFO payload for this (target) role.
 * @param[out] out  malloc'ed payload (free it); @param[out] len its bytes.
 * @retval 0 Built.  @retval -ENOMEM Out of memory.
 */
int trace_cma_info_pack(const struct trace_cma_log *l, const struct trace_cma_pool *pool, pid_t pid,
			void **out, size_t *len);

/** Called for each block range of trace_cma_each_extent(), in stream order: @p local in this
 *  role's pool, @p remote the other role's address, @p len bytes. Returns 0 or -errno (stops). */
typedef int (*trace_cma_extent_fn)(void *arg, unsigned char *local, uint64_t remote, uint64_t len);

/**
 * Enumerate the block ranges the peer loops move, in the order both roles agree on: the
 * initiator role's transfers in its start order; per transfer, per layer and plane, the
 * (local, remote) block pairs by position (the last min(n_local, n_remote) ids of each side).
 * Either role may call it with the other's CMA_INFO: the initiator (@p initiator) walks its
 * own log, the target the initiator's, so both see the same sequence of lengths.
 * @param info, len  The other role's CMA_INFO payload (checked: sizes, ids inside both pools).
 * @param[in,out] r  r->transfers and r->missing (transfers one side did not log) are added to.
 * @return 0, -EPROTO (malformed info), -EINVAL (ids outside a pool or geometry differs),
 *         -ENOMEM, or what @p fn returned.
 */
int trace_cma_each_extent(const struct trace_cma_log *local, const struct trace_cma_pool *pool, bool initiator,
			  const void *info, size_t len, trace_cma_extent_fn fn, void *arg,
			  struct trace_cma_result *r);

/**
 * Run the loop on the initiator role: for each transfer of @p local (in order), the target's
 * ids of the same idx from @p info, extents as described in the file comment, moved with
 * process_vm_writev (@p write) or process_vm_readv into/out of @p pool. Blocks the caller.
 * @param info, len  A CMA_INFO payload (checked: sizes, ids inside both pools).
 * @param[out] r     Counters; r->status 0, -EPROTO (malformed info), -EINVAL (ids outside a
 *                   pool or geometry differs), or the failed call's -errno (e.g. -EPERM).
 */
void trace_cma_run(const struct trace_cma_log *local, const struct trace_cma_pool *pool, int write,
		   const void *info, size_t len, struct trace_cma_result *r);

#endif
