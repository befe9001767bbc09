/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_TRANSPORT_XPORT_TEST_UTIL_H
#define KVX_TESTS_TRANSPORT_XPORT_TEST_UTIL_H
/*
 * Initiator-side helpers of the transport tests that post to a real target process
 * (tests/transport/peer.c): connect an endpoint of a fresh context to the target, register
 * local buffers, wait for one completion, compute a condition word. They assert (Criterion)
 * on any failure. Link xport_test_util.c and peer.c.
 */
#include <stdint.h>

#include "kvxfer/transport.h"
#include "peer.h"

/* Start a target process of @p provider (peer_start()) and connect to it: open a context with
 * @p prm, assert it supports conditional ops (caps.cond_ops), create an endpoint and exchange
 * its blobs with the target (peer_accept(), kvx_xport_ep_connect()). */
void cond_rig_connect(struct peer *pe, const char *provider, const struct kvx_xport_ctx_params *prm,
		      struct kvx_xport_ctx **ctx, struct kvx_xport_ep **ep);

/* Register a fresh page-aligned host buffer of @p len bytes (in *mem; the caller frees it) with
 * @p ctx, access ALL. */
struct kvx_xport_mr *local_mr(struct kvx_xport_ctx *ctx, uint8_t **mem, uint64_t len);

/* Poll @p ep (sleeping in kvx_xport_ep_wait() between polls where the provider can) until one
 * completion arrives; asserts that it comes within 30 s. */
struct kvx_xport_cpl wait_cpl(struct kvx_xport_ep *ep);

/* The word at byte offset @p off of a region filled with pattern @p seed (little-endian load). */
uint64_t word_of(uint64_t seed, uint64_t off);

#endif
