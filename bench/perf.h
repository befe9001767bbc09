/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_PERF_H
#define KVX_BENCH_PERF_H
/**
 * @file
 * Subcommands of kvxfer-perf. Each lives in bench/perf_<name>.c and is declared weak here so a
 * subcommand whose file is not built is reported as such instead of failing the link.
 * Every subcommand returns the process exit code (0 = success, 1 = failure, 2 = usage error).
 */
int kvx_perf_ring_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_notify_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_bw_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_lat_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_plan_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_trace_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_idle_main(int argc, char **argv) __attribute__((weak));
int kvx_perf_keygen_main(int argc, char **argv) __attribute__((weak));
#endif
