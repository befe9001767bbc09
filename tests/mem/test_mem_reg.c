/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Verbs registration plan (kvx_mem_reg_plan, transport/mem.c): the decision chain dma-buf ->
 * peer memory -> error naming what is missing, the run-time dma-buf probe, and clean failure
 * for device memory on a machine without a GPU.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvxfer/mem.h"
#include "transport/mem_internal.h"

TestSuite(mem_reg, .timeout = 10.0);

Test(mem_reg, decide_host_is_reg_mr)
{
	char why[KVX_MEM_WHY_LEN] = "";

	cr_assert_eq(kvx_mem_reg_decide(KVX_MEM_HOST, false, false, NULL, why, sizeof(why)),
		     KVX_MEM_REG_HOST);
	cr_assert_eq(kvx_mem_reg_decide(KVX_MEM_HOST, true, true, NULL, why, sizeof(why)),
		     KVX_MEM_REG_HOST);
}

Test(mem_reg, decide_prefers_dmabuf_then_peer_memory)
{
	char why[KVX_MEM_WHY_LEN] = "";

	cr_assert_eq(kvx_mem_reg_decide(KVX_MEM_HIP, true, true, NULL, why, sizeof(why)),
		     KVX_MEM_REG_DMABUF);
	cr_assert_eq(kvx_mem_reg_decide(KVX_MEM_HIP, true, false, NULL, why, sizeof(why)),
		     KVX_MEM_REG_DMABUF);
	cr_assert_eq(kvx_mem_reg_decide(KVX_MEM_HIP, false, true, NULL, why, sizeof(why)),
		     KVX_MEM_REG_PEERMEM);
}

Test(mem_reg, decide_without_either_names_both_missing_pieces)
{
	char why[KVX_MEM_WHY_LEN] = "";

	cr_assert_eq(kvx_mem_reg_decide(KVX_MEM_HIP, false, false,
					"hsa_amd_portable_export_dmabuf not available in this ROCm",
					why, sizeof(why)),
		     -ENOTSUP);
	cr_assert(strstr(why, "hsa_amd_portable_export_dmabuf not available in this ROCm"), "%s",
		  why);
	cr_assert(strstr(why, "peer-memory"), "%s", why);
	cr_assert(strstr(why, KVX_MEM_PEER_MEMORY_DIR), "%s", why);
	cr_assert_eq(kvx_mem_reg_decide((enum kvx_mem_kind)5, true, true, NULL, why, sizeof(why)),
		     -EINVAL);
}

Test(mem_reg, dmabuf_probe_agrees_with_the_installed_rocm)
{
	char why[KVX_MEM_WHY_LEN] = "";
	void *h = dlopen("libhsa-runtime64.so.1", RTLD_NOW | RTLD_LOCAL);
	bool have = h && dlsym(h, "hsa_amd_portable_export_dmabuf") != NULL;

	cr_assert_eq(kvx_mem_dmabuf_available(why, sizeof(why)), have);
	if (!have && h)
		cr_assert(strstr(why, "hsa_amd_portable_export_dmabuf not available in this ROCm"),
			  "%s", why);
	if (!h)
		cr_assert(strstr(why, "libhsa-runtime64.so.1 not loadable"), "%s", why);
	if (h)
		dlclose(h);
}

Test(mem_reg, peer_memory_probe_reads_directory_entries)
{
	char dir[] = "/tmp/kvx-mem-peers-XXXXXX";
	char sub[64];

	cr_assert_not_null(mkdtemp(dir));
	cr_assert_not(kvx_mem_peer_memory_present(dir), "empty directory");
	snprintf(sub, sizeof(sub), "%s/amdkfd", dir);
	cr_assert_eq(mkdir(sub, 0700), 0);
	cr_assert(kvx_mem_peer_memory_present(dir));
	cr_assert_eq(rmdir(sub), 0);
	cr_assert_eq(rmdir(dir), 0);
	cr_assert_not(kvx_mem_peer_memory_present(dir), "missing directory");
}

Test(mem_reg, host_plan_is_reg_mr_without_fd)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOST};
	struct kvx_mem_reg_plan plan;
	struct kvx_mem *m;
	char buf[64] = {0};

	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	cr_assert_eq(kvx_mem_reg_plan(m, buf, sizeof(buf), &plan, NULL, 0), 0);
	cr_assert_eq(plan.method, KVX_MEM_REG_HOST);
	cr_assert_eq(plan.dmabuf_fd, -1);
	kvx_mem_reg_plan_fini(&plan);
	cr_assert_eq(plan.dmabuf_fd, -1);
	cr_assert_eq(kvx_mem_reg_plan(m, buf, 0, &plan, NULL, 0), -EINVAL);
	kvx_mem_close(m);
}

/* Registering device memory where there is no GPU fails at the context, with the reason. */
Test(mem_reg, device_registration_without_gpu_fails_cleanly)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	struct kvx_mem *m = NULL;
	char why[KVX_MEM_WHY_LEN] = "";

	if (kvx_mem_probe(&t, why, sizeof(why)) == 0)
		cr_skip_test("a HIP device is present: see test_mem_hip");
	cr_assert_eq(kvx_mem_open(&t, &m), kvx_mem_has_hip() ? -ENODEV : -ENOTSUP);
	cr_assert_null(m);
}

Test(mem_reg, plan_by_type_host_and_hip_without_gpu)
{
	struct kvx_mem_type host = {.kind = KVX_MEM_HOST}, hip = {.kind = KVX_MEM_HIP};
	struct kvx_mem_reg_plan plan;
	char why[KVX_MEM_WHY_LEN] = "";
	char buf[128] = {0};

	cr_assert_eq(kvx_mem_reg_plan_by_type(&host, buf, sizeof(buf), &plan, why, sizeof(why)), 0);
	cr_assert_eq(plan.method, KVX_MEM_REG_HOST);
	cr_assert_eq(plan.dmabuf_fd, -1);
	cr_assert_eq(kvx_mem_reg_plan_by_type(&host, NULL, 1, &plan, why, sizeof(why)), -EINVAL);
	if (kvx_mem_probe(&hip, NULL, 0) == 0)
		cr_skip_test("a HIP device is present: see test_mem_hip");
	if (!kvx_mem_has_hip()) {
		cr_assert_eq(kvx_mem_reg_plan_by_type(&hip, buf, 1, &plan, why, sizeof(why)),
			     -ENOTSUP);
		return;
	}
	/* The "device pointer" is never touched: the missing GPU is found first. */
	cr_assert_eq(kvx_mem_reg_plan_by_type(&hip, buf, sizeof(buf), &plan, why, sizeof(why)),
		     -ENODEV);
	cr_assert(strncmp(why, "no HIP device", 13) == 0, "why: %s", why);
}
