/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer._kvxfer.Notifier: the scheduler-side sender of `remote_blocks` / `release` (D WRITE,
 * include/kvxfer/engine.h kvx_notifier_*), for the connector's scheduler half, which runs in
 * vLLM's scheduler process and registers no memory. Calls are serialised by `mu` and made with
 * the GIL released (an -ENOBUFS inbox is retried as the Engine's submissions are).
 * Fields: n: under mu (closed by close()/dealloc).
 */
#include "ext.h"

typedef struct {
	PyObject_HEAD
	struct kvx_notifier *n;
	pthread_mutex_t mu;
} NotifierObject;

static PyObject *Notifier_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	(void)args;
	(void)kw;
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	NotifierObject *s = (NotifierObject *)alloc(type, 0);
	if (s)
		pthread_mutex_init(&s->mu, NULL);
	return (PyObject *)s;
}

/* Notifier(params: dict): params as Engine's (role consumer, mode WRITE). */
static int Notifier_init(PyObject *self, PyObject *args, PyObject *kw)
{
	NotifierObject *s = (NotifierObject *)self;
	struct kvx_engine_params p;
	if (kvxpy_init_params(args, kw, s->n != NULL, "Notifier", &p))
		return -1;
	char err[256] = "";
	struct kvx_notifier *n = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = kvx_notifier_create(&p, &n, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (rc) {
		raise_kvx(rc, "kvx_notifier_create", err);
		return -1;
	}
	s->n = n;
	return 0;
}

static void notifier_close(NotifierObject *s)
{
	pthread_mutex_lock(&s->mu);
	struct kvx_notifier *n = s->n;
	s->n = NULL;
	pthread_mutex_unlock(&s->mu);
	kvx_notifier_destroy(n);
}

static void Notifier_dealloc(PyObject *self)
{
	NotifierObject *s = (NotifierObject *)self;
	PyTypeObject *tp = Py_TYPE(self);
	notifier_close(s);
	pthread_mutex_destroy(&s->mu);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(self);
	Py_DECREF(tp);
}

static PyObject *Notifier_close(PyObject *self, PyObject *unused)
{
	(void)unused;
	Py_BEGIN_ALLOW_THREADS
	notifier_close((NotifierObject *)self);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

/* announce(transfer_id, local_blocks, peer, req_id=None): remote_blocks (empty list: release) to every
 * producer TP rank of peer's DP rank. */
static PyObject *Notifier_announce(PyObject *self, PyObject *args)
{
	NotifierObject *s = (NotifierObject *)self;
	PyObject *tido, *lo, *peero;
	const char *rid = NULL;
	if (!PyArg_ParseTuple(args, "OOO|z", &tido, &lo, &peero, &rid))
		return NULL;
	if (!s->n) {
		PyErr_SetString(PyExc_ValueError, "notifier is closed");
		return NULL;
	}
	struct kvxpy_xfer_args g;
	if (get_xfer_args(tido, lo, peero, &g))
		return NULL;
	struct kvx_engine_announce a = {.transfer_id = g.tid, .peer = g.peer, .local_blocks = g.blocks, .n = g.n};
	int rc;
	LOCKED_CALL(s, rc, s->n ? kvx_notifier_announce(s->n, &a, rid) : -EBADF);
	put_xfer_args(&g);
	if (rc)
		return raise_kvx(rc, "kvx_notifier_announce", rc == -EBADF ? "notifier is closed" : NULL);
	Py_RETURN_NONE;
}

static PyMethodDef Notifier_methods[] = {
	{"announce", Notifier_announce, METH_VARARGS,
	 "announce(transfer_id, local_blocks, peer, req_id=None): D WRITE scheduler: remote_blocks (empty list: release) to "
	 "every producer TP rank of peer's DP rank; req_id goes in remote_blocks. Raises KvxError (EINVAL bad ids, ENOBUFS after 5 s of "
	 "retries), ValueError/TypeError naming a bad argument. GIL released."},
	{"close", Notifier_close, METH_NOARGS, "close(): flush (bounded) and stop the control thread; idempotent."},
	{NULL, NULL, 0, NULL},
};

static PyType_Slot Notifier_slots[] = {
	{Py_tp_new, Notifier_new},
	{Py_tp_init, Notifier_init},
	{Py_tp_dealloc, Notifier_dealloc},
	{Py_tp_methods, Notifier_methods},
	{Py_tp_doc, "Notifier(params: dict): remote_blocks/release sender of a decode scheduler (no engine)."},
	{0, NULL},
};

static PyType_Spec Notifier_spec = {
	.name = "kvxfer._kvxfer.Notifier",
	.basicsize = sizeof(NotifierObject),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.slots = Notifier_slots,
};

int kvxpy_add_notifier(PyObject *m)
{
	PyObject *tp = PyType_FromSpec(&Notifier_spec);
	if (!tp || PyModule_AddObject(m, "Notifier", tp)) {
		Py_XDECREF(tp);
		return -1;
	}
	return 0;
}
