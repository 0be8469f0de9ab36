"""Custom logits processors offline: a `core.logits_processors` plugin installed as a
distribution (tests/plugin_sources.py) changes the outputs of the requests that ask for it
(extra_args) and of no other, while the batch adds, finishes and moves requests; classes
named by `logits_processors=` run too; what cannot run is refused by name."""

from __future__ import annotations

import pytest
from plugin_sources import BAN_TOKENS_ENTRY_POINTS, ban_tokens_logits_processor
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.config import ComponentConfig, EngineConfig, PoolerConfig, SpeculativeConfig
from core.engine_args import EngineArgs
from core.plugins.registry import EntryState, PluginRegistry
from core.sample.logit_softcap import SoftcapLogitsProcessor
from core.sample.logits_processor_selector import logits_processor_classes

SOFTCAP = "core.sample.logit_softcap:SoftcapLogitsProcessor"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def ban_plugin(site, fresh_registry) -> None:
    site.add("acme-ban-tokens", BAN_TOKENS_ENTRY_POINTS, ban_tokens_logits_processor())


def greedy(max_tokens: int, **extra_args) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args or None
    )


def token_ids(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_a_plugin_changes_only_the_requests_that_ask_while_the_batch_moves_them(
    model_dir, ban_plugin
):
    llm = LLM(**engine_kwargs(model_dir, max_num_seqs=4))
    prompts = ["w1 w2", "w3", "w4 w5 w6", "w7"]
    alone = [token_ids(llm, [p], [greedy(6)])[0] for p in prompts]
    # The first request finishes after 2 tokens: the last then moves into its row, and its
    # ban must move with it. Each banned request is banned its own greedy tokens.
    params = [greedy(2), greedy(6, banned_token_ids=alone[1]), greedy(6),
              greedy(6, banned_token_ids=alone[3])]  # fmt: skip
    together = token_ids(llm, prompts, params)
    assert together[0] == alone[0][:2]
    assert together[2] == alone[2]
    for out, banned in ((together[1], alone[1]), (together[3], alone[3])):
        assert len(out) == 6 and not set(out) & set(banned)
    with pytest.raises(ValueError, match="extra_args refused by logits processor Ban"):
        llm.generate(prompts[:1], greedy(2, banned_token_ids="w1"), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_classes_given_to_llm_run_by_class_or_by_name(model_dir):
    for given in ([SoftcapLogitsProcessor], [SOFTCAP]):
        llm = LLM(**engine_kwargs(model_dir, logits_processors=given))
        assert llm.engine.processor.logits_processor_classes == [SoftcapLogitsProcessor]
        with pytest.raises(ValueError, match="logit_softcap must be a positive number"):
            llm.generate("w1", SamplingParams(extra_args={"logit_softcap": 0}), use_tqdm=False)
    # Argmax-invariant: a greedy request's tokens are the same with the cap as without.
    capped = token_ids(llm, ["w1 w2"], [greedy(4, logit_softcap=0.01)])
    assert capped == token_ids(llm, ["w1 w2"], [greedy(4)])


def test_a_class_no_name_imports_is_refused():
    class Local(SoftcapLogitsProcessor):
        pass

    with pytest.raises(ValueError, match="logits_processors: .*Local cannot be imported by name"):
        EngineArgs(logits_processors=[Local]).config_sections()


def config(*names: str, **sections) -> EngineConfig:
    return EngineConfig(components=ComponentConfig(logits_processors=list(names)), **sections)


@pytest.mark.parametrize(
    ("engine", "flag"),
    [
        (config("no_such_module:Processor"), "--logits-processors no_such_module:Processor"),
        (config("core.sample.sampler:DefaultSampler"), "not a subclass of LogitsProcessor"),
        (config(SOFTCAP, pooler=PoolerConfig()), "--logits-processors: a pooling model"),
        (
            config(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=2)),
            "--speculative-config: custom logits processors (BanTokensLogitsProcessor)",
        ),
    ],
)
def test_what_cannot_run_is_refused_naming_the_flag(ban_plugin, engine, flag):
    with pytest.raises(ValueError) as exc:
        logits_processor_classes(engine, PluginRegistry.from_environment())
    assert flag in str(exc.value)


def test_an_installed_plugin_does_not_apply_to_a_pooling_model(ban_plugin):
    engine = config(pooler=PoolerConfig())
    assert logits_processor_classes(engine, PluginRegistry.from_environment()) == []


def test_a_plugin_that_is_no_processor_is_skipped_and_shown_failed(site, fresh_registry):
    site.add(
        "acme-wrong",
        {"core.logits_processors": {"wrong": "acme_wrong:NotAProcessor"}},
        {"acme_wrong/__init__.py": "CORE_PLUGIN_API = '>=1.0'\nclass NotAProcessor: pass\n"},
    )
    registry = PluginRegistry.from_environment()
    assert logits_processor_classes(config(), registry) == []
    entry = registry.get("core.logits_processors", "wrong")
    assert entry.state is EntryState.FAILED and "not a subclass of LogitsProcessor" in entry.reason
