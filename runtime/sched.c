/* SPDX-License-Identifier: Apache-2.0 */
/* Scheduler bookkeeping state machine with an injected clock (PROTOCOL.md §5, §6). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/layout.h"
#include "kvxfer/sched.h"

enum ent_state {
	E_FREE = 0,
	E_PARKED = 1,   /* only an early notification, no allocation yet */
	E_LIVE = 2,     /* allocated */
	E_TERMINAL = 3, /* finished; kept in the LRU to reject duplicates and drop late ACKs */
};

struct ent {
	char tid[KVX_SCHED_ID_MAX];
	char rid[KVX_SCHED_ID_MAX];
	uint32_t hash, next, lru_next;
	uint8_t state;
	bool completed;     /* terminal after a successful transfer (D: write_done applied) */
	uint32_t *blocks;
	size_t n_blocks, cap_blocks;
	uint64_t prompt_tokens;
	bool save_emitted;
	bool finished, deferred, acked;
	uint64_t defer_deadline, ack_deadline;
	bool wire_busy, quarantine_counted;
	bool waiting_write; /* D WRITE: remote_blocks sent, write_done not yet */
	uint64_t write_deadline;
	bool recv_done, aborted, failed_reported;
	int fail_error;
};

struct kvx_sched {
	struct kvx_sched_params p;
	struct ent *e;
	uint32_t *bucket;
	uint32_t nbucket, cap, free_head;
	uint32_t lru_head, lru_tail, lru_count, lru_cap;
	size_t live;
	struct kvx_sched_stats st;
};

static uint32_t hash_id(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 16777619u;
	return h;
}

static bool id_ok(const char *id)
{
	if (!id)
		return false;
	size_t n = strnlen(id, KVX_SCHED_ID_MAX);
	return n > 0 && n < KVX_SCHED_ID_MAX;
}

KVX_API int kvx_sched_create(const struct kvx_sched_params *p, struct kvx_sched **out)
{
	if (!p || !out) {
		kvx_log(KVX_LOG_ERROR, "sched: NULL params or out");
		return -EINVAL;
	}
	const char *bad = NULL;
	if (p->role != KVX_SCHED_PRODUCER && p->role != KVX_SCHED_CONSUMER)
		bad = "role must be KVX_SCHED_PRODUCER or KVX_SCHED_CONSUMER";
	else if (p->mode != KVX_SCHED_MODE_READ && p->mode != KVX_SCHED_MODE_WRITE)
		bad = "mode must be KVX_SCHED_MODE_READ or KVX_SCHED_MODE_WRITE";
	else if (p->block_size == 0)
		bad = "block_size must be > 0";
	else if (p->defer_timeout_ns == 0)
		bad = "defer_timeout_ns must be > 0";
	else if (p->transfer_timeout_ns == 0)
		bad = "transfer_timeout_ns must be > 0";
	else if (p->max_requests == 0 || p->max_requests > (1u << 22))
		bad = "max_requests must be in 1..4194304";
	if (bad) {
		kvx_log(KVX_LOG_ERROR, "sched: invalid params: %s", bad);
		return -EINVAL;
	}
	struct kvx_sched *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->p = *p;
	/* Room for the live set, as many parked notifications, and the terminal LRU. */
	s->lru_cap = p->max_requests < 4096 ? p->max_requests : 4096;
	s->cap = 2 * p->max_requests + s->lru_cap;
	s->nbucket = 1;
	while (s->nbucket < 2 * s->cap)
		s->nbucket <<= 1;
	s->e = calloc(s->cap, sizeof(*s->e));
	s->bucket = calloc(s->nbucket, sizeof(*s->bucket));
	if (!s->e || !s->bucket) {
		kvx_sched_destroy(s);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < s->cap; i++)
		s->e[i].next = i + 2 <= s->cap ? i + 2 : 0;
	s->free_head = 1;
	*out = s;
	return 0;
}

KVX_API void kvx_sched_destroy(struct kvx_sched *s)
{
	if (!s)
		return;
	if (s->e)
		for (uint32_t i = 0; i < s->cap; i++)
			free(s->e[i].blocks);
	free(s->e);
	free(s->bucket);
	free(s);
}

static struct ent *find(const struct kvx_sched *s, const char *tid)
{
	uint32_t h = hash_id(tid);
	for (uint32_t i = s->bucket[h & (s->nbucket - 1)]; i; i = s->e[i - 1].next) {
		struct ent *x = &s->e[i - 1];
		if (x->hash == h && !strcmp(x->tid, tid))
			return x;
	}
	return NULL;
}

static void release(struct kvx_sched *s, struct ent *x)
{
	uint32_t idx = (uint32_t)(x - s->e) + 1;
	uint32_t *p = &s->bucket[x->hash & (s->nbucket - 1)];
	while (*p && *p != idx)
		p = &s->e[*p - 1].next;
	if (*p)
		*p = x->next;
	free(x->blocks);
	memset(x, 0, sizeof(*x));
	x->next = s->free_head;
	s->free_head = idx;
}

static struct ent *insert(struct kvx_sched *s, const char *tid, enum ent_state st)
{
	if (!s->free_head && s->lru_count) {
		struct ent *old = &s->e[s->lru_head - 1];
		s->lru_head = old->lru_next;
		if (!s->lru_head)
			s->lru_tail = 0;
		s->lru_count--;
		release(s, old);
	}
	if (!s->free_head)
		return NULL;
	struct ent *x = &s->e[s->free_head - 1];
	s->free_head = x->next;
	memset(x, 0, sizeof(*x));
	strcpy(x->tid, tid); /* length checked by id_ok() */
	x->hash = hash_id(tid);
	x->state = (uint8_t)st;
	uint32_t *b = &s->bucket[x->hash & (s->nbucket - 1)];
	x->next = *b;
	*b = (uint32_t)(x - s->e) + 1;
	return x;
}

static void make_terminal(struct kvx_sched *s, struct ent *x, bool completed)
{
	if (x->state == E_LIVE)
		s->live--;
	free(x->blocks);
	x->blocks = NULL;
	x->n_blocks = x->cap_blocks = 0;
	x->state = E_TERMINAL;
	x->completed = completed;
	uint32_t idx = (uint32_t)(x - s->e) + 1;
	x->lru_next = 0;
	if (s->lru_tail)
		s->e[s->lru_tail - 1].lru_next = idx;
	else
		s->lru_head = idx;
	s->lru_tail = idx;
	s->lru_count++;
	while (s->lru_count > s->lru_cap) {
		struct ent *old = &s->e[s->lru_head - 1];
		s->lru_head = old->lru_next;
		if (!s->lru_head)
			s->lru_tail = 0;
		s->lru_count--;
		release(s, old);
	}
}

KVX_API void kvx_sched_matched_tokens(const struct kvx_sched *s, const char *transfer_id,
				      const struct kvx_sched_req *r, uint64_t *tokens, bool *async)
{
	*tokens = 0;
	*async = false;
	if (s->p.role == KVX_SCHED_PRODUCER || !r->has_params || !r->do_remote_prefill)
		return;
	if (transfer_id && id_ok(transfer_id)) {
		const struct ent *x = find(s, transfer_id);
		if (x && x->state == E_TERMINAL && x->completed)
			return; /* already loaded: a rescheduled request must not wait again (#53549) */
	}
	uint64_t prompt = r->num_prompt_tokens, done = r->num_computed_tokens;
	if (s->p.mode == KVX_SCHED_MODE_WRITE) {
		if (prompt > done) {
			*tokens = prompt - done;
			*async = true;
		}
		return;
	}
	/* READ: the last prompt token is recomputed locally. */
	if (prompt > done + 1) {
		*tokens = prompt - 1 - done;
		*async = true;
	}
}

static int set_blocks(struct ent *x, const uint32_t *ids, size_t n)
{
	if (n > x->cap_blocks) {
		size_t cap = x->cap_blocks ? x->cap_blocks : 16;
		while (cap < n)
			cap *= 2;
		uint32_t *nb = realloc(x->blocks, cap * sizeof(*nb));
		if (!nb)
			return -ENOMEM;
		x->blocks = nb;
		x->cap_blocks = cap;
	}
	if (n > x->n_blocks)
		memcpy(x->blocks + x->n_blocks, ids, (n - x->n_blocks) * sizeof(*ids));
	x->n_blocks = n;
	return 0;
}

KVX_API int kvx_sched_alloc(struct kvx_sched *s, const struct kvx_sched_alloc *a, uint64_t now_ns,
			    struct kvx_sched_alloc_result *res)
{
	memset(res, 0, sizeof(*res));
	if (!a || !id_ok(a->transfer_id) || (a->n_blocks && !a->block_ids) ||
	    (a->request_id && strnlen(a->request_id, KVX_SCHED_ID_MAX) >= KVX_SCHED_ID_MAX))
		return -EINVAL;
	struct ent *x = find(s, a->transfer_id);
	bool parked_ack = false;
	if (x && x->state == E_PARKED) {
		parked_ack = true;
		x->state = E_LIVE;
	} else if (x) {
		s->st.duplicates++;
		kvx_log(KVX_LOG_WARN, "sched: duplicate transfer id '%s' rejected (first transfer kept)",
			a->transfer_id);
		return -EEXIST;
	} else {
		x = insert(s, a->transfer_id, E_LIVE);
		if (!x)
			return -ENOBUFS;
	}
	s->live++;
	if (a->request_id)
		strcpy(x->rid, a->request_id);
	if (set_blocks(x, a->block_ids, a->n_blocks)) {
		make_terminal(s, x, false);
		return -ENOMEM;
	}
	x->prompt_tokens = a->num_prompt_tokens;
	if (s->p.role == KVX_SCHED_PRODUCER) {
		if (parked_ack) {
			x->acked = true; /* parked deadline was kept in ack_deadline */
		}
		res->action = KVX_SCHED_ACT_NONE;
		return 0;
	}
	if (s->p.mode == KVX_SCHED_MODE_WRITE) {
		if (a->n_blocks == 0) {
			/* Full prefix hit: release P explicitly, never an empty remote_blocks (§6 item 3). */
			res->action = KVX_SCHED_ACT_SEND_RELEASE;
			make_terminal(s, x, true);
			return 0;
		}
		res->action = KVX_SCHED_ACT_SEND_REMOTE_BLOCKS;
		x->waiting_write = true;
		x->wire_busy = true; /* P may write into these blocks from now on */
		x->write_deadline = now_ns + s->p.transfer_timeout_ns;
		if (parked_ack) {
			x->recv_done = true;
			x->waiting_write = false;
			x->wire_busy = false;
			s->st.acks++;
		}
		return 0;
	}
	size_t start = 0;
	size_t pairs = kvx_plan_pair_by_position(a->n_blocks, a->n_remote_blocks, a->cached_blocks, &start);
	res->remote_start = start;
	res->n_pairs = pairs;
	if (pairs == 0) {
		res->action = KVX_SCHED_ACT_SEND_RELEASE; /* full hit: no RDMA */
		make_terminal(s, x, true);
		return 0;
	}
	res->action = KVX_SCHED_ACT_START_READ;
	x->wire_busy = true; /* our reads are in flight until the engine says otherwise */
	x->write_deadline = now_ns + s->p.transfer_timeout_ns;
	return 0;
}

KVX_API int kvx_sched_step(struct kvx_sched *s, const char *transfer_id, const uint32_t *new_blocks, size_t n_new,
			   uint64_t computed_tokens, const uint32_t **blocks, size_t *n_blocks)
{
	if (s->p.role != KVX_SCHED_PRODUCER || !id_ok(transfer_id) || (n_new && !new_blocks))
		return -EINVAL;
	struct ent *x = find(s, transfer_id);
	if (!x || x->state != E_LIVE)
		return -ENOENT;
	if (n_new) {
		size_t old = x->n_blocks;
		if (n_new > SIZE_MAX - old)
			return -EINVAL;
		if (x->cap_blocks < old + n_new) {
			size_t cap = x->cap_blocks ? x->cap_blocks : 16;
			while (cap < old + n_new)
				cap *= 2;
			uint32_t *nb = realloc(x->blocks, cap * sizeof(*nb));
			if (!nb)
				return -ENOMEM;
			x->blocks = nb;
			x->cap_blocks = cap;
		}
		memcpy(x->blocks + old, new_blocks, n_new * sizeof(*new_blocks));
		x->n_blocks = old + n_new;
	}
	if (x->save_emitted || computed_tokens < x->prompt_tokens)
		return 0;
	x->save_emitted = true;
	if (blocks)
		*blocks = x->blocks;
	if (n_blocks)
		*n_blocks = x->n_blocks;
	return 1;
}

KVX_API int kvx_sched_finished(struct kvx_sched *s, const char *transfer_id, bool do_remote_decode,
			       uint64_t now_ns)
{
	if (!id_ok(transfer_id))
		return -EINVAL;
	struct ent *x = find(s, transfer_id);
	if (!x || x->state != E_LIVE)
		return -ENOENT;
	x->finished = true;
	if (s->p.role != KVX_SCHED_PRODUCER || !do_remote_decode || x->n_blocks == 0) {
		if (s->p.role == KVX_SCHED_PRODUCER)
			make_terminal(s, x, false);
		return 0;
	}
	x->deferred = true;
	x->defer_deadline = now_ns + s->p.defer_timeout_ns;
	return 1;
}

KVX_API int kvx_sched_ack(struct kvx_sched *s, const char *transfer_id, uint64_t now_ns)
{
	if (!id_ok(transfer_id))
		return -EINVAL;
	struct ent *x = find(s, transfer_id);
	if (x && x->state == E_TERMINAL)
		return 2;
	if (x && x->state == E_PARKED)
		return 1; /* keep the first deadline: a park never overwrites it */
	if (!x) {
		x = insert(s, transfer_id, E_PARKED);
		if (!x)
			return -ENOBUFS;
		x->ack_deadline = now_ns + s->p.defer_timeout_ns;
		s->st.parked++;
		return 1;
	}
	s->st.acks++;
	if (s->p.role == KVX_SCHED_PRODUCER) {
		if (!x->acked) {
			x->acked = true;
			x->ack_deadline = now_ns + s->p.defer_timeout_ns;
		}
		return 0;
	}
	/* Consumer: write_done (WRITE) or read batch done (READ). P's ops are terminal. */
	x->wire_busy = false;
	if (x->aborted)
		return 0;
	x->recv_done = true;
	x->waiting_write = false;
	return 0;
}

KVX_API int kvx_sched_set_wire_busy(struct kvx_sched *s, const char *transfer_id, bool busy)
{
	if (!id_ok(transfer_id))
		return -EINVAL;
	struct ent *x = find(s, transfer_id);
	if (!x || x->state != E_LIVE)
		return -ENOENT;
	x->wire_busy = busy;
	return 0;
}

KVX_API int kvx_sched_abort(struct kvx_sched *s, const char *transfer_id, uint64_t now_ns,
			    enum kvx_sched_action *act)
{
	(void)now_ns;
	*act = KVX_SCHED_ACT_NONE;
	if (s->p.role != KVX_SCHED_CONSUMER || !id_ok(transfer_id))
		return -EINVAL;
	struct ent *x = find(s, transfer_id);
	if (x && x->state == E_TERMINAL)
		return 0; /* already finished: nothing to release */
	if (!x || x->state == E_PARKED) {
		/* Never allocated: release P in both modes (PROTOCOL.md §5.5). */
		if (!x)
			x = insert(s, transfer_id, E_LIVE);
		else
			x->state = E_LIVE;
		if (!x)
			return -ENOBUFS;
		s->live++;
		make_terminal(s, x, false);
		*act = KVX_SCHED_ACT_SEND_RELEASE;
		return 0;
	}
	if (x->recv_done || x->aborted)
		return 0;
	x->aborted = true;
	x->waiting_write = false;
	*act = KVX_SCHED_ACT_SEND_RELEASE;
	return 0;
}

KVX_API int kvx_sched_rename(struct kvx_sched *s, const char *transfer_id, const char *new_request_id)
{
	if (!id_ok(transfer_id) || !id_ok(new_request_id))
		return -EINVAL;
	struct ent *x = find(s, transfer_id);
	if (!x || x->state != E_LIVE)
		return -ENOENT;
	strcpy(x->rid, new_request_id);
	return 0;
}

static void fill(struct kvx_sched_event *ev, enum kvx_sched_event_kind k, const struct ent *x)
{
	memset(ev, 0, sizeof(*ev));
	ev->kind = k;
	strcpy(ev->transfer_id, x->tid);
	strcpy(ev->request_id, x->rid);
}

static size_t update_producer(struct kvx_sched *s, uint64_t now, struct kvx_sched_event *ev, size_t cap)
{
	size_t n = 0;
	for (uint32_t i = 0; i < s->cap && n < cap; i++) {
		struct ent *x = &s->e[i];
		if (x->state == E_PARKED) {
			if (now >= x->ack_deadline) {
				s->st.stale_dropped++;
				release(s, x);
			}
			continue;
		}
		if (x->state != E_LIVE)
			continue;
		if (x->acked && !x->deferred && now >= x->ack_deadline) {
			x->acked = false; /* stale ACK: its request never deferred in time */
			s->st.stale_dropped++;
		}
		if (!x->deferred)
			continue;
		bool reaped = !x->acked && now >= x->defer_deadline;
		if (!x->acked && !reaped)
			continue;
		if (x->wire_busy) {
			if (!x->quarantine_counted) {
				x->quarantine_counted = true;
				s->st.quarantined++;
			}
			continue;
		}
		fill(&ev[n], KVX_SCHED_EV_FINISHED_SENDING, x);
		ev[n++].reaped = reaped;
		if (reaped)
			s->st.reaped++;
		make_terminal(s, x, !reaped);
	}
	return n;
}

static size_t update_consumer(struct kvx_sched *s, uint64_t now, struct kvx_sched_event *ev, size_t cap)
{
	size_t n = 0;
	for (uint32_t i = 0; i < s->cap && n < cap; i++) {
		struct ent *x = &s->e[i];
		if (x->state == E_PARKED) {
			if (now >= x->ack_deadline) {
				s->st.stale_dropped++;
				release(s, x);
			}
			continue;
		}
		if (x->state != E_LIVE)
			continue;
		if (x->recv_done) {
			fill(&ev[n++], KVX_SCHED_EV_FINISHED_RECVING, x);
			make_terminal(s, x, true);
			continue;
		}
		if (!x->aborted && x->write_deadline && now > x->write_deadline) {
			x->aborted = true;
			x->fail_error = -ETIMEDOUT;
			s->st.timed_out++;
		}
		if (x->aborted && x->fail_error && !x->failed_reported) {
			fill(&ev[n], KVX_SCHED_EV_FAILED, x);
			ev[n++].error = x->fail_error;
			x->failed_reported = true;
			if (n == cap)
				break;
		}
		if (!x->aborted)
			continue;
		if (x->wire_busy) {
			if (!x->quarantine_counted) {
				x->quarantine_counted = true;
				s->st.quarantined++;
			}
			continue;
		}
		fill(&ev[n++], KVX_SCHED_EV_FREE_BLOCKS, x);
		make_terminal(s, x, false);
	}
	return n;
}

KVX_API size_t kvx_sched_update(struct kvx_sched *s, uint64_t now_ns, struct kvx_sched_event *ev, size_t cap)
{
	if (!ev || !cap)
		return 0;
	return s->p.role == KVX_SCHED_PRODUCER ? update_producer(s, now_ns, ev, cap)
					       : update_consumer(s, now_ns, ev, cap);
}

KVX_API size_t kvx_sched_live(const struct kvx_sched *s)
{
	return s->live;
}

KVX_API void kvx_sched_get_stats(const struct kvx_sched *s, struct kvx_sched_stats *st)
{
	*st = s->st;
}
