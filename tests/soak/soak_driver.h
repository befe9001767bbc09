/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_SOAK_DRIVER_H
#define KVX_SOAK_DRIVER_H
/**
 * @file
 * kvx-soak driver state (one struct driver per run, owned by the driver's only thread):
 * options, the child processes, the books of every live request (both sides), the fault
 * schedule and the counters the summary prints. soak_driver.c runs it; soak_main.c parses the
 * command line and prints the summary.
 */
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "soak.h"
#include "netns_pair.h"
#include "trace_load.h"

/* ---- options ------------------------------------------------------------------------ */

enum fault {
	F_KILL_P, F_KILL_C, F_STOP_P, F_STOP_C, F_PART_LONG, F_PART_SHORT, F_DUP, F_DROP, F_ABORT_P, F_N
};
/** Fault kind names, as --faults takes them. */
extern const char *const soak_fault_name[F_N];

struct opts {
	uint64_t seed;
	double duration_s;
	bool write_mode;
	const char *transport;
	uint32_t timeout_ms;
	bool fault_on[F_N];
	uint32_t concurrency, pool_blocks, max_req_blocks;
	double gap_min, gap_max; /* fault gap, multiples of the timeout */
	const char *trace;
	uint32_t trace_tokens;   /* tokens per block when mapping a trace's input length */
	const char *log;
	uint32_t corrupt_every;
	const char *lcores;      /* engines' params.lcores (NULL: the engine's default) */
	bool verbose;
};

/* ---- state ---------------------------------------------------------------------------- */

enum { P = 0, C = 1, PX_P = 2, PX_C = 3, NPROC = 4 };


struct proc {
	pid_t pid;
	int fd;
	bool up;          /* HELLO received */
	bool stopped;
	uint64_t stop_since, stop_total; /* ns */
	uint32_t inc;     /* incarnation, 1-based */
	uint16_t hs, nt;  /* fixed after the first incarnation */
	unsigned addrinuse_retries;
	uint64_t restart_at; /* ns; 0 = none pending */
	bool expect_death;
	char transport[16];
	struct soak_proxy_stats pstats;
	struct soak_stats rstats;
	bool got_stats;
};

enum side_st { S_NONE = 0, S_SENT, S_SUB, S_TERM, S_FREED, S_LOST };

struct side {
	enum side_st st;
	uint32_t inc;
	uint64_t sub_ns, stop_at_sub;
	int32_t status, error;
	bool hung;
};

struct req {
	bool used;
	uint64_t idx;
	uint32_t blocks;
	struct side s[2];
};

#define MAX_REASONS 32
struct reason {
	char text[64];
	uint64_t n;
};

struct driver {
	struct opts o;
	char self[4096];
	struct netns_pair net;
	bool use_net;
	const char *host[2]; /* engine host per role */
	struct proc pr[NPROC];
	struct req *reqs;
	size_t nreqs;
	uint64_t next_idx;
	uint64_t rng, rng_req; /* random streams: faults, request sizes */
	struct perf_trace *trace;
	size_t trace_pos;
	/* faults */
	uint64_t next_fault_ns, recover_at_ns;
	int active_fault; /* -1 none */
	int deck[F_N], deck_n, deck_pos; /* shuffled enabled kinds, next one */
	bool abort_armed;
	uint64_t injected[F_N];
	bool skipped[F_N];
	/* results */
	uint64_t requests, done_verified, corrupt, hung, hung_late, leaked, foreign, crashed, lost[2], disagree;
	uint64_t polled_late; /* terminal in time in the engine, polled late by the role process */
	uint64_t never_started;
	struct reason reasons[MAX_REASONS];
	size_t nreasons;
	char first_corrupt[448];
	uint64_t t0;
};

/** Set by SIGINT/SIGTERM: the run stops early (and fails). */
extern volatile sig_atomic_t soak_interrupted;

/** Start the processes, run the stream and the faults for the duration, drain, account the
 * pools, stop everything. @return 0, or -1 when the processes could not be started. */
int soak_run(struct driver *D);

#endif /* KVX_SOAK_DRIVER_H */
