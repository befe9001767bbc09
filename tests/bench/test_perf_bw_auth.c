/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvxfer-perf bw --auth-dir DIR` (issue 17): the out-of-band socket of bw/lat authenticated with
 * the auth directory's keys and sealed (bench/px_auth.h). Through the real binary: --local and a
 * server and clients in separate processes over tcp (a plain client, an unlisted key and a
 * listed key against one server that keeps listening), and in-process on a socket pair: a
 * forged or replayed message and a peer that claims a listed public key without its secret key
 * are refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kvxfer/control.h"
#include "perf_run.h"
#include "perf_xport.h"
#include "px_auth.h"

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_bw_auth, .timeout = 240.0);

static char g_tmp[64];
static struct perf_run g_r, g_s;

static void setup(void)
{
	snprintf(g_tmp, sizeof(g_tmp), "/tmp/kvx_bwauth.XXXXXX");
	cr_assert(mkdtemp(g_tmp));
}

static void teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
	cr_assert_eq(system(cmd), 0);
}

/* g_tmp/NAME via `kvxfer-perf keygen` (the tool users run). */
static void keygen(const char *name, char *dir, size_t len)
{
	snprintf(dir, len, "%s/%s", g_tmp, name);
	const char *const a[] = {"keygen", dir, NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, a);
	cr_assert_eq(g_r.status, 0, "keygen %s: %s", dir, g_r.err);
}

/* Copy FROM/engine.key to TO/allowed/AS.key. */
static void allow(const char *from, const char *to, const char *as)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "cp '%s/engine.key' '%s/allowed/%s.key'", from, to, as);
	cr_assert_eq(system(cmd), 0);
}

Test(bench_perf_bw_auth, local_run_is_authenticated_and_reports_it, .init = setup, .fini = teardown)
{
	char d[128];
	keygen("self", d, sizeof(d));
	allow(d, d, "self");
	const char *const a[] = {"bw", "--local", "-t", "tcp", "-s", "64K", "-n", "20", "--auth-dir", d, NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, a);
	cr_assert_eq(g_r.status, 0, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "Data ex. method : Ethernet (out-of-band TCP), authenticated (--auth-dir keys) and "
				  "sealed"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, " 65536      20 "), "%s", g_r.out);
	const char *const j[] = {"bw", "--local", "-t", "tcp", "-s", "64K", "-n", "20", "--auth-dir", d,
				 "--json", "-", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, j);
	cr_assert_eq(g_r.status, 0, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "\"auth\": true"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "\"iterations\": 20"), "%s", g_r.out);
	/* Without the option the header and the JSON say so. */
	const char *const b[] = {"bw", "--local", "-t", "tcp", "-s", "64K", "-n", "20", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, b);
	cr_assert_eq(g_r.status, 0, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "(out-of-band TCP), unauthenticated"), "%s", g_r.out);
	const char *const bj[] = {"bw", "--local", "-t", "tcp", "-s", "64K", "-n", "20", "--json", "-", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, bj);
	cr_assert_eq(g_r.status, 0, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "\"auth\": false"), "%s", g_r.out);
	/* lat shares the setup: its ping-pong runs over the authenticated setup too. */
	const char *const lt[] = {"lat", "--local", "-t", "tcp", "-n", "20", "--auth-dir", d, NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, lt);
	cr_assert_eq(g_r.status, 0, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "authenticated (--auth-dir keys) and sealed"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, " 2       20 "), "%s", g_r.out);
}

Test(bench_perf_bw_auth, local_run_refuses_a_dir_whose_allowlist_lacks_its_own_key, .init = setup,
     .fini = teardown)
{
	char d[128];
	keygen("self", d, sizeof(d));
	const char *const a[] = {"bw", "--local", "-t", "tcp", "-s", "4K", "-n", "5", "--auth-dir", d, NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, a);
	cr_assert_eq(g_r.status, 1, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.err, "is not in "), "%s", g_r.err);
	cr_assert(strstr(g_r.err, "(1 refused so far)"), "%s", g_r.err);
}

Test(bench_perf_bw_auth, dir_without_key_pair_is_usage_error, .init = setup, .fini = teardown)
{
	char d[128];
	snprintf(d, sizeof(d), "%s/none", g_tmp);
	cr_assert_eq(mkdir(d, 0700), 0);
	const char *const a[] = {"bw", "--local", "-t", "tcp", "--auth-dir", d, NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, a);
	cr_assert_eq(g_r.status, 2, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.err, "no usable key pair"), "%s", g_r.err);
	cr_assert(strstr(g_r.err, "kvxfer-perf keygen DIR"), "%s", g_r.err);
	const char *const p[] = {"bw", "--peer", "memcpy", "--auth-dir", d, NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, p);
	cr_assert_eq(g_r.status, 2, "%s\n%s", g_r.out, g_r.err);
}

/* Start `bw -p 0 [--auth-dir DIR]` and return its port once it listens. */
static unsigned start_server(struct perf_child *ch, const char *dir)
{
	const char *const a[] = {"bw", "-t", "tcp", "-p", "0", dir ? "--auth-dir" : NULL, dir, NULL};
	memset(&g_s, 0, sizeof(g_s));
	perf_run_start(ch, KVX_PERF_BIN, NULL, a);
	cr_assert_not(perf_run_read(ch, &g_s, 60000, "listening on TCP port "), "server exited: %s", g_s.err);
	/* The line may still be arriving: read until its newline. */
	char *p = strstr(g_s.out, "listening on TCP port ");
	while (!strchr(p, '\n')) {
		cr_assert_not(perf_run_read(ch, &g_s, 60000, NULL) && !strchr(p, '\n'));
		p = strstr(g_s.out, "listening on TCP port ");
	}
	unsigned port = (unsigned)strtoul(p + strlen("listening on TCP port "), NULL, 10);
	cr_assert(port > 0 && port < 65536, "%s", g_s.out);
	return port;
}

Test(bench_perf_bw_auth, server_refuses_plain_and_unlisted_clients_and_keeps_listening, .init = setup,
     .fini = teardown)
{
	char s[128], c[128], x[128], port[16];
	keygen("server", s, sizeof(s));
	keygen("client", c, sizeof(c));
	keygen("stranger", x, sizeof(x));
	allow(c, s, "client");
	allow(s, c, "server");
	allow(s, x, "server"); /* the stranger knows the server; the server does not list it */
	struct perf_child ch;
	snprintf(port, sizeof(port), "%u", start_server(&ch, s));

	/* 1. A client without --auth-dir: refused, told why; the server keeps listening. */
	const char *const plain[] = {"bw", "-t", "tcp", "-s", "4K", "-n", "5", "-p", port, "127.0.0.1", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, plain);
	cr_assert_eq(g_r.status, 1, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.err, "closed the connection at the first message"), "%s", g_r.err);
	cr_assert_not(perf_run_read(&ch, &g_s, 60000, "(1 refused so far; still listening)"), "server exited: %s",
		      g_s.err);
	cr_assert(strstr(g_s.err, "the client did not start with an authentication hello"), "%s", g_s.err);

	/* 2. A key the server does not list. */
	const char *const unl[] = {"bw", "-t", "tcp", "-s", "4K", "-n", "5", "-p", port, "--auth-dir", x, "127.0.0.1",
				   NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, unl);
	cr_assert_eq(g_r.status, 1, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.err, "the server closed the connection during authentication"), "%s", g_r.err);
	cr_assert_not(perf_run_read(&ch, &g_s, 60000, "(2 refused so far; still listening)"), "server exited: %s",
		      g_s.err);
	cr_assert(strstr(g_s.err, "public key "), "%s", g_s.err);
	cr_assert(strstr(g_s.err, "is not in "), "%s", g_s.err);

	/* 3. The listed client runs, end to end over tcp, and the server reports its rows. */
	const char *const ok[] = {"bw", "-t", "tcp", "-s", "64K", "-n", "20", "-p", port, "--auth-dir", c, "127.0.0.1",
				  NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, ok);
	cr_assert_eq(g_r.status, 0, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "authenticated (--auth-dir keys) and sealed"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, " 65536      20 "), "%s", g_r.out);
	cr_assert(perf_run_read(&ch, &g_s, 60000, NULL));
	cr_assert_eq(g_s.status, 0, "%s\n%s", g_s.out, g_s.err);
	cr_assert(strstr(g_s.err, "client authenticated (key client.key)"), "%s", g_s.err);
	cr_assert(strstr(g_s.out, " 65536      20 "), "%s", g_s.out);
}

Test(bench_perf_bw_auth, authenticated_client_and_plain_server_fail_with_a_reason, .init = setup, .fini = teardown)
{
	char c[128], port[16];
	keygen("client", c, sizeof(c));
	struct perf_child ch;
	snprintf(port, sizeof(port), "%u", start_server(&ch, NULL));
	const char *const a[] = {"bw", "-t", "tcp", "-s", "4K", "-n", "5", "-p", port, "--auth-dir", c, "127.0.0.1",
				 NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, a);
	cr_assert_eq(g_r.status, 1, "%s\n%s", g_r.out, g_r.err);
	cr_assert(strstr(g_r.err, "or it runs without --auth-dir"), "%s", g_r.err);
	cr_assert(perf_run_read(&ch, &g_s, 60000, NULL));
	cr_assert_eq(g_s.status, 1, "%s\n%s", g_s.out, g_s.err);
}

/* ---- the exchange itself, in process, on a socket pair ---- */

struct side {
	int fd;
	const char *dir;
	struct px_auth *a;
	int rc;
	char who[64], err[400];
};

static void *server_side(void *arg)
{
	struct side *s = arg;
	s->rc = px_auth_server(s->fd, s->dir, 30000000000ull, &s->a, s->who, sizeof(s->who), s->err, sizeof(s->err));
	if (s->rc) /* as kvxfer-perf's server: a refused connection is closed */
		shutdown(s->fd, SHUT_RDWR);
	return NULL;
}

/* Run both sides; the server on a thread. */
static void exchange(struct side *cl, struct side *sv)
{
	int sp[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	cl->fd = sp[0];
	sv->fd = sp[1];
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, server_side, sv), 0);
	cl->rc = px_auth_client(cl->fd, cl->dir, sizeof(struct px_msg), 30000000000ull, &cl->a, cl->err, sizeof(cl->err));
	if (cl->rc) /* unblock a server still waiting for the confirmation */
		shutdown(cl->fd, SHUT_RDWR);
	cr_assert_eq(pthread_join(t, NULL), 0);
}

static void pair_dirs(char *s, char *c, size_t len)
{
	keygen("server", s, len);
	keygen("client", c, len);
	allow(c, s, "client");
	allow(s, c, "server");
}

Test(bench_perf_bw_auth, sealed_messages_pass_and_forged_or_replayed_ones_are_refused, .init = setup,
     .fini = teardown)
{
	char s[128], c[128];
	pair_dirs(s, c, sizeof(s));
	struct side cl = {.dir = c}, sv = {.dir = s};
	exchange(&cl, &sv);
	cr_assert_eq(cl.rc, 0, "%s", cl.err);
	cr_assert_eq(sv.rc, 0, "%s", sv.err);
	cr_assert_str_eq(sv.who, "client");
	struct px_msg *m = calloc(2, sizeof(*m));
	cr_assert(m);
	m[0].type = PX_HELLO;
	m[0].qps = 7;
	cr_assert_eq(px_auth_send(cl.a, cl.fd, &m[0], sizeof(m[0])), 0);
	cr_assert_eq(px_auth_recv(sv.a, sv.fd, &m[1], sizeof(m[1])), 0);
	cr_assert_eq(m[1].qps, 7);
	/* On the wire: one sealed message, not the plain bytes; capture it and send it twice. */
	int sp[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	cr_assert_eq(px_auth_send(cl.a, sp[0], &m[0], sizeof(m[0])), 0);
	size_t wire = sizeof(m[0]) + 16;
	uint8_t *buf = malloc(wire);
	cr_assert_eq(recv(sp[1], buf, wire, MSG_WAITALL), (ssize_t)wire);
	cr_assert_neq(memcmp(buf, &m[0], sizeof(m[0])), 0, "sent in the clear");
	/* Replay of an earlier message (its counter is behind): refused. */
	cr_assert_eq(send(cl.fd, buf, wire, 0), (ssize_t)wire);
	cr_assert_eq(send(cl.fd, buf, wire, 0), (ssize_t)wire);
	cr_assert_eq(px_auth_recv(sv.a, sv.fd, &m[1], sizeof(m[1])), 0); /* first copy: in order */
	cr_assert_eq(px_auth_recv(sv.a, sv.fd, &m[1], sizeof(m[1])), -EBADMSG);
	/* One flipped bit: refused. */
	struct side cl2 = {.dir = c}, sv2 = {.dir = s};
	exchange(&cl2, &sv2);
	cr_assert_eq(cl2.rc, 0, "%s", cl2.err);
	cr_assert_eq(px_auth_send(cl2.a, sp[0], &m[0], sizeof(m[0])), 0);
	cr_assert_eq(recv(sp[1], buf, wire, MSG_WAITALL), (ssize_t)wire);
	buf[100] ^= 1;
	cr_assert_eq(send(cl2.fd, buf, wire, 0), (ssize_t)wire);
	cr_assert_eq(px_auth_recv(sv2.a, sv2.fd, &m[1], sizeof(m[1])), -EBADMSG);
	free(buf);
	free(m);
	close(sp[0]);
	close(sp[1]);
	for (struct side *x = &cl; x; x = x == &cl ? &sv : x == &sv ? &cl2 : x == &cl2 ? &sv2 : NULL) {
		px_auth_free(x->a);
		close(x->fd);
	}
}

/* Read `name = "Z85"` from a zcert file. */
static void cert_field(const char *path, const char *name, char z[41])
{
	FILE *f = fopen(path, "r");
	cr_assert(f, "%s", path);
	char line[256];
	z[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, name);
		if (p && (p = strchr(p, '"'))) {
			memcpy(z, p + 1, 40);
			z[40] = 0;
		}
	}
	fclose(f);
	cr_assert_eq(strlen(z), 40, "%s in %s", name, path);
}

Test(bench_perf_bw_auth, a_listed_public_key_without_its_secret_key_fails_confirmation, .init = setup,
     .fini = teardown)
{
	char s[128], c[128], x[128], path[256], pub[41], sec[41];
	pair_dirs(s, c, sizeof(s));
	keygen("impostor", x, sizeof(x));
	allow(s, x, "server");
	/* The impostor presents the listed client's public key with its own secret key. */
	snprintf(path, sizeof(path), "%s/engine.key", c);
	cert_field(path, "public-key", pub);
	snprintf(path, sizeof(path), "%s/engine.key_secret", x);
	cert_field(path, "secret-key", sec);
	FILE *f = fopen(path, "w");
	cr_assert(f);
	fprintf(f, "metadata\ncurve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n", pub, sec);
	fclose(f);
	struct side cl = {.dir = x}, sv = {.dir = s};
	exchange(&cl, &sv);
	cr_assert_eq(sv.rc, -EBADMSG, "%d %s", sv.rc, sv.err);
	cr_assert(strstr(sv.err, "failed key confirmation"), "%s", sv.err);
	cr_assert_neq(cl.rc, 0);
	px_auth_free(cl.a);
	px_auth_free(sv.a);
	close(cl.fd);
	close(sv.fd);
}
