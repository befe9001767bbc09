/* SPDX-License-Identifier: Apache-2.0 */
/* Notify proxy of kvx-soak (see soak.h): a ROUTER bound on an ephemeral port receives
 * [identity, payload] from the peer engine's notify DEALER and forwards the payload through a
 * DEALER connected to the real notify ROUTER. On the driver's order it drops the next
 * notification or forwards it twice. The engines never reply on the notify channel, so the
 * proxy is one-way. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "soak.h"

int soak_proxy_main(const char *host, uint16_t fwd_port, int ctl_fd)
{
	void *ctx = zmq_ctx_new();
	void *rt = zmq_socket(ctx, ZMQ_ROUTER);
	void *dl = zmq_socket(ctx, ZMQ_DEALER);
	int zero = 0, hwm = 100000;
	char ep[128];
	size_t eplen = sizeof(ep);
	zmq_setsockopt(rt, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(dl, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(dl, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(rt, ZMQ_RCVHWM, &hwm, sizeof(hwm));
	snprintf(ep, sizeof(ep), "tcp://%s:*", host);
	if (zmq_bind(rt, ep) || zmq_getsockopt(rt, ZMQ_LAST_ENDPOINT, ep, &eplen)) {
		fprintf(stderr, "kvx-soak proxy: bind tcp://%s:*: %s\n", host, zmq_strerror(errno));
		return 1;
	}
	const char *colon = strrchr(ep, ':');
	struct soak_hello hello = {.nt_port = (uint16_t)(colon ? atoi(colon + 1) : 0), .pid = (int32_t)getpid()};
	snprintf(hello.transport, sizeof(hello.transport), "proxy");
	snprintf(ep, sizeof(ep), "tcp://%s:%u", host, fwd_port);
	if (!hello.nt_port || zmq_connect(dl, ep)) {
		fprintf(stderr, "kvx-soak proxy: connect %s: %s\n", ep, zmq_strerror(errno));
		return 1;
	}
	if (soak_send(ctl_fd, SOAK_HELLO, &hello, sizeof(hello), NULL, 0))
		return 1;
	struct soak_proxy_stats st = {0};
	unsigned drop = 0, dup = 0; /* pending orders */
	int rc = 1;
	for (;;) {
		zmq_pollitem_t it[2] = {{.socket = rt, .events = ZMQ_POLLIN},
					{.fd = ctl_fd, .events = ZMQ_POLLIN}};
		if (zmq_poll(it, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (it[1].revents & ZMQ_POLLIN) {
			struct soak_hdr h;
			void *p;
			if (soak_recv(ctl_fd, &h, &p))
				break; /* driver gone */
			free(p);
			if (h.type == SOAK_DROP)
				drop++;
			else if (h.type == SOAK_DUP)
				dup++;
			else if (h.type == SOAK_STATS_REQ)
				soak_send(ctl_fd, SOAK_STATS, &st, sizeof(st), NULL, 0);
			else if (h.type == SOAK_QUIT) {
				rc = 0;
				break;
			}
		}
		while (1) {
			zmq_msg_t id, pl;
			zmq_msg_init(&id);
			zmq_msg_init(&pl);
			if (zmq_msg_recv(&id, rt, ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(&id);
				zmq_msg_close(&pl);
				break;
			}
			if (!zmq_msg_more(&id) || zmq_msg_recv(&pl, rt, ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(&id);
				zmq_msg_close(&pl);
				continue;
			}
			/* Only 2-frame messages are notifications; anything else is forwarded as-is
			 * (its first frame) so the receiver sees and rejects it itself. */
			while (zmq_msg_more(&pl)) {
				zmq_msg_t x;
				zmq_msg_init(&x);
				int more = zmq_msg_recv(&x, rt, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&x);
				zmq_msg_close(&x);
				if (!more)
					break;
			}
			unsigned copies = 1;
			if (drop) {
				drop--;
				copies = 0;
				st.dropped++;
			} else if (dup) {
				dup--;
				copies = 2;
				st.duplicated++;
			}
			for (unsigned c = 0; c < copies; c++)
				zmq_send(dl, zmq_msg_data(&pl), zmq_msg_size(&pl), ZMQ_DONTWAIT);
			if (copies)
				st.forwarded++;
			zmq_msg_close(&id);
			zmq_msg_close(&pl);
		}
	}
	zmq_close(rt);
	zmq_close(dl);
	zmq_ctx_term(ctx);
	return rc;
}
