/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control lcore's loop: one poll(2) over the handshake ROUTER, the notify ROUTER, the DEALERs
 * of running handshake jobs, the watched fds (kvx_ctl_watch_fd()) and the waiter eventfd of the
 * inboxes; notify DEALERs (cached per peer path) and the heartbeat DEALER are send-only.
 * Also the ROUTER receive helpers shared by handshake.c and notify.c. docs/architecture.md §1, §4;
 * docs/runtime-notes.md §5.2.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <zmq.h>

#include "ctl_impl.h"

/* ---------------------------------------------------------------------------------------- */
/* Watched fds                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The control object whose loop runs on this thread (callbacks may unwatch without waiting). */
static _Thread_local struct kvx_ctl *t_ctl_self;

static int watch_find(const struct kvx_ctl *ctl, int fd)
{
	for (uint32_t i = 0; i < ctl->nwatch; i++)
		if (ctl->watch[i].fd == fd)
			return (int)i;
	return -1;
}

int ctl_on_loop_thread(const struct kvx_ctl *ctl)
{
	return t_ctl_self == ctl;
}

/* Caller holds watch_mu. */
static void watch_changed(struct kvx_ctl *ctl)
{
	atomic_fetch_add(&ctl->watch_gen, 1); /* seq_cst: pairs with the waiter re-check */
}

int kvx_ctl_watch_fd(struct kvx_ctl *ctl, int fd, void (*cb)(void *arg), void *arg)
{
	if (!ctl || !cb)
		return -EINVAL;
	if (fd < 0 || fcntl(fd, F_GETFD) < 0)
		return -EBADF;
	pthread_mutex_lock(&ctl->watch_mu);
	int rc = 0;
	if (watch_find(ctl, fd) >= 0) {
		rc = -EEXIST;
	} else if (ctl->nwatch == WATCH_MAX) {
		rc = -ENOSPC;
	} else {
		ctl->watch[ctl->nwatch++] = (struct watch){.fd = fd, .cb = cb, .arg = arg};
		watch_changed(ctl);
	}
	pthread_mutex_unlock(&ctl->watch_mu);
	if (!rc)
		kvx_waiter_wake(&ctl->waiter);
	return rc;
}

int kvx_ctl_unwatch_fd(struct kvx_ctl *ctl, int fd)
{
	if (!ctl)
		return -EINVAL;
	pthread_mutex_lock(&ctl->watch_mu);
	int i = watch_find(ctl, fd);
	if (i < 0) {
		pthread_mutex_unlock(&ctl->watch_mu);
		return -ENOENT;
	}
	ctl->watch[i] = ctl->watch[--ctl->nwatch];
	watch_changed(ctl);
	uint64_t gen = atomic_load(&ctl->watch_gen);
	if (t_ctl_self != ctl) {
		/* Another thread: return only once the loop runs without the entry, so the
		 * callback is neither running nor called again after this returns. */
		pthread_mutex_unlock(&ctl->watch_mu);
		kvx_waiter_wake(&ctl->waiter);
		pthread_mutex_lock(&ctl->watch_mu);
		while (ctl->loop_live && ctl->watch_applied < gen)
			pthread_cond_wait(&ctl->watch_cv, &ctl->watch_mu);
	}
	/* On the control thread the dispatch sees watch_gen move and skips stale entries. */
	pthread_mutex_unlock(&ctl->watch_mu);
	return 0;
}

/* Loop-local copy of the table, taken when watch_gen moved. */
struct watch_set {
	struct watch w[WATCH_MAX];
	uint32_t n;
	uint64_t gen;
};

static void watch_sync(struct kvx_ctl *ctl, struct watch_set *ws)
{
	pthread_mutex_lock(&ctl->watch_mu);
	ws->n = 0;
	for (uint32_t i = 0; i < ctl->nwatch; i++)
		if (!ctl->watch[i].suspended)
			ws->w[ws->n++] = ctl->watch[i];
	ws->gen = atomic_load(&ctl->watch_gen);
	ctl->watch_applied = ws->gen;
	pthread_cond_broadcast(&ctl->watch_cv);
	pthread_mutex_unlock(&ctl->watch_mu);
}

/* An fd that polls as error/hang-up without data would make every zmq_poll return at once:
 * stop polling it (the entry stays until kvx_ctl_unwatch_fd()) and say so. */
static void watch_suspend(struct kvx_ctl *ctl, int fd)
{
	pthread_mutex_lock(&ctl->watch_mu);
	int i = watch_find(ctl, fd);
	if (i >= 0 && !ctl->watch[i].suspended) {
		ctl->watch[i].suspended = 1;
		watch_changed(ctl);
	}
	pthread_mutex_unlock(&ctl->watch_mu);
	CINC(ctl, watch_errors);
	ctl_warn_rl(ctl, "watched fd %d reports an error or hang-up without data; no longer polled "
		     "(call kvx_ctl_unwatch_fd)", fd);
}

static void watch_loop_live(struct kvx_ctl *ctl, int live)
{
	pthread_mutex_lock(&ctl->watch_mu);
	ctl->loop_live = live;
	pthread_cond_broadcast(&ctl->watch_cv);
	pthread_mutex_unlock(&ctl->watch_mu);
}

/* ---------------------------------------------------------------------------------------- */
/* Receive helpers (ROUTER)                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Receive [identity, payload] from a ROUTER; extra frames make the message malformed.
 * Returns 1 when a 2-frame message was read, 0 when nothing was there, -1 malformed. */
static int router_recv(void *sock, zmq_msg_t *id, zmq_msg_t *payload, int *nframes)
{
	*nframes = 0;
	if (zmq_msg_recv(id, sock, ZMQ_DONTWAIT) < 0)
		return 0;
	*nframes = 1;
	if (!zmq_msg_more(id))
		return -1;
	if (zmq_msg_recv(payload, sock, ZMQ_DONTWAIT) < 0)
		return -1;
	*nframes = 2;
	if (!zmq_msg_more(payload))
		return 1;
	while (1) {
		zmq_msg_t x;
		zmq_msg_init(&x);
		int ok = zmq_msg_recv(&x, sock, ZMQ_DONTWAIT) >= 0;
		int more = ok && zmq_msg_more(&x);
		zmq_msg_close(&x);
		(*nframes)++;
		if (!more)
			break;
	}
	return -1;
}

/* Receive the next message of a ROUTER and account it to its sender. Returns router_recv()'s
 * value; on 0 (nothing pending) both messages are already closed. @p addr is the sender's
 * address as libzmq reports it (may be NULL). */
int ctl_router_next(struct kvx_ctl *ctl, void *sock, zmq_msg_t *id, zmq_msg_t *pl, int *nf,
		    const char **addr, struct peer_stat **ps)
{
	zmq_msg_init(id);
	zmq_msg_init(pl);
	int r = router_recv(sock, id, pl, nf);
	if (r == 0) {
		zmq_msg_close(id);
		zmq_msg_close(pl);
		return 0;
	}
	*addr = zmq_msg_gets(*nf >= 2 ? pl : id, "Peer-Address");
	*ps = ctl_peer_of(ctl, *addr);
	atomic_fetch_add_explicit(&(*ps)->rx, 1, memory_order_relaxed);
	return r;
}

void ctl_count_bad(struct kvx_ctl *ctl, struct peer_stat *ps, int rc)
{
	CINC(ctl, malformed);
	if (rc == -EMSGSIZE)
		CINC(ctl, oversize);
	atomic_fetch_add_explicit(&ps->malformed, 1, memory_order_relaxed);
}
void ctl_router_reply(void *sock, zmq_msg_t *id, const void *data, size_t len)
{
	/* Never blocks: a peer at HWM or gone just loses the reply (ROUTER drops). */
	zmq_send(sock, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(sock, data, len, ZMQ_DONTWAIT);
}

/* ---------------------------------------------------------------------------------------- */
/* The loop                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Read the notify ROUTER; returns ctl_notify_recv()'s count. When notifications went to
 * on_notify and no answer window was opened since the loop last slept (*answer_by == 0), opens
 * one: sets *answer_by to the end of the window in which an answer is expected
 * (ANSWER_WAIT_NS). At most one window per sleep, so a steady stream of notifications does
 * not turn the loop into a busy poll. */
static int notify_read(struct kvx_ctl *ctl, uint64_t *answer_by)
{
	int k = ctl_notify_recv(ctl);
	if (k > 0 && ctl->p.on_notify && !*answer_by)
		*answer_by = kvx_now_ns() + ANSWER_WAIT_NS;
	return k;
}

/* The ZMQ_FD of a socket: readable when the socket's command mailbox was signalled. It is
 * edge-like (docs/runtime-notes.md §5.2): a socket whose fd fired must be read until EAGAIN (or kept
 * "due") before the loop waits on the fd again. Returns -1 on error. */
static int sock_fd(void *s)
{
	int fd = -1;
	size_t l = sizeof(fd);
	return zmq_getsockopt(s, ZMQ_FD, &fd, &l) ? -1 : fd;
}

/*
 * One poll(2) per iteration over the waiter eventfd, the ROUTERs' ZMQ_FDs, the watched fds and
 * the running handshake jobs' DEALERs. zmq_poll() would cost a zero-timeout poll pass, then a
 * ZMQ_EVENTS query (a getpid and a poll each) per socket, before and after every sleep: about
 * six syscalls per wait instead of one, which showed as the control plane's main CPU cost per
 * notification round trip (kvxfer-perf notify). A ROUTER is read only when its fd fired or a
 * batch limit left input queued (hs_due / nt_due).
 */
void *ctl_loop(void *arg)
{
	struct kvx_ctl *ctl = arg;
	struct pollfd *pfd = calloc(3 + WATCH_MAX + ctl->p.max_active_handshakes, sizeof(*pfd));
	struct hs_job **jobs = calloc(ctl->p.max_active_handshakes + 1, sizeof(*jobs));
	int hs_fd = sock_fd(ctl->hs_router), nt_fd = sock_fd(ctl->nt_router);
	if (!pfd || !jobs || hs_fd < 0 || nt_fd < 0) {
		kvx_log(KVX_LOG_ERROR, "control: cannot start the loop (%s)",
			!pfd || !jobs ? "out of memory" : "no ZMQ_FD for a ROUTER");
		free(pfd);
		free(jobs);
		return NULL;
	}
	t_ctl_self = ctl;
	struct watch_set ws = {.n = 0};
	watch_loop_live(ctl, 1);
	watch_sync(ctl, &ws);
	int hs_due = 1, nt_due = 1; /* read once at start */
	const uint64_t spin_ns = (uint64_t)ctl->p.busy_poll_us * 1000u;
	uint64_t last_work = kvx_now_ns();
	unsigned busy_rounds = 0;
	/* Answer window: 0 = none open, 1 = used up until the loop next sleeps, else its end (ns). */
	uint64_t answer_by = 0;
	while (!atomic_load_explicit(&ctl->stop_req, memory_order_acquire)) {
		if (atomic_load_explicit(&ctl->watch_gen, memory_order_acquire) != ws.gen)
			watch_sync(ctl, &ws);
		uint64_t now = kvx_now_ns();
		kvx_timer_heap_run(ctl->timers, now);
		unsigned work = ctl_inboxes_drain(ctl);
		ctl_jobs_start_queued(ctl);
		for (struct hs_job *j = ctl->hs_active, *nx; j; j = nx) {
			nx = j->next; /* ctl_job_on_readable() may finish and free j */
			if (j->due) {
				j->due = 0;
				ctl_job_on_readable(ctl, j);
			}
		}
		if (hs_due) {
			int k = ctl_hs_recv(ctl);
			hs_due = k == RX_BATCH;
			work += (unsigned)k;
		}
		if (nt_due) {
			int k = notify_read(ctl, &answer_by);
			nt_due = k == RX_BATCH;
			work += (unsigned)k;
		}
		int timeout = 0, prepared = 0, spinning = 0;
		if (!work)
			busy_rounds = 0;
		if (work) {
			last_work = now;
			/* More inbox work is likely (the producer is running): go round again and
			 * look at the fds only every WORK_ROUNDS busy rounds (one syscall less per
			 * send; sockets are never starved for longer than that). */
			if (++busy_rounds < WORK_ROUNDS)
				continue;
			busy_rounds = 0;
		} else if (spin_ns && now - last_work < spin_ns) {
			/* Busy-poll window: look again without sleeping (no wake-up to pay). */
			spinning = 1;
		} else if (answer_by > 1 && now < answer_by) {
			/* Answer window (ANSWER_WAIT_NS): on_notify just ran, so an answer is likely
			 * on its way into an inbox. Look again without sleeping, as in the busy-poll
			 * window (sockets by a poll without timeout, the CPU yielded between looks):
			 * the answer is then taken without a wake-up (no eventfd write by its
			 * producer, no poll return and eventfd read here). */
			spinning = 1;
		} else {
			answer_by = 1; /* window used up until the loop sleeps */
			kvx_waiter_prepare(&ctl->waiter);
			if (ctl_inboxes_pending(ctl) ||
			    atomic_load_explicit(&ctl->watch_gen, memory_order_seq_cst) != ws.gen ||
			    atomic_load_explicit(&ctl->stop_req, memory_order_acquire)) {
				kvx_waiter_cancel(&ctl->waiter);
			} else {
				prepared = 1;
				timeout = kvx_timer_heap_timeout_ms(ctl->timers, kvx_now_ns());
				if (timeout < 0 || timeout > MAX_POLL_MS)
					timeout = MAX_POLL_MS;
			}
		}
		nfds_t n = 0;
		pfd[n++] = (struct pollfd){.fd = kvx_waiter_fd(&ctl->waiter), .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = hs_fd, .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = nt_fd, .events = POLLIN};
		for (uint32_t k = 0; k < ws.n; k++)
			pfd[n++] = (struct pollfd){.fd = ws.w[k].fd, .events = POLLIN};
		nfds_t jbase = n;
		uint32_t nj = 0;
		for (struct hs_job *j = ctl->hs_active; j && nj < ctl->p.max_active_handshakes;
		     j = j->next) {
			int fd = j->sock ? sock_fd(j->sock) : -1;
			if (fd < 0)
				continue;
			jobs[nj++] = j;
			pfd[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
		}
		uint64_t t_sleep = prepared ? kvx_now_ns() : 0;
		int rc = poll(pfd, n, timeout);
		/* Slept: the next notification may open a window again, unless the sleep was short
		 * (a stream of notifications, where the window would only burn CPU the stream
		 * needs: kvxfer-perf notify's windowed throughput). */
		if (prepared)
			answer_by = kvx_now_ns() - t_sleep >= ANSWER_IDLE_NS ? 0 : 1;
		if (rc > 0 && pfd[0].revents)
			kvx_waiter_finish(&ctl->waiter);
		else if (prepared)
			/* Woken by a socket or the timeout: nothing to read from the eventfd (a wake
			 * that raced with this leaves it readable; the next poll returns at once). */
			kvx_waiter_cancel(&ctl->waiter);
		if (rc <= 0) {
			if (spinning)
				sched_yield(); /* a thread sharing this CPU runs first */
			continue;
		}
		if (pfd[1].revents) {
			hs_due = ctl_hs_recv(ctl) == RX_BATCH;
			last_work = kvx_now_ns();
		}
		if (pfd[2].revents) {
			nt_due = notify_read(ctl, &answer_by) == RX_BATCH;
			last_work = kvx_now_ns();
		}
		for (uint32_t k = 0; k < ws.n; k++) {
			short re = pfd[3 + k].revents;
			if (!re)
				continue;
			/* The table changed (a callback or another thread unwatched): entries are
			 * stale until the next sync; level-triggered fds report again then. */
			if (atomic_load_explicit(&ctl->watch_gen, memory_order_acquire) != ws.gen)
				break;
			if (re & POLLIN)
				ws.w[k].cb(ws.w[k].arg);
			else
				watch_suspend(ctl, ws.w[k].fd); /* POLLERR / POLLHUP / POLLNVAL */
		}
		for (uint32_t k = 0; k < nj; k++) {
			if (!pfd[jbase + k].revents)
				continue;
			/* A job may have finished (and been freed) by an earlier one's callback
			 * only through its own timer, which runs at the loop top, so jobs[k] is
			 * still on the active list here. The job reads until EAGAIN. */
			ctl_job_on_readable(ctl, jobs[k]);
		}
	}
	/* Shutdown: take in what producers already queued, then cancel queued and running
	 * handshakes (each gets its on_done); LINGER 0 means no peer blocks us. */
	while (ctl_inboxes_drain(ctl))
		;
	while (ctl->hs_active)
		ctl_job_finish(ctl, ctl->hs_active, -ECANCELED, "cancelled");
	while (ctl->hs_queue_head) {
		struct hs_job *j = ctl->hs_queue_head;
		ctl->hs_queue_head = j->next;
		ctl_job_cancel_unstarted(ctl, j);
	}
	ctl->hs_queue_tail = NULL;
	watch_loop_live(ctl, 0);
	t_ctl_self = NULL;
	free(pfd);
	free(jobs);
	return NULL;
}
