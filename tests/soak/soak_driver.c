/* SPDX-License-Identifier: Apache-2.0 */
/* kvx-soak driver run (see soak_driver.h, soak.h and tests/soak/README.md): starts the
 * producer, the consumer and the notify proxies as child processes, feeds them the request
 * stream, injects faults at seeded moments, keeps every transfer's state on both sides, drains
 * and accounts the pools. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "soak_driver.h"

const char *const soak_fault_name[F_N] = {
	"kill-producer", "kill-consumer", "stop-producer", "stop-consumer", "partition-long",
	"partition-short", "dup-notify", "drop-notify", "abort-producer",
};
static const char *const proc_name[NPROC] = {"producer", "consumer", "proxy(P)", "proxy(C)"};

volatile sig_atomic_t soak_interrupted;

static bool side_hung(const struct driver *D, int w, const struct side *s, uint64_t now);
static const char *status_name(int32_t s);

static void logv(struct driver *D, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logv(struct driver *D, const char *fmt, ...)
{
	if (!D->o.verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "kvx-soak [%7.2fs] ", (double)(soak_now_ns() - D->t0) / 1e9);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* splitmix64 step of one random stream. */
static uint64_t rnd_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* The fault stream (kinds, gaps, durations, proxy direction): its own stream, so the fault
 * sequence of a seed does not depend on how many requests ran between faults. */
static uint64_t rnd(struct driver *D)
{
	return rnd_next(&D->rng);
}

/* Uniform in [a, b]. */
static double rnd_unit(struct driver *D, double a, double b)
{
	return a + (b - a) * (double)(rnd(D) >> 11) / (double)(1ull << 53);
}

static uint64_t ms_ns(double ms)
{
	return (uint64_t)(ms * 1e6);
}

/* ---- processes ---------------------------------------------------------------------- */

static int spawn(struct driver *D, int which)
{
	struct proc *p = &D->pr[which];
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		return -errno;
	int role = which == PX_P ? P : which == PX_C ? C : which;
	const char *ns = D->use_net ? (role == P ? D->net.ns[0] : D->net.ns[1]) : NULL;
	char fdbuf[16], hs[16], nt[16], to[16], pb[16], mb[16], fwd[16], ce[16];
	snprintf(fdbuf, sizeof(fdbuf), "%d", sv[1]);
	snprintf(hs, sizeof(hs), "%u", p->hs);
	snprintf(nt, sizeof(nt), "%u", p->nt);
	snprintf(to, sizeof(to), "%u", D->o.timeout_ms);
	snprintf(pb, sizeof(pb), "%u", D->o.pool_blocks);
	snprintf(mb, sizeof(mb), "%u", D->o.max_req_blocks);
	snprintf(fwd, sizeof(fwd), "%u", D->pr[role].nt);
	snprintf(ce, sizeof(ce), "%u", D->o.corrupt_every);
	const char *argv[32];
	int a = 0;
	argv[a++] = D->self;
	argv[a++] = "--role";
	if (which == P || which == C) {
		argv[a++] = which == P ? "producer" : "consumer";
		argv[a++] = "--mode";
		argv[a++] = D->o.write_mode ? "write" : "read";
		argv[a++] = "-t";
		argv[a++] = D->o.transport;
		argv[a++] = "--hs-port";
		argv[a++] = hs;
		argv[a++] = "--nt-port";
		argv[a++] = nt;
		argv[a++] = "--timeout-ms";
		argv[a++] = to;
		argv[a++] = "--pool-blocks";
		argv[a++] = pb;
		argv[a++] = "--max-blocks";
		argv[a++] = mb;
		argv[a++] = "--corrupt-every";
		argv[a++] = ce;
		if (D->o.lcores) {
			argv[a++] = "--lcores";
			argv[a++] = D->o.lcores;
		}
	} else {
		argv[a++] = "proxy";
		argv[a++] = "--fwd-port";
		argv[a++] = fwd;
	}
	argv[a++] = "--host";
	argv[a++] = D->host[role];
	argv[a++] = "--ctl-fd";
	argv[a++] = fdbuf;
	argv[a] = NULL;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		int e = -errno;
		close(sv[0]);
		close(sv[1]);
		return e;
	}
	if (pid == 0) {
		int fl = fcntl(sv[1], F_GETFD);
		fcntl(sv[1], F_SETFD, fl & ~FD_CLOEXEC);
		if (D->o.log) {
			int lf = open(D->o.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
			if (lf >= 0) {
				dup2(lf, 1);
				dup2(lf, 2);
				close(lf);
			}
		}
		if (ns && netns_pair_enter(ns)) {
			fprintf(stderr, "kvx-soak: cannot enter netns %s\n", ns);
			_exit(1);
		}
		execv(D->self, (char *const *)argv);
		_exit(127);
	}
	close(sv[1]);
	p->pid = pid;
	p->fd = sv[0];
	p->up = false;
	p->stopped = false;
	p->expect_death = false;
	p->inc++;
	return 0;
}

/* Wait for one message of a fixed type from a process being started (HELLO, STATS). Bounded. */
static int expect_msg(struct driver *D, int which, uint32_t type, void *out, size_t len, int timeout_ms)
{
	struct proc *p = &D->pr[which];
	struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
	uint64_t end = soak_now_ns() + ms_ns(timeout_ms);
	for (;;) {
		uint64_t now = soak_now_ns();
		if (now >= end)
			return -ETIMEDOUT;
		int r = poll(&pfd, 1, (int)((end - now) / 1000000u) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -ETIMEDOUT;
		struct soak_hdr h;
		void *pl;
		int rc = soak_recv(p->fd, &h, &pl);
		if (rc)
			return rc;
		if (h.type == type && h.len == len) {
			memcpy(out, pl, len);
			free(pl);
			return 0;
		}
		free(pl);
		if (h.type != SOAK_FOREIGN && h.type != SOAK_FATAL)
			continue; /* stale traffic of the run (FREED...) is accounted elsewhere */
		return -EPROTO;
	}
}

static void send_peer(struct driver *D, int which)
{
	int other = which == P ? C : P;
	struct soak_peer m = {.hs_port = D->pr[other].hs};
	snprintf(m.host, sizeof(m.host), "%s", D->host[other]);
	/* The peer's notify port: its proxy when notifications are proxied. */
	int px = other == P ? PX_P : PX_C;
	m.nt_port = D->pr[px].pid ? D->pr[px].nt : D->pr[other].nt;
	soak_send(D->pr[which].fd, SOAK_PEER, &m, sizeof(m), NULL, 0);
}

static void fold_reason(struct driver *D, const char *text)
{
	for (size_t i = 0; i < D->nreasons; i++)
		if (!strcmp(D->reasons[i].text, text)) {
			D->reasons[i].n++;
			return;
		}
	if (D->nreasons < MAX_REASONS) {
		snprintf(D->reasons[D->nreasons].text, sizeof(D->reasons[0].text), "%s", text);
		D->reasons[D->nreasons++].n = 1;
	}
}

static struct req *req_get(struct driver *D, uint64_t idx)
{
	for (size_t i = 0; i < D->nreqs; i++)
		if (D->reqs[i].used && D->reqs[i].idx == idx)
			return &D->reqs[i];
	return NULL;
}

/* A request leaves the books once both sides are settled (freed, lost or never sent). */
static void req_settle(struct driver *D, struct req *r)
{
	for (int s = 0; s < 2; s++)
		if (r->s[s].st == S_SENT || r->s[s].st == S_SUB || r->s[s].st == S_TERM)
			return;
	bool pd = r->s[P].st == S_FREED && r->s[P].status == KVX_CPL_DONE;
	bool cd = r->s[C].st == S_FREED && r->s[C].status == KVX_CPL_DONE;
	if (pd != cd && r->s[P].st == S_FREED && r->s[C].st == S_FREED) {
		D->disagree++;
		logv(D, "disagree soak-%" PRIu64 ": producer %s, consumer %s", r->idx, status_name(r->s[P].status),
		     status_name(r->s[C].status));
	}
	r->used = false;
}

/* The role @p which died (killed or crashed): its unsettled sides are lost. */
static void role_died(struct driver *D, int which, int wstatus)
{
	struct proc *p = &D->pr[which];
	if (!p->expect_death && which <= C) {
		D->crashed++;
		fprintf(stderr, "kvx-soak: %s (pid %d) died unexpectedly: %s %d\n", proc_name[which], p->pid,
			WIFSIGNALED(wstatus) ? "signal" : "exit", WIFSIGNALED(wstatus) ? WTERMSIG(wstatus)
										: WEXITSTATUS(wstatus));
	}
	close(p->fd);
	p->fd = -1;
	p->pid = 0;
	p->up = false;
	if (which > C)
		return;
	for (size_t i = 0; i < D->nreqs; i++) {
		struct req *r = &D->reqs[i];
		if (!r->used)
			continue;
		struct side *s = &r->s[which];
		if (s->st == S_SENT || s->st == S_SUB || s->st == S_TERM) {
			s->st = S_LOST;
			D->lost[which]++;
		}
		/* READ: a request whose producer died before serving never reaches the consumer. */
		req_settle(D, r);
	}
	/* Restart on the same ports at once (driver's restart timer also retries -EADDRINUSE). */
	p->restart_at = soak_now_ns();
}

/* ---- requests -------------------------------------------------------------------------- */

static uint32_t next_blocks(struct driver *D)
{
	uint32_t b;
	if (D->trace) {
		const struct perf_trace_req *q = &D->trace->reqs[D->trace_pos++ % D->trace->n];
		b = (q->input_tokens + D->o.trace_tokens - 1) / D->o.trace_tokens;
	} else {
		b = 1 + (uint32_t)(rnd_next(&D->rng_req) % D->o.max_req_blocks);
	}
	if (b < 1)
		b = 1;
	return b > D->o.max_req_blocks ? D->o.max_req_blocks : b;
}

static size_t inflight(const struct driver *D)
{
	size_t n = 0;
	for (size_t i = 0; i < D->nreqs; i++)
		n += D->reqs[i].used;
	return n;
}

static void send_req(struct driver *D, int which, struct req *r, const uint32_t *ids, uint32_t n)
{
	struct soak_req m = {.idx = r->idx, .blocks = r->blocks, .n = n};
	r->s[which].st = S_SENT;
	r->s[which].inc = D->pr[which].inc;
	soak_send(D->pr[which].fd, SOAK_REQ, &m, sizeof(m), ids, n * sizeof(uint32_t));
}

static void issue(struct driver *D)
{
	while (inflight(D) < D->o.concurrency && D->pr[P].up && D->pr[C].up) {
		struct req *r = NULL;
		for (size_t i = 0; i < D->nreqs && !r; i++)
			if (!D->reqs[i].used)
				r = &D->reqs[i];
		if (!r)
			return;
		memset(r, 0, sizeof(*r));
		r->used = true;
		r->idx = D->next_idx++;
		r->blocks = next_blocks(D);
		D->requests++;
		send_req(D, P, r, NULL, 0);
		if (D->o.write_mode)
			send_req(D, C, r, NULL, 0);
	}
}

/* ---- role messages --------------------------------------------------------------------- */

static const char *status_name(int32_t s)
{
	switch (s) {
	case KVX_CPL_DONE: return "done";
	case KVX_CPL_FAILED: return "failed";
	case KVX_CPL_ABORTED: return "aborted";
	case KVX_CPL_TIMED_OUT: return "timed-out";
	default: return "rejected";
	}
}

static void on_msg(struct driver *D, int which, const struct soak_hdr *h, const void *pl)
{
	struct proc *p = &D->pr[which];
	if (which > C) {
		if (h->type == SOAK_STATS && h->len == sizeof(p->pstats)) {
			memcpy(&p->pstats, pl, sizeof(p->pstats));
			p->got_stats = true;
		}
		return;
	}
	switch (h->type) {
	case SOAK_HELLO: {
		const struct soak_hello *m = pl;
		if (h->len != sizeof(*m))
			return;
		p->hs = m->hs_port;
		p->nt = m->nt_port;
		p->up = true;
		p->addrinuse_retries = 0;
		snprintf(p->transport, sizeof(p->transport), "%s", m->transport);
		logv(D, "%s incarnation %u up (pid %d, ports %u/%u, %s)", proc_name[which], p->inc, m->pid,
		     p->hs, p->nt, m->transport);
		if (D->pr[which == P ? C : P].pid || D->pr[which == P ? PX_P : PX_C].pid)
			send_peer(D, which);
		return;
	}
	case SOAK_SUBMITTED: {
		struct req *r = h->len == sizeof(struct soak_idx) ? req_get(D, ((const struct soak_idx *)pl)->idx) : NULL;
		if (!r || r->s[which].st != S_SENT)
			return;
		r->s[which].st = S_SUB;
		/* The role's clock: a driver that reads late does not make a transfer look slow. */
		r->s[which].sub_ns = ((const struct soak_idx *)pl)->t_ns;
		r->s[which].stop_at_sub = p->stop_total;
		if (which == P && D->abort_armed) {
			/* abort right after serve / write_begin (issue 14 items 1 and 6) */
			struct soak_idx m = {r->idx, 0};
			soak_send(p->fd, SOAK_ABORT, &m, sizeof(m), NULL, 0);
			D->abort_armed = false;
			D->injected[F_ABORT_P]++;
			logv(D, "fault abort-producer: soak-%" PRIu64, r->idx);
		}
		return;
	}
	case SOAK_SERVED: {
		const struct soak_req *m = pl;
		if (h->len < sizeof(*m) || h->len != sizeof(*m) + m->n * sizeof(uint32_t))
			return;
		struct req *r = req_get(D, m->idx);
		if (!r || r->s[C].st != S_NONE)
			return;
		if (D->pr[C].up)
			send_req(D, C, r, (const uint32_t *)(m + 1), m->n);
		return;
	}
	case SOAK_TERM: {
		const struct soak_term *t = pl;
		struct req *r = h->len == sizeof(*t) ? req_get(D, t->idx) : NULL;
		if (!r || (r->s[which].st != S_SUB && r->s[which].st != S_SENT))
			return;
		struct side *s = &r->s[which];
		/* The verdict uses the engine's own submission-to-terminal time (the completion's
		 * duration_ns) on the role's clock, so neither a driver that reads its sockets late
		 * nor a role process that polls its completions late (starved on a loaded machine)
		 * turns a transfer the engine ended in time into a hung one; the latter is counted
		 * as polled-late. */
		uint64_t t_end = t->eng_ns ? s->sub_ns + t->eng_ns : t->t_ns;
		if (t_end > t->t_ns)
			t_end = t->t_ns;
		if (s->st == S_SUB && side_hung(D, which, s, t_end)) {
			D->hung++;
			D->hung_late++;
			fprintf(stderr, "kvx-soak: HUNG %s soak-%" PRIu64 " (%u blocks): terminal only %.1f s after "
					"submission (%s; polled at %.1f s)\n", proc_name[which], r->idx, r->blocks,
				(double)(t_end - s->sub_ns) / 1e9, status_name(t->status),
				(double)(t->t_ns - s->sub_ns) / 1e9);
		} else if (s->st == S_SUB && side_hung(D, which, s, t->t_ns)) {
			D->polled_late++;
			logv(D, "%s soak-%" PRIu64 " terminal %.1f s after submission in the engine, polled by its "
				"process only at %.1f s", proc_name[which], r->idx, (double)(t_end - s->sub_ns) / 1e9,
			     (double)(t->t_ns - s->sub_ns) / 1e9);
		}
		s->st = S_TERM;
		s->status = t->status;
		s->error = t->error;
		if (which == C && t->status == KVX_CPL_DONE) {
			if (t->verify == SOAK_V_OK) {
				D->done_verified++;
			} else {
				D->corrupt++;
				if (!D->first_corrupt[0])
					snprintf(D->first_corrupt, sizeof(D->first_corrupt),
						 "soak-%" PRIu64 " DONE with wrong bytes: %u bad planes; %s", t->idx,
						 t->bad_planes, t->detail);
				fprintf(stderr, "kvx-soak: CORRUPT soak-%" PRIu64 " (%u blocks): %u bad planes: %s\n",
					t->idx, r->blocks, t->bad_planes, t->detail);
			}
		} else if (t->status != KVX_CPL_DONE) {
			char txt[64];
			const char *en = t->error < 0 ? strerrorname_np(-t->error) : NULL;
			snprintf(txt, sizeof(txt), "%s:%s%s%s", which == P ? "P" : "C", status_name(t->status),
				 en ? "/" : "", en ? en : "");
			fold_reason(D, txt);
		}
		if (t->status != KVX_CPL_DONE)
			logv(D, "%s soak-%" PRIu64 " %s %s%s%s", proc_name[which], t->idx, status_name(t->status),
		     t->error ? kvx_strerror(t->error) : "", t->detail[0] ? ": " : "", t->detail);
		return;
	}
	case SOAK_FREED: {
		struct req *r = h->len == sizeof(struct soak_idx) ? req_get(D, ((const struct soak_idx *)pl)->idx) : NULL;
		if (!r || r->s[which].st != S_TERM)
			return;
		r->s[which].st = S_FREED;
		req_settle(D, r);
		return;
	}
	case SOAK_FOREIGN:
		D->foreign++;
		D->corrupt++;
		if (!D->first_corrupt[0])
			snprintf(D->first_corrupt, sizeof(D->first_corrupt), "%.250s", (const char *)pl);
		fprintf(stderr, "kvx-soak: CORRUPT (foreign write): %s\n", (const char *)pl);
		return;
	case SOAK_STATS:
		if (h->len == sizeof(p->rstats)) {
			memcpy(&p->rstats, pl, sizeof(p->rstats));
			p->got_stats = true;
		}
		return;
	case SOAK_FATAL:
		fprintf(stderr, "kvx-soak: %s reports: %s\n", proc_name[which], (const char *)pl);
		return;
	default:
		return;
	}
}

/* ---- faults ------------------------------------------------------------------------------ */

static uint64_t timeout_ns(const struct driver *D)
{
	return ms_ns(D->o.timeout_ms);
}

static void schedule_next_fault(struct driver *D, uint64_t now)
{
	D->next_fault_ns = now + (uint64_t)((double)timeout_ns(D) * rnd_unit(D, D->o.gap_min, D->o.gap_max));
}

static void inject(struct driver *D, uint64_t now)
{
	if (!D->pr[P].up || !D->pr[C].up)
		return;
	/* Kinds come from a deck: every enabled kind once, in a seeded shuffled order, then a new
	 * shuffle, so even a short run covers every kind. */
	while (D->deck_pos < D->deck_n && D->skipped[D->deck[D->deck_pos]])
		D->deck_pos++;
	if (D->deck_pos >= D->deck_n) {
		D->deck_n = 0;
		for (int k = 0; k < F_N; k++)
			if (D->o.fault_on[k] && !D->skipped[k])
				D->deck[D->deck_n++] = k;
		for (int i = D->deck_n - 1; i > 0; i--) {
			int j = (int)(rnd(D) % (uint64_t)(i + 1)), t = D->deck[i];
			D->deck[i] = D->deck[j];
			D->deck[j] = t;
		}
		D->deck_pos = 0;
		if (!D->deck_n)
			return;
	}
	int f = D->deck[D->deck_pos++];
	const uint64_t T = timeout_ns(D);
	switch (f) {
	case F_KILL_P:
	case F_KILL_C: {
		struct proc *p = &D->pr[f == F_KILL_P ? P : C];
		p->expect_death = true;
		kill(p->pid, SIGKILL);
		D->active_fault = f;
		break;
	}
	case F_STOP_P:
	case F_STOP_C: {
		struct proc *p = &D->pr[f == F_STOP_P ? P : C];
		kill(p->pid, SIGSTOP);
		p->stopped = true;
		p->stop_since = now;
		D->active_fault = f;
		D->recover_at_ns = now + (uint64_t)((double)T * rnd_unit(D, 1.2, 2.0));
		break;
	}
	case F_PART_LONG:
	case F_PART_SHORT:
		if (netns_pair_link(&D->net, false)) {
			fprintf(stderr, "kvx-soak: cannot take the veth link down; partition faults skipped\n");
			D->skipped[F_PART_LONG] = D->skipped[F_PART_SHORT] = true;
			return;
		}
		D->active_fault = f;
		D->recover_at_ns = now + (uint64_t)((double)T * (f == F_PART_LONG ? rnd_unit(D, 1.5, 4.0)
										   : rnd_unit(D, 0.1, 0.6)));
		break;
	case F_DUP:
	case F_DROP: {
		int px = (rnd(D) & 1) ? PX_P : PX_C;
		soak_send(D->pr[px].fd, f == F_DUP ? SOAK_DUP : SOAK_DROP, NULL, 0, NULL, 0);
		break;
	}
	case F_ABORT_P:
		D->abort_armed = true; /* counted when applied (next producer submission) */
		logv(D, "fault %s armed", soak_fault_name[f]);
		schedule_next_fault(D, now);
		return;
	}
	if (f != F_DUP && f != F_DROP)
		D->injected[f]++;
	logv(D, "fault %s", soak_fault_name[f]);
	if (D->active_fault < 0)
		schedule_next_fault(D, now);
}

/* End the active fault when its time has come (stop, partition) or its role is back (kill). */
static void recover(struct driver *D, uint64_t now, bool force)
{
	int f = D->active_fault;
	if (f < 0)
		return;
	if ((f == F_STOP_P || f == F_STOP_C || f == F_PART_LONG || f == F_PART_SHORT) &&
	    (force || now >= D->recover_at_ns)) {
		if (f == F_STOP_P || f == F_STOP_C) {
			struct proc *p = &D->pr[f == F_STOP_P ? P : C];
			if (p->pid)
				kill(p->pid, SIGCONT);
			p->stopped = false;
			p->stop_total += now - p->stop_since;
		} else {
			netns_pair_link(&D->net, true);
		}
		logv(D, "fault %s over", soak_fault_name[f]);
		D->active_fault = -1;
		schedule_next_fault(D, now);
	} else if ((f == F_KILL_P || f == F_KILL_C) && D->pr[f == F_KILL_P ? P : C].up) {
		D->active_fault = -1;
		schedule_next_fault(D, now);
	}
}

/* Sides still open at @p now (or terminal only at @p now) more than 2x their deadline after
 * submission, SIGSTOP time of their role excluded, are hung. Deadlines: consumer
 * transfer_timeout, producer defer_timeout (2x: it may wait that long for the consumer). */
static bool side_hung(const struct driver *D, int w, const struct side *s, uint64_t now)
{
	const uint64_t T = timeout_ns(D);
	const struct proc *p = &D->pr[w];
	uint64_t stopped = p->stop_total - s->stop_at_sub + (p->stopped ? now - p->stop_since : 0);
	uint64_t deadline = w == P ? 2 * T : T;
	return now > s->sub_ns && now - s->sub_ns > 2 * deadline + stopped;
}

/* Mark sides past their hung bound as provisionally hung (the drain stops waiting for them);
 * the verdict is made at their TERM (role's clock) or, if none comes, at the end. */
static void check_hung(struct driver *D, uint64_t now)
{
	const uint64_t T = timeout_ns(D);
	for (size_t i = 0; i < D->nreqs; i++) {
		struct req *r = &D->reqs[i];
		if (!r->used)
			continue;
		for (int w = 0; w < 2; w++) {
			struct side *s = &r->s[w];
			if (s->st != S_SUB || s->hung)
				continue;
			uint64_t deadline = w == P ? 2 * T : T;
			if (side_hung(D, w, s, now)) {
				s->hung = true;
				logv(D, "%s soak-%" PRIu64 " (%u blocks) not terminal %.1f s after submission "
					"(deadline %.1f s)", proc_name[w], r->idx, r->blocks,
				     (double)(now - s->sub_ns) / 1e9, (double)deadline / 1e9);
			}
		}
	}
}

/* ---- main loop --------------------------------------------------------------------------- */

/* Child @p w exited with wait status @p st: account it, and schedule a role's restart (a
 * restart that found its fixed port still held is retried 200 ms later, at most 50 times). */
static void child_exited(struct driver *D, int w, int st)
{
	struct proc *p = &D->pr[w];
	bool retry = w <= C && !p->up && WIFEXITED(st) && WEXITSTATUS(st) == SOAK_EXIT_ADDRINUSE &&
		     p->addrinuse_retries < 50;
	if (retry) {
		p->addrinuse_retries++;
		p->expect_death = true;
	}
	if (w > C && !p->expect_death) {
		fprintf(stderr, "kvx-soak: %s died\n", proc_name[w]);
		D->crashed++;
	}
	role_died(D, w, st);
	if (retry)
		p->restart_at = soak_now_ns() + ms_ns(200);
}

static void reap(struct driver *D)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid <= 0)
			return;
		for (int w = 0; w < NPROC; w++)
			if (D->pr[w].pid == pid)
				child_exited(D, w, st);
	}
}

/* One pass: read what the processes sent, wait at most @p wait_ms. */
/* true when a whole message (header and payload) is queued on @p fd, or nothing is (so a
 * readable socket is at its end). A role stopped by the soak (SIGSTOP) in the middle of a write
 * that blocked leaves part of a message queued; reading it with the blocking soak_recv() would
 * wait for the rest, which comes only after the SIGCONT this driver is to send. */
static bool whole_msg_queued(int fd)
{
	int avail = 0;
	if (ioctl(fd, FIONREAD, &avail) || avail <= 0)
		return true;
	struct soak_hdr h;
	ssize_t r = recv(fd, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
	if (r != (ssize_t)sizeof(h))
		return false;
	return (uint64_t)avail >= sizeof(h) + (uint64_t)h.len || h.len > SOAK_MSG_MAX;
}

static void pump(struct driver *D, int wait_ms)
{
	struct pollfd pfd[NPROC];
	int who[NPROC], n = 0;
	for (int w = 0; w < NPROC; w++)
		if (D->pr[w].pid && D->pr[w].fd >= 0) {
			pfd[n] = (struct pollfd){.fd = D->pr[w].fd, .events = POLLIN};
			who[n++] = w;
		}
	int r = poll(pfd, (nfds_t)n, wait_ms);
	for (int i = 0; r > 0 && i < n; i++) {
		if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		struct proc *p = &D->pr[who[i]];
		for (int k = 0; k < 256; k++) {
			struct soak_hdr h;
			void *pl;
			if (!whole_msg_queued(p->fd))
				break; /* the rest comes later (a writer stopped mid-message) */
			if (soak_recv(p->fd, &h, &pl)) {
				/* EOF: the process is gone (it closes its end only by exiting). */
				int st = 0;
				if (waitpid(p->pid, &st, 0) == p->pid)
					child_exited(D, who[i], st);
				break;
			}
			on_msg(D, who[i], &h, pl);
			free(pl);
			struct pollfd q = {.fd = p->fd, .events = POLLIN};
			if (poll(&q, 1, 0) <= 0)
				break;
		}
	}
	reap(D);
}

static void restarts(struct driver *D, uint64_t now)
{
	for (int w = 0; w <= C; w++) {
		struct proc *p = &D->pr[w];
		if (p->pid || !p->restart_at || now < p->restart_at)
			continue;
		p->restart_at = 0;
		if (spawn(D, w))
			p->restart_at = now + ms_ns(200);
	}
}

static bool settled(const struct driver *D)
{
	for (size_t i = 0; i < D->nreqs; i++) {
		const struct req *r = &D->reqs[i];
		if (!r->used)
			continue;
		for (int w = 0; w < 2; w++)
			if ((r->s[w].st == S_SUB && !r->s[w].hung) || r->s[w].st == S_TERM ||
			    r->s[w].st == S_SENT)
				return false;
	}
	return true;
}

int soak_run(struct driver *D)
{
	D->t0 = soak_now_ns();
	D->active_fault = -1;
	/* First incarnations on ephemeral ports; restarts reuse the ports they bound. */
	for (int w = 0; w <= C; w++) {
		struct soak_hello h;
		if (spawn(D, w) || expect_msg(D, w, SOAK_HELLO, &h, sizeof(h), 60000)) {
			fprintf(stderr, "kvx-soak: the %s did not start\n", proc_name[w]);
			return -1;
		}
		D->pr[w].hs = h.hs_port;
		D->pr[w].nt = h.nt_port;
		D->pr[w].up = true;
		snprintf(D->pr[w].transport, sizeof(D->pr[w].transport), "%s", h.transport);
	}
	if (D->o.fault_on[F_DUP] || D->o.fault_on[F_DROP]) {
		for (int w = PX_P; w <= PX_C; w++) {
			struct soak_hello h;
			if (spawn(D, w) || expect_msg(D, w, SOAK_HELLO, &h, sizeof(h), 60000)) {
				fprintf(stderr, "kvx-soak: the %s did not start\n", proc_name[w]);
				return -1;
			}
			D->pr[w].nt = h.nt_port;
			D->pr[w].up = true;
		}
	}
	send_peer(D, P);
	send_peer(D, C);
	schedule_next_fault(D, soak_now_ns());
	const uint64_t end = D->t0 + (uint64_t)(D->o.duration_s * 1e9);
	uint64_t now;
	while ((now = soak_now_ns()) < end && !soak_interrupted) {
		restarts(D, now);
		recover(D, now, false);
		if (D->active_fault < 0 && now >= D->next_fault_ns)
			inject(D, now);
		issue(D);
		check_hung(D, now);
		pump(D, 20);
	}
	/* Drain: no new requests or faults; end the active fault; wait until every side is
	 * settled or hung, bounded by the longest deadline chain (hung 2x defer, then a release). */
	recover(D, soak_now_ns(), true);
	const uint64_t T = timeout_ns(D);
	uint64_t drain_end = soak_now_ns() + 12 * T + ms_ns(30000);
	while ((now = soak_now_ns()) < drain_end && !soak_interrupted) {
		restarts(D, now);
		if (D->active_fault >= 0)
			recover(D, now, true);
		check_hung(D, now);
		if (settled(D) && D->pr[P].up && D->pr[C].up)
			break;
		pump(D, 20);
	}
	/* Pool accounting of the live incarnations. */
	for (int w = 0; w < NPROC; w++) {
		struct proc *p = &D->pr[w];
		if (!p->pid || !p->up)
			continue;
		p->got_stats = false;
		soak_send(p->fd, SOAK_STATS_REQ, NULL, 0, NULL, 0);
		uint64_t until = soak_now_ns() + ms_ns(30000);
		while (!p->got_stats && p->pid && soak_now_ns() < until)
			pump(D, 50);
		if (w <= C && p->got_stats) {
			uint64_t leak = p->rstats.held_terminal + p->rstats.held_unowned;
			D->leaked += leak;
			if (leak)
				fprintf(stderr, "kvx-soak: %s holds %" PRIu64 " blocks after the drain (%" PRIu64
						" of terminal transfers without a release, %" PRIu64 " held by no request; "
						"pool %" PRIu64 "/%" PRIu64 " free, %" PRIu64 " records live)\n",
					proc_name[w], leak, p->rstats.held_terminal, p->rstats.held_unowned,
					p->rstats.pool_free, p->rstats.pool_size, p->rstats.live);
		}
	}
	/* Sides still open after the drain and the STATS round trip (which follows every message
	 * the roles sent before it) never became terminal. */
	for (size_t i = 0; i < D->nreqs; i++) {
		struct req *r = &D->reqs[i];
		for (int w = 0; r->used && w < 2; w++)
			if (r->s[w].st == S_SUB) {
				D->hung++;
				fprintf(stderr, "kvx-soak: HUNG %s soak-%" PRIu64 " (%u blocks): not terminal %.1f s "
						"after submission\n", proc_name[w], r->idx, r->blocks,
					(double)(soak_now_ns() - r->s[w].sub_ns) / 1e9);
			} else if (r->s[w].st == S_SENT) {
				D->never_started++;
				fprintf(stderr, "kvx-soak: %s never submitted soak-%" PRIu64 " (%u blocks): no free blocks?\n",
					proc_name[w], r->idx, r->blocks);
			}
	}
	for (int w = NPROC - 1; w >= 0; w--) {
		struct proc *p = &D->pr[w];
		if (!p->pid)
			continue;
		p->expect_death = true;
		soak_send(p->fd, SOAK_QUIT, NULL, 0, NULL, 0);
		uint64_t until = soak_now_ns() + ms_ns(20000);
		int st;
		while (waitpid(p->pid, &st, WNOHANG) == 0 && soak_now_ns() < until)
			poll(NULL, 0, 10); /* bounded wait for a clean exit; then SIGKILL */
		if (waitpid(p->pid, &st, WNOHANG) == 0) {
			fprintf(stderr, "kvx-soak: %s did not exit on QUIT; killing it\n", proc_name[w]);
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &st, 0);
		}
		p->pid = 0;
	}
	return 0;
}
