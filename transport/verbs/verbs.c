/* SPDX-License-Identifier: Apache-2.0 */
/* verbs provider: device bring-up, GID selection, PD, memory regions (host and HIP), device
 * async events (docs/runtime-notes.md §3.1, §3.4, §3.7, §3.9). */
#include "verbs_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef KVX_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#endif

#include "kvxfer/mem.h"
#include "mem_internal.h"

int verbs_errno(int ret)
{
	/* verbs calls return a positive errno, or -1 with errno set: normalise to -errno. */
	if (ret > 0)
		return -ret;
	return errno ? -errno : -EIO;
}

static bool gid_is_zero(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return false;
	return true;
}

static bool gid_is_v4mapped(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !memcmp(g->raw, pfx, 12);
}

static bool gid_is_link_local(const union ibv_gid *g)
{
	if (gid_is_v4mapped(g))
		return g->raw[12] == 169 && g->raw[13] == 254;
	return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

/*
 * RoCE GID choice (docs/runtime-notes.md §3.4, after perftest's compute_gid_score): skip empty
 * entries; prefer the interface named by KVX_VERBS_IFNAME, then IPv4-mapped, then not
 * link-local, then RoCE v2 over v1. Returns the index or -ENODATA.
 */
static int pick_gid(struct ibv_context *ibctx, uint8_t port, int tbl_len)
{
	const char *ifname = getenv("KVX_VERBS_IFNAME");
	unsigned ifindex = ifname && *ifname ? if_nametoindex(ifname) : 0;
	int best = -ENODATA, best_score = -1;
	for (int i = 0; i < tbl_len; i++) {
		struct ibv_gid_entry ent;
		if (ibv_query_gid_ex(ibctx, port, (uint32_t)i, &ent, 0))
			continue;
		if (gid_is_zero(&ent.gid))
			continue;
		int score = 0;
		if (ifindex && ent.ndev_ifindex == ifindex)
			score += 1000;
		if (gid_is_v4mapped(&ent.gid))
			score += 100;
		if (!gid_is_link_local(&ent.gid))
			score += 10;
		if (ent.gid_type == IBV_GID_TYPE_ROCE_V2)
			score += 2;
		else if (ent.gid_type == IBV_GID_TYPE_ROCE_V1)
			score += 1;
		if (score > best_score) {
			best_score = score;
			best = i;
		}
	}
	return best;
}

/* First device (or the named one) with the wanted port ACTIVE. */
static int find_device(const char *name, uint8_t port, struct ibv_device **list, int n,
		       struct ibv_device **out, char *reason, size_t cap)
{
	bool named_seen = false;
	for (int i = 0; i < n; i++) {
		const char *dn = ibv_get_device_name(list[i]);
		if (name && strcmp(name, dn))
			continue;
		named_seen = true;
		struct ibv_context *c = ibv_open_device(list[i]);
		if (!c)
			continue;
		struct ibv_port_attr pa;
		int rc = ibv_query_port(c, port, &pa);
		ibv_close_device(c);
		if (rc == 0 && pa.state == IBV_PORT_ACTIVE) {
			*out = list[i];
			return 0;
		}
		if (name) {
			snprintf(reason, cap, "verbs: device %s port %u is not ACTIVE (%s)", dn, port,
				 rc ? strerror(rc) : ibv_port_state_str(pa.state));
			return -ENODEV;
		}
	}
	if (name && !named_seen)
		snprintf(reason, cap, "verbs: no RDMA device named '%s'", name);
	else
		snprintf(reason, cap, "verbs: no RDMA device with port %u ACTIVE", port);
	return -ENODEV;
}

static int list_devices(struct ibv_device ***list, int *n, char *reason, size_t cap)
{
	errno = 0;
	*list = ibv_get_device_list(n);
	if (!*list) {
		/* docs/runtime-notes.md §0.1 item 3: NULL + ENOSYS without kernel RDMA; never free NULL. */
		int err = errno ? errno : ENODEV;
		snprintf(reason, cap, "verbs: ibv_get_device_list: %s%s", strerror(err),
			 err == ENOSYS ? " (no RDMA in the kernel)" : "");
		return -ENODEV;
	}
	if (*n == 0) {
		ibv_free_device_list(*list);
		*list = NULL;
		snprintf(reason, cap, "verbs: no RDMA devices");
		return -ENODEV;
	}
	return 0;
}

static int verbs_probe(char *reason, size_t cap)
{
	struct ibv_device **list;
	int n;
	int rc = list_devices(&list, &n, reason, cap);
	if (rc)
		return rc;
	struct ibv_device *dev;
	rc = find_device(NULL, 1, list, n, &dev, reason, cap);
	ibv_free_device_list(list);
	if (rc == 0)
		reason[0] = '\0';
	return rc;
}

static uint32_t pow2_floor(uint32_t v)
{
	uint32_t r = 1;
	while (r * 2 <= v)
		r *= 2;
	return r;
}

static void vctx_free(struct vctx *c)
{
	verbs_groups_free(c);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->ibctx)
		ibv_close_device(c->ibctx);
	free(c);
}

/*
 * Whether HIP device memory can be registered here (docs/runtime-notes.md §3.9, §0.1 item 1): a HIP
 * device, and either dma-buf export (ibv_reg_dmabuf_mr) or a peer-memory client (ibv_reg_mr on
 * the device pointer). 0, or a negative errno with the reason in why.
 */
static pthread_once_t g_hip_once = PTHREAD_ONCE_INIT;
static int g_hip_rc;
static char g_hip_why[KVX_MEM_WHY_LEN];

static void hip_reg_probe_once(void)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	int rc = kvx_mem_probe(&t, g_hip_why, sizeof(g_hip_why));
	if (rc == 0) {
		char dwhy[KVX_MEM_WHY_LEN] = "";
		bool dmabuf = kvx_mem_dmabuf_available(dwhy, sizeof(dwhy));
		bool peer = !dmabuf && kvx_mem_peer_memory_present(KVX_MEM_PEER_MEMORY_DIR);
		rc = kvx_mem_reg_decide(KVX_MEM_HIP, dmabuf, peer, dwhy, g_hip_why,
					sizeof(g_hip_why));
	}
	g_hip_rc = rc < 0 ? rc : 0;
}

/* Probed once per process (device presence and the ROCm/kernel features do not change). */
static int hip_reg_probe(char *why, size_t why_len)
{
	pthread_once(&g_hip_once, hip_reg_probe_once);
	snprintf(why, why_len, "%s", g_hip_rc ? g_hip_why : "");
	return g_hip_rc;
}

static int verbs_open(const struct kvx_xport_ctx_params *p, struct kvx_xport_ctx **out)
{
	char reason[KVX_XPORT_REASON_MAX];
	struct ibv_device **list;
	int n;
	int rc = list_devices(&list, &n, reason, sizeof(reason));
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "%s", reason);
		return rc;
	}
	struct ibv_device *dev = NULL;
	rc = find_device(p->device, p->ib_port, list, n, &dev, reason, sizeof(reason));
	if (rc) {
		ibv_free_device_list(list);
		kvx_log(KVX_LOG_ERROR, "%s", reason);
		return rc;
	}
	struct vctx *c = calloc(1, sizeof(*c));
	if (!c) {
		ibv_free_device_list(list);
		return -ENOMEM;
	}
	snprintf(c->devname, sizeof(c->devname), "%s", ibv_get_device_name(dev));
	c->ibctx = ibv_open_device(dev);
	rc = c->ibctx ? 0 : verbs_errno(-1);
#ifdef KVX_HAVE_MLX5DV
	const char *dv_env = getenv("KVX_VERBS_DV");
	if (c->ibctx && !(dv_env && !strcmp(dv_env, "0")) && mlx5dv_is_supported(dev))
		c->dv = VERBS_DV_MLX5;
#endif
	ibv_free_device_list(list);
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "verbs: ibv_open_device(%s): %s", c->devname, kvx_strerror(rc));
		vctx_free(c);
		return rc;
	}
	struct ibv_port_attr pa;
	if ((rc = ibv_query_device(c->ibctx, &c->dattr)) || (rc = ibv_query_port(c->ibctx, p->ib_port, &pa))) {
		rc = verbs_errno(rc);
		kvx_log(KVX_LOG_ERROR, "verbs: query %s: %s", c->devname, kvx_strerror(rc));
		vctx_free(c);
		return rc;
	}
	c->port = p->ib_port;
	c->link_layer = pa.link_layer;
	c->lid = pa.lid;
	c->mtu = pa.active_mtu;
	c->max_msg = pa.max_msg_sz ? pa.max_msg_sz : (1u << 31);
	if (pa.state != IBV_PORT_ACTIVE) {
		kvx_log(KVX_LOG_ERROR, "verbs: %s port %u is %s", c->devname, c->port,
			ibv_port_state_str(pa.state));
		vctx_free(c);
		return -ENODEV;
	}
	if (p->gid_index >= 0) {
		if (p->gid_index >= pa.gid_tbl_len) {
			kvx_log(KVX_LOG_ERROR, "verbs: gid_index=%d out of range 0..%d", p->gid_index,
				pa.gid_tbl_len - 1);
			vctx_free(c);
			return -EINVAL;
		}
		c->gid_index = p->gid_index;
	} else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		c->gid_index = pick_gid(c->ibctx, c->port, pa.gid_tbl_len);
		if (c->gid_index < 0) {
			kvx_log(KVX_LOG_ERROR, "verbs: %s port %u has no usable RoCE GID", c->devname,
				c->port);
			vctx_free(c);
			return -ENODEV;
		}
	} else {
		c->gid_index = 0;
	}
	if ((rc = ibv_query_gid(c->ibctx, c->port, c->gid_index, &c->gid))) {
		rc = verbs_errno(rc);
		vctx_free(c);
		return rc;
	}
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && gid_is_zero(&c->gid)) {
		kvx_log(KVX_LOG_ERROR, "verbs: GID index %d of %s is empty", c->gid_index, c->devname);
		vctx_free(c);
		return -EINVAL;
	}
	c->pd = ibv_alloc_pd(c->ibctx);
	if (!c->pd) {
		rc = verbs_errno(-1);
		vctx_free(c);
		return rc;
	}
	/* Non-blocking async fd: kvx_xport_ctx_handle_events() drains it without ever sleeping. */
	int fl = fcntl(c->ibctx->async_fd, F_GETFL);
	if (fl < 0 || fcntl(c->ibctx->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		rc = -errno;
		vctx_free(c);
		return rc;
	}
	uint32_t sq = (uint32_t)c->dattr.max_qp_wr;
	c->sq_depth = pow2_floor(sq < VERBS_SQ_DEPTH ? sq : VERBS_SQ_DEPTH);
	c->sig_interval = c->sq_depth / 4 ? c->sq_depth / 4 : 1;
	c->max_sge_wr = (uint32_t)c->dattr.max_sge < VERBS_MAX_SGE ? (uint32_t)c->dattr.max_sge
								    : VERBS_MAX_SGE;
	c->max_sge_rd = (uint32_t)c->dattr.max_sge_rd < VERBS_MAX_SGE ? (uint32_t)c->dattr.max_sge_rd
								       : VERBS_MAX_SGE;
	if (!c->max_sge_rd)
		c->max_sge_rd = 1;
	c->inline_max = VERBS_INLINE_WANT; /* lowered to the granted value at the first QP */
	uint32_t maxq = (uint32_t)c->dattr.max_qp < VERBS_MAX_QPS ? (uint32_t)c->dattr.max_qp
								  : VERBS_MAX_QPS;
	if (p->num_channels > maxq) {
		kvx_log(KVX_LOG_ERROR, "verbs: num_channels=%u out of range 1..%u", p->num_channels,
			maxq);
		vctx_free(c);
		return -EINVAL;
	}
	c->async_rl.interval_ns = 1000000000ull;
	uint32_t mem_types = 1u << KVX_XPORT_MEM_HOST;
	if (hip_reg_probe(c->base.mem_why, sizeof(c->base.mem_why)) == 0)
		mem_types |= 1u << KVX_XPORT_MEM_HIP;
	c->base.caps = (struct kvx_xport_caps){
		.max_op_bytes = VERBS_MAX_OP_BYTES,
		.max_batch = p->queue_depth,
		/* Small WRITEs go inline when posted at once, but an op queued behind a full send
		 * queue still reads its buffer later: no copy-at-post promise. */
		.inline_bytes = 0,
		.max_channels = maxq,
		.num_channels = p->num_channels,
		.mem_types = mem_types,
		.needs_progress = false,
		.same_host_only = false,
	};
	char gs[INET6_ADDRSTRLEN];
	inet_ntop(AF_INET6, c->gid.raw, gs, sizeof(gs));
	kvx_log(KVX_LOG_INFO, "verbs: %s port %u %s mtu %d gid[%d] %s sq %u dv %s", c->devname,
		c->port, c->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB",
		128 << c->mtu, c->gid_index, gs, c->sq_depth,
		c->dv == VERBS_DV_MLX5 ? "mlx5" : "none");
	*out = &c->base;
	return 0;
}

static int verbs_mr_unregister(struct kvx_xport_mr *m)
{
	struct vmr *mr = (struct vmr *)m;
	int rc = ibv_dereg_mr(mr->mr);
	if (rc) {
		rc = verbs_errno(rc);
		kvx_log(KVX_LOG_ERROR, "verbs: ibv_dereg_mr: %s", kvx_strerror(rc));
		return rc == -EBUSY ? rc : -EBUSY;
	}
	free(mr);
	return 0;
}

static void verbs_close(struct kvx_xport_ctx *ctx)
{
	struct vctx *c = (struct vctx *)ctx;
	while (ctx->mrs) {
		struct kvx_xport_mr *m = ctx->mrs;
		xport_mr_unlink(m);
		if (verbs_mr_unregister(m))
			free(m); /* the PD dealloc below then fails too; nothing else can be done */
	}
	vctx_free(c);
}

static int verbs_mr_register(struct kvx_xport_ctx *ctx, const struct kvx_xport_mr_params *p,
			     struct kvx_xport_mr **out)
{
	struct vctx *c = (struct vctx *)ctx;
	/* Minimal access: no remote atomic; REMOTE_WRITE implies LOCAL_WRITE (ibv_reg_mr.3). */
	int acc = 0;
	if (p->access & KVX_XPORT_ACCESS_LOCAL_WRITE)
		acc |= IBV_ACCESS_LOCAL_WRITE;
	if (p->access & KVX_XPORT_ACCESS_REMOTE_READ)
		acc |= IBV_ACCESS_REMOTE_READ;
	if (p->access & KVX_XPORT_ACCESS_REMOTE_WRITE)
		acc |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	struct vmr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	struct kvx_mem_reg_plan plan = {.method = KVX_MEM_REG_HOST, .dmabuf_fd = -1};
	if (p->mem_type == KVX_XPORT_MEM_HIP) {
		/* Device memory: the plan says dma-buf (fd + the region's real offset in it),
		 * peer memory (ibv_reg_mr on the device pointer), or why neither works. */
		char why[KVX_MEM_WHY_LEN] = "";
		struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = p->device_id};
		int rc = kvx_mem_reg_plan_by_type(&t, p->addr, p->len_bytes, &plan, why, sizeof(why));
		if (rc) {
			kvx_log(KVX_LOG_ERROR, "verbs: cannot register HIP region %p (+%llu bytes) of "
				"device %d: %s", p->addr, (unsigned long long)p->len_bytes, p->device_id,
				why);
			free(mr);
			return rc;
		}
	}
	const char *call = "ibv_reg_mr";
	errno = 0;
	if (plan.method == KVX_MEM_REG_DMABUF) {
		call = "ibv_reg_dmabuf_mr";
		mr->mr = ibv_reg_dmabuf_mr(c->pd, plan.dmabuf_offset, p->len_bytes,
					   (uint64_t)(uintptr_t)p->addr, plan.dmabuf_fd, acc);
	} else {
		mr->mr = ibv_reg_mr(c->pd, p->addr, p->len_bytes, acc);
	}
	int reg_err = mr->mr ? 0 : verbs_errno(-1);
	kvx_mem_reg_plan_fini(&plan); /* the MR holds its own reference to a dma-buf */
	if (!mr->mr) {
		int rc = reg_err;
		kvx_log(KVX_LOG_ERROR, "verbs: %s(%p, %llu bytes, access 0x%x%s): %s", call, p->addr,
			(unsigned long long)p->len_bytes, acc,
			p->mem_type == KVX_XPORT_MEM_HIP ? ", HIP memory" : "", kvx_strerror(rc));
		free(mr);
		return rc == -EINVAL ? -EINVAL : (rc == -ENOMEM || rc == -EFAULT) ? -ENOMEM : rc;
	}
	mr->base.ctx = ctx;
	mr->base.addr = p->addr;
	mr->base.len = p->len_bytes;
	mr->base.access = p->access;
	mr->base.key = mr->mr->rkey;
	mr->base.mem_type = p->mem_type;
	mr->base.device_id = p->device_id;
	*out = &mr->base;
	return 0;
}

static int verbs_rmr_check(struct kvx_xport_ep *ep, const struct kvx_xport_rmr *rmr)
{
	(void)ep;
	return rmr->mem_type == KVX_XPORT_MEM_HOST || rmr->mem_type == KVX_XPORT_MEM_HIP
		       ? 0 /* the NIC reaches whatever the peer registered */
		       : -ENOTSUP;
}

/* Move an initiator endpoint to error state from the control thread: its QPs go to ERR here
 * (outstanding WRs flush with error completions), its poller fails it at the next post/poll. */
static void async_fail_ep(struct vep *e)
{
	if (!e || !e->depth || !e->base.connected)
		return; /* target side (the peer's initiator sees the errors) or not connected */
	int zero = 0;
	if (!atomic_compare_exchange_strong(&e->async_err, &zero, -ECONNRESET))
		return;
	for (uint32_t i = 0; i < e->nqp; i++) {
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		(void)ibv_modify_qp(e->qps[i].qp, &a, IBV_QP_STATE);
	}
}

/*
 * Device async events (docs/runtime-notes.md §3.7), on the control thread: QP fatal / request error
 * / access error fail that QP's endpoint; CQ error fails every endpoint on the CQ; port error
 * (our port) and device fatal fail every endpoint. The rest is counted and logged.
 */
static int verbs_handle_events(struct kvx_xport_ctx *ctx)
{
	struct vctx *c = (struct vctx *)ctx;
	int done = 0;
	struct ibv_async_event ev;
	for (;;) {
		if (ibv_get_async_event(c->ibctx, &ev)) {
			int err = errno;
			if (err == EAGAIN || err == EWOULDBLOCK || done)
				break;
			return -err;
		}
		enum ibv_event_type t = ev.event_type;
		bool fails = true;
		switch (t) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
			async_fail_ep(ev.element.qp ? ev.element.qp->qp_context : NULL);
			break;
		case IBV_EVENT_CQ_ERR: {
			struct vcq *vc = ev.element.cq ? ev.element.cq->cq_context : NULL;
			for (uint32_t s = 0; vc && s < VERBS_CQ_SLOTS; s++)
				async_fail_ep(atomic_load_explicit(&vc->slot[s], memory_order_relaxed));
			break;
		}
		case IBV_EVENT_PORT_ERR:
			if (ev.element.port_num != c->port) {
				fails = false;
				break;
			}
			__attribute__((fallthrough)); /* our port is down */
		case IBV_EVENT_DEVICE_FATAL:
			for (struct kvx_xport_ep *ep = ctx->eps; ep; ep = ep->next)
				async_fail_ep((struct vep *)ep);
			break;
		default:
			fails = false;
			break;
		}
		ibv_ack_async_event(&ev);
		xport_cnt_add(&ctx->cnt, async_events, 1);
		if (fails)
			xport_cnt_add(&ctx->cnt, async_errors, 1);
		uint64_t sup = 0;
		if (kvx_ratelimit_ok(&c->async_rl, &sup))
			kvx_log(fails ? KVX_LOG_WARN : KVX_LOG_INFO,
				"verbs: %s async event: %s%s (%llu suppressed)", c->devname,
				ibv_event_type_str(t), fails ? ": endpoint(s) moved to error state" : "",
				(unsigned long long)sup);
		done++;
	}
	return done;
}

static int verbs_event_fd(const struct kvx_xport_ctx *ctx)
{
	const struct vctx *c = (const struct vctx *)ctx;
	return c->ibctx->async_fd; /* O_NONBLOCK since verbs_open */
}

/* progress() has no work (the NIC serves peers; async events are the control thread's):
 * an idle progress poller just sleeps. */
static int verbs_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms)
{
	(void)ctx;
	if (timeout_ms == 0)
		return 0;
	int rc = poll(NULL, 0, timeout_ms);
	return rc < 0 && errno != EINTR ? -errno : 0;
}

const struct kvx_xport_ops kvx_xport_verbs_ops = {
	.name = "verbs",
	.id = KVX_XPORT_PROV_VERBS,
	.probe = verbs_probe,
	.open = verbs_open,
	.close = verbs_close,
	.mr_register = verbs_mr_register,
	.mr_unregister = verbs_mr_unregister,
	.rmr_check = verbs_rmr_check,
	.ep_create = verbs_ep_create,
	.ep_accept = verbs_ep_accept,
	.ep_connect = verbs_ep_connect,
	.ep_destroy = verbs_ep_destroy,
	.post = verbs_post,
	.poll = verbs_poll,
	.progress = kvx_xport_noop_progress,
	/* needs_progress is false: no progress wait fd; ctx_wait only sleeps. Pollers spin on the
	 * CQ, or sleep on its completion channel (ep_wait). */
	.ctx_wait_fd = kvx_xport_enotsup_ctx_wait_fd,
	.ctx_wait = verbs_ctx_wait,
	.ep_wait = verbs_ep_wait,
	.ep_arm = kvx_xport_enotsup_ep_arm,
	.ep_create_group = verbs_ep_create_group,
	.ep_set_group = verbs_ep_set_group,
	.ctx_event_fd = verbs_event_fd,
	.ctx_handle_events = verbs_handle_events,
	.ep_reset = verbs_ep_reset,
	.ep_reaccept = verbs_ep_reaccept,
};
