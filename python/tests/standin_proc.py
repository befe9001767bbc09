# SPDX-License-Identifier: Apache-2.0
"""Runs a StandInInstance (vllm_standin.py) in its own process; the test plays the proxy."""
from __future__ import annotations

import multiprocessing as mp
import uuid
from typing import Any

from conftest import HANG_S
from kvxfer.vllm import zmq_address
from vllm_standin import instance_main


class InstanceProc:
    def __init__(self, kv_role: str, read_mode: bool, layout: str, extra: dict[str, Any] | None = None,
                 tp: int = 1) -> None:
        ctx = mp.get_context("spawn")
        self.tp = tp
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=instance_main,
                                args=(child, kv_role, read_mode, layout, extra or {}, HANG_S, tp),
                                # TP > 1 starts worker processes: a daemonic process may not
                                # (close() joins or kills it either way)
                                daemon=tp == 1)
        self.proc.start()
        child.close()
        assert self.conn.poll(HANG_S * 2), f"{kv_role} instance did not start"
        self.ports: tuple[int, int] = self.conn.recv()
        self.zmq = zmq_address("127.0.0.1", *self.ports)

    def call(self, cmd: str, args: Any = None, bound: float = HANG_S * 2) -> Any:
        self.conn.send((cmd, args))
        assert self.conn.poll(bound), f"{cmd} {args}: no answer within {bound}s"
        st, res = self.conn.recv()
        assert st == "ok", res
        return res

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("close")
            finally:
                self.proc.join(HANG_S)
        if self.proc.is_alive():
            self.proc.kill()


def proxy_ids(p: InstanceProc, d: InstanceProc) -> tuple[str, str]:
    """(request_id, transfer_id) as the MoRIIO proxy makes them (docs/protocol.md §1.3 step 2)."""
    return (f"___prefill_addr_{p.zmq}___decode_addr_{d.zmq}_{uuid.uuid4().hex}", f"tx-{uuid.uuid4()}")


def p_params(tid: str, d_tp: int = 1) -> dict[str, Any]:
    """P's kv_transfer_params from the proxy (remote_tp_size: D's TP size)."""
    return {"remote_dp_size": 1, "remote_tp_size": d_tp, "transfer_id": tid, "do_remote_decode": True,
            "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None}


def d_params(tid: str, p_tp: int = 1) -> dict[str, Any]:
    """D's kv_transfer_params from the proxy (remote_tp_size: P's TP size)."""
    return {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": None,
            "remote_block_ids": None, "transfer_id": tid, "remote_dp_size": 1, "remote_tp_size": p_tp}
