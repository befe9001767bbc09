/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_PATTERN_H
#define KVX_BENCH_TRACE_PATTERN_H
/**
 * @file
 * Byte pattern for KV blocks replayed by `kvxfer-perf trace`: the producer fills each block
 * plane with a pattern that depends on (request, layer, plane, block, byte offset), and the
 * consumer recomputes it and compares on arrival. Each 8-byte word is
 * `seed(request, layer, plane, block) ^ (word_index + 1) * 0x9E3779B97F4A7C15` (little
 * endian), so a block written for another request, layer, plane or block position, a stale
 * block left over from a previous request, a shifted copy and a single flipped bit are all
 * detected. Cheap enough (one multiply per word) to verify every byte at memory bandwidth.
 *
 * Pure functions; safe from any thread.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Identity of one block plane in the replay. */
struct perf_pattern_key {
	uint64_t request; /**< Request (transfer) index in the replay, 0-based. */
	uint32_t layer;   /**< Layer index, 0..num_layers-1. */
	uint32_t plane;   /**< 0 = K (or MLA latent), 1 = V. */
	uint64_t block;   /**< Block position within the request (0 = first prompt block). */
};

/** Seed of a block plane (mixes every field of @p k). */
uint64_t perf_pattern_seed(const struct perf_pattern_key *k);

/**
 * Fill @p len bytes at @p buf with the pattern of @p k.
 *
 * @param buf  Array[len] bytes to write; any alignment.
 * @param len  Bytes, >= 0 (a tail shorter than 8 bytes gets the low bytes of its word).
 * @param k    Block identity; not NULL.
 */
void perf_pattern_fill(void *buf, size_t len, const struct perf_pattern_key *k);

/**
 * Check that @p len bytes at @p buf hold the pattern of @p k.
 *
 * @param buf             Array[len] bytes to read.
 * @param len             Bytes.
 * @param k               Expected block identity; not NULL.
 * @param[out] first_bad  If non-NULL and the check fails, offset in bytes of the first
 *                        differing byte.
 * @return                true when every byte matches.
 */
bool perf_pattern_check(const void *buf, size_t len, const struct perf_pattern_key *k,
			size_t *first_bad);

/** Bytes between two stamps of perf_pattern_stamp() (one per 4 KiB page). */
#define PERF_PATTERN_STAMP_STRIDE 4096u

/**
 * Write only the stamps of @p k's pattern: the pattern's 8-byte word at every
 * PERF_PATTERN_STAMP_STRIDE bytes from the start of the block and its last whole word. Every
 * 4 KiB window of the block, so every memory page it touches, holds a stamp, and a stamp is the
 * very word perf_pattern_fill() writes there: a stamped block carries the identity (request,
 * layer, plane, block) and the offset of each of its pages. Blocks shorter than 16 bytes are
 * filled whole.
 *
 * @param buf  Array[len] bytes; any alignment.
 * @param len  Bytes.
 * @param k    Block identity; not NULL.
 */
void perf_pattern_stamp(void *buf, size_t len, const struct perf_pattern_key *k);

/**
 * Check the stamps written by perf_pattern_stamp() (or a full perf_pattern_fill(), whose
 * stamps are the same words). Catches a page of another request (stale), layer, plane or block
 * (foreign or misplaced) and a copy shifted by a whole number of words within the block; a
 * change between stamps goes unseen (perf_pattern_check() sees every byte).
 *
 * @param buf             Array[len] bytes to read.
 * @param len             Bytes.
 * @param k               Expected block identity; not NULL.
 * @param[out] first_bad  If non-NULL and the check fails, offset of the first bad stamp byte.
 * @return                true when every stamp matches.
 */
bool perf_pattern_check_stamps(const void *buf, size_t len, const struct perf_pattern_key *k, size_t *first_bad);

#endif /* KVX_BENCH_TRACE_PATTERN_H */
