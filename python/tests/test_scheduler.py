# SPDX-License-Identifier: Apache-2.0
"""The connector's scheduler half and MoRIIO conventions, checked against docs/protocol.md's rules
and test vectors (test_NN: vector NN of §7; test_secX_Y: section X.Y) without an engine."""
from __future__ import annotations

import msgpack
import pytest
import zmq

from conftest import HANG_S

from kvxfer.vllm import KvxferConnector, decode_address, parse_zmq_address, port_offset, prefill_address
from kvxfer.vllm.config import ConnectorConfig, is_read_mode
from vllm_standin import (StandInCacheConfig, StandInCachedRequestData, StandInKVCacheBlocks, StandInKVConnectorOutput,
                          StandInKVTransferConfig, StandInModelConfig, StandInRequest, StandInRole,
                          StandInSchedulerOutput, StandInStatus, StandInVllmConfig)

P_ADDR = "host:10.158.215.209,handshake:8405,notify:61005"
D_ADDR = "host:10.158.214.246,handshake:8405,notify:61005"
RID = f"cmpl-___prefill_addr_{P_ADDR}___decode_addr_{D_ADDR}_16f41eb3df75420fa6b78acc63bafd9a-0-b8ee174a"


class Clock:
    """Injected monotonic clock (the scheduler's deadlines are tested without waiting)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sched(kv_role: str, read: bool, block_size: int = 16, extra: dict | None = None, clock: Clock | None = None):
    ex = {"proxy_ip": "", "proxy_ping_port": 0, "http_port": 8000, "host_ip": "10.0.0.5",
          "read_mode": read, "defer_timeout": 60}
    ex.update(extra or {})
    cfg = StandInVllmConfig(StandInKVTransferConfig("KvxferConnector", kv_role, kv_connector_extra_config=ex),
                            StandInCacheConfig(block_size), StandInModelConfig(8, 128))
    c = KvxferConnector(cfg, StandInRole.SCHEDULER)
    if clock is not None:
        c.connector_scheduler.now = clock
    return c


def req(rid: str, n: int, params: dict | None, status=StandInStatus.WAITING) -> StandInRequest:
    return StandInRequest(rid, list(range(n)), params, status=status)


class ProducerNotifyPorts:
    """STAND-IN for a producer instance's notify listeners (its workers' engines): real ZMQ
    ROUTERs (pyzmq) on loopback at ``base + port_offset(dp, tp, tp_size)`` for the given
    (dp, tp) ranks, decoding what the decode scheduler sends them (docs/protocol.md §3.2)."""

    def __init__(self, ranks: list[tuple[int, int]], tp_size: int) -> None:
        self.ctx = zmq.Context()
        # The first rank's socket takes a random free port and fixes the base; the others bind
        # at their offsets from it. No probe socket: ZMQ closes sockets on its I/O thread, so
        # a probe's port may still be held when the same port is bound right after (that made
        # every try of a loaded CI run fail).
        for _ in range(50):
            self.socks: dict[tuple[int, int], zmq.Socket] = {}
            try:
                dp0, tp0 = ranks[0]
                first = self.ctx.socket(zmq.ROUTER)
                self.socks[(dp0, tp0)] = first
                port = first.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=60000)
                base = port - port_offset(dp0, tp0, tp_size)
                for dp, tp in ranks[1:]:
                    sk = self.ctx.socket(zmq.ROUTER)
                    self.socks[(dp, tp)] = sk
                    sk.bind(f"tcp://127.0.0.1:{base + port_offset(dp, tp, tp_size)}")
                self.base = base
                return
            except zmq.ZMQError:
                for sk in self.socks.values():
                    sk.close(linger=0)
        raise RuntimeError("no free port range for the producer stand-in")

    def recv(self, dp: int, tp: int) -> dict:
        sk = self.socks[(dp, tp)]
        assert sk.poll(int(HANG_S * 1000)), f"nothing reached producer rank dp {dp} tp {tp}"
        frames = sk.recv_multipart()
        assert len(frames) == 2  # identity + one msgpack payload (§3.2)
        return msgpack.unpackb(frames[1], raw=False)

    def silent(self, dp: int, tp: int) -> bool:
        return not self.socks[(dp, tp)].poll(0)

    def close(self) -> None:
        for sk in self.socks.values():
            sk.close(linger=0)
        self.ctx.term()


@pytest.fixture
def producer_tp2():
    ports = ProducerNotifyPorts([(0, 0), (0, 1)], 2)
    yield ports
    ports.close()


def local_rid(notify_base: int) -> str:
    """A proxy request id whose prefill address is the loopback producer stand-in."""
    return (f"cmpl-___prefill_addr_host:127.0.0.1,handshake:{notify_base - 1000},notify:{notify_base}"
            f"___decode_addr_{D_ADDR}_16f41eb3df75420fa6b78acc63bafd9a-0-b8ee174a")


def test_44_matched_tokens():
    for read in (False, True):
        assert sched("kv_producer", read).get_num_new_matched_tokens(req("r", 8, {"do_remote_decode": True}), 0) == (0, False)
    w = sched("kv_consumer", False)
    assert w.get_num_new_matched_tokens(req("r", 8, {"do_remote_prefill": True, "transfer_id": "t"}), 0) == (8, True)
    r = sched("kv_consumer", True)
    for params in (None, {}, {"do_remote_prefill": False}):
        assert r.get_num_new_matched_tokens(req("r", 32, params), 0) == (0, False)
    assert r.get_num_new_matched_tokens(req("r", 32, {"do_remote_prefill": True}), 0) == (31, False)
    assert r.get_num_new_matched_tokens(req("r", 1, {"do_remote_prefill": True}), 0) == (0, False)


def test_matched_tokens_zero_after_completed_write(producer_tp2):
    """PR #53549 (§5.9): once the load completed, a rescheduled request does not wait again."""
    s = sched("kv_consumer", False)
    rid = local_rid(producer_tp2.base)
    r = req(rid, 40, {"do_remote_prefill": True, "transfer_id": "tx-1", "remote_tp_size": 2})
    s.update_state_after_alloc(r, StandInKVCacheBlocks([1, 2, 3], 0), 40)
    s.update_connector_output(StandInKVConnectorOutput(finished_recving={rid}))
    r.kv_transfer_params["do_remote_prefill"] = True
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s.shutdown()


def test_45_write_producer_saves_allocated_blocks():
    s = sched("kv_producer", False)
    r = req(RID, 40, {"do_remote_decode": True, "transfer_id": "tx-1"})
    s.update_state_after_alloc(r, StandInKVCacheBlocks([4, 9, 2], 0), 0)
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert [(x.transfer_id, x.req_id, x.local_blocks) for x in m.saves] == [("tx-1", RID, [4, 9, 2])]
    # the peer comes from the decode part of the request id (§1.3 step 7)
    assert m.saves[0].peer[:3] == ("10.158.214.246", 8405, 61005)
    assert m.tid_to_req == {"tx-1": RID}


def test_45_chunked_prefill_saves_on_the_final_chunk():
    s = sched("kv_producer", False)
    r = req(RID, 160, {"do_remote_decode": True, "transfer_id": "tx-c"})
    s.update_state_after_alloc(r, StandInKVCacheBlocks(list(range(4)), 0), 0)
    counts = []
    for new in ([], [4, 5, 6, 7], [8, 9]):
        so = StandInSchedulerOutput()
        if new:
            so.scheduled_cached_reqs = StandInCachedRequestData([RID], [(new,)])
        m = s.build_connector_meta(so)
        counts.append((len(m.saves), len(m.reads), len(m.serves)))
    assert counts == [(0, 0, 0), (0, 0, 0), (1, 0, 0)]
    assert m.saves[0].local_blocks == list(range(10))


def test_45_read_consumer_recv_entry_and_partial_hit_pairing():
    s = sched("kv_consumer", True)
    params = {"do_remote_prefill": True, "transfer_id": "tx-r", "remote_block_ids": [20, 21, 22, 23],
              "remote_engine_id": "10.158.215.209:8405"}
    r = req(RID, 64, params)
    s.update_state_after_alloc(r, StandInKVCacheBlocks([5, 6, 7, 8], 0), 63)
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert [(x.local_blocks, x.remote_blocks) for x in m.reads] == [([5, 6, 7, 8], [20, 21, 22, 23])]
    assert m.reads[0].peer[:3] == ("10.158.215.209", 8405, 61005)
    assert params["do_remote_prefill"] is False
    # prefix hit of 2 blocks: only the suffix is paired, by token position (§6 item 8)
    params = dict(params, do_remote_prefill=True, transfer_id="tx-r2")
    s.update_state_after_alloc(req(RID + "2", 64, params), StandInKVCacheBlocks([1, 2, 7, 9], 2), 31)
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert [(x.local_blocks, x.remote_blocks) for x in m.reads] == [([7, 9], [22, 23])]


def test_sec5_7_full_hit_sends_release_only(producer_tp2):
    """WRITE, nothing to load: the decode scheduler releases P's blocks itself (a `release`
    to every producer TP rank, naming its own TP size) and gives the worker no load."""
    s = sched("kv_consumer", False)
    r = req(local_rid(producer_tp2.base), 32, {"do_remote_prefill": True, "transfer_id": "tx-f", "remote_tp_size": 2})
    s.update_state_after_alloc(r, StandInKVCacheBlocks([1, 2], 2), 0)
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert m.announces == [] and m.releases == [] and m.reads == []
    for tp in (0, 1):
        msg = producer_tp2.recv(0, tp)
        assert list(msg) == ["type", "transfer_id", "consumer_tp_size"]
        assert msg == {"type": "release", "transfer_id": "tx-f", "consumer_tp_size": 1}
    s.shutdown()


def test_sec1_3_5b_write_scheduler_sends_remote_blocks(producer_tp2):
    """WRITE: at allocation the decode scheduler (not a worker) sends `remote_blocks` with the
    newly allocated block ids and its DP rank to every TP rank of the producer's DP rank, in
    MoRIIO's key order (§3.2), and hands the worker the load to await (no second send)."""
    s = sched("kv_consumer", False)
    s.connector_scheduler.cfg.dp_rank, s.connector_scheduler.cfg.dp_size = 1, 2
    rid = local_rid(producer_tp2.base)
    r = req(rid, 64, {"do_remote_prefill": True, "transfer_id": "tx-w", "remote_tp_size": 2})
    s.update_state_after_alloc(r, StandInKVCacheBlocks([8, 3, 11, 4], 1), 48)  # 1 cached block
    for tp in (0, 1):
        msg = producer_tp2.recv(0, tp)
        assert list(msg) == ["req_id", "transfer_id", "block_notify_list", "decode_rank", "type"]
        assert msg == {"req_id": rid, "transfer_id": "tx-w", "block_notify_list": [3, 11, 4], "decode_rank": 1,
                       "type": "remote_blocks"}
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert [(x.transfer_id, x.req_id, x.local_blocks) for x in m.announces] == [("tx-w", rid, [3, 11, 4])]
    assert m.announces[0].peer[:3] == ("127.0.0.1", producer_tp2.base - 1000, producer_tp2.base)
    assert producer_tp2.silent(0, 0) and producer_tp2.silent(0, 1)
    s.shutdown()


def test_sec3_6_producer_read_request_finished_params():
    s = sched("kv_producer", True, extra={"handshake_port": 6301, "notify_port": 61005})
    r = req(RID, 40, {"do_remote_decode": True, "transfer_id": "tx-p", "remote_tp_size": 1},
            status=StandInStatus.FINISHED_LENGTH_CAPPED)
    s.update_state_after_alloc(r, StandInKVCacheBlocks([3, 4, 5], 0), 0)
    delay, params = s.request_finished(r, [3, 4, 5])
    assert delay is True
    assert params == {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [3, 4, 5],
                      "remote_engine_id": "10.0.0.5:6301", "remote_host": "10.0.0.5", "remote_port": 6301,
                      "remote_handshake_port": 6301, "remote_notify_port": 61005, "remote_dp_rank": 0,
                      "remote_dp_rank_override": True, "remote_dp_size": 1, "remote_dp_size_local": 0,
                      "tp_size": 1, "transfer_id": "tx-p"}
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert [(x.transfer_id, x.local_blocks) for x in m.serves] == [("tx-p", [3, 4, 5])]
    # not length-capped (aborted) or no blocks: freed at once
    r2 = req("r2", 40, {"do_remote_decode": True, "transfer_id": "tx-q"}, status=StandInStatus.FINISHED_ABORTED)
    assert s.request_finished(r2, [1]) == (False, None)
    r3 = req("r3", 40, {"do_remote_decode": True, "transfer_id": "tx-z"}, status=StandInStatus.FINISHED_LENGTH_CAPPED)
    assert s.request_finished(r3, []) == (False, None)


def test_53_reconciliation_early_stale_and_reaped_acks():
    clk = Clock()
    s = sched("kv_producer", False, clock=clk)

    def finished(rid: str, tid: str):
        r = req(rid, 16, {"do_remote_decode": True, "transfer_id": tid}, status=StandInStatus.FINISHED_LENGTH_CAPPED)
        s.update_state_after_alloc(r, StandInKVCacheBlocks([1], 0), 0)
        return s.request_finished(r, [1])

    def update(acks):
        out = StandInKVConnectorOutput(finished_sending=set(acks) or None)
        s.update_connector_output(out)
        return out.finished_sending

    assert finished("A", "ta") == (True, None)
    assert update({"A"}) == {"A"}                      # (a) ACK while deferred
    assert "ta" not in s.connector_scheduler.tid_to_req
    assert update({"B"}) is None                       # (b) early ACK parked
    clk.t += 10
    finished("B", "tb")
    assert update(set()) == {"B"}
    finished("C", "tc")                                # (c) no ACK: reaped at the deadline
    clk.t += 59.9
    assert update(set()) is None
    clk.t += 0.1
    assert update(set()) == {"C"}
    assert update({"X"}) is None                       # (d) never matched: dropped at t0 + D
    clk.t += 60
    assert update(set()) is None
    assert s.connector_scheduler.pending_acks == {}


def test_38_write_abort_before_allocation_releases():
    """Vector 38 (§3.3): a WRITE request finished before allocation; its address comes from
    the params (remote_host / remote_notify_port 7000, here a free base), P DP rank 1 with TP 2:
    the scheduler sends `release` to base + port_offset(1, 0, 2) and base + port_offset(1, 1, 2)."""
    ports = ProducerNotifyPorts([(1, 0), (1, 1)], 2)
    try:
        s = sched("kv_consumer", False)
        params = {"do_remote_prefill": True, "transfer_id": "xfer-7", "remote_host": "127.0.0.1",
                  "remote_notify_port": ports.base, "remote_dp_rank": 1, "remote_tp_size": 2}
        assert s.request_finished(req("plain-id", 16, params), []) == (False, None)
        assert params["do_remote_prefill"] is False
        for tp in (0, 1):
            assert ports.recv(1, tp) == {"type": "release", "transfer_id": "xfer-7", "consumer_tp_size": 1}
        m = s.build_connector_meta(StandInSchedulerOutput())
        assert m.reads == [] and m.announces == [] and m.releases == []
        # no address and a plain request id: nothing can be sent
        assert s.request_finished(req("plain-2", 16, {"do_remote_prefill": True, "transfer_id": "x8"}), []) == \
            (False, None)
        assert s.build_connector_meta(StandInSchedulerOutput()).releases == []
        assert ports.silent(1, 0) and ports.silent(1, 1)
        s.shutdown()
    finally:
        ports.close()


def test_read_abort_before_allocation_releases_through_the_worker():
    """READ: the release of a never-allocated request goes through the worker (its engine
    sends it; kvx_xfer_read with no blocks)."""
    s = sched("kv_consumer", True)
    params = {"do_remote_prefill": True, "transfer_id": "xfer-9", "remote_host": "127.0.0.1",
              "remote_notify_port": 7000}
    assert s.request_finished(req("plain-id", 16, params), []) == (False, None)
    m = s.build_connector_meta(StandInSchedulerOutput())
    assert [(x.transfer_id, x.local_blocks, x.peer.host, x.peer.notify_port) for x in m.releases] == \
        [("xfer-9", [], "127.0.0.1", 7000)]


def test_abort_after_allocation_delays_the_free(producer_tp2):
    s = sched("kv_consumer", False)
    rid = local_rid(producer_tp2.base)
    r = req(rid, 32, {"do_remote_prefill": True, "transfer_id": "tx-a", "remote_tp_size": 2})
    s.update_state_after_alloc(r, StandInKVCacheBlocks([1, 2], 0), 32)
    s.build_connector_meta(StandInSchedulerOutput())
    assert s.request_finished(r, [1, 2]) == (True, None)
    assert s.build_connector_meta(StandInSchedulerOutput()).aborts == [("tx-a", rid)]
    s.shutdown()


def test_52_parsing_and_request_ids():
    assert parse_zmq_address("host:::1,handshake:6301,notify:61005") == ("::1", 6301, 61005)
    with pytest.raises(ValueError, match="Malformed zmq_address"):
        parse_zmq_address("host:1.2.3.4,handshake:6301")
    with pytest.raises(ValueError, match="Malformed zmq_address"):
        parse_zmq_address("host:1.2.3.4,handshake:x,notify:1")
    assert prefill_address(RID) == ("10.158.215.209", 8405, 61005)
    assert decode_address(RID) == ("10.158.214.246", 8405, 61005)
    assert prefill_address("plain") is None and decode_address("plain") is None


def test_33_54_port_offset():
    assert port_offset(1, 1) == 2 and port_offset(0, 2) == 2 and port_offset(1, 1, 4) == 5
    for dp, tp in ((2, 2), (2, 4), (4, 2)):
        offs = {port_offset(d, t, tp) for d in range(dp) for t in range(tp)}
        assert len(offs) == dp * tp
    with pytest.raises(ValueError, match="tp_size must be positive"):
        port_offset(1, 0, 0)


def test_config_keys_as_moriio():
    for v, read in (("true", True), ("1", True), (True, True), ("yes", True), ("on", True), ("false", False),
                    ("0", False), (None, False), ("garbage", False)):
        assert is_read_mode(v) is read, v
    s = sched("kv_consumer", "true", extra={"handshake_port": "", "notify_port": None})
    c = s.cfg
    assert (c.handshake_port, c.notify_port, c.mode.name, c.host, c.http_port) == (6301, 61005, "READ", "10.0.0.5", 8000)
    for key in ("proxy_ip", "proxy_ping_port", "http_port"):
        ex = {"proxy_ip": "", "proxy_ping_port": 0, "http_port": 1}
        del ex[key]
        cfg = StandInVllmConfig(StandInKVTransferConfig("KvxferConnector", "kv_consumer", kv_connector_extra_config=ex),
                                StandInCacheConfig(16), StandInModelConfig(8, 128))
        with pytest.raises(ValueError, match=key):
            ConnectorConfig.from_vllm_config(cfg)
    with pytest.raises(ValueError, match="kv_role"):
        sched("kv_both", False)
