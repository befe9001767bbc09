/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CURVE authentication of the control plane (issue 17), with real libzmq sockets on loopback:
 * key directories made by kvx_ctl_auth_keygen(), two control objects that allow each other,
 * and raw DEALERs playing unauthenticated or unlisted peers.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#ifdef KVX_TSAN_RUNNER /* TSan build: Criterion cannot start (tests/lcore/tsan_runner.h) */
#include "tests/lcore/tsan_runner.h"
#define cr_assert_str_eq(a, b, ...) KVX_TSAN_CHECK(!strcmp((a), (b)), #a " == " #b)
#else
#include <criterion/criterion.h>
#endif

#include "ctl_test_util.h"

TestSuite(control_auth, .timeout = 60.0);

/* A fresh auth directory under /tmp; returns its path in dir. */
static void mk_dir(char *dir, size_t cap)
{
	snprintf(dir, cap, "/tmp/kvx-auth-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(kvx_ctl_auth_keygen(dir), 0);
}

/* Copy from/engine.key into to/allowed/NAME.key. */
static void allow(const char *from, const char *to, const char *name)
{
	char src[512], dst[512], buf[4096];
	snprintf(src, sizeof(src), "%s/engine.key", from);
	snprintf(dst, sizeof(dst), "%s/allowed/%s.key", to, name);
	FILE *i = fopen(src, "r"), *o = fopen(dst, "w");
	cr_assert(i && o);
	size_t n = fread(buf, 1, sizeof(buf), i);
	cr_assert_eq(fwrite(buf, 1, n, o), n);
	fclose(i);
	fclose(o);
}

/* Read the Z85 public (and secret when sec != NULL) key of dir/engine.key_secret. */
static void read_keys(const char *dir, char pub[41], char sec[41])
{
	char path[512], line[512];
	snprintf(path, sizeof(path), "%s/engine.key_secret", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f)) {
		char *q = strchr(line, '"');
		if (!q)
			continue;
		if (strstr(line, "public-key"))
			memcpy(pub, q + 1, 40), pub[40] = 0;
		if (sec && strstr(line, "secret-key"))
			memcpy(sec, q + 1, 40), sec[40] = 0;
	}
	fclose(f);
}

static void rm_dir(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

struct hsw {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, status;
	char error[512];
	uint32_t nregions;
};

static void hs_done(void *arg, const struct kvx_ctl_hs_result *r)
{
	struct hsw *w = arg;
	pthread_mutex_lock(&w->mu);
	w->status = r->status;
	snprintf(w->error, sizeof(w->error), "%s", r->error);
	if (r->num_ranks && r->ranks[0].meta)
		w->nregions = r->ranks[0].meta->num_regions;
	w->done = 1;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static void hsw_wait(struct hsw *w)
{
	pthread_mutex_lock(&w->mu);
	while (!w->done) /* the job's own deadline (timeout_ms) bounds this */
		pthread_cond_wait(&w->cv, &w->mu);
	pthread_mutex_unlock(&w->mu);
}

static void handshake(struct kvx_ctl *from, uint16_t port, uint32_t timeout_ms, struct hsw *w)
{
	memset(w, 0, sizeof(*w));
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(from, &ib), 0);
	struct kvx_ctl_hs_params hp;
	memset(&hp, 0, sizeof(hp));
	hp.host = "127.0.0.1";
	hp.handshake_base_port = port;
	hp.dp_size = 1;
	hp.tp_size = 1;
	hp.timeout_ms = timeout_ms;
	hp.on_done = hs_done;
	hp.arg = w;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	hsw_wait(w);
	kvx_ctl_inbox_close(ib);
}

static struct kvx_ctl *auth_ctl(const char *dir, struct collector *c, int listen)
{
	struct kvx_ctl_params p;
	tctl_params(&p, c);
	p.auth_dir = dir;
	struct kvx_ctl *ctl = NULL;
	int rc = kvx_ctl_create(&p, &ctl);
	cr_assert_eq(rc, 0, "kvx_ctl_create: %s", kvx_strerror(rc));
	if (listen)
		tctl_set_local(ctl, 3);
	cr_assert_eq(kvx_ctl_start(ctl), 0);
	return ctl;
}

static const uint8_t GET_META[] = KVX_MSG_GET_META;

static struct kvx_msg_notify release_msg(const char *tid)
{
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_RELEASE;
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	return m;
}

Test(control_auth, listed_keys_handshake_and_notify_end_to_end)
{
	char da[64], db[64];
	mk_dir(da, sizeof(da));
	mk_dir(db, sizeof(db));
	allow(da, db, "a");
	allow(db, da, "b");
	struct collector ca, cb;
	coll_init(&ca);
	coll_init(&cb);
	struct kvx_ctl *a = auth_ctl(da, &ca, 1), *b = auth_ctl(db, &cb, 0);
	uint16_t ahs, ant, bnt;
	cr_assert_eq(kvx_ctl_bound_ports(a, &ahs, &ant), 0);
	cr_assert_eq(kvx_ctl_bound_ports(b, NULL, &bnt), 0);
	struct hsw w;
	handshake(b, ahs, 20000, &w);
	cr_assert_eq(w.status, 0, "%s", w.error);
	cr_assert_eq(w.nregions, 3);
	cr_assert_eq(CTR(a, hs_served), 1);
	/* Notifications both ways over CURVE. */
	struct kvx_ctl_inbox *ia, *ibx;
	cr_assert_eq(kvx_ctl_inbox_open(a, &ia), 0);
	cr_assert_eq(kvx_ctl_inbox_open(b, &ibx), 0);
	struct kvx_msg_notify m = release_msg("tx-auth-1");
	cr_assert_eq(kvx_ctl_send_notify(ibx, "127.0.0.1", ant, &m), 0);
	m = release_msg("tx-auth-2");
	cr_assert_eq(kvx_ctl_send_notify(ia, "127.0.0.1", bnt, &m), 0);
	cr_assert_eq(coll_wait(&ca, 1, 20.0), 1);
	cr_assert_eq(coll_wait(&cb, 1, 20.0), 1);
	cr_assert_str_eq(ca.msgs[0].m.transfer_id, "tx-auth-1");
	cr_assert_str_eq(cb.msgs[0].m.transfer_id, "tx-auth-2");
	cr_assert_eq(CTR(a, auth_refused), 0);
	cr_assert_geq(CTR(a, auth_accepted), 2, "handshake + notify connections admitted");
	kvx_ctl_inbox_close(ia);
	kvx_ctl_inbox_close(ibx);
	kvx_ctl_destroy(a);
	kvx_ctl_destroy(b);
	coll_fini(&ca);
	coll_fini(&cb);
	rm_dir(da);
	rm_dir(db);
}

Test(control_auth, plain_dealer_gets_no_reply_and_its_notifications_take_no_effect)
{
	char da[64], db[64];
	mk_dir(da, sizeof(da));
	mk_dir(db, sizeof(db));
	allow(da, db, "a");
	allow(db, da, "b");
	struct collector ca;
	coll_init(&ca);
	struct kvx_ctl *a = auth_ctl(da, &ca, 1);
	uint16_t hs, nt;
	cr_assert_eq(kvx_ctl_bound_ports(a, &hs, &nt), 0);
	void *z = zmq_ctx_new();
	void *d = raw_dealer(z, hs);
	cr_assert_eq(zmq_send(d, GET_META, sizeof(GET_META) - 1, 0), (int)sizeof(GET_META) - 1);
	cr_assert(WAIT_CTR(a, auth_refused, 1, 20.0), "the plain connection is refused");
	void *n = raw_dealer(z, nt);
	uint8_t buf[512];
	struct kvx_msg_notify m = release_msg("tx-forged");
	int len = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_gt(len, 0);
	cr_assert_eq(zmq_send(n, buf, (size_t)len, 0), len);
	cr_assert(WAIT_CTR(a, auth_refused, 2, 20.0), "the notify connection is refused too");
	/* The ROUTERs never saw a frame: nothing served, delivered or even parsed. */
	cr_assert_eq(zmq_recv(d, buf, sizeof(buf), ZMQ_DONTWAIT), -1);
	cr_assert_eq(zmq_errno(), EAGAIN);
	cr_assert_eq(CTR(a, hs_served), 0);
	cr_assert_eq(CTR(a, notify_rx), 0);
	cr_assert_eq(CTR(a, malformed), 0);
	cr_assert_eq(coll_wait(&ca, 0, 0.0), 0, "no notification delivered");
	/* The listener is still up: a listed CURVE peer is served afterwards. */
	struct kvx_ctl *b = auth_ctl(db, NULL, 0);
	struct hsw w;
	handshake(b, hs, 20000, &w);
	cr_assert_eq(w.status, 0, "%s", w.error);
	zmq_close(d);
	zmq_close(n);
	zmq_ctx_term(z);
	kvx_ctl_destroy(a);
	kvx_ctl_destroy(b);
	coll_fini(&ca);
	rm_dir(da);
	rm_dir(db);
}

Test(control_auth, curve_client_with_unlisted_key_is_refused_listener_survives)
{
	char da[64], dx[64], db[64];
	mk_dir(da, sizeof(da));
	mk_dir(dx, sizeof(dx)); /* a key pair that a does not list */
	mk_dir(db, sizeof(db));
	allow(db, da, "b");
	allow(da, db, "a");
	struct collector ca;
	coll_init(&ca);
	struct kvx_ctl *a = auth_ctl(da, &ca, 1);
	uint16_t hs, nt;
	cr_assert_eq(kvx_ctl_bound_ports(a, &hs, &nt), 0);
	char apub[41], xpub[41], xsec[41];
	read_keys(da, apub, NULL);
	read_keys(dx, xpub, xsec);
	void *z = zmq_ctx_new();
	void *d = zmq_socket(z, ZMQ_DEALER);
	int zero = 0;
	zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
	cr_assert_eq(zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, apub, 41), 0);
	cr_assert_eq(zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, xpub, 41), 0);
	cr_assert_eq(zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, xsec, 41), 0);
	char ep[64];
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", hs);
	cr_assert_eq(zmq_connect(d, ep), 0);
	cr_assert_eq(zmq_send(d, GET_META, sizeof(GET_META) - 1, 0), (int)sizeof(GET_META) - 1);
	cr_assert(WAIT_CTR(a, auth_refused, 1, 20.0));
	struct kvx_ctl_peer_stats ps[8];
	size_t np = kvx_ctl_peer_stats_get(a, ps, 8);
	int found = 0;
	for (size_t i = 0; i < np; i++)
		found |= !strcmp(ps[i].peer, "127.0.0.1") && ps[i].refused >= 1;
	cr_assert(found, "refusal counted for the peer 127.0.0.1");
	uint8_t buf[256];
	cr_assert_eq(zmq_recv(d, buf, sizeof(buf), ZMQ_DONTWAIT), -1);
	cr_assert_eq(CTR(a, hs_served), 0);
	/* An unlisted engine's handshake job fails (times out); the listed one still works. */
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.auth_dir = dx;
	allow(da, dx, "a");
	struct kvx_ctl *x = tctl_start(&p);
	struct hsw w;
	handshake(x, hs, 1500, &w);
	cr_assert_eq(w.status, -ETIMEDOUT, "%s", w.error);
	struct kvx_ctl *b = auth_ctl(db, NULL, 0);
	handshake(b, hs, 20000, &w);
	cr_assert_eq(w.status, 0, "%s", w.error);
	cr_assert_eq(CTR(a, hs_served), 1, "only the listed engine was served");
	zmq_close(d);
	zmq_ctx_term(z);
	kvx_ctl_destroy(x);
	kvx_ctl_destroy(b);
	kvx_ctl_destroy(a);
	coll_fini(&ca);
	rm_dir(da);
	rm_dir(dx);
	rm_dir(db);
}

Test(control_auth, bad_auth_dirs_are_rejected_at_create)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *c = NULL;
	p.auth_dir = "/nonexistent/kvx-auth";
	cr_assert_eq(kvx_ctl_create(&p, &c), -ENOENT);
	char d[64];
	mk_dir(d, sizeof(d));
	cr_assert_eq(kvx_ctl_auth_keygen(d), -EEXIST, "keys are never overwritten");
	char path[128];
	snprintf(path, sizeof(path), "%s/engine.key_secret", d);
	cr_assert_eq(chmod(path, 0644), 0);
	p.auth_dir = d;
	cr_assert_eq(kvx_ctl_create(&p, &c), -EPERM, "a secret readable by others is refused");
	cr_assert_eq(chmod(path, 0600), 0);
	cr_assert_eq(kvx_ctl_create(&p, &c), 0);
	kvx_ctl_destroy(c);
	rm_dir(d);
}

Test(control_auth, allowlist_changes_take_effect_without_a_restart)
{
	char da[64], dx[64];
	mk_dir(da, sizeof(da));
	mk_dir(dx, sizeof(dx));
	/* allowed/ last changed an hour ago: connections then only stat it (no re-read) until it
	 * changes again, the path a long-running engine takes. */
	char path[128];
	const char *dirs[2] = {da, dx};
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/allowed", dirs[i]);
		struct timespec old[2] = {{.tv_sec = time(NULL) - 3600}, {.tv_sec = time(NULL) - 3600}};
		cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
	}
	struct collector ca;
	coll_init(&ca);
	/* Both start with empty allowlists: neither knows the other yet. */
	struct kvx_ctl *a = auth_ctl(da, &ca, 1);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.auth_dir = dx;
	struct kvx_ctl *x = tctl_start(&p);
	uint16_t hs, nt;
	cr_assert_eq(kvx_ctl_bound_ports(a, &hs, &nt), 0);
	struct hsw w;
	/* x has no key for a: its handshake fails at once, naming the missing file. */
	handshake(x, hs, 20000, &w);
	cr_assert_neq(w.status, 0);
	cr_assert_eq(CTR(a, hs_served), 0);
	/* Keys added to the running engines' allowed/ directories count at the next connection. */
	allow(da, dx, "a");
	allow(dx, da, "x");
	handshake(x, hs, 20000, &w);
	cr_assert_eq(w.status, 0, "%s", w.error);
	cr_assert_eq(CTR(a, hs_served), 1);
	uint64_t refused = CTR(a, auth_refused);
	/* A key removed from allowed/ is refused from the next connection on. */
	snprintf(path, sizeof(path), "%s/allowed/x.key", da);
	cr_assert_eq(unlink(path), 0);
	handshake(x, hs, 1500, &w);
	cr_assert_eq(w.status, -ETIMEDOUT, "%s", w.error);
	cr_assert(WAIT_CTR(a, auth_refused, refused + 1, 20.0));
	cr_assert_eq(CTR(a, hs_served), 1, "the removed key was not served");
	kvx_ctl_destroy(x);
	kvx_ctl_destroy(a);
	coll_fini(&ca);
	rm_dir(da);
	rm_dir(dx);
}
