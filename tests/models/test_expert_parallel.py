"""Expert parallelism over two worker processes (gloo): each rank holds half the experts
whole, and the greedy tokens equal one worker's. With EPLB on and a router that sends
every token to two experts of the same rank, the rearrangement replicates those two onto
the other rank: the measured imbalance falls from 2 to about 1, the tokens stay the same."""

from __future__ import annotations

import pytest
from moe_checkpoints import random_moe, skew_router

from core import LLM, SamplingParams
from core.testing.tiny_checkpoint import VOCAB, write_tiny_checkpoint

pytestmark = pytest.mark.slow  # engines of two worker processes, about 40 s

WORDS = [VOCAB[f"w{i}"] for i in range(45)]
PROMPTS = [[WORDS[(5 * i + 3 * j) % 45] for j in range(4 + 5 * i)] for i in range(4)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def generate(model_dir, **options) -> list[list[int]]:
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64, kv_cache_memory="1MiB",
              max_num_batched_tokens=16, **options)  # fmt: skip
    try:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        if options.get("enable_eplb"):
            imbalance = llm.engine.core.executor.collective_rpc("eplb_imbalance")
            # The metrics' gauge reads the output rank's latest measurement.
            assert llm.engine.core.scheduler.make_stats().expert_imbalance == imbalance[0][1]
            return [o.outputs[0].token_ids for o in outputs], imbalance
        return [o.outputs[0].token_ids for o in outputs]
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "Qwen2MoeForCausalLM"])
def test_two_expert_parallel_ranks_generate_what_one_worker_does(architecture, tmp_path):
    write_tiny_checkpoint(tmp_path, random_moe(architecture))
    one = generate(tmp_path)
    assert generate(tmp_path, tensor_parallel_size=2, enable_expert_parallel=True) == one


def test_eplb_replicates_the_hot_experts_and_keeps_the_tokens(tmp_path):
    model = random_moe("MixtralForCausalLM")
    # Ten slots: rank 0 holds experts 0-4, rank 1 experts 5-7 and replicas of 0 and 1.
    skew_router(model, hot=(2, 3))
    write_tiny_checkpoint(tmp_path, model)
    one = generate(tmp_path)
    eplb = {"window_size": 6, "step_interval": 6, "num_redundant_experts": 2}
    tokens, per_rank = generate(tmp_path, tensor_parallel_size=2, enable_expert_parallel=True,
                                enable_eplb=True, eplb_config=eplb)  # fmt: skip
    assert tokens == one
    assert per_rank[0] == per_rank[1]  # both ranks measured the same traffic
    history, current = per_rank[0]
    assert history and history[0] > 1.9  # every token on rank 0's experts
    assert all(later < 1.1 for later in history[1:]) and current < 1.1
