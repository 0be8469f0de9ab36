"""The worker's multimodal inputs: encoder outputs by item, the rows of them each step's
tokens take, and M-RoPE positions.

The scheduler decides which items each step encodes and when an output may be dropped
(core.multimodal.encoder_cache); this side follows: it encodes what `SchedulerOutput.
scheduled_encoder_inputs` names (items of one modality in one call), frees what
`free_encoder_mm_hashes` names, and for every token at a placeholder position hands the
row of its item's output, so a placeholder run split across steps (chunked prefill) takes
each row exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from core.multimodal.inputs import MultiModalFeature

if TYPE_CHECKING:
    from core.models.multimodal import SupportsMultiModal
    from core.worker.contract import SchedulerOutput
    from core.worker.input_batch import CachedRequestState

__all__ = ["MultiModalInputs", "mrope_step_positions"]


class MultiModalInputs:
    """The encoder outputs a worker holds, by item identifier."""

    def __init__(self, model: SupportsMultiModal, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.outputs: dict[str, torch.Tensor] = {}  # identifier -> [length, hidden]
        self.num_encoded = 0  # items encoded so far (shared items once)

    def update(self, so: SchedulerOutput, requests: Mapping[str, CachedRequestState]) -> None:
        """Drop the outputs the scheduler evicted, encode the items it scheduled."""
        for identifier in so.free_encoder_mm_hashes:
            self.outputs.pop(identifier, None)
        pending: dict[str, dict[str, MultiModalFeature]] = {}  # modality -> id -> feature
        for req_id, indices in so.scheduled_encoder_inputs.items():
            features = requests[req_id].mm_features
            for i in indices:
                feature = features[i]
                if feature.identifier not in self.outputs:
                    pending.setdefault(feature.modality, {})[feature.identifier] = feature
        for modality, by_id in pending.items():
            self._encode(modality, list(by_id.values()))

    def _encode(self, modality: str, features: list[MultiModalFeature]) -> None:
        items = [
            {name: t.to(self.device) for name, t in feature.tensors().items()}
            for feature in features
        ]
        outputs = self.model.embed_multimodal(modality, items)
        for feature, output in zip(features, outputs, strict=True):
            if output.shape[0] != feature.placeholder.length:
                raise RuntimeError(
                    f"{type(self.model).__name__}.embed_multimodal gave {output.shape[0]} "
                    f"embeddings for an item ({modality}) of {feature.placeholder.length} "
                    "placeholders"
                )
            self.outputs[feature.identifier] = output
        self.num_encoded += len(features)

    def merge(
        self,
        inputs_embeds: torch.Tensor,  # [T, hidden], the step's token embeddings
        states: Sequence[CachedRequestState],  # the step's requests, in token order
        starts: np.ndarray,  # [num_reqs] first position each computes
        query_start_loc: np.ndarray,  # [num_reqs + 1]
    ) -> torch.Tensor:
        """`inputs_embeds` with each placeholder position's row replaced by its item's."""
        indices: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        for i, state in enumerate(states):
            start = int(starts[i])
            end = start + int(query_start_loc[i + 1] - query_start_loc[i])
            for feature in state.mm_features:
                offset, length = feature.placeholder.offset, feature.placeholder.length
                if offset >= end:
                    break
                lo, hi = max(start, offset), min(end, offset + length)
                if lo >= hi:
                    continue
                first = int(query_start_loc[i]) + lo - start
                indices.append(torch.arange(first, first + hi - lo))
                rows.append(self.outputs[feature.identifier][lo - offset : hi - offset])
        if not rows:
            return inputs_embeds
        at = torch.cat(indices).to(self.device)
        inputs_embeds[at] = torch.cat(rows).to(inputs_embeds.dtype)
        return inputs_embeds


def mrope_step_positions(
    states: Sequence[CachedRequestState | None],  # by batch row
    req_rows: np.ndarray,  # [num_reqs] the step's batch rows
    rows: np.ndarray,  # [T] batch row of each token
    positions: np.ndarray,  # [T]
) -> torch.Tensor:
    """[3, T] M-RoPE positions of the step's tokens: a prompt position's from its
    request's table, a later position p at p + the request's delta in all three."""
    out = np.empty((3, len(positions)), dtype=np.int64)
    for row in req_rows:
        state = states[row]
        assert state is not None and state.mrope is not None  # set when it joined
        table, delta = state.mrope
        mask = rows == row
        pos = positions[mask]
        in_prompt = pos < table.shape[1]
        out[:, mask] = np.where(in_prompt, table[:, np.where(in_prompt, pos, 0)], pos + delta)
    return torch.from_numpy(out)
