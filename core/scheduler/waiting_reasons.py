"""Why a waiting request waits, the split of vLLM's num_requests_waiting_by_reason.

A waiting request waits either for capacity (a slot under max_num_seqs, token budget, KV
blocks: room in the batch would admit it) or is deferred: a transient constraint holds it
whatever the room. Deferred are the requests the scheduler's admission loop skips, keeping
their place while later ones go first: one whose external KV is still loading, one whose
grammar is still compiling, and one whose LoRA adapter needs a slot that the running
requests' adapters, max_loras of them already, do not leave.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.request import Request, RequestStatus
from core.structured_output.manager import StructuredOutputManager

__all__ = ["is_deferred", "num_deferred"]


def is_deferred(
    request: Request,
    running_adapters: set[int],
    max_loras: int,
    grammars: StructuredOutputManager | None,
) -> bool:
    """Whether room in the batch alone would not admit the waiting `request` now.

    `running_adapters` are the lora_int_ids of the running requests. A grammar that failed
    to compile is ready (the request is failed at its next admission), so not deferred.
    """
    if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        return True
    if request.status == RequestStatus.WAITING_FOR_GRAMMAR:
        if grammars is not None and not grammars.is_ready(request.request_id):
            return True
    lora = request.lora_request
    return (
        lora is not None
        and lora.lora_int_id not in running_adapters
        and len(running_adapters) >= max_loras
    )


def num_deferred(
    waiting: Iterable[Request],
    running_adapters: set[int],
    max_loras: int,
    grammars: StructuredOutputManager | None,
) -> int:
    """How many of `waiting` are deferred (`is_deferred`); the rest wait for capacity."""
    return sum(is_deferred(r, running_adapters, max_loras, grammars) for r in waiting)
