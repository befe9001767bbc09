/* SPDX-License-Identifier: Apache-2.0 */
/* Reader-fence confirmation by several progress threads (fence.h). */
#include "fence.h"

uint64_t kvx_fence_note(struct kvx_fence_set *f, uint32_t k, uint64_t cut)
{
	if (cut == atomic_load_explicit(&f->seen[k], memory_order_relaxed))
		return atomic_load_explicit(&f->done, memory_order_relaxed);
	/* F1: store, then load the others'; each thread does the same after its own store. */
	atomic_store_explicit(&f->seen[k], cut, memory_order_seq_cst);
	uint64_t m = cut;
	for (uint32_t j = 0; j < f->n; j++) {
		uint64_t s = atomic_load_explicit(&f->seen[j], memory_order_seq_cst);
		m = s < m ? s : m;
	}
	uint64_t d = atomic_load_explicit(&f->done, memory_order_relaxed);
	while (d < m && !atomic_compare_exchange_weak_explicit(&f->done, &d, m, memory_order_release,
							       memory_order_relaxed))
		;
	return d < m ? m : d;
}
