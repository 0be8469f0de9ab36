"""The `kernels` conformance kind against toy registration callables (tests/testing/
toy_kernels.py), run in a subprocess as a plugin author runs the kit."""

from __future__ import annotations

import pytest
from test_conformance_plugin import run_pytest


def test_a_conforming_kernel_passes_in_every_dtype_and_an_empty_registration_fails(tmp_path):
    done = run_pytest(
        "--core-conformance=kernels:toy_kernels:register_silu",
        "--core-conformance=kernels:toy_kernels:register_nothing",
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    samples = "test_kernels.py::test_kernel_matches_the_reference_on_every_sample"
    for dtype in ("float32", "bfloat16", "float16"):
        assert f"PASSED {samples}[register_silu-silu_and_mul-{dtype}]" in done.stdout
    registers = "test_kernels.py::test_registers_a_kernel_for_the_device_under_test"
    assert f"PASSED {registers}[register_silu]" in done.stdout
    assert f"FAILED {registers}[register_nothing]" in done.stdout
    message = "register_nothing registers no kernel for core's ops on 'cpu' (it registers: nothing"
    assert message in done.stdout


def test_a_kernel_that_loses_its_writes_to_strided_views_fails_naming_the_sample(tmp_path):
    done = run_pytest(
        "--core-conformance=kernels:toy_kernels:register_copying_rotary", "-rA", cwd=tmp_path
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    samples = "test_kernels.py::test_kernel_matches_the_reference_on_every_sample"
    assert f"FAILED {samples}[register_copying_rotary-rotary_embedding-float32]" in done.stdout
    assert (
        "core::rotary_embedding in float32, sample 'packed requests, views into a fused QKV': "
        "argument 'query' afterwards differs from the reference"
    ) in done.stdout


def test_each_kernel_choice_candidate_is_checked_forced_and_a_wrong_one_fails(tmp_path):
    done = run_pytest(
        "--core-conformance=kernels:toy_kernels:register_silu_choices", "-rA", cwd=tmp_path
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    samples = "test_kernels.py::test_kernel_matches_the_reference_on_every_sample"
    case = "register_silu_choices-silu_and_mul-float32"
    assert f"PASSED {samples}[{case}]" in done.stdout  # as registered: `exact` serves first
    assert f"PASSED {samples}[{case}-exact]" in done.stdout
    assert f"FAILED {samples}[{case}-halved]" in done.stdout
    assert "core::silu_and_mul in float32, sample" in done.stdout and "(halved)" in done.stdout
