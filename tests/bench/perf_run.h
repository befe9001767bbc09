/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Run the real kvxfer-perf binary as a child process and capture its stdout and stderr
 * separately (tests/bench). Waits on the child's pipes and exit, never on a sleep.
 */
#ifndef KVX_TESTS_BENCH_PERF_RUN_H
#define KVX_TESTS_BENCH_PERF_RUN_H
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

/** Outcome of one run. */
struct perf_run {
	int status;     /**< Exit code, or 128 + signal. */
	char out[262144]; /**< stdout, NUL-terminated (truncated to fit). */
	size_t out_len;
	char err[65536];  /**< stderr, NUL-terminated (truncated to fit). */
	size_t err_len;
};

static inline uint64_t perf_run_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/** A child started with perf_run_start(): read it to the end with perf_run_finish(). */
struct perf_child {
	pid_t pid;
	int fd_out, fd_err;
};

/*
 * Start `BIN ARGS...` (NULL-terminated). @p path_env, if not NULL, replaces PATH in the child.
 */
static inline void perf_run_start(struct perf_child *ch, const char *bin, const char *path_env,
				  const char *const *args)
{
	int po[2], pe[2];
	cr_assert_eq(pipe(po), 0);
	cr_assert_eq(pipe(pe), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(po[1]);
		close(pe[0]);
		close(pe[1]);
		if (path_env)
			setenv("PATH", path_env, 1);
		const char *av[64];
		int k = 0;
		av[k++] = bin;
		for (int i = 0; args[i] && k < 62; i++)
			av[k++] = args[i];
		av[k] = NULL;
		execv(bin, (char *const *)av);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	ch->pid = pid;
	ch->fd_out = po[0];
	ch->fd_err = pe[0];
}

/*
 * Read a started child's output until it exits. If @p until is not NULL, return as soon as
 * stdout or stderr contains it (the child keeps running; call again later to finish it). Kills the child
 * after @p deadline_ms (status 128 + SIGKILL) so a hang fails the test instead of blocking it.
 * Returns true when the child has exited.
 */
static inline bool perf_run_read(struct perf_child *ch, struct perf_run *r, uint64_t deadline_ms,
				 const char *until)
{
	uint64_t end = perf_run_now_ms() + deadline_ms;
	bool killed = false;
	while (ch->fd_out >= 0 || ch->fd_err >= 0) {
		if (until && (strstr(r->out, until) || strstr(r->err, until)))
			return false;
		uint64_t t = perf_run_now_ms();
		if (t >= end && !killed) {
			kill(ch->pid, SIGKILL);
			killed = true;
		}
		struct pollfd pf[2] = {{.fd = ch->fd_out, .events = POLLIN}, {.fd = ch->fd_err, .events = POLLIN}};
		int prc = poll(pf, 2, killed ? 1000 : (int)(end - t));
		if (prc < 0 && errno == EINTR)
			continue;
		if (prc == 0 && killed)
			break;
		for (int i = 0; i < 2; i++) {
			if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			char *buf = i ? r->err : r->out;
			size_t *len = i ? &r->err_len : &r->out_len;
			size_t cap = i ? sizeof(r->err) : sizeof(r->out);
			char tmp[4096];
			ssize_t n = read(pf[i].fd, tmp, sizeof(tmp));
			if (n <= 0) {
				close(pf[i].fd);
				if (i)
					ch->fd_err = -1;
				else
					ch->fd_out = -1;
				continue;
			}
			size_t take = (size_t)n < cap - 1 - *len ? (size_t)n : cap - 1 - *len;
			memcpy(buf + *len, tmp, take);
			*len += take;
			buf[*len] = '\0';
		}
	}
	int st = 0;
	while (waitpid(ch->pid, &st, 0) < 0 && errno == EINTR)
		;
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	return true;
}

/* Run to completion. */
static inline void perf_run(struct perf_run *r, const char *bin, const char *path_env,
			    uint64_t deadline_ms, const char *const *args)
{
	struct perf_child ch;
	memset(r, 0, sizeof(*r));
	perf_run_start(&ch, bin, path_env, args);
	perf_run_read(&ch, r, deadline_ms, NULL);
}

/* perf_run() into a caller's own buffers: status in *status, stdout and stderr NUL-terminated in
 * out[out_cap] and err[err_cap] (truncated to fit). */
static inline void perf_run_into(int *status, char *out, size_t out_cap, char *err, size_t err_cap,
				 const char *bin, const char *path_env, uint64_t deadline_ms,
				 const char *const *args)
{
	struct perf_run *r = malloc(sizeof(*r));
	cr_assert_not_null(r);
	perf_run(r, bin, path_env, deadline_ms, args);
	*status = r->status;
	size_t n = r->out_len < out_cap - 1 ? r->out_len : out_cap - 1;
	memcpy(out, r->out, n);
	out[n] = '\0';
	n = r->err_len < err_cap - 1 ? r->err_len : err_cap - 1;
	memcpy(err, r->err, n);
	err[n] = '\0';
	free(r);
}

/* A TCP port nothing listens on right now (bound to an ephemeral port, then released). */
static inline unsigned perf_run_closed_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
	close(fd);
	return ntohs(a.sin_port);
}
#endif
