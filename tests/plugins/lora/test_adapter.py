"""core_lora.adapter: PEFT adapters made by peft itself, mapped onto core's fused layers,
read and refused.

The base is core's tiny reference Llama (hidden 32, q 32, k/v 16 each, intermediate 64,
two layers); core's model of the same checkpoint is built on the meta device, as the
frontend builds it for `check_adapter`. Expected values come from the peft model that
wrote the adapter (its modules' lora_A / lora_B / scaling), never from the reader.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import core_lora.adapter as adapter_module
import peft
import pytest
import torch
from core_lora.adapter import LoRATarget, check_adapter, load_adapter, lora_targets
from safetensors.torch import load_file, save_file
from torch import nn

from core.config import LoRAConfig
from core.lora.request import LoRARequest
from core.model_loader import resolve_model
from core.models.arch_config import ArchConfig
from core.models.layers.linear import MergedLinear, RowParallelLinear
from core.models.registry import resolve_model_class
from core.testing.tiny_checkpoint import reference_model

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Where the tiny Llama's checkpoint modules live in core's model: (layer, shard).
LAYER_OF = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}
PREFIX = "base_model.model."
Q_A = f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoRATarget]:
    directory = tmp_path_factory.mktemp("tiny-llama")
    reference_model().save_pretrained(directory)
    arch = ArchConfig.from_hf(resolve_model(str(directory)).hf_config)
    with torch.device("meta"):
        model = resolve_model_class(arch.architectures)(arch, None, torch.float32)
    return lora_targets(model)


def make_adapter(directory: Path, **lora_config: Any) -> peft.PeftModel:
    """A peft adapter with random nonzero A and B on a fresh tiny Llama, saved in
    `directory`; returns the peft model (the reference)."""
    config = peft.LoraConfig(init_lora_weights=False, **lora_config)
    model = peft.get_peft_model(reference_model(), config)
    model.save_pretrained(directory)
    return model


def peft_modules(model: peft.PeftModel) -> dict[str, nn.Module]:
    """Checkpoint module name -> peft's LoRA layer for it."""
    return {
        name.removeprefix(PREFIX): module
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and "default" in module.lora_A
    }


def request_for(path: Path, name: str = "tiny") -> LoRARequest:
    return LoRARequest(name, 1, str(path))


def assert_matches_peft(
    model: peft.PeftModel, path: Path, targets: dict[str, LoRATarget], max_lora_rank: int = 16
) -> None:
    """load_adapter puts every module peft trained at its layer and shard, with peft's
    A and B * scaling."""
    loaded = load_adapter(
        request_for(path), targets, LoRAConfig(max_lora_rank=max_lora_rank), torch.float32
    )
    modules = peft_modules(model)
    for name, module in modules.items():
        layer_path, _, short = name.rpartition(".")
        layer, shard = LAYER_OF[short]
        weights = loaded.weights[f"{layer_path.rpartition('.')[0]}.{layer}"][shard]
        torch.testing.assert_close(weights.a, module.lora_A["default"].weight)
        expected_b = module.lora_B["default"].weight * module.scaling["default"]
        torch.testing.assert_close(weights.b, expected_b)
    assert sum(len(shards) for shards in loaded.weights.values()) == len(modules)
    assert loaded.rank == max(module.r["default"] for module in modules.values())


def test_lora_targets_name_fused_shards_by_checkpoint_module(
    targets: dict[str, LoRATarget],
) -> None:
    layer0 = "model.layers.0"
    expected = {
        "q_proj": LoRATarget(f"{layer0}.self_attn.qkv_proj", 0, 32, 32),
        "k_proj": LoRATarget(f"{layer0}.self_attn.qkv_proj", 1, 32, 16),
        "v_proj": LoRATarget(f"{layer0}.self_attn.qkv_proj", 2, 32, 16),
        "o_proj": LoRATarget(f"{layer0}.self_attn.o_proj", 0, 32, 32),
        "gate_proj": LoRATarget(f"{layer0}.mlp.gate_up_proj", 0, 32, 64),
        "up_proj": LoRATarget(f"{layer0}.mlp.gate_up_proj", 1, 32, 64),
        "down_proj": LoRATarget(f"{layer0}.mlp.down_proj", 0, 64, 32),
    }
    for short, target in expected.items():
        part = "mlp" if short in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        assert targets[f"{layer0}.{part}.{short}"] == target
    assert len(targets) == 2 * len(expected)


def test_lora_targets_without_stacked_params_skip_fused_layers() -> None:
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fused = MergedLinear(4, [3, 3], prefix="fused")
            self.out = RowParallelLinear(6, 4, prefix="out")

    with torch.device("meta"):
        model = Plain()
    assert lora_targets(model) == {"out": LoRATarget("out", 0, 6, 4)}


def test_load_adapter_matches_peft_on_every_fused_shard(
    tmp_path: Path, targets: dict[str, LoRATarget]
) -> None:
    model = make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=ALL_MODULES)
    assert len(peft_modules(model)) == 2 * len(ALL_MODULES)
    assert_matches_peft(model, tmp_path, targets)


def test_rslora_scales_b_by_alpha_over_sqrt_r(
    tmp_path: Path, targets: dict[str, LoRATarget]
) -> None:
    model = make_adapter(
        tmp_path, r=4, lora_alpha=8, use_rslora=True, target_modules=["k_proj", "up_proj"]
    )
    assert {m.scaling["default"] for m in peft_modules(model).values()} == {8 / math.sqrt(4)}
    assert_matches_peft(model, tmp_path, targets)


def test_rank_and_alpha_patterns_give_per_module_rank_and_scaling(
    tmp_path: Path, targets: dict[str, LoRATarget]
) -> None:
    model = make_adapter(
        tmp_path,
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2, r"model\.layers\.1\.self_attn\.q_proj": 8},
        alpha_pattern={"down_proj": 32},
    )
    ranks = {name: m.r["default"] for name, m in peft_modules(model).items()}
    assert ranks["model.layers.1.self_attn.q_proj"] == 8
    assert ranks["model.layers.0.self_attn.q_proj"] == 4
    assert ranks["model.layers.0.self_attn.v_proj"] == 2
    assert_matches_peft(model, tmp_path, targets)


def test_regex_target_modules_load(tmp_path: Path, targets: dict[str, LoRATarget]) -> None:
    model = make_adapter(
        tmp_path, r=2, lora_alpha=4, target_modules=r".*\.1\.(self_attn\.k_proj|mlp\.gate_proj)"
    )
    assert sorted(peft_modules(model)) == [
        "model.layers.1.mlp.gate_proj",
        "model.layers.1.self_attn.k_proj",
    ]
    assert_matches_peft(model, tmp_path, targets)


def test_load_adapter_casts_to_dtype_after_scaling(
    tmp_path: Path, targets: dict[str, LoRATarget]
) -> None:
    model = make_adapter(tmp_path, r=2, lora_alpha=6, target_modules=["o_proj"])
    module = peft_modules(model)["model.layers.0.self_attn.o_proj"]
    loaded = load_adapter(request_for(tmp_path), targets, LoRAConfig(), torch.bfloat16)
    weights = loaded.weights["model.layers.0.self_attn.o_proj"][0]
    assert weights.a.dtype == weights.b.dtype == torch.bfloat16
    expected_b = (module.lora_B["default"].weight * 3.0).to(torch.bfloat16)
    torch.testing.assert_close(weights.b, expected_b, rtol=0, atol=0)


def test_check_adapter_reads_no_tensor_data(
    tmp_path: Path, targets: dict[str, LoRATarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_adapter(tmp_path, r=4, lora_alpha=8, target_modules=ALL_MODULES)
    reads: list[str] = []
    real_safe_open = adapter_module.safe_open

    class CountingSafeOpen:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.handle = real_safe_open(*args, **kwargs)

        def __enter__(self) -> CountingSafeOpen:
            self.file = self.handle.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.__exit__(*exc)

        def keys(self) -> list[str]:
            return self.file.keys()

        def get_slice(self, name: str) -> Any:
            return self.file.get_slice(name)

        def get_tensor(self, name: str) -> torch.Tensor:
            reads.append(name)
            return self.file.get_tensor(name)

    monkeypatch.setattr(adapter_module, "safe_open", CountingSafeOpen)
    check_adapter(request_for(tmp_path), targets, LoRAConfig())
    assert reads == []
    load_adapter(request_for(tmp_path), targets, LoRAConfig(), torch.float32)
    assert len(reads) == 4 * len(ALL_MODULES)  # the spy sees reads: A and B of 14 modules


@pytest.fixture(scope="module")
def valid_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """r 4, alpha 8 on q_proj and down_proj, both layers."""
    directory = tmp_path_factory.mktemp("valid-adapter")
    make_adapter(directory, r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"])
    return directory


def edit_config(**changes: Any) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        config = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**config, **changes}))

    return edit


def edit_tensors(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        tensors = load_file(path / "adapter_model.safetensors")
        change(tensors)
        save_file(tensors, path / "adapter_model.safetensors")

    return edit


def delete(file: str) -> Callable[[Path], None]:
    return lambda path: (path / file).unlink()


def put(name: str, shape: list[int]) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda tensors: tensors.__setitem__(name, torch.ones(shape))


def put_value(name: str, value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    """Set one element of tensor `name` to `value`."""

    def change(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = value

    return change


INVALID = {
    "missing directory": (lambda path: shutil.rmtree(path), r"lora_path '.*' is not a directory"),
    "missing config": (delete("adapter_config.json"), r"lora_path .* no adapter_config\.json"),
    "missing weights": (
        delete("adapter_model.safetensors"),
        r"lora_path .* no adapter_model\.safetensors",
    ),
    "unreadable config": (
        lambda path: (path / "adapter_config.json").write_text("{not json"),
        r"adapter_config\.json cannot be read",
    ),
    "corrupt weights": (
        lambda path: (path / "adapter_model.safetensors").write_bytes(b"\x01\x02"),
        r"adapter_model\.safetensors cannot be read",
    ),
    "not lora": (edit_config(peft_type="IA3"), r"peft_type 'IA3' is not supported"),
    "embedding target": (
        edit_config(target_modules=["q_proj", "embed_tokens"]),
        r"target_modules names 'embed_tokens'.*supported: \['down_proj', 'gate_proj', "
        r"'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\]",
    ),
    "lm_head target": (edit_config(target_modules=["lm_head"]), r"target_modules names 'lm_head'"),
    "dora": (edit_config(use_dora=True), r"use_dora True is not supported"),
    "bias": (edit_config(bias="lora_only"), r"bias 'lora_only' is not supported"),
    "modules to save": (
        edit_config(modules_to_save=["lm_head"]),
        r"modules_to_save \['lm_head'\] is not supported",
    ),
    "fan in fan out": (edit_config(fan_in_fan_out=True), r"fan_in_fan_out True is not supported"),
    "missing r": (edit_config(r=None), r"r gives None"),
    # Python's json reads NaN and Infinity, as PEFT's loader does.
    "nan alpha": (edit_config(lora_alpha=math.nan), r"lora_alpha gives nan"),
    "infinite alpha": (edit_config(lora_alpha=math.inf), r"lora_alpha gives inf"),
    "nan alpha pattern": (edit_config(alpha_pattern={"q_proj": math.nan}), r"alpha_pattern"),
    "oversized config": (
        edit_config(padding="x" * adapter_module.MAX_CONFIG_BYTES),
        rf"adapter_config\.json is \d+ bytes, over {adapter_module.MAX_CONFIG_BYTES}",
    ),
    "deeply nested config": (
        lambda path: (path / "adapter_config.json").write_text(
            '{"r": 4, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
        ),
        r"adapter_config\.json cannot be read: adapter_config\.json is nested deeper",
    ),
    "config not utf-8": (
        lambda path: (path / "adapter_config.json").write_bytes(b'{"r": "\xff"}'),
        r"lora_path .* cannot be read: 'utf-8' codec",
    ),
    # Backtracks for far longer than the matching budget (a backreference defeats regex's
    # optimizations).
    "slow rank pattern": (
        edit_config(rank_pattern={r"(?:(\w)\1?|.)+\d{3}": 2}),
        r"rank_pattern keys take over 1\.0 s to match the model's modules",
    ),
    "r differs from tensors": (
        edit_config(r=8),
        r"r: tensor '.*\.lora_A\.weight' has rank 4, adapter_config\.json gives .* r=8",
    ),
    "rank pattern differs from tensors": (
        edit_config(rank_pattern={"q_proj": 2}),
        rf"r: tensor '{re.escape(Q_A)}' has rank 4, adapter_config\.json gives .* r=2",
    ),
    "lora embedding": (
        edit_tensors(put(f"{PREFIX}model.embed_tokens.lora_embedding_A", [4, 48])),
        r"tensor '.*embed_tokens\.lora_embedding_A': embedding LoRA is not supported",
    ),
    "lora_B bias": (
        edit_tensors(put(Q_B.replace(".weight", ".bias"), [32])),
        r"tensor '.*q_proj\.lora_B\.bias' is not a LoRA weight",
    ),
    "no tensors": (
        edit_tensors(lambda tensors: tensors.clear()),
        r"adapter_model\.safetensors holds no LoRA weights",
    ),
    "module without layer": (
        edit_tensors(
            lambda tensors: tensors.update(
                {f"{PREFIX}lm_head.lora_A.weight": torch.ones(4, 32)}
                | {f"{PREFIX}lm_head.lora_B.weight": torch.ones(48, 4)}
            )
        ),
        r"tensor 'base_model\.model\.lm_head\.lora_A\.weight': the model has no LoRA layer "
        r"for 'lm_head'",
    ),
    "A without B": (
        edit_tensors(lambda tensors: tensors.pop(Q_B)),
        rf"tensor '{re.escape(Q_A)}' has no lora_B",
    ),
    "B without A": (
        edit_tensors(lambda tensors: tensors.pop(Q_A)),
        rf"tensor '{re.escape(Q_B)}' has no lora_A",
    ),
    "A input size": (
        edit_tensors(put(Q_A, [4, 31])),
        rf"tensor '{re.escape(Q_A)}' has shape \[4, 31\], the model needs \[r, 32\]",
    ),
    "B output size": (
        edit_tensors(put(Q_B, [16, 4])),
        rf"tensor '{re.escape(Q_B)}' has shape \[16, 4\], the model needs \[32, 4\]",
    ),
    "A and B ranks differ": (
        edit_tensors(put(Q_B, [32, 5])),
        rf"tensor '{re.escape(Q_B)}' has shape \[32, 5\], the model needs \[32, 4\] "
        r"\(its lora_A has shape \[4, 32\]\)",
    ),
}


@pytest.mark.parametrize("reader", ["check_adapter", "load_adapter"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_adapter_is_refused_naming_the_field(
    case: str, reader: str, valid_adapter: Path, tmp_path: Path, targets: dict[str, LoRATarget]
) -> None:
    corrupt, message = INVALID[case]
    path = tmp_path / "adapter"
    shutil.copytree(valid_adapter, path)
    corrupt(path)
    request, config = request_for(path, "bad"), LoRAConfig()
    with pytest.raises(ValueError, match=f"^LoRA adapter 'bad': {message}"):
        if reader == "check_adapter":
            check_adapter(request, targets, config)
        else:
            load_adapter(request, targets, config, torch.float32)


def test_rank_above_max_lora_rank_is_refused(
    valid_adapter: Path, targets: dict[str, LoRATarget]
) -> None:
    with pytest.raises(ValueError, match=r"^LoRA adapter 'tiny': r 4 .*--max-lora-rank 2$"):
        check_adapter(request_for(valid_adapter), targets, LoRAConfig(max_lora_rank=2))
    check_adapter(request_for(valid_adapter), targets, LoRAConfig(max_lora_rank=4))


@pytest.mark.parametrize(
    ("case", "corrupt", "message"),
    [
        (
            "nan in A",
            edit_tensors(put_value(Q_A, math.nan)),
            rf"tensor '{re.escape(Q_A)}' has non-finite values in torch.float32",
        ),
        (
            "inf in B",
            edit_tensors(put_value(Q_B, math.inf)),
            rf"tensor '{re.escape(Q_B)}' has non-finite values once scaled by 2 in",
        ),
        # Finite as stored, but B x (1e300 / 4) overflows float32.
        (
            "absurd alpha",
            edit_config(lora_alpha=1e300),
            r"tensor '.*lora_B.weight' has non-finite values once scaled by 2.5e\+299",
        ),
    ],
)
def test_non_finite_weights_are_refused_at_load(
    case: str,
    corrupt: Callable[[Path], None],
    message: str,
    valid_adapter: Path,
    tmp_path: Path,
    targets: dict[str, LoRATarget],
) -> None:
    path = tmp_path / "adapter"
    shutil.copytree(valid_adapter, path)
    corrupt(path)
    with pytest.raises(ValueError, match=f"^LoRA adapter 'bad': {message}"):
        load_adapter(request_for(path, "bad"), targets, LoRAConfig(), torch.float32)


def test_a_lora_path_too_long_for_the_file_system_is_refused(
    targets: dict[str, LoRATarget],
) -> None:
    request = request_for(Path("/tmp/" + "a" * 5000), "long")
    with pytest.raises(ValueError, match=r"^LoRA adapter 'long': lora_path '/tmp/a+'\.\.\. "):
        check_adapter(request, targets, LoRAConfig())
