/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TRANSPORT_H
#define KVX_TRANSPORT_H
/**
 * @file
 * Data-path providers: one-sided READ and WRITE of byte ranges between registered regions of
 * two engines (docs/architecture.md §3). One ops table, three providers: `verbs` (RDMA RC QPs), `tcp`
 * (one-sided semantics emulated over TCP, serviced by the target's polling lcore) and `shm`
 * (process_vm_readv/writev between two processes of one host and one user).
 *
 * Objects (all opaque):
 * - context (struct kvx_xport_ctx): one per engine per provider; owns the registered regions
 *   and, for tcp, the data listener and the target-side service of incoming requests.
 * - region (struct kvx_xport_mr): local memory registered with access flags and a key.
 *   Its descriptor (address, length, key, access, memory type) is exported as
 *   KVX_XPORT_RDESC_BYTES fixed, versioned bytes and imported by the peer per endpoint as a
 *   remote region (struct kvx_xport_rmr).
 * - endpoint (struct kvx_xport_ep): a connection to one peer, with N parallel channels
 *   (verbs QPs, tcp sockets). The side that called kvx_xport_ep_create() is the initiator and
 *   posts READ/WRITE ops; the side that called kvx_xport_ep_accept() is the target (passive):
 *   it posts nothing (post returns -ENOTSUP there) and its memory is read/written by the
 *   initiator. An engine that needs both directions creates one endpoint per direction.
 *
 * Connection setup is exactly one request/reply through the control plane, which carries the
 * opaque blobs (plain bytes, versioned, bounds-checked by the receiver):
 * ```
 *   initiator: kvx_xport_ep_create()  -> blob A  --control-->  target: kvx_xport_ep_accept(A)
 *   initiator: kvx_xport_ep_connect(B) <--control-- blob B <-  (creates the target side)
 * ```
 * tcp: B carries the data address, port and a token; shm: pid, uid, boot id and a probe
 * address; verbs: QPN/PSN/GID/LID/MTU per QP.
 *
 * Completion model: one completion per posted batch (struct kvx_xport_cpl) carrying the
 * cookie, the first error status, the number of failed ops and the bytes moved. Every posted
 * op completes, with success or an error, within the context's op timeout, including when
 * the peer dies: errors are completions, never hangs. After the first transport-level error
 * (peer lost, op timeout) an endpoint is in error state, like an RC QP in ERR: every
 * outstanding op completes with -ETIMEDOUT (ops past their deadline) or -ECONNRESET (the
 * rest, flushed), and later posts are accepted and complete at once with -ECONNRESET.
 * Status codes: 0, -ERANGE (offset/length outside the local or remote region), -EACCES
 * (wrong key or access flag), -ECONNRESET (peer lost), -ETIMEDOUT (op deadline passed),
 * -ENOTSUP (memory type not supported by the provider).
 *
 * Threading contract:
 * - Control thread (the engine's control lcore, or any one thread at a time per context):
 *   kvx_xport_open/close, kvx_xport_query_caps, kvx_xport_mr_register/unregister/export,
 *   kvx_xport_ep_create/accept/connect/destroy, kvx_xport_rmr_import/release,
 *   kvx_xport_ctx_handle_events(). These may
 *   block briefly (connect, listen) and allocate; they are never called from a poller's fast
 *   path.
 * - Owning polling lcore: kvx_xport_post_bulk() and kvx_xport_poll_burst() on an initiator
 *   endpoint are called by one thread at a time (the poller that owns the endpoint); after
 *   kvx_xport_ep_connect() returns, hand the endpoint to that poller (a ring hand-off gives
 *   the needed happens-before). Endpoints of one poll group (kvx_xport_ep_set_group()) are
 *   all driven by that group's one thread: polling one may retire completions of the others
 *   (verbs shared CQ). kvx_xport_progress() on a context is called by one thread at
 *   a time (the runtime registers it as a poller on one lcore; it may be the same lcore or
 *   another one). Different endpoints may be driven by different pollers concurrently.
 * - Counters may be read from any thread (relaxed 64-bit loads; totals may be momentarily
 *   inconsistent with one another).
 * - Hot-path functions never log and never allocate; their only syscalls are the provider's
 *   socket I/O (tcp), process_vm_readv/writev (shm) or doorbell (verbs).
 *
 * Trust models: tcp checks every request at the target (bounds, key, access) before touching
 * memory, so a peer can only reach what was registered for it. shm moves bytes with
 * process_vm_readv/writev and checks at the initiator against descriptors verified against
 * the target's published region table at import: it assumes both engines run on one host as
 * one user (the kernel only enforces ptrace permission), and unregistration at the target is
 * seen by an initiator at its next import. CMA needs ptrace permission over the target:
 * kernel.yama.ptrace_scope 0, or 1 (the shm target then declares PR_SET_PTRACER_ANY); with 2
 * or 3 the provider reports itself unavailable, and a refused probe at connect fails with
 * -EPERM and a message naming the sysctl.
 *
 * Memory types: host memory everywhere; HIP device memory is registered through the same
 * kvx_xport_mr_register() call with mem_type KVX_XPORT_MEM_HIP, and a provider that cannot
 * reach device memory returns -ENOTSUP. caps.mem_types lists what works in this context: tcp
 * stages device regions through pinned bounce buffers, shm maps them with IPC handles, verbs
 * registers them with ibv_reg_dmabuf_mr (ROCm dma-buf export, real offset) or ibv_reg_mr on the
 * device pointer (peer-memory kernel) as kvx_mem_reg_plan() decides, and lists HIP only when
 * one of the two is available (else the refusal is logged with the reason); HIP is
 * listed only when a HIP device is present; KVX_XPORT_MEM_HOSTDEV (a test-only mock of device
 * memory) takes the same provider code paths as HIP without a GPU.
 *
 * Provider selection (`auto`, docs/architecture.md §3): verbs when a usable RDMA device exists, else
 * shm when the peer is on the same host and CMA is permitted, else tcp.
 *
 * Source: docs/architecture.md §3, docs/runtime-notes.md §3.2, §3.6-3.8, §3.10.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Size of an exported region descriptor, bytes (kvx_xport_mr_export()). */
#define KVX_XPORT_RDESC_BYTES 40
/** Largest connection blob (A or B) any provider produces, bytes. Size caller buffers with it. */
#define KVX_XPORT_BLOB_MAX 1024
/** Longest "unavailable" reason string written by kvx_xport_provider_probe(), bytes incl. NUL. */
#define KVX_XPORT_REASON_MAX 256
/** Poll groups are 0..KVX_XPORT_MAX_GROUPS-1 (kvx_xport_ep_set_group()). */
#define KVX_XPORT_MAX_GROUPS 1024u
/** Default op timeout (ns) when kvx_xport_ctx_params.op_timeout_ns is 0: 10 s. */
#define KVX_XPORT_DEFAULT_OP_TIMEOUT_NS 10000000000ull

/** Operation of a posted batch. */
enum kvx_xport_opcode {
	KVX_XPORT_OP_READ = 0,  /**< Copy remote range -> local range (RDMA READ). */
	KVX_XPORT_OP_WRITE = 1, /**< Copy local range -> remote range (RDMA WRITE). */
};

/**
 * Region access flags (bit mask), checked for every op: a READ needs REMOTE_READ on the
 * remote region and LOCAL_WRITE on the local one; a WRITE needs REMOTE_WRITE on the remote
 * region. A violation completes the op with -EACCES.
 */
enum kvx_xport_access {
	KVX_XPORT_ACCESS_LOCAL_WRITE = 1u << 0,  /**< Local region may be written by READ ops. */
	KVX_XPORT_ACCESS_REMOTE_READ = 1u << 1,  /**< Peers may READ from this region. */
	KVX_XPORT_ACCESS_REMOTE_WRITE = 1u << 2, /**< Peers may WRITE into this region. */
	KVX_XPORT_ACCESS_ALL = 7u,               /**< All three. */
};

/** Memory type of a region (registration parameter and descriptor field). */
enum kvx_xport_mem_type {
	KVX_XPORT_MEM_HOST = 0, /**< Host memory (malloc, mmap, hugepages). */
	KVX_XPORT_MEM_HIP = 1,  /**< HIP device memory (hipMalloc); providers may say -ENOTSUP. */
	KVX_XPORT_MEM_HOSTDEV = 2, /**< Test-only mock of device memory (KVX_MEM_HOSTDEV in
	                                kvxfer/mem.h, from kvx_mem_alloc() of a `hostdev` context):
	                                providers treat it exactly like HIP memory. */
};

/** Parameters of kvx_xport_open(); initialise with kvx_xport_ctx_params_init(). */
struct kvx_xport_ctx_params {
	uint64_t op_timeout_ns;   /**< Deadline of every op from its post, ns; 0 = 10 s. */
	uint32_t num_channels;    /**< Parallel channels per endpoint (QPs, tcp connections),
	                               1..caps.max_channels; 0 = provider default (1). */
	uint32_t queue_depth;     /**< Outstanding ops per endpoint, 1..65536 (rounded up to a
	                               power of 2); 0 = 8192. Also bounds one batch. */
	uint32_t max_regions;     /**< Registered regions per context, 1..65535; 0 = 1024. */
	uint32_t chunk_bytes;     /**< tcp: ops are split into requests of at most this many
	                               bytes, 4 KiB..16 MiB; 0 = 1 MiB. Ignored by others. */
	const char *tcp_addr;     /**< tcp: IPv4/IPv6 literal the data listener binds and
	                               advertises in blob B; NULL = "127.0.0.1". Copied. */
	uint16_t tcp_port;        /**< tcp: data listener port; 0 = ephemeral. */
	const char *device;       /**< verbs: RDMA device name; NULL = first usable. Copied. */
	uint8_t ib_port;          /**< verbs: port number; 0 = 1. */
	int gid_index;            /**< verbs: GID index; -1 = automatic. */
	uint32_t progress_groups; /**< tcp: the target's data connections are served by this
	                               many progress groups, 1..16 (0 = 1), one thread each:
	                               group 0 by kvx_xport_progress(), group g by
	                               kvx_xport_progress_group(ctx, g). A target endpoint's
	                               connections go to group (its poll group, from
	                               kvx_xport_ep_set_group(), mod progress_groups), so a
	                               target whose peers connect several endpoints copies on
	                               several threads. Others: 1 (caps). */
};

/** What a provider can do (kvx_xport_query_caps()). */
struct kvx_xport_caps {
	uint64_t max_op_bytes;  /**< Largest single op, bytes; longer ops get -EINVAL at post. */
	uint32_t max_batch;     /**< Most ops in one kvx_xport_post_bulk() call. */
	uint32_t inline_bytes;  /**< WRITEs up to this size are copied at post (buffer reusable
	                             on return); 0 = none. */
	uint32_t max_channels;  /**< Most parallel channels per endpoint. */
	uint32_t num_channels;  /**< Channels per endpoint this context uses. */
	uint32_t mem_types;     /**< Bit mask of (1u << enum kvx_xport_mem_type) accepted by
	                             kvx_xport_mr_register(). */
	bool needs_progress;    /**< true if the target must call kvx_xport_progress() for
	                             peers' ops to make progress (tcp). */
	bool same_host_only;    /**< true if both engines must be on one host (shm). */
	uint32_t progress_groups; /**< Progress groups in effect (1 unless the provider serves
	                             several: tcp, params.progress_groups). */
	bool cond_ops;          /**< true if kvx_xport_post_bulk_cond() checks its condition
	                             on every op: at the target (tcp), or by the initiator
	                             before each copy, with the copy published to the word's
	                             owner (shm, kvx_xport_ctx_cond_busy()). */
};

/** Registration parameters (kvx_xport_mr_register()). */
struct kvx_xport_mr_params {
	void *addr;                        /**< Start of the region; not NULL. */
	uint64_t len_bytes;                /**< Length, bytes, > 0. */
	uint32_t access;                   /**< enum kvx_xport_access mask. */
	enum kvx_xport_mem_type mem_type;  /**< Host or device memory. */
	int device_id;                     /**< HIP device ordinal for KVX_XPORT_MEM_HIP. */
};

/** One op of a batch: a byte range of a local region and one of an imported remote region. */
struct kvx_xport_op {
	struct kvx_xport_mr *lmr;   /**< Local region (from kvx_xport_mr_register()). */
	struct kvx_xport_rmr *rmr;  /**< Remote region imported on the same endpoint. */
	uint64_t loff;              /**< Offset in the local region, bytes. */
	uint64_t roff;              /**< Offset in the remote region, bytes. */
	uint64_t len;               /**< Length, bytes, 1..caps.max_op_bytes. */
};

/** Completion of one posted batch (kvx_xport_poll_burst()). */
struct kvx_xport_cpl {
	uint64_t cookie;       /**< The cookie given to kvx_xport_post_bulk(). */
	int32_t status;        /**< 0, or the first error of the batch (negative errno). */
	uint32_t n_ops;        /**< Ops in the batch. */
	uint32_t n_failed;     /**< Ops that failed, 0..n_ops. */
	uint32_t first_failed; /**< Index of the lowest-numbered failed op; n_ops if none. */
	uint64_t bytes;        /**< Bytes moved by the successful ops. */
};

/** Counters of an endpoint or a context (monotonic since creation). */
struct kvx_xport_counters {
	uint64_t ops_posted;      /**< Ops accepted by kvx_xport_post_bulk(). */
	uint64_t ops_ok;          /**< Ops completed successfully. */
	uint64_t ops_failed;      /**< Ops completed with an error. */
	uint64_t batches_done;    /**< Completions delivered. */
	uint64_t bytes_read;      /**< Bytes moved by successful READ ops. */
	uint64_t bytes_written;   /**< Bytes moved by successful WRITE ops. */
	uint64_t post_nobufs;     /**< Posts refused with -ENOBUFS. */
	uint64_t timeouts;        /**< Ops completed with -ETIMEDOUT. */
	uint64_t resets;          /**< Endpoints moved to error state. */
	uint64_t reqs_served;     /**< Target side: requests serviced (tcp). */
	uint64_t reqs_rejected;   /**< Target side: requests rejected (bounds, key, access). */
	uint64_t bytes_served;    /**< Target side: bytes read or written by peers' requests. */
	uint64_t proto_errors;    /**< Malformed or unexpected bytes from the network. */
	uint64_t async_events;    /**< Context: device async events read by
	                               kvx_xport_ctx_handle_events() (verbs). */
	uint64_t async_errors;    /**< Context: of those, events that moved endpoints to error
	                               state (QP fatal, CQ error, port down, device fatal). */
	uint64_t auth_refused;    /**< Target side (tcp): data connections closed because they did not
	                               prove the endpoint's secret (wrong token or challenge MAC). */
	uint64_t sock_calls;      /**< tcp: data-path recv()/sendmsg() calls on connected sockets. */
	uint64_t sock_would_block; /**< tcp: of those, calls that found the socket not ready
	                                (EAGAIN): readiness tracking keeps them rare. */
	uint64_t cma_calls;       /**< shm: process_vm_readv/writev calls that moved host ops (ops per
	                               call = host ops / cma_calls: small ops share calls). */
};

struct kvx_xport_ctx;
struct kvx_xport_mr;
struct kvx_xport_rmr;
struct kvx_xport_ep;

/* ------------------------------------------------------------------------------------------ */
/* Provider registry                                                                          */
/* ------------------------------------------------------------------------------------------ */

/**
 * List the providers compiled into this build (available or not).
 *
 * @param[out] names  Array[cap] receiving static provider names ("tcp", "shm", "verbs"); may
 *                    be NULL when cap is 0.
 * @param cap         Capacity of @p names, elements.
 * @return            Number of providers in the build (may exceed @p cap; only @p cap written).
 * @par Thread safety  Safe from any thread.
 */
KVX_API size_t kvx_xport_provider_list(const char **names, size_t cap);

/**
 * Check whether a provider can be used on this host, with the reason when it cannot.
 *
 * @param name         Provider name: "tcp", "shm", "verbs"; not NULL.
 * @param[out] reason  If non-NULL, receives a NUL-terminated reason when unavailable (e.g.
 *                     "verbs: ibv_get_device_list: Function not implemented (no RDMA in the
 *                     kernel)"), or "" when available.
 * @param reason_cap   Capacity of @p reason, bytes (KVX_XPORT_REASON_MAX is enough).
 * @retval 0           Available.
 * @retval -ENOENT     Unknown provider name.
 * @retval -ENOTSUP    Provider not compiled into this build.
 * @retval -ENODEV     No usable device (verbs without RDMA).
 * @retval -EPERM      Compiled but not permitted here (shm: CMA disabled by ptrace policy).
 * @par Thread safety  Safe from any thread. @par Context  Control path (may open devices).
 */
KVX_API int kvx_xport_provider_probe(const char *name, char *reason, size_t reason_cap);

/**
 * Resolve a requested provider name, applying the `auto` rule of docs/architecture.md §3.
 *
 * @param requested       "tcp", "shm", "verbs" or "auto"; not NULL.
 * @param peer_same_host  Whether the peer engine runs on this host (lets `auto` pick shm).
 * @param[out] out        Static provider name; not NULL.
 * @retval 0        @p out set (for a named provider: the name, if it is available).
 * @retval -ENOENT  Unknown name.
 * @retval -ENODEV / -ENOTSUP / -EPERM  As kvx_xport_provider_probe() for a named provider.
 * @par Thread safety  Safe from any thread. @par Context  Control path.
 */
KVX_API int kvx_xport_select(const char *requested, bool peer_same_host, const char **out);

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/**
 * Fill @p p with defaults (all zero / NULL, gid_index -1).
 *
 * @param[out] p  Parameters to initialise; not NULL.
 */
KVX_API void kvx_xport_ctx_params_init(struct kvx_xport_ctx_params *p);

/**
 * Open a provider context (one per engine per provider).
 *
 * tcp binds and listens on its data port here; the listener is served by kvx_xport_progress().
 *
 * @param provider  "tcp", "shm", "verbs" or "auto" (same-host peers not assumed); not NULL.
 * @param p         Parameters, or NULL for defaults; copied.
 * @param[out] out  New context; not NULL. Unchanged on error.
 * @retval 0         Success.
 * @retval -EINVAL   A parameter is out of range (logged with the field name).
 * @retval -ENOENT   Unknown provider.
 * @retval -ENOTSUP  Provider not built.
 * @retval -ENODEV   Provider has no usable device.
 * @retval -ENOMEM   Allocation failed.
 * @retval -EADDRINUSE / other negative errno  tcp: bind/listen failed (logged).
 * @par Context  Control path.
 */
KVX_API int kvx_xport_open(const char *provider, const struct kvx_xport_ctx_params *p,
			   struct kvx_xport_ctx **out);

/**
 * Close a context, destroying its remaining endpoints, imported and registered regions.
 *
 * No thread may be inside kvx_xport_progress(), kvx_xport_post_bulk() or
 * kvx_xport_poll_burst() on this context or its endpoints. Outstanding ops are discarded.
 *
 * @param ctx  Context, or NULL (no-op).
 * @par Context  Control path.
 */
KVX_API void kvx_xport_close(struct kvx_xport_ctx *ctx);

/**
 * Name of the context's provider.
 *
 * @param ctx  Context; not NULL.
 * @return     Static string ("tcp", "shm", "verbs").
 * @par Thread safety  Any thread.
 */
KVX_API const char *kvx_xport_name(const struct kvx_xport_ctx *ctx);

/**
 * Query the provider's capabilities for this context.
 *
 * @param ctx       Context; not NULL.
 * @param[out] out  Capabilities; not NULL.
 * @retval 0  Always succeeds for a valid context (returns int to share the ops-table shape).
 * @retval -EINVAL  NULL argument.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_xport_query_caps(const struct kvx_xport_ctx *ctx, struct kvx_xport_caps *out);

/**
 * Target-side progress: accept data connections, service peers' READ/WRITE requests (tcp).
 *
 * Each call does a bounded amount of non-blocking work and returns. Every request is checked
 * against the region's bounds, key and access flags before any byte of target memory is read
 * or written; a violation is answered with an error status and leaves memory untouched.
 * shm and verbs need no target-side work and return 0.
 *
 * @param ctx  Context; not NULL.
 * @return     Units of work done (requests, connections), 0 when idle; never negative.
 * @par Thread safety  One thread at a time per context (the runtime's poller 0). With
 *                     params.progress_groups > 1 this is group 0 and the other groups run
 *                     concurrently on their own threads (kvx_xport_progress_group()).
 * @par Context  Hot path: no allocation, no logging; non-blocking socket I/O only.
 */
KVX_API int kvx_xport_progress(struct kvx_xport_ctx *ctx);

/**
 * Target-side progress of one progress group (params.progress_groups): the same work as
 * kvx_xport_progress() for the data connections of the endpoints given to group @p group.
 * Group 0 is kvx_xport_progress() itself and also accepts connections and checks their
 * hellos; it hands an endpoint whose channels are all connected to its group, which serves
 * it from then on. Each group is called by one thread at a time; different groups may be
 * called concurrently by different threads (that is their point).
 *
 * An endpoint destroyed with kvx_xport_ep_destroy() is served by no call of any group that
 * begins after the destroy returned: a caller that must know its peers can no longer reach
 * target memory waits until every group has returned from a call that began after it.
 *
 * @param ctx    Context; not NULL.
 * @param group  0..caps.progress_groups-1.
 * @return       Units of work done, 0 when idle.
 * @retval -EINVAL  @p group out of range.
 * @par Thread safety  One thread at a time per group.
 * @par Context  Hot path: no allocation, no logging; non-blocking socket I/O only.
 * @par Source  kvxfer (issue 16: the target's copies on every polling lcore).
 */
KVX_API int kvx_xport_progress_group(struct kvx_xport_ctx *ctx, uint32_t group);

/**
 * File descriptor that becomes readable when kvx_xport_progress_group(@p ctx, @p group) may
 * have new work (an epoll fd over the group's connections and its hand-off doorbell). Group 0
 * is kvx_xport_ctx_wait_fd().
 *
 * @param ctx    Context; not NULL.
 * @param group  0..caps.progress_groups-1.
 * @return  fd >= 0 (owned by the context; do not close), -EINVAL for a group out of range,
 *          -ENOTSUP when the provider has no target-side events.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_xport_group_wait_fd(const struct kvx_xport_ctx *ctx, uint32_t group);

/**
 * Read the context's counters: its target-side service plus the sum over its endpoints.
 *
 * @param ctx       Context; not NULL.
 * @param[out] out  Counters; not NULL.
 * @par Thread safety  Any thread (call from the control thread: it walks the endpoint list).
 */
KVX_API void kvx_xport_ctx_counters(const struct kvx_xport_ctx *ctx,
				    struct kvx_xport_counters *out);

/**
 * Read only the context's own target-side counters: the service of peers' requests and data
 * connections (reqs_served, reqs_rejected, bytes_served, proto_errors, auth_refused) and the
 * device events (async_events, async_errors). Endpoint counters are not included: their fields
 * that only endpoints count (ops_*, batches_done, bytes_read/written, post_nobufs, timeouts,
 * resets) read 0 unless the provider counts them on the context too.
 *
 * Unlike kvx_xport_ctx_counters() it walks no list: each field is a sum of relaxed atomic
 * loads of counters with one writer each (the thread of each progress group; async_* the
 * thread calling kvx_xport_ctx_handle_events()).
 *
 * @param ctx       Context; not NULL.
 * @param[out] out  Counters; not NULL.
 * @par Thread safety  Any thread, at any time between kvx_xport_open() and kvx_xport_close()
 *                     (the engine's application thread reads it for its statistics).
 */
KVX_API void kvx_xport_ctx_service_counters(const struct kvx_xport_ctx *ctx,
					    struct kvx_xport_counters *out);

/* ------------------------------------------------------------------------------------------ */
/* Regions                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/**
 * Register local memory: gives it a key and makes it reachable by peers per its access flags.
 *
 * @param ctx       Context; not NULL.
 * @param p         Parameters (address, length, access, memory type); copied.
 * @param[out] out  New region; not NULL.
 * @retval 0         Success.
 * @retval -EINVAL   NULL address, zero length, unknown access bits or memory type, or a device
 *                   mem_type whose address is not memory of that type (tcp/shm check it).
 * @retval -ENOTSUP  The provider cannot use this memory type (not in caps.mem_types, e.g. HIP
 *                   without a HIP device), or another device memory type is already in use in
 *                   this context (tcp/shm: one per context).
 * @retval -ERANGE   Device mem_type: [addr, addr + len_bytes) extends past its allocation.
 * @retval -ENOBUFS  The context's region table is full (max_regions).
 * @retval -ENOMEM   Allocation failed.
 * @par Context  Control path.
 */
KVX_API int kvx_xport_mr_register(struct kvx_xport_ctx *ctx, const struct kvx_xport_mr_params *p,
				  struct kvx_xport_mr **out);

/**
 * Unregister a region. New requests naming its key complete with -EACCES.
 *
 * The caller guarantees that no op it posted still uses the region locally.
 *
 * @param mr  Region, or NULL (returns 0).
 * @retval 0       Unregistered and freed.
 * @retval -EBUSY  A peer's request is being serviced from the region right now (tcp); the
 *                 region stays registered but refuses new requests: call again.
 * @par Context  Control path.
 */
KVX_API int kvx_xport_mr_unregister(struct kvx_xport_mr *mr);

/**
 * Key of a registered region (verbs rkey; tcp/shm: slot and generation).
 *
 * @param mr  Region; not NULL.
 * @return    32-bit key carried in the descriptor.
 */
KVX_API uint32_t kvx_xport_mr_key(const struct kvx_xport_mr *mr);

/**
 * Export a region descriptor as KVX_XPORT_RDESC_BYTES fixed, versioned bytes.
 *
 * Layout (little-endian, byte offsets): 0 magic "KXRD", 4 version u8 (= 1), 5 provider id
 * u8, 6 memory type u8, 7 reserved u8 (0), 8 access u32, 12 key u32, 16 addr u64, 24 len
 * u64, 32 reserved u64 (0). The importer rejects any other version or a non-zero reserved
 * field.
 *
 * @param mr        Region; not NULL.
 * @param[out] buf  Array[cap] of bytes; not NULL.
 * @param cap       Capacity, bytes.
 * @param[out] len  If non-NULL, bytes written (KVX_XPORT_RDESC_BYTES).
 * @retval 0          Success.
 * @retval -EMSGSIZE  @p cap < KVX_XPORT_RDESC_BYTES.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_xport_mr_export(const struct kvx_xport_mr *mr, void *buf, size_t cap,
				size_t *len);

/**
 * Import a peer's region descriptor for use in ops on one endpoint.
 *
 * @param ep        Initiator endpoint; not NULL.
 * @param buf       Array[len] of bytes from the peer's kvx_xport_mr_export(); untrusted.
 * @param len       Length, bytes; must be KVX_XPORT_RDESC_BYTES.
 * @param[out] out  New remote region, freed by kvx_xport_rmr_release() or with the endpoint.
 * @retval 0          Success.
 * @retval -EPROTO    Bad magic, version, provider id, access bits or length (logged with the
 *                    field).
 * @retval -EMSGSIZE  @p len is not KVX_XPORT_RDESC_BYTES.
 * @retval -ENOTSUP   The provider cannot reach that memory type.
 * @retval -ENOMEM    Allocation failed.
 * @par Context  Control path.
 */
KVX_API int kvx_xport_rmr_import(struct kvx_xport_ep *ep, const void *buf, size_t len,
				 struct kvx_xport_rmr **out);

/**
 * Release an imported remote region. No posted op may still reference it.
 *
 * @param rmr  Remote region, or NULL (no-op).
 * @par Context  Control path.
 */
KVX_API void kvx_xport_rmr_release(struct kvx_xport_rmr *rmr);

/* ------------------------------------------------------------------------------------------ */
/* Endpoints (connection setup: one request/reply through the control plane)                 */
/* ------------------------------------------------------------------------------------------ */

/**
 * Create an initiator endpoint and its connection request (blob A).
 *
 * @param ctx            Context; not NULL.
 * @param[out] out       New endpoint (not yet connected); not NULL.
 * @param[out] blob      Array[cap] receiving blob A; not NULL.
 * @param cap            Capacity, bytes (KVX_XPORT_BLOB_MAX is enough).
 * @param[out] blob_len  Bytes written; not NULL.
 * @retval 0          Success.
 * @retval -EMSGSIZE  @p cap too small.
 * @retval -ENOMEM    Allocation failed.
 * @par Context  Control path.
 */
KVX_API int kvx_xport_ep_create(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, void *blob,
				size_t cap, size_t *blob_len);

/**
 * Accept a peer's connection request (blob A): create the target side and the reply (blob B).
 *
 * tcp: the endpoint's data connections are accepted and served by kvx_xport_progress().
 *
 * @param ctx            Context; not NULL.
 * @param blob_a         Array[len_a] bytes from the peer; untrusted.
 * @param len_a          Length, bytes.
 * @param[out] out       New target endpoint; not NULL.
 * @param[out] blob_b    Array[cap] receiving blob B; not NULL.
 * @param cap            Capacity, bytes.
 * @param[out] len_b     Bytes written; not NULL.
 * @retval 0          Success.
 * @retval -EPROTO    Malformed blob (bad magic, version, provider, field out of range; logged).
 * @retval -EMSGSIZE  @p cap too small or @p len_a wrong.
 * @retval -ENOTSUP   shm: the peer is on another host or runs as another user.
 * @retval -ENOMEM    Allocation failed.
 * @par Context  Control path.
 */
KVX_API int kvx_xport_ep_accept(struct kvx_xport_ctx *ctx, const void *blob_a, size_t len_a,
				struct kvx_xport_ep **out, void *blob_b, size_t cap, size_t *len_b);

/**
 * Complete an initiator endpoint with the peer's reply (blob B). May block up to a few
 * seconds (tcp connect). After success, hand the endpoint to its polling lcore.
 *
 * @param ep      Endpoint from kvx_xport_ep_create(); not NULL.
 * @param blob_b  Array[len_b] bytes from the peer; untrusted.
 * @param len_b   Length, bytes.
 * @retval 0             Connected.
 * @retval -EPROTO       Malformed blob (logged with the field).
 * @retval -EMSGSIZE     Wrong length.
 * @retval -EISCONN      Already connected.
 * @retval -EPERM        shm: CMA not permitted (message names kernel.yama.ptrace_scope).
 * @retval -ENOTSUP      shm: the peer is on another host.
 * @retval -ECONNRESET   shm: the peer process is gone.
 * @retval -ETIMEDOUT / -ECONNREFUSED / other negative errno  tcp connect failed (logged).
 * @par Context  Control path.
 */
KVX_API int kvx_xport_ep_connect(struct kvx_xport_ep *ep, const void *blob_b, size_t len_b);

/**
 * Create an initiator endpoint already in poll group @p group (see kvx_xport_ep_set_group()).
 *
 * verbs: a QP's completion queue is fixed when the QP is created, and blob A carries the QP
 * numbers, so sharing the group's completion queue needs the group here, at creation: the
 * endpoint's QPs are created on the group's shared CQ (created lazily per group in the
 * context; a group whose CQ is full of endpoints gets another one). kvx_xport_ep_create()
 * instead gives the endpoint a CQ of its own. tcp/shm: same as kvx_xport_ep_create() followed
 * by kvx_xport_ep_set_group().
 *
 * @param ctx            Context; not NULL.
 * @param group          Poll group, 0..KVX_XPORT_MAX_GROUPS-1.
 * @param[out] out       New endpoint (not yet connected); not NULL.
 * @param[out] blob      Array[cap] receiving blob A; not NULL.
 * @param cap            Capacity, bytes (KVX_XPORT_BLOB_MAX is enough).
 * @param[out] blob_len  Bytes written; not NULL.
 * @retval 0          Success.
 * @retval -EINVAL    NULL argument or @p group out of range.
 * @retval -EMSGSIZE  @p cap too small.
 * @retval -ENOMEM    Allocation failed.
 * @retval other negative errno  verbs: the device refused a CQ or QP (logged).
 * @par Context  Control path.
 * @see kvx_xport_ep_set_group()
 */
KVX_API int kvx_xport_ep_create_in_group(struct kvx_xport_ctx *ctx, uint32_t group,
					 struct kvx_xport_ep **out, void *blob, size_t cap,
					 size_t *blob_len);

/**
 * Set an endpoint's poll group: the index of the polling lcore that will drive it.
 *
 * Endpoints of one group are driven by one thread: kvx_xport_post_bulk(),
 * kvx_xport_poll_burst() and kvx_xport_ep_wait() on any endpoint of a group are called by
 * that group's thread only. verbs: endpoints created in a group
 * (kvx_xport_ep_create_in_group()) share one completion queue, polled in bursts; polling one
 * endpoint also drains the completions of the others, which wait in their own endpoint's
 * queue (no allocation) until that endpoint is polled. Send-queue credits stay per QP.
 * Default group: 0. shm records the group and returns 0; tcp also serves a target endpoint's
 * connections in progress group (@p group mod caps.progress_groups), read when its channels
 * have connected: a later call does not move it. tcp with device memory registered: the
 * group's staging is made here, and if that fails the call returns its error (logged) and the
 * endpoint stays in group 0.
 *
 * @param ep     Endpoint; not NULL. Initiator: before kvx_xport_ep_connect(); target: right
 *               after kvx_xport_ep_accept(), before peers use it.
 * @param group  Poll group, 0..KVX_XPORT_MAX_GROUPS-1.
 * @retval 0          Recorded (verbs: an endpoint from kvx_xport_ep_create() keeps its own
 *                    CQ; one from kvx_xport_ep_create_in_group() must stay in its group).
 * @retval -EINVAL    NULL endpoint or @p group out of range.
 * @retval -EISCONN   Initiator endpoint already connected.
 * @retval -EBUSY     verbs: the endpoint's QPs are on another group's shared CQ (fixed when
 *                    they were created; logged).
 * @par Context  Control path.
 */
KVX_API int kvx_xport_ep_set_group(struct kvx_xport_ep *ep, uint32_t group);

/**
 * Poll group of an endpoint (kvx_xport_ep_set_group()).
 *
 * @param ep  Endpoint; not NULL.
 * @return    The group, 0 by default.
 * @par Thread safety  Any thread after the group was set.
 */
KVX_API uint32_t kvx_xport_ep_group(const struct kvx_xport_ep *ep);

/**
 * Start recovering an initiator endpoint: reset its channels and write a reconnect request
 * (blob A', same framing as blob A).
 *
 * Recovery runs through the control plane like the first connection, on the existing objects:
 * ```
 *   initiator: kvx_xport_ep_reset()  -> blob A' --control--> target: kvx_xport_ep_reaccept(A')
 *   initiator: kvx_xport_ep_connect(B') <--control-- blob B' <-
 * ```
 * verbs: every QP goes RESET -> INIT with a new PSN (both sides: an RC QP error also moves
 * the responder's QP to ERR), then INIT -> RTR -> RTS with the peer's new PSNs. Imported
 * remote regions and registered regions stay valid. Call it after kvx_xport_ep_status()
 * reported an error and every outstanding op has completed (drain with kvx_xport_poll_burst()).
 * The endpoint is not connected between this call and kvx_xport_ep_connect(); its status is
 * 0 again. Providers without QP state (tcp, shm) return -ENOTSUP: create a new endpoint.
 *
 * @param ep             Initiator endpoint; not NULL.
 * @param[out] blob      Array[cap] receiving blob A'; not NULL.
 * @param cap            Capacity, bytes (KVX_XPORT_BLOB_MAX is enough).
 * @param[out] blob_len  Bytes written; not NULL.
 * @retval 0          Reset; send blob A' to the peer.
 * @retval -EINVAL    NULL argument.
 * @retval -EBUSY     Ops are still outstanding: poll until they complete, then retry.
 * @retval -EMSGSIZE  @p cap too small.
 * @retval -ENOTSUP   Target endpoint, or the provider has no reset (tcp, shm).
 * @retval other negative errno  The device refused a QP transition (logged).
 * @par Context  Control path; the owning poller must not drive the endpoint meanwhile.
 * @see kvx_xport_ep_reaccept()
 */
KVX_API int kvx_xport_ep_reset(struct kvx_xport_ep *ep, void *blob, size_t cap, size_t *blob_len);

/**
 * Target side of recovery: reset the target endpoint's channels against a reconnect request
 * (blob A' from kvx_xport_ep_reset()) and write the reply (blob B').
 *
 * @param ep          Target endpoint (from kvx_xport_ep_accept()) the request names; not NULL.
 * @param blob_a      Array[len_a] bytes from the peer; untrusted.
 * @param len_a       Length, bytes.
 * @param[out] blob_b Array[cap] receiving blob B'; not NULL.
 * @param cap         Capacity, bytes.
 * @param[out] len_b  Bytes written; not NULL.
 * @retval 0          Reset and reconnected on this side; send blob B' to the peer.
 * @retval -EINVAL    NULL argument.
 * @retval -EPROTO    Malformed blob, not a reconnect request, or for another endpoint
 *                    (token or channel count differ; logged).
 * @retval -EMSGSIZE  @p cap too small or @p len_a wrong.
 * @retval -ENOTSUP   Initiator endpoint, or the provider has no reset (tcp, shm).
 * @par Context  Control path.
 * @see kvx_xport_ep_reset()
 */
KVX_API int kvx_xport_ep_reaccept(struct kvx_xport_ep *ep, const void *blob_a, size_t len_a,
				  void *blob_b, size_t cap, size_t *len_b);

/**
 * Destroy an endpoint and the remote regions imported on it. Outstanding ops are discarded
 * without completions: drain with kvx_xport_poll_burst() first. The owning poller must no
 * longer drive the endpoint. For a target endpoint, the context's progress thread stops
 * serving it at its next call (the memory is released then, or at kvx_xport_close()).
 *
 * @param ep  Endpoint, or NULL (no-op).
 * @par Context  Control path.
 */
KVX_API void kvx_xport_ep_destroy(struct kvx_xport_ep *ep);

/**
 * Error state of an endpoint.
 *
 * @param ep  Endpoint; not NULL.
 * @return    0 while healthy, else the status that moved it to error (-ECONNRESET,
 *            -ETIMEDOUT).
 * @par Thread safety  Any thread (relaxed load).
 */
KVX_API int kvx_xport_ep_status(const struct kvx_xport_ep *ep);

/**
 * Read an endpoint's counters.
 *
 * @param ep        Endpoint; not NULL.
 * @param[out] out  Counters; not NULL.
 * @par Thread safety  Any thread.
 */
KVX_API void kvx_xport_ep_counters(const struct kvx_xport_ep *ep, struct kvx_xport_counters *out);

/* ------------------------------------------------------------------------------------------ */
/* Hot path                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/**
 * Post a batch of READ or WRITE ops (all-or-nothing) with one completion cookie.
 *
 * Exactly one struct kvx_xport_cpl with @p cookie is delivered later by
 * kvx_xport_poll_burst(), within the op timeout. Per-op errors (local or remote bounds,
 * key, access) are reported there, never here. The local memory of a WRITE larger than
 * caps.inline_bytes must stay unchanged, and that of a READ unread, until the completion.
 *
 * @param ep      Initiator endpoint, connected; not NULL.
 * @param opcode  KVX_XPORT_OP_READ or KVX_XPORT_OP_WRITE for every op.
 * @param ops     Array[n] of ops; copied, not retained.
 * @param n       Count, 1..caps.max_batch.
 * @param cookie  Opaque value returned in the completion.
 * @retval 0          Accepted; one completion will follow.
 * @retval -ENOBUFS   Not enough free slots now (queue_depth or completion slots): poll and
 *                    retry; nothing was posted. Counted in post_nobufs.
 * @retval -EINVAL    NULL ops, n out of range, bad opcode, an op with len 0 or over
 *                    max_op_bytes, a NULL lmr/rmr, an lmr of another context or an rmr
 *                    imported on another endpoint.
 * @retval -ENOTSUP   Target (accepted) endpoint.
 * @retval -ENOTCONN  Endpoint not connected yet.
 * @par Thread safety  One thread at a time per endpoint (its owning poller).
 * @par Context  Hot path: no allocation, no logging; may perform the provider's I/O.
 */
KVX_API int kvx_xport_post_bulk(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
				const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie);

/** Condition of a conditional batch (kvx_xport_post_bulk_cond()): a 64-bit word of the target's
 *  memory that must hold @p expect when the target applies each op. */
struct kvx_xport_cond {
	struct kvx_xport_rmr *rmr; /**< Region of the word, imported on the same endpoint, with
	                                REMOTE_READ access, host memory. */
	uint64_t roff;             /**< Byte offset of the word in @p rmr; a multiple of 8. */
	uint64_t expect;           /**< The value the word must hold. */
};

/**
 * kvx_xport_post_bulk() whose ops the target applies only while a word of its own memory holds
 * an expected value (the block leases of docs/protocol.md §5.11: the word is the owner's lease
 * word, revoked by its owner at any time).
 *
 * shm (no target thread: the initiator copies with process_vm_writev/readv): before each
 * syscall that moves ops of a conditional batch, the initiator stores the expected value in a
 * busy word of its own memory (its address travels in the connection blob), issues a seq_cst
 * fence and reads the target's word (8 bytes, process_vm_readv). A changed word fails those ops
 * with -ESTALE and nothing moves; else the copy runs and the busy word is cleared after it. The
 * owner, after changing the word, asks kvx_xport_ctx_cond_busy() whether a copy made under the
 * old value may still run, and reuses the memory only once it says no. Ops on a device remote
 * region (IPC mapping, asynchronous copies) are checked once at post and not covered by the
 * busy word.
 *
 * The target loads the word (acquire) before it touches the memory of an op, and again before
 * each further piece of a WRITE payload it copies (tcp: before every recv()/memcpy() into the
 * region) and before it sends a READ response's payload. If the word differs, the op completes
 * with -ESTALE and the target touches no more of its memory: nothing of a WRITE lands after the
 * check that saw the change, a READ response carries no payload. A copy that already passed its
 * check when the word changes completes (the residual window: one recv()/memcpy() of at most
 * chunk_bytes per connection; none at all when the word is changed by the thread that runs the
 * target's kvx_xport_progress()). The word is read, never written, by the target.
 *
 * @param cond  The condition; not NULL; cond->rmr imported on @p ep.
 * Other parameters, return values and thread safety: kvx_xport_post_bulk(), and:
 * @retval -ENOTSUP  The provider has no conditional ops (caps.cond_ops false: verbs).
 * @retval -EINVAL   Also: cond->roff not a multiple of 8 or past the region's end.
 * @par Source  docs/protocol.md §5.11 (tcp wire format: transport/tcp/tcp_internal.h; shm:
 *               transport/shm/shm.c).
 */
KVX_API int kvx_xport_post_bulk_cond(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
				     const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie,
				     const struct kvx_xport_cond *cond);

/**
 * Whether a peer's initiator may, right now, be copying into or out of this context's memory
 * under a condition that expected @p word (kvx_xport_post_bulk_cond()): the owner side of the
 * shm conditional ops. Call it after changing the word (with a seq_cst fence between the change
 * and the call, which this function issues itself): 0 means every copy made under @p word has
 * finished and every later one sees the change (fails -ESTALE), so the memory the word guarded
 * may be reused; 1 means wait and ask again (never sleep-wait on it in a hot loop: the copy in
 * flight is one syscall, but a stopped peer process keeps its busy word until it runs again).
 * A peer process that is gone holds nothing.
 *
 * Cost: one 8-byte process_vm_readv per initiator endpoint ever accepted from a live peer.
 *
 * @param ctx   Context; not NULL.
 * @param word  The value the word held before the change; not 0.
 * @return 1 busy, 0 not busy (always 0 where the target applies conditions itself, tcp, or
 *         has none, verbs).
 * @retval -EINVAL  ctx NULL or word 0.
 * @par Thread safety  Any thread, concurrently with posts, accepts and other calls.
 * @par Context  May perform syscalls; no allocation, no logging.
 * @par Source  docs/protocol.md §5.11.
 */
KVX_API int kvx_xport_ctx_cond_busy(struct kvx_xport_ctx *ctx, uint64_t word);

/**
 * Drive an endpoint and return up to @p max batch completions (best effort).
 *
 * Also performs the endpoint's non-blocking I/O and enforces op deadlines; call it
 * regularly while ops are outstanding.
 *
 * @param ep        Initiator endpoint; not NULL.
 * @param[out] cpl  Array[max] receiving completions.
 * @param max       Capacity, elements; 0 just drives I/O.
 * @return          Completions written, 0..max; never negative.
 * @par Thread safety  One thread at a time per endpoint (same thread as post).
 * @par Context  Hot path: no allocation, no logging.
 */
KVX_API int kvx_xport_poll_burst(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max);

/* ------------------------------------------------------------------------------------------ */
/* Device async events (control lcore)                                                        */
/* ------------------------------------------------------------------------------------------ */

/**
 * File descriptor that becomes readable when device async events are pending (verbs: the
 * ibv_context's async fd, set O_NONBLOCK). The control lcore adds it to its poll set and calls
 * kvx_xport_ctx_handle_events() when it is readable.
 *
 * @param ctx  Context; not NULL.
 * @return     fd >= 0 (owned by the context; do not close or read it).
 * @retval -ENOTSUP  The provider has no device async events (tcp, shm).
 * @retval -EINVAL   NULL context.
 * @par Thread safety  Any thread.
 * @par Source  docs/runtime-notes.md §3.7 (async events read by the control core).
 */
KVX_API int kvx_xport_ctx_event_fd(const struct kvx_xport_ctx *ctx);

/**
 * Drain and act on pending device async events, without blocking.
 *
 * verbs: each event is read with ibv_get_async_event() and acknowledged. QP fatal / request
 * error / access error move that QP's endpoint to error state; CQ error, port error (the
 * context's port) and device fatal move every endpoint on that CQ / of the context. The QPs
 * are moved to ERR here, so outstanding ops complete with errors through the normal
 * completion path (kvx_xport_poll_burst(): -ECONNRESET) and the endpoint's status becomes
 * -ECONNRESET at its owning poller's next post or poll; recovery is a new handshake (or
 * kvx_xport_ep_reset()). Other events (port active, SQ drained, LID/GID change, ...) are
 * counted and logged only. Counted in the context counters async_events / async_errors.
 * tcp/shm: nothing to do, returns 0.
 *
 * @param ctx  Context; not NULL.
 * @return     Events handled (0 when none was pending).
 * @retval -EINVAL  NULL context.
 * @retval other negative errno  Reading the event fd failed (not EAGAIN).
 * @par Thread safety  The control thread of the context (same thread as endpoint create and
 *      destroy).
 * @par Context  Control path (logs, rate limited).
 */
KVX_API int kvx_xport_ctx_handle_events(struct kvx_xport_ctx *ctx);

/* ------------------------------------------------------------------------------------------ */
/* Adaptive idle: wait for provider events instead of spinning                                */
/* ------------------------------------------------------------------------------------------ */

/**
 * File descriptor that becomes readable when kvx_xport_progress() may have new work (an
 * epoll fd over the tcp listener and target connections, edge-triggered inside). Add it to
 * an lcore waiter to sleep when the progress poller has been idle; a stale wake-up costs one
 * empty progress call.
 *
 * @param ctx  Context; not NULL.
 * @return     fd >= 0 (owned by the context; do not close), or -ENOTSUP when the provider
 *             has no target-side events (shm, verbs).
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_xport_ctx_wait_fd(const struct kvx_xport_ctx *ctx);

/**
 * Block until kvx_xport_progress() may have new work, or @p timeout_ms passes. Call it only
 * after a kvx_xport_progress() call that returned 0.
 *
 * @param ctx         Context; not NULL.
 * @param timeout_ms  Longest wait, ms; 0 = do not block; -1 = no limit.
 * @return            1 if woken by an event, 0 on timeout; never blocks longer than asked.
 * @retval -ENOTSUP   The provider has no target-side events (returns at once). verbs has no
 *                    progress work at all (the NIC serves peers; device async events go to
 *                    kvx_xport_ctx_handle_events()): it sleeps @p timeout_ms and returns 0.
 * @par Thread safety  The thread that calls kvx_xport_progress() for this context.
 * @par Context  Idle path of a poller (a syscall that sleeps).
 */
KVX_API int kvx_xport_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms);

/**
 * Block until kvx_xport_poll_burst() on @p ep may make progress (socket readable or writable
 * again), or @p timeout_ms passes. Call it only after a kvx_xport_poll_burst() that returned
 * 0; bound @p timeout_ms by the caller's own deadlines (the op timeout is enforced only
 * inside kvx_xport_poll_burst()).
 *
 * verbs: waits on the completion channel of the endpoint's CQ (the group's channel when the
 * CQ is shared): arms the CQ with ibv_req_notify_cq(), drains it once more (completions that
 * arrived before arming raise no event; those of other endpoints of the group are parked in
 * their endpoint's queue), then poll()s the channel fd and acknowledges the events.
 *
 * @param ep          Initiator endpoint; not NULL.
 * @param timeout_ms  Longest wait, ms; 0 = do not block; -1 = no limit.
 * @return            1 if woken by an event (or completions are already queued), 0 on
 *                    timeout.
 * @retval -ENOTSUP   The provider completes ops without events to wait for (shm: host ops
 *                    complete inside kvx_xport_post_bulk(), device ops on a copy stream that
 *                    only kvx_xport_poll_burst() queries); returns at once.
 * @retval other negative errno  verbs: arming the CQ or reading the channel failed.
 * @par Thread safety  The endpoint's owning poller.
 * @par Context  Idle path of a poller.
 */
KVX_API int kvx_xport_ep_wait(struct kvx_xport_ep *ep, int timeout_ms);

/**
 * Ready a poller to sleep on @p ep's readiness instead of polling it: when everything @p ep has
 * outstanding can advance only once one of its sockets becomes readable or writable again (or
 * on the next post), make sure the endpoint's readiness fd (an epoll fd, edge-triggered inside)
 * is in the caller's epoll set @p epfd, level-triggered EPOLLIN, and return 1. The fd is added
 * once per endpoint and leaves the set when the endpoint is destroyed. Call it after a
 * kvx_xport_poll_burst() that returned 0; sleep on @p epfd bounded by the caller's deadlines
 * (the op timeout is enforced only inside kvx_xport_poll_burst()).
 *
 * @param ep    Initiator endpoint; not NULL.
 * @param epfd  The poller's epoll fd (its lcore sleeps on it: kvx_lcore_add_wait_fd()), or -1
 *              to take the endpoint's fd out of the set it is in (when nothing is outstanding
 *              any more, so that an idle endpoint's edges do not wake the poller): returns 0.
 * @return      1: sleeping on @p epfd is safe; 0: poll again without sleeping (completions
 *              queued, device copies in flight, a socket still ready).
 * @retval -ENOTSUP  The provider has no readiness fd (shm, verbs): keep polling.
 * @retval other negative errno  epoll_ctl() failed (keep polling).
 * @par Thread safety  The endpoint's owning poller.
 * @par Context  Idle path of a poller; one epoll_ctl() the first time, no syscall after.
 */
KVX_API int kvx_xport_ep_arm(struct kvx_xport_ep *ep, int epfd);

#ifdef __cplusplus
}
#endif
#endif /* KVX_TRANSPORT_H */
