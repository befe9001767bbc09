/* SPDX-License-Identifier: Apache-2.0 */
/* Block leases enforced per op (issue 14, docs/protocol.md §5.11), by the tcp target and by the
 * shm writer (cases tcp_ and shm_ below, one scenario): every data op of a
 * leased transfer is a conditional op (kvx_xport_post_bulk_cond()) on the owner's lease word, so
 * an op that reaches the owner's target after the owner revoked fails -ESTALE and touches
 * nothing. Public engine API only, real engines in two processes on loopback.
 *
 * WRITE, the consumer revokes mid-transfer: the producer (a child process) writes layer 0 of a
 * transfer; the consumer (this process) aborts it, which revokes its lease, waits for the abort
 * and takes a snapshot of its whole pool. Only then does the producer make layer 1 ready and
 * seal. The consumer's `release` (the abort's note to the producer) is held back by a byte
 * proxy on the producer's notify port, so the producer posts layer 1 not knowing of the abort,
 * as a producer whose writes were already in flight would: those writes reach the consumer's
 * target after the revocation. Asserted: the producer ends FAILED -ESTALE (never DONE), the
 * consumer ABORTED, and the consumer's pool, its quarantined blocks included, is byte for byte
 * the snapshot (layer 1 of the transfer's blocks still the poison it was filled with). The
 * consumer runs one polling lcore, the thread of its tcp target too, so the revocation is
 * ordered with every op its target applies: no residual window, the snapshot is exact. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_test_util.h"
#include "kvxfer/common.h"
#include "kvxfer/transport.h"

TestSuite(runtime_lease_target, .timeout = 180.0);

#define LT_TIMEOUT_MS 30000u
#define TRIES 3
#define POISON 0x77

struct result {
	int status, error;
};

static const char *const tids[TRIES] = {"tx-c0", "tx-c1", "tx-c2"};

/* A byte proxy from 127.0.0.1:port to 127.0.0.1:to (the producer's notify listener): the
 * consumer's notes reach the producer through it; while `hold` is set it stops reading from the
 * consumer's side (the bytes wait in the kernel). Its thread polls with a 5 ms timeout only to
 * see hold and stop change. */
#define PX_MAX 4
struct proxy {
	int lfd;
	uint16_t port, to;
	atomic_bool hold, stop;
	pthread_t th;
};

static int px_connect(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Move what fd has to the other side; false when it closed. */
static bool px_move(int from, int to)
{
	char buf[65536];
	ssize_t n = read(from, buf, sizeof(buf));
	if (n <= 0)
		return false;
	for (ssize_t off = 0; off < n;) {
		ssize_t w = write(to, buf + off, (size_t)(n - off));
		if (w <= 0)
			return false;
		off += w;
	}
	return true;
}

static void *px_run(void *arg)
{
	struct proxy *p = arg;
	int c[PX_MAX], s[PX_MAX], n = 0;
	while (!atomic_load(&p->stop)) {
		struct pollfd pf[1 + 2 * PX_MAX];
		int k = 0;
		pf[k++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
		bool hold = atomic_load(&p->hold);
		for (int i = 0; i < n; i++) {
			pf[k++] = (struct pollfd){.fd = hold ? -1 : c[i], .events = POLLIN};
			pf[k++] = (struct pollfd){.fd = s[i], .events = POLLIN};
		}
		if (poll(pf, (nfds_t)k, 5) <= 0)
			continue;
		if ((pf[0].revents & POLLIN) && n < PX_MAX) {
			int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
			int up = fd >= 0 ? px_connect(p->to) : -1;
			if (up >= 0) {
				c[n] = fd;
				s[n++] = up;
			} else if (fd >= 0) {
				close(fd);
			}
		}
		for (int i = 0; i < n; i++) {
			bool ok = true;
			/* hold is read again: it may have been set while this thread was in poll(). */
			if (pf[1 + 2 * i].revents && !atomic_load(&p->hold))
				ok = px_move(c[i], s[i]);
			if (ok && pf[2 + 2 * i].revents)
				ok = px_move(s[i], c[i]);
			if (!ok) {
				close(c[i]);
				close(s[i]);
				c[i] = c[n - 1];
				s[i] = s[n - 1];
				n--;
				break; /* pf indices moved: poll again */
			}
		}
	}
	for (int i = 0; i < n; i++) {
		close(c[i]);
		close(s[i]);
	}
	return NULL;
}

static void px_start(struct proxy *p, uint16_t to)
{
	p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(p->lfd, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t sl = sizeof(sa);
	cr_assert_eq(bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(p->lfd, 8), 0);
	cr_assert_eq(getsockname(p->lfd, (struct sockaddr *)&sa, &sl), 0);
	p->port = ntohs(sa.sin_port);
	p->to = to;
	atomic_init(&p->hold, false);
	atomic_init(&p->stop, false);
	cr_assert_eq(pthread_create(&p->th, NULL, px_run, p), 0);
}

static void px_stop(struct proxy *p)
{
	atomic_store(&p->stop, true);
	pthread_join(p->th, NULL);
	close(p->lfd);
}

static const char *g_prov = "tcp"; /* the data transport of both engines (set before the fork) */

static void start(struct et_eng *g, enum kvx_sched_role role)
{
	struct kvx_engine_params p;
	et_params(&p, role, KVX_SCHED_MODE_WRITE);
	p.transport = g_prov;
	p.transfer_timeout_ms = LT_TIMEOUT_MS;
	et_start(g, &p, role == KVX_SCHED_PRODUCER);
}

static bool posted_since(struct kvx_engine *e, void *arg)
{
	return et_ops_posted(e) > *(const uint64_t *)arg;
}

static int write_layers(struct et_eng *P, const char *tid, const struct et_ports *d, uint32_t from)
{
	static const uint32_t src[2] = {1, 2};
	struct kvx_engine_write w = {.transfer_id = tid, .peer = et_peer(d->hs, d->nt), .local_blocks = src,
				     .n = 2};
	if (from == 0 && kvx_xfer_write_begin(P->e, &w))
		return -1;
	for (uint32_t l = from; l < (from ? ET_NL : 1u); l++)
		if (kvx_xfer_layer_ready(P->e, tid, l, NULL))
			return -1;
	return from ? kvx_xfer_seal(P->e, tid, ET_NL) : 0;
}

/* Producer child: writes tx-0 whole (connects), then per attempt byte i writes tids[i]: layer 0,
 * stop once it is posted, then layer 1 and seal; reports the transfer's end once its blocks are
 * back (every op of it terminal). */
static int child_producer(void *arg, int to_parent, int from_parent)
{
	(void)arg;
	struct et_ports dp;
	if (et_read_all(from_parent, &dp, sizeof(dp)))
		return 10;
	struct et_eng P;
	start(&P, KVX_SCHED_PRODUCER);
	struct et_ports mine = et_ports_of(&P);
	if (et_write_all(to_parent, &mine, sizeof(mine)))
		return 11;
	struct et_track t = {.n = 0};
	et_follow(&t, "tx-0");
	if (write_layers(&P, "tx-0", &dp, 0) || write_layers(&P, "tx-0", &dp, 1) ||
	    !et_wait(P.e, &t, "tx-0", true) || t.status[0] != KVX_CPL_DONE)
		return 12;
	char i;
	while (et_read_all(from_parent, &i, 1) == 0 && i >= 0 && i < TRIES) {
		size_t k = et_follow(&t, tids[(int)i]);
		uint64_t ops0 = et_ops_posted(P.e);
		if (write_layers(&P, tids[(int)i], &dp, 0))
			return 13;
		/* Layer 0 is posted only once the consumer's lease was found. */
		if (!et_wait_until(P.e, &t, posted_since, &ops0) || et_write_all(to_parent, "p", 1))
			return 14;
		char go;
		if (et_read_all(from_parent, &go, 1) || write_layers(&P, tids[(int)i], &dp, 1) ||
		    !et_wait(P.e, &t, tids[(int)i], true))
			return 15;
		struct result r = {.status = t.status[k], .error = t.error[k]};
		if (et_write_all(to_parent, &r, sizeof(r)))
			return 16;
	}
	et_free(&P);
	return 0;
}

static void revokes_mid_transfer(const char *prov)
{
	char why[KVX_XPORT_REASON_MAX] = "";
	if (kvx_xport_provider_probe(prov, why, sizeof(why)))
		cr_skip_test("%s unavailable: %s", prov, why);
	g_prov = prov;
	struct et_child p;
	et_child_spawn(&p, child_producer, NULL);
	struct et_eng D;
	start(&D, KVX_SCHED_CONSUMER);
	struct kvx_engine_stats st;
	kvx_engine_get_stats(D.e, &st);
	if (!strcmp(prov, "tcp"))
		cr_assert_eq(st.n_lcores, 1, "the exact snapshot needs the target on the revoking poller");
	struct et_ports dp = et_ports_of(&D), pp;
	et_child_send(&p, &dp, sizeof(dp));
	et_child_recv(&p, &pp, sizeof(pp), "the producer child failed to start");
	struct proxy px;
	px_start(&px, pp.nt);
	struct et_track td = {.n = 0};
	const uint32_t d0[2] = {0, 1};
	/* The consumer's notes go through the proxy; the handshake goes straight to the producer. */
	struct kvx_engine_announce an = {.transfer_id = "tx-0", .peer = et_peer(pp.hs, px.port), .local_blocks = d0,
					 .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	et_follow(&td, "tx-0");
	et_expect_done(D.e, &td, "tx-0", false);
	static uint8_t snap[ET_NL][2 * ET_NB * ET_BLOCK];
	for (char i = 0; i < TRIES; i++) {
		et_fill(&D, POISON);
		const uint32_t db[2] = {2 + 2 * (uint32_t)i, 3 + 2 * (uint32_t)i};
		an.transfer_id = tids[(int)i];
		an.local_blocks = db;
		cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
		size_t k = et_follow(&td, tids[(int)i]);
		et_child_send(&p, &i, 1);
		char c;
		et_child_recv(&p, &c, 1, "the producer child never posted layer 0");
		/* Revoke: the abort reports only after the lease word is the tombstone. From here
		 * not one byte of the pool may change. Its release stays in the proxy. */
		atomic_store(&px.hold, true);
		cr_assert_eq(kvx_xfer_abort(D.e, tids[(int)i]), 0);
		cr_assert(et_wait(D.e, &td, tids[(int)i], false), "%s never ended on D", tids[(int)i]);
		cr_assert_eq(td.status[k], KVX_CPL_ABORTED, "D: status %d error %d", td.status[k], td.error[k]);
		for (int l = 0; l < ET_NL; l++)
			memcpy(snap[l], D.mem[l], sizeof(snap[l]));
		/* Layer 1 now: its writes reach the target after the revocation. */
		et_child_send(&p, "g", 1);
		struct result r;
		et_child_recv(&p, &r, sizeof(r), "the producer child failed");
		atomic_store(&px.hold, false);
		cr_assert_eq(r.status, KVX_CPL_FAILED, "P: %s status %d error %d (DONE after the revocation?)",
			     tids[(int)i], r.status, r.error);
		cr_assert_eq(r.error, -ESTALE, "P: %s error %d (%s)", tids[(int)i], r.error, kvx_strerror(r.error));
		for (int l = 0; l < ET_NL; l++)
			cr_assert_arr_eq(D.mem[l], snap[l], sizeof(snap[l]),
					 "%s: layer %d of the consumer's pool changed after the revocation",
					 tids[(int)i], l);
		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t pl = 0; pl < 2; pl++)
				for (uint32_t x = 0; x < ET_BLOCK; x++)
					cr_assert_eq(et_block(&D, 1, pl, db[j])[x], POISON,
						     "%s: a layer-1 byte landed", tids[(int)i]);
	}
	char q = -1;
	et_child_send(&p, &q, 1);
	et_child_join(&p, "producer child");
	px_stop(&px);
	et_free(&D);
}

Test(runtime_lease_target, tcp_write_consumer_revokes_mid_transfer_later_ops_stale_blocks_untouched)
{
	revokes_mid_transfer("tcp");
}

/* shm: no target thread; the producer checks the consumer's lease word before each copy
 * (transport/shm/shm.c cond_enter()): layer 1, posted after the revocation, moves nothing. */
Test(runtime_lease_target, shm_write_consumer_revokes_mid_transfer_later_ops_stale_blocks_untouched)
{
	revokes_mid_transfer("shm");
}

/* shm, the copy in flight at the revocation (the owner side of the conditional ops): the
 * producer's layer-1 source page is held by userfaultfd in the producer child, so its layer-1
 * copy, which passed its lease check, stops inside process_vm_writev (the fault is taken in the
 * producer's own memory). The consumer aborts (revokes) and its quarantine expires (defer
 * timeout 200 ms) while the copy is held: the blocks must not come back while it runs.
 * Asserted: the consumer ends ABORTED; it puts the release off (stats.writer_holds counts it)
 * and reports no BLOCKS_RELEASED while the copy is held; once the child lets the page in, the
 * copy lands (the blocks hold the producer's layer 1) and only then are the blocks released;
 * from the release on not one byte of the pool changes. The producer ends DONE or ABORTED,
 * whichever of its layer's completion and the consumer's release its poller takes first once
 * it runs again. Without the busy check the blocks come back at the quarantine expiry while
 * the copy is still held. */
/* The consumer put the release off, or released (the failure this test is for). */
struct held_arg {
	const struct et_track *t;
	size_t k;
};

static bool held_back(struct kvx_engine *e, void *arg)
{
	const struct held_arg *h = arg;
	struct kvx_engine_stats st;
	kvx_engine_get_stats(e, &st);
	return st.writer_holds > 0 || h->t->released[h->k] > 0;
}

/* et_create() with layer 1 in a page of its own (userfaultfd works on whole pages); destroy
 * with paged_free(). */
static void paged_create(struct et_eng *g, const struct kvx_engine_params *p, bool pattern)
{
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	memset(g, 0, sizeof(*g));
	for (uint32_t l = 0; l < ET_NL; l++) {
		g->mem[l] = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		cr_assert_neq(g->mem[l], MAP_FAILED);
	}
	et_create_over(g, p, pattern);
}

static void paged_free(struct et_eng *g)
{
	kvx_engine_destroy(g->e);
	for (uint32_t l = 0; l < ET_NL; l++)
		munmap(g->mem[l], (size_t)sysconf(_SC_PAGESIZE));
}

/* Producer child of the held copy: as child_producer() for one try, its layer 1 in a page of
 * its own that goes missing under userfaultfd before the try. Pipe: ports, "p" (layer 0
 * posted), "f" (the layer-1 copy is held), result; from the parent: ports, try, "g", "r". */
static int child_held(void *arg, int to_parent, int from_parent)
{
	(void)arg;
	struct et_ports dp;
	if (et_read_all(from_parent, &dp, sizeof(dp)))
		return 20;
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK); /* poll() needs it */
	struct uffdio_api api = {.api = UFFD_API};
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api))
		return 21;
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE), lb = 2 * ET_NB * ET_BLOCK;
	struct et_eng P;
	struct kvx_engine_params p;
	et_params(&p, KVX_SCHED_PRODUCER, KVX_SCHED_MODE_WRITE);
	p.transport = "shm";
	p.transfer_timeout_ms = LT_TIMEOUT_MS;
	paged_create(&P, &p, true);
	uint8_t *l1 = P.mem[1];
	uint8_t *keep = aligned_alloc(pg, pg);
	if (!keep)
		return 22;
	memcpy(keep, l1, lb);
	if (et_start_layers(&P))
		return 23;
	struct et_ports mine = et_ports_of(&P);
	if (et_write_all(to_parent, &mine, sizeof(mine)))
		return 24;
	struct et_track t = {.n = 0};
	et_follow(&t, "tx-0");
	if (write_layers(&P, "tx-0", &dp, 0) || write_layers(&P, "tx-0", &dp, 1) ||
	    !et_wait(P.e, &t, "tx-0", true) || t.status[0] != KVX_CPL_DONE)
		return 25;
	struct uffdio_register reg = {.range = {.start = (uintptr_t)l1, .len = pg},
				      .mode = UFFDIO_REGISTER_MODE_MISSING};
	if (madvise(l1, pg, MADV_DONTNEED) || ioctl(uffd, UFFDIO_REGISTER, &reg))
		return 26;
	char i, go;
	if (et_read_all(from_parent, &i, 1) || i != 0)
		return 27;
	size_t k = et_follow(&t, tids[0]);
	uint64_t ops0 = et_ops_posted(P.e);
	if (write_layers(&P, tids[0], &dp, 0) || !et_wait_until(P.e, &t, posted_since, &ops0) ||
	    et_write_all(to_parent, "p", 1))
		return 28;
	if (et_read_all(from_parent, &go, 1) || write_layers(&P, tids[0], &dp, 1))
		return 29;
	/* The poller's copy reads the missing page and waits for us inside the syscall. */
	struct uffd_msg msg;
	struct pollfd pf = {.fd = uffd, .events = POLLIN};
	if (poll(&pf, 1, 30000) != 1 || read(uffd, &msg, sizeof(msg)) != (ssize_t)sizeof(msg) ||
	    msg.event != UFFD_EVENT_PAGEFAULT || et_write_all(to_parent, "f", 1))
		return 30;
	struct uffdio_copy cp = {.dst = (uintptr_t)l1, .src = (uintptr_t)keep, .len = pg};
	if (et_read_all(from_parent, &go, 1) || ioctl(uffd, UFFDIO_COPY, &cp) || !et_wait(P.e, &t, tids[0], true))
		return 31;
	struct result r = {.status = t.status[k], .error = t.error[k]};
	if (et_write_all(to_parent, &r, sizeof(r)) || et_read_all(from_parent, &i, 1))
		return 32;
	paged_free(&P);
	free(keep);
	close(uffd);
	return 0;
}

Test(runtime_lease_target, shm_write_copy_in_flight_at_revocation_holds_blocks_until_it_returned)
{
	char why[KVX_XPORT_REASON_MAX] = "";
	if (kvx_xport_provider_probe("shm", why, sizeof(why)))
		cr_skip_test("shm unavailable: %s", why);
	int probe = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (probe < 0)
		cr_skip_test("userfaultfd unavailable (%s): cannot hold a copy in flight", strerror(errno));
	close(probe);
	const size_t lb = 2 * ET_NB * ET_BLOCK;
	cr_assert_leq(lb, (size_t)sysconf(_SC_PAGESIZE));
	struct et_child ch;
	et_child_spawn(&ch, child_held, NULL);
	struct et_eng D;
	struct kvx_engine_params p;
	et_params(&p, KVX_SCHED_CONSUMER, KVX_SCHED_MODE_WRITE);
	p.transport = "shm";
	p.transfer_timeout_ms = LT_TIMEOUT_MS;
	p.defer_timeout_ms = 200;
	et_start(&D, &p, false);
	struct et_ports dp = et_ports_of(&D), pp;
	et_child_send(&ch, &dp, sizeof(dp));
	et_child_recv(&ch, &pp, sizeof(pp), "the producer child failed to start");
	struct et_track td = {.n = 0};
	const uint32_t d0[2] = {0, 1};
	struct kvx_engine_announce an = {.transfer_id = "tx-0", .peer = et_peer(pp.hs, pp.nt), .local_blocks = d0,
					 .n = 2};
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	et_follow(&td, "tx-0");
	et_expect_done(D.e, &td, "tx-0", false);
	for (int l = 0; l < ET_NL; l++)
		memset(D.mem[l], POISON, lb);
	const uint32_t db[2] = {2, 3};
	an.transfer_id = tids[0];
	an.local_blocks = db;
	cr_assert_eq(kvx_xfer_announce(D.e, &an), 0);
	size_t k = et_follow(&td, tids[0]);
	char i = 0, c;
	et_child_send(&ch, &i, 1);
	et_child_recv(&ch, &c, 1, "the producer child never posted layer 0");
	et_child_send(&ch, "g", 1);
	et_child_recv(&ch, &c, 1, "the producer's layer-1 copy was never held");
	/* Revoke while the copy is held; the quarantine then expires with no answer. */
	cr_assert_eq(kvx_xfer_abort(D.e, tids[0]), 0);
	cr_assert(et_wait(D.e, &td, tids[0], false), "%s never ended on D", tids[0]);
	cr_assert_eq(td.status[k], KVX_CPL_ABORTED, "D: status %d error %d", td.status[k], td.error[k]);
	struct held_arg ha = {.t = &td, .k = k};
	cr_assert(et_wait_until(D.e, &td, held_back, &ha),
		  "the quarantine expired and the release was not put off for the copy in flight");
	cr_assert_eq(td.released[k], 0, "blocks released while the producer's copy was in flight");
	et_child_send(&ch, "r", 1); /* let the copy finish */
	cr_assert(et_wait(D.e, &td, tids[0], true), "blocks never released after the copy returned");
	static uint8_t snap[ET_NL][2 * ET_NB * ET_BLOCK];
	for (int l = 0; l < ET_NL; l++)
		memcpy(snap[l], D.mem[l], lb);
	for (uint32_t j = 0; j < 2; j++)
		for (uint32_t pl = 0; pl < 2; pl++)
			for (uint32_t x = 0; x < ET_BLOCK; x++)
				cr_assert_eq(et_block(&D, 1, pl, db[j])[x], et_pattern(1, pl, 1 + j),
					     "the copy in flight had not landed at the release");
	struct result r;
	et_child_recv(&ch, &r, sizeof(r), "the producer child failed");
	cr_assert(r.status == KVX_CPL_DONE || r.status == KVX_CPL_ABORTED, "P: status %d error %d", r.status,
		  r.error);
	char q = -1;
	et_child_send(&ch, &q, 1);
	et_child_join(&ch, "producer child");
	for (int l = 0; l < ET_NL; l++)
		cr_assert_arr_eq(D.mem[l], snap[l], lb, "layer %d changed after the release", l);
	et_free(&D);
}
