/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "trace_report.h"

TestSuite(bench_trace_report, .timeout = 60.0);

Test(bench_trace_report, lat_stats_nearest_rank_in_ms)
{
	uint64_t v[10];
	for (int i = 0; i < 10; i++)
		v[9 - i] = (uint64_t)(i + 1) * 1000000u; /* 10..1 ms, unsorted */
	struct perf_lat_stats st;
	perf_lat_stats_compute(v, 10, &st);
	cr_assert_eq(st.n, 10);
	cr_assert_float_eq(st.p50, 5.0, 1e-12);
	cr_assert_float_eq(st.p90, 9.0, 1e-12);
	cr_assert_float_eq(st.p99, 10.0, 1e-12);
	cr_assert_float_eq(st.max, 10.0, 1e-12);
	cr_assert_float_eq(st.mean, 5.5, 1e-12);
	perf_lat_stats_compute(v, 0, &st);
	cr_assert_eq(st.n, 0);
	cr_assert_eq(st.p99, 0.0);
}

Test(bench_trace_report, lat_stats_of_permutation)
{
	uint64_t v[200];
	for (int i = 0; i < 200; i++)
		v[i] = (uint64_t)((i * 37) % 200) * 1000000u; /* permutation of 0..199 ms */
	struct perf_lat_stats st;
	perf_lat_stats_compute(v, 200, &st);
	cr_assert_eq(st.n, 200);
	cr_assert_float_eq(st.p50, 99.0, 1e-9);
	cr_assert_float_eq(st.p90, 179.0, 1e-9);
	cr_assert_float_eq(st.p99, 197.0, 1e-9);
	cr_assert_float_eq(st.max, 199.0, 1e-9);
	cr_assert_float_eq(st.mean, 99.5, 1e-9);
}

static struct perf_trace_rec mk(uint64_t idx, uint64_t start_ms, uint64_t end_ms, uint64_t bytes, int status)
{
	struct perf_trace_rec r = {.idx = idx, .line = (uint32_t)idx + 1, .input_tokens = 100,
				   .blocks = 7, .hit_blocks = 2, .xfer_blocks = 5, .bytes = bytes,
				   .start_ns = start_ms * 1000000u, .end_ns = end_ms * 1000000u,
				   .first_layer_ns = end_ms ? (start_ms + 1) * 1000000u : 0, .status = status};
	return r;
}

Test(bench_trace_report, summarize_counts_failures_and_throughput)
{
	struct perf_trace_rec r[4] = {mk(0, 0, 10, 1000000000, 0), mk(1, 5, 20, 1000000000, 0),
				      mk(2, 6, 0, 1000000000, -ETIMEDOUT), mk(3, 10, 1000, 2000000000, 0)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 4, &s), 0);
	cr_assert_eq(s.requests, 4);
	cr_assert_eq(s.completed, 3);
	cr_assert_eq(s.failures, 1);
	cr_assert_eq(s.prompt_tokens, 400);
	cr_assert_eq(s.blocks, 28);
	cr_assert_eq(s.hit_blocks, 8);
	cr_assert_eq(s.xfer_blocks, 15, "the failed request's blocks are not counted as transferred");
	cr_assert_eq(s.lost_blocks, 5);
	cr_assert_eq(s.bytes, 4000000000ull, "failed request's bytes are not counted");
	cr_assert_float_eq(s.wall_s, 1.0, 1e-12);
	cr_assert_float_eq(s.gbps, 4.0, 1e-9);
	cr_assert_eq(s.lat.n, 3);
	cr_assert_float_eq(s.lat.p50, 15.0, 1e-9);
	cr_assert_float_eq(s.lat.max, 990.0, 1e-9);
	cr_assert_eq(s.ttfl.n, 3);
	cr_assert_float_eq(s.ttfl.p99, 1.0, 1e-9);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	static char buf[65536];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* perf_trace_print_summary() of the arguments, as a string (the caller frees it). */
static char *summary_text(const struct perf_trace_run_info *info, const struct perf_trace_summary *s,
			  const struct perf_trace_counters *c, const struct perf_trace_rec *r, size_t n)
{
	char *txt = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&txt, &len);
	cr_assert_not_null(f);
	perf_trace_print_summary(f, info, s, c, r, n);
	fclose(f);
	return txt;
}

/* perf_trace_write_json() of the arguments to a temporary file (asserts it returned 0), parsed
 * back (asserts it parses); the caller json_decref()s it. */
static json_t *summary_json(const struct perf_trace_run_info *info, const struct perf_trace_summary *s,
			    const struct perf_trace_counters *c, const struct perf_trace_rec *r, size_t n)
{
	char path[] = "/tmp/kvx_report_json_XXXXXX";
	close(mkstemp(path));
	cr_assert_eq(perf_trace_write_json(path, info, s, c, r, n), 0);
	json_error_t je;
	json_t *root = json_load_file(path, 0, &je);
	unlink(path);
	cr_assert_not_null(root, "%s", je.text);
	return root;
}

/* A temporary directory for one plot and the three files the plotter writes there. */
struct plot_dir {
	char dir[32], png[96], dat[100], gp[100];
};

static void plot_dir_make(struct plot_dir *d, const char *png_name)
{
	snprintf(d->dir, sizeof(d->dir), "/tmp/kvx_plot_XXXXXX");
	cr_assert_not_null(mkdtemp(d->dir));
	snprintf(d->png, sizeof(d->png), "%s/%s", d->dir, png_name);
	snprintf(d->dat, sizeof(d->dat), "%s.dat", d->png);
	snprintf(d->gp, sizeof(d->gp), "%s.gp", d->png);
}

/* Assert that the plot is a PNG of more than 1000 bytes, then remove it, its data and script
 * files and the directory. */
static void plot_dir_check_png_and_remove(struct plot_dir *d)
{
	struct stat st;
	cr_assert_eq(stat(d->png, &st), 0);
	cr_assert_gt(st.st_size, 1000);
	FILE *f = fopen(d->png, "rb");
	cr_assert_not_null(f);
	unsigned char sig[8];
	cr_assert_eq(fread(sig, 1, 8, f), 8);
	fclose(f);
	cr_assert_eq(memcmp(sig, "\x89PNG\r\n\x1a\n", 8), 0);
	unlink(d->png);
	unlink(d->dat);
	unlink(d->gp);
	rmdir(d->dir);
}

Test(bench_trace_report, summary_names_failed_transfer_ids_and_verification)
{
	struct perf_trace_rec r[2] = {mk(0, 0, 10, 100, 0), mk(41, 1, 0, 100, -ETIMEDOUT)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 2, &s), 0);
	struct perf_trace_run_info info = {.model = "Llama-3.1-8B", .layout = "split K/V", .trace = "t",
					   .mode = "WRITE", .transport = "tcp", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {0.5, -1}, .verify_enabled = true};
	char *txt = summary_text(&info, &s, &c, r, 2);
	cr_assert(strstr(txt, "failures               1\n"), "%s", txt);
	cr_assert(strstr(txt, "tx-000041 (timed out)"), "%s", txt);
	cr_assert(strstr(txt, "verification           FAILED"), "%s", txt);
	cr_assert(strstr(txt, "producer 50.0% consumer n/a"), "%s", txt);
	free(txt);
}

Test(bench_trace_report, summary_ok_when_no_failures)
{
	struct perf_trace_rec r[1] = {mk(0, 0, 10, 100, 0)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 1, &s), 0);
	struct perf_trace_run_info info = {.model = "m", .layout = "MLA latent", .trace = "t",
					   .mode = "READ", .transport = "shm", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {0.25, 0.75}, .reported = {true, true},
					.ctl_reported = {true, true}, .ctl_sent = 3, .ctl_recv = 3,
					.verify_enabled = true};
	char *txt = summary_text(&info, &s, &c, r, 1);
	cr_assert(strstr(txt, "failures               0\n"), "%s", txt);
	cr_assert(strstr(txt, "verification           OK"), "%s", txt);
	cr_assert(strstr(txt, "sent 3  received 3  dropped 0\n"), "%s", txt);
	cr_assert(strstr(txt, "blocks                 7 (prefix hits 2, transferred 5)\n"), "%s", txt);
	free(txt);
}

Test(bench_trace_report, one_side_missing_is_named_not_summed_as_na)
{
	struct perf_trace_rec r[2] = {mk(0, 0, 10, 100, 0), mk(1, 1, 0, 100, -ECONNRESET)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 2, &s), 0);
	struct perf_trace_run_info info = {.model = "m", .layout = "split K/V", .trace = "t",
					   .mode = "WRITE", .transport = "tcp", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {0.5, -1}, .reported = {true, false},
					.ctl_reported = {true, false}, .ctl_sent = 4, .ctl_recv = 2};
	char *txt = summary_text(&info, &s, &c, r, 2);
	cr_assert(strstr(txt, "blocks                 14 (prefix hits 4, transferred 5, not transferred 5 "
			      "(failed requests))\n"), "%s", txt);
	cr_assert(strstr(txt, "sent 4  received 2  dropped 0 (producer only: the consumer process did not "
			      "report (died or was killed?))\n"), "%s", txt);
	free(txt);
	/* Neither side: n/a with the reason. */
	c.reported[0] = c.ctl_reported[0] = false;
	txt = summary_text(&info, &s, &c, r, 2);
	cr_assert(strstr(txt, "control messages       n/a (neither role process reported its counters)\n"), "%s", txt);
	free(txt);
}

Test(bench_trace_report, nothing_completed_prints_na_not_zero)
{
	struct perf_trace_rec r[2] = {mk(0, 0, 0, 100, -ETIMEDOUT), mk(1, 3, 0, 100, -EIO)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 2, &s), 0);
	cr_assert_eq(s.completed, 0);
	struct perf_trace_run_info info = {.model = "m", .layout = "split K/V", .trace = "t",
					   .mode = "WRITE", .transport = "tcp", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {-1, -1}, .ctl_sent = UINT64_MAX, .verify_enabled = true};
	char *txt = summary_text(&info, &s, &c, r, 2);
	cr_assert(strstr(txt, "\n  wall time              n/a (no request completed)\n"
			      "  throughput             n/a (no request completed)\n"
			      "  latency ms             n/a (no request completed)\n"
			      "  first layer ms         n/a (no request completed)\n"
			      "  lcore util             producer n/a consumer n/a\n"),
		  "%s", txt);
	cr_assert(strstr(txt, "failed transfers       tx-000000 (timed out) tx-000001 (Input/output error)\n"),
		  "%s", txt);
	free(txt);
	/* The JSON has null where the text has n/a. */
	json_t *root = summary_json(&info, &s, &c, r, 2);
	json_t *sum = json_object_get(root, "summary");
	cr_assert(json_is_null(json_object_get(sum, "wall_s")));
	cr_assert(json_is_null(json_object_get(sum, "throughput_gbps")));
	cr_assert(json_is_null(json_object_get(sum, "latency_ms")));
	cr_assert(json_is_null(json_object_get(sum, "first_layer_ms")));
	cr_assert_eq(json_integer_value(json_object_get(sum, "completed")), 0);
	json_decref(root);
}

Test(bench_trace_report, completed_run_without_layer_times_says_not_reported)
{
	struct perf_trace_rec r[1] = {mk(0, 0, 10, 100, 0)};
	r[0].first_layer_ns = 0;
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 1, &s), 0);
	struct perf_trace_run_info info = {.model = "m", .layout = "split K/V", .trace = "t",
					   .mode = "READ", .transport = "tcp", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {0.5, 0.5}, .verify_enabled = true};
	char *txt = summary_text(&info, &s, &c, r, 1);
	cr_assert(strstr(txt, "wall time              0.010 s\n"), "%s", txt);
	cr_assert(strstr(txt, "first layer ms         n/a (no per-layer completion reported)\n"), "%s", txt);
	free(txt);
}

Test(bench_trace_report, json_round_trips_summary_and_records)
{
	struct perf_trace_rec r[2] = {mk(0, 0, 10, 100, 0), mk(1, 2, 0, 50, -EIO)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 2, &s), 0);
	struct perf_trace_run_info info = {.model = "DeepSeek-V3", .layout = "MLA latent", .trace = "x.jsonl",
					   .mode = "WRITE", .transport = "tcp", .block_tokens = 16,
					   .block_bytes = 1124352, .pool_blocks = 64, .concurrency = 2};
	struct perf_trace_counters c = {.lcore_util = {0.1, 0.2}, .ctl_sent = 5, .verify_enabled = true};
	json_t *root = summary_json(&info, &s, &c, r, 2);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "run"), "model")), "DeepSeek-V3");
	json_t *sum = json_object_get(root, "summary");
	cr_assert_eq(json_integer_value(json_object_get(sum, "failures")), 1);
	cr_assert_eq(json_integer_value(json_object_get(sum, "bytes")), 100);
	cr_assert_str_eq(json_string_value(json_object_get(sum, "verification")), "FAILED");
	json_t *reqs = json_object_get(root, "requests");
	cr_assert_eq(json_array_size(reqs), 2);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(reqs, 1), "status")), -EIO);
	json_decref(root);
}

Test(bench_trace_report, csv_has_header_and_one_row_per_request)
{
	struct perf_trace_rec r[2] = {mk(0, 0, 10, 100, 0), mk(1, 2, 0, 50, -ETIMEDOUT)};
	char path[] = "/tmp/kvx_report_XXXXXX";
	close(mkstemp(path));
	cr_assert_eq(perf_trace_write_csv(path, r, 2), 0);
	char *txt = slurp(path);
	unlink(path);
	cr_assert_str_eq(txt,
			 "idx,line,input_tokens,blocks,hit_blocks,xfer_blocks,bytes,arrival_ms,start_ms,"
			 "first_layer_ms,end_ms,latency_ms,status\n"
			 "0,1,100,7,2,5,100,0.000,0.000,1.000,10.000,10.000,0\n"
			 "1,2,100,7,2,5,50,0.000,2.000,,,,-110\n");
}

Test(bench_trace_report, plot_writes_a_png_with_gnuplot)
{
	if (access("/usr/bin/gnuplot", X_OK))
		cr_skip_test("gnuplot is not installed (Debian package gnuplot-nox)");
	struct perf_trace_rec r[3] = {mk(0, 0, 10, 1000000, 0), mk(1, 5, 30, 2000000, 0), mk(2, 6, 50, 500000, 0)};
	struct perf_trace_run_info info = {.model = "m", .layout = "split K/V", .trace = "t", .mode = "READ",
					   .transport = "tcp"};
	struct plot_dir d;
	plot_dir_make(&d, "p.png");
	cr_assert_eq(perf_trace_plot(d.png, &info, r, 3), 0);
	plot_dir_check_png_and_remove(&d);
}

Test(bench_trace_report, bw_sweep_plot_writes_a_png)
{
	if (access("/usr/bin/gnuplot", X_OK))
		cr_skip_test("gnuplot is not installed (Debian package gnuplot-nox)");
	const uint64_t sizes[4] = {4096, 65536, 1048576, 8388608};
	const double gbps[8] = {0.5, 2.0, 4.0, 4.5, 0.6, 2.2, 4.1, 4.4};
	const char *names[2] = {"kvxfer", "iperf3"};
	struct plot_dir d;
	plot_dir_make(&d, "bw.png");
	cr_assert_eq(perf_plot_bw_sweep(d.png, "tcp WRITE", sizes, gbps, names, 4, 2), 0);
	char *txt = slurp(d.dat);
	cr_assert_str_eq(txt, "# bytes kvxfer_GBps iperf3_GBps\n4096 0.500000 0.600000\n65536 2.000000 2.200000\n"
			      "1048576 4.000000 4.100000\n8388608 4.500000 4.400000\n");
	cr_assert_eq(perf_plot_bw_sweep(d.png, "x", sizes, gbps, names, 0, 2), -EINVAL);
	plot_dir_check_png_and_remove(&d);
}

Test(bench_trace_report, bytes_per_lcore_are_each_lcores_share_of_its_side)
{
	struct perf_trace_rec r[1] = {mk(0, 0, 10, 100, 0)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 1, &s), 0);
	struct perf_trace_run_info info = {.model = "m", .layout = "split K/V", .trace = "t",
					   .mode = "WRITE", .transport = "shm", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {0.5, 0.1}, .n_lcores = {2, 0},
					.lcore_bytes = {{300, 100}}};
	char *txt = summary_text(&info, &s, &c, r, 1);
	cr_assert(strstr(txt, "  bytes per lcore        producer 75%/25% consumer n/a\n"), "%s", txt);
	free(txt);
	c.n_lcores[1] = 1; /* an lcore that moved nothing: 0%, not a division by zero */
	txt = summary_text(&info, &s, &c, r, 1);
	cr_assert(strstr(txt, "  bytes per lcore        producer 75%/25% consumer 0%\n"), "%s", txt);
	free(txt);
	json_t *root = summary_json(&info, &s, &c, r, 1);
	json_t *lb = json_object_get(json_object_get(root, "summary"), "lcore_bytes");
	cr_assert_eq(json_array_size(lb), 2);
	cr_assert_eq(json_integer_value(json_array_get(json_array_get(lb, 0), 0)), 300);
	cr_assert_eq(json_integer_value(json_array_get(json_array_get(lb, 0), 1)), 100);
	cr_assert_eq(json_array_size(json_array_get(lb, 1)), 1);
	json_decref(root);
}

Test(bench_trace_report, peer_cma_line_ratio_and_json)
{
	/* 100 bytes in 10 ms: 1e-5 GB/s; the loop moved the same 100 bytes in 5 ms. */
	struct perf_trace_rec r[1] = {mk(0, 0, 10, 100, 0)};
	struct perf_trace_summary s;
	cr_assert_eq(perf_trace_summarize(r, 1, &s), 0);
	struct perf_trace_run_info info = {.model = "m", .layout = "split K/V", .trace = "t",
					   .mode = "READ", .transport = "shm", .block_tokens = 16};
	struct perf_trace_counters c = {.lcore_util = {0.5, 0.1}, .peer = "cma", .peer_bytes = 100,
					.peer_wall_s = 0.005, .peer_calls = 2, .peer_iovs = 7};
	char *txt = summary_text(&info, &s, &c, r, 1);
	cr_assert(strstr(txt, "  peer cma loop          0.000 GB/s (100 bytes, as kvxfer's; 0.005 s, 2 calls, "
			      "7 iovecs)\n  kvxfer / peer          0.500x\n"), "%s", txt);
	free(txt);
	json_t *root = summary_json(&info, &s, &c, r, 1);
	json_t *sum = json_object_get(root, "summary");
	cr_assert(fabs(json_real_value(json_object_get(sum, "vs_peer")) - 0.5) < 1e-9);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(sum, "peer"), "calls")), 2);
	json_decref(root);
	/* A failed loop: n/a with the reason, null ratio. */
	c.peer_status = -EPERM;
	txt = summary_text(&info, &s, &c, r, 1);
	cr_assert(strstr(txt, "  peer cma loop          n/a (failed: "), "%s", txt);
	cr_assert_null(strstr(txt, "kvxfer / peer"), "%s", txt);
	free(txt);
	root = summary_json(&info, &s, &c, r, 1);
	cr_assert(json_is_null(json_object_get(json_object_get(root, "summary"), "vs_peer")));
	json_decref(root);
}
