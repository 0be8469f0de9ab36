"""Conformance of an attention backend (`--core-conformance=attention:NAME`).

- It equals the reference backend (`torch_ref`, float32) on paged batches: mixed prefill
  chunks (fresh and on cached context) and decodes, GQA ratios 1/2/4, sliding windows,
  contexts at block edges, shuffled block tables, both KV-cache layouts; for each declared
  dtype and head size (16 and 64 when it declares any), at 1e-5 of the output's scale in
  float32 and 2e-2 in 16-bit types; with attention-score soft-capping too when it
  declares `logits_soft_cap`; with each FP8 KV-cache dtype it declares, against the
  reference's FP8 cache. Its stored K/V equal the reference's when it uses
  the reference's cache shape, and it never writes outside its own blocks.
- `supports_combination` returns None or a reason for each declared combination (a
  reason skips the combination: the backend cannot serve it on this machine), and a
  reason, without raising, for a dtype, head size, block size, KV-cache dtype,
  attention type or soft-capping it does not declare.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from core.attention.interface import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionRequirements,
    AttentionType,
)
from core.testing.attention_batches import AttentionCase
from core.testing.attention_run import run_case
from core.testing.plugin import targets_of

SAMPLE_HEAD_SIZES = (16, 64)  # when a backend accepts any head size
DEFAULT_BLOCK_SIZE = 16
MIN_BLOCK_SIZE = 4  # the schedules need room for lengths b - 2 .. b + 1
NUM_KV_HEADS = 2
# Random scores of the cases have a standard deviation of about 1: a cap of 1 bends most.
SOFT_CAP = 1.0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "attention")
    if "case" in metafunc.fixturenames:
        params = [
            pytest.param(t.value, case, id=f"{t.id}-{case.id}")
            for t in targets
            for case in attention_cases(t.value.capabilities)
        ]
        metafunc.parametrize(("backend", "case"), params)
    elif "undeclared" in metafunc.fixturenames:
        params = [
            pytest.param(t.value, req, id=f"{t.id}-{name}")
            for t in targets
            for name, req in undeclared_requirements(t.value.capabilities).items()
        ]
        metafunc.parametrize(("backend", "undeclared"), params)
    else:
        metafunc.parametrize("backend", [pytest.param(t.value, id=t.id) for t in targets])


def test_matches_reference(
    backend: type[AttentionBackend], case: AttentionCase, core_conformance_device: torch.device
) -> None:
    req = requirements(case)
    reason = backend.supports_combination(req)
    if reason is not None:
        pytest.skip(f"refuses {req} here: {reason}")
    run_case(backend, case, core_conformance_device)


def test_declared_combinations_are_served_or_refused_with_a_reason(
    backend: type[AttentionBackend],
) -> None:
    refused = {}
    for req in declared_requirements(backend.capabilities):
        reason = backend.supports_combination(req)
        if reason is not None:
            assert isinstance(reason, str) and reason, f"{req}: returned {reason!r}, not a reason"
            refused[str(req)] = reason
    if refused:
        pytest.skip(f"refuses declared combinations on this machine: {refused}")


def test_undeclared_combination_is_refused_with_a_reason(
    backend: type[AttentionBackend], undeclared: AttentionRequirements
) -> None:
    reason = backend.supports_combination(undeclared)
    assert isinstance(reason, str) and reason, f"{undeclared}: returned {reason!r}, not a reason"


def requirements(case: AttentionCase) -> AttentionRequirements:
    return AttentionRequirements(
        case.dtype, case.head_size, case.block_size, case.kv_cache_dtype,
        logits_soft_cap=case.logits_soft_cap is not None,
    )  # fmt: skip


def attention_cases(caps: AttentionCapabilities) -> list[AttentionCase]:
    """Every declared dtype x head size on the mixed schedule; the other variations
    (GQA, window, block edges, layout, other block sizes) at one head size per dtype."""
    head_sizes = _head_sizes(caps)
    block_sizes = _block_sizes(caps)
    cases = []
    for dtype in sorted(caps.dtypes, key=str):
        base = AttentionCase(
            dtype=dtype,
            head_size=64 if 64 in head_sizes else head_sizes[0],
            num_kv_heads=NUM_KV_HEADS,
            gqa_ratio=2,
            block_size=block_sizes[0],
            sliding_window=None,
            schedule="mixed",
        )
        cases += [replace(base, head_size=size) for size in head_sizes]
        cases += [
            replace(base, gqa_ratio=1),
            replace(base, gqa_ratio=4),
            replace(base, schedule="block-edges"),
            replace(base, sliding_window=3),
            replace(base, sliding_window=base.block_size + 3),
            replace(base, layout="block_outermost"),
        ]
        cases += [replace(base, block_size=size) for size in block_sizes[1:]]
        if caps.logits_soft_cap:
            capped = replace(base, logits_soft_cap=SOFT_CAP)
            cases += [capped, replace(capped, sliding_window=3, schedule="block-edges")]
        for kv_dtype in sorted(caps.kv_cache_dtypes - {"auto"}):
            fp8 = replace(base, kv_cache_dtype=kv_dtype)
            cases += [fp8, replace(fp8, sliding_window=3, layout="block_outermost")]
    return cases


def declared_requirements(caps: AttentionCapabilities) -> list[AttentionRequirements]:
    return [
        AttentionRequirements(dtype, head_size, block_size, kv_dtype, attn_type, soft_cap)
        for dtype, head_size, block_size, kv_dtype, attn_type, soft_cap in itertools.product(
            sorted(caps.dtypes, key=str),
            _head_sizes(caps),
            _block_sizes(caps),
            sorted(caps.kv_cache_dtypes),
            sorted(caps.attention_types),
            (False, True) if caps.logits_soft_cap else (False,),
        )
    ]


def undeclared_requirements(caps: AttentionCapabilities) -> dict[str, AttentionRequirements]:
    """One requirement per capability field, outside what the backend declares."""
    base = declared_requirements(caps)[0]
    found: dict[str, AttentionRequirements] = {}
    candidates = (torch.float64, torch.float16, torch.bfloat16, torch.float32)
    dtype = next((d for d in candidates if d not in caps.dtypes), None)
    if dtype is not None:
        found[f"dtype-{str(dtype).removeprefix('torch.')}"] = replace(base, dtype=dtype)
    if caps.head_sizes is not None:
        size = 2 * max(caps.head_sizes)
        found[f"head-size-{size}"] = replace(base, head_size=size)
    if caps.block_sizes is not None:
        size = 2 * max(caps.block_sizes)
        found[f"block-size-{size}"] = replace(base, block_size=size)
    kv_dtype = next(
        (d for d in ("fp8_e4m3", "fp8_e5m2", "int8") if d not in caps.kv_cache_dtypes), None
    )
    if kv_dtype is not None:
        found[f"kv-cache-dtype-{kv_dtype}"] = replace(base, kv_cache_dtype=kv_dtype)
    attn_type = next((t for t in AttentionType if t not in caps.attention_types), None)
    if attn_type is not None:
        found[f"attention-type-{attn_type.value}"] = replace(base, attn_type=attn_type)
    if not caps.logits_soft_cap:
        found["logits-soft-cap"] = replace(base, logits_soft_cap=True)
    return found


def _head_sizes(caps: AttentionCapabilities) -> list[int]:
    return sorted(caps.head_sizes) if caps.head_sizes is not None else list(SAMPLE_HEAD_SIZES)


def _block_sizes(caps: AttentionCapabilities) -> list[int]:
    """Block sizes to run, the default first: 16 (or the smallest declared) and one more."""
    if caps.block_sizes is None:
        return [DEFAULT_BLOCK_SIZE, MIN_BLOCK_SIZE]
    usable = sorted(size for size in caps.block_sizes if size >= MIN_BLOCK_SIZE)
    first = DEFAULT_BLOCK_SIZE if DEFAULT_BLOCK_SIZE in usable else usable[0]
    return [first] + [size for size in usable if size != first][:1]
