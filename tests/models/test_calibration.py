"""Running a core model on its own (core.models.calibration): linear inputs and perplexity,
checked against transformers on the tiny random-weight Llama."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from core.model_loader import load_safetensors_checkpoint
from core.models import build_model
from core.models.calibration import perplexity, record_linear_inputs
from core.testing.tiny_checkpoint import VOCAB, reference_model, write_tiny_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, nn.Module]:
    """(core model, the same weights in transformers)."""
    reference = reference_model()
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), reference)
    return build_model(load_safetensors_checkpoint(Path(directory))), reference


def _token_ids(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, len(VOCAB), (count,), generator=torch.Generator().manual_seed(seed))


def _reference_perplexity(reference: nn.Module, ids: torch.Tensor, window: int) -> float:
    """exp of transformers' mean loss over all windows, weighted by predicted tokens."""
    total, count = 0.0, 0
    for chunk in ids.split(window):
        if len(chunk) > 1:
            with torch.no_grad():
                loss = reference(chunk[None], labels=chunk[None]).loss.item()
            total += loss * (len(chunk) - 1)
            count += len(chunk) - 1
    return math.exp(total / count)


@pytest.mark.parametrize("length,window", [(40, 64), (50, 16)], ids=["one-window", "windows"])
def test_perplexity_matches_transformers_loss(models, length: int, window: int) -> None:
    model, reference = models
    ids = _token_ids(length, seed=length)
    want = _reference_perplexity(reference, ids, window)
    got = perplexity(model, ids.tolist(), window)
    assert got == pytest.approx(want, rel=1e-4)


def test_perplexity_rejects_a_window_under_two_tokens(models) -> None:
    with pytest.raises(ValueError, match="window"):
        perplexity(models[0], [1, 2, 3], 1)


def test_linear_inputs_are_what_transformers_projections_receive(models) -> None:
    model, reference = models
    sequences = [_token_ids(9, seed=1), _token_ids(6, seed=2)]
    # core's fused projection reads the input of each transformers projection it fuses.
    pairs = {
        "self_attn.qkv_proj": "self_attn.q_proj",
        "self_attn.o_proj": "self_attn.o_proj",
        "mlp.gate_up_proj": "mlp.gate_proj",
        "mlp.down_proj": "mlp.down_proj",
    }
    seen: dict[str, list[torch.Tensor]] = {}
    handles = [
        reference.get_submodule(f"model.layers.{i}.{hf}").register_forward_pre_hook(
            lambda _, args, key=f"model.layers.{i}.{core}": seen.setdefault(key, []).append(
                args[0][0].clone()
            )
        )
        for i in range(2)
        for core, hf in pairs.items()
    ]
    with torch.no_grad():
        for ids in sequences:
            reference(ids[None])
    for handle in handles:
        handle.remove()

    recorded = record_linear_inputs(model, sequences)

    assert set(recorded) == set(seen)
    for prefix, rows in seen.items():
        want = torch.cat(rows)
        assert recorded[prefix].shape == want.shape == (15, want.shape[1])
        # core's parity rule with transformers: 1e-4 of the values' scale
        scale = want.abs().max().item()
        torch.testing.assert_close(recorded[prefix], want, rtol=0, atol=1e-4 * scale)
