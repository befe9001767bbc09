/* SPDX-License-Identifier: Apache-2.0 */
/* Application-thread calls of the engine API (engine.h): submissions, per-layer readiness,
 * sealing, aborts, per-layer completion polls and waits, and the completion queue. The
 * app-facing transfer registry (`reg`, id -> transfer object) lives here: ids are resolved to
 * a transfer object on this thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "metrics_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* App-thread API                                                                            */
/* ---------------------------------------------------------------------------------------- */


static int submit(struct kvx_engine *e, enum kvx_xfer_kind kind, const char *tid, const struct kvx_engine_peer *pp,
		  const uint32_t *lids, const uint32_t *rids, size_t n, uint32_t consumer_tp)
{
	if (!e || !tid)
		return -EINVAL;
	if (!e->started || e->stopped)
		return -EBUSY;
	size_t tl = strnlen(tid, KVX_ENGINE_ID_MAX);
	if (tl == 0 || tl >= KVX_ENGINE_ID_MAX || n > e->p.max_blocks || (n && !lids) ||
	    (kind == KVX_XFER_K_READ && n && !rids))
		return -EINVAL;
	uint64_t nb = e->layers[0].geom.num_blocks;
	for (size_t i = 0; i < n; i++)
		if (lids[i] >= nb)
			return -EINVAL;
	if (kvx_xfer_find(e->reg, tid)) {
		e->st_dup++;
		kvx_log(KVX_LOG_WARN, "engine: transfer id '%s' already used: rejected (the first is unaffected)", tid);
		return -EEXIST;
	}
	if (kvx_xfer_live_count(e->reg) >= e->p.max_transfers || !e->xfree) {
		e->st_nobufs++;
		uint64_t supp = 0;
		if (kvx_ratelimit_ok(&e->rl_nobufs, &supp))
			kvx_log(KVX_LOG_WARN, "engine: %u transfers in flight (params.max_transfers): '%s' refused with "
					      "-ENOBUFS (%llu more refusals not logged)",
				e->p.max_transfers, tid, (unsigned long long)supp);
		return -ENOBUFS;
	}
	int rc = 0;
	struct peer *pr = NULL;
	if (pp) {
		bool hs = n > 0 && (kind == KVX_XFER_K_READ || kind == KVX_XFER_K_WRITE);
		pr = eng_peer_get(e, pp, hs, &rc);
		if (!pr)
			return rc;
	}
	struct kvx_xfer *r;
	rc = kvx_xfer_open(e->reg, tid, &r);
	if (rc)
		return rc;
	uint32_t lease_idx = 0;
	if (kind == KVX_XFER_K_SERVE || (kind == KVX_XFER_K_ANNOUNCE && n)) {
		/* The lease its readers (READ) or writers (WRITE) check (runtime/lease.c): held from
		 * here until the transfer ends. */
		rc = eng_lease_stamp(e, eng_lease_key(tid, kvx_ctl_epoch(e->ctl)), &lease_idx);
		if (rc) {
			kvx_log(KVX_LOG_WARN, "engine: '%s': no free lease word in its window: -ENOBUFS", tid);
			kvx_xfer_discard(e->reg, r); /* refused: the id may be retried */
			return rc;
		}
		lease_idx++;
	}
	/* A preallocated transfer object; its storage is reset here, on the app thread, which
	 * got it back from the last completion (ring acquire) and hands it over by the ring. */
	uint32_t slot = e->xfree - 1;
	struct xf *x = &e->xpool[slot];
	uint32_t *lb = x->lblocks, *rb = x->rblocks, *lbat = x->layer_batches;
	struct lgate *gate = x->gate;
	uint32_t next_free = x->next_free, gen = x->gen + 1 ? x->gen + 1 : 1;
	memset(x, 0, sizeof(*x));
	x->gen = gen;
	memset(lbat, 0, e->n_layers * sizeof(*lbat));
	memset(gate, 0, e->n_layers * sizeof(*gate));
	x->lblocks = lb;
	x->rblocks = rb;
	x->layer_batches = lbat;
	x->gate = gate;
	x->slot = slot;
	memcpy(x->tid, tid, tl + 1);
	x->lf.kind = kind;
	x->peer = pr;
	/* A handshake asked for since the peer's last outcome (app_asked) is still to answer: only
	 * an outcome after this one can fail the transfer. Else (none asked: a stock MoRIIO
	 * peer's stored failure) the stored outcome counts. */
	uint64_t ends = pr ? atomic_load_explicit(&pr->hs_ends, memory_order_acquire) : 0;
	x->lf.hs_after = pr && pr->app_asked == ends ? ends : 0;
	x->n = n;
	x->consumer_tp = consumer_tp;
	x->lf.start_ns = kvx_now_ns();
	if (n)
		memcpy(x->lblocks, lids, n * sizeof(uint32_t));
	if (n && rids)
		memcpy(x->rblocks, rids, n * sizeof(uint32_t));
	x->po = e->po[eng_tid_poller(e, tid)];
	x->reg = r;
	x->lease_idx = lease_idx;
	struct smsg m = {.type = M_SUBMIT, .ptr = x};
	if (!kvx_ring_enqueue_elem_burst_sp(x->po->sub, &m, 1, NULL)) {
		if (lease_idx)
			eng_lease_clear(e, lease_idx - 1);
		x->next_free = next_free;
		/* Refused, nothing started: the id is not used up, a retry of it must be accepted
		 * (the binding retries -ENOBUFS). Marking it terminal here made the retry -EEXIST. */
		kvx_xfer_discard(e->reg, r);
		return -ENOBUFS;
	}
	e->xfree = next_free;
	r->user = x;
	if (pr)
		pr->n_live++; /* not evictable while it has live transfers (peer.c peer_slot()) */
	return 0;
}

KVX_API int kvx_xfer_read(struct kvx_engine *e, const struct kvx_engine_read *r)
{
	if (!e || !r)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_CONSUMER || e->p.mode != KVX_SCHED_MODE_READ)
		return -EBUSY;
	return submit(e, KVX_XFER_K_READ, r->transfer_id, &r->peer, r->local_blocks, r->remote_blocks, r->n, 0);
}

KVX_API int kvx_xfer_announce(struct kvx_engine *e, const struct kvx_engine_announce *a)
{
	if (!e || !a)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_CONSUMER || e->p.mode != KVX_SCHED_MODE_WRITE)
		return -EBUSY;
	if (a->notified && !a->n)
		return -EINVAL;
	/* consumer_tp of an announce: 1 = remote_blocks was sent by the scheduler (a->notified). */
	return submit(e, KVX_XFER_K_ANNOUNCE, a->transfer_id, &a->peer, a->local_blocks, NULL, a->n, a->notified);
}

KVX_API int kvx_xfer_write_begin(struct kvx_engine *e, const struct kvx_engine_write *w)
{
	if (!e || !w)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_PRODUCER || e->p.mode != KVX_SCHED_MODE_WRITE)
		return -EBUSY;
	if (w->n == 0)
		return -EINVAL;
	return submit(e, KVX_XFER_K_WRITE, w->transfer_id, &w->peer, w->local_blocks, NULL, w->n, 0);
}

KVX_API int kvx_xfer_serve(struct kvx_engine *e, const struct kvx_engine_serve *s)
{
	if (!e || !s)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_PRODUCER || e->p.mode != KVX_SCHED_MODE_READ)
		return -EBUSY;
	if (s->n == 0)
		return -EINVAL;
	return submit(e, KVX_XFER_K_SERVE, s->transfer_id, NULL, s->local_blocks, NULL, s->n, s->consumer_tp_size);
}

static int push_tid_msg(struct kvx_engine *e, uint32_t type, const char *tid, uint32_t u32, const void *ptr,
			const struct kvx_mem_event *ev)
{
	if (!e || !tid)
		return -EINVAL;
	if (!e->started || e->stopped)
		return -EBUSY;
	/* The id is resolved here, once: the poller gets the transfer's handle. */
	struct kvx_xfer *r = kvx_xfer_find(e->reg, tid);
	if (!r || r->state != KVX_XFER_S_LIVE || !r->user)
		return -ENOENT;
	const struct xf *x = r->user;
	struct smsg m = {.type = type, .u32 = u32, .slot = x->slot, .gen = x->gen, .ptr = ptr};
	if (ev)
		m.ev = *ev;
	return kvx_ring_enqueue_elem_burst_sp(x->po->sub, &m, 1, NULL) ? 0 : -ENOBUFS;
}
KVX_API int kvx_xfer_layer_ready(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				 const atomic_uint *ready)
{
	if (e && layer >= e->n_layers)
		return -EINVAL;
	return push_tid_msg(e, M_LAYER_READY, transfer_id, layer, ready, NULL);
}

/* Whether this host can poll hipEvent_t handles (probed once, on the application thread). */
static int hip_events_usable(struct kvx_engine *e)
{
	if (!kvx_mem_has_hip()) {
		kvx_log(KVX_LOG_ERROR, "engine: layer_ready: a hipEvent_t needs a HIP eng_cpl_build (libamdhip64 not found "
				       "at eng_cpl_build time)");
		return -ENOTSUP;
	}
	if (e->hip_probe == 0) {
		char why[KVX_MEM_WHY_LEN] = "";
		int rc = kvx_mem_probe(&(struct kvx_mem_type){.kind = KVX_MEM_HIP, .device = 0}, why, sizeof(why));
		e->hip_probe = rc ? rc : 1;
		snprintf(e->hip_why, sizeof(e->hip_why), "%s", rc ? (why[0] ? why : kvx_strerror(rc)) : "");
	}
	if (e->hip_probe < 0) {
		kvx_log(KVX_LOG_ERROR, "engine: layer_ready: cannot poll a hipEvent_t here: %s", e->hip_why);
		return e->hip_probe;
	}
	return 0;
}

KVX_API int kvx_xfer_layer_ready_event(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				       const struct kvx_mem_event *ev)
{
	if (!e || !transfer_id)
		return -EINVAL;
	if (layer >= e->n_layers) {
		kvx_log(KVX_LOG_ERROR, "engine: layer_ready: layer %u out of range (%u layers registered)", layer,
			e->n_layers);
		return -EINVAL;
	}
	struct kvx_mem_event none = {0};
	if (!ev)
		ev = &none;
	switch (ev->kind) {
	case KVX_MEM_EVENT_READY:
		break;
	case KVX_MEM_EVENT_FLAG:
		if (!ev->u.counter) {
			kvx_log(KVX_LOG_ERROR, "engine: layer_ready: flag event without a counter");
			return -EINVAL;
		}
		break;
	case KVX_MEM_EVENT_HIP: {
		int rc = hip_events_usable(e);
		if (rc)
			return rc;
		if (!ev->u.hip_event)
			return -EINVAL;
		break;
	}
	default:
		kvx_log(KVX_LOG_ERROR, "engine: layer_ready: event kind %u not accepted (host flag or hipEvent_t "
				       "only; a stream event belongs to its stream's thread)", ev->kind);
		return -EINVAL;
	}
	return push_tid_msg(e, M_LAYER_READY, transfer_id, layer, NULL, ev);
}

KVX_API int kvx_xfer_layer_ready_hip(struct kvx_engine *e, const char *transfer_id, uint32_t layer,
				     void *hip_event)
{
	if (!e || !transfer_id || !hip_event)
		return -EINVAL;
	int rc = hip_events_usable(e);
	if (rc)
		return rc;
	struct kvx_mem_event ev;
	if ((rc = kvx_mem_event_init_hip(&ev, hip_event)))
		return rc;
	return kvx_xfer_layer_ready_event(e, transfer_id, layer, &ev);
}

KVX_API int kvx_xfer_seal(struct kvx_engine *e, const char *transfer_id, uint32_t n_layers)
{
	if (e && (n_layers == 0 || n_layers > e->n_layers))
		return -EINVAL;
	return push_tid_msg(e, M_SEAL, transfer_id, n_layers, NULL, NULL);
}

KVX_API int kvx_xfer_abort(struct kvx_engine *e, const char *transfer_id)
{
	return push_tid_msg(e, M_ABORT, transfer_id, 0, NULL, NULL);
}

/* Take every completion the pollers handed over (their `cpl` rings, starting where the last
 * call started: no poller starves) into the app thread's staging queue, in order. The
 * outcome of a transfer is stored once, here, by this thread: in its registry entry, from its
 * KVX_CPL_TRANSFER completion (the poller only builds the completion). The transfer object
 * stays taken until its last completion leaves the queue (kvx_engine_poll_completions()), so
 * the queue never holds more than 2 x max_transfers entries. */
static void cpl_stage(struct kvx_engine *e)
{
	for (uint32_t j = 0; j < e->n_po; j++) {
		struct poller *po = e->po[(e->cpl_rr + j) % e->n_po];
		while (e->stage_n < e->stage_cap) {
			struct cmsg *c = &e->stage[(e->stage_head + e->stage_n) % e->stage_cap];
			if (!kvx_ring_dequeue_elem_burst_sc(po->cpl, c, 1, NULL))
				break;
			e->stage_n++;
			const struct xf *x = c->xf;
			struct kvx_xfer *r = x->reg && x->reg->user == x ? x->reg : NULL;
			if (c->c.kind == KVX_CPL_TRANSFER && r) {
				r->final_status = (uint8_t)(1 + c->c.status);
				r->final_error = c->c.error;
			}
		}
	}
	e->cpl_rr = e->n_po ? (e->cpl_rr + 1) % e->n_po : 0;
}

KVX_API int kvx_xfer_layer_poll(struct kvx_engine *e, const char *transfer_id, uint32_t layer)
{
	if (!e || !transfer_id || layer >= KVX_ENGINE_MAX_LAYERS)
		return -EINVAL;
	struct kvx_xfer *r = kvx_xfer_find(e->reg, transfer_id);
	if (!r)
		return -ENOENT;
	if (r->state == KVX_XFER_S_LIVE && !r->final_status) {
		const struct xf *x = r->user;
		/* Acquire pairs with the release in handle_cpl(): the layer's bytes are visible. */
		if (atomic_load_explicit(&x->layer_done[layer / 64], memory_order_acquire) & (1ull << (layer % 64)))
			return 1;
		cpl_stage(e); /* its outcome, if the poller handed it over */
	}
	if (!r->final_status)
		return 0;
	if (r->final_status == 1 + KVX_CPL_DONE)
		return 1;
	return r->final_error ? r->final_error : -EIO;
}

KVX_API int kvx_xfer_layer_wait(struct kvx_engine *e, const char *transfer_id, uint32_t layer, uint32_t timeout_ms)
{
	uint64_t deadline = kvx_now_ns() + ms_ns(timeout_ms);
	int rc = kvx_xfer_layer_poll(e, transfer_id, layer);
	if (rc)
		return rc == 1 ? 0 : rc;
	if (!e->app_w_init)
		return -EBUSY;
	for (;;) {
		/* Announce the sleep, then re-check (the poller's wake after its release store can
		 * then not be lost: lcore.h waiter protocol). */
		kvx_waiter_prepare(&e->app_w);
		rc = kvx_xfer_layer_poll(e, transfer_id, layer);
		if (rc) {
			kvx_waiter_cancel(&e->app_w);
			return rc == 1 ? 0 : rc;
		}
		uint64_t now = kvx_now_ns();
		if (now >= deadline) {
			kvx_waiter_cancel(&e->app_w);
			return -ETIMEDOUT;
		}
		int sr = kvx_waiter_sleep(&e->app_w, deadline - now);
		if (sr < 0)
			return sr;
	}
}

KVX_API size_t kvx_engine_poll_completions(struct kvx_engine *e, struct kvx_completion *out, size_t n)
{
	if (!e || !out || !e->started)
		return 0;
	cpl_stage(e);
	size_t got = 0;
	while (got < n && e->stage_n) {
		const struct cmsg *c = &e->stage[e->stage_head];
		e->stage_head = (e->stage_head + 1) % e->stage_cap;
		e->stage_n--;
		out[got++] = c->c;
		if (c->c.kind == KVX_CPL_TRANSFER && !c->last)
			e->n_held++; /* a KVX_CPL_BLOCKS_RELEASED (last) follows */
		else if (c->c.kind == KVX_CPL_BLOCKS_RELEASED)
			e->n_held--;
		if (c->last) {
			/* The registry entry stays live (not evictable) until the last completion: the
			 * object's app-side pointer to it is valid here, no lookup by id. */
			struct xf *x = c->xf;
			struct kvx_xfer *r = x->reg && x->reg->user == x ? x->reg : NULL;
			if (r) {
				r->user = NULL;
				kvx_xfer_make_terminal(e->reg, r);
			}
			x->next_free = e->xfree; /* the object is free for the next submission */
			e->xfree = x->slot + 1;
			if (x->peer && !--x->peer->n_live)
				x->peer->idle_since = kvx_now_ns();
		}
	}
	if (e->metrics)
		kvx_metrics_on_poll(e->metrics, e, e->ctl, out, got,
				    &(struct kvx_metrics_app){.objects = kvx_xfer_live_count(e->reg),
							      .held = e->n_held, .pool_full = e->st_nobufs},
				    false);
	return got;
}
