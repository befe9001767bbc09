/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: a peer's handshake metadata (a) + region map (b), decoded and assigned to
 * layers by kvx_layout_peer_regions() (MoRIIO split K/V form, docs/protocol.md §3.1, §4.1), then
 * checked against local split and interleaved geometries. Input: [u8 flags][u16le len_a]
 * [len_a bytes of (a)][rest: (b)]; flags bit 0 = 2 regions per layer. Aborts when an accepted
 * assignment breaks its documented invariants. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"
#include "kvxfer/layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(uint64_t addr, uint64_t base, uint64_t len)
{
	return addr >= base && addr - base < len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct kvx_msg_region r[256];
	static struct kvx_msg_memdesc dsc[256];
	static struct kvx_layout_peer_layer pl[256];
	if (size < 3)
		return 0;
	uint32_t per = (data[0] & 1) ? 2 : 1;
	size_t la = (size_t)data[1] | (size_t)data[2] << 8;
	if (la > size - 3)
		return 0;
	struct kvx_msg_meta m;
	struct kvx_msg_layers l;
	memset(&m, 0, sizeof(m));
	memset(&l, 0, sizeof(l));
	m.regions = r;
	m.regions_cap = 256;
	l.descs = dsc;
	l.descs_cap = 256;
	if (kvx_msg_meta_decode(data + 3, la, &m, NULL, 0) || kvx_msg_layers_decode(data + 3 + la, size - 3 - la, &l, NULL, 0))
		return 0;
	char err[256];
	static uint32_t counts[256];
	for (uint32_t j = 0; j < l.num_layers; j++)
		counts[j] = per;
	int n = kvx_layout_peer_regions(&m, &l, counts, l.num_layers, pl, err, sizeof(err));
	if (n < 0)
		return 0;
	if ((uint32_t)n != l.num_layers || (uint64_t)n * per != m.num_regions)
		abort();
	/* Local geometries: split [2,8,4,2,3] and interleaved [8,2,4,2,3], bf16, block size 4. */
	static const struct kvx_layout_spec spec = {.block_size = 4, .num_kv_heads = 2, .head_size = 3};
	struct kvx_layout_tensor ts = {.ndim = 5, .shape = {2, 8, 4, 2, 3}, .stride = {192, 24, 6, 3, 1}, .elem_size = 2};
	struct kvx_layout_tensor ti = {.ndim = 5, .shape = {8, 2, 4, 2, 3}, .stride = {48, 24, 6, 3, 1}, .elem_size = 2};
	struct kvx_layout_geom gs, gi;
	if (kvx_layout_geometry(&spec, &ts, m.num_blocks, &gs, NULL, 0) ||
	    kvx_layout_geometry(&spec, &ti, m.num_blocks, &gi, NULL, 0))
		abort();
	const uint64_t nbr = m.num_blocks ? m.num_blocks : 8;
	for (int j = 0; j < n; j++) {
		const struct kvx_layout_peer_layer *p = &pl[j];
		if (p->nregions != per || p->region != (uint32_t)j * per || p->desc >= l.num_descs ||
		    p->mr_addr != dsc[p->desc].addr || p->mr_len != dsc[p->desc].len_bytes ||
		    p->k_addr != r[p->region].addr || !inside(p->k_addr, p->mr_addr, p->mr_len))
			abort();
		if (per == 2 && (r[p->region + 1].addr - p->k_addr != p->kv_offset || p->kv_offset == 0 ||
				 !inside(r[p->region + 1].addr, p->mr_addr, p->mr_len)))
			abort();
		int cs = kvx_layout_check_peer_layer(&gs, p, err, sizeof(err));
		int ci = kvx_layout_check_peer_layer(&gi, p, err, sizeof(err));
		if ((cs != 0 && cs != -EPROTO) || (ci != 0 && ci != -EPROTO))
			abort();
		/* Accepted for split: the last V block lies inside the peer's MemoryDesc. */
		if (cs == 0 && (per != 2 || p->kv_offset != 2 * gs.remote_kv_stride ||
				(p->k_addr - p->mr_addr) + p->kv_offset + (nbr - 1) * 48 + 48 > p->mr_len))
			abort();
	}
	return 0;
}
