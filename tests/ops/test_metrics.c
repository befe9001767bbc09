/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's Prometheus endpoint (kvx_engine_params.metrics_addr), scraped with the real curl
 * while two real engines move blocks over tcp on loopback: counters start at zero and move
 * with transfers (done, bytes, transfer / first-layer / handshake latency histograms, notifications,
 * control messages by type, handshakes), failures are counted by
 * outcome and reason, refused tcp data connections are counted, the transfer-object pool and
 * quarantine gauges follow a transfer held after its abort, other paths are 404, the endpoint is gone after stop, and bad addresses or
 * taken ports are refused.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kvxfer/common.h"
#include "kvxfer/engine.h"
#include "tests/runtime/engine_test_util.h"

TestSuite(ops_metrics, .timeout = 300.0);

static bool have_curl(void)
{
	return system("command -v curl >/dev/null 2>&1") == 0;
}

/* Skip the test without curl; else parameters for a producer and a consumer in @p mode
 * (et_params() defaults), each with a metrics endpoint on an ephemeral loopback port where
 * asked. The caller adjusts them and starts the engines. */
static void metrics_params(struct kvx_engine_params *pp, struct kvx_engine_params *dp, enum kvx_sched_mode mode,
			   bool p_metrics, bool d_metrics)
{
	if (!have_curl())
		cr_skip_test("curl is not installed (scripts/install-deps.sh installs it)");
	et_params(pp, KVX_SCHED_PRODUCER, mode);
	et_params(dp, KVX_SCHED_CONSUMER, mode);
	if (p_metrics)
		pp->metrics_addr = "127.0.0.1:0";
	if (d_metrics)
		dp->metrics_addr = "127.0.0.1:0";
}

/* A free loopback port at the time of the call (a caller that binds it retries on -EADDRINUSE;
 * one that connects to it finds nothing listening). */
static uint16_t free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(s, (struct sockaddr *)&a, &al), 0);
	close(s);
	return ntohs(a.sin_port);
}

/* GET http://ADDR/PATH with curl; body into @p buf; returns the HTTP code, or -curl_exit. */
static int scrape(const char *addr, const char *path, char *buf, size_t cap)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "curl -sS --max-time 20 -o - -w '\\n@@%%{http_code}' http://%s%s 2>/dev/null",
		 addr, path);
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	int st = pclose(f);
	int ex = WIFEXITED(st) ? WEXITSTATUS(st) : 255;
	char *at = strstr(buf, "\n@@");
	if (ex || !at)
		return -(ex ? ex : 255);
	int code = atoi(at + 3);
	*at = '\0';
	return code;
}

/* Value of the sample line starting with @p series (name plus labels, exactly), or -1. */
static double value(const char *text, const char *series)
{
	size_t l = strlen(series);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (!strncmp(p, series, l) && p[l] == ' ')
			return strtod(p + l + 1, NULL);
	}
	return -1;
}

static char g_body[1 << 20];

struct want {
	const char *series;
	double v;
};

/* Pump @p e and scrape @p addr until @p series has value @p v (snapshots follow the polls). */
static void wait_value(struct et_eng *g, struct et_track *t, const char *addr, const char *series, double v)
{
	uint64_t end = kvx_now_ns() + ET_DEADLINE_NS;
	double got = -2;
	while (kvx_now_ns() < end) {
		et_pump(g->e, t);
		cr_assert_eq(scrape(addr, "/metrics", g_body, sizeof(g_body)), 200, "%s", g_body);
		got = value(g_body, series);
		if (got == v)
			return;
	}
	cr_assert_fail("%s stayed %g (want %g):\n%s", series, got, v, g_body);
}

Test(ops_metrics, counters_move_with_transfers_and_failures)
{
	struct kvx_engine_params pp, dp;
	metrics_params(&pp, &dp, KVX_SCHED_MODE_READ, true, true);
	dp.handshake_timeout_ms = 300;
	dp.transfer_timeout_ms = 2000;
	struct et_eng P, D;
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	char pa[64], da[64];
	cr_assert_eq(kvx_engine_metrics_addr(P.e, pa, sizeof(pa)), 0);
	cr_assert_eq(kvx_engine_metrics_addr(D.e, da, sizeof(da)), 0);
	cr_assert(!strncmp(da, "127.0.0.1:", 10) && atoi(da + 10) > 0, "%s", da);

	/* Before any transfer: everything at zero. */
	cr_assert_eq(scrape(da, "/metrics", g_body, sizeof(g_body)), 200, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfers_total{outcome=\"done\"}"), 0, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfers_in_flight"), 0);
	cr_assert_eq(value(g_body, "kvxfer_bytes_total"), 0);
	cr_assert(strstr(g_body, "kvxfer_info{role=\"consumer\",mode=\"read\""), "%s", g_body);
	cr_assert(strstr(g_body, "# TYPE kvxfer_transfer_duration_seconds histogram"), "%s", g_body);
	cr_assert_eq(scrape(da, "/nope", g_body, sizeof(g_body)), 404);

	/* One READ of 3 blocks. */
	const uint32_t pb[3] = {1, 2, 3}, db[3] = {5, 6, 7};
	struct et_track td = {0}, tp = {0};
	size_t i = et_read_done(&P, &tp, &D, &td, "tx-m1", db, pb, 3, true);

	wait_value(&D, &td, da, "kvxfer_transfers_total{outcome=\"done\"}", 1);
	cr_assert_eq(value(g_body, "kvxfer_transfer_duration_seconds_count{outcome=\"done\"}"), 1, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfer_duration_seconds_bucket{outcome=\"done\",le=\"+Inf\"}"), 1);
	cr_assert_eq(value(g_body, "kvxfer_transfer_bytes_total{outcome=\"done\"}"), (double)td.bytes[i]);
	cr_assert_eq(value(g_body, "kvxfer_bytes_total"), (double)(3 * 2 * ET_NL * ET_BLOCK), "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfers_in_flight"), 0);
	cr_assert_geq(value(g_body, "kvxfer_notifications_total{direction=\"sent\"}"), 1, "release sent");
	cr_assert_eq(value(g_body, "kvxfer_handshakes_total{result=\"ok\"}"), 1, "%s", g_body);
	/* Latency histograms: the handshake this READ needed and its first layer landing here. */
	cr_assert(strstr(g_body, "# TYPE kvxfer_handshake_duration_seconds histogram"), "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_handshake_duration_seconds_count{result=\"ok\"}"), 1, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_handshake_duration_seconds_bucket{result=\"ok\",le=\"+Inf\"}"), 1);
	cr_assert_eq(value(g_body, "kvxfer_handshake_duration_seconds_count{result=\"failed\"}"), 0);
	cr_assert_gt(value(g_body, "kvxfer_handshake_duration_seconds_sum{result=\"ok\"}"), 0, "%s", g_body);
	cr_assert(strstr(g_body, "# TYPE kvxfer_first_layer_seconds histogram"), "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_first_layer_seconds_count"), 1, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_first_layer_seconds_bucket{le=\"+Inf\"}"), 1, "%s", g_body);
	double fl = value(g_body, "kvxfer_first_layer_seconds_sum");
	cr_assert(fl > 0 && fl <= value(g_body, "kvxfer_transfer_duration_seconds_sum{outcome=\"done\"}"),
		  "the first layer lands within its transfer:\n%s", g_body);
	/* Control messages by type: the consumer of a READ sends release, nothing else. */
	cr_assert_geq(value(g_body, "kvxfer_control_messages_total{direction=\"sent\",type=\"release\"}"), 1, "%s",
		      g_body);
	cr_assert_eq(value(g_body, "kvxfer_control_messages_total{direction=\"sent\",type=\"remote_blocks\"}"), 0);
	cr_assert_eq(value(g_body, "kvxfer_control_messages_total{direction=\"sent\",type=\"write_done\"}"), 0);
	cr_assert_eq(value(g_body, "kvxfer_control_messages_total{direction=\"received\",type=\"get_meta_msg\"}"), 0);
	cr_assert_eq(value(g_body, "kvxfer_auth_connections_total{plane=\"control\",result=\"refused\"}"), 0, "%s",
		     g_body);
	cr_assert_eq(value(g_body, "kvxfer_auth_connections_total{plane=\"data\",result=\"refused\"}"), 0, "%s",
		     g_body);
	cr_assert(strstr(g_body, "kvxfer_lcore_bytes_total{lcore=\""), "%s", g_body);
	char peer[96];
	snprintf(peer, sizeof(peer), "kvxfer_peer_transfers_total{peer=\"127.0.0.1:%u\",dp_rank=\"0\"}", P.nt);
	cr_assert_eq(value(g_body, peer), 1, "%s\n%s", peer, g_body);
	/* The producer counts its side: served, released, a release received. */
	wait_value(&P, &tp, pa, "kvxfer_transfers_total{outcome=\"done\"}", 1);
	cr_assert_eq(value(g_body, "kvxfer_blocks_released_total"), 1, "%s", g_body);
	cr_assert_geq(value(g_body, "kvxfer_notifications_total{direction=\"received\"}"), 1);
	cr_assert_geq(value(g_body, "kvxfer_control_messages_total{direction=\"received\",type=\"release\"}"), 1,
		      "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_control_messages_total{direction=\"received\",type=\"get_meta_msg\"}"), 1,
		      "the consumer's one handshake:\n%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_control_messages_total{direction=\"received\",type=\"write_done\"}"), 0);
	/* A producer serving a READ moves no layer itself: no first-layer sample. */
	cr_assert_eq(value(g_body, "kvxfer_first_layer_seconds_count"), 0, "%s", g_body);
	/* The consumer's release arrived from 127.0.0.1 (per-source control counters). */
	cr_assert_geq(value(g_body, "kvxfer_control_peer_frames_total{source=\"127.0.0.1\",kind=\"received\"}"), 1,
		      "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_control_peer_frames_total{source=\"127.0.0.1\",kind=\"malformed\"}"), 0);

	/* A READ from a port where nothing answers: not done, counted with its reason. */
	uint16_t dead = free_port();
	struct kvx_engine_read bad = {.transfer_id = "tx-m2", .peer = et_peer(dead, dead), .local_blocks = db, .remote_blocks = pb, .n = 3};
	cr_assert_eq(kvx_xfer_read(D.e, &bad), 0);
	size_t j = et_follow(&td, "tx-m2");
	cr_assert(et_wait(D.e, &td, "tx-m2", false));
	cr_assert_neq(td.status[j], KVX_CPL_DONE);
	static const char *const outcome[4] = {"done", "failed", "aborted", "timed_out"};
	const char *en = strerrorname_np(-td.error[j]);
	cr_assert_not_null(en, "error %d", td.error[j]);
	char series[160];
	snprintf(series, sizeof(series), "kvxfer_transfer_errors_total{outcome=\"%s\",reason=\"%s\"}",
		 outcome[td.status[j]], en);
	wait_value(&D, &td, da, series, 1);
	snprintf(series, sizeof(series), "kvxfer_transfers_total{outcome=\"%s\"}", outcome[td.status[j]]);
	cr_assert_eq(value(g_body, series), 1, "%s\n%s", series, g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfers_total{outcome=\"done\"}"), 1);
	/* Its handshake failed (nothing listens there) and it moved no layer. */
	cr_assert_geq(value(g_body, "kvxfer_handshake_duration_seconds_count{result=\"failed\"}"), 1, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_first_layer_seconds_count"), 1, "%s", g_body);

	/* Stopped: the endpoint is gone (curl cannot connect: exit 7). */
	kvx_engine_stop(D.e);
	cr_assert_eq(scrape(da, "/metrics", g_body, sizeof(g_body)), -7);
	et_free(&D);
	et_free(&P);
}

/* A peer that holds no endpoint secret of the target: it connects to the tcp data listener at
 * @p port, sends the 56-byte hello @p hello and waits (bounded) until the target closes the
 * connection. Returns the bytes the target sent before closing (0 = refused unanswered). */
static ssize_t refused_session(uint16_t port, const uint8_t *hello)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(connect(s, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s", strerror(errno));
	cr_assert_eq(send(s, hello, 56, MSG_NOSIGNAL), 56);
	ssize_t got = 0;
	uint64_t end = kvx_now_ns() + ET_DEADLINE_NS;
	for (;;) {
		struct pollfd pf = {.fd = s, .events = POLLIN};
		cr_assert(kvx_now_ns() < end, "the target did not close the connection");
		if (poll(&pf, 1, 100) <= 0)
			continue;
		uint8_t b[64];
		ssize_t n = recv(s, b, sizeof(b), 0);
		if (n <= 0)
			break; /* closed (0) or reset: refused */
		got += n;
	}
	close(s);
	return got;
}

Test(ops_metrics, refused_data_connections_are_counted)
{
	struct kvx_engine_params pp, dp;
	metrics_params(&pp, &dp, KVX_SCHED_MODE_READ, true, false);
	struct et_eng P, D;
	int rc = -EADDRINUSE;
	for (int i = 0; i < 20 && rc == -EADDRINUSE; i++) {
		pp.data_port = free_port(); /* a known data port: the intruder connects to it */
		et_create(&P, &pp, true);
		if ((rc = et_start_layers(&P)) == -EADDRINUSE)
			et_free(&P);
	}
	cr_assert_eq(rc, 0);
	et_start(&D, &dp, false);
	char pa[64];
	cr_assert_eq(kvx_engine_metrics_addr(P.e, pa, sizeof(pa)), 0);
	const char *data = "kvxfer_auth_connections_total{plane=\"data\",result=\"refused\"}";
	const char *ctl = "kvxfer_auth_connections_total{plane=\"control\",result=\"refused\"}";
	cr_assert_eq(scrape(pa, "/metrics", g_body, sizeof(g_body)), 200, "%s", g_body);
	cr_assert(strstr(g_body, "# TYPE kvxfer_auth_connections_total counter"), "%s", g_body);
	cr_assert_eq(value(g_body, data), 0, "%s", g_body);

	/* Two intruders: a current (v2) hello naming a made-up endpoint token with a zero proof,
	 * and an old (v1) hello. Both are closed without an answer. */
	uint8_t h[56] = {0};
	memcpy(h, "KXTH\x02\0\0\0", 8);
	memcpy(h + 8, "\x11\x22\x33\x44\x55\x66\x77\x88", 8); /* token */
	h[18] = 1;                                                   /* channel 0 of 1 */
	cr_assert_eq(refused_session(pp.data_port, h), 0);
	h[4] = 1;
	cr_assert_eq(refused_session(pp.data_port, h), 0);
	struct et_track tp = {0}, td = {0};
	wait_value(&P, &tp, pa, data, 2);
	cr_assert_eq(value(g_body, ctl), 0, "no auth_dir: the control plane refused nothing:\n%s", g_body);
	struct kvx_engine_stats st;
	kvx_engine_get_stats(P.e, &st);
	cr_assert_eq(st.data_auth_refused, 2);

	/* A real consumer's data connections prove the secret: READ 2 blocks, not counted. */
	const uint32_t pb[2] = {4, 9}, db[2] = {1, 2};
	et_read_done(&P, &tp, &D, &td, "tx-auth", db, pb, 2, true);
	wait_value(&P, &tp, pa, "kvxfer_transfers_total{outcome=\"done\"}", 1);
	cr_assert_eq(value(g_body, data), 2, "%s", g_body);
	et_free(&D);
	et_free(&P);
}

Test(ops_metrics, pool_and_quarantine_gauges)
{
	/* WRITE, one transfer object: D announces and aborts before P begins. P holds the
	 * allocation and may still write, so D's blocks stay quarantined (defer timeout 60 s) and
	 * the transfer keeps the only object until P answers. */
	struct kvx_engine_params pp, dp;
	metrics_params(&pp, &dp, KVX_SCHED_MODE_WRITE, false, true);
	dp.defer_timeout_ms = 60000;
	dp.max_transfers = 1;
	struct et_eng P, D;
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	char da[64];
	cr_assert_eq(kvx_engine_metrics_addr(D.e, da, sizeof(da)), 0);
	cr_assert_eq(scrape(da, "/metrics", g_body, sizeof(g_body)), 200, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfer_pool_size"), 1, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfers_quarantined"), 0, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfer_pool_full_total"), 0, "%s", g_body);

	const uint32_t dst[2] = {4, 5}, src[2] = {1, 2};
	struct kvx_engine_announce an = {.transfer_id = "tx-q", .peer = et_peer(P.hs, P.nt), .local_blocks = dst,
					 .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	cr_assert_eq(kvx_xfer_abort(D.e, "tx-q"), 0);
	struct et_track td = {0}, tp = {0};
	size_t kd = et_follow(&td, "tx-q");
	cr_assert(et_wait(D.e, &td, "tx-q", false));
	cr_assert_eq(td.status[kd], KVX_CPL_ABORTED, "status %d error %d", td.status[kd], td.error[kd]);
	cr_assert_eq(td.released[kd], 0);
	wait_value(&D, &td, da, "kvxfer_transfers_quarantined", 1);
	cr_assert_eq(td.released[kd], 0, "the gauge counts a transfer whose blocks are held");
	cr_assert_eq(value(g_body, "kvxfer_transfers_in_flight"), 0, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfers_total{outcome=\"aborted\"}"), 1, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_quarantined_total"), 1, "%s", g_body);

	/* The quarantined transfer holds the pool's only object: the next submission is refused. */
	an.transfer_id = "tx-q2";
	cr_assert_eq(kvx_xfer_announce(D.e, &an), -ENOBUFS);
	wait_value(&D, &td, da, "kvxfer_transfer_pool_full_total", 1);
	cr_assert_eq(value(g_body, "kvxfer_transfers_quarantined"), 1, "%s", g_body);

	/* P begins late: it sees the release, writes nothing and answers; D's blocks come out. */
	struct kvx_engine_write w = {.transfer_id = "tx-q", .peer = et_peer(D.hs, D.nt), .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	et_follow(&tp, "tx-q");
	cr_assert(et_wait(P.e, &tp, "tx-q", true));
	cr_assert(et_wait(D.e, &td, "tx-q", true));
	cr_assert_eq(td.released[kd], 1);
	wait_value(&D, &td, da, "kvxfer_transfers_quarantined", 0);
	cr_assert_eq(value(g_body, "kvxfer_transfers_in_flight"), 0, "%s", g_body);
	et_expect_blocks(&D, NULL, NULL, 0, true); /* nothing written after the abort */

	/* The object is free again: a new announce is in flight (P never answers it here). */
	an.transfer_id = "tx-q3";
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	et_follow(&td, "tx-q3");
	wait_value(&D, &td, da, "kvxfer_transfers_in_flight", 1);
	cr_assert_eq(value(g_body, "kvxfer_transfers_quarantined"), 0, "%s", g_body);
	cr_assert_eq(value(g_body, "kvxfer_transfer_pool_full_total"), 1, "%s", g_body);
	et_free(&D);
	et_free(&P);
}

Test(ops_metrics, bad_address_and_taken_port_are_refused)
{
	struct kvx_engine_params p;
	et_params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	struct kvx_engine *e = NULL;
	char err[256] = "";
	p.metrics_addr = "localhost:9100";
	cr_assert_eq(kvx_engine_create(&p, &e, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "metrics_addr 'localhost:9100'"), "%s", err);
	p.metrics_addr = "127.0.0.1:70000";
	cr_assert_eq(kvx_engine_create(&p, &e, err, sizeof(err)), -EINVAL);
	p.metrics_addr = "127.0.0.1";
	cr_assert_eq(kvx_engine_create(&p, &e, err, sizeof(err)), -EINVAL);
	/* A port another socket listens on: kvx_engine_start() fails with -EADDRINUSE. */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(s, 1), 0);
	cr_assert_eq(getsockname(s, (struct sockaddr *)&a, &al), 0);
	char addr[32];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(a.sin_port));
	p.metrics_addr = addr;
	struct et_eng g = {0};
	cr_assert_eq(kvx_engine_create(&p, &g.e, err, sizeof(err)), 0, "%s", err);
	/* Register one layer so start gets as far as binding. */
	static uint8_t mem[2 * ET_NB * ET_BLOCK];
	struct kvx_engine_layer L = {.name = "l0", .base = mem};
	L.tensor.elem_size = 2;
	L.tensor.ndim = 5;
	uint64_t shape[5] = {2, ET_NB, 4, 2, 8}, stride[5] = {ET_NB * 64, 64, 16, 8, 1};
	memcpy(L.tensor.shape, shape, sizeof(shape));
	memcpy(L.tensor.stride, stride, sizeof(stride));
	L.spec.block_size = 4;
	L.spec.num_kv_heads = 2;
	L.spec.head_size = 8;
	cr_assert_geq(kvx_engine_register_layer(g.e, &L), 0);
	cr_assert_eq(kvx_engine_start(g.e), -EADDRINUSE);
	char got[64];
	cr_assert_eq(kvx_engine_metrics_addr(g.e, got, sizeof(got)), -EAGAIN);
	kvx_engine_destroy(g.e);
	close(s);
	/* Without metrics_addr there is no endpoint. */
	p.metrics_addr = NULL;
	struct et_eng h;
	et_start(&h, &p, false);
	cr_assert_eq(kvx_engine_metrics_addr(h.e, got, sizeof(got)), -ENOENT);
	et_free(&h);
}
