/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the tcp target's data-connection decoder (hello + proof, then request
 * headers), driven through a real tcp context over loopback (issue 17). One target context
 * with a registered region and an accepted endpoint lives for the whole run; each input is
 * written to a fresh connection to the data port, then the target's progress runs until it
 * closed that connection or stopped reading. Invariants: the region is never written and no
 * request is served, because no input can carry the endpoint's secret proof (the secret is
 * random and never given to the fuzzer); every refused connection is counted.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvxfer/transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct kvx_xport_ctx *g_tgt, *g_ini;
static uint16_t g_port;
static uint8_t g_mem[4096];

static void setup(void)
{
	if (kvx_xport_open("tcp", NULL, &g_tgt) || kvx_xport_open("tcp", NULL, &g_ini))
		abort();
	memset(g_mem, 0x5a, sizeof(g_mem));
	struct kvx_xport_mr_params p = {.addr = g_mem, .len_bytes = sizeof(g_mem),
					.access = KVX_XPORT_ACCESS_ALL};
	struct kvx_xport_mr *mr;
	if (kvx_xport_mr_register(g_tgt, &p, &mr))
		abort();
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t al, bl;
	struct kvx_xport_ep *iep, *tep;
	if (kvx_xport_ep_create(g_ini, &iep, a, sizeof(a), &al) ||
	    kvx_xport_ep_accept(g_tgt, a, al, &tep, b, sizeof(b), &bl))
		abort();
	g_port = (uint16_t)(b[10] | b[11] << 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!g_tgt)
		setup();
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(g_port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* Close with a reset: no TIME_WAIT, so a long run does not use up the ephemeral ports. */
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)))
		abort();
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd); /* local resource limits, not the target under test */
		return 0;
	}
	if (size > 65536)
		size = 65536;
	if (size && send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		; /* the target may already have refused us */
	shutdown(fd, SHUT_WR);
	/* Run the target until it closed our connection (a refused hello) or, for a short input
	 * it is still waiting on, a bounded number of rounds. */
	for (int i = 0; i < 20000; i++) {
		kvx_xport_progress(g_tgt);
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, 0) == 1) {
			uint8_t r[256];
			ssize_t n = recv(fd, r, sizeof(r), MSG_DONTWAIT);
			if (n > 0)
				abort(); /* the target answered an unauthenticated connection */
			if (n <= 0)
				break;
		}
	}
	close(fd);
	for (int i = 0; i < 64; i++) /* let the target drop a connection it still held */
		kvx_xport_progress(g_tgt);
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(g_tgt, &k);
	if (k.reqs_served || k.bytes_served)
		abort();
	for (size_t i = 0; i < sizeof(g_mem); i++)
		if (g_mem[i] != 0x5a)
			abort();
	return 0;
}
