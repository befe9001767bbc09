/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_ENGINE_INTERNAL_H
#define KVX_ENGINE_INTERNAL_H
/*
 * Module-private: the engine's shared types (runtime/engine.c, peer.c, poller*.c, api.c) and the
 * functions one of those files calls in another. Which thread writes which field is said at
 * each struct; the threads are described at the top of engine.c.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvxfer/control.h"
#include "kvxfer/engine.h"
#include "kvxfer/lcore.h"
#include "kvxfer/mem.h"
#include "kvxfer/transport.h"
#include "fence.h"
#include "runtime_internal.h"

enum msg_type {
	M_SUBMIT = 1,
	M_LAYER_READY = 2,
	M_SEAL = 3,
	M_ABORT = 4,
	M_NOTIFY = 5,
	M_PEER_READY = 6,
	M_PEER_FAILED = 7,
	M_PEER_CHECKED = 8, /* a metadata-only epoch check of the peer finished */
};

/* Ring messages are written whole by the ring's producer before the enqueue and read by its
 * consumer after the dequeue; neither touches a message in the ring.
 * app -> poller k (`sub` ring): a submission hands over the transfer object; every later
 * message names it by handle (pool slot + generation), never by id. */
struct smsg {
	uint32_t type;  /* M_SUBMIT, M_LAYER_READY, M_SEAL, M_ABORT */
	uint32_t u32;   /* layer / n_layers */
	uint32_t slot;  /* handle: pool slot ... */
	uint32_t gen;   /* ... and generation (stale handles are ignored) */
	const void *ptr; /* M_SUBMIT: the struct xf; M_LAYER_READY: legacy ready flag */
	struct kvx_mem_event ev; /* M_LAYER_READY: the layer's readiness event (by value) */
};

/* control -> poller k (`cin` ring): inbound notifications (by transfer id: the control lcore
 * is the edge where ids are resolved, on the owning poller's table) and peer events. */
struct emsg {
	uint32_t type;
	uint32_t u32;   /* notify type */
	int32_t status; /* error / decode rank */
	uint32_t n;     /* block count */
	void *ptr;      /* peer*, malloc'ed block ids */
	uint64_t u64;   /* consumer_tp_size (release) / sender epoch (remote_blocks) / the peer's hs_ends
			 * after the handshake that ended (M_PEER_READY, M_PEER_FAILED) */
	uint64_t key;   /* the named sender (kvx_xfer_sender_key()), 0 for a MoRIIO sender */
	int32_t err;    /* kvx_failed: the producer's error */
	uint32_t fst;   /* kvx_failed: the producer's status */
	char tid[KVX_ENGINE_ID_MAX];
	uint8_t pad[256 - 48 - KVX_ENGINE_ID_MAX];
};
_Static_assert(sizeof(struct emsg) == 256, "ring element size");

/* poller k -> app (`cpl` ring): a completion built by the owning poller (eng_cpl_build()),
 * carrying the transfer's outcome (c.status, c.error) to the app thread, the one writer of
 * the stored outcome (api.c cpl_stage()); `last` hands the transfer object back. */
struct cmsg {
	struct kvx_completion c;
	void *xf;
	uint32_t last;
	uint32_t pad;
};

/* Layer spread (issue 16, docs/performance.md §7; poller_post.c "Layer spread"). The owner of a
 * transfer hands "post layer L" to helper poller h = L mod n_po over h's `dreq` ring; h posts
 * it on its own link (link[h]) of the transfer's connection and, once every op of the layer is
 * terminal, returns one `dres` to the owner's ring. The owner counts the hand-off in
 * lf.ops_out and layer_batches[L] until the result is back, so it settles, rebinds or retires
 * the transfer only after every helper is done with it. An owner has at most SPREAD_CAP layers
 * out at one helper (more are posted by the owner itself). */
#define SPREAD_CAP 64u

/* owner -> helper (`dreq` of the helper, MP: any owner). Written whole by the owner; the
 * pointers stay valid until the helper's dres is taken by the owner: conn (the owner's
 * reference of the bound connection; a helper that posts takes its own for its poll list),
 * lids / rids (the transfer object's block-id arena, written before submission, or, P WRITE,
 * once before its first hand-off), peer (immutable while the transfer is live). */
struct dmsg {
	struct xf *x;     /* read by the helper: only x->dlg_stop */
	struct conn *c;
	struct peer *peer;
	const uint32_t *lids, *rids;
	uint64_t n;
	uint64_t expect, roff; /* with cnd: the lease condition (post_layer()) */
	uint32_t owner, layer, op, cnd;
	uint32_t slot, gen; /* the owner's handle of x, returned in the dres */
};

/* helper -> owner (`dres` of the owner, MP: any helper): the layer's outcome. */
struct dres {
	uint64_t bytes;    /* moved by the layer's ops */
	uint32_t slot, gen, layer, helper;
	int32_t status;    /* the first failed op's status, 0 */
	int32_t post_err;  /* a batch after the first could not be posted (partial layer) */
	uint32_t ep_dead;  /* the failed op's endpoint is in error state */
	uint32_t canceled; /* x->dlg_stop was set before it was posted: nothing was posted */
};

/* A hand-off a helper holds, from its dequeue to its dres. The helper's only. */
struct dlg {
	struct dmsg m;
	uint64_t bytes;
	uint32_t batches; /* posted, not completed */
	int32_t status, post_err;
	bool ep_dead, canceled, posted;
	uint32_t next_free; /* free list, index+1 */
};

enum hs_state {
	HS_IDLE = 0,
	HS_PENDING = 1,
	HS_READY = 2,
	HS_FAILED = 3,
};

struct layer {
	char name[KVX_ENGINE_NAME_MAX];
	void *base;
	struct kvx_layout_tensor t;
	struct kvx_layout_spec spec;
	struct kvx_layout_geom geom;
	uint64_t span;
	struct kvx_xport_mr *mr[2]; /* per transport context (engine xctx[]) */
	enum kvx_engine_mem mem;
	int device_id;
};

_Static_assert((int)KVX_ENGINE_MEM_HOST == (int)KVX_XPORT_MEM_HOST &&
		       (int)KVX_ENGINE_MEM_HIP == (int)KVX_XPORT_MEM_HIP &&
		       (int)KVX_ENGINE_MEM_HOSTDEV == (int)KVX_XPORT_MEM_HOSTDEV,
	       "engine and transport memory types share values");

struct kvx_engine;
struct poller;
struct conn;

/* A peer worker's identity and handshake state. Writers, by field:
 *  - identity (e .. n_pods): the app thread, once, before the first submission naming the peer
 *    (published to the pollers by that submission's ring enqueue); read-only afterwards.
 *  - hs_state, hs_error, hs_ends, hs_ep, epoch, gen: the control thread only. hs_state is
 *    PENDING from the job's acceptance (on_hs_accept()) and READY/FAILED when it ends
 *    (on_hs_done(), which counts hs_ends after storing hs_error). Other threads only read
 *    them and ask for a handshake through their own inbox ring (eng_hs_request()): the app
 *    thread in eng_peer_get() (once per outcome: app_asked), a poller when a connection goes
 *    stale (conn_stale()) or a request is owed again (poller.hs_retry: not queued, or refused
 *    as a duplicate of an epoch check).
 *  - app_asked: the app thread (the hs_ends value it last asked at).
 *  - check_busy: CAS false -> true by a poller (eng_epoch_check_start()), reset by the control
 *    thread (on_epoch_checked()); check_started: that poller; check_done, checked_epoch: the
 *    control thread.
 *  - bytes, ops, transfers, failures: counters, relaxed adds by the pollers; read by any. */
struct peer {
	struct kvx_engine *e;
	/* Key in the engine's RCU table of connections; the app thread gives a reused slot a new
	 * one (atomic: a poller may read it for an entry of its terminal LRU meanwhile). */
	_Atomic uint64_t id;
	char host[KVX_ENGINE_HOST_MAX];
	uint16_t hs_port, notify_port;
	uint32_t dp_rank, dp_size_local, tp_size;
	/* Multi-pod (docs/protocol.md §5.8): per-pod hosts; ranks [k*dp_size_local, (k+1)*dp_size_local)
	 * live on pod_host[k]. Part of the peer's identity, so a transfer's routing is fixed at
	 * submission and a later transfer with other hosts is another peer. */
	char pod_host[KVX_ENGINE_MAX_PODS][KVX_ENGINE_HOST_MAX];
	const char *pod_ptr[KVX_ENGINE_MAX_PODS];
	uint32_t n_pods;
	atomic_int hs_state; /* enum hs_state; control thread */
	atomic_int hs_error; /* control thread: the failed handshake's errno, stored before HS_FAILED */
	_Atomic uint64_t hs_ends; /* control thread: handshake jobs ended (results stored) */
	/* Handshake requests not answered yet: +1 by the requester before it queues one
	 * (eng_hs_request()), -1 by the control thread after the request's on_done. Eviction
	 * (app thread, peer_slot()) raises `evicting` and then needs this at 0, while a requester
	 * raises the count and then backs off if `evicting` is set (seq_cst both ways: one of
	 * them sees the other), so no request reaches the control lcore for a forgotten slot. */
	_Atomic uint32_t hs_inflight;
	atomic_bool evicting; /* app thread */
	uint64_t app_asked;  /* app thread: hs_ends when it last asked, UINT64_MAX never */
	/* Control thread: endpoints of the handshake in flight, [link][candidate context]. */
	struct kvx_xport_ep *hs_ep[KVX_ENGINE_MAX_POLLERS][2];
	uint64_t epoch; /* control thread: epoch of the last published connection */
	uint64_t gen;   /* control thread: connections published */
	/* Epoch check (P WRITE, consumer restart): a metadata-only handshake; a poller starts one
	 * (check_busy CAS) and numbers it (check_started); the control thread stores the epoch it
	 * saw (0: failed) and then the number of the finished job in check_done (release). */
	atomic_bool check_busy;
	_Atomic uint64_t check_started, check_done, checked_epoch;
	/* A kvxfer engine (its handshake metadata had kvx_ keys, or it named itself in a message):
	 * it may be sent kvx_failed / kvx_status_query. Set (relaxed, never cleared) by the control
	 * thread (handshake) and the pollers (notifications). */
	atomic_bool is_kvx;
	/* A stock MoRIIO/MoRI worker (its metadata had no kvx_ keys): data never moves to or from
	 * it. Control thread (handshake result), read by any. */
	atomic_bool is_moriio;
	/* Eviction (params.peer_idle_ms): n_live, idle_since and evicted are the app thread's
	 * (submissions and the last completion of each transfer); n_conns counts this peer's
	 * connections not yet destroyed (conn_build: control thread; eng_conn_destroy: the
	 * destroying thread), so an evicted slot is reused only once the last one is gone. */
	uint32_t n_live;
	uint64_t idle_since;
	bool evicted;
	_Atomic uint32_t n_conns;
	_Atomic uint64_t bytes, ops, transfers, failures;
};

/* One polling lcore's endpoint of a connection. ep and rmr: written by the control thread
 * before the connection is published, read-only afterwards; the rest: poller k only. */
struct clink {
	struct kvx_xport_ep *ep;
	struct kvx_xport_rmr **rmr; /* Array[n_layers] */
	struct kvx_xport_rmr *lease_rmr; /* the peer's lease directory (runtime/lease.c) */
	/* Owned by poller k. */
	uint32_t outstanding;
	bool listed;
	uint64_t last_ok_ns; /* last successful completion on this link */
	struct conn *next; /* poller k's poll list */
};

/* A peer connection (one handshake's result), built by the control thread and published in
 * the RCU table; immutable once published except: refs (any thread that takes or drops a
 * reference: pollers, the RCU callback thread, the app thread at stop), stale (set once by the
 * poller that sees an endpoint fail), next_dead (the thread that dropped the last reference),
 * and link[k]'s poller fields (poller k). The control thread destroys it (eng_on_ctl_work()). */
struct conn {
	struct kvx_engine *e;
	struct peer *pr;
	uint64_t epoch, gen;
	uint32_t xi; /* index of the endpoints' context in the engine's xctx[] */
	uint32_t n_links;
	uint64_t remote_num_blocks;
	uint32_t lease_n;             /* words in the peer's lease directory window range */
	struct kvx_layout_geom *geom; /* Array[n_layers] */
	_Atomic uint32_t refs;        /* 1 for the table + transfers + poll lists */
	atomic_bool stale;            /* an endpoint entered error state: no new transfer binds */
	struct conn *next_dead;       /* link in the engine's `dead` stack (pushed once refs hit 0) */
	struct clink link[];
};

/* Layer readiness (P WRITE): the legacy host flag or an event. */
struct lgate {
	const atomic_uint *flag;
	struct kvx_mem_event ev;
};

/* The transfer object, one per transfer, from a pool preallocated at start. Writers:
 *  - tid .. consumer_tp, lf.kind, lf.start_ns, lf.hs_after, gen, reg, next_free: the app
 *    thread, at submission (before the M_SUBMIT ring enqueue that hands the object to its
 *    poller) and when the last completion gives it back.
 *  - layer_done: the owning poller (release stores); the app thread reads.
 *  - lf (the lifecycle state, runtime/xfer.c decides its changes) and everything from `t` on:
 *    the owning poller only, from M_SUBMIT until it enqueues the object's last completion. */
struct xf {
	char tid[KVX_ENGINE_ID_MAX];
	struct kvx_life lf;
	struct peer *peer;
	struct poller *po;  /* owning poller */
	struct conn *conn;  /* poller: bound connection (a reference), or NULL */
	uint32_t *lblocks;  /* Array[max_blocks] in the engine's arena */
	uint32_t *rblocks;  /* Array[max_blocks] in the engine's arena */
	size_t n;
	uint32_t consumer_tp; /* P READ: consumer TP size (fan-in); D WRITE announce: 1 = remote_blocks
			       * was sent by the scheduler (kvx_engine_announce.notified), not by us */
	/* App-visible: per-layer completion bits (release stores). The outcome is not kept here:
	 * the poller hands it over in the KVX_CPL_TRANSFER completion and the app thread stores it
	 * in the registry entry (api.c cpl_stage()). */
	_Atomic uint64_t layer_done[KVX_ENGINE_MAX_LAYERS / 64];
	uint32_t gen; /* app thread, at submission: with slot, the handle ring messages carry */
	struct kvx_xfer *reg; /* app thread: its registry entry (live until the last completion) */
	/* Poller-owned. */
	struct kvx_xfer *t; /* its entry in the poller's table (NULL for a consumer READ) */
	uint32_t live_idx;
	uint32_t slot; /* index in the engine's pool; used in completion cookies */
	bool live;
	uint32_t *layer_batches; /* Array[n_layers] */
	struct lgate *gate;      /* Array[n_layers] */
	uint64_t want_post[KVX_ENGINE_MAX_LAYERS / 64];
	uint64_t fence_ticket;
	uint64_t first_layer_ns; /* when the first layer's ops completed; stale (< lf.start_ns) until then */
	uint64_t bytes;
	uint32_t next_free; /* app thread free list */
	/* Leases (runtime/lease.c). P SERVE: lease_idx is the directory word it holds, + 1 (0:
	 * none), set by the app thread at submission; cleared by the poller when the serve ends.
	 * D READ (poller): lease_phase, the word read before the first op (lease_word at window
	 * position lease_pos) and the key it was looked up with. */
	uint32_t lease_idx;
	uint8_t lease_phase; /* enum lease_phase */
	uint32_t lease_pos;
	uint64_t lease_key, lease_word;
	/* D WRITE (poller): the word its lease held before the revocation (0: none), and whether
	 * its blocks wait for a peer's conditional copy under that word to finish
	 * (eng_writers_busy(), poller.c report()). */
	uint64_t lease_revoked;
	bool busy_hold;
	/* Layer spread (owning poller): hand-offs whose dres is not back (dlg_n), and whether
	 * rblocks holds a P WRITE's pairing of D's allocation for the helpers (rb_ready). dlg_stop:
	 * written by the owning poller (reset only while dlg_n is 0, set once posting is over:
	 * reported, failed, awaiting the peer, entry gone), read by the helpers before they post
	 * a layer of x (a set flag: the layer is returned canceled, nothing posted). */
	uint32_t dlg_n;
	bool rb_ready;
	atomic_bool dlg_stop;
};

/* D READ lease check of one transfer (runtime/lease.c, poller_post.c read_progress()). */
enum lease_phase {
	LP_NONE = 0,     /* not looked up yet */
	LP_BEFORE = 1,   /* the window read is outstanding */
	LP_HELD = 2,     /* the lease was found: data ops may go */
	LP_AFTER = 3,    /* the re-read of the word is outstanding */
	LP_VERIFIED = 4, /* the word held across every data op: DONE allowed */
	LP_WAIT = 5,     /* READ: not granted yet; looked up again by the next scan (1 ms) */
};

/* Cookie layer value of a lease read (data batches carry their layer, < KVX_ENGINE_MAX_LAYERS). */
#define LEASE_COOKIE 0xffffu

/* One polling lcore. Set up by the app thread at start (before the lcore runs); afterwards
 * every field is the poller's own, except the rings (their producer/consumer sides are
 * named at struct kvx_engine's top comment in engine.c) and the st_* counters (relaxed adds by
 * the poller; read by any thread). hs_retry is the poller's own too. */
struct poller {
	struct kvx_engine *e;
	uint32_t k;
	struct kvx_lcore *lc;
	struct kvx_ring *sub, *cin, *cpl;
	struct kvx_ctl_inbox *ib;
	struct kvx_xfer_table *tab;
	struct xf **live;
	uint32_t n_live;
	uint32_t *owned; /* Array[max_transfers]: gen of the live transfer in that pool slot, 0 */
	struct kvx_plan_cache *pc;
	struct kvx_xport_op *ops;
	struct conn *plist; /* connections with ops outstanding on link k */
	/* epoll set of the readiness fds this poller waits on (its lcore's wait fd): armed tcp
	 * initiator endpoints (kvx_xport_ep_arm()) and, on pollers k < n_prog, the wait fds of
	 * the contexts' progress group k. */
	int wfd;
	bool ctx_wait; /* pollers k < n_prog: a context's progress group fd is in wfd */
	bool gated;    /* this poll found a layer gate closed (polled, no fd wakes it) */
	/* The lcore's timer heap (kvx_lcore_attach_timers()) and its one timer: the deadline scan,
	 * armed only while the poller has live transfers or connections with ops outstanding. */
	struct kvx_timer_heap *timers;
	struct kvx_timer scan;
	uint32_t n_fence_pending;
	uint32_t n_busy_hold; /* live transfers with busy_hold set */
	uint64_t hs_retry[KVX_ENGINE_MAX_PEERS / 64]; /* peer slot: a handshake request is owed (poller_conn.c hs_ask()) */
	/* Layer spread: `dreq` (hand-offs to this poller as a helper; consumer: this poller,
	 * producers: the other pollers) and `dres` (outcomes of this poller's hand-offs; consumer:
	 * this poller, producers: the helpers). The rest is this poller's own: as a helper, dlg
	 * (Array[n_dlg] = n_po x SPREAD_CAP), its free list and dpend (Array[n_dlg]: hand-offs
	 * whose first batch could not be posted yet, retried every poll); as an owner, dlg_out[h]
	 * (hand-offs out at helper h, at most SPREAD_CAP). */
	struct kvx_ring *dreq, *dres;
	struct dlg *dlg;
	uint32_t n_dlg, dlg_free;
	uint32_t *dpend;
	uint32_t n_dpend;
	uint32_t dlg_out[KVX_ENGINE_MAX_POLLERS];
	_Atomic uint64_t st_bytes, st_ops, st_transfers, st_failures;
};

/* A transport context's async-event fd watched by the control lcore. */
struct evwatch {
	struct kvx_engine *e;
	uint32_t k; /* index in xctx[] */
	int fd;
};

/* The engine. Fields written before kvx_engine_start() launches the lcores (parameters,
 * layers, contexts, pools, rings) are read-only afterwards; the others say their writer. */
struct kvx_engine {
	struct kvx_engine_params p;
	struct kvx_metrics *metrics; /* runtime/metrics.c; NULL = no endpoint (application thread) */
	char verbs_dev[64];          /* params.verbs_device, copied ("" = first ACTIVE device) */
	char auth_dir[1024];         /* params.auth_dir, copied ("" = unauthenticated) */
	char host[KVX_ENGINE_HOST_MAX];
	char transport[16];
	char lcores[128];
	char self_id[KVX_ENGINE_HOST_MAX + 8]; /* app thread at start: "host:hs_port", our engine id in acks */
	uint64_t self_epoch;                   /* app thread at start: this incarnation's epoch */
	uint16_t self_nt;                      /* app thread at start: this worker's bound notify port
						* (a READ consumer names it to its producer) */
	char proxy[128], http[128];
	bool started, stopped;
	uint32_t n_layers;
	struct layer layers[KVX_ENGINE_MAX_LAYERS];
	struct kvx_lcore_set *set;
	/* xctx[0]: the provider named by `transport` (auto: verbs if usable, else tcp); xctx[1]:
	 * auto only, shm for same-host peers when CMA is permitted (NULL otherwise). */
	struct kvx_xport_ctx *xctx[2];
	struct kvx_xport_caps caps[2];
	bool fence_writers; /* set at create (app thread), read-only after: see kvx_xfer_ev.fence_writers */
	uint32_t n_xctx;
	bool has_hip; /* a layer is device memory (HIP or hostdev): `auto` does not add shm */
	int hip_probe; /* app thread: 0 not probed, 1 HIP device usable, else -errno */
	char hip_why[KVX_MEM_WHY_LEN];
	_Atomic(const char *) last_xport; /* control thread: provider of the latest connection */
	struct kvx_ctl *ctl;
	struct evwatch evw[2];
	struct kvx_ctl_inbox *app_ib;
	struct poller *po[KVX_ENGINE_MAX_POLLERS];
	uint32_t n_po;
	uint32_t n_prog; /* pollers 0..n_prog-1 call target progress (tcp: group k on poller k); at
	                    least 1 (poller 0 confirms fences without a tcp target); set in
	                    kvx_engine_start() when the transports open, before the pollers run */
	struct kvx_rcu_table *conns; /* peer id -> struct conn (control publishes, pollers read) */
	/* app thread */
	struct kvx_xfer_table *reg;
	struct peer peers[KVX_ENGINE_MAX_PEERS];
	uint32_t n_peers;
	uint64_t next_peer_id;    /* ids of reused peer slots (> KVX_ENGINE_MAX_PEERS) */
	struct xf *xpool;         /* Array[max_transfers] */
	uint32_t xfree;           /* free list head, index+1 */
	uint32_t *arena;          /* block ids: Array[max_transfers * 2 * max_blocks], mmap'ed */
	size_t arena_bytes;
	uint32_t *lb_pool;        /* Array[max_transfers * n_layers] */
	struct lgate *gate_pool;  /* Array[max_transfers * n_layers] */
	uint32_t cpl_rr;
	/* App thread: completions taken off the pollers' rings, not yet returned (api.c
	 * cpl_stage()): FIFO of stage_cap = 2 x max_transfers entries. */
	struct cmsg *stage;
	uint32_t stage_head, stage_n, stage_cap;
	/* Control-path transport work runs on the control lcore only (transport.h: endpoint
	 * create/accept/connect/destroy one thread at a time), so no lock guards it:
	 *  - accepted[]: target endpoints; written by the control thread only.
	 *  - dead: unreferenced connections to destroy; a lock-free stack (push: any thread that
	 *    drops the last reference, a poller or the RCU callback thread; take-all: the control
	 *    thread in eng_on_ctl_work(), the app thread once the control lcore is stopped).
	 *  - fences (P READ defer timeout, D WRITE quarantine expiry): fence_req is raised by any
	 *    poller; the control thread destroys accepted[] and stores fence_cut; the fence set's
	 *    done becomes fence_cut (kvx_fence_note(), whichever poller records it last) once
	 *    each poller k < n_prog (the tcp target's progress groups) has returned from a
	 *    kvx_xport_progress_group() call that began after the cut (a call that began before
	 *    it may still have been serving a reader); pollers release fenced blocks once
	 *    kvx_fence_done() covers them.
	 *  - ctl_efd: eventfd doorbell, written by whoever queued work; watched by the control
	 *    lcore (eng_on_ctl_work()). */
	struct kvx_xport_ep **accepted;
	uint32_t n_accepted, cap_accepted;
	_Atomic(struct conn *) dead;
	_Atomic uint64_t fence_req, fence_cut;
	struct kvx_fence_set fence; /* confirmations of fence_cut by pollers 0..n_prog-1 (fence.h) */
	int ctl_efd;
	struct kvx_waiter app_w; /* kvx_xfer_layer_wait() sleeps here; the pollers wake it */
	bool app_w_init;
	/* Counters: relaxed adds by the pollers and the control thread; read by any thread. */
	_Atomic uint64_t st_writer_holds; /* pollers: D WRITE releases put off (poller.c report()) */
	_Atomic uint64_t st_done, st_failed, st_aborted, st_timed_out, st_late, st_quar, st_notify_drop, st_fences,
		st_peer_resets;
	uint64_t st_dup, st_nobufs; /* app thread */
	uint32_t n_held; /* app thread: transfers whose KVX_CPL_TRANSFER was polled, their
	                    KVX_CPL_BLOCKS_RELEASED not yet (blocks held in quarantine) */
	struct kvx_ratelimit rl_nobufs;
	/* Lease directory (runtime/lease.c): lease_n + LEASE_WIN words, registered REMOTE_READ in
	 * every context (lease_mr[]); words written as lease.c says. lease_buf: Array[max_transfers
	 * * LEASE_WIN], where a consumer READ's lease reads land (slot-indexed: one poller each).
	 * lease_gen: the app thread. */
	_Atomic uint64_t *lease;
	uint32_t lease_n;
	uint16_t lease_gen;
	uint64_t *lease_buf;
	struct kvx_xport_mr *lease_mr[2], *lease_buf_mr[2];
};

/* runtime/lease.c: block leases of READ-served transfers. */
#define LEASE_WIN 16u
#define LEASE_GEN_MASK 0xffffu
/* The lease key of a transfer id under a producer epoch (never 0 in its upper 48 bits). */
uint64_t eng_lease_key(const char *tid, uint64_t epoch);
/* First word of the key's window in a directory of lease_n (a power of 2) words. */
uint32_t eng_lease_base(uint64_t key, uint32_t lease_n);
/* App thread: take a free word of the key's window; its index in *idx. -ENOBUFS: window full. */
int eng_lease_stamp(struct kvx_engine *e, uint64_t key, uint32_t *idx);
/* Owning poller: revoke the word (before the blocks are handed back). */
uint64_t eng_lease_clear(struct kvx_engine *e, uint32_t idx);
/* Whether a peer may still be inside a conditional copy into our memory made under the lease
 * word @p w, revoked before this call (kvx_xport_ctx_cond_busy() of every context). Poller. */
bool eng_writers_busy(struct kvx_engine *e, uint64_t w);
/* Position in a read window (LEASE_WIN words) of the key's live grant; -ESTALE when only its
 * tombstone is there (revoked), -EAGAIN when neither (not granted yet, or never). */
int eng_lease_find(const uint64_t *win, uint64_t key, uint32_t *pos);
/* kvx_engine_start(), after the contexts opened: directory + read buffer, registered. */
int eng_lease_init(struct kvx_engine *e);
/* Destroy, before the contexts close: unregister (the memory is freed after the close). */
void eng_lease_fini(struct kvx_engine *e);

/* Polling lcore that owns a transfer id (kvx_xfer_tid_hash(), the same on every thread). */
static inline uint32_t eng_tid_poller(const struct kvx_engine *e, const char *tid)
{
	return e->n_po > 1 ? kvx_xfer_tid_hash(tid) % e->n_po : 0;
}

static inline uint64_t ms_ns(uint32_t ms)
{
	return (uint64_t)ms * 1000000ull;
}

/* peer.c: control-thread callbacks (handshakes, connection blobs, inbound notifications). */
void eng_on_notify(void *arg, const struct kvx_msg_notify *msg);
int eng_on_connect(void *arg, const uint8_t *blob_a, size_t len_a, uint8_t *blob_b, size_t *len_b);
void eng_on_xport_events(void *arg);
/* peer.c: connections (RCU entries) and their lifetime. */
void eng_conn_table_free(void *value, void *ctx);
void eng_hs_eps_destroy(struct peer *pr);
void eng_conn_destroy(struct conn *c);
/* Drop a reference (any thread); the last one hands the connection to the control lcore. */
void eng_conn_put(struct conn *c);
/* Ask the control lcore for a reader fence (any poller); returns its ticket. */
uint64_t eng_fence_request(struct kvx_engine *e);
/* Control thread (watch callback of ctl_efd): destroy dead connections, cut fences. */
void eng_on_ctl_work(void *arg);
/* App thread, control lcore stopped: destroy what is left on the dead stack. */
void eng_conn_reap_stopped(struct kvx_engine *e);
/* App thread, control lcore stopped: drop a reference, destroying at once on the last. */
void eng_conn_put_stopped(struct conn *c);
/* peer.c: handshake orchestration (any thread that owns an inbox: app or poller). */
int eng_hs_request(struct kvx_engine *e, struct kvx_ctl_inbox *ib, struct peer *pr);
void eng_epoch_check_start(struct poller *po, struct peer *pr);
/* peer.c: app thread, a peer identity for a submission. */
struct peer *eng_peer_get(struct kvx_engine *e, const struct kvx_engine_peer *pp, bool handshake, int *rc);

/* poller.c: the polling lcores' loop and its completion ring. */
int eng_poll_fn(void *arg);
/* Engine start, before the launch: the poller's readiness set (po->wfd) as its lcore's wait fd. */
int eng_poller_wait_init(struct kvx_engine *e, struct poller *po);
void eng_cpl_build(const struct kvx_engine *e, const struct xf *x, struct cmsg *c, enum kvx_cpl_kind kind,
		   enum kvx_cpl_status st, int error, bool last);
void eng_push_cpl(struct poller *po, const struct cmsg *c, unsigned n);
void eng_remove_live(struct poller *po, struct xf *x);


#endif /* KVX_ENGINE_INTERNAL_H */
