"""Sources of the throw-away plugin distributions the plugin tests install, and how they are
installed."""

from __future__ import annotations

import textwrap
from pathlib import Path

API = 'CORE_PLUGIN_API = ">=1.0,<2"\n'


def install_distribution(
    root: Path,
    name: str,
    entry_points: dict[str, dict[str, str]],
    modules: dict[str, str],
    version: str = "1.0",
) -> None:
    """Write distribution `name` into the site directory `root`: its `modules` (relative
    path -> source) and a `<name>-<version>.dist-info` with METADATA and entry_points.txt,
    so `importlib.metadata` discovers it exactly as it would a wheel's."""
    for relpath, source in modules.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    (info / "METADATA").write_text(metadata + "Requires-Dist: core\n")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def platform_plugin(package: str, class_name: str, probe_body: str) -> dict[str, str]:
    """Modules of a platform plugin whose probe runs `probe_body`."""
    return {
        f"{package}/__init__.py": API,
        f"{package}/probe.py": (
            f"from core.platforms import Unavailable\n\ndef probe():\n    {probe_body}\n"
        ),
        f"{package}/platform.py": f"""
            import torch
            from core.platforms import MemoryInfo, Platform

            class {class_name}(Platform):
                name = "{package}"
                device_type = "cpu"
                device_name = "{class_name} device"
                dist_backend = "gloo"
                supported_dtypes = (torch.float32,)
                preferred_attention_backends = ("torch_ref",)

                def memory_info(self):
                    return MemoryInfo(8 << 30, 4 << 30)

                def set_device(self, device):
                    pass
        """,
    }


def available_platform(package: str, class_name: str) -> dict[str, str]:
    return platform_plugin(package, class_name, f'return "{package}.platform.{class_name}"')


WORDS_IO_ENTRY_POINTS = {
    "core.io_processors": {"words": "acme_words_io.processor:WordsIOProcessor"}
}
"""The `words` IO processor of `words_io_processor()`, as a distribution declares it."""

WORDS_IO_PARAMS = "SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)"


def words_io_processor() -> dict[str, str]:
    """Modules of an IO processor plugin: data `{"words": [...]}`, one greedy prompt per word,
    answered `{"answer": [each word's continuation]}`; generation only. Importing its
    processor module appends this process's pid to the file CORE_TEST_IMPORT_LOG names (the
    tests check which processes loaded it)."""
    return {
        "acme_words_io/__init__.py": API,
        "acme_words_io/processor.py": f"""
            import os

            from core.io_processors import IOProcessor
            from core.sampling_params import SamplingParams

            if os.environ.get("CORE_TEST_IMPORT_LOG"):
                with open(os.environ["CORE_TEST_IMPORT_LOG"], "a") as log:
                    log.write(f"{{os.getpid()}}\\n")


            class WordsIOProcessor(IOProcessor[list[str], dict]):
                def __init__(self, config):
                    if config.pooler is not None:
                        raise ValueError("words answers with generated text: use --runner generate")
                    super().__init__(config)

                def parse_request(self, data):
                    words = data.get("words") if isinstance(data, dict) else None
                    if not words or not isinstance(words, list):
                        raise ValueError('data must be {{"words": [one or more words]}}')
                    if not all(isinstance(w, str) and w and w.split() == [w] for w in words):
                        raise ValueError("data.words must be single words")
                    return words

                def validate_or_generate_params(self, params=None):
                    return params or {WORDS_IO_PARAMS}

                def pre_process(self, data, request_id=None):
                    return [{{"prompt": word}} for word in data]

                def post_process(self, outputs, request_id=None):
                    return {{"answer": [output.outputs[0].text for output in outputs]}}

                def output_to_response(self, output):
                    return output
        """,
    }


PICTURE_IO_ENTRY_POINTS = {
    "core.io_processors": {"picture": "acme_picture_io.processor:PictureIOProcessor"}
}
"""The `picture` IO processor of `picture_io_processor()`, as a distribution declares it."""


def picture_io_processor() -> dict[str, str]:
    """Modules of a multimodal IO processor plugin for a LLaVA model: data `{"image": base64
    PNG, "question": text}`, one greedy prompt `<image> question` carrying the decoded image,
    answered `{"answer": the generated text}`."""
    return {
        "acme_picture_io/__init__.py": API,
        "acme_picture_io/processor.py": f"""
            import base64
            import binascii
            import io

            from PIL import Image, UnidentifiedImageError

            from core.io_processors import IOProcessor
            from core.sampling_params import SamplingParams


            class PictureIOProcessor(IOProcessor[tuple, dict]):
                def parse_request(self, data):
                    if not isinstance(data, dict) or set(data) != {{"image", "question"}}:
                        raise ValueError('data must be {{"image": base64 PNG, "question": text}}')
                    try:
                        image = Image.open(io.BytesIO(base64.b64decode(data["image"])))
                        image.load()
                    except (binascii.Error, TypeError, UnidentifiedImageError) as exc:
                        raise ValueError(f"data.image is not a base64 image: {{exc}}") from exc
                    return image.convert("RGB"), str(data["question"])

                def validate_or_generate_params(self, params=None):
                    return params or {WORDS_IO_PARAMS}

                def pre_process(self, data, request_id=None):
                    image, question = data
                    prompt = f"<image> {{question}}"
                    return {{"prompt": prompt, "multi_modal_data": {{"image": image}}}}

                def post_process(self, outputs, request_id=None):
                    return {{"answer": outputs[0].outputs[0].text}}

                def output_to_response(self, output):
                    return output
        """,
    }


BAN_TOKENS_ENTRY_POINTS = {
    "core.logits_processors": {"ban_tokens": "acme_ban_tokens.processor:BanTokensLogitsProcessor"}
}
"""The `ban_tokens` logits processor of `ban_tokens_logits_processor()`."""


def ban_tokens_logits_processor() -> dict[str, str]:
    """Modules of a logits processor plugin: a request whose extra_args (the server's
    vllm_xargs) hold `banned_token_ids` never samples those tokens; other requests are left
    alone."""
    return {
        "acme_ban_tokens/__init__.py": API,
        "acme_ban_tokens/processor.py": """
            from core.sample.logits_processor import LogitsProcessor, update_row_states


            def banned(params):
                ids = (params.extra_args or {}).get("banned_token_ids")
                if ids is None:
                    return None
                if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
                    raise ValueError("banned_token_ids must be a list of token ids")
                return ids


            class BanTokensLogitsProcessor(LogitsProcessor):
                def __init__(self, config, device, is_pin_memory):
                    self.banned = {}

                @classmethod
                def validate_params(cls, params):
                    banned(params)

                def is_argmax_invariant(self):
                    return False

                def update_state(self, batch_update):
                    update_row_states(self.banned, batch_update, banned)

                def apply(self, logits):
                    for row, ids in self.banned.items():
                        logits[row, ids] = float("-inf")
                    return logits
        """,
    }


STAT_RECORDS_ENTRY_POINTS = {
    "core.stat_loggers": {"records": "acme_stat_records.logger:RecordsStatLogger"}
}
"""The `records` stat logger of `records_stat_logger()`."""


def records_stat_logger() -> dict[str, str]:
    """Modules of a stat logger plugin that appends one JSON line per call to the file
    CORE_TEST_STAT_RECORDS names: {"call": "init" | "initialized" | "record" | "log", ...}
    with, for a record, its engine index, the running requests (null without scheduler
    stats) and the step's generated tokens."""
    return {
        "acme_stat_records/__init__.py": API,
        "acme_stat_records/logger.py": """
            import json
            import os

            from core.engine.stat_logger import StatLoggerBase


            def write(**line):
                with open(os.environ["CORE_TEST_STAT_RECORDS"], "a") as out:
                    out.write(json.dumps(line) + "\\n")


            class RecordsStatLogger(StatLoggerBase):
                def __init__(self, config, engine_index=0):
                    self.engine_index = engine_index
                    write(call="init", engine=engine_index)

                def record(self, scheduler_stats, iteration_stats, engine_idx=0):
                    running = None if scheduler_stats is None else scheduler_stats.num_running
                    generated = iteration_stats.num_generation_tokens if iteration_stats else 0
                    write(call="record", engine=engine_idx, running=running, generated=generated)

                def log_engine_initialized(self):
                    write(call="initialized", engine=self.engine_index)

                def log(self):
                    write(call="log", engine=self.engine_index)
        """,
    }
