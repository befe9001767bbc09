/* SPDX-License-Identifier: Apache-2.0 */
/* models.csv parser and KV geometry (see models.h). */
#include "models.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/common.h"

#define MODELS_HEADER                                                                        \
	"model,num_layers,num_kv_heads,head_dim,mla_latent_dim,attention_chunk_size,source,"     \
	"bytes_per_token_per_layer_bf16,kv_bytes_per_block16_all_layers_bf16"
#define MODELS_NFIELDS 9
#define MODELS_LINE_MAX 8192

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Parse a decimal field into *v. Empty is allowed only when allow_empty (gives 0). */
static int parse_u32(const char *s, bool allow_empty, uint64_t max, uint64_t *v)
{
	if (!*s) {
		*v = 0;
		return allow_empty ? 0 : -EINVAL;
	}
	uint64_t x = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		x = x * 10 + (uint64_t)(*p - '0');
		if (x > max)
			return -EINVAL;
	}
	*v = x;
	return 0;
}

static int parse_row(char *line, const char *path, unsigned lineno, struct perf_model *m,
		     char *err, size_t errlen)
{
	static const char *const names[MODELS_NFIELDS] = {
		"model", "num_layers", "num_kv_heads", "head_dim", "mla_latent_dim",
		"attention_chunk_size", "source", "bytes_per_token_per_layer_bf16",
		"kv_bytes_per_block16_all_layers_bf16"};
	char *f[64];
	size_t nf = 0;
	for (char *p = line;;) {
		if (nf == KVX_ARRAY_SIZE(f)) {
			seterr(err, errlen, "%s:%u: too many fields", path, lineno);
			return -EINVAL;
		}
		f[nf++] = p;
		char *c = strchr(p, ',');
		if (!c)
			break;
		*c = '\0';
		p = c + 1;
	}
	if (nf < MODELS_NFIELDS) {
		seterr(err, errlen, "%s:%u: %zu fields, expected %d", path, lineno, nf, MODELS_NFIELDS);
		return -EINVAL;
	}
	/* The free-text source (field 6) may contain commas: the last two fields are the computed
	 * columns, counted from the end. */
	char *computed[2] = {f[nf - 2], f[nf - 1]};
	for (size_t i = 0; i < nf; i++) {
		if (f[i][0] == '"') {
			seterr(err, errlen, "%s:%u: quoted CSV fields are not supported", path, lineno);
			return -EINVAL;
		}
	}
	memset(m, 0, sizeof(*m));
	size_t nlen = strlen(f[0]);
	if (nlen == 0 || nlen >= sizeof(m->name)) {
		seterr(err, errlen, "%s:%u: field 'model': name empty or longer than %zu bytes",
		       path, lineno, sizeof(m->name) - 1);
		return -EINVAL;
	}
	memcpy(m->name, f[0], nlen + 1);
	uint64_t v[MODELS_NFIELDS] = {0};
	for (int i = 1; i < MODELS_NFIELDS; i++) {
		if (i == 6)
			continue;
		const char *s = i < 6 ? f[i] : computed[i - 7];
		bool opt = (i == 4 || i == 5);
		uint64_t max = i >= 7 ? UINT64_MAX / 16 : 1u << 20;
		if (parse_u32(s, opt, max, &v[i]) || (!opt && v[i] == 0)) {
			seterr(err, errlen, "%s:%u: field '%s': '%s' is not a %s integer", path,
			       lineno, names[i], s, opt ? "non-negative" : "positive");
			return -EINVAL;
		}
	}
	m->num_layers = (uint32_t)v[1];
	m->num_kv_heads = (uint32_t)v[2];
	m->head_dim = (uint32_t)v[3];
	m->mla_latent_dim = (uint32_t)v[4];
	m->attention_chunk_size = (uint32_t)v[5];
	m->mla = m->mla_latent_dim != 0;
	m->planes = m->mla ? 1 : 2;
	m->token_bytes_per_plane = m->mla ? m->mla_latent_dim * PERF_MODEL_ELEM_BYTES
					  : m->num_kv_heads * m->head_dim * PERF_MODEL_ELEM_BYTES;
	uint64_t per_token_layer = (uint64_t)m->token_bytes_per_plane * m->planes;
	if (v[7] != per_token_layer) {
		seterr(err, errlen,
		       "%s:%u: field 'bytes_per_token_per_layer_bf16' is %" PRIu64
		       " but the %s layout gives %" PRIu64,
		       path, lineno, v[7], m->mla ? "MLA" : "split K/V", per_token_layer);
		return -EINVAL;
	}
	if (v[8] != perf_model_block_bytes(m, 16)) {
		seterr(err, errlen,
		       "%s:%u: field 'kv_bytes_per_block16_all_layers_bf16' is %" PRIu64
		       " but the layout gives %" PRIu64,
		       path, lineno, v[8], perf_model_block_bytes(m, 16));
		return -EINVAL;
	}
	return 0;
}

int perf_models_load(const char *path, struct perf_model **out, size_t *n, char *err,
		     size_t errlen)
{
	FILE *fp = fopen(path, "r");
	if (!fp) {
		int e = errno;
		seterr(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	char *line = malloc(MODELS_LINE_MAX);
	struct perf_model *v = NULL;
	size_t cnt = 0, cap = 0;
	unsigned lineno = 0;
	int rc = 0;
	if (!line) {
		rc = -ENOMEM;
		goto out;
	}
	while (fgets(line, MODELS_LINE_MAX, fp)) {
		lineno++;
		size_t len = strlen(line);
		if (len && line[len - 1] == '\n')
			line[--len] = '\0';
		else if (!feof(fp)) {
			seterr(err, errlen, "%s:%u: line longer than %d bytes", path, lineno,
			       MODELS_LINE_MAX - 2);
			rc = -EINVAL;
			goto out;
		}
		if (len && line[len - 1] == '\r')
			line[--len] = '\0';
		if (lineno == 1) {
			if (strcmp(line, MODELS_HEADER)) {
				seterr(err, errlen, "%s:1: header is not '%s'", path, MODELS_HEADER);
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		if (len == 0) {
			seterr(err, errlen, "%s:%u: empty line", path, lineno);
			rc = -EINVAL;
			goto out;
		}
		if (cnt == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			struct perf_model *nv = realloc(v, ncap * sizeof(*nv));
			if (!nv) {
				rc = -ENOMEM;
				goto out;
			}
			v = nv;
			cap = ncap;
		}
		rc = parse_row(line, path, lineno, &v[cnt], err, errlen);
		if (rc)
			goto out;
		for (size_t i = 0; i < cnt; i++) {
			if (!strcmp(v[i].name, v[cnt].name)) {
				seterr(err, errlen, "%s:%u: duplicate model '%s'", path, lineno,
				       v[cnt].name);
				rc = -EINVAL;
				goto out;
			}
		}
		cnt++;
	}
	if (ferror(fp)) {
		seterr(err, errlen, "%s: read error", path);
		rc = -EIO;
	} else if (lineno == 0) {
		seterr(err, errlen, "%s:1: empty file (no header)", path);
		rc = -EINVAL;
	} else if (cnt == 0) {
		seterr(err, errlen, "%s: no model rows", path);
		rc = -EINVAL;
	}
out:
	fclose(fp);
	free(line);
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}

int perf_model_find(const char *path, const char *name, struct perf_model *out, char *err,
		    size_t errlen)
{
	struct perf_model *v;
	size_t n;
	int rc = perf_models_load(path, &v, &n, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].name, name)) {
			*out = v[i];
			free(v);
			return 0;
		}
	}
	char known[1024] = "";
	size_t off = 0;
	for (size_t i = 0; i < n && off < sizeof(known); i++)
		off += (size_t)snprintf(known + off, sizeof(known) - off, "%s%s", i ? ", " : "",
					v[i].name);
	seterr(err, errlen, "%s: no model named '%s' (known: %s)", path, name, known);
	free(v);
	return -ENOENT;
}

uint64_t perf_model_block_len(const struct perf_model *m, uint32_t block_tokens)
{
	return (uint64_t)block_tokens * m->token_bytes_per_plane;
}

uint64_t perf_model_block_bytes(const struct perf_model *m, uint32_t block_tokens)
{
	return perf_model_block_len(m, block_tokens) * m->planes * m->num_layers;
}

uint64_t perf_model_blocks_for_tokens(uint64_t tokens, uint32_t block_tokens)
{
	return (tokens + block_tokens - 1) / block_tokens;
}
