/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf --mem (bench/perf_bw.c, bench/perf_trace.c through kvx_mem_buf_init): run the real binary and check
 * the exit status and message. Without a GPU, `--mem hip` must exit 1 with "no HIP device"
 * (no crash, no hang); a malformed value is a usage error (2).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/mem.h"

TestSuite(mem_perf, .timeout = 30.0);

/* Run kvxfer-perf with argv; return its wait status and its stderr in err. */
static int run_perf(char *const argv[], char *err, size_t err_len)
{
	int pfd[2], st = 0;
	size_t got = 0;
	ssize_t k;
	pid_t pid;

	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(pfd[1], 2);
		close(pfd[0]);
		close(pfd[1]);
		execv(KVX_PERF_BIN, argv);
		_exit(127);
	}
	close(pfd[1]);
	while (got + 1 < err_len && (k = read(pfd[0], err + got, err_len - 1 - got)) != 0) {
		if (k < 0 && errno == EINTR)
			continue;
		cr_assert_gt(k, 0, "read: %s", strerror(errno));
		got += (size_t)k;
	}
	err[got] = '\0';
	close(pfd[0]);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return st;
}

Test(mem_perf, bw_lat_trace_with_hip_and_no_gpu_exit_1_no_hip_device)
{
	static const char *cmds[] = {"bw", "lat", "trace"};
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	char err[1024];

	if (!kvx_mem_has_hip())
		cr_skip_test("built without HIP (libamdhip64 not found)");
	if (kvx_mem_probe(&t, NULL, 0) == 0)
		cr_skip_test("a HIP device is present: the no-device path is not reachable");
	for (int i = 0; i < 3; i++) {
		char *argv[] = {"kvxfer-perf", (char *)cmds[i], "--mem", "hip", "--local", NULL};
		int st = run_perf(argv, err, sizeof(err));

		cr_assert(WIFEXITED(st), "%s: killed by signal %d", cmds[i],
			  WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		cr_assert_eq(WEXITSTATUS(st), 1, "%s: exit status", cmds[i]);
		cr_assert(strstr(err, "--mem hip: no HIP device") != NULL, "%s: %s", cmds[i], err);
	}
}

Test(mem_perf, malformed_mem_is_usage_error)
{
	char *argv[] = {"kvxfer-perf", "bw", "--mem", "cuda:0", "--local", NULL};
	char err[1024];
	int st = run_perf(argv, err, sizeof(err));

	cr_assert(WIFEXITED(st));
	cr_assert_eq(WEXITSTATUS(st), 2);
	cr_assert(strstr(err, "--mem 'cuda:0': expected host, hip or hip:<DEVICE>") != NULL, "%s",
		  err);
}
