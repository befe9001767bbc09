/* SPDX-License-Identifier: Apache-2.0 */
/* The engine: ties the lcores, the control lcore and a transport provider together and drives
 * both transfer modes on both roles (PROTOCOL.md §1.3, §1.4, §5 with §6 fixed; DESIGN.md §1).
 *
 * Threads and ownership:
 *  - app thread: every public call. Owns the transfer registry (`reg`, duplicate ids), the peer
 *    identities (`peers[]`, handshake start through its own control inbox) and the pool of
 *    transfer objects (`xpool`, block-id arena, per-layer arrays: all preallocated at start;
 *    a submission takes a free object, the last polled completion gives it back).
 *  - polling lcore k (0..n_po-1): owns the transfers whose id hashes to k (tid_poller(), the
 *    same function on every thread, so a notification is routed to the poller that owns its
 *    transfer with no shared state): their state machines (`tab`), posting, completion
 *    polling of its own endpoint of every peer connection (link k), timeouts, outbound
 *    notifications (its own control inbox). Poller 0 also runs the tcp target progress and
 *    the reader fence (both act on the context's accepted endpoints).
 *  - control lcore: handshakes (make_blob / on_done), connection accept, inbound
 *    notifications; it publishes peer connections (`struct conn`: epoch, one endpoint per
 *    polling lcore, remote regions, num_blocks) in the RCU table `conns` keyed by peer id, and
 *    routes notifications to the owning poller's ring.
 * Rings (all SPSC, element rings of fixed messages), per polling lcore k: app->k `sub`,
 * control->k `cin`, k->app `cpl`, k->control (its control inbox `ib`).
 * Peer connections: pollers look a peer's connection up in the RCU table (QSBR: their poll
 * loop announces a quiescent state once per iteration) and take a reference while a transfer
 * or a poll list uses it; a re-handshake (endpoint error, peer restart: new epoch) publishes a
 * new connection that replaces the old entry; the old one is destroyed only after a grace
 * period AND once its last reference is dropped (conn_put()). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kvxfer/control.h"
#include "kvxfer/engine.h"
#include "kvxfer/lcore.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"
#include "runtime_internal.h"

enum msg_type {
	M_SUBMIT = 1,
	M_LAYER_READY = 2,
	M_SEAL = 3,
	M_ABORT = 4,
	M_NOTIFY = 5,
	M_PEER_READY = 6,
	M_PEER_FAILED = 7,
	M_PEER_CHECKED = 8, /* a metadata-only epoch check of the peer finished */
};

struct emsg {
	uint32_t type;
	uint32_t u32;   /* layer / n_layers / notify type */
	int32_t status; /* error / decode rank */
	uint32_t n;     /* block count */
	void *ptr;      /* xf*, peer*, legacy ready flag, malloc'ed block ids */
	uint64_t u64;   /* consumer_tp_size (release) / sender epoch (remote_blocks) */
	struct kvx_mem_event ev; /* M_LAYER_READY: the layer's readiness event (by value) */
	char tid[KVX_ENGINE_ID_MAX];
	uint8_t pad[256 - 32 - sizeof(struct kvx_mem_event) - KVX_ENGINE_ID_MAX];
};
_Static_assert(sizeof(struct emsg) == 256, "ring element size");

struct cmsg {
	struct kvx_completion c;
	void *xf;
	uint32_t last;
	uint32_t pad;
};

enum xf_kind {
	XK_READ = 1,     /* consumer READ */
	XK_ANNOUNCE = 2, /* consumer WRITE */
	XK_WRITE = 3,    /* producer WRITE */
	XK_SERVE = 4,    /* producer READ */
};

enum hs_state {
	HS_IDLE = 0,
	HS_PENDING = 1,
	HS_READY = 2,
	HS_FAILED = 3,
};

struct layer {
	char name[KVX_ENGINE_NAME_MAX];
	void *base;
	struct kvx_layout_tensor t;
	struct kvx_layout_spec spec;
	struct kvx_layout_geom geom;
	uint64_t span;
	struct kvx_xport_mr *mr[2]; /* per transport context (engine xctx[]) */
	enum kvx_engine_mem mem;
	int device_id;
};

_Static_assert((int)KVX_ENGINE_MEM_HOST == (int)KVX_XPORT_MEM_HOST &&
		       (int)KVX_ENGINE_MEM_HIP == (int)KVX_XPORT_MEM_HIP &&
		       (int)KVX_ENGINE_MEM_HOSTDEV == (int)KVX_XPORT_MEM_HOSTDEV,
	       "engine and transport memory types share values");

struct kvx_engine;
struct poller;
struct conn;

/* A peer worker's identity (immutable after creation by the app thread) and handshake state. */
struct peer {
	struct kvx_engine *e;
	uint64_t id; /* key in the engine's RCU table of connections */
	char host[KVX_ENGINE_HOST_MAX];
	uint16_t hs_port, notify_port;
	uint32_t dp_rank, dp_size_local, tp_size;
	/* Multi-pod (PROTOCOL.md §5.8): per-pod hosts; ranks [k*dp_size_local, (k+1)*dp_size_local)
	 * live on pod_host[k]. Part of the peer's identity, so a transfer's routing is fixed at
	 * submission and a later transfer with other hosts is another peer. */
	char pod_host[KVX_ENGINE_MAX_PODS][KVX_ENGINE_HOST_MAX];
	const char *pod_ptr[KVX_ENGINE_MAX_PODS];
	uint32_t n_pods;
	atomic_int hs_state; /* enum hs_state; CAS by the app thread and the pollers */
	atomic_int hs_error; /* control thread: the failed handshake's errno, stored before HS_FAILED */
	/* Control thread: endpoints of the handshake in flight, [link][candidate context]. */
	struct kvx_xport_ep *hs_ep[KVX_ENGINE_MAX_POLLERS][2];
	uint64_t epoch; /* control thread: epoch of the last published connection */
	uint64_t gen;   /* control thread: connections published */
	/* Epoch check (P WRITE, consumer restart): a metadata-only handshake; a poller starts one
	 * (check_busy CAS) and numbers it (check_started); the control thread stores the epoch it
	 * saw (0: failed) and then the number of the finished job in check_done (release). */
	atomic_bool check_busy;
	_Atomic uint64_t check_started, check_done, checked_epoch;
	_Atomic uint64_t bytes, ops, transfers, failures;
};

/* One polling lcore's endpoint of a connection. */
struct clink {
	struct kvx_xport_ep *ep;
	struct kvx_xport_rmr **rmr; /* Array[n_layers] */
	/* Owned by poller k. */
	uint32_t outstanding;
	bool listed;
	uint64_t last_ok_ns; /* last successful completion on this link */
	struct conn *next; /* poller k's poll list */
};

/* A peer connection (one handshake's result), published in the RCU table; immutable once
 * published except the atomics and the per-link poller fields. */
struct conn {
	struct kvx_engine *e;
	struct peer *pr;
	uint64_t epoch, gen;
	uint32_t xi; /* index of the endpoints' context in the engine's xctx[] */
	uint32_t n_links;
	uint64_t remote_num_blocks;
	struct kvx_layout_geom *geom; /* Array[n_layers] */
	_Atomic uint32_t refs;        /* 1 for the table + transfers + poll lists */
	atomic_bool stale;            /* an endpoint entered error state: no new transfer binds */
	struct conn *next_dead;       /* a poller's list of conns to destroy (acc_lock busy) */
	struct clink link[];
};

/* Layer readiness (P WRITE): the legacy host flag or an event. */
struct lgate {
	const atomic_uint *flag;
	struct kvx_mem_event ev;
};

struct xf {
	char tid[KVX_ENGINE_ID_MAX];
	enum xf_kind kind;
	struct peer *peer;
	struct poller *po;  /* owning poller */
	struct conn *conn;  /* poller: bound connection (a reference), or NULL */
	uint32_t *lblocks;  /* Array[max_blocks] in the engine's arena */
	uint32_t *rblocks;  /* Array[max_blocks] in the engine's arena */
	size_t n;
	uint32_t consumer_tp;
	uint64_t start_ns;
	/* App-visible: per-layer completion bits and the final outcome (release stores). */
	_Atomic uint64_t layer_done[KVX_ENGINE_MAX_LAYERS / 64];
	atomic_int final; /* 0 pending, else 1 + enum kvx_cpl_status */
	atomic_int final_error;
	/* Poller-owned. */
	uint32_t live_idx;
	uint32_t slot; /* index in the engine's pool; used in completion cookies */
	bool live;
	uint32_t next_layer;
	uint32_t batches_out;
	uint32_t *layer_batches; /* Array[n_layers] */
	struct lgate *gate;      /* Array[n_layers] */
	uint64_t want_post[KVX_ENGINE_MAX_LAYERS / 64];
	bool reported, released, failed, aborted, timed_out, done_posting, release_sent;
	bool fence_pending; /* P READ: defer timeout passed, blocks held until the wire is fenced */
	bool await_rehs;    /* D READ: nothing landed before the endpoint died; decide after re-handshake */
	uint64_t fence_ticket;
	uint64_t peer_epoch; /* D READ: the peer epoch its first op was posted against */
	uint64_t alloc_epoch; /* P WRITE: epoch of the consumer incarnation that sent remote_blocks, 0 unknown */
	bool alloc_known;     /* P WRITE: alloc_epoch is settled (an epoch, or 0 = bind any) */
	atomic_bool alloc_known_pub; /* the same, for the runtime_internal.h test hook */
	bool check_wait;      /* P WRITE: waiting for the peer's epoch check */
	uint64_t check_need;  /* P WRITE: first check job number that started after the request */
	int error;
	uint64_t bytes;
	uint64_t quarantine_deadline;
	uint32_t next_free; /* app thread free list */
};

struct poller {
	struct kvx_engine *e;
	uint32_t k;
	struct kvx_lcore *lc;
	struct kvx_ring *sub, *cin, *cpl;
	struct kvx_ctl_inbox *ib;
	struct kvx_xfer_table *tab;
	struct xf **live;
	uint32_t n_live;
	struct kvx_plan_cache *pc;
	struct kvx_xport_op *ops;
	struct conn *plist; /* connections with ops outstanding on link k */
	struct conn *dead;  /* unreferenced connections waiting for acc_lock */
	uint64_t next_scan_ns;
	uint32_t n_fence_pending;
	_Atomic uint64_t st_bytes, st_ops, st_transfers, st_failures;
};

/* A transport context's async-event fd watched by the control lcore. */
struct evwatch {
	struct kvx_engine *e;
	uint32_t k; /* index in xctx[] */
	int fd;
};

struct kvx_engine {
	struct kvx_engine_params p;
	char host[KVX_ENGINE_HOST_MAX];
	char transport[16];
	char lcores[128];
	char proxy[128], http[128];
	char auth_dir[1024]; /* copy of p.auth_dir (issue 17) */
	bool started, stopped;
	uint32_t n_layers;
	struct layer layers[KVX_ENGINE_MAX_LAYERS];
	struct kvx_lcore_set *set;
	/* xctx[0]: the provider named by `transport` (auto: verbs if usable, else tcp); xctx[1]:
	 * auto only, shm for same-host peers when CMA is permitted (NULL otherwise). */
	struct kvx_xport_ctx *xctx[2];
	struct kvx_xport_caps caps[2];
	uint32_t n_xctx;
	bool has_hip; /* a layer is device memory (HIP or hostdev): `auto` does not add shm */
	int hip_probe; /* app thread: 0 not probed, 1 HIP device usable, else -errno */
	char hip_why[KVX_MEM_WHY_LEN];
	_Atomic(const char *) last_xport; /* provider of the latest peer connection set up */
	struct kvx_ctl *ctl;
	struct evwatch evw[2];
	struct kvx_ctl_inbox *app_ib;
	struct poller *po[KVX_ENGINE_MAX_POLLERS];
	uint32_t n_po;
	struct kvx_rcu_table *conns; /* peer id -> struct conn (control publishes, pollers read) */
	/* app thread */
	struct kvx_xfer_table *reg;
	struct peer peers[KVX_ENGINE_MAX_PEERS];
	uint32_t n_peers;
	struct xf *xpool;         /* Array[max_transfers] */
	uint32_t xfree;           /* free list head, index+1 */
	uint32_t *arena;          /* block ids: Array[max_transfers * 2 * max_blocks], mmap'ed */
	size_t arena_bytes;
	uint32_t *lb_pool;        /* Array[max_transfers * n_layers] */
	struct lgate *gate_pool;  /* Array[max_transfers * n_layers] */
	uint32_t cpl_rr;
	/* control thread; poller 0 destroys them to fence readers (acc_lock, trylock only) */
	pthread_mutex_t acc_lock;
	struct kvx_xport_ep **accepted;
	uint32_t n_accepted, cap_accepted;
	_Atomic uint64_t fence_req, fence_done; /* fences asked by any poller / done by poller 0 */
	struct kvx_waiter app_w; /* kvx_xfer_layer_wait() sleeps here; the pollers wake it */
	bool app_w_init;
	_Atomic uint32_t test_hold_layers; /* runtime_internal.h test hook; UINT32_MAX = off */
	_Atomic uint64_t st_done, st_failed, st_aborted, st_timed_out, st_late, st_quar, st_notify_drop, st_fences,
		st_peer_resets;
	uint64_t st_dup, st_nobufs;
	struct kvx_ratelimit rl_nobufs;
};

/* Polling lcore that owns a transfer id: FNV-1a of the id, the same on every thread. */
static uint32_t tid_poller(const struct kvx_engine *e, const char *tid)
{
	uint32_t h = 2166136261u;
	for (; *tid; tid++)
		h = (h ^ (uint8_t)*tid) * 16777619u;
	return e->n_po > 1 ? h % e->n_po : 0;
}
static bool auto_shm_disabled(void)
{
	const char *v = getenv("KVX_ENGINE_AUTO_NO_SHM");
	return v && v[0] && strcmp(v, "0");
}

static uint64_t ms_ns(uint32_t ms)
{
	return (uint64_t)ms * 1000000ull;
}

/* ---------------------------------------------------------------------------------------- */
/* Parameters                                                                                */
/* ---------------------------------------------------------------------------------------- */

KVX_API void kvx_engine_params_init(struct kvx_engine_params *p)
{
	memset(p, 0, sizeof(*p));
	p->role = KVX_SCHED_CONSUMER;
	p->mode = KVX_SCHED_MODE_WRITE;
	p->transport = "auto";
	p->control_lcore = UINT32_MAX;
	p->idle = KVX_ENGINE_IDLE_ADAPTIVE;
	p->host = "127.0.0.1";
	p->handshake_port = KVX_CTL_DEFAULT_HANDSHAKE_PORT;
	p->notify_port = KVX_CTL_DEFAULT_NOTIFY_PORT;
	p->dp_size = 1;
	p->tp_size = 1;
	p->handshake_timeout_ms = 10000;
	p->transfer_timeout_ms = 30000;
	p->defer_timeout_ms = 60000;
	p->max_transfers = 1024;
	p->max_blocks = 8192;
}

static int bad(char *err, size_t errlen, const char *field, const char *why)
{
	if (err && errlen)
		snprintf(err, errlen, "engine params: %s: %s", field, why);
	kvx_log(KVX_LOG_ERROR, "engine params: %s: %s", field, why);
	return -EINVAL;
}

static int copy_str(char *dst, size_t cap, const char *src)
{
	if (!src)
		return 0;
	size_t n = strnlen(src, cap);
	if (n >= cap)
		return -EINVAL;
	memcpy(dst, src, n + 1);
	return 0;
}

KVX_API int kvx_engine_create(const struct kvx_engine_params *p, struct kvx_engine **out, char *err,
			      size_t errlen)
{
	if (!p || !out)
		return bad(err, errlen, "params", "NULL params or out");
	if (p->role != KVX_SCHED_PRODUCER && p->role != KVX_SCHED_CONSUMER)
		return bad(err, errlen, "role", "must be KVX_SCHED_PRODUCER or KVX_SCHED_CONSUMER");
	if (p->mode != KVX_SCHED_MODE_READ && p->mode != KVX_SCHED_MODE_WRITE)
		return bad(err, errlen, "mode", "must be KVX_SCHED_MODE_READ or KVX_SCHED_MODE_WRITE");
	const char *tr = p->transport ? p->transport : "auto";
	if (strcmp(tr, "auto") && strcmp(tr, "tcp") && strcmp(tr, "shm") && strcmp(tr, "verbs"))
		return bad(err, errlen, "transport", "must be auto, verbs, tcp or shm");
	if (!p->host || !*p->host || strlen(p->host) >= KVX_ENGINE_HOST_MAX)
		return bad(err, errlen, "host", "required, 1..63 bytes");
	if (p->idle != KVX_ENGINE_IDLE_BUSY && p->idle != KVX_ENGINE_IDLE_ADAPTIVE)
		return bad(err, errlen, "idle", "must be BUSY or ADAPTIVE");
	if (p->dp_size == 0)
		return bad(err, errlen, "dp_size", "must be > 0");
	if (p->dp_rank >= p->dp_size)
		return bad(err, errlen, "dp_rank", "must be < dp_size");
	if (p->tp_size == 0)
		return bad(err, errlen, "tp_size", "must be > 0");
	if (p->tp_rank >= p->tp_size)
		return bad(err, errlen, "tp_rank", "must be < tp_size");
	if (p->handshake_timeout_ms == 0)
		return bad(err, errlen, "handshake_timeout_ms", "must be > 0");
	if (p->transfer_timeout_ms == 0)
		return bad(err, errlen, "transfer_timeout_ms", "must be > 0");
	if (p->defer_timeout_ms == 0)
		return bad(err, errlen, "defer_timeout_ms", "must be > 0");
	if (p->max_transfers == 0 || p->max_transfers > (1u << 20))
		return bad(err, errlen, "max_transfers", "must be in 1..1048576");
	if (p->max_blocks == 0 || p->max_blocks > (1u << 24))
		return bad(err, errlen, "max_blocks", "must be in 1..16777216");
	if (p->proxy_addr && *p->proxy_addr && (!p->http_addr || !*p->http_addr))
		return bad(err, errlen, "http_addr", "required with proxy_addr");
	if (p->lcores && strlen(p->lcores) >= 128)
		return bad(err, errlen, "lcores", "longer than 127 bytes");

	struct kvx_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->p = *p;
	copy_str(e->host, sizeof(e->host), p->host);
	copy_str(e->transport, sizeof(e->transport), tr);
	copy_str(e->lcores, sizeof(e->lcores), p->lcores);
	if (copy_str(e->proxy, sizeof(e->proxy), p->proxy_addr) || copy_str(e->http, sizeof(e->http), p->http_addr)) {
		free(e);
		return bad(err, errlen, "proxy_addr/http_addr", "longer than 127 bytes");
	}
	if (copy_str(e->auth_dir, sizeof(e->auth_dir), p->auth_dir)) {
		free(e);
		return bad(err, errlen, "auth_dir", "longer than 1023 bytes");
	}
	e->p.auth_dir = e->auth_dir[0] ? e->auth_dir : NULL;
	e->p.host = e->host;
	e->p.transport = e->transport;
	e->p.lcores = e->lcores[0] ? e->lcores : NULL;
	e->p.proxy_addr = e->proxy[0] ? e->proxy : NULL;
	e->p.http_addr = e->http[0] ? e->http : NULL;
	int rc = kvx_xfer_table_create(2 * p->max_transfers + 64, p->max_transfers, &e->reg);
	if (rc) {
		free(e);
		return rc;
	}
	atomic_init(&e->test_hold_layers, UINT32_MAX);
	rc = -pthread_mutex_init(&e->acc_lock, NULL);
	if (rc) {
		kvx_xfer_table_destroy(e->reg);
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

static uint64_t tensor_span(const struct kvx_layout_tensor *t)
{
	uint64_t last = 0;
	for (uint32_t i = 0; i < t->ndim; i++)
		last += (t->shape[i] - 1) * t->stride[i];
	return (last + 1) * t->elem_size;
}

KVX_API int kvx_engine_register_layer(struct kvx_engine *e, const struct kvx_engine_layer *l)
{
	if (!e || !l || !l->name || !*l->name || !l->base) {
		kvx_log(KVX_LOG_ERROR, "engine: register_layer: NULL engine, layer, name or base");
		return -EINVAL;
	}
	if (e->started)
		return -EBUSY;
	if (e->n_layers == KVX_ENGINE_MAX_LAYERS)
		return -ENOBUFS;
	if (strlen(l->name) >= KVX_ENGINE_NAME_MAX) {
		kvx_log(KVX_LOG_ERROR, "engine: layer name '%.32s...' longer than %d bytes", l->name,
			KVX_ENGINE_NAME_MAX - 1);
		return -EINVAL;
	}
	if (l->mem != KVX_ENGINE_MEM_HOST && l->mem != KVX_ENGINE_MEM_HIP && l->mem != KVX_ENGINE_MEM_HOSTDEV) {
		kvx_log(KVX_LOG_ERROR, "engine: layer '%s': mem %d is not host, hip or hostdev", l->name, (int)l->mem);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < e->n_layers; i++) {
		if (!strcmp(e->layers[i].name, l->name)) {
			kvx_log(KVX_LOG_ERROR, "engine: layer '%s' registered twice", l->name);
			return -EINVAL;
		}
	}
	struct layer *ly = &e->layers[e->n_layers];
	char msg[200];
	int rc = kvx_layout_geometry(&l->spec, &l->tensor, 0, &ly->geom, msg, sizeof(msg));
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "engine: layer '%s': %s", l->name, msg);
		return rc;
	}
	if (e->n_layers && ly->geom.num_blocks != e->layers[0].geom.num_blocks) {
		kvx_log(KVX_LOG_ERROR, "engine: layer '%s': num_blocks %llu differs from the first layer's %llu",
			l->name, (unsigned long long)ly->geom.num_blocks,
			(unsigned long long)e->layers[0].geom.num_blocks);
		return -EINVAL;
	}
	e->has_hip |= l->mem != KVX_ENGINE_MEM_HOST;
	ly->mem = l->mem;
	ly->device_id = l->mem == KVX_ENGINE_MEM_HIP ? l->device_id : 0;
	strcpy(ly->name, l->name);
	ly->base = l->base;
	ly->t = l->tensor;
	ly->spec = l->spec;
	ly->span = tensor_span(&l->tensor);
	return (int)e->n_layers++;
}

/* ---------------------------------------------------------------------------------------- */
/* Control-thread callbacks                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------- */
/* Control-thread callbacks                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void cin_push(struct kvx_engine *e, uint32_t k, const struct emsg *m)
{
	if (!kvx_ring_enqueue_elem_burst_sp(e->po[k]->cin, m, 1, NULL)) {
		atomic_fetch_add_explicit(&e->st_notify_drop, 1, memory_order_relaxed);
		if (m->type == M_NOTIFY)
			free(m->ptr);
	}
}

static void on_notify(void *arg, const struct kvx_msg_notify *msg)
{
	struct kvx_engine *e = arg;
	bool producer = e->p.role == KVX_SCHED_PRODUCER;
	enum kvx_msg_type t = msg->type;
	/* Role filter (PROTOCOL.md §3.2): P takes remote_blocks and release, D takes write_done;
	 * a legacy plain id is a release on P and a write completion on D. */
	if (t == KVX_MSG_COMPLETION)
		t = producer ? KVX_MSG_RELEASE : KVX_MSG_WRITE_DONE;
	bool ok = producer ? (t == KVX_MSG_REMOTE_BLOCKS || t == KVX_MSG_RELEASE) : t == KVX_MSG_WRITE_DONE;
	if (!ok || strlen(msg->transfer_id) >= KVX_ENGINE_ID_MAX || !msg->transfer_id[0]) {
		atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		return;
	}
	struct emsg m = {.type = M_NOTIFY, .u32 = (uint32_t)t};
	strcpy(m.tid, msg->transfer_id);
	if (t == KVX_MSG_REMOTE_BLOCKS) {
		if (msg->num_blocks == 0 || msg->num_blocks > e->p.max_blocks) {
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
			return;
		}
		uint32_t *ids = malloc(msg->num_blocks * sizeof(*ids)); /* control path */
		if (!ids)
			return;
		memcpy(ids, msg->block_ids, msg->num_blocks * sizeof(*ids));
		m.ptr = ids;
		m.n = msg->num_blocks;
		m.status = (int32_t)(msg->decode_rank < 0 ? 0 : msg->decode_rank);
		m.u64 = msg->sender_epoch; /* the allocating incarnation, 0 from a MoRIIO peer */
	} else {
		m.u64 = msg->consumer_tp_size ? msg->consumer_tp_size : 1;
	}
	cin_push(e, tid_poller(e, m.tid), &m);
}

static int connect_locked(struct kvx_engine *e, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b,
			  size_t *len_b);

/* Every control-thread transport call runs under acc_lock: poller 0's fence destroys target
 * endpoints and pollers destroy unreferenced connections on the same contexts (transport.h:
 * control-path calls one thread at a time). */
static int on_connect(void *arg, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b, size_t *len_b)
{
	struct kvx_engine *e = arg;
	pthread_mutex_lock(&e->acc_lock);
	int rc = connect_locked(e, blob_a, len_a, blob_b, len_b);
	pthread_mutex_unlock(&e->acc_lock);
	return rc;
}

/* Provider codes in the engine's connection blobs (stable wire values). */
static uint8_t xport_code(const char *name)
{
	return !strcmp(name, "tcp") ? 1 : !strcmp(name, "shm") ? 2 : !strcmp(name, "verbs") ? 3 : 0;
}

static const char *xport_code_name(uint8_t code)
{
	return code == 1 ? "tcp" : code == 2 ? "shm" : code == 3 ? "verbs" : "?";
}

/* Index of this engine's context for provider @p code, or -1. */
static int xctx_index(const struct kvx_engine *e, uint8_t code)
{
	for (uint32_t i = 0; i < e->n_xctx; i++)
		if (xport_code(kvx_xport_name(e->xctx[i])) == code)
			return (int)i;
	return -1;
}

/* Connection blobs (kvxfer <-> kvxfer). The initiator offers one endpoint per polling lcore
 * (links) for each candidate provider, in its order of preference:
 *   A = [u8 n_candidates][u8 n_links] n_candidates x ([u8 code] n_links x ([u32 len][xport blob A]))
 * The responder takes the first candidate it has a context for and whose accepts all succeed
 * (shm checks same host and CMA there), so a wrong same-host guess degrades to the next
 * candidate (tcp) instead of failing the handshake:
 *   B = [u8 code][u8 n_links] n_links x ([u32 len][xport blob B]) [u32 n_regions][n x RDESC][u64 num_blocks]. */
static int connect_locked(struct kvx_engine *e, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b,
			  size_t *len_b)
{
	size_t cap = *len_b;
	if (len_a < 2 || blob_a[0] == 0 || blob_a[0] > 4 || blob_a[1] == 0 || blob_a[1] > KVX_ENGINE_MAX_POLLERS) {
		kvx_log(KVX_LOG_WARN, "engine: connect: blob A has %u transport candidates (1..4) and %u links (1..%d)",
			len_a ? blob_a[0] : 0u, len_a > 1 ? blob_a[1] : 0u, KVX_ENGINE_MAX_POLLERS);
		return -EPROTO;
	}
	uint32_t nc = blob_a[0], nl = blob_a[1];
	size_t need = 2 + (size_t)nl * (4 + KVX_XPORT_BLOB_MAX) + 4 + (size_t)e->n_layers * KVX_XPORT_RDESC_BYTES + 8;
	if (cap < need)
		return -EMSGSIZE;
	if (e->n_accepted + nl > e->cap_accepted) {
		uint32_t ncap = e->cap_accepted ? 2 * e->cap_accepted : 16;
		while (ncap < e->n_accepted + nl)
			ncap *= 2;
		struct kvx_xport_ep **na = realloc(e->accepted, ncap * sizeof(*na));
		if (!na)
			return -ENOMEM;
		e->accepted = na;
		e->cap_accepted = ncap;
	}
	struct kvx_xport_ep *eps[KVX_ENGINE_MAX_POLLERS] = {0};
	size_t pos = 2, out = 2;
	int rc = -EPROTO, xi = -1;
	bool ok = false;
	char offered[64] = "";
	for (uint32_t c = 0; c < nc && !ok; c++) {
		if (len_a < pos + 1)
			return -EPROTO;
		uint8_t code = blob_a[pos++];
		size_t ol = strlen(offered);
		snprintf(offered + ol, sizeof(offered) - ol, "%s%s", ol ? "," : "", xport_code_name(code));
		xi = xctx_index(e, code);
		out = 2;
		uint32_t got = 0;
		for (uint32_t l = 0; l < nl; l++) {
			uint32_t cl;
			if (len_a < pos + 4)
				return -EPROTO;
			memcpy(&cl, blob_a + pos, 4);
			pos += 4;
			if (cl > len_a - pos)
				return -EPROTO;
			if (xi >= 0 && got == l) {
				size_t xl = 0;
				rc = kvx_xport_ep_accept(e->xctx[xi], blob_a + pos, cl, &eps[l], blob_b + out + 4,
							 KVX_XPORT_BLOB_MAX, &xl);
				if (rc == 0) {
					/* Target side: the group of the initiator's link (verbs responder QPs
					 * raise no completions here, so a refusal only costs locality). */
					(void)kvx_xport_ep_set_group(eps[l], l % e->n_po);
					uint32_t x32 = (uint32_t)xl;
					memcpy(blob_b + out, &x32, 4);
					out += 4 + xl;
					got++;
				}
			}
			pos += cl;
		}
		if (xi >= 0 && got == nl) {
			ok = true;
		} else {
			for (uint32_t l = 0; l < got; l++) {
				kvx_xport_ep_destroy(eps[l]);
				eps[l] = NULL;
			}
			if (xi >= 0 && c + 1 < nc)
				kvx_log(KVX_LOG_INFO, "engine: connect: %s not usable with this peer (%s), trying the next",
					xport_code_name(code), kvx_strerror(rc));
		}
	}
	if (!ok) {
		if (rc == -EPROTO)
			kvx_log(KVX_LOG_ERROR, "engine: connect: peer offers transport %s, this engine uses %s",
				offered, e->transport);
		return rc;
	}
	for (uint32_t l = 0; l < nl; l++)
		e->accepted[e->n_accepted++] = eps[l];
	blob_b[0] = xport_code(kvx_xport_name(e->xctx[xi]));
	blob_b[1] = (uint8_t)nl;
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[xi]));
	uint32_t nreg = e->n_layers;
	memcpy(blob_b + out, &nreg, 4);
	out += 4;
	for (uint32_t i = 0; i < nreg; i++) {
		rc = kvx_xport_mr_export(e->layers[i].mr[xi], blob_b + out, KVX_XPORT_RDESC_BYTES, NULL);
		if (rc)
			return rc;
		out += KVX_XPORT_RDESC_BYTES;
	}
	uint64_t nb = e->layers[0].geom.num_blocks;
	memcpy(blob_b + out, &nb, 8);
	*len_b = out + 8;
	return 0;
}

static void hs_eps_destroy(struct peer *pr)
{
	for (uint32_t l = 0; l < KVX_ENGINE_MAX_POLLERS; l++) {
		for (uint32_t c = 0; c < 2; c++) {
			kvx_xport_ep_destroy(pr->hs_ep[l][c]);
			pr->hs_ep[l][c] = NULL;
		}
	}
}

static int make_blob(void *arg, uint32_t dp_rank, const struct kvx_msg_meta *remote, uint8_t *blob_a, size_t cap,
		     size_t *len_a)
{
	(void)dp_rank;
	(void)remote;
	struct peer *pr = arg;
	/* New endpoints for a new connection: the published one (if any) stays untouched until
	 * it is replaced and unreferenced. */
	struct kvx_engine *e = pr->e;
	pthread_mutex_lock(&e->acc_lock);
	hs_eps_destroy(pr);
	size_t pos = 2;
	int rc = 0;
	/* Candidates: shm first when this engine has it (auto), then the primary provider. */
	for (uint32_t k = 0; k < e->n_xctx && !rc; k++) {
		uint32_t xi = e->n_xctx - 1 - k;
		if (cap < pos + 1) {
			rc = -EMSGSIZE;
			break;
		}
		blob_a[pos++] = xport_code(kvx_xport_name(e->xctx[xi]));
		for (uint32_t l = 0; l < e->n_po && !rc; l++) {
			size_t xl = 0;
			if (cap < pos + 4) {
				rc = -EMSGSIZE;
				break;
			}
			/* Link l is driven by polling lcore l: its poll group (one CQ per group on verbs). */
			rc = kvx_xport_ep_create_in_group(e->xctx[xi], l, &pr->hs_ep[l][xi], blob_a + pos + 4,
							  cap - pos - 4, &xl);
			if (rc)
				break;
			uint32_t x32 = (uint32_t)xl;
			memcpy(blob_a + pos, &x32, 4);
			pos += 4 + xl;
		}
	}
	if (rc) {
		hs_eps_destroy(pr);
	} else {
		blob_a[0] = (uint8_t)e->n_xctx;
		blob_a[1] = (uint8_t)e->n_po;
		*len_a = pos;
	}
	pthread_mutex_unlock(&e->acc_lock);
	return rc;
}

/* Destroy a connection's endpoints and imported regions (acc_lock held). */
static void conn_destroy(struct conn *c)
{
	for (uint32_t l = 0; l < c->n_links; l++) {
		kvx_xport_ep_destroy(c->link[l].ep); /* frees its imported regions too */
		free(c->link[l].rmr);
	}
	free(c->geom);
	free(c);
}

/* Drop a reference. The last one destroys the connection: at once where blocking on acc_lock
 * is fine (po NULL: the RCU callback thread, the app thread at stop), else on the poller's
 * dead list until acc_lock is free (pollers never block). */
static void conn_reap(struct poller *po);
static void conn_put(struct poller *po, struct conn *c)
{
	if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (!po) {
		struct kvx_engine *e = c->e;
		pthread_mutex_lock(&e->acc_lock);
		conn_destroy(c);
		pthread_mutex_unlock(&e->acc_lock);
		return;
	}
	c->next_dead = po->dead;
	po->dead = c;
	conn_reap(po);
}

static void conn_reap(struct poller *po)
{
	if (!po->dead || pthread_mutex_trylock(&po->e->acc_lock))
		return;
	while (po->dead) {
		struct conn *c = po->dead;
		po->dead = c->next_dead;
		conn_destroy(c);
	}
	pthread_mutex_unlock(&po->e->acc_lock);
}

/* RCU table free_fn: runs after a grace period for a replaced or deleted connection. */
static void conn_table_free(void *value, void *ctx)
{
	(void)ctx;
	conn_put(NULL, value);
}

/* The peer's advertised regions (metadata (a) + region map (b), PROTOCOL.md §3.1, §4.1) must be
 * what the §4.3 offsets assume for every local layer: split layers with the V plane exactly
 * es*remote_kv_stride above K, every plannable block inside the peer's memory region. */
static int check_peer_regions(struct kvx_engine *e, const struct peer *pr, const struct kvx_ctl_hs_rank *r,
			      uint64_t nb)
{
	if (!r->meta || !r->layers)
		return -EPROTO;
	struct kvx_layout_peer_layer *pl = calloc(e->n_layers, sizeof(*pl));
	uint32_t *per = calloc(e->n_layers, sizeof(*per));
	if (!pl || !per) {
		free(pl);
		free(per);
		return -ENOMEM;
	}
	char why[256] = "";
	for (uint32_t i = 0; i < e->n_layers; i++)
		per[i] = e->layers[i].geom.kind == KVX_LAYOUT_KIND_SPLIT ? 2 : 1;
	int n = kvx_layout_peer_regions(r->meta, r->layers, per, e->n_layers, pl, why, sizeof(why));
	int rc = n < 0 ? n : 0;
	for (uint32_t i = 0; !rc && i < e->n_layers; i++) {
		struct kvx_layout_geom g = e->layers[i].geom;
		kvx_layout_set_remote_blocks(&g, nb);
		rc = kvx_layout_check_peer_layer(&g, &pl[i], why, sizeof(why));
	}
	free(pl);
	free(per);
	if (rc)
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u advertises regions that do not match this engine's layers: %s",
			pr->host, pr->hs_port, why);
	return rc;
}

static int conn_build(struct peer *pr, const struct kvx_ctl_hs_rank *r, uint64_t epoch, struct conn **out)
{
	struct kvx_engine *e = pr->e;
	const uint8_t *b = r->blob_b;
	size_t len = r->blob_b_len, off;
	uint32_t nreg;
	uint64_t nb;
	if (!b || len < 2)
		return -EPROTO;
	int xi = xctx_index(e, b[0]);
	if (xi < 0 || !pr->hs_ep[0][xi]) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u chose transport %s, which this engine did not offer",
			pr->host, pr->hs_port, xport_code_name(b[0]));
		return -EPROTO;
	}
	if (b[1] != e->n_po) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u answered %u links, %u offered", pr->host, pr->hs_port, b[1],
			e->n_po);
		return -EPROTO;
	}
	/* Walk the links' blobs first (bounds), then the regions. */
	size_t xoff[KVX_ENGINE_MAX_POLLERS], xlen[KVX_ENGINE_MAX_POLLERS];
	off = 2;
	for (uint32_t l = 0; l < e->n_po; l++) {
		uint32_t xl;
		if (len < off + 4)
			return -EPROTO;
		memcpy(&xl, b + off, 4);
		if (xl > KVX_XPORT_BLOB_MAX || len < off + 4 + xl)
			return -EPROTO;
		xoff[l] = off + 4;
		xlen[l] = xl;
		off += 4 + xl;
	}
	if (len < off + 4)
		return -EPROTO;
	memcpy(&nreg, b + off, 4);
	off += 4;
	if (nreg != e->n_layers) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u has %u layers, this engine %u", pr->host, pr->hs_port, nreg,
			e->n_layers);
		return -EPROTO;
	}
	if (len != off + (size_t)nreg * KVX_XPORT_RDESC_BYTES + 8)
		return -EPROTO;
	memcpy(&nb, b + off + (size_t)nreg * KVX_XPORT_RDESC_BYTES, 8);
	if (nb == 0)
		return -EPROTO;
	int vrc = check_peer_regions(e, pr, r, nb);
	if (vrc)
		return vrc;
	struct conn *c = calloc(1, sizeof(*c) + e->n_po * sizeof(struct clink));
	if (!c)
		return -ENOMEM;
	c->e = e;
	c->pr = pr;
	c->epoch = epoch;
	c->xi = (uint32_t)xi;
	c->n_links = e->n_po;
	c->remote_num_blocks = nb;
	atomic_init(&c->refs, 1);
	c->geom = calloc(e->n_layers, sizeof(*c->geom));
	int rc = c->geom ? 0 : -ENOMEM;
	pthread_mutex_lock(&e->acc_lock);
	for (uint32_t l = 0; l < e->n_po; l++) {
		/* The connection owns the chosen endpoints from here on. */
		c->link[l].ep = pr->hs_ep[l][xi];
		pr->hs_ep[l][xi] = NULL;
	}
	hs_eps_destroy(pr); /* the candidate the responder did not take */
	for (uint32_t l = 0; !rc && l < e->n_po; l++) {
		c->link[l].rmr = calloc(nreg, sizeof(*c->link[l].rmr));
		rc = c->link[l].rmr ? kvx_xport_ep_connect(c->link[l].ep, b + xoff[l], xlen[l]) : -ENOMEM;
		for (uint32_t i = 0; !rc && i < nreg; i++)
			rc = kvx_xport_rmr_import(c->link[l].ep, b + off + (size_t)i * KVX_XPORT_RDESC_BYTES,
						  KVX_XPORT_RDESC_BYTES, &c->link[l].rmr[i]);
	}
	if (rc) {
		conn_destroy(c);
		pthread_mutex_unlock(&e->acc_lock);
		return rc;
	}
	pthread_mutex_unlock(&e->acc_lock);
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[xi]));
	for (uint32_t i = 0; i < nreg; i++) {
		c->geom[i] = e->layers[i].geom;
		kvx_layout_set_remote_blocks(&c->geom[i], nb);
	}
	*out = c;
	return 0;
}

/* Control thread: the context's device async-event fd is readable. Under acc_lock like every
 * control-path transport call; endpoints it moves to error state are then met by their
 * pollers (completion errors -> stale connection -> re-handshake). */
static void on_xport_events(void *arg)
{
	struct evwatch *w = arg;
	pthread_mutex_lock(&w->e->acc_lock);
	int n = kvx_xport_ctx_handle_events(w->e->xctx[w->k]);
	pthread_mutex_unlock(&w->e->acc_lock);
	if (n < 0)
		kvx_log(KVX_LOG_WARN, "engine: %s async events: %s", kvx_xport_name(w->e->xctx[w->k]), kvx_strerror(n));
}

/* Heterogeneous TP (PROTOCOL.md §4.2/§4.5): whole blocks move between different TP sizes only
 * when every rank holds whole KV heads; a peer that fails is rejected (its transfers fail with
 * the returned errno, the message names the values). MLA layers and unknown head counts
 * (spec.num_kv_heads 0) pass. */
static int hetero_tp_guard(struct peer *pr)
{
	struct kvx_engine *e = pr->e;
	uint32_t ptp = pr->tp_size ? pr->tp_size : e->p.tp_size;
	const struct kvx_layout_spec *sp = &e->layers[0].spec;
	if (sp->is_mla || sp->num_kv_heads == 0 || ptp == e->p.tp_size)
		return 0;
	char msg[200] = "";
	/* num_kv_heads is per rank: with replicated heads (tp_size > heads) it is 1 and the product
	 * overcounts, so the application's total_kv_heads wins when given. */
	uint32_t total = e->p.total_kv_heads ? e->p.total_kv_heads : sp->num_kv_heads * e->p.tp_size;
	int rc = kvx_layout_check_hetero_tp(e->p.tp_size, ptp, total, false, msg, sizeof(msg));
	if (rc)
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u dp %u rejected: %s", pr->host, pr->hs_port, pr->dp_rank, msg);
	return rc;
}

/* Control thread: the metadata-only epoch check of alloc_epoch_settle() finished. */
static void on_epoch_checked(void *arg, const struct kvx_ctl_hs_result *res)
{
	struct peer *pr = arg;
	struct kvx_engine *e = pr->e;
	if (res->status == -EBUSY) {
		/* A handshake with the same host:port runs: the waiting transfers retry. */
		atomic_store_explicit(&pr->check_busy, false, memory_order_release);
		return;
	}
	uint64_t epoch = res->status == 0 && res->num_ranks == 1 && res->ranks[0].meta ? res->ranks[0].meta->epoch : 0;
	if (!epoch)
		kvx_log(KVX_LOG_WARN, "engine: epoch check of %s:%u dp %u failed: %s", pr->host, pr->hs_port, pr->dp_rank,
			res->error[0] ? res->error : kvx_strerror(res->status));
	atomic_store_explicit(&pr->checked_epoch, epoch, memory_order_relaxed);
	atomic_store_explicit(&pr->check_done, res->cookie, memory_order_release);
	atomic_store_explicit(&pr->check_busy, false, memory_order_release);
	struct emsg m = {.type = M_PEER_CHECKED, .ptr = pr};
	for (uint32_t k = 0; k < e->n_po; k++)
		cin_push(e, k, &m);
}

static void on_hs_done(void *arg, const struct kvx_ctl_hs_result *res)
{
	struct peer *pr = arg;
	struct kvx_engine *e = pr->e;
	int rc = res->status;
	if (rc == -EBUSY) {
		/* Another job (an epoch check) dials the same host:port: not a failure; the
		 * waiting transfers start the handshake again (xf_conn()). */
		pthread_mutex_lock(&e->acc_lock);
		hs_eps_destroy(pr);
		pthread_mutex_unlock(&e->acc_lock);
		atomic_store_explicit(&pr->hs_state, pr->gen ? HS_READY : HS_IDLE, memory_order_release);
		struct emsg m = {.type = M_PEER_CHECKED, .ptr = pr};
		for (uint32_t k = 0; k < e->n_po; k++)
			cin_push(e, k, &m);
		return;
	}
	uint64_t epoch = rc == 0 && res->num_ranks == 1 && res->ranks[0].meta ? res->ranks[0].meta->epoch : 0;
	struct conn *c = NULL;
	if (rc == 0)
		rc = hetero_tp_guard(pr);
	if (rc == 0 && res->num_ranks == 1)
		rc = conn_build(pr, &res->ranks[0], epoch, &c);
	else if (rc == 0)
		rc = -EPROTO;
	if (rc == 0) {
		if (pr->epoch && epoch != pr->epoch)
			kvx_log(KVX_LOG_INFO, "engine: peer %s:%u dp %u restarted (epoch %llu -> %llu)", pr->host,
				pr->hs_port, pr->dp_rank, (unsigned long long)pr->epoch, (unsigned long long)epoch);
		pr->epoch = epoch;
		c->gen = ++pr->gen;
		/* Publish (replacing a previous connection: it is freed after a grace period and
		 * its last reference). The control thread is an RCU updater only for this call. */
		kvx_rcu_register();
		int pr_rc = kvx_rcu_table_replace_u64(e->conns, pr->id, c);
		kvx_rcu_unregister();
		if (pr_rc < 0) {
			pthread_mutex_lock(&e->acc_lock);
			conn_destroy(c);
			pthread_mutex_unlock(&e->acc_lock);
			rc = pr_rc;
		}
	} else {
		pthread_mutex_lock(&e->acc_lock);
		hs_eps_destroy(pr);
		pthread_mutex_unlock(&e->acc_lock);
	}
	if (rc)
		kvx_log(KVX_LOG_WARN, "engine: handshake with %s:%u dp %u failed: %s%s%s", pr->host, pr->hs_port,
			pr->dp_rank, kvx_strerror(rc), res->error[0] ? ": " : "", res->error);
	atomic_store_explicit(&pr->hs_error, rc, memory_order_relaxed);
	atomic_store_explicit(&pr->hs_state, rc ? HS_FAILED : HS_READY, memory_order_release);
	struct emsg m = {.type = rc ? M_PEER_FAILED : M_PEER_READY, .status = rc, .ptr = pr};
	for (uint32_t k = 0; k < e->n_po; k++)
		cin_push(e, k, &m);
}

/* The handshake job for @p pr's DP rank (the peer's TP rank paired with ours, its pod hosts);
 * *rank must outlive the kvx_ctl_handshake_start() call. Handshakes and epoch checks share it. */
static int hs_params(const struct kvx_engine *e, struct peer *pr, uint32_t *rank, struct kvx_ctl_hs_params *hp)
{
	uint32_t rtp = 0, ptp = pr->tp_size ? pr->tp_size : e->p.tp_size;
	int rc = kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, ptp, &rtp, NULL, 0);
	if (rc)
		return rc;
	*rank = pr->dp_rank;
	*hp = (struct kvx_ctl_hs_params){
		.host = pr->host,
		.handshake_base_port = pr->hs_port,
		.dp_size = pr->dp_rank + 1,
		.dp_size_local = pr->dp_size_local,
		.remote_hosts = pr->n_pods ? pr->pod_ptr : NULL,
		.num_remote_hosts = pr->n_pods,
		.tp_rank = rtp,
		.tp_size = ptp,
		.port_mode = e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE,
		.ranks = rank,
		.num_ranks = 1,
		.timeout_ms = e->p.handshake_timeout_ms,
		.arg = pr,
	};
	return 0;
}

/* Start a handshake with @p pr through inbox @p ib if its state is still @p from (CAS, so the
 * app thread and the pollers never both start one). -EALREADY: another thread won. */
static int hs_start(struct kvx_engine *e, struct kvx_ctl_inbox *ib, struct peer *pr, int from)
{
	uint32_t rank;
	struct kvx_ctl_hs_params hp;
	int rc = hs_params(e, pr, &rank, &hp);
	if (rc)
		return rc;
	if (!atomic_compare_exchange_strong_explicit(&pr->hs_state, &from, HS_PENDING, memory_order_acq_rel,
						     memory_order_acquire))
		return -EALREADY;
	hp.make_blob = make_blob;
	hp.on_done = on_hs_done;
	rc = kvx_ctl_handshake_start(ib, &hp);
	if (rc)
		atomic_store_explicit(&pr->hs_state, from, memory_order_release);
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Pollers                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static uint32_t port_off(const struct kvx_engine *e, uint32_t dp, uint32_t tp, uint32_t tp_size)
{
	uint32_t off = 0;
	kvx_ctl_port_offset(e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE, dp, tp, tp_size,
			    &off);
	return off;
}

static uint32_t peer_tp(const struct kvx_engine *e, const struct peer *pr)
{
	return pr->tp_size ? pr->tp_size : e->p.tp_size;
}

/* Host of the peer's DP rank @p dp: its pod's host, else the peer host (PROTOCOL.md §5.8). */
static const char *peer_host_of(const struct peer *pr, uint32_t dp)
{
	const char *host;
	uint32_t local;
	kvx_ctl_dp_target(dp, pr->dp_size_local, pr->n_pods ? pr->pod_ptr : NULL, pr->n_pods, pr->host, &host,
			  &local);
	return host;
}

/* Notify port of the peer TP rank this worker pairs with (PROTOCOL.md §2.4 targets). */
static uint16_t peer_notify_port(const struct kvx_engine *e, const struct peer *pr, uint32_t rtp)
{
	uint32_t ptp = peer_tp(e, pr);
	return (uint16_t)(pr->notify_port + port_off(e, kvx_ctl_fold_local_rank(pr->dp_rank, pr->dp_size_local), rtp, ptp));
}

static void send_notify_to(struct poller *po, const char *host, uint16_t port, enum kvx_msg_type t,
			   const char *tid, const uint32_t *blocks, uint32_t n);

/* To the peer's own DP rank (its pod host). */
static void send_notify(struct poller *po, const struct peer *pr, uint16_t port, enum kvx_msg_type t,
			const char *tid, const uint32_t *blocks, uint32_t n)
{
	send_notify_to(po, peer_host_of(pr, pr->dp_rank), port, t, tid, blocks, n);
}

static void send_notify_to(struct poller *po, const char *host, uint16_t port, enum kvx_msg_type t,
			   const char *tid, const uint32_t *blocks, uint32_t n)
{
	struct kvx_engine *e = po->e;
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = t;
	strcpy(m.transfer_id, tid);
	if (t == KVX_MSG_RELEASE) {
		m.consumer_tp_size = e->p.tp_size;
		m.has_consumer_tp_size = true;
	} else if (t == KVX_MSG_REMOTE_BLOCKS) {
		m.block_ids = (uint32_t *)blocks;
		m.num_blocks = n;
		m.decode_rank = e->p.dp_rank;
		m.sender_epoch = kvx_ctl_epoch(e->ctl); /* names this incarnation (kvxfer peers) */
	}
	if (kvx_ctl_send_notify(po->ib, host, port, &m))
		atomic_fetch_add_explicit(&e->st_notify_drop, 1, memory_order_relaxed);
}

static void send_to_paired_rank(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid)
{
	struct kvx_engine *e = po->e;
	uint32_t rtp = 0;
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, peer_tp(e, pr), &rtp, NULL, 0);
	send_notify(po, pr, peer_notify_port(e, pr, rtp), t, tid, NULL, 0);
}

/* D WRITE: remote_blocks / release go to every P TP rank, from TP rank 0 only (PROTOCOL.md
 * §1.3 step 5b: the scheduler of the D DP rank sends once). */
static void send_to_all_ranks(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid,
			      const uint32_t *blocks, uint32_t n)
{
	struct kvx_engine *e = po->e;
	if (e->p.tp_rank != 0)
		return;
	for (uint32_t r = 0; r < peer_tp(e, pr); r++)
		send_notify(po, pr, peer_notify_port(e, pr, r), t, tid, blocks, n);
}

static void build(const struct kvx_engine *e, const struct xf *x, struct cmsg *c, enum kvx_cpl_kind kind,
		  enum kvx_cpl_status st, int error, bool last)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->c.transfer_id, x->tid);
	c->c.kind = kind;
	c->c.role = e->p.role;
	c->c.status = st;
	c->c.error = error;
	c->c.bytes = x->bytes;
	c->c.duration_ns = kvx_now_ns() - x->start_ns;
	c->xf = (void *)x;
	c->last = last;
}

/* The ring holds 4 entries per transfer slot; at most 2 per transfer are ever queued. After a
 * `last` entry is enqueued the application may reuse the xf: the caller must not touch it. */
static void push_cpl(struct poller *po, const struct cmsg *c, unsigned n)
{
	kvx_ring_enqueue_elem_burst_sp(po->cpl, c, n, NULL);
}

static void remove_live(struct poller *po, struct xf *x)
{
	uint32_t i = x->live_idx;
	po->live[i] = po->live[--po->n_live];
	po->live[i]->live_idx = i;
	x->live = false;
	conn_put(po, x->conn); /* retiring: no op of x is outstanding */
	x->conn = NULL;
}

static void count_terminal(struct poller *po, struct xf *x, enum kvx_cpl_status st)
{
	struct kvx_engine *e = po->e;
	_Atomic uint64_t *c = st == KVX_CPL_DONE ? &e->st_done
			      : st == KVX_CPL_ABORTED ? &e->st_aborted
			      : st == KVX_CPL_TIMED_OUT ? &e->st_timed_out
							: &e->st_failed;
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&po->st_transfers, 1, memory_order_relaxed);
	if (st == KVX_CPL_FAILED || st == KVX_CPL_TIMED_OUT)
		atomic_fetch_add_explicit(&po->st_failures, 1, memory_order_relaxed);
	if (x->peer) {
		atomic_fetch_add_explicit(&x->peer->transfers, 1, memory_order_relaxed);
		if (st != KVX_CPL_DONE)
			atomic_fetch_add_explicit(&x->peer->failures, 1, memory_order_relaxed);
	}
}

/* Report the terminal state once; if release_now the blocks are reusable too and the xf
 * retires: it is unlinked first and the completions are enqueued last, so the poller never
 * touches an xf the application may already have reused. */
static void report(struct poller *po, struct xf *x, enum kvx_cpl_status st, int error, bool release_now)
{
	struct kvx_engine *e = po->e;
	struct cmsg c[2];
	unsigned n = 0;
	if (!x->reported) {
		x->reported = true;
		atomic_store_explicit(&x->final_error, error, memory_order_relaxed);
		atomic_store_explicit(&x->final, 1 + (int)st, memory_order_release);
		kvx_waiter_wake(&e->app_w);
		count_terminal(po, x, st);
		bool release_cpl = x->kind == XK_WRITE || x->kind == XK_SERVE || st != KVX_CPL_DONE;
		build(e, x, &c[n++], KVX_CPL_TRANSFER, st, error, release_now && !release_cpl);
		if (release_now && release_cpl)
			build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
		else if (release_cpl)
			atomic_fetch_add_explicit(&e->st_quar, 1, memory_order_relaxed);
	} else if (release_now && !x->released) {
		build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
	} else {
		return;
	}
	if (release_now && !x->released) {
		x->released = true;
		kvx_ctl_mark_terminal(po->ib, x->tid);
		remove_live(po, x);
	}
	push_cpl(po, c, n);
}

static struct kvx_xfer *tab_open(struct poller *po, const char *tid)
{
	struct kvx_xfer *t = kvx_xfer_find(po->tab, tid);
	if (t)
		return t;
	if (kvx_xfer_open(po->tab, tid, &t))
		return NULL;
	return t;
}

/* The peer's current connection (RCU lookup; valid until this poller's next quiescent state
 * unless a reference is taken). */
static struct conn *conn_lookup(struct poller *po, const struct peer *pr)
{
	return kvx_rcu_table_lookup_u64(po->e->conns, pr->id);
}

static void conn_stale(struct poller *po, struct conn *c);

static void conn_bind(struct xf *x, struct conn *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* the table's ref is held */
	x->conn = c;
}

/* 1 if x has a usable connection to post on (binding the peer's current one if needed), 0 to
 * wait (no connection yet, re-handshake in progress, own ops still draining), or a negative
 * errno: a WRITE bound to a connection whose peer has since restarted (new epoch: the
 * consumer's allocation is gone, never write into the new process), or a transfer with no
 * connection whose handshake failed (the failure can reach this poller before the submission
 * that started it: M_PEER_FAILED then found no transfer to fail). */
static int xf_conn(struct poller *po, struct xf *x)
{
	struct conn *c = x->conn;
	if (c && !atomic_load_explicit(&c->stale, memory_order_acquire))
		return 1;
	if (c && x->batches_out)
		return 0;
	if (c && x->kind == XK_READ) {
		/* Bytes may have landed from the old endpoint: rehs_decide() settles it. */
		x->await_rehs = true;
		return 0;
	}
	struct conn *n = conn_lookup(po, x->peer);
	int hs = atomic_load_explicit(&x->peer->hs_state, memory_order_acquire);
	if (!n && !c && hs == HS_FAILED) {
		int err = atomic_load_explicit(&x->peer->hs_error, memory_order_relaxed);
		return err < 0 ? err : -ECONNREFUSED;
	}
	if (n && atomic_load_explicit(&n->stale, memory_order_acquire) && hs == HS_READY)
		hs_start(po->e, po->ib, x->peer, HS_READY); /* its re-handshake could not be queued */
	else if (!n && hs == HS_IDLE)
		hs_start(po->e, po->ib, x->peer, HS_IDLE); /* the first one was refused (-EBUSY) */
	if (!n || n == c || atomic_load_explicit(&n->stale, memory_order_acquire))
		return 0;
	if (c && x->kind == XK_WRITE && n->epoch != c->epoch)
		return -ECONNRESET;
	if (x->kind == XK_WRITE && x->alloc_epoch && n->epoch != x->alloc_epoch)
		return -ECONNRESET; /* the allocation belongs to a consumer incarnation that is gone */
	conn_put(po, c);
	conn_bind(x, n);
	return 1;
}

static void on_epoch_checked(void *arg, const struct kvx_ctl_hs_result *res);
static void epoch_check_start(struct poller *po, struct peer *pr);

/* How recent a successful completion on the link must be to vouch for the peer's epoch. */
#define KVX_EPOCH_FRESH_NS 20000000ull

/* P WRITE: which incarnation of the consumer made the allocation (remote_blocks)? tcp/shm do
 * not watch idle connections, so a consumer that died and restarted on the same ports is not
 * noticed until an op fails. Before a transfer's first post: if the link carried a successful
 * op in the last KVX_EPOCH_FRESH_NS the connection's epoch is current; else the peer's
 * metadata is fetched again (a handshake without connection setup, on the control lcore) and
 * its epoch is the allocation's. If it differs from the connection's, the consumer restarted:
 * the connection is marked stale and re-handshaken, and the transfer binds the new one. A
 * transfer that ends up on a connection of another epoch than its allocation's fails with
 * -ECONNRESET: nothing is written into a restarted consumer for an allocation it never made.
 * A kvxfer consumer names its incarnation in remote_blocks (`kvx_epoch`, @p sent_epoch): that
 * settles it at once, with no guess; the check above is for MoRIIO peers (sent_epoch 0).
 * Returns true once alloc_epoch is settled. */
static bool alloc_epoch_settle(struct poller *po, struct xf *x, uint64_t sent_epoch)
{
	struct peer *pr = x->peer;
	if (x->alloc_known)
		return true;
	struct conn *c = conn_lookup(po, pr);
	bool stale = c && atomic_load_explicit(&c->stale, memory_order_acquire);
	if (sent_epoch) {
		x->check_wait = false;
		x->alloc_known = true;
		atomic_store_explicit(&x->alloc_known_pub, true, memory_order_release);
		x->alloc_epoch = sent_epoch;
		if (c && !stale && c->epoch != sent_epoch)
			conn_stale(po, c); /* the consumer restarted: re-handshake now */
		return true;
	}
	if (x->check_wait && stale) {
		/* A re-handshake runs anyway: its connection has the epoch current after the
		 * allocation arrived. */
		x->check_wait = false;
		x->alloc_known = true;
		atomic_store_explicit(&x->alloc_known_pub, true, memory_order_release);
		x->alloc_epoch = 0;
		return true;
	}
	if (x->check_wait && atomic_load_explicit(&pr->check_done, memory_order_acquire) < x->check_need) {
		epoch_check_start(po, pr); /* no-op while one runs; a job that started before the
					    * allocation arrived does not count */
		return false;
	}
	if (x->check_wait) {
		x->check_wait = false;
		x->alloc_known = true;
		atomic_store_explicit(&x->alloc_known_pub, true, memory_order_release);
		x->alloc_epoch = atomic_load_explicit(&pr->checked_epoch, memory_order_relaxed);
		if (!x->alloc_epoch)
			x->alloc_epoch = c ? c->epoch : 0; /* the check failed: trust the connection */
		if (c && x->alloc_epoch != c->epoch)
			conn_stale(po, c); /* restarted: re-handshake now */
		return true;
	}
	if (!c || stale || kvx_now_ns() - c->link[po->k].last_ok_ns < KVX_EPOCH_FRESH_NS) {
		/* No connection yet (the handshake in flight gives the current epoch), one being
		 * replaced, or fresh proof of life. */
		x->alloc_known = true;
		atomic_store_explicit(&x->alloc_known_pub, true, memory_order_release);
		x->alloc_epoch = c && !stale ? c->epoch : 0;
		return true;
	}
	x->check_need = atomic_load_explicit(&pr->check_started, memory_order_acquire) + 1;
	x->check_wait = true;
	epoch_check_start(po, pr);
	return false;
}

/* Start the peer's epoch check unless one runs or a handshake runs (both dial host:port). */
static void epoch_check_start(struct poller *po, struct peer *pr)
{
	bool idle = false;
	if (atomic_load_explicit(&pr->hs_state, memory_order_acquire) == HS_READY &&
	    atomic_compare_exchange_strong_explicit(&pr->check_busy, &idle, true, memory_order_acq_rel,
						    memory_order_acquire)) {
		uint32_t rank;
		struct kvx_ctl_hs_params hp;
		if (hs_params(po->e, pr, &rank, &hp)) { /* validated when the peer was created */
			atomic_store_explicit(&pr->check_busy, false, memory_order_release);
			return;
		}
		hp.on_done = on_epoch_checked;
		hp.cookie = atomic_load_explicit(&pr->check_started, memory_order_relaxed) + 1;
		/* Numbered before it can start: a transfer asking later needs a later job. */
		atomic_store_explicit(&pr->check_started, hp.cookie, memory_order_release);
		if (kvx_ctl_handshake_start(po->ib, &hp))
			atomic_store_explicit(&pr->check_busy, false, memory_order_release); /* retried */
	}
}

static void list_link(struct poller *po, struct conn *c)
{
	struct clink *l = &c->link[po->k];
	if (l->listed)
		return;
	l->listed = true;
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* held by a bound xf */
	l->next = po->plist;
	po->plist = c;
}

/* Post one layer of a transfer on its connection's link of this poller: plan (cached per
 * geometry), one batch per caps.max_batch ops. */
static int post_layer(struct poller *po, struct xf *x, uint32_t layer, enum kvx_xport_opcode op,
		      const uint32_t *lids, const uint32_t *rids, size_t n)
{
	struct kvx_engine *e = po->e;
	struct conn *c = x->conn;
	struct clink *l = &c->link[po->k];
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
	for (uint32_t b = 0; b < nb; b++) {
		size_t first = (size_t)b * maxb;
		uint32_t cnt = (uint32_t)(plan.n - first < maxb ? plan.n - first : maxb);
		rc = kvx_xport_post_bulk(l->ep, op, po->ops + first, cnt, cookie);
		if (rc) {
			if (b == 0)
				return rc; /* -ENOBUFS: retry the layer later */
			/* A partial layer cannot be retried without double-posting: fail it. */
			x->failed = true;
			x->error = rc;
			break;
		}
		x->batches_out++;
		x->layer_batches[layer]++;
		l->outstanding++;
		list_link(po, c);
		atomic_fetch_add_explicit(&po->st_ops, cnt, memory_order_relaxed);
		atomic_fetch_add_explicit(&x->peer->ops, cnt, memory_order_relaxed);
	}
	return 0;
}

/* After a re-handshake: retry a READ that moved nothing only against a new peer epoch (the old
 * incarnation's blocks are gone either way); the same epoch means the producer fenced us (its
 * defer timeout) or the link failed, and the blocks may have been reused: fail. */
static void rehs_decide(struct poller *po, struct xf *x, struct conn *n)
{
	x->await_rehs = false;
	if (n->epoch != x->peer_epoch && x->bytes == 0 && x->batches_out == 0) {
		x->next_layer = 0;
		x->done_posting = false;
		memset(x->layer_batches, 0, po->e->n_layers * sizeof(*x->layer_batches));
		conn_put(po, x->conn);
		conn_bind(x, n);
		x->peer_epoch = n->epoch;
		return;
	}
	x->failed = true;
	x->error = -ECONNRESET;
	x->done_posting = true;
}

static void read_progress(struct poller *po, struct xf *x)
{
	struct kvx_engine *e = po->e;
	if (x->reported) {
		/* Terminal (timed out / aborted): release P and the blocks once the ops are terminal. */
		if (x->batches_out == 0) {
			/* An abort always releases P; a timeout only once ops were posted (they are
			 * terminal now): a peer that never answered gets nothing late. */
			if ((x->aborted || x->next_layer > 0) && !x->release_sent) {
				x->release_sent = true;
				send_to_paired_rank(po, x->peer, KVX_MSG_RELEASE, x->tid);
			}
			report(po, x, KVX_CPL_ABORTED, 0, true);
		}
		return;
	}
	if (x->await_rehs) {
		if (x->batches_out)
			return;
		struct conn *n = conn_lookup(po, x->peer);
		if (!n || n == x->conn || atomic_load_explicit(&n->stale, memory_order_acquire))
			return; /* the re-handshake is still running */
		rehs_decide(po, x, n);
	}
	/* A failed transfer finishes even while its (stale) peer is re-handshaking. */
	if (!x->failed && !x->done_posting) {
		int cr = xf_conn(po, x);
		if (cr < 0) {
			report(po, x, KVX_CPL_FAILED, cr, x->batches_out == 0);
			return;
		}
		if (cr == 0)
			return;
	}
	uint32_t hold = atomic_load_explicit(&e->test_hold_layers, memory_order_relaxed);
	uint32_t limit = hold < e->n_layers ? hold : e->n_layers;
	if (x->next_layer == 0 && x->conn)
		x->peer_epoch = x->conn->epoch;
	if (!x->failed)
		kvx_plan_cache_reset(po->pc);
	while (!x->failed && x->next_layer < limit) {
		if (post_layer(po, x, x->next_layer, KVX_XPORT_OP_READ, x->lblocks, x->rblocks, x->n))
			break;
		x->next_layer++;
	}
	if (x->next_layer == e->n_layers || x->failed)
		x->done_posting = true;
	if (x->done_posting && x->batches_out == 0) {
		x->release_sent = true;
		send_to_paired_rank(po, x->peer, KVX_MSG_RELEASE, x->tid);
		report(po, x, x->failed ? KVX_CPL_FAILED : KVX_CPL_DONE, x->failed ? x->error : 0, true);
	}
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

static void write_fail(struct poller *po, struct xf *x, int err)
{
	memset(x->want_post, 0, sizeof(x->want_post));
	x->failed = true;
	x->error = err;
	kvx_xfer_mark_write_done(po->tab, x->tid, false);
	report(po, x, KVX_CPL_FAILED, err, x->batches_out == 0);
}

static void write_progress(struct poller *po, struct xf *x)
{
	struct kvx_xfer *t = kvx_xfer_find(po->tab, x->tid);
	if (x->reported || !t || t->state != KVX_XFER_S_LIVE) {
		if (x->batches_out == 0) {
			if (x->aborted && !x->release_sent) {
				/* D aborted: tell it our writes are terminal so its blocks leave quarantine. */
				x->release_sent = true;
				send_to_paired_rank(po, x->peer, KVX_MSG_WRITE_DONE, x->tid);
			}
			report(po, x, x->aborted ? KVX_CPL_ABORTED : x->timed_out ? KVX_CPL_TIMED_OUT : KVX_CPL_FAILED,
			       x->error, true);
		}
		return;
	}
	if (!t->has_alloc || !alloc_epoch_settle(po, x, t->alloc_epoch))
		return;
	int cr = xf_conn(po, x);
	if (cr < 0) {
		write_fail(po, x, cr);
		return;
	}
	if (cr == 0)
		return;
	/* Pair by token position: D's announced blocks hold the tail of the prompt; an extra D
	 * block (first generated token) stays unpaired (PROTOCOL.md §6 item 8). */
	size_t nl = x->n, nr = t->n_remote_blocks, n = nl < nr ? nl : nr;
	const uint32_t *lids = x->lblocks + (nl > nr ? nl - nr : 0);
	kvx_plan_cache_reset(po->pc);
	for (uint32_t w = 0; w < KVX_ENGINE_MAX_LAYERS / 64; w++) {
		uint64_t bits = x->want_post[w];
		while (bits) {
			uint32_t layer = w * 64 + (uint32_t)__builtin_ctzll(bits);
			bits &= bits - 1;
			int g = layer_gate_open(x, layer);
			if (g == 0)
				continue;
			if (g < 0) {
				/* The producer's event failed: nothing of this layer is known to be
				 * computed, so nothing more is written; the transfer fails. */
				write_fail(po, x, g);
				return;
			}
			if (post_layer(po, x, layer, KVX_XPORT_OP_WRITE, lids, t->remote_blocks, n))
				return;
			x->want_post[w] &= ~(1ull << (layer % 64));
			if (x->layer_batches[layer] == 0 && !x->failed) {
				/* Nothing to move for this layer (empty plan): it is done. */
				kvx_xfer_mark_write_done(po->tab, x->tid, true);
			}
		}
	}
}

static void finish_write_ok(struct poller *po, struct xf *x, int32_t decode_dp)
{
	struct kvx_engine *e = po->e;
	struct peer *pr = x->peer;
	uint32_t rtp = 0, dtp = peer_tp(e, pr);
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, dtp, &rtp, NULL, 0);
	uint32_t dp = decode_dp >= 0 ? (uint32_t)decode_dp : pr->dp_rank;
	uint16_t port = (uint16_t)(pr->notify_port +
				   port_off(e, kvx_ctl_fold_local_rank(dp, pr->dp_size_local), rtp, dtp));
	send_notify_to(po, peer_host_of(pr, dp), port, KVX_MSG_WRITE_DONE, x->tid, NULL, 0);
	report(po, x, KVX_CPL_DONE, 0, true);
}

static void progress(struct poller *po, struct xf *x)
{
	switch (x->kind) {
	case XK_READ:
		read_progress(po, x);
		break;
	case XK_WRITE:
		write_progress(po, x);
		break;
	case XK_ANNOUNCE:
	case XK_SERVE:
		break; /* driven by notifications and timeouts */
	}
}

static void handle_submit(struct poller *po, struct xf *x)
{
	x->live_idx = po->n_live;
	po->live[po->n_live++] = x;
	x->live = true;
	struct kvx_xfer *t;
	switch (x->kind) {
	case XK_READ:
		if (x->n == 0) {
			/* Full prefix hit / abort before allocation: release P, no RDMA. */
			send_to_paired_rank(po, x->peer, KVX_MSG_RELEASE, x->tid);
			report(po, x, KVX_CPL_DONE, 0, true);
			return;
		}
		read_progress(po, x);
		return;
	case XK_ANNOUNCE:
		if (x->n == 0) {
			send_to_all_ranks(po, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
			report(po, x, KVX_CPL_DONE, 0, true);
			return;
		}
		t = tab_open(po, x->tid);
		if (t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed) {
			/* write_done arrived before the announcement was processed (parked). */
			report(po, x, KVX_CPL_DONE, 0, true);
			return;
		}
		kvx_ctl_mark_live(po->ib, x->tid, peer_host_of(x->peer, x->peer->dp_rank), x->peer->notify_port);
		send_to_all_ranks(po, x->peer, KVX_MSG_REMOTE_BLOCKS, x->tid, x->lblocks, (uint32_t)x->n);
		return;
	case XK_WRITE:
		t = tab_open(po, x->tid);
		if (t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed) {
			/* D released (aborted) before we began: nothing was written; say so, so that D's
			 * quarantined blocks are freed without waiting for its defer timeout. */
			x->aborted = true;
			send_to_paired_rank(po, x->peer, KVX_MSG_WRITE_DONE, x->tid);
			report(po, x, KVX_CPL_ABORTED, -ECANCELED, true);
			return;
		}
		return;
	case XK_SERVE:
		t = tab_open(po, x->tid);
		if (t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed) {
			report(po, x, KVX_CPL_DONE, 0, true);
			return;
		}
		return;
	}
}

static struct xf *live_find(struct poller *po, const char *tid)
{
	for (uint32_t i = 0; i < po->n_live; i++)
		if (!strcmp(po->live[i]->tid, tid))
			return po->live[i];
	return NULL;
}

static void handle_notify(struct poller *po, struct emsg *m)
{
	struct kvx_engine *e = po->e;
	struct xf *x = live_find(po, m->tid);
	switch (m->u32) {
	case KVX_MSG_REMOTE_BLOCKS: {
		int rc = kvx_xfer_remote_blocks_take(po->tab, m->tid, m->ptr, m->n, m->status, m->u64);
		if (rc <= 0)
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		if (x)
			write_progress(po, x);
		return;
	}
	case KVX_MSG_RELEASE: {
		if (x && x->kind == XK_WRITE) {
			/* D aborted a push transfer: stop posting, answer once our writes are terminal. */
			if (!x->reported) {
				x->aborted = true;
				x->error = -ECANCELED;
				memset(x->want_post, 0, sizeof(x->want_post));
				struct kvx_xfer *t = kvx_xfer_find(po->tab, x->tid);
				if (t && t->state == KVX_XFER_S_LIVE)
					kvx_xfer_make_terminal(po->tab, t);
				report(po, x, KVX_CPL_ABORTED, -ECANCELED, false);
			}
			write_progress(po, x);
			return;
		}
		if (!x && !kvx_xfer_find(po->tab, m->tid))
			tab_open(po, m->tid); /* early release: parked until the transfer is submitted */
		int rc = kvx_xfer_resolve_ack(po->tab, m->tid, (uint32_t)m->u64, e->p.tp_size);
		if (rc == 1 && x && x->kind == XK_SERVE)
			report(po, x, KVX_CPL_DONE, 0, true);
		else if (rc < 0)
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		return;
	}
	case KVX_MSG_WRITE_DONE: {
		if (!x && !kvx_xfer_find(po->tab, m->tid))
			tab_open(po, m->tid); /* parked until announce (fault b) */
		uint32_t ptp = x && x->peer ? peer_tp(e, x->peer) : e->p.tp_size;
		int rc = kvx_xfer_resolve_ack(po->tab, m->tid, ptp, e->p.tp_size);
		if (rc == 1 && x && x->kind == XK_ANNOUNCE) {
			/* Done, or (after abort/timeout) P's writes are terminal: blocks leave quarantine. */
			report(po, x, KVX_CPL_DONE, 0, true);
		} else if (rc == 0 && !x) {
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		}
		return;
	}
	default:
		return;
	}
}

/* A connection's endpoint is in error state (transport.h: every op on it fails from now on):
 * no new transfer binds it, and the peer is re-handshaken at once (a new connection with new
 * endpoints; the old one drains and is freed when unreferenced) (PROTOCOL.md §6 item 18). */
static void conn_stale(struct poller *po, struct conn *c)
{
	if (atomic_exchange_explicit(&c->stale, true, memory_order_acq_rel))
		return;
	atomic_fetch_add_explicit(&po->e->st_peer_resets, 1, memory_order_relaxed);
	int rc = hs_start(po->e, po->ib, c->pr, HS_READY);
	(void)rc; /* -EALREADY: a handshake is already running; -ENOBUFS: retried by rehs_scan() */
}

static void handle_cpl(struct poller *po, struct conn *cn, const struct kvx_xport_cpl *c)
{
	struct kvx_engine *e = po->e;
	uint32_t slot = (uint32_t)(c->cookie >> 16), layer = (uint32_t)(c->cookie & 0xffff);
	cn->link[po->k].outstanding--;
	struct xf *x = slot < e->p.max_transfers ? &e->xpool[slot] : NULL;
	if (!x || !x->live || x->po != po || layer >= e->n_layers)
		return;
	x->batches_out--;
	x->layer_batches[layer]--;
	x->bytes += c->bytes;
	atomic_fetch_add_explicit(&po->st_bytes, c->bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&x->peer->bytes, c->bytes, memory_order_relaxed);
	if (c->status == 0)
		cn->link[po->k].last_ok_ns = kvx_now_ns();
	if (c->status) {
		bool ep_dead = kvx_xport_ep_status(cn->link[po->k].ep) != 0;
		if (ep_dead)
			conn_stale(po, cn);
		/* Nothing of this READ landed and the endpoint is dead: the peer may have restarted
		 * before the first op (a new epoch at re-handshake makes a retry equivalent to a fresh
		 * transfer); decided in rehs_decide(). */
		if (x->kind == XK_READ && ep_dead && x->bytes == 0 && !x->failed)
			x->await_rehs = true;
		else if (!x->failed) {
			x->failed = true;
			x->error = c->status;
		}
	}
	if (x->layer_batches[layer] == 0 && !x->failed) {
		if (x->kind == XK_READ) {
			/* Per-layer barrier: release pairs with the acquire in kvx_xfer_layer_poll(). */
			atomic_fetch_or_explicit(&x->layer_done[layer / 64], 1ull << (layer % 64), memory_order_release);
			kvx_waiter_wake(&e->app_w); /* P1: after the release store, pairs with prepare */
		} else if (x->kind == XK_WRITE && !x->reported) {
			int32_t dp = -1;
			struct kvx_xfer *t = kvx_xfer_find(po->tab, x->tid);
			if (t)
				dp = t->decode_dp_rank;
			if (kvx_xfer_mark_write_done(po->tab, x->tid, true) == KVX_XFER_ACT_NOTIFY_WRITE_DONE) {
				finish_write_ok(po, x, dp);
				return;
			}
		}
	}
	if (x->failed && x->kind == XK_WRITE && !x->reported) {
		kvx_xfer_mark_write_done(po->tab, x->tid, false);
		report(po, x, KVX_CPL_FAILED, x->error, false);
	}
	progress(po, x);
}

static void handle_sub(struct poller *po, struct emsg *m)
{
	struct xf *x;
	switch (m->type) {
	case M_SUBMIT:
		handle_submit(po, m->ptr);
		return;
	case M_LAYER_READY:
		x = live_find(po, m->tid);
		if (!x || x->kind != XK_WRITE || x->reported)
			return;
		if (!kvx_xfer_schedule_write(po->tab, x->tid, m->u32))
			return; /* duplicate (transfer, layer): no-op */
		x->gate[m->u32].flag = m->ptr;
		x->gate[m->u32].ev = m->ev;
		x->want_post[m->u32 / 64] |= 1ull << (m->u32 % 64);
		write_progress(po, x);
		return;
	case M_SEAL: {
		x = live_find(po, m->tid);
		if (!x || x->kind != XK_WRITE || x->reported)
			return;
		enum kvx_xfer_action act;
		int32_t dp = -1;
		struct kvx_xfer *t = kvx_xfer_find(po->tab, x->tid);
		if (t)
			dp = t->decode_dp_rank;
		if (kvx_xfer_seal_count(po->tab, x->tid, m->u32, &act) >= 0 && act == KVX_XFER_ACT_NOTIFY_WRITE_DONE)
			finish_write_ok(po, x, dp);
		return;
	}
	case M_ABORT:
		x = live_find(po, m->tid);
		if (!x || x->reported)
			return;
		x->aborted = true;
		x->error = -ECANCELED;
		if (x->kind == XK_ANNOUNCE) {
			send_to_all_ranks(po, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
			x->quarantine_deadline = kvx_now_ns() + ms_ns(po->e->p.defer_timeout_ms);
			report(po, x, KVX_CPL_ABORTED, -ECANCELED, false);
			return;
		}
		if (x->kind == XK_WRITE) {
			memset(x->want_post, 0, sizeof(x->want_post));
			struct kvx_xfer *t = kvx_xfer_find(po->tab, x->tid);
			if (t && t->state == KVX_XFER_S_LIVE)
				kvx_xfer_make_terminal(po->tab, t);
		}
		if (x->kind == XK_READ) {
			report(po, x, KVX_CPL_ABORTED, -ECANCELED, false);
			read_progress(po, x);
		} else {
			report(po, x, KVX_CPL_ABORTED, -ECANCELED, x->batches_out == 0);
		}
		return;
	default:
		return;
	}
}

static void handle_cin(struct poller *po, struct emsg *m)
{
	struct peer *pr = m->ptr;
	if (m->type == M_NOTIFY) {
		handle_notify(po, m);
		return;
	}
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (x->peer == pr && !x->reported) {
			bool unbound = !x->conn || atomic_load_explicit(&x->conn->stale, memory_order_acquire);
			if (m->type == M_PEER_FAILED && unbound && (x->kind == XK_READ || x->kind == XK_WRITE))
				report(po, x, KVX_CPL_FAILED, m->status ? m->status : -ECONNREFUSED, x->batches_out == 0);
			else
				progress(po, x);
		}
		if (po->n_live == before)
			i++;
	}
}

/* P READ defer timeout (PROTOCOL.md §5.4 with §6 item 11): the producer cannot see one-sided
 * reads, so it revokes them: destroying the target endpoints makes every consumer's further
 * access impossible (verbs: the QPs are gone; tcp: the next kvx_xport_progress(), on this
 * thread, closes their connections before serving anything else), and only then are the
 * blocks reported reusable. shm cannot be revoked by the target (see engine.h). Runs on
 * poller 0 (the thread of kvx_xport_progress()) for the fences any poller asked for. */
static void fence_readers(struct poller *po)
{
	struct kvx_engine *e = po->e;
	uint64_t req = atomic_load_explicit(&e->fence_req, memory_order_acquire);
	if (req == atomic_load_explicit(&e->fence_done, memory_order_relaxed))
		return;
	if (pthread_mutex_trylock(&e->acc_lock))
		return; /* the control thread is inside a transport call: retry at the next scan */
	for (uint32_t i = 0; i < e->n_accepted; i++)
		kvx_xport_ep_destroy(e->accepted[i]);
	e->n_accepted = 0;
	pthread_mutex_unlock(&e->acc_lock);
	atomic_fetch_add_explicit(&e->st_fences, 1, memory_order_relaxed);
	atomic_store_explicit(&e->fence_done, req, memory_order_release);
}

/* Serve transfers whose fence is done: their blocks are reusable now. */
static void fence_release(struct poller *po)
{
	uint64_t done = atomic_load_explicit(&po->e->fence_done, memory_order_acquire);
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (x->fence_pending && x->fence_ticket <= done) {
			x->fence_pending = false;
			po->n_fence_pending--;
			report(po, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, true);
		}
		if (po->n_live == before)
			i++;
	}
}

static void scan_timeouts(struct poller *po, uint64_t now)
{
	struct kvx_engine *e = po->e;
	uint64_t tmo = ms_ns(e->p.transfer_timeout_ms), dfr = ms_ns(e->p.defer_timeout_ms);
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		uint64_t age = now - x->start_ns;
		if (!x->reported) {
			struct kvx_xfer *tw = x->kind == XK_WRITE ? kvx_xfer_find(po->tab, x->tid) : NULL;
			bool serve_like = x->kind == XK_SERVE || (x->kind == XK_WRITE && !(tw && tw->has_alloc));
			uint64_t limit = serve_like ? dfr : tmo;
			if (age > limit) {
				x->timed_out = true;
				x->error = -ETIMEDOUT;
				if (x->kind == XK_ANNOUNCE) {
					/* Tell P to stop; our blocks stay quarantined until its write_done or a
					 * further defer_timeout (P's ops are bounded by its op timeout). */
					send_to_all_ranks(po, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
					x->quarantine_deadline = now + dfr;
					report(po, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, false);
				} else if (x->kind == XK_WRITE) {
					memset(x->want_post, 0, sizeof(x->want_post));
					if (tw && tw->state == KVX_XFER_S_LIVE)
						kvx_xfer_make_terminal(po->tab, tw);
					report(po, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, x->batches_out == 0);
				} else if (x->kind == XK_SERVE) {
					struct kvx_xfer *t = kvx_xfer_find(po->tab, x->tid);
					if (t && t->state == KVX_XFER_S_LIVE)
						kvx_xfer_make_terminal(po->tab, t);
					/* A consumer's one-sided READ may still be in flight: the blocks stay
					 * held until poller 0 revoked every reader at the wire. */
					report(po, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, false);
					x->fence_pending = true;
					x->fence_ticket = atomic_fetch_add_explicit(&e->fence_req, 1, memory_order_acq_rel) + 1;
					po->n_fence_pending++;
				} else {
					report(po, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, false);
					read_progress(po, x);
				}
			}
		} else if (x->kind == XK_ANNOUNCE && x->quarantine_deadline && now > x->quarantine_deadline) {
			report(po, x, KVX_CPL_DONE, 0, true);
		}
		if (po->n_live == before)
			i++;
	}
	if (po->k == 0)
		fence_readers(po);
	if (po->n_fence_pending)
		fence_release(po);
	conn_reap(po);
}

/* A stale connection whose re-handshake could not be queued (inbox full): retry. */
static void rehs_scan(struct poller *po)
{
	for (struct conn *c = po->plist; c; c = c->link[po->k].next)
		if (atomic_load_explicit(&c->stale, memory_order_relaxed) &&
		    atomic_load_explicit(&c->pr->hs_state, memory_order_acquire) == HS_READY &&
		    conn_lookup(po, c->pr) == c)
			hs_start(po->e, po->ib, c->pr, HS_READY);
}

static int poll_fn(void *arg)
{
	struct poller *po = arg;
	struct kvx_engine *e = po->e;
	int busy = 0;
	struct emsg m[8];
	unsigned n = kvx_ring_dequeue_elem_burst_sc(po->sub, m, 8, NULL);
	for (unsigned i = 0; i < n; i++)
		handle_sub(po, &m[i]);
	busy |= n != 0;
	n = kvx_ring_dequeue_elem_burst_sc(po->cin, m, 8, NULL);
	for (unsigned i = 0; i < n; i++)
		handle_cin(po, &m[i]);
	busy |= n != 0;
	/* Completions on this poller's link of every connection with ops outstanding. New
	 * connections are listed at the head, so they are not visited this round. */
	struct kvx_xport_cpl c[32];
	for (struct conn *cn = po->plist; cn;) {
		struct clink *l = &cn->link[po->k];
		struct conn *next = l->next;
		if (l->outstanding) {
			int k = kvx_xport_poll_burst(l->ep, c, 32);
			for (int i = 0; i < k; i++)
				handle_cpl(po, cn, &c[i]);
			busy |= k > 0 || l->outstanding != 0;
		}
		cn = next;
	}
	for (struct conn **pp = &po->plist; *pp;) {
		struct conn *cn = *pp;
		struct clink *l = &cn->link[po->k];
		if (l->outstanding) {
			pp = &l->next;
			continue;
		}
		*pp = l->next;
		l->listed = false;
		conn_put(po, cn);
	}
	/* Transfers waiting on the send queue, a connection or a layer's readiness event. */
	for (uint32_t i = 0; i < po->n_live;) {
		struct xf *x = po->live[i];
		uint32_t before = po->n_live;
		if (!x->reported && ((x->kind == XK_READ && !x->done_posting) || x->kind == XK_WRITE))
			progress(po, x);
		if (po->n_live == before)
			i++;
	}
	if (po->k == 0)
		for (uint32_t i = 0; i < e->n_xctx; i++)
			if (e->caps[i].needs_progress)
				busy |= kvx_xport_progress(e->xctx[i]) > 0;
	uint64_t now = kvx_now_ns();
	if (now >= po->next_scan_ns) {
		po->next_scan_ns = now + 1000000ull;
		scan_timeouts(po, now);
		rehs_scan(po);
	}
	/* Idle sleeps are capped at 1 ms (kvx_engine_start), which bounds how late a deadline
	 * or a tcp target request is noticed. */
	return busy ? KVX_POLL_BUSY : KVX_POLL_IDLE;
}
KVX_API int kvx_engine_start(struct kvx_engine *e)
{
	if (!e)
		return -EINVAL;
	if (e->started)
		return -EBUSY;
	if (e->n_layers == 0) {
		kvx_log(KVX_LOG_ERROR, "engine: start: no layer registered");
		return -EINVAL;
	}
	char err[256] = "";
	int rc;
	struct kvx_lcore_cfg *cfg = calloc(1, sizeof(*cfg));
	if (!cfg)
		return -ENOMEM;
	char ctl_lc[16];
	if (e->p.control_lcore != UINT32_MAX)
		snprintf(ctl_lc, sizeof(ctl_lc), "%u", e->p.control_lcore);
	struct kvx_lcore_opts_str os = {.lcores = e->p.lcores,
					.control_lcore = e->p.control_lcore != UINT32_MAX ? ctl_lc : NULL,
					.idle = e->p.idle == KVX_ENGINE_IDLE_BUSY ? "busy" : "adaptive"};
	rc = kvx_lcore_cfg_from_strings(&os, 1, cfg, err, sizeof(err));
	if (!rc)
		rc = kvx_lcore_set_create(cfg, &e->set);
	free(cfg);
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "engine: lcores: %s", err[0] ? err : kvx_strerror(rc));
		return rc;
	}
	uint32_t n_po = 0;
	for (unsigned i = 0; i < kvx_lcore_set_count(e->set); i++)
		n_po += kvx_lcore_set_at(e->set, i) != kvx_lcore_set_control(e->set);
	if (n_po == 0 || n_po > KVX_ENGINE_MAX_POLLERS) {
		kvx_log(KVX_LOG_ERROR, "engine: lcores: %u polling lcores (1..%d)", n_po, KVX_ENGINE_MAX_POLLERS);
		return -EINVAL;
	}
	for (unsigned i = 0; i < kvx_lcore_set_count(e->set); i++) {
		struct kvx_lcore *lc = kvx_lcore_set_at(e->set, i);
		if (lc == kvx_lcore_set_control(e->set))
			continue;
		struct poller *po = calloc(1, sizeof(*po));
		if (!po)
			return -ENOMEM;
		po->e = e;
		po->k = e->n_po;
		po->lc = lc;
		e->po[e->n_po++] = po;
	}
	struct kvx_rcu_table_params tp = {.key_type = KVX_RCU_KEY_U64, .free_fn = conn_table_free};
	if ((rc = kvx_rcu_table_create(&tp, &e->conns)))
		return rc;

	/* DESIGN.md §3 `auto`: verbs if usable; else tcp, plus shm for same-host peers when CMA is
	 * permitted (chosen per peer at the handshake: see connect_locked()). */
	const char *prov = e->transport, *provs[2] = {NULL, NULL};
	bool is_auto = !strcmp(prov, "auto");
	if (is_auto && kvx_xport_select("auto", false, &prov))
		prov = "tcp";
	provs[0] = prov;
	if (is_auto && strcmp(prov, "verbs") && !e->has_hip && !auto_shm_disabled() &&
	    kvx_xport_provider_probe("shm", NULL, 0) == 0)
		provs[1] = "shm";
	struct kvx_xport_ctx_params xp;
	kvx_xport_ctx_params_init(&xp);
	xp.tcp_addr = e->host;
	xp.op_timeout_ns = ms_ns(e->p.transfer_timeout_ms);
	for (uint32_t k = 0; k < 2 && provs[k]; k++) {
		rc = kvx_xport_open(provs[k], &xp, &e->xctx[k]);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "engine: transport '%s': %s", provs[k], kvx_strerror(rc));
			return rc;
		}
		e->n_xctx = k + 1;
		kvx_xport_query_caps(e->xctx[k], &e->caps[k]);
		for (uint32_t i = 0; i < e->n_layers; i++) {
			struct layer *ly = &e->layers[i];
			struct kvx_xport_mr_params mp = {.addr = ly->base, .len_bytes = ly->span,
							 .access = KVX_XPORT_ACCESS_ALL,
							 .mem_type = (enum kvx_xport_mem_type)ly->mem,
							 .device_id = ly->device_id};
			rc = kvx_xport_mr_register(e->xctx[k], &mp, &ly->mr[k]);
			if (rc) {
				kvx_log(KVX_LOG_ERROR, "engine: register layer '%s' (%s): %s", ly->name, provs[k],
					kvx_strerror(rc));
				return rc;
			}
		}
	}
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[0]));
	/* Transfer objects, block ids and per-layer arrays: all sized here, from the params, so
	 * that no submission allocates (the hot-path rule). The block-id arena is mmap'ed: pages
	 * are only backed once a transfer of that size used them. */
	size_t mt = e->p.max_transfers, nlay = e->n_layers;
	e->xpool = calloc(mt, sizeof(*e->xpool));
	e->lb_pool = calloc(mt * nlay, sizeof(*e->lb_pool));
	e->gate_pool = calloc(mt * nlay, sizeof(*e->gate_pool));
	e->arena_bytes = mt * 2 * (size_t)e->p.max_blocks * sizeof(uint32_t);
	void *ar = mmap(NULL, e->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	e->arena = ar == MAP_FAILED ? NULL : ar;
	if (!e->xpool || !e->lb_pool || !e->gate_pool || !e->arena)
		return -ENOMEM;
	for (uint32_t i = 0; i < mt; i++) {
		struct xf *x = &e->xpool[i];
		x->slot = i;
		x->lblocks = e->arena + (size_t)i * 2 * e->p.max_blocks;
		x->rblocks = x->lblocks + e->p.max_blocks;
		x->layer_batches = e->lb_pool + (size_t)i * nlay;
		x->gate = e->gate_pool + (size_t)i * nlay;
		x->next_free = i + 2 <= mt ? i + 2 : 0;
	}
	e->xfree = 1;
	uint32_t cnt = 1;
	while (cnt < 4 * e->p.max_transfers)
		cnt <<= 1;
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		char name[32];
		po->ops = calloc(2 * (size_t)e->p.max_blocks, sizeof(*po->ops));
		po->live = calloc(mt, sizeof(*po->live));
		if (!po->ops || !po->live)
			return -ENOMEM;
		if ((rc = kvx_plan_cache_create(e->p.max_blocks, &po->pc)) ||
		    (rc = kvx_xfer_table_create(2 * mt + KVX_XFER_TERMINAL_LRU + 64, KVX_XFER_TERMINAL_LRU, &po->tab)))
			return rc;
		struct kvx_ring_params rp = {.name = name, .count = cnt, .elem_size = sizeof(struct emsg)};
		snprintf(name, sizeof(name), "eng-sub%u", k);
		if ((rc = kvx_ring_create(&rp, &po->sub)))
			return rc;
		snprintf(name, sizeof(name), "eng-cin%u", k);
		if ((rc = kvx_ring_create(&rp, &po->cin)))
			return rc;
		snprintf(name, sizeof(name), "eng-cpl%u", k);
		rp.elem_size = sizeof(struct cmsg);
		if ((rc = kvx_ring_create(&rp, &po->cpl)))
			return rc;
		kvx_ring_set_waiter(po->sub, kvx_lcore_waiter(po->lc));
		kvx_ring_set_waiter(po->cin, kvx_lcore_waiter(po->lc));
	}
	if ((rc = kvx_waiter_init(&e->app_w)))
		return rc;
	e->app_w_init = true;

	struct kvx_ctl_params cp = {
		.host = e->host,
		.handshake_base_port = e->p.handshake_port,
		.notify_base_port = e->p.notify_port,
		.ephemeral_ports = e->p.handshake_port == 0 || e->p.notify_port == 0,
		.port_mode = e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE,
		.dp_rank = e->p.dp_rank,
		.dp_size = e->p.dp_size,
		.dp_size_local = e->p.dp_size_local,
		.tp_rank = e->p.tp_rank,
		.tp_size = e->p.tp_size,
		.role = e->p.role == KVX_SCHED_PRODUCER ? KVX_CTL_ROLE_PRODUCER : KVX_CTL_ROLE_CONSUMER,
		.transfer_mode = e->p.mode == KVX_SCHED_MODE_READ ? KVX_CTL_MODE_READ : KVX_CTL_MODE_WRITE,
		.proxy_address = e->p.proxy_addr,
		.http_address = e->p.http_addr,
		.global_rank = e->p.dp_rank * e->p.tp_size + e->p.tp_rank,
		.lcore = kvx_lcore_set_control(e->set),
		.on_notify = on_notify,
		.notify_arg = e,
		.on_connect = on_connect,
		.connect_arg = e,
		.max_inboxes = e->n_po + 1 > 16 ? e->n_po + 1 : 0,
		.auth_dir = e->p.auth_dir,
	};
	if ((rc = kvx_ctl_create(&cp, &e->ctl)))
		return rc;
	/* Device async events (verbs: QP/CQ/port errors) are drained on the control lcore. */
	for (uint32_t k = 0; k < e->n_xctx; k++) {
		int fd = kvx_xport_ctx_event_fd(e->xctx[k]);
		if (fd < 0)
			continue; /* -ENOTSUP: tcp/shm have none */
		e->evw[k] = (struct evwatch){.e = e, .k = k, .fd = fd};
		if ((rc = kvx_ctl_watch_fd(e->ctl, fd, on_xport_events, &e->evw[k]))) {
			kvx_log(KVX_LOG_ERROR, "engine: watch %s async events: %s", kvx_xport_name(e->xctx[k]),
				kvx_strerror(rc));
			return rc;
		}
	}
	struct kvx_msg_region *regs = calloc(2 * (size_t)e->n_layers, sizeof(*regs));
	struct kvx_msg_memdesc *descs = calloc(e->n_layers, sizeof(*descs));
	if (!regs || !descs) {
		free(regs);
		free(descs);
		return -ENOMEM;
	}
	struct kvx_msg_meta meta;
	memset(&meta, 0, sizeof(meta));
	snprintf(meta.engine_id, sizeof(meta.engine_id), "%s:%u", e->host, e->p.handshake_port);
	kvx_ctl_engine_key(cp.role, e->host, e->p.handshake_port, e->p.tp_rank, e->p.dp_rank, meta.engine_key,
			   sizeof(meta.engine_key));
	snprintf(meta.hostname, sizeof(meta.hostname), "%s", e->host);
	snprintf(meta.host, sizeof(meta.host), "%s", e->host);
	meta.num_blocks = e->layers[0].geom.num_blocks;
	meta.block_len = e->layers[0].geom.block_len;
	snprintf(meta.attn_backend, sizeof(meta.attn_backend), "kvxfer");
	meta.has_kvx = true;
	meta.version = KVX_MSG_PROTO_VERSION;
	snprintf(meta.transport, sizeof(meta.transport), "%s", kvx_xport_name(e->xctx[0]));
	snprintf(meta.layout, sizeof(meta.layout), "%s",
		 e->layers[0].geom.kind == KVX_LAYOUT_KIND_MLA	   ? "mla"
		 : e->layers[0].geom.kind == KVX_LAYOUT_KIND_SPLIT ? "split"
								   : "interleaved");
	meta.regions = regs;
	struct kvx_msg_layers lm;
	memset(&lm, 0, sizeof(lm));
	snprintf(lm.engine_key, sizeof(lm.engine_key), "%s", meta.engine_key);
	lm.num_descs = e->n_layers;
	lm.descs = descs;
	/* MoRIIO form (PROTOCOL.md §3.1, §4.1): a split layer advertises its K and V planes as two
	 * regions of one memory region; the region map keeps one MemoryDesc of the whole tensor. */
	for (uint32_t i = 0; i < e->n_layers; i++) {
		const struct layer *ly = &e->layers[i];
		int k = kvx_layout_meta_regions(&ly->geom, &ly->t, (uint64_t)(uintptr_t)ly->base,
						kvx_xport_mr_key(ly->mr[0]), regs + meta.num_regions);
		if (k < 0) {
			free(regs);
			free(descs);
			return k;
		}
		meta.num_regions += (uint32_t)k;
		snprintf(descs[i].layer, sizeof(descs[i].layer), "%s", ly->name);
		descs[i].id = i;
		descs[i].device_id = -1;
		descs[i].addr = (uint64_t)(uintptr_t)ly->base;
		descs[i].len_bytes = ly->span;
		descs[i].loc = 1;
	}
	rc = kvx_ctl_set_local(e->ctl, &meta, &lm);
	free(regs);
	free(descs);
	if (rc)
		return rc;
	if ((rc = kvx_ctl_inbox_open(e->ctl, &e->app_ib)))
		return rc;
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		if ((rc = kvx_ctl_inbox_open(e->ctl, &po->ib)))
			return rc;
	}
	if ((rc = kvx_ctl_start(e->ctl)))
		return rc;
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		if ((rc = kvx_poller_register(po->lc, poll_fn, po, "engine", NULL)))
			return rc;
		if (e->p.idle == KVX_ENGINE_IDLE_ADAPTIVE) {
			struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .max_sleep_ns = 1000000ull};
			kvx_lcore_set_idle(po->lc, &ip);
		}
	}
	for (uint32_t k = 0; k < e->n_po; k++)
		if ((rc = kvx_lcore_launch(e->po[k]->lc, kvx_lcore_poll_loop, NULL)))
			return rc;
	e->started = true;
	return 0;
}

KVX_API int kvx_engine_ports(const struct kvx_engine *e, uint16_t *handshake_port, uint16_t *notify_port)
{
	if (!e || !e->started)
		return -EAGAIN;
	return kvx_ctl_bound_ports(e->ctl, handshake_port, notify_port);
}

KVX_API void kvx_engine_stop(struct kvx_engine *e)
{
	if (!e || !e->started || e->stopped)
		return;
	e->stopped = true;
	for (uint32_t k = 0; k < e->n_po; k++)
		kvx_lcore_stop(e->po[k]->lc);
	for (uint32_t k = 0; k < e->n_po; k++)
		kvx_lcore_wait(e->po[k]->lc);
	kvx_ctl_stop(e->ctl);
	/* The pollers are joined: this thread now owns their state. Submissions they never saw and
	 * live transfers end as aborted (their blocks are reusable: no op can run any more). */
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		struct emsg m;
		while (kvx_ring_dequeue_elem_burst_sc(po->sub, &m, 1, NULL)) {
			if (m.type != M_SUBMIT)
				continue;
			struct xf *x = m.ptr;
			x->live_idx = po->n_live;
			po->live[po->n_live++] = x;
			x->live = true;
		}
		while (po->n_live) {
			struct xf *x = po->live[0];
			struct cmsg c[2];
			unsigned n = 0;
			if (!x->reported) {
				x->reported = true;
				atomic_store_explicit(&x->final, 1 + KVX_CPL_ABORTED, memory_order_release);
				build(e, x, &c[n++], KVX_CPL_TRANSFER, KVX_CPL_ABORTED, -ECANCELED, false);
			}
			build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
			struct conn *cn = x->conn;
			x->conn = NULL;
			remove_live(po, x);
			conn_put(NULL, cn);
			push_cpl(po, c, n);
		}
		while (po->plist) {
			struct conn *cn = po->plist;
			po->plist = cn->link[k].next;
			cn->link[k].listed = false;
			conn_put(NULL, cn);
		}
	}
}

KVX_API void kvx_engine_destroy(struct kvx_engine *e)
{
	if (!e)
		return;
	kvx_engine_stop(e);
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		struct emsg m;
		while (po->cin && kvx_ring_dequeue_elem_burst_sc(po->cin, &m, 1, NULL))
			if (m.type == M_NOTIFY)
				free(m.ptr);
		kvx_ctl_inbox_close(po->ib);
	}
	kvx_ctl_inbox_close(e->app_ib);
	kvx_ctl_destroy(e->ctl);
	/* Connections: the table's references go after a grace period (no reader is left). */
	kvx_rcu_table_destroy(e->conns);
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		while (po->dead) {
			struct conn *c = po->dead;
			po->dead = c->next_dead;
			conn_destroy(c);
		}
	}
	for (uint32_t i = 0; i < e->n_peers; i++)
		hs_eps_destroy(&e->peers[i]);
	for (uint32_t i = 0; i < e->n_accepted; i++)
		kvx_xport_ep_destroy(e->accepted[i]);
	free(e->accepted);
	for (uint32_t k = 0; k < 2; k++) {
		for (uint32_t i = 0; i < e->n_layers; i++)
			if (e->layers[i].mr[k])
				kvx_xport_mr_unregister(e->layers[i].mr[k]);
		kvx_xport_close(e->xctx[k]);
	}
	kvx_lcore_set_destroy(e->set);
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		kvx_ring_destroy(po->sub);
		kvx_ring_destroy(po->cin);
		kvx_ring_destroy(po->cpl);
		kvx_plan_cache_destroy(po->pc);
		kvx_xfer_table_destroy(po->tab);
		free(po->ops);
		free(po->live);
		free(po);
	}
	kvx_xfer_table_destroy(e->reg);
	pthread_mutex_destroy(&e->acc_lock);
	if (e->app_w_init)
		kvx_waiter_fini(&e->app_w);
	if (e->arena)
		munmap(e->arena, e->arena_bytes);
	free(e->xpool);
	free(e->lb_pool);
	free(e->gate_pool);
	free(e);
}

/* ---------------------------------------------------------------------------------------- */
/* App-thread API                                                                            */
/* ---------------------------------------------------------------------------------------- */

static struct peer *peer_get(struct kvx_engine *e, const struct kvx_engine_peer *pp, bool handshake, int *rc)
{
	*rc = 0;
	if (!pp->host || !*pp->host || strlen(pp->host) >= KVX_ENGINE_HOST_MAX || !pp->notify_port) {
		*rc = -EINVAL;
		return NULL;
	}
	if (pp->num_remote_hosts > KVX_ENGINE_MAX_PODS || (pp->num_remote_hosts && !pp->remote_hosts)) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s: num_remote_hosts %u (0..%d, remote_hosts not NULL)", pp->host,
			pp->num_remote_hosts, KVX_ENGINE_MAX_PODS);
		*rc = -EINVAL;
		return NULL;
	}
	for (uint32_t k = 0; k < pp->num_remote_hosts; k++) {
		const char *h = pp->remote_hosts[k];
		if (!h || !*h || strlen(h) >= KVX_ENGINE_HOST_MAX) {
			kvx_log(KVX_LOG_ERROR, "engine: peer %s: remote_hosts[%u] empty, NULL or longer than %d bytes",
				pp->host, k, KVX_ENGINE_HOST_MAX - 1);
			*rc = -EINVAL;
			return NULL;
		}
	}
	struct peer *pr = NULL;
	for (uint32_t i = 0; i < e->n_peers && !pr; i++) {
		struct peer *q = &e->peers[i];
		if (strcmp(q->host, pp->host) || q->hs_port != pp->handshake_port || q->notify_port != pp->notify_port ||
		    q->dp_rank != pp->dp_rank || q->dp_size_local != pp->dp_size_local || q->tp_size != pp->tp_size ||
		    q->n_pods != pp->num_remote_hosts)
			continue;
		bool same = true;
		for (uint32_t k = 0; k < q->n_pods && same; k++)
			same = !strcmp(q->pod_host[k], pp->remote_hosts[k]);
		if (same)
			pr = q;
	}
	if (!pr) {
		if (e->n_peers == KVX_ENGINE_MAX_PEERS) {
			kvx_log(KVX_LOG_ERROR, "engine: more than %d peers", KVX_ENGINE_MAX_PEERS);
			*rc = -ENOBUFS;
			return NULL;
		}
		pr = &e->peers[e->n_peers];
		pr->e = e;
		pr->id = e->n_peers + 1;
		strcpy(pr->host, pp->host);
		pr->hs_port = pp->handshake_port;
		pr->notify_port = pp->notify_port;
		pr->dp_rank = pp->dp_rank;
		pr->dp_size_local = pp->dp_size_local;
		pr->tp_size = pp->tp_size;
		pr->n_pods = pp->num_remote_hosts;
		for (uint32_t k = 0; k < pr->n_pods; k++) {
			strcpy(pr->pod_host[k], pp->remote_hosts[k]);
			pr->pod_ptr[k] = pr->pod_host[k];
		}
		/* Published to the pollers by the ring enqueue of the first submission naming it. */
		e->n_peers++;
	}
	int st = atomic_load_explicit(&pr->hs_state, memory_order_acquire);
	if (handshake && (st == HS_IDLE || st == HS_FAILED)) {
		*rc = hs_start(e, e->app_ib, pr, st);
		if (*rc == -EALREADY)
			*rc = 0;
		else if (*rc)
			return NULL;
	}
	return pr;
}

static int submit(struct kvx_engine *e, enum xf_kind kind, const char *tid, const struct kvx_engine_peer *pp,
		  const uint32_t *lids, const uint32_t *rids, size_t n, uint32_t consumer_tp)
{
	if (!e || !tid)
		return -EINVAL;
	if (!e->started || e->stopped)
		return -EBUSY;
	size_t tl = strnlen(tid, KVX_ENGINE_ID_MAX);
	if (tl == 0 || tl >= KVX_ENGINE_ID_MAX || n > e->p.max_blocks || (n && !lids) ||
	    (kind == XK_READ && n && !rids))
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
		bool hs = n > 0 && (kind == XK_READ || kind == XK_WRITE);
		pr = peer_get(e, pp, hs, &rc);
		if (!pr)
			return rc;
	}
	struct kvx_xfer *r;
	rc = kvx_xfer_open(e->reg, tid, &r);
	if (rc)
		return rc;
	/* A preallocated transfer object; its storage is reset here, on the app thread, which
	 * got it back from the last completion (ring acquire) and hands it over by the ring. */
	uint32_t slot = e->xfree - 1;
	struct xf *x = &e->xpool[slot];
	uint32_t *lb = x->lblocks, *rb = x->rblocks, *lbat = x->layer_batches;
	struct lgate *gate = x->gate;
	uint32_t next_free = x->next_free;
	memset(x, 0, sizeof(*x));
	memset(lbat, 0, e->n_layers * sizeof(*lbat));
	memset(gate, 0, e->n_layers * sizeof(*gate));
	x->lblocks = lb;
	x->rblocks = rb;
	x->layer_batches = lbat;
	x->gate = gate;
	x->slot = slot;
	memcpy(x->tid, tid, tl + 1);
	x->kind = kind;
	x->peer = pr;
	x->n = n;
	x->consumer_tp = consumer_tp;
	x->start_ns = kvx_now_ns();
	if (n)
		memcpy(x->lblocks, lids, n * sizeof(uint32_t));
	if (n && rids)
		memcpy(x->rblocks, rids, n * sizeof(uint32_t));
	x->po = e->po[tid_poller(e, tid)];
	struct emsg m = {.type = M_SUBMIT, .ptr = x};
	if (!kvx_ring_enqueue_elem_burst_sp(x->po->sub, &m, 1, NULL)) {
		x->next_free = next_free;
		kvx_xfer_make_terminal(e->reg, r);
		return -ENOBUFS;
	}
	e->xfree = next_free;
	r->user = x;
	return 0;
}

KVX_API int kvx_xfer_read(struct kvx_engine *e, const struct kvx_engine_read *r)
{
	if (!e || !r)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_CONSUMER || e->p.mode != KVX_SCHED_MODE_READ)
		return -EBUSY;
	return submit(e, XK_READ, r->transfer_id, &r->peer, r->local_blocks, r->remote_blocks, r->n, 0);
}

KVX_API int kvx_xfer_announce(struct kvx_engine *e, const struct kvx_engine_announce *a)
{
	if (!e || !a)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_CONSUMER || e->p.mode != KVX_SCHED_MODE_WRITE)
		return -EBUSY;
	return submit(e, XK_ANNOUNCE, a->transfer_id, &a->peer, a->local_blocks, NULL, a->n, 0);
}

KVX_API int kvx_xfer_write_begin(struct kvx_engine *e, const struct kvx_engine_write *w)
{
	if (!e || !w)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_PRODUCER || e->p.mode != KVX_SCHED_MODE_WRITE)
		return -EBUSY;
	if (w->n == 0)
		return -EINVAL;
	return submit(e, XK_WRITE, w->transfer_id, &w->peer, w->local_blocks, NULL, w->n, 0);
}

KVX_API int kvx_xfer_serve(struct kvx_engine *e, const struct kvx_engine_serve *s)
{
	if (!e || !s)
		return -EINVAL;
	if (e->p.role != KVX_SCHED_PRODUCER || e->p.mode != KVX_SCHED_MODE_READ)
		return -EBUSY;
	if (s->n == 0)
		return -EINVAL;
	return submit(e, XK_SERVE, s->transfer_id, NULL, s->local_blocks, NULL, s->n, s->consumer_tp_size);
}

static int push_tid_msg(struct kvx_engine *e, uint32_t type, const char *tid, uint32_t u32, const void *ptr,
			const struct kvx_mem_event *ev)
{
	if (!e || !tid)
		return -EINVAL;
	if (!e->started || e->stopped)
		return -EBUSY;
	struct kvx_xfer *r = kvx_xfer_find(e->reg, tid);
	if (!r || r->state != KVX_XFER_S_LIVE)
		return -ENOENT;
	struct emsg m = {.type = type, .u32 = u32, .ptr = (void *)ptr};
	if (ev)
		m.ev = *ev;
	strcpy(m.tid, tid);
	return kvx_ring_enqueue_elem_burst_sp(e->po[tid_poller(e, tid)]->sub, &m, 1, NULL) ? 0 : -ENOBUFS;
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
		kvx_log(KVX_LOG_ERROR, "engine: layer_ready: a hipEvent_t needs a HIP build (libamdhip64 not found "
				       "at build time)");
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

KVX_API int kvx_xfer_layer_poll(struct kvx_engine *e, const char *transfer_id, uint32_t layer)
{
	if (!e || !transfer_id || layer >= KVX_ENGINE_MAX_LAYERS)
		return -EINVAL;
	struct kvx_xfer *r = kvx_xfer_find(e->reg, transfer_id);
	if (!r)
		return -ENOENT;
	if (r->state != KVX_XFER_S_LIVE) {
		if (r->final_status == 1 + KVX_CPL_DONE)
			return 1;
		return r->final_error ? r->final_error : -EIO;
	}
	struct xf *x = r->user;
	/* Acquire pairs with the release in handle_cpl(): the layer's bytes are visible. */
	if (atomic_load_explicit(&x->layer_done[layer / 64], memory_order_acquire) & (1ull << (layer % 64)))
		return 1;
	int fin = atomic_load_explicit(&x->final, memory_order_acquire);
	if (fin == 1 + KVX_CPL_DONE)
		return 1;
	if (fin) {
		int err = atomic_load_explicit(&x->final_error, memory_order_relaxed);
		return err ? err : -EIO;
	}
	return 0;
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
	size_t got = 0;
	struct cmsg c;
	/* Every poller's ring, starting where the last call stopped (no poller starves). */
	for (uint32_t j = 0; j < e->n_po && got < n; j++) {
		struct poller *po = e->po[(e->cpl_rr + j) % e->n_po];
		while (got < n && kvx_ring_dequeue_elem_burst_sc(po->cpl, &c, 1, NULL)) {
			out[got++] = c.c;
			if (c.c.kind == KVX_CPL_TRANSFER) {
				struct kvx_xfer *r = kvx_xfer_find(e->reg, c.c.transfer_id);
				if (r) {
					r->final_status = (uint8_t)(1 + c.c.status);
					r->final_error = c.c.error;
				}
			}
			if (c.last) {
				struct xf *x = c.xf;
				struct kvx_xfer *r = kvx_xfer_find(e->reg, c.c.transfer_id);
				if (r && r->user == x) {
					r->user = NULL;
					kvx_xfer_make_terminal(e->reg, r);
				}
				x->next_free = e->xfree; /* the object is free for the next submission */
				e->xfree = x->slot + 1;
			}
		}
	}
	e->cpl_rr = e->n_po ? (e->cpl_rr + 1) % e->n_po : 0;
	return got;
}

KVX_API const char *kvx_engine_transport_name(const struct kvx_engine *e)
{
	if (!e)
		return NULL;
	if (!e->started)
		return e->transport;
	return atomic_load(&((struct kvx_engine *)e)->last_xport);
}

KVX_API void kvx_engine_get_stats(const struct kvx_engine *e, struct kvx_engine_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (!e)
		return;
	struct kvx_engine *m = (struct kvx_engine *)e; /* atomics are read, never written */
	st->transfers_done = atomic_load_explicit(&m->st_done, memory_order_relaxed);
	st->transfers_failed = atomic_load_explicit(&m->st_failed, memory_order_relaxed);
	st->transfers_aborted = atomic_load_explicit(&m->st_aborted, memory_order_relaxed);
	st->transfers_timed_out = atomic_load_explicit(&m->st_timed_out, memory_order_relaxed);
	st->late_notifications = atomic_load_explicit(&m->st_late, memory_order_relaxed);
	st->quarantined = atomic_load_explicit(&m->st_quar, memory_order_relaxed);
	st->duplicates_rejected = e->st_dup;
	st->fences = atomic_load_explicit(&m->st_fences, memory_order_relaxed);
	st->peer_resets = atomic_load_explicit(&m->st_peer_resets, memory_order_relaxed);
	if (e->ctl) {
		struct kvx_ctl_counters cc;
		kvx_ctl_counters_get(e->ctl, &cc);
		st->notifications_sent = cc.notify_tx;
		st->notifications_received = cc.notify_rx;
	}
	for (uint32_t k = 0; k < e->n_po && st->n_lcores < KVX_ENGINE_MAX_POLLERS; k++) {
		struct poller *po = e->po[k];
		struct kvx_lcore_stats ls;
		kvx_lcore_stats_get(po->lc, &ls);
		struct kvx_engine_lcore_stats *o = &st->lcores[st->n_lcores++];
		o->lcore_id = kvx_lcore_id(po->lc);
		o->utilization = ls.util_pct / 100.0;
		o->bytes = atomic_load_explicit(&po->st_bytes, memory_order_relaxed);
		o->ops = atomic_load_explicit(&po->st_ops, memory_order_relaxed);
		o->transfers = atomic_load_explicit(&po->st_transfers, memory_order_relaxed);
		o->failures = atomic_load_explicit(&po->st_failures, memory_order_relaxed);
	}
	for (uint32_t i = 0; i < e->n_peers && i < KVX_ENGINE_MAX_PEERS; i++) {
		struct peer *pr = &m->peers[i];
		struct kvx_engine_peer_stats *o = &st->peers[st->n_peers++];
		snprintf(o->host, sizeof(o->host), "%s", pr->host);
		o->port = pr->notify_port;
		o->dp_rank = pr->dp_rank;
		o->bytes = atomic_load_explicit(&pr->bytes, memory_order_relaxed);
		o->ops = atomic_load_explicit(&pr->ops, memory_order_relaxed);
		o->transfers = atomic_load_explicit(&pr->transfers, memory_order_relaxed);
		o->failures = atomic_load_explicit(&pr->failures, memory_order_relaxed);
	}
}

bool kvx_engine_test_alloc_settled(struct kvx_engine *e, const char *transfer_id)
{
	struct kvx_xfer *r = kvx_xfer_find(e->reg, transfer_id);
	struct xf *x = r && r->state == KVX_XFER_S_LIVE ? r->user : NULL;
	return x && atomic_load_explicit(&x->alloc_known_pub, memory_order_acquire);
}

void kvx_engine_test_hold_read(struct kvx_engine *e, bool on, uint32_t n_layers)
{
	atomic_store_explicit(&e->test_hold_layers, on ? n_layers : UINT32_MAX, memory_order_relaxed);
}
