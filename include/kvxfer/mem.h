/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_MEM_H
#define KVX_MEM_H
/**
 * @file
 * Memory operations for host and HIP device memory: the layer every provider and the runtime
 * use so that a KV cache in GPU memory is accepted wherever host memory is (DESIGN.md §3,
 * RUNTIME_GUIDE.md §3.9).
 *
 * Pieces, from bottom to top:
 * - **Memory type and context** (`struct kvx_mem_type`, `struct kvx_mem`): `host`,
 *   `hip:<device>` or `hostdev`, parsed from the `--mem` option; a context is opened once per
 *   type on the slow path. Implementations sit behind one internal ops table: host (always
 *   built), HIP (built when libamdhip64 is found; `kvx_mem_has_hip()`) and **hostdev**, a
 *   test-only mock of device memory (see KVX_MEM_HOSTDEV). Only transport/ includes HIP
 *   headers; callers pass HIP handles (`hipEvent_t`) as `void *`.
 * - **Streams** (`struct kvx_mem_stream`): one per polling lcore. Copies device<->host are
 *   asynchronous and in order on the stream; each copy can mark a `struct kvx_mem_event` that
 *   becomes ready when the copy (and every earlier one on the stream) finished. The host
 *   implementation performs the copy in steps (`host_step_bytes` per query), so code above it
 *   sees the same not-ready-then-ready sequence as with a GPU.
 * - **Events** (`struct kvx_mem_event`): a small value type the caller embeds (no allocation):
 *   always-ready, a host counter (ready once `*counter >= threshold`), a wrapped `hipEvent_t`,
 *   or a stream copy. kvx_mem_event_query() never blocks.
 *   The engine's producer poller queries a layer's event before posting its WRITEs, so no
 *   host-side synchronize ever runs on the engine thread (PROTOCOL.md §1 WRITE mode).
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
 * Threading: a `struct kvx_mem` context is safe to share between threads for alloc/free, IPC
 * export and pointer queries. A stream, its stream events, a stage and a gate belong to one
 * thread (the polling lcore that created them). Flag events may be completed from any thread.
 *
 * Errors: 0 or a negative errno (include/kvxfer/common.h); -ENODEV means the memory type's
 * device is missing ("no HIP device"), -ENOTSUP that this build or this ROCm lacks the feature.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Maximum bounce buffers in one staging ring. */
#define KVX_MEM_STAGE_MAX_BUFS 16
/** Default bounce buffers per staging ring. */
#define KVX_MEM_STAGE_DEFAULT_BUFS 4
/** Default bounce buffer size, bytes (1 MiB). */
#define KVX_MEM_STAGE_DEFAULT_BUF_BYTES (1u << 20)
/** Default number of copies in flight on one stream. */
#define KVX_MEM_STREAM_DEFAULT_DEPTH 64
/** Default host-implementation copy step, bytes per query (256 KiB). */
#define KVX_MEM_HOST_DEFAULT_STEP_BYTES (256u << 10)
/** Size of the opaque HIP IPC handle bytes (HIP_IPC_HANDLE_SIZE). */
#define KVX_MEM_IPC_HIP_BYTES 64
/** Buffer size that always holds a kvx_mem reason message ("why"), bytes. */
#define KVX_MEM_WHY_LEN 256

/** Kind of memory a pointer refers to. */
enum kvx_mem_kind {
	KVX_MEM_HOST = 0, /**< Host memory (malloc, mmap, hugepages). */
	KVX_MEM_HIP = 1,  /**< HIP device memory (hipMalloc) on one device. */
	/**
	 * Host-emulated device memory, **test-only mock** (`--mem hostdev`): lets every path that
	 * handles device memory run on a machine without a GPU, through exactly the code that
	 * HIP memory takes (only the internal ops table differs). An allocation is a memfd mapped
	 * twice: the pointer handed out is a `PROT_NONE` view, so a CPU load/store or a
	 * process_vm_readv/writev on it faults like a CPU access to VRAM would; its bytes are
	 * reachable only through kvx_mem copies (a private read/write view of the same memfd).
	 * IPC export carries (pid, memfd number, inode); the importer opens `/proc/PID/fd/N` and
	 * maps it, so the mapping really is shared across processes (same user, same host).
	 * Never use it to hold real data: it is slower than host memory and exists for tests and
	 * `kvxfer-perf --mem hostdev` only.
	 */
	KVX_MEM_HOSTDEV = 2,
};

/** A memory type: what `--mem host|hip[:DEVICE]` selects. */
struct kvx_mem_type {
	enum kvx_mem_kind kind; /**< Host or HIP. */
	int device;             /**< HIP device ordinal, 0..count-1; 0 for host. */
};

/** Direction of an asynchronous copy (picks hipMemcpyDeviceToHost etc.). */
enum kvx_mem_copy_dir {
	KVX_MEM_D2H = 0, /**< Device (or the context's memory) to host. */
	KVX_MEM_H2D = 1, /**< Host to device. */
	KVX_MEM_D2D = 2, /**< Device to device (same host, e.g. into a peer's IPC mapping). */
};

/** Kinds of `struct kvx_mem_event`. */
enum kvx_mem_event_kind {
	KVX_MEM_EVENT_READY = 0,  /**< Always ready (a zero-initialised event). */
	KVX_MEM_EVENT_FLAG = 1,   /**< Ready once `*counter >= threshold` (acquire load). */
	KVX_MEM_EVENT_HIP = 2,    /**< A producer's hipEvent_t, polled with hipEventQuery. */
	KVX_MEM_EVENT_STREAM = 3, /**< Completion of one copy on a kvx_mem stream. */
};

struct kvx_mem;
struct kvx_mem_stream;
struct kvx_mem_stage;
struct kvx_mem_ipc_cache;

/**
 * A readiness event, embedded by value in the caller's descriptors (no allocation).
 *
 * The body is public only so that transfer descriptors can hold events by value; set it with
 * the kvx_mem_event_init_*() functions or kvx_mem_copy_async(), never field by field. A
 * zero-initialised event is always ready.
 */
struct kvx_mem_event {
	uint32_t kind; /**< enum kvx_mem_event_kind. */
	uint32_t pad;  /**< Zero. */
	union {
		const _Atomic uint64_t *counter; /**< FLAG: the producer's counter. */
		void *hip_event;                 /**< HIP: the producer's hipEvent_t. */
		struct kvx_mem_stream *stream;   /**< STREAM: the stream the copy runs on. */
	} u;            /**< Source of readiness, by kind. */
	uint64_t value; /**< FLAG: threshold; STREAM: copy sequence number. */
};
_Static_assert(sizeof(struct kvx_mem_event) == 24, "kvx_mem_event is embedded in descriptors");

/** Parameters of a stream (kvx_mem_stream_create()); zero fields take the defaults. */
struct kvx_mem_stream_params {
	uint32_t depth;         /**< Copies in flight, 1..4096; 0 = KVX_MEM_STREAM_DEFAULT_DEPTH. */
	size_t host_step_bytes; /**< Host implementation: bytes copied per query step; 0 = default. */
};

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

/** Pointer attributes (kvx_mem_ptr_query()). */
struct kvx_mem_ptr_info {
	enum kvx_mem_kind kind; /**< Memory kind of the pointer. */
	int device;             /**< HIP device ordinal; 0 for host. */
	uintptr_t base;         /**< Base address of the allocation holding the pointer. */
	size_t alloc_len;       /**< Length of that allocation, bytes. */
	size_t offset;          /**< Offset of the pointer inside the allocation, bytes. */
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

/* ---------------------------------------------------------------- types and contexts */

/**
 * Parse a memory type: `host`, `hip` (device 0), `hip:<DEVICE>` (decimal, 0..1023) or
 * `hostdev` (the test-only mock of device memory, KVX_MEM_HOSTDEV; device 0).
 *
 * @param s         NUL-terminated text; not NULL.
 * @param[out] out  Parsed type; not NULL; untouched on error.
 * @retval 0        Parsed.
 * @retval -EINVAL  Anything else (empty, unknown kind, bad or out-of-range device).
 * @par Thread safety  Safe from any thread. Source: issue "--mem host|hip[:DEVICE]".
 */
KVX_API int kvx_mem_parse_type(const char *s, struct kvx_mem_type *out);

/**
 * Format a memory type as kvx_mem_parse_type() accepts it (`host`, `hip:1`, `hostdev`).
 *
 * @param t    Type; not NULL.
 * @param buf  Array[len] receiving a NUL-terminated string (truncated if short).
 * @param len  Size of buf, bytes; 16 always suffices.
 * @return     buf.
 * @par Thread safety  Safe from any thread.
 */
KVX_API const char *kvx_mem_type_str(const struct kvx_mem_type *t, char *buf, size_t len);

/**
 * Whether this build contains the HIP implementation (libamdhip64 was found).
 *
 * @return  true if built with KVX_HAVE_HIP.
 * @par Thread safety  Safe from any thread.
 */
KVX_API bool kvx_mem_has_hip(void);

/**
 * Check that a memory type can be opened here, without opening it.
 *
 * @param t         Type; not NULL.
 * @param why       Array[why_len] receiving the reason on failure (e.g. "no HIP device
 *                  (hipGetDeviceCount: hipErrorNoDevice)"); may be NULL.
 * @param why_len   Size of why, bytes; KVX_MEM_WHY_LEN always suffices.
 * @retval 0        Usable.
 * @retval -ENODEV  No HIP device, or the ordinal is >= the device count.
 * @retval -ENOTSUP Built without HIP.
 * @retval -EINVAL  Bad kind or negative device.
 * @par Thread safety  Safe from any thread.  @par Context  Slow path.
 */
KVX_API int kvx_mem_probe(const struct kvx_mem_type *t, char *why, size_t why_len);

/**
 * Open a memory context for one memory type; logs the reason once on failure.
 *
 * @param t         Type; not NULL.
 * @param[out] out  New context; not NULL.
 * @retval 0        Opened.
 * @retval -ENODEV  "no HIP device" (see kvx_mem_probe()).
 * @retval -ENOTSUP Built without HIP.
 * @retval -EINVAL  Bad type.
 * @retval -ENOMEM  Out of memory.
 * @par Thread safety  Safe from any thread.  @par Context  Slow path (setup).
 */
KVX_API int kvx_mem_open(const struct kvx_mem_type *t, struct kvx_mem **out);

/**
 * Close a memory context. All its streams, stages and allocations must be gone. NULL is a no-op.
 *
 * @param m  Context or NULL.
 * @par Thread safety  Not concurrently with any other use of @p m.
 */
KVX_API void kvx_mem_close(struct kvx_mem *m);

/**
 * The type a context was opened with.
 *
 * @param m  Context; not NULL.
 * @return   Its type.
 */
KVX_API struct kvx_mem_type kvx_mem_get_type(const struct kvx_mem *m);

/**
 * Allocate memory of the context's type (hipMalloc / page-aligned host memory), for tests and
 * kvxfer-perf. Contents are unspecified.
 *
 * @param m         Context; not NULL.
 * @param len       Bytes, 1..2^40.
 * @param[out] out  Pointer to the allocation (page-aligned); not NULL.
 * @retval 0        Allocated.
 * @retval -EINVAL  len out of range.
 * @retval -ENOMEM  Out of (device) memory.
 * @retval -EIO     HIP error other than out-of-memory.
 * @par Thread safety  Safe from any thread.  @par Context  Slow path.
 */
KVX_API int kvx_mem_alloc(struct kvx_mem *m, size_t len, void **out);

/**
 * Free memory from kvx_mem_alloc(). NULL is a no-op.
 *
 * @param m  Context it was allocated from; not NULL.
 * @param p  Pointer or NULL.
 */
KVX_API void kvx_mem_free(struct kvx_mem *m, void *p);

/**
 * Allocate pinned host memory usable as a copy target of the context's device
 * (hipHostMalloc; page-aligned host memory for the host type).
 *
 * @param m         Context; not NULL.
 * @param len       Bytes, 1..2^40.
 * @param[out] out  Pointer; not NULL.
 * @retval 0        Allocated.
 * @retval -EINVAL  len out of range.
 * @retval -ENOMEM  Out of memory.
 * @retval -EIO     Other HIP error.
 * @par Thread safety  Safe from any thread.  @par Context  Slow path.
 */
KVX_API int kvx_mem_host_alloc(struct kvx_mem *m, size_t len, void **out);

/**
 * Free memory from kvx_mem_host_alloc(). NULL is a no-op.
 *
 * @param m  Context it was allocated from; not NULL.
 * @param p  Pointer or NULL.
 */
KVX_API void kvx_mem_host_free(struct kvx_mem *m, void *p);

/**
 * Copy synchronously (slow path: tests, verification, kvxfer-perf fill and check).
 *
 * @param m    Context; not NULL.
 * @param dst  Array[len] destination bytes.
 * @param src  Array[len] source bytes.
 * @param len  Bytes; 0 is a no-op.
 * @param dir  Direction.
 * @retval 0        Copied.
 * @retval -EINVAL  Bad dir or NULL pointer with len > 0.
 * @retval -EIO     HIP error.
 * @par Context  Slow path only: blocks until the copy finished. Never on a polling lcore.
 */
KVX_API int kvx_mem_copy_sync(struct kvx_mem *m, void *dst, const void *src, size_t len,
			      enum kvx_mem_copy_dir dir);

/**
 * Query the allocation holding a pointer (hipPointerGetAttributes + hipMemGetAddressRange).
 * For the host type the allocation is taken to be exactly [ptr, ptr + len).
 *
 * @param m          Context; not NULL.
 * @param ptr        Start of the region; not NULL.
 * @param len        Region length, bytes, >= 1; must lie inside the allocation.
 * @param[out] info  Attributes; not NULL.
 * @retval 0        Filled.
 * @retval -EINVAL  NULL, len 0, or ptr is not device memory of the context's device.
 * @retval -ERANGE  [ptr, ptr + len) extends past the allocation.
 * @retval -EIO     HIP error.
 * @par Thread safety  Safe from any thread.  @par Context  Slow path (registration).
 */
KVX_API int kvx_mem_ptr_query(struct kvx_mem *m, const void *ptr, size_t len,
			      struct kvx_mem_ptr_info *info);

/** A buffer of one memory type, for kvxfer-perf and tests (kvx_mem_buf_init()). */
struct kvx_mem_buf {
	struct kvx_mem *mem;      /**< Context the buffer belongs to (owned by the buffer). */
	void *ptr;                /**< Start of the allocation (device pointer for HIP). */
	size_t len;               /**< Length, bytes. */
	struct kvx_mem_type type; /**< Its memory type. */
};

/**
 * Parse a `--mem` value, open its context and allocate a buffer: what `kvxfer-perf bw|lat|trace
 * --mem host|hip[:DEVICE]` calls. On a machine without a GPU, `hip` fails with -ENODEV and
 * @p why starting with "no HIP device".
 *
 * @param mem_arg   `host`, `hip`, `hip:<DEVICE>` or `hostdev` (test-only mock); not NULL.
 * @param len       Bytes, 1..2^40.
 * @param[out] out  Buffer; not NULL; zeroed on error.
 * @param why       Array[why_len] receiving the reason on failure, naming the option value
 *                  (e.g. "--mem hip:0: no HIP device (hipGetDeviceCount: hipErrorNoDevice)");
 *                  may be NULL.
 * @param why_len   Size of why, bytes (KVX_MEM_WHY_LEN suffices).
 * @retval 0        Allocated; the contents are zero.
 * @retval -EINVAL  Malformed mem_arg or len out of range.
 * @retval -ENODEV  No HIP device (or not that ordinal).
 * @retval -ENOTSUP Built without HIP.
 * @retval -ENOMEM  Out of (device) memory.
 * @retval -EIO     HIP error.
 * @par Thread safety  Any thread.  @par Context  Slow path (setup).
 */
KVX_API int kvx_mem_buf_init(const char *mem_arg, size_t len, struct kvx_mem_buf *out, char *why,
			     size_t why_len);

/**
 * Free a buffer from kvx_mem_buf_init() and close its context; a zeroed buffer is a no-op.
 *
 * @param b  Buffer; not NULL; zeroed on return.
 */
KVX_API void kvx_mem_buf_fini(struct kvx_mem_buf *b);

/* ---------------------------------------------------------------- streams and events */

/**
 * Create a copy stream (hipStreamCreateWithFlags non-blocking + a pool of `depth` events).
 *
 * @param m         Context; not NULL.
 * @param p         Parameters or NULL for the defaults.
 * @param[out] out  New stream; not NULL.
 * @retval 0        Created.
 * @retval -EINVAL  Parameter out of range.
 * @retval -ENOMEM  Out of memory.
 * @retval -EIO     HIP error.
 * @par Thread safety  The stream then belongs to the calling thread (its polling lcore).
 * @par Context  Slow path (lcore setup).
 */
KVX_API int kvx_mem_stream_create(struct kvx_mem *m, const struct kvx_mem_stream_params *p,
				  struct kvx_mem_stream **out);

/**
 * Destroy a stream. Waits for copies still in flight (slow path). NULL is a no-op.
 *
 * @param s  Stream or NULL.
 * @par Thread safety  Owner thread only.
 */
KVX_API void kvx_mem_stream_destroy(struct kvx_mem_stream *s);

/**
 * Start an asynchronous copy on a stream; optionally mark an event that becomes ready when the
 * copy and every earlier copy on the stream finished.
 *
 * @param s         Stream; not NULL.
 * @param dst       Array[len] destination.
 * @param src       Array[len] source; must stay valid and unchanged until the copy finished.
 * @param len       Bytes, >= 1.
 * @param dir       Direction.
 * @param[out] done If non-NULL, set to a STREAM event for this copy.
 * @retval 0        Started.
 * @retval -ENOBUFS `depth` copies already in flight (query events to retire them).
 * @retval -EINVAL  Bad argument.
 * @retval -EIO     HIP error.
 * @par Thread safety  Owner thread only.
 * @par Context  Hot path: no allocation; one hipMemcpyAsync + hipEventRecord for HIP.
 */
KVX_API int kvx_mem_copy_async(struct kvx_mem_stream *s, void *dst, const void *src, size_t len,
			       enum kvx_mem_copy_dir dir, struct kvx_mem_event *done);

/**
 * Number of copies started on a stream and not yet known to be finished.
 *
 * @param s  Stream; not NULL.
 * @return   0..depth.
 * @par Thread safety  Owner thread only.
 */
KVX_API uint32_t kvx_mem_stream_inflight(const struct kvx_mem_stream *s);

/**
 * Initialise an event from a host counter: ready once `*counter >= threshold`.
 *
 * The producer publishes with `atomic_store_explicit(counter, v, memory_order_release)` (or
 * fetch_add); the query's acquire load pairs with it, so data written before the store is
 * visible once the event reads ready. `threshold` 1 makes the counter a plain flag; a
 * per-request counter of finished layers with threshold `layer + 1` gives one event per layer.
 *
 * @param[out] ev     Event; not NULL.
 * @param counter     Counter; not NULL; must outlive the event.
 * @param threshold   Ready threshold.
 * @par Thread safety  Any thread; the counter may be written from any thread.
 */
KVX_API void kvx_mem_event_init_flag(struct kvx_mem_event *ev, const _Atomic uint64_t *counter,
				     uint64_t threshold);

/**
 * Initialise an event from a producer's hipEvent_t (recorded by the producer after the layer's
 * kernels); polled with hipEventQuery, never synchronized.
 *
 * @param[out] ev        Event; not NULL.
 * @param hip_event      The hipEvent_t, as `void *`; not NULL; must outlive the event.
 * @retval 0        Initialised.
 * @retval -EINVAL  hip_event is NULL.
 * @retval -ENOTSUP Built without HIP.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_mem_event_init_hip(struct kvx_mem_event *ev, void *hip_event);

/**
 * Initialise an always-ready event (same as zero-initialising it).
 *
 * @param[out] ev  Event; not NULL.
 */
KVX_API void kvx_mem_event_init_ready(struct kvx_mem_event *ev);

/**
 * Query an event without blocking.
 *
 * For a STREAM event of the host implementation this also advances the stream's head copy by
 * one step (that is how host copies make progress).
 *
 * @param ev  Event; not NULL.
 * @return    1 ready, 0 not ready.
 * @retval -EIO     hipEventQuery reported an error (other than not-ready).
 * @retval -EINVAL  Unknown event kind.
 * @par Thread safety  FLAG/READY/HIP: any thread. STREAM: the stream's owner thread only.
 * @par Context  Hot path: no allocation, no blocking, no logging.
 */
KVX_API int kvx_mem_event_query(const struct kvx_mem_event *ev);

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
KVX_API int kvx_mem_stage_create(struct kvx_mem *m, struct kvx_mem_stream *s,
				 const struct kvx_mem_stage_params *p, struct kvx_mem_stage **out);

/**
 * Destroy a staging ring (waits for copies in flight). NULL is a no-op.
 *
 * @param st  Stage or NULL.
 */
KVX_API void kvx_mem_stage_destroy(struct kvx_mem_stage *st);

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
KVX_API int kvx_mem_stage_d2h_push(struct kvx_mem_stage *st, const void *src, size_t len,
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
KVX_API int kvx_mem_stage_d2h_poll(struct kvx_mem_stage *st, struct kvx_mem_chunk *out);

/**
 * Return a chunk handed out by kvx_mem_stage_d2h_poll() once its bytes were sent.
 *
 * @param st  Stage; not NULL.
 * @param c   The chunk; not NULL.
 * @retval 0        Released; the buffer is reused for the next copy.
 * @retval -EINVAL  c is not a chunk currently held by the caller.
 */
KVX_API int kvx_mem_stage_d2h_release(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c);

/**
 * Take a free bounce buffer to receive into (host->device side).
 *
 * @param st        Stage; not NULL.
 * @param[out] out  buf and capacity (len) of the free buffer; not NULL.
 * @retval 0        Taken.
 * @retval -ENOBUFS No free buffer (poll kvx_mem_stage_h2d_poll() to retire copies).
 * @par Context  Hot path.
 */
KVX_API int kvx_mem_stage_h2d_get(struct kvx_mem_stage *st, struct kvx_mem_chunk *out);

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
KVX_API int kvx_mem_stage_h2d_commit(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c,
				     void *dst, size_t len, uint64_t cookie);

/**
 * Give back a buffer from kvx_mem_stage_h2d_get() without copying (receive aborted).
 *
 * @param st  Stage; not NULL.
 * @param c   Chunk; not NULL.
 * @retval 0        Returned.
 * @retval -EINVAL  c is not a buffer held by the caller.
 */
KVX_API int kvx_mem_stage_h2d_cancel(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c);

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
KVX_API int kvx_mem_stage_h2d_poll(struct kvx_mem_stage *st, uint64_t *cookie, size_t *len);

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
KVX_API int kvx_mem_ipc_export(struct kvx_mem *m, const void *ptr, size_t len,
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
KVX_API int kvx_mem_ipc_cache_create(struct kvx_mem *m, uint32_t capacity,
				     struct kvx_mem_ipc_cache **out);

/**
 * Destroy a cache, closing every mapping still open. NULL is a no-op.
 *
 * @param c  Cache or NULL.
 */
KVX_API void kvx_mem_ipc_cache_destroy(struct kvx_mem_ipc_cache *c);

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
KVX_API int kvx_mem_ipc_cache_open(struct kvx_mem_ipc_cache *c,
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
KVX_API int kvx_mem_ipc_cache_close(struct kvx_mem_ipc_cache *c,
				    const struct kvx_mem_ipc_map *map);

/**
 * Cache bookkeeping counters.
 *
 * @param c            Cache; not NULL.
 * @param[out] entries If non-NULL, allocations currently open.
 * @param[out] opens   If non-NULL, underlying opens performed so far.
 * @param[out] closes  If non-NULL, underlying closes performed so far.
 */
KVX_API void kvx_mem_ipc_cache_stats(const struct kvx_mem_ipc_cache *c, uint32_t *entries,
				     uint64_t *opens, uint64_t *closes);

/* ---------------------------------------------------------------- verbs registration */

/**
 * Decide how the verbs provider registers [ptr, ptr + len) and export a dma-buf if needed.
 *
 * Decision chain (RUNTIME_GUIDE.md §3.9, §0.1 item 1):
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
KVX_API int kvx_mem_reg_plan(struct kvx_mem *m, const void *ptr, size_t len,
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
KVX_API int kvx_mem_reg_plan_by_type(const struct kvx_mem_type *t, const void *ptr, size_t len,
				     struct kvx_mem_reg_plan *out, char *why, size_t why_len);

/**
 * Release what a plan holds (closes the dma-buf fd; the kernel keeps its own reference once
 * the MR exists). Safe on a plan with no fd.
 *
 * @param plan  Plan; not NULL; its fd is set to -1.
 */
KVX_API void kvx_mem_reg_plan_fini(struct kvx_mem_reg_plan *plan);

/**
 * Whether the ROCm at run time exports dma-bufs (hsa_amd_portable_export_dmabuf found).
 *
 * @param why      Array[why_len] receiving the reason when false; may be NULL.
 * @param why_len  Size of why, bytes.
 * @return         true if available.
 * @par Thread safety  Any thread (the lookup is done once).
 */
KVX_API bool kvx_mem_dmabuf_available(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif /* KVX_MEM_H */
