# SPDX-License-Identifier: Apache-2.0
"""KvxferConnector end to end: a producer and a consumer vLLM instance (stand-ins, see
vllm_standin.py) in separate processes, driven through the connector in vLLM's call order;
the test plays the MoRIIO proxy (request ids embed both addresses, §1.3 step 2). Bytes are
checked once the connector reported the request finished (D: loaded; P: blocks freed)."""
from __future__ import annotations

import socket

import pytest

from standin_proc import InstanceProc, d_params, p_params, proxy_ids
from vllm_standin import BS, H, HD, MLA_D, NB, NLAYERS

PROMPT = 5 * BS + 2  # 6 blocks


def per_block_bytes(layout: str) -> int:
    return 2 * BS * H * HD * 2 if layout == "split" else BS * MLA_D * 2


@pytest.fixture(scope="module", params=[("write", "split"), ("write", "mla"), ("read", "split"), ("read", "mla")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def pair(request):
    mode, layout = request.param
    p = InstanceProc("kv_producer", mode == "read", layout)
    try:
        d = InstanceProc("kv_consumer", mode == "read", layout)
    except BaseException:
        p.close()
        raise
    yield mode, layout, p, d
    d.close()
    p.close()


def transfer(mode: str, p: InstanceProc, d: InstanceProc, seed: int, cached: int = 0) -> tuple[dict, dict, str]:
    rid, tid = proxy_ids(p, d)
    if mode == "write":
        # The proxy sends to P and D at once; D's scheduler allocates and sends remote_blocks,
        # P's workers push per layer.
        p.call("add", dict(request_id=rid, prompt_len=PROMPT, params=p_params(tid, d.tp), seed=seed))
        d.call("add", dict(request_id=rid, prompt_len=PROMPT, params=d_params(tid, p.tp), seed=seed,
                           cached_prefix_blocks=cached))
        d.call("step_until", ("waiting_remote", rid))
        p.call("step_until", ("freed", rid))
        d.call("step_until", ("loaded", rid))
    else:
        # P runs the prefill first; the proxy copies its returned params into D's request.
        p.call("add", dict(request_id=rid, prompt_len=PROMPT, params=p_params(tid, d.tp), seed=seed))
        p.call("step_until", ("finished", rid))
        # P's next step serves the blocks (the worker's start_load_kv): the consumer reads only
        # what the producer serves (block leases, issue 14); vLLM keeps stepping P meanwhile.
        p.call("step")
        fp = p.call("state", rid)["finish_params"]
        params = d_params(fp["transfer_id"], p.tp)
        params.update(remote_engine_id=fp["remote_engine_id"], remote_block_ids=fp["remote_block_ids"],
                      remote_dp_rank=fp["remote_dp_rank"])
        d.call("add", dict(request_id=rid, prompt_len=PROMPT, params=params, seed=seed, cached_prefix_blocks=cached))
        d.call("step_until", ("loaded", rid))
        p.call("step_until", ("freed", rid))
    d.call("step_until", ("settled", rid))  # D's terminal completion polled (READ: after the layers)
    return p.call("state", rid), d.call("state", rid), rid


def check_bytes(ps: dict, ds: dict, cached: int) -> None:
    """Each consumer TP rank holds exactly its producer rank's bytes (same TP: rank r <- r)."""
    n = len(ps["block_ids"])
    assert len(ds["block_ids"]) == n
    assert len(ds["bytes"]) == len(ps["bytes"])
    for rank, (pb, db) in enumerate(zip(ps["bytes"], ds["bytes"])):
        for layer in range(NLAYERS):
            for pos in range(cached, n):
                assert db[layer][pos] == pb[layer][pos], f"rank {rank} layer {layer} block position {pos}"
            for pos in range(cached):  # prefix-cache hit: never overwritten
                assert db[layer][pos] != pb[layer][pos], f"rank {rank} cached position {pos} was moved"


def mover(mode: str, ps: dict, ds: dict) -> dict:
    return ps["stats"] if mode == "write" else ds["stats"]


def test_end_to_end_byte_exact(pair):
    mode, layout, p, d = pair
    before = mover(mode, p.call("state", ""), d.call("state", ""))["bytes"]
    ps, ds, rid = transfer(mode, p, d, seed=11)
    check_bytes(ps, ds, 0)
    assert ps["freed"] and ds["loaded"] == ds["block_ids"] and not ds["load_errors"]
    moved = mover(mode, ps, ds)["bytes"] - before
    assert moved == len(ps["block_ids"]) * NLAYERS * per_block_bytes(layout)
    assert ps["free"] == NB  # P got every block back


def test_prefix_cache_partial_hit_moves_only_the_suffix(pair):
    mode, layout, p, d = pair
    before = mover(mode, p.call("state", ""), d.call("state", ""))["bytes"]
    ps, ds, rid = transfer(mode, p, d, seed=23, cached=2)
    check_bytes(ps, ds, 2)
    moved = mover(mode, ps, ds)["bytes"] - before
    assert moved == (len(ps["block_ids"]) - 2) * NLAYERS * per_block_bytes(layout)


@pytest.mark.parametrize("mode", ["write", "read"])
def test_abort_before_allocation_releases_producer(mode):
    """D aborts a request it never allocated: the connector releases P's blocks (P's defer
    timeout, 120 s, is past the hang bound, so only the release can free them in time)."""
    p = InstanceProc("kv_producer", mode == "read", "split")
    d = InstanceProc("kv_consumer", mode == "read", "split")
    try:
        rid, tid = proxy_ids(p, d)
        p.call("add", dict(request_id=rid, prompt_len=PROMPT, params=p_params(tid)))
        params = d_params(tid)
        if mode == "read":
            p.call("step_until", ("finished", rid))
            fp = p.call("state", rid)["finish_params"]
            params.update(remote_engine_id=fp["remote_engine_id"], remote_block_ids=fp["remote_block_ids"])
        d.call("add", dict(request_id=rid, prompt_len=PROMPT, params=params))
        d.call("abort", rid)
        d.call("step")
        p.call("step_until", ("freed", rid))
        ds = d.call("state", rid)
        assert ds["freed"] and ds["block_ids"] == [] and ds["free"] == NB and ds["loaded"] is None
        # READ: the worker's engine sent the release; WRITE: the scheduler did, as MoRIIO's
        # scheduler half (the worker's engine sent nothing), and P's blocks came back.
        assert (ds["stats"]["engine_notifications_sent"] >= 1) == (mode == "read")
        assert p.call("state", rid)["free"] == NB
    finally:
        d.close()
        p.close()


@pytest.mark.parametrize("abort_reaches_engine_first", [True, False], ids=["abort-first", "load-first"])
def test_abort_after_allocation_write(abort_reaches_engine_first):
    """D aborts while waiting for P's writes: its blocks stay held (delay_free) until the
    engine says nothing can land any more (abort-first: P answers the release; load-first:
    the abort reaches the engine after every byte landed), the request never loads, and P's
    blocks come back."""
    p = InstanceProc("kv_producer", False, "split")
    d = InstanceProc("kv_consumer", False, "split")
    try:
        rid, tid = proxy_ids(p, d)
        d.call("add", dict(request_id=rid, prompt_len=PROMPT, params=d_params(tid)))
        d.call("step_until", ("waiting_remote", rid))
        d.call("abort", rid)
        if abort_reaches_engine_first:
            d.call("step")  # the worker aborts the load: D's engine sends `release` to P
        ds = d.call("state", rid)
        assert not ds["freed"] and ds["free"] == NB - 6  # held while writes could land
        p.call("add", dict(request_id=rid, prompt_len=PROMPT, params=p_params(tid)))
        p.call("step_until", ("freed", rid))
        d.call("step_until", ("freed", rid))
        ds = d.call("state", rid)
        assert ds["free"] == NB and ds["loaded"] is None and not ds["load_errors"]
        assert p.call("state", rid)["free"] == NB
    finally:
        d.close()
        p.close()


@pytest.mark.parametrize("mode", ["read", "write"])
def test_failed_transfer_reported_as_load_errors(mode):
    """The producer address answers TCP but never speaks (a listener the test owns): the
    handshake (READ) or the transfer (WRITE) fails and the consumer's blocks for the request
    come back through get_block_ids_with_load_errors, never as silently loaded."""
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(16)
    port = lsn.getsockname()[1]
    d = InstanceProc("kv_consumer", mode == "read", "split", {"handshake_timeout": 2, "transfer_timeout": 3,
                                                               "defer_timeout": 4})
    try:
        rid = f"___prefill_addr_host:127.0.0.1,handshake:{port},notify:{port}___decode_addr_{d.zmq}_{'ab' * 16}"
        params = d_params("tx-fail")
        if mode == "read":
            params.update(remote_engine_id=f"127.0.0.1:{port}", remote_block_ids=list(range(6)))
        d.call("add", dict(request_id=rid, prompt_len=PROMPT, params=params))
        d.call("step_until", ("load_error", rid))
        ds = d.call("state", rid)
        assert ds["load_errors"] == set(ds["block_ids"]) and len(ds["block_ids"]) == 6
        assert ds["stats"]["transfers_failed"] == 1 and ds["stats"]["transfers_done"] == 0
    finally:
        d.close()
        lsn.close()


@pytest.mark.parametrize("mode", ["write", "read"])
def test_tp2_instances_byte_exact(mode):
    """Producer TP 2 -> consumer TP 2 (split K/V, one KV head per rank): each instance's two
    workers run in processes of their own (StandInWorkerProc) with an engine each on base
    ports + rank; WRITE: D's scheduler sends remote_blocks to both P ranks; READ: each D rank
    reads from its P rank and releases it. Every rank's bytes arrive at its peer rank, the
    request finishes only once both ranks reported it, and both instances get every block back."""
    p = InstanceProc("kv_producer", mode == "read", "split", tp=2)
    try:
        d = InstanceProc("kv_consumer", mode == "read", "split", tp=2)
    except BaseException:
        p.close()
        raise
    try:
        for seed in (31, 37):
            before = mover(mode, p.call("state", ""), d.call("state", ""))["bytes"]
            ps, ds, rid = transfer(mode, p, d, seed=seed)
            check_bytes(ps, ds, 0)
            assert ps["bytes"][0] != ps["bytes"][1]  # the ranks hold different heads
            assert ps["freed"] and ds["loaded"] == ds["block_ids"] and not ds["load_errors"]
            moved = mover(mode, ps, ds)["bytes"] - before
            assert moved == len(ps["block_ids"]) * NLAYERS * per_block_bytes("split")  # both ranks' halves
            assert ps["free"] == NB
        assert ds["stats"]["transfers_failed"] == 0 and ds["stats"]["transfers_done"] == 4  # 2 ranks x 2
    finally:
        d.close()
        p.close()
