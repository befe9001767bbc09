/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_REPORT_H
#define KVX_BENCH_TRACE_REPORT_H
/**
 * @file
 * Results of a `kvxfer-perf trace` replay: per-request records, the end-of-run summary
 * (printed, `--json`, `--csv`) and the gnuplot `--plot` (latency CDF + throughput over time).
 *
 * Times are ns relative to the start of the replay (the first request's dispatch). Latency of
 * a request = end_ns - start_ns: from the moment the driver hands it to the producer and
 * consumer until the consumer has verified the last byte (and, for WRITE, write_done arrived;
 * for READ, every layer landed). Time to first layer (WRITE only) = first_layer_ns - start_ns.
 * Percentiles use the nearest-rank method (perf_util.h perf_percentile_u64()).
 *
 * Not thread-safe; one owner thread (the replay driver).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/** Outcome and timing of one replayed request. */
struct perf_trace_rec {
	uint64_t idx;            /**< Request index in the replay (the transfer id's number). */
	uint32_t line;           /**< Line in the trace file. */
	uint32_t input_tokens;   /**< Prompt tokens. */
	uint64_t blocks;         /**< KV blocks of the prompt. */
	uint64_t hit_blocks;     /**< Blocks already resident on the consumer (prefix hit). */
	uint64_t xfer_blocks;    /**< Blocks transferred (blocks - hit_blocks). */
	uint64_t bytes;          /**< Bytes transferred (all layers and planes). */
	uint64_t arrival_ns;     /**< Scheduled arrival (trace time / speed), ns. */
	uint64_t start_ns;       /**< Dispatched to the engines, ns. */
	uint64_t first_layer_ns; /**< WRITE: first layer landed on the consumer; 0 = not measured. */
	uint64_t end_ns;         /**< Transfer complete and verified, ns; 0 = never completed. */
	int status;              /**< 0 = done; negative errno (-ETIMEDOUT, -EIO corrupt, ...). */
};

/** Whole-run counters that come from the engines, not from the records. */
struct perf_trace_counters {
	double lcore_util[2];    /**< Polling-lcore busy fraction 0..1: [0] producer, [1] consumer; < 0 = unknown (n/a, JSON null). */
	bool reported[2];        /**< The role process ([0] producer, [1] consumer) sent its counters. */
	bool ctl_reported[2];    /**< That role's engine reported control-message counters. */
	uint64_t ctl_sent;       /**< Control messages sent, summed over the sides with ctl_reported. */
	uint64_t ctl_recv;       /**< Control messages received (same sides). */
	uint64_t ctl_dropped;    /**< Control messages dropped as malformed/late (same sides). */
	uint64_t verify_bad;     /**< Block planes that failed byte verification. */
	bool verify_enabled;     /**< --verify or --verify-bytes was on. */
	bool verify_bytes;       /**< --verify-bytes: every byte was checked, not only per-page stamps. */
	double engine_cpu_s[2];  /**< CPU seconds of each side's engine threads; < 0 = unknown (JSON null). */
	uint32_t n_lcores[2];    /**< Polling lcores each side reported (0 = unknown). */
	uint64_t lcore_bytes[2][16]; /**< Bytes moved by the ops each of them posted. */
	const char *peer;        /**< "cma" or "tcp": that --peer loop ran (the peer_* fields are set):
	                              summary line "peer cma loop" / "peer tcp loop" and JSON
	                              summary.peer (kind: this name) / summary.vs_peer; NULL: none. */
	int peer_status;         /**< 0, or the loop's negative errno (its figures are then n/a). */
	uint64_t peer_bytes;     /**< Bytes the loop moved. */
	double peer_wall_s;      /**< Its wall time, s. */
	uint64_t peer_calls;     /**< Its process_vm_readv/writev calls (tcp: sendmsg + recvmsg). */
	uint64_t peer_iovs;      /**< Its ranges (iovecs, after merging). */
};

/** Run description printed in the summary header. */
struct perf_trace_run_info {
	const char *model;       /**< Model name. */
	const char *layout;      /**< "split K/V" or "MLA latent". */
	const char *trace;       /**< Trace path. */
	const char *mode;        /**< "WRITE" or "READ". */
	const char *transport;   /**< Transport actually used ("tcp", "shm", "verbs"). */
	uint32_t block_tokens;   /**< Tokens per KV block. */
	uint64_t block_bytes;    /**< Bytes per block over all layers and planes. */
	uint64_t pool_blocks;    /**< Blocks per pool (each side). */
	uint32_t concurrency;    /**< Max transfers in flight. */
	double speed;            /**< Arrival time scale (0 = back to back). */
	bool prefix_cache;       /**< --prefix-cache. */
	int argc;                /**< Command line of the run (JSON header "options"), or 0. */
	char *const *argv;       /**< Array[argc]; argv[0] is the program. */
	uint64_t skipped;        /**< Requests skipped as larger than the pool (--oversize skip). */
	uint64_t streamed;       /**< Requests moved in pool-sized pieces (--oversize stream). */
};

/** Latency distribution, ms. */
struct perf_lat_stats {
	size_t n;    /**< Samples. */
	double p50;  /**< Median, ms. */
	double p90;  /**< 90th percentile, ms. */
	double p99;  /**< 99th percentile, ms. */
	double max;  /**< Maximum, ms. */
	double mean; /**< Mean, ms. */
};

/** The end-of-run summary (computed by perf_trace_summarize()). */
struct perf_trace_summary {
	uint64_t requests;         /**< Records. */
	uint64_t completed;        /**< Records with status 0. */
	uint64_t failures;         /**< Records with status != 0. */
	uint64_t prompt_tokens;    /**< Sum of input tokens. */
	uint64_t blocks;           /**< Sum of prompt blocks. */
	uint64_t hit_blocks;       /**< Sum of prefix-hit blocks. */
	uint64_t xfer_blocks;      /**< Sum of transferred blocks of completed requests. */
	uint64_t lost_blocks;      /**< Blocks of requests that did not complete (not transferred). */
	uint64_t bytes;            /**< Sum of transferred bytes (completed requests). */
	double wall_s;             /**< First dispatch to last completion, s. */
	double gbps;               /**< bytes / wall_s / 1e9 (GB/s, decimal). */
	struct perf_lat_stats lat; /**< Per-request transfer latency. */
	struct perf_lat_stats ttfl;/**< Time to first layer (WRITE); n = 0 if not measured. */
};

/**
 * Latency distribution of samples in ns, reported in ms (nearest-rank percentiles from
 * perf_stats_u64() in perf_util.h).
 *
 * @param ns  Array[n] samples, ns; sorted in place.
 * @param n   Count.
 * @param st  Output; all zero when n == 0.
 */
void perf_lat_stats_compute(uint64_t *ns, size_t n, struct perf_lat_stats *st);

/**
 * Summarise records.
 *
 * @param recs   Array[n] records.
 * @param n      Count.
 * @param[out] s Summary.
 * @retval 0       Success.
 * @retval -ENOMEM Allocation failed.
 */
int perf_trace_summarize(const struct perf_trace_rec *recs, size_t n, struct perf_trace_summary *s);

/**
 * Print the human-readable summary (one field per line, as documented in the README).
 *
 * @param f     Stream.
 * @param info  Run description.
 * @param s     Summary.
 * @param c     Engine counters.
 * @param recs  Array[n] records (failed ones are listed by transfer id).
 * @param n     Count.
 */
void perf_trace_print_summary(FILE *f, const struct perf_trace_run_info *info,
			      const struct perf_trace_summary *s, const struct perf_trace_counters *c,
			      const struct perf_trace_rec *recs, size_t n);

/**
 * Write the summary and every record as one JSON document (jansson).
 *
 * @retval 0     Success.
 * @retval -EIO  Cannot write @p path (message on stderr).
 * @retval -ENOMEM Allocation failed.
 */
int perf_trace_write_json(const char *path, const struct perf_trace_run_info *info,
			  const struct perf_trace_summary *s, const struct perf_trace_counters *c,
			  const struct perf_trace_rec *recs, size_t n);

/**
 * Write one CSV row per request (header: idx,line,input_tokens,blocks,hit_blocks,
 * xfer_blocks,bytes,arrival_ms,start_ms,first_layer_ms,end_ms,latency_ms,status).
 *
 * @retval 0     Success.
 * @retval -EIO  Cannot write @p path (message on stderr).
 */
int perf_trace_write_csv(const char *path, const struct perf_trace_rec *recs, size_t n);

/**
 * Draw a PNG with gnuplot: per-request latency CDF (left) and throughput over time (right).
 *
 * Writes the data and script next to @p png_path (`<png>.dat`, `<png>.gp`) and runs
 * `gnuplot` from PATH (Debian package gnuplot-nox).
 *
 * @retval 0        Success.
 * @retval -ENOENT  gnuplot is not installed.
 * @retval -EIO     Writing files failed or gnuplot exited non-zero (message on stderr).
 */
int perf_trace_plot(const char *png_path, const struct perf_trace_run_info *info,
		    const struct perf_trace_rec *recs, size_t n);

/**
 * Draw a PNG with gnuplot: bandwidth vs message size of a `bw` sweep (log2 x axis), one curve
 * per series (e.g. kvxfer and its same-run peer).
 *
 * @param png_path   Output file; `<png>.dat` and `<png>.gp` are written next to it.
 * @param title      Plot title (e.g. "tcp WRITE, 1 QP").
 * @param sizes      Array[n] message sizes, bytes, ascending.
 * @param gbps       Array[n_series * n] GB/s, series-major (series s at gbps[s * n + i]).
 * @param names      Array[n_series] series names.
 * @param n          Sizes, >= 1.
 * @param n_series   Series, 1..8.
 * @retval 0         Success.
 * @retval -EINVAL   n or n_series out of range.
 * @retval -ENOENT   gnuplot is not installed.
 * @retval -EIO      Writing files failed or gnuplot exited non-zero.
 */
int perf_plot_bw_sweep(const char *png_path, const char *title, const uint64_t *sizes,
		       const double *gbps, const char *const *names, size_t n, size_t n_series);

/**
 * Progress line state: prints "requests done/total, GB moved, current GB/s" at most every
 * @p period_ns once the run is older than 2 s; rewrites one line on a terminal, appends lines
 * otherwise.
 */
struct perf_progress {
	FILE *f;              /**< Stream (stderr). */
	uint64_t start_ns;    /**< Run start, kvx_now_ns(). */
	uint64_t last_ns;     /**< Last print, ns; 0 = never. */
	uint64_t last_bytes;  /**< Bytes at the last print. */
	uint64_t period_ns;   /**< Minimum time between prints, ns. */
	bool tty;             /**< f is a terminal. */
	bool printed;         /**< Something was printed (finish with a newline). */
};

/** Initialise progress reporting to @p f starting at @p start_ns. */
void perf_progress_init(struct perf_progress *p, FILE *f, uint64_t start_ns);

/** Report progress at @p now_ns (prints only when due). */
void perf_progress_update(struct perf_progress *p, uint64_t now_ns, uint64_t done, uint64_t total,
			  uint64_t bytes);

/** End the progress line (newline on a terminal) if anything was printed. */
void perf_progress_finish(struct perf_progress *p);

#endif /* KVX_BENCH_TRACE_REPORT_H */
