/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf trace --server (two hosts): serve runs for --client drivers, one fresh process per
 * run; agree on the options first (SETUP), size the pool from the client's trace, print each
 * run's results and exit 1 if one failed (docs/operations.md §2).
 */
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/common.h"
#include "kvxfer/control.h"
#include "px_auth.h"
#include "models.h"
#include "perf_trace_internal.h"
#include "perf_util.h"
#include "trace_net.h"
#include "trace_replay.h"

/*
 * --server, one run on an accepted driver connection (in a child process): agree on the options
 * (SETUP), size the pool from the client's trace unless --pool-blocks was given, then run the
 * producer. Returns the run's exit code (the driver's RESULT), 1 if it failed here, 2 if the
 * options disagree.
 */
static int serve_one(struct trace_opts *o, int fd)
{
	o->role = TRACE_ROLE_PRODUCER;
	struct trace_msg_hdr h;
	void *p = NULL;
	int rc = trace_msg_recv(fd, &h, &p);
	const struct trace_msg_setup *su = p;
	if (rc || h.type != TRACE_MSG_SETUP || h.len != sizeof(*su) || su->magic != TRACE_MSG_MAGIC) {
		fprintf(stderr, "kvxfer-perf trace --server: the connection is not a kvxfer-perf trace "
				"--client of this version (%s)\n", rc ? kvx_strerror(rc) : "bad first message");
		free(p);
		return 1;
	}
	static struct trace_msg_setup keep; /* strings below point into it */
	keep = *su;
	free(p);
	su = &keep;
	keep.model[sizeof(keep.model) - 1] = keep.transport[sizeof(keep.transport) - 1] = '\0';
	keep.version[sizeof(keep.version) - 1] = keep.commit[sizeof(keep.commit) - 1] = '\0';
	if (strcmp(su->commit, perf_commit()))
		fprintf(stderr, "kvxfer-perf trace --server: warning: the client is kvxfer-perf %s (commit %s), "
				"this server %s (commit %s)\n", su->version, su->commit, perf_version(),
			perf_commit());
	/* Options given to --server must match the client's; the others are taken from it. */
	char bad[1024] = "";
	size_t bl = 0;
#define MISMATCH(bit, cond, ...)                                                                        \
	do {                                                                                            \
		if ((o->set & (bit)) && (cond) && bl < sizeof(bad))                                    \
			bl += (size_t)snprintf(bad + bl, sizeof(bad) - bl, __VA_ARGS__);               \
	} while (0)
	MISMATCH(TRACE_SET_MODEL, strcmp(o->model, su->model), " --model (server %s, client %s)", o->model,
		 su->model);
	MISMATCH(TRACE_SET_BLOCK, o->block_tokens != su->block_tokens, " --block-size (server %u, client %u)",
		 o->block_tokens, su->block_tokens);
	MISMATCH(TRACE_SET_MODE, o->write_mode != (su->write_mode != 0), " -m (server %s, client %s)",
		 o->write_mode ? "write" : "read", su->write_mode ? "write" : "read");
	MISMATCH(TRACE_SET_TRANSPORT, strcmp(o->transport, su->transport), " -t (server %s, client %s)",
		 o->transport, su->transport);
	MISMATCH(TRACE_SET_TIMEOUT, o->timeout_ms != su->timeout_ms, " --timeout-ms (server %u, client %u)",
		 o->timeout_ms, su->timeout_ms);
#undef MISMATCH
	if (bad[0]) {
		char msg[1400];
		snprintf(msg, sizeof(msg), "--server and --client disagree on:%s; give both the same values, or "
					   "leave them off the --server command (it takes the client's)", bad);
		fprintf(stderr, "kvxfer-perf trace --server: %s\n", msg);
		trace_msg_send(fd, TRACE_MSG_REFUSED, msg, strlen(msg) + 1, NULL, 0);
		return 2;
	}
	o->model = su->model;
	o->block_tokens = su->block_tokens;
	o->write_mode = su->write_mode != 0;
	o->transport = su->transport;
	o->timeout_ms = su->timeout_ms;
	o->layer_us = su->layer_us;
	o->concurrency = su->concurrency;
	o->verify = su->verify ? 1 : 0;
	o->max_blocks = (uint32_t)su->max_blocks;
	struct perf_model m;
	char err[512];
	if (perf_model_find(o->models_csv, o->model, &m, err, sizeof(err))) {
		char msg[600];
		snprintf(msg, sizeof(msg), "--server: --model %s: %s", o->model, err);
		trace_msg_send(fd, TRACE_MSG_REFUSED, msg, strlen(msg) + 1, NULL, 0);
		fprintf(stderr, "kvxfer-perf trace %s\n", msg);
		return 2;
	}
	uint64_t bb = perf_model_block_bytes(&m, o->block_tokens);
	if (!(o->set & TRACE_SET_POOL))
		o->pool_blocks = su->pool_blocks; /* sized from the client's trace */
	if (trace_check_pool_fits(o, o->pool_blocks, bb, 1)) {
		const char *msg = "--server: the pool does not fit this host's memory (see the server's output)";
		trace_msg_send(fd, TRACE_MSG_REFUSED, msg, strlen(msg) + 1, NULL, 0);
		return 2;
	}
	/* Default --host: the address of this host that the client reached. */
	static char myaddr[64];
	if (!(o->set & TRACE_SET_HOST) && !trace_net_local_addr(fd, myaddr, sizeof(myaddr)))
		o->host = myaddr;
	return trace_role_main(o, fd);
}

int trace_auth_check(const char *dir)
{
	uint8_t pk[32], sk[32];
	int rc = kvx_ctl_auth_keypair(dir, pk, sk);
	explicit_bzero(sk, sizeof(sk));
	if (!rc)
		return 0;
	fprintf(stderr, "kvxfer-perf trace: --auth-dir %s: no usable key pair (%s); create one with "
			"`kvxfer-perf keygen DIR`\n", dir, kvx_strerror(rc));
	return 2;
}

int trace_run_server(struct trace_opts *o)
{
	struct perf_model m;
	char err[512];
	if ((o->set & TRACE_SET_MODEL) && perf_model_find(o->models_csv, o->model, &m, err, sizeof(err))) {
		fprintf(stderr, "kvxfer-perf trace: --model: %s\n", err);
		return 2;
	}
	if (o->set & TRACE_SET_POOL) {
		if (!(o->set & TRACE_SET_MODEL) && perf_model_find(o->models_csv, o->model, &m, err, sizeof(err))) {
			fprintf(stderr, "kvxfer-perf trace: --model: %s\n", err);
			return 2;
		}
		if (trace_check_pool_fits(o, o->pool_blocks, perf_model_block_bytes(&m, o->block_tokens), 1))
			return 2;
	}
	if ((o->lcores || o->control_lcore != UINT32_MAX) && trace_check_role_lcores(o, o->lcores, "producer"))
		return 2;
	if (o->auth_dir && trace_auth_check(o->auth_dir))
		return 2;
	int ls = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1, zero = 0;
	struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_port = htons(o->port), .sin6_addr = in6addr_any};
	if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) ||
	    bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1)) {
		fprintf(stderr, "kvxfer-perf trace: --server: cannot listen on port %u: %s\n", o->port,
			strerror(errno));
		if (ls >= 0)
			close(ls);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	unsigned failed = 0, refused = 0;
	for (uint32_t run = 1; o->runs == 0 || run <= o->runs; run++) {
		char of[32] = ", until stopped";
		if (o->runs)
			snprintf(of, sizeof(of), " of %u", o->runs);
		fprintf(stderr, "kvxfer-perf trace: producer waiting for a --client driver on port %u (run %u%s)\n",
			o->port, run, of);
		int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR) {
				run--;
				continue;
			}
			perror("kvxfer-perf trace: accept");
			close(ls);
			return 1;
		}
		/* --auth-dir: the driver connection proves the client's key and is sealed; a refused
		 * one is logged, counted and closed, and does not use up a run. */
		struct px_auth *pa = NULL;
		if (o->auth_dir) {
			char who[64] = "", aerr[400] = "";
			if (px_auth_server(fd, o->auth_dir, TRACE_AUTH_TIMEOUT_NS, &pa, who, sizeof(who), aerr,
					   sizeof(aerr))) {
				struct sockaddr_in6 pa6;
				socklen_t pl = sizeof(pa6);
				char addr[INET6_ADDRSTRLEN] = "?";
				if (!getpeername(fd, (struct sockaddr *)&pa6, &pl))
					inet_ntop(AF_INET6, &pa6.sin6_addr, addr, sizeof(addr));
				fprintf(stderr, "kvxfer-perf trace --server: refused a --client from %s: %s (%u refused "
						"so far; still listening)\n", addr, aerr, ++refused);
				close(fd);
				run--;
				continue;
			}
			fprintf(stderr, "kvxfer-perf trace --server: --client authenticated (key %s.key)\n", who);
			trace_wire_seal(fd, pa);
		}
		/* A fresh process per run: its engine, pool and options start clean. */
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0) {
			perror("kvxfer-perf trace: fork");
			close(fd);
			close(ls);
			return 1;
		}
		if (pid == 0) {
			close(ls);
			int rc = serve_one(o, fd);
			close(fd);
			fflush(NULL);
			_exit(rc);
		}
		close(fd);
		trace_wire_seal(fd, NULL); /* the child has its own copy */
		px_auth_free(pa);
		int st = 0;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		if (rc)
			failed++;
		printf("kvxfer-perf trace --server: run %u %s (exit %d)\n", run, rc ? "FAILED" : "OK", rc);
		fflush(stdout);
	}
	close(ls);
	return failed ? 1 : 0;
}
