/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: per-layer region map (b) decoder (nested packed MemoryDesc bins). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct kvx_msg_memdesc ds[512], ds2[512];
	static uint8_t out[512 * 1024];
	struct kvx_msg_layers l = {.descs = ds, .descs_cap = 512};
	if (kvx_msg_layers_decode(data, size, &l, NULL, 0) != 0)
		return 0;
	int n = kvx_msg_layers_encode(&l, out, sizeof(out));
	if (n <= 0)
		abort();
	struct kvx_msg_layers d = {.descs = ds2, .descs_cap = 512};
	if (kvx_msg_layers_decode(out, (size_t)n, &d, NULL, 0) != 0 ||
	    d.num_descs != l.num_descs || d.num_layers != l.num_layers ||
	    strcmp(d.engine_key, l.engine_key))
		abort();
	for (uint32_t i = 0; i < l.num_descs; i++)
		if (strcmp(ds[i].layer, ds2[i].layer) || ds[i].addr != ds2[i].addr ||
		    ds[i].len_bytes != ds2[i].len_bytes || ds[i].device_id != ds2[i].device_id)
			abort();
	return 0;
}
