/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_PERF_TRACE_INTERNAL_H
#define KVX_BENCH_PERF_TRACE_INTERNAL_H
/* Shared by the driver (perf_trace.c) and the --server loop (perf_trace_server.c). */
#include <stdint.h>

#include "trace_replay.h"

/* The pools made resident on this machine (@p sides of @p pool blocks) must fit half of
 * MemAvailable together. Returns 0, or 2 with a message. */
int trace_check_pool_fits(const struct trace_opts *o, uint64_t pool, uint64_t block_bytes, int sides);

/* Validate the lcore options one role will get exactly as its engine will, before forking.
 * Returns 0, or 2 with a message naming @p who. */
int trace_check_role_lcores(const struct trace_opts *o, const char *lcores, const char *who);

/* --auth-dir: how long a peer may take over the driver channel's authentication exchange. */
#define TRACE_AUTH_TIMEOUT_NS (30ull * 1000000000ull)

/* --auth-dir DIR must hold a usable key pair: 0, or 2 with a message. */
int trace_auth_check(const char *dir);

/* --server: serve o->runs runs (0 = until stopped) on o->port. Returns 0 if every run succeeded,
 * 1 if one failed or the port cannot be bound, 2 for a usage error. */
int trace_run_server(struct trace_opts *o);

#endif
