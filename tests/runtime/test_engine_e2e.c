/* SPDX-License-Identifier: Apache-2.0 */
/* End to end: two real processes on loopback (fork), a producer and a consumer engine with real
 * control planes (libzmq) and a real transport provider (tcp, shm), both transfer modes, three
 * layouts (split, interleaved, MLA), different num_blocks on each side, byte-exact verification
 * of every transferred block and of every block that must stay untouched. The two processes
 * exchange their bound ports over pipes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "kvxfer/transport.h"
#include "runtime/runtime_internal.h"

TestSuite(runtime_e2e, .timeout = 60.0);

#define NLAYERS 3
#define BS 4
#define HEADS 2
#define HD 8
#define MLA_D 24
#define NB_P 32
#define NB_D 40
#define NPAIRS 6

enum lay { L_SPLIT, L_INTER, L_MLA };

static const uint32_t g_p_blocks[NPAIRS] = {3, 17, 4, 5, 30, 0};
/* One more consumer block than producer blocks is used by the extra-block case. */
static const uint32_t g_d_blocks[NPAIRS + 1] = {39, 2, 11, 12, 7, 25, 33};

static size_t block_elems(enum lay l)
{
	return l == L_MLA ? (size_t)BS * MLA_D : (size_t)BS * HEADS * HD;
}

static struct kvx_layout_tensor tensor_of(enum lay l, uint64_t nb)
{
	struct kvx_layout_tensor t = {.elem_size = 2};
	uint64_t sh[5];
	if (l == L_MLA) {
		t.ndim = 3;
		sh[0] = nb, sh[1] = BS, sh[2] = MLA_D;
	} else if (l == L_SPLIT) {
		t.ndim = 5;
		sh[0] = 2, sh[1] = nb, sh[2] = BS, sh[3] = HEADS, sh[4] = HD;
	} else {
		t.ndim = 5;
		sh[0] = nb, sh[1] = 2, sh[2] = BS, sh[3] = HEADS, sh[4] = HD;
	}
	uint64_t st = 1;
	for (int i = (int)t.ndim - 1; i >= 0; i--) {
		t.shape[i] = sh[i];
		t.stride[i] = st;
		st *= sh[i];
	}
	return t;
}

static size_t tensor_bytes(enum lay l, uint64_t nb)
{
	return 2 * block_elems(l) * nb * (l == L_MLA ? 1 : 2);
}

/* Byte offsets (in the tensor) of the plane pieces of block b: n pieces of len bytes. */
static int block_pieces(enum lay l, uint64_t nb, uint32_t b, size_t off[2], size_t *len)
{
	size_t be = block_elems(l) * 2;
	if (l == L_MLA) {
		off[0] = b * be;
		*len = be;
		return 1;
	}
	if (l == L_INTER) {
		off[0] = b * 2 * be; /* K and V of a block are adjacent */
		*len = 2 * be;
		return 1;
	}
	off[0] = b * be;
	off[1] = (nb + b) * be;
	*len = be;
	return 2;
}

static uint8_t pat(uint32_t layer, size_t byte)
{
	uint32_t x = (uint32_t)byte * 2654435761u ^ (layer + 1) * 40503u;
	return (uint8_t)(x >> 13 ^ x) | 1; /* never 0: 0 marks untouched consumer memory */
}

struct side {
	struct kvx_engine *e;
	uint8_t *mem[NLAYERS];
};

static int side_start_at(struct side *s, enum kvx_sched_role role, enum kvx_sched_mode mode, const char *prov,
			 enum lay l, uint64_t nb, bool fill, uint16_t hs, uint16_t nt)
{
	struct kvx_engine_params p;
	kvx_engine_params_init(&p);
	p.role = role;
	p.mode = mode;
	p.transport = prov;
	p.host = "127.0.0.1";
	p.handshake_port = hs;
	p.notify_port = nt;
	p.transfer_timeout_ms = 20000;
	p.handshake_timeout_ms = 10000;
	p.max_transfers = 16;
	p.max_blocks = 64;
	char err[256];
	int rc = kvx_engine_create(&p, &s->e, err, sizeof(err));
	if (rc)
		return rc;
	for (uint32_t i = 0; i < NLAYERS; i++) {
		size_t bytes = tensor_bytes(l, nb);
		s->mem[i] = calloc(1, bytes);
		if (!s->mem[i])
			return -ENOMEM;
		if (fill)
			for (size_t b = 0; b < bytes; b++)
				s->mem[i][b] = pat(i, b);
		char name[16];
		snprintf(name, sizeof(name), "layer%u", i);
		struct kvx_engine_layer ly = {.name = name, .base = s->mem[i], .tensor = tensor_of(l, nb),
					      .spec = {.block_size = BS, .num_kv_heads = HEADS, .head_size = HD,
						       .is_mla = l == L_MLA}};
		rc = kvx_engine_register_layer(s->e, &ly);
		if (rc != (int)i)
			return rc < 0 ? rc : -EPROTO;
	}
	return kvx_engine_start(s->e);
}

static int side_start(struct side *s, enum kvx_sched_role role, enum kvx_sched_mode mode, const char *prov,
		      enum lay l, uint64_t nb, bool fill)
{
	return side_start_at(s, role, mode, prov, l, nb, fill, 0, 0);
}

static void side_free(struct side *s)
{
	kvx_engine_destroy(s->e);
	for (uint32_t i = 0; i < NLAYERS; i++)
		free(s->mem[i]);
}

/* Wait for the TRANSFER completion of tid (and BLOCKS_RELEASED if want_release). */
static int wait_done(struct kvx_engine *e, const char *tid, bool want_release, int *status)
{
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	bool got_t = false, got_r = !want_release;
	while (!(got_t && got_r)) {
		struct kvx_completion c[4];
		size_t n = kvx_engine_poll_completions(e, c, 4);
		/* Bound the index for the compiler too: at -O3 GCC cannot see n <= 4. */
		for (size_t i = 0; i < n && i < KVX_ARRAY_SIZE(c); i++) {
			if (strcmp(c[i].transfer_id, tid))
				continue;
			if (c[i].kind == KVX_CPL_TRANSFER) {
				got_t = true;
				*status = (int)c[i].status;
			} else {
				got_r = true;
			}
		}
		if (!n) {
			if (kvx_now_ns() > deadline)
				return -ETIMEDOUT;
			usleep(200); /* polling cadence of this application thread, not synchronisation */
		}
	}
	return 0;
}

static int write_all(int fd, const void *b, size_t n)
{
	return write(fd, b, n) == (ssize_t)n ? 0 : -EIO;
}

static int read_all(int fd, void *b, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)b + got, n - got);
		if (r <= 0)
			return -EIO;
		got += (size_t)r;
	}
	return 0;
}

struct ports {
	uint16_t hs, nt;
};

/* Provider both engines must report after the transfer (kvx_engine_transport_name()), or NULL
 * for no check; and the producer's own requested transport when it differs from the consumer's. */
static const char *g_want_xport;
static const char *g_prov_p;

/* Producer process body: returns the exit code (0 ok). */
static int producer_main(enum kvx_sched_mode mode, const char *prov, enum lay l, int to_d, int from_d)
{
	struct side s = {0};
	int rc = side_start(&s, KVX_SCHED_PRODUCER, mode, prov, l, NB_P, true);
	struct ports mine = {0}, peer;
	if (!rc)
		rc = kvx_engine_ports(s.e, &mine.hs, &mine.nt);
	if (write_all(to_d, &mine, sizeof(mine)) || rc)
		return 10;
	if (read_all(from_d, &peer, sizeof(peer)))
		return 11;
	int st = -1;
	if (mode == KVX_SCHED_MODE_READ) {
		struct kvx_engine_serve sv = {.transfer_id = "tx-e2e", .local_blocks = g_p_blocks, .n = NPAIRS};
		if (kvx_xfer_serve(s.e, &sv))
			return 12;
	} else {
		struct kvx_engine_write w = {.transfer_id = "tx-e2e",
					     .peer = {.host = "127.0.0.1", .handshake_port = peer.hs, .notify_port = peer.nt},
					     .local_blocks = g_p_blocks,
					     .n = NPAIRS};
		if (kvx_xfer_write_begin(s.e, &w))
			return 13;
		static atomic_uint ready[NLAYERS];
		for (uint32_t i = 0; i < NLAYERS; i++) {
			if (kvx_xfer_layer_ready(s.e, "tx-e2e", i, &ready[i]))
				return 14;
			atomic_store_explicit(&ready[i], 1, memory_order_release);
		}
		if (kvx_xfer_seal(s.e, "tx-e2e", NLAYERS))
			return 15;
	}
	if (wait_done(s.e, "tx-e2e", true, &st))
		return 16;
	if (g_want_xport && strcmp(kvx_engine_transport_name(s.e), g_want_xport)) {
		fprintf(stderr, "producer: transport %s, want %s\n", kvx_engine_transport_name(s.e), g_want_xport);
		return 19;
	}
	char ack;
	if (read_all(from_d, &ack, 1)) /* the consumer has verified: safe to tear down */
		return 18;
	side_free(&s);
	return st == KVX_CPL_DONE ? 0 : 17;
}

/* Byte-exact check of one consumer layer: paired blocks equal the producer's, the rest is 0. */
static void verify_layer(const struct side *s, enum lay l, uint32_t li)
{
	size_t bytes = tensor_bytes(l, NB_D);
	uint8_t *want = calloc(1, bytes);
	cr_assert_not_null(want);
	for (uint32_t k = 0; k < NPAIRS; k++) {
		size_t doff[2], poff[2], len;
		int np = block_pieces(l, NB_D, g_d_blocks[k], doff, &len);
		block_pieces(l, NB_P, g_p_blocks[k], poff, &len);
		for (int q = 0; q < np; q++)
			for (size_t b = 0; b < len; b++)
				want[doff[q] + b] = pat(li, poff[q] + b);
	}
	for (size_t b = 0; b < bytes; b++)
		if (s->mem[li][b] != want[b])
			cr_assert_fail("layer %u byte %zu: got %u want %u", li, b, s->mem[li][b], want[b]);
	free(want);
}

static void run_e2e(enum kvx_sched_mode mode, const char *prov, enum lay l, bool extra_d_block)
{
	char reason[KVX_XPORT_REASON_MAX] = "";
	if (strcmp(prov, "auto") && kvx_xport_provider_probe(prov, reason, sizeof(reason)))
		cr_skip_test("provider %s unavailable: %s", prov, reason);
	int p2d[2], d2p[2];
	cr_assert_eq(pipe(p2d), 0);
	cr_assert_eq(pipe(d2p), 0);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p2d[0]);
		close(d2p[1]);
		_exit(producer_main(mode, g_prov_p ? g_prov_p : prov, l, p2d[1], d2p[0]));
	}
	close(p2d[1]);
	close(d2p[0]);
	struct side s = {0};
	cr_assert_eq(side_start(&s, KVX_SCHED_CONSUMER, mode, prov, l, NB_D, false), 0);
	struct ports mine = {0}, peer;
	cr_assert_eq(kvx_engine_ports(s.e, &mine.hs, &mine.nt), 0);
	cr_assert_eq(read_all(p2d[0], &peer, sizeof(peer)), 0, "producer failed to start");
	cr_assert_eq(write_all(d2p[1], &mine, sizeof(mine)), 0);
	struct kvx_engine_peer pp = {.host = "127.0.0.1", .handshake_port = peer.hs, .notify_port = peer.nt};
	if (mode == KVX_SCHED_MODE_READ) {
		struct kvx_engine_read r = {.transfer_id = "tx-e2e", .peer = pp, .local_blocks = g_d_blocks,
					    .remote_blocks = g_p_blocks, .n = NPAIRS};
		cr_assert_eq(kvx_xfer_read(s.e, &r), 0);
		/* Per-layer barrier (fault g): when layer i's wait returns, layer i's bytes are
		 * complete, whatever the state of the later layers. */
		for (uint32_t i = 0; i < NLAYERS; i++) {
			cr_assert_eq(kvx_xfer_layer_wait(s.e, "tx-e2e", i, 30000), 0, "layer %u", i);
			verify_layer(&s, l, i);
		}
	} else {
		/* extra_d_block (fault h): the consumer announces one block more than the producer
		 * has (first token appended); pairing is by position, the extra block stays 0. */
		struct kvx_engine_announce a = {.transfer_id = "tx-e2e", .peer = pp, .local_blocks = g_d_blocks,
						.n = NPAIRS + (extra_d_block ? 1 : 0)};
		cr_assert_eq(kvx_xfer_announce(s.e, &a), 0);
	}
	int st = -1;
	cr_assert_eq(wait_done(s.e, "tx-e2e", false, &st), 0, "no completion");
	cr_assert_eq(st, KVX_CPL_DONE);
	if (g_want_xport)
		cr_assert_str_eq(kvx_engine_transport_name(s.e), g_want_xport);
	/* Byte-exact: every paired block equals the producer's, every other block is untouched. */
	for (uint32_t li = 0; li < NLAYERS; li++)
		verify_layer(&s, l, li);
	cr_assert_eq(write_all(d2p[1], "k", 1), 0);
	int wst = 0;
	cr_assert_eq(waitpid(pid, &wst, 0), pid);
	cr_assert(WIFEXITED(wst), "producer crashed");
	cr_assert_eq(WEXITSTATUS(wst), 0, "producer exit code %d", WEXITSTATUS(wst));
	side_free(&s);
}

Test(runtime_e2e, tcp_read_split) { run_e2e(KVX_SCHED_MODE_READ, "tcp", L_SPLIT, false); }
Test(runtime_e2e, tcp_read_interleaved) { run_e2e(KVX_SCHED_MODE_READ, "tcp", L_INTER, false); }
Test(runtime_e2e, tcp_read_mla) { run_e2e(KVX_SCHED_MODE_READ, "tcp", L_MLA, false); }
Test(runtime_e2e, tcp_write_split) { run_e2e(KVX_SCHED_MODE_WRITE, "tcp", L_SPLIT, false); }
Test(runtime_e2e, tcp_write_interleaved) { run_e2e(KVX_SCHED_MODE_WRITE, "tcp", L_INTER, false); }
Test(runtime_e2e, tcp_write_mla) { run_e2e(KVX_SCHED_MODE_WRITE, "tcp", L_MLA, false); }
Test(runtime_e2e, shm_read_split) { run_e2e(KVX_SCHED_MODE_READ, "shm", L_SPLIT, false); }
Test(runtime_e2e, shm_read_interleaved) { run_e2e(KVX_SCHED_MODE_READ, "shm", L_INTER, false); }
Test(runtime_e2e, shm_read_mla) { run_e2e(KVX_SCHED_MODE_READ, "shm", L_MLA, false); }
Test(runtime_e2e, shm_write_split) { run_e2e(KVX_SCHED_MODE_WRITE, "shm", L_SPLIT, false); }
Test(runtime_e2e, shm_write_interleaved) { run_e2e(KVX_SCHED_MODE_WRITE, "shm", L_INTER, false); }
Test(runtime_e2e, shm_write_mla) { run_e2e(KVX_SCHED_MODE_WRITE, "shm", L_MLA, false); }
Test(runtime_e2e, tcp_write_consumer_extra_block) { run_e2e(KVX_SCHED_MODE_WRITE, "tcp", L_SPLIT, true); }
/* verbs (issue 6): skipped with the provider's reason where there is no RDMA device; run inside
 * the Soft-RoCE VM by tests/rxe/payload-verbs.sh (filter runtime_e2e/verbs_*). */
Test(runtime_e2e, verbs_read_split) { run_e2e(KVX_SCHED_MODE_READ, "verbs", L_SPLIT, false); }
Test(runtime_e2e, verbs_read_interleaved) { run_e2e(KVX_SCHED_MODE_READ, "verbs", L_INTER, false); }
Test(runtime_e2e, verbs_read_mla) { run_e2e(KVX_SCHED_MODE_READ, "verbs", L_MLA, false); }
Test(runtime_e2e, verbs_write_split) { run_e2e(KVX_SCHED_MODE_WRITE, "verbs", L_SPLIT, false); }
Test(runtime_e2e, verbs_write_interleaved) { run_e2e(KVX_SCHED_MODE_WRITE, "verbs", L_INTER, false); }
Test(runtime_e2e, verbs_write_mla) { run_e2e(KVX_SCHED_MODE_WRITE, "verbs", L_MLA, false); }
Test(runtime_e2e, verbs_write_consumer_extra_block) { run_e2e(KVX_SCHED_MODE_WRITE, "verbs", L_SPLIT, true); }

/* docs/architecture.md §3 `auto` (no RDMA here): two engines on one host agree on shm when CMA is
 * permitted; KVX_ENGINE_AUTO_NO_SHM=1 keeps them on tcp; an explicit peer wins the agreement. */
static void run_auto(enum kvx_sched_mode mode, const char *prov_p, bool no_shm, const char *want)
{
	char reason[KVX_XPORT_REASON_MAX] = "";
	if (kvx_xport_provider_probe("verbs", reason, sizeof(reason)) == 0)
		cr_skip_test("a usable RDMA device exists: auto picks verbs here");
	if (!strcmp(want, "shm") && kvx_xport_provider_probe("shm", reason, sizeof(reason)))
		cr_skip_test("shm unavailable: %s", reason);
	if (no_shm)
		cr_assert_eq(setenv("KVX_ENGINE_AUTO_NO_SHM", "1", 1), 0);
	else
		cr_assert_eq(unsetenv("KVX_ENGINE_AUTO_NO_SHM"), 0);
	g_want_xport = want;
	g_prov_p = prov_p;
	run_e2e(mode, "auto", L_SPLIT, false);
}

Test(runtime_e2e, auto_read_same_host_uses_shm) { run_auto(KVX_SCHED_MODE_READ, NULL, false, "shm"); }
Test(runtime_e2e, auto_write_same_host_uses_shm) { run_auto(KVX_SCHED_MODE_WRITE, NULL, false, "shm"); }
Test(runtime_e2e, auto_read_shm_disabled_uses_tcp) { run_auto(KVX_SCHED_MODE_READ, NULL, true, "tcp"); }
Test(runtime_e2e, auto_write_shm_disabled_uses_tcp) { run_auto(KVX_SCHED_MODE_WRITE, NULL, true, "tcp"); }
Test(runtime_e2e, auto_read_tcp_peer_agrees_on_tcp) { run_auto(KVX_SCHED_MODE_READ, "tcp", false, "tcp"); }
Test(runtime_e2e, auto_write_tcp_peer_agrees_on_tcp) { run_auto(KVX_SCHED_MODE_WRITE, "tcp", false, "tcp"); }
Test(runtime_e2e, auto_read_shm_peer_agrees_on_shm) { run_auto(KVX_SCHED_MODE_READ, "shm", false, "shm"); }

/* ---- WRITE after a consumer restart (docs/protocol.md §6 item 18), three real processes ---------- */

#define RB (BS * MLA_D * 2) /* bytes of one MLA block */
static const uint32_t g_r_p[3][2] = {{3, 17}, {4, 5}, {30, 0}};  /* tx-1, tx-1b, tx-2 on P */
static const uint32_t g_r_d[3][2] = {{39, 2}, {11, 12}, {7, 25}}; /* ... their blocks on D */
static const char *const g_r_tid[3] = {"tx-rs-1", "tx-rs-1b", "tx-rs-2"};

/* Terminal status of transfer g_r_tid[k] (waits up to 30 s), or -1; completions of the other
 * transfers seen meanwhile are kept for their own call. */
static int g_r_status[3] = {-1, -1, -1};
static int status_of(struct kvx_engine *e, int k)
{
	uint64_t end = kvx_now_ns() + 30000000000ull;
	while (g_r_status[k] < 0 && kvx_now_ns() < end) {
		struct kvx_completion c[4];
		size_t n = kvx_engine_poll_completions(e, c, 4);
		for (size_t i = 0; i < n && i < KVX_ARRAY_SIZE(c); i++)
			for (int j = 0; j < 3; j++)
				if (c[i].kind == KVX_CPL_TRANSFER && !strcmp(c[i].transfer_id, g_r_tid[j]))
					g_r_status[j] = (int)c[i].status;
		if (!n)
			usleep(200); /* polling cadence of this application thread, not synchronisation */
	}
	return g_r_status[k];
}

static int write_one(struct kvx_engine *e, int k, struct kvx_engine_peer d, const struct kvx_mem_event *ev)
{
	struct kvx_engine_write w = {.transfer_id = g_r_tid[k], .peer = d, .local_blocks = g_r_p[k], .n = 2};
	if (kvx_xfer_write_begin(e, &w))
		return -1;
	for (uint32_t l = 0; l < NLAYERS; l++)
		if (kvx_xfer_layer_ready_event(e, g_r_tid[k], l, ev))
			return -1;
	return kvx_xfer_seal(e, g_r_tid[k], NLAYERS) ? -1 : 0;
}

/* Producer: tx-1 to D1; tx-1b allocated by D1 but gated until D1 is dead and D2 is up (it must
 * fail: never written into D2); tx-2 allocated by D2 (must succeed after the re-handshake). */
static int restart_producer(int to_parent, int from_parent)
{
	struct side s = {0};
	struct ports mine = {0}, d;
	if (side_start(&s, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE, "tcp", L_MLA, NB_P, true) ||
	    kvx_engine_ports(s.e, &mine.hs, &mine.nt) || write_all(to_parent, &mine, sizeof(mine)))
		return 10;
	if (read_all(from_parent, &d, sizeof(d)))
		return 11;
	struct kvx_engine_peer pd = {.host = "127.0.0.1", .handshake_port = d.hs, .notify_port = d.nt};
	if (write_one(s.e, 0, pd, NULL) || status_of(s.e, 0) != KVX_CPL_DONE)
		return 12;
	static _Atomic uint64_t computed; /* tx-1b's layers: not computed until D1 is gone */
	struct kvx_mem_event ev;
	kvx_mem_event_init_flag(&ev, &computed, 1);
	if (write_one(s.e, 1, pd, &ev))
		return 13;
	/* D1's remote_blocks for tx-1b reached P (2 notifications: tx-1's and tx-1b's). */
	uint64_t end = kvx_now_ns() + 30000000000ull;
	struct kvx_engine_stats st;
	do {
		kvx_engine_get_stats(s.e, &st);
		if (st.notifications_received < 2)
			usleep(500);
	} while (st.notifications_received < 2 && kvx_now_ns() < end);
	if (st.notifications_received < 2)
		return 14;
	/* That remote_blocks names D1's epoch (kvx_epoch): P attributes the allocation to D1
	 * whatever happens to D1 next. */
	if (write_all(to_parent, "b", 1))
		return 21;
	char c;
	if (read_all(from_parent, &c, 1)) /* D1 exited, D2 is up on the same ports */
		return 15;
	/* First the new transfer (D2's allocation): P must notice D1's death before posting. */
	if (write_one(s.e, 2, pd, NULL))
		return 17;
	int st2 = status_of(s.e, 2);
	if (st2 != KVX_CPL_DONE) {
		fprintf(stderr, "producer: tx-2 status %d, want DONE\n", st2);
		return 18;
	}
	/* Then D1's allocation becomes writable: its epoch is gone, it fails, D2 is untouched. */
	atomic_store_explicit(&computed, 1, memory_order_release);
	int st1b = status_of(s.e, 1);
	if (st1b != KVX_CPL_FAILED) {
		fprintf(stderr, "producer: tx-1b status %d, want FAILED\n", st1b);
		return 16;
	}
	kvx_engine_get_stats(s.e, &st);
	if (st.peer_resets < 1)
		return 19;
	if (write_all(to_parent, "f", 1) || read_all(from_parent, &c, 1)) /* the consumer has verified */
		return 20;
	side_free(&s);
	return 0;
}

static bool block_is(const struct side *s, uint32_t db, uint32_t pb, bool zero)
{
	for (uint32_t l = 0; l < NLAYERS; l++)
		for (size_t b = 0; b < RB; b++)
			if (s->mem[l][db * RB + b] != (zero ? 0 : pat(l, pb * RB + b)))
				return false;
	return true;
}

/* Consumer incarnation 1 (ephemeral ports) announces tx-1 and tx-1b, then dies abruptly when
 * told; incarnation 2 (same ports, new epoch) announces tx-2 and checks its memory. */
static int restart_consumer(int gen, struct ports at, struct ports p, int to_parent, int from_parent)
{
	struct side s = {0};
	struct ports mine = {0};
	if (side_start_at(&s, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE, "tcp", L_MLA, NB_D, false, at.hs, at.nt) ||
	    kvx_engine_ports(s.e, &mine.hs, &mine.nt) || write_all(to_parent, &mine, sizeof(mine)))
		return 30;
	struct kvx_engine_peer pp = {.host = "127.0.0.1", .handshake_port = p.hs, .notify_port = p.nt};
	char c;
	if (gen == 1) {
		struct kvx_engine_announce a = {.transfer_id = g_r_tid[0], .peer = pp, .local_blocks = g_r_d[0], .n = 2};
		if (kvx_xfer_announce(s.e, &a) || status_of(s.e, 0) != KVX_CPL_DONE)
			return 31;
		if (!block_is(&s, g_r_d[0][0], g_r_p[0][0], false) || !block_is(&s, g_r_d[0][1], g_r_p[0][1], false))
			return 32;
		a.transfer_id = g_r_tid[1];
		a.local_blocks = g_r_d[1];
		if (kvx_xfer_announce(s.e, &a))
			return 33;
		if (read_all(from_parent, &c, 1))
			return 34;
		_exit(0); /* a crash, not a clean stop: no release, sockets closed by the kernel */
	}
	struct kvx_engine_announce a = {.transfer_id = g_r_tid[2], .peer = pp, .local_blocks = g_r_d[2], .n = 2};
	if (kvx_xfer_announce(s.e, &a))
		return 40;
	int st = status_of(s.e, 2);
	if (st != KVX_CPL_DONE) {
		fprintf(stderr, "consumer 2: tx-2 status %d\n", st);
		return 41;
	}
	if (!block_is(&s, g_r_d[2][0], g_r_p[2][0], false) || !block_is(&s, g_r_d[2][1], g_r_p[2][1], false))
		return 42;
	if (read_all(from_parent, &c, 1)) /* the producer's tx-1b is terminal */
		return 45;
	/* tx-1b's blocks (D1's allocation) were never written into this process. */
	for (int i = 0; i < 2; i++)
		if (!block_is(&s, g_r_d[1][i], 0, true) || !block_is(&s, g_r_d[0][i], 0, true))
			return 43;
	if (write_all(to_parent, "v", 1))
		return 44;
	side_free(&s);
	return 0;
}

static pid_t spawn_consumer(int gen, struct ports at, struct ports p, int *to_child, int *from_child)
{
	int a[2], b[2];
	cr_assert_eq(pipe(a), 0);
	cr_assert_eq(pipe(b), 0);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(a[1]);
		close(b[0]);
		_exit(restart_consumer(gen, at, p, b[1], a[0]));
	}
	close(a[0]);
	close(b[1]);
	*to_child = a[1];
	*from_child = b[0];
	return pid;
}

static void expect_exit(pid_t pid, const char *who)
{
	int wst = 0;
	cr_assert_eq(waitpid(pid, &wst, 0), pid);
	cr_assert(WIFEXITED(wst), "%s crashed", who);
	cr_assert_eq(WEXITSTATUS(wst), 0, "%s exit code %d", who, WEXITSTATUS(wst));
}

/* The producer sees the consumer's new epoch and re-handshakes; the WRITE allocated by the dead
 * incarnation ends FAILED and writes nothing into the new one; a new WRITE succeeds. The
 * orchestrating test process runs no engine (fork stays simple). */
Test(runtime_e2e, tcp_write_after_consumer_restart)
{
	int p_in[2], p_out[2];
	cr_assert_eq(pipe(p_in), 0);
	cr_assert_eq(pipe(p_out), 0);
	fflush(NULL);
	pid_t pp = fork();
	cr_assert_geq(pp, 0);
	if (pp == 0) {
		close(p_in[1]);
		close(p_out[0]);
		_exit(restart_producer(p_out[1], p_in[0]));
	}
	close(p_in[0]);
	close(p_out[1]);
	struct ports p, d1, none = {0};
	cr_assert_eq(read_all(p_out[0], &p, sizeof(p)), 0, "producer failed to start");
	int to1, from1, to2, from2;
	pid_t c1 = spawn_consumer(1, none, p, &to1, &from1);
	cr_assert_eq(read_all(from1, &d1, sizeof(d1)), 0, "consumer 1 failed to start");
	cr_assert_eq(write_all(p_in[1], &d1, sizeof(d1)), 0);
	char c;
	cr_assert_eq(read_all(p_out[0], &c, 1), 0, "producer: tx-1 or tx-1b's allocation failed");
	cr_assert_eq(write_all(to1, "x", 1), 0);
	expect_exit(c1, "consumer 1");
	struct ports d2;
	pid_t c2 = spawn_consumer(2, d1, p, &to2, &from2);
	cr_assert_eq(read_all(from2, &d2, sizeof(d2)), 0, "consumer 2 failed to start on the same ports");
	cr_assert_eq(d2.hs, d1.hs);
	cr_assert_eq(write_all(p_in[1], "c", 1), 0);
	cr_assert_eq(read_all(p_out[0], &c, 1), 0, "producer: tx-2 or tx-1b ended wrong");
	cr_assert_eq(write_all(to2, "f", 1), 0);
	cr_assert_eq(read_all(from2, &c, 1), 0, "consumer 2 did not verify");
	cr_assert_eq(write_all(p_in[1], "k", 1), 0);
	expect_exit(c2, "consumer 2");
	expect_exit(pp, "producer");
}
