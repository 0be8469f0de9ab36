"""Memory budget -> number of blocks, the default budget, and the max_model_len check."""

from __future__ import annotations

import pytest
import torch

from core.kv_cache.budget import (
    check_max_model_len_fits,
    default_kv_cache_budget,
    format_bytes,
    num_blocks_for_budget,
)
from core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec
from core.platforms.cpu import CpuPlatform
from core.platforms.interface import MemoryInfo

GIB = 1 << 30


def full(num_kv_heads: int = 1) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=4, num_kv_heads=num_kv_heads, head_size=2, dtype=torch.float32
    )


# One head of size 2, K and V, float32, 4 tokens: 1 * (2 + 2) * 4 bytes * 4 = 64 bytes.
TWO_LAYERS = {"layers.0.attn": full(), "layers.1.attn": full()}


def test_num_blocks_divides_the_budget_by_the_bytes_of_one_block_in_every_layer():
    assert num_blocks_for_budget(TWO_LAYERS, 1000) == 1000 // 128 == 7
    mixed = {
        "layers.0.attn": full(),
        "layers.1.swa": SlidingWindowSpec(
            block_size=4, num_kv_heads=2, head_size=2, dtype=torch.float32, sliding_window=8
        ),
    }
    assert num_blocks_for_budget(mixed, 1000) == 1000 // (64 + 128) == 5


def test_num_blocks_rejects_empty_specs_and_budgets():
    with pytest.raises(ValueError, match="no KV-cache layers"):
        num_blocks_for_budget({}, 1000)
    with pytest.raises(ValueError, match="budget_bytes must be >= 1"):
        num_blocks_for_budget(TWO_LAYERS, 0)


def test_a_budget_that_holds_one_max_length_request_passes():
    # 7 blocks, one of them the null block: 6 * 4 = 24 tokens.
    check_max_model_len_fits(TWO_LAYERS, 7, 24, 1000)


def test_a_budget_too_small_for_max_model_len_names_both_fixes():
    expected = (
        "KV cache budget 1000 B fits 6 blocks = 24 tokens, but max_model_len is 25; "
        "raise --kv-cache-memory or lower --max-model-len"
    )
    with pytest.raises(ValueError) as error:
        check_max_model_len_fits(TWO_LAYERS, 7, 25, 1000)
    assert str(error.value) == expected


class FakeCpu(CpuPlatform):
    def __init__(self, available: int) -> None:
        super().__init__()
        self.available = available

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(total_bytes=2 * self.available, available_bytes=self.available)


class FakeAccelerator(FakeCpu):
    name = "acme"
    device_type = "acme"


def test_cpu_default_budget_is_a_quarter_of_available_ram_up_to_4_gib():
    assert default_kv_cache_budget(FakeCpu(8 * GIB)) == 2 * GIB
    assert default_kv_cache_budget(FakeCpu(64 * GIB)) == 4 * GIB


def test_accelerator_default_budget_is_most_of_its_available_memory():
    assert default_kv_cache_budget(FakeAccelerator(10 * GIB)) == int(10 * GIB * 0.8)


def test_bytes_are_formatted_in_the_largest_binary_unit():
    assert [format_bytes(n) for n in (512, 1536, 3 << 20, 3 * GIB // 2)] == [
        "512 B",
        "1.50 KiB",
        "3.00 MiB",
        "1.50 GiB",
    ]
