/* SPDX-License-Identifier: Apache-2.0 */
/* verbs provider: RC QPs per endpoint, out-of-band connection blobs, QP state machine,
 * reset/re-connect (docs/runtime-notes.md §3.2, §3.8, §3.10, §3.11). */
#include "verbs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/random.h>

#ifdef KVX_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#endif

/*
 * Blob A (initiator -> target) and B (target -> initiator), after the common 8-byte header:
 *   8 token u32 | 12 flags u8 (bit 0: reconnect) | 13 path MTU u8 (enum ibv_mtu) |
 *  14 link layer u8 | 15 QP count u8 | 16 LID u16 | 18 reserved u16 (0) |
 *  20 responder resources u32 (A: max_qp_rd_atom; B: negotiated) |
 *  24 initiator depth u32 (max_qp_init_rd_atom) | 28 GID 16 bytes |
 *  44 + 8*i: QPN u32, PSN u32 of QP i.
 */
#define BLOB_FIXED 44u
#define BLOB_F_RECONNECT 1u

struct peer_info {
	uint32_t token, flags, nqp, rd_atom, init_rd_atom;
	uint8_t mtu, link_layer;
	uint16_t lid;
	union ibv_gid gid;
	uint32_t qpn[VERBS_MAX_QPS], psn[VERBS_MAX_QPS];
};

static uint32_t rand24(void)
{
	uint32_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
		v = (uint32_t)kvx_now_ns() * 2654435761u;
	return v & 0xffffff;
}

static size_t blob_len(uint32_t nqp)
{
	return BLOB_FIXED + 8u * nqp;
}

static int blob_put(const struct vep *e, int kind, uint32_t flags, uint32_t rd_atom,
		    uint8_t *b, size_t cap, size_t *len)
{
	const struct vctx *c = (const struct vctx *)e->base.ctx;
	size_t need = blob_len(e->nqp);
	if (cap < need)
		return -EMSGSIZE;
	xport_blob_hdr_put(b, KVX_XPORT_PROV_VERBS, kind);
	xport_put_u32(b + 8, e->token);
	b[12] = (uint8_t)flags;
	b[13] = (uint8_t)c->mtu;
	b[14] = c->link_layer;
	b[15] = (uint8_t)e->nqp;
	xport_put_u16(b + 16, c->lid);
	xport_put_u16(b + 18, 0);
	xport_put_u32(b + 20, rd_atom);
	xport_put_u32(b + 24, (uint32_t)c->dattr.max_qp_init_rd_atom);
	memcpy(b + 28, c->gid.raw, 16);
	for (uint32_t i = 0; i < e->nqp; i++) {
		xport_put_u32(b + BLOB_FIXED + 8 * i, e->qps[i].qp->qp_num);
		xport_put_u32(b + BLOB_FIXED + 8 * i + 4, e->qps[i].psn);
	}
	*len = need;
	return 0;
}

/* Parse and validate an untrusted blob; logs the offending field. */
static int blob_get(const struct vctx *c, const uint8_t *b, size_t len, int kind,
		    struct peer_info *pi)
{
	const char *who = kind == XPORT_BLOB_A ? "verbs: blob A" : "verbs: blob B";
	if (len < BLOB_FIXED) {
		kvx_log(KVX_LOG_WARN, "%s: length %zu below %u", who, len, BLOB_FIXED);
		return -EMSGSIZE;
	}
	uint32_t nqp = b[15];
	if (nqp < 1 || nqp > VERBS_MAX_QPS) {
		kvx_log(KVX_LOG_WARN, "%s: QP count %u out of range 1..%u", who, nqp, VERBS_MAX_QPS);
		return -EPROTO;
	}
	int rc = xport_blob_hdr_check(b, len, blob_len(nqp), KVX_XPORT_PROV_VERBS, kind, who);
	if (rc)
		return rc;
	memset(pi, 0, sizeof(*pi));
	pi->token = xport_get_u32(b + 8);
	pi->flags = b[12];
	pi->mtu = b[13];
	pi->link_layer = b[14];
	pi->nqp = nqp;
	pi->lid = xport_get_u16(b + 16);
	pi->rd_atom = xport_get_u32(b + 20);
	pi->init_rd_atom = xport_get_u32(b + 24);
	memcpy(pi->gid.raw, b + 28, 16);
	const char *bad = NULL;
	if (pi->flags & ~BLOB_F_RECONNECT)
		bad = "flags";
	else if (pi->mtu < IBV_MTU_256 || pi->mtu > IBV_MTU_4096)
		bad = "path MTU";
	else if (pi->link_layer != c->link_layer)
		bad = "link layer";
	else if (xport_get_u16(b + 18))
		bad = "reserved";
	else if (pi->rd_atom < 1 || pi->rd_atom > 255)
		bad = "responder resources";
	else if (pi->init_rd_atom > 255)
		bad = "initiator depth";
	for (uint32_t i = 0; !bad && i < nqp; i++) {
		pi->qpn[i] = xport_get_u32(b + BLOB_FIXED + 8 * i);
		pi->psn[i] = xport_get_u32(b + BLOB_FIXED + 8 * i + 4);
		if (pi->qpn[i] > 0xffffff || pi->qpn[i] < 2)
			bad = "QPN";
		else if (pi->psn[i] > 0xffffff)
			bad = "PSN";
	}
	if (bad) {
		kvx_log(KVX_LOG_WARN, "%s rejected: bad %s", who, bad);
		return -EPROTO;
	}
	return 0;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* Extension point for direct-verbs QP creation (enum verbs_dv in verbs_internal.h). */
static struct ibv_qp *verbs_dv_create_qp(struct vctx *c, struct ibv_qp_init_attr *ia)
{
#ifdef KVX_HAVE_MLX5DV
	if (c->dv == VERBS_DV_MLX5) {
		struct ibv_qp_init_attr_ex ix = {
			.qp_context = ia->qp_context,
			.send_cq = ia->send_cq,
			.recv_cq = ia->recv_cq,
			.cap = ia->cap,
			.qp_type = ia->qp_type,
			.sq_sig_all = ia->sq_sig_all,
			.comp_mask = IBV_QP_INIT_ATTR_PD,
			.pd = c->pd,
		};
		/* Scatter-to-CQE would place small READ responses in the CQE; the results must
		 * be identical to plain verbs, so keep all data in the registered buffers. */
		struct mlx5dv_qp_init_attr dx = {
			.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
			.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
		};
		struct ibv_qp *qp = mlx5dv_create_qp(c->ibctx, &ix, &dx);
		if (qp)
			ia->cap = ix.cap;
		return qp;
	}
#endif
	return ibv_create_qp(c->pd, ia);
}

static int qp_to_init(struct vctx *c, struct ibv_qp *qp, bool target)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = c->port,
		/* The initiator's QPs accept nothing remote; the target's accept READ and WRITE,
		 * further restricted per region by the MR access flags. */
		.qp_access_flags = target ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE : 0,
	};
	int rc = ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	return rc ? verbs_errno(rc) : 0;
}

static int qp_to_rtr(struct vctx *c, struct ibv_qp *qp, const struct peer_info *pi, uint32_t i,
		     uint32_t dest_rd)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = (enum ibv_mtu)min_u32(c->mtu, pi->mtu),
		.dest_qp_num = pi->qpn[i],
		.rq_psn = pi->psn[i],
		.max_dest_rd_atomic = (uint8_t)dest_rd,
		.min_rnr_timer = VERBS_MIN_RNR_TIMER,
		.ah_attr = {
			.dlid = pi->lid,
			.sl = 0,
			.src_path_bits = 0,
			.port_num = c->port,
		},
	};
	bool zero = true;
	for (int k = 0; k < 16; k++)
		zero = zero && !pi->gid.raw[k];
	if (c->link_layer == IBV_LINK_LAYER_ETHERNET || !zero) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = pi->gid;
		a.ah_attr.grh.sgid_index = (uint8_t)c->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	int rc = ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				       IBV_QP_MIN_RNR_TIMER);
	return rc ? verbs_errno(rc) : 0;
}

static int qp_to_rts(struct vctx *c, struct ibv_qp *qp, uint32_t psn, uint32_t rd)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = psn,
		.max_rd_atomic = (uint8_t)rd,
		.timeout = VERBS_QP_TIMEOUT,
		.retry_cnt = VERBS_RETRY_CNT,
		.rnr_retry = VERBS_RNR_RETRY,
	};
	int rc = ibv_modify_qp(qp, &a,
			       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
				       IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY);
	if (rc)
		return verbs_errno(rc);
#ifdef KVX_HAVE_MLX5DV
	/* Per-QP UDP source port: ECMP entropy for RoCE v2 (mlx5dv_modify_qp_udp_sport.3). */
	if (c->dv == VERBS_DV_MLX5 && c->link_layer == IBV_LINK_LAYER_ETHERNET)
		(void)mlx5dv_modify_qp_udp_sport(qp, (uint16_t)(0xc000 | (qp->qp_num & 0x3fff)));
#endif
	return 0;
}

static int qp_reset(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
	int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	return rc ? verbs_errno(rc) : 0;
}

/* ---- completion queues: private per endpoint, or shared by a poll group ---- */

static struct ibv_comp_channel *channel_create(struct vctx *c)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c->ibctx);
	if (!ch) {
		int rc = verbs_errno(-1);
		kvx_log(KVX_LOG_ERROR, "verbs: ibv_create_comp_channel: %s", kvx_strerror(rc));
		return NULL;
	}
	/* kvx_xport_ep_wait() poll()s it and drains events without blocking. */
	int fl = fcntl(ch->fd, F_GETFL);
	if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		kvx_log(KVX_LOG_ERROR, "verbs: completion channel O_NONBLOCK: %s", strerror(errno));
		ibv_destroy_comp_channel(ch);
		return NULL;
	}
	return ch;
}

static void vcq_free(struct vcq *vc)
{
	if (vc->cq)
		ibv_destroy_cq(vc->cq);
	if (!vc->grp && vc->ch)
		ibv_destroy_comp_channel(vc->ch);
	free(vc);
}

static int vcq_create(struct vctx *c, struct vgroup *g, uint32_t cap, bool channel,
		      struct vcq **out)
{
	struct vcq *vc = calloc(1, sizeof(*vc));
	if (!vc)
		return -ENOMEM;
	vc->grp = g;
	vc->ch = g ? g->ch : channel ? channel_create(c) : NULL;
	if (channel && !vc->ch) {
		free(vc);
		return -EIO;
	}
	vc->cq = ibv_create_cq(c->ibctx, (int)cap, vc, vc->ch, 0);
	if (!vc->cq) {
		int rc = verbs_errno(-1);
		kvx_log(KVX_LOG_ERROR, "verbs: ibv_create_cq(%u): %s", cap, kvx_strerror(rc));
		vcq_free(vc);
		return rc;
	}
	vc->cap = (uint32_t)vc->cq->cqe < cap ? (uint32_t)vc->cq->cqe : cap;
	*out = vc;
	return 0;
}

void verbs_groups_free(struct vctx *c)
{
	while (c->groups) {
		struct vgroup *g = c->groups;
		c->groups = g->next;
		while (g->cqs) {
			struct vcq *vc = g->cqs;
			g->cqs = vc->next;
			vcq_free(vc);
		}
		if (g->ch)
			ibv_destroy_comp_channel(g->ch);
		free(g);
	}
}

static int group_get(struct vctx *c, uint32_t id, struct vgroup **out)
{
	for (struct vgroup *g = c->groups; g; g = g->next)
		if (g->id == id) {
			*out = g;
			return 0;
		}
	struct vgroup *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->id = id;
	g->ch = channel_create(c);
	if (!g->ch) {
		free(g);
		return -EIO;
	}
	g->next = c->groups;
	c->groups = g;
	*out = g;
	return 0;
}

/* Worst-case CQ entries of an endpoint: every QP's whole send queue flushed (docs/runtime-notes.md
 * §3.7: an overrun CQ is lost), plus its receive slot. */
static uint32_t ep_cqe_need(const struct vep *e)
{
	return e->nqp * (e->sq_depth + 1);
}

/* Pick (or create) the CQ the endpoint's QPs go on and reserve a slot in it. Not yet
 * published: vcq_publish() once the endpoint is complete. */
static int vcq_attach(struct vctx *c, struct vep *e, bool grouped, uint32_t group, bool target)
{
	uint32_t need = ep_cqe_need(e);
	struct vcq *vc = NULL;
	int rc;
	if (!grouped) {
		if ((rc = vcq_create(c, NULL, need + 16, !target, &vc)))
			return rc;
	} else {
		struct vgroup *g;
		if ((rc = group_get(c, group, &g)))
			return rc;
		for (vc = g->cqs; vc; vc = vc->next)
			if (vc->n_eps < VERBS_CQ_SLOTS && vc->cap - vc->reserved >= need)
				break;
		if (!vc) {
			uint32_t max = (uint32_t)c->dattr.max_cqe;
			uint32_t cap = VERBS_GROUP_CQE < max ? VERBS_GROUP_CQE : max;
			if (cap < need) {
				kvx_log(KVX_LOG_ERROR, "verbs: an endpoint of %u QPs needs %u CQ entries, "
					"the device allows %u", e->nqp, need, max);
				return -ENOMEM;
			}
			if ((rc = vcq_create(c, g, cap, true, &vc)))
				return rc;
			vc->next = g->cqs;
			g->cqs = vc;
		}
	}
	uint32_t s = 0;
	while (vc->used[s])
		s++; /* n_eps < VERBS_CQ_SLOTS: a free slot exists */
	vc->used[s] = 1;
	vc->reserved += need;
	vc->n_eps++;
	e->vc = vc;
	e->slot = s;
	e->wr_tag = (uint64_t)vc->gen[s] << VERBS_WRID_GEN_SHIFT | (uint64_t)s << VERBS_WRID_SLOT_SHIFT;
	return 0;
}

static void vcq_publish(struct vep *e)
{
	/* seq_cst store: the endpoint's fields are visible to the poller that finds it here. */
	atomic_store(&e->vc->slot[e->slot], e);
}

/* Clear the endpoint's slot and wait until the group's poller cannot be using it. */
static void vcq_unpublish(struct vep *e)
{
	struct vcq *vc = e->vc;
	if (!vc || atomic_load_explicit(&vc->slot[e->slot], memory_order_relaxed) != e)
		return;
	atomic_store(&vc->slot[e->slot], NULL);
	if (!vc->grp)
		return; /* private: only the owning poller polls it, and it no longer drives us */
	/* Dekker with process_cq(): it makes poll_seq odd (seq_cst) before reading slots. If it
	 * read our old pointer, the value we load now is odd and changes when it is done. */
	uint32_t s = atomic_load(&vc->poll_seq);
	while ((s & 1) && atomic_load(&vc->poll_seq) == s)
		sched_yield(); /* a drain is bounded (4 bursts); control path */
}

static void vcq_detach(struct vep *e)
{
	struct vcq *vc = e->vc;
	if (!vc)
		return;
	e->vc = NULL;
	if (!vc->grp) {
		vcq_free(vc);
		return;
	}
	vc->gen[e->slot]++;
	vc->used[e->slot] = 0;
	vc->reserved -= ep_cqe_need(e);
	vc->n_eps--;
}

static void vep_free(struct vep *e)
{
	vcq_unpublish(e);
	if (e->qps) {
		for (uint32_t i = 0; i < e->nqp; i++) {
			if (e->qps[i].qp)
				ibv_destroy_qp(e->qps[i].qp);
			free(e->qps[i].wr);
		}
		free(e->qps);
	}
	vcq_detach(e); /* after the QPs: a CQ cannot go while QPs use it */
	verbs_ep_queues_fini(e);
	free(e);
}

/* Create the endpoint's QPs (state INIT) with fresh PSNs on its CQ (private or the group's). */
static int vep_alloc(struct vctx *c, uint32_t nqp, bool target, bool grouped, uint32_t group,
		     struct vep **out)
{
	struct vep *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->base.ctx = &c->base;
	e->nqp = nqp;
	e->slot = VERBS_NIL;
	e->sq_depth = target ? 1 : c->sq_depth;
	e->sig_interval = c->sig_interval;
	e->max_sge_wr = c->max_sge_wr;
	e->max_sge_rd = c->max_sge_rd;
	e->max_msg = c->max_msg;
	int rc = -ENOMEM;
	e->qps = calloc(nqp, sizeof(*e->qps));
	if (!e->qps)
		goto fail;
	if ((rc = vcq_attach(c, e, grouped, group, target)))
		goto fail;
	e->inline_max = target ? 0 : c->inline_max;
	for (uint32_t i = 0; i < nqp; i++) {
		struct vqp *q = &e->qps[i];
		struct ibv_qp_init_attr ia = {
			.qp_context = e,
			.send_cq = e->vc->cq,
			.recv_cq = e->vc->cq,
			.cap = {
				.max_send_wr = e->sq_depth,
				.max_recv_wr = 1,
				.max_send_sge = target ? 1 : c->max_sge_wr,
				.max_recv_sge = 1,
				.max_inline_data = target ? 0 : c->inline_max,
			},
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 0,
		};
		q->qp = verbs_dv_create_qp(c, &ia);
		if (!q->qp && !target && ia.cap.max_inline_data) {
			/* Some devices refuse the inline size: retry without inline data. */
			ia.cap.max_inline_data = 0;
			q->qp = verbs_dv_create_qp(c, &ia);
		}
		if (!q->qp) {
			rc = verbs_errno(-1);
			kvx_log(KVX_LOG_ERROR, "verbs: create QP %u/%u: %s", i, nqp, kvx_strerror(rc));
			goto fail;
		}
		e->inline_max = min_u32(e->inline_max, ia.cap.max_inline_data);
		if ((rc = qp_to_init(c, q->qp, target))) {
			kvx_log(KVX_LOG_ERROR, "verbs: QP %u RESET->INIT: %s", q->qp->qp_num,
				kvx_strerror(rc));
			goto fail;
		}
		q->psn = rand24();
		if (!target) {
			q->wr = calloc(e->sq_depth, sizeof(*q->wr));
			if (!q->wr) {
				rc = -ENOMEM;
				goto fail;
			}
		}
	}
	*out = e;
	return 0;
fail:
	vep_free(e);
	return rc;
}

static int ep_create(struct kvx_xport_ctx *ctx, bool grouped, uint32_t group,
		     struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len)
{
	struct vctx *c = (struct vctx *)ctx;
	uint32_t nqp = ctx->params.num_channels;
	if (cap < blob_len(nqp))
		return -EMSGSIZE;
	struct vep *e = NULL;
	int rc = vep_alloc(c, nqp, false, grouped, group, &e);
	if (rc)
		return rc;
	if ((rc = verbs_ep_queues_init(e, ctx->params.queue_depth))) {
		vep_free(e);
		return rc;
	}
	e->token = rand24() << 8 | (rand24() & 0xff);
	rc = blob_put(e, XPORT_BLOB_A, 0, (uint32_t)c->dattr.max_qp_rd_atom, blob, cap, len);
	if (rc) {
		vep_free(e);
		return rc;
	}
	vcq_publish(e);
	*out = &e->base;
	return 0;
}

int verbs_ep_create(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, uint8_t *blob,
		    size_t cap, size_t *len)
{
	return ep_create(ctx, false, 0, out, blob, cap, len);
}

int verbs_ep_create_group(struct kvx_xport_ctx *ctx, uint32_t group, struct kvx_xport_ep **out,
			  uint8_t *blob, size_t cap, size_t *len)
{
	return ep_create(ctx, true, group, out, blob, cap, len);
}

int verbs_ep_set_group(struct kvx_xport_ep *ep, uint32_t group)
{
	const struct vep *e = (const struct vep *)ep;
	if (e->vc && e->vc->grp && e->vc->grp->id != group) {
		kvx_log(KVX_LOG_ERROR, "verbs: endpoint %08x completes on group %u's shared CQ "
			"(fixed when its QPs were created): cannot move it to group %u", e->token,
			e->vc->grp->id, group);
		return -EBUSY;
	}
	return 0; /* private CQ (or the same group): transport.c records the group */
}

/*
 * Idle wait on the CQ's completion channel (docs/runtime-notes.md §3.7 with ibv_req_notify_cq):
 * arm, drain once more (completions that arrived before arming raise no event), then sleep in
 * poll() and acknowledge what woke us.
 */
int verbs_ep_wait(struct kvx_xport_ep *ep, int timeout_ms)
{
	struct vep *e = (struct vep *)ep;
	struct vcq *vc = e->vc;
	if (e->ready_head != e->ready_tail)
		return 1;
	int rc = ibv_req_notify_cq(vc->cq, 0);
	if (rc)
		return verbs_errno(rc);
	if (verbs_cq_drain(vc) > 0 || e->ready_head != e->ready_tail)
		return 1;
	struct pollfd pf = {.fd = vc->ch->fd, .events = POLLIN};
	rc = poll(&pf, 1, timeout_ms);
	if (rc < 0)
		return errno == EINTR ? 0 : -errno;
	if (rc == 0)
		return 0;
	struct ibv_cq *cq;
	void *cq_ctx;
	while (ibv_get_cq_event(vc->ch, &cq, &cq_ctx) == 0)
		ibv_ack_cq_events(cq, 1); /* any CQ of the group; each is re-armed by its waiter */
	return 1;
}

/* Target side: bring QPs to RTR then RTS against the initiator's info. */
static int target_connect(struct vctx *c, struct vep *e, const struct peer_info *pa)
{
	/* Our responder resources for the peer's READs: min(its initiator depth, our limit). */
	uint32_t rd = min_u32(min_u32(pa->init_rd_atom, (uint32_t)c->dattr.max_qp_rd_atom),
			      VERBS_RD_ATOMIC_CAP);
	if (rd == 0)
		rd = 1;
	e->rd_atomic = rd;
	for (uint32_t i = 0; i < e->nqp; i++) {
		int rc = qp_to_rtr(c, e->qps[i].qp, pa, i, rd);
		if (!rc)
			rc = qp_to_rts(c, e->qps[i].qp, e->qps[i].psn, 1);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "verbs: target QP %u INIT->RTR->RTS: %s",
				e->qps[i].qp->qp_num, kvx_strerror(rc));
			return rc;
		}
	}
	return 0;
}

int verbs_ep_accept(struct kvx_xport_ctx *ctx, const uint8_t *a, size_t alen,
		    struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len)
{
	struct vctx *c = (struct vctx *)ctx;
	struct peer_info pa;
	int rc = blob_get(c, a, alen, XPORT_BLOB_A, &pa);
	if (rc)
		return rc;
	if (pa.flags & BLOB_F_RECONNECT) {
		kvx_log(KVX_LOG_WARN, "verbs: blob A is a reconnect (token %08x): use ep_reaccept",
			pa.token);
		return -EPROTO;
	}
	if (pa.nqp > ctx->caps.max_channels) {
		kvx_log(KVX_LOG_WARN, "verbs: blob A asks for %u QPs, device allows %u", pa.nqp,
			ctx->caps.max_channels);
		return -EPROTO;
	}
	if (cap < blob_len(pa.nqp))
		return -EMSGSIZE;
	struct vep *e = NULL;
	if ((rc = vep_alloc(c, pa.nqp, true, false, 0, &e)))
		return rc;
	e->token = pa.token;
	if ((rc = target_connect(c, e, &pa)) ||
	    (rc = blob_put(e, XPORT_BLOB_B, 0, e->rd_atomic, blob, cap, len))) {
		vep_free(e);
		return rc;
	}
	vcq_publish(e);
	*out = &e->base;
	return 0;
}

int verbs_ep_connect(struct kvx_xport_ep *ep, const uint8_t *b, size_t blen)
{
	struct vep *e = (struct vep *)ep;
	struct vctx *c = (struct vctx *)ep->ctx;
	struct peer_info pb;
	int rc = blob_get(c, b, blen, XPORT_BLOB_B, &pb);
	if (rc)
		return rc;
	if (pb.nqp != e->nqp || pb.token != e->token) {
		kvx_log(KVX_LOG_WARN, "verbs: blob B for token %08x with %u QPs, expected %08x/%u",
			pb.token, pb.nqp, e->token, e->nqp);
		return -EPROTO;
	}
	/* Outstanding READs per QP: min(our initiator depth, the peer's responder resources). */
	uint32_t rd = min_u32(min_u32((uint32_t)c->dattr.max_qp_init_rd_atom, pb.rd_atom),
			      VERBS_RD_ATOMIC_CAP);
	if (rd == 0)
		rd = 1;
	e->rd_atomic = rd;
	for (uint32_t i = 0; i < e->nqp; i++) {
		rc = qp_to_rtr(c, e->qps[i].qp, &pb, i, 1);
		if (!rc)
			rc = qp_to_rts(c, e->qps[i].qp, e->qps[i].psn, rd);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "verbs: QP %u INIT->RTR->RTS: %s", e->qps[i].qp->qp_num,
				kvx_strerror(rc));
			return rc;
		}
		e->qps[i].rqpn = pb.qpn[i];
		e->qps[i].rpsn = pb.psn[i];
	}
	return 0;
}

void verbs_ep_destroy(struct kvx_xport_ep *ep)
{
	vep_free((struct vep *)ep);
}

/* RESET -> INIT with a fresh PSN. Sequences run on: a stale CQE is never live (and the CQ
 * may be shared with endpoints that are running: it is not drained here). */
static int reset_qps(struct vctx *c, struct vep *e, bool target)
{
	for (uint32_t i = 0; i < e->nqp; i++) {
		struct vqp *q = &e->qps[i];
		int rc = qp_reset(q->qp);
		if (!rc)
			rc = qp_to_init(c, q->qp, target);
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "verbs: QP %u reset: %s", q->qp->qp_num, kvx_strerror(rc));
			return rc;
		}
		q->psn = rand24();
	}
	return 0;
}

int verbs_ep_reset(struct kvx_xport_ep *ep, uint8_t *blob, size_t cap, size_t *len)
{
	struct vep *e = (struct vep *)ep;
	struct vctx *c = (struct vctx *)ep->ctx;
	if (cap < blob_len(e->nqp))
		return -EMSGSIZE;
	if (!verbs_ep_idle(e))
		return -EBUSY;
	int rc = reset_qps(c, e, false);
	if (rc)
		return rc;
	e->fail_ns = 0;
	atomic_store_explicit(&e->async_err, 0, memory_order_relaxed);
	atomic_store_explicit(&ep->status, 0, memory_order_relaxed);
	ep->connected = false;
	return blob_put(e, XPORT_BLOB_A, BLOB_F_RECONNECT, (uint32_t)c->dattr.max_qp_rd_atom, blob,
			cap, len);
}

int verbs_ep_reaccept(struct kvx_xport_ep *ep, const uint8_t *a, size_t alen, uint8_t *blob,
		      size_t cap, size_t *len)
{
	struct vep *e = (struct vep *)ep;
	struct vctx *c = (struct vctx *)ep->ctx;
	struct peer_info pa;
	int rc = blob_get(c, a, alen, XPORT_BLOB_A, &pa);
	if (rc)
		return rc;
	if (!(pa.flags & BLOB_F_RECONNECT) || pa.token != e->token || pa.nqp != e->nqp) {
		kvx_log(KVX_LOG_WARN,
			"verbs: reconnect blob (flags %u token %08x, %u QPs) does not match endpoint "
			"%08x/%u",
			pa.flags, pa.token, pa.nqp, e->token, e->nqp);
		return -EPROTO;
	}
	if (cap < blob_len(e->nqp))
		return -EMSGSIZE;
	if ((rc = reset_qps(c, e, true)) || (rc = target_connect(c, e, &pa)))
		return rc;
	atomic_store_explicit(&ep->status, 0, memory_order_relaxed);
	return blob_put(e, XPORT_BLOB_B, BLOB_F_RECONNECT, e->rd_atomic, blob, cap, len);
}
