"""LoRAModelManager's caches: host LRU (max_cpu_loras) and slots (max_loras), exactly."""

from __future__ import annotations

import pytest
import torch
from core_lora.manager import LoRAModelManager

from core.config import LoRAConfig
from core.lora.request import LoRARequest
from core.model_loader import resolve_model
from core.models.registry import build_model
from core.testing.lora_adapters import AdapterSpec, write_adapter
from core.testing.tiny_checkpoint import reference_model, write_tiny_checkpoint

SPECS = [
    AdapterSpec(rank=2, alpha=4, targets=("q_proj",), seed=1),
    AdapterSpec(rank=4, alpha=4, targets=("down_proj", "up_proj"), seed=2),
    AdapterSpec(rank=1, alpha=1, targets=("o_proj", "k_proj"), seed=3),
    AdapterSpec(rank=3, alpha=2, targets=("v_proj",), seed=4),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("manager")
    base = reference_model()
    write_tiny_checkpoint(root / "base", base)
    deltas = {i: write_adapter(root / f"a{i}", base, spec) for i, spec in enumerate(SPECS, 1)}
    return {
        "root": root,
        "requests": {i: LoRARequest(f"a{i}", i, str(root / f"a{i}")) for i in range(1, 5)},
        "deltas": deltas,
    }


def manager(paths: dict, max_loras: int, max_cpu_loras: int) -> LoRAModelManager:
    model = build_model(resolve_model(str(paths["root"] / "base")))
    config = LoRAConfig(max_loras=max_loras, max_lora_rank=4, max_cpu_loras=max_cpu_loras)
    return LoRAModelManager(model, config, torch.device("cpu"), torch.float32)


def slot_rows(m: LoRAModelManager, slot: int) -> torch.Tensor:
    """Every wrapped layer's A rows of `slot`, concatenated (zero: an empty slot)."""
    rows = []
    for layer in m.layers.values():
        width = layer.linear_method.width
        rows.append(layer.lora_a[slot * width : (slot + 1) * width].flatten())
    return torch.cat(rows)


def test_host_cache_keeps_the_most_recently_used(paths) -> None:
    m, r = manager(paths, max_loras=1, max_cpu_loras=3), paths["requests"]
    assert [m.add_adapter(r[i]) for i in (1, 2, 3)] == [True, True, True]
    assert m.list_adapters() == [1, 2, 3]
    assert m.add_adapter(r[1]) is False  # a hit refreshes it
    assert m.list_adapters() == [2, 3, 1]
    m.add_adapter(r[4])  # full: the least recently used (2) goes
    assert m.list_adapters() == [3, 1, 4]
    assert m.remove_adapter(3) is True and m.remove_adapter(3) is False
    assert m.list_adapters() == [1, 4]


def test_slots_go_to_empty_ones_then_to_the_least_recently_activated_idle(paths) -> None:
    m, r = manager(paths, max_loras=2, max_cpu_loras=4), paths["requests"]
    assert m.activate({r[1]}) == {1: 0}
    assert m.activate({r[3]}) == {3: 1}
    assert m.slots == [1, 3]
    assert m.activate({r[4]}) == {4: 0}  # 1 was activated before 3
    assert m.slots == [4, 3]
    assert m.activate({r[3], r[1]}) == {1: 0, 3: 1}  # 3 keeps its slot, 1 takes idle 4's
    assert m.slots == [1, 3]
    assert m.list_adapters() == [4, 1, 3]  # reading from the host cache refreshes it too


def test_an_adapter_the_step_uses_is_never_evicted(paths) -> None:
    m, r = manager(paths, max_loras=2, max_cpu_loras=2), paths["requests"]
    m.activate({r[1], r[2]})
    before = slot_rows(m, 0).clone(), slot_rows(m, 1).clone()
    with pytest.raises(ValueError, match="max_loras"):
        m.activate({r[1], r[2], r[3]})
    # A step of 2 and 3: the host cache (2 entries) must drop 1, the one the step lacks.
    assert m.activate({r[2], r[3]}) == {2: 1, 3: 0}
    assert m.list_adapters() == [2, 3] and m.slots == [3, 2]
    assert torch.equal(slot_rows(m, 1), before[1])  # 2's weights untouched
    assert not torch.equal(slot_rows(m, 0), before[0])


def test_removing_an_active_adapter_empties_its_slot(paths) -> None:
    m, r = manager(paths, max_loras=2, max_cpu_loras=2), paths["requests"]
    m.activate({r[1], r[2]})
    assert slot_rows(m, 0).abs().sum() > 0
    m.remove_adapter(1)
    assert m.slots == [None, 2]
    assert slot_rows(m, 0).abs().sum() == 0
    assert m.activate({r[1]}) == {1: 0}  # read again from its path


def test_a_slot_holds_each_shard_at_its_place(paths) -> None:
    """Adapter 2 adapts up_proj (shard 1 of gate_up) and down_proj: its delta in slot 0 is
    scaling * B @ A at up's rows and zero at gate's."""
    m, r = manager(paths, max_loras=1, max_cpu_loras=1), paths["requests"]
    m.activate({r[2]})
    layer = m.layers["model.layers.1.mlp.gate_up_proj"]
    delta = layer.linear_method.delta_weight(layer, 0)
    a, b = paths["deltas"][2]["model.layers.1.mlp.up_proj"]
    inter = delta.shape[0] // 2
    assert delta[:inter].abs().sum() == 0
    torch.testing.assert_close(delta[inter:], SPECS[1].scaling * b @ a)
