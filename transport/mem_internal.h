/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_MEM_INTERNAL_H
#define KVX_MEM_INTERNAL_H
/*
 * Private to transport/: the memory-ops table behind include/kvxfer/mem.h. One table per
 * implementation: host and the hostdev mock (mem_host.c, always) and HIP (hip/mem_hip.c, only
 * with KVX_HAVE_HIP).
 * Every op returns 0/1 or a negative errno; HIP error codes are converted in mem_hip.c only.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer/mem.h"

struct kvx_mem_ops {
	const char *name;
	/* Slow path. */
	int (*probe)(int device, char *why, size_t why_len);
	int (*alloc)(struct kvx_mem *m, size_t len, void **out);
	void (*free)(struct kvx_mem *m, void *p);
	int (*host_alloc)(struct kvx_mem *m, size_t len, void **out);
	void (*host_free)(struct kvx_mem *m, void *p);
	int (*copy_sync)(struct kvx_mem *m, void *dst, const void *src, size_t len,
			 enum kvx_mem_copy_dir dir);
	int (*ptr_query)(struct kvx_mem *m, const void *ptr, size_t len,
			 struct kvx_mem_ptr_info *info);
	int (*stream_create)(struct kvx_mem_stream *s);
	void (*stream_destroy)(struct kvx_mem_stream *s); /* waits for copies in flight */
	int (*ipc_get)(struct kvx_mem *m, void *base, uint8_t bytes[KVX_MEM_IPC_HIP_BYTES]);
	int (*ipc_open)(struct kvx_mem *m, const uint8_t bytes[KVX_MEM_IPC_HIP_BYTES],
			void **base_out);
	int (*ipc_close)(struct kvx_mem *m, void *base);
	/* Hot path: issue a copy and its completion marker in slot `slot` (seq % depth). */
	int (*stream_copy)(struct kvx_mem_stream *s, uint32_t slot, void *dst, const void *src,
			   size_t len, enum kvx_mem_copy_dir dir);
	/* Hot path: 1 if copy `seq` (slot `slot`) finished, 0 if not, -EIO on error. */
	int (*stream_query)(struct kvx_mem_stream *s, uint64_t seq, uint32_t slot);
	/* Hot path: a producer's native event of this memory kind (HIP: a hipEvent_t): 1 ready,
	 * 0 not ready, -EIO on error; -ENOTSUP for kinds without native events (host, hostdev). */
	int (*event_query)(void *native_event);
};

struct kvx_mem {
	struct kvx_mem_type type;
	const struct kvx_mem_ops *ops;
};

struct kvx_mem_stream {
	struct kvx_mem *m;
	const struct kvx_mem_ops *ops;
	uint32_t depth;
	size_t host_step_bytes;
	uint64_t issued; /* copies started (next sequence number) */
	uint64_t done;   /* every copy with seq < done is known finished */
	void *impl;      /* implementation state (host op queue, HIP stream + events) */
};

extern const struct kvx_mem_ops kvx_mem_host_ops;
/* Test-only mock of device memory (KVX_MEM_HOSTDEV), in mem_host.c. */
extern const struct kvx_mem_ops kvx_mem_hostdev_ops;

/* Whether memory of this kind is device memory (HIP or the hostdev mock): never touched by CPU
 * loads/stores or CMA, only through kvx_mem copies. */
static inline bool kvx_mem_kind_is_device(uint32_t kind)
{
	return kind == KVX_MEM_HIP || kind == KVX_MEM_HOSTDEV;
}

/*
 * Bit mask (1u << enum kvx_mem_kind) of the kinds a provider can move here: host and the
 * hostdev mock always; HIP only when built with HIP, /dev/kfd exists and kvx_mem_probe() finds
 * device 0 (probed once per process, so contexts that never see HIP memory do not pay for a
 * HIP runtime start on machines without an AMD GPU). The kinds equal the values of enum
 * kvx_xport_mem_type.
 */
uint32_t kvx_mem_usable_kinds(void);

/*
 * The device-memory domain of a provider context: open *mp for type t on first use, or check
 * that the open one has type t (one device memory type per context). Logs the reason naming
 * @p who. 0, -ENOTSUP (another device type in use), or a kvx_mem_open() error.
 */
int kvx_mem_domain_get(struct kvx_mem **mp, const struct kvx_mem_type *t, const char *who);

/*
 * Local device pointer for [remote_addr, remote_addr + len) of an open cache entry (the
 * shm provider keeps the entry index, not the pointer). 0, or -ENOENT (no such open entry) /
 * -ERANGE (range outside the entry's allocation).
 */
int kvx_mem_ipc_cache_ptr(const struct kvx_mem_ipc_cache *c, uint32_t entry,
			  uint64_t remote_addr, uint64_t len, void **ptr);
#ifdef KVX_HAVE_HIP
extern const struct kvx_mem_ops kvx_mem_hip_ops;
#endif

/* Write a reason into why (if non-NULL), printf-style. */
void kvx_mem_why(char *why, size_t why_len, const char *fmt, ...) KVX_PRINTF(3, 4);

/*
 * The verbs registration decision for device memory, given what the machine offers (pure; the
 * probes are in kvx_mem_reg_plan()). Returns the method or -ENOTSUP with why naming what is
 * missing.
 */
int kvx_mem_reg_decide(enum kvx_mem_kind kind, bool dmabuf_export, bool peer_memory,
		       const char *dmabuf_why, char *why, size_t why_len);

/* Whether a peer-memory client is registered (a directory entry under `dir`). */
bool kvx_mem_peer_memory_present(const char *dir);

/* Where rdma peer-memory clients appear (MLNX_OFED peer_mem, amdgpu "peer direct"). */
#define KVX_MEM_PEER_MEMORY_DIR "/sys/kernel/mm/memory_peers"

#endif /* KVX_MEM_INTERNAL_H */
