/* SPDX-License-Identifier: Apache-2.0 */
/* How a started engine schedules its polling lcores: the scheduler slice each adaptive poller
 * asks for (kvx_engine_params.poller_slice_us), read back from the kernel for every
 * "kvx-lcore-N" thread of this process. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "kvxfer/lcore.h"

TestSuite(runtime_sched, .timeout = 60.0);

#define NB 16

/* sched_runtime of thread @p tid from sched_getattr(2), ns: Linux >= 6.12 reports the slice of
 * a SCHED_OTHER thread there (older kernels 0). */
static uint64_t slice_ns_of(pid_t tid)
{
	struct {
		uint32_t size, policy;
		uint64_t flags;
		int32_t nice;
		uint32_t priority;
		uint64_t runtime, deadline, period;
	} a;
	memset(&a, 0, sizeof(a));
	if (syscall(SYS_sched_getattr, tid, &a, sizeof(a), 0))
		return 0;
	return a.runtime;
}

/* How many of this process's polling lcore threads ("kvx-lcore-N") there are, in *n, and how
 * many of them run with a slice of @p want_ns. */
static unsigned pollers_with_slice(uint64_t want_ns, unsigned *n)
{
	DIR *d = opendir("/proc/self/task");
	cr_assert_not_null(d);
	unsigned ok = 0;
	*n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char path[300], comm[32] = "";
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue; /* the thread exited */
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = 0;
		fclose(f);
		if (strncmp(comm, "kvx-lcore-", 10))
			continue;
		(*n)++;
		ok += slice_ns_of((pid_t)atoi(de->d_name)) == want_ns;
	}
	closedir(d);
	return ok;
}

/* A started tcp consumer with two polling lcores and the given poller_slice_us. */
static struct kvx_engine *start(uint32_t slice_us, uint8_t *mem)
{
	struct kvx_engine_params p;
	kvx_engine_params_init(&p);
	p.transport = "tcp";
	p.handshake_port = 0;
	p.notify_port = 0;
	p.max_transfers = 8;
	p.max_blocks = NB;
	p.lcores = "0@(0,1),1@(0,1)";
	p.poller_slice_us = slice_us;
	char err[256] = "";
	struct kvx_engine *e = NULL;
	cr_assert_eq(kvx_engine_create(&p, &e, err, sizeof(err)), 0, "%s", err);
	struct kvx_engine_layer l = {.name = "l0", .base = mem,
				     .tensor = {.ndim = 3, .shape = {NB, 4, 16}, .stride = {64, 16, 1}, .elem_size = 2},
				     .spec = {.block_size = 4, .is_mla = true}};
	cr_assert_eq(kvx_engine_register_layer(e, &l), 0);
	cr_assert_eq(kvx_engine_start(e), 0);
	return e;
}

static void expect_pollers_slice(uint32_t slice_us)
{
	if (slice_ns_of(0) == 0)
		cr_skip_test("this kernel reports no per-thread slice (Linux < 6.12 ignores poller_slice_us)");
	static uint8_t mem[NB * 4 * 16 * 2];
	struct kvx_engine *e = start(slice_us, mem);
	unsigned n = 0, ok = 0;
	/* Each poller asks for its slice when its poll loop starts, right after the launch. */
	uint64_t dl = (uint64_t)time(NULL) + 20;
	while ((ok = pollers_with_slice((uint64_t)slice_us * 1000u, &n)) < 2 && (uint64_t)time(NULL) < dl) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	cr_assert_eq(n, 2, "two polling lcore threads, found %u", n);
	cr_assert_eq(ok, 2, "pollers with a %u us slice: %u of 2", slice_us, ok);
	kvx_engine_destroy(e);
}

Test(runtime_sched, adaptive_pollers_ask_for_a_100_us_slice_by_default)
{
	struct kvx_engine_params p;
	kvx_engine_params_init(&p);
	cr_assert_eq(p.poller_slice_us, 100u);
	expect_pollers_slice(p.poller_slice_us);
}

Test(runtime_sched, pollers_take_the_slice_given_in_the_params)
{
	expect_pollers_slice(2000);
}
