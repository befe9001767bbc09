/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_INTERNAL_CODEC_H
#define KVX_INTERNAL_CODEC_H
/**
 * @file
 * @internal
 * The strict msgpack codec of the control wire format (`kvx_msg_*`, layer 2 of
 * kvxfer/control.h): limits, message structs, encoders and decoders. Used by control/, the
 * engine, the benchmarks, the tests and the fuzz targets; not installed, and its functions are
 * not exported by libkvxfer.so (no KVX_API). kvxfer/control.h includes it in-tree.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/control.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/** The 12-byte handshake request, docs/protocol.md §3.1 (GET_META_MSG). Not NUL-counted. */
#define KVX_MSG_GET_META "get_meta_msg"
/** Length of KVX_MSG_GET_META, bytes. */
#define KVX_MSG_GET_META_LEN 12

/** Kind of a notify message (docs/protocol.md §3.2). */
enum kvx_msg_type {
	KVX_MSG_REMOTE_BLOCKS = 1, /**< D -> P: D's block ids for a transfer (WRITE). */
	KVX_MSG_WRITE_DONE = 2,    /**< P -> D: all writes of a transfer landed (WRITE). */
	KVX_MSG_RELEASE = 3,       /**< D -> P: P may free the blocks (READ done, or abort). */
	KVX_MSG_COMPLETION = 4,    /**< Legacy plain UTF-8 transfer/request id (no map). */
	KVX_MSG_FAILED = 5,        /**< kvxfer only, P -> D: the producer's side of a transfer ended
				    *   without success (abort, failure, timeout, late allocation,
				    *   handshake rejection), sent after its ops for it are terminal. */
	KVX_MSG_STATUS_QUERY = 6,  /**< kvxfer only, D -> P: "what became of this transfer?" (a
				    *   consumer about to time out); answered with write_done (DONE)
				    *   or kvx_failed, nothing while the transfer is still running. */
};

/** Longest failure reason carried by kvx_failed, bytes (without the NUL). */
#define KVX_MSG_REASON_MAX 255

/* ------------------------------------------------------------------------------------------ */
/* Codec: notify messages (docs/protocol.md §3.2)                                                  */
/* ------------------------------------------------------------------------------------------ */

/**
 * One notify message, decoded or to be encoded.
 *
 * Encoded forms (keys in this order; all strings are msgpack `str`):
 *  - REMOTE_BLOCKS: `{req_id, transfer_id, block_notify_list, decode_rank, type:"remote_blocks"}`;
 *    block_notify_list is a flat array of uint, or (num_groups > 0) an array of arrays.
 *  - WRITE_DONE: `{type:"write_done", transfer_id[, kvx_engine, kvx_rank[, kvx_epoch]]}`.
 *  - RELEASE: `{type:"release", transfer_id[, consumer_tp_size][, kvx_engine, kvx_rank[, kvx_epoch]]}`.
 *  - FAILED: `{type:"kvx_failed", transfer_id, kvx_status, kvx_error, kvx_reason, kvx_engine,
 *    kvx_rank[, kvx_epoch]}` (kvxfer peers only; identity required).
 *  - STATUS_QUERY: `{type:"kvx_status_query", transfer_id, kvx_engine, kvx_rank[, kvx_epoch][,
 *    kvx_notify_host, kvx_notify_port, kvx_revoked]}` (kvxfer peers only; identity required; the
 *    last three together or not at all: a READ consumer's query names where to answer).
 *  - COMPLETION: the raw UTF-8 bytes of transfer_id (legacy; no msgpack).
 * The `kvx_` keys name the sending worker (sender_id + sender_rank, optionally its epoch); a
 * MoRIIO receiver ignores them, and a message from a MoRIIO sender has none (sender_id "").
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
	uint64_t sender_epoch;                  /**< kvxfer extension key `kvx_epoch`: the epoch of the sending incarnation (REMOTE_BLOCKS: the consumer that allocated the blocks; others: with sender_id). 0 = absent (encode: key left out; decode: a MoRIIO sender). */
	char sender_id[KVX_MSG_NAME_MAX + 1];   /**< WRITE_DONE, RELEASE, FAILED, STATUS_QUERY: `kvx_engine`, the sender's engine id ("ip:hs_base"); "" = absent (a MoRIIO sender). Required for FAILED and STATUS_QUERY. */
	int64_t sender_rank;                    /**< With sender_id: `kvx_rank`, the sender's TP rank, 0..65535; -1 when absent on decode. */
	uint32_t fail_status;                   /**< FAILED: `kvx_status`, the producer's terminal status (enum kvx_cpl_status: 1 FAILED, 2 ABORTED, 3 TIMED_OUT). */
	int32_t fail_error;                     /**< FAILED: `kvx_error`, the producer's negative errno, -4095..0. */
	char reason[KVX_MSG_REASON_MAX + 1];    /**< FAILED: `kvx_reason`, a human-readable cause (may be ""). */
	char notify_host[KVX_MSG_NAME_MAX + 1]; /**< STATUS_QUERY from a READ consumer: `kvx_notify_host`, the host of the sender's own notify listener, where the producer sends kvx_failed for this transfer; "" = absent (a WRITE consumer's query: answered to the transfer's peer). */
	uint32_t notify_port;                   /**< With notify_host: `kvx_notify_port`, that listener's port, 1..65535. */
	bool lease_revoked;                     /**< With notify_host: `kvx_revoked`, the sender found the producer's lease for the transfer revoked (true) or granted (false). */
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
 * @par Source         docs/protocol.md §3.2, T21, T38.
 */
int kvx_msg_notify_encode(const struct kvx_msg_notify *m, void *buf, size_t cap);

/**
 * Decode a notify frame with strict validation (the L2 dispatcher of docs/protocol.md §3.2, with
 * the robustness fixes of §6 item 3).
 *
 * A msgpack map with `type` in {remote_blocks, write_done, release, kvx_failed,
 * kvx_status_query}, or with no `type` but a
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
 * @par Source         docs/protocol.md §3.2, §6 item 3, T21, T22; docs/runtime-notes.md §5.1.
 */
int kvx_msg_notify_decode(const void *buf, size_t len, struct kvx_msg_notify *m,
			  char *err, size_t err_len);

/* ------------------------------------------------------------------------------------------ */
/* Codec: proxy heartbeat (docs/protocol.md §2.5, §3.4)                                            */
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
 * @par Source         docs/protocol.md §3.4, T50.
 */
int kvx_msg_heartbeat_encode(const struct kvx_msg_heartbeat *h, void *buf, size_t cap);

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
 * @par Source         docs/protocol.md §3.4, T50.
 */
int kvx_msg_heartbeat_decode(const void *buf, size_t len, struct kvx_msg_heartbeat *h,
			     char *err, size_t err_len);

/* ------------------------------------------------------------------------------------------ */
/* Codec: handshake metadata (a), region map (b), connection setup (docs/protocol.md §3.1)          */
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
 * @par Source         docs/protocol.md §3.1 (a), docs/architecture.md §4.
 */
int kvx_msg_meta_encode(const struct kvx_msg_meta *m, void *buf, size_t cap);

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
 * @par Source         docs/protocol.md §3.1 (a), T48.
 */
int kvx_msg_meta_decode(const void *buf, size_t len, struct kvx_msg_meta *m, char *err,
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
 * @par Source         docs/protocol.md §3.1 (b).
 */
int kvx_msg_layers_encode(const struct kvx_msg_layers *l, void *buf, size_t cap);

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
 * @par Source         docs/protocol.md §3.1 (b).
 */
int kvx_msg_layers_decode(const void *buf, size_t len, struct kvx_msg_layers *l,
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
 * @par Source         docs/architecture.md §4 (transport connection setup).
 */
int kvx_msg_connect_encode(const struct kvx_msg_connect *c, void *buf, size_t cap);

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
 * @par Source         docs/architecture.md §4.
 */
int kvx_msg_connect_decode(const void *buf, size_t len, struct kvx_msg_connect *c,
			   char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#define KVX_INTERNAL_CODEC_DONE 1 /* body complete (see the end of kvxfer/control.h) */
/* kvxfer/control.h left the control lcore out while this header was open: bring it in now, so
 * the include order never matters. */
#include "kvxfer/internal/ctl.h"
#endif /* KVX_INTERNAL_CODEC_H */
