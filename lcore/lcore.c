/* SPDX-License-Identifier: Apache-2.0 */
/* Pinned lcore threads, launch/wait/stop (docs/runtime-notes.md §1.3, §2), poll loop and idle policy. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lcore_internal.h"

static _Thread_local struct kvx_lcore *t_self;

static void *lcore_thread(void *p)
{
	struct kvx_lcore *lc = p;
	t_self = lc;
	atomic_store_explicit(&lc->tid, (pid_t)syscall(SYS_gettid), memory_order_release);
	pthread_mutex_lock(&lc->mu);
	lc->thread_started = true;
	pthread_cond_broadcast(&lc->cv);
	for (;;) {
		while (!lc->has_work && !lc->exit)
			pthread_cond_wait(&lc->cv, &lc->mu);
		if (!lc->has_work)
			break;
		kvx_lcore_fn fn = lc->fn;
		void *arg = lc->fn_arg;
		lc->has_work = false;
		pthread_mutex_unlock(&lc->mu);
		int ret = fn(arg);
		pthread_mutex_lock(&lc->mu);
		lc->ret = ret;
		lc->done = true;
		pthread_cond_broadcast(&lc->cv);
	}
	pthread_mutex_unlock(&lc->mu);
	return NULL;
}

static void lcore_free(struct kvx_lcore *lc)
{
	kvx_waiter_fini(&lc->waiter);
	pthread_cond_destroy(&lc->cv);
	pthread_mutex_destroy(&lc->mu);
	free(lc);
}

static int lcore_new(struct kvx_lcore_set *set, const struct kvx_lcore_map *m, enum kvx_lcore_role role,
		     struct kvx_lcore **out)
{
	struct kvx_lcore *lc;
	if (posix_memalign((void **)&lc, KVX_CACHE_LINE, sizeof(*lc)))
		return -ENOMEM;
	memset(lc, 0, sizeof(*lc));
	lc->set = set;
	lc->id = m->lcore_id;
	lc->role = role;
	lc->cpus = m->cpus;
	lc->idle.policy = set->cfg.idle;
	pthread_mutex_init(&lc->mu, NULL);
	pthread_cond_init(&lc->cv, NULL);
	int rc = kvx_waiter_init(&lc->waiter);
	if (rc) {
		pthread_cond_destroy(&lc->cv);
		pthread_mutex_destroy(&lc->mu);
		free(lc);
		return rc;
	}
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	/* Start on the right CPUs so first-touch memory lands on the right node (§2). */
	rc = pthread_attr_setaffinity_np(&attr, sizeof(lc->cpus), &lc->cpus);
	if (!rc)
		rc = pthread_create(&lc->thread, &attr, lcore_thread, lc);
	pthread_attr_destroy(&attr);
	if (rc) {
		lcore_free(lc);
		return rc == EAGAIN ? -EAGAIN : -rc;
	}
	/* Named for ps/top/pidstat -t: "kvx-lcore-ID", "kvx-ctl-ID" (15 characters at most). */
	char name[16];
	snprintf(name, sizeof(name), "kvx-%s-%u", role == KVX_LCORE_ROLE_CONTROL ? "ctl" : "lcore", m->lcore_id % 100000u);
	(void)pthread_setname_np(lc->thread, name);
	pthread_mutex_lock(&lc->mu);
	while (!lc->thread_started)
		pthread_cond_wait(&lc->cv, &lc->mu);
	pthread_mutex_unlock(&lc->mu);
	*out = lc;
	return 0;
}

static void lcore_join(struct kvx_lcore *lc)
{
	pthread_mutex_lock(&lc->mu);
	lc->exit = true;
	pthread_cond_broadcast(&lc->cv);
	pthread_mutex_unlock(&lc->mu);
	pthread_join(lc->thread, NULL);
	lcore_free(lc);
}

int kvx_lcore_set_create(const struct kvx_lcore_cfg *cfg, struct kvx_lcore_set **out)
{
	if (!cfg || !out || cfg->n_lcores == 0 || cfg->n_lcores > KVX_LCORE_MAX ||
	    cfg->main_lcore == KVX_LCORE_ID_ANY || cfg->control_mode == KVX_LCORE_CONTROL_AUTO)
		return -EINVAL;
	bool has_control = cfg->control_mode == KVX_LCORE_CONTROL_EXPLICIT;
	unsigned n = cfg->n_lcores + (has_control ? 1 : 0);
	struct kvx_lcore_set *set = calloc(1, sizeof(*set) + n * sizeof(set->lcores[0]));
	if (!set)
		return -ENOMEM;
	set->cfg = *cfg;
	int rc = 0;
	for (unsigned i = 0; i < n; i++) {
		bool ctl = i == cfg->n_lcores;
		rc = lcore_new(set, ctl ? &cfg->control : &cfg->lcores[i],
			       ctl ? KVX_LCORE_ROLE_CONTROL : KVX_LCORE_ROLE_POLL, &set->lcores[i]);
		if (rc)
			break;
		set->n = i + 1;
		if (ctl)
			set->control_lc = set->lcores[i];
		else if (cfg->lcores[i].lcore_id == cfg->main_lcore)
			set->main_lc = set->lcores[i];
	}
	if (!rc && !set->main_lc)
		rc = -EINVAL;
	if (rc) {
		kvx_lcore_set_destroy(set);
		return rc;
	}
	*out = set;
	return 0;
}

void kvx_lcore_set_destroy(struct kvx_lcore_set *set)
{
	if (!set)
		return;
	kvx_lcore_set_stop_all(set);
	kvx_lcore_set_wait_all(set);
	for (unsigned i = 0; i < set->n; i++)
		lcore_join(set->lcores[i]);
	free(set);
}

unsigned kvx_lcore_set_count(const struct kvx_lcore_set *set)
{
	return set->n;
}

struct kvx_lcore *kvx_lcore_set_at(const struct kvx_lcore_set *set, unsigned idx)
{
	return idx < set->n ? set->lcores[idx] : NULL;
}

struct kvx_lcore *kvx_lcore_set_get(const struct kvx_lcore_set *set, uint32_t id)
{
	for (unsigned i = 0; i < set->n; i++)
		if (set->lcores[i]->id == id)
			return set->lcores[i];
	return NULL;
}

struct kvx_lcore *kvx_lcore_set_main(const struct kvx_lcore_set *set)
{
	return set->main_lc;
}

struct kvx_lcore *kvx_lcore_set_control(const struct kvx_lcore_set *set)
{
	return set->control_lc;
}

int kvx_lcore_launch(struct kvx_lcore *lc, kvx_lcore_fn fn, void *arg)
{
	if (!fn || t_self == lc)
		return -EINVAL;
	pthread_mutex_lock(&lc->mu);
	if (atomic_load_explicit(&lc->running, memory_order_relaxed)) {
		pthread_mutex_unlock(&lc->mu);
		return -EBUSY;
	}
	atomic_store_explicit(&lc->stop, false, memory_order_relaxed);
	lc->fn = fn;
	lc->fn_arg = arg;
	if (sched_getaffinity(0, sizeof(lc->launcher_cpus), &lc->launcher_cpus))
		CPU_ZERO(&lc->launcher_cpus);
	lc->done = false;
	lc->has_work = true;
	atomic_store_explicit(&lc->running, true, memory_order_release);
	pthread_cond_broadcast(&lc->cv);
	pthread_mutex_unlock(&lc->mu);
	return 0;
}

int kvx_lcore_wait(struct kvx_lcore *lc)
{
	if (t_self == lc)
		return -EINVAL;
	pthread_mutex_lock(&lc->mu);
	if (atomic_load_explicit(&lc->running, memory_order_relaxed)) {
		while (!lc->done)
			pthread_cond_wait(&lc->cv, &lc->mu);
		atomic_store_explicit(&lc->running, false, memory_order_release);
	}
	int ret = lc->ret;
	pthread_mutex_unlock(&lc->mu);
	return ret;
}

int kvx_lcore_set_launch_all(struct kvx_lcore_set *set, enum kvx_lcore_role role, kvx_lcore_fn fn,
			     void *arg)
{
	if (!fn || (t_self && t_self->set == set))
		return -EINVAL;
	for (unsigned i = 0; i < set->n; i++)
		if (set->lcores[i]->role == role && kvx_lcore_is_running(set->lcores[i]))
			return -EBUSY;
	for (unsigned i = 0; i < set->n; i++) {
		if (set->lcores[i]->role != role)
			continue;
		int rc = kvx_lcore_launch(set->lcores[i], fn, arg);
		if (rc)
			return rc;
	}
	return 0;
}

void kvx_lcore_set_wait_all(struct kvx_lcore_set *set)
{
	for (unsigned i = 0; i < set->n; i++)
		(void)kvx_lcore_wait(set->lcores[i]);
}

void kvx_lcore_stop(struct kvx_lcore *lc)
{
	/* Release: pairs with the acquire load in the poll loop. The wake's seq_cst fence (W1)
	 * orders this store before the sleeping check, like a ring publish. */
	atomic_store_explicit(&lc->stop, true, memory_order_release);
	kvx_waiter_wake(&lc->waiter);
}

void kvx_lcore_set_stop_all(struct kvx_lcore_set *set)
{
	for (unsigned i = 0; i < set->n; i++)
		kvx_lcore_stop(set->lcores[i]);
}

bool kvx_lcore_is_stopping(const struct kvx_lcore *lc)
{
	return atomic_load_explicit(&lc->stop, memory_order_acquire);
}

bool kvx_lcore_is_running(const struct kvx_lcore *lc)
{
	return atomic_load_explicit(&lc->running, memory_order_acquire);
}

struct kvx_lcore *kvx_lcore_self(void)
{
	return t_self;
}

uint32_t kvx_lcore_self_id(void)
{
	return t_self ? t_self->id : KVX_LCORE_ID_ANY;
}

uint32_t kvx_lcore_id(const struct kvx_lcore *lc)
{
	return lc->id;
}

enum kvx_lcore_role kvx_lcore_role(const struct kvx_lcore *lc)
{
	return lc->role;
}

struct kvx_lcore_set *kvx_lcore_get_set(const struct kvx_lcore *lc)
{
	return lc->set;
}

void kvx_lcore_set_ctx(struct kvx_lcore *lc, void *ctx)
{
	lc->ctx = ctx;
}

void *kvx_lcore_ctx(const struct kvx_lcore *lc)
{
	return lc->ctx;
}

void kvx_lcore_cpus(const struct kvx_lcore *lc, cpu_set_t *out)
{
	*out = lc->cpus;
}

int kvx_lcore_get_affinity(const struct kvx_lcore *lc, cpu_set_t *out)
{
	CPU_ZERO(out);
	int rc = pthread_getaffinity_np(lc->thread, sizeof(*out), out);
	return rc ? -rc : 0;
}

pid_t kvx_lcore_tid(const struct kvx_lcore *lc)
{
	return atomic_load_explicit(&lc->tid, memory_order_acquire);
}

/* ---- pollers ------------------------------------------------------------------------------ */

static bool may_modify(const struct kvx_lcore *lc)
{
	return t_self == lc || !kvx_lcore_is_running(lc);
}

int kvx_poller_register(struct kvx_lcore *lc, kvx_poller_fn fn, void *arg, const char *name,
			struct kvx_poller **out)
{
	if (!fn)
		return -EINVAL;
	if (!may_modify(lc))
		return -EBUSY;
	if (lc->n_order >= KVX_LCORE_MAX_POLLERS)
		return -ENOBUFS;
	for (uint32_t i = 0; i < KVX_LCORE_MAX_POLLERS; i++) {
		struct kvx_poller *p = &lc->pollers[i];
		if (p->fn)
			continue;
		p->lc = lc;
		p->fn = fn;
		p->arg = arg;
		p->active = true;
		snprintf(p->name, sizeof(p->name), "%s", name ? name : "");
		lc->order[lc->n_order++] = (uint8_t)i;
		if (out)
			*out = p;
		return 0;
	}
	/* All slots hold unregistered pollers awaiting compaction. */
	return -ENOBUFS;
}

int kvx_poller_unregister(struct kvx_poller *p)
{
	struct kvx_lcore *lc = p->lc;
	if (!may_modify(lc))
		return -EBUSY;
	if (!p->active)
		return -ENOENT;
	p->active = false;
	lc->need_compact = true; /* the loop may be iterating over order[]: compact after it */
	return 0;
}

static void compact_pollers(struct kvx_lcore *lc)
{
	uint32_t w = 0;
	for (uint32_t r = 0; r < lc->n_order; r++) {
		struct kvx_poller *p = &lc->pollers[lc->order[r]];
		if (p->active)
			lc->order[w++] = lc->order[r];
		else
			p->fn = NULL;
	}
	lc->n_order = w;
	lc->need_compact = false;
}

/* BUSY if any poller was; else WAIT if any waits on the wait set; else IDLE. */
static inline int run_pollers(struct kvx_lcore *lc)
{
	int busy = KVX_POLL_IDLE;
	for (uint32_t i = 0; i < lc->n_order; i++) {
		struct kvx_poller *p = &lc->pollers[lc->order[i]];
		if (KVX_LIKELY(p->active)) {
			int r = p->fn(p->arg);
			if (r == KVX_POLL_BUSY || (r == KVX_POLL_WAIT && busy == KVX_POLL_IDLE))
				busy = r;
		}
	}
	if (KVX_UNLIKELY(lc->need_compact))
		compact_pollers(lc);
	return busy;
}

int kvx_lcore_poll_once(struct kvx_lcore *lc)
{
	return run_pollers(lc);
}

int kvx_lcore_set_idle(struct kvx_lcore *lc, const struct kvx_lcore_idle_params *p)
{
	if (p->policy != KVX_LCORE_IDLE_BUSY && p->policy != KVX_LCORE_IDLE_ADAPTIVE)
		return -EINVAL;
	if (p->slice_us && (p->slice_us < KVX_LCORE_SLICE_MIN_US || p->slice_us > KVX_LCORE_SLICE_MAX_US))
		return -EINVAL;
	if (!may_modify(lc))
		return -EBUSY;
	lc->idle = *p;
	return 0;
}

int kvx_lcore_attach_timers(struct kvx_lcore *lc, struct kvx_timer_heap *heap)
{
	if (!may_modify(lc))
		return -EBUSY;
	lc->timers = heap;
	return 0;
}

int kvx_lcore_add_wait_fd(struct kvx_lcore *lc, int fd)
{
	if (fd < 0)
		return -EINVAL;
	if (!may_modify(lc))
		return -EBUSY;
	if (lc->n_wait_fd >= KVX_LCORE_MAX_WAIT_FDS)
		return -ENOBUFS;
	lc->wait_fd[lc->n_wait_fd++] = fd;
	return 0;
}

void kvx_lcore_wake(struct kvx_lcore *lc)
{
	kvx_waiter_wake(&lc->waiter);
}

struct kvx_waiter *kvx_lcore_waiter(struct kvx_lcore *lc)
{
	return &lc->waiter;
}

/* ---- accounting --------------------------------------------------------------------------- */

/* Single writer: a relaxed load + store is enough for readers to see whole values. */
static inline void st_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

void kvx_lcore_stats_get(const struct kvx_lcore *lc, struct kvx_lcore_stats *out)
{
	out->loops = atomic_load_explicit(&lc->st_loops, memory_order_relaxed);
	out->busy_loops = atomic_load_explicit(&lc->st_busy_loops, memory_order_relaxed);
	out->busy_ns = atomic_load_explicit(&lc->st_busy_ns, memory_order_relaxed);
	out->idle_ns = atomic_load_explicit(&lc->st_idle_ns, memory_order_relaxed);
	out->sleeps = atomic_load_explicit(&lc->st_sleeps, memory_order_relaxed);
	out->wakeups = atomic_load_explicit(&lc->st_wakeups, memory_order_relaxed);
	out->timers_run = atomic_load_explicit(&lc->st_timers_run, memory_order_relaxed);
	uint64_t tot = out->busy_ns + out->idle_ns;
	out->util_pct = tot ? 100.0 * (double)out->busy_ns / (double)tot : 0.0;
}

/* ---- poll loop ------------------------------------------------------------------------------ */

static uint64_t sleep_timeout(const struct kvx_lcore *lc, uint64_t max_sleep_ns)
{
	uint64_t t = max_sleep_ns;
	if (lc->timers) {
		uint64_t next = kvx_timer_heap_next_ns(lc->timers);
		if (next != UINT64_MAX) {
			uint64_t now = kvx_now_ns();
			uint64_t d = next > now ? next - now : 0;
			if (d < t)
				t = d;
		}
	}
	return t;
}

/* Prepared sleep on the waiter and the wait fds: 1 woken (waiter or a readable fd), 0 timed
 * out (or interrupted). */
static int lcore_sleep(struct kvx_lcore *lc, uint64_t timeout_ns)
{
	if (!lc->n_wait_fd)
		return kvx_waiter_sleep(&lc->waiter, timeout_ns);
	struct pollfd pf[1 + KVX_LCORE_MAX_WAIT_FDS];
	pf[0] = (struct pollfd){.fd = kvx_waiter_fd(&lc->waiter), .events = POLLIN};
	for (uint32_t i = 0; i < lc->n_wait_fd; i++)
		pf[1 + i] = (struct pollfd){.fd = lc->wait_fd[i], .events = POLLIN};
	struct timespec ts, *tsp = NULL;
	if (timeout_ns != UINT64_MAX) {
		ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
		ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
		tsp = &ts;
	}
	int r = ppoll(pf, 1 + lc->n_wait_fd, tsp, NULL);
	/* Drain the eventfd only when it polled readable: no read(2) after a timer or a wait fd.
	 * A waker that swapped sleeping to 0 and writes after this leaves it readable; the next
	 * sleep then returns at once (a stale wake, never a lost one). */
	if (r > 0 && (pf[0].revents & POLLIN))
		(void)kvx_waiter_finish(&lc->waiter);
	else
		kvx_waiter_cancel(&lc->waiter);
	return r > 0 ? 1 : 0;
}

/* The CPUs below 64 of a set as a bitmask; *all = whether there were no others. */
static uint64_t low_mask(const cpu_set_t *s, bool *all)
{
	uint64_t m = 0;
	*all = true;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, s))
			continue;
		if (c >= 64)
			*all = false;
		else
			m |= 1ull << c;
	}
	return m;
}

/* follow_waker: the CPUs below 64 a waker may move the lcore to (its own and its launcher's)
 * as a bitmask, and its own in @p home (all ones when it has a CPU >= 64: no waker then skips
 * the move as already home); 0 when it does not apply (busy policy, or one CPU in all, so
 * there is nowhere to move). A waker on a CPU >= 64 never moves it. */
static uint64_t follow_mask(const struct kvx_lcore *lc, uint64_t *home)
{
	if (!lc->idle.follow_waker || lc->idle.policy != KVX_LCORE_IDLE_ADAPTIVE)
		return 0;
	bool own_all, from_all;
	uint64_t own = low_mask(&lc->cpus, &own_all), from = low_mask(&lc->launcher_cpus, &from_all);
	*home = own_all ? own : ~0ull;
	uint64_t m = own | from;
	return m & (m - 1) ? m : 0;
}

/* sched_attr of sched_setattr(2) (glibc has no wrapper; the first version of the struct). */
struct slice_attr {
	uint32_t size, policy;
	uint64_t flags;
	int32_t nice;
	uint32_t priority;
	uint64_t runtime, deadline, period;
};

/* Ask for a scheduler slice of @p us for the calling thread (0 = the kernel's default), keeping
 * its nice. Only for a SCHED_OTHER thread (slices_apply()). Returns whether the kernel took it. */
static bool set_slice(uint32_t us)
{
	errno = 0;
	int nice = getpriority(PRIO_PROCESS, 0); /* Linux: the calling thread's */
	if (errno)
		return false;
	struct slice_attr a = {.size = sizeof(a), .policy = SCHED_OTHER, .nice = nice,
			       .runtime = (uint64_t)us * 1000u};
	return syscall(SYS_sched_setattr, 0, &a, 0) == 0;
}

/* Whether set_slice() applies to the calling thread, checked once when its poll loop starts:
 * it runs under SCHED_OTHER (a real-time or batch policy set by the user is left alone) and the
 * kernel keeps a slice per thread (Linux >= 6.12 reports it as sched_runtime; older kernels
 * report 0 and ignore what set_slice() asks). */
static bool slices_apply(void)
{
	struct slice_attr a = {0};
	return syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) == 0 && a.policy == SCHED_OTHER && a.runtime != 0;
}

/* Back to the lcore's own CPUs after a waker narrowed it to the waker's CPU. */
static void widen(struct kvx_lcore *lc)
{
	(void)sched_setaffinity(0, sizeof(lc->cpus), &lc->cpus);
}

int kvx_lcore_poll_loop(void *arg)
{
	(void)arg;
	struct kvx_lcore *lc = t_self;
	if (!lc)
		return -EINVAL;
	kvx_rcu_register();
	uint32_t empty = 0;
	uint64_t t_prev = kvx_now_ns();
	kvx_waiter_thread_never_narrows(true);
	/* slice_us: the short slice is asked for before each sleep (a wake-up is judged by the
	 * woken thread's slice) and handed back at the first busy poll, so the work itself runs on
	 * the default slice and is not switched out more often than any other thread. */
	bool short_slice = false, slices = lc->idle.slice_us && slices_apply();
	uint64_t home = 0, fm = follow_mask(lc, &home);
	bool follow = fm != 0;
	if (follow)
		kvx_waiter_follow(&lc->waiter, kvx_lcore_tid(lc), fm, home);
	while (!atomic_load_explicit(&lc->stop, memory_order_acquire)) {
		int busy = run_pollers(lc);
		if (short_slice && busy == KVX_POLL_BUSY) {
			(void)set_slice(0);
			short_slice = false;
		}
		/* Narrowed by the waker that ended the last sleep: the first poll ran on its CPU
		 * (that is the point); from here on the lcore may move again. */
		if (follow && kvx_waiter_take_narrowed(&lc->waiter))
			widen(lc);
		uint64_t now = kvx_now_ns();
		if (lc->timers && kvx_timer_heap_next_ns(lc->timers) <= now) {
			unsigned ran = kvx_timer_heap_run(lc->timers, now);
			st_add(&lc->st_timers_run, ran);
			now = kvx_now_ns();
		}
		kvx_rcu_quiescent();
		st_add(&lc->st_loops, 1);
		if (busy == KVX_POLL_BUSY) {
			st_add(&lc->st_busy_loops, 1);
			st_add(&lc->st_busy_ns, now - t_prev);
			t_prev = now;
			empty = 0;
			continue;
		}
		st_add(&lc->st_idle_ns, now - t_prev);
		t_prev = now;
		/* Timers that ran are not work by themselves: what a callback started is found by
		 * the re-check before the sleep below (BUSY there restarts the spin), so a periodic
		 * timer on an idle lcore costs one wake, its callback and two polls, no spin. */
		empty++;
		uint32_t spin = lc->idle.spin_polls ? lc->idle.spin_polls : KVX_LCORE_SPIN_POLLS;
		uint32_t backoff = lc->idle.backoff_polls ? lc->idle.backoff_polls : KVX_LCORE_BACKOFF_POLLS;
		/* WAIT: the pollers' outstanding work waits on the wait set: no spin, no yields. */
		if (busy == KVX_POLL_WAIT && lc->idle.policy != KVX_LCORE_IDLE_BUSY)
			empty = spin + backoff + 1;
		if (lc->idle.policy == KVX_LCORE_IDLE_BUSY || empty <= spin) {
			kvx_lcore_pause_impl();
			continue;
		}
		if (empty <= spin + backoff) {
			sched_yield(); /* idle only: let a thread sharing this CPU run */
			continue;
		}
		/* Sleep. Prepare, then re-check every source (the pollers and the stop flag):
		 * a producer that published before P1 is seen here, one after sees sleeping. */
		kvx_waiter_prepare(&lc->waiter);
		if (atomic_load_explicit(&lc->stop, memory_order_acquire) ||
		    run_pollers(lc) == KVX_POLL_BUSY) {
			kvx_waiter_cancel(&lc->waiter);
			empty = 0;
			continue;
		}
		uint64_t max_sleep = lc->idle.max_sleep_ns ? lc->idle.max_sleep_ns : KVX_LCORE_MAX_SLEEP_NS;
		uint64_t timeout = sleep_timeout(lc, max_sleep);
		/* A waker of an earlier sleep that was preempted before its affinity call may narrow
		 * us late: do not sleep away from our own CPUs. */
		if (follow && kvx_waiter_take_narrowed(&lc->waiter))
			widen(lc);
		if (slices && !short_slice)
			short_slice = set_slice(lc->idle.slice_us);
		kvx_rcu_offline();
		int r = lcore_sleep(lc, timeout);
		kvx_rcu_online();
		st_add(&lc->st_sleeps, 1);
		if (r == 1)
			st_add(&lc->st_wakeups, 1);
		now = kvx_now_ns();
		st_add(&lc->st_idle_ns, now - t_prev);
		t_prev = now;
		/* Woken by a producer: work is coming, spin and back off again before the next sleep.
		 * Timed out (a timer or the sleep cap): poll once, and if that finds nothing sleep
		 * again at once; re-spinning after every timed wake is what kept an idle engine busy. */
		empty = r == 1 ? 0 : spin + backoff;
	}
	if (follow) {
		kvx_waiter_follow(&lc->waiter, 0, 0, 0); /* returns once no waker can narrow us */
		if (kvx_waiter_take_narrowed(&lc->waiter))
			widen(lc);
	}
	kvx_waiter_thread_never_narrows(false);
	if (short_slice)
		(void)set_slice(0);
	kvx_rcu_unregister();
	return 0;
}
