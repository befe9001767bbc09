/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_CONTROL_H
#define KVX_CONTROL_H
/**
 * @file
 * Control plane of kvxfer: the MoRIIO-compatible wire codec (`kvx_msg_*`), the port and
 * address helpers (`kvx_ctl_*` pure functions), and the control lcore object (`struct kvx_ctl`)
 * that owns every ZMQ socket of a worker (docs/architecture.md §1, §4; docs/protocol.md §2, §3).
 *
 * Installed and exported: the pure helpers (layer 1) below. The codec (layer 2,
 * kvxfer/internal/codec.h) and the control lcore (layer 3, kvxfer/internal/ctl.h) are the
 * engine's internals: in-tree only, not installed, not exported by libkvxfer.so; this header
 * includes them when they are on the include path (in-tree builds, benchmarks, tests, fuzz).
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
 * Wire compatibility (docs/protocol.md Appendix A):
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
 *    ROUTER, keys as in docs/protocol.md §3.2.
 *  - Heartbeat: the L1+ map of docs/protocol.md §3.4, one frame every 3 s to the proxy.
 *
 * Limits (everything larger is rejected with -EMSGSIZE or -EPROTO and counted, never
 * allocated): see the KVX_MSG_* constants below.
 *
 * Only `control/` includes zmq.h and msgpack.h (docs/style.md §8).
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

/** Default handshake base port (docs/protocol.md §2.2, DEFAULT_HANDSHAKE_PORT). */
#define KVX_CTL_DEFAULT_HANDSHAKE_PORT 6301
/** Default notify base port (docs/protocol.md §2.2, DEFAULT_NOTIFY_PORT). */
#define KVX_CTL_DEFAULT_NOTIFY_PORT 61005
/** Longest host (IP literal or name) in an address, bytes. */
#define KVX_CTL_HOST_MAX 255

/* ------------------------------------------------------------------------------------------ */
/* Enumerations                                                                                */
/* ------------------------------------------------------------------------------------------ */

/** Port arithmetic mode (docs/protocol.md §2.1, §6 item 6; docs/architecture.md §4). */
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

/** Worker role (docs/protocol.md §1.1). */
enum kvx_ctl_role {
	KVX_CTL_ROLE_PRODUCER = 0, /**< Prefill, "P", `kv_producer`. */
	KVX_CTL_ROLE_CONSUMER = 1, /**< Decode, "D", `kv_consumer`. */
};

/** Transfer mode (docs/protocol.md §1.2); heartbeat `transfer_mode` "WRITE" / "READ". */
enum kvx_ctl_xfer_mode {
	KVX_CTL_MODE_WRITE = 0, /**< Push: P writes into D's blocks (default). */
	KVX_CTL_MODE_READ = 1,  /**< Pull: D reads P's blocks. */
};

/* ------------------------------------------------------------------------------------------ */
/* Pure helpers: ports, ranks, addresses (docs/protocol.md §2.1, §2.2, §3.4, §3.5, §4.5)            */
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
 * @par Source         docs/protocol.md §2.1 port_offset, §6 item 6, T33, T54.
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
 * @par Source         docs/protocol.md §2.2, §2.4 targets.
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
 * @par Source         docs/protocol.md §2.1 fold_local_rank, T54.
 */
KVX_API uint32_t kvx_ctl_fold_local_rank(uint32_t g, uint32_t dp_local);

/**
 * Pod index of a global DP rank: `g / dp_local`, or 0 when dp_local is 0.
 *
 * @param g         Global DP rank.
 * @param dp_local  DP ranks per pod; 0 = single pod.
 * @return          The pod index (index into remote_hosts).
 * @par Thread safety  Pure; any thread.
 * @par Source         docs/protocol.md §2.1 pod_index, §5.8, T54.
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
 * @par Source         docs/protocol.md §2.1, §4.5, T23, T35.
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
 * @par Source         docs/protocol.md §4.5 expected_acks, §5.6, T25.
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
 * @par Source         docs/protocol.md §3.3, T33.
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
 * @par Source         docs/protocol.md §2.3 fan-out, §5.8, T36, T39.
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
 * @par Source         docs/protocol.md §3.4 parse_moriio_zmq_address, T52.
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
 * @par Source         docs/protocol.md §3.4.
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
 * @par Source         docs/protocol.md §2.1 zmq path.
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
 * @par Source         docs/protocol.md §3.5, T52.
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
 * @par Source         docs/protocol.md §3.5, T52.
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
 * @par Source         docs/protocol.md §1.3 step 2, §3.5.
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
 * @par Source         docs/protocol.md §3.5 _strip_vllm_request_suffix, T52.
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
 * @par Source         docs/protocol.md §2.2, Appendix A item 1, T48.
 */
KVX_API int kvx_ctl_engine_key(enum kvx_ctl_role role, const char *ip, uint16_t hs_base,
			       uint32_t tp_rank, uint32_t dp_rank, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

/* In-tree builds: the codec and the control lcore. (When this header is reached from inside
 * kvxfer/internal/codec.h, the control lcore, which needs the whole codec, is left out here and
 * included at the end of codec.h.) */
#if __has_include("kvxfer/internal/codec.h")
#include "kvxfer/internal/codec.h"
#endif
#if __has_include("kvxfer/internal/ctl.h") && \
	(defined(KVX_INTERNAL_CODEC_DONE) || !defined(KVX_INTERNAL_CODEC_H))
#include "kvxfer/internal/ctl.h"
#endif
#endif /* KVX_CONTROL_H */
