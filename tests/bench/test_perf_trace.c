/* SPDX-License-Identifier: Apache-2.0 */
/* End to end: `kvxfer-perf trace --local` as real processes (driver, producer, consumer) on
 * loopback through the engine, with a small model table and trace written here. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "helpers.h"

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_trace, .timeout = 240.0);

/* A 4-layer split K/V model (2 KV heads x 8, bf16) and a 4-layer MLA model (latent 24). */
#define MODELS "model,num_layers,num_kv_heads,head_dim,mla_latent_dim,attention_chunk_size,source," \
	       "bytes_per_token_per_layer_bf16,kv_bytes_per_block16_all_layers_bf16\n"          \
	       "Tiny-GQA,4,2,8,,,test,64,4096\n"                                               \
	       "Tiny-MLA,4,2,8,24,,test,48,3072\n"
/* Requests 2 and 3 share the first 512-token hash block with request 1; request 4 repeats 1. */
#define TRACE "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" \
	      "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 3]}\n"  \
	      "{\"timestamp\": 5, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [1, 4, 5]}\n" \
	      "{\"timestamp\": 9, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" \
	      "{\"timestamp\": 9, \"input_length\": 33, \"output_length\": 5, \"hash_ids\": [9]}\n"

struct run {
	int status;
	char out[16384];
};

/* Run kvxfer-perf trace with args (NULL-terminated) and capture stdout. */
static void run_trace(struct run *r, const char *const *args)
{
	char outp[] = "/tmp/kvx_trace_out_XXXXXX";
	int fd = mkstemp(outp);
	cr_assert_geq(fd, 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(fd, 1);
		const char *av[64];
		int k = 0;
		av[k++] = KVX_PERF_BIN;
		av[k++] = "trace";
		for (int i = 0; args[i] && k < 62; i++)
			av[k++] = args[i];
		av[k] = NULL;
		execv(KVX_PERF_BIN, (char *const *)av);
		_exit(127);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	FILE *f = fdopen(fd, "r");
	rewind(f);
	size_t n = fread(r->out, 1, sizeof(r->out) - 1, f);
	r->out[n] = '\0';
	fclose(f);
	unlink(outp);
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
			      prefix ? "--prefix-cache" : "--verify", NULL};
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

Test(bench_perf_trace, request_larger_than_pool_is_a_usage_error, .init = setup, .fini = teardown)
{
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--pool-blocks", "50", "--quiet", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 2, "exit %d\n%s", r.status, r.out);
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
	/* A 1 ms deadline cannot cover the first handshake: every transfer must time out, be
	 * named, and make the exit code 1. */
	struct run r;
	const char *args[] = {"--local", "--models-csv", g_models, "--model", "Tiny-GQA", "--trace", g_trace,
			      "--requests", "1", "--speed", "0", "--timeout-ms", "1", "--quiet", NULL};
	run_trace(&r, args);
	cr_assert_eq(r.status, 1, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, "failures               1\n"), "%s", r.out);
	cr_assert(strstr(r.out, "failed transfers       tx-000000 ("), "%s", r.out);
	cr_assert(strstr(r.out, "verification           FAILED"), "%s", r.out);
}
