/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_CTL_IMPL_H
#define KVX_CTL_IMPL_H
/*
 * The control lcore's private objects and the functions its files share (ctl.c lifecycle,
 * loop.c loop and ROUTER receive helpers, inbox.c inboxes, handshake.c handshakes, notify.c
 * notifications, smap.c string map). Only the control sources include this header.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <zmq.h>

#include "control_internal.h"
#include "kvxfer/lcore.h"

#define HS_MAX_RANKS 4096u
#define SCRATCH_REGIONS 4096u
#define SCRATCH_DESCS 4096u
#define NOTIFY_MAX_IDS (1u << 18)
#define RX_BATCH 64
#define INBOX_BATCH 32
#define MAX_POLL_MS 100
#define WORK_ROUNDS 8 /* busy loop rounds between two looks at the fds */
/* After on_notify ran, keep looking (inboxes, and the sockets by a poll without timeout, the
 * CPU yielded between looks) for this long before sleeping, at most once per sleep: the answer
 * an application thread sends right back is then taken without a wake-up of the control lcore
 * (kvxfer-perf notify, issue 16). 0 turns the window off. */
#define ANSWER_WAIT_NS 8000
/* ... only after the loop slept at least this long (a lone request, not a stream). */
#define ANSWER_IDLE_NS 20000
#define LIVE_MAX 65536u
#define WATCH_MAX KVX_CTL_WATCH_MAX

/* ---------------------------------------------------------------------------------------- */
/* A small chained string hash with an LRU list (terminal ids, DEALER cache, live pins).     */
/* ---------------------------------------------------------------------------------------- */

struct snode {
	struct snode *hnext;
	struct snode *prev, *next; /* LRU list: head = most recent */
	uint64_t h;
	char *key;
	void *val;
	uint64_t used_ns;
	uint32_t refs;
};

struct smap {
	struct snode **b;
	uint32_t nb; /* power of two */
	uint32_t count;
	struct snode *head, *tail;
};

int ctl_smap_init(struct smap *m, uint32_t nb);
struct snode *ctl_smap_find(struct smap *m, const char *key);
/* Move @p n to the LRU head (most recently used). */
void ctl_smap_touch(struct smap *m, struct snode *n);
/* Insert a copy of @p key (no duplicate check); NULL on -ENOMEM. */
struct snode *ctl_smap_add(struct smap *m, const char *key, void *val);
void ctl_smap_del(struct smap *m, struct snode *n);
/* Delete every node (calling @p free_val on its value when non-NULL) and the buckets. */
void ctl_smap_fini(struct smap *m, void (*free_val)(void *));

/* ---------------------------------------------------------------------------------------- */
/* Objects                                                                                   */
/* ---------------------------------------------------------------------------------------- */

enum slot_kind { SLOT_SEND = 1, SLOT_TERMINAL, SLOT_LIVE, SLOT_HANDSHAKE };

struct slot {
	enum slot_kind kind;
	uint8_t mtype; /* SLOT_SEND: enum kvx_msg_type of the notification, 0 = raw bytes */
	uint16_t port;
	char host[KVX_CTL_HOST_MAX + 1];
	char tid[KVX_MSG_ID_MAX + 1];
	uint8_t *data; /* inline_buf or a heap copy (large message) */
	size_t len;
	struct hs_job *job;
	uint8_t inline_buf[KVX_CTL_INLINE_BYTES];
};

struct kvx_ctl_inbox {
	struct kvx_ctl *ctl;
	struct kvx_ring *to_ctl; /* producer -> control: filled slots (SPSC) */
	struct kvx_ring *free;   /* control -> producer: empty slots (SPSC) */
	struct slot *slots;
	uint32_t nslots;
	uint32_t idx;
	_Atomic int closed;
};

struct rank_state {
	uint32_t dp_rank;
	char host[KVX_CTL_HOST_MAX + 1];
	uint16_t port;
	int status;
	const char *stage;
	struct kvx_msg_meta meta;
	struct kvx_msg_layers layers;
	uint8_t *blob_b;
	size_t blob_b_len;
	int have_meta, have_layers;
};

enum hs_phase { HS_META = 0, HS_LAYERS, HS_CONNECT, HS_DONE };

struct hs_job {
	struct kvx_ctl_hs_params p;
	char *host;
	char **hosts;
	char key[KVX_CTL_HOST_MAX + 16];
	uint32_t nranks;
	struct rank_state *r;
	uint32_t cur;
	enum hs_phase phase;
	void *sock;
	uint64_t start_ns, deadline_ns;
	struct kvx_timer timer;
	struct kvx_ctl *ctl;
	struct hs_job *next; /* queue / active list */
	int expired;
	int due; /* sent on a fresh socket: read it until EAGAIN before waiting on its fd */
};

struct peer_stat {
	char peer[64];
	_Atomic uint64_t rx, malformed, dropped, refused;
};

struct ctr {
	_Atomic uint64_t notify_rx, notify_tx, dropped_terminal, malformed, unknown_type, oversize,
		send_errors, inbox_full, hs_served, connect_served, hs_ok, hs_failed, heartbeats,
		peers_evicted, peers_open, watch_errors, auth_refused, auth_accepted;
	_Atomic uint64_t notify_rx_type[KVX_CTL_MSG_TYPES], notify_tx_type[KVX_CTL_MSG_TYPES];
	_Atomic uint64_t hs_lat[2][KVX_CTL_HS_NB + 1]; /* [ok, failed][bucket] */
	_Atomic uint64_t hs_lat_sum_ns[2];
};

/* One raw fd in the control lcore's poll set (kvx_ctl_watch_fd()). */
struct watch {
	int fd;
	void (*cb)(void *arg);
	void *arg;
	int suspended; /* reported an error/hang-up without data: no longer polled */
};

/*
 * Who writes what (the owning thread; "creator" = the thread that calls create/start/stop):
 * - p, host, bind_host, proxy, http, epoch, *_port_cfg, meta/layers buffers, thread,
 *   thread_started, stopped: the creator, before kvx_ctl_start() (set_local answers -EBUSY
 *   after); read-only while the loop runs.
 * - hs_port, nt_port, running, stop_req: the creator (atomics, read by any thread).
 * - zctx and the sockets: created by the creator in start, then used by the control lcore only
 *   (thread launch is the barrier); closed by the creator after stop joined the loop.
 * - timers, hb_timer, terminal, dealers, live, hs_* queues, ids, nmsg, scratch_*, txbuf, rl:
 *   the control lcore only while it runs.
 * - inboxes[]: published by kvx_ctl_inbox_open() (any thread, under inbox_mu, release), read
 *   by the control lcore (acquire), cleared under inbox_mu by whoever frees the inbox.
 * - watch[], nwatch, watch_applied, loop_live: under watch_mu; watch_gen: atomic.
 * - c (counters): atomics, mostly the control lcore; inbox_full by producers (slot_get).
 * - peers[], npeers: the control lcore (ctl_peer_of()); readers load npeers with acquire.
 * struct kvx_ctl_inbox: ring ends as documented there (to_ctl: producer -> control, free:
 * control -> producer); closed is set by the producer's thread, read by the control lcore.
 */
struct kvx_ctl {
	struct kvx_ctl_params p;
	char host[KVX_CTL_HOST_MAX + 1];
	char bind_host[KVX_CTL_HOST_MAX + 1];
	char proxy[KVX_CTL_HOST_MAX + 16];
	char http[KVX_MSG_NAME_MAX + 1];
	uint64_t epoch;
	uint16_t hs_port_cfg, nt_port_cfg;
	_Atomic uint32_t hs_port, nt_port;

	uint8_t *meta_buf, *layers_buf;
	size_t meta_len, layers_len;

	void *zctx, *hs_router, *nt_router, *hb_dealer;
	struct kvx_waiter waiter;
	int waiter_ok;
	struct kvx_timer_heap *timers;
	struct kvx_timer hb_timer;
	uint8_t hb_buf[2 * KVX_MSG_NAME_MAX + 128];
	size_t hb_len;

	pthread_t thread;
	int thread_started;
	_Atomic int running, stop_req;
	int stopped;

	pthread_mutex_t inbox_mu;
	struct kvx_ctl_inbox *_Atomic *inboxes;
	uint32_t ninbox;

	struct smap terminal, dealers, live;
	struct hs_job *hs_queue_head, *hs_queue_tail, *hs_active;
	uint32_t hs_nactive;

	uint32_t *ids;          /* NOTIFY_MAX_IDS scratch for decoding remote_blocks */
	struct kvx_msg_notify *nmsg;
	struct kvx_msg_region *scratch_regions;
	struct kvx_msg_memdesc *scratch_descs;
	uint8_t *txbuf;         /* KVX_MSG_HS_REPLY... connect request / reply scratch */

	/* Watched fds. The table and watch_applied/loop_live are guarded by watch_mu (slow path:
	 * registration, and the loop only when watch_gen moved). watch_gen is bumped (seq_cst)
	 * under watch_mu on every change, so the loop notices a change without the lock. */
	pthread_mutex_t watch_mu;
	pthread_cond_t watch_cv;
	struct watch watch[WATCH_MAX];
	uint32_t nwatch;
	_Atomic uint64_t watch_gen;
	uint64_t watch_applied; /* generation the loop runs with */
	int loop_live;          /* the loop is between its start and its exit */

	struct ctl_auth *auth; /* NULL = unauthenticated; set at create, read-only after */
	struct kvx_ratelimit rl;
	struct ctr c;
	struct peer_stat peers[KVX_CTL_PEER_STATS_MAX];
	_Atomic uint32_t npeers;
};

#define CINC(ctl, f) atomic_fetch_add_explicit(&(ctl)->c.f, 1, memory_order_relaxed)


/* ctl.c */
void ctl_warn_rl(struct kvx_ctl *ctl, const char *fmt, ...) KVX_PRINTF(2, 3);
struct peer_stat *ctl_peer_of(struct kvx_ctl *ctl, const char *addr);
void *ctl_dealer_new(struct kvx_ctl *ctl, int64_t maxmsg);

/* auth.c: CURVE keys, ZAP handler, refusal monitors (issue 17). load/free at create/destroy;
 * zap_bind, monitor and close by the creator in start/stop; the callbacks on the control lcore. */
struct ctl_auth;
int ctl_auth_load(struct kvx_ctl *ctl, const char *dir);
void ctl_auth_free(struct kvx_ctl *ctl);
int ctl_auth_on(const struct kvx_ctl *ctl);
int ctl_auth_server(struct kvx_ctl *ctl, void *sock);
int ctl_auth_client(struct kvx_ctl *ctl, void *sock, const char *host);
int ctl_auth_zap_bind(struct kvx_ctl *ctl);
int ctl_auth_monitor(struct kvx_ctl *ctl);
void ctl_auth_close(struct kvx_ctl *ctl);

/* loop.c (control lcore) */
void *ctl_loop(void *arg);
int ctl_router_next(struct kvx_ctl *ctl, void *sock, zmq_msg_t *id, zmq_msg_t *pl, int *nf,
		    const char **addr, struct peer_stat **ps);
void ctl_count_bad(struct kvx_ctl *ctl, struct peer_stat *ps, int rc);
void ctl_router_reply(void *sock, zmq_msg_t *id, const void *data, size_t len);

/* inbox.c */
void ctl_inbox_free(struct kvx_ctl_inbox *ib);
struct slot *ctl_slot_get(struct kvx_ctl_inbox *ib);
void ctl_slot_submit(struct kvx_ctl_inbox *ib, struct slot *s);
void ctl_slot_put_back(struct kvx_ctl_inbox *ib, struct slot *s);
unsigned ctl_inboxes_drain(struct kvx_ctl *ctl);
int ctl_inboxes_pending(struct kvx_ctl *ctl);

/* handshake.c (control lcore, except where noted) */
void ctl_job_cancel_unstarted(struct kvx_ctl *ctl, struct hs_job *j);
void ctl_job_finish(struct kvx_ctl *ctl, struct hs_job *j, int status, const char *stage);
void ctl_job_on_readable(struct kvx_ctl *ctl, struct hs_job *j);
void ctl_jobs_start_queued(struct kvx_ctl *ctl);
void ctl_job_enqueue(struct kvx_ctl *ctl, struct hs_job *j);
int ctl_hs_recv(struct kvx_ctl *ctl);

/* notify.c (control lcore) */
void ctl_notify_send(struct kvx_ctl *ctl, struct slot *s);
/* 1 when the caller is the loop thread of @p ctl (e.g. inside on_notify), else 0. */
int ctl_on_loop_thread(const struct kvx_ctl *ctl);
void ctl_terminal_add(struct kvx_ctl *ctl, const char *tid);
void ctl_live_add(struct kvx_ctl *ctl, const char *tid, const char *host, uint16_t port);
int ctl_notify_recv(struct kvx_ctl *ctl);

#endif /* KVX_CTL_IMPL_H */
