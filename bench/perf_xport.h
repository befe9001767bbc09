/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_PERF_XPORT_H
#define KVX_BENCH_PERF_XPORT_H
/*
 * Shared state of `kvxfer-perf bw` and `kvxfer-perf lat` (perf_bw.c holds options, the
 * out-of-band setup modelled on perftest (RUNTIME_GUIDE.md §7.2) and the bw loop;
 * perf_lat.c the latency loop).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvxfer/transport.h"

struct px_cfg {
	char transport[16];   /* tcp | shm | verbs | auto (resolved before setup) */
	enum kvx_xport_opcode mode;
	uint64_t size;        /* bytes; 0 = default */
	bool all;             /* -a: sweep 2 B .. 8 MiB */
	uint64_t iters;       /* 0 = default */
	double duration_s;    /* -D; 0 = iteration mode */
	uint32_t qps, batch, depth, chunk;
	int cpu_client, cpu_server; /* -1 = not pinned */
	uint16_t port;
	const char *json;
	const char *plot;     /* bw: --plot FILE.png (bandwidth vs size, gnuplot) */
	const char *host;
	const char *peer;     /* --peer cma|memcpy: the comparison loops, not kvxfer */
	bool local;
	bool output_bw;       /* --output=bandwidth (bw) / latency (lat) */
	bool lat;
};

struct px_sess {
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	struct kvx_xport_mr *lmr;
	struct kvx_xport_rmr *rmr;
	struct kvx_xport_caps caps;
	uint8_t *buf;
	uint64_t buflen;
};

/*
 * Validate the options px_main() cannot trust its own parser with, before anything runs:
 * -s/--size and --chunk (positive sizes), -n/--iters (a positive count >= 5; "-5" is an error,
 * not 2^64-5), and -l/--lcores A[,B] (each CPU through kvx_lcore_cfg_validate(), as `kvxfer-perf
 * ring` does). Prints one message naming the option and value. Returns 0, or 2 (usage error).
 */
int px_check_args(int argc, char **argv, bool lat);
/* Entry point shared by both subcommands. */
int px_main(int argc, char **argv, bool lat);
/* Latency of one size: fills the row and appends a JSON object to @p json (may be NULL). */
int px_lat_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, FILE *json, bool first);
/* Print the latency table header. */
void px_lat_header(const struct px_cfg *c);

#endif
