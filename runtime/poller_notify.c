/* SPDX-License-Identifier: Apache-2.0 */
/* The polling lcores' outbound notifications (release, remote_blocks, write_done, kvx_failed,
 * status queries, through the poller's own control inbox) and the inbound notifications for
 * the transfer ids a poller owns (handle_notify). Polling lcore that owns the transfer
 * (eng_tid_poller()); split out of poller.c. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "poller_internal.h"

static void send_notify_to(struct poller *po, const char *host, uint16_t port, enum kvx_msg_type t,
			   const char *tid, const uint32_t *blocks, uint32_t n, bool own_epoch);

static uint32_t port_off(const struct kvx_engine *e, uint32_t dp, uint32_t tp, uint32_t tp_size)
{
	uint32_t off = 0;
	kvx_ctl_port_offset(e->p.vllm_port_compat ? KVX_CTL_PORT_VLLM : KVX_CTL_PORT_INJECTIVE, dp, tp, tp_size,
			    &off);
	return off;
}

uint32_t po_peer_tp(const struct kvx_engine *e, const struct peer *pr)
{
	return pr->tp_size ? pr->tp_size : e->p.tp_size;
}

/* Host of the peer's DP rank @p dp: its pod's host, else the peer host (docs/protocol.md §5.8). */
const char *po_peer_host_of(const struct peer *pr, uint32_t dp)
{
	const char *host;
	uint32_t local;
	kvx_ctl_dp_target(dp, pr->dp_size_local, pr->n_pods ? pr->pod_ptr : NULL, pr->n_pods, pr->host, &host,
			  &local);
	return host;
}

/* Notify port of the peer TP rank this worker pairs with (docs/protocol.md §2.4 targets). */
uint16_t po_peer_notify_port(const struct kvx_engine *e, const struct peer *pr, uint32_t rtp)
{
	uint32_t ptp = po_peer_tp(e, pr);
	return (uint16_t)(pr->notify_port + port_off(e, kvx_ctl_fold_local_rank(pr->dp_rank, pr->dp_size_local), rtp, ptp));
}

/* To the peer's own DP rank (its pod host). */
static void send_notify(struct poller *po, const struct peer *pr, uint16_t port, enum kvx_msg_type t,
			const char *tid, const uint32_t *blocks, uint32_t n, bool own_epoch)
{
	send_notify_to(po, po_peer_host_of(pr, pr->dp_rank), port, t, tid, blocks, n, own_epoch);
}

/* Queue @p m for host:port; kvxfer's acks, failure notes and queries name this worker (engine
 * id, TP rank, epoch: extra keys a MoRIIO peer ignores), so a duplicate is recognised. */
void po_send_msg(struct poller *po, const char *host, uint16_t port, struct kvx_msg_notify *m)
{
	struct kvx_engine *e = po->e;
	if (m->type != KVX_MSG_REMOTE_BLOCKS) {
		snprintf(m->sender_id, sizeof(m->sender_id), "%s", e->self_id);
		m->sender_rank = e->p.tp_rank;
		m->sender_epoch = e->self_epoch;
	}
	if (kvx_ctl_send_notify(po->ib, host, port, m))
		atomic_fetch_add_explicit(&e->st_notify_drop, 1, memory_order_relaxed);
}

/* own_epoch (remote_blocks): the receiving P rank writes into this worker, so this engine's epoch
 * names the incarnation it writes to; else the key is left out (P then settles it as for MoRIIO). */
static void send_notify_to(struct poller *po, const char *host, uint16_t port, enum kvx_msg_type t,
			   const char *tid, const uint32_t *blocks, uint32_t n, bool own_epoch)
{
	struct kvx_engine *e = po->e;
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = t;
	strcpy(m.transfer_id, tid);
	if (t == KVX_MSG_RELEASE) {
		m.consumer_tp_size = e->p.tp_size;
		m.has_consumer_tp_size = true;
	} else if (t == KVX_MSG_REMOTE_BLOCKS) {
		m.block_ids = (uint32_t *)blocks;
		m.num_blocks = n;
		m.decode_rank = e->p.dp_rank;
		m.sender_epoch = own_epoch ? kvx_ctl_epoch(e->ctl) : 0; /* names this incarnation (kvxfer peers) */
	}
	po_send_msg(po, host, port, &m);
}

void po_send_to_paired_rank(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid)
{
	struct kvx_engine *e = po->e;
	uint32_t rtp = 0;
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, po_peer_tp(e, pr), &rtp, NULL, 0);
	send_notify(po, pr, po_peer_notify_port(e, pr, rtp), t, tid, NULL, 0, true);
}

/* D WRITE: remote_blocks / release go to every P TP rank, from TP rank 0 only (docs/protocol.md
 * §1.3 step 5b: the scheduler of the D DP rank sends once). */
void po_send_to_all_ranks(struct poller *po, const struct peer *pr, enum kvx_msg_type t, const char *tid,
			      const uint32_t *blocks, uint32_t n)
{
	struct kvx_engine *e = po->e;
	if (e->p.tp_rank != 0)
		return;
	for (uint32_t r = 0; r < po_peer_tp(e, pr); r++) {
		uint32_t dtp = UINT32_MAX; /* the D rank P rank r writes to (§4.5 pairing) */
		kvx_ctl_remote_tp_rank(r, po_peer_tp(e, pr), e->p.tp_size, &dtp, NULL, 0);
		send_notify(po, pr, po_peer_notify_port(e, pr, r), t, tid, blocks, n, dtp == e->p.tp_rank);
	}
}

/* P WRITE: write_done (DONE) or kvx_failed (else) to the D DP rank that sent remote_blocks (its
 * decode rank, else the peer's), its TP rank paired with ours. Also answers a status query or
 * a late allocation from the entry alone (the transfer object may be gone). */
void po_send_outcome(struct poller *po, const struct peer *pr, const struct kvx_xfer *t, const char *tid,
			 enum kvx_cpl_status st, int error, const char *why)
{
	struct kvx_engine *e = po->e;
	int32_t decode_dp = t ? t->decode_dp_rank : -1;
	uint32_t rtp = 0, dtp = po_peer_tp(e, pr);
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, dtp, &rtp, NULL, 0);
	uint32_t dp = decode_dp >= 0 ? (uint32_t)decode_dp : pr->dp_rank;
	uint16_t port = (uint16_t)(pr->notify_port +
				   port_off(e, kvx_ctl_fold_local_rank(dp, pr->dp_size_local), rtp, dtp));
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	m.type = st == KVX_CPL_DONE ? KVX_MSG_WRITE_DONE : KVX_MSG_FAILED;
	if (m.type == KVX_MSG_FAILED) {
		m.fail_status = (uint32_t)st;
		m.fail_error = error <= 0 && error >= -4095 ? error : -EIO;
		snprintf(m.reason, sizeof(m.reason), "%s",
			 why			  ? why
			 : st == KVX_CPL_ABORTED   ? "the producer aborted the transfer"
			 : st == KVX_CPL_TIMED_OUT ? "the producer timed out"
						   : "the producer failed (handshake, connection or write)");
	}
	po_send_msg(po, po_peer_host_of(pr, dp), port, &m);
}

/* P SERVE: kvx_failed for transfer @p tid (status @p st, not DONE) to the READ consumer that
 * asked for it at @p host : @p port (docs/protocol.md §5.10). */
void po_send_serve_note(struct poller *po, const char *host, uint16_t port, const char *tid,
			    enum kvx_cpl_status st, int error, const char *why)
{
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
	m.type = KVX_MSG_FAILED;
	m.fail_status = st == KVX_CPL_DONE ? KVX_CPL_FAILED : (uint32_t)st;
	m.fail_error = error < 0 && error >= -4095 ? error : -EIO;
	snprintf(m.reason, sizeof(m.reason), "%s",
		 why			  ? why
		 : st == KVX_CPL_ABORTED   ? "the producer aborted the served transfer"
		 : st == KVX_CPL_TIMED_OUT ? "the producer's defer timeout passed before the consumer's release"
					   : "the producer's serve failed");
	po_send_msg(po, host, port, &m);
}

/* P SERVE: a READ consumer's status query naming its notify listener (@p m: host in m->ptr,
 * port m->n, m->status 1 if it found the lease revoked). A serve that ended without success
 * is answered at once; a running one (or one not submitted yet: parked on its entry) when it
 * ends (po_apply()); a DONE one never (its consumer released it). Takes m->ptr. */
static void serve_query(struct poller *po, struct emsg *m)
{
	char *host = m->ptr;
	struct kvx_xfer *t = kvx_xfer_find(po->tab, m->tid);
	struct xf *x = t ? t->user : NULL;
	bool ended = t && t->has_out && (!x || x->lf.reported);
	if (ended && t->out_status != KVX_CPL_DONE) {
		po_send_serve_note(po, host, (uint16_t)m->n, m->tid, (enum kvx_cpl_status)t->out_status, t->out_error, NULL);
	} else if (!ended && !t && m->status) {
		/* Revoked, and no record left of it here: the lease says it ended. */
		po_send_serve_note(po, host, (uint16_t)m->n, m->tid, KVX_CPL_FAILED, -ESTALE,
				"the producer no longer serves the transfer (lease revoked, no record left)");
	} else if (!ended && (t || (t = po_tab_get(po, m->tid)) != NULL) && t->state == KVX_XFER_S_LIVE &&
		   strlen(host) < sizeof(t->reply_host)) {
		snprintf(t->reply_host, sizeof(t->reply_host), "%s", host);
		t->reply_port = (uint16_t)m->n;
	} else {
		atomic_fetch_add_explicit(&po->e->st_late, 1, memory_order_relaxed);
	}
	free(host);
}

/* D READ, once, when its lease window shows the producer's grant (@p revoked false) or its
 * revocation (true): ask the producer (a kvxfer engine: READs only run against those) to send
 * kvx_failed here if its serve ends, or ended, without success. The transfer takes an entry
 * in the table so that the note finds it. */
void po_read_ask(struct poller *po, struct xf *x, bool revoked)
{
	struct kvx_engine *e = po->e;
	if (x->lf.queried || !e->self_nt)
		return;
	x->lf.queried = true;
	if (!x->t) {
		struct kvx_xfer *t = po_tab_get(po, x->tid);
		if (t && !t->user) {
			t->user = x;
			x->t = t;
		}
	}
	uint32_t rtp = 0;
	kvx_ctl_remote_tp_rank(e->p.tp_rank, e->p.tp_size, po_peer_tp(e, x->peer), &rtp, NULL, 0);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_STATUS_QUERY;
	strcpy(m.transfer_id, x->tid);
	snprintf(m.notify_host, sizeof(m.notify_host), "%s", e->host);
	m.notify_port = e->self_nt;
	m.lease_revoked = revoked;
	po_send_msg(po, po_peer_host_of(x->peer, x->peer->dp_rank), po_peer_notify_port(e, x->peer, rtp), &m);
}

void po_send_write_done(struct poller *po, struct xf *x)
{
	po_send_outcome(po, x->peer, po_xf_entry(x), x->tid, KVX_CPL_DONE, 0, NULL);
}

/* The peer of a (possibly retired) transfer's entry, unless its slot was given to another peer
 * since (params.peer_idle_ms). */
static const struct peer *entry_peer(const struct kvx_xfer *t)
{
	const struct peer *pr = t ? t->peer_ref : NULL;
	return pr && atomic_load_explicit(&pr->id, memory_order_relaxed) == t->peer_id ? pr : NULL;
}

/* Inbound notification for a transfer id: the one place on a poller where an id is resolved
 * (its table: the live transfer attached to the entry, or a parked entry). */
void po_handle_notify(struct poller *po, struct emsg *m)
{
	struct kvx_engine *e = po->e;
	struct kvx_xfer *t = kvx_xfer_find(po->tab, m->tid);
	struct xf *x = t ? t->user : NULL;
	struct kvx_xfer_ev ev = {.n_blocks = m->n, .block_ids = m->ptr, .decode_dp_rank = m->status,
				 .sender_key = m->key};
	if (x && m->key && x->peer)
		atomic_store_explicit(&x->peer->is_kvx, true, memory_order_relaxed); /* it named itself */
	switch (m->u32) {
	case KVX_MSG_REMOTE_BLOCKS:
		ev.type = KVX_XFER_EV_REMOTE_BLOCKS;
		ev.alloc_epoch = m->u64;
		break;
	case KVX_MSG_RELEASE:
		ev.type = KVX_XFER_EV_RELEASE;
		ev.consumer_tp = (uint32_t)m->u64;
		ev.producer_tp = e->p.tp_size;
		break;
	case KVX_MSG_WRITE_DONE:
	case KVX_MSG_FAILED:
		ev.type = m->u32 == KVX_MSG_FAILED ? KVX_XFER_EV_PEER_FAILED_NOTE : KVX_XFER_EV_WRITE_DONE;
		ev.consumer_tp = x && x->peer ? po_peer_tp(e, x->peer) : e->p.tp_size;
		ev.producer_tp = e->p.tp_size;
		ev.fail_status = m->fst;
		ev.error = m->err;
		ev.now_ns = kvx_now_ns();
		ev.defer_timeout_ns = ms_ns(e->p.defer_timeout_ms);
		break;
	case KVX_MSG_STATUS_QUERY:
		if (m->ptr) {
			serve_query(po, m); /* a READ consumer's: names where to answer */
			return;
		}
		ev.type = KVX_XFER_EV_STATUS_QUERY;
		break;
	default:
		return;
	}
	if (!t && !(x && x->lf.kind == KVX_XFER_K_WRITE) && ev.type != KVX_XFER_EV_STATUS_QUERY)
		t = po_tab_get(po, m->tid); /* before its submission: parked on the entry (faults b) */
	if (ev.type == KVX_XFER_EV_STATUS_QUERY) {
		/* Answered from the entry (kept in the terminal LRU with its outcome and peer); the
		 * live transfer, if any, only says whether its writes are still in flight. */
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, t, x && x->lf.kind == KVX_XFER_K_WRITE ? &x->lf : NULL, &ev, &o);
		if (o.act && entry_peer(t))
			po_send_outcome(po, entry_peer(t), t, m->tid, o.status, o.error, NULL);
		else
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		return;
	}
	if (x) {
		struct kvx_xfer_out o;
		kvx_xfer_step(po->tab, t, &x->lf, &ev, &o);
		if (o.late)
			atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
		po_apply(po, x, &o);
		return;
	}
	struct kvx_xfer_out o;
	kvx_xfer_step(po->tab, t, NULL, &ev, &o);
	if (o.late)
		atomic_fetch_add_explicit(&e->st_late, 1, memory_order_relaxed);
	if (o.act & KVX_XFER_DO_SEND_FAILED && t && entry_peer(t))
		po_send_outcome(po, entry_peer(t), t, m->tid, o.status, o.error,
			     "the allocation arrived after the producer's side had ended"); /* late allocation */
}
