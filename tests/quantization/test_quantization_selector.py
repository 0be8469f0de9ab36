"""--quantization against how the checkpoint stores its weights: what runs, what is refused."""

from __future__ import annotations

import pytest

from core.quantization.selector import StoredQuantization, resolve_quantization

FLOAT = StoredQuantization()
AWQ = StoredQuantization(method="awq")
GGUF = StoredQuantization(method="gguf", dequantizable=True)


@pytest.mark.parametrize(
    ("requested", "stored", "runs"),
    [
        (None, FLOAT, None),
        (None, AWQ, "awq"),  # a quantized checkpoint runs with its method
        (None, GGUF, None),  # GGUF dequantizes unless asked to keep its blocks
        ("gguf", GGUF, "gguf"),
        ("none", GGUF, None),
        ("none", FLOAT, None),
        ("awq", AWQ, "awq"),
    ],
)
def test_the_method_that_runs(requested, stored, runs):
    assert resolve_quantization(requested, stored) == runs


@pytest.mark.parametrize(
    ("requested", "stored", "runs"),
    [(None, GGUF, "gguf"), ("none", GGUF, None), (None, FLOAT, None), (None, AWQ, "awq")],
)
def test_where_blocks_pay_off_gguf_keeps_them_unless_told_otherwise(requested, stored, runs):
    assert resolve_quantization(requested, stored, keep_blocks=True) == runs


def test_blocks_are_kept_wherever_a_kernel_serves_quant_linear(monkeypatch):
    from core.quantization import selector

    served = {"quant_linear": {"cpu": "some-kernels"}}
    monkeypatch.setattr("core.ops.provider", lambda op, device: served[op].get(device))
    assert selector.keeps_blocks("cpu")
    assert not selector.keeps_blocks("cuda")  # the reference only: it dequantizes each call


@pytest.mark.parametrize(
    ("requested", "stored", "message"),
    [
        ("awq", GGUF, "--quantization awq: the checkpoint is gguf-quantized"),
        ("gguf", FLOAT, r"not quantized \(float weights\); make a checkpoint with `core quantize"),
        ("none", AWQ, "--quantization none: the checkpoint's weights are awq-quantized"),
        ("gguf", AWQ, "--quantization gguf: the checkpoint is awq-quantized"),
    ],
)
def test_mismatches_are_refused_naming_the_flag(requested, stored, message):
    with pytest.raises(ValueError, match=message):
        resolve_quantization(requested, stored)


def test_the_engine_config_holds_the_method_that_runs():
    from core.engine_args import EngineArgs
    from core.platforms.cpu import CpuPlatform

    config = EngineArgs().create_engine_config(CpuPlatform(), stored_quantization=AWQ)
    assert config.model.quantization == "awq"
    config = EngineArgs(quantization="none").create_engine_config(
        CpuPlatform(), stored_quantization=GGUF
    )
    assert config.model.quantization is None
    with pytest.raises(ValueError, match="--quantization awq: the checkpoint is gguf-quantized"):
        EngineArgs(quantization="awq").create_engine_config(CpuPlatform(), stored_quantization=GGUF)
