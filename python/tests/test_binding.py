# SPDX-License-Identifier: Apache-2.0
"""kvxfer binding: argument checking, both transfer modes between two engines, the eventfd,
stats, and memory growth over 10,000 register/transfer/poll cycles."""
from __future__ import annotations

import ctypes
import errno
import gc
import os
import selectors
import tracemalloc

import pytest
import torch

import kvxfer
from kvx_util import NB, SPEC, Tracker, engine, peer_of, split_layer

P, D = kvxfer.Role.PRODUCER, kvxfer.Role.CONSUMER


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def c_heap_in_use() -> int:
    """Bytes in use in glibc's malloc heap (all threads' arenas) plus mmapped chunks: covers
    the extension, libkvxfer, libzmq. Under scripts/python-asan.sh (KVX_PY_ASAN set, the
    sanitizer runtime preloaded) ASan's allocator serves every malloc instead, and its own
    count of allocated bytes is read."""
    libc = ctypes.CDLL(None)
    if os.environ.get("KVX_PY_ASAN"):
        asan_bytes = libc.__sanitizer_get_current_allocated_bytes
        asan_bytes.restype = ctypes.c_size_t
        return int(asan_bytes())
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


@pytest.mark.parametrize("field,value,exc", [
    ("dp_size", 0, ValueError), ("tp_rank", -1, ValueError), ("handshake_port", 70000, ValueError),
    ("max_blocks", 1 << 25, ValueError), ("role", 5, ValueError), ("host", 3, TypeError),
    ("vllm_port_compat", 1, TypeError), ("transfer_timeout_ms", 0, ValueError), ("lcorez", "1", TypeError),
    ("spread", 2, ValueError), ("follow_waker", 1, TypeError),
    ("control_busy_poll_us", 2000000, ValueError),
    ("poller_slice_us", 200000, ValueError),
])
def test_bad_params_name_the_field(field, value, exc):
    with pytest.raises(exc, match=field):
        kvxfer.Engine(**{field: value})


def test_engine_create_error_carries_errno_and_message():
    with pytest.raises(kvxfer.KvxError) as ei:
        kvxfer.Engine(dp_rank=3, dp_size=2)
    assert ei.value.errno == errno.EINVAL
    assert "kvx_engine_create" in str(ei.value) and "dp_rank" in str(ei.value)
    assert isinstance(ei.value, OSError)


def test_bad_layers_and_transfer_args_name_the_field():
    e = engine(D, kvxfer.Mode.READ)
    with pytest.raises(kvxfer.KvxError, match="layout") as ei:
        e.register_tensor("l0", torch.zeros(2, 3, 4), SPEC)  # rank 3 without MLA
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ValueError, match="base"):
        e.register_layer("x", 0, (2, NB, 4, 2, 8), (1, 1, 1, 1, 1), 2, 4, 2, 8, False, 0, 0, None)
    with pytest.raises(ValueError, match="stride"):
        e.register_layer("x", 64, (2, NB, 4, 2, 8), (1, 1, 1, 1), 2, 4, 2, 8, False, 0, 0, None)
    with pytest.raises(ValueError, match="mem"):
        e.register_layer("x", 64, (2, NB, 4, 2, 8), (1, 1, 1, 1, 1), 2, 4, 2, 8, False, 9, 0, None)
    t = split_layer()
    e.register_tensor("l0", t, SPEC)
    with pytest.raises(kvxfer.KvxError) as ei:
        e.read("tx-1", [0], [0], kvxfer.Peer("127.0.0.1", 1, 2))
    assert ei.value.errno == errno.EBUSY  # not started
    e.start()
    peer = kvxfer.Peer("127.0.0.1", 1, 2)
    with pytest.raises(TypeError, match="transfer_id"):
        e.read(5, [0], [0], peer)
    with pytest.raises(ValueError, match="transfer_id"):
        e.read("x" * 200, [0], [0], peer)
    with pytest.raises(ValueError, match=r"local_blocks\[1\]"):
        e.read("tx-1", [0, -1], [0, 1], peer)
    with pytest.raises(TypeError, match=r"remote_blocks\[0\]"):
        e.read("tx-1", [0], ["a"], peer)
    with pytest.raises(ValueError, match="remote_blocks"):
        e.read("tx-1", [0, 1], [0], peer)
    with pytest.raises(ValueError, match="peer.notify_port"):
        e.read("tx-1", [0], [0], kvxfer.Peer("127.0.0.1", 1, 99999))
    with pytest.raises(TypeError, match="peer"):
        e.read("tx-1", [0], [0], ("127.0.0.1", 1))
    with pytest.raises(kvxfer.KvxError) as ei:
        e.read("tx-1", [NB + 3], [0], peer)  # block id out of range
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ValueError, match="layer"):
        e.layer_poll("tx-1", 4)
    with pytest.raises(kvxfer.KvxError) as ei:
        e.abort("tx-unknown")
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(kvxfer.KvxError) as ei:
        e.serve("tx-2", [1])  # wrong role
    assert ei.value.errno == errno.EBUSY
    e.close()
    with pytest.raises(ValueError, match="closed"):
        e.stats()


def _pair(mode, p_kw=None, d_kw=None):
    p, d = engine(P, mode, **(p_kw or {})), engine(D, mode, **(d_kw or {}))
    src = [split_layer(fill=i + 1) for i in range(2)]
    dst = [split_layer() for _ in range(2)]
    for i in range(2):
        p.register_tensor(f"layer.{i}", src[i], SPEC)
        d.register_tensor(f"layer.{i}", dst[i], SPEC)
    p.start()
    d.start()
    return p, d, src, dst


@pytest.mark.parametrize("spread", [kvxfer.Spread.LAYERS, kvxfer.Spread.NONE])
def test_spread_reaches_the_engine_two_lcores_split_layers_or_one_owner(spread):
    """EngineParams.spread is the C engine's params.spread: on a consumer with two polling
    lcores, a 2-layer READ moves one layer on each lcore (LAYERS) or both on the owner (NONE);
    either way the bytes land exactly."""
    p, d, src, dst = _pair(kvxfer.Mode.READ, {"lcores": "0,1"}, {"lcores": "0,1", "spread": spread})
    dt = Tracker(d)
    p.serve("tx-spread", [3, 7, 1])
    d.read("tx-spread", [0, 5, 9], [3, 7, 1], peer_of(p))
    assert dt.terminal("tx-spread").status == kvxfer.CplStatus.DONE
    _expect(src, dst, [(0, 3), (5, 7), (9, 1)])
    layer_bytes = 3 * src[0][:, 0].numel() * src[0].element_size()
    moved = sorted(lc["bytes"] for lc in d.stats()["lcores"])
    assert moved == ([layer_bytes, layer_bytes] if spread == kvxfer.Spread.LAYERS else [0, 2 * layer_bytes])
    p.close()
    d.close()


def _expect(src, dst, pairs):
    for s, d in zip(src, dst):
        for lb, rb in pairs:
            assert torch.equal(d[:, lb], s[:, rb])
        others = [b for b in range(NB) if b not in {lb for lb, _ in pairs}]
        assert int(d[:, others].abs().sum()) == 0


def test_read_mode_byte_exact_and_selectors():
    p, d, src, dst = _pair(kvxfer.Mode.READ)
    pt, dt = Tracker(p), Tracker(d)
    p.serve("tx-r", [3, 7, 1])
    d.read("tx-r", [0, 5, 9], [3, 7, 1], peer_of(p))
    for layer in range(2):
        d.layer_wait("tx-r", layer, 60000)
        assert d.layer_poll("tx-r", layer) is True
    sel = selectors.DefaultSelector()
    sel.register(d.fileno(), selectors.EVENT_READ)
    assert sel.select(60), "eventfd not readable with a completion queued"
    c = dt.terminal("tx-r")
    assert (c.status, c.error, c.bytes) == (kvxfer.CplStatus.DONE, 0, 2 * 3 * 2 * 128)
    assert not sel.select(0), "eventfd readable with the queue drained"
    pt.released("tx-r")
    assert pt.terminal("tx-r").status == kvxfer.CplStatus.DONE
    _expect(src, dst, [(0, 3), (5, 7), (9, 1)])
    st = d.stats()
    assert st["transfers_done"] == 1 and st["lcores"] and st["lcores"][0]["bytes"] == c.bytes
    p.close()
    d.close()


def test_write_mode_byte_exact():
    p, d, src, dst = _pair(kvxfer.Mode.WRITE)
    pt, dt = Tracker(p), Tracker(d)
    d.announce("tx-w", [2, 4, 6], peer_of(p))
    p.write_begin("tx-w", [8, 0, 11], peer_of(d))
    for layer in range(2):
        p.layer_ready("tx-w", layer)
    p.seal("tx-w", 2)
    assert dt.terminal("tx-w").status == kvxfer.CplStatus.DONE
    assert pt.terminal("tx-w").status == kvxfer.CplStatus.DONE
    pt.released("tx-w")
    _expect(src, dst, [(2, 8), (4, 0), (6, 11)])
    p.close()
    d.close()


def test_write_mode_scheduler_notifier_byte_exact():
    """The decode scheduler's Notifier sends remote_blocks; the consumer engine, announced
    with notified=True, sends nothing and completes on P's write_done."""
    p, d, src, dst = _pair(kvxfer.Mode.WRITE)
    pt, dt = Tracker(p), Tracker(d)
    with kvxfer.Notifier(kvxfer.EngineParams(role=kvxfer.Role.CONSUMER, mode=kvxfer.Mode.WRITE, max_blocks=NB)) as nt:
        nt.announce("tx-nw", [3, 5], peer_of(p), "cmpl-req")
        d.announce("tx-nw", [3, 5], peer_of(p), True)
        p.write_begin("tx-nw", [9, 1], peer_of(d))
        for layer in range(2):
            p.layer_ready("tx-nw", layer)
        p.seal("tx-nw", 2)
        assert dt.terminal("tx-nw").status == kvxfer.CplStatus.DONE
        assert pt.terminal("tx-nw").status == kvxfer.CplStatus.DONE
        pt.released("tx-nw")
    _expect(src, dst, [(3, 9), (5, 1)])
    assert d.stats()["notifications_sent"] == 0
    p.close()
    d.close()


def test_notifier_bad_arguments_name_the_field():
    with pytest.raises(kvxfer.KvxError) as ei:
        kvxfer.Notifier(kvxfer.EngineParams(role=kvxfer.Role.PRODUCER, mode=kvxfer.Mode.WRITE))
    assert ei.value.errno == errno.EINVAL and "role/mode" in str(ei.value)
    with pytest.raises(ValueError, match="dp_size"):
        kvxfer.Notifier(kvxfer.EngineParams(dp_size=0))
    nt = kvxfer.Notifier(kvxfer.EngineParams(max_blocks=4))
    peer = kvxfer.Peer("127.0.0.1", 1, 2)
    with pytest.raises(TypeError, match="local_blocks"):
        nt.announce("tx-1", ["x"], peer)
    with pytest.raises(ValueError, match="transfer_id"):
        nt.announce("", [1], peer)
    with pytest.raises(kvxfer.KvxError) as ei:
        nt.announce("tx-1", [1, 2, 3, 4, 5], peer)  # more than max_blocks
    assert ei.value.errno == errno.EINVAL and "kvx_notifier_announce" in str(ei.value)
    nt.close()
    nt.close()
    with pytest.raises(ValueError, match="closed"):
        nt.announce("tx-1", [1], peer)


def test_abort_and_duplicate():
    p, d, _, _ = _pair(kvxfer.Mode.WRITE)
    dt = Tracker(d)
    d.announce("tx-a", [1], peer_of(p))
    with pytest.raises(kvxfer.KvxError) as ei:
        d.announce("tx-a", [2], peer_of(p))
    assert ei.value.errno == errno.EEXIST
    d.abort("tx-a")
    assert dt.terminal("tx-a").status == kvxfer.CplStatus.ABORTED
    assert d.stats()["duplicates_rejected"] == 1
    p.close()
    d.close()


def test_geometry_matches_layout_rules():
    g = kvxfer.geometry((2, NB, 4, 2, 8), (NB * 64, 64, 16, 8, 1), 2, SPEC)
    assert (g["kind"], g["num_blocks"], g["block_len"], g["transfers_per_block"]) == ("split", NB, 128, 2)
    g = kvxfer.geometry((NB, 4, 576), (4 * 576, 576, 1), 2, kvxfer.LayerSpec(4, is_mla=True))
    assert (g["kind"], g["block_len"], g["transfers_per_block"]) == ("mla", 4 * 576 * 2, 1)
    # kernel-block split: logical block 8 tokens stored as 2 kernel blocks of 4
    g = kvxfer.geometry((2, 2 * NB, 4, 2, 8), (2 * NB * 64, 64, 16, 8, 1), 2, kvxfer.LayerSpec(8, 2, 8))
    assert (g["num_blocks"], g["kernel_blocks_per_block"], g["block_len"]) == (NB, 2, 256)


def test_no_growth_over_10000_cycles():
    """10,000 transfer/poll cycles in READ mode (one block of both layers read, then released),
    plus a fresh engine registered, started and closed every 2,000 cycles (layers can only be
    registered before start). Measured after 5,000 warm-up cycles: the engine keeps the ids of
    its last 4,096 terminal transfers (late-notification filter), which fills first. Neither
    the Python heap (tracemalloc) nor glibc's C heap (mallinfo2: extension, libkvxfer, libzmq)
    may grow."""
    p, d, _, _ = _pair(kvxfer.Mode.READ)
    pt, dt = Tracker(p), Tracker(d)
    peer = peer_of(p)
    warm, n = 5000, 10000
    ids = [f"tx-{i}" for i in range(warm + n)]

    def cycle(i: int) -> None:
        tid = ids[i]
        p.serve(tid, [i % NB])
        d.read(tid, [(i + 1) % NB], [i % NB], peer)  # one block, both planes, both layers
        dt.terminal(tid)
        pt.released(tid)
        dt.seen.clear()
        pt.seen.clear()

    def fresh_engine() -> None:
        e = engine(D, kvxfer.Mode.READ)
        e.register_tensor("l", split_layer(), SPEC)
        e.start()
        e.close()

    for i in range(warm):
        cycle(i)
    fresh_engine()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    c_base = c_heap_in_use()
    for i in range(warm, warm + n):
        cycle(i)
        if i % 2000 == 0:
            fresh_engine()
    gc.collect()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(base, "filename"))
    tracemalloc.stop()
    c_grown = c_heap_in_use() - c_base
    print(f"growth: python {grown} B, C {c_grown} B")
    assert grown < 64 * 1024, f"Python heap grew {grown} bytes over {n} cycles"
    # a leaked completion, peer or id of even 16 bytes per cycle would be 160 KB
    assert c_grown < 96 * 1024, f"C heap grew {c_grown} bytes over {n} cycles"
    assert d.stats()["transfers_done"] == warm + n
    p.close()
    d.close()


def test_burst_larger_than_the_submission_ring():
    """max_transfers 2 gives an 8-entry ring to the lcore; 64 layer_ready + seal per transfer
    overflow it unless the binding retries ENOBUFS (ring full) until the lcore drained it."""
    nl, nb = 64, 8
    spec = kvxfer.LayerSpec(4, is_mla=True)
    p = engine(P, kvxfer.Mode.WRITE, max_transfers=2, max_blocks=nb)
    d = engine(D, kvxfer.Mode.WRITE, max_transfers=2, max_blocks=nb)
    src = [torch.arange(nb * 4 * 16, dtype=torch.int16).reshape(nb, 4, 16) + i for i in range(nl)]
    dst = [torch.zeros(nb, 4, 16, dtype=torch.int16) for _ in range(nl)]
    for i in range(nl):
        p.register_tensor(f"l{i}", src[i], spec)
        d.register_tensor(f"l{i}", dst[i], spec)
    p.start()
    d.start()
    pt, dt = Tracker(p), Tracker(d)
    for k in range(2):
        tid = f"tx-burst-{k}"
        d.announce(tid, [k], peer_of(p))
        p.write_begin(tid, [nb - 1 - k], peer_of(d))
        for layer in range(nl):
            p.layer_ready(tid, layer)
        p.seal(tid, nl)
    for k in range(2):
        assert dt.terminal(f"tx-burst-{k}").status == kvxfer.CplStatus.DONE
        pt.released(f"tx-burst-{k}")
    for i in range(nl):
        for k in range(2):
            assert torch.equal(dst[i][k], src[i][nb - 1 - k])
    p.close()
    d.close()


def test_asyncio_completions_on_the_eventfd():
    """completions_async() waits in the event loop on fileno(): no polling loop in Python."""
    import asyncio

    p, d, src, dst = _pair(kvxfer.Mode.READ)

    async def run() -> list[kvxfer.Completion]:
        p.serve("tx-aio", [2, 3])
        d.read("tx-aio", [4, 5], [2, 3], peer_of(p))
        got = []
        async for c in d.completions_async():
            got.append(c)
            if c.kind == kvxfer.CplKind.TRANSFER:
                return got
        return got

    from conftest import HANG_S
    got = asyncio.run(asyncio.wait_for(run(), HANG_S))
    assert [(c.transfer_id, c.status) for c in got] == [("tx-aio", kvxfer.CplStatus.DONE)]
    _expect(src, dst, [(4, 2), (5, 3)])
    Tracker(p).released("tx-aio")
    p.close()
    d.close()


def test_tensor_device_maps_to_memory_type():
    """cpu -> host memory; a GPU tensor ('cuda' is also ROCm torch's device type) -> HIP
    device memory on its index; anything else is refused naming tensor.device."""
    class Dev:
        def __init__(self, type_: str, index):
            self.type, self.index = type_, index

        def __str__(self) -> str:
            return f"{self.type}:{self.index}"

    class T:
        def __init__(self, dev):
            self.device = dev

    assert kvxfer.tensor_mem(torch.zeros(1)) == (kvxfer.Mem.HOST, 0)
    assert kvxfer.tensor_mem(T(Dev("cuda", 3))) == (kvxfer.Mem.HIP, 3)
    assert kvxfer.tensor_mem(T(Dev("cuda", None))) == (kvxfer.Mem.HIP, 0)
    with pytest.raises(ValueError, match="tensor.device"):
        kvxfer.tensor_mem(T(Dev("meta", None)))
