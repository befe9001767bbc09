/* SPDX-License-Identifier: Apache-2.0 */
/* The streaming process_vm_readv/writev peer of `kvxfer-perf trace --peer cma` (trace_cma.h). */
#include "trace_cma.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define CMA_IOV 1024 /* UIO_MAXIOV: the most iovecs one process_vm_*v call takes */
_Static_assert(CMA_IOV <= IOV_MAX, "IOV_MAX");

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return p;
	size_t c = *cap ? *cap : 64;
	while (c < need)
		c *= 2;
	void *q = realloc(p, c * elem);
	if (q)
		*cap = c;
	return q;
}

int trace_cma_log_add(struct trace_cma_log *l, uint64_t idx, const uint32_t *ids, uint64_t n)
{
	size_t cap = l->cap, capids = l->capids;
	struct trace_cma_entry *e = grow(l->e, &cap, l->n + 1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	l->e = e;
	size_t cap2 = l->cap;
	uint64_t *off = grow(l->off, &cap2, l->n + 1, sizeof(*off));
	if (!off)
		return -ENOMEM;
	l->off = off;
	l->cap = cap < cap2 ? cap : cap2;
	uint32_t *v = grow(l->ids, &capids, l->nids + n, sizeof(*v));
	if (!v)
		return -ENOMEM;
	l->ids = v;
	l->capids = capids;
	memcpy(l->ids + l->nids, ids, n * sizeof(*ids));
	l->e[l->n] = (struct trace_cma_entry){.idx = idx, .n = n};
	l->off[l->n] = l->nids;
	l->n++;
	l->nids += n;
	return 0;
}

void trace_cma_log_free(struct trace_cma_log *l)
{
	free(l->e);
	free(l->off);
	free(l->ids);
	memset(l, 0, sizeof(*l));
}

static size_t padded(uint64_t n)
{
	return (size_t)(n + (n & 1)) * sizeof(uint32_t);
}

int trace_cma_info_pack(const struct trace_cma_log *l, const struct trace_cma_pool *pool, pid_t pid,
			void **out, size_t *len)
{
	size_t sz = sizeof(struct trace_cma_info) + pool->layers * sizeof(uint64_t);
	for (size_t i = 0; i < l->n; i++)
		sz += sizeof(struct trace_cma_entry) + padded(l->e[i].n);
	unsigned char *b = calloc(1, sz), *p = b;
	if (!b)
		return -ENOMEM;
	struct trace_cma_info h = {.pid = (int32_t)pid, .layers = pool->layers, .planes = pool->planes,
				   .nb = pool->nb, .block_len = pool->block_len, .entries = l->n};
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	for (uint32_t i = 0; i < pool->layers; i++) {
		uint64_t a = (uint64_t)(uintptr_t)pool->layer[i];
		memcpy(p, &a, sizeof(a));
		p += sizeof(a);
	}
	for (size_t i = 0; i < l->n; i++) {
		memcpy(p, &l->e[i], sizeof(l->e[i]));
		p += sizeof(l->e[i]);
		memcpy(p, l->ids + l->off[i], l->e[i].n * sizeof(uint32_t));
		p += padded(l->e[i].n);
	}
	*out = b;
	*len = sz;
	return 0;
}

struct remote_entry {
	uint64_t idx, n;
	const uint32_t *ids; /* unaligned reads through memcpy */
};

static int cmp_entry(const void *a, const void *b)
{
	uint64_t x = ((const struct remote_entry *)a)->idx, y = ((const struct remote_entry *)b)->idx;
	return x < y ? -1 : x > y;
}

static uint32_t id_at(const uint32_t *ids, uint64_t i)
{
	uint32_t v;
	memcpy(&v, ids + i, sizeof(v));
	return v;
}

struct loop {
	pid_t pid;
	int write;
	struct iovec l[CMA_IOV], r[CMA_IOV];
	uint32_t k;
	struct trace_cma_result *res;
};

/* Move the pending iovecs; a short count (the kernel's per-call cap) goes on from where it
 * stopped. Returns 0 or -errno. */
static int flush(struct loop *L)
{
	uint32_t li = 0, ri = 0;
	while (li < L->k) {
		ssize_t n = L->write ? process_vm_writev(L->pid, L->l + li, L->k - li, L->r + ri, L->k - ri, 0)
				     : process_vm_readv(L->pid, L->l + li, L->k - li, L->r + ri, L->k - ri, 0);
		L->res->calls++;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		L->res->bytes += (uint64_t)n;
		/* Consume n bytes from both sides (their iovecs pair up one to one, same lengths). */
		size_t left = (size_t)n;
		while (left && li < L->k) {
			size_t t = L->l[li].iov_len < left ? L->l[li].iov_len : left;
			L->l[li].iov_base = (char *)L->l[li].iov_base + t;
			L->l[li].iov_len -= t;
			if (!L->l[li].iov_len)
				li++;
			left -= t;
		}
		left = (size_t)n;
		while (left && ri < L->k) {
			size_t t = L->r[ri].iov_len < left ? L->r[ri].iov_len : left;
			L->r[ri].iov_base = (char *)L->r[ri].iov_base + t;
			L->r[ri].iov_len -= t;
			if (!L->r[ri].iov_len)
				ri++;
			left -= t;
		}
	}
	L->k = 0;
	return 0;
}

/* Append one block range; merged into the previous iovec when both sides continue it. */
static int add(struct loop *L, unsigned char *lo, uint64_t ro, uint64_t len)
{
	if (L->k) {
		struct iovec *a = &L->l[L->k - 1], *b = &L->r[L->k - 1];
		if ((unsigned char *)a->iov_base + a->iov_len == lo &&
		    (uint64_t)(uintptr_t)b->iov_base + b->iov_len == ro) {
			a->iov_len += len;
			b->iov_len += len;
			return 0;
		}
	}
	if (L->k == CMA_IOV) {
		int rc = flush(L);
		if (rc)
			return rc;
	}
	L->l[L->k] = (struct iovec){.iov_base = lo, .iov_len = len};
	L->r[L->k] = (struct iovec){.iov_base = (void *)(uintptr_t)ro, .iov_len = len};
	L->k++;
	L->res->iovs++;
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Parse @p info into its header, layer bases and entries (in the other role's start order). */
static int parse(const void *info, size_t len, struct trace_cma_info *h, uint64_t **base,
		 struct remote_entry **ents)
{
	const unsigned char *p = info, *end = p + len;
	if (!info || len < sizeof(*h))
		return -EPROTO;
	memcpy(h, p, sizeof(*h));
	p += sizeof(*h);
	if (h->layers == 0 || h->planes == 0 || h->nb == 0 || h->block_len == 0 ||
	    (size_t)(end - p) / sizeof(uint64_t) < h->layers || h->entries > len)
		return -EPROTO;
	*base = malloc(h->layers * sizeof(uint64_t));
	*ents = malloc((h->entries ? h->entries : 1) * sizeof(**ents));
	if (!*base || !*ents)
		return -ENOMEM;
	memcpy(*base, p, h->layers * sizeof(uint64_t));
	p += h->layers * sizeof(uint64_t);
	for (uint64_t i = 0; i < h->entries; i++) {
		struct trace_cma_entry e;
		if ((size_t)(end - p) < sizeof(e))
			return -EPROTO;
		memcpy(&e, p, sizeof(e));
		p += sizeof(e);
		if (e.n > (size_t)(end - p) / sizeof(uint32_t) || padded(e.n) > (size_t)(end - p))
			return -EPROTO;
		(*ents)[i] = (struct remote_entry){.idx = e.idx, .n = e.n, .ids = (const uint32_t *)p};
		p += padded(e.n);
	}
	if (p != end)
		return -EPROTO;
	return 0;
}

/* One logged transfer by idx: position in @p l, or -1. @p ord is l's positions sorted by idx. */
static long find_local(const struct trace_cma_log *l, const size_t *ord, uint64_t idx)
{
	size_t lo = 0, hi = l->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint64_t v = l->e[ord[mid]].idx;
		if (v == idx)
			return (long)ord[mid];
		if (v < idx)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

static int cmp_ord(const void *a, const void *b, void *log)
{
	const struct trace_cma_log *l = log;
	uint64_t x = l->e[*(const size_t *)a].idx, y = l->e[*(const size_t *)b].idx;
	return x < y ? -1 : x > y;
}

int trace_cma_each_extent(const struct trace_cma_log *local, const struct trace_cma_pool *pool, bool initiator,
			  const void *info, size_t len, trace_cma_extent_fn fn, void *arg,
			  struct trace_cma_result *r)
{
	struct trace_cma_info h;
	uint64_t *base = NULL;
	struct remote_entry *ents = NULL, *sorted = NULL;
	size_t *ord = NULL;
	int rc = parse(info, len, &h, &base, &ents);
	if (!rc && (h.layers != pool->layers || h.planes != pool->planes || h.block_len != pool->block_len))
		rc = -EINVAL;
	if (!rc) {
		/* The initiator's start order rules: look the other side up by idx. */
		sorted = malloc((h.entries ? h.entries : 1) * sizeof(*sorted));
		ord = malloc((local->n ? local->n : 1) * sizeof(*ord));
		if (!sorted || !ord)
			rc = -ENOMEM;
	}
	if (rc)
		goto out;
	memcpy(sorted, ents, h.entries * sizeof(*sorted));
	qsort(sorted, h.entries, sizeof(*sorted), cmp_entry);
	for (size_t i = 0; i < local->n; i++)
		ord[i] = i;
	qsort_r(ord, local->n, sizeof(*ord), cmp_ord, (void *)local);
	size_t n = initiator ? local->n : h.entries;
	for (size_t i = 0; i < n && !rc; i++) {
		const struct remote_entry *re;
		long li;
		if (initiator) {
			struct remote_entry key = {.idx = local->e[i].idx};
			li = (long)i;
			re = bsearch(&key, sorted, h.entries, sizeof(*sorted), cmp_entry);
		} else {
			re = &ents[i];
			li = find_local(local, ord, re->idx);
		}
		if (!re || li < 0) {
			r->missing++;
			continue;
		}
		const struct trace_cma_entry *le = &local->e[li];
		const uint32_t *lid = local->ids + local->off[li];
		uint64_t k = le->n < re->n ? le->n : re->n, lo = le->n - k, ro = re->n - k;
		for (uint64_t j = 0; j < k; j++)
			if (lid[lo + j] >= pool->nb || id_at(re->ids, ro + j) >= h.nb)
				rc = -EINVAL;
		for (uint32_t l = 0; l < pool->layers && !rc; l++)
			for (uint32_t p = 0; p < pool->planes && !rc; p++)
				for (uint64_t j = 0; j < k && !rc; j++) {
					unsigned char *a = pool->layer[l] + (p * pool->nb + lid[lo + j]) * pool->block_len;
					uint64_t b = base[l] + (p * h.nb + id_at(re->ids, ro + j)) * h.block_len;
					rc = fn(arg, a, b, pool->block_len);
				}
		r->transfers++;
	}
out:
	free(base);
	free(ents);
	free(sorted);
	free(ord);
	return rc;
}

static int add_cb(void *arg, unsigned char *lo, uint64_t ro, uint64_t len)
{
	return add(arg, lo, ro, len);
}

void trace_cma_run(const struct trace_cma_log *local, const struct trace_cma_pool *pool, int write,
		   const void *info, size_t len, struct trace_cma_result *r)
{
	memset(r, 0, sizeof(*r));
	struct loop *L = calloc(1, sizeof(*L));
	int rc = -ENOMEM;
	if (L) {
		struct trace_cma_info h = {0};
		if (info && len >= sizeof(h))
			memcpy(&h, info, sizeof(h));
		*L = (struct loop){.pid = (pid_t)h.pid, .write = write, .res = r};
		uint64_t t0 = now_ns();
		rc = trace_cma_each_extent(local, pool, true, info, len, add_cb, L, r);
		if (!rc)
			rc = flush(L);
		r->ns = now_ns() - t0;
	}
	r->status = rc;
	free(L);
}
