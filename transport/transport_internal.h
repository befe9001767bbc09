/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TRANSPORT_INTERNAL_H
#define KVX_TRANSPORT_INTERNAL_H
/**
 * @file
 * Module-private: the provider ops table and the base structs every provider embeds.
 *
 * A provider defines `const struct kvx_xport_ops kvx_xport_<name>_ops` with every slot set
 * (the stub helpers below for what it lacks), allocates its own context,
 * region and endpoint structs with the base struct as the FIRST member, and fills the base
 * fields. The generic layer (transport.c) checks arguments, owns the descriptor encoding,
 * the imported remote regions and the counters' read side; the provider does the rest.
 *
 * verbs: transport/CMakeLists.txt defines KVX_XPORT_VERBS_BUILT when transport/verbs/ has .c files
 * exists, and the registry then references `kvx_xport_verbs_ops` (defined in verbs/).
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvxfer/transport.h"

/** Provider ids carried in descriptors and blobs. */
enum kvx_xport_provider_id {
	KVX_XPORT_PROV_TCP = 1,
	KVX_XPORT_PROV_SHM = 2,
	KVX_XPORT_PROV_VERBS = 3,
};

/** Counters with one writer thread each and relaxed readers (see xport_cnt_add()). */
struct kvx_xport_cnt {
	_Atomic uint64_t ops_posted, ops_ok, ops_failed, batches_done, bytes_read, bytes_written,
		post_nobufs, timeouts, resets, reqs_served, reqs_rejected, bytes_served,
		proto_errors, async_events, async_errors, auth_refused, sock_calls, sock_would_block,
		cma_calls;
};

/** Add to a counter owned by the calling thread (single writer: load + store, no RMW). */
#define xport_cnt_add(c, field, v)                                                           \
	atomic_store_explicit(&(c)->field,                                                   \
			      atomic_load_explicit(&(c)->field, memory_order_relaxed) + (v), \
			      memory_order_relaxed)

struct kvx_xport_ops;

/** Base of every provider context. */
struct kvx_xport_ctx {
	const struct kvx_xport_ops *ops;
	struct kvx_xport_ctx_params params; /* defaults applied; strings point at the copies */
	char tcp_addr[64];
	char device[64];
	struct kvx_xport_caps caps;
	char mem_why[256];                  /* provider: why a memory type is missing from
	                                       caps.mem_types ("" = not said), logged at refusal */
	struct kvx_xport_ep *eps;           /* all endpoints; control thread only */
	struct kvx_xport_mr *mrs;           /* all regions; control thread only */
	struct kvx_xport_cnt cnt;           /* target-side counters, relaxed atomics read by any
	                                       thread: written by the kvx_xport_progress() caller,
	                                       async_* by the kvx_xport_ctx_handle_events() caller */
	const struct kvx_xport_cnt *xcnt;   /* Array[n_xcnt]: more target-side counters, one per
	                                       progress group 1.. (its thread writes it); summed
	                                       into cnt by the readers. Set at open. */
	uint32_t n_xcnt;
};

/** Base of every provider region. */
struct kvx_xport_mr {
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_mr *next, *prev;   /* ctx->mrs list */
	uint8_t *addr;
	uint64_t len;
	uint32_t access;
	uint32_t key;
	enum kvx_xport_mem_type mem_type;
	int device_id;
};

/** Imported remote region (generic; providers read the fields). */
struct kvx_xport_rmr {
	struct kvx_xport_ep *ep;
	struct kvx_xport_rmr *next, *prev;  /* ep->rmrs list */
	uint64_t addr;
	uint64_t len;
	uint32_t access;
	uint32_t key;
	enum kvx_xport_mem_type mem_type;
	uint32_t prov_flags;                /* provider-private (shm: verified against the peer) */
};

/** Base of every provider endpoint. */
struct kvx_xport_ep {
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *next, *prev;   /* ctx->eps list */
	struct kvx_xport_rmr *rmrs;
	bool initiator;
	bool connected;
	_Atomic int status;                 /* 0 or the error that moved it to error state */
	uint32_t group;                     /* poll group (kvx_xport_ep_set_group), default 0 */
	struct kvx_xport_cnt cnt;           /* written by the owning poller */
};

/**
 * Provider ops table: no NULL slots (except post_cond, cond_busy, progress_group and
 * group_wait_fd). Arguments are already checked by transport.c
 * (non-NULL pointers, ranges of documented fields) unless noted.
 */
struct kvx_xport_ops {
	const char *name;
	enum kvx_xport_provider_id id;
	/** 0 when usable; else negative errno and a reason in @p reason. */
	int (*probe)(char *reason, size_t cap);
	/** Allocate the provider context (base first), fill base->caps; base params are set by
	 *  the caller after return via xport_ctx_init(). */
	int (*open)(const struct kvx_xport_ctx_params *p, struct kvx_xport_ctx **out);
	void (*close)(struct kvx_xport_ctx *ctx);
	int (*mr_register)(struct kvx_xport_ctx *ctx, const struct kvx_xport_mr_params *p,
			   struct kvx_xport_mr **out);
	int (*mr_unregister)(struct kvx_xport_mr *mr);
	/** Accept or refuse an imported descriptor (memory type support, provider rules). */
	int (*rmr_check)(struct kvx_xport_ep *ep, const struct kvx_xport_rmr *rmr);
	int (*ep_create)(struct kvx_xport_ctx *ctx, struct kvx_xport_ep **out, uint8_t *blob,
			 size_t cap, size_t *len);
	int (*ep_accept)(struct kvx_xport_ctx *ctx, const uint8_t *a, size_t alen,
			 struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len);
	int (*ep_connect)(struct kvx_xport_ep *ep, const uint8_t *b, size_t blen);
	void (*ep_destroy)(struct kvx_xport_ep *ep);
	int (*post)(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
		    const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie);
	/** kvx_xport_post_bulk_cond() (cond checked by transport.c). The one slot that may be
	 *  NULL: providers without conditional ops (caps.cond_ops false). */
	int (*post_cond)(struct kvx_xport_ep *ep, enum kvx_xport_opcode opcode,
			 const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie,
			 const struct kvx_xport_cond *cond);
	/** kvx_xport_ctx_cond_busy() (any thread). May be NULL: providers whose target applies
	 *  the condition itself (tcp) or that have none (verbs): never busy. */
	int (*cond_busy)(struct kvx_xport_ctx *ctx, uint64_t word);
	int (*poll)(struct kvx_xport_ep *ep, struct kvx_xport_cpl *cpl, uint32_t max);
	int (*progress)(struct kvx_xport_ctx *ctx);
	/** kvx_xport_progress_group() for a group 1..caps.progress_groups-1 (checked). May be
	 *  NULL when caps.progress_groups is 1. */
	int (*progress_group)(struct kvx_xport_ctx *ctx, uint32_t group);
	/** kvx_xport_group_wait_fd() for a group 1..caps.progress_groups-1 (checked); may be NULL
	 *  as progress_group. */
	int (*group_wait_fd)(const struct kvx_xport_ctx *ctx, uint32_t group);
	/** fd readable when progress may have work, or -ENOTSUP. */
	int (*ctx_wait_fd)(const struct kvx_xport_ctx *ctx);
	/** Block up to timeout_ms for target-side events: 1 event, 0 timeout, or -ENOTSUP. */
	int (*ctx_wait)(struct kvx_xport_ctx *ctx, int timeout_ms);
	/** Block up to timeout_ms for endpoint events: 1 event, 0 timeout, or -ENOTSUP. */
	int (*ep_wait)(struct kvx_xport_ep *ep, int timeout_ms);
	/** kvx_xport_ep_arm(): 1 sleep-safe (readiness fd in epfd), 0 poll again, or -ENOTSUP. */
	int (*ep_arm)(struct kvx_xport_ep *ep, int epfd);
	/** ep_create with the poll group known at creation (providers without per-group
	 *  resources: kvx_xport_any_group_ep_create, which calls ep_create). */
	int (*ep_create_group)(struct kvx_xport_ctx *ctx, uint32_t group, struct kvx_xport_ep **out,
			       uint8_t *blob, size_t cap, size_t *len);
	/** Accept or refuse a group change; transport.c records it on success (providers without
	 *  per-group resources: kvx_xport_record_ep_set_group, returns 0). */
	int (*ep_set_group)(struct kvx_xport_ep *ep, uint32_t group);
	/** Device async-event fd, or -ENOTSUP (kvx_xport_enotsup_ctx_event_fd). */
	int (*ctx_event_fd)(const struct kvx_xport_ctx *ctx);
	/** Drain device async events: count handled or -errno (kvx_xport_noop_handle_events). */
	int (*ctx_handle_events)(struct kvx_xport_ctx *ctx);
	/** Initiator endpoint recovery (kvx_xport_ep_reset()): blob A' in @p blob, or -ENOTSUP
	 *  (kvx_xport_enotsup_ep_reset: no endpoint state worth keeping, create a new one). */
	int (*ep_reset)(struct kvx_xport_ep *ep, uint8_t *blob, size_t cap, size_t *len);
	/** Target side of the recovery (kvx_xport_ep_reaccept()): blob A' in, blob B' out, or
	 *  -ENOTSUP (kvx_xport_enotsup_ep_reaccept). */
	int (*ep_reaccept)(struct kvx_xport_ep *ep, const uint8_t *a, size_t alen, uint8_t *blob,
			   size_t cap, size_t *len);
};

extern const struct kvx_xport_ops kvx_xport_tcp_ops;
extern const struct kvx_xport_ops kvx_xport_shm_ops;
#ifdef KVX_XPORT_VERBS_BUILT
extern const struct kvx_xport_ops kvx_xport_verbs_ops;
#endif

/* Stubs for providers that lack an op (docs/style.md §8: no NULL slots): progress has no
 * target-side work (returns 0 = idle), rmr_check refuses every descriptor (-ENOTSUP). */
int kvx_xport_noop_progress(struct kvx_xport_ctx *ctx);
int kvx_xport_enotsup_rmr_check(struct kvx_xport_ep *ep, const struct kvx_xport_rmr *rmr);
int kvx_xport_enotsup_ctx_wait_fd(const struct kvx_xport_ctx *ctx);
int kvx_xport_enotsup_ctx_wait(struct kvx_xport_ctx *ctx, int timeout_ms);
int kvx_xport_enotsup_ep_wait(struct kvx_xport_ep *ep, int timeout_ms);
int kvx_xport_enotsup_ep_arm(struct kvx_xport_ep *ep, int epfd);
/* Poll groups and device events for providers without per-group resources or async events
 * (tcp, shm): create ignores the group (transport.c records it), set_group returns 0,
 * event_fd returns -ENOTSUP, handle_events returns 0 (nothing pending, ever). */
int kvx_xport_any_group_ep_create(struct kvx_xport_ctx *ctx, uint32_t group,
				  struct kvx_xport_ep **out, uint8_t *blob, size_t cap, size_t *len);
int kvx_xport_record_ep_set_group(struct kvx_xport_ep *ep, uint32_t group);
int kvx_xport_enotsup_ctx_event_fd(const struct kvx_xport_ctx *ctx);
int kvx_xport_noop_handle_events(struct kvx_xport_ctx *ctx);
/* Endpoint recovery for providers without it (tcp, shm): -ENOTSUP. */
int kvx_xport_enotsup_ep_reset(struct kvx_xport_ep *ep, uint8_t *blob, size_t cap, size_t *len);
int kvx_xport_enotsup_ep_reaccept(struct kvx_xport_ep *ep, const uint8_t *a, size_t alen,
				  uint8_t *blob, size_t cap, size_t *len);

/* ---- little-endian codec helpers for blobs and descriptors (bounds checked by callers) --- */
static inline void xport_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline void xport_put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline void xport_put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t xport_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t xport_get_u32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}
static inline uint64_t xport_get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/** Blob header shared by all providers: magic "KXEP", version, provider id, kind, reserved. */
#define XPORT_BLOB_HDR_BYTES 8
#define XPORT_BLOB_VERSION 1
enum { XPORT_BLOB_A = 1, XPORT_BLOB_B = 2 };
void xport_blob_hdr_put(uint8_t *p, enum kvx_xport_provider_id id, int kind);
/** Check a received blob header; logs the offending field. 0 or -EPROTO/-EMSGSIZE. */
int xport_blob_hdr_check(const uint8_t *p, size_t len, size_t want_len,
			 enum kvx_xport_provider_id id, int kind, const char *who);

/** Link/unlink an endpoint or region into the context's lists (control thread). */
void xport_ep_link(struct kvx_xport_ctx *ctx, struct kvx_xport_ep *ep);
void xport_ep_unlink(struct kvx_xport_ep *ep);
void xport_mr_link(struct kvx_xport_ctx *ctx, struct kvx_xport_mr *mr);
void xport_mr_unlink(struct kvx_xport_mr *mr);

/** Boot id of this host (16 bytes from /proc/sys/kernel/random/boot_id), 0 or -errno. */
int xport_boot_id(uint8_t out[16]);

/*
 * Upper 16 bits of a region key (issue 17): random per registration, never 0 and never the
 * previous value of the slot (a stale key still misses a reused slot). Keys advertised by
 * tcp/shm are therefore neither sequential nor predictable from earlier ones.
 */
#include <sys/random.h>
static inline uint16_t xport_key_gen(uint16_t prev)
{
	uint16_t g = 0;
	while (g == 0 || g == prev)
		if (getrandom(&g, sizeof(g), 0) != sizeof(g))
			g = 0;
	return g;
}

#endif /* KVX_TRANSPORT_INTERNAL_H */
