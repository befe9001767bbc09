/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_NETNS_PAIR_H
#define KVX_TESTS_NETNS_PAIR_H
/**
 * @file
 * Two network namespaces joined by a veth pair, for partition faults between two real processes
 * (kvx-soak, tests/soak; the partition tests, tests/runtime/test_engine_partition.c). Side 0
 * (the producer's) is 10.<net>.<sub>.1/24, side 1 (the consumer's) 10.<net>.<sub>.2/24; nothing
 * else is addressed. The names carry the creating process's pid, so parallel users never share
 * (or delete) each other's namespaces. Needs root and `ip` (iproute2). A partition takes both
 * ends of the veth down. One process (the creator) drives it; not thread-safe.
 */
#include <stdbool.h>
#include <stddef.h>

struct netns_pair {
	char ns[2][32];    /**< Namespace names: [0] producer, [1] consumer. */
	char veth[2][16];  /**< veth ends, [0] in ns[0], [1] in ns[1]. */
	char addr[2][16];  /**< Addresses of the ends. */
	bool made;
};

/**
 * Create the namespaces `<ns_tag><pid>p` / `<ns_tag><pid>c` and the veth pair
 * `<veth_tag><pid>a` / `<veth_tag><pid>b` (@p veth_tag at most 4 characters), addressed
 * 10.@p net.@p sub.1 and .2.
 * @return 0, or -1 with the reason (not root, no iproute2, no namespace or veth support) in
 *         @p why; nothing is left behind then.
 */
int netns_pair_setup(struct netns_pair *n, const char *ns_tag, const char *veth_tag, unsigned net, unsigned sub,
		     char *why, size_t whylen);

/** Take both ends of the link down (partition) or up. @return 0 or -1. */
int netns_pair_link(struct netns_pair *n, bool up);

/** Enter namespace @p name (setns; in a child before it opens sockets). @return 0 or -1. */
int netns_pair_enter(const char *name);

/** Delete the namespaces (and with them the veth pair); idempotent. */
void netns_pair_teardown(struct netns_pair *n);

#endif /* KVX_TESTS_NETNS_PAIR_H */
