/* SPDX-License-Identifier: Apache-2.0 */
/* Peers and their connections: handshake orchestration (start, result, epoch checks), the
 * engine's connection blobs (offer / accept / build), the RCU-published `struct conn` entries
 * and their lifetime, and the inbound-notification edge (transfer id -> owning poller).
 * Runs on the control lcore except eng_hs_request() / eng_epoch_check_start() (any thread that
 * owns an inbox: the app thread or a poller) and eng_peer_get() (app thread). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Control-thread callbacks                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------- */
/* Control-thread callbacks                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void cin_push(struct kvx_engine *e, uint32_t k, const struct emsg *m)
{
	if (!kvx_ring_enqueue_elem_burst_sp(e->po[k]->cin, m, 1, NULL)) {
		atomic_fetch_add_explicit(&e->st_notify_drop, 1, memory_order_relaxed);
		if (m->type == M_NOTIFY)
			free(m->ptr);
	}
}

void eng_on_notify(void *arg, const struct kvx_msg_notify *msg)
{
	struct kvx_engine *e = arg;
	bool producer = e->p.role == KVX_SCHED_PRODUCER;
	enum kvx_msg_type t = msg->type;
	/* Role filter (docs/protocol.md §3.2): P takes remote_blocks and release, D takes write_done;
	 * a legacy plain id is a release on P and a write completion on D. */
	if (t == KVX_MSG_COMPLETION)
		t = producer ? KVX_MSG_RELEASE : KVX_MSG_WRITE_DONE;
	/* kvxfer peers add: kvx_failed (P -> D) and kvx_status_query (D -> P). */
	bool ok = producer ? (t == KVX_MSG_REMOTE_BLOCKS || t == KVX_MSG_RELEASE || t == KVX_MSG_STATUS_QUERY)
			   : (t == KVX_MSG_WRITE_DONE || t == KVX_MSG_FAILED);
	if (!ok || strlen(msg->transfer_id) >= KVX_ENGINE_ID_MAX || !msg->transfer_id[0]) {
		atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		return;
	}
	struct emsg m = {.type = M_NOTIFY, .u32 = (uint32_t)t};
	strcpy(m.tid, msg->transfer_id);
	if (t == KVX_MSG_REMOTE_BLOCKS) {
		if (msg->num_blocks == 0 || msg->num_blocks > e->p.max_blocks) {
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
			return;
		}
		uint32_t *ids = malloc(msg->num_blocks * sizeof(*ids)); /* control path */
		if (!ids)
			return;
		memcpy(ids, msg->block_ids, msg->num_blocks * sizeof(*ids));
		m.ptr = ids;
		m.n = msg->num_blocks;
		m.status = (int32_t)(msg->decode_rank < 0 ? 0 : msg->decode_rank);
		m.u64 = msg->sender_epoch; /* the allocating incarnation, 0 from a MoRIIO peer */
	} else {
		m.u64 = msg->consumer_tp_size ? msg->consumer_tp_size : 1;
	}
	if (t == KVX_MSG_STATUS_QUERY && msg->notify_host[0]) {
		/* A READ consumer's query names its notify listener: kvx_failed for the served
		 * transfer goes there (docs/protocol.md §5.10). */
		char *host = strdup(msg->notify_host); /* control path; freed by the poller */
		if (!host)
			return;
		m.ptr = host;
		m.n = msg->notify_port;
		m.status = msg->lease_revoked;
	}
	if (msg->sender_id[0] && msg->sender_rank >= 0)
		m.key = kvx_xfer_sender_key(msg->sender_id, (uint32_t)msg->sender_rank, msg->sender_epoch);
	if (t == KVX_MSG_FAILED) {
		m.fst = msg->fail_status;
		m.err = msg->fail_error;
		kvx_log(KVX_LOG_WARN, "engine: transfer %s: producer %s rank %lld ended it (%s): %s", msg->transfer_id,
			msg->sender_id, (long long)msg->sender_rank, kvx_strerror(msg->fail_error),
			msg->reason[0] ? msg->reason : "no reason given");
	}
	cin_push(e, eng_tid_poller(e, m.tid), &m);
}

static int connect_accept(struct kvx_engine *e, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b,
			  size_t *len_b);

/* Control thread: an initiator's connection request (every control-path transport call of the
 * engine runs on this thread: transport.h allows one thread at a time per context). */
int eng_on_connect(void *arg, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b, size_t *len_b)
{
	return connect_accept(arg, blob_a, len_a, blob_b, len_b);
}

/* Provider codes in the engine's connection blobs (stable wire values). */
static uint8_t xport_code(const char *name)
{
	return !strcmp(name, "tcp") ? 1 : !strcmp(name, "shm") ? 2 : !strcmp(name, "verbs") ? 3 : 0;
}

static const char *xport_code_name(uint8_t code)
{
	return code == 1 ? "tcp" : code == 2 ? "shm" : code == 3 ? "verbs" : "?";
}

/* Index of this engine's context for provider @p code, or -1. */
static int xctx_index(const struct kvx_engine *e, uint8_t code)
{
	for (uint32_t i = 0; i < e->n_xctx; i++)
		if (xport_code(kvx_xport_name(e->xctx[i])) == code)
			return (int)i;
	return -1;
}

/* Connection blobs (kvxfer <-> kvxfer). The initiator offers one endpoint per polling lcore
 * (links) for each candidate provider, in its order of preference:
 *   A = [u8 n_candidates][u8 n_links] n_candidates x ([u8 code] n_links x ([u32 len][xport blob A]))
 * The responder takes the first candidate it has a context for and whose accepts all succeed
 * (shm checks same host and CMA there), so a wrong same-host guess degrades to the next
 * candidate (tcp) instead of failing the handshake:
 *   B = [u8 code][u8 n_links] n_links x ([u32 len][xport blob B]) [u32 n_regions][n x RDESC][u64 num_blocks]
 *       [RDESC lease directory][u32 lease_n] (runtime/lease.c). */
static int connect_accept(struct kvx_engine *e, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b,
			  size_t *len_b)
{
	size_t cap = *len_b;
	if (len_a < 2 || blob_a[0] == 0 || blob_a[0] > 4 || blob_a[1] == 0 || blob_a[1] > KVX_ENGINE_MAX_POLLERS) {
		kvx_log(KVX_LOG_WARN, "engine: connect: blob A has %u transport candidates (1..4) and %u links (1..%d)",
			len_a ? blob_a[0] : 0u, len_a > 1 ? blob_a[1] : 0u, KVX_ENGINE_MAX_POLLERS);
		return -EPROTO;
	}
	uint32_t nc = blob_a[0], nl = blob_a[1];
	size_t need = 2 + (size_t)nl * (4 + KVX_XPORT_BLOB_MAX) + 4 + (size_t)e->n_layers * KVX_XPORT_RDESC_BYTES + 8 +
		      KVX_XPORT_RDESC_BYTES + 4;
	if (cap < need)
		return -EMSGSIZE;
	if (e->n_accepted + nl > e->cap_accepted) {
		uint32_t ncap = e->cap_accepted ? 2 * e->cap_accepted : 16;
		while (ncap < e->n_accepted + nl)
			ncap *= 2;
		struct kvx_xport_ep **na = realloc(e->accepted, ncap * sizeof(*na));
		if (!na)
			return -ENOMEM;
		e->accepted = na;
		e->cap_accepted = ncap;
	}
	struct kvx_xport_ep *eps[KVX_ENGINE_MAX_POLLERS] = {0};
	size_t pos = 2, out = 2;
	int rc = -EPROTO, xi = -1;
	bool ok = false;
	char offered[64] = "";
	for (uint32_t c = 0; c < nc && !ok; c++) {
		if (len_a < pos + 1)
			return -EPROTO;
		uint8_t code = blob_a[pos++];
		size_t ol = strlen(offered);
		snprintf(offered + ol, sizeof(offered) - ol, "%s%s", ol ? "," : "", xport_code_name(code));
		xi = xctx_index(e, code);
		out = 2;
		uint32_t got = 0;
		for (uint32_t l = 0; l < nl; l++) {
			uint32_t cl;
			if (len_a < pos + 4)
				return -EPROTO;
			memcpy(&cl, blob_a + pos, 4);
			pos += 4;
			if (cl > len_a - pos)
				return -EPROTO;
			if (xi >= 0 && got == l) {
				size_t xl = 0;
				rc = kvx_xport_ep_accept(e->xctx[xi], blob_a + pos, cl, &eps[l], blob_b + out + 4,
							 KVX_XPORT_BLOB_MAX, &xl);
				if (rc == 0) {
					/* Target side: the group of the initiator's link (verbs responder QPs
					 * raise no completions here, so a refusal only costs locality). */
					(void)kvx_xport_ep_set_group(eps[l], l % e->n_po);
					uint32_t x32 = (uint32_t)xl;
					memcpy(blob_b + out, &x32, 4);
					out += 4 + xl;
					got++;
				}
			}
			pos += cl;
		}
		if (xi >= 0 && got == nl) {
			ok = true;
		} else {
			for (uint32_t l = 0; l < got; l++) {
				kvx_xport_ep_destroy(eps[l]);
				eps[l] = NULL;
			}
			if (xi >= 0 && c + 1 < nc)
				kvx_log(KVX_LOG_INFO, "engine: connect: %s not usable with this peer (%s), trying the next",
					xport_code_name(code), kvx_strerror(rc));
		}
	}
	if (!ok) {
		if (rc == -EPROTO)
			kvx_log(KVX_LOG_ERROR, "engine: connect: peer offers transport %s, this engine uses %s",
				offered, e->transport);
		return rc;
	}
	for (uint32_t l = 0; l < nl; l++)
		e->accepted[e->n_accepted++] = eps[l];
	blob_b[0] = xport_code(kvx_xport_name(e->xctx[xi]));
	blob_b[1] = (uint8_t)nl;
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[xi]));
	uint32_t nreg = e->n_layers;
	memcpy(blob_b + out, &nreg, 4);
	out += 4;
	for (uint32_t i = 0; i < nreg; i++) {
		rc = kvx_xport_mr_export(e->layers[i].mr[xi], blob_b + out, KVX_XPORT_RDESC_BYTES, NULL);
		if (rc)
			return rc;
		out += KVX_XPORT_RDESC_BYTES;
	}
	uint64_t nb = e->layers[0].geom.num_blocks;
	memcpy(blob_b + out, &nb, 8);
	out += 8;
	rc = kvx_xport_mr_export(e->lease_mr[xi], blob_b + out, KVX_XPORT_RDESC_BYTES, NULL);
	if (rc)
		return rc;
	out += KVX_XPORT_RDESC_BYTES;
	memcpy(blob_b + out, &e->lease_n, 4);
	*len_b = out + 4;
	return 0;
}

void eng_hs_eps_destroy(struct peer *pr)
{
	for (uint32_t l = 0; l < KVX_ENGINE_MAX_POLLERS; l++) {
		for (uint32_t c = 0; c < 2; c++) {
			kvx_xport_ep_destroy(pr->hs_ep[l][c]);
			pr->hs_ep[l][c] = NULL;
		}
	}
}

static int make_blob(void *arg, uint32_t dp_rank, const struct kvx_msg_meta *remote, uint8_t *blob_a, size_t cap,
		     size_t *len_a)
{
	(void)dp_rank;
	(void)remote;
	struct peer *pr = arg;
	/* New endpoints for a new connection: the published one (if any) stays untouched until
	 * it is replaced and unreferenced. */
	struct kvx_engine *e = pr->e;
	eng_hs_eps_destroy(pr);
	size_t pos = 2;
	int rc = 0;
	/* Candidates: shm first when this engine has it (auto), then the primary provider. */
	for (uint32_t k = 0; k < e->n_xctx && !rc; k++) {
		uint32_t xi = e->n_xctx - 1 - k;
		if (cap < pos + 1) {
			rc = -EMSGSIZE;
			break;
		}
		blob_a[pos++] = xport_code(kvx_xport_name(e->xctx[xi]));
		for (uint32_t l = 0; l < e->n_po && !rc; l++) {
			size_t xl = 0;
			if (cap < pos + 4) {
				rc = -EMSGSIZE;
				break;
			}
			/* Link l is driven by polling lcore l: its poll group (one CQ per group on verbs). */
			rc = kvx_xport_ep_create_in_group(e->xctx[xi], l, &pr->hs_ep[l][xi], blob_a + pos + 4,
							  cap - pos - 4, &xl);
			if (rc)
				break;
			uint32_t x32 = (uint32_t)xl;
			memcpy(blob_a + pos, &x32, 4);
			pos += 4 + xl;
		}
	}
	if (rc) {
		eng_hs_eps_destroy(pr);
	} else {
		blob_a[0] = (uint8_t)e->n_xctx;
		blob_a[1] = (uint8_t)e->n_po;
		*len_a = pos;
	}
	return rc;
}

/* Destroy a connection's endpoints and imported regions: the control thread, or the app thread
 * once the control lcore is stopped. */
void eng_conn_destroy(struct conn *c)
{
	atomic_fetch_sub_explicit(&c->pr->n_conns, 1, memory_order_release); /* see struct peer */
	for (uint32_t l = 0; l < c->n_links; l++) {
		kvx_xport_ep_destroy(c->link[l].ep); /* frees its imported regions too */
		free(c->link[l].rmr);
	}
	free(c->geom);
	free(c);
}

static void ctl_kick(struct kvx_engine *e)
{
	uint64_t one = 1;
	ssize_t w = write(e->ctl_efd, &one, sizeof(one));
	(void)w; /* EAGAIN: the counter is saturated, a wake-up is pending anyway */
}

/* The last reference pushes the connection on the dead stack (lock-free, never full) and wakes
 * the control lcore, which destroys it (eng_on_ctl_work()). Pollers never block here. */
void eng_conn_put(struct conn *c)
{
	if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
		return;
	struct kvx_engine *e = c->e;
	struct conn *head = atomic_load_explicit(&e->dead, memory_order_relaxed);
	do
		c->next_dead = head;
	while (!atomic_compare_exchange_weak_explicit(&e->dead, &head, c, memory_order_release,
						       memory_order_relaxed));
	ctl_kick(e);
}

uint64_t eng_fence_request(struct kvx_engine *e)
{
	uint64_t t = atomic_fetch_add_explicit(&e->fence_req, 1, memory_order_acq_rel) + 1;
	ctl_kick(e);
	return t;
}

static void reap_dead(struct kvx_engine *e)
{
	struct conn *c = atomic_exchange_explicit(&e->dead, NULL, memory_order_acquire);
	while (c) {
		struct conn *next = c->next_dead;
		eng_conn_destroy(c);
		c = next;
	}
}

void eng_on_ctl_work(void *arg)
{
	struct kvx_engine *e = arg;
	uint64_t v;
	ssize_t r = read(e->ctl_efd, &v, sizeof(v)); /* clear the doorbell before looking */
	(void)r;
	reap_dead(e);
	uint64_t req = atomic_load_explicit(&e->fence_req, memory_order_acquire);
	if (req != atomic_load_explicit(&e->fence_cut, memory_order_relaxed)) {
		/* P READ defer timeout, D WRITE quarantine expired: cut every reader and writer at
		 * the wire (see poller.c fences). */
		for (uint32_t i = 0; i < e->n_accepted; i++)
			kvx_xport_ep_destroy(e->accepted[i]);
		e->n_accepted = 0;
		atomic_fetch_add_explicit(&e->st_fences, 1, memory_order_relaxed);
		atomic_store_explicit(&e->fence_cut, req, memory_order_release);
		/* Pollers 0..n_prog-1 confirm the cut after their next progress calls
		 * (kvx_fence_note()) and close the destroyed endpoints' sockets there; they may be
		 * asleep. */
		for (uint32_t k = 0; k < e->n_prog; k++)
			kvx_lcore_wake(e->po[k]->lc);
	}
}

void eng_conn_reap_stopped(struct kvx_engine *e)
{
	reap_dead(e);
}

void eng_conn_put_stopped(struct conn *c)
{
	if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
		eng_conn_destroy(c);
}

/* RCU table free_fn: runs after a grace period for a replaced or deleted connection. */
void eng_conn_table_free(void *value, void *ctx)
{
	(void)ctx;
	eng_conn_put(value);
}

/* The peer's advertised regions (metadata (a) + region map (b), docs/protocol.md §3.1, §4.1) must be
 * what the §4.3 offsets assume for every local layer: split layers with the V plane exactly
 * es*remote_kv_stride above K, every plannable block inside the peer's memory region. */
static int check_peer_regions(struct kvx_engine *e, const struct peer *pr, const struct kvx_ctl_hs_rank *r,
			      uint64_t nb)
{
	if (!r->meta || !r->layers)
		return -EPROTO;
	struct kvx_layout_peer_layer *pl = calloc(e->n_layers, sizeof(*pl));
	uint32_t *per = calloc(e->n_layers, sizeof(*per));
	if (!pl || !per) {
		free(pl);
		free(per);
		return -ENOMEM;
	}
	char why[256] = "";
	for (uint32_t i = 0; i < e->n_layers; i++)
		per[i] = e->layers[i].geom.kind == KVX_LAYOUT_KIND_SPLIT ? 2 : 1;
	int n = kvx_layout_peer_regions(r->meta, r->layers, per, e->n_layers, pl, why, sizeof(why));
	int rc = n < 0 ? n : 0;
	for (uint32_t i = 0; !rc && i < e->n_layers; i++) {
		struct kvx_layout_geom g = e->layers[i].geom;
		kvx_layout_set_remote_blocks(&g, nb);
		rc = kvx_layout_check_peer_layer(&g, &pl[i], why, sizeof(why));
	}
	free(pl);
	free(per);
	if (rc)
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u advertises regions that do not match this engine's layers: %s",
			pr->host, pr->hs_port, why);
	return rc;
}

static int conn_build(struct peer *pr, const struct kvx_ctl_hs_rank *r, uint64_t epoch, struct conn **out)
{
	struct kvx_engine *e = pr->e;
	const uint8_t *b = r->blob_b;
	size_t len = r->blob_b_len, off;
	uint32_t nreg;
	uint64_t nb;
	if (!b || len < 2)
		return -EPROTO;
	int xi = xctx_index(e, b[0]);
	if (xi < 0 || !pr->hs_ep[0][xi]) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u chose transport %s, which this engine did not offer",
			pr->host, pr->hs_port, xport_code_name(b[0]));
		return -EPROTO;
	}
	if (b[1] != e->n_po) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u answered %u links, %u offered", pr->host, pr->hs_port, b[1],
			e->n_po);
		return -EPROTO;
	}
	/* Walk the links' blobs first (bounds), then the regions. */
	size_t xoff[KVX_ENGINE_MAX_POLLERS], xlen[KVX_ENGINE_MAX_POLLERS];
	off = 2;
	for (uint32_t l = 0; l < e->n_po; l++) {
		uint32_t xl;
		if (len < off + 4)
			return -EPROTO;
		memcpy(&xl, b + off, 4);
		if (xl > KVX_XPORT_BLOB_MAX || len < off + 4 + xl)
			return -EPROTO;
		xoff[l] = off + 4;
		xlen[l] = xl;
		off += 4 + xl;
	}
	if (len < off + 4)
		return -EPROTO;
	memcpy(&nreg, b + off, 4);
	off += 4;
	if (nreg != e->n_layers) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u has %u layers, this engine %u", pr->host, pr->hs_port, nreg,
			e->n_layers);
		return -EPROTO;
	}
	if (len != off + (size_t)nreg * KVX_XPORT_RDESC_BYTES + 8 + KVX_XPORT_RDESC_BYTES + 4)
		return -EPROTO; /* the lease directory is part of a kvxfer blob B (runtime/lease.c) */
	uint32_t lease_n;
	memcpy(&lease_n, b + off + (size_t)nreg * KVX_XPORT_RDESC_BYTES + 8 + KVX_XPORT_RDESC_BYTES, 4);
	if (lease_n == 0 || (lease_n & (lease_n - 1)))
		return -EPROTO;
	memcpy(&nb, b + off + (size_t)nreg * KVX_XPORT_RDESC_BYTES, 8);
	if (nb == 0)
		return -EPROTO;
	int vrc = check_peer_regions(e, pr, r, nb);
	if (vrc)
		return vrc;
	struct conn *c = calloc(1, sizeof(*c) + e->n_po * sizeof(struct clink));
	if (!c)
		return -ENOMEM;
	c->e = e;
	c->pr = pr;
	atomic_fetch_add_explicit(&pr->n_conns, 1, memory_order_relaxed);
	c->epoch = epoch;
	c->xi = (uint32_t)xi;
	c->n_links = e->n_po;
	c->remote_num_blocks = nb;
	c->lease_n = lease_n;
	atomic_init(&c->refs, 1);
	c->geom = calloc(e->n_layers, sizeof(*c->geom));
	int rc = c->geom ? 0 : -ENOMEM;
	for (uint32_t l = 0; l < e->n_po; l++) {
		/* The connection owns the chosen endpoints from here on. */
		c->link[l].ep = pr->hs_ep[l][xi];
		pr->hs_ep[l][xi] = NULL;
	}
	eng_hs_eps_destroy(pr); /* the candidate the responder did not take */
	for (uint32_t l = 0; !rc && l < e->n_po; l++) {
		c->link[l].rmr = calloc(nreg, sizeof(*c->link[l].rmr));
		rc = c->link[l].rmr ? kvx_xport_ep_connect(c->link[l].ep, b + xoff[l], xlen[l]) : -ENOMEM;
		for (uint32_t i = 0; !rc && i < nreg; i++)
			rc = kvx_xport_rmr_import(c->link[l].ep, b + off + (size_t)i * KVX_XPORT_RDESC_BYTES,
						  KVX_XPORT_RDESC_BYTES, &c->link[l].rmr[i]);
		if (!rc)
			rc = kvx_xport_rmr_import(c->link[l].ep, b + off + (size_t)nreg * KVX_XPORT_RDESC_BYTES + 8,
						  KVX_XPORT_RDESC_BYTES, &c->link[l].lease_rmr);
	}
	if (rc) {
		eng_conn_destroy(c);
		return rc;
	}
	atomic_store(&e->last_xport, kvx_xport_name(e->xctx[xi]));
	for (uint32_t i = 0; i < nreg; i++) {
		c->geom[i] = e->layers[i].geom;
		kvx_layout_set_remote_blocks(&c->geom[i], nb);
	}
	*out = c;
	return 0;
}

/* Control thread: the context's device async-event fd is readable (a control-path transport
 * call, on the thread of all of them); endpoints it moves to error state are then met by their
 * pollers (completion errors -> stale connection -> re-handshake). */
void eng_on_xport_events(void *arg)
{
	struct evwatch *w = arg;
	int n = kvx_xport_ctx_handle_events(w->e->xctx[w->k]);
	if (n < 0)
		kvx_log(KVX_LOG_WARN, "engine: %s async events: %s", kvx_xport_name(w->e->xctx[w->k]), kvx_strerror(n));
}

/* Heterogeneous TP (docs/protocol.md §4.2/§4.5): whole blocks move between different TP sizes only
 * when every rank holds whole KV heads; a peer that fails is rejected (its transfers fail with
 * the returned errno, the message names the values). MLA layers and unknown head counts
 * (spec.num_kv_heads 0) pass. */
static int hetero_tp_guard(struct peer *pr)
{
	struct kvx_engine *e = pr->e;
	uint32_t ptp = pr->tp_size ? pr->tp_size : e->p.tp_size;
	const struct kvx_layout_spec *sp = &e->layers[0].spec;
	if (sp->is_mla || sp->num_kv_heads == 0 || ptp == e->p.tp_size)
		return 0;
	char msg[200] = "";
	/* num_kv_heads is per rank: with replicated heads (tp_size > heads) it is 1 and the product
	 * overcounts, so the application's total_kv_heads wins when given. */
	uint32_t total = e->p.total_kv_heads ? e->p.total_kv_heads : sp->num_kv_heads * e->p.tp_size;
	int rc = kvx_layout_check_hetero_tp(e->p.tp_size, ptp, total, false, msg, sizeof(msg));
	if (rc)
		kvx_log(KVX_LOG_ERROR, "engine: peer %s:%u dp %u rejected: %s", pr->host, pr->hs_port, pr->dp_rank, msg);
	return rc;
}

/* Control thread: the metadata-only epoch check of alloc_epoch_settle() finished. */
static void on_epoch_checked(void *arg, const struct kvx_ctl_hs_result *res)
{
	struct peer *pr = arg;
	struct kvx_engine *e = pr->e;
	if (res->status == -EBUSY) {
		/* A handshake with the same host:port runs: the waiting transfers retry. */
		atomic_store_explicit(&pr->check_busy, false, memory_order_release);
		return;
	}
	uint64_t epoch = res->status == 0 && res->num_ranks == 1 && res->ranks[0].meta ? res->ranks[0].meta->epoch : 0;
	if (!epoch)
		kvx_log(KVX_LOG_WARN, "engine: epoch check of %s:%u dp %u failed: %s", pr->host, pr->hs_port, pr->dp_rank,
			res->error[0] ? res->error : kvx_strerror(res->status));
	atomic_store_explicit(&pr->checked_epoch, epoch, memory_order_relaxed);
	atomic_store_explicit(&pr->check_done, res->cookie, memory_order_release);
	atomic_store_explicit(&pr->check_busy, false, memory_order_release);
	struct emsg m = {.type = M_PEER_CHECKED, .ptr = pr};
	for (uint32_t k = 0; k < e->n_po; k++)
		cin_push(e, k, &m);
}

/* Control thread: a handshake job for the peer was accepted (kvx_ctl_handshake_start(): not a
 * duplicate of a job with the same host:port). The control thread is the one writer of
 * hs_state; requesters read it to avoid asking again while a job runs. */
static void on_hs_accept(void *arg)
{
	struct peer *pr = arg;
	atomic_store_explicit(&pr->hs_state, HS_PENDING, memory_order_release);
}

static void hs_done(struct peer *pr, const struct kvx_ctl_hs_result *res);

/* Control thread: a handshake request's one answer; after it nothing of this thread touches
 * the peer for that request (its slot may be reused once hs_inflight is 0). */
static void on_hs_done(void *arg, const struct kvx_ctl_hs_result *res)
{
	struct peer *pr = arg;
	hs_done(pr, res);
	atomic_fetch_sub_explicit(&pr->hs_inflight, 1, memory_order_release);
}

static void hs_done(struct peer *pr, const struct kvx_ctl_hs_result *res)
{
	struct kvx_engine *e = pr->e;
	int rc = res->status;
	if (rc == -EBUSY) {
		/* A duplicate request. While a handshake of ours runs (PENDING) its own result
		 * answers every requester. Otherwise the busy job is an epoch check dialling the
		 * same host:port: not a failure; the pollers ask again (xf_conn(), rehs_scan()). */
		if (atomic_load_explicit(&pr->hs_state, memory_order_relaxed) == HS_PENDING)
			return;
		struct emsg m = {.type = M_PEER_CHECKED, .status = -EBUSY, .ptr = pr};
		for (uint32_t k = 0; k < e->n_po; k++)
			cin_push(e, k, &m);
		return;
	}
	uint64_t epoch = rc == 0 && res->num_ranks == 1 && res->ranks[0].meta ? res->ranks[0].meta->epoch : 0;
	struct conn *c = NULL;
	if (res->num_ranks == 1 && res->ranks[0].meta) {
		bool kvx = res->ranks[0].meta->has_kvx;
		atomic_store_explicit(kvx ? &pr->is_kvx : &pr->is_moriio, true, memory_order_relaxed);
		if (!kvx) {
			/* A stock MoRIIO/MoRI worker: the handshake stopped after its two replies
			 * (it was never sent kvx_connect); no data moves between us. */
			rc = -EPROTONOSUPPORT;
			kvx_log(KVX_LOG_ERROR,
				"engine: peer %s:%u dp %u is a MoRIIO/MoRI worker (no kvx_ keys in its metadata): kvxfer "
				"interoperates with MoRIIO on the control plane only and moves data only between "
				"kvxfer engines",
				pr->host, pr->hs_port, pr->dp_rank);
		}
	}
	if (rc == 0)
		rc = hetero_tp_guard(pr);
	if (rc == 0 && res->num_ranks == 1)
		rc = conn_build(pr, &res->ranks[0], epoch, &c);
	else if (rc == 0)
		rc = -EPROTO;
	if (rc == 0) {
		if (pr->epoch && epoch != pr->epoch)
			kvx_log(KVX_LOG_INFO, "engine: peer %s:%u dp %u restarted (epoch %llu -> %llu)", pr->host,
				pr->hs_port, pr->dp_rank, (unsigned long long)pr->epoch, (unsigned long long)epoch);
		pr->epoch = epoch;
		c->gen = ++pr->gen;
		/* Publish (replacing a previous connection: it is freed after a grace period and
		 * its last reference). The control thread is an RCU updater only for this call. */
		kvx_rcu_register();
		int pr_rc = kvx_rcu_table_replace_u64(e->conns, pr->id, c);
		kvx_rcu_unregister();
		if (pr_rc < 0) {
			eng_conn_destroy(c);
			rc = pr_rc;
		}
	} else {
		eng_hs_eps_destroy(pr);
	}
	if (rc)
		kvx_log(KVX_LOG_WARN, "engine: handshake with %s:%u dp %u failed: %s%s%s", pr->host, pr->hs_port,
			pr->dp_rank, kvx_strerror(rc), res->error[0] ? ": " : "", res->error);
	uint64_t ends = atomic_load_explicit(&pr->hs_ends, memory_order_relaxed) + 1;
	atomic_store_explicit(&pr->hs_error, rc, memory_order_relaxed);
	atomic_store_explicit(&pr->hs_ends, ends, memory_order_relaxed);
	atomic_store_explicit(&pr->hs_state, rc ? HS_FAILED : HS_READY, memory_order_release);
	struct emsg m = {.type = rc ? M_PEER_FAILED : M_PEER_READY, .status = rc, .ptr = pr, .u64 = ends};
	for (uint32_t k = 0; k < e->n_po; k++)
		cin_push(e, k, &m);
}

/* The handshake job for @p pr's DP rank (the peer's TP rank paired with ours, its pod hosts);
 * *rank must outlive the kvx_ctl_handshake_start() call. Handshakes and epoch checks share it. */
static int hs_params(const struct kvx_engine *e, struct peer *pr, uint32_t *rank, struct kvx_ctl_hs_params *hp)
{
	uint32_t rtp = 0, ptp = pr->tp_size ? pr->tp_size : e->p.tp_size;
	int rc = kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, ptp, &rtp, NULL, 0);
	if (rc)
		return rc;
	*rank = pr->dp_rank;
	*hp = (struct kvx_ctl_hs_params){
		.host = pr->host,
		.handshake_base_port = pr->hs_port,
		.dp_size = pr->dp_rank + 1,
		.dp_size_local = pr->dp_size_local,
		.remote_hosts = pr->n_pods ? pr->pod_ptr : NULL,
		.num_remote_hosts = pr->n_pods,
		.tp_rank = rtp,
		.tp_size = ptp,
		.port_mode = e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE,
		.ranks = rank,
		.num_ranks = 1,
		.timeout_ms = e->p.handshake_timeout_ms,
		.arg = pr,
	};
	return 0;
}

/* Ask the control lcore for a handshake with @p pr through the calling thread's inbox @p ib
 * (its ring to the control lcore). The requester writes no peer state: the control thread
 * accepts the job (on_hs_accept(): PENDING) or answers a duplicate of a running one with
 * that job's result, and stores the outcome (on_hs_done()). */
int eng_hs_request(struct kvx_engine *e, struct kvx_ctl_inbox *ib, struct peer *pr)
{
	uint32_t rank;
	struct kvx_ctl_hs_params hp;
	int rc = hs_params(e, pr, &rank, &hp);
	if (rc)
		return rc;
	hp.make_blob = make_blob;
	hp.on_accept = on_hs_accept;
	hp.on_done = on_hs_done;
	atomic_fetch_add_explicit(&pr->hs_inflight, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&pr->evicting, memory_order_seq_cst)) {
		atomic_fetch_sub_explicit(&pr->hs_inflight, 1, memory_order_release);
		return -ENOENT; /* being forgotten (peer_slot()) */
	}
	rc = kvx_ctl_handshake_start(ib, &hp);
	if (rc)
		atomic_fetch_sub_explicit(&pr->hs_inflight, 1, memory_order_release);
	return rc;
}

/* Start the peer's epoch check unless one runs or a handshake runs (both dial host:port). */
void eng_epoch_check_start(struct poller *po, struct peer *pr)
{
	bool idle = false;
	if (atomic_load_explicit(&pr->hs_state, memory_order_acquire) == HS_READY &&
	    atomic_compare_exchange_strong_explicit(&pr->check_busy, &idle, true, memory_order_acq_rel,
						    memory_order_acquire)) {
		uint32_t rank;
		struct kvx_ctl_hs_params hp;
		if (hs_params(po->e, pr, &rank, &hp)) { /* validated when the peer was created */
			atomic_store_explicit(&pr->check_busy, false, memory_order_release);
			return;
		}
		hp.on_done = on_epoch_checked;
		hp.cookie = atomic_load_explicit(&pr->check_started, memory_order_relaxed) + 1;
		/* Numbered before it can start: a transfer asking later needs a later job. */
		atomic_store_explicit(&pr->check_started, hp.cookie, memory_order_release);
		if (kvx_ctl_handshake_start(po->ib, &hp))
			atomic_store_explicit(&pr->check_busy, false, memory_order_release); /* retried */
	}
}

/* App thread: a fresh slot with a new id (the connection table keys on it). */
static struct peer *peer_reset(struct kvx_engine *e, struct peer *pr, uint64_t id)
{
	memset(pr, 0, sizeof(*pr)); /* nothing refers to the slot any more (peer_slot()) */
	pr->e = e;
	atomic_store_explicit(&pr->id, id, memory_order_relaxed);
	return pr;
}

/* App thread: a slot for a new peer identity. A never-used slot; else one whose peer was
 * forgotten earlier and whose last connection is destroyed (no pointer to the slot is left:
 * the connection was taken out of the RCU table, a grace period passed, its last reference
 * was dropped); else forget the peer idle longest, if for more than params.peer_idle_ms with
 * no live transfer and no handshake or epoch check running: its connection leaves the table
 * now, and the slot is reused here once that connection is gone (at once if it had none).
 * NULL: nothing evictable yet (the caller's -ENOBUFS is retryable). */
static struct peer *peer_slot(struct kvx_engine *e)
{
	if (e->n_peers < KVX_ENGINE_MAX_PEERS) {
		struct peer *pr = &e->peers[e->n_peers];
		e->n_peers++;
		return peer_reset(e, pr, e->n_peers);
	}
	if (e->next_peer_id <= KVX_ENGINE_MAX_PEERS)
		e->next_peer_id = KVX_ENGINE_MAX_PEERS + 1;
	for (uint32_t i = 0; i < e->n_peers; i++) {
		struct peer *q = &e->peers[i];
		if (q->evicted && atomic_load_explicit(&q->n_conns, memory_order_acquire) == 0)
			return peer_reset(e, q, e->next_peer_id++);
	}
	uint64_t now = kvx_now_ns(), limit = ms_ns(e->p.peer_idle_ms);
	struct peer *old = NULL;
	for (uint32_t i = 0; i < e->n_peers; i++) {
		struct peer *q = &e->peers[i];
		if (q->evicted || q->n_live || (e->p.peer_idle_ms && now - q->idle_since <= limit) ||
		    atomic_load_explicit(&q->check_busy, memory_order_acquire))
			continue;
		if (!old || q->idle_since < old->idle_since)
			old = q;
	}
	if (!old)
		return NULL;
	/* No thread asks for a handshake with it from here on (eng_hs_request() backs off), and
	 * none is queued or running (hs_inflight; PENDING is covered by it). */
	atomic_store_explicit(&old->evicting, true, memory_order_seq_cst);
	if (atomic_load_explicit(&old->hs_inflight, memory_order_seq_cst) ||
	    atomic_load_explicit(&old->hs_state, memory_order_acquire) == HS_PENDING) {
		atomic_store_explicit(&old->evicting, false, memory_order_relaxed);
		return NULL;
	}
	old->evicted = true;
	kvx_log(KVX_LOG_INFO, "engine: forgetting idle peer %s:%u dp %u (slot needed)", old->host, old->hs_port,
		old->dp_rank);
	kvx_rcu_register();
	int drc = kvx_rcu_table_del_u64(e->conns, atomic_load_explicit(&old->id, memory_order_relaxed));
	kvx_rcu_unregister();
	(void)drc; /* -ENOENT: it never had a connection */
	if (atomic_load_explicit(&old->n_conns, memory_order_acquire) == 0)
		return peer_reset(e, old, e->next_peer_id++);
	return NULL;
}

struct peer *eng_peer_get(struct kvx_engine *e, const struct kvx_engine_peer *pp, bool handshake, int *rc)
{
	*rc = 0;
	if (!pp->host || !*pp->host || strlen(pp->host) >= KVX_ENGINE_HOST_MAX || !pp->notify_port) {
		*rc = -EINVAL;
		return NULL;
	}
	if (pp->num_remote_hosts > KVX_ENGINE_MAX_PODS || (pp->num_remote_hosts && !pp->remote_hosts)) {
		kvx_log(KVX_LOG_ERROR, "engine: peer %s: num_remote_hosts %u (0..%d, remote_hosts not NULL)", pp->host,
			pp->num_remote_hosts, KVX_ENGINE_MAX_PODS);
		*rc = -EINVAL;
		return NULL;
	}
	for (uint32_t k = 0; k < pp->num_remote_hosts; k++) {
		const char *h = pp->remote_hosts[k];
		if (!h || !*h || strlen(h) >= KVX_ENGINE_HOST_MAX) {
			kvx_log(KVX_LOG_ERROR, "engine: peer %s: remote_hosts[%u] empty, NULL or longer than %d bytes",
				pp->host, k, KVX_ENGINE_HOST_MAX - 1);
			*rc = -EINVAL;
			return NULL;
		}
	}
	struct peer *pr = NULL;
	for (uint32_t i = 0; i < e->n_peers && !pr; i++) {
		struct peer *q = &e->peers[i];
		if (q->evicted || strcmp(q->host, pp->host) || q->hs_port != pp->handshake_port || q->notify_port != pp->notify_port ||
		    q->dp_rank != pp->dp_rank || q->dp_size_local != pp->dp_size_local || q->tp_size != pp->tp_size ||
		    q->n_pods != pp->num_remote_hosts)
			continue;
		bool same = true;
		for (uint32_t k = 0; k < q->n_pods && same; k++)
			same = !strcmp(q->pod_host[k], pp->remote_hosts[k]);
		if (same)
			pr = q;
	}
	if (!pr) {
		pr = peer_slot(e);
		if (!pr) {
			uint64_t supp = 0;
			if (kvx_ratelimit_ok(&e->rl_nobufs, &supp))
				kvx_log(KVX_LOG_ERROR,
					"engine: %d peers known, none idle for params.peer_idle_ms (%u ms) or done "
					"draining: peer %s:%u refused with -ENOBUFS, retry later (%llu more refusals "
					"not logged)",
					KVX_ENGINE_MAX_PEERS, e->p.peer_idle_ms, pp->host, pp->handshake_port,
					(unsigned long long)supp);
			*rc = -ENOBUFS;
			return NULL;
		}
		strcpy(pr->host, pp->host);
		pr->hs_port = pp->handshake_port;
		pr->notify_port = pp->notify_port;
		pr->dp_rank = pp->dp_rank;
		pr->dp_size_local = pp->dp_size_local;
		pr->tp_size = pp->tp_size;
		pr->n_pods = pp->num_remote_hosts;
		pr->app_asked = UINT64_MAX; /* never asked */
		for (uint32_t k = 0; k < pr->n_pods; k++) {
			strcpy(pr->pod_host[k], pp->remote_hosts[k]);
			pr->pod_ptr[k] = pr->pod_host[k];
		}
		/* Published to the pollers by the ring enqueue of the first submission naming it. */
	}
	/* Ask once per handshake outcome: hs_ends moves when a job ends, so a request still
	 * on its way to the control lcore is not repeated by the next submission. */
	int st = atomic_load_explicit(&pr->hs_state, memory_order_acquire);
	uint64_t ends = atomic_load_explicit(&pr->hs_ends, memory_order_acquire);
	/* A stock MoRIIO worker is not asked again: its transfers fail with the stored error. */
	if (handshake &&
	    (st == HS_IDLE || (st == HS_FAILED && !atomic_load_explicit(&pr->is_moriio, memory_order_relaxed))) &&
	    pr->app_asked != ends) {
		*rc = eng_hs_request(e, e->app_ib, pr);
		if (*rc)
			return NULL;
		pr->app_asked = ends;
	}
	return pr;
}
