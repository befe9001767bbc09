/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_LOAD_H
#define KVX_BENCH_TRACE_LOAD_H
/**
 * @file
 * Request-trace loader for `kvxfer-perf trace` (formats documented in
 * bench/data/traces/README.md):
 * - Mooncake FAST'25 JSONL: one object per line with `timestamp` (ms, relative arrival),
 *   `input_length`, `output_length` (tokens) and `hash_ids` (prefix-block hash ids over
 *   512-token blocks; `len(hash_ids) == ceil(input_length / 512)`). Parsed with jansson.
 * - Azure LLM inference 2023 CSV: header `TIMESTAMP,ContextTokens,GeneratedTokens`, wall-clock
 *   timestamps `YYYY-MM-DD HH:MM:SS.fffffff`; no hash ids.
 * The format is detected from the content (a leading '{' or the Azure header).
 *
 * Every malformed line is an error naming FILE:LINE and the field; nothing is skipped. Blank
 * lines, decreasing timestamps, negative or non-integer counts, a wrong hash_ids length and
 * unknown CSV headers are errors. Arrival times are made relative to the first record.
 *
 * Not thread-safe per object; no global state.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Tokens covered by one Mooncake hash id. */
#define PERF_TRACE_HASH_BLOCK_TOKENS 512u

/** Trace file formats. */
enum perf_trace_format {
	PERF_TRACE_MOONCAKE = 1, /**< JSONL with hash_ids. */
	PERF_TRACE_AZURE = 2,    /**< CSV TIMESTAMP,ContextTokens,GeneratedTokens. */
};

/** One request of a trace. */
struct perf_trace_req {
	uint64_t arrival_ns;    /**< Arrival relative to the first record, ns. */
	uint32_t input_tokens;  /**< Prompt tokens (input_length / ContextTokens), >= 1. */
	uint32_t output_tokens; /**< Generated tokens (output_length / GeneratedTokens). */
	uint64_t hash_off;      /**< Index of the first hash id in perf_trace.hash_ids. */
	uint32_t n_hash;        /**< Hash ids of this request; 0 for Azure. */
	uint32_t line;          /**< 1-based line number in the file. */
};

/** A loaded trace (owned by the caller; free with perf_trace_destroy()). */
struct perf_trace {
	enum perf_trace_format format; /**< Detected format. */
	size_t n;                      /**< Number of requests in reqs. */
	struct perf_trace_req *reqs;   /**< Array[n], in file order. */
	uint64_t *hash_ids;            /**< Array[n_hash_ids]: all requests' hash ids, concatenated. */
	size_t n_hash_ids;             /**< Total hash ids. */
	bool has_hash_ids;             /**< true for Mooncake traces. */
};

/**
 * Load the first @p max_requests records of a trace file.
 *
 * @param path          Trace file; not NULL.
 * @param max_requests  Records to read (the first N); 0 = all.
 * @param[out] out      On success, a new trace (at least one request).
 * @param[out] err      Array[errlen]; on failure "FILE:LINE: field 'x': what is wrong".
 * @param errlen        Size of @p err in bytes.
 * @retval 0            Success.
 * @retval -ENOENT      Cannot open the file (or another fopen errno, negated).
 * @retval -EINVAL      Unknown format, malformed line, or no records.
 * @retval -ENOMEM      Allocation failed.
 */
int perf_trace_load(const char *path, size_t max_requests, struct perf_trace **out, char *err,
		    size_t errlen);

/** Free a trace from perf_trace_load(); NULL is a no-op. */
void perf_trace_destroy(struct perf_trace *t);

/** Name of a format ("mooncake-jsonl", "azure-csv"). */
const char *perf_trace_format_name(enum perf_trace_format f);

/**
 * Parse an Azure wall-clock timestamp `YYYY-MM-DD HH:MM:SS[.f{1,9}]` (UTC assumed).
 *
 * @param s           NUL-terminated text; not NULL.
 * @param[out] ns     Nanoseconds since 1970-01-01 00:00:00.
 * @retval 0          Success.
 * @retval -EINVAL    Not in that form, or a field out of range.
 */
int perf_trace_parse_azure_time(const char *s, uint64_t *ns);

#endif /* KVX_BENCH_TRACE_LOAD_H */
