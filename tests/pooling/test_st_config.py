"""Reading a checkpoint's sentence-transformers files, as sentence-transformers 6 writes them
(`pooling_mode` by name) and as earlier versions did (`pooling_mode_*` switches)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.pooling.interface import PoolingType
from core.pooling.st_config import SentenceTransformersConfig, read_sentence_transformers_config

TYPES = {
    "Transformer": "sentence_transformers.base.modules.transformer.Transformer",
    "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "Normalize": "sentence_transformers.base.modules.normalize.Normalize",
    "Dense": "sentence_transformers.models.Dense",
}


def write(directory: Path, modules: list[str], pooling: dict | None = None) -> Path:
    """modules.json listing `modules` (class names); a Pooling module's config is
    `pooling` beside the embedding dimension."""
    entries = [
        {"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{kind}", "type": TYPES[kind]}
        for i, kind in enumerate(modules)
    ]
    (directory / "modules.json").write_text(json.dumps(entries))
    if "Pooling" in modules:
        folder = directory / f"{modules.index('Pooling')}_Pooling"
        folder.mkdir()
        config = {"embedding_dimension": 32, "include_prompt": True, **(pooling or {})}
        (folder / "config.json").write_text(json.dumps(config))
    return directory


def test_no_modules_json_is_no_sentence_transformers_model(tmp_path):
    assert read_sentence_transformers_config(tmp_path) is None


@pytest.mark.parametrize(
    ("mode", "pooling_type"),
    [("cls", PoolingType.CLS), ("mean", PoolingType.MEAN), ("lasttoken", PoolingType.LAST)],
)
def test_the_pooling_mode_and_a_normalize_module_are_read(tmp_path, mode, pooling_type):
    write(tmp_path, ["Transformer", "Pooling", "Normalize"], {"pooling_mode": mode})
    config = read_sentence_transformers_config(tmp_path)
    assert config == SentenceTransformersConfig(pooling_type, normalize=True)


@pytest.mark.parametrize(
    ("key", "pooling_type"),
    [
        ("pooling_mode_cls_token", PoolingType.CLS),
        ("pooling_mode_mean_tokens", PoolingType.MEAN),
        ("pooling_mode_lasttoken", PoolingType.LAST),
    ],
)
def test_the_switches_of_earlier_versions_are_read(tmp_path, key, pooling_type):
    legacy = {"word_embedding_dimension": 32, "pooling_mode_max_tokens": False, key: True}
    write(tmp_path, ["Transformer", "Pooling"], legacy)
    assert read_sentence_transformers_config(tmp_path).pooling_type is pooling_type


def test_without_a_normalize_module_vectors_are_not_normalized(tmp_path):
    write(tmp_path, ["Transformer", "Pooling"], {"pooling_mode": ["mean"]})
    assert read_sentence_transformers_config(tmp_path) == SentenceTransformersConfig(
        PoolingType.MEAN, normalize=False
    )


def test_a_module_core_does_not_reproduce_is_refused_by_name(tmp_path):
    write(tmp_path, ["Transformer", "Pooling", "Dense"], {"pooling_mode": "mean"})
    with pytest.raises(ValueError, match="module 'sentence_transformers.models.Dense' is not"):
        read_sentence_transformers_config(tmp_path)


@pytest.mark.parametrize(
    ("pooling", "message"),
    [
        ({"pooling_mode": "max"}, "pooling mode 'max' is not supported"),
        ({"pooling_mode_max_tokens": True}, "pooling mode 'max' is not supported"),
        ({"pooling_mode": []}, "pooling modes none; core pools with exactly one"),
        ({"pooling_mode": ["cls", "mean"]}, r"pooling modes \['cls', 'mean'\]"),
        ({"pooling_mode": "lasttoken", "include_prompt": False}, "include_prompt false"),
    ],
)
def test_a_pooling_config_core_cannot_serve_is_refused_naming_the_file(tmp_path, pooling, message):
    write(tmp_path, ["Transformer", "Pooling"], pooling)
    with pytest.raises(ValueError, match=f"1_Pooling/config.json: {message}"):
        read_sentence_transformers_config(tmp_path)


def test_a_model_without_pooling_is_refused(tmp_path):
    write(tmp_path, ["Transformer"])
    with pytest.raises(ValueError, match="has no Pooling module"):
        read_sentence_transformers_config(tmp_path)


def test_unreadable_json_names_the_file(tmp_path):
    (tmp_path / "modules.json").write_text("[{")
    with pytest.raises(ValueError, match="modules.json is not readable JSON"):
        read_sentence_transformers_config(tmp_path)
