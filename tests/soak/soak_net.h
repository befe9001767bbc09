/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_SOAK_NET_H
#define KVX_SOAK_NET_H
/**
 * @file
 * Two network namespaces joined by a veth pair, for kvx-soak's partition faults. The
 * producer's side is 10.77.0.1/24, the consumer's 10.77.0.2/24; nothing else is addressed.
 * Needs root and `ip` (iproute2). A partition takes both ends of the veth down.
 * Driver process only; not thread-safe.
 */
#include <stdbool.h>
#include <stddef.h>

struct soak_net {
	char ns[2][32];    /**< Namespace names: [0] producer, [1] consumer. */
	char veth[2][16];  /**< veth ends, [0] in ns[0], [1] in ns[1]. */
	char addr[2][16];  /**< Addresses of the ends. */
	bool made;
};

/** Create the namespaces and the veth pair. @return 0, or -1 with the reason in @p why. */
int soak_net_setup(struct soak_net *n, char *why, size_t whylen);

/** Take the link down (partition) or up. @return 0 or -1. */
int soak_net_link(struct soak_net *n, bool up);

/** Enter namespace @p name (setns; in a child before exec). @return 0 or -1. */
int soak_net_enter(const char *name);

/** Delete the namespaces (and with them the veth pair); idempotent. */
void soak_net_teardown(struct soak_net *n);

#endif /* KVX_SOAK_NET_H */
