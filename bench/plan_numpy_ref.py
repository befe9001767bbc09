#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Peer of `kvxfer-perf plan`: the seed's planning algorithm (docs/protocol.md §4.3-§4.4) in numpy.

The seed (vLLM's MoRIIO connector) plans one layer like this, and this file re-states it in our
own code so kvxfer-perf can time it in the same session, on the same geometry and block ids:
  1. offsets: walk the (local id, remote id) pairs in order in Python; each pair gives a K triple
     (es*lb*block_stride, es*rb*block_stride, block_len) and, with two transfers per block, a V
     triple shifted by the local / remote kv stride;
  2. merge (numpy): if the local offsets are not non-decreasing, stable-argsort the triples by
     local offset; a triple starts a new run unless it follows its predecessor exactly on both
     sides; each run becomes (first local, first remote, summed size).
A fully vectorised variant of step 1 ("vec") is timed too, as an informative second figure.

Usage (driven by kvxfer-perf plan; every number is an integer):
  plan_numpy_ref.py IDS_FILE OUT_FILE ES BLOCK_STRIDE BLOCK_LEN TPB LOCAL_KV REMOTE_KV LAYERS MIN_MS
IDS_FILE holds n local ids then n remote ids as little-endian uint32. The merged plan of the
seed variant is written to OUT_FILE as little-endian uint64 triples (loc, rem, size) so the
caller can check that both planners agree byte for byte. stdout gets one line:
  seed_ns_per_block_layer=<f> vec_ns_per_block_layer=<f> ranges=<n>
Exit status 0 on success, 2 on bad arguments.
"""
from __future__ import annotations

import sys
import time

import numpy as np


def seed_offsets(
    lids: list[int], rids: list[int], es: int, bs: int, blen: int, tpb: int, lkv: int, rkv: int
) -> tuple[list[int], list[int], list[int]]:
    """Per-pair Python loop, as the seed does it: K triple, then V triple when tpb is 2."""
    loc: list[int] = []
    rem: list[int] = []
    size: list[int] = []
    for lb, rb in zip(lids, rids):
        loc.append(es * lb * bs)
        rem.append(es * rb * bs)
        size.append(blen)
        if tpb == 2:
            loc.append(es * (lkv + lb * bs))
            rem.append(es * (rkv + rb * bs))
            size.append(blen)
    return loc, rem, size


def vec_offsets(
    lids: np.ndarray, rids: np.ndarray, es: int, bs: int, blen: int, tpb: int, lkv: int, rkv: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same triples in the same order, built with whole-array numpy operations."""
    lk = lids * (es * bs)
    rk = rids * (es * bs)
    if tpb == 2:
        loc = np.stack([lk, lk + es * lkv], axis=1).ravel()
        rem = np.stack([rk, rk + es * rkv], axis=1).ravel()
    else:
        loc, rem = lk, rk
    return loc, rem, np.full(loc.shape[0], blen, dtype=np.int64)


def merge(loc, rem, size) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous-range merge of §4.4 with numpy; inputs are lists or int64 arrays."""
    loc = np.asarray(loc, dtype=np.int64)
    rem = np.asarray(rem, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    if loc.shape[0] <= 1:
        return loc, rem, size
    if np.any(loc[1:] < loc[:-1]):
        order = np.argsort(loc, kind="stable")
        loc, rem, size = loc[order], rem[order], size[order]
    joins = (loc[1:] - loc[:-1] == size[:-1]) & (rem[1:] - rem[:-1] == size[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    ends = np.concatenate((starts[1:], [loc.shape[0]])) - 1
    return loc[starts], rem[starts], loc[ends] + size[ends] - loc[starts]


def time_way(fn, layers: int, min_ns: int) -> float:
    """Fastest single call (one layer's plan), ns, over passes of `layers` calls for at least
    min_ns in total. Timing each call alone, as kvxfer-perf does for kvx, keeps the two figures
    comparable on a loaded machine: a long pass is more likely to be preempted than a short one."""
    best = float("inf")
    start = time.perf_counter_ns()
    passes = 0
    while True:
        for _ in range(layers):
            t0 = time.perf_counter_ns()
            fn()
            best = min(best, time.perf_counter_ns() - t0)
        passes += 1
        if time.perf_counter_ns() - start >= min_ns and passes >= 3:
            return best


def main(argv: list[str]) -> int:
    if len(argv) != 11:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        es, bs, blen, tpb, lkv, rkv, layers, min_ms = (int(a) for a in argv[3:])
    except ValueError:
        print("plan_numpy_ref: numeric arguments must be integers", file=sys.stderr)
        return 2
    ids = np.fromfile(argv[1], dtype="<u4").astype(np.int64)
    if ids.shape[0] % 2 or tpb not in (1, 2) or layers < 1:
        print("plan_numpy_ref: bad ids file or arguments", file=sys.stderr)
        return 2
    n = ids.shape[0] // 2
    lids_np, rids_np = ids[:n], ids[n:]
    lids, rids = lids_np.tolist(), rids_np.tolist()

    def seed():
        return merge(*seed_offsets(lids, rids, es, bs, blen, tpb, lkv, rkv))

    def vec():
        return merge(*vec_offsets(lids_np, rids_np, es, bs, blen, tpb, lkv, rkv))

    ref = seed()
    alt = vec()
    if not all(np.array_equal(a, b) for a, b in zip(ref, alt)):
        print("plan_numpy_ref: loop and vectorised offsets disagree", file=sys.stderr)
        return 1
    np.stack(ref, axis=1).astype("<u8").tofile(argv[2])
    min_ns = min_ms * 1_000_000
    seed_ns = time_way(seed, layers, min_ns) / n
    vec_ns = time_way(vec, layers, min_ns) / n
    print(f"seed_ns_per_block_layer={seed_ns:.3f} vec_ns_per_block_layer={vec_ns:.3f} ranges={ref[0].shape[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
