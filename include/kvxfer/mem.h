/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_MEM_H
#define KVX_MEM_H
/**
 * @file
 * Memory operations for host and HIP device memory: the layer every provider and the runtime
 * use so that a KV cache in GPU memory is accepted wherever host memory is (docs/architecture.md §3,
 * docs/runtime-notes.md §3.9).
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
 *   host-side synchronize ever runs on the engine thread (docs/protocol.md §1 WRITE mode).
 * - **Provider internals**, in kvxfer/internal/mem.h (in-tree only: neither installed nor
 *   exported by libkvxfer.so; this header includes it when it is on the include path):
 *   **staging** (`struct kvx_mem_stage`), a small ring of pinned host bounce buffers per lcore
 *   that overlaps device->bounce copies with the send of earlier buffers (tcp provider), and
 *   bounce->device copies with the receive of later ones; same-host **IPC**
 *   (`struct kvx_mem_ipc_handle`, `struct kvx_mem_ipc_cache`) for the shm provider; the verbs
 *   **registration plan** (kvx_mem_reg_plan()).
 *
 * Threading: a `struct kvx_mem` context is safe to share between threads for alloc/free, IPC
 * export and pointer queries. A stream, its stream events and a stage belong to one
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

/** Default number of copies in flight on one stream. */
#define KVX_MEM_STREAM_DEFAULT_DEPTH 64
/** Default host-implementation copy step, bytes per query (256 KiB). */
#define KVX_MEM_HOST_DEFAULT_STEP_BYTES (256u << 10)
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

/** Pointer attributes (kvx_mem_ptr_query()). */
struct kvx_mem_ptr_info {
	enum kvx_mem_kind kind; /**< Memory kind of the pointer. */
	int device;             /**< HIP device ordinal; 0 for host. */
	uintptr_t base;         /**< Base address of the allocation holding the pointer. */
	size_t alloc_len;       /**< Length of that allocation, bytes. */
	size_t offset;          /**< Offset of the pointer inside the allocation, bytes. */
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

#ifdef __cplusplus
}
#endif

/* In-tree builds: the provider internals (staging, IPC, registration plan). */
#if __has_include("kvxfer/internal/mem.h")
#include "kvxfer/internal/mem.h"
#endif
#endif /* KVX_MEM_H */
