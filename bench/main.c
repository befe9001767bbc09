/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf: dispatch to the subcommand named by argv[1].
 * Conventions shared by every subcommand (handled here once, so they cannot drift apart):
 * - `-V` / `--version` anywhere on the command line prints the version and exits 0;
 * - `--json -` (or `--csv -`) writes that file to stdout, and everything the subcommand prints
 *   for humans goes to stderr instead (perf_stdout_claim()), so stdout stays machine-readable;
 * - exit codes: 0 success, 1 a failed run, 2 a usage error (every subcommand).
 */
#include <stdio.h>
#include <string.h>

#include "perf.h"
#include "perf_util.h"

struct subcmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
};

static void usage(FILE *f, const struct subcmd *cmds, size_t n)
{
	fprintf(f, "usage: kvxfer-perf <command> [options]   (kvxfer-perf <command> --help)\n"
		   "       kvxfer-perf -V | --version\n\ncommands:\n");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "  %-7s %s%s\n", cmds[i].name, cmds[i].help, cmds[i].fn ? "" : " [not built]");
	fprintf(f, "\nEvery command: --json FILE ('-' = stdout, the text output then goes to stderr),\n"
		   "-V/--version; exit 0 = success, 1 = failed run, 2 = usage error.\n"
		   "Data (models.csv, traces/): %s\n", perf_data_dir());
}

static void version(void)
{
	printf("kvxfer-perf %s (commit %s)\n", perf_version(), perf_commit());
}

/* Does the subcommand's command line ask for stdout output (`--json -`, `--json=-`, ...)? */
static bool wants_stdout(int argc, char **argv)
{
	static const char *const opts[] = {"--json", "--csv"};
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			break;
		for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
			size_t l = strlen(opts[k]);
			if (strncmp(argv[i], opts[k], l))
				continue;
			if (!strcmp(argv[i] + l, "=-") || (!argv[i][l] && i + 1 < argc && !strcmp(argv[i + 1], "-")))
				return true;
		}
	}
	return false;
}

int main(int argc, char **argv)
{
	const struct subcmd cmds[] = {
		{"ring", kvx_perf_ring_main, "ring throughput and cross-core latency vs cds_wfcq and a mutex queue"},
		{"notify", kvx_perf_notify_main, "control-plane notification round trip and handshake time"},
		{"bw", kvx_perf_bw_main, "provider bandwidth, perftest-style (ib_*_bw columns)"},
		{"lat", kvx_perf_lat_main, "provider latency, perftest-style (ib_*_lat columns)"},
		{"plan", kvx_perf_plan_main, "time to plan block offsets for a model's KV layout"},
		{"trace", kvx_perf_trace_main, "replay a real request trace with a real model's KV layout"},
		{"idle", kvx_perf_idle_main, "CPU of an idle engine and first-post latency from idle"},
		{"keygen", kvx_perf_keygen_main, "create an --auth-dir: CURVE key pair + allowed/ (issue 17)"},
	};
	size_t n = sizeof(cmds) / sizeof(cmds[0]);
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout, cmds, n);
		return argc < 2 ? 2 : 0;
	}
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
		if (!strcmp(argv[i], "-V") || !strcmp(argv[i], "--version")) {
			version();
			return 0;
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (strcmp(argv[1], cmds[i].name))
			continue;
		if (!cmds[i].fn) {
			fprintf(stderr, "kvxfer-perf: command '%s' is not built in this binary\n", argv[1]);
			return 2;
		}
		if (wants_stdout(argc - 1, argv + 1) && perf_stdout_claim()) {
			fprintf(stderr, "kvxfer-perf: cannot set up stdout for '-' output\n");
			return 1;
		}
		return cmds[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "kvxfer-perf: unknown command '%s'\n", argv[1]);
	usage(stderr, cmds, n);
	return 2;
}
