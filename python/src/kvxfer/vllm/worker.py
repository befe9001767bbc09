# SPDX-License-Identifier: Apache-2.0
"""Worker half of the connector: one per vLLM worker process (one (dp_rank, tp_rank)). Owns a
kvxfer engine (pinned polling lcores, control lcore, provider) over the worker's KV caches.
Every method is called by the worker's model-runner thread."""
from __future__ import annotations

import errno
import logging
from typing import Any, Optional

from ..engine import CplKind, CplStatus, Engine, EngineParams, KvxError, LayerSpec, Mode, Peer, Role
from .config import ConnectorConfig
from .meta import KvxferConnectorMetadata, RecvReq

log = logging.getLogger("kvxfer.vllm")


class KvxferWorker:
    """Drives one engine from vLLM's worker calls."""

    def __init__(self, cfg: ConnectorConfig, tp_rank: int, num_kv_heads: int, head_size: int,
                 is_mla: bool) -> None:
        self.cfg = cfg
        self.tp_rank = tp_rank
        self.spec = LayerSpec(cfg.block_size, num_kv_heads, head_size, is_mla)
        self.engine: Optional[Engine] = None
        self.layer_idx: dict[str, int] = {}
        self.tid_to_req: dict[str, str] = {}
        self.recv_blocks: dict[str, list[int]] = {}    # D: tid -> local blocks being loaded
        self.release_only: set[str] = set()            # D: transfers that only release P
        self.failed: dict[str, int] = {}               # D: tid -> errno, awaiting BLOCKS_RELEASED
        self.aborted: set[str] = set()                 # aborted by us: report blocks on release
        self.step_reads: list[str] = []
        self.step_saves: list[Any] = []
        self.begun: dict[str, set[int]] = {}           # P WRITE: tid -> layers marked ready
        self.events: dict[str, list[Any]] = {}         # P WRITE on GPU: keep layer events alive
        self.unmatched: list[tuple[str, bool]] = []    # (tid, recving) awaiting a tid->req map
        self.load_errors: set[int] = set()
        self.counters = {"transfers_done": 0, "transfers_failed": 0, "bytes": 0, "duration_ns": 0}

    # -- registration ----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Register every layer (in the dict's order, which both sides share) and start the
        engine; blocks until its listeners are bound."""
        if not kv_caches:
            raise ValueError("kv_caches: empty")
        c = self.cfg
        first = next(iter(kv_caches.values()))
        from ..engine import geometry
        g = geometry(tuple(first.shape), tuple(first.stride()), first.element_size(), self.spec)
        rank0 = c.dp_rank == 0 and self.tp_rank == 0
        heartbeat = bool(c.proxy_ip) and rank0
        p = EngineParams(
            role=c.role, mode=c.mode, transport=c.transport, lcores=c.lcores, idle=c.idle, host=c.host,
            handshake_port=c.handshake_port, notify_port=c.notify_port, dp_rank=c.dp_rank, dp_size=c.dp_size,
            dp_size_local=c.dp_size_local, tp_rank=self.tp_rank, tp_size=c.tp_size,
            handshake_timeout_ms=max(1, int(c.handshake_timeout_s * 1000)),
            transfer_timeout_ms=max(1, int(c.transfer_timeout_s * 1000)),
            defer_timeout_ms=max(1, int(c.defer_timeout_s * 1000)),
            proxy_addr=f"{c.proxy_ip}:{c.proxy_ping_port}" if heartbeat else None,
            http_addr=f"{c.host}:{c.http_port}" if heartbeat else None,
            vllm_port_compat=c.vllm_port_compat, max_blocks=max(1, int(g["num_blocks"])))
        e = Engine(p)
        try:
            for name, t in kv_caches.items():
                self.layer_idx[name] = e.register_tensor(name, t, self.spec)
            e.start()
        except BaseException:
            e.close()
            raise
        self.engine = e

    def bound_ports(self) -> tuple[int, int]:
        """(handshake, notify) base ports the engine bound."""
        assert self.engine is not None, "register_kv_caches first"
        return self.engine.ports()

    # -- per step --------------------------------------------------------------------------------
    def start_load_kv(self, meta: KvxferConnectorMetadata) -> None:
        e = self._engine()
        self.tid_to_req.update(meta.tid_to_req)
        for tid, req_id in meta.aborts:
            self.tid_to_req.setdefault(tid, req_id)
            self.aborted.add(tid)
            try:
                e.abort(tid)
            except KvxError as x:
                if x.errno != errno.ENOENT:
                    raise
                # Already terminal and polled. Loaded: nothing touches its blocks any more.
                # Failed: its BLOCKS_RELEASED is still to come (then reported as freed).
                if tid not in self.failed:
                    self.aborted.discard(tid)
                    self.recv_blocks.pop(tid, None)
                    self.unmatched.append((tid, False))
        for r in meta.releases:
            self.release_only.add(r.transfer_id)
            self._submit_recv(r, release=True)
        for r in meta.announces:
            self._submit_recv(r, release=False)
        self.step_reads = []
        for r in meta.reads:
            if self._submit_recv(r, release=False):
                self.step_reads.append(r.transfer_id)
        for s in meta.serves:
            try:
                e.serve(s.transfer_id, s.local_blocks, s.consumer_tp_size)
            except KvxError as x:
                log.error("kvxfer: serve %s failed: %s", s.transfer_id, x)
        self.step_saves = list(meta.saves)

    def _submit_recv(self, r: RecvReq, release: bool) -> bool:
        e = self._engine()
        if not release:
            self.recv_blocks[r.transfer_id] = list(r.local_blocks)
        try:
            if self.cfg.mode == Mode.READ:
                e.read(r.transfer_id, r.local_blocks, r.remote_blocks, r.peer)
            else:  # the scheduler sent remote_blocks (KvxferScheduler._notify): await write_done
                e.announce(r.transfer_id, r.local_blocks, r.peer, True)
            return True
        except KvxError as x:
            log.error("kvxfer: load of %s not started: %s", r.transfer_id, x)
            if not release:
                # Nothing was submitted. READ: nothing can land, the blocks are reusable now.
                # WRITE: the scheduler already sent remote_blocks, so P may still write them;
                # only an engine refusal (ENOBUFS past 5 s of retries, EEXIST) gets here.
                self.load_errors.update(r.local_blocks)
                self.recv_blocks.pop(r.transfer_id, None)
                if self.cfg.mode == Mode.WRITE:
                    self.unmatched.append((r.transfer_id, True))
            return False

    def wait_for_layer_load(self, layer_name: str) -> None:
        """D READ: wait until this layer's bytes of every read of this step landed; a failed
        read's blocks go to get_block_ids_with_load_errors() (vLLM recomputes them)."""
        if self.cfg.mode != Mode.READ or self.cfg.role != Role.CONSUMER or not self.step_reads:
            return
        e = self._engine()
        idx = self.layer_idx[layer_name]
        timeout_ms = max(1, int(self.cfg.transfer_timeout_s * 1000) + 1000)
        for tid in self.step_reads:
            if tid in self.failed or not self.recv_blocks.get(tid):
                continue
            try:
                e.layer_wait(tid, idx, timeout_ms)
            except KvxError as x:
                log.error("kvxfer: read %s layer %s failed: %s", tid, layer_name, x)
                self.failed[tid] = x.errno
                self.load_errors.update(self.recv_blocks.get(tid, ()))

    def save_kv_layer(self, layer_name: str, kv_layer: Any) -> None:
        """P WRITE: the layer is computed; its writes go once D's blocks are known. On a GPU
        the gate is a HIP event recorded now on the current stream (never synchronised)."""
        if not self.step_saves:
            return
        e = self._engine()
        idx = self.layer_idx[layer_name]
        ev_handle = 0
        if getattr(kv_layer, "is_cuda", False):
            import torch
            ev = torch.cuda.Event()
            ev.record()
            ev_handle = int(getattr(ev, "cuda_event", 0) or 0)
            if not ev_handle:
                ev.synchronize()
        for s in self.step_saves:
            layers = self._begin(s)
            if layers is None or idx in layers:
                continue
            if not self._ended(lambda: e.layer_ready(s.transfer_id, idx, ev_handle), s.transfer_id):
                layers.add(idx)
                if ev_handle:
                    self.events.setdefault(s.transfer_id, []).append(ev)

    def _ended(self, call: Any, tid: str) -> bool:
        """Run a per-transfer call; True if the transfer already ended (-ENOENT: D released or
        aborted it before P finished, e.g. an abort before allocation): nothing more to send."""
        try:
            call()
            return False
        except KvxError as x:
            if x.errno != errno.ENOENT:
                raise
            self.begun[tid] = set(range(len(self.layer_idx)))  # no further layer_ready / seal
            self.begun[tid].add(-1)
            return True

    def _begin(self, s: Any) -> Optional[set[int]]:
        if s.transfer_id in self.begun:
            return self.begun[s.transfer_id]
        try:
            self._engine().write_begin(s.transfer_id, s.local_blocks, s.peer)
        except KvxError as x:
            log.error("kvxfer: write %s not started: %s", s.transfer_id, x)
            return None
        self.begun[s.transfer_id] = set()
        return self.begun[s.transfer_id]

    def wait_for_save(self) -> None:
        """P WRITE: every layer of this step's saves is ready; seal the write count."""
        e = self._engine()
        for s in self.step_saves:
            layers = self._begin(s)
            if layers is None or -1 in layers:
                continue
            tid = s.transfer_id
            for idx in range(len(self.layer_idx)):
                if idx not in layers and self._ended(lambda: e.layer_ready(tid, idx), tid):
                    break
                layers.add(idx)
            else:
                self._ended(lambda: e.seal(tid, len(self.layer_idx)), tid)
        self.step_saves = []

    def get_finished(self) -> tuple[Optional[set[str]], Optional[set[str]]]:
        """(finished_sending, finished_recving) request ids from the engine's completions:
        P: blocks released; D WRITE: loaded (or failed, with its blocks as load errors, once
        the engine released them); D aborted loads: blocks released (finished_sending)."""
        e = self._engine()
        sending: set[str] = set()
        recving: set[str] = set()
        pending, self.unmatched = self.unmatched, []
        for tid, rec in pending:
            self._report(tid, rec, sending, recving)
        for c in e.completions(64):
            self._on_completion(c, sending, recving)
        while e.wait(0):
            got = e.completions(64)
            if not got:
                break
            for c in got:
                self._on_completion(c, sending, recving)
        return sending or None, recving or None

    def _on_completion(self, c: Any, sending: set[str], recving: set[str]) -> None:
        tid = c.transfer_id
        if c.kind == CplKind.TRANSFER:
            self.events.pop(tid, None)
            self.begun.pop(tid, None)
            if c.status == CplStatus.DONE:
                self.counters["transfers_done"] += 1
                self.counters["bytes"] += c.bytes
                self.counters["duration_ns"] += c.duration_ns
            elif c.status != CplStatus.ABORTED:
                self.counters["transfers_failed"] += 1
            if self.cfg.role == Role.PRODUCER or tid in self.release_only:
                return
            if c.status == CplStatus.DONE:
                self.recv_blocks.pop(tid, None)
                if tid in self.aborted:
                    # Loaded before the abort reached the engine: no release follows, and every
                    # byte has landed, so the aborted request's blocks are free now.
                    self.aborted.discard(tid)
                    self._report(tid, False, sending, recving)
                elif self.cfg.mode == Mode.WRITE:
                    self._report(tid, True, sending, recving)
            elif tid not in self.aborted:
                if self.cfg.mode == Mode.READ and tid not in self.failed:
                    self.load_errors.update(self.recv_blocks.get(tid, ()))
                self.failed[tid] = -c.error if c.error else errno.EIO
            return
        # BLOCKS_RELEASED
        if self.cfg.role == Role.PRODUCER:
            self.aborted.discard(tid)
            self._report(tid, False, sending, recving)
            return
        if tid in self.release_only:
            self.release_only.discard(tid)
            return
        if tid in self.aborted:  # the aborted request's blocks are free now
            self.aborted.discard(tid)
            self.failed.pop(tid, None)
            self.recv_blocks.pop(tid, None)
            self._report(tid, False, sending, recving)
            return
        if tid in self.failed:
            del self.failed[tid]
            blocks = self.recv_blocks.pop(tid, [])
            if self.cfg.mode == Mode.WRITE:
                # Out of quarantine now: vLLM may recompute into these blocks.
                self.load_errors.update(blocks)
                self._report(tid, True, sending, recving)

    def _report(self, tid: str, recving: bool, sending: set[str], recv: set[str]) -> None:
        req = self.tid_to_req.get(tid)
        if req is None:
            self.unmatched.append((tid, recving))
            return
        (recv if recving else sending).add(req)

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self.load_errors = self.load_errors, set()
        return out

    def stats(self) -> dict[str, Any]:
        """This worker's totals over DONE transfers (transfers_done, bytes, duration_ns),
        transfers_failed (failed or timed out), and the engine's counters as engine_*."""
        d: dict[str, Any] = dict(self.counters)
        if self.engine is not None:
            st = self.engine.stats()
            d.update({f"engine_{k}": v for k, v in st.items() if not isinstance(v, list)})
        return d

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("kvxfer: register_kv_caches() has not run")
        return self.engine


__all__ = ["KvxferWorker", "Peer"]
