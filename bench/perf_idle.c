/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer-perf idle: what an idle engine costs and how fast an idle poller starts.
 *   1. engine idle CPU: one engine (adaptive idle policy, the default) started with one layer
 *      and no peer, left alone for --seconds. Two figures over the same window: CPU time of all
 *      its threads (process CPU clock minus this measuring thread's) over wall time, and the
 *      same from the kernel's per-thread tick counters (/proc/self/task/TID/stat utime+stime,
 *      what `pidstat -t` reads), each in % of one core, with the threads that used any; plus
 *      how many idle sleeps of its polling lcores ended in the window (a wake-up each).
 *   2. first post from idle: an lcore running the engine's poll loop with the engine's idle
 *      parameters (adaptive, no sleep cap) and a ring attached to its waiter, as the engine's
 *      submission ring is. Each sample waits until the lcore sleeps (plus a random 0-2 ms),
 *      enqueues a timestamp, and the poller records now - timestamp when it dequeues it: the
 *      delay from a submission to the poll that posts it. p50/p99/p99.9/max.
 *   3. peer: the floor that the machine sets on (2): a plain thread blocked in ppoll(2) on an
 *      eventfd, on the lcore's CPUs, woken by an eventfd write, measured the same way. Samples
 *      of (2) and (3) alternate, so both see the same load.
 * The targets of issue 16 are absolute (idle < 2 % of a core, first post p99 < 50 us); the
 * peer says how much of the first-post delay is the kernel's (or the VM's) wake-up of an idle
 * CPU, and the load of the machine (uptime) belongs next to the figures. Each sample also
 * notes whether the woken thread ran on the CPU the submitter ran on: a wake that crosses to
 * another, halted CPU is the slow kind on a VM (docs/performance.md §9). */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "kvxfer/lcore.h"
#include "perf.h"

struct idle_cfg {
	const char *transport, *json;
	uint32_t seconds, samples;
	bool follow; /* idle follow_waker of the first-post lcore (the engine's default: on) */
	uint32_t slice_us;   /* idle slice_us of the first-post lcore (the engine's default: 100) */
	uint32_t busy_after_us; /* the submitter computes this long after each submission */
};

/* --busy-after: the submitting thread keeps its CPU this long after a submission, as an
 * inference thread that goes on with its work does; a woken thread that shares that CPU must
 * preempt it to run. */
static void busy_until(uint64_t t_ns)
{
	while (kvx_now_ns() < t_ns)
		kvx_lcore_pause_impl();
}

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* ---- per-thread kernel tick counters (what pidstat -t reads) -------------------------------- */

enum { MAX_TASKS = 64 };

struct task_ticks {
	int tid;
	char comm[20];
	uint64_t ticks; /* utime + stime, clock ticks */
};

/* One thread's comm and utime+stime from /proc/self/task/TID/stat: 0, or -1. */
static int read_task(int tid, struct task_ticks *t)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *l = strchr(buf, '('), *r = strrchr(buf, ')'); /* comm may hold spaces */
	if (!l || !r || r < l)
		return -1;
	size_t cl = (size_t)(r - l - 1) < sizeof(t->comm) - 1 ? (size_t)(r - l - 1) : sizeof(t->comm) - 1;
	memcpy(t->comm, l + 1, cl);
	t->comm[cl] = '\0';
	unsigned long ut = 0, st = 0;
	/* after ')': state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
	 * utime(14) stime(15) */
	if (sscanf(r + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	t->tid = tid;
	t->ticks = ut + st;
	return 0;
}

/* Every thread of this process: count (at most MAX_TASKS). */
static unsigned read_tasks(struct task_ticks *out)
{
	DIR *d = opendir("/proc/self/task");
	unsigned n = 0;
	if (!d)
		return 0;
	for (struct dirent *de; n < MAX_TASKS && (de = readdir(d));) {
		int tid = atoi(de->d_name);
		if (tid > 0 && read_task(tid, &out[n]) == 0)
			n++;
	}
	closedir(d);
	return n;
}

struct idle_result {
	double pct;            /* process CPU clock minus the measuring thread's, % of one core */
	double ticks_pct;      /* the same threads' /proc ticks, % of one core */
	uint64_t poll_sleeps;  /* polling lcores' idle sleeps that ended in the window */
	uint64_t poll_wakeups; /* of those, ended by a wake (not a timer) */
	unsigned n_busy;       /* threads[] entries */
	struct task_ticks threads[MAX_TASKS]; /* engine threads with ticks in the window (delta) */
};

static void engine_sleeps(struct kvx_engine *e, uint64_t *sleeps, uint64_t *wakeups)
{
	struct kvx_engine_stats *st = calloc(1, sizeof(*st));
	*sleeps = *wakeups = 0;
	if (!st)
		return;
	kvx_engine_get_stats(e, st);
	for (uint32_t i = 0; i < st->n_lcores; i++) {
		*sleeps += st->lcores[i].sleeps;
		*wakeups += st->lcores[i].wakeups;
	}
	free(st);
}

/* 1. CPU of an idle engine's threads, % of one core. */
static int engine_idle(const struct idle_cfg *c, struct idle_result *res)
{
	struct kvx_engine_params p;
	kvx_engine_params_init(&p);
	p.role = KVX_SCHED_CONSUMER;
	p.mode = KVX_SCHED_MODE_READ;
	p.transport = c->transport;
	p.host = "127.0.0.1";
	p.handshake_port = 0;
	p.notify_port = 0;
	p.max_transfers = 16;
	p.max_blocks = 64;
	p.idle = KVX_ENGINE_IDLE_ADAPTIVE;
	p.follow_waker = c->follow;
	p.poller_slice_us = c->slice_us;
	char err[256] = "";
	struct kvx_engine *e;
	int rc = kvx_engine_create(&p, &e, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvxfer-perf idle: engine: %s: %s\n", kvx_strerror(rc), err);
		return rc;
	}
	enum { NB = 64 };
	void *mem = calloc(2 * NB, 4 * 2 * 8 * 2);
	struct kvx_engine_layer ly = {.name = "model.layers.0.attn", .base = mem,
				      .tensor = {.ndim = 5, .shape = {2, NB, 4, 2, 8},
						 .stride = {NB * 64, 64, 16, 8, 1}, .elem_size = 2},
				      .spec = {.block_size = 4, .num_kv_heads = 2, .head_size = 8}};
	rc = mem ? kvx_engine_register_layer(e, &ly) : -ENOMEM;
	if (rc >= 0)
		rc = kvx_engine_start(e);
	if (rc < 0) {
		fprintf(stderr, "kvxfer-perf idle: engine start: %s\n", kvx_strerror(rc));
		kvx_engine_destroy(e);
		free(mem);
		return rc;
	}
	sleep_ns(200000000ull); /* let start-up settle before the window */
	static struct task_ticks t0[MAX_TASKS], t1[MAX_TASKS];
	uint64_t s0, w0s;
	engine_sleeps(e, &s0, &w0s);
	unsigned n0 = read_tasks(t0);
	uint64_t p0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), th0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
	uint64_t w0 = kvx_now_ns();
	sleep_ns((uint64_t)c->seconds * 1000000000ull);
	uint64_t wall = kvx_now_ns() - w0;
	uint64_t cpu = (clock_ns(CLOCK_PROCESS_CPUTIME_ID) - p0) - (clock_ns(CLOCK_THREAD_CPUTIME_ID) - th0);
	unsigned n1 = read_tasks(t1);
	uint64_t s1, w1s;
	engine_sleeps(e, &s1, &w1s);
	res->pct = 100.0 * (double)cpu / (double)wall;
	res->poll_sleeps = s1 - s0;
	res->poll_wakeups = w1s - w0s;
	/* Ticks of every thread but this one (a thread started in the window counts whole). */
	uint64_t ticks = 0;
	int self = getpid();
	res->n_busy = 0;
	for (unsigned i = 0; i < n1; i++) {
		if (t1[i].tid == self)
			continue;
		uint64_t before = 0;
		for (unsigned j = 0; j < n0; j++)
			if (t0[j].tid == t1[i].tid)
				before = t0[j].ticks;
		uint64_t d = t1[i].ticks - before;
		ticks += d;
		if (d) {
			res->threads[res->n_busy] = t1[i];
			res->threads[res->n_busy++].ticks = d;
		}
	}
	double tck = (double)sysconf(_SC_CLK_TCK) * (double)wall / 1e9;
	res->ticks_pct = 100.0 * (double)ticks / tck;
	kvx_engine_stop(e);
	kvx_engine_destroy(e);
	free(mem);
	return 0;
}

static double ticks_pct(uint64_t ticks, uint32_t seconds)
{
	return 100.0 * (double)ticks / ((double)sysconf(_SC_CLK_TCK) * (double)seconds);
}

/* ---- 2. first post from idle, and 3. its eventfd peer ------------------------------------------ */

/* A submission: its time and the CPU the submitter ran on when it made it. */
struct wake_msg {
	uint64_t t_ns;
	int32_t cpu;
	uint32_t pad;
};

struct wake_poller {
	struct kvx_ring *r;
	uint64_t *lat;        /* Array[samples]: written by the poller only */
	uint8_t *cross;       /* Array[samples]: 1 = polled on another CPU than the submitter's */
	_Atomic uint32_t got; /* poller: samples recorded (release); main reads */
};

static int wake_poll(void *arg)
{
	struct wake_poller *w = arg;
	struct wake_msg m;
	if (!kvx_ring_dequeue_elem_burst_sc(w->r, &m, 1, NULL))
		return KVX_POLL_IDLE;
	uint64_t now = kvx_now_ns();
	uint32_t i = atomic_load_explicit(&w->got, memory_order_relaxed);
	w->lat[i] = now - m.t_ns;
	w->cross[i] = sched_getcpu() != m.cpu;
	atomic_store_explicit(&w->got, i + 1, memory_order_release);
	return KVX_POLL_BUSY;
}

/* The peer: a thread that blocks in ppoll(2) on an eventfd, nothing else. */
struct efd_peer {
	int efd;
	uint32_t n;
	uint64_t *lat;           /* Array[n]: written by the peer thread only */
	uint8_t *cross;          /* Array[n]: peer thread; 1 = woke on another CPU than main's */
	_Atomic uint64_t t_sent; /* main: the sample's timestamp, stored before the write */
	_Atomic int32_t cpu_sent; /* main: the CPU it wrote from, stored before the write */
	_Atomic uint32_t armed;  /* peer: 1 just before it blocks; main waits for it */
	_Atomic uint32_t got;    /* peer: samples recorded (release) */
	_Atomic bool stop;
};

static void *efd_peer_thread(void *arg)
{
	struct efd_peer *pe = arg;
	for (uint32_t i = 0; i < pe->n;) {
		atomic_store_explicit(&pe->armed, 1, memory_order_seq_cst);
		struct pollfd pf = {.fd = pe->efd, .events = POLLIN};
		int r = ppoll(&pf, 1, NULL, NULL);
		atomic_store_explicit(&pe->armed, 0, memory_order_relaxed);
		if (atomic_load_explicit(&pe->stop, memory_order_acquire))
			break;
		uint64_t v;
		/* Woken and the wake consumed, as the lcore drains its waiter before it polls. */
		if (r <= 0 || read(pe->efd, &v, sizeof(v)) != (ssize_t)sizeof(v))
			continue;
		pe->lat[i] = kvx_now_ns() - atomic_load_explicit(&pe->t_sent, memory_order_acquire);
		pe->cross[i] = sched_getcpu() != atomic_load_explicit(&pe->cpu_sent, memory_order_relaxed);
		atomic_store_explicit(&pe->got, ++i, memory_order_release);
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

struct pctl {
	double p50_us, p99_us, p999_us, max_us;
};

static struct pctl percentiles(uint64_t *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	size_t i99 = (size_t)((double)n * 0.99), i999 = (size_t)((double)n * 0.999);
	return (struct pctl){.p50_us = (double)v[n / 2] / 1e3,
			     .p99_us = (double)v[i99 < n ? i99 : n - 1] / 1e3,
			     .p999_us = (double)v[i999 < n ? i999 : n - 1] / 1e3,
			     .max_us = (double)v[n - 1] / 1e3};
}

/* Samples woken on the submitter's CPU (same) and on another one (cross). */
struct cpu_split {
	uint32_t n_same, n_cross;
	struct pctl same, cross;
};

/* Split @p lat by @p cross into percentiles; @p lat is left in its order. */
static struct cpu_split split_by_cpu(const uint64_t *lat, const uint8_t *cross, uint32_t n)
{
	struct cpu_split s = {0};
	uint64_t *a = calloc(n ? n : 1, sizeof(*a)), *b = calloc(n ? n : 1, sizeof(*b));
	if (a && b) {
		for (uint32_t i = 0; i < n; i++) {
			if (cross[i])
				b[s.n_cross++] = lat[i];
			else
				a[s.n_same++] = lat[i];
		}
		if (s.n_same)
			s.same = percentiles(a, s.n_same);
		if (s.n_cross)
			s.cross = percentiles(b, s.n_cross);
	}
	free(a);
	free(b);
	return s;
}

struct wake_result {
	struct pctl lc, peer;
	struct cpu_split lc_cpu, peer_cpu;
	uint32_t n_lc, n_peer;
	uint64_t sleeps, wakeups;
};

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* 2 and 3: submission -> poll latency of a sleeping adaptive lcore, and the eventfd peer's,
 * samples alternating. */
static int first_post(const struct idle_cfg *c, struct wake_result *res)
{
	static struct kvx_lcore_cfg cfg;
	char err[256] = "";
	kvx_lcore_cfg_init(&cfg);
	int rc = kvx_lcore_cfg_default(&cfg, 1, KVX_LCORE_DEFAULT_F_NO_CONTROL, err, sizeof(err));
	if (!rc)
		rc = kvx_lcore_cfg_validate(&cfg, NULL, NULL, err, sizeof(err));
	struct kvx_lcore_set *set = NULL;
	if (!rc)
		rc = kvx_lcore_set_create(&cfg, &set);
	if (rc) {
		fprintf(stderr, "kvxfer-perf idle: lcores: %s %s\n", kvx_strerror(rc), err);
		return rc;
	}
	struct kvx_lcore *lc = kvx_lcore_set_at(set, 0);
	uint32_t n_peer = c->samples / 2, n_lc = c->samples - n_peer;
	struct kvx_ring_params rp = {.name = "submit", .count = 64, .elem_size = sizeof(struct wake_msg)};
	struct wake_poller w = {.lat = calloc(n_lc, sizeof(uint64_t)), .cross = calloc(n_lc, 1)};
	struct efd_peer pe = {.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), .n = n_peer,
			      .lat = calloc(n_peer ? n_peer : 1, sizeof(uint64_t)),
			      .cross = calloc(n_peer ? n_peer : 1, 1)};
	pthread_t pt;
	bool peer_started = false;
	/* The engine's poller parameters (kvx_engine_start). */
	struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .max_sleep_ns = KVX_LCORE_SLEEP_NO_CAP,
					   .follow_waker = c->follow, .slice_us = c->slice_us};
	rc = w.lat && w.cross && pe.lat && pe.cross && pe.efd >= 0 ? kvx_ring_create(&rp, &w.r) : -ENOMEM;
	if (!rc) {
		kvx_ring_set_waiter(w.r, kvx_lcore_waiter(lc));
		rc = kvx_lcore_set_idle(lc, &ip);
	}
	if (!rc)
		rc = kvx_poller_register(lc, wake_poll, &w, "submit", NULL);
	if (!rc)
		rc = kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL);
	if (!rc && n_peer) {
		/* On the lcore's CPUs: the same wake-up path as the lcore's. */
		pthread_attr_t attr;
		cpu_set_t cpus;
		kvx_lcore_cpus(lc, &cpus);
		pthread_attr_init(&attr);
		pthread_attr_setaffinity_np(&attr, sizeof(cpus), &cpus);
		rc = -pthread_create(&pt, &attr, efd_peer_thread, &pe);
		pthread_attr_destroy(&attr);
		peer_started = rc == 0;
	}
	if (rc) {
		fprintf(stderr, "kvxfer-perf idle: first-post lcore: %s\n", kvx_strerror(rc));
		goto out;
	}
	uint64_t seed = 0x2545f4914f6cdd1dull;
	uint32_t i_lc = 0, i_peer = 0;
	for (uint32_t i = 0; i < c->samples && !rc; i++) {
		bool peer = i % 2 == 1 && i_peer < n_peer;
		if (peer) {
			while (!atomic_load_explicit(&pe.armed, memory_order_acquire))
				sleep_ns(100000);
		} else {
			while (!atomic_load_explicit(&kvx_lcore_waiter(lc)->sleeping, memory_order_acquire))
				sleep_ns(100000);
		}
		sleep_ns(next_rand(&seed) % 2000000ull); /* land anywhere in the sleep */
		uint64_t t = kvx_now_ns();
		if (peer) {
			uint64_t one = 1;
			atomic_store_explicit(&pe.cpu_sent, sched_getcpu(), memory_order_relaxed);
			atomic_store_explicit(&pe.t_sent, t, memory_order_release);
			if (write(pe.efd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
				rc = -errno;
				break;
			}
			i_peer++;
			busy_until(t + (uint64_t)c->busy_after_us * 1000u);
			while (atomic_load_explicit(&pe.got, memory_order_acquire) != i_peer)
				sleep_ns(20000);
		} else {
			struct wake_msg m = {.t_ns = t, .cpu = sched_getcpu()};
			if (!kvx_ring_enqueue_elem_burst_sp(w.r, &m, 1, NULL)) {
				rc = -ENOBUFS;
				break;
			}
			i_lc++;
			busy_until(t + (uint64_t)c->busy_after_us * 1000u);
			while (atomic_load_explicit(&w.got, memory_order_acquire) != i_lc)
				sleep_ns(20000);
		}
	}
	struct kvx_lcore_stats st;
	kvx_lcore_stats_get(lc, &st);
	kvx_lcore_stop(lc);
	kvx_lcore_wait(lc);
	if (!rc) {
		res->n_lc = i_lc;
		res->n_peer = i_peer;
		res->lc_cpu = split_by_cpu(w.lat, w.cross, i_lc);
		res->peer_cpu = split_by_cpu(pe.lat, pe.cross, i_peer);
		res->lc = percentiles(w.lat, i_lc);
		if (i_peer)
			res->peer = percentiles(pe.lat, i_peer);
		res->sleeps = st.sleeps;
		res->wakeups = st.wakeups;
	}
out:
	if (peer_started) {
		uint64_t one = 1;
		atomic_store_explicit(&pe.stop, true, memory_order_release);
		if (write(pe.efd, &one, sizeof(one)) < 0)
			perror("kvxfer-perf idle: peer stop");
		pthread_join(pt, NULL);
	}
	kvx_lcore_set_destroy(set);
	kvx_ring_destroy(w.r);
	if (pe.efd >= 0)
		close(pe.efd);
	free(pe.cross);
	free(pe.lat);
	free(w.cross);
	free(w.lat);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvxfer-perf idle [--seconds S] [--samples N] [--transport tcp|shm] [--json FILE]\n"
		   "CPU of an idle engine (adaptive idle policy) in %% of one core, and the delay from a\n"
		   "submission to the poll that posts it on an idle poller (p50/p99/p99.9/max, us), next to\n"
		   "a plain thread woken from ppoll(2) by an eventfd write (the peer), samples alternating.\n"
		   "The peer runs no kvxfer code: its figures are this machine's own wake-up latency. Each\n"
		   "is also split by where the woken thread ran: on the submitter's CPU, or on another one.\n"
		   "  --seconds S     idle window (default 20)\n"
		   "  --samples N     wake samples, each from a sleeping thread, half of them the peer's\n"
		   "                  (default 2000)\n"
		   "  --transport T   engine transport (default tcp)\n"
		   "  --follow on|off the first-post lcore's idle parameter follow_waker (default on, as\n"
		   "                  the engine's pollers): the submitter moves the sleeping lcore to its own\n"
		   "                  CPU for the first poll; off: the wake crosses to the lcore's CPU\n"
		   "  --slice US      the first-post lcore's scheduler slice, us (idle parameter slice_us;\n"
		   "                  default 100, as the engine's pollers; 0: the kernel's default)\n"
		   "  --busy-after US after each submission the submitter keeps its CPU busy this long\n"
		   "                  (an inference thread going on with its work; default 0: it waits at\n"
		   "                  once), for the poller's and the peer's samples alike\n");
}

/* One line per kind of wake: on the submitter's CPU, or on another CPU. */
static void print_split(const char *who, const struct cpu_split *s)
{
	char name[64];
	snprintf(name, sizeof(name), "  %s, same CPU (%u)", who, s->n_same);
	if (s->n_same)
		printf("%-28s %9.1f %9.1f %9.1f %9.1f\n", name, s->same.p50_us, s->same.p99_us, s->same.p999_us,
		       s->same.max_us);
	snprintf(name, sizeof(name), "  %s, other CPU (%u)", who, s->n_cross);
	if (s->n_cross)
		printf("%-28s %9.1f %9.1f %9.1f %9.1f\n", name, s->cross.p50_us, s->cross.p99_us,
		       s->cross.p999_us, s->cross.max_us);
}

static void json_pctl(FILE *f, const char *name, uint32_t n, const struct pctl *p)
{
	fprintf(f, "\"%s\":{\"samples\":%u,\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"max_us\":%.3f", name, n,
		p->p50_us, p->p99_us, p->p999_us, p->max_us);
}

int kvx_perf_idle_main(int argc, char **argv)
{
	struct idle_cfg c = {.transport = "tcp", .seconds = 20, .samples = 2000, .follow = true,
			     .slice_us = KVX_LCORE_SLICE_MIN_US};
	static const struct option opts[] = {
		{"seconds", required_argument, 0, 's'}, {"samples", required_argument, 0, 'n'},
		{"transport", required_argument, 0, 't'}, {"json", required_argument, 0, 'j'},
		{"follow", required_argument, 0, 'f'}, {"slice", required_argument, 0, 'S'},
		{"busy-after", required_argument, 0, 'B'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
	};
	optind = 1;
	int o;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;
		unsigned long v;
		switch (o) {
		case 's':
		case 'n':
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || *end || end == optarg || v < 1 || v > (o == 's' ? 3600ul : 1000000ul)) {
				fprintf(stderr, "kvxfer-perf idle: --%s '%s' must be an integer in 1..%lu\n",
					o == 's' ? "seconds" : "samples", optarg, o == 's' ? 3600ul : 1000000ul);
				return 2;
			}
			if (o == 's')
				c.seconds = (uint32_t)v;
			else
				c.samples = (uint32_t)v;
			break;
		case 't': c.transport = optarg; break;
		case 'j': c.json = optarg; break;
		case 'f':
			if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
				fprintf(stderr, "kvxfer-perf idle: --follow '%s' is not on or off\n", optarg);
				return 2;
			}
			c.follow = !strcmp(optarg, "on");
			break;
		case 'S':
		case 'B':
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || *end || end == optarg || *optarg == '-' ||
			    (o == 'S' && v && (v < KVX_LCORE_SLICE_MIN_US || v > KVX_LCORE_SLICE_MAX_US)) ||
			    (o == 'B' && v > 1000000ul)) {
				if (o == 'S')
					fprintf(stderr, "kvxfer-perf idle: --slice '%s' must be 0 or an integer in %u..%u\n",
						optarg, KVX_LCORE_SLICE_MIN_US, KVX_LCORE_SLICE_MAX_US);
				else
					fprintf(stderr, "kvxfer-perf idle: --busy-after '%s' must be an integer in 0..1000000\n",
						optarg);
				return 2;
			}
			if (o == 'S')
				c.slice_us = (uint32_t)v;
			else
				c.busy_after_us = (uint32_t)v;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	static struct idle_result ir;
	struct wake_result wr = {0};
	if (engine_idle(&c, &ir) || first_post(&c, &wr))
		return 1;
	char slice[32] = "the kernel's default";
	if (c.slice_us)
		snprintf(slice, sizeof(slice), "%u us", c.slice_us);
	printf("# kvxfer-perf idle: engine transport %s, adaptive idle, %u s window; first post: %u samples "
	       "from a sleeping poller (engine idle parameters%s, slice %s), %u from a thread sleeping in ppoll "
	       "(peer); the submitter computes %u us after each submission\n",
	       c.transport, c.seconds, wr.n_lc, c.follow ? ", follow_waker on" : ", follow_waker off",
	       slice,
	       wr.n_peer, c.busy_after_us);
	printf("%-28s %10s %10s %12s %12s\n", "idle engine CPU", "% of core", "% (ticks)", "poll sleeps",
	       "poll wakeups");
	printf("%-28s %10.3f %10.3f %12llu %12llu\n", "all engine threads", ir.pct, ir.ticks_pct,
	       (unsigned long long)ir.poll_sleeps, (unsigned long long)ir.poll_wakeups);
	for (unsigned i = 0; i < ir.n_busy; i++)
		printf("  %-26s %10s %10.3f\n", ir.threads[i].comm, "", ticks_pct(ir.threads[i].ticks, c.seconds));
	printf("%-28s %9s %9s %9s %9s %9s %9s\n", "first post from idle", "p50 us", "p99 us", "p99.9 us", "max us",
	       "sleeps", "wakeups");
	printf("%-28s %9.1f %9.1f %9.1f %9.1f %9llu %9llu\n", "submit -> poll", wr.lc.p50_us, wr.lc.p99_us,
	       wr.lc.p999_us, wr.lc.max_us, (unsigned long long)wr.sleeps, (unsigned long long)wr.wakeups);
	if (wr.n_peer)
		printf("%-28s %9.1f %9.1f %9.1f %9.1f\n", "peer: bare eventfd wake", wr.peer.p50_us, wr.peer.p99_us,
		       wr.peer.p999_us, wr.peer.max_us);
	if (wr.n_peer && wr.peer.p99_us > 0)
		printf("%-28s %9.2f %9.2f\n", "ratio kvxfer / peer", wr.lc.p50_us / wr.peer.p50_us,
		       wr.lc.p99_us / wr.peer.p99_us);
	print_split("kvxfer", &wr.lc_cpu);
	if (wr.n_peer)
		print_split("peer", &wr.peer_cpu);
	/* The reading: the peer runs no kvxfer code, so its tail is the machine's wake-up. */
	if (wr.n_peer)
		printf("# the peer is a plain thread woken from ppoll(2) by an eventfd write in this run: no kvxfer "
		       "code, the machine's own wake-up latency. Target p99 < 50 us: kvxfer %.1f us, machine floor "
		       "(peer) %.1f us%s\n",
		       wr.lc.p99_us, wr.peer.p99_us,
		       wr.peer.p99_us >= 50.0 ? ": the floor itself misses the target here" : "");
	if (c.json) {
		FILE *f = fopen(c.json, "w");
		if (!f) {
			fprintf(stderr, "kvxfer-perf idle: cannot write %s: %s\n", c.json, strerror(errno));
			return 1;
		}
		fprintf(f, "{\"command\":\"idle\",\"follow_waker\":%s,\"slice_us\":%u,\"busy_after_us\":%u,\"engine\":{\"transport\":\"%s\",\"seconds\":%u,\"cpu_pct_of_core\":%.4f,"
			   "\"ticks_pct_of_core\":%.4f,\"poll_sleeps\":%llu,\"poll_wakeups\":%llu,\"threads\":[",
			c.follow ? "true" : "false", c.slice_us, c.busy_after_us, c.transport, c.seconds, ir.pct, ir.ticks_pct, (unsigned long long)ir.poll_sleeps,
			(unsigned long long)ir.poll_wakeups);
		for (unsigned i = 0; i < ir.n_busy; i++)
			fprintf(f, "%s{\"comm\":\"%s\",\"ticks_pct_of_core\":%.4f}", i ? "," : "", ir.threads[i].comm,
				ticks_pct(ir.threads[i].ticks, c.seconds));
		fprintf(f, "]},");
		json_pctl(f, "first_post", wr.n_lc, &wr.lc);
		fprintf(f, ",\"other_cpu_samples\":%u,\"sleeps\":%llu,\"wakeups\":%llu},", wr.lc_cpu.n_cross,
			(unsigned long long)wr.sleeps, (unsigned long long)wr.wakeups);
		if (wr.n_peer) {
			json_pctl(f, "peer_eventfd", wr.n_peer, &wr.peer);
			fprintf(f, ",\"other_cpu_samples\":%u},\"ratio_p50\":%.4f,\"ratio_p99\":%.4f}\n", wr.peer_cpu.n_cross,
				wr.lc.p50_us / wr.peer.p50_us, wr.lc.p99_us / wr.peer.p99_us);
		} else {
			fprintf(f, "\"peer_eventfd\":null,\"ratio_p50\":null,\"ratio_p99\":null}\n");
		}
		if (fclose(f)) {
			fprintf(stderr, "kvxfer-perf idle: write %s failed\n", c.json);
			return 1;
		}
	}
	return 0;
}
