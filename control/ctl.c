/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control lcore: one poll loop (poll(2) over ZMQ_FDs, see ctl_loop()) over the handshake
 * ROUTER, the notify ROUTER, the DEALERs of running handshake jobs, the watched fds
 * (kvx_ctl_watch_fd()) and the waiter eventfd of the inboxes; notify DEALERs
 * (cached per peer path) and the heartbeat DEALER are send-only. DESIGN.md §1, §4;
 * PROTOCOL.md §2, §3; RUNTIME_GUIDE.md §5.2.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static uint64_t shash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static int smap_init(struct smap *m, uint32_t nb)
{
	memset(m, 0, sizeof(*m));
	m->b = calloc(nb, sizeof(*m->b));
	m->nb = nb;
	return m->b ? 0 : -ENOMEM;
}

static struct snode *smap_find(struct smap *m, const char *key)
{
	uint64_t h = shash(key);
	for (struct snode *n = m->b[h & (m->nb - 1)]; n; n = n->hnext)
		if (n->h == h && !strcmp(n->key, key))
			return n;
	return NULL;
}

static void lru_unlink(struct smap *m, struct snode *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		m->head = n->next;
	if (n->next)
		n->next->prev = n->prev;
	else
		m->tail = n->prev;
	n->prev = n->next = NULL;
}

static void lru_push(struct smap *m, struct snode *n)
{
	n->prev = NULL;
	n->next = m->head;
	if (m->head)
		m->head->prev = n;
	m->head = n;
	if (!m->tail)
		m->tail = n;
}

static void smap_touch(struct smap *m, struct snode *n)
{
	lru_unlink(m, n);
	lru_push(m, n);
}

static struct snode *smap_add(struct smap *m, const char *key, void *val)
{
	struct snode *n = calloc(1, sizeof(*n));
	if (!n || !(n->key = strdup(key))) {
		free(n);
		return NULL;
	}
	n->h = shash(key);
	n->val = val;
	struct snode **slot = &m->b[n->h & (m->nb - 1)];
	n->hnext = *slot;
	*slot = n;
	lru_push(m, n);
	m->count++;
	return n;
}

static void smap_del(struct smap *m, struct snode *n)
{
	struct snode **pp = &m->b[n->h & (m->nb - 1)];
	while (*pp != n)
		pp = &(*pp)->hnext;
	*pp = n->hnext;
	lru_unlink(m, n);
	m->count--;
	free(n->key);
	free(n);
}

static void smap_fini(struct smap *m, void (*free_val)(void *))
{
	while (m->head) {
		if (free_val)
			free_val(m->head->val);
		smap_del(m, m->head);
	}
	free(m->b);
	m->b = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Objects                                                                                   */
/* ---------------------------------------------------------------------------------------- */

enum slot_kind { SLOT_SEND = 1, SLOT_TERMINAL, SLOT_LIVE, SLOT_HANDSHAKE };

struct slot {
	enum slot_kind kind;
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
	_Atomic uint64_t rx, malformed, dropped;
};

struct ctr {
	_Atomic uint64_t notify_rx, notify_tx, dropped_terminal, malformed, unknown_type, oversize,
		send_errors, inbox_full, hs_served, connect_served, hs_ok, hs_failed, heartbeats,
		peers_evicted, peers_open, watch_errors;
};

/* One raw fd in the control lcore's poll set (kvx_ctl_watch_fd()). */
struct watch {
	int fd;
	void (*cb)(void *arg);
	void *arg;
	int suspended; /* reported an error/hang-up without data: no longer polled */
};

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

	struct kvx_ratelimit rl;
	struct ctr c;
	struct peer_stat peers[KVX_CTL_PEER_STATS_MAX];
	_Atomic uint32_t npeers;
};

#define CINC(ctl, f) atomic_fetch_add_explicit(&(ctl)->c.f, 1, memory_order_relaxed)

static void warn_rl(struct kvx_ctl *ctl, const char *fmt, ...) KVX_PRINTF(2, 3);
static void warn_rl(struct kvx_ctl *ctl, const char *fmt, ...)
{
	uint64_t sup = 0;
	if (!kvx_ratelimit_ok(&ctl->rl, &sup))
		return;
	char line[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (sup)
		kvx_log(KVX_LOG_WARN, "control: %s (%" PRIu64 " similar messages suppressed)", line,
			sup);
	else
		kvx_log(KVX_LOG_WARN, "control: %s", line);
}

static struct peer_stat *peer_of(struct kvx_ctl *ctl, const char *addr)
{
	if (!addr || !addr[0])
		addr = "unknown";
	uint32_t n = atomic_load_explicit(&ctl->npeers, memory_order_relaxed);
	for (uint32_t i = 0; i < n; i++)
		if (!strncmp(ctl->peers[i].peer, addr, sizeof(ctl->peers[i].peer) - 1))
			return &ctl->peers[i];
	if (n >= KVX_CTL_PEER_STATS_MAX - 1) {
		struct peer_stat *o = &ctl->peers[KVX_CTL_PEER_STATS_MAX - 1];
		if (n == KVX_CTL_PEER_STATS_MAX - 1) {
			snprintf(o->peer, sizeof(o->peer), "other");
			/* R1: publishes the name before readers see the entry (pairs with A1). */
			atomic_store_explicit(&ctl->npeers, n + 1, memory_order_release);
		}
		return o;
	}
	snprintf(ctl->peers[n].peer, sizeof(ctl->peers[n].peer), "%s", addr);
	atomic_store_explicit(&ctl->npeers, n + 1, memory_order_release); /* R1 */
	return &ctl->peers[n];
}

/* ---------------------------------------------------------------------------------------- */
/* Parameters and lifecycle                                                                  */
/* ---------------------------------------------------------------------------------------- */
/* Watched fds                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The control object whose loop runs on this thread (callbacks may unwatch without waiting). */
static _Thread_local struct kvx_ctl *t_ctl_self;

static int watch_find(const struct kvx_ctl *ctl, int fd)
{
	for (uint32_t i = 0; i < ctl->nwatch; i++)
		if (ctl->watch[i].fd == fd)
			return (int)i;
	return -1;
}

/* Caller holds watch_mu. */
static void watch_changed(struct kvx_ctl *ctl)
{
	atomic_fetch_add(&ctl->watch_gen, 1); /* seq_cst: pairs with the waiter re-check */
}

int kvx_ctl_watch_fd(struct kvx_ctl *ctl, int fd, void (*cb)(void *arg), void *arg)
{
	if (!ctl || !cb)
		return -EINVAL;
	if (fd < 0 || fcntl(fd, F_GETFD) < 0)
		return -EBADF;
	pthread_mutex_lock(&ctl->watch_mu);
	int rc = 0;
	if (watch_find(ctl, fd) >= 0) {
		rc = -EEXIST;
	} else if (ctl->nwatch == WATCH_MAX) {
		rc = -ENOSPC;
	} else {
		ctl->watch[ctl->nwatch++] = (struct watch){.fd = fd, .cb = cb, .arg = arg};
		watch_changed(ctl);
	}
	pthread_mutex_unlock(&ctl->watch_mu);
	if (!rc)
		kvx_waiter_wake(&ctl->waiter);
	return rc;
}

int kvx_ctl_unwatch_fd(struct kvx_ctl *ctl, int fd)
{
	if (!ctl)
		return -EINVAL;
	pthread_mutex_lock(&ctl->watch_mu);
	int i = watch_find(ctl, fd);
	if (i < 0) {
		pthread_mutex_unlock(&ctl->watch_mu);
		return -ENOENT;
	}
	ctl->watch[i] = ctl->watch[--ctl->nwatch];
	watch_changed(ctl);
	uint64_t gen = atomic_load(&ctl->watch_gen);
	if (t_ctl_self != ctl) {
		/* Another thread: return only once the loop runs without the entry, so the
		 * callback is neither running nor called again after this returns. */
		pthread_mutex_unlock(&ctl->watch_mu);
		kvx_waiter_wake(&ctl->waiter);
		pthread_mutex_lock(&ctl->watch_mu);
		while (ctl->loop_live && ctl->watch_applied < gen)
			pthread_cond_wait(&ctl->watch_cv, &ctl->watch_mu);
	}
	/* On the control thread the dispatch sees watch_gen move and skips stale entries. */
	pthread_mutex_unlock(&ctl->watch_mu);
	return 0;
}

/* Loop-local copy of the table, taken when watch_gen moved. */
struct watch_set {
	struct watch w[WATCH_MAX];
	uint32_t n;
	uint64_t gen;
};

static void watch_sync(struct kvx_ctl *ctl, struct watch_set *ws)
{
	pthread_mutex_lock(&ctl->watch_mu);
	ws->n = 0;
	for (uint32_t i = 0; i < ctl->nwatch; i++)
		if (!ctl->watch[i].suspended)
			ws->w[ws->n++] = ctl->watch[i];
	ws->gen = atomic_load(&ctl->watch_gen);
	ctl->watch_applied = ws->gen;
	pthread_cond_broadcast(&ctl->watch_cv);
	pthread_mutex_unlock(&ctl->watch_mu);
}

/* An fd that polls as error/hang-up without data would make every zmq_poll return at once:
 * stop polling it (the entry stays until kvx_ctl_unwatch_fd()) and say so. */
static void watch_suspend(struct kvx_ctl *ctl, int fd)
{
	pthread_mutex_lock(&ctl->watch_mu);
	int i = watch_find(ctl, fd);
	if (i >= 0 && !ctl->watch[i].suspended) {
		ctl->watch[i].suspended = 1;
		watch_changed(ctl);
	}
	pthread_mutex_unlock(&ctl->watch_mu);
	CINC(ctl, watch_errors);
	warn_rl(ctl, "watched fd %d reports an error or hang-up without data; no longer polled "
		     "(call kvx_ctl_unwatch_fd)", fd);
}

static void watch_loop_live(struct kvx_ctl *ctl, int live)
{
	pthread_mutex_lock(&ctl->watch_mu);
	ctl->loop_live = live;
	pthread_cond_broadcast(&ctl->watch_cv);
	pthread_mutex_unlock(&ctl->watch_mu);
}

/* ---------------------------------------------------------------------------------------- */

static int copy_str(char *dst, size_t cap, const char *src, const char *field)
{
	if (!src)
		src = "";
	if (strlen(src) >= cap) {
		kvx_log(KVX_LOG_ERROR, "control: parameter %s is too long (max %zu bytes)", field,
			cap - 1);
		return -EINVAL;
	}
	strcpy(dst, src);
	return 0;
}

static int bad(const char *what)
{
	kvx_log(KVX_LOG_ERROR, "control: invalid parameter: %s", what);
	return -EINVAL;
}

int kvx_ctl_create(const struct kvx_ctl_params *p, struct kvx_ctl **out)
{
	if (!p || !out)
		return -EINVAL;
	if (!p->host || !p->host[0])
		return bad("host is required");
	if (p->tp_size == 0 || p->dp_size == 0)
		return bad("tp_size and dp_size must be >= 1");
	if (p->tp_rank >= p->tp_size)
		return bad("tp_rank must be < tp_size");
	if (p->dp_rank >= p->dp_size)
		return bad("dp_rank must be < dp_size");
	if (p->inbox_slots && (p->inbox_slots & (p->inbox_slots - 1)))
		return bad("inbox_slots must be a power of two");
	if (p->role != KVX_CTL_ROLE_PRODUCER && p->role != KVX_CTL_ROLE_CONSUMER)
		return bad("role");
	if (p->transfer_mode != KVX_CTL_MODE_WRITE && p->transfer_mode != KVX_CTL_MODE_READ)
		return bad("transfer_mode");
	if (p->port_mode != KVX_CTL_PORT_INJECTIVE && p->port_mode != KVX_CTL_PORT_VLLM)
		return bad("port_mode");
	int has_proxy = p->proxy_address && p->proxy_address[0];
	if (has_proxy) {
		const char *c = strrchr(p->proxy_address, ':');
		char *end = NULL;
		long port = c ? strtol(c + 1, &end, 10) : 0;
		if (!c || c == p->proxy_address || !end || *end || port <= 0 || port > 65535)
			return bad("proxy_address must be \"ip:port\"");
		if (!p->http_address || !p->http_address[0])
			return bad("http_address is required with proxy_address");
	}
	struct kvx_ctl *ctl = calloc(1, sizeof(*ctl));
	if (!ctl)
		return -ENOMEM;
	ctl->p = *p;
	int rc = copy_str(ctl->host, sizeof(ctl->host), p->host, "host");
	rc = rc ? rc : copy_str(ctl->bind_host, sizeof(ctl->bind_host),
				p->bind_host ? p->bind_host : "*", "bind_host");
	rc = rc ? rc : copy_str(ctl->proxy, sizeof(ctl->proxy), has_proxy ? p->proxy_address : "",
				"proxy_address");
	rc = rc ? rc : copy_str(ctl->http, sizeof(ctl->http), p->http_address, "http_address");
	if (rc) {
		free(ctl);
		return rc;
	}
	ctl->p.host = ctl->host;
	ctl->p.bind_host = ctl->bind_host;
	ctl->p.proxy_address = ctl->proxy;
	ctl->p.http_address = ctl->http;
	if (!ctl->p.heartbeat_ms)
		ctl->p.heartbeat_ms = KVX_CTL_DEFAULT_HEARTBEAT_MS;
	if (!ctl->p.max_peers)
		ctl->p.max_peers = KVX_CTL_DEFAULT_MAX_PEERS;
	if (!ctl->p.max_active_handshakes)
		ctl->p.max_active_handshakes = 4;
	if (!ctl->p.max_inboxes)
		ctl->p.max_inboxes = 16;
	if (!ctl->p.inbox_slots)
		ctl->p.inbox_slots = 256;
	ctl->hs_port_cfg = p->handshake_base_port ? p->handshake_base_port
						  : KVX_CTL_DEFAULT_HANDSHAKE_PORT;
	ctl->nt_port_cfg = p->notify_base_port ? p->notify_base_port : KVX_CTL_DEFAULT_NOTIFY_PORT;
	ctl->epoch = p->epoch;
	if (!ctl->epoch) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ctl->epoch = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
			     ((uint64_t)getpid() << 40) ^ kvx_now_ns();
		ctl->epoch |= 1;
	}
	ctl->rl.interval_ns = 1000000000ull;
	pthread_mutex_init(&ctl->inbox_mu, NULL);
	pthread_mutex_init(&ctl->watch_mu, NULL);
	pthread_cond_init(&ctl->watch_cv, NULL);
	ctl->inboxes = calloc(ctl->p.max_inboxes, sizeof(*ctl->inboxes));
	ctl->ids = malloc(NOTIFY_MAX_IDS * sizeof(uint32_t));
	ctl->nmsg = malloc(sizeof(*ctl->nmsg));
	ctl->scratch_regions = malloc(SCRATCH_REGIONS * sizeof(*ctl->scratch_regions));
	ctl->scratch_descs = malloc(SCRATCH_DESCS * sizeof(*ctl->scratch_descs));
	ctl->txbuf = malloc(KVX_MSG_BLOB_MAX + 1024);
	if (!ctl->inboxes || !ctl->ids || !ctl->nmsg || !ctl->scratch_regions ||
	    !ctl->scratch_descs || !ctl->txbuf || smap_init(&ctl->terminal, 8192) ||
	    smap_init(&ctl->dealers, 1024) || smap_init(&ctl->live, 8192) ||
	    kvx_timer_heap_create(64, &ctl->timers)) {
		kvx_ctl_destroy(ctl);
		return -ENOMEM;
	}
	rc = kvx_waiter_init(&ctl->waiter);
	if (rc) {
		kvx_ctl_destroy(ctl);
		return rc;
	}
	ctl->waiter_ok = 1;
	*out = ctl;
	return 0;
}

int kvx_ctl_set_local(struct kvx_ctl *ctl, const struct kvx_msg_meta *meta,
		      const struct kvx_msg_layers *layers)
{
	if (!ctl || !meta || !layers)
		return -EINVAL;
	if (atomic_load(&ctl->running) || ctl->thread_started)
		return -EBUSY;
	struct kvx_msg_meta m = *meta;
	if (m.has_kvx && m.epoch == 0)
		m.epoch = ctl->epoch;
	size_t cap = 64 * 1024 + (size_t)m.num_regions * 40 + 4 * 1024;
	uint8_t *mb = malloc(cap);
	size_t lcap = 64 * 1024 + (size_t)layers->num_descs * (KVX_MSG_NAME_MAX + 96);
	uint8_t *lb = malloc(lcap);
	if (!mb || !lb) {
		free(mb);
		free(lb);
		return -ENOMEM;
	}
	int a = kvx_msg_meta_encode(&m, mb, cap);
	int b = kvx_msg_layers_encode(layers, lb, lcap);
	if (a < 0 || b < 0) {
		free(mb);
		free(lb);
		return a < 0 ? a : b;
	}
	free(ctl->meta_buf);
	free(ctl->layers_buf);
	ctl->meta_buf = mb;
	ctl->meta_len = (size_t)a;
	ctl->layers_buf = lb;
	ctl->layers_len = (size_t)b;
	return 0;
}

uint64_t kvx_ctl_epoch(const struct kvx_ctl *ctl)
{
	return ctl->epoch;
}

static void sock_common(void *s)
{
	int zero = 0;
	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
}

static void *dealer_new(struct kvx_ctl *ctl, int64_t maxmsg)
{
	void *s = zmq_socket(ctl->zctx, ZMQ_DEALER);
	if (!s)
		return NULL;
	int one = 1, idle = 30, intvl = 10, cnt = 3, hwm = 4096, ivl = 100, ivl_max = 2000;
	sock_common(s);
	zmq_setsockopt(s, ZMQ_TCP_KEEPALIVE, &one, sizeof(one));
	zmq_setsockopt(s, ZMQ_TCP_KEEPALIVE_IDLE, &idle, sizeof(idle));
	zmq_setsockopt(s, ZMQ_TCP_KEEPALIVE_INTVL, &intvl, sizeof(intvl));
	zmq_setsockopt(s, ZMQ_TCP_KEEPALIVE_CNT, &cnt, sizeof(cnt));
	zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
	zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max));
	zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	return s;
}

static int bind_router(struct kvx_ctl *ctl, void **out, uint16_t port, int64_t maxmsg,
		       _Atomic uint32_t *bound, const char *what)
{
	void *s = zmq_socket(ctl->zctx, ZMQ_ROUTER);
	if (!s)
		return -zmq_errno();
	sock_common(s);
	zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	char ep[KVX_CTL_HOST_MAX + 32];
	const char *h = ctl->bind_host;
	int v6 = strchr(h, ':') != NULL;
	if (v6) {
		int one = 1;
		zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof(one));
	}
	if (ctl->p.ephemeral_ports)
		snprintf(ep, sizeof(ep), v6 ? "tcp://[%s]:*" : "tcp://%s:*", h);
	else
		snprintf(ep, sizeof(ep), v6 ? "tcp://[%s]:%u" : "tcp://%s:%u", h, port);
	if (zmq_bind(s, ep)) {
		int e = zmq_errno();
		kvx_log(KVX_LOG_ERROR, "control: cannot bind the %s ROUTER on %s: %s", what, ep,
			zmq_strerror(e));
		zmq_close(s);
		return -e;
	}
	char last[KVX_CTL_HOST_MAX + 32];
	size_t ll = sizeof(last);
	zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &ll);
	const char *c = strrchr(last, ':');
	atomic_store(bound, c ? (uint32_t)atoi(c + 1) : port);
	*out = s;
	return 0;
}

static void *ctl_loop(void *arg);
static int ctl_loop_lcore(void *arg)
{
	ctl_loop(arg);
	return 0;
}

static void hb_fire(struct kvx_timer *t, void *arg);

int kvx_ctl_start(struct kvx_ctl *ctl)
{
	if (!ctl)
		return -EINVAL;
	if (ctl->thread_started || ctl->stopped)
		return -EBUSY;
	uint16_t hs, nt;
	uint32_t dp_local = kvx_ctl_fold_local_rank(ctl->p.dp_rank, ctl->p.dp_size_local);
	int rc = kvx_ctl_port(ctl->p.port_mode, ctl->hs_port_cfg, dp_local, ctl->p.tp_rank,
			      ctl->p.tp_size, &hs);
	rc = rc ? rc : kvx_ctl_port(ctl->p.port_mode, ctl->nt_port_cfg, dp_local, ctl->p.tp_rank,
				    ctl->p.tp_size, &nt);
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "control: port arithmetic overflows 65535 (base %u/%u)",
			ctl->hs_port_cfg, ctl->nt_port_cfg);
		return rc;
	}
	ctl->zctx = zmq_ctx_new();
	if (!ctl->zctx)
		return -ENOMEM;
	rc = bind_router(ctl, &ctl->hs_router, hs, KVX_MSG_HS_REQ_MAX_BYTES, &ctl->hs_port,
			 "handshake");
	rc = rc ? rc : bind_router(ctl, &ctl->nt_router, nt, KVX_MSG_NOTIFY_MAX_BYTES,
				   &ctl->nt_port, "notify");
	if (!rc && ctl->proxy[0] && ctl->p.global_rank == 0) {
		struct kvx_msg_heartbeat h = {.role = ctl->p.role,
					      .dp_size = ctl->p.dp_size,
					      .tp_size = ctl->p.tp_size,
					      .mode = ctl->p.transfer_mode};
		struct kvx_ctl_addr a = {.handshake_port = ctl->hs_port_cfg,
					 .notify_port = (uint16_t)atomic_load(&ctl->nt_port)};
		snprintf(a.host, sizeof(a.host), "%s", ctl->host);
		snprintf(h.http_address, sizeof(h.http_address), "%s", ctl->http);
		int n = kvx_ctl_zmq_address_format(&a, h.zmq_address, sizeof(h.zmq_address));
		n = n < 0 ? n : kvx_msg_heartbeat_encode(&h, ctl->hb_buf, sizeof(ctl->hb_buf));
		char ep[KVX_CTL_HOST_MAX + 32];
		const char *c = strrchr(ctl->proxy, ':');
		int hl = (int)(c - ctl->proxy);
		int v6 = memchr(ctl->proxy, ':', (size_t)hl) != NULL && ctl->proxy[0] != '[';
		snprintf(ep, sizeof(ep), v6 ? "tcp://[%.*s]:%s" : "tcp://%.*s:%s", hl, ctl->proxy,
			 c + 1);
		ctl->hb_dealer = n < 0 ? NULL : dealer_new(ctl, 4096);
		if (n < 0 || !ctl->hb_dealer || zmq_connect(ctl->hb_dealer, ep)) {
			kvx_log(KVX_LOG_ERROR, "control: cannot set up the proxy heartbeat to %s", ep);
			rc = n < 0 ? n : -EINVAL;
		} else {
			int hwm = 16;
			zmq_setsockopt(ctl->hb_dealer, ZMQ_SNDHWM, &hwm, sizeof(hwm));
			ctl->hb_len = (size_t)n;
			kvx_timer_init(&ctl->hb_timer, hb_fire, ctl);
			rc = kvx_timer_arm(ctl->timers, &ctl->hb_timer, kvx_now_ns());
		}
	}
	if (rc)
		goto fail;
	atomic_store(&ctl->running, 1);
	/* Sockets were created here and migrate to the control thread: thread creation / lcore
	 * launch (mutex + condvar) is the full barrier libzmq requires (zmq.txt). */
	if (ctl->p.lcore)
		rc = kvx_lcore_launch(ctl->p.lcore, ctl_loop_lcore, ctl);
	else
		rc = -pthread_create(&ctl->thread, NULL, ctl_loop, ctl);
	if (rc) {
		atomic_store(&ctl->running, 0);
		goto fail;
	}
	ctl->thread_started = 1;
	return 0;
fail:
	if (ctl->hb_dealer)
		zmq_close(ctl->hb_dealer);
	if (ctl->hs_router)
		zmq_close(ctl->hs_router);
	if (ctl->nt_router)
		zmq_close(ctl->nt_router);
	ctl->hb_dealer = ctl->hs_router = ctl->nt_router = NULL;
	if (kvx_timer_is_armed(&ctl->hb_timer))
		kvx_timer_cancel(ctl->timers, &ctl->hb_timer);
	zmq_ctx_term(ctl->zctx);
	ctl->zctx = NULL;
	return rc;
}

int kvx_ctl_bound_ports(const struct kvx_ctl *ctl, uint16_t *handshake, uint16_t *notify)
{
	if (!ctl)
		return -EINVAL;
	uint32_t h = atomic_load(&((struct kvx_ctl *)ctl)->hs_port);
	uint32_t n = atomic_load(&((struct kvx_ctl *)ctl)->nt_port);
	if (!h || !n)
		return -EAGAIN;
	if (handshake)
		*handshake = (uint16_t)h;
	if (notify)
		*notify = (uint16_t)n;
	return 0;
}

static void free_inbox(struct kvx_ctl_inbox *ib);
static void job_free(struct hs_job *j);
static void job_cancel_unstarted(struct kvx_ctl *ctl, struct hs_job *j);
static void job_finish(struct kvx_ctl *ctl, struct hs_job *j, int status, const char *stage);

static void dealer_close(void *v)
{
	zmq_close(v);
}

/* kvx_ctl_stop(): a notify DEALER may still hold messages the loop sent just before it exited
 * (a `release` or `write_done` of the engine's last transfer); a bounded linger lets
 * zmq_ctx_term() deliver them to a live peer and gives up on a dead one after the bound. */
static void dealer_close_flush(void *v)
{
	int ms = KVX_CTL_STOP_FLUSH_MS;
	zmq_setsockopt(v, ZMQ_LINGER, &ms, sizeof(ms));
	zmq_close(v);
}

void kvx_ctl_stop(struct kvx_ctl *ctl)
{
	if (!ctl || !ctl->thread_started || ctl->stopped)
		return;
	atomic_store(&ctl->stop_req, 1);
	kvx_waiter_wake(&ctl->waiter);
	if (ctl->p.lcore)
		kvx_lcore_wait(ctl->p.lcore);
	else
		pthread_join(ctl->thread, NULL);
	ctl->stopped = 1;
	atomic_store(&ctl->running, 0);
	/* The loop has exited (join/wait is the barrier for socket migration): close all. */
	smap_fini(&ctl->dealers, dealer_close_flush);
	smap_init(&ctl->dealers, 1024);
	atomic_store(&ctl->c.peers_open, 0);
	if (ctl->hb_dealer)
		zmq_close(ctl->hb_dealer);
	if (ctl->hs_router)
		zmq_close(ctl->hs_router);
	if (ctl->nt_router)
		zmq_close(ctl->nt_router);
	ctl->hb_dealer = ctl->hs_router = ctl->nt_router = NULL;
	zmq_ctx_term(ctl->zctx);
	ctl->zctx = NULL;
}

void kvx_ctl_destroy(struct kvx_ctl *ctl)
{
	if (!ctl)
		return;
	kvx_ctl_stop(ctl);
	if (ctl->inboxes) {
		for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
			struct kvx_ctl_inbox *ib = atomic_load(&ctl->inboxes[i]);
			if (ib)
				free_inbox(ib);
		}
	}
	smap_fini(&ctl->dealers, ctl->dealers.b ? dealer_close : NULL);
	smap_fini(&ctl->terminal, NULL);
	smap_fini(&ctl->live, NULL);
	if (ctl->hb_dealer)
		zmq_close(ctl->hb_dealer);
	if (ctl->hs_router)
		zmq_close(ctl->hs_router);
	if (ctl->nt_router)
		zmq_close(ctl->nt_router);
	if (ctl->zctx)
		zmq_ctx_term(ctl->zctx);
	kvx_timer_heap_destroy(ctl->timers);
	if (ctl->waiter_ok)
		kvx_waiter_fini(&ctl->waiter);
	pthread_mutex_destroy(&ctl->inbox_mu);
	pthread_mutex_destroy(&ctl->watch_mu);
	pthread_cond_destroy(&ctl->watch_cv);
	free(ctl->inboxes);
	free(ctl->ids);
	free(ctl->nmsg);
	free(ctl->scratch_regions);
	free(ctl->scratch_descs);
	free(ctl->txbuf);
	free(ctl->meta_buf);
	free(ctl->layers_buf);
	free(ctl);
}

void kvx_ctl_counters_get(const struct kvx_ctl *ctl, struct kvx_ctl_counters *out)
{
	struct ctr *c = &((struct kvx_ctl *)ctl)->c;
#define RD(f) out->f = atomic_load_explicit(&c->f, memory_order_relaxed)
	RD(notify_rx); RD(notify_tx); RD(dropped_terminal); RD(malformed); RD(unknown_type);
	RD(oversize); RD(send_errors); RD(inbox_full); RD(hs_served); RD(connect_served);
	RD(hs_ok); RD(hs_failed); RD(heartbeats); RD(peers_evicted); RD(peers_open);
	RD(watch_errors);
#undef RD
}

size_t kvx_ctl_peer_stats_get(const struct kvx_ctl *ctl, struct kvx_ctl_peer_stats *out,
			      size_t cap)
{
	struct kvx_ctl *c = (struct kvx_ctl *)ctl;
	/* A1: pairs with R1 in peer_of(): the name is written before the count. */
	uint32_t n = atomic_load_explicit(&c->npeers, memory_order_acquire);
	size_t k = 0;
	for (uint32_t i = 0; i < n && k < cap; i++, k++) {
		snprintf(out[k].peer, sizeof(out[k].peer), "%s", c->peers[i].peer);
		out[k].rx = atomic_load_explicit(&c->peers[i].rx, memory_order_relaxed);
		out[k].malformed = atomic_load_explicit(&c->peers[i].malformed, memory_order_relaxed);
		out[k].dropped = atomic_load_explicit(&c->peers[i].dropped, memory_order_relaxed);
	}
	return k;
}

/* ---------------------------------------------------------------------------------------- */
/* Inboxes                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void free_inbox(struct kvx_ctl_inbox *ib)
{
	void *o;
	/* Release queued work that never ran (large buffers, handshake jobs). */
	while (ib->to_ctl && kvx_ring_dequeue_burst_sc(ib->to_ctl, &o, 1, NULL) == 1) {
		struct slot *s = o;
		if (s->data && s->data != s->inline_buf)
			free(s->data);
		if (s->job)
			job_cancel_unstarted(ib->ctl, s->job);
	}
	struct kvx_ctl *ctl = ib->ctl;
	atomic_store(&ctl->inboxes[ib->idx], NULL);
	kvx_ring_destroy(ib->to_ctl);
	kvx_ring_destroy(ib->free);
	free(ib->slots);
	free(ib);
}

int kvx_ctl_inbox_open(struct kvx_ctl *ctl, struct kvx_ctl_inbox **out)
{
	if (!ctl || !out)
		return -EINVAL;
	struct kvx_ctl_inbox *ib = calloc(1, sizeof(*ib));
	if (!ib)
		return -ENOMEM;
	ib->ctl = ctl;
	ib->nslots = ctl->p.inbox_slots;
	ib->slots = calloc(ib->nslots, sizeof(*ib->slots));
	struct kvx_ring_params rp = {.name = "ctl-inbox", .count = ib->nslots,
				     .flags = KVX_RING_F_EXACT_SZ};
	int rc = ib->slots ? kvx_ring_create(&rp, &ib->to_ctl) : -ENOMEM;
	rp.name = "ctl-free";
	rc = rc ? rc : kvx_ring_create(&rp, &ib->free);
	if (rc) {
		kvx_ring_destroy(ib->to_ctl);
		free(ib->slots);
		free(ib);
		return rc;
	}
	for (uint32_t i = 0; i < ib->nslots; i++) {
		void *o = &ib->slots[i];
		kvx_ring_enqueue_burst_sp(ib->free, &o, 1, NULL);
	}
	kvx_ring_set_waiter(ib->to_ctl, &ctl->waiter);
	pthread_mutex_lock(&ctl->inbox_mu);
	rc = -ENOBUFS;
	for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
		if (!atomic_load(&ctl->inboxes[i])) {
			ib->idx = i;
			/* Release: the rings are fully built before the control thread sees them. */
			atomic_store_explicit(&ctl->inboxes[i], ib, memory_order_release);
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&ctl->inbox_mu);
	if (rc) {
		kvx_ring_destroy(ib->to_ctl);
		kvx_ring_destroy(ib->free);
		free(ib->slots);
		free(ib);
		return rc;
	}
	*out = ib;
	return 0;
}

void kvx_ctl_inbox_close(struct kvx_ctl_inbox *ib)
{
	if (!ib)
		return;
	struct kvx_ctl *ctl = ib->ctl;
	pthread_mutex_lock(&ctl->inbox_mu);
	if (atomic_load(&ctl->running) && !atomic_load(&ctl->stop_req)) {
		/* The control thread drains what is queued, then frees the inbox. */
		atomic_store_explicit(&ib->closed, 1, memory_order_release);
		pthread_mutex_unlock(&ctl->inbox_mu);
		kvx_waiter_wake(&ctl->waiter);
		return;
	}
	pthread_mutex_unlock(&ctl->inbox_mu);
	free_inbox(ib);
}

static struct slot *slot_get(struct kvx_ctl_inbox *ib)
{
	void *o;
	if (kvx_ring_dequeue_burst_sc(ib->free, &o, 1, NULL) != 1) {
		CINC(ib->ctl, inbox_full);
		return NULL;
	}
	struct slot *s = o;
	s->data = NULL;
	s->len = 0;
	s->job = NULL;
	s->host[0] = 0;
	s->tid[0] = 0;
	s->port = 0;
	return s;
}

static void slot_submit(struct kvx_ctl_inbox *ib, struct slot *s)
{
	void *o = s;
	/* Cannot fail: to_ctl holds nslots elements and only nslots slots exist. The ring's
	 * waiter makes the enqueue wake the control lcore. */
	kvx_ring_enqueue_burst_sp(ib->to_ctl, &o, 1, NULL);
}

static void slot_put_back(struct kvx_ctl_inbox *ib, struct slot *s)
{
	void *o = s;
	kvx_ring_enqueue_burst_sp(ib->free, &o, 1, NULL);
}

static int dest_ok(const char *host, uint16_t port)
{
	return host && host[0] && strlen(host) <= KVX_CTL_HOST_MAX && port;
}

int kvx_ctl_send_raw(struct kvx_ctl_inbox *ib, const char *host, uint16_t port, const void *data,
		     size_t len)
{
	if (!ib || !dest_ok(host, port) || (!data && len))
		return -EINVAL;
	if (len > KVX_MSG_NOTIFY_MAX_BYTES)
		return -EMSGSIZE;
	uint8_t *big = NULL;
	if (len > KVX_CTL_INLINE_BYTES && !(big = malloc(len)))
		return -ENOMEM;
	struct slot *s = slot_get(ib);
	if (!s) {
		free(big);
		return -ENOBUFS;
	}
	s->kind = SLOT_SEND;
	strcpy(s->host, host);
	s->port = port;
	s->data = big ? big : s->inline_buf;
	if (len)
		memcpy(s->data, data, len);
	s->len = len;
	slot_submit(ib, s);
	return 0;
}

int kvx_ctl_send_notify(struct kvx_ctl_inbox *ib, const char *host, uint16_t port,
			const struct kvx_msg_notify *m)
{
	if (!ib || !dest_ok(host, port) || !m)
		return -EINVAL;
	struct slot *s = slot_get(ib);
	if (!s)
		return -ENOBUFS;
	int n = kvx_msg_notify_encode(m, s->inline_buf, sizeof(s->inline_buf));
	if (n == -EMSGSIZE) {
		/* Large block lists: encode on the heap (slow path, scheduler-side sends). */
		size_t cap = 64 + 2 * (size_t)KVX_MSG_ID_MAX + 5 * (size_t)m->num_blocks +
			     5 * KVX_MSG_GROUPS_MAX;
		if (cap > KVX_MSG_NOTIFY_MAX_BYTES)
			cap = KVX_MSG_NOTIFY_MAX_BYTES;
		uint8_t *big = malloc(cap);
		if (!big) {
			slot_put_back(ib, s);
			return -ENOMEM;
		}
		n = kvx_msg_notify_encode(m, big, cap);
		if (n < 0) {
			free(big);
			slot_put_back(ib, s);
			return n;
		}
		s->data = big;
	} else if (n < 0) {
		slot_put_back(ib, s);
		return n;
	} else {
		s->data = s->inline_buf;
	}
	s->kind = SLOT_SEND;
	strcpy(s->host, host);
	s->port = port;
	s->len = (size_t)n;
	slot_submit(ib, s);
	return 0;
}

static int tid_ok(const char *t)
{
	size_t n = t ? strnlen(t, KVX_MSG_ID_MAX + 1) : 0;
	return n >= 1 && n <= KVX_MSG_ID_MAX;
}

int kvx_ctl_mark_terminal(struct kvx_ctl_inbox *ib, const char *transfer_id)
{
	if (!ib || !tid_ok(transfer_id))
		return -EINVAL;
	struct slot *s = slot_get(ib);
	if (!s)
		return -ENOBUFS;
	s->kind = SLOT_TERMINAL;
	strcpy(s->tid, transfer_id);
	slot_submit(ib, s);
	return 0;
}

int kvx_ctl_mark_live(struct kvx_ctl_inbox *ib, const char *transfer_id, const char *host,
		      uint16_t port)
{
	if (!ib || !tid_ok(transfer_id) || !dest_ok(host, port))
		return -EINVAL;
	struct slot *s = slot_get(ib);
	if (!s)
		return -ENOBUFS;
	s->kind = SLOT_LIVE;
	strcpy(s->tid, transfer_id);
	strcpy(s->host, host);
	s->port = port;
	slot_submit(ib, s);
	return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Handshake jobs (initiator)                                                                */
/* ---------------------------------------------------------------------------------------- */

static void job_free(struct hs_job *j)
{
	if (!j)
		return;
	if (j->sock)
		zmq_close(j->sock);
	for (uint32_t i = 0; j->r && i < j->nranks; i++) {
		free(j->r[i].meta.regions);
		free(j->r[i].layers.descs);
		free(j->r[i].blob_b);
	}
	for (uint32_t i = 0; j->hosts && i < j->p.num_remote_hosts; i++)
		free(j->hosts[i]);
	free(j->hosts);
	free(j->host);
	free(j->r);
	free(j);
}

int kvx_ctl_handshake_start(struct kvx_ctl_inbox *ib, const struct kvx_ctl_hs_params *p)
{
	if (!ib || !p || !p->on_done || !p->host || !p->host[0] ||
	    strlen(p->host) > KVX_CTL_HOST_MAX || p->dp_size == 0 || p->tp_size == 0 ||
	    (p->port_mode == KVX_CTL_PORT_INJECTIVE && p->tp_rank >= p->tp_size) ||
	    (p->port_mode != KVX_CTL_PORT_INJECTIVE && p->port_mode != KVX_CTL_PORT_VLLM) ||
	    (p->num_remote_hosts && !p->remote_hosts))
		return -EINVAL;
	uint32_t n = p->ranks ? p->num_ranks : p->dp_size;
	if (n == 0 || n > HS_MAX_RANKS)
		return -EINVAL;
	for (uint32_t i = 0; p->ranks && i < n; i++)
		if (p->ranks[i] >= p->dp_size)
			return -EINVAL;
	uint16_t base = p->handshake_base_port ? p->handshake_base_port
					       : KVX_CTL_DEFAULT_HANDSHAKE_PORT;
	struct hs_job *j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->p = *p;
	j->p.handshake_base_port = base;
	if (!j->p.timeout_ms)
		j->p.timeout_ms = KVX_CTL_DEFAULT_HANDSHAKE_MS;
	j->nranks = n;
	j->host = strdup(p->host);
	j->r = calloc(n, sizeof(*j->r));
	if (p->num_remote_hosts)
		j->hosts = calloc(p->num_remote_hosts, sizeof(char *));
	int rc = (!j->host || !j->r || (p->num_remote_hosts && !j->hosts)) ? -ENOMEM : 0;
	for (uint32_t i = 0; !rc && i < p->num_remote_hosts; i++) {
		const char *h = p->remote_hosts[i] ? p->remote_hosts[i] : "";
		if (strlen(h) > KVX_CTL_HOST_MAX)
			rc = -EINVAL;
		else if (!(j->hosts[i] = strdup(h)))
			rc = -ENOMEM;
	}
	j->p.host = j->host;
	j->p.remote_hosts = (const char *const *)j->hosts;
	j->p.ranks = NULL;
	snprintf(j->key, sizeof(j->key), "%s:%u", p->host, base);
	for (uint32_t i = 0; !rc && i < n; i++) {
		struct rank_state *r = &j->r[i];
		const char *h;
		uint32_t local;
		r->dp_rank = p->ranks ? p->ranks[i] : i;
		kvx_ctl_dp_target(r->dp_rank, p->dp_size_local, j->p.remote_hosts,
				  p->num_remote_hosts, j->host, &h, &local);
		snprintf(r->host, sizeof(r->host), "%s", h);
		rc = kvx_ctl_port(p->port_mode, base, local, p->tp_rank, p->tp_size, &r->port);
		r->stage = "";
	}
	if (rc) {
		job_free(j);
		return rc;
	}
	struct slot *s = slot_get(ib);
	if (!s) {
		job_free(j);
		return -ENOBUFS;
	}
	s->kind = SLOT_HANDSHAKE;
	s->job = j;
	slot_submit(ib, s);
	return 0;
}

static int job_send_get_meta(struct kvx_ctl *ctl, struct hs_job *j)
{
	struct rank_state *r = &j->r[j->cur];
	char ep[KVX_CTL_HOST_MAX + 32];
	if (j->sock)
		zmq_close(j->sock);
	j->sock = dealer_new(ctl, KVX_MSG_HS_REPLY_MAX_BYTES);
	if (!j->sock)
		return -zmq_errno();
	if (strchr(r->host, ':')) {
		int one = 1;
		zmq_setsockopt(j->sock, ZMQ_IPV6, &one, sizeof(one));
	}
	int rc = kvx_ctl_zmq_path(r->host, r->port, ep, sizeof(ep));
	if (rc < 0)
		return rc;
	if (zmq_connect(j->sock, ep))
		return -zmq_errno();
	if (zmq_send(j->sock, KVX_MSG_GET_META, KVX_MSG_GET_META_LEN, ZMQ_DONTWAIT) < 0)
		return -zmq_errno();
	j->phase = HS_META;
	/* A new pipe's reader counts as awake until one read fails, so the reply would not
	 * signal ZMQ_FD: the loop reads once (EAGAIN) before it waits on the fd. */
	j->due = 1;
	return 0;
}

static void job_timeout(struct kvx_timer *t, void *arg)
{
	(void)t;
	struct hs_job *j = arg;
	static const char *const stage[] = {"receiving agent metadata",
					    "receiving KV-cache metadata", "connecting transport",
					    "done"};
	j->expired = 1;
	job_finish(j->ctl, j, -ETIMEDOUT, stage[j->phase]);
}

static void job_begin(struct kvx_ctl *ctl, struct hs_job *j)
{
	j->ctl = ctl;
	j->start_ns = kvx_now_ns();
	j->deadline_ns = j->start_ns + (uint64_t)j->p.timeout_ms * 1000000ull;
	j->next = ctl->hs_active;
	ctl->hs_active = j;
	ctl->hs_nactive++;
	kvx_timer_init(&j->timer, job_timeout, j);
	if (kvx_timer_arm(ctl->timers, &j->timer, j->deadline_ns)) {
		job_finish(ctl, j, -ENOMEM, "connecting");
		return;
	}
	int rc = job_send_get_meta(ctl, j);
	if (rc)
		job_finish(ctl, j, rc, "connecting");
}

static int job_key_busy(struct kvx_ctl *ctl, const char *key)
{
	for (struct hs_job *q = ctl->hs_active; q; q = q->next)
		if (!strcmp(q->key, key))
			return 1;
	for (struct hs_job *q = ctl->hs_queue_head; q; q = q->next)
		if (!strcmp(q->key, key))
			return 1;
	return 0;
}

static void report(struct kvx_ctl *ctl, struct hs_job *j, int status, const char *err)
{
	struct kvx_ctl_hs_rank *rr = calloc(j->nranks, sizeof(*rr));
	struct kvx_ctl_hs_result res;
	memset(&res, 0, sizeof(res));
	res.status = status;
	snprintf(res.error, sizeof(res.error), "%s", err ? err : "");
	res.start_ns = j->start_ns;
	res.end_ns = kvx_now_ns();
	res.cookie = j->p.cookie;
	res.num_ranks = rr ? j->nranks : 0;
	res.ranks = rr;
	for (uint32_t i = 0; rr && i < j->nranks; i++) {
		struct rank_state *r = &j->r[i];
		rr[i].dp_rank = r->dp_rank;
		rr[i].status = r->status;
		rr[i].stage = r->stage;
		snprintf(rr[i].host, sizeof(rr[i].host), "%s", r->host);
		rr[i].port = r->port;
		if (r->status == 0) {
			rr[i].meta = &r->meta;
			rr[i].layers = &r->layers;
			rr[i].blob_b = r->blob_b;
			rr[i].blob_b_len = r->blob_b_len;
		}
	}
	if (status)
		CINC(ctl, hs_failed);
	else
		CINC(ctl, hs_ok);
	j->p.on_done(j->p.arg, &res);
	free(rr);
}

/* Complete the job: status 0 only when every rank finished. Never registers partial ranks. */
static void job_finish(struct kvx_ctl *ctl, struct hs_job *j, int status, const char *stage)
{
	char err[512] = "";
	if (status) {
		struct rank_state *r = &j->r[j->cur < j->nranks ? j->cur : j->nranks - 1];
		r->status = status;
		r->stage = stage;
		/* Ranks after the failed one were never tried. */
		for (uint32_t i = j->cur + 1; i < j->nranks; i++) {
			j->r[i].status = -ECANCELED;
			j->r[i].stage = "not started";
		}
		snprintf(err, sizeof(err), "dp rank %u (%s:%u): %s %s (%s)", r->dp_rank, r->host,
			 r->port, status == -ETIMEDOUT ? "timed out" : "failed", stage,
			 kvx_strerror(status));
		warn_rl(ctl, "handshake with %s: %s", j->key, err);
	}
	if (kvx_timer_is_armed(&j->timer))
		kvx_timer_cancel(ctl->timers, &j->timer);
	if (j->sock) {
		zmq_close(j->sock);
		j->sock = NULL;
	}
	/* Unlink from the active list. */
	for (struct hs_job **pp = &ctl->hs_active; *pp; pp = &(*pp)->next) {
		if (*pp == j) {
			*pp = j->next;
			ctl->hs_nactive--;
			break;
		}
	}
	report(ctl, j, status, err);
	job_free(j);
}

/* Receive one 2-frame reply ["", payload]; returns payload length or a negative errno. */
static int recv_reply(void *sock, zmq_msg_t *payload)
{
	zmq_msg_t f;
	zmq_msg_init(&f);
	if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
		int e = zmq_errno();
		zmq_msg_close(&f);
		return -e;
	}
	int bad_first = zmq_msg_size(&f) != 0;
	int more = zmq_msg_more(&f);
	zmq_msg_close(&f);
	if (!more)
		return -EPROTO;
	if (zmq_msg_recv(payload, sock, ZMQ_DONTWAIT) < 0)
		return -EPROTO;
	int extra = 0;
	while (zmq_msg_more(payload)) {
		/* Drain surplus frames so the next reply starts cleanly. */
		zmq_msg_t x;
		zmq_msg_init(&x);
		int more_x = zmq_msg_recv(&x, sock, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&x);
		zmq_msg_close(&x);
		extra = 1;
		if (!more_x)
			break;
	}
	if (bad_first || extra)
		return -EPROTO;
	return (int)zmq_msg_size(payload);
}

/* Keep a decoded array: copy its @p n elements out of the shared scratch array into an
 * exact-size heap array (at least 1 byte, so NULL always means -ENOMEM). */
static void *dup_scratch(const void *scratch, size_t n, size_t elem)
{
	size_t sz = n * elem;
	void *p = malloc(sz ? sz : 1);
	if (p && sz)
		memcpy(p, scratch, sz);
	return p;
}

static void job_on_readable(struct kvx_ctl *ctl, struct hs_job *j)
{
	static const char *const stage[] = {"receiving agent metadata",
					    "receiving KV-cache metadata", "connecting transport"};
	char e[256];
	for (;;) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		int n = recv_reply(j->sock, &m);
		if (n == -EAGAIN) {
			zmq_msg_close(&m);
			return;
		}
		struct rank_state *r = &j->r[j->cur];
		enum hs_phase ph = j->phase;
		int rc = n < 0 ? n : 0;
		e[0] = 0;
		if (!rc && ph == HS_META) {
			r->meta.regions = ctl->scratch_regions;
			r->meta.regions_cap = SCRATCH_REGIONS;
			rc = kvx_msg_meta_decode(zmq_msg_data(&m), zmq_msg_size(&m), &r->meta, e,
						 sizeof(e));
			if (!rc) {
				r->meta.regions = dup_scratch(ctl->scratch_regions, r->meta.num_regions,
							      sizeof(*r->meta.regions));
				rc = r->meta.regions ? 0 : -ENOMEM;
				r->meta.regions_cap = r->meta.num_regions;
				r->have_meta = !rc;
			} else {
				r->meta.regions = NULL;
			}
			if (!rc)
				j->phase = HS_LAYERS;
		} else if (!rc && ph == HS_LAYERS) {
			r->layers.descs = ctl->scratch_descs;
			r->layers.descs_cap = SCRATCH_DESCS;
			rc = kvx_msg_layers_decode(zmq_msg_data(&m), zmq_msg_size(&m), &r->layers, e,
						   sizeof(e));
			if (!rc) {
				r->layers.descs = dup_scratch(ctl->scratch_descs, r->layers.num_descs,
							      sizeof(*r->layers.descs));
				rc = r->layers.descs ? 0 : -ENOMEM;
				r->layers.descs_cap = r->layers.num_descs;
				r->have_layers = !rc;
			} else {
				r->layers.descs = NULL;
			}
		} else if (!rc && ph == HS_CONNECT) {
			struct kvx_msg_connect c;
			rc = kvx_msg_connect_decode(zmq_msg_data(&m), zmq_msg_size(&m), &c, e,
						    sizeof(e));
			if (!rc && !c.is_reply) {
				snprintf(e, sizeof(e), "expected kvx_connect_reply");
				rc = -EPROTO;
			}
			if (!rc && c.status)
				rc = c.status;
			if (!rc) {
				r->blob_b = malloc(c.blob_len ? c.blob_len : 1);
				if (!r->blob_b)
					rc = -ENOMEM;
				else if (c.blob_len)
					memcpy(r->blob_b, c.blob, c.blob_len);
				r->blob_b_len = c.blob_len;
			}
		}
		zmq_msg_close(&m);
		if (rc) {
			if (e[0])
				warn_rl(ctl, "handshake with %s:%u: %s", r->host, r->port, e);
			job_finish(ctl, j, rc, stage[ph]);
			return;
		}
		if (ph == HS_LAYERS) {
			if (j->p.make_blob) {
				size_t la = 0;
				uint8_t *blob = ctl->txbuf + 1024;
				rc = j->p.make_blob(j->p.arg, r->dp_rank, &r->meta, blob,
						    KVX_MSG_BLOB_MAX, &la);
				if (!rc && la > KVX_MSG_BLOB_MAX)
					rc = -EMSGSIZE;
				if (rc) {
					job_finish(ctl, j, rc, "preparing transport");
					return;
				}
				/* Encode the request in a separate buffer: the blob sits in txbuf. */
				uint8_t *req = malloc(la + 1024);
				struct kvx_msg_connect c = {.is_reply = false, .epoch = ctl->epoch,
							    .dp_rank = r->dp_rank, .blob = blob,
							    .blob_len = la};
				snprintf(c.engine_id, sizeof(c.engine_id), "%.200s:%u", ctl->host,
					 ctl->hs_port_cfg);
				int n2 = req ? kvx_msg_connect_encode(&c, req, la + 1024) : -ENOMEM;
				if (n2 < 0 || zmq_send(j->sock, req, (size_t)n2, ZMQ_DONTWAIT) < 0) {
					free(req);
					job_finish(ctl, j, n2 < 0 ? n2 : -zmq_errno(),
						   "connecting transport");
					return;
				}
				free(req);
				j->phase = HS_CONNECT;
				continue;
			}
			ph = HS_CONNECT; /* no connection setup: the rank is complete */
		}
		if (ph == HS_CONNECT) {
			r->status = 0;
			r->stage = "";
			if (++j->cur == j->nranks) {
				job_finish(ctl, j, 0, "");
				return;
			}
			rc = job_send_get_meta(ctl, j);
			if (rc) {
				job_finish(ctl, j, rc, "connecting");
				return;
			}
			/* The new socket has nothing to read yet; wait for zmq_poll. */
			return;
		}
	}
}

/* A job that never ran still gets exactly one on_done call, with -ECANCELED. */
static void job_cancel_unstarted(struct kvx_ctl *ctl, struct hs_job *j)
{
	j->ctl = ctl;
	j->start_ns = kvx_now_ns();
	for (uint32_t i = 0; i < j->nranks; i++) {
		j->r[i].status = -ECANCELED;
		j->r[i].stage = "not started";
	}
	report(ctl, j, -ECANCELED, "cancelled: the control lcore stopped");
	job_free(j);
}

static void jobs_start_queued(struct kvx_ctl *ctl)
{
	while (ctl->hs_queue_head && ctl->hs_nactive < ctl->p.max_active_handshakes) {
		struct hs_job *j = ctl->hs_queue_head;
		ctl->hs_queue_head = j->next;
		if (!ctl->hs_queue_head)
			ctl->hs_queue_tail = NULL;
		j->next = NULL;
		job_begin(ctl, j);
	}
}

static void job_enqueue(struct kvx_ctl *ctl, struct hs_job *j)
{
	j->ctl = ctl;
	if (job_key_busy(ctl, j->key)) {
		/* T41: one handshake per cold peer; duplicates complete at once with -EBUSY. */
		char err[600];
		j->start_ns = kvx_now_ns();
		for (uint32_t i = 0; i < j->nranks; i++) {
			j->r[i].status = -EBUSY;
			j->r[i].stage = "already in progress";
		}
		snprintf(err, sizeof(err), "handshake with %s already in progress", j->key);
		report(ctl, j, -EBUSY, err);
		job_free(j);
		return;
	}
	j->next = NULL;
	if (ctl->hs_queue_tail)
		ctl->hs_queue_tail->next = j;
	else
		ctl->hs_queue_head = j;
	ctl->hs_queue_tail = j;
}

/* ---------------------------------------------------------------------------------------- */
/* Notify send path: cached DEALER per peer path                                             */
/* ---------------------------------------------------------------------------------------- */

static struct snode *dealer_get(struct kvx_ctl *ctl, const char *host, uint16_t port)
{
	char ep[KVX_CTL_HOST_MAX + 32];
	if (kvx_ctl_zmq_path(host, port, ep, sizeof(ep)) < 0)
		return NULL;
	struct snode *n = smap_find(&ctl->dealers, ep);
	if (n) {
		smap_touch(&ctl->dealers, n);
		return n;
	}
	if (ctl->dealers.count >= ctl->p.max_peers) {
		/* Evict the least recently used path that no live transfer pins. */
		struct snode *v = ctl->dealers.tail;
		while (v && v->refs)
			v = v->prev;
		if (!v) {
			warn_rl(ctl, "DEALER cache full (%u paths, all pinned by live transfers); "
				     "dropping a send to %s", ctl->p.max_peers, ep);
			return NULL;
		}
		zmq_close(v->val);
		smap_del(&ctl->dealers, v);
		CINC(ctl, peers_evicted);
		atomic_fetch_sub_explicit(&ctl->c.peers_open, 1, memory_order_relaxed);
	}
	void *s = dealer_new(ctl, 4096);
	if (!s)
		return NULL;
	if (strchr(host, ':')) {
		int one = 1;
		zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof(one));
	}
	if (zmq_connect(s, ep)) {
		warn_rl(ctl, "cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
		zmq_close(s);
		return NULL;
	}
	n = smap_add(&ctl->dealers, ep, s);
	if (!n) {
		zmq_close(s);
		return NULL;
	}
	CINC(ctl, peers_open);
	return n;
}

static void do_send(struct kvx_ctl *ctl, struct slot *s)
{
	struct snode *n = dealer_get(ctl, s->host, s->port);
	if (!n || zmq_send(n->val, s->data, s->len, ZMQ_DONTWAIT) < 0) {
		if (n)
			warn_rl(ctl, "send to %s failed: %s", n->key, zmq_strerror(zmq_errno()));
		CINC(ctl, send_errors);
		return;
	}
	n->used_ns = kvx_now_ns();
	CINC(ctl, notify_tx);
}

static void terminal_add(struct kvx_ctl *ctl, const char *tid)
{
	struct snode *n = smap_find(&ctl->terminal, tid);
	if (n) {
		smap_touch(&ctl->terminal, n);
	} else {
		if (ctl->terminal.count >= KVX_CTL_TERMINAL_LRU)
			smap_del(&ctl->terminal, ctl->terminal.tail);
		smap_add(&ctl->terminal, tid, NULL);
	}
	/* Unpin the DEALER path this transfer used. */
	struct snode *l = smap_find(&ctl->live, tid);
	if (l) {
		struct snode *d = smap_find(&ctl->dealers, l->val);
		if (d && d->refs)
			d->refs--;
		free(l->val);
		smap_del(&ctl->live, l);
	}
}

static void live_add(struct kvx_ctl *ctl, const char *tid, const char *host, uint16_t port)
{
	if (smap_find(&ctl->live, tid) || ctl->live.count >= LIVE_MAX)
		return;
	struct snode *d = dealer_get(ctl, host, port);
	if (!d)
		return;
	char *path = strdup(d->key);
	if (!path)
		return;
	if (!smap_add(&ctl->live, tid, path)) {
		free(path);
		return;
	}
	d->refs++;
}

static void handle_slot(struct kvx_ctl *ctl, struct kvx_ctl_inbox *ib, struct slot *s)
{
	switch (s->kind) {
	case SLOT_SEND:
		do_send(ctl, s);
		break;
	case SLOT_TERMINAL:
		terminal_add(ctl, s->tid);
		break;
	case SLOT_LIVE:
		live_add(ctl, s->tid, s->host, s->port);
		break;
	case SLOT_HANDSHAKE:
		job_enqueue(ctl, s->job);
		s->job = NULL;
		break;
	}
	if (s->data && s->data != s->inline_buf)
		free(s->data);
	s->data = NULL;
	slot_put_back(ib, s);
}

/* Drain every inbox (bounded per inbox per call); returns the number of slots handled. */
static unsigned drain_inboxes(struct kvx_ctl *ctl)
{
	unsigned total = 0;
	for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
		/* Acquire: pairs with the release store in kvx_ctl_inbox_open(). */
		struct kvx_ctl_inbox *ib =
			atomic_load_explicit(&ctl->inboxes[i], memory_order_acquire);
		if (!ib)
			continue;
		int closed = atomic_load_explicit(&ib->closed, memory_order_acquire);
		void *o[INBOX_BATCH];
		unsigned n = kvx_ring_dequeue_burst_sc(ib->to_ctl, o, INBOX_BATCH, NULL);
		for (unsigned k = 0; k < n; k++)
			handle_slot(ctl, ib, o[k]);
		total += n;
		if (closed && kvx_ring_is_empty(ib->to_ctl)) {
			pthread_mutex_lock(&ctl->inbox_mu);
			free_inbox(ib);
			pthread_mutex_unlock(&ctl->inbox_mu);
		}
	}
	return total;
}

static int inboxes_pending(struct kvx_ctl *ctl)
{
	for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
		struct kvx_ctl_inbox *ib =
			atomic_load_explicit(&ctl->inboxes[i], memory_order_acquire);
		if (ib && (!kvx_ring_is_empty(ib->to_ctl) ||
			   atomic_load_explicit(&ib->closed, memory_order_acquire)))
			return 1;
	}
	return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Receive paths                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* Receive [identity, payload] from a ROUTER; extra frames make the message malformed.
 * Returns 1 when a 2-frame message was read, 0 when nothing was there, -1 malformed. */
static int router_recv(void *sock, zmq_msg_t *id, zmq_msg_t *payload, int *nframes)
{
	*nframes = 0;
	if (zmq_msg_recv(id, sock, ZMQ_DONTWAIT) < 0)
		return 0;
	*nframes = 1;
	if (!zmq_msg_more(id))
		return -1;
	if (zmq_msg_recv(payload, sock, ZMQ_DONTWAIT) < 0)
		return -1;
	*nframes = 2;
	if (!zmq_msg_more(payload))
		return 1;
	while (1) {
		zmq_msg_t x;
		zmq_msg_init(&x);
		int ok = zmq_msg_recv(&x, sock, ZMQ_DONTWAIT) >= 0;
		int more = ok && zmq_msg_more(&x);
		zmq_msg_close(&x);
		(*nframes)++;
		if (!more)
			break;
	}
	return -1;
}

/* Receive the next message of a ROUTER and account it to its sender. Returns router_recv()'s
 * value; on 0 (nothing pending) both messages are already closed. @p addr is the sender's
 * address as libzmq reports it (may be NULL). */
static int router_next(struct kvx_ctl *ctl, void *sock, zmq_msg_t *id, zmq_msg_t *pl, int *nf,
		       const char **addr, struct peer_stat **ps)
{
	zmq_msg_init(id);
	zmq_msg_init(pl);
	int r = router_recv(sock, id, pl, nf);
	if (r == 0) {
		zmq_msg_close(id);
		zmq_msg_close(pl);
		return 0;
	}
	*addr = zmq_msg_gets(*nf >= 2 ? pl : id, "Peer-Address");
	*ps = peer_of(ctl, *addr);
	atomic_fetch_add_explicit(&(*ps)->rx, 1, memory_order_relaxed);
	return r;
}

static void count_bad(struct kvx_ctl *ctl, struct peer_stat *ps, int rc)
{
	CINC(ctl, malformed);
	if (rc == -EMSGSIZE)
		CINC(ctl, oversize);
	atomic_fetch_add_explicit(&ps->malformed, 1, memory_order_relaxed);
}

static int notify_rx(struct kvx_ctl *ctl)
{
	for (int k = 0; k < RX_BATCH; k++) {
		zmq_msg_t id, pl;
		int nf;
		const char *addr;
		struct peer_stat *ps;
		int r = router_next(ctl, ctl->nt_router, &id, &pl, &nf, &addr, &ps);
		if (r == 0)
			return k;
		if (r < 0) {
			count_bad(ctl, ps, -EPROTO);
			warn_rl(ctl, "notify: dropped a %d-frame message from %s (want 2 frames)", nf,
				addr ? addr : "?");
		} else {
			char err[256];
			struct kvx_msg_notify *m = ctl->nmsg;
			m->block_ids = ctl->ids;
			m->blocks_cap = NOTIFY_MAX_IDS;
			int rc = kvx_msg_notify_decode(zmq_msg_data(&pl), zmq_msg_size(&pl), m, err,
						       sizeof(err));
			if (rc) {
				count_bad(ctl, ps, rc);
				if (strstr(err, "Unhandled structured message type"))
					CINC(ctl, unknown_type);
				warn_rl(ctl, "notify: dropped a %zu-byte message from %s: %s",
					zmq_msg_size(&pl), addr ? addr : "?", err);
			} else if (smap_find(&ctl->terminal, m->transfer_id)) {
				CINC(ctl, dropped_terminal);
				atomic_fetch_add_explicit(&ps->dropped, 1, memory_order_relaxed);
			} else {
				CINC(ctl, notify_rx);
				if (ctl->p.on_notify)
					ctl->p.on_notify(ctl->p.notify_arg, m);
			}
		}
		zmq_msg_close(&id);
		zmq_msg_close(&pl);
	}
	return RX_BATCH; /* the limit: more may be queued */
}

static void router_reply(void *sock, zmq_msg_t *id, const void *data, size_t len)
{
	/* Never blocks: a peer at HWM or gone just loses the reply (ROUTER drops). */
	zmq_send(sock, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(sock, data, len, ZMQ_DONTWAIT);
}

static int hs_rx(struct kvx_ctl *ctl)
{
	for (int k = 0; k < RX_BATCH; k++) {
		zmq_msg_t id, pl;
		int nf;
		const char *addr;
		struct peer_stat *ps;
		int r = router_next(ctl, ctl->hs_router, &id, &pl, &nf, &addr, &ps);
		if (r == 0)
			return k;
		size_t len = zmq_msg_size(&pl);
		const uint8_t *d = zmq_msg_data(&pl);
		if (r < 0) {
			count_bad(ctl, ps, -EPROTO);
			warn_rl(ctl, "handshake: dropped a %d-frame message from %s", nf,
				addr ? addr : "?");
		} else if (len == KVX_MSG_GET_META_LEN && !memcmp(d, KVX_MSG_GET_META, len)) {
			if (ctl->meta_buf) {
				router_reply(ctl->hs_router, &id, ctl->meta_buf, ctl->meta_len);
				router_reply(ctl->hs_router, &id, ctl->layers_buf, ctl->layers_len);
				CINC(ctl, hs_served);
			} else {
				warn_rl(ctl, "handshake: get_meta_msg from %s before local metadata "
					     "was set; not answered", addr ? addr : "?");
			}
		} else {
			struct kvx_msg_connect c;
			char err[256];
			int rc = kvx_msg_connect_decode(d, len, &c, err, sizeof(err));
			if (!rc && c.is_reply) {
				rc = -EPROTO;
				snprintf(err, sizeof(err), "unexpected kvx_connect_reply");
			}
			if (rc) {
				count_bad(ctl, ps, rc);
				warn_rl(ctl, "handshake: dropped a %zu-byte message from %s: %s", len,
					addr ? addr : "?", err);
			} else {
				uint8_t *blob_b = ctl->txbuf + 1024;
				size_t lb = KVX_MSG_BLOB_MAX;
				int st = ctl->p.on_connect
						 ? ctl->p.on_connect(ctl->p.connect_arg, c.blob,
								     c.blob_len, blob_b, &lb)
						 : -ENOTSUP;
				if (st > 0 || st < -4095)
					st = -EPROTO;
				if (st || lb > KVX_MSG_BLOB_MAX)
					lb = 0;
				struct kvx_msg_connect rep = {.is_reply = true, .status = st,
							      .blob = blob_b, .blob_len = lb};
				uint8_t *out = malloc(lb + 256);
				int n = out ? kvx_msg_connect_encode(&rep, out, lb + 256) : -ENOMEM;
				if (n > 0)
					router_reply(ctl->hs_router, &id, out, (size_t)n);
				free(out);
				CINC(ctl, connect_served);
			}
		}
		zmq_msg_close(&id);
		zmq_msg_close(&pl);
	}
	return RX_BATCH; /* the limit: more may be queued */
}

static void hb_fire(struct kvx_timer *t, void *arg)
{
	struct kvx_ctl *ctl = arg;
	/* DONTWAIT: a proxy that is down never blocks the loop (HWM 16, then EAGAIN). */
	if (zmq_send(ctl->hb_dealer, ctl->hb_buf, ctl->hb_len, ZMQ_DONTWAIT) >= 0)
		CINC(ctl, heartbeats);
	kvx_timer_arm(ctl->timers, t, kvx_now_ns() + (uint64_t)ctl->p.heartbeat_ms * 1000000ull);
}

/* ---------------------------------------------------------------------------------------- */
/* The loop                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* The ZMQ_FD of a socket: readable when the socket's command mailbox was signalled. It is
 * edge-like (RUNTIME_GUIDE.md §5.2): a socket whose fd fired must be read until EAGAIN (or kept
 * "due") before the loop waits on the fd again. Returns -1 on error. */
static int sock_fd(void *s)
{
	int fd = -1;
	size_t l = sizeof(fd);
	return zmq_getsockopt(s, ZMQ_FD, &fd, &l) ? -1 : fd;
}

/*
 * One poll(2) per iteration over the waiter eventfd, the ROUTERs' ZMQ_FDs, the watched fds and
 * the running handshake jobs' DEALERs. zmq_poll() would cost a zero-timeout poll pass, then a
 * ZMQ_EVENTS query (a getpid and a poll each) per socket, before and after every sleep: about
 * six syscalls per wait instead of one, which showed as the control plane's main CPU cost per
 * notification round trip (kvxfer-perf notify). A ROUTER is read only when its fd fired or a
 * batch limit left input queued (hs_due / nt_due).
 */
static void *ctl_loop(void *arg)
{
	struct kvx_ctl *ctl = arg;
	struct pollfd *pfd = calloc(3 + WATCH_MAX + ctl->p.max_active_handshakes, sizeof(*pfd));
	struct hs_job **jobs = calloc(ctl->p.max_active_handshakes + 1, sizeof(*jobs));
	int hs_fd = sock_fd(ctl->hs_router), nt_fd = sock_fd(ctl->nt_router);
	if (!pfd || !jobs || hs_fd < 0 || nt_fd < 0) {
		kvx_log(KVX_LOG_ERROR, "control: cannot start the loop (%s)",
			!pfd || !jobs ? "out of memory" : "no ZMQ_FD for a ROUTER");
		free(pfd);
		free(jobs);
		return NULL;
	}
	t_ctl_self = ctl;
	struct watch_set ws = {.n = 0};
	watch_loop_live(ctl, 1);
	watch_sync(ctl, &ws);
	int hs_due = 1, nt_due = 1; /* read once at start */
	const uint64_t spin_ns = (uint64_t)ctl->p.busy_poll_us * 1000u;
	uint64_t last_work = kvx_now_ns();
	unsigned busy_rounds = 0;
	while (!atomic_load_explicit(&ctl->stop_req, memory_order_acquire)) {
		if (atomic_load_explicit(&ctl->watch_gen, memory_order_acquire) != ws.gen)
			watch_sync(ctl, &ws);
		uint64_t now = kvx_now_ns();
		kvx_timer_heap_run(ctl->timers, now);
		unsigned work = drain_inboxes(ctl);
		jobs_start_queued(ctl);
		for (struct hs_job *j = ctl->hs_active, *nx; j; j = nx) {
			nx = j->next; /* job_on_readable() may finish and free j */
			if (j->due) {
				j->due = 0;
				job_on_readable(ctl, j);
			}
		}
		if (hs_due) {
			int k = hs_rx(ctl);
			hs_due = k == RX_BATCH;
			work += (unsigned)k;
		}
		if (nt_due) {
			int k = notify_rx(ctl);
			nt_due = k == RX_BATCH;
			work += (unsigned)k;
		}
		int timeout = 0, prepared = 0, spinning = 0;
		if (!work)
			busy_rounds = 0;
		if (work) {
			last_work = now;
			/* More inbox work is likely (the producer is running): go round again and
			 * look at the fds only every WORK_ROUNDS busy rounds (one syscall less per
			 * send; sockets are never starved for longer than that). */
			if (++busy_rounds < WORK_ROUNDS)
				continue;
			busy_rounds = 0;
		} else if (spin_ns && now - last_work < spin_ns) {
			/* Busy-poll window: look again without sleeping (no wake-up to pay). */
			spinning = 1;
		} else {
			kvx_waiter_prepare(&ctl->waiter);
			if (inboxes_pending(ctl) ||
			    atomic_load_explicit(&ctl->watch_gen, memory_order_seq_cst) != ws.gen ||
			    atomic_load_explicit(&ctl->stop_req, memory_order_acquire)) {
				kvx_waiter_cancel(&ctl->waiter);
			} else {
				prepared = 1;
				timeout = kvx_timer_heap_timeout_ms(ctl->timers, kvx_now_ns());
				if (timeout < 0 || timeout > MAX_POLL_MS)
					timeout = MAX_POLL_MS;
			}
		}
		nfds_t n = 0;
		pfd[n++] = (struct pollfd){.fd = kvx_waiter_fd(&ctl->waiter), .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = hs_fd, .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = nt_fd, .events = POLLIN};
		for (uint32_t k = 0; k < ws.n; k++)
			pfd[n++] = (struct pollfd){.fd = ws.w[k].fd, .events = POLLIN};
		nfds_t jbase = n;
		uint32_t nj = 0;
		for (struct hs_job *j = ctl->hs_active; j && nj < ctl->p.max_active_handshakes;
		     j = j->next) {
			int fd = j->sock ? sock_fd(j->sock) : -1;
			if (fd < 0)
				continue;
			jobs[nj++] = j;
			pfd[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
		}
		int rc = poll(pfd, n, timeout);
		/* Drain the eventfd only when it fired: a sleep ended by a socket or the timeout has
		 * nothing to read (one read(2) less per received message). A wake racing with the
		 * cancel leaves the eventfd readable, so the next poll returns at once. */
		if (rc > 0 && pfd[0].revents)
			kvx_waiter_finish(&ctl->waiter);
		else if (prepared)
			kvx_waiter_cancel(&ctl->waiter);
		if (rc <= 0) {
			if (spinning)
				sched_yield(); /* a thread sharing this CPU runs first */
			continue;
		}
		if (pfd[1].revents) {
			hs_due = hs_rx(ctl) == RX_BATCH;
			last_work = kvx_now_ns();
		}
		if (pfd[2].revents) {
			nt_due = notify_rx(ctl) == RX_BATCH;
			last_work = kvx_now_ns();
		}
		for (uint32_t k = 0; k < ws.n; k++) {
			short re = pfd[3 + k].revents;
			if (!re)
				continue;
			/* The table changed (a callback or another thread unwatched): entries are
			 * stale until the next sync; level-triggered fds report again then. */
			if (atomic_load_explicit(&ctl->watch_gen, memory_order_acquire) != ws.gen)
				break;
			if (re & POLLIN)
				ws.w[k].cb(ws.w[k].arg);
			else
				watch_suspend(ctl, ws.w[k].fd); /* POLLERR / POLLHUP / POLLNVAL */
		}
		for (uint32_t k = 0; k < nj; k++) {
			if (!pfd[jbase + k].revents)
				continue;
			/* A job may have finished (and been freed) by an earlier one's callback
			 * only through its own timer, which runs at the loop top, so jobs[k] is
			 * still on the active list here. The job reads until EAGAIN. */
			job_on_readable(ctl, jobs[k]);
		}
	}
	/* Shutdown: take in what producers already queued, then cancel queued and running
	 * handshakes (each gets its on_done); LINGER 0 means no peer blocks us. */
	while (drain_inboxes(ctl))
		;
	while (ctl->hs_active)
		job_finish(ctl, ctl->hs_active, -ECANCELED, "cancelled");
	while (ctl->hs_queue_head) {
		struct hs_job *j = ctl->hs_queue_head;
		ctl->hs_queue_head = j->next;
		job_cancel_unstarted(ctl, j);
	}
	ctl->hs_queue_tail = NULL;
	watch_loop_live(ctl, 0);
	t_ctl_self = NULL;
	free(pfd);
	free(jobs);
	return NULL;
}
