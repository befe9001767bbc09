/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: handshake metadata (a) decoder, plus round-trip consistency. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct kvx_msg_region r[256], r2[256];
	static uint8_t out[64 * 1024];
	struct kvx_msg_meta m, d;
	memset(&m, 0, sizeof(m));
	m.regions = r;
	m.regions_cap = 256;
	if (kvx_msg_meta_decode(data, size, &m, NULL, 0) != 0)
		return 0;
	int n = kvx_msg_meta_encode(&m, out, sizeof(out));
	if (n <= 0)
		abort();
	memset(&d, 0, sizeof(d));
	d.regions = r2;
	d.regions_cap = 256;
	if (kvx_msg_meta_decode(out, (size_t)n, &d, NULL, 0) != 0)
		abort();
	if (strcmp(d.engine_id, m.engine_id) || strcmp(d.engine_key, m.engine_key) ||
	    d.num_blocks != m.num_blocks || d.block_len != m.block_len ||
	    d.has_kvx != m.has_kvx || d.num_regions != m.num_regions || d.epoch != m.epoch ||
	    memcmp(r, r2, m.num_regions * sizeof(r[0])))
		abort();
	return 0;
}
