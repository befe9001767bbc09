/* SPDX-License-Identifier: Apache-2.0 */
/* The control lcore: lifecycle, inboxes, notify path, DEALER cache, handshake jobs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	cr_assert_lt(now_s() - t0, 5.0, "a dead peer never blocks shutdown");
	cr_assert_eq(w.calls, 1);
	cr_assert_eq(w.status, -ECANCELED);
	kvx_ctl_destroy(i);
}

Test(control_ctl, runs_on_the_control_lcore)
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
	struct kvx_lcore *lc = kvx_lcore_set_control(set);
	cr_assert_not_null(lc);
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
	free(cfg);
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
