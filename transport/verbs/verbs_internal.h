/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_VERBS_INTERNAL_H
#define KVX_VERBS_INTERNAL_H
/**
 * @file
 * Module-private: the verbs provider (RDMA RC QPs through rdma-core), docs/architecture.md §3,
 * docs/runtime-notes.md §3.
 *
 * Objects:
 * - struct vctx: one opened device + port + PD, the chosen GID and the device limits.
 * - struct vmr: an ibv_mr with the minimal access flags the region needs.
 * - struct vcq: a completion queue with its completion channel and a table of the endpoints
 *   whose QPs complete on it (slots). Private (one endpoint, kvx_xport_ep_create()) or shared
 *   by the endpoints of one poll group (kvx_xport_ep_create_in_group()).
 * - struct vgroup: a poll group (index of the polling lcore that drives its endpoints): its
 *   completion channel and its shared CQs, created lazily; a CQ whose worst-case load (every
 *   QP's whole send queue flushed) would exceed its size is not given more endpoints, the
 *   group gets another CQ instead.
 * - struct vep: N RC QPs to one peer completing on one vcq, the software op queue (ops wait
 *   there while the send queues are full: backpressure, never a failure), batch accounting and
 *   the completion ring handed to kvx_xport_poll_burst(). Send-queue credits are per QP.
 *
 * WR ids: generation << 48 | CQ slot << 40 | QP index << 32 | per-QP sequence number. Polling
 * a shared CQ finds each completion's endpoint through the slot (a stale completion of a
 * destroyed endpoint carries an old generation and is dropped) and retires it into that
 * endpoint's own queues: the endpoints of a group are driven by one thread, so no lock and no
 * allocation. Each QP keeps a ring of WR records indexed by sequence; RC completes in order
 * per QP, so a signaled CQE for sequence s retires every unsignaled WR before it (selective
 * signaling, docs/runtime-notes.md §3.6). Sequences run on across kvx_xport_ep_reset(): a stale
 * completion from before a reset is never taken for a live WR.
 *
 * Destroying an endpoint of a shared CQ (control thread) while the group's poller drains that
 * CQ: the slot is cleared first, then the destroyer waits until the poller is outside any
 * drain that might have read the old slot (vcq.poll_seq is odd during a drain), then frees.
 *
 * Direct verbs: VERBS_DV_MLX5 when built with <infiniband/mlx5dv.h> (KVX_HAVE_MLX5DV) and
 * mlx5dv_is_supported() says so at run time. rdma-core 44 has no bnxt_re direct verbs
 * (docs/runtime-notes.md §0.1 item 2): the extension point is enum verbs_dv plus
 * verbs_dv_create_qp() in verbs_ep.c; a bnxt_re entry would dlopen the vendor library there.
 */
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport_internal.h"

#define VERBS_MAX_QPS 64u          /* channels per endpoint */
#define VERBS_MAX_SGE 4u           /* SGEs merged into one WR */
#define VERBS_CHAIN_MAX 32u        /* WRs per doorbell */
#define VERBS_CQ_BURST 32          /* CQEs per ibv_poll_cq */
#define VERBS_SQ_DEPTH 256u        /* send queue depth wanted per QP */
#define VERBS_INLINE_WANT 220u     /* inline bytes wanted (perftest's WRITE default) */
#define VERBS_MIN_CHUNK (64u << 10) /* smallest slice when striping one op over QPs */
#define VERBS_MAX_OP_BYTES (1ull << 30)
#define VERBS_RD_ATOMIC_CAP 16u    /* outstanding READs per QP asked for (Mooncake uses 16) */
#define VERBS_NIL UINT32_MAX
#define VERBS_GROUP_CQE 65536u     /* entries wanted for a group's shared CQ (<= max_cqe) */
#define VERBS_CQ_SLOTS 256u        /* endpoints per shared CQ (8 bits of the WR id) */
#define VERBS_WRID_QP_SHIFT 32
#define VERBS_WRID_SLOT_SHIFT 40
#define VERBS_WRID_GEN_SHIFT 48

/* RC path parameters: local ACK timeout 4.096 us * 2^14 = 67 ms (docs/runtime-notes.md §3.2), 6
 * retries: a dead peer is detected in about 0.5 s. Not 7: rdma_rxe (drivers/infiniband/sw/rxe,
 * rxe_comp.c) never decrements a retry count of 7, i.e. it would retry forever there. */
#define VERBS_QP_TIMEOUT 14
#define VERBS_RETRY_CNT 6
#define VERBS_RNR_RETRY 7
#define VERBS_MIN_RNR_TIMER 12

enum verbs_dv {
	VERBS_DV_NONE = 0, /* plain verbs */
	VERBS_DV_MLX5 = 1, /* mlx5dv_create_qp + per-QP UDP source port entropy */
};

struct vctx {
	struct kvx_xport_ctx base;
	struct ibv_context *ibctx;
	struct ibv_pd *pd;
	struct ibv_device_attr dattr;
	char devname[64];
	uint8_t port;
	uint8_t link_layer;        /* IBV_LINK_LAYER_* */
	uint16_t lid;
	int gid_index;
	union ibv_gid gid;
	enum ibv_mtu mtu;
	uint32_t max_msg;          /* port max_msg_sz, bytes */
	uint32_t sq_depth;         /* power of 2 */
	uint32_t sig_interval;     /* signal at least every N WRs */
	uint32_t inline_max;       /* granted inline bytes (0 = none) */
	uint32_t max_sge_wr, max_sge_rd;
	enum verbs_dv dv;
	struct kvx_ratelimit async_rl; /* control thread (kvx_xport_ctx_handle_events) */
	struct vgroup *groups;     /* poll groups with shared CQs; control thread */
};

struct vep;
struct vgroup;

struct vcq {
	struct ibv_cq *cq;
	struct vgroup *grp;            /* NULL: private CQ of one endpoint */
	struct ibv_comp_channel *ch;   /* the group's channel, or owned (private; NULL: target) */
	uint32_t cap;                  /* CQ entries */
	uint32_t reserved;             /* worst-case entries of the attached QPs; control thread */
	uint32_t n_eps;                /* attached endpoints; control thread */
	_Atomic uint32_t poll_seq;     /* odd while the group's poller holds slot pointers */
	struct vcq *next;              /* the group's list */
	uint16_t gen[VERBS_CQ_SLOTS];  /* generation of each slot's current user; control thread */
	uint8_t used[VERBS_CQ_SLOTS];  /* slot reserved (published or about to be); control */
	_Atomic(struct vep *) slot[VERBS_CQ_SLOTS];
	struct ibv_wc wc[VERBS_CQ_BURST]; /* poller */
};

struct vgroup {
	uint32_t id;
	struct ibv_comp_channel *ch;   /* shared by the group's CQs (kvx_xport_ep_wait) */
	struct vcq *cqs;
	struct vgroup *next;
};

struct vmr {
	struct kvx_xport_mr base;
	struct ibv_mr *mr;
};

/* One posted WR: the ops (by index) whose bytes it carries. */
struct vwr {
	uint32_t op[VERBS_MAX_SGE];
	uint64_t bytes;
	uint8_t nops;
};

struct vqp {
	struct ibv_qp *qp;
	uint32_t psn, rqpn, rpsn;
	uint32_t seq_post;   /* next sequence to post */
	uint32_t seq_done;   /* oldest not retired */
	uint32_t last_sig;   /* sequence of the last signaled WR */
	struct vwr *wr;      /* ring [sq_depth] */
	/* chain being built for one doorbell */
	uint32_t nchain;
	struct ibv_send_wr chain[VERBS_CHAIN_MAX];
	struct ibv_sge sge[VERBS_CHAIN_MAX][VERBS_MAX_SGE];
};

struct vop {
	uint64_t laddr, raddr, len, posted, chunk;
	uint32_t lkey, rkey;
	uint32_t wrs_out;
	int32_t status;
	uint32_t batch, idx, next;
};

struct vbatch {
	uint64_t cookie, deadline_ns, bytes, seq;
	uint32_t n_ops, done_ops, n_failed, first_failed;
	int32_t status;
	uint32_t prev, next;  /* post-order list of outstanding batches */
	uint8_t opcode;
};

struct vep {
	struct kvx_xport_ep base;
	struct vcq *vc;       /* where the QPs complete */
	uint32_t slot;        /* index in vc->slot; VERBS_NIL until published */
	uint64_t wr_tag;      /* generation and slot bits of every WR id */
	_Atomic int async_err; /* set by kvx_xport_ctx_handle_events(); the poller fails the ep */
	uint32_t ticks;       /* polls with outstanding ops (deadline check every 8th) */
	uint64_t db_mask;     /* QPs with a WR chain waiting for its doorbell */
	uint32_t nqp;
	struct vqp *qps;
	uint32_t token;       /* endpoint id carried in blobs (reconnects name it) */
	uint32_t rd_atomic;   /* negotiated outstanding READs per QP */
	uint32_t rr;          /* round-robin QP cursor */
	uint32_t depth;       /* queue_depth: ops and batches */
	uint32_t inline_max;  /* inline bytes granted for this endpoint's QPs */
	uint32_t sq_depth, sig_interval, max_sge_wr, max_sge_rd;
	uint64_t max_msg;
	struct vop *ops;
	uint32_t *op_free, n_op_free;
	struct vbatch *batches;
	uint32_t *b_free, n_b_free;
	uint32_t old_head, old_tail;      /* outstanding batches, oldest first */
	uint32_t pend_head, pend_tail;    /* ops with bytes left to post */
	uint32_t *ready;                  /* finished batches, ring [depth] */
	uint32_t ready_head, ready_tail;
	uint64_t batch_seq;
	uint64_t fail_ns;                 /* when the endpoint entered error state */
};

/* verbs.c */
int verbs_errno(int ret);
/* verbs_ep.c */
int verbs_ep_create(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, uint8_t *blob,
		    size_t cap, size_t *len);
int verbs_ep_accept(struct kvx_xport_ctx *ctx, const uint8_t *a, size_t alen,
		    struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len);
int verbs_ep_connect(struct kvx_xport_ep *ep, const uint8_t *b, size_t blen);
void verbs_ep_destroy(struct kvx_xport_ep *ep);
int verbs_ep_reset(struct kvx_xport_ep *ep, uint8_t *blob, size_t cap, size_t *len);
int verbs_ep_reaccept(struct kvx_xport_ep *ep, const uint8_t *a, size_t alen, uint8_t *blob,
		      size_t cap, size_t *len);
int verbs_ep_create_group(struct kvx_xport_ctx *ctx, uint32_t group, struct kvx_xport_ep **out,
			  uint8_t *blob, size_t cap, size_t *len);
int verbs_ep_set_group(struct kvx_xport_ep *ep, uint32_t group);
int verbs_ep_wait(struct kvx_xport_ep *ep, int timeout_ms);
void verbs_groups_free(struct vctx *c);
/* verbs_data.c */
int verbs_post(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
	       const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie);
int verbs_poll(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max);
void verbs_ep_fail(struct vep *e, int err);
int verbs_cq_drain(struct vcq *vc);
int verbs_ep_queues_init(struct vep *e, uint32_t depth);
void verbs_ep_queues_fini(struct vep *e);
bool verbs_ep_idle(const struct vep *e);

#endif /* KVX_VERBS_INTERNAL_H */
