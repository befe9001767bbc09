/* SPDX-License-Identifier: Apache-2.0 */
/* verbs provider data path: op queue, chunking over QPs, WR chains with selective signaling,
 * inline and SGE merging, CQ polling, per-batch accounting, error cascade
 * (docs/runtime-notes.md §3.5-3.8, §3.10). Hot path: no allocation, no logging. */
#include "verbs_internal.h"

#include <errno.h>
#include <stdlib.h>

#define cnt_add(e, f, v) xport_cnt_add(&(e)->base.cnt, f, v)

int verbs_ep_queues_init(struct vep *e, uint32_t depth)
{
	e->depth = depth;
	e->ops = calloc(depth, sizeof(*e->ops));
	e->op_free = calloc(depth, sizeof(*e->op_free));
	e->batches = calloc(depth, sizeof(*e->batches));
	e->b_free = calloc(depth, sizeof(*e->b_free));
	e->ready = calloc(depth, sizeof(*e->ready));
	if (!e->ops || !e->op_free || !e->batches || !e->b_free || !e->ready)
		return -ENOMEM;
	for (uint32_t i = 0; i < depth; i++) {
		e->op_free[i] = depth - 1 - i;
		e->b_free[i] = depth - 1 - i;
	}
	e->n_op_free = e->n_b_free = depth;
	e->old_head = e->old_tail = VERBS_NIL;
	e->pend_head = e->pend_tail = VERBS_NIL;
	return 0;
}

void verbs_ep_queues_fini(struct vep *e)
{
	free(e->ops);
	free(e->op_free);
	free(e->batches);
	free(e->b_free);
	free(e->ready);
}

bool verbs_ep_idle(const struct vep *e)
{
	if (e->n_op_free != e->depth)
		return false;
	for (uint32_t i = 0; i < e->nqp; i++)
		if (e->qps[i].seq_post != e->qps[i].seq_done)
			return false;
	return true;
}

static void old_unlink(struct vep *e, uint32_t bid)
{
	struct vbatch *b = &e->batches[bid];
	if (b->prev != VERBS_NIL)
		e->batches[b->prev].next = b->next;
	else
		e->old_head = b->next;
	if (b->next != VERBS_NIL)
		e->batches[b->next].prev = b->prev;
	else
		e->old_tail = b->prev;
}

/* An op has no bytes left to post and no WR in flight: account it to its batch. */
static void op_finish(struct vep *e, uint32_t oid)
{
	struct vop *o = &e->ops[oid];
	uint32_t bid = o->batch;
	struct vbatch *b = &e->batches[bid];
	if (o->status) {
		b->n_failed++;
		if (o->idx < b->first_failed) {
			b->first_failed = o->idx;
			b->status = o->status;
		}
		cnt_add(e, ops_failed, 1);
		if (o->status == -ETIMEDOUT)
			cnt_add(e, timeouts, 1);
	} else {
		b->bytes += o->len;
		cnt_add(e, ops_ok, 1);
		if (b->opcode == KVX_XPORT_OP_READ)
			cnt_add(e, bytes_read, o->len);
		else
			cnt_add(e, bytes_written, o->len);
	}
	e->op_free[e->n_op_free++] = oid;
	if (++b->done_ops == b->n_ops) {
		old_unlink(e, bid);
		e->ready[e->ready_tail++ & (e->depth - 1)] = bid;
	}
}

/* Status of an op caught by the flush of an endpoint in error state. */
static int flush_status(const struct vep *e, const struct vop *o)
{
	uint64_t dl = e->batches[o->batch].deadline_ns; /* 0: not stamped yet, i.e. young */
	if (atomic_load_explicit(&e->base.status, memory_order_relaxed) == -ETIMEDOUT && dl &&
	    dl <= e->fail_ns)
		return -ETIMEDOUT;
	return -ECONNRESET;
}

static void op_wr_done(struct vep *e, uint32_t oid, int st)
{
	struct vop *o = &e->ops[oid];
	o->wrs_out--;
	if (st && !o->status)
		o->status = st;
	if (o->wrs_out == 0 && o->posted == o->len)
		op_finish(e, oid);
}

KVX_COLD void verbs_ep_fail(struct vep *e, int err)
{
	if (atomic_load_explicit(&e->base.status, memory_order_relaxed))
		return;
	atomic_store_explicit(&e->base.status, err, memory_order_relaxed);
	e->fail_ns = kvx_now_ns();
	cnt_add(e, resets, 1);
	/* Every QP of the endpoint goes to ERR so all outstanding WRs flush (docs/runtime-notes.md
	 * §3.10): completions for everything, then kvx_xport_ep_reset() recovers. */
	for (uint32_t i = 0; i < e->nqp; i++) {
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		(void)ibv_modify_qp(e->qps[i].qp, &a, IBV_QP_STATE);
	}
	uint32_t oid = e->pend_head;
	e->pend_head = e->pend_tail = VERBS_NIL;
	while (oid != VERBS_NIL) {
		struct vop *o = &e->ops[oid];
		uint32_t next = o->next;
		if (!o->status)
			o->status = flush_status(e, o);
		o->posted = o->len;
		if (o->wrs_out == 0)
			op_finish(e, oid);
		oid = next;
	}
}

static int map_status(const struct vep *e, const struct vop *o, enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR: /* bad rkey or range outside the peer's MR */
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
		return -ERANGE;
	case IBV_WC_WR_FLUSH_ERR:
		return flush_status(e, o);
	default: /* RETRY_EXC (peer gone), RNR, fatal: the connection is lost */
		return -ECONNRESET;
	}
}

/* Retire sequences [q->seq_done, last] of one QP; `last` completes with wc status st_last. */
static void retire(struct vep *e, struct vqp *q, uint32_t last, enum ibv_wc_status st_last)
{
	uint32_t mask = e->sq_depth - 1;
	while (q->seq_done != last) {
		struct vwr *w = &q->wr[q->seq_done & mask];
		q->seq_done++;
		for (uint32_t k = 0; k < w->nops; k++)
			op_wr_done(e, w->op[k], 0);
	}
	struct vwr *w = &q->wr[last & mask];
	q->seq_done = last + 1;
	for (uint32_t k = 0; k < w->nops; k++) {
		int st = map_status(e, &e->ops[w->op[k]], st_last);
		op_wr_done(e, w->op[k], st);
	}
}

/*
 * Drain a CQ in bursts. Each completion goes to the endpoint its WR id names (slot +
 * generation), which may be another endpoint of the group: its ops and batches are retired
 * into its own queues, read by its next kvx_xport_poll_burst(). Returns completions drained.
 */
int verbs_cq_drain(struct vcq *vc)
{
	int total = 0;
	bool shared = vc->grp != NULL;
	if (shared) /* odd: slot pointers may be held (see vcq_unpublish) */
		atomic_fetch_add(&vc->poll_seq, 1);
	for (int round = 0; round < 4; round++) {
		int n = ibv_poll_cq(vc->cq, VERBS_CQ_BURST, vc->wc);
		if (n <= 0)
			break;
		total += n;
		for (int i = 0; i < n; i++) {
			const struct ibv_wc *wc = &vc->wc[i];
			uint32_t s = (uint32_t)(wc->wr_id >> VERBS_WRID_SLOT_SHIFT) & 0xff;
			struct vep *e = atomic_load(&vc->slot[s]);
			if (KVX_UNLIKELY(!e || (wc->wr_id & ~0xffffffffffull) != e->wr_tag))
				continue; /* stale: its endpoint is gone (or the slot reused) */
			uint32_t qi = (uint32_t)(wc->wr_id >> VERBS_WRID_QP_SHIFT) & 0xff;
			uint32_t seq = (uint32_t)wc->wr_id;
			if (KVX_UNLIKELY(qi >= e->nqp))
				continue;
			struct vqp *q = &e->qps[qi];
			/* Free-running 32-bit sequences: seq is live iff seq - seq_done <
			 * seq_post - seq_done (unsigned wrap-around keeps this exact). */
			if (KVX_UNLIKELY(seq - q->seq_done >= q->seq_post - q->seq_done))
				continue;
			retire(e, q, seq, wc->status);
			if (KVX_UNLIKELY(wc->status != IBV_WC_SUCCESS))
				verbs_ep_fail(e, -ECONNRESET);
		}
		if (n < VERBS_CQ_BURST)
			break;
	}
	if (shared) /* even: done with the slot pointers */
		atomic_fetch_add_explicit(&vc->poll_seq, 1, memory_order_release);
	return total;
}

/* Ring one QP's doorbell for its pending chain. */
static void doorbell(struct vep *e, struct vqp *q)
{
	e->db_mask &= ~(1ull << (uint32_t)(q - e->qps));
	if (!q->nchain)
		return;
	struct ibv_send_wr *last = &q->chain[q->nchain - 1];
	if (!(last->send_flags & IBV_SEND_SIGNALED)) {
		/* Every chain ends signaled, so every posted WR is eventually retired. */
		last->send_flags |= IBV_SEND_SIGNALED;
		q->last_sig = (uint32_t)last->wr_id;
	}
	last->next = NULL;
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(q->qp, q->chain, &bad);
	uint32_t n = q->nchain;
	q->nchain = 0;
	if (KVX_LIKELY(rc == 0))
		return;
	/* Unexpected refusal: roll back the WRs from `bad` on and fail the endpoint. */
	uint32_t k = bad ? (uint32_t)(bad - q->chain) : 0;
	if (k >= n)
		k = 0;
	uint32_t mask = e->sq_depth - 1;
	uint32_t first = (uint32_t)q->chain[k].wr_id; /* sequence bits */
	for (uint32_t s = first; s != q->seq_post; s++) {
		struct vwr *w = &q->wr[s & mask];
		for (uint32_t j = 0; j < w->nops; j++) {
			struct vop *o = &e->ops[w->op[j]];
			o->wrs_out--;
			if (!o->status)
				o->status = -ECONNRESET;
			if (o->wrs_out == 0 && o->posted == o->len)
				op_finish(e, w->op[j]);
		}
	}
	q->seq_post = first;
	verbs_ep_fail(e, -ECONNRESET);
}

/* QP with a free send-queue slot, round robin; -1 if none. */
static int pick_qp(struct vep *e)
{
	for (uint32_t k = 0; k < e->nqp; k++) {
		uint32_t i = e->rr + k;
		if (i >= e->nqp)
			i -= e->nqp;
		struct vqp *q = &e->qps[i];
		if (q->seq_post - q->seq_done < e->sq_depth) {
			e->rr = i + 1 == e->nqp ? 0 : i + 1;
			return (int)i;
		}
	}
	return -1;
}

static void pend_pop(struct vep *e)
{
	e->pend_head = e->ops[e->pend_head].next;
	if (e->pend_head == VERBS_NIL)
		e->pend_tail = VERBS_NIL;
}

/*
 * Post as many queued ops as the send queues take. A large op is sliced into chunks spread
 * over the QPs; consecutive small ops of one batch whose remote ranges are contiguous share
 * one WR (one SGE each, or one SGE if the local ranges are contiguous too).
 */
static void flush_pending(struct vep *e)
{
	const struct vbatch *bt = NULL;
	while (e->pend_head != VERBS_NIL &&
	       !atomic_load_explicit(&e->base.status, memory_order_relaxed)) {
		int qi = pick_qp(e);
		if (qi < 0)
			break;
		struct vqp *q = &e->qps[qi];
		uint32_t oid = e->pend_head;
		struct vop *o = &e->ops[oid];
		bt = &e->batches[o->batch];
		bool read = bt->opcode == KVX_XPORT_OP_READ;
		uint32_t seq = q->seq_post;
		struct vwr *w = &q->wr[seq & (e->sq_depth - 1)];
		struct ibv_send_wr *wr = &q->chain[q->nchain];
		struct ibv_sge *sg = q->sge[q->nchain];
		uint64_t start = o->posted;
		uint64_t seg = o->len - start < o->chunk ? o->len - start : o->chunk;
		sg[0].addr = o->laddr + start;
		sg[0].length = (uint32_t)seg;
		sg[0].lkey = o->lkey;
		uint32_t nsge = 1;
		w->op[0] = oid;
		w->nops = 1;
		w->bytes = seg;
		o->posted += seg;
		o->wrs_out++;
		uint64_t raddr = o->raddr + start;
		uint32_t rkey = o->rkey;
		if (o->posted == o->len) {
			pend_pop(e);
			uint32_t max_sge = read ? e->max_sge_rd : e->max_sge_wr;
			uint64_t limit = e->nqp > 1 ? 4ull * VERBS_MIN_CHUNK : e->max_msg;
			/* SGE merging: only whole ops of the same batch, remote-contiguous. */
			while (start == 0 && e->pend_head != VERBS_NIL && w->nops < VERBS_MAX_SGE) {
				struct vop *n = &e->ops[e->pend_head];
				if (n->batch != o->batch || n->posted || n->rkey != rkey ||
				    n->raddr != raddr + w->bytes || w->bytes + n->len > limit)
					break;
				struct ibv_sge *ls = &sg[nsge - 1];
				if (ls->lkey == n->lkey && ls->addr + ls->length == n->laddr)
					ls->length += (uint32_t)n->len;
				else if (nsge < max_sge)
					sg[nsge++] = (struct ibv_sge){n->laddr, (uint32_t)n->len, n->lkey};
				else
					break;
				w->op[w->nops++] = e->pend_head;
				w->bytes += n->len;
				n->posted = n->len;
				n->wrs_out++;
				pend_pop(e);
			}
		}
		/* Only the fields an RDMA READ/WRITE uses; the chain slots are zeroed at creation
		 * and only ever hold RDMA WRs, so no memset per WR. */
		wr->wr_id = e->wr_tag | (uint64_t)(uint32_t)qi << VERBS_WRID_QP_SHIFT | seq;
		wr->next = NULL;
		wr->sg_list = sg;
		wr->num_sge = (int)nsge;
		wr->opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		wr->wr.rdma.remote_addr = raddr;
		wr->wr.rdma.rkey = rkey;
		unsigned flags = !read && w->bytes <= e->inline_max ? IBV_SEND_INLINE : 0;
		if (seq - q->last_sig >= e->sig_interval) {
			flags |= IBV_SEND_SIGNALED;
			q->last_sig = seq;
		}
		wr->send_flags = flags;
		if (q->nchain)
			q->chain[q->nchain - 1].next = wr;
		q->nchain++;
		q->seq_post++;
		e->db_mask |= 1ull << (uint32_t)qi;
		if (q->nchain == VERBS_CHAIN_MAX)
			doorbell(e, q);
	}
	/* One doorbell per QP that has a chain (a 1-op batch: exactly one ibv_post_send). */
	while (e->db_mask)
		doorbell(e, &e->qps[__builtin_ctzll(e->db_mask)]);
}

int verbs_post(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
	       const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie)
{
	struct vep *e = (struct vep *)ep;
	if (KVX_UNLIKELY(n > e->n_op_free || e->n_b_free == 0)) {
		cnt_add(e, post_nobufs, 1);
		return -ENOBUFS;
	}
	uint32_t bid = e->b_free[--e->n_b_free];
	struct vbatch *b = &e->batches[bid];
	*b = (struct vbatch){
		.cookie = cookie,
		.deadline_ns = 0, /* stamped by the poller's next clock read (stamp_deadlines) */
		.seq = e->batch_seq++,
		.n_ops = n,
		.first_failed = n,
		.prev = e->old_tail,
		.next = VERBS_NIL,
		.opcode = (uint8_t)opcode,
	};
	if (e->old_tail != VERBS_NIL)
		e->batches[e->old_tail].next = bid;
	else
		e->old_head = bid;
	e->old_tail = bid;
	cnt_add(e, ops_posted, n);
	if (KVX_UNLIKELY(atomic_load_explicit(&e->async_err, memory_order_relaxed)))
		verbs_ep_fail(e, -ECONNRESET); /* a device async event hit this endpoint */
	int ep_err = atomic_load_explicit(&ep->status, memory_order_relaxed) ? -ECONNRESET : 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvx_xport_op *op = &ops[i];
		const struct vmr *lm = (const struct vmr *)op->lmr;
		const struct kvx_xport_rmr *rm = op->rmr;
		uint32_t oid = e->op_free[--e->n_op_free];
		struct vop *o = &e->ops[oid];
		*o = (struct vop){
			.laddr = (uint64_t)(uintptr_t)lm->base.addr + op->loff,
			.raddr = rm->addr + op->roff,
			.len = op->len,
			.chunk = op->len,
			.lkey = lm->mr->lkey,
			.rkey = rm->key,
			.batch = bid,
			.idx = i,
			.next = VERBS_NIL,
		};
		/* Checked here against the advertised descriptors; the NIC enforces the same on
		 * the peer's side (rkey + MR bounds) for descriptors that lie. */
		int st = ep_err;
		if (op->loff > lm->base.len || op->len > lm->base.len - op->loff ||
		    op->roff > rm->len || op->len > rm->len - op->roff)
			st = -ERANGE;
		else if (opcode == KVX_XPORT_OP_READ
				 ? !(rm->access & KVX_XPORT_ACCESS_REMOTE_READ) ||
					   !(lm->base.access & KVX_XPORT_ACCESS_LOCAL_WRITE)
				 : !(rm->access & KVX_XPORT_ACCESS_REMOTE_WRITE))
			st = -EACCES;
		if (st) {
			o->status = st;
			o->posted = o->len;
			op_finish(e, oid);
			continue;
		}
		if (e->nqp > 1 && o->len > VERBS_MIN_CHUNK) {
			uint64_t c = (o->len + e->nqp - 1) / e->nqp;
			c = (c + 4095) & ~4095ull;
			o->chunk = c < VERBS_MIN_CHUNK ? VERBS_MIN_CHUNK : c;
		}
		if (o->chunk > e->max_msg)
			o->chunk = e->max_msg;
		if (e->pend_tail != VERBS_NIL)
			e->ops[e->pend_tail].next = oid;
		else
			e->pend_head = oid;
		e->pend_tail = oid;
	}
	flush_pending(e);
	return 0;
}

/*
 * Give every batch posted since the last clock read its deadline (now + op timeout). The
 * post path reads no clock (in a VM without a TSC clocksource that is a syscall per op); the
 * poller reads it every 8th busy poll, so a deadline is late by at most a few polls.
 */
static void stamp_deadlines(struct vep *e, uint64_t now)
{
	uint64_t dl = now + e->base.ctx->params.op_timeout_ns;
	for (uint32_t b = e->old_tail; b != VERBS_NIL && !e->batches[b].deadline_ns;
	     b = e->batches[b].prev)
		e->batches[b].deadline_ns = dl;
}

int verbs_poll(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max)
{
	struct vep *e = (struct vep *)ep;
	if (KVX_UNLIKELY(!e->depth))
		return 0;
	if (KVX_UNLIKELY(atomic_load_explicit(&e->async_err, memory_order_relaxed)))
		verbs_ep_fail(e, -ECONNRESET); /* a device async event hit this endpoint */
	if (e->old_head != VERBS_NIL) {
		verbs_cq_drain(e->vc);
		if (e->pend_head != VERBS_NIL)
			flush_pending(e);
		/* Op deadlines (seconds) are stamped and checked on every 8th busy poll: no clock
		 * read per post or per spin of a latency-bound poller. */
		if (e->old_head != VERBS_NIL && KVX_UNLIKELY((++e->ticks & 7) == 0) &&
		    !atomic_load_explicit(&ep->status, memory_order_relaxed)) {
			uint64_t now = kvx_now_ns();
			stamp_deadlines(e, now);
			if (e->batches[e->old_head].deadline_ns <= now)
				verbs_ep_fail(e, -ETIMEDOUT);
		}
	}
	uint32_t k = 0;
	uint32_t mask = e->depth - 1;
	while (k < max && e->ready_head != e->ready_tail) {
		uint32_t bid = e->ready[e->ready_head++ & mask];
		const struct vbatch *b = &e->batches[bid];
		cpl[k++] = (struct kvx_xport_cpl){
			.cookie = b->cookie,
			.status = b->status,
			.n_ops = b->n_ops,
			.n_failed = b->n_failed,
			.first_failed = b->first_failed,
			.bytes = b->bytes,
		};
		e->b_free[e->n_b_free++] = bid;
	}
	if (k)
		cnt_add(e, batches_done, k);
	return (int)k;
}
