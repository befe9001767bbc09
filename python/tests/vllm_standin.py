# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for vLLM (which cannot be installed here: not packaged for Debian, no other
registry reachable). It models only what the connector sees: the objects vLLM passes in
(Request, KVCacheBlocks, SchedulerOutput, ForwardContext, KVConnectorOutput, a VllmConfig with
its kv_transfer_config) and the order in which vLLM's scheduler and model runner call the
connector in one engine step. One StandInInstance is one vLLM instance with one worker
(TP 1): the scheduler half and the worker half are separate connector objects, and the
metadata crosses between them pickled, as it crosses processes in vLLM.

"Compute" on a producer fills each scheduled block with a pattern that depends on
(layer, request seed, block position in the prompt), so a consumer's blocks can be checked
byte for byte against the producer's.
"""
from __future__ import annotations

import enum
import pickle
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from kvxfer.vllm import KvxferConnector


class StandInRole(enum.Enum):
    """vLLM's KVConnectorRole."""
    SCHEDULER = 0
    WORKER = 1


class StandInStatus(enum.Enum):
    """The subset of vLLM's RequestStatus the connector looks at."""
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    FINISHED_LENGTH_CAPPED = 3
    FINISHED_ABORTED = 4


@dataclass
class StandInRequest:
    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: Optional[dict[str, Any]]
    status: StandInStatus = StandInStatus.WAITING
    num_computed_tokens: int = 0
    seed: int = 1
    cached_blocks: list[int] = field(default_factory=list)   # local prefix-cache hit
    block_ids: list[int] = field(default_factory=list)


class StandInKVCacheBlocks:
    """vLLM's KVCacheBlocks for one KV-cache group: all blocks, the first n_cached of which
    are prefix-cache hits (hashed)."""

    def __init__(self, block_ids: list[int], n_cached: int) -> None:
        self._ids = list(block_ids)
        self._n_cached = n_cached

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self._ids),)

    def get_unhashed_block_ids(self) -> list[int]:
        return list(self._ids[self._n_cached:])


@dataclass
class StandInNewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass
class StandInCachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[Optional[tuple[list[int], ...]]] = field(default_factory=list)


@dataclass
class StandInSchedulerOutput:
    scheduled_new_reqs: list[StandInNewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: StandInCachedRequestData = field(default_factory=StandInCachedRequestData)
    finished_req_ids: set[str] = field(default_factory=set)


@dataclass
class StandInForwardContext:
    attn_metadata: Any = None


@dataclass
class StandInKVConnectorOutput:
    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    invalid_block_ids: set[int] = field(default_factory=set)


@dataclass
class StandInKVTransferConfig:
    kv_connector: str
    kv_role: str
    kv_connector_module_path: str = "kvxfer.vllm"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class StandInCacheConfig:
    block_size: int


@dataclass
class StandInParallelConfig:
    data_parallel_rank: int = 0
    data_parallel_size: int = 1
    data_parallel_size_local: int = 1
    tensor_parallel_size: int = 1
    rank: int = 0


@dataclass
class StandInModelConfig:
    num_kv_heads: int
    head_size: int
    use_mla: bool = False

    def get_num_kv_heads(self, parallel_config: StandInParallelConfig) -> int:
        return self.num_kv_heads // parallel_config.tensor_parallel_size

    def get_head_size(self) -> int:
        return self.head_size


@dataclass
class StandInVllmConfig:
    kv_transfer_config: StandInKVTransferConfig
    cache_config: StandInCacheConfig
    model_config: StandInModelConfig
    parallel_config: StandInParallelConfig = field(default_factory=StandInParallelConfig)


NLAYERS, NB, BS, H, HD, MLA_D = 3, 24, 4, 2, 8, 32


def make_kv(layout: str) -> dict[str, torch.Tensor]:
    """Zeroed KV caches, int16 (2-byte elements): split K/V [2, NB, BS, H, HD] (NHD) or MLA
    [NB, BS, D]."""
    shape = (2, NB, BS, H, HD) if layout == "split" else (NB, BS, MLA_D)
    return {f"model.layers.{i}.self_attn.attn": torch.zeros(shape, dtype=torch.int16) for i in range(NLAYERS)}


def block_view(t: torch.Tensor, layout: str, b: int) -> torch.Tensor:
    return t[:, b] if layout == "split" else t[b]


def pattern(layer: int, seed: int, pos: int, like: torch.Tensor) -> torch.Tensor:
    n = like.numel()
    base = (layer * 7919 + seed * 104729 + pos * 1299709) % 30011
    return (torch.arange(n, dtype=torch.int32).mul(31).add(base) % 32749 + 1).to(torch.int16).reshape(like.shape)


class StandInInstance:
    """One vLLM instance (scheduler + one worker) driving KvxferConnector in vLLM's order."""

    def __init__(self, kv_role: str, read_mode: bool, layout: str, extra: Optional[dict[str, Any]] = None) -> None:
        self.layout = layout
        self.role = kv_role
        ex = {"proxy_ip": "", "proxy_ping_port": 0, "http_port": 0, "host_ip": "127.0.0.1",
              "read_mode": "true" if read_mode else "false", "kvxfer_transport": "tcp",
              "kvxfer_ephemeral_ports": True, "transfer_timeout": 30, "defer_timeout": 120,
              "handshake_timeout": 20}
        ex.update(extra or {})
        mc = StandInModelConfig(num_kv_heads=H if layout == "split" else 1, head_size=HD if layout == "split" else MLA_D,
                                use_mla=layout == "mla")
        wcfg = StandInVllmConfig(StandInKVTransferConfig("KvxferConnector", kv_role, kv_connector_extra_config=ex),
                                 StandInCacheConfig(BS), mc)
        self.kv = make_kv(layout)
        self.worker = KvxferConnector(wcfg, StandInRole.WORKER)
        self.worker.register_kv_caches(self.kv)
        hs, nt = self.worker.bound_ports()
        sex = dict(ex, kvxfer_ephemeral_ports=False, handshake_port=hs, notify_port=nt)
        scfg = StandInVllmConfig(StandInKVTransferConfig("KvxferConnector", kv_role, kv_connector_extra_config=sex),
                                 StandInCacheConfig(BS), mc)
        self.sched = KvxferConnector(scfg, StandInRole.SCHEDULER)
        self.ports = (hs, nt)
        self.free = list(range(NB))
        self.requests: dict[str, StandInRequest] = {}
        self.waiting: list[str] = []
        self.finished_recving: set[str] = set()
        self.finished_ids: set[str] = set()
        self.delayed: dict[str, list[int]] = {}      # finished, blocks held (delay_free)
        self.freed: set[str] = set()                 # requests whose blocks went back
        self.loaded: dict[str, list[int]] = {}       # D: requests scheduled after their KV came
        self.load_errors: set[int] = set()
        self.finish_params: dict[str, Optional[dict[str, Any]]] = {}
        self.new_computed: set[str] = set()

    # -- requests --------------------------------------------------------------------------------
    def add(self, request_id: str, prompt_len: int, params: Optional[dict[str, Any]], seed: int = 1,
            cached_prefix_blocks: int = 0) -> None:
        req = StandInRequest(request_id, list(range(prompt_len)), dict(params) if params else None, seed=seed)
        for pos in range(cached_prefix_blocks):  # local prefix-cache hit: marker content
            b = self.free.pop(0)
            for li, t in enumerate(self.kv.values()):
                block_view(t, self.layout, b).copy_(-pattern(li, 999, pos, block_view(t, self.layout, b)))
            req.cached_blocks.append(b)
        req.num_computed_tokens = cached_prefix_blocks * BS
        self.requests[request_id] = req
        self.waiting.append(request_id)

    def abort(self, request_id: str) -> None:
        """vLLM's abort: the scheduler finishes the request and asks the connector."""
        req = self.requests[request_id]
        if request_id in self.waiting:
            self.waiting.remove(request_id)
        req.status = StandInStatus.FINISHED_ABORTED
        self._finish(req)

    def _finish(self, req: StandInRequest) -> None:
        delay, params = self.sched.request_finished(req, list(req.block_ids))
        self.finish_params[req.request_id] = params
        self.finished_ids.add(req.request_id)
        if delay:
            self.delayed[req.request_id] = req.block_ids
        else:
            self._free(req.request_id, req.block_ids)

    def _free(self, request_id: str, blocks: list[int]) -> None:
        self.free.extend(blocks)
        self.freed.add(request_id)

    # -- one engine step -------------------------------------------------------------------------
    def step(self) -> None:
        so = StandInSchedulerOutput()
        for rid in list(self.waiting):
            req = self.requests[rid]
            if req.status == StandInStatus.WAITING_FOR_REMOTE_KVS:
                if rid not in self.finished_recving:
                    continue
                self.finished_recving.discard(rid)
                req.status = StandInStatus.WAITING
                req.num_computed_tokens = len(req.prompt_token_ids) - 1  # recompute the last token
                self._schedule(req, so)
                continue
            ext, is_async = self.sched.get_num_new_matched_tokens(req, req.num_computed_tokens)
            need = -(-len(req.prompt_token_ids) // BS) - len(req.cached_blocks)
            new = [self.free.pop(0) for _ in range(need)]
            req.block_ids = req.cached_blocks + new
            self.sched.update_state_after_alloc(req, StandInKVCacheBlocks(req.block_ids, len(req.cached_blocks)),
                                                ext or 0)
            if is_async:
                req.status = StandInStatus.WAITING_FOR_REMOTE_KVS
                continue
            req.num_computed_tokens += ext or 0
            self._schedule(req, so)
        so.finished_req_ids, self.finished_ids = self.finished_ids, set()
        meta = pickle.loads(pickle.dumps(self.sched.build_connector_meta(so)))
        # ---- worker (model runner) ----
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(StandInForwardContext())
        for li, (name, t) in enumerate(self.kv.items()):
            self.worker.wait_for_layer_load(name)
            if self.role == "kv_producer":
                for nr in so.scheduled_new_reqs:
                    req = self.requests[nr.req_id]
                    for pos, b in enumerate(nr.block_ids[0]):
                        v = block_view(t, self.layout, b)
                        v.copy_(pattern(li, req.seed, pos, v))
            self.worker.save_kv_layer(name, t, None)
        self.worker.wait_for_save()
        sending, recving = self.worker.get_finished(so.finished_req_ids)
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        # ---- scheduler: update_from_output ----
        out = StandInKVConnectorOutput(sending, recving, errors)
        self.sched.update_connector_output(out)
        self.load_errors |= errors
        self.finished_recving |= out.finished_recving or set()
        for rid in out.finished_sending or ():
            if rid in self.delayed:
                self._free(rid, self.delayed.pop(rid))
        for nr in so.scheduled_new_reqs:
            req = self.requests[nr.req_id]
            if self.role == "kv_producer":  # max_tokens=1: done after the prefill step
                req.status = StandInStatus.FINISHED_LENGTH_CAPPED
                self._finish(req)
            else:
                self.loaded[req.request_id] = list(req.block_ids)

    def _schedule(self, req: StandInRequest, so: StandInSchedulerOutput) -> None:
        self.waiting.remove(req.request_id)
        req.status = StandInStatus.RUNNING
        so.scheduled_new_reqs.append(StandInNewRequestData(req.request_id, req.prompt_token_ids,
                                                           (list(req.block_ids),), req.num_computed_tokens))

    def blocks_bytes(self, block_ids: list[int]) -> list[list[bytes]]:
        """[layer][i] bytes of block_ids[i]."""
        return [[block_view(t, self.layout, b).contiguous().numpy().tobytes() for b in block_ids]
                for t in self.kv.values()]

    def engine(self) -> Any:
        return self.worker.connector_worker.engine

    def close(self) -> None:
        self.worker.shutdown()


# ---- one instance per process ----------------------------------------------------------------

def _cond(inst: StandInInstance, cond: str, rid: str) -> bool:
    return {"freed": lambda: rid in inst.freed, "loaded": lambda: rid in inst.loaded,
            "finished": lambda: rid in inst.finish_params,
            # white-box: no load of this worker still waits for its terminal completion
            "settled": lambda: not inst.worker.connector_worker.recv_blocks and not inst.worker.connector_worker.failed, "load_error": lambda: bool(inst.load_errors),
            "waiting_remote": lambda: inst.requests[rid].status == StandInStatus.WAITING_FOR_REMOTE_KVS}[cond]()


def instance_main(conn: Any, kv_role: str, read_mode: bool, layout: str, extra: dict[str, Any],
                  hang_s: float) -> None:
    """Child process: run one StandInInstance, answering commands from the test (the proxy)."""
    import time
    inst = StandInInstance(kv_role, read_mode, layout, extra)
    conn.send(inst.ports)
    while True:
        cmd, args = conn.recv()
        try:
            if cmd == "close":
                inst.close()
                conn.send(("ok", None))
                return
            if cmd == "add":
                inst.add(**args)
                res: Any = None
            elif cmd == "abort":
                inst.abort(args)
                res = None
            elif cmd == "step":
                inst.step()
                res = None
            elif cmd == "step_until":
                cond, rid = args
                deadline = time.monotonic() + hang_s
                while True:
                    inst.step()
                    if _cond(inst, cond, rid):
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"hang bound {hang_s}s: {cond} {rid} never held")
                    # Idle like vLLM's busy loop, but block on the engine's eventfd: the next
                    # completion (or the 0.2 s cap) starts the next step.
                    inst.engine().wait(0.2)
                res = None
            elif cmd == "state":
                rid = args
                req = inst.requests.get(rid)
                res = {"finish_params": inst.finish_params.get(rid), "freed": rid in inst.freed,
                       "loaded": inst.loaded.get(rid), "load_errors": set(inst.load_errors),
                       "block_ids": list(req.block_ids) if req else None,
                       "cached_blocks": list(req.cached_blocks) if req else None,
                       "bytes": inst.blocks_bytes(req.block_ids) if req else None,
                       "stats": inst.worker.get_kv_connector_stats().data, "free": len(inst.free),
                       "status": req.status.name if req else None}
            else:
                raise ValueError(cmd)
            conn.send(("ok", res))
        except BaseException as e:  # report to the test, keep serving
            import traceback
            conn.send(("error", f"{e!r}\n{traceback.format_exc()}"))
