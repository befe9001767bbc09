/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "helpers.h"
#include "models.h"

#define MODELS KVX_BENCH_DATA_DIR "/models.csv"
#define HDR "model,num_layers,num_kv_heads,head_dim,mla_latent_dim,attention_chunk_size,source," \
	    "bytes_per_token_per_layer_bf16,kv_bytes_per_block16_all_layers_bf16\n"

TestSuite(bench_models, .timeout = 30.0);

Test(bench_models, load_real_file_returns_all_seven_rows)
{
	struct perf_model *v;
	size_t n;
	char err[256] = "";
	cr_assert_eq(perf_models_load(MODELS, &v, &n, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(n, 7);
	cr_assert_str_eq(v[0].name, "Llama-3.1-8B");
	cr_assert_str_eq(v[6].name, "Llama-4-Scout-17B-16E-Instruct");
	cr_assert_eq(v[6].attention_chunk_size, 8192);
	free(v);
}

Test(bench_models, llama_8b_is_split_kv_with_32k_block_len)
{
	struct perf_model m;
	char err[256] = "";
	cr_assert_eq(perf_model_find(MODELS, "Llama-3.1-8B", &m, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(m.num_layers, 32);
	cr_assert_eq(m.num_kv_heads, 8);
	cr_assert_eq(m.head_dim, 128);
	cr_assert(!m.mla);
	cr_assert_eq(m.planes, 2);
	cr_assert_eq(m.token_bytes_per_plane, 2048);
	cr_assert_eq(perf_model_block_len(&m, 16), 32768);
	cr_assert_eq(perf_model_block_bytes(&m, 16), 2097152);
	cr_assert_eq(perf_model_block_bytes(&m, 32), 4194304);
}

Test(bench_models, deepseek_v3_is_one_mla_latent_plane)
{
	struct perf_model m;
	char err[256] = "";
	cr_assert_eq(perf_model_find(MODELS, "DeepSeek-V3", &m, err, sizeof(err)), 0, "%s", err);
	cr_assert(m.mla);
	cr_assert_eq(m.planes, 1);
	cr_assert_eq(m.num_layers, 61);
	cr_assert_eq(m.mla_latent_dim, 576);
	cr_assert_eq(m.token_bytes_per_plane, 1152);
	cr_assert_eq(perf_model_block_len(&m, 16), 18432);
	cr_assert_eq(perf_model_block_bytes(&m, 16), 1124352);
}

Test(bench_models, unknown_name_returns_enoent_and_lists_known)
{
	struct perf_model m;
	char err[512] = "";
	cr_assert_eq(perf_model_find(MODELS, "GPT-5", &m, err, sizeof(err)), -ENOENT);
	cr_assert(strstr(err, "no model named 'GPT-5'"), "%s", err);
	cr_assert(strstr(err, "DeepSeek-V3"), "%s", err);
}

Test(bench_models, missing_file_returns_enoent)
{
	struct perf_model *v;
	size_t n;
	char err[256] = "";
	cr_assert_eq(perf_models_load("/nonexistent/models.csv", &v, &n, err, sizeof(err)), -ENOENT);
	cr_assert(strstr(err, "/nonexistent/models.csv"), "%s", err);
}

static void expect_bad(const char *content, const char *want_line, const char *want_text)
{
	char path[64], err[512] = "", want[128];
	tmpfile_with(path, sizeof(path), ".csv", content);
	struct perf_model *v = NULL;
	size_t n = 0;
	int rc = perf_models_load(path, &v, &n, err, sizeof(err));
	unlink(path);
	cr_assert_eq(rc, -EINVAL, "%s", err);
	snprintf(want, sizeof(want), "%s:%s:", path, want_line);
	cr_assert(strstr(err, want), "'%s' lacks '%s'", err, want);
	cr_assert(strstr(err, want_text), "'%s' lacks '%s'", err, want_text);
}

Test(bench_models, wrong_computed_column_names_file_line_and_field)
{
	expect_bad(HDR "A,32,8,128,,,src,4096,2097152\nB,32,8,128,,,src,4000,2097152\n", "3",
		   "bytes_per_token_per_layer_bf16");
}

Test(bench_models, wrong_block_column_is_rejected)
{
	expect_bad(HDR "A,61,128,128,576,,src,1152,1124353\n", "2", "kv_bytes_per_block16");
}

Test(bench_models, bad_header_is_rejected)
{
	expect_bad("model,layers\nA,1\n", "1", "header");
}

Test(bench_models, non_numeric_and_zero_fields_are_rejected)
{
	expect_bad(HDR "A,3x,8,128,,,src,4096,2097152\n", "2", "num_layers");
	expect_bad(HDR "A,32,0,128,,,src,0,0\n", "2", "num_kv_heads");
	expect_bad(HDR "A,32,8,128\n", "2", "fields");
	expect_bad(HDR "A,32,8,128,,,src,4096,2097152\n\n", "3", "empty line");
}

Test(bench_models, duplicate_name_is_rejected)
{
	expect_bad(HDR "A,32,8,128,,,src,4096,2097152\nA,32,8,128,,,src,4096,2097152\n", "3",
		   "duplicate");
}

Test(bench_models, source_with_commas_is_accepted)
{
	char path[64], err[256] = "";
	tmpfile_with(path, sizeof(path), ".csv", HDR "A,32,8,128,,,a, b, c,4096,2097152\n");
	struct perf_model *v;
	size_t n;
	int rc = perf_models_load(path, &v, &n, err, sizeof(err));
	unlink(path);
	cr_assert_eq(rc, 0, "%s", err);
	cr_assert_eq(n, 1);
	cr_assert_eq(v[0].num_layers, 32);
	free(v);
}

Test(bench_models, blocks_for_tokens_rounds_up)
{
	cr_assert_eq(perf_model_blocks_for_tokens(0, 16), 0);
	cr_assert_eq(perf_model_blocks_for_tokens(1, 16), 1);
	cr_assert_eq(perf_model_blocks_for_tokens(16, 16), 1);
	cr_assert_eq(perf_model_blocks_for_tokens(6758, 16), 423);
}
