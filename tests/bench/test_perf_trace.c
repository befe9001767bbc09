/* SPDX-License-Identifier: Apache-2.0 */
/* End to end: `kvxfer-perf trace --local` as real processes (driver, producer, consumer) on
 * loopback through the engine, with a small model table and trace written here. */
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "helpers.h"
#include "perf_run.h"
#include "kvxfer/common.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_trace, .timeout = 240.0);

/* A 4-layer split K/V model (2 KV heads x 8, bf16), a 4-layer MLA model (latent 24), and one the
 * size of Llama-3.1-8B (2 MiB per 16-token block over its 32 layers). */
#define MODELS "model,num_layers,num_kv_heads,head_dim,mla_latent_dim,attention_chunk_size,source," \
	       "bytes_per_token_per_layer_bf16,kv_bytes_per_block16_all_layers_bf16\n"          \
	       "Tiny-GQA,4,2,8,,,test,64,4096\n"                                               \
	       "Tiny-MLA,4,2,8,24,,test,48,3072\n"                                             \
	       "Big-GQA,32,8,128,,,test,4096,2097152\n"
/* Requests 2 and 3 share the first 512-token hash block with request 1; request 4 repeats 1. */
#define TRACE "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" \
	      "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3]}\n"  \
	      "{\"timestamp\": 5, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [1, 4, 5]}\n" \
	      "{\"timestamp\": 9, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" \
	      "{\"timestamp\": 9, \"input_length\": 33, \"output_length\": 5, \"hash_ids\": [9]}\n"

struct run {
	int status;
	char out[16384];
	char err[16384];
};

/* Run kvxfer-perf trace with args (NULL-terminated), PATH=path_env if not NULL; capture
 * stdout and stderr (perf_run.h; a run still going at the suite's timeout is killed). */
static void run_trace_env(struct run *r, const char *const *args, const char *path_env)
{
	const char *av[64];
	int k = 0;
	av[k++] = "trace";
	for (int i = 0; args[i] && k < 62; i++)
		av[k++] = args[i];
	av[k] = NULL;
	perf_run_into(&r->status, r->out, sizeof(r->out), r->err, sizeof(r->err), KVX_PERF_BIN, path_env, 240000,
		      av);
}

static void run_trace(struct run *r, const char *const *args)
{
	run_trace_env(r, args, NULL);
}

static char g_models[64], g_trace[64];

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

static void expect_ok(const char *model, const char *mode, const char *transport, bool prefix)
{
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", model, "--trace", g_trace,
			      "-m", mode, "-t", transport, "--speed", "0",
			      /* one at a time: prefix hits then do not depend on completion order */
			      "--concurrency", prefix ? "1" : "2",
			      "--pool-blocks", "256", "--timeout-ms", "60000", "--quiet",
			      prefix ? "--prefix-cache" : "--verify-bytes", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 0, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, "requests               5 (5 completed)"), "%s", r.out);
	cr_assert(strstr(r.out, "failures               0\n"), "%s", r.out);
	cr_assert(strstr(r.out, "verification           OK"), "%s", r.out);
	/* 1000+700+1500+1000+33 tokens = 63+44+94+63+3 blocks of 16 */
	cr_assert(strstr(r.out, "prompt tokens          4233\n"), "%s", r.out);
	if (prefix)
		/* hits: req2 32 (id 1), req3 32 (id 1), req4 63 (full: ids 1,2), req5 0 */
		cr_assert(strstr(r.out, "blocks                 267 (prefix hits 127, transferred 140)"), "%s", r.out);
	else
		cr_assert(strstr(r.out, "blocks                 267 (prefix hits 0, transferred 267)"), "%s", r.out);
}

Test(bench_perf_trace, write_split_kv_tcp_verifies, .init = setup, .fini = teardown)
{
	expect_ok("Tiny-GQA", "write", "tcp", false);
}

Test(bench_perf_trace, read_split_kv_tcp_verifies, .init = setup, .fini = teardown)
{
	expect_ok("Tiny-GQA", "read", "tcp", false);
}

Test(bench_perf_trace, write_mla_shm_prefix_cache_verifies, .init = setup, .fini = teardown)
{
	expect_ok("Tiny-MLA", "write", "shm", true);
}

Test(bench_perf_trace, read_mla_auto_prefix_cache_verifies, .init = setup, .fini = teardown)
{
	expect_ok("Tiny-MLA", "read", "auto", true);
}

Test(bench_perf_trace, pool_smaller_than_concurrent_demand_still_completes, .init = setup, .fini = teardown)
{
	/* 94 blocks is the largest request: two in flight cannot both fit, so requests wait for
	 * released blocks (pool exhaustion, reuse). */
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--speed", "0", "--concurrency", "4", "--pool-blocks", "100", "--quiet", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 0, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, "verification           OK"), "%s", r.out);
}

Test(bench_perf_trace, request_larger_than_pool_is_a_usage_error_with_oversize_error, .init = setup, .fini = teardown)
{
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--pool-blocks", "50", "--oversize", "error", "--quiet", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 2, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.err, ":1: request needs 63 blocks"), "%s", r.err);
}

Test(bench_perf_trace, malformed_trace_is_a_usage_error, .init = setup, .fini = teardown)
{
	char bad[64];
	tmpfile_with(bad, sizeof(bad), ".jsonl", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{oops}\n");
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", bad, "--quiet", NULL};
	run_trace(&r, args);
	unlink(bad);
	cr_assert_eq(r.status, 2);
}

Test(bench_perf_trace, timed_out_transfers_fail_loudly_with_their_ids, .init = setup, .fini = teardown)
{
	/* A 1 ms deadline cannot cover a handshake plus 63 blocks of 2 MiB (126 MiB: over 100 GB/s
	 * would be needed): the transfer must time out, be named, and make the exit code 1. (With
	 * Tiny-GQA's 4 KiB blocks the whole transfer sometimes finished inside 1 ms.) */
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Big-GQA", "--trace", g_trace,
			      "--requests", "1", "--speed", "0", "--timeout-ms", "1", "--quiet", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 1, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, "failures               1\n"), "%s", r.out);
	cr_assert(strstr(r.out, "failed transfers       tx-000000 (timed out)\n"), "%s", r.out);
	cr_assert(strstr(r.out, "verification           FAILED"), "%s", r.out);
	/* Nothing completed: the values that need a completion are n/a, not 0. */
	cr_assert(strstr(r.out, "wall time              n/a (no request completed)\n"), "%s", r.out);
	cr_assert(strstr(r.out, "throughput             n/a (no request completed)\n"), "%s", r.out);
	cr_assert(strstr(r.out, "latency ms             n/a (no request completed)\n"), "%s", r.out);
	cr_assert(strstr(r.out, "first layer ms         n/a (no request completed)\n"), "%s", r.out);
	cr_assert_null(strstr(r.out, "0.000 GB/s"), "a 0 printed for a missing value:\n%s", r.out);
	cr_assert_null(strstr(r.out, "p50 0.000"), "a 0 printed for a missing value:\n%s", r.out);
	/* The timeout says what timed out, after how long, and which option sets the deadline. */
	const char *d = strstr(r.out, "failure detail         tx-000000: consumer: timed out after ");
	cr_assert(d, "%s", r.out);
	cr_assert(strstr(d, " ms (deadline --timeout-ms 1 per transfer); raise --timeout-ms\n"), "%s", r.out);
}

static bool have_cpus(long n)
{
	return sysconf(_SC_NPROCESSORS_ONLN) >= n;
}

/* -l with --local: split per role by the lcore option parser (DPDK forms keep their meaning). */
static void expect_lcores(const char *list, const char *want_line)
{
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--requests", "2", "--speed", "0", "--pool-blocks", "256", "--quiet",
			      "-l", list, NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 0, "exit %d\n%s\n%s", r.status, r.out, r.err);
	cr_assert(strstr(r.err, want_line), "want '%s' in:\n%s", want_line, r.err);
	cr_assert(strstr(r.out, "verification           OK"), "%s", r.out);
}

Test(bench_perf_trace, lcores_group_on_one_cpu_gives_each_role_one_lcore, .init = setup, .fini = teardown)
{
	expect_lcores("(0,1)@0", "kvxfer-perf trace: polling lcores: producer 0, consumer 1@(0)\n");
}

Test(bench_perf_trace, lcores_single_lcore_on_two_cpus_is_shared_not_split, .init = setup, .fini = teardown)
{
	if (!have_cpus(2))
		cr_skip_test("needs CPUs 0 and 1");
	expect_lcores("0@(0,1)", "kvxfer-perf trace: polling lcores: producer 0@(0,1), consumer 0@(0,1)\n");
}

Test(bench_perf_trace, lcores_plain_list_splits_in_halves, .init = setup, .fini = teardown)
{
	if (!have_cpus(2))
		cr_skip_test("needs CPUs 0 and 1");
	expect_lcores("0-1", "kvxfer-perf trace: polling lcores: producer 0, consumer 1\n");
}

Test(bench_perf_trace, plot_without_gnuplot_is_usage_error_at_startup, .init = setup, .fini = teardown)
{
	char png[] = "/tmp/kvx_trace_plot_XXXXXX.png";
	int fd = mkstemps(png, 4);
	cr_assert_geq(fd, 0);
	close(fd);
	unlink(png);
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--speed", "0", "--quiet", "--plot", png, NULL};
	run_trace_env(&r, args, "/nonexistent-kvx-dir");
	char want[256];
	snprintf(want, sizeof(want), "kvxfer-perf trace: --plot %s needs gnuplot, which is not on PATH "
		 "(install gnuplot-nox, or drop --plot)\n", png);
	cr_assert_eq(r.status, 2, "exit %d\n%s\n%s", r.status, r.out, r.err);
	cr_assert_str_eq(r.err, want);
	cr_assert_str_eq(r.out, "", "the replay ran before the usage error:\n%s", r.out);
	cr_assert_neq(access(png, F_OK), 0, "%s was created", png);
}

Test(bench_perf_trace, mem_hip_without_a_gpu_exits_1_naming_it, .init = setup, .fini = teardown)
{
	char why[KVX_MEM_WHY_LEN] = "";
	struct kvx_mem_type hip = {.kind = KVX_MEM_HIP, .device = 0};
	if (kvx_mem_probe(&hip, why, sizeof(why)) == 0)
		cr_skip_test("a HIP device is present");
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--quiet", "--mem", "hip", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 1, "exit %d\n%s", r.status, r.err);
	cr_assert(strstr(r.err, "kvxfer-perf trace: --mem hip: no HIP device"), "%s", r.err);
	cr_assert_str_eq(r.out, "");
}

/* --mem hostdev (the test-only device-memory mock) follows the provider's caps.mem_types: a
 * provider that moves it replays with the KV pools in that memory (filled and verified through
 * kvx_mem copies: the CPU cannot touch the mock's pages), every byte checked; one that does
 * not is refused up front. */
static void expect_mem_follows_caps(const char *prov, const char *mode)
{
	struct kvx_xport_ctx *ctx = NULL;
	struct kvx_xport_caps caps = {0};
	int rc = kvx_xport_open(prov, NULL, &ctx);
	if (rc)
		cr_skip_test("%s provider unavailable: %s", prov, kvx_strerror(rc));
	cr_assert_eq(kvx_xport_query_caps(ctx, &caps), 0);
	kvx_xport_close(ctx);
	bool moves = caps.mem_types & (1u << KVX_XPORT_MEM_HOSTDEV);
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--quiet", "-t", prov, "-m", mode, "--mem", "hostdev", NULL};
	run_trace(&r, args);
	if (moves) {
		cr_assert_eq(r.status, 0, "exit %d\n%s\n%s", r.status, r.out, r.err);
		cr_assert(strstr(r.out, "  failures               0\n"), "%s", r.out);
		cr_assert(strstr(r.out, "  verification           OK"), "%s", r.out);
		return;
	}
	char want[256];
	snprintf(want, sizeof(want), "kvxfer-perf trace: --mem hostdev: the %s provider does not "
		 "move this memory (not in its caps.mem_types)\n", prov);
	cr_assert_eq(r.status, 1, "exit %d\n%s", r.status, r.err);
	cr_assert(strstr(r.err, want), "want '%s' in:\n%s", want, r.err);
}

Test(bench_perf_trace, mem_hostdev_tcp_read, .init = setup, .fini = teardown)
{
	expect_mem_follows_caps("tcp", "read");
}

Test(bench_perf_trace, mem_hostdev_tcp_write, .init = setup, .fini = teardown)
{
	expect_mem_follows_caps("tcp", "write");
}

Test(bench_perf_trace, mem_hostdev_shm_read, .init = setup, .fini = teardown)
{
	expect_mem_follows_caps("shm", "read");
}

Test(bench_perf_trace, mem_hostdev_shm_write, .init = setup, .fini = teardown)
{
	expect_mem_follows_caps("shm", "write");
}

/* The summary's "huge pages P % / C %": share of the producer's and consumer's host pools that
 * transparent huge pages back. -1 when the line is missing. */
static void huge_pcts(const char *err, int *p, int *c)
{
	const char *s = strstr(err, "huge pages ");
	*p = *c = -1;
	if (!s || sscanf(s, "huge pages %d %% / %d %%)", p, c) != 2)
		*p = *c = -1;
}

/* Big-GQA over tcp, two requests, every byte checked; --hugepages as given. */
static void run_big(struct run *r, const char *huge)
{
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Big-GQA", "--trace", g_trace,
			      "--requests", "2", "--speed", "0", "-t", "tcp", "--verify-bytes", "--quiet",
			      "--hugepages", huge, NULL};
	run_trace(r, args);
	cr_assert_eq(r->status, 0, "exit %d\n%s\n%s", r->status, r->out, r->err);
	cr_assert(strstr(r->out, "verification           OK"), "%s", r->out);
}

Test(bench_perf_trace, hugepages_off_keeps_the_pools_on_small_pages, .init = setup, .fini = teardown)
{
	struct run r;
	run_big(&r, "off");
	int p, c;
	huge_pcts(r.err, &p, &c);
	cr_assert(p == 0 && c == 0, "want huge pages 0 %% / 0 %% in:\n%s", r.err);
}

Test(bench_perf_trace, hugepages_on_backs_the_pools_where_the_kernel_allows, .init = setup, .fini = teardown)
{
	char mode[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (f) {
		if (!fgets(mode, sizeof(mode), f))
			mode[0] = 0;
		fclose(f);
	}
	if (!mode[0] || strstr(mode, "[never]"))
		cr_skip_test("transparent huge pages are off in this kernel (%s)", mode[0] ? "never" : "no sysfs file");
	struct run r;
	run_big(&r, "on");
	int p, c;
	huge_pcts(r.err, &p, &c);
	/* Each layer is 7.4 MiB (118 blocks of 64 KiB): at least its 2 MiB-aligned huge pages. */
	cr_assert(p > 0 && c > 0, "want both pools partly on huge pages (THP %s) in:\n%s", mode, r.err);
}
