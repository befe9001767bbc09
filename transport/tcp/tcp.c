/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp provider: one-sided READ/WRITE emulated over TCP (DESIGN.md §3).
 *
 * Initiator: ops are split into chunks of at most chunk_bytes, striped round-robin over the
 * endpoint's channels (one TCP connection each), sent as request headers (+ WRITE payload)
 * with gathered sendmsg(), and answered in order per connection. All socket I/O happens in
 * post/poll on the owning poller; nothing blocks.
 *
 * Target: kvx_xport_progress() on the target's poller accepts data connections, matches
 * each to its endpoint by the token of blob B, and services requests straight from/into the
 * registered regions. Every request carries the whole op's range (not just its chunk), so the
 * bounds, key and access check covers the op: a violating op is refused by every one of its
 * chunks, WRITE payload is discarded, and the target memory is never touched.
 *
 * Wire format (little-endian):
 *   hello    24 B: "KXTH", version u8, 3 x 0, token u64, channel u16, nch u16, 0 u32
 *   request  40 B: op u8 (1 READ, 2 WRITE), 0 u8, 0 u16, key u32, op_roff u64, op_len u64,
 *                  chunk_off u64, chunk_len u32, seq u32   [+ chunk_len payload for WRITE]
 *   response 16 B: status i32 (0, -ERANGE, -EACCES), seq u32, len u32, 0 u32
 *                  [+ len payload for a successful READ]
 * A connection that violates the format is closed and counted in proto_errors.
 *
 * Device memory (HIP, or the hostdev mock: the same code, only the kvx_mem ops differ) is never
 * touched by the CPU or a socket call: it is staged through pinned bounce buffers of a
 * kvx_mem staging ring (struct tdev: one stream, a device->host ring and a host->device ring,
 * buffers of chunk_bytes). Each initiator endpoint has its own (its poller owns it), the
 * target side one per context (the progress thread owns it). Overlap:
 * - initiator WRITE: chunks are queued as D2H jobs; a chunk is sent once its bounce buffer is
 *   filled, while the next ones are being copied; the buffer returns when the chunk is sent.
 * - target READ response: the same, from the region into bounce buffers; a request longer than
 *   one buffer is answered as several pieces (one header, then the pieces in order).
 * - initiator READ response / target WRITE payload: received into a bounce buffer, then an
 *   H2D copy; the op (initiator) or the response (target) completes only when the copy did.
 * Copies are polled with event queries, never synchronized; an op that still has copies in
 * flight completes only after they finished, also when the endpoint fails, so no copy ever
 * touches memory its owner already got back.
 */
#include "transport_internal.h"

#include "mem_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define TCP_MAX_CH 64u
#define TCP_MAX_BATCH 4096u
#define TCP_MAX_OP (1ull << 34)
#define TCP_MAX_CHUNK (16u << 20)
#define TCP_HELLO 24u
#define TCP_REQ 40u
#define TCP_RESP 16u
#define TCP_CHQ 512u              /* chunks queued or in flight per channel */
#define TCP_WINDOW (8u << 20)     /* payload bytes in flight per channel */
#define TCP_RXBUF (64u << 10)
#define TCP_DIRECT (16u << 10)    /* payloads at least this long bypass the rx buffer */
#define TCP_IOV 64
#define TCP_TQ 256u               /* responses queued per target connection */
#define TCP_HELLO_SLOTS 64
#define TCP_CONN_BUDGET (8u << 20) /* bytes one target connection moves per progress call */
#define TCP_CONNECT_MS 5000
#define TCP_DEV_BUFS 4u           /* bounce buffers per staging direction */
#define TCP_DEV_JOBS 64u          /* D2H jobs queued per staging ring */

_Static_assert((int)KVX_XPORT_MEM_HIP == (int)KVX_MEM_HIP &&
		       (int)KVX_XPORT_MEM_HOSTDEV == (int)KVX_MEM_HOSTDEV,
	       "transport and mem kinds share values");

enum { REQ_READ = 1, REQ_WRITE = 2 };

struct tcp_slot {
	_Atomic uint32_t key;
	_Atomic uint32_t inflight; /* requests being serviced from this region (progress) */
	uint8_t *addr;
	uint64_t len;
	uint32_t access;
	bool dev;                  /* device memory: staged, never touched by the CPU */
};

/* Device staging of one poller: a stream and a ring per direction (see the file comment). */
struct tdev {
	struct kvx_mem_stream *s;
	struct kvx_mem_stage *tx; /* D2H: device -> bounce -> socket */
	struct kvx_mem_stage *rx; /* H2D: socket -> bounce -> device */
	size_t buf_bytes;
	uint32_t copies;          /* D2H jobs not handed out + H2D copies not retired */
};

struct hello_slot {
	int fd;
	uint32_t got;
	uint8_t buf[TCP_HELLO];
};

struct tcp_ep;

struct tcp_ctx {
	struct kvx_xport_ctx base;
	int lfd;
	int epfd;                  /* listener (level) + connections (edge): kvx_xport_ctx_wait */
	struct sockaddr_storage laddr;
	socklen_t laddr_len;
	struct tcp_slot *slots;    /* Array[max_regions] */
	uint16_t *gen;             /* Array[max_regions], control thread */
	bool *used;                /* Array[max_regions], control thread */
	struct hello_slot hello[TCP_HELLO_SLOTS];
	struct tcp_ep *served;     /* target endpoints owned by progress */
	pthread_mutex_t lock;      /* guards pending */
	struct tcp_ep *pending;    /* accepted, not yet picked up by progress */
	_Atomic int has_pending;
	uint32_t tick;             /* progress calls, paces accept4() */
	uint32_t n_hello;          /* hello slots in use */
	struct kvx_mem *dev;       /* device memory domain (first device region); control thread */
	_Atomic(struct tdev *) tdev; /* target-side staging: stored (release) before the first
	                                device slot's key is published; progress loads (acquire) */
};

struct tcp_mr {
	struct kvx_xport_mr base;
	uint32_t slot;
	bool closing;
};

/* ---- initiator state ---- */

struct tcp_op {
	uint8_t *laddr;
	uint64_t len, roff, sched, left;
	uint32_t key, batch, index;
	uint32_t copies;  /* staging copies still referring to this op (done waits for 0) */
	int32_t status;
	bool write, done, dev;
};

struct tcp_batch {
	uint64_t cookie, deadline_ns, bytes;
	uint32_t n_ops, left, n_failed, first_failed;
	int32_t status;
	bool done, freed;
};

struct tcp_chunk {
	uint8_t *payload; /* WRITE: source (device op: its bounce buffer); READ: destination */
	uint64_t off;
	uint32_t op, len, seq;
	uint32_t bslot;   /* WRITE of a device op: stage slot of the bounce buffer held */
	bool write;
	bool ready;       /* WRITE of a device op: false until the bounce buffer is filled */
	bool held;        /* holds a bounce buffer (released when sent) */
	bool dev;         /* READ into device memory: payload goes through a bounce buffer */
	uint8_t hdr[TCP_REQ];
};

struct ich {
	int fd;
	struct tcp_chunk *q; /* Array[TCP_CHQ]; tail <= sent <= head, free-running */
	uint32_t head, sent, tail, sent_off;
	uint64_t out_bytes;
	uint32_t seq;
	uint8_t *rx;         /* Array[TCP_RXBUF] */
	uint32_t rx_start, rx_end;
	bool in_pay;
	bool pay_dev;        /* the payload being received goes to a bounce buffer (pay_b) */
	uint32_t pay_left;
	uint8_t *pay_dst;
	struct kvx_mem_chunk pay_b;
};

/* ---- target state ---- */

struct tconn;

struct tresp {
	uint8_t hdr[TCP_RESP];
	uint8_t *payload;
	uint32_t len;
	int32_t slot;     /* region reference held until sent, or -1 */
	uint32_t hlen;    /* TCP_RESP, or 0 for a later piece of a staged READ response */
	bool ready;       /* staged entries: false until their copies are done */
	bool held;        /* holds a bounce buffer (D2H stage slot bslot) until sent */
	bool wdone;       /* staged WRITE: all payload received */
	bool rpiece;      /* a piece of a staged READ response (waits for its D2H copy) */
	uint32_t bslot;
	uint32_t pend;    /* staged WRITE: H2D copies not retired */
	uint32_t idx;     /* free-running tq index of this entry */
	struct tconn *t;  /* owner (staging cookies point at entries) */
};

enum { TC_HDR = 0, TC_WPAY = 1 };

struct tconn {
	int fd;
	uint8_t *rx; /* Array[TCP_RXBUF] */
	uint32_t rx_start, rx_end;
	int state;
	uint8_t *dst;   /* WRITE payload destination, NULL = discard */
	uint32_t pay_left, cur_seq, cur_len;
	int32_t cur_status, cur_slot;
	struct tresp *tq; /* Array[TCP_TQ] */
	uint32_t tq_head, tq_sent, tq_off;
	/* Staged WRITE payload into device memory. */
	struct tresp *wr;        /* its response entry, or NULL */
	uint8_t *wdev;           /* device destination of the next bounce buffer */
	bool wb_have;            /* wb is a bounce buffer being filled */
	struct kvx_mem_chunk wb;
	uint32_t wfill;          /* bytes in wb */
	uint32_t copies;         /* staging copies referring to this connection's entries */
	bool closed;             /* closed once: never attached again (cookies may point here) */
};

struct tcp_ep {
	struct kvx_xport_ep base;
	uint32_t nch;
	int epfd;                  /* initiator: channel sockets, edge-triggered */
	/* initiator */
	struct ich *ch;
	uint32_t rr;
	struct tcp_op *ops;        /* Array[depth]: tail <= sched <= head */
	uint32_t op_mask, op_head, op_tail, op_sched;
	struct tcp_batch *b;       /* Array[depth] */
	uint32_t b_mask, b_head, b_tail, b_oldest;
	uint32_t *doneq;           /* Array[depth]: completed batch indices */
	uint32_t dq_head, dq_tail;
	uint64_t timeout_ns;
	_Atomic(struct tdev *) dev; /* device staging; set on the control thread before the first
	                               device region or endpoint use (acquire in post/drive) */
	/* target */
	uint64_t token;
	struct tconn *conns;       /* Array[nch] */
	struct tcp_ep *pnext;      /* pending / served list */
	_Atomic int refs;
	_Atomic bool closing;
};

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

static void set_nodelay(int fd)
{
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int tcp_open_ctx(const struct kvx_xport_ctx_params *p, struct kvx_xport_ctx **out)
{
	const char *addr = p->tcp_addr ? p->tcp_addr : "127.0.0.1";
	struct tcp_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->lfd = -1;
	c->epfd = -1;
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
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = c->lfd};
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->epfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->lfd, &ev)) {
		rc = -errno;
		goto fail;
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
	*out = &c->base;
	return 0;
fail:
	if (c->lfd >= 0)
		close(c->lfd);
	if (c->epfd >= 0)
		close(c->epfd);
	free(c->slots);
	free(c->gen);
	free(c->used);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return rc;
}

/* ---- device staging ---- */

static void tdev_destroy(struct tdev *d)
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
		tdev_destroy(d);
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

/* First use of device memory of type t in this context: the domain, the target-side staging
 * and the staging of the initiator endpoints that exist already. */
static int ctx_dev_init(struct tcp_ctx *c, const struct kvx_mem_type *t)
{
	int rc = kvx_mem_domain_get(&c->dev, t, "tcp mr_register");
	if (!rc && !atomic_load_explicit(&c->tdev, memory_order_relaxed)) {
		struct tdev *d = NULL;
		rc = tdev_create(c->dev, c->base.params.chunk_bytes, &d);
		/* R3: pairs with A3 in ctx_tdev(). */
		if (!rc)
			atomic_store_explicit(&c->tdev, d, memory_order_release);
	}
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
	c->gen[s] = (uint16_t)(c->gen[s] + 1 ? c->gen[s] + 1 : 1);
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
	/* R1: publishes addr/len/access/dev (and c->tdev); pairs with the seq_cst key load in
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

static void ep_free(struct tcp_ep *e)
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
	tdev_destroy(atomic_load_explicit(&e->dev, memory_order_acquire));
	free(e->ch);
	free(e->conns);
	free(e->ops);
	free(e->b);
	free(e->doneq);
	free(e);
}

#define TCP_A_BYTES (XPORT_BLOB_HDR_BYTES + 8)
#define TCP_B_BYTES (XPORT_BLOB_HDR_BYTES + 32)

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
			ep_free(e);
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
	ep_free(e);
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
		e->conns[i].rx = malloc(TCP_RXBUF);
		e->conns[i].tq = calloc(TCP_TQ, sizeof(*e->conns[i].tq));
		if (!e->conns[i].rx || !e->conns[i].tq)
			goto nomem;
	}
	while (getrandom(&e->token, sizeof(e->token), 0) != sizeof(e->token))
		;
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
	ep_free(e);
	return -ENOMEM;
}

static int connect_one(const struct sockaddr_storage *ss, socklen_t sl, int *out)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	set_nodelay(fd);
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
	for (uint32_t i = 0; i < e->nch; i++) {
		int fd = -1;
		rc = connect_one(&ss, sl, &fd);
		uint8_t h[TCP_HELLO] = {'K', 'X', 'T', 'H', 1};
		xport_put_u64(h + 8, token);
		xport_put_u16(h + 16, (uint16_t)i);
		xport_put_u16(h + 18, (uint16_t)e->nch);
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
	}
	return 0;
}

static void tcp_ep_destroy(struct kvx_xport_ep *ep)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	if (ep->initiator) {
		ep_free(e);
		return;
	}
	/* Target side: the progress thread owns the connections; it stops serving the endpoint
	 * when it sees closing, and the last reference frees it. */
	atomic_store_explicit(&e->closing, true, memory_order_release);
	if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
		ep_free(e);
}

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

static inline struct tdev *ep_dev(struct tcp_ep *e)
{
	/* A2: pairs with R2 in ep_dev_attach(). */
	return atomic_load_explicit(&e->dev, memory_order_acquire);
}

/* A sent (or dropped) bounce buffer back to the D2H ring; *held is cleared. */
static void bounce_put(struct tdev *d, uint8_t *buf, uint32_t slot, bool *held)
{
	struct kvx_mem_chunk b = {.buf = buf, .slot = slot};
	(void)kvx_mem_stage_d2h_release(d->tx, &b);
	*held = false;
}

static void chunk_unhold(struct tdev *d, struct tcp_chunk *k)
{
	bounce_put(d, k->payload, k->bslot, &k->held);
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
		h[1] = 0;
		xport_put_u16(h + 2, 0);
		xport_put_u32(h + 4, o->key);
		xport_put_u64(h + 8, o->roff);
		xport_put_u64(h + 16, o->len);
		xport_put_u64(h + 24, o->sched);
		xport_put_u32(h + 32, len);
		xport_put_u32(h + 36, k->seq);
		c->head++;
		c->out_bytes += len;
		o->sched += len;
		work++;
	}
	return work;
}

/* One entry of a send queue as the gathered send sees it: header bytes, then payload bytes. */
struct txent {
	const uint8_t *hdr;
	uint32_t hlen;
	const uint8_t *pay;
	uint32_t plen;
};

/* Entries gathered per sendmsg() (each takes one or two iovecs). */
#define TCP_TXENT (TCP_IOV - 1)

/*
 * The partial-send step shared by the initiator's request channels and the target's response
 * connections: one gathered, non-blocking sendmsg() of the entries x[0..n) in order, the first
 * resumed *off bytes in. Returns how many entries went out completely (the caller retires them
 * in order) with *off the bytes sent of the next one, or -EAGAIN (socket full, nothing sent),
 * or -ECONNRESET.
 */
static int txv_send(int fd, const struct txent *x, uint32_t n, uint32_t *off)
{
	struct iovec iov[TCP_IOV];
	int v = 0;
	uint32_t o = *off, used = 0;
	for (; used < n && v < TCP_IOV - 1; used++) {
		if (o < x[used].hlen)
			iov[v++] = (struct iovec){(void *)(x[used].hdr + o), x[used].hlen - o};
		uint32_t po = o > x[used].hlen ? o - x[used].hlen : 0;
		if (x[used].plen)
			iov[v++] = (struct iovec){(void *)(x[used].pay + po), x[used].plen - po};
		o = 0;
	}
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)v};
	ssize_t s;
	do
		s = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (s < 0 && errno == EINTR);
	if (s < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -ECONNRESET;
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

static int ich_tx(struct tcp_ep *e, struct ich *c)
{
	struct txent x[TCP_TXENT];
	int work = 0;
	for (;;) {
		uint32_t n = 0;
		for (uint32_t i = c->sent; i != c->head && n < TCP_TXENT; i++) {
			const struct tcp_chunk *k = &c->q[i & (TCP_CHQ - 1)];
			if (!k->ready)
				break; /* its bounce buffer is still being filled: in order */
			x[n++] = (struct txent){k->hdr, TCP_REQ, k->payload, k->write ? k->len : 0};
		}
		if (!n)
			return work;
		int full = txv_send(c->fd, x, n, &c->sent_off);
		if (full < 0)
			return full == -EAGAIN ? work : full;
		work++;
		for (; full > 0; full--, c->sent++) {
			struct tcp_chunk *k = &c->q[c->sent & (TCP_CHQ - 1)];
			if (k->held)
				chunk_unhold(ep_dev(e), k);
		}
	}
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
				ssize_t n = recv(c->fd, c->pay_dst, c->pay_left, MSG_DONTWAIT);
				if (n > 0) {
					c->pay_dst += n;
					c->pay_left -= (uint32_t)n;
					continue;
				}
				if (n == 0)
					return -ECONNRESET;
				if (errno == EAGAIN || errno == EWOULDBLOCK)
					return work;
				if (errno == EINTR)
					continue;
				return -ECONNRESET;
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
			    (st != 0 && st != -ERANGE && st != -EACCES))
				return -EPROTO;
			if (want && k->dev) {
				/* Device destination: receive into a bounce buffer, then copy. */
				if (kvx_mem_stage_h2d_get(ep_dev(e)->rx, &c->pay_b))
					return work; /* all buffers busy: retry after pump() */
				c->pay_dev = true;
			}
			c->rx_start += TCP_RESP;
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
		/* Need more bytes in the rx buffer. */
		if (c->rx_start == c->rx_end) {
			c->rx_start = c->rx_end = 0;
		} else if (c->rx_start) {
			memmove(c->rx, c->rx + c->rx_start, c->rx_end - c->rx_start);
			c->rx_end -= c->rx_start;
			c->rx_start = 0;
		}
		ssize_t n = recv(c->fd, c->rx + c->rx_end, TCP_RXBUF - c->rx_end, MSG_DONTWAIT);
		if (n > 0) {
			c->rx_end += (uint32_t)n;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return work;
		if (errno == EINTR)
			continue;
		return -ECONNRESET;
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

static int drive(struct tcp_ep *e)
{
	struct tdev *d = ep_dev(e);
	int work = d && d->copies ? pump(e, d) : 0;
	if (atomic_load_explicit(&e->base.status, memory_order_relaxed))
		return work;
	work += fill(e);
	if (d && d->copies)
		work += pump(e, d);
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

static int tcp_post(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc,
		    const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie)
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
				     .dev = x->lmr->mem_type != KVX_XPORT_MEM_HOST};
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
		drive(e);
	return 0;
}

static int tcp_poll(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	drive(e);
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
	t->tq_head++;
	return r;
}

static inline struct tdev *ctx_tdev(struct tcp_ctx *c)
{
	/* A3: pairs with R3 in ctx_dev_init(). */
	return atomic_load_explicit(&c->tdev, memory_order_acquire);
}

static void resp_unhold(struct tdev *d, struct tresp *r)
{
	bounce_put(d, r->payload, r->bslot, &r->held);
}

/* READ from a device region: reserve one response entry per bounce-buffer piece and queue
 * the D2H job. -EAGAIN when entries or jobs are short (the request is retried later). */
static int read_stage(struct tcp_ctx *c, struct tconn *t, uint32_t seq, const uint8_t *src,
		      uint32_t clen, int32_t slot)
{
	struct tdev *d = ctx_tdev(c);
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
	struct tdev *d = ctx_tdev(c);
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
		if (!*budget)
			return 0;
		ssize_t n = recv(t->fd, (uint8_t *)t->wb.buf + t->wfill,
				 want < *budget ? want : *budget, MSG_DONTWAIT);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0
			       : errno == EINTR			      ? 1
								      : -ECONNRESET;
		got = (uint32_t)n;
		*budget -= got;
	}
	t->wfill += got;
	t->pay_left -= got;
	if (t->wfill < t->wb.len && t->pay_left)
		return 1;
	struct tresp *r = t->wr;
	if (KVX_UNLIKELY(kvx_mem_stage_h2d_commit(d->rx, &t->wb, t->wdev, t->wfill,
						  (uint64_t)(uintptr_t)r))) {
		(void)kvx_mem_stage_h2d_cancel(d->rx, &t->wb);
		t->wb_have = false;
		return -EIO;
	}
	t->wb_have = false;
	t->wdev += t->wfill;
	r->pend++;
	t->copies++;
	d->copies++;
	if (!t->pay_left) {
		xport_cnt_add(&c->base.cnt, bytes_served, t->cur_len);
		r->wdone = true;
		t->wr = NULL;
		t->state = TC_HDR;
	}
	return 1;
}

/* Target staging: hand filled buffers to their READ pieces, retire WRITE copies. Entries of a
 * closed connection only give back their buffers and region references. */
static int tpump(struct tcp_ctx *c, struct tdev *d)
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
		xport_cnt_add(&c->base.cnt, proto_errors, 1);
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
		xport_cnt_add(&c->base.cnt, proto_errors, 1);
	return work;
}

static int tconn_tx(struct tcp_ctx *c, struct tconn *t)
{
	struct txent x[TCP_TXENT];
	int work = 0;
	for (;;) {
		uint32_t n = 0;
		for (uint32_t i = t->tq_sent; i != t->tq_head && n < TCP_TXENT; i++) {
			const struct tresp *r = &t->tq[i & (TCP_TQ - 1)];
			if (!r->ready)
				break; /* staged: its copy has not finished; responses go in order */
			x[n++] = (struct txent){r->hdr, r->hlen, r->payload, r->len};
		}
		if (!n)
			return work;
		int full = txv_send(t->fd, x, n, &t->tq_off);
		if (full < 0)
			return full == -EAGAIN ? work : full;
		work++;
		for (; full > 0; full--, t->tq_sent++) {
			struct tresp *r = &t->tq[t->tq_sent & (TCP_TQ - 1)];
			slot_put(c, r->slot);
			r->slot = -1;
			if (r->held)
				resp_unhold(ctx_tdev(c), r);
		}
	}
}

static int tconn_req(struct tcp_ctx *c, struct tconn *t, const uint8_t *h)
{
	int op = h[0];
	uint32_t key = xport_get_u32(h + 4);
	uint64_t op_roff = xport_get_u64(h + 8), op_len = xport_get_u64(h + 16);
	uint64_t coff = xport_get_u64(h + 24);
	uint32_t clen = xport_get_u32(h + 32), seq = xport_get_u32(h + 36);
	if ((op != REQ_READ && op != REQ_WRITE) || h[1] || xport_get_u16(h + 2) || clen == 0 ||
	    clen > TCP_MAX_CHUNK || coff > op_len || clen > op_len - coff)
		return -EPROTO;
	uint8_t *addr = NULL;
	int32_t slot = -1;
	int32_t st = req_check(c, op, key, op_roff, op_len, &addr, &slot);
	bool dev = !st && c->slots[slot].dev;
	if (dev && op == REQ_READ) {
		int rc = read_stage(c, t, seq, addr + coff, clen, slot);
		if (rc) {
			slot_put(c, slot);
			return rc; /* -EAGAIN: the header stays in rx, retried later */
		}
	}
	if (st)
		xport_cnt_add(&c->base.cnt, reqs_rejected, 1);
	else
		xport_cnt_add(&c->base.cnt, reqs_served, 1);
	if (op == REQ_READ) {
		if (st)
			tq_push(t, st, seq, NULL, 0, -1);
		else if (!dev)
			tq_push(t, 0, seq, addr + coff, clen, slot);
		if (!st)
			xport_cnt_add(&c->base.cnt, bytes_served, clen);
		return 0;
	}
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
		xport_cnt_add(&c->base.cnt, bytes_served, t->cur_len);
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
				if (t->dst) {
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
			if (t->dst && t->pay_left >= TCP_DIRECT) {
				if (!budget)
					return work;
				uint32_t want = t->pay_left < budget ? t->pay_left : budget;
				ssize_t n = recv(t->fd, t->dst, want, MSG_DONTWAIT);
				if (n > 0) {
					t->dst += n;
					t->pay_left -= (uint32_t)n;
					budget -= (uint32_t)n;
					continue;
				}
				if (n == 0)
					return -ECONNRESET;
				if (errno == EAGAIN || errno == EWOULDBLOCK)
					return work;
				if (errno == EINTR)
					continue;
				return -ECONNRESET;
			}
		} else {
			if (t->tq_head - t->tq_sent >= TCP_TQ)
				return work; /* responses back up: stop reading requests */
			if (t->rx_end - t->rx_start >= TCP_REQ) {
				int rc = tconn_req(c, t, t->rx + t->rx_start);
				if (rc == -EAGAIN)
					return work; /* staging is full: retried after tpump() */
				if (rc)
					return rc;
				t->rx_start += TCP_REQ;
				work++;
				continue;
			}
		}
		if (t->rx_start == t->rx_end) {
			t->rx_start = t->rx_end = 0;
		} else if (t->rx_start) {
			memmove(t->rx, t->rx + t->rx_start, t->rx_end - t->rx_start);
			t->rx_end -= t->rx_start;
			t->rx_start = 0;
		}
		if (!budget)
			return work;
		ssize_t n = recv(t->fd, t->rx + t->rx_end, TCP_RXBUF - t->rx_end, MSG_DONTWAIT);
		if (n > 0) {
			t->rx_end += (uint32_t)n;
			budget = (uint32_t)n < budget ? budget - (uint32_t)n : 0;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return work;
		if (errno == EINTR)
			continue;
		return -ECONNRESET;
	}
}

static void tconn_close(struct tcp_ctx *c, struct tconn *t)
{
	struct tdev *d = ctx_tdev(c);
	if (t->closed)
		return;
	t->closed = true;
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
	if (t->state == TC_WPAY)
		slot_put(c, t->cur_slot);
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
		r->slot = -1;
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
		e->pnext = c->served;
		c->served = e;
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

static int hello_step(struct tcp_ctx *c, struct hello_slot *h)
{
	ssize_t n = recv(h->fd, h->buf + h->got, TCP_HELLO - h->got, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	if (n <= 0) {
		hello_close(c, h);
		return 1;
	}
	h->got += (uint32_t)n;
	if (h->got < TCP_HELLO)
		return 1;
	uint64_t token = xport_get_u64(h->buf + 8);
	uint16_t ch = xport_get_u16(h->buf + 16);
	struct tcp_ep *e = NULL;
	if (!memcmp(h->buf, "KXTH\x01\0\0\0", 8))
		for (e = c->served; e && e->token != token; e = e->pnext)
			;
	if (!e || atomic_load_explicit(&e->closing, memory_order_acquire) || ch >= e->nch ||
	    e->conns[ch].fd >= 0 || e->conns[ch].closed || xport_get_u16(h->buf + 18) != e->nch) {
		xport_cnt_add(&c->base.cnt, proto_errors, 1);
		hello_close(c, h);
		return 1;
	}
	/* Same fd, now also waiting for writability (READ responses to a slow reader). */
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET};
	(void)epoll_ctl(c->epfd, EPOLL_CTL_MOD, h->fd, &ev);
	e->conns[ch].fd = h->fd;
	c->n_hello--;
	h->fd = -1;
	h->got = 0;
	return 1;
}

static int tcp_progress(struct kvx_xport_ctx *ctx)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	struct tdev *d = ctx_tdev(c);
	int work = d && d->copies ? tpump(c, d) : 0;
	pick_pending(c);
	for (int i = 0; c->n_hello && i < TCP_HELLO_SLOTS; i++) {
		if (c->hello[i].fd >= 0)
			work += hello_step(c, &c->hello[i]);
	}
	/* Data connections are rare (one per channel per endpoint): look for them on every 16th
	 * call only, which keeps accept4() off most iterations of the poll loop. */
	bool look = (c->tick++ & 15) == 0;
	for (int i = 0; look && i < TCP_HELLO_SLOTS; i++) {
		if (c->hello[i].fd >= 0)
			continue;
		int fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			break;
		set_nodelay(fd);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
		(void)epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev);
		c->hello[i].fd = fd;
		c->hello[i].got = 0;
		c->n_hello++;
		work += 1 + hello_step(c, &c->hello[i]);
	}
	struct tcp_ep **pp = &c->served;
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
				ep_free(e);
			work++;
			continue;
		}
		for (uint32_t i = 0; i < e->nch; i++) {
			struct tconn *t = &e->conns[i];
			if (t->fd < 0)
				continue;
			int rc = tconn_rx(c, t);
			if (rc >= 0) {
				work += rc;
				rc = tconn_tx(c, t);
			}
			if (KVX_UNLIKELY(rc < 0)) {
				if (rc == -EPROTO)
					xport_cnt_add(&c->base.cnt, proto_errors, 1);
				tconn_close(c, t);
				work++;
				continue;
			}
			work += rc;
		}
		pp = &e->pnext;
	}
	if (d && d->copies) {
		work += tpump(c, d);
		if (d->copies && !work)
			work = 1; /* copies in flight: not idle (they finish without a socket event) */
	}
	return work;
}

static void tcp_close(struct kvx_xport_ctx *ctx)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	pick_pending(c);
	/* No progress thread runs now (kvx_xport_close contract): free what it owned. Buffers go
	 * back to the staging before it finishes its copies and is destroyed. */
	for (struct tcp_ep *e = c->served; e; e = e->pnext)
		for (uint32_t i = 0; i < e->nch; i++)
			tconn_close(c, &e->conns[i]);
	tdev_destroy(ctx_tdev(c));
	atomic_store_explicit(&c->tdev, NULL, memory_order_relaxed);
	while (c->served) {
		struct tcp_ep *e = c->served;
		c->served = e->pnext;
		if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
			ep_free(e);
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
	close(c->epfd);
	kvx_mem_close(c->dev);
	free(c->slots);
	free(c->gen);
	free(c->used);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Edge-triggered readiness is enough: an idle progress/poll pass has driven every socket it
 * needs to EAGAIN, so any later change produces a new edge. */
static int tcp_ctx_wait_fd(const struct kvx_xport_ctx *ctx)
{
	return ((const struct tcp_ctx *)ctx)->epfd;
}

static int epoll_block(int epfd, int timeout_ms)
{
	struct epoll_event ev[16];
	int n = epoll_wait(epfd, ev, 16, timeout_ms);
	return n > 0 ? 1 : 0;
}

static int tcp_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms)
{
	struct tcp_ctx *c = (struct tcp_ctx *)ctx;
	struct tdev *d = ctx_tdev(c);
	if (d && d->copies)
		return 1; /* staging copies finish without an fd event */
	return epoll_block(c->epfd, timeout_ms);
}

static int tcp_ep_wait(struct kvx_xport_ep *ep, int timeout_ms)
{
	struct tcp_ep *e = (struct tcp_ep *)ep;
	struct tdev *d = ep_dev(e);
	/* Device copies finish without a socket event: poll again instead of sleeping. */
	if (e->dq_tail != e->dq_head || (d && d->copies))
		return 1;
	return epoll_block(e->epfd, timeout_ms);
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
	.poll = tcp_poll,
	.progress = tcp_progress,
	.ctx_wait_fd = tcp_ctx_wait_fd,
	.ctx_wait = tcp_ctx_wait,
	.ep_wait = tcp_ep_wait,
	.ep_create_group = kvx_xport_any_group_ep_create,
	.ep_set_group = kvx_xport_record_ep_set_group,
	.ctx_event_fd = kvx_xport_enotsup_ctx_event_fd,
	.ctx_handle_events = kvx_xport_noop_handle_events,
};
