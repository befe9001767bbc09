/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: connection-setup request/reply decoder (opaque blob stays in bounds). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t out[KVX_MSG_BLOB_MAX + 1024];
	struct kvx_msg_connect c, d;
	if (kvx_msg_connect_decode(data, size, &c, NULL, 0) != 0)
		return 0;
	if (c.blob_len && (c.blob < data || c.blob + c.blob_len > data + size))
		abort();
	int n = kvx_msg_connect_encode(&c, out, sizeof(out));
	if (n <= 0 || kvx_msg_connect_decode(out, (size_t)n, &d, NULL, 0) != 0)
		abort();
	if (d.is_reply != c.is_reply || d.blob_len != c.blob_len ||
	    (c.blob_len && memcmp(d.blob, c.blob, c.blob_len)) ||
	    (c.is_reply ? d.status != c.status
			: (d.epoch != c.epoch || d.dp_rank != c.dp_rank ||
			   strcmp(d.engine_id, c.engine_id))))
		abort();
	return 0;
}
