/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Authenticated out-of-band channel of kvxfer-perf bw/lat and of trace's --server/--client
 * driver channel (`--auth-dir DIR`, issue 17).
 *
 * bw/lat have no engine and no ZMQ control plane: their parameters, connection blobs (blob B
 * carries the tcp data plane's per-endpoint secret) and region descriptors travel over one TCP
 * socket. With --auth-dir both ends prove their identity on that socket with the key pairs of
 * the auth directory (the same CURVE keys the engine's control plane uses; kvxfer-perf keygen)
 * and everything after it is encrypted and authenticated:
 *
 *   1. client -> server: hello {"KXPA", version 1, total length, client public key, 32 random
 *      bytes}, zero-padded to the size of the channel's plain first message (bw/lat: a
 *      struct px_msg), so that a server without --auth-dir reads one whole message, rejects it
 *      and closes instead of waiting for more (no deadlock); the server reads the fixed part,
 *      so a plain client's first message is refused at once;
 *   2. the server checks the client key against DIR/allowed/ (read at each connection) and
 *      answers with its own hello; the client checks the server key against its allowed/;
 *   3. each side derives one key per direction: crypto_kx session keys (X25519 of the two
 *      static key pairs) hashed with both random strings (BLAKE2b), so no session repeats;
 *   4. key confirmation: client, then server, send a fixed string in a crypto_secretbox
 *      (XSalsa20-Poly1305, nonce = per-direction message counter); a peer that does not hold
 *      the secret key of the public key it sent fails here.
 * Every later message is a crypto_secretbox of a fixed-size plain message (+16 bytes of MAC).
 * A failure at any step is a refusal: the caller closes the socket.
 */
#ifndef KVX_BENCH_PX_AUTH_H
#define KVX_BENCH_PX_AUTH_H

#include <stddef.h>
#include <stdint.h>

struct px_auth;

/*
 * Client side of steps 1-4 on connected socket @p fd with auth directory @p dir; the hello is
 * padded to @p pad bytes (0: not padded).
 * @return 0 and *out (free with px_auth_free()); else negative errno with a message in err:
 *   -ECONNRESET the server closed (plain server, or it refused this client's key);
 *   -EACCES     the server's key is not in dir/allowed/; -EBADMSG confirmation failed;
 *   other       key files (-ENOKEY, -EPERM...) or socket errors.
 */
int px_auth_client(int fd, const char *dir, size_t pad, uint64_t timeout_ns, struct px_auth **out, char *err,
		   size_t len);
/*
 * Server side of steps 1-4. Same returns; -EPROTO: the first message is not an auth hello (a
 * client without --auth-dir), -EACCES: the client's key is not in dir/allowed/. @p who (may be
 * NULL) receives the allowed/ name of the client key on success.
 */
int px_auth_server(int fd, const char *dir, uint64_t timeout_ns, struct px_auth **out, char *who, size_t wholen,
		   char *err, size_t len);
/* Send / receive one message of exactly @p n bytes, sealed. 0, -EBADMSG (forged or out of
 * order), -ECONNRESET (closed), other -errno. */
int px_auth_send(struct px_auth *a, int fd, const void *buf, size_t n);
int px_auth_recv(struct px_auth *a, int fd, void *buf, size_t n);
void px_auth_free(struct px_auth *a);

#endif
