# SPDX-License-Identifier: Apache-2.0
"""MoRIIO-compatible configuration and address conventions (docs/protocol.md §1.2, §2.1-2.2, §3.3-3.5).

The connector reads the same ``kv_transfer_config`` / ``kv_connector_extra_config`` keys as
MoRIIOConnector, so a deployment switches by changing the connector name and module path.
kvxfer-only keys start with ``kvxfer_`` (transport, lcores, idle policy, port compat).
No network access here except ``resolve_host_ip`` (a UDP socket ``connect``: no packet sent).
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..engine import Idle, Mode, Peer, Role

DEFAULT_HANDSHAKE_PORT = 6301
DEFAULT_NOTIFY_PORT = 61005
_TRUTHY = {"true", "1", "yes", "on"}
_PREFILL_RE = re.compile(r"___prefill_addr_(.+?)___decode_addr_")
_DECODE_RE = re.compile(r"___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$")


def port_offset(dp_rank: int, tp_rank: int, tp_size: int = 1) -> int:
    """Worker port offset ``dp_rank*tp_size + tp_rank``; tp_size must be positive."""
    if tp_size <= 0:
        raise ValueError("tp_size must be positive")
    return dp_rank * tp_size + tp_rank


def zmq_address(host: str, handshake_port: int, notify_port: int) -> str:
    """The proxy's address string of a worker: ``host:<ip>,handshake:<port>,notify:<port>``."""
    return f"host:{host},handshake:{handshake_port},notify:{notify_port}"


def parse_zmq_address(addr: str) -> tuple[str, int, int]:
    """(host, handshake_port, notify_port) of a zmq_address; each segment splits on its first
    ':' (so ``host:::1`` is IPv6 ``::1``). Raises ValueError "Malformed zmq_address ..."."""
    fields: dict[str, str] = {}
    for seg in addr.split(","):
        k, sep, v = seg.partition(":")
        if sep:
            fields[k.strip()] = v.strip()
    try:
        return fields["host"], int(fields["handshake"]), int(fields["notify"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"Malformed zmq_address {addr!r}: {e}") from None


def prefill_address(request_id: str) -> Optional[tuple[str, int, int]]:
    """P's address embedded in a proxy request id (D side), or None."""
    m = _PREFILL_RE.search(request_id)
    return parse_zmq_address(m.group(1)) if m else None


def decode_address(request_id: str) -> Optional[tuple[str, int, int]]:
    """D's address embedded in a proxy request id (P side), or None."""
    m = _DECODE_RE.search(request_id)
    return parse_zmq_address(m.group(1)) if m else None


def is_read_mode(value: Any) -> bool:
    """``read_mode``: a bool, or a truthy string (true/1/yes/on); anything else is WRITE."""
    if isinstance(value, bool):
        return value
    return isinstance(value, (str, int)) and str(value).strip().lower() in _TRUTHY


def resolve_host_ip() -> str:
    """This host's outbound IP (no packet is sent), else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def resolve_peer(request_id: str, params: Mapping[str, Any], want_prefill: bool, local_tp: int) -> Optional[Peer]:
    """The peer engine of a request: from the request id embedding first, else the params'
    remote_host / remote_handshake_port / remote_notify_port. DP rank, pod layout and TP size
    come from params (remote_dp_rank, remote_dp_size_local, remote_tp_size or tp_size)."""
    addr = prefill_address(request_id) if want_prefill else decode_address(request_id)
    if addr is None:
        host = params.get("remote_host")
        hs = params.get("remote_handshake_port") or params.get("remote_port") or DEFAULT_HANDSHAKE_PORT
        nt = params.get("remote_notify_port")
        if not host or nt is None:
            return None
        addr = (str(host), int(hs), int(nt))
    tp = int(params.get("remote_tp_size") or 0) or int(params.get("tp_size") or 0)
    hosts = params.get("remote_hosts")
    return Peer(addr[0], addr[1], addr[2], int(params.get("remote_dp_rank") or 0),
                int(params.get("remote_dp_size_local") or 0), tp if tp != local_tp else 0,
                tuple(hosts) if hosts else None)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default) if obj is not None else default


@dataclass
class ConnectorConfig:
    """Everything the connector takes from vLLM's config (one worker or one scheduler)."""
    role: Role
    mode: Mode
    host: str
    handshake_port: int
    notify_port: int
    proxy_ip: str
    proxy_ping_port: int
    http_port: int
    block_size: int
    dp_rank: int = 0
    dp_size: int = 1
    dp_size_local: int = 0
    tp_size: int = 1
    transfer_timeout_s: float = 30.0
    defer_timeout_s: float = 60.0
    handshake_timeout_s: float = 10.0
    transport: str = "auto"
    lcores: Optional[str] = None
    idle: Idle = Idle.ADAPTIVE
    vllm_port_compat: bool = False

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> "ConnectorConfig":
        """Read kv_transfer_config (kv_role, kv_connector_extra_config), cache_config.block_size
        and parallel_config (DP rank/size/local size, TP size). Missing required MoRIIO keys
        (proxy_ip, proxy_ping_port, http_port) raise ValueError naming the key."""
        ktc = vllm_config.kv_transfer_config
        extra: Mapping[str, Any] = _get(ktc, "kv_connector_extra_config") or {}
        kv_role = _get(ktc, "kv_role")
        if kv_role == "kv_producer":
            role = Role.PRODUCER
        elif kv_role == "kv_consumer":
            role = Role.CONSUMER
        else:
            raise ValueError(f"kv_transfer_config.kv_role: {kv_role!r} must be kv_producer or kv_consumer")
        for key in ("proxy_ip", "proxy_ping_port", "http_port"):
            if key not in extra:
                raise ValueError(f"kv_connector_extra_config.{key}: required (as for MoRIIOConnector)")
        pc = _get(vllm_config, "parallel_config")
        dp_size = int(_get(pc, "data_parallel_size", 1) or 1)
        dp_local = int(_get(pc, "data_parallel_size_local", 0) or 0)

        def num(key: str, default: float) -> float:
            v = extra.get(key)
            try:
                return float(v) if v not in (None, "") else default
            except (TypeError, ValueError):
                raise ValueError(f"kv_connector_extra_config.{key}: {v!r} is not a number") from None

        # kvxfer_ephemeral_ports: bind any free ports (several instances on one host); the
        # worker's bound ports are then in KvxferConnector.bound_ports().
        ephemeral = is_read_mode(extra.get("kvxfer_ephemeral_ports", False))
        return cls(
            role=role,
            mode=Mode.READ if is_read_mode(extra.get("read_mode", False)) else Mode.WRITE,
            host=str(extra.get("host_ip") or resolve_host_ip()),
            handshake_port=0 if ephemeral else int(num("handshake_port", DEFAULT_HANDSHAKE_PORT) or DEFAULT_HANDSHAKE_PORT),
            notify_port=0 if ephemeral else int(num("notify_port", DEFAULT_NOTIFY_PORT) or DEFAULT_NOTIFY_PORT),
            proxy_ip=str(extra.get("proxy_ip") or ""),
            proxy_ping_port=int(num("proxy_ping_port", 0)),
            http_port=int(num("http_port", 0)),
            block_size=int(vllm_config.cache_config.block_size),
            dp_rank=int(_get(pc, "data_parallel_rank", 0) or 0),
            dp_size=dp_size,
            dp_size_local=dp_local if dp_local != dp_size else 0,
            tp_size=int(_get(pc, "tensor_parallel_size", 1) or 1),
            transfer_timeout_s=num("transfer_timeout", 30.0),
            defer_timeout_s=num("defer_timeout", 60.0),
            handshake_timeout_s=num("handshake_timeout", 10.0),
            transport=str(extra.get("kvxfer_transport", "auto")),
            lcores=extra.get("kvxfer_lcores"),
            idle=Idle.BUSY if str(extra.get("kvxfer_idle", "adaptive")) == "busy" else Idle.ADAPTIVE,
            vllm_port_compat=bool(extra.get("kvxfer_vllm_port_compat", False)),
        )
