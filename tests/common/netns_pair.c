/* SPDX-License-Identifier: Apache-2.0 */
/* Two network namespaces joined by a veth pair (see netns_pair.h), built with iproute2. */
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netns_pair.h"

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	char full[600];
	snprintf(full, sizeof(full), "%s >/dev/null 2>&1", cmd);
	int st = system(full);
	return st == 0 ? 0 : -1;
}

int netns_pair_setup(struct netns_pair *n, const char *ns_tag, const char *veth_tag, unsigned net, unsigned sub,
		     char *why, size_t whylen)
{
	memset(n, 0, sizeof(*n));
	if (geteuid() != 0) {
		snprintf(why, whylen, "not root (network namespaces need CAP_SYS_ADMIN)");
		return -1;
	}
	if (sh("ip -V")) {
		snprintf(why, whylen, "iproute2 'ip' not found");
		return -1;
	}
	int pid = (int)getpid() % 10000000;
	snprintf(n->ns[0], sizeof(n->ns[0]), "%.16s%dp", ns_tag, pid);
	snprintf(n->ns[1], sizeof(n->ns[1]), "%.16s%dc", ns_tag, pid);
	snprintf(n->veth[0], sizeof(n->veth[0]), "%.4s%da", veth_tag, pid);
	snprintf(n->veth[1], sizeof(n->veth[1]), "%.4s%db", veth_tag, pid);
	snprintf(n->addr[0], sizeof(n->addr[0]), "10.%u.%u.1", net & 255, sub & 255);
	snprintf(n->addr[1], sizeof(n->addr[1]), "10.%u.%u.2", net & 255, sub & 255);
	n->made = true;
	if (sh("ip netns add %s", n->ns[0]) || sh("ip netns add %s", n->ns[1])) {
		snprintf(why, whylen, "'ip netns add' failed (no network namespace support?)");
		netns_pair_teardown(n);
		return -1;
	}
	if (sh("ip link add %s netns %s type veth peer name %s netns %s", n->veth[0], n->ns[0], n->veth[1],
	       n->ns[1]) ||
	    sh("ip -n %s addr add %s/24 dev %s", n->ns[0], n->addr[0], n->veth[0]) ||
	    sh("ip -n %s addr add %s/24 dev %s", n->ns[1], n->addr[1], n->veth[1]) ||
	    sh("ip -n %s link set lo up", n->ns[0]) || sh("ip -n %s link set lo up", n->ns[1]) ||
	    netns_pair_link(n, true)) {
		snprintf(why, whylen, "creating the veth pair in the namespaces failed (no veth support?)");
		netns_pair_teardown(n);
		return -1;
	}
	return 0;
}

int netns_pair_link(struct netns_pair *n, bool up)
{
	int a = sh("ip -n %s link set %s %s", n->ns[0], n->veth[0], up ? "up" : "down");
	int b = sh("ip -n %s link set %s %s", n->ns[1], n->veth[1], up ? "up" : "down");
	return a || b ? -1 : 0;
}

int netns_pair_enter(const char *name)
{
	char path[128];
	snprintf(path, sizeof(path), "/run/netns/%s", name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = setns(fd, CLONE_NEWNET);
	close(fd);
	return rc;
}

void netns_pair_teardown(struct netns_pair *n)
{
	if (!n->made)
		return;
	sh("ip netns del %s", n->ns[0]);
	sh("ip netns del %s", n->ns[1]);
	n->made = false;
}
