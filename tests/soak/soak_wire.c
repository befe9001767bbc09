/* SPDX-License-Identifier: Apache-2.0 */
/* Driver-channel framing of kvx-soak (see soak.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "soak.h"

static int write_all(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len) {
		ssize_t r = read(fd, p, len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0)
			return -ECONNRESET;
		if (r < 0)
			return -errno;
		p += r;
		len -= (size_t)r;
	}
	return 0;
}

int soak_send(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen)
{
	if (alen + blen > SOAK_MSG_MAX)
		return -EMSGSIZE;
	struct soak_hdr h = {.type = type, .len = (uint32_t)(alen + blen)};
	int rc = write_all(fd, &h, sizeof(h));
	if (!rc && alen)
		rc = write_all(fd, a, alen);
	if (!rc && blen)
		rc = write_all(fd, b, blen);
	return rc;
}

int soak_recv(int fd, struct soak_hdr *h, void **payload)
{
	*payload = NULL;
	int rc = read_all(fd, h, sizeof(*h));
	if (rc)
		return rc;
	if (h->len > SOAK_MSG_MAX)
		return -EPROTO;
	char *p = malloc(h->len + 1u);
	if (!p)
		return -ENOMEM;
	rc = h->len ? read_all(fd, p, h->len) : 0;
	if (rc) {
		free(p);
		return rc;
	}
	p[h->len] = 0;
	*payload = p;
	return 0;
}

uint64_t soak_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
