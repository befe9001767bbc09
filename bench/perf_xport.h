/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_PERF_XPORT_H
#define KVX_BENCH_PERF_XPORT_H
/*
 * Shared state of `kvxfer-perf bw` and `kvxfer-perf lat` (perf_bw.c holds options, the
 * out-of-band setup modelled on perftest (docs/runtime-notes.md §7.2) and the bw loop;
 * perf_lat.c the latency loop).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvxfer/mem.h"
#include "kvxfer/transport.h"

/* Out-of-band messages (both ends are this binary; fixed layout, native byte order). */
#define PX_MAGIC 0x4b585046u /* "KXPF" */
enum px_msg_type {
	PX_ANY = 0,  /* px_msg_recv(): accept any type */
	PX_HELLO = 1, PX_BLOB_A, PX_BLOB_B, PX_DONE, PX_BYE,
	/* lat ping-pong (WRITE): the reverse endpoint (server -> client), then per size a
	 * PX_PING barrier (size, iterations; echoed once the server is ready) and a PX_PING_END
	 * barrier (echoed with the server's status once its last pong has completed). */
	PX_BLOB_A2, PX_BLOB_B2, PX_READY, PX_PING, PX_PING_END,
	/* Client -> server before PX_DONE: the result table as printed by the client (NUL-terminated
	 * text in blob, at most KVX_XPORT_BLOB_MAX bytes per message, whole lines), which the server
	 * prints too (perftest servers print result rows). */
	PX_RESULT,
};

struct px_msg {
	uint32_t magic, type;
	int32_t rc;
	uint32_t qps, depth, chunk;
	uint64_t buflen, op_timeout_ns;
	uint64_t size, iters;  /* PX_PING: message size, bytes; exchanges (0 = until PX_PING_END) */
	uint32_t pingpong;     /* PX_HELLO: 1 = set up the reverse endpoint for lat ping-pong */
	char mem[32];          /* PX_HELLO: --mem value both sides allocate ("" = host) */
	char transport[16];
	char err[160];
	uint32_t blob_len;
	uint8_t blob[KVX_XPORT_BLOB_MAX];
	uint8_t desc[KVX_XPORT_RDESC_BYTES];
	struct kvx_xport_counters cnt;
};

/* How `kvxfer-perf lat` times an op (-m/--mode pingpong|completion). */
enum px_lat_method {
	PX_LAT_DEFAULT = 0,  /* pingpong for WRITE, completion for READ */
	PX_LAT_PINGPONG,     /* ib_write_lat: half the round trip of a WRITE ping-pong */
	PX_LAT_COMPLETION,   /* ib_read_lat: post -> completion of one op */
};

struct px_cfg {
	char transport[16];   /* tcp | shm | verbs | auto (resolved before setup) */
	enum kvx_xport_opcode mode;
	enum px_lat_method lat_method; /* resolved by the parser: never PX_LAT_DEFAULT after it */
	uint64_t size;        /* bytes; 0 = default */
	bool all;             /* -a: sweep 2 B .. 8 MiB */
	uint64_t iters;       /* 0 = default */
	double duration_s;    /* -D; 0 = iteration mode */
	uint32_t qps, batch, depth, chunk;
	int cpu_client, cpu_server; /* pinned CPUs (defaults from perf_default_cpu_pair()) */
	bool cpu_default;     /* no -l: the CPUs were chosen by perf_default_cpu_pair() */
	uint16_t port;
	const char *json;
	const char *plot;     /* bw: --plot FILE.png (bandwidth vs size, gnuplot) */
	const char *host;
	const char *peer;     /* --peer cma|memcpy: the comparison loops, not kvxfer */
	bool local;
	bool output_bw;       /* --output=bandwidth (bw) / latency (lat) */
	bool lat;
	const char *ib_dev;   /* -d/--ib-dev: RDMA device (implies verbs), NULL = first ACTIVE one */
	bool gbits;           /* --report_gbits: bandwidth columns in Gb/s (10^9 bit/s) */
	const char *auth_dir; /* --auth-dir: authenticate and seal the out-of-band socket (px_auth.h) */
};

struct px_sess {
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;   /* initiator endpoint (this side posts) */
	struct kvx_xport_ep *tep;  /* ping-pong: the peer's endpoint into this side (target) */
	struct kvx_xport_mr *lmr;
	struct kvx_xport_rmr *rmr;
	struct kvx_xport_caps caps;
	uint8_t *buf;              /* host pointer, or the device pointer of mb */
	struct kvx_mem_buf mb;     /* --mem other than host: the allocation (else zeroed) */
	uint64_t buflen;
	uint64_t rx_off;           /* ping-pong: offset of the receive half of buf (both sides) */
	int fd;                    /* out-of-band socket */
	bool same_cpu;             /* both sides share one CPU: yield while waiting, never spin */
};

/*
 * Validate the options px_main() cannot trust its own parser with, before anything runs:
 * -s/--size and --chunk (positive sizes), -n/--iters (a positive count >= 5; "-5" is an error,
 * not 2^64-5), and -l/--lcores A[,B] (each CPU through kvx_lcore_cfg_validate(), as `kvxfer-perf
 * ring` does). Prints one message naming the option and value. Returns 0, or 2 (usage error).
 */
int px_check_args(int argc, char **argv, bool lat);
/* Entry point shared by both subcommands. */
int px_main(int argc, char **argv, bool lat);
/* Latency of one size: fills the row and appends a JSON object to @p json (may be NULL). */
int px_lat_run(const struct px_cfg *c, struct px_sess *s, uint64_t size, FILE *json, bool first);
/* Print the latency table header. */
void px_lat_header(const struct px_cfg *c);
/*
 * Print one line of the result table (printf format) on stdout and keep a copy, which the
 * client sends to the server at the end of the run (PX_RESULT) so both sides print the rows.
 */
void px_row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Out-of-band send/receive of one message (type PX_ANY: any type). 0 or -errno/-EPROTO. */
int px_msg_send(int fd, struct px_msg *m);
int px_msg_recv(int fd, struct px_msg *m, uint32_t type);
/*
 * Wait until the out-of-band socket is readable, driving this side's provider meanwhile
 * (kvx_xport_progress() where the provider needs it: the peer's WRITEs into this side must
 * keep completing while this side waits). 0, or -ETIMEDOUT after @p timeout_ns.
 */
int px_oob_wait(struct px_sess *s, uint64_t timeout_ns);
/*
 * Server side of the ping-pong, one size: answer each WRITE of @p size bytes that lands in the
 * receive half (its last byte = the exchange's value) with one WRITE back; @p iters exchanges,
 * or, with 0, until the client's PX_PING_END arrives on the out-of-band socket.
 */
int px_pong_run(struct px_sess *s, uint64_t size, uint64_t iters);

#endif
