/* SPDX-License-Identifier: Apache-2.0 */
/* Producer / consumer role of kvx-soak (see soak.h): one kvxfer engine driven only through
 * include/kvxfer/engine.h, a KV pool of split K/V host layers and a block-id allocator.
 * - Producer: fills the request's blocks with the pattern of (request, layer, plane, block
 *   position), then serves them (READ) or writes them (WRITE: write_begin, every layer ready,
 *   seal). Blocks go back to the pool at KVX_CPL_BLOCKS_RELEASED.
 * - Consumer: reads (READ) or announces (WRITE) its blocks; on DONE it checks every byte of
 *   every plane of every block against the pattern and reports the verdict. Free blocks hold a
 *   poison pattern (request SOAK_POISON_REQ, block = block id): it is written when a block
 *   goes back to the pool and checked when it is taken again, so a write that lands in a free
 *   block (a stale or foreign transfer) is reported as well.
 * Every state change is reported to the driver, which keeps the books. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "soak.h"
#include "trace_pattern.h"
#include "trace_pool.h"

#define MAX_RX 256

enum rx_state { RX_FREE = 0, RX_WAIT_POOL, RX_LAYERS, RX_SUBMITTED };

struct rx {
	enum rx_state st;
	uint64_t idx, seq;
	uint32_t blocks;
	uint32_t *ids, *remote;
	uint32_t next_layer; /* WRITE producer: next layer to mark ready */
	bool sealed, got_term, got_rel;
	uint64_t t_term; /* when the terminal completion was polled */
	int status;
	char tid[40];
};

struct role {
	const struct soak_role_opts *o;
	struct kvx_engine *e;
	struct perf_pool *pool;
	unsigned char *layer[SOAK_LAYERS];
	uint64_t layer_bytes;
	struct kvx_engine_peer peer;
	char peer_host[64];
	bool have_peer, quit;
	struct rx rx[MAX_RX];
	uint64_t seq;
};

static void report(struct role *R, uint32_t type, const void *a, size_t alen, const void *b, size_t blen)
{
	if (soak_send(R->o->ctl_fd, type, a, alen, b, blen))
		R->quit = true; /* driver gone */
}

static void fatal(struct role *R, const char *msg)
{
	fprintf(stderr, "kvx-soak %s: %s\n", R->o->producer ? "producer" : "consumer", msg);
	report(R, SOAK_FATAL, msg, strlen(msg) + 1, NULL, 0);
	R->quit = true;
}

static unsigned char *blk(struct role *R, uint32_t l, uint32_t p, uint32_t id)
{
	return R->layer[l] + ((uint64_t)p * R->o->pool_blocks + id) * SOAK_BLOCK_BYTES;
}

static struct perf_pattern_key key_of(uint64_t req, uint32_t l, uint32_t p, uint64_t pos)
{
	return (struct perf_pattern_key){.request = req, .layer = l, .plane = p, .block = pos};
}

static void poison(struct role *R, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < SOAK_LAYERS; l++)
			for (uint32_t p = 0; p < 2; p++) {
				struct perf_pattern_key k = key_of(SOAK_POISON_REQ, l, p, ids[i]);
				perf_pattern_fill(blk(R, l, p, ids[i]), SOAK_BLOCK_BYTES, &k);
			}
}

static void describe(struct role *R, const unsigned char *buf, uint64_t idx, char *d, size_t dlen);

/* Consumer: blocks just taken from the pool must still hold the poison. */
static void check_poison(struct role *R, const struct rx *x)
{
	for (uint32_t i = 0; i < x->blocks; i++)
		for (uint32_t l = 0; l < SOAK_LAYERS; l++)
			for (uint32_t p = 0; p < 2; p++) {
				struct perf_pattern_key k = key_of(SOAK_POISON_REQ, l, p, x->ids[i]);
				size_t off = 0;
				if (perf_pattern_check(blk(R, l, p, x->ids[i]), SOAK_BLOCK_BYTES, &k, &off))
					continue;
				char d[400];
				int n = snprintf(d, sizeof(d), "free block %u (layer %u %s) changed at byte %zu "
						 "while free; found when soak-%" PRIu64 " took it", x->ids[i], l,
						 p ? "V" : "K", off, x->idx);
				if (n > 0 && (size_t)n < sizeof(d))
					describe(R, blk(R, l, p, x->ids[i]), x->idx, d + n, sizeof(d) - (size_t)n);
				report(R, SOAK_FOREIGN, d, strlen(d) + 1, NULL, 0);
				return;
			}
}

/* What a plane that failed its check holds instead, for the CORRUPT line: the poison of a free
 * block (written by no transfer since it was freed), or the pattern of which request, layer,
 * plane and block position (searched among requests near @p idx), or neither. Costs a few
 * million hashes, so only the first bad plane of a transfer is described. */
static void describe(struct role *R, const unsigned char *buf, uint64_t idx, char *d, size_t dlen)
{
	uint64_t w0 = 0;
	memcpy(&w0, buf, sizeof(w0)); /* the pattern's words are little endian, as is this host */
	const uint64_t seed = w0 ^ 0x9E3779B97F4A7C15ull; /* word 0 = seed ^ 1 * PATTERN_MUL */
	for (uint32_t l = 0; l < SOAK_LAYERS; l++)
		for (uint32_t p = 0; p < 2; p++) {
			for (uint32_t id = 0; id < R->o->pool_blocks; id++) {
				struct perf_pattern_key k = key_of(SOAK_POISON_REQ, l, p, id);
				if (perf_pattern_seed(&k) == seed) {
					snprintf(d, dlen, "; holds the free-block poison of id %u layer %u %s", id, l,
						 p ? "V" : "K");
					return;
				}
			}
			uint64_t lo = idx > 20000 ? idx - 20000 : 0;
			for (uint64_t r = lo; r < idx + 2000; r++)
				for (uint32_t b = 0; b < R->o->max_blocks; b++) {
					struct perf_pattern_key k = key_of(r, l, p, b);
					if (perf_pattern_seed(&k) != seed)
						continue;
					size_t off = 0;
					bool whole = perf_pattern_check(buf, SOAK_BLOCK_BYTES, &k, &off);
					snprintf(d, dlen, "; holds soak-%" PRIu64 " layer %u %s block %u (%s%zu)", r, l,
						 p ? "V" : "K", b, whole ? "whole plane, " : "first bytes only, up to ",
						 whole ? (size_t)SOAK_BLOCK_BYTES : off);
					return;
				}
		}
	snprintf(d, dlen, "; first word %016" PRIx64 " matches no nearby request nor the poison", w0);
}

static uint32_t verify(struct role *R, const struct rx *x, char *d, size_t dlen)
{
	uint32_t bad = 0;
	for (uint32_t l = 0; l < SOAK_LAYERS; l++)
		for (uint32_t i = 0; i < x->blocks; i++)
			for (uint32_t p = 0; p < 2; p++) {
				struct perf_pattern_key k = key_of(x->idx, l, p, i);
				size_t off = 0;
				if (perf_pattern_check(blk(R, l, p, x->ids[i]), SOAK_BLOCK_BYTES, &k, &off))
					continue;
				if (bad++ == 0) {
					int n = snprintf(d, dlen, "layer %u %s block %u (id %u) differs at byte %zu", l,
							 p ? "V" : "K", i, x->ids[i], off);
					if (n > 0 && (size_t)n < dlen)
						describe(R, blk(R, l, p, x->ids[i]), x->idx, d + n, dlen - (size_t)n);
				}
			}
	return bad;
}

static struct rx *rx_get(struct role *R, uint64_t idx)
{
	for (size_t i = 0; i < MAX_RX; i++)
		if (R->rx[i].st != RX_FREE && R->rx[i].idx == idx)
			return &R->rx[i];
	return NULL;
}

/* Blocks back to the pool (poisoned on the consumer), record freed, driver told. */
static void rx_finish(struct role *R, struct rx *x)
{
	if (!R->o->producer && x->ids) {
		poison(R, x->ids, x->blocks);
		/* --corrupt-every N (checker self-test): a write into a block that is now free. */
		if (R->o->corrupt_every && x->idx % R->o->corrupt_every == 1)
			blk(R, SOAK_LAYERS - 1, 1, x->ids[0])[SOAK_BLOCK_BYTES - 1] ^= 0x5a;
	}
	if (x->ids && perf_pool_free(R->pool, x->ids, x->blocks))
		fatal(R, "the pool rejected a free (double free)");
	struct soak_idx m = {x->idx, soak_now_ns()};
	free(x->ids);
	free(x->remote);
	memset(x, 0, sizeof(*x));
	report(R, SOAK_FREED, &m, sizeof(m), NULL, 0);
}

static void send_term(struct role *R, const struct rx *x, int32_t status, int32_t error, uint64_t bytes,
		      uint64_t eng_ns, uint32_t verdict, uint32_t bad, const char *detail)
{
	struct soak_term t = {.idx = x->idx, .status = status, .error = error, .bytes = bytes,
			      .verify = verdict, .bad_planes = bad, .t_ns = x->t_term, .eng_ns = eng_ns};
	snprintf(t.detail, sizeof(t.detail), "%s", detail ? detail : "");
	report(R, SOAK_TERM, &t, sizeof(t), NULL, 0);
}

static void submitted(struct role *R, struct rx *x)
{
	struct soak_idx m = {x->idx, soak_now_ns()};
	report(R, SOAK_SUBMITTED, &m, sizeof(m), NULL, 0);
}

/* The engine refused the submission: nothing is in flight, the blocks go straight back. */
static void rejected(struct role *R, struct rx *x, int rc, const char *what)
{
	char d[120];
	snprintf(d, sizeof(d), "%s rejected: %s", what, kvx_strerror(rc));
	send_term(R, x, -1, rc, 0, 0, SOAK_V_NONE, 0, d);
	rx_finish(R, x);
}

static void fill(struct role *R, const struct rx *x)
{
	/* --corrupt-every N (checker self-test): every Nth request carries the next one's bytes. */
	uint64_t req = R->o->corrupt_every && x->idx % R->o->corrupt_every == 0 ? x->idx + 1 : x->idx;
	for (uint32_t l = 0; l < SOAK_LAYERS; l++)
		for (uint32_t i = 0; i < x->blocks; i++)
			for (uint32_t p = 0; p < 2; p++) {
				struct perf_pattern_key k = key_of(req, l, p, i);
				perf_pattern_fill(blk(R, l, p, x->ids[i]), SOAK_BLOCK_BYTES, &k);
			}
}

/* Start queued requests in arrival order while the pool has blocks. */
static void start_queued(struct role *R)
{
	for (;;) {
		struct rx *x = NULL;
		for (size_t i = 0; i < MAX_RX; i++)
			if (R->rx[i].st == RX_WAIT_POOL && (!x || R->rx[i].seq < x->seq))
				x = &R->rx[i];
		if (!x || !R->have_peer)
			return;
		x->ids = malloc(x->blocks * sizeof(uint32_t));
		if (!x->ids) {
			fatal(R, "out of memory");
			return;
		}
		int rc = perf_pool_alloc(R->pool, x->blocks, x->ids);
		if (rc == -ENOBUFS) {
			free(x->ids);
			x->ids = NULL;
			return;
		}
		if (rc) {
			free(x->ids);
			x->ids = NULL;
			fatal(R, "request larger than the pool");
			return;
		}
		if (!R->o->producer)
			check_poison(R, x);
		if (R->o->producer && !R->o->write_mode) {
			fill(R, x);
			struct kvx_engine_serve s = {.transfer_id = x->tid, .local_blocks = x->ids, .n = x->blocks};
			rc = kvx_xfer_serve(R->e, &s);
			if (rc) {
				rejected(R, x, rc, "serve");
				continue;
			}
			x->st = RX_SUBMITTED;
			submitted(R, x);
			struct soak_req m = {.idx = x->idx, .blocks = x->blocks, .n = x->blocks};
			report(R, SOAK_SERVED, &m, sizeof(m), x->ids, x->blocks * sizeof(uint32_t));
		} else if (R->o->producer) {
			fill(R, x);
			struct kvx_engine_write w = {.transfer_id = x->tid, .peer = R->peer,
						     .local_blocks = x->ids, .n = x->blocks};
			rc = kvx_xfer_write_begin(R->e, &w);
			if (rc) {
				rejected(R, x, rc, "write_begin");
				continue;
			}
			x->st = RX_LAYERS;
			submitted(R, x);
		} else if (R->o->write_mode) {
			struct kvx_engine_announce a = {.transfer_id = x->tid, .peer = R->peer,
							.local_blocks = x->ids, .n = x->blocks};
			rc = kvx_xfer_announce(R->e, &a);
			if (rc) {
				rejected(R, x, rc, "announce");
				continue;
			}
			x->st = RX_SUBMITTED;
			submitted(R, x);
		} else {
			struct kvx_engine_read rd = {.transfer_id = x->tid, .peer = R->peer, .local_blocks = x->ids,
						     .remote_blocks = x->remote, .n = x->blocks};
			rc = kvx_xfer_read(R->e, &rd);
			if (rc) {
				rejected(R, x, rc, "read");
				continue;
			}
			x->st = RX_SUBMITTED;
			submitted(R, x);
		}
	}
}

/* WRITE producer: mark layers ready and seal; a full ring (-ENOBUFS) is retried next round. */
static void layers_step(struct role *R)
{
	for (size_t i = 0; i < MAX_RX; i++) {
		struct rx *x = &R->rx[i];
		if (x->st != RX_LAYERS || x->got_term)
			continue;
		int rc = 0;
		while (x->next_layer < SOAK_LAYERS &&
		       (rc = kvx_xfer_layer_ready(R->e, x->tid, x->next_layer, NULL)) == 0)
			x->next_layer++;
		if (!rc && x->next_layer == SOAK_LAYERS)
			rc = kvx_xfer_seal(R->e, x->tid, SOAK_LAYERS);
		if (rc == -ENOBUFS)
			continue;
		/* Sealed, or refused because the transfer is already terminal (its completion is
		 * on the way: -ENOENT), or another error: the completion tells the outcome. */
		x->st = RX_SUBMITTED;
		if (rc && rc != -ENOENT) {
			fprintf(stderr, "kvx-soak producer: %s: layer_ready/seal: %s; aborting it\n", x->tid,
				kvx_strerror(rc));
			kvx_xfer_abort(R->e, x->tid);
		}
	}
}

static void handle_cpl(struct role *R, const struct kvx_completion *c)
{
	uint64_t idx = 0;
	struct rx *x = NULL;
	if (sscanf(c->transfer_id, "soak-%" SCNu64, &idx) == 1)
		x = rx_get(R, idx);
	if (!x || x->st == RX_WAIT_POOL) {
		char d[200];
		snprintf(d, sizeof(d), "completion (kind %d status %d) for unknown transfer '%.64s'",
			 (int)c->kind, (int)c->status, c->transfer_id);
		fprintf(stderr, "kvx-soak %s: %s\n", R->o->producer ? "producer" : "consumer", d);
		return;
	}
	if (c->kind == KVX_CPL_BLOCKS_RELEASED) {
		x->got_rel = true;
	} else if (c->kind == KVX_CPL_TRANSFER) {
		if (x->got_term) {
			fprintf(stderr, "kvx-soak: second terminal completion for %s\n", x->tid);
			return;
		}
		x->got_term = true;
		x->t_term = soak_now_ns();
		x->status = (int)c->status;
		if (x->st == RX_LAYERS)
			x->st = RX_SUBMITTED;
		uint32_t verdict = SOAK_V_NONE, bad = 0;
		char d[320] = "";
		if (!R->o->producer && c->status == KVX_CPL_DONE) {
			bad = verify(R, x, d, sizeof(d));
			verdict = bad ? SOAK_V_BAD : SOAK_V_OK;
		}
		send_term(R, x, (int32_t)c->status, c->error, c->bytes, c->duration_ns, verdict, bad, d);
	}
	/* Producer: blocks reusable at BLOCKS_RELEASED. Consumer: at DONE (verified), else at
	 * BLOCKS_RELEASED (out of quarantine). */
	if (x->got_term && (x->got_rel || (!R->o->producer && x->status == KVX_CPL_DONE)))
		rx_finish(R, x);
}

static void handle_msg(struct role *R, const struct soak_hdr *h, const void *p)
{
	switch (h->type) {
	case SOAK_PEER: {
		if (h->len != sizeof(struct soak_peer))
			break;
		const struct soak_peer *pm = p;
		snprintf(R->peer_host, sizeof(R->peer_host), "%s", pm->host);
		R->peer = (struct kvx_engine_peer){.host = R->peer_host, .handshake_port = pm->hs_port,
						   .notify_port = pm->nt_port};
		R->have_peer = true;
		return;
	}
	case SOAK_REQ: {
		const struct soak_req *q = p;
		if (h->len < sizeof(*q) || h->len != sizeof(*q) + (uint64_t)q->n * sizeof(uint32_t) ||
		    !q->blocks || q->blocks > R->o->max_blocks || (q->n && q->n != q->blocks) || rx_get(R, q->idx))
			break;
		struct rx *x = NULL;
		for (size_t i = 0; i < MAX_RX && !x; i++)
			if (R->rx[i].st == RX_FREE)
				x = &R->rx[i];
		if (!x)
			break;
		memset(x, 0, sizeof(*x));
		x->st = RX_WAIT_POOL;
		x->idx = q->idx;
		x->seq = R->seq++;
		x->blocks = q->blocks;
		snprintf(x->tid, sizeof(x->tid), "soak-%" PRIu64, q->idx);
		if (q->n) {
			x->remote = malloc(q->n * sizeof(uint32_t));
			if (!x->remote)
				break;
			memcpy(x->remote, q + 1, q->n * sizeof(uint32_t));
		}
		return;
	}
	case SOAK_ABORT: {
		if (h->len != sizeof(struct soak_idx))
			break;
		struct rx *x = rx_get(R, ((const struct soak_idx *)p)->idx);
		if (x && (x->st == RX_SUBMITTED || x->st == RX_LAYERS) && !x->got_term)
			kvx_xfer_abort(R->e, x->tid);
		return;
	}
	case SOAK_STATS_REQ: {
		struct kvx_engine_stats es;
		kvx_engine_get_stats(R->e, &es);
		struct soak_stats s = {.pool_size = perf_pool_size(R->pool), .pool_free = perf_pool_free_count(R->pool),
				       .fences = es.fences, .peer_resets = es.peer_resets,
				       .late_notifications = es.late_notifications};
		uint64_t held = 0;
		for (size_t i = 0; i < MAX_RX; i++) {
			const struct rx *x = &R->rx[i];
			if (x->st == RX_FREE)
				continue;
			s.live++;
			if (x->ids) {
				held += x->blocks;
				if (x->got_term)
					s.held_terminal += x->blocks;
			}
		}
		s.held_unowned = s.pool_size - s.pool_free - held;
		report(R, SOAK_STATS, &s, sizeof(s), NULL, 0);
		return;
	}
	case SOAK_QUIT:
		R->quit = true;
		return;
	default:
		break;
	}
	char d[96];
	snprintf(d, sizeof(d), "bad driver message type %u (%u bytes)", h->type, h->len);
	fatal(R, d);
}

static int setup(struct role *R)
{
	const struct soak_role_opts *o = R->o;
	struct kvx_engine_params p;
	char err[256] = "";
	kvx_engine_params_init(&p);
	p.role = o->producer ? KVX_SCHED_PRODUCER : KVX_SCHED_CONSUMER;
	p.mode = o->write_mode ? KVX_SCHED_MODE_WRITE : KVX_SCHED_MODE_READ;
	p.transport = o->transport;
	p.idle = KVX_ENGINE_IDLE_ADAPTIVE;
	p.host = o->host;
	p.handshake_port = o->hs_port;
	p.notify_port = o->nt_port;
	p.handshake_timeout_ms = o->timeout_ms;
	p.transfer_timeout_ms = o->timeout_ms;
	p.defer_timeout_ms = 2 * o->timeout_ms;
	p.max_transfers = MAX_RX + 16;
	p.max_blocks = o->max_blocks;
	if (o->lcores)
		p.lcores = o->lcores; /* e.g. "0,1": two polling lcores, so layers spread over both */
	int rc = kvx_engine_create(&p, &R->e, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvx-soak: kvx_engine_create: %s: %s\n", kvx_strerror(rc), err);
		return rc;
	}
	uint64_t nb = o->pool_blocks;
	for (uint32_t l = 0; l < SOAK_LAYERS; l++) {
		char name[32];
		snprintf(name, sizeof(name), "model.layers.%u.attn", l);
		struct kvx_engine_layer L = {.name = name, .base = R->layer[l], .mem = KVX_ENGINE_MEM_HOST};
		L.tensor.elem_size = SOAK_ELEM;
		L.tensor.ndim = 5;
		uint64_t shape[5] = {2, nb, SOAK_BS, SOAK_HEADS, SOAK_HD};
		uint64_t stride[5] = {nb * SOAK_BS * SOAK_HEADS * SOAK_HD, SOAK_BS * SOAK_HEADS * SOAK_HD,
				      SOAK_HEADS * SOAK_HD, SOAK_HD, 1};
		memcpy(L.tensor.shape, shape, sizeof(shape));
		memcpy(L.tensor.stride, stride, sizeof(stride));
		L.spec.block_size = SOAK_BS;
		L.spec.num_kv_heads = SOAK_HEADS;
		L.spec.head_size = SOAK_HD;
		rc = kvx_engine_register_layer(R->e, &L);
		if (rc < 0) {
			fprintf(stderr, "kvx-soak: register_layer: %s\n", kvx_strerror(rc));
			return rc;
		}
	}
	rc = kvx_engine_start(R->e);
	if (rc)
		fprintf(stderr, "kvx-soak: kvx_engine_start (ports %u/%u): %s\n", o->hs_port, o->nt_port,
			kvx_strerror(rc));
	return rc;
}

int soak_role_main(const struct soak_role_opts *o)
{
	static struct role R; /* large (MAX_RX records); one per process */
	R.o = o;
	R.layer_bytes = 2ull * o->pool_blocks * SOAK_BLOCK_BYTES;
	int exit_code = 1;
	if (perf_pool_create(o->pool_blocks, &R.pool))
		return 1;
	for (uint32_t l = 0; l < SOAK_LAYERS; l++) {
		void *m = mmap(NULL, R.layer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
			       -1, 0);
		if (m == MAP_FAILED)
			return 1;
		R.layer[l] = m;
	}
	if (!o->producer) {
		uint32_t *all = malloc(o->pool_blocks * sizeof(uint32_t));
		if (!all)
			return 1;
		for (uint32_t i = 0; i < o->pool_blocks; i++)
			all[i] = i;
		poison(&R, all, o->pool_blocks);
		free(all);
	}
	int rc = setup(&R);
	if (rc) {
		kvx_engine_destroy(R.e);
		return rc == -EADDRINUSE ? SOAK_EXIT_ADDRINUSE : 1;
	}
	struct soak_hello hello = {.pid = (int32_t)getpid()};
	kvx_engine_ports(R.e, &hello.hs_port, &hello.nt_port);
	snprintf(hello.transport, sizeof(hello.transport), "%s", kvx_engine_transport_name(R.e));
	report(&R, SOAK_HELLO, &hello, sizeof(hello), NULL, 0);
	unsigned idle = 0;
	while (!R.quit) {
		struct kvx_completion cpl[32];
		size_t n = kvx_engine_poll_completions(R.e, cpl, 32);
		for (size_t i = 0; i < n; i++)
			handle_cpl(&R, &cpl[i]);
		layers_step(&R);
		start_queued(&R);
		bool live = false;
		for (size_t i = 0; i < MAX_RX && !live; i++)
			live = R.rx[i].st == RX_SUBMITTED || R.rx[i].st == RX_LAYERS;
		/* The engine has no completion fd: while transfers are live, wait on the driver
		 * channel with a timeout backing off from 50 us to 2 ms (completions are seen within
		 * 2 ms); with nothing live, up to 20 ms. */
		idle = n ? 0 : idle + 1;
		long ns = n ? 0 : live ? (50000L << (idle < 6 ? idle : 6)) : 20000000L;
		if (live && ns > 2000000L)
			ns = 2000000L;
		struct pollfd pfd = {.fd = o->ctl_fd, .events = POLLIN};
		int pr = ppoll(&pfd, 1, &(struct timespec){0, ns}, NULL);
		if (pr < 0 && errno != EINTR)
			break;
		while (pr > 0 && !R.quit) {
			struct soak_hdr h;
			void *p;
			if (soak_recv(o->ctl_fd, &h, &p)) {
				R.quit = true; /* driver gone */
				break;
			}
			handle_msg(&R, &h, p);
			free(p);
			pr = poll(&pfd, 1, 0);
		}
	}
	exit_code = 0;
	kvx_engine_destroy(R.e);
	for (size_t i = 0; i < MAX_RX; i++) {
		free(R.rx[i].ids);
		free(R.rx[i].remote);
	}
	for (uint32_t l = 0; l < SOAK_LAYERS; l++)
		munmap(R.layer[l], R.layer_bytes);
	perf_pool_destroy(R.pool);
	return exit_code;
}
