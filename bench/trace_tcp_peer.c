/* SPDX-License-Identifier: Apache-2.0 */
/* The streaming socket loop of `kvxfer-perf trace --peer tcp` (trace_tcp_peer.h). */
#include "trace_tcp_peer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define TP_IOV 1024 /* UIO_MAXIOV */
_Static_assert(TP_IOV <= IOV_MAX, "IOV_MAX");

struct stream {
	int fd;
	bool send;
	struct iovec v[TP_IOV];
	uint32_t k;
	struct trace_cma_result *res;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Move the pending ranges with as few calls as the socket allows; 0 or -errno. */
static int flush(struct stream *S)
{
	uint32_t i = 0;
	while (i < S->k) {
		struct msghdr m = {.msg_iov = S->v + i, .msg_iovlen = S->k - i};
		ssize_t n = S->send ? sendmsg(S->fd, &m, MSG_NOSIGNAL) : recvmsg(S->fd, &m, 0);
		S->res->calls++;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ECONNRESET; /* the sender closed before the last range */
		S->res->bytes += (uint64_t)n;
		size_t left = (size_t)n;
		while (left && i < S->k) {
			size_t t = S->v[i].iov_len < left ? S->v[i].iov_len : left;
			S->v[i].iov_base = (char *)S->v[i].iov_base + t;
			S->v[i].iov_len -= t;
			if (!S->v[i].iov_len)
				i++;
			left -= t;
		}
	}
	S->k = 0;
	return 0;
}

/* One range of this role's pool; merged with the previous one when it continues it here (the
 * stream does not care where the other side's ranges break). */
static int add(void *arg, unsigned char *local, uint64_t remote, uint64_t len)
{
	(void)remote;
	struct stream *S = arg;
	if (S->k) {
		struct iovec *a = &S->v[S->k - 1];
		if ((unsigned char *)a->iov_base + a->iov_len == local) {
			a->iov_len += len;
			return 0;
		}
	}
	if (S->k == TP_IOV) {
		int rc = flush(S);
		if (rc)
			return rc;
	}
	S->v[S->k++] = (struct iovec){.iov_base = local, .iov_len = len};
	S->res->iovs++;
	return 0;
}

/* Move every range over the connected @p fd (sender or receiver), timed from here to the last
 * byte; closes @p fd. r->status and r->ns are set. */
static void stream(int fd, bool send, const struct trace_cma_log *local, const struct trace_cma_pool *pool,
		   bool initiator, const void *info, size_t len, struct trace_cma_result *r)
{
	struct stream *S = calloc(1, sizeof(*S));
	if (!S) {
		r->status = -ENOMEM;
		close(fd);
		return;
	}
	*S = (struct stream){.fd = fd, .send = send, .res = r};
	uint64_t t0 = now_ns();
	int rc = trace_cma_each_extent(local, pool, initiator, info, len, add, S, r);
	r->status = rc ? rc : flush(S);
	r->ns = now_ns() - t0;
	close(fd);
	free(S);
}

int trace_tcp_peer_listen(uint32_t *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1) ||
	    getsockname(fd, (struct sockaddr *)&a, &al)) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

void trace_tcp_peer_recv(int lfd, const struct trace_cma_log *local, const struct trace_cma_pool *pool,
			 bool initiator, const void *info, size_t len, struct trace_cma_result *r)
{
	memset(r, 0, sizeof(*r));
	struct pollfd pf = {.fd = lfd, .events = POLLIN};
	int rc = poll(&pf, 1, TRACE_TCP_PEER_ACCEPT_MS);
	int fd = rc > 0 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
	if (fd < 0) {
		r->status = rc == 0 ? -ETIMEDOUT : -errno;
		return;
	}
	stream(fd, false, local, pool, initiator, info, len, r);
}

void trace_tcp_peer_send(uint32_t port, const struct trace_cma_log *local, const struct trace_cma_pool *pool,
			 bool initiator, const void *info, size_t len, struct trace_cma_result *r)
{
	memset(r, 0, sizeof(*r));
	if (port == 0 || port > UINT16_MAX) {
		r->status = -EINVAL;
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons((uint16_t)port)};
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		r->status = -errno;
		if (fd >= 0)
			close(fd);
		return;
	}
	stream(fd, true, local, pool, initiator, info, len, r);
}
