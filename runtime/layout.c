/* SPDX-License-Identifier: Apache-2.0 */
/* KV layout geometry, per-block offsets, range merging and the per-geometry plan cache
 * (docs/protocol.md §4.1–§4.4). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/control.h"
#include "kvxfer/layout.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...) KVX_PRINTF(3, 4);

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static void shape_str(const struct kvx_layout_tensor *t, char *buf, size_t len)
{
	size_t off = 0;
	off += (size_t)snprintf(buf + off, len - off, "[");
	for (uint32_t i = 0; i < t->ndim && i < KVX_LAYOUT_MAX_DIMS && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%llu", i ? "," : "",
					(unsigned long long)t->shape[i]);
	if (off < len)
		snprintf(buf + off, len - off, "]");
}

static bool dim_matches(uint64_t dim, uint32_t want)
{
	return want == 0 || dim == want;
}

/* Kernel-block detection for a 5-D layer whose middle dims are (a, b): which of them is the
 * kernel block size kbs with BS % kbs == 0 and the other dim equal to the head count.
 * Returns 0 = a is kbs, 1 = b is kbs, -1 = none, -2 = ambiguous. */
static int find_kernel_axis(const struct kvx_layout_spec *spec, uint64_t a, uint64_t b, uint64_t hd)
{
	bool hd_ok = dim_matches(hd, spec->head_size);
	bool a_ok = a > 0 && spec->block_size % a == 0 && dim_matches(b, spec->num_kv_heads) && hd_ok;
	bool b_ok = b > 0 && spec->block_size % b == 0 && dim_matches(a, spec->num_kv_heads) && hd_ok;
	if (a_ok && b_ok)
		return a == b ? 0 : -2;
	if (a_ok)
		return 0;
	if (b_ok)
		return 1;
	return -1;
}

KVX_API int kvx_layout_geometry(const struct kvx_layout_spec *spec, const struct kvx_layout_tensor *t,
				uint64_t remote_num_blocks, struct kvx_layout_geom *out, char *err, size_t errlen)
{
	char shp[128];
	if (!spec || !t || !out) {
		set_err(err, errlen, "layout: NULL spec, tensor or output");
		return -EINVAL;
	}
	if (t->elem_size == 0) {
		set_err(err, errlen, "layout: elem_size must be > 0");
		return -EINVAL;
	}
	if (spec->block_size == 0 && !spec->is_mla) {
		set_err(err, errlen, "layout: spec.block_size must be > 0");
		return -EINVAL;
	}
	if (t->ndim == 0 || t->ndim > KVX_LAYOUT_MAX_DIMS) {
		set_err(err, errlen, "layout: tensor ndim %u outside 1..%d", t->ndim, KVX_LAYOUT_MAX_DIMS);
		return -EINVAL;
	}
	shape_str(t, shp, sizeof(shp));
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (t->shape[i] == 0) {
			set_err(err, errlen, "layout: shape %s has a zero dim %u", shp, i);
			return -EINVAL;
		}
	}
	struct kvx_layout_geom g;
	memset(&g, 0, sizeof(g));
	g.elem_size = t->elem_size;
	g.kernel_blocks_per_block = 1;
	const uint64_t es = t->elem_size;

	if (spec->is_mla) {
		if (t->ndim != 3) {
			set_err(err, errlen, "Unsupported MLA cache shape %s: expected 3-D [num_blocks, block_size, dim]",
				shp);
			return -EINVAL;
		}
		/* The tensor's block size wins over the config's (FlashMLA, §4.2 item 5). */
		g.kind = KVX_LAYOUT_KIND_MLA;
		g.num_blocks = t->shape[0];
		g.block_size = (uint32_t)t->shape[1];
		g.slot_size = t->shape[2] * es;
		g.block_len = g.block_size * g.slot_size;
		g.block_stride = t->stride[0];
		g.transfers_per_block = 1;
		g.regions_per_block = 1;
		g.remote_num_blocks = remote_num_blocks;
		*out = g;
		return 0;
	}
	if (t->ndim != 5) {
		set_err(err, errlen, "Unsupported K/V cache shape %s: expected 5-D [2,NB,a,b,HD] or [NB,2,a,b,HD]",
			shp);
		return -EINVAL;
	}
	const uint64_t bs = spec->block_size;
	if (t->shape[0] == 2) {
		uint64_t a = t->shape[2], b = t->shape[3], hd = t->shape[4], heads, kbpb = 1;
		if (a == bs) {
			heads = b;
		} else if (b == bs) {
			heads = a;
		} else {
			int ax = find_kernel_axis(spec, a, b, hd);
			if (ax == -2) {
				set_err(err, errlen, "Ambiguous kernel-block K/V cache shape %s for block_size %u", shp,
					spec->block_size);
				return -EINVAL;
			}
			if (ax < 0) {
				set_err(err, errlen, "Unsupported K/V cache shape %s: no dim equals block_size %u", shp,
					spec->block_size);
				return -EINVAL;
			}
			uint64_t kbs = ax == 0 ? a : b;
			heads = ax == 0 ? b : a;
			kbpb = bs / kbs;
			if (t->shape[1] % kbpb) {
				set_err(err, errlen, "K/V cache shape %s: %llu kernel blocks not a multiple of %llu per block",
					shp, (unsigned long long)t->shape[1], (unsigned long long)kbpb);
				return -EINVAL;
			}
		}
		g.kind = KVX_LAYOUT_KIND_SPLIT;
		g.kernel_blocks_per_block = (uint32_t)kbpb;
		g.num_blocks = t->shape[1] / kbpb;
		g.block_size = spec->block_size;
		g.slot_size = heads * hd * es;
		g.block_len = bs * g.slot_size;
		g.block_stride = t->stride[1] * kbpb;
		g.local_kv_stride = t->stride[0];
		g.transfers_per_block = 2;
		g.regions_per_block = 2;
		g.split_kv_regions = true;
		g.has_kv_stride = true;
		kvx_layout_set_remote_blocks(&g, remote_num_blocks);
		*out = g;
		return 0;
	}
	if (t->shape[1] == 2) {
		uint64_t a = t->shape[2], b = t->shape[3], hd = t->shape[4];
		g.kind = KVX_LAYOUT_KIND_INTERLEAVED;
		g.block_size = spec->block_size;
		if (a == bs || b == bs) {
			uint64_t heads = a == bs ? b : a;
			g.num_blocks = t->shape[0];
			g.block_stride = t->stride[0];
			g.local_kv_stride = g.remote_kv_stride = t->stride[1];
			g.has_kv_stride = true;
			g.transfers_per_block = 2;
			g.regions_per_block = 2;
			g.slot_size = heads * hd * es;
			g.block_len = bs * g.slot_size;
		} else {
			int ax = find_kernel_axis(spec, a, b, hd);
			if (ax == -2) {
				set_err(err, errlen, "Ambiguous kernel-block K/V cache shape %s for block_size %u", shp,
					spec->block_size);
				return -EINVAL;
			}
			if (ax < 0) {
				set_err(err, errlen, "Unsupported K/V cache shape %s: no dim equals block_size %u", shp,
					spec->block_size);
				return -EINVAL;
			}
			uint64_t kbpb = bs / (ax == 0 ? a : b);
			if (t->shape[0] % kbpb) {
				set_err(err, errlen, "K/V cache shape %s: %llu kernel blocks not a multiple of %llu per block",
					shp, (unsigned long long)t->shape[0], (unsigned long long)kbpb);
				return -EINVAL;
			}
			g.kernel_blocks_per_block = (uint32_t)kbpb;
			g.num_blocks = t->shape[0] / kbpb;
			g.block_stride = t->stride[0] * kbpb;
			g.block_len = g.block_stride * es;
			g.slot_size = g.block_len / bs;
			g.transfers_per_block = 1;
			g.regions_per_block = 1;
		}
		g.remote_num_blocks = remote_num_blocks;
		*out = g;
		return 0;
	}
	set_err(err, errlen, "Unsupported K/V cache shape %s: neither dim 0 nor dim 1 is 2", shp);
	return -EINVAL;
}

KVX_API void kvx_layout_set_remote_blocks(struct kvx_layout_geom *g, uint64_t remote_num_blocks)
{
	g->remote_num_blocks = remote_num_blocks;
	if (g->kind == KVX_LAYOUT_KIND_SPLIT)
		g->remote_kv_stride = g->block_stride * (remote_num_blocks ? remote_num_blocks : g->num_blocks);
}

KVX_API int kvx_layout_regions(const struct kvx_layout_geom *g, const struct kvx_layout_tensor *t, uint64_t base,
			       struct kvx_layout_region out[2])
{
	uint64_t plane = g->num_blocks * g->block_stride * g->elem_size;
	out[0].addr = base;
	out[0].len = plane;
	if (g->kind != KVX_LAYOUT_KIND_SPLIT)
		return 1;
	out[1].addr = base + t->stride[0] * g->elem_size;
	out[1].len = plane;
	return 2;
}

KVX_API int kvx_plan_offsets(const struct kvx_layout_geom *g, const uint32_t *local_ids, size_t n_local,
			     const uint32_t *remote_ids, size_t n_remote, uint64_t *loc, uint64_t *rem, uint64_t *size,
			     size_t cap)
{
	if (n_local != n_remote)
		return -EINVAL; /* "local and remote block lists must have the same length" */
	size_t tpb = g->transfers_per_block == 2 ? 2 : 1;
	if (n_local > cap / tpb)
		return -ENOBUFS;
	const uint64_t es = g->elem_size, bsl = g->block_stride, len = g->block_len;
	size_t k = 0;
	/* Split planes: all K entries, then all V entries, so sorted block ids give sorted local
	 * offsets and the merge skips its sort (the V plane lies above the K plane). */
	bool planes = g->kind == KVX_LAYOUT_KIND_SPLIT && g->local_kv_stride >= g->num_blocks * bsl;
	size_t vbase = planes ? n_local : 0;
	for (size_t i = 0; i < n_local; i++) {
		uint64_t lb = local_ids[i], rb = remote_ids[i];
		if (KVX_UNLIKELY(lb >= g->num_blocks))
			return -EINVAL;
		loc[k] = es * lb * bsl;
		rem[k] = es * rb * bsl;
		size[k] = len;
		k++;
		if (tpb == 2) {
			size_t v = planes ? vbase + i : k++;
			loc[v] = es * (g->local_kv_stride + lb * bsl);
			rem[v] = es * (g->remote_kv_stride + rb * bsl);
			size[v] = len;
		}
	}
	return (int)(n_local * tpb);
}

/* Stable bottom-up merge sort of idx[0..n) by key[idx[]], with tmp[0..n) as buffer. */
static void sort_idx(uint32_t *idx, uint32_t *tmp, size_t n, const uint64_t *key)
{
	uint32_t *src = idx, *dst = tmp;
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t i = lo, j = mid, k = lo;
			while (i < mid && j < hi)
				dst[k++] = key[src[j]] < key[src[i]] ? src[j++] : src[i++];
			while (i < mid)
				dst[k++] = src[i++];
			while (j < hi)
				dst[k++] = src[j++];
		}
		uint32_t *t = src;
		src = dst;
		dst = t;
	}
	if (src != idx)
		memcpy(idx, src, n * sizeof(*idx));
}

/* Apply new[i] = old[idx[i]] to the three arrays in place by following cycles; idx is consumed. */
static void permute3(uint64_t *a, uint64_t *b, uint64_t *c, uint32_t *idx, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (idx[i] == i)
			continue;
		uint64_t ta = a[i], tb = b[i], tc = c[i];
		size_t j = i;
		for (;;) {
			size_t k = idx[j];
			idx[j] = (uint32_t)j;
			if (k == i) {
				a[j] = ta;
				b[j] = tb;
				c[j] = tc;
				break;
			}
			a[j] = a[k];
			b[j] = b[k];
			c[j] = c[k];
			j = k;
		}
	}
}

KVX_API int kvx_plan_merge(uint64_t *loc, uint64_t *rem, uint64_t *size, size_t n, uint32_t *scratch)
{
	if (n == 0)
		return 0;
	bool sorted = true;
	for (size_t i = 1; i < n; i++) {
		if (loc[i] < loc[i - 1]) {
			sorted = false;
			break;
		}
	}
	if (!sorted) {
		if (!scratch || n > UINT32_MAX)
			return -EINVAL;
		for (size_t i = 0; i < n; i++)
			scratch[i] = (uint32_t)i;
		sort_idx(scratch, scratch + n, n, loc);
		permute3(loc, rem, size, scratch, n);
	}
	size_t out = 0;
	for (size_t i = 1; i < n; i++) {
		/* Contiguous on both sides with the last entry of the current run. */
		uint64_t end_l = loc[out] + size[out], end_r = rem[out] + size[out];
		if (loc[i] == end_l && rem[i] == end_r && size[out] > 0) {
			size[out] += size[i];
		} else {
			out++;
			loc[out] = loc[i];
			rem[out] = rem[i];
			size[out] = size[i];
		}
	}
	return (int)(out + 1);
}

/* Radix digits for local ids below 2^bits: 1..3 passes of at most 11 bits. */
struct radix_plan {
	unsigned passes, width;
	uint64_t mask;
};

static struct radix_plan radix_plan(unsigned bits)
{
	struct radix_plan rp = {.passes = (bits + 10) / 11};
	rp.width = (bits + rp.passes - 1) / rp.passes;
	rp.mask = (1ull << rp.width) - 1;
	return rp;
}

/* Stable LSD radix passes over keys whose bits [32, 32+passes*width) hold the local id (the
 * remote id rides in the low half), with the per-pass histograms already counted; tmp[0..n)
 * is the buffer. The result ends in keys. */
static void radix_sort_hi(uint64_t *keys, uint64_t *tmp, size_t n, const struct radix_plan *rp,
			  uint32_t count[][1u << 11])
{
	uint64_t *src = keys, *dst = tmp;
	for (unsigned p = 0; p < rp->passes; p++) {
		uint32_t sum = 0;
		for (size_t b = 0; b <= rp->mask; b++) {
			uint32_t c = count[p][b];
			count[p][b] = sum;
			sum += c;
		}
		const unsigned shift = 32 + p * rp->width;
		uint32_t *cp = count[p];
		for (size_t i = 0; i < n; i++) {
			uint64_t k = src[i];
			dst[cp[(k >> shift) & rp->mask]++] = k;
		}
		uint64_t *t = src;
		src = dst;
		dst = t;
	}
	if (src != keys)
		memcpy(keys, src, n * sizeof(*keys));
}

/* The same radix passes over 32-bit keys (local id << ibits | pair index), digits from bit
 * ibits up. */
static void radix_sort32(uint32_t *keys, uint32_t *tmp, size_t n, const struct radix_plan *rp, unsigned ibits,
			 uint32_t count[][1u << 11])
{
	uint32_t *src = keys, *dst = tmp;
	const uint32_t m = (uint32_t)rp->mask;
	for (unsigned p = 0; p < rp->passes; p++) {
		uint32_t sum = 0;
		for (size_t b = 0; b <= rp->mask; b++) {
			uint32_t c = count[p][b];
			count[p][b] = sum;
			sum += c;
		}
		const unsigned shift = ibits + p * rp->width;
		uint32_t *cp = count[p];
		for (size_t i = 0; i < n; i++) {
			uint32_t k = src[i];
			dst[cp[(k >> shift) & m]++] = k;
		}
		uint32_t *t = src;
		src = dst;
		dst = t;
	}
	if (src != keys)
		memcpy(keys, src, n * sizeof(*keys));
}

/* The current run of an emitter, kept in registers and stored when it ends: an entry starting
 * exactly where the run ends on both sides extends it (len > 0, so a duplicate never does). */
struct plan_run {
	uint64_t l, r, s;
};

/* Start emitting at out: continue the run stored last, if any. */
static size_t run_open(struct plan_run *run, const uint64_t *loc, const uint64_t *rem, const uint64_t *size,
		       size_t out)
{
	if (!out) {
		*run = (struct plan_run){0};
		return 0;
	}
	*run = (struct plan_run){loc[out - 1], rem[out - 1], size[out - 1]};
	return out - 1;
}

/* Extend the run with (l, r, len) or store it at out and start a new one; returns the new out. */
static inline size_t run_add(struct plan_run *run, uint64_t l, uint64_t r, uint64_t len, uint64_t *restrict loc,
			     uint64_t *restrict rem, uint64_t *restrict size, size_t out)
{
	if (run->s && l == run->l + run->s && r == run->r + run->s) {
		run->s += len;
		return out;
	}
	if (run->s) {
		loc[out] = run->l;
		rem[out] = run->r;
		size[out] = run->s;
		out++;
	}
	*run = (struct plan_run){l, r, len};
	return out;
}

static size_t run_close(const struct plan_run *run, uint64_t *loc, uint64_t *rem, uint64_t *size, size_t out)
{
	if (run->s) {
		loc[out] = run->l;
		rem[out] = run->r;
		size[out] = run->s;
		out++;
	}
	return out;
}

/* Sort by placement, for a pool small next to the transfer (nb <= 5n, 16 <= n <= 2^16): each
 * pair index goes to the slot of its local id and a bitmap marks the slots in use; walking the
 * bitmap then visits the pairs in local id order. Slots and bitmap take 2nb + nb/8 + 8 bytes of
 * scratch (16n bytes), which nb <= 5n keeps inside. */
struct plan_places {
	const uint16_t *slot;
	const uint64_t *bits;
	size_t words;
};

/* Returns false when a local id repeats (the radix route keeps duplicates in input order). */
static bool place_by_bitmap(struct plan_places *pl, uint64_t *scratch, size_t n, const uint32_t *local_ids,
			    uint64_t nb)
{
	const size_t words = (size_t)((nb + 63) / 64);
	uint64_t *bits = scratch;
	uint16_t *slot = (uint16_t *)(void *)(scratch + words);
	memset(bits, 0, words * sizeof(*bits));
	for (size_t i = 0; i < n; i++) {
		uint32_t lb = local_ids[i];
		uint64_t bit = 1ull << (lb & 63), *w = &bits[lb >> 6];
		if (KVX_UNLIKELY(*w & bit))
			return false;
		*w |= bit;
		slot[lb] = (uint16_t)i;
	}
	*pl = (struct plan_places){.slot = slot, .bits = bits, .words = words};
	return true;
}

/* emit_plane() for 32-bit keys: the remote id is looked up by the pair index. */
static size_t emit_plane32(const uint32_t *keys, size_t n, unsigned ibits, const uint32_t *remote_ids, uint64_t lbase,
			   uint64_t rbase, uint64_t step, uint64_t len, uint64_t *restrict loc, uint64_t *restrict rem,
			   uint64_t *restrict size, size_t out)
{
	const uint32_t im = (uint32_t)((1ull << ibits) - 1);
	struct plan_run run;
	out = run_open(&run, loc, rem, size, out);
	for (size_t i = 0; i < n; i++) {
		uint64_t l = lbase + (uint64_t)(keys[i] >> ibits) * step, r = rbase + remote_ids[keys[i] & im] * step;
		out = run_add(&run, l, r, len, loc, rem, size, out);
	}
	return run_close(&run, loc, rem, size, out);
}

/* Emit one plane for pairs whose local ids are already non-decreasing, in input order. */
static size_t emit_pairs(const uint32_t *local_ids, const uint32_t *remote_ids, size_t n, uint64_t lbase,
			 uint64_t rbase, uint64_t step, uint64_t len, uint64_t *restrict loc, uint64_t *restrict rem,
			 uint64_t *restrict size, size_t out)
{
	struct plan_run run;
	out = run_open(&run, loc, rem, size, out);
	for (size_t i = 0; i < n; i++)
		out = run_add(&run, lbase + local_ids[i] * step, rbase + remote_ids[i] * step, len, loc, rem, size,
			      out);
	return run_close(&run, loc, rem, size, out);
}

/* Emit one plane for pairs placed by place_by_bitmap(), in local id order. */
static size_t emit_places(const struct plan_places *pl, const uint32_t *remote_ids, uint64_t lbase, uint64_t rbase,
			  uint64_t step, uint64_t len, uint64_t *restrict loc, uint64_t *restrict rem,
			  uint64_t *restrict size, size_t out)
{
	struct plan_run run;
	out = run_open(&run, loc, rem, size, out);
	for (size_t wi = 0; wi < pl->words; wi++) {
		for (uint64_t w = pl->bits[wi]; w; w &= w - 1) {
			uint64_t lb = wi * 64 + (unsigned)__builtin_ctzll(w);
			out = run_add(&run, lbase + lb * step, rbase + remote_ids[pl->slot[lb]] * step, len, loc, rem,
				      size, out);
		}
	}
	return run_close(&run, loc, rem, size, out);
}

/* Emit the triples of one plane for pairs already ordered by local id, merging on the fly
 * (§4.4's rule against the current run). Returns the new output count. */
static size_t emit_plane(const uint64_t *keys, size_t n, uint64_t lbase, uint64_t rbase, uint64_t step,
			 uint64_t len, uint64_t *restrict loc, uint64_t *restrict rem, uint64_t *restrict size, size_t out)
{
	struct plan_run run;
	out = run_open(&run, loc, rem, size, out);
	for (size_t i = 0; i < n; i++) {
		uint64_t l = lbase + (keys[i] >> 32) * step, r = rbase + (keys[i] & 0xffffffffu) * step;
		out = run_add(&run, l, r, len, loc, rem, size, out);
	}
	return run_close(&run, loc, rem, size, out);
}

KVX_API int kvx_plan_build(const struct kvx_layout_geom *g, const uint32_t *local_ids, const uint32_t *remote_ids,
			   size_t n, uint64_t *loc, uint64_t *rem, uint64_t *size, size_t cap, uint64_t *scratch)
{
	const size_t tpb = g->transfers_per_block == 2 ? 2 : 1;
	if (n > cap / tpb || n > INT32_MAX / 2)
		return n > cap / tpb ? -ENOBUFS : -EINVAL;
	if (n == 0)
		return 0;
	const uint64_t es = g->elem_size, bsl = g->block_stride, step = es * bsl;
	/* Fast path: every plane's offsets grow with the local id and the planes do not interleave
	 * (one plane, or split planes with V above all of K). Otherwise: offsets, then merge. */
	bool fast = tpb == 1 || (g->kind == KVX_LAYOUT_KIND_SPLIT && g->local_kv_stride >= g->num_blocks * bsl);
	if (!fast || !scratch || step == 0 || g->block_len == 0) {
		int k = kvx_plan_offsets(g, local_ids, n, remote_ids, n, loc, rem, size, cap);
		return k < 0 ? k : kvx_plan_merge(loc, rem, size, (size_t)k, (uint32_t *)scratch);
	}
	uint64_t *keys = scratch;
	const uint64_t nb = g->num_blocks;
	/* Digits sized by num_blocks, so the histograms are counted while the keys are built. */
	const unsigned lbits = nb > 1 ? 64u - (unsigned)__builtin_clzll(nb - 1) : 1u;
	const struct radix_plan rp = radix_plan(lbits);
	uint32_t count[3][1u << 11];
	for (unsigned p = 0; p < 3; p++)
		memset(count[p], 0, (rp.mask + 1) * sizeof(uint32_t));
	const unsigned ibits = n > 1 ? 64u - (unsigned)__builtin_clzll(n - 1) : 1u;
	if (lbits + ibits <= 32 && rp.passes < 3) {
		/* Checks first (a loop of compares and ors), then one of three routes: ids already in
		 * order are emitted as they are; a small pool is sorted by placement; otherwise
		 * half-size keys (local id, pair index) are radix sorted, the index keeping the sort
		 * stable and finding the remote id when the triples are emitted. */
		uint32_t bad = local_ids[0] >= nb, unsorted = 0;
		for (size_t i = 1; i < n; i++) {
			bad |= local_ids[i] >= nb;
			unsorted |= local_ids[i] < local_ids[i - 1];
		}
		if (KVX_UNLIKELY(bad))
			return -EINVAL;
		const uint64_t len = g->block_len, lkv = es * g->local_kv_stride, rkv = es * g->remote_kv_stride;
		size_t out;
		if (!unsorted) {
			out = emit_pairs(local_ids, remote_ids, n, 0, 0, step, len, loc, rem, size, 0);
			if (tpb == 2)
				out = emit_pairs(local_ids, remote_ids, n, lkv, rkv, step, len, loc, rem, size, out);
			return (int)out;
		}
		if (n >= 16 && n <= 65536 && nb <= 5 * n) {
			struct plan_places pl;
			if (place_by_bitmap(&pl, scratch, n, local_ids, nb)) {
				out = emit_places(&pl, remote_ids, 0, 0, step, len, loc, rem, size, 0);
				if (tpb == 2)
					out = emit_places(&pl, remote_ids, lkv, rkv, step, len, loc, rem, size, out);
				return (int)out;
			}
		}
		uint32_t *k32 = (uint32_t *)scratch, *c0 = count[0], *c1 = count[1];
		const unsigned w = rp.width;
		const uint32_t m = (uint32_t)rp.mask;
		for (size_t i = 0; i < n; i++) {
			uint32_t lb = local_ids[i];
			k32[i] = lb << ibits | (uint32_t)i;
			c0[lb & m]++;
			c1[(lb >> w) & m]++;
		}
		radix_sort32(k32, k32 + n, n, &rp, ibits, count);
		out = emit_plane32(k32, n, ibits, remote_ids, 0, 0, step, len, loc, rem, size, 0);
		if (tpb == 2)
			out = emit_plane32(k32, n, ibits, remote_ids, lkv, rkv, step, len, loc, rem, size, out);
		return (int)out;
	}
	uint32_t prev = 0, bad = 0;
	bool sorted = true;
	uint32_t *c0 = count[0], *c1 = count[1], *c2 = count[2];
	const unsigned w = rp.width;
	const uint32_t m = (uint32_t)rp.mask;
	/* One pass counts into c1 too (its digit is always 0 there, unused); three passes are
	 * for ids of more than 22 bits. */
	if (rp.passes < 3) {
		for (size_t i = 0; i < n; i++) {
			uint32_t lb = local_ids[i];
			bad |= lb >= nb;
			sorted &= lb >= prev;
			prev = lb;
			keys[i] = (uint64_t)lb << 32 | remote_ids[i];
			c0[lb & m]++;
			c1[(lb >> w) & m]++;
		}
	} else {
		for (size_t i = 0; i < n; i++) {
			uint32_t lb = local_ids[i];
			bad |= lb >= nb;
			sorted &= lb >= prev;
			prev = lb;
			keys[i] = (uint64_t)lb << 32 | remote_ids[i];
			c0[lb & m]++;
			c1[(lb >> w) & m]++;
			c2[(lb >> 2 * w) & m]++;
		}
	}
	if (KVX_UNLIKELY(bad))
		return -EINVAL;
	if (!sorted)
		radix_sort_hi(keys, scratch + n, n, &rp, count);
	size_t out = emit_plane(keys, n, 0, 0, step, g->block_len, loc, rem, size, 0);
	if (tpb == 2)
		out = emit_plane(keys, n, es * g->local_kv_stride, es * g->remote_kv_stride, step, g->block_len, loc,
				 rem, size, out);
	return (int)out;
}

KVX_API size_t kvx_plan_pair_by_position(size_t n_local, size_t n_remote, size_t cached_blocks,
					 size_t *remote_start)
{
	if (remote_start)
		*remote_start = cached_blocks;
	if (cached_blocks >= n_remote)
		return 0;
	size_t avail = n_remote - cached_blocks;
	return n_local < avail ? n_local : avail;
}

struct plan_slot {
	struct kvx_layout_geom key;
	uint64_t *loc, *rem, *size;
	size_t n;
	uint64_t bytes;
};

struct kvx_plan_cache {
	size_t max_blocks;
	size_t used;
	uint64_t *scratch; /* Array[2 * max_blocks]: kvx_plan_build()'s scratch */
	struct plan_slot slot[KVX_PLAN_CACHE_MAX];
};

KVX_API int kvx_plan_cache_create(size_t max_blocks, struct kvx_plan_cache **out)
{
	if (!out || max_blocks == 0 || max_blocks > UINT32_MAX / 4)
		return -EINVAL;
	struct kvx_plan_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->max_blocks = max_blocks;
	size_t n = 2 * max_blocks;
	c->scratch = malloc(n * sizeof(uint64_t));
	bool ok = c->scratch != NULL;
	for (size_t i = 0; ok && i < KVX_PLAN_CACHE_MAX; i++) {
		c->slot[i].loc = malloc(n * sizeof(uint64_t));
		c->slot[i].rem = malloc(n * sizeof(uint64_t));
		c->slot[i].size = malloc(n * sizeof(uint64_t));
		ok = c->slot[i].loc && c->slot[i].rem && c->slot[i].size;
	}
	if (!ok) {
		kvx_plan_cache_destroy(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

KVX_API void kvx_plan_cache_destroy(struct kvx_plan_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < KVX_PLAN_CACHE_MAX; i++) {
		free(c->slot[i].loc);
		free(c->slot[i].rem);
		free(c->slot[i].size);
	}
	free(c->scratch);
	free(c);
}

KVX_API void kvx_plan_cache_reset(struct kvx_plan_cache *c)
{
	c->used = 0;
}

/* Two layers share a plan iff every field the offsets depend on is equal. */
static bool same_geometry(const struct kvx_layout_geom *a, const struct kvx_layout_geom *b)
{
	return a->kind == b->kind && a->num_blocks == b->num_blocks && a->elem_size == b->elem_size &&
	       a->block_len == b->block_len && a->block_stride == b->block_stride &&
	       a->local_kv_stride == b->local_kv_stride && a->remote_kv_stride == b->remote_kv_stride &&
	       a->transfers_per_block == b->transfers_per_block;
}

KVX_API int kvx_plan_cache_get(struct kvx_plan_cache *c, const struct kvx_layout_geom *g, const uint32_t *local_ids,
			       const uint32_t *remote_ids, size_t n, struct kvx_plan *plan)
{
	for (size_t i = 0; i < c->used; i++) {
		struct plan_slot *s = &c->slot[i];
		if (same_geometry(&s->key, g)) {
			*plan = (struct kvx_plan){s->loc, s->rem, s->size, s->n, s->bytes};
			return 0;
		}
	}
	if (n > c->max_blocks || c->used == KVX_PLAN_CACHE_MAX)
		return -ENOBUFS;
	struct plan_slot *s = &c->slot[c->used];
	int k = kvx_plan_build(g, local_ids, remote_ids, n, s->loc, s->rem, s->size, 2 * c->max_blocks, c->scratch);
	if (k < 0)
		return k;
	uint64_t bytes = 0;
	for (int i = 0; i < k; i++)
		bytes += s->size[i];
	s->key = *g;
	s->n = (size_t)k;
	s->bytes = bytes;
	c->used++;
	*plan = (struct kvx_plan){s->loc, s->rem, s->size, s->n, s->bytes};
	return 1;
}

KVX_API int kvx_layout_check_hetero_tp(uint32_t tp_local, uint32_t tp_remote, uint32_t total_kv_heads, bool mla,
				       char *err, size_t errlen)
{
	if (tp_local == 0 || tp_remote == 0) {
		set_err(err, errlen, "heterogeneous TP check: tp_local %u and tp_remote %u must both be > 0", tp_local,
			tp_remote);
		return -EINVAL;
	}
	if (mla || tp_local == tp_remote)
		return 0;
	if (total_kv_heads == 0) {
		set_err(err, errlen, "heterogeneous TP %u vs %u: total_kv_heads must be > 0 to check replicated KV heads",
			tp_local, tp_remote);
		return -EINVAL;
	}
	uint32_t m = tp_local < tp_remote ? tp_local : tp_remote;
	if (m < total_kv_heads) {
		set_err(err, errlen,
			"heterogeneous TP %u vs %u needs replicated KV heads: min TP %u < total_kv_heads %u "
			"(only MLA or TP >= KV heads can move whole blocks)",
			tp_local, tp_remote, m, total_kv_heads);
		return -ENOTSUP;
	}
	return 0;
}

KVX_API int kvx_layout_meta_regions(const struct kvx_layout_geom *g, const struct kvx_layout_tensor *t, uint64_t base,
				    uint64_t mr_key, struct kvx_msg_region *out)
{
	if (!g || !t || !out)
		return -EINVAL;
	struct kvx_layout_region r[2];
	int n = kvx_layout_regions(g, t, base, r);
	for (int i = 0; i < n; i++)
		out[i] = (struct kvx_msg_region){.addr = r[i].addr, .len_bytes = r[i].len, .key = mr_key};
	return n;
}

/* [addr, addr+len) lies inside [base, base+size); len 0 checks the start only. */
static bool inside(uint64_t addr, uint64_t len, uint64_t base, uint64_t size)
{
	if (addr < base || addr - base >= size)
		return false;
	return len <= size - (addr - base);
}

KVX_API int kvx_layout_peer_regions(const struct kvx_msg_meta *m, const struct kvx_msg_layers *l,
				    const uint32_t *regions_per_layer, uint32_t n_layers,
				    struct kvx_layout_peer_layer *out, char *err, size_t errlen)
{
	if (!m || !l || (n_layers && (!out || !regions_per_layer)) || (m->num_regions && !m->regions) ||
	    (l->num_descs && !l->descs)) {
		set_err(err, errlen, "peer regions: NULL metadata, region map, counts or output");
		return -EINVAL;
	}
	uint64_t want = 0;
	for (uint32_t j = 0; j < n_layers; j++) {
		if (regions_per_layer[j] != 1 && regions_per_layer[j] != 2) {
			set_err(err, errlen, "peer regions: regions_per_layer[%u] = %u (want 1 or 2)", j,
				regions_per_layer[j]);
			return -EINVAL;
		}
		want += regions_per_layer[j];
	}
	uint32_t layers = 0;
	for (uint32_t d = 0; d < l->num_descs; d++)
		layers += d == 0 || strcmp(l->descs[d].layer, l->descs[d - 1].layer) != 0;
	if (layers != n_layers) {
		set_err(err, errlen, "peer region map has %u layers, this engine %u", layers, n_layers);
		return -EPROTO;
	}
	if (want != m->num_regions) {
		set_err(err, errlen,
			"peer advertises %u regions in kv_caches_base_addr for %u layers; this engine's layers "
			"have %llu",
			m->num_regions, layers, (unsigned long long)want);
		return -EPROTO;
	}
	uint32_t j = 0, r = 0;
	for (uint32_t d = 0; d < l->num_descs; d++) {
		if (d > 0 && strcmp(l->descs[d].layer, l->descs[d - 1].layer) == 0)
			continue;
		const struct kvx_msg_memdesc *md = &l->descs[d];
		const uint32_t per = regions_per_layer[j];
		const struct kvx_msg_region *k = &m->regions[r];
		struct kvx_layout_peer_layer pl = {.desc = d, .region = r, .nregions = per, .mr_addr = md->addr,
						   .mr_len = md->len_bytes, .k_addr = k->addr};
		for (uint32_t i = 0; i < per; i++) {
			const struct kvx_msg_region *x = &m->regions[r + i];
			if (!inside(x->addr, x->len_bytes, md->addr, md->len_bytes)) {
				set_err(err, errlen,
					"layer '%s': region %u [0x%llx, +%llu) is outside its MemoryDesc [0x%llx, +%llu)",
					md->layer, r + i, (unsigned long long)x->addr, (unsigned long long)x->len_bytes,
					(unsigned long long)md->addr, (unsigned long long)md->len_bytes);
				return -EPROTO;
			}
		}
		if (per == 2) {
			const struct kvx_msg_region *v = &m->regions[r + 1];
			if (v->addr <= k->addr || (k->len_bytes && k->len_bytes > v->addr - k->addr)) {
				set_err(err, errlen,
					"layer '%s': V region 0x%llx must lie above the end of K region 0x%llx (+%llu)",
					md->layer, (unsigned long long)v->addr, (unsigned long long)k->addr,
					(unsigned long long)k->len_bytes);
				return -EPROTO;
			}
			pl.kv_offset = v->addr - k->addr;
		}
		out[j++] = pl;
		r += per;
	}
	return (int)j;
}

KVX_API int kvx_layout_check_peer_layer(const struct kvx_layout_geom *g, const struct kvx_layout_peer_layer *pl,
					char *err, size_t errlen)
{
	if (!g || !pl) {
		set_err(err, errlen, "peer layer check: NULL geometry or peer layer");
		return -EINVAL;
	}
	uint32_t want = g->kind == KVX_LAYOUT_KIND_SPLIT ? 2 : 1;
	if (pl->nregions != want) {
		set_err(err, errlen, "peer layer has %u regions, the local %s layout needs %u", pl->nregions,
			g->kind == KVX_LAYOUT_KIND_SPLIT ? "split K/V" : "one-region", want);
		return -EPROTO;
	}
	const uint64_t es = g->elem_size, nbr = g->remote_num_blocks ? g->remote_num_blocks : g->num_blocks;
	uint64_t kv = 0, last = 0, end = 0;
	if (g->has_kv_stride && g->transfers_per_block == 2 && __builtin_mul_overflow(es, g->remote_kv_stride, &kv))
		goto overflow;
	if (want == 2 && pl->kv_offset != kv) {
		set_err(err, errlen,
			"peer V plane is %llu bytes above K, the offsets of docs/protocol.md §4.3 expect %llu "
			"(remote_kv_stride %llu elements x %llu bytes, peer num_blocks %llu)",
			(unsigned long long)pl->kv_offset, (unsigned long long)kv,
			(unsigned long long)g->remote_kv_stride, (unsigned long long)es, (unsigned long long)nbr);
		return -EPROTO;
	}
	/* Last byte a plan can touch: the V entry (or the only entry) of remote block nbr-1. */
	if (nbr == 0 || __builtin_mul_overflow(nbr - 1, g->block_stride, &last) ||
	    __builtin_mul_overflow(last, es, &last) || __builtin_add_overflow(last, kv, &end) ||
	    __builtin_add_overflow(end, g->block_len, &end) || pl->k_addr < pl->mr_addr ||
	    __builtin_add_overflow(end, pl->k_addr - pl->mr_addr, &end))
		goto overflow;
	if (end > pl->mr_len) {
		set_err(err, errlen,
			"peer num_blocks %llu reaches %llu bytes into its MemoryDesc of %llu bytes",
			(unsigned long long)nbr, (unsigned long long)end, (unsigned long long)pl->mr_len);
		return -EPROTO;
	}
	return 0;
overflow:
	set_err(err, errlen, "peer layer geometry overflows (num_blocks %llu, K at 0x%llx, MemoryDesc 0x%llx)",
		(unsigned long long)nbr, (unsigned long long)pl->k_addr, (unsigned long long)pl->mr_addr);
	return -EPROTO;
}
