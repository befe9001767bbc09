/* SPDX-License-Identifier: Apache-2.0 */
/* Memory ops dispatch: types, contexts, streams, events, IPC cache, verbs registration plan. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mem_internal.h"

#define MAX_ALLOC_BYTES (1ull << 40)
#define MAX_DEVICE 1023

void kvx_mem_why(char *why, size_t why_len, const char *fmt, ...)
{
	va_list ap;

	if (!why || why_len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
}

int kvx_mem_parse_type(const char *s, struct kvx_mem_type *out)
{
	const char *d;
	char *end;
	long v;

	if (!s || !out)
		return -EINVAL;
	if (strcmp(s, "host") == 0 || strcmp(s, "hostdev") == 0) {
		out->kind = s[4] ? KVX_MEM_HOSTDEV : KVX_MEM_HOST;
		out->device = 0;
		return 0;
	}
	if (strncmp(s, "hip", 3) != 0)
		return -EINVAL;
	if (s[3] == '\0') {
		out->kind = KVX_MEM_HIP;
		out->device = 0;
		return 0;
	}
	if (s[3] != ':')
		return -EINVAL;
	d = s + 4;
	if (*d < '0' || *d > '9')
		return -EINVAL;
	errno = 0;
	v = strtol(d, &end, 10);
	if (errno || *end != '\0' || v < 0 || v > MAX_DEVICE)
		return -EINVAL;
	out->kind = KVX_MEM_HIP;
	out->device = (int)v;
	return 0;
}

const char *kvx_mem_type_str(const struct kvx_mem_type *t, char *buf, size_t len)
{
	if (len == 0)
		return buf;
	if (t->kind == KVX_MEM_HOST)
		snprintf(buf, len, "host");
	else if (t->kind == KVX_MEM_HIP)
		snprintf(buf, len, "hip:%d", t->device);
	else if (t->kind == KVX_MEM_HOSTDEV)
		snprintf(buf, len, "hostdev");
	else
		snprintf(buf, len, "unknown(%d)", (int)t->kind);
	return buf;
}

bool kvx_mem_has_hip(void)
{
#ifdef KVX_HAVE_HIP
	return true;
#else
	return false;
#endif
}

static int ops_for(const struct kvx_mem_type *t, const struct kvx_mem_ops **ops, char *why,
		   size_t why_len)
{
	if (!t) {
		kvx_mem_why(why, why_len, "memory type is NULL");
		return -EINVAL;
	}
	if (t->kind == KVX_MEM_HOST) {
		*ops = &kvx_mem_host_ops;
		return 0;
	}
	if (t->kind == KVX_MEM_HOSTDEV) {
		*ops = &kvx_mem_hostdev_ops;
		return 0;
	}
	if (t->kind != KVX_MEM_HIP) {
		kvx_mem_why(why, why_len, "unknown memory kind %d", (int)t->kind);
		return -EINVAL;
	}
	if (t->device < 0 || t->device > MAX_DEVICE) {
		kvx_mem_why(why, why_len, "HIP device %d out of range 0..%d", t->device, MAX_DEVICE);
		return -EINVAL;
	}
#ifdef KVX_HAVE_HIP
	*ops = &kvx_mem_hip_ops;
	return 0;
#else
	kvx_mem_why(why, why_len, "kvxfer was built without HIP (libamdhip64 not found)");
	return -ENOTSUP;
#endif
}

int kvx_mem_probe(const struct kvx_mem_type *t, char *why, size_t why_len)
{
	const struct kvx_mem_ops *ops = NULL;
	int rc = ops_for(t, &ops, why, why_len);

	if (rc)
		return rc;
	return ops->probe(t->device, why, why_len);
}

int kvx_mem_open(const struct kvx_mem_type *t, struct kvx_mem **out)
{
	char why[KVX_MEM_WHY_LEN] = "";
	char name[32];
	struct kvx_mem *m;
	int rc;

	if (!t || !out)
		return -EINVAL;
	rc = kvx_mem_probe(t, why, sizeof(why));
	if (rc) {
		kvx_log(KVX_LOG_ERROR, "mem: cannot open %s: %s",
			kvx_mem_type_str(t, name, sizeof(name)), why);
		return rc;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->type = *t;
	if (ops_for(t, &m->ops, NULL, 0)) {
		free(m);
		return -EINVAL;
	}
	*out = m;
	return 0;
}

void kvx_mem_close(struct kvx_mem *m)
{
	free(m);
}

struct kvx_mem_type kvx_mem_get_type(const struct kvx_mem *m)
{
	return m->type;
}

int kvx_mem_alloc(struct kvx_mem *m, size_t len, void **out)
{
	if (!m || !out || len == 0 || len > MAX_ALLOC_BYTES)
		return -EINVAL;
	return m->ops->alloc(m, len, out);
}

void kvx_mem_free(struct kvx_mem *m, void *p)
{
	if (p)
		m->ops->free(m, p);
}

int kvx_mem_host_alloc(struct kvx_mem *m, size_t len, void **out)
{
	if (!m || !out || len == 0 || len > MAX_ALLOC_BYTES)
		return -EINVAL;
	return m->ops->host_alloc(m, len, out);
}

void kvx_mem_host_free(struct kvx_mem *m, void *p)
{
	if (p)
		m->ops->host_free(m, p);
}

static bool dir_ok(enum kvx_mem_copy_dir dir)
{
	return dir == KVX_MEM_D2H || dir == KVX_MEM_H2D || dir == KVX_MEM_D2D;
}

int kvx_mem_copy_sync(struct kvx_mem *m, void *dst, const void *src, size_t len,
		      enum kvx_mem_copy_dir dir)
{
	if (!m || !dir_ok(dir))
		return -EINVAL;
	if (len == 0)
		return 0;
	if (!dst || !src)
		return -EINVAL;
	return m->ops->copy_sync(m, dst, src, len, dir);
}

int kvx_mem_ptr_query(struct kvx_mem *m, const void *ptr, size_t len,
		      struct kvx_mem_ptr_info *info)
{
	if (!m || !ptr || len == 0 || !info || (uintptr_t)ptr > UINTPTR_MAX - len)
		return -EINVAL;
	return m->ops->ptr_query(m, ptr, len, info);
}

static pthread_once_t g_kinds_once = PTHREAD_ONCE_INIT;
static uint32_t g_kinds;

static void kinds_probe(void)
{
	uint32_t k = (1u << KVX_MEM_HOST) | (1u << KVX_MEM_HOSTDEV);
#ifdef KVX_HAVE_HIP
	struct kvx_mem_type hip = {.kind = KVX_MEM_HIP, .device = 0};

	if (access("/dev/kfd", F_OK) == 0 && kvx_mem_probe(&hip, NULL, 0) == 0)
		k |= 1u << KVX_MEM_HIP;
#endif
	g_kinds = k;
}

uint32_t kvx_mem_usable_kinds(void)
{
	pthread_once(&g_kinds_once, kinds_probe);
	return g_kinds;
}

int kvx_mem_domain_get(struct kvx_mem **mp, const struct kvx_mem_type *t, const char *who)
{
	char a[32], b[32];
	int rc;

	if (*mp) {
		if ((*mp)->type.kind == t->kind && (*mp)->type.device == t->device)
			return 0;
		kvx_log(KVX_LOG_ERROR, "%s: device memory %s refused: this context already moves %s "
			"(one device memory type per context)", who, kvx_mem_type_str(t, a, sizeof(a)),
			kvx_mem_type_str(&(*mp)->type, b, sizeof(b)));
		return -ENOTSUP;
	}
	rc = kvx_mem_open(t, mp);
	if (rc)
		kvx_log(KVX_LOG_ERROR, "%s: cannot open device memory %s: %s", who,
			kvx_mem_type_str(t, a, sizeof(a)), kvx_strerror(rc));
	return rc;
}

/* ------------------------------------------------------------------ streams */

int kvx_mem_stream_create(struct kvx_mem *m, const struct kvx_mem_stream_params *p,
			  struct kvx_mem_stream **out)
{
	struct kvx_mem_stream *s;
	uint32_t depth = p && p->depth ? p->depth : KVX_MEM_STREAM_DEFAULT_DEPTH;
	size_t step = p && p->host_step_bytes ? p->host_step_bytes : KVX_MEM_HOST_DEFAULT_STEP_BYTES;
	int rc;

	if (!m || !out || depth > 4096)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->m = m;
	s->ops = m->ops;
	s->depth = depth;
	s->host_step_bytes = step;
	rc = s->ops->stream_create(s);
	if (rc) {
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

void kvx_mem_stream_destroy(struct kvx_mem_stream *s)
{
	if (!s)
		return;
	s->ops->stream_destroy(s);
	free(s);
}

uint32_t kvx_mem_stream_inflight(const struct kvx_mem_stream *s)
{
	return (uint32_t)(s->issued - s->done);
}

/* 1 if copy `seq` finished; advances s->done (copies on a stream finish in order). */
static int stream_seq_query(struct kvx_mem_stream *s, uint64_t seq)
{
	int rc;

	if (seq < s->done)
		return 1;
	if (KVX_UNLIKELY(seq >= s->issued))
		return -EINVAL;
	rc = s->ops->stream_query(s, seq, (uint32_t)(seq % s->depth));
	if (rc == 1)
		s->done = seq + 1;
	return rc;
}

int kvx_mem_copy_async(struct kvx_mem_stream *s, void *dst, const void *src, size_t len,
		       enum kvx_mem_copy_dir dir, struct kvx_mem_event *done)
{
	uint64_t seq;
	int rc;

	if (KVX_UNLIKELY(!s || !dst || !src || len == 0 || !dir_ok(dir)))
		return -EINVAL;
	if (s->issued - s->done >= s->depth) {
		/* Full: retire the oldest copy if it finished (its slot is the one we need). */
		rc = stream_seq_query(s, s->done);
		if (rc < 0)
			return rc;
		if (rc == 0)
			return -ENOBUFS;
	}
	seq = s->issued;
	rc = s->ops->stream_copy(s, (uint32_t)(seq % s->depth), dst, src, len, dir);
	if (KVX_UNLIKELY(rc))
		return rc;
	s->issued = seq + 1;
	if (done) {
		done->kind = KVX_MEM_EVENT_STREAM;
		done->pad = 0;
		done->u.stream = s;
		done->value = seq;
	}
	return 0;
}

/* ------------------------------------------------------------------ events */

void kvx_mem_event_init_flag(struct kvx_mem_event *ev, const _Atomic uint64_t *counter,
			     uint64_t threshold)
{
	ev->kind = KVX_MEM_EVENT_FLAG;
	ev->pad = 0;
	ev->u.counter = counter;
	ev->value = threshold;
}

int kvx_mem_event_init_hip(struct kvx_mem_event *ev, void *hip_event)
{
	if (!ev || !hip_event)
		return -EINVAL;
#ifdef KVX_HAVE_HIP
	ev->kind = KVX_MEM_EVENT_HIP;
	ev->pad = 0;
	ev->u.hip_event = hip_event;
	ev->value = 0;
	return 0;
#else
	return -ENOTSUP;
#endif
}

void kvx_mem_event_init_ready(struct kvx_mem_event *ev)
{
	memset(ev, 0, sizeof(*ev));
}

/* The memory ops whose native events KVX_MEM_EVENT_HIP wraps, or NULL when not built. */
static const struct kvx_mem_ops *const native_event_ops =
#ifdef KVX_HAVE_HIP
	&kvx_mem_hip_ops;
#else
	NULL;
#endif

int kvx_mem_event_query(const struct kvx_mem_event *ev)
{
	switch (ev->kind) {
	case KVX_MEM_EVENT_READY:
		return 1;
	case KVX_MEM_EVENT_FLAG:
		/* A1: pairs with the producer's release store/fetch_add on the counter. */
		return atomic_load_explicit(ev->u.counter, memory_order_acquire) >= ev->value;
	case KVX_MEM_EVENT_STREAM:
		return stream_seq_query(ev->u.stream, ev->value);
	case KVX_MEM_EVENT_HIP:
		/* Through the ops of the memory kind that owns such events; an event of a kind not
		 * built in cannot be made (kvx_mem_event_init_hip() refuses it): invalid. */
		return native_event_ops ? native_event_ops->event_query(ev->u.hip_event) : -EINVAL;
	default:
		return -EINVAL;
	}
}

/* ------------------------------------------------------------------ IPC */

int kvx_mem_ipc_export(struct kvx_mem *m, const void *ptr, size_t len,
		       struct kvx_mem_ipc_handle *out)
{
	struct kvx_mem_ptr_info info;
	int rc;

	if (!m || !ptr || len == 0 || !out)
		return -EINVAL;
	rc = kvx_mem_ptr_query(m, ptr, len, &info);
	if (rc)
		return rc;
	memset(out, 0, sizeof(*out));
	out->kind = (uint32_t)m->type.kind;
	out->device = m->type.device;
	out->pid = (uint32_t)getpid();
	out->base = (uint64_t)info.base;
	out->alloc_len = info.alloc_len;
	out->offset = info.offset;
	out->len = len;
	if (kvx_mem_kind_is_device(m->type.kind))
		return m->ops->ipc_get(m, (void *)info.base, out->hip);
	return 0;
}

struct ipc_entry {
	bool used;
	uint32_t kind;
	int32_t device;
	uint32_t pid;
	uint64_t base;
	uint64_t alloc_len;
	uint8_t hip[KVX_MEM_IPC_HIP_BYTES];
	uint32_t refs;
	void *local_base; /* device kinds: the opened mapping (hipIpcOpenMemHandle); host: NULL */
};

struct kvx_mem_ipc_cache {
	struct kvx_mem *m;
	uint32_t capacity;
	uint32_t entries;
	uint64_t opens;
	uint64_t closes;
	struct ipc_entry e[];
};

int kvx_mem_ipc_cache_create(struct kvx_mem *m, uint32_t capacity,
			     struct kvx_mem_ipc_cache **out)
{
	struct kvx_mem_ipc_cache *c;

	if (!m || !out || capacity == 0 || capacity > 65536)
		return -EINVAL;
	c = calloc(1, sizeof(*c) + (size_t)capacity * sizeof(c->e[0]));
	if (!c)
		return -ENOMEM;
	c->m = m;
	c->capacity = capacity;
	*out = c;
	return 0;
}

static void ipc_entry_close(struct kvx_mem_ipc_cache *c, struct ipc_entry *e)
{
	int rc;

	if (kvx_mem_kind_is_device(e->kind)) {
		rc = c->m->ops->ipc_close(c->m, e->local_base);
		if (rc)
			kvx_log(KVX_LOG_WARN, "mem: closing the IPC mapping of pid %u failed: %s",
				e->pid, kvx_strerror(rc));
	}
	c->closes++;
	c->entries--;
	memset(e, 0, sizeof(*e));
}

void kvx_mem_ipc_cache_destroy(struct kvx_mem_ipc_cache *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < c->capacity; i++)
		if (c->e[i].used)
			ipc_entry_close(c, &c->e[i]);
	free(c);
}

static bool all_zero(const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

static int ipc_validate(const struct kvx_mem_ipc_cache *c, const struct kvx_mem_ipc_handle *h)
{
	const char *bad = NULL;

	if (h->kind != KVX_MEM_HOST && !kvx_mem_kind_is_device(h->kind))
		bad = "kind";
	else if (h->kind != (uint32_t)c->m->type.kind)
		bad = "kind (does not match the cache's memory type)";
	else if (h->pid == 0 || h->pid > INT_MAX)
		bad = "pid";
	else if (h->reserved != 0)
		bad = "reserved";
	else if (h->len == 0)
		bad = "len";
	else if (h->alloc_len == 0 || h->base == 0 || h->base > UINT64_MAX - h->alloc_len)
		bad = "base/alloc_len";
	else if (h->offset > h->alloc_len || h->len > h->alloc_len - h->offset)
		bad = "offset/len (outside the allocation)";
	else if (h->kind == KVX_MEM_HOST && (h->device != 0 || !all_zero(h->hip, sizeof(h->hip))))
		bad = "device/hip (must be zero for host memory)";
	else if (h->kind == KVX_MEM_HIP && h->device < 0)
		bad = "device";
	else if (h->kind == KVX_MEM_HOSTDEV && h->device != 0)
		bad = "device (hostdev has only device 0)";
	if (bad) {
		kvx_log(KVX_LOG_WARN, "mem: rejected IPC handle from pid %u: bad field %s", h->pid,
			bad);
		return -EINVAL;
	}
	return 0;
}

int kvx_mem_ipc_cache_open(struct kvx_mem_ipc_cache *c, const struct kvx_mem_ipc_handle *h,
			   struct kvx_mem_ipc_map *out)
{
	struct ipc_entry *e = NULL, *slot = NULL;
	uint32_t idx = 0;
	int rc;

	if (!c || !h || !out)
		return -EINVAL;
	rc = ipc_validate(c, h);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < c->capacity; i++) {
		struct ipc_entry *x = &c->e[i];

		if (!x->used) {
			if (!slot) {
				slot = x;
				idx = i;
			}
			continue;
		}
		if (x->kind == h->kind && x->device == h->device && x->pid == h->pid &&
		    x->base == h->base) {
			e = x;
			idx = i;
			break;
		}
	}
	if (e) {
		if (e->alloc_len != h->alloc_len || memcmp(e->hip, h->hip, sizeof(e->hip)) != 0) {
			kvx_log(KVX_LOG_WARN,
				"mem: IPC handle from pid %u for base 0x%llx conflicts with the "
				"open one (alloc_len %llu vs %llu or different HIP handle)",
				h->pid, (unsigned long long)h->base,
				(unsigned long long)h->alloc_len, (unsigned long long)e->alloc_len);
			return -EEXIST;
		}
		if (e->refs == UINT32_MAX)
			return -ENOBUFS;
		e->refs++;
	} else {
		if (!slot)
			return -ENOBUFS;
		e = slot;
		e->local_base = NULL;
		if (kvx_mem_kind_is_device(h->kind)) {
			rc = c->m->ops->ipc_open(c->m, h->hip, &e->local_base);
			if (rc) {
				kvx_log(KVX_LOG_ERROR, "mem: opening the %s IPC handle of pid %u: %s",
					c->m->ops->name, h->pid, kvx_strerror(rc));
				return rc;
			}
		}
		e->used = true;
		e->kind = h->kind;
		e->device = h->device;
		e->pid = h->pid;
		e->base = h->base;
		e->alloc_len = h->alloc_len;
		memcpy(e->hip, h->hip, sizeof(e->hip));
		e->refs = 1;
		c->entries++;
		c->opens++;
	}
	out->kind = (enum kvx_mem_kind)h->kind;
	out->pid = h->pid;
	out->ptr = e->local_base ? (char *)e->local_base + h->offset : NULL;
	out->remote_addr = h->base + h->offset;
	out->len = h->len;
	out->entry = idx;
	return 0;
}

int kvx_mem_ipc_cache_close(struct kvx_mem_ipc_cache *c, const struct kvx_mem_ipc_map *map)
{
	struct ipc_entry *e;

	if (!c || !map)
		return -EINVAL;
	if (map->entry >= c->capacity)
		return -ENOENT;
	e = &c->e[map->entry];
	if (!e->used || e->pid != map->pid || e->kind != (uint32_t)map->kind ||
	    map->remote_addr < e->base || map->remote_addr - e->base > e->alloc_len)
		return -ENOENT;
	if (--e->refs == 0)
		ipc_entry_close(c, e);
	return 0;
}

int kvx_mem_ipc_cache_ptr(const struct kvx_mem_ipc_cache *c, uint32_t entry,
			  uint64_t remote_addr, uint64_t len, void **ptr)
{
	const struct ipc_entry *e;

	if (entry >= c->capacity || !c->e[entry].used || !c->e[entry].local_base)
		return -ENOENT;
	e = &c->e[entry];
	if (remote_addr < e->base || remote_addr - e->base > e->alloc_len ||
	    len > e->alloc_len - (remote_addr - e->base))
		return -ERANGE;
	*ptr = (char *)e->local_base + (remote_addr - e->base);
	return 0;
}

void kvx_mem_ipc_cache_stats(const struct kvx_mem_ipc_cache *c, uint32_t *entries,
			     uint64_t *opens, uint64_t *closes)
{
	if (entries)
		*entries = c->entries;
	if (opens)
		*opens = c->opens;
	if (closes)
		*closes = c->closes;
}

/* ------------------------------------------------------------------ verbs registration */

typedef int (*hsa_export_dmabuf_fn)(const void *ptr, size_t size, int *fd, uint64_t *offset);
typedef int (*hsa_close_dmabuf_fn)(int fd);

static pthread_once_t g_dmabuf_once = PTHREAD_ONCE_INIT;
static hsa_export_dmabuf_fn g_export_dmabuf;
static hsa_close_dmabuf_fn g_close_dmabuf;
static char g_dmabuf_why[KVX_MEM_WHY_LEN];

#define HSA_LIB "libhsa-runtime64.so.1"

static void dmabuf_lookup(void)
{
	void *h = dlopen(HSA_LIB, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		kvx_mem_why(g_dmabuf_why, sizeof(g_dmabuf_why), "%s not loadable (%s)", HSA_LIB,
			    dlerror());
		return;
	}
	/* The handle stays open for the process lifetime: the symbols are cached below. */
	*(void **)&g_export_dmabuf = dlsym(h, "hsa_amd_portable_export_dmabuf");
	*(void **)&g_close_dmabuf = dlsym(h, "hsa_amd_portable_close_dmabuf");
	if (!g_export_dmabuf)
		kvx_mem_why(g_dmabuf_why, sizeof(g_dmabuf_why),
			    "hsa_amd_portable_export_dmabuf not available in this ROCm (%s lacks "
			    "it; ROCm >= 5.4 exports dma-bufs, Debian 12 ships 5.2)",
			    HSA_LIB);
}

bool kvx_mem_dmabuf_available(char *why, size_t why_len)
{
	pthread_once(&g_dmabuf_once, dmabuf_lookup);
	if (!g_export_dmabuf) {
		kvx_mem_why(why, why_len, "%s", g_dmabuf_why);
		return false;
	}
	return true;
}

bool kvx_mem_peer_memory_present(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	bool found = false;

	if (!d)
		return false;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] != '.') {
			found = true;
			break;
		}
	}
	closedir(d);
	return found;
}

int kvx_mem_reg_decide(enum kvx_mem_kind kind, bool dmabuf_export, bool peer_memory,
		       const char *dmabuf_why, char *why, size_t why_len)
{
	if (kind == KVX_MEM_HOST)
		return KVX_MEM_REG_HOST;
	if (kind == KVX_MEM_HOSTDEV) {
		kvx_mem_why(why, why_len, "hostdev (host-emulated device memory, test-only) cannot "
			    "be registered with an RDMA device; use tcp or shm");
		return -ENOTSUP;
	}
	if (kind != KVX_MEM_HIP) {
		kvx_mem_why(why, why_len, "unknown memory kind %d", (int)kind);
		return -EINVAL;
	}
	if (dmabuf_export)
		return KVX_MEM_REG_DMABUF;
	if (peer_memory)
		return KVX_MEM_REG_PEERMEM;
	kvx_mem_why(why, why_len,
		    "cannot register HIP device memory: no dma-buf export (%s) and no peer-memory "
		    "kernel client (%s has no entry)",
		    dmabuf_why && dmabuf_why[0] ? dmabuf_why : "hsa_amd_portable_export_dmabuf missing",
		    KVX_MEM_PEER_MEMORY_DIR);
	return -ENOTSUP;
}

int kvx_mem_reg_plan(struct kvx_mem *m, const void *ptr, size_t len,
		     struct kvx_mem_reg_plan *out, char *why, size_t why_len)
{
	char dwhy[KVX_MEM_WHY_LEN] = "";
	struct kvx_mem_ptr_info info;
	bool dmabuf, peer;
	uint64_t off = 0;
	int fd = -1, rc, method;

	if (!m || !ptr || len == 0 || !out) {
		kvx_mem_why(why, why_len, "bad argument (NULL context/pointer/plan or len 0)");
		return -EINVAL;
	}
	out->method = KVX_MEM_REG_HOST;
	out->dmabuf_fd = -1;
	out->dmabuf_offset = 0;
	if (m->type.kind == KVX_MEM_HOST)
		return 0;
	rc = kvx_mem_ptr_query(m, ptr, len, &info);
	if (rc) {
		kvx_mem_why(why, why_len, "pointer %p (+%zu bytes) is not HIP memory of device %d: %s",
			    ptr, len, m->type.device, kvx_strerror(rc));
		return rc;
	}
	dmabuf = kvx_mem_dmabuf_available(dwhy, sizeof(dwhy));
	peer = !dmabuf && kvx_mem_peer_memory_present(KVX_MEM_PEER_MEMORY_DIR);
	method = kvx_mem_reg_decide(m->type.kind, dmabuf, peer, dwhy, why, why_len);
	if (method < 0)
		return method;
	if (method == KVX_MEM_REG_DMABUF) {
		/* HSA status 0 is HSA_STATUS_SUCCESS; the offset is ptr's place in the dma-buf. */
		rc = g_export_dmabuf(ptr, len, &fd, &off);
		if (rc != 0 || fd < 0) {
			kvx_mem_why(why, why_len, "hsa_amd_portable_export_dmabuf(%p, %zu) failed: "
				    "hsa_status 0x%x", ptr, len, (unsigned)rc);
			return -EIO;
		}
		out->dmabuf_fd = fd;
		out->dmabuf_offset = off;
	}
	out->method = (enum kvx_mem_reg_method)method;
	return 0;
}

int kvx_mem_reg_plan_by_type(const struct kvx_mem_type *t, const void *ptr, size_t len,
			     struct kvx_mem_reg_plan *out, char *why, size_t why_len)
{
	struct kvx_mem *m = NULL;
	int rc;

	if (!t || !ptr || len == 0 || !out) {
		kvx_mem_why(why, why_len, "bad argument (NULL type/pointer/plan or len 0)");
		return -EINVAL;
	}
	rc = kvx_mem_probe(t, why, why_len);
	if (rc)
		return rc;
	rc = kvx_mem_open(t, &m);
	if (rc) {
		kvx_mem_why(why, why_len, "opening the memory context: %s", kvx_strerror(rc));
		return rc;
	}
	rc = kvx_mem_reg_plan(m, ptr, len, out, why, why_len);
	kvx_mem_close(m);
	return rc;
}

void kvx_mem_reg_plan_fini(struct kvx_mem_reg_plan *plan)
{
	if (plan->dmabuf_fd >= 0) {
		if (g_close_dmabuf)
			g_close_dmabuf(plan->dmabuf_fd);
		else
			close(plan->dmabuf_fd);
	}
	plan->dmabuf_fd = -1;
}

/* ------------------------------------------------------------------ perf/test buffers */

int kvx_mem_buf_init(const char *mem_arg, size_t len, struct kvx_mem_buf *out, char *why,
		     size_t why_len)
{
	char reason[KVX_MEM_WHY_LEN] = "";
	struct kvx_mem_type t;
	void *zero = NULL;
	int rc;

	if (!out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (!mem_arg || kvx_mem_parse_type(mem_arg, &t) != 0) {
		kvx_mem_why(why, why_len, "--mem '%s': expected host, hip, hip:<DEVICE> or hostdev",
			    mem_arg ? mem_arg : "(null)");
		return -EINVAL;
	}
	if (len == 0 || len > MAX_ALLOC_BYTES) {
		kvx_mem_why(why, why_len, "--mem %s: buffer length %zu out of range 1..2^40",
			    mem_arg, len);
		return -EINVAL;
	}
	rc = kvx_mem_probe(&t, reason, sizeof(reason));
	if (rc == 0)
		rc = kvx_mem_open(&t, &out->mem);
	if (rc == 0)
		rc = kvx_mem_alloc(out->mem, len, &out->ptr);
	if (rc == 0) {
		/* Zero through a host buffer so HIP memory starts in a known state too. */
		rc = kvx_mem_host_alloc(out->mem, len, &zero);
		if (rc == 0) {
			memset(zero, 0, len);
			rc = kvx_mem_copy_sync(out->mem, out->ptr, zero, len, KVX_MEM_H2D);
			kvx_mem_host_free(out->mem, zero);
		}
	}
	if (rc) {
		if (!reason[0])
			snprintf(reason, sizeof(reason), "allocating %zu bytes: %s", len,
				 kvx_strerror(rc));
		kvx_mem_why(why, why_len, "--mem %s: %s", mem_arg, reason);
		kvx_mem_buf_fini(out);
		return rc;
	}
	out->len = len;
	out->type = t;
	return 0;
}

void kvx_mem_buf_fini(struct kvx_mem_buf *b)
{
	if (b->mem) {
		kvx_mem_free(b->mem, b->ptr);
		kvx_mem_close(b->mem);
	}
	memset(b, 0, sizeof(*b));
}
