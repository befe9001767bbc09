/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_LCORE_INTERNAL_H
#define KVX_LCORE_INTERNAL_H
/* Module-private definitions of kvx_lcore (never included from another module; unit tests may). */
#include <pthread.h>
#include <stdatomic.h>

#include "kvxfer/lcore.h"

struct kvx_poller {
	struct kvx_lcore *lc;
	kvx_poller_fn fn; /* NULL when the slot is free */
	void *arg;
	bool active;
	char name[32];
};

struct kvx_lcore {
	struct kvx_lcore_set *set;
	uint32_t id;
	enum kvx_lcore_role role;
	cpu_set_t cpus;
	pthread_t thread;
	bool thread_started;
	_Atomic pid_t tid;

	/* launch handshake (slow path), guarded by mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool has_work;
	bool done;
	bool exit;
	kvx_lcore_fn fn;
	void *fn_arg;
	int ret;
	_Atomic bool running; /* launched and not yet waited for */
	cpu_set_t launcher_cpus; /* CPUs of the thread that launched it (follow_waker may move the
	                            lcore to them): written by kvx_lcore_launch() under mu, read by
	                            the lcore thread after it took the work under mu */
	_Atomic bool stop;

	void *ctx;

	/* pollers: owner thread, or any thread while not running */
	struct kvx_poller pollers[KVX_LCORE_MAX_POLLERS];
	uint8_t order[KVX_LCORE_MAX_POLLERS];
	uint32_t n_order;
	bool need_compact;

	struct kvx_lcore_idle_params idle;
	struct kvx_timer_heap *timers;
	struct kvx_waiter waiter;
	int wait_fd[KVX_LCORE_MAX_WAIT_FDS]; /* kvx_lcore_add_wait_fd(): also wake the sleep */
	uint32_t n_wait_fd;

	/* accounting: single writer (the loop), relaxed load+store; any reader */
	_Atomic uint64_t st_loops;
	_Atomic uint64_t st_busy_loops;
	_Atomic uint64_t st_busy_ns;
	_Atomic uint64_t st_idle_ns;
	_Atomic uint64_t st_sleeps;
	_Atomic uint64_t st_wakeups;
	_Atomic uint64_t st_timers_run;
};

struct kvx_lcore_set {
	struct kvx_lcore_cfg cfg;
	unsigned n;
	struct kvx_lcore *main_lc;
	struct kvx_lcore *control_lc;
	struct kvx_lcore *lcores[]; /* Array[n]: polling lcores ascending, then control */
};

/* follow_waker (kvx_lcore_idle_params): while @p tid > 0, the waker that ends a sleep and runs
 * on a CPU c in bitmask @p cpus narrows thread @p tid's affinity to c (sched_setaffinity(2))
 * before its eventfd write, so the wake-up is local to a running CPU instead of an IPI to an
 * idle one (a halted vCPU on a VM); skipped when c is the consumer's only CPU (@p home = {c}).
 * @p tid = 0 stops following and returns once no waker is inside its affinity call. Consumer
 * thread only. */
void kvx_waiter_follow(struct kvx_waiter *w, int32_t tid, uint64_t cpus, uint64_t home);

/* Consumer: true once per narrowing by a waker (then the consumer widens its affinity back to
 * its own CPUs). Hot path: one relaxed load when false. */
bool kvx_waiter_take_narrowed(struct kvx_waiter *w);

/* Wakes made by the calling thread never narrow the woken consumer (follow_waker): set by the
 * polling lcores' loop, so a poller handing work to another (the layer spread) does not pull it
 * onto its own CPU, which would serialise the two. Application and control threads do narrow. */
void kvx_waiter_thread_never_narrows(bool on);

/* Test hook: move an EMPTY ring's four indices to @p idx (to exercise the 2^32 wrap). */
void kvx_ring_debug_set_index(struct kvx_ring *r, uint32_t idx);

/* Parse a DPDK `--lcores` list into cfg->lcores (grammar only). Exposed for tests. */
int kvx_lcore_parse_lcores(struct kvx_lcore_cfg *cfg, const char *s, char *err, size_t errlen);

#endif /* KVX_LCORE_INTERNAL_H */
