/* SPDX-License-Identifier: Apache-2.0 */
/* Generic transport layer: provider registry, argument checks, descriptors, counters. */
#include "transport_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const struct kvx_xport_ops *const g_providers[] = {
	&kvx_xport_tcp_ops,
	&kvx_xport_shm_ops,
#ifdef KVX_XPORT_VERBS_BUILT
	&kvx_xport_verbs_ops,
#endif
};

static const struct kvx_xport_ops *find_provider(const char *name)
{
	for (size_t i = 0; i < KVX_ARRAY_SIZE(g_providers); i++)
		if (!strcmp(g_providers[i]->name, name))
			return g_providers[i];
	return NULL;
}

static bool known_name(const char *name)
{
	return !strcmp(name, "tcp") || !strcmp(name, "shm") || !strcmp(name, "verbs");
}

size_t kvx_xport_provider_list(const char **names, size_t cap)
{
	size_t n = KVX_ARRAY_SIZE(g_providers);
	for (size_t i = 0; i < n && i < cap; i++)
		names[i] = g_providers[i]->name;
	return n;
}

int kvx_xport_provider_probe(const char *name, char *reason, size_t reason_cap)
{
	char dummy[KVX_XPORT_REASON_MAX];
	if (!reason || !reason_cap) {
		reason = dummy;
		reason_cap = sizeof(dummy);
	}
	reason[0] = '\0';
	if (!name) {
		snprintf(reason, reason_cap, "provider name is NULL");
		return -EINVAL;
	}
	const struct kvx_xport_ops *ops = find_provider(name);
	if (!ops) {
		if (known_name(name)) {
			snprintf(reason, reason_cap, "%s: provider not compiled into this build", name);
			return -ENOTSUP;
		}
		snprintf(reason, reason_cap, "unknown provider '%s' (tcp, shm, verbs, auto)", name);
		return -ENOENT;
	}
	return ops->probe(reason, reason_cap);
}

int kvx_xport_select(const char *requested, bool peer_same_host, const char **out)
{
	if (!requested || !out)
		return -EINVAL;
	if (strcmp(requested, "auto")) {
		int rc = kvx_xport_provider_probe(requested, NULL, 0);
		if (rc)
			return rc;
		*out = find_provider(requested)->name;
		return 0;
	}
	/* docs/architecture.md §3: verbs if a usable RDMA device exists, else shm for a same-host peer when
	 * CMA is permitted, else tcp. */
	if (find_provider("verbs") && kvx_xport_provider_probe("verbs", NULL, 0) == 0) {
		*out = "verbs";
		return 0;
	}
	if (peer_same_host && kvx_xport_provider_probe("shm", NULL, 0) == 0) {
		*out = "shm";
		return 0;
	}
	*out = "tcp";
	return 0;
}

void kvx_xport_ctx_params_init(struct kvx_xport_ctx_params *p)
{
	memset(p, 0, sizeof(*p));
	p->gid_index = -1;
}

static int check_params(const struct kvx_xport_ctx_params *p)
{
	if (p->num_channels > 64) {
		kvx_log(KVX_LOG_ERROR, "transport: num_channels=%u out of range 0..64", p->num_channels);
		return -EINVAL;
	}
	if (p->progress_groups > 16) {
		kvx_log(KVX_LOG_ERROR, "transport: progress_groups=%u out of range 0..16",
			p->progress_groups);
		return -EINVAL;
	}
	if (p->queue_depth > 65536) {
		kvx_log(KVX_LOG_ERROR, "transport: queue_depth=%u out of range 0..65536", p->queue_depth);
		return -EINVAL;
	}
	if (p->max_regions > 65535) {
		kvx_log(KVX_LOG_ERROR, "transport: max_regions=%u out of range 0..65535", p->max_regions);
		return -EINVAL;
	}
	if (p->chunk_bytes && (p->chunk_bytes < 4096 || p->chunk_bytes > (16u << 20))) {
		kvx_log(KVX_LOG_ERROR, "transport: chunk_bytes=%u out of range 4096..16777216",
			p->chunk_bytes);
		return -EINVAL;
	}
	if (p->tcp_addr && strlen(p->tcp_addr) >= 64) {
		kvx_log(KVX_LOG_ERROR, "transport: tcp_addr too long");
		return -EINVAL;
	}
	if (p->device && strlen(p->device) >= 64) {
		kvx_log(KVX_LOG_ERROR, "transport: device name too long");
		return -EINVAL;
	}
	return 0;
}

static uint32_t pow2_ceil(uint32_t v)
{
	uint32_t r = 1;
	while (r < v)
		r <<= 1;
	return r;
}

int kvx_xport_open(const char *provider, const struct kvx_xport_ctx_params *p,
		   struct kvx_xport_ctx **out)
{
	if (!provider || !out)
		return -EINVAL;
	struct kvx_xport_ctx_params prm;
	if (p)
		prm = *p;
	else
		kvx_xport_ctx_params_init(&prm);
	int rc = check_params(&prm);
	if (rc)
		return rc;
	const char *name = provider;
	if (!strcmp(provider, "auto")) {
		rc = kvx_xport_select("auto", false, &name);
		if (rc)
			return rc;
	}
	char reason[KVX_XPORT_REASON_MAX];
	rc = kvx_xport_provider_probe(name, reason, sizeof(reason));
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "transport: cannot open '%s': %s", name, reason);
		return rc;
	}
	const struct kvx_xport_ops *ops = find_provider(name);
	/* Defaults, applied once here so every provider sees final values. */
	if (!prm.op_timeout_ns)
		prm.op_timeout_ns = KVX_XPORT_DEFAULT_OP_TIMEOUT_NS;
	if (!prm.num_channels)
		prm.num_channels = 1;
	prm.queue_depth = pow2_ceil(prm.queue_depth ? prm.queue_depth : 8192);
	if (!prm.max_regions)
		prm.max_regions = 1024;
	if (!prm.chunk_bytes)
		prm.chunk_bytes = 1u << 20;
	if (!prm.ib_port)
		prm.ib_port = 1;
	struct kvx_xport_ctx *ctx = NULL;
	rc = ops->open(&prm, &ctx);
	if (rc)
		return rc;
	ctx->ops = ops;
	if (!ctx->caps.progress_groups)
		ctx->caps.progress_groups = 1;
	ctx->params = prm;
	snprintf(ctx->tcp_addr, sizeof(ctx->tcp_addr), "%s", prm.tcp_addr ? prm.tcp_addr : "127.0.0.1");
	ctx->params.tcp_addr = ctx->tcp_addr;
	snprintf(ctx->device, sizeof(ctx->device), "%s", prm.device ? prm.device : "");
	ctx->params.device = prm.device ? ctx->device : NULL;
	*out = ctx;
	return 0;
}

void kvx_xport_close(struct kvx_xport_ctx *ctx)
{
	if (!ctx)
		return;
	while (ctx->eps)
		kvx_xport_ep_destroy(ctx->eps);
	/* The provider frees its remaining regions (ctx->mrs) and target-side state. */
	ctx->ops->close(ctx);
}

const char *kvx_xport_name(const struct kvx_xport_ctx *ctx)
{
	return ctx->ops->name;
}

int kvx_xport_query_caps(const struct kvx_xport_ctx *ctx, struct kvx_xport_caps *out)
{
	if (!ctx || !out)
		return -EINVAL;
	*out = ctx->caps;
	return 0;
}

int kvx_xport_progress(struct kvx_xport_ctx *ctx)
{
	return ctx->ops->progress(ctx);
}

int kvx_xport_progress_group(struct kvx_xport_ctx *ctx, uint32_t group)
{
	if (group >= ctx->caps.progress_groups)
		return -EINVAL;
	return group ? ctx->ops->progress_group(ctx, group) : ctx->ops->progress(ctx);
}

int kvx_xport_group_wait_fd(const struct kvx_xport_ctx *ctx, uint32_t group)
{
	if (group >= ctx->caps.progress_groups)
		return -EINVAL;
	return group ? ctx->ops->group_wait_fd(ctx, group) : kvx_xport_ctx_wait_fd(ctx);
}

static void cnt_read(const struct kvx_xport_cnt *c, struct kvx_xport_counters *o, bool add)
{
#define RD(f) (o->f = (add ? o->f : 0) + atomic_load_explicit(&c->f, memory_order_relaxed))
	RD(ops_posted);
	RD(ops_ok);
	RD(ops_failed);
	RD(batches_done);
	RD(bytes_read);
	RD(bytes_written);
	RD(post_nobufs);
	RD(timeouts);
	RD(resets);
	RD(reqs_served);
	RD(reqs_rejected);
	RD(bytes_served);
	RD(proto_errors);
	RD(auth_refused);
	RD(async_events);
	RD(async_errors);
	RD(sock_calls);
	RD(sock_would_block);
	RD(cma_calls);
#undef RD
}

void kvx_xport_ctx_counters(const struct kvx_xport_ctx *ctx, struct kvx_xport_counters *out)
{
	cnt_read(&ctx->cnt, out, false);
	for (uint32_t i = 0; i < ctx->n_xcnt; i++)
		cnt_read(&ctx->xcnt[i], out, true);
	for (const struct kvx_xport_ep *ep = ctx->eps; ep; ep = ep->next)
		cnt_read(&ep->cnt, out, true);
}

void kvx_xport_ctx_service_counters(const struct kvx_xport_ctx *ctx, struct kvx_xport_counters *out)
{
	cnt_read(&ctx->cnt, out, false);
	for (uint32_t i = 0; i < ctx->n_xcnt; i++)
		cnt_read(&ctx->xcnt[i], out, true);
}

void kvx_xport_ep_counters(const struct kvx_xport_ep *ep, struct kvx_xport_counters *out)
{
	cnt_read(&ep->cnt, out, false);
}

int kvx_xport_ep_status(const struct kvx_xport_ep *ep)
{
	return atomic_load_explicit(&ep->status, memory_order_relaxed);
}

/* ---- regions ---- */

int kvx_xport_mr_register(struct kvx_xport_ctx *ctx, const struct kvx_xport_mr_params *p,
			  struct kvx_xport_mr **out)
{
	if (!ctx || !p || !out)
		return -EINVAL;
	if (!p->addr || !p->len_bytes) {
		kvx_log(KVX_LOG_ERROR, "transport: mr_register: addr=%p len_bytes=%llu invalid", p->addr,
			(unsigned long long)p->len_bytes);
		return -EINVAL;
	}
	if (p->access & ~(uint32_t)KVX_XPORT_ACCESS_ALL) {
		kvx_log(KVX_LOG_ERROR, "transport: mr_register: unknown access bits 0x%x", p->access);
		return -EINVAL;
	}
	if ((unsigned)p->mem_type > KVX_XPORT_MEM_HOSTDEV) {
		kvx_log(KVX_LOG_ERROR, "transport: mr_register: unknown mem_type %d", (int)p->mem_type);
		return -EINVAL;
	}
	if (!(ctx->caps.mem_types & (1u << p->mem_type))) {
		kvx_log(KVX_LOG_ERROR, "transport: %s: mr_register: memory type %d not supported by "
			"this context%s%s", ctx->ops->name, (int)p->mem_type, ctx->mem_why[0] ? ": " : "",
			ctx->mem_why);
		return -ENOTSUP;
	}
	struct kvx_xport_mr *mr = NULL;
	int rc = ctx->ops->mr_register(ctx, p, &mr);
	if (rc)
		return rc;
	xport_mr_link(ctx, mr);
	*out = mr;
	return 0;
}

int kvx_xport_mr_unregister(struct kvx_xport_mr *mr)
{
	if (!mr)
		return 0;
	struct kvx_xport_ctx *ctx = mr->ctx;
	xport_mr_unlink(mr);
	int rc = ctx->ops->mr_unregister(mr);
	if (rc)
		xport_mr_link(ctx, mr);
	return rc;
}

uint32_t kvx_xport_mr_key(const struct kvx_xport_mr *mr)
{
	return mr->key;
}

int kvx_xport_mr_export(const struct kvx_xport_mr *mr, void *buf, size_t cap, size_t *len)
{
	if (!mr || !buf)
		return -EINVAL;
	if (cap < KVX_XPORT_RDESC_BYTES)
		return -EMSGSIZE;
	uint8_t *b = buf;
	memcpy(b, "KXRD", 4);
	b[4] = 1;
	b[5] = (uint8_t)mr->ctx->ops->id;
	b[6] = (uint8_t)mr->mem_type;
	b[7] = 0;
	xport_put_u32(b + 8, mr->access);
	xport_put_u32(b + 12, mr->key);
	xport_put_u64(b + 16, (uint64_t)(uintptr_t)mr->addr);
	xport_put_u64(b + 24, mr->len);
	xport_put_u64(b + 32, 0);
	if (len)
		*len = KVX_XPORT_RDESC_BYTES;
	return 0;
}

int kvx_xport_rmr_import(struct kvx_xport_ep *ep, const void *buf, size_t len,
			 struct kvx_xport_rmr **out)
{
	if (!ep || !buf || !out)
		return -EINVAL;
	if (len != KVX_XPORT_RDESC_BYTES) {
		kvx_log(KVX_LOG_WARN, "transport: region descriptor length %zu, expected %d", len,
			KVX_XPORT_RDESC_BYTES);
		return -EMSGSIZE;
	}
	const uint8_t *b = buf;
	const char *bad = NULL;
	if (memcmp(b, "KXRD", 4))
		bad = "magic";
	else if (b[4] != 1)
		bad = "version";
	else if (b[5] != (uint8_t)ep->ctx->ops->id)
		bad = "provider id";
	else if (b[6] > KVX_XPORT_MEM_HOSTDEV)
		bad = "mem type";
	else if (b[7] || xport_get_u64(b + 32))
		bad = "reserved";
	else if (xport_get_u32(b + 8) & ~(uint32_t)KVX_XPORT_ACCESS_ALL)
		bad = "access";
	else if (!xport_get_u64(b + 24) || xport_get_u64(b + 16) + xport_get_u64(b + 24) <
						       xport_get_u64(b + 16))
		bad = "len";
	if (bad) {
		kvx_log(KVX_LOG_WARN, "transport: region descriptor rejected: bad %s", bad);
		return -EPROTO;
	}
	struct kvx_xport_rmr *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->ep = ep;
	r->mem_type = (enum kvx_xport_mem_type)b[6];
	r->access = xport_get_u32(b + 8);
	r->key = xport_get_u32(b + 12);
	r->addr = xport_get_u64(b + 16);
	r->len = xport_get_u64(b + 24);
	int rc = ep->ctx->ops->rmr_check(ep, r);
	if (rc) {
		free(r);
		return rc;
	}
	r->next = ep->rmrs;
	if (ep->rmrs)
		ep->rmrs->prev = r;
	ep->rmrs = r;
	*out = r;
	return 0;
}

void kvx_xport_rmr_release(struct kvx_xport_rmr *rmr)
{
	if (!rmr)
		return;
	if (rmr->prev)
		rmr->prev->next = rmr->next;
	else
		rmr->ep->rmrs = rmr->next;
	if (rmr->next)
		rmr->next->prev = rmr->prev;
	free(rmr);
}

/* ---- endpoints ---- */

int kvx_xport_ep_create(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, void *blob,
			size_t cap, size_t *blob_len)
{
	if (!ctx || !out || !blob || !blob_len)
		return -EINVAL;
	struct kvx_xport_ep *ep = NULL;
	int rc = ctx->ops->ep_create(ctx, &ep, blob, cap, blob_len);
	if (rc)
		return rc;
	ep->ctx = ctx;
	ep->initiator = true;
	xport_ep_link(ctx, ep);
	*out = ep;
	return 0;
}

int kvx_xport_ep_create_in_group(struct kvx_xport_ctx *ctx, uint32_t group,
				 struct kvx_xport_ep **out, void *blob, size_t cap, size_t *blob_len)
{
	if (!ctx || !out || !blob || !blob_len)
		return -EINVAL;
	if (group >= KVX_XPORT_MAX_GROUPS) {
		kvx_log(KVX_LOG_ERROR, "transport: group %u out of range 0..%u", group,
			KVX_XPORT_MAX_GROUPS - 1);
		return -EINVAL;
	}
	struct kvx_xport_ep *ep = NULL;
	int rc = ctx->ops->ep_create_group(ctx, group, &ep, blob, cap, blob_len);
	if (rc)
		return rc;
	ep->ctx = ctx;
	ep->initiator = true;
	ep->group = group;
	xport_ep_link(ctx, ep);
	*out = ep;
	return 0;
}

int kvx_xport_ep_set_group(struct kvx_xport_ep *ep, uint32_t group)
{
	if (!ep)
		return -EINVAL;
	if (group >= KVX_XPORT_MAX_GROUPS) {
		kvx_log(KVX_LOG_ERROR, "transport: group %u out of range 0..%u", group,
			KVX_XPORT_MAX_GROUPS - 1);
		return -EINVAL;
	}
	if (ep->initiator && ep->connected)
		return -EISCONN;
	int rc = ep->ctx->ops->ep_set_group(ep, group);
	if (rc == 0)
		ep->group = group;
	return rc;
}

uint32_t kvx_xport_ep_group(const struct kvx_xport_ep *ep)
{
	return ep->group;
}

int kvx_xport_ctx_event_fd(const struct kvx_xport_ctx *ctx)
{
	if (!ctx)
		return -EINVAL;
	return ctx->ops->ctx_event_fd(ctx);
}

int kvx_xport_ctx_handle_events(struct kvx_xport_ctx *ctx)
{
	if (!ctx)
		return -EINVAL;
	return ctx->ops->ctx_handle_events(ctx);
}

int kvx_xport_ep_accept(struct kvx_xport_ctx *ctx, const void *blob_a, size_t len_a,
			struct kvx_xport_ep **out, void *blob_b, size_t cap, size_t *len_b)
{
	if (!ctx || !blob_a || !out || !blob_b || !len_b)
		return -EINVAL;
	struct kvx_xport_ep *ep = NULL;
	int rc = ctx->ops->ep_accept(ctx, blob_a, len_a, &ep, blob_b, cap, len_b);
	if (rc)
		return rc;
	ep->ctx = ctx;
	ep->initiator = false;
	ep->connected = true;
	xport_ep_link(ctx, ep);
	*out = ep;
	return 0;
}

int kvx_xport_ep_connect(struct kvx_xport_ep *ep, const void *blob_b, size_t len_b)
{
	if (!ep || !blob_b)
		return -EINVAL;
	if (!ep->initiator)
		return -ENOTSUP;
	if (ep->connected)
		return -EISCONN;
	int rc = ep->ctx->ops->ep_connect(ep, blob_b, len_b);
	if (rc == 0)
		ep->connected = true;
	return rc;
}

void kvx_xport_ep_destroy(struct kvx_xport_ep *ep)
{
	if (!ep)
		return;
	while (ep->rmrs)
		kvx_xport_rmr_release(ep->rmrs);
	xport_ep_unlink(ep);
	ep->ctx->ops->ep_destroy(ep);
}

/* The argument checks of kvx_xport_post_bulk() (and _cond()): 0 or the documented error. */
static inline int post_check(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
			     const struct kvx_xport_op *ops, uint32_t n)
{
	if (KVX_UNLIKELY(!ep || !ops || n == 0 || n > ep->ctx->caps.max_batch))
		return -EINVAL;
	if (KVX_UNLIKELY(opcode != KVX_XPORT_OP_READ && opcode != KVX_XPORT_OP_WRITE))
		return -EINVAL;
	if (KVX_UNLIKELY(!ep->initiator))
		return -ENOTSUP;
	if (KVX_UNLIKELY(!ep->connected))
		return -ENOTCONN;
	uint64_t max = ep->ctx->caps.max_op_bytes;
	for (uint32_t i = 0; i < n; i++)
		if (KVX_UNLIKELY(!ops[i].lmr || !ops[i].rmr || !ops[i].len || ops[i].len > max ||
				 ops[i].rmr->ep != ep || ops[i].lmr->ctx != ep->ctx))
			return -EINVAL;
	return 0;
}

int kvx_xport_post_bulk(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
			const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie)
{
	int rc = post_check(ep, opcode, ops, n);
	if (KVX_UNLIKELY(rc))
		return rc;
	return ep->ctx->ops->post(ep, opcode, ops, n, cookie);
}

int kvx_xport_post_bulk_cond(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
			     const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie,
			     const struct kvx_xport_cond *cond)
{
	if (KVX_UNLIKELY(!ep || !cond || !cond->rmr))
		return -EINVAL;
	if (KVX_UNLIKELY(!ep->ctx->ops->post_cond))
		return -ENOTSUP;
	const struct kvx_xport_rmr *r = cond->rmr;
	if (KVX_UNLIKELY(r->ep != ep || (cond->roff & 7) || r->len < 8 || cond->roff > r->len - 8))
		return -EINVAL;
	int rc = post_check(ep, opcode, ops, n);
	if (KVX_UNLIKELY(rc))
		return rc;
	return ep->ctx->ops->post_cond(ep, opcode, ops, n, cookie, cond);
}

int kvx_xport_ctx_cond_busy(struct kvx_xport_ctx *ctx, uint64_t word)
{
	if (KVX_UNLIKELY(!ctx || !word))
		return -EINVAL;
	return ctx->ops->cond_busy ? ctx->ops->cond_busy(ctx, word) : 0;
}

int kvx_xport_poll_burst(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max)
{
	if (KVX_UNLIKELY(!ep->initiator))
		return 0;
	return ep->ctx->ops->poll(ep, cpl, max);
}

int kvx_xport_ctx_wait_fd(const struct kvx_xport_ctx *ctx)
{
	return ctx->ops->ctx_wait_fd(ctx);
}

int kvx_xport_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms)
{
	return ctx->ops->ctx_wait(ctx, timeout_ms);
}

int kvx_xport_ep_wait(struct kvx_xport_ep *ep, int timeout_ms)
{
	if (!ep->initiator || !ep->connected)
		return -ENOTSUP;
	return ep->ctx->ops->ep_wait(ep, timeout_ms);
}

int kvx_xport_ep_arm(struct kvx_xport_ep *ep, int epfd)
{
	if (!ep->initiator || !ep->connected)
		return -ENOTSUP;
	return ep->ctx->ops->ep_arm(ep, epfd);
}

/* ---- helpers for providers ---- */

int kvx_xport_enotsup_ctx_wait_fd(const struct kvx_xport_ctx *ctx)
{
	(void)ctx;
	return -ENOTSUP;
}

int kvx_xport_enotsup_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms)
{
	(void)ctx;
	(void)timeout_ms;
	return -ENOTSUP;
}

int kvx_xport_enotsup_ep_wait(struct kvx_xport_ep *ep, int timeout_ms)
{
	(void)ep;
	(void)timeout_ms;
	return -ENOTSUP;
}

int kvx_xport_enotsup_ep_arm(struct kvx_xport_ep *ep, int epfd)
{
	(void)ep;
	(void)epfd;
	return -ENOTSUP;
}

int kvx_xport_any_group_ep_create(struct kvx_xport_ctx *ctx, uint32_t group,
				  struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len)
{
	(void)group; /* no per-group resources: the generic layer records the group */
	return ctx->ops->ep_create(ctx, out, blob, cap, len);
}

int kvx_xport_record_ep_set_group(struct kvx_xport_ep *ep, uint32_t group)
{
	(void)ep;
	(void)group;
	return 0;
}

int kvx_xport_enotsup_ctx_event_fd(const struct kvx_xport_ctx *ctx)
{
	(void)ctx;
	return -ENOTSUP;
}

int kvx_xport_noop_handle_events(struct kvx_xport_ctx *ctx)
{
	(void)ctx;
	return 0;
}

int kvx_xport_enotsup_ep_reset(struct kvx_xport_ep *ep, uint8_t *blob, size_t cap, size_t *len)
{
	(void)ep;
	(void)blob;
	(void)cap;
	(void)len;
	return -ENOTSUP;
}

int kvx_xport_enotsup_ep_reaccept(struct kvx_xport_ep *ep, const uint8_t *a, size_t alen,
				  uint8_t *blob, size_t cap, size_t *len)
{
	(void)ep;
	(void)a;
	(void)alen;
	(void)blob;
	(void)cap;
	(void)len;
	return -ENOTSUP;
}

int kvx_xport_noop_progress(struct kvx_xport_ctx *ctx)
{
	(void)ctx;
	return 0; /* progress is a count: "nothing to do" is 0 (no target-side work) */
}

int kvx_xport_enotsup_rmr_check(struct kvx_xport_ep *ep, const struct kvx_xport_rmr *rmr)
{
	(void)ep;
	(void)rmr;
	return -ENOTSUP;
}

void xport_blob_hdr_put(uint8_t *p, enum kvx_xport_provider_id id, int kind)
{
	memcpy(p, "KXEP", 4);
	p[4] = XPORT_BLOB_VERSION;
	p[5] = (uint8_t)id;
	p[6] = (uint8_t)kind;
	p[7] = 0;
}

int xport_blob_hdr_check(const uint8_t *p, size_t len, size_t want_len,
			 enum kvx_xport_provider_id id, int kind, const char *who)
{
	if (len != want_len) {
		kvx_log(KVX_LOG_WARN, "%s: blob length %zu, expected %zu", who, len, want_len);
		return -EMSGSIZE;
	}
	const char *bad = NULL;
	if (memcmp(p, "KXEP", 4))
		bad = "magic";
	else if (p[4] != XPORT_BLOB_VERSION)
		bad = "version";
	else if (p[5] != (uint8_t)id)
		bad = "provider id";
	else if (p[6] != (uint8_t)kind)
		bad = "kind (A/B)";
	else if (p[7])
		bad = "reserved";
	if (bad) {
		kvx_log(KVX_LOG_WARN, "%s: blob rejected: bad %s", who, bad);
		return -EPROTO;
	}
	return 0;
}

void xport_ep_link(struct kvx_xport_ctx *ctx, struct kvx_xport_ep *ep)
{
	ep->prev = NULL;
	ep->next = ctx->eps;
	if (ctx->eps)
		ctx->eps->prev = ep;
	ctx->eps = ep;
}

void xport_ep_unlink(struct kvx_xport_ep *ep)
{
	if (ep->prev)
		ep->prev->next = ep->next;
	else
		ep->ctx->eps = ep->next;
	if (ep->next)
		ep->next->prev = ep->prev;
	ep->next = ep->prev = NULL;
}

void xport_mr_link(struct kvx_xport_ctx *ctx, struct kvx_xport_mr *mr)
{
	mr->prev = NULL;
	mr->next = ctx->mrs;
	if (ctx->mrs)
		ctx->mrs->prev = mr;
	ctx->mrs = mr;
}

void xport_mr_unlink(struct kvx_xport_mr *mr)
{
	if (mr->prev)
		mr->prev->next = mr->next;
	else
		mr->ctx->mrs = mr->next;
	if (mr->next)
		mr->next->prev = mr->prev;
	mr->next = mr->prev = NULL;
}

int xport_boot_id(uint8_t out[16])
{
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	char s[64];
	ssize_t n = read(fd, s, sizeof(s) - 1);
	int err = errno;
	close(fd);
	if (n < 32)
		return n < 0 ? -err : -EIO;
	s[n] = '\0';
	int k = 0;
	for (ssize_t i = 0; i < n && k < 32; i++) {
		char c = s[i];
		int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (v < 0)
			continue;
		if (k % 2 == 0)
			out[k / 2] = (uint8_t)(v << 4);
		else
			out[k / 2] |= (uint8_t)v;
		k++;
	}
	return k == 32 ? 0 : -EIO;
}
