"""Batch invariance (core.batch_invariant) of kernels and attention backends.

Collected with `--core-conformance=kernels:NAME` and `attention:NAME`. In batch-invariant
mode a row's output must be bit-identical however it is batched, so the checks compare
with torch.equal, not a tolerance:

- kernels: for every op NAME serves on the device under test, each kernel-choice
  candidate of that op declaring `batch_invariant` (forced, as test_kernels.py forces
  them), or the registered kernel itself where the op has no candidates, runs in the mode
  on 64 rows built from the op's first conformance sample (its weights, tables and eps
  shared; fresh rows in place of its row arguments, `ROW_ARGUMENTS`), in every dtype the
  op states a tolerance for. Each row computed alone must equal that row in batches of 2
  to 64 rows, wherever in the batch it sits: every output, and every row argument
  afterwards (an in-place op's result).
- attention: a backend declaring `AttentionCapabilities.batch_invariant` runs, in the
  mode, one sequence of 40 tokens (GQA: 4 query heads on 2 KV heads, head size 64) under
  several schedules: its whole prompt in one prefill chunk, chunks of 16, 7, 16 and 1 on
  cached context, one decode row per token, decode batches of 4 with the sequence at
  every position, and steps mixing prefill chunks and decodes of other sequences. Its
  output at every position must be the same under each.

A candidate or backend that does not declare the mode is skipped, saying so.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from core import batch_invariant
from core.attention.interface import AttentionBackend, AttentionCapabilities, AttentionRequirements
from core.envs import KERNEL_CHOICE_ENV
from core.kernel_choice import KERNEL_CHOICES
from core.ops import CORE_OPS, KernelOp
from core.testing.attention_batches import AttentionCase, BatchPlan, Schedule, Step
from core.testing.attention_run import PagedAttentionRun
from core.testing.plugin import targets_of
from core.testing.targets import Target

ROW_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "rms_norm": (0,),
    "fused_add_rms_norm": (0, 1),  # x, residual
    "silu_and_mul": (0,),
    "rotary_embedding": (0, 1, 2),  # positions, query, key (rotated in place)
    "linear": (0,),
    "quant_linear": (0,),
    "fp8_linear": (0,),
    "int8_linear": (0,),
    "fused_moe": (0, 3, 4),  # hidden, topk_weights, topk_ids
}
"""Per core op: the positions of the arguments that hold one row per token ([T, ...]);
the others (weights, tables, eps) are shared by every row."""

NUM_ROWS = 64
BATCH_SIZES = (2, 3, 5, 8, 16, 17, 32, 64)
# A batch of B takes rows start, start + 1, ... (mod 64): over two starts every row sits
# first, last and in between in some batch.
BATCH_STARTS = (0, 41)

PROBE = 0  # the sequence whose outputs are compared; the others are its batch-mates
PROBE_TOKENS = 40
DTYPES = (torch.float32, torch.bfloat16)  # those of them a backend declares
HEAD_SIZE = 64
NUM_KV_HEADS = 2
GQA_RATIO = 2


def _decode_batches(num_decodes: int, batch_size: int) -> Schedule:
    """The probe's prompt beside the other sequences', then decode steps of all
    `batch_size` sequences with the probe's row first, second, ... last in turn."""
    others = list(range(1, batch_size))
    steps: Schedule = [{PROBE: PROBE_TOKENS - num_decodes, **{r: 2 * r + 1 for r in others}}]
    for t in range(num_decodes):
        at = t % batch_size
        steps.append(dict.fromkeys([*others[:at], PROBE, *others[at:]], 1))
    return steps


SCHEDULES: dict[str, Schedule] = {
    "one-prefill-chunk": [{PROBE: PROBE_TOKENS}],
    "chunks-of-16-7-16-1": [{PROBE: 16}, {PROBE: 7}, {PROBE: 16}, {PROBE: 1}],
    "decode-rows": [{PROBE: 1} for _ in range(PROBE_TOKENS)],
    "decode-batches-of-4": _decode_batches(8, 4),
    # The probe in 16-, 7-, 1- and 16-token chunks, beside fresh prompts, chunks on
    # cached context and decodes.
    "mixed-prefill-and-decode": [
        {1: 5, PROBE: 16, 2: 1},
        {2: 1, PROBE: 7, 1: 1, 3: 9},
        {PROBE: 1, 3: 1, 1: 3},
        {3: 1, 2: 1, PROBE: 16},
    ],
}
"""Schedules of the probe's PROBE_TOKENS tokens among other sequences (per step: request
index -> new tokens, in batch order); each is compared with the first."""


@dataclass(frozen=True)
class KernelRows:
    """One op's kernel in one dtype: a candidate forced, or the registered kernel."""

    op: KernelOp
    device_type: str
    dtype: torch.dtype
    candidate: str | None  # None: the op has no candidates; its kernel as registered
    invariant: bool  # the candidate declares batch_invariant (a kernel alone: assumed)


@dataclass(frozen=True)
class AttentionSchedules:
    """One backend in one dtype, a schedule of the probe compared with the first."""

    backend: type[AttentionBackend]
    dtype: torch.dtype
    schedule: str


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    device_type = torch.device(config.getoption("core_conformance_device")).type
    params = [p for t in targets_of(config, "kernels") for p in _kernel_params(t, device_type)]
    params += [
        pytest.param(
            AttentionSchedules(t.value, dtype, name), id=f"{t.id}-{_dtype_id(dtype)}-{name}"
        )
        for t in targets_of(config, "attention")
        for dtype in DTYPES
        if dtype in t.value.capabilities.dtypes
        for name in list(SCHEDULES)[1:]
    ]
    metafunc.parametrize("invariance_case", params)


def _kernel_params(target: Target, device_type: str) -> list[Any]:
    params = []
    for op, served_type in CORE_OPS.registrations_of(target.value):
        if served_type != device_type or op.conformance is None:
            continue  # test_kernels.py fails a kernel for an op without samples
        candidates = [c for c in KERNEL_CHOICES.candidates.get(op.name, ()) if c.available()]
        kernels = [(c.name, c.batch_invariant) for c in candidates] or [(None, True)]
        for dtype in op.conformance.tolerances:
            for name, invariant in kernels:
                case = KernelRows(op, device_type, dtype, name, invariant)
                suffix = f"-{name}" if name else ""
                test_id = f"{target.id}-{op.name}-{_dtype_id(dtype)}{suffix}"
                params.append(pytest.param(case, id=test_id))
    return params


@pytest.fixture
def invariant_mode() -> Iterator[None]:
    """Batch-invariant mode on, no kernel chosen before or kept after."""
    was = batch_invariant.enabled()
    batch_invariant.set_enabled(True)
    KERNEL_CHOICES.chosen.clear()
    yield
    batch_invariant.set_enabled(was)
    KERNEL_CHOICES.chosen.clear()


@pytest.mark.usefixtures("invariant_mode")
def test_a_row_is_the_same_however_it_is_batched(
    invariance_case: KernelRows | AttentionSchedules,
    core_conformance_device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if isinstance(invariance_case, KernelRows):
        _check_kernel(invariance_case, core_conformance_device, monkeypatch)
    else:
        _check_attention(invariance_case, core_conformance_device)


def _check_kernel(case: KernelRows, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of 64 rows alone equals that row in every batch of BATCH_SIZES it is in."""
    op, candidate = case.op, case.candidate
    if not case.invariant:
        pytest.skip(f"{op.name} candidate {candidate} does not declare batch_invariant")
    if op.name not in ROW_ARGUMENTS:
        pytest.skip(f"the kit does not know which arguments of {op.qualname} are rows")
    if candidate is not None:
        monkeypatch.setenv(KERNEL_CHOICE_ENV, f"{op.name}={candidate}")
    what = f"{op.qualname}{f' ({candidate})' if candidate else ''} in {_dtype_id(case.dtype)}"
    assert_rows_invariant(op.kernels[case.device_type], op, case.dtype, device, what)


def assert_rows_invariant(
    kernel: Any, op: KernelOp, dtype: torch.dtype, device: torch.device, what: str
) -> None:
    """`kernel` (any implementation of `op`, e.g. its reference in the mode) gives each of
    NUM_ROWS rows, built from the op's first sample in `dtype`, the same bits alone as in
    every batch of BATCH_SIZES it is in; fails naming `what`, the batch and the row."""
    positions = ROW_ARGUMENTS[op.name]
    args = _rows_args(op.conformance.samples(dtype, device)[0].args, positions)
    alone = [_run(kernel, args, positions, [row]) for row in range(NUM_ROWS)]
    names = _output_names(op, positions, len(alone[0]))
    for size in BATCH_SIZES:
        for start in BATCH_STARTS:
            rows = [(start + i) % NUM_ROWS for i in range(size)]
            batch = _run(kernel, args, positions, rows)
            for j, name in enumerate(names):
                want = torch.cat([alone[row][j] for row in rows])
                _assert_rows_equal(batch[j], want, rows, f"{what}: {name}")


def _rows_args(args: tuple[Any, ...], positions: tuple[int, ...]) -> list[Any]:
    """`args` with each row argument NUM_ROWS rows long: fresh seeded values at the
    sample's scale for floating ones, the sample's own rows (at seeded picks, the same for
    every integer argument: routing stays consistent) for the others."""
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(0, args[positions[0]].shape[0], (NUM_ROWS,), generator=generator)
    rows = list(args)
    for position in positions:
        arg = args[position]
        if arg.is_floating_point():
            scale = arg.float().abs().mean().item() or 1.0
            fresh = torch.randn((NUM_ROWS, *arg.shape[1:]), generator=generator) * scale
            rows[position] = fresh.to(device=arg.device, dtype=arg.dtype)
        else:
            rows[position] = arg.index_select(0, picks.to(arg.device))
    return rows


def _run(kernel: Any, args: list[Any], positions: tuple[int, ...], rows: list[int]) -> list[Any]:
    """`kernel` on rows `rows` of the row arguments, copied into fresh tensors as a batch's
    activations are: its outputs, then the row arguments afterwards, on the CPU."""
    call = list(args)
    for position in positions:
        call[position] = args[position].index_select(0, torch.tensor(rows, device=args[0].device))
    result = kernel(*call)
    outputs = [] if result is None else [result] if isinstance(result, torch.Tensor) else result
    return [t.cpu() for t in [*outputs, *(call[p] for p in positions)]]


def _output_names(op: KernelOp, positions: tuple[int, ...], count: int) -> list[str]:
    arguments = [a.name for a in op.overload._schema.arguments]
    afterwards = [f"argument {arguments[p]!r} afterwards" for p in positions]
    return [f"output {i}" for i in range(count - len(positions))] + afterwards


def _assert_rows_equal(got: torch.Tensor, want: torch.Tensor, rows: list[int], what: str) -> None:
    """Fail naming the first row of a batch (rows `rows`) that differs from it alone."""
    if torch.equal(got, want):
        return
    differs = (got != want).reshape(len(rows), -1).any(1)
    position = int(differs.nonzero()[0])
    diff = (got[position].float() - want[position].float()).abs().max().item()
    pytest.fail(
        f"{what}: row {rows[position]} at position {position} of a batch of {len(rows)} "
        f"differs from the row computed alone by up to {diff:.3g} "
        f"({int(differs.sum())} of the batch's rows differ)",
        pytrace=False,
    )


_first_outputs: dict[tuple[type[AttentionBackend], torch.dtype, torch.device], torch.Tensor] = {}
"""The probe's outputs under the first schedule, run once per backend, dtype and device."""


def _check_attention(case: AttentionSchedules, device: torch.device) -> None:
    """The probe's outputs under `case.schedule` equal those under the first schedule."""
    backend, dtype = case.backend, case.dtype
    if not backend.capabilities.batch_invariant:
        pytest.skip(f"{backend.name} does not declare AttentionCapabilities.batch_invariant")
    layer = _attention_case(backend.capabilities, dtype)
    req = AttentionRequirements(dtype, layer.head_size, layer.block_size, batch_invariant=True)
    reason = backend.supports_combination(req)
    if reason is not None:
        pytest.skip(f"refuses {req} here: {reason}")
    first = next(iter(SCHEDULES))
    key = (backend, dtype, device)
    if key not in _first_outputs:
        _first_outputs[key] = _probe_outputs(backend, layer, SCHEDULES[first], device)
    want = _first_outputs[key]
    got = _probe_outputs(backend, layer, SCHEDULES[case.schedule], device)
    if torch.equal(got, want):
        return
    differs = (got != want).flatten(1).any(1).nonzero().flatten().tolist()
    diff = (got - want).abs().nan_to_num(nan=math.inf).max().item()
    pytest.fail(
        f"{backend.name} in {_dtype_id(dtype)}: {len(differs)} of the sequence's "
        f"{PROBE_TOKENS} tokens (the first at position {differs[0]}) attend differently "
        f"scheduled as {case.schedule} than as {first}, by up to {diff:.3g}",
        pytrace=False,
    )


def _attention_case(caps: AttentionCapabilities, dtype: torch.dtype) -> AttentionCase:
    """The layer the schedules run: head size 64 and block size 16 where declared."""
    head_size = HEAD_SIZE if caps.head_sizes is None else _nearest(caps.head_sizes, HEAD_SIZE)
    block_size = 16 if caps.block_sizes is None else _nearest(caps.block_sizes, 16)
    return AttentionCase(
        dtype=dtype,
        head_size=head_size,
        num_kv_heads=NUM_KV_HEADS,
        gqa_ratio=GQA_RATIO,
        block_size=block_size,
        sliding_window=None,
        schedule="invariance",  # a label: the plan is given each schedule itself
    )


def _nearest(sizes: frozenset[int], size: int) -> int:
    return min(sizes, key=lambda s: (abs(s - size), s))


def _probe_outputs(
    backend: type[AttentionBackend], case: AttentionCase, schedule: Schedule, device: torch.device
) -> torch.Tensor:  # [PROBE_TOKENS, Hq, D] float32
    """The probe's output at each of its positions, run through `schedule`. Every
    sequence's q/k/v depend on its index and position alone, never on the schedule."""
    plan = BatchPlan(case, torch.Generator().manual_seed(1), schedule)
    run = PagedAttentionRun(backend, case, plan.num_blocks, case.dtype, device)
    tokens = _sequence_tokens(case, schedule)
    outputs = []
    for step in plan.steps():
        out = run.step(step, *_step_inputs(step, tokens))
        if PROBE in step.req_ids:
            row = step.req_ids.index(PROBE)
            starts = step.common.query_start_loc.tolist()
            outputs.append(out[starts[row] : starts[row + 1]])
    return torch.cat(outputs)


def _step_inputs(step: Step, tokens: dict[int, tuple[torch.Tensor, ...]]) -> Iterator[torch.Tensor]:
    """The step's query, key and value: each request's new rows, in batch order."""
    computed = zip(step.req_ids, step.num_new_tokens, step.num_computed, strict=True)
    parts = [[t[cached : cached + new] for t in tokens[req]] for req, new, cached in computed]
    return (torch.cat(rows) for rows in zip(*parts, strict=True))


def _sequence_tokens(
    case: AttentionCase, schedule: Schedule
) -> dict[int, tuple[torch.Tensor, ...]]:
    """Each sequence's query [L, Hq, D], key and value [L, Hkv, D], in the case's dtype."""
    lengths: dict[int, int] = {}
    for step in schedule:
        for req, new in step.items():
            lengths[req] = lengths.get(req, 0) + new
    tokens = {}
    for req, length in lengths.items():
        generator = torch.Generator().manual_seed(100 + req)
        tokens[req] = tuple(
            torch.randn(length, heads, case.head_size, generator=generator).to(case.dtype)
            for heads in (case.num_heads, case.num_kv_heads, case.num_kv_heads)
        )
    return tokens


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
