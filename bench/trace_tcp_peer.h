/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_TCP_PEER_H
#define KVX_BENCH_TRACE_TCP_PEER_H
/**
 * @file
 * `kvxfer-perf trace --local --peer tcp`: a plain streaming TCP loop that moves the replay's
 * bytes again between the same two pools, the like-for-like reference of the tcp main job
 * (docs/performance.md §12). iperf3 sends one hot 1 MiB buffer over and over; the replay reads
 * and writes gigabytes of pool memory that no cache holds, so this loop shows what a socket
 * loop reaches on the same memory.
 *
 * The producer role sends and the consumer role receives, in both modes (the KV bytes flow
 * from prefill to decode either way), over one loopback connection with blocking
 * sendmsg()/recvmsg() of up to IOV_MAX ranges per call. Both walk the ranges of
 * trace_cma_each_extent() with the other role's CMA_INFO, each merging ranges that continue in
 * its own pool, so the byte stream lands where the replay put it. The receiver is timed from
 * the accepted connection to its last byte; neither side fills nor checks.
 *
 * Driver channel (after the replay; struct trace_cma_result answers both):
 *  - TCP_RECV (driver -> consumer): the producer's CMA_INFO. The consumer listens on an
 *    ephemeral loopback port, answers TCP_PORT (uint32_t port), accepts one connection (at
 *    most TRACE_TCP_PEER_ACCEPT_MS) and receives.
 *  - TCP_SEND (driver -> producer): struct trace_tcp_send, then the consumer's CMA_INFO.
 * Not thread-safe: each role's main thread runs its side.
 */
#include "trace_cma.h"

#include <stdint.h>

/** How long the receiver waits for the sender's connection, ms. */
#define TRACE_TCP_PEER_ACCEPT_MS 10000

/** Head of a TCP_SEND payload; the consumer's CMA_INFO follows. */
struct trace_tcp_send {
	uint32_t port; /**< Loopback port the consumer listens on. */
	uint32_t pad;
};

/**
 * Open the receiver's listening socket on 127.0.0.1, an ephemeral port.
 * @param[out] port  The port (host order).
 * @return The socket (close it after trace_tcp_peer_recv()), or -errno.
 */
int trace_tcp_peer_listen(uint32_t *port);

/**
 * Consumer side: accept one connection on @p lfd and receive every range into @p pool.
 * @param initiator  This role initiated the replay's transfers (READ mode).
 * @param info, len  The producer's CMA_INFO payload.
 * @param[out] r     Counters (calls: its recvmsg calls; iovs: ranges after merging, in this
 *                   pool); r->status 0,
 *                   -ETIMEDOUT (no connection), -ECONNRESET (the stream ended early), or as
 *                   trace_cma_each_extent() / the failed call.
 */
void trace_tcp_peer_recv(int lfd, const struct trace_cma_log *local, const struct trace_cma_pool *pool,
			 bool initiator, const void *info, size_t len, struct trace_cma_result *r);

/**
 * Producer side: connect to 127.0.0.1:@p port and send every range of @p pool.
 * @param initiator  This role initiated the replay's transfers (WRITE mode).
 * @param[out] r     Counters (calls = sendmsg calls), status as trace_tcp_peer_recv().
 */
void trace_tcp_peer_send(uint32_t port, const struct trace_cma_log *local, const struct trace_cma_pool *pool,
			 bool initiator, const void *info, size_t len, struct trace_cma_result *r);

#endif
