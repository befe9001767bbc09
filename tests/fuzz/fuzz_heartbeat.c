/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: kvx_msg_heartbeat_decode, plus round-trip consistency. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvx_msg_heartbeat h, d;
	uint8_t out[1024];
	if (kvx_msg_heartbeat_decode(data, size, &h, NULL, 0) != 0)
		return 0;
	int n = kvx_msg_heartbeat_encode(&h, out, sizeof(out));
	if (n <= 0 || kvx_msg_heartbeat_decode(out, (size_t)n, &d, NULL, 0) != 0)
		abort();
	if (d.role != h.role || d.mode != h.mode || d.dp_size != h.dp_size ||
	    d.tp_size != h.tp_size || strcmp(d.http_address, h.http_address) ||
	    strcmp(d.zmq_address, h.zmq_address))
		abort();
	return 0;
}
