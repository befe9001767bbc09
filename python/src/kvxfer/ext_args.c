/* SPDX-License-Identifier: Apache-2.0 */
/* kvxfer._kvxfer: errors and argument parsing (ext.h). Needs the GIL. */
#include "ext.h"

PyObject *kvxpy_error;

/* ---------------------------------------------------------------- errors and argument helpers */

/* Raise KvxError(errno, "<what>: <engine message or strerror>"); returns NULL. */
PyObject *raise_kvx(int rc, const char *what, const char *msg)
{
	int en = rc < 0 ? -rc : rc;
	char buf[512];
	snprintf(buf, sizeof(buf), "%s: %s", what, msg && *msg ? msg : kvx_strerror(-en));
	PyObject *args = Py_BuildValue("(is)", en, buf);
	if (args) {
		PyErr_SetObject(kvxpy_error, args);
		Py_DECREF(args);
	}
	return NULL;
}

/* Read an integer field in [lo, hi] from a dict; missing keeps *out. -1 on error (raised,
 * naming the field). */
int dict_u64(PyObject *d, const char *key, uint64_t lo, uint64_t hi, uint64_t *out)
{
	PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
	if (!v || v == Py_None)
		return 0;
	if (!PyLong_Check(v) || PyBool_Check(v)) {
		PyErr_Format(PyExc_TypeError, "%s: expected int, got %R", key, v);
		return -1;
	}
	int ovf = 0;
	long long x = PyLong_AsLongLongAndOverflow(v, &ovf);
	if (x == -1 && PyErr_Occurred())
		return -1;
	if (ovf || x < 0 || (uint64_t)x < lo || (uint64_t)x > hi) {
		PyErr_Format(PyExc_ValueError, "%s: %S out of range [%llu, %llu]", key, v, (unsigned long long)lo,
			     (unsigned long long)hi);
		return -1;
	}
	*out = (uint64_t)x;
	return 0;
}

int dict_u32(PyObject *d, const char *key, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t x = *out;
	if (dict_u64(d, key, lo, hi, &x))
		return -1;
	*out = (uint32_t)x;
	return 0;
}

/* A str field (UTF-8, borrowed from the dict's object); missing keeps *out. */
int dict_str(PyObject *d, const char *key, const char **out)
{
	PyObject *v = PyDict_GetItemString(d, key);
	if (!v || v == Py_None)
		return 0;
	if (!PyUnicode_Check(v)) {
		PyErr_Format(PyExc_TypeError, "%s: expected str", key);
		return -1;
	}
	const char *s = PyUnicode_AsUTF8AndSize(v, NULL);
	if (!s)
		return -1;
	*out = s;
	return 0;
}

int dict_bool(PyObject *d, const char *key, bool *out)
{
	PyObject *v = PyDict_GetItemString(d, key);
	if (!v || v == Py_None)
		return 0;
	if (!PyBool_Check(v)) {
		PyErr_Format(PyExc_TypeError, "%s: expected bool", key);
		return -1;
	}
	*out = v == Py_True;
	return 0;
}

/* A transfer id: str of 1..KVX_ENGINE_ID_MAX-1 UTF-8 bytes. */
const char *get_tid(PyObject *o)
{
	if (!PyUnicode_Check(o)) {
		PyErr_SetString(PyExc_TypeError, "transfer_id: expected str");
		return NULL;
	}
	Py_ssize_t n;
	const char *s = PyUnicode_AsUTF8AndSize(o, &n);
	if (!s)
		return NULL;
	if (n < 1 || n >= KVX_ENGINE_ID_MAX || strlen(s) != (size_t)n) {
		PyErr_Format(PyExc_ValueError, "transfer_id: length %zd not in 1..%d (or embedded NUL)", n,
			     KVX_ENGINE_ID_MAX - 1);
		return NULL;
	}
	return s;
}

/* Block id list (any sequence of ints in [0, 2^32)) into buf (stack) or a PyMem block.
 * Returns the count, or -1 with an exception naming @p field. *heap set if allocated. */
Py_ssize_t get_blocks(PyObject *seq, const char *field, uint32_t *stack, uint32_t **out)
{
	*out = stack;
	PyObject *fast = PySequence_Tuple(seq);
	if (!fast) {
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError, "%s: expected a sequence of block ids", field);
		return -1;
	}
	Py_ssize_t n = PyTuple_Size(fast);
	if (n > STACK_BLOCKS) {
		*out = PyMem_Malloc((size_t)n * sizeof(uint32_t));
		if (!*out) {
			Py_DECREF(fast);
			PyErr_NoMemory();
			return -1;
		}
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *v = PyTuple_GetItem(fast, i);
		if (!PyLong_Check(v)) {
			PyErr_Format(PyExc_TypeError, "%s[%zd]: expected int", field, i);
			goto bad;
		}
		int ovf = 0;
		long long x = PyLong_AsLongLongAndOverflow(v, &ovf);
		if (ovf || x < 0 || x > (long long)UINT32_MAX) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_ValueError, "%s[%zd]: %S is not a block id (0..2^32-1)", field, i, v);
			goto bad;
		}
		(*out)[i] = (uint32_t)x;
	}
	Py_DECREF(fast);
	return n;
bad:
	Py_DECREF(fast);
	if (*out != stack)
		PyMem_Free(*out);
	*out = stack;
	return -1;
}

void put_blocks(uint32_t *stack, uint32_t *p)
{
	if (p != stack)
		PyMem_Free(p);
}

/* Peer: a tuple (host, handshake_port, notify_port, dp_rank, dp_size_local, tp_size,
 * remote_hosts-or-None), e.g. kvxfer.Peer. hosts[] receives borrowed UTF-8 pointers. */
int get_peer(PyObject *o, struct kvx_engine_peer *p, const char **hosts, PyObject **keep)
{
	static const char *names[] = {"peer.host", "peer.handshake_port", "peer.notify_port", "peer.dp_rank",
				      "peer.dp_size_local", "peer.tp_size"};
	*keep = NULL;
	if (!PyTuple_Check(o) || PyTuple_Size(o) != 7) {
		PyErr_SetString(PyExc_TypeError,
				"peer: expected kvxfer.Peer (host, handshake_port, notify_port, dp_rank, dp_size_local, "
				"tp_size, remote_hosts)");
		return -1;
	}
	memset(p, 0, sizeof(*p));
	PyObject *h = PyTuple_GetItem(o, 0);
	if (!PyUnicode_Check(h) || !(p->host = PyUnicode_AsUTF8AndSize(h, NULL))) {
		PyErr_Clear();
		PyErr_SetString(PyExc_TypeError, "peer.host: expected str");
		return -1;
	}
	uint64_t lim[6] = {0, 65535, 65535, UINT32_MAX, UINT32_MAX, UINT32_MAX};
	uint64_t val[6] = {0};
	for (int i = 1; i < 6; i++) {
		PyObject *v = PyTuple_GetItem(o, i);
		int ovf = 0;
		long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &ovf) : -1;
		if (!PyLong_Check(v) || ovf || x < 0 || (uint64_t)x > lim[i]) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "%s: expected int in [0, %llu]", names[i], (unsigned long long)lim[i]);
			return -1;
		}
		val[i] = (uint64_t)x;
	}
	p->handshake_port = (uint16_t)val[1];
	p->notify_port = (uint16_t)val[2];
	p->dp_rank = (uint32_t)val[3];
	p->dp_size_local = (uint32_t)val[4];
	p->tp_size = (uint32_t)val[5];
	PyObject *rh = PyTuple_GetItem(o, 6);
	if (rh != Py_None) {
		PyObject *t = PySequence_Tuple(rh);
		if (!t) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError, "peer.remote_hosts: expected a sequence of str or None");
			return -1;
		}
		Py_ssize_t n = PyTuple_Size(t);
		if (n > KVX_ENGINE_MAX_PODS) {
			Py_DECREF(t);
			PyErr_Format(PyExc_ValueError, "peer.remote_hosts: %zd hosts, at most %d", n, KVX_ENGINE_MAX_PODS);
			return -1;
		}
		for (Py_ssize_t i = 0; i < n; i++) {
			PyObject *s = PyTuple_GetItem(t, i);
			if (!PyUnicode_Check(s) || !(hosts[i] = PyUnicode_AsUTF8AndSize(s, NULL))) {
				PyErr_Clear();
				Py_DECREF(t);
				PyErr_Format(PyExc_TypeError, "peer.remote_hosts[%zd]: expected str", i);
				return -1;
			}
		}
		p->remote_hosts = n ? hosts : NULL;
		p->num_remote_hosts = (uint32_t)n;
		*keep = t;
	}
	return 0;
}

int get_xfer_args(PyObject *tido, PyObject *lo, PyObject *peero, struct kvxpy_xfer_args *a)
{
	a->keep = NULL;
	a->blocks = a->stack;
	if (!(a->tid = get_tid(tido)) || get_peer(peero, &a->peer, a->hosts, &a->keep))
		return -1;
	Py_ssize_t n = get_blocks(lo, "local_blocks", a->stack, &a->blocks);
	if (n < 0) {
		Py_CLEAR(a->keep);
		return -1;
	}
	a->n = (size_t)n;
	return 0;
}

void put_xfer_args(struct kvxpy_xfer_args *a)
{
	put_blocks(a->stack, a->blocks);
	a->blocks = a->stack;
	Py_CLEAR(a->keep);
}

/* Back-off before retrying a submission the engine refused with -ENOBUFS (its SPSC ring to
 * the owning lcore is full, or max_transfers objects are live until the pump polls their last
 * completion): both drain on their own, so the call retries for up to ENOBUFS_RETRY_NS with
 * the GIL released, doubling the pause from 1 us to 1 ms, then raises ENOBUFS. */
#define ENOBUFS_RETRY_NS 5000000000ull

bool retry_nobufs(int rc, uint64_t t0, uint64_t *pause_ns)
{
	if (rc != -ENOBUFS || mono_ns() - t0 > ENOBUFS_RETRY_NS)
		return false;
	struct timespec ts = {0, (long)*pause_ns};
	nanosleep(&ts, NULL);
	*pause_ns = *pause_ns < 1000000 ? *pause_ns * 2 : 1000000;
	return true;
}
