/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_TRANSPORT_PEER_H
#define KVX_TESTS_TRANSPORT_PEER_H
/*
 * Test harness for the provider conformance suite: a real target process (fork) that opens a
 * context of the provider under test, registers pattern-filled regions, accepts endpoints,
 * runs kvx_xport_progress() in its loop, and answers fill/verify commands. Commands travel
 * over a SOCK_SEQPACKET socketpair (no control plane needed).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvxfer/transport.h"

struct peer {
	pid_t pid;
	int sock;
};

/* Expected byte at absolute position @p pos of the pattern stream @p seed. */
uint8_t pat_byte(uint64_t seed, uint64_t pos);
/* Fill buf[0..len) with pattern seed starting at stream position pos. */
void pat_fill(uint8_t *buf, uint64_t len, uint64_t seed, uint64_t pos);
/* Index of the first byte of buf[0..len) that differs from the pattern, or len if none. */
uint64_t pat_check(const uint8_t *buf, uint64_t len, uint64_t seed, uint64_t pos);

/* Start a target process with a context of @p provider; 0 or negative errno. */
int peer_start(struct peer *p, const char *provider, const struct kvx_xport_ctx_params *prm);
/* Same, with the target's regions in memory of kind @p mem ("host", "hostdev", "hip"):
 * device regions are allocated with kvx_mem_alloc() and filled/verified through copies.
 * -ENODEV/-ENOTSUP when the target cannot open that memory type (reason in why). */
int peer_start_mem(struct peer *p, const char *provider, const char *mem,
		   const struct kvx_xport_ctx_params *prm, char *why, size_t why_len);
/* Register a region of len bytes filled with pattern seed (stream position 0); returns the
 * region index (>= 0) and its exported descriptor in desc[KVX_XPORT_RDESC_BYTES]. */
int peer_reg(struct peer *p, uint64_t len, uint32_t access, uint64_t seed, uint8_t *desc);
/* Unregister region idx at the target; returns the kvx_xport_mr_unregister() result. */
int peer_unreg(struct peer *p, int idx);
/* Accept blob A, return blob B (len in *blen); 0 or the accept error. */
int peer_accept(struct peer *p, const uint8_t *a, size_t alen, uint8_t *b, size_t *blen);
/* Target side of endpoint recovery: kvx_xport_ep_reaccept() of blob A' (from
 * kvx_xport_ep_reset()) on the accepted endpoint it names; blob B' in b (len in *blen). */
int peer_reaccept(struct peer *p, const uint8_t *a, size_t alen, uint8_t *b, size_t *blen);
/* Fill region idx [off, off+len) with pattern seed at stream position spos. */
int peer_fill(struct peer *p, int idx, uint64_t off, uint64_t len, uint64_t seed, uint64_t spos);
/* Check region idx [off, off+len) against pattern seed at stream position spos: returns the
 * offset of the first mismatch relative to off, or len when all match; negative on error. */
int64_t peer_verify(struct peer *p, int idx, uint64_t off, uint64_t len, uint64_t seed,
		    uint64_t spos);
/* Read the target context's counters. */
int peer_counters(struct peer *p, struct kvx_xport_counters *out);
/* Freeze (SIGSTOP) the target. */
void peer_stop(struct peer *p);
/* Kill (SIGKILL) and reap the target. */
void peer_kill(struct peer *p);
/* Ask the target to close its context and exit; reap it; returns its exit status. */
int peer_quit(struct peer *p);

/* Provider parameter sets shared by the parameterised tests. */
struct xport_param {
	char name[16]; /* provider */
	char mem[16];  /* memory kind of both sides' regions: host, hostdev, hip */
};

/* Skip the current test (cr_skip_test) when the provider cannot run here. */
void skip_unless_available(const char *provider);

#endif
