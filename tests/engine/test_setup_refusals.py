"""What EngineSetup refuses before any process starts, naming the flags: multi-head latent
attention split over ranks (it runs on one for now), an --allowed-local-media-path that is
not a directory."""

from __future__ import annotations

import pytest
from deepseek_checkpoints import DEEPSEEK_VARIANTS, random_deepseek

from core.engine.processor import EngineSetup
from core.engine_args import EngineArgs
from core.testing.tiny_checkpoint import write_tiny_checkpoint


@pytest.mark.parametrize("flags", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_latent_attention_over_several_ranks_is_refused_naming_the_flags(flags, tmp_path):
    write_tiny_checkpoint(tmp_path, random_deepseek(next(iter(DEEPSEEK_VARIANTS))))
    args = EngineArgs(model=str(tmp_path), dtype="float32", max_model_len=64, **flags)
    with pytest.raises(ValueError, match="--tensor-parallel-size .* multi-head latent"):
        EngineSetup.from_engine_args(args)


def test_a_media_path_that_is_not_a_directory_fails_the_start(tmp_path):
    write_tiny_checkpoint(tmp_path / "model")
    (tmp_path / "file.png").write_bytes(b"x")
    for path in (tmp_path / "missing", tmp_path / "file.png"):
        args = EngineArgs(model=str(tmp_path / "model"), allowed_local_media_path=str(path))
        with pytest.raises(ValueError, match="--allowed-local-media-path .*: not a directory"):
            EngineSetup.from_engine_args(args)
