/* SPDX-License-Identifier: Apache-2.0 */
/* Registry, selection, parameter checks and the region-descriptor encoding (transport.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/transport.h"

TestSuite(transport_registry, .timeout = 30);

Test(transport_registry, list_names_tcp_and_shm_first)
{
	const char *names[4] = {0};
	size_t n = kvx_xport_provider_list(names, 4);
	cr_assert_geq(n, 2);
	cr_assert_leq(n, 3);
	cr_assert_str_eq(names[0], "tcp");
	cr_assert_str_eq(names[1], "shm");
	if (n == 3)
		cr_assert_str_eq(names[2], "verbs");
	cr_assert_eq(kvx_xport_provider_list(NULL, 0), n);
}

Test(transport_registry, probe_unknown_is_enoent_with_reason)
{
	char reason[KVX_XPORT_REASON_MAX];
	cr_assert_eq(kvx_xport_provider_probe("carrier-pigeon", reason, sizeof(reason)), -ENOENT);
	cr_assert_not_null(strstr(reason, "carrier-pigeon"));
	cr_assert_eq(kvx_xport_provider_probe("tcp", reason, sizeof(reason)), 0);
	cr_assert_str_eq(reason, "");
}

Test(transport_registry, probe_verbs_gives_reason_when_unavailable)
{
	char reason[KVX_XPORT_REASON_MAX];
	int rc = kvx_xport_provider_probe("verbs", reason, sizeof(reason));
	if (rc == 0)
		cr_skip_test("an RDMA device is present: nothing to check here");
	cr_assert(rc == -ENOTSUP || rc == -ENODEV, "rc %d", rc);
	cr_assert_gt(strlen(reason), 5, "empty reason");
	struct kvx_xport_ctx *ctx = NULL;
	cr_assert_eq(kvx_xport_open("verbs", NULL, &ctx), rc);
	cr_assert_null(ctx);
}

Test(transport_registry, select_auto_rule)
{
	const char *out = NULL;
	bool verbs = kvx_xport_provider_probe("verbs", NULL, 0) == 0;
	bool shm = kvx_xport_provider_probe("shm", NULL, 0) == 0;
	cr_assert_eq(kvx_xport_select("auto", false, &out), 0);
	cr_assert_str_eq(out, verbs ? "verbs" : "tcp");
	cr_assert_eq(kvx_xport_select("auto", true, &out), 0);
	cr_assert_str_eq(out, verbs ? "verbs" : shm ? "shm" : "tcp");
	cr_assert_eq(kvx_xport_select("tcp", true, &out), 0);
	cr_assert_str_eq(out, "tcp");
	cr_assert_eq(kvx_xport_select("nope", true, &out), -ENOENT);
}

Test(transport_registry, open_rejects_out_of_range_params)
{
	struct kvx_xport_ctx_params p;
	struct kvx_xport_ctx *ctx = NULL;
	kvx_xport_ctx_params_init(&p);
	cr_assert_eq(p.gid_index, -1);
	p.num_channels = 65;
	cr_assert_eq(kvx_xport_open("tcp", &p, &ctx), -EINVAL);
	kvx_xport_ctx_params_init(&p);
	p.chunk_bytes = 100;
	cr_assert_eq(kvx_xport_open("tcp", &p, &ctx), -EINVAL);
	kvx_xport_ctx_params_init(&p);
	p.queue_depth = 70000;
	cr_assert_eq(kvx_xport_open("shm", &p, &ctx), -EINVAL);
	kvx_xport_ctx_params_init(&p);
	p.tcp_addr = "not-an-address";
	cr_assert_eq(kvx_xport_open("tcp", &p, &ctx), -EINVAL);
	cr_assert_null(ctx);
	cr_assert_eq(kvx_xport_open("nope", NULL, &ctx), -ENOENT);
}

Test(transport_registry, caps_defaults_per_provider)
{
	struct kvx_xport_ctx_params p;
	kvx_xport_ctx_params_init(&p);
	p.num_channels = 4;
	p.queue_depth = 1000; /* rounded up to 1024 */
	struct kvx_xport_ctx *ctx = NULL;
	cr_assert_eq(kvx_xport_open("tcp", &p, &ctx), 0);
	struct kvx_xport_caps c;
	cr_assert_eq(kvx_xport_query_caps(ctx, &c), 0);
	cr_assert_eq(c.num_channels, 4);
	cr_assert_eq(c.max_channels, 64);
	cr_assert_eq(c.max_batch, 1024);
	cr_assert(c.needs_progress);
	cr_assert_not(c.same_host_only);
	/* host and the hostdev mock always; HIP only with a HIP device (none on CI). */
	cr_assert_eq(c.mem_types & ((1u << KVX_XPORT_MEM_HOST) | (1u << KVX_XPORT_MEM_HOSTDEV)),
		     (1u << KVX_XPORT_MEM_HOST) | (1u << KVX_XPORT_MEM_HOSTDEV));
	cr_assert_eq(kvx_xport_progress(ctx), 0);
	kvx_xport_close(ctx);
	if (kvx_xport_provider_probe("shm", NULL, 0))
		return;
	cr_assert_eq(kvx_xport_open("shm", NULL, &ctx), 0);
	cr_assert_eq(kvx_xport_query_caps(ctx, &c), 0);
	cr_assert_eq(c.num_channels, 1);
	cr_assert_eq(c.max_batch, 4096);
	cr_assert(c.same_host_only);
	cr_assert_not(c.needs_progress);
	cr_assert_eq(kvx_xport_progress(ctx), 0);
	kvx_xport_close(ctx);
}

Test(transport_registry, descriptor_encoding_exact_bytes)
{
	struct kvx_xport_ctx *ctx = NULL;
	cr_assert_eq(kvx_xport_open("tcp", NULL, &ctx), 0);
	static uint8_t mem[4096];
	struct kvx_xport_mr_params p = {.addr = mem + 16, .len_bytes = 1000,
					.access = KVX_XPORT_ACCESS_REMOTE_READ |
						  KVX_XPORT_ACCESS_REMOTE_WRITE};
	struct kvx_xport_mr *mr = NULL;
	cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), 0);
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	size_t n = 0;
	cr_assert_eq(kvx_xport_mr_export(mr, d, sizeof(d), &n), 0);
	cr_assert_eq(n, 40);
	uint64_t addr = (uint64_t)(uintptr_t)(mem + 16);
	uint32_t key = kvx_xport_mr_key(mr);
	uint8_t want[40] = {'K', 'X', 'R', 'D', 1, 1 /* tcp */, 0, 0, 6, 0, 0, 0};
	for (int i = 0; i < 4; i++)
		want[12 + i] = (uint8_t)(key >> (8 * i));
	for (int i = 0; i < 8; i++)
		want[16 + i] = (uint8_t)(addr >> (8 * i));
	want[24] = 1000 & 0xff;
	want[25] = 1000 >> 8;
	cr_assert_arr_eq(d, want, 40);
	/* A second region gets another key; a freed slot comes back with a new key. */
	struct kvx_xport_mr *mr2 = NULL;
	cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr2), 0);
	cr_assert_neq(kvx_xport_mr_key(mr2), key);
	cr_assert_eq(kvx_xport_mr_unregister(mr), 0);
	cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr), 0);
	cr_assert_neq(kvx_xport_mr_key(mr), key);
	cr_assert_eq(kvx_xport_mr_key(mr) & 0xffff, key & 0xffff);
	kvx_xport_close(ctx);
}

Test(transport_registry, region_table_full_is_enobufs)
{
	struct kvx_xport_ctx_params p;
	kvx_xport_ctx_params_init(&p);
	p.max_regions = 2;
	struct kvx_xport_ctx *ctx = NULL;
	cr_assert_eq(kvx_xport_open("tcp", &p, &ctx), 0);
	static uint8_t mem[64];
	struct kvx_xport_mr_params rp = {.addr = mem, .len_bytes = 64, .access = 7};
	struct kvx_xport_mr *a, *b, *c;
	cr_assert_eq(kvx_xport_mr_register(ctx, &rp, &a), 0);
	cr_assert_eq(kvx_xport_mr_register(ctx, &rp, &b), 0);
	cr_assert_eq(kvx_xport_mr_register(ctx, &rp, &c), -ENOBUFS);
	kvx_xport_close(ctx); /* frees the registered regions */
}

/* docs/style.md §8: provider ops tables have no NULL slots. */
#include "transport/transport_internal.h"

extern const struct kvx_xport_ops kvx_xport_verbs_ops __attribute__((weak));

static void check_ops(const struct kvx_xport_ops *o)
{
	cr_assert_not_null(o->name);
	const void *slots[] = {
		(const void *)o->probe,       (const void *)o->open,        (const void *)o->close,
		(const void *)o->mr_register, (const void *)o->mr_unregister,
		(const void *)o->rmr_check,   (const void *)o->ep_create,   (const void *)o->ep_accept,
		(const void *)o->ep_connect,  (const void *)o->ep_destroy,  (const void *)o->post,
		(const void *)o->poll,        (const void *)o->progress,    (const void *)o->ctx_wait_fd,
		(const void *)o->ctx_wait,    (const void *)o->ep_wait,     (const void *)o->ep_reset,
		(const void *)o->ep_reaccept,
	};
	for (size_t i = 0; i < KVX_ARRAY_SIZE(slots); i++)
		cr_assert_not_null(slots[i], "%s: ops slot %zu is NULL", o->name, i);
}

Test(transport_registry, ops_tables_have_no_null_slots)
{
	check_ops(&kvx_xport_tcp_ops);
	check_ops(&kvx_xport_shm_ops);
	if (&kvx_xport_verbs_ops)
		check_ops(&kvx_xport_verbs_ops);
}

/* Endpoint recovery goes through the ops table: tcp and shm have none and answer -ENOTSUP on
 * both sides (the wrong side is refused before the provider is asked), leaving the endpoints
 * as they were. Both sides live in this process. */
static void recovery_enotsup(const char *provider)
{
	struct kvx_xport_ctx *tgt = NULL, *ini = NULL;
	cr_assert_eq(kvx_xport_open(provider, NULL, &tgt), 0);
	cr_assert_eq(kvx_xport_open(provider, NULL, &ini), 0);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], c[KVX_XPORT_BLOB_MAX];
	size_t al = 0, bl = 0, cl = 0;
	struct kvx_xport_ep *iep = NULL, *tep = NULL;
	cr_assert_eq(kvx_xport_ep_create(ini, &iep, a, sizeof(a), &al), 0);
	cr_assert_eq(kvx_xport_ep_accept(tgt, a, al, &tep, b, sizeof(b), &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(iep, b, bl), 0);
	cr_assert_eq(kvx_xport_ep_reset(iep, c, sizeof(c), &cl), -ENOTSUP, "%s", provider);
	cr_assert_eq(kvx_xport_ep_reaccept(tep, a, al, c, sizeof(c), &cl), -ENOTSUP, "%s", provider);
	cr_assert_eq(kvx_xport_ep_reset(tep, c, sizeof(c), &cl), -ENOTSUP);
	cr_assert_eq(kvx_xport_ep_reaccept(iep, a, al, c, sizeof(c), &cl), -ENOTSUP);
	cr_assert_eq(kvx_xport_ep_reset(NULL, c, sizeof(c), &cl), -EINVAL);
	cr_assert_eq(kvx_xport_ep_reaccept(tep, NULL, al, c, sizeof(c), &cl), -EINVAL);
	cr_assert_eq(cl, 0);
	cr_assert_eq(kvx_xport_ep_status(iep), 0);
	cr_assert_eq(kvx_xport_ep_connect(iep, b, bl), -EISCONN);
	kvx_xport_ep_destroy(iep);
	kvx_xport_ep_destroy(tep);
	kvx_xport_close(ini);
	kvx_xport_close(tgt);
}

Test(transport_registry, tcp_and_shm_endpoint_recovery_is_enotsup)
{
	recovery_enotsup("tcp");
	recovery_enotsup("shm");
}

/* Region keys are random per registration (issue 17): with the old generation counter every
 * fresh slot got generation 1 (key 0x1xxxx), so a peer could guess the keys of a new
 * incarnation. 8 fresh slots all drawing generation 1 at random: p = 2^-128. */
static void keys_not_sequential(const char *provider)
{
	struct kvx_xport_ctx *ctx = NULL;
	cr_assert_eq(kvx_xport_open(provider, NULL, &ctx), 0);
	static uint8_t mem[8][4096];
	struct kvx_xport_mr *mr[8];
	int gen1 = 0;
	for (int i = 0; i < 8; i++) {
		struct kvx_xport_mr_params p = {.addr = mem[i], .len_bytes = sizeof(mem[i]),
						.access = KVX_XPORT_ACCESS_REMOTE_READ};
		cr_assert_eq(kvx_xport_mr_register(ctx, &p, &mr[i]), 0);
		uint32_t k = kvx_xport_mr_key(mr[i]);
		cr_assert_neq(k >> 16, 0, "%s: generation never 0", provider);
		gen1 += (k >> 16) == 1;
	}
	cr_assert_lt(gen1, 8, "%s: keys follow a counter", provider);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(kvx_xport_mr_unregister(mr[i]), 0);
	kvx_xport_close(ctx);
}

Test(transport_registry, tcp_and_shm_region_keys_are_random)
{
	keys_not_sequential("tcp");
	keys_not_sequential("shm");
}
