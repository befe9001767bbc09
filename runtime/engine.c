/* SPDX-License-Identifier: Apache-2.0 */
/* The engine: ties the lcores, the control lcore and a transport provider together and drives
 * both transfer modes on both roles (PROTOCOL.md §1.3, §1.4, §5 with §6 fixed; DESIGN.md §1).
 *
 * Threads and ownership:
 *  - app thread: every public call. Owns the transfer registry (`reg`, duplicate ids), the peer
 *    records (creation, handshake start through its own control inbox), the xf objects
 *    (allocated at submit, freed when their last completion is polled).
 *  - polling lcore 0: owns the transfer state machines (`tab`), posting, completion polling,
 *    timeouts, outbound notifications (its own control inbox) and the tcp target progress.
 *  - control lcore: handshakes (make_blob / on_done), connection accept, inbound notifications;
 *    everything it learns goes to the poller through the ctl->poller ring.
 * Rings (all SPSC, element rings of fixed messages): app->poller `sub`, control->poller `cin`,
 * poller->app `cpl`. A peer's transport state is written by the control thread before it
 * enqueues PEER_READY; the ring's release/acquire pair publishes it to the poller. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
};

struct emsg {
	uint32_t type;
	uint32_t u32;   /* layer / n_layers / notify type */
	int32_t status; /* error / decode rank */
	uint32_t n;     /* block count */
	void *ptr;      /* xf*, peer*, legacy ready flag, malloc'ed block ids */
	uint64_t u64;   /* consumer_tp_size */
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
};

struct kvx_engine;

struct peer {
	struct kvx_engine *e;
	char host[KVX_ENGINE_HOST_MAX];
	uint16_t hs_port, notify_port;
	uint32_t dp_rank, dp_size_local, tp_size;
	atomic_int hs_state; /* enum hs_state; control thread writes, app thread reads */
	/* Written by the control thread before PEER_READY, then owned by the poller. */
	struct kvx_xport_ep *ep;
	struct kvx_xport_ep *ep_alt; /* initiator: the offered candidate the responder did not take */
	uint32_t xi;                 /* index of ep's context in the engine's xctx[] */
	struct kvx_xport_rmr **rmr;
	struct kvx_layout_geom *geom;
	uint64_t remote_num_blocks;
	uint64_t epoch; /* the peer's kvx_epoch from the last successful handshake */
	int hs_error;
	/* Poller-owned. */
	bool ready;
	bool listed;
	bool stale; /* endpoint in error state: drain, then re-handshake (PROTOCOL.md §6 item 18) */
	uint32_t outstanding;
	_Atomic uint64_t bytes, ops, transfers, failures;
};

struct xf {
	char tid[KVX_ENGINE_ID_MAX];
	enum xf_kind kind;
	struct peer *peer;
	uint32_t *lblocks;
	uint32_t *rblocks;
	size_t n;
	uint32_t consumer_tp;
	uint64_t start_ns;
	/* App-visible: per-layer completion bits and the final outcome (release stores). */
	_Atomic uint64_t layer_done[KVX_ENGINE_MAX_LAYERS / 64];
	atomic_int final; /* 0 pending, else 1 + enum kvx_cpl_status */
	atomic_int final_error;
	/* Poller-owned. */
	uint32_t live_idx;
	uint32_t slot; /* stable index used in completion cookies */
	uint32_t next_layer;
	uint32_t batches_out;
	uint32_t layer_batches[KVX_ENGINE_MAX_LAYERS];
	/* Layer readiness (P WRITE): the legacy host flag (kvx_xfer_layer_ready()) or an event
	 * (kvx_xfer_layer_ready_event()); queried, never waited on, by the poller. */
	const atomic_uint *ready_flag[KVX_ENGINE_MAX_LAYERS];
	struct kvx_mem_event ready_ev[KVX_ENGINE_MAX_LAYERS];
	uint64_t want_post[KVX_ENGINE_MAX_LAYERS / 64];
	bool reported, released, failed, aborted, timed_out, done_posting, release_sent;
	bool fence_pending; /* P READ: defer timeout passed, blocks held until the wire is fenced */
	bool await_rehs;    /* D READ: nothing landed before the endpoint died; decide after re-handshake */
	uint64_t peer_epoch; /* D READ: the peer epoch its first op was posted against */
	int error;
	uint64_t bytes;
	uint64_t quarantine_deadline;
};

struct kvx_engine {
	struct kvx_engine_params p;
	char host[KVX_ENGINE_HOST_MAX];
	char transport[16];
	char lcores[128];
	char proxy[128], http[128];
	bool started, stopped;
	uint32_t n_layers;
	struct layer layers[KVX_ENGINE_MAX_LAYERS];
	struct kvx_lcore_set *set;
	struct kvx_lcore *poll_lc;
	/* xctx[0]: the provider named by `transport` (auto: verbs if usable, else tcp); xctx[1]:
	 * auto only, shm for same-host peers when CMA is permitted (NULL otherwise). */
	struct kvx_xport_ctx *xctx[2];
	struct kvx_xport_caps caps[2];
	uint32_t n_xctx;
	bool has_hip; /* a layer is HIP memory: `auto` does not add shm (CMA reads host memory) */
	int hip_probe;       /* app thread: 0 not probed, 1 HIP device usable, else -errno */
	char hip_why[KVX_MEM_WHY_LEN];
	_Atomic(const char *) last_xport; /* provider of the latest peer connection set up */
	struct kvx_ctl *ctl;
	struct kvx_ctl_inbox *app_ib, *poll_ib;
	struct kvx_ring *sub, *cin, *cpl;
	/* app thread */
	struct kvx_xfer_table *reg;
	struct peer *peers[KVX_ENGINE_MAX_PEERS];
	uint32_t n_peers;
	/* control thread; the poller destroys them to fence readers (acc_lock, trylock only) */
	pthread_mutex_t acc_lock;
	struct kvx_xport_ep **accepted;
	uint32_t n_accepted, cap_accepted;
	/* poller */
	struct kvx_xfer_table *tab;
	struct xf **live;
	uint32_t n_live;
	struct xf **slots;
	uint32_t *free_slots;
	uint32_t n_free;
	struct kvx_plan_cache *pc;
	struct kvx_xport_op *ops;
	struct peer *ready_peers[KVX_ENGINE_MAX_PEERS];
	uint32_t n_ready;
	uint64_t next_scan_ns;
	uint32_t n_fence_pending;
	struct kvx_waiter app_w; /* kvx_xfer_layer_wait() sleeps here; the poller wakes it */
	bool app_w_init;
	_Atomic uint32_t test_hold_layers; /* runtime_internal.h test hook; UINT32_MAX = off */
	_Atomic uint64_t st_bytes, st_ops, st_done, st_failed, st_aborted, st_timed_out, st_late, st_quar,
		st_notify_drop, st_fences, st_peer_resets;
	uint64_t st_dup;
};

/* KVX_ENGINE_AUTO_NO_SHM=1 (engine.h): `auto` never uses shm, even for a same-host peer. */
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
	if (l->mem != KVX_ENGINE_MEM_HOST && l->mem != KVX_ENGINE_MEM_HIP)
		return -EINVAL;
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
	if (l->mem == KVX_ENGINE_MEM_HIP && !strcmp(e->transport, "tcp"))
		return -ENOTSUP;
	e->has_hip |= l->mem == KVX_ENGINE_MEM_HIP;
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

static void cin_push(struct kvx_engine *e, const struct emsg *m)
{
	if (!kvx_ring_enqueue_elem_burst_sp(e->cin, m, 1, NULL)) {
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
	if (!ok || strlen(msg->transfer_id) >= KVX_ENGINE_ID_MAX) {
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
		uint32_t *ids = malloc(msg->num_blocks * sizeof(*ids));
		if (!ids)
			return;
		memcpy(ids, msg->block_ids, msg->num_blocks * sizeof(*ids));
		m.ptr = ids;
		m.n = msg->num_blocks;
		m.status = (int32_t)(msg->decode_rank < 0 ? 0 : msg->decode_rank);
	}
	m.u64 = msg->consumer_tp_size ? msg->consumer_tp_size : 1;
	cin_push(e, &m);
}

static int connect_locked(struct kvx_engine *e, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b,
			  size_t *len_b);

/* Every control-thread transport call runs under acc_lock: the poller's fence destroys target
 * endpoints on the same context (transport.h: control-path calls one thread at a time). */
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

/* Blob A = [u8 n_candidates] n x ([u8 provider code][u32 len][xport blob A]), in the initiator's
 * order of preference. The responder takes the first candidate it has a context for and whose
 * accept succeeds (shm checks same host and CMA there), so a wrong same-host guess degrades to
 * the next candidate (tcp) instead of failing the handshake.
 * Blob B = [u8 provider code][u32 xport_len][xport blob B][u32 n_regions][n x RDESC][u64 num_blocks]. */
static int connect_locked(struct kvx_engine *e, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b,
			  size_t *len_b)
{
	size_t cap = *len_b;
	size_t need = 1 + 4 + KVX_XPORT_BLOB_MAX + 4 + (size_t)e->n_layers * KVX_XPORT_RDESC_BYTES + 8;
	if (cap < need)
		return -EMSGSIZE;
	if (e->n_accepted == e->cap_accepted) {
		uint32_t nc = e->cap_accepted ? 2 * e->cap_accepted : 16;
		struct kvx_xport_ep **na = realloc(e->accepted, nc * sizeof(*na));
		if (!na)
			return -ENOMEM;
		e->accepted = na;
		e->cap_accepted = nc;
	}
	struct kvx_xport_ep *ep = NULL;
	size_t xl = 0, pos = 1;
	int rc = -EPROTO, xi = -1;
	char offered[64] = "";
	if (len_a < 1 || blob_a[0] == 0 || blob_a[0] > 4) {
		kvx_log(KVX_LOG_WARN, "engine: connect: blob A has %u transport candidates (1..4)",
			len_a ? blob_a[0] : 0u);
		return -EPROTO;
	}
	for (uint8_t c = 0; c < blob_a[0] && !ep; c++) {
		uint32_t cl;
		if (len_a < pos + 5)
			return -EPROTO;
		uint8_t code = blob_a[pos];
		memcpy(&cl, blob_a + pos + 1, 4);
		pos += 5;
		if (cl > len_a - pos)
			return -EPROTO;
		size_t ol = strlen(offered);
		snprintf(offered + ol, sizeof(offered) - ol, "%s%s", ol ? "," : "", xport_code_name(code));
		xi = xctx_index(e, code);
		if (xi >= 0) {
			rc = kvx_xport_ep_accept(e->xctx[xi], blob_a + pos, cl, &ep, blob_b + 5, KVX_XPORT_BLOB_MAX,
						 &xl);
			if (rc && c + 1 < blob_a[0])
				kvx_log(KVX_LOG_INFO, "engine: connect: %s not usable with this peer (%s), trying the next",
					xport_code_name(code), kvx_strerror(rc));
		}
		pos += cl;
	}
	if (!ep) {
		if (rc == -EPROTO)
			kvx_log(KVX_LOG_ERROR, "engine: connect: peer offers transport %s, this engine uses %s",
				offered, e->transport);
		return rc;
	}
	e->accepted[e->n_accepted++] = ep;
	blob_b[0] = xport_code(kvx_xport_name(e->xctx[xi]));
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[xi]));
	uint32_t x32 = (uint32_t)xl, nreg = e->n_layers;
	memcpy(blob_b + 1, &x32, 4);
	size_t off = 5 + xl;
	memcpy(blob_b + off, &nreg, 4);
	off += 4;
	for (uint32_t i = 0; i < nreg; i++) {
		rc = kvx_xport_mr_export(e->layers[i].mr[xi], blob_b + off, KVX_XPORT_RDESC_BYTES, NULL);
		if (rc)
			return rc;
		off += KVX_XPORT_RDESC_BYTES;
	}
	uint64_t nb = e->layers[0].geom.num_blocks;
	memcpy(blob_b + off, &nb, 8);
	*len_b = off + 8;
	return 0;
}

static int make_blob(void *arg, uint32_t dp_rank, const struct kvx_msg_meta *remote, uint8_t *blob_a, size_t cap,
		     size_t *len_a)
{
	(void)dp_rank;
	(void)remote;
	struct peer *pr = arg;
	/* A re-handshake (stale peer): the poller drained and unlisted the old endpoint before it
	 * queued this job, so nothing else touches it. */
	struct kvx_engine *e = pr->e;
	pthread_mutex_lock(&e->acc_lock);
	kvx_xport_ep_destroy(pr->ep);
	kvx_xport_ep_destroy(pr->ep_alt);
	pr->ep = pr->ep_alt = NULL;
	/* Candidates: shm first when this engine has it (auto), then the primary provider. */
	struct kvx_xport_ep *eps[2] = {NULL, NULL};
	size_t pos = 1;
	int rc = 0;
	uint8_t n = 0;
	for (uint32_t k = 0; k < e->n_xctx && !rc; k++) {
		uint32_t xi = e->n_xctx - 1 - k;
		size_t xl = 0;
		if (cap < pos + 5) {
			rc = -EMSGSIZE;
			break;
		}
		rc = kvx_xport_ep_create(e->xctx[xi], &eps[xi], blob_a + pos + 5, cap - pos - 5, &xl);
		if (rc)
			break;
		uint32_t x32 = (uint32_t)xl;
		blob_a[pos] = xport_code(kvx_xport_name(e->xctx[xi]));
		memcpy(blob_a + pos + 1, &x32, 4);
		pos += 5 + xl;
		n++;
	}
	if (rc) {
		kvx_xport_ep_destroy(eps[0]);
		kvx_xport_ep_destroy(eps[1]);
	} else {
		blob_a[0] = n;
		*len_a = pos;
		pr->ep = eps[0];
		pr->ep_alt = eps[1];
		pr->xi = 0;
	}
	pthread_mutex_unlock(&e->acc_lock);
	return rc;
}

static int peer_setup(struct peer *pr, const struct kvx_ctl_hs_rank *r)
{
	struct kvx_engine *e = pr->e;
	const uint8_t *b = r->blob_b;
	size_t len = r->blob_b_len, off = 0;
	uint32_t xl, nreg;
	uint64_t nb;
	if (!b || len < 5)
		return -EPROTO;
	int xi = xctx_index(e, b[0]);
	if (xi < 0 || (xi == 0 ? !pr->ep : !pr->ep_alt)) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u chose transport %s, which this engine did not offer",
			pr->host, pr->hs_port, xport_code_name(b[0]));
		return -EPROTO;
	}
	b++;
	len--;
	memcpy(&xl, b, 4);
	if (xl > KVX_XPORT_BLOB_MAX || len < 4 + (size_t)xl + 4)
		return -EPROTO;
	off = 4 + xl;
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
	pthread_mutex_lock(&e->acc_lock);
	if (xi == 1) {
		struct kvx_xport_ep *t = pr->ep;
		pr->ep = pr->ep_alt;
		pr->ep_alt = t;
	}
	kvx_xport_ep_destroy(pr->ep_alt);
	pr->ep_alt = NULL;
	pr->xi = (uint32_t)xi;
	int rc = kvx_xport_ep_connect(pr->ep, b + 4, xl);
	if (!rc)
		atomic_store(&e->last_xport, kvx_xport_name(e->xctx[xi]));
	for (uint32_t i = 0; !rc && i < nreg; i++)
		rc = kvx_xport_rmr_import(pr->ep, b + off + (size_t)i * KVX_XPORT_RDESC_BYTES, KVX_XPORT_RDESC_BYTES,
					  &pr->rmr[i]);
	pthread_mutex_unlock(&e->acc_lock);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < nreg; i++) {
		pr->geom[i] = e->layers[i].geom;
		kvx_layout_set_remote_blocks(&pr->geom[i], nb);
	}
	pr->remote_num_blocks = nb;
	return 0;
}

static void on_hs_done(void *arg, const struct kvx_ctl_hs_result *res)
{
	struct peer *pr = arg;
	struct kvx_engine *e = pr->e;
	int rc = res->status;
	if (rc == 0 && res->num_ranks == 1)
		rc = peer_setup(pr, &res->ranks[0]);
	else if (rc == 0)
		rc = -EPROTO;
	if (rc == 0 && res->ranks[0].meta) {
		uint64_t ep_new = res->ranks[0].meta->epoch;
		if (pr->epoch && ep_new != pr->epoch)
			kvx_log(KVX_LOG_INFO, "engine: peer %s:%u dp %u restarted (epoch %llu -> %llu)", pr->host,
				pr->hs_port, pr->dp_rank, (unsigned long long)pr->epoch, (unsigned long long)ep_new);
		pr->epoch = ep_new; /* published to the poller by the PEER_READY enqueue below */
	}
	if (rc)
		kvx_log(KVX_LOG_WARN, "engine: handshake with %s:%u dp %u failed: %s%s%s", pr->host, pr->hs_port,
			pr->dp_rank, kvx_strerror(rc), res->error[0] ? ": " : "", res->error);
	pr->hs_error = rc;
	struct emsg m = {.type = rc ? M_PEER_FAILED : M_PEER_READY, .status = rc, .ptr = pr};
	cin_push(e, &m);
	atomic_store_explicit(&pr->hs_state, rc ? HS_FAILED : HS_READY, memory_order_release);
}

/* Start a handshake with @p pr through inbox @p ib if its state is still @p from (CAS, so the
 * app thread and the poller never both start one). -EALREADY: another thread won. */
static int hs_start(struct kvx_engine *e, struct kvx_ctl_inbox *ib, struct peer *pr, int from)
{
	uint32_t rtp = 0, ptp = pr->tp_size ? pr->tp_size : e->p.tp_size;
	int rc = kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, ptp, &rtp, NULL, 0);
	if (rc)
		return rc;
	if (!atomic_compare_exchange_strong_explicit(&pr->hs_state, &from, HS_PENDING, memory_order_acq_rel,
						     memory_order_acquire))
		return -EALREADY;
	uint32_t rank = pr->dp_rank;
	struct kvx_ctl_hs_params hp = {
		.host = pr->host,
		.handshake_base_port = pr->hs_port,
		.dp_size = pr->dp_rank + 1,
		.dp_size_local = pr->dp_size_local,
		.tp_rank = rtp,
		.tp_size = ptp,
		.port_mode = e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE,
		.ranks = &rank,
		.num_ranks = 1,
		.timeout_ms = e->p.handshake_timeout_ms,
		.make_blob = make_blob,
		.on_done = on_hs_done,
		.arg = pr,
	};
	rc = kvx_ctl_handshake_start(ib, &hp);
	if (rc)
		atomic_store_explicit(&pr->hs_state, from, memory_order_release);
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Poller                                                                                    */
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

/* Notify port of the peer TP rank this worker pairs with (PROTOCOL.md §2.4 targets). */
static uint16_t peer_notify_port(const struct kvx_engine *e, const struct peer *pr, uint32_t rtp)
{
	uint32_t ptp = peer_tp(e, pr);
	return (uint16_t)(pr->notify_port + port_off(e, kvx_ctl_fold_local_rank(pr->dp_rank, pr->dp_size_local), rtp, ptp));
}

static void send_notify(struct kvx_engine *e, const struct peer *pr, uint16_t port, enum kvx_msg_type t,
			const char *tid, const uint32_t *blocks, uint32_t n)
{
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
	}
	if (kvx_ctl_send_notify(e->poll_ib, pr->host, port, &m))
		atomic_fetch_add_explicit(&e->st_notify_drop, 1, memory_order_relaxed);
}

static void send_to_paired_rank(struct kvx_engine *e, const struct peer *pr, enum kvx_msg_type t, const char *tid)
{
	uint32_t rtp = 0;
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, peer_tp(e, pr), &rtp, NULL, 0);
	send_notify(e, pr, peer_notify_port(e, pr, rtp), t, tid, NULL, 0);
}

/* D WRITE: remote_blocks / release go to every P TP rank, from TP rank 0 only (PROTOCOL.md
 * §1.3 step 5b: the scheduler of the D DP rank sends once). */
static void send_to_all_ranks(struct kvx_engine *e, const struct peer *pr, enum kvx_msg_type t, const char *tid,
			      const uint32_t *blocks, uint32_t n)
{
	if (e->p.tp_rank != 0)
		return;
	for (uint32_t r = 0; r < peer_tp(e, pr); r++)
		send_notify(e, pr, peer_notify_port(e, pr, r), t, tid, blocks, n);
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
 * `last` entry is enqueued the application may free the xf: the caller must not touch it. */
static void push_cpl(struct kvx_engine *e, const struct cmsg *c, unsigned n)
{
	kvx_ring_enqueue_elem_burst_sp(e->cpl, c, n, NULL);
}

static void remove_live(struct kvx_engine *e, struct xf *x)
{
	uint32_t i = x->live_idx;
	e->live[i] = e->live[--e->n_live];
	e->live[i]->live_idx = i;
	e->slots[x->slot] = NULL;
	e->free_slots[e->n_free++] = x->slot;
}

static void count_terminal(struct kvx_engine *e, struct xf *x, enum kvx_cpl_status st)
{
	_Atomic uint64_t *c = st == KVX_CPL_DONE ? &e->st_done
			      : st == KVX_CPL_ABORTED ? &e->st_aborted
			      : st == KVX_CPL_TIMED_OUT ? &e->st_timed_out
							: &e->st_failed;
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
	if (x->peer) {
		atomic_fetch_add_explicit(&x->peer->transfers, 1, memory_order_relaxed);
		if (st != KVX_CPL_DONE)
			atomic_fetch_add_explicit(&x->peer->failures, 1, memory_order_relaxed);
	}
}

/* Report the terminal state once; if release_now the blocks are reusable too and the xf
 * retires: it is unlinked first and the completions are enqueued last, so the poller never
 * touches an xf the application may already have freed. */
static void report(struct kvx_engine *e, struct xf *x, enum kvx_cpl_status st, int error, bool release_now)
{
	struct cmsg c[2];
	unsigned n = 0;
	if (!x->reported) {
		x->reported = true;
		atomic_store_explicit(&x->final_error, error, memory_order_relaxed);
		atomic_store_explicit(&x->final, 1 + (int)st, memory_order_release);
		kvx_waiter_wake(&e->app_w);
		count_terminal(e, x, st);
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
		kvx_ctl_mark_terminal(e->poll_ib, x->tid);
		remove_live(e, x);
	}
	push_cpl(e, c, n);
}

static struct kvx_xfer *tab_open(struct kvx_engine *e, const char *tid)
{
	struct kvx_xfer *t = kvx_xfer_find(e->tab, tid);
	if (t)
		return t;
	if (kvx_xfer_open(e->tab, tid, &t))
		return NULL;
	return t;
}

static void list_peer(struct kvx_engine *e, struct peer *pr)
{
	if (pr->listed)
		return;
	pr->listed = true;
	e->ready_peers[e->n_ready++] = pr;
}

/* Post one layer of a transfer: plan (cached per geometry), one batch per caps.max_batch ops. */
static int post_layer(struct kvx_engine *e, struct xf *x, uint32_t layer, enum kvx_xport_opcode op,
		      const uint32_t *lids, const uint32_t *rids, size_t n)
{
	struct peer *pr = x->peer;
	struct kvx_plan plan;
	int rc = kvx_plan_cache_get(e->pc, &pr->geom[layer], lids, rids, n, &plan);
	if (rc < 0)
		return rc;
	uint32_t maxb = e->caps[pr->xi].max_batch ? e->caps[pr->xi].max_batch : 1;
	uint32_t nb = (uint32_t)((plan.n + maxb - 1) / maxb);
	if (nb == 0)
		return 0;
	for (size_t i = 0; i < plan.n; i++) {
		e->ops[i] = (struct kvx_xport_op){.lmr = e->layers[layer].mr[pr->xi], .rmr = pr->rmr[layer],
						  .loff = plan.loc[i], .roff = plan.rem[i], .len = plan.size[i]};
	}
	uint64_t cookie = ((uint64_t)x->slot << 16) | layer;
	for (uint32_t b = 0; b < nb; b++) {
		size_t first = (size_t)b * maxb;
		uint32_t cnt = (uint32_t)(plan.n - first < maxb ? plan.n - first : maxb);
		rc = kvx_xport_post_bulk(pr->ep, op, e->ops + first, cnt, cookie);
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
		pr->outstanding++;
		atomic_fetch_add_explicit(&e->st_ops, cnt, memory_order_relaxed);
		atomic_fetch_add_explicit(&pr->ops, cnt, memory_order_relaxed);
	}
	return 0;
}

static void read_progress(struct kvx_engine *e, struct xf *x)
{
	if (x->reported) {
		/* Terminal (timed out / aborted): release P and the blocks once the ops are terminal. */
		if (x->batches_out == 0) {
			/* An abort always releases P; a timeout only once ops were posted (they are
			 * terminal now): a peer that never answered gets nothing late. */
			if ((x->aborted || x->next_layer > 0) && !x->release_sent) {
				x->release_sent = true;
				send_to_paired_rank(e, x->peer, KVX_MSG_RELEASE, x->tid);
			}
			report(e, x, KVX_CPL_ABORTED, 0, true);
		}
		return;
	}
	/* A failed transfer finishes even while its (stale) peer is re-handshaking. */
	if (x->await_rehs || (!x->failed && !x->peer->ready))
		return;
	uint32_t hold = atomic_load_explicit(&e->test_hold_layers, memory_order_relaxed);
	uint32_t limit = hold < e->n_layers ? hold : e->n_layers;
	if (x->next_layer == 0)
		x->peer_epoch = x->peer->epoch;
	if (!x->failed)
		kvx_plan_cache_reset(e->pc);
	while (!x->failed && x->next_layer < limit) {
		if (post_layer(e, x, x->next_layer, KVX_XPORT_OP_READ, x->lblocks, x->rblocks, x->n))
			break;
		x->next_layer++;
	}
	if (x->next_layer == e->n_layers || x->failed)
		x->done_posting = true;
	if (x->done_posting && x->batches_out == 0) {
		x->release_sent = true;
		send_to_paired_rank(e, x->peer, KVX_MSG_RELEASE, x->tid);
		report(e, x, x->failed ? KVX_CPL_FAILED : KVX_CPL_DONE, x->failed ? x->error : 0, true);
	}
}

/* 1 the layer may be written, 0 not yet, negative errno if its event failed (hipEventQuery
 * error). Never blocks (kvx_mem_event_query() is a load or one hipEventQuery). */
static int layer_gate_open(const struct xf *x, uint32_t layer)
{
	const atomic_uint *f = x->ready_flag[layer];
	if (f)
		return atomic_load_explicit(f, memory_order_acquire) != 0;
	return kvx_mem_event_query(&x->ready_ev[layer]);
}

static void write_progress(struct kvx_engine *e, struct xf *x)
{
	struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
	if (x->reported || !t || t->state != KVX_XFER_S_LIVE) {
		if (x->batches_out == 0) {
			if (x->aborted && !x->release_sent) {
				/* D aborted: tell it our writes are terminal so its blocks leave quarantine. */
				x->release_sent = true;
				send_to_paired_rank(e, x->peer, KVX_MSG_WRITE_DONE, x->tid);
			}
			report(e, x, x->aborted ? KVX_CPL_ABORTED : x->timed_out ? KVX_CPL_TIMED_OUT : KVX_CPL_FAILED,
			       x->error, true);
		}
		return;
	}
	if (!x->peer->ready || !t->has_alloc)
		return;
	/* Pair by token position: D's announced blocks hold the tail of the prompt; an extra D
	 * block (first generated token) stays unpaired (PROTOCOL.md §6 item 8). */
	size_t nl = x->n, nr = t->n_remote_blocks, n = nl < nr ? nl : nr;
	const uint32_t *lids = x->lblocks + (nl > nr ? nl - nr : 0);
	kvx_plan_cache_reset(e->pc);
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
				memset(x->want_post, 0, sizeof(x->want_post));
				x->failed = true;
				x->error = g;
				kvx_xfer_mark_write_done(e->tab, x->tid, false);
				report(e, x, KVX_CPL_FAILED, g, x->batches_out == 0);
				return;
			}
			if (post_layer(e, x, layer, KVX_XPORT_OP_WRITE, lids, t->remote_blocks, n))
				return;
			x->want_post[w] &= ~(1ull << (layer % 64));
			if (x->layer_batches[layer] == 0 && !x->failed) {
				/* Nothing to move for this layer (empty plan): it is done. */
				kvx_xfer_mark_write_done(e->tab, x->tid, true);
			}
		}
	}
}

static void finish_write_ok(struct kvx_engine *e, struct xf *x, int32_t decode_dp)
{
	struct peer *pr = x->peer;
	uint32_t rtp = 0, dtp = peer_tp(e, pr);
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, dtp, &rtp, NULL, 0);
	uint32_t dp = decode_dp >= 0 ? (uint32_t)decode_dp : pr->dp_rank;
	uint16_t port = (uint16_t)(pr->notify_port +
				   port_off(e, kvx_ctl_fold_local_rank(dp, pr->dp_size_local), rtp, dtp));
	send_notify(e, pr, port, KVX_MSG_WRITE_DONE, x->tid, NULL, 0);
	report(e, x, KVX_CPL_DONE, 0, true);
}

static void progress(struct kvx_engine *e, struct xf *x)
{
	switch (x->kind) {
	case XK_READ:
		read_progress(e, x);
		break;
	case XK_WRITE:
		write_progress(e, x);
		break;
	case XK_ANNOUNCE:
	case XK_SERVE:
		break; /* driven by notifications and timeouts */
	}
}

static void handle_submit(struct kvx_engine *e, struct xf *x)
{
	x->live_idx = e->n_live;
	e->live[e->n_live++] = x;
	x->slot = e->free_slots[--e->n_free];
	e->slots[x->slot] = x;
	struct kvx_xfer *t;
	switch (x->kind) {
	case XK_READ:
		if (x->n == 0) {
			/* Full prefix hit / abort before allocation: release P, no RDMA. */
			send_to_paired_rank(e, x->peer, KVX_MSG_RELEASE, x->tid);
			report(e, x, KVX_CPL_DONE, 0, true);
			return;
		}
		read_progress(e, x);
		return;
	case XK_ANNOUNCE:
		if (x->n == 0) {
			send_to_all_ranks(e, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
			report(e, x, KVX_CPL_DONE, 0, true);
			return;
		}
		t = tab_open(e, x->tid);
		if (t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed) {
			/* write_done arrived before the announcement was processed (parked). */
			report(e, x, KVX_CPL_DONE, 0, true);
			return;
		}
		kvx_ctl_mark_live(e->poll_ib, x->tid, x->peer->host, x->peer->notify_port);
		send_to_all_ranks(e, x->peer, KVX_MSG_REMOTE_BLOCKS, x->tid, x->lblocks, (uint32_t)x->n);
		return;
	case XK_WRITE:
		t = tab_open(e, x->tid);
		if (t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed) {
			/* D released (aborted) before we began: nothing was written; say so, so that D's
			 * quarantined blocks are freed without waiting for its defer timeout. */
			x->aborted = true;
			send_to_paired_rank(e, x->peer, KVX_MSG_WRITE_DONE, x->tid);
			report(e, x, KVX_CPL_ABORTED, -ECANCELED, true);
			return;
		}
		return;
	case XK_SERVE:
		t = tab_open(e, x->tid);
		if (t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed) {
			report(e, x, KVX_CPL_DONE, 0, true);
			return;
		}
		return;
	}
}

static struct xf *live_find(struct kvx_engine *e, const char *tid)
{
	for (uint32_t i = 0; i < e->n_live; i++)
		if (!strcmp(e->live[i]->tid, tid))
			return e->live[i];
	return NULL;
}

static void handle_notify(struct kvx_engine *e, struct emsg *m)
{
	struct xf *x = live_find(e, m->tid);
	switch (m->u32) {
	case KVX_MSG_REMOTE_BLOCKS: {
		int rc = kvx_xfer_remote_blocks_take(e->tab, m->tid, m->ptr, m->n, m->status);
		if (rc <= 0)
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		if (x)
			write_progress(e, x);
		return;
	}
	case KVX_MSG_RELEASE: {
		if (x && x->kind == XK_WRITE) {
			/* D aborted a push transfer: stop posting, answer once our writes are terminal. */
			if (!x->reported) {
				x->aborted = true;
				x->error = -ECANCELED;
				memset(x->want_post, 0, sizeof(x->want_post));
				struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
				if (t && t->state == KVX_XFER_S_LIVE)
					kvx_xfer_make_terminal(e->tab, t);
				report(e, x, KVX_CPL_ABORTED, -ECANCELED, false);
			}
			write_progress(e, x);
			return;
		}
		if (!x && !kvx_xfer_find(e->tab, m->tid))
			tab_open(e, m->tid); /* early release: parked until the transfer is submitted */
		int rc = kvx_xfer_resolve_ack(e->tab, m->tid, (uint32_t)m->u64, e->p.tp_size);
		if (rc == 1 && x && x->kind == XK_SERVE)
			report(e, x, KVX_CPL_DONE, 0, true);
		else if (rc < 0)
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		return;
	}
	case KVX_MSG_WRITE_DONE: {
		if (!x && !kvx_xfer_find(e->tab, m->tid))
			tab_open(e, m->tid); /* parked until announce (fault b) */
		uint32_t ptp = x && x->peer ? peer_tp(e, x->peer) : e->p.tp_size;
		int rc = kvx_xfer_resolve_ack(e->tab, m->tid, ptp, e->p.tp_size);
		if (rc == 1 && x && x->kind == XK_ANNOUNCE) {
			/* Done, or (after abort/timeout) P's writes are terminal: blocks leave quarantine. */
			report(e, x, KVX_CPL_DONE, 0, true);
		} else if (rc == 0 && !x) {
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		}
		return;
	}
	default:
		return;
	}
}

/* The peer's endpoint is in error state (transport.h: every op fails from now on): stop using
 * it, drain it, then re-handshake (poll_fn) so later transfers get a fresh endpoint
 * (PROTOCOL.md §6 item 18). */
static void peer_stale(struct kvx_engine *e, struct peer *pr)
{
	if (pr->stale)
		return;
	pr->stale = true;
	pr->ready = false;
	atomic_fetch_add_explicit(&e->st_peer_resets, 1, memory_order_relaxed);
}

/* After a re-handshake: retry a READ that moved nothing only against a new peer epoch (the old
 * incarnation's blocks are gone either way); the same epoch means the producer fenced us (its
 * defer timeout) or the link failed, and the blocks may have been reused: fail. */
static void rehs_decide(struct peer *pr, struct xf *x)
{
	x->await_rehs = false;
	if (pr->epoch != x->peer_epoch && x->bytes == 0 && x->batches_out == 0) {
		x->next_layer = 0;
		x->done_posting = false;
		memset(x->layer_batches, 0, sizeof(x->layer_batches));
		return;
	}
	x->failed = true;
	x->error = -ECONNRESET;
	x->done_posting = true;
}

static void handle_cpl(struct kvx_engine *e, struct peer *pr, const struct kvx_xport_cpl *c)
{
	uint32_t slot = (uint32_t)(c->cookie >> 16), layer = (uint32_t)(c->cookie & 0xffff);
	pr->outstanding--;
	struct xf *x = slot < e->p.max_transfers ? e->slots[slot] : NULL;
	if (!x || layer >= e->n_layers)
		return;
	x->batches_out--;
	x->layer_batches[layer]--;
	x->bytes += c->bytes;
	atomic_fetch_add_explicit(&e->st_bytes, c->bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&pr->bytes, c->bytes, memory_order_relaxed);
	if (c->status) {
		bool ep_dead = kvx_xport_ep_status(pr->ep) != 0;
		if (ep_dead)
			peer_stale(e, pr);
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
			struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
			if (t)
				dp = t->decode_dp_rank;
			if (kvx_xfer_mark_write_done(e->tab, x->tid, true) == KVX_XFER_ACT_NOTIFY_WRITE_DONE) {
				finish_write_ok(e, x, dp);
				return;
			}
		}
	}
	if (x->failed && x->kind == XK_WRITE && !x->reported) {
		kvx_xfer_mark_write_done(e->tab, x->tid, false);
		report(e, x, KVX_CPL_FAILED, x->error, false);
	}
	progress(e, x);
}

static void handle_sub(struct kvx_engine *e, struct emsg *m)
{
	struct xf *x;
	switch (m->type) {
	case M_SUBMIT:
		handle_submit(e, m->ptr);
		return;
	case M_LAYER_READY:
		x = live_find(e, m->tid);
		if (!x || x->kind != XK_WRITE || x->reported)
			return;
		if (!kvx_xfer_schedule_write(e->tab, x->tid, m->u32))
			return; /* duplicate (transfer, layer): no-op */
		x->ready_flag[m->u32] = m->ptr;
		x->ready_ev[m->u32] = m->ev;
		x->want_post[m->u32 / 64] |= 1ull << (m->u32 % 64);
		write_progress(e, x);
		return;
	case M_SEAL: {
		x = live_find(e, m->tid);
		if (!x || x->kind != XK_WRITE || x->reported)
			return;
		enum kvx_xfer_action act;
		int32_t dp = -1;
		struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
		if (t)
			dp = t->decode_dp_rank;
		if (kvx_xfer_seal_count(e->tab, x->tid, m->u32, &act) >= 0 && act == KVX_XFER_ACT_NOTIFY_WRITE_DONE)
			finish_write_ok(e, x, dp);
		return;
	}
	case M_ABORT:
		x = live_find(e, m->tid);
		if (!x || x->reported)
			return;
		x->aborted = true;
		x->error = -ECANCELED;
		if (x->kind == XK_ANNOUNCE) {
			send_to_all_ranks(e, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
			x->quarantine_deadline = kvx_now_ns() + ms_ns(e->p.defer_timeout_ms);
			report(e, x, KVX_CPL_ABORTED, -ECANCELED, false);
			return;
		}
		if (x->kind == XK_WRITE) {
			memset(x->want_post, 0, sizeof(x->want_post));
			struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
			if (t && t->state == KVX_XFER_S_LIVE)
				kvx_xfer_make_terminal(e->tab, t);
		}
		if (x->kind == XK_READ) {
			report(e, x, KVX_CPL_ABORTED, -ECANCELED, false);
			read_progress(e, x);
		} else {
			report(e, x, KVX_CPL_ABORTED, -ECANCELED, x->batches_out == 0);
		}
		return;
	default:
		return;
	}
}

static void handle_cin(struct kvx_engine *e, struct emsg *m)
{
	struct peer *pr = m->ptr;
	if (m->type == M_NOTIFY) {
		handle_notify(e, m);
		return;
	}
	pr->stale = false;
	if (m->type == M_PEER_READY) {
		pr->ready = true;
		list_peer(e, pr);
	}
	for (uint32_t i = 0; i < e->n_live;) {
		struct xf *x = e->live[i];
		uint32_t before = e->n_live;
		if (x->peer == pr && !x->reported) {
			if (m->type == M_PEER_READY && x->kind == XK_READ && x->await_rehs)
				rehs_decide(pr, x);
			if (m->type == M_PEER_FAILED && (x->kind == XK_READ || x->kind == XK_WRITE))
				report(e, x, KVX_CPL_FAILED, m->status ? m->status : -ECONNREFUSED, x->batches_out == 0);
			else
				progress(e, x);
		}
		if (e->n_live == before)
			i++;
	}
}

/* P READ defer timeout (PROTOCOL.md §5.4 with §6 item 11): the producer cannot see one-sided
 * reads, so it revokes them: destroying the target endpoints makes every consumer's further
 * access impossible (verbs: the QPs are gone; tcp: the next kvx_xport_progress(), on this
 * thread, closes their connections before serving anything else), and only then are the
 * blocks reported reusable. shm cannot be revoked by the target (see engine.h). */
static void fence_readers(struct kvx_engine *e)
{
	if (pthread_mutex_trylock(&e->acc_lock))
		return; /* the control thread is inside a transport call: retry at the next scan */
	for (uint32_t i = 0; i < e->n_accepted; i++)
		kvx_xport_ep_destroy(e->accepted[i]);
	e->n_accepted = 0;
	pthread_mutex_unlock(&e->acc_lock);
	atomic_fetch_add_explicit(&e->st_fences, 1, memory_order_relaxed);
	for (uint32_t i = 0; i < e->n_live;) {
		struct xf *x = e->live[i];
		uint32_t before = e->n_live;
		if (x->fence_pending) {
			x->fence_pending = false;
			e->n_fence_pending--;
			report(e, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, true);
		}
		if (e->n_live == before)
			i++;
	}
}

static void scan_timeouts(struct kvx_engine *e, uint64_t now)
{
	uint64_t tmo = ms_ns(e->p.transfer_timeout_ms), dfr = ms_ns(e->p.defer_timeout_ms);
	for (uint32_t i = 0; i < e->n_live;) {
		struct xf *x = e->live[i];
		uint32_t before = e->n_live;
		uint64_t age = now - x->start_ns;
		if (!x->reported) {
			bool serve_like = x->kind == XK_SERVE ||
					  (x->kind == XK_WRITE && !(kvx_xfer_find(e->tab, x->tid) &&
								    kvx_xfer_find(e->tab, x->tid)->has_alloc));
			uint64_t limit = serve_like ? dfr : tmo;
			if (age > limit) {
				x->timed_out = true;
				x->error = -ETIMEDOUT;
				if (x->kind == XK_ANNOUNCE) {
					/* Tell P to stop; our blocks stay quarantined until its write_done or a
					 * further defer_timeout (P's ops are bounded by its op timeout). */
					send_to_all_ranks(e, x->peer, KVX_MSG_RELEASE, x->tid, NULL, 0);
					x->quarantine_deadline = now + dfr;
					report(e, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, false);
				} else if (x->kind == XK_WRITE) {
					memset(x->want_post, 0, sizeof(x->want_post));
					struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
					if (t && t->state == KVX_XFER_S_LIVE)
						kvx_xfer_make_terminal(e->tab, t);
					report(e, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, x->batches_out == 0);
				} else if (x->kind == XK_SERVE) {
					struct kvx_xfer *t = kvx_xfer_find(e->tab, x->tid);
					if (t && t->state == KVX_XFER_S_LIVE)
						kvx_xfer_make_terminal(e->tab, t);
					/* A consumer's one-sided READ may still be in flight: the blocks stay
					 * held until fence_readers() revoked every reader at the wire. */
					report(e, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, false);
					x->fence_pending = true;
					e->n_fence_pending++;
				} else {
					report(e, x, KVX_CPL_TIMED_OUT, -ETIMEDOUT, false);
					read_progress(e, x);
				}
			}
		} else if (x->kind == XK_ANNOUNCE && x->quarantine_deadline && now > x->quarantine_deadline) {
			report(e, x, KVX_CPL_DONE, 0, true);
		}
		if (e->n_live == before)
			i++;
	}
	if (e->n_fence_pending)
		fence_readers(e);
}

static int poll_fn(void *arg)
{
	struct kvx_engine *e = arg;
	int busy = 0;
	struct emsg m[8];
	unsigned n = kvx_ring_dequeue_elem_burst_sc(e->sub, m, 8, NULL);
	for (unsigned i = 0; i < n; i++)
		handle_sub(e, &m[i]);
	busy |= n != 0;
	n = kvx_ring_dequeue_elem_burst_sc(e->cin, m, 8, NULL);
	for (unsigned i = 0; i < n; i++)
		handle_cin(e, &m[i]);
	busy |= n != 0;
	struct kvx_xport_cpl c[32];
	for (uint32_t p = 0; p < e->n_ready; p++) {
		struct peer *pr = e->ready_peers[p];
		if (pr->stale && !pr->outstanding) {
			/* Drained: unlist first (the handshake job destroys the endpoint on the control
			 * thread; the inbox enqueue orders our last use before it), then re-handshake. */
			if (hs_start(e, e->poll_ib, pr, HS_READY) == 0) {
				pr->listed = false;
				e->ready_peers[p--] = e->ready_peers[--e->n_ready];
			}
			continue;
		}
		if (!pr->outstanding)
			continue;
		int k = kvx_xport_poll_burst(pr->ep, c, 32);
		for (int i = 0; i < k; i++)
			handle_cpl(e, pr, &c[i]);
		busy |= pr->outstanding != 0 || k > 0;
	}
	/* Transfers waiting on the send queue or on a layer's readiness flag. */
	for (uint32_t i = 0; i < e->n_live;) {
		struct xf *x = e->live[i];
		uint32_t before = e->n_live;
		if (!x->reported && x->peer && x->peer->ready &&
		    ((x->kind == XK_READ && !x->done_posting) || x->kind == XK_WRITE))
			progress(e, x);
		if (e->n_live == before)
			i++;
	}
	for (uint32_t i = 0; i < e->n_xctx; i++)
		if (e->caps[i].needs_progress)
			busy |= kvx_xport_progress(e->xctx[i]) > 0;
	uint64_t now = kvx_now_ns();
	if (now >= e->next_scan_ns) {
		e->next_scan_ns = now + 1000000ull;
		scan_timeouts(e, now);
	}
	/* Idle sleeps are capped at 1 ms (kvx_engine_start), which bounds how late a deadline
	 * or a tcp target request is noticed. */
	return busy ? KVX_POLL_BUSY : KVX_POLL_IDLE;
}

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle                                                                                 */
/* ---------------------------------------------------------------------------------------- */

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
	e->poll_lc = kvx_lcore_set_at(e->set, 0);

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
							 .access = KVX_XPORT_ACCESS_ALL, .mem_type = KVX_XPORT_MEM_HOST};
			rc = kvx_xport_mr_register(e->xctx[k], &mp, &ly->mr[k]);
			if (rc) {
				kvx_log(KVX_LOG_ERROR, "engine: register layer '%s' (%s): %s", ly->name, provs[k],
					kvx_strerror(rc));
				return rc;
			}
		}
	}
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[0]));
	size_t maxops = 2 * (size_t)e->p.max_blocks;
	e->ops = calloc(maxops, sizeof(*e->ops));
	e->live = calloc(e->p.max_transfers, sizeof(*e->live));
	e->slots = calloc(e->p.max_transfers, sizeof(*e->slots));
	e->free_slots = calloc(e->p.max_transfers, sizeof(*e->free_slots));
	if (!e->ops || !e->live || !e->slots || !e->free_slots)
		return -ENOMEM;
	for (uint32_t i = 0; i < e->p.max_transfers; i++)
		e->free_slots[i] = e->p.max_transfers - 1 - i;
	e->n_free = e->p.max_transfers;
	if ((rc = kvx_plan_cache_create(e->p.max_blocks, &e->pc)) ||
	    (rc = kvx_xfer_table_create(2 * e->p.max_transfers + KVX_XFER_TERMINAL_LRU + 64, KVX_XFER_TERMINAL_LRU,
					&e->tab)))
		return rc;
	uint32_t cnt = 1;
	while (cnt < 4 * e->p.max_transfers)
		cnt <<= 1;
	struct kvx_ring_params rp = {.name = "eng-sub", .count = cnt, .elem_size = sizeof(struct emsg)};
	if ((rc = kvx_ring_create(&rp, &e->sub)))
		return rc;
	rp.name = "eng-cin";
	if ((rc = kvx_ring_create(&rp, &e->cin)))
		return rc;
	rp.name = "eng-cpl";
	rp.elem_size = sizeof(struct cmsg);
	if ((rc = kvx_ring_create(&rp, &e->cpl)))
		return rc;
	if ((rc = kvx_waiter_init(&e->app_w)))
		return rc;
	e->app_w_init = true;
	kvx_ring_set_waiter(e->sub, kvx_lcore_waiter(e->poll_lc));
	kvx_ring_set_waiter(e->cin, kvx_lcore_waiter(e->poll_lc));

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
	};
	if ((rc = kvx_ctl_create(&cp, &e->ctl)))
		return rc;
	struct kvx_msg_region *regs = calloc(e->n_layers, sizeof(*regs));
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
	meta.num_regions = e->n_layers;
	meta.regions = regs;
	struct kvx_msg_layers lm;
	memset(&lm, 0, sizeof(lm));
	snprintf(lm.engine_key, sizeof(lm.engine_key), "%s", meta.engine_key);
	lm.num_descs = e->n_layers;
	lm.descs = descs;
	for (uint32_t i = 0; i < e->n_layers; i++) {
		regs[i] = (struct kvx_msg_region){(uint64_t)(uintptr_t)e->layers[i].base, e->layers[i].span,
						  kvx_xport_mr_key(e->layers[i].mr[0])};
		snprintf(descs[i].layer, sizeof(descs[i].layer), "%s", e->layers[i].name);
		descs[i].id = i;
		descs[i].device_id = -1;
		descs[i].addr = regs[i].addr;
		descs[i].len_bytes = regs[i].len_bytes;
		descs[i].loc = 1;
	}
	rc = kvx_ctl_set_local(e->ctl, &meta, &lm);
	free(regs);
	free(descs);
	if (rc)
		return rc;
	if ((rc = kvx_ctl_inbox_open(e->ctl, &e->app_ib)) || (rc = kvx_ctl_inbox_open(e->ctl, &e->poll_ib)))
		return rc;
	if ((rc = kvx_ctl_start(e->ctl)))
		return rc;
	if ((rc = kvx_poller_register(e->poll_lc, poll_fn, e, "engine", NULL)))
		return rc;
	if (e->p.idle == KVX_ENGINE_IDLE_ADAPTIVE) {
		struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .max_sleep_ns = 1000000ull};
		kvx_lcore_set_idle(e->poll_lc, &ip);
	}
	for (unsigned i = 0; i < kvx_lcore_set_count(e->set); i++) {
		struct kvx_lcore *lc = kvx_lcore_set_at(e->set, i);
		if (lc == kvx_lcore_set_control(e->set))
			continue;
		if ((rc = kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL)))
			return rc;
	}
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
	for (unsigned i = 0; i < kvx_lcore_set_count(e->set); i++) {
		struct kvx_lcore *lc = kvx_lcore_set_at(e->set, i);
		if (lc == kvx_lcore_set_control(e->set))
			continue;
		kvx_lcore_stop(lc);
		kvx_lcore_wait(lc);
	}
	kvx_ctl_stop(e->ctl);
	/* The poller is joined: this thread now owns its state. Submissions it never saw and live
	 * transfers end as aborted (their blocks are reusable: no op can run any more). */
	struct emsg m;
	while (kvx_ring_dequeue_elem_burst_sc(e->sub, &m, 1, NULL)) {
		if (m.type != M_SUBMIT)
			continue;
		struct xf *x = m.ptr;
		x->live_idx = e->n_live;
		e->live[e->n_live++] = x;
		x->slot = e->free_slots[--e->n_free];
		e->slots[x->slot] = x;
	}
	while (e->n_live) {
		struct xf *x = e->live[0];
		struct cmsg c[2];
		unsigned n = 0;
		if (!x->reported) {
			x->reported = true;
			atomic_store_explicit(&x->final, 1 + KVX_CPL_ABORTED, memory_order_release);
			build(e, x, &c[n++], KVX_CPL_TRANSFER, KVX_CPL_ABORTED, -ECANCELED, false);
		}
		build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
		remove_live(e, x);
		push_cpl(e, c, n);
	}
}

static void free_xf(struct xf *x)
{
	if (!x)
		return;
	free(x->lblocks);
	free(x->rblocks);
	free(x);
}

KVX_API void kvx_engine_destroy(struct kvx_engine *e)
{
	if (!e)
		return;
	kvx_engine_stop(e);
	struct cmsg c;
	while (e->cpl && kvx_ring_dequeue_elem_burst_sc(e->cpl, &c, 1, NULL))
		if (c.last)
			free_xf(c.xf);
	struct emsg m;
	while (e->sub && kvx_ring_dequeue_elem_burst_sc(e->sub, &m, 1, NULL))
		if (m.type == M_SUBMIT)
			free_xf(m.ptr);
	while (e->cin && kvx_ring_dequeue_elem_burst_sc(e->cin, &m, 1, NULL))
		if (m.type == M_NOTIFY)
			free(m.ptr);
	kvx_ctl_inbox_close(e->app_ib);
	kvx_ctl_inbox_close(e->poll_ib);
	kvx_ctl_destroy(e->ctl);
	for (uint32_t i = 0; i < e->n_peers; i++) {
		struct peer *pr = e->peers[i];
		kvx_xport_ep_destroy(pr->ep);
		kvx_xport_ep_destroy(pr->ep_alt);
		free(pr->rmr);
		free(pr->geom);
		free(pr);
	}
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
	kvx_ring_destroy(e->sub);
	kvx_ring_destroy(e->cin);
	kvx_ring_destroy(e->cpl);
	kvx_plan_cache_destroy(e->pc);
	kvx_xfer_table_destroy(e->tab);
	kvx_xfer_table_destroy(e->reg);
	pthread_mutex_destroy(&e->acc_lock);
	if (e->app_w_init)
		kvx_waiter_fini(&e->app_w);
	free(e->ops);
	free(e->live);
	free(e->slots);
	free(e->free_slots);
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
	struct peer *pr = NULL;
	for (uint32_t i = 0; i < e->n_peers; i++) {
		struct peer *q = e->peers[i];
		if (!strcmp(q->host, pp->host) && q->hs_port == pp->handshake_port && q->notify_port == pp->notify_port &&
		    q->dp_rank == pp->dp_rank) {
			pr = q;
			break;
		}
	}
	if (!pr) {
		if (e->n_peers == KVX_ENGINE_MAX_PEERS) {
			*rc = -ENOBUFS;
			return NULL;
		}
		pr = calloc(1, sizeof(*pr));
		if (pr) {
			pr->rmr = calloc(e->n_layers, sizeof(*pr->rmr));
			pr->geom = calloc(e->n_layers, sizeof(*pr->geom));
		}
		if (!pr || !pr->rmr || !pr->geom) {
			if (pr) {
				free(pr->rmr);
				free(pr->geom);
			}
			free(pr);
			*rc = -ENOMEM;
			return NULL;
		}
		pr->e = e;
		strcpy(pr->host, pp->host);
		pr->hs_port = pp->handshake_port;
		pr->notify_port = pp->notify_port;
		pr->dp_rank = pp->dp_rank;
		pr->dp_size_local = pp->dp_size_local;
		pr->tp_size = pp->tp_size;
		e->peers[e->n_peers++] = pr;
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
	if (kvx_xfer_live_count(e->reg) >= e->p.max_transfers)
		return -ENOBUFS;
	int rc = 0;
	struct peer *pr = NULL;
	if (pp) {
		bool hs = n > 0 && (kind == XK_READ || kind == XK_WRITE);
		pr = peer_get(e, pp, hs, &rc);
		if (!pr)
			return rc;
	}
	struct xf *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	memcpy(x->tid, tid, tl + 1);
	x->kind = kind;
	x->peer = pr;
	x->n = n;
	x->consumer_tp = consumer_tp;
	x->start_ns = kvx_now_ns();
	if (n) {
		x->lblocks = malloc(n * sizeof(uint32_t));
		if (!x->lblocks) {
			free_xf(x);
			return -ENOMEM;
		}
		memcpy(x->lblocks, lids, n * sizeof(uint32_t));
		if (rids) {
			x->rblocks = malloc(n * sizeof(uint32_t));
			if (!x->rblocks) {
				free_xf(x);
				return -ENOMEM;
			}
			memcpy(x->rblocks, rids, n * sizeof(uint32_t));
		}
	}
	struct kvx_xfer *r;
	rc = kvx_xfer_open(e->reg, tid, &r);
	if (rc) {
		free_xf(x);
		return rc;
	}
	r->user = x;
	struct emsg m = {.type = M_SUBMIT, .ptr = x};
	if (!kvx_ring_enqueue_elem_burst_sp(e->sub, &m, 1, NULL)) {
		kvx_xfer_make_terminal(e->reg, r);
		free_xf(x);
		return -ENOBUFS;
	}
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
	return kvx_ring_enqueue_elem_burst_sp(e->sub, &m, 1, NULL) ? 0 : -ENOBUFS;
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
	if (!e || !out || !e->cpl)
		return 0;
	size_t got = 0;
	struct cmsg c;
	while (got < n && kvx_ring_dequeue_elem_burst_sc(e->cpl, &c, 1, NULL)) {
		out[got++] = c.c;
		if (c.c.kind == KVX_CPL_TRANSFER) {
			struct kvx_xfer *r = kvx_xfer_find(e->reg, c.c.transfer_id);
			if (r) {
				r->final_status = (uint8_t)(1 + c.c.status);
				r->final_error = c.c.error;
			}
		}
		if (c.last) {
			struct kvx_xfer *r = kvx_xfer_find(e->reg, c.c.transfer_id);
			if (r && r->user == c.xf) {
				r->user = NULL;
				kvx_xfer_make_terminal(e->reg, r);
			}
			free_xf(c.xf);
		}
	}
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
	st->transfers_done = atomic_load_explicit(&((struct kvx_engine *)e)->st_done, memory_order_relaxed);
	st->transfers_failed = atomic_load_explicit(&((struct kvx_engine *)e)->st_failed, memory_order_relaxed);
	st->transfers_aborted = atomic_load_explicit(&((struct kvx_engine *)e)->st_aborted, memory_order_relaxed);
	st->transfers_timed_out = atomic_load_explicit(&((struct kvx_engine *)e)->st_timed_out, memory_order_relaxed);
	st->late_notifications = atomic_load_explicit(&((struct kvx_engine *)e)->st_late, memory_order_relaxed);
	st->quarantined = atomic_load_explicit(&((struct kvx_engine *)e)->st_quar, memory_order_relaxed);
	st->duplicates_rejected = e->st_dup;
	st->fences = atomic_load_explicit(&((struct kvx_engine *)e)->st_fences, memory_order_relaxed);
	st->peer_resets = atomic_load_explicit(&((struct kvx_engine *)e)->st_peer_resets, memory_order_relaxed);
	if (e->ctl) {
		struct kvx_ctl_counters cc;
		kvx_ctl_counters_get(e->ctl, &cc);
		st->notifications_sent = cc.notify_tx;
		st->notifications_received = cc.notify_rx;
	}
	if (e->set) {
		unsigned nl = kvx_lcore_set_count(e->set);
		for (unsigned i = 0; i < nl && st->n_lcores < KVX_ENGINE_MAX_POLLERS; i++) {
			struct kvx_lcore *lc = kvx_lcore_set_at(e->set, i);
			if (lc == kvx_lcore_set_control(e->set))
				continue;
			struct kvx_lcore_stats ls;
			kvx_lcore_stats_get(lc, &ls);
			struct kvx_engine_lcore_stats *o = &st->lcores[st->n_lcores++];
			o->lcore_id = kvx_lcore_id(lc);
			o->utilization = ls.util_pct / 100.0;
			if (lc == e->poll_lc) {
				o->bytes = atomic_load_explicit(&((struct kvx_engine *)e)->st_bytes, memory_order_relaxed);
				o->ops = atomic_load_explicit(&((struct kvx_engine *)e)->st_ops, memory_order_relaxed);
				o->transfers = st->transfers_done + st->transfers_failed + st->transfers_aborted +
					       st->transfers_timed_out;
				o->failures = st->transfers_failed + st->transfers_timed_out;
			}
		}
	}
	for (uint32_t i = 0; i < e->n_peers && i < KVX_ENGINE_MAX_PEERS; i++) {
		struct peer *pr = e->peers[i];
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

void kvx_engine_test_hold_read(struct kvx_engine *e, bool on, uint32_t n_layers)
{
	atomic_store_explicit(&e->test_hold_layers, on ? n_layers : UINT32_MAX, memory_order_relaxed);
}
