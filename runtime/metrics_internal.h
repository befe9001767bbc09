/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_RUNTIME_METRICS_INTERNAL_H
#define KVX_RUNTIME_METRICS_INTERNAL_H
/*
 * Prometheus text-format metrics endpoint of an engine (runtime/metrics.c), off unless
 * kvx_engine_params.metrics_addr is set. Built on the public statistics
 * (kvx_engine_get_stats(), kvx_ctl_counters_get()) plus the completions the application polls.
 *
 * Threads and ownership (docs/architecture.md §1):
 * - the engine's application thread owns the accumulators (completion counts, latency
 *   histogram) and fills snapshots: in kvx_metrics_on_poll(), at most every
 *   KVX_METRICS_PUBLISH_NS, it takes a free snapshot buffer from the `free` ring, fills it and
 *   enqueues it on the `full` ring (release: the contents happen-before the dequeue); what it
 *   copies from other threads are relaxed atomic loads of their single-writer counters (e.g.
 *   the tcp data plane's refusals, written by the target's progress poller and loaded through
 *   kvx_engine_get_stats() -> kvx_xport_ctx_service_counters());
 * - libmicrohttpd's one internal polling thread serves GET /metrics: it drains `full`, keeps the
 *   newest snapshot, returns the older ones on `free`, and renders the text from the snapshot
 *   it holds. It never touches the engine.
 * So the endpoint shows the engine as of the application's last poll (at most ~100 ms old
 * while the application polls; `kvxfer_metrics_snapshot_age_seconds` says how old).
 */
#include <stddef.h>

#include "kvxfer/engine.h"

struct kvx_ctl;
struct kvx_metrics;

/** Most time between two published snapshots while the application polls, ns. */
#define KVX_METRICS_PUBLISH_NS 100000000ull

/*
 * Validate and copy @p addr ("IP:PORT", "[IPv6]:PORT" or ":PORT" = every interface; PORT 0 =
 * kernel-chosen). Nothing is bound yet. Returns 0, -EINVAL (message in @p err), -ENOTSUP (built
 * without libmicrohttpd), -ENOMEM.
 */
int kvx_metrics_create(const char *addr, struct kvx_metrics **out, char *err, size_t errlen);

/* Bind and start serving (application thread, first thing in kvx_engine_start()). Returns 0,
 * -EADDRINUSE, -EADDRNOTAVAIL or -EIO (message logged, naming the address). Until the first
 * snapshot the endpoint answers 503. */
int kvx_metrics_start(struct kvx_metrics *m, const struct kvx_engine_params *p);

/* The engine's transfer-object pool as its application thread sees it (runtime/api.c). */
struct kvx_metrics_app {
	size_t objects;     /* transfer objects taken: submitted, last completion not yet polled */
	size_t held;        /* of those, terminal (KVX_CPL_TRANSFER polled) with blocks in quarantine
	                       (KVX_CPL_BLOCKS_RELEASED still due) */
	uint64_t pool_full; /* submissions refused with -ENOBUFS: max_transfers objects taken */
};

/*
 * Account @p n completions the application just polled and publish a snapshot when the last one
 * is older than KVX_METRICS_PUBLISH_NS (always when @p force). @p app: the pool's figures;
 * @p ctl = the engine's control lcore (its counters are read too), or NULL.
 * Application thread only; no allocation, no lock.
 */
void kvx_metrics_on_poll(struct kvx_metrics *m, const struct kvx_engine *e, const struct kvx_ctl *ctl,
			 const struct kvx_completion *c, size_t n, const struct kvx_metrics_app *app, bool force);

/* Bound "IP:PORT" (after start) into @p buf; -EAGAIN before start. */
int kvx_metrics_addr(const struct kvx_metrics *m, char *buf, size_t len);

/* Stop serving (joins libmicrohttpd's thread). Idempotent; NULL is a no-op. */
void kvx_metrics_stop(struct kvx_metrics *m);

/* Stop and free; NULL is a no-op. */
void kvx_metrics_destroy(struct kvx_metrics *m);

#endif
