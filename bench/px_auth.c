/* SPDX-License-Identifier: Apache-2.0 */
/* Authenticated out-of-band channel of kvxfer-perf bw/lat (protocol in px_auth.h). */
#include "px_auth.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <sodium.h>
#include <zmq.h>

#include "kvxfer/common.h"
#include "kvxfer/internal/ctl.h"

#define HELLO_MAGIC "KXPA"
#define HELLO_VERSION 1
#define CONFIRM_C "kvxfer-perf px-auth v1 client"
#define CONFIRM_S "kvxfer-perf px-auth v1 server"
#define CONFIRM_LEN 29

struct hello {
	char magic[4];
	uint8_t version, zero[3];
	uint32_t total; /* bytes on the wire, this struct and zero padding (little endian) */
	uint8_t pk[32];
	uint8_t rnd[32];
};
#define HELLO_MAX (1u << 20)

struct px_auth {
	uint8_t k_tx[32], k_rx[32]; /* per-direction secretbox keys */
	uint64_t n_tx, n_rx;        /* per-direction message counters (the nonces) */
	uint8_t *box;               /* scratch: largest message + MAC */
	size_t boxlen;
};

/* Whole-buffer I/O; reads wait at most until @p deadline (0 = no limit). */
static int io_all(int fd, void *buf, size_t n, int tx, uint64_t deadline)
{
	uint8_t *p = buf;
	while (n) {
		if (!tx && deadline) {
			uint64_t now = kvx_now_ns();
			if (now >= deadline)
				return -ETIMEDOUT;
			struct pollfd pf = {.fd = fd, .events = POLLIN};
			int ms = (int)((deadline - now + 999999) / 1000000);
			int r = poll(&pf, 1, ms);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return -errno;
			if (r == 0)
				return -ETIMEDOUT;
		}
		ssize_t k = tx ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
		if (k <= 0) {
			if (k < 0 && errno == EINTR)
				continue;
			return k == 0 ? -ECONNRESET : -errno;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static void nonce_of(uint64_t n, uint8_t out[crypto_secretbox_NONCEBYTES])
{
	memset(out, 0, crypto_secretbox_NONCEBYTES);
	for (int i = 0; i < 8; i++)
		out[i] = (uint8_t)(n >> (8 * i));
}

static int grow(struct px_auth *a, size_t n)
{
	if (a->boxlen >= n + crypto_secretbox_MACBYTES)
		return 0;
	uint8_t *b = realloc(a->box, n + crypto_secretbox_MACBYTES);
	if (!b)
		return -ENOMEM;
	a->box = b;
	a->boxlen = n + crypto_secretbox_MACBYTES;
	return 0;
}

int px_auth_send(struct px_auth *a, int fd, const void *buf, size_t n)
{
	uint8_t nonce[crypto_secretbox_NONCEBYTES];
	int rc = grow(a, n);
	if (rc)
		return rc;
	nonce_of(a->n_tx++, nonce);
	crypto_secretbox_easy(a->box, buf, n, nonce, a->k_tx);
	return io_all(fd, a->box, n + crypto_secretbox_MACBYTES, 1, 0);
}

static int recv_sealed(struct px_auth *a, int fd, void *buf, size_t n, uint64_t deadline)
{
	uint8_t nonce[crypto_secretbox_NONCEBYTES];
	int rc = grow(a, n);
	if (rc || (rc = io_all(fd, a->box, n + crypto_secretbox_MACBYTES, 0, deadline)))
		return rc;
	nonce_of(a->n_rx++, nonce);
	return crypto_secretbox_open_easy(buf, a->box, n + crypto_secretbox_MACBYTES, nonce, a->k_rx) ? -EBADMSG : 0;
}

int px_auth_recv(struct px_auth *a, int fd, void *buf, size_t n)
{
	return recv_sealed(a, fd, buf, n, 0);
}

void px_auth_free(struct px_auth *a)
{
	if (!a)
		return;
	free(a->box);
	sodium_memzero(a, sizeof(*a));
	free(a);
}

static int send_hello(int fd, const uint8_t pk[32], uint8_t rnd[32], size_t pad)
{
	size_t total = pad > sizeof(struct hello) ? pad : sizeof(struct hello);
	uint8_t *b = calloc(1, total);
	if (!b)
		return -ENOMEM;
	struct hello h = {.version = HELLO_VERSION};
	memcpy(h.magic, HELLO_MAGIC, 4);
	for (int i = 0; i < 4; i++)
		((uint8_t *)&h.total)[i] = (uint8_t)(total >> (8 * i));
	memcpy(h.pk, pk, 32);
	randombytes_buf(rnd, 32);
	memcpy(h.rnd, rnd, 32);
	memcpy(b, &h, sizeof(h));
	int rc = io_all(fd, b, total, 1, 0);
	free(b);
	return rc;
}

/* Read a hello: the fixed part, then its padding (discarded). */
static int recv_hello(int fd, struct hello *h, uint64_t deadline)
{
	int rc = io_all(fd, h, sizeof(*h), 0, deadline);
	if (rc)
		return rc;
	const uint8_t *t = (const uint8_t *)&h->total;
	uint32_t total = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
	if (memcmp(h->magic, HELLO_MAGIC, 4) || h->version != HELLO_VERSION || total < sizeof(*h) ||
	    total > HELLO_MAX)
		return -EPROTO;
	uint8_t junk[512];
	for (size_t left = total - sizeof(*h); left && !rc;) {
		size_t n = left < sizeof(junk) ? left : sizeof(junk);
		rc = io_all(fd, junk, n, 0, deadline);
		left -= n;
	}
	return rc;
}

/* Step 3: directional keys from the kx session keys and both random strings. */
static void derive(struct px_auth *a, const uint8_t rx[32], const uint8_t tx[32], const uint8_t rnd_c[32],
		   const uint8_t rnd_s[32])
{
	uint8_t in[64];
	memcpy(in, rnd_c, 32);
	memcpy(in + 32, rnd_s, 32);
	crypto_generichash(a->k_rx, 32, in, sizeof(in), rx, 32);
	crypto_generichash(a->k_tx, 32, in, sizeof(in), tx, 32);
}

static int confirm(struct px_auth *a, int fd, bool client, uint64_t deadline)
{
	char got[CONFIRM_LEN];
	int rc;
	if (client && (rc = px_auth_send(a, fd, CONFIRM_C, CONFIRM_LEN)))
		return rc;
	if ((rc = recv_sealed(a, fd, got, CONFIRM_LEN, deadline)))
		return rc;
	if (memcmp(got, client ? CONFIRM_S : CONFIRM_C, CONFIRM_LEN))
		return -EBADMSG;
	return client ? 0 : px_auth_send(a, fd, CONFIRM_S, CONFIRM_LEN);
}

static void key_z85(const uint8_t k[32], char z[41])
{
	if (!zmq_z85_encode(z, k, 32))
		snprintf(z, 41, "?");
}

int px_auth_client(int fd, const char *dir, size_t pad, uint64_t timeout_ns, struct px_auth **out, char *err,
		   size_t len)
{
	uint8_t pk[32], sk[32], rnd_c[32], rx[32], tx[32];
	struct hello hs;
	struct px_auth *a = NULL;
	uint64_t deadline = timeout_ns ? kvx_now_ns() + timeout_ns : 0;
	int rc = sodium_init() < 0 ? -EIO : kvx_ctl_auth_keypair(dir, pk, sk);
	if (rc) {
		snprintf(err, len, "--auth-dir %s: cannot read this side's key pair: %s", dir, kvx_strerror(rc));
		goto out;
	}
	if ((rc = send_hello(fd, pk, rnd_c, pad)) || (rc = recv_hello(fd, &hs, deadline))) {
		if (rc == -ECONNRESET || rc == -EPIPE)
			snprintf(err, len, "the server closed the connection during authentication: it refused "
					   "this side's key (copy %s/engine.key into its allowed/), or it runs "
					   "without --auth-dir", dir);
		else if (rc == -EPROTO)
			snprintf(err, len, "the server did not answer with an authentication hello (it runs "
					   "without --auth-dir?)");
		else
			snprintf(err, len, "authentication hello: %s", kvx_strerror(rc));
		goto out;
	}
	if ((rc = kvx_ctl_auth_allowed(dir, hs.pk, NULL, 0))) {
		char z[41];
		key_z85(hs.pk, z);
		if (rc == -EACCES)
			snprintf(err, len, "the server's public key %s is not in %s/allowed/", z, dir);
		else
			snprintf(err, len, "%s/allowed/: %s", dir, kvx_strerror(rc));
		goto out;
	}
	if (crypto_kx_client_session_keys(rx, tx, pk, sk, hs.pk)) {
		rc = -EBADMSG;
		snprintf(err, len, "the server's public key is not a valid X25519 key");
		goto out;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		rc = -ENOMEM;
		goto out;
	}
	derive(a, rx, tx, rnd_c, hs.rnd);
	if ((rc = confirm(a, fd, true, deadline)))
		snprintf(err, len, "the server failed key confirmation (%s): it does not hold the secret key of the "
				   "public key it sent", kvx_strerror(rc));
out:
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(rx, sizeof(rx));
	sodium_memzero(tx, sizeof(tx));
	if (rc) {
		px_auth_free(a);
		return rc;
	}
	*out = a;
	return 0;
}

int px_auth_server(int fd, const char *dir, uint64_t timeout_ns, struct px_auth **out, char *who, size_t wholen,
		   char *err, size_t len)
{
	uint8_t pk[32], sk[32], rnd_s[32], rx[32], tx[32];
	struct hello hc;
	struct px_auth *a = NULL;
	uint64_t deadline = timeout_ns ? kvx_now_ns() + timeout_ns : 0;
	int rc = sodium_init() < 0 ? -EIO : kvx_ctl_auth_keypair(dir, pk, sk);
	if (rc) {
		snprintf(err, len, "--auth-dir %s: cannot read this side's key pair: %s", dir, kvx_strerror(rc));
		goto out;
	}
	if ((rc = recv_hello(fd, &hc, deadline))) {
		if (rc == -EPROTO)
			snprintf(err, len, "the client did not start with an authentication hello (it runs without "
					   "--auth-dir?)");
		else
			snprintf(err, len, "authentication hello: %s", kvx_strerror(rc));
		goto out;
	}
	if ((rc = kvx_ctl_auth_allowed(dir, hc.pk, who, wholen))) {
		char z[41];
		key_z85(hc.pk, z);
		if (rc == -EACCES)
			snprintf(err, len, "the client's public key %s is not in %s/allowed/", z, dir);
		else
			snprintf(err, len, "%s/allowed/: %s", dir, kvx_strerror(rc));
		goto out;
	}
	if (crypto_kx_server_session_keys(rx, tx, pk, sk, hc.pk)) {
		rc = -EBADMSG;
		snprintf(err, len, "the client's public key is not a valid X25519 key");
		goto out;
	}
	if ((rc = send_hello(fd, pk, rnd_s, 0))) {
		snprintf(err, len, "authentication hello: %s", kvx_strerror(rc));
		goto out;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		rc = -ENOMEM;
		goto out;
	}
	derive(a, rx, tx, hc.rnd, rnd_s);
	if ((rc = confirm(a, fd, false, deadline)))
		snprintf(err, len, "the client failed key confirmation (%s): it does not hold the secret key of the "
				   "public key it sent", kvx_strerror(rc));
out:
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(rx, sizeof(rx));
	sodium_memzero(tx, sizeof(tx));
	if (rc) {
		px_auth_free(a);
		return rc;
	}
	*out = a;
	return 0;
}
