/* SPDX-License-Identifier: Apache-2.0 */
/* Posting and completions on the polling lcores: a layer's plan and batches (post_layer), the
 * READ / WRITE progress of a transfer, the lease reads of a D READ, completion handling, and
 * the layer spread (issue 16, docs/performance.md §7): an owner hands layers to the other
 * pollers, which post them on their own endpoints and return each layer's outcome. Split out of
 * poller.c. */
#include <errno.h>
#include <string.h>

#include "poller_internal.h"

static void layer_cpl(struct poller *po, struct xf *x, uint32_t layer);

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
void po_spread_fence(struct xf *x)
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
		po_list_link(po, c);
		atomic_fetch_add_explicit(&po->st_ops, cnt, memory_order_relaxed);
		atomic_fetch_add_explicit(&m->peer->ops, cnt, memory_order_relaxed);
	}
	d->posted = true;
	if (!d->batches)
		dlg_finish(po, i); /* empty plan, or nothing more could be posted */
	return true;
}

/* Helper: a completion of an op it posted for another poller (po_handle_cpl()). */
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
bool po_dlg_serve(struct poller *po)
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

/* Owner: outcomes of its hand-offs. Each applies as the completions of the layer's ops would
 * here (po_handle_cpl()): bytes, an op failure through the lifecycle (OP_FAILED), a partial post
 * as a post failure, then the layer's end. */
bool po_dlg_results(struct poller *po)
{
	struct dres r[16];
	unsigned n = kvx_ring_dequeue_elem_burst_sc(po->dres, r, 16, NULL);
	for (unsigned k = 0; k < n; k++) {
		po->dlg_out[r[k].helper]--;
		struct xf *x = po_handle_xf(po, r[k].slot, r[k].gen); /* live: its ops_out counts the hand-off */
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
			kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
			if (o.act & KVX_XFER_DO_RESET_PEER && x->conn)
				po_conn_stale(po, x->conn);
		}
		if (r[k].canceled) {
			if (x->lf.failed && x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported)
				po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = x->lf.error});
			else
				po_progress(po, x);
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
		po_list_link(po, c);
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
	po_list_link(po, c);
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
		po_read_ask(po, x, !ok); /* the producer then says why, if its serve ends early */
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
		po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
		return;
	}
	/* A failed transfer finishes even while its (stale) peer is re-handshaking; one that
	 * awaits the peer's next connection is decided there (PEER_CONNECTED). */
	if (x->lf.await_peer || (!x->lf.failed && !x->lf.done_posting)) {
		int cr = po_xf_conn(po, x);
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
		po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_READ_SETTLE});
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
	po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = err});
	po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_SETTLE});
}

void po_write_progress(struct poller *po, struct xf *x)
{
	struct kvx_xfer *t = po_xf_entry(x);
	if (x->lf.reported || !t || t->state != KVX_XFER_S_LIVE) {
		po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_SETTLE});
		return;
	}
	if (!t->has_alloc || !po_alloc_epoch_settle(po, x))
		return;
	if (po_xf_conn(po, x) <= 0)
		return;
	if (t->alloc_epoch && !lease_held(x)) {
		/* An allocation a kvxfer consumer announced (`kvx_epoch`): nothing is written before
		 * its lease was found on this connection; a restarted consumer holds no lease of its
		 * predecessor (runtime/lease.c). remote_blocks without `kvx_epoch` (a MoRIIO decode
		 * scheduler or worker) carry no lease: the epoch rules of po_alloc_epoch_settle() only. */
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
				if (po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_WRITTEN}))
					return; /* write_done sent, retired */
			}
		}
	}
}

void po_progress(struct poller *po, struct xf *x)
{
	switch (x->lf.kind) {
	case KVX_XFER_K_READ:
		read_progress(po, x);
		break;
	case KVX_XFER_K_WRITE:
		po_write_progress(po, x);
		break;
	case KVX_XFER_K_ANNOUNCE:
	case KVX_XFER_K_SERVE:
		break; /* driven by notifications and timeouts */
	}
}

void po_handle_cpl(struct poller *po, struct conn *cn, const struct kvx_xport_cpl *c)
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
			 * looked up again there (po_xf_conn(), REPOST). */
			struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_OP_FAILED, .error = c->status,
						 .moved = x->bytes != 0 || x->lease_phase != LP_BEFORE,
						 .ep_dead = kvx_xport_ep_status(cn->link[po->k].ep) != 0};
			struct kvx_xfer_out o;
			kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
			if (o.act & KVX_XFER_DO_RESET_PEER)
				po_conn_stale(po, cn);
			if (x->lf.await_peer)
				x->lease_phase = LP_NONE;
		}
		if (x->lf.failed && x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported)
			po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = x->lf.error});
		po_progress(po, x);
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
		kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
		if (o.act & KVX_XFER_DO_RESET_PEER)
			po_conn_stale(po, cn);
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
			if (po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_LAYER_WRITTEN}))
				return; /* write_done sent, retired */
		}
	}
	if (x->lf.failed && x->lf.kind == KVX_XFER_K_WRITE && !x->lf.reported)
		po_step(po, x, (struct kvx_xfer_ev){.type = KVX_XFER_EV_WRITE_FAILED, .error = x->lf.error});
	po_progress(po, x);
}
