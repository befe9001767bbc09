/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer-perf trace: replay a real request trace with a real model's KV layout through the
 * public engine API, producer and consumer in separate processes (see trace_replay.h). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <libgen.h>
#include <sys/stat.h>

#include "kvxfer/lcore.h"

#include "kvxfer/common.h"
#include "perf.h"
#include "trace_lcores.h"
#include "trace_load.h"
#include "trace_prefix.h"
#include "trace_replay.h"
#include "trace_report.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"

#ifndef KVX_BENCH_DATA_DIR
#define KVX_BENCH_DATA_DIR "bench/data"
#endif

#define DEFAULT_TRACE KVX_BENCH_DATA_DIR "/traces/mooncake_fast25_conversation_trace.head3MB.jsonl"
#define DEFAULT_PORT 7500

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvxfer-perf trace [options]\n"
"Replay a request trace: a producer and a consumer engine exchange each request's KV blocks\n"
"(real model layout, bf16) through the kvxfer engine API, verified byte for byte.\n"
"\n"
"  --model NAME         row of models.csv (default Llama-3.1-8B); split K/V, or MLA latent\n"
"  --models-csv FILE    model table (default " KVX_BENCH_DATA_DIR "/models.csv)\n"
"  --trace FILE         Mooncake JSONL or Azure CSV trace (default the Mooncake conversation trace)\n"
"  --requests N         replay the first N requests (default 6; 0 = all)\n"
"  --block-size N       tokens per KV block (default 16)\n"
"  --speed X            scale arrival times: X=2 replays twice as fast; 0 = back to back (default 1)\n"
"  --concurrency N      transfers in flight at most (default 2)\n"
"  -m, --mode read|write  transfer mode (default write)\n"
"  -t, --transport auto|verbs|tcp|shm  provider (default auto)\n"
"  --local              run producer and consumer as two processes on this machine\n"
"  --server             run the producer here and wait for a --client driver on --port\n"
"  --client HOST        drive the run: consumer here, producer = --server at HOST\n"
"  --port N             driver channel port for --server/--client (default %d)\n"
"  --host IP            address this machine's engine advertises (default 127.0.0.1)\n"
"  -l, --lcores LIST    polling lcores (DPDK -l syntax); with --local the producer takes the\n"
"                       first half of the lcores and the consumer the rest (CPU sets kept)\n"
"  --control-lcore N    CPU of the control lcore (default any)\n"
"  --idle busy|adaptive poller idle policy (default adaptive)\n"
"  --prefix-cache       blocks whose hash_ids are resident on the consumer are prefix hits;\n"
"                       only the suffix is transferred (Mooncake traces)\n"
"  --verify, --no-verify  check every transferred byte (default on with --local)\n"
"  --pool-blocks N      KV blocks per side, made resident at start (default: the largest\n"
"                       request + 25%%, at most a quarter of the available memory)\n"
"  --layer-us N         WRITE: simulated compute per layer on the producer, us (default 0)\n"
"  --timeout-ms N       per-transfer deadline, ms (default 120000)\n"
"  --json FILE, --csv FILE, --plot FILE.png   write results (plot needs gnuplot on PATH)\n"
"  --quiet              no progress line\n"
"  --mem host|hip[:DEVICE]|hostdev  KV pool memory (default host); device pools are filled and\n"
"                       verified through kvx_mem copies; refused up front when the provider's\n"
"                       caps.mem_types lack it (hostdev: test-only mock of device memory)\n"
"  --auth-dir DIR       CURVE-authenticate both engines' handshake and notify sockets with the\n"
"                       key pair and allowed/ peer keys in DIR (kvxfer-perf keygen DIR); with\n"
"                       --local both engines use DIR, so DIR/allowed/ must hold DIR/engine.key\n",
		DEFAULT_PORT);
}

enum {
	OPT_MODEL = 256, OPT_MODELS_CSV, OPT_TRACE, OPT_REQUESTS, OPT_BLOCK, OPT_SPEED, OPT_CONC,
	OPT_LOCAL, OPT_SERVER, OPT_CLIENT, OPT_PORT, OPT_HOST, OPT_CTL_LCORE, OPT_IDLE, OPT_PREFIX,
	OPT_VERIFY, OPT_NO_VERIFY, OPT_JSON, OPT_CSV, OPT_PLOT, OPT_POOL, OPT_LAYER_US, OPT_TIMEOUT,
	OPT_QUIET, OPT_ROLE, OPT_CTL_FD, OPT_MAX_BLOCKS, OPT_MEM, OPT_AUTH_DIR,
};

static int parse_u64(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *v)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || x < lo || x > hi) {
		fprintf(stderr, "kvxfer-perf trace: %s: '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n",
			name, s, lo, hi);
		return -EINVAL;
	}
	*v = x;
	return 0;
}

/* --mem value; NULL or "host" = host KV pools. */
static const char *g_trace_mem;

/*
 * --mem hip[:N] | hostdev: open the memory type and allocate through kvx_mem (a machine without
 * a GPU gets "no HIP device"), then ask the provider the engines will use whether it moves that
 * memory (kvx_xport_query_caps(): caps.mem_types). `-t auto` is checked as the engine resolves it
 * for device layers: verbs with an RDMA device, else tcp (shm is never chosen for them).
 * Returns 0 (host), or 1 with a message.
 */
static int trace_mem_check(const struct trace_opts *o)
{
	char why[KVX_MEM_WHY_LEN] = "";
	struct kvx_mem_buf mb;

	if (!g_trace_mem || strcmp(g_trace_mem, "host") == 0)
		return 0;
	if (kvx_mem_buf_init(g_trace_mem, 4096, &mb, why, sizeof(why))) {
		fprintf(stderr, "kvxfer-perf trace: %s\n", why);
		return 1;
	}
	enum kvx_xport_mem_type xt = mb.type.kind == KVX_MEM_HIP ? KVX_XPORT_MEM_HIP : KVX_XPORT_MEM_HOSTDEV;
	kvx_mem_buf_fini(&mb);
	const char *prov = o->transport;
	int rc = 0;
	if (!strcmp(prov, "auto"))
		rc = kvx_xport_select("auto", false, &prov);
	struct kvx_xport_ctx *ctx = NULL;
	struct kvx_xport_caps caps = {0};
	if (!rc)
		rc = kvx_xport_open(prov, NULL, &ctx);
	if (!rc)
		rc = kvx_xport_query_caps(ctx, &caps);
	kvx_xport_close(ctx);
	if (rc) {
		fprintf(stderr, "kvxfer-perf trace: --mem %s: cannot open the %s provider to read its "
				"capabilities: %s\n", g_trace_mem, prov, kvx_strerror(rc));
		return 1;
	}
	if (!(caps.mem_types & (1u << xt))) {
		fprintf(stderr, "kvxfer-perf trace: --mem %s: the %s provider does not move this "
				"memory (not in its caps.mem_types)\n", g_trace_mem, prov);
		return 1;
	}
	return 0; /* the roles allocate their KV pools in that memory (trace_role.c) */
}

static int parse_opts(int argc, char **argv, struct trace_opts *o)
{
	static const struct option lo[] = {
		{"model", required_argument, 0, OPT_MODEL},
		{"models-csv", required_argument, 0, OPT_MODELS_CSV},
		{"trace", required_argument, 0, OPT_TRACE},
		{"requests", required_argument, 0, OPT_REQUESTS},
		{"block-size", required_argument, 0, OPT_BLOCK},
		{"speed", required_argument, 0, OPT_SPEED},
		{"concurrency", required_argument, 0, OPT_CONC},
		{"mode", required_argument, 0, 'm'},
		{"transport", required_argument, 0, 't'},
		{"local", no_argument, 0, OPT_LOCAL},
		{"server", no_argument, 0, OPT_SERVER},
		{"client", required_argument, 0, OPT_CLIENT},
		{"port", required_argument, 0, OPT_PORT},
		{"host", required_argument, 0, OPT_HOST},
		{"lcores", required_argument, 0, 'l'},
		{"control-lcore", required_argument, 0, OPT_CTL_LCORE},
		{"idle", required_argument, 0, OPT_IDLE},
		{"prefix-cache", no_argument, 0, OPT_PREFIX},
		{"verify", no_argument, 0, OPT_VERIFY},
		{"no-verify", no_argument, 0, OPT_NO_VERIFY},
		{"json", required_argument, 0, OPT_JSON},
		{"csv", required_argument, 0, OPT_CSV},
		{"plot", required_argument, 0, OPT_PLOT},
		{"pool-blocks", required_argument, 0, OPT_POOL},
		{"layer-us", required_argument, 0, OPT_LAYER_US},
		{"timeout-ms", required_argument, 0, OPT_TIMEOUT},
		{"quiet", no_argument, 0, OPT_QUIET},
		{"role", required_argument, 0, OPT_ROLE},
		{"ctl-fd", required_argument, 0, OPT_CTL_FD},
		{"max-blocks", required_argument, 0, OPT_MAX_BLOCKS},
		{"mem", required_argument, 0, OPT_MEM},
		{"auth-dir", required_argument, 0, OPT_AUTH_DIR},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	*o = (struct trace_opts){
		.model = "Llama-3.1-8B",
		.models_csv = KVX_BENCH_DATA_DIR "/models.csv",
		.trace = DEFAULT_TRACE,
		.block_tokens = 16,
		.requests = 6,
		.speed = 1,
		.concurrency = 2,
		.write_mode = true,
		.transport = "auto",
		.port = DEFAULT_PORT,
		.host = "127.0.0.1",
		.control_lcore = UINT32_MAX,
		.verify = -1,
		.timeout_ms = 120000,
		.role = TRACE_ROLE_DRIVER,
		.ctl_fd = -1,
	};
	uint64_t v;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:t:l:h", lo, NULL)) != -1) {
		switch (c) {
		case OPT_MODEL: o->model = optarg; break;
		case OPT_MEM: {
			struct kvx_mem_type mt;

			if (kvx_mem_parse_type(optarg, &mt)) {
				fprintf(stderr, "kvxfer-perf trace: --mem '%s': expected host, hip, "
						"hip:<DEVICE> or hostdev\n", optarg);
				return -EINVAL;
			}
			g_trace_mem = optarg;
			o->mem = optarg;
			break;
		}
		case OPT_MODELS_CSV: o->models_csv = optarg; break;
		case OPT_AUTH_DIR: o->auth_dir = optarg; break;
		case OPT_TRACE: o->trace = optarg; break;
		case OPT_REQUESTS:
			if (parse_u64("--requests", optarg, 0, UINT32_MAX, &o->requests))
				return -EINVAL;
			break;
		case OPT_BLOCK:
			if (parse_u64("--block-size", optarg, 1, 1u << 16, &v))
				return -EINVAL;
			o->block_tokens = (uint32_t)v;
			break;
		case OPT_SPEED: {
			char *end;
			o->speed = strtod(optarg, &end);
			if (end == optarg || *end || !isfinite(o->speed) || o->speed < 0) {
				fprintf(stderr, "kvxfer-perf trace: --speed: '%s' is not a number >= 0\n", optarg);
				return -EINVAL;
			}
			break;
		}
		case OPT_CONC:
			if (parse_u64("--concurrency", optarg, 1, 4096, &v))
				return -EINVAL;
			o->concurrency = (uint32_t)v;
			break;
		case 'm':
			if (!strcmp(optarg, "write") || !strcmp(optarg, "WRITE"))
				o->write_mode = true;
			else if (!strcmp(optarg, "read") || !strcmp(optarg, "READ"))
				o->write_mode = false;
			else {
				fprintf(stderr, "kvxfer-perf trace: -m: '%s' is not read or write\n", optarg);
				return -EINVAL;
			}
			break;
		case 't':
			if (strcmp(optarg, "auto") && strcmp(optarg, "verbs") && strcmp(optarg, "tcp") &&
			    strcmp(optarg, "shm")) {
				fprintf(stderr, "kvxfer-perf trace: -t: '%s' is not auto, verbs, tcp or shm\n", optarg);
				return -EINVAL;
			}
			o->transport = optarg;
			break;
		case OPT_LOCAL: o->local = true; break;
		case OPT_SERVER: o->server = true; break;
		case OPT_CLIENT: o->client = optarg; break;
		case OPT_PORT:
			if (parse_u64("--port", optarg, 1, 65535, &v))
				return -EINVAL;
			o->port = (uint16_t)v;
			break;
		case OPT_HOST: o->host = optarg; break;
		case 'l': o->lcores = optarg; break;
		case OPT_CTL_LCORE:
			if (parse_u64("--control-lcore", optarg, 0, 65535, &v))
				return -EINVAL;
			o->control_lcore = (uint32_t)v;
			break;
		case OPT_IDLE:
			if (!strcmp(optarg, "busy"))
				o->idle_busy = true;
			else if (!strcmp(optarg, "adaptive"))
				o->idle_busy = false;
			else {
				fprintf(stderr, "kvxfer-perf trace: --idle: '%s' is not busy or adaptive\n", optarg);
				return -EINVAL;
			}
			break;
		case OPT_PREFIX: o->prefix_cache = true; break;
		case OPT_VERIFY: o->verify = 1; break;
		case OPT_NO_VERIFY: o->verify = 0; break;
		case OPT_JSON: o->json = optarg; break;
		case OPT_CSV: o->csv = optarg; break;
		case OPT_PLOT: o->plot = optarg; break;
		case OPT_POOL:
			if (parse_u64("--pool-blocks", optarg, 1, UINT32_MAX, &o->pool_blocks))
				return -EINVAL;
			break;
		case OPT_LAYER_US:
			if (parse_u64("--layer-us", optarg, 0, 10000000, &v))
				return -EINVAL;
			o->layer_us = (uint32_t)v;
			break;
		case OPT_TIMEOUT:
			if (parse_u64("--timeout-ms", optarg, 1, 3600000, &v))
				return -EINVAL;
			o->timeout_ms = (uint32_t)v;
			break;
		case OPT_QUIET: o->quiet = true; break;
		case OPT_ROLE:
			if (!strcmp(optarg, "producer"))
				o->role = TRACE_ROLE_PRODUCER;
			else if (!strcmp(optarg, "consumer"))
				o->role = TRACE_ROLE_CONSUMER;
			else {
				fprintf(stderr, "kvxfer-perf trace: --role: '%s' is not producer or consumer\n", optarg);
				return -EINVAL;
			}
			break;
		case OPT_CTL_FD:
			if (parse_u64("--ctl-fd", optarg, 0, 65535, &v))
				return -EINVAL;
			o->ctl_fd = (int)v;
			break;
		case OPT_MAX_BLOCKS:
			if (parse_u64("--max-blocks", optarg, 1, UINT32_MAX, &v))
				return -EINVAL;
			o->max_blocks = (uint32_t)v;
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvxfer-perf trace: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	int modes = o->local + o->server + (o->client != NULL);
	if (o->role == TRACE_ROLE_DRIVER && modes != 1) {
		fprintf(stderr, "kvxfer-perf trace: choose exactly one of --local, --server, --client HOST\n");
		return -EINVAL;
	}
	if (o->verify < 0)
		o->verify = o->local ? 1 : 0;
	return 0;
}

/* MemAvailable in bytes (4 GiB if /proc is unreadable). */
static uint64_t mem_available_bytes(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	uint64_t avail_kb = 0;
	char line[256];
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &avail_kb) == 1)
			break;
	if (f)
		fclose(f);
	if (!avail_kb)
		avail_kb = 4ull << 20;
	return avail_kb * 1024;
}

/* Blocks per side that fit a quarter of the memory available now. */
static uint64_t default_pool_blocks(uint64_t block_bytes)
{
	uint64_t n = mem_available_bytes() / 4 / block_bytes;
	return n ? n : 1;
}

/*
 * The pools made resident on this machine (@p sides of @p pool blocks) must fit half of
 * MemAvailable together (the default rule is a quarter per side). Returns 0, or 2 with a message.
 */
static int check_pool_fits(const struct trace_opts *o, uint64_t pool, uint64_t block_bytes, int sides)
{
	double avail = (double)mem_available_bytes();
	double per_side = (double)pool * (double)block_bytes;
	if (per_side * sides <= avail / 2)
		return 0;
	fprintf(stderr,
		"kvxfer-perf trace: %s%" PRIu64 " blocks x %.3f MB (--block-size %u tokens) = %.2f GB per side, "
		"%d side(s) here = %.2f GB: more than half of MemAvailable (%.2f GB); use a smaller "
		"--pool-blocks or --block-size\n",
		o->pool_blocks ? "--pool-blocks " : "pool of ", pool, (double)block_bytes / 1e6,
		o->block_tokens, per_side / 1e9, sides, per_side * sides / 1e9, avail / 1e9);
	return 2;
}

/* An output path must be creatable now, not after the replay. Returns 0, or 2 with a message. */
static int check_out_path(const char *opt, const char *path)
{
	if (!path)
		return 0;
	struct stat st;
	char dir[4096];
	if (!path[0]) {
		fprintf(stderr, "kvxfer-perf trace: %s: empty path\n", opt);
		return 2;
	}
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode) || access(path, W_OK)) {
			fprintf(stderr, "kvxfer-perf trace: %s %s: %s\n", opt, path,
				S_ISDIR(st.st_mode) ? "is a directory" : strerror(errno));
			return 2;
		}
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	const char *d = dirname(dir);
	if (stat(d, &st) || !S_ISDIR(st.st_mode) || access(d, W_OK | X_OK)) {
		int e = errno;
		fprintf(stderr, "kvxfer-perf trace: %s %s: cannot create the file in %s: %s\n", opt, path,
			d, stat(d, &st) == 0 && !S_ISDIR(st.st_mode) ? "not a directory" : strerror(e));
		return 2;
	}
	return 0;
}

/* --plot draws with gnuplot at the end of the run: it must be on PATH now. 0, or 2 with a message. */
static int check_gnuplot(const char *plot)
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
	fprintf(stderr, "kvxfer-perf trace: --plot %s needs gnuplot, which is not on PATH (install "
			"gnuplot-nox, or drop --plot)\n", plot);
	return 2;
}

/*
 * Validate the lcore options one role will get (-l LIST, --control-lcore, --idle) exactly as its
 * engine will (kvx_lcore_cfg_from_strings()), before forking. Returns 0, or 2 with a message.
 */
static int check_role_lcores(const struct trace_opts *o, const char *lcores, const char *who)
{
	char ctl[16], err[256] = "";
	if (o->control_lcore != UINT32_MAX)
		snprintf(ctl, sizeof(ctl), "%u", o->control_lcore);
	struct kvx_lcore_opts_str os = {.lcores = lcores,
					.control_lcore = o->control_lcore != UINT32_MAX ? ctl : NULL,
					.idle = o->idle_busy ? "busy" : "adaptive"};
	struct kvx_lcore_cfg *cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		fprintf(stderr, "kvxfer-perf trace: out of memory\n");
		return 1;
	}
	int rc = kvx_lcore_cfg_from_strings(&os, 1, cfg, err, sizeof(err));
	free(cfg);
	if (!rc)
		return 0;
	fprintf(stderr, "kvxfer-perf trace: %s%s%s%s%s (%s lcores): %s\n", lcores ? "-l " : "",
		lcores ? lcores : "", lcores && os.control_lcore ? " " : "",
		os.control_lcore ? "--control-lcore " : "", os.control_lcore ? ctl : "", who, err);
	return 2;
}

/* ---- driver ---- */

struct side {
	int fd;
	pid_t pid;
	const char *name;
	struct trace_msg_hello hello;
	struct trace_msg_stats stats;
	bool have_stats;
};

struct dreq {
	bool dispatched, p_done, d_done, complete;
	int p_status, d_status;
	uint64_t dispatch_ns;
	uint64_t p_first_layer_ns, d_first_layer_ns;
	char detail[160];
};

struct driver {
	struct trace_opts *o;
	struct perf_model m;
	struct perf_trace *t;
	struct perf_prefix_cache *pc;
	struct side s[2]; /* [0] producer, [1] consumer */
	struct perf_trace_rec *rec;
	struct dreq *dr;
	uint64_t n, next, inflight, completed, bytes_done;
	uint64_t block_bytes, pool_blocks, max_req_blocks;
	uint64_t t0;
	bool aborted;
	char abort_reason[256];
};

static int spawn_role(struct driver *D, int idx, char **argv, int argc, const char *lcores)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		perror("kvxfer-perf trace: socketpair");
		return -errno;
	}
	int big = 4 << 20;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	char pool[32], maxb[32];
	snprintf(pool, sizeof(pool), "%" PRIu64, D->pool_blocks);
	snprintf(maxb, sizeof(maxb), "%" PRIu64, D->max_req_blocks);
	const char **av = calloc((size_t)argc + 16, sizeof(*av));
	if (!av)
		return -ENOMEM;
	int k = 0;
	av[k++] = "kvxfer-perf";
	av[k++] = "trace";
	for (int i = 1; i < argc; i++)
		av[k++] = argv[i];
	av[k++] = "--role";
	av[k++] = idx == 0 ? "producer" : "consumer";
	av[k++] = "--ctl-fd";
	av[k++] = "3";
	av[k++] = "--pool-blocks";
	av[k++] = pool;
	av[k++] = "--max-blocks";
	av[k++] = maxb;
	av[k++] = D->o->verify ? "--verify" : "--no-verify";
	if (lcores) {
		av[k++] = "--lcores";
		av[k++] = lcores;
	}
	av[k] = NULL;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("kvxfer-perf trace: fork");
		free(av);
		return -errno;
	}
	if (pid == 0) {
		if (dup2(sv[1], 3) < 0)
			_exit(127);
		/* Exec our own binary by its real path so ps shows kvxfer-perf, not "exe". */
		char self[4096];
		ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (sl > 0) {
			self[sl] = '\0';
			execv(self, (char *const *)av);
		}
		execv("/proc/self/exe", (char *const *)av);
		perror("kvxfer-perf trace: exec /proc/self/exe");
		_exit(127);
	}
	free(av);
	close(sv[1]);
	D->s[idx].fd = sv[0];
	D->s[idx].pid = pid;
	return 0;
}

static int connect_server(const char *host, uint16_t port)
{
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
	int rc = getaddrinfo(host, ps, &hints, &ai);
	if (rc) {
		fprintf(stderr, "kvxfer-perf trace: --client %s: %s\n", host, gai_strerror(rc));
		return -EINVAL;
	}
	int fd = -1;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
		if (fd < 0)
			continue;
		if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			break;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		fprintf(stderr, "kvxfer-perf trace: cannot connect to the --server at %s:%u: %s\n", host,
			port, strerror(errno));
	return fd < 0 ? -ECONNREFUSED : fd;
}

static int recv_hello(struct driver *D, int idx)
{
	struct trace_msg_hdr h;
	void *p;
	int rc = trace_msg_recv(D->s[idx].fd, &h, &p);
	if (rc) {
		fprintf(stderr, "kvxfer-perf trace: %s did not start (%s)\n", D->s[idx].name, kvx_strerror(rc));
		return rc;
	}
	if (h.type == TRACE_MSG_FATAL) {
		fprintf(stderr, "kvxfer-perf trace: %s failed to start: %s\n", D->s[idx].name,
			p ? (char *)p : "");
		free(p);
		return -EIO;
	}
	const struct trace_msg_hello *hello = p;
	if (h.type != TRACE_MSG_HELLO || h.len != sizeof(*hello) || hello->magic != TRACE_MSG_MAGIC) {
		fprintf(stderr, "kvxfer-perf trace: %s sent an unexpected first message\n", D->s[idx].name);
		free(p);
		return -EPROTO;
	}
	D->s[idx].hello = *hello;
	free(p);
	return 0;
}

static void mark_complete(struct driver *D, uint64_t i, uint64_t now)
{
	struct dreq *q = &D->dr[i];
	struct perf_trace_rec *r = &D->rec[i];
	q->complete = true;
	D->inflight--;
	D->completed++;
	r->status = q->d_status ? q->d_status : q->p_status;
	if (r->status == 0) {
		if (!r->end_ns)
			r->end_ns = now - D->t0;
		uint64_t fl = D->o->write_mode ? q->p_first_layer_ns : q->d_first_layer_ns;
		if (fl)
			r->first_layer_ns = r->start_ns + fl;
		D->bytes_done += r->bytes;
		if (D->pc) {
			const struct perf_trace_req *tr = &D->t->reqs[i];
			perf_prefix_cache_insert(D->pc, &D->t->hash_ids[tr->hash_off], tr->n_hash);
		}
	} else {
		r->end_ns = 0;
	}
}

static void dispatch(struct driver *D, uint64_t now)
{
	while (D->next < D->n && D->inflight < D->o->concurrency && !D->aborted) {
		uint64_t i = D->next;
		const struct perf_trace_req *tr = &D->t->reqs[i];
		uint64_t due = D->o->speed == 0 ? 0 : (uint64_t)((double)tr->arrival_ns / D->o->speed);
		if (now - D->t0 < due)
			return;
		struct perf_trace_rec *r = &D->rec[i];
		if (D->pc) {
			uint32_t hit = perf_prefix_cache_match(D->pc, &D->t->hash_ids[tr->hash_off], tr->n_hash);
			r->hit_blocks = perf_prefix_hit_blocks(hit, tr->input_tokens, D->o->block_tokens);
		}
		r->xfer_blocks = r->blocks - r->hit_blocks;
		r->bytes = r->xfer_blocks * D->block_bytes;
		r->arrival_ns = due;
		r->start_ns = now - D->t0;
		D->dr[i].dispatched = true;
		D->dr[i].dispatch_ns = now;
		struct trace_msg_req m = {.idx = i, .blocks = r->blocks, .hit_blocks = r->hit_blocks};
		for (int s = 0; s < 2; s++) {
			if (trace_msg_send(D->s[s].fd, TRACE_MSG_REQ, &m, sizeof(m), NULL, 0)) {
				D->aborted = true;
				snprintf(D->abort_reason, sizeof(D->abort_reason), "%s is gone", D->s[s].name);
				return;
			}
		}
		D->next++;
		D->inflight++;
	}
}

static void handle_role_msg(struct driver *D, int s, const struct trace_msg_hdr *h, void *p, uint64_t now)
{
	if (h->type == TRACE_MSG_FATAL) {
		D->aborted = true;
		snprintf(D->abort_reason, sizeof(D->abort_reason), "%s: %s", D->s[s].name,
			 p ? (const char *)p : "fatal error");
		return;
	}
	if (h->type == TRACE_MSG_STATS && h->len == sizeof(struct trace_msg_stats)) {
		D->s[s].stats = *(const struct trace_msg_stats *)p;
		D->s[s].stats.transport[sizeof(D->s[s].stats.transport) - 1] = '\0';
		D->s[s].have_stats = true;
		return;
	}
	if (h->type == TRACE_MSG_SERVED && s == 0 && h->len >= sizeof(struct trace_msg_blocks)) {
		const struct trace_msg_blocks *b = p;
		if (b->idx < D->n && h->len == sizeof(*b) + b->n * sizeof(uint32_t) && b->n == b->blocks &&
		    b->hit_blocks <= b->n) {
			/* The proxy hands the producer's block ids to the consumer (READ). */
			struct trace_msg_blocks f = *b;
			f.n = b->n - b->hit_blocks;
			const uint32_t *ids = (const uint32_t *)(b + 1);
			if (trace_msg_send(D->s[1].fd, TRACE_MSG_READ, &f, sizeof(f), ids + b->hit_blocks,
					   f.n * sizeof(uint32_t))) {
				D->aborted = true;
				snprintf(D->abort_reason, sizeof(D->abort_reason), "consumer is gone");
			}
			return;
		}
	}
	if (h->type == TRACE_MSG_DONE && h->len == sizeof(struct trace_msg_done)) {
		const struct trace_msg_done *d = p;
		if (d->idx < D->n && D->dr[d->idx].dispatched && !D->dr[d->idx].complete) {
			struct dreq *q = &D->dr[d->idx];
			if (s == 0 && !q->p_done) {
				q->p_done = true;
				q->p_status = d->status;
				q->p_first_layer_ns = d->first_layer_ns;
			} else if (s == 1 && !q->d_done) {
				q->d_done = true;
				q->d_status = d->status;
				q->d_first_layer_ns = d->first_layer_ns;
				if (d->status == 0)
					D->rec[d->idx].end_ns = now - D->t0;
			} else {
				goto bad;
			}
			/* The consumer's reason (corruption, timeout) is the more specific one. */
			if (d->status && d->detail[0] && (!q->detail[0] || s == 1))
				snprintf(q->detail, sizeof(q->detail), "%s", d->detail);
			if (d->status)
				fprintf(stderr, "kvxfer-perf trace: tx-%06" PRIu64 " failed on the %s: %s\n",
					d->idx, D->s[s].name, d->detail[0] ? d->detail : kvx_strerror(d->status));
			if (q->p_done && q->d_done)
				mark_complete(D, d->idx, now);
			return;
		}
	}
bad:
	D->aborted = true;
	snprintf(D->abort_reason, sizeof(D->abort_reason), "%s sent an unexpected message (type %u, %u bytes)",
		 D->s[s].name, h->type, h->len);
}

/* Receive messages from both roles for up to wait_ns. Returns false when a role is gone. */
static bool pump(struct driver *D, uint64_t wait_ns)
{
	struct pollfd pfd[2] = {{.fd = D->s[0].fd, .events = POLLIN}, {.fd = D->s[1].fd, .events = POLLIN}};
	int to = (int)(wait_ns / 1000000u);
	int pr = poll(pfd, 2, to);
	if (pr < 0)
		return errno == EINTR;
	for (int s = 0; s < 2; s++) {
		if (!(pfd[s].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		struct trace_msg_hdr h;
		void *p;
		int rc = trace_msg_recv(D->s[s].fd, &h, &p);
		if (rc) {
			D->aborted = true;
			snprintf(D->abort_reason, sizeof(D->abort_reason), "%s exited or closed its channel (%s)",
				 D->s[s].name, kvx_strerror(rc));
			return false;
		}
		handle_role_msg(D, s, &h, p, kvx_now_ns());
		free(p);
	}
	return true;
}

static void reap(struct driver *D)
{
	for (int s = 0; s < 2; s++) {
		if (D->s[s].pid <= 0)
			continue;
		int st;
		uint64_t deadline = kvx_now_ns() + 15000000000ull;
		pid_t r;
		while ((r = waitpid(D->s[s].pid, &st, WNOHANG)) == 0 && kvx_now_ns() < deadline)
			poll(NULL, 0, 20);
		if (r == 0) {
			fprintf(stderr, "kvxfer-perf trace: %s did not exit; killing pid %d\n", D->s[s].name,
				(int)D->s[s].pid);
			kill(D->s[s].pid, SIGKILL);
			waitpid(D->s[s].pid, &st, 0);
		} else if (r > 0 && (!WIFEXITED(st) || WEXITSTATUS(st))) {
			fprintf(stderr, "kvxfer-perf trace: %s exited with status %d\n", D->s[s].name,
				WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			if (!D->aborted) {
				D->aborted = true;
				snprintf(D->abort_reason, sizeof(D->abort_reason), "%s failed", D->s[s].name);
			}
		}
		D->s[s].pid = 0;
	}
}

static int run_driver(struct trace_opts *o, int argc, char **argv)
{
	struct driver D = {.o = o, .s = {{.fd = -1, .name = "producer"}, {.fd = -1, .name = "consumer"}}};
	char err[512] = "";
	int exit_code = 1;
	if (check_out_path("--json", o->json) || check_out_path("--csv", o->csv) ||
	    check_out_path("--plot", o->plot) || check_gnuplot(o->plot))
		return 2;
	if (o->lcores || o->control_lcore != UINT32_MAX) {
		/* The whole list once (grammar, CPUs exist and are allowed, no duplicates). */
		struct trace_opts whole = *o;
		whole.control_lcore = UINT32_MAX;
		if ((o->lcores && check_role_lcores(&whole, o->lcores, "all")) ||
		    (!o->local && check_role_lcores(o, o->lcores, "consumer")))
			return 2;
	}
	if (perf_model_find(o->models_csv, o->model, &D.m, err, sizeof(err))) {
		fprintf(stderr, "kvxfer-perf trace: --model: %s\n", err);
		return 2;
	}
	if (perf_trace_load(o->trace, o->requests, &D.t, err, sizeof(err))) {
		fprintf(stderr, "kvxfer-perf trace: --trace: %s\n", err);
		return 2;
	}
	if (o->prefix_cache && !D.t->has_hash_ids) {
		fprintf(stderr, "kvxfer-perf trace: --prefix-cache needs hash_ids, and %s (%s) has none\n",
			o->trace, perf_trace_format_name(D.t->format));
		perf_trace_destroy(D.t);
		return 2;
	}
	D.n = D.t->n;
	D.block_bytes = perf_model_block_bytes(&D.m, o->block_tokens);
	D.pool_blocks = o->pool_blocks;
	D.rec = calloc(D.n, sizeof(*D.rec));
	D.dr = calloc(D.n, sizeof(*D.dr));
	if (!D.rec || !D.dr) {
		fprintf(stderr, "kvxfer-perf trace: out of memory\n");
		goto out;
	}
	for (uint64_t i = 0; i < D.n; i++) {
		uint64_t b = perf_model_blocks_for_tokens(D.t->reqs[i].input_tokens, o->block_tokens);
		if (b > D.max_req_blocks)
			D.max_req_blocks = b;
	}
	if (!D.pool_blocks) {
		/* The largest request plus 25%: smaller requests overlap, large ones wait for blocks
		 * (pool exhaustion and reuse, as under an engine's scheduler). Capped at a quarter of
		 * the available memory per side; the pool is made resident before the replay. */
		uint64_t fit = default_pool_blocks(D.block_bytes);
		D.pool_blocks = D.max_req_blocks + (D.max_req_blocks + 3) / 4;
		if (D.pool_blocks > fit)
			D.pool_blocks = fit > D.max_req_blocks ? fit : D.max_req_blocks;
	}
	if (check_pool_fits(o, D.pool_blocks, D.block_bytes, o->local ? 2 : 1)) {
		exit_code = 2;
		goto out;
	}
	for (uint64_t i = 0; i < D.n; i++) {
		const struct perf_trace_req *tr = &D.t->reqs[i];
		D.rec[i].idx = i;
		D.rec[i].line = tr->line;
		D.rec[i].input_tokens = tr->input_tokens;
		D.rec[i].blocks = perf_model_blocks_for_tokens(tr->input_tokens, o->block_tokens);
		if (D.rec[i].blocks > D.pool_blocks) {
			fprintf(stderr,
				"kvxfer-perf trace: %s:%u: request needs %" PRIu64 " blocks (%.2f GB) but the pool has %" PRIu64
				" (--pool-blocks); use fewer --requests or a larger pool\n",
				o->trace, tr->line, D.rec[i].blocks,
				(double)D.rec[i].blocks * (double)D.block_bytes / 1e9, D.pool_blocks);
			exit_code = 2;
			goto out;
		}
	}
	if (o->prefix_cache) {
		/* The consumer's prefix cache holds as many 512-token blocks as its pool. */
		uint64_t cap = D.pool_blocks * o->block_tokens / PERF_TRACE_HASH_BLOCK_TOKENS;
		if (perf_prefix_cache_create(cap ? cap : 1, &D.pc)) {
			fprintf(stderr, "kvxfer-perf trace: cannot create the prefix cache\n");
			goto out;
		}
	}
	/* Start the roles. */
	const char *lc[2] = {NULL, NULL};
	char lbuf[2][TRACE_LCORES_MAX];
	if (o->lcores && o->local) {
		/* Producer: first half of the lcores, consumer: the rest, split by the lcore option
		 * parser itself so every DPDK form (`0@(0,1)`, `(0,1)@0`, ...) keeps its meaning. */
		char lerr[256] = "";
		int sr = trace_split_lcores(o->lcores, lbuf, lerr, sizeof(lerr));
		if (sr < 0) {
			fprintf(stderr, "kvxfer-perf trace: -l %s: %s\n", o->lcores,
				lerr[0] ? lerr : kvx_strerror(sr));
			exit_code = 2;
			goto out;
		}
		if (sr == 2) {
			lc[0] = lbuf[0];
			lc[1] = lbuf[1];
		}
	}
	if (o->local && (o->lcores || o->control_lcore != UINT32_MAX)) {
		/* What each role's engine will be given. */
		for (int s = 0; s < 2; s++)
			if (check_role_lcores(o, lc[s] ? lc[s] : o->lcores, s ? "consumer" : "producer")) {
				exit_code = 2;
				goto out;
			}
	}
	signal(SIGPIPE, SIG_IGN);
	if (o->local) {
		if (spawn_role(&D, 0, argv, argc, lc[0]) || spawn_role(&D, 1, argv, argc, lc[1]))
			goto out;
	} else {
		int fd = connect_server(o->client, o->port);
		if (fd < 0)
			goto out;
		D.s[0].fd = fd;
		if (spawn_role(&D, 1, argv, argc, NULL))
			goto out;
	}
	if (recv_hello(&D, 0) || recv_hello(&D, 1))
		goto out;
	const struct trace_msg_hello *hp = &D.s[0].hello, *hc = &D.s[1].hello;
	if (hp->role != TRACE_ROLE_PRODUCER || hc->role != TRACE_ROLE_CONSUMER ||
	    hp->write_mode != hc->write_mode || hp->write_mode != (uint32_t)o->write_mode ||
	    strcmp(hp->model, hc->model) || hp->block_bytes != hc->block_bytes ||
	    hp->block_tokens != hc->block_tokens || hp->num_layers != hc->num_layers) {
		fprintf(stderr, "kvxfer-perf trace: producer (%s, %s, %u-token blocks) and consumer (%s, %s, %u-token blocks) disagree;"
				" start --server with the same --model, --block-size and -m\n",
			hp->model, hp->write_mode ? "WRITE" : "READ", hp->block_tokens, hc->model,
			hc->write_mode ? "WRITE" : "READ", hc->block_tokens);
		goto out;
	}
	for (uint64_t i = 0; i < D.n; i++) {
		if (D.rec[i].blocks > hp->pool_blocks) {
			fprintf(stderr, "kvxfer-perf trace: %s:%u: request needs %" PRIu64
					" blocks but the producer's pool has %" PRIu64 "\n",
				o->trace, D.rec[i].line, D.rec[i].blocks, hp->pool_blocks);
			goto out;
		}
	}
	for (int s = 0; s < 2; s++) {
		const struct trace_msg_hello *other = &D.s[1 - s].hello;
		struct trace_msg_peer pm = {.handshake_port = other->handshake_port,
					    .notify_port = other->notify_port};
		snprintf(pm.host, sizeof(pm.host), "%s", other->host);
		if (trace_msg_send(D.s[s].fd, TRACE_MSG_PEER, &pm, sizeof(pm), NULL, 0))
			goto out;
	}
	fprintf(stderr, "kvxfer-perf trace: %s %s, %" PRIu64 " requests from %s, %s mode, transport %s, pool %" PRIu64
			" blocks/side (%.2f GB, resident in %.1f s / %.1f s)\n",
		D.m.name, D.m.mla ? "MLA" : "split K/V", D.n, o->trace, o->write_mode ? "WRITE" : "READ",
		hp->transport, hp->pool_blocks, (double)hp->pool_blocks * (double)D.block_bytes / 1e9,
		hp->prefault_ms / 1e3, hc->prefault_ms / 1e3);
	if (o->lcores && o->local)
		fprintf(stderr, "kvxfer-perf trace: polling lcores: producer %s, consumer %s\n",
			lc[0] ? lc[0] : o->lcores, lc[1] ? lc[1] : o->lcores);

	/* Replay. */
	struct perf_progress prog;
	D.t0 = kvx_now_ns();
	perf_progress_init(&prog, stderr, D.t0);
	uint64_t last_msg = D.t0;
	uint64_t stall_ns = (uint64_t)o->timeout_ms * 1000000u * 3 + 15000000000ull;
	while (D.completed < D.n && !D.aborted) {
		uint64_t now = kvx_now_ns();
		dispatch(&D, now);
		uint64_t wait = 100000000u;
		if (D.next < D.n && D.inflight < o->concurrency && o->speed > 0) {
			uint64_t due = D.t0 + (uint64_t)((double)D.t->reqs[D.next].arrival_ns / o->speed);
			wait = due > now ? (due - now < wait ? due - now : wait) : 0;
		}
		uint64_t before = D.completed;
		if (!pump(&D, wait))
			break;
		now = kvx_now_ns();
		if (D.completed != before)
			last_msg = now;
		if (D.inflight && now - last_msg > stall_ns) {
			D.aborted = true;
			snprintf(D.abort_reason, sizeof(D.abort_reason),
				 "timed out: no request completed for %.0f s with %" PRIu64 " in flight (the "
				 "driver's stall limit, 3 x --timeout-ms %u + 15 s; the engines' per-transfer "
				 "deadline should have fired first); raise --timeout-ms if transfers are this slow",
				 (double)(now - last_msg) / 1e9, D.inflight, o->timeout_ms);
		}
		if (!o->quiet)
			perf_progress_update(&prog, now, D.completed, D.n, D.bytes_done);
	}
	perf_progress_finish(&prog);
	if (D.aborted)
		fprintf(stderr, "kvxfer-perf trace: run aborted: %s\n", D.abort_reason);
	/* Requests that never completed are failures, named in the summary. */
	for (uint64_t i = 0; i < D.n; i++) {
		if (D.dr[i].complete)
			continue;
		D.rec[i].status = D.dr[i].dispatched ? -ETIMEDOUT : -ECANCELED;
		D.rec[i].end_ns = 0;
		D.rec[i].xfer_blocks = D.rec[i].blocks - D.rec[i].hit_blocks;
	}
	/* Counters, then stop the roles. */
	for (int s = 0; s < 2 && !D.aborted; s++)
		trace_msg_send(D.s[s].fd, TRACE_MSG_STATS_REQ, NULL, 0, NULL, 0);
	uint64_t dl = kvx_now_ns() + 10000000000ull;
	while (!D.aborted && (!D.s[0].have_stats || !D.s[1].have_stats) && kvx_now_ns() < dl)
		if (!pump(&D, 100000000u))
			break;
	for (int s = 0; s < 2; s++)
		if (D.s[s].fd >= 0)
			trace_msg_send(D.s[s].fd, TRACE_MSG_QUIT, NULL, 0, NULL, 0);

	struct perf_trace_summary sum;
	perf_trace_summarize(D.rec, D.n, &sum);
	struct perf_trace_counters c = {.lcore_util = {-1, -1}, .verify_enabled = o->verify};
	bool have_ctl = true;
	for (int s = 0; s < 2; s++) {
		const struct trace_msg_stats *st = &D.s[s].stats;
		if (!D.s[s].have_stats) {
			have_ctl = false;
			continue;
		}
		c.lcore_util[s] = st->lcore_util;
		c.verify_bad += st->verify_bad;
		if (st->ctl_sent == UINT64_MAX || st->ctl_recv == UINT64_MAX || st->ctl_dropped == UINT64_MAX)
			have_ctl = false;
		else {
			c.ctl_sent += st->ctl_sent;
			c.ctl_recv += st->ctl_recv;
			c.ctl_dropped += st->ctl_dropped;
		}
	}
	if (!have_ctl)
		c.ctl_sent = c.ctl_recv = c.ctl_dropped = UINT64_MAX;
	/* The provider the engines report after the run (both ends agree on it per connection);
	 * "P/D" if they differ, the request only if no role reported. */
	char xport[64];
	const char *tp = D.s[0].have_stats ? D.s[0].stats.transport : "";
	const char *td = D.s[1].have_stats ? D.s[1].stats.transport : "";
	const char *auto_sfx = !strcmp(o->transport, "auto") ? " (auto)" : "";
	if (tp[0] && td[0] && strcmp(tp, td))
		snprintf(xport, sizeof(xport), "%s/%s%s", tp, td, auto_sfx);
	else if (tp[0] || td[0])
		snprintf(xport, sizeof(xport), "%s%s", tp[0] ? tp : td, auto_sfx);
	else
		snprintf(xport, sizeof(xport), "%s", hp->transport);
	struct perf_trace_run_info info = {
		.model = D.m.name, .layout = D.m.mla ? "MLA latent" : "split K/V", .trace = o->trace,
		.mode = o->write_mode ? "WRITE" : "READ", .transport = xport,
		.block_tokens = o->block_tokens, .block_bytes = D.block_bytes,
		.pool_blocks = hp->pool_blocks, .concurrency = o->concurrency, .speed = o->speed,
		.prefix_cache = o->prefix_cache,
	};
	reap(&D);
	perf_trace_print_summary(stdout, &info, &sum, &c, D.rec, D.n);
	for (uint64_t i = 0; i < D.n; i++)
		if (D.dr[i].detail[0])
			printf("  failure detail         %s\n", D.dr[i].detail);
	if (D.aborted)
		printf("  aborted                %s\n", D.abort_reason);
	fflush(stdout);
	int wrc = 0;
	if (o->json)
		wrc |= perf_trace_write_json(o->json, &info, &sum, &c, D.rec, D.n);
	if (o->csv)
		wrc |= perf_trace_write_csv(o->csv, D.rec, D.n);
	if (o->plot)
		wrc |= perf_trace_plot(o->plot, &info, D.rec, D.n);
	bool ok = !D.aborted && sum.failures == 0 && (!o->verify || c.verify_bad == 0) && wrc == 0;
	exit_code = ok ? 0 : 1;
out:
	for (int s = 0; s < 2; s++)
		if (D.s[s].fd >= 0)
			close(D.s[s].fd);
	reap(&D);
	perf_prefix_cache_destroy(D.pc);
	perf_trace_destroy(D.t);
	free(D.rec);
	free(D.dr);
	return exit_code;
}

static int run_server(struct trace_opts *o)
{
	struct perf_model m;
	char err[512];
	if (perf_model_find(o->models_csv, o->model, &m, err, sizeof(err))) {
		fprintf(stderr, "kvxfer-perf trace: --model: %s\n", err);
		return 2;
	}
	uint64_t bb = perf_model_block_bytes(&m, o->block_tokens);
	if (check_pool_fits(o, o->pool_blocks ? o->pool_blocks : default_pool_blocks(bb), bb, 1))
		return 2;
	if (!o->pool_blocks)
		o->pool_blocks = default_pool_blocks(bb);
	if ((o->lcores || o->control_lcore != UINT32_MAX) && check_role_lcores(o, o->lcores, "producer"))
		return 2;
	int ls = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1, zero = 0;
	struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_port = htons(o->port), .sin6_addr = in6addr_any};
	if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) ||
	    bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1)) {
		fprintf(stderr, "kvxfer-perf trace: --server: cannot listen on port %u: %s\n", o->port,
			strerror(errno));
		if (ls >= 0)
			close(ls);
		return 1;
	}
	fprintf(stderr, "kvxfer-perf trace: producer waiting for a --client driver on port %u\n", o->port);
	int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
	close(ls);
	if (fd < 0) {
		perror("kvxfer-perf trace: accept");
		return 1;
	}
	o->role = TRACE_ROLE_PRODUCER;
	int rc = trace_role_main(o, fd);
	close(fd);
	return rc;
}

int kvx_perf_trace_main(int argc, char **argv)
{
	struct trace_opts o;
	int rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (o.role == TRACE_ROLE_DRIVER && (rc = trace_mem_check(&o)) != 0)
		return rc;
	if (o.role != TRACE_ROLE_DRIVER) {
		if (o.ctl_fd < 0 || !o.pool_blocks) {
			fprintf(stderr, "kvxfer-perf trace: --role is internal (set by the driver)\n");
			return 2;
		}
		signal(SIGPIPE, SIG_IGN);
		return trace_role_main(&o, o.ctl_fd);
	}
	if (o.server)
		return run_server(&o);
	return run_driver(&o, argc, argv);
}
