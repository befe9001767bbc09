# SPDX-License-Identifier: Apache-2.0
"""KvxferConnector: a vLLM KV connector (KVConnectorBase_V1 surface) over the kvxfer engine,
a drop-in for MoRIIOConnector (same kv_transfer_config keys, proxy heartbeat, request-id
address conventions).

vLLM is imported only here, and only if installed: without it the class derives from a small
local base with the same metadata plumbing (what the tests' vLLM stand-in drives).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from .config import ConnectorConfig
from .meta import KvxferConnectorMetadata
from .scheduler import KvxferScheduler
from .worker import KvxferWorker

log = logging.getLogger("kvxfer.vllm")


class _LocalBase:
    """The metadata plumbing of vLLM's KVConnectorBase_V1, for use without vLLM."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        self._vllm_config = vllm_config
        self._role = role
        self._kv_cache_config = kv_cache_config
        self._connector_metadata: Optional[Any] = None

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> Any:
        assert self._connector_metadata is not None, "no connector metadata bound"
        return self._connector_metadata


def _bases() -> tuple[type, type]:
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
        return KVConnectorBase_V1, KVConnectorStats
    except ImportError:
        return _LocalBase, object


_Base, _StatsBase = _bases()


@dataclass
class KvxferConnectorStats(_StatsBase):  # type: ignore[misc,valid-type]
    """Connector stats: engine counters plus this worker's completed-transfer totals."""
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def is_empty(self) -> bool:
        return not self.data

    def aggregate(self, other: "KvxferConnectorStats") -> "KvxferConnectorStats":
        for k, v in other.data.items():
            if isinstance(v, (int, float)):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, Any]:
        d = self.data
        n = d.get("transfers_done", 0)
        secs = d.get("duration_ns", 0) / 1e9
        return {
            "Num successful transfers": n,
            "Num failed transfers": d.get("transfers_failed", 0),
            "Avg xfer time (ms)": round(secs * 1e3 / n, 3) if n else 0.0,
            "Avg MB per transfer": round(d.get("bytes", 0) / 1e6 / n, 3) if n else 0.0,
            "Throughput (MB/s)": round(d.get("bytes", 0) / 1e6 / secs, 3) if secs else 0.0,
        }


def _role_name(role: Any) -> str:
    return str(getattr(role, "name", role)).upper()


def _tp_rank(vllm_config: Any) -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return int(get_tensor_model_parallel_rank())
    except (ImportError, AssertionError, AttributeError):
        pc = vllm_config.parallel_config
        return int(getattr(pc, "rank", 0)) % int(getattr(pc, "tensor_parallel_size", 1) or 1)


class KvxferConnector(_Base):  # type: ignore[misc,valid-type]
    """vLLM KV connector backed by kvxfer. Use with
    ``--kv-transfer-config '{"kv_connector":"KvxferConnector","kv_connector_module_path":"kvxfer.vllm",...}'``.
    The scheduler-role instance owns request bookkeeping; the worker-role instance the engine."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        try:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        except TypeError:
            super().__init__(vllm_config=vllm_config, role=role)
        self.cfg = ConnectorConfig.from_vllm_config(vllm_config)
        self.connector_scheduler: Optional[KvxferScheduler] = None
        self.connector_worker: Optional[KvxferWorker] = None
        if _role_name(role) == "SCHEDULER":
            self.connector_scheduler = KvxferScheduler(self.cfg)
        else:
            mc = vllm_config.model_config
            pc = vllm_config.parallel_config
            self.connector_worker = KvxferWorker(self.cfg, _tp_rank(vllm_config), int(mc.get_num_kv_heads(pc)),
                                                 int(mc.get_head_size()), bool(getattr(mc, "use_mla", False)))

    # ---- scheduler side ---------------------------------------------------------------------
    def _sched(self) -> KvxferScheduler:
        assert self.connector_scheduler is not None, "scheduler-side call on a worker connector"
        return self.connector_scheduler

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[Optional[int], bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KvxferConnectorMetadata:
        return self._sched().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        return self._sched().request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        self._sched().update_connector_output(connector_output)

    # ---- worker side ------------------------------------------------------------------------
    def _work(self) -> KvxferWorker:
        assert self.connector_worker is not None, "worker-side call on a scheduler connector"
        return self.connector_worker

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._work().register_kv_caches(kv_caches)

    def bound_ports(self) -> tuple[int, int]:
        """(handshake, notify) base ports of this worker's engine (with kvxfer_ephemeral_ports)."""
        return self._work().bound_ports()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvxferConnectorMetadata)
        self._work().start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._work().wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        self._work().save_kv_layer(layer_name, kv_layer)

    def wait_for_save(self) -> None:
        self._work().wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        return self._work().get_finished()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._work().get_block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> Optional[KvxferConnectorStats]:
        if self.connector_worker is None:
            return None
        return KvxferConnectorStats(data=self.connector_worker.stats())

    def shutdown(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()
