"""Experts shared by two data-parallel engine cores (`core serve --data-parallel-size 2
--enable-expert-parallel`): the engines step in lock-step waves, an idle one running
placeholder forwards, and the openai client gets one engine's greedy tokens, for a lone
request (one engine idle throughout), for requests at once (both busy), and again after
the engines went idle (a new wave). With EPLB and a router that sends every token to
two experts of the first engine, the measured imbalance is 2 before the first
rearrangement and about 1 after it, the tokens unchanged."""

from __future__ import annotations

import pytest
from moe_checkpoints import random_moe, skew_router
from server_process import ServerProcess, completions_at_once, engine_series, free_port_pair

from core import LLM, SamplingParams
from core.testing.tiny_checkpoint import VOCAB, write_tiny_checkpoint

pytestmark = pytest.mark.slow  # two servers of two engine cores, about 60 s

WORDS = [VOCAB[f"w{i}"] for i in range(45)]
PROMPTS = [[WORDS[(5 * i + 3 * j) % 45] for j in range(4 + 5 * i)] for i in range(4)]
SAME = ["--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "1MiB"]


def reference(model_dir, prompts, max_tokens: int) -> list[str]:
    """One engine's greedy completions, without expert parallelism."""
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64, kv_cache_memory="1MiB")
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    try:
        return [o.outputs[0].text for o in llm.generate(prompts, greedy, use_tqdm=False)]
    finally:
        llm.engine.shutdown()


def serve(model_dir, *flags: str) -> ServerProcess:
    return ServerProcess(
        str(model_dir), *SAME, "--data-parallel-size", "2", "--enable-expert-parallel",
        "--data-parallel-rpc-port", str(free_port_pair()), *flags,
    ).wait_ready()  # fmt: skip


def test_engines_sharing_experts_serve_one_engines_tokens_alone_together_and_again(tmp_path):
    write_tiny_checkpoint(tmp_path, random_moe("MixtralForCausalLM"))
    want = reference(tmp_path, PROMPTS, 12)
    server = serve(tmp_path)
    try:
        assert completions_at_once(server.url, PROMPTS[:1], 12) == want[:1]  # the other engine idle
        assert completions_at_once(server.url, PROMPTS, 12) == want
        assert completions_at_once(server.url, PROMPTS[3:], 12) == want[3:]  # a wave after idling
        generated = engine_series(server.url, "vllm:generation_tokens_total")
        assert sorted(generated) == ["0", "1"] and min(generated.values()) > 0  # both served
    finally:
        server.stop()


def test_eplb_across_engines_balances_the_hot_experts_and_keeps_the_tokens(tmp_path):
    model = random_moe("MixtralForCausalLM")
    # Ten slots, five per engine's rank: experts 0-4 on the first, 5-7 and two replicas
    # on the second; every token goes to experts 2 and 3, both on the first.
    skew_router(model, hot=(2, 3))
    write_tiny_checkpoint(tmp_path, model)
    want = reference(tmp_path, PROMPTS[:2], 16)
    eplb = '{"window_size": 6, "step_interval": 6, "num_redundant_experts": 2}'
    server = serve(tmp_path, "--enable-eplb", "--eplb-config", eplb)
    try:
        # Three steps (a prefill, two decodes): before the first rearrangement.
        completions_at_once(server.url, PROMPTS[:1], 3)
        assert max(engine_series(server.url, "vllm:expert_load_imbalance").values()) > 1.9
        assert completions_at_once(server.url, PROMPTS[:2], 16) == want
        assert max(engine_series(server.url, "vllm:expert_load_imbalance").values()) < 1.1
    finally:
        server.stop()
