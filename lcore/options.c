/* SPDX-License-Identifier: Apache-2.0 */
/* EAL-style lcore options (docs/runtime-notes.md §1.1): grammar, validation, default sets. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lcore_internal.h"

KVX_PRINTF(3, 4) static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

void kvx_lcore_cfg_init(struct kvx_lcore_cfg *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->main_lcore = KVX_LCORE_ID_ANY;
	cfg->control_mode = KVX_LCORE_CONTROL_AUTO;
	cfg->control.lcore_id = KVX_LCORE_ID_ANY;
	cfg->idle = KVX_LCORE_IDLE_ADAPTIVE;
}

int kvx_lcore_cpuset_format(const cpu_set_t *set, char *buf, size_t len)
{
	size_t pos = 0;
	int total = 0;
	if (len)
		buf[0] = '\0';
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, set))
			continue;
		int e = c;
		while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
			e++;
		char tmp[32];
		int n = e == c ? snprintf(tmp, sizeof(tmp), "%s%d", total ? "," : "", c)
			       : snprintf(tmp, sizeof(tmp), "%s%d-%d", total ? "," : "", c, e);
		if (pos + (size_t)n < len) {
			memcpy(buf + pos, tmp, (size_t)n + 1);
			pos += (size_t)n;
		} else if (len) {
			pos = len; /* stop writing, keep counting */
		}
		total += n;
		c = e;
	}
	return total;
}

/* ---- grammar ---------------------------------------------------------------------------- */

struct cursor {
	const char *s; /* whole string, for messages */
	const char *p;
	const char *opt; /* option name, for messages */
	char *err;
	size_t errlen;
};

static void skip_ws(struct cursor *c)
{
	while (*c->p == ' ' || *c->p == '\t')
		c->p++;
}

static int parse_num(struct cursor *c, const char *what, unsigned *out)
{
	skip_ws(c);
	if (!isdigit((unsigned char)*c->p))
		return fail(c->err, c->errlen, "%s '%s': expected a %s number at '%s'", c->opt, c->s,
			    what, *c->p ? c->p : "<end>");
	unsigned long v = 0;
	while (isdigit((unsigned char)*c->p)) {
		v = v * 10 + (unsigned long)(*c->p - '0');
		if (v > 1000000)
			v = 1000000; /* saturate; reported below */
		c->p++;
	}
	if (v > KVX_LCORE_ID_MAX)
		return fail(c->err, c->errlen, "%s '%s': %s %lu out of range 0-%u", c->opt, c->s, what, v,
			    KVX_LCORE_ID_MAX);
	*out = (unsigned)v;
	skip_ws(c);
	return 0;
}

/* range := NUM ['-' NUM]; sets bits lo..hi in set. */
static int parse_range(struct cursor *c, const char *what, cpu_set_t *set, unsigned *count)
{
	unsigned lo, hi;
	int rc = parse_num(c, what, &lo);
	if (rc)
		return rc;
	hi = lo;
	if (*c->p == '-') {
		c->p++;
		rc = parse_num(c, what, &hi);
		if (rc)
			return rc;
		if (hi < lo)
			return fail(c->err, c->errlen, "%s '%s': descending %s range %u-%u", c->opt, c->s,
				    what, lo, hi);
	}
	for (unsigned i = lo; i <= hi; i++) {
		if (CPU_ISSET(i, set))
			return fail(c->err, c->errlen, "%s '%s': %s %u listed twice", c->opt, c->s, what, i);
		CPU_SET(i, set);
		(*count)++;
	}
	return 0;
}

/* item := range | '(' range (',' range)* ')'; grouped tells whether parentheses were used. */
static int parse_item(struct cursor *c, const char *what, cpu_set_t *set, bool *grouped)
{
	unsigned count = 0;
	CPU_ZERO(set);
	skip_ws(c);
	if (*c->p != '(') {
		*grouped = false;
		return parse_range(c, what, set, &count);
	}
	*grouped = true;
	c->p++;
	for (;;) {
		int rc = parse_range(c, what, set, &count);
		if (rc)
			return rc;
		if (*c->p == ',') {
			c->p++;
			continue;
		}
		if (*c->p == ')') {
			c->p++;
			skip_ws(c);
			return 0;
		}
		return fail(c->err, c->errlen, "%s '%s': expected ',' or ')' at '%s'", c->opt, c->s,
			    *c->p ? c->p : "<end>");
	}
}

static int lcore_index(const struct kvx_lcore_cfg *cfg, uint32_t id)
{
	for (uint32_t i = 0; i < cfg->n_lcores; i++)
		if (cfg->lcores[i].lcore_id == id)
			return (int)i;
	return -1;
}

static int cmp_map(const void *a, const void *b)
{
	const struct kvx_lcore_map *x = a, *y = b;
	return x->lcore_id < y->lcore_id ? -1 : x->lcore_id > y->lcore_id;
}

int kvx_lcore_parse_lcores(struct kvx_lcore_cfg *cfg, const char *s, char *err, size_t errlen)
{
	struct cursor c = {.s = s, .p = s, .opt = "--lcores", .err = err, .errlen = errlen};
	struct kvx_lcore_cfg *tmp = malloc(sizeof(*tmp));
	if (!tmp)
		return -ENOMEM;
	*tmp = *cfg;
	tmp->n_lcores = 0;
	int rc = 0;
	skip_ws(&c);
	if (!*c.p) {
		rc = fail(err, errlen, "--lcores: empty lcore list");
		goto out;
	}
	for (;;) {
		cpu_set_t ids, cpus;
		bool grouped, cpus_grouped;
		rc = parse_item(&c, "lcore", &ids, &grouped);
		if (rc)
			goto out;
		bool mapped = false;
		if (*c.p == '@') {
			c.p++;
			rc = parse_item(&c, "CPU", &cpus, &cpus_grouped);
			if (rc)
				goto out;
			mapped = true;
		}
		for (unsigned id = 0; id <= KVX_LCORE_ID_MAX; id++) {
			if (!CPU_ISSET(id, &ids))
				continue;
			if (lcore_index(tmp, id) >= 0) {
				rc = fail(err, errlen, "--lcores '%s': lcore %u listed twice", s, id);
				goto out;
			}
			if (tmp->n_lcores >= KVX_LCORE_MAX) {
				rc = fail(err, errlen, "--lcores '%s': more than %u lcores (at lcore %u)", s,
					  KVX_LCORE_MAX, id);
				goto out;
			}
			struct kvx_lcore_map *m = &tmp->lcores[tmp->n_lcores++];
			m->lcore_id = id;
			if (mapped) {
				m->cpus = cpus;
			} else if (grouped) {
				m->cpus = ids; /* "(0,6)": every lcore of the group floats on the group */
			} else {
				CPU_ZERO(&m->cpus); /* "7-8": lcore id == CPU */
				CPU_SET(id, &m->cpus);
			}
		}
		if (*c.p == ',') {
			c.p++;
			continue;
		}
		if (*c.p == '\0')
			break;
		rc = fail(err, errlen, "--lcores '%s': unexpected '%c' at '%s'", s, *c.p, c.p);
		goto out;
	}
	qsort(tmp->lcores, tmp->n_lcores, sizeof(tmp->lcores[0]), cmp_map);
	memcpy(cfg->lcores, tmp->lcores, sizeof(cfg->lcores[0]) * tmp->n_lcores);
	cfg->n_lcores = tmp->n_lcores;
out:
	free(tmp);
	return rc;
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	ch = (char)tolower((unsigned char)ch);
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	return -1;
}

static int parse_coremask(struct kvx_lcore_cfg *cfg, const char *s, char *err, size_t errlen)
{
	const char *b = s, *e = s + strlen(s);
	while (b < e && isspace((unsigned char)*b))
		b++;
	while (e > b && isspace((unsigned char)e[-1]))
		e--;
	if (e - b >= 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X'))
		b += 2;
	if (b == e)
		return fail(err, errlen, "-c '%s': empty core mask", s);
	cpu_set_t set;
	CPU_ZERO(&set);
	unsigned n = 0;
	/* Right to left: bit j of the last digit is CPU j (rte_eal_parse_coremask). */
	unsigned base = 0;
	for (const char *p = e; p > b; p--, base += 4) {
		int v = hexval(p[-1]);
		if (v < 0)
			return fail(err, errlen, "-c '%s': '%c' is not a hex digit", s, p[-1]);
		for (unsigned j = 0; j < 4; j++) {
			if (!(v & (1 << j)))
				continue;
			unsigned cpu = base + j;
			if (cpu > KVX_LCORE_ID_MAX)
				return fail(err, errlen, "-c '%s': CPU %u out of range 0-%u", s, cpu,
					    KVX_LCORE_ID_MAX);
			CPU_SET(cpu, &set);
			n++;
		}
	}
	if (n == 0)
		return fail(err, errlen, "-c '%s': core mask selects no CPU", s);
	if (n > KVX_LCORE_MAX)
		return fail(err, errlen, "-c '%s': more than %u lcores", s, KVX_LCORE_MAX);
	cfg->n_lcores = 0;
	for (unsigned cpu = 0; cpu <= KVX_LCORE_ID_MAX; cpu++) {
		if (!CPU_ISSET(cpu, &set))
			continue;
		struct kvx_lcore_map *m = &cfg->lcores[cfg->n_lcores++];
		m->lcore_id = cpu;
		CPU_ZERO(&m->cpus);
		CPU_SET(cpu, &m->cpus);
	}
	return 0;
}

static int parse_control(struct kvx_lcore_cfg *cfg, const char *s, char *err, size_t errlen)
{
	if (!strcmp(s, "none")) {
		cfg->control_mode = KVX_LCORE_CONTROL_NONE;
		return 0;
	}
	struct cursor c = {.s = s, .p = s, .opt = "--control-lcore", .err = err, .errlen = errlen};
	unsigned id;
	int rc = parse_num(&c, "lcore", &id);
	if (rc)
		return rc;
	cpu_set_t cpus;
	CPU_ZERO(&cpus);
	CPU_SET(id, &cpus);
	if (*c.p == '@') {
		bool grouped;
		c.p++;
		rc = parse_item(&c, "CPU", &cpus, &grouped);
		if (rc)
			return rc;
	}
	if (*c.p)
		return fail(err, errlen, "--control-lcore '%s': expected N or N@cpus, got '%s'", s, c.p);
	cfg->control_mode = KVX_LCORE_CONTROL_EXPLICIT;
	cfg->control.lcore_id = id;
	cfg->control.cpus = cpus;
	return 0;
}

static const char *canon(const char *name)
{
	while (*name == '-')
		name++;
	if (!strcmp(name, "l") || !strcmp(name, "lcores"))
		return "lcores";
	if (!strcmp(name, "c"))
		return "c";
	if (!strcmp(name, "main-lcore"))
		return "main-lcore";
	if (!strcmp(name, "control-lcore"))
		return "control-lcore";
	if (!strcmp(name, "idle"))
		return "idle";
	return NULL;
}

int kvx_lcore_parse_opt(struct kvx_lcore_cfg *cfg, const char *name, const char *value, char *err,
			size_t errlen)
{
	const char *n = canon(name);
	if (!n)
		return 0;
	int rc;
	if (!strcmp(n, "lcores") || !strcmp(n, "c")) {
		bool is_list = n[0] == 'l';
		unsigned bit = is_list ? KVX_LCORE_OPT_LCORES : KVX_LCORE_OPT_MASK;
		if (cfg->given & (KVX_LCORE_OPT_LCORES | KVX_LCORE_OPT_MASK))
			return fail(err, errlen, "%s: only one of -c and -l/--lcores may be given, once",
				    is_list ? "-l/--lcores" : "-c");
		rc = is_list ? kvx_lcore_parse_lcores(cfg, value, err, errlen)
			     : parse_coremask(cfg, value, err, errlen);
		if (rc)
			return rc;
		cfg->given |= bit;
		return 1;
	}
	if (!strcmp(n, "main-lcore")) {
		if (cfg->given & KVX_LCORE_OPT_MAIN)
			return fail(err, errlen, "--main-lcore given twice");
		struct cursor c = {.s = value, .p = value, .opt = "--main-lcore", .err = err, .errlen = errlen};
		unsigned id;
		rc = parse_num(&c, "lcore", &id);
		if (rc)
			return rc;
		if (*c.p)
			return fail(err, errlen, "--main-lcore '%s': not a number", value);
		cfg->main_lcore = id;
		cfg->given |= KVX_LCORE_OPT_MAIN;
		return 1;
	}
	if (!strcmp(n, "control-lcore")) {
		if (cfg->given & KVX_LCORE_OPT_CONTROL)
			return fail(err, errlen, "--control-lcore given twice");
		rc = parse_control(cfg, value, err, errlen);
		if (rc)
			return rc;
		cfg->given |= KVX_LCORE_OPT_CONTROL;
		return 1;
	}
	/* idle */
	if (cfg->given & KVX_LCORE_OPT_IDLE)
		return fail(err, errlen, "--idle given twice");
	if (!strcmp(value, "busy"))
		cfg->idle = KVX_LCORE_IDLE_BUSY;
	else if (!strcmp(value, "adaptive"))
		cfg->idle = KVX_LCORE_IDLE_ADAPTIVE;
	else
		return fail(err, errlen, "--idle '%s': expected 'busy' or 'adaptive'", value);
	cfg->given |= KVX_LCORE_OPT_IDLE;
	return 1;
}

int kvx_lcore_parse_args(int argc, char **argv, struct kvx_lcore_cfg *cfg, char *err, size_t errlen)
{
	static const char *const longs[] = {"--lcores", "--main-lcore", "--control-lcore", "--idle"};
	int out = argc > 0 ? 1 : 0;
	int i = out;
	for (; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--"))
			break;
		const char *name = NULL, *value = NULL;
		char nbuf[32];
		bool takes_next = false;
		if ((a[0] == '-' && (a[1] == 'l' || a[1] == 'c')) && a[1] && (a[2] == '\0' || a[1] != '-')) {
			/* -l X, -lX, -c X, -cX */
			nbuf[0] = '-';
			nbuf[1] = a[1];
			nbuf[2] = '\0';
			name = nbuf;
			if (a[2])
				value = a + 2;
			else
				takes_next = true;
		} else {
			for (size_t k = 0; k < KVX_ARRAY_SIZE(longs); k++) {
				size_t ln = strlen(longs[k]);
				if (strncmp(a, longs[k], ln))
					continue;
				if (a[ln] == '\0') {
					name = longs[k];
					takes_next = true;
				} else if (a[ln] == '=') {
					name = longs[k];
					value = a + ln + 1;
				}
				break;
			}
		}
		if (!name) {
			argv[out++] = argv[i];
			continue;
		}
		if (takes_next) {
			if (i + 1 >= argc)
				return fail(err, errlen, "option %s needs a value", name);
			value = argv[++i];
		}
		int rc = kvx_lcore_parse_opt(cfg, name, value, err, errlen);
		if (rc < 0)
			return rc;
	}
	for (; i < argc; i++)
		argv[out++] = argv[i];
	if (out < argc)
		argv[out] = NULL;
	return out;
}

/* ---- validation ------------------------------------------------------------------------- */

static void read_present(cpu_set_t *present)
{
	CPU_ZERO(present);
	FILE *f = fopen("/sys/devices/system/cpu/present", "re");
	char line[4096];
	if (f && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		struct cursor c = {.s = line, .p = line, .opt = "present", .err = NULL, .errlen = 0};
		unsigned count = 0;
		bool ok = true;
		while (ok && *c.p) {
			if (parse_range(&c, "CPU", present, &count))
				ok = false;
			else if (*c.p == ',')
				c.p++;
			else if (*c.p)
				ok = false;
		}
		fclose(f);
		if (ok && count)
			return;
		CPU_ZERO(present);
	} else if (f) {
		fclose(f);
	}
	long n = sysconf(_SC_NPROCESSORS_CONF);
	for (long i = 0; i < n && i < CPU_SETSIZE; i++)
		CPU_SET((int)i, present);
}

int kvx_lcore_host_cpus(cpu_set_t *present, cpu_set_t *allowed)
{
	read_present(present);
	CPU_ZERO(allowed);
	if (sched_getaffinity(0, sizeof(*allowed), allowed))
		return -EINVAL;
	return 0;
}

static int check_cpus(const char *who, uint32_t id, const cpu_set_t *cpus, const cpu_set_t *present,
		      const cpu_set_t *allowed, char *err, size_t errlen)
{
	char list[256];
	if (CPU_COUNT(cpus) == 0)
		return fail(err, errlen, "%s %u: empty CPU set", who, id);
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, cpus))
			continue;
		if (!CPU_ISSET(c, present)) {
			kvx_lcore_cpuset_format(present, list, sizeof(list));
			return fail(err, errlen, "%s %u: CPU %d does not exist on this host (present: %s)",
				    who, id, c, list);
		}
		if (!CPU_ISSET(c, allowed)) {
			kvx_lcore_cpuset_format(allowed, list, sizeof(list));
			return fail(err, errlen,
				    "%s %u: CPU %d is not in this process's allowed CPUs (%s)", who, id, c,
				    list);
		}
	}
	return 0;
}

static uint32_t next_free_id(const struct kvx_lcore_cfg *cfg, uint32_t avoid)
{
	for (uint32_t id = 0; id <= KVX_LCORE_ID_MAX; id++)
		if (id != avoid && lcore_index(cfg, id) < 0)
			return id;
	return KVX_LCORE_ID_ANY;
}

int kvx_lcore_cfg_validate(struct kvx_lcore_cfg *cfg, const cpu_set_t *present,
			   const cpu_set_t *allowed, char *err, size_t errlen)
{
	cpu_set_t host_present, host_allowed;
	if (!present || !allowed) {
		if (kvx_lcore_host_cpus(&host_present, &host_allowed))
			return fail(err, errlen, "sched_getaffinity failed");
		if (!present)
			present = &host_present;
		if (!allowed)
			allowed = &host_allowed;
	}
	if (cfg->n_lcores == 0)
		return fail(err, errlen, "no polling lcores: give -l/--lcores or -c");
	if (cfg->n_lcores > KVX_LCORE_MAX)
		return fail(err, errlen, "more than %u lcores", KVX_LCORE_MAX);
	cpu_set_t used;
	CPU_ZERO(&used);
	for (uint32_t i = 0; i < cfg->n_lcores; i++) {
		const struct kvx_lcore_map *m = &cfg->lcores[i];
		if (m->lcore_id > KVX_LCORE_ID_MAX)
			return fail(err, errlen, "lcore %u out of range 0-%u", m->lcore_id, KVX_LCORE_ID_MAX);
		if (i && cfg->lcores[i - 1].lcore_id >= m->lcore_id)
			return fail(err, errlen, "lcore %u listed twice or out of order", m->lcore_id);
		int rc = check_cpus("lcore", m->lcore_id, &m->cpus, present, allowed, err, errlen);
		if (rc)
			return rc;
		CPU_OR(&used, &used, &m->cpus);
	}
	if (cfg->idle != KVX_LCORE_IDLE_BUSY && cfg->idle != KVX_LCORE_IDLE_ADAPTIVE)
		return fail(err, errlen, "unknown idle policy %d", (int)cfg->idle);
	if (cfg->main_lcore == KVX_LCORE_ID_ANY) {
		cfg->main_lcore = cfg->lcores[0].lcore_id;
	} else if (lcore_index(cfg, cfg->main_lcore) < 0) {
		return fail(err, errlen, "--main-lcore %u is not one of the polling lcores", cfg->main_lcore);
	}
	switch (cfg->control_mode) {
	case KVX_LCORE_CONTROL_NONE:
		break;
	case KVX_LCORE_CONTROL_AUTO: {
		cpu_set_t free_cpus;
		CPU_AND(&free_cpus, allowed, present);
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &used))
				CPU_CLR(c, &free_cpus);
		if (CPU_COUNT(&free_cpus) == 0)
			CPU_AND(&free_cpus, allowed, present); /* nothing left: float on all (DPDK) */
		cfg->control.lcore_id = next_free_id(cfg, KVX_LCORE_ID_ANY);
		cfg->control.cpus = free_cpus;
		cfg->control_mode = KVX_LCORE_CONTROL_EXPLICIT;
		break;
	}
	case KVX_LCORE_CONTROL_EXPLICIT: {
		uint32_t id = cfg->control.lcore_id;
		if (lcore_index(cfg, id) >= 0)
			return fail(err, errlen, "--control-lcore %u is also a polling lcore", id);
		if (id == cfg->main_lcore)
			return fail(err, errlen, "--control-lcore %u is the main lcore", id);
		int rc = check_cpus("control lcore", id, &cfg->control.cpus, present, allowed, err, errlen);
		if (rc)
			return rc;
		if (cfg->share_cpus)
			break;
		for (uint32_t i = 0; i < cfg->n_lcores; i++) {
			for (int c = 0; c < CPU_SETSIZE; c++) {
				if (CPU_ISSET(c, &cfg->control.cpus) && CPU_ISSET(c, &cfg->lcores[i].cpus))
					return fail(err, errlen,
						    "--control-lcore %u: CPU %d is also used by polling lcore %u",
						    id, c, cfg->lcores[i].lcore_id);
			}
		}
		break;
	}
	default:
		return fail(err, errlen, "unknown control lcore mode %d", (int)cfg->control_mode);
	}
	if (cfg->share_cpus && cfg->idle != KVX_LCORE_IDLE_ADAPTIVE)
		return fail(err, errlen, "lcores share CPUs: needs --idle adaptive");
	return 0;
}

int kvx_lcore_cfg_default(struct kvx_lcore_cfg *cfg, unsigned n_pollers, unsigned flags, char *err,
			  size_t errlen)
{
	if (n_pollers < 1 || n_pollers > KVX_LCORE_MAX)
		return fail(err, errlen, "default lcores: %u pollers out of range 1-%u", n_pollers,
			    KVX_LCORE_MAX);
	if (flags & ~KVX_LCORE_DEFAULT_F_NO_CONTROL)
		return fail(err, errlen, "default lcores: unknown flags 0x%x", flags);
	if ((flags & KVX_LCORE_DEFAULT_F_NO_CONTROL) && cfg->control_mode == KVX_LCORE_CONTROL_AUTO)
		cfg->control_mode = KVX_LCORE_CONTROL_NONE;
	if (cfg->n_lcores)
		return 0;
	cpu_set_t present, allowed;
	if (kvx_lcore_host_cpus(&present, &allowed))
		return fail(err, errlen, "sched_getaffinity failed");
	CPU_AND(&allowed, &allowed, &present);
	bool want_control = cfg->control_mode != KVX_LCORE_CONTROL_NONE;
	int cpus[CPU_SETSIZE];
	unsigned a = 0;
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &allowed))
			cpus[a++] = c;
	if (a == 0)
		return fail(err, errlen, "default lcores: no allowed CPU");
	/* CPUs the pollers may take without sharing: all allowed but the control one(s). */
	int avail[CPU_SETSIZE];
	unsigned na = 0;
	unsigned first = 0;
	if (cfg->control_mode == KVX_LCORE_CONTROL_EXPLICIT) {
		for (unsigned i = 0; i < a; i++)
			if (!CPU_ISSET(cpus[i], &cfg->control.cpus))
				avail[na++] = cpus[i];
	} else {
		first = want_control ? 1 : 0;
		for (unsigned i = first; i < a; i++)
			avail[na++] = cpus[i];
	}
	cfg->n_lcores = n_pollers;
	if (na >= n_pollers) {
		for (unsigned i = 0; i < n_pollers; i++) {
			cfg->lcores[i].lcore_id = (uint32_t)avail[i];
			CPU_ZERO(&cfg->lcores[i].cpus);
			CPU_SET(avail[i], &cfg->lcores[i].cpus);
		}
		if (cfg->control_mode == KVX_LCORE_CONTROL_AUTO) {
			cfg->control_mode = KVX_LCORE_CONTROL_EXPLICIT;
			cfg->control.lcore_id = (uint32_t)cpus[0];
			CPU_ZERO(&cfg->control.cpus);
			CPU_SET(cpus[0], &cfg->control.cpus);
		}
		return 0;
	}
	/* Too few CPUs: share them; adaptive idle lets co-located threads yield and sleep. */
	uint32_t control_id = cfg->control_mode == KVX_LCORE_CONTROL_EXPLICIT ? cfg->control.lcore_id
									 : KVX_LCORE_ID_ANY;
	if (cfg->control_mode == KVX_LCORE_CONTROL_AUTO) {
		control_id = 0;
		cfg->control_mode = KVX_LCORE_CONTROL_EXPLICIT;
		cfg->control.lcore_id = 0;
		cfg->control.cpus = allowed;
	}
	uint32_t id = 0;
	for (unsigned i = 0; i < n_pollers; i++) {
		while (id == control_id)
			id++;
		cfg->lcores[i].lcore_id = id++;
		CPU_ZERO(&cfg->lcores[i].cpus);
		CPU_SET(cpus[(i + first) % a], &cfg->lcores[i].cpus);
	}
	if (want_control)
		cfg->share_cpus = true;
	cfg->idle = KVX_LCORE_IDLE_ADAPTIVE;
	return 0;
}

int kvx_lcore_cfg_from_strings(const struct kvx_lcore_opts_str *s, unsigned default_pollers,
			       struct kvx_lcore_cfg *cfg, char *err, size_t errlen)
{
	kvx_lcore_cfg_init(cfg);
	const struct {
		const char *name;
		const char *value;
	} opts[] = {
		{"--lcores", s->lcores},
		{"-c", s->coremask},
		{"--main-lcore", s->main_lcore},
		{"--control-lcore", s->control_lcore},
		{"--idle", s->idle},
	};
	for (size_t i = 0; i < KVX_ARRAY_SIZE(opts); i++) {
		if (!opts[i].value)
			continue;
		int rc = kvx_lcore_parse_opt(cfg, opts[i].name, opts[i].value, err, errlen);
		if (rc < 0)
			return rc;
	}
	if (cfg->n_lcores == 0) {
		int rc = kvx_lcore_cfg_default(cfg, default_pollers, 0, err, errlen);
		if (rc)
			return rc;
	}
	return kvx_lcore_cfg_validate(cfg, NULL, NULL, err, errlen);
}
