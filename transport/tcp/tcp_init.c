/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp provider, initiator data path (the owning poller): ops split into chunks striped over the
 * endpoint's channels, gathered request sends, in-order responses, device staging of WRITE
 * sources and READ destinations (tcp_internal.h).
 */
#include "tcp_internal.h"

/* ---- initiator data path ---- */

static void batch_finish(struct tcp_ep *e, uint32_t bi)
{
	struct tcp_batch *b = &e->b[bi & e->b_mask];
	b->done = true;
	e->doneq[e->dq_head & e->b_mask] = bi;
	e->dq_head++;
	while (e->b_oldest != e->b_head && e->b[e->b_oldest & e->b_mask].done)
		e->b_oldest++;
}

static void op_finish(struct tcp_ep *e, struct tcp_op *o)
{
	struct tcp_batch *b = &e->b[o->batch & e->b_mask];
	o->done = true;
	if (o->status) {
		if (!b->n_failed || o->index < b->first_failed) {
			if (!b->n_failed)
				b->status = o->status;
			b->first_failed = o->index;
		}
		b->n_failed++;
		xport_cnt_add(&e->base.cnt, ops_failed, 1);
		if (o->status == -ETIMEDOUT)
			xport_cnt_add(&e->base.cnt, timeouts, 1);
	} else {
		b->bytes += o->len;
		xport_cnt_add(&e->base.cnt, ops_ok, 1);
		if (o->write)
			xport_cnt_add(&e->base.cnt, bytes_written, o->len);
		else
			xport_cnt_add(&e->base.cnt, bytes_read, o->len);
	}
	if (--b->left == 0)
		batch_finish(e, o->batch);
	while (e->op_tail != e->op_head && e->ops[e->op_tail & e->op_mask].done)
		e->op_tail++;
}

/* Finish an op once no byte and no staging copy of it is outstanding. */
static void op_settle(struct tcp_ep *e, struct tcp_op *o)
{
	if (!o->done && !o->left && !o->copies)
		op_finish(e, o);
}

static void chunk_unhold(struct tdev *d, struct tcp_chunk *k)
{
	tcp_bounce_put(d, k->payload, k->bslot, &k->held);
}

/* Move the endpoint to error state: close its sockets and complete every outstanding op (an
 * op with staging copies in flight completes when they finished: see pump()). */
static KVX_COLD void ep_fail(struct tcp_ep *e, int status)
{
	struct tdev *d = ep_dev(e);
	if (!atomic_load_explicit(&e->base.status, memory_order_relaxed)) {
		atomic_store_explicit(&e->base.status, status, memory_order_relaxed);
		xport_cnt_add(&e->base.cnt, resets, 1);
	}
	for (uint32_t i = 0; i < e->nch; i++) {
		struct ich *c = &e->ch[i];
		if (d && c->pay_dev)
			(void)kvx_mem_stage_h2d_cancel(d->rx, &c->pay_b);
		c->pay_dev = false;
		for (uint32_t q = c->sent; d && q != c->head; q++)
			if (c->q[q & (TCP_CHQ - 1)].held)
				chunk_unhold(d, &c->q[q & (TCP_CHQ - 1)]);
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		c->head = c->sent = c->tail = c->sent_off = 0;
		c->out_bytes = 0;
		c->rx_start = c->rx_end = 0;
		c->in_pay = false;
	}
	uint64_t now = kvx_now_ns();
	for (uint32_t i = e->op_tail; i != e->op_head; i++) {
		struct tcp_op *o = &e->ops[i & e->op_mask];
		if (o->done)
			continue;
		if (!o->status)
			o->status = now >= e->b[o->batch & e->b_mask].deadline_ns ? -ETIMEDOUT
										   : -ECONNRESET;
		o->left = 0;
		op_settle(e, o);
	}
	e->op_sched = e->op_head;
}

static void chunk_done(struct tcp_ep *e, struct ich *c, int32_t status)
{
	struct tcp_chunk *k = &c->q[c->tail & (TCP_CHQ - 1)];
	struct tcp_op *o = &e->ops[k->op & e->op_mask];
	if (status && !o->status)
		o->status = status;
	o->left -= k->len;
	c->out_bytes -= k->len;
	c->tail++;
	op_settle(e, o);
}

/* Schedule chunks of pending ops onto channels with room (round-robin striping). */
static int fill(struct tcp_ep *e)
{
	uint32_t chunk = e->base.ctx->params.chunk_bytes;
	struct tdev *d = ep_dev(e);
	int work = 0;
	/* Ops that failed at post may complete (and free their slots) before being scheduled. */
	if ((int32_t)(e->op_tail - e->op_sched) > 0)
		e->op_sched = e->op_tail;
	while (e->op_sched != e->op_head) {
		struct tcp_op *o = &e->ops[e->op_sched & e->op_mask];
		if (o->done || o->sched == o->len) {
			e->op_sched++;
			continue;
		}
		struct ich *c = NULL;
		for (uint32_t t = 0; t < e->nch; t++) {
			struct ich *x = &e->ch[(e->rr + t) % e->nch];
			if (x->head - x->tail < TCP_CHQ && x->out_bytes < TCP_WINDOW) {
				c = x;
				e->rr = (e->rr + t + 1) % e->nch;
				break;
			}
		}
		if (!c)
			break;
		uint64_t rem = o->len - o->sched;
		uint32_t len = rem < chunk ? (uint32_t)rem : chunk;
		struct tcp_chunk *k = &c->q[c->head & (TCP_CHQ - 1)];
		k->ready = true;
		k->held = false;
		k->dev = o->dev && !o->write;
		if (o->dev && o->write) {
			/* Cookie: op index, channel, queue slot (see pump()). */
			uint64_t ck = ((uint64_t)e->op_sched << 32) |
				      ((uint64_t)(c - e->ch) << 16) | (c->head & (TCP_CHQ - 1));
			if (kvx_mem_stage_d2h_push(d->tx, o->laddr + o->sched, len, ck))
				break; /* job queue full: continue once chunks were handed out */
			k->ready = false;
			o->copies++;
			d->copies++;
		}
		k->op = e->op_sched;
		k->off = o->sched;
		k->len = len;
		k->seq = c->seq++;
		k->write = o->write;
		k->payload = k->ready ? o->laddr + o->sched : NULL;
		uint8_t *h = k->hdr;
		h[0] = o->write ? REQ_WRITE : REQ_READ;
		h[1] = o->cond ? REQF_COND : 0;
		xport_put_u16(h + 2, 0);
		xport_put_u32(h + 4, o->key);
		xport_put_u64(h + 8, o->roff);
		xport_put_u64(h + 16, o->len);
		xport_put_u64(h + 24, o->sched);
		xport_put_u32(h + 32, len);
		xport_put_u32(h + 36, k->seq);
		if (o->cond) {
			xport_put_u32(h + 40, o->ckey);
			xport_put_u32(h + 44, 0);
			xport_put_u64(h + 48, o->coff);
			xport_put_u64(h + 56, o->cexp);
		}
		c->head++;
		c->out_bytes += len;
		o->sched += len;
		work++;
	}
	return work;
}

static int ich_tx(struct tcp_ep *e, struct ich *c)
{
	struct txent x[TCP_TXENT];
	int work = 0;
	while (c->wr_ok) {
		uint32_t n = 0;
		for (uint32_t i = c->sent; i != c->head && n < TCP_TXENT; i++) {
			const struct tcp_chunk *k = &c->q[i & (TCP_CHQ - 1)];
			if (!k->ready)
				break; /* its bounce buffer is still being filled: in order */
			uint32_t hl = k->hdr[1] & REQF_COND ? TCP_REQ + TCP_COND : TCP_REQ;
			x[n++] = (struct txent){k->hdr, hl, k->payload, k->write ? k->len : 0};
		}
		if (!n)
			return work;
		int full = tcp_txv_send(c->fd, x, n, &c->sent_off, &c->wr_ok, &e->base.cnt);
		if (full < 0)
			return full == -EAGAIN ? work : full;
		work++;
		for (; full > 0; full--, c->sent++) {
			struct tcp_chunk *k = &c->q[c->sent & (TCP_CHQ - 1)];
			if (k->held)
				chunk_unhold(ep_dev(e), k);
		}
	}
	return work;
}

/* A READ chunk's payload is in its bounce buffer: start the copy to the device destination.
 * Returns the chunk's status (the op completes when the copy did: see pump()). */
static int32_t rx_commit(struct tcp_ep *e, struct ich *c)
{
	struct tdev *d = ep_dev(e);
	struct tcp_chunk *k = &c->q[c->tail & (TCP_CHQ - 1)];
	struct tcp_op *o = &e->ops[k->op & e->op_mask];
	c->pay_dev = false;
	if (KVX_UNLIKELY(kvx_mem_stage_h2d_commit(d->rx, &c->pay_b, k->payload, k->len, k->op))) {
		(void)kvx_mem_stage_h2d_cancel(d->rx, &c->pay_b);
		return -EIO;
	}
	o->copies++;
	d->copies++;
	return 0;
}

static int ich_rx(struct tcp_ep *e, struct ich *c)
{
	int work = 0;
	for (;;) {
		if (c->in_pay) {
			uint32_t avail = c->rx_end - c->rx_start;
			if (avail) {
				uint32_t n = avail < c->pay_left ? avail : c->pay_left;
				memcpy(c->pay_dst, c->rx + c->rx_start, n);
				c->rx_start += n;
				c->pay_dst += n;
				c->pay_left -= n;
			}
			if (!c->pay_left) {
				c->in_pay = false;
				chunk_done(e, c, c->pay_dev ? rx_commit(e, c) : 0);
				work++;
				continue;
			}
			if (c->pay_left >= TCP_DIRECT) {
				int n = c->rd_ok ? tcp_recv(c->fd, c->pay_dst, c->pay_left, &c->rd_ok,
						    &e->base.cnt)
						 : 0;
				if (n <= 0)
					return n < 0 ? n : work;
				c->pay_dst += n;
				c->pay_left -= (uint32_t)n;
				continue;
			}
		} else if (c->rx_end - c->rx_start >= TCP_RESP) {
			const uint8_t *h = c->rx + c->rx_start;
			int32_t st = (int32_t)xport_get_u32(h);
			uint32_t seq = xport_get_u32(h + 4), len = xport_get_u32(h + 8);
			if (c->tail == c->sent)
				return -EPROTO; /* answer to nothing we sent */
			struct tcp_chunk *k = &c->q[c->tail & (TCP_CHQ - 1)];
			uint32_t want = (st == 0 && !k->write) ? k->len : 0;
			if (seq != k->seq || len != want || xport_get_u32(h + 12) ||
			    (st != 0 && st != -ERANGE && st != -EACCES && st != -ESTALE))
				return -EPROTO;
			if (want && k->dev) {
				/* Device destination: receive into a bounce buffer, then copy. */
				if (kvx_mem_stage_h2d_get(ep_dev(e)->rx, &c->pay_b))
					return work; /* all buffers busy: retry after pump() */
				c->pay_dev = true;
			}
			c->rx_start += TCP_RESP;
			c->big = want >= TCP_DIRECT;
			if (want) {
				c->in_pay = true;
				c->pay_left = want;
				c->pay_dst = c->pay_dev ? c->pay_b.buf : k->payload;
			} else {
				chunk_done(e, c, st);
				work++;
			}
			continue;
		}
		/* Need more bytes in the rx buffer; after a large READ payload, the next header
		 * alone (its payload then goes direct). */
		int n = tcp_rx_fill(c->fd, c->rx, &c->rx_start, &c->rx_end,
				    !c->in_pay && c->big ? TCP_RESP : TCP_RXBUF, &c->rd_ok, &e->base.cnt);
		if (n <= 0)
			return n < 0 ? n : work;
	}
}

/* Hand filled bounce buffers to their chunks and retire finished copies. In error state the
 * buffers go straight back: the ops only wait for their copies to finish. */
static int pump(struct tcp_ep *e, struct tdev *d)
{
	bool dead = atomic_load_explicit(&e->base.status, memory_order_relaxed) != 0;
	struct kvx_mem_chunk b;
	uint64_t ck;
	size_t len;
	int work = 0, rc;
	while ((rc = kvx_mem_stage_d2h_poll(d->tx, &b)) == 1) {
		struct tcp_op *o = &e->ops[(uint32_t)(b.cookie >> 32) & e->op_mask];
		o->copies--;
		d->copies--;
		work++;
		if (dead) {
			(void)kvx_mem_stage_d2h_release(d->tx, &b);
			op_settle(e, o);
			continue;
		}
		struct tcp_chunk *k = &e->ch[(b.cookie >> 16) & 0xffff].q[b.cookie & (TCP_CHQ - 1)];
		k->payload = b.buf;
		k->bslot = b.slot;
		k->held = true;
		k->ready = true;
	}
	while ((rc = kvx_mem_stage_h2d_poll(d->rx, &ck, &len)) == 1) {
		struct tcp_op *o = &e->ops[(uint32_t)ck & e->op_mask];
		o->copies--;
		d->copies--;
		op_settle(e, o);
		work++;
	}
	if (KVX_UNLIKELY(rc < 0 && d->copies)) {
		/* A copy failed (device error): nothing more will come out of this staging. */
		for (uint32_t i = e->op_tail; i != e->op_head; i++) {
			struct tcp_op *o = &e->ops[i & e->op_mask];
			if (!o->done && o->copies && !o->status)
				o->status = -EIO;
			o->copies = 0;
		}
		d->copies = 0;
		ep_fail(e, -EIO);
	}
	return work;
}

/* Readiness edges of the channel sockets into their flags (edge-triggered: each edge once). */
static int ep_harvest(struct tcp_ep *e, int timeout_ms)
{
	struct epoll_event ev[TCP_EVS];
	int n = epoll_wait(e->epfd, ev, TCP_EVS, timeout_ms);
	for (int i = 0; i < n; i++) {
		struct ich *c = &e->ch[ev[i].data.u32];
		if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
			c->rd_ok = true;
		if (ev[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
			c->wr_ok = true;
	}
	return n > 0 ? 1 : 0;
}

/* A channel has work it can do now without waiting for an edge. */
static bool ich_more(const struct ich *c)
{
	return (c->wr_ok && c->sent != c->head && c->q[c->sent & (TCP_CHQ - 1)].ready) ||
	       (c->rd_ok && c->tail != c->sent);
}

/* @p harvest: collect readiness edges first (poll does, post relies on the flags). */
static int drive(struct tcp_ep *e, bool harvest)
{
	struct tdev *d = ep_dev(e);
	int work = d && d->copies ? pump(e, d) : 0;
	if (atomic_load_explicit(&e->base.status, memory_order_relaxed))
		return work;
	work += fill(e);
	if (d && d->copies)
		work += pump(e, d);
	if (harvest && e->op_tail != e->op_head)
		ep_harvest(e, 0);
	for (uint32_t i = 0; i < e->nch; i++) {
		struct ich *c = &e->ch[i];
		if (c->tail == c->head && c->rx_start == c->rx_end)
			continue;
		int rc = ich_tx(e, c);
		if (rc >= 0) {
			work += rc;
			rc = ich_rx(e, c);
		}
		if (KVX_UNLIKELY(rc < 0)) {
			if (rc == -EPROTO)
				xport_cnt_add(&e->base.cnt, proto_errors, 1);
			ep_fail(e, -ECONNRESET);
			return work + 1;
		}
		work += rc;
	}
	/* Chunks freed by responses make room for more. */
	if (e->op_sched != e->op_head && fill(e)) {
		for (uint32_t i = 0; i < e->nch; i++) {
			int rc = ich_tx(e, &e->ch[i]);
			if (KVX_UNLIKELY(rc < 0)) {
				ep_fail(e, -ECONNRESET);
				break;
			}
		}
	}
	return work;
}

static int local_check(enum kvx_xport_opcode opc, const struct kvx_xport_op *o)
{
	const struct kvx_xport_mr *l = o->lmr;
	if (o->loff > l->len || o->len > l->len - o->loff)
		return -ERANGE;
	if (opc == KVX_XPORT_OP_READ && !(l->access & KVX_XPORT_ACCESS_LOCAL_WRITE))
		return -EACCES;
	return 0;
}

static int post_ops(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, const struct kvx_xport_op *ops,
		    uint32_t n, uint64_t cookie, const struct kvx_xport_cond *cond)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	if (KVX_UNLIKELY(e->op_head - e->op_tail + n > e->op_mask + 1 ||
			 e->b_head - e->b_tail > e->b_mask)) {
		xport_cnt_add(&ep->cnt, post_nobufs, 1);
		return -ENOBUFS;
	}
	int dead = atomic_load_explicit(&ep->status, memory_order_relaxed);
	struct tdev *d = ep_dev(e);
	uint32_t bi = e->b_head++;
	struct tcp_batch *b = &e->b[bi & e->b_mask];
	*b = (struct tcp_batch){.cookie = cookie, .n_ops = n, .left = n, .first_failed = n,
				.deadline_ns = kvx_now_ns() + e->timeout_ns};
	xport_cnt_add(&ep->cnt, ops_posted, n);
	for (uint32_t i = 0; i < n; i++) {
		const struct kvx_xport_op *x = &ops[i];
		struct tcp_op *o = &e->ops[e->op_head & e->op_mask];
		*o = (struct tcp_op){.laddr = x->lmr->addr + x->loff, .len = x->len, .roff = x->roff,
				     .left = x->len, .key = x->rmr->key, .batch = bi, .index = i,
				     .write = opc == KVX_XPORT_OP_WRITE,
				     .dev = x->lmr->mem_type != KVX_XPORT_MEM_HOST, .cond = cond != NULL};
		if (cond) {
			o->ckey = cond->rmr->key;
			o->coff = cond->roff;
			o->cexp = cond->expect;
		}
		e->op_head++;
		o->status = dead ? -ECONNRESET : local_check(opc, x);
		if (KVX_UNLIKELY(o->dev && !d && !o->status))
			o->status = -ENOTSUP; /* unreachable: registration attached the staging */
		if (o->status) {
			o->left = 0;
			o->sched = o->len;
			op_finish(e, o);
		}
	}
	if (!dead)
		drive(e, false);
	return 0;
}

int tcp_post(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, const struct kvx_xport_op *ops,
	     uint32_t n, uint64_t cookie)
{
	return post_ops(ep, opc, ops, n, cookie, NULL);
}

int tcp_post_cond(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, const struct kvx_xport_op *ops,
		  uint32_t n, uint64_t cookie, const struct kvx_xport_cond *cond)
{
	return post_ops(ep, opc, ops, n, cookie, cond);
}

int tcp_poll(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	drive(e, true);
	if (e->b_oldest != e->b_head) {
		/* Deadlines: the oldest incomplete batch has the earliest deadline. */
		struct tcp_batch *b = &e->b[e->b_oldest & e->b_mask];
		if (KVX_UNLIKELY(kvx_now_ns() >= b->deadline_ns))
			ep_fail(e, -ETIMEDOUT);
	}
	uint32_t got = 0;
	while (got < max && e->dq_tail != e->dq_head) {
		uint32_t bi = e->doneq[e->dq_tail & e->b_mask];
		struct tcp_batch *b = &e->b[bi & e->b_mask];
		cpl[got++] = (struct kvx_xport_cpl){.cookie = b->cookie, .status = b->status,
						    .n_ops = b->n_ops, .n_failed = b->n_failed,
						    .first_failed = b->first_failed, .bytes = b->bytes};
		b->freed = true;
		e->dq_tail++;
	}
	while (e->b_tail != e->b_head && e->b[e->b_tail & e->b_mask].freed)
		e->b_tail++;
	if (got)
		xport_cnt_add(&ep->cnt, batches_done, got);
	return (int)got;
}

/* Nothing to do until a socket edge or a post: no completion queued, no device copy running
 * (those finish without a socket event), no channel with work and its flag set. */
static bool ep_blocked(struct tcp_ep *e)
{
	struct tdev *d = ep_dev(e);
	if (e->dq_tail != e->dq_head || (d && d->copies))
		return false;
	for (uint32_t i = 0; i < e->nch; i++)
		if (ich_more(&e->ch[i]))
			return false;
	return true;
}

int tcp_ep_wait(struct kvx_xport_ep *ep, int timeout_ms)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	if (!ep_blocked(e))
		return 1;
	return ep_harvest(e, timeout_ms);
}

int tcp_ep_arm(struct kvx_xport_ep *ep, int epfd)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	if (epfd < 0) {
		if (e->armed >= 0)
			(void)epoll_ctl(e->armed, EPOLL_CTL_DEL, e->epfd, NULL);
		e->armed = -1;
		return 0;
	}
	if (!ep_blocked(e))
		return 0;
	if (e->armed != epfd) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = e};
		if (epoll_ctl(epfd, EPOLL_CTL_ADD, e->epfd, &ev) && errno != EEXIST)
			return -errno;
		e->armed = epfd;
	}
	return 1;
}
