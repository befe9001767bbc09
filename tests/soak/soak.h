/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_SOAK_H
#define KVX_SOAK_H
/**
 * @file
 * kvx-soak: the fault soak of issue 14. Process model:
 * - the **driver** (the process the user starts) owns the request stream, the seeded fault
 *   schedule and the books: every transfer's state on both sides, the verdicts, the summary;
 * - a **producer** and a **consumer** role process (`--role producer|consumer`), each owning a
 *   kvxfer engine (include/kvxfer/engine.h only) and a KV block pool with a block-id allocator;
 * - optionally two **notify proxies** (`--role proxy`): a ZMQ ROUTER that forwards each
 *   notification to the real notify port through a DEALER and drops or duplicates one frame
 *   when the driver tells it to. Each engine is given its peer's proxy port as the peer's
 *   notify port, so every notification of both directions crosses a proxy.
 * Roles and proxies talk to the driver over an inherited socketpair (fd given by --ctl-fd) with
 * the messages below: a struct soak_hdr, then `len` payload bytes, host byte order (same
 * build on both ends). Nothing here is used by the library: the soak is a test program.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Block geometry of both pools: split K/V [2, NB, SOAK_BS, SOAK_HEADS, SOAK_HD], 2-byte elements. */
#define SOAK_LAYERS 4u
#define SOAK_BS 16u
#define SOAK_HEADS 2u
#define SOAK_HD 32u
#define SOAK_ELEM 2u
/** Bytes of one block of one plane (K or V) of one layer. */
#define SOAK_BLOCK_BYTES (SOAK_BS * SOAK_HEADS * SOAK_HD * SOAK_ELEM)
/** Pattern "request" of a free consumer block: any write into a free block breaks it. */
#define SOAK_POISON_REQ UINT64_MAX
/** Exit code of a role whose engine could not bind its fixed ports (the driver retries). */
#define SOAK_EXIT_ADDRINUSE 75

/** Message types of the driver channel. */
enum soak_msg {
	SOAK_HELLO = 1,     /**< role -> driver: engine up (struct soak_hello). */
	SOAK_PEER = 2,      /**< driver -> role: the other engine (struct soak_peer). */
	SOAK_REQ = 3,       /**< driver -> role: a request (struct soak_req + remote ids). */
	SOAK_SERVED = 4,    /**< producer -> driver, READ: served ids (struct soak_req + ids). */
	SOAK_SUBMITTED = 5, /**< role -> driver: handed to the engine (struct soak_idx). */
	SOAK_TERM = 6,      /**< role -> driver: terminal completion (struct soak_term). */
	SOAK_FREED = 7,     /**< role -> driver: the request's blocks are back in the pool (struct soak_idx). */
	SOAK_FOREIGN = 8,   /**< consumer -> driver: bytes changed in a free block (text). */
	SOAK_ABORT = 9,     /**< driver -> role: kvx_xfer_abort() this request (struct soak_idx). */
	SOAK_STATS_REQ = 10, /**< driver -> role/proxy: report counters. */
	SOAK_STATS = 11,    /**< role -> driver (struct soak_stats); proxy -> driver (struct soak_proxy_stats). */
	SOAK_QUIT = 12,     /**< driver -> role/proxy: exit. */
	SOAK_DROP = 13,     /**< driver -> proxy: drop the next notification. */
	SOAK_DUP = 14,      /**< driver -> proxy: forward the next notification twice. */
	SOAK_FATAL = 15,    /**< role -> driver: cannot continue (text). */
};

/** Header of every driver-channel message. */
struct soak_hdr {
	uint32_t type; /**< enum soak_msg. */
	uint32_t len;  /**< Payload bytes that follow, <= SOAK_MSG_MAX. */
};
#define SOAK_MSG_MAX (1u << 20)

struct soak_hello {
	uint16_t hs_port, nt_port; /**< Bound engine ports (proxy: nt_port = its ROUTER port). */
	int32_t pid;
	char transport[16];        /**< Provider in use. */
};

struct soak_peer {
	char host[64];
	uint16_t hs_port, nt_port; /**< nt_port: the peer's proxy when notifications are proxied. */
};

/** REQ / SERVED header; followed by n uint32_t block ids (READ consumer: the producer's ids). */
struct soak_req {
	uint64_t idx;    /**< Request index: transfer id "soak-<idx>", pattern request. */
	uint32_t blocks; /**< Blocks of the request, >= 1. */
	uint32_t n;      /**< Ids that follow. */
};

struct soak_idx {
	uint64_t idx;
	uint64_t t_ns; /**< Sender's CLOCK_MONOTONIC at the event (SUBMITTED: the submission), ns. */
};

/** Verification verdict of a DONE transfer on the consumer. */
enum soak_verify { SOAK_V_NONE = 0, SOAK_V_OK = 1, SOAK_V_BAD = 2 };

struct soak_term {
	uint64_t idx;
	int32_t status;  /**< enum kvx_cpl_status, or -1: rejected at submission (error says why). */
	int32_t error;   /**< Completion's error (negative errno) or the submission's. */
	uint64_t bytes;
	uint32_t verify; /**< enum soak_verify. */
	uint32_t bad_planes;
	uint64_t t_ns;   /**< Role's CLOCK_MONOTONIC when it polled the completion, ns. */
	uint64_t eng_ns; /**< The completion's duration_ns: submission to terminal state as the engine
			  *   saw it (0: rejected at submission). */
	char detail[320];
};

struct soak_stats {
	uint64_t pool_size, pool_free;
	uint64_t live;          /**< Request records still held. */
	uint64_t held_terminal; /**< Blocks held by records that are terminal (waiting for a release). */
	uint64_t held_unowned;  /**< Blocks taken from the pool that no record holds. */
	uint64_t fences, peer_resets, late_notifications;
};

struct soak_proxy_stats {
	uint64_t forwarded, dropped, duplicated;
};

/** Send one message (blocking; handles short writes). @return 0 or -errno. */
int soak_send(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen);

/**
 * Receive one message (blocking). *payload is malloc'ed (NUL-terminated past len) or NULL.
 * @return 0, -ECONNRESET on EOF, -EPROTO on an oversized message, or -errno.
 */
int soak_recv(int fd, struct soak_hdr *h, void **payload);

/** CLOCK_MONOTONIC, ns. */
uint64_t soak_now_ns(void);

/** Options of a role process. */
struct soak_role_opts {
	bool producer, write_mode;
	const char *transport; /**< "tcp" or "shm". */
	const char *host;      /**< Advertised engine IP. */
	uint16_t hs_port, nt_port; /**< 0 = ephemeral (first incarnation). */
	uint32_t timeout_ms;
	uint32_t pool_blocks, max_blocks;
	uint32_t corrupt_every; /**< Checker self-test: producer fills every Nth request with another
	                             request's pattern; consumer scribbles into a block it just freed. */
	const char *lcores;   /**< params.lcores, or NULL for the engine's default. */
	int ctl_fd;
};

/** Role main loop (soak_role.c). @return process exit code. */
int soak_role_main(const struct soak_role_opts *o);

/** Proxy main loop (soak_proxy.c): ROUTER on tcp://@p host:* forwarding to @p host:@p fwd_port. */
int soak_proxy_main(const char *host, uint16_t fwd_port, int ctl_fd);

#endif /* KVX_SOAK_H */
