/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_MODELS_H
#define KVX_BENCH_MODELS_H
/**
 * @file
 * Model configurations for kvxfer-perf: parse bench/data/models.csv (see
 * bench/data/models.README.md for every column's source) and derive the per-layer KV-cache
 * geometry a transfer moves.
 *
 * Layout rules (docs/protocol.md §4.1-4.2, dtype bf16 = 2 bytes, as the CSV's computed columns):
 * - GQA/MHA models: split K/V. Each layer registers two planes (K, V); a block of BS tokens is
 *   `BS * num_kv_heads * head_dim * 2` bytes per plane and the block moves as 2 transfers.
 * - MLA models (non-empty `mla_latent_dim`, e.g. DeepSeek-V3): one latent plane per layer; a
 *   block is `BS * mla_latent_dim * 2` bytes and moves as 1 transfer.
 * Sizes are full, unsharded (TP = 1). The loader cross-checks the CSV's two computed columns
 * against these formulas and rejects the file if they disagree.
 *
 * Used by `kvxfer-perf trace` and `kvxfer-perf plan`. Not thread-safe per object; the
 * functions keep no global state.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Bytes per KV element: every model is replayed with a bf16 KV cache. */
#define PERF_MODEL_ELEM_BYTES 2u
/** Longest model name kept, including the NUL. */
#define PERF_MODEL_NAME_MAX 64

/** One row of models.csv, with the layout derived from it. */
struct perf_model {
	char name[PERF_MODEL_NAME_MAX]; /**< `model` column, e.g. "Llama-3.1-8B". */
	uint32_t num_layers;            /**< Attention layers (num_hidden_layers). */
	uint32_t num_kv_heads;          /**< KV heads (config value; not used for MLA sizes). */
	uint32_t head_dim;              /**< Head dimension, elements (not used for MLA sizes). */
	uint32_t mla_latent_dim;        /**< MLA latent elements per token; 0 = not MLA. */
	uint32_t attention_chunk_size;  /**< Chunked-attention window, tokens; 0 = full attention. */
	bool mla;                       /**< true: one latent plane per layer; false: split K/V. */
	uint32_t planes;                /**< Regions per layer: 2 (K, V) or 1 (MLA latent). */
	uint32_t token_bytes_per_plane; /**< Bytes per token per plane per layer (bf16). */
};

/**
 * Load every row of a models.csv file.
 *
 * The header must be exactly the 9 columns of bench/data/models.csv. Each row must have a
 * unique name, positive layer/head/dim counts, and computed columns that match the layout
 * rules above. The `source` column may itself contain commas (the first 6 and last 2 fields
 * are taken from the two ends of the line).
 *
 * @param path       File to read; not NULL.
 * @param[out] out   On success, a malloc'ed Array[*n] of models; free with free().
 * @param[out] n     On success, the number of rows (>= 1).
 * @param[out] err   Array[errlen]; on failure holds "FILE:LINE: what is wrong" (NUL-terminated).
 * @param errlen     Size of @p err in bytes (may be 0 when @p err is NULL).
 * @retval 0         Success.
 * @retval -ENOENT   The file cannot be opened (also any other errno from fopen, negated).
 * @retval -EINVAL   Malformed header, row, number, or inconsistent computed column.
 * @retval -ENOMEM   Allocation failed.
 */
int perf_models_load(const char *path, struct perf_model **out, size_t *n, char *err,
		     size_t errlen);

/**
 * Load models.csv and return the row whose name is @p name (exact, case-sensitive).
 *
 * @param path      File to read; not NULL.
 * @param name      Model name; not NULL.
 * @param[out] out  On success, the model.
 * @param[out] err  Array[errlen]; on failure the reason; an unknown name lists the known ones.
 * @param errlen    Size of @p err in bytes.
 * @retval 0        Success.
 * @retval -ENOENT  No such file, or no row named @p name.
 * @retval -EINVAL  Malformed file (see perf_models_load()).
 * @retval -ENOMEM  Allocation failed.
 */
int perf_model_find(const char *path, const char *name, struct perf_model *out, char *err,
		    size_t errlen);

/**
 * Bytes of one block in one plane of one layer (the `block_len` of docs/protocol.md §4.2).
 *
 * @param m             Model; not NULL.
 * @param block_tokens  Tokens per KV block, >= 1.
 * @return              block_tokens * token_bytes_per_plane.
 */
uint64_t perf_model_block_len(const struct perf_model *m, uint32_t block_tokens);

/**
 * Bytes of one block across every plane and layer (what one block costs in a pool).
 *
 * @param m             Model; not NULL.
 * @param block_tokens  Tokens per KV block, >= 1.
 * @return              block_len * planes * num_layers.
 */
uint64_t perf_model_block_bytes(const struct perf_model *m, uint32_t block_tokens);

/**
 * Number of KV blocks holding @p tokens tokens (the last block may be partial).
 *
 * @param tokens        Prompt tokens, >= 0.
 * @param block_tokens  Tokens per block, >= 1.
 * @return              ceil(tokens / block_tokens).
 */
uint64_t perf_model_blocks_for_tokens(uint64_t tokens, uint32_t block_tokens);

#endif /* KVX_BENCH_MODELS_H */
