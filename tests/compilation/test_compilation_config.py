"""-O levels and --compilation-config: vLLM's keys, what wins, what is refused."""

from __future__ import annotations

import pytest

from core.config import CUDAGraphMode
from core.engine_args import EngineArgs
from core.platforms.cpu import CpuPlatform


class GraphPlatform(CpuPlatform):
    """A platform that compiles and captures graphs and starts at -O2, as GPUs do."""

    name = "graphs"
    supported_optimization_levels = (0, 1, 2)
    default_optimization_level = 2


def compilation(platform=None, **kwargs):
    return EngineArgs(**kwargs).create_engine_config(platform or CpuPlatform()).compilation


def test_o1_compiles_on_the_cpu_without_graph_capture():
    config = compilation(optimization_level=1)
    assert (config.compile_model, config.capture_graphs) == (True, False)
    assert config.cudagraph_mode is CUDAGraphMode.NONE


def test_the_cpu_default_is_eager():
    config = compilation()
    assert (config.level, config.compile_model, config.capture_graphs) == (0, False, False)


def test_a_level_given_as_compilation_config_equals_the_o_flag():
    for value in (1, "1"):
        assert compilation(compilation_config=value).compile_model


def test_compilation_config_level_contradicting_o_is_refused():
    with pytest.raises(ValueError, match="--compilation-config level 0 contradicts -O1"):
        compilation(optimization_level=1, compilation_config={"level": 0})


def test_unknown_compilation_config_key_is_refused_naming_it():
    with pytest.raises(ValueError, match="no_such_key"):
        compilation(compilation_config='{"no_such_key": 1}')


def test_graph_capture_asked_on_the_cpu_is_refused():
    with pytest.raises(ValueError, match="-O2 needs a platform with graph capture"):
        compilation(optimization_level=2)
    with pytest.raises(ValueError, match="capture_graphs needs a platform with graph capture"):
        compilation(compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})


def test_o2_captures_at_vllm_capture_sizes_leaving_the_mode_to_the_backend():
    config = compilation(GraphPlatform(), max_num_seqs=20)
    assert config.cudagraph_mode is None  # the worker picks it from the backend's support
    assert config.cudagraph_capture_sizes == [1, 2, 4, 8, 16, 20]


def test_capture_sizes_given_are_sorted_and_unique():
    config = compilation(GraphPlatform(), compilation_config={"cudagraph_capture_sizes": [8, 1, 8]})
    assert config.cudagraph_capture_sizes == [1, 8]
    largest = compilation(GraphPlatform(), compilation_config={"max_cudagraph_capture_size": 10})
    assert largest.cudagraph_capture_sizes == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError, match="cudagraph_capture_sizes"):
        compilation(GraphPlatform(), compilation_config={"cudagraph_capture_sizes": [0, 4]})


def test_enforce_eager_wins_over_a_graph_mode_and_the_level():
    config = compilation(
        GraphPlatform(),
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"},
        enforce_eager=True,
    )
    assert (config.compile_model, config.capture_graphs) == (False, False)
    assert config.cudagraph_mode is CUDAGraphMode.NONE


def test_full_graphs_of_mixed_batches_are_refused_as_not_built():
    with pytest.raises(ValueError, match="cudagraph_mode FULL .* is not implemented yet"):
        compilation(GraphPlatform(), compilation_config={"cudagraph_mode": "FULL"})


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
def test_piecewise_graphs_without_compilation_are_refused(mode):
    config = {"cudagraph_mode": mode, "compile_model": False}
    with pytest.raises(ValueError, match=f"cudagraph_mode {mode} captures pieces of the compiled"):
        compilation(GraphPlatform(), compilation_config=config)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [({"enable_lora": True}, "--enable-lora"), ({"pipeline_parallel_size": 2}, "--pipeline")],
)
def test_compiling_with_lora_or_pipeline_stages_is_refused(kwargs, flag):
    with pytest.raises(
        ValueError, match=f"-O1 compiles the model or captures graphs, which {flag}"
    ):
        compilation(optimization_level=1, **kwargs)
