"""`multi`: several connectors behind one, tried in order (e.g. p2p, then offload).

    --kv-transfer-config '{"kv_connector": "multi", "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "p2p", "kv_connector_extra_config": {"kv_port": 14600}},
            {"kv_connector": "offload", "kv_connector_extra_config": {"num_cpu_blocks": 4096}}]}}'

Each connector keeps its own state and metadata. A request's external tokens come from
the first connector that offers any (the others are told of its admission with 0
external tokens: they still see every request, to save its blocks); at most one
connector may keep a finished request's blocks for a send; the workers' reports merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from core.config import EngineConfig, KVTransferConfig
from core.kv_transfer.interface import (
    KVConnector,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)
from core.kv_transfer.selector import build_kv_connector
from core.request import Request
from core.worker.contract import SchedulerOutput


@dataclass
class MultiMetadata(KVConnectorMetadata):
    parts: list[KVConnectorMetadata] = field(default_factory=list)  # one per connector


def _sub_configs(config: EngineConfig) -> list[EngineConfig]:
    """One EngineConfig per listed connector: its name and keys, the parent's role."""
    extra = config.kv_transfer.kv_connector_extra_config
    listed = extra.get("connectors")
    unknown = sorted(set(extra) - {"connectors"})
    if unknown or not isinstance(listed, list) or not listed:
        raise ValueError("kv_connector_extra_config: multi takes one key, connectors, a "
                         "non-empty list of {kv_connector, kv_connector_extra_config}")  # fmt: skip
    configs = []
    for entry in listed:
        if not isinstance(entry, dict) or entry.get("kv_connector") in (None, "multi"):
            raise ValueError(f"kv_connector_extra_config.connectors: {entry!r} names no "
                             "connector (or multi itself)")  # fmt: skip
        transfer = KVTransferConfig(
            kv_connector=entry["kv_connector"],
            kv_role=config.kv_transfer.kv_role,
            kv_connector_extra_config=entry.get("kv_connector_extra_config", {}),
        )
        configs.append(config.model_copy(update={"kv_transfer": transfer}))
    return configs


class MultiConnector(KVConnector):
    def __init__(self, config: EngineConfig, role: KVConnectorRole) -> None:
        super().__init__(config, role)
        self.connectors = []
        for sub_config in _sub_configs(config):
            connector = build_kv_connector(sub_config, role)
            assert connector is not None  # every entry names a connector
            self.connectors.append(connector)
        self._chosen: dict[str, int] = {}  # request id -> the connector supplying its KV

    # -- scheduler role --------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        for index, connector in enumerate(self.connectors):
            count, load_async = connector.get_num_new_matched_tokens(request, num_computed_tokens)
            if count > 0:
                self._chosen[request.request_id] = index
                return count, load_async
        self._chosen.pop(request.request_id, None)
        return 0, False

    def update_state_after_alloc(
        self, request: Request, block_ids: tuple[list[int], ...], num_external_tokens: int
    ) -> None:
        chosen = self._chosen.pop(request.request_id, None) if num_external_tokens else None
        for index, connector in enumerate(self.connectors):
            count = num_external_tokens if index == chosen else 0
            connector.update_state_after_alloc(request, block_ids, count)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return MultiMetadata([c.build_connector_meta(scheduler_output) for c in self.connectors])

    def request_finished(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        keepers, params = [], None
        for connector in self.connectors:
            keeps, one_params = connector.request_finished(request, block_ids)
            keepers += [connector] if keeps else []
            params = params if params is not None else one_params
        if len(keepers) > 1:
            # The first finished send would free blocks another still reads.
            raise RuntimeError(f"multi: {len(keepers)} connectors keep request "
                               f"{request.request_id}'s blocks; at most one may")  # fmt: skip
        return bool(keepers), params

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        # Each connector ignores the requests of the others (it never loaded them).
        for connector in self.connectors:
            connector.update_connector_output(output)

    # -- worker role -----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for connector in self.connectors:
            connector.rank = self.rank
            connector.register_kv_caches(kv_caches)

    def shutdown(self) -> None:
        for connector in self.connectors:
            connector.shutdown()

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(metadata)
        if not isinstance(metadata, MultiMetadata):
            raise TypeError(f"multi: expected MultiMetadata, got {type(metadata).__name__}")
        for connector, part in zip(self.connectors, metadata.parts, strict=True):
            connector.bind_connector_metadata(part)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        for connector in self.connectors:
            connector.clear_connector_metadata()

    def start_load_kv(self, forward_context: Any) -> None:
        for connector in self.connectors:
            connector.start_load_kv(forward_context)

    def wait_for_layer_load(self, layer_name: str) -> None:
        for connector in self.connectors:
            connector.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any) -> None:
        for connector in self.connectors:
            connector.save_kv_layer(layer_name, kv_layer, attn_metadata)

    def wait_for_save(self) -> None:
        for connector in self.connectors:
            connector.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> KVConnectorOutput:
        merged = KVConnectorOutput()
        for connector in self.connectors:
            merged.add(connector.get_finished(finished_req_ids))
        return merged
