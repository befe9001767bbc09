/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inboxes: the SPSC slot rings through which producer threads hand sends, terminal/live marks
 * and handshake jobs to the control lcore (producer side), and the control lcore's drain.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_impl.h"

void ctl_inbox_free(struct kvx_ctl_inbox *ib)
{
	void *o;
	/* Release queued work that never ran (large buffers, handshake jobs). */
	while (ib->to_ctl && kvx_ring_dequeue_burst_sc(ib->to_ctl, &o, 1, NULL) == 1) {
		struct slot *s = o;
		if (s->data && s->data != s->inline_buf)
			free(s->data);
		if (s->job)
			ctl_job_cancel_unstarted(ib->ctl, s->job);
	}
	struct kvx_ctl *ctl = ib->ctl;
	atomic_store(&ctl->inboxes[ib->idx], NULL);
	kvx_ring_destroy(ib->to_ctl);
	kvx_ring_destroy(ib->free);
	free(ib->slots);
	free(ib);
}

int kvx_ctl_inbox_open(struct kvx_ctl *ctl, struct kvx_ctl_inbox **out)
{
	if (!ctl || !out)
		return -EINVAL;
	struct kvx_ctl_inbox *ib = calloc(1, sizeof(*ib));
	if (!ib)
		return -ENOMEM;
	ib->ctl = ctl;
	ib->nslots = ctl->p.inbox_slots;
	ib->slots = calloc(ib->nslots, sizeof(*ib->slots));
	struct kvx_ring_params rp = {.name = "ctl-inbox", .count = ib->nslots,
				     .flags = KVX_RING_F_EXACT_SZ};
	int rc = ib->slots ? kvx_ring_create(&rp, &ib->to_ctl) : -ENOMEM;
	rp.name = "ctl-free";
	rc = rc ? rc : kvx_ring_create(&rp, &ib->free);
	if (rc) {
		kvx_ring_destroy(ib->to_ctl);
		free(ib->slots);
		free(ib);
		return rc;
	}
	for (uint32_t i = 0; i < ib->nslots; i++) {
		void *o = &ib->slots[i];
		kvx_ring_enqueue_burst_sp(ib->free, &o, 1, NULL);
	}
	kvx_ring_set_waiter(ib->to_ctl, &ctl->waiter);
	pthread_mutex_lock(&ctl->inbox_mu);
	rc = -ENOBUFS;
	for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
		if (!atomic_load(&ctl->inboxes[i])) {
			ib->idx = i;
			/* Release: the rings are fully built before the control thread sees them. */
			atomic_store_explicit(&ctl->inboxes[i], ib, memory_order_release);
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&ctl->inbox_mu);
	if (rc) {
		kvx_ring_destroy(ib->to_ctl);
		kvx_ring_destroy(ib->free);
		free(ib->slots);
		free(ib);
		return rc;
	}
	*out = ib;
	return 0;
}

void kvx_ctl_inbox_close(struct kvx_ctl_inbox *ib)
{
	if (!ib)
		return;
	struct kvx_ctl *ctl = ib->ctl;
	pthread_mutex_lock(&ctl->inbox_mu);
	if (atomic_load(&ctl->running) && !atomic_load(&ctl->stop_req)) {
		/* The control thread drains what is queued, then frees the inbox. */
		atomic_store_explicit(&ib->closed, 1, memory_order_release);
		pthread_mutex_unlock(&ctl->inbox_mu);
		kvx_waiter_wake(&ctl->waiter);
		return;
	}
	pthread_mutex_unlock(&ctl->inbox_mu);
	ctl_inbox_free(ib);
}

struct slot *ctl_slot_get(struct kvx_ctl_inbox *ib)
{
	void *o;
	if (kvx_ring_dequeue_burst_sc(ib->free, &o, 1, NULL) != 1) {
		CINC(ib->ctl, inbox_full);
		return NULL;
	}
	struct slot *s = o;
	s->data = NULL;
	s->len = 0;
	s->job = NULL;
	s->host[0] = 0;
	s->tid[0] = 0;
	s->port = 0;
	return s;
}

static void handle_slot(struct kvx_ctl *ctl, struct kvx_ctl_inbox *ib, struct slot *s);

void ctl_slot_submit(struct kvx_ctl_inbox *ib, struct slot *s)
{
	void *o = s;
	/* A send from the control lcore's own thread (from on_notify, e.g. an answer): nothing to
	 * hand over, so it goes to the DEALER now instead of on the next loop round (after the
	 * ROUTER's final empty read and a round of the loop). Only with nothing queued before it
	 * in this inbox, so the inbox order holds. Other kinds keep the ring: a handshake job
	 * started here could complete (on_done) inside kvx_ctl_handshake_start(). */
	if (s->kind == SLOT_SEND && ctl_on_loop_thread(ib->ctl) && kvx_ring_is_empty(ib->to_ctl)) {
		handle_slot(ib->ctl, ib, s);
		return;
	}
	/* Cannot fail: to_ctl holds nslots elements and only nslots slots exist. The ring's
	 * waiter makes the enqueue wake the control lcore. */
	kvx_ring_enqueue_burst_sp(ib->to_ctl, &o, 1, NULL);
}

void ctl_slot_put_back(struct kvx_ctl_inbox *ib, struct slot *s)
{
	void *o = s;
	kvx_ring_enqueue_burst_sp(ib->free, &o, 1, NULL);
}

static int dest_ok(const char *host, uint16_t port)
{
	return host && host[0] && strlen(host) <= KVX_CTL_HOST_MAX && port;
}

int kvx_ctl_send_raw(struct kvx_ctl_inbox *ib, const char *host, uint16_t port, const void *data,
		     size_t len)
{
	if (!ib || !dest_ok(host, port) || (!data && len))
		return -EINVAL;
	if (len > KVX_MSG_NOTIFY_MAX_BYTES)
		return -EMSGSIZE;
	uint8_t *big = NULL;
	if (len > KVX_CTL_INLINE_BYTES && !(big = malloc(len)))
		return -ENOMEM;
	struct slot *s = ctl_slot_get(ib);
	if (!s) {
		free(big);
		return -ENOBUFS;
	}
	s->kind = SLOT_SEND;
	s->mtype = 0;
	strcpy(s->host, host);
	s->port = port;
	s->data = big ? big : s->inline_buf;
	if (len)
		memcpy(s->data, data, len);
	s->len = len;
	ctl_slot_submit(ib, s);
	return 0;
}

int kvx_ctl_send_notify(struct kvx_ctl_inbox *ib, const char *host, uint16_t port,
			const struct kvx_msg_notify *m)
{
	if (!ib || !dest_ok(host, port) || !m)
		return -EINVAL;
	struct slot *s = ctl_slot_get(ib);
	if (!s)
		return -ENOBUFS;
	int n = kvx_msg_notify_encode(m, s->inline_buf, sizeof(s->inline_buf));
	if (n == -EMSGSIZE) {
		/* Large block lists: encode on the heap (slow path, scheduler-side sends). */
		size_t cap = 64 + 2 * (size_t)KVX_MSG_ID_MAX + 5 * (size_t)m->num_blocks +
			     5 * KVX_MSG_GROUPS_MAX;
		if (cap > KVX_MSG_NOTIFY_MAX_BYTES)
			cap = KVX_MSG_NOTIFY_MAX_BYTES;
		uint8_t *big = malloc(cap);
		if (!big) {
			ctl_slot_put_back(ib, s);
			return -ENOMEM;
		}
		n = kvx_msg_notify_encode(m, big, cap);
		if (n < 0) {
			free(big);
			ctl_slot_put_back(ib, s);
			return n;
		}
		s->data = big;
	} else if (n < 0) {
		ctl_slot_put_back(ib, s);
		return n;
	} else {
		s->data = s->inline_buf;
	}
	s->kind = SLOT_SEND;
	s->mtype = (unsigned)m->type < KVX_CTL_MSG_TYPES ? (uint8_t)m->type : 0;
	strcpy(s->host, host);
	s->port = port;
	s->len = (size_t)n;
	ctl_slot_submit(ib, s);
	return 0;
}

static int tid_ok(const char *t)
{
	size_t n = t ? strnlen(t, KVX_MSG_ID_MAX + 1) : 0;
	return n >= 1 && n <= KVX_MSG_ID_MAX;
}

int kvx_ctl_mark_terminal(struct kvx_ctl_inbox *ib, const char *transfer_id)
{
	if (!ib || !tid_ok(transfer_id))
		return -EINVAL;
	struct slot *s = ctl_slot_get(ib);
	if (!s)
		return -ENOBUFS;
	s->kind = SLOT_TERMINAL;
	strcpy(s->tid, transfer_id);
	ctl_slot_submit(ib, s);
	return 0;
}

int kvx_ctl_mark_live(struct kvx_ctl_inbox *ib, const char *transfer_id, const char *host,
		      uint16_t port)
{
	if (!ib || !tid_ok(transfer_id) || !dest_ok(host, port))
		return -EINVAL;
	struct slot *s = ctl_slot_get(ib);
	if (!s)
		return -ENOBUFS;
	s->kind = SLOT_LIVE;
	strcpy(s->tid, transfer_id);
	strcpy(s->host, host);
	s->port = port;
	ctl_slot_submit(ib, s);
	return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Control lcore side                                                                        */
/* ---------------------------------------------------------------------------------------- */

static void handle_slot(struct kvx_ctl *ctl, struct kvx_ctl_inbox *ib, struct slot *s)
{
	switch (s->kind) {
	case SLOT_SEND:
		ctl_notify_send(ctl, s);
		break;
	case SLOT_TERMINAL:
		ctl_terminal_add(ctl, s->tid);
		break;
	case SLOT_LIVE:
		ctl_live_add(ctl, s->tid, s->host, s->port);
		break;
	case SLOT_HANDSHAKE:
		ctl_job_enqueue(ctl, s->job);
		s->job = NULL;
		break;
	}
	if (s->data && s->data != s->inline_buf)
		free(s->data);
	s->data = NULL;
	ctl_slot_put_back(ib, s);
}

/* Drain every inbox (bounded per inbox per call); returns the number of slots handled. */
unsigned ctl_inboxes_drain(struct kvx_ctl *ctl)
{
	unsigned total = 0;
	for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
		/* Acquire: pairs with the release store in kvx_ctl_inbox_open(). */
		struct kvx_ctl_inbox *ib =
			atomic_load_explicit(&ctl->inboxes[i], memory_order_acquire);
		if (!ib)
			continue;
		int closed = atomic_load_explicit(&ib->closed, memory_order_acquire);
		void *o[INBOX_BATCH];
		unsigned n = kvx_ring_dequeue_burst_sc(ib->to_ctl, o, INBOX_BATCH, NULL);
		for (unsigned k = 0; k < n; k++)
			handle_slot(ctl, ib, o[k]);
		total += n;
		if (closed && kvx_ring_is_empty(ib->to_ctl)) {
			pthread_mutex_lock(&ctl->inbox_mu);
			ctl_inbox_free(ib);
			pthread_mutex_unlock(&ctl->inbox_mu);
		}
	}
	return total;
}

int ctl_inboxes_pending(struct kvx_ctl *ctl)
{
	for (uint32_t i = 0; i < ctl->p.max_inboxes; i++) {
		struct kvx_ctl_inbox *ib =
			atomic_load_explicit(&ctl->inboxes[i], memory_order_acquire);
		if (ib && (!kvx_ring_is_empty(ib->to_ctl) ||
			   atomic_load_explicit(&ib->closed, memory_order_acquire)))
			return 1;
	}
	return 0;
}
