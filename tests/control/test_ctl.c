/* SPDX-License-Identifier: Apache-2.0 */
/* The control lcore: lifecycle, inboxes, notify path, DEALER cache, handshake jobs, watched fds. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#ifdef KVX_TSAN_RUNNER /* TSan build: Criterion cannot start (tests/lcore/tsan_runner.h) */
#include "tests/lcore/tsan_runner.h"
#define cr_assert_str_eq(a, b, ...) KVX_TSAN_CHECK(!strcmp((a), (b)), #a " == " #b)
#else
#include <criterion/criterion.h>
#endif

#include "ctl_test_util.h"
#include "kvxfer/lcore.h"

TestSuite(control_ctl, .timeout = 60.0);

Test(control_ctl, start_stop_twice_is_safe)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *ctl = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), 0);
	uint16_t hs = 0, nt = 0;
	cr_assert_eq(kvx_ctl_bound_ports(ctl, &hs, &nt), -EAGAIN);
	cr_assert_eq(kvx_ctl_start(ctl), 0);
	cr_assert_eq(kvx_ctl_start(ctl), -EBUSY);
	cr_assert_eq(kvx_ctl_bound_ports(ctl, &hs, &nt), 0);
	cr_assert_neq(hs, 0);
	cr_assert_neq(nt, 0);
	cr_assert_neq(hs, nt);
	cr_assert_neq(kvx_ctl_epoch(ctl), 0);
	kvx_ctl_stop(ctl);
	kvx_ctl_stop(ctl);
	kvx_ctl_destroy(ctl);
	kvx_ctl_destroy(NULL);
}

Test(control_ctl, create_rejects_bad_params)
{
	struct kvx_ctl_params p;
	struct kvx_ctl *ctl = NULL;
	tctl_params(&p, NULL);
	p.tp_rank = 1;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), -EINVAL);
	tctl_params(&p, NULL);
	p.host = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), -EINVAL);
	tctl_params(&p, NULL);
	p.inbox_slots = 100;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), -EINVAL);
	tctl_params(&p, NULL);
	p.proxy_address = "10.0.0.1";
	p.http_address = "10.0.0.1:8000";
	cr_assert_eq(kvx_ctl_create(&p, &ctl), -EINVAL);
	p.proxy_address = "10.0.0.1:36367";
	p.http_address = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), -EINVAL);
	cr_assert_null(ctl);
}

Test(control_ctl, bind_conflict_reports_eaddrinuse)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *a = tctl_start(&p);
	uint16_t hs, nt;
	cr_assert_eq(kvx_ctl_bound_ports(a, &hs, &nt), 0);
	p.ephemeral_ports = false;
	p.handshake_base_port = hs;
	p.notify_base_port = (uint16_t)(hs == 65535 ? 1 : hs + 1);
	struct kvx_ctl *b = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &b), 0);
	cr_assert_eq(kvx_ctl_start(b), -EADDRINUSE);
	kvx_ctl_destroy(b);
	kvx_ctl_destroy(a);
}

Test(control_ctl, notify_roundtrip_between_two_objects)
{
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *a = tctl_start(&p);
	tctl_params(&p, &cb);
	p.role = KVX_CTL_ROLE_CONSUMER;
	struct kvx_ctl *b = tctl_start(&p);
	uint16_t bn;
	cr_assert_eq(kvx_ctl_bound_ports(b, NULL, &bn), 0);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(a, &ib), 0);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;
	strcpy(m.transfer_id, "tx-roundtrip");
	cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", bn, &m), 0);
	m.type = KVX_MSG_RELEASE;
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 4;
	cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", bn, &m), 0);
	cr_assert_eq(coll_wait(&cb, 2, 10.0), 2);
	cr_assert_eq(cb.msgs[0].m.type, KVX_MSG_WRITE_DONE);
	cr_assert_str_eq(cb.msgs[0].m.transfer_id, "tx-roundtrip");
	cr_assert_eq(cb.msgs[1].m.type, KVX_MSG_RELEASE);
	cr_assert_eq(cb.msgs[1].m.consumer_tp_size, 4);
	/* a counts a send after zmq_send() returned: b may deliver first. */
	cr_assert(WAIT_CTR(a, notify_tx, 2, 10.0));
	cr_assert_eq(CTR(a, notify_tx), 2);
	cr_assert_eq(CTR(b, notify_rx), 2);
	cr_assert_eq(CTR(a, peers_open), 1, "one cached DEALER for one path");
	cr_assert_eq(kvx_ctl_send_notify(ib, "", bn, &m), -EINVAL);
	cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", 0, &m), -EINVAL);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(a);
	kvx_ctl_destroy(b);
	coll_fini(&cb);
}

/* kvx_ctl_stop() flushes: notifications queued just before the sender is destroyed (an
 * engine's last `release` / `write_done`) still reach a live peer, in order (bounded linger,
 * KVX_CTL_STOP_FLUSH_MS). With LINGER 0 the tail of this burst was dropped at close. */
Test(control_ctl, destroy_right_after_send_still_delivers_queued_notifies)
{
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &cb);
	p.role = KVX_CTL_ROLE_CONSUMER;
	struct kvx_ctl *b = tctl_start(&p);
	uint16_t bn;
	cr_assert_eq(kvx_ctl_bound_ports(b, NULL, &bn), 0);
	tctl_params(&p, NULL);
	struct kvx_ctl *a = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(a, &ib), 0);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_RELEASE;
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 1;
	enum { N = 50 };
	for (int i = 0; i < N; i++) {
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-flush-%02d", i);
		cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", bn, &m), 0);
	}
	kvx_ctl_destroy(a); /* no wait for a's sends: the flush is what is under test */
	cr_assert_eq(coll_wait(&cb, N, 10.0), N);
	for (int i = 0; i < N; i++) {
		char want[32];
		snprintf(want, sizeof(want), "tx-flush-%02d", i);
		cr_assert_str_eq(cb.msgs[i].m.transfer_id, want);
	}
	kvx_ctl_destroy(b);
	coll_fini(&cb);
}

Test(control_ctl, large_remote_blocks_travel_intact)
{
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &cb);
	struct kvx_ctl *b = tctl_start(&p);
	uint16_t bn;
	kvx_ctl_bound_ports(b, NULL, &bn);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(b, &ib), 0);
	enum { N = 20000 };
	uint32_t *ids = malloc(N * sizeof(uint32_t));
	for (uint32_t i = 0; i < N; i++)
		ids[i] = 100000 + i;
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_REMOTE_BLOCKS;
	strcpy(m.transfer_id, "tx-big");
	strcpy(m.req_id, "req-big");
	m.decode_rank = 7;
	m.block_ids = ids;
	m.num_blocks = N;
	cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", bn, &m), 0);
	cr_assert_eq(coll_wait(&cb, 1, 10.0), 1);
	cr_assert_eq(cb.msgs[0].m.num_blocks, N);
	cr_assert_eq(cb.msgs[0].m.decode_rank, 7);
	cr_assert_arr_eq(cb.msgs[0].ids, ids, COLL_IDS * sizeof(uint32_t));
	free(ids);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(b);
	coll_fini(&cb);
}

Test(control_ctl, inbox_full_returns_enobufs)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.inbox_slots = 4;
	struct kvx_ctl *ctl = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), 0);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &ib), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(kvx_ctl_mark_terminal(ib, "tx"), 0);
	cr_assert_eq(kvx_ctl_mark_terminal(ib, "tx"), -ENOBUFS);
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", 1, "x", 1), -ENOBUFS);
	cr_assert_eq(CTR(ctl, inbox_full), 2);
	cr_assert_eq(kvx_ctl_mark_terminal(ib, ""), -EINVAL);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(ctl);
}

Test(control_ctl, max_inboxes_enforced)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.max_inboxes = 2;
	struct kvx_ctl *ctl = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), 0);
	struct kvx_ctl_inbox *a, *b, *c;
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &a), 0);
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &b), 0);
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &c), -ENOBUFS);
	kvx_ctl_inbox_close(a);
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &c), 0, "closing frees the slot");
	kvx_ctl_inbox_close(b);
	kvx_ctl_inbox_close(c);
	kvx_ctl_destroy(ctl);
}

struct evict_ctx {
	struct kvx_ctl *ctl;
	uint64_t tx;
};

static void send_to(struct kvx_ctl_inbox *ib, struct kvx_ctl *ctl, uint16_t port, uint64_t *n)
{
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", port, "x", 1), 0);
	(*n)++;
	cr_assert(WAIT_CTR(ctl, notify_tx, *n, 10.0), "send %" PRIu64 " not processed", *n);
}

Test(control_ctl, dealer_cache_evicts_only_unpinned_paths)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.max_peers = 2;
	struct kvx_ctl *ctl = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &ib), 0);
	/* Nobody listens on these ports: DEALERs queue, which is all the cache needs. */
	const uint16_t p1 = 9, p2 = 13, p3 = 17;
	uint64_t n = 0;
	cr_assert_eq(kvx_ctl_mark_live(ib, "tx-live", "127.0.0.1", p1), 0);
	send_to(ib, ctl, p1, &n);
	send_to(ib, ctl, p2, &n);
	cr_assert_eq(CTR(ctl, peers_evicted), 0);
	send_to(ib, ctl, p3, &n); /* evicts p2: p1 is pinned */
	cr_assert_eq(CTR(ctl, peers_evicted), 1);
	send_to(ib, ctl, p1, &n); /* still cached */
	cr_assert_eq(CTR(ctl, peers_evicted), 1);
	send_to(ib, ctl, p2, &n); /* evicts p3 */
	cr_assert_eq(CTR(ctl, peers_evicted), 2);
	cr_assert_eq(CTR(ctl, peers_open), 2);
	cr_assert_eq(kvx_ctl_mark_terminal(ib, "tx-live"), 0);
	send_to(ib, ctl, p3, &n); /* p1 unpinned and least recently used: evicted */
	cr_assert_eq(CTR(ctl, peers_evicted), 3);
	send_to(ib, ctl, p2, &n);
	cr_assert_eq(CTR(ctl, peers_evicted), 3, "p2 survived: p1 was the LRU path");
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(ctl);
}

/* ---- handshake jobs ------------------------------------------------------------------- */

struct hs_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	int status;
	char error[512];
	char stage[64];
	uint32_t nranks;
	int rank_status[8];
	uint32_t dp_rank[8];
	char engine_id[256];
	uint32_t nregions, ndescs, nlayers;
	uint64_t epoch;
	uint8_t blob_b[256];
	size_t blob_b_len;
	int blob_b_null;
	int calls;
};

static void hsw_init(struct hs_wait *w)
{
	memset(w, 0, sizeof(*w));
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
}

static void hs_done(void *arg, const struct kvx_ctl_hs_result *r)
{
	struct hs_wait *w = arg;
	pthread_mutex_lock(&w->mu);
	w->calls++;
	w->status = r->status;
	snprintf(w->error, sizeof(w->error), "%s", r->error);
	w->nranks = r->num_ranks;
	for (uint32_t i = 0; i < r->num_ranks && i < 8; i++) {
		w->rank_status[i] = r->ranks[i].status;
		w->dp_rank[i] = r->ranks[i].dp_rank;
		if (r->ranks[i].status)
			snprintf(w->stage, sizeof(w->stage), "%s", r->ranks[i].stage);
	}
	if (r->num_ranks && r->ranks[0].meta) {
		const struct kvx_ctl_hs_rank *k = &r->ranks[0];
		snprintf(w->engine_id, sizeof(w->engine_id), "%s", k->meta->engine_id);
		w->nregions = k->meta->num_regions;
		w->epoch = k->meta->epoch;
		w->ndescs = k->layers->num_descs;
		w->nlayers = k->layers->num_layers;
		w->blob_b_null = k->blob_b == NULL;
		w->blob_b_len = k->blob_b_len;
		if (k->blob_b && k->blob_b_len <= sizeof(w->blob_b))
			memcpy(w->blob_b, k->blob_b, k->blob_b_len);
	}
	w->done = 1;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static int hsw_wait(struct hs_wait *w, double timeout_s)
{
	double end = now_s() + timeout_s;
	pthread_mutex_lock(&w->mu);
	while (!w->done && now_s() < end) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&w->cv, &w->mu, &ts);
	}
	int d = w->done;
	pthread_mutex_unlock(&w->mu);
	return d;
}

static int make_blob(void *arg, uint32_t dp_rank, const struct kvx_msg_meta *remote, uint8_t *b,
		     size_t cap, size_t *len)
{
	(void)arg;
	cr_assert_str_eq(remote->transport, "tcp", "blob A is made after the metadata arrived");
	*len = (size_t)snprintf((char *)b, cap, "A-rank%u", dp_rank);
	return 0;
}

static int on_connect_reverse(void *arg, const uint8_t *a, size_t la, uint8_t *b, size_t *lb)
{
	(void)arg;
	cr_assert_geq(*lb, KVX_MSG_BLOB_MAX);
	b[0] = 'B';
	for (size_t i = 0; i < la; i++)
		b[1 + i] = a[la - 1 - i];
	*lb = la + 1;
	return 0;
}

static int on_connect_fail(void *arg, const uint8_t *a, size_t la, uint8_t *b, size_t *lb)
{
	(void)arg, (void)a, (void)la, (void)b, (void)lb;
	return -EACCES;
}

static struct kvx_ctl *listener(kvx_ctl_connect_fn fn, uint32_t layers, uint16_t *hs)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.on_connect = fn;
	struct kvx_ctl *l = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &l), 0);
	tctl_set_local(l, layers);
	cr_assert_eq(kvx_ctl_start(l), 0);
	cr_assert_eq(kvx_ctl_bound_ports(l, hs, NULL), 0);
	return l;
}

static void hs_params(struct kvx_ctl_hs_params *hp, uint16_t port, struct hs_wait *w)
{
	memset(hp, 0, sizeof(*hp));
	hp->host = "127.0.0.1";
	hp->handshake_base_port = port;
	hp->dp_size = 1;
	hp->tp_size = 1;
	hp->timeout_ms = 10000;
	hp->make_blob = make_blob;
	hp->on_done = hs_done;
	hp->arg = w;
}

Test(control_ctl, handshake_exchanges_metadata_and_blobs)
{
	uint16_t hs;
	struct kvx_ctl *l = listener(on_connect_reverse, 4, &hs);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *i = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(i, &ib), 0);
	struct hs_wait w;
	hsw_init(&w);
	struct kvx_ctl_hs_params hp;
	hs_params(&hp, hs, &w);
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hsw_wait(&w, 15.0));
	cr_assert_eq(w.status, 0, "%s", w.error);
	cr_assert_eq(w.nranks, 1);
	cr_assert_str_eq(w.engine_id, "127.0.0.1:6301");
	cr_assert_eq(w.nregions, 4);
	cr_assert_eq(w.ndescs, 4);
	cr_assert_eq(w.nlayers, 4);
	cr_assert_eq(w.epoch, kvx_ctl_epoch(l), "the listener's epoch is advertised");
	cr_assert_eq(w.blob_b_len, 8);
	cr_assert_arr_eq(w.blob_b, "B0knar-A", 8);
	cr_assert_eq(CTR(l, hs_served), 1);
	/* The listener counts after its reply left: the initiator may finish first. */
	cr_assert(WAIT_CTR(l, connect_served, 1, 10.0));
	cr_assert_eq(CTR(l, connect_served), 1);
	cr_assert_eq(CTR(i, hs_ok), 1);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(i);
	kvx_ctl_destroy(l);
}

Test(control_ctl, handshake_without_blob_is_moriio_style)
{
	uint16_t hs;
	struct kvx_ctl *l = listener(NULL, 2, &hs);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *i = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(i, &ib), 0);
	struct hs_wait w;
	hsw_init(&w);
	struct kvx_ctl_hs_params hp;
	hs_params(&hp, hs, &w);
	hp.make_blob = NULL;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hsw_wait(&w, 15.0));
	cr_assert_eq(w.status, 0, "%s", w.error);
	cr_assert(w.blob_b_null);
	cr_assert_eq(CTR(l, connect_served), 0);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(i);
	kvx_ctl_destroy(l);
}

Test(control_ctl, handshake_connect_error_names_stage)
{
	uint16_t hs;
	struct kvx_ctl *l = listener(on_connect_fail, 1, &hs);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *i = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(i, &ib), 0);
	struct hs_wait w;
	hsw_init(&w);
	struct kvx_ctl_hs_params hp;
	hs_params(&hp, hs, &w);
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hsw_wait(&w, 15.0));
	cr_assert_eq(w.status, -EACCES);
	cr_assert_str_eq(w.stage, "connecting transport");
	cr_assert_not_null(strstr(w.error, "dp rank 0"), "%s", w.error);
	cr_assert_eq(CTR(i, hs_failed), 1);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(i);
	kvx_ctl_destroy(l);
}

Test(control_ctl, handshake_params_validated)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *i = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &i), 0);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(i, &ib), 0);
	struct hs_wait w;
	struct kvx_ctl_hs_params hp;
	hs_params(&hp, 6301, &w);
	hp.dp_size = 0;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), -EINVAL);
	hs_params(&hp, 6301, &w);
	uint32_t ranks[] = {0, 2};
	hp.dp_size = 2;
	hp.ranks = ranks;
	hp.num_ranks = 2;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), -EINVAL);
	hs_params(&hp, 6301, &w);
	hp.tp_rank = 1;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), -EINVAL);
	hs_params(&hp, 6301, &w);
	hp.on_done = NULL;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), -EINVAL);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(i);
}

Test(control_ctl, stop_cancels_pending_handshake)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *i = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(i, &ib), 0);
	struct hs_wait w;
	hsw_init(&w);
	struct kvx_ctl_hs_params hp;
	hs_params(&hp, 9, &w); /* nothing listens: the job waits for its deadline */
	hp.timeout_ms = 600000;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	kvx_ctl_inbox_close(ib);
	double t0 = now_s();
	kvx_ctl_stop(i);
	cr_assert_lt(now_s() - t0, 60.0, "a dead peer never blocks shutdown (hang bound)");
	cr_assert_eq(w.calls, 1);
	cr_assert_eq(w.status, -ECANCELED);
	kvx_ctl_destroy(i);
}

/* A one-lcore set (the calling CPU) whose control lcore is returned in *lc. */
static struct kvx_lcore_set *one_control_lcore(struct kvx_lcore **lc)
{
	static char err[KVX_LCORE_ERRLEN];
	struct kvx_lcore_cfg *cfg = malloc(sizeof(*cfg));
	kvx_lcore_cfg_init(cfg);
	int rc = kvx_lcore_cfg_default(cfg, 1, 0, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	rc = kvx_lcore_cfg_validate(cfg, NULL, NULL, err, sizeof(err));
	cr_assert_eq(rc, 0, "%s", err);
	struct kvx_lcore_set *set = NULL;
	cr_assert_eq(kvx_lcore_set_create(cfg, &set), 0);
	free(cfg);
	*lc = kvx_lcore_set_control(set);
	cr_assert_not_null(*lc);
	return set;
}

Test(control_ctl, runs_on_the_control_lcore)
{
	struct kvx_lcore *lc;
	struct kvx_lcore_set *set = one_control_lcore(&lc);
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &cb);
	p.lcore = lc;
	struct kvx_ctl *ctl = tctl_start(&p);
	cr_assert(kvx_lcore_is_running(lc), "the loop runs on the control lcore");
	uint16_t nt;
	kvx_ctl_bound_ports(ctl, NULL, &nt);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &ib), 0);
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", nt, "tx-on-lcore", 11), 0);
	cr_assert_eq(coll_wait(&cb, 1, 10.0), 1);
	cr_assert_str_eq(cb.msgs[0].m.transfer_id, "tx-on-lcore");
	kvx_ctl_inbox_close(ib);
	kvx_ctl_stop(ctl);
	cr_assert_not(kvx_lcore_is_running(lc));
	kvx_ctl_destroy(ctl);
	kvx_lcore_set_destroy(set);
	coll_fini(&cb);
}

Test(control_ctl, terminal_lru_is_bounded_to_4096_ids)
{
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &cb);
	p.inbox_slots = 8192;
	struct kvx_ctl *ctl = tctl_start(&p);
	uint16_t nt;
	kvx_ctl_bound_ports(ctl, NULL, &nt);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &ib), 0);
	char tid[32];
	for (int i = 0; i <= KVX_CTL_TERMINAL_LRU; i++) { /* 4097 ids: tx-0 is forgotten */
		snprintf(tid, sizeof(tid), "tx-%d", i);
		while (kvx_ctl_mark_terminal(ib, tid) == -ENOBUFS)
			sched_yield();
	}
	/* Same inbox, so these sends leave after every mark was applied. */
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", nt, "tx-1", 4), 0);
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", nt, "tx-4096", 7), 0);
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", nt, "tx-0", 4), 0);
	cr_assert_eq(coll_wait(&cb, 1, 10.0), 1);
	cr_assert_str_eq(cb.msgs[0].m.transfer_id, "tx-0", "the oldest id left the LRU");
	cr_assert(WAIT_CTR(ctl, dropped_terminal, 2, 10.0));
	cr_assert_eq(cb.total, 1);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(ctl);
	coll_fini(&cb);
}

/* ---- Watched fds (kvx_ctl_watch_fd / kvx_ctl_unwatch_fd) --------------------------------- */

/* A semaphore eventfd: every write of 1 makes exactly one read of 1 succeed, so the number of
 * callbacks that consumed a unit equals the number of units written. */
struct wfd {
	int fd;
	struct kvx_ctl *ctl;
	struct kvx_lcore *lc;        /* expected thread's lcore, or NULL */
	pthread_t not_on;            /* a thread the callback must not run on */
	uint64_t unwatch_at;         /* unwatch itself from the callback at this call, 0 = never */
	uint64_t target;             /* wfd_reached(): calls to wait for */
	_Atomic int unwatch_rc;
	_Atomic uint64_t calls;      /* callbacks that consumed one unit */
	_Atomic uint64_t empty;      /* callbacks that found nothing to read */
	_Atomic uint64_t wrong_thread;
	_Atomic int enabled;         /* 0 = the callback must not run (checked in the stress test) */
	_Atomic uint64_t after_unwatch;
};

static void wfd_init(struct wfd *w, struct kvx_ctl *ctl)
{
	memset(w, 0, sizeof(*w));
	w->fd = eventfd(0, EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC);
	cr_assert_geq(w->fd, 0);
	w->ctl = ctl;
	w->not_on = pthread_self();
	atomic_store(&w->enabled, 1);
}

static void wfd_cb(void *arg)
{
	struct wfd *w = arg;
	if (!atomic_load(&w->enabled))
		atomic_fetch_add(&w->after_unwatch, 1);
	if ((w->lc && kvx_lcore_self() != w->lc) || pthread_equal(pthread_self(), w->not_on))
		atomic_fetch_add(&w->wrong_thread, 1);
	uint64_t v;
	if (read(w->fd, &v, sizeof(v)) != (ssize_t)sizeof(v)) {
		atomic_fetch_add(&w->empty, 1);
		return;
	}
	uint64_t n = atomic_fetch_add(&w->calls, 1) + 1;
	if (w->unwatch_at && n == w->unwatch_at)
		atomic_store(&w->unwatch_rc, kvx_ctl_unwatch_fd(w->ctl, w->fd));
}

static void wfd_post(struct wfd *w, uint64_t units)
{
	for (uint64_t i = 0; i < units; i++) {
		uint64_t one = 1;
		cr_assert_eq(write(w->fd, &one, sizeof(one)), (ssize_t)sizeof(one));
	}
}

static int wfd_reached(void *arg)
{
	struct wfd *w = arg;
	return atomic_load(&w->calls) >= w->target;
}

struct wfd_writer {
	struct wfd *w;
	uint64_t units;
};

static void *wfd_writer_main(void *arg)
{
	struct wfd_writer *wr = arg;
	for (uint64_t i = 0; i < wr->units; i++) {
		uint64_t one = 1;
		if (write(wr->w->fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
			return (void *)1;
		if (i % 64 == 0)
			sched_yield();
	}
	return NULL;
}

Test(control_ctl, watch_fd_callback_runs_on_control_lcore_exact_count)
{
	struct kvx_lcore *lc;
	struct kvx_lcore_set *set = one_control_lcore(&lc);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.lcore = lc;
	struct kvx_ctl *ctl = tctl_start(&p);
	struct wfd w;
	wfd_init(&w, ctl);
	w.lc = lc;
	cr_assert_eq(kvx_ctl_watch_fd(ctl, w.fd, wfd_cb, &w), 0);
	/* 2000 units from another thread, in bursts that coalesce in the eventfd counter. */
	struct wfd_writer wr = {.w = &w, .units = 2000};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, wfd_writer_main, &wr), 0);
	void *tr = (void *)1;
	pthread_join(t, &tr);
	cr_assert_null(tr);
	w.target = 2000;
	cr_assert(wait_until(wfd_reached, &w, 30.0), "callbacks: %" PRIu64,
		  (uint64_t)atomic_load(&w.calls));
	/* unwatch returns after a full loop iteration without the fd: nothing runs late. */
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, w.fd), 0);
	cr_assert_eq(atomic_load(&w.calls), 2000);
	cr_assert_eq(atomic_load(&w.wrong_thread), 0, "callbacks ran off the control lcore");
	uint64_t v;
	cr_assert_eq(read(w.fd, &v, sizeof(v)), -1, "every unit was consumed");
	cr_assert_eq(errno, EAGAIN);
	struct kvx_ctl_counters c;
	kvx_ctl_counters_get(ctl, &c);
	cr_assert_eq(c.watch_errors, 0);
	kvx_ctl_destroy(ctl);
	kvx_lcore_set_destroy(set);
	close(w.fd);
}

Test(control_ctl, unwatch_fd_stops_callbacks)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *ctl = tctl_start(&p);
	struct wfd a, b;
	wfd_init(&a, ctl);
	wfd_init(&b, ctl);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, a.fd, wfd_cb, &a), 0);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, b.fd, wfd_cb, &b), 0);
	wfd_post(&a, 3);
	a.target = 3;
	cr_assert(wait_until(wfd_reached, &a, 10.0));
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, a.fd), 0);
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, a.fd), -ENOENT);
	atomic_store(&a.enabled, 0);
	wfd_post(&a, 5);
	/* b's callback proves the loop went round with a readable: a stays untouched. */
	wfd_post(&b, 1);
	b.target = 1;
	cr_assert(wait_until(wfd_reached, &b, 10.0));
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, b.fd), 0);
	cr_assert_eq(atomic_load(&a.calls), 3);
	cr_assert_eq(atomic_load(&a.after_unwatch), 0);
	uint64_t v, left = 0;
	while (read(a.fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
		left += v;
	cr_assert_eq(left, 5, "the 5 units written after unwatch are still in the eventfd");
	/* Watch again: the pending unit is delivered. */
	wfd_post(&a, 1);
	atomic_store(&a.enabled, 1);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, a.fd, wfd_cb, &a), 0);
	a.target = 4;
	cr_assert(wait_until(wfd_reached, &a, 10.0));
	kvx_ctl_destroy(ctl);
	close(a.fd);
	close(b.fd);
}

Test(control_ctl, watch_fd_rejects_bad_arguments_and_a_ninth_fd)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *ctl = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), 0); /* not started: registration still works */
	int fds[KVX_CTL_WATCH_MAX + 1];
	struct wfd dummy;
	wfd_init(&dummy, ctl);
	for (int i = 0; i <= KVX_CTL_WATCH_MAX; i++) {
		fds[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		cr_assert_geq(fds[i], 0);
	}
	for (int i = 0; i < KVX_CTL_WATCH_MAX; i++)
		cr_assert_eq(kvx_ctl_watch_fd(ctl, fds[i], wfd_cb, &dummy), 0);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, fds[KVX_CTL_WATCH_MAX], wfd_cb, &dummy), -ENOSPC);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, fds[0], wfd_cb, &dummy), -EEXIST);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, -1, wfd_cb, &dummy), -EBADF);
	int closed = eventfd(0, 0);
	close(closed);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, closed, wfd_cb, &dummy), -EBADF);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, fds[KVX_CTL_WATCH_MAX], NULL, &dummy), -EINVAL);
	cr_assert_eq(kvx_ctl_watch_fd(NULL, fds[KVX_CTL_WATCH_MAX], wfd_cb, &dummy), -EINVAL);
	cr_assert_eq(kvx_ctl_unwatch_fd(NULL, fds[0]), -EINVAL);
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, fds[KVX_CTL_WATCH_MAX]), -ENOENT);
	/* Freeing a slot makes room for the ninth. */
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, fds[3]), 0);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, fds[KVX_CTL_WATCH_MAX], wfd_cb, &dummy), 0);
	/* Watched before start: polled once the loop runs. */
	cr_assert_eq(kvx_ctl_start(ctl), 0);
	struct wfd w;
	wfd_init(&w, ctl);
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, fds[0]), 0);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, w.fd, wfd_cb, &w), 0);
	wfd_post(&w, 2);
	w.target = 2;
	cr_assert(wait_until(wfd_reached, &w, 10.0));
	kvx_ctl_destroy(ctl);
	for (int i = 0; i <= KVX_CTL_WATCH_MAX; i++)
		close(fds[i]);
	close(w.fd);
	close(dummy.fd);
	cr_assert_eq(atomic_load(&dummy.calls), 0);
}

Test(control_ctl, unwatch_fd_from_its_own_callback)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *ctl = tctl_start(&p);
	struct wfd a, b;
	wfd_init(&a, ctl);
	wfd_init(&b, ctl);
	a.unwatch_at = 2; /* the second callback unwatches a on the control thread */
	a.target = 2;
	cr_assert_eq(kvx_ctl_watch_fd(ctl, a.fd, wfd_cb, &a), 0);
	cr_assert_eq(kvx_ctl_watch_fd(ctl, b.fd, wfd_cb, &b), 0);
	wfd_post(&a, 10);
	cr_assert(wait_until(wfd_reached, &a, 10.0));
	/* A full round of b after the unwatch: a got no third call. */
	wfd_post(&b, 1);
	b.target = 1;
	cr_assert(wait_until(wfd_reached, &b, 10.0));
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, b.fd), 0);
	cr_assert_eq(atomic_load(&a.unwatch_rc), 0);
	cr_assert_eq(atomic_load(&a.calls), 2);
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, a.fd), -ENOENT);
	kvx_ctl_destroy(ctl);
	close(a.fd);
	close(b.fd);
}

struct pipe_cb {
	int fd;
	_Atomic uint64_t bytes, calls;
};

static void pipe_cb(void *arg)
{
	struct pipe_cb *pc = arg;
	char buf[64];
	ssize_t n = read(pc->fd, buf, sizeof(buf));
	atomic_fetch_add(&pc->calls, 1);
	if (n > 0)
		atomic_fetch_add(&pc->bytes, (uint64_t)n);
}

static int pipe_has_3(void *arg)
{
	return atomic_load(&((struct pipe_cb *)arg)->bytes) == 3;
}

Test(control_ctl, watched_pipe_hangup_is_taken_out_of_the_poll_set)
{
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &cb);
	struct kvx_ctl *ctl = tctl_start(&p);
	int pfd[2];
	cr_assert_eq(pipe2(pfd, O_NONBLOCK | O_CLOEXEC), 0);
	struct pipe_cb pc = {.fd = pfd[0]};
	cr_assert_eq(kvx_ctl_watch_fd(ctl, pfd[0], pipe_cb, &pc), 0);
	cr_assert_eq(write(pfd[1], "abc", 3), 3);
	cr_assert(wait_until(pipe_has_3, &pc, 10.0));
	close(pfd[1]); /* hang-up without data: POLLHUP every poll */
	cr_assert(WAIT_CTR(ctl, watch_errors, 1, 10.0));
	/* The loop is alive and not stuck on the fd: a notification still goes round. */
	uint16_t nt;
	kvx_ctl_bound_ports(ctl, NULL, &nt);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(ctl, &ib), 0);
	cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", nt, "tx-after-hup", 12), 0);
	cr_assert_eq(coll_wait(&cb, 1, 10.0), 1);
	cr_assert_eq(CTR(ctl, watch_errors), 1, "reported once, not on every poll");
	cr_assert_eq(kvx_ctl_unwatch_fd(ctl, pfd[0]), 0);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(ctl);
	close(pfd[0]);
	coll_fini(&cb);
}

/* Another thread watches and unwatches while units keep arriving: once unwatch returned, the
 * callback never runs (enabled is cleared right after each unwatch). */
struct churn {
	struct kvx_ctl *ctl;
	struct wfd *w;
	int rounds;
	int fail;
};

static void *churn_main(void *arg)
{
	struct churn *c = arg;
	for (int i = 0; i < c->rounds && !c->fail; i++) {
		atomic_store(&c->w->enabled, 1);
		if (kvx_ctl_watch_fd(c->ctl, c->w->fd, wfd_cb, c->w))
			c->fail = 1;
		uint64_t one = 1;
		if (write(c->w->fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
			c->fail = 2;
		if (i % 3 == 0)
			sched_yield();
		if (kvx_ctl_unwatch_fd(c->ctl, c->w->fd))
			c->fail = 3;
		atomic_store(&c->w->enabled, 0);
	}
	return NULL;
}

Test(control_ctl, watch_unwatch_churn_from_another_thread)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *ctl = tctl_start(&p);
	struct wfd w;
	wfd_init(&w, ctl);
	struct churn c = {.ctl = ctl, .w = &w, .rounds = 300};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, churn_main, &c), 0);
	pthread_join(t, NULL);
	cr_assert_eq(c.fail, 0);
	cr_assert_eq(atomic_load(&w.after_unwatch), 0, "a callback ran after unwatch returned");
	uint64_t v, left = 0;
	while (read(w.fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
		left += v;
	cr_assert_eq(atomic_load(&w.calls) + left, 300, "every unit consumed once or still there");
	kvx_ctl_destroy(ctl);
	close(w.fd);
}

/* ---- Receive loop: one poll(2) over ZMQ_FDs (edge-like), busy-poll window ---------------- */

/* Bursts larger than the per-call receive batch (64) from several peers: the loop keeps
 * reading a ROUTER whose batch limit left input queued, without a new ZMQ_FD edge. */
static void burst_and_count(uint32_t busy_poll_us)
{
	struct collector cb;
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &cb);
	p.busy_poll_us = busy_poll_us;
	struct kvx_ctl *ctl = tctl_start(&p);
	uint16_t nt;
	kvx_ctl_bound_ports(ctl, NULL, &nt);
	void *z = zmq_ctx_new();
	void *d[3];
	for (int i = 0; i < 3; i++)
		d[i] = raw_dealer(z, nt);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;
	uint8_t buf[128];
	const int per = 700;
	for (int k = 0; k < per; k++) {
		for (int i = 0; i < 3; i++) {
			snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-%d-%d", i, k);
			int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
			cr_assert_eq(zmq_send(d[i], buf, (size_t)n, 0), n);
		}
	}
	cr_assert_eq(coll_wait(&cb, 3 * per, 30.0), 3 * per);
	cr_assert_eq(CTR(ctl, notify_rx), 3 * per);
	cr_assert_eq(CTR(ctl, malformed), 0);
	/* The loop still answers after the burst (it went to sleep and woke up again). */
	for (int i = 0; i < 3; i++) {
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-last-%d", i);
		int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
		cr_assert_eq(zmq_send(d[i], buf, (size_t)n, 0), n);
	}
	cr_assert_eq(coll_wait(&cb, 3 * per + 3, 30.0), 3 * per + 3);
	for (int i = 0; i < 3; i++)
		zmq_close(d[i]);
	zmq_ctx_term(z);
	kvx_ctl_destroy(ctl);
	coll_fini(&cb);
}

Test(control_ctl, burst_beyond_receive_batch_is_all_delivered)
{
	burst_and_count(0);
}

Test(control_ctl, burst_is_all_delivered_with_busy_poll_window)
{
	burst_and_count(500);
}

/* With a busy-poll window on both sides: notifications both ways and a full handshake. */
static void hs_done_flag(void *arg, const struct kvx_ctl_hs_result *r)
{
	atomic_store((_Atomic int *)arg, r->status == 0 ? 1 : -1);
}

static int flag_set(void *arg)
{
	return atomic_load((_Atomic int *)arg) != 0;
}

Test(control_ctl, busy_poll_window_keeps_notify_and_handshake_working)
{
	struct collector ca, cb;
	coll_init(&ca);
	coll_init(&cb);
	struct kvx_ctl_params p;
	tctl_params(&p, &ca);
	p.busy_poll_us = 1000;
	struct kvx_ctl *a = tctl_start(&p);
	tctl_params(&p, &cb);
	p.busy_poll_us = 1000;
	p.role = KVX_CTL_ROLE_CONSUMER;
	struct kvx_ctl *b = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &b), 0);
	tctl_set_local(b, 2);
	cr_assert_eq(kvx_ctl_start(b), 0);
	uint16_t an, bh, bn;
	kvx_ctl_bound_ports(a, NULL, &an);
	kvx_ctl_bound_ports(b, &bh, &bn);
	struct kvx_ctl_inbox *ia, *ib;
	cr_assert_eq(kvx_ctl_inbox_open(a, &ia), 0);
	cr_assert_eq(kvx_ctl_inbox_open(b, &ib), 0);
	for (int i = 0; i < 50; i++) {
		cr_assert_eq(kvx_ctl_send_raw(ia, "127.0.0.1", bn, "tx-ab", 5), 0);
		cr_assert_eq(coll_wait(&cb, (size_t)i + 1, 10.0), (size_t)i + 1);
		cr_assert_eq(kvx_ctl_send_raw(ib, "127.0.0.1", an, "tx-ba", 5), 0);
		cr_assert_eq(coll_wait(&ca, (size_t)i + 1, 10.0), (size_t)i + 1);
	}
	_Atomic int done = 0;
	struct kvx_ctl_hs_params hp;
	memset(&hp, 0, sizeof(hp));
	hp.host = "127.0.0.1";
	hp.handshake_base_port = bh;
	hp.dp_size = 1;
	hp.tp_size = 1;
	hp.on_done = hs_done_flag;
	hp.arg = (void *)&done;
	cr_assert_eq(kvx_ctl_handshake_start(ia, &hp), 0);
	cr_assert(wait_until(flag_set, (void *)&done, 15.0));
	cr_assert_eq(atomic_load(&done), 1);
	/* b counts after its replies left, so the initiator may finish first. */
	cr_assert(WAIT_CTR(b, hs_served, 1, 10.0));
	kvx_ctl_inbox_close(ia);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(a);
	kvx_ctl_destroy(b);
	coll_fini(&ca);
	coll_fini(&cb);
}

/* ---- Answers to a notification (issue 16) ------------------------------------------------ */

/* on_notify that answers `release` from the control lcore itself, through an inbox only it
 * uses, and records the notify_tx counter around the send. */
struct answerer {
	struct kvx_ctl *ctl;
	struct kvx_ctl_inbox *ib;
	uint16_t port; /* where the answers go */
	int rc[8];
	uint64_t tx_before[8], tx_after[8];
	_Atomic int n;
};

static void answer_in_callback(void *arg, const struct kvx_msg_notify *m)
{
	struct answerer *a = arg;
	int i = atomic_load(&a->n);
	if (i >= 8)
		return;
	struct kvx_msg_notify r;
	memset(&r, 0, sizeof(r));
	r.type = KVX_MSG_RELEASE;
	memcpy(r.transfer_id, m->transfer_id, sizeof(r.transfer_id));
	struct kvx_ctl_counters c;
	kvx_ctl_counters_get(a->ctl, &c);
	a->tx_before[i] = c.notify_tx;
	a->rc[i] = kvx_ctl_send_notify(a->ib, "127.0.0.1", a->port, &r);
	kvx_ctl_counters_get(a->ctl, &c);
	a->tx_after[i] = c.notify_tx;
	atomic_store(&a->n, i + 1); /* published after the fields above */
}

static int answers_done(void *arg)
{
	return atomic_load(&((struct answerer *)arg)->n) == 4;
}

/* A send made on the control lcore's own thread (from on_notify) is handed to its DEALER before
 * kvx_ctl_send_notify() returns, not on a later loop round; each answer still arrives once, in
 * order. */
Test(control_ctl, send_from_on_notify_is_handed_to_the_dealer_before_it_returns)
{
	struct collector ca;
	coll_init(&ca);
	struct kvx_ctl_params p;
	tctl_params(&p, &ca);
	struct kvx_ctl *a = tctl_start(&p);
	struct answerer ans;
	memset(&ans, 0, sizeof(ans));
	tctl_params(&p, NULL);
	p.role = KVX_CTL_ROLE_CONSUMER;
	p.on_notify = answer_in_callback;
	p.notify_arg = &ans;
	struct kvx_ctl *b = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &b), 0);
	ans.ctl = b;
	cr_assert_eq(kvx_ctl_inbox_open(b, &ans.ib), 0);
	cr_assert_eq(kvx_ctl_start(b), 0);
	uint16_t an, bn;
	kvx_ctl_bound_ports(a, NULL, &an);
	kvx_ctl_bound_ports(b, NULL, &bn);
	ans.port = an;
	struct kvx_ctl_inbox *ia;
	cr_assert_eq(kvx_ctl_inbox_open(a, &ia), 0);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;
	for (int i = 0; i < 4; i++) {
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-answer-%d", i);
		cr_assert_eq(kvx_ctl_send_notify(ia, "127.0.0.1", bn, &m), 0);
	}
	cr_assert(wait_until(answers_done, &ans, 10.0));
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(ans.rc[i], 0);
		cr_assert_eq(ans.tx_before[i], (uint64_t)i, "answer %d: sends before it", i);
		cr_assert_eq(ans.tx_after[i], (uint64_t)i + 1, "answer %d: on the DEALER at return", i);
	}
	cr_assert_eq(coll_wait(&ca, 4, 10.0), 4);
	for (int i = 0; i < 4; i++) {
		char want[32];
		snprintf(want, sizeof(want), "tx-answer-%d", i);
		cr_assert_eq(ca.msgs[i].m.type, KVX_MSG_RELEASE);
		cr_assert_str_eq(ca.msgs[i].m.transfer_id, want);
	}
	cr_assert_eq(CTR(b, notify_tx), 4);
	cr_assert_eq(CTR(b, send_errors), 0);
	kvx_ctl_inbox_close(ia);
	kvx_ctl_destroy(a);
	kvx_ctl_inbox_close(ans.ib);
	kvx_ctl_destroy(b);
	coll_fini(&ca);
}

/* Ping-pong where an application thread answers each notification as soon as on_notify has
 * handed it over (the answer lands inside the control lcore's answer window or after it,
 * whichever the scheduler gives): every answer goes out exactly once and in order, and a
 * notification nobody answers does not keep the loop from serving later sends. */
struct app_answer {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char tid[8][KVX_MSG_ID_MAX + 1];
	uint64_t got, taken;
	int stop;
};

static void app_on_notify(void *arg, const struct kvx_msg_notify *m)
{
	struct app_answer *q = arg;
	pthread_mutex_lock(&q->mu);
	if (q->got - q->taken < 8)
		memcpy(q->tid[q->got++ % 8], m->transfer_id, sizeof(q->tid[0]));
	pthread_mutex_unlock(&q->mu);
	pthread_cond_signal(&q->cv);
}

struct app_thread {
	struct app_answer *q;
	struct kvx_ctl_inbox *ib;
	uint16_t port;
	uint64_t answer_upto; /* answer the first answer_upto notifications only */
	int errors;
};

static void *app_main(void *arg)
{
	struct app_thread *t = arg;
	struct kvx_msg_notify r;
	memset(&r, 0, sizeof(r));
	r.type = KVX_MSG_RELEASE;
	pthread_mutex_lock(&t->q->mu);
	for (;;) {
		while (!t->q->stop && t->q->taken == t->q->got)
			pthread_cond_wait(&t->q->cv, &t->q->mu);
		if (t->q->stop)
			break;
		uint64_t k = t->q->taken++;
		memcpy(r.transfer_id, t->q->tid[k % 8], sizeof(r.transfer_id));
		pthread_mutex_unlock(&t->q->mu);
		if (k < t->answer_upto && kvx_ctl_send_notify(t->ib, "127.0.0.1", t->port, &r))
			t->errors++;
		pthread_mutex_lock(&t->q->mu);
	}
	pthread_mutex_unlock(&t->q->mu);
	return NULL;
}

Test(control_ctl, answers_from_an_application_thread_all_go_out_in_order)
{
	enum { ROUNDS = 300 }; /* < COLL_MAX: the collector keeps every message */
	struct collector ca;
	coll_init(&ca);
	struct kvx_ctl_params p;
	tctl_params(&p, &ca);
	struct kvx_ctl *a = tctl_start(&p);
	struct app_answer q;
	memset(&q, 0, sizeof(q));
	pthread_mutex_init(&q.mu, NULL);
	pthread_cond_init(&q.cv, NULL);
	tctl_params(&p, NULL);
	p.role = KVX_CTL_ROLE_CONSUMER;
	p.on_notify = app_on_notify;
	p.notify_arg = &q;
	struct kvx_ctl *b = tctl_start(&p);
	uint16_t an, bn;
	kvx_ctl_bound_ports(a, NULL, &an);
	kvx_ctl_bound_ports(b, NULL, &bn);
	struct app_thread t = {.q = &q, .port = an, .answer_upto = ROUNDS};
	cr_assert_eq(kvx_ctl_inbox_open(b, &t.ib), 0);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, app_main, &t), 0);
	struct kvx_ctl_inbox *ia;
	cr_assert_eq(kvx_ctl_inbox_open(a, &ia), 0);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;
	for (int i = 0; i < ROUNDS; i++) {
		snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-pp-%d", i);
		cr_assert_eq(kvx_ctl_send_notify(ia, "127.0.0.1", bn, &m), 0);
		cr_assert_eq(coll_wait(&ca, (size_t)i + 1, 10.0), (size_t)i + 1, "answer %d", i);
		cr_assert_eq(ca.msgs[i].m.type, KVX_MSG_RELEASE);
		cr_assert_str_eq(ca.msgs[i].m.transfer_id, m.transfer_id);
	}
	/* One more notification that nobody answers, then a send from b's inbox: it still goes
	 * out (the loop left the answer window and serves the inbox from its sleep). */
	strcpy(m.transfer_id, "tx-unanswered");
	cr_assert_eq(kvx_ctl_send_notify(ia, "127.0.0.1", bn, &m), 0);
	cr_assert(WAIT_CTR(b, notify_rx, ROUNDS + 1, 10.0));
	pthread_mutex_lock(&q.mu);
	q.stop = 1;
	pthread_mutex_unlock(&q.mu);
	pthread_cond_signal(&q.cv);
	pthread_join(th, NULL);
	cr_assert_eq(t.errors, 0);
	struct kvx_msg_notify r;
	memset(&r, 0, sizeof(r));
	r.type = KVX_MSG_RELEASE;
	strcpy(r.transfer_id, "tx-late");
	cr_assert_eq(kvx_ctl_send_notify(t.ib, "127.0.0.1", an, &r), 0);
	cr_assert_eq(coll_wait(&ca, ROUNDS + 1, 10.0), ROUNDS + 1);
	cr_assert_str_eq(ca.msgs[ROUNDS].m.transfer_id, "tx-late");
	/* b counts a send after zmq_send() returned: a may deliver first. */
	cr_assert(WAIT_CTR(b, notify_tx, ROUNDS + 1, 10.0));
	cr_assert_eq(CTR(b, notify_tx), ROUNDS + 1);
	cr_assert_eq(CTR(a, notify_rx), ROUNDS + 1);
	kvx_ctl_inbox_close(ia);
	kvx_ctl_inbox_close(t.ib);
	kvx_ctl_destroy(a);
	kvx_ctl_destroy(b);
	pthread_mutex_destroy(&q.mu);
	pthread_cond_destroy(&q.cv);
	coll_fini(&ca);
}
