/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the tests/bench tests: write a temporary file with given content. */
#ifndef KVX_TESTS_BENCH_HELPERS_H
#define KVX_TESTS_BENCH_HELPERS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

/* Write content to a fresh temporary file named with suffix; the caller unlinks path. */
static inline void tmpfile_with(char *path, size_t pathlen, const char *suffix, const char *content)
{
	snprintf(path, pathlen, "/tmp/kvx_bench_test_XXXXXX%s", suffix);
	int fd = mkstemps(path, (int)strlen(suffix));
	cr_assert_geq(fd, 0, "mkstemps failed");
	size_t len = strlen(content);
	cr_assert_eq(write(fd, content, len), (ssize_t)len);
	close(fd);
}
#endif
