/* SPDX-License-Identifier: Apache-2.0 */
/* kvx-soak entry point (see soak.h and tests/soak/README.md): the command line, the child
 * roles (--role), and the driver's summary line. Exit 0 only with 0 corrupt, 0 hung,
 * 0 leaked and no crashed role. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "soak_driver.h"

static void on_signal(int s)
{
	(void)s;
	soak_interrupted = 1;
}

static void summary(struct driver *D)
{
	char faults[512] = "", skipped[256] = "", reasons[1024] = "";
	uint64_t total = 0;
	D->injected[F_DUP] = D->pr[PX_P].pstats.duplicated + D->pr[PX_C].pstats.duplicated;
	D->injected[F_DROP] = D->pr[PX_P].pstats.dropped + D->pr[PX_C].pstats.dropped;
	for (int f = 0; f < F_N; f++) {
		if (!D->o.fault_on[f])
			continue;
		if (D->skipped[f]) {
			snprintf(skipped + strlen(skipped), sizeof(skipped) - strlen(skipped), "%s%s",
				 skipped[0] ? "," : "", soak_fault_name[f]);
			continue;
		}
		total += D->injected[f];
		snprintf(faults + strlen(faults), sizeof(faults) - strlen(faults), "%s%s=%" PRIu64,
			 faults[0] ? " " : "", soak_fault_name[f], D->injected[f]);
	}
	uint64_t failed[2] = {0, 0};
	for (size_t i = 0; i < D->nreasons; i++) {
		failed[D->reasons[i].text[0] == 'C'] += D->reasons[i].n;
		snprintf(reasons + strlen(reasons), sizeof(reasons) - strlen(reasons), "%s%s=%" PRIu64,
			 reasons[0] ? ", " : "", D->reasons[i].text, D->reasons[i].n);
	}
	bool pass = !D->corrupt && !D->hung && !D->leaked && !D->crashed;
	printf("kvx-soak: seed=%" PRIu64 " mode=%s -t %s timeout=%ums duration=%.0fs | faults=%" PRIu64
	       " (%s)%s%s%s | requests=%" PRIu64 " done=%" PRIu64 " (all verified) failed/timed-out=C:%" PRIu64 "/P:%" PRIu64
	       " (%s) lost-to-kill=P:%" PRIu64 "/C:%" PRIu64 " disagree=%" PRIu64 " | corrupt=%" PRIu64
	       " (foreign-writes=%" PRIu64 ") hung=%" PRIu64 " (terminal-late=%" PRIu64 ") polled-late=%" PRIu64 " leaked=%" PRIu64 " crashed=%" PRIu64
	       " never-started=%" PRIu64 " | %s\n",
	       D->o.seed, D->o.write_mode ? "write" : "read", D->o.transport, D->o.timeout_ms,
	       (double)(soak_now_ns() - D->t0) / 1e9, total, faults[0] ? faults : "none",
	       skipped[0] ? " skipped=(" : "", skipped, skipped[0] ? ")" : "", D->requests,
	       D->done_verified, failed[1], failed[0], reasons[0] ? reasons : "none", D->lost[P], D->lost[C], D->disagree,
	       D->corrupt, D->foreign, D->hung, D->hung_late, D->polled_late, D->leaked, D->crashed, D->never_started,
	       pass ? "PASS" : "FAIL");
	if (D->first_corrupt[0])
		printf("kvx-soak: first corruption: %s\n", D->first_corrupt);
	fflush(stdout);
}

/* ---- command line ---------------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvx-soak [--seed N] [--duration S] [--mode read|write] [-t tcp|shm]\n"
		"                [--faults LIST|all|none] [--timeout-ms MS] [--concurrency N]\n"
		"                [--pool-blocks N] [--max-req-blocks N] [--gap MIN,MAX] [--trace FILE]\n"
		"                [--trace-tokens N] [--log FILE] [--corrupt-every N] [--lcores L] [-v]\n"
		"faults: kill-producer kill-consumer stop-producer stop-consumer partition-long\n"
		"        partition-short dup-notify drop-notify abort-producer\n"
		"--corrupt-every N: checker self-test (every Nth request is filled with another\n"
		"request's bytes and the consumer scribbles into a block it freed): must FAIL.\n"
		"--lcores L: both engines' polling lcores (params.lcores, e.g. 0,1: layers spread over two).\n"
		"Prints one summary line; exit 0 only with 0 corrupt, 0 hung, 0 leaked, 0 crashed.\n");
}

static int parse_faults(struct opts *o, const char *list)
{
	memset(o->fault_on, 0, sizeof(o->fault_on));
	if (!strcmp(list, "none"))
		return 0;
	if (!strcmp(list, "all")) {
		for (int f = 0; f < F_N; f++)
			o->fault_on[f] = true;
		return 0;
	}
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", list);
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int f = 0;
		while (f < F_N && strcmp(t, soak_fault_name[f]))
			f++;
		if (f == F_N) {
			fprintf(stderr, "kvx-soak: unknown fault '%s'\n", t);
			return -1;
		}
		o->fault_on[f] = true;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct driver D;
	struct opts *o = &D.o;
	*o = (struct opts){.seed = 1, .duration_s = 60, .transport = "tcp", .timeout_ms = 2000, .concurrency = 8,
			   .pool_blocks = 192, .max_req_blocks = 24, .gap_min = 0.5, .gap_max = 2.0,
			   .trace_tokens = 512};
	parse_faults(o, "all");
	const char *role = NULL, *host = NULL;
	struct soak_role_opts ro = {.transport = "tcp", .ctl_fd = -1};
	uint16_t fwd = 0;
	enum { O_SEED = 256, O_DUR, O_MODE, O_FAULTS, O_TO, O_CONC, O_POOL, O_MAXB, O_GAP, O_TRACE, O_TTOK, O_LOG,
	       O_ROLE, O_HOST, O_HS, O_NT, O_CTL, O_FWD, O_MB, O_CE, O_LC };
	static const struct option lo[] = {
		{"seed", 1, 0, O_SEED}, {"duration", 1, 0, O_DUR}, {"mode", 1, 0, O_MODE},
		{"faults", 1, 0, O_FAULTS}, {"timeout-ms", 1, 0, O_TO}, {"concurrency", 1, 0, O_CONC},
		{"pool-blocks", 1, 0, O_POOL}, {"max-req-blocks", 1, 0, O_MAXB}, {"gap", 1, 0, O_GAP},
		{"trace", 1, 0, O_TRACE}, {"trace-tokens", 1, 0, O_TTOK}, {"log", 1, 0, O_LOG},
		{"role", 1, 0, O_ROLE}, {"host", 1, 0, O_HOST}, {"hs-port", 1, 0, O_HS}, {"nt-port", 1, 0, O_NT},
		{"ctl-fd", 1, 0, O_CTL}, {"fwd-port", 1, 0, O_FWD}, {"max-blocks", 1, 0, O_MB},
		{"corrupt-every", 1, 0, O_CE}, {"lcores", 1, 0, O_LC},
		{"help", 0, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "t:vh", lo, NULL)) != -1) {
		switch (c) {
		case O_SEED: o->seed = strtoull(optarg, NULL, 0); break;
		case O_DUR: o->duration_s = atof(optarg); break;
		case O_MODE:
			if (strcmp(optarg, "read") && strcmp(optarg, "write")) {
				usage(stderr);
				return 2;
			}
			o->write_mode = ro.write_mode = !strcmp(optarg, "write");
			break;
		case 't':
			if (strcmp(optarg, "tcp") && strcmp(optarg, "shm")) {
				usage(stderr);
				return 2;
			}
			o->transport = ro.transport = optarg;
			break;
		case O_FAULTS:
			if (parse_faults(o, optarg))
				return 2;
			break;
		case O_TO: o->timeout_ms = ro.timeout_ms = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_CONC: o->concurrency = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_POOL: o->pool_blocks = ro.pool_blocks = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_MAXB: o->max_req_blocks = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_CE: o->corrupt_every = ro.corrupt_every = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_LC: o->lcores = ro.lcores = optarg; break;
		case O_MB: ro.max_blocks = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_GAP:
			if (sscanf(optarg, "%lf,%lf", &o->gap_min, &o->gap_max) != 2 || o->gap_min <= 0 ||
			    o->gap_max < o->gap_min) {
				usage(stderr);
				return 2;
			}
			break;
		case O_TRACE: o->trace = optarg; break;
		case O_TTOK: o->trace_tokens = (uint32_t)strtoul(optarg, NULL, 0); break;
		case O_LOG: o->log = optarg; break;
		case O_ROLE: role = optarg; break;
		case O_HOST: host = ro.host = optarg; break;
		case O_HS: ro.hs_port = (uint16_t)strtoul(optarg, NULL, 0); break;
		case O_NT: ro.nt_port = (uint16_t)strtoul(optarg, NULL, 0); break;
		case O_CTL: ro.ctl_fd = atoi(optarg); break;
		case O_FWD: fwd = (uint16_t)strtoul(optarg, NULL, 0); break;
		case 'v': o->verbose = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (role) {
		/* A child process started by the driver. */
		signal(SIGPIPE, SIG_IGN);
		if (ro.ctl_fd < 0 || !host)
			return 2;
		if (!strcmp(role, "proxy"))
			return soak_proxy_main(host, fwd, ro.ctl_fd);
		ro.producer = !strcmp(role, "producer");
		return soak_role_main(&ro);
	}
	if (!o->timeout_ms || !o->concurrency || !o->max_req_blocks || o->pool_blocks < 2 * o->max_req_blocks ||
	    !o->trace_tokens || o->duration_s <= 0 || o->max_req_blocks > 4096) {
		fprintf(stderr, "kvx-soak: bad option values (pool-blocks must be >= 2 x max-req-blocks)\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	D.rng = o->seed * 0x2545F4914F6CDD1Dull + 1;
	D.rng_req = o->seed * 0x9E6C63D0676A9A99ull + 7;
	ssize_t sl = readlink("/proc/self/exe", D.self, sizeof(D.self) - 1);
	if (sl <= 0)
		return 1;
	D.self[sl] = 0;
	if (o->trace) {
		char err[256];
		if (perf_trace_load(o->trace, 0, &D.trace, err, sizeof(err))) {
			fprintf(stderr, "kvx-soak: %s\n", err);
			return 2;
		}
	}
	D.host[P] = D.host[C] = "127.0.0.1";
	if (o->fault_on[F_PART_LONG] || o->fault_on[F_PART_SHORT]) {
		char why[256] = "";
		if (netns_pair_setup(&D.net, "kvxsoak", "kvs", 77, 0, why, sizeof(why)) == 0) {
			D.use_net = true;
			D.host[P] = D.net.addr[0];
			D.host[C] = D.net.addr[1];
		} else {
			fprintf(stderr, "kvx-soak: partition faults skipped: %s\n", why);
			D.skipped[F_PART_LONG] = D.skipped[F_PART_SHORT] = true;
		}
	}
	D.nreqs = o->concurrency;
	D.reqs = calloc(D.nreqs, sizeof(*D.reqs));
	for (int w = 0; w < NPROC; w++)
		D.pr[w].fd = -1;
	int rc = D.reqs ? soak_run(&D) : -1;
	if (D.use_net)
		netns_pair_teardown(&D.net);
	if (rc) {
		for (int w = 0; w < NPROC; w++)
			if (D.pr[w].pid) {
				kill(D.pr[w].pid, SIGKILL);
				waitpid(D.pr[w].pid, NULL, 0);
			}
		fprintf(stderr, "kvx-soak: setup failed\n");
		return 1;
	}
	summary(&D);
	perf_trace_destroy(D.trace);
	free(D.reqs);
	return !D.corrupt && !D.hung && !D.leaked && !D.crashed && !soak_interrupted ? 0 : 1;
}
