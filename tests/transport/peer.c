/* SPDX-License-Identifier: Apache-2.0 */
#include "peer.h"

#include "kvxfer/mem.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { CMD_REG = 1, CMD_UNREG, CMD_ACCEPT, CMD_FILL, CMD_VERIFY, CMD_COUNTERS, CMD_QUIT, CMD_REACCEPT };
#define PEER_MAX_EPS 64

#define PEER_MAX_REGIONS 64

struct msg {
	uint32_t cmd;
	int32_t rc;
	int32_t idx;
	uint32_t access;
	uint64_t off, len, seed, spos;
	int64_t result;
	uint32_t blob_len;
	uint8_t blob[KVX_XPORT_BLOB_MAX];
	struct kvx_xport_counters cnt;
	char why[KVX_MEM_WHY_LEN];
};

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint8_t pat_byte(uint64_t seed, uint64_t pos)
{
	return (uint8_t)(mix(seed * 0x100000001b3ull + (pos >> 3)) >> (8 * (pos & 7)));
}

void pat_fill(uint8_t *buf, uint64_t len, uint64_t seed, uint64_t pos)
{
	uint64_t i = 0;
	while (i < len && ((pos + i) & 7))
		buf[i] = pat_byte(seed, pos + i), i++;
	for (; i + 8 <= len; i += 8) {
		uint64_t w = mix(seed * 0x100000001b3ull + ((pos + i) >> 3));
		memcpy(buf + i, &w, 8); /* little-endian: byte k = bits 8k.. */
	}
	for (; i < len; i++)
		buf[i] = pat_byte(seed, pos + i);
}

uint64_t pat_check(const uint8_t *buf, uint64_t len, uint64_t seed, uint64_t pos)
{
	uint64_t i = 0;
	while (i < len && ((pos + i) & 7)) {
		if (buf[i] != pat_byte(seed, pos + i))
			return i;
		i++;
	}
	for (; i + 8 <= len; i += 8) {
		uint64_t w = mix(seed * 0x100000001b3ull + ((pos + i) >> 3));
		if (memcmp(buf + i, &w, 8))
			break;
	}
	for (; i < len; i++)
		if (buf[i] != pat_byte(seed, pos + i))
			return i;
	return len;
}

/* ---- target process ---- */

struct child {
	struct kvx_xport_ctx *ctx;
	struct kvx_mem *mem; /* device kinds: regions live there; NULL for host */
	struct kvx_xport_mr *mr[PEER_MAX_REGIONS];
	uint8_t *mem_at[PEER_MAX_REGIONS];
	uint64_t len[PEER_MAX_REGIONS];
	int n;
	struct kvx_xport_ep *ep[PEER_MAX_EPS]; /* accepted endpoints, for CMD_REACCEPT */
	int nep;
};

static void child_free(struct child *c, uint8_t *mem)
{
	if (c->mem)
		kvx_mem_free(c->mem, mem);
	else
		free(mem);
}

/* Device regions are never touched by the CPU: pattern bytes go through a host buffer. */
static int child_fill(struct child *c, int idx, uint64_t off, uint64_t len, uint64_t seed,
		      uint64_t spos)
{
	if (!c->mem) {
		pat_fill(c->mem_at[idx] + off, len, seed, spos);
		return 0;
	}
	uint8_t *tmp = malloc(len ? len : 1);
	if (!tmp)
		return -ENOMEM;
	pat_fill(tmp, len, seed, spos);
	int rc = len ? kvx_mem_copy_sync(c->mem, c->mem_at[idx] + off, tmp, len, KVX_MEM_H2D) : 0;
	free(tmp);
	return rc;
}

static int child_verify(struct child *c, int idx, uint64_t off, uint64_t len, uint64_t seed,
			uint64_t spos, int64_t *result)
{
	if (!c->mem) {
		*result = (int64_t)pat_check(c->mem_at[idx] + off, len, seed, spos);
		return 0;
	}
	uint8_t *tmp = malloc(len ? len : 1);
	if (!tmp)
		return -ENOMEM;
	int rc = len ? kvx_mem_copy_sync(c->mem, tmp, c->mem_at[idx] + off, len, KVX_MEM_D2H) : 0;
	if (!rc)
		*result = (int64_t)pat_check(tmp, len, seed, spos);
	free(tmp);
	return rc;
}

static void child_cmd(struct child *c, struct msg *m)
{
	m->rc = 0;
	switch (m->cmd) {
	case CMD_REG: {
		if (c->n == PEER_MAX_REGIONS) {
			m->rc = -ENOBUFS;
			break;
		}
		uint8_t *mem = NULL;
		if (c->mem) {
			m->rc = kvx_mem_alloc(c->mem, m->len, (void **)&mem);
			if (m->rc)
				break;
		} else {
			mem = aligned_alloc(4096, (m->len + 4095) & ~4095ull);
			if (!mem) {
				m->rc = -ENOMEM;
				break;
			}
		}
		c->mem_at[c->n] = mem;
		c->len[c->n] = m->len;
		m->rc = child_fill(c, c->n, 0, m->len, m->seed, 0);
		struct kvx_mem_type mt = {.kind = KVX_MEM_HOST};
		if (c->mem)
			mt = kvx_mem_get_type(c->mem);
		struct kvx_xport_mr_params rp = {.addr = mem, .len_bytes = m->len, .access = m->access,
						 .mem_type = (enum kvx_xport_mem_type)mt.kind,
						 .device_id = mt.device};
		if (!m->rc)
			m->rc = kvx_xport_mr_register(c->ctx, &rp, &c->mr[c->n]);
		if (m->rc) {
			child_free(c, mem);
			c->mem_at[c->n] = NULL;
			break;
		}
		size_t dl = 0;
		m->rc = kvx_xport_mr_export(c->mr[c->n], m->blob, sizeof(m->blob), &dl);
		m->blob_len = (uint32_t)dl;
		m->idx = c->n++;
		break;
	}
	case CMD_UNREG:
		m->rc = kvx_xport_mr_unregister(c->mr[m->idx]);
		if (!m->rc)
			c->mr[m->idx] = NULL;
		break;
	case CMD_ACCEPT: {
		struct kvx_xport_ep *ep = NULL;
		uint8_t b[KVX_XPORT_BLOB_MAX];
		size_t bl = 0;
		m->rc = kvx_xport_ep_accept(c->ctx, m->blob, m->blob_len, &ep, b, sizeof(b), &bl);
		if (!m->rc) {
			memcpy(m->blob, b, bl);
			m->blob_len = (uint32_t)bl;
			if (c->nep < PEER_MAX_EPS)
				c->ep[c->nep++] = ep;
		}
		break;
	}
	case CMD_REACCEPT: {
		/* Recovery (kvx_xport_ep_reaccept): the newest accepted endpoint first. */
		uint8_t b[KVX_XPORT_BLOB_MAX];
		size_t bl = 0;
		m->rc = -ENOENT;
		for (int i = c->nep - 1; i >= 0 && m->rc; i--)
			m->rc = kvx_xport_ep_reaccept(c->ep[i], m->blob, m->blob_len, b, sizeof(b), &bl);
		if (!m->rc) {
			memcpy(m->blob, b, bl);
			m->blob_len = (uint32_t)bl;
		}
		break;
	}
	case CMD_FILL:
		m->rc = child_fill(c, m->idx, m->off, m->len, m->seed, m->spos);
		break;
	case CMD_VERIFY:
		m->rc = child_verify(c, m->idx, m->off, m->len, m->seed, m->spos, &m->result);
		break;
	case CMD_COUNTERS:
		kvx_xport_ctx_counters(c->ctx, &m->cnt);
		break;
	default:
		m->rc = -EPROTO;
	}
}

static void child_main(int sock, const char *provider, const char *mem,
		       const struct kvx_xport_ctx_params *prm)
{
	struct child c = {0};
	struct msg *m = calloc(1, sizeof(*m));
	struct kvx_mem_type mt;
	int rc = kvx_mem_parse_type(mem, &mt);
	if (!rc && mt.kind != KVX_MEM_HOST) {
		rc = kvx_mem_probe(&mt, m->why, sizeof(m->why));
		if (!rc)
			rc = kvx_mem_open(&mt, &c.mem);
	}
	if (!rc)
		rc = kvx_xport_open(provider, prm, &c.ctx);
	m->rc = rc;
	if (send(sock, m, sizeof(*m), 0) != sizeof(*m) || rc)
		_exit(3);
	uint32_t idle = 0;
	for (;;) {
		int work = kvx_xport_progress(c.ctx);
		idle = work ? 0 : idle + 1;
		/* Look at the command socket every 64 loops, and block briefly on it when idle
		 * for long: an idle policy, not synchronisation (commands wake it at once). */
		if (idle < 4096 && (idle & 63) != 63)
			continue;
		struct pollfd pf = {.fd = sock, .events = POLLIN};
		if (poll(&pf, 1, idle >= 4096 ? 1 : 0) <= 0)
			continue;
		ssize_t n = recv(sock, m, sizeof(*m), 0);
		if (n != (ssize_t)sizeof(*m))
			_exit(4); /* parent gone */
		if (m->cmd == CMD_QUIT)
			break;
		child_cmd(&c, m);
		if (send(sock, m, sizeof(*m), 0) != sizeof(*m))
			_exit(5);
		idle = 0;
	}
	kvx_xport_close(c.ctx);
	for (int i = 0; i < c.n; i++)
		child_free(&c, c.mem_at[i]);
	kvx_mem_close(c.mem);
	m->rc = 0;
	(void)send(sock, m, sizeof(*m), 0);
	free(m);
	_exit(0);
}

/* ---- parent side ---- */

static int rpc(struct peer *p, struct msg *m)
{
	if (send(p->sock, m, sizeof(*m), 0) != sizeof(*m))
		return -errno;
	/* Bounded wait: the target answers within milliseconds unless it is broken. */
	struct pollfd pf = {.fd = p->sock, .events = POLLIN};
	if (poll(&pf, 1, 30000) != 1)
		return -ETIMEDOUT;
	if (recv(p->sock, m, sizeof(*m), 0) != sizeof(*m))
		return -ECONNRESET;
	return 0;
}

int peer_start(struct peer *p, const char *provider, const struct kvx_xport_ctx_params *prm)
{
	return peer_start_mem(p, provider, "host", prm, NULL, 0);
}

int peer_start_mem(struct peer *p, const char *provider, const char *mem,
		   const struct kvx_xport_ctx_params *prm, char *why, size_t why_len)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
		return -errno;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		close(sv[0]);
		child_main(sv[1], provider, mem, prm);
	}
	close(sv[1]);
	p->pid = pid;
	p->sock = sv[0];
	struct msg *m = calloc(1, sizeof(*m));
	struct pollfd pf = {.fd = p->sock, .events = POLLIN};
	int rc = -ETIMEDOUT;
	if (poll(&pf, 1, 30000) == 1)
		rc = recv(p->sock, m, sizeof(*m), 0) == sizeof(*m) ? m->rc : -ECONNRESET;
	if (why && why_len)
		snprintf(why, why_len, "%s", m->why);
	free(m);
	return rc;
}

int peer_reg(struct peer *p, uint64_t len, uint32_t access, uint64_t seed, uint8_t *desc)
{
	struct msg *m = calloc(1, sizeof(*m));
	*m = (struct msg){.cmd = CMD_REG, .len = len, .access = access, .seed = seed};
	int rc = rpc(p, m);
	if (!rc)
		rc = m->rc;
	if (!rc) {
		memcpy(desc, m->blob, KVX_XPORT_RDESC_BYTES);
		rc = m->idx;
	}
	free(m);
	return rc;
}

int peer_unreg(struct peer *p, int idx)
{
	struct msg *m = calloc(1, sizeof(*m));
	*m = (struct msg){.cmd = CMD_UNREG, .idx = idx};
	int rc = rpc(p, m);
	if (!rc)
		rc = m->rc;
	free(m);
	return rc;
}

/* Send blob A with @p cmd (CMD_ACCEPT or CMD_REACCEPT); blob B comes back on success. */
static int blob_rpc(struct peer *p, uint32_t cmd, const uint8_t *a, size_t alen, uint8_t *b, size_t *blen)
{
	struct msg *m = calloc(1, sizeof(*m));
	*m = (struct msg){.cmd = cmd, .blob_len = (uint32_t)alen};
	memcpy(m->blob, a, alen);
	int rc = rpc(p, m);
	if (!rc)
		rc = m->rc;
	if (!rc) {
		memcpy(b, m->blob, m->blob_len);
		*blen = m->blob_len;
	}
	free(m);
	return rc;
}

int peer_accept(struct peer *p, const uint8_t *a, size_t alen, uint8_t *b, size_t *blen)
{
	return blob_rpc(p, CMD_ACCEPT, a, alen, b, blen);
}

int peer_reaccept(struct peer *p, const uint8_t *a, size_t alen, uint8_t *b, size_t *blen)
{
	return blob_rpc(p, CMD_REACCEPT, a, alen, b, blen);
}

int peer_fill(struct peer *p, int idx, uint64_t off, uint64_t len, uint64_t seed, uint64_t spos)
{
	struct msg *m = calloc(1, sizeof(*m));
	*m = (struct msg){.cmd = CMD_FILL, .idx = idx, .off = off, .len = len, .seed = seed,
			  .spos = spos};
	int rc = rpc(p, m);
	if (!rc)
		rc = m->rc;
	free(m);
	return rc;
}

int64_t peer_verify(struct peer *p, int idx, uint64_t off, uint64_t len, uint64_t seed,
		    uint64_t spos)
{
	struct msg *m = calloc(1, sizeof(*m));
	*m = (struct msg){.cmd = CMD_VERIFY, .idx = idx, .off = off, .len = len, .seed = seed,
			  .spos = spos};
	int rc = rpc(p, m);
	int64_t r = rc ? rc : m->rc ? m->rc : m->result;
	free(m);
	return r;
}

int peer_counters(struct peer *p, struct kvx_xport_counters *out)
{
	struct msg *m = calloc(1, sizeof(*m));
	m->cmd = CMD_COUNTERS;
	int rc = rpc(p, m);
	if (!rc)
		*out = m->cnt;
	free(m);
	return rc;
}

void peer_stop(struct peer *p)
{
	kill(p->pid, SIGSTOP);
}

void peer_kill(struct peer *p)
{
	if (p->pid <= 0)
		return;
	kill(p->pid, SIGKILL);
	waitpid(p->pid, NULL, 0);
	p->pid = -1;
	close(p->sock);
	p->sock = -1;
}

int peer_quit(struct peer *p)
{
	if (p->pid <= 0)
		return -1;
	struct msg *m = calloc(1, sizeof(*m));
	m->cmd = CMD_QUIT;
	int rc = rpc(p, m);
	free(m);
	int st = 0;
	waitpid(p->pid, &st, 0);
	close(p->sock);
	p->pid = -1;
	if (rc)
		return rc;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void skip_unless_available(const char *provider)
{
	char reason[KVX_XPORT_REASON_MAX];
	int rc = kvx_xport_provider_probe(provider, reason, sizeof(reason));
	if (rc)
		cr_skip_test("%s unavailable: %s (%s)", provider, reason, kvx_strerror(rc));
}
