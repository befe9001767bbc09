/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_REPLAY_H
#define KVX_BENCH_TRACE_REPLAY_H
/**
 * @file
 * `kvxfer-perf trace`: the options shared by the driver and the two role processes, and the
 * driver <-> role wire messages.
 *
 * Process model (like a disaggregated deployment with its proxy):
 * - the **driver** (the process the user started, or `--client`) loads the trace, runs the
 *   arrival schedule, the concurrency limit and the consumer's prefix-cache simulation, and
 *   hands each request to the two engines like the MoRIIO proxy does (WRITE: to both at once;
 *   READ: to the producer first, then the producer's block ids to the consumer);
 * - a **producer** process and a **consumer** process each own a kvxfer engine
 *   (include/kvxfer/engine.h), a KV block pool laid out like the model's KV cache and a
 *   block-id allocator. With `--local` the driver fork/execs both; with `--server`/`--client`
 *   the producer runs on another host and the driver reaches it over TCP.
 * The driver channel carries only the proxy's information (request, block ids, results);
 * every KV byte moves through the engine (control plane + transport) between the roles.
 *
 * Wire format of the driver channel: struct trace_msg_hdr, then `len` bytes of payload
 * (host byte order: both ends are the same build; the HELLO carries a magic to reject
 * anything else).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "models.h"

/** Roles of a kvxfer-perf trace process. */
enum trace_role {
	TRACE_ROLE_DRIVER = 0,   /**< Schedules requests, prints the summary. */
	TRACE_ROLE_PRODUCER = 1, /**< Prefill side: owns the source blocks. */
	TRACE_ROLE_CONSUMER = 2, /**< Decode side: owns the destination blocks, verifies. */
};

/** Parsed command line (driver and roles parse the same one). */
struct trace_opts {
	const char *model;        /**< --model NAME (row of models.csv). */
	const char *models_csv;   /**< --models-csv FILE. */
	const char *trace;        /**< --trace FILE. */
	uint32_t block_tokens;    /**< --block-size, tokens per KV block. */
	uint64_t requests;        /**< --requests N (first N; 0 = all). */
	double speed;             /**< --speed X (0 = back to back). */
	uint32_t concurrency;     /**< --concurrency N, transfers in flight. */
	bool write_mode;          /**< -m write (true) / read (false). */
	const char *transport;    /**< -t auto|verbs|tcp|shm. */
	bool local;               /**< --local: fork/exec both roles here. */
	bool server;              /**< --server: run the producer role, wait for a driver. */
	const char *client;       /**< --client HOST: driver + local consumer, producer at HOST. */
	uint16_t port;            /**< --port: driver channel TCP port for --server/--client. */
	const char *host;         /**< --host IP advertised by this machine's engine. */
	const char *lcores;       /**< -l LCORES. */
	uint32_t control_lcore;   /**< --control-lcore N (UINT32_MAX = any). */
	bool idle_busy;           /**< --idle busy (true) / adaptive (false). */
	bool no_spread;           /**< --spread off: each transfer's layers all posted by its owning lcore. */
	bool no_follow;           /**< --follow off: engine params.follow_waker false. */
	bool no_hugepages;        /**< --hugepages off: host pools stay on 4 KiB pages. */
	uint32_t slice_us;        /**< --slice: engine params.poller_slice_us (default 100). */
	bool prefix_cache;        /**< --prefix-cache. */
	int verify;               /**< 1 --verify: per-page stamps; 2 --verify-bytes: every byte; 0 --no-verify;
	                               -1 = default (stamps with --local). */
	const char *json;         /**< --json FILE. */
	const char *csv;          /**< --csv FILE. */
	const char *plot;         /**< --plot FILE.png. */
	uint64_t pool_blocks;     /**< --pool-blocks N per side; 0 = largest request + 25%, at most a quarter of memory. */
	uint32_t layer_us;        /**< --layer-us: simulated compute per layer (WRITE producer), us. */
	uint32_t timeout_ms;      /**< --timeout-ms: per-transfer deadline, ms. */
	bool quiet;               /**< --quiet: no progress line. */
	const char *mem;          /**< --mem host|hip[:N]|hostdev: KV pool memory; NULL = host. */
	enum trace_oversize {
		TRACE_OVERSIZE_STREAM = 0, /**< Move it in pool-sized pieces, one after the other (default). */
		TRACE_OVERSIZE_SKIP,       /**< Leave it out of the replay; counted and named. */
		TRACE_OVERSIZE_ERROR,      /**< Usage error (exit 2) naming the request. */
	} oversize;               /**< --oversize: a request with more blocks than the pool. */
	uint16_t port_lo, port_hi; /**< --port-range LO-HI: the engine's listeners (handshake LO, notify
	                                LO+1, tcp data LO+2) bind there; 0 = kernel-chosen ports. */
	uint32_t connect_timeout_ms; /**< --connect-timeout-ms: reaching the --server and the peer's
	                                  listeners, ms. */
	uint32_t runs;            /**< --runs N (--server): runs to serve, 0 = until stopped. */
	uint32_t set;             /**< TRACE_SET_* bits: options given on the command line. */
	const char *metrics;      /**< --metrics ADDR: the engine serves Prometheus /metrics there. */
	const char *ib_dev;       /**< -d/--ib-dev: RDMA device of this host's engine (implies verbs). */
	enum trace_peer {
		TRACE_PEER_NONE = 0,
		TRACE_PEER_CMA,       /**< --peer cma (--local): after the replay, time a streaming
		                           process_vm_readv/writev loop moving the same bytes (trace_cma.h). */
		TRACE_PEER_TCP,       /**< --peer tcp (--local): the same with a streaming socket loop
		                           from the producer to the consumer (trace_tcp_peer.h). */
	} peer;                   /**< --peer: the same-bytes reference loop run after the replay. */
	const char *auth_dir;     /**< --auth-dir DIR: kvx_engine_params.auth_dir of the engines; NULL = unauthenticated. */
	/* internal (set by the driver for the role processes) */
	enum trace_role role;     /**< --role producer|consumer. */
	int ctl_fd;               /**< --ctl-fd: inherited driver channel. */
	uint32_t max_blocks;      /**< --max-blocks: largest request, blocks (engine max_blocks); 0 = min(pool, 65536). */
};

/** Bits of trace_opts.set: options given explicitly (a --server adopts the client's others). */
enum {
	TRACE_SET_MODEL = 1u << 0, TRACE_SET_BLOCK = 1u << 1, TRACE_SET_MODE = 1u << 2,
	TRACE_SET_TRANSPORT = 1u << 3, TRACE_SET_TIMEOUT = 1u << 4, TRACE_SET_HOST = 1u << 5,
	TRACE_SET_POOL = 1u << 6,
};

/** Driver channel message types. */
enum trace_msg_type {
	TRACE_MSG_HELLO = 1,  /**< role -> driver: engine started (struct trace_msg_hello). */
	TRACE_MSG_PEER = 2,   /**< driver -> role: where the other engine listens (struct trace_msg_peer). */
	TRACE_MSG_REQ = 3,    /**< driver -> role: a request (struct trace_msg_req). */
	TRACE_MSG_SERVED = 4, /**< producer -> driver, READ: block ids served (trace_msg_blocks + ids). */
	TRACE_MSG_READ = 5,   /**< driver -> consumer, READ: producer block ids to read (trace_msg_blocks + ids). */
	TRACE_MSG_DONE = 6,   /**< role -> driver: request finished on that side (struct trace_msg_done). */
	TRACE_MSG_STATS_REQ = 7, /**< driver -> role: send counters. */
	TRACE_MSG_STATS = 8,  /**< role -> driver: counters (struct trace_msg_stats). */
	TRACE_MSG_QUIT = 9,   /**< driver -> role: stop the engine and exit. */
	TRACE_MSG_FATAL = 10, /**< role -> driver: the role cannot continue (text payload). */
	TRACE_MSG_SETUP = 11, /**< --client -> --server, first message: the run's options (struct trace_msg_setup). */
	TRACE_MSG_RESULT = 12, /**< driver -> --server's producer, before QUIT: exit code (int32) + summary text. */
	TRACE_MSG_CMA_INFO_REQ = 14, /**< driver -> role, --peer: send CMA_INFO (cma: the target role; tcp: both). */
	TRACE_MSG_CMA_INFO = 15, /**< role -> driver: its pool and block-id log (trace_cma.h). */
	TRACE_MSG_CMA_RUN = 16,  /**< driver -> initiator role: run the loop against CMA_INFO's payload. */
	TRACE_MSG_CMA_RESULT = 17, /**< initiator role -> driver: struct trace_cma_result. */
	TRACE_MSG_TCP_RECV = 18, /**< driver -> consumer, --peer tcp: listen, receive (trace_tcp_peer.h). */
	TRACE_MSG_TCP_PORT = 19, /**< consumer -> driver: uint32_t port it listens on. */
	TRACE_MSG_TCP_SEND = 20, /**< driver -> producer: struct trace_tcp_send + the consumer's CMA_INFO. */
	TRACE_MSG_REFUSED = 13, /**< --server -> --client, instead of HELLO: the options are refused (a usage error: they disagree, unknown model, pool too large); text payload. */
};

/** Magic in every HELLO ("KVXTRAC1"). */
#define TRACE_MSG_MAGIC 0x3143415254584B56ull
/** Largest payload accepted on the driver channel, bytes. */
#define TRACE_MSG_MAX (64u << 20)

/** Header of every driver-channel message. */
struct trace_msg_hdr {
	uint32_t type; /**< enum trace_msg_type. */
	uint32_t len;  /**< Payload bytes that follow. */
};

/** HELLO: a role's engine is up. */
struct trace_msg_hello {
	uint64_t magic;          /**< TRACE_MSG_MAGIC. */
	uint32_t role;           /**< enum trace_role. */
	uint32_t write_mode;     /**< 1 = WRITE. */
	uint64_t pool_blocks;    /**< Blocks in this role's pool. */
	uint64_t block_bytes;    /**< Bytes per block, all layers and planes. */
	uint32_t num_layers;     /**< Registered layers. */
	uint32_t block_tokens;   /**< Tokens per block. */
	uint16_t handshake_port; /**< Engine handshake port. */
	uint16_t notify_port;    /**< Engine notify port. */
	uint32_t prefault_ms;    /**< Time to make the pool resident, ms. */
	uint16_t data_port;      /**< tcp data listener port when --port-range fixed it, else 0. */
	uint16_t pad16;
	char host[64];           /**< Advertised engine host. */
	char model[PERF_MODEL_NAME_MAX]; /**< Model name. */
	char transport[24];      /**< Provider in use, e.g. "tcp" or "tcp (auto)". */
	uint64_t huge_bytes;     /**< Host pool bytes backed by transparent huge pages (--hugepages). */
};

/**
 * SETUP: what a --server must agree on before it starts its producer. The server refuses options
 * it was given that differ (naming each), and takes the client's value for the others.
 */
struct trace_msg_setup {
	uint64_t magic;          /**< TRACE_MSG_MAGIC. */
	char version[32];        /**< kvxfer-perf version of the client. */
	char commit[32];         /**< Its git commit. */
	char model[PERF_MODEL_NAME_MAX]; /**< --model. */
	char transport[16];      /**< -t. */
	uint32_t block_tokens;   /**< --block-size. */
	uint32_t write_mode;     /**< 1 = WRITE. */
	uint32_t timeout_ms;     /**< --timeout-ms (both engines' per-transfer deadline). */
	uint32_t layer_us;       /**< --layer-us (the producer simulates it). */
	uint32_t concurrency;    /**< --concurrency (sizes the producer's bookkeeping). */
	uint32_t verify;         /**< --verify. */
	uint64_t pool_blocks;    /**< The client's pool (sized from its trace). */
	uint64_t max_blocks;     /**< Largest transfer, blocks. */
};

/** PEER: the other role's engine. */
struct trace_msg_peer {
	char host[64];           /**< Peer engine host. */
	uint16_t handshake_port; /**< Peer handshake port. */
	uint16_t notify_port;    /**< Peer notify port. */
};

/**
 * Request index of a piece of a streamed request (--oversize stream): piece k (1-based) of
 * request i travels as idx `i | (k << TRACE_PIECE_SHIFT)`, so every piece has its own transfer id.
 */
#define TRACE_PIECE_SHIFT 40
/** Request part of a (possibly piece) index. */
#define TRACE_IDX_REQ(idx) ((idx) & ((1ull << TRACE_PIECE_SHIFT) - 1))

/** REQ: one request (or one piece of a streamed request). */
struct trace_msg_req {
	uint64_t idx;        /**< Request index (transfer id "tx-%06llu"), see TRACE_PIECE_SHIFT. */
	uint64_t blocks;     /**< Prompt blocks. */
	uint64_t hit_blocks; /**< Blocks the consumer already holds (prefix hit). */
};

/** SERVED / READ: block ids (followed by n uint32_t ids). */
struct trace_msg_blocks {
	uint64_t idx;        /**< Request index. */
	uint64_t blocks;     /**< Prompt blocks. */
	uint64_t hit_blocks; /**< Prefix-hit blocks. */
	uint64_t n;          /**< Ids that follow. */
};

/** DONE: a role finished a request (its blocks are back in its pool). */
struct trace_msg_done {
	uint64_t idx;            /**< Request index. */
	int32_t status;          /**< 0 or negative errno (-EIO = verification failed). */
	uint32_t pad;
	uint64_t bytes;          /**< Bytes the engine reports for the transfer. */
	uint64_t first_layer_ns; /**< Time from receipt to layer 0 complete, ns; 0 = not measured. */
	uint64_t elapsed_ns;     /**< Time from receipt of the request to the terminal completion, ns. */
	uint64_t verify_bad;     /**< Block planes that failed verification. */
	char detail[160];        /**< First failure, human-readable; empty when OK. */
};

/** STATS: a role's counters at the end of the run. */
struct trace_msg_stats {
	double lcore_util;       /**< Mean polling-lcore utilization 0..1; < 0 = unknown. */
	uint64_t ctl_sent;       /**< Control messages sent; UINT64_MAX = unknown. */
	uint64_t ctl_recv;       /**< Control messages received; UINT64_MAX = unknown. */
	uint64_t ctl_dropped;    /**< Control messages dropped; UINT64_MAX = unknown. */
	uint64_t verify_bad;     /**< Block planes that failed verification. */
	uint64_t pool_exhausted; /**< Times a request waited for free blocks. */
	uint64_t transfers_failed; /**< Engine: failed + aborted + timed out. */
	char transport[24];      /**< kvx_engine_transport_name() at the end: provider in use. */
	double engine_cpu_s;     /**< CPU seconds of the engine's threads (the role process minus
	                              its main thread, which fills and checks) since the role began. */
	uint32_t n_lcores;       /**< Polling lcores of the engine (entries of lcore_bytes). */
	uint32_t pad2;
	uint64_t lcore_bytes[16]; /**< Bytes moved by the ops each polling lcore posted. */
};

/** Send one message (blocking, handles short writes). @return 0 or -errno. */
int trace_msg_send(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen);

struct px_auth;
/**
 * --auth-dir: seal every later message on @p fd (the --server/--client driver connection) with
 * @p a, an exchange made by px_auth_client/server() (px_auth.h): header and payload each go as
 * one crypto_secretbox. NULL removes @p fd. At most 4 sealed fds per process. Call before
 * messages flow on @p fd; each fd is then used by one thread at a time.
 * @return 0, or -ENOSPC.
 */
int trace_wire_seal(int fd, struct px_auth *a);

/**
 * Receive one message (blocking). *payload is malloc'ed (free it); NULL when len is 0.
 * @return 0, -ECONNRESET on EOF, -EPROTO on an oversized message, -EBADMSG on a sealed fd when
 *         the bytes fail authentication, or -errno.
 */
int trace_msg_recv(int fd, struct trace_msg_hdr *h, void **payload);

/** Transfer id of request @p idx ("tx-%06llu") into @p buf (>= 32 bytes). */
void trace_xfer_id(uint64_t idx, char *buf, size_t len);

/** Parse a transfer id made by trace_xfer_id(). @return 0 or -EINVAL. */
int trace_xfer_id_parse(const char *s, uint64_t *idx);

/** Run a role process (producer or consumer) until QUIT. @return process exit code. */
int trace_role_main(const struct trace_opts *o, int fd);

#endif /* KVX_BENCH_TRACE_REPLAY_H */
