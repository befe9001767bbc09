/* SPDX-License-Identifier: Apache-2.0 */
/* Per-transfer state the polling lcores keep, free of I/O: the transfer table with its terminal
 * LRU (one-shot ids, parked notifications), WRITE producer sealing and write_done-once, D's
 * allocation, ACK fan-in, and the deadlines of a clock tick (docs/protocol.md §1.3, §1.4, §5.4-§5.6). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/control.h"
#include "runtime_internal.h"

struct kvx_xfer_table {
	struct kvx_xfer *e;
	uint32_t *bucket; /* index+1 */
	uint32_t nbucket; /* power of two */
	uint32_t cap;
	uint32_t free_head; /* index+1, chained through next */
	uint32_t live;
	uint32_t lru_head, lru_tail, lru_count, lru_cap;
};

int kvx_xfer_table_create(size_t capacity, size_t lru_cap, struct kvx_xfer_table **out)
{
	if (!out || capacity == 0 || capacity > (1u << 24) || lru_cap >= capacity)
		return -EINVAL;
	struct kvx_xfer_table *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->cap = (uint32_t)capacity;
	t->lru_cap = (uint32_t)lru_cap;
	t->nbucket = 1;
	while (t->nbucket < 2 * t->cap)
		t->nbucket <<= 1;
	t->e = calloc(capacity, sizeof(*t->e));
	t->bucket = calloc(t->nbucket, sizeof(*t->bucket));
	if (!t->e || !t->bucket) {
		kvx_xfer_table_destroy(t);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < t->cap; i++)
		t->e[i].next = i + 2 <= t->cap ? i + 2 : 0;
	t->free_head = 1;
	*out = t;
	return 0;
}

void kvx_xfer_table_destroy(struct kvx_xfer_table *t)
{
	if (!t)
		return;
	if (t->e)
		for (uint32_t i = 0; i < t->cap; i++)
			free(t->e[i].remote_blocks);
	free(t->e);
	free(t->bucket);
	free(t);
}

struct kvx_xfer *kvx_xfer_find(struct kvx_xfer_table *t, const char *tid)
{
	uint32_t h = kvx_xfer_tid_hash(tid);
	for (uint32_t i = t->bucket[h & (t->nbucket - 1)]; i; i = t->e[i - 1].next) {
		struct kvx_xfer *x = &t->e[i - 1];
		if (x->hash == h && !strcmp(x->tid, tid))
			return x;
	}
	return NULL;
}

static void unlink_hash(struct kvx_xfer_table *t, struct kvx_xfer *x)
{
	uint32_t idx = (uint32_t)(x - t->e) + 1;
	uint32_t *p = &t->bucket[x->hash & (t->nbucket - 1)];
	while (*p && *p != idx)
		p = &t->e[*p - 1].next;
	if (*p)
		*p = x->next;
}

static void release_entry(struct kvx_xfer_table *t, struct kvx_xfer *x)
{
	unlink_hash(t, x);
	free(x->remote_blocks);
	memset(x, 0, sizeof(*x));
	x->next = t->free_head;
	t->free_head = (uint32_t)(x - t->e) + 1;
}

static void evict_oldest_terminal(struct kvx_xfer_table *t)
{
	struct kvx_xfer *x = &t->e[t->lru_head - 1];
	t->lru_head = x->lru_next;
	if (!t->lru_head)
		t->lru_tail = 0;
	t->lru_count--;
	release_entry(t, x);
}

int kvx_xfer_open(struct kvx_xfer_table *t, const char *tid, struct kvx_xfer **out)
{
	size_t len = tid ? strnlen(tid, KVX_XFER_ID_MAX) : 0;
	if (len == 0 || len >= KVX_XFER_ID_MAX)
		return -EINVAL;
	if (kvx_xfer_find(t, tid))
		return -EEXIST;
	if (!t->free_head && t->lru_count)
		evict_oldest_terminal(t);
	if (!t->free_head)
		return -ENOBUFS;
	struct kvx_xfer *x = &t->e[t->free_head - 1];
	t->free_head = x->next;
	memset(x, 0, sizeof(*x));
	memcpy(x->tid, tid, len + 1);
	x->hash = kvx_xfer_tid_hash(tid);
	x->state = KVX_XFER_S_LIVE;
	x->decode_dp_rank = -1;
	uint32_t *b = &t->bucket[x->hash & (t->nbucket - 1)];
	x->next = *b;
	*b = (uint32_t)(x - t->e) + 1;
	t->live++;
	*out = x;
	return 0;
}

void kvx_xfer_make_terminal(struct kvx_xfer_table *t, struct kvx_xfer *x)
{
	if (x->state != KVX_XFER_S_LIVE)
		return;
	free(x->remote_blocks);
	x->remote_blocks = NULL;
	x->n_remote_blocks = 0;
	x->has_alloc = false;
	memset(x->layers_sched, 0, sizeof(x->layers_sched));
	x->writes_scheduled = 0;
	x->sealed = false;
	x->state = KVX_XFER_S_TERMINAL;
	t->live--;
	if (t->lru_cap == 0) {
		release_entry(t, x);
		return;
	}
	uint32_t idx = (uint32_t)(x - t->e) + 1;
	x->lru_next = 0;
	if (t->lru_tail)
		t->e[t->lru_tail - 1].lru_next = idx;
	else
		t->lru_head = idx;
	t->lru_tail = idx;
	if (++t->lru_count > t->lru_cap)
		evict_oldest_terminal(t);
}

void kvx_xfer_discard(struct kvx_xfer_table *t, struct kvx_xfer *x)
{
	if (x->state != KVX_XFER_S_LIVE)
		return; /* terminal: in the LRU, its id stays used; free: nothing to release */
	t->live--;
	release_entry(t, x);
}

size_t kvx_xfer_live_count(const struct kvx_xfer_table *t)
{
	return t->live;
}

bool kvx_xfer_schedule_write(struct kvx_xfer *x, uint32_t layer)
{
	if (layer >= KVX_XFER_MAX_LAYERS || x->state != KVX_XFER_S_LIVE)
		return false;
	uint64_t bit = 1ull << (layer % 64);
	if (x->layers_sched[layer / 64] & bit)
		return false;
	x->layers_sched[layer / 64] |= bit;
	x->writes_scheduled++;
	return true;
}

static enum kvx_xfer_action write_check(struct kvx_xfer_table *t, struct kvx_xfer *x)
{
	if (!x->sealed || x->notified || x->writes_done < x->writes_expected)
		return KVX_XFER_ACT_NONE;
	x->notified = true;
	kvx_xfer_make_terminal(t, x);
	return KVX_XFER_ACT_NOTIFY_WRITE_DONE;
}

int kvx_xfer_seal_count(struct kvx_xfer_table *t, struct kvx_xfer *x, uint32_t n_layers, enum kvx_xfer_action *act)
{
	*act = KVX_XFER_ACT_NONE;
	if (x->state != KVX_XFER_S_LIVE)
		return -ENOENT;
	x->writes_expected = n_layers;
	x->sealed = true;
	*act = write_check(t, x);
	return (int)n_layers;
}

enum kvx_xfer_action kvx_xfer_mark_write_done(struct kvx_xfer_table *t, struct kvx_xfer *x, bool ok)
{
	if (x->state != KVX_XFER_S_LIVE)
		return KVX_XFER_ACT_NONE;
	if (!ok) {
		/* A failed write ends the transfer: the producer frees its blocks (docs/protocol.md §5.5). */
		x->failed = true;
		kvx_xfer_make_terminal(t, x);
		return KVX_XFER_ACT_NONE;
	}
	x->writes_done++;
	return write_check(t, x);
}

int kvx_xfer_remote_blocks_take(struct kvx_xfer *x, uint32_t *ids, size_t n, int32_t decode_dp_rank,
				uint64_t alloc_epoch)
{
	if (n == 0) {
		free(ids);
		return -EPROTO;
	}
	if (x->state != KVX_XFER_S_LIVE) {
		free(ids);
		return 0;
	}
	if (x->has_alloc) {
		free(ids);
		return -EEXIST;
	}
	x->remote_blocks = ids;
	x->n_remote_blocks = (uint32_t)n;
	x->decode_dp_rank = decode_dp_rank;
	x->alloc_epoch = alloc_epoch;
	x->has_alloc = true;
	return 1;
}

int kvx_xfer_resolve_ack(struct kvx_xfer_table *t, struct kvx_xfer *x, uint32_t consumer_tp, uint32_t producer_tp)
{
	uint32_t need;
	int rc = kvx_ctl_expected_acks(producer_tp, consumer_tp ? consumer_tp : 1, &need);
	if (rc)
		return rc;
	if (x->state != KVX_XFER_S_LIVE || x->ack_completed)
		return 0;
	if (++x->ack_count < need)
		return 0;
	x->ack_count = 0;
	x->ack_completed = true;
	kvx_xfer_make_terminal(t, x);
	return 1;
}

uint64_t kvx_xfer_sender_key(const char *engine_id, uint32_t rank, uint64_t epoch)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a, 64 bit */
	for (const char *c = engine_id; *c; c++)
		h = (h ^ (uint8_t)*c) * 1099511628211ull;
	for (int i = 0; i < 4; i++)
		h = (h ^ ((rank >> (8 * i)) & 0xff)) * 1099511628211ull;
	for (int i = 0; i < 8; i++)
		h = (h ^ ((epoch >> (8 * i)) & 0xff)) * 1099511628211ull;
	return h ? h : 1;
}

/* A named sender's ACK for a live entry: true if that sender was counted already (a duplicate,
 * ignored); else it is remembered. MoRIIO senders (key 0) carry no name: every ACK counts. */
static bool ack_dup(struct kvx_xfer *x, uint64_t key)
{
	if (!key || !x || x->state != KVX_XFER_S_LIVE)
		return false;
	for (uint32_t i = 0; i < x->n_ack_from; i++)
		if (x->ack_from[i] == key)
			return true;
	if (x->n_ack_from < KVX_XFER_ACK_IDS)
		x->ack_from[x->n_ack_from++] = key;
	return false;
}

static void out_set(struct kvx_xfer_out *o, uint32_t act, enum kvx_cpl_status st, int error)
{
	o->act = act;
	o->status = st;
	o->error = error;
}

static const uint32_t DONE_NOW = KVX_XFER_DO_REPORT | KVX_XFER_DO_RELEASE;

static void on_submit(const struct kvx_xfer *t, const struct kvx_life *lf, size_t n_blocks, struct kvx_xfer_out *o)
{
	bool acked = t && t->state == KVX_XFER_S_TERMINAL && t->ack_completed;
	switch (lf->kind) {
	case KVX_XFER_K_READ:
		o->act = n_blocks ? KVX_XFER_DO_PROGRESS : KVX_XFER_DO_SEND_RELEASE | DONE_NOW;
		return;
	case KVX_XFER_K_ANNOUNCE:
		if (n_blocks && t && t->peer_failed) {
			/* A producer rank failed before we announced (kvx_failed parked): end now;
			 * the blocks wait for the other ranks' answers unless all are in. */
			out_set(o, KVX_XFER_DO_REPORT | (acked ? KVX_XFER_DO_RELEASE
							   : KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE),
				(enum kvx_cpl_status)t->peer_status, t->peer_error);
			return;
		}
		o->act = !n_blocks ? KVX_XFER_DO_SEND_RELEASE_ALL | DONE_NOW : acked ? DONE_NOW : KVX_XFER_DO_SEND_BLOCKS;
		return;
	case KVX_XFER_K_WRITE:
		if (acked)
			out_set(o, KVX_XFER_DO_SEND_WRITE_DONE | DONE_NOW, KVX_CPL_ABORTED, -ECANCELED);
		return;
	case KVX_XFER_K_SERVE:
		o->act = acked ? DONE_NOW : 0;
		return;
	}
}

static void terminate_entry(struct kvx_xfer_table *tab, struct kvx_xfer *t)
{
	if (t && t->state == KVX_XFER_S_LIVE)
		kvx_xfer_make_terminal(tab, t);
}

/* P WRITE with nothing of ours in flight any more: a kvxfer consumer (it named its incarnation
 * in remote_blocks) is told, once, that this side failed, so it ends the transfer at once and
 * frees its blocks (no write can land after this). A consumer that stopped us itself, or a
 * MoRIIO consumer, gets nothing here; nor does one when any of our writes ended in error: a
 * failed or cut tcp write can still be delivered from kernel buffers after we saw it fail, so
 * the consumer keeps its blocks quarantined (defer timeout) rather than freeing them now. */
static uint32_t fail_note(const struct kvx_xfer *t, struct kvx_life *lf)
{
	if (lf->release_sent || lf->peer_stopped || !t || !t->alloc_epoch || t->ops_lost)
		return 0;
	lf->release_sent = true;
	return KVX_XFER_DO_SEND_FAILED;
}

/* The transfer ends early (abort, timeout): its status is @p st / @p err. */
static void end_early(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf, uint64_t now,
		      uint64_t defer_ns, enum kvx_cpl_status st, int err, struct kvx_xfer_out *o)
{
	lf->error = err;
	switch (lf->kind) {
	case KVX_XFER_K_ANNOUNCE:
		/* Tell P to stop; the blocks stay quarantined until its write_done or a further
		 * defer timeout (P's ops are bounded by its op timeout). */
		lf->quarantine_ns = now + defer_ns;
		out_set(o, KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE | KVX_XFER_DO_REPORT, st, err);
		return;
	case KVX_XFER_K_READ:
		out_set(o, KVX_XFER_DO_REPORT | KVX_XFER_DO_PROGRESS, st, err);
		return;
	case KVX_XFER_K_WRITE:
		terminate_entry(tab, t);
		out_set(o, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT |
				   (lf->ops_out ? 0 : KVX_XFER_DO_RELEASE | fail_note(t, lf)),
			st, err);
		return;
	case KVX_XFER_K_SERVE:
		if (st == KVX_CPL_TIMED_OUT) {
			/* A consumer's one-sided READ may still be in flight: the blocks stay held
			 * until every reader is revoked at the wire. */
			terminate_entry(tab, t);
			lf->fence_pending = true;
			out_set(o, KVX_XFER_DO_REPORT | KVX_XFER_DO_FENCE, st, err);
		} else {
			out_set(o, KVX_XFER_DO_REPORT | (lf->ops_out ? 0 : KVX_XFER_DO_RELEASE), st, err);
		}
		return;
	}
}

static void read_settle(struct kvx_life *lf, struct kvx_xfer_out *o);

static void on_tick(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf, const struct kvx_xfer_ev *ev,
		    struct kvx_xfer_out *o)
{
	uint64_t now = ev->now_ns;
	if (lf->reported) {
		if (lf->kind == KVX_XFER_K_ANNOUNCE && lf->quarantine_ns && now > lf->quarantine_ns &&
		    !lf->fence_pending) {
			/* No write_done or kvx_failed within the defer timeout: a write of the
			 * producer may still be on its way (its kernel's send queue after a
			 * partition, a stopped process). Where the lease is checked per op
			 * (caps.cond_ops: tcp at the target; shm by the writer before each copy, with
			 * the copy shown in its busy word, which poller.c report() reads before it
			 * hands the blocks back) such a write finds the lease revoked at our terminal
			 * state and is refused: the blocks come back now.
			 * Otherwise (verbs) only once every connection such a write could land
			 * through is cut (FENCED). The fence cuts every peer's connections, so it is
			 * kept to the transports that need it. */
			if (!ev->fence_writers) {
				o->act = KVX_XFER_DO_RELEASE;
				return;
			}
			lf->fence_pending = true;
			o->act = KVX_XFER_DO_FENCE;
		}
		return;
	}
	bool holds = lf->kind == KVX_XFER_K_SERVE || (lf->kind == KVX_XFER_K_WRITE && !ev->has_alloc);
	uint64_t limit = holds ? ev->defer_timeout_ns : ev->transfer_timeout_ns;
	/* Strict '>': exactly at the limit the transfer is still pending (docs/protocol.md §5.5); a
	 * clock reading older than the start (another thread's) is no timeout. */
	uint64_t age = now > lf->start_ns ? now - lf->start_ns : 0;
	if (lf->kind == KVX_XFER_K_ANNOUNCE && ev->query_peer && !lf->queried) {
		/* Shortly before timing out (the grace before the deadline), ask the (kvxfer)
		 * producer what became of the transfer: a lost write_done still ends DONE on both
		 * sides, and the deadline does not move. */
		uint64_t grace = ev->query_grace_ns < limit ? ev->query_grace_ns : limit;
		if (age > limit - grace) {
			lf->queried = true;
			lf->query_ns = now;
			o->act = KVX_XFER_DO_SEND_QUERY;
			return;
		}
	}
	if (lf->kind == KVX_XFER_K_ANNOUNCE && lf->query_ns && now > lf->query_ns && age > limit &&
	    now - lf->query_ns < (ev->query_grace_ns < limit ? ev->query_grace_ns : limit)) {
		/* The query went out late (this process or its poller was held up past the time to
		 * ask, e.g. SIGSTOP: the producer's write_done may be waiting unread): its answer
		 * gets the same time as an answer to a query sent on time. On time, this changes
		 * nothing. */
		return;
	}
	if (age > limit && lf->await_note) {
		/* Its lease was revoked and the producer's note never came: the lease's -ESTALE. */
		lf->await_note = false;
		read_settle(lf, o);
		return;
	}
	if (age > limit) {
		lf->timed_out = true;
		end_early(tab, t, lf, now, ev->defer_timeout_ns, KVX_CPL_TIMED_OUT, -ETIMEDOUT, o);
	}
}

/* P WRITE holding D's allocation, about to seal or count a written layer (either may end it
 * DONE) after its own deadline (the event's clock): it times out instead, as the clock tick
 * would have done had the poller not been held up (a stopped process, a stalled thread). The
 * consumer, whose deadline runs on the same timeout, has timed out or is about to: a DONE
 * here was the soak's disagreement (P DONE, D TIMED_OUT) after a producer was stopped. */
static bool write_late(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf,
		       const struct kvx_xfer_ev *ev, struct kvx_xfer_out *o)
{
	if (lf->kind != KVX_XFER_K_WRITE || lf->reported || !t || !t->has_alloc || !ev->now_ns ||
	    !ev->transfer_timeout_ns ||
	    ev->now_ns <= lf->start_ns || ev->now_ns - lf->start_ns <= ev->transfer_timeout_ns)
		return false;
	lf->timed_out = true;
	end_early(tab, t, lf, ev->now_ns, ev->defer_timeout_ns, KVX_CPL_TIMED_OUT, -ETIMEDOUT, o);
	return true;
}

static void read_settle(struct kvx_life *lf, struct kvx_xfer_out *o)
{
	if (lf->ops_out || ((lf->await_peer || lf->await_note) && !lf->reported))
		return;
	if (lf->reported) {
		/* The status is out already: blocks now, and P's release if it is owed. */
		bool owed = (lf->aborted || lf->next_layer > 0) && !lf->release_sent;
		o->act = KVX_XFER_DO_RELEASE | (owed ? KVX_XFER_DO_SEND_RELEASE : 0);
	} else if (lf->done_posting || lf->failed) {
		/* Failed: with the producer's status when its kvx_failed said why. */
		out_set(o, KVX_XFER_DO_SEND_RELEASE | DONE_NOW,
			!lf->failed ? KVX_CPL_DONE : lf->peer_status ? (enum kvx_cpl_status)lf->peer_status : KVX_CPL_FAILED,
			lf->failed ? lf->error : 0);
	}
	if (o->act & KVX_XFER_DO_SEND_RELEASE)
		lf->release_sent = true;
}

static void write_settle(const struct kvx_xfer *t, struct kvx_life *lf, struct kvx_xfer_out *o)
{
	if (lf->ops_out)
		return;
	uint32_t act = DONE_NOW;
	if (lf->peer_stopped && !lf->release_sent) {
		/* D aborted: tell it our writes are terminal so its blocks leave quarantine. */
		lf->release_sent = true;
		act |= KVX_XFER_DO_SEND_WRITE_DONE;
	}
	/* Our own abort, timeout or failure is never a write_done (D would take it for DONE):
	 * a kvxfer D gets kvx_failed, a MoRIIO D nothing (it times out). */
	act |= fail_note(t, lf);
	out_set(o, act, lf->aborted ? KVX_CPL_ABORTED : lf->timed_out ? KVX_CPL_TIMED_OUT : KVX_CPL_FAILED, lf->error);
}

static void op_failed(struct kvx_life *lf, const struct kvx_xfer_ev *ev, struct kvx_xfer_out *o)
{
	if (ev->ep_dead)
		o->act = KVX_XFER_DO_RESET_PEER;
	if (lf->failed)
		return;
	if (lf->kind == KVX_XFER_K_READ && ev->ep_dead) {
		lf->await_peer = true; /* PEER_CONNECTED decides: re-post, or fail */
		return;
	}
	lf->failed = true;
	lf->error = ev->error;
	/* A data op the producer's target refused because the lease was revoked (tcp: the
	 * conditional op's -ESTALE) after this READ asked for its notes: end with the producer's
	 * status and error, as a revoked lease found by the lease read does (lease_cpl()). */
	if (lf->kind == KVX_XFER_K_READ && ev->error == -ESTALE && lf->queried && !lf->peer_status)
		lf->await_note = true;
}

static void peer_connected(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf,
			   const struct kvx_xfer_ev *ev, struct kvx_xfer_out *o)
{
	if (lf->reported || (ev->bound && lf->ops_out))
		return;
	if (lf->kind == KVX_XFER_K_READ) {
		if (!ev->bound && !lf->await_peer) {
			o->act = KVX_XFER_DO_BIND;
		} else if (ev->epoch == lf->bound_epoch || !ev->moved) {
			/* Resume: every layer again on the new connection, behind a new lookup of the
			 * lease. The same producer incarnation (a link failure or a partition; its
			 * fence) still grants it only while it holds the blocks for this transfer (a
			 * revoked one is a tombstone: -ESTALE), and the final lease read compares with
			 * the word found then; a new incarnation never grants its predecessor's ids
			 * (the read waits for a grant until the deadline). Bytes that landed from a new
			 * epoch's predecessor rule a retry out (below). */
			lf->await_peer = false;
			lf->next_layer = 0;
			lf->done_posting = false;
			o->act = KVX_XFER_DO_BIND | KVX_XFER_DO_REPOST;
		} else {
			lf->await_peer = false;
			lf->failed = true;
			lf->error = -ECONNRESET;
			lf->done_posting = true;
			read_settle(lf, o);
			return;
		}
		lf->bound_epoch = ev->epoch;
		return;
	}
	if (lf->kind != KVX_XFER_K_WRITE)
		return;
	if ((ev->bound && ev->epoch != lf->bound_epoch) || (lf->alloc_epoch && ev->epoch != lf->alloc_epoch)) {
		lf->failed = true;
		lf->error = -ECONNRESET;
		if (t)
			kvx_xfer_mark_write_done(tab, t, false);
		out_set(o, KVX_XFER_DO_STOP_WRITES | DONE_NOW | fail_note(t, lf), KVX_CPL_FAILED, -ECONNRESET);
		return;
	}
	lf->bound_epoch = ev->epoch;
	o->act = KVX_XFER_DO_BIND;
}

static void settle(struct kvx_life *lf, uint64_t epoch)
{
	lf->check_wait = false;
	lf->alloc_known = true;
	lf->alloc_epoch = epoch;
}

static void peer_epoch(const struct kvx_xfer *t, struct kvx_life *lf, const struct kvx_xfer_ev *ev,
		       struct kvx_xfer_out *o)
{
	if (lf->kind != KVX_XFER_K_WRITE || lf->alloc_known || lf->reported)
		return;
	bool live = ev->has_conn && !ev->conn_stale;
	uint64_t sent = t ? t->alloc_epoch : 0;
	if (sent) {
		settle(lf, sent);
	} else if (lf->check_wait && ev->has_conn && ev->conn_stale) {
		settle(lf, 0); /* a re-handshake runs anyway: its connection is current */
		return;
	} else if (lf->check_wait && ev->check_done < lf->check_need) {
		o->act = KVX_XFER_DO_EPOCH_CHECK; /* no-op while one runs; older jobs do not count */
		return;
	} else if (lf->check_wait) {
		settle(lf, ev->checked_epoch ? ev->checked_epoch : ev->has_conn ? ev->conn_epoch : 0);
	} else if (!live || ev->link_fresh) {
		settle(lf, live ? ev->conn_epoch : 0);
		return;
	} else {
		lf->check_need = ev->check_started + 1;
		lf->check_wait = true;
		o->act = KVX_XFER_DO_EPOCH_CHECK;
		return;
	}
	if (ev->has_conn && lf->alloc_epoch != ev->conn_epoch && (live || !sent))
		o->act = KVX_XFER_DO_RESET_PEER; /* the consumer restarted: re-handshake now */
}

/* Inbound notifications: the entry's bookkeeping, then what it means for a live transfer. */
static void on_notify(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf,
		      const struct kvx_xfer_ev *ev, struct kvx_xfer_out *o)
{
	int rc;
	switch (ev->type) {
	case KVX_XFER_EV_REMOTE_BLOCKS:
		rc = t ? kvx_xfer_remote_blocks_take(t, ev->block_ids, ev->n_blocks, ev->decode_dp_rank, ev->alloc_epoch)
		       : -ENOBUFS;
		if (!t)
			free(ev->block_ids);
		o->late = rc <= 0;
		if (rc == 0 && t->has_out && t->out_status != KVX_CPL_DONE && ev->alloc_epoch) {
			/* A kvxfer consumer allocated for a transfer this side already ended: tell it
			 * now (after our ops drained, if any are still out), so it does not wait. */
			t->alloc_epoch = ev->alloc_epoch;
			t->decode_dp_rank = ev->decode_dp_rank;
			if (!lf)
				out_set(o, KVX_XFER_DO_SEND_FAILED, (enum kvx_cpl_status)t->out_status, t->out_error);
		}
		if (lf && lf->kind == KVX_XFER_K_WRITE)
			o->act = KVX_XFER_DO_PROGRESS;
		return;
	case KVX_XFER_EV_RELEASE:
		if (lf && lf->kind == KVX_XFER_K_WRITE) {
			/* D aborted a push transfer: stop posting, answer once our writes are terminal. */
			if (!lf->reported) {
				lf->aborted = true;
				lf->peer_stopped = true;
				lf->error = -ECANCELED;
				terminate_entry(tab, t);
				out_set(o, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT, KVX_CPL_ABORTED, -ECANCELED);
			}
			o->act |= KVX_XFER_DO_PROGRESS;
			return;
		}
		if (ack_dup(t, ev->sender_key)) {
			o->late = true; /* the same sender's ACK again */
			return;
		}
		rc = t ? kvx_xfer_resolve_ack(tab, t, ev->consumer_tp, ev->producer_tp) : 0;
		if (rc == 1 && lf && lf->kind == KVX_XFER_K_SERVE)
			o->act = DONE_NOW;
		o->late = rc < 0;
		return;
	case KVX_XFER_EV_WRITE_DONE:
		if (ack_dup(t, ev->sender_key)) {
			o->late = true; /* the same producer rank's write_done again */
			return;
		}
		rc = t ? kvx_xfer_resolve_ack(tab, t, ev->consumer_tp, ev->producer_tp) : 0;
		if (rc == 1 && lf && lf->kind == KVX_XFER_K_ANNOUNCE && !lf->fence_pending)
			o->act = DONE_NOW; /* a reported D WRITE: its blocks leave quarantine (a fence
					    * under way releases them when it is done) */
		o->late = rc == 0 && !lf;
		return;
	case KVX_XFER_EV_PEER_FAILED_NOTE:
		if (lf && lf->kind == KVX_XFER_K_READ) {
			/* The producer's serve ended without success (it asked for this note): post
			 * nothing more; once our own reads are terminal (they target our memory), end
			 * with the producer's status and error. */
			if (lf->reported || lf->peer_status) {
				o->late = true;
				return;
			}
			lf->peer_status = (uint8_t)(ev->fail_status ? ev->fail_status : KVX_CPL_FAILED);
			lf->await_note = false;
			lf->failed = true;
			lf->error = ev->error ? ev->error : -EIO;
			lf->done_posting = true;
			read_settle(lf, o);
			return;
		}
		if (!t || t->state != KVX_XFER_S_LIVE || ack_dup(t, ev->sender_key) ||
		    (lf && lf->kind != KVX_XFER_K_ANNOUNCE)) {
			o->late = true;
			return;
		}
		if (!t->peer_failed) {
			t->peer_failed = true;
			t->peer_status = (uint8_t)ev->fail_status;
			t->peer_error = ev->error;
		}
		/* The producer's fence is behind this message: it is a terminal ACK. */
		rc = kvx_xfer_resolve_ack(tab, t, ev->consumer_tp, ev->producer_tp);
		if (!lf) {
			o->late = rc < 0;
			return; /* parked: applied at submission (on_submit()) */
		}
		if (lf->reported) {
			if (rc == 1 && !lf->fence_pending)
				o->act = DONE_NOW; /* quarantine over: every producer rank answered */
			return;
		}
		lf->error = t->peer_error;
		if (rc == 1) {
			out_set(o, DONE_NOW, (enum kvx_cpl_status)t->peer_status, t->peer_error);
		} else {
			/* Other producer ranks may still write: stop them, hold the blocks until they
			 * answer or the defer timeout passes. */
			lf->quarantine_ns = ev->now_ns + ev->defer_timeout_ns;
			out_set(o, KVX_XFER_DO_REPORT | KVX_XFER_DO_SEND_RELEASE_ALL | KVX_XFER_DO_QUARANTINE,
				(enum kvx_cpl_status)t->peer_status, t->peer_error);
		}
		return;
	case KVX_XFER_EV_STATUS_QUERY:
		/* Answer from the stored outcome; a running transfer or an unknown id: nothing. Nor
		 * while writes of a P WRITE that ended are still in flight (@p lf: its ops_out): the
		 * answer frees D's blocks, so it waits for the kvx_failed that write_settle() sends
		 * once they are terminal. */
		if (t && t->state == KVX_XFER_S_TERMINAL && t->has_out && !t->ops_lost && !(lf && lf->ops_out))
			out_set(o, t->out_status == KVX_CPL_DONE ? KVX_XFER_DO_SEND_WRITE_DONE : KVX_XFER_DO_SEND_FAILED,
				(enum kvx_cpl_status)t->out_status, t->out_error);
		else
			o->late = true;
		return;
	default:
		return;
	}
}

static void record_out(struct kvx_xfer *t, const struct kvx_xfer_out *o);
static void step_life(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf,
		      const struct kvx_xfer_ev *ev, struct kvx_xfer_out *o);

void kvx_xfer_step(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf, const struct kvx_xfer_ev *ev,
		   struct kvx_xfer_out *o)
{
	out_set(o, 0, KVX_CPL_DONE, 0);
	o->late = false;
	if (ev->type == KVX_XFER_EV_REMOTE_BLOCKS || ev->type == KVX_XFER_EV_RELEASE ||
	    ev->type == KVX_XFER_EV_WRITE_DONE || ev->type == KVX_XFER_EV_PEER_FAILED_NOTE ||
	    ev->type == KVX_XFER_EV_STATUS_QUERY) {
		on_notify(tab, t, lf, ev, o);
		record_out(t, o);
		return;
	}
	if (!lf)
		return;
	if (ev->type == KVX_XFER_EV_OP_FAILED && lf->kind == KVX_XFER_K_WRITE && t)
		t->ops_lost = true; /* a failed or cut write may still land: see fail_note() */
	step_life(tab, t, lf, ev, o);
	record_out(t, o);
}

/* Poller tables: the reported outcome stays on the entry (terminal LRU), so a status query or
 * a late allocation is answered after the transfer retired. */
static void record_out(struct kvx_xfer *t, const struct kvx_xfer_out *o)
{
	if (!t || !(o->act & KVX_XFER_DO_REPORT) || t->has_out)
		return;
	t->has_out = true;
	t->out_status = (uint8_t)o->status;
	t->out_error = o->error;
}

static void step_life(struct kvx_xfer_table *tab, struct kvx_xfer *t, struct kvx_life *lf,
		      const struct kvx_xfer_ev *ev, struct kvx_xfer_out *o)
{
	switch (ev->type) {
	case KVX_XFER_EV_SUBMIT:
		on_submit(t, lf, ev->n_blocks, o);
		if (o->act & KVX_XFER_DO_QUARANTINE)
			lf->quarantine_ns = ev->now_ns + ev->defer_timeout_ns;
		if (o->act & KVX_XFER_DO_REPORT && o->status == KVX_CPL_ABORTED)
			lf->aborted = true;
		return;
	case KVX_XFER_EV_ABORT:
		if (lf->reported)
			return;
		lf->aborted = true;
		end_early(tab, t, lf, ev->now_ns, ev->defer_timeout_ns, KVX_CPL_ABORTED, -ECANCELED, o);
		return;
	case KVX_XFER_EV_TICK:
		on_tick(tab, t, lf, ev, o);
		return;
	case KVX_XFER_EV_READ_SETTLE:
		read_settle(lf, o);
		return;
	case KVX_XFER_EV_WRITE_SETTLE:
		write_settle(t, lf, o);
		return;
	case KVX_XFER_EV_PEER_FAILED:
		if (lf->reported)
			return;
		if (ev->hs_ends <= lf->hs_after) {
			o->act = KVX_XFER_DO_PROGRESS;
			return;
		}
		if (ev->unbound && (lf->kind == KVX_XFER_K_READ || lf->kind == KVX_XFER_K_WRITE)) {
			uint32_t note = 0;
			if (lf->kind == KVX_XFER_K_WRITE) {
				/* Terminal entry: a later allocation is answered (kvx_failed). */
				lf->failed = true;
				lf->error = ev->error ? ev->error : -ECONNREFUSED;
				terminate_entry(tab, t);
				note = lf->ops_out ? 0 : fail_note(t, lf);
			}
			out_set(o, KVX_XFER_DO_REPORT | note | (lf->ops_out ? 0 : KVX_XFER_DO_RELEASE), KVX_CPL_FAILED,
				ev->error ? ev->error : -ECONNREFUSED);
		} else
			o->act = KVX_XFER_DO_PROGRESS;
		return;
	case KVX_XFER_EV_FENCED:
		if (lf->fence_pending) {
			lf->fence_pending = false;
			o->act = KVX_XFER_DO_RELEASE;
		}
		return;
	case KVX_XFER_EV_LAYER_READY:
		if (lf->kind == KVX_XFER_K_WRITE && !lf->reported && t && kvx_xfer_schedule_write(t, ev->layer))
			o->act = KVX_XFER_DO_POST_LAYER;
		return;
	case KVX_XFER_EV_SEAL: {
		enum kvx_xfer_action a;
		if (write_late(tab, t, lf, ev, o))
			return;
		if (lf->kind == KVX_XFER_K_WRITE && !lf->reported && t &&
		    kvx_xfer_seal_count(tab, t, ev->n_layers, &a) >= 0 && a == KVX_XFER_ACT_NOTIFY_WRITE_DONE)
			o->act = KVX_XFER_DO_SEND_WRITE_DONE | DONE_NOW;
		return;
	}
	case KVX_XFER_EV_LAYER_WRITTEN:
		if (write_late(tab, t, lf, ev, o))
			return;
		if (lf->kind == KVX_XFER_K_WRITE && !lf->reported && t &&
		    kvx_xfer_mark_write_done(tab, t, true) == KVX_XFER_ACT_NOTIFY_WRITE_DONE)
			o->act = KVX_XFER_DO_SEND_WRITE_DONE | DONE_NOW;
		return;
	case KVX_XFER_EV_OP_FAILED:
		op_failed(lf, ev, o);
		return;
	case KVX_XFER_EV_PEER_CONNECTED:
		peer_connected(tab, t, lf, ev, o);
		return;
	case KVX_XFER_EV_PEER_EPOCH:
		peer_epoch(t, lf, ev, o);
		return;
	case KVX_XFER_EV_WRITE_FAILED:
		if (lf->kind != KVX_XFER_K_WRITE || lf->reported)
			return;
		if (!lf->failed) {
			lf->failed = true;
			lf->error = ev->error;
		}
		if (t)
			kvx_xfer_mark_write_done(tab, t, false); /* terminal: nothing more is scheduled */
		out_set(o, KVX_XFER_DO_STOP_WRITES | KVX_XFER_DO_REPORT, KVX_CPL_FAILED, lf->error);
		return;
	default:
		return; /* notifications: on_notify() */
	}
}
