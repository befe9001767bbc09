/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf ring: SPSC throughput (bursts 1, 8, 32) and cross-core one-way latency between two
 * pinned lcores, for kvxfer's ring and, in the same run with the same threads and counts, for
 * liburcu's cds_wfcq and a mutex + condition-variable queue. Plus the wake-up latency of the
 * adaptive idle policy (consumer asleep on its eventfd -> item dequeued).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <urcu/wfcqueue.h>

#include "kvxfer/lcore.h"
#include "perf.h"
#include "perf_util.h"

#define WINDOW 1024u /* in-flight bound of every queue: the ring's capacity */
#define MAX_BURST 32u
#define N_BURSTS 3
static const unsigned g_bursts[N_BURSTS] = {1, 8, 32};

enum qkind { Q_RING, Q_WFCQ, Q_MUTEX, Q_KINDS };
static const char *const g_qname[Q_KINDS] = {"ring", "wfcq", "mutex"};

static inline void relax(unsigned *spins)
{
#if defined(__x86_64__) || defined(__i386__)
	_mm_pause();
#endif
	/* If the peer shares our CPU (or was preempted), let it run. */
	if (++*spins % 4096 == 0)
		sched_yield();
}

/* ---- the three queues, one SPSC direction each ------------------------------------------------ */

struct wnode {
	struct cds_wfcq_node node;
	void *val;
};

struct mqueue {
	pthread_mutex_t mu;
	pthread_cond_t not_empty;
	pthread_cond_t not_full;
	uint64_t head, tail; /* tail - head = count */
	void *slot[WINDOW];
};

struct queue {
	enum qkind kind;
	struct kvx_ring *ring;
	/* wfcq: lock-free head (single consumer), node pool of WINDOW, consumer progress for
	 * the producer's in-flight bound (same bound as the ring, so the comparison is fair) */
	struct __cds_wfcq_head whead;
	struct cds_wfcq_tail wtail;
	struct wnode *pool;
	_Alignas(64) _Atomic uint64_t consumed;
	_Alignas(64) uint64_t prod_seq;
	uint64_t prod_consumed_cache;
	_Alignas(64) uint64_t cons_seq;
	struct mqueue *mq;
};

static int queue_init(struct queue *q, enum qkind kind)
{
	memset(q, 0, sizeof(*q));
	q->kind = kind;
	switch (kind) {
	case Q_RING: {
		struct kvx_ring_params p = {.name = "perf", .count = WINDOW};
		return kvx_ring_create(&p, &q->ring);
	}
	case Q_WFCQ:
		__cds_wfcq_init(&q->whead, &q->wtail);
		if (posix_memalign((void **)&q->pool, 64, WINDOW * sizeof(*q->pool)))
			return -ENOMEM;
		memset(q->pool, 0, WINDOW * sizeof(*q->pool));
		return 0;
	case Q_MUTEX:
		q->mq = calloc(1, sizeof(*q->mq));
		if (!q->mq)
			return -ENOMEM;
		pthread_mutex_init(&q->mq->mu, NULL);
		pthread_cond_init(&q->mq->not_empty, NULL);
		pthread_cond_init(&q->mq->not_full, NULL);
		return 0;
	default:
		return -EINVAL;
	}
}

static void queue_fini(struct queue *q)
{
	kvx_ring_destroy(q->ring);
	free(q->pool);
	if (q->mq) {
		pthread_mutex_destroy(&q->mq->mu);
		pthread_cond_destroy(&q->mq->not_empty);
		pthread_cond_destroy(&q->mq->not_full);
		free(q->mq);
	}
}

/* Producer: enqueue up to n values (n <= MAX_BURST); returns how many were taken (0 if full,
 * never for the mutex queue, which blocks while full). */
static unsigned q_put(struct queue *q, void *const *vals, unsigned n)
{
	switch (q->kind) {
	case Q_RING:
		return kvx_ring_enqueue_burst_sp(q->ring, vals, n, NULL);
	case Q_WFCQ: {
		uint64_t room = WINDOW - (q->prod_seq - q->prod_consumed_cache);
		if (room < n) {
			q->prod_consumed_cache = atomic_load_explicit(&q->consumed, memory_order_acquire);
			room = WINDOW - (q->prod_seq - q->prod_consumed_cache);
		}
		if (n > room)
			n = (unsigned)room;
		for (unsigned i = 0; i < n; i++) {
			struct wnode *w = &q->pool[(q->prod_seq + i) % WINDOW];
			cds_wfcq_node_init(&w->node);
			w->val = vals[i];
			cds_wfcq_enqueue(&q->whead, &q->wtail, &w->node);
		}
		q->prod_seq += n;
		return n;
	}
	default: {
		struct mqueue *m = q->mq;
		pthread_mutex_lock(&m->mu);
		while (m->tail - m->head == WINDOW)
			pthread_cond_wait(&m->not_full, &m->mu);
		uint64_t room = WINDOW - (m->tail - m->head);
		if (n > room)
			n = (unsigned)room;
		bool was_empty = m->tail == m->head;
		for (unsigned i = 0; i < n; i++)
			m->slot[(m->tail + i) % WINDOW] = vals[i];
		m->tail += n;
		if (was_empty)
			pthread_cond_signal(&m->not_empty);
		pthread_mutex_unlock(&m->mu);
		return n;
	}
	}
}

/* Consumer: dequeue up to n values; 0 if empty (the mutex queue blocks until one arrives). */
static unsigned q_get(struct queue *q, void **vals, unsigned n)
{
	switch (q->kind) {
	case Q_RING:
		return kvx_ring_dequeue_burst_sc(q->ring, vals, n, NULL);
	case Q_WFCQ: {
		unsigned got = 0;
		while (got < n) {
			struct cds_wfcq_node *node = __cds_wfcq_dequeue_nonblocking(&q->whead, &q->wtail);
			if (!node || node == CDS_WFCQ_WOULDBLOCK)
				break;
			vals[got++] = caa_container_of(node, struct wnode, node)->val;
		}
		if (got) {
			q->cons_seq += got;
			atomic_store_explicit(&q->consumed, q->cons_seq, memory_order_release);
		}
		return got;
	}
	default: {
		struct mqueue *m = q->mq;
		pthread_mutex_lock(&m->mu);
		while (m->tail == m->head)
			pthread_cond_wait(&m->not_empty, &m->mu);
		uint64_t avail = m->tail - m->head;
		if (n > avail)
			n = (unsigned)avail;
		bool was_full = avail == WINDOW;
		for (unsigned i = 0; i < n; i++)
			vals[i] = m->slot[(m->head + i) % WINDOW];
		m->head += n;
		if (was_full)
			pthread_cond_signal(&m->not_full);
		pthread_mutex_unlock(&m->mu);
		return n;
	}
	}
}

/* ---- workloads ------------------------------------------------------------------------------ */

struct job {
	struct queue *fwd;  /* producer -> consumer */
	struct queue *back; /* latency reply path */
	unsigned burst;
	uint64_t n;
	_Atomic int arrived;
	uint64_t t_start, t_end; /* consumer's clock */
	uint64_t errors;
	uint64_t *oneway;   /* Array[n] latency samples (consumer side), ns */
	uint64_t *rtt;      /* Array[n] round trips (producer side), ns */
};

static void barrier2(struct job *j)
{
	unsigned spins = 0;
	atomic_fetch_add(&j->arrived, 1);
	while (atomic_load(&j->arrived) < 2)
		relax(&spins);
}

static int tput_producer(void *arg)
{
	struct job *j = arg;
	void *vals[MAX_BURST];
	uint64_t seq = 0;
	unsigned spins = 0;
	barrier2(j);
	while (seq < j->n) {
		unsigned k = j->burst;
		if (k > j->n - seq)
			k = (unsigned)(j->n - seq);
		for (unsigned i = 0; i < k; i++)
			vals[i] = (void *)(uintptr_t)(seq + i + 1);
		unsigned sent = 0;
		while (sent < k) {
			unsigned m = q_put(j->fwd, vals + sent, k - sent);
			if (!m)
				relax(&spins);
			sent += m;
		}
		seq += k;
	}
	return 0;
}

static int tput_consumer(void *arg)
{
	struct job *j = arg;
	void *vals[MAX_BURST];
	uint64_t expect = 1, errors = 0;
	unsigned spins = 0;
	barrier2(j);
	j->t_start = kvx_now_ns();
	while (expect <= j->n) {
		unsigned m = q_get(j->fwd, vals, j->burst);
		if (!m) {
			relax(&spins);
			continue;
		}
		for (unsigned i = 0; i < m; i++, expect++)
			errors += (uintptr_t)vals[i] != expect; /* FIFO and content check */
	}
	j->t_end = kvx_now_ns();
	j->errors = errors;
	return 0;
}

static int lat_initiator(void *arg)
{
	struct job *j = arg;
	unsigned spins = 0;
	barrier2(j);
	for (uint64_t i = 0; i < j->n; i++) {
		uint64_t t0 = kvx_now_ns();
		void *v, *m = (void *)(uintptr_t)t0;
		while (!q_put(j->fwd, &m, 1))
			relax(&spins);
		while (!q_get(j->back, &v, 1))
			relax(&spins);
		uint64_t t1 = kvx_now_ns();
		j->rtt[i] = t1 - t0;
		j->errors += (uintptr_t)v != t0;
	}
	return 0;
}

static int lat_responder(void *arg)
{
	struct job *j = arg;
	unsigned spins = 0;
	barrier2(j);
	for (uint64_t i = 0; i < j->n; i++) {
		void *v;
		while (!q_get(j->fwd, &v, 1))
			relax(&spins);
		uint64_t now = kvx_now_ns();
		j->oneway[i] = now - (uint64_t)(uintptr_t)v; /* CLOCK_MONOTONIC is one clock for all CPUs */
		while (!q_put(j->back, &v, 1))
			relax(&spins);
	}
	return 0;
}

static int run_pair(struct kvx_lcore *a, struct kvx_lcore *b, kvx_lcore_fn fa, kvx_lcore_fn fb,
		    struct job *j)
{
	atomic_store(&j->arrived, 0);
	int rc = kvx_lcore_launch(b, fb, j);
	if (!rc)
		rc = kvx_lcore_launch(a, fa, j);
	if (rc) {
		fprintf(stderr, "kvxfer-perf ring: launch failed: %s\n", kvx_strerror(rc));
		return rc;
	}
	kvx_lcore_wait(a);
	kvx_lcore_wait(b);
	return 0;
}

/* ---- adaptive idle wake-up -------------------------------------------------------------------- */

struct wake {
	struct kvx_ring *r;
	struct kvx_lcore *cons;
	uint64_t *samples;
	uint64_t n;
	_Atomic uint64_t done;
	uint64_t errors;
};

static int wake_poller(void *arg)
{
	struct wake *w = arg;
	void *v[8];
	unsigned m = kvx_ring_dequeue_burst_sc(w->r, v, 8, NULL);
	if (!m)
		return KVX_POLL_IDLE;
	uint64_t now = kvx_now_ns();
	uint64_t d = atomic_load_explicit(&w->done, memory_order_relaxed);
	for (unsigned i = 0; i < m; i++) {
		if (d < w->n)
			w->samples[d] = now - (uint64_t)(uintptr_t)v[i];
		d++;
	}
	atomic_store_explicit(&w->done, d, memory_order_release);
	return KVX_POLL_BUSY;
}

/* The consumer thread is blocked in the kernel (state S) with its sleeping flag set. */
static bool consumer_asleep(struct wake *w)
{
	if (!kvx_waiter_is_sleeping(kvx_lcore_waiter(w->cons)))
		return false;
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)kvx_lcore_tid(w->cons));
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'S';
}

static int wake_producer(void *arg)
{
	struct wake *w = arg;
	unsigned spins = 0;
	for (uint64_t i = 0; i < w->n; i++) {
		uint64_t dl = kvx_now_ns() + 2000000000ull;
		while (!consumer_asleep(w)) {
			if (kvx_now_ns() > dl)
				return -ETIMEDOUT;
			sched_yield();
		}
		uint64_t t0 = kvx_now_ns();
		while (kvx_ring_enqueue_sp(w->r, (void *)(uintptr_t)t0))
			relax(&spins);
		dl = kvx_now_ns() + 2000000000ull;
		while (atomic_load_explicit(&w->done, memory_order_acquire) <= i) {
			if (kvx_now_ns() > dl)
				return -ETIMEDOUT;
			relax(&spins);
		}
	}
	return 0;
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvxfer-perf ring [-l LCORES] [-n OPS | -D SECONDS] [--reps N] [--lat-n N]\n"
		"                        [--wake-n N] [--json FILE]\n"
		"  SPSC throughput at bursts 1, 8, 32 and cross-core one-way latency between two pinned\n"
		"  lcores (producer = first, consumer = second), for kvxfer's ring and, in the same run\n"
		"  with the same threads and counts, liburcu's cds_wfcq and a mutex+condvar queue; then\n"
		"  the adaptive idle policy's wake-up latency.\n"
		"  -l, --lcores LIST  two lcores, EAL syntax (default: two CPUs that fit this machine);\n"
		"                     -c MASK is accepted too\n"
		"  -n OPS             operations per throughput run (default 500k; k/M/G suffixes)\n"
		"  -D SECONDS         size -n so the slowest queue's run lasts about SECONDS\n"
		"  --reps N           runs per cell, the median is reported (default 3)\n"
		"  --lat-n N          latency round trips per queue (default 10000)\n"
		"  --wake-n N         adaptive wake-ups measured (default 500)\n"
		"  --json FILE        write the same figures as JSON ('-' = stdout)\n");
}

struct opts {
	uint64_t n, lat_n, wake_n;
	unsigned reps;
	double seconds;
	const char *json;
};

static int parse(int argc, char **argv, struct opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *v;
		int r;
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 1;
		}
		if ((r = perf_opt_value(argc, argv, &i, "--json", &v))) {
			if (r < 0)
				goto missing;
			o->json = v;
		} else if ((r = perf_opt_value(argc, argv, &i, "-n", &v))) {
			if (r < 0)
				goto missing;
			if (perf_parse_u64(v, &o->n) || o->n == 0) {
				fprintf(stderr, "kvxfer-perf ring: -n '%s': expected a positive count\n", v);
				return -EINVAL;
			}
		} else if ((r = perf_opt_value(argc, argv, &i, "-D", &v))) {
			if (r < 0)
				goto missing;
			if (perf_parse_seconds(v, &o->seconds)) {
				fprintf(stderr, "kvxfer-perf ring: -D '%s': expected seconds > 0\n", v);
				return -EINVAL;
			}
		} else if ((r = perf_opt_value(argc, argv, &i, "--reps", &v))) {
			uint64_t x;
			if (r < 0)
				goto missing;
			if (perf_parse_u64(v, &x) || x == 0 || x > 99) {
				fprintf(stderr, "kvxfer-perf ring: --reps '%s': expected 1..99\n", v);
				return -EINVAL;
			}
			o->reps = (unsigned)x;
		} else if ((r = perf_opt_value(argc, argv, &i, "--lat-n", &v))) {
			if (r < 0)
				goto missing;
			if (perf_parse_u64(v, &o->lat_n) || o->lat_n == 0) {
				fprintf(stderr, "kvxfer-perf ring: --lat-n '%s': expected a positive count\n", v);
				return -EINVAL;
			}
		} else if ((r = perf_opt_value(argc, argv, &i, "--wake-n", &v))) {
			if (r < 0)
				goto missing;
			if (perf_parse_u64(v, &o->wake_n) || o->wake_n == 0) {
				fprintf(stderr, "kvxfer-perf ring: --wake-n '%s': expected a positive count\n", v);
				return -EINVAL;
			}
		} else {
			fprintf(stderr, "kvxfer-perf ring: unknown option '%s'\n", argv[i]);
			usage(stderr);
			return -EINVAL;
		}
		continue;
missing:
		fprintf(stderr, "kvxfer-perf ring: option %s needs a value\n", argv[i]);
		return -EINVAL;
	}
	return 0;
}

struct cell {
	double mops[Q_KINDS];
	double runs[Q_KINDS][99];
};

static int measure_tput(struct kvx_lcore *a, struct kvx_lcore *b, enum qkind k, unsigned burst,
			uint64_t n, double *mops)
{
	struct queue q;
	int rc = queue_init(&q, k);
	if (rc)
		return rc;
	struct job j = {.fwd = &q, .burst = burst, .n = n};
	rc = run_pair(a, b, tput_producer, tput_consumer, &j);
	queue_fini(&q);
	if (rc)
		return rc;
	if (j.errors) {
		fprintf(stderr, "kvxfer-perf ring: %s burst %u: %lu items out of order or corrupted\n",
			g_qname[k], burst, (unsigned long)j.errors);
		return -EPROTO;
	}
	*mops = (double)n / ((double)(j.t_end - j.t_start) / 1e9) / 1e6;
	return 0;
}

int kvx_perf_ring_main(int argc, char **argv)
{
	static char err[KVX_LCORE_ERRLEN];
	struct kvx_lcore_cfg *cfg = malloc(sizeof(*cfg));
	if (!cfg)
		return 1;
	kvx_lcore_cfg_init(cfg);
	int nargs = kvx_lcore_parse_args(argc, argv, cfg, err, sizeof(err));
	if (nargs < 0) {
		fprintf(stderr, "kvxfer-perf ring: %s\n", err);
		free(cfg);
		return 2;
	}
	struct opts o = {.n = 500000, .lat_n = 10000, .wake_n = 500, .reps = 3};
	int prc = parse(nargs, argv, &o);
	if (prc) {
		free(cfg);
		return prc > 0 ? 0 : 2;
	}
	cfg->control_mode = KVX_LCORE_CONTROL_NONE;
	if (cfg->n_lcores == 0 &&
	    kvx_lcore_cfg_default(cfg, 2, KVX_LCORE_DEFAULT_F_NO_CONTROL, err, sizeof(err))) {
		fprintf(stderr, "kvxfer-perf ring: %s\n", err);
		free(cfg);
		return 2;
	}
	if (kvx_lcore_cfg_validate(cfg, NULL, NULL, err, sizeof(err))) {
		fprintf(stderr, "kvxfer-perf ring: %s\n", err);
		free(cfg);
		return 2;
	}
	if (cfg->n_lcores != 2) {
		fprintf(stderr, "kvxfer-perf ring: needs exactly 2 lcores (producer,consumer), got %u\n",
			cfg->n_lcores);
		free(cfg);
		return 2;
	}
	struct kvx_lcore_set *set;
	int rc = kvx_lcore_set_create(cfg, &set);
	if (rc) {
		fprintf(stderr, "kvxfer-perf ring: cannot start lcores: %s\n", kvx_strerror(rc));
		free(cfg);
		return 1;
	}
	struct kvx_lcore *a = kvx_lcore_set_at(set, 0), *b = kvx_lcore_set_at(set, 1);
	char ca[128], cb[128], model[128];
	kvx_lcore_cpuset_format(&cfg->lcores[0].cpus, ca, sizeof(ca));
	kvx_lcore_cpuset_format(&cfg->lcores[1].cpus, cb, sizeof(cb));
	perf_cpu_model(model, sizeof(model));
	int cpu_a = -1, cpu_b = -1;
	for (int c = 0; c < CPU_SETSIZE && (cpu_a < 0 || cpu_b < 0); c++) {
		if (cpu_a < 0 && CPU_ISSET(c, &cfg->lcores[0].cpus))
			cpu_a = c;
		if (cpu_b < 0 && CPU_ISSET(c, &cfg->lcores[1].cpus))
			cpu_b = c;
	}
	const char *topo = perf_cpu_pair_topology(cpu_a, cpu_b);
	bool shared = CPU_COUNT(&cfg->lcores[0].cpus) > 1 || CPU_COUNT(&cfg->lcores[1].cpus) > 1 ||
		      cpu_a == cpu_b;
	int exit_code = 0;

	if (o.seconds > 0) { /* -D: size -n so the slowest queue's run lasts about SECONDS */
		double slowest = 0;
		for (int k = 0; k < Q_KINDS; k++) {
			double mops;
			if (measure_tput(a, b, (enum qkind)k, 1, 20000, &mops) == 0 &&
			    (slowest == 0 || mops < slowest))
				slowest = mops;
		}
		o.n = (uint64_t)(slowest * 1e6 * o.seconds);
		if (o.n < 1000)
			o.n = 1000;
	}

	printf("kvxfer-perf ring: SPSC queue between two pinned lcores\n");
	printf("  producer lcore %u on CPU %s, consumer lcore %u on CPU %s (%s%s), %s\n",
	       kvx_lcore_id(a), ca, kvx_lcore_id(b), cb, topo,
	       shared ? "; CPUs shared: numbers are not meaningful" : "", model);
	printf("  queues: ring = kvxfer kvx_ring (SP enqueue / SC dequeue, burst API, %u slots)\n"
	       "          wfcq = liburcu cds_wfcq (wait-free enqueue, single-consumer nonblocking dequeue,\n"
	       "                 one node per item, at most %u in flight like the ring)\n"
	       "          mutex = %u-slot array under a pthread mutex + 2 condition variables\n",
	       WINDOW, WINDOW, WINDOW);
	printf("  %lu items per run, median of %u runs; each item is checked for order and content\n\n",
	       (unsigned long)o.n, o.reps);

	/* Throughput. */
	struct cell cells[N_BURSTS];
	memset(cells, 0, sizeof(cells));
	printf("throughput, million items/s (higher is better)\n");
	printf("  %5s  %10s  %10s  %10s  %12s  %12s\n", "burst", "ring", "wfcq", "mutex", "ring/wfcq",
	       "ring/mutex");
	for (int bi = 0; bi < N_BURSTS && !exit_code; bi++) {
		for (unsigned r = 0; r < o.reps && !exit_code; r++) {
			for (int k = 0; k < Q_KINDS; k++) { /* interleaved: drift hits all queues alike */
				rc = measure_tput(a, b, (enum qkind)k, g_bursts[bi], o.n, &cells[bi].runs[k][r]);
				if (rc) {
					exit_code = 1;
					break;
				}
			}
		}
		if (exit_code)
			break;
		for (int k = 0; k < Q_KINDS; k++)
			cells[bi].mops[k] = perf_median_double(cells[bi].runs[k], o.reps);
		printf("  %5u  %10.2f  %10.2f  %10.2f  %11.2fx  %11.2fx\n", g_bursts[bi],
		       cells[bi].mops[Q_RING], cells[bi].mops[Q_WFCQ], cells[bi].mops[Q_MUTEX],
		       cells[bi].mops[Q_RING] / cells[bi].mops[Q_WFCQ],
		       cells[bi].mops[Q_RING] / cells[bi].mops[Q_MUTEX]);
		fflush(stdout);
	}

	/* Latency: ping-pong, one item in flight. */
	struct perf_stats lat_one[Q_KINDS], lat_rtt[Q_KINDS];
	memset(lat_one, 0, sizeof(lat_one));
	memset(lat_rtt, 0, sizeof(lat_rtt));
	if (!exit_code) {
		printf("\none-way latency, ns (ping-pong, one item in flight, %lu round trips;\n"
		       "one-way = consumer's clock minus producer's timestamp, CLOCK_MONOTONIC)\n",
		       (unsigned long)o.lat_n);
		printf("  %-6s  %8s  %8s  %8s  %8s  %10s\n", "queue", "p50", "p90", "p99", "p99.9",
		       "rtt/2 p50");
	}
	for (int k = 0; k < Q_KINDS && !exit_code; k++) {
		struct queue f, bq;
		uint64_t *one = calloc(o.lat_n, sizeof(uint64_t));
		uint64_t *rtt = calloc(o.lat_n, sizeof(uint64_t));
		if (!one || !rtt || queue_init(&f, (enum qkind)k) || queue_init(&bq, (enum qkind)k)) {
			fprintf(stderr, "kvxfer-perf ring: out of memory\n");
			exit_code = 1;
			free(one);
			free(rtt);
			break;
		}
		struct job j = {.fwd = &f, .back = &bq, .n = o.lat_n, .oneway = one, .rtt = rtt};
		rc = run_pair(a, b, lat_initiator, lat_responder, &j);
		queue_fini(&f);
		queue_fini(&bq);
		if (rc || j.errors) {
			fprintf(stderr, "kvxfer-perf ring: %s latency run failed (%lu bad replies)\n",
				g_qname[k], (unsigned long)j.errors);
			exit_code = 1;
		} else {
			perf_stats_u64(one, o.lat_n, &lat_one[k]);
			perf_stats_u64(rtt, o.lat_n, &lat_rtt[k]);
			printf("  %-6s  %8lu  %8lu  %8lu  %8lu  %10lu\n", g_qname[k],
			       (unsigned long)lat_one[k].p50, (unsigned long)lat_one[k].p90,
			       (unsigned long)lat_one[k].p99, (unsigned long)lat_one[k].p999,
			       (unsigned long)(lat_rtt[k].p50 / 2));
		}
		free(one);
		free(rtt);
	}

	/* Adaptive idle wake-up latency. */
	struct perf_stats wake_st;
	memset(&wake_st, 0, sizeof(wake_st));
	if (!exit_code) {
		struct wake w = {.cons = b, .n = o.wake_n};
		struct kvx_ring_params p = {.name = "wake", .count = 64};
		w.samples = calloc(o.wake_n, sizeof(uint64_t));
		struct kvx_poller *pl = NULL;
		rc = w.samples ? kvx_ring_create(&p, &w.r) : -ENOMEM;
		if (!rc) {
			kvx_ring_set_waiter(w.r, kvx_lcore_waiter(b));
			struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE};
			rc = kvx_lcore_set_idle(b, &ip);
		}
		if (!rc)
			rc = kvx_poller_register(b, wake_poller, &w, "wake", &pl);
		if (!rc)
			rc = kvx_lcore_launch(b, kvx_lcore_poll_loop, NULL);
		if (!rc) {
			rc = kvx_lcore_launch(a, wake_producer, &w);
			int prc2 = rc ? rc : kvx_lcore_wait(a);
			kvx_lcore_stop(b);
			kvx_lcore_wait(b);
			rc = prc2;
		}
		if (pl)
			kvx_poller_unregister(pl);
		struct kvx_lcore_stats st;
		kvx_lcore_stats_get(b, &st);
		if (rc) {
			fprintf(stderr, "kvxfer-perf ring: adaptive wake-up run failed: %s\n", kvx_strerror(rc));
			exit_code = 1;
		} else {
			perf_stats_u64(w.samples, o.wake_n, &wake_st);
			printf("\nadaptive idle wake-up latency, ns (consumer asleep in ppoll on its eventfd;\n"
			       "producer enqueues with a timestamp; %lu wake-ups, %lu eventfd wakes)\n",
			       (unsigned long)o.wake_n, (unsigned long)st.wakeups);
			printf("  %8s  %8s  %8s  %8s  %8s\n", "min", "p50", "p90", "p99", "max");
			printf("  %8lu  %8lu  %8lu  %8lu  %8lu\n", (unsigned long)wake_st.min,
			       (unsigned long)wake_st.p50, (unsigned long)wake_st.p90,
			       (unsigned long)wake_st.p99, (unsigned long)wake_st.max);
		}
		kvx_ring_destroy(w.r);
		free(w.samples);
	}

	bool met_wfcq = false, met_mutex = false;
	if (!exit_code) {
		double rw = cells[2].mops[Q_RING] / cells[2].mops[Q_WFCQ];
		double rm = cells[2].mops[Q_RING] / cells[2].mops[Q_MUTEX];
		met_wfcq = rw >= 3.0;
		met_mutex = rm >= 10.0;
		printf("\ntarget (SPSC, burst 32): ring >= 3x wfcq: %.2fx %s; ring >= 10x mutex: %.2fx %s\n", rw,
		       met_wfcq ? "MET" : "NOT MET", rm, met_mutex ? "MET" : "NOT MET");
	}

	if (o.json && !exit_code) {
		struct perf_json j;
		rc = perf_json_open(&j, o.json);
		if (rc) {
			fprintf(stderr, "kvxfer-perf ring: --json %s: %s\n", o.json, kvx_strerror(rc));
			exit_code = 1;
		} else {
			perf_json_str(&j, "command", "ring");
			perf_json_obj_begin(&j, "setup");
			perf_json_u64(&j, "producer_lcore", kvx_lcore_id(a));
			perf_json_str(&j, "producer_cpus", ca);
			perf_json_u64(&j, "consumer_lcore", kvx_lcore_id(b));
			perf_json_str(&j, "consumer_cpus", cb);
			perf_json_str(&j, "topology", topo);
			perf_json_bool(&j, "cpus_shared", shared);
			perf_json_str(&j, "cpu_model", model);
			perf_json_u64(&j, "window", WINDOW);
			perf_json_u64(&j, "ops", o.n);
			perf_json_u64(&j, "reps", o.reps);
			perf_json_obj_end(&j);
			perf_json_arr_begin(&j, "throughput");
			for (int bi = 0; bi < N_BURSTS; bi++) {
				perf_json_obj_begin(&j, NULL);
				perf_json_u64(&j, "burst", g_bursts[bi]);
				for (int k = 0; k < Q_KINDS; k++) {
					char key[32];
					snprintf(key, sizeof(key), "%s_mops", g_qname[k]);
					perf_json_double(&j, key, cells[bi].mops[k]);
				}
				perf_json_double(&j, "ratio_vs_wfcq", cells[bi].mops[Q_RING] / cells[bi].mops[Q_WFCQ]);
				perf_json_double(&j, "ratio_vs_mutex",
						 cells[bi].mops[Q_RING] / cells[bi].mops[Q_MUTEX]);
				perf_json_obj_end(&j);
			}
			perf_json_arr_end(&j);
			perf_json_obj_begin(&j, "latency_oneway_ns");
			for (int k = 0; k < Q_KINDS; k++)
				perf_json_stats(&j, g_qname[k], &lat_one[k]);
			perf_json_obj_end(&j);
			perf_json_obj_begin(&j, "latency_rtt_ns");
			for (int k = 0; k < Q_KINDS; k++)
				perf_json_stats(&j, g_qname[k], &lat_rtt[k]);
			perf_json_obj_end(&j);
			perf_json_stats(&j, "adaptive_wakeup_ns", &wake_st);
			perf_json_obj_begin(&j, "target_burst32");
			perf_json_bool(&j, "ring_3x_wfcq", met_wfcq);
			perf_json_bool(&j, "ring_10x_mutex", met_mutex);
			perf_json_obj_end(&j);
			if (perf_json_close(&j)) {
				fprintf(stderr, "kvxfer-perf ring: writing %s failed\n", o.json);
				exit_code = 1;
			}
		}
	}
	kvx_lcore_set_destroy(set);
	free(cfg);
	return exit_code;
}
