/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared between the files of the kvxfer._kvxfer extension (see _kvxfer.c for the thread model):
 * the Engine object, argument helpers (ext_args.c) and the completion pump (ext_pump.c).
 * Every function here needs the GIL except mono_ns() and the pump's.
 */
#ifndef KVXPY_EXT_H
#define KVXPY_EXT_H
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "kvxfer/engine.h"
#include "kvxfer/layout.h"


/** Completions moved per engine poll and returned per Engine.poll() call, at most. */
#define CPL_BURST 64
/** Block ids parsed into a stack array; longer lists use PyMem. */
#define STACK_BLOCKS 256

/** kvxfer.KvxError (an OSError subclass), created at module init. */
extern PyObject *kvxpy_error;

/* ---------------------------------------------------------------- the Engine object */

typedef struct {
	PyObject_HEAD
	struct kvx_engine *e;
	enum kvx_sched_role role;
	uint32_t n_layers;
	PyObject *owners; /* list: objects kept alive while registered (tensors) */
	bool started;
	pthread_mutex_t mu; /* serialises engine calls */
	/* completion queue, guarded by qmu */
	pthread_mutex_t qmu;
	pthread_cond_t qcv;
	struct kvx_completion *q;
	size_t qcap, qhead, qlen;
	int64_t live;  /* completions still expected from the engine */
	bool stop_pump;
	bool pump_running;
	pthread_t pump;
	int efd;
} EngineObject;


/* ext_args.c: errors and argument parsing; each raises naming the field and returns -1/NULL. */
/** Raise KvxError(errno, "<what>: <msg or strerror>"); returns NULL. */
PyObject *raise_kvx(int rc, const char *what, const char *msg);
/** An int field of dict @p d in [lo, hi]; missing/None keeps *out. 0 or -1 (raised). */
int dict_u64(PyObject *d, const char *key, uint64_t lo, uint64_t hi, uint64_t *out);
/** As dict_u64() for uint32_t. */
int dict_u32(PyObject *d, const char *key, uint32_t lo, uint32_t hi, uint32_t *out);
/** A str field (UTF-8 borrowed from the dict's object); missing/None keeps *out. */
int dict_str(PyObject *d, const char *key, const char **out);
/** A bool field; missing/None keeps *out. */
int dict_bool(PyObject *d, const char *key, bool *out);
/** A transfer id: str of 1..KVX_ENGINE_ID_MAX-1 UTF-8 bytes, no NUL; NULL if raised. */
const char *get_tid(PyObject *o);
/** Block ids (a sequence of ints < 2^32) into @p stack or a PyMem array (*out); count or -1. */
Py_ssize_t get_blocks(PyObject *seq, const char *field, uint32_t *stack, uint32_t **out);
/** Free what get_blocks() allocated. */
void put_blocks(uint32_t *stack, uint32_t *p);
/** A kvxfer.Peer tuple into @p p; hosts[] receives remote_hosts; *keep holds them alive. */
int get_peer(PyObject *o, struct kvx_engine_peer *p, const char **hosts, PyObject **keep);

/** The (transfer_id, local_blocks, peer) arguments of Engine.read / announce / write_begin and
 *  Notifier.announce. Parse in place (peer.remote_hosts points into hosts[]); put_xfer_args()
 *  releases what get_xfer_args() took. */
struct kvxpy_xfer_args {
	const char *tid;                        /* borrowed from the str argument */
	struct kvx_engine_peer peer;
	const char *hosts[KVX_ENGINE_MAX_PODS];
	PyObject *keep;                         /* holds peer.remote_hosts' strings */
	uint32_t stack[STACK_BLOCKS], *blocks;  /* blocks: stack or a PyMem array */
	size_t n;                               /* block count */
};
/** 0, or -1 (raised, naming the argument; nothing held). */
int get_xfer_args(PyObject *tido, PyObject *lo, PyObject *peero, struct kvxpy_xfer_args *a);
void put_xfer_args(struct kvxpy_xfer_args *a);

/** __init__(params: dict) of Engine and Notifier: the dict of kvxfer.EngineParams.to_dict() into
 *  @p p; refused when @p initialised (@p type names the class). 0 or -1 (raised, naming the field). */
int kvxpy_init_params(PyObject *args, PyObject *kw, bool initialised, const char *type,
		      struct kvx_engine_params *p);
/** -ENOBUFS within ENOBUFS_RETRY_NS of @p t0: pause (GIL released by the caller), true = retry. */
bool retry_nobufs(int rc, uint64_t t0, uint64_t *pause_ns);

/* Submit helper: run expr under mu with the GIL released, retrying -ENOBUFS (above). */
#define LOCKED_CALL(s, rc, expr)                                                                                   \
	do {                                                                                                       \
		Py_BEGIN_ALLOW_THREADS                                                                             \
		uint64_t t0_ = 0, pause_ = 1000;                                                                   \
		for (;;) {                                                                                         \
			pthread_mutex_lock(&(s)->mu);                                                              \
			rc = (expr);                                                                               \
			pthread_mutex_unlock(&(s)->mu);                                                            \
			if (rc != -ENOBUFS)                                                                        \
				break;                                                                             \
			if (!t0_)                                                                                  \
				t0_ = mono_ns();                                                                   \
			if (!retry_nobufs(rc, t0_, &pause_))                                                       \
				break;                                                                             \
		}                                                                                                  \
		Py_END_ALLOW_THREADS                                                                               \
	} while (0)


/* ext_notifier.c: kvxfer._kvxfer.Notifier (kvx_notifier_*), added to module @p m. 0 or -1. */
int kvxpy_add_notifier(PyObject *m);

/* ext_pump.c: the completion pump (no GIL). */
/** CLOCK_MONOTONIC, ns. */
uint64_t mono_ns(void);
/** Pump thread body: sole caller of kvx_engine_poll_completions(); @p arg is the EngineObject. */
void *pump_main(void *arg);
/** Stop and join the pump if running. */
void pump_stop(EngineObject *s);
/** A transfer was submitted: one more terminal completion is due; wakes an idle pump. */
void note_submitted(EngineObject *s);

#endif
