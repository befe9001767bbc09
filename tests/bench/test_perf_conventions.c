/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Conventions every kvxfer-perf subcommand shares, checked through the real binary:
 * -V/--version; `--json -` writes the JSON (and only it) to stdout; exit 2 for a usage error and
 * 1 for a failed run; plus bw/lat's perftest habits (-d/--ib-dev, --report_gbits, result rows
 * printed by the server, --plot without gnuplot refused before the sweep).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "perf_run.h"

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif
#ifndef KVX_PROJECT_VERSION
#error KVX_PROJECT_VERSION must be the project version
#endif

TestSuite(bench_perf_conventions, .timeout = 600.0);

static struct perf_run g_r; /* large: static, one test at a time (-j1) */

#define RUN(deadline_ms, ...)                                                                  \
	do {                                                                                   \
		const char *const a_[] = {__VA_ARGS__, NULL};                                  \
		perf_run(&g_r, KVX_PERF_BIN, NULL, (deadline_ms), a_);                         \
	} while (0)

static const char *const g_subcmds[] = {"ring", "notify", "bw", "lat", "plan", "trace"};

Test(bench_perf_conventions, version_at_top_level_and_in_every_subcommand)
{
	RUN(30000, "-V");
	cr_assert_eq(g_r.status, 0, "%s", g_r.err);
	cr_assert(strstr(g_r.out, "kvxfer-perf " KVX_PROJECT_VERSION " (commit "), "%s", g_r.out);
	for (size_t i = 0; i < sizeof(g_subcmds) / sizeof(g_subcmds[0]); i++) {
		RUN(30000, g_subcmds[i], i % 2 ? "-V" : "--version");
		cr_assert_eq(g_r.status, 0, "%s --version: %d %s", g_subcmds[i], g_r.status, g_r.err);
		cr_assert(strstr(g_r.out, "kvxfer-perf " KVX_PROJECT_VERSION), "%s: %s", g_subcmds[i], g_r.out);
	}
}

Test(bench_perf_conventions, unknown_option_exits_2_in_every_subcommand)
{
	for (size_t i = 0; i < sizeof(g_subcmds) / sizeof(g_subcmds[0]); i++) {
		RUN(30000, g_subcmds[i], "--no-such-option");
		cr_assert_eq(g_r.status, 2, "%s: exit %d\n%s%s", g_subcmds[i], g_r.status, g_r.out, g_r.err);
	}
	RUN(30000, "no-such-command");
	cr_assert_eq(g_r.status, 2);
}

/* stdout holds exactly one JSON object whose "command" is @p cmd; the text went to stderr. */
static void expect_json_stdout(const char *cmd)
{
	cr_assert_eq(g_r.status, 0, "%s: exit %d\n%s", cmd, g_r.status, g_r.err);
	json_error_t je;
	json_t *root = json_loads(g_r.out, 0, &je);
	cr_assert(root, "%s: stdout is not one JSON document (%s at line %d): %.400s", cmd, je.text,
		  je.line, g_r.out);
	cr_assert(json_is_object(root));
	cr_assert_str_eq(json_string_value(json_object_get(root, "command")), cmd);
	cr_assert_gt(g_r.err_len, 0, "%s: the human-readable output should be on stderr", cmd);
	json_decref(root);
}

Test(bench_perf_conventions, json_dash_is_stdout_in_every_subcommand)
{
	RUN(300000, "ring", "-n", "2k", "--reps", "1", "--lat-n", "200", "--wake-n", "20", "--json", "-");
	expect_json_stdout("ring");
	RUN(300000, "notify", "--iters", "200", "--msgs", "2000", "--hs-iters", "2", "--json=-");
	expect_json_stdout("notify");
	RUN(300000, "bw", "--local", "-t", "tcp", "-n", "5", "-s", "4K", "--json", "-");
	expect_json_stdout("bw");
	RUN(300000, "lat", "--local", "-t", "tcp", "-n", "5", "--json", "-");
	expect_json_stdout("lat");
	RUN(300000, "plan", "--model", "Llama-3.1-8B", "--blocks", "64", "--min-ms", "1", "--json", "-");
	expect_json_stdout("plan");
	RUN(300000, "trace", "--local", "-t", "tcp", "--requests", "1", "--speed", "0", "--quiet",
	    "--json", "-");
	expect_json_stdout("trace");
	cr_assert(strstr(g_r.err, "verification           OK"), "%s", g_r.err);
}

Test(bench_perf_conventions, failed_runs_exit_1)
{
	char port[16];
	snprintf(port, sizeof(port), "%u", perf_run_closed_port());
	RUN(120000, "bw", "-t", "tcp", "-p", port, "-n", "5", "127.0.0.1");
	cr_assert_eq(g_r.status, 1, "bw: %d %s", g_r.status, g_r.err);
	RUN(120000, "lat", "-t", "tcp", "-p", port, "-n", "5", "127.0.0.1");
	cr_assert_eq(g_r.status, 1, "lat: %d %s", g_r.status, g_r.err);
	RUN(120000, "trace", "--client", "127.0.0.1", "--port", port, "--requests", "1");
	cr_assert_eq(g_r.status, 1, "trace: %d %s", g_r.status, g_r.err);
}

Test(bench_perf_conventions, unknown_model_is_a_usage_error_in_plan_and_trace)
{
	RUN(60000, "plan", "--model", "No-Such-Model-7B");
	cr_assert_eq(g_r.status, 2, "plan: %d %s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "No-Such-Model-7B"), "%s", g_r.err);
	RUN(60000, "trace", "--local", "--model", "No-Such-Model-7B");
	cr_assert_eq(g_r.status, 2, "trace: %d %s", g_r.status, g_r.err);
}

Test(bench_perf_conventions, bw_plot_without_gnuplot_is_a_usage_error_before_the_sweep)
{
	const char *const a[] = {"bw", "--local", "-t", "tcp", "-a", "-n", "5", "--plot",
				 "/tmp/kvx_conv_never.png", NULL};
	perf_run(&g_r, KVX_PERF_BIN, "/nonexistent-kvx-dir", 60000, a);
	cr_assert_eq(g_r.status, 2, "exit %d\n%s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "gnuplot"), "%s", g_r.err);
	cr_assert_null(strstr(g_r.out, "#bytes"), "the sweep ran first:\n%s", g_r.out);
}

/* The first result row's average bandwidth column (4th field of the row of @p size bytes). */
static double row_avg(const char *text, const char *size)
{
	for (const char *p = text; (p = strstr(p, "\n ")); p++) {
		unsigned long long sz, it;
		double peak, avg;
		if (sscanf(p + 1, " %llu %llu %lf %lf", &sz, &it, &peak, &avg) == 4 &&
		    sz == strtoull(size, NULL, 10))
			return avg;
	}
	return NAN;
}

Test(bench_perf_conventions, bw_report_gbits_prints_bits_per_second)
{
	RUN(300000, "bw", "--local", "-t", "tcp", "-n", "20", "-s", "1048576", "--report_gbits", "--json", "-");
	cr_assert_eq(g_r.status, 0, "%s", g_r.err);
	cr_assert(strstr(g_r.err, "BW average[Gb/sec]"), "%s", g_r.err);
	json_t *root = json_loads(g_r.out, 0, NULL);
	cr_assert(root, "%s", g_r.out);
	double gbytes = json_number_value(json_object_get(json_array_get(json_object_get(root, "results"), 0),
							  "bw_avg_gbps"));
	json_decref(root);
	double gbits = row_avg(g_r.err, "1048576");
	cr_assert(gbytes > 0 && isfinite(gbits), "json %f row %f\n%s", gbytes, gbits, g_r.err);
	/* The row is printed with 2 decimals: compare with that tolerance plus 0.5%. */
	cr_assert(fabs(gbits - 8.0 * gbytes) <= 0.006 + 0.005 * 8.0 * gbytes,
		  "row %.4f Gb/s vs json %.4f GB/s x 8", gbits, gbytes);
}

/* The bw/lat (@p sub) server prints the client's result rows and exits 0. */
static void server_prints_rows(const char *sub)
{
	static struct perf_run srv;
	memset(&srv, 0, sizeof(srv));
	struct perf_child ch;
	const char *const sa[] = {sub, "-t", "tcp", "-p", "0", NULL};
	perf_run_start(&ch, KVX_PERF_BIN, NULL, sa);
	cr_assert_not(perf_run_read(&ch, &srv, 60000, "listening on TCP port "), "server exited: %s", srv.err);
	/* The banner is one write of a few hundred bytes (atomic on a pipe): the line is whole. */
	const char *p = strstr(srv.out, "listening on TCP port ");
	char port[16];
	snprintf(port, sizeof(port), "%u", (unsigned)strtoul(p + strlen("listening on TCP port "), NULL, 10));
	RUN(300000, sub, "-t", "tcp", "-p", port, "-n", "5", "-s", "4096", "127.0.0.1");
	cr_assert_eq(g_r.status, 0, "client: %s", g_r.err);
	cr_assert(perf_run_read(&ch, &srv, 120000, NULL));
	cr_assert_eq(srv.status, 0, "server: %d %s", srv.status, srv.err);
	/* The client's row of 4096 bytes appears verbatim on the server. */
	const char *row = strstr(g_r.out, "\n 4096 ");
	cr_assert(row, "%s", g_r.out);
	char line[256];
	size_t l = strcspn(row + 1, "\n");
	cr_assert_lt(l, sizeof(line));
	memcpy(line, row + 1, l);
	line[l] = '\0';
	cr_assert(strstr(srv.out, line), "server output lacks the row '%s':\n%s", line, srv.out);
	cr_assert(strstr(srv.out, "results (measured by the client"), "%s", srv.out);
}

Test(bench_perf_conventions, bw_server_prints_result_rows)
{
	server_prints_rows("bw");
}

Test(bench_perf_conventions, lat_server_prints_result_rows)
{
	server_prints_rows("lat");
}

Test(bench_perf_conventions, ib_dev_selects_verbs_and_names_the_device)
{
	RUN(60000, "bw", "--local", "-d", "kvx_no_such_dev0", "-n", "5");
	cr_assert_eq(g_r.status, 1, "%d %s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "kvx_no_such_dev0"), "%s", g_r.err);
	RUN(60000, "lat", "--local", "--ib-dev", "kvx_no_such_dev0", "-n", "5");
	cr_assert_eq(g_r.status, 1, "%d %s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "kvx_no_such_dev0"), "%s", g_r.err);
	/* An RDMA device with a provider that does not use one is a usage error. */
	RUN(60000, "bw", "--local", "-t", "tcp", "-d", "mlx5_0");
	cr_assert_eq(g_r.status, 2, "%d %s", g_r.status, g_r.err);
	RUN(60000, "trace", "--local", "-t", "tcp", "-d", "mlx5_0");
	cr_assert_eq(g_r.status, 2, "%d %s", g_r.status, g_r.err);
	RUN(120000, "trace", "--local", "-d", "kvx_no_such_dev0", "--requests", "1", "--quiet");
	cr_assert_eq(g_r.status, 1, "%d %s", g_r.status, g_r.err);
	cr_assert(strstr(g_r.err, "kvx_no_such_dev0"), "%s", g_r.err);
}
