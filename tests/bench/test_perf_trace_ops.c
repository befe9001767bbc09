/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf trace, what an operator relies on (real processes, real engines over tcp/shm):
 * requests larger than the pool are streamed in pieces or skipped (--oversize), the summary
 * counts only what was transferred when requests fail or a role is killed, and the JSON carries
 * a header (version, commit, host, time, options) and null, never -1, for what did not happen.
 */
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <jansson.h>
#include <stdio.h>

#include "helpers.h"
#include "perf_run.h"

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_trace_ops, .timeout = 600.0);

/* A 4-layer split K/V model (2 KV heads x 8, bf16). */
#define MODELS "model,num_layers,num_kv_heads,head_dim,mla_latent_dim,attention_chunk_size,source," \
	       "bytes_per_token_per_layer_bf16,kv_bytes_per_block16_all_layers_bf16\n"          \
	       "Tiny-GQA,4,2,8,,,test,64,4096\n"
/* 63, 44, 94, 63 and 3 blocks of 16 tokens (267 in all). */
#define TRACE "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" \
	      "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3]}\n"  \
	      "{\"timestamp\": 5, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [1, 4, 5]}\n" \
	      "{\"timestamp\": 9, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" \
	      "{\"timestamp\": 9, \"input_length\": 33, \"output_length\": 5, \"hash_ids\": [9]}\n"

static char g_models[64], g_trace[64];
static struct perf_run g_r;

static void setup(void)
{
	tmpfile_with(g_models, sizeof(g_models), ".csv", MODELS);
	tmpfile_with(g_trace, sizeof(g_trace), ".jsonl", TRACE);
}

static void teardown(void)
{
	unlink(g_models);
	unlink(g_trace);
}

#define TRACE_RUN(...)                                                                         \
	do {                                                                                   \
		const char *const a_[] = {"trace", "--local", "--models-csv", g_models, "--model", \
					  "Tiny-GQA", "--quiet", __VA_ARGS__, NULL};           \
		perf_run(&g_r, KVX_PERF_BIN, NULL, 300000, a_);                                \
	} while (0)

static void expect_streamed(const char *mode, const char *transport)
{
	/* Pool 50: requests of 63, 94 and 63 blocks go in pieces of at most 50. */
	TRACE_RUN("--trace", g_trace, "-m", mode, "-t", transport, "--speed", "0", "--pool-blocks", "50");
	cr_assert_eq(g_r.status, 0, "exit %d\n%s\n%s", g_r.status, g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "requests               5 (5 completed)"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "blocks                 267 (prefix hits 0, transferred 267)\n"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "larger than the pool   0 skipped, 3 streamed in pool-sized pieces\n"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "verification           OK"), "%s", g_r.out);
	/* 267 blocks x 4096 bytes, every piece counted once. */
	cr_assert(strstr(g_r.out, "bytes                  1093632 "), "%s", g_r.out);
}

Test(bench_perf_trace_ops, oversize_requests_stream_through_the_pool_write_tcp, .init = setup, .fini = teardown)
{
	expect_streamed("write", "tcp");
}

Test(bench_perf_trace_ops, oversize_requests_stream_through_the_pool_read_shm, .init = setup, .fini = teardown)
{
	expect_streamed("read", "shm");
}

Test(bench_perf_trace_ops, oversize_skip_leaves_requests_out_and_names_them, .init = setup, .fini = teardown)
{
	TRACE_RUN("--trace", g_trace, "-t", "tcp", "--speed", "0", "--pool-blocks", "50", "--oversize", "skip");
	cr_assert_eq(g_r.status, 0, "exit %d\n%s\n%s", g_r.status, g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "requests               2 (2 completed)"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "blocks                 47 (prefix hits 0, transferred 47)\n"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "larger than the pool   3 skipped, 0 streamed"), "%s", g_r.out);
	for (int line = 1; line <= 4; line++) {
		char want[96];
		snprintf(want, sizeof(want), ":%d: %d blocks, more than the pool's 50 (--oversize skip)", line,
			 line == 1 || line == 4 ? 63 : 94);
		if (line == 2)
			cr_assert_null(strstr(g_r.err, ":2: "), "%s", g_r.err);
		else
			cr_assert(strstr(g_r.err, want), "want '%s' in\n%s", want, g_r.err);
	}
	TRACE_RUN("--trace", g_trace, "-t", "tcp", "--pool-blocks", "2", "--oversize", "skip");
	cr_assert_eq(g_r.status, 2, "every request skipped: exit %d\n%s", g_r.status, g_r.err);
}

/* Read @p path as JSON (and remove it). */
static json_t *load_json(const char *path)
{
	json_error_t je;
	json_t *root = json_load_file(path, 0, &je);
	cr_assert(root, "%s: %s (line %d)", path, je.text, je.line);
	unlink(path);
	return root;
}

/* No number in the document is negative except request "status" (a negative errno). */
static void expect_no_negative_sentinels(json_t *v, const char *key)
{
	if (json_is_object(v)) {
		const char *k;
		json_t *x;
		json_object_foreach(v, k, x)
			expect_no_negative_sentinels(x, k);
	} else if (json_is_array(v)) {
		size_t i;
		json_t *x;
		json_array_foreach(v, i, x)
			expect_no_negative_sentinels(x, key);
	} else if (json_is_number(v) && strcmp(key, "status")) {
		cr_assert_geq(json_number_value(v), 0, "'%s' is %g: a sentinel where null belongs", key,
			      json_number_value(v));
	}
}

Test(bench_perf_trace_ops, json_has_a_header_and_null_for_what_did_not_happen, .init = setup, .fini = teardown)
{
	/* A 1 ms deadline: the transfer times out, nothing completes. */
	char js[] = "/tmp/kvx_trace_ops_XXXXXX.json";
	int fd = mkstemps(js, 5);
	cr_assert_geq(fd, 0);
	close(fd);
	TRACE_RUN("--trace", g_trace, "-t", "tcp", "--requests", "1", "--speed", "0", "--timeout-ms", "1",
		  "--json", js);
	cr_assert_eq(g_r.status, 1, "exit %d\n%s", g_r.status, g_r.err);
	json_t *root = load_json(js);
	json_t *h = json_object_get(root, "kvxfer_perf");
	cr_assert(json_is_object(h));
	cr_assert_str_eq(json_string_value(json_object_get(root, "command")), "trace");
	cr_assert_str_eq(json_string_value(json_object_get(h, "version")), KVX_PROJECT_VERSION);
	cr_assert(json_string_length(json_object_get(h, "commit")) > 0);
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);
	cr_assert_str_eq(json_string_value(json_object_get(h, "host")), host);
	const char *t = json_string_value(json_object_get(h, "time"));
	int y, mo, d, hh, mi, ss;
	cr_assert(t && sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2dZ", &y, &mo, &d, &hh, &mi, &ss) == 6, "time %s", t);
	json_t *opts = json_object_get(h, "options");
	cr_assert(json_is_array(opts));
	bool seen = false;
	for (size_t i = 0; i + 1 < json_array_size(opts); i++)
		if (!strcmp(json_string_value(json_array_get(opts, i)), "--timeout-ms") &&
		    !strcmp(json_string_value(json_array_get(opts, i + 1)), "1"))
			seen = true;
	cr_assert(seen, "options lack --timeout-ms 1");
	json_t *req = json_array_get(json_object_get(root, "requests"), 0);
	cr_assert(json_is_null(json_object_get(req, "end_ms")));
	cr_assert(json_is_null(json_object_get(req, "first_layer_ms")));
	json_t *sum = json_object_get(root, "summary");
	cr_assert(json_is_null(json_object_get(sum, "latency_ms")));
	cr_assert(json_is_null(json_object_get(sum, "throughput_gbps")));
	/* The failed request's 63 blocks were not transferred. */
	cr_assert_eq(json_integer_value(json_object_get(sum, "xfer_blocks")), 0);
	cr_assert_eq(json_integer_value(json_object_get(sum, "lost_blocks")), 63);
	expect_no_negative_sentinels(root, "");
	json_decref(root);
	cr_assert(strstr(g_r.out, "blocks                 63 (prefix hits 0, transferred 0, not transferred 63 "
				  "(failed requests))\n"), "%s", g_r.out);
}

/* The pid of the driver's child running `--role consumer`, or 0. */
static pid_t consumer_of(pid_t driver)
{
	DIR *dir = opendir("/proc");
	cr_assert_not_null(dir);
	pid_t found = 0;
	for (struct dirent *e; (e = readdir(dir)) && !found;) {
		pid_t pid = (pid_t)atoi(e->d_name);
		if (pid <= 0)
			continue;
		char path[64], buf[4096];
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		int ppid = 0;
		char *rp = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
		fclose(f);
		if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid != driver)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
		f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		for (size_t i = 0; i + 1 < n; i++)
			if (!buf[i])
				buf[i] = ' ';
		buf[n] = '\0';
		if (strstr(buf, "--role consumer"))
			found = pid;
	}
	closedir(dir);
	return found;
}

Test(bench_perf_trace_ops, killed_consumer_counts_only_what_was_transferred, .init = setup, .fini = teardown)
{
	/* Request 1 (63 blocks) at once, request 2 (44 blocks) ten minutes later: kill the consumer
	 * while the driver waits for the second arrival. */
	char tr[64];
	tmpfile_with(tr, sizeof(tr), ".jsonl",
		     "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"
		     "{\"timestamp\": 600000, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3]}\n");
	const char *const a[] = {"trace", "--local", "--models-csv", g_models, "--model", "Tiny-GQA",
				 "--trace", tr, "-t", "tcp", "--pool-blocks", "128", NULL};
	struct perf_child ch;
	memset(&g_r, 0, sizeof(g_r));
	perf_run_start(&ch, KVX_PERF_BIN, NULL, a);
	/* The progress line (stderr) says the first request is done. */
	uint64_t end = perf_run_now_ms() + 300000;
	while (!strstr(g_r.err, "progress: 1/2 requests")) {
		cr_assert_lt(perf_run_now_ms(), end, "no progress:\n%s", g_r.err);
		struct pollfd pf = {.fd = ch.fd_err, .events = POLLIN};
		cr_assert_geq(poll(&pf, 1, 1000), 0);
		if (pf.revents) {
			ssize_t n = read(ch.fd_err, g_r.err + g_r.err_len, sizeof(g_r.err) - 1 - g_r.err_len);
			cr_assert_gt(n, 0, "driver closed stderr:\n%s", g_r.err);
			g_r.err_len += (size_t)n;
			g_r.err[g_r.err_len] = '\0';
		}
	}
	pid_t c = consumer_of(ch.pid);
	cr_assert_gt(c, 0, "no consumer child of %d", (int)ch.pid);
	cr_assert_eq(kill(c, SIGKILL), 0);
	cr_assert(perf_run_read(&ch, &g_r, 120000, NULL));
	unlink(tr);
	cr_assert_eq(g_r.status, 1, "exit %d\n%s\n%s", g_r.status, g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "requests               2 (1 completed)"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "blocks                 107 (prefix hits 0, transferred 63, not transferred 44 "),
		  "%s", g_r.out);
	cr_assert(strstr(g_r.out, "failures               1\n"), "%s", g_r.out);
	/* The producer still reports its side; the consumer's is named as missing. */
	const char *cm = strstr(g_r.out, "control messages       sent ");
	cr_assert(cm, "%s", g_r.out);
	cr_assert(strstr(cm, "(producer only: the consumer process did not report"), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "lcore util             producer "), "%s", g_r.out);
	cr_assert(strstr(g_r.out, "consumer n/a"), "%s", g_r.out);
}

/* ---- two hosts, on loopback: --server / --client ---- */

/* Start `trace --server --port PORT ARGS...` and wait until it listens. */
static void start_server(struct perf_child *ch, struct perf_run *srv, char *port, size_t plen,
			 const char *const *extra)
{
	snprintf(port, plen, "%u", perf_run_closed_port());
	const char *a[32] = {"trace", "--server", "--port", port, "--models-csv", g_models};
	int k = 6;
	for (int i = 0; extra && extra[i] && k < 30; i++)
		a[k++] = extra[i];
	a[k] = NULL;
	memset(srv, 0, sizeof(*srv));
	perf_run_start(ch, KVX_PERF_BIN, NULL, a);
	cr_assert_not(perf_run_read(ch, srv, 60000, "waiting for a --client driver"), "server exited:\n%s",
		      srv->err);
}

static struct perf_run g_srv;

Test(bench_perf_trace_ops, server_serves_several_runs_reports_each_and_fails_if_one_failed, .init = setup,
     .fini = teardown)
{
	struct perf_child ch;
	char port[16];
	const char *const ex[] = {"--runs", "2", NULL};
	start_server(&ch, &g_srv, port, sizeof(port), ex);
	/* Run 1 succeeds; the server takes model, mode, transport from the client. */
	{
		const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
					 "--model", "Tiny-GQA", "--trace", g_trace, "-t", "tcp", "-m", "read",
					 "--speed", "0", "--quiet", NULL};
		perf_run(&g_r, KVX_PERF_BIN, NULL, 300000, a);
	}
	cr_assert_eq(g_r.status, 0, "client 1: %d\n%s\n%s", g_r.status, g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "requests               5 (5 completed)"), "%s", g_r.out);
	/* Wait for the server to finish run 1 and listen again. */
	cr_assert_not(perf_run_read(&ch, &g_srv, 120000, "(run 2 of 2)"), "server exited:\n%s", g_srv.err);
	/* Run 2 times out (1 ms deadline): the server must say so and exit 1. */
	{
		const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
					 "--model", "Tiny-GQA", "--trace", g_trace, "-t", "tcp", "--requests", "1",
					 "--timeout-ms", "1", "--quiet", NULL};
		perf_run(&g_r, KVX_PERF_BIN, NULL, 300000, a);
	}
	cr_assert_eq(g_r.status, 1, "client 2: %d\n%s", g_r.status, g_r.err);
	cr_assert(perf_run_read(&ch, &g_srv, 120000, NULL));
	cr_assert_eq(g_srv.status, 1, "server exit %d\n%s\n%s", g_srv.status, g_srv.out, g_srv.err);
	/* Both runs' results, as the client printed them, and a verdict per run. */
	cr_assert(strstr(g_srv.out, "== kvxfer-perf trace: READ mode, transport tcp =="), "%s", g_srv.out);
	cr_assert(strstr(g_srv.out, "requests               5 (5 completed)"), "%s", g_srv.out);
	cr_assert(strstr(g_srv.out, "run 1 OK (exit 0)"), "%s", g_srv.out);
	cr_assert(strstr(g_srv.out, "failed transfers       tx-000000 (timed out)"), "%s", g_srv.out);
	cr_assert(strstr(g_srv.out, "run 2 FAILED (exit 1)"), "%s", g_srv.out);
	/* The server's pool came from the client's trace (largest request 94 blocks + 25%). */
	cr_assert(strstr(g_srv.out, "pool                   118 blocks per side"), "%s", g_srv.out);
}

Test(bench_perf_trace_ops, server_refuses_options_that_differ_and_names_them, .init = setup, .fini = teardown)
{
	struct perf_child ch;
	char port[16];
	const char *const ex[] = {"-m", "read", "--block-size", "32", "--model", "Tiny-GQA", NULL};
	start_server(&ch, &g_srv, port, sizeof(port), ex);
	const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
				 "--model", "Tiny-GQA", "--trace", g_trace, "-m", "write", "--quiet", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, a);
	/* Options that must match and do not: a usage error (2) on the client, as on the server's run. */
	cr_assert_eq(g_r.status, 2, "%d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "the --server refused this run: "), "%s", g_r.err);
	cr_assert(strstr(g_r.err, "disagree on: --block-size (server 32, client 16) -m (server read, client write)"),
		  "%s", g_r.err);
	cr_assert(perf_run_read(&ch, &g_srv, 60000, NULL));
	cr_assert_eq(g_srv.status, 1, "server exit %d\n%s", g_srv.status, g_srv.err);
	cr_assert(strstr(g_srv.out, "run 1 FAILED (exit 2)"), "%s", g_srv.out);
}

Test(bench_perf_trace_ops, client_names_the_server_it_cannot_reach, .init = setup, .fini = teardown)
{
	char port[16];
	snprintf(port, sizeof(port), "%u", perf_run_closed_port());
	const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
				 "--model", "Tiny-GQA", "--trace", g_trace, "--quiet", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, a);
	cr_assert_eq(g_r.status, 1, "%d\n%s", g_r.status, g_r.err);
	char want[96];
	snprintf(want, sizeof(want), "cannot reach the --server's driver channel (--port) at 127.0.0.1:%s: ", port);
	cr_assert(strstr(g_r.err, want), "%s", g_r.err);
}

Test(bench_perf_trace_ops, port_range_fixes_the_listener_ports, .init = setup, .fini = teardown)
{
	/* Six free ports in a row, then the second (the producer's notify port) taken: the run
	 * must fail naming it, which shows the range is where the engine binds. */
	unsigned base = 0;
	int hold = -1;
	for (unsigned cand = 10000 + (unsigned)(getpid() % 20000); !base && cand < 60000; cand += 7) { /* from below the ephemeral range */
		int fds[6], ok = 1;
		for (int i = 0; i < 6; i++) {
			fds[i] = socket(AF_INET, SOCK_STREAM, 0);
			int one = 1;
			setsockopt(fds[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
			struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(cand + i))};
			if (bind(fds[i], (struct sockaddr *)&sa, sizeof(sa)))
				ok = 0;
		}
		for (int i = 0; i < 6; i++)
			if (!(ok && i == 1))
				close(fds[i]);
		if (ok) {
			base = cand;
			hold = fds[1];
			cr_assert_eq(listen(hold, 1), 0);
		}
	}
	cr_assert_gt(base, 0);
	char range[32], busy[16];
	snprintf(range, sizeof(range), "%u-%u", base, base + 5);
	snprintf(busy, sizeof(busy), "%u", base + 1);
	TRACE_RUN("--trace", g_trace, "-t", "tcp", "--requests", "1", "--port-range", range);
	close(hold);
	cr_assert_neq(g_r.status, 0, "%s", g_r.err);
	cr_assert(strstr(g_r.err, busy), "the taken port %s is not named:\n%s", busy, g_r.err);
	/* Free again: the same range works. */
	TRACE_RUN("--trace", g_trace, "-t", "tcp", "--requests", "1", "--speed", "0", "--port-range", range);
	cr_assert_eq(g_r.status, 0, "%d\n%s", g_r.status, g_r.err);
	/* --local needs six ports. */
	snprintf(range, sizeof(range), "%u-%u", base, base + 4);
	TRACE_RUN("--trace", g_trace, "--port-range", range);
	cr_assert_eq(g_r.status, 2, "%d\n%s", g_r.status, g_r.err);
}

/* ---- --metrics ---- */

/* Value of one sample line in a scrape of @p url (curl), or -1 (absent or unreachable). */
static double scrape_value(const char *url, const char *series)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "curl -sS --max-time 20 %s 2>/dev/null", url);
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	static char body[1 << 20];
	size_t n = fread(body, 1, sizeof(body) - 1, f);
	body[n] = '\0';
	pclose(f);
	size_t l = strlen(series);
	for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, series, l) && p[l] == ' ')
			return strtod(p + l + 1, NULL);
	return -1;
}

/* The URL printed for @p who ("producer"/"consumer") in @p err, into @p url. */
static bool metrics_url(const char *err, const char *who, char *url, size_t len)
{
	char key[64];
	snprintf(key, sizeof(key), "%s metrics at ", who);
	const char *p = strstr(err, key);
	if (!p)
		return false;
	p += strlen(key);
	size_t l = strcspn(p, "\n");
	if (!p[l] || l >= len)
		return false;
	memcpy(url, p, l);
	url[l] = '\0';
	return true;
}

Test(bench_perf_trace_ops, metrics_endpoint_serves_the_engines_counters_during_a_run, .init = setup,
     .fini = teardown)
{
	if (system("command -v curl >/dev/null 2>&1"))
		cr_skip_test("curl is not installed (scripts/install-deps.sh installs it)");
	char tr[64];
	tmpfile_with(tr, sizeof(tr), ".jsonl",
		     "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"
		     "{\"timestamp\": 600000, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3]}\n");
	const char *const a[] = {"trace", "--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", tr,
				 "-t", "tcp", "--pool-blocks", "128", "--metrics", "127.0.0.1:0", NULL};
	struct perf_child ch;
	memset(&g_r, 0, sizeof(g_r));
	perf_run_start(&ch, KVX_PERF_BIN, NULL, a);
	cr_assert_not(perf_run_read(&ch, &g_r, 300000, "progress: 1/2 requests"), "exited:\n%s", g_r.err);
	char pu[128], cu[128];
	cr_assert(metrics_url(g_r.err, "producer", pu, sizeof(pu)), "%s", g_r.err);
	cr_assert(metrics_url(g_r.err, "consumer", cu, sizeof(cu)), "%s", g_r.err);
	/* Request 1 is done on both sides; the snapshots follow within the roles' next polls. */
	uint64_t end = perf_run_now_ms() + 60000;
	double pd = -1, cd = -1;
	while ((pd != 1 || cd != 1) && perf_run_now_ms() < end) {
		pd = scrape_value(pu, "kvxfer_transfers_total{outcome=\"done\"}");
		cd = scrape_value(cu, "kvxfer_transfers_total{outcome=\"done\"}");
	}
	cr_assert_eq(pd, 1, "producer %s", pu);
	cr_assert_eq(cd, 1, "consumer %s", cu);
	/* WRITE: the producer posted the 63 blocks of 4096 bytes (4 layers x 2 planes x 512). */
	cr_assert_eq(scrape_value(pu, "kvxfer_bytes_total"), 63.0 * 4096);
	cr_assert_eq(scrape_value(pu, "kvxfer_transfers_in_flight"), 0);
	cr_assert_eq(scrape_value(cu, "kvxfer_transfer_duration_seconds_count{outcome=\"done\"}"), 1);
	/* WRITE: the producer moved the layers (first-layer sample), the consumer sent remote_blocks,
	 * the producer write_done. */
	cr_assert_eq(scrape_value(pu, "kvxfer_first_layer_seconds_count"), 1);
	cr_assert_geq(scrape_value(cu, "kvxfer_control_messages_total{direction=\"sent\",type=\"remote_blocks\"}"), 1);
	cr_assert_geq(scrape_value(pu, "kvxfer_control_messages_total{direction=\"received\",type=\"remote_blocks\"}"),
		      1);
	cr_assert_geq(scrape_value(pu, "kvxfer_control_messages_total{direction=\"sent\",type=\"write_done\"}"), 1);
	/* End the run: the consumer goes away, the driver reports and exits 1. */
	pid_t c = consumer_of(ch.pid);
	cr_assert_gt(c, 0);
	cr_assert_eq(kill(c, SIGKILL), 0);
	cr_assert(perf_run_read(&ch, &g_r, 120000, NULL));
	unlink(tr);
	cr_assert_eq(g_r.status, 1);
}

/* Fresh auth directories made with `kvxfer-perf keygen` under /tmp (removed by the test). */
static void auth_dirs(char *root, size_t rl, char *s, char *c, char *x, size_t len)
{
	snprintf(root, rl, "/tmp/kvx_trace_auth.XXXXXX");
	cr_assert(mkdtemp(root));
	char *d[3] = {s, c, x};
	const char *n[3] = {"server", "client", "stranger"};
	for (int i = 0; i < 3; i++) {
		snprintf(d[i], len, "%s/%s", root, n[i]);
		const char *const a[] = {"keygen", d[i], NULL};
		perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, a);
		cr_assert_eq(g_r.status, 0, "%s", g_r.err);
	}
	char cmd[1024];
	snprintf(cmd, sizeof(cmd),
		 "cp %s/engine.key %s/allowed/client.key && cp %s/engine.key %s/allowed/server.key && "
		 "cp %s/engine.key %s/allowed/server.key",
		 c, s, s, c, s, x);
	cr_assert_eq(system(cmd), 0);
}

Test(bench_perf_trace_ops, auth_dir_server_refuses_plain_and_unlisted_clients_then_runs_authenticated,
     .init = setup, .fini = teardown)
{
	char root[64], s[128], c[128], x[128], port[16];
	auth_dirs(root, sizeof(root), s, c, x, sizeof(s));
	struct perf_child ch;
	const char *const ex[] = {"--auth-dir", s, NULL};
	start_server(&ch, &g_srv, port, sizeof(port), ex);
	/* A client without --auth-dir: refused at the driver channel, told what to do. */
	{
		const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
					 "--model", "Tiny-GQA", "--trace", g_trace, "-t", "tcp", "--quiet", NULL};
		perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, a);
	}
	cr_assert_eq(g_r.status, 1, "%d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "if the --server runs with --auth-dir, give --auth-dir here too"), "%s", g_r.err);
	cr_assert_not(perf_run_read(&ch, &g_srv, 60000, "(1 refused so far; still listening)"), "%s", g_srv.err);
	/* A key the server does not list. */
	{
		const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
					 "--model", "Tiny-GQA", "--trace", g_trace, "-t", "tcp", "--quiet", "--auth-dir", x,
					 NULL};
		perf_run(&g_r, KVX_PERF_BIN, NULL, 120000, a);
	}
	cr_assert_eq(g_r.status, 1, "%d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "--client: the server closed the connection during authentication"), "%s", g_r.err);
	cr_assert_not(perf_run_read(&ch, &g_srv, 60000, "(2 refused so far; still listening)"), "%s", g_srv.err);
	cr_assert(strstr(g_srv.err, "is not in "), "%s", g_srv.err);
	/* The listed client: driver channel sealed, engines on CURVE, every block verified; the
	 * refused clients did not use up the server's one run. */
	{
		const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", port, "--models-csv", g_models,
					 "--model", "Tiny-GQA", "--trace", g_trace, "-t", "tcp", "--speed", "0", "--verify",
					 "--quiet", "--auth-dir", c, NULL};
		perf_run(&g_r, KVX_PERF_BIN, NULL, 300000, a);
	}
	cr_assert_eq(g_r.status, 0, "%d\n%s\n%s", g_r.status, g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "verification           OK"), "%s", g_r.out);
	cr_assert(perf_run_read(&ch, &g_srv, 120000, NULL));
	cr_assert_eq(g_srv.status, 0, "%s\n%s", g_srv.out, g_srv.err);
	cr_assert(strstr(g_srv.err, "--client authenticated (key client.key)"), "%s", g_srv.err);
	cr_assert(strstr(g_srv.out, "run 1 OK (exit 0)"), "%s", g_srv.out);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	cr_assert_eq(system(cmd), 0);
}

Test(bench_perf_trace_ops, auth_dir_without_key_pair_is_a_usage_error, .init = setup, .fini = teardown)
{
	const char *const a[] = {"trace", "--client", "127.0.0.1", "--port", "1", "--models-csv", g_models, "--model",
				 "Tiny-GQA", "--trace", g_trace, "--auth-dir", "/nonexistent/kvx", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, a);
	cr_assert_eq(g_r.status, 2, "%d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "--auth-dir /nonexistent/kvx: no usable key pair"), "%s", g_r.err);
	const char *const b[] = {"trace", "--server", "--port", "0", "--auth-dir", "/nonexistent/kvx", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, b);
	cr_assert_eq(g_r.status, 2, "%d\n%s", g_r.status, g_r.err);
}

/* --peer cma|tcp: the loop moves the replay's bytes again and both figures and their ratio are
 * reported (format only: no speed is asserted). */
static void expect_peer(const char *kind, const char *transport, const char *mode)
{
	char js[] = "/tmp/kvx_trace_ops_XXXXXX.json";
	int fd = mkstemps(js, 5);
	cr_assert_geq(fd, 0);
	close(fd);
	TRACE_RUN("--trace", g_trace, "-m", mode, "-t", transport, "--speed", "0", "--pool-blocks", "300",
		  "--peer", kind, "--json", js);
	cr_assert_eq(g_r.status, 0, "exit %d\n%s\n%s", g_r.status, g_r.out, g_r.err);
	cr_assert(strstr(g_r.out, "verification           OK"), "%s", g_r.out);
	/* 267 blocks x 4096 bytes, the same for kvxfer and the loop. */
	cr_assert(strstr(g_r.out, "bytes                  1093632 "), "%s", g_r.out);
	char label[64];
	snprintf(label, sizeof(label), "  peer %s loop          ", kind);
	const char *pl = strstr(g_r.out, label);
	cr_assert(pl, "%s", g_r.out);
	double gbps, secs;
	unsigned long long bytes, calls, iovs;
	cr_assert_eq(sscanf(pl + strlen(label), "%lf GB/s (%llu bytes, as kvxfer's; %lf s, %llu calls, %llu iovecs)",
			    &gbps, &bytes, &secs, &calls, &iovs), 5, "%s", pl);
	cr_assert_eq(bytes, 1093632ull);
	/* tcp: a sendmsg and a recvmsg at least. */
	cr_assert_geq(calls, strcmp(kind, "tcp") ? 1 : 2);
	/* cma: 4 layers x 2 planes per transfer at least, one range each when the ids run on in
	 * both pools; tcp merges what runs on in the sender's pool alone, so at least one range
	 * per layer and plane (the planes of a layer are apart). */
	cr_assert_geq(iovs, strcmp(kind, "tcp") ? 5 * 4 * 2 : 4 * 2);
	double ratio;
	const char *rl = strstr(g_r.out, "  kvxfer / peer          ");
	cr_assert(rl && sscanf(rl, "  kvxfer / peer %lfx\n", &ratio) == 1, "%s", g_r.out);
	json_t *root = load_json(js);
	json_t *sum = json_object_get(root, "summary"), *peer = json_object_get(sum, "peer");
	cr_assert_str_eq(json_string_value(json_object_get(peer, "kind")), kind);
	cr_assert_eq(json_integer_value(json_object_get(peer, "status")), 0);
	cr_assert_eq(json_integer_value(json_object_get(peer, "bytes")), 1093632);
	cr_assert(json_is_true(json_object_get(peer, "same_bytes")));
	cr_assert_eq(json_integer_value(json_object_get(peer, "calls")), (json_int_t)calls);
	cr_assert_eq(json_integer_value(json_object_get(peer, "iovecs")), (json_int_t)iovs);
	cr_assert(json_is_real(json_object_get(peer, "throughput_gbps")));
	cr_assert(json_is_real(json_object_get(sum, "vs_peer")));
	json_decref(root);
	unlink(js);
}

Test(bench_perf_trace_ops, peer_cma_write_reports_the_loop_over_the_same_bytes, .init = setup, .fini = teardown)
{
	expect_peer("cma", "shm", "write");
}

Test(bench_perf_trace_ops, peer_cma_read_reports_the_loop_over_the_same_bytes, .init = setup, .fini = teardown)
{
	expect_peer("cma", "shm", "read");
}

Test(bench_perf_trace_ops, peer_tcp_write_reports_the_socket_loop_over_the_same_bytes, .init = setup, .fini = teardown)
{
	expect_peer("tcp", "tcp", "write");
}

Test(bench_perf_trace_ops, peer_tcp_read_reports_the_socket_loop_over_the_same_bytes, .init = setup, .fini = teardown)
{
	expect_peer("tcp", "tcp", "read");
}

Test(bench_perf_trace_ops, peer_cma_needs_local_and_a_known_peer, .init = setup, .fini = teardown)
{
	const char *const a[] = {"trace", "--server", "--peer", "cma", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, a);
	cr_assert_eq(g_r.status, 2, "exit %d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "--peer cma needs --local"), "%s", g_r.err);
	TRACE_RUN("--trace", g_trace, "--peer", "iperf3");
	cr_assert_eq(g_r.status, 2, "exit %d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "--peer: 'iperf3' is neither cma nor tcp"), "%s", g_r.err);
	const char *const b[] = {"trace", "--server", "--peer", "tcp", NULL};
	perf_run(&g_r, KVX_PERF_BIN, NULL, 60000, b);
	cr_assert_eq(g_r.status, 2, "exit %d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "--peer tcp needs --local"), "%s", g_r.err);
}
