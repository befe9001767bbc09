# SPDX-License-Identifier: Apache-2.0
"""kvxfer: Python binding of the kvxfer KV-cache transfer engine.

``kvxfer.Engine`` drives the C engine (include/kvxfer/engine.h); ``kvxfer.vllm`` holds a vLLM
KV connector that drops in for MoRIIOConnector. Importing this package opens no socket.
"""
from .engine import (Completion, CplKind, CplStatus, Engine, EngineParams, Idle, KvxError, LayerSpec, Mem, Mode,
                     Notifier, Peer, Role, Spread, geometry, tensor_mem)

__all__ = ["Completion", "CplKind", "CplStatus", "Engine", "EngineParams", "Idle", "KvxError", "LayerSpec", "Mem",
           "Mode", "Notifier", "Peer", "Role", "Spread", "geometry", "tensor_mem"]
__version__ = "0.1.0"
