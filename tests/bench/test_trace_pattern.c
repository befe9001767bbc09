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
