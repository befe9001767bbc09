/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host implementation of the memory ops. "Device" memory is host memory; an asynchronous copy
 * is a queued memcpy that advances by host_step_bytes each time the stream is queried, so the
 * callers' state machines (staging, gating) see copies that finish later than they start, as
 * with a GPU, deterministically and without threads.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mem_internal.h"

struct host_op {
	char *dst;
	const char *src;
	size_t len;
	size_t copied;
};

struct host_stream {
	uint64_t completed; /* ops with seq < completed are finished */
	struct host_op ops[];
};

static int host_probe(int device, char *why, size_t why_len)
{
	(void)device;
	(void)why;
	(void)why_len;
	return 0;
}

static int host_alloc(struct kvx_mem *m, size_t len, void **out)
{
	long page = sysconf(_SC_PAGESIZE);
	void *p = NULL;

	(void)m;
	if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, len) != 0)
		return -ENOMEM;
	*out = p;
	return 0;
}

static void host_free(struct kvx_mem *m, void *p)
{
	(void)m;
	free(p);
}

static int host_copy_sync(struct kvx_mem *m, void *dst, const void *src, size_t len,
			  enum kvx_mem_copy_dir dir)
{
	(void)m;
	(void)dir;
	memmove(dst, src, len);
	return 0;
}

static int host_ptr_query(struct kvx_mem *m, const void *ptr, size_t len,
			  struct kvx_mem_ptr_info *info)
{
	(void)m;
	info->kind = KVX_MEM_HOST;
	info->device = 0;
	info->base = (uintptr_t)ptr;
	info->alloc_len = len;
	info->offset = 0;
	return 0;
}

static int host_stream_create(struct kvx_mem_stream *s)
{
	struct host_stream *h = calloc(1, sizeof(*h) + (size_t)s->depth * sizeof(h->ops[0]));

	if (!h)
		return -ENOMEM;
	s->impl = h;
	return 0;
}

/* Advance the head op by one step. */
static void host_step(struct kvx_mem_stream *s, struct host_stream *h)
{
	struct host_op *op;
	size_t n;

	if (h->completed >= s->issued)
		return;
	op = &h->ops[h->completed % s->depth];
	n = op->len - op->copied;
	if (n > s->host_step_bytes)
		n = s->host_step_bytes;
	memcpy(op->dst + op->copied, op->src + op->copied, n);
	op->copied += n;
	if (op->copied == op->len)
		h->completed++;
}

static void host_stream_destroy(struct kvx_mem_stream *s)
{
	struct host_stream *h = s->impl;

	/* Finish queued copies: callers rely on a destroyed stream having completed its work. */
	while (h->completed < s->issued)
		host_step(s, h);
	free(h);
	s->impl = NULL;
}

static int host_stream_copy(struct kvx_mem_stream *s, uint32_t slot, void *dst, const void *src,
			    size_t len, enum kvx_mem_copy_dir dir)
{
	struct host_stream *h = s->impl;
	struct host_op *op = &h->ops[slot];

	(void)dir;
	op->dst = dst;
	op->src = src;
	op->len = len;
	op->copied = 0;
	return 0;
}

static int host_stream_query(struct kvx_mem_stream *s, uint64_t seq, uint32_t slot)
{
	struct host_stream *h = s->impl;

	(void)slot;
	if (seq >= h->completed)
		host_step(s, h);
	return seq < h->completed;
}

static int host_ipc_get(struct kvx_mem *m, void *base, uint8_t bytes[KVX_MEM_IPC_HIP_BYTES])
{
	(void)m;
	(void)base;
	(void)bytes;
	return -ENOTSUP;
}

static int host_ipc_open(struct kvx_mem *m, const uint8_t bytes[KVX_MEM_IPC_HIP_BYTES],
			 void **base_out)
{
	(void)m;
	(void)bytes;
	(void)base_out;
	return -ENOTSUP;
}

static int host_ipc_close(struct kvx_mem *m, void *base)
{
	(void)m;
	(void)base;
	return -ENOTSUP;
}

const struct kvx_mem_ops kvx_mem_host_ops = {
	.name = "host",
	.probe = host_probe,
	.alloc = host_alloc,
	.free = host_free,
	.host_alloc = host_alloc,
	.host_free = host_free,
	.copy_sync = host_copy_sync,
	.ptr_query = host_ptr_query,
	.stream_create = host_stream_create,
	.stream_destroy = host_stream_destroy,
	.ipc_get = host_ipc_get,
	.ipc_open = host_ipc_open,
	.ipc_close = host_ipc_close,
	.stream_copy = host_stream_copy,
	.stream_query = host_stream_query,
};
