/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging ring: pinned bounce buffers between device memory and a socket. Slots are filled in
 * ring order and handed out in ring order; the caller may give them back in any order.
 *
 * D2H (send side):   FREE -copy-> COPYING -event ready-> FILLED -poll-> HELD -release-> FREE
 * H2D (receive side): FREE -get-> HELD -commit-> COPYING -event ready, poll-> FREE
 *                     (HELD -cancel-> FREE)
 *
 * Sequence numbers are free-running uint64_t; slot = seq % nbufs. For D2H, fill_seq - out_seq
 * <= nbufs holds because a slot is only filled when FREE, and the slot of fill_seq == out_seq +
 * nbufs is the one at out_seq, which is COPYING or FILLED until handed out.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mem_internal.h"

enum slot_state { SLOT_FREE = 0, SLOT_COPYING, SLOT_FILLED, SLOT_HELD };

struct stage_slot {
	void *buf;
	enum slot_state state;
	size_t len;
	uint64_t job_off;
	uint64_t cookie;
	bool last;
	struct kvx_mem_event ev;
};

struct stage_job {
	const char *src;
	size_t len;
	size_t staged;
	uint64_t cookie;
};

struct kvx_mem_stage {
	struct kvx_mem *m;
	struct kvx_mem_stream *s;
	uint32_t nbufs;
	size_t buf_bytes;
	bool failed;
	uint64_t fill_seq; /* D2H: next slot to fill. H2D: next slot to hand out (get). */
	uint64_t out_seq;  /* D2H: next slot to hand out. H2D: next slot to retire. */
	uint32_t njobs;
	uint64_t job_head, job_tail; /* free-running; job = jobs[seq % njobs] */
	struct stage_slot slot[KVX_MEM_STAGE_MAX_BUFS];
	struct stage_job *jobs;
};

int kvx_mem_stage_create(struct kvx_mem *m, struct kvx_mem_stream *s,
			 const struct kvx_mem_stage_params *p, struct kvx_mem_stage **out)
{
	uint32_t nbufs = p && p->nbufs ? p->nbufs : KVX_MEM_STAGE_DEFAULT_BUFS;
	size_t bytes = p && p->buf_bytes ? p->buf_bytes : KVX_MEM_STAGE_DEFAULT_BUF_BYTES;
	uint32_t njobs = p && p->jobs ? p->jobs : 64;
	struct kvx_mem_stage *st;
	int rc;

	if (!m || !s || !out || s->m != m || nbufs < 2 || nbufs > KVX_MEM_STAGE_MAX_BUFS ||
	    bytes < 4096 || bytes > (1ull << 30) || njobs > 4096)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->jobs = calloc(njobs, sizeof(st->jobs[0]));
	if (!st->jobs) {
		free(st);
		return -ENOMEM;
	}
	st->m = m;
	st->s = s;
	st->nbufs = nbufs;
	st->buf_bytes = bytes;
	st->njobs = njobs;
	for (uint32_t i = 0; i < nbufs; i++) {
		rc = kvx_mem_host_alloc(m, bytes, &st->slot[i].buf);
		if (rc) {
			kvx_mem_stage_destroy(st);
			return rc;
		}
	}
	*out = st;
	return 0;
}

void kvx_mem_stage_destroy(struct kvx_mem_stage *st)
{
	if (!st)
		return;
	/* Copies still in flight write into or read from the bounce buffers: finish them first. */
	for (uint32_t i = 0; i < st->nbufs; i++) {
		struct stage_slot *x = &st->slot[i];

		while (x->state == SLOT_COPYING && kvx_mem_event_query(&x->ev) == 0)
			;
	}
	for (uint32_t i = 0; i < st->nbufs; i++)
		kvx_mem_host_free(st->m, st->slot[i].buf);
	free(st->jobs);
	free(st);
}

int kvx_mem_stage_d2h_push(struct kvx_mem_stage *st, const void *src, size_t len,
			   uint64_t cookie)
{
	struct stage_job *j;

	if (KVX_UNLIKELY(!src || len == 0))
		return -EINVAL;
	if (st->job_tail - st->job_head == st->njobs)
		return -ENOBUFS;
	j = &st->jobs[st->job_tail % st->njobs];
	j->src = src;
	j->len = len;
	j->staged = 0;
	j->cookie = cookie;
	st->job_tail++;
	return 0;
}

/* Start copies into free slots, in ring order, while jobs have bytes left. */
static int d2h_fill(struct kvx_mem_stage *st)
{
	while (st->job_head != st->job_tail) {
		struct stage_job *j = &st->jobs[st->job_head % st->njobs];
		struct stage_slot *x = &st->slot[st->fill_seq % st->nbufs];
		size_t n = j->len - j->staged;
		int rc;

		if (x->state != SLOT_FREE)
			return 0;
		if (n > st->buf_bytes)
			n = st->buf_bytes;
		rc = kvx_mem_copy_async(st->s, x->buf, j->src + j->staged, n, KVX_MEM_D2H, &x->ev);
		if (rc == -ENOBUFS)
			return 0;
		if (KVX_UNLIKELY(rc))
			return rc;
		x->state = SLOT_COPYING;
		x->len = n;
		x->job_off = j->staged;
		x->cookie = j->cookie;
		j->staged += n;
		x->last = j->staged == j->len;
		if (x->last)
			st->job_head++;
		st->fill_seq++;
	}
	return 0;
}

int kvx_mem_stage_d2h_poll(struct kvx_mem_stage *st, struct kvx_mem_chunk *out)
{
	struct stage_slot *x;
	uint32_t idx;
	int rc;

	if (KVX_UNLIKELY(st->failed))
		return -EIO;
	rc = d2h_fill(st);
	if (KVX_UNLIKELY(rc)) {
		st->failed = true;
		return -EIO;
	}
	if (st->out_seq == st->fill_seq)
		return 0;
	idx = (uint32_t)(st->out_seq % st->nbufs);
	x = &st->slot[idx];
	if (x->state == SLOT_COPYING) {
		rc = kvx_mem_event_query(&x->ev);
		if (KVX_UNLIKELY(rc < 0)) {
			st->failed = true;
			return -EIO;
		}
		if (rc == 0)
			return 0;
		x->state = SLOT_FILLED;
	}
	if (x->state != SLOT_FILLED)
		return 0;
	x->state = SLOT_HELD;
	out->buf = x->buf;
	out->len = x->len;
	out->job_off = x->job_off;
	out->cookie = x->cookie;
	out->slot = idx;
	out->last = x->last;
	st->out_seq++;
	return 1;
}

static struct stage_slot *held_slot(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c)
{
	struct stage_slot *x;

	if (!c || c->slot >= st->nbufs)
		return NULL;
	x = &st->slot[c->slot];
	if (x->state != SLOT_HELD || x->buf != c->buf)
		return NULL;
	return x;
}

int kvx_mem_stage_d2h_release(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c)
{
	struct stage_slot *x = held_slot(st, c);

	if (!x)
		return -EINVAL;
	x->state = SLOT_FREE;
	return 0;
}

int kvx_mem_stage_h2d_get(struct kvx_mem_stage *st, struct kvx_mem_chunk *out)
{
	uint32_t idx = (uint32_t)(st->fill_seq % st->nbufs);
	struct stage_slot *x = &st->slot[idx];

	if (st->fill_seq - st->out_seq == st->nbufs || x->state != SLOT_FREE)
		return -ENOBUFS;
	x->state = SLOT_HELD;
	x->len = 0;
	memset(out, 0, sizeof(*out));
	out->buf = x->buf;
	out->len = st->buf_bytes;
	out->slot = idx;
	st->fill_seq++;
	return 0;
}

int kvx_mem_stage_h2d_commit(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c, void *dst,
			     size_t len, uint64_t cookie)
{
	struct stage_slot *x = held_slot(st, c);
	int rc;

	if (!x || !dst || len == 0 || len > st->buf_bytes)
		return -EINVAL;
	rc = kvx_mem_copy_async(st->s, dst, x->buf, len, KVX_MEM_H2D, &x->ev);
	if (rc)
		return rc;
	x->state = SLOT_COPYING;
	x->len = len;
	x->cookie = cookie;
	return 0;
}

int kvx_mem_stage_h2d_cancel(struct kvx_mem_stage *st, const struct kvx_mem_chunk *c)
{
	struct stage_slot *x = held_slot(st, c);

	if (!x)
		return -EINVAL;
	x->state = SLOT_FREE;
	return 0;
}

int kvx_mem_stage_h2d_poll(struct kvx_mem_stage *st, uint64_t *cookie, size_t *len)
{
	struct stage_slot *x;
	int rc;

	/* Skip cancelled slots at the retire end of the window. */
	while (st->out_seq != st->fill_seq &&
	       st->slot[st->out_seq % st->nbufs].state == SLOT_FREE)
		st->out_seq++;
	if (st->out_seq == st->fill_seq)
		return 0;
	x = &st->slot[st->out_seq % st->nbufs];
	if (x->state != SLOT_COPYING)
		return 0;
	rc = kvx_mem_event_query(&x->ev);
	if (KVX_UNLIKELY(rc < 0))
		return -EIO;
	if (rc == 0)
		return 0;
	x->state = SLOT_FREE;
	*cookie = x->cookie;
	if (len)
		*len = x->len;
	st->out_seq++;
	return 1;
}
