/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_LAYOUT_H
#define KVX_LAYOUT_H
/**
 * @file
 * KV-cache layout geometry and transfer planning (docs/protocol.md §4).
 *
 * A registered KV layer is described by its tensor (shape and strides in elements, element
 * size) and the engine's KV-cache spec (logical block size, KV heads, head size, MLA or not).
 * kvx_layout_geometry() classifies it (split K/V 5-D in NHD or HND, interleaved 5-D, MLA 3-D,
 * and the kernel-block variants) and derives the byte geometry of §4.2. kvx_plan_offsets()
 * turns paired (local block id, remote block id) lists into (local offset, remote offset, size)
 * triples per §4.3 using the *peer's* num_blocks, and kvx_plan_merge() merges contiguous ranges
 * per §4.4. struct kvx_plan_cache keeps one merged plan per distinct geometry so layers that
 * share a geometry are planned once per transfer (docs/protocol.md §7 T15).
 *
 * Threading: geometry and offset functions are pure and reentrant. A plan cache has one owner
 * thread (the polling lcore that plans a transfer); it is allocated up front and never
 * allocates afterwards, so it can be used on the hot path.
 *
 * Offsets are bytes relative to the base of the region the triple addresses (the K or V plane
 * of a split layer are addressed as one region starting at the K plane; see §4.3: the V entry
 * adds the kv stride).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Maximum tensor rank handled by kvx_layout_geometry(). */
#define KVX_LAYOUT_MAX_DIMS 5
/** Maximum number of distinct geometries kept by one plan cache. */
#define KVX_PLAN_CACHE_MAX 8

/** Layout family of a KV layer (docs/protocol.md §4.2). */
enum kvx_layout_kind {
	KVX_LAYOUT_KIND_MLA = 1,         /**< 3-D `[NB, BS, D]`, one latent per token. */
	KVX_LAYOUT_KIND_SPLIT = 2,       /**< 5-D `[2, NB, a, b, HD]`: separate K and V planes. */
	KVX_LAYOUT_KIND_INTERLEAVED = 3, /**< 5-D `[NB, 2, a, b, HD]`: K and V of a block adjacent. */
};

/** The engine's KV-cache spec for a layer (what the model says, not what the tensor says). */
struct kvx_layout_spec {
	uint32_t block_size;   /**< Logical block size, tokens (> 0). */
	uint32_t num_kv_heads; /**< KV heads per rank, or 0 if unknown (matches any dim). */
	uint32_t head_size;    /**< Head size, elements, or 0 if unknown (matches any dim). */
	bool is_mla;           /**< true for MLA / sliding-window MLA layers (3-D tensors). */
};

/** A layer tensor as registered: shape and strides in elements. */
struct kvx_layout_tensor {
	uint32_t ndim;                             /**< Rank, 1..KVX_LAYOUT_MAX_DIMS. */
	uint64_t shape[KVX_LAYOUT_MAX_DIMS];       /**< Extent per dim, elements. */
	uint64_t stride[KVX_LAYOUT_MAX_DIMS];      /**< Stride per dim, elements. */
	uint32_t elem_size;                        /**< Bytes per element (2 for bf16), > 0. */
};

/** Transfer geometry of one layer (docs/protocol.md §4.2 output fields). */
struct kvx_layout_geom {
	enum kvx_layout_kind kind;     /**< Layout family. */
	uint64_t num_blocks;           /**< Logical blocks in the local tensor. */
	uint32_t block_size;           /**< Logical block size, tokens. */
	uint32_t elem_size;            /**< Bytes per element. */
	uint64_t block_len;            /**< Bytes moved per transfer entry (one K or V block). */
	uint64_t slot_size;            /**< Bytes per token per plane (informative). */
	uint64_t block_stride;         /**< Elements between consecutive logical blocks. */
	uint64_t local_kv_stride;      /**< Elements from K to V locally (0 when has_kv_stride is false). */
	uint64_t remote_kv_stride;     /**< Elements from K to V on the peer (uses the peer's num_blocks). */
	uint64_t remote_num_blocks;    /**< Peer num_blocks used for remote_kv_stride (0: same as local). */
	uint32_t transfers_per_block;  /**< 1 or 2 entries per block pair. */
	uint32_t regions_per_block;    /**< Informative: 2 for split and plain interleaved, else 1. */
	uint32_t kernel_blocks_per_block; /**< Kernel blocks per logical block (1 if none). */
	bool split_kv_regions;         /**< true for the split layout (two registered regions). */
	bool has_kv_stride;            /**< false for MLA and kernel-block interleaved ("none"). */
};

/** One registered memory region of a layer (docs/protocol.md §4.1). */
struct kvx_layout_region {
	uint64_t addr;     /**< Base address (the tensor pointer, plus the V-plane offset). */
	uint64_t len;      /**< Length, bytes. */
};

/**
 * Classify a layer tensor and compute its transfer geometry (docs/protocol.md §4.2).
 *
 * @param spec              KV-cache spec; not NULL.
 * @param t                 Tensor shape/strides; not NULL.
 * @param remote_num_blocks Peer's advertised num_blocks for the split remote kv stride; 0 means
 *                          "same as local" (used before the handshake).
 * @param[out] out          Geometry; not NULL; written only on success.
 * @param[out] err          If non-NULL, receives a NUL-terminated message naming the field and
 *                          the reason on failure (e.g. "Unsupported K/V cache shape [8,4,2,3]").
 * @param errlen            Size of @p err, bytes.
 * @return                  0 on success.
 * @retval -EINVAL  NULL argument, elem_size or block_size 0, rank not 3 (MLA) / 5 (K/V),
 *                  "Unsupported MLA|K/V cache shape", "Ambiguous kernel-block K/V cache shape",
 *                  or kernel blocks that do not divide num_blocks.
 * @par Thread safety  Reentrant.
 * @par Context        Control path (registration); no allocation.
 * @par Source         docs/protocol.md §4.2, vectors T1–T6, T9, T11.
 */
KVX_API int kvx_layout_geometry(const struct kvx_layout_spec *spec, const struct kvx_layout_tensor *t,
				uint64_t remote_num_blocks, struct kvx_layout_geom *out, char *err, size_t errlen);

/**
 * Set the peer's num_blocks on a geometry (recomputes remote_kv_stride for split layouts).
 *
 * @param g                  Geometry from kvx_layout_geometry(); not NULL.
 * @param remote_num_blocks  Peer num_blocks from the handshake; 0 means "same as local".
 * @par Thread safety  One writer per geometry.
 * @par Source         docs/protocol.md §4.2 item 2 (`remote_kv_stride = stride[1]*kbpb*NBr`).
 */
KVX_API void kvx_layout_set_remote_blocks(struct kvx_layout_geom *g, uint64_t remote_num_blocks);

/**
 * Memory regions to register for a layer (docs/protocol.md §4.1, vector T13).
 *
 * Split: 2 regions (K plane at @p base, V plane at base + stride[0]*elem_size), each
 * num_blocks*block_stride*elem_size bytes. Interleaved and MLA: 1 region of
 * num_blocks*block_stride*elem_size bytes.
 *
 * @param g         Geometry; not NULL.
 * @param t         The tensor the geometry came from; not NULL.
 * @param base      Address of the tensor's first element.
 * @param[out] out  Array[2] of regions; not NULL.
 * @return          Number of regions written, 1 or 2.
 * @par Thread safety  Reentrant.
 */
KVX_API int kvx_layout_regions(const struct kvx_layout_geom *g, const struct kvx_layout_tensor *t, uint64_t base,
			       struct kvx_layout_region out[2]);

/**
 * Compute per-block (local, remote, size) byte triples (docs/protocol.md §4.3), not merged.
 *
 * For each pair (lb, rb) in order: K entry (es*lb*block_stride, es*rb*block_stride, block_len);
 * with 2 transfers per block also a V entry (es*(local_kv_stride + lb*block_stride),
 * es*(remote_kv_stride + rb*block_stride), block_len). Interleaved layouts emit K, V per pair;
 * split layouts emit every K entry, then every V entry in the same pair order (the V plane lies
 * above the K plane, so sorted ids give sorted offsets). The set of triples, and therefore the
 * merged result, is the same either way.
 *
 * @param g          Geometry (with the peer's num_blocks set); not NULL.
 * @param local_ids  Array[n_local] of local block ids (< g->num_blocks); NULL only if n_local is 0.
 * @param n_local    Number of local ids.
 * @param remote_ids Array[n_remote] of remote block ids; NULL only if n_remote is 0.
 * @param n_remote   Number of remote ids; must equal @p n_local.
 * @param[out] loc   Array[cap] local offsets, bytes.
 * @param[out] rem   Array[cap] remote offsets, bytes.
 * @param[out] size  Array[cap] sizes, bytes.
 * @param cap        Capacity of the three output arrays, entries (>= n*transfers_per_block).
 * @return           Number of triples written (n*transfers_per_block).
 * @retval -EINVAL   Lengths differ ("must have the same length"), or a local id >= num_blocks.
 * @retval -ENOBUFS  @p cap too small.
 * @par Thread safety  Reentrant. @par Context Hot path: no allocation, no syscall.
 * @par Source         docs/protocol.md §4.3, vectors T1, T12, T14.
 */
KVX_API int kvx_plan_offsets(const struct kvx_layout_geom *g, const uint32_t *local_ids, size_t n_local,
			     const uint32_t *remote_ids, size_t n_remote, uint64_t *loc, uint64_t *rem, uint64_t *size,
			     size_t cap);

/**
 * Merge contiguous (local, remote, size) triples in place (docs/protocol.md §4.4).
 *
 * If @p loc is not non-decreasing the triples are first sorted by local offset with a stable
 * sort (remote and size move with their local). Entry i+1 joins the current run iff it is
 * contiguous on both sides. Duplicates and overlaps are never merged.
 *
 * @param[in,out] loc   Array[n] local offsets, bytes.
 * @param[in,out] rem   Array[n] remote offsets, bytes.
 * @param[in,out] size  Array[n] sizes, bytes.
 * @param n             Entry count (0 allowed).
 * @param scratch       Array[2*n] of uint32_t scratch for the sort; NULL only if n <= 1 or
 *                      the input is already sorted.
 * @return              Number of merged triples, 0..n.
 * @retval -EINVAL      Unsorted input and @p scratch is NULL.
 * @par Thread safety  Reentrant. @par Context Hot path: no allocation.
 * @par Source         docs/protocol.md §4.4, vector T51.
 */
KVX_API int kvx_plan_merge(uint64_t *loc, uint64_t *rem, uint64_t *size, size_t n, uint32_t *scratch);

/**
 * Plan one layer: the merged triples of kvx_plan_offsets() + kvx_plan_merge(), in one pass
 * (docs/protocol.md §4.3-§4.4). The result is identical to those two calls, entry for entry.
 *
 * For one-plane layouts (MLA, kernel-block interleaved) and split layouts whose V plane lies
 * above the whole K plane, the triples are never materialised unmerged: the (local, remote)
 * pairs are ordered by local id (skipped when the ids are already non-decreasing, else a stable
 * LSD radix sort on the bits the largest local id uses) and the offsets of each plane are emitted
 * in that order, merged as they are produced. Other geometries (plain interleaved K/V) take the
 * offsets-then-merge route.
 *
 * @param g          Geometry (with the peer's num_blocks set); not NULL.
 * @param local_ids  Array[n] of local block ids (< g->num_blocks); NULL only if n is 0.
 * @param remote_ids Array[n] of remote block ids; NULL only if n is 0.
 * @param n          Number of block pairs.
 * @param[out] loc   Array[cap] merged local offsets, bytes.
 * @param[out] rem   Array[cap] merged remote offsets, bytes.
 * @param[out] size  Array[cap] merged sizes, bytes.
 * @param cap        Capacity of the three output arrays, entries (>= n*transfers_per_block).
 * @param scratch    Array[2*n] of uint64_t scratch (8-byte aligned); not NULL when n > 1.
 * @return           Number of merged triples, 1..n*transfers_per_block (0 when n is 0).
 * @retval -EINVAL   A local id >= num_blocks, n too large for an int result, or unsorted
 *                   input on the offsets-then-merge route with no scratch.
 * @retval -ENOBUFS  @p cap too small.
 * @par Thread safety  Reentrant. @par Context Hot path: no allocation, no syscall.
 * @par Source         docs/protocol.md §4.3, §4.4; used by kvx_plan_cache_get().
 */
KVX_API int kvx_plan_build(const struct kvx_layout_geom *g, const uint32_t *local_ids, const uint32_t *remote_ids,
			   size_t n, uint64_t *loc, uint64_t *rem, uint64_t *size, size_t cap, uint64_t *scratch);

/**
 * Pair consumer blocks with producer blocks by token position (docs/protocol.md §6 item 8).
 *
 * With @p cached_blocks prefix-cached blocks on the consumer, consumer block i (of the newly
 * allocated list) holds the same tokens as producer block cached_blocks+i. The pair count is
 * min(n_local, n_remote - cached_blocks): a consumer that holds one more block than the
 * producer (first generated token appended) leaves its extra block unpaired.
 *
 * @param n_local         Newly allocated consumer blocks.
 * @param n_remote        Producer blocks (whole prompt).
 * @param cached_blocks   Consumer blocks already cached locally (prefix hit), blocks.
 * @param[out] remote_start Index into the producer list of the first paired block.
 * @return                Number of pairs (0 for a full hit).
 * @par Thread safety  Reentrant.
 */
KVX_API size_t kvx_plan_pair_by_position(size_t n_local, size_t n_remote, size_t cached_blocks,
					 size_t *remote_start);

/**
 * Check that a heterogeneous-TP pair can move whole blocks (docs/protocol.md §4.2, §4.3, §4.5,
 * vector T24).
 *
 * Block transfers between different TP sizes are only valid when every rank's per-rank KV
 * tensor has the same shape on both sides: MLA (the latent is replicated on every rank) or
 * min(tp_local, tp_remote) >= total KV heads (each rank of the smaller side already holds all
 * heads, "replicated KV heads"). Equal TP sizes and MLA always pass, whatever the head count.
 * Call it once per peer when the peer's TP size becomes known (handshake or request params),
 * before planning any transfer with that peer.
 *
 * @param tp_local        Local TP size, > 0.
 * @param tp_remote       Peer TP size, > 0.
 * @param total_kv_heads  The model's total KV heads (unsharded, e.g. 8 for Llama-3.1-70B);
 *                        must be > 0 when the check is not a no-op (non-MLA, different TP).
 * @param mla             true for MLA layers (the check is a no-op).
 * @param[out] err        If non-NULL, receives a NUL-terminated message naming the values on
 *                        failure (e.g. "heterogeneous TP 2 vs 4 needs replicated KV heads:
 *                        min TP 2 < total_kv_heads 4"); untouched on success.
 * @param errlen          Size of @p err, bytes.
 * @return                0 if whole blocks can be transferred between the two TP sizes.
 * @retval -EINVAL        A TP size is 0, or total_kv_heads is 0 while the check applies.
 * @retval -ENOTSUP       min(tp_local, tp_remote) < total_kv_heads ("replicated KV heads").
 * @par Thread safety  Pure, reentrant.
 * @par Context        Control path (handshake / request admission); no allocation.
 * @par Source         docs/protocol.md §4.3 preconditions (L3 heterogeneous-TP validation), §4.5.
 */
KVX_API int kvx_layout_check_hetero_tp(uint32_t tp_local, uint32_t tp_remote, uint32_t total_kv_heads, bool mla,
				       char *err, size_t errlen);

struct kvx_msg_region;
struct kvx_msg_meta;
struct kvx_msg_layers;

/**
 * The handshake regions of one registered layer, in MoRIIO's form (docs/protocol.md §3.1 (a),
 * §4.1, vector T13): what the layer contributes to `kv_caches_base_addr` and `kvx_regions`.
 *
 * Split K/V: 2 regions, the K plane at @p base and the V plane at base + stride[0]*elem_size,
 * each num_blocks*block_stride*elem_size bytes (MoRIIO's `NB*block_len`). Interleaved and MLA:
 * 1 region of num_blocks*block_stride*elem_size bytes. Every region gets @p mr_key: the layer
 * is still registered as ONE memory region covering the whole tensor (its region map (b)
 * entry is one MemoryDesc of the whole tensor, §3.1 (b)), and the V plane lies inside it.
 *
 * @param g         Geometry of the layer (kvx_layout_geometry()); not NULL.
 * @param t         The tensor the geometry came from; not NULL.
 * @param base      Address of the tensor's first element.
 * @param mr_key    Remote access key of the layer's memory region (kvx_xport_mr_key()).
 * @param[out] out  Array[2] of regions (struct kvx_msg_region, include kvxfer/control.h);
 *                  not NULL.
 * @return          Number of regions written, 1 or 2.
 * @retval -EINVAL  NULL argument.
 * @par Thread safety  Reentrant.
 * @par Context        Control path (engine start); no allocation.
 * @par Source         docs/protocol.md §3.1 (a) "split-K/V layouts contribute 2 regions per
 *                     layer", §4.1 advertised base addresses, T13.
 */
KVX_API int kvx_layout_meta_regions(const struct kvx_layout_geom *g, const struct kvx_layout_tensor *t, uint64_t base,
				    uint64_t mr_key, struct kvx_msg_region *out);

/** Where one peer layer's memory is, from its handshake (kvx_layout_peer_regions()). */
struct kvx_layout_peer_layer {
	uint32_t desc;      /**< Index into the region map's descs of the layer's MemoryDesc. */
	uint32_t region;    /**< Index into the metadata regions of the layer's first (K) region. */
	uint32_t nregions;  /**< Regions of the layer: 1 (MLA, interleaved) or 2 (split K, V). */
	uint64_t mr_addr;   /**< MemoryDesc `data`: base of the registered memory, address. */
	uint64_t mr_len;    /**< MemoryDesc `size`, bytes. */
	uint64_t k_addr;    /**< First region (K plane, or the whole layer), address. */
	uint64_t kv_offset; /**< V region address minus K region address, bytes; 0 with 1 region. */
};

/**
 * Assign a peer's advertised regions (metadata (a)) to its layers (region map (b)) and
 * validate MoRIIO's form (docs/protocol.md §3.1, §4.1).
 *
 * Peers must agree on the layers and on the number of regions of each layer (§4.1), so the
 * caller passes its own per-layer counts (what kvx_layout_meta_regions() returns for each
 * local layer: 2 for split K/V, 1 otherwise). Layer j (the j-th run of same-name descs, in map
 * order) owns the next regions_per_layer[j] regions of `kv_caches_base_addr`, in order. Each
 * region must start inside the layer's first MemoryDesc `[data, data+size)`; with 2 regions
 * the V address must be above the K address, and when `kvx_regions` gave lengths each region
 * must end inside the MemoryDesc and the K region must end at or before the V address. Works
 * on a pure MoRIIO peer (no kvx_ keys): only addresses are checked then.
 *
 * @param m                  Decoded metadata (a); not NULL.
 * @param l                  Decoded region map (b); not NULL.
 * @param regions_per_layer  Array[n_layers], each 1 or 2: regions of each local layer.
 * @param n_layers           Local layers; the peer must have as many.
 * @param[out] out           Array[n_layers] of per-layer results; not NULL if n_layers > 0.
 * @param[out] err           If non-NULL, a message naming the layer, region and values on error.
 * @param errlen             Size of @p err, bytes.
 * @return                   n_layers on success.
 * @retval -EINVAL   NULL argument or a regions_per_layer entry not 1 or 2.
 * @retval -EPROTO   The peer has another number of layers, or its region count is not the
 *                   sum of regions_per_layer, or a region lies outside its layer's
 *                   MemoryDesc, or V is not above K / overlaps K.
 * @par Thread safety  Reentrant.
 * @par Context        Control path (handshake); no allocation.
 * @par Source         docs/protocol.md §3.1 (a)/(b), §4.1.
 */
KVX_API int kvx_layout_peer_regions(const struct kvx_msg_meta *m, const struct kvx_msg_layers *l,
				    const uint32_t *regions_per_layer, uint32_t n_layers,
				    struct kvx_layout_peer_layer *out, char *err, size_t errlen);

/**
 * Check that a peer layer's advertised memory matches what the offsets of §4.3 assume for
 * the local layer's geometry: one region for MLA/interleaved, two for split K/V with the V
 * plane exactly es*remote_kv_stride bytes above the K plane (remote_kv_stride uses the peer's
 * num_blocks, kvx_layout_set_remote_blocks()), and every remote offset a plan can produce for
 * the peer's num_blocks inside the peer's MemoryDesc.
 *
 * @param g        Local geometry with the peer's num_blocks set; not NULL.
 * @param pl       The peer layer (kvx_layout_peer_regions()); not NULL.
 * @param[out] err If non-NULL, a message naming the values on error.
 * @param errlen   Size of @p err, bytes.
 * @return         0 if the §4.3 offsets address the peer's K and V planes.
 * @retval -EINVAL NULL argument.
 * @retval -EPROTO Region count, V-plane offset or extent mismatch.
 * @par Thread safety  Reentrant.
 * @par Context        Control path (handshake); no allocation.
 * @par Source         docs/protocol.md §4.2 item 2, §4.3 (remote_kv_stride = NB_remote*block_stride).
 */
KVX_API int kvx_layout_check_peer_layer(const struct kvx_layout_geom *g, const struct kvx_layout_peer_layer *pl,
					char *err, size_t errlen);

/** Opaque per-transfer plan cache (one merged plan per distinct geometry). */
struct kvx_plan_cache;

/** A merged plan: triples owned by the cache, valid until the next reset or destroy. */
struct kvx_plan {
	const uint64_t *loc;  /**< Array[n] local offsets, bytes. */
	const uint64_t *rem;  /**< Array[n] remote offsets, bytes. */
	const uint64_t *size; /**< Array[n] sizes, bytes. */
	size_t n;             /**< Number of merged triples. */
	uint64_t bytes;       /**< Sum of sizes, bytes. */
};

/**
 * Create a plan cache for transfers of up to @p max_blocks block pairs.
 *
 * @param max_blocks  Largest block list a transfer may carry (> 0).
 * @param[out] out    New cache; not NULL.
 * @return            0 on success.
 * @retval -EINVAL    max_blocks is 0 or out is NULL.
 * @retval -ENOMEM    Allocation failed.
 * @par Context  Control path (allocates KVX_PLAN_CACHE_MAX * 2 * max_blocks triples).
 */
KVX_API int kvx_plan_cache_create(size_t max_blocks, struct kvx_plan_cache **out);

/** Destroy a plan cache; NULL is a no-op. */
KVX_API void kvx_plan_cache_destroy(struct kvx_plan_cache *c);

/**
 * Forget every cached plan (call when the block lists change: a new transfer).
 * @param c  Cache; not NULL. @par Context Hot path, O(1).
 */
KVX_API void kvx_plan_cache_reset(struct kvx_plan_cache *c);

/**
 * Get the merged plan of a layer, computing it only if no layer with the same geometry was
 * planned since the last reset (docs/protocol.md §4.3 "cache per geometry", vector T15).
 *
 * @param c          Cache; not NULL.
 * @param g          Layer geometry (peer num_blocks set).
 * @param local_ids  Array[n] local block ids.
 * @param remote_ids Array[n] remote block ids.
 * @param n          Pair count, <= max_blocks of the cache.
 * @param[out] plan  Filled with the cached plan; not NULL.
 * @return           1 if the plan was computed now, 0 if it came from the cache.
 * @retval -ENOBUFS  n > max_blocks, or KVX_PLAN_CACHE_MAX distinct geometries already cached.
 * @retval -EINVAL   As kvx_plan_offsets().
 * @par Thread safety  One owner thread. @par Context Hot path: no allocation.
 */
KVX_API int kvx_plan_cache_get(struct kvx_plan_cache *c, const struct kvx_layout_geom *g, const uint32_t *local_ids,
			       const uint32_t *remote_ids, size_t n, struct kvx_plan *plan);


#ifdef __cplusplus
}
#endif
#endif /* KVX_LAYOUT_H */
