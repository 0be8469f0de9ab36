"""The kit's batch-invariance check (core/testing/test_batch_invariance.py) both ways: it
passes core-cpu-kernels' kernels and the attention backends serving the mode, skips what
does not declare the mode, and fails toys that declare it yet answer by their batch
(toy_kernels.py, toy_invariant_attention.py); run in a subprocess as a plugin author runs
the kit."""

from __future__ import annotations

import pytest
from test_conformance_plugin import run_pytest

from core.ops import CORE_OPS
from core.testing.test_batch_invariance import ROW_ARGUMENTS

CHECK = "test_batch_invariance.py::test_a_row_is_the_same_however_it_is_batched"
TOYS = "attention:toy_invariant_attention"
SCHEDULES = (
    "chunks-of-16-7-16-1",
    "decode-rows",
    "decode-batches-of-4",
    "mixed-prefill-and-decode",
)


def test_the_kit_knows_the_row_arguments_of_every_kernel_op():
    kernel_ops = set(CORE_OPS.providers()) - {"unified_attention"}  # a seam without samples
    assert kernel_ops <= set(ROW_ARGUMENTS)


def test_what_serves_the_mode_passes_and_what_does_not_declare_it_is_skipped(tmp_path):
    done = run_pytest(
        "--core-conformance=kernels:kernel_ops",
        "--core-conformance=attention:torch_ref,attention:cpu_paged",
        f"--core-conformance={TOYS}:UndeclaredBackend",
        "-k",
        "test_batch_invariance",
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for case in ("linear-bfloat16-gemv", "fused_moe-bfloat16-grouped", "rms_norm-bfloat16"):
        assert f"PASSED {CHECK}[kernel_ops-{case}]" in done.stdout
    for backend in ("torch_ref", "cpu_paged"):
        for dtype in ("float32", "bfloat16"):
            for schedule in SCHEDULES:
                assert f"PASSED {CHECK}[{backend}-{dtype}-{schedule}]" in done.stdout
    assert "linear candidate torch does not declare batch_invariant" in done.stdout
    assert "undeclared does not declare AttentionCapabilities.batch_invariant" in done.stdout


def test_a_kernel_and_a_backend_that_answer_by_their_batch_fail_naming_it(tmp_path):
    done = run_pytest(
        "--core-conformance=kernels:toy_kernels:register_silu_invariance",
        f"--core-conformance={TOYS}:StepSizedBackend",
        "-k",
        "test_batch_invariance and not (StepSizedBackend and float32)",
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    case = "register_silu_invariance-silu_and_mul"
    for dtype in ("float32", "bfloat16", "float16"):
        assert f"PASSED {CHECK}[{case}-{dtype}-rowwise]" in done.stdout
        assert f"FAILED {CHECK}[{case}-{dtype}-batch-dependent]" in done.stdout
    assert (
        "core::silu_and_mul (batch-dependent) in bfloat16: output 0: row 0 at position 0 of a "
        "batch of 2 differs from the row computed alone by up to"
    ) in done.stdout
    for schedule in SCHEDULES:
        assert f"FAILED {CHECK}[StepSizedBackend-bfloat16-{schedule}]" in done.stdout
    assert (
        "step_sized in bfloat16: 40 of the sequence's 40 tokens (the first at position 0) "
        "attend differently scheduled as decode-rows than as one-prefill-chunk"
    ) in done.stdout
