/* SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "trace_pattern.h"

TestSuite(bench_trace_pattern, .timeout = 30.0);

#define LEN 32768u

Test(bench_trace_pattern, fill_then_check_passes)
{
	unsigned char *b = malloc(LEN);
	struct perf_pattern_key k = {.request = 7, .layer = 31, .plane = 1, .block = 422};
	perf_pattern_fill(b, LEN, &k);
	size_t bad = 12345;
	cr_assert(perf_pattern_check(b, LEN, &k, &bad));
	cr_assert_eq(bad, 12345, "first_bad written on success");
	free(b);
}

Test(bench_trace_pattern, single_flipped_bit_anywhere_is_caught_at_its_offset)
{
	unsigned char *b = malloc(LEN + 5);
	struct perf_pattern_key k = {.request = 1, .layer = 0, .plane = 0, .block = 0};
	const size_t offs[] = {0, 1, 7, 8, 4095, LEN - 1, LEN + 4};
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
		perf_pattern_fill(b, LEN + 5, &k);
		b[offs[i]] ^= 0x10;
		size_t bad = 0;
		cr_assert_not(perf_pattern_check(b, LEN + 5, &k, &bad), "flip at %zu missed", offs[i]);
		cr_assert_eq(bad, offs[i]);
	}
	free(b);
}

Test(bench_trace_pattern, every_key_field_changes_the_bytes)
{
	unsigned char *b = malloc(LEN);
	const struct perf_pattern_key base = {.request = 3, .layer = 5, .plane = 0, .block = 9};
	struct perf_pattern_key other[4] = {base, base, base, base};
	other[0].request++;
	other[1].layer++;
	other[2].plane = 1;
	other[3].block++;
	perf_pattern_fill(b, LEN, &base);
	for (int i = 0; i < 4; i++) {
		size_t bad = LEN;
		cr_assert_not(perf_pattern_check(b, LEN, &other[i], &bad), "key field %d ignored", i);
		cr_assert_eq(bad, 0);
	}
	free(b);
}

Test(bench_trace_pattern, shifted_copy_is_caught)
{
	unsigned char *a = malloc(LEN), *b = malloc(LEN);
	struct perf_pattern_key k = {.request = 2, .layer = 1, .plane = 0, .block = 4};
	perf_pattern_fill(a, LEN, &k);
	memcpy(b, a + 8, LEN - 8);
	memcpy(b + LEN - 8, a, 8);
	cr_assert_not(perf_pattern_check(b, LEN, &k, NULL));
	free(a);
	free(b);
}

Test(bench_trace_pattern, words_within_a_block_differ)
{
	uint64_t w[64];
	struct perf_pattern_key k = {0};
	perf_pattern_fill(w, sizeof(w), &k);
	for (int i = 0; i < 64; i++)
		for (int j = i + 1; j < 64; j++)
			cr_assert_neq(w[i], w[j]);
}

/* ---- per-page stamps (the default check of kvxfer-perf trace) ---- */

#define MLA_LEN 18432u /* 16 tokens x 576 x bf16: 4.5 pages, not a page multiple */

Test(bench_trace_pattern, stamps_pass_on_stamped_and_on_fully_filled_blocks)
{
	const size_t lens[] = {LEN, MLA_LEN, 16, 20, 4096, 4104};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		unsigned char *b = calloc(1, lens[i]);
		struct perf_pattern_key k = {.request = 3, .layer = 2, .plane = 1, .block = 9};
		perf_pattern_stamp(b, lens[i], &k);
		size_t bad = 777;
		cr_assert(perf_pattern_check_stamps(b, lens[i], &k, &bad), "len %zu", lens[i]);
		cr_assert_eq(bad, 777);
		perf_pattern_fill(b, lens[i], &k);
		cr_assert(perf_pattern_check_stamps(b, lens[i], &k, NULL), "full fill, len %zu", lens[i]);
		free(b);
	}
}

Test(bench_trace_pattern, stamps_write_only_the_stamp_words)
{
	unsigned char *b = calloc(1, MLA_LEN), *full = malloc(MLA_LEN);
	struct perf_pattern_key k = {.request = 5, .layer = 1, .plane = 0, .block = 2};
	perf_pattern_stamp(b, MLA_LEN, &k);
	perf_pattern_fill(full, MLA_LEN, &k);
	size_t written = 0;
	for (size_t w = 0; w < MLA_LEN / 8; w++) {
		bool stamp = w % (PERF_PATTERN_STAMP_STRIDE / 8) == 0 || w == MLA_LEN / 8 - 1;
		bool zero = true;
		for (size_t i = 0; i < 8; i++)
			zero &= b[8 * w + i] == 0;
		if (stamp) {
			cr_assert_eq(memcmp(b + 8 * w, full + 8 * w, 8), 0, "stamp word %zu differs from the fill", w);
			written++;
		} else {
			cr_assert(zero, "word %zu is not a stamp but was written", w);
		}
	}
	cr_assert_eq(written, 6, "5 page stamps + the last word of a 4.5-page block");
	free(b);
	free(full);
}

/* Each 4 KiB window of the block (so every page the block touches) is checked: replacing any
 * one window with the same window of another request, layer, plane or block is caught. */
Test(bench_trace_pattern, stamps_catch_a_stale_foreign_or_misplaced_page_anywhere)
{
	const struct perf_pattern_key want = {.request = 10, .layer = 4, .plane = 1, .block = 33};
	const struct perf_pattern_key other[] = {
		{.request = 9, .layer = 4, .plane = 1, .block = 33},  /* stale: previous request */
		{.request = 10, .layer = 5, .plane = 1, .block = 33}, /* foreign layer */
		{.request = 10, .layer = 4, .plane = 0, .block = 33}, /* K page in the V plane */
		{.request = 10, .layer = 4, .plane = 1, .block = 34}, /* misplaced block */
	};
	unsigned char *b = malloc(MLA_LEN), *o = malloc(MLA_LEN);
	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
		perf_pattern_fill(o, MLA_LEN, &other[i]);
		for (size_t start = 0; start + 4096 <= MLA_LEN; start += 1024) {
			perf_pattern_stamp(b, MLA_LEN, &want);
			memcpy(b + start, o + start, 4096);
			size_t bad = 0;
			cr_assert_not(perf_pattern_check_stamps(b, MLA_LEN, &want, &bad), "key %zu window at %zu missed", i,
				      start);
			cr_assert(bad >= start && bad < start + 4096, "key %zu: bad byte %zu outside [%zu, +4096)", i, bad,
				  start);
		}
		/* The last partial page: the block's final 8 bytes. */
		perf_pattern_stamp(b, MLA_LEN, &want);
		memcpy(b + MLA_LEN - 8, o + MLA_LEN - 8, 8);
		cr_assert_not(perf_pattern_check_stamps(b, MLA_LEN, &want, NULL));
	}
	free(b);
	free(o);
}

Test(bench_trace_pattern, stamps_catch_a_page_shifted_within_the_block_and_full_check_catches_any_byte)
{
	const struct perf_pattern_key k = {.request = 1, .layer = 0, .plane = 0, .block = 7};
	unsigned char *b = malloc(LEN);
	perf_pattern_fill(b, LEN, &k);
	memmove(b + 8192, b + 4096, 4096); /* page 1's bytes land in page 2 */
	size_t bad = 0;
	cr_assert_not(perf_pattern_check_stamps(b, LEN, &k, &bad));
	cr_assert_eq(bad / 4096, 2);
	/* Between stamps only the full check sees a change (the option the tests use). */
	perf_pattern_fill(b, LEN, &k);
	b[100] ^= 1;
	cr_assert(perf_pattern_check_stamps(b, LEN, &k, NULL));
	cr_assert_not(perf_pattern_check(b, LEN, &k, &bad));
	cr_assert_eq(bad, 100);
	free(b);
}
