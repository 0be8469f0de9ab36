"""LLM.encode with the `picture` IO processor plugin (tests/plugin_sources.py), whose
prompts carry an image, on a tiny LLaVA: the answer is what generate gives the same prompt
and image, and it depends on the image."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from plugin_sources import PICTURE_IO_ENTRY_POINTS, picture_io_processor

from core import LLM, SamplingParams
from core.testing.tiny_vlm import write_tiny_vlm

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def png(color: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_the_answer_is_what_generate_gives_the_prompt_and_its_image(tmp_path, site, fresh_registry):
    site.add("acme-picture-io", PICTURE_IO_ENTRY_POINTS, picture_io_processor())
    model_dir = write_tiny_vlm(tmp_path, "llava-clip")
    settings = dict(dtype="float32", max_model_len=64, kv_cache_memory="1MiB")
    llm = LLM(str(model_dir), io_processor_plugin="picture", **settings)
    white, black = llm.encode(
        [{"data": {"image": png(color), "question": "w1 w2"}} for color in ("white", "black")],
        use_tqdm=False,
    )
    expected = [
        llm.generate(
            {
                "prompt": "<image> w1 w2",
                "multi_modal_data": {"image": Image.new("RGB", (28, 28), c)},
            },
            GREEDY,
            use_tqdm=False,
        )[0]
        .outputs[0]
        .text
        for c in ("white", "black")
    ]
    assert [white.outputs, black.outputs] == [{"answer": text} for text in expected]
    assert expected[0] != expected[1]  # the tiny LLaVA tells these images apart (tiny_vlm.SEED)
    with pytest.raises(ValueError, match="data.image is not a base64 image"):
        llm.encode({"data": {"image": "bm90IGFuIGltYWdl", "question": "w1"}})
