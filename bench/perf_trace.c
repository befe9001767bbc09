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
#include "px_auth.h"
#include "perf.h"
#include "perf_util.h"
#include "trace_cma.h"
#include "trace_tcp_peer.h"
#include "trace_lcores.h"
#include "trace_load.h"
#include "trace_net.h"
#include "perf_trace_internal.h"
#include "trace_prefix.h"
#include "trace_replay.h"
#include "trace_report.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"

#define DEFAULT_TRACE "traces/mooncake_fast25_conversation_trace.head3MB.jsonl" /* in perf_data_dir() */
#define DEFAULT_PORT 7500

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvxfer-perf trace [options]\n"
"Replay a request trace: a producer and a consumer engine exchange each request's KV blocks\n"
"(real model layout, bf16) through the kvxfer engine API, verified byte for byte.\n"
"\n"
"  --model NAME         row of models.csv (default Llama-3.1-8B); split K/V, or MLA latent\n"
"  --models-csv FILE    model table (default %s/models.csv)\n"
"  --trace FILE         Mooncake JSONL or Azure CSV trace (default %s/%s)\n"
"  --requests N         replay the first N requests (default 6; 0 = all)\n"
"  --block-size N       tokens per KV block (default 16)\n"
"  --speed X            scale arrival times: X=2 replays twice as fast; 0 = back to back (default 1)\n"
"  --concurrency N      transfers in flight at most (default 2)\n"
"  -m, --mode read|write  transfer mode (default write)\n"
"  -t, --transport auto|verbs|tcp|shm  provider (default auto)\n"
"  -d, --ib-dev DEV     RDMA device of this host's engines (implies -t verbs; default the first\n"
"                       with an ACTIVE port; KVX_VERBS_IFNAME picks the RoCE GID's netdev)\n"
"  --local              run producer and consumer as two processes on this machine\n"
"  --server             run the producer here and wait for a --client driver on --port\n"
"  --client HOST        drive the run: consumer here, producer = --server at HOST\n"
"  --port N             driver channel port for --server/--client (default %d)\n"
"  --host IP            address this machine's engine advertises (default: with --local\n"
"                       127.0.0.1; with --server/--client the local address of the driver\n"
"                       connection, i.e. the one the other host reached or reaches)\n"
"  --port-range LO-HI   bind the engine's listeners there: handshake LO, notify LO+1, tcp data\n"
"                       LO+2 (--local: the consumer takes LO+3..LO+5); default kernel-chosen\n"
"  --connect-timeout-ms N  deadline to reach the --server and the peer's listeners (10000)\n"
"  --metrics ADDR       serve Prometheus text-format metrics of this host's engine at\n"
"                       http://ADDR/metrics during the run (IP:PORT, :PORT; --local: the\n"
"                       consumer's endpoint takes PORT+1); the addresses are printed at start\n"
"  --runs N             --server: serve N runs, one after the other (default 1; 0 = until\n"
"                       stopped); each run prints its summary and the exit code says if any failed\n"
"  -l, --lcores LIST    polling lcores (DPDK -l syntax); with --local the producer takes the\n"
"                       first half of the lcores and the consumer the rest (CPU sets kept);\n"
"                       --local default: two each, all four on the same two CPUs (two CPUs:\n"
"                       0@(0,1),1@(0,1) for each role; more: the second and third, the first\n"
"                       left to the control lcores)\n"
"  --control-lcore N    CPU of the control lcore (default any)\n"
"  --idle busy|adaptive poller idle policy (default adaptive)\n"
"  --spread on|off      on (default): with >= 2 polling lcores per engine a transfer's layers\n"
"                       are posted by lcore (layer mod n); off: all by the transfer's own lcore\n"
"  --follow on|off      on (default, adaptive idle): a submission that wakes a sleeping poller\n"
"                       moves it to the submitter's CPU for its first poll (params.follow_waker)\n"
"  --slice US           adaptive pollers' scheduler slice, us (params.poller_slice_us: default\n"
"                       100, a woken poller preempts the thread on its CPU; 0: the kernel's)\n"
"  --hugepages on|off   on (default): host KV pools are advised MADV_HUGEPAGE (transparent huge\n"
"                       pages where the kernel allows them; the summary says how much got them)\n"
"  --prefix-cache       blocks whose hash_ids are resident on the consumer are prefix hits;\n"
"                       only the suffix is transferred (Mooncake traces)\n"
"  --verify, --no-verify  check the per-page stamps of every transferred block: a stale,\n"
"                       foreign or misplaced page is caught (default on with --local);\n"
"                       --no-verify: the producer stamps nothing either (engine cost alone)\n"
"  --verify-bytes       fill and check every transferred byte instead (slower)\n"
"  --pool-blocks N      KV blocks per side, made resident at start (default: the largest\n"
"                       request + 25%%, at most a quarter of the available memory)\n"
"  --oversize stream|skip|error  a request larger than the pool: moved in pool-sized pieces\n"
"                       one after the other (default), left out and counted, or a usage error\n"
"  --layer-us N         WRITE: simulated compute per layer on the producer, us (default 0)\n"
"  --timeout-ms N       per-transfer deadline, ms (default 120000)\n"
"  --json FILE, --csv FILE, --plot FILE.png   write results (plot needs gnuplot on PATH)\n"
"  --quiet              no progress line\n"
"  --mem host|hip[:DEVICE]|hostdev  KV pool memory (default host); device pools are filled and\n"
"                       verified through kvx_mem copies; refused up front when the provider's\n"
"                       caps.mem_types lack it (hostdev: test-only mock of device memory)\n"
"  --auth-dir DIR       CURVE-authenticate both engines' handshake and notify sockets with the\n"
"                       key pair and allowed/ peer keys in DIR (kvxfer-perf keygen DIR); with\n"
"                       --local both engines use DIR, so DIR/allowed/ must hold DIR/engine.key\n"
"  --peer cma           (--local) after the replay, move the same bytes again (same requests,\n"
"                       block ids and extents) with a streaming process_vm_writev (WRITE) /\n"
"                       process_vm_readv (READ) loop of up to IOV_MAX iovecs per call from the\n"
"                       initiator role; prints and writes (JSON summary.peer) its throughput\n"
"                       and kvxfer's throughput / the loop's\n"
"  --peer tcp           (--local) the same with a plain streaming socket loop: the producer\n"
"                       sends, the consumer receives (blocking sendmsg/recvmsg of up to IOV_MAX\n"
"                       ranges) over one loopback connection; the tcp main job's like-for-like\n"
"                       reference (iperf3 reuses one cached buffer, the replay cold pools).\n"
"                       Either loop runs after the engines stopped; a loop that fails is\n"
"                       printed n/a (JSON summary.peer.status) and leaves the exit code to the\n"
"                       replay\n",
		perf_data_dir(), perf_data_dir(), DEFAULT_TRACE, DEFAULT_PORT);
}

enum {
	OPT_MODEL = 256, OPT_MODELS_CSV, OPT_TRACE, OPT_REQUESTS, OPT_BLOCK, OPT_SPEED, OPT_CONC,
	OPT_LOCAL, OPT_SERVER, OPT_CLIENT, OPT_PORT, OPT_HOST, OPT_CTL_LCORE, OPT_IDLE, OPT_SPREAD, OPT_FOLLOW, OPT_SLICE, OPT_HUGE, OPT_PREFIX,
	OPT_VERIFY, OPT_VERIFY_BYTES, OPT_NO_VERIFY, OPT_JSON, OPT_CSV, OPT_PLOT, OPT_POOL, OPT_LAYER_US, OPT_TIMEOUT,
	OPT_QUIET, OPT_ROLE, OPT_CTL_FD, OPT_MAX_BLOCKS, OPT_MEM, OPT_OVERSIZE, OPT_PORT_RANGE,
	OPT_CONNECT_TIMEOUT, OPT_RUNS, OPT_METRICS, OPT_IB_DEV, OPT_AUTH_DIR, OPT_PEER,
};

/* An on|off option: *off = (s is "off"); -EINVAL with a message naming it otherwise. */
static int parse_off(const char *name, const char *s, bool *off)
{
	if (strcmp(s, "on") && strcmp(s, "off")) {
		fprintf(stderr, "kvxfer-perf trace: %s: '%s' is not on or off\n", name, s);
		return -EINVAL;
	}
	*off = !strcmp(s, "off");
	return 0;
}

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
		{"spread", required_argument, 0, OPT_SPREAD},
		{"follow", required_argument, 0, OPT_FOLLOW},
		{"hugepages", required_argument, 0, OPT_HUGE},
		{"slice", required_argument, 0, OPT_SLICE},
		{"prefix-cache", no_argument, 0, OPT_PREFIX},
		{"verify", no_argument, 0, OPT_VERIFY},
		{"no-verify", no_argument, 0, OPT_NO_VERIFY},
		{"verify-bytes", no_argument, 0, OPT_VERIFY_BYTES},
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
		{"oversize", required_argument, 0, OPT_OVERSIZE},
		{"port-range", required_argument, 0, OPT_PORT_RANGE},
		{"connect-timeout-ms", required_argument, 0, OPT_CONNECT_TIMEOUT},
		{"runs", required_argument, 0, OPT_RUNS},
		{"metrics", required_argument, 0, OPT_METRICS},
		{"ib-dev", required_argument, 0, 'd'},
		{"auth-dir", required_argument, 0, OPT_AUTH_DIR},
		{"peer", required_argument, 0, OPT_PEER},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	*o = (struct trace_opts){
		.model = "Llama-3.1-8B",
		.models_csv = perf_data_path("models.csv"),
		.trace = perf_data_path(DEFAULT_TRACE),
		.block_tokens = 16,
		.requests = 6,
		.speed = 1,
		.concurrency = 2,
		.slice_us = KVX_LCORE_SLICE_MIN_US, /* the engine's default (params.poller_slice_us) */
		.write_mode = true,
		.transport = "auto",
		.port = DEFAULT_PORT,
		.host = "127.0.0.1",
		.control_lcore = UINT32_MAX,
		.verify = -1,
		.timeout_ms = 120000,
		.connect_timeout_ms = 10000,
		.runs = 1,
		.role = TRACE_ROLE_DRIVER,
		.ctl_fd = -1,
	};
	uint64_t v;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:t:l:d:h", lo, NULL)) != -1) {
		switch (c) {
		case OPT_MODEL: o->model = optarg; o->set |= TRACE_SET_MODEL; break;
		case OPT_PORT_RANGE:
			if (trace_net_parse_range(optarg, 3, &o->port_lo, &o->port_hi)) {
				fprintf(stderr, "kvxfer-perf trace: --port-range '%s': expected LO-HI with at least 3 "
						"ports in 1..65535 (6 with --local)\n", optarg);
				return -EINVAL;
			}
			break;
		case 'd':
			if (!optarg[0] || strlen(optarg) >= 64) {
				fprintf(stderr, "kvxfer-perf trace: -d '%s': expected an RDMA device name (ibv_devices)\n",
					optarg);
				return -EINVAL;
			}
			o->ib_dev = optarg;
			break;
		case OPT_METRICS: {
			const char *col = strrchr(optarg, ':');
			char *end = NULL;
			unsigned long mp = col ? strtoul(col + 1, &end, 10) : 0;
			if (!col || !col[1] || *end || mp > 65534) {
				fprintf(stderr, "kvxfer-perf trace: --metrics '%s': expected IP:PORT, [IPv6]:PORT or "
						":PORT (PORT 0 = any free port)\n", optarg);
				return -EINVAL;
			}
			o->metrics = optarg;
			break;
		}
		case OPT_CONNECT_TIMEOUT:
			if (parse_u64("--connect-timeout-ms", optarg, 1, 3600000, &v))
				return -EINVAL;
			o->connect_timeout_ms = (uint32_t)v;
			break;
		case OPT_RUNS:
			if (parse_u64("--runs", optarg, 0, UINT32_MAX, &v))
				return -EINVAL;
			o->runs = (uint32_t)v;
			break;
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
		case OPT_PEER:
			if (!strcmp(optarg, "cma"))
				o->peer = TRACE_PEER_CMA;
			else if (!strcmp(optarg, "tcp"))
				o->peer = TRACE_PEER_TCP;
			else {
				fprintf(stderr, "kvxfer-perf trace: --peer: '%s' is neither cma nor tcp\n", optarg);
				return -EINVAL;
			}
			break;
		case OPT_TRACE: o->trace = optarg; break;
		case OPT_REQUESTS:
			if (parse_u64("--requests", optarg, 0, UINT32_MAX, &o->requests))
				return -EINVAL;
			break;
		case OPT_BLOCK:
			if (parse_u64("--block-size", optarg, 1, 1u << 16, &v))
				return -EINVAL;
			o->block_tokens = (uint32_t)v;
			o->set |= TRACE_SET_BLOCK;
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
			o->set |= TRACE_SET_MODE;
			break;
		case 't':
			if (strcmp(optarg, "auto") && strcmp(optarg, "verbs") && strcmp(optarg, "tcp") &&
			    strcmp(optarg, "shm")) {
				fprintf(stderr, "kvxfer-perf trace: -t: '%s' is not auto, verbs, tcp or shm\n", optarg);
				return -EINVAL;
			}
			o->transport = optarg;
			o->set |= TRACE_SET_TRANSPORT;
			break;
		case OPT_LOCAL: o->local = true; break;
		case OPT_SERVER: o->server = true; break;
		case OPT_CLIENT: o->client = optarg; break;
		case OPT_PORT:
			if (parse_u64("--port", optarg, 1, 65535, &v))
				return -EINVAL;
			o->port = (uint16_t)v;
			break;
		case OPT_HOST: o->host = optarg; o->set |= TRACE_SET_HOST; break;
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
		case OPT_SPREAD:
			if (parse_off("--spread", optarg, &o->no_spread))
				return -EINVAL;
			break;
		case OPT_FOLLOW:
			if (parse_off("--follow", optarg, &o->no_follow))
				return -EINVAL;
			break;
		case OPT_SLICE:
			if (parse_u64("--slice", optarg, 0, KVX_LCORE_SLICE_MAX_US, &v))
				return -EINVAL;
			if (v && v < KVX_LCORE_SLICE_MIN_US) {
				fprintf(stderr, "kvxfer-perf trace: --slice: %" PRIu64 " us is below the kernel's "
						"shortest slice (%u us); 0 keeps the kernel's default\n",
					v, KVX_LCORE_SLICE_MIN_US);
				return -EINVAL;
			}
			o->slice_us = (uint32_t)v;
			break;
		case OPT_HUGE:
			if (parse_off("--hugepages", optarg, &o->no_hugepages))
				return -EINVAL;
			break;
		case OPT_PREFIX: o->prefix_cache = true; break;
		case OPT_VERIFY: o->verify = 1; break;
		case OPT_NO_VERIFY: o->verify = 0; break;
		case OPT_VERIFY_BYTES: o->verify = 2; break;
		case OPT_JSON: o->json = optarg; break;
		case OPT_CSV: o->csv = optarg; break;
		case OPT_PLOT: o->plot = optarg; break;
		case OPT_POOL:
			if (parse_u64("--pool-blocks", optarg, 1, UINT32_MAX, &o->pool_blocks))
				return -EINVAL;
			o->set |= TRACE_SET_POOL;
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
			o->set |= TRACE_SET_TIMEOUT;
			break;
		case OPT_QUIET: o->quiet = true; break;
		case OPT_OVERSIZE:
			if (!strcmp(optarg, "stream"))
				o->oversize = TRACE_OVERSIZE_STREAM;
			else if (!strcmp(optarg, "skip"))
				o->oversize = TRACE_OVERSIZE_SKIP;
			else if (!strcmp(optarg, "error"))
				o->oversize = TRACE_OVERSIZE_ERROR;
			else {
				fprintf(stderr, "kvxfer-perf trace: --oversize '%s': expected stream, skip or error\n",
					optarg);
				return -EINVAL;
			}
			break;
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
	if (o->ib_dev) {
		/* perftest's -d names an RDMA device: it means the verbs provider. */
		if (strcmp(o->transport, "auto") && strcmp(o->transport, "verbs")) {
			fprintf(stderr, "kvxfer-perf trace: -d %s names an RDMA device, which -t %s does not use "
					"(use -t verbs or auto)\n", o->ib_dev, o->transport);
			return -EINVAL;
		}
		o->transport = "verbs";
	}
	if (o->peer && o->role == TRACE_ROLE_DRIVER && (!o->local || (o->mem && strcmp(o->mem, "host")))) {
		fprintf(stderr, "kvxfer-perf trace: --peer %s needs --local and host pools (both pools in "
				"processes of this machine)\n", o->peer == TRACE_PEER_CMA ? "cma" : "tcp");
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
int trace_check_pool_fits(const struct trace_opts *o, uint64_t pool, uint64_t block_bytes, int sides)
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
	if (!strcmp(path, "-")) {
		if (!strcmp(opt, "--plot")) {
			fprintf(stderr, "kvxfer-perf trace: --plot -: a PNG needs a file name\n");
			return 2;
		}
		return 0; /* stdout (the human-readable summary then goes to stderr) */
	}
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

/*
 * Validate the lcore options one role will get (-l LIST, --control-lcore, --idle) exactly as its
 * engine will (kvx_lcore_cfg_from_strings()), before forking. Returns 0, or 2 with a message.
 */
int trace_check_role_lcores(const struct trace_opts *o, const char *lcores, const char *who)
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
	bool gone;      /* its channel closed (the process died or was killed) */
};

struct dreq {
	bool dispatched, p_done, d_done, complete;
	uint32_t pieces, piece;  /* --oversize stream: pieces of this request (0 = not streamed), current (1-based) */
	uint64_t piece_left;     /* blocks still to send in later pieces */
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
	uint64_t piece_blocks;   /* largest piece of a streamed request: the smaller pool of the two sides */
	uint64_t skipped, streamed;
	uint64_t t0;
	bool aborted;
	char abort_reason[256];
};

/* Options the driver adds for one role (after the user's, so they win): NULL = none. */
struct role_extra {
	const char *metrics;    /* --metrics */
	const char *lcores;     /* --lcores */
	const char *host;       /* --host */
	const char *port_range; /* --port-range */
};

/* Share of a role's host pool (HELLO) backed by transparent huge pages, percent (0..100). */
static double huge_pct(const struct trace_msg_hello *h, uint64_t block_bytes)
{
	double pool = (double)h->pool_blocks * (double)block_bytes;
	double p = pool > 0 ? 100.0 * (double)h->huge_bytes / pool : 0;
	return p > 100 ? 100 : p;
}

static int spawn_role(struct driver *D, int idx, char **argv, int argc, const struct role_extra *x)
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
	av[k++] = D->o->verify == 2 ? "--verify-bytes" : D->o->verify ? "--verify" : "--no-verify";
	if (x && x->lcores) {
		av[k++] = "--lcores";
		av[k++] = x->lcores;
	}
	if (x && x->host) {
		av[k++] = "--host";
		av[k++] = x->host;
	}
	if (x && x->metrics) {
		av[k++] = "--metrics";
		av[k++] = x->metrics;
	}
	if (x && x->port_range) {
		av[k++] = "--port-range";
		av[k++] = x->port_range;
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

static int connect_server(const char *host, uint16_t port, uint32_t timeout_ms)
{
	char why[384];
	int fd = trace_net_connect(host, port, timeout_ms, "the --server's driver channel (--port)", why,
				   sizeof(why));
	if (fd < 0)
		fprintf(stderr, "kvxfer-perf trace: --client: %s; is `kvxfer-perf trace --server` running "
				"there, with the same --port?\n", why);
	return fd;
}

static int recv_hello(struct driver *D, int idx)
{
	struct trace_msg_hdr h;
	void *p;
	int rc = trace_msg_recv(D->s[idx].fd, &h, &p);
	if (rc) {
		fprintf(stderr, "kvxfer-perf trace: %s did not start (%s)%s\n", D->s[idx].name, kvx_strerror(rc),
			rc == -ECONNRESET && D->o->client && !D->o->auth_dir
				? "; if the --server runs with --auth-dir, give --auth-dir here too"
				: "");
		return rc;
	}
	if (h.type == TRACE_MSG_FATAL) {
		fprintf(stderr, "kvxfer-perf trace: %s failed to start: %s\n", D->s[idx].name,
			p ? (char *)p : "");
		free(p);
		return -EIO;
	}
	if (h.type == TRACE_MSG_REFUSED) {
		fprintf(stderr, "kvxfer-perf trace: the --server refused this run: %s\n", p ? (char *)p : "");
		free(p);
		return -ECANCELED; /* a usage error: exit 2 */
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

/* Hand one transfer (a request, or a piece of a streamed one) to both roles. */
static bool send_req(struct driver *D, uint64_t idx, uint64_t blocks, uint64_t hit)
{
	struct trace_msg_req m = {.idx = idx, .blocks = blocks, .hit_blocks = hit};
	for (int s = 0; s < 2; s++) {
		if (trace_msg_send(D->s[s].fd, TRACE_MSG_REQ, &m, sizeof(m), NULL, 0)) {
			D->aborted = true;
			snprintf(D->abort_reason, sizeof(D->abort_reason), "%s is gone", D->s[s].name);
			return false;
		}
	}
	return true;
}

/* Streamed request @p i: send its next piece (at most piece_blocks blocks, no prefix hits). */
static bool send_next_piece(struct driver *D, uint64_t i)
{
	struct dreq *q = &D->dr[i];
	uint64_t n = q->piece_left < D->piece_blocks ? q->piece_left : D->piece_blocks;
	q->piece++;
	q->piece_left -= n;
	q->p_done = q->d_done = false;
	return send_req(D, i | ((uint64_t)q->piece << TRACE_PIECE_SHIFT), n, 0);
}

/*
 * --oversize skip: leave requests with more than @p limit blocks out of the replay (they are
 * counted and their trace lines printed); the rest keep their order and arrival times.
 */
static void skip_oversize(struct driver *D, uint64_t limit)
{
	uint64_t k = 0;
	for (uint64_t i = 0; i < D->n; i++) {
		if (D->rec[i].blocks > limit) {
			fprintf(stderr, "kvxfer-perf trace: skipping %s:%u: %" PRIu64 " blocks, more than the "
					"pool's %" PRIu64 " (--oversize skip)\n",
				D->o->trace, D->rec[i].line, D->rec[i].blocks, limit);
			D->skipped++;
			continue;
		}
		D->t->reqs[k] = D->t->reqs[i];
		D->rec[k] = D->rec[i];
		D->rec[k].idx = k;
		k++;
	}
	D->n = k;
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
		if (r->blocks > D->piece_blocks && r->xfer_blocks > 0) {
			/* Larger than a pool: the transferred blocks go in pool-sized pieces, in order
			 * (the prefix-hit blocks are the consumer's already, as for any request). */
			struct dreq *q = &D->dr[i];
			q->pieces = (uint32_t)((r->xfer_blocks + D->piece_blocks - 1) / D->piece_blocks);
			q->piece = 0;
			q->piece_left = r->xfer_blocks;
			D->streamed++;
			if (!send_next_piece(D, i))
				return;
		} else if (!send_req(D, i, r->blocks, r->hit_blocks)) {
			return;
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
		if (TRACE_IDX_REQ(b->idx) < D->n && h->len == sizeof(*b) + b->n * sizeof(uint32_t) && b->n == b->blocks &&
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
		uint64_t ri = TRACE_IDX_REQ(d->idx), piece = d->idx >> TRACE_PIECE_SHIFT;
		if (ri < D->n && D->dr[ri].dispatched && !D->dr[ri].complete && piece == D->dr[ri].piece) {
			struct dreq *q = &D->dr[ri];
			if (s == 0 && !q->p_done) {
				q->p_done = true;
				q->p_status = d->status;
				if (piece <= 1)
					q->p_first_layer_ns = d->first_layer_ns;
			} else if (s == 1 && !q->d_done) {
				q->d_done = true;
				q->d_status = d->status;
				if (piece <= 1)
					q->d_first_layer_ns = d->first_layer_ns;
				if (d->status == 0)
					D->rec[ri].end_ns = now - D->t0;
			} else {
				goto bad;
			}
			/* The consumer's reason (corruption, timeout) is the more specific one. */
			if (d->status && d->detail[0] && (!q->detail[0] || s == 1))
				snprintf(q->detail, sizeof(q->detail), "%s", d->detail);
			if (d->status)
				fprintf(stderr, "kvxfer-perf trace: tx-%06" PRIu64 " failed on the %s: %s\n",
					d->idx, D->s[s].name, d->detail[0] ? d->detail : kvx_strerror(d->status));
			if (q->p_done && q->d_done) {
				/* A streamed request goes on with its next piece while all went well. */
				if (q->pieces && q->piece < q->pieces && !q->p_status && !q->d_status)
					send_next_piece(D, ri);
				else
					mark_complete(D, ri, now);
			}
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
	/* A role that is gone is left out (poll ignores negative fds). */
	struct pollfd pfd[2] = {{.fd = D->s[0].gone ? -1 : D->s[0].fd, .events = POLLIN},
				{.fd = D->s[1].gone ? -1 : D->s[1].fd, .events = POLLIN}};
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
			D->s[s].gone = true;
			if (!D->aborted)
				snprintf(D->abort_reason, sizeof(D->abort_reason),
					 "%s exited or closed its channel (%s)", D->s[s].name, kvx_strerror(rc));
			D->aborted = true;
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

/* The summary, one detail line per failed request, and why the run was aborted. */
static void print_results(FILE *f, const struct driver *D, const struct perf_trace_run_info *info,
			  const struct perf_trace_summary *sum, const struct perf_trace_counters *c)
{
	perf_trace_print_summary(f, info, sum, c, D->rec, D->n);
	for (uint64_t i = 0; i < D->n; i++)
		if (D->dr[i].detail[0])
			fprintf(f, "  failure detail         %s\n", D->dr[i].detail);
	if (D->aborted)
		fprintf(f, "  aborted                %s\n", D->abort_reason);
}

/* Wait for one message of @p type from role @p s (blocking: the roles are idle by now). */
static int recv_type(struct driver *D, int s, uint32_t type, struct trace_msg_hdr *h, void **p)
{
	int rc = trace_msg_recv(D->s[s].fd, h, p);
	if (rc)
		return rc;
	if (h->type == type)
		return 0;
	fprintf(stderr, "kvxfer-perf trace: --peer %s: %s sent message type %u%s%s\n",
		D->o->peer == TRACE_PEER_CMA ? "cma" : "tcp", D->s[s].name,
		h->type, h->type == TRACE_MSG_FATAL && *p ? ": " : "",
		h->type == TRACE_MSG_FATAL && *p ? (const char *)*p : "");
	free(*p);
	*p = NULL;
	return -EPROTO;
}

/* --peer cma: the target role's pool and block-id log go to the initiator role, which moves
 * the same bytes with the streaming loop of trace_cma.h and reports its counters. */
static void run_peer_cma(struct driver *D, struct perf_trace_counters *c)
{
	int t = D->o->write_mode ? 1 : 0, i = 1 - t;
	struct trace_msg_hdr h;
	void *p = NULL;
	c->peer = "cma";
	c->peer_status = -EPIPE;
	if (D->s[t].gone || D->s[i].gone ||
	    trace_msg_send(D->s[t].fd, TRACE_MSG_CMA_INFO_REQ, NULL, 0, NULL, 0) ||
	    recv_type(D, t, TRACE_MSG_CMA_INFO, &h, &p))
		return;
	if (!D->o->quiet)
		fprintf(stderr, "kvxfer-perf trace: --peer cma: the %s moves the same bytes with process_vm_%sv\n",
			D->s[i].name, D->o->write_mode ? "write" : "read");
	int rc = trace_msg_send(D->s[i].fd, TRACE_MSG_CMA_RUN, p, h.len, NULL, 0);
	free(p);
	p = NULL;
	if (rc || recv_type(D, i, TRACE_MSG_CMA_RESULT, &h, &p))
		return;
	struct trace_cma_result r;
	if (h.len != sizeof(r)) {
		free(p);
		c->peer_status = -EPROTO;
		return;
	}
	memcpy(&r, p, sizeof(r));
	free(p);
	c->peer_status = r.status;
	c->peer_bytes = r.bytes;
	c->peer_wall_s = (double)r.ns / 1e9;
	c->peer_calls = r.calls;
	c->peer_iovs = r.iovs;
	if (r.missing)
		fprintf(stderr, "kvxfer-perf trace: --peer cma: %" PRIu64 " transfers of the %s were not "
				"logged by the %s and were not moved\n", r.missing, D->s[i].name, D->s[t].name);
}

/* A struct trace_cma_result from role @p s; 0 or -errno (its status is the caller's). */
static int recv_result(struct driver *D, int s, struct trace_cma_result *r)
{
	struct trace_msg_hdr h;
	void *p = NULL;
	int rc = recv_type(D, s, TRACE_MSG_CMA_RESULT, &h, &p);
	if (!rc && h.len != sizeof(*r))
		rc = -EPROTO;
	if (!rc)
		memcpy(r, p, sizeof(*r));
	free(p);
	return rc;
}

/* --peer tcp: both roles' pools and block-id logs are swapped; the consumer listens and
 * receives, the producer connects and sends the same bytes (trace_tcp_peer.h). The figures are
 * the receiver's: it holds the last byte. */
static void run_peer_tcp(struct driver *D, struct perf_trace_counters *c)
{
	struct trace_msg_hdr h[2], ph;
	void *info[2] = {NULL, NULL}, *pp = NULL;
	c->peer = "tcp";
	c->peer_status = -EPIPE;
	if (D->s[0].gone || D->s[1].gone)
		return;
	for (int s = 0; s < 2; s++)
		if (trace_msg_send(D->s[s].fd, TRACE_MSG_CMA_INFO_REQ, NULL, 0, NULL, 0) ||
		    recv_type(D, s, TRACE_MSG_CMA_INFO, &h[s], &info[s]))
			goto out;
	if (!D->o->quiet)
		fprintf(stderr, "kvxfer-perf trace: --peer tcp: the producer sends the same bytes to the consumer "
				"over one loopback connection\n");
	uint32_t port;
	if (trace_msg_send(D->s[1].fd, TRACE_MSG_TCP_RECV, info[0], h[0].len, NULL, 0) ||
	    recv_type(D, 1, TRACE_MSG_TCP_PORT, &ph, &pp) || ph.len != sizeof(port))
		goto out;
	memcpy(&port, pp, sizeof(port));
	struct trace_tcp_send ts = {.port = port};
	if (trace_msg_send(D->s[0].fd, TRACE_MSG_TCP_SEND, &ts, sizeof(ts), info[1], h[1].len))
		goto out;
	struct trace_cma_result snd, rcv;
	if (recv_result(D, 0, &snd) || recv_result(D, 1, &rcv))
		goto out;
	c->peer_status = rcv.status ? rcv.status : snd.status;
	if (!c->peer_status && snd.bytes != rcv.bytes)
		c->peer_status = -EPROTO;
	c->peer_bytes = rcv.bytes;
	c->peer_wall_s = (double)rcv.ns / 1e9;
	c->peer_calls = snd.calls + rcv.calls;
	c->peer_iovs = snd.iovs;
	if (snd.missing)
		fprintf(stderr, "kvxfer-perf trace: --peer tcp: %" PRIu64 " transfers were logged by one role "
				"only and were not moved\n", snd.missing);
out:
	free(info[0]);
	free(info[1]);
	free(pp);
}

static int run_driver(struct trace_opts *o, int argc, char **argv)
{
	struct driver D = {.o = o, .s = {{.fd = -1, .name = "producer"}, {.fd = -1, .name = "consumer"}}};
	char err[512] = "";
	int exit_code = 1;
	if (check_out_path("--json", o->json) || check_out_path("--csv", o->csv) ||
	    check_out_path("--plot", o->plot) || perf_check_gnuplot("trace", o->plot))
		return 2;
	if (o->local && o->port_lo && o->port_hi - o->port_lo + 1 < 6) {
		fprintf(stderr, "kvxfer-perf trace: --port-range %u-%u: --local needs 6 ports (3 per engine)\n",
			o->port_lo, o->port_hi);
		return 2;
	}
	if (o->json && o->csv && !strcmp(o->json, "-") && !strcmp(o->csv, "-")) {
		fprintf(stderr, "kvxfer-perf trace: --json - and --csv -: only one of them can be stdout\n");
		return 2;
	}
	if (o->lcores || o->control_lcore != UINT32_MAX) {
		/* The whole list once (grammar, CPUs exist and are allowed, no duplicates). */
		struct trace_opts whole = *o;
		whole.control_lcore = UINT32_MAX;
		if ((o->lcores && trace_check_role_lcores(&whole, o->lcores, "all")) ||
		    (!o->local && trace_check_role_lcores(o, o->lcores, "consumer")))
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
		if (D.pool_blocks > fit) {
			/* Larger requests are streamed through (or skipped); only --oversize error
			 * keeps the old rule of a pool that holds the largest request. */
			if (o->oversize == TRACE_OVERSIZE_ERROR)
				D.pool_blocks = fit > D.max_req_blocks ? fit : D.max_req_blocks;
			else
				D.pool_blocks = fit;
		}
	}
	if (trace_check_pool_fits(o, D.pool_blocks, D.block_bytes, o->local ? 2 : 1)) {
		exit_code = 2;
		goto out;
	}
	for (uint64_t i = 0; i < D.n; i++) {
		const struct perf_trace_req *tr = &D.t->reqs[i];
		D.rec[i].idx = i;
		D.rec[i].line = tr->line;
		D.rec[i].input_tokens = tr->input_tokens;
		D.rec[i].blocks = perf_model_blocks_for_tokens(tr->input_tokens, o->block_tokens);
		if (D.rec[i].blocks > D.pool_blocks && o->oversize == TRACE_OVERSIZE_ERROR) {
			fprintf(stderr,
				"kvxfer-perf trace: %s:%u: request needs %" PRIu64 " blocks (%.2f GB) but the pool has %" PRIu64
				" (--pool-blocks); use fewer --requests, a larger pool, or --oversize stream|skip\n",
				o->trace, tr->line, D.rec[i].blocks,
				(double)D.rec[i].blocks * (double)D.block_bytes / 1e9, D.pool_blocks);
			exit_code = 2;
			goto out;
		}
	}
	if (o->oversize == TRACE_OVERSIZE_SKIP)
		skip_oversize(&D, D.pool_blocks);
	if (D.n == 0) {
		fprintf(stderr, "kvxfer-perf trace: no request left to replay (every one is larger than "
				"the pool of %" PRIu64 " blocks)\n", D.pool_blocks);
		exit_code = 2;
		goto out;
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
	} else if (o->local && o->control_lcore == UINT32_MAX) {
		/* No -l: two polling lcores per role, all on two shared CPUs (trace_default_lcores()). */
		cpu_set_t present, allowed;
		if (!kvx_lcore_host_cpus(&present, &allowed)) {
			CPU_AND(&allowed, &allowed, &present);
			if (trace_default_lcores(&allowed, lbuf) == 2) {
				lc[0] = lbuf[0];
				lc[1] = lbuf[1];
			}
		}
	}
	if (o->local && (o->lcores || o->control_lcore != UINT32_MAX)) {
		/* What each role's engine will be given. */
		for (int s = 0; s < 2; s++)
			if (trace_check_role_lcores(o, lc[s] ? lc[s] : o->lcores, s ? "consumer" : "producer")) {
				exit_code = 2;
				goto out;
			}
	}
	signal(SIGPIPE, SIG_IGN);
	char crange[16] = "", myaddr[64] = "";
	if (o->local) {
		struct role_extra px = {.lcores = lc[0]}, cx = {.lcores = lc[1]};
		if (o->port_lo) {
			/* Both engines on this host: the consumer takes the next three ports. */
			snprintf(crange, sizeof(crange), "%u-%u", o->port_lo + 3u, (unsigned)o->port_hi);
			cx.port_range = crange;
		}
		char cmet[96];
		if (o->metrics) {
			/* Two engines on one host: the consumer's endpoint takes the next port. */
			const char *c = strrchr(o->metrics, ':');
			unsigned mp = (unsigned)strtoul(c + 1, NULL, 10);
			snprintf(cmet, sizeof(cmet), "%.*s:%u", (int)(c - o->metrics), o->metrics, mp ? mp + 1 : 0);
			cx.metrics = cmet;
		}
		if (spawn_role(&D, 0, argv, argc, &px) || spawn_role(&D, 1, argv, argc, &cx))
			goto out;
	} else {
		if (o->auth_dir && trace_auth_check(o->auth_dir)) {
			exit_code = 2;
			goto out;
		}
		int fd = connect_server(o->client, o->port, o->connect_timeout_ms);
		if (fd < 0)
			goto out;
		D.s[0].fd = fd;
		if (o->auth_dir) {
			/* The driver channel proves both keys and is sealed before any option goes. */
			char aerr[400];
			struct px_auth *pa = NULL;
			if (px_auth_client(fd, o->auth_dir, 0, TRACE_AUTH_TIMEOUT_NS, &pa, aerr, sizeof(aerr))) {
				fprintf(stderr, "kvxfer-perf trace: --client: %s\n", aerr);
				goto out;
			}
			trace_wire_seal(fd, pa); /* kept until exit: the channel lives as long as the run */
		}
		/* The options the server must agree on, and the pool this trace needs. */
		struct trace_msg_setup su = {.magic = TRACE_MSG_MAGIC, .block_tokens = o->block_tokens,
					     .write_mode = o->write_mode, .timeout_ms = o->timeout_ms,
					     .layer_us = o->layer_us, .concurrency = o->concurrency,
					     .verify = (uint32_t)o->verify, .pool_blocks = D.pool_blocks,
					     .max_blocks = D.max_req_blocks};
		snprintf(su.version, sizeof(su.version), "%s", perf_version());
		snprintf(su.commit, sizeof(su.commit), "%s", perf_commit());
		snprintf(su.model, sizeof(su.model), "%s", D.m.name);
		snprintf(su.transport, sizeof(su.transport), "%s", o->transport);
		if (trace_msg_send(fd, TRACE_MSG_SETUP, &su, sizeof(su), NULL, 0)) {
			fprintf(stderr, "kvxfer-perf trace: the --server at %s:%u closed the connection\n",
				o->client, o->port);
			goto out;
		}
		/* Default --host: the address this host reaches the server from. */
		struct role_extra cx = {0};
		if (!(o->set & TRACE_SET_HOST) && !trace_net_local_addr(fd, myaddr, sizeof(myaddr)))
			cx.host = myaddr;
		else if (trace_net_is_loopback(o->host) && !trace_net_is_loopback(o->client))
			fprintf(stderr, "kvxfer-perf trace: warning: --host %s is a loopback address, but the "
					"producer is on %s: it cannot reach this consumer's engine there\n",
				o->host, o->client);
		if (spawn_role(&D, 1, argv, argc, &cx))
			goto out;
	}
	int hrc = recv_hello(&D, 0);
	hrc = hrc ? hrc : recv_hello(&D, 1);
	if (hrc) {
		if (hrc == -ECANCELED)
			exit_code = 2;
		goto out;
	}
	const struct trace_msg_hello *hp = &D.s[0].hello, *hc = &D.s[1].hello;
	if (hp->role != TRACE_ROLE_PRODUCER || hc->role != TRACE_ROLE_CONSUMER ||
	    hp->write_mode != hc->write_mode || hp->write_mode != (uint32_t)o->write_mode ||
	    strcmp(hp->model, hc->model) || hp->block_bytes != hc->block_bytes ||
	    hp->block_tokens != hc->block_tokens || hp->num_layers != hc->num_layers) {
		fprintf(stderr, "kvxfer-perf trace: producer (%s, %s, %u-token blocks) and consumer (%s, %s, %u-token blocks) disagree;"
				" start --server with the same --model, --block-size and -m\n",
			hp->model, hp->write_mode ? "WRITE" : "READ", hp->block_tokens, hc->model,
			hc->write_mode ? "WRITE" : "READ", hc->block_tokens);
		exit_code = 2; /* options that must match do not: a usage error */
		goto out;
	}
	if (!o->local) {
		/* The consumer (this host) must reach the producer's listeners: its notify port in both
		 * modes (remote_blocks, release), its handshake port in READ (the consumer dials). */
		if (trace_net_is_loopback(hp->host) && !trace_net_is_loopback(o->client))
			fprintf(stderr, "kvxfer-perf trace: warning: the producer at %s advertises %s (the "
					"--host given to --server): this host will not reach its engine\n",
				o->client, hp->host);
		struct { const char *what; uint16_t port; bool need; } probe[3] = {
			{"the producer's notify listener", hp->notify_port, true},
			{"the producer's handshake listener", hp->handshake_port, !o->write_mode},
			{"the producer's tcp data listener", hp->data_port, !o->write_mode && hp->data_port},
		};
		for (int k = 0; k < 3; k++) {
			if (!probe[k].need)
				continue;
			char why[384];
			int pfd = trace_net_connect(hp->host, probe[k].port, o->connect_timeout_ms, probe[k].what,
						    why, sizeof(why));
			if (pfd < 0) {
				fprintf(stderr, "kvxfer-perf trace: %s; open it on the producer host (--port-range "
						"on --server fixes the ports) or start --server with a --host this "
						"host can reach\n", why);
				goto out;
			}
			close(pfd);
		}
	}
	/* Pieces of streamed requests must fit both pools. */
	D.piece_blocks = D.pool_blocks < hp->pool_blocks ? D.pool_blocks : hp->pool_blocks;
	if (hc->pool_blocks < D.piece_blocks)
		D.piece_blocks = hc->pool_blocks;
	if (o->oversize == TRACE_OVERSIZE_SKIP)
		skip_oversize(&D, D.piece_blocks);
	for (uint64_t i = 0; i < D.n && o->oversize == TRACE_OVERSIZE_ERROR; i++) {
		if (D.rec[i].blocks > D.piece_blocks) {
			fprintf(stderr, "kvxfer-perf trace: %s:%u: request needs %" PRIu64
					" blocks but the producer's pool has %" PRIu64 " (--oversize stream|skip)\n",
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
			" blocks/side (%.2f GB, resident in %.1f s / %.1f s, huge pages %.0f %% / %.0f %%)\n",
		D.m.name, D.m.mla ? "MLA" : "split K/V", D.n, o->trace, o->write_mode ? "WRITE" : "READ",
		hp->transport, hp->pool_blocks, (double)hp->pool_blocks * (double)D.block_bytes / 1e9,
		hp->prefault_ms / 1e3, hc->prefault_ms / 1e3, huge_pct(hp, D.block_bytes), huge_pct(hc, D.block_bytes));
	if ((o->lcores || lc[0]) && o->local)
		fprintf(stderr, "kvxfer-perf trace: polling lcores: producer %s, consumer %s%s\n",
			lc[0] ? lc[0] : o->lcores, lc[1] ? lc[1] : o->lcores,
			o->lcores ? "" : " (default: two each on two CPUs, set with -l)");

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
	/* Counters of every role still there (also after an abort: a killed consumer must not
	 * hide the producer's counters), then stop the roles. */
	bool asked[2] = {false, false};
	for (int s = 0; s < 2; s++)
		if (D.s[s].fd >= 0 && !D.s[s].gone)
			asked[s] = !trace_msg_send(D.s[s].fd, TRACE_MSG_STATS_REQ, NULL, 0, NULL, 0);
	uint64_t dl = kvx_now_ns() + 10000000000ull;
	while (((asked[0] && !D.s[0].have_stats && !D.s[0].gone) ||
		(asked[1] && !D.s[1].have_stats && !D.s[1].gone)) && kvx_now_ns() < dl)
		pump(&D, 100000000u);
	struct perf_trace_summary sum;
	perf_trace_summarize(D.rec, D.n, &sum);
	struct perf_trace_counters c = {.lcore_util = {-1, -1}, .verify_enabled = o->verify != 0,
				       .verify_bytes = o->verify == 2, .engine_cpu_s = {-1, -1}};
	for (int s = 0; s < 2; s++) {
		const struct trace_msg_stats *st = &D.s[s].stats;
		if (!D.s[s].have_stats)
			continue; /* that role died or was killed: its side is n/a, the other still counts */
		c.reported[s] = true;
		c.lcore_util[s] = st->lcore_util;
		c.engine_cpu_s[s] = st->engine_cpu_s;
		c.n_lcores[s] = st->n_lcores < 16 ? st->n_lcores : 16;
		memcpy(c.lcore_bytes[s], st->lcore_bytes, sizeof(c.lcore_bytes[s]));
		c.verify_bad += st->verify_bad;
		if (st->ctl_sent == UINT64_MAX || st->ctl_recv == UINT64_MAX || st->ctl_dropped == UINT64_MAX)
			continue;
		c.ctl_reported[s] = true;
		c.ctl_sent += st->ctl_sent;
		c.ctl_recv += st->ctl_recv;
		c.ctl_dropped += st->ctl_dropped;
	}
	if (o->peer == TRACE_PEER_CMA && !D.aborted)
		run_peer_cma(&D, &c);
	else if (o->peer == TRACE_PEER_TCP && !D.aborted)
		run_peer_tcp(&D, &c);
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
		.prefix_cache = o->prefix_cache, .argc = argc, .argv = argv, .skipped = D.skipped,
		.streamed = D.streamed,
	};
	if (!o->local && D.s[0].fd >= 0 && !D.s[0].gone) {
		/* --server prints the run's results too, and exits non-zero when it failed. */
		char *text = NULL;
		size_t tlen = 0;
		FILE *mf = open_memstream(&text, &tlen);
		if (mf) {
			print_results(mf, &D, &info, &sum, &c);
			fclose(mf);
		}
		int32_t rrc = D.aborted || sum.failures || (o->verify && c.verify_bad) ? 1 : 0;
		trace_msg_send(D.s[0].fd, TRACE_MSG_RESULT, &rrc, sizeof(rrc), text, text ? tlen : 0);
		free(text);
	}
	for (int s = 0; s < 2; s++)
		if (D.s[s].fd >= 0 && !D.s[s].gone)
			trace_msg_send(D.s[s].fd, TRACE_MSG_QUIT, NULL, 0, NULL, 0);
	reap(&D);
	print_results(stdout, &D, &info, &sum, &c);
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

int kvx_perf_trace_main(int argc, char **argv)
{
	struct trace_opts o;
	int rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (o.role == TRACE_ROLE_DRIVER && (rc = trace_mem_check(&o)) != 0)
		return rc;
	if (o.role == TRACE_ROLE_DRIVER && o.ib_dev) {
		char reason[KVX_XPORT_REASON_MAX] = "";
		if (kvx_xport_provider_probe("verbs", reason, sizeof(reason))) {
			fprintf(stderr, "kvxfer-perf trace: -d %s: the verbs provider is unavailable here: %s\n",
				o.ib_dev, reason);
			return 1;
		}
	}
	if (o.role != TRACE_ROLE_DRIVER) {
		if (o.ctl_fd < 0 || !o.pool_blocks) {
			fprintf(stderr, "kvxfer-perf trace: --role is internal (set by the driver)\n");
			return 2;
		}
		signal(SIGPIPE, SIG_IGN);
		return trace_role_main(&o, o.ctl_fd);
	}
	if (o.server)
		return trace_run_server(&o);
	return run_driver(&o, argc, argv);
}
