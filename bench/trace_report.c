/* SPDX-License-Identifier: Apache-2.0 */
/* Summary, JSON/CSV writers, gnuplot plot and progress line of `kvxfer-perf trace`. */
#include "trace_report.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "kvxfer/common.h"
#include "perf_util.h"

extern char **environ;

#define NS_PER_MS 1e6

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void perf_lat_stats_compute(uint64_t *ns, size_t n, struct perf_lat_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (n == 0)
		return;
	struct perf_stats ps;
	perf_stats_u64(ns, n, &ps);
	st->n = n;
	st->p50 = (double)ps.p50 / NS_PER_MS;
	st->p90 = (double)ps.p90 / NS_PER_MS;
	st->p99 = (double)ps.p99 / NS_PER_MS;
	st->max = (double)ps.max / NS_PER_MS;
	st->mean = ps.mean / NS_PER_MS;
}

int perf_trace_summarize(const struct perf_trace_rec *recs, size_t n, struct perf_trace_summary *s)
{
	memset(s, 0, sizeof(*s));
	uint64_t *lat = malloc((n ? n : 1) * sizeof(*lat));
	uint64_t *ttfl = malloc((n ? n : 1) * sizeof(*ttfl));
	if (!lat || !ttfl) {
		free(lat);
		free(ttfl);
		return -ENOMEM;
	}
	size_t nl = 0, nt = 0;
	uint64_t t0 = UINT64_MAX, t1 = 0;
	for (size_t i = 0; i < n; i++) {
		const struct perf_trace_rec *r = &recs[i];
		s->requests++;
		s->prompt_tokens += r->input_tokens;
		s->blocks += r->blocks;
		s->hit_blocks += r->hit_blocks;
		if (r->start_ns < t0)
			t0 = r->start_ns;
		if (r->status != 0 || r->end_ns == 0) {
			/* Its blocks did not (all) arrive: never counted as transferred. */
			s->failures++;
			s->lost_blocks += r->xfer_blocks;
			continue;
		}
		s->completed++;
		s->xfer_blocks += r->xfer_blocks;
		s->bytes += r->bytes;
		if (r->end_ns > t1)
			t1 = r->end_ns;
		lat[nl++] = r->end_ns - r->start_ns;
		if (r->first_layer_ns)
			ttfl[nt++] = r->first_layer_ns - r->start_ns;
	}
	if (t1 > t0 && t0 != UINT64_MAX) {
		s->wall_s = (double)(t1 - t0) / 1e9;
		s->gbps = (double)s->bytes / s->wall_s / 1e9;
	}
	perf_lat_stats_compute(lat, nl, &s->lat);
	perf_lat_stats_compute(ttfl, nt, &s->ttfl);
	free(lat);
	free(ttfl);
	return 0;
}

static void print_lat(FILE *f, const char *name, const struct perf_lat_stats *st)
{
	fprintf(f, "  %-22s p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  (mean %.3f, n=%zu)\n", name,
		st->p50, st->p90, st->p99, st->max, st->mean, st->n);
}

/* kvxfer's throughput / the --peer cma loop's, or -1 when either is unknown. */
static double peer_ratio(const struct perf_trace_summary *s, const struct perf_trace_counters *c)
{
	if (!c->peer || c->peer_status || c->peer_wall_s <= 0 || s->wall_s <= 0)
		return -1;
	return s->gbps / ((double)c->peer_bytes / c->peer_wall_s / 1e9);
}

static void print_peer(FILE *f, const struct perf_trace_summary *s, const struct perf_trace_counters *c)
{
	char name[32];
	snprintf(name, sizeof(name), "peer %s loop", c->peer);
	if (c->peer_status) {
		fprintf(f, "  %-22s n/a (failed: %s)\n", name, kvx_strerror(c->peer_status));
		return;
	}
	if (c->peer_wall_s <= 0) {
		fprintf(f, "  %-22s n/a (no measurable interval)\n", name);
		return;
	}
	fprintf(f, "  %-22s %.3f GB/s (%" PRIu64 " bytes%s; %.3f s, %" PRIu64 " calls, %" PRIu64
		   " iovecs)\n", name, (double)c->peer_bytes / c->peer_wall_s / 1e9, c->peer_bytes,
		c->peer_bytes == s->bytes ? ", as kvxfer's" : ", NOT kvxfer's", c->peer_wall_s,
		c->peer_calls, c->peer_iovs);
	double r = peer_ratio(s, c);
	if (r >= 0)
		fprintf(f, "  %-22s %.3fx\n", "kvxfer / peer", r);
	else
		fprintf(f, "  %-22s n/a\n", "kvxfer / peer");
}

/* Both engines' CPU seconds per GB moved, or -1 when a side is unknown or nothing moved. */
static double cpu_per_gb(const struct perf_trace_summary *s, const struct perf_trace_counters *c)
{
	if (c->engine_cpu_s[0] < 0 || c->engine_cpu_s[1] < 0 || !s->bytes)
		return -1;
	return (c->engine_cpu_s[0] + c->engine_cpu_s[1]) / ((double)s->bytes / 1e9);
}

void perf_trace_print_summary(FILE *f, const struct perf_trace_run_info *info,
			      const struct perf_trace_summary *s, const struct perf_trace_counters *c,
			      const struct perf_trace_rec *recs, size_t n)
{
	fprintf(f, "== kvxfer-perf trace: %s mode, transport %s ==\n", info->mode, info->transport);
	fprintf(f, "  %-22s %s (%s, bf16, %" PRIu64 " bytes/block of %u tokens)\n", "model", info->model,
		info->layout, info->block_bytes, info->block_tokens);
	fprintf(f, "  %-22s %s\n", "trace", info->trace);
	fprintf(f, "  %-22s %" PRIu64 " blocks per side; concurrency %u; speed %g%s; prefix cache %s\n",
		"pool", info->pool_blocks, info->concurrency, info->speed,
		info->speed == 0 ? " (back to back)" : "", info->prefix_cache ? "on" : "off");
	fprintf(f, "  %-22s %" PRIu64 " (%" PRIu64 " completed)\n", "requests", s->requests, s->completed);
	fprintf(f, "  %-22s %" PRIu64 "\n", "prompt tokens", s->prompt_tokens);
	fprintf(f, "  %-22s %" PRIu64 " (prefix hits %" PRIu64 ", transferred %" PRIu64, "blocks",
		s->blocks, s->hit_blocks, s->xfer_blocks);
	if (s->lost_blocks)
		fprintf(f, ", not transferred %" PRIu64 " (failed requests)", s->lost_blocks);
	fputs(")\n", f);
	if (info->skipped || info->streamed)
		fprintf(f, "  %-22s %" PRIu64 " skipped, %" PRIu64 " streamed in pool-sized pieces\n",
			"larger than the pool", info->skipped, info->streamed);
	fprintf(f, "  %-22s %" PRIu64 " (%.3f GB)\n", "bytes", s->bytes, (double)s->bytes / 1e9);
	/* Values that need a completed request are n/a, never 0, when none completed. */
	const char *na = s->completed ? "" : "n/a (no request completed)";
	if (s->wall_s > 0) {
		fprintf(f, "  %-22s %.3f s\n", "wall time", s->wall_s);
		fprintf(f, "  %-22s %.3f GB/s\n", "throughput", s->gbps);
	} else {
		fprintf(f, "  %-22s %s\n", "wall time", na[0] ? na : "n/a (no measurable interval)");
		fprintf(f, "  %-22s %s\n", "throughput", na[0] ? na : "n/a (no measurable interval)");
	}
	if (c->peer)
		print_peer(f, s, c);
	if (s->lat.n)
		print_lat(f, "latency ms", &s->lat);
	else
		fprintf(f, "  %-22s %s\n", "latency ms", na);
	if (s->ttfl.n)
		print_lat(f, "first layer ms", &s->ttfl);
	else
		fprintf(f, "  %-22s %s\n", "first layer ms",
			na[0] ? na : "n/a (no per-layer completion reported)");
	fprintf(f, "  %-22s", "lcore util");
	const char *side[2] = {"producer", "consumer"};
	for (int i = 0; i < 2; i++) {
		if (c->lcore_util[i] < 0)
			fprintf(f, " %s n/a", side[i]);
		else
			fprintf(f, " %s %.1f%%", side[i], 100.0 * c->lcore_util[i]);
	}
	fputc('\n', f);
	/* Which polling lcores moved the bytes: each one's share of its side's total. */
	fprintf(f, "  %-22s", "bytes per lcore");
	for (int i = 0; i < 2; i++) {
		uint64_t tot = 0;
		for (uint32_t k = 0; k < c->n_lcores[i]; k++)
			tot += c->lcore_bytes[i][k];
		fprintf(f, " %s", side[i]);
		if (!c->n_lcores[i])
			fputs(" n/a", f);
		for (uint32_t k = 0; k < c->n_lcores[i]; k++)
			fprintf(f, "%s%.0f%%", k ? "/" : " ", tot ? 100.0 * (double)c->lcore_bytes[i][k] / (double)tot : 0.0);
	}
	fputc('\n', f);
	fprintf(f, "  %-22s", "engine CPU s");
	for (int i = 0; i < 2; i++) {
		if (c->engine_cpu_s[i] < 0)
			fprintf(f, " %s n/a", side[i]);
		else
			fprintf(f, " %s %.3f", side[i], c->engine_cpu_s[i]);
	}
	double cpg = cpu_per_gb(s, c);
	if (cpg >= 0)
		fprintf(f, "  (%.3f s/GB)", cpg);
	fputc('\n', f);
	if (!c->ctl_reported[0] && !c->ctl_reported[1]) {
		fprintf(f, "  %-22s n/a (%s)\n", "control messages",
			!c->reported[0] && !c->reported[1] ? "neither role process reported its counters"
							   : "the engines did not report them");
	} else {
		fprintf(f, "  %-22s sent %" PRIu64 "  received %" PRIu64 "  dropped %" PRIu64,
			"control messages", c->ctl_sent, c->ctl_recv, c->ctl_dropped);
		for (int i = 0; i < 2; i++)
			if (!c->ctl_reported[i])
				fprintf(f, " (%s only: the %s %s)", side[1 - i], side[i],
					c->reported[i] ? "engine did not report them"
						       : "process did not report (died or was killed?)");
		fputc('\n', f);
	}
	fprintf(f, "  %-22s %" PRIu64 "\n", "failures", s->failures);
	if (s->failures) {
		fprintf(f, "  %-22s", "failed transfers");
		size_t shown = 0;
		for (size_t i = 0; i < n; i++) {
			if (recs[i].status == 0 && recs[i].end_ns)
				continue;
			if (shown++ == 32) {
				fprintf(f, " ...");
				break;
			}
			fprintf(f, " tx-%06" PRIu64 " (%s)", recs[i].idx,
				recs[i].status == -ETIMEDOUT ? "timed out"
				: recs[i].status            ? strerror(-recs[i].status)
							    : "not completed");
		}
		fputc('\n', f);
	}
	if (!c->verify_enabled)
		fprintf(f, "  %-22s off\n", "verification");
	else if (c->verify_bad == 0 && s->failures == 0)
		fprintf(f, "  %-22s OK (%s)\n", "verification",
			c->verify_bytes ? "every transferred byte checked"
					: "per-page stamps of every transferred block checked");
	else if (c->verify_bad)
		fprintf(f, "  %-22s FAILED (%" PRIu64 " corrupt block planes)\n", "verification",
			c->verify_bad);
	else
		fprintf(f, "  %-22s FAILED (%" PRIu64 " transfers failed before they could be verified)\n",
			"verification", s->failures);
}

/* A latency distribution, or null when it has no sample. */
static json_t *lat_json(const struct perf_lat_stats *st)
{
	if (st->n == 0)
		return json_null();
	return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "n", (json_int_t)st->n, "p50", st->p50,
			 "p90", st->p90, "p99", st->p99, "max", st->max, "mean", st->mean);
}

/* Control-message counters, or null when no side reported them; "sides" lists who did. */
static json_t *ctl_json(const struct perf_trace_counters *c)
{
	if (!c->ctl_reported[0] && !c->ctl_reported[1])
		return json_null();
	json_t *sides = json_array();
	if (c->ctl_reported[0])
		json_array_append_new(sides, json_string("producer"));
	if (c->ctl_reported[1])
		json_array_append_new(sides, json_string("consumer"));
	return json_pack("{s:I, s:I, s:I, s:o}", "sent", (json_int_t)c->ctl_sent, "received",
			 (json_int_t)c->ctl_recv, "dropped", (json_int_t)c->ctl_dropped, "sides", sides);
}

/* A fraction, or null when unknown (< 0). */
static json_t *frac_json(double v)
{
	return v < 0 ? json_null() : json_real(v);
}

/* A time in ms since the run's epoch, or null when it never happened (0). */
static json_t *ms_json(uint64_t ns)
{
	return ns ? json_real((double)ns / NS_PER_MS) : json_null();
}

/* Header: what produced the file, where, when, with which command line. */
static json_t *header_json(const struct perf_trace_run_info *info)
{
	char host[256] = "";
	if (gethostname(host, sizeof(host) - 1))
		snprintf(host, sizeof(host), "unknown");
	char when[32] = "";
	time_t now = time(NULL);
	struct tm tm;
	if (gmtime_r(&now, &tm))
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	json_t *opts = json_array();
	for (int i = 1; opts && i < info->argc; i++)
		json_array_append_new(opts, json_string(info->argv[i]));
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "tool", "kvxfer-perf trace", "version",
			 perf_version(), "commit", perf_commit(), "host", host, "time", when,
			 "options", opts ? opts : json_null());
}

int perf_trace_write_json(const char *path, const struct perf_trace_run_info *info,
			  const struct perf_trace_summary *s, const struct perf_trace_counters *c,
			  const struct perf_trace_rec *recs, size_t n)
{
	json_t *reqs = json_array();
	if (!reqs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const struct perf_trace_rec *r = &recs[i];
		json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:o, s:o, s:i}",
				      "idx", (json_int_t)r->idx, "line", (json_int_t)r->line,
				      "input_tokens", (json_int_t)r->input_tokens, "blocks",
				      (json_int_t)r->blocks, "hit_blocks", (json_int_t)r->hit_blocks,
				      "xfer_blocks", (json_int_t)r->xfer_blocks, "bytes",
				      (json_int_t)r->bytes, "arrival_ms", (double)r->arrival_ns / NS_PER_MS,
				      "start_ms", (double)r->start_ns / NS_PER_MS, "first_layer_ms",
				      ms_json(r->first_layer_ns), "end_ms", ms_json(r->end_ns),
				      "status", r->status);
		if (!o || json_array_append_new(reqs, o)) {
			json_decref(reqs);
			return -ENOMEM;
		}
	}
	json_t *root = json_pack(
		"{s:s, s:o, s:{s:s, s:s, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:f, s:b, s:I, s:I}, "
		"s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:o, "
		"s:[o,o], s:o, s:s, s:s, s:I}, s:o}",
		"command", "trace", "kvxfer_perf", header_json(info), "run", "model", info->model, "layout", info->layout, "trace", info->trace, "mode",
		info->mode, "transport", info->transport, "block_tokens", (int)info->block_tokens,
		"block_bytes", (json_int_t)info->block_bytes, "pool_blocks",
		(json_int_t)info->pool_blocks, "concurrency", (int)info->concurrency, "speed",
		info->speed, "prefix_cache", info->prefix_cache, "skipped_oversize",
		(json_int_t)info->skipped, "streamed_oversize", (json_int_t)info->streamed,
		"summary", "requests", (json_int_t)s->requests, "completed", (json_int_t)s->completed,
		"failures", (json_int_t)s->failures, "prompt_tokens", (json_int_t)s->prompt_tokens,
		"blocks", (json_int_t)s->blocks, "hit_blocks", (json_int_t)s->hit_blocks,
		"xfer_blocks", (json_int_t)s->xfer_blocks, "lost_blocks", (json_int_t)s->lost_blocks,
		"bytes", (json_int_t)s->bytes, "wall_s",
		s->wall_s > 0 ? json_real(s->wall_s) : json_null(), "throughput_gbps",
		s->wall_s > 0 ? json_real(s->gbps) : json_null(), "latency_ms", lat_json(&s->lat),
		"first_layer_ms", lat_json(&s->ttfl), "lcore_util", frac_json(c->lcore_util[0]),
		frac_json(c->lcore_util[1]),
		"control_messages", ctl_json(c), "verification",
		!c->verify_enabled ? "off" : (c->verify_bad == 0 && s->failures == 0 ? "OK" : "FAILED"),
		"verify_mode", !c->verify_enabled ? "off" : c->verify_bytes ? "bytes" : "stamps",
		"verify_bad_planes", (json_int_t)c->verify_bad,
		"requests", reqs);
	if (!root)
		return -ENOMEM;
	/* Engine CPU ([producer, consumer] seconds, and both per GB: issue 16's CPU/GB figure). */
	json_t *sum = json_object_get(root, "summary");
	double cpg = cpu_per_gb(s, c);
	json_object_set_new(sum, "engine_cpu_s",
			    json_pack("[o,o]", frac_json(c->engine_cpu_s[0]), frac_json(c->engine_cpu_s[1])));
	json_object_set_new(sum, "engine_cpu_s_per_gb", frac_json(cpg));
	json_t *lb = json_array();
	for (int i = 0; i < 2; i++) {
		json_t *a = c->n_lcores[i] ? json_array() : json_null();
		for (uint32_t k = 0; k < c->n_lcores[i]; k++)
			json_array_append_new(a, json_integer((json_int_t)c->lcore_bytes[i][k]));
		json_array_append_new(lb, a);
	}
	json_object_set_new(sum, "lcore_bytes", lb);
	if (c->peer) {
		/* --peer: the streaming process_vm_readv/writev or socket loop over the same bytes. */
		bool ok = !c->peer_status && c->peer_wall_s > 0;
		json_object_set_new(sum, "peer", json_pack("{s:s, s:i, s:I, s:b, s:o, s:o, s:I, s:I}",
			"kind", c->peer, "status", c->peer_status, "bytes", (json_int_t)c->peer_bytes,
			"same_bytes", c->peer_bytes == s->bytes, "wall_s", ok ? json_real(c->peer_wall_s) : json_null(),
			"throughput_gbps", ok ? json_real((double)c->peer_bytes / c->peer_wall_s / 1e9) : json_null(),
			"calls", (json_int_t)c->peer_calls, "iovecs", (json_int_t)c->peer_iovs));
		json_object_set_new(sum, "vs_peer", frac_json(peer_ratio(s, c)));
	}
	FILE *f = perf_out_open(path);
	int rc = f ? json_dumpf(root, f, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : -1;
	if (f && !rc)
		fputc('\n', f);
	if (f && perf_out_close(f))
		rc = -1;
	json_decref(root);
	if (rc) {
		fprintf(stderr, "kvxfer-perf trace: cannot write --json file %s\n", path);
		return -EIO;
	}
	return 0;
}

int perf_trace_write_csv(const char *path, const struct perf_trace_rec *recs, size_t n)
{
	FILE *f = perf_out_open(path);
	if (!f) {
		fprintf(stderr, "kvxfer-perf trace: cannot write --csv file %s: %s\n", path, strerror(errno));
		return -EIO;
	}
	fprintf(f, "idx,line,input_tokens,blocks,hit_blocks,xfer_blocks,bytes,arrival_ms,start_ms,"
		   "first_layer_ms,end_ms,latency_ms,status\n");
	for (size_t i = 0; i < n; i++) {
		const struct perf_trace_rec *r = &recs[i];
		fprintf(f, "%" PRIu64 ",%u,%u,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%.3f,%.3f,",
			r->idx, r->line, r->input_tokens, r->blocks, r->hit_blocks, r->xfer_blocks,
			r->bytes, (double)r->arrival_ns / NS_PER_MS, (double)r->start_ns / NS_PER_MS);
		if (r->first_layer_ns)
			fprintf(f, "%.3f", (double)r->first_layer_ns / NS_PER_MS);
		fputc(',', f);
		if (r->end_ns)
			fprintf(f, "%.3f,%.3f", (double)r->end_ns / NS_PER_MS,
				(double)(r->end_ns - r->start_ns) / NS_PER_MS);
		else
			fputc(',', f);
		fprintf(f, ",%d\n", r->status);
	}
	if (perf_out_close(f)) {
		fprintf(stderr, "kvxfer-perf trace: cannot write --csv file %s\n", path);
		return -EIO;
	}
	return 0;
}

/* Run `gnuplot SCRIPT`; 0, -ENOENT (not installed) or -EIO. */
static int run_gnuplot(char *script)
{
	char *argv[] = {"gnuplot", script, NULL};
	pid_t pid;
	int err = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
	if (err) {
		fprintf(stderr, "kvxfer-perf: cannot run gnuplot (%s); install gnuplot-nox\n", strerror(err));
		return err == ENOENT ? -ENOENT : -EIO;
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -EIO;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "kvxfer-perf: gnuplot failed on %s\n", script);
		return -EIO;
	}
	return 0;
}

int perf_plot_bw_sweep(const char *png_path, const char *title, const uint64_t *sizes,
		       const double *gbps, const char *const *names, size_t n, size_t n_series)
{
	if (n == 0 || n_series == 0 || n_series > 8)
		return -EINVAL;
	size_t plen = strlen(png_path) + 8;
	char *dat = malloc(plen), *gp = malloc(plen);
	int rc = -EIO;
	FILE *f = NULL;
	if (!dat || !gp) {
		rc = -ENOMEM;
		goto out;
	}
	snprintf(dat, plen, "%s.dat", png_path);
	snprintf(gp, plen, "%s.gp", png_path);
	f = fopen(dat, "w");
	if (!f)
		goto io;
	fprintf(f, "# bytes");
	for (size_t s = 0; s < n_series; s++)
		fprintf(f, " %s_GBps", names[s]);
	fputc('\n', f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%" PRIu64, sizes[i]);
		for (size_t s = 0; s < n_series; s++)
			fprintf(f, " %.6f", gbps[s * n + i]);
		fputc('\n', f);
	}
	if (fclose(f)) {
		f = NULL;
		goto io;
	}
	f = fopen(gp, "w");
	if (!f)
		goto io;
	fprintf(f,
		"set terminal pngcairo size 900,550 noenhanced\n"
		"set output '%s'\nset title '%s'\nset grid\nset logscale x 2\n"
		"set format x '%%.0b%%B'\nset xlabel 'message size (bytes)'\nset ylabel 'GB/s'\n"
		"set yrange [0:*]\nset key top left\nplot ",
		png_path, title);
	for (size_t s = 0; s < n_series; s++)
		fprintf(f, "%s'%s' using 1:%zu with linespoints lw 2 title '%s'", s ? ", " : "", dat,
			s + 2, names[s]);
	fputc('\n', f);
	if (fclose(f)) {
		f = NULL;
		goto io;
	}
	f = NULL;
	rc = run_gnuplot(gp);
	goto out;
io:
	fprintf(stderr, "kvxfer-perf: cannot write plot files next to %s: %s\n", png_path, strerror(errno));
out:
	if (f)
		fclose(f);
	free(dat);
	free(gp);
	return rc;
}

/* Bin count for the throughput-over-time panel. */
#define PLOT_BINS 60

int perf_trace_plot(const char *png_path, const struct perf_trace_run_info *info,
		    const struct perf_trace_rec *recs, size_t n)
{
	size_t plen = strlen(png_path) + 8;
	char *dat = malloc(plen), *gp = malloc(plen);
	double *lat = malloc((n ? n : 1) * sizeof(double));
	double bins[PLOT_BINS] = {0};
	int rc = -EIO;
	FILE *f = NULL;
	if (!dat || !gp || !lat) {
		rc = -ENOMEM;
		goto out;
	}
	snprintf(dat, plen, "%s.dat", png_path);
	snprintf(gp, plen, "%s.gp", png_path);
	size_t nl = 0;
	uint64_t t1 = 0;
	for (size_t i = 0; i < n; i++) {
		if (recs[i].status || !recs[i].end_ns)
			continue;
		lat[nl++] = (double)(recs[i].end_ns - recs[i].start_ns) / NS_PER_MS;
		if (recs[i].end_ns > t1)
			t1 = recs[i].end_ns;
	}
	qsort(lat, nl, sizeof(*lat), cmp_double);
	/* Throughput over time: each request's bytes spread evenly over [start, end]. */
	double bin_ns = t1 ? (double)t1 / PLOT_BINS : 1;
	for (size_t i = 0; i < n; i++) {
		const struct perf_trace_rec *r = &recs[i];
		if (r->status || !r->end_ns || r->end_ns <= r->start_ns)
			continue;
		double a = (double)r->start_ns, b = (double)r->end_ns, rate = (double)r->bytes / (b - a);
		for (int k = (int)(a / bin_ns); k < PLOT_BINS && k * bin_ns < b; k++) {
			double lo = fmax(a, k * bin_ns), hi = fmin(b, (k + 1) * bin_ns);
			if (hi > lo)
				bins[k] += rate * (hi - lo);
		}
	}
	f = fopen(dat, "w");
	if (!f)
		goto io;
	fprintf(f, "# latency CDF: latency_ms fraction\n");
	for (size_t i = 0; i < nl; i++)
		fprintf(f, "%.4f %.6f\n", lat[i], (double)(i + 1) / (double)nl);
	fprintf(f, "\n\n# throughput: time_s GB/s\n");
	for (int k = 0; k < PLOT_BINS; k++)
		fprintf(f, "%.4f %.4f\n", (k + 0.5) * bin_ns / 1e9, bins[k] / (bin_ns / 1e9) / 1e9);
	if (fclose(f)) {
		f = NULL;
		goto io;
	}
	f = fopen(gp, "w");
	if (!f)
		goto io;
	fprintf(f,
		"set terminal pngcairo size 1400,500 noenhanced\n"
		"set output '%s'\n"
		"set multiplot layout 1,2 title '%s %s, %s, %s'\n"
		"set grid\nset key off\n"
		"set title 'per-request transfer latency CDF'\nset xlabel 'latency (ms)'\n"
		"set ylabel 'fraction of requests'\nset yrange [0:1]\n"
		"plot '%s' index 0 using 1:2 with steps lw 2\n"
		"set title 'throughput over time'\nset xlabel 'time since start (s)'\n"
		"set ylabel 'GB/s'\nset yrange [0:*]\n"
		"plot '%s' index 1 using 1:2 with linespoints lw 2\n"
		"unset multiplot\n",
		png_path, info->model, info->mode, info->transport, info->trace, dat, dat);
	if (fclose(f)) {
		f = NULL;
		goto io;
	}
	f = NULL;
	rc = run_gnuplot(gp);
	goto out;
io:
	fprintf(stderr, "kvxfer-perf trace: cannot write plot files next to %s: %s\n", png_path,
		strerror(errno));
out:
	if (f)
		fclose(f);
	free(dat);
	free(gp);
	free(lat);
	return rc;
}

void perf_progress_init(struct perf_progress *p, FILE *f, uint64_t start_ns)
{
	memset(p, 0, sizeof(*p));
	p->f = f;
	p->start_ns = start_ns;
	p->tty = isatty(fileno(f));
	p->period_ns = p->tty ? 250000000u : 2000000000u;
}

void perf_progress_update(struct perf_progress *p, uint64_t now_ns, uint64_t done, uint64_t total,
			  uint64_t bytes)
{
	if (now_ns - p->start_ns < 2000000000u)
		return;
	uint64_t since = p->last_ns ? p->last_ns : p->start_ns;
	if (now_ns - since < p->period_ns)
		return;
	double dt = (double)(now_ns - since) / 1e9;
	double cur = (double)(bytes - p->last_bytes) / dt / 1e9;
	fprintf(p->f, "%s  progress: %" PRIu64 "/%" PRIu64 " requests, %.2f GB moved, %.2f GB/s now%s",
		p->tty ? "\r" : "", done, total, (double)bytes / 1e9, cur, p->tty ? "   " : "\n");
	fflush(p->f);
	p->last_ns = now_ns;
	p->last_bytes = bytes;
	p->printed = true;
}

void perf_progress_finish(struct perf_progress *p)
{
	if (p->printed && p->tty)
		fputc('\n', p->f);
	p->printed = false;
}
