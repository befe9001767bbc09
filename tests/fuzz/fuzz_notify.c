/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: kvx_msg_notify_decode, plus decode -> encode -> decode consistency. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint32_t ids[4096], ids2[4096];
	static uint8_t out[64 * 1024];
	struct kvx_msg_notify m, d;
	char err[256];
	m.block_ids = ids;
	m.blocks_cap = 4096;
	if (kvx_msg_notify_decode(data, size, &m, err, sizeof(err)) != 0)
		return 0;
	if (m.type == KVX_MSG_REMOTE_BLOCKS && m.decode_rank < 0)
		m.decode_rank = 0;
	int n = kvx_msg_notify_encode(&m, out, sizeof(out));
	if (n <= 0)
		abort(); /* everything the decoder accepts must be encodable */
	d.block_ids = ids2;
	d.blocks_cap = 4096;
	if (kvx_msg_notify_decode(out, (size_t)n, &d, err, sizeof(err)) != 0)
		abort();
	if (d.type != m.type || strcmp(d.transfer_id, m.transfer_id) ||
	    d.num_blocks != m.num_blocks || d.num_groups != m.num_groups ||
	    memcmp(ids, ids2, m.num_blocks * sizeof(uint32_t)))
		abort();
	if (m.type == KVX_MSG_RELEASE && d.consumer_tp_size != m.consumer_tp_size)
		abort();
	/* Sender keys and failure notes (issue 14) survive the round trip. */
	if (strcmp(d.sender_id, m.sender_id) || d.sender_rank != m.sender_rank ||
	    d.sender_epoch != m.sender_epoch || d.fail_status != m.fail_status ||
	    d.fail_error != m.fail_error || strcmp(d.reason, m.reason))
		abort();
	if (m.type == KVX_MSG_REMOTE_BLOCKS &&
	    (strcmp(d.req_id, m.req_id) || d.decode_rank != m.decode_rank))
		abort();
	return 0;
}
