/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf plan through the real binary: the seed's numpy planner (bench/plan_numpy_ref.py,
 * the peer) runs in the same session on the same ids, its merged plan equals kvx's, and the
 * JSON carries both figures and their ratio for the split K/V and the MLA models. No speed is
 * asserted: only that the figures exist and the plans agree.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_plan, .timeout = 300.0);

/* true when Debian's python has numpy (the peer's interpreter). */
static bool have_numpy(void)
{
	int st = system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1");
	return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static json_t *run_plan(const char *model, const char *extra)
{
	char dir[] = "/tmp/kvx-plan-test.XXXXXX", cmd[512], json[64];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(json, sizeof(json), "%s/out.json", dir);
	snprintf(cmd, sizeof(cmd), "'%s' plan --model %s --blocks 300 --min-ms 1 %s --json %s >%s/log 2>&1",
		 KVX_PERF_BIN, model, extra, json, dir);
	int st = system(cmd);
	char log[600];
	snprintf(log, sizeof(log), "%s/log", dir);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s exited %d (log %s)", cmd, st, log);
	json_error_t err;
	json_t *j = json_load_file(json, 0, &err);
	cr_assert_not_null(j, "%s: %s", json, err.text);
	unlink(json);
	unlink(log);
	rmdir(dir);
	return j;
}

static void expect_peer_figures(json_t *j, size_t blocks_entries_per_pair)
{
	json_t *res = json_object_get(j, "results");
	cr_assert(json_is_array(res) && json_array_size(res) == 2);
	cr_assert_eq(json_integer_value(json_object_get(j, "rounds")), 3);
	for (size_t i = 0; i < 2; i++) {
		json_t *r = json_array_get(res, i);
		const char *pat = json_string_value(json_object_get(r, "pattern"));
		cr_assert_not_null(pat);
		cr_assert(json_is_true(json_object_get(r, "plans_identical")), "%s: plans not identical", pat);
		cr_assert_eq(json_integer_value(json_object_get(r, "entries")), 300 * blocks_entries_per_pair);
		json_int_t ranges = json_integer_value(json_object_get(r, "ranges"));
		if (strcmp(pat, "contiguous") == 0)
			cr_assert_leq(ranges, (json_int_t)blocks_entries_per_pair, "%s: %lld ranges", pat,
				      (long long)ranges);
		else
			cr_assert_gt(ranges, 100, "random ids merged into only %lld ranges", (long long)ranges);
		const char *keys[] = {"kvx_ns_per_block_layer", "seed_ns_per_block_layer", "numpy_vec_ns_per_block_layer",
				      "ratio_seed_over_kvx", "ratio_numpy_vec_over_kvx"};
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			json_t *v = json_object_get(r, keys[k]);
			cr_assert(json_is_real(v) && json_real_value(v) > 0, "%s: %s missing or not positive", pat,
				  keys[k]);
		}
	}
}

Test(bench_perf_plan, split_kv_plan_matches_the_numpy_seed_and_reports_the_ratio)
{
	if (!have_numpy())
		cr_skip_test("/usr/bin/python3 has no numpy (scripts/install-deps.sh installs python3-numpy)");
	json_t *j = run_plan("Llama-3.1-8B", "");
	cr_assert_str_eq(json_string_value(json_object_get(j, "layout")), "split");
	expect_peer_figures(j, 2);
	json_decref(j);
}

Test(bench_perf_plan, mla_plan_matches_the_numpy_seed_and_reports_the_ratio)
{
	if (!have_numpy())
		cr_skip_test("/usr/bin/python3 has no numpy (scripts/install-deps.sh installs python3-numpy)");
	/* Same num_blocks on both sides and ids from a small pool: duplicates-free random ids that
	 * often neighbour each other, so merges happen in the random pattern too. */
	json_t *j = run_plan("DeepSeek-V3", "--pool 400 --remote-pool 400");
	cr_assert_str_eq(json_string_value(json_object_get(j, "layout")), "mla");
	expect_peer_figures(j, 1);
	json_decref(j);
}
