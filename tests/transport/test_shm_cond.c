/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Conditional ops of the shm provider (kvx_xport_post_bulk_cond(), docs/protocol.md §5.11):
 * there is no target thread, so the initiator checks the owner's word before each copy and
 * shows the copy in its busy word, which the owner reads (kvx_xport_ctx_cond_busy()).
 *  - against a real target process (tests/transport/peer.c): a WRITE / READ whose word differs
 *    fails -ESTALE and no byte moves (target region and local buffer byte for byte); posts
 *    under two conditions in one group are checked each on its own; a word changed by the
 *    target fails the next copy;
 *  - in one process, a copy held inside process_vm_writev by a userfaultfd page: while it is
 *    in flight the owner sees the busy word (before and after it revokes the word), once it
 *    returned it does not, and the next copy finds the revocation and moves nothing. The copy
 *    is held and let go by the test (the uffd fault event, UFFDIO_COPY): no sleeps.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvxfer/common.h"
#include "kvxfer/transport.h"
#include "peer.h"
#include "xport_test_util.h"

#define SEED_R 21u   /* the target region's original bytes */
#define SEED_W 22u   /* what the initiator writes */
#define SEED_L 23u   /* the word region */
#define SEED_REV 24u /* the word region after the "revocation" */
#define POISON 0x5a

static void post1(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, struct kvx_xport_mr *l,
		  struct kvx_xport_rmr *rm, uint64_t off, uint64_t len, uint64_t cookie,
		  const struct kvx_xport_cond *cond)
{
	struct kvx_xport_op op = {.lmr = l, .rmr = rm, .loff = off, .roff = off, .len = len};
	cr_assert_eq(kvx_xport_post_bulk_cond(ep, opc, &op, 1, cookie, cond), 0);
}

TestSuite(transport_shm_cond, .timeout = 120);

Test(transport_shm_cond, stale_word_moves_no_byte_each_post_checks_its_own_word)
{
	skip_unless_available("shm");
	struct kvx_xport_ctx_params p;
	kvx_xport_ctx_params_init(&p);
	struct peer pe;
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	cond_rig_connect(&pe, "shm", &p, &ctx, &ep);
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	const uint64_t len = 3 * 65536 + 100;
	int ri = peer_reg(&pe, len, KVX_XPORT_ACCESS_ALL, SEED_R, d);
	cr_assert_geq(ri, 0);
	struct kvx_xport_rmr *rm = NULL, *lw = NULL;
	cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &rm), 0);
	int li = peer_reg(&pe, 4096, KVX_XPORT_ACCESS_REMOTE_READ, SEED_L, d);
	cr_assert_geq(li, 0);
	cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &lw), 0);
	uint8_t *m;
	struct kvx_xport_mr *lm = local_mr(ctx, &m, len);
	struct kvx_xport_cond ok = {.rmr = lw, .roff = 64, .expect = word_of(SEED_L, 64)};
	struct kvx_xport_cond bad = ok;
	bad.expect ^= 1ull << 40;

	/* A WRITE whose word differs: -ESTALE, not one byte at the target. */
	pat_fill(m, len, SEED_W, 0);
	post1(ep, KVX_XPORT_OP_WRITE, lm, rm, 0, len, 1, &bad);
	struct kvx_xport_cpl c = wait_cpl(ep);
	cr_assert_eq(c.cookie, 1);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(c.bytes, 0);
	cr_assert_eq(peer_verify(&pe, ri, 0, len, SEED_R, 0), (int64_t)len, "a stale WRITE changed the target");
	/* A READ whose word differs: -ESTALE, the local buffer keeps its poison. */
	memset(m, POISON, len);
	post1(ep, KVX_XPORT_OP_READ, lm, rm, 0, len, 2, &bad);
	c = wait_cpl(ep);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	for (uint64_t i = 0; i < len; i++)
		cr_assert_eq(m[i], POISON, "a stale READ wrote local byte %llu", (unsigned long long)i);

	/* Posted back to back (one pending group per condition, in post order): a post whose word
	 * holds, one whose word differs, one without a condition. Each gets its own outcome. */
	const uint64_t q = 65536;
	pat_fill(m, len, SEED_W, 0);
	post1(ep, KVX_XPORT_OP_WRITE, lm, rm, 0, q, 3, &ok);
	post1(ep, KVX_XPORT_OP_WRITE, lm, rm, q, q, 4, &bad);
	struct kvx_xport_op op = {.lmr = lm, .rmr = rm, .loff = 2 * q, .roff = 2 * q, .len = q};
	cr_assert_eq(kvx_xport_post_bulk(ep, KVX_XPORT_OP_WRITE, &op, 1, 5), 0);
	int want[3] = {0, -ESTALE, 0};
	for (int i = 0; i < 3; i++) {
		c = wait_cpl(ep);
		cr_assert_eq(c.cookie, (uint64_t)(3 + i), "completions in post order");
		cr_assert_eq(c.status, want[i], "post %d: status %d", 3 + i, c.status);
		cr_assert_eq(c.bytes, want[i] ? 0 : q);
	}
	cr_assert_eq(peer_verify(&pe, ri, 0, q, SEED_W, 0), (int64_t)q);
	cr_assert_eq(peer_verify(&pe, ri, q, q, SEED_R, q), (int64_t)q, "the stale post moved bytes");
	cr_assert_eq(peer_verify(&pe, ri, 2 * q, q, SEED_W, 2 * q), (int64_t)q);
	cr_assert_eq(peer_verify(&pe, ri, 3 * q, len - 3 * q, SEED_R, 3 * q), (int64_t)(len - 3 * q));

	/* The target changes the word: the next copy under the old value moves nothing. */
	cr_assert_eq(peer_fill(&pe, li, 64, 8, SEED_REV, 64), 0);
	pat_fill(m, len, SEED_W + 100, 0);
	post1(ep, KVX_XPORT_OP_WRITE, lm, rm, 0, len, 6, &ok);
	c = wait_cpl(ep);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	cr_assert_eq(peer_verify(&pe, ri, 0, q, SEED_W, 0), (int64_t)q);
	cr_assert_eq(peer_verify(&pe, ri, q, q, SEED_R, q), (int64_t)q);
	kvx_xport_close(ctx);
	free(m);
	cr_assert_eq(peer_quit(&pe), 0, "target process did not exit cleanly");
}

/* In-process rig: the owner context accepts, the initiator context posts from a thread whose
 * copy faults on a userfaultfd page of the owner's region. */
struct held {
	struct kvx_xport_ep *ep;
	struct kvx_xport_cpl cpl;
};

static void *poll_thread(void *arg)
{
	struct held *h = arg;
	struct kvx_xport_cpl c;
	int n;
	while ((n = kvx_xport_poll_burst(h->ep, &c, 1)) == 0)
		; /* the first poll moves the group and returns its completion */
	h->cpl = c;
	return NULL;
}

Test(transport_shm_cond, owner_sees_copy_in_flight_until_it_returns_then_later_copy_is_stale)
{
	skip_unless_available("shm");
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK); /* poll() needs it */
	if (uffd < 0)
		cr_skip_test("userfaultfd unavailable (%s): cannot hold a copy in flight", strerror(errno));
	struct uffdio_api api = {.api = UFFD_API};
	cr_assert_eq(ioctl(uffd, UFFDIO_API, &api), 0);
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	struct kvx_xport_ctx *own = NULL, *ini = NULL;
	cr_assert_eq(kvx_xport_open("shm", NULL, &own), 0);
	cr_assert_eq(kvx_xport_open("shm", NULL, &ini), 0);
	/* Owner memory: blocks (page 0 present, page 1 missing under uffd) and the lease word. */
	uint8_t *blk = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(blk, MAP_FAILED);
	memset(blk, POISON, pg);
	struct uffdio_register reg = {.range = {.start = (uintptr_t)(blk + pg), .len = pg},
				      .mode = UFFDIO_REGISTER_MODE_MISSING};
	cr_assert_eq(ioctl(uffd, UFFDIO_REGISTER, &reg), 0);
	_Atomic uint64_t *word = aligned_alloc(4096, 4096);
	cr_assert_not_null(word);
	const uint64_t W = 0x1234567800000007ull;
	atomic_store(word, W);
	struct kvx_xport_mr_params mp = {.addr = blk, .len_bytes = 2 * pg, .access = KVX_XPORT_ACCESS_ALL,
					 .mem_type = KVX_XPORT_MEM_HOST};
	struct kvx_xport_mr *bmr = NULL, *wmr = NULL;
	cr_assert_eq(kvx_xport_mr_register(own, &mp, &bmr), 0);
	mp.addr = (void *)word;
	mp.len_bytes = 4096;
	mp.access = KVX_XPORT_ACCESS_REMOTE_READ;
	cr_assert_eq(kvx_xport_mr_register(own, &mp, &wmr), 0);

	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al = 0, bl = 0;
	struct kvx_xport_ep *ep = NULL, *tep = NULL;
	cr_assert_eq(kvx_xport_ep_create(ini, &ep, a, sizeof(a), &al), 0);
	cr_assert_eq(kvx_xport_ep_accept(own, a, al, &tep, b, sizeof(b), &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl), 0);
	struct kvx_xport_rmr *rb = NULL, *rw = NULL;
	cr_assert_eq(kvx_xport_mr_export(bmr, d, sizeof(d), NULL), 0);
	cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &rb), 0);
	cr_assert_eq(kvx_xport_mr_export(wmr, d, sizeof(d), NULL), 0);
	cr_assert_eq(kvx_xport_rmr_import(ep, d, sizeof(d), &rw), 0);
	uint8_t *m;
	struct kvx_xport_mr *lm = local_mr(ini, &m, 2 * pg);
	pat_fill(m, 2 * pg, SEED_W, 0);
	struct kvx_xport_cond cond = {.rmr = rw, .roff = 0, .expect = W};

	cr_assert_eq(kvx_xport_ctx_cond_busy(own, W), 0, "busy before any copy");
	post1(ep, KVX_XPORT_OP_WRITE, lm, rb, 0, 2 * pg, 1, &cond);
	struct held h = {.ep = ep};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, poll_thread, &h), 0);
	/* The copy reaches the missing page and waits for us inside process_vm_writev. */
	struct uffd_msg msg;
	struct pollfd pf = {.fd = uffd, .events = POLLIN};
	cr_assert_eq(poll(&pf, 1, 30000), 1, "the copy never reached the held page");
	cr_assert_eq(read(uffd, &msg, sizeof(msg)), (ssize_t)sizeof(msg));
	cr_assert_eq(msg.event, UFFD_EVENT_PAGEFAULT);
	cr_assert_eq(msg.arg.pagefault.address & ~(uint64_t)(pg - 1), (uint64_t)(uintptr_t)(blk + pg));
	cr_assert_eq(kvx_xport_ctx_cond_busy(own, W), 1, "a copy in flight is not shown");
	cr_assert_eq(kvx_xport_ctx_cond_busy(own, W + 1), 0, "busy under another generation");
	/* Revoke (a tombstone, as runtime/lease.c does): the copy that passed its check before is
	 * still in flight, so the owner must still see it. */
	atomic_store(word, W & ~0xffffull);
	cr_assert_eq(kvx_xport_ctx_cond_busy(own, W), 1, "the revocation hid a copy in flight");
	/* Let it finish: it moves its whole op (it passed its check before the revocation). */
	uint8_t *src = aligned_alloc(pg, pg);
	memset(src, 0, pg);
	struct uffdio_copy cp = {.dst = (uintptr_t)(blk + pg), .src = (uintptr_t)src, .len = pg};
	cr_assert_eq(ioctl(uffd, UFFDIO_COPY, &cp), 0);
	cr_assert_eq(pthread_join(th, NULL), 0);
	cr_assert_eq(h.cpl.status, 0, "status %d", h.cpl.status);
	cr_assert_eq(h.cpl.bytes, 2 * pg);
	cr_assert_eq(pat_check(blk, 2 * pg, SEED_W, 0), 2 * pg);
	cr_assert_eq(kvx_xport_ctx_cond_busy(own, W), 0, "busy after the copy returned");
	/* The blocks are the owner's again: a later copy under W moves nothing. */
	memset(blk, POISON, 2 * pg);
	post1(ep, KVX_XPORT_OP_WRITE, lm, rb, 0, 2 * pg, 2, &cond);
	struct kvx_xport_cpl c = wait_cpl(ep);
	cr_assert_eq(c.status, -ESTALE, "status %d", c.status);
	for (size_t i = 0; i < 2 * pg; i++)
		cr_assert_eq(blk[i], POISON, "a stale copy wrote byte %zu", i);
	cr_assert_eq(kvx_xport_ctx_cond_busy(own, W), 0);
	cr_assert_eq(kvx_xport_ctx_cond_busy(own, 0), -EINVAL);
	kvx_xport_close(ini);
	kvx_xport_close(own);
	close(uffd);
	munmap(blk, 2 * pg);
	free(src);
	free((void *)word);
	free(m);
}
