/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_PERF_UTIL_H
#define KVX_BENCH_PERF_UTIL_H
/**
 * @file
 * Shared helpers of kvxfer-perf subcommands (extend here, never fork):
 * - a tiny streaming JSON writer (perf_json_*), for the `--json FILE` convention: every
 *   subcommand accepts `--json FILE` (or `--json=FILE`, `-` = stdout) and writes the same
 *   figures it prints, as one JSON object with a "command" key;
 * - sample statistics (nearest-rank percentiles, mean) on uint64 samples (ns, bytes, ...);
 * - option helpers (perf_opt_value(), perf_parse_u64(), perf_parse_seconds());
 * - topology of a CPU pair (same CPU, SMT siblings, cross-core, cross-package, cross-NUMA)
 *   and the CPU model, which every benchmark prints beside its numbers (docs/style.md §8).
 * Not thread-safe: one owner thread per object.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- JSON writer -------------------------------------------------------------------------- */

/** Maximum nesting of perf_json objects/arrays. */
#define PERF_JSON_MAX_DEPTH 16

/** Streaming JSON writer state (zero-initialise, then perf_json_open()). */
struct perf_json {
	FILE *f;                             /**< Output stream (NULL = writer disabled). */
	bool own;                            /**< f was opened by perf_json_open(). */
	int depth;                           /**< Current nesting depth. */
	bool first[PERF_JSON_MAX_DEPTH];     /**< No member written yet at this depth. */
	bool err;                            /**< A write failed or nesting was misused. */
};

/**
 * Open a JSON output and begin the top-level object.
 * @param j     Writer; not NULL.
 * @param path  File path, "-" for stdout, or NULL to disable (every call becomes a no-op).
 * @return      0 on success, -errno if the file cannot be created.
 */
int perf_json_open(struct perf_json *j, const char *path);
/**
 * End the top-level object, flush and close.
 * @param j  Writer; not NULL.
 * @return   0 on success, -EIO if any write failed or nesting was unbalanced.
 */
int perf_json_close(struct perf_json *j);
/** Begin an object member @p key (NULL inside arrays). @param j Writer. @param key Key or NULL. */
void perf_json_obj_begin(struct perf_json *j, const char *key);
/** End the current object. @param j Writer. */
void perf_json_obj_end(struct perf_json *j);
/** Begin an array member @p key (NULL inside arrays). @param j Writer. @param key Key or NULL. */
void perf_json_arr_begin(struct perf_json *j, const char *key);
/** End the current array. @param j Writer. */
void perf_json_arr_end(struct perf_json *j);
/** String member (escaped; NULL writes null). @param j Writer. @param key Key or NULL. @param v Value. */
void perf_json_str(struct perf_json *j, const char *key, const char *v);
/** Unsigned member. @param j Writer. @param key Key or NULL. @param v Value. */
void perf_json_u64(struct perf_json *j, const char *key, uint64_t v);
/** Signed member. @param j Writer. @param key Key or NULL. @param v Value. */
void perf_json_i64(struct perf_json *j, const char *key, int64_t v);
/** Number member; NaN and infinities are written as null. @param j Writer. @param key Key or NULL.
 *  @param v Value. */
void perf_json_double(struct perf_json *j, const char *key, double v);
/** Boolean member. @param j Writer. @param key Key or NULL. @param v Value. */
void perf_json_bool(struct perf_json *j, const char *key, bool v);

/* ---- output streams, version, data directory --------------------------------------------- */

/**
 * Make `-` (stdout) a clean output for machine-readable results: the process's stdout is kept
 * for them and everything printed with printf()/puts() from now on goes to stderr instead.
 * kvxfer-perf's main() calls it when a subcommand got `--json -`, before the subcommand runs,
 * so `kvxfer-perf CMD --json - | jq .` sees JSON only. Idempotent.
 * @return 0, or -errno if the descriptors cannot be duplicated (stdout left unchanged).
 * @par Thread safety  Call before any thread is started.
 */
int perf_stdout_claim(void);
/**
 * Open a result file: `-` is the real stdout (the stream perf_stdout_claim() kept, else
 * stdout), anything else is created with fopen(path, "w").
 * @param path  File path or "-"; not NULL.
 * @return      The stream, or NULL with errno set.
 */
FILE *perf_out_open(const char *path);
/**
 * Close a stream from perf_out_open(): flush the shared stdout stream, fclose() a file.
 * @param f  Stream; NULL is a no-op returning 0.
 * @return   0, or -EIO if a write or the close failed.
 */
int perf_out_close(FILE *f);
/** Project version ("0.1.0"), from CMake's PROJECT_VERSION. @return Static string. */
const char *perf_version(void);
/** Git commit the binary was built from (short hash, "-dirty" suffix for local changes), or
 *  "unknown" outside a git checkout. @return Static string. */
const char *perf_commit(void);
/**
 * Directory holding kvxfer-perf's data (models.csv, traces/), resolved once:
 * 1. $KVX_PERF_DATA_DIR when set and non-empty;
 * 2. `<dir of the executable>/../share/kvxfer` when it holds models.csv (an installed
 *    kvxfer-perf, any --prefix: the path follows the binary);
 * 3. the source tree's bench/data the binary was built from (running from the build tree).
 * @return Static string, never NULL.
 */
const char *perf_data_dir(void);
/**
 * Path of a data file: perf_data_dir() + "/" + @p rel.
 * @param rel  Relative path, e.g. "models.csv" or "traces/x.jsonl"; not NULL.
 * @return     Heap string kept for the life of the process (the same pointer for the same
 *             @p rel; at most 16 distinct paths), never NULL (aborts on allocation failure).
 */
const char *perf_data_path(const char *rel);

/**
 * --plot draws with gnuplot at the end of a run, so it must be on PATH at the start: check now.
 * @param sub   Subcommand name for the message ("bw", "trace").
 * @param plot  The --plot value, or NULL (nothing to check).
 * @return      0, or 2 (usage error) with a message naming the option and the package.
 */
int perf_check_gnuplot(const char *sub, const char *plot);

/* ---- statistics --------------------------------------------------------------------------- */

/** Summary of a sample set (units are the caller's: ns, bytes ...). */
struct perf_stats {
	size_t n;      /**< Samples. */
	uint64_t min;  /**< Smallest. */
	uint64_t max;  /**< Largest. */
	double mean;   /**< Arithmetic mean. */
	uint64_t p50;  /**< Median (nearest rank). */
	uint64_t p90;  /**< 90th percentile. */
	uint64_t p99;  /**< 99th percentile. */
	uint64_t p999; /**< 99.9th percentile. */
};

/** Sort ascending. @param v Array[n]. @param n Count. */
void perf_sort_u64(uint64_t *v, size_t n);
/**
 * Nearest-rank percentile of sorted samples: the smallest value with at least p% of the
 * samples <= it.
 * @param sorted  Array[n], ascending.
 * @param n       Count (0 returns 0).
 * @param p       Percentile, 0..100.
 * @return        The sample.
 */
uint64_t perf_percentile_u64(const uint64_t *sorted, size_t n, double p);
/** Sort @p v in place and summarise it. @param v Array[n]. @param n Count. @param[out] out Stats. */
void perf_stats_u64(uint64_t *v, size_t n, struct perf_stats *out);
/** Median of doubles (sorts in place). @param v Array[n]. @param n Count >= 1. @return Median. */
double perf_median_double(double *v, size_t n);
/** Write a perf_stats as a JSON object member. @param j Writer. @param key Key.
 *  @param s Stats. */
void perf_json_stats(struct perf_json *j, const char *key, const struct perf_stats *s);

/* ---- options -------------------------------------------------------------------------------- */

/**
 * Match option @p name at argv[*i] in the forms "NAME VALUE" and "NAME=VALUE".
 * @param argc       Argument count.
 * @param argv       Arguments.
 * @param[in,out] i  Index of the argument; advanced past a separate value.
 * @param name       Option name, e.g. "--json".
 * @param[out] value The value.
 * @return           1 matched, 0 not this option, -EINVAL matched but the value is missing.
 */
int perf_opt_value(int argc, char **argv, int *i, const char *name, const char **value);
/** Parse a decimal count with optional k/M/G suffix (x1000). @param s Text. @param[out] out Value.
 *  @return 0, or -EINVAL. */
int perf_parse_u64(const char *s, uint64_t *out);
/** Parse seconds (decimal, > 0). @param s Text. @param[out] out Seconds. @return 0 or -EINVAL. */
int perf_parse_seconds(const char *s, double *out);
/**
 * Parse a byte size or count: decimal digits with an optional binary suffix K, M or G (x1024,
 * any case) and an optional trailing B. No sign, no blanks: "-5" is rejected, not wrapped.
 * @param s        Text; may be NULL (rejected).
 * @param[out] out Value, set only on success.
 * @return 0, or -EINVAL (not a non-negative number, bad suffix, or overflows 64 bits).
 */
int perf_parse_size(const char *s, uint64_t *out);
/**
 * Check that @p cpu can host an lcore here: kvx_lcore_cfg_validate() of the one-lcore list
 * "CPU" (it exists on this host and this process may run on it).
 * @param cpu      CPU number, >= 0.
 * @param[out] err Message naming the lcore and CPU on failure; not NULL.
 * @param errlen   Size of @p err, bytes.
 * @return 0, -EINVAL (message in @p err), or -ENOMEM.
 */
int perf_check_cpu(long cpu, char *err, size_t errlen);

/* ---- options of `kvxfer-perf bw` and `lat` -------------------------------------------------- */

/** getopt_long() values of bw/lat's long-only options (short options use their letter). */
enum perf_px_opt {
	PERF_PX_O_QPS = 256, PERF_PX_O_BATCH, PERF_PX_O_DEPTH, PERF_PX_O_CHUNK, PERF_PX_O_JSON,
	PERF_PX_O_OUTPUT, PERF_PX_O_LOCAL, PERF_PX_O_PEER, PERF_PX_O_MEM, PERF_PX_O_PLOT,
	PERF_PX_O_GBITS, PERF_PX_O_AUTH,
};
/** Short options of bw/lat, for getopt_long(). */
#define PERF_PX_SHORTOPTS "t:m:s:an:D:l:p:d:h"
/** Long options of bw/lat: one table for the parser (perf_bw.c) and the up-front usage check
 *  (perf_lat.c px_check_args()), so both agree on which options take a value. */
extern const struct option perf_px_opts[];

/* ---- topology ----------------------------------------------------------------------------- */

/**
 * Describe how two CPUs relate: "same CPU", "SMT siblings", "cross-core", "cross-package" or
 * "cross-NUMA" (from /sys/devices/system/cpu/cpuN/topology and libnuma).
 * @param a  CPU number.
 * @param b  CPU number.
 * @return   Static string.
 */
const char *perf_cpu_pair_topology(int a, int b);
/**
 * Default CPU pair of a two-sided benchmark (client, server) that fits this machine: from the
 * CPUs this process may run on, the client gets the highest-numbered one (away from CPU 0,
 * which takes most interrupts) and the server the highest-numbered other CPU ranked by
 * perf_cpu_pair_topology(): "cross-core" first, then "cross-package"/"cross-NUMA", then
 * "SMT siblings" (two spinning threads on one core halve each other). With one allowed CPU
 * both get it (callers must then yield while they wait, not spin).
 * @param[out] client  CPU of the client, or -1 if the affinity mask cannot be read.
 * @param[out] server  CPU of the server (== *client with one CPU), or -1.
 * @return Number of CPUs this process may run on (>= 1), or -errno from sched_getaffinity().
 */
int perf_default_cpu_pair(int *client, int *server);
/** CPU model name from /proc/cpuinfo ("unknown" if absent). @param[out] buf Buffer.
 *  @param len Its size. */
void perf_cpu_model(char *buf, size_t len);

#endif /* KVX_BENCH_PERF_UTIL_H */
