"""ArchConfig reads config.json dicts as transformers writes them (versions 4 and 5)."""

from __future__ import annotations

import pytest
import transformers

from core.models import ArchConfig

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 128,
}


def test_defaults_follow_transformers():
    config = ArchConfig.from_hf(BASE)
    assert (config.num_key_value_heads, config.head_dim, config.rope_theta) == (4, 16, 10000.0)
    assert config.rope_scaling is None and config.sliding_window is None
    assert config.layer_types == ("full_attention",) * 3
    assert not config.tie_word_embeddings


@pytest.mark.parametrize("key", sorted(BASE))
def test_missing_required_key_is_named(key):
    incomplete = {k: v for k, v in BASE.items() if k != key}
    with pytest.raises(ValueError, match=f"missing '{key}'"):
        ArchConfig.from_hf(incomplete)


def test_transformers5_rope_parameters():
    hf = transformers.LlamaConfig(
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    )  # fmt: skip
    config = ArchConfig.from_hf({**hf.to_dict(), "architectures": ["LlamaForCausalLM"]})
    assert config.rope_theta == 5e5
    assert config.rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def test_transformers4_rope_theta_and_legacy_scaling_type_key():
    legacy = {**BASE, "rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}
    config = ArchConfig.from_hf(legacy)
    assert config.rope_theta == 1e6
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_default_rope_type_means_no_scaling():
    config = ArchConfig.from_hf({**BASE, "rope_parameters": {"rope_type": "default"}})
    assert config.rope_scaling is None


def test_qwen_window_is_off_unless_use_sliding_window():
    qwen = {**BASE, "sliding_window": 4096, "max_window_layers": 1}
    assert ArchConfig.from_hf({**qwen, "use_sliding_window": False}).sliding_window is None
    config = ArchConfig.from_hf({**qwen, "use_sliding_window": True})
    assert config.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    assert [config.layer_sliding_window(i) for i in range(3)] == [None, 4096, 4096]


def test_mistral_window_applies_to_every_layer():
    config = ArchConfig.from_hf({**BASE, "sliding_window": 8})
    assert [config.layer_sliding_window(i) for i in range(3)] == [8, 8, 8]


def test_eos_token_id_list_and_int():
    listed = ArchConfig.from_hf({**BASE, "eos_token_id": [2, 7]})
    assert (listed.eos_token_ids, listed.eos_token_id) == ((2, 7), 2)
    assert ArchConfig.from_hf({**BASE, "eos_token_id": 2}).eos_token_ids == (2,)
    assert ArchConfig.from_hf(BASE).eos_token_id is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "'num_attention_heads' \\(4\\) is not a multiple"),
        ({"hidden_act": "quick_gelu"}, "'hidden_act' 'quick_gelu' is not supported"),
        ({"architectures": []}, "'architectures' should be a non-empty list"),
        ({"layer_types": ["full_attention"]}, "'layer_types' should list 3"),
    ],
)
def test_invalid_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        ArchConfig.from_hf({**BASE, **change})


def test_a_bert_config_reads_its_layer_norm_eps_activation_and_token_types():
    bert = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, layer_norm_eps=1e-7, hidden_act="gelu",
    ).to_dict()  # fmt: skip
    config = ArchConfig.from_hf({**bert, "architectures": ["BertModel"]})
    assert (config.rms_norm_eps, config.hidden_act, config.type_vocab_size) == (1e-7, "gelu", 2)
    assert (config.head_dim, config.max_position_embeddings) == (8, 512)


def test_a_llama_with_another_activation_is_refused():
    from core.models.llama import LlamaForCausalLM

    config = ArchConfig.from_hf({**BASE, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="'hidden_act' 'gelu' is not supported by Llama"):
        LlamaForCausalLM(config)


MOE = {**BASE, "num_local_experts": 8, "num_experts_per_tok": 2}


def test_moe_keys_are_read_in_each_architectures_spelling():
    mixtral = ArchConfig.from_hf(MOE).moe
    assert (mixtral.num_experts, mixtral.top_k, mixtral.intermediate_size) == (
        8, 2, BASE["intermediate_size"],
    )  # fmt: skip
    qwen = ArchConfig.from_hf({**BASE, "num_experts": 4, "num_experts_per_tok": 1,
                               "moe_intermediate_size": 16, "norm_topk_prob": True,
                               "shared_expert_intermediate_size": 24, "mlp_only_layers": [0],
                               "decoder_sparse_step": 2}).moe  # fmt: skip
    assert (qwen.num_experts, qwen.intermediate_size, qwen.shared_expert_intermediate_size) == (
        4, 16, 24,
    )  # fmt: skip
    assert qwen.norm_topk_prob and [qwen.is_sparse(i) for i in range(4)] == [
        False, True, False, True,
    ]  # fmt: skip
    assert ArchConfig.from_hf(BASE).moe is None


def test_a_top_k_beyond_the_experts_is_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ArchConfig.from_hf({**MOE, "num_experts_per_tok": 9})


@pytest.mark.parametrize(
    ("tp", "spare", "config", "message"),
    [
        (2, 0, BASE, "has no experts"),
        (3, 0, MOE, "8 experts and 0 redundant slots"),
        (2, 1, MOE, "8 experts and 1 redundant slots"),
        (2, 10, MOE, "num_redundant_experts 10: at most 8 fit"),
    ],
)
def test_experts_that_cannot_be_shared_are_refused_naming_the_flags(tp, spare, config, message):
    with pytest.raises(ValueError, match=message):
        ArchConfig.from_hf(config).check_expert_parallel(tp, TP_FLAG, True, spare)


TP_FLAG = "--tensor-parallel-size N"


def test_the_refusal_names_the_flags_that_make_the_ranks():
    flags = "--tensor-parallel-size 1 x --data-parallel-size 3"
    with pytest.raises(ValueError, match=f"with {flags}: the 8 experts"):
        ArchConfig.from_hf(MOE).check_expert_parallel(3, flags, True, 0)


def test_experts_that_divide_evenly_are_accepted():
    ArchConfig.from_hf(MOE).check_expert_parallel(2, TP_FLAG, True, 2)
    ArchConfig.from_hf(MOE).check_expert_parallel(4, TP_FLAG, True, 0)
    ArchConfig.from_hf(BASE).check_expert_parallel(2, TP_FLAG, False, 0)  # off
