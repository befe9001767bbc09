/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text-format metrics endpoint of an engine (runtime/metrics_internal.h). */
#include "metrics_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kvxfer/common.h"
#include "kvxfer/control.h"
#include "kvxfer/lcore.h"

#ifdef KVX_HAVE_METRICS
#include <microhttpd.h>
#endif

/* Latency histogram buckets (transfer, first layer, handshake), seconds (upper bounds; +Inf
 * implied): the control lcore's handshake histogram uses the same ones. */
static const double g_bounds[KVX_CTL_HS_NB] = {KVX_CTL_HS_BOUNDS_S};
#define NB ((size_t)KVX_CTL_HS_NB)
/* Outcomes, indexed by enum kvx_cpl_status. */
static const char *const g_outcome[4] = {"done", "failed", "aborted", "timed_out"};
/* Distinct (outcome, errno) pairs tracked; later ones share the last entry ("other"). */
#define NREASONS 16

struct reason {
	uint32_t outcome;
	int error; /* negative errno; INT32_MIN = "other" */
	uint64_t count;
};

/* Accumulated from polled completions: owned by the application thread, copied into snapshots. */
struct acc {
	uint64_t hist[4][NB + 1]; /* per outcome, per bucket (non-cumulative), last = +Inf */
	double sum_s[4];          /* per outcome, seconds */
	uint64_t count[4];
	uint64_t bytes[4];        /* bytes reported by the completions, per outcome */
	uint64_t released;        /* KVX_CPL_BLOCKS_RELEASED completions */
	uint64_t fl_hist[NB + 1]; /* submission -> first whole layer (completions with one), non-cumulative */
	double fl_sum_s;
	uint64_t fl_count;
	struct reason reasons[NREASONS];
	uint32_t n_reasons;
};

struct snap {
	uint64_t taken_ns;
	struct kvx_engine_stats st;
	struct kvx_ctl_counters cc;
	bool have_cc;
	struct kvx_ctl_peer_stats cps[KVX_CTL_PEER_STATS_MAX]; /* per source IP of control frames */
	size_t n_cps;
	struct kvx_metrics_app app;
	char transport[16];
	struct acc acc;
};

struct kvx_metrics {
	char host[KVX_ENGINE_HOST_MAX]; /* bind address ("" = every interface) */
	uint16_t port;                   /* requested port (0 = kernel-chosen) */
	uint16_t bound_port;
	bool v6;
	char role[16], mode[8], adv_host[KVX_ENGINE_HOST_MAX];
	uint32_t pool_size; /* params.max_transfers */
	/* application thread */
	struct acc acc;
	uint64_t last_pub_ns;
	bool published;
	/* hand-off: app -> http (`full`), http -> app (`free`); 3 buffers in all */
	struct kvx_ring *full, *free;
	struct snap *bufs[3];
	/* http thread */
	struct snap *cur;
#ifdef KVX_HAVE_METRICS
	struct MHD_Daemon *d;
#endif
};

/* "engine params: metrics_addr '<addr>': <why>" into err, and logged. */
static void seterr(char *err, size_t len, const char *addr, const char *why)
{
	if (err && len)
		snprintf(err, len, "engine params: metrics_addr '%s': %s", addr, why);
	kvx_log(KVX_LOG_ERROR, "engine params: metrics_addr '%s': %s", addr, why);
}

int kvx_metrics_create(const char *addr, struct kvx_metrics **out, char *err, size_t errlen)
{
#ifndef KVX_HAVE_METRICS
	(void)out;
	seterr(err, errlen, addr, "this kvxfer was built without libmicrohttpd (install libmicrohttpd-dev and rebuild)");
	return -ENOTSUP;
#else
	const char *colon = strrchr(addr, ':');
	if (!colon || !colon[1]) {
		seterr(err, errlen, addr, "expected IP:PORT, [IPv6]:PORT or :PORT");
		return -EINVAL;
	}
	char *end;
	errno = 0;
	unsigned long port = strtoul(colon + 1, &end, 10);
	if (errno || *end || port > 65535 || colon[1] == '-') {
		seterr(err, errlen, addr, "the port is not 0..65535");
		return -EINVAL;
	}
	struct kvx_metrics *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	size_t hl = (size_t)(colon - addr);
	const char *h = addr;
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
		m->v6 = true;
	}
	if (hl >= sizeof(m->host)) {
		free(m);
		seterr(err, errlen, addr, "host too long");
		return -EINVAL;
	}
	memcpy(m->host, h, hl);
	m->host[hl] = '\0';
	struct in6_addr a6;
	struct in_addr a4;
	if (m->host[0] && !(m->v6 ? inet_pton(AF_INET6, m->host, &a6) == 1 : inet_pton(AF_INET, m->host, &a4) == 1)) {
		free(m);
		seterr(err, errlen, addr, "the host is not an IP literal");
		return -EINVAL;
	}
	m->port = (uint16_t)port;
	*out = m;
	return 0;
#endif
}

#ifdef KVX_HAVE_METRICS
/* Label value: backslash, double quote and newline escaped (text format 0.0.4). */
static void put_label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f), fputc(*s, f);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram series: cumulative _bucket lines, _sum and _count. @p lbl: labels without
 * braces ("" = none), @p b: non-cumulative bucket counts [NB + 1]. */
static void hist(FILE *f, const char *name, const char *lbl, const uint64_t *b, double sum_s, uint64_t count)
{
	uint64_t cum = 0;
	const char *sep = lbl[0] ? "," : "";
	for (size_t i = 0; i <= NB; i++) {
		cum += b[i];
		if (i < NB)
			fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, lbl, sep, g_bounds[i], (unsigned long long)cum);
		else
			fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lbl, sep, (unsigned long long)cum);
	}
	fprintf(f, lbl[0] ? "%s_sum{%s} %.9f\n" : "%s_sum%s %.9f\n", name, lbl, sum_s);
	fprintf(f, lbl[0] ? "%s_count{%s} %llu\n" : "%s_count%s %llu\n", name, lbl, (unsigned long long)count);
}

static void errname(int error, char *buf, size_t len)
{
	if (error == INT32_MIN) {
		snprintf(buf, len, "other");
		return;
	}
	const char *n = error < 0 ? strerrorname_np(-error) : NULL;
	if (n)
		snprintf(buf, len, "%s", n);
	else
		snprintf(buf, len, "E%d", -error);
}

static void render(FILE *f, const struct kvx_metrics *m, const struct snap *s)
{
	const struct kvx_engine_stats *st = &s->st;
	head(f, "kvxfer_info", "gauge", "Engine identity; the value is 1.");
	fprintf(f, "kvxfer_info{role=\"%s\",mode=\"%s\",transport=\"", m->role, m->mode);
	put_label(f, s->transport);
	fputs("\",host=\"", f);
	put_label(f, m->adv_host);
	fputs("\"} 1\n", f);
	head(f, "kvxfer_metrics_snapshot_age_seconds", "gauge",
	     "Age of the snapshot shown (taken when the application last polled completions).");
	fprintf(f, "kvxfer_metrics_snapshot_age_seconds %.6f\n", (double)(kvx_now_ns() - s->taken_ns) / 1e9);

	head(f, "kvxfer_transfers_total", "counter", "Transfers that reached a terminal state, by outcome.");
	uint64_t by[4] = {st->transfers_done, st->transfers_failed, st->transfers_aborted, st->transfers_timed_out};
	for (int i = 0; i < 4; i++)
		fprintf(f, "kvxfer_transfers_total{outcome=\"%s\"} %llu\n", g_outcome[i], (unsigned long long)by[i]);
	head(f, "kvxfer_transfer_errors_total", "counter",
	     "Terminal transfers polled by the application that did not succeed, by outcome and reason (errno name).");
	for (uint32_t i = 0; i < s->acc.n_reasons; i++) {
		char en[32];
		errname(s->acc.reasons[i].error, en, sizeof(en));
		fprintf(f, "kvxfer_transfer_errors_total{outcome=\"%s\",reason=\"%s\"} %llu\n",
			g_outcome[s->acc.reasons[i].outcome], en, (unsigned long long)s->acc.reasons[i].count);
	}
	head(f, "kvxfer_transfers_in_flight", "gauge", "Transfers submitted and not yet terminal.");
	fprintf(f, "kvxfer_transfers_in_flight %llu\n", (unsigned long long)(s->app.objects - s->app.held));
	head(f, "kvxfer_transfers_quarantined", "gauge",
	     "Terminal transfers whose blocks are not reusable yet (KVX_CPL_BLOCKS_RELEASED still due): "
	     "held while ops could still touch them.");
	fprintf(f, "kvxfer_transfers_quarantined %llu\n", (unsigned long long)s->app.held);
	head(f, "kvxfer_transfer_pool_size", "gauge",
	     "Preallocated transfer objects (params.max_transfers); in flight plus quarantined take one each.");
	fprintf(f, "kvxfer_transfer_pool_size %u\n", m->pool_size);
	head(f, "kvxfer_transfer_pool_full_total", "counter",
	     "Submissions refused with ENOBUFS because every transfer object was taken.");
	fprintf(f, "kvxfer_transfer_pool_full_total %llu\n", (unsigned long long)s->app.pool_full);
	head(f, "kvxfer_transfer_duration_seconds", "histogram",
	     "Submission to terminal state of the transfers polled by the application, by outcome.");
	for (int o = 0; o < 4; o++) {
		char lbl[32];
		snprintf(lbl, sizeof(lbl), "outcome=\"%s\"", g_outcome[o]);
		hist(f, "kvxfer_transfer_duration_seconds", lbl, s->acc.hist[o], s->acc.sum_s[o], s->acc.count[o]);
	}
	head(f, "kvxfer_first_layer_seconds", "histogram",
	     "Submission to the first layer whose ops all completed on this engine (READ: landed here; "
	     "WRITE: written), over the polled transfers that moved a whole layer.");
	hist(f, "kvxfer_first_layer_seconds", "", s->acc.fl_hist, s->acc.fl_sum_s, s->acc.fl_count);
	head(f, "kvxfer_transfer_bytes_total", "counter", "Bytes of the transfers polled by the application, by outcome.");
	for (int o = 0; o < 4; o++)
		fprintf(f, "kvxfer_transfer_bytes_total{outcome=\"%s\"} %llu\n", g_outcome[o],
			(unsigned long long)s->acc.bytes[o]);
	head(f, "kvxfer_blocks_released_total", "counter", "Transfers whose blocks became reusable (KVX_CPL_BLOCKS_RELEASED).");
	fprintf(f, "kvxfer_blocks_released_total %llu\n", (unsigned long long)s->acc.released);

	uint64_t bytes = 0, ops = 0;
	for (uint32_t i = 0; i < st->n_lcores; i++) {
		bytes += st->lcores[i].bytes;
		ops += st->lcores[i].ops;
	}
	head(f, "kvxfer_bytes_total", "counter", "Bytes moved by the ops this engine posted.");
	fprintf(f, "kvxfer_bytes_total %llu\n", (unsigned long long)bytes);
	head(f, "kvxfer_ops_total", "counter", "Ops (merged ranges) this engine posted.");
	fprintf(f, "kvxfer_ops_total %llu\n", (unsigned long long)ops);

	static const struct { const char *name, *type, *help; } lc[5] = {
		{"kvxfer_lcore_bytes_total", "counter", "Bytes moved by ops a polling lcore posted."},
		{"kvxfer_lcore_ops_total", "counter", "Ops a polling lcore posted."},
		{"kvxfer_lcore_transfers_total", "counter", "Transfers finished on a polling lcore."},
		{"kvxfer_lcore_failures_total", "counter", "Transfers that failed or timed out on a polling lcore."},
		{"kvxfer_lcore_utilization", "gauge", "Busy polls / all polls of a polling lcore since start (0..1)."},
	};
	for (int k = 0; k < 5; k++) {
		head(f, lc[k].name, lc[k].type, lc[k].help);
		for (uint32_t i = 0; i < st->n_lcores; i++) {
			const struct kvx_engine_lcore_stats *l = &st->lcores[i];
			fprintf(f, "%s{lcore=\"%u\"} ", lc[k].name, l->lcore_id);
			if (k == 4)
				fprintf(f, "%.4f\n", l->utilization);
			else
				fprintf(f, "%llu\n", (unsigned long long)(k == 0   ? l->bytes
									  : k == 1 ? l->ops
									  : k == 2 ? l->transfers
										   : l->failures));
		}
	}
	static const char *const pn[4] = {"kvxfer_peer_bytes_total", "kvxfer_peer_ops_total",
					  "kvxfer_peer_transfers_total", "kvxfer_peer_failures_total"};
	for (int k = 0; k < 4; k++) {
		head(f, pn[k], "counter", "Per peer worker (host, notify port, DP rank): as the per-lcore counter.");
		for (uint32_t i = 0; i < st->n_peers; i++) {
			const struct kvx_engine_peer_stats *p = &st->peers[i];
			fprintf(f, "%s{peer=\"", pn[k]);
			put_label(f, p->host);
			fprintf(f, ":%u\",dp_rank=\"%u\"} %llu\n", p->port, p->dp_rank,
				(unsigned long long)(k == 0 ? p->bytes : k == 1 ? p->ops : k == 2 ? p->transfers : p->failures));
		}
	}
	static const struct { const char *name, *help; } one[6] = {
		{"kvxfer_duplicate_transfer_ids_total", "Submissions rejected because the transfer id was in use."},
		{"kvxfer_late_notifications_total", "Notifications for terminal transfers (or the other role), dropped."},
		{"kvxfer_quarantined_total", "Block frees held back while ops could still be in flight."},
		{"kvxfer_fences_total", "Reader fences (producer READ: target endpoints torn down at a defer timeout)."},
		{"kvxfer_peer_resets_total", "Peers whose endpoint entered the error state and were handshaken again."},
		{"kvxfer_notifications_total", "Notify frames sent to / received from peers."},
	};
	uint64_t ov[5] = {st->duplicates_rejected, st->late_notifications, st->quarantined, st->fences, st->peer_resets};
	for (int k = 0; k < 5; k++) {
		head(f, one[k].name, "counter", one[k].help);
		fprintf(f, "%s %llu\n", one[k].name, (unsigned long long)ov[k]);
	}
	head(f, one[5].name, "counter", one[5].help);
	fprintf(f, "kvxfer_notifications_total{direction=\"sent\"} %llu\n", (unsigned long long)st->notifications_sent);
	fprintf(f, "kvxfer_notifications_total{direction=\"received\"} %llu\n",
		(unsigned long long)st->notifications_received);
	if (s->have_cc) {
		const struct kvx_ctl_counters *c = &s->cc;
		head(f, "kvxfer_control_dropped_total", "counter",
		     "Control-plane frames dropped or refused, by reason (malformed includes unknown_type and oversize).");
		const struct { const char *r; uint64_t v; } d[6] = {
			{"malformed", c->malformed},     {"unknown_type", c->unknown_type},
			{"oversize", c->oversize},       {"terminal", c->dropped_terminal},
			{"send_error", c->send_errors},  {"inbox_full", c->inbox_full},
		};
		for (int k = 0; k < 6; k++)
			fprintf(f, "kvxfer_control_dropped_total{reason=\"%s\"} %llu\n", d[k].r, (unsigned long long)d[k].v);
		head(f, "kvxfer_handshakes_total", "counter", "Handshake jobs this engine initiated, by result.");
		fprintf(f, "kvxfer_handshakes_total{result=\"ok\"} %llu\n", (unsigned long long)c->hs_ok);
		fprintf(f, "kvxfer_handshakes_total{result=\"failed\"} %llu\n", (unsigned long long)c->hs_failed);
		head(f, "kvxfer_handshake_duration_seconds", "histogram",
		     "Handshake jobs this engine initiated, start to completion (metadata of every peer rank, "
		     "connection setup), by result.");
		for (int r = 0; r < 2; r++) {
			uint64_t n = 0;
			for (size_t b = 0; b <= NB; b++)
				n += c->hs_lat[r][b];
			hist(f, "kvxfer_handshake_duration_seconds", r ? "result=\"failed\"" : "result=\"ok\"",
			     c->hs_lat[r], (double)c->hs_lat_sum_ns[r] / 1e9, n);
		}
		head(f, "kvxfer_control_messages_total", "counter",
		     "Control-plane messages by direction and type: notifications (remote_blocks, write_done, "
		     "release, completion = legacy plain id, kvx_failed, kvx_status_query, raw = kvx_ctl_send_raw "
		     "bytes), handshake requests "
		     "answered (get_meta_msg, kvx_connect) and proxy heartbeats sent.");
		static const char *const tn[KVX_CTL_MSG_TYPES] = {"raw",        "remote_blocks", "write_done",
								  "release",    "completion",    "kvx_failed",
								  "kvx_status_query"};
		_Static_assert(KVX_CTL_MSG_TYPES == KVX_MSG_STATUS_QUERY + 1, "a name per notify type");
		for (int t = 1; t < KVX_CTL_MSG_TYPES; t++)
			fprintf(f, "kvxfer_control_messages_total{direction=\"received\",type=\"%s\"} %llu\n", tn[t],
				(unsigned long long)c->notify_rx_type[t]);
		fprintf(f, "kvxfer_control_messages_total{direction=\"received\",type=\"get_meta_msg\"} %llu\n",
			(unsigned long long)c->hs_served);
		fprintf(f, "kvxfer_control_messages_total{direction=\"received\",type=\"kvx_connect\"} %llu\n",
			(unsigned long long)c->connect_served);
		for (int t = 0; t < KVX_CTL_MSG_TYPES; t++)
			fprintf(f, "kvxfer_control_messages_total{direction=\"sent\",type=\"%s\"} %llu\n", tn[t],
				(unsigned long long)c->notify_tx_type[t]);
		fprintf(f, "kvxfer_control_messages_total{direction=\"sent\",type=\"heartbeat\"} %llu\n",
			(unsigned long long)c->heartbeats);
		head(f, "kvxfer_handshake_requests_served_total", "counter",
		     "Handshake requests answered, by kind (get_meta_msg, kvx_connect).");
		fprintf(f, "kvxfer_handshake_requests_served_total{kind=\"metadata\"} %llu\n", (unsigned long long)c->hs_served);
		fprintf(f, "kvxfer_handshake_requests_served_total{kind=\"connect\"} %llu\n",
			(unsigned long long)c->connect_served);
		head(f, "kvxfer_control_peer_frames_total", "counter",
		     "Control frames per source address (handshake and notify listeners): received, refused as "
		     "malformed, dropped as late.");
		for (size_t i = 0; i < s->n_cps; i++) {
			const struct kvx_ctl_peer_stats *cp = &s->cps[i];
			const char *k[3] = {"received", "malformed", "late"};
			uint64_t v[3] = {cp->rx, cp->malformed, cp->dropped};
			for (int j = 0; j < 3; j++) {
				fputs("kvxfer_control_peer_frames_total{source=\"", f);
				put_label(f, cp->peer);
				fprintf(f, "\",kind=\"%s\"} %llu\n", k[j], (unsigned long long)v[j]);
			}
		}
		head(f, "kvxfer_heartbeats_total", "counter", "Heartbeat frames sent to the proxy.");
		fprintf(f, "kvxfer_heartbeats_total %llu\n", (unsigned long long)c->heartbeats);
		head(f, "kvxfer_control_peers_open", "gauge", "Cached DEALER sockets to peers.");
		fprintf(f, "kvxfer_control_peers_open %llu\n", (unsigned long long)c->peers_open);
	}
	head(f, "kvxfer_auth_connections_total", "counter",
	     "Inbound connections by plane and result. control (with auth_dir): CURVE connections to the "
	     "handshake and notify listeners (refused: no CURVE, a failed handshake, or a key not in "
	     "allowed/). data: tcp data connections whose hello named no endpoint or did not prove its "
	     "secret (refused only).");
	if (s->have_cc) {
		fprintf(f, "kvxfer_auth_connections_total{plane=\"control\",result=\"accepted\"} %llu\n",
			(unsigned long long)s->cc.auth_accepted);
		fprintf(f, "kvxfer_auth_connections_total{plane=\"control\",result=\"refused\"} %llu\n",
			(unsigned long long)s->cc.auth_refused);
	}
	fprintf(f, "kvxfer_auth_connections_total{plane=\"data\",result=\"refused\"} %llu\n",
		(unsigned long long)st->data_auth_refused);
}

/* libmicrohttpd's polling thread: the newest snapshot becomes current, older ones go back. */
static void take_newest(struct kvx_metrics *m)
{
	void *p;
	while (kvx_ring_dequeue_burst_sc(m->full, &p, 1, NULL) == 1) {
		if (m->cur)
			kvx_ring_enqueue_burst_sp(m->free, (void *const *)&m->cur, 1, NULL);
		m->cur = p;
	}
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
			     const char *version, const char *upload, size_t *upload_len, void **state)
{
	(void)version;
	(void)upload;
	(void)upload_len;
	(void)state;
	struct kvx_metrics *m = cls;
	char *text = NULL;
	size_t len = 0;
	unsigned code = MHD_HTTP_OK;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return MHD_NO;
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		code = MHD_HTTP_METHOD_NOT_ALLOWED;
		fputs("only GET /metrics\n", f);
	} else if (strcmp(url, "/metrics")) {
		code = MHD_HTTP_NOT_FOUND;
		fputs("kvxfer serves /metrics only\n", f);
	} else {
		take_newest(m);
		if (m->cur)
			render(f, m, m->cur);
		else {
			code = MHD_HTTP_SERVICE_UNAVAILABLE;
			fputs("no snapshot yet\n", f);
		}
	}
	if (fclose(f)) {
		free(text);
		return MHD_NO;
	}
	struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	enum MHD_Result ret = MHD_queue_response(conn, code, r);
	MHD_destroy_response(r);
	return ret;
}
#endif

int kvx_metrics_start(struct kvx_metrics *m, const struct kvx_engine_params *p)
{
#ifndef KVX_HAVE_METRICS
	(void)m;
	(void)p;
	return -ENOTSUP;
#else
	if (m->d)
		return -EBUSY;
	snprintf(m->role, sizeof(m->role), "%s", p->role == KVX_SCHED_PRODUCER ? "producer" : "consumer");
	snprintf(m->mode, sizeof(m->mode), "%s", p->mode == KVX_SCHED_MODE_READ ? "read" : "write");
	snprintf(m->adv_host, sizeof(m->adv_host), "%s", p->host ? p->host : "");
	m->pool_size = p->max_transfers;
	struct kvx_ring_params rp = {.name = "metrics", .count = 4};
	int rc = kvx_ring_create(&rp, &m->full);
	if (!rc)
		rc = kvx_ring_create(&rp, &m->free);
	for (int i = 0; !rc && i < 3; i++) {
		m->bufs[i] = calloc(1, sizeof(struct snap));
		if (!m->bufs[i])
			rc = -ENOMEM;
		else
			kvx_ring_enqueue_burst_sp(m->free, (void *const *)&m->bufs[i], 1, NULL);
	}
	if (rc)
		return rc;
	struct sockaddr_storage ss = {0};
	if (m->v6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons(m->port);
		if (m->host[0])
			inet_pton(AF_INET6, m->host, &a->sin6_addr);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_port = htons(m->port);
		if (m->host[0])
			inet_pton(AF_INET, m->host, &a->sin_addr);
	}
	/* One internal polling thread: it alone consumes `full` and produces `free`. */
	m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (m->v6 ? MHD_USE_IPv6 : 0), m->port,
				NULL, NULL, serve, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
	if (!m->d) {
		int e = errno ? errno : EIO;
		kvx_log(KVX_LOG_ERROR, "engine: metrics endpoint on %s:%u: cannot listen (%s)", m->host[0] ? m->host : "*",
			m->port, strerror(e));
		return e == EADDRINUSE || e == EADDRNOTAVAIL ? -e : -EIO;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
	m->bound_port = di ? di->port : m->port;
	return 0;
#endif
}

void kvx_metrics_on_poll(struct kvx_metrics *m, const struct kvx_engine *e, const struct kvx_ctl *ctl,
			 const struct kvx_completion *c, size_t n, const struct kvx_metrics_app *app, bool force)
{
	struct acc *a = &m->acc;
	for (size_t i = 0; i < n; i++) {
		if (c[i].kind == KVX_CPL_BLOCKS_RELEASED) {
			a->released++;
			continue;
		}
		uint32_t o = (uint32_t)c[i].status < 4 ? (uint32_t)c[i].status : 1;
		double sec = (double)c[i].duration_ns / 1e9;
		size_t b = 0;
		while (b < NB && sec > g_bounds[b])
			b++;
		a->hist[o][b]++;
		a->sum_s[o] += sec;
		if (c[i].first_layer_ns) {
			double fl = (double)c[i].first_layer_ns / 1e9;
			size_t k = 0;
			while (k < NB && fl > g_bounds[k])
				k++;
			a->fl_hist[k]++;
			a->fl_sum_s += fl;
			a->fl_count++;
		}
		a->count[o]++;
		a->bytes[o] += c[i].bytes;
		if (o == KVX_CPL_DONE)
			continue;
		uint32_t r = 0;
		while (r < a->n_reasons && !(a->reasons[r].outcome == o && a->reasons[r].error == c[i].error))
			r++;
		if (r == a->n_reasons) {
			if (a->n_reasons < NREASONS - 1) {
				a->reasons[a->n_reasons++] = (struct reason){.outcome = o, .error = c[i].error};
			} else {
				r = NREASONS - 1; /* shared "other" entry */
				if (a->n_reasons < NREASONS)
					a->reasons[a->n_reasons++] = (struct reason){.outcome = 1, .error = INT32_MIN};
			}
		}
		a->reasons[r].count++;
	}
	uint64_t now = kvx_now_ns();
	if (!m->full || (!force && m->published && now - m->last_pub_ns < KVX_METRICS_PUBLISH_NS))
		return;
	void *p;
	if (kvx_ring_dequeue_burst_sc(m->free, &p, 1, NULL) != 1)
		return; /* the server holds every buffer for the moment: next time */
	struct snap *s = p;
	s->taken_ns = now;
	kvx_engine_get_stats(e, &s->st);
	s->have_cc = ctl != NULL;
	s->n_cps = 0;
	if (ctl) {
		kvx_ctl_counters_get(ctl, &s->cc);
		s->n_cps = kvx_ctl_peer_stats_get(ctl, s->cps, KVX_CTL_PEER_STATS_MAX);
	}
	s->app = *app;
	const char *t = kvx_engine_transport_name(e);
	snprintf(s->transport, sizeof(s->transport), "%s", t ? t : "");
	s->acc = *a;
	/* Release: the snapshot's contents happen-before the server's dequeue. */
	kvx_ring_enqueue_burst_sp(m->full, &p, 1, NULL);
	m->last_pub_ns = now;
	m->published = true;
}

int kvx_metrics_addr(const struct kvx_metrics *m, char *buf, size_t len)
{
	if (!m || !m->bound_port)
		return -EAGAIN;
	if (m->v6)
		snprintf(buf, len, "[%s]:%u", m->host[0] ? m->host : "::", m->bound_port);
	else
		snprintf(buf, len, "%s:%u", m->host[0] ? m->host : "0.0.0.0", m->bound_port);
	return 0;
}

void kvx_metrics_stop(struct kvx_metrics *m)
{
#ifdef KVX_HAVE_METRICS
	if (m && m->d) {
		MHD_stop_daemon(m->d); /* joins the polling thread: this thread owns every buffer now */
		m->d = NULL;
	}
#else
	(void)m;
#endif
}

void kvx_metrics_destroy(struct kvx_metrics *m)
{
	if (!m)
		return;
	kvx_metrics_stop(m);
	kvx_ring_destroy(m->full);
	kvx_ring_destroy(m->free);
	for (int i = 0; i < 3; i++)
		free(m->bufs[i]);
	free(m);
}
