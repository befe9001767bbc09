/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers of kvxfer-perf: JSON writer, sample statistics, option parsing, topology. */
#include "perf_util.h"
#include "kvxfer/lcore.h"

#include <errno.h>
#include <math.h>
#include <numa.h>
#include <sched.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvx_perf_version.h"

#ifndef KVX_BENCH_DATA_DIR
#define KVX_BENCH_DATA_DIR "bench/data"
#endif

/* The real stdout after perf_stdout_claim() (printf then goes to stderr), else NULL. */
static FILE *g_result_out;

int perf_stdout_claim(void)
{
	if (g_result_out)
		return 0;
	fflush(stdout);
	int fd = dup(STDOUT_FILENO);
	if (fd < 0)
		return -errno;
	FILE *f = fdopen(fd, "w");
	if (!f) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
		int rc = -errno;
		fclose(f);
		return rc;
	}
	g_result_out = f;
	return 0;
}

FILE *perf_out_open(const char *path)
{
	if (!strcmp(path, "-"))
		return g_result_out ? g_result_out : stdout;
	return fopen(path, "w");
}

int perf_out_close(FILE *f)
{
	if (!f)
		return 0;
	if (f == g_result_out || f == stdout)
		return fflush(f) || ferror(f) ? -EIO : 0;
	bool bad = ferror(f) != 0;
	return fclose(f) || bad ? -EIO : 0;
}

int perf_check_gnuplot(const char *sub, const char *plot)
{
	if (!plot)
		return 0;
	const char *path = getenv("PATH");
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path && path[0] ? path : "/usr/bin:/bin");
	for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		char exe[4352];
		snprintf(exe, sizeof(exe), "%s/gnuplot", dir[0] ? dir : ".");
		if (access(exe, X_OK) == 0)
			return 0;
	}
	fprintf(stderr, "kvxfer-perf %s: --plot %s needs gnuplot, which is not on PATH (install "
			"gnuplot-nox, or drop --plot)\n", sub, plot);
	return 2;
}

const char *perf_version(void)
{
	return KVX_PERF_VERSION;
}

const char *perf_commit(void)
{
	return KVX_PERF_COMMIT[0] ? KVX_PERF_COMMIT : "unknown";
}

static bool file_exists(const char *dir, const char *name)
{
	char p[PATH_MAX];
	struct stat st;
	return snprintf(p, sizeof(p), "%s/%s", dir, name) < (int)sizeof(p) && !stat(p, &st) &&
	       S_ISREG(st.st_mode);
}

const char *perf_data_dir(void)
{
	static char dir[PATH_MAX];
	if (dir[0])
		return dir;
	const char *env = getenv("KVX_PERF_DATA_DIR");
	if (env && *env) {
		snprintf(dir, sizeof(dir), "%s", env);
		return dir;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash) {
			*slash = '\0';
			char cand[PATH_MAX];
			if (snprintf(cand, sizeof(cand), "%s/../share/kvxfer", exe) < (int)sizeof(cand) &&
			    file_exists(cand, "models.csv")) {
				/* Print the canonical path: it appears in help texts and summaries. */
				if (!realpath(cand, dir))
					snprintf(dir, sizeof(dir), "%s", cand);
				return dir;
			}
		}
	}
	snprintf(dir, sizeof(dir), "%s", KVX_BENCH_DATA_DIR);
	return dir;
}

const char *perf_data_path(const char *rel)
{
	/* Kept in a global table: reachable until exit (no leak report), a handful per run. */
	static char *paths[16];
	static unsigned n;
	const char *d = perf_data_dir();
	for (unsigned i = 0; i < n; i++)
		if (!strncmp(paths[i], d, strlen(d)) && !strcmp(paths[i] + strlen(d) + 1, rel))
			return paths[i];
	size_t len = strlen(d) + 1 + strlen(rel) + 1;
	char *p = malloc(len);
	if (!p || n == sizeof(paths) / sizeof(paths[0]))
		abort();
	snprintf(p, len, "%s/%s", d, rel);
	paths[n++] = p;
	return p;
}

int perf_json_open(struct perf_json *j, const char *path)
{
	memset(j, 0, sizeof(*j));
	if (!path)
		return 0;
	if (!strcmp(path, "-")) {
		j->f = perf_out_open("-");
	} else {
		j->f = fopen(path, "w");
		if (!j->f)
			return -errno;
		j->own = true;
	}
	fputc('{', j->f);
	j->depth = 1;
	j->first[1] = true;
	return 0;
}

int perf_json_close(struct perf_json *j)
{
	if (!j->f)
		return 0;
	if (j->depth != 1)
		j->err = true;
	fputs("}\n", j->f);
	if (ferror(j->f))
		j->err = true;
	if (j->own) {
		if (fclose(j->f))
			j->err = true;
	} else {
		fflush(j->f);
	}
	j->f = NULL;
	return j->err ? -EIO : 0;
}

static void put_escaped(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Comma, newline + indent, and "key": before a member. */
static bool member(struct perf_json *j, const char *key)
{
	if (!j->f)
		return false;
	if (!j->first[j->depth])
		fputc(',', j->f);
	j->first[j->depth] = false;
	fputc('\n', j->f);
	for (int i = 0; i < j->depth; i++)
		fputs("  ", j->f);
	if (key) {
		put_escaped(j->f, key);
		fputs(": ", j->f);
	}
	return true;
}

static void open_nested(struct perf_json *j, const char *key, char c)
{
	if (!member(j, key))
		return;
	fputc(c, j->f);
	if (j->depth + 1 >= PERF_JSON_MAX_DEPTH) {
		j->err = true;
		return;
	}
	j->first[++j->depth] = true;
}

static void close_nested(struct perf_json *j, char c)
{
	if (!j->f)
		return;
	if (j->depth <= 1) {
		j->err = true;
		return;
	}
	bool empty = j->first[j->depth];
	j->depth--;
	if (!empty) {
		fputc('\n', j->f);
		for (int i = 0; i < j->depth; i++)
			fputs("  ", j->f);
	}
	fputc(c, j->f);
}

void perf_json_obj_begin(struct perf_json *j, const char *key)
{
	open_nested(j, key, '{');
}

void perf_json_obj_end(struct perf_json *j)
{
	close_nested(j, '}');
}

void perf_json_arr_begin(struct perf_json *j, const char *key)
{
	open_nested(j, key, '[');
}

void perf_json_arr_end(struct perf_json *j)
{
	close_nested(j, ']');
}

void perf_json_str(struct perf_json *j, const char *key, const char *v)
{
	if (!member(j, key))
		return;
	if (v)
		put_escaped(j->f, v);
	else
		fputs("null", j->f);
}

void perf_json_u64(struct perf_json *j, const char *key, uint64_t v)
{
	if (member(j, key))
		fprintf(j->f, "%llu", (unsigned long long)v);
}

void perf_json_i64(struct perf_json *j, const char *key, int64_t v)
{
	if (member(j, key))
		fprintf(j->f, "%lld", (long long)v);
}

void perf_json_double(struct perf_json *j, const char *key, double v)
{
	if (!member(j, key))
		return;
	if (isfinite(v))
		fprintf(j->f, "%.6g", v);
	else
		fputs("null", j->f);
}

void perf_json_bool(struct perf_json *j, const char *key, bool v)
{
	if (member(j, key))
		fputs(v ? "true" : "false", j->f);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

void perf_sort_u64(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
}

uint64_t perf_percentile_u64(const uint64_t *sorted, size_t n, double p)
{
	if (!n)
		return 0;
	if (p <= 0)
		return sorted[0];
	double rank = ceil(p / 100.0 * (double)n);
	size_t idx = rank < 1 ? 0 : (size_t)rank - 1;
	return sorted[idx >= n ? n - 1 : idx];
}

void perf_stats_u64(uint64_t *v, size_t n, struct perf_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->n = n;
	if (!n)
		return;
	perf_sort_u64(v, n);
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += (double)v[i];
	out->min = v[0];
	out->max = v[n - 1];
	out->mean = sum / (double)n;
	out->p50 = perf_percentile_u64(v, n, 50);
	out->p90 = perf_percentile_u64(v, n, 90);
	out->p99 = perf_percentile_u64(v, n, 99);
	out->p999 = perf_percentile_u64(v, n, 99.9);
}

double perf_median_double(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void perf_json_stats(struct perf_json *j, const char *key, const struct perf_stats *s)
{
	perf_json_obj_begin(j, key);
	perf_json_u64(j, "n", s->n);
	perf_json_u64(j, "min", s->min);
	perf_json_u64(j, "p50", s->p50);
	perf_json_u64(j, "p90", s->p90);
	perf_json_u64(j, "p99", s->p99);
	perf_json_u64(j, "p999", s->p999);
	perf_json_u64(j, "max", s->max);
	perf_json_double(j, "mean", s->mean);
	perf_json_obj_end(j);
}

int perf_opt_value(int argc, char **argv, int *i, const char *name, const char **value)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n))
		return 0;
	if (a[n] == '=') {
		*value = a + n + 1;
		return 1;
	}
	if (a[n] != '\0')
		return 0;
	if (*i + 1 >= argc)
		return -EINVAL;
	*value = argv[++*i];
	return 1;
}

int perf_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return -EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	uint64_t mul = 1;
	if (*end == 'k' || *end == 'K')
		mul = 1000, end++;
	else if (*end == 'M')
		mul = 1000000, end++;
	else if (*end == 'G')
		mul = 1000000000, end++;
	if (*end || (v && mul > UINT64_MAX / v))
		return -EINVAL;
	*out = (uint64_t)v * mul;
	return 0;
}

int perf_parse_size(const char *s, uint64_t *out)
{
	char *end;
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	unsigned shift = 0;
	if (*end == 'K' || *end == 'k')
		shift = 10, end++;
	else if (*end == 'M' || *end == 'm')
		shift = 20, end++;
	else if (*end == 'G' || *end == 'g')
		shift = 30, end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

int perf_check_cpu(long cpu, char *err, size_t errlen)
{
	char spec[24];
	struct kvx_lcore_cfg *cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	kvx_lcore_cfg_init(cfg);
	snprintf(spec, sizeof(spec), "%ld", cpu);
	int rc = kvx_lcore_parse_opt(cfg, "--lcores", spec, err, errlen);
	if (rc > 0) {
		cfg->control_mode = KVX_LCORE_CONTROL_NONE;
		rc = kvx_lcore_cfg_validate(cfg, NULL, NULL, err, errlen);
	}
	free(cfg);
	return rc < 0 ? rc : 0;
}

int perf_parse_seconds(const char *s, double *out)
{
	char *end;
	if (!s || !*s)
		return -EINVAL;
	double v = strtod(s, &end);
	if (*end || !(v > 0) || !isfinite(v))
		return -EINVAL;
	*out = v;
	return 0;
}

static int read_int(const char *path)
{
	FILE *f = fopen(path, "re");
	int v = -1;
	if (f) {
		if (fscanf(f, "%d", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

const char *perf_cpu_pair_topology(int a, int b)
{
	if (a == b)
		return "same CPU";
	char p[128];
	if (numa_available() >= 0 && numa_node_of_cpu(a) != numa_node_of_cpu(b))
		return "cross-NUMA";
	snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", a);
	int pa = read_int(p);
	snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", b);
	int pb = read_int(p);
	if (pa >= 0 && pb >= 0 && pa != pb)
		return "cross-package";
	snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/topology/core_id", a);
	int ca = read_int(p);
	snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/topology/core_id", b);
	int cb = read_int(p);
	if (ca >= 0 && ca == cb && pa == pb)
		return "SMT siblings";
	return "cross-core";
}

const struct option perf_px_opts[] = {
	{"transport", required_argument, NULL, 't'},
	{"mode", required_argument, NULL, 'm'},
	{"size", required_argument, NULL, 's'},
	{"all", no_argument, NULL, 'a'},
	{"iters", required_argument, NULL, 'n'},
	{"duration", required_argument, NULL, 'D'},
	{"qps", required_argument, NULL, PERF_PX_O_QPS},
	{"batch", required_argument, NULL, PERF_PX_O_BATCH},
	{"tx-depth", required_argument, NULL, PERF_PX_O_DEPTH},
	{"chunk", required_argument, NULL, PERF_PX_O_CHUNK},
	{"lcores", required_argument, NULL, 'l'},
	{"port", required_argument, NULL, 'p'},
	{"json", required_argument, NULL, PERF_PX_O_JSON},
	{"output", required_argument, NULL, PERF_PX_O_OUTPUT},
	{"local", no_argument, NULL, PERF_PX_O_LOCAL},
	{"peer", required_argument, NULL, PERF_PX_O_PEER},
	{"mem", required_argument, NULL, PERF_PX_O_MEM},
	{"plot", required_argument, NULL, PERF_PX_O_PLOT},
	{"ib-dev", required_argument, NULL, 'd'},
	{"report_gbits", no_argument, NULL, PERF_PX_O_GBITS},
	{"report-gbits", no_argument, NULL, PERF_PX_O_GBITS},
	{"auth-dir", required_argument, NULL, PERF_PX_O_AUTH},
	{"help", no_argument, NULL, 'h'},
	{0, 0, 0, 0},
};

int perf_default_cpu_pair(int *client, int *server)
{
	cpu_set_t set;
	*client = *server = -1;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set))
		return -errno;
	int n = CPU_COUNT(&set), a = -1;
	for (int i = CPU_SETSIZE - 1; i >= 0 && a < 0; i--)
		if (CPU_ISSET(i, &set))
			a = i;
	if (a < 0)
		return -ENODEV;
	/* Rank of a partner CPU: lower is better. */
	static const char *const rank[] = {"cross-core", "cross-package", "cross-NUMA",
					   "SMT siblings"};
	int b = a, best = (int)KVX_ARRAY_SIZE(rank);
	for (int i = a - 1; i >= 0 && best > 0; i--) {
		if (!CPU_ISSET(i, &set))
			continue;
		const char *t = perf_cpu_pair_topology(a, i);
		for (int r = 0; r < best; r++)
			if (!strcmp(t, rank[r])) {
				best = r;
				b = i;
				break;
			}
	}
	*client = a;
	*server = b;
	return n;
}

void perf_cpu_model(char *buf, size_t len)
{
	snprintf(buf, len, "unknown");
	FILE *f = fopen("/proc/cpuinfo", "re");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "model name", 10))
			continue;
		const char *c = strchr(line, ':');
		if (c) {
			c++;
			while (*c == ' ')
				c++;
			snprintf(buf, len, "%s", c);
			buf[strcspn(buf, "\n")] = '\0';
		}
		break;
	}
	fclose(f);
}
