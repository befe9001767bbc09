/* SPDX-License-Identifier: Apache-2.0 */
/* Trace loader: Mooncake JSONL (jansson) and Azure LLM 2023 CSV (see trace_load.h). */
#include "trace_load.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define AZURE_HEADER "TIMESTAMP,ContextTokens,GeneratedTokens"

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

const char *perf_trace_format_name(enum perf_trace_format f)
{
	switch (f) {
	case PERF_TRACE_MOONCAKE:
		return "mooncake-jsonl";
	case PERF_TRACE_AZURE:
		return "azure-csv";
	}
	return "unknown";
}

void perf_trace_destroy(struct perf_trace *t)
{
	if (!t)
		return;
	free(t->reqs);
	free(t->hash_ids);
	free(t);
}

struct loader {
	const char *path;
	struct perf_trace *t;
	size_t cap_reqs, cap_hash;
	char *err;
	size_t errlen;
};

static int push_req(struct loader *ld, const struct perf_trace_req *r)
{
	struct perf_trace *t = ld->t;
	if (t->n == ld->cap_reqs) {
		size_t ncap = ld->cap_reqs ? ld->cap_reqs * 2 : 1024;
		struct perf_trace_req *nv = realloc(t->reqs, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		t->reqs = nv;
		ld->cap_reqs = ncap;
	}
	t->reqs[t->n++] = *r;
	return 0;
}

static int reserve_hash(struct loader *ld, size_t more)
{
	struct perf_trace *t = ld->t;
	if (t->n_hash_ids + more <= ld->cap_hash)
		return 0;
	size_t ncap = ld->cap_hash ? ld->cap_hash : 4096;
	while (ncap < t->n_hash_ids + more)
		ncap *= 2;
	uint64_t *nv = realloc(t->hash_ids, ncap * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	t->hash_ids = nv;
	ld->cap_hash = ncap;
	return 0;
}

/* A JSON integer in [lo, hi] (a real with an integral value is accepted too). */
static int json_get_int(struct loader *ld, unsigned lineno, json_t *obj, const char *key,
			long long lo, long long hi, long long *v)
{
	json_t *j = json_object_get(obj, key);
	if (!j) {
		seterr(ld->err, ld->errlen, "%s:%u: field '%s' is missing", ld->path, lineno, key);
		return -EINVAL;
	}
	long long x;
	if (json_is_integer(j)) {
		x = json_integer_value(j);
	} else if (json_is_real(j)) {
		double d = json_real_value(j);
		if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi) {
			seterr(ld->err, ld->errlen, "%s:%u: field '%s': %g is not an integer in [%lld, %lld]",
			       ld->path, lineno, key, d, lo, hi);
			return -EINVAL;
		}
		x = (long long)d;
	} else {
		seterr(ld->err, ld->errlen, "%s:%u: field '%s' is not a number", ld->path, lineno, key);
		return -EINVAL;
	}
	if (x < lo || x > hi) {
		seterr(ld->err, ld->errlen, "%s:%u: field '%s': %lld is outside [%lld, %lld]", ld->path,
		       lineno, key, x, lo, hi);
		return -EINVAL;
	}
	*v = x;
	return 0;
}

static int mooncake_line(struct loader *ld, unsigned lineno, const char *line, size_t len,
			 uint64_t *prev_ms)
{
	json_error_t je;
	json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		seterr(ld->err, ld->errlen, "%s:%u: invalid JSON at column %d: %s", ld->path, lineno,
		       je.column, je.text);
		return -EINVAL;
	}
	int rc = -EINVAL;
	long long ts, in, outl;
	if (!json_is_object(root)) {
		seterr(ld->err, ld->errlen, "%s:%u: line is not a JSON object", ld->path, lineno);
		goto out;
	}
	if (json_get_int(ld, lineno, root, "timestamp", 0, (long long)(UINT64_MAX / 1000000u / 2), &ts) ||
	    json_get_int(ld, lineno, root, "input_length", 1, UINT32_MAX, &in) ||
	    json_get_int(ld, lineno, root, "output_length", 0, UINT32_MAX, &outl))
		goto out;
	json_t *h = json_object_get(root, "hash_ids");
	if (!h || !json_is_array(h)) {
		seterr(ld->err, ld->errlen, "%s:%u: field 'hash_ids' is %s", ld->path, lineno,
		       h ? "not an array" : "missing");
		goto out;
	}
	size_t nh = json_array_size(h);
	size_t want = ((size_t)in + PERF_TRACE_HASH_BLOCK_TOKENS - 1) / PERF_TRACE_HASH_BLOCK_TOKENS;
	if (nh != want) {
		seterr(ld->err, ld->errlen,
		       "%s:%u: field 'hash_ids' has %zu ids but input_length %lld needs %zu (512-token blocks)",
		       ld->path, lineno, nh, in, want);
		goto out;
	}
	if ((uint64_t)ts < *prev_ms) {
		seterr(ld->err, ld->errlen,
		       "%s:%u: field 'timestamp': %lld ms is earlier than the previous record's %" PRIu64 " ms",
		       ld->path, lineno, ts, *prev_ms);
		goto out;
	}
	if ((rc = reserve_hash(ld, nh)))
		goto out;
	struct perf_trace *t = ld->t;
	for (size_t i = 0; i < nh; i++) {
		json_t *e = json_array_get(h, i);
		if (!json_is_integer(e) || json_integer_value(e) < 0) {
			seterr(ld->err, ld->errlen, "%s:%u: field 'hash_ids'[%zu] is not a non-negative integer",
			       ld->path, lineno, i);
			rc = -EINVAL;
			goto out;
		}
		t->hash_ids[t->n_hash_ids + i] = (uint64_t)json_integer_value(e);
	}
	struct perf_trace_req r = {
		.arrival_ns = (uint64_t)ts * 1000000u,
		.input_tokens = (uint32_t)in,
		.output_tokens = (uint32_t)outl,
		.hash_off = t->n_hash_ids,
		.n_hash = (uint32_t)nh,
		.line = lineno,
	};
	if ((rc = push_req(ld, &r)))
		goto out;
	t->n_hash_ids += nh;
	*prev_ms = (uint64_t)ts;
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
	y -= m <= 2;
	int64_t era = (y >= 0 ? y : y - 399) / 400;
	unsigned yoe = (unsigned)(y - era * 400);
	unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (int64_t)doe - 719468;
}

static int digits(const char *s, int n, unsigned *v)
{
	unsigned x = 0;
	for (int i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		x = x * 10 + (unsigned)(s[i] - '0');
	}
	*v = x;
	return 0;
}

int perf_trace_parse_azure_time(const char *s, uint64_t *ns)
{
	static const unsigned mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	unsigned y, mo, d, h, mi, sec;
	if (strlen(s) < 19 || digits(s, 4, &y) || s[4] != '-' || digits(s + 5, 2, &mo) ||
	    s[7] != '-' || digits(s + 8, 2, &d) || s[10] != ' ' || digits(s + 11, 2, &h) ||
	    s[13] != ':' || digits(s + 14, 2, &mi) || s[16] != ':' || digits(s + 17, 2, &sec))
		return -EINVAL;
	if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 ||
	    sec > 60)
		return -EINVAL;
	bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	if (mo == 2 && d == 29 && !leap)
		return -EINVAL;
	uint64_t frac_ns = 0;
	const char *p = s + 19;
	if (*p == '.') {
		p++;
		int n = 0;
		uint64_t scale = 100000000u;
		while (p[n] >= '0' && p[n] <= '9') {
			if (n == 9)
				return -EINVAL;
			frac_ns += (uint64_t)(p[n] - '0') * scale;
			scale /= 10;
			n++;
		}
		if (n == 0)
			return -EINVAL;
		p += n;
	}
	if (*p)
		return -EINVAL;
	int64_t days = days_from_civil(y, mo, d);
	uint64_t secs = (uint64_t)days * 86400u + h * 3600u + mi * 60u + sec;
	*ns = secs * 1000000000u + frac_ns;
	return 0;
}

static int parse_count(const char *s, uint64_t max, uint64_t *v)
{
	if (!*s)
		return -EINVAL;
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

static int azure_line(struct loader *ld, unsigned lineno, char *line, uint64_t *first_ns,
		      uint64_t *prev_ns)
{
	char *f[3];
	size_t nf = 0;
	for (char *p = line;; nf++) {
		if (nf == 3) {
			seterr(ld->err, ld->errlen, "%s:%u: more than 3 fields", ld->path, lineno);
			return -EINVAL;
		}
		f[nf] = p;
		char *c = strchr(p, ',');
		if (!c) {
			nf++;
			break;
		}
		*c = '\0';
		p = c + 1;
	}
	if (nf != 3) {
		seterr(ld->err, ld->errlen, "%s:%u: %zu fields, expected 3 (TIMESTAMP,ContextTokens,GeneratedTokens)",
		       ld->path, lineno, nf);
		return -EINVAL;
	}
	uint64_t ts, ctx, gen;
	if (perf_trace_parse_azure_time(f[0], &ts)) {
		seterr(ld->err, ld->errlen, "%s:%u: field 'TIMESTAMP': '%s' is not YYYY-MM-DD HH:MM:SS.fffffff",
		       ld->path, lineno, f[0]);
		return -EINVAL;
	}
	if (parse_count(f[1], UINT32_MAX, &ctx) || ctx == 0) {
		seterr(ld->err, ld->errlen, "%s:%u: field 'ContextTokens': '%s' is not a positive integer",
		       ld->path, lineno, f[1]);
		return -EINVAL;
	}
	if (parse_count(f[2], UINT32_MAX, &gen)) {
		seterr(ld->err, ld->errlen, "%s:%u: field 'GeneratedTokens': '%s' is not a non-negative integer",
		       ld->path, lineno, f[2]);
		return -EINVAL;
	}
	if (ld->t->n == 0)
		*first_ns = *prev_ns = ts;
	if (ts < *prev_ns) {
		seterr(ld->err, ld->errlen, "%s:%u: field 'TIMESTAMP': '%s' is earlier than the previous record",
		       ld->path, lineno, f[0]);
		return -EINVAL;
	}
	*prev_ns = ts;
	struct perf_trace_req r = {
		.arrival_ns = ts - *first_ns,
		.input_tokens = (uint32_t)ctx,
		.output_tokens = (uint32_t)gen,
		.line = lineno,
	};
	return push_req(ld, &r);
}

int perf_trace_load(const char *path, size_t max_requests, struct perf_trace **out, char *err,
		    size_t errlen)
{
	FILE *fp = fopen(path, "r");
	if (!fp) {
		int e = errno;
		seterr(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	struct perf_trace *t = calloc(1, sizeof(*t));
	if (!t) {
		fclose(fp);
		return -ENOMEM;
	}
	struct loader ld = {.path = path, .t = t, .err = err, .errlen = errlen};
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	unsigned lineno = 0;
	uint64_t prev_ms = 0, first_ns = 0, prev_ns = 0, base_ms = 0;
	int rc = 0;
	while ((max_requests == 0 || t->n < max_requests) && (len = getline(&line, &cap, fp)) >= 0) {
		lineno++;
		if (len && line[len - 1] == '\n')
			line[--len] = '\0';
		if (len && line[len - 1] == '\r')
			line[--len] = '\0';
		if ((size_t)len != strlen(line)) {
			seterr(err, errlen, "%s:%u: NUL byte in line", path, lineno);
			rc = -EINVAL;
			break;
		}
		if (lineno == 1) {
			if (line[0] == '{') {
				t->format = PERF_TRACE_MOONCAKE;
				t->has_hash_ids = true;
			} else if (!strcmp(line, AZURE_HEADER)) {
				t->format = PERF_TRACE_AZURE;
				continue;
			} else {
				seterr(err, errlen,
				       "%s:1: unknown trace format (expected a Mooncake JSONL object or the CSV header '%s')",
				       path, AZURE_HEADER);
				rc = -EINVAL;
				break;
			}
		}
		if (len == 0) {
			seterr(err, errlen, "%s:%u: empty line", path, lineno);
			rc = -EINVAL;
			break;
		}
		if (t->format == PERF_TRACE_MOONCAKE)
			rc = mooncake_line(&ld, lineno, line, (size_t)len, &prev_ms);
		else
			rc = azure_line(&ld, lineno, line, &first_ns, &prev_ns);
		if (rc)
			break;
		if (t->format == PERF_TRACE_MOONCAKE && t->n == 1)
			base_ms = prev_ms;
	}
	if (!rc && ferror(fp)) {
		seterr(err, errlen, "%s: read error", path);
		rc = -EIO;
	}
	if (!rc && t->n == 0) {
		seterr(err, errlen, "%s:%u: no requests in trace", path, lineno ? lineno : 1);
		rc = -EINVAL;
	}
	free(line);
	fclose(fp);
	if (rc) {
		perf_trace_destroy(t);
		return rc;
	}
	/* Replay starts at the first record: make Mooncake arrivals relative to it, like Azure's. */
	for (size_t i = 0; i < t->n && t->format == PERF_TRACE_MOONCAKE; i++)
		t->reqs[i].arrival_ns -= base_ms * 1000000u;
	*out = t;
	return 0;
}
