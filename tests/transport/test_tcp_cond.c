/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Conditional ops of the tcp provider (kvx_xport_post_bulk_cond(), the target side of the block
 * leases, docs/protocol.md §5.11), against a real target process (tests/transport/peer.c). The
 * target's own memory holds the condition word (a region registered REMOTE_READ); the test
 * changes it with a fill command, which the target process runs on the thread of its
 * kvx_xport_progress() loop: the "revocation" is ordered with every apply, so the tests assert
 * exact bytes:
 *  - a WRITE / READ whose word holds is applied; one whose word differs fails -ESTALE and no
 *    byte moves (the target's region and the initiator's buffer keep their bytes);
 *  - a stream of conditional WRITEs whose word changes after the first completed: every byte
 *    the target holds after the change was there at the change; the later ops fail -ESTALE;
 *  - the same for READs: the initiator's buffer past the first refused chunk keeps its poison;
 *  - argument errors of kvx_xport_post_bulk_cond().
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/common.h"
#include "kvxfer/transport.h"
#include "peer.h"
#include "xport_test_util.h"

#define MIB (1ull << 20)
#define SEED_R 11u   /* the target region's original bytes */
#define SEED_W 12u   /* what the initiator writes */
#define SEED_L 13u   /* the word region */
#define SEED_REV 14u /* the word region after the "revocation" */
#define POISON 0xa5

struct rig {
	struct peer peer;
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	uint32_t chunk;
};

static void rig_up(struct rig *r, uint32_t chunk)
{
	skip_unless_available("tcp");
	struct kvx_xport_ctx_params p;
	kvx_xport_ctx_params_init(&p);
	p.op_timeout_ns = 20000000000ull; /* generous: the 2-core CI machine is shared */
	p.num_channels = 1;               /* requests applied in order: one prefix lands */
	p.chunk_bytes = chunk;
	memset(r, 0, sizeof(*r));
	r->chunk = chunk;
	cond_rig_connect(&r->peer, "tcp", &p, &r->ctx, &r->ep);
}

static void rig_down(struct rig *r)
{
	kvx_xport_close(r->ctx);
	cr_assert_eq(peer_quit(&r->peer), 0, "target process did not exit cleanly");
}

/* A region at the target, imported on the endpoint. */
static struct kvx_xport_rmr *remote(struct rig *r, uint64_t len, uint32_t access, uint64_t seed, int *idx)
{
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	*idx = peer_reg(&r->peer, len, access, seed, d);
	cr_assert_geq(*idx, 0);
	struct kvx_xport_rmr *rmr = NULL;
	cr_assert_eq(kvx_xport_rmr_import(r->ep, d, sizeof(d), &rmr), 0);
	return rmr;
}

static struct kvx_xport_mr *local(struct rig *r, uint8_t **mem, uint64_t len)
{
	return local_mr(r->ctx, mem, len);
}

static void post(struct rig *r, enum kvx_xport_opcode opc, struct kvx_xport_mr *l, uint64_t loff,
		 struct kvx_xport_rmr *rm, uint64_t roff, uint64_t len, uint64_t cookie,
		 const struct kvx_xport_cond *cond)
{
	struct kvx_xport_op op = {.lmr = l, .rmr = rm, .loff = loff, .roff = roff, .len = len};
	cr_assert_eq(kvx_xport_post_bulk_cond(r->ep, opc, &op, 1, cookie, cond), 0);
}

TestSuite(transport_tcp_cond, .timeout = 180);

Test(transport_tcp_cond, applied_only_while_the_word_holds)
{
	struct rig r;
	rig_up(&r, 65536);
	int ri, li;
	const uint64_t len = 300000; /* several chunks */
	struct kvx_xport_rmr *rm = remote(&r, len, KVX_XPORT_ACCESS_ALL, SEED_R, &ri);
	struct kvx_xport_rmr *lw = remote(&r, 4096, KVX_XPORT_ACCESS_REMOTE_READ, SEED_L, &li);
	uint8_t *m;
	struct kvx_xport_mr *lm = local(&r, &m, len);
	struct kvx_xport_cond ok = {.rmr = lw, .roff = 64, .expect = word_of(SEED_L, 64)};
	struct kvx_xport_cond bad = ok;
	bad.expect ^= 1;

	/* Argument errors. */
	struct kvx_xport_op op = {.lmr = lm, .rmr = rm, .len = 8};
	struct kvx_xport_cond mis = ok;
	mis.roff = 61;
	cr_assert_eq(kvx_xport_post_bulk_cond(r.ep, KVX_XPORT_OP_WRITE, &op, 1, 1, &mis), -EINVAL);
	mis.roff = 4096;
	cr_assert_eq(kvx_xport_post_bulk_cond(r.ep, KVX_XPORT_OP_WRITE, &op, 1, 1, &mis), -EINVAL);
	cr_assert_eq(kvx_xport_post_bulk_cond(r.ep, KVX_XPORT_OP_WRITE, &op, 1, 1, NULL), -EINVAL);

	/* A WRITE whose word differs: -ESTALE, not one byte at the target. */
	pat_fill(m, len, SEED_W, 0);
	post(&r, KVX_XPORT_OP_WRITE, lm, 0, rm, 0, len, 1, &bad);
	struct kvx_xport_cpl c = wait_cpl(r.ep);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(c.bytes, 0);
	cr_assert_eq(peer_verify(&r.peer, ri, 0, len, SEED_R, 0), (int64_t)len, "a stale WRITE changed the target");
	/* A READ whose word differs: -ESTALE, the local buffer keeps its poison. */
	memset(m, POISON, len);
	post(&r, KVX_XPORT_OP_READ, lm, 0, rm, 0, len, 2, &bad);
	c = wait_cpl(r.ep);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	for (uint64_t i = 0; i < len; i++)
		cr_assert_eq(m[i], POISON, "a stale READ wrote local byte %llu", (unsigned long long)i);
	struct kvx_xport_counters k;
	cr_assert_eq(peer_counters(&r.peer, &k), 0);
	cr_assert_geq(k.reqs_rejected, 2 * ((len + r.chunk - 1) / r.chunk), "every chunk is refused");
	cr_assert_eq(k.bytes_served, 0);

	/* Whose word holds: applied, byte for byte. */
	post(&r, KVX_XPORT_OP_READ, lm, 0, rm, 0, len, 3, &ok);
	c = wait_cpl(r.ep);
	cr_assert_eq(c.status, 0, "status %d", c.status);
	cr_assert_eq(pat_check(m, len, SEED_R, 0), len);
	pat_fill(m, len, SEED_W, 0);
	post(&r, KVX_XPORT_OP_WRITE, lm, 0, rm, 0, len, 4, &ok);
	c = wait_cpl(r.ep);
	cr_assert_eq(c.status, 0, "status %d", c.status);
	cr_assert_eq(c.bytes, len);
	cr_assert_eq(peer_verify(&r.peer, ri, 0, len, SEED_W, 0), (int64_t)len);
	/* The word changes (one fill at the target, on its progress thread): refused again. */
	cr_assert_eq(peer_fill(&r.peer, li, 64, 8, SEED_REV, 64), 0);
	pat_fill(m, len, SEED_R, 0);
	post(&r, KVX_XPORT_OP_WRITE, lm, 0, rm, 0, len, 5, &ok);
	c = wait_cpl(r.ep);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	cr_assert_eq(peer_verify(&r.peer, ri, 0, len, SEED_W, 0), (int64_t)len);
	free(m);
	rig_down(&r);
}

/* Stream cases: NOPS ops of OPB bytes each. */
#define NOPS 24u
#define OPB (2 * MIB)

/* The two stream cases: a target region rm (index ri, filled with SEED_R) and a word region
 * lw (index li, SEED_L) of the target process, an initiator buffer m (registered as lm) of the
 * same len = NOPS * OPB bytes, left unfilled; one channel of 256 KiB chunks. */
struct stream {
	struct rig r;
	uint64_t len;
	int ri, li;
	struct kvx_xport_rmr *rm, *lw;
	uint8_t *m;
	struct kvx_xport_mr *lm;
};

static void stream_up(struct stream *s)
{
	rig_up(&s->r, 256 * 1024);
	s->len = (uint64_t)NOPS * OPB;
	s->rm = remote(&s->r, s->len, KVX_XPORT_ACCESS_ALL, SEED_R, &s->ri);
	s->lw = remote(&s->r, 4096, KVX_XPORT_ACCESS_REMOTE_READ, SEED_L, &s->li);
	s->lm = local(&s->r, &s->m, s->len);
}

static void stream_down(struct stream *s)
{
	free(s->m);
	rig_down(&s->r);
}

/* Conditional ops of 2 MiB each (8 chunks) stream in; after the first completed the word
 * changes at the target. Right then the target holds a written prefix [0, B) and the original
 * bytes after it; that never changes again, every op past B fails -ESTALE, every op before
 * it succeeded. Only the test's polls send requests, so at most the flow-control window
 * (8 MiB of payload) can still be in flight at the change: the last ops are refused. */
Test(transport_tcp_cond, write_stream_revoked_mid_transfer_stops_at_the_revocation_point)
{
	struct stream s;
	stream_up(&s);
	pat_fill(s.m, s.len, SEED_W, 0);
	struct kvx_xport_cond cond = {.rmr = s.lw, .roff = 8, .expect = word_of(SEED_L, 8)};
	for (uint32_t i = 0; i < NOPS; i++)
		post(&s.r, KVX_XPORT_OP_WRITE, s.lm, (uint64_t)i * OPB, s.rm, (uint64_t)i * OPB, OPB, i, &cond);
	int st[NOPS];
	for (uint32_t i = 0; i < NOPS; i++)
		st[i] = 1;
	struct kvx_xport_cpl c = wait_cpl(s.r.ep);
	cr_assert_eq(c.cookie, 0);
	cr_assert_eq(c.status, 0, "first op: status %d", c.status);
	st[0] = 0;
	/* Revoke: from here the target must not change one more byte. */
	cr_assert_eq(peer_fill(&s.r.peer, s.li, 8, 8, SEED_REV, 8), 0);
	int64_t b = peer_verify(&s.r.peer, s.ri, 0, s.len, SEED_W, 0);
	cr_assert_geq(b, (int64_t)OPB, "the first op's bytes are not all there");
	cr_assert_lt(b, (int64_t)s.len, "everything landed before the change: nothing tested");
	cr_assert_eq(peer_verify(&s.r.peer, s.ri, (uint64_t)b, s.len - (uint64_t)b, SEED_R, (uint64_t)b),
		     (int64_t)(s.len - (uint64_t)b), "not one written prefix at the change");
	for (uint32_t n = 1; n < NOPS; n++) {
		c = wait_cpl(s.r.ep);
		cr_assert_lt(c.cookie, NOPS);
		cr_assert_eq(st[c.cookie], 1, "two completions for op %llu", (unsigned long long)c.cookie);
		st[c.cookie] = c.status;
	}
	/* After every completion: still exactly the prefix of the change. */
	cr_assert_eq(peer_verify(&s.r.peer, s.ri, 0, s.len, SEED_W, 0), b, "bytes landed after the change");
	cr_assert_eq(peer_verify(&s.r.peer, s.ri, (uint64_t)b, s.len - (uint64_t)b, SEED_R, (uint64_t)b),
		     (int64_t)(s.len - (uint64_t)b), "bytes landed after the change");
	for (uint32_t i = 0; i < NOPS; i++) {
		uint64_t end = (uint64_t)(i + 1) * OPB;
		if (end <= (uint64_t)b)
			cr_assert_eq(st[i], 0, "op %u wholly landed but status %d", i, st[i]);
		else
			cr_assert_eq(st[i], -ESTALE, "op %u past the change: status %d", i, st[i]);
	}
	cr_assert_eq(st[NOPS - 1], -ESTALE);
	stream_down(&s);
}

/* READs likewise: after the change no response carries payload; the initiator's buffer holds the
 * region's bytes up to a chunk boundary and its poison after it. */
Test(transport_tcp_cond, read_stream_revoked_mid_transfer_returns_no_byte_after_it)
{
	struct stream s;
	stream_up(&s);
	memset(s.m, POISON, s.len);
	struct kvx_xport_cond cond = {.rmr = s.lw, .roff = 0, .expect = word_of(SEED_L, 0)};
	for (uint32_t i = 0; i < NOPS; i++)
		post(&s.r, KVX_XPORT_OP_READ, s.lm, (uint64_t)i * OPB, s.rm, (uint64_t)i * OPB, OPB, i, &cond);
	int st[NOPS];
	struct kvx_xport_cpl c = wait_cpl(s.r.ep);
	cr_assert_eq(c.cookie, 0);
	cr_assert_eq(c.status, 0, "first op: status %d", c.status);
	st[0] = 0;
	cr_assert_eq(peer_fill(&s.r.peer, s.li, 0, 8, SEED_REV, 0), 0);
	for (uint32_t n = 1; n < NOPS; n++) {
		c = wait_cpl(s.r.ep);
		cr_assert_lt(c.cookie, NOPS);
		st[c.cookie] = c.status;
	}
	/* b: the first chunk boundary after which the buffer is all poison; everything before it
	 * must be the region's bytes (a refused chunk that carried part of its payload breaks
	 * one or the other). */
	uint64_t b = s.len;
	while (b > 0 && s.m[b - 1] == POISON)
		b--;
	b = (b + s.r.chunk - 1) / s.r.chunk * s.r.chunk;
	cr_assert_geq(b, OPB);
	cr_assert_lt(b, s.len, "everything was read before the change: nothing tested");
	cr_assert_eq(pat_check(s.m, b, SEED_R, 0), b, "bytes read after the change (prefix %llu)",
		     (unsigned long long)b);
	for (uint32_t i = 0; i < NOPS; i++) {
		uint64_t end = (uint64_t)(i + 1) * OPB;
		cr_assert_eq(st[i], end <= b ? 0 : -ESTALE, "op %u: status %d (prefix %llu)", i, st[i],
			     (unsigned long long)b);
	}
	stream_down(&s);
}
