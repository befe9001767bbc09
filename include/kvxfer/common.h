/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_COMMON_H
#define KVX_COMMON_H
/**
 * @file
 * Shared conventions of every kvxfer module: export and branch-hint macros, the cache-line
 * size, the error convention (0 or a negative errno, docs/style.md §8), the monotonic clock and the
 * rate-limited logger used by the slow path.
 *
 * Error table (the only codes kvxfer functions return, always negated):
 * | code       | meaning in kvxfer                                   |
 * |------------|-----------------------------------------------------|
 * | EINVAL     | bad argument or option (message names the field)    |
 * | ENOMEM     | allocation failed                                   |
 * | ENOBUFS    | ring / queue / table full                           |
 * | EAGAIN     | empty, or try again later                           |
 * | ETIMEDOUT  | deadline passed (handshake, transfer, defer)        |
 * | ECONNRESET | peer lost (died, restarted, QP in error)            |
 * | EPROTO     | malformed or unexpected control message             |
 * | EMSGSIZE   | message over a size limit                           |
 * | ENOTSUP    | provider or build lacks the operation               |
 * | ENODEV     | no device (RDMA, GPU)                               |
 * | EEXIST     | duplicate (transfer id, registration)               |
 * | ENOENT     | unknown id                                          |
 * | EACCES     | key or access-flag violation on a region            |
 * | ERANGE     | offset/length outside a registered region           |
 * | EBUSY      | object in use (lcore running, region referenced)    |
 * | ECANCELED  | aborted by the user                                 |
 * | ESTALE     | lease on the peer's blocks not held (never granted, revoked, peer restarted) |
 *
 * Thread safety: everything here is safe from any thread.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks a symbol exported from the kvxfer libraries (built with -fvisibility=hidden). */
#define KVX_API __attribute__((visibility("default")))
/** Branch hint: condition is expected true. */
#define KVX_LIKELY(x) __builtin_expect(!!(x), 1)
/** Branch hint: condition is expected false. */
#define KVX_UNLIKELY(x) __builtin_expect(!!(x), 0)
/** Cold, out-of-line function (error paths). */
#define KVX_COLD __attribute__((cold, noinline))
/** printf-style format check. */
#define KVX_PRINTF(f, a) __attribute__((format(printf, f, a)))
/** Cache line size in bytes used for padding shared indices (x86-64, arm64 servers). */
#define KVX_CACHE_LINE 64
/** Number of elements of a fixed-size array. */
#define KVX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/** Log levels for kvx_log(); the threshold comes from env KVX_LOG (error|warn|info|debug). */
enum kvx_log_level {
	KVX_LOG_ERROR = 0, /**< Something failed and was reported to the caller. */
	KVX_LOG_WARN = 1,  /**< Dropped or recovered input (bad message, timeout). Default level. */
	KVX_LOG_INFO = 2,  /**< Lifecycle events (start, connect, stop). */
	KVX_LOG_DEBUG = 3, /**< Slow-path detail. Never used on the hot path. */
};

/**
 * Return a static, human-readable string for an error code.
 *
 * @param err  A kvxfer return value: 0, or a negative errno (a positive errno is accepted too).
 * @return     Never NULL; "Success" for 0, strerror-style text otherwise.
 * @par Thread safety  Safe from any thread (returns static storage).
 */
KVX_API const char *kvx_strerror(int err);

/**
 * Read CLOCK_MONOTONIC.
 *
 * @return  Nanoseconds since an arbitrary fixed point; never decreases.
 * @par Context  vDSO call, no syscall on Linux x86-64; usable on the hot path for accounting.
 */
KVX_API uint64_t kvx_now_ns(void);

/**
 * Write one log line to stderr if @p level is at or below the threshold (env KVX_LOG).
 *
 * @param level  One of enum kvx_log_level.
 * @param fmt    printf format; a trailing newline is added.
 * @par Thread safety  Safe from any thread; one write(2) per line.
 * @par Context  Slow path only: never call from a poller's fast path.
 */
KVX_API void kvx_log(enum kvx_log_level level, const char *fmt, ...) KVX_PRINTF(2, 3);

/**
 * Whether kvx_log() would print at @p level (lets callers skip formatting work).
 *
 * @param level  One of enum kvx_log_level.
 * @return       true if enabled.
 */
KVX_API bool kvx_log_enabled(enum kvx_log_level level);

/**
 * Rate limiter for repeated warnings (one line per interval, counting the suppressed ones).
 * Zero-initialise; not thread-safe (one owner thread).
 */
struct kvx_ratelimit {
	uint64_t interval_ns; /**< Minimum time between two printed lines, ns (0 = 1 s). */
	uint64_t last_ns;     /**< Time of the last printed line, ns (kvx_now_ns()). */
	uint64_t suppressed;  /**< Lines suppressed since the last printed one. */
};

/**
 * Decide whether a rate-limited message may be printed now.
 *
 * @param rl              Limiter owned by the caller; not NULL.
 * @param[out] suppressed If non-NULL and the result is true, the number of messages that were
 *                        suppressed since the previous printed one.
 * @return                true if the caller should print now; false if it was suppressed.
 * @par Thread safety  One thread per limiter.
 */
KVX_API bool kvx_ratelimit_ok(struct kvx_ratelimit *rl, uint64_t *suppressed);

#ifdef __cplusplus
}
#endif
#endif /* KVX_COMMON_H */
