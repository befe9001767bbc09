/* SPDX-License-Identifier: Apache-2.0 */
/* The engine: ties the lcores, the control lcore and a transport provider together and drives
 * both transfer modes on both roles (docs/protocol.md §1.3, §1.4, §5 with §6 fixed; docs/architecture.md §1).
 * This file: create, layer registration, start, stop, destroy, stats. The rest, by thread:
 * api.c (app thread), poller*.c (polling lcores), peer.c (control lcore: handshakes,
 * connections, inbound notifications), xfer.c (per-transfer state, no I/O).
 *
 * Threads and ownership:
 *  - app thread: every public call. Owns the transfer registry (`reg`: the app-facing edge
 *    where transfer ids are resolved to transfer objects), the peer identities (`peers[]`,
 *    handshake start through its own control inbox) and the pool of transfer objects (`xpool`,
 *    block-id arena, per-layer arrays: all preallocated at start; a submission takes a free
 *    object, the last polled completion gives it back).
 *  - polling lcore k (0..n_po-1): owns the transfers whose id hashes to k (eng_tid_poller(), the
 *    same function on every thread, so a notification is routed to the poller that owns its
 *    transfer with no shared state): their entries (`tab`), posting, completion polling of its
 *    own endpoint of every peer connection (link k), timeouts, outbound notifications (its own
 *    control inbox). Polling lcore k also runs the tcp target's progress group k (each
 *    peer endpoint's connections are served by one of them) and confirms reader fences.
 *  - control lcore: handshakes (make_blob / on_done), connection accept, inbound
 *    notifications, and every control-path transport call (endpoint create, accept, connect,
 *    destroy; reader fences); it publishes peer connections (`struct conn`: epoch, one
 *    endpoint per polling lcore, remote regions, num_blocks) in the RCU table `conns` keyed by
 *    peer id, and routes notifications to the owning poller's ring. No lock is shared with
 *    the pollers: they hand it work through the `dead` stack and fence counters, with an
 *    eventfd doorbell (eng_on_ctl_work()).
 * Rings (element rings of fixed messages), per polling lcore k, SPSC: app->k `sub`
 * (submission, then handles), control->k `cin` (notifications by id, peer events), k->app
 * `cpl`, k->control (its control inbox `ib`); MPSC, the layer spread (issue 16, poller_post.c):
 * any owner poller -> k `dreq` ("post layer L of transfer X" for helper k), any helper
 * poller -> k `dres` (that layer's outcome back to its owner k).
 * Peer connections: pollers look a peer's connection up in the RCU table (QSBR: their poll
 * loop announces a quiescent state once per iteration) and take a reference while a transfer
 * or a poll list uses it; a re-handshake (endpoint error, peer restart: new epoch) publishes a
 * new connection that replaces the old entry; the old one is destroyed only after a grace
 * period AND once its last reference is dropped (eng_conn_put()). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/control.h"
#include "kvxfer/engine.h"
#include "kvxfer/lcore.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"
#include "engine_internal.h"
#include "metrics_internal.h"

static bool auto_shm_disabled(void)
{
	const char *v = getenv("KVX_ENGINE_AUTO_NO_SHM");
	return v && v[0] && strcmp(v, "0");
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
	p->follow_waker = true;
	p->poller_slice_us = KVX_LCORE_SLICE_MIN_US;
	p->host = "127.0.0.1";
	p->handshake_port = KVX_CTL_DEFAULT_HANDSHAKE_PORT;
	p->notify_port = KVX_CTL_DEFAULT_NOTIFY_PORT;
	p->dp_size = 1;
	p->tp_size = 1;
	p->handshake_timeout_ms = 10000;
	p->transfer_timeout_ms = 30000;
	p->defer_timeout_ms = 60000;
	p->peer_idle_ms = 60000;
	p->control_busy_poll_us = 100;
	p->spread = KVX_ENGINE_SPREAD_LAYERS;
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
	if (p->spread != KVX_ENGINE_SPREAD_LAYERS && p->spread != KVX_ENGINE_SPREAD_NONE)
		return bad(err, errlen, "spread", "must be KVX_ENGINE_SPREAD_LAYERS or KVX_ENGINE_SPREAD_NONE");
	if (p->idle != KVX_ENGINE_IDLE_BUSY && p->idle != KVX_ENGINE_IDLE_ADAPTIVE)
		return bad(err, errlen, "idle", "must be BUSY or ADAPTIVE");
	if (p->poller_slice_us && (p->poller_slice_us < KVX_LCORE_SLICE_MIN_US || p->poller_slice_us > KVX_LCORE_SLICE_MAX_US))
		return bad(err, errlen, "poller_slice_us", "must be 0 or 100..100000 (us)");
	if (p->control_busy_poll_us > 1000000)
		return bad(err, errlen, "control_busy_poll_us", "must be 0..1000000 (us)");
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
	e->p.metrics_addr = NULL; /* the copy lives in e->metrics */
	if (copy_str(e->verbs_dev, sizeof(e->verbs_dev), p->verbs_device)) {
		free(e);
		return bad(err, errlen, "verbs_device", "longer than 63 bytes");
	}
	e->p.verbs_device = e->verbs_dev[0] ? e->verbs_dev : NULL;
	int rc = p->metrics_addr ? kvx_metrics_create(p->metrics_addr, &e->metrics, err, errlen) : 0;
	if (!rc)
		rc = kvx_xfer_table_create(2 * p->max_transfers + 64, p->max_transfers, &e->reg);
	if (rc) {
		kvx_metrics_destroy(e->metrics);
		free(e);
		return rc;
	}
	e->ctl_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->ctl_efd < 0) {
		rc = -errno;
		kvx_xfer_table_destroy(e->reg);
		kvx_metrics_destroy(e->metrics);
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
	if (e->metrics && (rc = kvx_metrics_start(e->metrics, &e->p))) /* binds first: nothing to undo */
		return rc;
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
		po->wfd = -1;
		e->po[e->n_po++] = po;
	}
	struct kvx_rcu_table_params tp = {.key_type = KVX_RCU_KEY_U64, .free_fn = eng_conn_table_free};
	if ((rc = kvx_rcu_table_create(&tp, &e->conns)))
		return rc;

	/* docs/architecture.md §3 `auto`: verbs if usable; else tcp, plus shm for same-host peers when CMA is
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
	xp.tcp_port = e->p.data_port; /* 0 = ephemeral */
	xp.device = e->p.verbs_device; /* NULL = first ACTIVE device */
	xp.op_timeout_ns = ms_ns(e->p.transfer_timeout_ms);
	xp.progress_groups = e->n_po; /* tcp: every poller serves its share of target connections */
	e->n_prog = 1;
	for (uint32_t k = 0; k < 2 && provs[k]; k++) {
		rc = kvx_xport_open(provs[k], &xp, &e->xctx[k]);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "engine: transport '%s': %s", provs[k], kvx_strerror(rc));
			return rc;
		}
		e->n_xctx = k + 1;
		kvx_xport_query_caps(e->xctx[k], &e->caps[k]);
		if (e->caps[k].needs_progress && e->caps[k].progress_groups > e->n_prog)
			e->n_prog = e->caps[k].progress_groups;
		e->fence.n = e->n_prog;
		/* A late write through this transport lands unless the lease is checked per op
		 * (caps.cond_ops: tcp at the target, shm by the writer, docs/protocol.md §5.11):
		 * D WRITE quarantine expiry fences. */
		if (!e->caps[k].cond_ops)
			e->fence_writers = true;
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
	if ((rc = eng_lease_init(e))) {
		kvx_log(KVX_LOG_ERROR, "engine: lease directory: %s", kvx_strerror(rc));
		return rc;
	}
	/* Transfer objects, block ids and per-layer arrays: all sized here, from the params, so
	 * that no submission allocates (the hot-path rule). The block-id arena is mmap'ed: pages
	 * are only backed once a transfer of that size used them. */
	size_t mt = e->p.max_transfers, nlay = e->n_layers;
	e->xpool = calloc(mt, sizeof(*e->xpool));
	e->lb_pool = calloc(mt * nlay, sizeof(*e->lb_pool));
	e->gate_pool = calloc(mt * nlay, sizeof(*e->gate_pool));
	e->stage_cap = 2 * (uint32_t)mt;
	e->stage = calloc(e->stage_cap, sizeof(*e->stage));
	e->arena_bytes = mt * 2 * (size_t)e->p.max_blocks * sizeof(uint32_t);
	void *ar = mmap(NULL, e->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	e->arena = ar == MAP_FAILED ? NULL : ar;
	if (!e->xpool || !e->lb_pool || !e->gate_pool || !e->stage || !e->arena)
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
		po->owned = calloc(mt, sizeof(*po->owned));
		if (!po->ops || !po->live || !po->owned)
			return -ENOMEM;
		if ((rc = kvx_plan_cache_create(e->p.max_blocks, &po->pc)) ||
		    (rc = kvx_xfer_table_create(2 * mt + KVX_XFER_TERMINAL_LRU + 64, KVX_XFER_TERMINAL_LRU, &po->tab)))
			return rc;
		struct kvx_ring_params rp = {.name = name, .count = cnt, .elem_size = sizeof(struct smsg)};
		snprintf(name, sizeof(name), "eng-sub%u", k);
		if ((rc = kvx_ring_create(&rp, &po->sub)))
			return rc;
		rp.elem_size = sizeof(struct emsg);
		snprintf(name, sizeof(name), "eng-cin%u", k);
		if ((rc = kvx_ring_create(&rp, &po->cin)))
			return rc;
		snprintf(name, sizeof(name), "eng-cpl%u", k);
		rp.elem_size = sizeof(struct cmsg);
		if ((rc = kvx_ring_create(&rp, &po->cpl)))
			return rc;
		kvx_ring_set_waiter(po->sub, kvx_lcore_waiter(po->lc));
		kvx_ring_set_waiter(po->cin, kvx_lcore_waiter(po->lc));
		/* Layer spread (poller_post.c): each owner has at most SPREAD_CAP layers handed to one
		 * helper, so a helper holds at most n_po x SPREAD_CAP and a ring never fills. */
		uint32_t dcnt = 2;
		while (dcnt < 2 * e->n_po * SPREAD_CAP)
			dcnt <<= 1;
		struct kvx_ring_params dp = {.name = name, .count = dcnt, .elem_size = sizeof(struct dmsg)};
		snprintf(name, sizeof(name), "eng-dreq%u", k);
		if ((rc = kvx_ring_create(&dp, &po->dreq)))
			return rc;
		dp.elem_size = sizeof(struct dres);
		snprintf(name, sizeof(name), "eng-dres%u", k);
		if ((rc = kvx_ring_create(&dp, &po->dres)))
			return rc;
		kvx_ring_set_waiter(po->dreq, kvx_lcore_waiter(po->lc));
		kvx_ring_set_waiter(po->dres, kvx_lcore_waiter(po->lc));
		po->n_dlg = e->n_po * SPREAD_CAP;
		po->dlg = calloc(po->n_dlg, sizeof(*po->dlg));
		po->dpend = calloc(po->n_dlg, sizeof(*po->dpend));
		if (!po->dlg || !po->dpend)
			return -ENOMEM;
		for (uint32_t i = 0; i < po->n_dlg; i++)
			po->dlg[i].next_free = i + 2 <= po->n_dlg ? i + 2 : 0;
		po->dlg_free = 1;
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
		.busy_poll_us = e->p.control_busy_poll_us,
		.on_notify = eng_on_notify,
		.notify_arg = e,
		.on_connect = eng_on_connect,
		.connect_arg = e,
		.auth_dir = e->p.auth_dir,
		.max_inboxes = e->n_po + 1 > 16 ? e->n_po + 1 : 0,
	};
	if ((rc = kvx_ctl_create(&cp, &e->ctl)))
		return rc;
	/* Control-path transport work the pollers hand over (dead connections, reader fences). */
	if ((rc = kvx_ctl_watch_fd(e->ctl, e->ctl_efd, eng_on_ctl_work, e)))
		return rc;
	/* Device async events (verbs: QP/CQ/port errors) are drained on the control lcore. */
	for (uint32_t k = 0; k < e->n_xctx; k++) {
		int fd = kvx_xport_ctx_event_fd(e->xctx[k]);
		if (fd < 0)
			continue; /* -ENOTSUP: tcp/shm have none */
		e->evw[k] = (struct evwatch){.e = e, .k = k, .fd = fd};
		if ((rc = kvx_ctl_watch_fd(e->ctl, fd, eng_on_xport_events, &e->evw[k]))) {
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
	/* MoRIIO form (docs/protocol.md §3.1, §4.1): a split layer advertises its K and V planes as two
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
	/* This worker's name in the acks and failure notes it sends kvxfer peers: its engine id
	 * (the handshake base port, or the bound one with ephemeral ports), TP rank and epoch. */
	uint16_t hs_bound = 0;
	kvx_ctl_bound_ports(e->ctl, &hs_bound, &e->self_nt);
	snprintf(e->self_id, sizeof(e->self_id), "%s:%u", e->host,
		 e->p.handshake_port ? e->p.handshake_port : hs_bound);
	e->self_epoch = kvx_ctl_epoch(e->ctl);
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		if ((rc = kvx_poller_register(po->lc, eng_poll_fn, po, "engine", NULL)))
			return rc;
		if ((rc = eng_poller_wait_init(e, po)))
			return rc;
		if (e->p.idle == KVX_ENGINE_IDLE_ADAPTIVE) {
			/* No periodic wake: the deadline scan timer (poller.c) bounds a sleep only
			 * while there is something to time out. */
			struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE,
							   .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP,
							   .follow_waker = e->p.follow_waker,
							   .slice_us = e->p.poller_slice_us};
			kvx_lcore_set_idle(po->lc, &ip);
		}
	}
	for (uint32_t k = 0; k < e->n_po; k++)
		if ((rc = kvx_lcore_launch(e->po[k]->lc, kvx_lcore_poll_loop, NULL)))
			return rc;
	e->started = true;
	if (e->metrics)
		kvx_metrics_on_poll(e->metrics, e, e->ctl, NULL, 0, &(struct kvx_metrics_app){0}, true); /* first */
	return 0;
}

KVX_API int kvx_engine_metrics_addr(const struct kvx_engine *e, char *buf, size_t len)
{
	if (!e || !e->metrics)
		return -ENOENT;
	return e->started ? kvx_metrics_addr(e->metrics, buf, len) : -EAGAIN;
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
	kvx_metrics_stop(e->metrics);
	for (uint32_t k = 0; k < e->n_po; k++)
		kvx_lcore_stop(e->po[k]->lc);
	for (uint32_t k = 0; k < e->n_po; k++)
		kvx_lcore_wait(e->po[k]->lc);
	kvx_ctl_stop(e->ctl);
	/* The pollers are joined: this thread now owns their state. Submissions they never saw and
	 * live transfers end as aborted (their blocks are reusable: no op can run any more). */
	for (uint32_t k = 0; k < e->n_po; k++) {
		struct poller *po = e->po[k];
		struct smsg m;
		while (kvx_ring_dequeue_elem_burst_sc(po->sub, &m, 1, NULL)) {
			if (m.type != M_SUBMIT)
				continue;
			struct xf *x = (struct xf *)m.ptr;
			x->live_idx = po->n_live;
			po->live[po->n_live++] = x;
			x->live = true;
		}
		while (po->n_live) {
			struct xf *x = po->live[0];
			struct cmsg c[2];
			unsigned n = 0;
			if (!x->lf.reported) {
				x->lf.reported = true;
				eng_cpl_build(e, x, &c[n++], KVX_CPL_TRANSFER, KVX_CPL_ABORTED, -ECANCELED, false);
			}
			eng_cpl_build(e, x, &c[n++], KVX_CPL_BLOCKS_RELEASED, KVX_CPL_DONE, 0, true);
			struct conn *cn = x->conn;
			x->conn = NULL;
			eng_remove_live(po, x);
			eng_conn_put_stopped(cn);
			eng_push_cpl(po, c, n);
		}
		while (po->plist) {
			struct conn *cn = po->plist;
			po->plist = cn->link[k].next;
			cn->link[k].listed = false;
			eng_conn_put_stopped(cn);
		}
	}
}

KVX_API void kvx_engine_destroy(struct kvx_engine *e)
{
	if (!e)
		return;
	kvx_engine_stop(e);
	kvx_metrics_destroy(e->metrics);
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
	eng_conn_reap_stopped(e);
	for (uint32_t i = 0; i < e->n_peers; i++)
		eng_hs_eps_destroy(&e->peers[i]);
	for (uint32_t i = 0; i < e->n_accepted; i++)
		kvx_xport_ep_destroy(e->accepted[i]);
	free(e->accepted);
	eng_lease_fini(e);
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
		kvx_ring_destroy(po->dreq);
		kvx_ring_destroy(po->dres);
		free(po->dlg);
		free(po->dpend);
		kvx_plan_cache_destroy(po->pc);
		kvx_xfer_table_destroy(po->tab);
		free(po->ops);
		free(po->live);
		free(po->owned);
		if (po->wfd >= 0)
			close(po->wfd);
		kvx_timer_heap_destroy(po->timers);
		free(po);
	}
	kvx_xfer_table_destroy(e->reg);
	close(e->ctl_efd);
	if (e->app_w_init)
		kvx_waiter_fini(&e->app_w);
	if (e->arena)
		munmap(e->arena, e->arena_bytes);
	free(e->xpool);
	free(e->lb_pool);
	free(e->gate_pool);
	free(e->stage);
	free((void *)e->lease);
	free(e->lease_buf);
	free(e);
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
	st->writer_holds = atomic_load_explicit(&m->st_writer_holds, memory_order_relaxed);
	/* xctx[] is fixed once started; the counters are atomics of the target's progress poller. */
	for (uint32_t k = 0; k < e->n_xctx; k++) {
		struct kvx_xport_counters xc;
		kvx_xport_ctx_service_counters(e->xctx[k], &xc);
		st->data_auth_refused += xc.auth_refused;
	}
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
		o->sleeps = ls.sleeps;
		o->wakeups = ls.wakeups;
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
