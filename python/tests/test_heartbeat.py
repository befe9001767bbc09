# SPDX-License-Identifier: Apache-2.0
"""The connector's proxy heartbeat is MoRIIO's (docs/protocol.md §2.5, §3.4): with proxy_ip set,
global rank 0's engine registers with a real ZMQ ROUTER (pyzmq) standing in for the proxy."""
from __future__ import annotations

import msgpack
import pytest
import zmq

from conftest import HANG_S
from kvxfer.vllm import KvxferConnector, parse_zmq_address
from vllm_standin import (BS, H, HD, StandInCacheConfig, StandInKVTransferConfig, StandInModelConfig, StandInRole,
                          StandInVllmConfig, make_kv)


def heartbeat(kv_role: str, read: bool) -> tuple[dict, tuple[int, int]]:
    """Start a worker connector with the proxy set; return its first heartbeat and bound ports."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ex = {"proxy_ip": "127.0.0.1", "proxy_ping_port": str(port), "http_port": "8100", "host_ip": "127.0.0.1",
          "read_mode": read, "kvxfer_transport": "tcp", "kvxfer_ephemeral_ports": True}
    cfg = StandInVllmConfig(StandInKVTransferConfig("KvxferConnector", kv_role, kv_connector_extra_config=ex),
                            StandInCacheConfig(BS), StandInModelConfig(H, HD))
    w = KvxferConnector(cfg, StandInRole.WORKER)
    try:
        w.register_kv_caches(make_kv("split"))
        assert router.poll(int(HANG_S * 1000)), "no heartbeat reached the proxy"
        ident, payload = router.recv_multipart()
        return msgpack.unpackb(payload, raw=False), w.bound_ports()
    finally:
        w.shutdown()
        router.close()
        ctx.term()


@pytest.mark.parametrize("kv_role,read,typ,mode", [("kv_producer", True, "P", "READ"),
                                                   ("kv_consumer", False, "D", "WRITE")])
def test_heartbeat_registers_with_the_proxy(kv_role, read, typ, mode):
    msg, (hs, nt) = heartbeat(kv_role, read)
    assert list(msg) == ["type", "http_address", "zmq_address", "dp_size", "tp_size", "transfer_mode"]
    assert (msg["type"], msg["http_address"], msg["dp_size"], msg["tp_size"], msg["transfer_mode"]) == \
        (typ, "127.0.0.1:8100", 1, 1, mode)
    host, _, notify = parse_zmq_address(msg["zmq_address"])
    assert (host, notify) == ("127.0.0.1", nt)


def test_heartbeat_names_the_bound_handshake_port_with_ephemeral_ports():
    """With ephemeral ports (params 0) the proxy must learn the ports actually bound: the
    handshake port the consumer dials and the notify port, not the configured defaults."""
    msg, (hs, nt) = heartbeat("kv_consumer", False)
    assert parse_zmq_address(msg["zmq_address"]) == ("127.0.0.1", hs, nt)
    assert hs != 6301
