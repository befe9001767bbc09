/* SPDX-License-Identifier: Apache-2.0 */
#include "kvxfer/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *kvx_strerror(int err)
{
	if (err == 0)
		return "Success";
	if (err < 0)
		err = -err;
	/* strerror() is not thread-safe in general; glibc's strerrordesc_np is, and static. */
	const char *s = strerrordesc_np(err);
	return s ? s : "Unknown error";
}

uint64_t kvx_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int log_threshold(void)
{
	/* Read once; a racy first read by two threads computes the same value. */
	static volatile int cached = -1;
	int v = cached;
	if (v >= 0)
		return v;
	const char *e = getenv("KVX_LOG");
	v = KVX_LOG_WARN;
	if (e) {
		if (!strcmp(e, "error"))
			v = KVX_LOG_ERROR;
		else if (!strcmp(e, "info"))
			v = KVX_LOG_INFO;
		else if (!strcmp(e, "debug"))
			v = KVX_LOG_DEBUG;
	}
	cached = v;
	return v;
}

bool kvx_log_enabled(enum kvx_log_level level)
{
	return (int)level <= log_threshold();
}

void kvx_log(enum kvx_log_level level, const char *fmt, ...)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	if (!kvx_log_enabled(level))
		return;
	char line[1024];
	int n = snprintf(line, sizeof(line), "kvxfer %s: ", names[level]);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, len);
	(void)w;
}

bool kvx_ratelimit_ok(struct kvx_ratelimit *rl, uint64_t *suppressed)
{
	uint64_t now = kvx_now_ns();
	uint64_t ivl = rl->interval_ns ? rl->interval_ns : 1000000000ull;
	if (rl->last_ns != 0 && now - rl->last_ns < ivl) {
		rl->suppressed++;
		return false;
	}
	if (suppressed)
		*suppressed = rl->suppressed;
	rl->suppressed = 0;
	rl->last_ns = now;
	return true;
}
