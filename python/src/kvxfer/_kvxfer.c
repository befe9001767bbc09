/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer._kvxfer: CPython extension over the public engine API (include/kvxfer/engine.h,
 * layout.h). Built against the limited API (Py_LIMITED_API, abi3), so one build serves every
 * CPython >= 3.10
 * (PyUnicode_AsUTF8AndSize joined the limited API in 3.10).
 *
 * Thread model. The engine wants one application thread making its calls; here every engine
 * call is made with the object's `mu` mutex held, so calls from the Python thread(s) and from
 * the completion pump are serialised (one at a time, each seeing the previous one's writes).
 * The GIL is released around every call that takes `mu` (the pump may hold it for one poll)
 * and around every call that can block (start, stop, layer_wait, wait).
 *
 * Completions. The C API has no completion file descriptor, and adding one needs engine
 * internals that are being refactored, so the extension builds it: one pump thread per started
 * engine is the only caller of kvx_engine_poll_completions(). It moves completions into a
 * queue (`q`, guarded by `qmu`) and makes the eventfd readable while the queue is non-empty.
 * Python drains the queue with poll() and can put fileno() into selectors/asyncio. The pump
 * polls only while transfers are outstanding (counted from submissions and completions), with
 * an exponential back-off from 16 us to 256 us between empty polls; with nothing outstanding
 * it sleeps on a condition variable (re-checking every 50 ms as a guard).
 * Fields: e, layers, tensors: Python thread (GIL); q*, live, stop_pump: qmu; engine state: mu.
 */
#include "ext.h"

/* Engine params from the dict of kvxfer.EngineParams.to_dict(); raises naming the field. */
int kvxpy_init_params(PyObject *args, PyObject *kw, bool initialised, const char *type,
		      struct kvx_engine_params *p)
{
	PyObject *d;
	static char *kwlist[] = {"params", NULL};
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", kwlist, &PyDict_Type, &d))
		return -1;
	if (initialised) {
		PyErr_Format(PyExc_RuntimeError, "%s already initialised", type);
		return -1;
	}
	kvx_engine_params_init(p);
	uint32_t role = p->role, mode = p->mode, idle = p->idle, spread = p->spread;
	uint32_t hs = p->handshake_port, nt = p->notify_port;
	if (dict_u32(d, "role", 0, 1, &role) || dict_u32(d, "mode", 0, 1, &mode) || dict_u32(d, "idle", 0, 1, &idle) ||
	    dict_str(d, "transport", &p->transport) || dict_str(d, "lcores", &p->lcores) ||
	    dict_u32(d, "control_lcore", 0, UINT32_MAX, &p->control_lcore) || dict_str(d, "host", &p->host) ||
	    dict_u32(d, "handshake_port", 0, 65535, &hs) || dict_u32(d, "notify_port", 0, 65535, &nt) ||
	    dict_u32(d, "dp_rank", 0, UINT32_MAX, &p->dp_rank) || dict_u32(d, "dp_size", 1, UINT32_MAX, &p->dp_size) ||
	    dict_u32(d, "dp_size_local", 0, UINT32_MAX, &p->dp_size_local) ||
	    dict_u32(d, "tp_rank", 0, UINT32_MAX, &p->tp_rank) || dict_u32(d, "tp_size", 1, UINT32_MAX, &p->tp_size) ||
	    dict_u32(d, "total_kv_heads", 0, UINT32_MAX, &p->total_kv_heads) ||
	    dict_u32(d, "handshake_timeout_ms", 1, UINT32_MAX, &p->handshake_timeout_ms) ||
	    dict_u32(d, "transfer_timeout_ms", 1, UINT32_MAX, &p->transfer_timeout_ms) ||
	    dict_u32(d, "defer_timeout_ms", 1, UINT32_MAX, &p->defer_timeout_ms) ||
	    dict_str(d, "proxy_addr", &p->proxy_addr) || dict_str(d, "http_addr", &p->http_addr) ||
	    dict_bool(d, "vllm_port_compat", &p->vllm_port_compat) ||
	    dict_bool(d, "follow_waker", &p->follow_waker) ||
	    dict_u32(d, "poller_slice_us", 0, 100000, &p->poller_slice_us) ||
	    dict_u32(d, "control_busy_poll_us", 0, 1000000, &p->control_busy_poll_us) ||
	    dict_u32(d, "max_transfers", 1, 1u << 20, &p->max_transfers) ||
	    dict_u32(d, "max_blocks", 1, 1u << 24, &p->max_blocks) || dict_u32(d, "spread", 0, 1, &spread))
		return -1;
	p->role = (enum kvx_sched_role)role;
	p->mode = (enum kvx_sched_mode)mode;
	p->idle = (enum kvx_engine_idle)idle;
	p->spread = (enum kvx_engine_spread)spread;
	p->handshake_port = (uint16_t)hs;
	p->notify_port = (uint16_t)nt;
	return 0;
}

static int Engine_init(PyObject *self, PyObject *args, PyObject *kw)
{
	EngineObject *s = (EngineObject *)self;
	struct kvx_engine_params p;
	if (kvxpy_init_params(args, kw, s->e != NULL, "Engine", &p))
		return -1;
	char err[256] = "";
	struct kvx_engine *e = NULL;
	int rc = kvx_engine_create(&p, &e, err, sizeof(err));
	if (rc) {
		raise_kvx(rc, "kvx_engine_create", err);
		return -1;
	}
	s->qcap = 4 * (size_t)p.max_transfers + 2 * CPL_BURST;
	s->q = calloc(s->qcap, sizeof(*s->q));
	s->owners = PyList_New(0);
	s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!s->q || !s->owners || s->efd < 0) {
		kvx_engine_destroy(e);
		if (s->efd < 0)
			PyErr_SetFromErrno(PyExc_OSError);
		else if (!PyErr_Occurred())
			PyErr_NoMemory();
		return -1;
	}
	s->e = e;
	s->role = p.role;
	return 0;
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	(void)args;
	(void)kw;
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	EngineObject *s = (EngineObject *)alloc(type, 0);
	if (!s)
		return NULL;
	s->efd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->qmu, NULL);
	pthread_cond_init(&s->qcv, NULL);
	return (PyObject *)s;
}

static void engine_close(EngineObject *s)
{
	pump_stop(s);
	if (s->e) {
		struct kvx_engine *e = s->e;
		s->e = NULL;
		Py_BEGIN_ALLOW_THREADS
		pthread_mutex_lock(&s->mu);
		kvx_engine_destroy(e);
		pthread_mutex_unlock(&s->mu);
		Py_END_ALLOW_THREADS
	}
	s->started = false;
}

static void Engine_dealloc(PyObject *self)
{
	EngineObject *s = (EngineObject *)self;
	PyTypeObject *tp = Py_TYPE(self);
	engine_close(s);
	if (s->efd >= 0)
		close(s->efd);
	free(s->q);
	Py_XDECREF(s->owners);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->qmu);
	pthread_cond_destroy(&s->qcv);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(self);
	Py_DECREF(tp);
}

static int need(EngineObject *s, bool started)
{
	if (!s->e) {
		PyErr_SetString(PyExc_ValueError, "engine is closed");
		return -1;
	}
	if (started && !s->started) {
		raise_kvx(-EBUSY, "engine", "not started (call start() after registering the layers)");
		return -1;
	}
	return 0;
}

/* register_layer(name, base, shape, stride, elem_size, block_size, num_kv_heads, head_size,
 *                is_mla, mem, device_id, owner) -> layer index */
static PyObject *Engine_register_layer(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	const char *name;
	unsigned long long base;
	PyObject *shape, *stride, *owner;
	int elem_size, is_mla, mem, device_id;
	long long block_size, heads, head_size;
	if (!PyArg_ParseTuple(args, "sKOOiLLLpiiO", &name, &base, &shape, &stride, &elem_size, &block_size, &heads,
			      &head_size, &is_mla, &mem, &device_id, &owner))
		return NULL;
	if (need(s, false))
		return NULL;
	struct kvx_engine_layer l;
	memset(&l, 0, sizeof(l));
	l.name = name;
	l.base = (void *)(uintptr_t)base;
	if (!base)
		return PyErr_Format(PyExc_ValueError, "base: NULL data pointer (layer %s)", name);
	if (elem_size <= 0)
		return PyErr_Format(PyExc_ValueError, "elem_size: %d must be > 0", elem_size);
	if (block_size <= 0 || block_size > UINT32_MAX)
		return PyErr_Format(PyExc_ValueError, "block_size: %lld must be in 1..2^32-1", block_size);
	if (heads < 0 || heads > UINT32_MAX)
		return PyErr_Format(PyExc_ValueError, "num_kv_heads: %lld out of range", heads);
	if (head_size < 0 || head_size > UINT32_MAX)
		return PyErr_Format(PyExc_ValueError, "head_size: %lld out of range", head_size);
	if (mem < 0 || mem > 2)
		return PyErr_Format(PyExc_ValueError, "mem: %d is not a memory type (0 host, 1 hip, 2 hostdev)", mem);
	const char *fields[2] = {"shape", "stride"};
	PyObject *seqs[2] = {shape, stride};
	uint64_t *dst[2] = {l.tensor.shape, l.tensor.stride};
	Py_ssize_t nd[2];
	for (int k = 0; k < 2; k++) {
		PyObject *t = PySequence_Tuple(seqs[k]);
		if (!t) {
			PyErr_Clear();
			return PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints", fields[k]);
		}
		nd[k] = PyTuple_Size(t);
		if (nd[k] < 1 || nd[k] > KVX_LAYOUT_MAX_DIMS) {
			Py_DECREF(t);
			return PyErr_Format(PyExc_ValueError, "%s: rank %zd not in 1..%d", fields[k], nd[k],
					    KVX_LAYOUT_MAX_DIMS);
		}
		for (Py_ssize_t i = 0; i < nd[k]; i++) {
			PyObject *v = PyTuple_GetItem(t, i);
			int ovf = 0;
			long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &ovf) : -1;
			if (x < 0 || ovf) {
				Py_DECREF(t);
				PyErr_Clear();
				return PyErr_Format(PyExc_ValueError, "%s[%zd]: expected a non-negative int", fields[k], i);
			}
			dst[k][i] = (uint64_t)x;
		}
		Py_DECREF(t);
	}
	if (nd[0] != nd[1])
		return PyErr_Format(PyExc_ValueError, "stride: rank %zd differs from shape's %zd", nd[1], nd[0]);
	l.tensor.ndim = (uint32_t)nd[0];
	l.tensor.elem_size = (uint32_t)elem_size;
	l.spec.block_size = (uint32_t)block_size;
	l.spec.num_kv_heads = (uint32_t)heads;
	l.spec.head_size = (uint32_t)head_size;
	l.spec.is_mla = is_mla;
	l.mem = (enum kvx_engine_mem)mem;
	l.device_id = device_id;
	/* Classify first, so a bad geometry raises with the layout module's message. */
	struct kvx_layout_geom g;
	char err[256] = "";
	int rc = kvx_layout_geometry(&l.spec, &l.tensor, 0, &g, err, sizeof(err));
	if (rc)
		return raise_kvx(rc, "layout", err);
	Py_BEGIN_ALLOW_THREADS
	pthread_mutex_lock(&s->mu);
	rc = kvx_engine_register_layer(s->e, &l);
	pthread_mutex_unlock(&s->mu);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_kvx(rc, "kvx_engine_register_layer", NULL);
	if (PyList_Append(s->owners, owner))
		return NULL;
	s->n_layers++;
	return PyLong_FromLong(rc);
}

static PyObject *Engine_start(PyObject *self, PyObject *unused)
{
	(void)unused;
	EngineObject *s = (EngineObject *)self;
	if (need(s, false))
		return NULL;
	if (s->started)
		return raise_kvx(-EBUSY, "kvx_engine_start", "already started");
	int rc;
	Py_BEGIN_ALLOW_THREADS
	pthread_mutex_lock(&s->mu);
	rc = kvx_engine_start(s->e);
	pthread_mutex_unlock(&s->mu);
	Py_END_ALLOW_THREADS
	if (rc)
		return raise_kvx(rc, "kvx_engine_start", NULL);
	s->started = true;
	s->stop_pump = false;
	rc = pthread_create(&s->pump, NULL, pump_main, s);
	if (rc)
		return raise_kvx(-rc, "completion pump thread", NULL);
	s->pump_running = true;
	Py_RETURN_NONE;
}

/* stop(): live transfers end ABORTED; their completions are still delivered by poll(). */
static PyObject *Engine_stop(PyObject *self, PyObject *unused)
{
	(void)unused;
	EngineObject *s = (EngineObject *)self;
	if (need(s, false))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	pthread_mutex_lock(&s->mu);
	kvx_engine_stop(s->e);
	pthread_mutex_unlock(&s->mu);
	Py_END_ALLOW_THREADS
	Py_RETURN_NONE;
}

static PyObject *Engine_close(PyObject *self, PyObject *unused)
{
	(void)unused;
	engine_close((EngineObject *)self);
	Py_RETURN_NONE;
}

static PyObject *Engine_ports(PyObject *self, PyObject *unused)
{
	(void)unused;
	EngineObject *s = (EngineObject *)self;
	if (need(s, true))
		return NULL;
	uint16_t hs = 0, nt = 0;
	int rc = kvx_engine_ports(s->e, &hs, &nt);
	if (rc)
		return raise_kvx(rc, "kvx_engine_ports", NULL);
	return Py_BuildValue("(ii)", hs, nt);
}

static PyObject *Engine_transport_name(PyObject *self, PyObject *unused)
{
	(void)unused;
	EngineObject *s = (EngineObject *)self;
	if (need(s, false))
		return NULL;
	return PyUnicode_FromString(kvx_engine_transport_name(s->e));
}

/* read(transfer_id, local_blocks, remote_blocks, peer) */
static PyObject *Engine_read(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido, *lo, *ro, *peero;
	if (!PyArg_ParseTuple(args, "OOOO", &tido, &lo, &ro, &peero) || need(s, true))
		return NULL;
	struct kvxpy_xfer_args g;
	if (get_xfer_args(tido, lo, peero, &g))
		return NULL;
	uint32_t rs[STACK_BLOCKS], *rp;
	Py_ssize_t nr = get_blocks(ro, "remote_blocks", rs, &rp);
	if (nr < 0) {
		put_xfer_args(&g);
		return NULL;
	}
	if ((size_t)nr != g.n) {
		put_blocks(rs, rp);
		put_xfer_args(&g);
		return PyErr_Format(PyExc_ValueError, "remote_blocks: %zd ids, local_blocks has %zu (pairs)", nr, g.n);
	}
	struct kvx_engine_read r = {.transfer_id = g.tid, .peer = g.peer, .local_blocks = g.blocks, .remote_blocks = rp,
				    .n = g.n};
	int rc;
	LOCKED_CALL(s, rc, kvx_xfer_read(s->e, &r));
	put_xfer_args(&g);
	put_blocks(rs, rp);
	if (rc)
		return raise_kvx(rc, "kvx_xfer_read", NULL);
	note_submitted(s);
	Py_RETURN_NONE;
}

/* announce(transfer_id, local_blocks, peer, notified=False) or write_begin(transfer_id, local_blocks, peer) */
static PyObject *submit_blocks_peer(PyObject *self, PyObject *args, bool write)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido, *lo, *peero;
	int notified = 0;
	if (!PyArg_ParseTuple(args, write ? "OOO" : "OOO|p", &tido, &lo, &peero, &notified) || need(s, true))
		return NULL;
	struct kvxpy_xfer_args g;
	if (get_xfer_args(tido, lo, peero, &g))
		return NULL;
	int rc;
	if (write) {
		struct kvx_engine_write w = {.transfer_id = g.tid, .peer = g.peer, .local_blocks = g.blocks, .n = g.n};
		LOCKED_CALL(s, rc, kvx_xfer_write_begin(s->e, &w));
	} else {
		struct kvx_engine_announce a = {.transfer_id = g.tid, .peer = g.peer, .local_blocks = g.blocks, .n = g.n,
						.notified = notified != 0};
		LOCKED_CALL(s, rc, kvx_xfer_announce(s->e, &a));
	}
	put_xfer_args(&g);
	if (rc)
		return raise_kvx(rc, write ? "kvx_xfer_write_begin" : "kvx_xfer_announce", NULL);
	note_submitted(s);
	Py_RETURN_NONE;
}

static PyObject *Engine_announce(PyObject *self, PyObject *args)
{
	return submit_blocks_peer(self, args, false);
}

static PyObject *Engine_write_begin(PyObject *self, PyObject *args)
{
	return submit_blocks_peer(self, args, true);
}

/* serve(transfer_id, local_blocks, consumer_tp_size=0) */
static PyObject *Engine_serve(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido, *lo;
	unsigned int ctp = 0;
	if (!PyArg_ParseTuple(args, "OO|I", &tido, &lo, &ctp) || need(s, true))
		return NULL;
	const char *tid = get_tid(tido);
	if (!tid)
		return NULL;
	uint32_t ls[STACK_BLOCKS], *lp;
	Py_ssize_t nl = get_blocks(lo, "local_blocks", ls, &lp);
	if (nl < 0)
		return NULL;
	struct kvx_engine_serve sv = {.transfer_id = tid, .local_blocks = lp, .n = (size_t)nl, .consumer_tp_size = ctp};
	int rc;
	LOCKED_CALL(s, rc, kvx_xfer_serve(s->e, &sv));
	put_blocks(ls, lp);
	if (rc)
		return raise_kvx(rc, "kvx_xfer_serve", NULL);
	note_submitted(s);
	Py_RETURN_NONE;
}

static int get_layer(EngineObject *s, long layer)
{
	if (layer < 0 || (uint64_t)layer >= s->n_layers) {
		PyErr_Format(PyExc_ValueError, "layer: %ld not in 0..%u (registered layers)", layer,
			     s->n_layers ? s->n_layers - 1 : 0);
		return -1;
	}
	return 0;
}

/* layer_ready(transfer_id, layer, hip_event=0): P WRITE; 0 = ready now. */
static PyObject *Engine_layer_ready(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido;
	long layer;
	unsigned long long ev = 0;
	if (!PyArg_ParseTuple(args, "Ol|K", &tido, &layer, &ev) || need(s, true))
		return NULL;
	const char *tid = get_tid(tido);
	if (!tid || get_layer(s, layer))
		return NULL;
	int rc;
	if (ev)
		LOCKED_CALL(s, rc, kvx_xfer_layer_ready_hip(s->e, tid, (uint32_t)layer, (void *)(uintptr_t)ev));
	else
		LOCKED_CALL(s, rc, kvx_xfer_layer_ready(s->e, tid, (uint32_t)layer, NULL));
	if (rc)
		return raise_kvx(rc, ev ? "kvx_xfer_layer_ready_hip" : "kvx_xfer_layer_ready", NULL);
	Py_RETURN_NONE;
}

/* seal(transfer_id, n_layers) */
static PyObject *Engine_seal(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido;
	long n;
	if (!PyArg_ParseTuple(args, "Ol", &tido, &n) || need(s, true))
		return NULL;
	const char *tid = get_tid(tido);
	if (!tid)
		return NULL;
	if (n < 1 || (uint64_t)n > s->n_layers)
		return PyErr_Format(PyExc_ValueError, "n_layers: %ld not in 1..%u", n, s->n_layers);
	int rc;
	LOCKED_CALL(s, rc, kvx_xfer_seal(s->e, tid, (uint32_t)n));
	if (rc)
		return raise_kvx(rc, "kvx_xfer_seal", NULL);
	Py_RETURN_NONE;
}

static PyObject *Engine_abort(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido;
	if (!PyArg_ParseTuple(args, "O", &tido) || need(s, true))
		return NULL;
	const char *tid = get_tid(tido);
	if (!tid)
		return NULL;
	int rc;
	LOCKED_CALL(s, rc, kvx_xfer_abort(s->e, tid));
	if (rc)
		return raise_kvx(rc, "kvx_xfer_abort", NULL);
	Py_RETURN_NONE;
}

/* layer_poll(transfer_id, layer) -> bool (True landed); raises if the transfer failed. */
static PyObject *Engine_layer_poll(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido;
	long layer;
	if (!PyArg_ParseTuple(args, "Ol", &tido, &layer) || need(s, true))
		return NULL;
	const char *tid = get_tid(tido);
	if (!tid || get_layer(s, layer))
		return NULL;
	int rc;
	LOCKED_CALL(s, rc, kvx_xfer_layer_poll(s->e, tid, (uint32_t)layer));
	if (rc < 0)
		return raise_kvx(rc, "kvx_xfer_layer_poll", NULL);
	return PyBool_FromLong(rc);
}

/* layer_wait(transfer_id, layer, timeout_ms): D READ per-layer barrier. Waits in slices of
 * 2 ms with mu held so the pump can poll in between. Raises KvxError(ETIMEDOUT) on timeout. */
static PyObject *Engine_layer_wait(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	PyObject *tido;
	long layer;
	unsigned int timeout_ms;
	if (!PyArg_ParseTuple(args, "OlI", &tido, &layer, &timeout_ms) || need(s, true))
		return NULL;
	const char *tid = get_tid(tido);
	if (!tid || get_layer(s, layer))
		return NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000ull;
	for (;;) {
		uint64_t now = mono_ns();
		uint32_t slice = now >= deadline ? 0 : (uint32_t)((deadline - now + 999999) / 1000000);
		if (slice > 2)
			slice = 2;
		pthread_mutex_lock(&s->mu);
		rc = kvx_xfer_layer_wait(s->e, tid, (uint32_t)layer, slice);
		pthread_mutex_unlock(&s->mu);
		if (rc != -ETIMEDOUT || mono_ns() >= deadline)
			break;
	}
	Py_END_ALLOW_THREADS
	if (rc)
		return raise_kvx(rc, "kvx_xfer_layer_wait", NULL);
	Py_RETURN_NONE;
}

/* poll(max=64) -> list of (transfer_id, kind, status, error, bytes, duration_ns). */
static PyObject *Engine_poll(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	Py_ssize_t max = CPL_BURST;
	if (!PyArg_ParseTuple(args, "|n", &max))
		return NULL;
	if (max < 1)
		return PyErr_Format(PyExc_ValueError, "max: %zd must be >= 1", max);
	if (max > CPL_BURST)
		max = CPL_BURST;
	struct kvx_completion out[CPL_BURST];
	size_t n = 0;
	Py_BEGIN_ALLOW_THREADS
	pthread_mutex_lock(&s->qmu);
	while (n < (size_t)max && s->qlen) {
		out[n++] = s->q[s->qhead];
		s->qhead = (s->qhead + 1) % s->qcap;
		s->qlen--;
	}
	if (!s->qlen) {
		uint64_t v;
		ssize_t r = read(s->efd, &v, sizeof(v)); /* empty queue: fd not readable */
		(void)r;
	}
	if (n)
		pthread_cond_signal(&s->qcv); /* room again for a pump that paused on a full queue */
	pthread_mutex_unlock(&s->qmu);
	Py_END_ALLOW_THREADS
	PyObject *list = PyList_New((Py_ssize_t)n);
	if (!list)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		PyObject *t = Py_BuildValue("(siiiKK)", out[i].transfer_id, (int)out[i].kind, (int)out[i].status,
					    out[i].error, (unsigned long long)out[i].bytes,
					    (unsigned long long)out[i].duration_ns);
		if (!t) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SetItem(list, (Py_ssize_t)i, t);
	}
	return list;
}

/* wait(timeout_s) -> bool: block (GIL released) until a completion is queued. */
static PyObject *Engine_wait(PyObject *self, PyObject *args)
{
	EngineObject *s = (EngineObject *)self;
	double timeout_s;
	if (!PyArg_ParseTuple(args, "d", &timeout_s))
		return NULL;
	if (s->efd < 0)
		return PyErr_Format(PyExc_ValueError, "engine is closed");
	int r;
	struct pollfd pfd = {.fd = s->efd, .events = POLLIN};
	int ms = timeout_s < 0 ? -1 : (int)(timeout_s * 1000.0 + 0.999);
	Py_BEGIN_ALLOW_THREADS
	r = poll(&pfd, 1, ms);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return PyErr_SetFromErrno(PyExc_OSError);
	return PyBool_FromLong(r > 0);
}

static PyObject *Engine_fileno(PyObject *self, PyObject *unused)
{
	(void)unused;
	EngineObject *s = (EngineObject *)self;
	if (s->efd < 0)
		return PyErr_Format(PyExc_ValueError, "engine is closed");
	return PyLong_FromLong(s->efd);
}

static int set_u64(PyObject *d, const char *k, uint64_t v)
{
	PyObject *o = PyLong_FromUnsignedLongLong(v);
	int rc = o ? PyDict_SetItemString(d, k, o) : -1;
	Py_XDECREF(o);
	return rc;
}

static PyObject *Engine_stats(PyObject *self, PyObject *unused)
{
	(void)unused;
	EngineObject *s = (EngineObject *)self;
	if (need(s, false))
		return NULL;
	struct kvx_engine_stats *st = calloc(1, sizeof(*st));
	if (!st)
		return PyErr_NoMemory();
	Py_BEGIN_ALLOW_THREADS
	pthread_mutex_lock(&s->mu);
	kvx_engine_get_stats(s->e, st);
	pthread_mutex_unlock(&s->mu);
	Py_END_ALLOW_THREADS
	PyObject *d = PyDict_New(), *lcs = PyList_New(0), *peers = PyList_New(0);
	if (!d || !lcs || !peers)
		goto fail;
	if (set_u64(d, "transfers_done", st->transfers_done) || set_u64(d, "transfers_failed", st->transfers_failed) ||
	    set_u64(d, "transfers_aborted", st->transfers_aborted) ||
	    set_u64(d, "transfers_timed_out", st->transfers_timed_out) ||
	    set_u64(d, "duplicates_rejected", st->duplicates_rejected) ||
	    set_u64(d, "late_notifications", st->late_notifications) || set_u64(d, "quarantined", st->quarantined) ||
	    set_u64(d, "notifications_sent", st->notifications_sent) ||
	    set_u64(d, "notifications_received", st->notifications_received) || set_u64(d, "fences", st->fences) ||
	    set_u64(d, "peer_resets", st->peer_resets))
		goto fail;
	for (uint32_t i = 0; i < st->n_lcores && i < KVX_ENGINE_MAX_POLLERS; i++) {
		const struct kvx_engine_lcore_stats *l = &st->lcores[i];
		PyObject *o = Py_BuildValue("{s:I,s:K,s:K,s:K,s:K,s:d}", "lcore_id", l->lcore_id, "bytes",
					    (unsigned long long)l->bytes, "ops", (unsigned long long)l->ops, "transfers",
					    (unsigned long long)l->transfers, "failures", (unsigned long long)l->failures,
					    "utilization", l->utilization);
		if (!o || PyList_Append(lcs, o)) {
			Py_XDECREF(o);
			goto fail;
		}
		Py_DECREF(o);
	}
	for (uint32_t i = 0; i < st->n_peers && i < KVX_ENGINE_MAX_PEERS; i++) {
		const struct kvx_engine_peer_stats *p = &st->peers[i];
		PyObject *o = Py_BuildValue("{s:s,s:i,s:I,s:K,s:K,s:K,s:K}", "host", p->host, "port", (int)p->port,
					    "dp_rank", p->dp_rank, "bytes", (unsigned long long)p->bytes, "ops",
					    (unsigned long long)p->ops, "transfers", (unsigned long long)p->transfers,
					    "failures", (unsigned long long)p->failures);
		if (!o || PyList_Append(peers, o)) {
			Py_XDECREF(o);
			goto fail;
		}
		Py_DECREF(o);
	}
	if (PyDict_SetItemString(d, "lcores", lcs) || PyDict_SetItemString(d, "peers", peers))
		goto fail;
	Py_DECREF(lcs);
	Py_DECREF(peers);
	free(st);
	return d;
fail:
	Py_XDECREF(d);
	Py_XDECREF(lcs);
	Py_XDECREF(peers);
	free(st);
	return NULL;
}

/* ---------------------------------------------------------------- module functions */

/* geometry(shape, stride, elem_size, block_size, num_kv_heads, head_size, is_mla) -> dict */
static PyObject *mod_geometry(PyObject *mod, PyObject *args)
{
	(void)mod;
	PyObject *shape, *stride;
	unsigned int es, bs, heads, hsz;
	int mla;
	if (!PyArg_ParseTuple(args, "OOIIIIp", &shape, &stride, &es, &bs, &heads, &hsz, &mla))
		return NULL;
	struct kvx_layout_tensor t;
	memset(&t, 0, sizeof(t));
	PyObject *ts = PySequence_Tuple(shape), *tt = PySequence_Tuple(stride);
	if (!ts || !tt || PyTuple_Size(ts) != PyTuple_Size(tt) || PyTuple_Size(ts) < 1 ||
	    PyTuple_Size(ts) > KVX_LAYOUT_MAX_DIMS) {
		Py_XDECREF(ts);
		Py_XDECREF(tt);
		PyErr_Clear();
		return PyErr_Format(PyExc_ValueError, "shape/stride: sequences of the same rank 1..%d",
				    KVX_LAYOUT_MAX_DIMS);
	}
	t.ndim = (uint32_t)PyTuple_Size(ts);
	for (uint32_t i = 0; i < t.ndim; i++) {
		t.shape[i] = PyLong_AsUnsignedLongLong(PyTuple_GetItem(ts, i));
		t.stride[i] = PyLong_AsUnsignedLongLong(PyTuple_GetItem(tt, i));
	}
	Py_DECREF(ts);
	Py_DECREF(tt);
	if (PyErr_Occurred())
		return NULL;
	t.elem_size = es;
	struct kvx_layout_spec sp = {.block_size = bs, .num_kv_heads = heads, .head_size = hsz, .is_mla = mla};
	struct kvx_layout_geom g;
	char err[256] = "";
	int rc = kvx_layout_geometry(&sp, &t, 0, &g, err, sizeof(err));
	if (rc)
		return raise_kvx(rc, "layout", err);
	const char *kind = g.kind == KVX_LAYOUT_KIND_MLA ? "mla" : g.kind == KVX_LAYOUT_KIND_SPLIT ? "split" : "interleaved";
	return Py_BuildValue("{s:s,s:K,s:I,s:K,s:K,s:I,s:I,s:O}", "kind", kind, "num_blocks",
			     (unsigned long long)g.num_blocks, "block_size", g.block_size, "block_len",
			     (unsigned long long)g.block_len, "block_stride", (unsigned long long)g.block_stride,
			     "transfers_per_block", g.transfers_per_block, "kernel_blocks_per_block",
			     g.kernel_blocks_per_block, "split_kv_regions", g.split_kv_regions ? Py_True : Py_False);
}

#define ERRS " Raises KvxError(errno) from the engine (EBUSY not started / wrong role or mode, EEXIST duplicate" \
	" id, EINVAL bad block ids, ENOBUFS still full after 5 s of retries), ValueError/TypeError naming a bad" \
	" argument. Any thread; non-blocking apart from the engine mutex (GIL released)."
static PyMethodDef Engine_methods[] = {
	{"register_layer", Engine_register_layer, METH_VARARGS,
	 "register_layer(name, base, shape, stride, elem_size, block_size, num_kv_heads, head_size, is_mla, mem, "
	 "device_id, owner) -> int: register one KV layer before start(); shape/stride in elements, elem_size and "
	 "base in bytes, mem 0 host / 1 HIP / 2 hostdev; owner (the tensor) is kept alive. Returns the layer "
	 "index. Raises KvxError(EINVAL) with the layout module's message for an unsupported geometry, EBUSY "
	 "after start, ENOBUFS past 512 layers."},
	{"start", Engine_start, METH_NOARGS,
	 "start(): start the lcores, bind the listeners (blocks until bound), start the completion pump. Raises "
	 "KvxError (EINVAL no layer, EADDRINUSE, EBUSY already started)."},
	{"stop", Engine_stop, METH_NOARGS,
	 "stop(): live transfers end ABORTED (their completions stay pollable); blocks until the lcores joined."},
	{"close", Engine_close, METH_NOARGS, "close(): stop the pump, stop and destroy the engine; idempotent."},
	{"ports", Engine_ports, METH_NOARGS, "ports() -> (handshake_port, notify_port): the bound base ports."},
	{"transport_name", Engine_transport_name, METH_NOARGS,
	 "transport_name() -> str: requested provider before start, then the one in use."},
	{"read", Engine_read, METH_VARARGS,
	 "read(transfer_id, local_blocks, remote_blocks, peer): D READ; block lists pair by index (equal "
	 "lengths; empty = release P only); peer is a kvxfer.Peer." ERRS},
	{"announce", Engine_announce, METH_VARARGS,
	 "announce(transfer_id, local_blocks, peer, notified=False): D WRITE; sends remote_blocks (empty: release); "
	 "notified=True: the scheduler's Notifier sent it, only await write_done." ERRS},
	{"write_begin", Engine_write_begin, METH_VARARGS,
	 "write_begin(transfer_id, local_blocks, peer): P WRITE; local_blocks = the whole prompt." ERRS},
	{"serve", Engine_serve, METH_VARARGS,
	 "serve(transfer_id, local_blocks, consumer_tp_size=0): P READ; until D's release or defer timeout." ERRS},
	{"layer_ready", Engine_layer_ready, METH_VARARGS,
	 "layer_ready(transfer_id, layer, hip_event=0): P WRITE layer computed; 0 = now, else a hipEvent_t "
	 "handle queried by the lcore. KvxError(ENOENT) if the transfer already ended." ERRS},
	{"seal", Engine_seal, METH_VARARGS,
	 "seal(transfer_id, n_layers): P WRITE: the transfer completes once n_layers layers are written." ERRS},
	{"abort", Engine_abort, METH_VARARGS,
	 "abort(transfer_id): either role; KvxError(ENOENT) if unknown or terminal and polled." ERRS},
	{"layer_poll", Engine_layer_poll, METH_VARARGS,
	 "layer_poll(transfer_id, layer) -> bool: D READ layer landed; KvxError if the transfer failed."},
	{"layer_wait", Engine_layer_wait, METH_VARARGS,
	 "layer_wait(transfer_id, layer, timeout_ms): D READ per-layer barrier; blocks with the GIL released; "
	 "KvxError(ETIMEDOUT) on timeout, or the transfer's errno if it failed."},
	{"poll", Engine_poll, METH_VARARGS,
	 "poll(max=64) -> [(transfer_id, kind, status, error, bytes, duration_ns)]: queued completions, at most "
	 "64; non-blocking; error is 0 or a negative errno, duration in ns."},
	{"wait", Engine_wait, METH_VARARGS,
	 "wait(timeout_s) -> bool: block (GIL released) until poll() has something; negative = no timeout."},
	{"fileno", Engine_fileno, METH_NOARGS,
	 "fileno() -> int: an eventfd readable while completions are queued (selectors/asyncio)."},
	{"stats", Engine_stats, METH_NOARGS,
	 "stats() -> dict: engine totals, 'lcores' (per polling lcore) and 'peers' (per peer) lists."},
	{NULL, NULL, 0, NULL},
};

static PyType_Slot Engine_slots[] = {
	{Py_tp_new, Engine_new},
	{Py_tp_init, Engine_init},
	{Py_tp_dealloc, Engine_dealloc},
	{Py_tp_methods, Engine_methods},
	{Py_tp_doc, "Engine(params: dict): one kvxfer engine (see kvxfer.Engine for the typed wrapper)."},
	{0, NULL},
};

static PyType_Spec Engine_spec = {
	.name = "kvxfer._kvxfer.Engine",
	.basicsize = sizeof(EngineObject),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.slots = Engine_slots,
};

static PyMethodDef mod_methods[] = {
	{"geometry", mod_geometry, METH_VARARGS,
	 "geometry(shape, stride, elem_size, block_size, num_kv_heads, head_size, is_mla) -> dict (layout module)."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
	PyModuleDef_HEAD_INIT, "_kvxfer", "kvxfer engine binding (limited API)", -1, mod_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvxfer(void);
PyMODINIT_FUNC PyInit__kvxfer(void)
{
	PyObject *m = PyModule_Create(&moddef);
	if (!m)
		return NULL;
	kvxpy_error = PyErr_NewExceptionWithDoc("kvxfer.KvxError",
					     "Engine error: errno is the (positive) errno, strerror the engine's message.",
					     PyExc_OSError, NULL);
	PyObject *tp = PyType_FromSpec(&Engine_spec);
	if (!kvxpy_error || !tp || PyModule_AddObject(m, "Engine", tp)) {
		Py_XDECREF(tp);
		Py_DECREF(m);
		return NULL;
	}
	Py_INCREF(kvxpy_error);
	if (PyModule_AddObject(m, "KvxError", kvxpy_error) || kvxpy_add_notifier(m) || PyModule_AddIntConstant(m, "ID_MAX", KVX_ENGINE_ID_MAX) ||
	    PyModule_AddIntConstant(m, "MAX_LAYERS", KVX_ENGINE_MAX_LAYERS)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
