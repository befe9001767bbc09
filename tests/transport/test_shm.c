/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm provider specifics: the connect-time probe refuses a peer that cross-memory attach may
 * not reach, with -EPERM and a message naming the cause and the sysctl; the accept refuses an
 * initiator whose busy word the target may not read, the same way.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/transport.h"

#define NOBODY 65534

static void redirect(void)
{
	cr_redirect_stderr();
}

/* Start of both targets: become NOBODY (dumpable or not as @p dumpable), open an shm context
 * and accept the initiator's blob A from @p sock: blob B in b (len in *bl). Returns the accept's
 * result (-EPROTO when no blob came); exits 2 or 3 when the uid change or the open failed. */
static int32_t target_accept(int sock, int dumpable, struct kvx_xport_ctx **ctx, uint8_t *b, size_t *bl)
{
	if (setresgid(NOBODY, NOBODY, NOBODY) || setresuid(NOBODY, NOBODY, NOBODY))
		_exit(2);
	prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0);
	*ctx = NULL;
	if (kvx_xport_open("shm", NULL, ctx))
		_exit(3);
	uint8_t a[KVX_XPORT_BLOB_MAX];
	ssize_t al = recv(sock, a, sizeof(a), 0);
	struct kvx_xport_ep *ep = NULL;
	*bl = 0;
	return al > 0 ? kvx_xport_ep_accept(*ctx, a, (size_t)al, &ep, b, KVX_XPORT_BLOB_MAX, bl) : -EPROTO;
}

/* Target: an unprivileged, non-dumpable process (ptrace access denied to its peers, as under
 * a restrictive ptrace policy). */
static void target(int sock)
{
	struct kvx_xport_ctx *ctx;
	uint8_t b[KVX_XPORT_BLOB_MAX];
	size_t bl;
	if (target_accept(sock, 0, &ctx, b, &bl))
		_exit(4);
	if (send(sock, b, bl, 0) != (ssize_t)bl)
		_exit(5);
	char x;
	(void)recv(sock, &x, 1, 0); /* until the test is done */
	kvx_xport_close(ctx);
	_exit(0);
}

/* The rig of both tests (root only, else a skip): fork @p fn as the target on sv[1] of a
 * SOCK_SEQPACKET pair; become NOBODY in this process too (dumpable as @p dumpable), open an shm
 * context, create an endpoint and send its blob A to the target. Returns the target's pid;
 * sv[0] stays open (the test's end). */
static pid_t rig_up(void (*fn)(int sock), int dumpable, int sv[2], struct kvx_xport_ctx **ctx,
		    struct kvx_xport_ep **ep)
{
	char reason[KVX_XPORT_REASON_MAX];
	if (kvx_xport_provider_probe("shm", reason, sizeof(reason)))
		cr_skip_test("shm unavailable: %s", reason);
	if (geteuid() != 0)
		cr_skip_test("needs root to drop to an unprivileged uid for both processes");
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		fn(sv[1]);
	}
	close(sv[1]);
	cr_assert_eq(setresgid(NOBODY, NOBODY, NOBODY), 0);
	cr_assert_eq(setresuid(NOBODY, NOBODY, NOBODY), 0);
	cr_assert_eq(prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0), 0);
	*ctx = NULL;
	cr_assert_eq(kvx_xport_open("shm", NULL, ctx), 0);
	uint8_t a[KVX_XPORT_BLOB_MAX];
	size_t al = 0;
	*ep = NULL;
	cr_assert_eq(kvx_xport_ep_create(*ctx, ep, a, sizeof(a), &al), 0);
	cr_assert_eq(send(sv[0], a, al, 0), (ssize_t)al);
	return pid;
}

/* What this process wrote to stderr so far (redirected by .init = redirect), NUL-terminated. */
static void read_log(char *log, size_t cap)
{
	fflush(stderr);
	memset(log, 0, cap);
	FILE *f = cr_get_redirected_stderr();
	size_t n = fread(log, 1, cap - 1, f);
	(void)n;
}

Test(transport_shm, connect_without_ptrace_permission_is_eperm_naming_sysctl, .init = redirect,
     .timeout = 30)
{
	/* The initiator: same uid as the target, no CAP_SYS_PTRACE; dumpable again after the uid
	 * change, so the target may read its busy word at accept (the refusal is one-way). */
	int sv[2];
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	pid_t pid = rig_up(target, 1, sv, &ctx, &ep);
	uint8_t b[KVX_XPORT_BLOB_MAX];
	ssize_t bl = recv(sv[0], b, sizeof(b), 0);
	cr_assert_gt(bl, 0, "target did not answer");
	cr_assert_eq(kvx_xport_ep_connect(ep, b, (size_t)bl), -EPERM);
	char log[2048];
	read_log(log, sizeof(log));
	cr_assert_not_null(strstr(log, "process_vm_readv"), "log: %s", log);
	cr_assert_not_null(strstr(log, "kernel.yama.ptrace_scope"), "log: %s", log);
	kvx_xport_close(ctx);
	close(sv[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "target exit %d", st);
}

/* Target that may read its peers (dumpable, same uid): reports its accept's result. */
static void reading_target(int sock)
{
	struct kvx_xport_ctx *ctx;
	uint8_t b[KVX_XPORT_BLOB_MAX];
	size_t bl;
	int32_t rc = target_accept(sock, 1, &ctx, b, &bl);
	fflush(stderr);
	if (send(sock, &rc, sizeof(rc), 0) != (ssize_t)sizeof(rc))
		_exit(5);
	kvx_xport_close(ctx);
	_exit(0);
}

/* The other direction: the target reads each initiator's busy word (conditional ops,
 * docs/protocol.md §5.11), so an initiator it may not read is refused at accept with -EPERM and
 * a message naming the cause and the sysctl, instead of a connection whose conditional copies
 * the target could never see. */
Test(transport_shm, accept_of_an_initiator_the_target_cannot_read_is_eperm_naming_sysctl, .init = redirect,
     .timeout = 30)
{
	/* The initiator: same uid, not dumpable (ptrace access to it denied). */
	int sv[2];
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	pid_t pid = rig_up(reading_target, 0, sv, &ctx, &ep);
	int32_t rc = 0;
	cr_assert_eq(recv(sv[0], &rc, sizeof(rc), 0), (ssize_t)sizeof(rc), "target did not answer");
	cr_assert_eq(rc, -EPERM, "accept: %d", rc);
	int st = 0;
	waitpid(pid, &st, 0);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "target exit %d", st);
	char log[2048];
	read_log(log, sizeof(log));
	cr_assert_not_null(strstr(log, "busy word"), "log: %s", log);
	cr_assert_not_null(strstr(log, "kernel.yama.ptrace_scope"), "log: %s", log);
	kvx_xport_close(ctx);
	close(sv[0]);
}
