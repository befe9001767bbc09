/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer-perf: dispatch to the subcommand named by argv[1]. */
#include <stdio.h>
#include <string.h>

#include "perf.h"

struct subcmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
};

static void usage(FILE *f, const struct subcmd *cmds, size_t n)
{
	fprintf(f, "usage: kvxfer-perf <command> [options]   (kvxfer-perf <command> --help)\n\ncommands:\n");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "  %-7s %s%s\n", cmds[i].name, cmds[i].help, cmds[i].fn ? "" : " [not built]");
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
		{"keygen", kvx_perf_keygen_main, "create an --auth-dir: CURVE key pair + allowed/ (issue 17)"},
	};
	size_t n = sizeof(cmds) / sizeof(cmds[0]);
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout, cmds, n);
		return argc < 2 ? 2 : 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (strcmp(argv[1], cmds[i].name))
			continue;
		if (!cmds[i].fn) {
			fprintf(stderr, "kvxfer-perf: command '%s' is not built in this binary\n", argv[1]);
			return 2;
		}
		return cmds[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "kvxfer-perf: unknown command '%s'\n", argv[1]);
	usage(stderr, cmds, n);
	return 2;
}
