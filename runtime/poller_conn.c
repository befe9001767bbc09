/* SPDX-License-Identifier: Apache-2.0 */
/* The polling lcores' view of peer connections: lookup (RCU), binding a transfer, handshake
 * requests and retries, stale endpoints, and the allocation epoch of a P WRITE. Polling lcore
 * that owns the transfer (eng_tid_poller()); split out of poller.c. */

#include "poller_internal.h"

/* The peer's current connection (RCU lookup; valid until this poller's next quiescent state
 * unless a reference is taken). */
static struct conn *conn_lookup(struct poller *po, const struct peer *pr)
{
	return kvx_rcu_table_lookup_u64(po->e->conns, pr->id);
}

/* Ask the control lcore for a handshake with @p pr (a connection went stale, or a retry is
 * owed); unless one runs (PENDING), in which case its result answers. A request that could not
 * be queued (inbox full), or that the control lcore refused as a duplicate of an epoch check
 * (M_PEER_CHECKED with -EBUSY), leaves the peer's bit in hs_retry: po_xf_conn() and po_rehs_scan()
 * ask again. Nothing else asks, so a cold peer gets the app thread's one handshake. */
static void hs_ask(struct poller *po, struct peer *pr)
{
	uint32_t i = (uint32_t)(pr - po->e->peers); /* slot index */
	uint64_t bit = 1ull << (i % 64);
	po->hs_retry[i / 64] |= bit;
	if (atomic_load_explicit(&pr->hs_state, memory_order_acquire) == HS_PENDING)
		return;
	if (eng_hs_request(po->e, po->ib, pr) == 0)
		po->hs_retry[i / 64] &= ~bit;
}

static bool hs_retry_owed(const struct poller *po, const struct peer *pr)
{
	uint32_t i = (uint32_t)(pr - po->e->peers);
	return po->hs_retry[i / 64] & (1ull << (i % 64));
}

static void conn_bind(struct xf *x, struct conn *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* the table's ref is held */
	x->conn = c;
}

/* Bind x to connection n in place of the one it holds (a reference each). */
static void conn_rebind(struct xf *x, struct conn *n)
{
	eng_conn_put(x->conn);
	conn_bind(x, n);
}

/* 1 if x has a usable connection to post on, 0 to wait (no connection yet, re-handshake in
 * progress, own ops still draining), -1 if the lifecycle ended it here (the caller must not
 * touch it again). The decisions are kvx_xfer_step()'s (PEER_CONNECTED, PEER_FAILED); this
 * function gathers the facts and performs BIND / REPOST. */
int po_xf_conn(struct poller *po, struct xf *x)
{
	struct conn *c = x->conn;
	if (c && !atomic_load_explicit(&c->stale, memory_order_acquire))
		return 1;
	struct conn *n = conn_lookup(po, x->peer);
	int hs = atomic_load_explicit(&x->peer->hs_state, memory_order_acquire);
	if (!n && !c && hs == HS_FAILED) {
		/* No connection and the peer's last handshake failed (the failure can reach this
		 * poller before the submission: M_PEER_FAILED then found no transfer to fail); the
		 * step tells whether it ended after this transfer's submission. */
		int err = atomic_load_explicit(&x->peer->hs_error, memory_order_relaxed);
		struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_FAILED, .unbound = true,
					 .error = err < 0 ? err : -ECONNREFUSED,
					 .hs_ends = atomic_load_explicit(&x->peer->hs_ends, memory_order_acquire)};
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
		if (o.act & KVX_XFER_DO_REPORT) {
			po_apply(po, x, &o);
			return -1;
		}
	}
	bool n_stale = n && atomic_load_explicit(&n->stale, memory_order_acquire);
	if ((!n || n_stale) && hs_retry_owed(po, x->peer))
		hs_ask(po, x->peer); /* a request was refused (-EBUSY) or could not be queued */
	if (!n || n == c || n_stale)
		return 0;
	struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_CONNECTED, .epoch = n->epoch, .bound = c != NULL,
				 .moved = x->bytes != 0};
	struct kvx_xfer_out o;
	kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
	if (o.act & KVX_XFER_DO_BIND) {
		conn_rebind(x, n);
		if (o.act & KVX_XFER_DO_REPOST) {
			memset(x->layer_batches, 0, po->e->n_layers * sizeof(*x->layer_batches));
			x->lease_phase = LP_NONE; /* a new connection: the lease is looked up again */
			x->bytes = 0;             /* the completion counts the bytes of one pass */
		}
		return 1;
	}
	if (!o.act)
		return 0;
	po_apply(po, x, &o); /* FAILED: it ends here */
	return -1;
}

/* How recent a successful completion on the link must be to vouch for the peer's epoch. */
#define KVX_EPOCH_FRESH_NS 20000000ull

/* P WRITE: which incarnation of the consumer made the allocation (remote_blocks)? tcp/shm do
 * not watch idle connections, so a consumer that died and restarted on the same ports is not
 * noticed until an op fails. kvx_xfer_step(PEER_EPOCH) decides from the facts gathered here:
 * the epoch the allocation named (`kvx_epoch` of a kvxfer consumer), or for a MoRIIO consumer
 * the connection's epoch when its link carried a successful op within KVX_EPOCH_FRESH_NS,
 * else the result of a metadata-only handshake (an epoch check on the control lcore). An
 * allocation epoch other than the connection's means the consumer restarted: the connection is
 * marked stale and re-handshaken, and PEER_CONNECTED later refuses to write into a connection
 * of another epoch than the allocation's. Returns true once the allocation epoch is settled. */
bool po_alloc_epoch_settle(struct poller *po, struct xf *x)
{
	struct peer *pr = x->peer;
	if (x->lf.alloc_known)
		return true;
	struct conn *c = conn_lookup(po, pr);
	struct kvx_xfer_ev ev = {.type = KVX_XFER_EV_PEER_EPOCH};
	if (c) {
		ev.has_conn = true;
		ev.conn_stale = atomic_load_explicit(&c->stale, memory_order_acquire);
		ev.conn_epoch = c->epoch;
		ev.link_fresh = kvx_now_ns() - c->link[po->k].last_ok_ns < KVX_EPOCH_FRESH_NS;
	}
	ev.check_started = atomic_load_explicit(&pr->check_started, memory_order_acquire);
	ev.check_done = atomic_load_explicit(&pr->check_done, memory_order_acquire);
	ev.checked_epoch = atomic_load_explicit(&pr->checked_epoch, memory_order_relaxed);
	struct kvx_xfer_out o;
	kvx_xfer_step(po->tab, po_xf_entry(x), &x->lf, &ev, &o);
	if (o.act & KVX_XFER_DO_RESET_PEER)
		po_conn_stale(po, c);
	if (o.act & KVX_XFER_DO_EPOCH_CHECK)
		eng_epoch_check_start(po, pr);
	return x->lf.alloc_known;
}

void po_list_link(struct poller *po, struct conn *c)
{
	struct clink *l = &c->link[po->k];
	if (l->listed)
		return;
	l->listed = true;
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* held by a bound xf */
	l->next = po->plist;
	po->plist = c;
}

/* A connection's endpoint is in error state (transport.h: every op on it fails from now on):
 * no new transfer binds it, and the peer is re-handshaken at once (a new connection with new
 * endpoints; the old one drains and is freed when unreferenced) (docs/protocol.md §6 item 18). */
void po_conn_stale(struct poller *po, struct conn *c)
{
	if (atomic_exchange_explicit(&c->stale, true, memory_order_acq_rel))
		return;
	atomic_fetch_add_explicit(&po->e->st_peer_resets, 1, memory_order_relaxed);
	hs_ask(po, c->pr); /* not queued (inbox full): retried by po_rehs_scan() */
}

/* A stale connection whose re-handshake could not be queued (inbox full): retry. */
void po_rehs_scan(struct poller *po)
{
	for (struct conn *c = po->plist; c; c = c->link[po->k].next)
		if (atomic_load_explicit(&c->stale, memory_order_relaxed) && hs_retry_owed(po, c->pr) &&
		    conn_lookup(po, c->pr) == c)
			hs_ask(po, c->pr);
}
