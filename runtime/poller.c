/* SPDX-License-Identifier: Apache-2.0 */
/* The polling lcores: the poll loop and its glue (submissions, control messages, lifecycle
 * actions, timeouts, reader fences). Connections and handshakes are in poller_conn.c, posting,
 * completions and the layer spread in poller_post.c, notifications in poller_notify.c; the
 * functions they share are declared in poller_internal.h. Every function here runs on the
 * polling lcore that owns the transfer (eng_tid_poller()), except eng_cpl_build() /
 * eng_push_cpl() / eng_remove_live(), which kvx_engine_stop() also calls once the pollers are
 * joined. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "poller_internal.h"

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
struct kvx_xfer *po_xf_entry(struct xf *x)
{
	return x->t && x->t->user == x ? x->t : NULL;
}

/* The live transfer a handle names on this poller, or NULL (retired, reused). */
struct xf *po_handle_xf(struct poller *po, uint32_t slot, uint32_t gen)
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

/* Perform what a lifecycle decision of xfer.c asks for (enum kvx_xfer_do, in its order). The
 * transfer may retire here (KVX_XFER_DO_RELEASE): the caller must not touch it afterwards. */
void po_apply(struct poller *po, struct xf *x, const struct kvx_xfer_out *o)
{
	uint32_t a = o->act;
	if (a & KVX_XFER_DO_SEND_RELEASE)
		po_send_to_paired_rank(po, x->peer, KVX_MSG_RELEASE, x->tid);
	if (a & KVX_XFER_DO_SEND_RELEASE_ALL)
		po_send_to_all_ranks(po, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
	if (a & KVX_XFER_DO_SEND_BLOCKS) {
		kvx_ctl_mark_live(po->ib, x->tid, po_peer_host_of(x->peer, x->peer->dp_rank), x->peer->notify_port);
		if (!x->consumer_tp) /* else the scheduler sent it (kvx_notifier_announce()) */
			po_send_to_all_ranks(po, x->peer, KVX_MSG_REMOTE_BLOCKS, x->tid, x->lblocks, (uint32_t)x->n);
	}
	if (a & KVX_XFER_DO_SEND_WRITE_DONE) {
		if (a & KVX_XFER_DO_REPORT && o->status == KVX_CPL_DONE)
			po_send_write_done(po, x);
		else
			po_send_to_paired_rank(po, x->peer, KVX_MSG_WRITE_DONE, x->tid);
	}
	if (a & KVX_XFER_DO_SEND_FAILED) {
		/* The status the transfer ends with: this step's, else the one reported before. */
		struct kvx_xfer *t = po_xf_entry(x);
		enum kvx_cpl_status st = a & KVX_XFER_DO_REPORT ? o->status
					 : t && t->has_out	 ? (enum kvx_cpl_status)t->out_status
								 : o->status;
		int err = a & KVX_XFER_DO_REPORT ? o->error : t && t->has_out ? t->out_error : o->error;
		po_send_outcome(po, x->peer, t, x->tid, st == KVX_CPL_DONE ? KVX_CPL_FAILED : st, err, NULL);
	}
	if (a & KVX_XFER_DO_SEND_QUERY) {
		for (uint32_t r = 0; r < po_peer_tp(po->e, x->peer); r++) {
			struct kvx_msg_notify m;
			memset(&m, 0, sizeof(m));
			m.type = KVX_MSG_STATUS_QUERY;
			strcpy(m.transfer_id, x->tid);
			po_send_msg(po, po_peer_host_of(x->peer, x->peer->dp_rank), po_peer_notify_port(po->e, x->peer, r), &m);
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
		struct kvx_xfer *t = po_xf_entry(x);
		if (t && t->reply_port)
			po_send_serve_note(po, t->reply_host, t->reply_port, x->tid, o->status, o->error, NULL);
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
		po_progress(po, x);
}

/* Feed one event into the transfer's lifecycle (kvx_xfer_step()) and perform its actions.
 * Returns true if the transfer retired: the caller must not touch it afterwards. */
bool po_step(struct poller *po, struct xf *x, struct kvx_xfer_ev ev)
{
	struct kvx_engine *e = po->e;
	struct kvx_xfer_out o;
	ev.transfer_timeout_ns = ms_ns(e->p.transfer_timeout_ms);
	ev.defer_timeout_ns = ms_ns(e->p.defer_timeout_ms);
	if (ev.type == KVX_XFER_EV_ABORT || ev.type == KVX_XFER_EV_SUBMIT || ev.type == KVX_XFER_EV_SEAL ||
	    ev.type == KVX_XFER_EV_LAYER_WRITTEN)
		ev.now_ns = kvx_now_ns(); /* the quarantine deadline, a WRITE's own deadline; a tick
					   * brings its own */
	kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
	po_apply(po, x, &o);
	if (o.act & KVX_XFER_DO_RELEASE)
		return true;
	po_spread_fence(x);
	return false;
}

/* The poller's entry for a transfer id: found, or opened (a notification that arrives before
 * its transfer is submitted is parked there). NULL if the table is full. */
struct kvx_xfer *po_tab_get(struct poller *po, const char *tid)
{
	struct kvx_xfer *t = kvx_xfer_find(po->tab, tid);
	if (!t && kvx_xfer_open(po->tab, tid, &t))
		return NULL;
	return t;
}

/* Attach x to its entry (announce, write, serve: the kinds that receive notifications). */
static struct kvx_xfer *attach(struct poller *po, struct xf *x)
{
	struct kvx_xfer *t = po_tab_get(po, x->tid);
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
	po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SUBMIT, .n_blocks = x->n});
}

static void handle_sub(struct poller *po, struct smsg *m)
{
	if (m->type == M_SUBMIT) {
		handle_submit(po, (struct xf *)m->ptr);
		return;
	}
	struct xf *x = po_handle_xf(po, m->slot, m->gen);
	if (!x || x->lf.reported)
		return;
	switch (m->type) {
	case M_LAYER_READY: {
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf,
			      &(struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_READY, .layer = m->u32}, &o);
		if (!(o.act & KVX_XFER_DO_POST_LAYER))
			return; /* duplicate (transfer, layer): no-op */
		x->gate[m->u32].flag = m->ptr;
		x->gate[m->u32].ev = m->ev;
		x->want_post[m->u32 / 64] |= 1ull << (m->u32 % 64);
		po_write_progress(po, x);
		return;
	}
	case M_SEAL:
		po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_SEAL, .n_layers = m->u32});
		return;
	case M_ABORT:
		po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_ABORT});
		return;
	default:
		return;
	}
}

static void handle_cin(struct poller *po, struct emsg *m)
{
	struct peer *pr = m->ptr;
	if (m->type == M_NOTIFY) {
		po_handle_notify(po, m);
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
				po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_PEER_FAILED, .unbound = unbound,
								 .error = m->status, .hs_ends = m->u64});
			else
				po_progress(po, x);
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
 * endpoints (eng_on_ctl_work(): fence_cut) and wakes pollers 0..n_prog-1, which run the tcp
 * target's progress groups; the cut is confirmed (kvx_fence_note()) once each of them has
 * returned from a progress call that began after it (runtime/fence.h). */
static void fence_confirm(struct poller *po, uint64_t cut)
{
	(void)kvx_fence_note(&po->e->fence, po->k, cut);
}

/* Serve transfers whose fence is done: their blocks are reusable now. */
static void fence_release(struct poller *po)
{
	uint64_t done = kvx_fence_done(&po->e->fence);
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (x->lf.fence_pending && x->fence_ticket <= done) {
			po->n_fence_pending--;
			po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_FENCED});
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
		struct kvx_xfer *tw = x->lf.kind == KVX_XFER_K_WRITE ? po_xf_entry(x) : NULL;
		/* D WRITE asks a kvxfer producer a quarter of the transfer timeout (at most a
		 * second) before its deadline. */
		uint64_t grace = ms_ns(po->e->p.transfer_timeout_ms) / 4;
		po_step(po, x,
		     (struct kvx_xfer_ev){.type = KVX_XFER_EV_TICK,
					  .now_ns = now,
					  .has_alloc = tw && tw->has_alloc,
					  .query_peer = x->lf.kind == KVX_XFER_K_ANNOUNCE && x->peer &&
							atomic_load_explicit(&x->peer->is_kvx, memory_order_relaxed),
					  .query_grace_ns = grace < 1000000000ull ? grace : 1000000000ull,
					  .fence_writers = po->e->fence_writers});
		if (po->n_live == before && x->lease_phase == LP_WAIT && !x->lf.reported) {
			x->lease_phase = LP_NONE; /* look the lease up again */
			po_progress(po, x);
		}
		if (po->n_live == before)
			i++;
	}
	if (po->n_fence_pending)
		fence_release(po);
	if (po->n_busy_hold)
		busy_release(po);
}

/* Deadline scan period while a poller has live transfers or ops outstanding: how late a
 * transfer timeout, a quarantine or an owed re-handshake is noticed. */
#define SCAN_NS 1000000ull

static void scan_tick(struct kvx_timer *t, void *arg)
{
	(void)t;
	struct poller *po = arg;
	scan_timeouts(po, kvx_now_ns());
	po_rehs_scan(po);
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
	for (uint32_t i = 0; i < e->n_xctx; i++) {
		int fd = e->caps[i].needs_progress && po->k < e->caps[i].progress_groups
				 ? kvx_xport_group_wait_fd(e->xctx[i], po->k)
				 : -1;
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
	busy |= po_dlg_serve(po);
	busy |= po_dlg_results(po);
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
				po_handle_cpl(po, cn, &c[i]);
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
		po_spread_fence(x);
		if (!x->lf.reported && ((x->lf.kind == KVX_XFER_K_READ && !x->lf.done_posting) || x->lf.kind == KVX_XFER_K_WRITE))
			po_progress(po, x);
		if (po->n_live == before)
			i++;
	}
	if (po->k < e->n_prog) {
		/* Loaded before the progress calls: the cut's endpoints are out of any call below. */
		uint64_t cut = atomic_load_explicit(&e->fence_cut, memory_order_acquire);
		for (uint32_t i = 0; i < e->n_xctx; i++)
			if (e->caps[i].needs_progress && po->k < e->caps[i].progress_groups)
				busy |= kvx_xport_progress_group(e->xctx[i], po->k) > 0;
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
