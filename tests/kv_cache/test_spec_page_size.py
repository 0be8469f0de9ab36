"""page_size_bytes of each spec kind, against numbers worked out by hand."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from core.kv_cache.spec import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)


def test_full_attention_stores_k_and_v_per_token():
    # 16 tokens x 4 KV heads x (64 K + 64 V) x 2 bytes (fp16) = 16,384
    spec = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.float16)
    assert spec.page_size_bytes == 16_384


def test_distinct_value_head_size():
    # 4 tokens x 1 head x (2 K + 6 V) x 4 bytes = 128
    spec = FullAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=2, head_size_v=6, dtype=torch.float32
    )
    assert spec.page_size_bytes == 128


def test_sliding_window_page_equals_full_attention_page():
    # 32 tokens x 8 heads x (128 + 128) x 2 bytes (bf16) = 131,072
    spec = SlidingWindowSpec(
        block_size=32, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, sliding_window=4096
    )
    assert spec.page_size_bytes == 131_072


def test_mla_stores_one_latent_and_pads_to_alignment():
    # 16 tokens x 1 latent of 576 x 2 bytes = 18,432 -> next multiple of 4,096 = 20,480
    spec = MLAAttentionSpec(block_size=16, head_size=576, dtype=torch.bfloat16, alignment=4096)
    assert spec.page_size_bytes == 20_480
    unaligned = MLAAttentionSpec(block_size=16, head_size=576, dtype=torch.bfloat16)
    assert unaligned.page_size_bytes == 18_432


def test_mla_refuses_separate_values():
    with pytest.raises(ValueError, match="one latent"):
        MLAAttentionSpec(block_size=16, head_size=576, head_size_v=64, dtype=torch.bfloat16)


def test_tokens_per_state_divides_the_block():
    # 2 tokens per state: 8 states x 1 head x (2 + 2) x 4 bytes = 128
    coarse = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=2, dtype=torch.float32, tokens_per_state=2
    )
    assert coarse.page_size_bytes == 128
    # a token with 2 states: 32 states x 16 bytes = 512
    fine = FullAttentionSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=2,
        dtype=torch.float32,
        tokens_per_state=Fraction(1, 2),
    )
    assert fine.page_size_bytes == 512
    with pytest.raises(ValueError, match="not a multiple"):
        _ = FullAttentionSpec(
            block_size=5, num_kv_heads=1, head_size=2, dtype=torch.float32, tokens_per_state=2
        ).page_size_bytes


def test_mamba_holds_one_state_per_block():
    # conv state 3x8 fp32 (96 bytes) + ssm state 2x4x4 fp16 (64 bytes) = 160, whatever the block
    spec = MambaSpec(
        block_size=512, shapes=((3, 8), (2, 4, 4)), dtypes=(torch.float32, torch.float16)
    )
    assert spec.page_size_bytes == 160


def test_specs_are_frozen():
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=2, dtype=torch.float32)
    with pytest.raises(AttributeError):
        spec.block_size = 32
