/* SPDX-License-Identifier: Apache-2.0 */
/* Issue 14, control plane, at the engine level through the public engine API: real engines on
 * loopback (real libzmq control sockets, real tcp provider). Where a scenario needs a peer the
 * engine API cannot play, the test uses real libzmq sockets speaking the docs/protocol.md wire
 * format, each named as a stand-in: a producer worker that repeats a write_done (DEALER), a
 * notify path that loses one write_done (a ROUTER/DEALER forwarder between P and D), and a stock
 * MoRIIO listener that accepts nothing but get_meta_msg (ROUTER). Scenarios:
 *  - item 4: a consumer expecting two write_done (producer TP 2) is not DONE on one repeated;
 *  - item 6: a producer that aborts during WRITE: the consumer ends ABORTED at once (never DONE)
 *    and gets its blocks back;
 *  - late allocation and a failed handshake reach the consumer as kvx_failed;
 *  - a lost write_done: the consumer asks before timing out, both sides end DONE;
 *  - a stock MoRIIO listener sees only get_meta_msg; transfers to it fail locally;
 *  - READ: a producer whose serve ended without success (abort right after serve, defer
 *    timeout) tells the consumer that asks (kvx_status_query naming its notify listener): the
 *    consumer ends with the producer's status and error long before its own timeout. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "engine_test_util.h"

TestSuite(runtime_engine_notes, .timeout = 120.0);

static struct kvx_engine_peer peer_of(const struct et_eng *g)
{
	return (struct kvx_engine_peer){.host = "127.0.0.1", .handshake_port = g->hs, .notify_port = g->nt};
}

static struct kvx_engine_stats stats(struct kvx_engine *e)
{
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st;
}

static bool late_at_least(struct kvx_engine *e, void *arg)
{
	return stats(e).late_notifications >= *(const uint64_t *)arg;
}

static bool received_at_least(struct kvx_engine *e, void *arg)
{
	return stats(e).notifications_received >= *(const uint64_t *)arg;
}

static bool bytes_at_least(struct kvx_engine *e, void *arg)
{
	return et_bytes_moved(e) >= *(const uint64_t *)arg;
}

/* Bytes one block pair moves per layer (K and V plane). */
#define LAYER_PAIR_BYTES ((uint64_t)2 * ET_BLOCK)

static struct kvx_msg_notify write_done_from(const char *tid, const char *engine, int64_t rank)
{
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	snprintf(m.sender_id, sizeof(m.sender_id), "%s", engine);
	m.sender_rank = rank;
	m.sender_epoch = engine[0] ? 7 : 0;
	return m;
}

Test(runtime_engine_notes, item4_duplicate_write_done_from_one_sender_is_not_done)
{
	/* D announces to a producer of TP 2: it expects one write_done per producer rank. A
	 * stand-in for the producer ranks (a real DEALER; the engine API cannot repeat a
	 * message) sends rank 0's write_done twice: the copy is ignored (counted late) and D stays
	 * pending; rank 1's then completes it. A MoRIIO producer names no sender: its acks keep
	 * MoRIIO's count semantics, so the same bare message twice completes (documented in
	 * docs/protocol.md §5.6). */
	struct kvx_engine_params dp;
	struct et_eng D;
	et_params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	dp.transfer_timeout_ms = 60000;
	et_start(&D, &dp, false);
	/* Nobody listens on the producer's ports: remote_blocks stays queued in D's DEALER. */
	struct kvx_engine_peer p2 = {.host = "127.0.0.1", .handshake_port = 1, .notify_port = 2, .tp_size = 2};
	const uint32_t dst[2] = {3, 4};
	struct kvx_engine_announce an = {.transfer_id = "tx-dup", .peer = p2, .local_blocks = dst, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	struct et_track td = {.n = 0};
	size_t k = et_follow(&td, "tx-dup");
	struct et_dealer pw;
	et_dealer_open(&pw, D.nt);
	struct kvx_msg_notify r0 = write_done_from("tx-dup", "127.0.0.1:1", 0);
	et_dealer_send(&pw, &r0);
	et_dealer_send(&pw, &r0);
	const uint64_t one = 1;
	cr_assert(et_wait_until(D.e, &td, late_at_least, (void *)&one), "D never handled the copy");
	cr_assert_eq(td.status[k], -1, "DONE on one write_done repeated (status %d)", td.status[k]);
	cr_assert_eq(stats(D.e).late_notifications, 1);
	struct kvx_msg_notify r1 = write_done_from("tx-dup", "127.0.0.1:1", 1);
	et_dealer_send(&pw, &r1);
	et_expect_done(D.e, &td, "tx-dup", false);

	/* MoRIIO semantics (no sender named): two bare write_done complete a TP-2 fan-in. */
	an.transfer_id = "tx-dup-moriio";
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	et_follow(&td, "tx-dup-moriio");
	struct kvx_msg_notify bare = write_done_from("tx-dup-moriio", "", -1);
	et_dealer_send(&pw, &bare);
	et_dealer_send(&pw, &bare);
	et_expect_done(D.e, &td, "tx-dup-moriio", false);
	et_dealer_close(&pw);
	cr_assert_eq(stats(D.e).transfers_done, 2);
	et_free(&D);
}

/* P WRITE begun with layer 0 ready only (layer 1 never), not sealed. */
static void begin_layer0(struct et_eng *p, const struct et_eng *d, const char *tid, const uint32_t *src, size_t n)
{
	struct kvx_engine_write w = {.transfer_id = tid, .peer = peer_of(d), .local_blocks = src, .n = n};
	cr_assert_eq(kvx_xfer_write_begin(p->e, &w), 0, "write_begin %s", tid);
	cr_assert_eq(kvx_xfer_layer_ready(p->e, tid, 0, NULL), 0);
}

/* Producer and consumer parameters in @p mode (et_params() defaults) with 60 s transfer and
 * defer timeouts: an end that comes sooner came from a note, not a deadline. */
static void long_params(struct kvx_engine_params *pp, struct kvx_engine_params *dp, enum kvx_sched_mode mode)
{
	et_params(pp, KVX_SCHED_PRODUCER, mode);
	et_params(dp, KVX_SCHED_CONSUMER, mode);
	pp->transfer_timeout_ms = dp->transfer_timeout_ms = 60000;
	pp->defer_timeout_ms = dp->defer_timeout_ms = 60000;
}

Test(runtime_engine_notes, item6_producer_abort_during_write_consumer_aborted_at_once)
{
	/* P aborts a WRITE after layer 0 landed and with layer 1 unwritten. Before: P sent one
	 * write_done on abort and D took it for completion (DONE with missing bytes). Now P sends
	 * kvx_failed once its ops are terminal; D ends ABORTED with P's error long before its own
	 * 60 s timeout, and gets its blocks back (no write can land after P's note). */
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	long_params(&pp, &dp, KVX_SCHED_MODE_WRITE);
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	const uint32_t src[2] = {1, 2}, dst[2] = {5, 6};
	struct kvx_engine_announce an = {.transfer_id = "tx-ab", .peer = peer_of(&P), .local_blocks = dst, .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	begin_layer0(&P, &D, "tx-ab", src, 2);
	const uint64_t layer0 = 2 * LAYER_PAIR_BYTES;
	struct et_track tp = {.n = 0}, td = {.n = 0};
	size_t kp = et_follow(&tp, "tx-ab"), kd = et_follow(&td, "tx-ab");
	cr_assert(et_wait_until(P.e, &tp, bytes_at_least, (void *)&layer0), "layer 0 never landed");
	uint64_t t0 = kvx_now_ns();
	cr_assert_eq(kvx_xfer_abort(P.e, "tx-ab"), 0);
	cr_assert(et_wait(P.e, &tp, "tx-ab", true));
	cr_assert_eq(tp.status[kp], KVX_CPL_ABORTED, "P status %d error %d", tp.status[kp], tp.error[kp]);
	cr_assert_eq(tp.error[kp], -ECANCELED);
	cr_assert(et_wait(D.e, &td, "tx-ab", true), "D neither ended nor released within the deadline");
	uint64_t took = kvx_now_ns() - t0;
	cr_assert_eq(td.status[kd], KVX_CPL_ABORTED, "D status %d error %d", td.status[kd], td.error[kd]);
	cr_assert_eq(td.error[kd], -ECANCELED);
	cr_assert_eq(td.released[kd], 1, "D's blocks not released after P's note");
	cr_assert_lt(took, 30000000000ull, "took %llu ns (D's own timeout is 60 s)", (unsigned long long)took);
	struct kvx_engine_stats sd = stats(D.e);
	cr_assert_eq(sd.transfers_done, 0);
	cr_assert_eq(sd.transfers_aborted, 1);
	/* Layer 1 of D's blocks was never written. */
	for (int i = 0; i < 2; i++)
		for (uint32_t pl = 0; pl < 2; pl++)
			cr_assert_eq(et_block(&D, 1, pl, dst[i])[0], 0);
	et_pair_free(&P, &D);
}

Test(runtime_engine_notes, late_allocation_answered_with_the_producers_status)
{
	/* P aborts before D has announced (P holds no allocation: nobody to tell yet). D's
	 * remote_blocks then reaches a finished transfer on P: P answers kvx_failed at once, and D
	 * ends ABORTED with P's error, blocks released, instead of waiting for its 60 s timeout. */
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	long_params(&pp, &dp, KVX_SCHED_MODE_WRITE);
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	const uint32_t src[1] = {1}, dst[1] = {7};
	begin_layer0(&P, &D, "tx-late", src, 1);
	cr_assert_eq(kvx_xfer_abort(P.e, "tx-late"), 0);
	struct et_track tp = {.n = 0}, td = {.n = 0};
	size_t kp = et_follow(&tp, "tx-late"), kd = et_follow(&td, "tx-late");
	cr_assert(et_wait(P.e, &tp, "tx-late", true));
	cr_assert_eq(tp.status[kp], KVX_CPL_ABORTED);
	uint64_t t0 = kvx_now_ns();
	struct kvx_engine_announce an = {.transfer_id = "tx-late", .peer = peer_of(&P), .local_blocks = dst, .n = 1};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	cr_assert(et_wait(D.e, &td, "tx-late", true));
	uint64_t took = kvx_now_ns() - t0;
	cr_assert_eq(td.status[kd], KVX_CPL_ABORTED, "D status %d error %d", td.status[kd], td.error[kd]);
	cr_assert_eq(td.error[kd], -ECANCELED);
	cr_assert_eq(td.released[kd], 1);
	cr_assert_lt(took, 30000000000ull, "took %llu ns", (unsigned long long)took);
	cr_assert_eq(et_bytes_moved(P.e), 0);
	et_expect_blocks(&D, NULL, NULL, 0, true);
	et_pair_free(&P, &D);
}

Test(runtime_engine_notes, failed_handshake_reaches_the_consumer)
{
	/* P cannot handshake with D (nothing listens on the handshake port P was given; D's
	 * notify port is real). D announced first, so P holds D's allocation: its handshake
	 * failure (-ETIMEDOUT after 300 ms) goes to D as kvx_failed, and D fails with it at once. */
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	long_params(&pp, &dp, KVX_SCHED_MODE_WRITE);
	pp.handshake_timeout_ms = 300;
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	const uint32_t src[1] = {2}, dst[1] = {3};
	struct kvx_engine_announce an = {.transfer_id = "tx-hs", .peer = peer_of(&P), .local_blocks = dst, .n = 1};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	struct et_track tp = {.n = 0}, td = {.n = 0};
	const uint64_t one = 1;
	cr_assert(et_wait_until(P.e, &tp, received_at_least, (void *)&one), "P never got remote_blocks");
	/* A port nothing listens on: bound by a socket that is then closed. */
	void *ctx = zmq_ctx_new();
	void *s = zmq_socket(ctx, ZMQ_ROUTER);
	cr_assert_eq(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
	char ep[64];
	size_t el = sizeof(ep);
	zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &el);
	uint16_t dead = (uint16_t)atoi(strrchr(ep, ':') + 1);
	zmq_close(s);
	zmq_ctx_term(ctx);
	struct kvx_engine_write w = {.transfer_id = "tx-hs",
				     .peer = {.host = "127.0.0.1", .handshake_port = dead, .notify_port = D.nt},
				     .local_blocks = src,
				     .n = 1};
	size_t kp = et_follow(&tp, "tx-hs"), kd = et_follow(&td, "tx-hs");
	cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
	cr_assert(et_wait(P.e, &tp, "tx-hs", true));
	cr_assert_eq(tp.status[kp], KVX_CPL_FAILED, "P status %d error %d", tp.status[kp], tp.error[kp]);
	cr_assert_eq(tp.error[kp], -ETIMEDOUT);
	cr_assert(et_wait(D.e, &td, "tx-hs", true));
	cr_assert_eq(td.status[kd], KVX_CPL_FAILED, "D status %d error %d", td.status[kd], td.error[kd]);
	cr_assert_eq(td.error[kd], -ETIMEDOUT, "D has P's error");
	cr_assert_eq(td.released[kd], 1);
	et_expect_blocks(&D, NULL, NULL, 0, true);
	et_pair_free(&P, &D);
}

/* READ: P's serve ended without success before D reads (abort right after serve, or its defer
 * timeout); D's read then finds the lease revoked and asks P, whose kvx_failed gives D P's
 * status and error: D ends with them, blocks released and untouched, long before its own
 * 60 s transfer timeout (and without P's note it would have only -ESTALE). */
static void read_after_serve_ended(bool abort, enum kvx_cpl_status want, int want_err)
{
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	long_params(&pp, &dp, KVX_SCHED_MODE_READ);
	if (!abort)
		pp.defer_timeout_ms = 300; /* P's serve times out; D's read allows 60 s */
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	const uint32_t src[2] = {1, 2}, dst[2] = {5, 6};
	struct et_track tp = {.n = 0}, td = {.n = 0};
	size_t kp = et_follow(&tp, "tx-rf"), kd = et_follow(&td, "tx-rf");
	struct kvx_engine_serve sv = {.transfer_id = "tx-rf", .local_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
	if (abort)
		cr_assert_eq(kvx_xfer_abort(P.e, "tx-rf"), 0);
	cr_assert(et_wait(P.e, &tp, "tx-rf", true), "P's serve never ended");
	cr_assert_eq(tp.status[kp], want, "P status %d error %d", tp.status[kp], tp.error[kp]);
	uint64_t t0 = kvx_now_ns();
	struct kvx_engine_read r = {.transfer_id = "tx-rf", .peer = peer_of(&P), .local_blocks = dst,
				    .remote_blocks = src, .n = 2};
	cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
	cr_assert(et_wait(D.e, &td, "tx-rf", true), "D neither ended nor released within the deadline");
	uint64_t took = kvx_now_ns() - t0;
	cr_assert_eq(td.status[kd], want, "D status %d error %d (P's note not applied)", td.status[kd], td.error[kd]);
	cr_assert_eq(td.error[kd], want_err, "D error %d (%s)", td.error[kd], kvx_strerror(td.error[kd]));
	cr_assert_eq(td.released[kd], 1);
	cr_assert_lt(took, (uint64_t)dp.transfer_timeout_ms * 1000000ull / 2, "took %llu ns of D's %u ms timeout",
		     (unsigned long long)took, dp.transfer_timeout_ms);
	et_expect_blocks(&D, NULL, NULL, 0, true);
	cr_assert_eq(stats(D.e).transfers_done, 0);
	et_pair_free(&P, &D);
}

Test(runtime_engine_notes, read_producer_abort_after_serve_consumer_ends_with_its_status)
{
	read_after_serve_ended(true, KVX_CPL_ABORTED, -ECANCELED);
}

Test(runtime_engine_notes, read_producer_defer_timeout_consumer_ends_with_its_status)
{
	read_after_serve_ended(false, KVX_CPL_TIMED_OUT, -ETIMEDOUT);
}

/* Stand-in for a lossy notify path from P to D: a ROUTER that P sends to, forwarding every
 * frame to D's notify port through a DEALER, except the first write_done of one transfer. */
struct lossy {
	void *ctx, *in, *out;
	uint16_t port;
	const char *drop_tid;
	atomic_bool stop;
	atomic_int write_done_seen, dropped, forwarded;
	pthread_t th;
};

static void *lossy_run(void *arg)
{
	struct lossy *l = arg;
	while (!atomic_load(&l->stop)) {
		zmq_pollitem_t it = {.socket = l->in, .events = ZMQ_POLLIN};
		if (zmq_poll(&it, 1, 20) <= 0)
			continue;
		zmq_msg_t id, pl;
		zmq_msg_init(&id);
		zmq_msg_init(&pl);
		if (zmq_msg_recv(&id, l->in, 0) < 0 || !zmq_msg_more(&id) || zmq_msg_recv(&pl, l->in, 0) < 0) {
			zmq_msg_close(&id);
			zmq_msg_close(&pl);
			continue;
		}
		struct kvx_msg_notify m;
		uint32_t ids[ET_NB];
		m.block_ids = ids;
		m.blocks_cap = ET_NB;
		bool drop = false;
		if (kvx_msg_notify_decode(zmq_msg_data(&pl), zmq_msg_size(&pl), &m, NULL, 0) == 0 &&
		    m.type == KVX_MSG_WRITE_DONE && !strcmp(m.transfer_id, l->drop_tid))
			drop = atomic_fetch_add(&l->write_done_seen, 1) == 0;
		if (drop) {
			atomic_fetch_add(&l->dropped, 1);
		} else {
			zmq_send(l->out, zmq_msg_data(&pl), zmq_msg_size(&pl), 0);
			atomic_fetch_add(&l->forwarded, 1);
		}
		zmq_msg_close(&id);
		zmq_msg_close(&pl);
	}
	return NULL;
}

static void lossy_start(struct lossy *l, uint16_t d_notify, const char *drop_tid)
{
	memset(l, 0, sizeof(*l));
	l->drop_tid = drop_tid;
	l->ctx = zmq_ctx_new();
	l->in = zmq_socket(l->ctx, ZMQ_ROUTER);
	l->out = zmq_socket(l->ctx, ZMQ_DEALER);
	cr_assert_eq(zmq_bind(l->in, "tcp://127.0.0.1:*"), 0);
	char ep[64];
	size_t el = sizeof(ep);
	zmq_getsockopt(l->in, ZMQ_LAST_ENDPOINT, ep, &el);
	l->port = (uint16_t)atoi(strrchr(ep, ':') + 1);
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", d_notify);
	cr_assert_eq(zmq_connect(l->out, ep), 0);
	cr_assert_eq(pthread_create(&l->th, NULL, lossy_run, l), 0);
}

static void lossy_stop(struct lossy *l)
{
	atomic_store(&l->stop, true);
	pthread_join(l->th, NULL);
	int zero = 0;
	zmq_setsockopt(l->in, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(l->out, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_close(l->in);
	zmq_close(l->out);
	zmq_ctx_term(l->ctx);
}

Test(runtime_engine_notes, lost_write_done_status_query_both_done)
{
	/* P's write_done for tx-q2 is lost on the way (stand-in forwarder). Before: P DONE, D
	 * TIMED_OUT. Now D, shortly before its deadline, asks P (it knows P is a kvxfer engine from tx-q1's
	 * named write_done); P answers from its record with write_done again; both end DONE and D
	 * holds P's bytes. */
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	long_params(&pp, &dp, KVX_SCHED_MODE_WRITE);
	dp.transfer_timeout_ms = 4000;
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	struct lossy l;
	lossy_start(&l, D.nt, "tx-q2");
	struct kvx_engine_peer d_via = {.host = "127.0.0.1", .handshake_port = D.hs, .notify_port = l.port};
	struct et_track tp = {.n = 0}, td = {.n = 0};
	const char *tids[2] = {"tx-q1", "tx-q2"};
	const uint32_t src[2][1] = {{1}, {2}}, dst[2][1] = {{8}, {9}};
	size_t kd[2], kp[2];
	uint64_t t0 = 0;
	for (int i = 0; i < 2; i++) {
		kd[i] = et_follow(&td, tids[i]);
		kp[i] = et_follow(&tp, tids[i]);
		struct kvx_engine_announce an = {.transfer_id = tids[i], .peer = peer_of(&P), .local_blocks = dst[i], .n = 1};
		t0 = kvx_now_ns();
		cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
		struct kvx_engine_write w = {.transfer_id = tids[i], .peer = d_via, .local_blocks = src[i], .n = 1};
		cr_assert_eq(kvx_xfer_write_begin(P.e, &w), 0);
		for (uint32_t ly = 0; ly < ET_NL; ly++)
			cr_assert_eq(kvx_xfer_layer_ready(P.e, tids[i], ly, NULL), 0);
		cr_assert_eq(kvx_xfer_seal(P.e, tids[i], ET_NL), 0);
		et_expect_done(P.e, &tp, tids[i], true);
		if (i == 0)
			et_expect_done(D.e, &td, tids[i], false);
	}
	et_expect_done(D.e, &td, "tx-q2", false);
	uint64_t took = kvx_now_ns() - t0;
	/* The query goes out a grace (1 s) before D's 4 s deadline. */
	cr_assert_geq(took, 3000000000ull, "DONE before the query: the write_done was not lost?");
	cr_assert_eq(atomic_load(&l.dropped), 1);
	cr_assert_eq(atomic_load(&l.write_done_seen), 2, "P answered the query with write_done");
	cr_assert_eq(td.error[kd[1]], 0);
	cr_assert_eq(tp.status[kp[1]], KVX_CPL_DONE);
	struct kvx_engine_stats sd = stats(D.e);
	cr_assert_eq(sd.transfers_done, 2);
	cr_assert_eq(sd.transfers_timed_out, 0);
	const uint32_t all_dst[2] = {8, 9}, all_src[2] = {1, 2};
	et_expect_blocks(&D, all_dst, all_src, 2, true);
	lossy_stop(&l);
	et_pair_free(&P, &D);
}

/* Stand-in for a stock vLLM MoRIIO worker's handshake listener (docs/protocol.md §3.1): a ROUTER
 * that answers get_meta_msg with metadata WITHOUT kvx_ keys and a region map, and, like the
 * reference listener, stops serving at the first other message. */
struct moriio {
	void *ctx, *sock;
	uint16_t port;
	uint8_t meta[2048], layers[2048];
	int meta_len, layers_len;
	atomic_bool stop, broken;
	atomic_int get_meta, other;
	pthread_t th;
};

static void reply(void *s, zmq_msg_t *id, const void *p, size_t n)
{
	zmq_msg_t c;
	zmq_msg_init(&c);
	zmq_msg_copy(&c, id);
	zmq_msg_send(&c, s, ZMQ_SNDMORE);
	zmq_send(s, "", 0, ZMQ_SNDMORE);
	zmq_send(s, p, n, 0);
}

static void *moriio_run(void *arg)
{
	struct moriio *m = arg;
	while (!atomic_load(&m->stop)) {
		zmq_pollitem_t it = {.socket = m->sock, .events = ZMQ_POLLIN};
		if (zmq_poll(&it, 1, 20) <= 0)
			continue;
		zmq_msg_t id, pl;
		zmq_msg_init(&id);
		zmq_msg_init(&pl);
		if (zmq_msg_recv(&id, m->sock, 0) >= 0 && zmq_msg_more(&id) && zmq_msg_recv(&pl, m->sock, 0) >= 0) {
			if (atomic_load(&m->broken)) {
				atomic_fetch_add(&m->other, 1);
			} else if (zmq_msg_size(&pl) == KVX_MSG_GET_META_LEN &&
				   !memcmp(zmq_msg_data(&pl), KVX_MSG_GET_META, KVX_MSG_GET_META_LEN)) {
				atomic_fetch_add(&m->get_meta, 1);
				reply(m->sock, &id, m->meta, (size_t)m->meta_len);
				reply(m->sock, &id, m->layers, (size_t)m->layers_len);
			} else {
				atomic_fetch_add(&m->other, 1);
				atomic_store(&m->broken, true); /* the reference listener's thread exits */
			}
		}
		zmq_msg_close(&id);
		zmq_msg_close(&pl);
	}
	return NULL;
}

static void moriio_start(struct moriio *m)
{
	memset(m, 0, sizeof(*m));
	m->ctx = zmq_ctx_new();
	m->sock = zmq_socket(m->ctx, ZMQ_ROUTER);
	cr_assert_eq(zmq_bind(m->sock, "tcp://127.0.0.1:*"), 0);
	char ep[64];
	size_t el = sizeof(ep);
	zmq_getsockopt(m->sock, ZMQ_LAST_ENDPOINT, ep, &el);
	m->port = (uint16_t)atoi(strrchr(ep, ':') + 1);
	struct kvx_msg_region reg[ET_NL * 2];
	struct kvx_msg_memdesc descs[ET_NL * 2];
	static uint8_t mem[ET_NL * 2][ET_NB * ET_BLOCK];
	for (uint32_t i = 0; i < ET_NL * 2; i++) {
		reg[i] = (struct kvx_msg_region){.addr = (uint64_t)(uintptr_t)mem[i], .len_bytes = sizeof(mem[i])};
		memset(&descs[i], 0, sizeof(descs[i]));
		snprintf(descs[i].layer, sizeof(descs[i].layer), "model.layers.%u.attn", i / 2);
		descs[i].id = i;
		descs[i].device_id = 0;
		descs[i].addr = reg[i].addr;
		descs[i].len_bytes = reg[i].len_bytes;
		descs[i].loc = 2;
	}
	struct kvx_msg_meta meta;
	memset(&meta, 0, sizeof(meta));
	snprintf(meta.engine_id, sizeof(meta.engine_id), "127.0.0.1:%u", m->port);
	snprintf(meta.engine_key, sizeof(meta.engine_key), "moriio-standin-p");
	snprintf(meta.hostname, sizeof(meta.hostname), "standin");
	snprintf(meta.host, sizeof(meta.host), "127.0.0.1");
	meta.num_blocks = ET_NB;
	meta.block_len = ET_BLOCK;
	snprintf(meta.attn_backend, sizeof(meta.attn_backend), "FLASH_ATTN");
	meta.has_kvx = false;
	meta.num_regions = ET_NL * 2;
	meta.regions = reg;
	m->meta_len = kvx_msg_meta_encode(&meta, m->meta, sizeof(m->meta));
	cr_assert_gt(m->meta_len, 0);
	struct kvx_msg_layers ly = {.num_descs = ET_NL * 2, .descs = descs};
	snprintf(ly.engine_key, sizeof(ly.engine_key), "moriio-standin-p");
	m->layers_len = kvx_msg_layers_encode(&ly, m->layers, sizeof(m->layers));
	cr_assert_gt(m->layers_len, 0);
	cr_assert_eq(pthread_create(&m->th, NULL, moriio_run, m), 0);
}

static void moriio_stop(struct moriio *m)
{
	atomic_store(&m->stop, true);
	pthread_join(m->th, NULL);
	int zero = 0;
	zmq_setsockopt(m->sock, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_close(m->sock);
	zmq_ctx_term(m->ctx);
}

Test(runtime_engine_notes, stock_moriio_listener_sees_only_get_meta)
{
	/* A kvxfer consumer reads from a stock MoRIIO producer: the handshake stops after the two
	 * replies (no kvx_connect, which would stop the reference listener), and the transfer
	 * fails locally with -EPROTONOSUPPORT (the log says kvxfer moves data only between kvxfer
	 * engines). A second transfer fails the same way without dialling the worker again. The
	 * listener keeps serving: it saw nothing but get_meta_msg. */
	struct moriio m;
	moriio_start(&m);
	struct kvx_engine_params dp;
	struct et_eng D;
	et_params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	et_start(&D, &dp, false);
	struct et_track td = {.n = 0};
	const char *tids[2] = {"tx-mo1", "tx-mo2"};
	for (int i = 0; i < 2; i++) {
		struct kvx_engine_read r = {.transfer_id = tids[i],
					    .peer = {.host = "127.0.0.1", .handshake_port = m.port, .notify_port = m.port},
					    .local_blocks = (uint32_t[]){1},
					    .remote_blocks = (uint32_t[]){2},
					    .n = 1};
		size_t k = et_follow(&td, tids[i]);
		cr_assert_eq(kvx_xfer_read(D.e, &r), 0);
		cr_assert(et_wait(D.e, &td, tids[i], true));
		cr_assert_eq(td.status[k], KVX_CPL_FAILED, "status %d error %d", td.status[k], td.error[k]);
		cr_assert_eq(td.error[k], -EPROTONOSUPPORT);
		cr_assert_eq(td.bytes[k], 0);
	}
	cr_assert_eq(atomic_load(&m.get_meta), 1, "one handshake, not repeated");
	cr_assert_eq(atomic_load(&m.other), 0, "the stock listener was sent something other than get_meta_msg");
	cr_assert_not(atomic_load(&m.broken));
	et_expect_blocks(&D, NULL, NULL, 0, true);
	et_free(&D);
	moriio_stop(&m);
}

/* Peers named by one submission each: distinct notify ports nobody listens on (n = 0 transfers
 * need no handshake: D WRITE sends `release` and is DONE at once). */
static void announce_empty(struct et_eng *D, struct et_track *td, const char *tid, uint16_t port)
{
	struct kvx_engine_announce an = {.transfer_id = tid,
					 .peer = {.host = "127.0.0.1", .handshake_port = port, .notify_port = port},
					 .n = 0};
	cr_assert_eq(kvx_xfer_announce(D->e, &an), 0, "peer %u refused", port);
	et_follow(td, tid);
	et_expect_done(D->e, td, tid, false);
	td->n = 0; /* the tracker follows one transfer at a time */
}

Test(runtime_engine_notes, idle_peers_evicted_more_distinct_peers_than_the_table)
{
	/* Before: the 65th distinct peer was refused with -ENOBUFS forever. With
	 * params.peer_idle_ms = 0 a peer without live transfers is forgotten when its slot is
	 * needed: 3 x KVX_ENGINE_MAX_PEERS distinct peers over time are all served. */
	struct kvx_engine_params dp;
	struct et_eng D;
	et_params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	dp.peer_idle_ms = 0;
	et_start(&D, &dp, false);
	struct et_track td = {.n = 0};
	char tid[32];
	for (int i = 0; i < 3 * KVX_ENGINE_MAX_PEERS; i++) {
		snprintf(tid, sizeof(tid), "tx-ev-%d", i);
		announce_empty(&D, &td, tid, (uint16_t)(20000 + i));
	}
	struct kvx_engine_stats st = stats(D.e);
	cr_assert_eq(st.transfers_done, 3 * KVX_ENGINE_MAX_PEERS);
	cr_assert_leq(st.n_peers, KVX_ENGINE_MAX_PEERS);
	et_free(&D);

	/* With the default (60 s) nothing is idle long enough: the 65th is refused (retryable). */
	et_params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	et_start(&D, &dp, false);
	for (int i = 0; i < KVX_ENGINE_MAX_PEERS; i++) {
		snprintf(tid, sizeof(tid), "tx-ev2-%d", i);
		announce_empty(&D, &td, tid, (uint16_t)(20000 + i));
	}
	struct kvx_engine_announce an = {.transfer_id = "tx-ev2-x",
					 .peer = {.host = "127.0.0.1", .handshake_port = 1, .notify_port = 1},
					 .n = 0};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), -ENOBUFS);
	et_free(&D);
}

static bool read_ok(struct kvx_engine *e, struct et_track *t, const struct kvx_engine_read *r)
{
	/* Retry while the evicted peer's connection drains (-ENOBUFS: an RCU grace period and its
	 * last reference), pumping completions, up to the test deadline. */
	uint64_t t0 = kvx_now_ns();
	int rc;
	while ((rc = kvx_xfer_read(e, r)) == -ENOBUFS && kvx_now_ns() - t0 < ET_DEADLINE_NS)
		et_pump(e, t);
	return rc == 0;
}

Test(runtime_engine_notes, evicted_peer_with_a_connection_reconnects_when_named_again)
{
	/* D READ from a real producer (a connection exists), then enough other peers to need its
	 * slot: the producer's peer is forgotten (its connection leaves the RCU table and is
	 * destroyed after a grace period), the slot reused. Naming the producer again handshakes
	 * anew and moves the right bytes. */
	struct kvx_engine_params pp, dp;
	struct et_eng P, D;
	et_params(&pp, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_READ);
	et_params(&dp, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_READ);
	dp.peer_idle_ms = 0;
	et_start(&P, &pp, true);
	et_start(&D, &dp, false);
	struct et_track tp = {.n = 0}, td = {.n = 0};
	const char *tids[2] = {"tx-re1", "tx-re2"};
	const uint32_t src[2] = {3, 4}, dst[2] = {10, 11};
	for (int round = 0; round < 2; round++) {
		struct kvx_engine_serve sv = {.transfer_id = tids[round], .local_blocks = &src[round], .n = 1};
		cr_assert_eq(kvx_xfer_serve(P.e, &sv), 0);
		struct kvx_engine_read r = {.transfer_id = tids[round], .peer = peer_of(&P),
					    .local_blocks = &dst[round], .remote_blocks = &src[round], .n = 1};
		cr_assert(read_ok(D.e, &td, &r), "read %s refused", tids[round]);
		et_follow(&td, tids[round]);
		et_follow(&tp, tids[round]);
		et_expect_done(D.e, &td, tids[round], false);
		et_expect_done(P.e, &tp, tids[round], true);
		td.n = 0;
		tp.n = 0;
		if (round == 1)
			break;
		/* KVX_ENGINE_MAX_PEERS other peers (n = 0 reads: `release` only, no handshake). */
		char tid[32];
		for (int i = 0; i < KVX_ENGINE_MAX_PEERS; i++) {
			snprintf(tid, sizeof(tid), "tx-re-o%d", i);
			struct kvx_engine_read o = {.transfer_id = tid,
						    .peer = {.host = "127.0.0.1",
							     .handshake_port = (uint16_t)(21000 + i),
							     .notify_port = (uint16_t)(21000 + i)},
						    .n = 0};
			cr_assert(read_ok(D.e, &td, &o), "peer %d refused", i);
			et_follow(&td, tid);
			et_expect_done(D.e, &td, tid, false);
			td.n = 0;
		}
	}
	const uint32_t all_dst[2] = {10, 11}, all_src[2] = {3, 4};
	et_expect_blocks(&D, all_dst, all_src, 2, true);
	cr_assert_eq(stats(D.e).transfers_done, 2 + KVX_ENGINE_MAX_PEERS);
	et_pair_free(&P, &D);
}
