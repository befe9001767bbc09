/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp provider, target side (kvx_xport_progress() and kvx_xport_progress_group() on the
 * target's pollers): group 0 accepts data connections, matches them to endpoints by token and
 * hands each endpoint to its progress group; every group services requests from/into the
 * registered regions, with device staging of READ responses and WRITE payloads; context close
 * (tcp_internal.h).
 */
#include "tcp_internal.h"

/* ---- target side (progress) ---- */

static void slot_put(struct tcp_ctx *c, int32_t slot)
{
	if (slot >= 0)
		atomic_fetch_sub_explicit(&c->slots[slot].inflight, 1, memory_order_release);
}

/* Validate a request against the region table; on success holds a reference on the slot. */
static int32_t req_check(struct tcp_ctx *c, int op, uint32_t key, uint64_t roff, uint64_t len,
			 uint8_t **addr, int32_t *slot_out)
{
	uint32_t slot = key & 0xffff;
	if (slot >= c->base.params.max_regions || key == 0)
		return -EACCES;
	struct tcp_slot *s = &c->slots[slot];
	/* D3/D4: see tcp_mr_unregister(). */
	atomic_fetch_add_explicit(&s->inflight, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&s->key, memory_order_seq_cst) != key) {
		slot_put(c, (int32_t)slot);
		return -EACCES;
	}
	int32_t st = 0;
	if (roff > s->len || len > s->len - roff)
		st = -ERANGE;
	else if (!(s->access &
		   (op == REQ_READ ? KVX_XPORT_ACCESS_REMOTE_READ : KVX_XPORT_ACCESS_REMOTE_WRITE)))
		st = -EACCES;
	if (st) {
		slot_put(c, (int32_t)slot);
		return st;
	}
	*addr = s->addr + roff;
	*slot_out = (int32_t)slot;
	return 0;
}

/* The condition of a REQF_COND request (header bytes 40..63): its word in a host region of this
 * target, with a reference on that region (*cslot) held until the request is done. */
static int32_t cond_get(struct tcp_ctx *c, const uint8_t *h, _Atomic uint64_t **word, uint64_t *expect,
			int32_t *cslot)
{
	uint64_t off = xport_get_u64(h + 48);
	uint8_t *addr = NULL;
	if (off & 7)
		return -ERANGE;
	int32_t st = req_check(c, REQ_READ, xport_get_u32(h + 40), off, 8, &addr, cslot);
	if (st)
		return st;
	if (c->slots[*cslot].dev || ((uintptr_t)addr & 7)) {
		slot_put(c, *cslot);
		*cslot = -1;
		return -EACCES;
	}
	*word = (_Atomic uint64_t *)(void *)addr;
	*expect = xport_get_u64(h + 56);
	return 0;
}

/* Whether a conditional request's word still holds its expected value. Checked before every copy
 * into or out of the region; the acquire keeps the copy after the load (the owner revokes with
 * a release store, runtime/lease.c R2). */
static bool cond_holds(_Atomic uint64_t *word, uint64_t expect)
{
	return atomic_load_explicit(word, memory_order_acquire) == expect;
}

/* The WRITE being received stops being conditional (done, or the connection closes). */
static void wcond_put(struct tcp_ctx *c, struct tconn *t)
{
	slot_put(c, t->cslot);
	t->cslot = -1;
	t->cword = NULL;
}

/* Check the condition of the WRITE being received before the next copy into the region: a changed
 * word stops it (-ESTALE, the rest of its payload is discarded). False once it stopped. */
static bool wcond_ok(struct tcp_ctx *c, struct tconn *t)
{
	if (!t->cword || cond_holds(t->cword, t->cexp))
		return true;
	wcond_put(c, t);
	t->cur_status = -ESTALE;
	t->dst = NULL;
	xport_cnt_add(t->g->cnt, reqs_rejected, 1);
	return false;
}

static struct tresp *tq_push(struct tconn *t, int32_t st, uint32_t seq, uint8_t *payload,
			     uint32_t len, int32_t slot)
{
	struct tresp *r = &t->tq[t->tq_head & (TCP_TQ - 1)];
	xport_put_u32(r->hdr, (uint32_t)st);
	xport_put_u32(r->hdr + 4, seq);
	xport_put_u32(r->hdr + 8, len);
	xport_put_u32(r->hdr + 12, 0);
	r->payload = payload;
	r->len = len;
	r->slot = slot;
	r->hlen = TCP_RESP;
	r->ready = true;
	r->held = false;
	r->wdone = false;
	r->rpiece = false;
	r->pend = 0;
	r->idx = t->tq_head;
	r->t = t;
	r->cword = NULL;
	r->cslot = -1;
	t->tq_head++;
	return r;
}

static void resp_unhold(struct tdev *d, struct tresp *r)
{
	tcp_bounce_put(d, r->payload, r->bslot, &r->held);
}

/* READ from a device region: reserve one response entry per bounce-buffer piece and queue
 * the D2H job. -EAGAIN when entries or jobs are short (the request is retried later). */
static int read_stage(struct tconn *t, uint32_t seq, const uint8_t *src,
		      uint32_t clen, int32_t slot)
{
	struct tdev *d = grp_tdev(t->g);
	uint32_t np = (uint32_t)((clen + d->buf_bytes - 1) / d->buf_bytes);
	if (t->tq_head - t->tq_sent + np > TCP_TQ)
		return -EAGAIN;
	struct tresp *r0 = &t->tq[t->tq_head & (TCP_TQ - 1)];
	if (kvx_mem_stage_d2h_push(d->tx, src, clen, (uint64_t)(uintptr_t)r0))
		return -EAGAIN;
	struct tresp *r = NULL;
	for (uint32_t i = 0; i < np; i++) {
		/* The header announces the whole length; pieces follow it back to back. */
		r = tq_push(t, 0, seq, NULL, clen, -1);
		r->len = 0;
		r->hlen = i ? 0 : TCP_RESP;
		r->ready = false;
		r->rpiece = true;
	}
	r->slot = slot; /* the region is needed until the last piece was copied */
	t->copies += np;
	d->copies += np;
	return 0;
}

/* Receive a staged WRITE's payload into bounce buffers and start their H2D copies.
 * 1 progressed, 0 blocked (no free buffer or no data yet), < 0 connection error. */
static int wdev_step(struct tcp_ctx *c, struct tconn *t, uint32_t *budget)
{
	struct tdev *d = grp_tdev(t->g);
	if (!t->wb_have) {
		if (kvx_mem_stage_h2d_get(d->rx, &t->wb))
			return 0; /* retried once pump() retired a copy */
		t->wb_have = true;
		t->wfill = 0;
	}
	uint32_t room = (uint32_t)t->wb.len - t->wfill;
	uint32_t want = room < t->pay_left ? room : t->pay_left;
	uint32_t avail = t->rx_end - t->rx_start, got;
	if (avail) {
		got = avail < want ? avail : want;
		memcpy((uint8_t *)t->wb.buf + t->wfill, t->rx + t->rx_start, got);
		t->rx_start += got;
	} else {
		if (!*budget || !t->rd_ok)
			return 0;
		int n = tcp_recv(t->fd, (uint8_t *)t->wb.buf + t->wfill,
				 want < *budget ? want : *budget, &t->rd_ok, t->g->cnt);
		if (n <= 0)
			return n;
		got = (uint32_t)n;
		*budget -= got;
	}
	t->wfill += got;
	t->pay_left -= got;
	if (t->wfill < t->wb.len && t->pay_left)
		return 1;
	struct tresp *r = t->wr;
	if (t->cur_status || !wcond_ok(c, t)) {
		/* Conditional and its word changed: this buffer and the rest are dropped. */
		(void)kvx_mem_stage_h2d_cancel(d->rx, &t->wb);
		xport_put_u32(r->hdr, (uint32_t)-ESTALE);
	} else {
		if (KVX_UNLIKELY(kvx_mem_stage_h2d_commit(d->rx, &t->wb, t->wdev, t->wfill,
							  (uint64_t)(uintptr_t)r))) {
			(void)kvx_mem_stage_h2d_cancel(d->rx, &t->wb);
			t->wb_have = false;
			return -EIO;
		}
		t->wdev += t->wfill;
		r->pend++;
		t->copies++;
		d->copies++;
	}
	t->wb_have = false;
	if (!t->pay_left) {
		if (!t->cur_status)
			xport_cnt_add(t->g->cnt, bytes_served, t->cur_len);
		wcond_put(c, t);
		r->wdone = true;
		if (!r->pend)
			r->ready = true; /* no copy left to retire it (all dropped) */
		t->wr = NULL;
		t->state = TC_HDR;
	}
	return 1;
}

/* Target staging: hand filled buffers to their READ pieces, retire WRITE copies. Entries of a
 * closed connection only give back their buffers and region references. */
static int tpump(struct tcp_ctx *c, struct tgrp *g, struct tdev *d)
{
	struct kvx_mem_chunk b;
	uint64_t ck;
	size_t len;
	int work = 0, rc;
	while ((rc = kvx_mem_stage_d2h_poll(d->tx, &b)) == 1) {
		struct tresp *r0 = (struct tresp *)(uintptr_t)b.cookie;
		struct tconn *t = r0->t;
		struct tresp *r = &t->tq[(r0->idx + (uint32_t)(b.job_off / d->buf_bytes)) &
					 (TCP_TQ - 1)];
		t->copies--;
		d->copies--;
		work++;
		if (t->closed) {
			(void)kvx_mem_stage_d2h_release(d->tx, &b);
			slot_put(c, r->slot);
			r->slot = -1;
			continue;
		}
		r->payload = b.buf;
		r->len = (uint32_t)b.len;
		r->bslot = b.slot;
		r->held = true;
		r->ready = true;
	}
	if (KVX_UNLIKELY(rc < 0))
		xport_cnt_add(g->cnt, proto_errors, 1);
	while ((rc = kvx_mem_stage_h2d_poll(d->rx, &ck, &len)) == 1) {
		struct tresp *r = (struct tresp *)(uintptr_t)ck;
		struct tconn *t = r->t;
		t->copies--;
		d->copies--;
		work++;
		if (--r->pend || !r->wdone)
			continue;
		if (t->closed) {
			slot_put(c, r->slot);
			r->slot = -1;
		} else {
			r->ready = true;
		}
	}
	if (KVX_UNLIKELY(rc < 0))
		xport_cnt_add(g->cnt, proto_errors, 1);
	return work;
}

static int tconn_tx(struct tcp_ctx *c, struct tconn *t)
{
	struct txent x[TCP_TXENT];
	int work = 0;
	while (t->wr_ok) {
		uint32_t n = 0;
		for (uint32_t i = t->tq_sent; i != t->tq_head && n < TCP_TXENT; i++) {
			struct tresp *r = &t->tq[i & (TCP_TQ - 1)];
			if (!r->ready)
				break; /* staged: its copy has not finished; responses go in order */
			if (r->cword && (i != t->tq_sent || !t->tq_off) && !cond_holds(r->cword, r->cexp)) {
				/* Conditional READ, nothing of it sent yet (checked again at every
				 * send attempt until its first byte went): its word changed, so an
				 * -ESTALE response without payload goes instead. */
				xport_put_u32(r->hdr, (uint32_t)-ESTALE);
				xport_put_u32(r->hdr + 8, 0);
				r->payload = NULL;
				r->len = 0;
				slot_put(c, r->slot);
				slot_put(c, r->cslot);
				r->slot = r->cslot = -1;
				r->cword = NULL;
				xport_cnt_add(t->g->cnt, reqs_rejected, 1);
			}
			x[n++] = (struct txent){r->hdr, r->hlen, r->payload, r->len};
		}
		if (!n)
			return work;
		int full = tcp_txv_send(t->fd, x, n, &t->tq_off, &t->wr_ok, t->g->cnt);
		if (full < 0)
			return full == -EAGAIN ? work : full;
		work++;
		for (; full > 0; full--, t->tq_sent++) {
			struct tresp *r = &t->tq[t->tq_sent & (TCP_TQ - 1)];
			slot_put(c, r->slot);
			slot_put(c, r->cslot);
			r->slot = r->cslot = -1;
			r->cword = NULL;
			if (r->held)
				resp_unhold(grp_tdev(t->g), r);
		}
	}
	return work;
}

static int tconn_req(struct tcp_ctx *c, struct tconn *t, const uint8_t *h)
{
	int op = h[0];
	uint32_t key = xport_get_u32(h + 4);
	uint64_t op_roff = xport_get_u64(h + 8), op_len = xport_get_u64(h + 16);
	uint64_t coff = xport_get_u64(h + 24);
	uint32_t clen = xport_get_u32(h + 32), seq = xport_get_u32(h + 36);
	if ((op != REQ_READ && op != REQ_WRITE) || (h[1] & ~REQF_COND) || xport_get_u16(h + 2) ||
	    clen == 0 || clen > TCP_MAX_CHUNK || coff > op_len || clen > op_len - coff ||
	    ((h[1] & REQF_COND) && xport_get_u32(h + 44)))
		return -EPROTO;
	uint8_t *addr = NULL;
	int32_t slot = -1, cslot = -1;
	_Atomic uint64_t *cword = NULL;
	uint64_t cexp = 0;
	int32_t st = req_check(c, op, key, op_roff, op_len, &addr, &slot);
	if (!st && (h[1] & REQF_COND)) {
		/* Conditional: refused (-ESTALE) unless the word holds now; checked again before
		 * each later copy (cond_holds()). */
		st = cond_get(c, h, &cword, &cexp, &cslot);
		if (!st && !cond_holds(cword, cexp))
			st = -ESTALE;
		if (st) {
			slot_put(c, slot);
			slot_put(c, cslot);
			slot = cslot = -1;
			cword = NULL;
		}
	}
	bool dev = !st && c->slots[slot].dev;
	if (KVX_UNLIKELY(dev && !grp_tdev(t->g))) {
		/* No staging in this group (tcp_ep_set_group() keeps endpoints out of a group whose
		 * staging could not be made, so this is a defence): refused, memory untouched. */
		slot_put(c, slot);
		slot_put(c, cslot);
		slot = cslot = -1;
		cword = NULL;
		st = -EACCES;
		dev = false;
	}
	if (dev && op == REQ_READ) {
		/* A staged READ: the condition held at the request (checked only there). */
		int rc = read_stage(t, seq, addr + coff, clen, slot);
		slot_put(c, cslot);
		cword = NULL;
		if (rc) {
			slot_put(c, slot);
			return rc; /* -EAGAIN: the header stays in rx, retried later */
		}
	}
	if (st)
		xport_cnt_add(t->g->cnt, reqs_rejected, 1);
	else
		xport_cnt_add(t->g->cnt, reqs_served, 1);
	t->big = op == REQ_WRITE && clen >= TCP_DIRECT;
	if (op == REQ_READ) {
		if (st) {
			tq_push(t, st, seq, NULL, 0, -1);
		} else if (!dev) {
			struct tresp *r = tq_push(t, 0, seq, addr + coff, clen, slot);
			r->cword = cword;
			r->cexp = cexp;
			r->cslot = cword ? cslot : -1;
		}
		if (!st)
			xport_cnt_add(t->g->cnt, bytes_served, clen);
		return 0;
	}
	t->cword = cword;
	t->cexp = cexp;
	t->cslot = cword ? cslot : -1;
	t->state = TC_WPAY;
	t->pay_left = clen;
	t->cur_len = clen;
	t->cur_seq = seq;
	t->cur_status = st;
	t->cur_slot = dev ? -1 : slot;
	t->dst = st || dev ? NULL : addr + coff; /* NULL: discard the payload, memory untouched */
	if (dev) {
		/* Device region: payload through bounce buffers; the response (holding the region)
		 * is reserved now and sent once every copy finished. */
		struct tresp *r = tq_push(t, 0, seq, NULL, 0, slot);
		r->ready = false;
		t->wr = r;
		t->wdev = addr + coff;
		t->wb_have = false;
	}
	return 0;
}

static void wpay_done(struct tcp_ctx *c, struct tconn *t)
{
	if (!t->cur_status)
		xport_cnt_add(t->g->cnt, bytes_served, t->cur_len);
	wcond_put(c, t);
	slot_put(c, t->cur_slot);
	t->cur_slot = -1;
	tq_push(t, t->cur_status, t->cur_seq, NULL, 0, -1);
	t->state = TC_HDR;
}

static int tconn_rx(struct tcp_ctx *c, struct tconn *t)
{
	int work = 0;
	uint32_t budget = TCP_CONN_BUDGET;
	for (;;) {
		if (t->state == TC_WPAY && t->wr) {
			int rc = wdev_step(c, t, &budget);
			if (rc <= 0)
				return rc < 0 ? rc : work;
			work++;
			continue;
		}
		if (t->state == TC_WPAY) {
			uint32_t avail = t->rx_end - t->rx_start;
			if (avail) {
				uint32_t n = avail < t->pay_left ? avail : t->pay_left;
				if (t->dst && wcond_ok(c, t)) {
					memcpy(t->dst, t->rx + t->rx_start, n);
					t->dst += n;
				}
				t->rx_start += n;
				t->pay_left -= n;
			}
			if (!t->pay_left) {
				wpay_done(c, t);
				work++;
				continue;
			}
			if (t->dst && t->pay_left >= TCP_DIRECT && wcond_ok(c, t)) {
				uint32_t want = t->pay_left < budget ? t->pay_left : budget;
				int n = budget && t->rd_ok
						? tcp_recv(t->fd, t->dst, want, &t->rd_ok, t->g->cnt)
						: 0;
				if (n <= 0)
					return n < 0 ? n : work;
				t->dst += n;
				t->pay_left -= (uint32_t)n;
				budget -= (uint32_t)n;
				continue;
			}
		} else {
			if (t->tq_head - t->tq_sent >= TCP_TQ)
				return work; /* responses back up: stop reading requests */
			uint32_t hl = TCP_REQ;
			if (t->rx_end - t->rx_start >= 2 && (t->rx[t->rx_start + 1] & REQF_COND))
				hl += TCP_COND;
			if (t->rx_end - t->rx_start >= hl) {
				int rc = tconn_req(c, t, t->rx + t->rx_start);
				if (rc == -EAGAIN)
					return work; /* staging is full: retried after tpump() */
				if (rc)
					return rc;
				t->rx_start += hl;
				work++;
				continue;
			}
		}
		/* A stream of large WRITEs: the next header alone (its payload then goes direct). */
		uint32_t max = t->state == TC_HDR && t->big ? TCP_REQ + TCP_COND : TCP_RXBUF;
		int n = tcp_rx_fill(t->fd, t->rx, &t->rx_start, &t->rx_end, budget ? max : 0,
				    &t->rd_ok, t->g->cnt);
		if (n <= 0)
			return n < 0 ? n : work;
		budget = (uint32_t)n < budget ? budget - (uint32_t)n : 0;
	}
}

static void tconn_close(struct tcp_ctx *c, struct tconn *t)
{
	struct tdev *d = t->g ? grp_tdev(t->g) : NULL;
	if (t->closed)
		return;
	t->closed = true;
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
	if (t->state == TC_WPAY) {
		slot_put(c, t->cur_slot);
		wcond_put(c, t);
	}
	t->cur_slot = -1;
	if (t->wb_have)
		(void)kvx_mem_stage_h2d_cancel(d->rx, &t->wb);
	t->wb_have = false;
	if (t->wr)
		t->wr->wdone = true; /* its last retired copy gives back the region */
	t->wr = NULL;
	for (uint32_t i = t->tq_sent; i != t->tq_head; i++) {
		struct tresp *r = &t->tq[i & (TCP_TQ - 1)];
		/* Entries whose copy is still running keep their region until tpump() sees it. */
		if (!r->ready && (r->rpiece || r->pend))
			continue;
		if (r->held)
			resp_unhold(d, r);
		slot_put(c, r->slot);
		slot_put(c, r->cslot);
		r->slot = r->cslot = -1;
		r->cword = NULL;
	}
	t->tq_head = t->tq_sent = t->tq_off = 0;
	t->rx_start = t->rx_end = 0;
	t->state = TC_HDR;
}

static void pick_pending(struct tcp_ctx *c)
{
	/* P2: pairs with P1 in tcp_ep_accept(). */
	if (!atomic_load_explicit(&c->has_pending, memory_order_acquire))
		return;
	pthread_mutex_lock(&c->lock);
	while (c->pending) {
		struct tcp_ep *e = c->pending;
		c->pending = e->pnext;
		e->pnext = c->grp[0].served;
		c->grp[0].served = e;
	}
	atomic_store_explicit(&c->has_pending, 0, memory_order_relaxed);
	pthread_mutex_unlock(&c->lock);
}

static void hello_close(struct tcp_ctx *c, struct hello_slot *h)
{
	c->n_hello--;
	close(h->fd);
	h->fd = -1;
	h->got = 0;
}

/* A connection that did not prove the endpoint's secret: counted, logged (rate limited, with
 * the peer's address), closed. Nothing it sent beyond the hello/proof was read. */
static void hello_refuse(struct tcp_ctx *c, struct hello_slot *h, const char *why)
{
	xport_cnt_add(&c->base.cnt, auth_refused, 1);
	uint64_t sup = 0;
	if (kvx_ratelimit_ok(&c->rl, &sup)) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		char as[INET6_ADDRSTRLEN + 8] = "?";
		if (!getpeername(h->fd, (struct sockaddr *)&ss, &sl)) {
			const void *a = ss.ss_family == AF_INET
						? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
						: (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
			inet_ntop(ss.ss_family, a, as, sizeof(as));
		}
		if (sup)
			kvx_log(KVX_LOG_WARN, "tcp: refused a data connection from %s: %s (%llu "
				"similar refusals suppressed)", as, why, (unsigned long long)sup);
		else
			kvx_log(KVX_LOG_WARN, "tcp: refused a data connection from %s: %s", as, why);
	}
	hello_close(c, h);
}

/* The served endpoint a hello names, or NULL when the hello is malformed or names none. */
static struct tcp_ep *hello_ep(struct tcp_ctx *c, const uint8_t *hb)
{
	if (memcmp(hb, "KXTH\x02\0\0\0", 8))
		return NULL;
	uint64_t token = xport_get_u64(hb + 8);
	uint16_t ch = xport_get_u16(hb + 16);
	struct tcp_ep *e;
	for (e = c->grp[0].served; e && e->token != token; e = e->pnext)
		;
	if (!e || atomic_load_explicit(&e->closing, memory_order_acquire) || ch >= e->nch ||
	    e->conns[ch].fd >= 0 || e->conns[ch].closed || xport_get_u16(hb + 18) != e->nch)
		return NULL;
	return e;
}

/* Hello: 24 B header + 32 B proof of the endpoint secret (tcp_internal.h). */
static int hello_step(struct tcp_ctx *c, struct hello_slot *h)
{
	const uint32_t want = TCP_HELLO + TCP_PROOF;
	ssize_t n = recv(h->fd, h->buf + h->got, want - h->got, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (n <= 0) {
		hello_close(c, h);
		return 1;
	}
	h->got += (uint32_t)n;
	if (h->got < want)
		return 1;
	struct tcp_ep *e = hello_ep(c, h->buf);
	if (!e) {
		/* The endpoint may have been accepted after this call's pick_pending() (the
		 * poller was preempted in between): look at the pending list once more. */
		pick_pending(c);
		e = hello_ep(c, h->buf);
	}
	if (!e) {
		xport_cnt_add(&c->base.cnt, proto_errors, 1);
		hello_refuse(c, h, "its hello names no endpoint of this target");
		return 1;
	}
	if (crypto_auth_verify(h->buf + TCP_HELLO, h->buf, TCP_HELLO, e->secret)) {
		hello_refuse(c, h, "wrong proof of the endpoint secret");
		return 1;
	}
	uint16_t ch = xport_get_u16(h->buf + 16);
	/* Same fd, now also waiting for writability (READ responses to a slow reader). */
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = &e->conns[ch]};
	(void)epoll_ctl(c->grp[0].epfd, EPOLL_CTL_MOD, h->fd, &ev);
	e->conns[ch].fd = h->fd;
	e->conns[ch].g = &c->grp[0];
	e->conns[ch].rd_ok = e->conns[ch].wr_ok = true; /* requests may have come with the hello */
	c->n_hello--;
	h->fd = -1;
	h->got = 0;
	return 1;
}

/* Readiness edges into the flags: group 0's listener, and each served connection's. Hello
 * slots are few and short-lived: every group 0 call tries them. */
static int grp_harvest(struct tcp_ctx *c, struct tgrp *g, int timeout_ms)
{
	struct epoll_event ev[TCP_EVS];
	int n = epoll_wait(g->epfd, ev, TCP_EVS, timeout_ms);
	for (int i = 0; i < n; i++) {
		if (ev[i].data.u64 == TCP_EV_LISTEN) {
			c->acc = true;
		} else if (ev[i].data.u64 == TCP_EV_WAKE) {
			uint64_t v;
			ssize_t r = read(g->efd, &v, sizeof(v)); /* grp_take() looks at the inbox next */
			(void)r;
		} else if (ev[i].data.u64 != TCP_EV_HELLO) {
			struct tconn *t = ev[i].data.ptr;
			if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				t->rd_ok = true;
			if (ev[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
				t->wr_ok = true;
		}
	}
	return n > 0 ? 1 : 0;
}

/* Whether group 0 may hand endpoint e to its group now: all channels connected and no
 * connection holding state of group 0's device staging (copies, bounce buffers). Host-memory
 * state (buffered bytes, a WRITE payload being received, queued responses) moves with it. */
static bool grp_movable(const struct tcp_ep *e)
{
	for (uint32_t i = 0; i < e->nch; i++) {
		const struct tconn *t = &e->conns[i];
		if (t->fd < 0 || t->copies || t->wb_have || t->wr)
			return false;
		for (uint32_t k = t->tq_sent; k != t->tq_head; k++) {
			const struct tresp *r = &t->tq[k & (TCP_TQ - 1)];
			if (r->held || !r->ready)
				return false;
		}
	}
	return true;
}

/* Group 0: hand e (unlinked from its served list) to group g, which serves it from then on.
 * Its sockets leave group 0's epoll set here and join g's when g takes them (grp_take()). */
static void grp_move(struct tcp_ctx *c, struct tcp_ep *e, struct tgrp *g)
{
	for (uint32_t i = 0; i < e->nch; i++)
		(void)epoll_ctl(c->grp[0].epfd, EPOLL_CTL_DEL, e->conns[i].fd, NULL);
	pthread_mutex_lock(&g->lock);
	e->pnext = g->inbox;
	g->inbox = e;
	pthread_mutex_unlock(&g->lock);
	/* H1: pairs with H2 in grp_take(). */
	atomic_store_explicit(&g->has_inbox, 1, memory_order_release);
	uint64_t one = 1;
	ssize_t r = write(g->efd, &one, sizeof(one));
	(void)r;
}

/* Group g > 0 (or tcp_close()): take the endpoints group 0 handed over. Their readiness flags
 * are raised (edges may have come while no epoll set held the sockets), so the first pass tries
 * each socket. The caller drained the doorbell before (grp_harvest()), so a hand-over after
 * this look rings it again and the group's wait fd wakes its thread. */
static int grp_take(struct tgrp *g)
{
	/* H2: pairs with H1 in grp_move(). */
	if (!atomic_load_explicit(&g->has_inbox, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&g->lock);
	struct tcp_ep *in = g->inbox;
	g->inbox = NULL;
	atomic_store_explicit(&g->has_inbox, 0, memory_order_relaxed);
	pthread_mutex_unlock(&g->lock);
	int n = 0;
	while (in) {
		struct tcp_ep *e = in;
		in = e->pnext;
		for (uint32_t i = 0; i < e->nch; i++) {
			struct tconn *t = &e->conns[i];
			struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = t};
			t->g = g;
			t->rd_ok = t->wr_ok = true;
			if (t->fd >= 0)
				(void)epoll_ctl(g->epfd, EPOLL_CTL_ADD, t->fd, &ev);
		}
		e->pnext = g->served;
		g->served = e;
		n++;
	}
	return n;
}

/* Serve group g's endpoints: close the destroyed ones, move requests and responses on the
 * others' connections; group 0 hands endpoints that belong to other groups over. */
static int grp_serve(struct tcp_ctx *c, struct tgrp *g)
{
	int work = 0;
	struct tcp_ep **pp = &g->served;
	while (*pp) {
		struct tcp_ep *e = *pp;
		if (KVX_UNLIKELY(atomic_load_explicit(&e->closing, memory_order_acquire))) {
			bool busy = false;
			for (uint32_t i = 0; i < e->nch; i++) {
				tconn_close(c, &e->conns[i]);
				busy |= e->conns[i].copies != 0;
			}
			if (busy) {
				/* Staging copies still point at its entries: free it after tpump(). */
				pp = &e->pnext;
				continue;
			}
			*pp = e->pnext;
			if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
				tcp_ep_free(e);
			work++;
			continue;
		}
		/* G2: pairs with G1 in tcp_ep_set_group(): the group's staging is visible. */
		uint32_t to = g->idx ? 0 : atomic_load_explicit(&e->grp, memory_order_acquire);
		if (to && grp_movable(e)) {
			*pp = e->pnext;
			grp_move(c, e, &c->grp[to]);
			work++;
			continue;
		}
		for (uint32_t i = 0; i < e->nch; i++) {
			struct tconn *t = &e->conns[i];
			/* Touched only with a flag up, or data already buffered to parse. */
			if (t->fd < 0 ||
			    (!t->rd_ok && t->rx_start == t->rx_end &&
			     (!t->wr_ok || t->tq_sent == t->tq_head)))
				continue;
			int rc = tconn_rx(c, t);
			if (rc >= 0) {
				work += rc;
				rc = tconn_tx(c, t);
			}
			if (KVX_UNLIKELY(rc < 0)) {
				if (rc == -EPROTO)
					xport_cnt_add(g->cnt, proto_errors, 1);
				tconn_close(c, t);
				work++;
				continue;
			}
			work += rc;
		}
		pp = &e->pnext;
	}
	return work;
}

/* Group 0's own work: the control thread's accepted endpoints, the listener and the hellos.
 * Harvests the group's readiness edges first (the listener's among them). */
static int grp0_accept(struct tcp_ctx *c, struct tgrp *g)
{
	int work = 0;
	pick_pending(c);
	grp_harvest(c, g, 0);
	for (int i = 0; c->n_hello && i < TCP_HELLO_SLOTS; i++) {
		if (c->hello[i].fd >= 0)
			work += hello_step(c, &c->hello[i]);
	}
	/* Accept while the listener's last edge has not been followed by an EAGAIN (and a hello
	 * slot is free: else the flag stays up and the next call tries again). */
	for (int i = 0; c->acc && i < TCP_HELLO_SLOTS; i++) {
		if (c->hello[i].fd >= 0)
			continue;
		int fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				c->acc = false;
			break;
		}
		tcp_set_nodelay(fd);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = TCP_EV_HELLO};
		(void)epoll_ctl(g->epfd, EPOLL_CTL_ADD, fd, &ev);
		c->hello[i].fd = fd;
		c->hello[i].got = 0;
		c->n_hello++;
		work += 1 + hello_step(c, &c->hello[i]);
	}
	return work;
}

/* One progress call of group g (kvx_xport_progress(): g = 0). */
static int grp_run(struct tcp_ctx *c, struct tgrp *g)
{
	struct tdev *d = grp_tdev(g);
	int work = d && d->copies ? tpump(c, g, d) : 0;
	if (g->idx == 0) {
		work += grp0_accept(c, g);
	} else {
		/* Doorbell drained before the inbox is looked at (grp_take()). A group that serves
		 * nothing and has nothing handed over skips the epoll_wait(): its doorbell has not
		 * been rung since it last drained it (a hand-over sets has_inbox before it rings). */
		if (g->served || atomic_load_explicit(&g->has_inbox, memory_order_relaxed))
			grp_harvest(c, g, 0);
		work += grp_take(g);
	}
	work += grp_serve(c, g);
	if (d && d->copies) {
		work += tpump(c, g, d);
		if (d->copies && !work)
			work = 1; /* copies in flight: not idle (they finish without a socket event) */
	}
	return work;
}

int tcp_progress(struct kvx_xport_ctx *ctx)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	return grp_run(c, &c->grp[0]);
}

int tcp_progress_group(struct kvx_xport_ctx *ctx, uint32_t group)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	return grp_run(c, &c->grp[group]);
}

void tcp_close(struct kvx_xport_ctx *ctx)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	pick_pending(c);
	for (uint32_t g = 1; g < c->ngrp; g++)
		(void)grp_take(&c->grp[g]);
	/* No progress thread runs now (kvx_xport_close contract): free what the groups owned.
	 * Buffers go back to the staging before it finishes its copies and is destroyed. */
	for (uint32_t g = 0; g < c->ngrp; g++)
		for (struct tcp_ep *e = c->grp[g].served; e; e = e->pnext)
			for (uint32_t i = 0; i < e->nch; i++)
				tconn_close(c, &e->conns[i]);
	for (uint32_t g = 0; g < c->ngrp; g++) {
		struct tgrp *gr = &c->grp[g];
		tcp_tdev_destroy(grp_tdev(gr));
		atomic_store_explicit(&gr->tdev, NULL, memory_order_relaxed);
		while (gr->served) {
			struct tcp_ep *e = gr->served;
			gr->served = e->pnext;
			if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
				tcp_ep_free(e);
		}
	}
	for (int i = 0; i < TCP_HELLO_SLOTS; i++)
		if (c->hello[i].fd >= 0)
			hello_close(c, &c->hello[i]);
	while (ctx->mrs) {
		struct kvx_xport_mr *mr = ctx->mrs;
		xport_mr_unlink(mr);
		free(mr);
	}
	if (c->lfd >= 0)
		close(c->lfd);
	tcp_grp_fini(c);
	kvx_mem_close(c->dev);
	free(c->slots);
	free(c->gen);
	free(c->used);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Edge-triggered readiness is enough: progress harvests the edges into flags and a socket's
 * flag drops only when it would block, so any later change produces a new edge. */
int tcp_ctx_wait_fd(const struct kvx_xport_ctx *ctx)
{
	return ((const struct tcp_ctx *)ctx)->grp[0].epfd;
}

int tcp_group_wait_fd(const struct kvx_xport_ctx *ctx, uint32_t group)
{
	return ((const struct tcp_ctx *)ctx)->grp[group].epfd;
}

int tcp_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	struct tdev *d = grp_tdev(&c->grp[0]);
	if (d && d->copies)
		return 1; /* staging copies finish without an fd event */
	return grp_harvest(c, &c->grp[0], timeout_ms);
}
