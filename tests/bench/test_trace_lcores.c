/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer-perf trace --local -l: the lcore list is split per role by the lcore option parser. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvxfer/lcore.h"
#include "trace_lcores.h"

TestSuite(bench_trace_lcores, .timeout = 30.0);

/* Each role's string parses back to exactly the lcores (ids and CPU sets) of its half. */
static void expect_halves_reparse(const char *list, char out[2][TRACE_LCORES_MAX])
{
	struct kvx_lcore_cfg *whole = malloc(sizeof(*whole)), *half = malloc(sizeof(*half));
	cr_assert(whole && half);
	kvx_lcore_cfg_init(whole);
	cr_assert_eq(kvx_lcore_parse_opt(whole, "-l", list, NULL, 0), 1);
	uint32_t k = 0;
	for (int s = 0; s < 2; s++) {
		kvx_lcore_cfg_init(half);
		cr_assert_eq(kvx_lcore_parse_opt(half, "-l", out[s], NULL, 0), 1, "%s", out[s]);
		for (uint32_t i = 0; i < half->n_lcores; i++, k++) {
			cr_assert_eq(half->lcores[i].lcore_id, whole->lcores[k].lcore_id);
			cr_assert(CPU_EQUAL(&half->lcores[i].cpus, &whole->lcores[k].cpus), "lcore %u",
				  half->lcores[i].lcore_id);
		}
	}
	cr_assert_eq(k, whole->n_lcores);
	free(whole);
	free(half);
}

Test(bench_trace_lcores, plain_range_splits_in_halves)
{
	char out[2][TRACE_LCORES_MAX];
	cr_assert_eq(trace_split_lcores("0-3", out, NULL, 0), 2);
	cr_assert_str_eq(out[0], "0,1");
	cr_assert_str_eq(out[1], "2,3");
	cr_assert_eq(trace_split_lcores("4,7,9", out, NULL, 0), 2);
	cr_assert_str_eq(out[0], "4", "the odd lcore goes to the consumer");
	cr_assert_str_eq(out[1], "7,9");
}

Test(bench_trace_lcores, group_of_lcores_on_one_cpu_splits_by_lcore)
{
	/* (0,1)@0: lcores 0 and 1, both on CPU 0 (sscanf read "(0" and "1)@0" as CPUs 0 and 1). */
	char out[2][TRACE_LCORES_MAX];
	cr_assert_eq(trace_split_lcores("(0,1)@0", out, NULL, 0), 2);
	cr_assert_str_eq(out[0], "0");
	cr_assert_str_eq(out[1], "1@(0)");
	expect_halves_reparse("(0,1)@0", out);
}

Test(bench_trace_lcores, one_lcore_on_several_cpus_is_not_split)
{
	/* 0@(0,1): ONE lcore floating on CPUs 0-1 (sscanf split it into lcores 0 and 1). */
	char out[2][TRACE_LCORES_MAX] = {"untouched", "untouched"};
	cr_assert_eq(trace_split_lcores("0@(0,1)", out, NULL, 0), 0);
	cr_assert_str_eq(out[0], "untouched");
	cr_assert_eq(trace_split_lcores("3", out, NULL, 0), 0);
}

Test(bench_trace_lcores, dpdk_worked_example_splits_with_cpu_sets)
{
	/* docs/runtime-notes.md §1.1 / DPDK: lcores 0..8; 0 and 6 on CPUs {0,6}, 2 on {5,6,7},
	 * 3-5 on {0,2}. */
	const char *list = "1,2@(5-7),(3-5)@(0,2),(0,6),7-8";
	char out[2][TRACE_LCORES_MAX];
	cr_assert_eq(trace_split_lcores(list, out, NULL, 0), 2);
	cr_assert_str_eq(out[0], "0@(0,6),1,2@(5-7),3@(0,2)");
	cr_assert_str_eq(out[1], "4@(0,2),5@(0,2),6@(0,6),7,8");
	expect_halves_reparse(list, out);
}

Test(bench_trace_lcores, bad_list_is_einval_with_the_parser_message)
{
	char out[2][TRACE_LCORES_MAX], err[256] = "";
	cr_assert_eq(trace_split_lcores("3-1", out, err, sizeof(err)), -EINVAL);
	cr_assert_neq(err[0], '\0', "no message");
	cr_assert_eq(trace_split_lcores("(0,1", out, err, sizeof(err)), -EINVAL);
}

/* --local without -l: two polling lcores per role, each on the same two CPUs of the allowed set. */
Test(bench_trace_lcores, default_gives_each_role_two_pollers_on_two_cpus)
{
	char out[2][TRACE_LCORES_MAX];
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(0, &s);
	CPU_SET(1, &s);
	cr_assert_eq(trace_default_lcores(&s, out), 2);
	cr_assert_str_eq(out[0], "0@(0,1),1@(0,1)");
	cr_assert_str_eq(out[1], "0@(0,1),1@(0,1)");
	/* Three or more: the first CPU stays with the control lcores. */
	CPU_ZERO(&s);
	CPU_SET(2, &s);
	CPU_SET(5, &s);
	CPU_SET(7, &s);
	CPU_SET(9, &s);
	cr_assert_eq(trace_default_lcores(&s, out), 2);
	cr_assert_str_eq(out[0], "5@(5,7),7@(5,7)");
	cr_assert_str_eq(out[1], "5@(5,7),7@(5,7)");
	/* Each string is a valid two-lcore -l list, both lcores on both CPUs. */
	struct kvx_lcore_cfg *cfg = malloc(sizeof(*cfg));
	cr_assert(cfg);
	for (int r = 0; r < 2; r++) {
		kvx_lcore_cfg_init(cfg);
		cr_assert_eq(kvx_lcore_parse_opt(cfg, "-l", out[r], NULL, 0), 1);
		cr_assert_eq(cfg->n_lcores, 2);
		for (uint32_t i = 0; i < 2; i++) {
			cr_assert_eq(cfg->lcores[i].lcore_id, i ? 7u : 5u);
			cr_assert_eq(CPU_COUNT(&cfg->lcores[i].cpus), 2);
			cr_assert(CPU_ISSET(5, &cfg->lcores[i].cpus) && CPU_ISSET(7, &cfg->lcores[i].cpus));
		}
	}
	free(cfg);
}

Test(bench_trace_lcores, default_with_one_cpu_leaves_the_engines_defaults)
{
	char out[2][TRACE_LCORES_MAX] = {"untouched", "untouched"};
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(3, &s);
	cr_assert_eq(trace_default_lcores(&s, out), 0);
	cr_assert_str_eq(out[0], "untouched");
	CPU_ZERO(&s);
	cr_assert_eq(trace_default_lcores(&s, out), 0);
	cr_assert_str_eq(out[1], "untouched");
}
