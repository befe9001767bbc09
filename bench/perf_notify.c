/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf notify: control-plane cost between two processes on loopback.
 *  - notification round trip: the parent's engine thread submits `write_done` through its
 *    inbox; the child's control lcore receives it and answers `release` through its own
 *    inbox; the parent's control lcore delivers it. p50/p99/p99.9 in µs.
 *  - throughput: the same echo with a window of in-flight notifications, messages/s.
 *  - handshake time (get_meta_msg, metadata + region map, connection setup with a 64-byte
 *    blob each way) against listeners with 1 and 64 layers.
 * Peers measured in the same run between the same two processes:
 *  - a plain ZMQ DEALER/ROUTER echo (the parent's thread sends the encoded write_done on a
 *    DEALER, a thread of the child echoes it from a ROUTER), the RTT reference of issue 16;
 *    kvxfer and this echo alternate in 3 rounds, and the ratio is the median of the rounds' p50
 *    ratios;
 *  - a plain TCP echo (TCP_NODELAY, same frame size), for RTT and windowed throughput.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "kvxfer/control.h"
#include "perf.h"
#include "perf_util.h"

#define FRAME_BYTES 40 /* ~ an encoded write_done with a "tx-<n>" id */
#define RTT_ROUNDS 3   /* alternating kvxfer / ZMQ echo rounds */

struct nopts {
	uint64_t iters;    /* RTT samples */
	uint64_t msgs;     /* throughput messages */
	uint64_t window;   /* in-flight bound for throughput */
	uint64_t hs_iters; /* handshakes per layer count */
	uint64_t busy_poll_us; /* kvx_ctl_params.busy_poll_us of both control lcores */
	const char *json;
	const char *auth_dir; /* --auth-dir: also measure CURVE-authenticated control lcores */
};

/* CPU time of the whole calling process (all its threads), ns. */
static uint64_t proc_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- child: echo side ------------------------------------------------------------------ */

struct echo {
	struct kvx_ctl *ctl;
	struct kvx_ctl_inbox *ib; /* used only by the echo control thread */
	_Atomic uint32_t peer_port;
};

static void echo_cb(void *arg, const struct kvx_msg_notify *m)
{
	struct echo *e = arg;
	struct kvx_msg_notify r;
	memset(&r, 0, sizeof(r));
	r.type = KVX_MSG_RELEASE;
	memcpy(r.transfer_id, m->transfer_id, sizeof(r.transfer_id));
	uint16_t port = (uint16_t)atomic_load_explicit(&e->peer_port, memory_order_acquire);
	/* This runs on the echo control thread, the consumer of e->ib: never wait for space
	 * here. The parent's window (<= 2048) is below the inbox size (4096), so it fits. */
	int rc = kvx_ctl_send_notify(e->ib, "127.0.0.1", port, &r);
	if (rc)
		fprintf(stderr, "kvxfer-perf notify: echo reply to port %u lost: %s\n", port,
			kvx_strerror(rc));
}

static int echo_connect(void *arg, const uint8_t *a, size_t la, uint8_t *b, size_t *lb)
{
	(void)arg;
	if (la > *lb)
		return -EMSGSIZE;
	memcpy(b, a, la);
	*lb = la;
	return 0;
}

static int tcp_listen(uint16_t *port)
{
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof(a);
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1) ||
	    getsockname(s, (struct sockaddr *)&a, &l))
		return -1;
	*port = ntohs(a.sin_port);
	return s;
}

static int full_io(int fd, void *buf, size_t n, int wr)
{
	size_t off = 0;
	while (off < n) {
		ssize_t r = wr ? write(fd, (char *)buf + off, n - off) : read(fd, (char *)buf + off, n - off);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			return -1;
		}
		off += (size_t)r;
	}
	return 0;
}

static void *tcp_echo_thread(void *arg)
{
	int ls = (int)(intptr_t)arg;
	int c = accept(ls, NULL, NULL);
	if (c < 0)
		return NULL;
	int one = 1;
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	uint8_t buf[FRAME_BYTES];
	while (full_io(c, buf, sizeof(buf), 0) == 0 && full_io(c, buf, sizeof(buf), 1) == 0)
		;
	close(c);
	return NULL;
}

/* Child side of the ZMQ peer: a ROUTER that sends every message back to its sender, until
 * the context is shut down. */
struct zecho {
	void *ctx, *router;
	uint16_t port;
};

static int zecho_open(struct zecho *z)
{
	char ep[64];
	size_t len = sizeof(ep);
	int zero = 0;
	z->ctx = zmq_ctx_new();
	z->router = z->ctx ? zmq_socket(z->ctx, ZMQ_ROUTER) : NULL;
	if (!z->router || zmq_setsockopt(z->router, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_bind(z->router, "tcp://127.0.0.1:*") || zmq_getsockopt(z->router, ZMQ_LAST_ENDPOINT, ep, &len))
		return -1;
	const char *colon = strrchr(ep, ':');
	z->port = colon ? (uint16_t)atoi(colon + 1) : 0;
	return z->port ? 0 : -1;
}

static void *zecho_thread(void *arg)
{
	struct zecho *z = arg;
	uint8_t id[256], buf[512];
	for (;;) {
		int il = zmq_recv(z->router, id, sizeof(id), 0);
		if (il < 0)
			break;
		int bl = zmq_recv(z->router, buf, sizeof(buf), 0);
		if (bl < 0 || il > (int)sizeof(id) || bl > (int)sizeof(buf))
			break;
		if (zmq_send(z->router, id, (size_t)il, ZMQ_SNDMORE) < 0 || zmq_send(z->router, buf, (size_t)bl, 0) < 0)
			break;
	}
	zmq_close(z->router);
	return NULL;
}

static struct kvx_ctl *make_listener(uint32_t layers, kvx_ctl_notify_fn cb, void *arg,
				     uint32_t busy_poll_us, const char *auth_dir)
{
	struct kvx_ctl_params p;
	memset(&p, 0, sizeof(p));
	p.host = "127.0.0.1";
	p.bind_host = "127.0.0.1";
	p.ephemeral_ports = true;
	p.dp_size = 1;
	p.tp_size = 1;
	p.role = KVX_CTL_ROLE_CONSUMER;
	p.on_notify = cb;
	p.notify_arg = arg;
	p.on_connect = echo_connect;
	p.inbox_slots = 4096;
	p.busy_poll_us = busy_poll_us;
	p.auth_dir = auth_dir;
	struct kvx_ctl *c = NULL;
	if (kvx_ctl_create(&p, &c))
		return NULL;
	struct kvx_msg_region *r = calloc(2 * layers, sizeof(*r));
	struct kvx_msg_memdesc *d = calloc(layers, sizeof(*d));
	struct kvx_msg_meta m;
	struct kvx_msg_layers l;
	memset(&m, 0, sizeof(m));
	memset(&l, 0, sizeof(l));
	snprintf(m.engine_id, sizeof(m.engine_id), "127.0.0.1:6301");
	snprintf(m.engine_key, sizeof(m.engine_key), "consumer:127.0.0.1:6301:tp0:dp0");
	snprintf(m.hostname, sizeof(m.hostname), "bench");
	snprintf(m.host, sizeof(m.host), "127.0.0.1");
	snprintf(m.attn_backend, sizeof(m.attn_backend), "FLASH_ATTN");
	snprintf(m.transport, sizeof(m.transport), "tcp");
	snprintf(m.layout, sizeof(m.layout), "split");
	snprintf(l.engine_key, sizeof(l.engine_key), "%s", m.engine_key);
	m.num_blocks = 4096;
	m.block_len = 32768;
	m.has_kvx = true;
	m.version = KVX_MSG_PROTO_VERSION;
	m.num_regions = 2 * layers; /* split K/V: 2 regions per layer */
	m.regions = r;
	l.num_descs = layers;
	l.descs = d;
	for (uint32_t i = 0; i < 2 * layers; i++)
		r[i] = (struct kvx_msg_region){.addr = 0x7f0000000000ull + (uint64_t)i * (1ull << 27),
					       .len_bytes = 4096ull * 32768, .key = 0x1000 + i};
	for (uint32_t i = 0; i < layers; i++) {
		snprintf(d[i].layer, sizeof(d[i].layer), "model.layers.%u.self_attn.attn", i);
		d[i].id = i;
		d[i].addr = r[2 * i].addr;
		d[i].len_bytes = 2 * r[2 * i].len_bytes;
		d[i].loc = 2;
	}
	int rc = kvx_ctl_set_local(c, &m, &l);
	free(r);
	free(d);
	if (rc || kvx_ctl_start(c)) {
		kvx_ctl_destroy(c);
		return NULL;
	}
	return c;
}

/* Child: report 6 ports on `up` (plain echo hs/notify, 64-layer hs, TCP echo, CURVE echo
 * hs/notify or 0), read the parent's notify ports from `down`, run until EOF. */
static int child_main(int up, int down, uint32_t busy_poll_us, const char *auth_dir)
{
	struct echo e, ea;
	memset(&e, 0, sizeof(e));
	memset(&ea, 0, sizeof(ea));
	e.ctl = make_listener(1, echo_cb, &e, busy_poll_us, NULL);
	struct kvx_ctl *l64 = make_listener(64, NULL, NULL, 0, NULL);
	uint16_t tport = 0;
	int ls = tcp_listen(&tport);
	if (!e.ctl || !l64 || ls < 0 || kvx_ctl_inbox_open(e.ctl, &e.ib))
		return 1;
	if (auth_dir && (!(ea.ctl = make_listener(1, echo_cb, &ea, busy_poll_us, auth_dir)) ||
			 kvx_ctl_inbox_open(ea.ctl, &ea.ib)))
		return 1;
	struct zecho z = {0};
	if (zecho_open(&z))
		return 1;
	pthread_t t, zt;
	pthread_create(&t, NULL, tcp_echo_thread, (void *)(intptr_t)ls);
	pthread_create(&zt, NULL, zecho_thread, &z);
	/* [0] handshake, [1] notify, [2] 64-layer handshake, [3] tcp echo, [4] ZMQ echo,
	 * [5] authenticated handshake, [6] authenticated notify (0 without --auth-dir). */
	uint16_t ports[7] = {0};
	kvx_ctl_bound_ports(e.ctl, &ports[0], &ports[1]);
	kvx_ctl_bound_ports(l64, &ports[2], NULL);
	ports[3] = tport;
	ports[4] = z.port;
	if (ea.ctl)
		kvx_ctl_bound_ports(ea.ctl, &ports[5], &ports[6]);
	uint16_t pp[2];
	if (full_io(up, ports, sizeof(ports), 1) || full_io(down, pp, sizeof(pp), 0))
		return 1;
	atomic_store_explicit(&e.peer_port, pp[0], memory_order_release);
	atomic_store_explicit(&ea.peer_port, pp[1], memory_order_release);
	/* Only now may the parent send: an echo before the store would go to port 0. */
	char ok = 1;
	if (full_io(up, &ok, 1, 1))
		return 1;
	char x;
	while (read(down, &x, 1) > 0)
		;
	kvx_ctl_stop(e.ctl);
	kvx_ctl_inbox_close(e.ib);
	kvx_ctl_destroy(e.ctl);
	kvx_ctl_destroy(l64);
	if (ea.ctl) {
		kvx_ctl_stop(ea.ctl);
		kvx_ctl_inbox_close(ea.ib);
		kvx_ctl_destroy(ea.ctl);
	}
	close(ls);
	pthread_join(t, NULL);
	zmq_ctx_shutdown(z.ctx); /* the echo's blocking receive returns ETERM */
	pthread_join(zt, NULL);
	zmq_ctx_term(z.ctx);
	return 0;
}

/* ---- parent: measuring side ------------------------------------------------------------ */

/* The engine thread blocks (condition variable) instead of spinning: on a 2-CPU machine a
 * spinning waiter would steal the CPU the control lcores need. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static uint64_t g_rx;

static void count_cb(void *arg, const struct kvx_msg_notify *m)
{
	(void)arg, (void)m;
	pthread_mutex_lock(&g_mu);
	g_rx++;
	pthread_mutex_unlock(&g_mu);
	/* Signal after the unlock: signalled under the mutex, the woken engine thread can find it
	 * still held and sleep again on it (a second futex wait and wake per round trip that the
	 * ZMQ echo's blocking zmq_recv does not pay). No wake-up is lost: the waiter checks g_rx
	 * and enters the wait with the mutex held. */
	pthread_cond_signal(&g_cv);
}

/* Wait until at least n replies arrived. */
static void wait_rx(uint64_t n)
{
	pthread_mutex_lock(&g_mu);
	while (g_rx < n)
		pthread_cond_wait(&g_cv, &g_mu);
	pthread_mutex_unlock(&g_mu);
}

struct hs_sync {
	int done;
	int status;
	uint64_t ns;
	char err[512];
};

static void hs_done(void *arg, const struct kvx_ctl_hs_result *r)
{
	struct hs_sync *s = arg;
	s->status = r->status;
	s->ns = r->end_ns - r->start_ns;
	snprintf(s->err, sizeof(s->err), "%s", r->error);
	pthread_mutex_lock(&g_mu);
	s->done = 1;
	pthread_cond_signal(&g_cv);
	pthread_mutex_unlock(&g_mu);
}

static int hs_blob(void *arg, uint32_t dp_rank, const struct kvx_msg_meta *remote, uint8_t *b,
		   size_t cap, size_t *len)
{
	(void)arg, (void)dp_rank, (void)remote;
	if (cap < 64)
		return -EMSGSIZE;
	memset(b, 0xab, 64); /* about one verbs QP's connection data */
	*len = 64;
	return 0;
}

static int run_handshakes(struct kvx_ctl_inbox *ib, uint16_t port, uint64_t n, uint64_t *ns)
{
	for (uint64_t i = 0; i < n; i++) {
		struct hs_sync s;
		memset(&s, 0, sizeof(s));
		struct kvx_ctl_hs_params hp;
		memset(&hp, 0, sizeof(hp));
		hp.host = "127.0.0.1";
		hp.handshake_base_port = port;
		hp.dp_size = 1;
		hp.tp_size = 1;
		hp.timeout_ms = 10000;
		hp.make_blob = hs_blob;
		hp.on_done = hs_done;
		hp.arg = &s;
		uint64_t t0 = kvx_now_ns();
		int rc = kvx_ctl_handshake_start(ib, &hp);
		if (rc)
			return rc;
		pthread_mutex_lock(&g_mu);
		while (!s.done)
			pthread_cond_wait(&g_cv, &g_mu);
		pthread_mutex_unlock(&g_mu);
		if (s.status) {
			fprintf(stderr, "kvxfer-perf notify: handshake failed: %s\n", s.err);
			return s.status;
		}
		ns[i] = kvx_now_ns() - t0; /* submit -> completion seen by the engine thread */
	}
	return 0;
}

static void print_stats(const char *name, const struct perf_stats *s)
{
	printf("  %-28s p50 %9.2f  p99 %9.2f  p99.9 %9.2f  mean %9.2f us  (n=%zu)\n", name,
	       (double)s->p50 / 1e3, (double)s->p99 / 1e3, (double)s->p999 / 1e3, s->mean / 1e3,
	       s->n);
}

static void json_us(struct perf_json *j, const char *key, const struct perf_stats *s)
{
	perf_json_obj_begin(j, key);
	perf_json_double(j, "p50_us", (double)s->p50 / 1e3);
	perf_json_double(j, "p99_us", (double)s->p99 / 1e3);
	perf_json_double(j, "p999_us", (double)s->p999 / 1e3);
	perf_json_double(j, "mean_us", s->mean / 1e3);
	perf_json_u64(j, "n", s->n);
	perf_json_obj_end(j);
}

static int parse(int argc, char **argv, struct nopts *o)
{
	const char *opt = "";
	for (int i = 1; i < argc; i++) {
		opt = argv[i];
		const char *v;
		int r;
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: kvxfer-perf notify [--iters N] [--msgs N] [--window N] "
			       "[--hs-iters N] [--busy-poll US] [--auth-dir DIR] [--json FILE]\n"
			       "  --iters     round-trip samples (default 20000)\n"
			       "  --msgs      messages for the throughput run (default 200000)\n"
			       "  --window    in-flight notifications in the throughput run (default 256)\n"
			       "  --hs-iters  handshakes per layer count, 1 and 64 layers (default 200)\n"
			       "  --busy-poll both control lcores keep polling this long after the last\n"
			       "              activity before sleeping, us (default 100, the engine's\n"
			       "              control_busy_poll_us; 0: sleep at once)\n"
			       "  --auth-dir  also measure RTT and handshakes between CURVE-authenticated\n"
			       "              control lcores (both sides use DIR's key pair, so DIR/allowed/\n"
			       "              must hold DIR/engine.key) and print the auth/plain ratios\n"
			       "  --json      also write the figures to FILE\n");
			return 1;
		}
		uint64_t *dst = NULL;
		if ((r = perf_opt_value(argc, argv, &i, "--iters", &v)) != 0)
			dst = &o->iters;
		else if ((r = perf_opt_value(argc, argv, &i, "--msgs", &v)) != 0)
			dst = &o->msgs;
		else if ((r = perf_opt_value(argc, argv, &i, "--window", &v)) != 0)
			dst = &o->window;
		else if ((r = perf_opt_value(argc, argv, &i, "--hs-iters", &v)) != 0)
			dst = &o->hs_iters;
		else if ((r = perf_opt_value(argc, argv, &i, "--busy-poll", &v)) != 0) {
			if (r < 0 || perf_parse_u64(v, &o->busy_poll_us) || o->busy_poll_us > 1000000)
				goto bad;
			continue;
		}
		else if ((r = perf_opt_value(argc, argv, &i, "--auth-dir", &v)) != 0) {
			if (r < 0)
				goto bad;
			o->auth_dir = v;
			continue;
		} else if ((r = perf_opt_value(argc, argv, &i, "--json", &v)) != 0) {
			if (r < 0)
				goto bad;
			o->json = v;
			continue;
		} else {
			fprintf(stderr, "kvxfer-perf notify: unknown option '%s'\n", argv[i]);
			return -1;
		}
		if (r < 0 || perf_parse_u64(v, dst) || *dst == 0)
			goto bad;
	}
	if (o->window > 2048)
		o->window = 2048;
	return 0;
bad:
	fprintf(stderr, "kvxfer-perf notify: option '%s' needs a %s\n", opt,
		strncmp(opt, "--busy-poll", 11) ? "positive number"
						 : "number of microseconds, 0..1000000");
	return -1;
}

int kvx_perf_notify_main(int argc, char **argv)
{
	/* busy_poll_us: the engine's default (kvx_engine_params.control_busy_poll_us). */
	struct nopts o = {.iters = 20000, .msgs = 200000, .window = 256, .hs_iters = 200, .busy_poll_us = 100};
	int prc = parse(argc, argv, &o);
	if (prc)
		return prc > 0 ? 0 : 2;
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		return 1;
	pid_t pid = fork(); /* before any ZMQ context or thread exists in this process */
	if (pid < 0)
		return 1;
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		_exit(child_main(up[1], down[0], (uint32_t)o.busy_poll_us, o.auth_dir));
	}
	close(up[1]);
	close(down[0]);
	int ret = 1;
	uint16_t ports[7];
	if (full_io(up[0], ports, sizeof(ports), 0)) {
		fprintf(stderr, "kvxfer-perf notify: echo process failed to start\n");
		goto out_child;
	}
	struct kvx_ctl_params p;
	memset(&p, 0, sizeof(p));
	p.host = "127.0.0.1";
	p.bind_host = "127.0.0.1";
	p.ephemeral_ports = true;
	p.dp_size = 1;
	p.tp_size = 1;
	p.on_notify = count_cb;
	p.inbox_slots = 4096;
	p.busy_poll_us = (uint32_t)o.busy_poll_us;
	struct kvx_ctl *ctl = NULL, *actl = NULL;
	struct kvx_ctl_inbox *ib = NULL, *aib = NULL;
	if (kvx_ctl_create(&p, &ctl) || kvx_ctl_start(ctl) || kvx_ctl_inbox_open(ctl, &ib)) {
		fprintf(stderr, "kvxfer-perf notify: cannot start the control lcore\n");
		goto out_ctl;
	}
	uint16_t my_nt[2] = {0, 0};
	if (o.auth_dir) {
		p.auth_dir = o.auth_dir;
		if (kvx_ctl_create(&p, &actl) || kvx_ctl_start(actl) ||
		    kvx_ctl_inbox_open(actl, &aib)) {
			fprintf(stderr, "kvxfer-perf notify: cannot start the authenticated control "
					"lcore (--auth-dir %s)\n", o.auth_dir);
			goto out_ctl;
		}
		kvx_ctl_bound_ports(actl, NULL, &my_nt[1]);
	}
	kvx_ctl_bound_ports(ctl, NULL, &my_nt[0]);
	char ok;
	if (full_io(down[1], my_nt, sizeof(my_nt), 1) || full_io(up[0], &ok, 1, 0))
		goto out_ctl;

	uint64_t *rtt = calloc(o.iters, sizeof(uint64_t));
	uint64_t *trtt = calloc(o.iters, sizeof(uint64_t));
	uint64_t *zrtt = calloc(o.iters, sizeof(uint64_t)), *rtt_tmp = calloc(o.iters, sizeof(uint64_t));
	void *zctx = NULL, *zd = NULL;
	uint64_t *hs1 = calloc(o.hs_iters, sizeof(uint64_t));
	uint64_t *hs64 = calloc(o.hs_iters, sizeof(uint64_t));
	uint64_t *artt = calloc(o.iters, sizeof(uint64_t));
	uint64_t *ahs1 = calloc(o.hs_iters, sizeof(uint64_t));
	if (!rtt || !trtt || !zrtt || !rtt_tmp || !hs1 || !hs64 || !artt || !ahs1)
		goto out_mem;
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;

	/* Warm-up: connect the DEALERs both ways. */
	uint64_t sent = 0;
	for (int i = 0; i < 100; i++) {
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-warm-%d", i);
		while (kvx_ctl_send_notify(ib, "127.0.0.1", ports[1], &m) == -ENOBUFS)
			sched_yield();
		wait_rx(++sent);
	}
	/* ZMQ echo peer: a DEALER of this thread to the child's ROUTER, the same encoded bytes
	 * as kvxfer's write_done (the id changes per message the same way). */
	zctx = zmq_ctx_new();
	zd = zctx ? zmq_socket(zctx, ZMQ_DEALER) : NULL;
	char zep[64];
	int zero = 0;
	snprintf(zep, sizeof(zep), "tcp://127.0.0.1:%u", ports[4]);
	if (!zd || zmq_setsockopt(zd, ZMQ_LINGER, &zero, sizeof(zero)) || zmq_connect(zd, zep)) {
		fprintf(stderr, "kvxfer-perf notify: ZMQ echo peer: %s\n", zmq_strerror(zmq_errno()));
		goto out_zmq;
	}
	uint8_t zbuf[512], zrb[512];
	int zlen = 0;
	for (int i = 0; i < 100; i++) { /* warm-up, as for kvxfer */
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-warm-%d", i);
		zlen = kvx_msg_notify_encode(&m, zbuf, sizeof(zbuf));
		if (zlen <= 0 || zmq_send(zd, zbuf, (size_t)zlen, 0) != zlen || zmq_recv(zd, zrb, sizeof(zrb), 0) != zlen)
			goto out_zmq;
	}
	uint64_t cpu_kvx = 0, cpu_zmq = 0;
	double round_ratio[RTT_ROUNDS];
	uint64_t per = o.iters / RTT_ROUNDS ? o.iters / RTT_ROUNDS : 1, done = 0;
	for (int rd = 0; rd < RTT_ROUNDS; rd++) {
		uint64_t lo = done, hi = rd == RTT_ROUNDS - 1 ? o.iters : done + per;
		if (hi > o.iters)
			hi = o.iters;
		uint64_t c0 = proc_cpu_ns();
		for (uint64_t i = lo; i < hi; i++) {
			snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-%llu", (unsigned long long)i);
			uint64_t t0 = kvx_now_ns();
			while (kvx_ctl_send_notify(ib, "127.0.0.1", ports[1], &m) == -ENOBUFS)
				sched_yield();
			wait_rx(++sent);
			rtt[i] = kvx_now_ns() - t0;
		}
		uint64_t c1 = proc_cpu_ns();
		cpu_kvx += c1 - c0;
		for (uint64_t i = lo; i < hi; i++) {
			snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-%llu", (unsigned long long)i);
			uint64_t t0 = kvx_now_ns();
			zlen = kvx_msg_notify_encode(&m, zbuf, sizeof(zbuf));
			if (zlen <= 0 || zmq_send(zd, zbuf, (size_t)zlen, 0) != zlen ||
			    zmq_recv(zd, zrb, sizeof(zrb), 0) != zlen)
				goto out_zmq;
			zrtt[i] = kvx_now_ns() - t0;
		}
		cpu_zmq += proc_cpu_ns() - c1;
		/* This round's p50 ratio (copies: perf_stats_u64 sorts). */
		struct perf_stats a, b;
		memcpy(rtt_tmp, rtt + lo, (hi - lo) * sizeof(uint64_t));
		perf_stats_u64(rtt_tmp, hi - lo, &a);
		memcpy(rtt_tmp, zrtt + lo, (hi - lo) * sizeof(uint64_t));
		perf_stats_u64(rtt_tmp, hi - lo, &b);
		round_ratio[rd] = (double)a.p50 / (double)b.p50;
		done = hi;
	}
	double cpu_rtt = (double)cpu_kvx / (double)o.iters;
	double zmq_cpu_rtt = (double)cpu_zmq / (double)o.iters;
	double zmq_ratio_p50 = perf_median_double(round_ratio, RTT_ROUNDS);
	uint64_t t0 = kvx_now_ns();
	uint64_t base = sent;
	for (uint64_t i = 0; i < o.msgs; i++) {
		if (sent >= o.window)
			wait_rx(sent - o.window + 1);
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-t-%llu", (unsigned long long)i);
		while (kvx_ctl_send_notify(ib, "127.0.0.1", ports[1], &m) == -ENOBUFS)
			sched_yield();
		sent++;
	}
	wait_rx(sent);
	double thr_s = (double)(kvx_now_ns() - t0) / 1e9;
	double msgs_s = (double)(sent - base) / thr_s;

	/* Peer in the same run: TCP echo, same frame size, RTT and windowed throughput. */
	int ts = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ports[3]),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int one = 1;
	if (ts < 0 || connect(ts, (struct sockaddr *)&a, sizeof(a)))
		goto out_zmq;
	setsockopt(ts, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	uint8_t fr[FRAME_BYTES], rb[FRAME_BYTES];
	memset(fr, 'x', sizeof(fr));
	uint64_t cpu0 = proc_cpu_ns();
	for (uint64_t i = 0; i < o.iters; i++) {
		uint64_t s0 = kvx_now_ns();
		if (full_io(ts, fr, sizeof(fr), 1) || full_io(ts, rb, sizeof(rb), 0))
			goto out_tcp;
		trtt[i] = kvx_now_ns() - s0;
	}
	double tcp_cpu_rtt = (double)(proc_cpu_ns() - cpu0) / (double)o.iters;
	/* Windowed TCP: write `window` frames, then read one per write (socket buffers hold it). */
	uint64_t w = o.window < 64 ? o.window : 64;
	t0 = kvx_now_ns();
	for (uint64_t i = 0; i < w; i++)
		if (full_io(ts, fr, sizeof(fr), 1))
			goto out_tcp;
	for (uint64_t i = w; i < o.msgs; i++)
		if (full_io(ts, rb, sizeof(rb), 0) || full_io(ts, fr, sizeof(fr), 1))
			goto out_tcp;
	for (uint64_t i = 0; i < w; i++)
		if (full_io(ts, rb, sizeof(rb), 0))
			goto out_tcp;
	double tcp_msgs_s = (double)o.msgs / ((double)(kvx_now_ns() - t0) / 1e9);

	if (run_handshakes(ib, ports[0], o.hs_iters, hs1) ||
	    run_handshakes(ib, ports[2], o.hs_iters, hs64))
		goto out_tcp;
	/* Same session, CURVE on both sides (--auth-dir): RTT and 1-layer handshakes. */
	struct perf_stats s_artt, s_ahs1;
	if (aib) {
		for (int i = 0; i < 100; i++) { /* warm-up: CURVE handshakes of both DEALERs */
			snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-awarm-%d", i);
			while (kvx_ctl_send_notify(aib, "127.0.0.1", ports[6], &m) == -ENOBUFS)
				sched_yield();
			wait_rx(++sent);
		}
		for (uint64_t i = 0; i < o.iters; i++) {
			snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-a-%llu",
				 (unsigned long long)i);
			uint64_t a0 = kvx_now_ns();
			while (kvx_ctl_send_notify(aib, "127.0.0.1", ports[6], &m) == -ENOBUFS)
				sched_yield();
			wait_rx(++sent);
			artt[i] = kvx_now_ns() - a0;
		}
		if (run_handshakes(aib, ports[5], o.hs_iters, ahs1))
			goto out_tcp;
	}

	struct perf_stats s_rtt, s_trtt, s_zrtt, s_hs1, s_hs64;
	perf_stats_u64(rtt, o.iters, &s_rtt);
	perf_stats_u64(zrtt, o.iters, &s_zrtt);
	perf_stats_u64(trtt, o.iters, &s_trtt);
	perf_stats_u64(hs1, o.hs_iters, &s_hs1);
	perf_stats_u64(hs64, o.hs_iters, &s_hs64);
	if (aib) {
		perf_stats_u64(artt, o.iters, &s_artt);
		perf_stats_u64(ahs1, o.hs_iters, &s_ahs1);
	}
	char cpu[128];
	perf_cpu_model(cpu, sizeof(cpu));
	printf("kvxfer-perf notify: 2 processes on loopback, unpinned (%ld online CPUs, %s)\n",
	       sysconf(_SC_NPROCESSORS_ONLN), cpu);
	printf("notification round trip (write_done -> release, inbox -> DEALER -> ROUTER -> "
	       "callback, both ways):\n");
	print_stats("kvxfer notify RTT", &s_rtt);
	print_stats("peer: ZMQ DEALER/ROUTER echo", &s_zrtt);
	printf("  ratio kvxfer/ZMQ echo: p50 %.2f (median of %d alternating rounds' p50 ratios), "
	       "all samples p50 %.2f  p99 %.2f; %d B messages\n",
	       zmq_ratio_p50, RTT_ROUNDS, (double)s_rtt.p50 / (double)s_zrtt.p50,
	       (double)s_rtt.p99 / (double)s_zrtt.p99, zlen);
	printf("  measuring process CPU per round trip: kvxfer %.1f us, ZMQ echo %.1f us, ratio %.2f\n",
	       cpu_rtt / 1e3, zmq_cpu_rtt / 1e3, cpu_rtt / zmq_cpu_rtt);
	print_stats("peer: TCP echo RTT (40 B)", &s_trtt);
	printf("  ratio kvxfer/TCP: p50 %.2f  p99 %.2f  p99.9 %.2f\n",
	       (double)s_rtt.p50 / (double)s_trtt.p50, (double)s_rtt.p99 / (double)s_trtt.p99,
	       (double)s_rtt.p999 / (double)s_trtt.p999);
	printf("  measuring process CPU per round trip (all its threads): kvxfer %.1f us, TCP "
	       "echo %.1f us, ratio %.2f (busy-poll %llu us)\n",
	       cpu_rtt / 1e3, tcp_cpu_rtt / 1e3, cpu_rtt / tcp_cpu_rtt,
	       (unsigned long long)o.busy_poll_us);
	printf("throughput (window %llu): kvxfer %.0f msg/s, TCP echo (window %llu) %.0f msg/s, "
	       "ratio %.2f\n",
	       (unsigned long long)o.window, msgs_s, (unsigned long long)w, tcp_msgs_s,
	       msgs_s / tcp_msgs_s);
	printf("handshake (get_meta_msg + metadata + region map + 64 B connection setup):\n");
	print_stats("1 layer", &s_hs1);
	print_stats("64 layers", &s_hs64);
	if (aib) {
		printf("with CURVE authentication (--auth-dir %s), same session:\n", o.auth_dir);
		print_stats("notify RTT, CURVE", &s_artt);
		print_stats("handshake 1 layer, CURVE", &s_ahs1);
		printf("  ratio CURVE/plain: notify RTT p50 %.2f p99 %.2f, handshake p50 %.2f "
		       "p99 %.2f\n", (double)s_artt.p50 / (double)s_rtt.p50,
		       (double)s_artt.p99 / (double)s_rtt.p99,
		       (double)s_ahs1.p50 / (double)s_hs1.p50, (double)s_ahs1.p99 / (double)s_hs1.p99);
	}
	ret = 0;
	if (o.json) {
		struct perf_json j;
		memset(&j, 0, sizeof(j));
		if (perf_json_open(&j, o.json)) {
			fprintf(stderr, "kvxfer-perf notify: cannot write %s\n", o.json);
			ret = 1;
		} else {
			perf_json_str(&j, "command", "notify");
			perf_json_str(&j, "bench", "notify");
			perf_json_str(&j, "cpu", cpu);
			perf_json_u64(&j, "online_cpus", (uint64_t)sysconf(_SC_NPROCESSORS_ONLN));
			perf_json_str(&j, "pinning", "none");
			json_us(&j, "notify_rtt", &s_rtt);
			json_us(&j, "zmq_echo_rtt", &s_zrtt);
			perf_json_u64(&j, "zmq_echo_msg_bytes", (uint64_t)zlen);
			perf_json_u64(&j, "rtt_rounds", RTT_ROUNDS);
			perf_json_double(&j, "zmq_rtt_ratio_p50", zmq_ratio_p50);
			perf_json_double(&j, "zmq_rtt_ratio_p99", (double)s_rtt.p99 / (double)s_zrtt.p99);
			perf_json_double(&j, "zmq_echo_cpu_per_rtt_us", zmq_cpu_rtt / 1e3);
			json_us(&j, "tcp_echo_rtt", &s_trtt);
			perf_json_double(&j, "rtt_ratio_p50", (double)s_rtt.p50 / (double)s_trtt.p50);
			perf_json_double(&j, "rtt_ratio_p99", (double)s_rtt.p99 / (double)s_trtt.p99);
			perf_json_double(&j, "rtt_ratio_p999", (double)s_rtt.p999 / (double)s_trtt.p999);
			perf_json_u64(&j, "busy_poll_us", o.busy_poll_us);
			perf_json_double(&j, "cpu_per_rtt_us", cpu_rtt / 1e3);
			perf_json_double(&j, "tcp_echo_cpu_per_rtt_us", tcp_cpu_rtt / 1e3);
			perf_json_double(&j, "cpu_ratio", cpu_rtt / tcp_cpu_rtt);
			perf_json_u64(&j, "window", o.window);
			perf_json_double(&j, "msgs_per_s", msgs_s);
			perf_json_double(&j, "tcp_echo_msgs_per_s", tcp_msgs_s);
			perf_json_double(&j, "msgs_ratio", msgs_s / tcp_msgs_s);
			json_us(&j, "handshake_1_layer", &s_hs1);
			json_us(&j, "handshake_64_layers", &s_hs64);
			if (aib) {
				json_us(&j, "notify_rtt_curve", &s_artt);
				json_us(&j, "handshake_1_layer_curve", &s_ahs1);
				perf_json_double(&j, "curve_rtt_ratio_p50",
						 (double)s_artt.p50 / (double)s_rtt.p50);
				perf_json_double(&j, "curve_handshake_ratio_p50",
						 (double)s_ahs1.p50 / (double)s_hs1.p50);
			}
			if (perf_json_close(&j))
				ret = 1;
		}
	}
out_tcp:
	close(ts);
out_zmq:
	if (zd)
		zmq_close(zd);
	if (zctx)
		zmq_ctx_term(zctx);
out_mem:
	free(rtt);
	free(trtt);
	free(zrtt);
	free(rtt_tmp);
	free(hs1);
	free(hs64);
	free(artt);
	free(ahs1);
out_ctl:
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(ctl);
	if (aib)
		kvx_ctl_inbox_close(aib);
	kvx_ctl_destroy(actl);
out_child:
	close(down[1]);
	close(up[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "kvxfer-perf notify: echo process failed (status %d)\n", st);
		ret = 1;
	}
	return ret;
}
