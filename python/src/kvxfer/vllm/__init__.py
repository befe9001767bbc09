# SPDX-License-Identifier: Apache-2.0
"""kvxfer's vLLM KV connector: ``kv_connector="KvxferConnector"``,
``kv_connector_module_path="kvxfer.vllm"``. Importing this package imports vLLM only if it is
installed (for its base classes); it opens no socket."""
from .config import ConnectorConfig, decode_address, parse_zmq_address, port_offset, prefill_address, zmq_address
from .connector import KvxferConnector, KvxferConnectorStats
from .meta import KvxferConnectorMetadata

__all__ = ["ConnectorConfig", "KvxferConnector", "KvxferConnectorMetadata", "KvxferConnectorStats",
           "decode_address", "parse_zmq_address", "port_offset", "prefill_address", "zmq_address"]
