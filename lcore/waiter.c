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

void kvx_waiter_signal_impl(struct kvx_waiter *w)
{
	/* Only the waker that swaps 1 -> 0 writes: one write(2) per sleep, not one per producer. */
	if (atomic_exchange_explicit(&w->sleeping, 0, memory_order_acq_rel) != 1)
		return;
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
