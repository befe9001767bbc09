/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control lcore object: parameters, create/start/stop/destroy, counters. The loop is in
 * loop.c, the inboxes in inbox.c, handshakes in handshake.c, notifications in notify.c.
 * docs/architecture.md §1, §4; docs/protocol.md §2, §3; docs/runtime-notes.md §5.2.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "ctl_impl.h"

void ctl_warn_rl(struct kvx_ctl *ctl, const char *fmt, ...)
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

struct peer_stat *ctl_peer_of(struct kvx_ctl *ctl, const char *addr)
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
	ctl->p.auth_dir = NULL; /* not kept: the keys are loaded here */
	if (p->auth_dir && p->auth_dir[0] && (rc = ctl_auth_load(ctl, p->auth_dir))) {
		free(ctl);
		return rc;
	}
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
	    !ctl->scratch_descs || !ctl->txbuf || ctl_smap_init(&ctl->terminal, 8192) ||
	    ctl_smap_init(&ctl->dealers, 1024) || ctl_smap_init(&ctl->live, 8192) ||
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

void *ctl_dealer_new(struct kvx_ctl *ctl, int64_t maxmsg)
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
	int arc = ctl_auth_server(ctl, s);
	if (arc) {
		zmq_close(s);
		return arc;
	}
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

/* One line at start: ports that anyone on the network can reach, without authentication. */
static void warn_unauthenticated(const struct kvx_ctl *ctl)
{
	const char *h = ctl->bind_host;
	if (ctl_auth_on(ctl) || !strncmp(h, "127.", 4) || !strcmp(h, "::1") ||
	    !strcmp(h, "localhost"))
		return;
	kvx_log(KVX_LOG_WARN, "control: binding %s without authentication: anyone who reaches "
		"these ports can read metadata and send notifications (set auth_dir / --auth-dir)",
		!strcmp(h, "*") ? "all interfaces" : h);
}

static int ctl_loop_lcore(void *arg)
{
	ctl_loop(arg);
	return 0;
}

static void hb_fire(struct kvx_timer *t, void *arg)
{
	struct kvx_ctl *ctl = arg;
	/* DONTWAIT: a proxy that is down never blocks the loop (HWM 16, then EAGAIN). */
	if (zmq_send(ctl->hb_dealer, ctl->hb_buf, ctl->hb_len, ZMQ_DONTWAIT) >= 0)
		CINC(ctl, heartbeats);
	kvx_timer_arm(ctl->timers, t, kvx_now_ns() + (uint64_t)ctl->p.heartbeat_ms * 1000000ull);
}

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
	warn_unauthenticated(ctl);
	rc = ctl_auth_zap_bind(ctl); /* before the ROUTERs can accept */
	rc = rc ? rc : bind_router(ctl, &ctl->hs_router, hs, KVX_MSG_HS_REQ_MAX_BYTES, &ctl->hs_port,
			 "handshake");
	rc = rc ? rc : bind_router(ctl, &ctl->nt_router, nt, KVX_MSG_NOTIFY_MAX_BYTES,
				   &ctl->nt_port, "notify");
	rc = rc ? rc : ctl_auth_monitor(ctl);
	if (!rc && ctl->proxy[0] && ctl->p.global_rank == 0) {
		struct kvx_msg_heartbeat h = {.role = ctl->p.role,
					      .dp_size = ctl->p.dp_size,
					      .tp_size = ctl->p.tp_size,
					      .mode = ctl->p.transfer_mode};
		/* The ports bound (rank 0: the base ports; ephemeral: the kernel's choice). */
		struct kvx_ctl_addr a = {.handshake_port = (uint16_t)atomic_load(&ctl->hs_port),
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
		ctl->hb_dealer = n < 0 ? NULL : ctl_dealer_new(ctl, 4096);
		char ph[KVX_CTL_HOST_MAX + 1];
		snprintf(ph, sizeof(ph), "%.*s", hl, ctl->proxy);
		if (n < 0 || !ctl->hb_dealer || ctl_auth_client(ctl, ctl->hb_dealer, ph) ||
		    zmq_connect(ctl->hb_dealer, ep)) {
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
	ctl_auth_close(ctl);
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
	ctl_smap_fini(&ctl->dealers, dealer_close_flush);
	ctl_smap_init(&ctl->dealers, 1024);
	atomic_store(&ctl->c.peers_open, 0);
	if (ctl->hb_dealer)
		zmq_close(ctl->hb_dealer);
	if (ctl->hs_router)
		zmq_close(ctl->hs_router);
	if (ctl->nt_router)
		zmq_close(ctl->nt_router);
	ctl->hb_dealer = ctl->hs_router = ctl->nt_router = NULL;
	ctl_auth_close(ctl);
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
				ctl_inbox_free(ib);
		}
	}
	ctl_smap_fini(&ctl->dealers, ctl->dealers.b ? dealer_close : NULL);
	ctl_smap_fini(&ctl->terminal, NULL);
	ctl_smap_fini(&ctl->live, free); /* values: the strdup()ed DEALER path of a pinned transfer */
	if (ctl->hb_dealer)
		zmq_close(ctl->hb_dealer);
	if (ctl->hs_router)
		zmq_close(ctl->hs_router);
	if (ctl->nt_router)
		zmq_close(ctl->nt_router);
	ctl_auth_close(ctl);
	if (ctl->zctx)
		zmq_ctx_term(ctl->zctx);
	ctl_auth_free(ctl);
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
	RD(watch_errors); RD(auth_refused); RD(auth_accepted);
	for (int i = 0; i < KVX_CTL_MSG_TYPES; i++) {
		RD(notify_rx_type[i]);
		RD(notify_tx_type[i]);
	}
	for (int r = 0; r < 2; r++) {
		RD(hs_lat_sum_ns[r]);
		for (int b = 0; b <= KVX_CTL_HS_NB; b++)
			RD(hs_lat[r][b]);
	}
#undef RD
}

size_t kvx_ctl_peer_stats_get(const struct kvx_ctl *ctl, struct kvx_ctl_peer_stats *out,
			      size_t cap)
{
	struct kvx_ctl *c = (struct kvx_ctl *)ctl;
	/* A1: pairs with R1 in ctl_peer_of(): the name is written before the count. */
	uint32_t n = atomic_load_explicit(&c->npeers, memory_order_acquire);
	size_t k = 0;
	for (uint32_t i = 0; i < n && k < cap; i++, k++) {
		snprintf(out[k].peer, sizeof(out[k].peer), "%s", c->peers[i].peer);
		out[k].rx = atomic_load_explicit(&c->peers[i].rx, memory_order_relaxed);
		out[k].malformed = atomic_load_explicit(&c->peers[i].malformed, memory_order_relaxed);
		out[k].dropped = atomic_load_explicit(&c->peers[i].dropped, memory_order_relaxed);
		out[k].refused = atomic_load_explicit(&c->peers[i].refused, memory_order_relaxed);
	}
	return k;
}
