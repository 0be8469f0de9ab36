"""--load-format and --trust-remote-code against the checkpoint found."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tiny_engine_checkpoint import write_tiny_checkpoint

from core.engine.processor import EngineSetup
from core.engine_args import EngineArgs
from core.model_loader import GGUFCheckpoint, SafetensorsCheckpoint
from core.model_loader.load_checks import check_load_options

LLAMA = {"architectures": ["LlamaForCausalLM"]}
REMOTE = {
    "AutoConfig": "configuration_acme.AcmeConfig",
    "AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM",
}


def hf_dir(hf_config: dict) -> SafetensorsCheckpoint:
    return SafetensorsCheckpoint(Path("/models/acme"), hf_config, "acme", weight_files=())


def gguf_file() -> GGUFCheckpoint:
    return GGUFCheckpoint(Path("/models/acme.gguf"), LLAMA, "acme")


def test_auto_accepts_either_format_and_a_named_one_must_match():
    for checkpoint in (hf_dir(LLAMA), gguf_file()):
        check_load_options(checkpoint, None, False)
    check_load_options(hf_dir(LLAMA), "safetensors", False)
    check_load_options(gguf_file(), "gguf", False)
    with pytest.raises(ValueError, match="^--load-format gguf: /models/acme is a safetensors"):
        check_load_options(hf_dir(LLAMA), "gguf", False)
    with pytest.raises(ValueError, match="^--load-format safetensors: /models/acme.gguf is a gguf"):
        check_load_options(gguf_file(), "safetensors", False)


@pytest.mark.parametrize("trust", [False, True])
def test_an_architecture_only_remote_code_has_is_refused_naming_the_class(trust):
    config = {"architectures": ["AcmeForCausalLM"], "auto_map": REMOTE}
    with pytest.raises(ValueError) as refused:
        check_load_options(hf_dir(config), "auto", trust)
    message = str(refused.value)
    assert "AutoModelForCausalLM -> modeling_acme.AcmeForCausalLM" in message
    assert "core never runs, with or without --trust-remote-code" in message


def test_trust_remote_code_is_a_logged_no_op_where_core_has_the_architecture(caplog):
    caplog.set_level(logging.INFO, logger="core.model_loader.load_checks")
    check_load_options(hf_dir(LLAMA), "auto", True)
    check_load_options(hf_dir({**LLAMA, "auto_map": REMOTE}), "auto", True)
    assert len(caplog.messages) == 2
    assert "has no auto_map (no remote code): nothing to trust" in caplog.messages[0]
    assert "its own implementation; the checkpoint's auto_map code is not run" in caplog.messages[1]
    caplog.clear()
    check_load_options(hf_dir({**LLAMA, "auto_map": REMOTE}), None, False)
    assert caplog.messages == []  # without the flag there is nothing to say


def test_the_engine_setup_checks_the_load_options_before_starting(tmp_path):
    model_dir = write_tiny_checkpoint(tmp_path / "tiny")
    with pytest.raises(ValueError, match=f"^--load-format gguf: {model_dir} is a safetensors"):
        EngineSetup.from_engine_args(EngineArgs(model=str(model_dir), load_format="gguf"))
