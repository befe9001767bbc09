/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_RUNTIME_INTERNAL_H
#define KVX_RUNTIME_INTERNAL_H
/*
 * Module-private: the per-transfer state machines the engine drives on its polling lcores
 * (docs/protocol.md §1.3 steps 8–11, §1.4 steps 8–12, §5.5, §5.6), kept free of I/O so the unit
 * tests drive them directly with an injected clock. One owner thread per table.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/common.h"
#include "kvxfer/engine.h"

/** Transfer id capacity including the NUL (ids are "tx-" + uuid4 in practice). */
#define KVX_XFER_ID_MAX 128
/** Layers per transfer tracked by the write-state bitmap. */
#define KVX_XFER_MAX_LAYERS 512
/** Default size of the terminal-id LRU (docs/protocol.md Appendix A item 4). */
#define KVX_XFER_TERMINAL_LRU 4096

/* Distinct named senders remembered per transfer for ACK de-duplication (>= the largest ACK
 * fan-in, kvx_ctl_expected_acks()); beyond it ACKs are counted as from MoRIIO peers. */
#define KVX_XFER_ACK_IDS 16

enum kvx_xfer_state {
	KVX_XFER_S_FREE = 0,
	KVX_XFER_S_LIVE = 1,
	KVX_XFER_S_TERMINAL = 2,
};

/* What the caller must do after a state change. */
enum kvx_xfer_action {
	KVX_XFER_ACT_NONE = 0,
	KVX_XFER_ACT_NOTIFY_WRITE_DONE = 1, /* P WRITE: all sealed writes terminal, send write_done once */
};

struct kvx_xfer {
	char tid[KVX_XFER_ID_MAX];
	uint32_t hash;
	uint32_t state;          /* enum kvx_xfer_state */
	uint32_t next;           /* hash chain, index+1 (0 = end) */
	uint32_t lru_next;       /* terminal FIFO, index+1 */
	/* WRITE producer (docs/protocol.md §1.3 steps 8–11). */
	uint64_t layers_sched[KVX_XFER_MAX_LAYERS / 64];
	uint32_t writes_scheduled; /* distinct layers scheduled */
	uint32_t writes_done;      /* layer writes whose ops are terminal */
	uint32_t writes_expected;  /* sealed count (valid when sealed) */
	bool sealed;
	bool notified;
	bool failed;
	bool has_alloc;            /* remote_blocks received */
	uint32_t *remote_blocks;   /* Array[n_remote_blocks], owned (control path allocation) */
	uint32_t n_remote_blocks;
	int32_t decode_dp_rank;
	uint64_t alloc_epoch;      /* `kvx_epoch` of the remote_blocks sender (0: a MoRIIO peer) */
	/* ACK fan-in on the producer (docs/protocol.md §5.6). */
	uint32_t ack_count;
	bool ack_completed;
	/* Owner's attachment: the engine's transfer object while it is live (poller tables: set at
	 * submission, cleared when the object retires; the app registry: until the last
	 * completion is polled), and, in the app registry only, the transfer's outcome: its one
	 * store, written by the app thread when it takes the KVX_CPL_TRANSFER completion off its
	 * poller's ring (kept while the id sits in the terminal LRU). */
	void *user;
	int32_t final_error;
	uint8_t final_status;
	/* Sender-named acks and failure notes between kvxfer peers (issue 14, control plane):
	 * written by the table's owner thread only. */
	uint64_t ack_from[KVX_XFER_ACK_IDS]; /* sender keys of the ACKs counted (0 = none) */
	uint32_t n_ack_from;
	uint8_t out_status;        /* poller tables: the transfer's reported status (with has_out) */
	bool has_out;
	bool ops_lost;             /* P WRITE: an op ended in error, so its bytes may still reach
				    * D's memory later (kernel buffers): no kvx_failed, no answer to
				    * a status query; D keeps its blocks quarantined instead */
	bool peer_failed;          /* D: a kvx_failed was received (status/error below) */
	int32_t out_error;         /* poller tables: the reported error */
	uint8_t peer_status;       /* D: the producer's status from kvx_failed */
	int32_t peer_error;        /* D: the producer's error from kvx_failed */
	const void *peer_ref;      /* poller tables: the engine's peer of the transfer (kept while
				    * the entry is in the terminal LRU: a late allocation is answered) */
	uint64_t peer_id;          /* ... and its id then: a slot reused for another peer since
				    * (params.peer_idle_ms) has another id and is not answered */
	uint16_t reply_port;       /* P SERVE: the notify listener of the READ consumer that asked
				    * (kvx_status_query with kvx_notify_*), 0 = none: kvx_failed goes
				    * there when the serve ends without success */
	char reply_host[KVX_ENGINE_HOST_MAX];
};

struct kvx_xfer_table;

/* FNV-1a of a transfer id: the one hash of ids in the runtime (transfer tables, the polling
 * lcore that owns a transfer). */
static inline uint32_t kvx_xfer_tid_hash(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 16777619u;
	return h;
}

/* Table of transfers keyed by transfer id, fixed capacity, terminal ids kept in a FIFO LRU of
 * lru_cap entries so late or duplicate notifications for finished transfers are ignored. */
int kvx_xfer_table_create(size_t capacity, size_t lru_cap, struct kvx_xfer_table **out);
void kvx_xfer_table_destroy(struct kvx_xfer_table *t);
/* Live or terminal entry for tid, or NULL. */
struct kvx_xfer *kvx_xfer_find(struct kvx_xfer_table *t, const char *tid);
/* Create a live entry. -EEXIST if tid is live or terminal (one-shot), -EINVAL for an empty or
 * too long id, -ENOBUFS if full. */
int kvx_xfer_open(struct kvx_xfer_table *t, const char *tid, struct kvx_xfer **out);
/* Mark terminal: frees per-transfer storage, keeps the id in the LRU. */
void kvx_xfer_make_terminal(struct kvx_xfer_table *t, struct kvx_xfer *x);
/* Forget a live entry that never started (its submission was refused after kvx_xfer_open():
 * no lease word, submission ring full): the id is free again, so the caller may retry it.
 * A terminal or free entry is left alone (a terminal id stays used). */
void kvx_xfer_discard(struct kvx_xfer_table *t, struct kvx_xfer *x);
size_t kvx_xfer_live_count(const struct kvx_xfer_table *t);

/* Per-transfer state changes. They take the entry (found or opened once per event by the
 * owner: kvx_xfer_find() / kvx_xfer_open()), never the id string again. */

/* WRITE producer (vectors T16–T20). true if @p layer is newly scheduled; false for a duplicate,
 * a terminal transfer or a layer index >= KVX_XFER_MAX_LAYERS. */
bool kvx_xfer_schedule_write(struct kvx_xfer *x, uint32_t layer);
/* Seal with the final layer count (engine API: the application states it). Returns the count,
 * -ENOENT if @p x is terminal. The action out-param says whether write_done is due now (the
 * transfer is then terminal). */
int kvx_xfer_seal_count(struct kvx_xfer_table *t, struct kvx_xfer *x, uint32_t n_layers, enum kvx_xfer_action *act);
/* One layer's writes are terminal on the wire (ok = every op succeeded). A failure makes the
 * transfer terminal (the producer frees its blocks, docs/protocol.md §5.5). */
enum kvx_xfer_action kvx_xfer_mark_write_done(struct kvx_xfer_table *t, struct kvx_xfer *x, bool ok);
/* Store D's allocation (remote_blocks), taking ownership of the malloc'ed @p ids (freed on
 * every path). 1 stored, 0 ignored (terminal), -EEXIST duplicate, -EPROTO empty list. */
int kvx_xfer_remote_blocks_take(struct kvx_xfer *x, uint32_t *ids, size_t n, int32_t decode_dp_rank,
				uint64_t alloc_epoch);

/* Which side of which mode a transfer is (role x mode). */
enum kvx_xfer_kind {
	KVX_XFER_K_READ = 1,     /* consumer READ: D reads P's blocks, then sends release */
	KVX_XFER_K_ANNOUNCE = 2, /* consumer WRITE: D announces its blocks, waits for write_done */
	KVX_XFER_K_WRITE = 3,    /* producer WRITE: P writes into D's blocks, then sends write_done */
	KVX_XFER_K_SERVE = 4,    /* producer READ: P holds its blocks until D's release */
};

/* The lifecycle state of one transfer, kept by its owning poller in the transfer object.
 * kvx_xfer_step() decides every change of kind-level state (aborted, timed_out, error,
 * release_sent, fence_pending, quarantine_ns); the poller maintains the facts of its I/O as
 * inputs (ops_out, next_layer, done_posting, failed) and sets reported / released when it
 * performs a REPORT / RELEASE action. */
struct kvx_life {
	enum kvx_xfer_kind kind;
	bool reported;      /* its terminal status is out */
	bool released;      /* its blocks are reusable: it retired */
	bool aborted;       /* the application (or, for P WRITE, D) aborted it */
	bool timed_out;
	bool failed;        /* an op or a post failed (error says why) */
	bool release_sent;  /* D READ: release (P WRITE: write_done on abort) went out */
	bool done_posting;  /* D READ: nothing more will be posted */
	bool fence_pending; /* P READ: timed out, blocks held until every reader is revoked; D WRITE:
			     * quarantine expired, blocks held until every writer is cut */
	int error;          /* 0 or negative errno */
	uint32_t ops_out;   /* op batches in flight, and layers handed to another poller whose
			     * outcome is not back yet (layer spread, poller_post.c) */
	uint32_t next_layer; /* D READ: layers posted so far */
	uint64_t start_ns;  /* submission time (app thread clock) */
	uint64_t hs_after;  /* the peer's count of finished handshakes at submission (app thread) */
	uint64_t quarantine_ns; /* D WRITE ended early: blocks held until write_done or this time */
	/* The peer's incarnation (docs/protocol.md §6 item 18), decided by kvx_xfer_step() from
	 * the connection facts the poller feeds in (PEER_CONNECTED, PEER_EPOCH, OP_FAILED). */
	bool await_peer;      /* D READ: an op failed on a dead endpoint before any byte landed:
			       * retry or fail once the peer is connected again */
	uint64_t bound_epoch; /* epoch of the connection the transfer is bound to (0: none yet) */
	bool alloc_known;     /* P WRITE: the consumer incarnation that allocated is settled */
	uint64_t alloc_epoch; /* P WRITE: its epoch (0: bind whatever connects) */
	bool check_wait;      /* P WRITE: waiting for the peer's epoch check number check_need */
	uint64_t check_need;
	bool peer_stopped;  /* P WRITE: D's release stopped it (D has reported already) */
	bool queried;       /* D WRITE: the status query went out; D READ: the producer was asked
			     * to send kvx_failed if its serve ends without success */
	uint64_t query_ns;  /* D WRITE: when the status query went out (0: not yet) */
	bool await_note;    /* D READ: its lease was revoked (-ESTALE) after it asked: the producer's
			     * kvx_failed is awaited (until the deadline) for its status and reason */
	uint8_t peer_status; /* D READ: the producer's status from its kvx_failed (0: none) */
};

/* What the owning poller does after a lifecycle decision, in this order: send the
 * notifications, stop or drive the transfer's ops, report its terminal status, then release
 * or hold its blocks. */
enum kvx_xfer_do {
	KVX_XFER_DO_SEND_RELEASE = 1u << 0,     /* release to P's TP rank paired with ours (D READ) */
	KVX_XFER_DO_SEND_RELEASE_ALL = 1u << 1, /* release to every P TP rank (D WRITE) */
	KVX_XFER_DO_SEND_BLOCKS = 1u << 2,      /* remote_blocks to every P TP rank (D WRITE) */
	KVX_XFER_DO_SEND_WRITE_DONE = 1u << 3,  /* write_done to D (P WRITE): with status DONE to the
						 * D rank that sent remote_blocks, else (writes over
						 * after an abort) to our paired D rank */
	KVX_XFER_DO_STOP_WRITES = 1u << 4,      /* P WRITE: post nothing more (the entry is terminal) */
	KVX_XFER_DO_PROGRESS = 1u << 5,         /* post what is ready / finish once ops are terminal */
	KVX_XFER_DO_REPORT = 1u << 6,           /* ends with status / error (once) */
	KVX_XFER_DO_RELEASE = 1u << 7,          /* blocks reusable now: the transfer retires */
	KVX_XFER_DO_QUARANTINE = 1u << 8,       /* D WRITE: blocks held until write_done or the defer
						 * deadline (kvx_xfer_tick()) */
	KVX_XFER_DO_FENCE = 1u << 9,            /* P READ / D WRITE: blocks held until every reader /
						 * writer of them is cut at the wire */
	KVX_XFER_DO_POST_LAYER = 1u << 10,      /* P WRITE: the event's layer is to be written */
	KVX_XFER_DO_SEND_FAILED = 1u << 11,     /* P WRITE: kvx_failed (status / error) to the kvxfer
						 * D rank that sent remote_blocks; nothing of ours
						 * is in flight for the transfer any more */
	KVX_XFER_DO_SEND_QUERY = 1u << 12,      /* D WRITE: kvx_status_query to every P TP rank */
	KVX_XFER_DO_BIND = 1u << 13,            /* bind the peer's current connection (the event's) */
	KVX_XFER_DO_REPOST = 1u << 14,          /* D READ: post every layer again on it (nothing landed) */
	KVX_XFER_DO_RESET_PEER = 1u << 15,      /* the connection (the op's, or the peer's current one)
						 * is dead or of a gone incarnation: mark it stale and
						 * re-handshake the peer */
	KVX_XFER_DO_EPOCH_CHECK = 1u << 16,     /* P WRITE: fetch the peer's epoch again (a metadata-only
						 * handshake; a no-op while one runs) */
};

struct kvx_xfer_out {
	uint32_t act;                /* enum kvx_xfer_do bits */
	enum kvx_cpl_status status;  /* with KVX_XFER_DO_REPORT */
	int error;                   /* with KVX_XFER_DO_REPORT: 0 or negative errno */
	bool late;                   /* the notification was ignored (count it) */
};

/* Events the owning poller feeds into a transfer's lifecycle (kvx_xfer_step()). */
enum kvx_xfer_ev_type {
	/* The submission reached its poller (docs/protocol.md §1.3 step 5, §1.4 step 8, §6 items 3,
	 * 10): a consumer READ posts (nothing to move: release P, DONE); D WRITE announces its
	 * blocks (none: release every P rank, DONE); a notification that came first (the entry is
	 * terminal with its fan-in complete) ends it at once: DONE, or for P WRITE ABORTED with a
	 * write_done telling D that nothing was written. */
	KVX_XFER_EV_SUBMIT = 1,
	/* The application aborts (docs/protocol.md §5.3, §6 item 10): D WRITE tells every P rank to stop
	 * and quarantines its blocks; P WRITE stops posting (its entry turns terminal) and releases
	 * once its ops are terminal; D READ releases P once its ops are terminal; P READ releases. */
	KVX_XFER_EV_ABORT = 2,
	/* The clock (docs/protocol.md §5.4, §5.5, §6 item 11): a transfer not yet reported times out once
	 * now - start > its limit (strict), the defer timeout for a producer holding blocks for a
	 * peer (SERVE; WRITE before D's allocation), else the transfer timeout. D WRITE: tell P to
	 * stop, quarantine; P WRITE: stop, release once ops are terminal; P READ: hold the blocks
	 * until every reader is revoked (fence); D READ: settle once ops are terminal. A reported
	 * D WRITE still in quarantine once now > quarantine_ns (no answer from P) is fenced: every
	 * connection a late write could land through is cut (FENCE), then FENCED releases it. */
	KVX_XFER_EV_TICK = 3,
	/* D READ: posting went on or an op completed (docs/protocol.md §1.4 steps 9-10, §5.5). Nothing
	 * while ops are in flight. Ended already: P is released only if something was posted or
	 * it was aborted (a producer that never answered gets no late release), then the blocks.
	 * Every layer posted or failed: release P, DONE or FAILED, blocks reusable. */
	KVX_XFER_EV_READ_SETTLE = 4,
	/* Inbound release (docs/protocol.md §5.6): on a P WRITE, D aborted: stop posting, ABORTED,
	 * write_done once the ops are terminal. Else one ACK of the fan-in on the entry (a parked
	 * entry when the transfer is not submitted yet: @p lf NULL); when it completes a P READ:
	 * DONE, blocks reusable. A bad tp combination is late. */
	KVX_XFER_EV_RELEASE = 5,
	/* Inbound write_done: one ACK of the fan-in (parked likewise); when it completes a D WRITE:
	 * DONE, or after an abort / timeout its blocks leave quarantine. Ignored (late) when nothing
	 * completes for a transfer that is not submitted. */
	KVX_XFER_EV_WRITE_DONE = 6,
	/* P WRITE ended (aborted, timed out, failed) or its entry is terminal: once its ops are
	 * terminal, tell an aborting D that writes are over, then release the blocks. */
	KVX_XFER_EV_WRITE_SETTLE = 7,
	/* The handshake with the peer failed while the transfer has no usable connection: a D
	 * READ or P WRITE fails (released once its ops are terminal); others keep waiting. A
	 * handshake that ended before the submission (`hs_ends` <= lf.hs_after: the one this
	 * transfer asked for is still to come) changes nothing. */
	KVX_XFER_EV_PEER_FAILED = 8,
	/* P READ: the readers of its blocks are revoked; D WRITE: its writers are cut (fence done):
	 * the blocks are reusable. */
	KVX_XFER_EV_FENCED = 9,
	/* P WRITE: the application says layer `layer` is (or will be, by its event) computed
	 * (docs/protocol.md §1.3 step 8): POST_LAYER once per layer; a duplicate is a no-op. */
	KVX_XFER_EV_LAYER_READY = 10,
	/* P WRITE: the application seals the transfer at `n_layers` layers (docs/protocol.md §1.3 step
	 * 10); if they are all written, write_done is due now: DONE. */
	KVX_XFER_EV_SEAL = 11,
	/* P WRITE: one layer's writes all completed successfully (or it had nothing to move);
	 * once the sealed count is reached, write_done goes out once: DONE. */
	KVX_XFER_EV_LAYER_WRITTEN = 12,
	/* P WRITE: a write, its post or its layer's readiness event failed with `error`: nothing
	 * more is written, FAILED; the blocks are released once the ops in flight are terminal
	 * (KVX_XFER_EV_WRITE_SETTLE). */
	KVX_XFER_EV_WRITE_FAILED = 13,
	/* Inbound remote_blocks (D's allocation, docs/protocol.md §1.3 step 5b): stored on the entry
	 * (parked if not submitted yet); a P WRITE then posts what is ready. A duplicate, an empty
	 * list or one for a finished transfer is late. */
	KVX_XFER_EV_REMOTE_BLOCKS = 14,
	/* Inbound kvx_failed (kvxfer producers only, sent after their fence): one terminal ACK of
	 * the fan-in from a named sender (parked if not submitted yet). A D WRITE not yet reported
	 * ends at once with the producer's status and error; its blocks are released once every
	 * producer rank has answered (write_done or kvx_failed), else the other ranks are told to
	 * stop and the blocks stay quarantined. */
	KVX_XFER_EV_PEER_FAILED_NOTE = 15,
	/* Inbound kvx_status_query (a kvxfer consumer about to time out): the poller answers from
	 * the entry's stored outcome (write_done for DONE, kvx_failed otherwise); nothing while the
	 * transfer runs, while writes of an ended P WRITE are in flight (@p lf given: its ops_out;
	 * its kvx_failed follows once they are terminal) or when nothing is known. */
	KVX_XFER_EV_STATUS_QUERY = 16,
	/* An op completed with `error`; `ep_dead`: its endpoint is in error state (RESET_PEER).
	 * A D READ that moved nothing yet (`moved` false) over a dead endpoint may be facing a
	 * restarted producer: it awaits the next connection (PEER_CONNECTED decides); any other
	 * failure fails the transfer (the poller then settles it as before). */
	KVX_XFER_EV_OP_FAILED = 17,
	/* Peer connected: the peer has a usable connection of epoch `epoch` that the transfer is
	 * not bound to (`bound`: it is bound to an older, stale one; `moved`: bytes landed).
	 * Nothing while own ops drain. D READ bound before: retry from layer 0 (BIND | REPOST)
	 * only against a new epoch with nothing moved (the old incarnation's blocks are gone
	 * either way), else the same epoch means a fence or a link failure and the blocks may be
	 * reused: FAILED -ECONNRESET. P WRITE: a new epoch after it was bound, or one other than
	 * the allocation's, means the consumer restarted and its allocation is gone: FAILED
	 * -ECONNRESET (never write into the new process). Else BIND. */
	KVX_XFER_EV_PEER_CONNECTED = 18,
	/* Peer new epoch (P WRITE, before its first post): which consumer incarnation made the
	 * allocation? The epoch remote_blocks named (`kvx_epoch`, on the entry) settles it; a
	 * MoRIIO consumer names none: then a link that carried a successful op within the
	 * freshness window (`link_fresh`) vouches for the connection's epoch, else the peer's
	 * epoch is checked again (EPOCH_CHECK; a check numbered after the allocation counts:
	 * `check_started` / `check_done` / `checked_epoch`, 0 = the check failed: trust the
	 * connection). An allocation epoch other than the live connection's: RESET_PEER. A
	 * connection being replaced (`conn_stale`) or none yet: whatever connects next is current. */
	KVX_XFER_EV_PEER_EPOCH = 19,
};

struct kvx_xfer_ev {
	enum kvx_xfer_ev_type type;
	uint64_t now_ns;              /* TICK, ABORT (quarantine deadline) */
	uint64_t transfer_timeout_ns; /* TICK */
	uint64_t defer_timeout_ns;    /* TICK, ABORT */
	size_t n_blocks;              /* SUBMIT: the transfer's block count */
	uint32_t layer;               /* LAYER_READY: the layer index */
	uint32_t n_layers;            /* SEAL: the final layer count */
	uint32_t *block_ids;          /* REMOTE_BLOCKS: malloc'ed Array[n_blocks], always taken */
	int32_t decode_dp_rank;       /* REMOTE_BLOCKS: the D DP rank that sent it */
	uint64_t alloc_epoch;         /* REMOTE_BLOCKS: its sender's incarnation (0: a MoRIIO peer) */
	uint32_t consumer_tp;         /* RELEASE / WRITE_DONE: fan-in sizes (docs/protocol.md §5.6) */
	uint32_t producer_tp;
	uint64_t sender_key;          /* RELEASE / WRITE_DONE / PEER_FAILED_NOTE: the named sender
				       * (kvx_xfer_sender_key()), 0 for a MoRIIO sender (counted) */
	uint32_t fail_status;         /* PEER_FAILED_NOTE: the producer's enum kvx_cpl_status */
	bool query_peer;              /* TICK: D WRITE may ask its producer (a kvxfer peer) first */
	bool fence_writers;           /* TICK: a D WRITE whose quarantine expired unanswered must cut
				       * its writers first: some data transport neither checks a
				       * lease per op at the target (caps.cond_ops) nor is same-host */
	uint64_t query_grace_ns;      /* TICK: how long before its deadline D asks */
	bool has_alloc;               /* TICK: P WRITE holds D's allocation */
	bool unbound;                 /* PEER_FAILED: no usable connection */
	uint64_t hs_ends;             /* PEER_FAILED: the peer's count of finished handshakes, this one included */
	int error;                    /* PEER_FAILED: the handshake's errno; WRITE_FAILED, OP_FAILED: the cause;
				       * PEER_FAILED_NOTE: the producer's error */
	bool ep_dead;                 /* OP_FAILED: the op's endpoint is in error state */
	bool moved;                   /* OP_FAILED, PEER_CONNECTED: bytes of the transfer landed */
	bool bound;                   /* PEER_CONNECTED: bound to an older connection */
	uint64_t epoch;               /* PEER_CONNECTED: the connection's epoch */
	bool has_conn;                /* PEER_EPOCH: the peer has a published connection ... */
	bool conn_stale;              /* ... being replaced ... */
	uint64_t conn_epoch;          /* ... of this epoch ... */
	bool link_fresh;              /* ... whose link carried a successful op just now */
	uint64_t check_started, check_done, checked_epoch; /* PEER_EPOCH: the peer's epoch checks */
};

/* The de-duplication key of a named sender (engine id, TP rank, epoch): never 0. */
uint64_t kvx_xfer_sender_key(const char *engine_id, uint32_t rank, uint64_t epoch);

/* The one entry into a transfer's lifecycle: apply @p ev to @p lf (and to its entry @p t, the
 * poller's table entry; NULL for a consumer READ or when it has none) and say in @p o what the
 * poller must do. @p lf is NULL only for a notification whose transfer is not submitted yet
 * (its entry parks it). No I/O, no clock: time comes in the event. Never fails. Poller
 * thread. */
void kvx_xfer_step(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf, const struct kvx_xfer_ev *ev,
		   struct kvx_xfer_out *o);

/* ACK fan-in (docs/protocol.md §5.6, vectors T26–T27): returns 1 when @p x completes now, 0 if more
 * ACKs are needed or the ACK is ignored (not live, duplicate), negative errno for a bad tp
 * combination. A completed transfer becomes terminal. */
int kvx_xfer_resolve_ack(struct kvx_xfer_table *t, struct kvx_xfer *x, uint32_t consumer_tp, uint32_t producer_tp);

#endif /* KVX_RUNTIME_INTERNAL_H */
