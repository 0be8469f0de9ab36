"""Running a backend and the reference on the same paged batches, and comparing them.

Both backends go through the public interface only (get_kv_cache_shape, the builder, the
impl's forward), each with its own KV cache allocated the way the worker allocates it
(a view into a KVCacheTensor shared with a neighbouring layer, sized by the layer's
KVCacheSpec). Each step's K/V are written by each backend's own forward, so later steps
read back what the backend itself stored. The reference is `torch_ref` in float32 on the
CPU, fed the same values, with the case's KV-cache dtype: an FP8 case compares two FP8
caches (same scales, powers of two so that any backend's division is exact), not FP8
against float.
"""

from __future__ import annotations

import math
from typing import NoReturn

import pytest
import torch

from core.attention.backends.torch_ref import TorchRefBackend
from core.attention.interface import AttentionBackend
from core.attention.kv_cache_dtype import KVCacheScales, kv_cache_torch_dtype
from core.kv_cache.layout import KVCacheTensor, create_kv_cache_view
from core.kv_cache.spec import AttentionSpec, FullAttentionSpec, SlidingWindowSpec
from core.testing.attention_batches import AttentionCase, BatchPlan, Step, to_device

LAYER = "model.layers.1.self_attn.attn"
NEIGHBOUR = "model.layers.0.self_attn.attn"  # shares the buffer; must stay untouched

TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}
"""Max |output - reference| allowed, relative to the reference output's max |value|."""
KV_SCALES = KVCacheScales(k_scale=0.5, v_scale=2.0)  # an FP8 case's, for both backends


def kv_cache_spec(case: AttentionCase, dtype: torch.dtype) -> AttentionSpec:
    """The spec the worker reports for a layer of this case (as Attention.kv_cache_spec)."""
    common = dict(
        block_size=case.block_size,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        dtype=dtype,
    )
    if case.sliding_window is not None:
        return SlidingWindowSpec(sliding_window=case.sliding_window, **common)
    return FullAttentionSpec(**common)


class PagedAttentionRun:
    """One backend's layer: its KV cache, metadata builder and impl, stepped by the plan."""

    def __init__(
        self,
        backend: type[AttentionBackend],
        case: AttentionCase,
        num_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.device = device
        self.dtype = dtype
        cache_dtype = kv_cache_torch_dtype(case.kv_cache_dtype, dtype)
        spec = kv_cache_spec(case, cache_dtype)
        shape = backend.get_kv_cache_shape(
            num_blocks, case.block_size, case.num_kv_heads, case.head_size
        )
        if shape[0] != num_blocks:
            _fail(f"get_kv_cache_shape {shape}: outermost dimension is not blocks")
        self.shape = tuple(shape)
        tensor = getattr(KVCacheTensor, case.layout)(
            (NEIGHBOUR, LAYER), num_blocks, spec.page_size_bytes
        )
        self.buffer = torch.zeros(tensor.size, dtype=torch.int8, device=device)
        self.kv_cache = create_kv_cache_view(
            self.buffer, tensor, LAYER, num_blocks, self.shape[1:], cache_dtype
        )
        self.neighbour = create_kv_cache_view(
            self.buffer, tensor, NEIGHBOUR, num_blocks, self.shape[1:], cache_dtype
        )
        self.builder = backend.get_builder_cls()(spec, [LAYER], device)
        # The cap and the scales go as the Attention layer passes them: keywords, and only
        # when set.
        keywords: dict[str, object] = {}
        if case.logits_soft_cap is not None:
            keywords["logits_soft_cap"] = case.logits_soft_cap
        if case.kv_cache_dtype != "auto":
            keywords["kv_scales"] = KV_SCALES
        self.impl = backend.get_impl_cls()(
            case.num_heads,
            case.head_size,
            1 / math.sqrt(case.head_size),
            case.num_kv_heads,
            case.sliding_window,
            **keywords,
        )

    def step(
        self, step: Step, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> torch.Tensor:  # [T, Hq, D] float32 on the CPU
        metadata = self.builder.build(to_device(step.common, self.device))
        out = self.impl.forward(
            *(t.to(self.device, self.dtype) for t in (query, key, value)), self.kv_cache, metadata
        )
        return out.float().cpu()


def run_case(backend: type[AttentionBackend], case: AttentionCase, device: torch.device) -> None:
    """Run `case` through `backend` and the reference; fails the test naming the first
    step and request whose output or stored K/V differ."""
    generator = torch.Generator().manual_seed(0)
    plan = BatchPlan(case, generator)
    target = PagedAttentionRun(backend, case, plan.num_blocks, case.dtype, device)
    reference = PagedAttentionRun(
        TorchRefBackend, case, plan.num_blocks, torch.float32, torch.device("cpu")
    )
    for step in plan.steps():
        num_tokens = step.common.num_actual_tokens
        query, key, value = (
            torch.randn(num_tokens, heads, case.head_size, generator=generator).to(case.dtype)
            for heads in (case.num_heads, case.num_kv_heads, case.num_kv_heads)
        )  # [T, H, D] each, rounded to the case's dtype so both backends see equal values
        got = target.step(step, query, key, value)
        want = reference.step(step, query, key, value)
        _check_outputs(got, want, step, case)
        _check_cache(target, reference, plan, step)


def _check_outputs(got: torch.Tensor, want: torch.Tensor, step: Step, case: AttentionCase) -> None:
    if got.shape != want.shape:
        shapes = f"{tuple(got.shape)}, expected {tuple(want.shape)}"
        _fail(f"step {step.index}: output shape {shapes}")
    tolerance = TOLERANCES[case.dtype] * max(want.abs().max().item(), 1e-6)
    starts = step.common.query_start_loc.tolist()
    for row in range(step.common.num_reqs):
        rows = slice(starts[row], starts[row + 1])
        diff = (got[rows] - want[rows]).abs().nan_to_num(nan=math.inf).amax(-1)  # [n, Hq]
        worst = diff.max().item()
        if worst > tolerance:
            token, head = divmod(int(diff.argmax()), case.num_heads)
            _fail(
                f"{step.describe(row, case.block_size)}: output differs from the reference "
                f"by {worst:.3g} > {tolerance:.3g} (new token {token}, query head {head})"
            )


def _check_cache(
    target: PagedAttentionRun, reference: PagedAttentionRun, plan: BatchPlan, step: Step
) -> None:
    """Blocks no request owns and the neighbouring layer's pages stay zero; when the
    backend shares the reference's cache shape (taken as its layout), the pages of the
    allocated blocks hold exactly the reference's K/V."""
    where = f"after step {step.index}"
    unallocated = torch.tensor(plan.unallocated_blocks, device=target.device)
    # Comparisons, not count_nonzero or torch.equal: those have no CPU kernel for FP8.
    written = (target.kv_cache.index_select(0, unallocated) != 0).sum().item()
    if written:
        _fail(
            f"{where}: {written} values written into blocks no request owns "
            f"({plan.unallocated_blocks}, block 0 is the null block)"
        )
    if target.neighbour.any().item():
        _fail(f"{where}: the neighbouring layer's pages were written")
    if target.shape != reference.shape:
        return
    blocks = torch.tensor(plan.allocated_blocks)
    got = target.kv_cache.cpu().index_select(0, blocks).float()
    want = reference.kv_cache.index_select(0, blocks).float()
    if not torch.equal(got, want):
        mismatch = (got != want).flatten(1).any(1).nonzero().flatten().tolist()
        _fail(
            f"{where}: stored K/V differ from the reference in blocks "
            f"{[plan.allocated_blocks[i] for i in mismatch]}"
        )


def _fail(message: str) -> NoReturn:
    """Fail the test with `message` alone: the case and step say what went wrong, and a
    traceback through the kit would only bury them."""
    pytest.fail(message, pytrace=False)
