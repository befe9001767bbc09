/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_ENGINE_H
#define KVX_ENGINE_H
/**
 * @file
 * The engine: what an inference engine programs against (docs/protocol.md §1, §4, §5, with the
 * fixes of §6; docs/architecture.md §1 and §5).
 *
 * An engine is one worker (one (dp_rank, tp_rank)) of a producer (prefill, P) or consumer
 * (decode, D) instance, in READ or WRITE mode. It owns pinned polling lcores (transfer
 * planning, posting, completion polling), one control lcore (handshakes, notifications,
 * heartbeat, timers) and a transport provider. The application registers its KV layers,
 * starts the engine, then submits transfers by **transfer id** and polls completions.
 *
 * Lifecycle: kvx_engine_params_init() → kvx_engine_create() → kvx_engine_register_layer()
 * (once per layer, before start) → kvx_engine_start() → transfers … → kvx_engine_stop() →
 * kvx_engine_destroy().
 *
 * Per role and mode:
 * | role / mode  | READ                                        | WRITE                                         |
 * |--------------|---------------------------------------------|-----------------------------------------------|
 * | consumer (D) | kvx_xfer_read(); kvx_xfer_layer_wait/poll()  | kvx_xfer_announce() (sends `remote_blocks`)  |
 * | producer (P) | kvx_xfer_serve(); freed on `release`        | kvx_xfer_write_begin(); kvx_xfer_layer_ready[_event]();  kvx_xfer_seal() |
 * Both: kvx_engine_poll_completions(), kvx_xfer_abort(), kvx_engine_get_stats().
 *
 * Every transfer reaches exactly one terminal KVX_CPL_TRANSFER completion (done, failed,
 * aborted, timed out) within its timeout, on both sides. A producer additionally gets exactly
 * one KVX_CPL_BLOCKS_RELEASED completion per transfer when its blocks may be reused (after
 * `release` / `write_done` / defer timeout, and only once no op may still touch them); a
 * consumer gets KVX_CPL_BLOCKS_RELEASED for the destination blocks of a failed/aborted
 * transfer once they are out of quarantine.
 *
 * Reader fence (P READ, docs/protocol.md §5.4 and §6 item 11): a producer cannot see the
 * consumer's one-sided READs, so when a served transfer's defer_timeout passes without
 * `release` it first revokes access at the wire: its polling lcore destroys every target
 * (accepted) endpoint of the engine (verbs: the responder QPs are gone; tcp: the connections
 * are closed before the target services another request). Only then does the transfer's
 * KVX_CPL_BLOCKS_RELEASED follow its KVX_CPL_TRANSFER (TIMED_OUT); stats.fences counts
 * fences. Cost: the producer cannot tell which consumer reads which blocks, so every
 * consumer connected to it loses its endpoint: their in-flight READs (of any transfer)
 * re-handshake and re-post behind a new lease lookup (-ESTALE if their lease was revoked
 * meanwhile, docs/architecture.md §3.2). A WRITE consumer whose quarantine (below) ends
 * without the producer's answer fences its writers the same way before the blocks come back
 * when a transport without per-op lease checks carries them (verbs; tcp refuses a late write
 * at the target instead), counted in stats.fences too. shm cannot be fenced by the target (a
 * peer copies with process_vm_readv/writev under the same-host, same-user trust model,
 * docs/architecture.md §3), so its writers check the consumer's lease word right before every
 * copy and publish the copy in a busy word of their own; a WRITE consumer hands revoked blocks
 * back only once no writer's busy word shows its revoked lease (stats.writer_holds counts the
 * releases put off; docs/protocol.md §5.11). A P READ over shm still relies on the consumer's
 * own lease reads (its DONE needs the lease unchanged after its last read).
 *
 * Block leases (docs/protocol.md §5.11, docs/architecture.md §3.1): the owner of the memory grants
 * a lease at kvx_xfer_serve() (P READ) or kvx_xfer_announce() (D WRITE) and revokes it when the
 * transfer ends, before its blocks are handed back. A READ consumer checks the producer's lease
 * before its first op and again after its last: a transfer whose lease was revoked (release,
 * abort, timeout) never ends DONE: it ends with the producer's status and error, which the
 * producer's kvx_failed brings (docs/protocol.md §5.10), or FAILED -ESTALE if none came by its
 * deadline; one whose lease is not granted (yet)
 * moves nothing and waits for the grant until its deadline (TIMED_OUT; the producer may serve
 * after the consumer got the ids; a restarted producer never serves its predecessor's ids). A
 * layer reported by kvx_xfer_layer_poll() is final only once the transfer is DONE. A WRITE producer checks a kvxfer consumer's lease before its first
 * write: a restarted consumer holds none of its predecessor's, so nothing is written into it.
 *
 * Endpoint errors and peer restarts (docs/protocol.md §6 item 18): when an op completes with the
 * peer's endpoint in error state (peer lost, restarted, fenced, op timeout), the poller stops
 * using the cached peer, drains its endpoint and re-handshakes (new endpoint, new remote
 * regions, the peer's current epoch); transfers submitted meanwhile wait for it.
 * stats.peer_resets counts these. A READ transfer that already moved bytes fails; one that
 * moved nothing is retried on the new endpoint only if the peer's epoch changed, where its
 * lease check decides (a restarted producer serves none of its predecessor's transfers: -ESTALE),
 * and fails with -ECONNRESET if the epoch is the same (the producer fenced it: its blocks may be
 * reused). WRITE transfers whose
 * ops failed end FAILED; later ones use the new endpoint.
 *
 * Consumer restart in WRITE mode (docs/protocol.md §6 item 18): a kvxfer consumer names the
 * incarnation that made an allocation in its `remote_blocks` (extension key `kvx_epoch`, which a
 * MoRIIO peer ignores). Before a WRITE transfer's first post the producer compares it with its
 * connection's epoch: a different epoch means the consumer restarted, so the producer
 * re-handshakes; transfers whose allocation came from the old epoch end FAILED (-ECONNRESET)
 * without writing anything into the new process, and transfers allocated by the new incarnation
 * are written on the new connection. A MoRIIO consumer sends no epoch; for it the producer
 * falls back to a guess: the connection's epoch if it completed an op in the last 20 ms, else
 * the epoch the peer reports when its metadata is fetched again (a handshake without
 * connection setup on the control lcore). That fallback can misattribute an allocation made by
 * a consumer that died and restarted on the same ports inside the window.
 *
 * Thread model (docs/architecture.md §1): one application thread (the engine's worker thread) owns the
 * engine and makes every call in this header; the calls never block except
 * kvx_xfer_layer_wait() and kvx_engine_stop(), and never allocate per submission (see below).
 * - Every polling lcore of `params.lcores` runs transfers. A transfer belongs to one polling
 *   lcore, chosen by a hash of its transfer id: the application thread pushes the
 *   transfer's descriptors (submit, layer ready, seal, abort) onto that lcore's SPSC ring,
 *   and the control lcore routes the transfer's inbound notifications (`remote_blocks`,
 *   `release`, `write_done`) to the same lcore by the same hash, with no shared state. There
 *   is one SPSC ring per (thread, thread) pair: application -> lcore k, control -> lcore k,
 *   lcore k -> application (completions), lcore k -> control (outbound notifications).
 *   kvx_engine_poll_completions() drains every lcore's ring.
 * - Peers: a handshake gives one endpoint per polling lcore (each endpoint is driven by one
 *   thread only). The control lcore publishes the peer connection (peer epoch, endpoints,
 *   remote regions, remote num_blocks) in a read-mostly RCU table (QSBR); the polling lcores
 *   look it up and announce a quiescent state once per loop iteration. A re-handshake (peer
 *   restart: new epoch; endpoint error) publishes a new connection in place of the old one,
 *   which is freed after a grace period and only once no transfer uses it.
 * - Statistics are kept per polling lcore (struct kvx_engine_lcore_stats) and per peer.
 * - No allocation per submission: params.max_transfers transfer objects, their per-layer
 *   state and 2 x max_blocks block ids each are reserved by kvx_engine_start() (the block-id
 *   arena is reserved address space, backed by pages only as transfers use it). A
 *   submission beyond max_transfers live transfers fails with -ENOBUFS (rate-limited log).
 *
 * Errors: 0 / counts or a negative errno (include/kvxfer/common.h table).
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"
#include "kvxfer/layout.h"
#include "kvxfer/mem.h"
#include "kvxfer/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Transfer id capacity including the NUL ("tx-" + uuid4 is 39 bytes). */
#define KVX_ENGINE_ID_MAX 128
/** Layer name capacity including the NUL. */
#define KVX_ENGINE_NAME_MAX 64
/** Host string capacity including the NUL (IPv4/IPv6 literal or name). */
#define KVX_ENGINE_HOST_MAX 64
/** Most KV layers per engine. */
#define KVX_ENGINE_MAX_LAYERS 512
/** Most polling lcores reported by kvx_engine_get_stats(). */
#define KVX_ENGINE_MAX_POLLERS 16
/** Most peers reported by kvx_engine_get_stats() and known at once per engine; a peer idle for
 * params.peer_idle_ms is forgotten when its slot is needed, so more distinct peers are served
 * over time. */
#define KVX_ENGINE_MAX_PEERS 64
/** Most per-pod hosts of one peer (struct kvx_engine_peer.remote_hosts). */
#define KVX_ENGINE_MAX_PODS 16

/** Idle policy of the polling lcores (docs/architecture.md §1). */
enum kvx_engine_idle {
	KVX_ENGINE_IDLE_BUSY = 0,     /**< Spin with a pause hint: lowest latency, burns the core. */
	KVX_ENGINE_IDLE_ADAPTIVE = 1, /**< Spin, back off, then sleep on an eventfd; default. */
};

/** How one transfer's layers are posted over an engine's polling lcores (issue 16,
 *  docs/performance.md §7). */
enum kvx_engine_spread {
	KVX_ENGINE_SPREAD_LAYERS = 0, /**< Default: with >= 2 polling lcores and >= 2 layers, the
	                                   transfer's owning lcore posts layer L itself when
	                                   L mod n_lcores is its own index, else hands "post layer L"
	                                   to lcore L mod n_lcores, which posts it on its own
	                                   endpoint of the connection and returns the layer's
	                                   outcome; the transfer's state stays with its owner. */
	KVX_ENGINE_SPREAD_NONE = 1,   /**< The owning lcore posts every layer of its transfers
	                                   (transfers still spread by id, FNV-1a mod n_lcores). */
};

/** Memory type of a registered layer. */
enum kvx_engine_mem {
	KVX_ENGINE_MEM_HOST = 0, /**< Host memory. */
	KVX_ENGINE_MEM_HIP = 1,  /**< HIP device memory (needs a HIP build and device). */
	KVX_ENGINE_MEM_HOSTDEV = 2, /**< Test-only mock of device memory (KVX_MEM_HOSTDEV in
	                                 kvxfer/mem.h: allocate with kvx_mem_alloc on a `hostdev`
	                                 context; the CPU never touches it, only kvx_mem copies). */
};

/** Engine parameters; initialise with kvx_engine_params_init(), then set fields. */
struct kvx_engine_params {
	enum kvx_sched_role role;      /**< Producer (prefill) or consumer (decode). */
	enum kvx_sched_mode mode;      /**< READ or WRITE (docs/protocol.md §1.2). Default WRITE. */
	const char *transport;         /**< "auto" (default), "verbs", "tcp" or "shm". */
	const char *lcores;            /**< Polling lcore list, DPDK `-l` syntax ("2,3" or "2-3"), at most
	                                    KVX_ENGINE_MAX_POLLERS; every one runs transfers (sharded by
	                                    transfer id); NULL = one poller on any CPU. */
	uint32_t control_lcore;        /**< CPU of the control lcore; KVX_LCORE_ID_ANY (UINT32_MAX) = any. */
	enum kvx_engine_idle idle;     /**< Poller idle policy. */
	bool follow_waker;             /**< ADAPTIVE: a submission that wakes a sleeping poller first
	                                    moves it to the submitting thread's CPU, where it makes
	                                    its first poll (the post) before it returns to its own
	                                    CPUs: the wake-up needs no idle CPU, which on a VM is the
	                                    slow part. Applies when that CPU is the poller's or one
	                                    the thread that called kvx_engine_start() may run on,
	                                    below 64, and the waker is not another poller
	                                    (kvx_lcore_idle_params.follow_waker, docs/performance.md
	                                    §9). Default true. */
	uint32_t poller_slice_us;      /**< ADAPTIVE: scheduler slice each poller asks for, us: a woken
	                                    poller then preempts the thread on its CPU at once (with
	                                    follow_waker, the submitter, which may go on computing)
	                                    instead of after that thread's slice. 0 = the kernel's
	                                    default slice; else 100..100000. Default 100. Honoured by
	                                    Linux >= 6.12 under SCHED_OTHER; ignored by older kernels
	                                    (kvx_lcore_idle_params.slice_us, docs/performance.md
	                                    §11). */
	const char *host;              /**< Advertised IP of this engine; not NULL ("127.0.0.1" for tests). */
	uint16_t handshake_port;       /**< Handshake base port (default 6301); 0 = ephemeral (tests). */
	uint16_t notify_port;          /**< Notify base port (default 61005); 0 = ephemeral (tests). */
	uint32_t dp_rank;              /**< Global DP rank of this worker, < dp_size. */
	uint32_t dp_size;              /**< DP size, > 0. */
	uint32_t dp_size_local;        /**< DP ranks per pod; 0 = single pod (docs/protocol.md §2.1). */
	uint32_t tp_rank;              /**< TP rank, < tp_size. */
	uint32_t tp_size;              /**< TP size, > 0. */
	uint32_t total_kv_heads;       /**< The model's KV heads over all TP ranks (heterogeneous-TP
	                                    guard, docs/protocol.md §4.5); 0 = layers' num_kv_heads x
	                                    tp_size, which is right only when heads are not
	                                    replicated (tp_size <= heads). */
	uint32_t handshake_timeout_ms; /**< Handshake deadline from its start, ms (default 10000). */
	uint32_t transfer_timeout_ms;  /**< Per-transfer deadline on both sides, ms (default 30000). */
	uint32_t defer_timeout_ms;     /**< P: free deadline without ACK, ms (default 60000). */
	const char *proxy_addr;        /**< "ip:port" of the proxy heartbeat ROUTER, or NULL for none. */
	const char *http_addr;         /**< "ip:port" advertised in the heartbeat; NULL if no proxy. */
	bool vllm_port_compat;         /**< Use vLLM's `dp + tp` port offset instead of `dp*tp_size + tp`. */
	uint32_t max_transfers;        /**< Live transfers (submitted, last completion not yet polled),
	                                    1..2^20 (default 1024); objects preallocated at start. */
	uint32_t max_blocks;           /**< Most blocks in one transfer, 1..2^24 (default 8192);
	                                    2 x max_blocks x 4 bytes of block-id space reserved per
	                                    transfer object. */
	uint16_t data_port;            /**< tcp provider: port of its data listener (bound on @c host);
	                                    0 = chosen by the kernel (default). Set it, with the two base
	                                    ports, when a firewall must open a fixed set of ports
	                                    (docs/operations.md §1). Ignored by verbs and shm. */
	const char *verbs_device;      /**< verbs: RDMA device to open (e.g. "mlx5_0", as perftest's -d);
	                                    NULL = the first with an ACTIVE port. Copied; < 64 bytes. */
	const char *metrics_addr;      /**< Prometheus text-format endpoint `GET /metrics`: "IP:PORT",
	                                    "[IPv6]:PORT" or ":PORT" (every interface; PORT 0 = chosen by
	                                    the kernel, see kvx_engine_metrics_addr()); NULL = off
	                                    (default). Served from kvx_engine_start() to
	                                    kvx_engine_stop() by a thread of its own that only reads
	                                    snapshots the application thread publishes when it polls
	                                    completions (at most every 100 ms); needs a build with
	                                    libmicrohttpd (else kvx_engine_create() fails with
	                                    -ENOTSUP). Copied. Metric names: docs/operations.md §6. */
	const char *auth_dir;          /**< CURVE authentication of the handshake, notify and proxy
	                                    sockets (issue 17): a directory made by `kvxfer-perf keygen
	                                    DIR` (DIR/engine.key_secret = this engine's key pair,
	                                    DIR/allowed/NAME.key = public keys of the peers allowed to
	                                    connect; allowed/HOST.key or the only key there is the key
	                                    expected when dialling HOST). Peers must use it too.
	                                    allowed/ is read again when files are added, removed
	                                    or renamed there, so keys count without a restart.
	                                    NULL (default) = unauthenticated, MoRIIO-compatible: a
	                                    warning is logged when the ports are not loopback-only. */
	uint32_t control_busy_poll_us; /**< After control-plane activity (a notification or handshake
	                                    handed over, a message received), the control lcore keeps
	                                    polling its inboxes and sockets this long, µs, yielding
	                                    the CPU between looks, before it sleeps: the answer to a
	                                    notification (`write_done` -> `release`) then needs no
	                                    wake-up of the control thread. 0..1000000; default 100;
	                                    0 = sleep at once. An idle engine is not affected (no
	                                    activity, no polling). docs/performance.md §8. */
	uint32_t peer_idle_ms;         /**< A peer worker with no live transfer for longer than this,
	                                    ms, may be forgotten (its connection closed) when its slot
	                                    is needed for a new peer; the slot is reused once no
	                                    reference to the old connection remains (after an RCU grace
	                                    period), so a submission naming a new peer while every
	                                    slot is busy or still draining gets -ENOBUFS and may be
	                                    retried. Default 60000; 0 = as soon as it has none. A
	                                    forgotten peer named again is handshaken again. */
	enum kvx_engine_spread spread; /**< Layer spread over the polling lcores (default
	                                    KVX_ENGINE_SPREAD_LAYERS; docs/performance.md §7 says
	                                    why, from measurements). */
};

/** A KV layer to register (docs/protocol.md §4.1). */
struct kvx_engine_layer {
	const char *name;               /**< Layer name, unique, 1..KVX_ENGINE_NAME_MAX-1 bytes; peers must agree. */
	void *base;                     /**< Address of element 0; not NULL. */
	struct kvx_layout_tensor tensor; /**< Shape/strides in elements, element size. */
	struct kvx_layout_spec spec;    /**< KV-cache spec (block size, heads, head size, MLA). */
	enum kvx_engine_mem mem;        /**< Memory type. Device layers are registered with the
	                                     provider as device memory (tcp: staged through bounce
	                                     buffers; shm: IPC handles; verbs: dma-buf or peer
	                                     memory); a provider that cannot move it fails
	                                     kvx_engine_start() with the reason logged. `auto` with a
	                                     device layer uses its primary provider only (no shm). */
	int device_id;                  /**< HIP device for KVX_ENGINE_MEM_HIP (0 otherwise). */
};

/**
 * Where a peer worker listens (one DP rank of the peer instance).
 *
 * Multi-pod (Wide-EP) peers (docs/protocol.md §5.8, vector T39): ranks
 * `[k*dp_size_local, (k+1)*dp_size_local)` live on `remote_hosts[k]`; the handshake, the
 * notifications of the transfer and the producer's `write_done` (to the decode DP rank named
 * in `remote_blocks`) go to `remote_hosts[pod_index(rank, dp_size_local)]` when that index is
 * in range, else to @c host, on the port of `fold_local_rank(rank, dp_size_local)`. The hosts
 * are copied at submission and are part of the peer's identity: each transfer keeps the
 * routing it was submitted with, whatever later transfers name.
 */
struct kvx_engine_peer {
	const char *host;          /**< Peer host; the fallback for ranks outside remote_hosts. */
	uint16_t handshake_port;   /**< Peer handshake base port. */
	uint16_t notify_port;      /**< Peer notify base port. */
	uint32_t dp_rank;          /**< Peer DP rank the transfer targets (global). */
	uint32_t dp_size_local;    /**< Peer DP ranks per pod (0 = single pod). */
	uint32_t tp_size;          /**< Peer TP size (0 = same as local). */
	const char *const *remote_hosts; /**< Array[num_remote_hosts] per-pod hosts, or NULL. */
	uint32_t num_remote_hosts; /**< Entries in remote_hosts, 0..KVX_ENGINE_MAX_PODS. */
};

/** D READ: read a request's blocks from P (docs/protocol.md §1.4 steps 7–10). */
struct kvx_engine_read {
	const char *transfer_id;        /**< Transfer id; not NULL. */
	struct kvx_engine_peer peer;    /**< The producer worker. */
	const uint32_t *local_blocks;   /**< Array[n] destination block ids (position-paired, see kvx_plan_pair_by_position()). */
	const uint32_t *remote_blocks;  /**< Array[n] source block ids on P. */
	size_t n;                       /**< Pairs; 0 = full prefix hit: `release` only, no RDMA. */
};

/** D WRITE: announce the blocks allocated for a transfer (docs/protocol.md §1.3 step 5b). */
struct kvx_engine_announce {
	const char *transfer_id;       /**< Transfer id; not NULL. */
	struct kvx_engine_peer peer;   /**< The producer instance (remote_blocks goes to its TP ranks). */
	const uint32_t *local_blocks;  /**< Array[n] destination block ids. */
	size_t n;                      /**< Blocks; 0 = full prefix hit: sends `release` instead. */
	bool notified;                 /**< The scheduler process sent `remote_blocks` for this
	                                    transfer (kvx_notifier_announce(), as MoRIIO's scheduler
	                                    half does): the engine sends nothing at submission and only
	                                    awaits `write_done`; must have n > 0. Default false. */
};

/** P WRITE: start a push transfer (docs/protocol.md §1.3 steps 8–11). */
struct kvx_engine_write {
	const char *transfer_id;       /**< Transfer id; not NULL. */
	struct kvx_engine_peer peer;   /**< The consumer instance (dp_rank = decode DP rank). */
	const uint32_t *local_blocks;  /**< Array[n] source block ids (whole prompt). */
	size_t n;                      /**< Blocks, > 0. */
};

/** P READ: make a transfer's blocks readable until `release` (docs/protocol.md §1.4 steps 3, 11–12). */
struct kvx_engine_serve {
	const char *transfer_id;       /**< Transfer id; not NULL. */
	const uint32_t *local_blocks;  /**< Array[n] block ids the consumer will read. */
	size_t n;                      /**< Blocks, > 0. */
	uint32_t consumer_tp_size;     /**< D TP size (fan-in: expected `release` count), 0 = same as local. */
};

/** Completion kinds. */
enum kvx_cpl_kind {
	KVX_CPL_TRANSFER = 1,        /**< The transfer is terminal (see status). */
	KVX_CPL_BLOCKS_RELEASED = 2, /**< The transfer's local blocks may be reused now. */
};

/** Terminal status of a transfer. */
enum kvx_cpl_status {
	KVX_CPL_DONE = 0,      /**< Every byte landed (D) / every write landed and was notified (P). */
	KVX_CPL_FAILED = 1,    /**< An op or the peer failed; see error. */
	KVX_CPL_ABORTED = 2,   /**< kvx_xfer_abort() or the peer's abort. */
	KVX_CPL_TIMED_OUT = 3, /**< transfer_timeout / handshake_timeout / defer_timeout passed. */
};

/** One completion (kvx_engine_poll_completions()). */
struct kvx_completion {
	char transfer_id[KVX_ENGINE_ID_MAX]; /**< Transfer id. */
	enum kvx_cpl_kind kind;               /**< What completed. */
	enum kvx_sched_role role;             /**< This engine's role. */
	enum kvx_cpl_status status;           /**< Outcome (KVX_CPL_TRANSFER); DONE for BLOCKS_RELEASED. */
	int error;                            /**< 0, or the negative errno behind FAILED/TIMED_OUT. */
	uint64_t bytes;                       /**< Bytes moved by this engine for the transfer. */
	uint64_t duration_ns;                 /**< Submission to terminal state, ns. */
	uint64_t first_layer_ns;              /**< Submission to the first layer whose ops all completed
	                                           on this engine (READ: landed here; WRITE: written), ns;
	                                           0 when this engine moved no whole layer (a producer
	                                           serving READs, a transfer that failed first). */
};

/** Per polling lcore statistics. */
struct kvx_engine_lcore_stats {
	uint32_t lcore_id;       /**< CPU id. */
	uint64_t bytes;          /**< Bytes moved by ops this lcore posted. */
	uint64_t ops;            /**< Ops (merged ranges) posted. */
	uint64_t transfers;      /**< Transfers finished on this lcore. */
	uint64_t failures;       /**< Transfers that failed or timed out. */
	double utilization;      /**< Busy polls / all polls since start, 0..1. */
	uint64_t sleeps;         /**< Idle sleeps ended since start (adaptive policy): an idle
	                              engine with nothing due adds none. */
	uint64_t wakeups;        /**< Of those, ended by a submission, a control message, a socket
	                              or a stop (the others by its deadline scan timer). */
};

/** Per peer statistics. */
struct kvx_engine_peer_stats {
	char host[KVX_ENGINE_HOST_MAX]; /**< Peer host. */
	uint16_t port;                   /**< Peer notify port. */
	uint32_t dp_rank;                /**< Peer DP rank. */
	uint64_t bytes, ops, transfers, failures; /**< As in struct kvx_engine_lcore_stats. */
};

/** Engine statistics snapshot. */
struct kvx_engine_stats {
	uint32_t n_lcores;  /**< Valid entries in lcores[]. */
	struct kvx_engine_lcore_stats lcores[KVX_ENGINE_MAX_POLLERS];
	uint32_t n_peers;   /**< Valid entries in peers[]. */
	struct kvx_engine_peer_stats peers[KVX_ENGINE_MAX_PEERS];
	uint64_t transfers_done, transfers_failed, transfers_aborted, transfers_timed_out;
	uint64_t duplicates_rejected;   /**< Transfer ids rejected with -EEXIST. */
	uint64_t late_notifications;    /**< Notifications for terminal transfers, dropped. */
	uint64_t quarantined;           /**< Block frees held back while ops could be in flight. */
	uint64_t notifications_sent;    /**< Notify frames handed to the control plane's DEALERs. */
	uint64_t notifications_received; /**< Valid notifications received. */
	uint64_t fences;                /**< Fences: target endpoints torn down at a P READ defer timeout or a D WRITE quarantine expiry. */
	uint64_t peer_resets;           /**< Peers whose endpoint entered error state (re-handshaken). */
	uint64_t writer_holds;          /**< D WRITE block releases put off because a producer's shm copy
	                                     under the revoked lease was still running (its busy word,
	                                     docs/protocol.md §5.11); released at a later tick. */
	uint64_t data_auth_refused;     /**< tcp data plane: connections to this engine's data listener
	                                     closed because their hello did not name an endpoint of it
	                                     or did not prove the endpoint's secret (the transport's
	                                     kvx_xport_counters.auth_refused; 0 for shm and verbs). */
};

struct kvx_engine;

/**
 * Fill @p p with defaults: WRITE consumer, transport "auto", adaptive idle with follow_waker,
 * host 127.0.0.1, ports 6301/61005, dp/tp 0 of 1, timeouts 10 s / 30 s / 60 s, 1024 transfers, 8192 blocks.
 * @param p  Parameters; not NULL.
 */
KVX_API void kvx_engine_params_init(struct kvx_engine_params *p);

/**
 * Create an engine (validates, allocates; starts no thread).
 *
 * @param p          Parameters; not NULL; strings are copied.
 * @param[out] out   New engine; not NULL.
 * @param[out] err   If non-NULL, receives a message naming the invalid field and why.
 * @param errlen     Size of @p err, bytes.
 * @return           0 on success.
 * @retval -EINVAL   A field is invalid (role, mode, transport, lcores, ranks, sizes, timeouts
 *                   0, host NULL, proxy_addr malformed); @p err names it.
 * @retval -ENOTSUP  The transport was not built or is unavailable (e.g. verbs without RDMA).
 * @retval -ENOMEM   Allocation failed.
 * @par Thread safety  Any thread. @par Context Control path.
 */
KVX_API int kvx_engine_create(const struct kvx_engine_params *p, struct kvx_engine **out, char *err,
			      size_t errlen);

/**
 * Register one KV layer (before kvx_engine_start()). The layer order is the registration order
 * and must match the peer's.
 *
 * @param e  Engine; not NULL. @param l Layer; not NULL; the name is copied.
 * @return   The layer index (0..KVX_ENGINE_MAX_LAYERS-1) used by per-layer calls.
 * @retval -EINVAL  Bad geometry (message logged, as kvx_layout_geometry()), NULL base, duplicate
 *                  name, num_blocks different from the first layer's.
 * @retval -EBUSY   The engine is started.
 * @retval -ENOBUFS KVX_ENGINE_MAX_LAYERS reached.
 * @retval -ENOTSUP Memory type not supported by the transport.
 */
KVX_API int kvx_engine_register_layer(struct kvx_engine *e, const struct kvx_engine_layer *l);

/**
 * Start the lcores, bind the handshake and notify listeners, start the heartbeat; preallocate
 * the transfer objects (params.max_transfers) and their block-id space.
 * @param e  Engine; not NULL; layers registered.
 * @return 0, -EINVAL (no layer registered, or more than KVX_ENGINE_MAX_POLLERS polling lcores),
 *         -EADDRINUSE (port bound), -EBUSY (already started), -ENOMEM (preallocation), or the
 *         errno of the failing module.
 * @par Thread safety  Application thread. @par Context  Control path (creates threads).
 */
KVX_API int kvx_engine_start(struct kvx_engine *e);

/**
 * Stop: live transfers end as KVX_CPL_ABORTED completions, lcores are joined. Blocks.
 * @param e Engine; not NULL. Idempotent.
 */
KVX_API void kvx_engine_stop(struct kvx_engine *e);

/** Destroy (stops first if needed); NULL is a no-op. @param e Engine. */
KVX_API void kvx_engine_destroy(struct kvx_engine *e);

/**
 * Bound handshake and notify base ports (useful with ephemeral ports, params ports 0).
 *
 * @param e                    Engine; not NULL.
 * @param[out] handshake_port  Handshake ROUTER port, or NULL.
 * @param[out] notify_port     Notify ROUTER port, or NULL.
 * @return                     0 on success.
 * @retval -EAGAIN             Before kvx_engine_start() returned.
 * @par Thread safety  Any thread after start.
 */
KVX_API int kvx_engine_ports(const struct kvx_engine *e, uint16_t *handshake_port, uint16_t *notify_port);

/**
 * D READ: read a request's blocks from a producer (docs/protocol.md §1.4 steps 7–10, §6 items 8–10).
 * The remote num_blocks comes from the handshake. Completion: one KVX_CPL_TRANSFER; `release`
 * is sent to P when every op is terminal (done or failed), never after a timeout (the peer's
 * endpoints are torn down instead, then the blocks leave quarantine).
 *
 * @return 0 accepted; -EEXIST duplicate transfer id (the first is unaffected); -EINVAL bad
 *         request (n > max_blocks, block id out of range, NULL arrays); -ENOBUFS max_transfers
 *         live transfers (message logged, rate-limited) or the owning lcore's ring is full
 *         (either way nothing is kept: retry with the same id);
 *         -EBUSY wrong role/mode or engine not started.
 * @par Context  Non-blocking (ring enqueue); no allocation (preallocated transfer objects).
 */
KVX_API int kvx_xfer_read(struct kvx_engine *e, const struct kvx_engine_read *r);

/**
 * D: is layer @p layer of a READ transfer complete (all its bytes landed)?
 * @return 1 complete, 0 in flight, negative errno if the transfer failed (-EIO, -ETIMEDOUT,
 *         -ECANCELED) or is unknown (-ENOENT).
 * @par Context Non-blocking; may be called from any one thread at a time.
 */
KVX_API int kvx_xfer_layer_poll(struct kvx_engine *e, const char *transfer_id, uint32_t layer);

/**
 * D: wait until layer @p layer of a READ transfer is complete (docs/protocol.md §1.4 step 9), so
 * compute on that layer can start while later layers are in flight.
 * The caller sleeps on the engine's waiter (an eventfd, include/kvxfer/lcore.h) that the
 * polling lcore signals when a layer lands or a transfer ends (docs/protocol.md §6 item 1): no
 * polling loop; a wake for another layer or transfer costs one re-check.
 * @param timeout_ms  Upper bound, ms.
 * @return 0 complete (the layer's bytes are visible), -ETIMEDOUT, or as kvx_xfer_layer_poll();
 *         -EBUSY if the engine was never started.
 * @par Thread safety  One thread at a time per engine (the waiter has one consumer).
 * @par Context  Blocking (ppoll on the eventfd).
 */
KVX_API int kvx_xfer_layer_wait(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				uint32_t timeout_ms);

/**
 * D WRITE: announce the blocks allocated for a transfer: `remote_blocks` to every P TP rank of
 * the target DP rank (docs/protocol.md §1.3 step 5b, §5.8); an empty list sends `release` instead.
 * Completion: KVX_CPL_TRANSFER when `write_done` arrives, or TIMED_OUT after transfer_timeout.
 * @return As kvx_xfer_read().
 */
KVX_API int kvx_xfer_announce(struct kvx_engine *e, const struct kvx_engine_announce *a);

/**
 * Scheduler-side notifier (D WRITE): sends `remote_blocks` / `release` from a process that runs
 * no engine, the way MoRIIO's scheduler half does (docs/protocol.md §1.3 step 5b and its abort
 * paragraph), while the decode workers' engines only await `write_done`
 * (kvx_engine_announce.notified). Owns a control thread and its notify DEALERs (CURVE with
 * auth_dir); it binds its two listeners on ephemeral loopback ports and serves nothing on them.
 */
struct kvx_notifier;

/**
 * Create and start a notifier for one D DP rank's scheduler.
 *
 * @param p          Parameters of this decode instance; used: role (consumer), mode (WRITE), host,
 *                   dp_rank, dp_size, dp_size_local, tp_size (sent as the consumer TP size of
 *                   `release`), vllm_port_compat (port arithmetic towards the producer), auth_dir;
 *                   the rest is ignored. Not NULL; strings are copied.
 * @param[out] out   New notifier; not NULL.
 * @param[out] err   If non-NULL, receives a message naming the invalid field.
 * @param errlen     Size of @p err, bytes.
 * @return           0 on success.
 * @retval -EINVAL   Not a WRITE consumer, bad ranks/sizes, NULL host; @p err names the field.
 * @retval -ENOMEM   Allocation failed; or the errno of the control thread's start (auth keys).
 * @par Thread safety  Any thread. @par Context  Control path (creates a thread).
 */
KVX_API int kvx_notifier_create(const struct kvx_engine_params *p, struct kvx_notifier **out, char *err,
				size_t errlen);

/**
 * Send the blocks a D DP rank allocated for a transfer: `remote_blocks` (block ids @p a->local_blocks,
 * `decode_rank` = params.dp_rank, no `kvx_epoch`: the producer settles the consumer's incarnation
 * as for a MoRIIO consumer) to every producer TP rank of @p a->peer's DP rank; with n = 0 (full
 * prefix hit, or a request aborted before allocation) `release` instead. Fire and forget, as
 * MoRIIO: an unreachable producer is logged (rate-limited) by the control thread, not reported.
 *
 * @param nt      Notifier; not NULL.
 * @param a       Announcement (transfer_id, peer, local_blocks, n; notified is ignored); not NULL.
 * @param req_id  The decode request id, sent as `req_id` of `remote_blocks` (MoRIIO producers
 *                also key the allocation on it); NULL = "". At most 511 bytes.
 * @return 0 queued; -EINVAL bad transfer id or req_id, NULL arrays, block id > INT32_MAX,
 *         n > params.max_blocks; -ENOBUFS the control thread's inbox is full (retry; ranks
 *         already queued get the message again, which a producer ignores: -EEXIST, counted late).
 * @par Thread safety  One thread at a time (the scheduler thread). @par Context  Non-blocking.
 */
KVX_API int kvx_notifier_announce(struct kvx_notifier *nt, const struct kvx_engine_announce *a,
				  const char *req_id);

/**
 * Stop the control thread (queued messages are flushed for a bounded time) and free.
 * @param nt Notifier; NULL is a no-op.
 */
KVX_API void kvx_notifier_destroy(struct kvx_notifier *nt);

/**
 * P WRITE: begin a push transfer (blocks and destination). Writes are posted per layer once
 * the layer is ready and D's `remote_blocks` has arrived (deferred up to defer_timeout).
 * @return As kvx_xfer_read().
 */
KVX_API int kvx_xfer_write_begin(struct kvx_engine *e, const struct kvx_engine_write *w);

/**
 * P WRITE: layer @p layer of transfer @p transfer_id is computed, gated by a host flag. If
 * @p ready is non-NULL the polling lcore posts the layer's writes only after it reads a
 * non-zero value (acquire load; publish it with a release store after the layer's data is
 * written). Equivalent to kvx_xfer_layer_ready_event() with a flag event; kept for callers
 * with a 32-bit flag. Duplicates (same transfer, same layer) are no-ops.
 *
 * @param e            Engine; not NULL.
 * @param transfer_id  Transfer id of a live kvx_xfer_write_begin() transfer; not NULL.
 * @param layer        Layer index, < registered layers.
 * @param ready        Flag, or NULL (ready now); must stay valid until the transfer's
 *                     KVX_CPL_TRANSFER completion was polled.
 * @return             0 queued.
 * @retval -ENOENT     Unknown or terminal transfer.
 * @retval -EINVAL     Layer out of range, NULL e / transfer_id.
 * @retval -ENOBUFS    Submission ring full; retry.
 * @retval -EBUSY      Engine not started or stopped.
 * @par Thread safety  Application thread. @par Context  Non-blocking (ring enqueue).
 * @par Source  docs/protocol.md §1.3 step 8 (WRITE per layer), docs/architecture.md §1 (gate on layer-ready).
 */
KVX_API int kvx_xfer_layer_ready(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				 const atomic_uint *ready);

/**
 * P WRITE: layer @p layer of transfer @p transfer_id becomes ready when @p ev completes.
 *
 * The event is copied into the submission (no allocation). The polling lcore that owns the
 * transfer queries it with kvx_mem_event_query() once per loop iteration while the layer is
 * pending — never blocking, never synchronizing a stream — and posts the layer's WRITEs only
 * after a query returned ready. Accepted kinds (include/kvxfer/mem.h):
 * - KVX_MEM_EVENT_READY (or @p ev NULL): ready now;
 * - KVX_MEM_EVENT_FLAG (kvx_mem_event_init_flag()): a host counter reaching a threshold;
 * - KVX_MEM_EVENT_HIP (kvx_mem_event_init_hip()): a hipEvent_t recorded after the layer's
 *   kernels, polled with hipEventQuery. A query error fails the transfer (KVX_CPL_FAILED with
 *   that errno, writes already posted drain first).
 * A stream event (KVX_MEM_EVENT_STREAM) belongs to its stream's thread and is refused.
 * Duplicates (same transfer, same layer) are no-ops.
 *
 * @param e            Engine; not NULL.
 * @param transfer_id  Transfer id of a live kvx_xfer_write_begin() transfer; not NULL.
 * @param layer        Layer index, < registered layers.
 * @param ev           Event, or NULL; its counter / hipEvent_t must stay valid until the
 *                     transfer's KVX_CPL_TRANSFER completion was polled.
 * @return             0 queued.
 * @retval -ENODEV     A hipEvent_t on a host without a usable HIP device (message logged,
 *                     e.g. "no HIP device"); nothing is queued, the transfer is unaffected.
 * @retval -ENOTSUP    A hipEvent_t with a build without HIP (message logged).
 * @retval -EINVAL     Layer out of range, unknown or stream event kind, NULL counter/handle.
 * @retval -ENOENT     Unknown or terminal transfer.
 * @retval -ENOBUFS    Submission ring full; retry.
 * @retval -EBUSY      Engine not started or stopped.
 * @par Thread safety  Application thread. @par Context  Non-blocking (ring enqueue); the
 *                     first hipEvent_t call probes the HIP runtime once (slow path).
 * @par Source  Issue #8 (layer-ready events), docs/protocol.md §1.3 step 8, docs/architecture.md §1.
 */
KVX_API int kvx_xfer_layer_ready_event(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				       const struct kvx_mem_event *ev);

/**
 * P WRITE: shorthand for kvx_xfer_layer_ready_event() with a hipEvent_t (passed as `void *`,
 * so this header needs no HIP include).
 *
 * @param e            Engine; not NULL.
 * @param transfer_id  Transfer id; not NULL.
 * @param layer        Layer index, < registered layers.
 * @param hip_event    The producer's hipEvent_t, recorded after the layer's kernels; not NULL.
 * @return             0 queued.
 * @retval -ENOTSUP    Built without HIP (message logged).
 * @retval -ENODEV     No usable HIP device on this host (message logged).
 * @retval -EINVAL / -ENOENT / -ENOBUFS / -EBUSY  As kvx_xfer_layer_ready_event().
 * @par Thread safety  Application thread. @par Context  Non-blocking after the first call.
 * @par Source  Issue #8, include/kvxfer/mem.h (kvx_mem_event_init_hip()).
 */
KVX_API int kvx_xfer_layer_ready_hip(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				     void *hip_event);

/**
 * P WRITE: seal the write count at the end of prefill: the transfer completes once the
 * @p n_layers distinct layers marked ready are written; then `write_done` is sent once.
 * @return 0, -ENOENT unknown transfer, -EINVAL n_layers is 0 or > registered layers.
 */
KVX_API int kvx_xfer_seal(struct kvx_engine *e, const char *transfer_id, uint32_t n_layers);

/**
 * P READ: serve a transfer's blocks until the consumer's `release` (fan-in over the consumer
 * TP ranks) or defer_timeout; then KVX_CPL_TRANSFER and KVX_CPL_BLOCKS_RELEASED. After a
 * defer_timeout (TIMED_OUT) the release follows only once the readers are fenced at the wire
 * (see "Reader fence" in the file overview: every connected consumer re-handshakes).
 * @return As kvx_xfer_read().
 */
KVX_API int kvx_xfer_serve(struct kvx_engine *e, const struct kvx_engine_serve *s);

/**
 * Abort a transfer (either role). D sends `release` to P in both modes; its blocks are
 * released (KVX_CPL_BLOCKS_RELEASED) only once no op can touch them any more: READ — its own
 * reads are terminal; WRITE — P answered with `write_done` (P stops posting and answers once
 * its writes are terminal) or defer_timeout passed. To release P for a transfer that was never
 * allocated, submit it with n = 0 (kvx_xfer_read() / kvx_xfer_announce()).
 *
 * @param e            Engine; not NULL.
 * @param transfer_id  Transfer id; not NULL.
 * @return             0 queued.
 * @retval -ENOENT     Unknown or already terminal (completion polled) transfer.
 * @retval -ENOBUFS    Submission ring full; retry.
 * @retval -EBUSY      Engine not started or stopped.
 * @par Context  Non-blocking.
 */
KVX_API int kvx_xfer_abort(struct kvx_engine *e, const char *transfer_id);

/**
 * Collect completions (burst).
 * @param out  Array[n] completions. @param n Capacity.
 * @return Number written, 0..n.
 * @par Context Non-blocking.
 */
KVX_API size_t kvx_engine_poll_completions(struct kvx_engine *e, struct kvx_completion *out, size_t n);

/**
 * Read statistics (per lcore, per peer, totals).
 * @param e Engine. @param[out] st Snapshot; not NULL.
 */
KVX_API void kvx_engine_get_stats(const struct kvx_engine *e, struct kvx_engine_stats *st);

/**
 * Address the metrics endpoint listens on (params.metrics_addr with the port actually bound).
 *
 * @param e          Engine; not NULL.
 * @param[out] buf   "IP:PORT" or "[IPv6]:PORT", NUL-terminated; not NULL.
 * @param len        Size of @p buf, bytes (64 is enough).
 * @return           0.
 * @retval -ENOENT   The engine has no metrics endpoint (params.metrics_addr NULL).
 * @retval -EAGAIN   Before kvx_engine_start() returned 0.
 * @par Thread safety  Application thread. @par Context  Control path.
 */
KVX_API int kvx_engine_metrics_addr(const struct kvx_engine *e, char *buf, size_t len);

/**
 * Transport provider this engine actually uses (docs/architecture.md §3, `auto` rule).
 *
 * With `transport` "verbs", "tcp" or "shm" every peer connection uses that provider. With
 * "auto" the engine opens verbs if a usable RDMA device exists, else tcp; without verbs it also
 * opens shm when CMA is permitted, and each handshake offers shm first, then tcp: the
 * responding engine takes shm only if its shm provider accepts the peer (same boot id, i.e.
 * same host, and CMA readable), else tcp, and both ends use the provider it chose. Setting the
 * environment variable `KVX_ENGINE_AUTO_NO_SHM=1` before kvx_engine_start() keeps `auto` off
 * shm (tcp for same-host peers too); so do HIP layers (CMA reads host memory only).
 *
 * @param e  Engine; NULL returns NULL.
 * @return Static string: before kvx_engine_start(), the requested name ("auto", ...); after it,
 *         the primary provider ("verbs" or "tcp" for auto) until a peer connection is set up,
 *         then the provider of the most recent peer connection set up by either side
 *         ("verbs", "tcp" or "shm").
 * @par Thread safety  Safe from any thread (atomic read). @par Context  Control path.
 * @par Source  docs/architecture.md §3 (providers, `auto`).
 */
KVX_API const char *kvx_engine_transport_name(const struct kvx_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* KVX_ENGINE_H */
