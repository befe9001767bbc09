/* SPDX-License-Identifier: Apache-2.0 */
/* EAL-style options: grammar on any machine, validation against given CPU sets, defaults. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/lcore.h"

TestSuite(lcore_opts, .timeout = 20.0);

static char g_err[KVX_LCORE_ERRLEN];

static struct kvx_lcore_cfg *cfg_new(void)
{
	struct kvx_lcore_cfg *c = malloc(sizeof(*c));
	cr_assert_not_null(c);
	kvx_lcore_cfg_init(c);
	g_err[0] = '\0';
	return c;
}

static unsigned mask_of(const cpu_set_t *s)
{
	unsigned m = 0;
	for (int i = 0; i < 32; i++)
		if (CPU_ISSET(i, s))
			m |= 1u << i;
	return m;
}

static const struct kvx_lcore_map *find(const struct kvx_lcore_cfg *c, uint32_t id)
{
	for (uint32_t i = 0; i < c->n_lcores; i++)
		if (c->lcores[i].lcore_id == id)
			return &c->lcores[i];
	cr_assert_fail("lcore %u not in the configuration", id);
	return NULL;
}

static cpu_set_t cpus_upto(int n)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	for (int i = 0; i < n; i++)
		CPU_SET(i, &s);
	return s;
}

Test(lcore_opts, dpdk_worked_example_gives_documented_cpusets)
{
	struct kvx_lcore_cfg *c = cfg_new();
	int rc = kvx_lcore_parse_opt(c, "--lcores", "1,2@(5-7),(3-5)@(0,2),(0,6),7-8", g_err, sizeof(g_err));
	cr_assert_eq(rc, 1, "%s", g_err);
	cr_assert_eq(c->n_lcores, 9, "9 threads");
	/* EAL guide: lcore 0 -> 0x41; 2 -> 0xe0; 3,4,5 -> 0x5; 8 -> 0x100. */
	cr_assert_eq(mask_of(&find(c, 0)->cpus), 0x41);
	cr_assert_eq(mask_of(&find(c, 1)->cpus), 0x2);
	cr_assert_eq(mask_of(&find(c, 2)->cpus), 0xe0);
	cr_assert_eq(mask_of(&find(c, 3)->cpus), 0x5);
	cr_assert_eq(mask_of(&find(c, 4)->cpus), 0x5);
	cr_assert_eq(mask_of(&find(c, 5)->cpus), 0x5);
	cr_assert_eq(mask_of(&find(c, 6)->cpus), 0x41);
	cr_assert_eq(mask_of(&find(c, 7)->cpus), 0x80);
	cr_assert_eq(mask_of(&find(c, 8)->cpus), 0x100);
	for (uint32_t i = 0; i < c->n_lcores; i++)
		cr_assert_eq(c->lcores[i].lcore_id, i, "ascending ids");
	/* Validates against a 9-CPU host; the example shares CPUs between lcores (allowed). */
	cpu_set_t nine = cpus_upto(9);
	c->control_mode = KVX_LCORE_CONTROL_NONE;
	cr_assert_eq(kvx_lcore_cfg_validate(c, &nine, &nine, g_err, sizeof(g_err)), 0, "%s", g_err);
	cr_assert_eq(c->main_lcore, 0, "main defaults to the first lcore");
	free(c);
}

Test(lcore_opts, simple_list_maps_lcore_to_same_cpu)
{
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "-l", "0-3,8", g_err, sizeof(g_err)), 1, "%s", g_err);
	cr_assert_eq(c->n_lcores, 5);
	const uint32_t ids[] = {0, 1, 2, 3, 8};
	for (unsigned i = 0; i < 5; i++) {
		cr_assert_eq(c->lcores[i].lcore_id, ids[i]);
		cr_assert_eq(CPU_COUNT(&c->lcores[i].cpus), 1);
		cr_assert(CPU_ISSET((int)ids[i], &c->lcores[i].cpus));
	}
	free(c);
}

Test(lcore_opts, mapping_forms_from_the_guide)
{
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "--lcores", "1@31,2@32,3@33", g_err, sizeof(g_err)), 1);
	cr_assert(CPU_ISSET(31, &find(c, 1)->cpus));
	cr_assert(CPU_ISSET(33, &find(c, 3)->cpus));
	cr_assert_eq(CPU_COUNT(&find(c, 3)->cpus), 1);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--lcores", "(1-3)@20", g_err, sizeof(g_err)), 1);
	cr_assert_eq(c->n_lcores, 3);
	for (uint32_t id = 1; id <= 3; id++) {
		cr_assert_eq(CPU_COUNT(&find(c, id)->cpus), 1);
		cr_assert(CPU_ISSET(20, &find(c, id)->cpus));
	}
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "lcores", "1@(1,2)", g_err, sizeof(g_err)), 1);
	cr_assert_eq(mask_of(&find(c, 1)->cpus), 0x6, "lcore 1 floats on CPUs 1-2");
	free(c);
}

Test(lcore_opts, grammar_errors_name_the_value)
{
	static const struct {
		const char *in;
		const char *needle;
	} bad[] = {
		{"", "empty"},
		{"1,,2", "expected a lcore number"},
		{"3-1", "descending lcore range 3-1"},
		{"1,2,1", "lcore 1 listed twice"},
		{"(1-2),2@5", "lcore 2 listed twice"},
		{"5000", "lcore 5000 out of range"},
		{"1@(2,3", "expected ',' or ')'"},
		{"1@", "expected a CPU number"},
		{"2@1024", "CPU 1024 out of range"},
		{"a", "expected a lcore number"},
		{"1;2", "unexpected ';'"},
	};
	for (size_t i = 0; i < KVX_ARRAY_SIZE(bad); i++) {
		struct kvx_lcore_cfg *c = cfg_new();
		int rc = kvx_lcore_parse_opt(c, "-l", bad[i].in, g_err, sizeof(g_err));
		cr_assert_eq(rc, -EINVAL, "'%s' must fail", bad[i].in);
		cr_assert_not_null(strstr(g_err, bad[i].needle), "'%s': message '%s' lacks '%s'", bad[i].in,
				   g_err, bad[i].needle);
		cr_assert_eq(c->n_lcores, 0, "cfg unchanged on error");
		free(c);
	}
}

Test(lcore_opts, coremask_reads_right_to_left)
{
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "-c", " 0x1A ", g_err, sizeof(g_err)), 1, "%s", g_err);
	cr_assert_eq(c->n_lcores, 3);
	cr_assert_eq(c->lcores[0].lcore_id, 1);
	cr_assert_eq(c->lcores[1].lcore_id, 3);
	cr_assert_eq(c->lcores[2].lcore_id, 4);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-c", "100", g_err, sizeof(g_err)), 1);
	cr_assert_eq(c->n_lcores, 1);
	cr_assert_eq(c->lcores[0].lcore_id, 8, "bit 0 of the third digit from the right is CPU 8");
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-c", "0x0", g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "no CPU"), "%s", g_err);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-c", "0xg1", g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "'g' is not a hex digit"), "%s", g_err);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-c", "", g_err, sizeof(g_err)), -EINVAL);
	free(c);
}

Test(lcore_opts, c_and_l_are_mutually_exclusive)
{
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "-c", "0x3", g_err, sizeof(g_err)), 1);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-l", "0-1", g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "only one of -c and -l"), "%s", g_err);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--lcores", "0", g_err, sizeof(g_err)), 1);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-l", "1", g_err, sizeof(g_err)), -EINVAL, "given twice");
	free(c);
}

Test(lcore_opts, other_options_and_unknown_names)
{
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "--json", "x", g_err, sizeof(g_err)), 0, "not ours");
	cr_assert_eq(kvx_lcore_parse_opt(c, "--idle", "busy", g_err, sizeof(g_err)), 1);
	cr_assert_eq(c->idle, KVX_LCORE_IDLE_BUSY);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--idle", "busy", g_err, sizeof(g_err)), -EINVAL, "twice");
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--idle", "lazy", g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "'lazy'"), "%s", g_err);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--main-lcore", "2x", g_err, sizeof(g_err)), -EINVAL);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--main-lcore", "2", g_err, sizeof(g_err)), 1);
	cr_assert_eq(c->main_lcore, 2);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--control-lcore", "4@(0-1)", g_err, sizeof(g_err)), 1);
	cr_assert_eq(c->control_mode, KVX_LCORE_CONTROL_EXPLICIT);
	cr_assert_eq(c->control.lcore_id, 4);
	cr_assert_eq(mask_of(&c->control.cpus), 0x3);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--control-lcore", "none", g_err, sizeof(g_err)), 1);
	cr_assert_eq(c->control_mode, KVX_LCORE_CONTROL_NONE);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "--control-lcore", "(1,2)", g_err, sizeof(g_err)), -EINVAL);
	free(c);
}

Test(lcore_opts, parse_args_removes_lcore_options_in_all_spellings)
{
	char *argv[] = {"prog", "-l", "0-1", "-n", "100", "--idle=busy", "--json", "f.json",
			"--main-lcore", "1", "--control-lcore=none", "--", "-l", "9", NULL};
	int argc = 14;
	struct kvx_lcore_cfg *c = cfg_new();
	int n = kvx_lcore_parse_args(argc, argv, c, g_err, sizeof(g_err));
	cr_assert_eq(n, 8, "%s", g_err);
	cr_assert_str_eq(argv[0], "prog");
	cr_assert_str_eq(argv[1], "-n");
	cr_assert_str_eq(argv[2], "100");
	cr_assert_str_eq(argv[3], "--json");
	cr_assert_str_eq(argv[4], "f.json");
	cr_assert_str_eq(argv[5], "--");
	cr_assert_str_eq(argv[6], "-l", "after -- nothing is parsed");
	cr_assert_str_eq(argv[7], "9");
	cr_assert_null(argv[8]);
	cr_assert_eq(c->n_lcores, 2);
	cr_assert_eq(c->idle, KVX_LCORE_IDLE_BUSY);
	cr_assert_eq(c->main_lcore, 1);
	cr_assert_eq(c->control_mode, KVX_LCORE_CONTROL_NONE);

	char *argv2[] = {"prog", "-l3", "-c", "0x1", NULL};
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_args(4, argv2, c, g_err, sizeof(g_err)), -EINVAL);
	char *argv3[] = {"prog", "--lcores", NULL};
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_args(2, argv3, c, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "--lcores needs a value"), "%s", g_err);
	char *argv4[] = {"prog", "--lcoresx", "-lc", NULL};
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_args(3, argv4, c, g_err, sizeof(g_err)), -EINVAL,
		     "-lc is -l with value 'c', which is bad");
	free(c);
}

Test(lcore_opts, validate_names_missing_and_disallowed_cpus)
{
	cpu_set_t present = cpus_upto(4), allowed;
	CPU_ZERO(&allowed);
	CPU_SET(0, &allowed);
	CPU_SET(1, &allowed);
	CPU_SET(3, &allowed);
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "-l", "0,999", g_err, sizeof(g_err)), 1);
	cr_assert_eq(kvx_lcore_cfg_validate(c, &present, &allowed, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "lcore 999: CPU 999 does not exist"), "%s", g_err);
	cr_assert_not_null(strstr(g_err, "present: 0-3"), "%s", g_err);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_parse_opt(c, "-l", "1@(1-2)", g_err, sizeof(g_err)), 1);
	cr_assert_eq(kvx_lcore_cfg_validate(c, &present, &allowed, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "lcore 1: CPU 2 is not in this process's allowed CPUs (0-1,3)"),
			   "%s", g_err);
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_cfg_validate(c, &present, &allowed, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "no polling lcores"), "%s", g_err);
	free(c);
}

Test(lcore_opts, validate_main_and_control_lcore_rules)
{
	cpu_set_t four = cpus_upto(4);
	struct kvx_lcore_cfg *c = cfg_new();
	kvx_lcore_parse_opt(c, "-l", "1-2", g_err, sizeof(g_err));
	kvx_lcore_parse_opt(c, "--main-lcore", "3", g_err, sizeof(g_err));
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "--main-lcore 3 is not one of the polling lcores"), "%s", g_err);

	kvx_lcore_cfg_init(c);
	kvx_lcore_parse_opt(c, "-l", "1-2", g_err, sizeof(g_err));
	kvx_lcore_parse_opt(c, "--control-lcore", "2", g_err, sizeof(g_err));
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "--control-lcore 2 is also a polling lcore"), "%s", g_err);

	kvx_lcore_cfg_init(c);
	kvx_lcore_parse_opt(c, "-l", "1-2", g_err, sizeof(g_err));
	kvx_lcore_parse_opt(c, "--control-lcore", "0@(0-1)", g_err, sizeof(g_err));
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "--control-lcore 0: CPU 1 is also used by polling lcore 1"),
			   "%s", g_err);

	kvx_lcore_cfg_init(c);
	kvx_lcore_parse_opt(c, "-l", "1-2", g_err, sizeof(g_err));
	kvx_lcore_parse_opt(c, "--control-lcore", "0", g_err, sizeof(g_err));
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), 0, "%s", g_err);
	cr_assert_eq(c->main_lcore, 1);

	/* AUTO: next free id, on the CPUs no poller uses. */
	kvx_lcore_cfg_init(c);
	kvx_lcore_parse_opt(c, "-l", "0-1", g_err, sizeof(g_err));
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), 0, "%s", g_err);
	cr_assert_eq(c->control_mode, KVX_LCORE_CONTROL_EXPLICIT);
	cr_assert_eq(c->control.lcore_id, 2);
	cr_assert_eq(mask_of(&c->control.cpus), 0xc);
	/* AUTO with every CPU taken: floats on all allowed CPUs. */
	kvx_lcore_cfg_init(c);
	kvx_lcore_parse_opt(c, "-l", "0-3", g_err, sizeof(g_err));
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), 0, "%s", g_err);
	cr_assert_eq(c->control.lcore_id, 4);
	cr_assert_eq(mask_of(&c->control.cpus), 0xf);

	/* Sharing requires the adaptive policy. */
	kvx_lcore_cfg_init(c);
	kvx_lcore_parse_opt(c, "-l", "1", g_err, sizeof(g_err));
	kvx_lcore_parse_opt(c, "--control-lcore", "0@1", g_err, sizeof(g_err));
	kvx_lcore_parse_opt(c, "--idle", "busy", g_err, sizeof(g_err));
	c->share_cpus = true;
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "adaptive"), "%s", g_err);
	c->idle = KVX_LCORE_IDLE_ADAPTIVE;
	cr_assert_eq(kvx_lcore_cfg_validate(c, &four, &four, g_err, sizeof(g_err)), 0, "%s", g_err);
	free(c);
}

Test(lcore_opts, host_validation_rejects_core_999)
{
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_parse_opt(c, "-l", "0,999", g_err, sizeof(g_err)), 1);
	cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "CPU 999"), "%s", g_err);
	free(c);
}

Test(lcore_opts, default_fits_this_machine_and_validates)
{
	cpu_set_t present, allowed;
	cr_assert_eq(kvx_lcore_host_cpus(&present, &allowed), 0);
	int a = CPU_COUNT(&allowed);
	for (unsigned n = 1; n <= 3; n++) {
		struct kvx_lcore_cfg *c = cfg_new();
		cr_assert_eq(kvx_lcore_cfg_default(c, n, 0, g_err, sizeof(g_err)), 0, "%s", g_err);
		cr_assert_eq(c->n_lcores, n);
		cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "n=%u: %s", n,
			     g_err);
		cr_assert_eq(c->control_mode, KVX_LCORE_CONTROL_EXPLICIT);
		if ((int)n + 1 <= a) {
			cr_assert_not(c->share_cpus, "enough CPUs: no sharing");
		} else {
			cr_assert(c->share_cpus, "n=%u on %d CPUs must share", n, a);
			cr_assert_eq(c->idle, KVX_LCORE_IDLE_ADAPTIVE);
		}
		free(c);
		c = cfg_new();
		cr_assert_eq(kvx_lcore_cfg_default(c, n, KVX_LCORE_DEFAULT_F_NO_CONTROL, g_err, sizeof(g_err)), 0);
		cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "%s", g_err);
		cr_assert_eq(c->control_mode, KVX_LCORE_CONTROL_NONE);
		free(c);
	}
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_cfg_default(c, 0, 0, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_eq(kvx_lcore_cfg_default(c, 1, 0x80, g_err, sizeof(g_err)), -EINVAL);
	free(c);
}

Test(lcore_opts, default_on_two_cpus_shares_with_adaptive)
{
	/* The grammar/validation split lets us check the 2-CPU rule on any host that has CPUs 0,1. */
	cpu_set_t present, allowed;
	kvx_lcore_host_cpus(&present, &allowed);
	if (CPU_COUNT(&allowed) != 2)
		cr_skip_test("this host has %d allowed CPUs, not 2", CPU_COUNT(&allowed));
	struct kvx_lcore_cfg *c = cfg_new();
	cr_assert_eq(kvx_lcore_cfg_default(c, 2, 0, g_err, sizeof(g_err)), 0);
	cr_assert(c->share_cpus);
	cr_assert_eq(c->idle, KVX_LCORE_IDLE_ADAPTIVE);
	cr_assert_eq(c->control.lcore_id, 0);
	cr_assert_eq(CPU_COUNT(&c->control.cpus), 2, "control floats on both CPUs");
	cr_assert_eq(c->lcores[0].lcore_id, 1);
	cr_assert_eq(c->lcores[1].lcore_id, 2);
	cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "%s", g_err);
	free(c);
}

Test(lcore_opts, from_strings_parses_and_validates)
{
	struct kvx_lcore_cfg *c = cfg_new();
	struct kvx_lcore_opts_str s = {.lcores = "0", .idle = "busy", .control_lcore = "none"};
	cr_assert_eq(kvx_lcore_cfg_from_strings(&s, 2, c, g_err, sizeof(g_err)), 0, "%s", g_err);
	cr_assert_eq(c->n_lcores, 1);
	cr_assert_eq(c->idle, KVX_LCORE_IDLE_BUSY);
	struct kvx_lcore_opts_str bad = {.lcores = "0,999"};
	cr_assert_eq(kvx_lcore_cfg_from_strings(&bad, 2, c, g_err, sizeof(g_err)), -EINVAL);
	cr_assert_not_null(strstr(g_err, "999"), "%s", g_err);
	struct kvx_lcore_opts_str none = {0};
	cr_assert_eq(kvx_lcore_cfg_from_strings(&none, 1, c, g_err, sizeof(g_err)), 0, "%s", g_err);
	cr_assert_eq(c->n_lcores, 1, "default set");
	free(c);
}

Test(lcore_opts, cpuset_format_compresses_ranges)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(0, &s);
	CPU_SET(2, &s);
	CPU_SET(5, &s);
	CPU_SET(6, &s);
	CPU_SET(7, &s);
	char buf[64];
	cr_assert_eq(kvx_lcore_cpuset_format(&s, buf, sizeof(buf)), 7);
	cr_assert_str_eq(buf, "0,2,5-7");
	char small[4];
	cr_assert_eq(kvx_lcore_cpuset_format(&s, small, sizeof(small)), 7);
	cr_assert_str_eq(small, "0,2");
}
