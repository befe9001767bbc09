/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_LCORES_H
#define KVX_BENCH_TRACE_LCORES_H
/**
 * @file
 * `kvxfer-perf trace --local -l LIST`: split one polling lcore list between the producer and
 * the consumer process, through the project's lcore option parser (include/kvxfer/lcore.h), so
 * every DPDK form (`0-3`, `1,2@(5-7)`, `(0,1)@0`, `0@(0,1)`) splits the same way the engine
 * would read it.
 */
#include <sched.h>
#include <stddef.h>

/** Capacity of one role's lcore string, bytes including the NUL. */
#define TRACE_LCORES_MAX 512

/**
 * Split @p list: the producer gets the first half of its lcores (ascending lcore id, the odd
 * one to the consumer), the consumer the rest; each role's string lists its lcores in DPDK
 * mapping form, `ID` when the lcore runs on CPU ID alone, else `ID@(CPUS)`.
 *
 * @param list       Polling lcore list, DPDK `-l` syntax; not NULL.
 * @param[out] out   Array[2] strings: [0] producer, [1] consumer; written only when split.
 * @param[out] err   Message naming the bad value (kvx_lcore_parse_opt()); may be NULL.
 * @param errlen     Size of @p err, bytes.
 * @return           2 when split; 0 when the list has a single lcore (both roles use @p list).
 * @retval -EINVAL   @p list does not parse (@p err says why).
 * @retval -ENOMEM   Out of memory.
 * @retval -ENOSPC   A role's string does not fit TRACE_LCORES_MAX bytes.
 */
int trace_split_lcores(const char *list, char out[2][TRACE_LCORES_MAX], char *err, size_t errlen);

/**
 * The polling lcores of `--local` without `-l`: each role's engine gets two polling lcores
 * that may run on two CPUs, the same two for all four. Without this, both engines take their
 * default lcore (the second allowed CPU) and the two data paths share one CPU. Pinning each
 * role to a CPU of its own measured the same as one floating lcore per role on an otherwise
 * idle machine, and much slower when other processes crowd one of the CPUs
 * (docs/performance.md §1.4); a second lcore per role lets the moving engine copy on both
 * CPUs (the layer spread, §12). With three or more CPUs, the first is left to the control
 * lcores and the role processes' main threads: the pollers on the second and third; with two,
 * on both.
 *
 * @param allowed    CPUs the roles may use (this process's affinity and present CPUs).
 * @param[out] out   Array[2] strings: [0] producer, [1] consumer, `-l` form
 *                   (`A@(A,B),B@(A,B)`: lcores A and B, named after the two CPUs, each on
 *                   both); written only when split.
 * @return           2 when split; 0 when @p allowed has fewer than two CPUs (each engine keeps
 *                   its default).
 */
int trace_default_lcores(const cpu_set_t *allowed, char out[2][TRACE_LCORES_MAX]);

#endif /* KVX_BENCH_TRACE_LCORES_H */
