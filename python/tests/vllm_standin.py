# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for vLLM (which cannot be installed here: not packaged for Debian, no other
registry reachable). It models only what the connector sees: the objects vLLM passes in
(Request, KVCacheBlocks, SchedulerOutput, ForwardContext, KVConnectorOutput, a VllmConfig with
its kv_transfer_config) and the order in which vLLM's scheduler and model runner call the
connector in one engine step. One StandInInstance is one vLLM instance: the scheduler half and
the worker halves are separate connector objects, and the metadata crosses between them
pickled, as it crosses processes in vLLM. With TP 1 the worker runs in the instance's process;
with TP > 1 each TP rank's worker runs in a process of its own (StandInWorkerProc, the
stand-in for vLLM's worker processes), with its own engine on base ports + its rank, and the
workers' outputs are combined as vLLM's KV output aggregator does (a request is finished once
every rank reported it; load errors are the union).

"Compute" on a producer fills each scheduled block with a pattern that depends on
(layer, request seed, block position in the prompt), so a consumer's blocks can be checked
byte for byte against the producer's.
"""
from __future__ import annotations

import enum
import os
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


def _geom(name: str, default: int) -> int:
    return int(os.environ.get(f"KVX_STANDIN_{name}", default))


# Geometry: layers, blocks per layer, tokens per block, KV heads, head size, MLA latent size. The
# tests use the defaults; `python3 -m kvxfer.bench connector` sets a model's through the
# environment (KVX_STANDIN_LAYERS, ...), read when this module is imported.
NLAYERS, NB, BS = _geom("LAYERS", 3), _geom("BLOCKS", 24), _geom("BLOCK_SIZE", 4)
H, HD, MLA_D = _geom("HEADS", 2), _geom("HEAD_DIM", 8), _geom("MLA_DIM", 32)


def make_kv(layout: str, heads: int = H) -> dict[str, torch.Tensor]:
    """Zeroed KV caches, int16 (2-byte elements): split K/V [2, NB, BS, heads, HD] (NHD) or MLA
    [NB, BS, D]."""
    shape = (2, NB, BS, heads, HD) if layout == "split" else (NB, BS, MLA_D)
    return {f"model.layers.{i}.self_attn.attn": torch.zeros(shape, dtype=torch.int16) for i in range(NLAYERS)}


def block_view(t: torch.Tensor, layout: str, b: int) -> torch.Tensor:
    return t[:, b] if layout == "split" else t[b]


def pattern(layer: int, seed: int, pos: int, like: torch.Tensor) -> torch.Tensor:
    n = like.numel()
    base = (layer * 7919 + seed * 104729 + pos * 1299709) % 30011
    return (torch.arange(n, dtype=torch.int32).mul(31).add(base) % 32749 + 1).to(torch.int16).reshape(like.shape)


def worker_config(kv_role: str, layout: str, ex: dict[str, Any], tp: int, rank: int) -> StandInVllmConfig:
    mc = StandInModelConfig(num_kv_heads=H if layout == "split" else 1, head_size=HD if layout == "split" else MLA_D,
                            use_mla=layout == "mla")
    return StandInVllmConfig(StandInKVTransferConfig("KvxferConnector", kv_role, kv_connector_extra_config=ex),
                             StandInCacheConfig(BS), mc, StandInParallelConfig(tensor_parallel_size=tp, rank=rank))


class StandInWorker:
    """One worker (one TP rank) as vLLM's model runner drives the connector in a step; the
    producer's "compute" fills each scheduled block with the pattern of (layer, seed, position,
    rank)."""

    def __init__(self, kv_role: str, layout: str, ex: dict[str, Any], tp: int, rank: int) -> None:
        self.role, self.layout, self.rank = kv_role, layout, rank
        cfg = worker_config(kv_role, layout, ex, tp, rank)
        self.kv = make_kv(layout, cfg.model_config.get_num_kv_heads(cfg.parallel_config))
        self.conn = KvxferConnector(cfg, StandInRole.WORKER)
        self.conn.register_kv_caches(self.kv)

    def ports(self) -> tuple[int, int]:
        return self.conn.bound_ports()

    def step(self, meta_blob: bytes, new_reqs: list[tuple[list[int], int]], finished: set[str]) -> tuple:
        self.conn.bind_connector_metadata(pickle.loads(meta_blob))
        self.conn.start_load_kv(StandInForwardContext())
        for li, (name, t) in enumerate(self.kv.items()):
            self.conn.wait_for_layer_load(name)
            if self.role == "kv_producer":
                for ids, seed in new_reqs:
                    for pos, b in enumerate(ids):
                        v = block_view(t, self.layout, b)
                        v.copy_(pattern(li, seed + 5003 * self.rank, pos, v))
            self.conn.save_kv_layer(name, t, None)
        self.conn.wait_for_save()
        sending, recving = self.conn.get_finished(finished)
        errors = self.conn.get_block_ids_with_load_errors()
        self.conn.clear_connector_metadata()
        return sending, recving, errors

    def bytes(self, block_ids: list[int]) -> list[list[bytes]]:
        """[layer][i] bytes of block_ids[i]."""
        return [[block_view(t, self.layout, b).contiguous().numpy().tobytes() for b in block_ids]
                for t in self.kv.values()]

    def stats(self) -> dict[str, Any]:
        return self.conn.get_kv_connector_stats().data

    def settled(self) -> bool:
        """White-box: no load of this worker still waits for its terminal completion."""
        cw = self.conn.connector_worker
        return not cw.recv_blocks and not cw.failed

    def wait(self, timeout: float) -> None:
        self.conn.connector_worker.engine.wait(timeout)

    def close(self) -> None:
        self.conn.shutdown()


def _worker_main(conn: Any, args: tuple) -> None:
    """Child process of StandInWorkerProc: one StandInWorker, answering its instance."""
    try:
        w = StandInWorker(*args)
        conn.send(("ok", w.ports()))
    except BaseException as e:
        conn.send(("error", repr(e)))
        return
    while True:
        cmd, a = conn.recv()
        try:
            if cmd == "close":
                w.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", getattr(w, cmd)(*a)))
        except BaseException as e:
            import traceback
            conn.send(("error", f"{e!r}\n{traceback.format_exc()}"))


class StandInWorkerProc:
    """STAND-IN for one of vLLM's worker processes (TP > 1): a StandInWorker in a process of
    its own, called by its instance over a pipe (vLLM ships the scheduler output, with the
    connector metadata, to every worker the same way: pickled)."""

    def __init__(self, args: tuple, hang_s: float) -> None:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.hang_s = hang_s
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, args), daemon=True)
        self.proc.start()
        child.close()
        assert self.conn.poll(hang_s * 2), "worker process did not start"
        st, res = self.conn.recv()
        if st != "ok":
            self.proc.join(hang_s)
            raise RuntimeError(f"worker rank {args[4]}: {res}")
        self._ports = res

    def _call(self, cmd: str, *a: Any) -> Any:
        self.conn.send((cmd, a))
        assert self.conn.poll(self.hang_s * 2), f"worker: {cmd}: no answer"
        st, res = self.conn.recv()
        assert st == "ok", res
        return res

    def ports(self) -> tuple[int, int]:
        return self._ports

    def step(self, meta_blob: bytes, new_reqs: list[tuple[list[int], int]], finished: set[str]) -> tuple:
        return self._call("step", meta_blob, new_reqs, finished)

    def bytes(self, block_ids: list[int]) -> list[list[bytes]]:
        return self._call("bytes", block_ids)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def settled(self) -> bool:
        return self._call("settled")

    def wait(self, timeout: float) -> None:
        self._call("wait", timeout)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self._call("close")
            finally:
                self.proc.join(self.hang_s)
        if self.proc.is_alive():
            self.proc.kill()


def _free_base(n: int) -> int:
    """A port with the n ports from it free now (TP workers bind base + rank)."""
    import socket
    for _ in range(100):
        with socket.socket() as s0:
            s0.bind(("127.0.0.1", 0))
            base = s0.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for k in range(n):
                sk = socket.socket()
                socks.append(sk)
                sk.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for sk in socks:
                sk.close()
    raise RuntimeError("no free port range")


class StandInInstance:
    """One vLLM instance (scheduler + tp workers) driving KvxferConnector in vLLM's order."""

    def __init__(self, kv_role: str, read_mode: bool, layout: str, extra: Optional[dict[str, Any]] = None,
                 tp: int = 1, hang_s: float = 60.0) -> None:
        self.layout = layout
        self.role = kv_role
        ex = {"proxy_ip": "", "proxy_ping_port": 0, "http_port": 0, "host_ip": "127.0.0.1",
              "read_mode": "true" if read_mode else "false", "kvxfer_transport": "tcp",
              "kvxfer_ephemeral_ports": True, "transfer_timeout": 30, "defer_timeout": 120,
              "handshake_timeout": 20}
        ex.update(extra or {})
        self.workers: list[Any] = []
        if tp == 1:
            self.workers = [StandInWorker(kv_role, layout, ex, 1, 0)]
            hs, nt = self.workers[0].ports()
        else:
            hs, nt = self._start_workers(kv_role, layout, ex, tp, hang_s)
        sex = dict(ex, kvxfer_ephemeral_ports=False, handshake_port=hs, notify_port=nt)
        self.sched = KvxferConnector(worker_config(kv_role, layout, sex, tp, 0), StandInRole.SCHEDULER)
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
        self.reported: dict[tuple[str, str], int] = {}  # (sending|recving, req) -> ranks so far

    def _start_workers(self, kv_role: str, layout: str, ex: dict[str, Any], tp: int, hang_s: float) -> tuple[int, int]:
        """Fixed base ports (rank r binds base + r); retried on another range if one is taken."""
        for _ in range(5):
            hs, nt = _free_base(tp), _free_base(tp)
            wex = dict(ex, kvxfer_ephemeral_ports=False, handshake_port=hs, notify_port=nt)
            try:
                for r in range(tp):
                    self.workers.append(StandInWorkerProc((kv_role, layout, wex, tp, r), hang_s))
                return hs, nt
            except RuntimeError as e:
                for w in self.workers:
                    w.close()
                self.workers = []
                if "EADDRINUSE" not in str(e) and "Address already in use" not in str(e):
                    raise
        raise RuntimeError("worker ports kept being taken")

    # -- requests --------------------------------------------------------------------------------
    def add(self, request_id: str, prompt_len: int, params: Optional[dict[str, Any]], seed: int = 1,
            cached_prefix_blocks: int = 0) -> None:
        assert cached_prefix_blocks == 0 or len(self.workers) == 1, "prefix markers: TP 1 only"
        req = StandInRequest(request_id, list(range(prompt_len)), dict(params) if params else None, seed=seed)
        for pos in range(cached_prefix_blocks):  # local prefix-cache hit: marker content
            b = self.free.pop(0)
            for li, t in enumerate(self.workers[0].kv.values()):
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

    def _aggregate(self, kind: str, per_rank: list[Optional[set[str]]]) -> Optional[set[str]]:
        """vLLM's KV output aggregator: a request is finished once every worker reported it."""
        done: set[str] = set()
        for ids in per_rank:
            for rid in ids or ():
                n = self.reported.get((kind, rid), 0) + 1
                if n == len(self.workers):
                    self.reported.pop((kind, rid), None)
                    done.add(rid)
                else:
                    self.reported[(kind, rid)] = n
        return done or None

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
        blob = pickle.dumps(self.sched.build_connector_meta(so))
        # ---- workers (model runners) ----
        new_reqs = [(list(nr.block_ids[0]), self.requests[nr.req_id].seed) for nr in so.scheduled_new_reqs]
        outs = [w.step(blob, new_reqs, set(so.finished_req_ids)) for w in self.workers]
        errors: set[int] = set().union(*(o[2] for o in outs))
        # ---- scheduler: update_from_output ----
        out = StandInKVConnectorOutput(self._aggregate("sending", [o[0] for o in outs]),
                                       self._aggregate("recving", [o[1] for o in outs]), errors)
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

    def blocks_bytes(self, block_ids: list[int]) -> list[list[list[bytes]]]:
        """[rank][layer][i] bytes of block_ids[i]."""
        return [w.bytes(block_ids) for w in self.workers]

    def stats(self) -> dict[str, Any]:
        """Connector stats summed over the workers (vLLM aggregates them the same way)."""
        tot: dict[str, Any] = {}
        for w in self.workers:
            for k, v in w.stats().items():
                if isinstance(v, (int, float)):
                    tot[k] = tot.get(k, 0) + v
        return tot

    def settled(self) -> bool:
        return all(w.settled() for w in self.workers)

    def idle_wait(self, timeout: float) -> None:
        """Like vLLM's busy loop, but blocking on worker 0's engine eventfd: its next
        completion (or the timeout) starts the next step."""
        self.workers[0].wait(timeout)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.sched.shutdown()


# ---- one instance per process ----------------------------------------------------------------

def _cond(inst: StandInInstance, cond: str, rid: str) -> bool:
    return {"freed": lambda: rid in inst.freed, "loaded": lambda: rid in inst.loaded,
            "finished": lambda: rid in inst.finish_params,
            # white-box: no load of this worker still waits for its terminal completion
            "settled": inst.settled, "load_error": lambda: bool(inst.load_errors),
            "waiting_remote": lambda: inst.requests[rid].status == StandInStatus.WAITING_FOR_REMOTE_KVS}[cond]()


def instance_main(conn: Any, kv_role: str, read_mode: bool, layout: str, extra: dict[str, Any],
                  hang_s: float, tp: int = 1) -> None:
    """Child process: run one StandInInstance, answering commands from the test (the proxy)."""
    import time
    inst = StandInInstance(kv_role, read_mode, layout, extra, tp, hang_s)
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
                    inst.idle_wait(0.2)
                res = None
            elif cmd == "finish_params":  # request_finished's params only (no block bytes)
                res = inst.finish_params.get(args)
            elif cmd == "state":
                rid = args
                req = inst.requests.get(rid)
                res = {"finish_params": inst.finish_params.get(rid), "freed": rid in inst.freed,
                       "loaded": inst.loaded.get(rid), "load_errors": set(inst.load_errors),
                       "block_ids": list(req.block_ids) if req else None,
                       "cached_blocks": list(req.cached_blocks) if req else None,
                       "bytes": inst.blocks_bytes(req.block_ids) if req else None,
                       "stats": inst.stats(), "free": len(inst.free),
                       "status": req.status.name if req else None}
            else:
                raise ValueError(cmd)
            conn.send(("ok", res))
        except BaseException as e:  # report to the test, keep serving
            import traceback
            conn.send(("error", f"{e!r}\n{traceback.format_exc()}"))
