/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host implementation of the memory ops. "Device" memory is host memory; an asynchronous copy
 * is a queued memcpy that advances by host_step_bytes each time the stream is queried, so the
 * callers' state machines (staging, gating) see copies that finish later than they start, as
 * with a GPU, deterministically and without threads.
 *
 * Also the hostdev mock (KVX_MEM_HOSTDEV, test-only): the same queued copies, but device
 * pointers are PROT_NONE views of a memfd, so code that touches them with the CPU or with CMA
 * faults; copies translate a device pointer to a second, read/write view of the same memfd.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* ------------------------------------------------------------------ hostdev mock */

#define HD_MAGIC 0x4448584bu /* "KXHD" */
#define HD_MAX 4096u

/* One mapped allocation: exported (own memfd) or imported (a peer's memfd). */
struct hd_alloc {
	uintptr_t dev;  /* PROT_NONE view: the "device pointer" */
	char *rw;       /* read/write view of the same pages: used by copies only */
	size_t len;     /* allocation length, bytes */
	size_t map_len; /* page-rounded mapping length */
	int fd;         /* memfd of an own allocation; -1 for an imported one */
	uint64_t ino;   /* inode of the memfd (checked by importers) */
};

/* Handle bytes of a hostdev allocation (inside kvx_mem_ipc_handle.hip; native byte order). */
struct hd_ipc {
	uint32_t magic;
	uint32_t pid;
	int32_t fd;
	uint32_t pad;
	uint64_t ino;
	uint64_t len;
	uint64_t dev;
};
_Static_assert(sizeof(struct hd_ipc) <= KVX_MEM_IPC_HIP_BYTES, "hostdev handle fits");

/* Process-wide: a pointer from any hostdev context must translate in every other one. */
static pthread_mutex_t g_hd_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hd_alloc g_hd[HD_MAX];
static uint32_t g_hd_n;

/* Index of the allocation containing p (caller holds g_hd_lock), or -1. */
static int hd_index(uintptr_t p)
{
	for (uint32_t i = 0; i < g_hd_n; i++)
		if (p >= g_hd[i].dev && p - g_hd[i].dev < g_hd[i].len)
			return (int)i;
	return -1;
}

/* Read/write view of device range [p, p + len): 0, -EINVAL (not hostdev memory), -ERANGE. */
static int hd_translate(const void *p, size_t len, char **rw)
{
	int rc = -EINVAL;

	pthread_mutex_lock(&g_hd_lock);
	int i = hd_index((uintptr_t)p);
	if (i >= 0) {
		const struct hd_alloc *a = &g_hd[i];
		size_t off = (uintptr_t)p - a->dev;

		rc = len > a->len - off ? -ERANGE : 0;
		if (!rc)
			*rw = a->rw + off;
	}
	pthread_mutex_unlock(&g_hd_lock);
	return rc;
}

static size_t page_round(size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t page = pg > 0 ? (size_t)pg : 4096;

	return (len + page - 1) / page * page;
}

/* Map fd twice and record the allocation; on success the entry owns the mappings. */
static int hd_map(int fd, size_t len, int own_fd, uint64_t ino, uintptr_t *dev_out)
{
	size_t map_len = page_round(len);
	void *d = mmap(NULL, map_len, PROT_NONE, MAP_SHARED, fd, 0);
	void *w;
	int rc = 0;

	if (d == MAP_FAILED)
		return -ENOMEM;
	w = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (w == MAP_FAILED) {
		munmap(d, map_len);
		return -ENOMEM;
	}
	pthread_mutex_lock(&g_hd_lock);
	if (g_hd_n == HD_MAX) {
		rc = -ENOMEM;
	} else {
		g_hd[g_hd_n++] = (struct hd_alloc){.dev = (uintptr_t)d, .rw = w, .len = len,
						   .map_len = map_len, .fd = own_fd, .ino = ino};
	}
	pthread_mutex_unlock(&g_hd_lock);
	if (rc) {
		munmap(d, map_len);
		munmap(w, map_len);
		return rc;
	}
	*dev_out = (uintptr_t)d;
	return 0;
}

/* Remove the allocation starting at dev (own: imported == false); 0 or -EINVAL. */
static int hd_unmap(uintptr_t dev, bool imported)
{
	struct hd_alloc a;
	int i;

	pthread_mutex_lock(&g_hd_lock);
	i = hd_index(dev);
	if (i < 0 || g_hd[i].dev != dev || (g_hd[i].fd < 0) != imported) {
		pthread_mutex_unlock(&g_hd_lock);
		return -EINVAL;
	}
	a = g_hd[i];
	g_hd[i] = g_hd[--g_hd_n];
	pthread_mutex_unlock(&g_hd_lock);
	munmap((void *)a.dev, a.map_len);
	munmap(a.rw, a.map_len);
	if (a.fd >= 0)
		close(a.fd);
	return 0;
}

static int hostdev_probe(int device, char *why, size_t why_len)
{
	if (device != 0) {
		kvx_mem_why(why, why_len, "hostdev (test-only mock) has only device 0, not %d",
			    device);
		return -ENODEV;
	}
	return 0;
}

static int hostdev_alloc(struct kvx_mem *m, size_t len, void **out)
{
	struct stat st;
	uintptr_t dev;
	int fd, rc;

	(void)m;
	fd = memfd_create("kvx-hostdev", MFD_CLOEXEC);
	if (fd < 0)
		return -ENOMEM;
	if (ftruncate(fd, (off_t)page_round(len)) != 0 || fstat(fd, &st) != 0) {
		close(fd);
		return -ENOMEM;
	}
	rc = hd_map(fd, len, fd, (uint64_t)st.st_ino, &dev);
	if (rc) {
		close(fd);
		return rc;
	}
	*out = (void *)dev;
	return 0;
}

static void hostdev_free(struct kvx_mem *m, void *p)
{
	(void)m;
	(void)hd_unmap((uintptr_t)p, false);
}

/* Translate the device side(s) of a copy to read/write views. */
static int hostdev_xlate(void **dst, const void **src, size_t len, enum kvx_mem_copy_dir dir)
{
	char *rw;
	int rc;

	if (dir == KVX_MEM_H2D || dir == KVX_MEM_D2D) {
		rc = hd_translate(*dst, len, &rw);
		if (rc)
			return rc;
		*dst = rw;
	}
	if (dir == KVX_MEM_D2H || dir == KVX_MEM_D2D) {
		rc = hd_translate(*src, len, &rw);
		if (rc)
			return rc;
		*src = rw;
	}
	return 0;
}

static int hostdev_copy_sync(struct kvx_mem *m, void *dst, const void *src, size_t len,
			     enum kvx_mem_copy_dir dir)
{
	int rc = hostdev_xlate(&dst, &src, len, dir);

	if (rc)
		return rc;
	return host_copy_sync(m, dst, src, len, dir);
}

static int hostdev_ptr_query(struct kvx_mem *m, const void *ptr, size_t len,
			     struct kvx_mem_ptr_info *info)
{
	int rc = -EINVAL;

	(void)m;
	pthread_mutex_lock(&g_hd_lock);
	int i = hd_index((uintptr_t)ptr);
	if (i >= 0) {
		const struct hd_alloc *a = &g_hd[i];
		size_t off = (uintptr_t)ptr - a->dev;

		rc = len > a->len - off ? -ERANGE : 0;
		info->kind = KVX_MEM_HOSTDEV;
		info->device = 0;
		info->base = a->dev;
		info->alloc_len = a->len;
		info->offset = off;
	}
	pthread_mutex_unlock(&g_hd_lock);
	return rc;
}

static int hostdev_stream_copy(struct kvx_mem_stream *s, uint32_t slot, void *dst,
			       const void *src, size_t len, enum kvx_mem_copy_dir dir)
{
	int rc = hostdev_xlate(&dst, &src, len, dir);

	if (KVX_UNLIKELY(rc))
		return rc;
	return host_stream_copy(s, slot, dst, src, len, dir);
}

static int hostdev_ipc_get(struct kvx_mem *m, void *base, uint8_t bytes[KVX_MEM_IPC_HIP_BYTES])
{
	struct hd_ipc h = {.magic = HD_MAGIC, .pid = (uint32_t)getpid()};
	int rc = -EINVAL;

	(void)m;
	pthread_mutex_lock(&g_hd_lock);
	int i = hd_index((uintptr_t)base);
	if (i >= 0 && g_hd[i].dev == (uintptr_t)base && g_hd[i].fd >= 0) {
		h.fd = g_hd[i].fd;
		h.ino = g_hd[i].ino;
		h.len = g_hd[i].len;
		h.dev = g_hd[i].dev;
		rc = 0;
	}
	pthread_mutex_unlock(&g_hd_lock);
	if (rc)
		return rc; /* imported mappings are not re-exported (like HIP) */
	memset(bytes, 0, KVX_MEM_IPC_HIP_BYTES);
	memcpy(bytes, &h, sizeof(h));
	return 0;
}

static int hostdev_ipc_open(struct kvx_mem *m, const uint8_t bytes[KVX_MEM_IPC_HIP_BYTES],
			    void **base_out)
{
	struct hd_ipc h;
	struct stat st;
	char path[64];
	uintptr_t dev;
	int fd, rc;

	(void)m;
	memcpy(&h, bytes, sizeof(h));
	if (h.magic != HD_MAGIC || h.pid == 0 || h.fd < 0 || h.len == 0 || h.pad != 0) {
		kvx_log(KVX_LOG_WARN, "mem: hostdev IPC handle rejected: bad magic/pid/fd/len");
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "/proc/%u/fd/%d", h.pid, h.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		rc = errno;
		kvx_log(KVX_LOG_WARN, "mem: hostdev IPC open of %s: %s", path, kvx_strerror(rc));
		return rc == EACCES || rc == EPERM ? -EPERM : -ECONNRESET;
	}
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != h.ino ||
	    (uint64_t)st.st_size < h.len) {
		kvx_log(KVX_LOG_WARN, "mem: hostdev IPC handle of pid %u: %s is not the announced "
			"memfd (inode or size differ)", h.pid, path);
		close(fd);
		return -EIO;
	}
	rc = hd_map(fd, (size_t)h.len, -1, h.ino, &dev);
	close(fd); /* the mappings keep the memfd alive */
	if (rc)
		return rc;
	*base_out = (void *)dev;
	return 0;
}

static int hostdev_ipc_close(struct kvx_mem *m, void *base)
{
	(void)m;
	return hd_unmap((uintptr_t)base, true);
}

/* Host memory has no native events (producers use counter flags). */
static int host_event_query(void *native_event)
{
	(void)native_event;
	return -ENOTSUP;
}

const struct kvx_mem_ops kvx_mem_hostdev_ops = {
	.name = "hostdev",
	.probe = hostdev_probe,
	.alloc = hostdev_alloc,
	.free = hostdev_free,
	.host_alloc = host_alloc,
	.host_free = host_free,
	.copy_sync = hostdev_copy_sync,
	.ptr_query = hostdev_ptr_query,
	.stream_create = host_stream_create,
	.stream_destroy = host_stream_destroy,
	.ipc_get = hostdev_ipc_get,
	.ipc_open = hostdev_ipc_open,
	.ipc_close = hostdev_ipc_close,
	.stream_copy = hostdev_stream_copy,
	.stream_query = host_stream_query,
	.event_query = host_event_query,
};

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
	.event_query = host_event_query,
};
