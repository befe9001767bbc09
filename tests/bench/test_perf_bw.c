/* SPDX-License-Identifier: Apache-2.0 */
/*
 * End to end: `kvxfer-perf bw --local` and `kvxfer-perf lat --local` as real processes (client
 * and server threads) on loopback, checking that every printed number is finite and consistent
 * (peak >= average, average = message rate x size, latency percentiles between min and max). No
 * test here asserts a speed or compares one with a clock: how fast the machine moves bytes is
 * measured by `kvxfer-perf bw --peer memcpy` and bench/compare.sh, as ratios.
 */
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "perf_run.h"

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_bw, .timeout = 240.0);

struct run {
	int status;
	char out[16384];
	char err[8192];
};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Run kvxfer-perf with args (NULL-terminated); capture stdout and stderr (perf_run.h; a run
 * still going at the suite's timeout is killed). */
static void run_perf(struct run *r, const char *const *args)
{
	perf_run_into(&r->status, r->out, sizeof(r->out), r->err, sizeof(r->err), KVX_PERF_BIN, NULL, 240000,
		      args);
}

/* shm needs CMA (ptrace permission); the provider names the sysctl when it is refused. */
static void skip_if_no_cma(const struct run *r)
{
	if (r->status && strstr(r->err, "ptrace_scope"))
		cr_skip_test("shm: CMA not permitted here: %s", r->err);
}

/* The first data row under the header line starting with `hdr`. */
static const char *row_after(const char *out, const char *hdr)
{
	const char *h = strstr(out, hdr);
	cr_assert_not_null(h, "no '%s' header in:\n%s", hdr, out);
	const char *nl = strchr(h, '\n');
	cr_assert_not_null(nl);
	return nl + 1;
}

static void check_bw(const char *transport, const char *size_arg, uint64_t size, const char *n_arg,
		     uint64_t n)
{
	const char *args[] = {"bw", "--local", "-t", transport, "-s", size_arg, "-n", n_arg, NULL};
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "bw -t %s -s %s -n %s exited %d:\n%s\n%s", transport, size_arg,
		     n_arg, r->status, r->out, r->err);
	const char *row = row_after(r->out, " #bytes     #iterations    BW peak[GB/s]");
	unsigned long long bytes, iters;
	double peak, avg, mpps;
	cr_assert_eq(sscanf(row, "%llu %llu %lf %lf %lf", &bytes, &iters, &peak, &avg, &mpps), 5,
		     "unparsable row: %s", row);
	cr_assert_eq(bytes, size);
	cr_assert_eq(iters, n);
	cr_assert(isfinite(peak) && isfinite(avg) && isfinite(mpps), "non-finite: %s", row);
	/* GB/s are printed with 2 decimals: on a loaded machine 5 x 64 KiB can take long enough to
	 * print 0.00, so only MsgRate (6 decimals) must be non-zero; the checks below tie avg to it. */
	cr_assert(peak >= 0 && avg >= 0 && mpps > 0, "negative or zero rate: %s", row);
	/* Both printed with 2 decimals from peak >= avg: rounding keeps the order. */
	cr_assert_geq(peak, avg, "peak %.2f < average %.2f", peak, avg);
	/* MsgRate and average are the same ops over the same interval: avg = mpps * size / 1e3
	 * (up to the printed rounding of avg, 0.005 GB/s, and of mpps, 5e-7 Mpps). */
	double tol = 0.0051 + 5e-7 * (double)size / 1e3 + 1e-6 * avg;
	cr_assert(fabs(avg - mpps * (double)size / 1e3) <= tol, "avg %.4f vs mpps %.6f x %llu B",
		  avg, mpps, (unsigned long long)size);
	free(r);
}

Test(bench_perf_bw, tcp_finite_bounded_with_5_iters)
{
	check_bw("tcp", "65536", 65536, "5", 5);
}

Test(bench_perf_bw, tcp_finite_bounded_with_10_iters)
{
	check_bw("tcp", "65536", 65536, "10", 10);
}

Test(bench_perf_bw, tcp_finite_bounded_with_8m_size)
{
	check_bw("tcp", "8M", 8u << 20, "10", 10);
}

Test(bench_perf_bw, shm_finite_bounded_with_5_iters)
{
	check_bw("shm", "65536", 65536, "5", 5);
}

Test(bench_perf_bw, shm_finite_bounded_with_10_iters)
{
	check_bw("shm", "65536", 65536, "10", 10);
}

Test(bench_perf_bw, shm_finite_bounded_with_100_iters)
{
	check_bw("shm", "65536", 65536, "100", 100);
}

Test(bench_perf_bw, shm_finite_bounded_with_8m_size)
{
	check_bw("shm", "8M", 8u << 20, "10", 10);
}

/* Duration mode: the iteration count is whatever completed; the same bounds hold. */
Test(bench_perf_bw, shm_finite_bounded_with_duration)
{
	const char *args[] = {"bw", "--local", "-t", "shm", "-D", "0.2", NULL};
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "exited %d:\n%s\n%s", r->status, r->out, r->err);
	const char *row = row_after(r->out, " #bytes     #iterations    BW peak[GB/s]");
	unsigned long long bytes, iters;
	double peak, avg, mpps;
	cr_assert_eq(sscanf(row, "%llu %llu %lf %lf %lf", &bytes, &iters, &peak, &avg, &mpps), 5);
	cr_assert_eq(bytes, 65536);
	cr_assert_gt(iters, 0);
	cr_assert(isfinite(peak) && isfinite(avg) && peak > 0 && avg > 0, "row: %s", row);
	cr_assert_geq(peak, avg);
	free(r);
}

/* Duration mode with batches: posting may stop when every op has already completed (shm
 * completes small ops at once); the phase must still end. The old loop waited for a completion
 * that never came, in about 4 of 10 runs of exactly this command. */
Test(bench_perf_bw, shm_duration_batch_32_always_ends)
{
	const char *args[] = {"bw", "--local", "-t", "shm", "-s", "64", "--batch", "32", "-D", "0.001", NULL};
	for (int i = 0; i < 10; i++) {
		struct run *r = calloc(1, sizeof(*r));
		run_perf(r, args);
		skip_if_no_cma(r);
		cr_assert_eq(r->status, 0, "run %d exited %d:\n%s\n%s", i, r->status, r->out, r->err);
		const char *row = row_after(r->out, " #bytes     #iterations    BW peak[GB/s]");
		unsigned long long bytes, iters;
		cr_assert_eq(sscanf(row, "%llu %llu", &bytes, &iters), 2, "row: %s", row);
		cr_assert_eq(bytes, 64);
		cr_assert_geq(iters, 32, "at least one batch: %s", row);
		free(r);
	}
}

/* lat: t_min <= t_typical, t_avg, 99%, 99.9% <= t_max, all finite; -D shorter than one op still
 * reports one sample (it crashed on zero samples before). */
static struct run *check_lat(const char *transport, const char *const *extra, uint64_t n)
{
	const char *args[16] = {"lat", "--local", "-t", transport};
	int k = 4;
	for (int i = 0; extra[i]; i++)
		args[k++] = extra[i];
	args[k] = NULL;
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "lat exited %d:\n%s\n%s", r->status, r->out, r->err);
	const char *row = row_after(r->out, " #bytes #iterations    t_min[usec]");
	unsigned long long bytes, iters;
	double v[7]; /* min max typical avg stdev p99 p99.9 */
	cr_assert_eq(sscanf(row, "%llu %llu %lf %lf %lf %lf %lf %lf %lf", &bytes, &iters, &v[0],
			    &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]),
		     9, "unparsable row: %s", row);
	cr_assert_eq(bytes, 2);
	if (n)
		cr_assert_eq(iters, n);
	else
		cr_assert_gt(iters, 0);
	for (int i = 0; i < 7; i++)
		cr_assert(isfinite(v[i]) && v[i] >= 0, "column %d: %s", i, row);
	cr_assert_gt(v[0], 0, "t_min: %s", row);
	for (int i = 2; i < 7; i++)
		if (i != 4)
			cr_assert(v[0] <= v[i] && v[i] <= v[1], "column %d outside [min, max]: %s", i,
				  row);
	return r; /* the caller frees */
}

Test(bench_perf_bw, lat_shm_ordered_with_5_iters)
{
	const char *extra[] = {"-n", "5", NULL};
	free(check_lat("shm", extra, 5));
}

Test(bench_perf_bw, lat_tcp_ordered_with_5_iters)
{
	const char *extra[] = {"-n", "5", NULL};
	free(check_lat("tcp", extra, 5));
}

Test(bench_perf_bw, lat_shm_one_sample_with_tiny_duration)
{
	const char *extra[] = {"-D", "0.000001", NULL};
	free(check_lat("shm", extra, 0));
}

/*
 * lat's timing methods through the real binary (--local: client and server threads). Checks
 * the header names the method, the row is sane (check_lat), and the JSON says how many
 * exchanges ran and how many samples were kept: ping-pong keeps n-1 round trips minus the 2
 * largest (ib_write_lat's rule), completion keeps n timed ops. No timing assertions.
 */
static void check_lat_method(const char *transport, const char *const *extra, uint64_t n,
			     const char *header, const char *method, uint64_t samples)
{
	char dir[] = "/tmp/kvx_lat_XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char json[64];
	snprintf(json, sizeof(json), "%s/lat.json", dir);
	const char *x[16];
	int k = 0;
	for (int i = 0; extra[i]; i++)
		x[k++] = extra[i];
	x[k++] = "--json";
	x[k++] = json;
	x[k] = NULL;
	struct run *r = check_lat(transport, x, n);
	cr_assert(strstr(r->out, header), "no '%s' in:\n%s", header, r->out);
	FILE *f = fopen(json, "r");
	cr_assert_not_null(f, "no %s", json);
	char buf[4096];
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	buf[len] = '\0';
	fclose(f);
	char want[96];
	snprintf(want, sizeof(want), "\"method\": \"%s\"", method);
	cr_assert(strstr(buf, want), "no %s in %s", want, buf);
	snprintf(want, sizeof(want), "\"iterations\": %llu, \"samples\": %llu,",
		 (unsigned long long)n, (unsigned long long)samples);
	cr_assert(strstr(buf, want), "no %s in %s", want, buf);
	unlink(json);
	rmdir(dir);
	free(r);
}

#define PP_HEADER " Latency method  : ping-pong, t = round trip / 2 (as ib_write_lat)"
#define CPL_HEADER " Latency method  : post -> completion of one op (as ib_read_lat)"

Test(bench_perf_bw, lat_write_defaults_to_pingpong_with_tcp)
{
	const char *extra[] = {"-n", "40", NULL};
	check_lat_method("tcp", extra, 40, PP_HEADER, "pingpong", 37);
}

Test(bench_perf_bw, lat_write_defaults_to_pingpong_with_shm)
{
	const char *extra[] = {"-m", "write", "-n", "40", NULL};
	check_lat_method("shm", extra, 40, PP_HEADER, "pingpong", 37);
}

Test(bench_perf_bw, lat_write_mode_completion_times_post_to_completion_with_tcp)
{
	const char *extra[] = {"--mode", "completion", "-n", "30", NULL};
	check_lat_method("tcp", extra, 30, CPL_HEADER, "completion", 30);
}

Test(bench_perf_bw, lat_read_is_post_to_completion_with_shm)
{
	const char *extra[] = {"-m", "read", "-n", "30", NULL};
	check_lat_method("shm", extra, 30, CPL_HEADER, "completion", 30);
}

/* Both sides spin; pinned to one CPU they must still progress (they yield while waiting). */
Test(bench_perf_bw, lat_pingpong_progresses_with_both_sides_on_one_cpu_with_tcp)
{
	const char *extra[] = {"-l", "0,0", "-n", "50", NULL};
	check_lat_method("tcp", extra, 50, PP_HEADER, "pingpong", 47);
}

Test(bench_perf_bw, lat_pingpong_progresses_with_both_sides_on_one_cpu_with_shm)
{
	const char *extra[] = {"-l", "0", "-n", "50", NULL};
	check_lat_method("shm", extra, 50, PP_HEADER, "pingpong", 47);
}

/* Without -l both sides are pinned to a default pair of CPUs this process may run on: distinct
 * when it may run on two or more. */
Test(bench_perf_bw, lat_default_pins_two_distinct_allowed_cpus)
{
	const char *args[] = {"lat", "--local", "-t", "shm", "-n", "10", NULL};
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "lat exited %d:\n%s\n%s", r->status, r->out, r->err);
	const char *h = strstr(r->out, " Client CPU      : ");
	cr_assert_not_null(h, "%s", r->out);
	int a = -1, b = -1;
	cr_assert_eq(sscanf(h, " Client CPU      : %d Server CPU     : %d", &a, &b), 2, "%s", h);
	cr_assert(strstr(h, "(default pair)"), "%s", h);
	cpu_set_t set;
	CPU_ZERO(&set);
	cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	cr_assert(a >= 0 && a < CPU_SETSIZE && CPU_ISSET(a, &set), "client CPU %d not allowed", a);
	cr_assert(b >= 0 && b < CPU_SETSIZE && CPU_ISSET(b, &set), "server CPU %d not allowed", b);
	if (CPU_COUNT(&set) >= 2)
		cr_assert_neq(a, b, "one CPU for both sides out of %d allowed", CPU_COUNT(&set));
	else
		cr_assert_eq(a, b);
	free(r);
}

/*
 * The ping-pong between two processes: `kvxfer-perf lat -p PORT` (server, no HOST) and
 * `kvxfer-perf lat -p PORT 127.0.0.1` (client). The client runs once the server says it is
 * waiting; both exit 0 and the client prints the row.
 */
static void check_pingpong_server_client(const char *transport)
{
	char port[16], outp[] = "/tmp/kvx_lat_srv_XXXXXX";
	snprintf(port, sizeof(port), "%d", 10000 + (int)(getpid() % 20000)); /* below the ephemeral range */
	int fo = mkstemp(outp);
	cr_assert_geq(fo, 0);
	pid_t srv = fork();
	cr_assert_geq(srv, 0);
	if (srv == 0) {
		dup2(fo, 1);
		dup2(fo, 2);
		execl(KVX_PERF_BIN, KVX_PERF_BIN, "lat", "-t", transport, "-p", port, (char *)NULL);
		_exit(127);
	}
	/* Wait (bounded) for the server's banner: it is listening then. */
	bool up = false;
	for (uint64_t end = mono_ns() + 60000000000ull; !up && mono_ns() < end;) {
		char buf[512] = "";
		ssize_t k = pread(fo, buf, sizeof(buf) - 1, 0);
		up = k > 0 && strstr(buf, "Waiting for client to connect");
		if (!up) {
			int st;
			cr_assert_eq(waitpid(srv, &st, WNOHANG), 0, "server exited before listening");
			struct timespec ts = {0, 20000000};
			nanosleep(&ts, NULL); /* poll interval of a bounded wait on the banner */
		}
	}
	cr_assert(up, "server banner never appeared");
	const char *args[] = {"lat", "-t", transport, "-p", port, "-n", "30", "127.0.0.1", NULL};
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	int st;
	cr_assert_eq(waitpid(srv, &st, 0), srv);
	close(fo);
	unlink(outp);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "client exited %d:\n%s\n%s", r->status, r->out, r->err);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server status %d", st);
	cr_assert(strstr(r->out, " Latency method  : ping-pong"), "%s", r->out);
	const char *row = row_after(r->out, " #bytes #iterations    t_min[usec]");
	unsigned long long bytes, iters;
	double mn, mx, typ;
	cr_assert_eq(sscanf(row, "%llu %llu %lf %lf %lf", &bytes, &iters, &mn, &mx, &typ), 5, "%s",
		     row);
	cr_assert_eq(bytes, 2);
	cr_assert_eq(iters, 30);
	cr_assert(isfinite(mn) && mn > 0 && mn <= typ && typ <= mx, "row: %s", row);
	free(r);
}

Test(bench_perf_bw, lat_pingpong_server_and_client_processes_with_tcp)
{
	check_pingpong_server_client("tcp");
}

Test(bench_perf_bw, lat_pingpong_server_and_client_processes_with_shm)
{
	check_pingpong_server_client("shm");
}

/* A ping-pong sweep: one row per size 2 B .. 8 MiB, each with the asked exchange count. */
Test(bench_perf_bw, lat_pingpong_sweep_reports_every_size_with_shm)
{
	const char *args[] = {"lat", "--local", "-t", "shm", "-a", "-n", "5", NULL};
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "lat exited %d:\n%s\n%s", r->status, r->out, r->err);
	const char *row = row_after(r->out, " #bytes #iterations    t_min[usec]");
	unsigned long long want = 2;
	for (; want <= (8ull << 20); want *= 2) {
		unsigned long long bytes, iters;
		double mn, mx;
		cr_assert_eq(sscanf(row, "%llu %llu %lf %lf", &bytes, &iters, &mn, &mx), 4,
			     "row for %llu: %s", want, row);
		cr_assert_eq(bytes, want);
		cr_assert_eq(iters, 5);
		cr_assert(isfinite(mn) && mn > 0 && mn <= mx, "row: %s", row);
		row = strchr(row, '\n');
		cr_assert_not_null(row);
		row++;
	}
	free(r);
}

/* bw -a --plot (issue 7): a PNG of bandwidth vs size, one data row per swept size (2 B .. 8 MiB
 * = 23 sizes), the option in --help, and lat refusing it. */
Test(bench_perf_bw, plot_sweep_writes_png_with_shm)
{
	if (system("command -v gnuplot >/dev/null 2>&1") != 0)
		cr_skip_test("gnuplot is not installed");
	char dir[] = "/tmp/kvx_bw_plot_XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char png[64], dat[72], gp[72];
	snprintf(png, sizeof(png), "%s/x.png", dir);
	snprintf(dat, sizeof(dat), "%s.dat", png);
	snprintf(gp, sizeof(gp), "%s.gp", png);
	const char *args[] = {"bw", "--local", "-t", "shm", "-a", "-n", "5", "--plot", png, NULL};
	struct run *r = calloc(1, sizeof(*r));
	run_perf(r, args);
	skip_if_no_cma(r);
	cr_assert_eq(r->status, 0, "exited %d:\n%s\n%s", r->status, r->out, r->err);
	FILE *f = fopen(png, "rb");
	cr_assert_not_null(f, "no %s", png);
	unsigned char sig[8] = {0};
	cr_assert_eq(fread(sig, 1, 8, f), 8);
	fclose(f);
	static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	cr_assert_arr_eq(sig, png_sig, 8);
	f = fopen(dat, "r");
	cr_assert_not_null(f, "no %s", dat);
	char line[256];
	unsigned rows = 0;
	unsigned long long want = 2;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#')
			continue;
		unsigned long long sz;
		double g;
		cr_assert_eq(sscanf(line, "%llu %lf", &sz, &g), 2, "bad row: %s", line);
		cr_assert_eq(sz, want);
		cr_assert(isfinite(g) && g > 0, "row: %s", line);
		want *= 2;
		rows++;
	}
	fclose(f);
	cr_assert_eq(rows, 23);
	unlink(png);
	unlink(dat);
	unlink(gp);
	rmdir(dir);

	const char *help[] = {"bw", "--help", NULL};
	run_perf(r, help);
	cr_assert(strstr(r->out, "--plot FILE.png"), "--help lacks --plot:\n%s", r->out);
	const char *lat[] = {"lat", "--local", "-t", "shm", "--plot", png, NULL};
	run_perf(r, lat);
	cr_assert_eq(r->status, 2, "lat --plot exited %d", r->status);
	cr_assert(strstr(r->err, "--plot is for bw sweeps only"), "%s", r->err);
	free(r);
}
