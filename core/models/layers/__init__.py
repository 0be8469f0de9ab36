"""The building blocks of the Llama-family decoders."""

from core.models.layers.activation import GeluTanhAndMul, SiluAndMul
from core.models.layers.layernorm import GemmaRMSNorm, RMSNorm
from core.models.layers.linear import (
    LinearBase,
    MergedLinear,
    QKVLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from core.models.layers.rotary_embedding import RotaryEmbedding
from core.models.layers.vocab_embedding import (
    LMHead,
    ScaledVocabEmbedding,
    TiedLMHead,
    VocabEmbedding,
    VocabMatrix,
)

__all__ = [
    "GeluTanhAndMul",
    "GemmaRMSNorm",
    "LMHead",
    "LinearBase",
    "MergedLinear",
    "QKVLinear",
    "RMSNorm",
    "ReplicatedLinear",
    "RowParallelLinear",
    "RotaryEmbedding",
    "ScaledVocabEmbedding",
    "SiluAndMul",
    "TiedLMHead",
    "VocabEmbedding",
    "VocabMatrix",
]
