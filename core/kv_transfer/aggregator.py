"""One KVConnectorOutput from every worker's: under tensor parallelism each rank moves its
own share of a request's KV (its heads), so a transfer is done only once every rank has
reported it, possibly in different steps.

The executor keeps one KVOutputAggregator and passes each step's outputs of all ranks
through it; the scheduler then sees one report, as with a single worker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from core.kv_transfer.interface import KVConnectorOutput

__all__ = ["KVOutputAggregator"]


class KVOutputAggregator:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        # Request id -> ranks that reported its send or receive done so far.
        self._sending: Counter[str] = Counter()
        self._recving: Counter[str] = Counter()
        self._failed: set[str] = set()  # receives some rank reported failed

    def aggregate(self, outputs: Sequence[KVConnectorOutput | None]) -> KVConnectorOutput:
        """This step's report: sends and receives every rank has now finished (a receive
        failed if any rank's failed), what moved (bytes and each transfer's time over all
        ranks; blocks as the first rank counts them: every rank moves the same block ids,
        maybe in different steps)."""
        merged = KVConnectorOutput()
        if outputs and outputs[0] is not None:
            merged.num_blocks_moved = outputs[0].num_blocks_moved
        for output in outputs:
            if output is None:
                continue
            merged.num_bytes_moved += output.num_bytes_moved
            merged.transfer_times += output.transfer_times
            self._sending.update(output.finished_sending)
            self._recving.update(output.finished_recving)
            self._failed |= output.failed_recving
        merged.finished_sending = self._take_complete(self._sending)
        merged.finished_recving = self._take_complete(self._recving)
        merged.failed_recving = merged.finished_recving & self._failed
        self._failed -= merged.finished_recving
        return merged

    def _take_complete(self, counts: Counter[str]) -> set[str]:
        done = {req_id for req_id, count in counts.items() if count >= self.world_size}
        for req_id in done:
            del counts[req_id]
        return done
