"""The scheduler's side of a KV connector (core/kv_transfer/interface.py): which prompt
tokens an external store supplies, requests waiting for their KV to load, and blocks held
until an asynchronous send finishes.

A request whose external tokens load asynchronously gets its blocks at admission, waits
in the queue as WAITING_FOR_REMOTE_KVS (keeping its place, not blocking the requests
behind it) and is scheduled once the workers report its load finished. Its loaded blocks
enter the prefix cache only then, so no other request reads them half-written. A failed
load frees them unindexed and the request recomputes its prompt without the connector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.kv_transfer.interface import KVConnector, KVConnectorOutput
from core.request import Request


@dataclass
class TransferTotals:
    num_blocks: int = 0
    num_bytes: int = 0
    num_failed_loads: int = 0

    def add(self, output: KVConnectorOutput, num_failed_loads: int) -> None:
        self.num_blocks += output.num_blocks_moved
        self.num_bytes += output.num_bytes_moved
        self.num_failed_loads += num_failed_loads


class RemoteKV:
    def __init__(self, connector: KVConnector) -> None:
        self.connector = connector
        # Requests loading asynchronously: id -> the external tokens coming.
        self._loading: dict[str, int] = {}
        # Loads the workers reported done (with the failed ones) since the last check.
        self._loaded: set[str] = set()
        self._failed: set[str] = set()
        # Requests whose load failed: they recompute without asking the connector again.
        self._bypass: set[str] = set()
        # Prompt tokens of the requests that asked the connector, and those it supplied.
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        # What the workers moved, cumulative (SchedulerStats' kv_transfer_*).
        self.transfers = TransferTotals()
        # Finished or aborted requests whose blocks wait for a transfer to finish: an
        # asynchronous send, or a load still writing them (leak rather than misuse).
        self.held: dict[str, Request] = {}

    def external_tokens(self, request: Request, num_computed: int) -> tuple[int, bool]:
        """(tokens the connector supplies past `num_computed`, whether asynchronously),
        leaving the prompt's last token to compute (its logits give the first token)."""
        if request.request_id in self._bypass:
            return 0, False
        count, load_async = self.connector.get_num_new_matched_tokens(request, num_computed)
        count = max(min(count, request.num_tokens - 1 - num_computed), 0)
        self.num_queried_tokens += request.num_tokens
        self.num_hit_tokens += count
        return (count, load_async) if count > 0 else (0, False)

    def start_loading(self, request: Request, num_external: int) -> None:
        self._loading[request.request_id] = num_external

    def is_loading(self, request: Request) -> bool:
        return request.request_id in self._loading

    def finish_loading(self, request: Request) -> tuple[bool, int] | None:
        """None while the load runs; else (whether it succeeded, the tokens it brought)."""
        req_id = request.request_id
        if req_id not in self._loaded:
            return None
        self._loaded.discard(req_id)
        num_external = self._loading.pop(req_id)
        if req_id in self._failed:
            self._failed.discard(req_id)
            self._bypass.add(req_id)
            return False, 0
        return True, num_external

    def observe(self, output: KVConnectorOutput | None) -> list[Request]:
        """Record the workers' finished transfers; the held requests whose transfers
        finished (their blocks may now be freed)."""
        if output is None:
            return []
        self.connector.update_connector_output(output)
        self.transfers.add(output, len(output.failed_recving & self._loading.keys()))
        freed = []
        for req_id in output.finished_recving & self._loading.keys():
            if req_id in self.held:  # aborted while loading
                del self._loading[req_id]
                freed.append(self.held.pop(req_id))
            else:
                self._loaded.add(req_id)
                if req_id in output.failed_recving:
                    self._failed.add(req_id)
        freed += [self.held.pop(i) for i in output.finished_sending if i in self.held]
        return freed

    def release(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The request left the engine (finished or aborted): (whether its blocks must stay
        allocated until a transfer finishes (`observe` hands them back), the connector's
        kv_transfer_params for the client)."""
        req_id = request.request_id
        for ids in (self._loaded, self._failed, self._bypass):
            ids.discard(req_id)
        if req_id in self._loading:
            self.held[req_id] = request
            return True, None
        keep, params = self.connector.request_finished(request, block_ids)
        if keep:
            self.held[req_id] = request
        return keep, params
