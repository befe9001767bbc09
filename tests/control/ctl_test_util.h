/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_CTL_TEST_UTIL_H
#define KVX_TESTS_CTL_TEST_UTIL_H
/* Helpers shared by the control tests: a notification collector with deadline waits, control
 * objects on ephemeral loopback ports, raw libzmq peers. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/control.h"

#define COLL_MAX 512
#define COLL_IDS 16

struct coll_msg {
	struct kvx_msg_notify m;
	uint32_t ids[COLL_IDS];
};

struct collector {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct coll_msg msgs[COLL_MAX];
	size_t n;     /* stored (<= COLL_MAX) */
	size_t total; /* delivered */
};

void coll_init(struct collector *c);
void coll_fini(struct collector *c);
void coll_cb(void *arg, const struct kvx_msg_notify *m);
/* Wait until at least n messages were delivered or timeout_s passed; returns total seen. */
size_t coll_wait(struct collector *c, size_t n, double timeout_s);

/* Fill p with a loopback configuration on ephemeral ports delivering to coll (may be NULL). */
void tctl_params(struct kvx_ctl_params *p, struct collector *coll);
/* Create and start; asserts success. */
struct kvx_ctl *tctl_start(const struct kvx_ctl_params *p);
/* Set a small local metadata (n_layers layers, one region each) before start. */
void tctl_set_local(struct kvx_ctl *ctl, uint32_t n_layers);

/* Wait until pred(arg) is true or timeout_s passes; checks every 1 ms. Returns pred's value. */
int wait_until(int (*pred)(void *), void *arg, double timeout_s);
/* Wait until the counter at byte offset off of struct kvx_ctl_counters reaches v. */
int wait_counter(struct kvx_ctl *ctl, size_t off, uint64_t v, double timeout_s);
#define WAIT_CTR(ctl, field, v, t) \
	wait_counter((ctl), offsetof(struct kvx_ctl_counters, field), (v), (t))
uint64_t ctr(struct kvx_ctl *ctl, size_t off);
#define CTR(ctl, field) ctr((ctl), offsetof(struct kvx_ctl_counters, field))

/* A raw libzmq DEALER connected to tcp://127.0.0.1:port (LINGER 0). */
void *raw_dealer(void *zctx, uint16_t port);
double now_s(void);

#endif
