/* SPDX-License-Identifier: Apache-2.0 */
/* Initiator-side transport test helpers (see xport_test_util.h). */
#include "xport_test_util.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/common.h"

void cond_rig_connect(struct peer *pe, const char *provider, const struct kvx_xport_ctx_params *prm,
		      struct kvx_xport_ctx **ctx, struct kvx_xport_ep **ep)
{
	cr_assert_eq(peer_start(pe, provider, prm), 0);
	*ctx = NULL;
	cr_assert_eq(kvx_xport_open(provider, prm, ctx), 0);
	struct kvx_xport_caps caps;
	cr_assert_eq(kvx_xport_query_caps(*ctx, &caps), 0);
	cr_assert(caps.cond_ops);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t al = 0, bl = 0;
	*ep = NULL;
	cr_assert_eq(kvx_xport_ep_create(*ctx, ep, a, sizeof(a), &al), 0);
	cr_assert_eq(peer_accept(pe, a, al, b, &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(*ep, b, bl), 0);
}

struct kvx_xport_mr *local_mr(struct kvx_xport_ctx *ctx, uint8_t **mem, uint64_t len)
{
	*mem = aligned_alloc(4096, (len + 4095) & ~4095ull);
	cr_assert_not_null(*mem);
	struct kvx_xport_mr_params p = {.addr = *mem, .len_bytes = len, .access = KVX_XPORT_ACCESS_ALL,
					.mem_type = KVX_XPORT_MEM_HOST};
	struct kvx_xport_mr *mr = NULL;
	cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), 0);
	return mr;
}

struct kvx_xport_cpl wait_cpl(struct kvx_xport_ep *ep)
{
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	struct kvx_xport_cpl c;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0) {
		cr_assert_lt(kvx_now_ns(), deadline, "no completion within 30 s");
		kvx_xport_ep_wait(ep, 1); /* shm: -ENOTSUP at once (its host ops complete in the post) */
	}
	return c;
}

uint64_t word_of(uint64_t seed, uint64_t off)
{
	uint8_t b[8];
	pat_fill(b, 8, seed, off);
	uint64_t w;
	memcpy(&w, b, 8);
	return w;
}
