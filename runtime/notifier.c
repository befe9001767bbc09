/* SPDX-License-Identifier: Apache-2.0 */
/* The scheduler-side notifier (engine.h, kvx_notifier_*): `remote_blocks` and `release` sent by a
 * decode DP rank's scheduler process, which registers no memory and runs no engine (MoRIIO's
 * scheduler half, docs/protocol.md §1.3 step 5b). A control object (control/ctl.c) with no
 * handlers does the sending: its thread owns the DEALER cache and CURVE; the caller's thread
 * hands each message over through one inbox (SPSC), so the notifier has one user thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/control.h"
#include "kvxfer/engine.h"
#include "kvxfer/internal/codec.h"
#include "kvxfer/internal/ctl.h"

struct kvx_notifier {
	struct kvx_engine_params p; /* copied at create; strings not kept */
	struct kvx_ctl *ctl;
	struct kvx_ctl_inbox *ib; /* written by the user thread only */
};

static int nbad(char *err, size_t errlen, const char *field, const char *why)
{
	if (err && errlen)
		snprintf(err, errlen, "notifier params: %s: %s", field, why);
	kvx_log(KVX_LOG_ERROR, "notifier params: %s: %s", field, why);
	return -EINVAL;
}

KVX_API int kvx_notifier_create(const struct kvx_engine_params *p, struct kvx_notifier **out, char *err,
				size_t errlen)
{
	if (!p || !out)
		return nbad(err, errlen, "params", "NULL params or out");
	if (p->role != KVX_SCHED_CONSUMER || p->mode != KVX_SCHED_MODE_WRITE)
		return nbad(err, errlen, "role/mode", "a notifier serves a WRITE consumer (decode scheduler)");
	if (!p->host || !*p->host || strlen(p->host) >= KVX_ENGINE_HOST_MAX)
		return nbad(err, errlen, "host", "required, 1..63 bytes");
	if (p->dp_size == 0 || p->dp_rank >= p->dp_size)
		return nbad(err, errlen, "dp_rank/dp_size", "dp_size > 0 and dp_rank < dp_size");
	if (p->tp_size == 0)
		return nbad(err, errlen, "tp_size", "must be > 0");
	if (p->max_blocks == 0 || p->max_blocks > (1u << 24))
		return nbad(err, errlen, "max_blocks", "must be in 1..16777216");
	struct kvx_notifier *nt = calloc(1, sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	nt->p = *p;
	struct kvx_ctl_params cp = {
		.host = p->host,
		.bind_host = "127.0.0.1", /* its listeners serve nothing: keep them off the network */
		.ephemeral_ports = true,
		.port_mode = p->vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE,
		.dp_rank = p->dp_rank,
		.dp_size = p->dp_size,
		.dp_size_local = p->dp_size_local,
		.tp_rank = 0,
		.tp_size = 1,
		.role = KVX_CTL_ROLE_CONSUMER,
		.transfer_mode = KVX_CTL_MODE_WRITE,
		.max_inboxes = 1,
		.auth_dir = p->auth_dir,
	};
	int rc = kvx_ctl_create(&cp, &nt->ctl);
	rc = rc ? rc : kvx_ctl_start(nt->ctl);
	rc = rc ? rc : kvx_ctl_inbox_open(nt->ctl, &nt->ib);
	if (rc) {
		if (err && errlen)
			snprintf(err, errlen, "notifier: control thread: %s", strerror(-rc));
		kvx_ctl_destroy(nt->ctl);
		free(nt);
		return rc;
	}
	nt->p.host = nt->p.transport = nt->p.lcores = nt->p.proxy_addr = nt->p.http_addr = NULL;
	nt->p.verbs_device = nt->p.metrics_addr = nt->p.auth_dir = NULL;
	*out = nt;
	return 0;
}

KVX_API int kvx_notifier_announce(struct kvx_notifier *nt, const struct kvx_engine_announce *a,
				  const char *req_id)
{
	if (!nt || !a || !a->transfer_id)
		return -EINVAL;
	size_t rl = req_id ? strnlen(req_id, KVX_MSG_ID_MAX + 1) : 0;
	if (rl > KVX_MSG_ID_MAX)
		return -EINVAL;
	const struct kvx_engine_peer *pr = &a->peer;
	size_t tl = strnlen(a->transfer_id, KVX_ENGINE_ID_MAX);
	if (tl == 0 || tl >= KVX_ENGINE_ID_MAX || tl > KVX_MSG_ID_MAX || a->n > nt->p.max_blocks ||
	    (a->n && !a->local_blocks) || !pr->host || !*pr->host || pr->num_remote_hosts > KVX_ENGINE_MAX_PODS ||
	    (pr->num_remote_hosts && !pr->remote_hosts))
		return -EINVAL;
	for (size_t i = 0; i < a->n; i++)
		if (a->local_blocks[i] > INT32_MAX)
			return -EINVAL;
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	memcpy(m.transfer_id, a->transfer_id, tl + 1);
	if (a->n) {
		m.type = KVX_MSG_REMOTE_BLOCKS;
		m.block_ids = (uint32_t *)a->local_blocks;
		m.num_blocks = (uint32_t)a->n;
		m.decode_rank = nt->p.dp_rank;
		if (rl)
			memcpy(m.req_id, req_id, rl + 1);
	} else {
		m.type = KVX_MSG_RELEASE;
		m.consumer_tp_size = nt->p.tp_size;
		m.has_consumer_tp_size = true;
	}
	/* The producer DP rank's host (its pod's, docs/protocol.md §5.8) and every TP rank's port. */
	const char *host;
	uint32_t local;
	kvx_ctl_dp_target(pr->dp_rank, pr->dp_size_local, pr->num_remote_hosts ? pr->remote_hosts : NULL,
			  pr->num_remote_hosts, pr->host, &host, &local);
	uint32_t ptp = pr->tp_size ? pr->tp_size : nt->p.tp_size;
	enum kvx_ctl_port_mode pm = nt->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE;
	for (uint32_t r = 0; r < ptp; r++) {
		uint16_t port;
		int rc = kvx_ctl_port(pm, pr->notify_port, local, r, ptp, &port);
		rc = rc ? rc : kvx_ctl_send_notify(nt->ib, host, port, &m);
		if (rc)
			return rc;
	}
	return 0;
}

KVX_API void kvx_notifier_destroy(struct kvx_notifier *nt)
{
	if (!nt)
		return;
	kvx_ctl_inbox_close(nt->ib); /* the control thread sends what is queued, then frees it */
	kvx_ctl_destroy(nt->ctl);    /* joins the thread; DEALERs linger for a bounded flush */
	free(nt);
}
