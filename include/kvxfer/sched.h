/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_SCHED_H
#define KVX_SCHED_H
/**
 * @file
 * Scheduler-side bookkeeping of disaggregated transfers as a pure state machine
 * (PROTOCOL.md §1.3 steps 4–5 and 13, §1.4 steps 3–5, §5.1–§5.5, §5.7, §5.9, with the fixes of
 * §6 items 8, 10, 11, 12, 13).
 *
 * The inference engine's scheduler feeds events (allocation, prefill step, request finished,
 * ACK/notification, wire state, abort) together with the current time, and reads back what to
 * do and which requests became safe. Nothing here sleeps, reads a clock or does I/O: time is
 * injected (`now_ns` arguments), so every decision is deterministic and testable.
 *
 * Everything is keyed by **transfer id**; the request id is only carried along (and may be
 * rewritten with kvx_sched_rename()). A transfer id is one-shot: registering it twice fails
 * with -EEXIST and leaves the first untouched.
 *
 * Safety rule (PROTOCOL.md §6, "quarantine"): blocks whose transfer may still be read or written
 * on the wire are never reported reusable. While kvx_sched_set_wire_busy() says ops may be in
 * flight, a transfer that would otherwise be freed (ACK, defer timeout, abort, timeout) stays
 * quarantined and is reported only once the wire is idle.
 *
 * Threading: one owner thread per object (the engine's scheduler thread); not thread-safe.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Maximum id length including the NUL (transfer and request ids). */
#define KVX_SCHED_ID_MAX 128

/** Which side of the disaggregated pair this scheduler runs on (PROTOCOL.md §1.1). */
enum kvx_sched_role {
	KVX_SCHED_PRODUCER = 0, /**< Prefill (P). */
	KVX_SCHED_CONSUMER = 1, /**< Decode (D). */
};

/** Transfer mode (PROTOCOL.md §1.2). */
enum kvx_sched_mode {
	KVX_SCHED_MODE_READ = 0,  /**< D pulls from P, then sends `release`. */
	KVX_SCHED_MODE_WRITE = 1, /**< D announces blocks, P pushes, then sends `write_done`. */
};

/** Parameters of kvx_sched_create(). */
struct kvx_sched_params {
	enum kvx_sched_role role;
	enum kvx_sched_mode mode;
	uint32_t block_size;          /**< Tokens per block (> 0). */
	uint64_t defer_timeout_ns;    /**< P: max wait for an ACK before reaping; parked-ACK lifetime, ns (> 0). */
	uint64_t transfer_timeout_ns; /**< D WRITE: max wait for `write_done` after allocation, ns (> 0). */
	uint32_t max_requests;        /**< Capacity: live transfers plus parked notifications (> 0). */
};

/** Request facts for kvx_sched_matched_tokens() (PROTOCOL.md §5.9, vector T44). */
struct kvx_sched_req {
	uint64_t num_prompt_tokens;   /**< Prompt length, tokens. */
	uint64_t num_computed_tokens; /**< Tokens already computed or cached locally, tokens. */
	bool has_params;              /**< The request carries kv_transfer_params. */
	bool do_remote_prefill;       /**< kv_transfer_params.do_remote_prefill. */
};

/** What kvx_sched_alloc() asks the caller to do. */
enum kvx_sched_action {
	KVX_SCHED_ACT_NONE = 0,               /**< Nothing (P: wait for the final prefill chunk). */
	KVX_SCHED_ACT_SEND_REMOTE_BLOCKS = 1, /**< D WRITE: send `remote_blocks` with the local ids. */
	KVX_SCHED_ACT_SEND_RELEASE = 2,       /**< D: release P now, no RDMA (full hit or abort). */
	KVX_SCHED_ACT_START_READ = 3,         /**< D READ: read the paired blocks (see pairing fields). */
};

/** Allocation facts for kvx_sched_alloc(). */
struct kvx_sched_alloc {
	const char *transfer_id;   /**< Transfer id, 1..KVX_SCHED_ID_MAX-1 bytes; not NULL. */
	const char *request_id;    /**< Engine request id (informative); NULL allowed. */
	const uint32_t *block_ids; /**< Array[n_blocks] newly allocated local blocks; NULL if 0. */
	size_t n_blocks;           /**< Newly allocated blocks (0 on a full prefix hit). */
	size_t cached_blocks;      /**< D: blocks already cached locally (prefix hit), blocks. */
	size_t n_remote_blocks;    /**< D READ: P's block count from kv_transfer_params. */
	uint64_t num_prompt_tokens; /**< P: prompt length, tokens (final-chunk detection). */
};

/** Result of kvx_sched_alloc(). */
struct kvx_sched_alloc_result {
	enum kvx_sched_action action; /**< What to do now. */
	size_t remote_start;          /**< D READ: index of the first paired P block. */
	size_t n_pairs;               /**< D READ: pairs local[i] <-> remote[remote_start+i], i < n_pairs. */
};

/** Kinds of kvx_sched_update() events. */
enum kvx_sched_event_kind {
	KVX_SCHED_EV_FINISHED_SENDING = 1, /**< P: the transfer's blocks may be freed now. */
	KVX_SCHED_EV_FINISHED_RECVING = 2, /**< D: the remote KV has landed; the request may run. */
	KVX_SCHED_EV_FAILED = 3,           /**< D: the transfer failed or timed out (load error). */
	KVX_SCHED_EV_FREE_BLOCKS = 4,      /**< D: blocks of an aborted/failed transfer are reusable. */
};

/** One event reported by kvx_sched_update(). */
struct kvx_sched_event {
	enum kvx_sched_event_kind kind;       /**< What happened. */
	char transfer_id[KVX_SCHED_ID_MAX];   /**< Transfer id. */
	char request_id[KVX_SCHED_ID_MAX];    /**< Current request id ("" if never known). */
	bool reaped;                          /**< P: freed by defer timeout, not by an ACK. */
	int error;                            /**< FAILED: -ETIMEDOUT, -ECANCELED, -ECONNRESET or -EIO. */
};

/** Counters of one scheduler (monotonic). */
struct kvx_sched_stats {
	uint64_t acks;          /**< ACKs / write_done applied. */
	uint64_t parked;        /**< Early notifications parked. */
	uint64_t stale_dropped; /**< Parked notifications dropped at their deadline. */
	uint64_t reaped;        /**< P transfers freed by defer timeout. */
	uint64_t quarantined;   /**< Frees held back because the wire was busy. */
	uint64_t timed_out;     /**< D WRITE waits that timed out. */
	uint64_t duplicates;    /**< Rejected duplicate transfer ids. */
};

struct kvx_sched;

/**
 * Create a scheduler state machine.
 *
 * @param p         Parameters; not NULL.
 * @param[out] out  New object; not NULL.
 * @return          0 on success.
 * @retval -EINVAL  NULL, zero block_size / timeouts / max_requests, or unknown role/mode
 *                  (logged with the field name).
 * @retval -ENOMEM  Allocation failed.
 * @par Context  Control path. @par Source PROTOCOL.md §5.
 */
KVX_API int kvx_sched_create(const struct kvx_sched_params *p, struct kvx_sched **out);

/** Destroy; NULL is a no-op. @param s Scheduler. */
KVX_API void kvx_sched_destroy(struct kvx_sched *s);

/**
 * Tokens the connector will provide for a request, and whether they load asynchronously
 * (PROTOCOL.md §5.9, §6 items 13 and 14, vector T44).
 *
 * P: (0, false). WRITE D: (prompt − computed, true) only with do_remote_prefill, and (0, false)
 * once that transfer completed (@p transfer_id finished). READ D: (prompt − 1 − computed, true)
 * with do_remote_prefill when positive, else (0, false) (async load, §6 item 14).
 *
 * @param s            Scheduler; not NULL.
 * @param transfer_id  The request's transfer id, or NULL if it has none.
 * @param r            Request facts; not NULL.
 * @param[out] tokens  Matched tokens; not NULL.
 * @param[out] async   Whether the load is asynchronous; not NULL.
 * @par Thread safety  Owner thread.
 */
KVX_API void kvx_sched_matched_tokens(const struct kvx_sched *s, const char *transfer_id,
				      const struct kvx_sched_req *r, uint64_t *tokens, bool *async);

/**
 * Record a transfer at block allocation (PROTOCOL.md §1.3 steps 4b/5b, §1.4 step 5, §5.7).
 *
 * P: remembers the blocks for the final-chunk save (WRITE) and the transfer id.
 * D WRITE: SEND_REMOTE_BLOCKS (n_blocks > 0) or SEND_RELEASE (full prefix hit; no empty
 * `remote_blocks`). A `write_done` parked before this call is applied now.
 * D READ: START_READ with position pairing (kvx_plan_pair_by_position()), or SEND_RELEASE when
 * nothing pairs (full hit): no RDMA.
 *
 * @param s         Scheduler; not NULL.
 * @param a         Allocation; not NULL.
 * @param now_ns    Current time, ns (injected clock).
 * @param[out] res  Action; not NULL.
 * @return          0 on success.
 * @retval -EEXIST  The transfer id is already known (live or finished): rejected, first kept.
 * @retval -EINVAL  Missing/too long transfer id, or n_blocks > 0 with NULL block_ids.
 * @retval -ENOBUFS max_requests reached.
 * @retval -ENOMEM  Allocation of the block list failed.
 */
KVX_API int kvx_sched_alloc(struct kvx_sched *s, const struct kvx_sched_alloc *a, uint64_t now_ns,
			    struct kvx_sched_alloc_result *res);

/**
 * P: account one prefill step of a transfer (PROTOCOL.md §5.3 with §6 item 12 fixed).
 *
 * New blocks are appended (a step may add none). The save is due when the **computed** tokens
 * reach the prompt length, never from allocated blocks; it is reported once.
 *
 * @param s               Scheduler (producer); not NULL.
 * @param transfer_id     Transfer id; not NULL.
 * @param new_blocks      Array[n_new] blocks allocated in this step; NULL if n_new is 0.
 * @param n_new           Count, blocks.
 * @param computed_tokens Tokens computed after this step (cumulative), tokens.
 * @param[out] blocks     If the save is due: the full block list, valid until the next call on
 *                        this transfer; may be NULL.
 * @param[out] n_blocks   If non-NULL, its length.
 * @return                1 if the save is due now, 0 if not (or already emitted).
 * @retval -ENOENT        Unknown transfer id.
 * @retval -EINVAL        Not a producer.
 * @retval -ENOMEM        Growing the block list failed.
 */
KVX_API int kvx_sched_step(struct kvx_sched *s, const char *transfer_id, const uint32_t *new_blocks, size_t n_new,
			   uint64_t computed_tokens, const uint32_t **blocks, size_t *n_blocks);

/**
 * P: the request finished on the engine (PROTOCOL.md §5.4 with §6 item 11 fixed).
 *
 * Defers the free whenever do_remote_decode is set and the transfer holds blocks, whatever the
 * finish reason; the free is then reported by kvx_sched_update().
 *
 * @param s                 Scheduler (producer); not NULL.
 * @param transfer_id       Transfer id; not NULL.
 * @param do_remote_decode  kv_transfer_params.do_remote_decode.
 * @param now_ns            Current time, ns; the defer deadline is now + defer_timeout.
 * @return                  1 if the free is deferred (delay_free), 0 if the caller frees now.
 * @retval -ENOENT          Unknown transfer id.
 */
KVX_API int kvx_sched_finished(struct kvx_sched *s, const char *transfer_id, bool do_remote_decode,
			       uint64_t now_ns);

/**
 * Apply a completion notification: P — the transfer's ACK (release fan-in complete, or
 * write_done sent); D WRITE — `write_done` received (PROTOCOL.md §5.1, §5.4).
 *
 * An ACK for an unknown transfer is parked until now + defer_timeout (early ACK); one for a
 * finished transfer is dropped.
 *
 * @param s            Scheduler; not NULL.
 * @param transfer_id  Transfer id; not NULL.
 * @param now_ns       Current time, ns.
 * @return             0 applied, 1 parked, 2 dropped (already finished).
 * @retval -EINVAL     Bad id.
 * @retval -ENOBUFS    No room to park.
 */
KVX_API int kvx_sched_ack(struct kvx_sched *s, const char *transfer_id, uint64_t now_ns);

/**
 * Say whether ops of a transfer may still be on the wire (quarantine input).
 *
 * @param s            Scheduler; not NULL.
 * @param transfer_id  Transfer id; not NULL.
 * @param busy         true: frees are held back; false: the wire is idle (ops terminal, or
 *                     the peer's endpoints were torn down).
 * @return             0, or -ENOENT for an unknown transfer.
 */
KVX_API int kvx_sched_set_wire_busy(struct kvx_sched *s, const char *transfer_id, bool busy);

/**
 * D: abort a transfer (PROTOCOL.md §5.5 with §6 item 10 fixed).
 *
 * Before allocation (unknown id): returns SEND_RELEASE and records the id as finished.
 * After allocation and before completion: SEND_RELEASE; the blocks are quarantined and
 * reported with FREE_BLOCKS once the wire is idle (or P's terminal write_done arrives).
 *
 * @param s            Scheduler (consumer); not NULL.
 * @param transfer_id  Transfer id; not NULL.
 * @param now_ns       Current time, ns.
 * @param[out] act     Action; not NULL.
 * @return             0, or -EINVAL (not a consumer, bad id), -ENOBUFS.
 */
KVX_API int kvx_sched_abort(struct kvx_sched *s, const char *transfer_id, uint64_t now_ns,
			    enum kvx_sched_action *act);

/**
 * Rewrite the request id carried by a transfer (the engine mutated it): events keep flowing
 * by transfer id and report the new request id.
 *
 * @return 0, -ENOENT unknown transfer, -EINVAL bad id.
 */
KVX_API int kvx_sched_rename(struct kvx_sched *s, const char *transfer_id, const char *new_request_id);

/**
 * Advance the clock and collect what became safe (PROTOCOL.md §5.4 update_connector_output).
 *
 * P: ACKed deferred transfers and parked ACKs that now match → FINISHED_SENDING; deferred past
 * the deadline → FINISHED_SENDING with reaped=true; parked ACKs past their deadline dropped;
 * anything with the wire busy stays quarantined. D: write_done applied → FINISHED_RECVING;
 * WRITE waits past transfer_timeout → FAILED(-ETIMEDOUT); aborted/failed blocks with an idle
 * wire → FREE_BLOCKS. Each transfer is reported freed exactly once.
 *
 * @param s        Scheduler; not NULL.
 * @param now_ns   Current time, ns.
 * @param[out] ev  Array[cap] events.
 * @param cap      Capacity; events beyond it are reported by the next call.
 * @return         Number of events, 0..cap.
 */
KVX_API size_t kvx_sched_update(struct kvx_sched *s, uint64_t now_ns, struct kvx_sched_event *ev, size_t cap);

/**
 * Number of live (not yet released) transfers, parked notifications excluded.
 * @param s Scheduler; not NULL. @return Count.
 */
KVX_API size_t kvx_sched_live(const struct kvx_sched *s);

/**
 * Read the counters.
 * @param s Scheduler; not NULL. @param[out] st Counters; not NULL.
 */
KVX_API void kvx_sched_get_stats(const struct kvx_sched *s, struct kvx_sched_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* KVX_SCHED_H */
