/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_INTERNAL_CTL_H
#define KVX_INTERNAL_CTL_H
/**
 * @file
 * @internal
 * The control lcore object (`struct kvx_ctl`, layer 3 of kvxfer/control.h): one thread owning
 * every ZMQ socket of a worker, fed by the other threads through SPSC inboxes. Used by the
 * engine, the benchmarks and the tests; not installed, and its functions are not exported by
 * libkvxfer.so (no KVX_API). kvxfer/control.h includes it in-tree.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/control.h"
#include "kvxfer/internal/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Default proxy heartbeat period, ms (docs/protocol.md §3.7 PING_INTERVAL). */
#define KVX_CTL_DEFAULT_HEARTBEAT_MS 3000
/** Size of the terminal-transfer LRU (docs/protocol.md §3.7 _MAX_TERMINAL_TRANSFER_IDS). */
#define KVX_CTL_TERMINAL_LRU 4096
/** Default bound of the DEALER cache (peer paths kept open). */
#define KVX_CTL_DEFAULT_MAX_PEERS 256
/** Default handshake deadline, ms (docs/protocol.md Appendix A item 9, BR handshake_timeout). */
#define KVX_CTL_DEFAULT_HANDSHAKE_MS 10000
/** Payload bytes stored inline in an inbox slot; larger sends allocate (slow path). */
#define KVX_CTL_INLINE_BYTES 1024
/** Number of per-peer counter entries; later peers share the last ("other") entry. */
#define KVX_CTL_PEER_STATS_MAX 64
/** Raw fds one control lcore may watch at once (kvx_ctl_watch_fd()). */
#define KVX_CTL_WATCH_MAX 8

/* ------------------------------------------------------------------------------------------ */
/* Control lcore                                                                              */
/* ------------------------------------------------------------------------------------------ */

struct kvx_lcore;     /**< An lcore of the lcore module (include/kvxfer/lcore.h). */
struct kvx_ctl;       /**< Control lcore object (opaque). */
struct kvx_ctl_inbox; /**< One producer thread's lock-free channel into the control lcore. */

/**
 * Inbound notification handler (runs on the control thread). Called once per accepted message,
 * after validation and after the terminal-LRU filter: a message whose transfer id was marked
 * terminal (kvx_ctl_mark_terminal()) is counted in `dropped_terminal` and not delivered, except
 * a kvxfer peer's `kvx_status_query` and its `remote_blocks` naming an epoch (`kvx_epoch`),
 * which the engine answers from its record of the finished transfer. Mark a READ transfer terminal only after its last expected `release` (fan-in,
 * kvx_ctl_expected_acks()), or later ACKs are dropped. @p msg and its block_ids are valid only
 * during the call: copy what you keep. Must not block (forward into your own ring).
 */
typedef void (*kvx_ctl_notify_fn)(void *arg, const struct kvx_msg_notify *msg);

/**
 * Listener-side connection-setup handler (runs on the control thread): consume blob A from an
 * initiator, produce blob B. *len_b is the capacity of blob_b on input (KVX_MSG_BLOB_MAX) and
 * the bytes written on output. Return 0, or a negative errno that is sent back to the
 * initiator as the reply status (the initiator's handshake then fails at stage "connecting
 * transport").
 */
typedef int (*kvx_ctl_connect_fn)(void *arg, const uint8_t *blob_a, size_t len_a,
				  uint8_t *blob_b, size_t *len_b);

/**
 * Initiator-side producer of blob A for one remote DP rank (runs on the control thread, after
 * that rank's metadata and region map were received and decoded). Write at most @p cap bytes
 * into blob_a and set *len_a. Return 0 or a negative errno (the rank then fails at stage
 * "preparing transport").
 */
typedef int (*kvx_ctl_blob_fn)(void *arg, uint32_t dp_rank, const struct kvx_msg_meta *remote,
			       uint8_t *blob_a, size_t cap, size_t *len_a);

/** Per-rank outcome of a handshake job (valid only during the completion callback). */
struct kvx_ctl_hs_rank {
	uint32_t dp_rank;                    /**< Remote global DP rank. */
	int status;                          /**< 0, or -ETIMEDOUT / -EPROTO / -ECONNRESET / the connect status. */
	const char *stage;                   /**< On error: "connecting", "receiving agent metadata", "receiving KV-cache metadata", "preparing transport", "connecting transport"; "" on success. */
	char host[KVX_CTL_HOST_MAX + 1];     /**< Host dialled. */
	uint16_t port;                       /**< Port dialled. */
	const struct kvx_msg_meta *meta;     /**< Decoded metadata (a) on success, else NULL. */
	const struct kvx_msg_layers *layers; /**< Decoded region map (b) on success, else NULL. */
	const uint8_t *blob_b;               /**< Blob B from the listener on success, Array[blob_b_len]; NULL without connection setup. */
	size_t blob_b_len;                   /**< Blob B length, bytes. */
};

/** Outcome of a handshake job, passed to kvx_ctl_hs_done_fn. */
struct kvx_ctl_hs_result {
	int status;                          /**< 0 only if EVERY requested rank completed the full exchange; else the first failed rank's status. */
	char error[512];                     /**< On failure, e.g. "dp rank 1 (127.0.0.1:6302): timed out receiving agent metadata". */
	uint64_t start_ns;                   /**< kvx_now_ns() when the job started running (its deadline counts from here). */
	uint64_t end_ns;                     /**< kvx_now_ns() at completion. */
	uint32_t num_ranks;                  /**< Entries in ranks. */
	const struct kvx_ctl_hs_rank *ranks; /**< Array[num_ranks], in dial order. */
	uint64_t cookie;                     /**< kvx_ctl_hs_params.cookie. */
};

/**
 * Handshake completion (runs on the control thread). Ranks with status 0 did a full exchange and
 * may be registered; a rank with an error must not be (its exchange may be partial). Retry
 * only the failed ranks with a new job listing them in kvx_ctl_hs_params.ranks.
 */
typedef void (*kvx_ctl_hs_done_fn)(void *arg, const struct kvx_ctl_hs_result *res);

/** Parameters of one handshake job (copied by kvx_ctl_handshake_start()). */
struct kvx_ctl_hs_params {
	const char *host;                  /**< Remote host (fallback for pods without remote_hosts); not NULL. */
	uint16_t handshake_base_port;      /**< Remote handshake base port; 0 = KVX_CTL_DEFAULT_HANDSHAKE_PORT. */
	uint32_t dp_size;                  /**< Remote DP size, >= 1. */
	uint32_t dp_size_local;            /**< Remote DP ranks per pod; 0 = single pod. */
	const char *const *remote_hosts;   /**< Array[num_remote_hosts] per-pod hosts, or NULL. */
	uint32_t num_remote_hosts;         /**< Entries in remote_hosts. */
	uint32_t tp_rank;                  /**< Remote TP rank to dial (see kvx_ctl_remote_tp_rank()). */
	uint32_t tp_size;                  /**< Remote TP size, >= 1 (port arithmetic). */
	enum kvx_ctl_port_mode port_mode;  /**< Remote port arithmetic. */
	const uint32_t *ranks;             /**< Array[num_ranks] of DP ranks to dial (each < dp_size), or NULL = all, in order. */
	uint32_t num_ranks;                /**< Entries in ranks (ignored when ranks is NULL), <= 4096. */
	uint32_t timeout_ms;               /**< Whole-job deadline from when the job STARTS running, ms; 0 = KVX_CTL_DEFAULT_HANDSHAKE_MS. */
	kvx_ctl_blob_fn make_blob;         /**< Blob A producer; NULL = no connection setup (MoRIIO-only peer). Called only for a listener whose metadata has the kvx_ keys: a stock MoRIIO/MoRI listener is never sent kvx_connect, its rank completes with blob_b NULL. */
	kvx_ctl_hs_done_fn on_done;        /**< Completion; not NULL. Called exactly once per accepted job. */
	void (*on_accept)(void *arg);      /**< Optional: called on the control thread when the job is accepted (not a duplicate, see kvx_ctl_handshake_start()), before it can start or end; lets the caller's control-thread state say "a job runs". NULL = none. */
	void *arg;                         /**< Passed to make_blob and on_done. */
	uint64_t cookie;                   /**< Copied to the result. */
};

/** Control lcore parameters (kvx_ctl_create() copies them, strings included). */
struct kvx_ctl_params {
	const char *host;                   /**< IP to advertise (zmq_address, engine_id); not NULL. */
	const char *bind_host;              /**< Interface to bind the ROUTERs on; NULL = "*" (all). */
	uint16_t handshake_base_port;       /**< 0 = KVX_CTL_DEFAULT_HANDSHAKE_PORT. */
	uint16_t notify_base_port;          /**< 0 = KVX_CTL_DEFAULT_NOTIFY_PORT. */
	bool ephemeral_ports;               /**< Bind both ROUTERs to kernel-chosen ports (tests); read them with kvx_ctl_bound_ports(). */
	enum kvx_ctl_port_mode port_mode;   /**< Local port arithmetic. */
	uint32_t dp_rank;                   /**< Global DP rank. */
	uint32_t dp_size;                   /**< DP size, >= 1. */
	uint32_t dp_size_local;             /**< DP ranks per pod; 0 = single pod (dp_local = dp_rank). */
	uint32_t tp_rank;                   /**< TP rank, < tp_size. */
	uint32_t tp_size;                   /**< TP size, >= 1. */
	enum kvx_ctl_role role;             /**< Producer or consumer (heartbeat type, engine key). */
	enum kvx_ctl_xfer_mode transfer_mode; /**< Heartbeat transfer_mode. */
	const char *proxy_address;          /**< "ip:port" of the proxy's discovery ROUTER, or NULL/"" = no heartbeat. */
	const char *http_address;           /**< Heartbeat http_address "ip:port"; required with proxy_address. */
	uint32_t global_rank;               /**< Global world rank; only rank 0 heartbeats. */
	uint32_t heartbeat_ms;              /**< Heartbeat period, ms; 0 = KVX_CTL_DEFAULT_HEARTBEAT_MS. */
	struct kvx_lcore *lcore;            /**< Control lcore to run the loop on (kvx_lcore_set_control(), launched with kvx_lcore_launch()), or NULL = a plain thread created by kvx_ctl_start(). */
	uint32_t max_peers;                 /**< DEALER cache bound; 0 = KVX_CTL_DEFAULT_MAX_PEERS. */
	uint32_t max_active_handshakes;     /**< Jobs running at once (others queue); 0 = 4. */
	uint32_t max_inboxes;               /**< Inboxes that may be open; 0 = 16. */
	uint32_t inbox_slots;               /**< Slots per inbox, power of two; 0 = 256 (each slot holds KVX_CTL_INLINE_BYTES inline, ~1.8 KiB). */
	uint32_t busy_poll_us;              /**< After the last activity (inbox work, a received message), keep polling without sleeping for this long, µs: the next message then costs no wake-up of the control thread. Between looks the loop yields the CPU, so it also suits a control lcore that shares its CPU (the engine sets 100 by default, kvx_engine_params.control_busy_poll_us; docs/performance.md §8). 0 = sleep at once (default here). */
	uint64_t epoch;                     /**< Engine epoch to advertise; 0 = derived from time and pid at create. */
	kvx_ctl_notify_fn on_notify;        /**< Inbound notifications; NULL = count and drop. */
	void *notify_arg;                   /**< Passed to on_notify. */
	kvx_ctl_connect_fn on_connect;      /**< Connection setup; NULL = reply -ENOTSUP. */
	void *connect_arg;                  /**< Passed to on_connect. */
	const char *auth_dir;               /**< CURVE authentication (issue 17): directory holding this engine's key pair (exactly one *.key_secret, mode 0600) and allowed/ with the public keys (*.key, ZeroMQ certificate format) of the peers allowed to connect; see kvx_ctl_auth_keygen(). Both ROUTERs then require CURVE with an allowlisted client key; every DEALER dials with CURVE, taking the server key from allowed/HOST.key or the only key in allowed/. allowed/ is read at create (errors fail it); each inbound connection (ZAP request) and each new DEALER stats it and reads it again when files were added, removed or renamed, so keys count without a restart; a re-read that fails keeps the previous list (logged) and is retried at the next connection. NULL/"" = unauthenticated (MoRIIO-compatible default). */
};

/**
 * Create an auth directory for kvx_ctl_params.auth_dir: @p dir (mode 0700, created if absent),
 * dir/engine.key_secret (a new CURVE key pair, mode 0600), dir/engine.key (its public key, to be
 * copied into each peer's allowed/ directory) and dir/allowed/ (mode 0700, for the peers'
 * engine.key files; name a copy HOST.key when this engine dials several peers). ZeroMQ
 * certificate format with Z85 keys.
 *
 * @param dir   Directory path, not NULL/empty, at most 4000 bytes.
 * @return      0 on success.
 * @retval -EEXIST   dir already holds engine.key_secret / engine.key (never overwritten).
 * @retval -ENOTSUP  libzmq lacks CURVE.
 * @retval -EINVAL   Bad path.
 * @retval <0        Other -errno from mkdir/open/write.
 * @par Thread safety  Any thread. @par Source  issue 17; ZeroMQ zcert file format.
 */
int kvx_ctl_auth_keygen(const char *dir);

/**
 * Read this engine's CURVE key pair from an auth directory (the layout of
 * kvx_ctl_params.auth_dir), for a channel that authenticates with it outside ZMQ (kvxfer-perf
 * bw/lat's out-of-band socket). The keys are X25519 keys (libsodium crypto_box / crypto_kx).
 *
 * @param dir       Auth directory, not NULL/empty, at most 4000 bytes.
 * @param[out] pub  Public key, 32 bytes.
 * @param[out] sec  Secret key, 32 bytes (wipe it after use).
 * @return          0 on success (outputs written only then).
 * @retval -ENOKEY  Not exactly one *.key_secret in @p dir, or no valid key in it (logged).
 * @retval -EPERM   The secret file is readable by group or others (logged).
 * @retval -EINVAL  Bad argument or malformed key.
 * @retval <0       Other -errno from opendir/open.
 * @par Thread safety  Any thread. @par Source  issue 17.
 */
int kvx_ctl_auth_keypair(const char *dir, uint8_t pub[32], uint8_t sec[32]);

/**
 * Is @p key one of the public keys in DIR/allowed/? The directory is read at each call, so a
 * key added or removed there counts from the next call on.
 *
 * @param dir   Auth directory, not NULL/empty, at most 4000 bytes.
 * @param key   Peer public key, 32 bytes.
 * @param name  Out (may be NULL): the key file's name without ".key", NUL-terminated.
 * @param len   Size of @p name, bytes.
 * @return      0 when the key is listed.
 * @retval -EACCES  Not listed.
 * @retval -EINVAL  Bad argument; a malformed key file (logged).
 * @retval <0       Other -errno reading the directory (logged).
 * @par Thread safety  Any thread. @par Source  issue 17.
 */
int kvx_ctl_auth_allowed(const char *dir, const uint8_t key[32], char *name, size_t len);

/** Entries of the per-type notify counters: index = enum kvx_msg_type, 0 = raw bytes (kvx_ctl_send_raw()). */
#define KVX_CTL_MSG_TYPES 7
/** Buckets of the handshake latency histogram (a last +Inf bucket follows). */
#define KVX_CTL_HS_NB 16
/** Upper bounds of those buckets, seconds (also the engine's transfer-duration buckets). */
#define KVX_CTL_HS_BOUNDS_S 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60

/** Global counters (monotonic, read with kvx_ctl_counters_get() from any thread). */
struct kvx_ctl_counters {
	uint64_t notify_rx;          /**< Valid notifications delivered to on_notify. */
	uint64_t notify_tx;          /**< Frames handed to a DEALER (notifications and raw sends). */
	uint64_t dropped_terminal;   /**< Valid notifications ignored: transfer already terminal. */
	uint64_t malformed;          /**< Frames dropped as malformed (bad msgpack, types, keys, frames). */
	uint64_t unknown_type;       /**< Structured messages with an unknown `type` (subset of malformed). */
	uint64_t oversize;           /**< Frames dropped over a size/depth/count limit (subset of malformed). */
	uint64_t send_errors;        /**< Sends that failed (bad address, full queue). */
	uint64_t inbox_full;         /**< Submissions refused with -ENOBUFS. */
	uint64_t hs_served;          /**< get_meta_msg requests answered. */
	uint64_t connect_served;     /**< Connection-setup requests answered. */
	uint64_t hs_ok;              /**< Handshake jobs completed with status 0. */
	uint64_t hs_failed;          /**< Handshake jobs completed with an error. */
	uint64_t heartbeats;         /**< Heartbeat frames sent. */
	uint64_t peers_evicted;      /**< Idle DEALERs closed to respect max_peers. */
	uint64_t peers_open;         /**< DEALERs currently cached (gauge). */
	uint64_t watch_errors;       /**< Watched fds that reported an error or hang-up without data and were taken out of the poll set. */
	uint64_t auth_refused;       /**< With auth_dir: inbound connections refused (no CURVE, bad handshake, or a key not in allowed/). */
	uint64_t auth_accepted;      /**< With auth_dir: inbound CURVE connections admitted by the ZAP handler. */
	uint64_t notify_rx_type[KVX_CTL_MSG_TYPES]; /**< notify_rx by enum kvx_msg_type ([0] unused). */
	uint64_t notify_tx_type[KVX_CTL_MSG_TYPES]; /**< notify_tx by enum kvx_msg_type; [0] = raw sends. */
	uint64_t hs_lat[2][KVX_CTL_HS_NB + 1]; /**< Handshake jobs (start to completion) by result ([0] ok, [1] failed) and latency bucket (KVX_CTL_HS_BOUNDS_S, last = +Inf); not cumulative. */
	uint64_t hs_lat_sum_ns[2];   /**< Sum of those latencies by result, ns. */
};

/** Counters of one remote peer, keyed by its source IP (ZMQ "Peer-Address"). */
struct kvx_ctl_peer_stats {
	char peer[64];        /**< Peer IP, NUL-terminated; "other" for the shared overflow entry. */
	uint64_t rx;          /**< Frames received from it (both ROUTERs). */
	uint64_t malformed;   /**< Frames from it dropped as malformed/unknown/oversize. */
	uint64_t dropped;     /**< Valid notifications from it dropped as terminal. */
	uint64_t refused;     /**< With auth_dir: CURVE connections from it refused by the allowlist. */
};

/**
 * Create a control lcore object (sockets are opened by kvx_ctl_start()).
 *
 * @param p         Parameters; copied, strings included; not NULL.
 * @param[out] out  New object; set only on success.
 * @return          0 on success.
 * @retval -EINVAL  Bad parameter (message logged naming it): host missing, tp_rank >= tp_size,
 *                  sizes 0, proxy_address malformed or without http_address, inbox_slots not a
 *                  power of two, ports out of range.
 * @retval -ENOMEM  Allocation failed.
 * @par Thread safety  Any thread. @par Context Setup.
 */
int kvx_ctl_create(const struct kvx_ctl_params *p, struct kvx_ctl **out);

/**
 * Set the metadata (a) and region map (b) the listener serves. Encoded once and copied, so
 * the caller's arrays may be freed after the call. Call before kvx_ctl_start().
 *
 * @param ctl     Object, not started.
 * @param meta    Metadata; the epoch field is replaced by the object's epoch when 0.
 * @param layers  Region map.
 * @return        0 on success.
 * @retval -EBUSY   Already started.
 * @retval -EINVAL  Encoding rejected a field.
 * @retval -ENOMEM  Allocation failed.
 * @par Thread safety  Not concurrent with other calls on @p ctl. @par Context Setup.
 */
int kvx_ctl_set_local(struct kvx_ctl *ctl, const struct kvx_msg_meta *meta,
		      const struct kvx_msg_layers *layers);

/**
 * Bind the ROUTERs, connect the heartbeat DEALER, and start the control thread. Returns after
 * both ROUTERs are bound (so a peer may dial immediately).
 *
 * @param ctl   Object from kvx_ctl_create().
 * @return      0 on success.
 * @retval -EBUSY        Already started.
 * @retval -EADDRINUSE   A port is taken (message names it); other bind/zmq errors as -errno.
 * @retval -ENOMEM / -EAGAIN  Thread or socket creation failed.
 * @par Thread safety  Not concurrent with other lifecycle calls on @p ctl.
 */
int kvx_ctl_start(struct kvx_ctl *ctl);

/**
 * Stop the control thread and close every socket. Notifications already handed to the control
 * lcore (its inboxes are drained first) get a bounded flush: cached notify DEALERs close with a
 * linger of KVX_CTL_STOP_FLUSH_MS, so a `release` / `write_done` sent just before an engine is
 * destroyed still leaves, while a dead peer delays the return by at most that long; every other
 * socket closes with LINGER 0. Pending handshake jobs complete with -ECANCELED before this
 * returns. Idempotent; a second call is a no-op.
 *
 * @param ctl  Object; NULL is a no-op.
 * @par Thread safety  Not from the control thread itself (callbacks); not concurrent with
 *                     other lifecycle calls.
 */
void kvx_ctl_stop(struct kvx_ctl *ctl);

/** Most time kvx_ctl_stop() waits for queued notifications to reach live peers, ms. */
#define KVX_CTL_STOP_FLUSH_MS 500

/**
 * Stop (if needed) and free the object. Every inbox must be closed first.
 *
 * @param ctl  Object; NULL is a no-op.
 */
void kvx_ctl_destroy(struct kvx_ctl *ctl);

/**
 * Ports actually bound (useful with ephemeral_ports).
 *
 * @param ctl               Started object.
 * @param[out] handshake    Handshake ROUTER port, or NULL.
 * @param[out] notify       Notify ROUTER port, or NULL.
 * @return                  0 on success.
 * @retval -EAGAIN          Not started.
 * @par Thread safety  Any thread after kvx_ctl_start() returned.
 */
int kvx_ctl_bound_ports(const struct kvx_ctl *ctl, uint16_t *handshake, uint16_t *notify);

/**
 * The epoch this object advertises (`kvx_epoch`).
 *
 * @param ctl  Object.
 * @return     Non-zero epoch.
 * @par Thread safety  Any thread.
 */
uint64_t kvx_ctl_epoch(const struct kvx_ctl *ctl);

/**
 * Open an inbox: a single-producer channel from the calling thread to the control lcore
 * (bounded SPSC ring of pre-allocated slots + a free-slot ring back, plus a wake-up on the
 * control lcore's eventfd). One inbox per producer thread keeps every ring single-producer
 * (docs/architecture.md §1), so no submission needs a CAS or a lock.
 *
 * @param ctl       Object (started or not).
 * @param[out] out  New inbox.
 * @return          0 on success.
 * @retval -ENOBUFS max_inboxes already open.
 * @retval -ENOMEM  Allocation failed.
 * @par Thread safety  Any thread; the returned inbox is then used by ONE thread at a time.
 */
int kvx_ctl_inbox_open(struct kvx_ctl *ctl, struct kvx_ctl_inbox **out);

/**
 * Close an inbox. Submissions still queued are processed by the control thread first (if it
 * runs) or discarded (if stopped).
 *
 * @param ib  Inbox; NULL is a no-op.
 * @par Thread safety  The inbox's producer thread.
 */
void kvx_ctl_inbox_close(struct kvx_ctl_inbox *ib);

/**
 * Queue a notify message for `host:port` (single producer). The message is encoded into a
 * pre-allocated slot now (no allocation unless its encoding exceeds KVX_CTL_INLINE_BYTES); the
 * control lcore sends it through the cached DEALER for `tcp://host:port`.
 *
 * @param ib     Inbox of the calling thread.
 * @param host   Destination host or IP literal, NUL-terminated, 1..KVX_CTL_HOST_MAX bytes.
 * @param port   Destination notify port, 1..65535.
 * @param m      Message (see kvx_msg_notify_encode()).
 * @return       0 if queued.
 * @retval -ENOBUFS   Inbox full (counted in inbox_full); retry later.
 * @retval -EINVAL    Bad host/port or message field.
 * @retval -EMSGSIZE  Encoded message over KVX_MSG_NOTIFY_MAX_BYTES.
 * @retval -ENOMEM    Large-message allocation failed.
 * @par Thread safety  One thread per inbox. @par Context Lock-free; wakes the control lcore.
 */
int kvx_ctl_send_notify(struct kvx_ctl_inbox *ib, const char *host, uint16_t port,
			const struct kvx_msg_notify *m);

/**
 * Queue raw payload bytes (one frame) for `host:port` (single producer). For tools and tests
 * that need to send arbitrary bytes through the same path.
 *
 * @param ib     Inbox of the calling thread.
 * @param host   As kvx_ctl_send_notify().
 * @param port   As kvx_ctl_send_notify().
 * @param data   Array[len] bytes; copied.
 * @param len    0..KVX_MSG_NOTIFY_MAX_BYTES.
 * @return       0 if queued.
 * @retval -ENOBUFS / -EINVAL / -EMSGSIZE / -ENOMEM  As kvx_ctl_send_notify().
 * @par Thread safety  One thread per inbox.
 */
int kvx_ctl_send_raw(struct kvx_ctl_inbox *ib, const char *host, uint16_t port,
		     const void *data, size_t len);

/**
 * Mark a transfer terminal: later notifications for it are dropped (terminal LRU of
 * KVX_CTL_TERMINAL_LRU ids; the oldest id is forgotten first). Also tells the DEALER cache
 * that the transfer no longer pins its peer path.
 *
 * @param ib           Inbox of the calling thread.
 * @param transfer_id  NUL-terminated, 1..KVX_MSG_ID_MAX bytes.
 * @return             0 if queued.
 * @retval -ENOBUFS    Inbox full.
 * @retval -EINVAL     Empty or too long id.
 * @par Thread safety  One thread per inbox. Takes effect in inbox order: a notification
 *                     already received before the mark is still delivered.
 */
int kvx_ctl_mark_terminal(struct kvx_ctl_inbox *ib, const char *transfer_id);

/**
 * Mark a transfer live on a peer path: while live, the DEALER for `host:port` is never evicted
 * (it stays until kvx_ctl_mark_terminal() of that transfer id).
 *
 * @param ib           Inbox of the calling thread.
 * @param transfer_id  NUL-terminated, 1..KVX_MSG_ID_MAX bytes.
 * @param host         Peer host; @param port Peer notify port.
 * @return             0 if queued.
 * @retval -ENOBUFS / -EINVAL  As kvx_ctl_mark_terminal().
 * @par Thread safety  One thread per inbox.
 */
int kvx_ctl_mark_live(struct kvx_ctl_inbox *ib, const char *transfer_id,
		      const char *host, uint16_t port);

/**
 * Start an asynchronous handshake with a remote engine: for each requested remote DP rank, in
 * order, dial `host(rank):base + port_offset(fold(rank), tp_rank, tp_size)`, send
 * `get_meta_msg`, receive and decode (a) and (b), then (if make_blob and the listener is a kvxfer engine) exchange blob A/B. The
 * job's deadline starts when the control lcore STARTS it (jobs beyond max_active_handshakes
 * queue without consuming their deadline). on_done is called exactly once, with status 0 only
 * if every rank completed.
 *
 * A job for the same (host, handshake_base_port) as one already queued or running is not
 * dialled: its on_done is called at once with status -EBUSY (the first job's on_done reports
 * the exchange), so N requests to one cold peer cause one handshake (T41).
 *
 * @param ib   Inbox of the calling thread.
 * @param p    Job parameters; copied (strings and arrays included).
 * @return     0 if queued (on_done will be called).
 * @retval -EINVAL   Bad parameter (host, dp_size 0, rank >= dp_size, tp_rank >= tp_size in
 *                   injective mode, on_done NULL).
 * @retval -ENOBUFS  Inbox full.
 * @retval -ENOMEM   Allocation failed.
 * @par Thread safety  One thread per inbox. Allocates (slow path).
 * @par Source         docs/protocol.md §2.3, §3.1, §6 items 4-5, T39-T43.
 */
int kvx_ctl_handshake_start(struct kvx_ctl_inbox *ib, const struct kvx_ctl_hs_params *p);

/**
 * Watch a raw file descriptor from the control lcore: the loop adds @p fd to its `zmq_poll` set
 * (POLLIN, level-triggered) and calls `cb(arg)` on the control thread each time it polls
 * readable, so the callback must consume what made it readable (read the eventfd, drain the
 * device's async events) or it is called again at once. Use it for fds that need slow-path
 * handling next to the ZMQ sockets, e.g. kvx_xport_ctx_event_fd() of a transport context.
 * An fd that polls as error/hang-up without data (peer end closed, fd closed under the watch)
 * is taken out of the poll set, counted in `watch_errors` and logged (rate limited); its entry
 * stays until kvx_ctl_unwatch_fd(). The object never reads, writes or closes @p fd itself.
 *
 * @param ctl   Object (started or not; the watch takes effect when the loop runs).
 * @param fd    Open file descriptor, owned by the caller; keep it open until
 *              kvx_ctl_unwatch_fd() returned.
 * @param cb    Callback, not NULL; runs on the control thread, must not block. It may call
 *              kvx_ctl_watch_fd() / kvx_ctl_unwatch_fd() (also for its own fd).
 * @param arg   Passed to @p cb.
 * @return      0 on success: the next poll iteration includes @p fd.
 * @retval -EINVAL  @p ctl or @p cb is NULL.
 * @retval -EBADF   @p fd is negative or not an open descriptor.
 * @retval -EEXIST  @p fd is already watched by this object.
 * @retval -ENOSPC  KVX_CTL_WATCH_MAX (8) fds are already watched.
 * @par Thread safety  Any thread, including the control thread (callbacks). Takes a lock that
 *                     the loop takes only when the set of watched fds changed (slow path).
 * @par Source  TEAM2.md cross-helper interface; docs/runtime-notes.md §5.2 (one zmq_poll over the
 *              sockets and the device fds).
 */
int kvx_ctl_watch_fd(struct kvx_ctl *ctl, int fd, void (*cb)(void *arg), void *arg);

/**
 * Stop watching a file descriptor. Called from any thread but the control thread, it returns
 * only after the loop has dropped @p fd from its poll set: the callback is then not running
 * and is never called again, so its argument and the fd may be freed/closed right after.
 * Called from the control thread (inside a callback) it takes effect at once: no further
 * callback for @p fd runs, the current one excepted.
 *
 * @param ctl   Object.
 * @param fd    A descriptor passed to kvx_ctl_watch_fd().
 * @return      0 on success.
 * @retval -EINVAL  @p ctl is NULL.
 * @retval -ENOENT  @p fd is not watched by this object.
 * @par Thread safety  Any thread. Off the control thread it waits for at most one loop
 *                     iteration (it wakes the loop), so do not call it while holding a lock
 *                     that a control-thread callback takes.
 * @par Source  TEAM2.md cross-helper interface.
 */
int kvx_ctl_unwatch_fd(struct kvx_ctl *ctl, int fd);

/**
 * Read the global counters.
 *
 * @param ctl       Object.
 * @param[out] out  Snapshot (each field read atomically; fields not mutually consistent).
 * @par Thread safety  Any thread, lock-free.
 */
void kvx_ctl_counters_get(const struct kvx_ctl *ctl, struct kvx_ctl_counters *out);

/**
 * Read the per-peer counters.
 *
 * @param ctl       Object.
 * @param out       Array[cap] of entries to fill.
 * @param cap       Capacity, elements.
 * @return          Entries written, 0..min(cap, KVX_CTL_PEER_STATS_MAX).
 * @par Thread safety  Any thread, lock-free.
 */
size_t kvx_ctl_peer_stats_get(const struct kvx_ctl *ctl, struct kvx_ctl_peer_stats *out,
			      size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* KVX_INTERNAL_CTL_H */
