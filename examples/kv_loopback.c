/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer embedding example: a producer (prefill) and a consumer (decode) engine in two
 * processes on loopback, through the public engine API only (include/kvxfer.h).
 *
 * Each process registers the same small split K/V layers (`[2, NB, BS, H, HD]`, bf16), then:
 *   1. READ mode: the producer serves blocks {3, 7, 1}; the consumer reads them into its
 *      blocks {0, 5, 9}, waits for each layer, and the producer gets its blocks back;
 *   2. WRITE mode: the consumer announces blocks {2, 4, 6}; the producer pushes its blocks
 *      {8, 0, 11} layer by layer (mark ready, seal); the consumer waits for `write_done`.
 * After each transfer the consumer checks every byte of its layers: the paired blocks equal the
 * producer's, every other block is still zero. Exit 0 when both transfers are byte-exact.
 *
 * The two processes exchange their engines' ports over a pipe; in a real deployment the proxy
 * (or your own control plane) carries them. Thread model: the thread that creates an engine makes
 * every call on it; the engine's pinned polling lcore and control lcore do the work.
 *
 * Build: cc -std=c11 -o kv_loopback kv_loopback.c $(pkg-config --cflags --libs kvxfer)
 * Run:   ./kv_loopback [tcp|shm|auto|verbs]     (default tcp)
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvxfer.h>

#define NLAYERS 2
#define NB 16 /* blocks per layer on each side */
#define BS 16 /* tokens per block */
#define H 2   /* KV heads */
#define HD 64 /* head size, elements */
#define ELEM 2 /* bf16 */
#define NPAIRS 3
#define PLANE_BLOCK_BYTES ((size_t)BS * H * HD * ELEM) /* one K (or V) block */
#define LAYER_BYTES (2 * (size_t)NB * PLANE_BLOCK_BYTES)
#define DEADLINE_NS 30000000000ull

static const char *g_transport = "tcp";

struct ports {
	uint16_t handshake, notify;
};

struct side {
	struct kvx_engine *e;
	uint8_t *layer[NLAYERS];
};

/* Producer pattern: a function of (layer, byte offset in the layer), never 0. */
static uint8_t pattern(uint32_t layer, size_t off)
{
	uint32_t x = (uint32_t)off * 2654435761u ^ (layer + 1) * 40503u;
	return (uint8_t)((x >> 13 ^ x) | 1);
}

static void die(const char *who, const char *what, int rc)
{
	fprintf(stderr, "kv_loopback %s: %s: %s\n", who, what, kvx_strerror(rc));
	exit(1);
}

static int write_all(int fd, const void *buf, size_t n)
{
	return write(fd, buf, n) == (ssize_t)n ? 0 : -EIO;
}

static int read_all(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r <= 0)
			return -EIO;
		got += (size_t)r;
	}
	return 0;
}

/*
 * Both processes call this after their side of a transfer is complete, before destroying their
 * engine: an engine must outlive the notifications it still has to send or receive (`release`,
 * `write_done`); real engines are long-lived, this example tears them down after each phase.
 */
static int barrier(int to, int from)
{
	char c = 'k';
	return write_all(to, &c, 1) || read_all(from, &c, 1) ? -EIO : 0;
}

/* Create, register NLAYERS split K/V layers, start. The producer fills its layers. */
static void side_start(struct side *s, const char *who, enum kvx_sched_role role, enum kvx_sched_mode mode)
{
	struct kvx_engine_params p;
	char err[256] = "";
	kvx_engine_params_init(&p);
	p.role = role;
	p.mode = mode;
	p.transport = g_transport;
	p.host = "127.0.0.1";
	p.handshake_port = 0; /* ephemeral: read back with kvx_engine_ports() */
	p.notify_port = 0;
	p.transfer_timeout_ms = 20000;
	p.max_transfers = 8;
	p.max_blocks = NB;
	int rc = kvx_engine_create(&p, &s->e, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kv_loopback %s: kvx_engine_create: %s: %s\n", who, kvx_strerror(rc), err);
		exit(1);
	}
	for (uint32_t l = 0; l < NLAYERS; l++) {
		s->layer[l] = calloc(1, LAYER_BYTES);
		if (!s->layer[l])
			die(who, "calloc", -ENOMEM);
		if (role == KVX_SCHED_PRODUCER)
			for (size_t b = 0; b < LAYER_BYTES; b++)
				s->layer[l][b] = pattern(l, b);
		char name[32];
		snprintf(name, sizeof(name), "model.layers.%u.attn", l);
		struct kvx_engine_layer ly = {
			.name = name,
			.base = s->layer[l],
			.tensor = {.ndim = 5,
				   .shape = {2, NB, BS, H, HD},
				   .stride = {(uint64_t)NB * BS * H * HD, (uint64_t)BS * H * HD, (uint64_t)H * HD, HD, 1},
				   .elem_size = ELEM},
			.spec = {.block_size = BS, .num_kv_heads = H, .head_size = HD, .is_mla = false},
			.mem = KVX_ENGINE_MEM_HOST,
		};
		rc = kvx_engine_register_layer(s->e, &ly);
		if (rc != (int)l)
			die(who, "kvx_engine_register_layer", rc < 0 ? rc : -EPROTO);
	}
	rc = kvx_engine_start(s->e);
	if (rc)
		die(who, "kvx_engine_start", rc);
}

static void side_free(struct side *s)
{
	kvx_engine_destroy(s->e);
	for (uint32_t l = 0; l < NLAYERS; l++)
		free(s->layer[l]);
}

/* Poll completions until transfer @p tid is terminal (and, if asked, its blocks are released).
 * Returns the terminal status, or -ETIMEDOUT. */
static int wait_transfer(struct kvx_engine *e, const char *tid, int want_released)
{
	uint64_t deadline = kvx_now_ns() + DEADLINE_NS;
	int status = -1, released = !want_released;
	while (status < 0 || !released) {
		struct kvx_completion c[4];
		size_t n = kvx_engine_poll_completions(e, c, 4);
		for (size_t i = 0; i < n && i < 4; i++) {
			if (strcmp(c[i].transfer_id, tid))
				continue;
			if (c[i].kind == KVX_CPL_TRANSFER)
				status = (int)c[i].status;
			else if (c[i].kind == KVX_CPL_BLOCKS_RELEASED)
				released = 1;
		}
		if (n == 0) {
			if (kvx_now_ns() > deadline)
				return -ETIMEDOUT;
			/* The application thread's own polling cadence (an engine would do other work). */
			struct timespec ts = {0, 100000};
			nanosleep(&ts, NULL);
		}
	}
	return status;
}

/* Consumer: paired blocks equal the producer's bytes, every other block is still zero.
 * Returns the number of wrong bytes. */
static size_t verify(const struct side *s, const uint32_t *d_blocks, const uint32_t *p_blocks)
{
	size_t bad = 0;
	for (uint32_t l = 0; l < NLAYERS; l++) {
		for (uint32_t plane = 0; plane < 2; plane++) {
			for (uint32_t b = 0; b < NB; b++) {
				int k = -1;
				for (int i = 0; i < NPAIRS; i++)
					if (d_blocks[i] == b)
						k = i;
				size_t doff = ((size_t)plane * NB + b) * PLANE_BLOCK_BYTES;
				size_t poff = k < 0 ? 0 : ((size_t)plane * NB + p_blocks[k]) * PLANE_BLOCK_BYTES;
				for (size_t x = 0; x < PLANE_BLOCK_BYTES; x++) {
					uint8_t want = k < 0 ? 0 : pattern(l, poff + x);
					bad += s->layer[l][doff + x] != want;
				}
			}
		}
	}
	return bad;
}

static const uint32_t READ_P[NPAIRS] = {3, 7, 1}, READ_D[NPAIRS] = {0, 5, 9};
static const uint32_t WRITE_P[NPAIRS] = {8, 0, 11}, WRITE_D[NPAIRS] = {2, 4, 6};

static int producer(int to_c, int from_c)
{
	const char *who = "producer";
	struct ports mine, peer;

	/* 1. READ: serve blocks until the consumer's `release`. */
	struct side s = {0};
	side_start(&s, who, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	if (kvx_engine_ports(s.e, &mine.handshake, &mine.notify) || write_all(to_c, &mine, sizeof(mine)) ||
	    read_all(from_c, &peer, sizeof(peer)))
		die(who, "port exchange", -EIO);
	struct kvx_engine_serve sv = {.transfer_id = "tx-read-1", .local_blocks = READ_P, .n = NPAIRS};
	int rc = kvx_xfer_serve(s.e, &sv);
	if (rc)
		die(who, "kvx_xfer_serve", rc);
	rc = wait_transfer(s.e, "tx-read-1", 1);
	if (rc != KVX_CPL_DONE)
		die(who, "READ transfer", rc < 0 ? rc : -EIO);
	if (barrier(to_c, from_c))
		die(who, "barrier", -EIO);
	side_free(&s);

	/* 2. WRITE: push blocks layer by layer once the consumer announced its blocks. */
	memset(&s, 0, sizeof(s));
	side_start(&s, who, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	if (kvx_engine_ports(s.e, &mine.handshake, &mine.notify) || write_all(to_c, &mine, sizeof(mine)) ||
	    read_all(from_c, &peer, sizeof(peer)))
		die(who, "port exchange", -EIO);
	struct kvx_engine_write w = {
		.transfer_id = "tx-write-1",
		.peer = {.host = "127.0.0.1", .handshake_port = peer.handshake, .notify_port = peer.notify},
		.local_blocks = WRITE_P,
		.n = NPAIRS,
	};
	rc = kvx_xfer_write_begin(s.e, &w);
	if (rc)
		die(who, "kvx_xfer_write_begin", rc);
	/* Each layer is "computed" (already filled) and marked ready; the polling lcore posts its
	 * writes once it reads the flag as non-zero. */
	static atomic_uint ready[NLAYERS];
	for (uint32_t l = 0; l < NLAYERS; l++) {
		rc = kvx_xfer_layer_ready(s.e, "tx-write-1", l, &ready[l]);
		if (rc)
			die(who, "kvx_xfer_layer_ready", rc);
		atomic_store_explicit(&ready[l], 1, memory_order_release);
	}
	rc = kvx_xfer_seal(s.e, "tx-write-1", NLAYERS);
	if (rc)
		die(who, "kvx_xfer_seal", rc);
	rc = wait_transfer(s.e, "tx-write-1", 1);
	if (rc != KVX_CPL_DONE)
		die(who, "WRITE transfer", rc < 0 ? rc : -EIO);
	if (barrier(to_c, from_c))
		die(who, "barrier", -EIO);
	side_free(&s);
	return 0;
}

static int consumer(int to_p, int from_p)
{
	const char *who = "consumer";
	struct ports mine, peer;
	size_t bad;

	/* 1. READ: pull the producer's blocks, layer by layer. */
	struct side s = {0};
	side_start(&s, who, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	if (kvx_engine_ports(s.e, &mine.handshake, &mine.notify) || read_all(from_p, &peer, sizeof(peer)) ||
	    write_all(to_p, &mine, sizeof(mine)))
		die(who, "port exchange", -EIO);
	struct kvx_engine_read r = {
		.transfer_id = "tx-read-1",
		.peer = {.host = "127.0.0.1", .handshake_port = peer.handshake, .notify_port = peer.notify},
		.local_blocks = READ_D,
		.remote_blocks = READ_P,
		.n = NPAIRS,
	};
	int rc = kvx_xfer_read(s.e, &r);
	if (rc)
		die(who, "kvx_xfer_read", rc);
	for (uint32_t l = 0; l < NLAYERS; l++) {
		/* An engine would start computing on layer l here while later layers are in flight. */
		rc = kvx_xfer_layer_wait(s.e, "tx-read-1", l, 30000);
		if (rc)
			die(who, "kvx_xfer_layer_wait", rc);
	}
	rc = wait_transfer(s.e, "tx-read-1", 0);
	if (rc != KVX_CPL_DONE)
		die(who, "READ transfer", rc < 0 ? rc : -EIO);
	bad = verify(&s, READ_D, READ_P);
	printf("kv_loopback: READ  %d blocks x %d layers over %s: %s\n", NPAIRS, NLAYERS,
	       kvx_engine_transport_name(s.e), bad ? "MISMATCH" : "byte-exact");
	if (barrier(to_p, from_p))
		die(who, "barrier", -EIO);
	side_free(&s);
	if (bad) {
		fprintf(stderr, "kv_loopback consumer: READ: %zu wrong bytes\n", bad);
		return 1;
	}

	/* 2. WRITE: announce blocks; the producer pushes into them and sends `write_done`. */
	memset(&s, 0, sizeof(s));
	side_start(&s, who, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	if (kvx_engine_ports(s.e, &mine.handshake, &mine.notify) || read_all(from_p, &peer, sizeof(peer)) ||
	    write_all(to_p, &mine, sizeof(mine)))
		die(who, "port exchange", -EIO);
	struct kvx_engine_announce a = {
		.transfer_id = "tx-write-1",
		.peer = {.host = "127.0.0.1", .handshake_port = peer.handshake, .notify_port = peer.notify},
		.local_blocks = WRITE_D,
		.n = NPAIRS,
	};
	rc = kvx_xfer_announce(s.e, &a);
	if (rc)
		die(who, "kvx_xfer_announce", rc);
	rc = wait_transfer(s.e, "tx-write-1", 0);
	if (rc != KVX_CPL_DONE)
		die(who, "WRITE transfer", rc < 0 ? rc : -EIO);
	bad = verify(&s, WRITE_D, WRITE_P);
	printf("kv_loopback: WRITE %d blocks x %d layers over %s: %s\n", NPAIRS, NLAYERS,
	       kvx_engine_transport_name(s.e), bad ? "MISMATCH" : "byte-exact");
	if (barrier(to_p, from_p))
		die(who, "barrier", -EIO);
	side_free(&s);
	if (bad) {
		fprintf(stderr, "kv_loopback consumer: WRITE: %zu wrong bytes\n", bad);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 2 || (argc == 2 && strcmp(argv[1], "tcp") && strcmp(argv[1], "shm") &&
			 strcmp(argv[1], "auto") && strcmp(argv[1], "verbs"))) {
		fprintf(stderr, "usage: %s [tcp|shm|auto|verbs]\n", argv[0]);
		return 2;
	}
	if (argc == 2)
		g_transport = argv[1];
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p)) {
		perror("kv_loopback: pipe");
		return 1;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("kv_loopback: fork");
		return 1;
	}
	if (pid == 0) {
		close(p2c[0]);
		close(c2p[1]);
		exit(producer(p2c[1], c2p[0]));
	}
	close(p2c[1]);
	close(c2p[0]);
	int rc = consumer(c2p[1], p2c[0]);
	close(c2p[1]);
	close(p2c[0]);
	int st = 0;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "kv_loopback: the producer process failed (status %d)\n", st);
		rc = 1;
	}
	if (rc == 0)
		printf("kv_loopback: OK\n");
	return rc;
}
