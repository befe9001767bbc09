/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_NET_H
#define KVX_BENCH_TRACE_NET_H
/**
 * @file
 * Network helpers of `kvxfer-perf trace` across two hosts: TCP connect with a deadline and an
 * error that names what could not be reached, the local address a connection uses (the
 * default `--host`), loopback detection, and the `--port-range` option. Not thread-safe only in
 * the sense that callers own their buffers; no global state.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/**
 * Connect to @p host : @p port within @p timeout_ms.
 * @param host        IP literal or name; not NULL.
 * @param port        TCP port, 1..65535.
 * @param timeout_ms  Deadline for the whole attempt (all resolved addresses), ms, > 0.
 * @param what        What listens there, for the message (e.g. "the --server's driver
 *                    channel"); not NULL.
 * @param[out] why    On failure: "cannot reach WHAT at HOST:PORT: REASON (HINT)"; not NULL.
 * @param why_len     Size of @p why, bytes.
 * @return            A connected, blocking socket (>= 0), or -ETIMEDOUT (nothing answered:
 *                    filtered, wrong address, host down), -ECONNREFUSED (nothing listens),
 *                    -EHOSTUNREACH / -ENETUNREACH, -EINVAL (cannot resolve), or another -errno.
 */
int trace_net_connect(const char *host, uint16_t port, uint32_t timeout_ms, const char *what,
		      char *why, size_t why_len);

/**
 * Numeric local address of a connected socket (IPv4-mapped IPv6 written as plain IPv4): the
 * address of this host that the peer reached or that reaches the peer.
 * @param fd        Connected socket.
 * @param[out] buf  NUL-terminated address; not NULL.
 * @param len       Size of @p buf, bytes (64 is enough).
 * @return 0 or -errno.
 */
int trace_net_local_addr(int fd, char *buf, size_t len);

/** Is @p host a loopback address (127.0.0.0/8, ::1, "localhost")? @param host Host; not NULL. */
bool trace_net_is_loopback(const char *host);

/**
 * Parse `--port-range LO-HI` (1 <= LO <= HI <= 65535, at least @p need ports).
 * @param s        Text; not NULL.
 * @param need     Ports the caller will bind in the range.
 * @param[out] lo  First port. @param[out] hi Last port.
 * @return 0 or -EINVAL.
 */
int trace_net_parse_range(const char *s, uint32_t need, uint16_t *lo, uint16_t *hi);

#endif
