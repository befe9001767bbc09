/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_POLLER_INTERNAL_H
#define KVX_POLLER_INTERNAL_H
/*
 * Module-private: the functions the polling lcore's files call across one another
 * (runtime/poller.c: the loop, submissions, lifecycle actions, timeouts, fences;
 * poller_conn.c: connections and handshakes; poller_post.c: posting, completions, layer
 * spread; poller_notify.c: notifications out and in). All run on a polling lcore; the state
 * they touch is described at the structs in engine_internal.h.
 */
#include "engine_internal.h"

/* poller.c */
/* The transfer's entry in the poller's table while it still belongs to it (an entry made
 * terminal stays until the LRU evicts it; evicted or reused, it no longer names x). */
struct kvx_xfer *po_xf_entry(struct xf *x);
/* The live transfer a handle names on this poller, or NULL (retired, reused). */
struct xf *po_handle_xf(struct poller *po, uint32_t slot, uint32_t gen);
/* Perform what a lifecycle decision of xfer.c asks for (enum kvx_xfer_do, in its order). The
 * transfer may retire here (KVX_XFER_DO_RELEASE): the caller must not touch it afterwards. */
void po_apply(struct poller *po, struct xf *x, const struct kvx_xfer_out *o);
/* Feed one event into the transfer's lifecycle (kvx_xfer_step()) and perform its actions.
 * Returns true if the transfer retired: the caller must not touch it afterwards. */
bool po_step(struct poller *po, struct xf *x, struct kvx_xfer_ev ev);
/* The poller's entry for a transfer id: found, or opened (a notification that arrives before
 * its transfer is submitted is parked there). NULL if the table is full. */
struct kvx_xfer *po_tab_get(struct poller *po, const char *tid);

/* poller_conn.c */
/* 1 if x has a usable connection to post on, 0 to wait (no connection yet, re-handshake in
 * progress, own ops still draining), -1 if the lifecycle ended it here (the caller must not
 * touch it again). The decisions are kvx_xfer_step()'s (PEER_CONNECTED, PEER_FAILED); this
 * function gathers the facts and performs BIND / REPOST. */
int po_xf_conn(struct poller *po, struct xf *x);
/* P WRITE: which incarnation of the consumer made the allocation (remote_blocks)? tcp/shm do
 * not watch idle connections, so a consumer that died and restarted on the same ports is not
 * noticed until an op fails. kvx_xfer_step(PEER_EPOCH) decides from the facts gathered here:
 * the epoch the allocation named (`kvx_epoch` of a kvxfer consumer), or for a MoRIIO consumer
 * the connection's epoch when its link carried a successful op within KVX_EPOCH_FRESH_NS,
 * else the result of a metadata-only handshake (an epoch check on the control lcore). An
 * allocation epoch other than the connection's means the consumer restarted: the connection is
 * marked stale and re-handshaken, and PEER_CONNECTED later refuses to write into a connection
 * of another epoch than the allocation's. Returns true once the allocation epoch is settled. */
bool po_alloc_epoch_settle(struct poller *po, struct xf *x);
void po_list_link(struct poller *po, struct conn *c);
/* A connection's endpoint is in error state (transport.h: every op on it fails from now on):
 * no new transfer binds it, and the peer is re-handshaken at once (a new connection with new
 * endpoints; the old one drains and is freed when unreferenced) (docs/protocol.md §6 item 18). */
void po_conn_stale(struct poller *po, struct conn *c);
/* A stale connection whose re-handshake could not be queued (inbox full): retry. */
void po_rehs_scan(struct poller *po);

/* poller_post.c */
/* Owner: once nothing more of x is to be posted (reported, failed, awaiting the peer's next
 * connection, a P WRITE whose entry is no longer live), layers still queued at a helper are
 * returned unposted. */
void po_spread_fence(struct xf *x);
/* Helper: take new hand-offs and retry those whose first batch found the queue full. Returns
 * whether there was work (hand-offs left to retry keep the poller spinning). */
bool po_dlg_serve(struct poller *po);
/* Owner: outcomes of its hand-offs. Each applies as the completions of the layer's ops would
 * here (po_handle_cpl()): bytes, an op failure through the lifecycle (OP_FAILED), a partial post
 * as a post failure, then the layer's end. */
bool po_dlg_results(struct poller *po);
void po_write_progress(struct poller *po, struct xf *x);
void po_progress(struct poller *po, struct xf *x);
void po_handle_cpl(struct poller *po, struct conn *cn, const struct kvx_xport_cpl *c);

/* poller_notify.c */
uint32_t po_peer_tp(const struct kvx_engine *e, const struct peer *pr);
/* Host of the peer's DP rank @p dp: its pod's host, else the peer host (docs/protocol.md §5.8). */
const char *po_peer_host_of(const struct peer *pr, uint32_t dp);
/* Notify port of the peer TP rank this worker pairs with (docs/protocol.md §2.4 targets). */
uint16_t po_peer_notify_port(const struct kvx_engine *e, const struct peer *pr, uint32_t rtp);
/* Queue @p m for host:port; kvxfer's acks, failure notes and queries name this worker (engine
 * id, TP rank, epoch: extra keys a MoRIIO peer ignores), so a duplicate is recognised. */
void po_send_msg(struct poller *po, const char *host, uint16_t port, struct kvx_msg_notify *m);
void po_send_to_paired_rank(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid);
/* D WRITE: remote_blocks / release go to every P TP rank, from TP rank 0 only (docs/protocol.md
 * §1.3 step 5b: the scheduler of the D DP rank sends once). */
void po_send_to_all_ranks(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid,
			      const uint32_t *blocks, uint32_t n);
/* P WRITE: write_done (DONE) or kvx_failed (else) to the D DP rank that sent remote_blocks (its
 * decode rank, else the peer's), its TP rank paired with ours. Also answers a status query or
 * a late allocation from the entry alone (the transfer object may be gone). */
void po_send_outcome(struct poller *po, const struct peer *pr, const struct kvx_xfer *t, const char *tid,
			 enum kvx_cpl_status st, int error, const char *why);
/* P SERVE: kvx_failed for transfer @p tid (status @p st, not DONE) to the READ consumer that
 * asked for it at @p host : @p port (docs/protocol.md §5.10). */
void po_send_serve_note(struct poller *po, const char *host, uint16_t port, const char *tid,
			    enum kvx_cpl_status st, int error, const char *why);
/* D READ, once, when its lease window shows the producer's grant (@p revoked false) or its
 * revocation (true): ask the producer (a kvxfer engine: READs only run against those) to send
 * kvx_failed here if its serve ends, or ended, without success. The transfer takes an entry
 * in the table so that the note finds it. */
void po_read_ask(struct poller *po, struct xf *x, bool revoked);
void po_send_write_done(struct poller *po, struct xf *x);
/* Inbound notification for a transfer id: the one place on a poller where an id is resolved
 * (its table: the live transfer attached to the entry, or a parked entry). */
void po_handle_notify(struct poller *po, struct emsg *m);

#endif /* KVX_POLLER_INTERNAL_H */
