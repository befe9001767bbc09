/* SPDX-License-Identifier: Apache-2.0 */
/* Lcore threads (affinity, launch/wait/stop), poll loop accounting, idle policies. */
#ifdef KVX_TSAN_RUNNER
#include "tsan_runner.h" /* Criterion cannot start under TSan: see that header */
#else
#include <criterion/criterion.h>
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/lcore.h"

TestSuite(lcore, .timeout = 60.0);

static char g_err[KVX_LCORE_ERRLEN];

/* One no-lost-wake-up round's deadline: only a lost wake-up (no sleep cap) can exceed it. */
#define ET_ROUND_NS 10000000000ull

/* Poll a condition with a bounded deadline (not a sleep used as synchronisation). */
#define WAIT_UNTIL(cond, timeout_ms)                                                             \
	({                                                                                       \
		uint64_t dl_ = kvx_now_ns() + (uint64_t)(timeout_ms) * 1000000ull;               \
		bool ok_ = false;                                                                \
		while (!(ok_ = (cond)) && kvx_now_ns() < dl_) {                                  \
			struct timespec ts_ = {0, 200000};                                       \
			nanosleep(&ts_, NULL);                                                   \
		}                                                                                \
		ok_;                                                                             \
	})

static struct kvx_lcore_set *make_set(unsigned n, unsigned flags, enum kvx_lcore_idle idle)
{
	struct kvx_lcore_cfg *c = malloc(sizeof(*c));
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_cfg_default(c, n, flags, g_err, sizeof(g_err)), 0, "%s", g_err);
	if (!c->share_cpus) /* a sharing default keeps the adaptive policy */
		c->idle = idle;
	cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "%s", g_err);
	struct kvx_lcore_set *set = NULL;
	int rc = kvx_lcore_set_create(c, &set);
	cr_assert_eq(rc, 0, "set_create: %s", kvx_strerror(rc));
	free(c);
	return set;
}

struct where {
	struct kvx_lcore *self;
	uint32_t self_id;
	void *ctx;
	cpu_set_t affinity;
	int cpu;
};

static int report_where(void *arg)
{
	struct where *w = arg;
	w->self = kvx_lcore_self();
	w->self_id = kvx_lcore_self_id();
	w->ctx = kvx_lcore_ctx(w->self);
	CPU_ZERO(&w->affinity);
	sched_getaffinity(0, sizeof(w->affinity), &w->affinity);
	w->cpu = sched_getcpu();
	return 7;
}

Test(lcore, threads_are_pinned_to_their_cpus)
{
	struct kvx_lcore_set *set = make_set(2, 0, KVX_LCORE_IDLE_ADAPTIVE);
	unsigned n = kvx_lcore_set_count(set);
	cr_assert_geq(n, 2);
	cr_assert_null(kvx_lcore_self(), "the test thread is not an lcore");
	cr_assert_eq(kvx_lcore_self_id(), KVX_LCORE_ID_ANY);
	struct where w[8] = {0};
	int marker[8];
	for (unsigned i = 0; i < n; i++) {
		struct kvx_lcore *lc = kvx_lcore_set_at(set, i);
		kvx_lcore_set_ctx(lc, &marker[i]);
		cr_assert_eq(kvx_lcore_launch(lc, report_where, &w[i]), 0);
	}
	for (unsigned i = 0; i < n; i++) {
		struct kvx_lcore *lc = kvx_lcore_set_at(set, i);
		cr_assert_eq(kvx_lcore_wait(lc), 7, "wait returns the function's value");
		cpu_set_t want, have;
		kvx_lcore_cpus(lc, &want);
		cr_assert_eq(kvx_lcore_get_affinity(lc, &have), 0);
		cr_assert(CPU_EQUAL(&want, &have), "lcore %u: pthread affinity differs", kvx_lcore_id(lc));
		cr_assert(CPU_EQUAL(&want, &w[i].affinity), "lcore %u: affinity seen by the thread differs",
			  kvx_lcore_id(lc));
		cr_assert(CPU_ISSET(w[i].cpu, &want), "lcore %u ran on CPU %d", kvx_lcore_id(lc), w[i].cpu);
		cr_assert_eq(w[i].self, lc, "kvx_lcore_self() on the thread");
		cr_assert_eq(w[i].self_id, kvx_lcore_id(lc));
		cr_assert_eq(w[i].ctx, &marker[i], "per-lcore state reachable from the thread");
		cr_assert_gt(kvx_lcore_tid(lc), 0);
		cr_assert_eq(kvx_lcore_get_set(lc), set);
		cr_assert_eq(kvx_lcore_set_get(set, kvx_lcore_id(lc)), lc);
	}
	cr_assert_null(kvx_lcore_set_at(set, n));
	cr_assert_null(kvx_lcore_set_get(set, 1000));
	kvx_lcore_set_destroy(set);
}

Test(lcore, set_with_control_lcore_has_a_control_role)
{
	struct kvx_lcore_set *set = make_set(1, 0, KVX_LCORE_IDLE_ADAPTIVE);
	cr_assert_eq(kvx_lcore_set_count(set), 2);
	struct kvx_lcore *ctl = kvx_lcore_set_control(set);
	cr_assert_not_null(ctl);
	cr_assert_eq(kvx_lcore_role(ctl), KVX_LCORE_ROLE_CONTROL);
	struct kvx_lcore *m = kvx_lcore_set_main(set);
	cr_assert_eq(kvx_lcore_role(m), KVX_LCORE_ROLE_POLL);
	cr_assert_eq(kvx_lcore_set_at(set, 1), ctl, "control lcore comes last");
	kvx_lcore_set_destroy(set);
}

struct gate {
	_Atomic int open;
	_Atomic int entered;
};

static int wait_gate(void *arg)
{
	struct gate *g = arg;
	atomic_store(&g->entered, 1);
	uint64_t dl = kvx_now_ns() + 20000000000ull; /* bounded: 20 s */
	while (!atomic_load(&g->open) && kvx_now_ns() < dl) {
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
	return atomic_load(&g->open) ? 42 : -ETIMEDOUT;
}

static int ret_minus(void *arg)
{
	(void)arg;
	return -5;
}

Test(lcore, launch_on_busy_lcore_returns_ebusy)
{
	struct kvx_lcore_set *set = make_set(2, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	cr_assert_eq(kvx_lcore_wait(lc), 0, "never launched: 0");
	cr_assert_not(kvx_lcore_is_running(lc));
	struct gate g = {0};
	cr_assert_eq(kvx_lcore_launch(lc, wait_gate, &g), 0);
	cr_assert(kvx_lcore_is_running(lc));
	cr_assert_eq(kvx_lcore_launch(lc, ret_minus, NULL), -EBUSY);
	cr_assert_eq(kvx_lcore_set_launch_all(set, KVX_LCORE_ROLE_POLL, ret_minus, NULL), -EBUSY);
	cr_assert_not(kvx_lcore_is_running(kvx_lcore_set_at(set, 1)), "launch_all launched nothing");
	cr_assert(WAIT_UNTIL(atomic_load(&g.entered), 10000));
	atomic_store(&g.open, 1);
	cr_assert_eq(kvx_lcore_wait(lc), 42);
	cr_assert_eq(kvx_lcore_wait(lc), 42, "last value is kept");
	cr_assert_not(kvx_lcore_is_running(lc));
	cr_assert_eq(kvx_lcore_launch(lc, NULL, NULL), -EINVAL);
	cr_assert_eq(kvx_lcore_set_launch_all(set, KVX_LCORE_ROLE_POLL, ret_minus, NULL), 0);
	kvx_lcore_set_wait_all(set);
	cr_assert_eq(kvx_lcore_wait(kvx_lcore_set_at(set, 0)), -5);
	cr_assert_eq(kvx_lcore_wait(kvx_lcore_set_at(set, 1)), -5);
	kvx_lcore_set_destroy(set);
}

static int noop_poller(void *arg)
{
	(void)arg;
	return KVX_POLL_IDLE;
}

Test(lcore, poller_registration_rules)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct kvx_poller *p[KVX_LCORE_MAX_POLLERS];
	cr_assert_eq(kvx_poller_register(lc, NULL, NULL, "x", NULL), -EINVAL);
	for (unsigned i = 0; i < KVX_LCORE_MAX_POLLERS; i++)
		cr_assert_eq(kvx_poller_register(lc, noop_poller, NULL, "noop", &p[i]), 0);
	cr_assert_eq(kvx_poller_register(lc, noop_poller, NULL, "one too many", NULL), -ENOBUFS);
	cr_assert_eq(kvx_poller_unregister(p[3]), 0);
	cr_assert_eq(kvx_poller_unregister(p[3]), -ENOENT);
	cr_assert_eq(kvx_lcore_poll_once(lc), KVX_POLL_IDLE); /* compacts the unregistered slot */
	cr_assert_eq(kvx_poller_register(lc, noop_poller, NULL, "reuse", NULL), 0);
	struct gate g = {0};
	cr_assert_eq(kvx_lcore_launch(lc, wait_gate, &g), 0);
	cr_assert_eq(kvx_poller_register(lc, noop_poller, NULL, "x", NULL), -EBUSY,
		     "another thread while running");
	cr_assert_eq(kvx_poller_unregister(p[0]), -EBUSY);
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_BUSY};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), -EBUSY);
	atomic_store(&g.open, 1);
	cr_assert_eq(kvx_lcore_wait(lc), 42);
	ip.policy = 9;
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), -EINVAL);
	kvx_lcore_set_destroy(set);
}

struct counting {
	_Atomic uint64_t calls;
	uint64_t busy_first;
	struct kvx_lcore *lc;
	_Atomic int registered_child;
};

static int counting_poller(void *arg)
{
	struct counting *c = arg;
	uint64_t n = atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
	return n < c->busy_first ? KVX_POLL_BUSY : KVX_POLL_IDLE;
}

Test(lcore, poll_loop_accounts_busy_and_idle)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct counting c = {.busy_first = 5000};
	cr_assert_eq(kvx_poller_register(lc, counting_poller, &c, "count", NULL), 0);
	/* Busy policy: one poller call per iteration, so busy_loops is exact. */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_BUSY};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	struct kvx_lcore_stats st;
	/* Readable from this thread while the loop runs. */
	cr_assert(WAIT_UNTIL((kvx_lcore_stats_get(lc, &st), st.loops > 20000), 20000),
		  "loop made progress: %lu", (unsigned long)st.loops);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.busy_loops, 5000);
	cr_assert_eq(st.loops, atomic_load(&c.calls));
	cr_assert_gt(st.busy_ns, 0);
	cr_assert_gt(st.idle_ns, 0);
	cr_assert_eq(st.sleeps, 0, "busy policy never sleeps");
	double want = 100.0 * (double)st.busy_ns / (double)(st.busy_ns + st.idle_ns);
	cr_assert_float_eq(st.util_pct, want, 1e-9);
	cr_assert_gt(st.util_pct, 0.0);
	cr_assert_lt(st.util_pct, 100.0);
	kvx_lcore_set_destroy(set);
}

static int registering_poller(void *arg)
{
	struct counting *c = arg;
	if (!atomic_load(&c->registered_child)) {
		int rc = kvx_poller_register(c->lc, counting_poller, c, "child", NULL);
		atomic_store(&c->registered_child, rc == 0 ? 1 : rc);
	}
	return KVX_POLL_IDLE;
}

Test(lcore, poller_registers_from_its_own_lcore_while_running)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct counting c = {.busy_first = 0, .lc = lc};
	cr_assert_eq(kvx_poller_register(lc, registering_poller, &c, "reg", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert(WAIT_UNTIL(atomic_load(&c.calls) > 0, 10000), "child poller runs");
	cr_assert_eq(atomic_load(&c.registered_child), 1);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
}

/* ---- adaptive idle -------------------------------------------------------------------------- */

struct ring_poller {
	struct kvx_ring *r;
	_Atomic uint64_t got;
	_Atomic uint64_t last;
};

static int ring_poll(void *arg)
{
	struct ring_poller *rp = arg;
	void *objs[32];
	unsigned n = kvx_ring_dequeue_burst_sc(rp->r, objs, 32, NULL);
	if (!n)
		return KVX_POLL_IDLE;
	atomic_store(&rp->last, (uint64_t)(uintptr_t)objs[n - 1]);
	atomic_fetch_add(&rp->got, n);
	return KVX_POLL_BUSY;
}

static struct kvx_ring *ring_for(struct kvx_lcore *lc)
{
	struct kvx_ring_params p = {.name = "inbox", .count = 64};
	struct kvx_ring *r;
	cr_assert_eq(kvx_ring_create(&p, &r), 0);
	kvx_ring_set_waiter(r, kvx_lcore_waiter(lc));
	return r;
}

Test(lcore, adaptive_sleeper_is_woken_by_ring_producer)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct ring_poller rp = {.r = ring_for(lc)};
	/* Sleeps of 60 s: only a wake can deliver within the deadlines below. */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .max_sleep_ns = 60000000000ull};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_poller_register(lc, ring_poll, &rp, "inbox", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	struct kvx_lcore_stats st;
	for (uintptr_t round = 1; round <= 5; round++) {
		uint64_t sleeps0 = (kvx_lcore_stats_get(lc, &st), st.sleeps);
		/* wait until it sleeps (the sleep counter is bumped on wake, so watch the flag) */
		cr_assert(WAIT_UNTIL(atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1, 20000),
			  "round %lu: lcore never went to sleep", (unsigned long)round);
		cr_assert_eq(kvx_ring_enqueue_sp(rp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&rp.got) == round, 10000), "round %lu: not woken",
			  (unsigned long)round);
		cr_assert_eq(atomic_load(&rp.last), round);
		cr_assert(WAIT_UNTIL((kvx_lcore_stats_get(lc, &st), st.sleeps > sleeps0), 10000));
	}
	kvx_lcore_stats_get(lc, &st);
	cr_assert_geq(st.wakeups, 1, "woken through the eventfd");
	cr_assert_geq(kvx_waiter_wake_count(kvx_lcore_waiter(lc)), 1);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0, "stop wakes a sleeping loop");
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(rp.r);
}

/* A ring poller that also counts its calls (one per poll of the loop). */
struct counting_poller {
	struct ring_poller rp;
	_Atomic uint64_t calls;
};

static int counting_poll(void *arg)
{
	struct counting_poller *cp = arg;
	atomic_fetch_add(&cp->calls, 1);
	return ring_poll(&cp->rp);
}

static uint64_t lcore_sleeps(struct kvx_lcore *lc)
{
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	return st.sleeps;
}

Test(lcore, adaptive_timed_out_sleep_sleeps_again_after_one_poll)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct counting_poller cp = {.rp = {.r = ring_for(lc)}};
	/* 1 ms sleeps that always time out (nothing is enqueued): after each one the loop polls
	 * once, finds nothing, re-checks under the waiter protocol and sleeps again, without the
	 * 100 spins and 10 yields it does before its first sleep. */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 100, .backoff_polls = 10,
					   .max_sleep_ns = 1000000ull};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_poller_register(lc, counting_poll, &cp, "inbox", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert(WAIT_UNTIL(lcore_sleeps(lc) >= 3, 20000), "never slept three times");
	uint64_t s0 = lcore_sleeps(lc), c0 = atomic_load(&cp.calls);
	cr_assert(WAIT_UNTIL(lcore_sleeps(lc) >= s0 + 20, 60000), "timed sleeps stopped");
	uint64_t c1 = atomic_load(&cp.calls), s1 = lcore_sleeps(lc);
	/* Two polls per timed sleep (the poll after waking and the re-check before sleeping); the
	 * +4 covers the counters being read a cycle apart. */
	cr_assert_leq(c1 - c0, 2 * (s1 - s0) + 4, "%lu polls for %lu timed sleeps", (unsigned long)(c1 - c0),
		      (unsigned long)(s1 - s0));
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.wakeups, 0, "no producer woke it: every sleep timed out");
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(cp.rp.r);
}

Test(lcore, adaptive_wake_by_producer_spins_again_before_the_next_sleep)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct counting_poller cp = {.rp = {.r = ring_for(lc)}};
	/* 60 s sleeps: only the producer's eventfd write ends one. */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 100, .backoff_polls = 10,
					   .max_sleep_ns = 60000000000ull};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_poller_register(lc, counting_poll, &cp, "inbox", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	for (uintptr_t round = 1; round <= 3; round++) {
		cr_assert(WAIT_UNTIL(atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1, 20000));
		uint64_t s0 = lcore_sleeps(lc), c0 = atomic_load(&cp.calls);
		cr_assert_eq(kvx_ring_enqueue_sp(cp.rp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&cp.rp.got) == round, 10000), "round %lu: not woken",
			  (unsigned long)round);
		/* Asleep again: sleeping is 1 and the sleep that the wake ended has been counted. */
		cr_assert(WAIT_UNTIL(lcore_sleeps(lc) > s0 && atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1,
				     20000));
		uint64_t c1 = atomic_load(&cp.calls);
		cr_assert_geq(c1 - c0, 1 + 100 + 10, "round %lu: only %lu polls between the wake and the next sleep",
			      (unsigned long)round, (unsigned long)(c1 - c0));
	}
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.wakeups, 3, "each round's sleep was ended by the producer's eventfd write");
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(cp.rp.r);
}

/* A poller whose work waits on a file descriptor: WAIT until the fd is readable, then drains
 * it (one unit of work, BUSY). */
struct fd_poller {
	int fd;
	_Atomic uint64_t calls, got;
};

static int fd_poll(void *arg)
{
	struct fd_poller *fp = arg;
	atomic_fetch_add(&fp->calls, 1);
	uint64_t v;
	if (read(fp->fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
		return KVX_POLL_WAIT;
	atomic_fetch_add(&fp->got, 1);
	return KVX_POLL_BUSY;
}

Test(lcore, adaptive_wait_sleeps_at_once_and_wakes_on_its_wait_fd)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct fd_poller fp = {.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
	cr_assert_geq(fp.fd, 0);
	/* 60 s sleeps: only the wait fd can end one within the deadlines below. */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 100, .backoff_polls = 10,
					   .max_sleep_ns = 60000000000ull};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_lcore_add_wait_fd(lc, -1), -EINVAL);
	cr_assert_eq(kvx_lcore_add_wait_fd(lc, fp.fd), 0);
	cr_assert_eq(kvx_poller_register(lc, fd_poll, &fp, "fd", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert_eq(kvx_lcore_add_wait_fd(lc, fp.fd), -EBUSY, "running, called from another thread");
	for (uint64_t round = 1; round <= 3; round++) {
		cr_assert(WAIT_UNTIL(atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1, 20000));
		uint64_t s0 = lcore_sleeps(lc), c0 = atomic_load(&fp.calls), one = 1;
		cr_assert_eq(write(fp.fd, &one, sizeof(one)), (ssize_t)sizeof(one));
		cr_assert(WAIT_UNTIL(atomic_load(&fp.got) == round, 10000), "round %lu: not woken by the fd",
			  (unsigned long)round);
		cr_assert(WAIT_UNTIL(lcore_sleeps(lc) > s0 && atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1,
				     20000));
		/* The poll that drained the fd, one WAIT poll, the re-check: no 100 spins, no yields
		 * (+2 for the counters being read a cycle apart). */
		uint64_t c1 = atomic_load(&fp.calls);
		cr_assert_leq(c1 - c0, 3 + 2, "round %lu: %lu polls between the wake and the next sleep",
			      (unsigned long)round, (unsigned long)(c1 - c0));
	}
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.wakeups, 3, "each round's sleep was ended by the wait fd");
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	for (unsigned i = 1; i < KVX_LCORE_MAX_WAIT_FDS; i++)
		cr_assert_eq(kvx_lcore_add_wait_fd(lc, fp.fd), 0);
	cr_assert_eq(kvx_lcore_add_wait_fd(lc, fp.fd), -ENOBUFS);
	kvx_lcore_set_destroy(set);
	close(fp.fd);
}

static uint64_t thread_cpu_ns(pthread_t t)
{
	clockid_t cid;
	struct timespec ts;
	cr_assert_eq(pthread_getcpuclockid(t, &cid), 0);
	cr_assert_eq(clock_gettime(cid, &ts), 0);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Read /proc/self/task/TID/stat into buf[cap] and return its closing ')' of comm (asserts):
 * the fields after it are space-separated, state first. */
static const char *task_stat(pid_t tid, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "re");
	cr_assert_not_null(f);
	size_t n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')'); /* comm may hold spaces */
	cr_assert_not_null(p);
	return p;
}

static uint64_t proc_ticks(pid_t tid)
{
	char buf[1024];
	const char *p = task_stat(tid, buf, sizeof(buf));
	unsigned long utime = 0, stime = 0;
	/* fields after ')': state(3) ... utime(14) stime(15) */
	int field = 2;
	for (p++; *p && field < 15; p++) {
		if (*p == ' ') {
			field++;
			if (field == 14)
				utime = strtoul(p + 1, NULL, 10);
			else if (field == 15)
				stime = strtoul(p + 1, NULL, 10);
		}
	}
	return utime + stime;
}

struct pthread_of {
	pthread_t t;
};

static int get_pthread(void *arg)
{
	((struct pthread_of *)arg)->t = pthread_self();
	return 0;
}

Test(lcore, adaptive_idle_uses_under_5_percent_of_a_core)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct pthread_of pt;
	cr_assert_eq(kvx_lcore_launch(lc, get_pthread, &pt), 0);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	struct ring_poller rp = {.r = ring_for(lc)};
	cr_assert_eq(kvx_poller_register(lc, ring_poll, &rp, "inbox", NULL), 0);
	/* Default parameters (100 ms longest sleep): the runtime as shipped. */
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert(WAIT_UNTIL(atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1, 20000));
	uint64_t cpu0 = thread_cpu_ns(pt.t), ticks0 = proc_ticks(kvx_lcore_tid(lc));
	uint64_t wall0 = kvx_now_ns();
	struct timespec window = {1, 0}; /* measurement window, not synchronisation */
	nanosleep(&window, NULL);
	uint64_t wall = kvx_now_ns() - wall0;
	uint64_t cpu = thread_cpu_ns(pt.t) - cpu0, ticks = proc_ticks(kvx_lcore_tid(lc)) - ticks0;
	double pct = 100.0 * (double)cpu / (double)wall;
	double tick_pct = 100.0 * (double)ticks / ((double)sysconf(_SC_CLK_TCK) * (double)wall / 1e9);
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	cr_log_info("adaptive idle: %.3f%% of a core (thread CPU clock), %.1f%% (/proc ticks), %lu sleeps",
		    pct, tick_pct, (unsigned long)st.sleeps);
	cr_assert_lt(pct, 5.0, "idle lcore used %.2f%% of a core", pct);
	cr_assert_lt(tick_pct, 5.0 + 100.0 / ((double)wall / 1e9 * (double)sysconf(_SC_CLK_TCK)),
		     "/proc/self/task/<tid>/stat: %.2f%%", tick_pct);
	cr_assert_geq(st.sleeps, 5, "slept repeatedly (100 ms timeouts)");
	cr_assert_lt(st.util_pct, 1.0);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(rp.r);
}

static void timer_cb(struct kvx_timer *t, void *arg)
{
	(void)t;
	atomic_store((_Atomic uint64_t *)arg, kvx_now_ns());
}

Test(lcore, adaptive_sleep_is_bounded_by_attached_timer)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	struct kvx_timer t;
	_Atomic uint64_t fired = 0;
	kvx_timer_init(&t, timer_cb, (void *)&fired);
	uint64_t deadline = kvx_now_ns() + 300000000ull; /* 300 ms */
	cr_assert_eq(kvx_timer_arm(h, &t, deadline), 0);
	cr_assert_eq(kvx_lcore_attach_timers(lc, h), 0);
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .max_sleep_ns = 60000000000ull};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert(WAIT_UNTIL(atomic_load(&fired) != 0, 20000), "timer fired while the lcore slept");
	cr_assert_geq(atomic_load(&fired), deadline, "not early");
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.timers_run, 1);
	cr_assert_geq(st.sleeps, 1);
	cr_assert_not(kvx_timer_is_armed(&t));
	kvx_lcore_set_destroy(set);
	kvx_timer_heap_destroy(h);
}

/* The thread's scheduler state from /proc/self/task/TID/stat: 'S' while it is blocked in a
 * syscall (the loop blocks only in its sleep's ppoll), 'R' while it runs or is runnable. */
static char task_state(pid_t tid)
{
	char buf[512];
	return task_stat(tid, buf, sizeof(buf))[2];
}

/* Asleep: the flag is up and the thread is blocked (the re-check poll after the flag is done). */
static bool blocked_asleep(struct kvx_lcore *lc)
{
	return atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1 && task_state(kvx_lcore_tid(lc)) == 'S';
}

Test(lcore, adaptive_no_cap_with_nothing_due_makes_no_wakeup)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct counting_poller cp = {.rp = {.r = ring_for(lc)}};
	int wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); /* a wait fd, as an engine poller has */
	cr_assert_geq(wfd, 0);
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	cr_assert_eq(kvx_lcore_attach_timers(lc, h), 0); /* attached, nothing armed */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 100, .backoff_polls = 10,
					   .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_lcore_add_wait_fd(lc, wfd), 0);
	cr_assert_eq(kvx_poller_register(lc, counting_poll, &cp, "inbox", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000), "never went to sleep");
	struct kvx_lcore_stats st0, st;
	kvx_lcore_stats_get(lc, &st0);
	uint64_t c0 = atomic_load(&cp.calls);
	/* An observation window for the absence of wake-ups (nothing waits on it). */
	struct timespec window = {1, 500000000};
	nanosleep(&window, NULL);
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.sleeps, st0.sleeps, "%lu sleeps ended with nothing due", (unsigned long)(st.sleeps - st0.sleeps));
	cr_assert_eq(st.wakeups, st0.wakeups);
	cr_assert_eq(st.loops, st0.loops, "the loop went round %lu times", (unsigned long)(st.loops - st0.loops));
	cr_assert_eq(atomic_load(&cp.calls), c0, "the poller was called while nothing was due");
	cr_assert(blocked_asleep(lc));
	/* One producer: exactly one wake-up, then asleep again with no other. */
	cr_assert_eq(kvx_ring_enqueue_sp(cp.rp.r, (void *)1), 0);
	cr_assert(WAIT_UNTIL(atomic_load(&cp.rp.got) == 1, 10000), "not woken by the producer");
	cr_assert(WAIT_UNTIL((kvx_lcore_stats_get(lc, &st), st.sleeps == st0.sleeps + 1) && blocked_asleep(lc), 20000));
	cr_assert_eq(st.wakeups, st0.wakeups + 1);
	cr_assert_eq(st.timers_run, 0);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
	kvx_timer_heap_destroy(h);
	kvx_ring_destroy(cp.rp.r);
	close(wfd);
}

struct rearm_timer {
	struct kvx_timer_heap *h;
	_Atomic uint64_t fired;
	uint64_t period_ns;
	uint32_t left; /* re-arms after this fire */
};

static void rearm_cb(struct kvx_timer *t, void *arg)
{
	struct rearm_timer *rt = arg;
	atomic_fetch_add(&rt->fired, 1);
	if (rt->left) {
		rt->left--;
		cr_assert_eq(kvx_timer_arm(rt->h, t, kvx_now_ns() + rt->period_ns), 0);
	}
}

Test(lcore, adaptive_timer_wakes_only_when_due_and_restarts_no_spin)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct counting_poller cp = {.rp = {.r = ring_for(lc)}};
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	/* Five fires 20 ms apart (a timer the loop runs: the engine's deadline scan), then none. */
	struct rearm_timer rt = {.h = h, .period_ns = 20000000ull, .left = 4};
	struct kvx_timer t;
	kvx_timer_init(&t, rearm_cb, &rt);
	cr_assert_eq(kvx_timer_arm(h, &t, kvx_now_ns() + rt.period_ns), 0);
	cr_assert_eq(kvx_lcore_attach_timers(lc, h), 0);
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 100, .backoff_polls = 10,
					   .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_poller_register(lc, counting_poll, &cp, "inbox", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	cr_assert(WAIT_UNTIL(atomic_load(&rt.fired) == 5 && !kvx_timer_is_armed(&t) && blocked_asleep(lc), 20000),
		  "five fires, then asleep with nothing armed");
	struct kvx_lcore_stats st0, st;
	kvx_lcore_stats_get(lc, &st0);
	uint64_t c0 = atomic_load(&cp.calls);
	struct timespec window = {1, 0}; /* observation window for the absence of wake-ups */
	nanosleep(&window, NULL);
	kvx_lcore_stats_get(lc, &st);
	cr_assert_eq(st.sleeps, st0.sleeps, "woke with no timer armed");
	cr_assert_eq(atomic_load(&cp.calls), c0);
	cr_assert_eq(atomic_load(&rt.fired), 5);
	cr_assert_eq(st.timers_run, 5);
	cr_assert_eq(st.wakeups, 0, "every sleep ended at a timer deadline, none by a wake");
	/* Before the first sleep: 100 spins, 10 yields, the poll that decides to sleep and its
	 * re-check (112 polls). After each timed wake: the poll that wakes and the re-check, no
	 * spin restarted by the timer (that would add 110 polls per fire). A fire that fell due
	 * while the loop was still spinning (a loaded machine) has no sleep of its own. */
	cr_assert(st.sleeps >= 1 && st.sleeps <= 5, "%lu sleeps for 5 fires", (unsigned long)st.sleeps);
	cr_assert_leq(c0, 112 + 2 * 5, "%lu polls: the timers restarted the spin", (unsigned long)c0);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
	kvx_timer_heap_destroy(h);
	kvx_ring_destroy(cp.rp.r);
}

/* Producer rounds against a loop that goes back to sleep after one empty poll: every enqueue
 * races with the consumer's prepare / re-check / sleep. No sleep cap: a lost wake-up would hang
 * its round, and the round's deadline turns that into a failure. The producer runs on another
 * CPU than the lcore where there is one (on the lcore's CPU it would only ever enqueue while
 * the consumer is preempted, never inside its prepare window), and the rounds go on until at
 * least MIN_WAKES of them found the consumer asleep or preparing to sleep. */
static void no_lost_wake_rounds(bool with_wait_fd)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct ring_poller rp = {.r = ring_for(lc)};
	int wfd = -1;
	if (with_wait_fd) { /* the ppoll over waiter + wait fds path (engine pollers) */
		wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		cr_assert_geq(wfd, 0);
		cr_assert_eq(kvx_lcore_add_wait_fd(lc, wfd), 0);
	}
	cpu_set_t lc_cpus, mine, other;
	kvx_lcore_cpus(lc, &lc_cpus);
	cr_assert_eq(sched_getaffinity(0, sizeof(mine), &mine), 0);
	CPU_ZERO(&other);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &mine) && !CPU_ISSET(c, &lc_cpus))
			CPU_SET(c, &other);
	bool parallel = CPU_COUNT(&other) > 0 && sched_setaffinity(0, sizeof(other), &other) == 0;
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 1, .backoff_polls = 1,
					   .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_poller_register(lc, ring_poll, &rp, "inbox", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	enum { ROUNDS = 20000, MIN_WAKES = 200, MAX_ROUNDS = 1000000 };
	uint64_t seed = 0x9e3779b97f4a7c15ull, w0 = kvx_waiter_wake_count(kvx_lcore_waiter(lc)), wakes = 0;
	uintptr_t round;
	for (round = 1; round <= ROUNDS || (parallel && wakes < MIN_WAKES); round++) {
		cr_assert(round <= MAX_ROUNDS, "%d rounds, only %lu met a sleeping consumer", MAX_ROUNDS,
			  (unsigned long)wakes);
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		/* Mostly 0-127 pause hints (the consumer's way from its last dequeue to the sleep
		 * is a few microseconds), one round in eight 0-4095: land before, inside or after
		 * its prepare. */
		for (uint64_t k = (seed & 7) == 0 ? (seed >> 3) & 4095 : (seed >> 3) & 127; k; k--)
			kvx_lcore_pause_impl();
		cr_assert_eq(kvx_ring_enqueue_sp(rp.r, (void *)round), 0);
		uint64_t dl = kvx_now_ns() + ET_ROUND_NS;
		while (atomic_load_explicit(&rp.got, memory_order_acquire) != round) {
			cr_assert(kvx_now_ns() < dl, "round %lu: the submission was never seen (lost wake-up)",
				  (unsigned long)round);
			sched_yield();
		}
		wakes = kvx_waiter_wake_count(kvx_lcore_waiter(lc)) - w0;
	}
	cr_log_info("%lu rounds (producer %s the lcore's CPU), %lu of them woke a sleeping (or preparing) consumer",
		    (unsigned long)(round - 1), parallel ? "off" : "on", (unsigned long)wakes);
	cr_assert_eq(atomic_load(&rp.last), round - 1);
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(rp.r);
	if (wfd >= 0)
		close(wfd);
}

Test(lcore, adaptive_no_lost_wakeup_submit_while_going_to_sleep)
{
	no_lost_wake_rounds(false);
}

Test(lcore, adaptive_no_lost_wakeup_submit_while_going_to_sleep_with_wait_fd)
{
	no_lost_wake_rounds(true);
}

Test(lcore, explicit_wake_and_stop_from_any_thread)
{
	struct kvx_lcore_set *set = make_set(1, KVX_LCORE_DEFAULT_F_NO_CONTROL, KVX_LCORE_IDLE_ADAPTIVE);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .max_sleep_ns = 60000000000ull};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	struct kvx_lcore_stats st;
	cr_assert(WAIT_UNTIL(atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1, 20000));
	kvx_lcore_wake(lc);
	cr_assert(WAIT_UNTIL((kvx_lcore_stats_get(lc, &st), st.wakeups >= 1), 10000),
		  "explicit wake ended the 60 s sleep");
	cr_assert(WAIT_UNTIL(atomic_load(&kvx_lcore_waiter(lc)->sleeping) == 1, 20000));
	kvx_lcore_set_stop_all(set);
	cr_assert(kvx_lcore_is_stopping(lc));
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	kvx_lcore_set_destroy(set);
}

/* ---- follow_waker ---------------------------------------------------------------------------- */

/* A ring poller that notes the CPU it dequeued each item on. */
struct cpu_poller {
	struct kvx_ring *r;
	_Atomic uint64_t got;
	_Atomic int cpu; /* CPU of the last dequeue */
};

static int cpu_poll(void *arg)
{
	struct cpu_poller *cp = arg;
	void *obj;
	if (!kvx_ring_dequeue_burst_sc(cp->r, &obj, 1, NULL))
		return KVX_POLL_IDLE;
	atomic_store(&cp->cpu, sched_getcpu());
	atomic_fetch_add(&cp->got, 1);
	return KVX_POLL_BUSY;
}

static void pin_self(int cpu)
{
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0);
}

/* An lcore floating on the first two allowed CPUs (or pinned to the second, @p pinned),
 * adaptive, no sleep cap, follow_waker as given; a ring poller noting CPUs. Skips on a host
 * with fewer than two allowed CPUs. */
static struct kvx_lcore_set *follow_set_on(bool follow, bool pinned, int cpus[2], struct cpu_poller *cp)
{
	cpu_set_t allowed;
	cr_assert_eq(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
	if (CPU_COUNT(&allowed) < 2)
		cr_skip_test("this host has %d allowed CPUs, follow_waker needs 2", CPU_COUNT(&allowed));
	for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
		if (CPU_ISSET(c, &allowed))
			cpus[k++] = c;
	struct kvx_lcore_cfg *c = malloc(sizeof(*c));
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_cfg_default(c, 1, KVX_LCORE_DEFAULT_F_NO_CONTROL, g_err, sizeof(g_err)), 0, "%s", g_err);
	CPU_ZERO(&c->lcores[0].cpus);
	if (!pinned)
		CPU_SET(cpus[0], &c->lcores[0].cpus);
	CPU_SET(cpus[1], &c->lcores[0].cpus);
	c->idle = KVX_LCORE_IDLE_ADAPTIVE;
	cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "%s", g_err);
	struct kvx_lcore_set *set = NULL;
	cr_assert_eq(kvx_lcore_set_create(c, &set), 0);
	free(c);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	cp->r = ring_for(lc);
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE,
					   .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP, .follow_waker = follow};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	cr_assert_eq(kvx_poller_register(lc, cpu_poll, cp, "inbox", NULL), 0);
	return set;
}

static struct kvx_lcore_set *follow_set(bool follow, int cpus[2], struct cpu_poller *cp)
{
	return follow_set_on(follow, false, cpus, cp);
}

static bool affinity_is(struct kvx_lcore *lc, const cpu_set_t *want)
{
	cpu_set_t have;
	return kvx_lcore_get_affinity(lc, &have) == 0 && CPU_EQUAL(&have, want);
}

Test(lcore, follow_waker_first_poll_runs_on_the_wakers_cpu_then_widens_back)
{
	int cpus[2];
	struct cpu_poller cp = {0};
	struct kvx_lcore_set *set = follow_set(true, cpus, &cp);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	cpu_set_t home;
	kvx_lcore_cpus(lc, &home);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	for (uint64_t round = 1; round <= 8; round++) {
		int c = cpus[round % 2];
		pin_self(c);
		cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000), "round %lu: lcore never slept", (unsigned long)round);
		cr_assert(affinity_is(lc, &home), "round %lu: asleep with its own CPUs", (unsigned long)round);
		cr_assert_eq(kvx_ring_enqueue_sp(cp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&cp.got) == round, 20000), "round %lu: not woken", (unsigned long)round);
		cr_assert_eq(atomic_load(&cp.cpu), c, "round %lu: woken from CPU %d, first poll on CPU %d",
			     (unsigned long)round, c, atomic_load(&cp.cpu));
		cr_assert_eq(atomic_load(&kvx_lcore_waiter(lc)->narrows), round, "round %lu: one move per wake",
			     (unsigned long)round);
	}
	/* The stop wake narrows it too; the loop widens before it returns. */
	pin_self(cpus[0]);
	cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000));
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	cr_assert(affinity_is(lc, &home), "stopped lcore keeps its own CPUs");
	cr_assert_geq(kvx_waiter_wake_count(kvx_lcore_waiter(lc)), 9);
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(cp.r);
}

Test(lcore, follow_waker_off_leaves_the_affinity_alone)
{
	int cpus[2];
	struct cpu_poller cp = {0};
	struct kvx_lcore_set *set = follow_set(false, cpus, &cp);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	cpu_set_t home;
	kvx_lcore_cpus(lc, &home);
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	for (uint64_t round = 1; round <= 4; round++) {
		pin_self(cpus[round % 2]);
		cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000));
		cr_assert_eq(kvx_ring_enqueue_sp(cp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&cp.got) == round, 20000));
		cr_assert(affinity_is(lc, &home), "round %lu: affinity changed without follow_waker",
			  (unsigned long)round);
		cr_assert_eq(atomic_load(&kvx_lcore_waiter(lc)->narrows), 0);
	}
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	cr_assert(affinity_is(lc, &home));
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(cp.r);
}

/* The engine's case: a poller pinned to one CPU, launched by a thread that may run on others.
 * A wake from another of the launcher's CPUs moves its first poll there, and it goes back to
 * its own CPU; a wake from its own CPU moves nothing (no affinity call: it stays pinned). */
Test(lcore, follow_waker_pinned_lcore_polls_first_on_the_launchers_cpu_then_goes_home)
{
	int cpus[2];
	struct cpu_poller cp = {0};
	cpu_set_t launcher;
	cr_assert_eq(sched_getaffinity(0, sizeof(launcher), &launcher), 0);
	struct kvx_lcore_set *set = follow_set_on(true, true, cpus, &cp);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	cpu_set_t home;
	kvx_lcore_cpus(lc, &home);
	cr_assert_eq(CPU_COUNT(&home), 1);
	cr_assert(CPU_ISSET(cpus[1], &home));
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0); /* launcher: both CPUs */
	_Atomic uint64_t *narrows = &kvx_lcore_waiter(lc)->narrows;
	for (uint64_t round = 1; round <= 8; round++) {
		int c = cpus[round % 2];
		pin_self(c);
		cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000), "round %lu: lcore never slept", (unsigned long)round);
		cr_assert(affinity_is(lc, &home), "round %lu: asleep on its own CPU", (unsigned long)round);
		uint64_t n0 = atomic_load(narrows);
		cr_assert_eq(kvx_ring_enqueue_sp(cp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&cp.got) == round, 20000), "round %lu: not woken", (unsigned long)round);
		cr_assert_eq(atomic_load(&cp.cpu), c, "round %lu: woken from CPU %d, first poll on CPU %d",
			     (unsigned long)round, c, atomic_load(&cp.cpu));
		/* One move from the other CPU; none from its own (no affinity call). */
		cr_assert_eq(atomic_load(narrows) - n0, c == cpus[1] ? 0u : 1u, "round %lu: %lu moves",
			     (unsigned long)round, (unsigned long)(atomic_load(narrows) - n0));
	}
	pin_self(cpus[1]);
	cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000));
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	cr_assert(affinity_is(lc, &home), "stopped lcore keeps its own CPU");
	sched_setaffinity(0, sizeof(launcher), &launcher);
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(cp.r);
}

/* A poller that moves what it dequeues into another lcore's ring (one lcore handing work to
 * another, as the engine's layer spread does). */
struct fwd_poller {
	struct kvx_ring *in, *out;
};

static int fwd_poll(void *arg)
{
	struct fwd_poller *f = arg;
	void *obj;
	if (!kvx_ring_dequeue_burst_sc(f->in, &obj, 1, NULL))
		return KVX_POLL_IDLE;
	while (kvx_ring_enqueue_sp(f->out, obj))
		;
	return KVX_POLL_BUSY;
}

/* A polling lcore never pulls another onto its CPU: lcore A (CPU a) wakes the sleeping lcore B
 * (pinned to CPU b, follow_waker on, launched from a thread allowed on both): B's first poll
 * stays on b, while a wake from the application thread on a moves it (the control case). */
Test(lcore, follow_waker_a_polling_lcore_does_not_pull_another)
{
	int cpus[2];
	struct cpu_poller cp = {0};
	struct kvx_lcore_set *bset = follow_set_on(true, true, cpus, &cp); /* B: pinned to cpus[1] */
	struct kvx_lcore *b = kvx_lcore_set_at(bset, 0);
	struct kvx_lcore_cfg *c = malloc(sizeof(*c));
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_cfg_default(c, 1, KVX_LCORE_DEFAULT_F_NO_CONTROL, g_err, sizeof(g_err)), 0, "%s", g_err);
	CPU_ZERO(&c->lcores[0].cpus);
	CPU_SET(cpus[0], &c->lcores[0].cpus);
	cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "%s", g_err);
	struct kvx_lcore_set *aset = NULL;
	cr_assert_eq(kvx_lcore_set_create(c, &aset), 0);
	free(c);
	struct kvx_lcore *a = kvx_lcore_set_at(aset, 0);
	struct fwd_poller fp = {.in = ring_for(a), .out = cp.r};
	cr_assert_eq(kvx_poller_register(a, fwd_poll, &fp, "fwd", NULL), 0);
	cr_assert_eq(kvx_lcore_launch(b, kvx_lcore_poll_loop, NULL), 0);
	cr_assert_eq(kvx_lcore_launch(a, kvx_lcore_poll_loop, NULL), 0);
	pin_self(cpus[0]);
	for (uint64_t round = 1; round <= 6; round++) {
		bool via_a = round % 2;
		cr_assert(WAIT_UNTIL(blocked_asleep(b), 20000), "round %lu: B never slept", (unsigned long)round);
		cr_assert_eq(kvx_ring_enqueue_sp(via_a ? fp.in : cp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&cp.got) == round, 20000), "round %lu: not delivered", (unsigned long)round);
		int want = via_a ? cpus[1] : cpus[0];
		cr_assert_eq(atomic_load(&kvx_lcore_waiter(b)->narrows), round / 2,
			     "round %lu: only the application's wakes move B", (unsigned long)round);
		cr_assert_eq(atomic_load(&cp.cpu), want, "round %lu (%s): B's first poll on CPU %d, expected %d",
			     (unsigned long)round, via_a ? "woken by lcore A" : "woken by the application",
			     atomic_load(&cp.cpu), want);
	}
	kvx_lcore_stop(a);
	cr_assert_eq(kvx_lcore_wait(a), 0);
	kvx_lcore_stop(b);
	cr_assert_eq(kvx_lcore_wait(b), 0);
	kvx_lcore_set_destroy(aset);
	kvx_lcore_set_destroy(bset);
	kvx_ring_destroy(fp.in);
	kvx_ring_destroy(cp.r);
}

/* ---- slice_us ------------------------------------------------------------------------------ */

/* The scheduler slice of thread @p tid in ns, as sched_getattr(2) reports it (sched_runtime;
 * Linux >= 6.12 reports the slice of a SCHED_OTHER thread there, older kernels 0). */
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
	cr_assert_eq(syscall(SYS_sched_getattr, tid, &a, sizeof(a), 0), 0, "sched_getattr: %s", strerror(errno));
	return a.runtime;
}

/* A poller that reports BUSY while @p spin is set: the lcore keeps polling, never sleeps. */
static int spin_poll(void *arg)
{
	return atomic_load((_Atomic bool *)arg) ? KVX_POLL_BUSY : KVX_POLL_IDLE;
}

Test(lcore, slice_us_is_asked_for_across_each_sleep_and_given_back_while_busy)
{
	int cpus[2];
	struct cpu_poller cp = {0};
	struct kvx_lcore_set *set = follow_set(false, cpus, &cp);
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	static _Atomic bool spin;
	atomic_store(&spin, false);
	cr_assert_eq(kvx_poller_register(lc, spin_poll, (void *)&spin, "spin", NULL), 0);
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE,
					   .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP, .slice_us = 99};
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), -EINVAL, "below the kernel's shortest slice");
	ip.slice_us = KVX_LCORE_SLICE_MAX_US + 1;
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), -EINVAL, "above the kernel's longest slice");
	ip.slice_us = KVX_LCORE_SLICE_MIN_US;
	cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
	pid_t tid = kvx_lcore_tid(lc);
	cr_assert_gt(tid, 0);
	uint64_t dflt = slice_ns_of(tid), want = (uint64_t)KVX_LCORE_SLICE_MIN_US * 1000u;
	if (dflt == 0) {
		kvx_lcore_set_destroy(set);
		kvx_ring_destroy(cp.r);
		cr_skip_test("this kernel reports no per-thread slice (Linux < 6.12 ignores slice_us)");
	}
	cr_assert_neq(dflt, want, "the default slice is not 100 us here");
	cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	for (uint64_t round = 1; round <= 3; round++) {
		cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000), "round %lu: lcore never slept", (unsigned long)round);
		cr_assert_eq(slice_ns_of(tid), want, "round %lu: asleep with the short slice", (unsigned long)round);
		/* Work arrives and keeps coming: the first busy poll hands the short slice back. */
		atomic_store(&spin, true);
		cr_assert_eq(kvx_ring_enqueue_sp(cp.r, (void *)round), 0);
		cr_assert(WAIT_UNTIL(atomic_load(&cp.got) == round, 20000), "round %lu: not woken", (unsigned long)round);
		cr_assert(WAIT_UNTIL(slice_ns_of(tid) == dflt, 20000), "round %lu: busy on the short slice",
			  (unsigned long)round);
		atomic_store(&spin, false);
	}
	cr_assert(WAIT_UNTIL(blocked_asleep(lc), 20000));
	kvx_lcore_stop(lc);
	cr_assert_eq(kvx_lcore_wait(lc), 0);
	cr_assert_eq(slice_ns_of(tid), dflt, "the loop gives the default slice back when it returns");
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(cp.r);
}
