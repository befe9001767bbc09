/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory on the tcp and shm providers beyond the conformance suite, with the hostdev
 * mock (KVX_MEM_HOSTDEV: HIP's code paths without a GPU; its pointers fault on CPU and CMA
 * access): tcp staging with more bytes than the bounce rings hold (and target buffers smaller
 * than the initiator's chunks), host and device sides mixed in one transfer, registration
 * refusals, and the shm IPC mappings opened per peer allocation and closed with the endpoint.
 * The target is a real process (tests/transport/peer.c).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/mem.h"
#include "peer.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)

TestSuite(xport_devmem, .timeout = 120);

static struct kvx_mem *g_mem;

static struct kvx_mem *hostdev(void)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOSTDEV};
	if (!g_mem)
		cr_assert_eq(kvx_mem_open(&t, &g_mem), 0);
	return g_mem;
}

static void params(struct kvx_xport_ctx_params *p, uint32_t chunk_bytes)
{
	kvx_xport_ctx_params_init(p);
	p->op_timeout_ns = 20000000000ull;
	p->chunk_bytes = chunk_bytes;
}

static struct kvx_xport_ep *connect_ep(struct kvx_xport_ctx *ctx, struct peer *pe)
{
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t al = 0, bl = 0;
	struct kvx_xport_ep *ep = NULL;
	cr_assert_eq(kvx_xport_ep_create(ctx, &ep, a, sizeof(a), &al), 0);
	cr_assert_eq(peer_accept(pe, a, al, b, &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl), 0);
	return ep;
}

static struct kvx_xport_cpl run1(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc,
				 struct kvx_xport_mr *l, uint64_t loff, struct kvx_xport_rmr *r,
				 uint64_t roff, uint64_t len, uint64_t cookie)
{
	struct kvx_xport_op op = {.lmr = l, .rmr = r, .loff = loff, .roff = roff, .len = len};
	cr_assert_eq(kvx_xport_post_bulk(ep, opc, &op, 1, cookie), 0);
	uint64_t deadline = kvx_now_ns() + 60000000000ull;
	struct kvx_xport_cpl c;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0)
		cr_assert_lt(kvx_now_ns(), deadline, "no completion within 60 s");
	cr_assert_eq(c.cookie, cookie);
	return c;
}

/* Local region of @p len bytes: hostdev when @p dev, else host memory. */
static struct kvx_xport_mr *local(struct kvx_xport_ctx *ctx, bool dev, uint64_t len,
				  uint8_t **mem)
{
	if (dev)
		cr_assert_eq(kvx_mem_alloc(hostdev(), len, (void **)mem), 0);
	else
		cr_assert_not_null(*mem = aligned_alloc(4096, (len + 4095) & ~4095ull));
	struct kvx_xport_mr_params p = {.addr = *mem, .len_bytes = len,
					.access = KVX_XPORT_ACCESS_ALL,
					.mem_type = dev ? KVX_XPORT_MEM_HOSTDEV : KVX_XPORT_MEM_HOST};
	struct kvx_xport_mr *mr = NULL;
	cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), 0);
	return mr;
}

static void lfill(bool dev, uint8_t *p, uint64_t len, uint64_t seed, uint64_t pos)
{
	uint8_t *t = dev ? malloc(len) : p;
	pat_fill(t, len, seed, pos);
	if (dev) {
		cr_assert_eq(kvx_mem_copy_sync(hostdev(), p, t, len, KVX_MEM_H2D), 0);
		free(t);
	}
}

static uint64_t lcheck(bool dev, const uint8_t *p, uint64_t len, uint64_t seed, uint64_t pos)
{
	if (!dev)
		return pat_check(p, len, seed, pos);
	uint8_t *t = malloc(len);
	cr_assert_eq(kvx_mem_copy_sync(hostdev(), t, p, len, KVX_MEM_D2H), 0);
	uint64_t k = pat_check(t, len, seed, pos);
	free(t);
	return k;
}

static void lfree(bool dev, uint8_t *p)
{
	if (dev)
		kvx_mem_free(hostdev(), p);
	else
		free(p);
}

/* A target process of @p provider with @p mem regions, a local context and one endpoint. */
struct pair {
	struct peer pe;
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
};

static void pair_up(struct pair *x, const char *provider, const char *mem,
		    const struct kvx_xport_ctx_params *target, const struct kvx_xport_ctx_params *local)
{
	char why[KVX_MEM_WHY_LEN] = "";
	cr_assert_eq(peer_start_mem(&x->pe, provider, mem, target, why, sizeof(why)), 0,
		     "target %s/%s: %s", provider, mem, why);
	cr_assert_eq(kvx_xport_open(provider, local, &x->ctx), 0);
	x->ep = connect_ep(x->ctx, &x->pe);
}

static void pair_down(struct pair *x)
{
	kvx_xport_close(x->ctx);
	cr_assert_eq(peer_quit(&x->pe), 0);
}

/*
 * The target's bounce buffers are 4 KiB (its chunk_bytes), four per direction: every 64 KiB
 * request of the initiator is answered in 16 pieces and its WRITE payload lands through 16
 * H2D copies, so each op moves far more bytes than either ring holds.
 */
Test(xport_devmem, tcp_stage_moves_more_than_the_rings_hold_exact_bytes)
{
	struct kvx_xport_ctx_params tp, ip;
	params(&tp, 4096);
	params(&ip, 64 * KIB);
	struct pair x;
	pair_up(&x, "tcp", "hostdev", &tp, &ip);
	struct peer pe = x.pe;
	struct kvx_xport_ctx *ctx = x.ctx;
	struct kvx_xport_ep *ep = x.ep;
	const uint64_t len = 3 * MIB + 123;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&pe, len + 64, KVX_XPORT_ACCESS_ALL, 5, d);
	cr_assert_geq(idx, 0);
	struct kvx_xport_rmr *rr = NULL;
	cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &rr), 0);
	uint8_t *lm;
	struct kvx_xport_mr *l = local(ctx, true, len + 64, &lm);
	lfill(true, lm, len + 64, 6, 0);
	struct kvx_xport_cpl c = run1(ep, KVX_XPORT_OP_READ, l, 1, rr, 3, len, 1);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.bytes, len);
	cr_assert_eq(lcheck(true, lm + 1, len, 5, 3), len);
	cr_assert_eq(lcheck(true, lm, 1, 6, 0), 1);
	cr_assert_eq(lcheck(true, lm + 1 + len, 63, 6, 1 + len), 63);
	lfill(true, lm, len + 64, 7, 0);
	c = run1(ep, KVX_XPORT_OP_WRITE, l, 9, rr, 11, len, 2);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(peer_verify(&pe, idx, 11, len, 7, 9), (int64_t)len);
	cr_assert_eq(peer_verify(&pe, idx, 0, 11, 5, 0), 11, "bytes before the WRITE changed");
	cr_assert_eq(peer_verify(&pe, idx, 11 + len, 53, 5, 11 + len), 53);
	struct kvx_xport_counters k;
	cr_assert_eq(peer_counters(&pe, &k), 0);
	cr_assert_eq(k.bytes_served, 2 * len);
	pair_down(&x);
	lfree(true, lm);
}

/* tcp stages each side on its own: a host initiator reads/writes device memory at the target
 * and a device initiator host memory, with the same exact bytes. */
Test(xport_devmem, tcp_host_and_device_sides_mix)
{
	for (int local_dev = 0; local_dev < 2; local_dev++) {
		struct kvx_xport_ctx_params p;
		params(&p, 256 * KIB);
		struct pair x;
		pair_up(&x, "tcp", local_dev ? "host" : "hostdev", &p, &p);
		struct kvx_xport_ep *ep = x.ep;
		const uint64_t len = MIB + 77;
		uint8_t d[KVX_XPORT_RDESC_BYTES];
		int idx = peer_reg(&x.pe, len, KVX_XPORT_ACCESS_ALL, 21, d);
		struct kvx_xport_rmr *rr = NULL;
		cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &rr), 0);
		uint8_t *lm;
		struct kvx_xport_mr *l = local(x.ctx, local_dev, len, &lm);
		cr_assert_eq(run1(ep, KVX_XPORT_OP_READ, l, 0, rr, 0, len, 1).status, 0);
		cr_assert_eq(lcheck(local_dev, lm, len, 21, 0), len, "local %s",
			     local_dev ? "device" : "host");
		lfill(local_dev, lm, len, 22, 0);
		cr_assert_eq(run1(ep, KVX_XPORT_OP_WRITE, l, 0, rr, 0, len, 2).status, 0);
		cr_assert_eq(peer_verify(&x.pe, idx, 0, len, 22, 0), (int64_t)len);
		pair_down(&x);
		lfree(local_dev, lm);
	}
}

/* shm: a host initiator reaches device memory through the mapping; a device initiator against
 * a host region would need CMA on device memory and completes with -ENOTSUP, untouched. */
Test(xport_devmem, shm_host_initiator_reaches_device_region_device_to_host_region_enotsup)
{
	skip_unless_available("shm");
	for (int local_dev = 0; local_dev < 2; local_dev++) {
		struct kvx_xport_ctx_params p;
		params(&p, 0);
		struct pair x;
		pair_up(&x, "shm", local_dev ? "host" : "hostdev", &p, &p);
		struct kvx_xport_ep *ep = x.ep;
		const uint64_t len = 300 * KIB + 5;
		uint8_t d[KVX_XPORT_RDESC_BYTES];
		int idx = peer_reg(&x.pe, len, KVX_XPORT_ACCESS_ALL, 31, d);
		struct kvx_xport_rmr *rr = NULL;
		cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &rr), 0);
		uint8_t *lm;
		struct kvx_xport_mr *l = local(x.ctx, local_dev, len, &lm);
		lfill(local_dev, lm, len, 32, 0);
		struct kvx_xport_cpl c = run1(ep, KVX_XPORT_OP_WRITE, l, 0, rr, 0, len, 1);
		if (local_dev) {
			cr_assert_eq(c.status, -ENOTSUP);
			cr_assert_eq(c.n_failed, 1);
			cr_assert_eq(peer_verify(&x.pe, idx, 0, len, 31, 0), (int64_t)len);
		} else {
			cr_assert_eq(c.status, 0);
			cr_assert_eq(peer_verify(&x.pe, idx, 0, len, 32, 0), (int64_t)len);
			cr_assert_eq(run1(ep, KVX_XPORT_OP_READ, l, 0, rr, 0, len, 2).status, 0);
			cr_assert_eq(lcheck(false, lm, len, 32, 0), len);
		}
		pair_down(&x);
		lfree(local_dev, lm);
	}
}

/* Registration: host memory announced as device memory is refused (it would be staged or
 * mapped as device memory), and so is HIP memory where no HIP device is present. */
Test(xport_devmem, registration_refuses_wrong_kind_and_hip_without_device)
{
	static const char *provs[] = {"tcp", "shm"};
	for (size_t i = 0; i < 2; i++) {
		if (kvx_xport_provider_probe(provs[i], NULL, 0))
			continue;
		struct kvx_xport_ctx *ctx = NULL;
		cr_assert_eq(kvx_xport_open(provs[i], NULL, &ctx), 0);
		struct kvx_xport_caps caps;
		cr_assert_eq(kvx_xport_query_caps(ctx, &caps), 0);
		cr_assert(caps.mem_types & (1u << KVX_XPORT_MEM_HOSTDEV));
		uint8_t *h = aligned_alloc(4096, 8192);
		struct kvx_xport_mr *mr = NULL;
		struct kvx_xport_mr_params p = {.addr = h, .len_bytes = 8192,
						.access = KVX_XPORT_ACCESS_ALL,
						.mem_type = KVX_XPORT_MEM_HOSTDEV};
		cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), -EINVAL, "%s", provs[i]);
		/* Past the end of a device allocation. */
		uint8_t *dv;
		cr_assert_eq(kvx_mem_alloc(hostdev(), 4096, (void **)&dv), 0);
		p.addr = dv;
		p.len_bytes = 4097;
		cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), -ERANGE, "%s", provs[i]);
		p.len_bytes = 4096;
		cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), 0);
		cr_assert_eq(kvx_xport_mr_unregister(mr), 0);
		char why[KVX_MEM_WHY_LEN] = "";
		struct kvx_mem_type hip = {.kind = KVX_MEM_HIP, .device = 0};
		p = (struct kvx_xport_mr_params){.addr = h, .len_bytes = 8192,
						 .access = KVX_XPORT_ACCESS_ALL,
						 .mem_type = KVX_XPORT_MEM_HIP};
		if (kvx_mem_probe(&hip, why, sizeof(why)) != 0) {
			cr_assert_not(caps.mem_types & (1u << KVX_XPORT_MEM_HIP));
			cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), -ENOTSUP);
		}
		kvx_xport_close(ctx);
		kvx_mem_free(hostdev(), dv);
		free(h);
	}
}

/* Mappings of the mock's memfds in this process ("/memfd:kvx-hostdev" lines: two views per
 * allocation, own or peer's). */
static int hostdev_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int n = 0;
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:kvx-hostdev") != NULL;
	fclose(f);
	return n;
}

/* shm opens each peer allocation once per endpoint however many regions of it are imported,
 * and closes it with the endpoint. */
Test(xport_devmem, shm_ipc_mapping_per_peer_allocation_closed_on_endpoint_destroy)
{
	skip_unless_available("shm");
	struct kvx_xport_ctx_params p;
	params(&p, 0);
	int base = hostdev_maps();
	struct pair x;
	pair_up(&x, "shm", "hostdev", &p, &p);
	struct peer pe = x.pe;
	struct kvx_xport_ctx *ctx = x.ctx;
	struct kvx_xport_ep *ep = x.ep;
	uint8_t d1[KVX_XPORT_RDESC_BYTES], d2[KVX_XPORT_RDESC_BYTES];
	cr_assert_geq(peer_reg(&pe, 64 * KIB, KVX_XPORT_ACCESS_ALL, 41, d1), 0);
	cr_assert_geq(peer_reg(&pe, 64 * KIB, KVX_XPORT_ACCESS_ALL, 42, d2), 0);
	struct kvx_xport_rmr *r[3] = {NULL, NULL, NULL};
	cr_assert_eq(kvx_xport_rmr_import(ep, d1, sizeof(d1), &r[0]), 0);
	cr_assert_eq(hostdev_maps(), base + 2);
	cr_assert_eq(kvx_xport_rmr_import(ep, d1, sizeof(d1), &r[1]), 0);
	cr_assert_eq(hostdev_maps(), base + 2, "the same allocation is mapped once");
	cr_assert_eq(kvx_xport_rmr_import(ep, d2, sizeof(d2), &r[2]), 0);
	cr_assert_eq(hostdev_maps(), base + 4);
	/* Both imports of the first allocation work. */
	uint8_t *lm = aligned_alloc(4096, 64 * KIB);
	struct kvx_xport_mr_params lp = {.addr = lm, .len_bytes = 64 * KIB,
					 .access = KVX_XPORT_ACCESS_ALL};
	struct kvx_xport_mr *l = NULL;
	cr_assert_eq(kvx_xport_mr_register(ctx, &lp, &l), 0);
	cr_assert_eq(run1(ep, KVX_XPORT_OP_READ, l, 0, r[1], 100, 1000, 1).status, 0);
	cr_assert_eq(pat_check(lm, 1000, 41, 100), 1000);
	cr_assert_eq(run1(ep, KVX_XPORT_OP_READ, l, 0, r[2], 0, 64 * KIB, 2).status, 0);
	cr_assert_eq(pat_check(lm, 64 * KIB, 42, 0), 64 * KIB);
	kvx_xport_ep_destroy(ep);
	cr_assert_eq(hostdev_maps(), base, "endpoint destroy closed the peer mappings");
	pair_down(&x);
	free(lm);
}
