"""Memory budget -> number of blocks, the default and profiled budgets, and the
max_model_len check."""

from __future__ import annotations

import pytest
import torch

from core.kv_cache.budget import (
    MemoryProfile,
    check_max_model_len_fits,
    default_kv_cache_budget,
    format_bytes,
    num_blocks_for_budget,
    profiled_kv_cache_budget,
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


def test_profiled_budget_is_the_utilization_share_minus_the_peak_on_the_fullest_rank():
    # 0.5 x 8 GiB = 4 GiB; peaks of 1 and 3 GiB leave 3 and 1 GiB: every rank gets 1 GiB.
    ranks = [MemoryProfile(8 * GIB, 8 * GIB, 1 * GIB), MemoryProfile(8 * GIB, 8 * GIB, 3 * GIB)]
    assert profiled_kv_cache_budget(ranks, 0.5) == 1 * GIB
    assert profiled_kv_cache_budget(ranks[:1], 0.5) == 3 * GIB


def test_a_share_the_peak_fills_is_refused_with_the_numbers():
    ranks = [MemoryProfile(8 * GIB, 8 * GIB, 1 * GIB), MemoryProfile(8 * GIB, 8 * GIB, 4 * GIB)]
    with pytest.raises(ValueError) as error:
        profiled_kv_cache_budget(ranks, 0.5)
    assert str(error.value) == (
        "--gpu-memory-utilization 0.5 x 8.00 GiB = 4.00 GiB on rank 1 leaves no KV cache: "
        "the model's peak without it is 4.00 GiB (weights, activations of the largest "
        "batch); raise --gpu-memory-utilization or lower --max-num-batched-tokens"
    )


def test_a_share_larger_than_what_was_free_at_start_is_refused():
    busy = MemoryProfile(total_bytes=8 * GIB, free_at_start_bytes=6 * GIB, peak_bytes=1 * GIB)
    assert profiled_kv_cache_budget([busy], 0.75) == 5 * GIB  # 6 GiB asked, 6 GiB free
    with pytest.raises(ValueError) as error:
        profiled_kv_cache_budget([busy], 0.9)
    assert str(error.value) == (
        "--gpu-memory-utilization 0.9 x 8.00 GiB = 7.20 GiB on rank 0, but only 6.00 GiB was "
        "free when its worker started (other processes hold the rest); lower "
        "--gpu-memory-utilization or free the device"
    )
