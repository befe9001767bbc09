/* SPDX-License-Identifier: Apache-2.0 */
/* Block fill/verify pattern (see trace_pattern.h). */
#include "trace_pattern.h"

#include <string.h>

#define PATTERN_MUL 0x9E3779B97F4A7C15ull

static uint64_t mix64(uint64_t x)
{
	/* splitmix64 finaliser: every input bit affects every output bit. */
	x ^= x >> 30;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 27;
	x *= 0x94D049BB133111EBull;
	x ^= x >> 31;
	return x;
}

uint64_t perf_pattern_seed(const struct perf_pattern_key *k)
{
	uint64_t s = mix64(k->request + PATTERN_MUL);
	s = mix64(s ^ (((uint64_t)k->layer << 1 | (k->plane & 1u)) + 0x632BE59BD9B4E019ull));
	return mix64(s ^ (k->block + 0x85EBCA77C2B2AE63ull));
}

static inline uint64_t word_at(uint64_t seed, size_t w)
{
	return seed ^ ((uint64_t)(w + 1) * PATTERN_MUL);
}

/* Bytes are defined little-endian so the pattern is the same on every host. */
static inline void put_le64(unsigned char *p, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

void perf_pattern_fill(void *buf, size_t len, const struct perf_pattern_key *k)
{
	uint64_t seed = perf_pattern_seed(k);
	unsigned char *p = buf;
	size_t words = len / 8;
	for (size_t w = 0; w < words; w++) {
		uint64_t v = word_at(seed, w);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		memcpy(p + 8 * w, &v, 8);
#else
		put_le64(p + 8 * w, v, 8);
#endif
	}
	if (len % 8)
		put_le64(p + 8 * words, word_at(seed, words), len % 8);
}

bool perf_pattern_check(const void *buf, size_t len, const struct perf_pattern_key *k,
			size_t *first_bad)
{
	uint64_t seed = perf_pattern_seed(k);
	const unsigned char *p = buf;
	size_t words = len / 8;
	unsigned char want[8];
	for (size_t w = 0; w < words; w++) {
		uint64_t v = word_at(seed, w), got;
		memcpy(&got, p + 8 * w, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		if (got == v)
			continue;
#endif
		put_le64(want, v, 8);
		for (size_t i = 0; i < 8; i++) {
			if (p[8 * w + i] != want[i]) {
				if (first_bad)
					*first_bad = 8 * w + i;
				return false;
			}
		}
	}
	if (len % 8) {
		put_le64(want, word_at(seed, words), len % 8);
		for (size_t i = 0; i < len % 8; i++) {
			if (p[8 * words + i] != want[i]) {
				if (first_bad)
					*first_bad = 8 * words + i;
				return false;
			}
		}
	}
	return true;
}

/* Whole words of a block; the stamps sit at word 0, every STRIDE/8 words, and the last. */
static inline size_t stamp_words(size_t len)
{
	return len / 8;
}

void perf_pattern_stamp(void *buf, size_t len, const struct perf_pattern_key *k)
{
	if (len < 16) {
		perf_pattern_fill(buf, len, k);
		return;
	}
	uint64_t seed = perf_pattern_seed(k);
	unsigned char *p = buf;
	const size_t words = stamp_words(len), step = PERF_PATTERN_STAMP_STRIDE / 8;
	for (size_t w = 0; w < words; w += step)
		put_le64(p + 8 * w, word_at(seed, w), 8);
	put_le64(p + 8 * (words - 1), word_at(seed, words - 1), 8);
}

bool perf_pattern_check_stamps(const void *buf, size_t len, const struct perf_pattern_key *k, size_t *first_bad)
{
	if (len < 16)
		return perf_pattern_check(buf, len, k, first_bad);
	uint64_t seed = perf_pattern_seed(k);
	const unsigned char *p = buf;
	const size_t words = stamp_words(len), step = PERF_PATTERN_STAMP_STRIDE / 8;
	for (size_t w = 0;; w += step) {
		if (w >= words)
			w = words - 1; /* the last whole word closes the block */
		unsigned char want[8];
		put_le64(want, word_at(seed, w), 8);
		for (size_t i = 0; i < 8; i++) {
			if (p[8 * w + i] != want[i]) {
				if (first_bad)
					*first_bad = 8 * w + i;
				return false;
			}
		}
		if (w == words - 1)
			return true;
	}
}
