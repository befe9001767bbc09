/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HIP implementation of the memory ops: the only file that calls HIP. Each call's hipError_t is
 * converted to a negative errno once, in hip_rc(). Built only when libamdhip64 is found
 * (KVX_HAVE_HIP; -D__HIP_PLATFORM_AMD__, linked against amdhip64 without find_package(hip)).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <hip/hip_runtime_api.h>

#include "mem_internal.h"

_Static_assert(sizeof(hipIpcMemHandle_t) == KVX_MEM_IPC_HIP_BYTES, "HIP IPC handle size");

struct hip_stream {
	hipStream_t stream;
	hipEvent_t ev[]; /* one completion event per in-flight slot */
};

static int hip_rc(hipError_t e)
{
	switch (e) {
	case hipSuccess:
		return 0;
	case hipErrorOutOfMemory:
		return -ENOMEM;
	case hipErrorNoDevice:
	case hipErrorInvalidDevice:
		return -ENODEV;
	case hipErrorInvalidValue:
		return -EINVAL;
	case hipErrorNotReady:
		return -EAGAIN;
	default:
		return -EIO;
	}
}

static int hip_set_device(struct kvx_mem *m)
{
	return hip_rc(hipSetDevice(m->type.device));
}

static int hip_probe(int device, char *why, size_t why_len)
{
	int count = 0;
	hipError_t e = hipGetDeviceCount(&count);

	if (e == hipErrorNoDevice || (e == hipSuccess && count == 0)) {
		kvx_mem_why(why, why_len, "no HIP device (hipGetDeviceCount: %s)",
			    hipGetErrorName(e));
		return -ENODEV;
	}
	if (e != hipSuccess) {
		kvx_mem_why(why, why_len, "no HIP device (hipGetDeviceCount failed: %s)",
			    hipGetErrorName(e));
		return -ENODEV;
	}
	if (device >= count) {
		kvx_mem_why(why, why_len, "no HIP device %d (%d present)", device, count);
		return -ENODEV;
	}
	return 0;
}

static int hip_alloc(struct kvx_mem *m, size_t len, void **out)
{
	int rc = hip_set_device(m);

	if (rc)
		return rc;
	return hip_rc(hipMalloc(out, len));
}

static void hip_free(struct kvx_mem *m, void *p)
{
	(void)m;
	(void)hipFree(p);
}

static int hip_host_alloc(struct kvx_mem *m, size_t len, void **out)
{
	int rc = hip_set_device(m);

	if (rc)
		return rc;
	return hip_rc(hipHostMalloc(out, len, hipHostMallocDefault));
}

static void hip_host_free(struct kvx_mem *m, void *p)
{
	(void)m;
	(void)hipHostFree(p);
}

static hipMemcpyKind hip_kind(enum kvx_mem_copy_dir dir)
{
	switch (dir) {
	case KVX_MEM_D2H:
		return hipMemcpyDeviceToHost;
	case KVX_MEM_H2D:
		return hipMemcpyHostToDevice;
	default:
		return hipMemcpyDeviceToDevice;
	}
}

static int hip_copy_sync(struct kvx_mem *m, void *dst, const void *src, size_t len,
			 enum kvx_mem_copy_dir dir)
{
	int rc = hip_set_device(m);

	if (rc)
		return rc;
	return hip_rc(hipMemcpy(dst, src, len, hip_kind(dir)));
}

static int hip_ptr_query(struct kvx_mem *m, const void *ptr, size_t len,
			 struct kvx_mem_ptr_info *info)
{
	hipPointerAttribute_t a;
	hipDeviceptr_t base = NULL;
	size_t size = 0;
	uintptr_t p = (uintptr_t)ptr;
	int rc;

	memset(&a, 0, sizeof(a));
	rc = hip_rc(hipPointerGetAttributes(&a, ptr));
	if (rc)
		return rc == -EIO ? -EIO : -EINVAL;
	if (a.memoryType != hipMemoryTypeDevice || a.device != m->type.device)
		return -EINVAL;
	rc = hip_rc(hipMemGetAddressRange(&base, &size, (hipDeviceptr_t)(uintptr_t)ptr));
	if (rc)
		return rc;
	if (p < (uintptr_t)base || p - (uintptr_t)base > size ||
	    len > size - (p - (uintptr_t)base))
		return -ERANGE;
	info->kind = KVX_MEM_HIP;
	info->device = a.device;
	info->base = (uintptr_t)base;
	info->alloc_len = size;
	info->offset = p - (uintptr_t)base;
	return 0;
}

static void hip_stream_free(struct kvx_mem_stream *s, struct hip_stream *h, uint32_t nev)
{
	for (uint32_t i = 0; i < nev; i++)
		(void)hipEventDestroy(h->ev[i]);
	if (h->stream)
		(void)hipStreamDestroy(h->stream);
	free(h);
	s->impl = NULL;
}

static int hip_stream_create(struct kvx_mem_stream *s)
{
	struct hip_stream *h;
	uint32_t i;
	int rc = hip_set_device(s->m);

	if (rc)
		return rc;
	h = calloc(1, sizeof(*h) + (size_t)s->depth * sizeof(h->ev[0]));
	if (!h)
		return -ENOMEM;
	s->impl = h;
	rc = hip_rc(hipStreamCreateWithFlags(&h->stream, hipStreamNonBlocking));
	if (rc) {
		h->stream = NULL;
		hip_stream_free(s, h, 0);
		return rc;
	}
	for (i = 0; i < s->depth; i++) {
		rc = hip_rc(hipEventCreateWithFlags(&h->ev[i], hipEventDisableTiming));
		if (rc) {
			hip_stream_free(s, h, i);
			return rc;
		}
	}
	return 0;
}

static void hip_stream_destroy(struct kvx_mem_stream *s)
{
	struct hip_stream *h = s->impl;

	/* Slow path (teardown): the copies in flight must finish before their buffers go. */
	(void)hipStreamSynchronize(h->stream);
	hip_stream_free(s, h, s->depth);
}

static int hip_stream_copy(struct kvx_mem_stream *s, uint32_t slot, void *dst, const void *src,
			   size_t len, enum kvx_mem_copy_dir dir)
{
	struct hip_stream *h = s->impl;
	int rc = hip_rc(hipMemcpyAsync(dst, src, len, hip_kind(dir), h->stream));

	if (KVX_UNLIKELY(rc))
		return rc == -EINVAL ? -EINVAL : -EIO;
	rc = hip_rc(hipEventRecord(h->ev[slot], h->stream));
	return KVX_UNLIKELY(rc) ? -EIO : 0;
}

static int hip_event_state(hipEvent_t ev)
{
	int rc = hip_rc(hipEventQuery(ev));

	if (rc == 0)
		return 1;
	if (rc == -EAGAIN)
		return 0;
	return -EIO;
}

static int hip_stream_query(struct kvx_mem_stream *s, uint64_t seq, uint32_t slot)
{
	struct hip_stream *h = s->impl;

	(void)seq;
	return hip_event_state(h->ev[slot]);
}

/* hipEventQuery on a producer's event: 1 ready, 0 not ready, -EIO error. */
static int hip_event_query(void *hip_event)
{
	return hip_event_state((hipEvent_t)hip_event);
}

static int hip_ipc_get(struct kvx_mem *m, void *base, uint8_t bytes[KVX_MEM_IPC_HIP_BYTES])
{
	hipIpcMemHandle_t h;
	int rc = hip_set_device(m);

	if (rc)
		return rc;
	rc = hip_rc(hipIpcGetMemHandle(&h, base));
	if (rc)
		return rc;
	memcpy(bytes, &h, sizeof(h));
	return 0;
}

static int hip_ipc_open(struct kvx_mem *m, const uint8_t bytes[KVX_MEM_IPC_HIP_BYTES],
			void **base_out)
{
	hipIpcMemHandle_t h;
	int rc = hip_set_device(m);

	if (rc)
		return rc;
	memcpy(&h, bytes, sizeof(h));
	rc = hip_rc(hipIpcOpenMemHandle(base_out, h, hipIpcMemLazyEnablePeerAccess));
	return rc == -EINVAL ? -EINVAL : (rc ? -EIO : 0);
}

static int hip_ipc_close(struct kvx_mem *m, void *base)
{
	(void)m;
	return hip_rc(hipIpcCloseMemHandle(base));
}

const struct kvx_mem_ops kvx_mem_hip_ops = {
	.name = "hip",
	.probe = hip_probe,
	.alloc = hip_alloc,
	.free = hip_free,
	.host_alloc = hip_host_alloc,
	.host_free = hip_host_free,
	.copy_sync = hip_copy_sync,
	.ptr_query = hip_ptr_query,
	.stream_create = hip_stream_create,
	.stream_destroy = hip_stream_destroy,
	.ipc_get = hip_ipc_get,
	.ipc_open = hip_ipc_open,
	.ipc_close = hip_ipc_close,
	.stream_copy = hip_stream_copy,
	.stream_query = hip_stream_query,
	.event_query = hip_event_query,
};
