/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Notifications: the send path (a cached DEALER per peer path, pinned by live transfers; terminal
 * ids) and the notify ROUTER's receive path. docs/protocol.md §3.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "ctl_impl.h"

/* ---------------------------------------------------------------------------------------- */
/* Notify send path: cached DEALER per peer path                                             */
/* ---------------------------------------------------------------------------------------- */

static struct snode *dealer_get(struct kvx_ctl *ctl, const char *host, uint16_t port)
{
	char ep[KVX_CTL_HOST_MAX + 32];
	if (kvx_ctl_zmq_path(host, port, ep, sizeof(ep)) < 0)
		return NULL;
	struct snode *n = ctl_smap_find(&ctl->dealers, ep);
	if (n) {
		ctl_smap_touch(&ctl->dealers, n);
		return n;
	}
	if (ctl->dealers.count >= ctl->p.max_peers) {
		/* Evict the least recently used path that no live transfer pins. */
		struct snode *v = ctl->dealers.tail;
		while (v && v->refs)
			v = v->prev;
		if (!v) {
			ctl_warn_rl(ctl, "DEALER cache full (%u paths, all pinned by live transfers); "
				     "dropping a send to %s", ctl->p.max_peers, ep);
			return NULL;
		}
		zmq_close(v->val);
		ctl_smap_del(&ctl->dealers, v);
		CINC(ctl, peers_evicted);
		atomic_fetch_sub_explicit(&ctl->c.peers_open, 1, memory_order_relaxed);
	}
	void *s = ctl_dealer_new(ctl, 4096);
	if (!s)
		return NULL;
	if (strchr(host, ':')) {
		int one = 1;
		zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof(one));
	}
	if (ctl_auth_client(ctl, s, host) || zmq_connect(s, ep)) {
		ctl_warn_rl(ctl, "cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
		zmq_close(s);
		return NULL;
	}
	n = ctl_smap_add(&ctl->dealers, ep, s);
	if (!n) {
		zmq_close(s);
		return NULL;
	}
	CINC(ctl, peers_open);
	return n;
}

void ctl_notify_send(struct kvx_ctl *ctl, struct slot *s)
{
	struct snode *n = dealer_get(ctl, s->host, s->port);
	if (!n || zmq_send(n->val, s->data, s->len, ZMQ_DONTWAIT) < 0) {
		if (n)
			ctl_warn_rl(ctl, "send to %s failed: %s", n->key, zmq_strerror(zmq_errno()));
		CINC(ctl, send_errors);
		return;
	}
	n->used_ns = kvx_now_ns();
	CINC(ctl, notify_tx);
	CINC(ctl, notify_tx_type[s->mtype < KVX_CTL_MSG_TYPES ? s->mtype : 0]);
}

void ctl_terminal_add(struct kvx_ctl *ctl, const char *tid)
{
	struct snode *n = ctl_smap_find(&ctl->terminal, tid);
	if (n) {
		ctl_smap_touch(&ctl->terminal, n);
	} else {
		if (ctl->terminal.count >= KVX_CTL_TERMINAL_LRU)
			ctl_smap_del(&ctl->terminal, ctl->terminal.tail);
		ctl_smap_add(&ctl->terminal, tid, NULL);
	}
	/* Unpin the DEALER path this transfer used. */
	struct snode *l = ctl_smap_find(&ctl->live, tid);
	if (l) {
		struct snode *d = ctl_smap_find(&ctl->dealers, l->val);
		if (d && d->refs)
			d->refs--;
		free(l->val);
		ctl_smap_del(&ctl->live, l);
	}
}

void ctl_live_add(struct kvx_ctl *ctl, const char *tid, const char *host, uint16_t port)
{
	if (ctl_smap_find(&ctl->live, tid) || ctl->live.count >= LIVE_MAX)
		return;
	struct snode *d = dealer_get(ctl, host, port);
	if (!d)
		return;
	char *path = strdup(d->key);
	if (!path)
		return;
	if (!ctl_smap_add(&ctl->live, tid, path)) {
		free(path);
		return;
	}
	d->refs++;
}

/* ---------------------------------------------------------------------------------------- */
/* Receive path                                                                              */
/* ---------------------------------------------------------------------------------------- */

int ctl_notify_recv(struct kvx_ctl *ctl)
{
	for (int k = 0; k < RX_BATCH; k++) {
		zmq_msg_t id, pl;
		int nf;
		const char *addr;
		struct peer_stat *ps;
		int r = ctl_router_next(ctl, ctl->nt_router, &id, &pl, &nf, &addr, &ps);
		if (r == 0)
			return k;
		if (r < 0) {
			ctl_count_bad(ctl, ps, -EPROTO);
			ctl_warn_rl(ctl, "notify: dropped a %d-frame message from %s (want 2 frames)", nf,
				addr ? addr : "?");
		} else {
			char err[256];
			struct kvx_msg_notify *m = ctl->nmsg;
			m->block_ids = ctl->ids;
			m->blocks_cap = NOTIFY_MAX_IDS;
			int rc = kvx_msg_notify_decode(zmq_msg_data(&pl), zmq_msg_size(&pl), m, err,
						       sizeof(err));
			if (rc) {
				ctl_count_bad(ctl, ps, rc);
				if (strstr(err, "Unhandled structured message type"))
					CINC(ctl, unknown_type);
				ctl_warn_rl(ctl, "notify: dropped a %zu-byte message from %s: %s",
					zmq_msg_size(&pl), addr ? addr : "?", err);
			} else if (ctl_smap_find(&ctl->terminal, m->transfer_id) &&
				   m->type != KVX_MSG_STATUS_QUERY &&
				   !(m->type == KVX_MSG_REMOTE_BLOCKS && m->sender_epoch)) {
				/* A kvxfer peer's status query or allocation for a finished transfer
				 * still goes through: its answer comes from the engine's record. */
				CINC(ctl, dropped_terminal);
				atomic_fetch_add_explicit(&ps->dropped, 1, memory_order_relaxed);
			} else {
				CINC(ctl, notify_rx);
				if ((unsigned)m->type < KVX_CTL_MSG_TYPES)
					CINC(ctl, notify_rx_type[m->type]);
				if (ctl->p.on_notify)
					ctl->p.on_notify(ctl->p.notify_arg, m);
			}
		}
		zmq_msg_close(&id);
		zmq_msg_close(&pl);
	}
	return RX_BATCH; /* the limit: more may be queued */
}
