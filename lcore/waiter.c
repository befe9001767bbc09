/* SPDX-License-Identifier: Apache-2.0 */
/* Waiter: eventfd + sleeping flag (protocol in include/kvxfer/lcore.h, edges W1/P1). */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "lcore_internal.h"

int kvx_waiter_init(struct kvx_waiter *w)
{
	atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
	atomic_store_explicit(&w->wakes, 0, memory_order_relaxed);
	atomic_store_explicit(&w->follow_tid, 0, memory_order_relaxed);
	atomic_store_explicit(&w->narrowed, 0, memory_order_relaxed);
	atomic_store_explicit(&w->follow_cpus, 0, memory_order_relaxed);
	atomic_store_explicit(&w->follow_home, 0, memory_order_relaxed);
	atomic_store_explicit(&w->in_follow, 0, memory_order_relaxed);
	atomic_store_explicit(&w->narrows, 0, memory_order_relaxed);
	w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->efd < 0) {
		int e = errno;
		w->efd = -1;
		return -e;
	}
	return 0;
}

void kvx_waiter_fini(struct kvx_waiter *w)
{
	if (w->efd >= 0)
		close(w->efd);
	w->efd = -1;
}

int kvx_waiter_fd(const struct kvx_waiter *w)
{
	return w->efd;
}

void kvx_waiter_prepare(struct kvx_waiter *w)
{
	/* P1: pairs with W1 in kvx_waiter_wake(): the store of sleeping = 1 is ordered before the
	 * caller's re-check of its sources (RMW: acq_rel, the TSan form of W1 needs it). */
	atomic_exchange_explicit(&w->sleeping, 1, memory_order_acq_rel);
#if !defined(__SANITIZE_THREAD__)
	atomic_thread_fence(memory_order_seq_cst);
#endif
}

void kvx_waiter_cancel(struct kvx_waiter *w)
{
	atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
}

static bool drain(struct kvx_waiter *w)
{
	uint64_t v;
	return read(w->efd, &v, sizeof(v)) == (ssize_t)sizeof(v);
}

int kvx_waiter_sleep(struct kvx_waiter *w, uint64_t timeout_ns)
{
	struct pollfd pfd = {.fd = w->efd, .events = POLLIN};
	struct timespec ts, *tsp = NULL;
	if (timeout_ns != UINT64_MAX) {
		ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
		ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
		tsp = &ts;
	}
	int r = ppoll(&pfd, 1, tsp, NULL);
	int e = errno;
	bool woken = r > 0 && drain(w);
	atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
	if (r < 0 && e != EINTR)
		return -e;
	return woken ? 1 : 0;
}

bool kvx_waiter_finish(struct kvx_waiter *w)
{
	bool woken = drain(w);
	atomic_store_explicit(&w->sleeping, 0, memory_order_relaxed);
	return woken;
}

void kvx_waiter_follow(struct kvx_waiter *w, int32_t tid, uint64_t cpus, uint64_t home)
{
	atomic_store_explicit(&w->follow_cpus, cpus, memory_order_relaxed);
	atomic_store_explicit(&w->follow_home, home, memory_order_relaxed);
	/* F1: seq_cst store, then the load of in_follow; pairs with F2 in follow_here(): a waker
	 * either reads our 0 or is counted in in_follow, and then we wait for it to finish. */
	atomic_store_explicit(&w->follow_tid, tid, memory_order_seq_cst);
	if (tid == 0)
		while (atomic_load_explicit(&w->in_follow, memory_order_seq_cst))
			sched_yield(); /* a waker is inside one sched_setaffinity(2) call */
}

bool kvx_waiter_take_narrowed(struct kvx_waiter *w)
{
	return atomic_load_explicit(&w->narrowed, memory_order_relaxed) &&
	       atomic_exchange_explicit(&w->narrowed, 0, memory_order_acquire);
}

static _Thread_local bool t_never_narrow; /* this thread is a polling lcore */

void kvx_waiter_thread_never_narrows(bool on)
{
	t_never_narrow = on;
}

/* The waker's half of follow_waker: move the sleeping consumer to this CPU if it may run here,
 * so the wake-up that follows is a local one (no IPI to another, maybe halted, CPU). Only the
 * waker that won the swap of `sleeping` comes here, once per sleep. `narrowed` is stored after
 * the affinity call returned, so a consumer that widens after reading narrowed = 1 widens
 * after it; one that stops following waits for in_follow = 0 first (F1/F2). */
static void follow_here(struct kvx_waiter *w)
{
	if (t_never_narrow || atomic_load_explicit(&w->follow_tid, memory_order_relaxed) <= 0)
		return; /* off, or a poller waking a poller: no RMW on the wake path */
	atomic_fetch_add_explicit(&w->in_follow, 1, memory_order_seq_cst);
	int32_t tid = atomic_load_explicit(&w->follow_tid, memory_order_seq_cst); /* F2 */
	int cpu = sched_getcpu();
	uint64_t cpus = atomic_load_explicit(&w->follow_cpus, memory_order_relaxed);
	uint64_t home = atomic_load_explicit(&w->follow_home, memory_order_relaxed);
	if (tid > 0 && cpu >= 0 && cpu < 64 && (cpus & (1ull << cpu)) && home != 1ull << cpu) {
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(cpu, &one);
		if (sched_setaffinity(tid, sizeof(one), &one) == 0) {
			atomic_store_explicit(&w->narrowed, 1, memory_order_release);
			atomic_fetch_add_explicit(&w->narrows, 1, memory_order_relaxed);
		}
	}
	atomic_fetch_sub_explicit(&w->in_follow, 1, memory_order_release);
}

void kvx_waiter_signal_impl(struct kvx_waiter *w)
{
	/* Only the waker that swaps 1 -> 0 writes: one write(2) per sleep, not one per producer. */
	if (atomic_exchange_explicit(&w->sleeping, 0, memory_order_acq_rel) != 1)
		return;
	follow_here(w);
	uint64_t one = 1;
	ssize_t n = write(w->efd, &one, sizeof(one));
	(void)n; /* EAGAIN only at a counter of 2^64-2: the fd is readable anyway */
	atomic_fetch_add_explicit(&w->wakes, 1, memory_order_relaxed);
}

bool kvx_waiter_is_sleeping(const struct kvx_waiter *w)
{
	return atomic_load_explicit(&w->sleeping, memory_order_relaxed) != 0;
}

uint64_t kvx_waiter_wake_count(const struct kvx_waiter *w)
{
	return atomic_load_explicit(&w->wakes, memory_order_relaxed);
}

void kvx_ring_yield_impl(void)
{
	sched_yield();
}
