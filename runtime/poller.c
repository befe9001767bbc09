/* SPDX-License-Identifier: Apache-2.0 */
/* The polling lcores: the poll loop and its glue (submissions, control messages, completions,
 * timeouts, reader fences), posting through the providers, and outbound notifications through
 * the poller's own control inbox. Every function here runs on the polling lcore that owns the
 * transfer (eng_tid_poller()), except eng_cpl_build() / eng_push_cpl() / eng_remove_live(),
 * which kvx_engine_stop() also calls once the pollers are joined. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "engine_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Pollers                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static uint32_t port_off(const struct kvx_engine *e, uint32_t dp, uint32_t tp, uint32_t tp_size)
{
	uint32_t off = 0;
	kvx_ctl_port_offset(e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE, dp, tp, tp_size,
			    &off);
	return off;
}

static uint32_t peer_tp(const struct kvx_engine *e, const struct peer *pr)
{
	return pr->tp_size ? pr->tp_size : e->p.tp_size;
}

/* Host of the peer's DP rank @p dp: its pod's host, else the peer host (docs/protocol.md §5.8). */
static const char *peer_host_of(const struct peer *pr, uint32_t dp)
{
	const char *host;
	uint32_t local;
	kvx_ctl_dp_target(dp, pr->dp_size_local, pr->n_pods ? pr->pod_ptr : NULL, pr->n_pods, pr->host, &host,
			  &local);
	return host;
}

/* Notify port of the peer TP rank this worker pairs with (docs/protocol.md §2.4 targets). */
static uint16_t peer_notify_port(const struct kvx_engine *e, const struct peer *pr, uint32_t rtp)
{
	uint32_t ptp = peer_tp(e, pr);
	return (uint16_t)(pr->notify_port + port_off(e, kvx_ctl_fold_local_rank(pr->dp_rank, pr->dp_size_local), rtp, ptp));
}

static void send_notify_to(struct poller *po, const char *host, uint16_t port, enum kvx_msg_type t,
			   const char *tid, const uint32_t *blocks, uint32_t n, bool own_epoch);

/* To the peer's own DP rank (its pod host). */
static void send_notify(struct poller *po, const struct peer *pr, uint16_t port, enum kvx_msg_type t,
			const char *tid, const uint32_t *blocks, uint32_t n, bool own_epoch)
{
	send_notify_to(po, peer_host_of(pr, pr->dp_rank), port, t, tid, blocks, n, own_epoch);
}

/* Queue @p m for host:port; kvxfer's acks, failure notes and queries name this worker (engine
 * id, TP rank, epoch: extra keys a MoRIIO peer ignores), so a duplicate is recognised. */
static void send_msg(struct poller *po, const char *host, uint16_t port, struct kvx_msg_notify *m)
{
	struct kvx_engine *e = po->e;
	if (m->type != KVX_MSG_REMOTE_BLOCKS) {
		snprintf(m->sender_id, sizeof(m->sender_id), "%s", e->self_id);
		m->sender_rank = e->p.tp_rank;
		m->sender_epoch = e->self_epoch;
	}
	if (kvx_ctl_send_notify(po->ib, host, port, m))
		atomic_fetch_add_explicit(&e->st_notify_drop, 1, memory_order_relaxed);
}

/* own_epoch (remote_blocks): the receiving P rank writes into this worker, so this engine's epoch
 * names the incarnation it writes to; else the key is left out (P then settles it as for MoRIIO). */
static void send_notify_to(struct poller *po, const char *host, uint16_t port, enum kvx_msg_type t,
			   const char *tid, const uint32_t *blocks, uint32_t n, bool own_epoch)
{
	struct kvx_engine *e = po->e;
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = t;
	strcpy(m.transfer_id, tid);
	if (t == KVX_MSG_RELEASE) {
		m.consumer_tp_size = e->p.tp_size;
		m.has_consumer_tp_size = true;
	} else if (t == KVX_MSG_REMOTE_BLOCKS) {
		m.block_ids = (uint32_t *)blocks;
		m.num_blocks = n;
		m.decode_rank = e->p.dp_rank;
		m.sender_epoch = own_epoch ? kvx_ctl_epoch(e->ctl) : 0; /* names this incarnation (kvxfer peers) */
	}
	send_msg(po, host, port, &m);
}

static void send_to_paired_rank(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid)
{
	struct kvx_engine *e = po->e;
	uint32_t rtp = 0;
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, peer_tp(e, pr), &rtp, NULL, 0);
	send_notify(po, pr, peer_notify_port(e, pr, rtp), t, tid, NULL, 0, true);
}

/* D WRITE: remote_blocks / release go to every P TP rank, from TP rank 0 only (docs/protocol.md
 * §1.3 step 5b: the scheduler of the D DP rank sends once). */
static void send_to_all_ranks(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid,
			      const uint32_t *blocks, uint32_t n)
{
	struct kvx_engine *e = po->e;
	if (e->p.tp_rank != 0)
		return;
	for (uint32_t r = 0; r < peer_tp(e, pr); r++) {
		uint32_t dtp = UINT32_MAX; /* the D rank P rank r writes to (§4.5 pairing) */
		kvx_ctl_remote_tp_rank(r, peer_tp(e, pr), e->p.tp_size, &dtp, NULL, 0);
		send_notify(po, pr, peer_notify_port(e, pr, r), t, tid, blocks, n, dtp == e->p.tp_rank);
	}
}

void eng_cpl_build(const struct kvx_engine *e, const struct xf *x, struct cmsg *c, enum kvx_cpl_kind kind,
		  enum kvx_cpl_status st, int error, bool last)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->c.transfer_id, x->tid);
	c->c.kind = kind;
	c->c.role = e->p.role;
	c->c.status = st;
	c->c.error = error;
	c->c.bytes = x->bytes;
	c->c.duration_ns = kvx_now_ns() - x->lf.start_ns;
	c->c.first_layer_ns = x->first_layer_ns > x->lf.start_ns ? x->first_layer_ns - x->lf.start_ns : 0;
	c->xf = (void *)x;
	c->last = last;
}

/* The ring holds 4 entries per transfer slot; at most 2 per transfer are ever queued. After a
 * `last` entry is enqueued the application may reuse the xf: the caller must not touch it. */
void eng_push_cpl(struct poller *po, const struct cmsg *c, unsigned n)
{
	kvx_ring_enqueue_elem_burst_sp(po->cpl, c, n, NULL);
}

void eng_remove_live(struct poller *po, struct xf *x)
{
	uint32_t i = x->live_idx;
	po->live[i] = po->live[--po->n_live];
	po->live[i]->live_idx = i;
	x->live = false;
	po->owned[x->slot] = 0;
	if (x->t && x->t->user == x) {
		if (x->lf.kind == KVX_XFER_K_READ)
			kvx_xfer_make_terminal(po->tab, x->t); /* its entry only took the producer's note */
		x->t->user = NULL;
	}
	x->t = NULL;
	eng_conn_put(x->conn); /* retiring: no op of x is outstanding */
	x->conn = NULL;
}

/* The transfer's entry in the poller's table while it still belongs to it (an entry made
 * terminal stays until the LRU evicts it; evicted or reused, it no longer names x). */
static struct kvx_xfer *xf_entry(struct xf *x)
{
	return x->t && x->t->user == x ? x->t : NULL;
}

/* The live transfer a handle names on this poller, or NULL (retired, reused). */
static struct xf *handle_xf(struct poller *po, uint32_t slot, uint32_t gen)
{
	if (slot >= po->e->p.max_transfers || po->owned[slot] != gen)
		return NULL;
	return &po->e->xpool[slot];
}

static void count_terminal(struct poller *po, struct xf *x, enum kvx_cpl_status st)
{
	struct kvx_engine *e = po->e;
	_Atomic uint64_t *c = st == KVX_CPL_DONE ? &e->st_done
			      : st == KVX_CPL_ABORTED ? &e->st_aborted
			      : st == KVX_CPL_TIMED_OUT ? &e->st_timed_out
							: &e->st_failed;
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&po->st_transfers, 1, memory_order_relaxed);
	if (st == KVX_CPL_FAILED || st == KVX_CPL_TIMED_OUT)
		atomic_fetch_add_explicit(&po->st_failures, 1, memory_order_relaxed);
	if (x->peer) {
		atomic_fetch_add_explicit(&x->peer->transfers, 1, memory_order_relaxed);
		if (st != KVX_CPL_DONE)
			atomic_fetch_add_explicit(&x->peer->failures, 1, memory_order_relaxed);
	}
}

/* Report the terminal state once; if release_now the blocks are reusable too and the xf
 * retires: it is unlinked first and the completions are enqueued last, so the poller never
 * touches an xf the application may already have reused. */
static void report(struct poller *po, struct xf *x, enum kvx_cpl_status st, int error, bool release_now)
{
	struct kvx_engine *e = po->e;
	struct cmsg c[2];
	unsigned n = 0;
	bool wake = false;
	if (x->lease_idx) {
		/* The serve ended (release, abort, timeout): its readers' lease is revoked before
		 * anything hands the blocks back (runtime/lease.c). */
		uint64_t w = eng_lease_clear(e, x->lease_idx - 1);
		if (x->lf.kind == KVX_XFER_K_ANNOUNCE)
			x->lease_revoked = w;
		x->lease_idx = 0;
	}
	if (release_now && x->lease_revoked && !x->lf.released && (x->lf.reported || st != KVX_CPL_DONE) &&
	    eng_writers_busy(e, x->lease_revoked)) {
		/* D WRITE ended early: a producer's shm copy that passed its lease check before the
		 * revocation is still running (its busy word shows the word we revoked). The blocks
		 * stay held; scan_timeouts() asks again at every tick. Every later copy finds the
		 * tombstone and moves nothing (transport/shm/shm.c cond_enter()). */
		release_now = false;
		if (!x->busy_hold) {
			x->busy_hold = true;
			po->n_busy_hold++;
			atomic_fetch_add_explicit(&e->st_writer_holds, 1, memory_order_relaxed);
		}
	} else if (release_now && x->busy_hold) {
		x->busy_hold = false;
		po->n_busy_hold--;
	}
	if (!x->lf.reported) {
		x->lf.reported = true;
		wake = true;
		count_terminal(po, x, st);
		bool release_cpl = x->lf.kind == KVX_XFER_K_WRITE || x->lf.kind == KVX_XFER_K_SERVE || st != KVX_CPL_DONE;
		eng_cpl_build(e, x, &c[n++], KVX_CPL_TRANSFER, st, error, release_now && !release_cpl);
		if (release_now && release_cpl)
			eng_cpl_build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
		else if (release_cpl)
			atomic_fetch_add_explicit(&e->st_quar, 1, memory_order_relaxed);
	} else if (release_now && !x->lf.released) {
		eng_cpl_build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
	} else {
		return;
	}
	if (release_now && !x->lf.released) {
		x->lf.released = true;
		kvx_ctl_mark_terminal(po->ib, x->tid);
		eng_remove_live(po, x);
	}
	eng_push_cpl(po, c, n);
	/* After the enqueue: a waiting kvx_xfer_layer_wait() finds the outcome in the ring. */
	if (wake)
		kvx_waiter_wake(&e->app_w);
}

static void progress(struct poller *po, struct xf *x);
static struct kvx_xfer *xf_entry(struct xf *x);
static void spread_fence(struct xf *x);

/* P WRITE: write_done (DONE) or kvx_failed (else) to the D DP rank that sent remote_blocks (its
 * decode rank, else the peer's), its TP rank paired with ours. Also answers a status query or
 * a late allocation from the entry alone (the transfer object may be gone). */
static void send_outcome(struct poller *po, const struct peer *pr, const struct kvx_xfer *t, const char *tid,
			 enum kvx_cpl_status st, int error, const char *why)
{
	struct kvx_engine *e = po->e;
	int32_t decode_dp = t ? t->decode_dp_rank : -1;
	uint32_t rtp = 0, dtp = peer_tp(e, pr);
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, dtp, &rtp, NULL, 0);
	uint32_t dp = decode_dp >= 0 ? (uint32_t)decode_dp : pr->dp_rank;
	uint16_t port = (uint16_t)(pr->notify_port +
				   port_off(e, kvx_ctl_fold_local_rank(dp, pr->dp_size_local), rtp, dtp));
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	m.type = st == KVX_CPL_DONE ? KVX_MSG_WRITE_DONE : KVX_MSG_FAILED;
	if (m.type == KVX_MSG_FAILED) {
		m.fail_status = (uint32_t)st;
		m.fail_error = error <= 0 && error >= -4095 ? error : -EIO;
		snprintf(m.reason, sizeof(m.reason), "%s",
			 why			  ? why
			 : st == KVX_CPL_ABORTED   ? "the producer aborted the transfer"
			 : st == KVX_CPL_TIMED_OUT ? "the producer timed out"
						   : "the producer failed (handshake, connection or write)");
	}
	send_msg(po, peer_host_of(pr, dp), port, &m);
}

static struct kvx_xfer *tab_get(struct poller *po, const char *tid);

/* P SERVE: kvx_failed for transfer @p tid (status @p st, not DONE) to the READ consumer that
 * asked for it at @p host : @p port (docs/protocol.md §5.10). */
static void send_serve_note(struct poller *po, const char *host, uint16_t port, const char *tid,
			    enum kvx_cpl_status st, int error, const char *why)
{
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	m.type = KVX_MSG_FAILED;
	m.fail_status = st == KVX_CPL_DONE ? KVX_CPL_FAILED : (uint32_t)st;
	m.fail_error = error < 0 && error >= -4095 ? error : -EIO;
	snprintf(m.reason, sizeof(m.reason), "%s",
		 why			  ? why
		 : st == KVX_CPL_ABORTED   ? "the producer aborted the served transfer"
		 : st == KVX_CPL_TIMED_OUT ? "the producer's defer timeout passed before the consumer's release"
					   : "the producer's serve failed");
	send_msg(po, host, port, &m);
}

/* P SERVE: a READ consumer's status query naming its notify listener (@p m: host in m->ptr,
 * port m->n, m->status 1 if it found the lease revoked). A serve that ended without success
 * is answered at once; a running one (or one not submitted yet: parked on its entry) when it
 * ends (apply()); a DONE one never (its consumer released it). Takes m->ptr. */
static void serve_query(struct poller *po, struct emsg *m)
{
	char *host = m->ptr;
	struct kvx_xfer *t = kvx_xfer_find(po->tab, m->tid);
	struct xf *x = t ? t->user : NULL;
	bool ended = t && t->has_out && (!x || x->lf.reported);
	if (ended && t->out_status != KVX_CPL_DONE) {
		send_serve_note(po, host, (uint16_t)m->n, m->tid, (enum kvx_cpl_status)t->out_status, t->out_error, NULL);
	} else if (!ended && !t && m->status) {
		/* Revoked, and no record left of it here: the lease says it ended. */
		send_serve_note(po, host, (uint16_t)m->n, m->tid, KVX_CPL_FAILED, -ESTALE,
				"the producer no longer serves the transfer (lease revoked, no record left)");
	} else if (!ended && (t || (t = tab_get(po, m->tid)) != NULL) && t->state == KVX_XFER_S_LIVE &&
		   strlen(host) < sizeof(t->reply_host)) {
		snprintf(t->reply_host, sizeof(t->reply_host), "%s", host);
		t->reply_port = (uint16_t)m->n;
	} else {
		atomic_fetch_add_explicit(&po->e->st_late, 1, memory_order_relaxed);
	}
	free(host);
}

/* D READ, once, when its lease window shows the producer's grant (@p revoked false) or its
 * revocation (true): ask the producer (a kvxfer engine: READs only run against those) to send
 * kvx_failed here if its serve ends, or ended, without success. The transfer takes an entry
 * in the table so that the note finds it. */
static void read_ask(struct poller *po, struct xf *x, bool revoked)
{
	struct kvx_engine *e = po->e;
	if (x->lf.queried || !e->self_nt)
		return;
	x->lf.queried = true;
	if (!x->t) {
		struct kvx_xfer *t = tab_get(po, x->tid);
		if (t && !t->user) {
			t->user = x;
			x->t = t;
		}
	}
	uint32_t rtp = 0;
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, peer_tp(e, x->peer), &rtp, NULL, 0);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_STATUS_QUERY;
	strcpy(m.transfer_id, x->tid);
	snprintf(m.notify_host, sizeof(m.notify_host), "%s", e->host);
	m.notify_port = e->self_nt;
	m.lease_revoked = revoked;
	send_msg(po, peer_host_of(x->peer, x->peer->dp_rank), peer_notify_port(e, x->peer, rtp), &m);
}

static void send_write_done(struct poller *po, struct xf *x)
{
	send_outcome(po, x->peer, xf_entry(x), x->tid, KVX_CPL_DONE, 0, NULL);
}

/* Perform what a lifecycle decision of xfer.c asks for (enum kvx_xfer_do, in its order). The
 * transfer may retire here (KVX_XFER_DO_RELEASE): the caller must not touch it afterwards. */
static void apply(struct poller *po, struct xf *x, const struct kvx_xfer_out *o)
{
	uint32_t a = o->act;
	if (a & KVX_XFER_DO_SEND_RELEASE)
		send_to_paired_rank(po, x->peer, KVX_MSG_RELEASE, x->tid);
	if (a & KVX_XFER_DO_SEND_RELEASE_ALL)
		send_to_all_ranks(po, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
	if (a & KVX_XFER_DO_SEND_BLOCKS) {
		kvx_ctl_mark_live(po->ib, x->tid, peer_host_of(x->peer, x->peer->dp_rank), x->peer->notify_port);
		if (!x->consumer_tp) /* else the scheduler sent it (kvx_notifier_announce()) */
			send_to_all_ranks(po, x->peer, KVX_MSG_REMOTE_BLOCKS, x->tid, x->lblocks, (uint32_t)x->n);
	}
	if (a & KVX_XFER_DO_SEND_WRITE_DONE) {
		if (a & KVX_XFER_DO_REPORT && o->status == KVX_CPL_DONE)
			send_write_done(po, x);
		else
			send_to_paired_rank(po, x->peer, KVX_MSG_WRITE_DONE, x->tid);
	}
	if (a & KVX_XFER_DO_SEND_FAILED) {
		/* The status the transfer ends with: this step's, else the one reported before. */
		struct kvx_xfer *t = xf_entry(x);
		enum kvx_cpl_status st = a & KVX_XFER_DO_REPORT ? o->status
					 : t && t->has_out	 ? (enum kvx_cpl_status)t->out_status
								 : o->status;
		int err = a & KVX_XFER_DO_REPORT ? o->error : t && t->has_out ? t->out_error : o->error;
		send_outcome(po, x->peer, t, x->tid, st == KVX_CPL_DONE ? KVX_CPL_FAILED : st, err, NULL);
	}
	if (a & KVX_XFER_DO_SEND_QUERY) {
		for (uint32_t r = 0; r < peer_tp(po->e, x->peer); r++) {
			struct kvx_msg_notify m;
			memset(&m, 0, sizeof(m));
			m.type = KVX_MSG_STATUS_QUERY;
			strcpy(m.transfer_id, x->tid);
			send_msg(po, peer_host_of(x->peer, x->peer->dp_rank), peer_notify_port(po->e, x->peer, r), &m);
		}
	}
	if (a & KVX_XFER_DO_STOP_WRITES)
		memset(x->want_post, 0, sizeof(x->want_post));
	if (a & KVX_XFER_DO_FENCE) {
		x->fence_ticket = eng_fence_request(po->e);
		po->n_fence_pending++;
	}
	if (a & KVX_XFER_DO_REPORT && x->lf.kind == KVX_XFER_K_SERVE && o->status != KVX_CPL_DONE && !x->lf.reported) {
		/* A READ consumer asked to be told (serve_query()): its reads can end now. */
		struct kvx_xfer *t = xf_entry(x);
		if (t && t->reply_port)
			send_serve_note(po, t->reply_host, t->reply_port, x->tid, o->status, o->error, NULL);
	}
	if (a & KVX_XFER_DO_REPORT) {
		report(po, x, o->status, o->error, a & KVX_XFER_DO_RELEASE);
		if (a & KVX_XFER_DO_RELEASE)
			return;
	} else if (a & KVX_XFER_DO_RELEASE) {
		report(po, x, KVX_CPL_ABORTED, 0, true); /* reported already: releases only */
		return;
	}
	if (a & KVX_XFER_DO_PROGRESS)
		progress(po, x);
}

/* Feed one event into the transfer's lifecycle (kvx_xfer_step()) and perform its actions.
 * Returns true if the transfer retired: the caller must not touch it afterwards. */
static bool step(struct poller *po, struct xf *x, struct kvx_xfer_ev ev)
{
	struct kvx_engine *e = po->e;
	struct kvx_xfer_out o;
	ev.transfer_timeout_ns = ms_ns(e->p.transfer_timeout_ms);
	ev.defer_timeout_ns = ms_ns(e->p.defer_timeout_ms);
	if (ev.type == KVX_XFER_EV_ABORT || ev.type == KVX_XFER_EV_SUBMIT || ev.type == KVX_XFER_EV_SEAL ||
	    ev.type == KVX_XFER_EV_LAYER_WRITTEN)
		ev.now_ns = kvx_now_ns(); /* the quarantine deadline, a WRITE's own deadline; a tick
					   * brings its own */
	kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
	apply(po, x, &o);
	if (o.act & KVX_XFER_DO_RELEASE)
		return true;
	spread_fence(x);
	return false;
}

/* The peer's current connection (RCU lookup; valid until this poller's next quiescent state
 * unless a reference is taken). */
static struct conn *conn_lookup(struct poller *po, const struct peer *pr)
{
	return kvx_rcu_table_lookup_u64(po->e->conns, pr->id);
}

static void conn_stale(struct poller *po, struct conn *c);

/* Ask the control lcore for a handshake with @p pr (a connection went stale, or a retry is
 * owed); unless one runs (PENDING), in which case its result answers. A request that could not
 * be queued (inbox full), or that the control lcore refused as a duplicate of an epoch check
 * (M_PEER_CHECKED with -EBUSY), leaves the peer's bit in hs_retry: xf_conn() and rehs_scan()
 * ask again. Nothing else asks, so a cold peer gets the app thread's one handshake. */
static void hs_ask(struct poller *po, struct peer *pr)
{
	uint32_t i = (uint32_t)(pr - po->e->peers); /* slot index */
	uint64_t bit = 1ull << (i % 64);
	po->hs_retry[i / 64] |= bit;
	if (atomic_load_explicit(&pr->hs_state, memory_order_acquire) == HS_PENDING)
		return;
	if (eng_hs_request(po->e, po->ib, pr) == 0)
		po->hs_retry[i / 64] &= ~bit;
}

static bool hs_retry_owed(const struct poller *po, const struct peer *pr)
{
	uint32_t i = (uint32_t)(pr - po->e->peers);
	return po->hs_retry[i / 64] & (1ull << (i % 64));
}

static void conn_bind(struct xf *x, struct conn *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* the table's ref is held */
	x->conn = c;
}

/* Bind x to connection n in place of the one it holds (a reference each). */
static void conn_rebind(struct xf *x, struct conn *n)
{
	eng_conn_put(x->conn);
	conn_bind(x, n);
}

/* 1 if x has a usable connection to post on, 0 to wait (no connection yet, re-handshake in
 * progress, own ops still draining), -1 if the lifecycle ended it here (the caller must not
 * touch it again). The decisions are kvx_xfer_step()'s (PEER_CONNECTED, PEER_FAILED); this
 * function gathers the facts and performs BIND / REPOST. */
static int xf_conn(struct poller *po, struct xf *x)
{
	struct conn *c = x->conn;
	if (c && !atomic_load_explicit(&c->stale, memory_order_acquire))
		return 1;
	struct conn *n = conn_lookup(po, x->peer);
	int hs = atomic_load_explicit(&x->peer->hs_state, memory_order_acquire);
	if (!n && !c && hs == HS_FAILED) {
		/* No connection and the peer's last handshake failed (the failure can reach this
		 * poller before the submission: M_PEER_FAILED then found no transfer to fail); the
		 * step tells whether it ended after this transfer's submission. */
		int err = atomic_load_explicit(&x->peer->hs_error, memory_order_relaxed);
		struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_FAILED, .unbound = true,
					 .error = err < 0 ? err : -ECONNREFUSED,
					 .hs_ends = atomic_load_explicit(&x->peer->hs_ends, memory_order_acquire)};
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
		if (o.act & KVX_XFER_DO_REPORT) {
			apply(po, x, &o);
			return -1;
		}
	}
	bool n_stale = n && atomic_load_explicit(&n->stale, memory_order_acquire);
	if ((!n || n_stale) && hs_retry_owed(po, x->peer))
		hs_ask(po, x->peer); /* a request was refused (-EBUSY) or could not be queued */
	if (!n || n == c || n_stale)
		return 0;
	struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = n->epoch, .bound = c != NULL,
				 .moved = x->bytes != 0};
	struct kvx_xfer_out o;
	kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
	if (o.act & KVX_XFER_DO_BIND) {
		conn_rebind(x, n);
		if (o.act & KVX_XFER_DO_REPOST) {
			memset(x->layer_batches, 0, po->e->n_layers * sizeof(*x->layer_batches));
			x->lease_phase = LP_NONE; /* a new connection: the lease is looked up again */
			x->bytes = 0;             /* the completion counts the bytes of one pass */
		}
		return 1;
	}
	if (!o.act)
		return 0;
	apply(po, x, &o); /* FAILED: it ends here */
	return -1;
}


/* How recent a successful completion on the link must be to vouch for the peer's epoch. */
#define KVX_EPOCH_FRESH_NS 20000000ull

/* P WRITE: which incarnation of the consumer made the allocation (remote_blocks)? tcp/shm do
 * not watch idle connections, so a consumer that died and restarted on the same ports is not
 * noticed until an op fails. kvx_xfer_step(PEER_EPOCH) decides from the facts gathered here:
 * the epoch the allocation named (`kvx_epoch` of a kvxfer consumer), or for a MoRIIO consumer
 * the connection's epoch when its link carried a successful op within KVX_EPOCH_FRESH_NS,
 * else the result of a metadata-only handshake (an epoch check on the control lcore). An
 * allocation epoch other than the connection's means the consumer restarted: the connection is
 * marked stale and re-handshaken, and PEER_CONNECTED later refuses to write into a connection
 * of another epoch than the allocation's. Returns true once the allocation epoch is settled. */
static bool alloc_epoch_settle(struct poller *po, struct xf *x)
{
	struct peer *pr = x->peer;
	if (x->lf.alloc_known)
		return true;
	struct conn *c = conn_lookup(po, pr);
	struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_EPOCH};
	if (c) {
		ev.has_conn = true;
		ev.conn_stale = atomic_load_explicit(&c->stale, memory_order_acquire);
		ev.conn_epoch = c->epoch;
		ev.link_fresh = kvx_now_ns() - c->link[po->k].last_ok_ns < KVX_EPOCH_FRESH_NS;
	}
	ev.check_started = atomic_load_explicit(&pr->check_started, memory_order_acquire);
	ev.check_done = atomic_load_explicit(&pr->check_done, memory_order_acquire);
	ev.checked_epoch = atomic_load_explicit(&pr->checked_epoch, memory_order_relaxed);
	struct kvx_xfer_out o;
	kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
	if (o.act & KVX_XFER_DO_RESET_PEER)
		conn_stale(po, c);
	if (o.act & KVX_XFER_DO_EPOCH_CHECK)
		eng_epoch_check_start(po, pr);
	return x->lf.alloc_known;
}


static void list_link(struct poller *po, struct conn *c)
{
	struct clink *l = &c->link[po->k];
	if (l->listed)
		return;
	l->listed = true;
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* held by a bound xf */
	l->next = po->plist;
	po->plist = c;
}

/* ---------------------------------------------------------------------------------------- */
/* Layer spread (issue 16, docs/performance.md §7)                                           */
/* ---------------------------------------------------------------------------------------- */

/* Cookie of an op a helper posts for another poller's transfer: the flag and its dlg index. */
#define DLG_COOKIE (1ull << 63)

/* Whether the engine spreads its transfers' layers: params.spread, >= 2 pollers, >= 2 layers. */
static bool spread_on(const struct kvx_engine *e)
{
	return e->p.spread == KVX_ENGINE_SPREAD_LAYERS && e->n_po >= 2 && e->n_layers >= 2;
}

/* The poller that posts @p layer of this poller's transfers: L mod n_po, else this one. */
static uint32_t spread_to(const struct poller *po, uint32_t layer)
{
	return spread_on(po->e) ? layer % po->e->n_po : po->k;
}

/* Owner: hand layer @p layer of x to helper @p h (its `dreq` ring). 0 handed off (counted in
 * lf.ops_out and layer_batches until its dres is back), -EAGAIN when h already holds
 * SPREAD_CAP of this poller's layers: the caller posts it itself. */
static int spread_hand(struct poller *po, struct xf *x, uint32_t h, uint32_t layer, enum kvx_xport_opcode op,
		       const uint32_t *lids, const uint32_t *rids, size_t n)
{
	struct kvx_engine *e = po->e;
	struct conn *c = x->conn;
	if (po->dlg_out[h] >= SPREAD_CAP)
		return -EAGAIN;
	struct dmsg m = {.x = x, .c = c, .peer = x->peer, .lids = lids, .rids = rids, .n = n, .owner = po->k,
			 .layer = layer, .op = op, .slot = x->slot, .gen = x->gen};
	if (x->lease_phase == LP_HELD && e->caps[c->xi].cond_ops) {
		m.cnd = 1;
		m.expect = x->lease_word;
		m.roff = (uint64_t)(eng_lease_base(x->lease_key, c->lease_n) + x->lease_pos) * 8;
	}
	/* No helper holds a layer of x: none reads the flag now; the enqueue publishes it. */
	if (!x->dlg_n)
		atomic_store_explicit(&x->dlg_stop, false, memory_order_relaxed);
	if (!kvx_ring_enqueue_elem_burst_mp(e->po[h]->dreq, &m, 1, NULL))
		return -EAGAIN;
	po->dlg_out[h]++;
	x->dlg_n++;
	x->lf.ops_out++;
	x->layer_batches[layer]++;
	return 0;
}

/* Owner: once nothing more of x is to be posted (reported, failed, awaiting the peer's next
 * connection, a P WRITE whose entry is no longer live), layers still queued at a helper are
 * returned unposted. */
static void spread_fence(struct xf *x)
{
	if (!x->dlg_n || atomic_load_explicit(&x->dlg_stop, memory_order_relaxed))
		return;
	const struct kvx_xfer *t = x->t && x->t->user == x ? x->t : NULL;
	if (x->lf.reported || x->lf.failed || x->lf.await_peer ||
	    (x->lf.kind == KVX_XFER_K_WRITE && (!t || t->state != KVX_XFER_S_LIVE)))
		atomic_store_explicit(&x->dlg_stop, true, memory_order_release);
}

/* Helper: hand-off i is over (every op terminal, or nothing posted): its outcome to the owner.
 * The owner's dres ring has room: it holds at most n_po x SPREAD_CAP outcomes. */
static void dlg_finish(struct poller *po, uint32_t i)
{
	struct dlg *d = &po->dlg[i];
	struct dres r = {.bytes = d->bytes, .slot = d->m.slot, .gen = d->m.gen, .layer = d->m.layer, .helper = po->k,
			 .status = d->status, .post_err = d->post_err, .ep_dead = d->ep_dead, .canceled = d->canceled};
	(void)kvx_ring_enqueue_elem_burst_mp(po->e->po[d->m.owner]->dres, &r, 1, NULL);
	d->next_free = po->dlg_free;
	po->dlg_free = i + 1;
}

/* Helper: post hand-off i on this poller's link, as post_layer() does for its own transfers.
 * false: its first batch could not be posted (queue full): retried at the next poll. */
static bool dlg_post(struct poller *po, uint32_t i)
{
	struct kvx_engine *e = po->e;
	struct dlg *d = &po->dlg[i];
	const struct dmsg *m = &d->m;
	if (atomic_load_explicit(&m->x->dlg_stop, memory_order_acquire)) {
		d->canceled = true; /* the owner posts nothing more of x */
		dlg_finish(po, i);
		return true;
	}
	struct conn *c = m->c;
	struct clink *l = &c->link[po->k];
	struct kvx_plan plan;
	kvx_plan_cache_reset(po->pc); /* other block ids than the plans cached */
	if (kvx_plan_cache_get(po->pc, &c->geom[m->layer], m->lids, m->rids, m->n, &plan) < 0)
		return false;
	uint32_t maxb = e->caps[c->xi].max_batch ? e->caps[c->xi].max_batch : 1;
	for (size_t k = 0; k < plan.n; k++)
		po->ops[k] = (struct kvx_xport_op){.lmr = e->layers[m->layer].mr[c->xi], .rmr = l->rmr[m->layer],
						   .loff = plan.loc[k], .roff = plan.rem[k], .len = plan.size[k]};
	struct kvx_xport_cond cond = {.rmr = l->lease_rmr, .expect = m->expect, .roff = m->roff};
	for (size_t first = 0; first < plan.n; first += maxb) {
		uint32_t cnt = (uint32_t)(plan.n - first < maxb ? plan.n - first : maxb);
		int rc = m->cnd ? kvx_xport_post_bulk_cond(l->ep, m->op, po->ops + first, cnt, DLG_COOKIE | i, &cond)
				: kvx_xport_post_bulk(l->ep, m->op, po->ops + first, cnt, DLG_COOKIE | i);
		if (rc) {
			if (first == 0)
				return false;
			d->post_err = rc; /* a partial layer cannot be retried: it fails */
			break;
		}
		d->batches++;
		l->outstanding++;
		list_link(po, c);
		atomic_fetch_add_explicit(&po->st_ops, cnt, memory_order_relaxed);
		atomic_fetch_add_explicit(&m->peer->ops, cnt, memory_order_relaxed);
	}
	d->posted = true;
	if (!d->batches)
		dlg_finish(po, i); /* empty plan, or nothing more could be posted */
	return true;
}

/* Helper: a completion of an op it posted for another poller (handle_cpl()). */
static void dlg_cpl(struct poller *po, struct conn *cn, const struct kvx_xport_cpl *c)
{
	uint32_t i = (uint32_t)(c->cookie & 0xffffffffu);
	if (i >= po->n_dlg)
		return;
	struct dlg *d = &po->dlg[i];
	d->batches--;
	d->bytes += c->bytes;
	atomic_fetch_add_explicit(&po->st_bytes, c->bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&d->m.peer->bytes, c->bytes, memory_order_relaxed);
	if (c->status == 0) {
		cn->link[po->k].last_ok_ns = kvx_now_ns();
	} else if (!d->status) {
		d->status = c->status;
		d->ep_dead = kvx_xport_ep_status(cn->link[po->k].ep) != 0;
	}
	if (!d->batches && d->posted)
		dlg_finish(po, i);
}

/* Helper: take new hand-offs and retry those whose first batch found the queue full. Returns
 * whether there was work (hand-offs left to retry keep the poller spinning). */
static bool dlg_serve(struct poller *po)
{
	bool busy = po->n_dpend != 0;
	for (uint32_t j = 0; j < po->n_dpend;) {
		if (dlg_post(po, po->dpend[j]))
			po->dpend[j] = po->dpend[--po->n_dpend];
		else
			j++;
	}
	struct dmsg m[16];
	unsigned n = po->dlg_free ? kvx_ring_dequeue_elem_burst_sc(po->dreq, m, 16, NULL) : 0;
	for (unsigned k = 0; k < n; k++) {
		uint32_t i = po->dlg_free - 1; /* never exhausted: every owner holds at most SPREAD_CAP */
		struct dlg *d = &po->dlg[i];
		po->dlg_free = d->next_free;
		*d = (struct dlg){.m = m[k]};
		if (!dlg_post(po, i))
			po->dpend[po->n_dpend++] = i;
	}
	return busy || n;
}

static void layer_cpl(struct poller *po, struct xf *x, uint32_t layer);

/* Owner: outcomes of its hand-offs. Each applies as the completions of the layer's ops would
 * here (handle_cpl()): bytes, an op failure through the lifecycle (OP_FAILED), a partial post
 * as a post failure, then the layer's end. */
static bool dlg_results(struct poller *po)
{
	struct dres r[16];
	unsigned n = kvx_ring_dequeue_elem_burst_sc(po->dres, r, 16, NULL);
	for (unsigned k = 0; k < n; k++) {
		po->dlg_out[r[k].helper]--;
		struct xf *x = handle_xf(po, r[k].slot, r[k].gen); /* live: its ops_out counts the hand-off */
		if (!x)
			continue;
		x->dlg_n--;
		x->lf.ops_out--;
		x->layer_batches[r[k].layer]--;
		x->bytes += r[k].bytes;
		if (r[k].post_err && !x->lf.failed) {
			x->lf.failed = true;
			x->lf.error = r[k].post_err;
		}
		if (r[k].status) {
			struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_OP_FAILED, .error = r[k].status, .moved = x->bytes != 0,
						 .ep_dead = r[k].ep_dead != 0};
			struct kvx_xfer_out o;
			kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
			if (o.act & KVX_XFER_DO_RESET_PEER && x->conn)
				conn_stale(po, x->conn);
		}
		if (r[k].canceled) {
			if (x->lf.failed && x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported)
				step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = x->lf.error});
			else
				progress(po, x);
			continue;
		}
		layer_cpl(po, x, r[k].layer);
	}
	return n != 0;
}

/* Post one layer of a transfer on its connection's link of this poller: plan (cached per
 * geometry), one batch per caps.max_batch ops. */
static int post_layer(struct poller *po, struct xf *x, uint32_t layer, enum kvx_xport_opcode op,
		      const uint32_t *lids, const uint32_t *rids, size_t n)
{
	struct kvx_engine *e = po->e;
	struct conn *c = x->conn;
	struct clink *l = &c->link[po->k];
	uint32_t h = spread_to(po, layer);
	if (h != po->k && spread_hand(po, x, h, layer, op, lids, rids, n) == 0)
		return 0;
	struct kvx_plan plan;
	int rc = kvx_plan_cache_get(po->pc, &c->geom[layer], lids, rids, n, &plan);
	if (rc < 0)
		return rc;
	uint32_t maxb = e->caps[c->xi].max_batch ? e->caps[c->xi].max_batch : 1;
	uint32_t nb = (uint32_t)((plan.n + maxb - 1) / maxb);
	if (nb == 0)
		return 0;
	for (size_t i = 0; i < plan.n; i++) {
		po->ops[i] = (struct kvx_xport_op){.lmr = e->layers[layer].mr[c->xi], .rmr = l->rmr[layer],
						   .loff = plan.loc[i], .roff = plan.rem[i], .len = plan.size[i]};
	}
	uint64_t cookie = ((uint64_t)x->slot << 16) | layer;
	/* A leased transfer on a provider whose target checks a condition (tcp): every op is
	 * applied only while the lease word found before the first op still holds, so an op that
	 * reaches the target after the owner revoked fails -ESTALE and touches nothing
	 * (docs/protocol.md §5.11). */
	struct kvx_xport_cond cond = {0};
	bool cnd = x->lease_phase == LP_HELD && e->caps[c->xi].cond_ops;
	if (cnd)
		cond = (struct kvx_xport_cond){.rmr = l->lease_rmr, .expect = x->lease_word,
					       .roff = (uint64_t)(eng_lease_base(x->lease_key, c->lease_n) + x->lease_pos) * 8};
	for (uint32_t b = 0; b < nb; b++) {
		size_t first = (size_t)b * maxb;
		uint32_t cnt = (uint32_t)(plan.n - first < maxb ? plan.n - first : maxb);
		rc = cnd ? kvx_xport_post_bulk_cond(l->ep, op, po->ops + first, cnt, cookie, &cond)
			 : kvx_xport_post_bulk(l->ep, op, po->ops + first, cnt, cookie);
		if (rc) {
			if (b == 0)
				return rc; /* -ENOBUFS: retry the layer later */
			/* A partial layer cannot be retried without double-posting: fail it. */
			x->lf.failed = true;
			x->lf.error = rc;
			break;
		}
		x->lf.ops_out++;
		x->layer_batches[layer]++;
		l->outstanding++;
		list_link(po, c);
		atomic_fetch_add_explicit(&po->st_ops, cnt, memory_order_relaxed);
		atomic_fetch_add_explicit(&x->peer->ops, cnt, memory_order_relaxed);
	}
	return 0;
}

/* D READ lease check (runtime/lease.c): read the producer's lease window of this transfer
 * (before: LP_BEFORE) or the one word found there (after: LP_AFTER) into the transfer's slot
 * of lease_buf, as one batch on the bound connection. 0 posted, else the post's error. */
static int lease_post(struct poller *po, struct xf *x, bool after)
{
	struct kvx_engine *e = po->e;
	struct conn *c = x->conn;
	struct clink *l = &c->link[po->k];
	if (!after)
		x->lease_key = eng_lease_key(x->tid, c->epoch);
	uint64_t base = eng_lease_base(x->lease_key, c->lease_n);
	struct kvx_xport_op op = {.lmr = e->lease_buf_mr[c->xi], .rmr = l->lease_rmr,
				  .loff = (uint64_t)x->slot * LEASE_WIN * 8,
				  .roff = (base + (after ? x->lease_pos : 0)) * 8, .len = after ? 8 : LEASE_WIN * 8};
	e->lease_buf[(size_t)x->slot * LEASE_WIN] = 0;
	int rc = kvx_xport_post_bulk(l->ep, KVX_XPORT_OP_READ, &op, 1, ((uint64_t)x->slot << 16) | LEASE_COOKIE);
	if (rc)
		return rc;
	x->lease_phase = after ? LP_AFTER : LP_BEFORE;
	x->lf.ops_out++;
	l->outstanding++;
	list_link(po, c);
	return 0;
}

/* Whether the transfer's lease was found (data ops may go). */
static bool lease_held(const struct xf *x)
{
	return x->lease_phase == LP_HELD || x->lease_phase == LP_AFTER || x->lease_phase == LP_VERIFIED;
}

/* Completion of a lease read: the lease is found / still held, or the transfer fails with
 * -ESTALE (never granted in this producer incarnation, or revoked: released, aborted, timed out). */
static void lease_cpl(struct poller *po, struct xf *x)
{
	const uint64_t *w = po->e->lease_buf + (size_t)x->slot * LEASE_WIN;
	bool ok;
	if (x->lease_phase == LP_BEFORE) {
		int rc = eng_lease_find(w, x->lease_key, &x->lease_pos);
		if (rc == -EAGAIN && x->lf.kind == KVX_XFER_K_READ) {
			/* Not served yet: vLLM's producer hands the block ids on at request_finished and
			 * serves them a scheduler step later. Wait for the grant (until the transfer's
			 * deadline; a restarted producer never grants its predecessor's transfers). */
			x->lease_phase = LP_WAIT;
			return;
		}
		ok = rc == 0;
		if (ok)
			x->lease_word = w[x->lease_pos];
	} else {
		ok = w[0] == x->lease_word;
	}
	if (x->lf.kind == KVX_XFER_K_READ && (ok || !x->lf.queried))
		read_ask(po, x, !ok); /* the producer then says why, if its serve ends early */
	if (!ok) {
		x->lf.done_posting = true;
		if (x->lf.peer_status)
			return; /* the producer's kvx_failed came first: its status and error stand */
		x->lf.failed = true;
		x->lf.error = -ESTALE;
		/* Its producer's kvx_failed says why (until the deadline; else -ESTALE). */
		x->lf.await_note = x->lf.kind == KVX_XFER_K_READ && x->lf.queried;
		return;
	}
	x->lease_phase = x->lease_phase == LP_BEFORE ? LP_HELD : LP_VERIFIED;
}

static void read_progress(struct poller *po, struct xf *x)
{
	struct kvx_engine *e = po->e;
	if (x->lf.reported) {
		/* Terminal (timed out / aborted): release P and the blocks once the ops are terminal. */
		step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
		return;
	}
	/* A failed transfer finishes even while its (stale) peer is re-handshaking; one that
	 * awaits the peer's next connection is decided there (PEER_CONNECTED). */
	if (x->lf.await_peer || (!x->lf.failed && !x->lf.done_posting)) {
		int cr = xf_conn(po, x);
		if (cr <= 0)
			return;
	}
	if (!x->lf.failed && x->n && !lease_held(x)) {
		/* No data op before the lease was found (runtime/lease.c). */
		int lr = x->lease_phase == LP_NONE ? lease_post(po, x, false) : 0;
		if (lr) {
			x->lf.failed = true; /* the endpoint's queue is full (-ENOBUFS) */
			x->lf.error = lr;
			x->lf.done_posting = true;
		}
		if (!x->lf.failed)
			return;
	}
	if (!x->lf.failed)
		kvx_plan_cache_reset(po->pc);
	while (!x->lf.failed && x->lf.next_layer < e->n_layers) {
		if (post_layer(po, x, x->lf.next_layer, KVX_XPORT_OP_READ, x->lblocks, x->rblocks, x->n))
			break;
		x->lf.next_layer++;
	}
	if (x->lf.next_layer == e->n_layers || x->lf.failed)
		x->lf.done_posting = true;
	if (x->lf.done_posting && !x->lf.ops_out && !x->lf.failed && x->n && x->lease_phase == LP_HELD) {
		/* Every data op completed: DONE only if the lease word is still the one found
		 * before the first op (the seqlock's second read). */
		int lr = lease_post(po, x, true);
		if (lr == 0)
			return;
		x->lf.failed = true;
		x->lf.error = lr;
	}
	if (x->lf.done_posting && !x->lf.ops_out) /* else the step has nothing to decide */
		step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
}

/* 1 the layer may be written, 0 not yet, negative errno if its event failed (hipEventQuery
 * error). Never blocks (kvx_mem_event_query() is a load or one hipEventQuery). */
static int layer_gate_open(const struct xf *x, uint32_t layer)
{
	const struct lgate *g = &x->gate[layer];
	if (g->flag)
		return atomic_load_explicit(g->flag, memory_order_acquire) != 0;
	return kvx_mem_event_query(&g->ev);
}

/* The transfer may retire here: the caller must not touch it afterwards. */
static void write_fail(struct poller *po, struct xf *x, int err)
{
	step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = err});
	step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_SETTLE});
}

static void write_progress(struct poller *po, struct xf *x)
{
	struct kvx_xfer *t = xf_entry(x);
	if (x->lf.reported || !t || t->state != KVX_XFER_S_LIVE) {
		step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_SETTLE});
		return;
	}
	if (!t->has_alloc || !alloc_epoch_settle(po, x))
		return;
	if (xf_conn(po, x) <= 0)
		return;
	if (t->alloc_epoch && !lease_held(x)) {
		/* An allocation a kvxfer consumer announced (`kvx_epoch`): nothing is written before
		 * its lease was found on this connection; a restarted consumer holds no lease of its
		 * predecessor (runtime/lease.c). remote_blocks without `kvx_epoch` (a MoRIIO decode
		 * scheduler or worker) carry no lease: the epoch rules of alloc_epoch_settle() only. */
		int lr = x->lease_phase == LP_NONE ? lease_post(po, x, false) : 0;
		if (lr)
			write_fail(po, x, lr);
		return;
	}
	/* Pair by token position: D's announced blocks hold the tail of the prompt; an extra D
	 * block (first generated token) stays unpaired (docs/protocol.md §6 item 8). */
	size_t nl = x->n, nr = t->n_remote_blocks, n = nl < nr ? nl : nr;
	const uint32_t *lids = x->lblocks + (nl > nr ? nl - nr : 0), *rids = t->remote_blocks;
	if (spread_on(po->e)) {
		/* Helpers read the pairing after the entry may be gone (terminal entries free their
		 * allocation): D's block ids are copied into the transfer object once. */
		if (!x->rb_ready)
			memcpy(x->rblocks, t->remote_blocks, n * sizeof(*x->rblocks));
		x->rb_ready = true;
		rids = x->rblocks;
	}
	kvx_plan_cache_reset(po->pc);
	for (uint32_t w = 0; w < KVX_ENGINE_MAX_LAYERS / 64; w++) {
		uint64_t bits = x->want_post[w];
		while (bits) {
			uint32_t layer = w * 64 + (uint32_t)__builtin_ctzll(bits);
			bits &= bits - 1;
			int g = layer_gate_open(x, layer);
			if (g == 0) {
				po->gated = true;
				continue;
			}
			if (g < 0) {
				/* The producer's event failed: nothing of this layer is known to be
				 * computed, so nothing more is written; the transfer fails. */
				write_fail(po, x, g);
				return;
			}
			if (post_layer(po, x, layer, KVX_XPORT_OP_WRITE, lids, rids, n))
				return;
			x->want_post[w] &= ~(1ull << (layer % 64));
			if (x->layer_batches[layer] == 0 && !x->lf.failed) {
				/* Nothing to move for this layer (empty plan): it is done. */
				if (step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_WRITTEN}))
					return; /* write_done sent, retired */
			}
		}
	}
}

static void progress(struct poller *po, struct xf *x)
{
	switch (x->lf.kind) {
	case KVX_XFER_K_READ:
		read_progress(po, x);
		break;
	case KVX_XFER_K_WRITE:
		write_progress(po, x);
		break;
	case KVX_XFER_K_ANNOUNCE:
	case KVX_XFER_K_SERVE:
		break; /* driven by notifications and timeouts */
	}
}

/* The poller's entry for a transfer id: found, or opened (a notification that arrives before
 * its transfer is submitted is parked there). NULL if the table is full. */
static struct kvx_xfer *tab_get(struct poller *po, const char *tid)
{
	struct kvx_xfer *t = kvx_xfer_find(po->tab, tid);
	if (!t && kvx_xfer_open(po->tab, tid, &t))
		return NULL;
	return t;
}

/* Attach x to its entry (announce, write, serve: the kinds that receive notifications). */
static struct kvx_xfer *attach(struct poller *po, struct xf *x)
{
	struct kvx_xfer *t = tab_get(po, x->tid);
	if (t) {
		t->user = x;
		t->peer_ref = x->peer;
		t->peer_id = x->peer ? atomic_load_explicit(&x->peer->id, memory_order_relaxed) : 0;
		x->t = t;
	}
	return t;
}

static void handle_submit(struct poller *po, struct xf *x)
{
	x->live_idx = po->n_live;
	po->live[po->n_live++] = x;
	x->live = true;
	x->t = NULL;
	x->rb_ready = false;
	po->owned[x->slot] = x->gen;
	/* The kinds that receive notifications get their entry (found parked, or opened). */
	if (x->lf.kind != KVX_XFER_K_READ && (x->n || x->lf.kind != KVX_XFER_K_ANNOUNCE))
		attach(po, x);
	step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SUBMIT, .n_blocks = x->n});
}

/* The peer of a (possibly retired) transfer's entry, unless its slot was given to another peer
 * since (params.peer_idle_ms). */
static const struct peer *entry_peer(const struct kvx_xfer *t)
{
	const struct peer *pr = t ? t->peer_ref : NULL;
	return pr && atomic_load_explicit(&pr->id, memory_order_relaxed) == t->peer_id ? pr : NULL;
}

/* Inbound notification for a transfer id: the one place on a poller where an id is resolved
 * (its table: the live transfer attached to the entry, or a parked entry). */
static void handle_notify(struct poller *po, struct emsg *m)
{
	struct kvx_engine *e = po->e;
	struct kvx_xfer *t = kvx_xfer_find(po->tab, m->tid);
	struct xf *x = t ? t->user : NULL;
	struct kvx_xfer_ev ev = {.n_blocks = m->n, .block_ids = m->ptr, .decode_dp_rank = m->status,
				 .sender_key = m->key};
	if (x && m->key && x->peer)
		atomic_store_explicit(&x->peer->is_kvx, true, memory_order_relaxed); /* it named itself */
	switch (m->u32) {
	case KVX_MSG_REMOTE_BLOCKS:
		ev.type = KVX_XFER_EV_REMOTE_BLOCKS;
		ev.alloc_epoch = m->u64;
		break;
	case KVX_MSG_RELEASE:
		ev.type = KVX_XFER_EV_RELEASE;
		ev.consumer_tp = (uint32_t)m->u64;
		ev.producer_tp = e->p.tp_size;
		break;
	case KVX_MSG_WRITE_DONE:
	case KVX_MSG_FAILED:
		ev.type = m->u32 == KVX_MSG_FAILED ? KVX_XFER_EV_PEER_FAILED_NOTE : KVX_XFER_EV_WRITE_DONE;
		ev.consumer_tp = x && x->peer ? peer_tp(e, x->peer) : e->p.tp_size;
		ev.producer_tp = e->p.tp_size;
		ev.fail_status = m->fst;
		ev.error = m->err;
		ev.now_ns = kvx_now_ns();
		ev.defer_timeout_ns = ms_ns(e->p.defer_timeout_ms);
		break;
	case KVX_MSG_STATUS_QUERY:
		if (m->ptr) {
			serve_query(po, m); /* a READ consumer's: names where to answer */
			return;
		}
		ev.type = KVX_XFER_EV_STATUS_QUERY;
		break;
	default:
		return;
	}
	if (!t && !(x && x->lf.kind == KVX_XFER_K_WRITE) && ev.type != KVX_XFER_EV_STATUS_QUERY)
		t = tab_get(po, m->tid); /* before its submission: parked on the entry (faults b) */
	if (ev.type == KVX_XFER_EV_STATUS_QUERY) {
		/* Answered from the entry (kept in the terminal LRU with its outcome and peer); the
		 * live transfer, if any, only says whether its writes are still in flight. */
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, t, x && x->lf.kind == KVX_XFER_K_WRITE ? &x->lf : NULL, &ev, &o);
		if (o.act && entry_peer(t))
			send_outcome(po, entry_peer(t), t, m->tid, o.status, o.error, NULL);
		else
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		return;
	}
	if (x) {
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, t, &x->lf, &ev, &o);
		if (o.late)
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		apply(po, x, &o);
		return;
	}
	struct kvx_xfer_out o;
	kvx_xfer_step(po->tab, t, NULL, &ev, &o);
	if (o.late)
		atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
	if (o.act & KVX_XFER_DO_SEND_FAILED && t && entry_peer(t))
		send_outcome(po, entry_peer(t), t, m->tid, o.status, o.error,
			     "the allocation arrived after the producer's side had ended"); /* late allocation */
}

/* A connection's endpoint is in error state (transport.h: every op on it fails from now on):
 * no new transfer binds it, and the peer is re-handshaken at once (a new connection with new
 * endpoints; the old one drains and is freed when unreferenced) (docs/protocol.md §6 item 18). */
static void conn_stale(struct poller *po, struct conn *c)
{
	if (atomic_exchange_explicit(&c->stale, true, memory_order_acq_rel))
		return;
	atomic_fetch_add_explicit(&po->e->st_peer_resets, 1, memory_order_relaxed);
	hs_ask(po, c->pr); /* not queued (inbox full): retried by rehs_scan() */
}

static void handle_cpl(struct poller *po, struct conn *cn, const struct kvx_xport_cpl *c)
{
	struct kvx_engine *e = po->e;
	uint32_t slot = (uint32_t)(c->cookie >> 16), layer = (uint32_t)(c->cookie & 0xffff);
	cn->link[po->k].outstanding--;
	if (c->cookie & DLG_COOKIE) {
		dlg_cpl(po, cn, c); /* another poller's transfer: its layer's outcome goes back */
		return;
	}
	/* The cookie's slot names a transfer of this poller only while it is live here. */
	if (slot >= e->p.max_transfers || !po->owned[slot] || (layer >= e->n_layers && layer != LEASE_COOKIE))
		return;
	struct xf *x = &e->xpool[slot];
	if (layer == LEASE_COOKIE) {
		x->lf.ops_out--;
		if (c->status == 0) {
			cn->link[po->k].last_ok_ns = kvx_now_ns();
			if (!x->lf.failed && !x->lf.reported)
				lease_cpl(po, x);
		} else {
			/* As a data op's failure (below): a READ that read nothing yet (its lease lookup
			 * failed on a dead endpoint) awaits the peer's next connection; the lease is
			 * looked up again there (xf_conn(), REPOST). */
			struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_OP_FAILED, .error = c->status,
						 .moved = x->bytes != 0 || x->lease_phase != LP_BEFORE,
						 .ep_dead = kvx_xport_ep_status(cn->link[po->k].ep) != 0};
			struct kvx_xfer_out o;
			kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
			if (o.act & KVX_XFER_DO_RESET_PEER)
				conn_stale(po, cn);
			if (x->lf.await_peer)
				x->lease_phase = LP_NONE;
		}
		if (x->lf.failed && x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported)
			step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = x->lf.error});
		progress(po, x);
		return;
	}
	x->lf.ops_out--;
	x->layer_batches[layer]--;
	x->bytes += c->bytes;
	atomic_fetch_add_explicit(&po->st_bytes, c->bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&x->peer->bytes, c->bytes, memory_order_relaxed);
	if (c->status == 0)
		cn->link[po->k].last_ok_ns = kvx_now_ns();
	if (c->status) {
		struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_OP_FAILED, .error = c->status, .moved = x->bytes != 0,
					 .ep_dead = kvx_xport_ep_status(cn->link[po->k].ep) != 0};
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, xf_entry(x), &x->lf, &ev, &o);
		if (o.act & KVX_XFER_DO_RESET_PEER)
			conn_stale(po, cn);
	}
	layer_cpl(po, x, layer);
}

/* One op batch (or a hand-off) of @p layer of x ended, its outcome applied: a layer whose
 * batches are all done lands (READ: its barrier bit; WRITE: LAYER_WRITTEN), a failed WRITE
 * fails, and x progresses. x may retire here. */
static void layer_cpl(struct poller *po, struct xf *x, uint32_t layer)
{
	struct kvx_engine *e = po->e;
	if (x->layer_batches[layer] == 0 && !x->lf.failed && !x->lf.await_peer) {
		if (x->first_layer_ns <= x->lf.start_ns) /* first whole layer of this submission */
			x->first_layer_ns = kvx_now_ns();
		if (x->lf.kind == KVX_XFER_K_READ) {
			/* Per-layer barrier: release pairs with the acquire in kvx_xfer_layer_poll(). */
			atomic_fetch_or_explicit(&x->layer_done[layer / 64], 1ull << (layer % 64), memory_order_release);
			kvx_waiter_wake(&e->app_w); /* P1: after the release store, pairs with prepare */
		} else if (x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported) {
			if (step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_WRITTEN}))
				return; /* write_done sent, retired */
		}
	}
	if (x->lf.failed && x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported)
		step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = x->lf.error});
	progress(po, x);
}

static void handle_sub(struct poller *po, struct smsg *m)
{
	if (m->type == M_SUBMIT) {
		handle_submit(po, (struct xf *)m->ptr);
		return;
	}
	struct xf *x = handle_xf(po, m->slot, m->gen);
	if (!x || x->lf.reported)
		return;
	switch (m->type) {
	case M_LAYER_READY: {
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, xf_entry(x), &x->lf,
			      &(struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_READY, .layer = m->u32}, &o);
		if (!(o.act & KVX_XFER_DO_POST_LAYER))
			return; /* duplicate (transfer, layer): no-op */
		x->gate[m->u32].flag = m->ptr;
		x->gate[m->u32].ev = m->ev;
		x->want_post[m->u32 / 64] |= 1ull << (m->u32 % 64);
		write_progress(po, x);
		return;
	}
	case M_SEAL:
		step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = m->u32});
		return;
	case M_ABORT:
		step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT});
		return;
	default:
		return;
	}
}

static void handle_cin(struct poller *po, struct emsg *m)
{
	struct peer *pr = m->ptr;
	if (m->type == M_NOTIFY) {
		handle_notify(po, m);
		return;
	}
	uint32_t si = (uint32_t)(pr - po->e->peers);
	uint64_t bit = 1ull << (si % 64);
	if (m->type == M_PEER_CHECKED && m->status == -EBUSY)
		po->hs_retry[si / 64] |= bit; /* refused as a duplicate of an epoch check */
	else if (m->type != M_PEER_CHECKED)
		po->hs_retry[si / 64] &= ~bit; /* a handshake ended: no retry owed */
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (x->peer == pr && !x->lf.reported) {
			bool unbound = !x->conn || atomic_load_explicit(&x->conn->stale, memory_order_acquire);
			if (m->type == M_PEER_FAILED)
				step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_FAILED, .unbound = unbound,
								 .error = m->status, .hs_ends = m->u64});
			else
				progress(po, x);
		}
		if (po->n_live == before)
			i++;
	}
}

/* P READ defer timeout (docs/protocol.md §5.4 with §6 item 11): the producer cannot see one-sided
 * reads, so it revokes them: destroying the target endpoints makes every consumer's further
 * access impossible (verbs: the QPs are gone; tcp: the context's progress stops serving them at
 * its next call), and only then are the blocks reported reusable. A D WRITE whose quarantine
 * expired without the producer's answer is fenced the same way: a write still queued in the
 * producer's kernel (a partition) or process (stopped) then lands nowhere. shm cannot be
 * revoked by the target (see engine.h). A poller asks (eng_fence_request()); the control lcore destroys the
 * endpoints (eng_on_ctl_work(): fence_cut); poller 0, the thread of kvx_xport_progress(),
 * confirms once a progress call that began after the cut has returned (fence_done). */
static void fence_confirm(struct poller *po, uint64_t cut)
{
	struct kvx_engine *e = po->e;
	if (cut != atomic_load_explicit(&e->fence_done, memory_order_relaxed))
		atomic_store_explicit(&e->fence_done, cut, memory_order_release);
}

/* Serve transfers whose fence is done: their blocks are reusable now. */
static void fence_release(struct poller *po)
{
	uint64_t done = atomic_load_explicit(&po->e->fence_done, memory_order_acquire);
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (x->lf.fence_pending && x->fence_ticket <= done) {
			po->n_fence_pending--;
			step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_FENCED});
		}
		if (po->n_live == before)
			i++;
	}
}

/* D WRITE blocks held for a producer's shm copy in flight (report()): released once no busy
 * word of a peer shows the revoked lease any more. */
static void busy_release(struct poller *po)
{
	for (uint32_t i = 0; i < po->n_live && po->n_busy_hold;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (x->busy_hold && !eng_writers_busy(po->e, x->lease_revoked))
			report(po, x, KVX_CPL_ABORTED, 0, true); /* reported already: releases only */
		if (po->n_live == before)
			i++;
	}
}

static void scan_timeouts(struct poller *po, uint64_t now)
{
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		struct kvx_xfer *tw = x->lf.kind == KVX_XFER_K_WRITE ? xf_entry(x) : NULL;
		/* D WRITE asks a kvxfer producer a quarter of the transfer timeout (at most a
		 * second) before its deadline. */
		uint64_t grace = ms_ns(po->e->p.transfer_timeout_ms) / 4;
		step(po, x,
		     (struct kvx_xfer_ev){.type = KVX_XFER_EV_TICK,
					  .now_ns = now,
					  .has_alloc = tw && tw->has_alloc,
					  .query_peer = x->lf.kind == KVX_XFER_K_ANNOUNCE && x->peer &&
							atomic_load_explicit(&x->peer->is_kvx, memory_order_relaxed),
					  .query_grace_ns = grace < 1000000000ull ? grace : 1000000000ull,
					  .fence_writers = po->e->fence_writers});
		if (po->n_live == before && x->lease_phase == LP_WAIT && !x->lf.reported) {
			x->lease_phase = LP_NONE; /* look the lease up again */
			progress(po, x);
		}
		if (po->n_live == before)
			i++;
	}
	if (po->n_fence_pending)
		fence_release(po);
	if (po->n_busy_hold)
		busy_release(po);
}

/* A stale connection whose re-handshake could not be queued (inbox full): retry. */
static void rehs_scan(struct poller *po)
{
	for (struct conn *c = po->plist; c; c = c->link[po->k].next)
		if (atomic_load_explicit(&c->stale, memory_order_relaxed) && hs_retry_owed(po, c->pr) &&
		    conn_lookup(po, c->pr) == c)
			hs_ask(po, c->pr);
}

/* Deadline scan period while a poller has live transfers or ops outstanding: how late a
 * transfer timeout, a quarantine or an owed re-handshake is noticed. */
#define SCAN_NS 1000000ull

static void scan_tick(struct kvx_timer *t, void *arg)
{
	(void)t;
	struct poller *po = arg;
	scan_timeouts(po, kvx_now_ns());
	rehs_scan(po);
}

int eng_poller_wait_init(struct kvx_engine *e, struct poller *po)
{
	int rc = kvx_timer_heap_create(4, &po->timers);
	if (rc)
		return rc;
	kvx_timer_init(&po->scan, scan_tick, po);
	if ((rc = kvx_lcore_attach_timers(po->lc, po->timers)))
		return rc;
	po->wfd = epoll_create1(EPOLL_CLOEXEC);
	if (po->wfd < 0)
		return -errno;
	for (uint32_t i = 0; po->k == 0 && i < e->n_xctx; i++) {
		int fd = e->caps[i].needs_progress ? kvx_xport_ctx_wait_fd(e->xctx[i]) : -1;
		struct epoll_event ev = {.events = EPOLLIN};
		if (fd >= 0 && epoll_ctl(po->wfd, EPOLL_CTL_ADD, fd, &ev) == 0)
			po->ctx_wait = true;
	}
	return kvx_lcore_add_wait_fd(po->lc, po->wfd);
}

int eng_poll_fn(void *arg)
{
	struct poller *po = arg;
	struct kvx_engine *e = po->e;
	int busy = 0;
	struct smsg sm[16];
	unsigned n = kvx_ring_dequeue_elem_burst_sc(po->sub, sm, 16, NULL);
	for (unsigned i = 0; i < n; i++)
		handle_sub(po, &sm[i]);
	busy |= n != 0;
	struct emsg m[8];
	n = kvx_ring_dequeue_elem_burst_sc(po->cin, m, 8, NULL);
	for (unsigned i = 0; i < n; i++)
		handle_cin(po, &m[i]);
	busy |= n != 0;
	/* Layer spread: hand-offs to post here, outcomes of ours. */
	busy |= dlg_serve(po);
	busy |= dlg_results(po);
	/* Completions on this poller's link of every connection with ops outstanding. New
	 * connections are listed at the head, so they are not visited this round. */
	struct kvx_xport_cpl c[32];
	bool wait = false; /* ops outstanding that only a readiness fd in po->wfd advances */
	for (struct conn *cn = po->plist; cn;) {
		struct clink *l = &cn->link[po->k];
		struct conn *next = l->next;
		if (l->outstanding) {
			int k = kvx_xport_poll_burst(l->ep, c, 32);
			for (int i = 0; i < k; i++)
				handle_cpl(po, cn, &c[i]);
			if (k > 0 || (l->outstanding && kvx_xport_ep_arm(l->ep, po->wfd) != 1))
				busy = 1;
			else
				wait |= l->outstanding != 0;
		}
		cn = next;
	}
	for (struct conn **pp = &po->plist; *pp;) {
		struct conn *cn = *pp;
		struct clink *l = &cn->link[po->k];
		if (l->outstanding) {
			pp = &l->next;
			continue;
		}
		*pp = l->next;
		l->listed = false;
		(void)kvx_xport_ep_arm(l->ep, -1); /* idle: its edges must not wake this poller */
		eng_conn_put(cn);
	}
	/* Transfers waiting on the send queue, a connection or a layer's readiness event. */
	po->gated = false;
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		spread_fence(x);
		if (!x->lf.reported && ((x->lf.kind == KVX_XFER_K_READ && !x->lf.done_posting) || x->lf.kind == KVX_XFER_K_WRITE))
			progress(po, x);
		if (po->n_live == before)
			i++;
	}
	if (po->k == 0) {
		/* Loaded before the progress calls: the cut's endpoints are out of any call below. */
		uint64_t cut = atomic_load_explicit(&e->fence_cut, memory_order_acquire);
		for (uint32_t i = 0; i < e->n_xctx; i++)
			if (e->caps[i].needs_progress)
				busy |= kvx_xport_progress(e->xctx[i]) > 0;
		fence_confirm(po, cut);
	}
	/* Deadlines: the scan timer bounds the lcore's sleep (it has no other cap, kvx_engine_start)
	 * while there is something to time out; an idle poller arms nothing and sleeps until its
	 * rings (waiter), its readiness fds (po->wfd) or a stop wake it. */
	if ((po->n_live || po->plist) && !kvx_timer_is_armed(&po->scan))
		(void)kvx_timer_arm(po->timers, &po->scan, kvx_now_ns() + SCAN_NS); /* heap holds 4 */
	/* Sockets wake the sleep through po->wfd: with ops waiting on them, or live transfers the
	 * tcp target serves, sleep at once instead of spinning; not while a layer gate (a flag or
	 * a device event, polled at each scan) holds a write back. */
	if (busy)
		return KVX_POLL_BUSY;
	return (wait || (po->ctx_wait && po->n_live)) && !po->gated ? KVX_POLL_WAIT : KVX_POLL_IDLE;
}
