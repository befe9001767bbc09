/* SPDX-License-Identifier: Apache-2.0 */
#include "ctl_test_util.h"

#ifdef KVX_TSAN_RUNNER /* TSan build: the test file includes tests/lcore/tsan_runner.h */
#include <stdlib.h>
#define cr_assert_eq(a, b, ...) ((a) == (b) ? (void)0 : abort())
#define cr_assert_not_null(p, ...) ((p) != NULL ? (void)0 : abort())
#else
#include <criterion/criterion.h>
#endif
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

double now_s(void)
{
	return (double)kvx_now_ns() / 1e9;
}

void coll_init(struct collector *c)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
}

void coll_fini(struct collector *c)
{
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
}

void coll_cb(void *arg, const struct kvx_msg_notify *m)
{
	struct collector *c = arg;
	pthread_mutex_lock(&c->mu);
	if (c->n < COLL_MAX) {
		struct coll_msg *d = &c->msgs[c->n++];
		d->m = *m;
		uint32_t k = m->num_blocks < COLL_IDS ? m->num_blocks : COLL_IDS;
		if (k)
			memcpy(d->ids, m->block_ids, k * sizeof(uint32_t));
		d->m.block_ids = d->ids;
		d->m.blocks_cap = COLL_IDS;
	}
	c->total++;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

size_t coll_wait(struct collector *c, size_t n, double timeout_s)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(timeout_s * 1e9);
	ts.tv_sec += (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	pthread_mutex_lock(&c->mu);
	while (c->total < n && pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0)
		;
	size_t t = c->total;
	pthread_mutex_unlock(&c->mu);
	return t;
}

void tctl_params(struct kvx_ctl_params *p, struct collector *coll)
{
	memset(p, 0, sizeof(*p));
	p->host = "127.0.0.1";
	p->bind_host = "127.0.0.1";
	p->ephemeral_ports = true;
	p->dp_size = 1;
	p->tp_size = 1;
	p->role = KVX_CTL_ROLE_PRODUCER;
	p->epoch = 0;
	if (coll) {
		p->on_notify = coll_cb;
		p->notify_arg = coll;
	}
}

struct kvx_ctl *tctl_start(const struct kvx_ctl_params *p)
{
	struct kvx_ctl *ctl = NULL;
	int rc = kvx_ctl_create(p, &ctl);
	cr_assert_eq(rc, 0, "kvx_ctl_create: %s", kvx_strerror(rc));
	rc = kvx_ctl_start(ctl);
	cr_assert_eq(rc, 0, "kvx_ctl_start: %s", kvx_strerror(rc));
	return ctl;
}

void tctl_set_local(struct kvx_ctl *ctl, uint32_t n_layers)
{
	static struct kvx_msg_region regs[256];
	static struct kvx_msg_memdesc descs[256];
	struct kvx_msg_meta m;
	memset(&m, 0, sizeof(m));
	snprintf(m.engine_id, sizeof(m.engine_id), "127.0.0.1:6301");
	snprintf(m.engine_key, sizeof(m.engine_key), "producer:127.0.0.1:6301:tp0:dp0");
	snprintf(m.hostname, sizeof(m.hostname), "testhost");
	snprintf(m.host, sizeof(m.host), "127.0.0.1");
	snprintf(m.attn_backend, sizeof(m.attn_backend), "FLASH_ATTN");
	snprintf(m.transport, sizeof(m.transport), "tcp");
	snprintf(m.layout, sizeof(m.layout), "split");
	m.num_blocks = 16;
	m.block_len = 48;
	m.has_kvx = true;
	m.version = KVX_MSG_PROTO_VERSION;
	m.num_regions = n_layers;
	m.regions = regs;
	struct kvx_msg_layers l;
	memset(&l, 0, sizeof(l));
	snprintf(l.engine_key, sizeof(l.engine_key), "%s", m.engine_key);
	l.num_descs = n_layers;
	l.descs = descs;
	for (uint32_t i = 0; i < n_layers; i++) {
		regs[i] = (struct kvx_msg_region){.addr = 0x10000000ull + i * 0x1000ull,
						  .len_bytes = 16 * 48, .key = 100 + i};
		memset(&descs[i], 0, sizeof(descs[i]));
		snprintf(descs[i].layer, sizeof(descs[i].layer), "model.layers.%u.attn", i);
		descs[i].id = i;
		descs[i].device_id = -1;
		descs[i].addr = regs[i].addr;
		descs[i].len_bytes = regs[i].len_bytes;
		descs[i].loc = 1;
	}
	int rc = kvx_ctl_set_local(ctl, &m, &l);
	cr_assert_eq(rc, 0, "kvx_ctl_set_local: %s", kvx_strerror(rc));
}

int wait_until(int (*pred)(void *), void *arg, double timeout_s)
{
	double end = now_s() + timeout_s;
	for (;;) {
		if (pred(arg))
			return 1;
		if (now_s() > end)
			return pred(arg);
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
}

uint64_t ctr(struct kvx_ctl *ctl, size_t off)
{
	struct kvx_ctl_counters c;
	kvx_ctl_counters_get(ctl, &c);
	uint64_t v;
	memcpy(&v, (const char *)&c + off, sizeof(v));
	return v;
}

int wait_counter(struct kvx_ctl *ctl, size_t off, uint64_t v, double timeout_s)
{
	double end = now_s() + timeout_s;
	for (;;) {
		if (ctr(ctl, off) >= v)
			return 1;
		if (now_s() > end)
			return ctr(ctl, off) >= v;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
}

void *raw_dealer(void *zctx, uint16_t port)
{
	void *s = zmq_socket(zctx, ZMQ_DEALER);
	cr_assert_not_null(s);
	int zero = 0;
	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
	char ep[64];
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);
	cr_assert_eq(zmq_connect(s, ep), 0);
	return s;
}

#if defined(__SANITIZE_THREAD__)
/* libzmq is not TSan-instrumented: its I/O threads synchronise through their own mailboxes,
 * which TSan cannot see, so reports raised from inside libzmq are false positives. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
	return "called_from_lib:libzmq.so.5\n";
}
#endif
