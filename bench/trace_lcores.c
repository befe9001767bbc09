/* SPDX-License-Identifier: Apache-2.0 */
/* Split a polling lcore list between the trace's producer and consumer (trace_lcores.h). */
#include "trace_lcores.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvxfer/lcore.h"

/* Append lcore @p m to @p buf in DPDK mapping form; -ENOSPC if it does not fit. */
static int append_lcore(char *buf, size_t cap, size_t *off, const struct kvx_lcore_map *m, int first)
{
	char cpus[TRACE_LCORES_MAX];
	int n;
	if (CPU_COUNT(&m->cpus) == 1 && m->lcore_id < CPU_SETSIZE && CPU_ISSET(m->lcore_id, &m->cpus)) {
		n = snprintf(buf + *off, cap - *off, "%s%u", first ? "" : ",", m->lcore_id);
	} else {
		if (kvx_lcore_cpuset_format(&m->cpus, cpus, sizeof(cpus)) >= (int)sizeof(cpus))
			return -ENOSPC;
		n = snprintf(buf + *off, cap - *off, "%s%u@(%s)", first ? "" : ",", m->lcore_id, cpus);
	}
	if (n < 0 || (size_t)n >= cap - *off)
		return -ENOSPC;
	*off += (size_t)n;
	return 0;
}

int trace_split_lcores(const char *list, char out[2][TRACE_LCORES_MAX], char *err, size_t errlen)
{
	struct kvx_lcore_cfg *cfg = malloc(sizeof(*cfg));
	if (!cfg)
		return -ENOMEM;
	kvx_lcore_cfg_init(cfg);
	int rc = kvx_lcore_parse_opt(cfg, "--lcores", list, err, errlen);
	if (rc < 0 || cfg->n_lcores < 2) {
		free(cfg);
		return rc < 0 ? rc : 0;
	}
	uint32_t half = cfg->n_lcores / 2;
	for (int s = 0; s < 2 && rc >= 0; s++) {
		uint32_t lo = s == 0 ? 0 : half, hi = s == 0 ? half : cfg->n_lcores;
		size_t off = 0;
		out[s][0] = '\0';
		for (uint32_t i = lo; i < hi && rc >= 0; i++)
			rc = append_lcore(out[s], TRACE_LCORES_MAX, &off, &cfg->lcores[i], i == lo);
	}
	free(cfg);
	if (rc < 0) {
		if (err && errlen)
			snprintf(err, errlen, "-l %s: a role's share does not fit %d characters", list,
				 TRACE_LCORES_MAX - 1);
		return rc;
	}
	return 2;
}

int trace_default_lcores(const cpu_set_t *allowed, char out[2][TRACE_LCORES_MAX])
{
	int cpus[3], a = 0;
	for (int c = 0; c < CPU_SETSIZE && a < 3; c++)
		if (CPU_ISSET(c, allowed))
			cpus[a++] = c;
	if (a < 2)
		return 0;
	int first = a >= 3 ? 1 : 0, x = cpus[first], y = cpus[first + 1];
	/* Each role's pollers may run on both CPUs: at RT priority pinned and floating measured
	 * alike (3.13 vs 2.99 GB/s tcp WRITE), at load 10 floating held up (1.73 vs 0.54 GB/s).
	 * Two per role, so the moving engine's layers are posted by two lcores (the spread) and
	 * both CPUs copy: shm 1.5-1.9x the CMA loop instead of 1.0x (docs/performance.md §12). */
	for (int s = 0; s < 2; s++)
		snprintf(out[s], TRACE_LCORES_MAX, "%d@(%d,%d),%d@(%d,%d)", x, x, y, y, x, y);
	return 2;
}
