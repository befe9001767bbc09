/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf lat: latency of one outstanding READ or WRITE op, perftest ib_*_lat style
 * (RUNTIME_GUIDE.md §7.3). Latency is post-to-completion of a one-sided op (as ib_read_lat
 * reports its READ round trip), in microseconds.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "perf_util.h"
#include "perf_xport.h"

#define RESULT_LINE "---------------------------------------------------------------------------------------\n"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

void px_lat_header(const struct px_cfg *c)
{
	if (c->output_bw)
		return;
	printf(RESULT_LINE);
	printf(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
	       "t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec] \n");
}

int px_lat_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, FILE *json, bool first)
{
	uint64_t iters = c->iters ? c->iters : 1000;
	uint64_t cap = c->duration_s > 0 ? 10000000 : iters;
	uint64_t *t = malloc(cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	struct kvx_xport_op op = {.lmr = s->lmr, .rmr = s->rmr, .loff = 0, .roff = 0, .len = size};
	struct kvx_xport_cpl cpl;
	uint64_t warm = 16, n = 0;
	uint64_t end_ns = c->duration_s > 0 ? kvx_now_ns() + (uint64_t)(c->duration_s * 1e9) : 0;
	for (uint64_t i = 0;; i++) {
		/* -D stops only once at least one timed sample exists (min/avg/percentiles
		 * of zero samples are undefined). */
		if (end_ns ? (n && kvx_now_ns() >= end_ns) || n == cap : n == iters)
			break;
		uint64_t t0 = kvx_now_ns();
		int rc = kvx_xport_post_bulk(s->ep, c->mode, &op, 1, i);
		if (rc) {
			fprintf(stderr, "kvxfer-perf lat: post: %s\n", kvx_strerror(rc));
			free(t);
			return rc;
		}
		while (kvx_xport_poll_burst(s->ep, &cpl, 1) == 0)
			;
		uint64_t t1 = kvx_now_ns();
		if (cpl.status) {
			fprintf(stderr, "kvxfer-perf lat: op failed: %s\n", kvx_strerror(cpl.status));
			free(t);
			return cpl.status;
		}
		if (i >= warm)
			t[n++] = t1 - t0;
	}
	qsort(t, n, sizeof(*t), cmp_u64);
	double sum = 0, sq = 0;
	for (uint64_t i = 0; i < n; i++)
		sum += (double)t[i];
	double avg = sum / (double)n;
	for (uint64_t i = 0; i < n; i++)
		sq += ((double)t[i] - avg) * ((double)t[i] - avg);
	double sd = sqrt(sq / (double)n);
	double us = 1e-3;
	double p99 = (double)t[(uint64_t)((double)(n - 1) * 0.99)];
	double p999 = (double)t[(uint64_t)((double)(n - 1) * 0.999)];
	double typ = (double)t[n / 2];
	if (c->output_bw)
		printf("%lf\n", typ * us);
	else
		printf(" %-7llu %-10llu      %-7.2f        %-7.2f      %-7.2f          %-7.2f        "
		       "%-7.2f          %-7.2f                 %-7.2f\n",
		       (unsigned long long)size, (unsigned long long)n, (double)t[0] * us,
		       (double)t[n - 1] * us, typ * us, avg * us, sd * us, p99 * us, p999 * us);
	if (json)
		fprintf(json,
			"%s    {\"bytes\": %llu, \"iterations\": %llu, \"t_min_us\": %.3f, \"t_max_us\": %.3f, "
			"\"t_typical_us\": %.3f, \"t_avg_us\": %.3f, \"t_stdev_us\": %.3f, "
			"\"p99_us\": %.3f, \"p99_9_us\": %.3f}",
			first ? "" : ",\n", (unsigned long long)size, (unsigned long long)n,
			(double)t[0] * us, (double)t[n - 1] * us, typ * us, avg * us, sd * us, p99 * us,
			p999 * us);
	free(t);
	return 0;
}

static int check_size(const char *sub, const char *opt, const char *v, uint64_t lo, uint64_t hi,
		      const char *what)
{
	uint64_t x;
	if (perf_parse_size(v, &x) || x < lo || x > hi) {
		fprintf(stderr, "kvxfer-perf %s: %s '%s': expected %s\n", sub, opt, v, what);
		return 2;
	}
	return 0;
}

static int check_lcores(const char *sub, const char *v)
{
	char *end, err[256] = "";
	long cpu[2] = {-1, -1};
	int n = 0;
	const char *p = v;
	for (;;) {
		if (*p < '0' || *p > '9')
			goto bad;
		errno = 0;
		cpu[n++] = strtol(p, &end, 10);
		if (errno)
			goto bad;
		if (*end == '\0')
			break;
		if (n == 2 || (*end != ',' && *end != '-'))
			goto bad;
		p = end + 1;
	}
	for (int i = 0; i < n; i++) {
		if (cpu[i] >= CPU_SETSIZE) {
			fprintf(stderr, "kvxfer-perf %s: -l '%s': CPU %ld does not exist on this host\n",
				sub, v, cpu[i]);
			return 2;
		}
		if (perf_check_cpu(cpu[i], err, sizeof(err))) {
			fprintf(stderr, "kvxfer-perf %s: -l '%s': %s\n", sub, v, err);
			return 2;
		}
	}
	return 0;
bad:
	fprintf(stderr, "kvxfer-perf %s: -l '%s': expected CPU or CPU,CPU\n", sub, v);
	return 2;
}

int px_check_args(int argc, char **argv, bool lat)
{
	/* Same option table as px_main's parser (perf_bw.c): which options take a value. */
	enum { O_QPS = 256, O_BATCH, O_DEPTH, O_CHUNK, O_JSON, O_OUTPUT, O_LOCAL, O_PEER, O_MEM, O_PLOT };
	static const struct option opts[] = {
		{"transport", required_argument, NULL, 't'}, {"mode", required_argument, NULL, 'm'},
		{"size", required_argument, NULL, 's'},      {"all", no_argument, NULL, 'a'},
		{"iters", required_argument, NULL, 'n'},     {"duration", required_argument, NULL, 'D'},
		{"qps", required_argument, NULL, O_QPS},     {"batch", required_argument, NULL, O_BATCH},
		{"tx-depth", required_argument, NULL, O_DEPTH},
		{"chunk", required_argument, NULL, O_CHUNK}, {"lcores", required_argument, NULL, 'l'},
		{"port", required_argument, NULL, 'p'},      {"json", required_argument, NULL, O_JSON},
		{"output", required_argument, NULL, O_OUTPUT},
		{"local", no_argument, NULL, O_LOCAL},       {"peer", required_argument, NULL, O_PEER},
		{"mem", required_argument, NULL, O_MEM},     {"plot", required_argument, NULL, O_PLOT},
		{"help", no_argument, NULL, 'h'},            {0, 0, 0, 0},
	};
	const char *sub = lat ? "lat" : "bw";
	int o, rc = 0, saved_opterr = opterr;
	opterr = 0; /* unknown options are px_main's to report */
	optind = 0;
	while (!rc && (o = getopt_long(argc, argv, "t:m:s:an:D:l:p:h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			rc = check_size(sub, "-s", optarg, 1, 1ull << 30, "1 .. 1G bytes");
			break;
		case 'n':
			rc = check_size(sub, "-n", optarg, 5, UINT64_MAX / 2,
					"a positive iteration count >= 5");
			break;
		case O_CHUNK:
			rc = check_size(sub, "--chunk", optarg, 4096, 16u << 20, "4K..16M");
			break;
		case 'l':
			rc = check_lcores(sub, optarg);
			break;
		default:
			break;
		}
	}
	opterr = saved_opterr;
	optind = 0;
	return rc;
}

int kvx_perf_lat_main(int argc, char **argv)
{
	int rc = px_check_args(argc, argv, true);
	return rc ? rc : px_main(argc, argv, true);
}
