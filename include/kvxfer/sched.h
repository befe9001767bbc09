/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_SCHED_H
#define KVX_SCHED_H
/**
 * @file
 * The two axes of a disaggregated transfer (docs/protocol.md §1.1, §1.2): which side an engine runs
 * on and which side moves the bytes. The engine API (engine.h) takes them in its parameters.
 */
#ifdef __cplusplus
extern "C" {
#endif

/** Which side of the disaggregated pair an engine runs on (docs/protocol.md §1.1). */
enum kvx_sched_role {
	KVX_SCHED_PRODUCER = 0, /**< Prefill (P). */
	KVX_SCHED_CONSUMER = 1, /**< Decode (D). */
};

/** Transfer mode (docs/protocol.md §1.2). */
enum kvx_sched_mode {
	KVX_SCHED_MODE_READ = 0,  /**< D pulls from P, then sends `release`. */
	KVX_SCHED_MODE_WRITE = 1, /**< D announces blocks, P pushes, then sends `write_done`. */
};

#ifdef __cplusplus
}
#endif
#endif /* KVX_SCHED_H */
