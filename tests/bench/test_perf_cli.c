/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf usage errors, through the real binary: bad sizes/counts and lcore lists for lat,
 * and bad lcores, oversized pools and unwritable output paths for trace are rejected up front
 * with exit 2 and one message naming the option, before anything is forked or replayed.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_cli, .timeout = 120.0);

struct run {
	int status;
	char out[16384]; /* stdout and stderr together */
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * Run `kvxfer-perf ARGS...` (NULL-terminated), capture its output; kill it if it has not exited
 * after deadline_ms (status then 128 + SIGKILL, so a run that ignores the error shows up).
 */
static void run_perf(struct run *r, uint64_t deadline_ms, const char *const *args)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		const char *av[64];
		int k = 0;
		av[k++] = KVX_PERF_BIN;
		for (int i = 0; args[i] && k < 62; i++)
			av[k++] = args[i];
		av[k] = NULL;
		execv(KVX_PERF_BIN, (char *const *)av);
		_exit(127);
	}
	close(p[1]);
	size_t n = 0;
	uint64_t end = now_ms() + deadline_ms;
	bool killed = false;
	for (;;) {
		uint64_t t = now_ms();
		if (t >= end && !killed) {
			kill(pid, SIGKILL);
			killed = true;
		}
		struct pollfd pf = {.fd = p[0], .events = POLLIN};
		int prc = poll(&pf, 1, killed ? 1000 : (int)(end - t));
		if (prc < 0 && errno == EINTR)
			continue;
		if (prc <= 0) {
			if (killed)
				break;
			continue;
		}
		char tmp[4096];
		ssize_t k = read(p[0], tmp, sizeof(tmp));
		if (k <= 0)
			break; /* EOF: the binary (and anything it forked) closed the pipe */
		size_t room = sizeof(r->out) - 1 - n;
		size_t c = (size_t)k < room ? (size_t)k : room;
		memcpy(r->out + n, tmp, c);
		n += c;
	}
	r->out[n] = '\0';
	close(p[0]);
	if (!killed && now_ms() >= end)
		kill(pid, SIGKILL);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static unsigned count_lines(const char *s)
{
	unsigned n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* Exit 2 within the deadline, exactly one line of output, and it contains @p msg. */
static void expect_usage_error(const char *const *args, const char *msg)
{
	struct run r;
	run_perf(&r, 30000, args);
	cr_assert_eq(r.status, 2, "exit %d, expected 2\n%s", r.status, r.out);
	cr_assert(strstr(r.out, msg), "expected '%s' in:\n%s", msg, r.out);
	cr_assert_eq(count_lines(r.out), 1, "expected one message line, got:\n%s", r.out);
}

/* ---- 1. sizes and counts (lat; bw shares px_check_args once perf_bw.c calls it) ---------- */

Test(bench_perf_cli, lat_negative_iters_is_usage_error_naming_n)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-n", "-5", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -n '-5': expected a positive iteration count >= 5");
}

Test(bench_perf_cli, lat_zero_iters_is_usage_error_naming_n)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "--iters=0", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -n '0': expected a positive iteration count >= 5");
}

Test(bench_perf_cli, lat_negative_size_is_usage_error_naming_s)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-s", "-1", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -s '-1': expected 1 .. 1G bytes");
}

Test(bench_perf_cli, lat_zero_size_is_usage_error_naming_s)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-s", "0K", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -s '0K': expected 1 .. 1G bytes");
}

Test(bench_perf_cli, lat_size_suffix_overflow_is_usage_error)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-s", "18014398509481984K", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -s '18014398509481984K': expected 1 .. 1G bytes");
}

/* ---- 2. lcore list (lat) ------------------------------------------------------------------ */

Test(bench_perf_cli, lat_lcore_not_on_host_is_usage_error_naming_core)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-l", "0,999", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -l '0,999': lcore 999: CPU 999 does not exist");
}

Test(bench_perf_cli, lat_lcore_garbage_is_usage_error)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-l", "0,x", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -l '0,x': expected CPU or CPU,CPU");
}

Test(bench_perf_cli, lat_valid_lcore_and_counts_still_run)
{
	struct run r;
	const char *a[] = {"lat", "--local", "-t", "tcp", "-l", "0", "-n", "20", "-s", "1K", NULL};
	run_perf(&r, 60000, a);
	cr_assert_eq(r.status, 0, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, " 1024    20 "), "%s", r.out);
}

/* ---- 2b. lat timing method (-m pingpong|completion) -------------------------------------- */

Test(bench_perf_cli, lat_pingpong_with_read_is_usage_error)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "-m", "read", "-m", "pingpong", NULL};
	expect_usage_error(a, "kvxfer-perf lat: -m pingpong is for WRITE; READ latency is post -> "
			      "completion (as ib_read_lat)");
}

Test(bench_perf_cli, lat_unknown_mode_is_usage_error_naming_both_kinds)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "--mode", "sideways", NULL};
	expect_usage_error(a, "kvxfer-perf: -m 'sideways': expected read or write (op), or "
			      "pingpong or completion (timing)");
}

Test(bench_perf_cli, lat_pingpong_with_two_qps_is_usage_error)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "--qps", "2", NULL};
	expect_usage_error(a, "kvxfer-perf lat: --qps 2: the ping-pong polls the last byte of each "
			      "WRITE, which needs one channel (or use -m completion)");
}

Test(bench_perf_cli, bw_has_no_completion_mode)
{
	const char *a[] = {"bw", "--local", "-t", "tcp", "-m", "completion", NULL};
	expect_usage_error(a, "kvxfer-perf: -m 'completion': expected read or write");
}

Test(bench_perf_cli, lat_help_documents_both_methods_and_default_pinning)
{
	struct run r;
	const char *a[] = {"lat", "--help", NULL};
	run_perf(&r, 30000, a);
	cr_assert_eq(r.status, 0, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, "-m, --mode pingpong|completion"), "%s", r.out);
	cr_assert(strstr(r.out, "pingpong (WRITE default): ib_write_lat's method"), "%s", r.out);
	cr_assert(strstr(r.out, "always uses it (ib_read_lat times a READ that way)"), "%s", r.out);
	cr_assert(strstr(r.out, "two distinct CPUs of this machine"), "%s", r.out);
	const char *b[] = {"bw", "--help", NULL};
	run_perf(&r, 30000, b);
	cr_assert_eq(r.status, 0, "exit %d\n%s", r.status, r.out);
	cr_assert_null(strstr(r.out, "pingpong"), "bw --help offers the lat methods:\n%s", r.out);
}

/* --mem: the ping-pong spins on the buffer with the CPU, so it takes host memory only. */
Test(bench_perf_cli, lat_pingpong_with_device_memory_is_usage_error)
{
	const char *a[] = {"lat", "--local", "-t", "tcp", "--mem", "hostdev", NULL};
	expect_usage_error(a, "kvxfer-perf lat: --mem hostdev: the ping-pong spins on host memory "
			      "(use -m completion)");
}

/*
 * --mem other than host is up to the provider's caps.mem_types: either the run completes with
 * a result row, or it stops with exit 1 and the message naming the provider and the caps.
 */
static void expect_mem_run_or_caps_refusal(const char *sub, const char *transport)
{
	struct run r;
	const char *a[] = {sub, "--local", "-t", transport, "--mem", "hostdev", "-n", "20",
			   "-m", "completion", NULL};
	if (!strcmp(sub, "bw"))
		a[8] = NULL; /* bw has no timing method */
	run_perf(&r, 60000, a);
	char refusal[160];
	snprintf(refusal, sizeof(refusal), "--mem hostdev: the %s provider does not move this "
		 "memory (not in its caps.mem_types)", transport);
	if (r.status == 1) {
		cr_assert(strstr(r.out, refusal), "exit 1 without '%s':\n%s", refusal, r.out);
		return;
	}
	if (r.status && strstr(r.out, "ptrace_scope"))
		cr_skip_test("shm: CMA not permitted here: %s", r.out);
	cr_assert_eq(r.status, 0, "exit %d\n%s", r.status, r.out);
	cr_assert(strstr(r.out, "\n 65536 ") || strstr(r.out, "\n 2 "), "no result row:\n%s",
		  r.out);
}

Test(bench_perf_cli, bw_device_memory_follows_tcp_caps)
{
	expect_mem_run_or_caps_refusal("bw", "tcp");
}

Test(bench_perf_cli, lat_completion_device_memory_follows_shm_caps)
{
	expect_mem_run_or_caps_refusal("lat", "shm");
}

/* ---- 3. trace lcores, checked by the driver before forking ------------------------------- */

Test(bench_perf_cli, bw_negative_iters_is_usage_error_naming_n)
{
	const char *a[] = {"bw", "--local", "-t", "tcp", "-s", "1M", "-n", "-5", NULL};
	expect_usage_error(a, "kvxfer-perf bw: -n '-5': expected a positive iteration count >= 5");
}

Test(bench_perf_cli, bw_zero_size_is_usage_error_naming_s)
{
	const char *a[] = {"bw", "--local", "-t", "tcp", "-s", "0", NULL};
	expect_usage_error(a, "kvxfer-perf bw: -s '0': expected 1 .. 1G bytes");
}

Test(bench_perf_cli, bw_lcore_not_on_host_is_usage_error_naming_core)
{
	const char *a[] = {"bw", "--local", "-t", "tcp", "-l", "0,999", "-n", "10", NULL};
	expect_usage_error(a, "kvxfer-perf bw: -l '0,999': lcore 999: CPU 999 does not exist");
}

Test(bench_perf_cli, trace_lcore_not_on_host_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "-l", "0,999", NULL};
	expect_usage_error(a, "kvxfer-perf trace: -l 0,999 (all lcores): lcore 999: CPU 999 does not exist");
}

Test(bench_perf_cli, trace_follow_other_than_on_off_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--follow", "yes", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --follow: 'yes' is not on or off");
}

Test(bench_perf_cli, trace_hugepages_other_than_on_off_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--hugepages", "2M", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --hugepages: '2M' is not on or off");
}

Test(bench_perf_cli, trace_slice_below_the_kernels_shortest_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--slice", "50", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --slice: 50 us is below the kernel's shortest slice (100 us)");
}

Test(bench_perf_cli, idle_slice_and_busy_after_out_of_range_are_usage_errors)
{
	const char *a[] = {"idle", "--slice", "100001", NULL};
	expect_usage_error(a, "kvxfer-perf idle: --slice '100001' must be 0 or an integer in 100..100000");
	const char *b[] = {"idle", "--busy-after", "-1", NULL};
	expect_usage_error(b, "kvxfer-perf idle: --busy-after '-1' must be an integer in 0..1000000");
}

Test(bench_perf_cli, trace_duplicate_lcores_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "-l", "0,0,1,1", NULL};
	expect_usage_error(a, "lcore 0 listed twice");
}

Test(bench_perf_cli, trace_descending_lcore_range_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "-l", "5-2", NULL};
	expect_usage_error(a, "--lcores '5-2': descending lcore range 5-2");
}

Test(bench_perf_cli, trace_control_lcore_not_on_host_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--control-lcore", "999", NULL};
	expect_usage_error(a, "--control-lcore 999 (producer lcores): control lcore 999: CPU 999 does not exist");
}

/* ---- 4. pool size against MemAvailable ------------------------------------------------------ */

Test(bench_perf_cli, trace_pool_over_half_of_memavailable_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--pool-blocks", "4294967295", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --pool-blocks 4294967295 blocks x 2.097 MB "
			      "(--block-size 16 tokens)");
	struct run r;
	run_perf(&r, 30000, a);
	cr_assert(strstr(r.out, "more than half of MemAvailable"), "%s", r.out);
}

/* ---- 5. output paths checked at startup ----------------------------------------------------- */

Test(bench_perf_cli, trace_json_in_missing_dir_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--json", "/nonexistent/dir/x.json", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --json /nonexistent/dir/x.json: cannot create the "
			      "file in /nonexistent/dir: No such file or directory");
}

Test(bench_perf_cli, trace_csv_in_missing_dir_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--csv", "/nonexistent/dir/x.csv", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --csv /nonexistent/dir/x.csv: cannot create the "
			      "file in /nonexistent/dir");
}

Test(bench_perf_cli, trace_plot_under_a_file_is_usage_error)
{
	char dir[] = "/tmp/kvx_cli_XXXXXX";
	cr_assert_neq(mkdtemp(dir), NULL);
	char file[64], plot[128];
	snprintf(file, sizeof(file), "%s/f", dir);
	FILE *f = fopen(file, "w");
	cr_assert_neq(f, NULL);
	fclose(f);
	snprintf(plot, sizeof(plot), "%s/x.png", file);
	const char *a[] = {"trace", "--local", "-t", "tcp", "--plot", plot, NULL};
	char msg[512];
	snprintf(msg, sizeof(msg), "--plot %s: cannot create the file in %s: not a directory", plot, file);
	expect_usage_error(a, msg);
	unlink(file);
	rmdir(dir);
}

Test(bench_perf_cli, trace_json_that_is_a_directory_is_usage_error)
{
	const char *a[] = {"trace", "--local", "-t", "tcp", "--json", "/tmp", NULL};
	expect_usage_error(a, "kvxfer-perf trace: --json /tmp: is a directory");
}
