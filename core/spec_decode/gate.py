"""AcceptanceGate: pause drafting for a request whose drafts keep being rejected.

Drafts cost compute (a proposer's forwards, longer verification forwards), and a request
whose text the proposer cannot predict (random prompts for an n-gram lookup, a topic the
early layers miss) would pay it for nothing. The gate keeps a moving average of each
request's acceptance rate; below the proposer's `min_acceptance_rate` the request drafts
nothing for a pause that doubles each time it recurs, then tries again. A new request
starts from the engine-wide average: where drafts have lately been worthless, it starts
paused (a single stream of such requests would otherwise pay a few failed drafts each).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AcceptanceGate"]

_SMOOTHING = 0.5  # weight of the newest observation in a request's moving average
_PRIOR_SMOOTHING = 0.2  # the same in the engine-wide average
_FIRST_PAUSE, _MAX_PAUSE = 4, 64  # steps
_NEW_REQUEST_PAUSE = 16  # a new request's first pause when drafts have been worthless


@dataclass
class _Record:
    rate: float = 1.0  # optimistic: a new request drafts at once
    pause_left: int = 0
    next_pause: int = _FIRST_PAUSE


class AcceptanceGate:
    def __init__(self, min_acceptance_rate: float) -> None:
        if not 0.0 <= min_acceptance_rate <= 1.0:
            raise ValueError(f"min_acceptance_rate must be in [0, 1], got {min_acceptance_rate}")
        self.min_acceptance_rate = min_acceptance_rate
        self._records: dict[str, _Record] = {}
        self._prior = 1.0  # the engine-wide moving average, optimistic before any draft

    def allows(self, req_id: str) -> bool:
        """Whether the request may draft this step; a paused request counts one step down."""
        record = self._records.get(req_id)
        if record is None:
            record = self._records[req_id] = self._new_record()
        if record.pause_left == 0:
            return True
        record.pause_left -= 1
        return False

    def _new_record(self) -> _Record:
        if self._prior >= self.min_acceptance_rate:
            return _Record(rate=self._prior)
        pause = _NEW_REQUEST_PAUSE
        return _Record(rate=self.min_acceptance_rate, pause_left=pause, next_pause=2 * pause)

    def observe(self, req_id: str, num_drafts: int, num_accepted: int) -> None:
        """Record one verification of `num_drafts` drafts (no-op for none)."""
        if num_drafts == 0:
            return
        self._prior += _PRIOR_SMOOTHING * (num_accepted / num_drafts - self._prior)
        record = self._records.setdefault(req_id, _Record())
        record.rate += _SMOOTHING * (num_accepted / num_drafts - record.rate)
        if record.rate < self.min_acceptance_rate:
            record.pause_left = record.next_pause
            record.next_pause = min(2 * record.next_pause, _MAX_PAUSE)
            # After the pause one verification decides: a good one keeps it drafting.
            record.rate = self.min_acceptance_rate
        else:
            record.next_pause = _FIRST_PAUSE

    def forget(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._records.pop(req_id, None)
