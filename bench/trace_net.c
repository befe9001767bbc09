/* SPDX-License-Identifier: Apache-2.0 */
/* Two-host helpers of kvxfer-perf trace (trace_net.h). */
#include "trace_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* One address: non-blocking connect, wait until @p end_ms. Returns the fd or -errno. */
static int connect_one(const struct addrinfo *a, uint64_t end_ms)
{
	int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, a->ai_addr, a->ai_addrlen) && errno != EINPROGRESS) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	for (;;) {
		uint64_t t = now_ms();
		if (t >= end_ms) {
			close(fd);
			return -ETIMEDOUT;
		}
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		int pr = poll(&pf, 1, (int)(end_ms - t));
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0) {
			int rc = -errno;
			close(fd);
			return rc;
		}
		if (pr == 0)
			continue; /* re-check the deadline */
		int err = 0;
		socklen_t el = sizeof(err);
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err) {
			close(fd);
			return -(err ? err : errno);
		}
		int fl = fcntl(fd, F_GETFL);
		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
		return fd;
	}
}

int trace_net_connect(const char *host, uint16_t port, uint32_t timeout_ms, const char *what,
		      char *why, size_t why_len)
{
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	int g = getaddrinfo(host, ps, &hints, &ai);
	if (g) {
		snprintf(why, why_len, "cannot reach %s at %s:%u: cannot resolve %s (%s)", what, host, port,
			 host, gai_strerror(g));
		return -EINVAL;
	}
	uint64_t end = now_ms() + timeout_ms;
	int rc = -ETIMEDOUT;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		rc = connect_one(a, end);
		if (rc >= 0)
			break;
	}
	freeaddrinfo(ai);
	if (rc >= 0)
		return rc;
	const char *hint = rc == -ETIMEDOUT      ? "nothing answered: a firewall drops the packets, the "
						   "address is wrong, or the host is down"
			   : rc == -ECONNREFUSED ? "nothing listens on that port there"
						 : "no route to that address";
	if (rc == -ETIMEDOUT)
		snprintf(why, why_len, "cannot reach %s at %s:%u: no answer within %u ms (%s)", what, host,
			 port, timeout_ms, hint);
	else
		snprintf(why, why_len, "cannot reach %s at %s:%u: %s (%s)", what, host, port,
			 strerror(-rc), hint);
	return rc;
}

int trace_net_local_addr(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl))
		return -errno;
	if (ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&ss;
		if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
			struct in_addr v4;
			memcpy(&v4, &s6->sin6_addr.s6_addr[12], 4);
			return inet_ntop(AF_INET, &v4, buf, (socklen_t)len) ? 0 : -errno;
		}
		return inet_ntop(AF_INET6, &s6->sin6_addr, buf, (socklen_t)len) ? 0 : -errno;
	}
	if (ss.ss_family == AF_INET)
		return inet_ntop(AF_INET, &((const struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)len)
			       ? 0
			       : -errno;
	return -EAFNOSUPPORT;
}

bool trace_net_is_loopback(const char *host)
{
	if (!strcmp(host, "localhost") || !strcmp(host, "::1"))
		return true;
	struct in_addr a;
	if (inet_pton(AF_INET, host, &a) == 1)
		return (ntohl(a.s_addr) >> 24) == 127;
	struct in6_addr a6;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6) ||
		       (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
	return false;
}

int trace_net_parse_range(const char *s, uint32_t need, uint16_t *lo, uint16_t *hi)
{
	char *end;
	errno = 0;
	unsigned long a = strtoul(s, &end, 10);
	if (errno || end == s || *end != '-' || s[0] == '-')
		return -EINVAL;
	const char *t = end + 1;
	unsigned long b = strtoul(t, &end, 10);
	if (errno || end == t || *end || t[0] == '-' || a < 1 || b > 65535 || a > b || b - a + 1 < need)
		return -EINVAL;
	*lo = (uint16_t)a;
	*hi = (uint16_t)b;
	return 0;
}
