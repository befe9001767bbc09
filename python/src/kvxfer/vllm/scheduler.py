# SPDX-License-Identifier: Apache-2.0
"""Scheduler half of the connector: runs in vLLM's scheduler process (one per DP rank), opens
no engine. Request bookkeeping as MoRIIO's (docs/protocol.md §1.3-1.4, §5): matched tokens,
allocation, per-step metadata, deferred frees with early/stale ACK handling, aborts.

In WRITE mode the decode scheduler itself tells the producer which blocks to write, as MoRIIO's
scheduler half does (§1.3 step 5b): ``remote_blocks`` at allocation, and ``release`` for a
request that finishes before allocation (or needs no load), to every producer TP rank, through
a :class:`kvxfer.Notifier` (a control thread, no engine, created at the first send). The decode
workers' engines then only await ``write_done`` (announce with ``notified=True``)."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from ..engine import EngineParams, Mode, Notifier, Peer, Role
from .config import ConnectorConfig, resolve_peer
from .meta import KvxferConnectorMetadata, RecvReq, SaveReq, ServeReq

log = logging.getLogger("kvxfer.vllm")


def _params(request: Any) -> dict[str, Any]:
    p = getattr(request, "kv_transfer_params", None)
    return p if isinstance(p, dict) else {}


def _length_capped(request: Any) -> bool:
    """vLLM's RequestStatus.FINISHED_LENGTH_CAPPED (P's max_tokens=1 prefill)."""
    st = getattr(request, "status", None)
    return "LENGTH_CAPPED" in str(getattr(st, "name", st))


class KvxferScheduler:
    """State owned by the scheduler thread; every method is called by it only."""

    def __init__(self, cfg: ConnectorConfig, now: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.now = now
        self.tid_to_req: dict[str, str] = {}
        self.req_to_tid: dict[str, str] = {}
        self.need_save: dict[str, tuple[Any, list[int], dict[str, Any]]] = {}
        self.pending_save: dict[str, tuple[Any, list[int], dict[str, Any]]] = {}
        self.saving: set[str] = set()                 # P WRITE: emitted, transfer live
        self.to_serve: list[ServeReq] = []
        self.need_recv: list[RecvReq] = []
        self.releases: list[RecvReq] = []
        self.aborts: list[tuple[str, str]] = []
        self.inflight_recv: dict[str, str] = {}       # D WRITE: req -> tid until finished_recving
        self.recv_done: set[str] = set()              # D: loads completed (PR #53549)
        self.deferred: dict[str, tuple[float, str]] = {}  # P: req -> (deadline, tid)
        self.pending_acks: dict[str, float] = {}          # P: early ACK parking
        self.p_aborted: set[str] = set()                  # P: aborted with writes in flight
        self.notifier: Optional[Notifier] = None          # D WRITE: remote_blocks / release sender

    # -- D WRITE notifications (§1.3 step 5b, §5.5) --------------------------------------------
    def _notify(self, tid: str, req_id: str, blocks: list[int], peer: Peer) -> bool:
        """remote_blocks (blocks) or release (no blocks) to every TP rank of peer's DP rank;
        False (logged) if it could not be queued."""
        c = self.cfg
        try:
            if self.notifier is None:
                self.notifier = Notifier(EngineParams(
                    role=Role.CONSUMER, mode=Mode.WRITE, host=c.host, dp_rank=c.dp_rank, dp_size=c.dp_size,
                    dp_size_local=c.dp_size_local, tp_size=c.tp_size, vllm_port_compat=c.vllm_port_compat,
                    max_blocks=1 << 24))
            self.notifier.announce(tid, blocks, peer, req_id)
            return True
        except (OSError, ValueError) as x:
            log.error("kvxfer: %s of transfer %s to %s:%s not sent: %s", "remote_blocks" if blocks else "release",
                      tid, peer.host, peer.notify_port, x)
            return False

    def shutdown(self) -> None:
        """Flush (bounded) and stop the notifier, if one was started."""
        if self.notifier is not None:
            self.notifier.close()
            self.notifier = None

    # -- mapping (§5.1) ------------------------------------------------------------------------
    def _map(self, tid: str, req_id: str) -> None:
        self.tid_to_req[tid] = req_id
        self.req_to_tid[req_id] = tid

    def _unmap(self, req_id: str) -> None:
        tid = self.req_to_tid.pop(req_id, None)
        if tid is not None:
            self.tid_to_req.pop(tid, None)

    # -- vLLM scheduler calls ------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """P: (0, False). D with do_remote_prefill: WRITE (prompt - computed, True) = async
        load; READ (prompt - 1 - computed, False) = loaded in this step's forward, D
        recomputes the last prompt token. (0, False) once a load completed (§5.9)."""
        params = _params(request)
        if self.cfg.role == Role.PRODUCER or not params.get("do_remote_prefill"):
            return 0, False
        if request.request_id in self.recv_done:
            return 0, False
        n = len(request.prompt_token_ids) - num_computed_tokens
        if self.cfg.mode == Mode.WRITE:
            return (n, True) if n > 0 else (0, False)
        n -= 1
        return (n, False) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = _params(request)
        req_id = request.request_id
        tid = params.get("transfer_id")
        if self.cfg.role == Role.PRODUCER:
            if params.get("do_remote_decode") and tid:
                self._map(tid, req_id)
                if self.cfg.mode == Mode.WRITE:
                    self.need_save[req_id] = (request, list(blocks.get_block_ids()[0]), dict(params))
            return
        if not params.get("do_remote_prefill"):
            return
        params["do_remote_prefill"] = False
        if not tid:
            log.error("kvxfer: request %s has do_remote_prefill but no transfer_id", req_id)
            return
        peer = resolve_peer(req_id, params, want_prefill=True, local_tp=self.cfg.tp_size)
        if peer is None:
            log.error("kvxfer: cannot resolve the producer of %s (no address in request id or params)", req_id)
            return
        self._map(tid, req_id)
        new = list(blocks.get_unhashed_block_ids()) if num_external_tokens > 0 else []
        if self.cfg.mode == Mode.WRITE:
            if not new:  # nothing to load (§5.7): release P's blocks, no transfer on D
                self._notify(tid, req_id, [], peer)
                self._unmap(req_id)
                return
            # Not sent (logged): the worker's load then times out and its blocks come back as
            # load errors (vLLM recomputes them), as for a producer that never writes.
            self._notify(tid, req_id, new, peer)
            self.need_recv.append(RecvReq(tid, req_id, new, [], peer))
            self.inflight_recv[req_id] = tid
            return
        remote = list(params.get("remote_block_ids") or [])
        cached = len(blocks.get_block_ids()[0]) - len(new)
        pairs = max(0, min(len(new), len(remote) - cached))  # pair by token position (§6 item 8)
        self.need_recv.append(RecvReq(tid, req_id, new[:pairs], remote[cached:cached + pairs], peer))

    def build_connector_meta(self, scheduler_output: Any) -> KvxferConnectorMetadata:
        meta = KvxferConnectorMetadata()
        if self.cfg.role == Role.CONSUMER:
            for r in self.need_recv:
                (meta.reads if self.cfg.mode == Mode.READ else meta.announces).append(r)
            self.need_recv = []
        elif self.cfg.mode == Mode.WRITE:
            self._collect_saves(scheduler_output, meta)
        else:
            meta.serves, self.to_serve = self.to_serve, []
        meta.releases, self.releases = self.releases, []
        meta.aborts, self.aborts = self.aborts, []
        meta.tid_to_req = dict(self.tid_to_req)
        return meta

    def _collect_saves(self, so: Any, meta: KvxferConnectorMetadata) -> None:
        """P WRITE: emit a save only when the final prefill chunk is scheduled (§5.3)."""
        bs = self.cfg.block_size
        for req_id, (request, ids, params) in self.need_save.items():
            if len(request.prompt_token_ids) > len(ids) * bs:
                self.pending_save[req_id] = (request, ids, params)
            else:
                self._emit_save(req_id, ids, params, meta)
        self.need_save = {}
        cached = getattr(so, "scheduled_cached_reqs", None)
        for i, req_id in enumerate(getattr(cached, "req_ids", None) or []):
            if req_id not in self.pending_save:
                continue
            new_ids = cached.new_block_ids[i]
            request, ids, params = self.pending_save[req_id]
            if new_ids:
                ids.extend(new_ids[0])
            if len(ids) * bs >= len(request.prompt_token_ids):
                del self.pending_save[req_id]
                self._emit_save(req_id, ids, params, meta)

    def _emit_save(self, req_id: str, ids: list[int], params: dict[str, Any], meta: KvxferConnectorMetadata) -> None:
        peer = resolve_peer(req_id, params, want_prefill=False, local_tp=self.cfg.tp_size)
        tid = params.get("transfer_id")
        if peer is None or not tid:
            log.error("kvxfer: cannot resolve the decode side of %s; its KV is not sent", req_id)
            return
        meta.saves.append(SaveReq(tid, req_id, ids, peer._replace(dp_rank=0)))
        self.saving.add(req_id)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        """(delay_free, params for the HTTP response). See docs/protocol.md §1.3 step 13, §1.4
        step 3, §3.6, §5.4, §5.5."""
        params = _params(request)
        req_id = request.request_id
        tid = params.get("transfer_id")
        if self.cfg.role == Role.CONSUMER:
            return self._consumer_finished(req_id, params, tid)
        if not params.get("do_remote_decode") or not tid:
            return False, None
        self.need_save.pop(req_id, None)
        self.pending_save.pop(req_id, None)
        if not _length_capped(request) or not block_ids:
            if req_id in self.saving:  # writes may be in flight: free on BLOCKS_RELEASED
                self.saving.discard(req_id)
                self.p_aborted.add(req_id)
                self.aborts.append((tid, req_id))
                return True, None
            self._unmap(req_id)
            return False, None
        self.saving.discard(req_id)
        self.deferred[req_id] = (self.now() + self.cfg.defer_timeout_s, tid)
        if self.cfg.mode == Mode.WRITE:
            return True, None
        ctp = int(params.get("remote_tp_size") or 0)
        self.to_serve.append(ServeReq(tid, req_id, list(block_ids), ctp if ctp != self.cfg.tp_size else 0))
        c = self.cfg
        return True, {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": list(block_ids),
            "remote_engine_id": f"{c.host}:{c.handshake_port}", "remote_host": c.host,
            "remote_port": c.handshake_port, "remote_handshake_port": c.handshake_port,
            "remote_notify_port": c.notify_port, "remote_dp_rank": c.dp_rank, "remote_dp_rank_override": True,
            "remote_dp_size": c.dp_size, "remote_dp_size_local": c.dp_size_local, "tp_size": c.tp_size,
            "transfer_id": tid,
        }

    def _consumer_finished(self, req_id: str, params: dict[str, Any],
                           tid: Optional[str]) -> tuple[bool, Optional[dict[str, Any]]]:
        if params.get("do_remote_prefill"):
            # Never allocated: release P's blocks now (§5.5) instead of leaking them.
            params["do_remote_prefill"] = False
            peer = resolve_peer(req_id, params, want_prefill=True, local_tp=self.cfg.tp_size)
            if tid and peer is not None and self.cfg.mode == Mode.WRITE:
                self._notify(tid, req_id, [], peer)  # MoRIIO's scheduler-side release (§1.3, abort)
            elif tid and peer is not None:
                self._map(tid, req_id)
                self.releases.append(RecvReq(tid, req_id, [], [], peer))
            else:
                log.error("kvxfer: leaking prefill blocks of %s (transfer %s): producer unknown", req_id, tid)
            return False, None
        live = self.inflight_recv.pop(req_id, None)
        self.recv_done.discard(req_id)
        if live is not None:
            # Allocated, load still running: abort; the blocks are freed when the engine
            # reports them released (finished_sending), never while a write may land.
            self.aborts.append((live, req_id))
            return True, None
        self._unmap(req_id)
        return False, None

    def update_connector_output(self, out: Any) -> None:
        """P: rewrite out.finished_sending to the requests whose blocks are safe to free
        (§5.4: early ACKs parked, deferred frees reaped at their deadline, stale ACKs
        dropped). D: note completed loads."""
        if self.cfg.role == Role.CONSUMER:
            for req_id in getattr(out, "finished_recving", None) or ():
                if self.inflight_recv.pop(req_id, None) is not None:
                    self.recv_done.add(req_id)
            for req_id in getattr(out, "finished_sending", None) or ():
                self._unmap(req_id)  # an aborted load's blocks came back
            return
        now = self.now()
        safe: set[str] = set()
        for req_id in getattr(out, "finished_sending", None) or ():
            if req_id in self.deferred:
                safe.add(req_id)
            elif req_id in self.p_aborted:
                self.p_aborted.discard(req_id)
                safe.add(req_id)  # an aborted P request's blocks came back
            else:
                self.pending_acks.setdefault(req_id, now + self.cfg.defer_timeout_s)
        safe.update(r for r in self.pending_acks if r in self.deferred)
        for req_id, (deadline, tid) in self.deferred.items():
            if now >= deadline:
                log.warning("kvxfer: freeing %s (transfer %s) at its defer deadline: no release/write_done seen",
                            req_id, tid)
                safe.add(req_id)
        for req_id in safe:
            self.deferred.pop(req_id, None)
            self.pending_acks.pop(req_id, None)
            self._unmap(req_id)
        for req_id in [r for r, d in self.pending_acks.items() if now >= d]:
            del self.pending_acks[req_id]
        out.finished_sending = safe or None
