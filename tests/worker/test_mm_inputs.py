"""The worker's multimodal inputs: items encoded once and freed when told, each
placeholder position taking its own row of its item's output however the run is split
across steps, and M-RoPE positions continuing past the prompt by the request's delta."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.multimodal.inputs import MultiModalFeature, PlaceholderRange, TensorData
from core.worker.contract import SchedulerOutput
from core.worker.input_batch import CachedRequestState
from core.worker.mm_inputs import MultiModalInputs, mrope_step_positions

HIDDEN = 3


class CountingEncoder:
    """embed_multimodal gives row j of an item the value seed * 100 + j in every column."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed_multimodal(self, modality, items):
        self.calls.append(len(items))
        return [
            (item["seed"].item() * 100 + torch.arange(int(item["n"].item())))[:, None]
            .expand(-1, HIDDEN)
            .float()
            for item in items
        ]


def feature(identifier: str, seed: int, offset: int, length: int) -> MultiModalFeature:
    data = {
        "seed": TensorData.from_tensor(torch.tensor(seed)),
        "n": TensorData.from_tensor(torch.tensor(length)),
    }
    return MultiModalFeature("image", identifier, PlaceholderRange(offset, length), data)


def state(req_id: str, features: list[MultiModalFeature], prompt_len: int = 20):
    return CachedRequestState(
        req_id=req_id, prompt_token_ids=[0] * prompt_len, sampling_params=None, generator=None,
        block_ids=([],), num_computed_tokens=0, mm_features=features,
    )  # fmt: skip


def test_tensor_data_round_trips_dtype_shape_and_values():
    tensor = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    back = TensorData.from_tensor(tensor).to_tensor()
    assert back.dtype == torch.bfloat16 and torch.equal(back, tensor)


def test_shared_items_are_encoded_once_and_dropped_when_the_scheduler_frees_them():
    encoder = CountingEncoder()
    mm = MultiModalInputs(encoder, torch.device("cpu"))
    same = feature("x", 1, 2, 4)
    requests = {"a": state("a", [same]), "b": state("b", [same])}
    mm.update(SchedulerOutput(scheduled_encoder_inputs={"a": [0], "b": [0]}), requests)
    assert encoder.calls == [1] and mm.num_encoded == 1
    mm.update(SchedulerOutput(free_encoder_mm_hashes=["x"]), requests)
    assert "x" not in mm.outputs


def test_a_run_split_across_steps_takes_each_row_once_in_order():
    mm = MultiModalInputs(CountingEncoder(), torch.device("cpu"))
    features = [feature("x", 1, 2, 5), feature("y", 2, 8, 3)]
    requests = {"r": state("r", features)}
    mm.update(SchedulerOutput(scheduled_encoder_inputs={"r": [0, 1]}), requests)
    merged = []
    for start, count in ((0, 4), (4, 5), (9, 3)):  # splits x after 2 rows and y after 1
        embeds = torch.full((count, HIDDEN), -1.0)
        out = mm.merge(embeds, [requests["r"]], np.array([start]), np.array([0, count]))
        merged.extend(out[:, 0].tolist())
    assert merged == [-1, -1, 100, 101, 102, 103, 104, -1, 200, 201, 202, -1]


def test_mrope_positions_come_from_the_table_in_the_prompt_and_the_delta_after():
    table = np.array([[0, 1, 1, 1, 3], [0, 1, 1, 2, 3], [0, 1, 2, 1, 3]])
    request = state("r", [], prompt_len=5)
    request.mrope = (table, -1)
    rows = np.array([0, 0, 0])
    positions = np.array([3, 4, 5])  # the prompt's last two, then the first generated
    got = mrope_step_positions([request], np.array([0]), rows, positions)
    assert got.tolist() == [[1, 3, 4], [2, 3, 4], [1, 3, 4]]


def test_an_output_of_the_wrong_length_is_an_error():
    mm = MultiModalInputs(CountingEncoder(), torch.device("cpu"))
    bad = MultiModalFeature("image", "z", PlaceholderRange(0, 5), feature("z", 1, 0, 4).data)
    with pytest.raises(RuntimeError, match=r"4 embeddings for an item \(image\) of 5 placeholders"):
        mm.update(SchedulerOutput(scheduled_encoder_inputs={"r": [0]}), {"r": state("r", [bad])})
