/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_CONTROL_H
#define KVX_CONTROL_H
/**
 * @file
 * Control plane of kvxfer: the MoRIIO-compatible wire codec (`kvx_msg_*`), the port and
 * address helpers (`kvx_ctl_*` pure functions), and the control lcore object (`struct kvx_ctl`)
 * that owns every ZMQ socket of a worker (DESIGN.md §1, §4; PROTOCOL.md §2, §3).
 *
 * Three layers, usable separately:
 *  1. **Pure helpers** (ports, ranks, `zmq_address`, request-id embedding): no state, no
 *     allocation, safe from any thread. Errors are negative errnos; an optional error buffer
 *     receives a message naming the field and value.
 *  2. **Codec** (`kvx_msg_*_encode` / `_decode`): encode into a caller buffer, decode with
 *     strict validation of untrusted bytes (size, nesting depth, element counts checked before
 *     any allocation; key and value types, required keys, integer ranges checked after).
 *     Decoders never allocate memory that outlives the call; outputs go into caller storage.
 *     Safe from any thread.
 *  3. **Control lcore** (`kvx_ctl_*` on `struct kvx_ctl`): one thread running a poll loop
 *     (one poll(2) per iteration over the sockets' ZMQ_FDs, the inbox eventfd and the watched
 *     fds) over the handshake ROUTER, the notify ROUTER, a bounded cache of DEALERs (one per
 *     peer path), the heartbeat DEALER to the proxy, and the eventfd of its inbox. Other
 *     threads (engine worker, pollers) talk to it only through inboxes
 *     (`struct kvx_ctl_inbox`, one per producer thread, single-producer/single-consumer, no
 *     locks). All callbacks run on the control thread.
 *
 * Wire compatibility (PROTOCOL.md Appendix A):
 *  - Handshake: the initiator DEALER sends the 12 bytes `get_meta_msg`; the listener ROUTER
 *    answers with two messages, each seen by the DEALER as `["", payload]`: (a) the metadata map
 *    and (b) the per-layer region map. kvxfer's own metadata fields are **extra keys after the
 *    six MoRIIO keys** of map (a), all prefixed `kvx_` (a MoRIIO/msgspec decoder ignores unknown
 *    fields; kvxfer's decoder accepts a map without them and reports `has_kvx = false`).
 *    Connection setup is a further request/reply on the same DEALER: a msgpack map
 *    `{type:"kvx_connect", ...}` carrying the transport's **opaque blob A** (msgpack `bin`), and
 *    the reply `{type:"kvx_connect_reply", status, blob}` carrying **blob B**. A MoRIIO peer never
 *    sends it, so a kvxfer listener still serves MoRIIO initiators.
 *  - Notifications: one msgpack map (or a legacy plain UTF-8 string) per frame, DEALER ->
 *    ROUTER, keys as in PROTOCOL.md §3.2.
 *  - Heartbeat: the L1+ map of PROTOCOL.md §3.4, one frame every 3 s to the proxy.
 *
 * Limits (everything larger is rejected with -EMSGSIZE or -EPROTO and counted, never
 * allocated): see the KVX_MSG_* constants below.
 *
 * Only `control/` includes zmq.h and msgpack.h (STYLE.md §8).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Constants                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/** kvxfer control-protocol version carried as `kvx_version` in the handshake metadata. */
#define KVX_MSG_PROTO_VERSION 1
/** Longest transfer id or request id accepted, bytes (without the NUL). */
#define KVX_MSG_ID_MAX 511
/** Longest name accepted (engine id, engine key, hostname, layer name, address), bytes. */
#define KVX_MSG_NAME_MAX 255
/** Longest short label (transport name, layout name, attention backend), bytes. */
#define KVX_MSG_LABEL_MAX 63
/** Most block-id groups in a nested (hybrid) `block_notify_list`. */
#define KVX_MSG_GROUPS_MAX 8
/** Largest transport blob (connection setup, blob A or B), bytes. */
#define KVX_MSG_BLOB_MAX 65536
/** Deepest msgpack nesting accepted in any control message (map=1, map>array=2, ...). */
#define KVX_MSG_DEPTH_MAX 4
/** Most msgpack objects (all levels counted) accepted in one control message. */
#define KVX_MSG_ELEMS_MAX (1u << 20)
/** Largest notify frame accepted (ZMQ_MAXMSGSIZE of the notify ROUTER), bytes. */
#define KVX_MSG_NOTIFY_MAX_BYTES (1u << 20)
/** Largest frame accepted by the handshake ROUTER (get_meta_msg, connect request), bytes. */
#define KVX_MSG_HS_REQ_MAX_BYTES (256u * 1024u)
/** Largest handshake reply accepted by the initiator (metadata, region map), bytes. */
#define KVX_MSG_HS_REPLY_MAX_BYTES (16u * 1024u * 1024u)
/** The 12-byte handshake request, PROTOCOL.md §3.1 (GET_META_MSG). Not NUL-counted. */
#define KVX_MSG_GET_META "get_meta_msg"
/** Length of KVX_MSG_GET_META, bytes. */
#define KVX_MSG_GET_META_LEN 12

/** Default handshake base port (PROTOCOL.md §2.2, DEFAULT_HANDSHAKE_PORT). */
#define KVX_CTL_DEFAULT_HANDSHAKE_PORT 6301
/** Default notify base port (PROTOCOL.md §2.2, DEFAULT_NOTIFY_PORT). */
#define KVX_CTL_DEFAULT_NOTIFY_PORT 61005
/** Default proxy heartbeat period, ms (PROTOCOL.md §3.7 PING_INTERVAL). */
#define KVX_CTL_DEFAULT_HEARTBEAT_MS 3000
/** Size of the terminal-transfer LRU (PROTOCOL.md §3.7 _MAX_TERMINAL_TRANSFER_IDS). */
#define KVX_CTL_TERMINAL_LRU 4096
/** Default bound of the DEALER cache (peer paths kept open). */
#define KVX_CTL_DEFAULT_MAX_PEERS 256
/** Default handshake deadline, ms (PROTOCOL.md Appendix A item 9, BR handshake_timeout). */
#define KVX_CTL_DEFAULT_HANDSHAKE_MS 10000
/** Longest host (IP literal or name) in an address, bytes. */
#define KVX_CTL_HOST_MAX 255
/** Payload bytes stored inline in an inbox slot; larger sends allocate (slow path). */
#define KVX_CTL_INLINE_BYTES 1024
/** Number of per-peer counter entries; later peers share the last ("other") entry. */
#define KVX_CTL_PEER_STATS_MAX 64
/** Raw fds one control lcore may watch at once (kvx_ctl_watch_fd()). */
#define KVX_CTL_WATCH_MAX 8

/* ------------------------------------------------------------------------------------------ */
/* Enumerations                                                                                */
/* ------------------------------------------------------------------------------------------ */

/** Port arithmetic mode (PROTOCOL.md §2.1, §6 item 6; DESIGN.md §4). */
enum kvx_ctl_port_mode {
	/** `dp_local * tp_size + tp_rank`: injective over (dp, tp). The default. */
	KVX_CTL_PORT_INJECTIVE = 0,
	/**
	 * `dp_local + tp_rank`: what current vLLM peers compute (they omit tp_size). Needed to
	 * interoperate with them; it **collides** when DP > 1 and TP > 1, e.g. (dp 1, tp 0) and
	 * (dp 0, tp 1) both get offset 1, so two workers of one host cannot both bind.
	 */
	KVX_CTL_PORT_VLLM = 1,
};

/** Worker role (PROTOCOL.md §1.1). */
enum kvx_ctl_role {
	KVX_CTL_ROLE_PRODUCER = 0, /**< Prefill, "P", `kv_producer`. */
	KVX_CTL_ROLE_CONSUMER = 1, /**< Decode, "D", `kv_consumer`. */
};

/** Transfer mode (PROTOCOL.md §1.2); heartbeat `transfer_mode` "WRITE" / "READ". */
enum kvx_ctl_xfer_mode {
	KVX_CTL_MODE_WRITE = 0, /**< Push: P writes into D's blocks (default). */
	KVX_CTL_MODE_READ = 1,  /**< Pull: D reads P's blocks. */
};

/** Kind of a notify message (PROTOCOL.md §3.2). */
enum kvx_msg_type {
	KVX_MSG_REMOTE_BLOCKS = 1, /**< D -> P: D's block ids for a transfer (WRITE). */
	KVX_MSG_WRITE_DONE = 2,    /**< P -> D: all writes of a transfer landed (WRITE). */
	KVX_MSG_RELEASE = 3,       /**< D -> P: P may free the blocks (READ done, or abort). */
	KVX_MSG_COMPLETION = 4,    /**< Legacy plain UTF-8 transfer/request id (no map). */
};

/* ------------------------------------------------------------------------------------------ */
/* Pure helpers: ports, ranks, addresses (PROTOCOL.md §2.1, §2.2, §3.4, §3.5, §4.5)            */
/* ------------------------------------------------------------------------------------------ */

/**
 * Compute the port offset of worker (dp_local, tp_rank).
 *
 * @param mode        KVX_CTL_PORT_INJECTIVE (`dp_local*tp_size + tp_rank`) or
 *                    KVX_CTL_PORT_VLLM (`dp_local + tp_rank`, collides: see the enum).
 * @param dp_local    Local (folded) DP rank, 0..65535.
 * @param tp_rank     TP rank, 0..65535; < tp_size in injective mode.
 * @param tp_size     TP size, > 0 (checked in both modes, as the L3 helper does).
 * @param[out] offset Port offset; not NULL.
 * @return            0 on success.
 * @retval -EINVAL    tp_size is 0 ("tp_size must be positive"), tp_rank >= tp_size in
 *                    injective mode, bad mode, or the offset exceeds 65535.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.1 port_offset, §6 item 6, T33, T54.
 */
KVX_API int kvx_ctl_port_offset(enum kvx_ctl_port_mode mode, uint32_t dp_local, uint32_t tp_rank,
				uint32_t tp_size, uint32_t *offset);

/**
 * Compute a worker's port: `base + port_offset(...)`.
 *
 * @param mode, dp_local, tp_rank, tp_size  As kvx_ctl_port_offset().
 * @param base        Base port (handshake or notify), 1..65535.
 * @param[out] port   Resulting TCP port; not NULL.
 * @return            0 on success.
 * @retval -EINVAL    As kvx_ctl_port_offset(), base 0, or the sum exceeds 65535.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.2, §2.4 targets.
 */
KVX_API int kvx_ctl_port(enum kvx_ctl_port_mode mode, uint16_t base, uint32_t dp_local,
			 uint32_t tp_rank, uint32_t tp_size, uint16_t *port);

/**
 * Fold a global DP rank to its pod-local rank: `g % dp_local`, or `g` when dp_local is 0
 * (0 is the "external DP / single pod" sentinel).
 *
 * @param g         Global DP rank.
 * @param dp_local  DP ranks per pod; 0 = single pod.
 * @return          The local rank.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.1 fold_local_rank, T54.
 */
KVX_API uint32_t kvx_ctl_fold_local_rank(uint32_t g, uint32_t dp_local);

/**
 * Pod index of a global DP rank: `g / dp_local`, or 0 when dp_local is 0.
 *
 * @param g         Global DP rank.
 * @param dp_local  DP ranks per pod; 0 = single pod.
 * @return          The pod index (index into remote_hosts).
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.1 pod_index, §5.8, T54.
 */
KVX_API uint32_t kvx_ctl_pod_index(uint32_t g, uint32_t dp_local);

/**
 * Map a local TP rank to the remote TP rank to dial or notify (heterogeneous TP).
 *
 * Equal sizes give local_rank; remote > local gives `local_rank*(remote/local)`; remote < local
 * gives `local_rank / (local/remote)`.
 *
 * @param local_rank   0..local_size-1.
 * @param local_size   > 0.
 * @param remote_size  Remote TP size; 0 means "same as local" (L3).
 * @param[out] out     Remote TP rank; not NULL.
 * @param[out] err     If non-NULL, receives a message on error (NUL-terminated, truncated).
 * @param err_len      Capacity of err, bytes.
 * @return             0 on success.
 * @retval -EINVAL     local_size 0, local_rank out of range, or neither size is a multiple
 *                     of the other (the message contains "multiple").
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.1, §4.5, T23, T35.
 */
KVX_API int kvx_ctl_remote_tp_rank(uint32_t local_rank, uint32_t local_size, uint32_t remote_size,
				   uint32_t *out, char *err, size_t err_len);

/**
 * Number of `release` ACKs P must collect before a READ transfer is complete (fan-in).
 *
 * @param p_tp       Producer TP size, > 0.
 * @param c_tp       Consumer TP size, > 0.
 * @param[out] out   1 if c_tp <= p_tp, else c_tp / p_tp; not NULL.
 * @return           0 on success.
 * @retval -EINVAL   A size is 0, or c_tp > p_tp and c_tp is not a multiple of p_tp.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §4.5 expected_acks, §5.6, T25.
 */
KVX_API int kvx_ctl_expected_acks(uint32_t p_tp, uint32_t c_tp, uint32_t *out);

/**
 * Resolve the peer's TP size from request params: `remote_tp_size` if > 0, else `tp_size` if
 * > 0, else the local TP size.
 *
 * @param remote_tp_size  Param `remote_tp_size`; <= 0 means absent.
 * @param tp_size         Param `tp_size`; <= 0 means absent.
 * @param local_tp_size   This worker's TP size.
 * @return                The peer TP size.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §3.3, T33.
 */
KVX_API uint32_t kvx_ctl_peer_tp_size(int64_t remote_tp_size, int64_t tp_size,
				      uint32_t local_tp_size);

/**
 * Pick the host and pod-local rank to dial for remote DP rank @p dp_rank (multi-pod, Wide-EP).
 *
 * host = `hosts[pod_index(dp_rank, dp_size_local)]` if that index is < num_hosts, else
 * @p fallback_host; local rank = `fold_local_rank(dp_rank, dp_size_local)`.
 *
 * @param dp_rank         Remote global DP rank.
 * @param dp_size_local   Remote DP ranks per pod; 0 = single pod.
 * @param hosts           Array[num_hosts] of per-pod hosts, or NULL when num_hosts is 0.
 * @param num_hosts       Entries in hosts.
 * @param fallback_host   Host used when the pod index is out of range; not NULL.
 * @param[out] host       Points at the chosen string (one of the inputs); not NULL.
 * @param[out] local_rank Folded rank for the port computation; not NULL.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.3 fan-out, §5.8, T36, T39.
 */
KVX_API void kvx_ctl_dp_target(uint32_t dp_rank, uint32_t dp_size_local,
			       const char *const *hosts, uint32_t num_hosts,
			       const char *fallback_host, const char **host,
			       uint32_t *local_rank);

/** A parsed MoRIIO `zmq_address` ("host:IP,handshake:P,notify:P"). */
struct kvx_ctl_addr {
	char host[KVX_CTL_HOST_MAX + 1]; /**< Host or IP literal (IPv6 without brackets), NUL-terminated. */
	uint16_t handshake_port;         /**< Handshake base port. */
	uint16_t notify_port;            /**< Notify port (of the advertising rank). */
};

/**
 * Parse a MoRIIO `zmq_address`: split on ',', each segment on its first ':', whitespace
 * stripped; keys host, handshake, notify are required (others ignored); ports 1..65535.
 * `"host:::1,handshake:6301,notify:61005"` gives host "::1".
 *
 * @param s          Input bytes (not necessarily NUL-terminated); not NULL.
 * @param len        Input length, bytes.
 * @param[out] out   Parsed address; not NULL; unchanged on error.
 * @param[out] err   If non-NULL, message on error ("Malformed zmq_address ...: missing 'notify'").
 * @param err_len    Capacity of err, bytes.
 * @return           0 on success.
 * @retval -EINVAL   Missing key, empty host, host too long, or a port that is not an integer
 *                   in 1..65535.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §3.4 parse_moriio_zmq_address, T52.
 */
KVX_API int kvx_ctl_zmq_address_parse(const char *s, size_t len, struct kvx_ctl_addr *out,
				      char *err, size_t err_len);

/**
 * Format a `zmq_address` "host:<h>,handshake:<p>,notify:<p>" (IPv6 hosts are written bare, as
 * MoRIIO does; the parser splits on the first ':').
 *
 * @param a      Address; not NULL.
 * @param buf    Output buffer, Array[cap] bytes; NUL-terminated on success.
 * @param cap    Capacity, bytes.
 * @return       Length written (without the NUL), > 0.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §3.4.
 */
KVX_API int kvx_ctl_zmq_address_format(const struct kvx_ctl_addr *a, char *buf, size_t cap);

/**
 * Build a libzmq endpoint: "tcp://host:port", or "tcp://[host]:port" for an IPv6 literal
 * (any host containing ':'; an already bracketed host is kept as is).
 *
 * @param host   Host or IP literal; not NULL, not empty.
 * @param port   TCP port, 1..65535.
 * @param buf    Output, Array[cap] bytes; NUL-terminated on success.
 * @param cap    Capacity, bytes.
 * @return       Length written (without the NUL), > 0.
 * @retval -EINVAL    Empty host or port 0.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.1 zmq path.
 */
KVX_API int kvx_ctl_zmq_path(const char *host, uint16_t port, char *buf, size_t cap);

/**
 * Extract the prefill (P) `zmq_address` embedded in a request id: the text between
 * `___prefill_addr_` and the first following `___decode_addr_`.
 *
 * @param rid        Request id, NUL-terminated; not NULL.
 * @param buf        Output, Array[cap] bytes; NUL-terminated on success.
 * @param cap        Capacity, bytes.
 * @return           Length written (without the NUL), > 0.
 * @retval -ENOENT   No embedded prefill address (callers fall back to params, L2).
 * @retval -EMSGSIZE buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §3.5, T52.
 */
KVX_API int kvx_ctl_reqid_prefill_addr(const char *rid, char *buf, size_t cap);

/**
 * Extract the decode (D) `zmq_address` embedded in a request id: regex
 * `___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$` (greedy, so the last matching `_<32 hex>` wins).
 *
 * @param rid        Request id, NUL-terminated; not NULL.
 * @param buf        Output, Array[cap] bytes; NUL-terminated on success.
 * @param cap        Capacity, bytes.
 * @return           Length written (without the NUL), > 0.
 * @retval -ENOENT   No embedded decode address.
 * @retval -EMSGSIZE buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §3.5, T52.
 */
KVX_API int kvx_ctl_reqid_decode_addr(const char *rid, char *buf, size_t cap);

/**
 * Build a request id embedding both addresses:
 * `"___prefill_addr_" + p + "___decode_addr_" + d + "_" + hex32` (what the proxy generates).
 *
 * @param p_addr   Prefill zmq_address, NUL-terminated; not NULL.
 * @param d_addr   Decode zmq_address, NUL-terminated; not NULL.
 * @param hex32    Exactly 32 lowercase hex digits, NUL-terminated; not NULL.
 * @param buf      Output, Array[cap] bytes.
 * @param cap      Capacity, bytes.
 * @return         Length written (without the NUL), > 0.
 * @retval -EINVAL    hex32 is not 32 lowercase hex digits.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §1.3 step 2, §3.5.
 */
KVX_API int kvx_ctl_reqid_format(const char *p_addr, const char *d_addr, const char *hex32,
				 char *buf, size_t cap);

/**
 * Strip vLLM's request suffix: if @p rid fully matches `(.+)-[0-9a-fA-F]{8}`, the result is
 * group 1, else the whole id ("abc-1234abcd" -> "abc", "abc" -> "abc").
 *
 * @param rid      Request id, NUL-terminated; not NULL.
 * @param buf      Output, Array[cap] bytes; NUL-terminated on success.
 * @param cap      Capacity, bytes.
 * @return         Length written (without the NUL), >= 0.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §3.5 _strip_vllm_request_suffix, T52.
 */
KVX_API int kvx_ctl_reqid_strip_suffix(const char *rid, char *buf, size_t cap);

/**
 * Format the MoRI engine key `"<producer|consumer>:<ip>:<hs_base>:tp<t>:dp<d>"`.
 *
 * @param role     Producer or consumer.
 * @param ip       Advertised IP, NUL-terminated; not NULL.
 * @param hs_base  Handshake base port.
 * @param tp_rank  TP rank.
 * @param dp_rank  DP rank.
 * @param buf      Output, Array[cap] bytes.
 * @param cap      Capacity, bytes.
 * @return         Length written (without the NUL), > 0.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Pure; any thread.
 * @par Source         PROTOCOL.md §2.2, Appendix A item 1, T48.
 */
KVX_API int kvx_ctl_engine_key(enum kvx_ctl_role role, const char *ip, uint16_t hs_base,
			       uint32_t tp_rank, uint32_t dp_rank, char *buf, size_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Codec: notify messages (PROTOCOL.md §3.2)                                                  */
/* ------------------------------------------------------------------------------------------ */

/**
 * One notify message, decoded or to be encoded.
 *
 * Encoded forms (keys in this order; all strings are msgpack `str`):
 *  - REMOTE_BLOCKS: `{req_id, transfer_id, block_notify_list, decode_rank, type:"remote_blocks"}`;
 *    block_notify_list is a flat array of uint, or (num_groups > 0) an array of arrays.
 *  - WRITE_DONE: `{type:"write_done", transfer_id}`.
 *  - RELEASE: `{type:"release", transfer_id[, consumer_tp_size]}`.
 *  - COMPLETION: the raw UTF-8 bytes of transfer_id (legacy; no msgpack).
 */
struct kvx_msg_notify {
	enum kvx_msg_type type;                 /**< Message kind. */
	char transfer_id[KVX_MSG_ID_MAX + 1];   /**< Transfer id (or legacy completion id), NUL-terminated, 1..KVX_MSG_ID_MAX bytes of UTF-8. */
	char req_id[KVX_MSG_ID_MAX + 1];        /**< REMOTE_BLOCKS: D request id (may be ""), NUL-terminated. */
	int64_t decode_rank;                    /**< REMOTE_BLOCKS: D's DP rank, 0..INT32_MAX; -1 when absent on decode. */
	uint32_t consumer_tp_size;              /**< RELEASE: TP size of the sender, >= 1; 1 when absent on decode. */
	bool has_consumer_tp_size;              /**< RELEASE: encode/decoded with the key present. */
	uint32_t num_groups;                    /**< REMOTE_BLOCKS: 0 = flat list; else 1..KVX_MSG_GROUPS_MAX nested groups. */
	uint32_t group_len[KVX_MSG_GROUPS_MAX]; /**< REMOTE_BLOCKS, nested: ids per group, elements, summing to num_blocks. */
	uint32_t num_blocks;                    /**< REMOTE_BLOCKS: total block ids in block_ids, elements. */
	uint32_t *block_ids;                    /**< REMOTE_BLOCKS: Array[num_blocks] (encode: read; decode: written, caller-owned, capacity blocks_cap). Each id 0..INT32_MAX. */
	uint32_t blocks_cap;                    /**< Decode: capacity of block_ids, elements (0 with block_ids NULL rejects any remote_blocks with -EMSGSIZE). */
	uint64_t sender_epoch;                  /**< REMOTE_BLOCKS: kvxfer extension key `kvx_epoch`, the epoch of the consumer incarnation that allocated the blocks (sent after `type`; a MoRIIO peer ignores it). 0 = absent (encode: key left out; decode: a MoRIIO sender). */
};

/**
 * Encode a notify message into a caller buffer.
 *
 * @param m      Message; not NULL. transfer_id must be 1..KVX_MSG_ID_MAX bytes; for
 *               REMOTE_BLOCKS num_blocks >= 1, block_ids non-NULL, decode_rank 0..INT32_MAX,
 *               groups consistent; for RELEASE consumer_tp_size >= 1 when has_consumer_tp_size.
 * @param buf    Output, Array[cap] bytes.
 * @param cap    Capacity, bytes.
 * @return       Encoded length, bytes (> 0).
 * @retval -EINVAL    A field is out of range (empty id, empty block list, bad type, ...).
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Any thread (touches only its arguments). No heap allocation.
 * @par Source         PROTOCOL.md §3.2, T21, T38.
 */
KVX_API int kvx_msg_notify_encode(const struct kvx_msg_notify *m, void *buf, size_t cap);

/**
 * Decode a notify frame with strict validation (the L2 dispatcher of PROTOCOL.md §3.2, with
 * the robustness fixes of §6 item 3).
 *
 * A msgpack map with `type` in {remote_blocks, write_done, release}, or with no `type` but a
 * `req_id` (= remote_blocks), is structured. Anything that is not a complete, valid msgpack
 * object but is valid UTF-8 without NUL bytes is a legacy COMPLETION id. Before msgpack-c sees
 * the bytes, every container header is checked against the bytes left (so a 5-byte header
 * claiming 2^32 entries is rejected without allocating), and depth and element counts are capped.
 *
 * @param buf       Frame bytes; not NULL unless len is 0.
 * @param len       Frame length, bytes, 0..KVX_MSG_NOTIFY_MAX_BYTES.
 * @param[in,out] m Output. On input m->block_ids/blocks_cap give the id array; everything else
 *                  is overwritten. On error its content is unspecified.
 * @param[out] err  If non-NULL, a message naming the field on error, e.g.
 *                  "Unhandled structured message type 'unknown'",
 *                  "block_notify_list cannot be empty", "Unhandled message format".
 * @param err_len   Capacity of err, bytes.
 * @return          0 on success.
 * @retval -EPROTO    Malformed, wrong key/value type, missing key, unknown `type`, empty
 *                    block list, integer out of range, empty payload, non-UTF-8 string.
 * @retval -EMSGSIZE  Frame, id, nesting, element count or block count over a limit.
 * @par Thread safety  Any thread. Allocates only inside msgpack-c, bounded by len, freed
 *                     before returning.
 * @par Source         PROTOCOL.md §3.2, §6 item 3, T21, T22; RUNTIME_GUIDE.md §5.1.
 */
KVX_API int kvx_msg_notify_decode(const void *buf, size_t len, struct kvx_msg_notify *m,
				  char *err, size_t err_len);

/* ------------------------------------------------------------------------------------------ */
/* Codec: proxy heartbeat (PROTOCOL.md §2.5, §3.4)                                            */
/* ------------------------------------------------------------------------------------------ */

/** Proxy registration map `{type, http_address, zmq_address, dp_size, tp_size, transfer_mode}`. */
struct kvx_msg_heartbeat {
	enum kvx_ctl_role role;                  /**< `type`: "P" (producer) or "D" (consumer). */
	char http_address[KVX_MSG_NAME_MAX + 1]; /**< "<ip>:<http_port>", NUL-terminated. */
	char zmq_address[KVX_MSG_NAME_MAX + 1];  /**< "host:<ip>,handshake:<p>,notify:<p>", NUL-terminated. */
	uint32_t dp_size;                        /**< DP size, >= 1. */
	uint32_t tp_size;                        /**< TP size, >= 1. */
	enum kvx_ctl_xfer_mode mode;             /**< `transfer_mode`: "WRITE" or "READ". */
};

/**
 * Encode the heartbeat map (6 keys, in the order above).
 *
 * @param h      Heartbeat; not NULL; sizes >= 1, strings non-empty.
 * @param buf    Output, Array[cap] bytes.
 * @param cap    Capacity, bytes.
 * @return       Encoded length, bytes (> 0).
 * @retval -EINVAL    A field is empty or out of range.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Any thread; no heap allocation.
 * @par Source         PROTOCOL.md §3.4, T50.
 */
KVX_API int kvx_msg_heartbeat_encode(const struct kvx_msg_heartbeat *h, void *buf, size_t cap);

/**
 * Decode a heartbeat map strictly (all six keys required; unknown keys ignored, as the toy
 * proxy does; `type` must be "P" or "D").
 *
 * @param buf      Frame bytes.
 * @param len      Frame length, bytes.
 * @param[out] h   Decoded heartbeat; not NULL.
 * @param[out] err If non-NULL, message naming the field on error.
 * @param err_len  Capacity of err, bytes.
 * @return         0 on success.
 * @retval -EPROTO    Malformed, missing key, wrong type, bad value.
 * @retval -EMSGSIZE  Over a size, depth or count limit.
 * @par Thread safety  Any thread.
 * @par Source         PROTOCOL.md §3.4, T50.
 */
KVX_API int kvx_msg_heartbeat_decode(const void *buf, size_t len, struct kvx_msg_heartbeat *h,
				     char *err, size_t err_len);

/* ------------------------------------------------------------------------------------------ */
/* Codec: handshake metadata (a), region map (b), connection setup (PROTOCOL.md §3.1)          */
/* ------------------------------------------------------------------------------------------ */

/** One registered memory region as kvxfer advertises it (`kvx_regions` entry). */
struct kvx_msg_region {
	uint64_t addr;      /**< Virtual address of the region (host or device). */
	uint64_t len_bytes; /**< Length, bytes. */
	uint64_t key;       /**< Remote access key (verbs rkey; tcp/shm region key). */
};

/**
 * Handshake metadata, message (a).
 *
 * Wire: msgpack map, first the six MoRIIO keys in order `engine_id` (str), `agent_metadata`
 * (bin = packed EngineDesc `[engine_key, hostname, host, kv_port]`), `kv_caches_base_addr`
 * (array of uint: the region addresses, in order), `num_blocks` (uint), `block_len` (uint),
 * `attn_backend_name` (str); then kvxfer's keys `kvx_version` (uint), `kvx_epoch` (uint),
 * `kvx_transport` (str), `kvx_layout` (str), `kvx_regions` (array of `[addr, len, key]`).
 * The engine id is `engine_id` (MoRIIO's "ip:hs_base"); the epoch makes a restarted engine
 * distinguishable. When has_kvx is false the kvx_ keys are omitted (pure MoRIIO) / were absent.
 */
struct kvx_msg_meta {
	char engine_id[KVX_MSG_NAME_MAX + 1];      /**< "ip:hs_base", NUL-terminated, non-empty. */
	char engine_key[KVX_MSG_NAME_MAX + 1];     /**< EngineDesc key (see kvx_ctl_engine_key()). */
	char hostname[KVX_MSG_NAME_MAX + 1];       /**< EngineDesc hostname. */
	char host[KVX_MSG_NAME_MAX + 1];           /**< EngineDesc host (IP). */
	uint32_t kv_port;                          /**< EngineDesc port, 0..65535 (MoRI OOB port; kvxfer: 0 or the data port). */
	uint64_t num_blocks;                       /**< Logical blocks per layer. */
	uint64_t block_len;                        /**< Bytes of one block of one K (or V) plane, bytes. */
	char attn_backend[KVX_MSG_LABEL_MAX + 1];  /**< `attn_backend_name`. */
	bool has_kvx;                              /**< kvxfer fields below are present. */
	uint32_t version;                          /**< `kvx_version` (KVX_MSG_PROTO_VERSION). */
	uint64_t epoch;                            /**< `kvx_epoch`: new on every engine start, != 0. */
	char transport[KVX_MSG_LABEL_MAX + 1];     /**< `kvx_transport`: "verbs", "tcp", "shm". */
	char layout[KVX_MSG_LABEL_MAX + 1];        /**< `kvx_layout`: layout name (runtime's term). */
	uint32_t num_regions;                      /**< Regions in `regions` (and base addresses), elements. */
	struct kvx_msg_region *regions;            /**< Array[num_regions] (encode: read; decode: caller-owned, capacity regions_cap). Without kvx fields only addr is filled (len/key 0). */
	uint32_t regions_cap;                      /**< Decode: capacity of regions, elements. */
};

/**
 * Encode metadata message (a).
 *
 * @param m      Metadata; not NULL; engine_id non-empty; regions non-NULL if num_regions > 0.
 * @param buf    Output, Array[cap] bytes.
 * @param cap    Capacity, bytes.
 * @return       Encoded length, bytes.
 * @retval -EINVAL    Empty engine_id or inconsistent regions.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Any thread; no heap allocation.
 * @par Source         PROTOCOL.md §3.1 (a), DESIGN.md §4.
 */
KVX_API int kvx_msg_meta_encode(const struct kvx_msg_meta *m, void *buf, size_t cap);

/**
 * Decode metadata message (a) strictly: the six MoRIIO keys are required with their types;
 * the kvx_ keys are optional as a group (all or none); other unknown keys are ignored;
 * duplicate keys are rejected; `kv_caches_base_addr` must match `kvx_regions` when present.
 *
 * @param buf       Payload bytes.
 * @param len       Payload length, bytes.
 * @param[in,out] m Output; m->regions/regions_cap give the region array on input.
 * @param[out] err  If non-NULL, message naming the field on error.
 * @param err_len   Capacity of err, bytes.
 * @return          0 on success.
 * @retval -EPROTO    Malformed, missing/duplicate key, wrong type, value out of range.
 * @retval -EMSGSIZE  Over a limit, or more regions than regions_cap.
 * @par Thread safety  Any thread.
 * @par Source         PROTOCOL.md §3.1 (a), T48.
 */
KVX_API int kvx_msg_meta_decode(const void *buf, size_t len, struct kvx_msg_meta *m, char *err,
				size_t err_len);

/** One packed MoRI MemoryDesc of the region map (b). */
struct kvx_msg_memdesc {
	char layer[KVX_MSG_NAME_MAX + 1]; /**< Layer name (map key), NUL-terminated, non-empty. */
	uint32_t id;                      /**< MemoryDesc id. */
	int32_t device_id;                /**< Device id (-1 for host). */
	uint64_t addr;                    /**< `data`: base address. */
	uint64_t len_bytes;               /**< `size`, bytes. */
	uint32_t loc;                     /**< 1 = CPU, 2 = GPU. */
};

/**
 * Region map, message (b): `{layer_name: [bin(packed MemoryDesc), ...]}`, one map entry per
 * layer, the descs of one layer being consecutive entries of @p descs with the same `layer`.
 * A packed MemoryDesc is the msgpack array `[engine_key, id, device_id, data, size, loc]`.
 */
struct kvx_msg_layers {
	char engine_key[KVX_MSG_NAME_MAX + 1]; /**< engineKey of every MemoryDesc (one per engine). */
	uint32_t num_descs;                    /**< Entries in descs, elements. */
	uint32_t num_layers;                   /**< Decode: distinct layers (map entries). */
	struct kvx_msg_memdesc *descs;         /**< Array[num_descs] (encode: read; decode: caller-owned, capacity descs_cap). */
	uint32_t descs_cap;                    /**< Decode: capacity of descs, elements. */
};

/**
 * Encode the region map (b). Consecutive descs with the same layer name form one map entry;
 * a layer name appearing in two separated runs is -EINVAL (duplicate map key).
 *
 * @param l      Region map; not NULL.
 * @param buf    Output, Array[cap] bytes.
 * @param cap    Capacity, bytes.
 * @return       Encoded length, bytes.
 * @retval -EINVAL    Empty layer name, duplicate layer, or loc not 1/2.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Any thread; no heap allocation.
 * @par Source         PROTOCOL.md §3.1 (b).
 */
KVX_API int kvx_msg_layers_encode(const struct kvx_msg_layers *l, void *buf, size_t cap);

/**
 * Decode the region map (b) strictly (every value an array of 1..16 bins, each bin a valid
 * packed MemoryDesc with the same engine key; duplicate layer names rejected).
 *
 * @param buf       Payload bytes.
 * @param len       Payload length, bytes.
 * @param[in,out] l Output; l->descs/descs_cap give the desc array on input.
 * @param[out] err  If non-NULL, message naming the field on error.
 * @param err_len   Capacity of err, bytes.
 * @return          0 on success.
 * @retval -EPROTO    Malformed or wrong types/values.
 * @retval -EMSGSIZE  Over a limit, or more descs than descs_cap.
 * @par Thread safety  Any thread.
 * @par Source         PROTOCOL.md §3.1 (b).
 */
KVX_API int kvx_msg_layers_decode(const void *buf, size_t len, struct kvx_msg_layers *l,
				  char *err, size_t err_len);

/**
 * Connection-setup request or reply (kvxfer extension on the handshake socket).
 *
 * Request: `{type:"kvx_connect", engine_id:str, epoch:uint, dp_rank:uint, blob:bin}` from the
 * initiator (blob A). Reply: `{type:"kvx_connect_reply", status:int, blob:bin}` (blob B; status
 * is 0 or the listener's negative errno, blob empty on error).
 */
struct kvx_msg_connect {
	bool is_reply;                         /**< false: request; true: reply. */
	char engine_id[KVX_MSG_NAME_MAX + 1];  /**< Request: initiator engine id, non-empty. */
	uint64_t epoch;                        /**< Request: initiator epoch. */
	uint32_t dp_rank;                      /**< Request: the listener DP rank the initiator dialled. */
	int32_t status;                        /**< Reply: 0 or a negative errno, -4095..0. */
	const uint8_t *blob;                   /**< Opaque transport blob, Array[blob_len]; decode: points INTO the input buffer. */
	size_t blob_len;                       /**< Blob length, bytes, 0..KVX_MSG_BLOB_MAX. */
};

/**
 * Encode a connection-setup request or reply.
 *
 * @param c      Message; not NULL; blob may be NULL only when blob_len is 0.
 * @param buf    Output, Array[cap] bytes.
 * @param cap    Capacity, bytes.
 * @return       Encoded length, bytes.
 * @retval -EINVAL    Empty engine_id (request), blob too large, status out of range.
 * @retval -EMSGSIZE  buf too small.
 * @par Thread safety  Any thread; no heap allocation.
 * @par Source         DESIGN.md §4 (transport connection setup).
 */
KVX_API int kvx_msg_connect_encode(const struct kvx_msg_connect *c, void *buf, size_t cap);

/**
 * Decode a connection-setup request or reply strictly. c->blob points into @p buf, so @p buf
 * must outlive the use of c->blob.
 *
 * @param buf       Payload bytes.
 * @param len       Payload length, bytes.
 * @param[out] c    Output; not NULL.
 * @param[out] err  If non-NULL, message naming the field on error.
 * @param err_len   Capacity of err, bytes.
 * @return          0 on success.
 * @retval -EPROTO    Malformed, missing key, wrong type, value out of range.
 * @retval -EMSGSIZE  Over a limit (blob > KVX_MSG_BLOB_MAX).
 * @par Thread safety  Any thread.
 * @par Source         DESIGN.md §4.
 */
KVX_API int kvx_msg_connect_decode(const void *buf, size_t len, struct kvx_msg_connect *c,
				   char *err, size_t err_len);

/* ------------------------------------------------------------------------------------------ */
/* Control lcore                                                                              */
/* ------------------------------------------------------------------------------------------ */

struct kvx_lcore;     /**< An lcore of the lcore module (include/kvxfer/lcore.h). */
struct kvx_ctl;       /**< Control lcore object (opaque). */
struct kvx_ctl_inbox; /**< One producer thread's lock-free channel into the control lcore. */

/**
 * Inbound notification handler (runs on the control thread). Called once per accepted message,
 * after validation and after the terminal-LRU filter: a message of ANY type whose transfer id
 * was marked terminal (kvx_ctl_mark_terminal()) is counted in `dropped_terminal` and not
 * delivered. Mark a READ transfer terminal only after its last expected `release` (fan-in,
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
	kvx_ctl_blob_fn make_blob;         /**< Blob A producer; NULL = no connection setup (MoRIIO-only peer). */
	kvx_ctl_hs_done_fn on_done;        /**< Completion; not NULL. Called exactly once per accepted job. */
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
	uint32_t busy_poll_us;              /**< After the last activity (inbox work, a received message), keep polling without sleeping for this long, µs: the next message then costs no wake-up of the control thread. For a control lcore on a core of its own; 0 = sleep at once (default, right when CPUs are shared). */
	uint64_t epoch;                     /**< Engine epoch to advertise; 0 = derived from time and pid at create. */
	kvx_ctl_notify_fn on_notify;        /**< Inbound notifications; NULL = count and drop. */
	void *notify_arg;                   /**< Passed to on_notify. */
	kvx_ctl_connect_fn on_connect;      /**< Connection setup; NULL = reply -ENOTSUP. */
	void *connect_arg;                  /**< Passed to on_connect. */
};

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
};

/** Counters of one remote peer, keyed by its source IP (ZMQ "Peer-Address"). */
struct kvx_ctl_peer_stats {
	char peer[64];        /**< Peer IP, NUL-terminated; "other" for the shared overflow entry. */
	uint64_t rx;          /**< Frames received from it (both ROUTERs). */
	uint64_t malformed;   /**< Frames from it dropped as malformed/unknown/oversize. */
	uint64_t dropped;     /**< Valid notifications from it dropped as terminal. */
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
KVX_API int kvx_ctl_create(const struct kvx_ctl_params *p, struct kvx_ctl **out);

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
KVX_API int kvx_ctl_set_local(struct kvx_ctl *ctl, const struct kvx_msg_meta *meta,
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
KVX_API int kvx_ctl_start(struct kvx_ctl *ctl);

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
KVX_API void kvx_ctl_stop(struct kvx_ctl *ctl);

/** Most time kvx_ctl_stop() waits for queued notifications to reach live peers, ms. */
#define KVX_CTL_STOP_FLUSH_MS 500

/**
 * Stop (if needed) and free the object. Every inbox must be closed first.
 *
 * @param ctl  Object; NULL is a no-op.
 */
KVX_API void kvx_ctl_destroy(struct kvx_ctl *ctl);

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
KVX_API int kvx_ctl_bound_ports(const struct kvx_ctl *ctl, uint16_t *handshake, uint16_t *notify);

/**
 * The epoch this object advertises (`kvx_epoch`).
 *
 * @param ctl  Object.
 * @return     Non-zero epoch.
 * @par Thread safety  Any thread.
 */
KVX_API uint64_t kvx_ctl_epoch(const struct kvx_ctl *ctl);

/**
 * Open an inbox: a single-producer channel from the calling thread to the control lcore
 * (bounded SPSC ring of pre-allocated slots + a free-slot ring back, plus a wake-up on the
 * control lcore's eventfd). One inbox per producer thread keeps every ring single-producer
 * (DESIGN.md §1), so no submission needs a CAS or a lock.
 *
 * @param ctl       Object (started or not).
 * @param[out] out  New inbox.
 * @return          0 on success.
 * @retval -ENOBUFS max_inboxes already open.
 * @retval -ENOMEM  Allocation failed.
 * @par Thread safety  Any thread; the returned inbox is then used by ONE thread at a time.
 */
KVX_API int kvx_ctl_inbox_open(struct kvx_ctl *ctl, struct kvx_ctl_inbox **out);

/**
 * Close an inbox. Submissions still queued are processed by the control thread first (if it
 * runs) or discarded (if stopped).
 *
 * @param ib  Inbox; NULL is a no-op.
 * @par Thread safety  The inbox's producer thread.
 */
KVX_API void kvx_ctl_inbox_close(struct kvx_ctl_inbox *ib);

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
KVX_API int kvx_ctl_send_notify(struct kvx_ctl_inbox *ib, const char *host, uint16_t port,
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
KVX_API int kvx_ctl_send_raw(struct kvx_ctl_inbox *ib, const char *host, uint16_t port,
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
KVX_API int kvx_ctl_mark_terminal(struct kvx_ctl_inbox *ib, const char *transfer_id);

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
KVX_API int kvx_ctl_mark_live(struct kvx_ctl_inbox *ib, const char *transfer_id,
			      const char *host, uint16_t port);

/**
 * Start an asynchronous handshake with a remote engine: for each requested remote DP rank, in
 * order, dial `host(rank):base + port_offset(fold(rank), tp_rank, tp_size)`, send
 * `get_meta_msg`, receive and decode (a) and (b), then (if make_blob) exchange blob A/B. The
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
 * @par Source         PROTOCOL.md §2.3, §3.1, §6 items 4-5, T39-T43.
 */
KVX_API int kvx_ctl_handshake_start(struct kvx_ctl_inbox *ib, const struct kvx_ctl_hs_params *p);

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
 * @par Source  TEAM2.md cross-helper interface; RUNTIME_GUIDE.md §5.2 (one zmq_poll over the
 *              sockets and the device fds).
 */
KVX_API int kvx_ctl_watch_fd(struct kvx_ctl *ctl, int fd, void (*cb)(void *arg), void *arg);

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
KVX_API int kvx_ctl_unwatch_fd(struct kvx_ctl *ctl, int fd);

/**
 * Read the global counters.
 *
 * @param ctl       Object.
 * @param[out] out  Snapshot (each field read atomically; fields not mutually consistent).
 * @par Thread safety  Any thread, lock-free.
 */
KVX_API void kvx_ctl_counters_get(const struct kvx_ctl *ctl, struct kvx_ctl_counters *out);

/**
 * Read the per-peer counters.
 *
 * @param ctl       Object.
 * @param out       Array[cap] of entries to fill.
 * @param cap       Capacity, elements.
 * @return          Entries written, 0..min(cap, KVX_CTL_PEER_STATS_MAX).
 * @par Thread safety  Any thread, lock-free.
 */
KVX_API size_t kvx_ctl_peer_stats_get(const struct kvx_ctl *ctl, struct kvx_ctl_peer_stats *out,
				      size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* KVX_CONTROL_H */
