# SPDX-License-Identifier: Apache-2.0
"""Per-step connector metadata: what the scheduler half tells the worker half (picklable;
vLLM ships it from the scheduler process to every worker)."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine import Peer


def _base() -> type:
    try:  # vLLM's base class when vLLM is installed; a plain object otherwise
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
        return KVConnectorMetadata
    except ImportError:
        return object


@dataclass
class RecvReq:
    """D: one transfer to load. READ: local_blocks[i] <- remote_blocks[i] (paired by token
    position); WRITE: the scheduler already sent local_blocks to P (``remote_blocks``, P pairs
    its tail); the worker awaits ``write_done``."""
    transfer_id: str
    req_id: str
    local_blocks: list[int]
    remote_blocks: list[int]
    peer: Peer


@dataclass
class SaveReq:
    """P WRITE: push local_blocks (whole prompt) layer by layer to D."""
    transfer_id: str
    req_id: str
    local_blocks: list[int]
    peer: Peer


@dataclass
class ServeReq:
    """P READ: make local_blocks readable until D's ``release`` (consumer_tp_size fan-in)."""
    transfer_id: str
    req_id: str
    local_blocks: list[int]
    consumer_tp_size: int = 0


class KvxferConnectorMetadata(_base()):  # type: ignore[misc]
    """One scheduler step's work for the worker half."""

    def __init__(self) -> None:
        self.reads: list[RecvReq] = []
        self.announces: list[RecvReq] = []
        self.releases: list[RecvReq] = []   # D READ: release P without loading (abort / full hit)
        self.saves: list[SaveReq] = []
        self.serves: list[ServeReq] = []
        self.aborts: list[tuple[str, str]] = []  # (transfer_id, req_id) allocated and live
        self.tid_to_req: dict[str, str] = {}

    def __repr__(self) -> str:
        return (f"KvxferConnectorMetadata(reads={self.reads}, announces={self.announces}, "
                f"releases={self.releases}, saves={self.saves}, serves={self.serves}, aborts={self.aborts})")
