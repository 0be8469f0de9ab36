"""The CUDA platform's default -O2 never refuses a start: with --enable-lora or pipeline
stages it yields (the engine runs eagerly); an -O level given explicitly is refused with
them, naming both flags and the remedy."""

from __future__ import annotations

import pytest
from core_cuda.platform import CudaPlatform

from core.config import CUDAGraphMode
from core.engine_args import EngineArgs


class TwoGpus(CudaPlatform):
    """The CUDA platform's declarations (default -O2) on a host that reports two GPUs."""

    def device_count(self) -> int:
        return 2


@pytest.mark.parametrize("flags", [{"enable_lora": True}, {"pipeline_parallel_size": 2}])
def test_with_no_level_given_the_default_o2_yields_and_the_engine_starts_eagerly(flags):
    compilation = EngineArgs(**flags).create_engine_config(TwoGpus()).compilation
    assert compilation.level == 2 and not compilation.is_user_set("level")
    assert (compilation.compile_model, compilation.capture_graphs) == (False, False)
    assert compilation.cudagraph_mode is CUDAGraphMode.NONE


def test_without_those_features_the_default_o2_compiles_and_captures():
    compilation = EngineArgs().create_engine_config(TwoGpus()).compilation
    assert (compilation.compile_model, compilation.capture_graphs) == (True, True)


@pytest.mark.parametrize(
    ("flags", "feature"),
    [({"enable_lora": True}, "--enable-lora"), ({"pipeline_parallel_size": 2}, "--pipeline")],
)
@pytest.mark.parametrize("level", [1, 2])
def test_an_explicit_level_with_those_features_is_refused_naming_both(flags, feature, level):
    message = (
        f"^-O{level} compiles the model or captures graphs, which {feature}.* does not "
        "support yet: use -O0 or --enforce-eager$"
    )
    with pytest.raises(ValueError, match=message):
        EngineArgs(optimization_level=level, **flags).create_engine_config(TwoGpus())
