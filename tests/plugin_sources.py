"""Sources of the throw-away plugin distributions the plugin tests install."""

API = 'CORE_PLUGIN_API = ">=1.0,<2"\n'


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
