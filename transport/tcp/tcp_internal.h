/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TCP_INTERNAL_H
#define KVX_TCP_INTERNAL_H
/*
 * tcp provider: one-sided READ/WRITE emulated over TCP (docs/architecture.md §3). Private to transport/tcp:
 * tcp.c (setup, regions, endpoints, ops table), tcp_init.c (initiator), tcp_target.c (target).
 *
 * Initiator: ops are split into chunks of at most chunk_bytes, striped round-robin over the
 * endpoint's channels (one TCP connection each), sent as request headers (+ WRITE payload)
 * with gathered sendmsg(), and answered in order per connection. All socket I/O happens in
 * post/poll on the owning poller; nothing blocks.
 *
 * Readiness, both sides: every socket is in an epoll set edge-triggered, and each connection
 * keeps two flags, rd_ok and wr_ok: "may be readable/writable". An edge sets them; a recv() or
 * sendmsg() that would block, or that moved fewer bytes than asked (the socket is drained or
 * full, so its next change makes a new edge), clears them. A socket is called only when its
 * flag is set and it has something to send or a response/request to receive, so an idle or
 * blocked socket costs no syscall; one epoll_wait(0) per poll harvests the edges. A poller
 * whose sockets are all blocked sleeps on the epoll fd (kvx_xport_ep_arm(),
 * kvx_xport_ctx_wait_fd()).
 *
 * Target: kvx_xport_progress() (progress group 0) on the target's poller accepts data
 * connections, matches each to its endpoint by the token of blob B, and services requests
 * straight from/into the registered regions (its own group's endpoints; see progress groups
 * below for the others). Every request carries the whole op's range (not just its chunk), so the
 * bounds, key and access check covers the op: a violating op is refused by every one of its
 * chunks, WRITE payload is discarded, and the target memory is never touched.
 *
 * Progress groups (params.progress_groups, struct tgrp): the target's connections are served by
 * up to TCP_MAX_GRP threads, group g by kvx_xport_progress_group(ctx, g). A target endpoint's
 * group is its poll group (kvx_xport_ep_set_group()) mod the group count, 0 by default. Group 0 accepts, checks hellos and serves an endpoint until all
 * its channels are connected and none holds device staging state; then it takes the sockets
 * out of its epoll set and pushes the endpoint to the group's inbox (mutex + eventfd). The
 * group adds them to its own epoll set, raises their readiness flags and serves them from then
 * on, closing them itself when the endpoint is destroyed. Each group has its own counters
 * (summed by the readers) and its own device staging.
 *
 * Wire format (little-endian):
 *   hello    56 B: "KXTH", version u8 (2), 3 x 0, token u64, channel u16, nch u16, 0 u32,
 *                  proof [32]: crypto_auth (HMAC-SHA-512-256, libsodium) of the first 24
 *                  bytes keyed by the endpoint's random 32-byte secret from blob B (issue 17).
 *                  Until the proof verified the target reads nothing else from the
 *                  connection and serves no request; a wrong token or proof closes it
 *                  (auth_refused, logged rate limited). Each channel of an endpoint is
 *                  accepted once, so a replayed hello is refused too. Blob B travels in the
 *                  handshake, CURVE-protected with auth_dir. No round trip: ep_connect does
 *                  not wait for the target's progress thread.
 *   request  40 B: op u8 (1 READ, 2 WRITE), flags u8, 0 u16, key u32, op_roff u64, op_len u64,
 *                  chunk_off u64, chunk_len u32, seq u32
 *                  [+ 24 B condition when flags has REQF_COND: cond_key u32, 0 u32,
 *                   cond_off u64, expect u64]   [+ chunk_len payload for WRITE]
 *   response 16 B: status i32 (0, -ERANGE, -EACCES, -ESTALE), seq u32, len u32, 0 u32
 *                  [+ len payload for a successful READ]
 * Conditional requests (kvx_xport_post_bulk_cond(), the block leases of docs/protocol.md
 * §5.11): the target applies the chunk only while the 64-bit word at cond_off of its own
 * region cond_key (REMOTE_READ, host memory) equals expect. It loads the word (acquire) after
 * the request's checks and again before every recv()/memcpy() of WRITE payload into the region,
 * every H2D commit of a staged WRITE, and before a READ response's payload goes out (if no byte
 * of that entry was sent yet). A changed word: -ESTALE, the rest of the payload is discarded,
 * the READ response carries none. Only a copy that passed its check before the change still
 * lands (one recv()/memcpy() per connection, or staged H2D copies already committed); when the
 * word's owner runs on the progress thread itself (a kvxfer engine with one polling lcore),
 * nothing at all. A target older than the flag closes the connection (proto_errors).
 * A connection that violates the format is closed and counted in proto_errors.
 *
 * Device memory (HIP, or the hostdev mock: the same code, only the kvx_mem ops differ) is never
 * touched by the CPU or a socket call: it is staged through pinned bounce buffers of a
 * kvx_mem staging ring (struct tdev: one stream, a device->host ring and a host->device ring,
 * buffers of chunk_bytes). Each initiator endpoint has its own (its poller owns it), the
 * target side one per progress group in use (the group's thread owns it). Overlap:
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

#include <sodium.h>

#define TCP_MAX_CH 64u
#define TCP_MAX_BATCH 4096u
#define TCP_MAX_OP (1ull << 34)
#define TCP_MAX_CHUNK (16u << 20)
#define TCP_HELLO 24u
#define TCP_REQ 40u
#define TCP_COND 24u              /* condition after a request header with REQF_COND */
#define TCP_RESP 16u
#define TCP_CHQ 512u              /* chunks queued or in flight per channel */
#define TCP_WINDOW (8u << 20)     /* payload bytes in flight per channel */
#define TCP_RXBUF (64u << 10)
#define TCP_DIRECT (16u << 10)    /* payloads at least this long bypass the rx buffer; after
                                     such a payload the next header is read alone (at most
                                     TCP_REQ + TCP_COND bytes), so the payload behind it goes
                                     straight to its destination instead of through rx */
#define TCP_IOV 64
#define TCP_TQ 256u               /* responses queued per target connection */
#define TCP_HELLO_SLOTS 64
#define TCP_CONN_BUDGET (8u << 20) /* bytes one target connection moves per progress call */
#define TCP_CONNECT_MS 5000
#define TCP_DEV_BUFS 4u           /* bounce buffers per staging direction */
#define TCP_DEV_JOBS 64u          /* D2H jobs queued per staging ring */
#define TCP_EV_LISTEN 1u          /* epoll data of the target's listener ... */
#define TCP_EV_HELLO 2u           /* ... and of a connection before its hello; else a tconn * */
#define TCP_EV_WAKE 3u            /* ... and of a group's hand-off doorbell (g > 0) */
#define TCP_EVS 64                /* events harvested per epoll_wait() */
#define TCP_MAX_GRP 16u           /* progress groups (params.progress_groups) */

enum { REQ_READ = 1, REQ_WRITE = 2 };
enum { REQF_COND = 1 }; /* request flags (byte 1) */

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

#define TCP_PROOF 32u  /* crypto_auth_BYTES */
#define TCP_SECRET 32u /* crypto_auth_KEYBYTES */

struct hello_slot {
	int fd;
	uint32_t got;
	uint8_t buf[TCP_HELLO + TCP_PROOF];
};

struct tcp_ep;

/* One progress group: the target connections one thread serves (kvx_xport_progress_group();
 * group 0 is kvx_xport_progress()). Group 0 also owns the listener, the hellos and the control
 * thread's pending list. An endpoint's group is its poll group mod ngrp; group 0 checks its
 * hellos and serves its connections until all its channels are connected and none holds
 * device staging state, then hands it over through the group's inbox (grp_move()). Fields:
 * the group's thread, except inbox/lock (group 0 pushes, the group takes) and the setup-time
 * ones (epfd, efd, cnt, idx: written at open). */
struct tgrp {
	int epfd;                   /* connections, edge-triggered (group 0: also listener, hellos) */
	int efd;                    /* g > 0: eventfd in epfd (TCP_EV_WAKE), rung with the inbox */
	struct tcp_ep *served;      /* endpoints this group serves */
	pthread_mutex_t lock;       /* g > 0: guards inbox */
	struct tcp_ep *inbox;       /* g > 0: handed over by group 0, not yet taken */
	_Atomic int has_inbox;
	struct kvx_xport_cnt *cnt;  /* its counters: group 0 the context's, g > 0 gcnt[g - 1] */
	_Atomic(struct tdev *) tdev; /* device staging: stored (release) by the control thread
	                                before the first device slot's key is published; the
	                                group loads it (acquire) */
	uint32_t idx;
};

struct tcp_ctx {
	struct kvx_xport_ctx base;
	int lfd;
	struct sockaddr_storage laddr;
	socklen_t laddr_len;
	struct tcp_slot *slots;    /* Array[max_regions] */
	uint16_t *gen;             /* Array[max_regions], control thread */
	bool *used;                /* Array[max_regions], control thread */
	struct hello_slot hello[TCP_HELLO_SLOTS];
	pthread_mutex_t lock;      /* guards pending */
	struct tcp_ep *pending;    /* accepted, not yet picked up by group 0 */
	_Atomic int has_pending;
	bool acc;                  /* the listener may have connections to accept (edge seen) */
	uint32_t n_hello;          /* hello slots in use */
	struct kvx_ratelimit rl;   /* refusal logs; group 0 */
	struct kvx_mem *dev;       /* device memory domain (first device region); control thread */
	uint32_t ngrp;             /* progress groups, 1..TCP_MAX_GRP (set at open) */
	bool grp_used[TCP_MAX_GRP]; /* control thread: group 0, and each group given an endpoint
	                               (only those get device staging) */
	struct tgrp grp[TCP_MAX_GRP];
	struct kvx_xport_cnt gcnt[TCP_MAX_GRP - 1]; /* counters of groups 1.. (base.xcnt) */
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
	bool cond;        /* conditional (REQF_COND): ckey, coff, cexp */
	uint32_t ckey;
	uint64_t coff, cexp;
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
	uint8_t hdr[TCP_REQ + TCP_COND]; /* TCP_REQ bytes, + TCP_COND with REQF_COND */
};

struct ich {
	int fd;
	bool rd_ok, wr_ok;   /* readiness flags (file comment) */
	struct tcp_chunk *q; /* Array[TCP_CHQ]; tail <= sent <= head, free-running */
	uint32_t head, sent, tail, sent_off;
	uint64_t out_bytes;
	uint32_t seq;
	uint8_t *rx;         /* Array[TCP_RXBUF] */
	uint32_t rx_start, rx_end;
	bool big;            /* the last response had a payload of at least TCP_DIRECT, so the
	                        next header is read alone (TCP_DIRECT) */
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
	_Atomic uint64_t *cword; /* READ of a conditional request: its word (NULL: none) */
	uint64_t cexp;
	int32_t cslot;    /* reference on cword's region until sent, or -1 */
};

enum { TC_HDR = 0, TC_WPAY = 1 };

struct tconn {
	int fd;
	bool rd_ok, wr_ok; /* readiness flags (file comment) */
	uint8_t *rx; /* Array[TCP_RXBUF] */
	uint32_t rx_start, rx_end;
	bool big;       /* the last request carried a WRITE payload of at least TCP_DIRECT */
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
	struct tgrp *g;          /* the group serving it (set when its hello checks out, and
	                            again when the endpoint moves) */
	/* The WRITE being received, if conditional: its word, the expected value and the
	 * reference on the word's region (-1: none). */
	_Atomic uint64_t *cword;
	uint64_t cexp;
	int32_t cslot;
};

struct tcp_ep {
	struct kvx_xport_ep base;
	uint32_t nch;
	int epfd;                  /* initiator: channel sockets, edge-triggered */
	int armed;                 /* initiator: the poller epoll set epfd is in, or -1 */
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
	uint8_t secret[TCP_SECRET]; /* proof key (blob B); target: set at create; initiator: at connect */
	struct tconn *conns;       /* Array[nch] */
	struct tcp_ep *pnext;      /* pending / served / inbox list */
	_Atomic uint32_t grp;      /* target: its progress group, the poll group mod ngrp (control
	                              thread: tcp_ep_set_group(); group 0 reads it once) */
	_Atomic int refs;
	_Atomic bool closing;
};

static inline struct tdev *ep_dev(struct tcp_ep *e)
{
	/* A2: pairs with R2 in ep_dev_attach(). */
	return atomic_load_explicit(&e->dev, memory_order_acquire);
}

static inline struct tdev *grp_tdev(struct tgrp *g)
{
	/* A3: pairs with R3 in ctx_dev_init(). */
	return atomic_load_explicit(&g->tdev, memory_order_acquire);
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

/* tcp.c */
/* TCP_NODELAY, and the retransmission backoff capped at 1 s where the kernel allows it. */
void tcp_set_nodelay(int fd);
void tcp_ep_free(struct tcp_ep *e);
void tcp_grp_fini(struct tcp_ctx *c);
void tcp_tdev_destroy(struct tdev *d);
/* A sent (or dropped) bounce buffer back to the D2H ring; *held is cleared. */
void tcp_bounce_put(struct tdev *d, uint8_t *buf, uint32_t slot, bool *held);
int tcp_txv_send(int fd, const struct txent *x, uint32_t n, uint32_t *off, bool *wr,
		 struct kvx_xport_cnt *cnt);
int tcp_recv(int fd, void *buf, size_t len, bool *rd, struct kvx_xport_cnt *cnt);
int tcp_rx_fill(int fd, uint8_t *rx, uint32_t *start, uint32_t *end, uint32_t max, bool *rd,
		struct kvx_xport_cnt *cnt);

/* tcp_init.c (the endpoint's poller) */
int tcp_post(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, const struct kvx_xport_op *ops,
	     uint32_t n, uint64_t cookie);
int tcp_post_cond(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, const struct kvx_xport_op *ops,
		  uint32_t n, uint64_t cookie, const struct kvx_xport_cond *cond);
int tcp_poll(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max);
int tcp_ep_wait(struct kvx_xport_ep *ep, int timeout_ms);
int tcp_ep_arm(struct kvx_xport_ep *ep, int epfd);

/* tcp_target.c (each progress group's thread; close: no progress running) */
int tcp_progress(struct kvx_xport_ctx *ctx);
int tcp_progress_group(struct kvx_xport_ctx *ctx, uint32_t group);
void tcp_close(struct kvx_xport_ctx *ctx);
int tcp_ctx_wait_fd(const struct kvx_xport_ctx *ctx);
int tcp_group_wait_fd(const struct kvx_xport_ctx *ctx, uint32_t group);
int tcp_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms);

#endif /* KVX_TCP_INTERNAL_H */
