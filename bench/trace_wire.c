/* SPDX-License-Identifier: Apache-2.0 */
/* Driver channel of kvxfer-perf trace: framed messages over a stream socket (trace_replay.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "px_auth.h"
#include "trace_replay.h"

static int write_all(int fd, struct iovec *iov, int n)
{
	while (n > 0) {
		ssize_t w = writev(fd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		ssize_t r = read(fd, p, len);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -ECONNRESET;
		p += r;
		len -= (size_t)r;
	}
	return 0;
}

/* Sealed fds (trace_wire_seal()): set before use, then each read by its fd's one thread. */
static struct {
	int fd;
	struct px_auth *a;
} g_seal[4] = {{-1, NULL}, {-1, NULL}, {-1, NULL}, {-1, NULL}};

int trace_wire_seal(int fd, struct px_auth *a)
{
	for (int i = 0; i < 4; i++)
		if (g_seal[i].fd == fd) {
			g_seal[i].a = a;
			if (!a)
				g_seal[i].fd = -1;
			return 0;
		}
	for (int i = 0; a && i < 4; i++)
		if (g_seal[i].fd < 0) {
			g_seal[i].fd = fd;
			g_seal[i].a = a;
			return 0;
		}
	return a ? -ENOSPC : 0;
}

static struct px_auth *seal_of(int fd)
{
	for (int i = 0; i < 4; i++)
		if (g_seal[i].fd == fd)
			return g_seal[i].a;
	return NULL;
}

static int sealed_send(struct px_auth *x, int fd, const struct trace_msg_hdr *h, const void *a, size_t alen,
		       const void *b, size_t blen)
{
	int rc = px_auth_send(x, fd, h, sizeof(*h));
	if (rc || !h->len)
		return rc;
	uint8_t *p = malloc(h->len);
	if (!p)
		return -ENOMEM;
	if (alen)
		memcpy(p, a, alen);
	if (blen)
		memcpy(p + alen, b, blen);
	rc = px_auth_send(x, fd, p, h->len);
	free(p);
	return rc;
}

int trace_msg_send(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen)
{
	if (alen + blen > TRACE_MSG_MAX)
		return -EMSGSIZE;
	struct trace_msg_hdr h = {.type = type, .len = (uint32_t)(alen + blen)};
	struct px_auth *x = seal_of(fd);
	if (x)
		return sealed_send(x, fd, &h, a, alen, b, blen);
	struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)a, alen}, {(void *)b, blen}};
	return write_all(fd, iov, blen ? 3 : (alen ? 2 : 1));
}

int trace_msg_recv(int fd, struct trace_msg_hdr *h, void **payload)
{
	*payload = NULL;
	struct px_auth *x = seal_of(fd);
	int rc = x ? px_auth_recv(x, fd, h, sizeof(*h)) : read_all(fd, h, sizeof(*h));
	if (rc)
		return rc;
	if (h->len > TRACE_MSG_MAX)
		return -EPROTO;
	if (h->len == 0)
		return 0;
	void *p = malloc(h->len);
	if (!p)
		return -ENOMEM;
	rc = x ? px_auth_recv(x, fd, p, h->len) : read_all(fd, p, h->len);
	if (rc) {
		free(p);
		return rc;
	}
	*payload = p;
	return 0;
}

void trace_xfer_id(uint64_t idx, char *buf, size_t len)
{
	snprintf(buf, len, "tx-%06" PRIu64, idx);
}

int trace_xfer_id_parse(const char *s, uint64_t *idx)
{
	if (strncmp(s, "tx-", 3) || !s[3])
		return -EINVAL;
	uint64_t v = 0;
	for (const char *p = s + 3; *p; p++) {
		if (*p < '0' || *p > '9' || v > UINT64_MAX / 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	*idx = v;
	return 0;
}
