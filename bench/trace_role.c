/* SPDX-License-Identifier: Apache-2.0 */
/* Producer / consumer role process of `kvxfer-perf trace` (see trace_replay.h): one kvxfer
 * engine, a KV pool laid out like the model's cache, a block-id allocator, and the request
 * lifecycle driven exactly as an inference engine drives include/kvxfer/engine.h. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"
#include "trace_cma.h"
#include "trace_tcp_peer.h"
#include "trace_pattern.h"
#include "trace_net.h"
#include "trace_pool.h"
#include "trace_replay.h"

enum rx_state {
	RX_FREE = 0,
	RX_WAIT_POOL,  /* queued: not enough free blocks yet */
	RX_FILLING,    /* WRITE producer: computing (filling) layers one by one */
	RX_SUBMITTED,  /* handed to the engine, waiting for completions */
};

struct rx {
	enum rx_state st;
	uint64_t idx, blocks, hit;
	uint64_t seq;          /* arrival order, for the FIFO pool queue */
	uint32_t *ids;         /* local block ids */
	uint64_t nids;
	uint32_t *remote;      /* READ consumer: producer ids to read (suffix) */
	uint64_t nremote;
	uint32_t next_layer;
	uint64_t t_recv, t_first_layer;
	bool poll_first_layer;
	bool got_xfer, got_released;
	bool got_read;         /* READ consumer: the producer's ids arrived */
	int status;
	uint64_t bytes, elapsed_ns;
	char tid[32];
};

struct role {
	const struct trace_opts *o;
	int fd;
	enum trace_role r;
	struct perf_model m;
	struct kvx_engine *e;
	struct perf_pool *pool;
	uint64_t nb, block_len, layer_bytes;
	unsigned char **layer;
	struct kvx_mem *dev;      /* --mem hip|hostdev: the pools' device memory; NULL = host */
	enum kvx_engine_mem mem;  /* how the layers are registered */
	int device_id;
	unsigned char *scratch;   /* device pools: one block in host memory, Array[block_len] */
	struct kvx_engine_peer peer;
	char peer_host[64];
	bool have_peer;
	struct rx *rx;
	size_t nrx;
	uint64_t seq;
	uint64_t verify_bad;
	bool first_layer_unsupported;
	bool quit;
	int result_rc;            /* --server: the run's exit code, from the driver's RESULT */
	uint64_t cpu0_proc, cpu0_main; /* process and main-thread CPU ns when the role began */
	struct trace_cma_log cma;  /* --peer cma: block ids of every transfer, in start order */
};

static uint64_t cpu_ns(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fatal(struct role *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fatal(struct role *R, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "kvxfer-perf trace (%s): %s\n",
		R->r == TRACE_ROLE_PRODUCER ? "producer" : "consumer", buf);
	trace_msg_send(R->fd, TRACE_MSG_FATAL, buf, strlen(buf) + 1, NULL, 0);
}

static unsigned char *block_ptr(struct role *R, uint32_t layer, uint32_t plane, uint32_t id)
{
	return R->layer[layer] + ((uint64_t)plane * R->nb + id) * R->block_len;
}

/* Fill (producer) the planes of prompt positions [hit, blocks) of one layer (nothing with
 * --no-verify). Device pools are written through a host block and kvx_mem copies (the CPU does
 * not touch device memory). */
static void fill_layer(struct role *R, const struct rx *x, uint32_t layer)
{
	if (!R->o->verify)
		return; /* --no-verify: nothing reads the stamps, and the figure is the engine's alone */
	for (uint64_t pos = x->hit; pos < x->blocks; pos++)
		for (uint32_t p = 0; p < R->m.planes; p++) {
			struct perf_pattern_key k = {.request = x->idx, .layer = layer, .plane = p, .block = pos};
			unsigned char *b = block_ptr(R, layer, p, x->ids[pos]);
			if (R->o->verify == 2)
				perf_pattern_fill(R->dev ? R->scratch : b, R->block_len, &k);
			else /* per-page stamps: what the default check reads */
				perf_pattern_stamp(R->dev ? R->scratch : b, R->block_len, &k);
			if (R->dev && kvx_mem_copy_sync(R->dev, b, R->scratch, R->block_len, KVX_MEM_H2D))
				fatal(R, "%s: filling layer %u on the device failed", x->tid, layer);
		}
}

/* A block's bytes for checking: the block itself, or (device pools) a host copy of it. */
static const unsigned char *block_read(struct role *R, uint32_t layer, uint32_t plane, uint32_t id)
{
	unsigned char *b = block_ptr(R, layer, plane, id);
	if (!R->dev)
		return b;
	if (kvx_mem_copy_sync(R->dev, R->scratch, b, R->block_len, KVX_MEM_D2H))
		return NULL;
	return R->scratch;
}

/* Verify (consumer) every transferred plane; returns the number of bad planes. */
static uint64_t verify_rx(struct role *R, const struct rx *x, char *detail, size_t dlen)
{
	uint64_t bad = 0;
	for (uint32_t l = 0; l < R->m.num_layers; l++)
		for (uint64_t i = 0; i < x->nids; i++)
			for (uint32_t p = 0; p < R->m.planes; p++) {
				struct perf_pattern_key k = {.request = x->idx, .layer = l, .plane = p,
							     .block = x->hit + i};
				size_t off = 0;
				const unsigned char *b = block_read(R, l, p, x->ids[i]);
				bool ok = b && (R->o->verify == 2 ? perf_pattern_check(b, R->block_len, &k, &off)
								    : perf_pattern_check_stamps(b, R->block_len, &k, &off));
				if (ok)
					continue;
				if (bad++ == 0)
					snprintf(detail, dlen,
						 "%s: layer %u %s block %" PRIu64 " (local id %u) differs at byte %zu",
						 x->tid, l, R->m.mla ? "latent" : (p ? "V" : "K"), x->hit + i,
						 x->ids[i], off);
			}
	return bad;
}

/* Progress of making the KV pool resident, on stderr (not with --quiet): one line rewritten
 * in place on a terminal, else a line at every tenth of the layers. */
static void resident_progress(const struct role *R, uint32_t done)
{
	const uint32_t n = R->m.num_layers;
	if (R->o->quiet || n == 0)
		return;
	bool tty = isatty(2);
	if (!tty && done != n && done * 10 / n == (done - 1) * 10 / n)
		return;
	const double gib = (double)(1ull << 30);
	fprintf(stderr, "%s%s: making the KV pool resident: %u/%u layers, %.2f of %.2f GiB%s", tty ? "\r" : "",
		R->r == TRACE_ROLE_PRODUCER ? "producer" : "consumer", done, n, (double)R->layer_bytes * done / gib,
		(double)R->layer_bytes * n / gib, !tty || done == n ? "\n" : "");
}

#define HUGE_2M (2ull << 20)

/*
 * One layer of a host KV pool: @p len bytes, resident on return (*out), unmapped with
 * munmap(*out, len). With @p huge the mapping starts on a 2 MiB boundary and is advised
 * MADV_HUGEPAGE, so that transparent huge pages back it where the kernel allows them
 * (/sys/kernel/mm/transparent_hugepage/enabled "madvise" or "always"), as a serving engine's
 * KV cache usually is. The copies of a tcp or shm transfer then walk one TLB entry per 2 MiB
 * instead of per 4 KiB (docs/performance.md §11). 0 or -errno.
 */
static int host_layer_map(uint64_t len, bool huge, void **out)
{
	uint64_t extra = huge ? HUGE_2M : 0;
	unsigned char *m = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return -errno;
	if (huge) {
		unsigned char *a = (unsigned char *)(((uintptr_t)m + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
		if (a > m)
			munmap(m, (size_t)(a - m));
		if (a + len < m + len + extra)
			munmap(a + len, (size_t)(m + len + extra - (a + len)));
		m = a;
		/* Advice only: a kernel without THP keeps 4 KiB pages, which the summary shows. */
		(void)madvise(m, len, MADV_HUGEPAGE);
	}
	/* A write per page backs it (a huge page at its first 4 KiB) and takes the first-access
	 * fault here, which a hypervisor with shadow page tables charges on top (several s/GB). */
	long pg = sysconf(_SC_PAGESIZE);
	for (uint64_t off = 0; off < len; off += (uint64_t)(pg > 0 ? pg : 4096))
		((volatile unsigned char *)m)[off] = 0;
	*out = m;
	return 0;
}

/* Bytes of this process's anonymous memory backed by transparent huge pages (AnonHugePages of
 * /proc/self/smaps_rollup), 0 when unknown. */
static uint64_t anon_huge_bytes(void)
{
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	if (!f)
		return 0;
	char line[256];
	unsigned long long kib = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "AnonHugePages: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return (uint64_t)kib << 10;
}

static struct rx *rx_get(struct role *R, uint64_t idx)
{
	for (size_t i = 0; i < R->nrx; i++)
		if (R->rx[i].st != RX_FREE && R->rx[i].idx == idx)
			return &R->rx[i];
	return NULL;
}

static struct rx *rx_new(struct role *R, uint64_t idx, uint64_t blocks, uint64_t hit)
{
	if (rx_get(R, idx))
		return NULL;
	for (size_t i = 0; i < R->nrx; i++) {
		struct rx *x = &R->rx[i];
		if (x->st != RX_FREE)
			continue;
		memset(x, 0, sizeof(*x));
		x->st = RX_WAIT_POOL;
		x->idx = idx;
		x->blocks = blocks;
		x->hit = hit;
		x->seq = R->seq++;
		x->t_recv = kvx_now_ns();
		trace_xfer_id(idx, x->tid, sizeof(x->tid));
		return x;
	}
	return NULL;
}

static void rx_finish(struct role *R, struct rx *x, const char *detail)
{
	if (x->nids && perf_pool_free(R->pool, x->ids, x->nids))
		fatal(R, "%s: block ids rejected by the pool on free (double free)", x->tid);
	struct trace_msg_done d = {
		.idx = x->idx,
		.status = x->status,
		.bytes = x->bytes,
		.first_layer_ns = x->t_first_layer ? x->t_first_layer - x->t_recv : 0,
		.elapsed_ns = x->elapsed_ns,
	};
	if (detail)
		snprintf(d.detail, sizeof(d.detail), "%s", detail);
	free(x->ids);
	free(x->remote);
	x->ids = x->remote = NULL;
	x->st = RX_FREE;
	if (trace_msg_send(R->fd, TRACE_MSG_DONE, &d, sizeof(d), NULL, 0))
		R->quit = true;
}

static int cpl_errno(const struct kvx_completion *c)
{
	switch (c->status) {
	case KVX_CPL_DONE:
		return 0;
	case KVX_CPL_ABORTED:
		return -ECANCELED;
	case KVX_CPL_TIMED_OUT:
		return -ETIMEDOUT;
	case KVX_CPL_FAILED:
		break;
	}
	return c->error ? c->error : -EIO;
}

/* Try to start the oldest queued request (FIFO: a large request is not starved). */
static void start_queued(struct role *R)
{
	for (;;) {
		struct rx *x = NULL;
		for (size_t i = 0; i < R->nrx; i++)
			if (R->rx[i].st == RX_WAIT_POOL && (!x || R->rx[i].seq < x->seq))
				x = &R->rx[i];
		if (!x)
			return;
		if (R->r == TRACE_ROLE_CONSUMER && !R->o->write_mode && !x->got_read)
			return; /* READ consumer: reads only what the producer serves */
		uint64_t want = R->r == TRACE_ROLE_PRODUCER ? x->blocks : x->blocks - x->hit;
		x->ids = malloc((want ? want : 1) * sizeof(*x->ids));
		if (!x->ids) {
			fatal(R, "out of memory");
			R->quit = true;
			return;
		}
		int rc = perf_pool_alloc(R->pool, want, x->ids);
		if (rc == -ENOBUFS) {
			free(x->ids);
			x->ids = NULL;
			return; /* pool exhausted: wait for a transfer to release its blocks */
		}
		if (rc) {
			fatal(R, "%s needs %" PRIu64 " blocks, the pool has %" PRIu64, x->tid, want,
			      perf_pool_size(R->pool));
			R->quit = true;
			return;
		}
		x->nids = want;
		if (R->o->peer && trace_cma_log_add(&R->cma, x->idx, x->ids, x->nids)) {
			fatal(R, "out of memory");
			R->quit = true;
			return;
		}
		if (R->r == TRACE_ROLE_PRODUCER) {
			if (R->o->write_mode) {
				struct kvx_engine_write w = {.transfer_id = x->tid, .peer = R->peer,
							     .local_blocks = x->ids, .n = x->nids};
				rc = kvx_xfer_write_begin(R->e, &w);
				x->st = RX_FILLING;
			} else {
				for (uint32_t l = 0; l < R->m.num_layers; l++)
					fill_layer(R, x, l);
				struct kvx_engine_serve s = {.transfer_id = x->tid, .local_blocks = x->ids,
							     .n = x->nids};
				rc = kvx_xfer_serve(R->e, &s);
				x->st = RX_SUBMITTED;
				if (!rc) {
					struct trace_msg_blocks b = {.idx = x->idx, .blocks = x->blocks,
								     .hit_blocks = x->hit, .n = x->nids};
					if (trace_msg_send(R->fd, TRACE_MSG_SERVED, &b, sizeof(b), x->ids,
							   x->nids * sizeof(uint32_t)))
						R->quit = true;
				}
			}
		} else if (R->o->write_mode) {
			struct kvx_engine_announce a = {.transfer_id = x->tid, .peer = R->peer,
							.local_blocks = x->ids, .n = x->nids};
			rc = kvx_xfer_announce(R->e, &a);
			x->st = RX_SUBMITTED;
		} else {
			struct kvx_engine_read rd = {.transfer_id = x->tid, .peer = R->peer,
						     .local_blocks = x->ids, .remote_blocks = x->remote,
						     .n = x->nids};
			rc = kvx_xfer_read(R->e, &rd);
			x->st = RX_SUBMITTED;
			x->poll_first_layer = x->nids > 0 && !R->first_layer_unsupported;
		}
		if (rc) {
			/* Rejected at submission: nothing is in flight, the blocks go straight back. */
			char d[160];
			snprintf(d, sizeof(d), "%s: engine rejected the submission: %s", x->tid,
				 kvx_strerror(rc));
			x->status = rc;
			rx_finish(R, x, d);
		}
	}
}

/* WRITE producer: compute one layer of the oldest filling request. */
static bool fill_step(struct role *R)
{
	struct rx *x = NULL;
	for (size_t i = 0; i < R->nrx; i++)
		if (R->rx[i].st == RX_FILLING && (!x || R->rx[i].seq < x->seq))
			x = &R->rx[i];
	if (!x)
		return false;
	uint32_t l = x->next_layer++;
	fill_layer(R, x, l);
	if (R->o->layer_us) {
		struct timespec ts = {.tv_sec = R->o->layer_us / 1000000u,
				      .tv_nsec = (long)(R->o->layer_us % 1000000u) * 1000};
		nanosleep(&ts, NULL);
	}
	int rc = kvx_xfer_layer_ready(R->e, x->tid, l, NULL);
	if (rc == 0 && l == 0 && !R->first_layer_unsupported)
		x->poll_first_layer = true;
	if (rc == 0 && x->next_layer == R->m.num_layers) {
		rc = kvx_xfer_seal(R->e, x->tid, R->m.num_layers);
		x->st = RX_SUBMITTED;
	}
	if (rc) {
		/* The engine owns the transfer now: abort it and wait for its completions. */
		fprintf(stderr, "kvxfer-perf trace (producer): %s layer %u: %s; aborting it\n", x->tid,
			l, kvx_strerror(rc));
		x->st = RX_SUBMITTED;
		kvx_xfer_abort(R->e, x->tid);
	}
	return true;
}

static void poll_first_layers(struct role *R)
{
	for (size_t i = 0; i < R->nrx; i++) {
		struct rx *x = &R->rx[i];
		if (x->st == RX_FREE || !x->poll_first_layer)
			continue;
		int rc = kvx_xfer_layer_poll(R->e, x->tid, 0);
		if (rc == 1) {
			x->t_first_layer = kvx_now_ns();
			x->poll_first_layer = false;
		} else if (rc == -EBUSY || rc == -ENOTSUP || (rc == -ENOENT && !x->got_xfer)) {
			/* This role/mode has no per-layer completion in this engine build. */
			R->first_layer_unsupported = true;
			x->poll_first_layer = false;
		} else if (rc < 0) {
			x->poll_first_layer = false;
		}
	}
}

/*
 * Why transfer @p x failed on this role, for the driver's "failure detail" line. A timeout says
 * what timed out, after how long, and which option sets the deadline.
 */
static void fail_detail(const struct role *R, const struct rx *x, char *d, size_t dlen)
{
	const char *who = R->r == TRACE_ROLE_PRODUCER ? "producer" : "consumer";
	uint32_t t = R->o->timeout_ms;
	if (x->status != -ETIMEDOUT) {
		snprintf(d, dlen, "%s: %s: %s", x->tid, who, kvx_strerror(x->status));
		return;
	}
	unsigned long long ms = (unsigned long long)(x->elapsed_ns / 1000000u);
	if (R->r == TRACE_ROLE_PRODUCER)
		/* P's engine deadlines: transfer_timeout = --timeout-ms, defer_timeout (waiting for
		 * the consumer's remote_blocks / release) = 2 x --timeout-ms (setup_engine()). */
		snprintf(d, dlen, "%.31s: producer: timed out after %llu ms (deadline --timeout-ms %u, 2x "
				  "when waiting for the consumer); raise --timeout-ms", x->tid, ms, t);
	else
		snprintf(d, dlen, "%.31s: consumer: timed out after %llu ms (deadline --timeout-ms %u per "
				  "transfer); raise --timeout-ms", x->tid, ms, t);
}

static void handle_cpl(struct role *R, const struct kvx_completion *c)
{
	uint64_t idx;
	struct rx *x = NULL;
	if (trace_xfer_id_parse(c->transfer_id, &idx) == 0)
		x = rx_get(R, idx);
	if (!x || (x->st != RX_SUBMITTED && x->st != RX_FILLING)) {
		fprintf(stderr, "kvxfer-perf trace: completion for unknown transfer '%s' (kind %d)\n",
			c->transfer_id, (int)c->kind);
		return;
	}
	/* Terminal while the producer was still computing layers (timeout, peer abort): stop. */
	x->st = RX_SUBMITTED;
	if (c->kind == KVX_CPL_TRANSFER) {
		if (x->got_xfer)
			return;
		x->got_xfer = true;
		x->status = cpl_errno(c);
		x->bytes = c->bytes;
		x->elapsed_ns = kvx_now_ns() - x->t_recv;
		/* A full prefix hit ends with `release` and no data: the producer's transfer may
		 * terminate as aborted; that is the protocol's expected outcome (docs/protocol.md §5.7). */
		if (R->r == TRACE_ROLE_PRODUCER && x->hit == x->blocks && x->status == -ECANCELED)
			x->status = 0;
	} else if (c->kind == KVX_CPL_BLOCKS_RELEASED) {
		x->got_released = true;
	}
	if (x->poll_first_layer && x->got_xfer && x->status == 0) {
		/* Terminal before we saw layer 0 alone: layer 0 landed no later than now. */
		x->t_first_layer = kvx_now_ns();
		x->poll_first_layer = false;
	}
	if (R->r == TRACE_ROLE_PRODUCER) {
		if (x->got_xfer && x->got_released) {
			char d[160];
			fail_detail(R, x, d, sizeof(d));
			rx_finish(R, x, x->status ? d : NULL);
		}
		return;
	}
	/* consumer */
	if (!x->got_xfer)
		return;
	if (x->status == 0) {
		char detail[160] = "";
		if (R->o->verify) {
			uint64_t bad = verify_rx(R, x, detail, sizeof(detail));
			if (bad) {
				R->verify_bad += bad;
				x->status = -EIO;
			}
		}
		rx_finish(R, x, x->status ? detail : NULL);
	} else if (x->got_released || x->nids == 0) {
		char d[160];
		fail_detail(R, x, d, sizeof(d));
		rx_finish(R, x, d);
	}
}

static void handle_msg(struct role *R, const struct trace_msg_hdr *h, void *p)
{
	switch (h->type) {
	case TRACE_MSG_PEER: {
		if (h->len != sizeof(struct trace_msg_peer))
			break;
		const struct trace_msg_peer *pm = p;
		snprintf(R->peer_host, sizeof(R->peer_host), "%s", pm->host);
		R->peer = (struct kvx_engine_peer){.host = R->peer_host,
						   .handshake_port = pm->handshake_port,
						   .notify_port = pm->notify_port};
		R->have_peer = true;
		/* --server, WRITE: this producer dials the consumer (handshake, then write_done to its
		 * notify port). Find out now, naming the listener, rather than as transfer timeouts. */
		if (R->o->server && R->o->write_mode) {
			static const char *const what[2] = {"the consumer's handshake listener",
							    "the consumer's notify listener"};
			uint16_t ports[2] = {pm->handshake_port, pm->notify_port};
			for (int i = 0; i < 2; i++) {
				char why[384];
				int fd = trace_net_connect(pm->host, ports[i], R->o->connect_timeout_ms, what[i],
							   why, sizeof(why));
				if (fd < 0) {
					fatal(R, "%s; open that port on the consumer host (its --port-range), "
						 "or give the consumer a --host this host can reach", why);
					R->quit = true;
					R->result_rc = 1;
					return;
				}
				close(fd);
			}
		}
		return;
	}
	case TRACE_MSG_RESULT: {
		/* --server: the driver's summary of the run, printed here too, and its exit code. */
		if (h->len < sizeof(int32_t))
			break;
		int32_t rc;
		memcpy(&rc, p, sizeof(rc));
		R->result_rc = rc;
		fwrite((const char *)p + sizeof(rc), 1, h->len - sizeof(rc), stdout);
		fflush(stdout);
		return;
	}
	case TRACE_MSG_REQ: {
		if (h->len != sizeof(struct trace_msg_req) || !R->have_peer)
			break;
		const struct trace_msg_req *q = p;
		if (q->hit_blocks > q->blocks || !rx_new(R, q->idx, q->blocks, q->hit_blocks)) {
			fatal(R, "bad or duplicate request tx-%06" PRIu64, q->idx);
			R->quit = true;
		}
		return;
	}
	case TRACE_MSG_READ: {
		const struct trace_msg_blocks *b = p;
		if (h->len < sizeof(*b) || h->len != sizeof(*b) + b->n * sizeof(uint32_t))
			break;
		struct rx *x = rx_get(R, b->idx);
		if (!x || x->st != RX_WAIT_POOL || x->got_read || b->n + b->hit_blocks != x->blocks) {
			fatal(R, "READ for tx-%06" PRIu64 " does not match its request", b->idx);
			R->quit = true;
			return;
		}
		/* docs/protocol.md §6 item 8: with c cached blocks read remote[c : c + len(local)]. */
		x->nremote = b->n;
		x->got_read = true;
		x->remote = malloc((b->n ? b->n : 1) * sizeof(uint32_t));
		if (!x->remote) {
			R->quit = true;
			return;
		}
		memcpy(x->remote, (const uint32_t *)(b + 1), b->n * sizeof(uint32_t));
		return;
	}
	case TRACE_MSG_STATS_REQ: {
		struct kvx_engine_stats st;
		kvx_engine_get_stats(R->e, &st);
		/* Control messages = notifications (remote_blocks, write_done, release); dropped =
		 * notifications that arrived for an already terminal transfer. */
		struct trace_msg_stats s = {.lcore_util = -1, .ctl_sent = st.notifications_sent,
					    .ctl_recv = st.notifications_received,
					    .ctl_dropped = st.late_notifications,
					    .verify_bad = R->verify_bad,
					    .pool_exhausted = perf_pool_exhausted(R->pool)};
		for (uint32_t i = 0; i < st.n_lcores && s.n_lcores < KVX_ARRAY_SIZE(s.lcore_bytes); i++)
			s.lcore_bytes[s.n_lcores++] = st.lcores[i].bytes;
		if (st.n_lcores) {
			double u = 0;
			for (uint32_t i = 0; i < st.n_lcores; i++)
				u += st.lcores[i].utilization;
			s.lcore_util = u / st.n_lcores;
		}
		s.transfers_failed = st.transfers_failed + st.transfers_aborted + st.transfers_timed_out;
		uint64_t proc = cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - R->cpu0_proc;
		uint64_t main_t = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - R->cpu0_main;
		s.engine_cpu_s = proc > main_t ? (double)(proc - main_t) / 1e9 : 0.0;
		snprintf(s.transport, sizeof(s.transport), "%s", kvx_engine_transport_name(R->e));
		if (trace_msg_send(R->fd, TRACE_MSG_STATS, &s, sizeof(s), NULL, 0))
			R->quit = true;
		return;
	}
	case TRACE_MSG_CMA_INFO_REQ:
	case TRACE_MSG_CMA_RUN:
	case TRACE_MSG_TCP_RECV:
	case TRACE_MSG_TCP_SEND: {
		if (!R->o->peer || R->dev)
			break;
		/* The replay is over (its counters went out with STATS): stop the pollers, so that
		 * busy-idle lcores do not spin beside the reference loop and slow it down. */
		if (R->e)
			kvx_engine_stop(R->e);
		struct trace_cma_pool pool = {.layers = R->m.num_layers, .planes = R->m.planes,
					      .nb = R->nb, .block_len = R->block_len, .layer = R->layer};
		bool producer = R->r == TRACE_ROLE_PRODUCER, initiator = producer == R->o->write_mode;
		if (h->type == TRACE_MSG_TCP_RECV || h->type == TRACE_MSG_TCP_SEND) {
			if (R->o->peer != TRACE_PEER_TCP || (h->type == TRACE_MSG_TCP_SEND) != producer)
				break;
			struct trace_cma_result res;
			if (h->type == TRACE_MSG_TCP_SEND) {
				struct trace_tcp_send ts = {0};
				if (h->len >= sizeof(ts))
					memcpy(&ts, p, sizeof(ts));
				trace_tcp_peer_send(ts.port, &R->cma, &pool, initiator,
						    h->len >= sizeof(ts) ? (const unsigned char *)p + sizeof(ts) : NULL,
						    h->len >= sizeof(ts) ? h->len - sizeof(ts) : 0, &res);
			} else {
				uint32_t port = 0;
				int lfd = trace_tcp_peer_listen(&port);
				if (trace_msg_send(R->fd, TRACE_MSG_TCP_PORT, &port, sizeof(port), NULL, 0)) {
					R->quit = true;
					if (lfd >= 0)
						close(lfd);
					return;
				}
				if (lfd < 0) {
					memset(&res, 0, sizeof(res));
					res.status = lfd;
				} else {
					trace_tcp_peer_recv(lfd, &R->cma, &pool, initiator, p, h->len, &res);
					close(lfd);
				}
			}
			if (trace_msg_send(R->fd, TRACE_MSG_CMA_RESULT, &res, sizeof(res), NULL, 0))
				R->quit = true;
			return;
		}
		if (h->type == TRACE_MSG_CMA_RUN) {
			if (R->o->peer != TRACE_PEER_CMA)
				break;
			struct trace_cma_result res;
			trace_cma_run(&R->cma, &pool, R->o->write_mode, p, h->len, &res);
			if (trace_msg_send(R->fd, TRACE_MSG_CMA_RESULT, &res, sizeof(res), NULL, 0))
				R->quit = true;
			return;
		}
		/* The initiator role is our sibling, not our ancestor: let it attach (Yama). */
		if (R->o->peer == TRACE_PEER_CMA)
			prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
		void *info = NULL;
		size_t len = 0;
		if (trace_cma_info_pack(&R->cma, &pool, getpid(), &info, &len) ||
		    trace_msg_send(R->fd, TRACE_MSG_CMA_INFO, info, len, NULL, 0))
			R->quit = true;
		free(info);
		return;
	}
	case TRACE_MSG_QUIT:
		R->quit = true;
		return;
	default:
		break;
	}
	fatal(R, "unexpected driver message type %u (%u bytes)", h->type, h->len);
	R->quit = true;
}

static int setup_engine(struct role *R)
{
	const struct trace_opts *o = R->o;
	char err[256] = "";
	struct kvx_engine_params p;
	kvx_engine_params_init(&p);
	p.role = R->r == TRACE_ROLE_PRODUCER ? KVX_SCHED_PRODUCER : KVX_SCHED_CONSUMER;
	p.mode = o->write_mode ? KVX_SCHED_MODE_WRITE : KVX_SCHED_MODE_READ;
	p.transport = o->transport;
	p.lcores = o->lcores;
	p.control_lcore = o->control_lcore;
	p.idle = o->idle_busy ? KVX_ENGINE_IDLE_BUSY : KVX_ENGINE_IDLE_ADAPTIVE;
	p.spread = o->no_spread ? KVX_ENGINE_SPREAD_NONE : KVX_ENGINE_SPREAD_LAYERS;
	p.follow_waker = !o->no_follow;
	p.poller_slice_us = o->slice_us;
	p.host = o->host;
	/* --port-range: fixed ports a firewall can open; else kernel-chosen ones. */
	p.handshake_port = o->port_lo;
	p.notify_port = o->port_lo ? (uint16_t)(o->port_lo + 1) : 0;
	p.data_port = o->port_lo ? (uint16_t)(o->port_lo + 2) : 0;
	p.metrics_addr = o->metrics; /* --metrics: Prometheus endpoint of this role's engine */
	p.verbs_device = o->ib_dev;
	p.transfer_timeout_ms = o->timeout_ms;
	p.defer_timeout_ms = 2 * o->timeout_ms;
	p.max_transfers = (uint32_t)R->nrx + 16;
	p.max_blocks = o->max_blocks ? o->max_blocks : (uint32_t)(R->nb < 65536 ? R->nb : 65536);
	p.auth_dir = o->auth_dir;
	int rc = kvx_engine_create(&p, &R->e, err, sizeof(err));
	if (rc) {
		fatal(R, "kvx_engine_create: %s: %s", kvx_strerror(rc), err);
		return rc;
	}
	for (uint32_t l = 0; l < R->m.num_layers; l++) {
		char name[32];
		snprintf(name, sizeof(name), "model.layers.%u.attn", l);
		struct kvx_engine_layer L = {.name = name, .base = R->layer[l], .mem = R->mem,
					     .device_id = R->device_id};
		L.tensor.elem_size = PERF_MODEL_ELEM_BYTES;
		L.spec.block_size = o->block_tokens;
		if (R->m.mla) {
			/* [NB, BS, latent] */
			uint64_t d = R->m.mla_latent_dim;
			L.tensor.ndim = 3;
			uint64_t shape[3] = {R->nb, o->block_tokens, d};
			uint64_t stride[3] = {o->block_tokens * d, d, 1};
			memcpy(L.tensor.shape, shape, sizeof(shape));
			memcpy(L.tensor.stride, stride, sizeof(stride));
			L.spec.is_mla = true;
		} else {
			/* split K/V, NHD: [2, NB, BS, H, HD] */
			uint64_t H = R->m.num_kv_heads, HD = R->m.head_dim, BS = o->block_tokens;
			L.tensor.ndim = 5;
			uint64_t shape[5] = {2, R->nb, BS, H, HD};
			uint64_t stride[5] = {R->nb * BS * H * HD, BS * H * HD, H * HD, HD, 1};
			memcpy(L.tensor.shape, shape, sizeof(shape));
			memcpy(L.tensor.stride, stride, sizeof(stride));
			L.spec.num_kv_heads = (uint32_t)H;
			L.spec.head_size = (uint32_t)HD;
		}
		rc = kvx_engine_register_layer(R->e, &L);
		if (rc < 0) {
			fatal(R, "kvx_engine_register_layer(%s): %s", name, kvx_strerror(rc));
			return rc;
		}
	}
	rc = kvx_engine_start(R->e);
	if (rc) {
		fatal(R, "kvx_engine_start: %s%s%s%s", kvx_strerror(rc), o->ib_dev ? " (-d " : "",
		      o->ib_dev ? o->ib_dev : "", o->ib_dev ? ")" : "");
		return rc;
	}
	char ma[64];
	if (o->metrics && !kvx_engine_metrics_addr(R->e, ma, sizeof(ma)))
		fprintf(stderr, "kvxfer-perf trace: %s metrics at http://%s/metrics\n",
			R->r == TRACE_ROLE_PRODUCER ? "producer" : "consumer", ma);
	return 0;
}

int trace_role_main(const struct trace_opts *o, int fd)
{
	struct role R = {.o = o, .fd = fd, .r = o->role, .nb = o->pool_blocks,
			 .cpu0_proc = cpu_ns(CLOCK_PROCESS_CPUTIME_ID),
			 .cpu0_main = cpu_ns(CLOCK_THREAD_CPUTIME_ID)};
	char err[512] = "";
	int rc = perf_model_find(o->models_csv, o->model, &R.m, err, sizeof(err));
	if (rc) {
		fatal(&R, "%s", err);
		return 1;
	}
	R.block_len = perf_model_block_len(&R.m, o->block_tokens);
	R.layer_bytes = R.block_len * R.m.planes * R.nb;
	R.nrx = (size_t)o->concurrency * 2 + 8;
	R.rx = calloc(R.nrx, sizeof(*R.rx));
	R.layer = calloc(R.m.num_layers, sizeof(*R.layer));
	if (!R.rx || !R.layer || perf_pool_create(R.nb, &R.pool)) {
		fatal(&R, "cannot allocate the pool bookkeeping for %" PRIu64 " blocks", R.nb);
		return 1;
	}
	int exit_code = 1;
	/* The pool is resident before the replay starts, as an engine's KV cache is (allocated at
	 * start-up and pinned by registration): first-touch page faults (slow on VMs) are not
	 * charged to the transfers. */
	uint64_t t_pre = kvx_now_ns();
	R.mem = KVX_ENGINE_MEM_HOST;
	if (o->mem && strcmp(o->mem, "host")) {
		struct kvx_mem_type mt;
		rc = kvx_mem_parse_type(o->mem, &mt);
		if (!rc)
			rc = kvx_mem_open(&mt, &R.dev);
		R.scratch = malloc(R.block_len);
		if (rc || !R.scratch) {
			fatal(&R, "--mem %s: %s", o->mem, rc ? kvx_strerror(rc) : "out of memory");
			goto out;
		}
		R.mem = mt.kind == KVX_MEM_HIP ? KVX_ENGINE_MEM_HIP : KVX_ENGINE_MEM_HOSTDEV;
		R.device_id = mt.device;
	}
	for (uint32_t l = 0; R.dev && l < R.m.num_layers; l++) {
		/* Device pools: allocated (and resident) through kvx_mem; zeroed like fresh pages. */
		void *m = NULL;
		rc = kvx_mem_alloc(R.dev, R.layer_bytes, &m);
		if (rc) {
			fatal(&R, "--mem %s: allocating %" PRIu64 " bytes for layer %u: %s", o->mem, R.layer_bytes, l,
			      kvx_strerror(rc));
			goto out;
		}
		R.layer[l] = m;
		resident_progress(&R, l + 1);
	}
	for (uint32_t l = 0; !R.dev && l < R.m.num_layers; l++) {
		void *m = NULL;
		rc = host_layer_map(R.layer_bytes, !o->no_hugepages, &m);
		if (rc) {
			fatal(&R, "mmap of %" PRIu64 " bytes for layer %u: %s", R.layer_bytes, l, strerror(-rc));
			goto out;
		}
		R.layer[l] = m;
		resident_progress(&R, l + 1);
	}
	uint32_t prefault_ms = (uint32_t)((kvx_now_ns() - t_pre) / 1000000u);
	if (setup_engine(&R))
		goto out;
	struct trace_msg_hello hello = {
		.magic = TRACE_MSG_MAGIC,
		.role = (uint32_t)R.r,
		.write_mode = o->write_mode,
		.pool_blocks = R.nb,
		.block_bytes = perf_model_block_bytes(&R.m, o->block_tokens),
		.num_layers = R.m.num_layers,
		.block_tokens = o->block_tokens,
		.prefault_ms = prefault_ms,
		.huge_bytes = R.dev ? 0 : anon_huge_bytes(),
		.data_port = o->port_lo ? (uint16_t)(o->port_lo + 2) : 0,
	};
	kvx_engine_ports(R.e, &hello.handshake_port, &hello.notify_port);
	snprintf(hello.host, sizeof(hello.host), "%s", o->host);
	snprintf(hello.model, sizeof(hello.model), "%s", R.m.name);
	/* `auto` is resolved per peer at the first handshake (engine.h kvx_engine_transport_name()):
	 * the hello carries the request; STATS carries the provider actually used. */
	snprintf(hello.transport, sizeof(hello.transport), "%s", o->transport);
	if (trace_msg_send(fd, TRACE_MSG_HELLO, &hello, sizeof(hello), NULL, 0))
		goto out;
	unsigned idle_rounds = 0;
	while (!R.quit) {
		bool busy = fill_step(&R);
		struct kvx_completion cpl[32];
		size_t n = kvx_engine_poll_completions(R.e, cpl, KVX_ARRAY_SIZE(cpl));
		for (size_t i = 0; i < n; i++)
			handle_cpl(&R, &cpl[i]);
		poll_first_layers(&R);
		start_queued(&R);
		bool waiting = false;
		for (size_t i = 0; i < R.nrx && !waiting; i++)
			waiting = R.rx[i].st == RX_SUBMITTED || R.rx[i].st == RX_FILLING;
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		/* The worker thread polls completions (the engine offers no completion fd): while
		 * transfers are in flight it waits on the driver channel with a timeout that backs
		 * off from 50 us to 1 ms, so a 2-core machine is not burnt by syscalls; with nothing
		 * in flight it waits up to 50 ms. Latency granularity is therefore <= 1 ms. */
		idle_rounds = (busy || n) ? 0 : idle_rounds + 1;
		long wait_ns = 0;
		if (!busy && !n) {
			unsigned sh = idle_rounds < 5 ? idle_rounds : 5;
			wait_ns = waiting ? (50000L << sh) : 50000000L;
			if (wait_ns > 1000000L && waiting)
				wait_ns = 1000000L;
		}
		int pr = ppoll(&pfd, 1, &(struct timespec){0, wait_ns}, NULL);
		if (pr < 0 && errno != EINTR)
			break;
		if (pr > 0) {
			struct trace_msg_hdr h;
			void *p;
			rc = trace_msg_recv(fd, &h, &p);
			if (rc) {
				fprintf(stderr, "kvxfer-perf trace (%s): driver channel closed: %s\n",
					R.r == TRACE_ROLE_PRODUCER ? "producer" : "consumer",
					kvx_strerror(rc));
				free(p);
				goto out;
			}
			handle_msg(&R, &h, p);
			free(p);
		}
	}
	exit_code = R.result_rc;
out:
	if (R.e)
		kvx_engine_destroy(R.e);
	for (uint32_t l = 0; l < R.m.num_layers && R.layer; l++) {
		if (R.layer[l] && R.dev)
			kvx_mem_free(R.dev, R.layer[l]);
		else if (R.layer[l])
			munmap(R.layer[l], R.layer_bytes);
	}
	kvx_mem_close(R.dev);
	free(R.scratch);
	for (size_t i = 0; i < R.nrx && R.rx; i++) {
		free(R.rx[i].ids);
		free(R.rx[i].remote);
	}
	free(R.rx);
	free(R.layer);
	trace_cma_log_free(&R.cma);
	perf_pool_destroy(R.pool);
	return exit_code;
}
