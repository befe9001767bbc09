/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer._kvxfer: the completion pump and its queue (ext.h; thread model in _kvxfer.c). */
#include "ext.h"

uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Completions still expected after @p c (role-aware; engine.h "Every transfer reaches..."). */
static int64_t cpl_delta(const EngineObject *s, const struct kvx_completion *c)
{
	if (c->kind == KVX_CPL_BLOCKS_RELEASED)
		return -1;
	/* TRANSFER: a producer always gets BLOCKS_RELEASED later; a consumer only when not DONE. */
	if (s->role == KVX_SCHED_PRODUCER || c->status != KVX_CPL_DONE)
		return 0;
	return -1;
}

void *pump_main(void *arg)
{
	EngineObject *s = arg;
	struct kvx_completion buf[CPL_BURST];
	uint64_t backoff_ns = 0;
	for (;;) {
		pthread_mutex_lock(&s->qmu);
		bool full = s->qlen + CPL_BURST > s->qcap;
		while (!s->stop_pump && (s->live <= 0 || full)) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 50000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			if (pthread_cond_timedwait(&s->qcv, &s->qmu, &ts) == ETIMEDOUT)
				break; /* guard: poll once even if the count says nothing is due */
			full = s->qlen + CPL_BURST > s->qcap;
		}
		bool stop = s->stop_pump;
		full = s->qlen + CPL_BURST > s->qcap;
		pthread_mutex_unlock(&s->qmu);
		if (stop)
			break;
		if (full)
			continue;
		pthread_mutex_lock(&s->mu);
		size_t n = kvx_engine_poll_completions(s->e, buf, CPL_BURST);
		pthread_mutex_unlock(&s->mu);
		if (n) {
			pthread_mutex_lock(&s->qmu);
			for (size_t i = 0; i < n; i++) {
				s->q[(s->qhead + s->qlen) % s->qcap] = buf[i];
				s->qlen++;
				s->live += cpl_delta(s, &buf[i]);
			}
			uint64_t one = 1;
			ssize_t w = write(s->efd, &one, sizeof(one));
			(void)w; /* the counter cannot overflow: it is reset while the queue drains */
			pthread_mutex_unlock(&s->qmu);
			backoff_ns = 0;
			continue;
		}
		backoff_ns = backoff_ns ? (backoff_ns < 256000 ? backoff_ns * 2 : 256000) : 16000;
		struct timespec ts = {0, (long)backoff_ns};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

void pump_stop(EngineObject *s)
{
	if (!s->pump_running)
		return;
	pthread_mutex_lock(&s->qmu);
	s->stop_pump = true;
	pthread_cond_signal(&s->qcv);
	pthread_mutex_unlock(&s->qmu);
	pthread_join(s->pump, NULL);
	s->pump_running = false;
}

void note_submitted(EngineObject *s)
{
	pthread_mutex_lock(&s->qmu);
	s->live++;
	pthread_cond_signal(&s->qcv);
	pthread_mutex_unlock(&s->qmu);
}

/* Engine(params: dict) */
