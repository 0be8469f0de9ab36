"""Sampling: the Sampler interface, its reference implementation and the batch metadata."""

from core.sample.interface import Sampler, SamplerOutput
from core.sample.logprobs import LogprobsTensors, compute_prompt_logprobs
from core.sample.metadata import SamplingMetadata
from core.sample.sampler import DefaultSampler

__all__ = [
    "DefaultSampler",
    "LogprobsTensors",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "compute_prompt_logprobs",
]
