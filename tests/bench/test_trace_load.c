/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "helpers.h"
#include "trace_load.h"

#define TRACES KVX_BENCH_DATA_DIR "/traces/"
#define CONV TRACES "mooncake_fast25_conversation_trace.head3MB.jsonl"
#define SYNTH TRACES "mooncake_fast25_synthetic_trace.jsonl"
#define AZ_CODE TRACES "azure_llm_2023_code.csv"
#define AZ_CONV TRACES "azure_llm_2023_conv.csv"

TestSuite(bench_trace_load, .timeout = 60.0);

Test(bench_trace_load, mooncake_conversation_first_records_exact)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load(CONV, 4, &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t->format, PERF_TRACE_MOONCAKE);
	cr_assert(t->has_hash_ids);
	cr_assert_eq(t->n, 4);
	/* {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, ..., 13]} */
	cr_assert_eq(t->reqs[0].arrival_ns, 0);
	cr_assert_eq(t->reqs[0].input_tokens, 6758);
	cr_assert_eq(t->reqs[0].output_tokens, 500);
	cr_assert_eq(t->reqs[0].n_hash, 14);
	cr_assert_eq(t->reqs[0].line, 1);
	for (uint64_t i = 0; i < 14; i++)
		cr_assert_eq(t->hash_ids[t->reqs[0].hash_off + i], i);
	/* {"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, ..., 27]} */
	cr_assert_eq(t->reqs[1].input_tokens, 7322);
	cr_assert_eq(t->reqs[1].output_tokens, 490);
	cr_assert_eq(t->reqs[1].n_hash, 15);
	cr_assert_eq(t->hash_ids[t->reqs[1].hash_off], 0);
	cr_assert_eq(t->hash_ids[t->reqs[1].hash_off + 1], 14);
	cr_assert_eq(t->hash_ids[t->reqs[1].hash_off + 14], 27);
	/* line 4: {"timestamp": 0, "input_length": 2290, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]} */
	cr_assert_eq(t->reqs[3].input_tokens, 2290);
	cr_assert_eq(t->reqs[3].n_hash, 5);
	cr_assert_eq(t->hash_ids[t->reqs[3].hash_off + 4], 45);
	cr_assert_eq(t->n_hash_ids, 14 + 15 + 15 + 5);
	perf_trace_destroy(t);
}

Test(bench_trace_load, whole_files_have_documented_record_counts)
{
	static const struct {
		const char *path;
		size_t n;
	} files[] = {{CONV, 11920}, {SYNTH, 3993}, {AZ_CODE, 8819}, {AZ_CONV, 19366}};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		struct perf_trace *t;
		char err[256] = "";
		cr_assert_eq(perf_trace_load(files[i].path, 0, &t, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(t->n, files[i].n, "%s: %zu records", files[i].path, t->n);
		perf_trace_destroy(t);
	}
}

Test(bench_trace_load, mooncake_conversation_last_timestamp_is_3507000_ms)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load(CONV, 0, &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t->reqs[t->n - 1].arrival_ns, 3507000ull * 1000000ull);
	cr_assert_eq(t->reqs[t->n - 1].line, 11920);
	perf_trace_destroy(t);
}

Test(bench_trace_load, mooncake_synthetic_first_record_exact)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load(SYNTH, 1, &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t->n, 1);
	cr_assert_eq(t->reqs[0].input_tokens, 40160);
	cr_assert_eq(t->reqs[0].output_tokens, 6);
	cr_assert_eq(t->reqs[0].n_hash, 79);
	cr_assert_eq(t->hash_ids[78], 78);
	perf_trace_destroy(t);
}

Test(bench_trace_load, azure_code_first_rows_exact)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load(AZ_CODE, 2, &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t->format, PERF_TRACE_AZURE);
	cr_assert(!t->has_hash_ids);
	cr_assert_eq(t->n, 2);
	/* 2023-11-16 18:17:03.9799600,4808,10 then 2023-11-16 18:17:04.0319600,3180,8 */
	cr_assert_eq(t->reqs[0].input_tokens, 4808);
	cr_assert_eq(t->reqs[0].output_tokens, 10);
	cr_assert_eq(t->reqs[0].arrival_ns, 0);
	cr_assert_eq(t->reqs[0].line, 2);
	cr_assert_eq(t->reqs[1].input_tokens, 3180);
	cr_assert_eq(t->reqs[1].output_tokens, 8);
	cr_assert_eq(t->reqs[1].arrival_ns, 52000000ull);
	cr_assert_eq(t->reqs[1].n_hash, 0);
	perf_trace_destroy(t);
}

Test(bench_trace_load, azure_conv_first_rows_exact)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load(AZ_CONV, 2, &t, err, sizeof(err)), 0, "%s", err);
	/* 18:15:46.6805900,374,44 then 18:15:50.9951690,396,109 */
	cr_assert_eq(t->reqs[0].input_tokens, 374);
	cr_assert_eq(t->reqs[0].output_tokens, 44);
	cr_assert_eq(t->reqs[1].input_tokens, 396);
	cr_assert_eq(t->reqs[1].output_tokens, 109);
	cr_assert_eq(t->reqs[1].arrival_ns, 4314579000ull);
	perf_trace_destroy(t);
}

Test(bench_trace_load, azure_time_parses_to_epoch_ns)
{
	uint64_t ns;
	cr_assert_eq(perf_trace_parse_azure_time("1970-01-01 00:00:01.5", &ns), 0);
	cr_assert_eq(ns, 1500000000ull);
	/* 2023-11-16 18:17:03 UTC = 1700158623 s */
	cr_assert_eq(perf_trace_parse_azure_time("2023-11-16 18:17:03.9799600", &ns), 0);
	cr_assert_eq(ns, 1700158623ull * 1000000000ull + 979960000ull);
	cr_assert_eq(perf_trace_parse_azure_time("2023-02-29 00:00:00", &ns), -EINVAL);
	cr_assert_eq(perf_trace_parse_azure_time("2023-11-16T18:17:03", &ns), -EINVAL);
	cr_assert_eq(perf_trace_parse_azure_time("2023-11-16 18:17:03.", &ns), -EINVAL);
	cr_assert_eq(perf_trace_parse_azure_time("2023-11-16 18:17:03.1234567890", &ns), -EINVAL);
	cr_assert_eq(perf_trace_parse_azure_time("2023-13-16 18:17:03", &ns), -EINVAL);
}

/* Load content from a temp file and expect -EINVAL with "PATH:LINE:" and a phrase. */
static void expect_bad(const char *suffix, const char *content, unsigned line, const char *phrase)
{
	char path[64], err[512] = "", want[96];
	tmpfile_with(path, sizeof(path), suffix, content);
	struct perf_trace *t = NULL;
	int rc = perf_trace_load(path, 0, &t, err, sizeof(err));
	unlink(path);
	cr_assert_eq(rc, -EINVAL, "rc %d for %s", rc, content);
	cr_assert_null(t);
	snprintf(want, sizeof(want), "%s:%u:", path, line);
	cr_assert(strstr(err, want), "'%s' lacks '%s'", err, want);
	cr_assert(strstr(err, phrase), "'%s' lacks '%s'", err, phrase);
}

#define MC1 "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"

Test(bench_trace_load, mooncake_malformed_lines_name_file_and_line)
{
	expect_bad(".jsonl", MC1 "{\"timestamp\": 1, \"input_length\": 600,\n", 2, "invalid JSON");
	expect_bad(".jsonl", MC1 MC1 "{\"timestamp\": 2, \"input_length\": 10, \"output_length\": 1}\n", 3,
		   "'hash_ids' is missing");
	expect_bad(".jsonl", MC1 "{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1]}\n",
		   2, "needs 2");
	expect_bad(".jsonl", MC1 "{\"timestamp\": 2, \"input_length\": -4, \"output_length\": 1, \"hash_ids\": []}\n",
		   2, "'input_length'");
	expect_bad(".jsonl", MC1 "{\"timestamp\": 2, \"input_length\": \"600\", \"output_length\": 1, \"hash_ids\": [1,2]}\n",
		   2, "not a number");
	expect_bad(".jsonl", MC1 "{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1,\"x\"]}\n",
		   2, "'hash_ids'[1]");
	expect_bad(".jsonl", "{\"timestamp\": 9, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n" MC1,
		   2, "earlier");
	expect_bad(".jsonl", MC1 "\n" MC1, 2, "empty line");
	expect_bad(".jsonl", MC1 "[1,2]\n", 2, "not a JSON object");
	expect_bad(".jsonl", MC1 "{\"timestamp\": 1, \"timestamp\": 2, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
		   2, "invalid JSON");
}

#define AZH "TIMESTAMP,ContextTokens,GeneratedTokens\n"

Test(bench_trace_load, azure_malformed_lines_name_file_and_line)
{
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04,12\n", 3, "2 fields");
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,48a8,10\n", 2, "'ContextTokens'");
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,0,10\n", 2, "'ContextTokens'");
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,4808,-1\n", 2, "'GeneratedTokens'");
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,4808,10\nyesterday,1,1\n", 3, "'TIMESTAMP'");
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:02.0,1,1\n", 3, "earlier");
	expect_bad(".csv", AZH "2023-11-16 18:17:03.9799600,4808,10,7\n", 2, "more than 3 fields");
	expect_bad(".csv", "TIMESTAMP,Context,Generated\n", 1, "unknown trace format");
	expect_bad(".csv", AZH, 1, "no requests");
}

Test(bench_trace_load, azure_last_line_without_newline_is_read)
{
	char path[64], err[256] = "";
	tmpfile_with(path, sizeof(path), ".csv", AZH "2023-11-16 18:17:03.5,10,1\n2023-11-16 18:17:04,20,2");
	struct perf_trace *t;
	int rc = perf_trace_load(path, 0, &t, err, sizeof(err));
	unlink(path);
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(t->n, 2);
	cr_assert_eq(t->reqs[1].input_tokens, 20);
	cr_assert_eq(t->reqs[1].arrival_ns, 500000000ull);
	perf_trace_destroy(t);
}

Test(bench_trace_load, missing_file_returns_enoent)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load("/nonexistent.jsonl", 0, &t, err, sizeof(err)), -ENOENT);
	cr_assert(strstr(err, "/nonexistent.jsonl"), "%s", err);
}
