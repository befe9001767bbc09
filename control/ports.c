/* SPDX-License-Identifier: Apache-2.0 */
/* Ports, ranks and addresses (docs/protocol.md §2.1, §2.2, §3.4, §3.5, §4.5). Pure functions. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int kvx_ctl_port_offset(enum kvx_ctl_port_mode mode, uint32_t dp_local, uint32_t tp_rank,
			uint32_t tp_size, uint32_t *offset)
{
	if (!offset || tp_size == 0 || dp_local > 65535 || tp_rank > 65535)
		return -EINVAL;
	uint64_t off;
	if (mode == KVX_CTL_PORT_INJECTIVE) {
		if (tp_rank >= tp_size)
			return -EINVAL;
		off = (uint64_t)dp_local * tp_size + tp_rank;
	} else if (mode == KVX_CTL_PORT_VLLM) {
		off = (uint64_t)dp_local + tp_rank;
	} else {
		return -EINVAL;
	}
	if (off > 65535)
		return -EINVAL;
	*offset = (uint32_t)off;
	return 0;
}

int kvx_ctl_port(enum kvx_ctl_port_mode mode, uint16_t base, uint32_t dp_local, uint32_t tp_rank,
		 uint32_t tp_size, uint16_t *port)
{
	uint32_t off;
	if (!port || base == 0)
		return -EINVAL;
	int rc = kvx_ctl_port_offset(mode, dp_local, tp_rank, tp_size, &off);
	if (rc)
		return rc;
	if ((uint32_t)base + off > 65535)
		return -EINVAL;
	*port = (uint16_t)(base + off);
	return 0;
}

uint32_t kvx_ctl_fold_local_rank(uint32_t g, uint32_t dp_local)
{
	return dp_local ? g % dp_local : g;
}

uint32_t kvx_ctl_pod_index(uint32_t g, uint32_t dp_local)
{
	return dp_local ? g / dp_local : 0;
}

int kvx_ctl_remote_tp_rank(uint32_t local_rank, uint32_t local_size, uint32_t remote_size,
			   uint32_t *out, char *err, size_t err_len)
{
	if (!out)
		return -EINVAL;
	if (local_size == 0) {
		kvx_ctl_seterr(err, err_len, "local tp size must be positive");
		return -EINVAL;
	}
	if (remote_size == 0)
		remote_size = local_size;
	if (local_rank >= local_size) {
		kvx_ctl_seterr(err, err_len, "tp rank %u out of range [0, %u)", local_rank,
			       local_size);
		return -EINVAL;
	}
	if (remote_size == local_size) {
		*out = local_rank;
	} else if (remote_size > local_size) {
		if (remote_size % local_size) {
			kvx_ctl_seterr(err, err_len,
				       "remote tp size %u must be a multiple of local tp size %u",
				       remote_size, local_size);
			return -EINVAL;
		}
		*out = local_rank * (remote_size / local_size);
	} else {
		if (local_size % remote_size) {
			kvx_ctl_seterr(err, err_len,
				       "local tp size %u must be a multiple of remote tp size %u",
				       local_size, remote_size);
			return -EINVAL;
		}
		*out = local_rank / (local_size / remote_size);
	}
	return 0;
}

int kvx_ctl_expected_acks(uint32_t p_tp, uint32_t c_tp, uint32_t *out)
{
	if (!out || p_tp == 0 || c_tp == 0)
		return -EINVAL;
	if (c_tp <= p_tp) {
		*out = 1;
		return 0;
	}
	if (c_tp % p_tp)
		return -EINVAL;
	*out = c_tp / p_tp;
	return 0;
}

uint32_t kvx_ctl_peer_tp_size(int64_t remote_tp_size, int64_t tp_size, uint32_t local_tp_size)
{
	if (remote_tp_size > 0 && remote_tp_size <= UINT32_MAX)
		return (uint32_t)remote_tp_size;
	if (tp_size > 0 && tp_size <= UINT32_MAX)
		return (uint32_t)tp_size;
	return local_tp_size;
}

void kvx_ctl_dp_target(uint32_t dp_rank, uint32_t dp_size_local, const char *const *hosts,
		       uint32_t num_hosts, const char *fallback_host, const char **host,
		       uint32_t *local_rank)
{
	uint32_t pod = kvx_ctl_pod_index(dp_rank, dp_size_local);
	*host = (hosts && pod < num_hosts && hosts[pod] && hosts[pod][0]) ? hosts[pod]
									   : fallback_host;
	*local_rank = kvx_ctl_fold_local_rank(dp_rank, dp_size_local);
}

/* Copy s[0..n) trimmed of ASCII whitespace into a view. */
static void trim(const char **s, size_t *n)
{
	while (*n && isspace((unsigned char)**s))
		(*s)++, (*n)--;
	while (*n && isspace((unsigned char)(*s)[*n - 1]))
		(*n)--;
}

static int parse_port(const char *s, size_t n, uint16_t *out)
{
	trim(&s, &n);
	if (n == 0 || n > 5)
		return -EINVAL;
	uint32_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (uint32_t)(s[i] - '0');
	}
	if (v == 0 || v > 65535)
		return -EINVAL;
	*out = (uint16_t)v;
	return 0;
}

int kvx_ctl_zmq_address_parse(const char *s, size_t len, struct kvx_ctl_addr *out, char *err,
			      size_t err_len)
{
	if (!s || !out)
		return -EINVAL;
	struct kvx_ctl_addr a;
	int have_host = 0, have_hs = 0, have_nt = 0;
	size_t pos = 0;
	memset(&a, 0, sizeof(a));
	while (pos <= len) {
		const char *seg = s + pos;
		const char *comma = memchr(seg, ',', len - pos);
		size_t n = comma ? (size_t)(comma - seg) : len - pos;
		pos += n + 1;
		const char *colon = memchr(seg, ':', n);
		if (!colon) {
			trim(&seg, &n);
			if (n == 0)
				continue;
			kvx_ctl_seterr(err, err_len, "Malformed zmq_address: segment without ':'");
			return -EINVAL;
		}
		const char *k = seg, *v = colon + 1;
		size_t kn = (size_t)(colon - seg), vn = n - kn - 1;
		trim(&k, &kn);
		trim(&v, &vn);
		if (kn == 4 && !memcmp(k, "host", 4)) {
			if (vn == 0 || vn > KVX_CTL_HOST_MAX || memchr(v, 0, vn)) {
				kvx_ctl_seterr(err, err_len, "Malformed zmq_address: bad host");
				return -EINVAL;
			}
			memcpy(a.host, v, vn);
			a.host[vn] = 0;
			have_host = 1;
		} else if (kn == 9 && !memcmp(k, "handshake", 9)) {
			if (parse_port(v, vn, &a.handshake_port)) {
				kvx_ctl_seterr(err, err_len,
					       "Malformed zmq_address: handshake port is not 1..65535");
				return -EINVAL;
			}
			have_hs = 1;
		} else if (kn == 6 && !memcmp(k, "notify", 6)) {
			if (parse_port(v, vn, &a.notify_port)) {
				kvx_ctl_seterr(err, err_len,
					       "Malformed zmq_address: notify port is not 1..65535");
				return -EINVAL;
			}
			have_nt = 1;
		}
		if (!comma)
			break;
	}
	if (!have_host || !have_hs || !have_nt) {
		kvx_ctl_seterr(err, err_len, "Malformed zmq_address: missing '%s'",
			       !have_host ? "host" : !have_hs ? "handshake" : "notify");
		return -EINVAL;
	}
	*out = a;
	return 0;
}

static int fmt_result(int n, size_t cap)
{
	if (n < 0)
		return -EINVAL;
	if ((size_t)n >= cap)
		return -EMSGSIZE;
	return n;
}

int kvx_ctl_zmq_address_format(const struct kvx_ctl_addr *a, char *buf, size_t cap)
{
	if (!a || !buf)
		return -EINVAL;
	return fmt_result(snprintf(buf, cap, "host:%s,handshake:%u,notify:%u", a->host,
				   a->handshake_port, a->notify_port),
			  cap);
}

int kvx_ctl_zmq_path(const char *host, uint16_t port, char *buf, size_t cap)
{
	if (!host || !host[0] || !port || !buf)
		return -EINVAL;
	int v6 = strchr(host, ':') != NULL && host[0] != '[';
	return fmt_result(snprintf(buf, cap, v6 ? "tcp://[%s]:%u" : "tcp://%s:%u", host, port), cap);
}

static int copy_out(const char *s, size_t n, char *buf, size_t cap)
{
	if (!buf || n >= cap || n > INT32_MAX)
		return -EMSGSIZE;
	memcpy(buf, s, n);
	buf[n] = 0;
	return (int)n;
}

static const char P_TAG[] = "___prefill_addr_";
static const char D_TAG[] = "___decode_addr_";

int kvx_ctl_reqid_prefill_addr(const char *rid, char *buf, size_t cap)
{
	if (!rid)
		return -EINVAL;
	const char *p = strstr(rid, P_TAG);
	if (!p)
		return -ENOENT;
	p += sizeof(P_TAG) - 1;
	/* Non-greedy `(.+?)`: the first ___decode_addr_ after at least one character. */
	const char *d = p[0] ? strstr(p + 1, D_TAG) : NULL;
	if (!d)
		return -ENOENT;
	return copy_out(p, (size_t)(d - p), buf, cap);
}

static int is_lhex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static int is_hex(char c)
{
	return is_lhex(c) || (c >= 'A' && c <= 'F');
}

int kvx_ctl_reqid_decode_addr(const char *rid, char *buf, size_t cap)
{
	if (!rid)
		return -EINVAL;
	/* re.search: try each ___decode_addr_ occurrence from the left; for one start, the
	 * greedy (.+) takes the LAST '_' followed by 32 lowercase hex and then end or '-'. */
	size_t len = strlen(rid);
	for (const char *s = strstr(rid, D_TAG); s; s = strstr(s + 1, D_TAG)) {
		const char *g = s + sizeof(D_TAG) - 1;
		for (const char *u = rid + len; u-- > g + 1;) {
			if (*u != '_' || (size_t)(rid + len - u) < 33)
				continue;
			int ok = 1;
			for (int i = 1; i <= 32 && ok; i++)
				ok = is_lhex(u[i]);
			if (ok && (u[33] == 0 || u[33] == '-'))
				return copy_out(g, (size_t)(u - g), buf, cap);
		}
	}
	return -ENOENT;
}

int kvx_ctl_reqid_format(const char *p_addr, const char *d_addr, const char *hex32, char *buf,
			 size_t cap)
{
	if (!p_addr || !d_addr || !hex32 || !buf)
		return -EINVAL;
	if (strlen(hex32) != 32)
		return -EINVAL;
	for (int i = 0; i < 32; i++)
		if (!is_lhex(hex32[i]))
			return -EINVAL;
	return fmt_result(snprintf(buf, cap, "%s%s%s%s_%s", P_TAG, p_addr, D_TAG, d_addr, hex32),
			  cap);
}

int kvx_ctl_reqid_strip_suffix(const char *rid, char *buf, size_t cap)
{
	if (!rid)
		return -EINVAL;
	size_t n = strlen(rid);
	if (n >= 10 && rid[n - 9] == '-') {
		int ok = 1;
		for (size_t i = n - 8; i < n && ok; i++)
			ok = is_hex(rid[i]);
		if (ok)
			return copy_out(rid, n - 9, buf, cap);
	}
	return copy_out(rid, n, buf, cap);
}

int kvx_ctl_engine_key(enum kvx_ctl_role role, const char *ip, uint16_t hs_base, uint32_t tp_rank,
		       uint32_t dp_rank, char *buf, size_t cap)
{
	if (!ip || !buf)
		return -EINVAL;
	return fmt_result(snprintf(buf, cap, "%s:%s:%u:tp%u:dp%u",
				   role == KVX_CTL_ROLE_PRODUCER ? "producer" : "consumer", ip,
				   hs_base, tp_rank, dp_rank),
			  cap);
}
