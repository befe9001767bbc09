# SPDX-License-Identifier: Apache-2.0
"""Test helpers: engine pairs on loopback tcp with ephemeral ports, completion waiting on the
engine's eventfd (no sleeps: wait() blocks in poll(2) until the pump queued something)."""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

import kvxfer
from conftest import HANG_S

NB, BS, H, HD = 16, 4, 2, 8
SPEC = kvxfer.LayerSpec(block_size=BS, num_kv_heads=H, head_size=HD)


def split_layer(fill: Optional[int] = None) -> torch.Tensor:
    """Split K/V layer [2, NB, BS, H, HD] bf16 viewed as int16 for byte-exact fills."""
    t = torch.zeros(2, NB, BS, H, HD, dtype=torch.int16)
    if fill is not None:
        t.copy_(torch.arange(t.numel(), dtype=torch.int32).reshape(t.shape).mul(7).add(fill).to(torch.int16))
    return t


def engine(role: kvxfer.Role, mode: kvxfer.Mode, **kw) -> kvxfer.Engine:
    p = kvxfer.EngineParams(role=role, mode=mode, transport="tcp", handshake_port=0, notify_port=0,
                            max_transfers=64, max_blocks=NB, transfer_timeout_ms=20000,
                            defer_timeout_ms=25000, handshake_timeout_ms=15000)
    return kvxfer.Engine(p, **kw)


def peer_of(e: kvxfer.Engine) -> kvxfer.Peer:
    hs, nt = e.ports()
    return kvxfer.Peer("127.0.0.1", hs, nt)


class Tracker:
    """Collects completions of one engine, waiting on its eventfd."""

    def __init__(self, e: kvxfer.Engine) -> None:
        self.e = e
        self.seen: list[kvxfer.Completion] = []

    def until(self, pred: Callable[[list[kvxfer.Completion]], bool], what: str) -> list[kvxfer.Completion]:
        deadline = time.monotonic() + HANG_S
        while not pred(self.seen):
            left = deadline - time.monotonic()
            assert left > 0, f"hang bound ({HANG_S}s) passed waiting for {what}; seen {self.seen}"
            self.e.wait(left)
            self.seen.extend(self.e.completions())
        return self.seen

    def terminal(self, tid: str) -> kvxfer.Completion:
        self.until(lambda s: any(c.transfer_id == tid and c.kind == kvxfer.CplKind.TRANSFER for c in s),
                   f"terminal completion of {tid}")
        return next(c for c in self.seen if c.transfer_id == tid and c.kind == kvxfer.CplKind.TRANSFER)

    def released(self, tid: str) -> None:
        self.until(lambda s: any(c.transfer_id == tid and c.kind == kvxfer.CplKind.BLOCKS_RELEASED for c in s),
                   f"blocks released of {tid}")
