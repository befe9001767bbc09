/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_PIPE_IO_H
#define KVX_TESTS_PIPE_IO_H
/* Whole-buffer pipe I/O between a test and its child engine process, header-only so that the
 * test files also built as TSan runners (test_engine.c, test_engine_spread.c; they do not link
 * engine_test_util.c) share one copy. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* Read (wr false) or write (wr true) all @p n bytes of @p buf on @p fd, retrying EINTR.
 * Returns 0, or -1 on an error or end of file. */
static inline int io_all(int fd, void *buf, size_t n, bool wr)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t k = wr ? write(fd, p, n) : read(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

#endif /* KVX_TESTS_PIPE_IO_H */
