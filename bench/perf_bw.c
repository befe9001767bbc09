/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf bw (and the setup shared with lat): provider bandwidth, perftest style
 * (docs/runtime-notes.md §7). Server: `kvxfer-perf bw [opts]` (no host) waits on the out-of-band
 * TCP port; client: `kvxfer-perf bw [opts] HOST`; `--local` forks the server on this machine.
 * The out-of-band socket carries the parameters, the connection blobs (A, B) and the region
 * descriptor, then a barrier, as perftest's ctx_hand_shake does.
 *
 * `--peer cma` and `--peer memcpy` run the comparison loops of bench/compare.sh instead of
 * kvxfer: a plain process_vm_readv loop against a child process, and a single-core memcpy.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <limits.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perf.h"
#include "perf_xport.h"
#include "perf_util.h"
#include "px_auth.h"
#include "kvxfer/control.h"
#include <sodium.h>
#include "trace_report.h"
#include "kvxfer/mem.h"

#define RESULT_LINE "---------------------------------------------------------------------------------------\n"
#define PX_MAX_SIZE (8ull << 20)

static void usage(bool lat)
{
	printf("usage: kvxfer-perf %s [options] [HOST]\n"
	       "  server: no HOST (waits on --port); client: HOST; --local runs both here\n"
	       "  -t, --transport tcp|shm|verbs|auto   provider (default auto)\n"
	       "  -m, --mode read|write                one-sided op (default write)\n"
	       "%s"
	       "  -s, --size SIZE                      message size, K/M suffixes (default %s)\n"
	       "  -a, --all                            sweep sizes 2 B .. 8 MiB\n"
	       "  -n, --iters N                        iterations per size (default %s)\n"
	       "  -D, --duration SECONDS               run each size for a time instead\n"
	       "      --qps N                          parallel channels (QPs, tcp connections)\n"
	       "      --batch N                        ops per post (default 1)\n"
	       "      --tx-depth N                     outstanding ops (bw, default 128)\n"
	       "      --chunk SIZE                     tcp request size (default 1M)\n"
	       "  -l, --lcores A[,B]                   pin the client to CPU A, the server to B (default:\n"
	       "                                       two distinct CPUs of this machine, see the header)\n"
	       "  -p, --port PORT                      out-of-band TCP port (default 18515)\n"
	       "  -d, --ib-dev DEVICE                  RDMA device to use (implies -t verbs; default: the\n"
	       "                                       first with an ACTIVE port; the RoCE GID follows the\n"
	       "                                       netdev named by KVX_VERBS_IFNAME when set)\n"
	       "      --json FILE                      write the results as JSON ('-' = stdout)\n"
	       "      --output=%s             print only the number\n"
	       "      --local                          run the server on a second thread of this process\n"
	       "      --auth-dir DIR                   both sides prove their keys (kvxfer-perf keygen DIR;\n"
	       "                                       the peer's engine.key in DIR/allowed/) and the\n"
	       "                                       out-of-band socket is sealed; --local: DIR/allowed/\n"
	       "                                       must hold DIR/engine.key\n"
	       "      --mem host|hip[:DEVICE]|hostdev  buffer memory (default host; hostdev: test-only\n"
	       "                                       mock of device memory)\n"
	       "  -V, --version                        print the version and exit\n"
	       "%s",
	       lat ? "lat" : "bw",
	       lat ? "  -m, --mode pingpong|completion       how lat times an op (may follow -m read|write):\n"
		     "                                       pingpong (WRITE default): ib_write_lat's method,\n"
		     "                                       each side WRITEs into the other's buffer and spins\n"
		     "                                       on its last byte; typical = median(round trip / 2)\n"
		     "                                       completion: post -> completion of one op; READ\n"
		     "                                       always uses it (ib_read_lat times a READ that way)\n"
		   : "",
	       lat ? "2" : "65536", lat ? "1000" : "1000",
	       lat ? "latency  " : "bandwidth",
	       lat ? "" : "      --peer cma|memcpy                comparison loop, not kvxfer: "
			  "process_vm_readv from a child (--batch N:\n"
			  "                                       N iovecs per call), or memcpy\n"
			  "      --report_gbits                   bandwidth columns in Gb/s (10^9 bit/s) instead of GB/s\n"
			  "      --plot FILE.png                  draw average bandwidth (GB/s) vs size with "
			  "gnuplot\n"
			  "                                       (use with -a; writes FILE.png.dat/.gp too)\n");
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/* --mem value; NULL or "host" = host buffers. */
static const char *g_mem_arg;
/* -d/--ib-dev value (this side's RDMA device), NULL = first ACTIVE one. */
static const char *g_ib_dev;

/* The result table as printed by this side (px_row()), sent to the server at the end. */
static char g_rows[16384];
static size_t g_rows_len;

void px_row(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fputs(line, stdout);
	size_t l = strlen(line);
	if (g_rows_len + l < sizeof(g_rows)) {
		memcpy(g_rows + g_rows_len, line, l + 1);
		g_rows_len += l;
	}
}

/*
 * --mem hip[:N] (or the test-only hostdev): open the device and allocate through kvx_mem before
 * anything runs, so a missing GPU is reported as "no HIP device" (exit 1). Whether the provider
 * moves that memory is its caps.mem_types' say, checked when the buffers are set up
 * (buf_setup()).
 */
static int mem_check(void)
{
	char why[KVX_MEM_WHY_LEN] = "";
	struct kvx_mem_buf mb;

	if (!g_mem_arg || strcmp(g_mem_arg, "host") == 0)
		return 0;
	if (kvx_mem_buf_init(g_mem_arg, 4096, &mb, why, sizeof(why))) {
		fprintf(stderr, "kvxfer-perf: %s\n", why);
		return 1;
	}
	kvx_mem_buf_fini(&mb);
	return 0;
}

/*
 * Allocate and register one side's buffer of @p len bytes in the memory @p mem_arg names: ""
 * or "host" = host memory filled with @p fill; otherwise kvx_mem_buf_init() (contents zero),
 * registered with its memory type only if the provider's caps.mem_types include it.
 * Returns 0, or -errno with a message in @p err. Free with buf_free() after closing the context.
 */
static int buf_setup(struct kvx_xport_ctx *ctx, const char *mem_arg, uint64_t len, uint8_t fill,
		     struct px_sess *s, struct kvx_xport_mr **mr, char *err, size_t errlen)
{
	struct kvx_xport_caps caps;
	struct kvx_xport_mr_params rp = {.len_bytes = len, .access = KVX_XPORT_ACCESS_ALL};
	memset(&s->mb, 0, sizeof(s->mb));
	s->buf = NULL;
	kvx_xport_query_caps(ctx, &caps);
	if (!mem_arg[0] || !strcmp(mem_arg, "host")) {
		if (!(s->buf = aligned_alloc(4096, (len + 4095) & ~4095ull))) {
			snprintf(err, errlen, "out of memory for %llu bytes", (unsigned long long)len);
			return -ENOMEM;
		}
		memset(s->buf, fill, len);
		rp.addr = s->buf;
	} else {
		char why[KVX_MEM_WHY_LEN] = "";
		int rc = kvx_mem_buf_init(mem_arg, len, &s->mb, why, sizeof(why));
		if (rc) {
			snprintf(err, errlen, "%s", why);
			return rc;
		}
		rp.mem_type = s->mb.type.kind == KVX_MEM_HIP       ? KVX_XPORT_MEM_HIP
			      : s->mb.type.kind == KVX_MEM_HOSTDEV ? KVX_XPORT_MEM_HOSTDEV
								   : KVX_XPORT_MEM_HOST;
		rp.device_id = s->mb.type.device;
		if (!(caps.mem_types & (1u << rp.mem_type))) {
			snprintf(err, errlen, "--mem %s: the %s provider does not move this memory "
				 "(not in its caps.mem_types)", mem_arg, kvx_xport_name(ctx));
			kvx_mem_buf_fini(&s->mb);
			return -ENOTSUP;
		}
		s->buf = s->mb.ptr;
		rp.addr = s->mb.ptr;
	}
	int rc = kvx_xport_mr_register(ctx, &rp, mr);
	if (rc)
		snprintf(err, errlen, "register %llu bytes: %s", (unsigned long long)len,
			 kvx_strerror(rc));
	return rc;
}

static void buf_free(struct px_sess *s)
{
	if (s->mb.mem)
		kvx_mem_buf_fini(&s->mb);
	else
		free(s->buf);
	s->buf = NULL;
}

static int parse_args(int argc, char **argv, bool lat, struct px_cfg *c)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->transport, "auto");
	c->mode = KVX_XPORT_OP_WRITE;
	c->qps = 1;
	c->batch = 1;
	c->depth = 128;
	c->cpu_client = c->cpu_server = -1;
	c->port = 18515;
	c->lat = lat;
	optind = 1;
	int o;
	uint32_t u;
	uint64_t v;
	while ((o = getopt_long(argc, argv, PERF_PX_SHORTOPTS, perf_px_opts, NULL)) != -1) {
		switch (o) {
		case 't':
			if (strcmp(optarg, "tcp") && strcmp(optarg, "shm") && strcmp(optarg, "verbs") &&
			    strcmp(optarg, "auto")) {
				fprintf(stderr, "kvxfer-perf: -t '%s': expected tcp, shm, verbs or auto\n",
					optarg);
				return 2;
			}
			strcpy(c->transport, optarg);
			break;
		case 'm':
			if (!strcmp(optarg, "read"))
				c->mode = KVX_XPORT_OP_READ;
			else if (!strcmp(optarg, "write"))
				c->mode = KVX_XPORT_OP_WRITE;
			else if (lat && !strcmp(optarg, "pingpong"))
				c->lat_method = PX_LAT_PINGPONG;
			else if (lat && !strcmp(optarg, "completion"))
				c->lat_method = PX_LAT_COMPLETION;
			else {
				fprintf(stderr, "kvxfer-perf: -m '%s': expected read or write%s\n", optarg,
					lat ? " (op), or pingpong or completion (timing)" : "");
				return 2;
			}
			break;
		case 's':
			if (perf_parse_size(optarg, &v) || v < 1 || v > (1ull << 30)) {
				fprintf(stderr, "kvxfer-perf: -s '%s': expected 1 .. 1G bytes\n", optarg);
				return 2;
			}
			c->size = v;
			break;
		case 'a':
			c->all = true;
			break;
		case 'n':
			if (perf_parse_size(optarg, &v) || v < 5) {
				fprintf(stderr, "kvxfer-perf: -n '%s': expected >= 5 iterations\n", optarg);
				return 2;
			}
			c->iters = v;
			break;
		case 'D':
			c->duration_s = strtod(optarg, NULL);
			if (c->duration_s <= 0 || c->duration_s > 3600) {
				fprintf(stderr, "kvxfer-perf: -D '%s': expected 0 < seconds <= 3600\n", optarg);
				return 2;
			}
			break;
		case PERF_PX_O_QPS:
			if (parse_u32(optarg, 1, 64, &c->qps)) {
				fprintf(stderr, "kvxfer-perf: --qps '%s': expected 1..64\n", optarg);
				return 2;
			}
			break;
		case PERF_PX_O_BATCH:
			if (parse_u32(optarg, 1, 4096, &c->batch)) {
				fprintf(stderr, "kvxfer-perf: --batch '%s': expected 1..4096\n", optarg);
				return 2;
			}
			break;
		case PERF_PX_O_DEPTH:
			if (parse_u32(optarg, 1, 8192, &c->depth)) {
				fprintf(stderr, "kvxfer-perf: --tx-depth '%s': expected 1..8192\n", optarg);
				return 2;
			}
			break;
		case PERF_PX_O_CHUNK:
			if (perf_parse_size(optarg, &v) || v < 4096 || v > (16u << 20)) {
				fprintf(stderr, "kvxfer-perf: --chunk '%s': expected 4K..16M\n", optarg);
				return 2;
			}
			c->chunk = (uint32_t)v;
			break;
		case 'l': {
			char *end;
			long a = strtol(optarg, &end, 10), b = -1;
			if (*end == ',' || *end == '-')
				b = strtol(end + 1, &end, 10);
			if (*end || a < 0 || a >= CPU_SETSIZE || b >= CPU_SETSIZE) {
				fprintf(stderr, "kvxfer-perf: -l '%s': expected CPU or CPU,CPU\n", optarg);
				return 2;
			}
			c->cpu_client = (int)a;
			c->cpu_server = b >= 0 ? (int)b : (int)a;
			break;
		}
		case 'p':
			if (parse_u32(optarg, 0, 65535, &u)) {
				fprintf(stderr, "kvxfer-perf: -p '%s': expected 0..65535\n", optarg);
				return 2;
			}
			c->port = (uint16_t)u;
			break;
		case PERF_PX_O_JSON:
			c->json = optarg;
			break;
		case 'd':
			if (!optarg[0]) {
				fprintf(stderr, "kvxfer-perf: -d '': expected an RDMA device name (ibv_devices)\n");
				return 2;
			}
			c->ib_dev = g_ib_dev = optarg;
			break;
		case PERF_PX_O_GBITS:
			if (lat) {
				fprintf(stderr, "kvxfer-perf lat: --report_gbits is a bw option\n");
				return 2;
			}
			c->gbits = true;
			break;
		case PERF_PX_O_PLOT:
			if (lat) {
				fprintf(stderr, "kvxfer-perf lat: --plot is for bw sweeps only\n");
				return 2;
			}
			c->plot = optarg;
			break;
		case PERF_PX_O_OUTPUT:
			if (strcmp(optarg, lat ? "latency" : "bandwidth")) {
				fprintf(stderr, "kvxfer-perf: --output=%s: expected %s\n", optarg,
					lat ? "latency" : "bandwidth");
				return 2;
			}
			c->output_bw = true;
			break;
		case PERF_PX_O_LOCAL:
			c->local = true;
			break;
		case PERF_PX_O_AUTH:
			if (!optarg[0]) {
				fprintf(stderr, "kvxfer-perf: --auth-dir '': expected a directory (kvxfer-perf keygen DIR)\n");
				return 2;
			}
			c->auth_dir = optarg;
			break;
		case PERF_PX_O_PEER:
			if (lat) {
				fprintf(stderr, "kvxfer-perf: --peer is a bw option (lat has no peer loops)\n");
				return 2;
			}
			if (strcmp(optarg, "cma") && strcmp(optarg, "memcpy")) {
				fprintf(stderr, "kvxfer-perf: --peer '%s': expected cma or memcpy\n", optarg);
				return 2;
			}
			c->peer = optarg;
			break;
		case PERF_PX_O_MEM: {
			struct kvx_mem_type mt;

			if (kvx_mem_parse_type(optarg, &mt)) {
				fprintf(stderr, "kvxfer-perf: --mem '%s': expected host, hip or "
						"hip:<DEVICE>\n", optarg);
				return 2;
			}
			g_mem_arg = optarg;
			break;
		}
		case 'h':
			usage(lat);
			return 1;
		default:
			usage(lat);
			return 2;
		}
	}
	if (optind < argc)
		c->host = argv[optind];
	if (c->host && c->local) {
		fprintf(stderr, "kvxfer-perf: HOST and --local are exclusive\n");
		return 2;
	}
	if (!c->size)
		c->size = lat ? 2 : 65536;
	if (lat && c->lat_method == PX_LAT_DEFAULT)
		c->lat_method = c->mode == KVX_XPORT_OP_WRITE ? PX_LAT_PINGPONG : PX_LAT_COMPLETION;
	if (lat && c->lat_method == PX_LAT_PINGPONG && c->mode == KVX_XPORT_OP_READ) {
		fprintf(stderr, "kvxfer-perf lat: -m pingpong is for WRITE; READ latency is post -> "
				"completion (as ib_read_lat)\n");
		return 2;
	}
	if (lat && c->lat_method == PX_LAT_PINGPONG && c->qps > 1) {
		fprintf(stderr, "kvxfer-perf lat: --qps %u: the ping-pong polls the last byte of each "
				"WRITE, which needs one channel (or use -m completion)\n", c->qps);
		return 2;
	}
	if (c->ib_dev) {
		/* perftest's -d names an RDMA device: it selects the verbs provider. */
		if (strcmp(c->transport, "auto") && strcmp(c->transport, "verbs")) {
			fprintf(stderr, "kvxfer-perf: -d %s names an RDMA device, which -t %s does not use "
					"(use -t verbs or auto)\n", c->ib_dev, c->transport);
			return 2;
		}
		strcpy(c->transport, "verbs");
	}
	if (c->cpu_client < 0) {
		perf_default_cpu_pair(&c->cpu_client, &c->cpu_server);
		c->cpu_default = true;
	}
	return 0;
}

static void pin(int cpu)
{
	if (cpu < 0)
		return;
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (sched_setaffinity(0, sizeof(s), &s))
		fprintf(stderr, "kvxfer-perf: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
}

static int xfer_all(int fd, void *buf, size_t n, bool tx)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t k = tx ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
		if (k <= 0) {
			if (k < 0 && errno == EINTR)
				continue;
			return k == 0 ? -ECONNRESET : -errno;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/*
 * --auth-dir: the sealed channel of this thread's out-of-band socket (the client's on the main
 * thread, the server's on its own thread with --local), set after px_auth_client/server().
 */
static _Thread_local struct px_auth *t_auth;

int px_msg_send(int fd, struct px_msg *m)
{
	m->magic = PX_MAGIC;
	return t_auth ? px_auth_send(t_auth, fd, m, sizeof(*m)) : xfer_all(fd, m, sizeof(*m), true);
}

int px_msg_recv(int fd, struct px_msg *m, uint32_t type)
{
	int rc = t_auth ? px_auth_recv(t_auth, fd, m, sizeof(*m)) : xfer_all(fd, m, sizeof(*m), false);
	if (rc == -EBADMSG)
		fprintf(stderr, "kvxfer-perf: an out-of-band message failed authentication (forged or "
				"corrupted); closing\n");
	if (rc)
		return rc;
	if (m->magic != PX_MAGIC || (type != PX_ANY && m->type != type)) {
		fprintf(stderr, "kvxfer-perf: out-of-band protocol error (type %u, expected %u)\n",
			m->type, type);
		return -EPROTO;
	}
	m->err[sizeof(m->err) - 1] = '\0';
	m->transport[sizeof(m->transport) - 1] = '\0';
	return 0;
}

/*
 * Context parameters both sides take from the HELLO message; tcp's data listener binds and
 * advertises this side's address of the out-of-band connection @p fd (the peer reached it, and
 * the ping-pong's reverse endpoint connects back to the client through it).
 */
static void ctx_params_from(const struct px_msg *m, int fd, struct kvx_xport_ctx_params *p,
			    char addr[INET6_ADDRSTRLEN])
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	kvx_xport_ctx_params_init(p);
	p->num_channels = m->qps;
	p->queue_depth = m->depth;
	p->chunk_bytes = m->chunk;
	p->op_timeout_ns = m->op_timeout_ns;
	snprintf(addr, INET6_ADDRSTRLEN, "127.0.0.1");
	if (!getsockname(fd, (struct sockaddr *)&ss, &sl))
		getnameinfo((struct sockaddr *)&ss, sl, addr, INET6_ADDRSTRLEN, NULL, 0,
			    NI_NUMERICHOST);
	p->tcp_addr = addr;
	p->device = g_ib_dev; /* this side's -d (verbs only; others ignore it) */
}

/* ---- server ---- */

/* Server: print a block of the client's result rows (perftest servers print the rows too). */
static void print_result(const struct px_msg *m)
{
	static bool said;
	if (!said) {
		printf(RESULT_LINE "  results (measured by the client, reported to this server)\n");
		said = true;
	}
	size_t len = m->blob_len < sizeof(m->blob) ? m->blob_len : sizeof(m->blob) - 1;
	fwrite(m->blob, 1, len, stdout);
	fflush(stdout);
}


/*
 * Server side of the lat ping-pong: create the reverse endpoint (server -> client, blob A2 /
 * B2 with the client's region), then answer each PX_PING barrier with one px_pong_run() until
 * PX_DONE. Returns 0 once PX_DONE has been received, or -errno.
 */
static int server_pingpong(int fd, struct px_msg *m, struct px_sess *s)
{
	size_t bl = 0;
	int rc;
	m->type = PX_BLOB_A2;
	m->rc = kvx_xport_ep_create(s->ctx, &s->ep, m->blob, sizeof(m->blob), &bl);
	m->blob_len = (uint32_t)bl;
	if (m->rc)
		snprintf(m->err, sizeof(m->err), "server: reverse endpoint: %s", kvx_strerror(m->rc));
	if ((rc = px_msg_send(fd, m)) || m->rc)
		return rc ? rc : m->rc;
	if ((rc = px_msg_recv(fd, m, PX_BLOB_B2)))
		return rc;
	if (m->rc)
		return m->rc; /* the client reports its own failure */
	if (m->blob_len > sizeof(m->blob))
		return -EPROTO;
	rc = kvx_xport_ep_connect(s->ep, m->blob, m->blob_len);
	if (!rc)
		rc = kvx_xport_rmr_import(s->ep, m->desc, sizeof(m->desc), &s->rmr);
	m->type = PX_READY;
	m->rc = rc;
	if (rc)
		snprintf(m->err, sizeof(m->err), "server: connect the reverse endpoint: %s",
			 kvx_strerror(rc));
	int src = px_msg_send(fd, m);
	if (src || rc)
		return src ? src : rc;
	for (;;) {
		if ((rc = px_oob_wait(s, 0)) || (rc = px_msg_recv(fd, m, PX_ANY)))
			return rc;
		if (m->type == PX_RESULT) {
			print_result(m);
			continue;
		}
		if (m->type == PX_DONE)
			return 0;
		if (m->type != PX_PING || !m->size || m->size > s->rx_off) {
			fprintf(stderr, "kvxfer-perf server: unexpected message %u (size %llu)\n",
				m->type, (unsigned long long)m->size);
			return -EPROTO;
		}
		uint64_t size = m->size, iters = m->iters;
		/* No WRITE of this size is in flight: reset the byte the pong loop polls. */
		__atomic_store_n(&s->buf[s->rx_off + size - 1], 0, __ATOMIC_RELEASE);
		m->rc = 0;
		if ((rc = px_msg_send(fd, m)))
			return rc;
		int prc = px_pong_run(s, size, iters);
		if ((rc = px_oob_wait(s, 0)) || (rc = px_msg_recv(fd, m, PX_PING_END)))
			return rc;
		m->rc = prc;
		if ((rc = px_msg_send(fd, m)) || prc)
			return rc ? rc : prc;
	}
}

static int server_session(int fd, uint64_t spin_ns, bool same_cpu)
{
	struct px_msg *m = calloc(1, sizeof(*m));
	int client_rc = 0;
	struct kvx_xport_ctx *ctx = NULL;
	struct kvx_xport_mr *mr = NULL;
	struct kvx_xport_ep *ep = NULL;
	struct px_sess bs = {0}; /* the buffer */
	int rc = px_msg_recv(fd, m, PX_HELLO);
	if (rc)
		goto out;
	struct kvx_xport_ctx_params p;
	char addr[INET6_ADDRSTRLEN];
	ctx_params_from(m, fd, &p, addr);
	uint64_t buflen = m->buflen;
	bool pingpong = m->pingpong != 0;
	m->type = PX_HELLO;
	m->mem[sizeof(m->mem) - 1] = '\0';
	char err[128] = "";
	m->rc = kvx_xport_open(m->transport, &p, &ctx);
	if (m->rc)
		snprintf(err, sizeof(err), "open: %s", kvx_strerror(m->rc));
	else
		m->rc = buf_setup(ctx, m->mem, buflen, 0x5a, &bs, &mr, err, sizeof(err));
	if (m->rc)
		snprintf(m->err, sizeof(m->err), "server: %s: %s", m->transport, err);
	if ((rc = px_msg_send(fd, m)) || m->rc)
		goto out;
	if ((rc = px_msg_recv(fd, m, PX_BLOB_A)))
		goto out;
	uint8_t b[KVX_XPORT_BLOB_MAX];
	size_t bl = 0;
	m->type = PX_BLOB_B;
	m->rc = kvx_xport_ep_accept(ctx, m->blob, m->blob_len, &ep, b, sizeof(b), &bl);
	if (!m->rc) {
		memcpy(m->blob, b, bl);
		m->blob_len = (uint32_t)bl;
		m->rc = kvx_xport_mr_export(mr, m->desc, sizeof(m->desc), NULL);
	} else {
		snprintf(m->err, sizeof(m->err), "server: accept: %s", kvx_strerror(m->rc));
	}
	if ((rc = px_msg_send(fd, m)) || m->rc)
		goto out;
	struct kvx_xport_caps caps;
	kvx_xport_query_caps(ctx, &caps);
	if (pingpong) {
		struct px_sess ps = {.ctx = ctx, .tep = ep, .lmr = mr, .caps = caps, .buf = bs.buf,
				     .buflen = buflen, .rx_off = buflen / 2, .fd = fd,
				     .same_cpu = same_cpu};
		if ((rc = server_pingpong(fd, m, &ps)))
			goto out;
		goto bye;
	}
	/* Serve until the client says done: progress on this (pinned) thread; a provider with no
	 * target-side work just waits on the socket. */
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	uint64_t idle_since = 0;
	for (uint64_t i = 0;; i++) {
		int timeout = 0;
		if (caps.needs_progress) {
			if (kvx_xport_progress(ctx)) {
				idle_since = 0;
				continue;
			}
			/* Adaptive idle: spin spin_ns after the last work, then sleep on the
			 * provider's events (the machine may have fewer free cores than threads). */
			uint64_t now = kvx_now_ns();
			if (!idle_since)
				idle_since = now;
			bool nap = now - idle_since > spin_ns;
			if (nap)
				kvx_xport_ctx_wait(ctx, 1);
			if (!nap && (i & 255) != 0)
				continue;
		} else {
			timeout = -1;
		}
		if (poll(&pf, 1, timeout) > 0)
			break;
	}
	/* The client's result rows (PX_RESULT), then PX_DONE. */
	while (!(rc = px_msg_recv(fd, m, PX_ANY)) && m->type == PX_RESULT)
		print_result(m);
	if (!rc && m->type != PX_DONE)
		rc = -EPROTO;
	if (rc)
		goto out;
bye:
	client_rc = m->rc;
	m->type = PX_BYE;
	kvx_xport_ctx_counters(ctx, &m->cnt);
	rc = px_msg_send(fd, m);
	if (!rc && client_rc) {
		fprintf(stderr, "kvxfer-perf server: the client's run failed (%s)\n", kvx_strerror(client_rc));
		rc = client_rc;
	}
out:
	if (rc && rc != -ECONNRESET)
		fprintf(stderr, "kvxfer-perf server: %s\n", kvx_strerror(rc));
	kvx_xport_close(ctx);
	buf_free(&bs);
	free(m);
	return rc;
}

static int listen_on(uint16_t port, uint16_t *bound)
{
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1, zero = 0;
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port),
				 .sin6_addr = IN6ADDR_ANY_INIT};
	socklen_t al = sizeof(a);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 4) ||
	    getsockname(fd, (struct sockaddr *)&a, &al)) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	*bound = ntohs(a.sin6_port);
	return fd;
}

/* "ADDR:PORT" of an accepted peer ("?" if it has no IP address). */
static void peer_str(const struct sockaddr_storage *ss, char *buf, size_t len)
{
	char a[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)ss;
		inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
		port = ntohs(s6->sin6_port);
	} else if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const void *)ss;
		inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
		port = ntohs(s4->sin_port);
	}
	snprintf(buf, len, "%s port %u", a, port);
}

/* How long a connecting client may take over the authentication exchange. */
#define PX_AUTH_TIMEOUT_NS (30ull * 1000000000ull)

static int server_main(const struct px_cfg *c, int lfd)
{
	pin(c->cpu_server);
	int fd;
	uint64_t refused = 0;
	/* With --auth-dir a refused connection is logged, counted and closed; the listener stays. */
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
		if (fd < 0 && errno == EINTR)
			continue;
		if (fd < 0 || !c->auth_dir)
			break;
		char who[64] = "", err[320] = "";
		int arc = px_auth_server(fd, c->auth_dir, PX_AUTH_TIMEOUT_NS, &t_auth, who, sizeof(who), err,
					 sizeof(err));
		if (!arc) {
			fprintf(stderr, "kvxfer-perf server: client authenticated (key %s.key)\n", who);
			break;
		}
		char addr[INET6_ADDRSTRLEN + 16];
		peer_str(&ss, addr, sizeof(addr));
		fprintf(stderr, "kvxfer-perf server: refused %s: %s (%llu refused so far%s)\n", addr, err,
			(unsigned long long)++refused, c->local ? "" : "; still listening");
		close(fd);
		fd = -1;
		if (c->local) /* the one client of --local is this process: nobody else will come */
			break;
	}
	close(lfd);
	if (fd < 0)
		return 1;
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	int rc = server_session(fd, c->lat ? 1000000ull : 20000ull, c->cpu_client == c->cpu_server);
	close(fd);
	px_auth_free(t_auth);
	t_auth = NULL;
	return rc ? 1 : 0;
}

/* --local: the server runs on a second thread of this process (pinned by server_main()). */
struct px_server_thread {
	const struct px_cfg *c;
	int lfd;
	int rc;
};

static void *server_thread(void *arg)
{
	struct px_server_thread *t = arg;
	t->rc = server_main(t->c, t->lfd);
	return NULL;
}

/* ---- client ---- */

static int dial(const char *host, uint16_t port)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	int rc = getaddrinfo(host, ps, &hints, &res);
	if (rc) {
		fprintf(stderr, "kvxfer-perf: %s: %s\n", host, gai_strerror(rc));
		return -EINVAL;
	}
	int fd = -1;
	for (struct addrinfo *a = res; a; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && !connect(fd, a->ai_addr, a->ai_addrlen))
			break;
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		fprintf(stderr, "kvxfer-perf: cannot connect to %s port %u: %s\n", host, port,
			strerror(errno));
		return -ECONNREFUSED;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/*
 * Client side of the out-of-band setup: open, register @p maxsz bytes (ping-pong: a send half
 * and a receive half of maxsz each, page-aligned), connect this side's endpoint to the server
 * and, for the ping-pong, accept the server's endpoint into this side.
 */
static int client_setup(const struct px_cfg *c, int fd, uint64_t maxsz, struct px_sess *s)
{
	struct px_msg *m = calloc(1, sizeof(*m));
	bool pingpong = c->lat && c->lat_method == PX_LAT_PINGPONG;
	uint64_t buflen = pingpong ? 2 * ((maxsz + 4095) & ~4095ull) : maxsz;
	int rc;
	if (!m)
		return -ENOMEM;
	s->fd = fd;
	s->same_cpu = c->cpu_client == c->cpu_server;
	m->type = PX_HELLO;
	m->pingpong = pingpong;
	snprintf(m->mem, sizeof(m->mem), "%s", g_mem_arg ? g_mem_arg : "");
	m->qps = c->qps;
	m->depth = c->depth * c->batch > 8192 ? 16384 : 8192;
	m->chunk = c->chunk;
	m->buflen = buflen;
	m->op_timeout_ns = 30000000000ull;
	strcpy(m->transport, c->transport);
	struct kvx_xport_ctx_params p;
	char addr[INET6_ADDRSTRLEN];
	ctx_params_from(m, fd, &p, addr);
	if ((rc = px_msg_send(fd, m)) || (rc = px_msg_recv(fd, m, PX_HELLO))) {
		if (!c->auth_dir && (rc == -ECONNRESET || rc == -EPIPE))
			fprintf(stderr, "kvxfer-perf: the server closed the connection at the first message "
					"(if it runs with --auth-dir, give this side --auth-dir too)\n");
		goto out;
	}
	if ((rc = m->rc)) {
		fprintf(stderr, "kvxfer-perf: %s\n", m->err);
		goto out;
	}
	if ((rc = kvx_xport_open(c->transport, &p, &s->ctx))) {
		fprintf(stderr, "kvxfer-perf: open %s: %s\n", c->transport, kvx_strerror(rc));
		goto out;
	}
	kvx_xport_query_caps(s->ctx, &s->caps);
	s->buflen = buflen;
	char err[128];
	if ((rc = buf_setup(s->ctx, m->mem, buflen, 0xa5, s, &s->lmr, err, sizeof(err)))) {
		fprintf(stderr, "kvxfer-perf: %s: %s\n", c->transport, err);
		goto out;
	}
	size_t al = 0;
	m->type = PX_BLOB_A;
	if ((rc = kvx_xport_ep_create(s->ctx, &s->ep, m->blob, sizeof(m->blob), &al)))
		goto out;
	m->blob_len = (uint32_t)al;
	if ((rc = px_msg_send(fd, m)) || (rc = px_msg_recv(fd, m, PX_BLOB_B)))
		goto out;
	if ((rc = m->rc)) {
		fprintf(stderr, "kvxfer-perf: %s\n", m->err);
		goto out;
	}
	if ((rc = kvx_xport_ep_connect(s->ep, m->blob, m->blob_len))) {
		fprintf(stderr, "kvxfer-perf: connect: %s\n", kvx_strerror(rc));
		goto out;
	}
	if ((rc = kvx_xport_rmr_import(s->ep, m->desc, sizeof(m->desc), &s->rmr)) || !pingpong)
		goto out;
	/* Ping-pong: the server's endpoint into this side (A2 -> B2 with this side's region). */
	if ((rc = px_msg_recv(fd, m, PX_BLOB_A2)))
		goto out;
	if ((rc = m->rc) || m->blob_len > sizeof(m->blob)) {
		fprintf(stderr, "kvxfer-perf: %s\n", rc ? m->err : "server: blob A2 too long");
		rc = rc ? rc : -EPROTO;
		goto out;
	}
	uint8_t b[KVX_XPORT_BLOB_MAX];
	size_t bl = 0;
	int arc = kvx_xport_ep_accept(s->ctx, m->blob, m->blob_len, &s->tep, b, sizeof(b), &bl);
	if (!arc)
		arc = kvx_xport_mr_export(s->lmr, m->desc, sizeof(m->desc), NULL);
	m->type = PX_BLOB_B2;
	m->rc = arc;
	m->blob_len = arc ? 0 : (uint32_t)bl;
	memcpy(m->blob, b, m->blob_len);
	if ((rc = px_msg_send(fd, m)))
		goto out;
	if ((rc = arc)) {
		fprintf(stderr, "kvxfer-perf: accept the server's endpoint: %s\n", kvx_strerror(rc));
		goto out;
	}
	if ((rc = px_msg_recv(fd, m, PX_READY)))
		goto out;
	if ((rc = m->rc)) {
		fprintf(stderr, "kvxfer-perf: %s\n", m->err);
		goto out;
	}
	s->rx_off = buflen / 2;
out:
	free(m);
	return rc;
}

static void header(const struct px_cfg *c, const struct px_sess *s)
{
	if (c->output_bw)
		return;
	printf(RESULT_LINE);
	printf("                    kvxfer %s %s %s Test\n", c->transport,
	       c->mode == KVX_XPORT_OP_READ ? "READ" : "WRITE", c->lat ? "Latency" : "BW");
	printf(" Number of qps   : %-10u Transport type : %s\n", s->caps.num_channels, c->transport);
	printf(" Batch (ops/post): %-10u TX depth       : %u\n", c->batch, c->lat ? 1 : c->depth);
	printf(" Max op size     : %-10llu Chunk          : %u\n",
	       (unsigned long long)s->caps.max_op_bytes, c->chunk ? c->chunk : (1u << 20));
	printf(" Client CPU      : %-10d Server CPU     : %d%s\n", c->cpu_client, c->cpu_server,
	       c->cpu_default ? " (default pair)" : "");
	if (c->lat)
		printf(" Latency method  : %s\n",
		       c->lat_method == PX_LAT_PINGPONG
			       ? "ping-pong, t = round trip / 2 (as ib_write_lat)"
			       : "post -> completion of one op (as ib_read_lat)");
	printf(" Data ex. method : Ethernet (out-of-band TCP)%s\n",
	       c->auth_dir ? ", authenticated (--auth-dir keys) and sealed" : ", unauthenticated");
}

static void bw_header(const struct px_cfg *c)
{
	if (c->output_bw)
		return;
	printf(RESULT_LINE);
	if (c->gbits)
		px_row(" #bytes     #iterations    BW peak[Gb/sec]  BW average[Gb/sec] MsgRate[Mpps]\n");
	else
		px_row(" #bytes     #iterations    BW peak[GB/s]    BW average[GB/s]   MsgRate[Mpps]\n");
}

static void bw_row(const struct px_cfg *c, uint64_t size, uint64_t n, double peak, double avg,
		   double mpps, FILE *json, bool first)
{
	double k = c->gbits ? 8.0 : 1.0; /* GB/s -> Gb/s */
	if (c->output_bw)
		px_row("%lf\n", avg * k);
	else
		px_row(" %-7llu    %-10llu       %-7.2f            %-7.2f\t\t   %-7.6f\n",
		       (unsigned long long)size, (unsigned long long)n, peak * k, avg * k, mpps);
	if (json)
		fprintf(json,
			"%s    {\"bytes\": %llu, \"iterations\": %llu, \"bw_peak_gbps\": %.4f, "
			"\"bw_avg_gbps\": %.4f, \"msg_rate_mpps\": %.6f}",
			first ? "" : ",\n", (unsigned long long)size, (unsigned long long)n, peak, avg,
			mpps);
}

/*
 * One phase of the bw loop. Keeps up to `depth` ops outstanding; posts `nops` ops, or, when
 * `end_ns` is set, posts until the clock passes it (at least one batch); returns once every
 * posted op has completed, so no op of this phase overlaps the next one. For op indices below
 * `cap`, `tpost` gets the clock read just before its batch's post and `tcpl` the clock read
 * just after the poll that returned its completion: the interval [tpost, tcpl] contains the
 * op's real post-to-completion interval, so rates computed from them never overstate.
 */
struct bw_phase {
	uint64_t nops, end_ns, depth, cap;
	uint64_t *tpost, *tcpl;                /* Array[cap] ns, or NULL (warm-up) */
	uint64_t posted, done, first_post, last_cpl; /* out: ops, ops, ns, ns */
};

static int bw_phase_run(const struct px_cfg *c, struct px_sess *s, const struct kvx_xport_op *ops,
			struct bw_phase *ph)
{
	struct kvx_xport_cpl cpl[64];
	uint64_t idle_since = 0;
	bool stop_post = false;
	ph->posted = ph->done = ph->first_post = ph->last_cpl = 0;
	for (;;) {
		/* One clock read per round of posts: each op's tpost is at or before its post,
		 * so the rates stay understated, and the reads do not cost per small op. */
		uint64_t now = kvx_now_ns();
		while (!stop_post && ph->posted - ph->done + c->batch <= ph->depth) {
			uint32_t k = c->batch;
			if (ph->end_ns) {
				if (ph->posted && now >= ph->end_ns) {
					stop_post = true;
					break;
				}
			} else if (ph->nops - ph->posted < k) {
				k = (uint32_t)(ph->nops - ph->posted);
			}
			int rc = kvx_xport_post_bulk(s->ep, c->mode, ops, k, ph->posted);
			if (rc == -ENOBUFS)
				break;
			if (rc) {
				fprintf(stderr, "kvxfer-perf bw: post: %s\n", kvx_strerror(rc));
				return rc;
			}
			if (!ph->posted)
				ph->first_post = now;
			for (uint64_t j = ph->posted; j < ph->posted + k && j < ph->cap && ph->tpost; j++)
				ph->tpost[j] = now;
			ph->posted += k;
			stop_post = !ph->end_ns && ph->posted >= ph->nops;
		}
		/* Checked before polling: in duration mode posting may stop when every op has
		 * already completed, and then no completion will ever come to end the phase. */
		if (stop_post && ph->done == ph->posted)
			return 0;
		int n = kvx_xport_poll_burst(s->ep, cpl, 64);
		now = kvx_now_ns();
		if (!n) {
			/* Adaptive idle as in the server: spin 20 us, then wait for socket events. */
			if (!idle_since)
				idle_since = now;
			else if (now - idle_since > 20000)
				kvx_xport_ep_wait(s->ep, 1);
			continue;
		}
		idle_since = 0;
		for (int i = 0; i < n; i++) {
			if (cpl[i].status) {
				fprintf(stderr, "kvxfer-perf bw: op failed: %s\n",
					kvx_strerror(cpl[i].status));
				return cpl[i].status;
			}
			if (cpl[i].cookie + cpl[i].n_ops > ph->posted) {
				fprintf(stderr, "kvxfer-perf bw: completion cookie %llu (%u ops) was "
						"never posted\n", (unsigned long long)cpl[i].cookie,
					cpl[i].n_ops);
				return -EPROTO;
			}
			for (uint64_t j = cpl[i].cookie; j < cpl[i].cookie + cpl[i].n_ops; j++)
				if (j < ph->cap && ph->tcpl)
					ph->tcpl[j] = now;
			ph->done += cpl[i].n_ops;
		}
		ph->last_cpl = now;
	}
}

/*
 * BW peak: the best rate over windows of `w` consecutive ops, each window timed from the post
 * of its first op to the latest completion among the ops up to its last (the window's bytes
 * were all moved inside that interval). Windows are at least max(depth, rec/10) ops, so a
 * burst of completions polled together cannot shrink a window below one pipeline's worth of
 * post-to-completion time. The whole run is one such window, so peak >= average; with fewer
 * recorded ops than one window, peak = average. `tcpl` is turned into its running maximum.
 */
static double bw_peak(const uint64_t *tpost, uint64_t *tcpl, uint64_t rec, uint64_t depth,
		      uint64_t size, double avg)
{
	uint64_t w = rec / 10 > depth ? rec / 10 : depth;
	double peak = avg;
	if (w >= rec)
		return peak;
	for (uint64_t i = 1; i < rec; i++)
		if (tcpl[i] < tcpl[i - 1])
			tcpl[i] = tcpl[i - 1];
	for (uint64_t i = 0; i + w <= rec; i++) {
		uint64_t dt = tcpl[i + w - 1] - tpost[i];
		double r = dt ? (double)size * (double)w / (double)dt : 0;
		if (r > peak)
			peak = r;
	}
	return peak;
}

/*
 * Bandwidth of one size. A warm-up of 16 ops runs to completion first; then the timed phase
 * (-n ops, or -D seconds of posting) runs to completion. BW average = bytes of the timed ops /
 * (last completion - first post), as perftest's bw tests time from the first post; MsgRate =
 * ops / that interval. An interval of 0 ns cannot give a rate: error, non-zero exit.
 */
static int bw_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, FILE *json,
		  bool first, double *gbps_out)
{
	uint64_t iters = c->iters ? c->iters : 1000;
	uint64_t cap = c->duration_s > 0 || iters > (1u << 20) ? (1u << 20) : iters;
	uint64_t *tpost = malloc(cap * sizeof(*tpost));
	uint64_t *tcpl = malloc(cap * sizeof(*tcpl));
	struct kvx_xport_op *ops = calloc(c->batch, sizeof(*ops));
	int rc = -ENOMEM;
	if (!tpost || !tcpl || !ops) {
		fprintf(stderr, "kvxfer-perf bw: out of memory for %llu timestamps\n",
			(unsigned long long)cap);
		goto out;
	}
	/* Resident before the timed phase: its first ops must not pay page faults here. */
	memset(tpost, 0, cap * sizeof(*tpost));
	memset(tcpl, 0, cap * sizeof(*tcpl));
	for (uint32_t i = 0; i < c->batch; i++)
		ops[i] = (struct kvx_xport_op){.lmr = s->lmr, .rmr = s->rmr, .len = size};
	uint64_t depth = c->depth < c->batch ? c->batch : c->depth;
	struct bw_phase warm = {.nops = 16, .depth = depth};
	if ((rc = bw_phase_run(c, s, ops, &warm)))
		goto out;
	struct bw_phase ph = {.nops = iters, .depth = depth, .cap = cap, .tpost = tpost,
			      .tcpl = tcpl};
	if (c->duration_s > 0)
		ph.end_ns = kvx_now_ns() + (uint64_t)(c->duration_s * 1e9);
	if ((rc = bw_phase_run(c, s, ops, &ph)))
		goto out;
	uint64_t measured = ph.done;
	uint64_t dt = ph.last_cpl - ph.first_post;
	if (!measured || !dt) {
		fprintf(stderr, "kvxfer-perf bw: %llu ops completed in %llu ns: no rate to report "
				"(clock resolution?)\n", (unsigned long long)measured,
			(unsigned long long)dt);
		rc = -ERANGE;
		goto out;
	}
	double secs = (double)dt * 1e-9;
	double avg = (double)size * (double)measured / (double)dt; /* bytes/ns = GB/s */
	double peak = bw_peak(tpost, tcpl, measured < cap ? measured : cap, depth, size, avg);
	bw_row(c, size, measured, peak, avg, (double)measured / secs / 1e6, json, first);
	*gbps_out = avg;
	rc = 0;
out:
	free(tpost);
	free(tcpl);
	free(ops);
	return rc;
}

/* ---- comparison peers (bench/compare.sh) ---- */

static int peer_main(const struct px_cfg *c)
{
	uint64_t size = c->size, iters = c->iters ? c->iters : 1000;
	uint8_t *src = aligned_alloc(4096, (size + 4095) & ~4095ull);
	uint8_t *dst = aligned_alloc(4096, (size + 4095) & ~4095ull);
	memset(src, 0x3c, size);
	memset(dst, 0, size);
	pid_t child = -1;
	int pfd[2] = {-1, -1};
	if (!strcmp(c->peer, "cma")) {
		/* The source buffer lives in a child that only waits (the target of a READ). */
		if (pipe(pfd))
			return 1;
		child = fork();
		if (child == 0) {
			pin(c->cpu_server);
			char x;
			close(pfd[1]);
			(void)read(pfd[0], &x, 1);
			_exit(0);
		}
		close(pfd[0]);
	}
	pin(c->cpu_client);
	if (!c->output_bw) {
		printf(RESULT_LINE);
		printf("                    PEER (not kvxfer): %s\n",
		       child > 0 ? "plain process_vm_readv loop from a child process (--batch iovecs per call)"
				 : "single-core memcpy loop");
		bw_header(c);
	}
	/* --batch N: N iovecs per process_vm_readv (each the whole buffer, as kvxfer bw's ops all
	 * start at offset 0), counted as N ops; src: same address in the forked child. */
	uint32_t nb = child > 0 ? c->batch : 1;
	if (nb > IOV_MAX)
		nb = IOV_MAX;
	struct iovec *l = calloc(nb, sizeof(*l)), *r = calloc(nb, sizeof(*r));
	if (!l || !r)
		return 1;
	for (uint32_t k = 0; k < nb; k++) {
		l[k] = (struct iovec){dst, size};
		r[k] = (struct iovec){src, size};
	}
	uint64_t warm = 16, n = 0, t0 = 0, end = 0;
	bool timed = c->duration_s > 0;
	for (uint64_t i = 0;; i++) {
		if (i == warm) {
			t0 = kvx_now_ns();
			end = t0 + (uint64_t)(c->duration_s * 1e9);
		}
		if (i >= warm && (timed ? kvx_now_ns() >= end : n == iters))
			break;
		if (child > 0) {
			if (process_vm_readv(child, l, nb, r, nb, 0) != (ssize_t)(size * nb)) {
				fprintf(stderr, "kvxfer-perf peer: process_vm_readv: %s\n", strerror(errno));
				return 1;
			}
		} else {
			memcpy(dst, src, size);
			__asm__ volatile("" : : "r"(dst) : "memory"); /* keep the copy */
		}
		if (i >= warm)
			n += nb;
	}
	free(l);
	free(r);
	double secs = (double)(kvx_now_ns() - t0) * 1e-9;
	double avg = (double)size * (double)n / secs / 1e9;
	FILE *json = c->json ? perf_out_open(c->json) : NULL;
	if (c->json && !json)
		fprintf(stderr, "kvxfer-perf: --json %s: %s\n", c->json, strerror(errno));
	if (json)
		fprintf(json, "{\"command\": \"bw\", \"test\": \"bw\", \"peer\": \"%s\", "
			"\"iovecs_per_call\": %u, \"results\": [\n", c->peer, nb);
	bw_row(c, size, n, avg, avg, (double)n / secs / 1e6, json, true);
	int jrc = 0;
	if (json) {
		fprintf(json, "\n]}\n");
		jrc = perf_out_close(json);
	}
	if (child > 0) {
		close(pfd[1]);
		waitpid(child, NULL, 0);
	}
	free(src);
	free(dst);
	return (c->json && !json) || jrc ? 1 : 0;
}

/* ---- entry ---- */

int px_main(int argc, char **argv, bool lat)
{
	struct px_cfg c;
	int rc = parse_args(argc, argv, lat, &c);
	if (rc)
		return rc == 1 ? 0 : rc;
	if ((rc = mem_check()) != 0)
		return rc;
	/* After mem_check(): a missing GPU is reported as such (exit 1) first. */
	if (lat && c.lat_method == PX_LAT_PINGPONG && g_mem_arg && strcmp(g_mem_arg, "host")) {
		fprintf(stderr, "kvxfer-perf lat: --mem %s: the ping-pong spins on host memory "
				"(use -m completion)\n", g_mem_arg);
		return 2;
	}
	if ((rc = perf_check_gnuplot("bw", c.plot)) != 0)
		return rc;
	if (c.peer && c.auth_dir) {
		fprintf(stderr, "kvxfer-perf bw: --auth-dir authenticates kvxfer's out-of-band socket; --peer %s "
				"has none\n", c.peer);
		return 2;
	}
	if (c.peer && c.plot) {
		fprintf(stderr, "kvxfer-perf bw: --plot draws kvxfer's own sweep; not with --peer %s\n", c.peer);
		return 2;
	}
	if (c.peer)
		return peer_main(&c);
	if (c.auth_dir) {
		/* A directory without a usable key pair is a usage error, before anything listens. */
		uint8_t pk[32], sk[32];
		rc = kvx_ctl_auth_keypair(c.auth_dir, pk, sk);
		sodium_memzero(sk, sizeof(sk));
		if (rc) {
			fprintf(stderr, "kvxfer-perf: --auth-dir %s: no usable key pair (%s); create one with "
					"`kvxfer-perf keygen DIR`\n", c.auth_dir, kvx_strerror(rc));
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	if (!c.host && !c.local) {
		uint16_t port = 0;
		int lfd = listen_on(c.port, &port);
		if (lfd < 0) {
			fprintf(stderr, "kvxfer-perf: listen on port %u: %s\n", c.port, kvx_strerror(lfd));
			return 1;
		}
		printf("************************************\n* Waiting for client to connect... *\n"
		       "************************************\n listening on TCP port %u\n", port);
		fflush(stdout);
		return server_main(&c, lfd);
	}
	/* Client: resolve auto, start the local server if asked, set up over the OOB socket. */
	const char *name = NULL;
	bool same_host = c.local || !strcmp(c.host, "localhost") || !strncmp(c.host, "127.", 4) ||
			 !strcmp(c.host, "::1");
	if ((rc = kvx_xport_select(c.transport, same_host, &name))) {
		char reason[KVX_XPORT_REASON_MAX];
		kvx_xport_provider_probe(c.transport, reason, sizeof(reason));
		char dev[96] = "";
		if (c.ib_dev)
			snprintf(dev, sizeof(dev), " (-d %s)", c.ib_dev);
		fprintf(stderr, "kvxfer-perf: transport %s%s unavailable: %s\n", c.transport, dev, reason);
		return 1;
	}
	snprintf(c.transport, sizeof(c.transport), "%s", name);
	pthread_t server;
	struct px_server_thread st = {.c = &c, .lfd = -1};
	bool server_started = false;
	uint16_t port = c.port;
	if (c.local) {
		int lfd = listen_on(0, &port);
		if (lfd < 0) {
			fprintf(stderr, "kvxfer-perf: listen: %s\n", kvx_strerror(lfd));
			return 1;
		}
		st.lfd = lfd;
		if ((rc = pthread_create(&server, NULL, server_thread, &st))) {
			fprintf(stderr, "kvxfer-perf: server thread: %s\n", strerror(rc));
			close(lfd);
			return 1;
		}
		server_started = true;
	}
	pin(c.cpu_client);
	int fd = dial(c.local ? "127.0.0.1" : c.host, port);
	if (fd < 0)
		return 1;
	if (c.auth_dir) {
		char err[400];
		if ((rc = px_auth_client(fd, c.auth_dir, sizeof(struct px_msg), PX_AUTH_TIMEOUT_NS, &t_auth, err,
					 sizeof(err)))) {
			fprintf(stderr, "kvxfer-perf: %s\n", err);
			close(fd);
			if (server_started)
				pthread_join(server, NULL);
			return 1;
		}
	}
	uint64_t maxsz = c.all ? PX_MAX_SIZE : c.size;
	struct px_sess s = {0};
	rc = client_setup(&c, fd, maxsz, &s);
	FILE *json = NULL;
	if (!rc) {
		header(&c, &s);
		if (c.json && !(json = perf_out_open(c.json))) {
			fprintf(stderr, "kvxfer-perf: --json %s: %s\n", c.json, strerror(errno));
			rc = -EIO;
		}
		if (json)
			fprintf(json,
				"{\"command\": \"%s\", \"version\": \"%s\", \"commit\": \"%s\", "
				"\"test\": \"%s\", \"transport\": \"%s\", \"mode\": \"%s\", \"qps\": %u, "
				"\"batch\": %u, \"tx_depth\": %u, \"auth\": %s, %s\"results\": [\n",
				lat ? "lat" : "bw", perf_version(), perf_commit(), lat ? "lat" : "bw", c.transport,
				c.mode == KVX_XPORT_OP_READ ? "read" : "write", s.caps.num_channels,
				c.batch, lat ? 1 : c.depth, c.auth_dir ? "true" : "false",
				!lat ? "" : c.lat_method == PX_LAT_PINGPONG ? "\"method\": \"pingpong\", "
									 : "\"method\": \"completion\", ");
		if (lat)
			px_lat_header(&c);
		else
			bw_header(&c);
		bool first = true;
		uint64_t psz[64];
		double pgbps[64];
		size_t np = 0;
		for (uint64_t sz = c.all ? 2 : c.size; !rc && sz <= maxsz; sz *= 2) {
			double g = 0;
			rc = lat ? px_lat_run(&c, &s, sz, json, first) : bw_run(&c, &s, sz, json, first, &g);
			if (!rc && !lat && np < KVX_ARRAY_SIZE(psz)) {
				psz[np] = sz;
				pgbps[np++] = g;
			}
			first = false;
			if (!c.all)
				break;
		}
		if (!rc && c.plot) {
			char title[96];
			const char *series[1] = {c.transport};
			snprintf(title, sizeof(title), "kvxfer-perf bw: %s %s, average bandwidth vs size",
				 c.transport, c.mode == KVX_XPORT_OP_READ ? "READ" : "WRITE");
			int prc = perf_plot_bw_sweep(c.plot, title, psz, pgbps, series, np, 1);
			if (prc) {
				fprintf(stderr, "kvxfer-perf bw: --plot %s: %s\n", c.plot,
					prc == -ENOENT ? "gnuplot is not installed" : kvx_strerror(prc));
				rc = prc;
			}
		}
		/* shm: how many ops shared each process_vm_readv/writev (warm-up included), the
		 * figure to set beside the --peer cma loop's --batch (iovecs per call). */
		struct kvx_xport_counters k;
		kvx_xport_ep_counters(s.ep, &k);
		double per_call = k.cma_calls ? (double)(k.ops_ok + k.ops_failed) / (double)k.cma_calls : 0;
		if (!rc && !lat && k.cma_calls && !c.output_bw)
			printf(" CMA calls       : %llu, %.1f ops per call (all sizes, warm-up included)\n",
			       (unsigned long long)k.cma_calls, per_call);
		if (!c.output_bw)
			printf(RESULT_LINE);
		if (json) {
			if (!lat && k.cma_calls)
				fprintf(json, "\n], \"cma_calls\": %llu, \"ops_per_cma_call\": %.2f}\n",
					(unsigned long long)k.cma_calls, per_call);
			else
				fprintf(json, "\n]}\n");
			if (perf_out_close(json) && !rc)
				rc = -EIO;
		}
	}
	/* The result rows, so the server prints them too (whole lines, one blob per message). */
	struct px_msg *m = calloc(1, sizeof(*m));
	for (size_t off = 0; !c.local && off < g_rows_len;) {
		size_t len = g_rows_len - off;
		if (len > sizeof(m->blob) - 1) {
			len = sizeof(m->blob) - 1;
			while (len > 1 && g_rows[off + len - 1] != '\n')
				len--;
		}
		memset(m, 0, sizeof(*m));
		m->type = PX_RESULT;
		m->rc = rc;
		memcpy(m->blob, g_rows + off, len);
		m->blob_len = (uint32_t)len;
		if (px_msg_send(fd, m))
			break;
		off += len;
	}
	/* Barrier and goodbye: the server reports its counters. */
	memset(m, 0, sizeof(*m));
	m->type = PX_DONE;
	m->rc = rc;
	if (!px_msg_send(fd, m) && !px_msg_recv(fd, m, PX_BYE) && kvx_log_enabled(KVX_LOG_INFO))
		fprintf(stderr, "server: requests served %llu, rejected %llu, bytes %llu\n",
			(unsigned long long)m->cnt.reqs_served, (unsigned long long)m->cnt.reqs_rejected,
			(unsigned long long)m->cnt.bytes_served);
	free(m);
	close(fd);
	px_auth_free(t_auth);
	t_auth = NULL;
	kvx_xport_close(s.ctx);
	buf_free(&s);
	if (server_started) {
		pthread_join(server, NULL);
		if (!rc && st.rc)
			rc = -EPROTO;
	}
	return rc ? 1 : 0;
}

int kvx_perf_bw_main(int argc, char **argv)
{
	/* Usage errors (negative or zero counts, CPUs not on this host) exit 2 before anything runs. */
	int rc = px_check_args(argc, argv, false);
	return rc ? rc : px_main(argc, argv, false);
}
