"""The conformance kit as a pytest plugin, run the way a plugin author runs it.

Each test starts pytest in a subprocess: the plugin is loaded through core's `pytest11`
entry point, as in any environment where core is installed. The toy and broken
components the kit is pointed at live beside this file (importable through PYTHONPATH).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO_ROOT = HERE.parents[1]


def run_pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )


def write_project(root: Path) -> None:
    """A project of its own: testpaths and python_files that the kit's modules do not
    match, and a test of its own that fails if it is ever collected."""
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["checks"]\npython_files = ["check_*.py"]\n'
    )
    (root / "checks").mkdir()
    (root / "checks" / "check_project.py").write_text(
        textwrap.dedent("""
            import sys

            def test_project_runs_without_torch():
                assert "torch" not in sys.modules
        """)
    )


def test_a_run_without_the_option_imports_no_torch(tmp_path):
    write_project(tmp_path)
    done = run_pytest(cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_kit_runs_instead_of_another_projects_tests(tmp_path):
    write_project(tmp_path)
    (tmp_path / "checks" / "check_project.py").write_text("def test_fails():\n    assert False\n")
    done = run_pytest("--core-conformance=sampler:default", "-rA", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED test_sampler.py::test_greedy_is_the_argmax[default]" in done.stdout
    assert "check_project" not in done.stdout


def test_kit_runs_instead_of_this_repositorys_tests():
    done = run_pytest("--core-conformance=platform:cpu", "--collect-only", "-q", cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    node_ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert "core/testing/test_platform.py::test_probe_imports_nothing_heavy[cpu]" in node_ids
    assert all(n.startswith("core/testing/test_platform.py::") for n in node_ids), node_ids


def test_unknown_component_is_a_usage_error_listing_the_installed_ones(tmp_path):
    done = run_pytest("--core-conformance=attention:no_such_backend", cwd=tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "attention backend 'no_such_backend' is not installed" in done.stderr
    assert "torch_ref" in done.stderr


def test_a_quant_config_that_is_not_a_json_object_is_a_usage_error(tmp_path):
    done = run_pytest(
        "--core-conformance=quantization:toy_quantization:ToyInt8Config",
        "--core-conformance-quant-config=[1]",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--core-conformance-quant-config must be a JSON object, got list" in done.stderr


def test_toy_quantization_method_and_kv_connector_conform(tmp_path):
    done = run_pytest(
        "--core-conformance=quantization:toy_quantization:ToyInt8Config",
        '--core-conformance-quant-config={"quant_method": "toy_int8"}',
        "--core-conformance=kv_connector:toy_kv_connector:ToyStoreConnector",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout and "skipped" not in done.stdout


def test_broken_components_fail_naming_the_case(tmp_path):
    done = run_pytest(
        "--core-conformance=attention:broken_attention:EdgeBlindBackend",
        "--core-conformance=quantization:toy_quantization:RolledScalesConfig",
        "-k",
        "float32 and not bias or undeclared",
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    edge = "test_matches_reference[EdgeBlindBackend-float32-d64-gqa2-bs16-block-edges]"
    assert f"FAILED test_attention.py::{edge}" in done.stdout
    assert "decode, context 17 (one past a block edge, block size 16): output differs" in (
        done.stdout
    )
    apply = "test_apply_equals_the_dequantized_reference[RolledScalesConfig-qkv-float32-5]"
    assert f"FAILED test_quantization.py::{apply}" in done.stdout
    # What the bugs leave alone still passes: refusals, and the fused W's shard layout.
    refusal = "test_undeclared_combination_is_refused_with_a_reason[EdgeBlindBackend-dtype-float64]"
    assert f"PASSED test_attention.py::{refusal}" in done.stdout
    layout = "test_fused_weight_is_its_shards_in_order[RolledScalesConfig-qkv-float32]"
    assert f"PASSED test_quantization.py::{layout}" in done.stdout


def test_the_reference_io_processor_conforms_on_both_runners(tmp_path):
    done = run_pytest(
        "--core-conformance=io_processor:passthrough",
        '--core-conformance-io-data=passthrough=["w1 w2", [5, 6]]',
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout and "skipped" not in done.stdout
    assert "PASSED test_io_processor.py::test_the_answer_serializes_to_json[" in done.stdout


def test_a_sloppy_io_processor_fails_naming_what_it_does_wrong(tmp_path):
    name = "toy_io_processor:SloppyProcessor"
    done = run_pytest(
        f"--core-conformance=io_processor:{name}",
        f'--core-conformance-io-data={name}={{"words": ["w1"]}}',
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "parse_request(None) raised AttributeError" in done.stdout
    assert "parse_request(True) raised AttributeError" in done.stdout
    assert "parse_request([]) raised AttributeError" in done.stdout
    assert "output_to_response gave what JSON cannot carry" in done.stdout
    assert "PASSED test_io_processor.py::test_prompts_have_the_contracts_shapes" in done.stdout


def test_the_reference_logits_processor_conforms(tmp_path):
    name = "core.sample.logit_softcap:SoftcapLogitsProcessor"
    done = run_pytest(
        f"--core-conformance=logits_processor:{name}",
        f'--core-conformance-logits-args={name}={{"logit_softcap": 1.5}}',
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout and "skipped" not in done.stdout


def test_a_logits_processor_that_loses_track_of_rows_fails_naming_them(tmp_path):
    name = "toy_logits_processor:ForgetfulProcessor"
    done = run_pytest(
        f"--core-conformance=logits_processor:{name}",
        f'--core-conformance-logits-args={name}={{"boost": 5.0}}',
        "-rA",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "FAILED test_logits_processor.py::test_leaves_the_requests_that_do_not_ask_alone" in (
        done.stdout
    )
    assert "FAILED test_logits_processor.py::test_a_requests_effect_follows_it" in done.stdout
    assert "PASSED test_logits_processor.py::test_takes_a_request_without_arguments" in done.stdout


def test_io_data_that_is_not_json_is_a_usage_error(tmp_path):
    done = run_pytest(
        "--core-conformance=io_processor:passthrough",
        "--core-conformance-io-data=passthrough={words}",
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--core-conformance-io-data passthrough: not JSON" in done.stderr
