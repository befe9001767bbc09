/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp provider, shared part: context open, device staging setup, regions, endpoint
 * create/accept/connect/destroy (control thread), the gathered partial send and the bounce
 * buffer return used by both sides, and the ops table. The initiator's data path is in
 * tcp_init.c, the target's in tcp_target.c; the design and the wire format in tcp_internal.h.
 */
#include "tcp_internal.h"

#include <sys/eventfd.h>

_Static_assert((int)KVX_XPORT_MEM_HIP == (int)KVX_MEM_HIP &&
		       (int)KVX_XPORT_MEM_HOSTDEV == (int)KVX_MEM_HOSTDEV,
	       "transport and mem kinds share values");

/* ---------------------------------------------------------------------------------------- */

static int tcp_probe(char *reason, size_t cap)
{
	(void)reason;
	(void)cap;
	return 0;
}

static int parse_addr(const char *s, uint16_t port, struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, s, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons(port);
		*len = sizeof(*a4);
		return 0;
	}
	if (inet_pton(AF_INET6, s, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(port);
		*len = sizeof(*a6);
		return 0;
	}
	return -EINVAL;
}

/* Linux >= 6.15 (the kernel's value; Debian 12's headers predate it). */
#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44
#endif

void tcp_set_nodelay(int fd)
{
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/* Retransmissions (and zero-window / unsent-data probes) back off exponentially up to
	 * 120 s by default: after a partition of d seconds the next try can come about d seconds
	 * after the link returned, past the deadline of transfers that could have finished. Cap
	 * the backoff at the smallest value the kernel takes (1 s), so a transfer continues within
	 * about a second of the link's return (docs/architecture.md §3.2). Older kernels refuse
	 * the option (ENOPROTOOPT) and keep their default. */
	int rto_max_ms = 1000;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &rto_max_ms, sizeof(rto_max_ms));
}

/* Close the groups' fds and locks (open failure, tcp_close()). */
void tcp_grp_fini(struct tcp_ctx *c)
{
	for (uint32_t g = 0; g < TCP_MAX_GRP; g++) {
		if (c->grp[g].epfd >= 0)
			close(c->grp[g].epfd);
		if (c->grp[g].efd >= 0)
			close(c->grp[g].efd);
		c->grp[g].epfd = c->grp[g].efd = -1;
		pthread_mutex_destroy(&c->grp[g].lock);
	}
}

static int tcp_open_ctx(const struct kvx_xport_ctx_params *p, struct kvx_xport_ctx **out)
{
	const char *addr = p->tcp_addr ? p->tcp_addr : "127.0.0.1";
	struct tcp_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->lfd = -1;
	c->acc = true;
	c->ngrp = p->progress_groups ? p->progress_groups : 1;
	if (c->ngrp > TCP_MAX_GRP)
		c->ngrp = TCP_MAX_GRP;
	for (uint32_t g = 0; g < TCP_MAX_GRP; g++) {
		c->grp[g].epfd = c->grp[g].efd = -1;
		c->grp[g].idx = g;
		c->grp[g].cnt = g ? &c->gcnt[g - 1] : &c->base.cnt;
		pthread_mutex_init(&c->grp[g].lock, NULL);
	}
	c->grp_used[0] = true;
	c->base.xcnt = c->gcnt;
	c->base.n_xcnt = c->ngrp - 1;
	c->rl.interval_ns = 1000000000ull;
	if (sodium_init() < 0) {
		free(c);
		return -EIO;
	}
	for (int i = 0; i < TCP_HELLO_SLOTS; i++)
		c->hello[i].fd = -1;
	pthread_mutex_init(&c->lock, NULL);
	int rc = -ENOMEM;
	c->slots = calloc(p->max_regions, sizeof(*c->slots));
	c->gen = calloc(p->max_regions, sizeof(*c->gen));
	c->used = calloc(p->max_regions, sizeof(*c->used));
	if (!c->slots || !c->gen || !c->used)
		goto fail;
	if (parse_addr(addr, p->tcp_port, &c->laddr, &c->laddr_len)) {
		kvx_log(KVX_LOG_ERROR, "tcp: tcp_addr '%s' is not an IPv4/IPv6 literal", addr);
		rc = -EINVAL;
		goto fail;
	}
	c->lfd = socket(c->laddr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (c->lfd < 0 || setsockopt(c->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(c->lfd, (struct sockaddr *)&c->laddr, c->laddr_len) || listen(c->lfd, 256) ||
	    getsockname(c->lfd, (struct sockaddr *)&c->laddr, &c->laddr_len)) {
		rc = -errno;
		kvx_log(KVX_LOG_ERROR, "tcp: data listener on %s:%u: %s", addr, p->tcp_port,
			kvx_strerror(rc));
		goto fail;
	}
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = TCP_EV_LISTEN};
	c->grp[0].epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->grp[0].epfd < 0 || epoll_ctl(c->grp[0].epfd, EPOLL_CTL_ADD, c->lfd, &ev)) {
		rc = -errno;
		goto fail;
	}
	for (uint32_t g = 1; g < c->ngrp; g++) {
		struct tgrp *gr = &c->grp[g];
		struct epoll_event wev = {.events = EPOLLIN | EPOLLET, .data.u64 = TCP_EV_WAKE};
		gr->epfd = epoll_create1(EPOLL_CLOEXEC);
		gr->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (gr->epfd < 0 || gr->efd < 0 || epoll_ctl(gr->epfd, EPOLL_CTL_ADD, gr->efd, &wev)) {
			rc = -errno;
			goto fail;
		}
	}
	struct kvx_xport_caps *cp = &c->base.caps;
	cp->max_op_bytes = TCP_MAX_OP;
	cp->max_batch = p->queue_depth < TCP_MAX_BATCH ? p->queue_depth : TCP_MAX_BATCH;
	cp->inline_bytes = 0;
	cp->max_channels = TCP_MAX_CH;
	cp->num_channels = p->num_channels;
	cp->mem_types = kvx_mem_usable_kinds();
	cp->needs_progress = true;
	cp->same_host_only = false;
	cp->cond_ops = true;
	cp->progress_groups = c->ngrp;
	*out = &c->base;
	return 0;
fail:
	if (c->lfd >= 0)
		close(c->lfd);
	tcp_grp_fini(c);
	free(c->slots);
	free(c->gen);
	free(c->used);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return rc;
}

/* ---- device staging ---- */

void tcp_tdev_destroy(struct tdev *d)
{
	if (!d)
		return;
	/* Stage destroy finishes copies still in flight before freeing their buffers. */
	kvx_mem_stage_destroy(d->tx);
	kvx_mem_stage_destroy(d->rx);
	kvx_mem_stream_destroy(d->s);
	free(d);
}

static int tdev_create(struct kvx_mem *m, size_t buf_bytes, struct tdev **out)
{
	struct tdev *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	/* Every copy holds a bounce buffer, so the stream never has more than 2 * TCP_DEV_BUFS
	 * copies in flight: kvx_mem_copy_async() cannot say -ENOBUFS. */
	struct kvx_mem_stream_params sp = {.depth = 4 * TCP_DEV_BUFS};
	struct kvx_mem_stage_params stp = {.nbufs = TCP_DEV_BUFS, .buf_bytes = buf_bytes,
					   .jobs = TCP_DEV_JOBS};
	d->buf_bytes = buf_bytes;
	int rc = kvx_mem_stream_create(m, &sp, &d->s);
	if (!rc)
		rc = kvx_mem_stage_create(m, d->s, &stp, &d->tx);
	if (!rc)
		rc = kvx_mem_stage_create(m, d->s, &stp, &d->rx);
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "tcp: device staging (%u x %zu B bounce buffers): %s",
			2 * TCP_DEV_BUFS, buf_bytes, kvx_strerror(rc));
		tcp_tdev_destroy(d);
		return rc;
	}
	*out = d;
	return 0;
}

/* Give an initiator endpoint its staging (control thread; the context has a device domain). */
static int ep_dev_attach(struct tcp_ctx *c, struct tcp_ep *e)
{
	if (atomic_load_explicit(&e->dev, memory_order_relaxed))
		return 0;
	struct tdev *d = NULL;
	int rc = tdev_create(c->dev, c->base.params.chunk_bytes, &d);
	if (rc)
		return rc;
	/* R2: pairs with the acquire loads in tcp_post()/drive(). */
	atomic_store_explicit(&e->dev, d, memory_order_release);
	return 0;
}

/* Target-side staging of group g (control thread; the context has a device domain). Created
 * for group 0 and for each group given an endpoint, never for an unused one. */
static int grp_dev_attach(struct tcp_ctx *c, uint32_t g)
{
	if (atomic_load_explicit(&c->grp[g].tdev, memory_order_relaxed))
		return 0;
	struct tdev *d = NULL;
	int rc = tdev_create(c->dev, c->base.params.chunk_bytes, &d);
	/* R3: pairs with A3 in grp_tdev(). */
	if (!rc)
		atomic_store_explicit(&c->grp[g].tdev, d, memory_order_release);
	return rc;
}

/* First use of device memory of type t in this context: the domain, the target-side staging
 * of the groups in use and the staging of the initiator endpoints that exist already. */
static int ctx_dev_init(struct tcp_ctx *c, const struct kvx_mem_type *t)
{
	int rc = kvx_mem_domain_get(&c->dev, t, "tcp mr_register");
	for (uint32_t g = 0; !rc && g < c->ngrp; g++)
		if (c->grp_used[g])
			rc = grp_dev_attach(c, g);
	for (struct kvx_xport_ep *ep = c->base.eps; !rc && ep; ep = ep->next)
		if (ep->initiator)
			rc = ep_dev_attach(c, (struct tcp_ep *)ep);
	return rc;
}

/* ---- regions ---- */

static int tcp_mr_register(struct kvx_xport_ctx *ctx, const struct kvx_xport_mr_params *p,
			   struct kvx_xport_mr **out)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	uint32_t s = 0;
	while (s < ctx->params.max_regions && c->used[s])
		s++;
	if (s == ctx->params.max_regions)
		return -ENOBUFS;
	bool dev = p->mem_type != KVX_XPORT_MEM_HOST;
	if (dev) {
		struct kvx_mem_type t = {.kind = (enum kvx_mem_kind)p->mem_type,
					 .device = p->mem_type == KVX_XPORT_MEM_HIP ? p->device_id : 0};
		struct kvx_mem_ptr_info info;
		int rc = ctx_dev_init(c, &t);
		if (!rc)
			rc = kvx_mem_ptr_query(c->dev, p->addr, p->len_bytes, &info);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "tcp mr_register: %p (+%llu bytes) as mem_type %d: %s",
				p->addr, (unsigned long long)p->len_bytes, (int)p->mem_type,
				rc == -EINVAL ? "not device memory of that type" : kvx_strerror(rc));
			return rc;
		}
	}
	struct tcp_mr *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	c->used[s] = true;
	c->gen[s] = xport_key_gen(c->gen[s]); /* random, see xport_key_gen() */
	m->slot = s;
	m->base.ctx = ctx;
	m->base.addr = p->addr;
	m->base.len = p->len_bytes;
	m->base.access = p->access;
	m->base.mem_type = p->mem_type;
	m->base.device_id = p->device_id;
	m->base.key = ((uint32_t)c->gen[s] << 16) | s;
	c->slots[s].addr = p->addr;
	c->slots[s].len = p->len_bytes;
	c->slots[s].access = p->access;
	c->slots[s].dev = dev;
	/* R1: publishes addr/len/access/dev (and the groups' tdev); pairs with the seq_cst key load in
	 * req_check(). */
	atomic_store_explicit(&c->slots[s].key, m->base.key, memory_order_release);
	*out = &m->base;
	return 0;
}

static int tcp_mr_unregister(struct kvx_xport_mr *mr)
{
	struct tcp_ctx *c = (struct tcp_ctx *)mr->ctx;
	struct tcp_mr *m = (struct tcp_mr *)mr;
	struct tcp_slot *s = &c->slots[m->slot];
	/* D1/D2 (Dekker with req_check): clear the key, then look at the in-flight count; the
	 * progress side increments in-flight, then reads the key. Both seq_cst, so at least one
	 * side sees the other. */
	atomic_store_explicit(&s->key, 0, memory_order_seq_cst);
	m->closing = true;
	if (atomic_load_explicit(&s->inflight, memory_order_seq_cst))
		return -EBUSY;
	c->used[m->slot] = false;
	free(m);
	return 0;
}

/* The target stages its own device regions: any kind it could register is reachable. */
static int tcp_rmr_check(struct kvx_xport_ep *ep, const struct kvx_xport_rmr *rmr)
{
	(void)ep;
	return rmr->mem_type <= KVX_XPORT_MEM_HOSTDEV ? 0 : -ENOTSUP;
}

/* ---- endpoints ---- */

void tcp_ep_free(struct tcp_ep *e)
{
	if (e->ch) {
		for (uint32_t i = 0; i < e->nch; i++) {
			if (e->ch[i].fd >= 0)
				close(e->ch[i].fd);
			free(e->ch[i].q);
			free(e->ch[i].rx);
		}
	}
	if (e->conns) {
		for (uint32_t i = 0; i < e->nch; i++) {
			if (e->conns[i].fd >= 0)
				close(e->conns[i].fd);
			free(e->conns[i].rx);
			free(e->conns[i].tq);
		}
	}
	if (e->epfd >= 0)
		close(e->epfd);
	tcp_tdev_destroy(atomic_load_explicit(&e->dev, memory_order_acquire));
	free(e->ch);
	free(e->conns);
	free(e->ops);
	free(e->b);
	free(e->doneq);
	free(e);
}

#define TCP_A_BYTES (XPORT_BLOB_HDR_BYTES + 8)
#define TCP_B_BYTES (XPORT_BLOB_HDR_BYTES + 32 + TCP_SECRET)

static int tcp_ep_create(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, uint8_t *blob,
			 size_t cap, size_t *len)
{
	if (cap < TCP_A_BYTES)
		return -EMSGSIZE;
	struct tcp_ep *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	uint32_t depth = ctx->params.queue_depth;
	e->base.ctx = ctx;
	e->nch = ctx->params.num_channels;
	e->timeout_ns = ctx->params.op_timeout_ns;
	e->armed = -1;
	e->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (e->epfd < 0) {
		free(e);
		return -errno;
	}
	e->ch = calloc(e->nch, sizeof(*e->ch));
	e->ops = calloc(depth, sizeof(*e->ops));
	e->b = calloc(depth, sizeof(*e->b));
	e->doneq = calloc(depth, sizeof(*e->doneq));
	if (!e->ch || !e->ops || !e->b || !e->doneq)
		goto nomem;
	for (uint32_t i = 0; i < e->nch; i++) {
		e->ch[i].fd = -1;
		e->ch[i].q = calloc(TCP_CHQ, sizeof(*e->ch[i].q));
		e->ch[i].rx = malloc(TCP_RXBUF);
		if (!e->ch[i].q || !e->ch[i].rx)
			goto nomem;
	}
	e->op_mask = depth - 1;
	e->b_mask = depth - 1;
	if (((struct tcp_ctx *)ctx)->dev) {
		int rc = ep_dev_attach((struct tcp_ctx *)ctx, e);
		if (rc) {
			tcp_ep_free(e);
			return rc;
		}
	}
	xport_blob_hdr_put(blob, KVX_XPORT_PROV_TCP, XPORT_BLOB_A);
	xport_put_u16(blob + 8, (uint16_t)e->nch);
	xport_put_u16(blob + 10, 0);
	xport_put_u32(blob + 12, 0);
	*len = TCP_A_BYTES;
	*out = &e->base;
	return 0;
nomem:
	tcp_ep_free(e);
	return -ENOMEM;
}

static int tcp_ep_accept(struct kvx_xport_ctx *ctx, const uint8_t *a, size_t alen,
			 struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	int rc = xport_blob_hdr_check(a, alen, TCP_A_BYTES, KVX_XPORT_PROV_TCP, XPORT_BLOB_A,
				      "tcp accept");
	if (rc)
		return rc;
	if (cap < TCP_B_BYTES)
		return -EMSGSIZE;
	uint16_t nch = xport_get_u16(a + 8);
	if (nch == 0 || nch > TCP_MAX_CH || xport_get_u16(a + 10) || xport_get_u32(a + 12)) {
		kvx_log(KVX_LOG_WARN, "tcp accept: blob A rejected: channels=%u (1..%u) or reserved",
			nch, TCP_MAX_CH);
		return -EPROTO;
	}
	struct tcp_ep *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->epfd = -1;
	e->base.ctx = ctx;
	e->nch = nch;
	e->conns = calloc(nch, sizeof(*e->conns));
	if (!e->conns)
		goto nomem;
	for (uint32_t i = 0; i < nch; i++) {
		e->conns[i].fd = -1;
		e->conns[i].cur_slot = -1;
		e->conns[i].cslot = -1;
		e->conns[i].rx = malloc(TCP_RXBUF);
		e->conns[i].tq = calloc(TCP_TQ, sizeof(*e->conns[i].tq));
		if (!e->conns[i].rx || !e->conns[i].tq)
			goto nomem;
	}
	while (getrandom(&e->token, sizeof(e->token), 0) != sizeof(e->token))
		;
	randombytes_buf(e->secret, sizeof(e->secret));
	atomic_init(&e->refs, 2); /* control handle + progress list */
	xport_blob_hdr_put(blob, KVX_XPORT_PROV_TCP, XPORT_BLOB_B);
	memset(blob + 8, 0, 32);
	uint16_t port;
	if (c->laddr.ss_family == AF_INET) {
		struct sockaddr_in *a4 = (struct sockaddr_in *)&c->laddr;
		blob[8] = 4;
		memcpy(blob + 24, &a4->sin_addr, 4);
		port = ntohs(a4->sin_port);
	} else {
		struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&c->laddr;
		blob[8] = 6;
		memcpy(blob + 24, &a6->sin6_addr, 16);
		port = ntohs(a6->sin6_port);
	}
	xport_put_u16(blob + 10, port);
	xport_put_u16(blob + 12, nch);
	xport_put_u64(blob + 16, e->token);
	memcpy(blob + 40, e->secret, TCP_SECRET);
	*len = TCP_B_BYTES;
	pthread_mutex_lock(&c->lock);
	e->pnext = c->pending;
	c->pending = e;
	pthread_mutex_unlock(&c->lock);
	/* P1: pairs with the acquire load in pick_pending(). */
	atomic_store_explicit(&c->has_pending, 1, memory_order_release);
	*out = &e->base;
	return 0;
nomem:
	tcp_ep_free(e);
	return -ENOMEM;
}

static int connect_one(const struct sockaddr_storage *ss, socklen_t sl, int *out)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	tcp_set_nodelay(fd);
	if (connect(fd, (const struct sockaddr *)ss, sl) && errno != EINPROGRESS) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	int n;
	do
		n = poll(&p, 1, TCP_CONNECT_MS);
	while (n < 0 && errno == EINTR);
	int err = 0;
	socklen_t el = sizeof(err);
	if (n == 0)
		err = ETIMEDOUT;
	else if (n < 0)
		err = errno;
	else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el))
		err = errno;
	if (err) {
		close(fd);
		return -err;
	}
	*out = fd;
	return 0;
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
	uint64_t deadline = kvx_now_ns() + (uint64_t)TCP_CONNECT_MS * 1000000ull;
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		if (kvx_now_ns() > deadline)
			return -ETIMEDOUT;
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		(void)poll(&pf, 1, 100);
	}
	return 0;
}

static int tcp_ep_connect(struct kvx_xport_ep *ep, const uint8_t *b, size_t blen)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	int rc = xport_blob_hdr_check(b, blen, TCP_B_BYTES, KVX_XPORT_PROV_TCP, XPORT_BLOB_B,
				      "tcp connect");
	if (rc)
		return rc;
	uint16_t port = xport_get_u16(b + 10), nch = xport_get_u16(b + 12);
	if ((b[8] != 4 && b[8] != 6) || b[9] || port == 0 || nch != e->nch) {
		kvx_log(KVX_LOG_WARN, "tcp connect: blob B rejected: family=%u port=%u channels=%u "
			"(expected %u)", b[8], port, nch, e->nch);
		return -EPROTO;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	socklen_t sl;
	if (b[8] == 4) {
		struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
		a4->sin_family = AF_INET;
		a4->sin_port = htons(port);
		memcpy(&a4->sin_addr, b + 24, 4);
		sl = sizeof(*a4);
	} else {
		struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(port);
		memcpy(&a6->sin6_addr, b + 24, 16);
		sl = sizeof(*a6);
	}
	uint64_t token = xport_get_u64(b + 16);
	memcpy(e->secret, b + 40, TCP_SECRET);
	for (uint32_t i = 0; i < e->nch; i++) {
		int fd = -1;
		rc = connect_one(&ss, sl, &fd);
		uint8_t h[TCP_HELLO + TCP_PROOF] = {'K', 'X', 'T', 'H', 2};
		xport_put_u64(h + 8, token);
		xport_put_u16(h + 16, (uint16_t)i);
		xport_put_u16(h + 18, (uint16_t)e->nch);
		crypto_auth(h + TCP_HELLO, h, TCP_HELLO, e->secret);
		if (!rc)
			rc = send_all(fd, h, sizeof(h));
		if (rc) {
			char as[INET6_ADDRSTRLEN] = "?";
			inet_ntop(b[8] == 4 ? AF_INET : AF_INET6, b + 24, as, sizeof(as));
			kvx_log(KVX_LOG_ERROR, "tcp connect: channel %u to %s port %u: %s", i, as, port,
				kvx_strerror(rc));
			if (fd >= 0)
				close(fd);
			for (uint32_t j = 0; j < i; j++) {
				close(e->ch[j].fd);
				e->ch[j].fd = -1;
			}
			return rc;
		}
		struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.u32 = i};
		if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			rc = -errno;
			close(fd);
			for (uint32_t j = 0; j < i; j++) {
				close(e->ch[j].fd);
				e->ch[j].fd = -1;
			}
			return rc;
		}
		e->ch[i].fd = fd;
		e->ch[i].rd_ok = e->ch[i].wr_ok = true;
	}
	return 0;
}

/* Target endpoint: its connections are served by progress group (group mod ngrp), whose
 * device staging exists before the group can see the endpoint (so a group serving a device
 * region always has one). Group 0 reads the group once, when it hands the endpoint over
 * (grp_serve()); a later call changes nothing for an endpoint already handed over.
 * Initiator: recorded by the caller only. */
static int tcp_ep_set_group(struct kvx_xport_ep *ep, uint32_t group)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	if (ep->initiator)
		return 0;
	struct tcp_ctx *c = (struct tcp_ctx *)ep->ctx;
	uint32_t g = group % c->ngrp;
	if (c->dev) {
		int rc = grp_dev_attach(c, g);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "tcp: device staging for progress group %u: %s (the "
				"endpoint stays in group 0)", g, kvx_strerror(rc));
			return rc;
		}
	}
	c->grp_used[g] = true;
	/* G1: the staging above before the group; pairs with G2 in grp_serve(). */
	atomic_store_explicit(&e->grp, g, memory_order_release);
	return 0;
}

static void tcp_ep_destroy(struct kvx_xport_ep *ep)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	if (ep->initiator) {
		tcp_ep_free(e);
		return;
	}
	/* Target side: the serving group's thread owns the connections; it stops serving the endpoint
	 * when it sees closing, and the last reference frees it. */
	atomic_store_explicit(&e->closing, true, memory_order_release);
	if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
		tcp_ep_free(e);
}

/* ---- shared by the initiator and the target ---- */

/* A sent (or dropped) bounce buffer back to the D2H ring; *held is cleared. */
void tcp_bounce_put(struct tdev *d, uint8_t *buf, uint32_t slot, bool *held)
{
	struct kvx_mem_chunk b = {.buf = buf, .slot = slot};
	(void)kvx_mem_stage_d2h_release(d->tx, &b);
	*held = false;
}

/*
 * The partial-send step shared by the initiator's request channels and the target's response
 * connections: one gathered, non-blocking sendmsg() of the entries x[0..n) in order, the first
 * resumed *off bytes in. Returns how many entries went out completely (the caller retires them
 * in order) with *off the bytes sent of the next one, or -EAGAIN (socket full, nothing sent),
 * or -ECONNRESET. Clears *wr (the readiness flag) when the socket took less than offered.
 */
int tcp_txv_send(int fd, const struct txent *x, uint32_t n, uint32_t *off, bool *wr,
		 struct kvx_xport_cnt *cnt)
{
	struct iovec iov[TCP_IOV];
	int v = 0;
	uint32_t o = *off, used = 0;
	size_t offered = 0;
	for (; used < n && v < TCP_IOV - 1; used++) {
		if (o < x[used].hlen) {
			iov[v++] = (struct iovec){(void *)(x[used].hdr + o), x[used].hlen - o};
			offered += x[used].hlen - o;
		}
		uint32_t po = o > x[used].hlen ? o - x[used].hlen : 0;
		if (x[used].plen) {
			iov[v++] = (struct iovec){(void *)(x[used].pay + po), x[used].plen - po};
			offered += x[used].plen - po;
		}
		o = 0;
	}
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)v};
	ssize_t s;
	do
		s = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (s < 0 && errno == EINTR);
	xport_cnt_add(cnt, sock_calls, 1);
	if (s < 0) {
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -ECONNRESET;
		xport_cnt_add(cnt, sock_would_block, 1);
		*wr = false;
		return -EAGAIN;
	}
	if ((size_t)s < offered)
		*wr = false; /* full: the space ACKs free makes a new EPOLLOUT edge */
	size_t rem = (size_t)s;
	int full = 0;
	while (rem) {
		uint32_t left = x[full].hlen + x[full].plen - *off;
		if (rem < left) {
			*off += (uint32_t)rem;
			break;
		}
		rem -= left;
		*off = 0;
		full++;
	}
	return full;
}

/*
 * The receive step shared by both sides: one non-blocking recv() of at most @p len (> 0)
 * bytes. Returns the bytes received (> 0), 0 when the socket has none (*rd cleared), or
 * -ECONNRESET (end of stream or error). A short read clears *rd too: the socket is drained and
 * the next data to arrive makes a new edge. Counted in @p cnt (sock_calls, sock_would_block).
 */
int tcp_recv(int fd, void *buf, size_t len, bool *rd, struct kvx_xport_cnt *cnt)
{
	for (;;) {
		ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
		xport_cnt_add(cnt, sock_calls, 1);
		if (n > 0) {
			if ((size_t)n < len)
				*rd = false;
			return (int)n;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -ECONNRESET;
		xport_cnt_add(cnt, sock_would_block, 1);
		*rd = false;
		return 0;
	}
}

/*
 * The refill step of both sides' parsers: rx (Array[TCP_RXBUF]) holds unparsed bytes
 * [*start, *end); move them to the front, then, with *rd up, tcp_recv() at most @p max bytes
 * behind them. Returns the bytes received (> 0), 0 when nothing was (the flag is down, or
 * @p max is 0), or -ECONNRESET.
 */
int tcp_rx_fill(int fd, uint8_t *rx, uint32_t *start, uint32_t *end, uint32_t max, bool *rd,
		struct kvx_xport_cnt *cnt)
{
	if (*start == *end) {
		*start = *end = 0;
	} else if (*start) {
		memmove(rx, rx + *start, *end - *start);
		*end -= *start;
		*start = 0;
	}
	uint32_t room = TCP_RXBUF - *end < max ? TCP_RXBUF - *end : max;
	if (!*rd || !room)
		return 0;
	int n = tcp_recv(fd, rx + *end, room, rd, cnt);
	if (n > 0)
		*end += (uint32_t)n;
	return n;
}

const struct kvx_xport_ops kvx_xport_tcp_ops = {
	.name = "tcp",
	.id = KVX_XPORT_PROV_TCP,
	.probe = tcp_probe,
	.open = tcp_open_ctx,
	.close = tcp_close,
	.mr_register = tcp_mr_register,
	.mr_unregister = tcp_mr_unregister,
	.rmr_check = tcp_rmr_check,
	.ep_create = tcp_ep_create,
	.ep_accept = tcp_ep_accept,
	.ep_connect = tcp_ep_connect,
	.ep_destroy = tcp_ep_destroy,
	.post = tcp_post,
	.post_cond = tcp_post_cond,
	.poll = tcp_poll,
	.progress = tcp_progress,
	.progress_group = tcp_progress_group,
	.group_wait_fd = tcp_group_wait_fd,
	.ctx_wait_fd = tcp_ctx_wait_fd,
	.ctx_wait = tcp_ctx_wait,
	.ep_wait = tcp_ep_wait,
	.ep_arm = tcp_ep_arm,
	.ep_create_group = kvx_xport_any_group_ep_create,
	.ep_set_group = tcp_ep_set_group,
	.ctx_event_fd = kvx_xport_enotsup_ctx_event_fd,
	.ctx_handle_events = kvx_xport_noop_handle_events,
	.ep_reset = kvx_xport_enotsup_ep_reset,
	.ep_reaccept = kvx_xport_enotsup_ep_reaccept,
};

