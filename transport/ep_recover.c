/* SPDX-License-Identifier: Apache-2.0 */
/* Endpoint recovery after an error (kvx_xport_ep_reset / kvx_xport_ep_reaccept): dispatched
 * through the provider's ops table; providers without it (tcp, shm) answer -ENOTSUP (verbs: QP
 * reset and re-connect, docs/runtime-notes.md §3.10). */
#include "transport_internal.h"

#include <errno.h>

int kvx_xport_ep_reset(struct kvx_xport_ep *ep, void *blob, size_t cap, size_t *blob_len)
{
	if (!ep || !blob || !blob_len)
		return -EINVAL;
	if (!ep->initiator)
		return -ENOTSUP;
	return ep->ctx->ops->ep_reset(ep, blob, cap, blob_len);
}

int kvx_xport_ep_reaccept(struct kvx_xport_ep *ep, const void *blob_a, size_t len_a, void *blob_b,
			  size_t cap, size_t *len_b)
{
	if (!ep || !blob_a || !blob_b || !len_b)
		return -EINVAL;
	if (ep->initiator)
		return -ENOTSUP;
	return ep->ctx->ops->ep_reaccept(ep, blob_a, len_a, blob_b, cap, len_b);
}
