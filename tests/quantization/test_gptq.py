"""The `gptq` method reads AutoGPTQ / GPTQModel checkpoints: they load to exactly the
weights they encode, the engine serves them like a float copy of those weights, and bad
settings or checkpoints fail naming what is wrong.

The checkpoints here are quantized and packed by the test's own loops, following AutoGPTQ's
published format (Quantizer.find_params' round-to-nearest per group; QuantLinear.pack:
int weights transposed to [in, out], 32 / bits of them per int32 along the inputs from
the least significant bits, zero points packed the same way along the outputs and stored
less one in the v1 format; act order as a g_idx assigning inputs to groups), not by core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from quantized_layers import assert_loads_dequantized
from safetensors.torch import load_file, save_file
from tp_checkpoint import write_tp_checkpoint

from core import LLM, SamplingParams
from core.model_loader import resolve_model
from core.models import build_model
from core.models.layers import MergedLinear
from core.quantization import LinearPartition, LinearSplit
from core.quantization.gptq import GPTQConfig, GPTQLinearMethod
from core.quantization.selector import build_quantization_config

pytest.importorskip("transformers")

# The projections reading the same input share one act order (GPTQ sorts by the same
# activations): q, k and v; gate and up.
INPUTS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "mlp", "up_proj": "mlp",
          "o_proj": "o", "down_proj": "down"}  # fmt: skip


@dataclass(frozen=True)
class Scheme:
    bits: int
    group_size: int
    sym: bool
    desc_act: bool
    checkpoint_format: str

    def __str__(self) -> str:
        sym = "sym" if self.sym else "asym"
        order = "-act-order" if self.desc_act else ""
        return f"{self.bits}bit-g{self.group_size}-{sym}{order}-{self.checkpoint_format}"

    def quantization_config(self) -> dict:
        return {
            "quant_method": "gptq",
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "checkpoint_format": self.checkpoint_format,
            "damp_percent": 0.01,  # settings of the quantizer, which a reader ignores
            "true_sequential": True,
            "static_groups": False,
            "lm_head": False,
        }


ACT_ORDER_ASYM = Scheme(4, 32, sym=False, desc_act=True, checkpoint_format="gptq")
SCHEMES = [
    Scheme(4, 32, sym=True, desc_act=False, checkpoint_format="gptq"),
    ACT_ORDER_ASYM,
    Scheme(4, -1, sym=False, desc_act=False, checkpoint_format="gptq_v2"),
    Scheme(8, 32, sym=False, desc_act=True, checkpoint_format="gptq_v2"),
    Scheme(8, -1, sym=True, desc_act=False, checkpoint_format="gptq"),
]


def make_g_idx(num_inputs: int, group: int, desc_act: bool, seed: int) -> torch.Tensor:
    """Input k's group: k // group, or in act order the groups of consecutive inputs of a
    random order (GPTQ quantizes columns in that order, a group every `group` of them)."""
    groups = torch.arange(num_inputs, dtype=torch.int32) // group
    if not desc_act:
        return groups
    g_idx = torch.empty_like(groups)
    g_idx[torch.randperm(num_inputs, generator=torch.Generator().manual_seed(seed))] = groups
    return g_idx


def gptq_quantize(w: torch.Tensor, g_idx: torch.Tensor, scheme: Scheme):
    """AutoGPTQ's round-to-nearest of W [out, in], group by group: (int weights [out, in],
    zero points [groups, out], float16 scales [groups, out])."""
    maxq = 2**scheme.bits - 1
    num_groups = int(g_idx.max()) + 1
    intweight = torch.empty(w.shape, dtype=torch.int64)
    zeros = torch.empty(num_groups, w.shape[0], dtype=torch.int64)
    scales = torch.empty(num_groups, w.shape[0], dtype=torch.float16)
    for g in range(num_groups):
        cols = (g_idx == g).nonzero().flatten()
        x = w[:, cols]
        xmin, xmax = x.amin(dim=1).clamp(max=0), x.amax(dim=1).clamp(min=0)
        if scheme.sym:
            xmax = torch.maximum(xmin.abs(), xmax)
            xmin = -xmax
        scale = ((xmax - xmin) / maxq).half()  # stored as float16: quantize with what is stored
        zero = torch.full_like(xmax, (maxq + 1) // 2) if scheme.sym else torch.round(-xmin / scale)
        zero = zero.clamp(0, maxq)
        q = torch.round(x / scale.float()[:, None]) + zero[:, None]
        intweight[:, cols] = q.clamp(0, maxq).long()
        zeros[g], scales[g] = zero.long(), scale
    return intweight, zeros, scales


def gptq_pack(intweight: torch.Tensor, zeros: torch.Tensor, scheme: Scheme):
    """(qweight [in * bits / 32, out], qzeros [groups, out * bits / 32]) as int32, packed
    word by word as AutoGPTQ's QuantLinear.pack does (uint32 words, value j of a word in
    bits j * bits onwards)."""
    bits, per_word = scheme.bits, 32 // scheme.bits
    values = intweight.T.numpy().astype(np.uint32)  # [in, out]
    qweight = np.zeros((values.shape[0] // per_word, values.shape[1]), dtype=np.uint32)
    for row in range(qweight.shape[0]):
        for j in range(per_word):
            qweight[row] |= values[row * per_word + j] << (bits * j)
    stored = zeros.numpy() - (1 if scheme.checkpoint_format == "gptq" else 0)
    assert stored.min() >= 0, "the v1 format cannot store a zero point of 0"
    stored = stored.astype(np.uint32)
    qzeros = np.zeros((stored.shape[0], stored.shape[1] // per_word), dtype=np.uint32)
    for col in range(qzeros.shape[1]):
        for j in range(per_word):
            qzeros[:, col] |= stored[:, col * per_word + j] << (bits * j)
    return torch.from_numpy(qweight.astype(np.int32)), torch.from_numpy(qzeros.astype(np.int32))


def write_gptq_checkpoint(
    directory: Path, scheme: Scheme, drop: tuple[str, ...] = (), **overrides: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The tiny llama of tp_checkpoint (hidden 64, MLP 128), its linear layers GPTQ-packed,
    other tensors float16, less the tensors named ending in `drop`; returns each linear's W
    as the test computes it, scale * (q - z) in float32, by HF module name."""
    write_tp_checkpoint(directory)
    tensors, expected, orders = {}, {}, {}
    for name, tensor in load_file(directory / "model.safetensors").items():
        module, _, proj = name.removesuffix(".weight").rpartition(".")
        if proj not in INPUTS:
            tensors[name] = tensor.half()
            continue
        group = scheme.group_size if scheme.group_size > 0 else tensor.shape[1]
        key = (module, INPUTS[proj])
        seed = len(orders)
        g_idx = orders.setdefault(key, make_g_idx(tensor.shape[1], group, scheme.desc_act, seed))
        intweight, zeros, scales = gptq_quantize(tensor.float(), g_idx, scheme)
        qweight, qzeros = gptq_pack(intweight, zeros, scheme)
        prefix = f"{module}.{proj}"
        tensors |= {f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros,
                    f"{prefix}.scales": scales, f"{prefix}.g_idx": g_idx.clone()}  # fmt: skip
        g = g_idx.long()
        expected[prefix] = scales.T[:, g].float() * (intweight - zeros.T[:, g]).float()
    tensors = {name: t for name, t in (tensors | overrides).items() if not name.endswith(drop)}
    save_file(tensors, directory / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    config["torch_dtype"] = "float16"
    config["quantization_config"] = scheme.quantization_config()
    (directory / "config.json").write_text(json.dumps(config))
    return expected


def load_gptq_model(directory: Path) -> torch.nn.Module:
    checkpoint = resolve_model(str(directory))
    return build_model(checkpoint, build_quantization_config("gptq", checkpoint.hf_config))


def generate(directory: Path, **overrides) -> list[list[int]]:
    llm = LLM(
        str(directory), dtype="float32", max_model_len=64, kv_cache_memory="1MiB", **overrides
    )
    prompts = [[(7 * i + 3 * j) % 250 + 3 for j in range(4 + 5 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    try:
        return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_gptq_packed_checkpoint_loads_to_its_dequantized_weights(tmp_path, scheme):
    expected = write_gptq_checkpoint(tmp_path, scheme)
    model = load_gptq_model(tmp_path)
    for module in assert_loads_dequantized(model, expected, GPTQLinearMethod):
        # act order permutes the inputs once, at load
        assert (module.input_order is not None) == scheme.desc_act, module.prefix


@pytest.mark.parametrize("scheme", [ACT_ORDER_ASYM, SCHEMES[3]], ids=str)
def test_gptq_checkpoint_serves_like_its_dequantized_float_copy(tmp_path, scheme):
    expected = write_gptq_checkpoint(tmp_path / "gptq", scheme)
    float_dir = write_tp_checkpoint(tmp_path / "float")
    weights = load_file(float_dir / "model.safetensors")
    for module, weight in expected.items():
        weights[f"{module}.weight"] = weight
    # The float copy holds exactly what the GPTQ copy stores: float16 norms and embeddings.
    save_file(
        {name: t.half().float() for name, t in weights.items()}, float_dir / "model.safetensors"
    )
    assert generate(tmp_path / "gptq") == generate(tmp_path / "float")


@pytest.mark.slow  # engines of two worker processes
@pytest.mark.parametrize(
    "scheme",
    # act order splits across ranks where there is one group: every rank sees all of it
    [SCHEMES[0], Scheme(8, -1, sym=True, desc_act=True, checkpoint_format="gptq_v2")],
    ids=str,
)
def test_gptq_weights_split_across_ranks_generate_what_one_worker_does(tmp_path, scheme):
    write_gptq_checkpoint(tmp_path, scheme)
    assert generate(tmp_path, tensor_parallel_size=2) == generate(tmp_path)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"group_size": 32}, "bits"),
        ({"bits": 3, "group_size": 32}, "bits"),
        ({"bits": 2, "group_size": 32}, "bits"),
        ({"bits": 4}, "group_size"),
        ({"bits": 4, "group_size": 48}, "group_size"),
        ({"bits": 8, "group_size": 0}, "group_size"),
        ({"bits": 4, "group_size": 32, "desc_act": "yes"}, "desc_act"),
        ({"bits": 4, "group_size": 32, "checkpoint_format": "marlin"}, "checkpoint_format"),
        ({"bits": 4, "group_size": 32, "lm_head": True}, "lm_head"),
        ({"bits": 4, "group_size": 32, "dynamic": {"-:.*mlp.*": {}}}, "dynamic"),
    ],
)
def test_unsupported_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        GPTQConfig.from_config({"quant_method": "gptq", **settings})


def test_group_size_that_does_not_divide_in_features_names_the_layer(tmp_path):
    write_gptq_checkpoint(tmp_path, SCHEMES[0])
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["group_size"] = 96  # a multiple of 32 that 64 is not
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="qkv_proj: group_size 96 does not divide in_features 64"):
        load_gptq_model(tmp_path)


def test_a_checkpoint_without_g_idx_fails_naming_it(tmp_path):
    write_gptq_checkpoint(tmp_path, ACT_ORDER_ASYM, drop=("g_idx",))
    with pytest.raises(
        ValueError, match=r"missing weights \['model\.layers\.0\.mlp\.down_proj\.g_idx'"
    ):
        load_gptq_model(tmp_path)


def test_fused_shards_quantized_in_different_orders_are_refused(tmp_path):
    other_order = make_g_idx(64, 32, desc_act=True, seed=99)
    write_gptq_checkpoint(
        tmp_path, ACT_ORDER_ASYM, **{"model.layers.0.self_attn.k_proj.g_idx": other_order}
    )
    with pytest.raises(
        ValueError, match=r"layers\.0\.self_attn\.[qkv]_proj\.g_idx': g_idx of shard \d differs"
    ):
        load_gptq_model(tmp_path)


def test_a_g_idx_with_uneven_groups_is_refused_naming_the_layer():
    config = GPTQConfig.from_config({"quant_method": "gptq", "bits": 8, "group_size": 32})
    layer = MergedLinear(64, [16, 16], quant_config=config, prefix="mlp.gate_up_proj")
    uneven = torch.zeros(64, dtype=torch.int32)  # every input in group 0, none in group 1
    for shard in (0, 1):
        layer.g_idx.weight_loader(layer.g_idx, uneven, shard)
    with pytest.raises(ValueError, match="^mlp.gate_up_proj: g_idx does not put 32 inputs in each"):
        layer.linear_method.process_weights_after_loading(layer)


def test_act_order_is_refused_across_the_ranks_of_a_row_parallel_layer():
    config = GPTQConfig.from_config(ACT_ORDER_ASYM.quantization_config())
    partition = LinearPartition(64, (64,), LinearSplit.ROW, tp_rank=0, tp_size=2)
    layer = torch.nn.Module()
    layer.prefix = "model.layers.0.self_attn.o_proj"
    with pytest.raises(ValueError, match="o_proj: desc_act .* 2 tensor-parallel ranks"):
        config.get_linear_method(layer.prefix).create_weights(
            layer, partition, False, torch.float32
        )


KIT_CONFIGS = [
    '{"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": true, "sym": false}',
    '{"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"}',
]


def test_the_conformance_kit_passes_for_gptq(tmp_path):
    """The kit's quantization kind, float32 cases (all dtypes: the conformance session)."""
    configs = [f"--core-conformance-quant-config={config}" for config in KIT_CONFIGS]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-k", "float32",
         "--core-conformance=quantization:gptq", *configs],
        cwd=tmp_path, env=os.environ, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout and "skipped" not in done.stdout
