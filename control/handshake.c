/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Handshakes: the initiator's jobs (get_meta_msg, then the optional kvx_connect exchange, rank by
 * rank, with a deadline each) and the handshake ROUTER that answers remote initiators.
 * docs/protocol.md §2.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "ctl_impl.h"

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
	struct slot *s = ctl_slot_get(ib);
	if (!s) {
		job_free(j);
		return -ENOBUFS;
	}
	s->kind = SLOT_HANDSHAKE;
	s->job = j;
	ctl_slot_submit(ib, s);
	return 0;
}

static int job_send_get_meta(struct kvx_ctl *ctl, struct hs_job *j)
{
	struct rank_state *r = &j->r[j->cur];
	char ep[KVX_CTL_HOST_MAX + 32];
	if (j->sock)
		zmq_close(j->sock);
	j->sock = ctl_dealer_new(ctl, KVX_MSG_HS_REPLY_MAX_BYTES);
	if (!j->sock)
		return -zmq_errno();
	if (strchr(r->host, ':')) {
		int one = 1;
		zmq_setsockopt(j->sock, ZMQ_IPV6, &one, sizeof(one));
	}
	int rc = kvx_ctl_zmq_path(r->host, r->port, ep, sizeof(ep));
	if (rc < 0)
		return rc;
	if ((rc = ctl_auth_client(ctl, j->sock, r->host)))
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
	ctl_job_finish(j->ctl, j, -ETIMEDOUT, stage[j->phase]);
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
		ctl_job_finish(ctl, j, -ENOMEM, "connecting");
		return;
	}
	int rc = job_send_get_meta(ctl, j);
	if (rc)
		ctl_job_finish(ctl, j, rc, "connecting");
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
	/* Latency histogram (metrics endpoint): start of the job to this report. */
	static const double bounds[KVX_CTL_HS_NB] = {KVX_CTL_HS_BOUNDS_S};
	uint64_t lat = res.end_ns - res.start_ns;
	int k = status ? 1 : 0, b = 0;
	while (b < KVX_CTL_HS_NB && (double)lat / 1e9 > bounds[b])
		b++;
	CINC(ctl, hs_lat[k][b]);
	atomic_fetch_add_explicit(&ctl->c.hs_lat_sum_ns[k], lat, memory_order_relaxed);
	j->p.on_done(j->p.arg, &res);
	free(rr);
}

/* Complete the job: status 0 only when every rank finished. Never registers partial ranks. */
void ctl_job_finish(struct kvx_ctl *ctl, struct hs_job *j, int status, const char *stage)
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
		ctl_warn_rl(ctl, "handshake with %s: %s", j->key, err);
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

void ctl_job_on_readable(struct kvx_ctl *ctl, struct hs_job *j)
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
				ctl_warn_rl(ctl, "handshake with %s:%u: %s", r->host, r->port, e);
			ctl_job_finish(ctl, j, rc, stage[ph]);
			return;
		}
		if (ph == HS_LAYERS) {
			/* kvx_connect goes only to a kvxfer listener (kvx_ keys in its metadata): a
			 * stock MoRIIO/MoRI listener accepts nothing but get_meta_msg, so its rank
			 * completes here without blob B and the caller decides (issue 14). */
			if (j->p.make_blob && r->meta.has_kvx) {
				size_t la = 0;
				uint8_t *blob = ctl->txbuf + 1024;
				rc = j->p.make_blob(j->p.arg, r->dp_rank, &r->meta, blob,
						    KVX_MSG_BLOB_MAX, &la);
				if (!rc && la > KVX_MSG_BLOB_MAX)
					rc = -EMSGSIZE;
				if (rc) {
					ctl_job_finish(ctl, j, rc, "preparing transport");
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
					ctl_job_finish(ctl, j, n2 < 0 ? n2 : -zmq_errno(),
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
				ctl_job_finish(ctl, j, 0, "");
				return;
			}
			rc = job_send_get_meta(ctl, j);
			if (rc) {
				ctl_job_finish(ctl, j, rc, "connecting");
				return;
			}
			/* The new socket has nothing to read yet; wait for zmq_poll. */
			return;
		}
	}
}

/* A job that never ran still gets exactly one on_done call, with -ECANCELED. */
void ctl_job_cancel_unstarted(struct kvx_ctl *ctl, struct hs_job *j)
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

void ctl_jobs_start_queued(struct kvx_ctl *ctl)
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

void ctl_job_enqueue(struct kvx_ctl *ctl, struct hs_job *j)
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
/* Handshake ROUTER (target)                                                                 */
/* ---------------------------------------------------------------------------------------- */

int ctl_hs_recv(struct kvx_ctl *ctl)
{
	for (int k = 0; k < RX_BATCH; k++) {
		zmq_msg_t id, pl;
		int nf;
		const char *addr;
		struct peer_stat *ps;
		int r = ctl_router_next(ctl, ctl->hs_router, &id, &pl, &nf, &addr, &ps);
		if (r == 0)
			return k;
		size_t len = zmq_msg_size(&pl);
		const uint8_t *d = zmq_msg_data(&pl);
		if (r < 0) {
			ctl_count_bad(ctl, ps, -EPROTO);
			ctl_warn_rl(ctl, "handshake: dropped a %d-frame message from %s", nf,
				addr ? addr : "?");
		} else if (len == KVX_MSG_GET_META_LEN && !memcmp(d, KVX_MSG_GET_META, len)) {
			if (ctl->meta_buf) {
				/* Counted before the replies leave: a peer that got them sees the count. */
				CINC(ctl, hs_served);
				ctl_router_reply(ctl->hs_router, &id, ctl->meta_buf, ctl->meta_len);
				ctl_router_reply(ctl->hs_router, &id, ctl->layers_buf, ctl->layers_len);
			} else {
				ctl_warn_rl(ctl, "handshake: get_meta_msg from %s before local metadata "
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
				ctl_count_bad(ctl, ps, rc);
				ctl_warn_rl(ctl, "handshake: dropped a %zu-byte message from %s: %s", len,
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
				CINC(ctl, connect_served); /* before the reply, as hs_served */
				if (n > 0)
					ctl_router_reply(ctl->hs_router, &id, out, (size_t)n);
				free(out);
			}
		}
		zmq_msg_close(&id);
		zmq_msg_close(&pl);
	}
	return RX_BATCH; /* the limit: more may be queued */
}
