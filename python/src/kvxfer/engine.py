# SPDX-License-Identifier: Apache-2.0
"""Typed wrapper over the C extension ``kvxfer._kvxfer`` (include/kvxfer/engine.h).

Thread model: an :class:`Engine` may be called from any Python thread; the extension serialises
engine calls with a mutex and releases the GIL around every call that can wait. Completions are
moved from the engine by a C pump thread into a queue; :meth:`Engine.poll` drains it without
blocking and :meth:`Engine.fileno` is an eventfd that is readable while the queue is non-empty
(usable from ``selectors`` and ``asyncio``).
"""
from __future__ import annotations

import asyncio
import enum
from dataclasses import asdict, dataclass
from typing import Any, AsyncIterator, NamedTuple, Optional, Sequence

from . import _kvxfer

KvxError = _kvxfer.KvxError


class Role(enum.IntEnum):
    """Engine role (enum kvx_sched_role)."""
    PRODUCER = 0
    CONSUMER = 1


class Mode(enum.IntEnum):
    """Transfer mode (enum kvx_sched_mode)."""
    READ = 0
    WRITE = 1


class Idle(enum.IntEnum):
    """Poller idle policy (enum kvx_engine_idle)."""
    BUSY = 0
    ADAPTIVE = 1


class Spread(enum.IntEnum):
    """How one transfer's layers are posted over the engine's polling lcores (enum
    kvx_engine_spread): LAYERS hands layer L to lcore L mod n (with >= 2 lcores and >= 2
    layers), NONE keeps every layer on the transfer's owning lcore."""
    LAYERS = 0
    NONE = 1


class Mem(enum.IntEnum):
    """Memory type of a registered layer (enum kvx_engine_mem)."""
    HOST = 0
    HIP = 1
    HOSTDEV = 2


class CplKind(enum.IntEnum):
    """What a completion reports (enum kvx_cpl_kind)."""
    TRANSFER = 1
    BLOCKS_RELEASED = 2


class CplStatus(enum.IntEnum):
    """Terminal status of a transfer (enum kvx_cpl_status)."""
    DONE = 0
    FAILED = 1
    ABORTED = 2
    TIMED_OUT = 3


class Completion(NamedTuple):
    """One completion; ``error`` is 0 or a negative errno; ``bytes`` moved by this engine."""
    transfer_id: str
    kind: int
    status: int
    error: int
    bytes: int
    duration_ns: int


class Peer(NamedTuple):
    """Where a peer worker listens (struct kvx_engine_peer). tp_size 0 = same as local."""
    host: str
    handshake_port: int
    notify_port: int
    dp_rank: int = 0
    dp_size_local: int = 0
    tp_size: int = 0
    remote_hosts: Optional[Sequence[str]] = None


@dataclass
class EngineParams:
    """struct kvx_engine_params; defaults are kvx_engine_params_init()'s. Times in ms."""
    role: Role = Role.CONSUMER
    mode: Mode = Mode.WRITE
    transport: str = "auto"
    lcores: Optional[str] = None
    control_lcore: int = 0xFFFFFFFF
    idle: Idle = Idle.ADAPTIVE
    follow_waker: bool = True
    poller_slice_us: int = 100
    host: str = "127.0.0.1"
    handshake_port: int = 6301
    notify_port: int = 61005
    dp_rank: int = 0
    dp_size: int = 1
    dp_size_local: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    total_kv_heads: int = 0
    handshake_timeout_ms: int = 10000
    transfer_timeout_ms: int = 30000
    defer_timeout_ms: int = 60000
    proxy_addr: Optional[str] = None
    http_addr: Optional[str] = None
    vllm_port_compat: bool = False
    max_transfers: int = 1024
    max_blocks: int = 8192
    spread: Spread = Spread.LAYERS
    control_busy_poll_us: int = 100

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("role", "mode", "idle", "spread"):
            v = d[k]
            d[k] = int(v) if isinstance(v, enum.IntEnum) else v
        return d


@dataclass(frozen=True)
class LayerSpec:
    """The model's KV-cache spec of a layer (struct kvx_layout_spec): logical block size in
    tokens, KV heads per rank and head size in elements (0 = unknown), MLA or not."""
    block_size: int
    num_kv_heads: int = 0
    head_size: int = 0
    is_mla: bool = False


def tensor_mem(tensor: Any) -> tuple[Mem, int]:
    """Memory type and device id of a torch tensor: cpu -> HOST; a GPU tensor ('cuda' is
    also ROCm's device type) -> HIP with its device index."""
    dev = tensor.device
    if dev.type == "cpu":
        return Mem.HOST, 0
    if dev.type in ("cuda", "hip"):
        return Mem.HIP, int(dev.index or 0)
    raise ValueError(f"tensor.device: {dev} is not a supported memory type (cpu or a HIP GPU)")


def geometry(shape: Sequence[int], stride: Sequence[int], elem_size: int, spec: LayerSpec) -> dict[str, Any]:
    """Classify a KV layer as the C layout module does (split, interleaved, MLA, kernel-block):
    returns kind, num_blocks, block_len (bytes), block_stride (elements), ... Raises KvxError
    (EINVAL) with the layout module's message for an unsupported shape."""
    return _kvxfer.geometry(tuple(shape), tuple(stride), elem_size, spec.block_size, spec.num_kv_heads,
                            spec.head_size, spec.is_mla)


class Notifier(_kvxfer.Notifier):
    """The decode scheduler's sender of ``remote_blocks`` / ``release`` (WRITE mode), as
    MoRIIO's scheduler half sends them: no engine, no registered memory, one control thread
    (include/kvxfer/engine.h kvx_notifier_*). ``params`` is the decode instance's (consumer,
    WRITE; host, dp_rank/dp_size/dp_size_local, tp_size, vllm_port_compat are used). The
    workers' engines then only await ``write_done`` (``Engine.announce(..., notified=True)``).
    One thread at a time; announce() never blocks (GIL released)."""

    def __init__(self, params: EngineParams) -> None:
        super().__init__(params.to_dict())

    def __enter__(self) -> "Notifier":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Engine(_kvxfer.Engine):
    """One kvxfer engine (one (dp_rank, tp_rank) worker). Lifecycle: Engine(params) ->
    register_tensor()/register_layer() per layer -> start() -> transfers -> close().

    Errors raise :class:`KvxError` (an OSError: ``errno`` positive, message names the call)
    or ValueError/TypeError naming the bad argument."""

    def __init__(self, params: Optional[EngineParams] = None, **overrides: Any) -> None:
        p = params or EngineParams()
        d = p.to_dict()
        for k, v in overrides.items():
            if k not in d:
                raise TypeError(f"{k}: not an engine parameter")
            d[k] = int(v) if isinstance(v, enum.IntEnum) else v
        super().__init__(d)
        self.params = p

    def register_tensor(self, name: str, tensor: Any, spec: LayerSpec) -> int:
        """Register a torch tensor as KV layer ``name`` (before start()); returns its index.
        Shape/strides are in elements, ``data_ptr()`` the base, the device gives the memory
        type. The tensor is kept alive by the engine."""
        mem, dev = tensor_mem(tensor)
        return self.register_layer(name, int(tensor.data_ptr()), tuple(tensor.shape), tuple(tensor.stride()),
                                   int(tensor.element_size()), spec.block_size, spec.num_kv_heads,
                                   spec.head_size, spec.is_mla, int(mem), dev, tensor)

    def completions(self, max: int = 64) -> list[Completion]:
        """poll() as :class:`Completion` tuples (non-blocking)."""
        return [Completion(*c) for c in self.poll(max)]

    async def completions_async(self) -> AsyncIterator[Completion]:
        """Yield completions as they arrive, waiting on fileno() in the running event loop."""
        loop = asyncio.get_running_loop()
        fd = self.fileno()
        while True:
            for c in self.poll(64):
                yield Completion(*c)
            ev = asyncio.Event()
            loop.add_reader(fd, ev.set)
            try:
                if not self.wait(0):
                    await ev.wait()
            finally:
                loop.remove_reader(fd)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
